"""Pad-free ("packed") execution under the App. A layout.

Under App. A every real token has a fixed position and padding never influences a real position (it is masked as a
key, and its own rows are never read). So a batch can run on its real tokens only: gather them to the left, keep each
token's App. A position as its position id, and give the override the same positions so that a constant matrix is
read at ``C^h[pos_q, pos_k]`` and renormalised over the real keys — exactly what masking plus row normalisation does
on the padded batch (paper Sec. 3.1, fn. 8). Only the width changes: the longest real row of the batch instead of L
(SST-2 sentences at L = 64 hold about 13 real tokens), which is what makes feature extraction several times faster.

    batch = papa_lib.encode(tokenizer, texts, max_length=64, model=model)  # carries App. A position_ids
    packed = pack(batch)                         # real tokens only, the batch's position ids (or pack(b, model=))
    hidden = model(**packed).last_hidden_state  # [B, W, d]
    full = unpack(hidden, packed)                # [B, L, d], zeros at padding

Architectures whose positions do not come from position ids alone cannot be packed: DeBERTa computes relative
positions from sequence indices (:attr:`~papa_lib.core.models.ArchitectureAdapter.packable`); the engine runs them
padded and says so once. MPNet's relative position bias and ModernBERT's sliding window would also follow sequence
indices in transformers; their adapters (:func:`~papa_lib.core.models.prepare_model`) read them from the position ids
instead, so both pack exactly. RoBERTa-style models (RoBERTa, XLM-R, MPNet) get position ids from
``pad_token_id + 1``, BERT-like ones from 0: :func:`pack` reads them from the batch (``encode(..., model=model)``) or
from the model it is given, and refuses a batch with neither rather than guess.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import torch

from ..errors import PapaInputError
from .models import adapter_for, check_position_ids, prepare_model

__all__ = ["PackedBatch", "pack", "packing_notice", "supports_packing", "unpack"]

logger = logging.getLogger(__name__)
_MODEL_KEYS = ("input_ids", "attention_mask", "token_type_ids")


class PackedBatch(dict):
    """A batch of real tokens only; its items are the model's keyword inputs (with ``position_ids``).

    Attributes:
        positions: ``[B, W]`` App. A position of each token (-1 in padding slots).
        real: ``[B, W]`` bool, True at real tokens.
        length: L, the width of the App. A layout the batch came from.
        word_index: ``[B, words]`` packed column of each word's first sub-token (-1 kept), or ``None``.
        layout: the layout of the batch it was packed from (``"papa"`` for App. A), or ``None`` when unknown.
    """

    def __init__(self, tensors: dict, *, positions, real, length: int, word_index=None, layout=None):
        super().__init__(tensors)
        self.positions, self.real, self.length, self.word_index = positions, real, int(length), word_index
        self.layout = layout

    @property
    def batch_size(self) -> int:
        return int(self.real.shape[0])


def supports_packing(model) -> bool:
    """Whether ``model``'s positions come from position ids alone (BERT, RoBERTa, ELECTRA; not DeBERTa, not decoder
    LMs, which run right-padded)."""
    return adapter_for(model).packable


_warned: set[str] = set()


def packing_notice(model) -> None:
    """Log once per architecture that it runs padded (its relative positions follow sequence indices); a decoder LM
    runs padded by design (the causal layout is right-padded), without a notice."""
    kind = model.config.model_type
    if kind not in _warned and not adapter_for(model).causal:
        _warned.add(kind)
        logger.warning("%s computes relative positions from sequence indices: running padded (no packing)", kind)


def _carried_offset(position_ids: torch.Tensor, length: int) -> int:
    """The first position id of a padded batch's carried ``position_ids`` (``arange(L) + first`` on every row)."""
    offsets = position_ids - torch.arange(length, device=position_ids.device)
    first = int(offsets.flatten()[0]) if offsets.numel() else 0
    if not bool((offsets == first).all()):
        raise PapaInputError("the batch's position_ids are not App. A positions (arange(L) plus the model's first "
                             "position id on every row): encode it with papa_lib.encode(..., model=model) or pass "
                             "pack(..., model=)")
    return first


def pack(batch, model=None) -> PackedBatch:
    """Keep only the real tokens of an App. A batch (see the module docstring).

    The position ids come from the batch when it carries them (``papa_lib.encode(..., model=model)`` puts the model's
    App. A ``position_ids`` in it) or from ``model``; with both, they must agree. A batch with neither is refused: a
    BERT model numbers positions from 0, a RoBERTa-style one from ``pad_token_id + 1``, and a guess would be silently
    wrong for one of them.

    Args:
        batch: an :class:`~papa_lib.core.layout.EncodedBatch` or a dict with ``input_ids``, ``attention_mask`` and
            optionally ``token_type_ids`` and ``position_ids`` (and ``word_index`` as an attribute for token tasks).
        model: the encoder the batch is for (also drops ``token_type_ids`` for a model without segment embeddings).

    Raises:
        ValueError: for a model that cannot be packed (DeBERTa), a batch whose positions cannot be known (no
            ``model`` and no ``position_ids``) or whose ``position_ids`` are not App. A positions (for ``model``), or
            a row with no real token.
    """
    if isinstance(batch, PackedBatch):
        raise PapaInputError("this batch is packed already: pack the padded batch it came from")
    mask = batch["attention_mask"].bool()
    size, length = mask.shape
    carried = batch.get("position_ids")
    if model is not None:
        adapter = adapter_for(prepare_model(model))
        if not adapter.packable:
            raise PapaInputError(f"{model.config.model_type} computes relative positions from sequence indices and "
                                 "cannot run packed; run the padded batch")
        first = adapter.first_position_id(model.config)
        check_position_ids(batch, model)
    elif carried is not None:
        first = _carried_offset(carried, length)
    else:
        encoded_for = getattr(batch, "model_type", None)
        if encoded_for is not None and not adapter_for(SimpleNamespace(model_type=encoded_for)).packable:
            raise PapaInputError(f"{encoded_for} computes relative positions from sequence indices and cannot run "
                                 "packed; run the padded batch")
        raise PapaInputError("pack cannot know this batch's position ids (BERT numbers them from 0, RoBERTa-style "
                             "models from pad_token_id + 1): pass the model, pack(batch, model=model), or encode the "
                             "batch for it, papa_lib.encode(..., model=model)")
    counts = mask.sum(1)
    if size and int(counts.min()) == 0:
        raise PapaInputError("a row of the batch has no real token: nothing to pack")
    width = max(int(counts.max()) if size else 0, 1)
    # real columns first, in App. A order; padding columns after them
    order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)[:, :width]
    real = torch.arange(width, device=mask.device)[None, :] < counts[:, None]
    positions = torch.where(real, order, torch.full_like(order, -1))
    keys = [k for k in _MODEL_KEYS if k in batch and batch[k] is not None]
    if model is not None and not adapter_for(model).uses_token_type_ids:
        keys = [k for k in keys if k != "token_type_ids"]  # RoBERTa has a single segment embedding
    tensors = {key: torch.gather(batch[key], 1, order.to(batch[key].device)) for key in keys}
    tensors["attention_mask"] = real.to(batch["attention_mask"].dtype)
    pad_position = first - 1 if first > 0 else 0  # RoBERTa's padding_idx; BERT's padding rows are masked anyway
    tensors["position_ids"] = torch.where(real, order + first, torch.full_like(order, pad_position))
    word_index = getattr(batch, "word_index", None)
    if word_index is not None:
        column = torch.full((size, length), -1, dtype=torch.long, device=order.device)
        column.scatter_(1, order, torch.arange(width, device=order.device).expand(size, width).clone())
        word_index = word_index.to(order.device)
        word_index = torch.where(word_index >= 0, torch.gather(column, 1, word_index.clamp_min(0)), word_index)
    return PackedBatch(tensors, positions=positions, real=real, length=length, word_index=word_index,
                       layout=getattr(batch, "layout", None))


def unpack(hidden: torch.Tensor, packed: PackedBatch) -> torch.Tensor:
    """Scatter ``[B, W, ...]`` back to ``[B, L, ...]`` at the App. A positions, zeros at padding."""
    if not isinstance(packed, PackedBatch):
        raise PapaInputError(f"unpack(hidden, packed): packed must be the PackedBatch that pack() gave, got "
                             f"{type(packed).__name__}")
    if tuple(hidden.shape[:2]) != tuple(packed.real.shape):
        raise PapaInputError(f"hidden states of shape {tuple(hidden.shape)} do not fit the packed batch's "
                             f"{tuple(packed.real.shape)} (rows, width): unpack the outputs of that packed batch")
    out = hidden.new_zeros((hidden.shape[0], packed.length, *hidden.shape[2:]))
    real = packed.real.to(hidden.device)
    rows = torch.arange(hidden.shape[0], device=hidden.device)[:, None].expand_as(real)
    out[rows[real], packed.positions.to(hidden.device)[real]] = hidden[real]
    return out
