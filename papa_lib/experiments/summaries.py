"""The paper's summary statistics over a results table (Sec. 4.1: means over 3 seeds with 95% CIs; Sec. 4.2: the
relative drop of each variant from the original model): :func:`mean_ci`, :func:`summarize`, :func:`relative_drop`;
the rows of one score-vs-fraction curve (:func:`curve_rows`, with :func:`own_text`: matrices built on the task's own
text); and the percentile bootstrap interval the norm and LM analyses share (:func:`percentile_interval`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

#: Columns that identify one configuration of the grid (everything but the seed); used by
#: :func:`relative_drop` to decide which rows are "the same run over different seeds".
CONFIG_COLUMNS: tuple[str, ...] = (
    "model", "task", "matrix_type", "matrices_from", "selection_order", "fraction", "metric",
)


def seeds_per_config(df: pd.DataFrame) -> pd.Series:
    """How many distinct seeds each configuration (the :data:`CONFIG_COLUMNS` present in ``df``; a missing
    ``matrices_from`` or order is a value of its own) has; empty when ``df`` has no rows or no such column."""
    keys = [c for c in CONFIG_COLUMNS if c in df.columns]
    if df.empty or not keys or "seed" not in df.columns:
        return pd.Series(dtype=int)
    return df.groupby(keys, dropna=False)["seed"].nunique()


# --------------------------------------------------------------------------------------------------------------
# Summaries (Sec. 4.1: means over 3 seeds with 95% CIs; Sec. 4.2: relative drop from the original model)
# --------------------------------------------------------------------------------------------------------------


def t_half_width(se: float, df: float, confidence: float = 0.95) -> float:
    """The half-width of a two-sided Student-t interval, ``t_{(1+confidence)/2, df} * se``: the project's one
    interval helper (summaries, the claims engine, the device checks). NaN when ``se`` or ``df`` is not finite."""
    from scipy import stats

    if not (math.isfinite(se) and math.isfinite(df)) or df <= 0:
        return float("nan")
    return 0.0 if se == 0 else float(stats.t.ppf((1.0 + confidence) / 2.0, df=df)) * se


def check_confidence(confidence: float) -> float:
    """The tail probability ``(1 - confidence) / 2`` of a two-sided interval; ValueError unless 0 < confidence < 1."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return (1.0 - confidence) / 2.0


def percentile_interval(draws, confidence: float = 0.95):
    """The two-sided percentile bootstrap interval ``(low, high)`` of ``draws`` (replicates along axis 0; one number
    each for 1-d draws, arrays of ``draws.shape[1:]`` otherwise): the ``(1 - confidence) / 2`` and
    ``(1 + confidence) / 2`` quantiles, NaN draws ignored, NaN where there are no draws."""
    tail = check_confidence(confidence)
    draws = np.asarray(draws)
    if draws.shape[0] == 0:
        return np.full(draws.shape[1:], np.nan)[()], np.full(draws.shape[1:], np.nan)[()]
    with np.errstate(invalid="ignore", divide="ignore"):
        low, high = np.nanquantile(draws, [tail, 1.0 - tail], axis=0)
    return low, high


def mean_ci(values: Iterable[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and two-sided Student-t confidence interval ``(mean, low, high)`` of ``values``.

    ``low/high = mean -/+ t_{(1+confidence)/2, n-1} * s / sqrt(n)`` with ``s`` the sample standard deviation
    (ddof=1). With a single value there is no spread to estimate and ``(v, v, v)`` is returned (a degenerate
    interval, not a claim of certainty). Empty input, non-finite values or a confidence outside (0, 1) raise
    ValueError.
    """
    check_confidence(confidence)
    array = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=float).ravel()
    if array.size == 0:
        raise ValueError("mean_ci: no values given")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"mean_ci: values must be finite, got {array.tolist()}")
    mean = float(array.mean())
    if array.size == 1:
        return mean, mean, mean
    half_width = t_half_width(float(array.std(ddof=1)) / math.sqrt(array.size), array.size - 1, confidence)
    return mean, mean - half_width, mean + half_width


def _check_columns(df: pd.DataFrame, columns: Iterable[str], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{what}: column(s) not in the frame: {', '.join(missing)} (have {list(df.columns)})")


def summarize(df: pd.DataFrame, by: Sequence[str], value: str = "value", confidence: float = 0.95) -> pd.DataFrame:
    """Group ``df`` by ``by`` and return one row per group: ``by`` columns + ``mean, ci_low, ci_high, n``.

    ``n`` is the number of non-missing values in the group (the seeds); the interval is :func:`mean_ci`'s
    Student-t interval (degenerate for n = 1). Missing values are ignored; a group with none gets NaN and n = 0.
    Missing keys (e.g. no ``matrix_type`` for the original model) form their own group.
    """
    by = [by] if isinstance(by, str) else list(by)
    if not by:
        raise ValueError("summarize: `by` must name at least one column")
    _check_columns(df, [*by, value], "summarize")
    out_columns = [*by, "mean", "ci_low", "ci_high", "n"]
    if df.empty:
        return pd.DataFrame({c: pd.Series(dtype=df[c].dtype if c in df else "float64") for c in out_columns}).astype(
            {"n": "int64"}
        )
    rows = []
    for key, group in df.groupby(by, dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        values = pd.to_numeric(group[value], errors="raise").dropna().to_numpy(dtype=float)
        if values.size:
            mean, low, high = mean_ci(values, confidence)
        else:
            mean = low = high = float("nan")
        rows.append((*key, mean, low, high, int(values.size)))
    return pd.DataFrame(rows, columns=out_columns)


def _baseline_mask(df: pd.DataFrame, baseline: Mapping[str, Any]) -> pd.Series:
    """Rows of ``df`` matching every ``column: value`` of ``baseline`` (floats compared with isclose)."""
    mask = pd.Series(True, index=df.index)
    for column, target in baseline.items():
        col = df[column]
        if target is None or (isinstance(target, float) and math.isnan(target)):
            mask &= col.isna()
        elif isinstance(target, (int, float, np.number)) and not isinstance(target, bool):
            numeric = pd.to_numeric(col, errors="coerce").to_numpy(dtype=float)
            mask &= pd.Series(np.isclose(numeric, float(target), rtol=0.0, atol=1e-12), index=df.index)
        else:
            mask &= col == target
    return mask


def relative_drop(
    df: pd.DataFrame,
    by: Sequence[str] = ("model", "task"),
    baseline: Mapping[str, Any] | None = None,
    value: str = "value",
) -> pd.DataFrame:
    """Relative drop of every configuration's mean (over seeds) from its group's baseline (Sec. 4.2, Fig. 2-3).

    ``baseline`` (default ``{'fraction': 1.0}``, the original model with all heads input-dependent) selects
    the baseline rows. For each group of ``by`` (plus ``metric`` when the frame has that column and ``by``
    does not name it, so different metrics are never compared), the baseline is the mean of the baseline
    rows' values (over seeds, pooling any duplicate baseline configurations), and every configuration --
    the distinct combinations of ``by`` and the other :data:`CONFIG_COLUMNS` present in ``df`` -- gets

        relative_drop = (baseline - mean) / |baseline|

    so a positive number is a loss and the baseline itself gets 0. Output columns: the ``by`` columns, the other
    distinguishing columns, ``mean``, ``n`` (values averaged), ``baseline``, ``relative_drop``. A group
    without baseline rows, or with a zero baseline, raises ValueError naming it.
    """
    baseline = {"fraction": 1.0} if baseline is None else dict(baseline)
    by = [by] if isinstance(by, str) else list(by)
    if not baseline:
        raise ValueError("relative_drop: `baseline` must select rows by at least one column")
    _check_columns(df, [*by, value, *baseline], "relative_drop")
    group_columns = list(by) + (["metric"] if "metric" in df.columns and "metric" not in by else [])
    key_columns = group_columns + [c for c in CONFIG_COLUMNS if c in df.columns and c not in group_columns]
    out_columns = [*key_columns, "mean", "n", "baseline", "relative_drop"]
    if df.empty:
        return pd.DataFrame(columns=out_columns)

    data = df.copy()
    data[value] = pd.to_numeric(data[value], errors="raise")
    per_config = (
        data.groupby(key_columns, dropna=False, sort=True)[value]
        .agg(mean="mean", n="count")
        .reset_index()
    )
    base_rows = data[_baseline_mask(data, baseline)]
    if group_columns:
        base = base_rows.groupby(group_columns, dropna=False, sort=True)[value].mean().rename("baseline").reset_index()
        merged = per_config.merge(base, on=group_columns, how="left")
    else:
        merged = per_config.assign(baseline=base_rows[value].mean() if len(base_rows) else np.nan)

    lacking = merged[merged["baseline"].isna()]
    if not lacking.empty:
        groups = sorted({tuple(r) for r in lacking[group_columns].itertuples(index=False)}, key=str)
        raise ValueError(f"relative_drop: no baseline rows matching {baseline} for group(s) {group_columns}={groups}")
    zero = merged[merged["baseline"] == 0]
    if not zero.empty:
        groups = sorted({tuple(r) for r in zero[group_columns].itertuples(index=False)}, key=str)
        raise ValueError(f"relative_drop: baseline mean is 0 (relative drop undefined) for {group_columns}={groups}")

    merged["relative_drop"] = (merged["baseline"] - merged["mean"]) / merged["baseline"].abs()
    return merged[out_columns].reset_index(drop=True)


# ---------------------------------------------------------------------------------------------- results views
def own_text(frame: pd.DataFrame) -> pd.Series:
    """The one own-text predicate: rows whose constant matrices (if any) were built on their own task's text, or
    that have no matrices at all (Table 2's cross-task rows are the others)."""
    return frame["matrices_from"].isna() | (frame["matrices_from"] == frame["task"])


def curve_rows(frame: pd.DataFrame, order: str, matrix_type: str = "average",
               matrices_from: str | None = None) -> pd.DataFrame:
    """The rows of one score-against-fraction curve (Fig. 2, Fig. 5, the norm-aware orders): the original model
    (fraction 1), ``order``'s partial fractions and every head replaced (fraction 0, ``selection_order`` none), of
    ``matrix_type`` built on the task's own text (``matrices_from=None``) or on ``matrices_from``'s. The end points
    belong to every order; the one view behind the book's curves and tables."""
    from . import matrices

    original = frame["matrix_type"] == "original"
    typed = frame["matrix_type"] == matrix_type
    if matrix_type in matrices.MATRIX_TYPES and matrices.MATRIX_TYPES[matrix_type].from_text:
        typed &= own_text(frame) if matrices_from is None else frame["matrices_from"] == matrices_from
    fraction = pd.to_numeric(frame["fraction"], errors="coerce")
    partial = typed & (frame["selection_order"] == order) & (fraction > 0) & (fraction < 1)
    none = typed & np.isclose(fraction.to_numpy(dtype=float), 0.0, rtol=0.0, atol=1e-9) & (
        frame["selection_order"] == "none")
    return frame[original | partial | none]

