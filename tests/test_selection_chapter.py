"""The head-selection chapter (book/selection.md), executed as a reader runs it: in a plain Jupyter kernel
(papermill) at the ``local`` profile, on the committed records.

What its deleted page module (papa_lib/book/selection_pages.py) was tested for is checked on the executed notebook's
outputs: Eq. 3 on one head by hand equals the seam's B and head output, the λ-training loop equals
``inloop.learn_lambdas``, the head order by hand equals the library's ranking (on the demonstration's λ and on the
committed λ), the seed-paired leads equal the claims engine's, the C6a and C6b sentences carry the verdicts of
``claims.csv`` in the words of what was tested, Fig. 5 names its metric and draws the majority-class baseline, and
no output reads ``nan``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from conftest import chapter_outputs, execute_chapter

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def selection(tmp_path_factory):
    return execute_chapter("selection", tmp_path_factory.mktemp("selection"), profile="local")


def _verdict(claim: str) -> str:
    """The committed verdict of ``claim`` in the words of what its rule tested (``verdict_text``)."""
    committed = pd.read_csv(ROOT / "data" / "results" / "local-minilm" / "claims.csv")
    return committed[(committed.model == "all-MiniLM-L6-v2") & (committed.claim == claim)].verdict_text.iloc[0]


@pytest.mark.slow
def test_selection_builds_eq3_lambda_and_the_order_as_the_library_does(selection):
    streams = "".join(chapter_outputs(selection, "stream"))
    lines = [line for line in streams.splitlines() if line.startswith("largest difference from")]
    differences = [float(v) for line in lines for v in re.findall(r"\d\.\de[-+]\d+", line)]
    # Eq. 3's B and head output, learn_lambdas' λ, the claims engine's lead and interval
    assert len(lines) == 3 and len(differences) == 4 and max(differences) < 1e-5, lines
    assert "heads placed differently from replacement_order: 0" in streams
    assert re.search(r"λ files read: seeds \[0(, \d+)*\]; seed 0: 0 heads ranked differently", streams)


@pytest.mark.slow
def test_selection_states_the_verdicts_of_claims_csv_and_no_nan(selection):
    text = "\n".join(chapter_outputs(selection, "text/markdown"))
    for claim in ("C6a", "C6b"):
        sentence = next(line for line in text.splitlines() if line.startswith(f"- **{claim}** — "))
        assert f"Verdict (the claims engine's): **{_verdict(claim)}**" in sentence, sentence
    assert "What this run" not in text and "λ order ranks" in text  # the findings are sentences, not a heading
    assert not re.search(r"\bnan\b|\bNone\b", text)


@pytest.mark.slow
def test_selection_fig5_names_its_metric_and_draws_the_majority_class(selection):
    charts = [h for h in chapter_outputs(selection, "text/html") if "vega" in h]
    fig5 = next(h for h in charts if "Head-selection orders on MNLI" in h)
    assert '"title":"MNLI accuracy"' in fig5 and "majority class" in fig5
    assert not re.search(r'"title":"[a-z]+_[a-z_]+"', fig5)  # no raw identifier names an axis or legend
    assert any("per head (seed" in h for h in charts)  # the map of the committed λ
