"""The paper's own printed numbers under the claims engine's declared rules (``tests/test_claims.py``: the paper
passes its own rules). Tables 1, 2, 4 and 5 report no intervals, so each interval is the point."""

from __future__ import annotations

import pandas as pd

from . import paper
from .claim_rules import DATA_FREE, TASK_ORDER, decide, decide_every, rules

__all__ = ["paper_model_drops", "paper_verdicts"]


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
    rows = []
    drops = paper_model_drops().set_index("model")
    for model, (types, transfer) in {"RoBERTa-base": ("table1", "table2"),
                                     "RoBERTa-large": ("table4", "table5")}.items():
        mean, worst = drops.loc[model, "mean_drop"], drops.loc[model, "max_drop"]
        for claim, value in (("C1a", mean), ("C1b", worst)):
            rule = table.loc[claim]
            rows.append((model, claim, value, decide(rule.test, value, value, rule.low, rule.high)))
        reported = paper.table(types).set_index("matrix_type")
        tasks = [c for c in reported.columns if c in TASK_ORDER]
        margins = reported.loc["average", tasks] - reported.loc[list(DATA_FREE), tasks].max()
        rule = table.loc["C4"]
        rows.append((model, "C4", float(margins.min()),
                     decide_every(decide("band", m, m, rule.low, rule.high) for m in margins)))
        moved = paper.table(transfer).set_index("matrices_from")
        change = float(((moved.loc["mnli"] - moved.loc["per-task"]) / moved.loc["per-task"].abs()).mean())
        rule = table.loc["C5"]
        rows.append((model, "C5", change, decide(rule.test, change, change, rule.low, rule.high)))
    rule = table.loc["C3"]
    gap = drops.loc["RoBERTa-large", "mean_drop"] - drops.loc["RoBERTa-base", "mean_drop"]
    rows.append(("RoBERTa-base vs RoBERTa-large", "C3", gap, decide(rule.test, gap, gap, rule.low, rule.high)))
    return pd.DataFrame(rows, columns=["model", "claim", "value", "verdict"])
