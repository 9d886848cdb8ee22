"""Norm-based analysis of attention (Kobayashi et al., 2020, "Attention is Not Only a Weight"): the decomposition.

For head ``h`` of a multi-head self-attention layer, the sublayer output for query ``i`` is

    y_i = sum_h sum_j alpha^h_ij f^h(x_j) + b_O,      f^h(x) = (x W_V^h + b_V^h) W_O^h     (Kobayashi Sec. 2, Eq. 5-7)

where ``x_j`` is the layer input, ``W_V^h``/``b_V^h`` the value projection of head ``h`` and ``W_O^h`` the rows of
the output projection that read head ``h``'s slice of the concatenated context.  Kobayashi et al. argue that the
weight ``alpha_ij`` alone does not tell how much token ``j`` contributes to ``y_i``; the norm
``||alpha_ij f^h(x_j)||`` does (Sec. 3).  This module computes, per layer,

* ``alpha``            [B, H, L, L]  the attention weights the layer actually used (as returned by the model with
                                      ``output_attentions=True``; under a PAPA override these are the constant or mixed
                                      weights, PAPA Sec. 3.1-3.2, so they are never recomputed here),
* ``fx_norm``          [B, H, L]     ``||f^h(x_j)||``,
* ``afx_norm``         [B, H, L, L]  ``||alpha^h_ij f^h(x_j)|| = |alpha^h_ij| * ||f^h(x_j)||``,
* ``summed_afx_norm``  [B, L, L]     ``||sum_h alpha^h_ij f^h(x_j)||`` (the heads-combined contribution, Kobayashi Sec.
5),

and checks that the decomposition is exact (:func:`decomposition_check`, Eq. 5-7 against the model's own output).
Streaming these quantities over a corpus (Kobayashi Sec. 4) is :mod:`papa_lib.analysis.norm_statistics`; norm-weighted
constant matrices and label-free head rankings (beyond both papers) are :mod:`papa_lib.analysis.norm_rankings`.

Memory (per layer, batch ``B``, heads ``H``, length ``L``, hidden size ``D``): the transformed vectors ``f^h(x_j)``
take ``B*H*L*D`` values of the model dtype; ``afx_norm`` and ``alpha`` take ``B*H*L*L`` each.  A ``[B, H, L, L, D]``
tensor is never built: ``afx_norm`` uses the identity above and ``summed_afx_norm`` uses the per-token Gram matrix
``G[b, j, h, k] = <f^h(x_j), f^k(x_j)>`` (``B*L*H*H`` float64 values), so that
``||sum_h a_h f^h||^2 = sum_{h,k} a_h a_k G_hk``; this is evaluated in float64 in chunks of query rows holding at
most ``_SUMMED_NORM_CHUNK_ELEMENTS`` float64 values (128 MiB) at a time.  ``attention_norms`` returns all layers at
once (``2*B*H*L*L + B*H*L + B*L*L`` values per layer); the corpus statistics keep only one layer's norms alive at a
time (:func:`iter_layer_norms`).

Architectures are described by one small function each in ``_PROJECTION_GETTERS`` (keyed by ``config.model_type``),
returning the value and output projections of one encoder layer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pandas as pd
import torch

__all__ = [
    "AttentionProjections",
    "LayerNorms",
    "supported_model_types",
    "attention_projections",
    "encoder_layers",
    "transformed_vectors",
    "attention_norms",
    "iter_layer_norms",
    "iter_alpha_and_fx_norms",
    "prepare_batch",
    "decomposition_check",
]

#: Upper bound on float64 elements held at once while computing ``summed_afx_norm`` (128 MiB).
_SUMMED_NORM_CHUNK_ELEMENTS = 1 << 24


# ----------------------------------------------------------------------------------------------------------------------
# Architecture specifics
# ----------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionProjections:
    """Value and output projections of one self-attention layer, in ``nn.Linear`` layout.

    ``value_weight`` [H*d', D] and ``value_bias`` [H*d'] map the layer input to the concatenated per-head values
    (head ``h`` owns rows ``h*d':(h+1)*d'``); ``output_weight`` [D, H*d'] and ``output_bias`` [D] are the attention
    output projection (head ``h`` owns columns ``h*d':(h+1)*d'``).
    """

    value_weight: torch.Tensor
    value_bias: torch.Tensor
    output_weight: torch.Tensor
    output_bias: torch.Tensor
    num_heads: int
    head_size: int


def _with_output_projection(layer: torch.nn.Module, value_weight, value_bias) -> AttentionProjections:
    """Pair a layer's value projection with its attention output projection (``attention.output.dense``)."""
    self_attention = layer.attention.self
    dense = layer.attention.output.dense
    return AttentionProjections(
        value_weight=value_weight,
        value_bias=value_bias,
        output_weight=dense.weight,
        output_bias=dense.bias,
        num_heads=self_attention.num_attention_heads,
        head_size=self_attention.attention_head_size,
    )


def _bert_like_projections(layer: torch.nn.Module) -> AttentionProjections:
    """BERT, RoBERTa, ELECTRA (and MiniLM, a BERT): ``attention.self.value`` and ``attention.output.dense``."""
    value = layer.attention.self.value
    return _with_output_projection(layer, value.weight, value.bias)


def _deberta_projections(layer: torch.nn.Module) -> AttentionProjections:
    """DeBERTa (v1) ``DisentangledSelfAttention``.

    ``in_proj`` (no bias) produces ``[..., 3*H*d']`` which the model views as ``[..., H, 3*d']`` and chunks into q, k, v
    along the last axis, so head ``h``'s value rows are ``h*3d' + 2d' : h*3d' + 3d'``.  The value bias is ``v_bias``
    (laid out head-major like ``[H, d']``).
    """
    self_attention = layer.attention.self
    num_heads = self_attention.num_attention_heads
    head_size = self_attention.attention_head_size
    in_weight = self_attention.in_proj.weight  # [3*H*d', D]
    hidden = in_weight.shape[1]
    value_weight = in_weight.view(num_heads, 3, head_size, hidden)[:, 2].reshape(num_heads * head_size, hidden)
    value_bias = self_attention.v_bias
    if self_attention.in_proj.bias is not None:  # not in the reference implementation, kept exact if ever present
        value_bias = value_bias + self_attention.in_proj.bias.view(num_heads, 3, head_size)[:, 2].reshape(-1)
    return _with_output_projection(layer, value_weight, value_bias)


def _deberta_v2_projections(layer: torch.nn.Module) -> AttentionProjections:
    """DeBERTa-v2/v3: ``attention.self.value_proj`` and ``attention.output.dense``."""
    value = layer.attention.self.value_proj
    return _with_output_projection(layer, value.weight, value.bias)


_PROJECTION_GETTERS: dict[str, Callable[[torch.nn.Module], AttentionProjections]] = {
    "bert": _bert_like_projections,
    "roberta": _bert_like_projections,
    "electra": _bert_like_projections,
    "deberta": _deberta_projections,
    "deberta-v2": _deberta_v2_projections,
}


def supported_model_types() -> tuple[str, ...]:
    """The ``config.model_type`` values this module knows how to decompose."""
    return tuple(sorted(_PROJECTION_GETTERS))


def _projection_getter(model: torch.nn.Module) -> Callable[[torch.nn.Module], AttentionProjections]:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in _PROJECTION_GETTERS:
        raise ValueError(
            f"attention norms are not implemented for model_type={model_type!r}; "
            f"supported model types: {', '.join(supported_model_types())}"
        )
    return _PROJECTION_GETTERS[model_type]


def encoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The encoder's layer list (``model.base_model.encoder.layer``) of a supported Hugging Face encoder.

    Works for bare models (``BertModel``) and task models (``BertForSequenceClassification``) alike.
    """
    _projection_getter(model)
    base = getattr(model, "base_model", model)
    layers = getattr(getattr(base, "encoder", None), "layer", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no encoder.layer list; expected a Hugging Face encoder model")
    return layers


def attention_projections(model: torch.nn.Module, layer_index: int) -> AttentionProjections:
    """Value/output projections of encoder layer ``layer_index`` (see ``AttentionProjections``)."""
    layers = encoder_layers(model)
    if not -len(layers) <= layer_index < len(layers):
        raise ValueError(f"layer_index {layer_index} out of range for a model with {len(layers)} layers")
    return _projection_getter(model)(layers[layer_index])


def transformed_vectors(model: torch.nn.Module, layer_index: int, hidden_states: torch.Tensor) -> torch.Tensor:
    """``f^h(x_j) = (x_j W_V^h + b_V^h) W_O^h`` for every head and token of one layer (Kobayashi Eq. 7).

    Args:
        model: a supported encoder.
        layer_index: which encoder layer.
        hidden_states: ``[B, L, D]`` input of that layer (``hidden_states[layer_index]`` of the model output).

    Returns:
        ``[B, H, L, D]`` tensor; ``sum_h sum_j alpha^h_ij f^h(x_j) + b_O`` is the attention output projection's
        output (before dropout, residual and LayerNorm).  The output bias ``b_O`` is not included.
    """
    if hidden_states.dim() != 3:
        raise ValueError(f"hidden_states must be [batch, length, hidden], got shape {tuple(hidden_states.shape)}")
    proj = attention_projections(model, layer_index)
    if hidden_states.shape[-1] != proj.value_weight.shape[1]:
        raise ValueError(
            f"hidden_states has size {hidden_states.shape[-1]} but layer {layer_index} "
            f"expects {proj.value_weight.shape[1]}"
        )
    return _transformed_vectors(proj, hidden_states)


def _transformed_vectors(proj: AttentionProjections, hidden_states: torch.Tensor) -> torch.Tensor:
    values = torch.nn.functional.linear(hidden_states, proj.value_weight, proj.value_bias)  # [B, L, H*d']
    values = values.view(*hidden_states.shape[:2], proj.num_heads, proj.head_size)
    output_weight = proj.output_weight.view(proj.output_weight.shape[0], proj.num_heads, proj.head_size)  # [D, H, d']
    return torch.einsum("blhp,dhp->bhld", values, output_weight)


# ----------------------------------------------------------------------------------------------------------------------
# Per-batch norms
# ----------------------------------------------------------------------------------------------------------------------


@dataclass
class LayerNorms:
    """Attention weights and vector norms of one layer for one batch (shapes use B batch, H heads, L length).

    Attributes:
        layer: 0-based encoder layer index.
        alpha: [B, H, L, L] attention weights used by the layer (query i, key j).
        fx_norm: [B, H, L] ``||f^h(x_j)||``.
        afx_norm: [B, H, L, L] ``||alpha^h_ij f^h(x_j)||``.
        summed_afx_norm: [B, L, L] ``||sum_h alpha^h_ij f^h(x_j)||``.
    """

    layer: int
    alpha: torch.Tensor
    fx_norm: torch.Tensor
    afx_norm: torch.Tensor
    summed_afx_norm: torch.Tensor


_MODEL_INPUT_KEYS = ("input_ids", "attention_mask", "token_type_ids")


def prepare_batch(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if not isinstance(batch, Mapping) or "input_ids" not in batch:
        raise ValueError("batch must be a mapping with at least 'input_ids' (and usually 'attention_mask')")
    device = next(model.parameters()).device
    inputs = {}
    for key in _MODEL_INPUT_KEYS:
        if key in batch and batch[key] is not None:
            inputs[key] = torch.as_tensor(batch[key]).to(device)
    if int(getattr(model.config, "type_vocab_size", 2) or 0) <= 1:
        inputs.pop("token_type_ids", None)  # single-segment models (RoBERTa, DeBERTa): the default ids are all zero
    if inputs["input_ids"].dim() != 2:
        raise ValueError(f"input_ids must be [batch, length], got shape {tuple(inputs['input_ids'].shape)}")
    if "attention_mask" not in inputs:
        inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    if inputs["attention_mask"].shape != inputs["input_ids"].shape:
        raise ValueError(
            f"attention_mask shape {tuple(inputs['attention_mask'].shape)} differs from input_ids shape "
            f"{tuple(inputs['input_ids'].shape)}"
        )
    return inputs


def _summed_norm(alpha: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
    """``||sum_h alpha[b,h,i,j] vectors[b,h,j]||`` via the per-token Gram matrix in float64 (see module docstring)."""
    batch, heads, length, _ = alpha.shape
    gram = torch.empty(batch, length, heads, heads, dtype=torch.float64, device=alpha.device)
    sequences = max(1, _SUMMED_NORM_CHUNK_ELEMENTS // max(1, vectors[0].numel()))
    for start in range(0, batch, sequences):  # a few sequences in float64 at a time
        chunk = vectors[start : start + sequences].transpose(1, 2).to(torch.float64)  # [b, L, H, D]
        gram[start : start + sequences] = torch.matmul(chunk, chunk.transpose(-1, -2))
    out = torch.empty(batch, length, length, dtype=torch.float64, device=alpha.device)
    rows = max(1, _SUMMED_NORM_CHUNK_ELEMENTS // max(1, 3 * batch * heads * length))
    for start in range(0, length, rows):
        a = alpha[:, :, start : start + rows].to(torch.float64)  # [B, H, c, L]
        mixed = torch.einsum("bhij,bjhk->bkij", a, gram)  # [B, H, c, L]
        out[:, start : start + rows] = (mixed * a).sum(dim=1)
    return out.clamp_min_(0.0).sqrt_().to(alpha.dtype)


def _attentions_and_hidden_states(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor]):
    """Run the model once (no grad) on prepared inputs; return ``(getter, layers, attentions, hidden_states)``.

    Raises if the model is training (dropout would perturb alpha) or does not return one attention tensor per layer
    and ``num_layers + 1`` hidden states.
    """
    getter = _projection_getter(model)
    if model.training:
        raise ValueError("model is in training mode (dropout would perturb alpha); call model.eval() first")
    base = getattr(model, "base_model", model)
    layers = encoder_layers(model)
    with torch.no_grad():
        outputs = base(**inputs, output_attentions=True, output_hidden_states=True, return_dict=True)
    attentions, hidden_states = outputs.attentions, outputs.hidden_states
    if attentions is None or len(attentions) != len(layers) or any(a is None for a in attentions):
        raise ValueError(
            "the model did not return one attention tensor per layer; load it with "
            "attn_implementation='eager' so that output_attentions=True works"
        )
    if hidden_states is None or len(hidden_states) != len(layers) + 1:
        raise ValueError("the model did not return num_layers + 1 hidden states with output_hidden_states=True")
    return getter, layers, attentions, hidden_states


def iter_layer_norms(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]):
    """Run the model once and yield ``LayerNorms`` layer by layer (shared by the public functions)."""
    getter, layers, attentions, hidden_states = _attentions_and_hidden_states(model, prepare_batch(model, batch))
    with torch.no_grad():
        for index, layer in enumerate(layers):
            alpha = attentions[index]
            proj = getter(layer)
            if alpha.shape[1] != proj.num_heads:
                raise ValueError(
                    f"layer {index}: attentions have {alpha.shape[1]} heads, the layer has {proj.num_heads}"
                )
            vectors = _transformed_vectors(proj, hidden_states[index])
            fx_norm = torch.linalg.vector_norm(vectors, dim=-1)  # [B, H, L]
            alpha_for_norm = alpha.to(fx_norm.dtype)
            afx_norm = alpha_for_norm.abs() * fx_norm[:, :, None, :]
            summed = _summed_norm(alpha_for_norm, vectors)
            del vectors
            yield LayerNorms(layer=index, alpha=alpha, fx_norm=fx_norm, afx_norm=afx_norm, summed_afx_norm=summed)


def attention_norms(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> list[LayerNorms]:
    """Attention weights and Kobayashi norms of every layer for one batch.

    Args:
        model: a Hugging Face encoder of a supported ``model_type`` (``supported_model_types()``), in eval mode and
            loaded with ``attn_implementation="eager"``; may be wrapped in a PAPA override, whose returned (constant
            or mixed) weights are then used as ``alpha``.
        batch: mapping with ``input_ids`` [B, L], usually ``attention_mask`` [B, L] and optionally
            ``token_type_ids`` (dropped for models with a single token type); other keys (e.g. ``labels``) are
            ignored.  Tensors are moved to the model's device.

    Returns:
        One ``LayerNorms`` per encoder layer, in layer order.  Padded positions are kept (mask them with the
        batch's ``attention_mask``).  Memory: ``2*B*H*L*L + B*H*L + B*L*L`` values per layer in the result, plus the
        transient ``B*H*L*D`` transformed vectors of one layer.
    """
    return list(iter_layer_norms(model, batch))


def _fx_norms(proj: AttentionProjections,
              hidden_states: torch.Tensor) -> torch.Tensor:
    """``||f^h(x_j)||`` [B, H, L] without building the [B, H, L, D] vectors.

    With ``v = x W_V^h + b_V^h`` (size d') and ``W_O^h`` the [D, d'] columns
    of the output projection, ``||v W_O^h||^2 = v^T (W_O^h^T W_O^h) v``: a
    d' x d' Gram matrix per head, evaluated in float64.
    """
    values = torch.nn.functional.linear(hidden_states, proj.value_weight,
                                        proj.value_bias)
    values = values.view(*hidden_states.shape[:2], proj.num_heads,
                         proj.head_size).to(torch.float64)  # [B, L, H, d']
    output_weight = proj.output_weight.view(
        proj.output_weight.shape[0], proj.num_heads, proj.head_size)
    output_weight = output_weight.to(torch.float64)
    gram = torch.einsum("dhp,dhq->hpq", output_weight,
                        output_weight)  # [H, d', d']
    squared = torch.einsum("blhp,hpq,blhq->bhl", values, gram, values)
    return squared.clamp_min_(0.0).sqrt_().to(hidden_states.dtype)


def iter_alpha_and_fx_norms(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor]):
    """Run the model once; yield ``(layer, alpha [B, H, L, L], fx_norm [B, H, L])`` layer by layer (inputs prepared)."""
    getter, layers, attentions, hidden_states = _attentions_and_hidden_states(model, inputs)
    for index, layer in enumerate(layers):
        with torch.no_grad():
            yield index, attentions[index], _fx_norms(getter(layer), hidden_states[index])


# ----------------------------------------------------------------------------------------------------------------------
# The exactness check (Kobayashi Eq. 5-7)
# ----------------------------------------------------------------------------------------------------------------------


def decomposition_check(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> pd.DataFrame:
    """Check Kobayashi's Eq. 5-7 on one batch: ``sum_h sum_j alpha_ij f^h(x_j) + b_O`` against the model's own output.

    The attention output projection of every layer is hooked while the model runs; its output (before dropout,
    residual and LayerNorm) is compared with the rebuilt sum over the real query positions.
    Columns: layer, n_positions, max_abs_error, max_abs_output, relative_error (= max_abs_error / max_abs_output).
    """
    layers = encoder_layers(model)
    inputs = prepare_batch(model, batch)
    captured: dict[int, torch.Tensor] = {}
    handles = [
        layer.attention.output.dense.register_forward_hook(lambda m, i, o, k=k: captured.__setitem__(k, o.detach()))
        for k, layer in enumerate(layers)
    ]
    try:
        results = attention_norms(model, inputs)
        with torch.no_grad():
            hidden = getattr(model, "base_model", model)(**inputs, output_hidden_states=True).hidden_states
    finally:
        for handle in handles:
            handle.remove()
    real = inputs["attention_mask"].bool()
    rows = []
    for layer_norms in results:
        index = layer_norms.layer
        with torch.no_grad():
            vectors = transformed_vectors(model, index, hidden[index])  # [B, H, L, D]
            rebuilt = torch.einsum("bhij,bhjd->bid", layer_norms.alpha.to(vectors.dtype), vectors)
            rebuilt = rebuilt + attention_projections(model, index).output_bias
        error = (rebuilt - captured[index])[real].abs().max().item()
        scale = captured[index][real].abs().max().item()
        rows.append({"layer": index, "n_positions": int(real.sum()), "max_abs_error": error, "max_abs_output": scale,
                     "relative_error": error / scale if scale else math.nan})
    return pd.DataFrame(rows)
