"""The paper's claims, checked against our records: ONE engine that decides every verdict the book prints.

Every chapter renders a row of :func:`claims_table` (:func:`verdict_sentence`, :func:`book_table`); no page helper
decides a verdict on its own. ``claims.csv`` beside a results folder is :func:`write_claims`' output.

**The rules** are declared in ``data/paper/claims_rules.csv`` (:func:`rules`; declared before the verdicts were
recomputed with them): per claim, its full statement, the paper's value, the statistic, the test and the band
``[low, high]``. On the statistic's 95% interval ``[lo, hi]``:

* ``band``: **agrees** when ``[lo, hi]`` lies inside the band (an equivalence test), **differs** when it lies
  entirely outside, **inconclusive** otherwise;
* ``band_every`` (a claim "on every task" / "at every fraction", band ``[low, inf]``): per unit, one-sided
  Student-t tests of ``value > low`` (agrees) and ``value < low - δ`` (differs), Holm-adjusted over the units at
  α = 0.05; the claim agrees when every unit agrees, differs when any one differs, inconclusive otherwise (and
  never agrees when one is unmeasured);
* ``direction`` (C3, which of two models drops more): the band test, reported as **direction agrees** /
  **direction differs** / **inconclusive** — only the direction is tested, never the size;
* ``correlation`` (C8): the band test on Spearman's ρ with a minimum effect |ρ| = 0.1: an interval inside
  ``(-0.1, 0.1)`` is **negligible** and cannot agree;
* ``not_testable``: the verdict reads ``not testable: <why>``.

**Sign convention** (stated once, used everywhere): a difference is *variant minus reference*,
``s_variant - s_reference``; a relative drop is ``(s_orig - s_variant) / |s_orig|`` (positive: the variant scores
lower); a relative change is ``(s_variant - s_reference) / |s_reference|`` (C5: MNLI-built minus per-task, the sign
of the transfer chapter's changes).

**One interval method.** A single configuration: the Student-t 95% interval over its seeds
(:func:`papa_lib.experiments.summaries.mean_ci`). A comparison of two configurations of one task: seed-paired — runs
are paired by their seed id (the same probe initialisation and training subset), and the per-seed values of the
statistic's linearisation give a Student-t interval with ``n - 1`` degrees of freedom (a plain difference is paired
directly; a relative drop, a ratio of means, is linearised by the delta method, ``z_s = (a_s - d·b_s) / |mean b|``
with ``a = orig - variant`` and ``b = orig``). A statistic over tasks (a task average, C3's difference of two
models' averages) adds the per-task variances and takes Welch–Satterthwaite degrees of freedom,
``df = (Σ v_t)² / Σ (v_t² / df_t)``. Why this and not a hierarchical bootstrap: with three seeds a bootstrap
interval is about ``[min, max]`` of three values (about 39% as wide as Student-t), while the t quantile with few
degrees of freedom widens the interval as it should; pairing by seed removes the variance the two configurations
share; and the tasks are the paper's fixed six, not a sample, so only the seed-to-seed variance within each task is
noise (a bootstrap over tasks would treat the task mix as random). The computation is deterministic.
A comparison uses only the seed ids both configurations have; the ``tasks`` column says when they differ.

**Every rule beside the bands** (task inclusion R3, the minimum effect δ and Holm's correction R4-R5, the sensitivity
units R6, C2's threshold R7, the devices R8, ...) is declared in ``data/paper/decision_rules.csv``
(:func:`decision_rules`), with the date it was declared, whether before or after the data it decides were seen, and
the function here that implements it.

**C8** (Kobayashi et al.'s norm findings) is a correlation over a corpus of one deterministic model: there are no
seeds, and its interval is the norm analysis' cluster bootstrap over sequences
(:mod:`papa_lib.analysis.norm_findings`), the only statistic not on seeds.

Claims: C1a/C1b the 20% bound read on the task average / on the worst task, C2 half of the heads, C3 larger models
drop more (cross-model), C4 average beats data-free matrices, C5 MNLI-built matrices, C6a λ best / C6b reversed
worst at every fraction, C7 MLM-pretrained models (needs their MLM heads), C8a-c the norm findings.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..experiments.results import read_results
from ..experiments.selection import ORDERS
from ..experiments.summaries import own_text, seeds_per_config, t_half_width
from . import paper

RULES_PATH = paper.PAPER_DIR / "claims_rules.csv"
DECISION_RULES_PATH = paper.PAPER_DIR / "decision_rules.csv"
CONFIDENCE = 0.95
#: Family-wise error rate of an every-task / every-fraction claim (Holm over its units).
FAMILY_ALPHA = 0.05
#: The units a claim is also decided in (sensitivity): the declared one, the absolute difference of the scores and
#: the chance-corrected one ((s_orig - s) / (s_orig - s_majority): the share of what the probe scores above guessing).
UNITS = ("declared", "absolute", "chance")


# ---------------------------------------------------------------------------------------------- the rules
#: The paper's six tasks in its tables' order (the order claims and the book's tables list tasks in).
TASK_ORDER = ("cola", "mrpc", "sst2", "mnli", "ner", "pos")
#: C4's data-free matrices, the three its statement names (Sec. 5.2); a type registered later as data-free
#: (:func:`papa_lib.experiments.matrices.register_matrix_type`) is shown by the figures, not added to the claim.
DATA_FREE = ("identity", "toeplitz", "zeros")


def _declared(path: Path) -> pd.DataFrame:
    """A rules file, each row's ``relative_to_data`` checked to say ``before`` or ``after`` (a ValueError names the
    line)."""
    table = pd.read_csv(path, keep_default_na=False)
    for i, value in enumerate(table["relative_to_data"], start=2):
        if not str(value).startswith(("before", "after")):
            raise ValueError(f"{path}:{i}: relative_to_data must say 'before' or 'after', not {value!r}")
    return table


def rules() -> pd.DataFrame:
    """The declared rules (``data/paper/claims_rules.csv``), indexed by claim id; ``low``/``high`` as floats."""
    table = _declared(RULES_PATH)
    for column in ("low", "high", "min_effect"):
        table[column] = [_number(v, column, i) for i, v in enumerate(table[column], start=2)]
    return table.set_index("id")


def decision_rules() -> pd.DataFrame:
    """The rules beside the bands (``data/paper/decision_rules.csv``): id, rule, what it applies to, the date it was
    declared, and whether before or after the data it decides were seen. The book tells this history from here."""
    return _declared(DECISION_RULES_PATH).set_index("id")


def verdict_words(rule: pd.Series, verdict: str) -> str:
    """A verdict in the words of what was tested (the rule's ``agrees_as`` / ``differs_as``): "within the paper's
    20% bound", never a bare "agrees" with a number the test did not test."""
    kind = verdict.removeprefix("direction ")
    words = {"agrees": rule.get("agrees_as", ""), "differs": rule.get("differs_as", "")}.get(kind, "")
    return words or verdict


def _number(value: str, column: str, line: int) -> float:
    try:
        return float(value) if str(value).strip() else float("nan")
    except ValueError:
        raise ValueError(f"{RULES_PATH}:{line}: column {column} is not a number: {value!r}") from None


def rule_text(rule: pd.Series) -> str:
    """The rule of one claim in words."""
    band = f"[{rule.low:g}, {rule.high:g}]"
    if rule.test == "band":
        return f"agrees if the 95% interval lies inside {band}, differs if entirely outside, else inconclusive"
    if rule.test == "band_every":
        delta = f"{rule.min_effect:g}" if np.isfinite(rule.min_effect) else "0"
        unit = "fraction" if str(rule.name).startswith("C6") else "task"  # C6 reads MNLI at every fraction
        return (f"per {unit}, one-sided tests Holm-adjusted over the {unit}s at α = {FAMILY_ALPHA:g}: above "
                f"{rule.low:g} agrees, below {rule.low:g} - δ (δ = {delta}) differs; the claim agrees if every "
                "one agrees, differs if any one differs, else inconclusive")
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
        if not np.isfinite(self.se) or not np.isfinite(self.value):
            return float("nan")
        return t_half_width(self.se, self.df, CONFIDENCE)

    @property
    def low(self) -> float:
        return self.value - self.half_width

    @property
    def high(self) -> float:
        return self.value + self.half_width


_NO_ESTIMATE = Estimate(float("nan"), float("nan"), float("nan"))  # nothing to compute the statistic on


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


def paired(reference: pd.Series, variant: pd.Series, kind: str, floor: float = 0.0) -> Estimate:
    """Seed-paired statistic of two configurations (Series of values indexed by seed id), on their common seeds.

    ``kind``: ``difference`` (variant - reference), ``drop`` ((ref - variant) / |ref|) or ``change``
    ((variant - ref) / |ref|); the ratios are linearised by the delta method (module docstring). With ``floor`` (the
    task's majority-class score) ``drop``/``change`` are chance-corrected: divided by ``ref - floor`` instead."""
    seeds = sorted(set(reference.index) & set(variant.index))
    ref, var = reference.loc[seeds].to_numpy(float), variant.loc[seeds].to_numpy(float)
    if not seeds:
        return _NO_ESTIMATE
    if kind == "difference":
        return one_sample(var - ref)
    base = float(ref.mean()) - floor
    if base == 0:
        return _NO_ESTIMATE
    a, b = ref - var, np.sign(base) * (ref - floor)
    drop = float(a.mean()) / abs(base)
    z = (a - drop * b) / abs(base)
    linear = one_sample(z)
    if kind == "drop":
        return Estimate(drop, linear.se, linear.df, linear.parts)
    if kind == "change":
        return Estimate(-drop, linear.se, linear.df, linear.parts)
    raise ValueError(f"paired: unknown kind {kind!r} (difference, drop, change)")


def holm(p_values: Mapping) -> dict:
    """Holm's step-down adjusted p-values (family-wise error control) of ``{unit: p}``; NaN stays NaN."""
    finite = sorted(((p, u) for u, p in p_values.items() if np.isfinite(p)), key=lambda x: x[0])
    m, running, adjusted = len(finite), 0.0, {u: float("nan") for u in p_values}
    for i, (p, unit) in enumerate(finite):
        running = max(running, min(1.0, (m - i) * p))
        adjusted[unit] = running
    return adjusted


def one_sided_p(estimate: Estimate, null: float, greater: bool) -> float:
    """The one-sided Student-t p-value of H0 ``value <= null`` (``greater``) or ``value >= null``."""
    from scipy import stats

    if not (np.isfinite(estimate.se) and estimate.se > 0 and np.isfinite(estimate.df)):
        return float("nan")
    t = (estimate.value - null) / estimate.se
    return float(stats.t.sf(t, estimate.df) if greater else stats.t.cdf(t, estimate.df))


def average(estimates: Sequence[Estimate]) -> Estimate:
    """The mean of per-task estimates: variances summed (scaled by 1/T²), Welch–Satterthwaite df."""
    if not estimates:
        return _NO_ESTIMATE
    t = len(estimates)
    parts = [(v / t ** 2, d) for e in estimates for v, d in (e.parts or [(float("nan"), float("nan"))])]
    return _from_parts(float(np.mean([e.value for e in estimates])), parts)


def difference(larger: Estimate, smaller: Estimate) -> Estimate:
    """``larger - smaller`` of two independent estimates (two models): variances summed, Welch–Satterthwaite df."""
    return _from_parts(larger.value - smaller.value, list(larger.parts) + list(smaller.parts))


# ---------------------------------------------------------------------------------------------- formatting
def sig3(value: float) -> str:
    """Three significant figures (``—`` for NaN)."""
    if value is None or not np.isfinite(value):
        return "—"
    if value == 0:
        return "0"
    return f"{value:#.3g}".rstrip(".") if abs(value) >= 1e-3 else f"{value:.2e}"


def ours_text(row: pd.Series | Mapping) -> str:
    """``value [low, high]`` at three significant figures, or ``—``."""
    if not np.isfinite(row["ours"]):
        return "—"
    if not (np.isfinite(row["ci_low"]) and np.isfinite(row["ci_high"])):
        return f"{sig3(row['ours'])} (no interval: a configuration it reads has one seed)"
    return f"{sig3(row['ours'])} [{sig3(row['ci_low'])}, {sig3(row['ci_high'])}]"


# ------------------------------------------------------------------------------------------- the paper under the rules
def paper_model_drops() -> pd.DataFrame:
    """Per model of Tables 1 and 4: the all-constant relative drop per task, its task mean and its maximum."""
    rows = []
    for name in ("table1", "table4"):
        table = paper.table(name).set_index("matrix_type")
        tasks = [c for c in table.columns if c in TASK_ORDER]
        drops = (table.loc["original", tasks] - table.loc["average", tasks]) / table.loc["original", tasks].abs()
        rows.append({"model": table.attrs["model"], "source": table.attrs["source"], **drops.to_dict(),
                     "mean_drop": float(drops.mean()), "max_drop": float(drops.max())})
    return pd.DataFrame(rows)


def paper_verdicts() -> pd.DataFrame:
    """The paper's own printed numbers (Tables 1, 2, 4, 5; no intervals, so each interval is the point) under the
    declared rules: C1a, C1b, C4, C5 per model and C3 across the two models. Columns: model, claim, value, verdict."""
    table = rules()

    def verdict(claim: str, value: float, test: str | None = None) -> str:  # the point is its own interval
        rule = table.loc[claim]
        return decide(test or rule.test, value, value, rule.low, rule.high)

    rows = []
    drops = paper_model_drops().set_index("model")
    for model, (types, transfer) in {"RoBERTa-base": ("table1", "table2"),
                                     "RoBERTa-large": ("table4", "table5")}.items():
        mean, worst = drops.loc[model, "mean_drop"], drops.loc[model, "max_drop"]
        for claim, value in (("C1a", mean), ("C1b", worst)):
            rows.append((model, claim, value, verdict(claim, value)))
        reported = paper.table(types).set_index("matrix_type")
        tasks = [c for c in reported.columns if c in TASK_ORDER]
        margins = reported.loc["average", tasks] - reported.loc[list(DATA_FREE), tasks].max()
        rows.append((model, "C4", float(margins.min()), decide_every(verdict("C4", m, "band") for m in margins)))
        moved = paper.table(transfer).set_index("matrices_from")
        change = float(((moved.loc["mnli"] - moved.loc["per-task"]) / moved.loc["per-task"].abs()).mean())
        rows.append((model, "C5", change, verdict("C5", change)))
    gap = drops.loc["RoBERTa-large", "mean_drop"] - drops.loc["RoBERTa-base", "mean_drop"]
    rows.append(("RoBERTa-base vs RoBERTa-large", "C3", gap, verdict("C3", gap)))
    return pd.DataFrame(rows, columns=["model", "claim", "value", "verdict"])


# ---------------------------------------------------------------------------------------------- the engine
COLUMNS = ["model", "claim", "statement", "statistic", "tasks", "paper", "ours", "ci_low", "ci_high", "df", "verdict",
           "ours_all_tasks", "ci_low_all_tasks", "ci_high_all_tasks", "verdict_all_tasks", "rule", "chapter", "devices",
           "verdict_text", "decided_by", "absolute", "verdict_absolute", "chance_corrected", "verdict_chance_corrected",
           "verdict_per_type", "unit_dependent"]
FIG5_FRACTIONS = (0.5, 0.125, 0.0625)
#: parameters of the models whose records may meet in C3 (the larger one is expected to drop more)
MODEL_PARAMETERS = {"all-MiniLM-L6-v2": 22.7e6, "all-mpnet-base-v2": 109.5e6, "bert-base-uncased": 110e6,
                    "roberta-base": 125e6, "electra-base-discriminator": 110e6, "deberta-base": 139e6,
                    "bert-large-uncased": 335e6, "roberta-large": 355e6, "electra-large-discriminator": 335e6,
                    "deberta-v3-large": 435e6, "RoBERTa-base": 125e6, "RoBERTa-large": 355e6}
#: C8's rows, by claim id: the finding of ``kobayashi_findings.csv`` that measures it
NORM_FINDINGS = {"C8a": "sep_weight_vs_norm", "C8b": "cls_weight_vs_norm", "C8c": "frequency_rank_vs_norm"}
#: the same for a decoder LM: no [CLS] or [SEP]; C9 asks Kobayashi's [SEP] question of the first token
DECODER_NORM_FINDINGS = {"C8c": "frequency_rank_vs_norm", "C9": "first_token_weight_vs_norm"}
NOT_TESTABLE = {"C7": "needs MLM-pretrained models with their pretrained MLM heads beside ELECTRA; the records hold "
                      "{models} with a trained MLM probe only"}


# ---------------------------------------------------------------------------------------------- selections
def task_rank(task: str) -> int:
    """Position of a task in :data:`TASK_ORDER` (a task the paper does not have comes after its six)."""
    return TASK_ORDER.index(task) if task in TASK_ORDER else len(TASK_ORDER)


def ordered_tasks(tasks: Iterable[str]) -> list[str]:
    """``tasks`` once each, in :data:`TASK_ORDER` (tasks the paper does not have after its six, by name)."""
    return sorted(dict.fromkeys(tasks), key=lambda t: (task_rank(t), str(t)))


_READ: list[pd.DataFrame] | None = None  # while a claim is computed (:func:`_devices_read`): the rows it selects


def _seen(rows: pd.DataFrame) -> pd.DataFrame:
    if _READ is not None:
        _READ.append(rows)
    return rows


@contextmanager
def _reading():
    """Collect the records the claim computed inside the block selects (:func:`devices_of` names their devices)."""
    global _READ
    outer, _READ = _READ, []
    try:
        yield _READ
    finally:
        _READ = outer


def _rows_read(read: Sequence[pd.DataFrame], tasks: Iterable[str]) -> pd.DataFrame:
    """The records a claim read (:func:`_reading`) on ``tasks``."""
    rows = pd.concat(read) if read else pd.DataFrame(columns=["task", "device", "seed"])
    return rows[rows.task.isin(list(tasks))]


def devices_of(read: Sequence[pd.DataFrame], tasks: Iterable[str]) -> str:
    """The devices (``cpu``, ``cuda``, ...) that made the records ``read`` of ``tasks``: a claim resting on two
    says so (issue 21: no claim should compare rows made on different devices). A device that learned a record's λ
    (``lambda_device``) and made none of the records is named with ``(λ)``, e.g. ``cpu, cuda (λ)``."""
    rows = _rows_read(read, tasks)

    def kinds(column):
        return set(rows[column].dropna().astype(str).str.split(":").str[0]) if column in rows else set()

    made = kinds("device")
    learned = kinds("lambda_device") - made - {"not recorded"}
    return ", ".join(sorted(made) + [f"{kind} (λ)" for kind in sorted(learned)])


def _select(frame: pd.DataFrame, matrix_type: str, fraction: float, order: str = "none",
            source: str | None = "own", record: bool = True) -> pd.DataFrame:
    """Rows of one configuration; ``source`` ``'own'``: matrices from the row's task, else a task name or None.
    ``record=False``: rows looked at only to choose a comparison (the best data-free type, the best other order),
    which the claim then reads with :func:`_seen`."""
    rows = frame[(frame.matrix_type == matrix_type) & np.isclose(frame.fraction.astype(float), fraction)
                 & (frame.selection_order.fillna("none") == order)]
    if source == "own":
        rows = rows[own_text(rows)]
    elif source is not None:
        rows = rows[rows.matrices_from == source]
    return _seen(rows) if record else rows


_UNIT = "declared"  # the unit claims are computed in (:func:`_in_unit`); the declared one unless a sensitivity
_FLOORS: dict[str, float] = {}  # task -> majority-class score (chance-corrected units)
_MARGINS: dict[str, float] = {}  # task -> mean original score minus the majority-class score


def majority_floor(frame: pd.DataFrame, task: str) -> float:
    """The task's majority-class score in the records (``majority_baseline``), NaN when they carry none."""
    if "majority_baseline" not in frame:
        return float("nan")
    values = frame.loc[frame.task == task, "majority_baseline"].dropna()
    return float(values.iloc[0]) if len(values) else float("nan")


@contextmanager
def _in_unit(unit: str, frame: pd.DataFrame):
    """Compute the claims inside the block in ``unit`` (:data:`UNITS`): ``declared``, ``absolute`` (score
    differences) or ``chance`` (divided by the original's margin over the majority class)."""
    global _UNIT, _FLOORS, _MARGINS
    saved = _UNIT, _FLOORS, _MARGINS
    if unit != "declared":  # the declared unit reads neither floors nor margins (:func:`_pair`)
        originals = frame[frame.matrix_type == "original"]
        _FLOORS = {t: majority_floor(frame, t) for t in set(frame.task)}
        _MARGINS = {t: float(g.value.mean()) - _FLOORS[t] for t, g in originals.groupby("task")}
    _UNIT = unit
    try:
        yield
    finally:
        _UNIT, _FLOORS, _MARGINS = saved


def _scaled(estimate: Estimate, scale: float) -> Estimate:
    if not np.isfinite(scale) or scale == 0:
        return _NO_ESTIMATE
    return Estimate(estimate.value / scale, estimate.se / abs(scale), estimate.df,
                    tuple((v / scale ** 2, d) for v, d in estimate.parts))


def _pair(reference: pd.Series, variant: pd.Series, kind: str, task: str) -> Estimate:
    """:func:`paired` in the unit claims are being computed in (the declared one, or a sensitivity's)."""
    if _UNIT == "declared":
        return paired(reference, variant, kind)
    if _UNIT == "absolute":
        d = paired(reference, variant, "difference")
        return Estimate(-d.value, d.se, d.df, d.parts) if kind == "drop" else d
    if kind == "difference":  # already absolute: as a share of the original's margin over guessing
        return _scaled(paired(reference, variant, "difference"), _MARGINS.get(task, float("nan")))
    floor = _FLOORS.get(task, float("nan"))
    return paired(reference, variant, kind, floor=floor) if np.isfinite(floor) else _NO_ESTIMATE


def original_rows(frame: pd.DataFrame) -> pd.DataFrame:
    return _seen(frame[frame.matrix_type == "original"])


def _by_seed(rows: pd.DataFrame) -> dict[str, pd.Series]:
    """Per task: values indexed by seed id (duplicate seeds are an error in the records)."""
    out = {}
    for task, group in rows.groupby("task"):
        if group.seed.duplicated().any():
            raise ValueError(f"claims: task {task} has two records for seed(s) "
                             f"{sorted(group.seed[group.seed.duplicated()].tolist())} of one configuration")
        out[task] = group.set_index("seed").value.astype(float).sort_index()
    return out


def seed_mismatches(frame: pd.DataFrame) -> list[str]:
    """Configurations with a seed id their task's original runs lack (pairing would drop that run). A variant with
    fewer seeds than the original (λ at 5 seeds beside 10) pairs on the seeds it has: not a mismatch."""
    keys = ["task", "matrix_type", "matrices_from", "selection_order", "fraction"]
    originals = {t: set(s.index) for t, s in _by_seed(original_rows(frame)).items()}
    out = []
    for key, group in frame.fillna({"matrices_from": "", "selection_order": "none"}).groupby(keys):
        if key[1] != "original" and key[0] in originals and not set(group.seed) <= originals[key[0]]:
            out.append(f"{key[0]}/{key[1]}/{key[2] or '-'}/{key[3]}/{key[4]:g}: seeds {sorted(set(group.seed))}")
    return out


def _seed_note(read: Sequence[pd.DataFrame], tasks: Iterable[str]) -> str:
    """``''``, or what the seed counts of the configurations a claim read on ``tasks`` were when they differ."""
    counts = seeds_per_config(_rows_read(read, tasks))
    if counts.empty or counts.min() == counts.max():
        return ""
    return f"{counts.min()} to {counts.max()} seeds per configuration, each comparison on the seeds both have"


def above_guessing(ci_low, n, floor):
    """Decision rule R3's test (``data/paper/decision_rules.csv``): is a score above guessing? True where its
    Student-t 95% interval over ``n`` seeds lies above the task's majority-class score ``floor`` (``ci_low >
    floor``); one seed has no interval, so is not above; no baseline recorded (``floor`` NaN): above. Element-wise
    over scalars, arrays or Series (by position); a Series in gives a boolean Series on its index out, else a
    boolean array (a bool for scalars)."""
    low, count, base = (np.asarray(x, float) for x in (ci_low, n, floor))
    above = ~np.isfinite(base) | ((count > 1) & np.isfinite(low) & (low > base))
    index = next((x.index for x in (ci_low, n, floor) if isinstance(x, pd.Series)), None)
    if index is not None:
        return pd.Series(np.broadcast_to(above, (len(index),)), index=index)
    return above if above.ndim else bool(above)


#: The fields that name one configuration a claim reads (:func:`below_floor_configurations`).
CONFIGURATION_KEYS = ("matrix_type", "matrices_from", "selection_order", "fraction")


def below_floor_configurations(frame: pd.DataFrame, read: Sequence[pd.DataFrame], task: str) -> list[dict]:
    """The configurations a claim read on ``task`` that are not above guessing (:func:`above_guessing`), each as a
    dict of :data:`CONFIGURATION_KEYS` (``matrices_from`` ``""`` and ``selection_order`` ``"none"`` where the records
    have none); empty when the task enters the claim (decision rule R3)."""
    floor = majority_floor(frame, task)
    rows = _rows_read(read, [task])
    if not np.isfinite(floor) or rows.empty:
        return []
    out = []
    for key, group in rows.drop_duplicates("run_id" if "run_id" in rows else None).fillna(
            {"matrices_from": "", "selection_order": "none"}).groupby(list(CONFIGURATION_KEYS)):
        values = group.value.to_numpy(float)
        if not above_guessing(one_sample(values).low, len(values), floor):
            out.append({"matrix_type": str(key[0]), "matrices_from": str(key[1]), "selection_order": str(key[2]),
                        "fraction": float(key[3])})
    return out


def configuration_name(configuration: Mapping) -> str:
    """A configuration as the claims table's ``tasks`` column names it: ``original``, ``average at 0``,
    ``average at 0.5 (lambda)``."""
    c = configuration
    return c["matrix_type"] if c["matrix_type"] == "original" else f"{c['matrix_type']} at {c['fraction']:g}" + (
        f" ({c['selection_order']})" if c["selection_order"] not in ("none", "") else "")


def below_floor(frame: pd.DataFrame, read: Sequence[pd.DataFrame], task: str) -> list[str]:
    """:func:`below_floor_configurations` by name (:func:`configuration_name`)."""
    return [configuration_name(c) for c in below_floor_configurations(frame, read, task)]


def informative_tasks(frame: pd.DataFrame) -> tuple[list[str], list[str]]:
    """``(included, left_out)``: the tasks whose original probe is above guessing (:func:`above_guessing`, on the
    records' ``majority_baseline``), and the others (decision rule R2)."""
    included, left_out = [], []
    for task, values in _by_seed(original_rows(frame)).items():
        low = one_sample(values.to_numpy()).low
        (included if above_guessing(low, len(values), majority_floor(frame, task)) else left_out).append(task)
    return ordered_tasks(included), ordered_tasks(left_out)


# ---------------------------------------------------------------------------------------------- statistics
@dataclass
class Measured:
    """One claim's statistic on one task set: the estimate, the verdict, the tasks it used and what was missing."""

    estimate: Estimate
    verdict: str
    tasks: list
    missing: list
    note: str = ""
    decided_by: str = ""


def _not_measured(missing: list, note: str = "") -> Measured:
    return Measured(_NO_ESTIMATE, "not measured", [], missing, note)


def _task_drops(frame, variant_rows, tasks, kind="drop", reference=None, variant=None):
    reference = _by_seed(original_rows(frame)) if reference is None else reference
    variant = _by_seed(variant_rows) if variant is None else variant
    used = [t for t in tasks if t in reference and t in variant]
    per_task = {t: _pair(reference[t], variant[t], kind, t) for t in used}
    per_task = {t: e for t, e in per_task.items() if np.isfinite(e.value)}  # a reference score of 0: undefined
    return per_task, [t for t in tasks if t not in per_task]


def _band_measure(per_task: dict, missing: list, rule, combine="average") -> Measured:
    if not per_task:
        return _not_measured(missing)
    if combine == "average":
        estimate = average(list(per_task.values()))
        note = ""
    else:  # the worst task (largest drop)
        worst = max(per_task, key=lambda t: per_task[t].value)
        estimate, note = per_task[worst], f"worst task: {worst}"
    verdict = decide(rule.test, estimate.low, estimate.high, rule.low, rule.high)
    return Measured(estimate, verdict, list(per_task), missing, note)


def every_unit_verdicts(per_unit: Mapping, rule) -> tuple[dict, dict, dict]:
    """An every-task / every-fraction claim unit by unit (decision rules R4, R5): a unit agrees when H0
    ``value <= low`` is rejected, and differs when H0 ``value >= low - δ`` is rejected (δ: the rule's
    ``min_effect``), each by Holm's step-down over the claim's units at family-wise α = 0.05 (one-sided Student-t
    p-values). Returns (verdicts, Holm-adjusted p of agreeing, of differing)."""
    delta = float(rule.min_effect) if np.isfinite(rule.min_effect) else 0.0
    p_agree = holm({u: one_sided_p(e, rule.low, greater=True) for u, e in per_unit.items()})
    p_differ = holm({u: one_sided_p(e, rule.low - delta, greater=False) for u, e in per_unit.items()})
    verdicts = {u: "differs" if p_differ[u] <= FAMILY_ALPHA else "agrees" if p_agree[u] <= FAMILY_ALPHA
                else "inconclusive" for u in per_unit}
    return verdicts, p_agree, p_differ


def _every_measure(per_unit: dict, missing: list, rule, unit_name=str) -> Measured:
    if not per_unit:
        return _not_measured(missing)
    verdicts, p_agree, p_differ = every_unit_verdicts(per_unit, rule)
    verdict = decide_every(verdicts.values(), complete=not missing)
    if verdict == "differs":  # the unit that differs most clearly
        decided = min((u for u in per_unit if verdicts[u] == "differs"), key=lambda u: p_differ[u])
    else:  # the weakest unit: the one furthest from agreeing
        decided = max(per_unit, key=lambda u: p_agree[u] if np.isfinite(p_agree[u]) else 2.0)

    def p_text(p):
        return "—" if not np.isfinite(p) else f"{p:.2g}"

    parts = "; ".join(f"{unit_name(u)}: {ours_text({'ours': e.value, 'ci_low': e.low, 'ci_high': e.high})} "
                      f"{verdicts[u]} (Holm p: {p_text(p_agree[u])} above {rule.low:g}, {p_text(p_differ[u])} "
                      f"below -δ)" for u, e in per_unit.items())
    return Measured(per_unit[decided], verdict, list(per_unit), missing,
                    f"decided by {unit_name(decided)}; {parts}", decided_by=str(unit_name(decided)))


def _c1(frame, tasks, rule, combine):
    per_task, missing = _task_drops(frame, _select(frame, "average", 0.0), tasks)
    return _band_measure(per_task, missing, rule, combine)


#: C2 (declared 2026-12-01, after the data, decision rule R7): half of the heads constant may lose at most this
#: share of what every head constant loses.
C2_SHARE = 0.25


def lambda_order(frame: pd.DataFrame) -> str:
    """The λ order of one model's records: ``lambda`` (λ learned per task with its probe), or ``lm_lambda`` for a
    decoder whose records rank heads by the λ learned on its own LM loss (decision rule R10)."""
    orders = set(frame.selection_order.dropna()) if "selection_order" in frame else set()
    return "lm_lambda" if "lm_lambda" in orders and "lambda" not in orders else "lambda"


def _c2(frame, tasks, rule):
    """C2: drop(½, λ order) - ¼ · drop(all constant), seed-paired (the combination is one relative drop of the
    per-seed score ``s_½ + ¼ (s_orig - s_0)``); at most 0 keeps three quarters of what constant heads lose."""
    half = _by_seed(_select(frame, "average", 0.5, lambda_order(frame)))
    zero = _by_seed(_select(frame, "average", 0.0))
    orig = _by_seed(original_rows(frame))
    combined = {}
    for task in set(half) & set(zero) & set(orig):
        seeds = sorted(set(half[task].index) & set(zero[task].index) & set(orig[task].index))
        combined[task] = half[task].loc[seeds] + C2_SHARE * (orig[task].loc[seeds] - zero[task].loc[seeds])
    per_task, missing = _task_drops(frame, None, tasks, reference=orig, variant=combined)
    return _band_measure(per_task, missing, rule)


def _c4_units(frame, tasks) -> tuple[dict, dict, list]:
    """Per task: the best data-free type (by mean) and average minus it, seed-paired; the tasks not measured."""
    average_rows = _by_seed(_select(frame, "average", 0.0))
    free_rows = {kind: _select(frame, kind, 0.0, source=None, record=False) for kind in DATA_FREE}
    free = {kind: _by_seed(rows) for kind, rows in free_rows.items()}
    per_task, best_of, missing = {}, {}, []
    for task in tasks:
        if task not in average_rows or not all(task in free[k] for k in DATA_FREE):
            missing.append(task)
            continue
        best_of[task] = max(DATA_FREE, key=lambda k: free[k][task].mean())
        _seen(free_rows[best_of[task]][free_rows[best_of[task]].task == task])
        per_task[task] = _pair(free[best_of[task]][task], average_rows[task], "difference", task)
    return per_task, best_of, missing


def _c4(frame, tasks, rule):
    per_task, _, missing = _c4_units(frame, tasks)
    return _every_measure(per_task, missing, rule)


def data_free_margins(frame: pd.DataFrame) -> pd.DataFrame:
    """C4 task by task, for one model's records: the best data-free type, average minus it (seed-paired) with its
    Student-t 95% interval, the task's verdict under C4's band, and whether the task enters C4 (the inclusion rule).
    The claim's verdict is C4's row of :func:`claims_table`."""
    rule = rules().loc["C4"]
    with _reading() as read:
        per_task, best_of, _ = _c4_units(frame, ordered_tasks(set(frame.task)))
    verdicts, p_agree, _ = every_unit_verdicts(per_task, rule)
    return pd.DataFrame([{"task": t, "best data-free": best_of[t], "average minus best data-free": e.value,
                          "ci_low": e.low, "ci_high": e.high, "verdict": verdicts[t], "holm_p": p_agree[t],
                          "enters C4": not below_floor(frame, read, t)} for t, e in per_task.items()],
                        columns=["task", "best data-free", "average minus best data-free", "ci_low", "ci_high",
                                 "verdict", "holm_p", "enters C4"])


def _c5(frame, tasks, rule):
    own = _by_seed(_select(frame, "average", 0.0))
    per_task, missing = _task_drops(frame, _select(frame, "average", 0.0, source="mnli"),
                                    [t for t in tasks if t != "mnli"], kind="change", reference=own)
    return _band_measure(per_task, missing, rule)


FRACTION_LABELS = {0.5: "½", 0.125: "⅛", 0.0625: "1/16"}


def _c6(frame, tasks, rule, which):
    if "mnli" not in tasks:
        return _not_measured(["mnli"], "MNLI is not among the included tasks")
    mnli = frame[(frame.task == "mnli") & own_text(frame)]
    per_fraction, missing = {}, []
    for fraction in FIG5_FRACTIONS:
        rows = {o: _select(mnli, "average", fraction, o, source=None, record=False) for o in ORDERS}
        runs = {o: _by_seed(r).get("mnli") for o, r in rows.items()}
        if any(v is None for v in runs.values()):
            missing.append(fraction)
            continue
        means = {o: v.mean() for o, v in runs.items()}
        if which == "lambda":
            best = max((o for o in ORDERS if o != "lambda"), key=means.get)
            compared = (best, "lambda")
        else:
            worst = min((o for o in ORDERS if o != "reversed"), key=means.get)
            compared = ("reversed", worst)
        for order in compared:
            _seen(rows[order])
        per_fraction[fraction] = _pair(runs[compared[0]], runs[compared[1]], "difference", "mnli")
    return _every_measure(per_fraction, missing, rule, unit_name=lambda f: FRACTION_LABELS.get(f, f"{f:g}"))


PER_MODEL = {
    "C1a": lambda frame, tasks, rule: _c1(frame, tasks, rule, "average"),
    "C1b": lambda frame, tasks, rule: _c1(frame, tasks, rule, "worst"),
    "C2": _c2,
    "C4": _c4,
    "C5": _c5,
    "C6a": lambda frame, tasks, rule: _c6(frame, tasks, rule, "lambda"),
    "C6b": lambda frame, tasks, rule: _c6(frame, tasks, rule, "reversed"),
}


def _fmt_tasks(measured: Measured, left_out: Mapping[str, list]) -> str:
    """The ``tasks`` column; ``left_out``: task -> the names of its configurations not above guessing."""
    text = ", ".join(str(FRACTION_LABELS.get(t, t)) for t in measured.tasks) if measured.tasks else "none"
    if left_out:
        text += " (left out: " + "; ".join(f"{t} — {', '.join(c)} not above its majority baseline"
                                           for t, c in left_out.items()) + ")"
    if measured.missing:
        text += f" (not measured: {', '.join(str(FRACTION_LABELS.get(m, m)) for m in measured.missing)})"
    if measured.note:
        text += f"; {measured.note}"
    return text


def _row(model, claim, rule, measured: Measured | None, tasks_text: str, sensitivity: Measured | None,
         verdict: str | None = None) -> dict:
    estimate = measured.estimate if measured else _NO_ESTIMATE
    other = sensitivity.estimate if sensitivity else _NO_ESTIMATE
    return {
        "model": model,
        "claim": claim,
        "statement": rule.statement,
        "statistic": rule.statistic,
        "tasks": tasks_text,
        "paper": rule.paper_value,
        "ours": estimate.value,
        "ci_low": estimate.low,
        "ci_high": estimate.high,
        "df": estimate.df,
        "verdict": verdict or measured.verdict,
        "ours_all_tasks": other.value,
        "ci_low_all_tasks": other.low,
        "ci_high_all_tasks": other.high,
        "verdict_all_tasks": (sensitivity.verdict if sensitivity else (verdict or "")),
        "rule": rule_text(rule),
        "chapter": rule.chapter,
        "devices": "",
        "verdict_text": verdict_words(rule, verdict or measured.verdict),
        "decided_by": measured.decided_by if measured else "",
        "absolute": "", "verdict_absolute": "", "chance_corrected": "", "verdict_chance_corrected": "",
        "verdict_per_type": "", "unit_dependent": "",
    }


def _with_units(row: dict, alternatives: Mapping[str, Measured]) -> dict:
    """A row's verdicts in the sensitivity units (decision rule R6) and whether the verdict depends on the unit."""
    for unit, column in (("absolute", "absolute"), ("chance", "chance_corrected")):
        e = alternatives[unit].estimate
        row[column] = ours_text({"ours": e.value, "ci_low": e.low, "ci_high": e.high})
        row[f"verdict_{column}"] = alternatives[unit].verdict
    seen = {row["verdict"]} | {row[f"verdict_{c}"] for c in ("absolute", "chance_corrected", "per_type")
                               if row[f"verdict_{c}"]}
    row["unit_dependent"] = "yes" if len(seen) > 1 else "no"
    return row


def inclusion(frame: pd.DataFrame, compute, rule) -> tuple[Measured, dict[str, list[dict]], list[str]]:
    """Decision rule R3 for one claim on one model's records: ``(the claim on every task, {task left out: the
    configurations it reads there that are not above the majority baseline}, the tasks that enter)``
    (:func:`below_floor_configurations`). A task enters when every configuration the claim reads on it is above
    guessing."""
    every = ordered_tasks(set(frame.task))
    with _reading() as read_every:
        sensitivity = compute(frame, every, rule)
    left_out = {t: why for t in every if (why := below_floor_configurations(frame, read_every, t))}
    return sensitivity, left_out, [t for t in every if t not in left_out]


def claim_tasks(frame: pd.DataFrame, claim: str) -> dict:
    """The task sets behind one model's row of ``claim`` (C1a-C6b, :func:`model_claims`), as data for a sentence:
    ``included`` (the tasks, or C6's fractions, its statistic was computed on), ``left_out`` (decision rule R3: task
    -> :func:`below_floor_configurations`; for C6a and C6b only MNLI, the one task they read) and ``not_measured``
    (included tasks, or C6's fractions, whose rows are missing). ``frame`` holds one model's records."""
    rule, compute = rules().loc[claim], PER_MODEL[claim]
    _, left_out, included = inclusion(frame, compute, rule)
    measured = compute(frame, included, rule)
    return {"included": list(measured.tasks), "left_out": _shown_left_out(claim, left_out),
            "not_measured": list(measured.missing)}


def _shown_left_out(claim: str, left_out: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """The left-out tasks a claim's row names: for C6a and C6b only MNLI, the one task they read."""
    return left_out if not claim.startswith("C6") else {t: why for t, why in left_out.items() if t == "mnli"}


def model_claims(frame: pd.DataFrame, model: str | None = None) -> list[dict]:
    """C1a-C6b for one model's records (the rows' ``model``), each on the included tasks and on every task."""
    table = rules()
    model = model or (str(frame.model.iloc[0]) if len(frame) else "this model")
    rows = []
    for claim, compute in PER_MODEL.items():
        rule = table.loc[claim]
        sensitivity, left_out, included = inclusion(frame, compute, rule)
        with _reading() as read:
            measured = compute(frame, included, rule)
        alternatives = {}
        for unit in UNITS[1:]:
            with _in_unit(unit, frame):
                alternatives[unit] = compute(frame, included, rule)
        shown = {t: [configuration_name(c) for c in why] for t, why in _shown_left_out(claim, left_out).items()}
        row = _with_units(_row(model, claim, rule, measured, _fmt_tasks(measured, shown), sensitivity), alternatives)
        if measured.tasks:
            used = ["mnli"] if claim.startswith("C6") else measured.tasks
            row["devices"] = devices_of(read, used)
            row["tasks"] += f"; {note}" if (note := _seed_note(read, used)) else ""
        rows.append(row)
    return rows


def cross_model_claims(frames: Mapping[str, pd.DataFrame]) -> list[dict]:
    """C3 when the records hold two models of known size: the larger's task-averaged all-constant drop minus the
    smaller's, over the tasks included for both; else one row ``not testable: <why>``."""
    table = rules()
    rule = table.loc["C3"]
    known = sorted((m for m in frames if m in MODEL_PARAMETERS), key=MODEL_PARAMETERS.get)
    if len(known) < 2:
        why = (f"needs the records of two models of different size; these hold {', '.join(frames) or 'none'}")
        return [_row(" vs ".join(frames) or "—", "C3", rule, None, "", None, f"not testable: {why}")]
    # decision rule R3 on C3's rows, which are C1a's (the original and every head constant)
    entering = {m: set(inclusion(frames[m], PER_MODEL["C1a"], table.loc["C1a"])[2]) for m in known}
    rows = []
    for small, large in itertools.pairwise(known):
        per, devices = {}, ""
        for kind, restrict in (("included", True), ("every", False), ("absolute", True), ("chance", True)):
            shared = sorted(set.intersection(*[entering[m] if restrict else set(frames[m].task)
                                               for m in (small, large)]))
            drops = {}
            with _reading() as read:
                for m in (small, large):
                    unit = kind if kind in UNITS else "declared"
                    with _in_unit(unit, frames[m]):
                        drops[m] = _task_drops(frames[m], _select(frames[m], "average", 0.0),
                                               ordered_tasks(shared))[0]
            common = [t for t in ordered_tasks(shared) if all(t in drops[m] for m in (small, large))]
            if not common:
                per[kind] = _not_measured(shared)
                continue
            estimate = difference(average([drops[large][t] for t in common]),
                                  average([drops[small][t] for t in common]))
            per[kind] = Measured(estimate, decide("direction", estimate.low, estimate.high, rule.low, rule.high),
                                 common, [], f"{large} minus {small}")
            if kind == "included":  # the verdict's rows; "every" is the sensitivity column
                devices = devices_of(read, common)
        row = _row(f"{small} vs {large}", "C3", rule, per["included"], _fmt_tasks(per["included"], {}),
                   per["every"])
        row = _with_units(row, {u: per[u] for u in ("absolute", "chance")})
        rows.append({**row, "devices": devices})
    return rows


def _is_decoder(model: str) -> bool:
    from ..core.models import DECODER_NAMES

    return str(model) in DECODER_NAMES or str(model).split("/")[-1] in DECODER_NAMES


def norm_claims(analysis_dir: str | Path, model: str = "") -> list[dict]:
    """C8a-c (C8c and C9 for a decoder LM) from the norm analyses' ``kobayashi_findings.csv`` in ``analysis_dir``
    (:mod:`papa_lib.analysis.norm_findings`): Spearman ρ with its cluster-bootstrap interval over sequences, decided
    by the ``correlation`` test (minimum |ρ| 0.1), C8c also over token types (``corpus_frequency.csv``,
    :func:`per_type_correlation`); ``not measured`` rows for findings it lacks."""
    source = Path(analysis_dir) / "kobayashi_findings.csv"
    types = Path(analysis_dir) / "corpus_frequency.csv"
    findings = pd.read_csv(source) if source.exists() else pd.DataFrame()
    found = findings.set_index("finding") if len(findings) else pd.DataFrame()
    per_type = per_type_correlation(pd.read_csv(types)) if types.exists() else None
    findings_of = DECODER_NORM_FINDINGS if _is_decoder(model) else NORM_FINDINGS  # claim -> finding
    table = rules()
    rows = []
    for claim, finding in findings_of.items():
        rule = table.loc[claim]
        if finding not in found.index:
            rows.append(_row(model, claim, rule, None, "", None, f"not measured: needs {source} with a {finding} row"))
            continue
        found_row = found.loc[finding]
        estimate = Estimate(float(found_row.spearman_rho), float("nan"), float("nan"))
        low, high = float(found_row.ci_low), float(found_row.ci_high)
        verdict = decide("correlation", low, high, rule.low, rule.high, rule.min_effect)
        sampled = f", {int(found_row.n)} sampled" if int(found_row.n) < int(found_row.n_seen) else ""
        unit = "occurrences" if finding.startswith("frequency") else "pairs"
        text = (f"{int(found_row.n_seen)} {unit}{sampled}; {int(found_row.n_clusters)} sequences; 95% interval: "
                "cluster bootstrap over sequences")
        row = _row(model, claim, rule, Measured(estimate, verdict, [], []), text, None)
        row.update(ci_low=low, ci_high=high, df=float("nan"), ours_all_tasks=estimate.value, ci_low_all_tasks=low,
                   ci_high_all_tasks=high, verdict_all_tasks=verdict)
        if claim == "C8c" and per_type is not None:  # decision rule R6: the same correlation over token types
            rho, t_low, t_high, n_types = per_type
            row["verdict_per_type"] = decide("correlation", t_low, t_high, rule.low, rule.high, rule.min_effect)
            row["tasks"] += (f"; over {n_types} token types: ρ {sig3(rho)} [{sig3(t_low)}, {sig3(t_high)}] "
                             "(Fisher z interval)")
        row["unit_dependent"] = "yes" if row["verdict_per_type"] and row["verdict_per_type"] != verdict else "no"
        rows.append(row)
    return rows


def objective_claims(frame: pd.DataFrame, lm_records: Sequence[Mapping], model: str) -> list[dict]:
    """C10 for one decoder (decision rule R12): the share of its advantage over a no-information baseline that every
    head constant loses on its own LM loss (windows resampled, :func:`papa_lib.experiments.lm.constant_share`)
    minus the same share on its probes (C1a's statistic in the chance-corrected unit, on the tasks R3 includes);
    decided by the two intervals (the LM's above the probes': agrees), with C1a's relative drop as the sensitivity
    unit."""
    from ..experiments.lm import constant_share

    rule, c1a = rules().loc["C10"], rules().loc["C1a"]
    needed = {("original", "none"), ("average", "all"), ("unigram", "none")}
    if not len(frame) or "task" not in frame or not needed <= {(r["matrix_type"], r["order"]) for r in lm_records}:
        why = "needs the decoder's probe records and its LM records (original, every head constant, unigram)"
        return [_row(model, "C10", rule, None, "", None, f"not measured: {why}")]
    included = inclusion(frame, PER_MODEL["C1a"], c1a)[2]
    per_unit = {}
    for unit, lm_unit in (("chance", "chance"), ("declared", "relative")):
        with _in_unit(unit, frame):
            probes = _c1(frame, included, c1a, "average").estimate
        lm = constant_share(lm_records, lm_unit)
        low, high = lm.low - probes.high, lm.high - probes.low
        per_unit[lm_unit] = (lm, probes, Measured(Estimate(lm.value - probes.value, float("nan"), float("nan")),
                                                  decide(rule.test, low, high, rule.low, rule.high), included, [],
                                                  ""), low, high)
    lm, probes, measured, low, high = per_unit["chance"]
    text = (f"LM: {sig3(lm.value)} [{sig3(lm.low)}, {sig3(lm.high)}] of its advantage over the unigram baseline "
            f"(bootstrap over {len(lm_records[0]['window_nll'])} test windows); probes: {sig3(probes.value)} "
            f"[{sig3(probes.low)}, {sig3(probes.high)}] of theirs over the majority class, on "
            f"{', '.join(included) or 'no task'}")
    row = _row(model, "C10", rule, measured, text, None)
    row.update(ci_low=low, ci_high=high, df=float("nan"))
    r_lm, r_probes, r_measured, r_low, r_high = per_unit["relative"]
    row["absolute"] = ours_text({"ours": r_measured.estimate.value, "ci_low": r_low, "ci_high": r_high})
    row["verdict_absolute"] = r_measured.verdict
    row["tasks"] += (f"; relative drop (sensitivity): LM {sig3(r_lm.value)} [{sig3(r_lm.low)}, {sig3(r_lm.high)}], "
                     f"probes {sig3(r_probes.value)} [{sig3(r_probes.low)}, {sig3(r_probes.high)}]")
    row["unit_dependent"] = "yes" if r_measured.verdict != measured.verdict else "no"
    return [row]


def per_type_correlation(types: pd.DataFrame | None) -> tuple[float, float, float, int] | None:
    """C8c over token types instead of occurrences: Spearman ρ of each type's corpus frequency rank and its mean
    ‖f(x)‖ (``corpus_frequency.csv`` of the norm analyses), with a Fisher z 95% interval (variance
    1.06 / (n - 3): :func:`~papa_lib.analysis.norm_statistics.fisher_interval`)."""
    from scipy import stats

    from .norm_statistics import fisher_interval

    if types is None or len(types) < 4 or not {"corpus_rank", "mean_fx_norm"} <= set(types):
        return None
    rho = float(stats.spearmanr(types.corpus_rank, types.mean_fx_norm).statistic)
    low, high = fisher_interval(rho, len(types), CONFIDENCE, variance_factor=1.06)
    return rho, low, high, len(types)


def _analysis_model(analysis_dir: Path) -> str | None:
    meta = Path(analysis_dir) / "metadata.json"
    if not meta.exists():
        return None
    name = str(json.loads(meta.read_text()).get("model", ""))
    return next((m for m in MODEL_PARAMETERS if m.lower() in name.lower()), None)


def claims_table(frame: pd.DataFrame | Mapping[str, pd.DataFrame],
                 analysis_dir: str | Path | Mapping[str, str | Path] | None = None,
                 lm: Mapping[str, Sequence[Mapping]] | None = None) -> pd.DataFrame:
    """Every claim's verdict: per model (``frame`` may hold several models' records, or map model -> records),
    the cross-model C3, C7, C8 (C9 for a decoder) from each model's norm analyses (``analysis_dir``: one folder,
    for the first model, or model -> folder), and C10 for each decoder whose LM records ``lm`` maps it to
    (:func:`papa_lib.experiments.lm.lm_records`)."""
    if isinstance(frame, Mapping):
        frames = {m: f for m, f in frame.items() if len(f)}
    else:
        frames = {str(m): g for m, g in frame.groupby("model", sort=False)} if len(frame) else {}
    if isinstance(analysis_dir, (str, Path)):
        analysis_dir = {next(iter(frames), _analysis_model(Path(analysis_dir)) or ""): analysis_dir}
    analysis_dir = analysis_dir or {}
    table = rules()
    rows = []
    for model, records in frames.items():
        rows += model_claims(records, model)
    rows += cross_model_claims(frames)
    names = ", ".join(frames) or "no model"
    for claim, why in NOT_TESTABLE.items():
        rows.append(_row(" vs ".join(frames) or "—", claim, table.loc[claim], None, "", None,
                         f"not testable: {why.format(models=names)}"))
    for model in frames:
        if model in analysis_dir:
            rows += norm_claims(analysis_dir[model], model)
    for model, records in (lm or {}).items():
        rows += objective_claims(frames.get(model, pd.DataFrame()), records, model)
    order = {c: i for i, c in enumerate(table.index)}
    return (pd.DataFrame(rows, columns=COLUMNS).sort_values("claim", key=lambda c: c.map(order), kind="stable")
            .reset_index(drop=True))


# ---------------------------------------------------------------------------------------------- files
#: the committed local results folders whose records meet in one claims table (one per model)
LOCAL_FOLDERS = ("local-minilm", "local-mpnet", "local-gemma")
NORMS_FOLDERS = {"all-MiniLM-L6-v2": "norms-minilm/analysis", "gemma-3-270m": "local-gemma/analysis"}


def read_lm(folders: Sequence[str | Path]) -> dict[str, list[dict]]:
    """model -> the LM records (:func:`papa_lib.experiments.lm.lm_records`) of each folder that has some."""
    from ..experiments.lm import lm_records

    out: dict[str, list[dict]] = {}
    for folder in folders:
        for record in lm_records(folder):
            out.setdefault(str(record["model"]), []).append(record)
    return out


def read_folders(folders: Sequence[str | Path]) -> dict[str, pd.DataFrame]:
    """model -> records (:func:`papa_lib.experiments.results.read_results`) of each folder that has a ``results.csv``
    (a folder may hold several models)."""
    frames: dict[str, pd.DataFrame] = {}
    for folder in folders:
        if (Path(folder) / "results.csv").exists():
            records = read_results(folder)
            for model, group in records.groupby("model", sort=False):
                frames[str(model)] = pd.concat([frames[str(model)], group]) if str(model) in frames else group
    return frames


def local_claims(root: str | Path) -> pd.DataFrame:
    """The claims of the committed local records under ``root/data/results`` (every model of
    :data:`LOCAL_FOLDERS`; C8 from :data:`NORMS_FOLDERS`)."""
    results = Path(root) / "data" / "results"
    folders = [results / f for f in LOCAL_FOLDERS]
    frames = read_folders(folders)
    return claims_table(frames, {m: results / f for m, f in NORMS_FOLDERS.items() if m in frames}, read_lm(folders))


def write_claims(results_dir: str | Path, analysis_dir: str | Path | Mapping | None = None,
                 also: Sequence[str | Path] = ()) -> Path:
    """:func:`claims_table` of ``results_dir/results.csv`` (and of the folders ``also``), written to
    ``results_dir/claims.csv``."""
    results_dir = Path(results_dir)
    folders = [results_dir, *also]
    table = claims_table(read_folders(folders), analysis_dir, read_lm(folders))
    path = results_dir / "claims.csv"
    table.to_csv(path, index=False, float_format="%.4g")
    return path


def write_local_claims(root: str | Path) -> list[Path]:
    """Regenerate ``claims.csv`` in every committed local results folder that has records."""
    table = local_claims(root)
    paths = []
    for folder in LOCAL_FOLDERS:
        path = Path(root) / "data" / "results" / folder
        if (path / "results.csv").exists():
            table.to_csv(path / "claims.csv", index=False, float_format="%.4g")
            paths.append(path / "claims.csv")
    return paths


def for_setup(setup) -> pd.DataFrame | None:
    """The claims table of a chapter's setup (:func:`papa_lib.book.profiles.resolve`): its results folder's records;
    under the ``local`` profile also every other committed local model (:data:`LOCAL_FOLDERS`) and C8 from the
    committed norm analyses (:data:`NORMS_FOLDERS`). None without records."""
    if setup.results_dir is None:
        return None
    folders = [Path(setup.results_dir)]
    norms = {}
    if setup.profile == "local":
        results = Path(setup.root) / "data" / "results"
        folders += [results / f for f in LOCAL_FOLDERS if (results / f).resolve() != folders[0].resolve()]
        norms = {m: results / f for m, f in NORMS_FOLDERS.items()}
    frames = read_folders(folders)
    if not frames:
        return None
    return claims_table(frames, {m: f for m, f in norms.items() if m in frames}, read_lm(folders))
