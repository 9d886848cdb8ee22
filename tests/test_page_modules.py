"""Every chapter helper module runs in the quick loop (``-m "not slow"``), on the smoke profile's tiny model and
generated data, without executing a chapter: each test calls a page module as its chapter does and checks what it
returns. (The chapters themselves run in the slow tests.)"""

from __future__ import annotations

import pytest

from papa_lib.book import profiles

pytestmark = pytest.mark.usefixtures("restore_registries")  # premise_use reads a grid that registers a task

@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    setup = profiles.resolve("smoke", results_dir=tmp_path_factory.mktemp("results"))
    model, tokenizer = setup.encoder()
    return setup, model, tokenizer


def _spec(chart) -> dict:
    return chart.to_dict()


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """The local profile reading the committed records (nothing is run: run_missing stays False)."""
    return profiles.resolve("local")


def test_norm_data_on_the_committed_analyses(local):
    """The data the norms chapter draws from (its charts and sentences live in book/norms.md)."""
    from papa_lib.analysis import norm_findings, norm_rankings

    tasks, ranking = ["sst2", "mnli"], ["sst2", "mnli"]
    norm_frame, frame = norm_rankings.norm_aware_results(local, tasks, ranking, run_missing=False)
    folder = norm_rankings.norm_results_folder(local, None)
    assert len(norm_frame) and len(frame)
    tables = norm_findings.read_analyses(folder / "analysis")
    assert set(norm_findings.ANALYSIS_FILES) <= set(tables) and tables["metadata"]["n_sequences"] > 0
    compared = norm_rankings.matrix_comparison(norm_frame, frame, tasks)
    assert {"average", "norm_average", "original"} <= set(compared["matrix_type"])
    curves = norm_rankings.label_free_comparison(norm_frame, frame, ranking)
    assert set(curves["order"]) == {"lambda", "attention_variance", "norm_variance"}
    plain = norm_rankings.find_constant_matrices(folder, "sst2", "average")
    weighted = norm_rankings.find_constant_matrices(folder, "sst2", "norm_average")
    distance = norm_rankings.matrix_total_variation(weighted, plain)["total_variation"]
    assert distance.between(0, 1).all() and distance.max() > 0
    scores = norm_rankings.head_scores(local, None, None, folder, ranking, False)
    agreement = norm_rankings.score_agreement(scores)
    assert agreement[agreement["first"] == "lambda"]["spearman_rho"].notna().all()


def test_the_book_tool_runs_as_a_module():
    import os
    import subprocess
    import sys
    from pathlib import Path

    tools = Path(__file__).resolve().parents[1] / "book" / "_ext"
    out = subprocess.run([sys.executable, "-m", "papa_book", "--help"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tools)})
    assert out.returncode == 0 and "{sync,check,build,badge,run}" in out.stdout
