"""From the results table to the paper's figures and tables (Hassid et al. 2022, Sec. 4.2, 5.2, 5.3, App. C).

Every function here takes the tidy results table of :class:`papa_lib.experiments.results.ResultsStore`
(``.frame()``: one row per run, see :data:`papa_lib.experiments.results.RECORD_FIELDS`) and returns a small tidy or
wide frame that a chapter plots or prints. Means, 95% confidence intervals and relative drops come from
:func:`papa_lib.experiments.summaries.summarize` and :func:`papa_lib.experiments.summaries.relative_drop`; this module
only chooses *which rows* feed them:

* :func:`fraction_curves` -- Fig. 2: score vs fraction of input-dependent heads (1, 1/2, 1/8, 1/16, 0).
* :func:`all_constant_drop` -- relative drops with every head constant, per task, and Fig. 3's points
  (:meth:`DropSummary.per_model`); the verdicts on them are the claims engine's (:mod:`papa_lib.analysis.claims`),
  not this module's.
* :func:`matrix_type_summary`, :func:`average_vs_data_free` -- Table 1 / Table 4.
* :func:`transfer_summary`, :func:`transfer_differences` -- Table 2 / Table 5.
* :func:`lm_curve`, :func:`lm_difference` -- a decoder's own objective (:mod:`papa_lib.experiments.lm`): next-token
  NLL per point with its interval over test windows, and paired differences between two orders or from the original.
* the constant matrices a grid stored, what a declared grid asks for and which of its runs are in the table live in
  :mod:`papa_lib.book.grid_views`.
* compute estimates (run costs, encoder shapes, cache bytes) live in :mod:`papa_lib.ops.costs`.

Canonical rows (see :mod:`papa_lib.experiments.engine`): the model with every head input-dependent (fraction 1) is
stored once as ``matrix_type="original"``, ``selection_order="none"``; with every head replaced (fraction 0) the order
is ``"none"``. Average-type matrices record the task whose text built them in ``matrices_from`` (the task itself,
or ``"mnli"`` for Sec. 5.3); data-free types leave it empty.

All functions accept partial tables: missing configurations give missing cells (or are listed as missing),
never an exception. Groups whose original score is 0 (e.g. a constant classifier's MCC) have no relative drop.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import pandas as pd

from ..analysis.claims import task_rank
from ..experiments import matrices
from ..experiments.summaries import curve_rows, own_text, relative_drop, summarize
from .grid_views import check_frame, check_tasks

__all__ = [
    "DropSummary",
    "all_constant_drop",
    "average_vs_data_free",
    "format_mean_ci",
    "fraction_curves",
    "fraction_label",
    "lm_curve",
    "lm_difference",
    "lm_groups",
    "matrix_type_summary",
    "transfer_differences",
    "transfer_summary",
    "wide_table",
]

_SUMMARY_COLUMNS = ["mean", "ci_low", "ci_high", "n"]
_EPS = 1e-9  # comparisons of printed-precision numbers (0.2 vs 0.19999999999999996)


# ----------------------------------------------------------------------------------------------------------------
# Small helpers
# ----------------------------------------------------------------------------------------------------------------


def sort_by_task(frame: pd.DataFrame, before: Sequence[str] = ("model",), after: Sequence[str] = (),
                  ascending_after: bool = True) -> pd.DataFrame:
    """Sort by ``before`` columns, then the paper's task order (:func:`papa_lib.analysis.claims.task_rank`), then
    ``after`` columns."""
    out = frame.assign(_rank=frame["task"].map(task_rank))
    keys = [*before, "_rank", "task", *after]
    ascending = [True] * (len(before) + 2) + [ascending_after] * len(after)
    return out.sort_values(keys, ascending=ascending, kind="stable").drop(columns="_rank").reset_index(drop=True)


def _is_close(column: pd.Series, target: float) -> pd.Series:
    values = pd.to_numeric(column, errors="coerce").to_numpy(dtype=float)
    return pd.Series(np.isclose(values, float(target), rtol=0.0, atol=1e-9), index=column.index)


def _restrict_tasks(frame: pd.DataFrame, tasks: list[str] | None) -> pd.DataFrame:
    return frame if tasks is None else frame[frame["task"].isin(tasks)]


def fraction_label(fraction: float) -> str:
    """The fraction as the paper writes it: ``1``, ``1/2``, ``1/8``, ``1/16``, ``0``."""
    value = float(fraction)
    if not 0.0 <= value <= 1.0 or math.isnan(value):
        raise ValueError(f"a fraction of input-dependent heads lies in [0, 1], got {fraction!r}")
    return str(Fraction(value).limit_denominator(1024))


def format_mean_ci(mean: float, ci_low: float, ci_high: float, n: int, digits: int = 2) -> str:
    """``"0.47 ± 0.02"`` (mean ± half-width of the 95% interval); ``"0.47"`` for one seed; ``"—"`` when missing."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)) or not n:
        return "—"
    text = fixed(mean, digits)
    if n > 1 and not (math.isnan(ci_low) or math.isnan(ci_high)):
        text += f" ± {fixed((ci_high - ci_low) / 2, digits)}"
    return text


def fixed(value: float, digits: int = 3) -> str:
    """``value`` with ``digits`` decimals, fewer where it is 1 or more so that it shows at most three significant
    figures (``0.484``, ``2.18``, ``12.3``, ``123``)."""
    magnitude = int(math.floor(math.log10(abs(value)))) + 1 if value and math.isfinite(value) else 0
    return f"{value:.{min(digits, max(0, 3 - magnitude)) if magnitude > 0 else digits}f}"


def empty_frame(columns: Sequence[str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="float64" if c in ("mean", "ci_low", "ci_high", "fraction", "relative_drop",
                                                                  "original", "constant", "baseline") else "object")
                         for c in columns})


def _drops_where_defined(rows: pd.DataFrame, by: Sequence[str]) -> tuple[pd.DataFrame, list[str]]:
    """:func:`relative_drop` of ``rows`` (baseline: fraction 1) for the groups where it is defined.

    Returns the drops and one note per group left out (no original rows, or an original mean of 0).
    """
    by = list(by)
    keys = by + ["metric"]
    if rows.empty:
        return pd.DataFrame(), []
    originals = rows[_is_close(rows["fraction"], 1.0)]
    base = summarize(originals, keys) if not originals.empty else empty_frame([*keys, "mean"])
    notes = []
    groups = rows[keys].drop_duplicates()
    ok = groups.merge(base[[*keys, "mean"]], on=keys, how="left")
    for row in ok.itertuples(index=False):
        where = "/".join(str(getattr(row, k)) for k in by)
        if pd.isna(row.mean):
            notes.append(f"{where}: no original (all heads input-dependent) rows")
        elif row.mean == 0:
            notes.append(f"{where}: original score is 0, relative drop undefined")
    ok = ok[ok["mean"].notna() & (ok["mean"] != 0)][keys]
    usable = rows.merge(ok, on=keys, how="inner")
    if usable.empty:
        return pd.DataFrame(), notes
    return relative_drop(usable, by=by), notes


# ----------------------------------------------------------------------------------------------------------------
# Fig. 2: score vs fraction of input-dependent heads
# ----------------------------------------------------------------------------------------------------------------


def fraction_curves(frame: pd.DataFrame, tasks: Iterable[str] | None = None, order: str = "lambda",
                    matrix_type: str = "average", matrices_from: str | None = None) -> pd.DataFrame:
    """Fig. 2: mean score and 95% CI per (model, task, fraction of input-dependent heads).

    The fraction-1 point is the ``original`` rows, fraction 0 the all-replaced rows (``selection_order`` ``none``),
    fractions in between the rows of ``order`` (default the learned-λ order, Sec. 3.2). ``matrices_from=None`` uses
    matrices built on each task's own text. Columns: model, task, metric, fraction, fraction_label, mean, ci_low,
    ci_high, n, relative_drop (from the original; NaN where undefined). Sorted by model, task, decreasing fraction.
    """
    check_frame(frame, "fraction_curves")
    tasks = check_tasks(tasks, "fraction_curves")
    columns = ["model", "task", "metric", "fraction", "fraction_label", *_SUMMARY_COLUMNS, "relative_drop"]
    rows = curve_rows(_restrict_tasks(frame, tasks), order, matrix_type, matrices_from)
    if rows.empty:
        return empty_frame(columns)
    keys = ["model", "task", "metric", "fraction"]
    curves = summarize(rows, keys)
    drops, _ = _drops_where_defined(rows, ("model", "task"))
    if drops.empty:
        curves["relative_drop"] = np.nan
    else:
        curves = curves.merge(drops[[*keys, "relative_drop"]], on=keys, how="left")
    curves["fraction_label"] = curves["fraction"].map(fraction_label)
    return sort_by_task(curves, after=["fraction"], ascending_after=False)[columns]


# ----------------------------------------------------------------------------------------------------------------
# Sec. 4.2 headline numbers and Fig. 3
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DropSummary:
    """Relative drops from the original model at one fraction of input-dependent heads (Sec. 4.2).

    ``per_task``: one row per (model, task) with ``original`` (mean over seeds), ``n_original``, ``replaced``
    (mean of the variant), ``n_replaced`` and ``relative_drop`` = (original - replaced) / |original|. ``mean`` and
    ``max`` are over those rows (all models and tasks, as the paper pools them); ``worst`` names the row of the
    maximum; ``missing`` lists the (model/task) groups that could not be used and why.
    """

    fraction: float
    per_task: pd.DataFrame
    mean: float
    max: float
    worst: str | None
    missing: tuple[str, ...] = field(default_factory=tuple)

    @property
    def count(self) -> int:
        """How many (model, task) drops the mean and max are taken over."""
        return int(len(self.per_task))

    def per_model(self) -> pd.DataFrame:
        """Fig. 3: per model, the original score and the relative drop, each averaged over its tasks."""
        if self.per_task.empty:
            return empty_frame(["model", "original", "relative_drop", "tasks"])
        grouped = self.per_task.groupby("model", sort=True)
        return pd.DataFrame({
            "original": grouped["original"].mean(),
            "relative_drop": grouped["relative_drop"].mean(),
            "tasks": grouped["task"].count(),
        }).reset_index()


def _drop_at(frame: pd.DataFrame, fraction: float, order: str, matrix_type: str, matrices_from: str | None,
             tasks: list[str] | None) -> DropSummary:
    rows = curve_rows(_restrict_tasks(frame, tasks), order, matrix_type, matrices_from)
    rows = rows[_is_close(rows["fraction"], 1.0) | _is_close(rows["fraction"], fraction)]
    columns = ["model", "task", "metric", "original", "n_original", "replaced", "n_replaced", "relative_drop"]
    drops, notes = _drops_where_defined(rows, ("model", "task"))
    per_task = empty_frame(columns)
    if not drops.empty:
        at = drops[_is_close(drops["fraction"], fraction)]
        base_n = drops[_is_close(drops["fraction"], 1.0)][["model", "task", "metric", "n"]].rename(
            columns={"n": "n_original"})
        per_task = at.merge(base_n, on=["model", "task", "metric"], how="left").rename(
            columns={"baseline": "original", "mean": "replaced", "n": "n_replaced"})[columns]
        lacking = drops[["model", "task"]].drop_duplicates().merge(at[["model", "task"]], how="left", indicator=True)
        for row in lacking[lacking["_merge"] == "left_only"].itertuples(index=False):
            notes.append(f"{row.model}/{row.task}: no rows at fraction {fraction_label(fraction)}")
        per_task = sort_by_task(per_task)
    if per_task.empty:
        return DropSummary(fraction, per_task, float("nan"), float("nan"), None, tuple(notes))
    worst_row = per_task.loc[per_task["relative_drop"].idxmax()]
    several_models = per_task["model"].nunique() > 1
    worst = f"{worst_row['model']}/{worst_row['task']}" if several_models else str(worst_row["task"])
    drop = per_task["relative_drop"]
    return DropSummary(fraction, per_task, float(drop.mean()), float(drop.max()), worst, tuple(notes))


def all_constant_drop(frame: pd.DataFrame, tasks: Iterable[str] | None = None, matrix_type: str = "average",
                      matrices_from: str | None = None) -> DropSummary:
    """Relative drop with every head replaced (fraction 0) per (model, task), and its mean and max (Sec. 4.2).

    The paper: an 8% relative drop on average, never more than 20% (:func:`papa_lib.analysis.paper.headline`).
    """
    check_frame(frame, "all_constant_drop")
    return _drop_at(frame, 0.0, "none", matrix_type, matrices_from, check_tasks(tasks, "all_constant_drop"))


def wide_table(summary: pd.DataFrame, row: str, column: str = "task", row_order: Sequence[str] | None = None,
               column_order: Sequence[str] | None = None, digits: int = 2) -> pd.DataFrame:
    """A tidy summary (``mean, ci_low, ci_high, n``) as a table of ``"mean ± half-width"`` strings.

    Rows are ``row`` (with ``model`` in front when the summary has several models), columns ``column``; cells
    without data read ``"—"``. ``row_order``/``column_order`` fix the order and keep rows/columns without data.
    """
    for name in (row, column, *_SUMMARY_COLUMNS):
        if name not in summary.columns:
            raise ValueError(f"wide_table: summary lacks column {name!r} (have {list(summary.columns)})")
    rows = list(row_order) if row_order is not None else list(dict.fromkeys(summary[row]))
    cols = list(column_order) if column_order is not None else list(dict.fromkeys(summary[column]))
    models = list(dict.fromkeys(summary["model"])) if "model" in summary.columns else []
    several = len(models) > 1
    cells = {}
    for record in summary.itertuples(index=False):
        key = ((record.model,) if several else ()) + (getattr(record, row),)
        cells[(key, getattr(record, column))] = format_mean_ci(record.mean, record.ci_low, record.ci_high, record.n,
                                                               digits)
    index = [((m,) if several else ()) + (r,) for m in (models if several else [None]) for r in rows]
    data = [[cells.get((key, c), "—") for c in cols] for key in index]
    if several:
        idx = pd.MultiIndex.from_tuples(index, names=["model", row])
    else:
        idx = pd.Index([k[0] for k in index], name=row)
    return pd.DataFrame(data, index=idx, columns=pd.Index(cols, name=column))


# ----------------------------------------------------------------------------------------------------------------
# Table 1 / 4: matrix types
# ----------------------------------------------------------------------------------------------------------------


def matrix_type_summary(frame: pd.DataFrame, tasks: Iterable[str] | None = None) -> pd.DataFrame:
    """Table 1 in tidy form: per (model, matrix type, task) the mean and CI with every head replaced.

    Rows: the original model (fraction 1) and every matrix type at fraction 0, average-type matrices built on the
    task's own text. Columns: model, matrix_type, construction, task, metric, mean, ci_low, ci_high, n; sorted in
    Table 1's row order and the paper's task order.
    """
    check_frame(frame, "matrix_type_summary")
    tasks = check_tasks(tasks, "matrix_type_summary")
    columns = ["model", "matrix_type", "construction", "task", "metric", *_SUMMARY_COLUMNS]
    frame = _restrict_tasks(frame, tasks)
    original = frame["matrix_type"] == "original"
    replaced = (frame["matrix_type"] != "original") & _is_close(frame["fraction"], 0.0) & own_text(frame)
    rows = frame[original | replaced]
    if rows.empty:
        return empty_frame(columns)
    summary = summarize(rows, ["model", "matrix_type", "task", "metric"])
    construction = {n: e.construction for n, e in matrices.MATRIX_TYPES.items()}
    summary["construction"] = summary["matrix_type"].map(construction).fillna("other")
    order = {name: i for i, name in enumerate(matrices.table_order())}
    summary["_row"] = summary["matrix_type"].map(lambda m: order.get(m, len(order)))
    return sort_by_task(summary, before=("model", "_row", "matrix_type"))[columns]


def average_vs_data_free(summary: pd.DataFrame) -> pd.DataFrame:
    """Per (model, task): does the average matrix beat every data-free one (identity, Toeplitz, zeros)?

    ``summary`` is :func:`matrix_type_summary`'s output. Columns: model, task, average, best_data_free (its type),
    best_data_free_score, margin (average - best data-free), beats (True/False; None when a score is missing),
    data_free_types (how many data-free types were measured), and the labeled-data comparisons
    minus_trainable_toeplitz / minus_trainable_average (average - that type's score; NaN when missing).
    """
    for name in ("model", "matrix_type", "task", "mean"):
        if name not in summary.columns:
            raise ValueError(f"average_vs_data_free: summary lacks column {name!r}")
    columns = ["model", "task", "average", "best_data_free", "best_data_free_score", "margin", "beats",
               "data_free_types", "minus_trainable_toeplitz", "minus_trainable_average"]
    records = []
    for (model, task), group in summary.groupby(["model", "task"], sort=False):
        means = dict(zip(group["matrix_type"], group["mean"]))
        average = means.get("average", float("nan"))
        free = {t: means[t] for t in matrices.data_free_types() if t in means and not pd.isna(means[t])}
        best = max(free, key=free.get) if free else None
        best_score = free[best] if best else float("nan")
        margin = average - best_score
        beats = None if (pd.isna(average) or best is None) else bool(margin > 0)
        records.append((model, task, average, best, best_score, margin, beats, len(free),
                        average - means.get("trainable_toeplitz", float("nan")),
                        average - means.get("trainable_average", float("nan"))))
    out = pd.DataFrame(records, columns=columns)
    if out.empty:
        return out
    return sort_by_task(out)


# ----------------------------------------------------------------------------------------------------------------
# Table 2 / 5: matrices built on MNLI text
# ----------------------------------------------------------------------------------------------------------------


def transfer_summary(frame: pd.DataFrame, tasks: Iterable[str] | None = None, source: str = "mnli") -> pd.DataFrame:
    """Table 2 in tidy form: every head constant (average matrices), built on the task's own text or on ``source``.

    Rows with ``matrix_type == 'average'``, fraction 0, and matrices built on the task's own text
    (:func:`papa_lib.experiments.summaries.own_text`; labelled ``per-task``) or on ``source``'s (labelled with the
    source name); the source task itself is left out.
    Columns: model, task, matrices_from, metric, mean, ci_low, ci_high, n.
    """
    check_frame(frame, "transfer_summary")
    tasks = check_tasks(tasks, "transfer_summary")
    columns = ["model", "task", "matrices_from", "metric", *_SUMMARY_COLUMNS]
    frame = _restrict_tasks(frame, tasks)
    base = (frame["matrix_type"] == "average") & _is_close(frame["fraction"], 0.0) & (frame["task"] != source)
    rows = frame[base & (own_text(frame) | (frame["matrices_from"] == source))].copy()
    if rows.empty:
        return empty_frame(columns)
    rows["matrices_from"] = np.where(own_text(rows), "per-task", source)
    summary = summarize(rows, ["model", "task", "matrices_from", "metric"])
    summary["_row"] = (summary["matrices_from"] != "per-task").astype(int)
    return sort_by_task(summary, before=("model", "_row"))[columns]


def transfer_differences(frame: pd.DataFrame, tasks: Iterable[str] | None = None, source: str = "mnli") -> pd.DataFrame:
    """Per (model, task): per-task mean, ``source`` mean, difference (source - per-task), the per-task CI half-width
    (NaN for one seed) and ``within_ci`` (|difference| <= that half-width; None when either is missing). Rows missing
    either score are kept with NaN."""
    summary = transfer_summary(frame, tasks, source)
    columns = ["model", "task", "per_task", source, "difference", "per_task_ci_half_width", "within_ci"]
    if summary.empty:
        return empty_frame(columns)
    wide = summary.pivot_table(index=["model", "task"], columns="matrices_from", values="mean", aggfunc="first")
    own = summary[summary["matrices_from"] == "per-task"].set_index(["model", "task"])
    half = ((own["ci_high"] - own["ci_low"]) / 2).where(own["n"] > 1)
    out = pd.DataFrame(index=wide.index)
    out["per_task"] = wide["per-task"] if "per-task" in wide else np.nan
    out[source] = wide[source] if source in wide else np.nan
    out["difference"] = out[source] - out["per_task"]
    out["per_task_ci_half_width"] = half.reindex(out.index)
    known = out["difference"].notna() & out["per_task_ci_half_width"].notna()
    out["within_ci"] = [bool(abs(d) <= h + _EPS) if k else None
                        for d, h, k in zip(out["difference"], out["per_task_ci_half_width"], known)]
    return sort_by_task(out.reset_index())[columns]


# ----------------------------------------------------------------------------------------------------------------
# A decoder's own objective: the LM experiment (papa_lib.experiments.lm)
# ----------------------------------------------------------------------------------------------------------------

#: The columns of :func:`lm_curve`.
LM_CURVE_COLUMNS = ["matrix_type", "order", "fraction", "fraction_label", "nll", "ci_low", "ci_high", "runs",
                    "input_dependent", "replaced", "windows", "tokens"]
#: The columns of :func:`lm_difference`.
LM_DIFFERENCE_COLUMNS = ["fraction", "fraction_label", "difference", "ci_low", "ci_high"]


def lm_groups(records: Iterable[dict]) -> dict[tuple[str, str, float], list[dict]]:
    """The LM records (:func:`papa_lib.experiments.lm.lm_records`) grouped by ``(matrix_type, order, fraction)``, in
    the order they ran: a ``random`` order's seeds share one group, every other group holds one run."""
    groups: dict[tuple[str, str, float], list[dict]] = {}
    for record in records:
        key = (str(record["matrix_type"]), str(record["order"]), round(float(record["fraction"]), 9))
        groups.setdefault(key, []).append(record)
    return groups


def lm_curve(records: Iterable[dict], resamples: int = 2000, seed: int = 0) -> pd.DataFrame:
    """One row per point of the LM experiment: mean next-token NLL (nats per predicted token) and its percentile
    bootstrap 95% interval over the test windows (:func:`papa_lib.experiments.lm.nll_interval`; a ``random``
    order's seeds averaged window by window, ``runs`` of them). Columns :data:`LM_CURVE_COLUMNS`; the original first,
    then each order by decreasing fraction, every head constant, the data-free alternatives, then any baseline without
    attention (the ``unigram`` one). No records: empty."""
    from ..experiments.lm import DATA_FREE, nll_interval

    rows = []
    for (matrix_type, order, fraction), group in lm_groups(records).items():
        interval = nll_interval(group, resamples=resamples, seed=seed)
        first = group[0]
        rows.append({"matrix_type": matrix_type, "order": order, "fraction": fraction,
                     "fraction_label": fraction_label(fraction), "nll": interval.value, "ci_low": interval.low,
                     "ci_high": interval.high, "runs": len(group), "input_dependent": int(first["input_dependent"]),
                     "replaced": int(first["replaced"]), "windows": int(first["windows"]),
                     "tokens": int(first["tokens"])})
    if not rows:
        return empty_frame(LM_CURVE_COLUMNS)
    frame = pd.DataFrame(rows)
    ranks = {"original": 0, "average": 1, **dict.fromkeys(DATA_FREE, 2)}
    rank = frame["matrix_type"].map(lambda t: ranks.get(t, 3))  # then baselines without attention (unigram)
    all_heads = (frame["order"] == "all").astype(int)
    frame = frame.assign(_rank=rank, _all=all_heads, _fraction=-frame["fraction"])
    frame = frame.sort_values(["_rank", "_all", "order", "_fraction"], kind="stable")
    return frame.drop(columns=["_rank", "_all", "_fraction"]).reset_index(drop=True)[LM_CURVE_COLUMNS]


def lm_difference(records: Iterable[dict], variant: tuple[str, str], reference: tuple[str, str],
                  resamples: int = 2000, seed: int = 0) -> pd.DataFrame:
    """``variant − reference`` mean NLL per fraction, with the paired bootstrap interval over test windows
    (:func:`papa_lib.experiments.lm.paired_difference`: the same windows resampled for both; positive = the variant
    predicts worse). ``variant`` and ``reference`` are ``(matrix_type, order)`` pairs (``("average", "lambda")``,
    ``("original", "none")``); the original is compared at every fraction of the other side. One row per fraction
    the two share (decreasing); columns :data:`LM_DIFFERENCE_COLUMNS`."""
    from ..experiments.lm import paired_difference

    groups = lm_groups(list(records))

    def points(side):
        return {fraction: group for (matrix_type, order, fraction), group in groups.items()
                if (matrix_type, order) == tuple(side)}

    mine, theirs = points(variant), points(reference)
    if tuple(reference)[0] == "original" and theirs:
        theirs = dict.fromkeys(mine, next(iter(theirs.values())))
    if tuple(variant)[0] == "original" and mine:
        mine = dict.fromkeys(theirs, next(iter(mine.values())))
    rows = []
    for fraction in sorted(set(mine) & set(theirs), reverse=True):
        interval = paired_difference(mine[fraction], theirs[fraction], resamples=resamples, seed=seed)
        rows.append({"fraction": fraction, "fraction_label": fraction_label(fraction), "difference": interval.value,
                     "ci_low": interval.low, "ci_high": interval.high})
    return pd.DataFrame(rows, columns=LM_DIFFERENCE_COLUMNS)


# ---------------------------------------------------------------------------------------------- the decoder's picture
def causal_picture(matrices, config, windows: int, blocks: int = 32) -> dict:
    """What the decoder chapter draws of causal constant matrices ``[layers, heads, L, L]``: each head's matrix in
    ``blocks`` x ``blocks`` blocks of positions (a block's share of a query's attention, averaged over its queries),
    the first-token column and the diagonal for queries 1 to L-1, the largest entry outside a local layer's sliding
    window (per layer), and the shape (``layers``, ``heads``, ``length``, ``window``, ``kinds``, ``block``,
    ``windows`` averaged)."""
    import torch

    M = torch.as_tensor(matrices).float()
    layers, heads, length, _ = M.shape
    block = max(1, length // blocks)
    n = length // block
    pooled = M[..., :n * block, :n * block].reshape(layers, heads, n, block, n, block).sum(-1).mean(-2)
    window = int(getattr(config, "sliding_window", None) or length)
    outside = torch.arange(length)[:, None] - torch.arange(length)[None, :] >= window
    kinds = ["global" if kind == "full_attention" else "local"
             for kind in getattr(config, "layer_types", ["full_attention"] * layers)]
    return {"pooled": pooled, "first": M[..., 1:, 0], "diagonal": M.diagonal(dim1=-2, dim2=-1)[..., 1:],
            "outside_window": M[..., outside].amax(dim=(1, 2)) if bool(outside.any()) else torch.zeros(layers),
            "layers": layers, "heads": heads, "length": length, "window": window, "kinds": kinds, "block": block,
            "windows": int(windows)}


_PICTURE_TENSORS = ("pooled", "first", "diagonal", "outside_window")


def save_causal_picture(picture: dict, path, atol: float = 1e-4) -> bool:
    """Write :func:`causal_picture`'s output as safetensors (its shape in the metadata), unless ``path`` already holds
    the same picture (equal metadata, every tensor within ``atol``): a rerun whose float rounding differs (another
    thread count, another processor) leaves a committed copy as it is. Returns whether it wrote."""
    import json
    from pathlib import Path

    import torch
    from safetensors.torch import save_file

    path = Path(path)
    tensors = {key: picture[key].contiguous().float() for key in _PICTURE_TENSORS}
    meta = {key: value for key, value in picture.items() if key not in _PICTURE_TENSORS}
    if path.is_file():
        held = load_causal_picture(path)
        if json.loads(json.dumps(meta)) == {key: held[key] for key in held if key not in _PICTURE_TENSORS} and all(
                held[key].shape == value.shape and torch.allclose(held[key], value, atol=atol, rtol=0)
                for key, value in tensors.items()):
            return False
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"picture": json.dumps(meta)})
    return True


def load_causal_picture(path) -> dict:
    """:func:`causal_picture`'s output from a file :func:`save_causal_picture` wrote."""
    import json

    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), framework="pt") as handle:
        meta = json.loads(handle.metadata()["picture"])
    return {**load_file(str(path)), **meta}
