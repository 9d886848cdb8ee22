"""The claims engine's declared rules and its one interval method (:mod:`papa_lib.book.claims` documents both): the
rules file ``data/paper/claims_rules.csv`` read and checked, the verdict of an interval against a band, and the
seed-paired Student-t estimates (:class:`Estimate`) the statistics combine. Re-exported by
:mod:`papa_lib.book.claims`."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import paper

RULES_PATH = paper.PAPER_DIR / "claims_rules.csv"
CONFIDENCE = 0.95


# ---------------------------------------------------------------------------------------------- the rules
#: The paper's six tasks in its tables' order (the order claims list tasks in).
TASK_ORDER = ("cola", "mrpc", "sst2", "mnli", "ner", "pos")
#: C4's data-free matrices, the three its statement names (Sec. 5.2); a type registered later as data-free
#: (:func:`papa_lib.experiments.matrices.register_matrix_type`) is shown by the figures, not added to the claim.
DATA_FREE = ("identity", "toeplitz", "zeros")


def rules() -> pd.DataFrame:
    """The declared rules (``data/paper/claims_rules.csv``), indexed by claim id; ``low``/``high`` as floats."""
    table = pd.read_csv(RULES_PATH, keep_default_na=False)
    for column in ("low", "high", "min_effect"):
        table[column] = [_number(v, column, i) for i, v in enumerate(table[column], start=2)]
    return table.set_index("id")


def _number(value: str, column: str, line: int) -> float:
    try:
        return float(value) if str(value).strip() else float("nan")
    except ValueError:
        raise ValueError(f"{RULES_PATH}:{line}: column {column} is not a number: {value!r}") from None


def rule_text(rule: pd.Series) -> str:
    """The rule of one claim in words."""
    def show(v):
        return "-inf" if v == -math.inf else "inf" if v == math.inf else f"{v:g}"

    band = f"[{show(rule.low)}, {show(rule.high)}]"
    if rule.test == "band":
        return f"agrees if the 95% interval lies inside {band}, differs if entirely outside, else inconclusive"
    if rule.test == "band_every":
        return (f"per task (fraction): inside {band} agrees, entirely outside differs; agrees if every one agrees, "
                "differs if any one differs, else inconclusive")
    if rule.test == "direction":
        return (f"direction agrees if the 95% interval lies inside {band}, direction differs if entirely outside, "
                "else inconclusive")
    if rule.test == "correlation":
        return (f"agrees if the 95% interval lies inside {band}; negligible if inside (-{rule.min_effect:g}, "
                f"{rule.min_effect:g}); differs if entirely outside {band} and not negligible; else inconclusive")
    return "the records cannot decide it"


def decide(test: str, low: float, high: float, band_low: float, band_high: float,
           min_effect: float | None = None) -> str:
    """The verdict of an interval ``[low, high]`` under one test (module docstring). A NaN interval (one seed)
    is inconclusive."""
    if test == "not_testable":
        return "not testable"
    if not (np.isfinite(low) and np.isfinite(high)):
        return "inconclusive"
    if test == "correlation" and min_effect is not None and -min_effect < low and high < min_effect:
        return "negligible"
    if band_low <= low and high <= band_high:
        verdict = "agrees"
    elif high < band_low or low > band_high:
        verdict = "differs"
    else:
        verdict = "inconclusive"
    return f"direction {verdict}" if test == "direction" and verdict != "inconclusive" else verdict


def decide_every(verdicts: Iterable[str], complete: bool = True) -> str:
    """``band_every``: agrees when every unit agrees (and none is missing), differs when any one differs."""
    verdicts = list(verdicts)
    if any(v == "differs" for v in verdicts):
        return "differs"
    return "agrees" if verdicts and complete and all(v == "agrees" for v in verdicts) else "inconclusive"


# ---------------------------------------------------------------------------------------------- intervals
@dataclass(frozen=True)
class Estimate:
    """A statistic, its standard error and degrees of freedom; ``parts`` are the (variance, df) components that
    Welch–Satterthwaite combines. ``se`` NaN: no interval (one seed)."""

    value: float
    se: float
    df: float
    parts: tuple = ()

    @property
    def half_width(self) -> float:
        from scipy import stats

        if not np.isfinite(self.se) or not np.isfinite(self.value):
            return float("nan")
        if self.se == 0:
            return 0.0
        return float(stats.t.ppf((1 + CONFIDENCE) / 2, self.df)) * self.se

    @property
    def low(self) -> float:
        return self.value - self.half_width

    @property
    def high(self) -> float:
        return self.value + self.half_width


def _from_parts(value: float, parts: Sequence[tuple[float, float]]) -> Estimate:
    if not parts or any(not np.isfinite(v) for v, _ in parts):
        return Estimate(value, float("nan"), float("nan"), tuple(parts))
    variance = sum(v for v, _ in parts)
    if variance == 0:
        return Estimate(value, 0.0, math.inf, tuple(parts))
    df = variance ** 2 / sum(v ** 2 / d for v, d in parts if v > 0)
    return Estimate(value, math.sqrt(variance), df, tuple(parts))


def one_sample(values: np.ndarray) -> Estimate:
    """Mean of per-seed values with its Student-t standard error (n - 1 degrees of freedom)."""
    values = np.asarray(values, float)
    n = len(values)
    if n < 2:
        return Estimate(float(values.mean()) if n else float("nan"), float("nan"), float("nan"))
    variance = float(values.var(ddof=1)) / n
    return _from_parts(float(values.mean()), [(variance, n - 1)])


def paired(reference: pd.Series, variant: pd.Series, kind: str) -> Estimate:
    """Seed-paired statistic of two configurations (Series of values indexed by seed id), on their common seeds.

    ``kind``: ``difference`` (variant - reference), ``drop`` ((ref - variant) / |ref|) or ``change``
    ((variant - ref) / |ref|); the ratios are linearised by the delta method (module docstring)."""
    seeds = sorted(set(reference.index) & set(variant.index))
    ref, var = reference.loc[seeds].to_numpy(float), variant.loc[seeds].to_numpy(float)
    if not seeds:
        return Estimate(float("nan"), float("nan"), float("nan"))
    if kind == "difference":
        return one_sample(var - ref)
    base = float(ref.mean())
    if base == 0:
        return Estimate(float("nan"), float("nan"), float("nan"))
    a, b = ref - var, np.sign(base) * ref
    drop = float(a.mean()) / abs(base)
    z = (a - drop * b) / abs(base)
    linear = one_sample(z)
    estimate = Estimate(drop, linear.se, linear.df, linear.parts)
    if kind == "drop":
        return estimate
    if kind == "change":
        return Estimate(-drop, linear.se, linear.df, linear.parts)
    raise ValueError(f"paired: unknown kind {kind!r} (difference, drop, change)")


def average(estimates: Sequence[Estimate]) -> Estimate:
    """The mean of per-task estimates: variances summed (scaled by 1/T²), Welch–Satterthwaite df."""
    if not estimates:
        return Estimate(float("nan"), float("nan"), float("nan"))
    t = len(estimates)
    parts = [(v / t ** 2, d) for e in estimates for v, d in (e.parts or [(float("nan"), float("nan"))])]
    return _from_parts(float(np.mean([e.value for e in estimates])), parts)


def difference(larger: Estimate, smaller: Estimate) -> Estimate:
    """``larger - smaller`` of two independent estimates (two models): variances summed, Welch–Satterthwaite df."""
    return _from_parts(larger.value - smaller.value, list(larger.parts) + list(smaller.parts))
