"""Claim verdicts (papa_lib.book.claims): the paper's own tables pass its own bound; verdicts follow their rules."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from papa_lib.book import claims

TASKS = ["cola", "mrpc", "sst2", "mnli", "ner", "pos"]


def test_the_paper_does_not_violate_its_own_bound():
    drops = claims.paper_model_drops().set_index("model")
    assert drops.loc["RoBERTa-base", "cola"] == pytest.approx((0.47 - 0.31) / 0.47)  # 34%: above 20% per task ...
    assert drops.loc["RoBERTa-base", "mean_drop"] == pytest.approx(0.0948, abs=1e-3)  # ... not per model
    assert drops.loc["RoBERTa-large", "mean_drop"] == pytest.approx(0.1212, abs=1e-3)
    assert (drops.mean_drop <= 0.20).all() and (drops.max_drop > 0.20).all()


def _records(drop: float, free: float, mnli_gap: float = 0.0, noise: float = 0.002) -> pd.DataFrame:
    """Synthetic records: original 0.8 on every task; constant matrices ``drop`` lower (relative); data-free lower."""
    rng = np.random.default_rng(0)
    rows = []

    def add(task, matrix_type, fraction, value, order="none", source=None):
        for seed in range(3):
            rows.append(dict(model="m", task=task, matrix_type=matrix_type, matrices_from=source,
                             selection_order=order, fraction=fraction, seed=seed,
                             value=value + rng.normal(0, noise)))

    for task in TASKS:
        add(task, "original", 1.0, 0.8)
        add(task, "average", 0.0, 0.8 * (1 - drop), source=task)
        add(task, "average", 0.5, 0.8, "lambda", task)
        for kind in claims.DATA_FREE:
            add(task, kind, 0.0, 0.8 * (1 - free))
        if task != "mnli":
            add(task, "average", 0.0, 0.8 * (1 - drop - mnli_gap), source="mnli")
    for order, shift in (("lambda", 0.05), ("reversed", -0.05), ("first_to_last", 0), ("last_to_first", 0),
                         ("random", 0)):
        for fraction in claims.FIG5_FRACTIONS:
            add("mnli", "average", fraction, 0.7 + shift, order, "mnli")
    return pd.DataFrame(rows)


def test_verdicts_follow_the_rules():
    table = claims.claims_table(_records(drop=0.08, free=0.3))
    assert list(table[table.claim == "C1"].verdict) == ["agrees", "agrees"]
    assert set(table[table.claim.isin(["C2", "C4", "C5", "C6"])].verdict) == {"agrees"}
    assert set(table[table.claim.isin(["C3", "C7"])].verdict) == {"not testable with this model"}
    c1 = table[table.claim == "C1"].iloc[0]
    assert c1.ours == pytest.approx(0.08, abs=0.01) and c1.ci_low < c1.ours < c1.ci_high

    worse = claims.claims_table(_records(drop=0.3, free=0.5, mnli_gap=0.2))
    assert list(worse[worse.claim == "C1"].verdict) == ["differs", "differs"]
    assert worse[worse.claim == "C5"].verdict.item() == "differs"
    reversed_free = claims.claims_table(_records(drop=0.08, free=0.0))
    assert reversed_free[reversed_free.claim == "C4"].verdict.item() in {"differs", "inconclusive"}


def test_missing_configurations_are_not_measured():
    frame = _records(drop=0.08, free=0.3)
    table = claims.claims_table(frame[frame.matrix_type.isin(["original", "average"]) & (frame.task != "mnli")])
    assert table[table.claim == "C4"].verdict.item() == "not measured"
    assert table[table.claim == "C6"].verdict.item() == "not measured"


def test_a_task_whose_original_probe_is_at_guessing_level_is_left_out():
    frame = _records(drop=0.08, free=0.3).assign(majority_baseline=0.5)
    frame.loc[frame.task == "mrpc", "majority_baseline"] = 0.8  # MRPC's original (0.8 ± noise) is not above it
    assert claims.informative_tasks(frame) == ([t for t in claims.TASK_ORDER if t != "mrpc"], ["mrpc"])
    table = claims.claims_table(frame)
    c1, c4 = table[table.claim == "C1"].iloc[0], table[table.claim == "C4"].iloc[0]
    assert "5 of 6 tasks" in c1.statistic and "left out: mrpc" in c1.statistic and c1.verdict == "agrees"
    assert "left out: mrpc" in c4.statistic and c4.verdict == "agrees"  # all six measured, five informative
    # a broken MRPC run no longer decides the data-free claim: make MRPC's data-free matrices beat the average
    frame.loc[(frame.task == "mrpc") & frame.matrix_type.isin(claims.DATA_FREE), "value"] = 0.85
    assert claims.claims_table(frame).query("claim == 'C4'").verdict.item() == "agrees"
    assert claims.claims_table(frame.drop(columns="majority_baseline")).query("claim == 'C4'").verdict.item() \
        in {"differs", "inconclusive"}  # without baselines every task counts


def test_write_claims_from_a_results_folder(tmp_path):
    _records(drop=0.08, free=0.3).to_csv(tmp_path / "results.csv", index=False)
    path = claims.write_claims(tmp_path)
    written = pd.read_csv(path)
    assert list(written.columns) == claims.COLUMNS and len(written) >= 8


def test_committed_claims_match_the_committed_records():
    """claims.csv is regenerated from the records, never edited: it must equal a fresh computation."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "data" / "results"
    committed = pd.read_csv(root / "local-minilm" / "claims.csv")
    fresh = claims.claims_table(pd.read_csv(root / "local-minilm" / "results.csv"), root / "norms-minilm" / "analysis")
    assert list(committed.claim) == list(fresh.claim) and list(committed.verdict) == list(fresh.verdict)
    assert np.allclose(committed.ours.astype(float), fresh.ours.astype(float), rtol=1e-3, equal_nan=True)


def _findings(tmp_path, rows):
    columns = ["finding", "source", "observation", "paper_sign", "n", "n_seen", "n_clusters", "spearman_rho", "ci_low",
               "ci_high"]
    pd.DataFrame(rows, columns=columns).to_csv(tmp_path / "kobayashi_findings.csv", index=False)
    return tmp_path


def test_norm_claims_rows_follow_the_sign_of_the_paper(tmp_path):
    """C8: Kobayashi's [SEP], [CLS] (negative) and frequency (positive) correlations; the interval decides."""
    folder = _findings(tmp_path, [
        ("sep_weight_vs_norm", "Fig. 4", "pairs", -1, 1000, 5000, 300, -0.30, -0.35, -0.25),
        ("cls_weight_vs_norm", "Fig. 4", "pairs", -1, 1000, 1000, 300, -0.05, -0.10, 0.02),
        ("frequency_rank_vs_norm", "Fig. 5", "occurrences", 1, 33000, 33000, 300, -0.20, -0.25, -0.15),
    ])
    table = claims.claims_table(_records(drop=0.08, free=0.3), folder)
    c8 = table[table.claim == "C8"].reset_index(drop=True)
    assert len(c8) == 3 and list(c8.columns) == claims.COLUMNS
    assert list(c8.verdict) == ["agrees", "inconclusive", "differs"]
    assert list(c8.paper) == ["< 0", "< 0 (stated for [SEP])", "> 0"]
    assert c8.loc[2, "ours"] == pytest.approx(-0.20) and c8.loc[2, "ci_low"] == pytest.approx(-0.25)
    assert "frequency rank" in c8.loc[2, "statistic"] and "33000 occurrences" in c8.loc[2, "statistic"]
    assert "5000 pairs, 1000 sampled" in c8.loc[0, "statistic"] and "Fig. 5" in c8.loc[2, "rule"]
    positive = _findings(tmp_path, [("frequency_rank_vs_norm", "", "", 1, 10, 10, 5, 0.4, 0.1, 0.6)])
    rows = claims.norm_claims(positive)
    assert [r["verdict"] for r in rows] == ["not measured", "not measured", "agrees"]
    (tmp_path / "kobayashi_findings.csv").unlink()
    assert {r["verdict"] for r in claims.norm_claims(tmp_path)} == {"not measured"}
