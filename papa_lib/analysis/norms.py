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
* ``afx_norm``         [B, H, L, L]  ``||alpha^h_ij f^h(x_j)|| = |alpha^h_ij| * ||f^h(x_j)||`` (times ``r_i`` below),
* ``summed_afx_norm``  [B, L, L]     ``||sum_h alpha^h_ij f^h(x_j)||`` (the heads-combined contribution, Kobayashi Sec.
5),

and checks that the decomposition is exact (:func:`decomposition_check`, Eq. 5-7 against the model's own output).
Streaming these quantities over a corpus (Kobayashi Sec. 4) is :mod:`papa_lib.analysis.norm_statistics`; norm-weighted
constant matrices and label-free head rankings (beyond both papers) are :mod:`papa_lib.analysis.norm_rankings`.

**Decoders** (Gemma 3, Llama, GPT-2; :func:`is_causal`) go through the same functions.  Their layers are pre-norm, so
``x_j`` is the hidden state *after* the layer's input norm (``input_layernorm``, GPT-2's ``ln_1``): what actually
enters attention, captured from the attention module's input.  ``alpha`` is per *query* head, causal and cut to the
layer's sliding window (``LayerNorms.allowed``); under grouped-query attention the value head a group shares is
repeated for each of its query heads (``AttentionProjections`` holds the repeated rows, in ``repeat_kv``'s order), while
``W_O^h`` is each query head's own slice of ``o_proj``.  Gemma 3 has no norm on the values (``q_norm`` and ``k_norm``
act on queries and keys only, so they shape ``alpha`` and are not part of ``f``), but it normalises the summed
attention output before the residual: the layer adds ``post_attention_layernorm(o_i) = o_i / rms(o_i) * (1 + w)``
with ``o_i = sum_h sum_j alpha^h_ij f^h(x_j) + b_O``.  Both factors enter here:

* the elementwise ``(1 + w)`` is a fixed linear map, folded into ``f``: ``f'^h(x) = diag(1 + w) W_O^h W_V^h x``
  (and ``b_O' = (1 + w) * b_O``); ``fx_norm`` is ``||f'^h(x_j)||``;
* ``r_i = 1 / rms(o_i) = (mean_d o_id^2 + eps)^(-1/2)`` is one scalar per query position ``i`` that depends on the whole
  summed output (every head, every key).  It scales every term of row ``i`` alike, so it changes no ranking or share of
  keys within a row, but it does change comparisons across rows (and the weight of the first token's contribution
  in rows whose output is small).  ``LayerNorms.row_scale`` holds it; by default ``afx_norm`` and ``summed_afx_norm``
  include it (``||alpha_ij f'(x_j)|| * r_i``, the size of what reaches the residual stream, and
  ``sum_h sum_j alpha_ij f'^h(x_j) r_i + b_O' r_i`` is exactly the norm's output); ``scale_rows=False`` drops it.
  ``fx_norm`` never includes it (it belongs to the query, not to the key ``j``).

Llama's ``post_attention_layernorm`` is, despite its name, the norm before the MLP (it acts on the residual stream, not
on the attention output), so Llama and GPT-2 have ``r_i = 1`` (``row_scale`` is ``None``).

Memory (per layer, batch ``B``, heads ``H``, length ``L``, hidden size ``D``): the transformed vectors ``f^h(x_j)``
take ``B*H*L*D`` values of the model dtype; ``afx_norm`` and ``alpha`` take ``B*H*L*L`` each.  A ``[B, H, L, L, D]``
tensor is never built: ``afx_norm`` uses the identity above and ``summed_afx_norm`` uses the per-token Gram matrix
``G[b, j, h, k] = <f^h(x_j), f^k(x_j)>`` (``B*L*H*H`` float64 values), so that
``||sum_h a_h f^h||^2 = sum_{h,k} a_h a_k G_hk``; this is evaluated in float64 in chunks of query rows holding at
most ``_SUMMED_NORM_CHUNK_ELEMENTS`` float64 values (128 MiB) at a time.  ``attention_norms`` returns all layers at
once (``2*B*H*L*L + B*H*L + B*L*L`` values per layer); the corpus statistics keep only one layer's norms alive at a
time (:func:`iter_layer_norms`).  A decoder's run also keeps every layer's attention input (``B*L*D`` values each).

Architectures are described by one small record each in ``_ARCHITECTURES`` (keyed by ``config.model_type``): where
the layers are, a function returning the value and output projections of one layer, and, for decoders, which modules
give the attention input, the output the decomposition rebuilds and the row scale.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pandas as pd
import torch

from ..core.fastpath import causal_band
from ..core.models import ADAPTERS, GPT2_ADAPTER, ArchitectureAdapter, dotted_attribute, model_device, model_inputs

__all__ = [
    "AttentionProjections",
    "LayerNorms",
    "decomposable_model_types",
    "is_causal",
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
    output projection (head ``h`` owns columns ``h*d':(h+1)*d'``).  ``H`` counts query heads: under grouped-query
    attention the rows of the value head a group shares are repeated for each of its query heads.  For Gemma 3 the
    post-attention norm's ``(1 + w)`` is folded into ``output_weight`` and ``output_bias`` (module docstring).  A
    projection without a bias has a zero bias here.
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


def _zero_bias(linear: torch.nn.Module, size: int, like: torch.Tensor) -> torch.Tensor:
    bias = getattr(linear, "bias", None)
    return bias.detach() if bias is not None else torch.zeros(size, dtype=like.dtype, device=like.device)


def _grouped_query_projections(layer: torch.nn.Module,
                               output_scale: torch.Tensor | None = None) -> AttentionProjections:
    """Llama (and Gemma 3) attention: ``self_attn.v_proj``/``o_proj``, grouped-query heads expanded per query head.

    Key/value head ``g`` serves query heads ``g*G:(g+1)*G`` (``G = H / H_kv``, the order of transformers'
    ``repeat_kv``), so its value rows are repeated ``G`` times.  ``output_scale`` (Gemma's ``1 + w``) multiplies the
    output projection's rows: ``diag(output_scale) W_O``.
    """
    attention = layer.self_attn
    head_size = int(attention.head_dim)
    value, output = attention.v_proj, attention.o_proj
    num_heads, kv_heads = output.in_features // head_size, value.out_features // head_size
    hidden, groups = value.in_features, num_heads // kv_heads
    with torch.no_grad():
        value_weight = value.weight.detach().view(kv_heads, head_size, hidden)
        value_weight = value_weight.repeat_interleave(groups, dim=0).reshape(num_heads * head_size, hidden)
        value_bias = _zero_bias(value, kv_heads * head_size, value_weight).view(kv_heads, head_size)
        value_bias = value_bias.repeat_interleave(groups, dim=0).reshape(-1)
        output_weight = output.weight.detach()
        output_bias = _zero_bias(output, output.out_features, output_weight)
        if output_scale is not None:
            scale = output_scale.detach().to(output_weight.dtype)
            output_weight, output_bias = output_weight * scale[:, None], output_bias * scale
    return AttentionProjections(value_weight=value_weight, value_bias=value_bias, output_weight=output_weight,
                                output_bias=output_bias, num_heads=num_heads, head_size=head_size)


def _gemma3_projections(layer: torch.nn.Module) -> AttentionProjections:
    """Gemma 3: as Llama, with the post-attention RMSNorm's ``(1 + w)`` folded into the output projection."""
    return _grouped_query_projections(layer, 1.0 + layer.post_attention_layernorm.weight.detach().float())


def _gpt2_projections(layer: torch.nn.Module) -> AttentionProjections:
    """GPT-2: ``attn.c_attn`` and ``attn.c_proj`` are ``Conv1D`` (``y = x W + b``, ``W`` [in, out]); the value is the
    last third of ``c_attn``'s outputs."""
    attention = layer.attn
    hidden = attention.embed_dim
    with torch.no_grad():
        value_weight = attention.c_attn.weight.detach()[:, 2 * hidden:].t()
        value_bias = attention.c_attn.bias.detach()[2 * hidden:]
        output_weight = attention.c_proj.weight.detach().t()
        output_bias = attention.c_proj.bias.detach()
    return AttentionProjections(value_weight=value_weight, value_bias=value_bias, output_weight=output_weight,
                                output_bias=output_bias, num_heads=int(attention.num_heads),
                                head_size=int(attention.head_dim))


@dataclass(frozen=True)
class _Architecture:
    """What the decomposition needs of one architecture beyond the core's adapter (dotted paths from a layer).

    Where the layers are, whether the model is causal and, for a decoder, the module whose input is the hidden state
    that enters attention (after the layer's input norm) come from the core's adapter of ``model_type``
    (:func:`papa_lib.core.models.adapter_for`); an encoder's attention input is the layer input
    (``hidden_states[layer]``).  ``output``: the module whose output :func:`decomposition_check` rebuilds.
    ``row_norm``: the RMSNorm on the summed attention output whose ``1 / rms_i`` is the row scale (Gemma 3's
    ``post_attention_layernorm``).  ``unfolded``: the projections without that norm's weight folded in (Kobayashi's
    own f(x)); ``None``: the same as ``projections``.
    """

    model_type: str
    projections: Callable[[torch.nn.Module], AttentionProjections]
    output: str = "attention.output.dense"
    row_norm: str | None = None
    unfolded: Callable[[torch.nn.Module], AttentionProjections] | None = None

    @property
    def adapter(self) -> ArchitectureAdapter:
        """The core's adapter of this type (GPT-2's also when it is not registered)."""
        return ADAPTERS[self.model_type] if self.model_type in ADAPTERS else GPT2_ADAPTER

    @property
    def layers(self) -> str:
        return self.adapter.layers

    @property
    def causal(self) -> bool:
        return self.adapter.causal

    @property
    def attention(self) -> str | None:
        return self.adapter.attention if self.causal else None


_ARCHITECTURES: dict[str, _Architecture] = {arch.model_type: arch for arch in (
    _Architecture("bert", _bert_like_projections),
    _Architecture("roberta", _bert_like_projections),
    _Architecture("electra", _bert_like_projections),
    _Architecture("deberta", _deberta_projections),
    _Architecture("deberta-v2", _deberta_v2_projections),
    _Architecture("gemma3_text", _gemma3_projections, output="post_attention_layernorm",
                  row_norm="post_attention_layernorm", unfolded=_grouped_query_projections),
    _Architecture("llama", _grouped_query_projections, output="self_attn.o_proj"),
    _Architecture("gpt2", _gpt2_projections, output="attn.c_proj"),
)}


def decomposable_model_types(causal: bool | None = False) -> tuple[str, ...]:
    """The ``config.model_type`` values this module knows how to decompose into α and f(x): the encoders (default),
    the decoder LMs (``causal=True``) or both (``causal=None``). A subset of the types PAPA itself runs
    (:func:`papa_lib.core.models.supported_model_types`), plus GPT-2."""
    return tuple(sorted(name for name, arch in _ARCHITECTURES.items() if causal is None or arch.causal == causal))


def _architecture(model: torch.nn.Module) -> _Architecture:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in _ARCHITECTURES:
        raise ValueError(
            f"attention norms are not implemented for model_type={model_type!r}; "
            f"supported model types: {', '.join(decomposable_model_types())} "
            f"(decoders: {', '.join(decomposable_model_types(causal=True))})"
        )
    return _ARCHITECTURES[model_type]


def is_causal(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a decoder LM of a supported type (causal attention, pre-norm layers)."""
    return _architecture(model).causal


def encoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The layer list of a supported model: an encoder's ``model.base_model.encoder.layer``, a decoder's decoder
    layers (``model.base_model.layers``; GPT-2's ``h``).

    Works for bare models (``BertModel``, ``Gemma3TextModel``) and task or LM models (``BertForSequenceClassification``,
    ``Gemma3ForCausalLM``) alike.
    """
    arch = _architecture(model)
    base = getattr(model, "base_model", model)
    try:
        return dotted_attribute(base, arch.layers, model)
    except ValueError:
        kind = "decoder" if arch.causal else "encoder"
        raise ValueError(
            f"{type(model).__name__} has no {arch.layers} list; expected a Hugging Face {kind} model"
        ) from None


def attention_projections(model: torch.nn.Module, layer_index: int, *, fold_norm: bool = True
                          ) -> AttentionProjections:
    """Value/output projections of layer ``layer_index`` (see ``AttentionProjections``); ``fold_norm=False`` leaves
    out Gemma 3's post-attention norm weight (Kobayashi's own f(x)); other architectures have none to fold."""
    layers = encoder_layers(model)
    if not -len(layers) <= layer_index < len(layers):
        raise ValueError(f"layer_index {layer_index} out of range for a model with {len(layers)} layers")
    arch = _architecture(model)
    projections = arch.projections if fold_norm or arch.unfolded is None else arch.unfolded
    return projections(layers[layer_index])


def transformed_vectors(model: torch.nn.Module, layer_index: int, hidden_states: torch.Tensor, *,
                        fold_norm: bool = True) -> torch.Tensor:
    """``f^h(x_j) = (x_j W_V^h + b_V^h) W_O^h`` for every head and token of one layer (Kobayashi Eq. 7).

    Args:
        model: a supported encoder or decoder.
        layer_index: which layer.
        hidden_states: ``[B, L, D]`` input of that layer's attention: for an encoder the layer input
            (``hidden_states[layer_index]`` of the model output); for a decoder the hidden state after the layer's
            input norm.

    Returns:
        ``[B, H, L, D]`` tensor; ``sum_h sum_j alpha^h_ij f^h(x_j) + b_O`` is the attention output projection's
        output (before dropout, residual and LayerNorm); for Gemma 3, ``f`` includes the post-attention norm's
        ``(1 + w)`` (unless ``fold_norm=False``) and the sum times ``r_i`` is that norm's output.  The output bias
        ``b_O`` is not included.
    """
    if hidden_states.dim() != 3:
        raise ValueError(f"hidden_states must be [batch, length, hidden], got shape {tuple(hidden_states.shape)}")
    proj = attention_projections(model, layer_index, fold_norm=fold_norm)
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
        layer: 0-based layer index.
        alpha: [B, H, L, L] attention weights used by the layer (query i, key j).
        fx_norm: [B, H, L] ``||f^h(x_j)||`` (Gemma 3: ``||f'^h(x_j)||``, the ``(1 + w)`` folded in; never ``r_i``).
        afx_norm: [B, H, L, L] ``||alpha^h_ij f^h(x_j)||``, times ``row_scale[b, i]`` where the run scaled rows.
        summed_afx_norm: [B, L, L] ``||sum_h alpha^h_ij f^h(x_j)||``, likewise times ``row_scale[b, i]``.
        allowed: decoders only, [B, 1, L, L] bool: the keys each query may see (``j <= i``, within the layer's
            sliding window, real tokens); ``alpha`` of a real query is zero elsewhere (a padded query's row is
            whatever the model computed).  ``None`` for encoders (every real key).
        row_scale: Gemma 3 only, [B, L] ``r_i = 1 / rms(o_i)`` of the post-attention norm (module docstring), reported
            whether or not ``afx_norm`` includes it; ``None`` where the architecture has no such norm.
    """

    layer: int
    alpha: torch.Tensor
    fx_norm: torch.Tensor
    afx_norm: torch.Tensor
    summed_afx_norm: torch.Tensor
    allowed: torch.Tensor | None = None
    row_scale: torch.Tensor | None = None


_MODEL_INPUT_KEYS = ("input_ids", "attention_mask", "token_type_ids", "position_ids")


def prepare_batch(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model inputs of ``batch`` on the model's device; a missing ``attention_mask`` is all ones.

    An encoder's are :func:`papa_lib.core.models.model_inputs`: ``token_type_ids`` only where the model has segments,
    and App. A ``position_ids`` where the batch carries none (a RoBERTa-style model would otherwise number a padded
    PAPA-layout batch by counting its non-pad tokens).  A decoder's are ``input_ids`` and ``attention_mask``: its
    positions are the sequence indices (GPT-2 is supported here without a registered adapter).
    """
    if not isinstance(batch, Mapping) or "input_ids" not in batch:
        raise ValueError("batch must be a mapping with at least 'input_ids' (and usually 'attention_mask')")
    arch = _architecture(model)
    inputs = {key: torch.as_tensor(batch[key]) for key in _MODEL_INPUT_KEYS if batch.get(key) is not None}
    if arch.causal:
        inputs = {key: inputs[key] for key in ("input_ids", "attention_mask") if key in inputs}
    if inputs["input_ids"].dim() != 2:
        raise ValueError(f"input_ids must be [batch, length], got shape {tuple(inputs['input_ids'].shape)}")
    if "attention_mask" not in inputs:
        inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    if inputs["attention_mask"].shape != inputs["input_ids"].shape:
        raise ValueError(
            f"attention_mask shape {tuple(inputs['attention_mask'].shape)} differs from input_ids shape "
            f"{tuple(inputs['input_ids'].shape)}"
        )
    if arch.causal:
        device = model_device(model)
        return {key: value.to(device) for key, value in inputs.items()}
    return model_inputs(model, inputs)


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


@dataclass
class _Run:
    """One forward pass: per layer the weights used, the attention input, and for decoders the allowed keys and the
    row scale; ``outputs`` the output modules' outputs when captured (:func:`decomposition_check`)."""

    arch: _Architecture
    layers: torch.nn.ModuleList
    attentions: tuple
    inputs: list
    allowed: list
    row_scales: list
    outputs: dict


def _forward(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor], capture_outputs: bool = False) -> _Run:
    """Run the model once (no grad) on prepared inputs.

    Raises if the model is training (dropout would perturb alpha) or does not return one attention tensor per layer
    (and, for an encoder, ``num_layers + 1`` hidden states).
    """
    arch = _architecture(model)
    if model.training:
        raise ValueError("model is in training mode (dropout would perturb alpha); call model.eval() first")
    base = getattr(model, "base_model", model)
    layers = encoder_layers(model)
    captured_inputs: dict[int, torch.Tensor] = {}
    scales: dict[int, torch.Tensor] = {}
    outputs: dict[int, torch.Tensor] = {}
    handles = []

    def keep_input(module, args, kwargs, k):
        captured_inputs[k] = kwargs.get("hidden_states", args[0] if args else None).detach()

    def keep_scale(module, args, output, k):
        summed = args[0].detach().float()
        eps = getattr(module, "eps", getattr(module, "variance_epsilon", 0.0))
        scales[k] = torch.rsqrt(summed.pow(2).mean(-1) + eps)

    try:
        for k, layer in enumerate(layers):
            if arch.attention is not None:
                handles.append(dotted_attribute(layer, arch.attention, model).register_forward_pre_hook(
                    lambda m, a, kw, k=k: keep_input(m, a, kw, k), with_kwargs=True))
            if arch.row_norm is not None:
                handles.append(dotted_attribute(layer, arch.row_norm, model).register_forward_hook(
                    lambda m, a, o, k=k: keep_scale(m, a, o, k)))
            if capture_outputs:
                handles.append(dotted_attribute(layer, arch.output, model).register_forward_hook(
                    lambda m, a, o, k=k: outputs.__setitem__(k, o.detach())))
        extra = {"use_cache": False} if arch.causal else {"output_hidden_states": True}
        with torch.no_grad():
            result = base(**inputs, output_attentions=True, return_dict=True, **extra)
    finally:
        for handle in handles:
            handle.remove()
    attentions = result.attentions
    if attentions is None or len(attentions) != len(layers) or any(a is None for a in attentions):
        raise ValueError(
            "the model did not return one attention tensor per layer; load it with "
            "attn_implementation='eager' so that output_attentions=True works"
        )
    if arch.causal:
        if len(captured_inputs) != len(layers):
            raise ValueError("the attention modules were not called once per layer; cannot read their inputs")
        layer_inputs = [captured_inputs[k] for k in range(len(layers))]
        real = inputs["attention_mask"].bool()
        # [B, 1, L, L]: key j is visible to query i within the layer's causal band (j <= i, i - j < its window) when
        # j is real -- the rule of the override seam's causal branch and of transformers' sliding-window masks
        windows = [getattr(dotted_attribute(layer, arch.attention, model), "sliding_window", None) for layer in layers]
        allowed = [causal_band(real.shape[1], window, real.device)[None, None] & real[:, None, None, :]
                   for window in windows]
    else:
        hidden_states = result.hidden_states
        if hidden_states is None or len(hidden_states) != len(layers) + 1:
            raise ValueError("the model did not return num_layers + 1 hidden states with output_hidden_states=True")
        layer_inputs, allowed = list(hidden_states[:-1]), [None] * len(layers)
    row_scales = [scales.get(k) for k in range(len(layers))]
    return _Run(arch, layers, attentions, layer_inputs, allowed, row_scales, outputs)


def iter_layer_norms(model: torch.nn.Module, batch: Mapping[str, torch.Tensor], *, scale_rows: bool = True):
    """:func:`attention_norms` one layer at a time: run the model once and yield ``LayerNorms`` layer by layer."""
    run = _forward(model, prepare_batch(model, batch))
    with torch.no_grad():
        for index, layer in enumerate(run.layers):
            alpha = run.attentions[index]
            proj = run.arch.projections(layer)
            if alpha.shape[1] != proj.num_heads:
                raise ValueError(
                    f"layer {index}: attentions have {alpha.shape[1]} heads, the layer has {proj.num_heads}"
                )
            vectors = _transformed_vectors(proj, run.inputs[index])
            fx_norm = torch.linalg.vector_norm(vectors, dim=-1)  # [B, H, L]
            alpha_for_norm = alpha.to(fx_norm.dtype)
            afx_norm = alpha_for_norm.abs() * fx_norm[:, :, None, :]
            summed = _summed_norm(alpha_for_norm, vectors)
            del vectors
            scale = run.row_scales[index]
            if scale is not None and scale_rows:
                afx_norm = afx_norm * scale.to(afx_norm.dtype)[:, None, :, None]
                summed = summed * scale.to(summed.dtype)[:, :, None]
            yield LayerNorms(layer=index, alpha=alpha, fx_norm=fx_norm, afx_norm=afx_norm, summed_afx_norm=summed,
                             allowed=run.allowed[index], row_scale=scale)


def attention_norms(model: torch.nn.Module, batch: Mapping[str, torch.Tensor], *,
                    scale_rows: bool = True) -> list[LayerNorms]:
    """Attention weights and Kobayashi norms of every layer for one batch.

    Args:
        model: a Hugging Face encoder of a supported ``model_type`` (``decomposable_model_types()``), or a decoder LM
            (``decomposable_model_types(causal=True)``: Gemma 3, Llama, GPT-2), in eval mode and loaded with
            ``attn_implementation="eager"``; may be wrapped in a PAPA override, whose returned (constant or mixed)
            weights are then used as ``alpha``.
        batch: mapping with ``input_ids`` [B, L], usually ``attention_mask`` [B, L] and optionally
            ``token_type_ids`` (dropped for models with a single token type); other keys (e.g. ``labels``) are
            ignored.  Tensors are moved to the model's device.  A decoder's batch is right-padded (the layout of
            :func:`papa_lib.encode` for a decoder tokenizer).
        scale_rows: Gemma 3: include the post-attention norm's ``r_i = 1 / rms_i`` in ``afx_norm`` and
            ``summed_afx_norm`` (the default: the size of what reaches the residual stream); ``False`` leaves it out
            (``LayerNorms.row_scale`` holds it either way).  No effect on other architectures.

    Returns:
        One ``LayerNorms`` per layer, in layer order.  Padded positions are kept (mask them with the
        batch's ``attention_mask``).  Memory: ``2*B*H*L*L + B*H*L + B*L*L`` values per layer in the result, plus the
        transient ``B*H*L*D`` transformed vectors of one layer.
    """
    return list(iter_layer_norms(model, batch, scale_rows=scale_rows))


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
    run = _forward(model, inputs)
    for index, layer in enumerate(run.layers):
        with torch.no_grad():
            yield index, run.attentions[index], _fx_norms(run.arch.projections(layer), run.inputs[index])


# ----------------------------------------------------------------------------------------------------------------------
# The exactness check (Kobayashi Eq. 5-7)
# ----------------------------------------------------------------------------------------------------------------------


def decomposition_check(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> pd.DataFrame:
    """Check Kobayashi's Eq. 5-7 on one batch: ``sum_h sum_j alpha_ij f^h(x_j) + b_O`` against the model's own output.

    The module that outputs the attention sum of every layer is hooked while the model runs (an encoder's attention
    output projection, before dropout, residual and LayerNorm; Llama's ``o_proj``, GPT-2's ``c_proj``; for Gemma 3 the
    post-attention norm, rebuilt as ``r_i (sum_h sum_j alpha_ij f'^h(x_j) + b_O')``), and its output is compared with
    the rebuilt sum over the real query positions, from the same forward pass.
    Columns: layer, n_positions, max_abs_error, max_abs_output, relative_error (= max_abs_error / max_abs_output).
    """
    inputs = prepare_batch(model, batch)
    run = _forward(model, inputs, capture_outputs=True)
    real = inputs["attention_mask"].bool()
    rows = []
    for index, layer in enumerate(run.layers):
        proj = run.arch.projections(layer)
        captured = run.outputs[index]
        with torch.no_grad():
            vectors = _transformed_vectors(proj, run.inputs[index])  # [B, H, L, D]
            rebuilt = torch.einsum("bhij,bhjd->bid", run.attentions[index].to(vectors.dtype), vectors)
            rebuilt = rebuilt + proj.output_bias
            if run.row_scales[index] is not None:
                rebuilt = rebuilt * run.row_scales[index].to(rebuilt.dtype)[..., None]
        error = (rebuilt - captured)[real].abs().max().item()
        scale = captured[real].abs().max().item()
        rows.append({"layer": index, "n_positions": int(real.sum()), "max_abs_error": error, "max_abs_output": scale,
                     "relative_error": error / scale if scale else math.nan})
    return pd.DataFrame(rows)
