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

**Decoders** (the causal branch of :mod:`papa_lib.core.override`; Gemma 3, Llama, GPT-2), :func:`fast_causal_attention`:

* the replaced heads' matrices are cut to the causal band (key j <= query i, and i - j < the window on local layers)
  and row-normalised once per layer and length (a row with no mass becomes uniform over its band, as in the reference
  path), and shared by the whole batch: ``[H, L, L]`` times V, no per-example ``[B, H, L, L]`` tensor. This is exact
  for an unpadded or right-padded batch: a real query i only sees keys j <= i, which are all real, so no row needs a
  per-example renormalisation; padded query rows are set to 0 (the reference path's value). Other key masks (left
  padding) take the encoders' way, ``C (m_k ⊙ V) / (C m_k)``, with the causal uniform fallback for empty rows.
* grouped-query attention: the replaced query heads that share a key/value head are stacked into one ``[g·L, L]``
  matrix, so the values are multiplied once per key/value head and never repeated (when every key/value head serves
  as many of them, as when every head is replaced; otherwise each head takes its own key/value head's values).
* ``constant``, ``toeplitz``, ``previous`` and ``uniform`` heads take the shared product; ``identity`` and ``zeros``
  heads are as for encoders; ``original`` heads of a partially replaced layer get the model's softmax (soft-cap,
  float32 softmax) for those heads only.
* the query and key projections (``q_proj``, ``k_proj``; :func:`skip_causal_projections`) are skipped in a layer
  where no head reads the input attention (no ``original`` or ``mix`` head; Gemma's ``q_norm``/``k_norm``, which
  map 0 to 0, are skipped with them; rotary embeddings run on the zeros, which costs O(n·d)); in a partially
  replaced layer only the query rows of the heads that read the input are computed, and the key rows of the
  key/value heads that serve one. GPT-2's fused ``c_attn`` projection is never skipped.
* the fast path steps aside (the reference path runs) in the same cases as for encoders (``mix``/``trainable``
  heads, dropout, ``output_attentions=True``), with packed position ids, and when transformers' 4D mask forbids
  anything beyond the causal band and the padded keys (a document mask).

``AttentionOverride(..., fast=False)`` (or ``override(..., fast=False)``) switches the fast path off, so the
reference path stays testable; :mod:`tests.test_fastpath` and :mod:`tests.test_fastpath_decoders` check that both
agree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from .masks import allowed_pairs_from_additive_mask, real_tokens_from_additive_mask

#: Modes the fast path can compute for a layer (a layer with any other mode uses the reference path).
FAST_MODES = frozenset({"original", "constant", "identity", "zeros", "toeplitz"})
#: Modes whose weights are a (masked, row-normalised) fixed matrix.
MATRIX_MODES = frozenset({"constant", "toeplitz"})
#: On a decoder, the data-free alternatives ``previous`` and ``uniform`` are fixed matrices too.
CAUSAL_MATRIX_MODES = MATRIX_MODES | {"previous", "uniform"}
#: The query and key projections, and the norms applied to their outputs (Gemma 3), of the decoders' attention modules.
CAUSAL_PROJECTIONS = ("q_proj", "k_proj")
CAUSAL_PROJECTION_NORMS = ("q_norm", "k_norm")


@dataclass(frozen=True)
class LayerPlan:
    """Which heads of one layer take which shortcut (head indices, in order)."""

    original: tuple[int, ...]
    matrix: tuple[int, ...]
    identity: tuple[int, ...]
    zeros: tuple[int, ...]


def layer_plan(modes: list[str], causal: bool = False) -> LayerPlan | None:
    """Group a layer's head modes for the fast path, or ``None`` when the layer must use the reference path.

    ``None`` for a layer whose heads are all ``original`` (nothing to save) or that has a ``mix``/``trainable`` head
    (on an encoder also a ``previous``/``uniform`` one; on a decoder, ``causal=True``, those are matrix heads).
    """
    matrix_modes = CAUSAL_MATRIX_MODES if causal else MATRIX_MODES
    if all(m == "original" for m in modes) or any(m not in FAST_MODES | matrix_modes for m in modes):
        return None
    groups = {"original": [], "matrix": [], "identity": [], "zeros": []}
    for head, mode in enumerate(modes):
        groups["matrix" if mode in matrix_modes else mode].append(head)
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


def _partial_projection(linear: nn.Linear, runs: list[tuple[int, int]]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A forward of ``linear`` that computes only the output features in ``runs`` (``[start, stop)`` ranges; the
    weight rows are sliced, not copied) and leaves the others 0."""

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        output = hidden_states.new_zeros(*hidden_states.shape[:-1], linear.out_features)
        for start, stop in runs:
            bias = None if linear.bias is None else linear.bias[start:stop]
            output[..., start:stop] = nn.functional.linear(hidden_states, linear.weight[start:stop], bias)
        return output

    forward.papa_partial_projection = tuple(runs)
    return forward


def _passed_through(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _replace_forward(module: nn.Module, forward: Callable) -> Callable[[], None]:
    """Set ``module``'s instance ``forward`` (parameters, buffers, hooks and the module tree are left alone); return
    the function that restores whatever instance attribute was there before."""
    missing = object()
    previous = module.__dict__.get("forward", missing)
    module.__dict__["forward"] = forward

    def restore():
        if previous is missing:
            module.__dict__.pop("forward", None)
        else:
            module.__dict__["forward"] = previous

    return restore


def _undo_all(restores: list[Callable[[], None]]) -> Callable[[], None]:
    def undo():
        for restore in reversed(restores):
            restore()

    return undo


def skip_query_key_projections(
    self_attention: nn.Module, names: tuple[str, str] = ("query", "key")
) -> Callable[[], None]:
    """Stop ``self_attention.query`` and ``.key`` (or the two ``names``; ``TypeError`` unless ``nn.Linear``) from
    computing anything, by replacing their instance ``forward`` (:func:`_replace_forward`); return the undo function."""
    restores = []
    for name in names:
        linear = getattr(self_attention, name, None)
        if not isinstance(linear, nn.Linear):
            raise TypeError(
                f"{type(self_attention).__name__}.{name} is {type(linear).__name__}, not nn.Linear; "
                "the fast path cannot skip this projection"
            )
        restores.append(_replace_forward(linear, _skipped_projection(linear.out_features)))
    return _undo_all(restores)


def _row_runs(heads: list[int], width: int) -> list[tuple[int, int]]:
    """The output features of ``heads`` (each ``width`` wide, ascending) as merged ``[start, stop)`` ranges."""
    runs: list[tuple[int, int]] = []
    for head in heads:
        start, stop = head * width, (head + 1) * width
        if runs and runs[-1][1] == start:
            runs[-1] = (runs[-1][0], stop)
        else:
            runs.append((start, stop))
    return runs


def _maps_zero_to_zero(norm: nn.Module, width: int) -> bool:
    """Whether a (row-wise) norm gives 0 for a 0 input, so that skipping it on skipped projections is exact."""
    parameter = next(norm.parameters(), None)
    zeros = torch.zeros(1, width, device=None if parameter is None else parameter.device,
                        dtype=torch.float32 if parameter is None else parameter.dtype)
    with torch.no_grad():
        return bool((norm(zeros) == 0).all())


def skip_causal_projections(self_attention: nn.Module, num_heads: int, reading: set[int]) -> Callable[[], None]:
    """Skip what a decoder attention module computes for heads that do not read the input attention; return the
    function that undoes it.

    ``reading`` are the query heads whose mode needs the model's own attention (``original``, ``mix``). When it is
    empty, ``q_proj`` and ``k_proj`` return a zero-stride view of one zero (as :func:`skip_query_key_projections`)
    and the ``q_norm``/``k_norm`` applied to their outputs (Gemma 3) pass it through when they map 0 to 0 (RMSNorm).
    Otherwise only the query rows of the reading heads are computed, and the key rows of the key/value heads that
    serve one of them (grouped-query attention: query head h reads key/value head h // (num_heads / kv heads)); the
    other rows are 0. A module without two ``nn.Linear`` ``q_proj``/``k_proj`` (GPT-2's fused ``c_attn``) is left
    alone. Only instance ``forward`` attributes are replaced.
    """
    query, key = (getattr(self_attention, name, None) for name in CAUSAL_PROJECTIONS)
    if not (isinstance(query, nn.Linear) and isinstance(key, nn.Linear)) or query.out_features % num_heads:
        return _undo_all([])
    head_dim = query.out_features // num_heads
    if key.out_features % head_dim or num_heads % (key.out_features // head_dim):
        return _undo_all([])
    groups = num_heads // (key.out_features // head_dim)
    restores = []
    if not reading:
        for linear in (query, key):
            restores.append(_replace_forward(linear, _skipped_projection(linear.out_features)))
        for name in CAUSAL_PROJECTION_NORMS:
            norm = getattr(self_attention, name, None)
            if isinstance(norm, nn.Module) and _maps_zero_to_zero(norm, head_dim):
                restores.append(_replace_forward(norm, _passed_through))
        return _undo_all(restores)
    kv_reading = sorted({head // groups for head in reading})
    for linear, heads, total in ((query, sorted(reading), num_heads), (key, kv_reading, num_heads // groups)):
        if len(heads) < total:
            restores.append(_replace_forward(linear, _partial_projection(linear, _row_runs(heads, head_dim))))
    return _undo_all(restores)


def projection_is_skipped(linear: nn.Module) -> bool:
    """Whether ``linear`` currently runs the skipped (no-compute) forward of :func:`skip_query_key_projections`."""
    return getattr(linear.__dict__.get("forward"), "papa_skipped_projection", False)


def projection_rows(linear: nn.Module) -> tuple[tuple[int, int], ...] | None:
    """The ``[start, stop)`` output ranges ``linear`` computes under :func:`skip_causal_projections` in a partially
    replaced layer, or ``None`` when it runs its own forward (or is skipped entirely)."""
    return getattr(linear.__dict__.get("forward"), "papa_partial_projection", None)


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


def eager_weights(query: torch.Tensor, key: torch.Tensor, scaling: float | None,
                  attention_mask: torch.Tensor | None) -> torch.Tensor:
    """An encoder's own attention weights A^h (transformers' eager attention): ``softmax(Q K^T * scaling + mask)``
    over the keys; ``scaling`` None: ``1 / sqrt(head width)``; ``attention_mask`` additive, or None."""
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    return nn.functional.softmax(scores, dim=-1)


def causal_eager_weights(query: torch.Tensor, key: torch.Tensor, scaling: float | None, allowed: torch.Tensor,
                         softcap: float | None = None) -> torch.Tensor:
    """A decoder's own attention weights A^h: ``Q K^T * scaling`` (``softcap``: Gemma's ``tanh(s / c) * c``), the
    pairs not ``allowed`` (bool, broadcast to the scores) at the dtype's minimum, softmax in float32, back to the
    query's dtype."""
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    return nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)


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
        attention = eager_weights(query[:, idx], key[:, idx], scaling, attention_mask)
        output[:, :, idx] = torch.matmul(attention.to(value.dtype), value[:, idx]).transpose(1, 2)

    return output, None


# ---------------------------------------------------------------------------------------------- decoders
def causal_band(length: int, window: int | None, device) -> torch.Tensor:
    """``[L, L]`` bool: the (query i, key j) pairs a decoder layer may use: j <= i, and i - j < ``window`` on a local
    (sliding-window) layer."""
    index = torch.arange(length, device=device)
    band = index[None, :] <= index[:, None]
    if window is not None:
        band = band & (index[:, None] - index[None, :] < int(window))
    return band


def _causal_matrix_heads(override, layer: int, plan: LayerPlan, length: int, window, device, dtype,
                         normalised: bool) -> torch.Tensor:
    """The matrices ``[m, L, L]`` of the layer's matrix heads cut to the causal band, row-normalised (a row with no
    mass: uniform over its band) or not; built in float32 like the reference path's replacement and cached while the
    override is applied."""
    key = ("causal-fast", normalised, layer, length, window, str(device), dtype)
    cache = override._dynamic_cache
    if key not in cache:
        source = override._replacement_source(layer, length, device, torch.float32)  # [H, L, L]; checks L
        if len(plan.matrix) != source.shape[0]:
            source = source[list(plan.matrix)]
        band = causal_band(length, window, device).to(torch.float32)
        matrices = source * band
        if normalised:
            row_sums = matrices.sum(-1, keepdim=True)
            uniform = band / band.sum(-1, keepdim=True)
            normalised_rows = matrices / row_sums.clamp_min(torch.finfo(torch.float32).tiny)
            matrices = torch.where(row_sums <= 0, uniform, normalised_rows)
        cache[key] = matrices.to(dtype).contiguous()
    return cache[key]


def _key_value_groups(heads: tuple[int, ...], groups: int) -> tuple[list[int], int]:
    """``(key/value heads, query heads per key/value head)`` that let the query ``heads`` (ascending) be stacked per
    key/value head: the distinct key/value heads when each serves the same number of ``heads``, else one entry per
    head (a head's own key/value head)."""
    kv_of = [head // groups for head in heads]
    distinct = sorted(set(kv_of))
    counts = {kv_of.count(kv) for kv in distinct}
    if len(counts) == 1:
        return distinct, counts.pop()
    return kv_of, 1


def fast_causal_attention(
    override,
    layer: int,
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
    dropout: float,
    window: int | None = None,
    softcap: float | None = None,
) -> tuple[torch.Tensor, None] | None:
    """Attention output ``[B, L, H, d′]`` of one decoder layer without the work replaced heads do not need.

    ``key`` and ``value`` are the model's (grouped-query: ``[B, H_kv, L, d′]``, not repeated). Returns ``None`` when
    the fast path does not apply (see the module docstring); the caller then runs the reference path. The second
    element of the returned pair (the attention weights) is always ``None``.
    """
    if (module.training and dropout > 0) or override.positions is not None:
        return None
    plan = layer_plan(override.layer_modes(layer), causal=True)
    if plan is None or attentions_requested():
        return None
    batch, heads, length, _ = query.shape
    kv_heads, head_size = value.shape[1], value.shape[-1]
    if heads % kv_heads:
        return None
    groups = heads // kv_heads
    dtype, device = value.dtype, value.device
    real = real_tokens_from_additive_mask(attention_mask, batch, length, device)  # [B, L] bool
    band = causal_band(length, window, device)
    if attention_mask is not None and attention_mask.dim() == 4 and attention_mask.shape[-1] == length:
        # The shared matrices assume the mask forbids the band's complement and padded keys, and nothing else.
        allowed = allowed_pairs_from_additive_mask(attention_mask, length)[:, 0]
        if not torch.equal(allowed, band[None] & real[:, None, :]):
            return None
    unpadded = bool(real.all())
    counts = real.sum(-1, keepdim=True)
    right_padded = unpadded or torch.equal(real, torch.arange(length, device=device)[None] < counts)
    real_f = real.to(dtype)
    fused = not (torch.is_grad_enabled() and value.requires_grad)
    all_matrix = len(plan.matrix) == heads
    output = None if all_matrix else value.new_zeros(batch, length, heads, head_size)

    if plan.matrix:
        m = len(plan.matrix)
        kv_list, per_kv = _key_value_groups(plan.matrix, groups)
        values = value if kv_list == list(range(kv_heads)) else value[:, kv_list]
        values = values.permute(1, 2, 0, 3)  # [k, L, B, d′]: one [c·L, L] x [L, B·d′] product per key/value head
        k = len(kv_list)
        matrices = _causal_matrix_heads(override, layer, plan, length, window, device, dtype, right_padded)
        stacked = matrices.view(k, per_kv * length, length)  # the query heads of one key/value head, stacked
        if right_padded:
            # A real query i sees keys j <= i, all real: the shared normalised rows are exact; padded rows are 0.
            summed = torch.matmul(stacked, values.reshape(k, length, batch * head_size))
            result = summed.view(m, length, batch, head_size).permute(2, 1, 0, 3)  # [B, L, m, d′]
            if not unpadded and all_matrix and fused:  # zero the padded rows and lay out in one pass
                output = torch.empty((batch, length, heads, head_size), dtype=dtype, device=device)
                torch.mul(result, real_f[:, :, None, None], out=output)
                result = None
            elif not unpadded:
                result = result * real_f[:, :, None, None]
        else:
            # Any other key mask: (C ⊙ m_k) V = C (m_k ⊙ V), divided by the per-example row sums C m_k.
            masked = values * real_f.t()[None, :, :, None]  # [k, L, B, d′]
            flat = masked.reshape(k, length, batch * head_size)
            summed = torch.matmul(stacked, flat).view(m, length, batch, head_size)
            row_sums = torch.matmul(matrices, real_f.t())  # [m, L(q), B]
            scale = (real_f.t()[None] / row_sums.clamp_min(torch.finfo(dtype).tiny))[..., None]
            result = summed * scale
            empty = (row_sums <= 0) & real.t()[None]
            if bool(empty.any()):
                # A real query with no mass on its real keys: uniform over the real keys of its band.
                band_f = band.to(dtype)
                visible = torch.matmul(band_f, real_f.t()).clamp_min(1.0)  # [L, B]
                uniform = (torch.matmul(band_f, flat).view(k, length, batch, head_size) / visible[None, :, :, None])
                uniform = uniform.repeat_interleave(per_kv, dim=0)  # [m, L, B, d′]
                result = torch.where(empty[..., None], uniform, result)
            result = result.permute(2, 1, 0, 3)  # [B, L, m, d′]
        if result is not None:
            if all_matrix:
                output = result.contiguous()
            else:
                output[:, :, list(plan.matrix)] = result

    if plan.identity:
        idx = list(plan.identity)
        kv_idx = [head // groups for head in idx]
        output[:, :, idx] = value[:, kv_idx].transpose(1, 2) * real_f[:, :, None, None]

    if plan.original:
        idx = list(plan.original)
        kv_idx = [head // groups for head in idx]
        allowed = band[None, None] & real[:, None, None, :]
        attention = causal_eager_weights(query[:, idx], key[:, kv_idx], scaling, allowed, softcap)
        output[:, :, idx] = torch.matmul(attention.to(dtype), value[:, kv_idx]).transpose(1, 2)

    return output, None
