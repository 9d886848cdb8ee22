"""Which tokens are real, read from the masks transformers hands to attention code (shared by the override and the
fast path)."""

from __future__ import annotations

import torch


def real_tokens_from_additive_mask(
    attention_mask: torch.Tensor | None, batch: int, length: int, device
) -> torch.Tensor:
    """Which positions are real tokens, read from the 4D mask transformers passes to attention functions.

    The mask is ``[B, 1, Lq or 1, Lk]``: 0 (or True) where a key may be attended, a large negative value (or False)
    where it is padding. For bidirectional encoder self-attention a position is a real query exactly when it is a
    real key, so the diagonal of a full mask says which tokens are real (row 0 would not under a sliding window).
    """
    if attention_mask is None:
        return torch.ones(batch, length, dtype=torch.bool, device=device)
    if attention_mask.dim() == 4 and attention_mask.shape[-2] == attention_mask.shape[-1] == length:
        # the diagonal: query i may attend key i exactly when i is real (also under a sliding window, ModernBERT)
        row = attention_mask[:, 0].diagonal(dim1=-2, dim2=-1)
    else:
        row = (
            attention_mask[:, 0, 0, :] if attention_mask.dim() == 4 else attention_mask.reshape(batch, -1)[:, -length:]
        )
    if row.dtype == torch.bool:
        return row
    return row > torch.finfo(row.dtype).min / 2


def real_tokens_from_pair_mask(attention_mask: torch.Tensor | None, batch: int, length: int, device) -> torch.Tensor:
    """Real positions from DeBERTa's pair mask ``m_q * m_k`` (``[B, 1, L, L]``, ``[B, L, L]`` or ``[B, L]``)."""
    if attention_mask is None:
        return torch.ones(batch, length, dtype=torch.bool, device=device)
    mask = attention_mask
    if mask.dim() == 4:
        mask = mask[:, 0]
    if mask.dim() == 3:
        mask = mask.diagonal(dim1=-2, dim2=-1)
    return mask.bool()


def allowed_pairs_from_additive_mask(attention_mask: torch.Tensor, length: int) -> torch.Tensor:
    """``[B, 1, L, L]`` bool: which (query, key) pairs a full 4D mask allows (a sliding window's band, real keys)."""
    mask = attention_mask[:, :1].expand(-1, 1, length, length)
    if mask.dtype == torch.bool:
        return mask
    return mask > torch.finfo(mask.dtype).min / 2
