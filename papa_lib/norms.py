"""Norm-based analysis of attention (Kobayashi et al., 2020, "Attention is Not Only a Weight").

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
* ``summed_afx_norm``  [B, L, L]     ``||sum_h alpha^h_ij f^h(x_j)||`` (the heads-combined contribution, Kobayashi Sec. 5),

and streams those quantities over a corpus to reproduce Kobayashi's analyses: the coefficient of variation of
``||f(x)||`` per head (Sec. 4.1), weight-based vs norm-based attention to [CLS]/[SEP]/punctuation (Sec. 4.2, Fig. 3),
the correlation between the weight given to [SEP] and ``||f([SEP])||`` (Sec. 4.2, Fig. 4) and the relation between
token frequency and ``||f(x)||`` (Sec. 4.3, Fig. 5).

Memory (per layer, batch ``B``, heads ``H``, length ``L``, hidden size ``D``): the transformed vectors ``f^h(x_j)``
take ``B*H*L*D`` values of the model dtype; ``afx_norm`` and ``alpha`` take ``B*H*L*L`` each.  A ``[B, H, L, L, D]``
tensor is never built: ``afx_norm`` uses the identity above and ``summed_afx_norm`` uses the per-token Gram matrix
``G[b, j, h, k] = <f^h(x_j), f^k(x_j)>`` (``B*L*H*H`` float64 values), so that
``||sum_h a_h f^h||^2 = sum_{h,k} a_h a_k G_hk``; this is evaluated in float64 in chunks of query rows holding at
most ``_SUMMED_NORM_CHUNK_ELEMENTS`` float64 values (128 MiB) at a time.  ``attention_norms`` returns all layers at
once (``2*B*H*L*L + B*H*L + B*L*L`` values per layer); ``corpus_norm_statistics`` keeps only one layer's norms alive
at a time and its accumulators do not grow with the corpus (see its docstring).

Architectures are described by one small function each in ``_PROJECTION_GETTERS`` (keyed by ``config.model_type``),
returning the value and output projections of one encoder layer.

Norm-aware PAPA (beyond both papers; book chapter "Norm-based analysis"):

* ``norm_weighted_attention`` builds constant matrices like PAPA's Eq. 2 (pad-aware per-entry means) from the
  row-normalised norm-weighted attention ``w_ij = alpha_ij ||f(x_j)|| / sum_k alpha_ik ||f(x_k)||`` (matrix type
  ``norm_average`` of :mod:`papa_lib.experiments`);
* ``input_dependence_scores`` ranks heads without labels by the pooled per-entry variance of ``alpha`` (or ``w``)
  across inputs — the mean squared error of replacing the head by its constant matrix (orders
  ``attention_variance`` and ``norm_variance``);
* ``norm_aware_blocks``/``norm_aware_grid`` declare the grid (``data/results/norms-minilm/grid.yaml``), and
  ``run_analyses``/``read_analyses``, ``label_free_comparison``, ``matrix_comparison`` and friends produce the
  chapter's tables.
"""

from __future__ import annotations

import math
import string
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from .averaging import pair_mask
from scipy import stats as scipy_stats

__all__ = [
    "AttentionProjections",
    "LayerNorms",
    "CorpusNormStatistics",
    "TokenCategorizer",
    "CATEGORY_NAMES",
    "supported_model_types",
    "attention_projections",
    "encoder_layers",
    "transformed_vectors",
    "attention_norms",
    "corpus_norm_statistics",
    "fx_norm_variation",
    "attention_share_by_category",
    "sep_weight_norm_correlation",
    "sep_observations",
    "fx_norm_by_category",
    "token_frequency_table",
    "frequency_norm_correlation",
    "INPUT_DEPENDENCE_WEIGHTINGS",
    "norm_weighted_rows",
    "norm_weighted_attention",
    "input_dependence_scores",
    "matrix_total_variation",
    "NORM_RESULT_FOLDERS",
    "NORM_AWARE_ORDERS",
    "NORM_AWARE_FRACTIONS",
    "norm_aware_blocks",
    "norm_aware_grid",
    "ANALYSIS_FILES",
    "wikitext_pairs",
    "run_analyses",
    "read_analyses",
    "decomposition_check",
    "head_level_correlation",
    "find_constant_matrices",
    "norm_results_folder",
    "norm_aware_results",
    "label_free_comparison",
    "matrix_comparison",
    "sentence_shares",
    "missing_norm_runs",
    "head_score_table",
    "score_agreement",
]

#: Token categories of Kobayashi et al. Sec. 4.2, in the order used by every category axis of this module.
CATEGORY_NAMES: tuple[str, ...] = ("cls", "sep", "punctuation", "other")
_CLS, _SEP, _PUNCT, _OTHER = range(4)

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
            f"hidden_states has size {hidden_states.shape[-1]} but layer {layer_index} expects {proj.value_weight.shape[1]}"
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


def _prepare_batch(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
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


def _iter_layer_norms(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]):
    """Run the model once and yield ``LayerNorms`` layer by layer (shared by the public functions)."""
    getter, layers, attentions, hidden_states = _attentions_and_hidden_states(model, _prepare_batch(model, batch))
    with torch.no_grad():
        for index, layer in enumerate(layers):
            alpha = attentions[index]
            proj = getter(layer)
            if alpha.shape[1] != proj.num_heads:
                raise ValueError(f"layer {index}: attentions have {alpha.shape[1]} heads, the layer has {proj.num_heads}")
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
    return list(_iter_layer_norms(model, batch))


# ----------------------------------------------------------------------------------------------------------------------
# Token categories
# ----------------------------------------------------------------------------------------------------------------------


def _is_punctuation(text: str) -> bool:
    return bool(text) and all(ch in string.punctuation or unicodedata.category(ch).startswith("P") for ch in text)


class TokenCategorizer:
    """Maps token ids to Kobayashi's categories ``CATEGORY_NAMES`` (cls, sep, punctuation, other).

    [CLS]/[SEP] are ``tokenizer.cls_token_id``/``sep_token_id`` (``<s>``/``</s>`` for RoBERTa-style tokenizers).
    Punctuation: every other token whose decoded text, stripped of whitespace (and of a WordPiece ``##`` prefix),
    is non-empty and consists only of Unicode punctuation (category P*) or ASCII ``string.punctuation`` characters.
    Everything else, including other special tokens, is "other".
    """

    def __init__(self, tokenizer, vocab_size: int | None = None):
        cls_id, sep_id = getattr(tokenizer, "cls_token_id", None), getattr(tokenizer, "sep_token_id", None)
        if cls_id is None or sep_id is None:
            raise ValueError("the tokenizer needs cls_token_id and sep_token_id to categorise tokens")
        tokenizer_size = len(tokenizer)
        size = max(tokenizer_size, vocab_size or 0)
        lookup = torch.full((size,), _OTHER, dtype=torch.long)
        texts = tokenizer.batch_decode([[i] for i in range(tokenizer_size)])
        for token_id, text in enumerate(texts):
            text = text.strip()
            if text.startswith("##") and len(text) > 2:
                text = text[2:]
            if _is_punctuation(text):
                lookup[token_id] = _PUNCT
        lookup[cls_id] = _CLS
        lookup[sep_id] = _SEP
        self.lookup = lookup
        self.cls_token_id, self.sep_token_id = cls_id, sep_id

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Category index (into ``CATEGORY_NAMES``) of every id in ``input_ids``."""
        input_ids = torch.as_tensor(input_ids)
        if input_ids.numel() and int(input_ids.max()) >= len(self.lookup):
            raise ValueError(f"token id {int(input_ids.max())} is outside the tokenizer vocabulary ({len(self.lookup)})")
        return self.lookup.to(input_ids.device)[input_ids]


# ----------------------------------------------------------------------------------------------------------------------
# Corpus statistics
# ----------------------------------------------------------------------------------------------------------------------


@dataclass
class CorpusNormStatistics:
    """Streaming accumulators for the corpus analyses (float64 on the CPU), built by ``corpus_norm_statistics``.

    ``Ly`` layers, ``H`` heads, ``C = len(CATEGORY_NAMES)`` categories, ``R`` bootstrap replicates, ``V`` vocabulary.

    Totals over real (non-padding) tokens; query rows are real tokens and keys are restricted to real tokens.
    ``boot_*`` arrays hold the same totals for ``R`` Poisson-bootstrap replicates over sentences (each sentence gets
    weight ~ Poisson(1) in each replicate; Hanley & MacGibbon 2006), which gives percentile confidence intervals with
    memory independent of corpus size.  ``share_sum[..., m]``: m = 0 weight-based (alpha), m = 1 norm-based
    (``||alpha f(x)||``), each the per-query-row share of the category, summed over query rows.
    ``sep_observations``: a uniform reservoir sample (at most ``max_sep_observations`` rows) of [SEP] occurrences,
    each row [Ly, H, 2] = (mean alpha given to this [SEP] by the real queries of its sentence, ``||f^h([SEP])||``);
    ``cls_observations`` the same for [CLS] (a reservoir of the same size).
    """

    num_layers: int
    num_heads: int
    bootstrap_replicates: int
    max_sep_observations: int
    fx_sum: torch.Tensor  # [Ly, H] sum of ||f^h(x)|| over real tokens
    fx_sq_sum: torch.Tensor  # [Ly, H] sum of ||f^h(x)||^2
    share_sum: torch.Tensor  # [Ly, H, C, 2]
    summed_share_sum: torch.Tensor  # [Ly, C]  norm-based with heads combined (||sum_h alpha f^h||)
    category_count: torch.Tensor  # [C] real tokens per category
    category_fx_sum: torch.Tensor  # [Ly, H, C]
    boot_tokens: torch.Tensor  # [R]
    boot_fx_sum: torch.Tensor  # [R, Ly, H]
    boot_fx_sq_sum: torch.Tensor  # [R, Ly, H]
    boot_share_sum: torch.Tensor  # [R, Ly, H, C, 2]
    boot_summed_share_sum: torch.Tensor  # [R, Ly, C]
    boot_category_count: torch.Tensor  # [R, C]
    boot_category_fx_sum: torch.Tensor  # [R, Ly, H, C]
    token_count: torch.Tensor  # [V] occurrences of each token id (real tokens), int64
    token_fx_sum: torch.Tensor  # [Ly, V] sum over occurrences of mean_h ||f^h(x)||
    sep_observations: torch.Tensor  # [N <= max_sep_observations, Ly, H, 2] float32
    sep_observations_seen: int = 0
    num_sentences: int = 0
    num_tokens: int = 0
    token_strings: dict[int, str] = field(default_factory=dict)  # id -> token string, for the ids seen
    cls_observations: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 0, 0, 2))  # like sep_observations
    cls_observations_seen: int = 0


def _empty_statistics(layers: int, heads: int, vocab: int, replicates: int, max_sep: int) -> CorpusNormStatistics:
    c = len(CATEGORY_NAMES)

    def zeros(*shape):
        return torch.zeros(*shape, dtype=torch.float64)

    return CorpusNormStatistics(
        num_layers=layers,
        num_heads=heads,
        bootstrap_replicates=replicates,
        max_sep_observations=max_sep,
        fx_sum=zeros(layers, heads),
        fx_sq_sum=zeros(layers, heads),
        share_sum=zeros(layers, heads, c, 2),
        summed_share_sum=zeros(layers, c),
        category_count=zeros(c),
        category_fx_sum=zeros(layers, heads, c),
        boot_tokens=zeros(replicates),
        boot_fx_sum=zeros(replicates, layers, heads),
        boot_fx_sq_sum=zeros(replicates, layers, heads),
        boot_share_sum=zeros(replicates, layers, heads, c, 2),
        boot_summed_share_sum=zeros(replicates, layers, c),
        boot_category_count=zeros(replicates, c),
        boot_category_fx_sum=zeros(replicates, layers, heads, c),
        token_count=torch.zeros(vocab, dtype=torch.long),
        token_fx_sum=zeros(layers, vocab),
        sep_observations=torch.zeros(0, layers, heads, 2, dtype=torch.float32),
        cls_observations=torch.zeros(0, layers, heads, 2, dtype=torch.float32),
    )


def _row_shares(contribution: torch.Tensor, key_onehot: torch.Tensor) -> torch.Tensor:
    """Per-row share of each key category: contribution [B, (H,) L, L] (masked keys), key_onehot [B, L, C]."""
    total = contribution.sum(dim=-1, keepdim=True)
    per_category = torch.matmul(contribution, key_onehot.unsqueeze(1) if contribution.dim() == 4 else key_onehot)
    return torch.where(total != 0, per_category / torch.where(total != 0, total, 1.0), 0.0)


def _reservoir_add(stats: CorpusNormStatistics, rows: torch.Tensor, generator: torch.Generator, token: str = "sep") -> None:
    """Uniform reservoir sampling (Vitter's algorithm R) of observation rows (``token``: "sep" or "cls")."""
    cap = stats.max_sep_observations
    seen_name, kept_name = f"{token}_observations_seen", f"{token}_observations"
    if cap <= 0 or rows.shape[0] == 0:
        setattr(stats, seen_name, getattr(stats, seen_name) + rows.shape[0])
        return
    kept = getattr(stats, kept_name)
    seen = getattr(stats, seen_name)
    take = min(cap - kept.shape[0], rows.shape[0])
    if take > 0:
        kept = torch.cat([kept, rows[:take]])
        seen += take
        rows = rows[take:]
    for row in rows:  # reservoir full: row t (1-based) replaces a random slot with probability cap / t
        seen += 1
        slot = int(torch.randint(0, seen, (1,), generator=generator))
        if slot < cap:
            kept[slot] = row
    setattr(stats, kept_name, kept)
    setattr(stats, seen_name, seen)


def corpus_norm_statistics(
    model: torch.nn.Module,
    batches: Iterable[Mapping[str, torch.Tensor]],
    tokenizer,
    *,
    bootstrap_replicates: int = 200,
    max_sep_observations: int = 20_000,
    seed: int = 0,
) -> CorpusNormStatistics:
    """Stream ``attention_norms`` over ``batches`` and accumulate what the analysis functions need.

    Args:
        model: as for ``attention_norms``.
        batches: iterable of batches (mappings with ``input_ids``, ``attention_mask``, optionally ``token_type_ids``);
            consumed once.
        tokenizer: the model's tokenizer, used for the token categories (``TokenCategorizer``) and token strings.
        bootstrap_replicates: ``R``, number of Poisson-bootstrap replicates over sentences (0 disables intervals).
        max_sep_observations: size of the reservoir of [SEP] observations for the correlation analysis.
        seed: seeds the bootstrap weights and the reservoir.

    Memory does not depend on the corpus size: besides one batch's forward pass (the model's attentions and hidden
    states of all layers) and one layer's norms at a time, it holds ``O(R*Ly*H*C + Ly*V + max_sep_observations*Ly*H)``
    numbers.
    """
    if bootstrap_replicates < 0:
        raise ValueError(f"bootstrap_replicates must be >= 0, got {bootstrap_replicates}")
    if max_sep_observations < 0:
        raise ValueError(f"max_sep_observations must be >= 0, got {max_sep_observations}")
    layers = len(encoder_layers(model))
    heads = attention_projections(model, 0).num_heads
    vocab = int(getattr(model.config, "vocab_size", 0) or 0)
    categorizer = TokenCategorizer(tokenizer, vocab_size=vocab)
    vocab = len(categorizer.lookup)
    generator = torch.Generator().manual_seed(seed)
    stats = _empty_statistics(layers, heads, vocab, bootstrap_replicates, max_sep_observations)
    num_categories = len(CATEGORY_NAMES)
    empty = True

    for batch in batches:
        empty = False
        inputs = _prepare_batch(model, batch)
        input_ids = inputs["input_ids"].cpu()
        mask = inputs["attention_mask"].cpu().bool()
        batch_size = input_ids.shape[0]
        categories = categorizer(input_ids)
        onehot = torch.nn.functional.one_hot(categories, num_categories).to(torch.float64) * mask[..., None]
        mask64 = mask.to(torch.float64)
        tokens_per_sentence = mask64.sum(dim=1)  # [B]
        real = mask.reshape(-1)
        real_ids = input_ids.reshape(-1)[real]

        # per-sentence totals of this batch, filled layer by layer
        fx_sum = torch.zeros(batch_size, layers, heads, dtype=torch.float64)
        fx_sq_sum = torch.zeros_like(fx_sum)
        share = torch.zeros(batch_size, layers, heads, num_categories, 2, dtype=torch.float64)
        summed_share = torch.zeros(batch_size, layers, num_categories, dtype=torch.float64)
        category_fx = torch.zeros(batch_size, layers, heads, num_categories, dtype=torch.float64)
        special = {token: torch.nonzero((categories == category) & mask, as_tuple=True)
                   for token, category in (("sep", _SEP), ("cls", _CLS))}
        special_rows = {token: [] for token in special}

        for layer_norms in _iter_layer_norms(model, inputs):
            # the [B, H, L, L] work stays on the model's device in the norms' dtype; per-sentence totals go to CPU
            # float64 (float32 per-row shares are accurate to ~1e-7, far below the sampling noise)
            ell, device, dtype = layer_norms.layer, layer_norms.fx_norm.device, layer_norms.fx_norm.dtype
            alpha = layer_norms.alpha.to(dtype)
            fx = layer_norms.fx_norm
            real_mask = mask.to(device=device, dtype=dtype)
            key_onehot = onehot.to(device=device, dtype=dtype)

            fx64 = fx.to("cpu", torch.float64)
            fx_real = fx64 * mask64[:, None, :]
            fx_sum[:, ell] = fx_real.sum(-1)
            fx_sq_sum[:, ell] = (fx_real * fx64).sum(-1)
            category_fx[:, ell] = torch.einsum("bhj,bjc->bhc", fx64, onehot)
            for method, contribution in enumerate((alpha, layer_norms.afx_norm)):
                shares = _row_shares(contribution * real_mask[:, None, None, :], key_onehot)  # [B, H, L, C]
                share[:, ell, :, :, method] = (shares * real_mask[:, None, :, None]).sum(dim=2).to("cpu", torch.float64)
            summed_shares = _row_shares(layer_norms.summed_afx_norm * real_mask[:, None, :], key_onehot)  # [B, L, C]
            summed_share[:, ell] = (summed_shares * real_mask[:, :, None]).sum(dim=1).to("cpu", torch.float64)

            stats.token_fx_sum[ell].index_add_(0, real_ids, fx64.mean(dim=1).reshape(-1)[real])

            for token, (tok_b, tok_j) in special.items():
                if not tok_b.numel():
                    continue
                b_index, j_index = tok_b.to(device), tok_j.to(device)
                to_token = alpha[b_index, :, :, j_index]  # [N, H, L]: weight from every query to this token
                mean_to_token = (to_token * real_mask[b_index][:, None, :]).sum(-1).to("cpu", torch.float64)
                mean_to_token = mean_to_token / tokens_per_sentence[tok_b][:, None]
                special_rows[token].append(torch.stack([mean_to_token, fx64[tok_b, :, tok_j]], dim=-1))  # [N, H, 2]

        stats.num_sentences += batch_size
        stats.num_tokens += int(mask.sum())
        stats.token_count.index_add_(0, real_ids, torch.ones_like(real_ids))
        for token_id in torch.unique(real_ids).tolist():
            if token_id not in stats.token_strings:
                stats.token_strings[token_id] = tokenizer.convert_ids_to_tokens(token_id)
        stats.fx_sum += fx_sum.sum(0)
        stats.fx_sq_sum += fx_sq_sum.sum(0)
        stats.share_sum += share.sum(0)
        stats.summed_share_sum += summed_share.sum(0)
        stats.category_count += onehot.sum(dim=(0, 1))
        stats.category_fx_sum += category_fx.sum(0)
        if bootstrap_replicates:
            weights = torch.poisson(torch.ones(bootstrap_replicates, batch_size, dtype=torch.float64), generator)
            stats.boot_tokens += weights @ tokens_per_sentence
            stats.boot_fx_sum += torch.einsum("rb,blh->rlh", weights, fx_sum)
            stats.boot_fx_sq_sum += torch.einsum("rb,blh->rlh", weights, fx_sq_sum)
            stats.boot_share_sum += torch.einsum("rb,blhcm->rlhcm", weights, share)
            stats.boot_summed_share_sum += torch.einsum("rb,blc->rlc", weights, summed_share)
            stats.boot_category_count += weights @ onehot.sum(dim=1)
            stats.boot_category_fx_sum += torch.einsum("rb,blhc->rlhc", weights, category_fx)
        for token, rows in special_rows.items():
            if rows:
                _reservoir_add(stats, torch.stack(rows, dim=1).to(torch.float32), generator, token)

    if empty:
        raise ValueError("batches was empty; nothing to accumulate")
    return stats


# ----------------------------------------------------------------------------------------------------------------------
# Analyses (tidy DataFrames; layers and heads are 0-based)
# ----------------------------------------------------------------------------------------------------------------------


def _check_confidence(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return (1.0 - confidence) / 2.0


def _percentile_interval(replicates: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap interval over axis 0; NaN where there are no replicates."""
    tail = _check_confidence(confidence)
    shape = replicates.shape[1:]
    if replicates.shape[0] == 0:
        return np.full(shape, np.nan), np.full(shape, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        low, high = np.nanquantile(replicates, [tail, 1.0 - tail], axis=0)
    return low, high


def _coefficient_of_variation(n, s1, s2):
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = s1 / n
        variance = np.clip(s2 / n - mean**2, 0.0, None) * n / (n - 1)  # sample variance (ddof=1)
        std = np.sqrt(variance)
        return mean, std, std / mean


def fx_norm_variation(stats: CorpusNormStatistics, confidence: float = 0.95) -> pd.DataFrame:
    """Coefficient of variation of ``||f^h(x)||`` over the corpus's real tokens, per head (Kobayashi Sec. 4.1).

    Columns: layer, head, n_tokens, mean_fx_norm, std_fx_norm (ddof=1), cv, cv_ci_low, cv_ci_high (percentile
    Poisson bootstrap over sentences).
    """
    n = float(stats.num_tokens)
    mean, std, cv = _coefficient_of_variation(n, stats.fx_sum.numpy(), stats.fx_sq_sum.numpy())
    _, _, boot_cv = _coefficient_of_variation(
        stats.boot_tokens.numpy()[:, None, None], stats.boot_fx_sum.numpy(), stats.boot_fx_sq_sum.numpy()
    )
    low, high = _percentile_interval(boot_cv, confidence)
    layer, head = np.meshgrid(np.arange(stats.num_layers), np.arange(stats.num_heads), indexing="ij")
    return pd.DataFrame(
        {
            "layer": layer.ravel(),
            "head": head.ravel(),
            "n_tokens": stats.num_tokens,
            "mean_fx_norm": mean.ravel(),
            "std_fx_norm": std.ravel(),
            "cv": cv.ravel(),
            "cv_ci_low": low.ravel(),
            "cv_ci_high": high.ravel(),
        }
    )


_SHARE_METHODS = ("weight", "norm")


def attention_share_by_category(
    stats: CorpusNormStatistics, per_head: bool = False, confidence: float = 0.95
) -> pd.DataFrame:
    """Weight-based vs norm-based share of attention given to each token category (Kobayashi Sec. 4.2, Fig. 3).

    For each real query row, the share of category c is ``sum_{j in c} alpha_ij / sum_j alpha_ij`` (method
    "weight") or the same with ``||alpha_ij f^h(x_j)||`` (method "norm"), keys restricted to real tokens; shares are
    averaged over all real query tokens of the corpus.  With ``per_head=False`` the per-head shares are averaged
    over the heads of each layer and a third method "norm_heads_summed" uses ``||sum_h alpha^h_ij f^h(x_j)||``.

    Columns: layer, [head,] method, category, share, ci_low, ci_high (percentile Poisson bootstrap over sentences).
    """
    n = float(stats.num_tokens)
    boot_n = stats.boot_tokens.numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        if per_head:
            value = stats.share_sum.numpy() / n  # [Ly, H, C, M]
            boot = stats.boot_share_sum.numpy() / boot_n[:, None, None, None, None]
        else:
            per_layer = stats.share_sum.numpy().mean(axis=1) / n  # [Ly, C, M]
            boot_layer = stats.boot_share_sum.numpy().mean(axis=2) / boot_n[:, None, None, None]
            summed = stats.summed_share_sum.numpy() / n  # [Ly, C]
            boot_summed = stats.boot_summed_share_sum.numpy() / boot_n[:, None, None]
            value = np.concatenate([per_layer, summed[..., None]], axis=-1)
            boot = np.concatenate([boot_layer, boot_summed[..., None]], axis=-1)
    low, high = _percentile_interval(boot, confidence)
    methods = _SHARE_METHODS if per_head else (*_SHARE_METHODS, "norm_heads_summed")
    index_names = ["layer", "head", "category", "method"] if per_head else ["layer", "category", "method"]
    grids = np.meshgrid(*[np.arange(s) for s in value.shape], indexing="ij")
    frame = pd.DataFrame({name: grid.ravel() for name, grid in zip(index_names, grids)})
    frame["category"] = np.asarray(CATEGORY_NAMES)[frame["category"].to_numpy()]
    frame["method"] = np.asarray(methods)[frame["method"].to_numpy()]
    frame["share"] = value.ravel()
    frame["ci_low"] = low.ravel()
    frame["ci_high"] = high.ravel()
    columns = ["layer", "head"] if per_head else ["layer"]
    return frame[[*columns, "method", "category", "share", "ci_low", "ci_high"]].sort_values(
        [*columns, "method", "category"], ignore_index=True
    )


def _fisher_interval(r: float, n: int, confidence: float, variance_factor: float = 1.0) -> tuple[float, float]:
    """Fisher z interval for a correlation; variance_factor 1.06 for Spearman (Fieller, Hartley & Pearson 1957)."""
    tail = _check_confidence(confidence)
    if n <= 3 or not np.isfinite(r):
        return math.nan, math.nan
    z = math.atanh(min(max(r, -0.9999999), 0.9999999))
    half = scipy_stats.norm.ppf(1.0 - tail) * math.sqrt(variance_factor / (n - 3))
    return math.tanh(z - half), math.tanh(z + half)


def _correlations(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float]:
    """Pearson r, its p-value, Spearman rho, its p-value (NaN when undefined)."""
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan, math.nan, math.nan, math.nan
    pearson = scipy_stats.pearsonr(x, y)
    spearman = scipy_stats.spearmanr(x, y)
    return float(pearson.statistic), float(pearson.pvalue), float(spearman.statistic), float(spearman.pvalue)


_SPECIAL_TOKENS = ("sep", "cls")


def _special_observations(stats: CorpusNormStatistics, token: str) -> np.ndarray:
    if token not in _SPECIAL_TOKENS:
        raise ValueError(f"token must be one of {_SPECIAL_TOKENS}, got {token!r}")
    return getattr(stats, f"{token}_observations").to(torch.float64).numpy()


def sep_weight_norm_correlation(stats: CorpusNormStatistics, confidence: float = 0.95, token: str = "sep") -> pd.DataFrame:
    """Correlation between the attention weight given to [SEP] and ``||f^h([SEP])||`` per head (Kobayashi Fig. 4).

    One observation per [SEP] occurrence (from the reservoir sample): x = mean over the sentence's real query tokens
    of alpha to that [SEP], y = ``||f^h([SEP])||``.  Intervals: Fisher z (Spearman with variance 1.06/(n-3)); they
    treat the [SEP] occurrences as independent, which is optimistic when a sentence has several.
    ``token="cls"`` does the same for [CLS] (one occurrence per sentence; column names say ``cls``).

    Columns: layer, head, n_observations, mean_alpha_to_sep, mean_fx_norm_sep, pearson_r, pearson_p,
    pearson_ci_low, pearson_ci_high, spearman_rho, spearman_p, spearman_ci_low, spearman_ci_high.
    """
    _check_confidence(confidence)
    observations = _special_observations(stats, token)
    n = observations.shape[0]
    rows = []
    for layer in range(stats.num_layers):
        for head in range(stats.num_heads):
            x, y = observations[:, layer, head, 0], observations[:, layer, head, 1]
            pr, pp, sr, sp = _correlations(x, y)
            p_low, p_high = _fisher_interval(pr, n, confidence)
            s_low, s_high = _fisher_interval(sr, n, confidence, 1.06)
            rows.append(
                {
                    "layer": layer,
                    "head": head,
                    "n_observations": n,
                    f"mean_alpha_to_{token}": float(x.mean()) if n else math.nan,
                    f"mean_fx_norm_{token}": float(y.mean()) if n else math.nan,
                    "pearson_r": pr,
                    "pearson_p": pp,
                    "pearson_ci_low": p_low,
                    "pearson_ci_high": p_high,
                    "spearman_rho": sr,
                    "spearman_p": sp,
                    "spearman_ci_low": s_low,
                    "spearman_ci_high": s_high,
                }
            )
    return pd.DataFrame(rows)


def sep_observations(
    stats: CorpusNormStatistics, layer: int | None = None, head: int | None = None, token: str = "sep"
) -> pd.DataFrame:
    """The reservoir of [SEP] observations in long form, for scatter plots (Kobayashi Fig. 4).

    Columns: observation, layer, head, alpha_to_sep, fx_norm_sep; optionally filtered to one layer and/or head.
    ``token="cls"``: the [CLS] reservoir (columns alpha_to_cls, fx_norm_cls).
    """
    observations = _special_observations(stats, token)
    for name, value, limit in (("layer", layer, stats.num_layers), ("head", head, stats.num_heads)):
        if value is not None and not 0 <= value < limit:
            raise ValueError(f"{name} {value} out of range [0, {limit})")
    obs, lay, hd = np.meshgrid(
        np.arange(observations.shape[0]), np.arange(stats.num_layers), np.arange(stats.num_heads), indexing="ij"
    )
    frame = pd.DataFrame(
        {
            "observation": obs.ravel(),
            "layer": lay.ravel(),
            "head": hd.ravel(),
            f"alpha_to_{token}": observations[..., 0].ravel(),
            f"fx_norm_{token}": observations[..., 1].ravel(),
        }
    )
    if layer is not None:
        frame = frame[frame["layer"] == layer]
    if head is not None:
        frame = frame[frame["head"] == head]
    return frame.reset_index(drop=True)


def fx_norm_by_category(stats: CorpusNormStatistics, confidence: float = 0.95) -> pd.DataFrame:
    """Mean ``||f^h(x)||`` of each token category per layer and head (Kobayashi Sec. 4.2, "Evidence 2").

    Columns: layer, head, category, n_tokens, mean_fx_norm, ci_low, ci_high (percentile Poisson bootstrap).
    """
    counts = stats.category_count.numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = stats.category_fx_sum.numpy() / counts  # [Ly, H, C]
        boot = stats.boot_category_fx_sum.numpy() / stats.boot_category_count.numpy()[:, None, None, :]
    low, high = _percentile_interval(boot, confidence)
    layer, head, cat = np.meshgrid(
        np.arange(stats.num_layers), np.arange(stats.num_heads), np.arange(len(CATEGORY_NAMES)), indexing="ij"
    )
    return pd.DataFrame(
        {
            "layer": layer.ravel(),
            "head": head.ravel(),
            "category": np.asarray(CATEGORY_NAMES)[cat.ravel()],
            "n_tokens": counts[cat.ravel()].astype(np.int64),
            "mean_fx_norm": mean.ravel(),
            "ci_low": low.ravel(),
            "ci_high": high.ravel(),
        }
    )


def token_frequency_table(stats: CorpusNormStatistics, min_count: int = 1) -> pd.DataFrame:
    """Token types seen in the corpus with their frequency rank and mean ``||f(x)||`` per layer (Kobayashi Fig. 5).

    ``frequency_rank`` is 1 for the most frequent token (ties get the average rank); ``mean_fx_norm`` is the mean
    over occurrences of the head-averaged ``||f^h(x)||``.  Only types with ``count >= min_count`` are listed.
    Columns: token_id, token, count, frequency_rank, layer, mean_fx_norm.
    """
    if min_count < 1:
        raise ValueError(f"min_count must be >= 1, got {min_count}")
    counts = stats.token_count.numpy()
    ids = np.nonzero(counts >= min_count)[0]
    if ids.size == 0:
        return pd.DataFrame(columns=["token_id", "token", "count", "frequency_rank", "layer", "mean_fx_norm"])
    ranks = scipy_stats.rankdata(-counts[ids], method="average")
    means = stats.token_fx_sum.numpy()[:, ids] / counts[ids]  # [Ly, T]
    tokens = [stats.token_strings.get(int(i), str(int(i))) for i in ids]
    frames = [
        pd.DataFrame(
            {
                "token_id": ids,
                "token": tokens,
                "count": counts[ids],
                "frequency_rank": ranks,
                "layer": layer,
                "mean_fx_norm": means[layer],
            }
        )
        for layer in range(stats.num_layers)
    ]
    return pd.concat(frames, ignore_index=True)


def frequency_norm_correlation(
    stats: CorpusNormStatistics, min_count: int = 1, confidence: float = 0.95
) -> pd.DataFrame:
    """Spearman correlation between a token type's frequency rank and its mean ``||f(x)||``, per layer (Sec. 4.3).

    Frequencies are counted on the analysed corpus (real tokens, special tokens included).  Interval: Fisher z with
    variance 1.06/(n-3) over the ``n`` token types (it ignores the sampling noise of each type's mean norm).
    Columns: layer, n_token_types, spearman_rho, spearman_p, ci_low, ci_high.
    """
    _check_confidence(confidence)
    table = token_frequency_table(stats, min_count=min_count)
    rows = []
    for layer in range(stats.num_layers):
        part = table[table["layer"] == layer]
        x, y = part["frequency_rank"].to_numpy(float), part["mean_fx_norm"].to_numpy(float)
        _, _, rho, p = _correlations(x, y)
        low, high = _fisher_interval(rho, len(part), confidence, 1.06)
        rows.append(
            {
                "layer": layer,
                "n_token_types": len(part),
                "spearman_rho": rho,
                "spearman_p": p,
                "ci_low": low,
                "ci_high": high,
            }
        )
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------------------------------
# Norm-aware PAPA (beyond both papers): norm-weighted constant matrices and label-free head scores
# ----------------------------------------------------------------------------------------------------------------------

INPUT_DEPENDENCE_WEIGHTINGS: tuple[str, ...] = ("attention", "norm")


def _fx_norms(proj: AttentionProjections, hidden_states: torch.Tensor) -> torch.Tensor:
    """``||f^h(x_j)||`` [B, H, L] without building the [B, H, L, D] vectors.

    With ``v = x W_V^h + b_V^h`` (size d') and ``W_O^h`` the [D, d'] columns of the output projection,
    ``||v W_O^h||^2 = v^T (W_O^h^T W_O^h) v``: a d' x d' Gram matrix per head, evaluated in float64.
    """
    values = torch.nn.functional.linear(hidden_states, proj.value_weight, proj.value_bias)
    values = values.view(*hidden_states.shape[:2], proj.num_heads, proj.head_size).to(torch.float64)  # [B, L, H, d']
    output_weight = proj.output_weight.view(proj.output_weight.shape[0], proj.num_heads, proj.head_size)
    output_weight = output_weight.to(torch.float64)
    gram = torch.einsum("dhp,dhq->hpq", output_weight, output_weight)  # [H, d', d']
    squared = torch.einsum("blhp,hpq,blhq->bhl", values, gram, values)
    return squared.clamp_min_(0.0).sqrt_().to(hidden_states.dtype)


def _iter_alpha_and_fx_norms(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor]):
    """Run the model once; yield ``(layer, alpha [B, H, L, L], fx_norm [B, H, L])`` layer by layer (inputs prepared)."""
    getter, layers, attentions, hidden_states = _attentions_and_hidden_states(model, inputs)
    for index, layer in enumerate(layers):
        with torch.no_grad():
            yield index, attentions[index], _fx_norms(getter(layer), hidden_states[index])


def norm_weighted_rows(alpha: torch.Tensor, fx_norm: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Row-normalised norm-weighted attention ``w_ij = alpha_ij ||f(x_j)|| / sum_{k real} alpha_ik ||f(x_k)||``.

    Args:
        alpha: [B, H, L, L] attention weights (query i, key j).
        fx_norm: [B, H, L] ``||f^h(x_j)||``.
        attention_mask: [B, L], 1 for real tokens.

    Returns:
        [B, H, L, L] float32: every row over the real keys sums to 1 (padded keys get 0); a row whose norm-weighted
        total is 0 is all zeros.  Like ``alpha``, ``w`` is a distribution over keys, but it measures how much of the
        head's output (its share of ``sum_j ||alpha_ij f(x_j)||``) comes from each key (Kobayashi Sec. 3).
    """
    if alpha.dim() != 4 or fx_norm.shape != alpha.shape[:3] or alpha.shape[-1] != alpha.shape[-2]:
        raise ValueError(
            f"alpha must be [B, H, L, L] and fx_norm [B, H, L]; got {tuple(alpha.shape)} and {tuple(fx_norm.shape)}"
        )
    if tuple(attention_mask.shape) != (alpha.shape[0], alpha.shape[-1]):
        raise ValueError(f"attention_mask must be [B, L] = {(alpha.shape[0], alpha.shape[-1])}, got {tuple(attention_mask.shape)}")
    keys = attention_mask.to(device=alpha.device, dtype=torch.float32)[:, None, None, :]
    weighted = alpha.float().abs() * fx_norm.float()[:, :, None, :] * keys
    total = weighted.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, weighted / torch.where(total > 0, total, 1.0), 0.0)


def _layer_weights(weighting: str, alpha: torch.Tensor, fx_norm: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if weighting == "norm":
        return norm_weighted_rows(alpha, fx_norm, mask)
    return alpha.float()


def _check_width(width: int, length: int | None) -> None:
    if length is not None and width != length:
        raise ValueError(f"all batches must have the same width L; got {width} after {length}")


def norm_weighted_attention(
    model: torch.nn.Module,
    batches: Iterable[Mapping[str, torch.Tensor]],
    progress: bool = True,
    source: str = "unspecified",
    total: int | None = None,
):
    """Constant matrices from norm-weighted attention: PAPA's Eq. 2 average applied to ``norm_weighted_rows``.

    For every example and head, ``w_ij = alpha_ij ||f^h(x_j)||`` is row-normalised over the real keys
    (:func:`norm_weighted_rows`); entry (q, k) of the result is the mean of ``w_qk`` over the examples in which both q
    and k are real, exactly like :func:`papa_lib.averaging.average_attention` (same ``counts``; entries no example
    covers are 0).  Where ``||f(x)||`` is the same for every token the result equals the plain average.  A constant
    matrix built this way puts its mass where a head's output comes from rather than where its weights are: a head that
    gives large weight to [SEP] but reads a short vector there (Kobayashi Sec. 4.2) gets a matrix that mostly averages
    the other tokens.  Beyond both papers; compared with plain averages in the book's "Norm-based analysis" chapter.

    Args:
        model: an encoder of a supported ``model_type`` in eval mode with eager attention.
        batches: iterable of encoded batches (``input_ids``, ``attention_mask``, optionally ``token_type_ids``), all
            of width L.
        progress: show a progress bar.
        source: where the text came from (stored in the metadata).
        total: number of batches, for the progress bar only.

    Returns:
        A :class:`papa_lib.averaging.ConstantAttention` with ``metadata['kind'] == 'norm_average'``.

    Memory does not grow with the corpus: one float64 ``[H, L, L]`` running sum per layer and one ``[L, L]`` count.
    """
    from tqdm.auto import tqdm

    from .averaging import PadAwareAverage

    average = PadAwareAverage(len(encoder_layers(model)), attention_projections(model, 0).num_heads, kind="norm_average")
    for batch in tqdm(batches, total=total, disable=not progress, desc="norm-weighted averaging", unit="batch"):
        inputs = _prepare_batch(model, batch)
        mask = inputs["attention_mask"]
        per_layer = ((layer, norm_weighted_rows(alpha, fx_norm, mask)) for layer, alpha, fx_norm in _iter_alpha_and_fx_norms(model, inputs))
        average.add(per_layer, mask, getattr(batch, "layout", None))
    return average.result(model, source)


def input_dependence_scores(
    model: torch.nn.Module,
    batches: Iterable[Mapping[str, torch.Tensor]],
    weighting: str = "attention",
    progress: bool = True,
) -> torch.Tensor:
    """A label-free score of how input-dependent each head's attention is (low = replaced first).

    For head h and every entry (q, k) let ``a_b`` be its value in example b (``alpha_qk`` for ``weighting="attention"``,
    the norm-weighted ``w_qk`` of :func:`norm_weighted_rows` for ``"norm"``), taken over the examples in which both q
    and k are real, and ``m_qk`` the mean of those values — the head's constant matrix (PAPA Eq. 2, or
    :func:`norm_weighted_attention`).  The score is the pooled within-entry variance

        score_h = sum_{q,k} sum_b (a_b - m_qk)^2 / sum_{q,k} n_qk

    i.e. the mean squared error, per real (query, key) entry of the corpus, that replacing the head's attention by
    its constant matrix makes.  A head with score 0 already is constant on this corpus.  Ranking heads by this score
    needs no labels and no training, unlike PAPA's λ (Sec. 3.2); ``papa_lib.experiments`` uses it as the orders
    ``attention_variance`` and ``norm_variance`` (beyond the paper).

    Computed streaming with Chan et al.'s pairwise update of per-entry counts, means and sums of squared deviations
    (float64), so memory is ``3 * layers * H * L * L`` values whatever the corpus size.

    Returns:
        float64 tensor ``[layers, heads]``.
    """
    from tqdm.auto import tqdm

    if weighting not in INPUT_DEPENDENCE_WEIGHTINGS:
        raise ValueError(f"unknown weighting {weighting!r}; choose one of {INPUT_DEPENDENCE_WEIGHTINGS}")
    layers = len(encoder_layers(model))
    heads = attention_projections(model, 0).num_heads
    means: list[torch.Tensor] = []
    squares: list[torch.Tensor] = []
    counts = None
    length = None
    for batch in tqdm(batches, disable=not progress, desc=f"{weighting} input dependence", unit="batch"):
        inputs = _prepare_batch(model, batch)
        width = int(inputs["input_ids"].shape[1])
        _check_width(width, length)
        if length is None:
            length = width
            device = inputs["input_ids"].device
            means = [torch.zeros(heads, width, width, dtype=torch.float64, device=device) for _ in range(layers)]
            squares = [torch.zeros_like(m) for m in means]
            counts = torch.zeros(width, width, dtype=torch.float64, device=device)
        mask = inputs["attention_mask"]
        pair = pair_mask(mask)
        batch_counts = pair.sum(0).double()  # [L, L]
        seen = batch_counts > 0
        merged = counts + batch_counts
        for layer, alpha, fx_norm in _iter_alpha_and_fx_norms(model, inputs):
            values = _layer_weights(weighting, alpha, fx_norm, mask)  # [B, H, L, L]
            batch_mean = torch.einsum("bhqk,bqk->hqk", values, pair).double() / batch_counts.clamp_min(1)
            deviation = (values - batch_mean.float()[None]) * pair[:, None]
            batch_squares = deviation.pow(2).sum(0).double()
            delta = batch_mean - means[layer]
            gain = torch.where(seen, batch_counts / merged.clamp_min(1), 0.0)
            means[layer] = torch.where(seen, means[layer] + delta * gain, means[layer])
            squares[layer] = squares[layer] + torch.where(seen, batch_squares + delta.pow(2) * counts * gain, 0.0)
        counts = merged
    if length is None:
        raise ValueError("input_dependence_scores got an empty corpus: no batches")
    total = counts.sum()
    if total <= 0:
        raise ValueError("input_dependence_scores: the batches have no real tokens")
    return torch.stack([s.sum(dim=(-1, -2)) for s in squares]).cpu() / float(total)


def matrix_total_variation(first, second) -> pd.DataFrame:
    """Per-head total-variation distance between two sets of constant matrices (e.g. norm-weighted vs plain).

    Each entry of a constant matrix is averaged over its own set of examples (pad-aware), so a row need not sum to
    exactly 1; like the override, which renormalises a row over the real keys of each input, every row is first
    renormalised to sum to 1.  Then ``TV_q = 0.5 * sum_k |P1_qk - P2_qk|`` is in [0, 1] (0: same row, 1: disjoint
    support), and rows are averaged with weight ``counts[q, q]`` (how many examples had q as a real token), so rows
    that real inputs use count more.  Both arguments are :class:`papa_lib.averaging.ConstantAttention` of the same
    shape.

    Columns: layer, head, total_variation.
    """
    if tuple(first.matrices.shape) != tuple(second.matrices.shape):
        raise ValueError(
            f"matrices differ in shape: {tuple(first.matrices.shape)} vs {tuple(second.matrices.shape)}"
        )
    weights = torch.diagonal(first.counts.to(torch.float64)).clamp_min(0)
    if float(weights.sum()) <= 0:
        raise ValueError("the constant matrices cover no query position (all counts are 0)")
    def rows(matrices):
        matrices = matrices.double().clamp_min(0)
        total = matrices.sum(-1, keepdim=True)
        return torch.where(total > 0, matrices / torch.where(total > 0, total, 1.0), 0.0)

    row_tv = 0.5 * (rows(first.matrices) - rows(second.matrices)).abs().sum(-1)  # [Ly, H, L]
    tv = (row_tv * weights).sum(-1) / weights.sum()
    layer, head = np.meshgrid(np.arange(tv.shape[0]), np.arange(tv.shape[1]), indexing="ij")
    return pd.DataFrame({"layer": layer.ravel(), "head": head.ravel(), "total_variation": tv.numpy().ravel()})


# ----------------------------------------------------------------------------------------------------------------------
# The norm-aware PAPA grid (run by papa_lib.experiments.run_grid)
# ----------------------------------------------------------------------------------------------------------------------

#: Where each profile keeps the norm-aware grid's results (relative to the repository root).
NORM_RESULT_FOLDERS = {"smoke": "runs/smoke/norms", "local": "data/results/norms-minilm", "paper": "data/results/norms-paper"}
#: Head orders and constant matrices the norm-aware grid compares with PAPA's λ order and plain averages.
NORM_AWARE_ORDERS: tuple[str, ...] = ("attention_variance", "norm_variance")
NORM_AWARE_FRACTIONS: tuple[float, ...] = (0.5, 0.125, 0.0625)


def norm_aware_blocks(
    label_free_tasks: Iterable[str] = ("sst2", "mnli"),
    matrix_tasks: Iterable[str] = ("sst2", "cola", "mnli", "ner", "pos"),
    fractions: Iterable[float] = NORM_AWARE_FRACTIONS,
    with_reference: bool = False,
) -> list:
    """Grid blocks (:class:`papa_lib.experiments.GridBlock`) of the norm-aware PAPA experiments.

    * ``label_free``: the label-free orders :data:`NORM_AWARE_ORDERS` (:func:`input_dependence_scores`) with plain
      average matrices at ``fractions`` of input-dependent heads, on ``label_free_tasks``;
    * ``norm_matrices``: every head replaced (fraction 0) by :func:`norm_weighted_attention` matrices, on
      ``matrix_tasks``.

    What they are compared with — the λ order at the same fractions, the original model (fraction 1) and plain
    averages at fraction 0 — is part of the main grid (blocks fig2 and table1).  ``with_reference=True`` adds those
    runs as blocks ``reference_lambda`` and ``reference_average``, for a self-contained grid (the smoke profile).
    """
    from .experiments import GridBlock

    label_free_tasks, matrix_tasks, fractions = list(label_free_tasks), list(matrix_tasks), [float(f) for f in fractions]
    blocks = []
    if label_free_tasks:
        blocks.append(GridBlock("label_free", label_free_tasks, ["average"], list(NORM_AWARE_ORDERS), fractions))
    if matrix_tasks:
        blocks.append(GridBlock("norm_matrices", matrix_tasks, ["norm_average"], ["lambda"], [0.0]))
    if with_reference:
        if label_free_tasks:
            blocks.append(GridBlock("reference_lambda", label_free_tasks, ["average"], ["lambda"], [1.0, *fractions, 0.0]))
        if matrix_tasks:
            blocks.append(GridBlock("reference_average", matrix_tasks, ["average"], ["lambda"], [1.0, 0.0]))
    return blocks


def norm_aware_grid(reference_spec: Mapping, **block_options) -> dict:
    """A grid spec with ``reference_spec``'s top-level settings (model, data, seeds, sizes, epochs...) and the
    :func:`norm_aware_blocks` (``block_options`` are passed on).  Identical settings give identical run ids, so the
    λ-order and plain-average rows of the reference grid's results are directly comparable."""
    spec = {key: value for key, value in reference_spec.items() if key != "blocks"}
    spec["blocks"] = norm_aware_blocks(**block_options)
    return spec


# ----------------------------------------------------------------------------------------------------------------------
# The chapter's corpus analyses, end to end (WikiText, Kobayashi Sec. 4)
# ----------------------------------------------------------------------------------------------------------------------

#: The CSV files written by :func:`run_analyses` (name -> what it holds).
ANALYSIS_FILES = {
    "fx_norm_variation": "coefficient of variation of ||f(x)|| per head (Sec. 4.1)",
    "attention_share": "weight-based vs norm-based share of attention per layer and token category (Sec. 4.2, Fig. 3)",
    "attention_share_per_head": "the same per head",
    "sep_correlation": "correlation between the weight given to [SEP] and ||f([SEP])|| per head (Sec. 4.2, Fig. 4)",
    "sep_observations": "a sample of [SEP] observations (alpha to [SEP], ||f([SEP])||) per head, for scatter plots",
    "cls_correlation": "the same correlation for [CLS] (one per sequence)",
    "cls_observations": "a sample of [CLS] observations per head",
    "fx_norm_by_category": "mean ||f(x)|| per layer, head and token category (Sec. 4.2)",
    "frequency_correlation": "Spearman correlation between frequency rank and ||f(x)|| per layer, for token types seen "
                             "at least min_count times (Sec. 4.3, Fig. 5)",
    "token_frequency": "frequent token types with their rank and mean ||f(x)|| per layer (Sec. 4.3, Fig. 5)",
}


def wikitext_pairs(tokenizer, data_dir, n_sequences: int, max_length: int = 128, layout: str = "standard",
                   split: str = "validation"):
    """Kobayashi's inputs ``[CLS] paragraph [SEP] next paragraph [SEP]`` from WikiText, encoded with
    :func:`papa_lib.encode`: consecutive article lines (headings dropped) are paired, the first ``n_sequences`` pairs
    are kept.  ``layout="standard"`` is the ordinary BERT input the model was pretrained on (PAPA's fixed-position
    layout is for constant matrices and is not needed here).  The WikiText token-file conventions are undone first
    (``<unk>`` becomes the tokenizer's unknown token, `` @-@ `` a hyphen, `` @,@ ``/`` @.@ `` digit separators), so that
    they do not turn into frequent sub-word junk (``<``, ``un``, ``##k``, ``>``, ``@``) in the frequency analysis.
    Returns ``(EncodedBatch, source description)``.
    """
    from .layout import encode
    from .tasks import load_wikitext

    if n_sequences < 1:
        raise ValueError(f"n_sequences must be >= 1, got {n_sequences}")
    lines = [_detokenize_wikitext(line, tokenizer) for line in load_wikitext(split, data_dir=data_dir, name="wikitext-2")]
    pairs = len(lines) // 2
    if pairs == 0:
        raise ValueError(f"WikiText {split} in {data_dir} has fewer than two article lines")
    n = min(n_sequences, pairs)
    first, second = lines[0 : 2 * n : 2], lines[1 : 2 * n : 2]
    encoded = encode(tokenizer, first, second, max_length=max_length, layout=layout)
    where = "the hub" if data_dir is None else str(data_dir)
    return encoded, f"WikiText-2 {split} ({where}): {n} pairs of consecutive paragraphs, L={max_length}, {layout} layout"


_WIKITEXT_MARKUP = ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."))


def _detokenize_wikitext(line: str, tokenizer) -> str:
    for marker, text in _WIKITEXT_MARKUP:
        line = line.replace(marker, text)
    unknown = getattr(tokenizer, "unk_token", None) or ""
    return line.replace("<unk>", unknown)


def run_analyses(
    model: torch.nn.Module,
    tokenizer,
    data_dir,
    out_dir,
    n_sequences: int = 300,
    max_length: int = 128,
    *,
    batch_size: int = 16,
    bootstrap_replicates: int = 200,
    max_sep_per_head: int = 150,
    min_token_count: int = 3,
    frequency_min_counts: Iterable[int] = (1, 5, 25),
    layout: str = "standard",
    seed: int = 0,
    progress: bool = False,
) -> dict[str, pd.DataFrame]:
    """Kobayashi et al.'s four corpus analyses on WikiText-2, saved as tidy CSVs (one per :data:`ANALYSIS_FILES`).

    Streams :func:`corpus_norm_statistics` over :func:`wikitext_pairs` and writes ``out_dir/<name>.csv`` plus
    ``out_dir/metadata.json`` (model, data, sizes, seconds).  ``out_dir=None`` writes nothing.  Returns the tables.
    The correlations use every [SEP]/[CLS] occurrence (up to the 20,000 of ``corpus_norm_statistics``' reservoir); the
    saved ``sep_observations``/``cls_observations`` keep at most ``max_sep_per_head`` of them per head (for plots);
    ``token_frequency`` lists the
    types seen at least ``min_token_count`` times; ``frequency_correlation`` is computed over the types seen at least
    ``m`` times for each ``m`` in ``frequency_min_counts`` (column ``min_count``; 1 = every type, as in Sec. 4.3; a
    type's mean norm is noisy when it was seen once).
    """
    import json
    import time
    from pathlib import Path

    from tqdm.auto import tqdm

    from .layout import batched
    from .models import model_id

    started = time.time()
    encoded, source = wikitext_pairs(tokenizer, data_dir, n_sequences, max_length, layout)
    batches = tqdm(batched(encoded, batch_size), total=math.ceil(encoded.batch_size / batch_size), disable=not progress,
                   desc="norm statistics", unit="batch")
    stats = corpus_norm_statistics(model, batches, tokenizer, bootstrap_replicates=bootstrap_replicates, seed=seed)
    def sample(token):
        observations = sep_observations(stats, token=token)
        return observations[observations["observation"] < max_sep_per_head].reset_index(drop=True)

    frequency = pd.concat(
        [frequency_norm_correlation(stats, min_count=int(m)).assign(min_count=int(m)) for m in frequency_min_counts],
        ignore_index=True,
    )
    tables = {
        "fx_norm_variation": fx_norm_variation(stats),
        "attention_share": attention_share_by_category(stats),
        "attention_share_per_head": attention_share_by_category(stats, per_head=True),
        "sep_correlation": sep_weight_norm_correlation(stats),
        "sep_observations": sample("sep"),
        "cls_correlation": sep_weight_norm_correlation(stats, token="cls"),
        "cls_observations": sample("cls"),
        "fx_norm_by_category": fx_norm_by_category(stats),
        "frequency_correlation": frequency[["min_count", *[c for c in frequency.columns if c != "min_count"]]],
        "token_frequency": token_frequency_table(stats, min_count=min_token_count),
    }
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for name, table in tables.items():
            table.to_csv(out / f"{name}.csv", index=False, float_format="%.6g")
        metadata = {
            "model": model_id(model),
            "data": source,
            "n_sequences": int(encoded.batch_size),
            "n_tokens": int(stats.num_tokens),
            "max_length": max_length,
            "layout": layout,
            "bootstrap_replicates": bootstrap_replicates,
            "sep_observations_seen": int(stats.sep_observations_seen),
            "cls_observations_seen": int(stats.cls_observations_seen),
            "seed": seed,
            "seconds": round(time.time() - started, 1),
            "files": ANALYSIS_FILES,
        }
        (out / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n")
    return tables


def read_analyses(folder) -> dict[str, pd.DataFrame]:
    """The tables written by :func:`run_analyses` (and ``metadata`` as a dict under key ``"metadata"``)."""
    import json
    from pathlib import Path

    folder = Path(folder)
    missing = [name for name in ANALYSIS_FILES if not (folder / f"{name}.csv").exists()]
    if missing:
        raise FileNotFoundError(f"{folder} lacks the analysis tables {missing}; run papa_lib.norms.run_analyses first")
    tables = {name: pd.read_csv(folder / f"{name}.csv", keep_default_na=False, na_values=[""])
              for name in ANALYSIS_FILES}
    meta = folder / "metadata.json"
    tables["metadata"] = json.loads(meta.read_text()) if meta.exists() else {}
    return tables


# ----------------------------------------------------------------------------------------------------------------------
# What the book chapter shows: the exactness check, head-level relations, and the norm-aware grid's tables
# ----------------------------------------------------------------------------------------------------------------------


def decomposition_check(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> pd.DataFrame:
    """Check Kobayashi's Eq. 5-7 on one batch: ``sum_h sum_j alpha_ij f^h(x_j) + b_O`` against the model's own output.

    The attention output projection of every layer is hooked while the model runs; its output (before dropout,
    residual and LayerNorm) is compared with the rebuilt sum over the real query positions.
    Columns: layer, n_positions, max_abs_error, max_abs_output, relative_error (= max_abs_error / max_abs_output).
    """
    layers = encoder_layers(model)
    inputs = _prepare_batch(model, batch)
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


def head_level_correlation(correlation_table: pd.DataFrame, token: str = "sep", confidence: float = 0.95) -> dict:
    """Across heads: Spearman correlation between the mean weight a head gives ``token`` and its mean
    ``||f(token)||`` (Kobayashi Sec. 4.2, "Evidence 2": heads that attend much to [SEP] read a short vector there).

    ``correlation_table`` is :func:`sep_weight_norm_correlation`'s output (or the saved CSV).  Returns a dict with
    n_heads, spearman_rho, spearman_p, ci_low, ci_high (Fisher z with variance 1.06/(n-3)).
    """
    x_name, y_name = f"mean_alpha_to_{token}", f"mean_fx_norm_{token}"
    if x_name not in correlation_table or y_name not in correlation_table:
        raise ValueError(f"the table has no columns {x_name!r} and {y_name!r}; pass the {token} correlation table")
    part = correlation_table[[x_name, y_name]].dropna()
    _, _, rho, p = _correlations(part[x_name].to_numpy(float), part[y_name].to_numpy(float))
    low, high = _fisher_interval(rho, len(part), confidence, 1.06)
    return {"n_heads": len(part), "spearman_rho": rho, "spearman_p": p, "ci_low": low, "ci_high": high}


def find_constant_matrices(results_dir, task: str, kind: str = "average"):
    """The constant matrices the experiments saved under ``results_dir/matrices`` for ``task`` (built from that task's
    own training text), or ``None`` when there are none.  ``kind``: "average" or "norm_average".  When several
    files match (different settings), the most recently written one is returned."""
    from pathlib import Path

    from .averaging import ConstantAttention

    if kind not in ("average", "norm_average"):
        raise ValueError(f"kind must be 'average' or 'norm_average', got {kind!r}")
    folder = Path(results_dir) / "matrices"
    prefix = task if kind == "average" else f"{task}-{kind}"
    files = sorted(folder.glob(f"{prefix}-L*.safetensors"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
    return ConstantAttention.load(files[-1]) if files else None


def norm_results_folder(setup, results_dir=None):
    """The norm-aware grid's results folder of a :class:`papa_lib.profiles.Setup` (:data:`NORM_RESULT_FOLDERS`)."""
    from pathlib import Path

    folder = Path(results_dir) if results_dir else Path(NORM_RESULT_FOLDERS[setup.profile])
    return folder if folder.is_absolute() else setup.root / folder


def norm_aware_results(setup, tasks: Iterable[str], ranking_tasks: Iterable[str], run_missing: bool = False,
                       results_dir=None, progress: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(norm_frame, reference_frame)``: the norm-aware grid's records and the records they are compared with.

    With ``run_missing``, first runs what :func:`norm_aware_grid` (with the profile's grid settings, ``ranking_tasks``
    for the label-free orders, ``tasks`` for norm-weighted matrices) still lacks.  The smoke profile's grid is
    self-contained (``with_reference=True``, one folder); other profiles compare with the profile's main results
    (blocks fig2 and table1, also run when ``run_missing``).
    """
    from .experiments import run_grid
    from .results import ResultsStore

    folder = norm_results_folder(setup, results_dir)
    self_contained = setup.profile == "smoke"
    if run_missing:
        spec = norm_aware_grid(setup.grid(), label_free_tasks=list(ranking_tasks), matrix_tasks=list(tasks),
                               with_reference=self_contained)
        overrides = {"data_dir": str(setup.data_dir) if setup.data_dir else None, "device": setup.device}
        if setup.profile != "smoke":
            overrides["model"] = setup.model_name
        model, tokenizer = setup.encoder()
        run_grid(spec, folder, model=model, tokenizer=tokenizer, progress=progress, overrides=overrides)
    norm_frame = ResultsStore(folder).frame() if (folder / "results.csv").exists() else _empty_frame()
    if self_contained:
        return norm_frame, norm_frame
    reference = setup.results(run_missing=run_missing, blocks=["fig2", "table1"], progress=progress)
    return norm_frame, reference


def _empty_frame() -> pd.DataFrame:
    from .results import RECORD_FIELDS

    return pd.DataFrame({c: pd.Series(dtype="float64" if c in ("fraction", "value") else "object") for c in RECORD_FIELDS})


def _own_matrices(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows whose matrices (if any) come from the task's own training text (Table 2's cross-task rows excluded)."""
    if frame.empty:
        return frame
    own = frame["matrices_from"].isna() | (frame["matrices_from"] == frame["task"])
    return frame[own]


def label_free_comparison(norm_frame: pd.DataFrame, reference: pd.DataFrame, tasks: Iterable[str],
                          orders: Iterable[str] = ("lambda", *NORM_AWARE_ORDERS)) -> pd.DataFrame:
    """Score vs fraction of input-dependent heads for each head order, mean over seeds with a 95% CI.

    Plain-average matrices only.  The λ order and the shared end points come from ``reference`` (fraction 1: the
    original model; fraction 0: every head constant, which no order changes); the label-free orders from
    ``norm_frame``.  The end points are repeated for every order so that each curve is complete.
    Columns: task, order, fraction, mean, ci_low, ci_high, n, source ("norm grid" / "main grid" / "shared").
    """
    from .results import summarize

    tasks, orders = list(tasks), list(orders)
    pieces = []
    for frame, source, wanted in ((reference, "main grid", ["lambda"]), (norm_frame, "norm grid", list(NORM_AWARE_ORDERS))):
        part = _own_matrices(frame)
        if part.empty:
            continue
        part = part[part["task"].isin(tasks) & (part["matrix_type"] == "average")
                    & part["selection_order"].isin([o for o in wanted if o in orders]) & part["fraction"].between(0, 1, inclusive="neither")]
        if not part.empty:
            pieces.append(summarize(part.rename(columns={"selection_order": "order"}), ["task", "order", "fraction"]).assign(source=source))
    ends = []
    reference_own = _own_matrices(reference)
    if not reference_own.empty:
        original = reference_own[reference_own["task"].isin(tasks) & (reference_own["matrix_type"] == "original")]
        constant = reference_own[reference_own["task"].isin(tasks) & (reference_own["matrix_type"] == "average")
                                 & (reference_own["fraction"] == 0)]
        for part in (original, constant):
            if not part.empty:
                summary = summarize(part, ["task", "fraction"])
                ends.extend(summary.assign(order=order, source="shared") for order in orders)
    columns = ["task", "order", "fraction", "mean", "ci_low", "ci_high", "n", "source"]
    if not pieces and not ends:
        return pd.DataFrame(columns=columns)
    table = pd.concat([*pieces, *ends], ignore_index=True)[columns]
    return table.sort_values(["task", "order", "fraction"], ignore_index=True)


def matrix_comparison(norm_frame: pd.DataFrame, reference: pd.DataFrame, tasks: Iterable[str]) -> pd.DataFrame:
    """Every head replaced (fraction 0) by norm-weighted vs plain average matrices, and the original model.

    Columns: task, matrix_type ("original", "average", "norm_average"), mean, ci_low, ci_high, n.
    """
    from .results import summarize

    tasks = list(tasks)
    frames = [f for f in (_own_matrices(reference), _own_matrices(norm_frame)) if not f.empty]
    columns = ["task", "matrix_type", "mean", "ci_low", "ci_high", "n"]
    if not frames:
        return pd.DataFrame(columns=columns)
    data = pd.concat(frames, ignore_index=True).drop_duplicates("run_id")
    keep = data["task"].isin(tasks) & (
        (data["matrix_type"] == "original")
        | (data["matrix_type"].isin(["average", "norm_average"]) & (data["fraction"] == 0))
    )
    data = data[keep]
    if data.empty:
        return pd.DataFrame(columns=columns)
    return summarize(data, ["task", "matrix_type"])[columns]


def sentence_shares(model: torch.nn.Module, tokenizer, text: str, max_length: int = 64) -> pd.DataFrame:
    """Where one sentence's attention looks (weights) vs where its output comes from (norms), per layer and token.

    For every layer, key token j gets ``mean over heads and real queries i`` of its row share
    ``alpha_ij / sum_k alpha_ik`` (method "weight") and ``||alpha_ij f^h(x_j)|| / sum_k ||alpha_ik f^h(x_k)||``
    (method "norm") — Kobayashi's Fig. 3 for a single input.  The text is encoded in the standard layout.
    Columns: layer, position, token, category, method, share.
    """
    from .layout import encode

    batch = encode(tokenizer, [text], max_length=max_length, layout="standard")
    real = batch["attention_mask"][0].bool()
    n = int(real.sum())
    ids = batch["input_ids"][0, :n]
    tokens = tokenizer.convert_ids_to_tokens(ids.tolist())
    categories = [CATEGORY_NAMES[int(c)] for c in TokenCategorizer(tokenizer, model.config.vocab_size)(ids)]
    rows = []
    for layer_norms in attention_norms(model, batch):
        for method, contribution in (("weight", layer_norms.alpha), ("norm", layer_norms.afx_norm)):
            part = contribution[0, :, :n, :n].double()  # real queries and keys only
            shares = (part / part.sum(-1, keepdim=True)).mean(dim=(0, 1))  # [n]
            rows.extend({"layer": layer_norms.layer, "position": j, "token": tokens[j], "category": categories[j],
                         "method": method, "share": float(shares[j])} for j in range(n))
    return pd.DataFrame(rows)


def missing_norm_runs(norm_frame: pd.DataFrame, reference: pd.DataFrame, tasks: Iterable[str],
                      ranking_tasks: Iterable[str], seeds: int) -> pd.DataFrame:
    """The runs the chapter compares that are not (or not for every seed) in the two results tables.

    Expected: the :func:`norm_aware_blocks` variants plus their references (λ order at the same fractions, the original
    model, plain averages at fraction 0).  Columns: task, matrix_type, selection_order, fraction, seeds_found, seeds.
    """
    from .experiments import grid_runs

    blocks = norm_aware_blocks(list(ranking_tasks), list(tasks), with_reference=True)
    frames = [f for f in (_own_matrices(norm_frame), _own_matrices(reference)) if not f.empty]
    data = pd.concat(frames, ignore_index=True).drop_duplicates("run_id") if frames else _empty_frame()
    rows = []
    for task, variants in grid_runs(blocks).items():
        for variant in variants:
            found = data[(data["task"] == task) & (data["matrix_type"] == variant.matrix_type)
                         & (data["selection_order"] == variant.selection_order)
                         & np.isclose(data["fraction"].astype(float), variant.fraction)]
            count = found["seed"].nunique() if not found.empty else 0
            if count < seeds:
                rows.append({"task": task, "matrix_type": variant.matrix_type, "selection_order": variant.selection_order,
                             "fraction": variant.fraction, "seeds_found": int(count), "seeds": int(seeds)})
    return pd.DataFrame(rows, columns=["task", "matrix_type", "selection_order", "fraction", "seeds_found", "seeds"])


def head_score_table(model: torch.nn.Module, tokenizer, spec: Mapping, tasks: Iterable[str], lambdas_dir=None,
                     progress: bool = False) -> pd.DataFrame:
    """Per head and task: the two label-free scores and, where available, PAPA's learned λ (Sec. 3.2).

    The scores are :func:`input_dependence_scores` on the task's training subset exactly as the grid ``spec``
    (:func:`papa_lib.experiments.load_grid` output or :func:`norm_aware_grid`) defines it — the scores the
    ``attention_variance``/``norm_variance`` runs used.  λ is read from ``lambdas_dir/<task>-from-<task>-*.pt``
    (written by the main grid; the newest file when several match); missing λ gives NaN.
    Columns: task, layer, head, lambda, attention_variance, norm_variance.
    """
    from pathlib import Path

    from .experiments import ExperimentConfig, TaskExperiment

    def per_task(value, task):
        return value.get(task, value.get("default")) if isinstance(value, Mapping) else value

    frames = []
    for task in tasks:
        config = ExperimentConfig(task=task, data_dir=spec.get("data_dir"), profile=spec.get("profile", "local"),
                                  limit=spec.get("limit"), max_length=per_task(spec.get("max_length"), task),
                                  device=str(next(model.parameters()).device))
        experiment = TaskExperiment(config, model, tokenizer, progress=progress)
        scores = {order: experiment.head_scores(order).numpy() for order in NORM_AWARE_ORDERS}
        layers, heads = scores[NORM_AWARE_ORDERS[0]].shape
        lambdas = np.full((layers, heads), np.nan)
        folder = Path(lambdas_dir) if lambdas_dir is not None else None
        files = sorted(folder.glob(f"{task}-from-{task}-*.pt"), key=lambda p: p.stat().st_mtime) if folder and folder.is_dir() else []
        if files:
            lambdas = torch.load(files[-1]).detach().to(torch.float64).cpu().numpy().reshape(layers, heads)
        layer, head = np.meshgrid(np.arange(layers), np.arange(heads), indexing="ij")
        frames.append(pd.DataFrame({"task": task, "layer": layer.ravel(), "head": head.ravel(), "lambda": lambdas.ravel(),
                                    **{order: value.ravel() for order, value in scores.items()}}))
    return pd.concat(frames, ignore_index=True)


def score_agreement(table: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """Spearman correlation between every pair of head scores of :func:`head_score_table`, per task.

    A high ρ between λ and a label-free score means both rank the heads alike (both replace low scores first).
    Columns: task, first, second, n_heads, spearman_rho, ci_low, ci_high (Fisher z, variance 1.06/(n-3)).
    """
    names = ["lambda", *NORM_AWARE_ORDERS]
    missing = [c for c in ("task", *names) if c not in table]
    if missing:
        raise ValueError(f"the head-score table lacks columns {missing}")
    rows = []
    for task, part in table.groupby("task", sort=False):
        for i, first in enumerate(names):
            for second in names[i + 1:]:
                pair = part[[first, second]].dropna()
                _, _, rho, _ = _correlations(pair[first].to_numpy(float), pair[second].to_numpy(float))
                low, high = _fisher_interval(rho, len(pair), confidence, 1.06)
                rows.append({"task": task, "first": first, "second": second, "n_heads": len(pair),
                             "spearman_rho": rho, "ci_low": low, "ci_high": high})
    return pd.DataFrame(rows, columns=["task", "first", "second", "n_heads", "spearman_rho", "ci_low", "ci_high"])
