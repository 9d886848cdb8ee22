"""The paper's claims, checked against our records: one verdict per claim, with the statistic, the paper's value, ours,
a 95% interval and the rule that turns them into a verdict (``claims.csv``, shown in the intro chapter).

The statistics are computed as the paper computes them:

* the relative drop of a (model, task) is ``(s_orig - s) / |s_orig|`` on the mean over seeds (Sec. 4.2, Fig. 3);
* the 8% average and the 20% bound (Sec. 4.2) are on a model's drop averaged over the six tasks: Fig. 3 plots one
  point per model, and the paper's own Table 1 has a 34% CoLA drop for RoBERTa-base, so a per-task maximum would make
  the paper contradict itself (:func:`paper_model_drops` recomputes them from Tables 1 and 4);
* intervals come from resampling the seeds of every configuration with replacement (a percentile bootstrap), so
  they show the variance between probe seeds (and, where a subset is drawn per seed, between training subsets);
* a task enters C1, C2, C4 and C5 only when its original probe clearly beats guessing (:func:`informative_tasks`:
  the 95% interval of its score over seeds lies above the records' ``majority_baseline``): when even the original
  model's probe is at the majority class, every variant is too, and their differences say nothing about attention.
  The statistic names the tasks left out.

Claims (the book's numbering): C1 all-constant drop, C2 half of the heads, C3 better models use attention more,
C4 average beats data-free matrices, C5 MNLI-built matrices, C6 λ order first and reversed last, C7 MLM-pretrained
models, C8 Kobayashi et al.'s norm findings (the paper's Sec. 5.1 cites them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from ..experiments.matrices import data_free_types
from . import paper

COLUMNS = ["claim", "statistic", "paper", "ours", "ci_low", "ci_high", "verdict", "rule"]
TASK_ORDER = ("cola", "mrpc", "sst2", "mnli", "ner", "pos")
DATA_FREE = data_free_types()  # registered data-free matrix types (at import: the paper's identity, Toeplitz, zeros)
FIG5_FRACTIONS = (0.5, 0.125, 0.0625)
BOOTSTRAP = 2000


# ---------------------------------------------------------------------------------------------- selections
def _select(frame: pd.DataFrame, matrix_type: str, fraction: float, order: str = "none",
            source: str | None = "own") -> pd.DataFrame:
    """Rows of one configuration; ``source`` ``'own'``: matrices from the row's task, else a task name or None."""
    rows = frame[(frame.matrix_type == matrix_type) & np.isclose(frame.fraction.astype(float), fraction)
                 & (frame.selection_order.fillna("none") == order)]
    if source == "own":
        rows = rows[rows.matrices_from.fillna(rows.task) == rows.task]
    elif source is not None:
        rows = rows[rows.matrices_from == source]
    return rows


def original_rows(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame.matrix_type == "original"]


def _seed_values(rows: pd.DataFrame) -> dict[str, np.ndarray]:
    return {task: group.sort_values("seed").value.to_numpy(float) for task, group in rows.groupby("task")}


# ---------------------------------------------------------------------------------------------- bootstrap
def bootstrap(groups: dict, statistic: Callable[[dict], float], draws: int = BOOTSTRAP, seed: int = 0):
    """``(estimate, low, high)``: ``statistic`` on the seed values of every group, and its 95% percentile interval
    when each group's seeds are resampled with replacement (NaN bounds when a group has fewer than two seeds)."""
    estimate = float(statistic(groups))
    if np.isnan(estimate) or not groups or min(len(v) for v in groups.values()) < 2:
        return estimate, float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(draws):
        drawn = {k: v[rng.integers(0, len(v), len(v))] for k, v in groups.items()}
        samples.append(statistic(drawn))
    low, high = np.nanpercentile(samples, [2.5, 97.5])
    return estimate, float(low), float(high)


def _drop(orig: np.ndarray, other: np.ndarray) -> float:
    base = float(np.mean(orig))
    return (base - float(np.mean(other))) / abs(base) if base else float("nan")


def informative_tasks(frame: pd.DataFrame) -> tuple[list[str], list[str]]:
    """``(informative, left_out)``: the tasks whose original probe's 95% Student-t interval over seeds lies above
    the majority-class baseline of their validation set (records' ``majority_baseline``), and those whose does not.
    A task with no baseline in its records (older records) counts as informative; one seed gives no interval."""
    from ..experiments.results import mean_ci

    informative, left_out = [], []
    for task, values in _seed_values(original_rows(frame)).items():
        baseline = frame.loc[frame.task == task, "majority_baseline"].dropna() if "majority_baseline" in frame \
            else pd.Series(dtype=float)
        low = mean_ci(values)[1] if len(values) > 1 else float("nan")
        (informative if baseline.empty or low > float(baseline.iloc[0]) else left_out).append(task)
    order = {task: i for i, task in enumerate(TASK_ORDER)}
    return sorted(informative, key=lambda t: order.get(t, 99)), sorted(left_out, key=lambda t: order.get(t, 99))


def _left_out_note(frame: pd.DataFrame) -> str:
    left_out = informative_tasks(frame)[1]
    return (f"; left out: {', '.join(left_out)} "
            "(original probe not clearly above its majority baseline with the grid's seeds)" if left_out else "")


def mean_drop(frame: pd.DataFrame, variant: pd.DataFrame, tasks=None):
    """Task-averaged relative drop of ``variant``'s rows from the original model, with its interval; the tasks used
    (``tasks``, default the :func:`informative_tasks`, that have both)."""
    originals, others = _seed_values(original_rows(frame)), _seed_values(variant)
    tasks = [t for t in (tasks or informative_tasks(frame)[0]) if t in originals and t in others]
    groups = {**{("o", t): originals[t] for t in tasks}, **{("v", t): others[t] for t in tasks}}

    def statistic(g):
        return float(np.mean([_drop(g[("o", t)], g[("v", t)]) for t in tasks])) if tasks else float("nan")

    return (*bootstrap(groups, statistic), tasks)


# ---------------------------------------------------------------------------------------------- the paper's own
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


# ---------------------------------------------------------------------------------------------- verdict rules
def _band(value, low, high, target, tolerance) -> str:
    if np.isnan(value):
        return "not measured"
    lo, hi = (value, value) if np.isnan(low) else (low, high)
    if hi < target - tolerance or lo > target + tolerance:
        return "differs"
    return "agrees" if (target - tolerance <= value <= target + tolerance) else "inconclusive"


def _at_most(value, low, high, bound) -> str:
    if np.isnan(value):
        return "not measured"
    hi = value if np.isnan(high) else high
    lo = value if np.isnan(low) else low
    return "agrees" if hi <= bound else ("differs" if lo > bound else "inconclusive")


def _row(claim, statistic, paper_value, estimate, verdict, rule) -> dict:
    value, low, high = estimate
    return dict(claim=claim, statistic=statistic, paper=paper_value, ours=value, ci_low=low, ci_high=high,
                verdict=verdict, rule=rule)


# ---------------------------------------------------------------------------------------------- the claims
def probing_claims(frame: pd.DataFrame) -> list[dict]:
    """C1, C2, C4, C5, C6 from a results frame of one model."""
    rows = []
    left_out = _left_out_note(frame)
    value, low, high, tasks = mean_drop(frame, _select(frame, "average", 0.0))
    note = f" ({len(tasks)} of 6 tasks: {', '.join(tasks)}{left_out})" if len(tasks) < 6 else ""
    rows.append(_row("C1", "all heads constant: task-averaged relative drop" + note,
                     paper.headline("mean_relative_drop_all_constant"), (value, low, high),
                     _band(value, low, high, 0.08, 0.04),
                     "agrees if the estimate lies within 0.08 ± 0.04 and the interval overlaps it; differs if the "
                     "interval lies outside it"))
    rows.append(_row("C1", "all heads constant: task-averaged drop within the 20% bound" + note,
                     paper.headline("max_relative_drop_all_constant"), (value, low, high),
                     _at_most(value, low, high, 0.20),
                     "agrees if the interval's upper end is at most 0.20; differs if its lower end is above"))
    value, low, high, tasks = mean_drop(frame, _select(frame, "average", 0.5, "lambda"))
    note = f" ({len(tasks)} of 6 tasks{left_out})" if 0 < len(tasks) < 6 else ""
    rows.append(_row("C2", "half of the heads constant (λ order): task-averaged relative drop" + note,
                     "≈ 0 (no major drop)", (value, low, high), _at_most(value, low, high, 0.05),
                     "'no major drop': agrees if the interval's upper end is at most 0.05"))
    rows.append(_data_free_claim(frame))
    rows.append(_mnli_claim(frame))
    rows.append(_order_claim(frame))
    return rows


def _data_free_claim(frame: pd.DataFrame) -> dict:
    average = _seed_values(_select(frame, "average", 0.0))
    free = {kind: _seed_values(_select(frame, kind, 0.0, source=None)) for kind in DATA_FREE}
    informative, left_out = informative_tasks(frame)
    measured = [t for t in TASK_ORDER if t in average and all(t in free[k] for k in DATA_FREE)]
    tasks = [t for t in measured if t in informative]
    groups = {("a", t): average[t] for t in tasks} | {(k, t): free[k][t] for k in DATA_FREE for t in tasks}

    def margin(g):  # the smallest margin of the average over the best data-free matrix, across tasks
        return min(float(np.mean(g[("a", t)])) - max(float(np.mean(g[(k, t)])) for k in DATA_FREE) for t in tasks) \
            if tasks else float("nan")

    estimate = bootstrap(groups, margin)
    verdict = ("not measured" if not tasks else
               "agrees" if len(measured) == 6 and estimate[1] > 0 else
               "differs" if estimate[2] < 0 else "inconclusive")
    return _row("C4", f"average minus the best of identity/Toeplitz/zeros, smallest over tasks ({len(tasks)} of 6"
                f"{_left_out_note(frame)})", "> 0 on every task", estimate, verdict,
                "agrees if all six tasks are measured and the interval of the smallest margin, over the tasks whose "
                "original probe clearly beats its majority baseline, is above 0; differs if it is below 0")


def _mnli_claim(frame: pd.DataFrame) -> dict:
    own = _seed_values(_select(frame, "average", 0.0))
    mnli = _seed_values(_select(frame, "average", 0.0, source="mnli"))
    informative = informative_tasks(frame)[0]
    tasks = [t for t in TASK_ORDER if t != "mnli" and t in own and t in mnli and t in informative]
    groups = {("own", t): own[t] for t in tasks} | {("mnli", t): mnli[t] for t in tasks}

    def gap(g):
        return float(np.mean([_drop(g[("own", t)], g[("mnli", t)]) for t in tasks])) if tasks else float("nan")

    estimate = bootstrap(groups, gap)
    return _row("C5", f"MNLI-built vs own matrices: mean relative difference ({len(tasks)} of 5 tasks"
                f"{_left_out_note(frame)})", "≈ 0",
                estimate, _band(*estimate, 0.0, 0.03),
                "agrees if the estimate lies within ±0.03 of 0 and the interval overlaps that band")


def _order_claim(frame: pd.DataFrame) -> dict:
    mnli = frame[(frame.task == "mnli") & (frame.matrices_from.fillna("mnli") == "mnli")]
    orders = ("lambda", "reversed", "first_to_last", "last_to_first", "random")
    groups = {}
    for order in orders:
        for fraction in FIG5_FRACTIONS:
            values = _select(mnli, "average", fraction, order, source=None).sort_values("seed").value.to_numpy(float)
            if len(values):
                groups[(order, fraction)] = values
    measured = [o for o in orders if all((o, f) in groups for f in FIG5_FRACTIONS)]

    def lambda_minus_best_other(g):
        means = {o: np.mean([np.mean(g[(o, f)]) for f in FIG5_FRACTIONS]) for o in measured}
        others = [means[o] for o in measured if o != "lambda"]
        return float(means["lambda"] - max(others)) if "lambda" in means and others else float("nan")

    estimate = bootstrap(groups, lambda_minus_best_other)
    verdict = "not measured" if len(measured) < len(orders) else (
        "agrees" if estimate[1] > 0 else "differs" if estimate[2] < 0 else "inconclusive")
    return _row("C6", "MNLI, mean over ½, ⅛, 1/16 of the heads kept: λ order minus the best other order", "> 0",
                estimate, verdict, "agrees if the interval is above 0 (λ first); the reversed order's rank is in Fig. 5")


def untestable_claims(model_name: str) -> list[dict]:
    nan = (float("nan"),) * 3
    return [
        _row("C3", "larger/better models rely more on attention", "", nan, "not testable with this model",
             f"needs several pretrained models of different quality; this run has one ({model_name})"),
        _row("C7", "MLM-pretrained models drop more than ELECTRA in MLM probing", "", nan,
             "not testable with this model",
             f"needs MLM-pretrained weights with their MLM head; {model_name} ships none"),
    ]


#: C8: Kobayashi et al.'s findings, as :mod:`papa_lib.analysis.norm_findings` computes them (the rows of
#: ``kobayashi_findings.csv``): finding -> (statistic, the paper's value, rule).
NORM_FINDINGS = {
    "sep_weight_vs_norm": (
        "[SEP]: Spearman ρ of α and ‖f(x)‖ over every (query, [SEP]) pair, pooled over heads and layers", "< 0",
        "Kobayashi et al. 2020 (Sec. 4.2, Fig. 4): negative; agrees if the 95% interval (cluster bootstrap over "
        "sequences) is below 0, differs if it is above"),
    "cls_weight_vs_norm": (
        "[CLS]: Spearman ρ of α and ‖f(x)‖ over every (query, [CLS]) pair, pooled over heads and layers",
        "< 0 (stated for [SEP])",
        "the paper states the correlation for [SEP] (Fig. 4); [CLS], which also draws large weights but little "
        "norm-based attention (Sec. 4.2, Fig. 3), is tested the same way: agrees if the 95% interval is below 0, "
        "differs if it is above"),
    "frequency_rank_vs_norm": (
        "frequency: Spearman ρ of a token's corpus-wide frequency rank (1 = most frequent) and its ‖f(x)‖ averaged "
        "over heads and layers, over token occurrences", "> 0",
        "Kobayashi et al. 2020 (Sec. 4.3, Fig. 5): positive (frequent tokens have a short f(x)); agrees if the 95% "
        "interval (cluster bootstrap over sequences) is above 0, differs if it is below"),
}


def _sign_verdict(value, low, high, sign: int) -> str:
    if np.isnan(value):
        return "not measured"
    lo, hi = (value, value) if np.isnan(low) else (low, high)
    if (hi < 0 and sign < 0) or (lo > 0 and sign > 0):
        return "agrees"
    if (lo > 0 and sign < 0) or (hi < 0 and sign > 0):
        return "differs"
    return "inconclusive"


def norm_claims(analysis_dir: str | Path) -> list[dict]:
    """C8 from the norm analyses' ``kobayashi_findings.csv`` (:func:`papa_lib.analysis.norm_findings.kobayashi_findings`):
    [SEP] (and [CLS]) get much attention weight but pass on a short ``f(x)``, so α and ‖f(x)‖ are negatively
    correlated over all query-to-[SEP] pairs pooled across heads and layers (Fig. 4); frequent tokens have a short
    ``f(x)``, a positive correlation between corpus-wide frequency rank and ‖f(x)‖ over token occurrences (Fig. 5)."""
    path = Path(analysis_dir) / "kobayashi_findings.csv"
    found = pd.read_csv(path).set_index("finding") if path.exists() else pd.DataFrame()
    rows = []
    for finding, (statistic, paper_value, rule) in NORM_FINDINGS.items():
        if finding not in found.index:
            rows.append(_row("C8", statistic, paper_value, (float("nan"),) * 3, "not measured",
                             f"needs {path.name} with a {finding} row ({rule})"))
            continue
        row = found.loc[finding]
        estimate = (float(row.spearman_rho), float(row.ci_low), float(row.ci_high))
        sampled = f", {int(row.n)} sampled" if int(row.n) < int(row.n_seen) else ""
        unit = "occurrences" if finding.startswith("frequency") else "pairs"
        rows.append(_row("C8", f"{statistic} ({int(row.n_seen)} {unit}{sampled}; {int(row.n_clusters)} sequences)",
                         paper_value, estimate, _sign_verdict(*estimate, int(row.paper_sign)), rule))
    return rows


def claims_table(frame: pd.DataFrame, analysis_dir: str | Path | None = None) -> pd.DataFrame:
    """Every claim's verdict for one model's records (and its norm analyses, for C8)."""
    model = str(frame.model.iloc[0]) if len(frame) else "this model"
    rows = probing_claims(frame) + untestable_claims(model)
    if analysis_dir is not None:
        rows += norm_claims(analysis_dir)
    order = {f"C{i}": i for i in range(1, 9)}
    return pd.DataFrame(rows, columns=COLUMNS).sort_values("claim", key=lambda c: c.map(order), kind="stable") \
        .reset_index(drop=True)


def write_claims(results_dir: str | Path, analysis_dir: str | Path | None = None) -> Path:
    """Compute :func:`claims_table` from ``results_dir/results.csv`` and write ``results_dir/claims.csv``."""
    results_dir = Path(results_dir)
    table = claims_table(pd.read_csv(results_dir / "results.csv"), analysis_dir)
    path = results_dir / "claims.csv"
    table.to_csv(path, index=False, float_format="%.4g")
    return path


def for_setup(setup) -> pd.DataFrame | None:
    """The claims table of a chapter's setup (:func:`papa_lib.book.profiles.resolve`): its results folder's records;
    C8 from the committed norm analyses of the embedded MiniLM under the ``local`` profile. None without records."""
    path = Path(setup.results_dir) / "results.csv" if setup.results_dir is not None else None
    if path is None or not path.exists():
        return None
    frame = pd.read_csv(path)
    if frame.empty:
        return None
    analysis = Path(setup.root) / "data" / "results" / "norms-minilm" / "analysis" if setup.profile == "local" else None
    return claims_table(frame, analysis)
