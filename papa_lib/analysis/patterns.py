"""What attention heads do, measured: input-dependence, patterns of the constant matrices, λ and head orders.

The book's chapters on attention (paper Sec. 2, Eq. 1), averaging (Sec. 3.1 Eq. 2, Sec. 5.1) and head selection
(Sec. 3.2 Eq. 3, Sec. 5.4) compute their numbers here, so that every statistic has one tested definition.

Input-dependence (Sec. 2)
    :func:`input_distance` and :func:`input_variability` measure how far a head's attention on each input is from a
    constant matrix — by default the head's own pad-aware average over the same inputs (:func:`pad_aware_mean`, Eq. 2),
    restricted to each input's real tokens and row-normalised exactly as PAPA uses it (:func:`restrict_to_input`,
    footnote 8). The distance of one query row is the total-variation distance ½ Σ_k |A[q, k] - C[q, k]|: the share
    of the row's attention mass that sits elsewhere than in the constant row (0 = same row, 1 = disjoint).

Patterns of the constant matrices (Sec. 5.1)
    The paper reports by inspection that about 90% of RoBERTa-base's constant matrices on SST-2 show a diagonal
    pattern and that about 40% of the heads put most of their mass on [CLS] and/or [SEP]. We make both counts
    computable (:func:`pattern_summary`, :func:`pattern_shares`; a head's weight on one key position or on itself:
    :func:`column_mass`, :func:`self_mass`). All statistics are taken over the *word* query
    rows of C (rows of special positions excluded), each row weighted by how many corpus inputs had that position as
    a real token (``counts[q, q]``), each row first normalised to sum 1:

    * ``diagonal_rows`` — share of rows whose largest entry among the non-special keys lies in the band
      ``|q - k| <= width``. A head is **diagonal** when ``diagonal_rows >= 0.5``: for most word tokens the position
      itself or a neighbour is the favourite key. A head that spread its mass evenly over n ≈ 20 keys would reach
      about 3/n ≈ 0.15, so 0.5 is far above chance, and unlike a mass threshold it does not depend on how much mass
      the head parks on [CLS]/[SEP] at the same time (the paper: "perhaps in combination with the diagonal pattern").
    * ``diagonal_mass`` — the mass inside that band (non-special keys); an alternative criterion, shown for
      sensitivity.
    * ``special_mass`` — the mass on the special positions (default [CLS] at 0 and the final [SEP] at L-1 of the
      App. A layout; add L/2 for pairs). A head is **[CLS]/[SEP]** when ``special_mass > 0.5`` ("most of their
      weight mass").

λ and head orders (Sec. 3.2, 5.4)
    :func:`lambda_frame` tabulates the learned λ saved by :func:`papa_lib.experiments.engine.learn_lambdas` (read
    with :func:`papa_lib.experiments.workspace.read_lambdas`) with each head's rank in the λ order;
    :func:`kept_until` turns λ into the fraction of input-dependent heads down to which each head survives;
    :func:`order_curves` and :func:`compare_orders` put the Fig. 5 runs of a results table into curves and rank them.

Heat-map tables
    :func:`packed_heatmaps` stores many attention matrices compactly (one row per matrix, values in thousandths);
    :func:`papa_lib.book.charts.heatmap_chart` draws the ones chosen with dropdowns, flattening them in the browser,
    so that a gallery of every head stays a few hundred kilobytes inside the page. Nothing here draws.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from ..core.averaging import PadAwareAverage
from ..experiments import selection

__all__ = [
    "DIAGONAL_THRESHOLD",
    "SPECIAL_THRESHOLD",
    "column_mass",
    "compare_orders",
    "diagonal_stats",
    "input_distance",
    "input_variability",
    "kept_until",
    "lambda_frame",
    "order_curves",
    "packed_heatmaps",
    "pad_aware_mean",
    "pattern_shares",
    "pattern_summary",
    "position_labels",
    "restrict_to_input",
    "self_mass",
    "special_mass",
]

#: A head is "diagonal" when at least this share of its word rows has its favourite non-special key in the band.
DIAGONAL_THRESHOLD = 0.5
#: A head is a "[CLS]/[SEP] head" when more than this share of its mass sits on the special positions.
SPECIAL_THRESHOLD = 0.5

# ------------------------------------------------------------------------------------------------------------------
# Input-dependence (Sec. 2, Eq. 1)
# ------------------------------------------------------------------------------------------------------------------


def _check_attentions(attentions: torch.Tensor, masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate ``attentions [N, *heads, L, L]`` and ``masks [N, L]``; return float64 attentions and a bool mask."""
    attentions = torch.as_tensor(attentions).detach()
    masks = torch.as_tensor(masks).detach()
    if attentions.dim() < 3 or attentions.shape[-1] != attentions.shape[-2]:
        raise ValueError(f"attentions must have shape [N, ..., L, L], got {tuple(attentions.shape)}")
    if masks.dim() != 2 or masks.shape[0] != attentions.shape[0] or masks.shape[1] != attentions.shape[-1]:
        raise ValueError(
            f"masks must have shape [N={attentions.shape[0]}, L={attentions.shape[-1]}], got {tuple(masks.shape)}"
        )
    if attentions.shape[0] == 0:
        raise ValueError("no inputs: attentions has N = 0")
    real = masks.bool()
    if not bool(real.any(dim=1).all()):
        empty = (~real.any(dim=1)).nonzero().flatten().tolist()
        raise ValueError(f"inputs {empty} have no real token in their mask")
    return attentions.to(torch.float64), real


def pad_aware_mean(attentions: torch.Tensor, masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The pad-aware entry-wise mean of Eq. 2 over the given inputs: ``(C [*heads, L, L], counts [L, L])``.

    Entry (q, k) averages ``attentions[i, ..., q, k]`` over the inputs i in which both q and k are real tokens;
    entries no input covers are 0. It is :class:`papa_lib.core.averaging.PadAwareAverage` (what
    :func:`papa_lib.average_attention` streams over a corpus) applied to attention matrices already in memory.
    """
    attentions, real = _check_attentions(attentions, masks)
    count, *heads, length, _ = attentions.shape
    average = PadAwareAverage(1, math.prod(heads))  # the one implementation of Eq. 2
    average.add([(0, attentions.reshape(count, -1, length, length))], real.long())
    mean, counts = average.means()
    return mean[0].reshape(*heads, length, length), counts


def restrict_to_input(constant: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """A constant matrix as PAPA uses it on each input: ``[N, *heads, L, L]`` (footnote 8).

    Entries whose query or key is padding are zeroed and every real query row is normalised to sum 1; a real row with
    no mass on any real key becomes uniform over the real keys; padded query rows are all zero. This matches the
    ``constant`` mode of :class:`papa_lib.core.override.AttentionOverride` (tested against it).
    """
    constant = torch.as_tensor(constant).detach().to(torch.float64)
    masks = torch.as_tensor(masks).detach()
    if constant.dim() < 2 or constant.shape[-1] != constant.shape[-2]:
        raise ValueError(f"constant must have shape [..., L, L], got {tuple(constant.shape)}")
    if masks.dim() != 2 or masks.shape[1] != constant.shape[-1]:
        raise ValueError(f"masks must have shape [N, L={constant.shape[-1]}], got {tuple(masks.shape)}")
    real = masks.bool().reshape(masks.shape[0], *([1] * (constant.dim() - 2)), masks.shape[1])  # [N, 1.., L]
    pair = (real[..., :, None] & real[..., None, :]).to(torch.float64)  # 1 where the query and the key are real
    masked = constant[None] * pair
    row_sum = masked.sum(-1, keepdim=True)
    uniform = pair / pair.sum(-1, keepdim=True).clamp_min(1.0)
    return torch.where((row_sum <= 0) & real[..., None], uniform, masked / row_sum.clamp_min(1e-300))


def input_distance(
    attentions: torch.Tensor, masks: torch.Tensor, reference: torch.Tensor | None = None
) -> torch.Tensor:
    """Per input and head, how far the attention is from a constant matrix: ``[N, *heads]`` in [0, 1].

    Args:
        attentions: ``[N, *heads, L, L]`` attention matrices of N inputs (e.g. ``[N, heads, L, L]`` for one layer, or
            ``[N, layers, heads, L, L]`` for a whole model).
        masks: ``[N, L]``, 1 (or True) at real tokens.
        reference: the constant matrix to compare with, ``[*heads, L, L]``; default: the pad-aware mean of
            ``attentions`` itself (:func:`pad_aware_mean`). It is restricted to each input with
            :func:`restrict_to_input`. A per-input reference ``[N, *heads, L, L]`` is used as given.

    Returns:
        The mean over each input's real query rows of the total-variation distance ½ Σ_k |A[q, k] - R[q, k]|.
    """
    attentions, real = _check_attentions(attentions, masks)
    if reference is None:
        reference, _ = pad_aware_mean(attentions, real)
    reference = torch.as_tensor(reference).detach().to(torch.float64)
    if reference.shape == attentions.shape:
        restricted = reference
    elif reference.shape == attentions.shape[1:]:
        restricted = restrict_to_input(reference, real)
    else:
        raise ValueError(
            f"reference has shape {tuple(reference.shape)}; expected {tuple(attentions.shape[1:])} "
            f"or {tuple(attentions.shape)}"
        )
    extra = attentions.dim() - 3
    query_real = real.to(torch.float64).reshape(real.shape[0], *([1] * extra), real.shape[1])
    row_distance = 0.5 * (attentions - restricted).abs().sum(-1)  # [N, *heads, L]
    return (row_distance * query_real).sum(-1) / query_real.sum(-1)


def input_variability(
    attentions: torch.Tensor, masks: torch.Tensor, reference: torch.Tensor | None = None
) -> torch.Tensor:
    """How input-dependent each head is on these inputs: the mean of :func:`input_distance` over inputs, ``[*heads]``.

    0 means the head attends in the same way on every input (a constant matrix would do exactly what it does); 0.3
    means that, on average, 30% of a token's attention goes elsewhere than the constant matrix would send it.
    """
    return input_distance(attentions, masks, reference).mean(0)


# ------------------------------------------------------------------------------------------------------------------
# Patterns of the constant matrices (Sec. 5.1)
# ------------------------------------------------------------------------------------------------------------------


def _matrices_and_counts(constant: Any, counts: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept a :class:`~papa_lib.core.averaging.ConstantAttention` or ``(matrices [layers, heads, L, L], counts [L,
    L])``."""
    if counts is None:
        if not hasattr(constant, "matrices") or not hasattr(constant, "counts"):
            raise ValueError("pass a ConstantAttention, or matrices together with their counts [L, L]")
        matrices, counts = constant.matrices, constant.counts
    else:
        matrices = constant
    matrices = torch.as_tensor(matrices).to(torch.float64)
    counts = torch.as_tensor(counts).to(torch.float64)
    if matrices.dim() != 4 or matrices.shape[-1] != matrices.shape[-2]:
        raise ValueError(f"matrices must have shape [layers, heads, L, L], got {tuple(matrices.shape)}")
    if tuple(counts.shape) != tuple(matrices.shape[-2:]):
        raise ValueError(f"counts must have shape {tuple(matrices.shape[-2:])}, got {tuple(counts.shape)}")
    return matrices, counts


def _special_positions(length: int, special_positions: Sequence[int] | None) -> list[int]:
    positions = (0, length - 1) if special_positions is None else tuple(special_positions)
    resolved = []
    for position in positions:
        if isinstance(position, bool) or not isinstance(position, (int, np.integer)):
            raise ValueError(f"special positions must be integers, got {position!r}")
        if not -length <= position < length:
            raise ValueError(f"special position {position} is outside a matrix of width L={length}")
        resolved.append(int(position) % length)
    return sorted(set(resolved))


def _word_rows(counts: torch.Tensor, special: list[int]) -> torch.Tensor:
    """Row weights ``[L]``: counts[q, q] for word query rows (never-real and special rows get 0), summing to 1."""
    weights = counts.diagonal().clone()
    weights[special] = 0.0
    total = weights.sum()
    if total <= 0:
        raise ValueError("no word query row was ever a real token (counts are zero outside the special positions)")
    return weights / total


def _normalised_rows(matrices: torch.Tensor) -> torch.Tensor:
    row_sum = matrices.sum(-1, keepdim=True)
    return torch.where(row_sum > 0, matrices / row_sum.clamp_min(1e-300), torch.zeros((), dtype=matrices.dtype))


def diagonal_stats(
    constant: Any,
    counts: torch.Tensor | None = None,
    width: int = 1,
    special_positions: Sequence[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(diagonal_rows, diagonal_mass)``, each ``[layers, heads]``, of constant matrices (Sec. 5.1).

    ``diagonal_rows``: weighted share of word query rows whose largest entry among the non-special keys that were
    ever real together with the query (``counts[q, k] > 0``) lies within ``|q - k| <= width``.
    ``diagonal_mass``: weighted mean of the row-normalised mass on the non-special keys of that band.
    Rows are weighted by ``counts[q, q]``; special rows are left out (see the module docstring).
    """
    if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width < 0:
        raise ValueError(f"width must be a non-negative integer, got {width!r}")
    matrices, counts = _matrices_and_counts(constant, counts)
    length = matrices.shape[-1]
    special = _special_positions(length, special_positions)
    weights = _word_rows(counts, special)
    positions = torch.arange(length)
    band = (positions[:, None] - positions[None, :]).abs() <= width
    usable = counts > 0
    usable[:, special] = False
    rows = _normalised_rows(matrices)
    mass = (rows * (band & usable)).sum(-1)  # [layers, heads, L]
    candidates = torch.where(usable, matrices, torch.full((), -1.0, dtype=matrices.dtype))
    favourite = candidates.argmax(-1)  # [layers, heads, L]
    in_band = (favourite - positions).abs() <= width
    in_band &= candidates.max(-1).values > 0  # a row with no mass on any usable key cannot be diagonal
    return (in_band.to(torch.float64) * weights).sum(-1), (mass * weights).sum(-1)


def _real_row_mean(constants, entries, what: str) -> pd.DataFrame:
    """Per (layer, head): the mean of ``entries(matrices)`` (``[layers, heads, L]``, one value per query row) over
    the query rows that were real in at least one averaged example (``counts[q, q] > 0``). Columns: layer, head,
    mass."""
    rows = constants.counts.diagonal() > 0
    if not bool(rows.any()):
        raise ValueError(f"{what}: no query position was ever real in the averaged text")
    mass = entries(constants.matrices)[:, :, rows].float().mean(dim=-1)  # [layers, heads]
    layers, heads = mass.shape
    return pd.DataFrame({
        "layer": np.repeat(np.arange(layers), heads),
        "head": np.tile(np.arange(heads), layers),
        "mass": mass.reshape(-1).cpu().numpy().astype(float),
    })


def column_mass(constants, column: int) -> pd.DataFrame:
    """Per (layer, head): the average weight a constant matrix (:class:`~papa_lib.core.averaging.ConstantAttention`)
    puts on key position ``column`` (Sec. 5.3: the weight on the last position), over its real query rows.
    Columns: layer, head, mass."""
    length = int(constants.matrices.shape[-1])
    if not 0 <= int(column) < length:
        raise ValueError(f"column_mass: column {column} is outside the matrices' L = {length}")
    return _real_row_mean(constants, lambda matrices: matrices[..., int(column)], "column_mass")


def self_mass(constants) -> pd.DataFrame:
    """Per (layer, head): the average weight a query position puts on itself, ``C[q, q]``, over the real query rows
    (the exact diagonal; :func:`diagonal_stats` counts the band ``|q - k| <= width`` instead). Columns: layer, head,
    mass."""
    return _real_row_mean(constants, lambda matrices: matrices.diagonal(dim1=-2, dim2=-1), "self_mass")


def special_mass(
    constant: Any, counts: torch.Tensor | None = None, special_positions: Sequence[int] | None = None
) -> torch.Tensor:
    """``[layers, heads]`` weighted mean over word query rows of the row-normalised mass on the special positions."""
    matrices, counts = _matrices_and_counts(constant, counts)
    special = _special_positions(matrices.shape[-1], special_positions)
    weights = _word_rows(counts, special)
    rows = _normalised_rows(matrices)
    return (rows[..., special].sum(-1) * weights).sum(-1)


def pattern_summary(
    constant: Any,
    counts: torch.Tensor | None = None,
    width: int = 1,
    special_positions: Sequence[int] | None = None,
    diagonal_threshold: float = DIAGONAL_THRESHOLD,
    special_threshold: float = SPECIAL_THRESHOLD,
) -> pd.DataFrame:
    """One row per head: ``layer, head, diagonal_rows, diagonal_mass, special_mass, diagonal, cls_sep``.

    ``diagonal`` is ``diagonal_rows >= diagonal_threshold``; ``cls_sep`` is ``special_mass > special_threshold``
    (see the module docstring for the definitions and why these thresholds).
    """
    for name, value in (("diagonal_threshold", diagonal_threshold), ("special_threshold", special_threshold)):
        if not 0.0 <= float(value) <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    rows, mass = diagonal_stats(constant, counts, width=width, special_positions=special_positions)
    special = special_mass(constant, counts, special_positions=special_positions)
    layers, heads = rows.shape
    frame = pd.DataFrame(
        {
            "layer": np.repeat(np.arange(layers), heads),
            "head": np.tile(np.arange(heads), layers),
            "diagonal_rows": rows.flatten().numpy(),
            "diagonal_mass": mass.flatten().numpy(),
            "special_mass": special.flatten().numpy(),
        }
    )
    frame["diagonal"] = frame["diagonal_rows"] >= diagonal_threshold
    frame["cls_sep"] = frame["special_mass"] > special_threshold
    return frame


def pattern_shares(
    summary: pd.DataFrame,
    diagonal_thresholds: Iterable[float] = (0.3, 0.4, 0.5, 0.6, 0.7),
    mass_thresholds: Iterable[float] = (0.1, 0.2, 0.3, 0.5),
    special_thresholds: Iterable[float] = (0.3, 0.4, 0.5, 0.6, 0.7),
) -> pd.DataFrame:
    """Share of heads that pass each criterion at each threshold (sensitivity of the Sec. 5.1 counts).

    Returns one row per (pattern, criterion, threshold): ``pattern`` ('diagonal' or '[CLS]/[SEP]'), ``criterion``
    (a readable rule), ``threshold``, ``share`` (of all heads), ``heads`` (count) and ``default`` (True for the
    rule and threshold :func:`pattern_summary` uses).
    """
    missing = {"diagonal_rows", "diagonal_mass", "special_mass"} - set(summary.columns)
    if missing:
        raise ValueError(f"pattern_shares needs a pattern_summary() frame; missing columns {sorted(missing)}")
    if summary.empty:
        raise ValueError("pattern_shares got an empty summary")
    total = len(summary)
    rows = []
    plans = (
        ("diagonal", "favourite word key within |q-k|<=1 in >= t of rows", "diagonal_rows", ">=", diagonal_thresholds,
         DIAGONAL_THRESHOLD),
        ("diagonal", "band |q-k|<=1 holds >= t of the mass", "diagonal_mass", ">=", mass_thresholds, None),
        ("[CLS]/[SEP]", "mass on [CLS]+[SEP] > t", "special_mass", ">", special_thresholds, SPECIAL_THRESHOLD),
    )
    for pattern, criterion, column, comparison, thresholds, default in plans:
        for threshold in thresholds:
            values = summary[column]
            passed = values >= threshold if comparison == ">=" else values > threshold
            count = int(passed.sum())
            rows.append(
                {
                    "pattern": pattern,
                    "criterion": criterion,
                    "threshold": float(threshold),
                    "share": count / total,
                    "heads": count,
                    "default": default is not None and math.isclose(float(threshold), default),
                }
            )
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------------------------
# λ and head-replacement orders (Sec. 3.2, 5.4)
# ------------------------------------------------------------------------------------------------------------------


def lambda_frame(records: Iterable[Mapping]) -> pd.DataFrame:
    """Long form of λ records (each a mapping of ``task``, ``matrices_from``, ``key``, ``path`` and ``lambdas``, a
    ``[layers, heads]`` tensor): ``task, matrices_from, key, file, layer, head, lambda, rank, kept_until`` (``rank``
    0 = replaced first in the λ order; ``kept_until`` see :func:`kept_until`)."""
    frames = []
    for record in records:
        lambdas = torch.as_tensor(record["lambdas"])
        layers, heads = lambdas.shape
        order = selection.replacement_order("lambda", layers, heads, lambdas=lambdas)
        rank = {pair: position for position, pair in enumerate(order)}
        kept = kept_until(lambdas)
        frames.append(
            pd.DataFrame(
                {
                    "task": record["task"],
                    "matrices_from": record["matrices_from"],
                    "key": record["key"],
                    "file": Path(record["path"]).name,
                    "layer": np.repeat(np.arange(layers), heads),
                    "head": np.tile(np.arange(heads), layers),
                    "lambda": lambdas.flatten().numpy().astype(float),
                    "rank": [rank[(layer, head)] for layer in range(layers) for head in range(heads)],
                    "kept_until": kept.flatten().numpy(),
                }
            )
        )
    columns = ["task", "matrices_from", "key", "file", "layer", "head", "lambda", "rank", "kept_until"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def kept_until(lambdas: torch.Tensor, fractions: Sequence[float] = selection.PAPER_FRACTIONS,
               order: str = "lambda", seed: int = 0) -> torch.Tensor:
    """``[layers, heads]``: the smallest of ``fractions`` at which each head is still input-dependent.

    Uses :func:`papa_lib.experiments.selection.heads_to_replace`; a head replaced already at the largest fraction below
    1 gets 1.0 (it is input-dependent only in the original model). With the paper's fractions, a head with value 1/16
    survives every intermediate cut (only the fully constant model replaces it).
    """
    lambdas = torch.as_tensor(lambdas)
    if lambdas.dim() != 2:
        raise ValueError(f"lambdas must have shape [layers, heads], got {tuple(lambdas.shape)}")
    layers, heads = lambdas.shape
    values = sorted({float(f) for f in fractions}, reverse=True)
    if not values or any(not 0.0 <= f <= 1.0 for f in values):
        raise ValueError(f"fractions must be numbers in [0, 1], got {list(fractions)}")
    result = torch.ones(layers, heads, dtype=torch.float64)
    for fraction in values:
        if fraction in (0.0, 1.0):
            continue
        replaced = set(selection.heads_to_replace(order, fraction, num_layers=layers, num_heads=heads,
                                                     lambdas=lambdas, seed=seed))
        for layer in range(layers):
            for head in range(heads):
                if (layer, head) not in replaced:
                    result[layer, head] = fraction
    return result


def order_curves(frame: pd.DataFrame, task: str = "mnli", orders: Sequence[str] = selection.ORDERS) -> pd.DataFrame:
    """The Fig. 5 runs of a results table as one curve per head-selection order.

    Keeps the ``task`` rows of the original model (fraction 1) and of average matrices built on the task's own text
    (``matrix_type == 'average'``, ``matrices_from`` empty or equal to ``task``). The endpoints are stored once
    (fraction 1 as ``original``/``none``, fraction 0 as selection ``none``) and belong to every order, so they are
    repeated for each of ``orders``. Columns: ``selection_order, fraction, seed, value, metric``.
    """
    needed = {"task", "matrix_type", "matrices_from", "selection_order", "fraction", "seed", "value", "metric"}
    missing = needed - set(frame.columns)
    if missing:
        raise ValueError(f"order_curves: the results frame lacks columns {sorted(missing)}")
    from ..experiments.summaries import curve_rows

    rows = frame[frame["task"] == task]
    parts = [curve_rows(rows, order).assign(selection_order=order) for order in orders]
    columns = ["selection_order", "fraction", "seed", "value", "metric"]
    curves = pd.concat(parts, ignore_index=True)[columns] if parts else pd.DataFrame(columns=columns)
    return curves.sort_values(["selection_order", "fraction", "seed"], ascending=[True, False, True]).reset_index(
        drop=True
    )


def compare_orders(summary: pd.DataFrame, best_order: str = "lambda", worst_order: str = "reversed") -> pd.DataFrame:
    """Rank the orders at every intermediate fraction (0 < f < 1) of a ``summarize(curves, ['selection_order',
    'fraction'])`` frame, plus a row ``fraction = 'mean'`` over those fractions (only fractions every order has).

    Columns: ``fraction, orders, best, worst, <best_order>_rank, <worst_order>_rank, <best_order>_best,
    <worst_order>_worst, margin`` (rank 1 = highest mean metric; ``margin`` = mean of ``best_order`` minus the best
    mean of the other orders: positive when ``best_order`` leads, NaN when it is absent).
    """
    needed = {"selection_order", "fraction", "mean"}
    if needed - set(summary.columns):
        raise ValueError(f"compare_orders needs columns {sorted(needed)}; got {list(summary.columns)}")
    inner = summary[(summary["fraction"] > 0) & (summary["fraction"] < 1)].dropna(subset=["mean"])
    table = inner.pivot_table(index="fraction", columns="selection_order", values="mean")
    rows = []

    def ranked(series: pd.Series, label) -> dict:
        series = series.dropna()
        ordered = series.sort_values(ascending=False)
        ranks = {order: position + 1 for position, order in enumerate(ordered.index)}
        return {
            "fraction": label,
            "orders": len(series),
            "best": ordered.index[0],
            "worst": ordered.index[-1],
            f"{best_order}_rank": ranks.get(best_order),
            f"{worst_order}_rank": ranks.get(worst_order),
            f"{best_order}_best": ordered.index[0] == best_order,
            f"{worst_order}_worst": ordered.index[-1] == worst_order,
            "margin": (float(series[best_order] - series.drop(best_order).max())
                       if best_order in series.index and len(series) > 1 else float("nan")),
        }

    for fraction in sorted(table.index, reverse=True):
        if table.loc[fraction].notna().sum() >= 2:
            rows.append(ranked(table.loc[fraction], float(fraction)))
    complete = table.dropna(axis=0, how="any")
    if len(complete) >= 1 and complete.shape[1] >= 2:
        rows.append(ranked(complete.mean(axis=0), "mean"))
    columns = ["fraction", "orders", "best", "worst", f"{best_order}_rank", f"{worst_order}_rank",
               f"{best_order}_best", f"{worst_order}_worst", "margin"]
    return pd.DataFrame(rows, columns=columns)


# ------------------------------------------------------------------------------------------------------------------
# Compact heat-map tables (drawn by papa_lib.book.charts.heatmap_chart)
# ------------------------------------------------------------------------------------------------------------------


def position_labels(
    positions: Sequence[int], tokens: Sequence[str] | None = None, length: int | None = None
) -> list[str]:
    """Axis labels ``"07 film"`` (zero-padded so that sorting the text sorts the positions) for heat maps."""
    positions = [int(p) for p in positions]
    digits = len(str(max(max(positions, default=0), (length or 1) - 1)))
    if tokens is None:
        return [f"{p:0{digits}d}" for p in positions]
    if len(tokens) != len(positions):
        raise ValueError(f"got {len(tokens)} tokens for {len(positions)} positions")
    return [f"{p:0{digits}d} {t}" for p, t in zip(positions, tokens)]


def packed_heatmaps(
    matrices: torch.Tensor,
    keys: Sequence[Mapping[str, Any]],
    labels: Sequence[Sequence[str]] | Sequence[str],
    positions: Sequence[Sequence[int]] | Sequence[int] | None = None,
    scale: int = 1000,
) -> pd.DataFrame:
    """One row per matrix, for :func:`papa_lib.book.charts.heatmap_chart`: the key fields, ``labels`` and ``cells``
    (row-major ints).

    Args:
        matrices: ``[M, L, L]`` (or a list of square tensors of different sizes when ``positions`` is per matrix).
        keys: M dicts of the fields that identify each matrix (e.g. ``{"layer": 2, "head": 5, "input": "s1"}``).
        labels: axis labels, one list per matrix or one shared list (see :func:`position_labels`).
        positions: the rows/columns to keep (a crop), one list per matrix or one shared list; default all.
        scale: values are stored as ``round(scale * value)`` integers (1000: thousandths).
    """
    matrices = list(matrices)
    keys = list(keys)
    if len(keys) != len(matrices):
        raise ValueError(f"got {len(keys)} keys for {len(matrices)} matrices")
    shared_labels = len(labels) > 0 and isinstance(labels[0], str)
    shared_positions = positions is None or (
        len(positions) > 0 and not isinstance(positions[0], (list, tuple, np.ndarray, torch.Tensor))
    )
    records = []
    for index, (matrix, key) in enumerate(zip(matrices, keys)):
        matrix = torch.as_tensor(matrix).to(torch.float64)
        keep = positions if shared_positions else positions[index]
        if keep is not None:
            index_tensor = torch.as_tensor(list(keep), dtype=torch.long)
            matrix = matrix[index_tensor][:, index_tensor]
        names = list(labels if shared_labels else labels[index])
        if matrix.dim() != 2 or matrix.shape[0] != matrix.shape[1] or matrix.shape[0] != len(names):
            raise ValueError(f"matrix {index}: shape {tuple(matrix.shape)} does not match {len(names)} labels")
        cells = torch.round(matrix * scale).to(torch.long).flatten().tolist()
        records.append({**dict(key), "labels": names, "cells": cells})
    return pd.DataFrame(records)
