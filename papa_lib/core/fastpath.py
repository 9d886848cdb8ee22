"""The fast path: replaced heads that do not look at the input skip the work they no longer need (paper Sec. 3.4).

Sec. 3.4 of the paper notes that a head with a constant matrix C^h needs neither queries nor keys nor a softmax: its
output is C^h V^h, which cuts a head's cost from 2n²d′ + 3nd′² (the Q, K, V projections plus QKᵀ and AV) to
n²d′ + nd′² (the V projection plus CV). The reference path of :mod:`papa_lib.core.override` computes exactly the same
numbers but pays the full price: it still projects queries and keys, still builds every head's ``[B, L, L]``
weight matrix for every example, and multiplies the values with it. This module is the cheap way to the same result.

What it does, for BERT, RoBERTa, XLM-R, ELECTRA, DistilBERT and ALBERT (the ``AttentionInterface`` route of
:mod:`papa_lib.core.models`; ModernBERT's global layers too, without the Q/K skip since its Q, K and V come from one
fused projection):

* ``constant`` and ``toeplitz`` heads: the weights of the reference path are C masked to the real keys and
  row-normalised, ``W = (C ⊙ m_k) / ((C ⊙ m_k) 1)``. Since ``(C ⊙ m_k) V = C (m_k ⊙ V)``, the output is
  ``C (m_k ⊙ V)`` divided by the row sums ``C m_k`` — one ``[L, L] × [L, B·d′]`` product per head, shared by the
  whole batch, and no per-example ``[B, H, L, L]`` tensor at all. Padded query rows are 0, and a real query row that
  has no mass on any real key falls back to the mean of the real values, exactly as in the reference path.
* ``identity`` heads: the output is V at real query rows (0 at padded ones); nothing is multiplied.
* ``zeros`` heads: the output is 0; nothing is computed.
* ``original`` heads of a partially replaced layer: the softmax attention is computed for those heads only.
* Layers in which no head needs the input attention (every head ``constant``, ``identity``, ``zeros``,
  ``toeplitz`` or ``trainable``): the query and key projections are not run at all. While the override is active
  the ``forward`` of those layers' ``query`` and ``key`` linear modules is replaced (on the instance, so parameters,
  ``state_dict`` and module tree stay untouched) by one that returns a zero-stride view of a single zero of the right
  shape; leaving the override deletes the replacement and the modules are exactly as before.

When the fast path steps aside (the reference path of :mod:`papa_lib.core.override` runs instead):

* the layer has a ``mix`` or ``trainable`` head (their weights depend on trainable parameters; ``trainable`` layers
  still skip the Q/K projections, since they never read them);
* attention dropout is active (``module.training`` with a dropout probability > 0);
* the caller asked for the attention weights (``output_attentions=True``), which the fast path never builds;
* ModernBERT's local (sliding-window) layers, whose replacements are cut to the window;
* ALBERT's Q/K projections are skipped only when no layer position that shares them needs the input attention;
* DeBERTa / DeBERTa-v2 and MPNet: their attention is computed inside the model's own module and the override
  reaches it only after the softmax (the ``probs_hook`` route), so there is nothing to skip there; the reference path
  is used.

``AttentionOverride(..., fast=False)`` (or ``override(..., fast=False)``) switches the fast path off, so the
reference path stays testable; :mod:`tests.test_fastpath` checks that both agree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from .masks import real_tokens_from_additive_mask

#: Modes the fast path can compute for a layer (a layer with any other mode uses the reference path).
FAST_MODES = frozenset({"original", "constant", "identity", "zeros", "toeplitz"})
#: Modes whose weights are a (masked, row-normalised) fixed matrix.
MATRIX_MODES = frozenset({"constant", "toeplitz"})


@dataclass(frozen=True)
class LayerPlan:
    """Which heads of one layer take which shortcut (head indices, in order)."""

    original: tuple[int, ...]
    matrix: tuple[int, ...]
    identity: tuple[int, ...]
    zeros: tuple[int, ...]

    @property
    def num_heads(self) -> int:
        return len(self.original) + len(self.matrix) + len(self.identity) + len(self.zeros)


def layer_plan(modes: list[str]) -> LayerPlan | None:
    """Group a layer's head modes for the fast path, or ``None`` when the layer must use the reference path.

    ``None`` for a layer whose heads are all ``original`` (nothing to save) or that has a ``mix``/``trainable`` head.
    """
    if all(m == "original" for m in modes) or any(m not in FAST_MODES for m in modes):
        return None
    groups = {"original": [], "matrix": [], "identity": [], "zeros": []}
    for head, mode in enumerate(modes):
        groups["matrix" if mode in MATRIX_MODES else mode].append(head)
    return LayerPlan(**{k: tuple(v) for k, v in groups.items()})


def attentions_requested() -> bool:
    """Whether the running forward pass records attention weights (``output_attentions=True``).

    transformers >= 5 records attentions with forward hooks that read a context variable set by the model's
    ``forward``; if that mechanism cannot be found we answer ``True`` so that the weights are always built.
    """
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # pragma: no cover - other transformers versions
        return True
    collected = _active_collector.get()
    return collected is not None and "attentions" in collected


# ---------------------------------------------------------------------------------------------- Q/K projections
def _skipped_projection(out_features: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        # A zero-stride view of one zero: the right shape for the caller's .view(...).transpose(...), no compute.
        return hidden_states.new_zeros(()).expand(*hidden_states.shape[:-1], out_features)

    forward.papa_skipped_projection = True
    return forward


def skip_query_key_projections(
    self_attention: nn.Module, names: tuple[str, str] = ("query", "key")
) -> Callable[[], None]:
    """Stop ``self_attention.query`` and ``.key`` (or the two ``names``) from computing anything; return the function
    that undoes it.

    Only the ``forward`` attribute of the two ``nn.Linear`` instances is replaced (parameters, buffers, hooks and
    the module tree are left alone); undoing restores whatever instance attribute was there before.
    """
    restores = []
    for name in names:
        linear = getattr(self_attention, name, None)
        if not isinstance(linear, nn.Linear):
            raise TypeError(
                f"{type(self_attention).__name__}.{name} is {type(linear).__name__}, not nn.Linear; "
                "the fast path cannot skip this projection"
            )
        missing = object()
        previous = linear.__dict__.get("forward", missing)
        linear.__dict__["forward"] = _skipped_projection(linear.out_features)

        def restore(linear=linear, previous=previous, missing=missing):
            if previous is missing:
                linear.__dict__.pop("forward", None)
            else:
                linear.__dict__["forward"] = previous

        restores.append(restore)

    def undo():
        for restore in reversed(restores):
            restore()

    return undo


def projection_is_skipped(linear: nn.Module) -> bool:
    """Whether ``linear`` currently runs the skipped (no-compute) forward of :func:`skip_query_key_projections`."""
    return getattr(linear.__dict__.get("forward"), "papa_skipped_projection", False)


# ---------------------------------------------------------------------------------------------- the attention
def _matrix_heads(override, layer: int, plan: LayerPlan, length: int, device, dtype) -> tuple[torch.Tensor, bool]:
    """The unnormalised matrices ``[m, L, L]`` of the layer's constant/Toeplitz heads (cached while applied), and
    whether any entry is <= 0 (only then can a real query row end up with no mass on the real keys)."""
    key = ("fast", layer, length, str(device), dtype)
    cache = override._dynamic_cache
    if key not in cache:
        source = override._replacement_source(layer, length, device, dtype)  # [H, L, L]; checks L
        if len(plan.matrix) != source.shape[0]:
            source = source[list(plan.matrix)]
        source = source.contiguous()
        cache[key] = (source, bool((~(source > 0)).any()))
    return cache[key]


def fast_attention(
    override,
    layer: int,
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
    dropout: float,
) -> tuple[torch.Tensor, None] | None:
    """Attention output ``[B, L, H, d′]`` of one layer without the work replaced heads do not need.

    Returns ``None`` when the fast path does not apply (see the module docstring); the caller then runs the reference
    path. The second element of the returned pair (the attention weights) is always ``None``.
    """
    if module.training and dropout > 0:
        return None
    plan = layer_plan(override.layer_modes(layer))
    if plan is None or attentions_requested():
        return None
    batch, heads, length, head_size = value.shape
    dtype, device = value.dtype, value.device
    real = real_tokens_from_additive_mask(attention_mask, batch, length, device)  # [B, L] bool
    real_f = real.to(dtype)
    # out= writes save a pass over the data but autograd does not support them.
    fused = not (torch.is_grad_enabled() and value.requires_grad)
    all_matrix = len(plan.matrix) == heads
    output = None if all_matrix else value.new_zeros(batch, length, heads, head_size)

    if plan.matrix and override.positions is not None:
        # Packed input: every example reads its own entries C[pos_q, pos_k] (no batch-shared product).
        idx = list(plan.matrix)
        weights = override.replacement_weights(layer, real, dtype)[:, idx]  # [B, m, W, W]
        result = torch.matmul(weights, value[:, idx]).transpose(1, 2)  # [B, W, m, d′]
        if all_matrix:
            output = result.contiguous()
        else:
            output[:, :, idx] = result
    elif plan.matrix:
        m = len(plan.matrix)
        matrices, may_be_empty = _matrix_heads(override, layer, plan, length, device, dtype)  # [m, L, L]
        values = (value if all_matrix else value[:, list(plan.matrix)]).permute(1, 2, 0, 3)  # [m, L, B, d′]
        key_mask = real_f.t()[None, :, :, None]  # [1, L, B, 1]
        # Keys on the rows, batch and head dims side by side: one [L, L] x [L, B·d′] product per head serves the
        # whole batch, and (C ⊙ m_k) V = C (m_k ⊙ V) needs no per-example matrix. Padded keys are zeroed here.
        if fused:
            masked = torch.empty((m, length, batch, head_size), dtype=dtype, device=device)
            torch.mul(values, key_mask, out=masked)
        else:
            masked = (values * key_mask).contiguous()
        summed = torch.bmm(matrices, masked.view(m, length, batch * head_size)).view(m, length, batch, head_size)
        row_sums = torch.matmul(matrices, real_f.t())  # [m, L(q), B] = (C ⊙ m_k) 1
        # 1 / row sum at real queries, 0 at padded ones (the reference path's padded rows are all zero).
        scale = (real_f.t()[None] / row_sums.clamp_min(torch.finfo(dtype).tiny))[..., None]  # [m, L, B, 1]
        if may_be_empty:
            # A real query with no mass on any real key: uniform over the real keys (as in the reference path).
            counts = real_f.sum(-1).clamp_min(1.0)[None, None, :, None]  # [1, 1, B, 1]
            uniform = masked.sum(1, keepdim=True) / counts  # [m, 1, B, d′]
            empty = ((row_sums <= 0) & real.t()[None])[..., None]
            result = torch.where(empty, uniform, summed * scale)
        elif all_matrix and fused:
            output = torch.empty((batch, length, heads, head_size), dtype=dtype, device=device)
            torch.mul(summed, scale, out=output.permute(2, 1, 0, 3))  # normalise and lay out in one pass
            result = None
        else:
            result = summed * scale
        if result is not None:
            if all_matrix:
                output = result.permute(2, 1, 0, 3).contiguous()  # [B, L, H, d′]
            else:
                output[:, :, list(plan.matrix)] = result.permute(2, 1, 0, 3)

    if plan.identity:
        idx = list(plan.identity)
        output[:, :, idx] = value[:, idx].transpose(1, 2) * real_f[:, :, None, None]

    if plan.original:
        idx = list(plan.original)
        if scaling is None:
            scaling = query.size(-1) ** -0.5
        scores = torch.matmul(query[:, idx], key[:, idx].transpose(2, 3)) * scaling
        if attention_mask is not None:
            scores = scores + attention_mask
        attention = nn.functional.softmax(scores, dim=-1)
        output[:, :, idx] = torch.matmul(attention.to(value.dtype), value[:, idx]).transpose(1, 2)

    return output, None
