"""Norm-aware PAPA (beyond both papers; the book's chapter "Norm-based analysis").

Two ideas from Kobayashi et al. (2020) applied to PAPA (Hassid et al. 2022):

* :func:`norm_weighted_attention` builds constant matrices like PAPA's Eq. 2 (Sec. 3.1, pad-aware per-entry means) from
  the row-normalised norm-weighted attention ``w_ij = alpha_ij ||f(x_j)|| / sum_k alpha_ik ||f(x_k)||``
  (:func:`norm_weighted_rows`; matrix type ``norm_average``);
* :func:`input_dependence_scores` ranks heads without labels by the pooled per-entry variance of ``alpha`` (or ``w``)
  across inputs — the mean squared error of replacing the head by its constant matrix — an alternative to PAPA's
  learned λ (Sec. 3.2) (head orders ``attention_variance`` and ``norm_variance``).

This module registers the ``norm_average`` builder and matrix type (:mod:`papa_lib.experiments.matrices`) and the
two label-free rankings (:mod:`papa_lib.experiments.rankings`); ``import papa_lib`` imports it, so
:func:`papa_lib.experiments.grid.run_grid` (and a Ray worker) always has them.
:func:`norm_aware_blocks`/:func:`norm_aware_grid`
declare the grid (``data/results/norms-minilm/grid.yaml``); :func:`matrix_total_variation` compares two sets of
constant matrices.  The chapter's tables come from :mod:`papa_lib.book.norms_pages`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd
import torch

from ..core.averaging import pair_mask
from ..experiments.matrices import register_matrix_type
from ..experiments.rankings import register_head_ranking
from .norms import attention_projections, encoder_layers, iter_alpha_and_fx_norms, prepare_batch

__all__ = [
    "INPUT_DEPENDENCE_WEIGHTINGS",
    "norm_weighted_rows",
    "norm_weighted_attention",
    "input_dependence_scores",
    "matrix_total_variation",
    "NORM_AWARE_ORDERS",
    "NORM_AWARE_FRACTIONS",
    "norm_aware_blocks",
    "norm_aware_grid",
]

INPUT_DEPENDENCE_WEIGHTINGS: tuple[str, ...] = ("attention", "norm")


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
        raise ValueError(
            f"attention_mask must be [B, L] = {(alpha.shape[0], alpha.shape[-1])}, got {tuple(attention_mask.shape)}"
        )
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
    and k are real, exactly like :func:`papa_lib.core.averaging.average_attention` (same ``counts``; entries no example
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
        A :class:`papa_lib.core.averaging.ConstantAttention` with ``metadata['kind'] == 'norm_average'``.

    Memory does not grow with the corpus: one float64 ``[H, L, L]`` running sum per layer and one ``[L, L]`` count.
    """
    from tqdm.auto import tqdm

    from ..core.averaging import PadAwareAverage

    average = PadAwareAverage(
        len(encoder_layers(model)), attention_projections(model, 0).num_heads, kind="norm_average"
    )
    for batch in tqdm(batches, total=total, disable=not progress, desc="norm-weighted averaging", unit="batch"):
        inputs = prepare_batch(model, batch)
        mask = inputs["attention_mask"]
        per_layer = (
            (layer, norm_weighted_rows(alpha, fx_norm, mask))
            for layer, alpha, fx_norm in iter_alpha_and_fx_norms(model, inputs)
        )
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
    needs no labels and no training, unlike PAPA's λ (Sec. 3.2); ``papa_lib.experiments.engine`` uses it as the orders
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
        inputs = prepare_batch(model, batch)
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
        for layer, alpha, fx_norm in iter_alpha_and_fx_norms(model, inputs):
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


def _label_free_scores(weighting: str):
    """A head ranking (:mod:`papa_lib.experiments.rankings`) from :func:`input_dependence_scores` on a seed's
    training text."""

    def scores(workspace, matrices_from, seed):
        from ..experiments import overrides, stages

        def compute():
            split = stages.split(workspace, "train")
            batches = stages.packed_batches(workspace.model, split.encoded, workspace.config.feature_batch_size,
                                            stages.seed_rows(workspace, seed), use_packing=False)
            return input_dependence_scores(workspace.model, batches, weighting=weighting,
                                           progress=workspace.progress)

        return overrides.cached_scores(workspace, f"{weighting}-variance-{seed}", compute)

    return scores


# Beyond the paper: norm-weighted constant matrices and label-free head rankings, registered with the engine.
register_matrix_type("norm_average", "constant", builder=norm_weighted_attention, label="Norm-weighted average")
register_head_ranking("attention_variance", _label_free_scores("attention"), label="attention variance (label-free)",
                      replaced_first="smallest attention variance first")
register_head_ranking("norm_variance", _label_free_scores("norm"), label="norm-weighted variance (label-free)",
                      replaced_first="smallest norm-weighted variance first")


def matrix_total_variation(first, second) -> pd.DataFrame:
    """Per-head total-variation distance between two sets of constant matrices (e.g. norm-weighted vs plain).

    Each entry of a constant matrix is averaged over its own set of examples (pad-aware), so a row need not sum to
    exactly 1; like the override, which renormalises a row over the real keys of each input, every row is first
    renormalised to sum to 1.  Then ``TV_q = 0.5 * sum_k |P1_qk - P2_qk|`` is in [0, 1] (0: same row, 1: disjoint
    support), and rows are averaged with weight ``counts[q, q]`` (how many examples had q as a real token), so rows
    that real inputs use count more.  Both arguments are :class:`papa_lib.core.averaging.ConstantAttention` of the same
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
# The norm-aware PAPA grid (run by papa_lib.experiments.grid.run_grid)
# ----------------------------------------------------------------------------------------------------------------------


#: Head orders and constant matrices the norm-aware grid compares with PAPA's λ order and plain averages.
NORM_AWARE_ORDERS: tuple[str, ...] = ("attention_variance", "norm_variance")
NORM_AWARE_FRACTIONS: tuple[float, ...] = (0.5, 0.125, 0.0625)


def norm_aware_blocks(
    label_free_tasks: Iterable[str] = ("sst2", "mnli"),
    matrix_tasks: Iterable[str] = ("sst2", "cola", "mnli", "ner", "pos"),
    fractions: Iterable[float] = NORM_AWARE_FRACTIONS,
    with_reference: bool = False,
) -> list:
    """Grid blocks (:class:`papa_lib.experiments.grid.GridBlock`) of the norm-aware PAPA experiments.

    * ``label_free``: the label-free orders :data:`NORM_AWARE_ORDERS` (:func:`input_dependence_scores`) with plain
      average matrices at ``fractions`` of input-dependent heads, on ``label_free_tasks``;
    * ``norm_matrices``: every head replaced (fraction 0) by :func:`norm_weighted_attention` matrices, on
      ``matrix_tasks``.

    What they are compared with — the λ order at the same fractions, the original model (fraction 1) and plain
    averages at fraction 0 — is part of the main grid (blocks fig2 and table1).  ``with_reference=True`` adds those
    runs as blocks ``reference_lambda`` and ``reference_average``, for a self-contained grid (the smoke profile).
    """
    from ..experiments.grid import GridBlock

    label_free_tasks, matrix_tasks, fractions = (
        list(label_free_tasks),
        list(matrix_tasks),
        [float(f) for f in fractions],
    )
    blocks = []
    if label_free_tasks:
        blocks.append(GridBlock("label_free", label_free_tasks, ["average"], list(NORM_AWARE_ORDERS), fractions))
    if matrix_tasks:
        blocks.append(GridBlock("norm_matrices", matrix_tasks, ["norm_average"], ["lambda"], [0.0]))
    if with_reference:
        if label_free_tasks:
            blocks.append(
                GridBlock("reference_lambda", label_free_tasks, ["average"], ["lambda"], [1.0, *fractions, 0.0])
            )
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
