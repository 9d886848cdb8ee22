"""The probing chapter (book/probing.md), executed as a reader runs it: in a plain Jupyter kernel (papermill), at the
``local`` profile on the committed records and at ``smoke``.

What its deleted page module (``papa_lib.book.probing_pages``) was tested for is checked on the executed notebook's
outputs: the probe built in the chapter and its AdamW step equal the library's; every original probe is set against
its majority-class baseline, and the tasks the chapter calls "clearly above" are the claims engine's; the by-hand
seed-paired intervals equal the engine's; the C1a, C1b, C2 and C3 sentences carry the verdicts of ``claims.csv``;
the training sentence states the records' seeds and the grid's learning rates (MRPC's is not Table 3's); Fig. 2's
panels name their metric and draw the majority-class baseline, Fig. 3's legend shows its markers; with one model
(smoke) no side-by-side table and no C3 sentence appear; no output reads ``nan``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from conftest import chapter_outputs, execute_chapter

ROOT = Path(__file__).resolve().parents[1]
VEGALITE = "application/vnd.vegalite.v5+json"


def _execute(tmp_path_factory, profile: str):
    folder = tmp_path_factory.mktemp(f"probing-{profile}")
    parameters = {"profile": profile, **({"results_dir": str(folder / "results")} if profile == "smoke" else {})}
    return execute_chapter("probing", folder, **parameters)


def _engine() -> pd.DataFrame:
    """The claims engine on the committed local records (what ``claims.csv`` holds once regenerated)."""
    from papa_lib.analysis import claims

    return claims.local_claims(ROOT)


def _committed(claim: str, model: str = "all-MiniLM-L6-v2") -> pd.Series:
    table = _engine()
    return table[(table.model == model) & (table.claim == claim)].iloc[0]


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    return _execute(tmp_path_factory, "local")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    return _execute(tmp_path_factory, "smoke")


@pytest.mark.slow
def test_the_probe_built_in_view_equals_the_library(local):
    printed = "".join(chapter_outputs(local, "stream"))
    logits = [float(v) for v in re.findall(r"largest logit difference: ([0-9.e+-]+)", printed)]
    assert len(logits) == 2 and max(logits) < 1e-6  # sentence and token probe
    assert float(re.search(r"difference from a plain mean: ([0-9.e+-]+)", printed).group(1)) < 1e-7
    step = re.search(r"loss difference ([0-9.e+-]+); largest weight difference after the step ([0-9.e+-]+)", printed)
    assert float(step.group(1)) < 1e-6 and float(step.group(2)) < 1e-6
    assert "backbone unchanged: True" in printed


@pytest.mark.slow
def test_guessing_check_and_seed_paired_intervals_match_the_claims_engine(local):
    printed = "".join(chapter_outputs(local, "stream"))
    engine_tasks = re.findall(r"(\S+): the claims engine's tasks: (True|False)", printed)
    assert engine_tasks and all(same == "True" for _, same in engine_tasks)
    assert "same verdict: True" in printed and "the engine's tasks: True" in printed
    gaps = [float(v) for v in re.findall(r"largest difference ([0-9.]+e[-+]\d+)", printed)]
    assert len(gaps) >= 2 and max(gaps) < 1e-9  # C1b and C1a by hand vs the engine
    c2 = re.search(r"C2 by hand: (-?[0-9.]+) \[(-?[0-9.]+), (-?[0-9.]+)\] on .*; engine: (-?[0-9.]+) "
                   r"\[(-?[0-9.]+), (-?[0-9.]+)\]", printed)
    assert c2 and c2.group(1, 2, 3) == c2.group(4, 5, 6)  # the exercise's C2 by hand, to 4 decimals
    c1b = _committed("C1b")
    assert f"-> {c1b.verdict}" in printed.split("C1b: worst task")[1].splitlines()[0]


@pytest.mark.slow
def test_claim_sentences_carry_the_verdicts_of_claims_csv(local):
    text = "\n".join(chapter_outputs(local, "text/markdown"))
    for claim in ("C1a", "C1b", "C2"):
        sentence = next(s for s in text.split("\n") if s.startswith(f"- **{claim}** (all-MiniLM-L6-v2)"))
        assert f"verdict: **{_committed(claim).verdict_text}**" in sentence, sentence
    c3 = _engine()
    c3 = c3[(c3.claim == "C3") & c3.model.str.contains(" vs ")]
    if len(c3) and "verdict: **" in text.split("**C3**")[-1]:
        assert f"verdict: **{c3.verdict_text.iloc[0]}**" in text.split("**C3**")[1]
    found = next(t for t in chapter_outputs(local, "text/markdown")
                 if t.startswith("On all-MiniLM-L6-v2 (local profile)"))
    assert f"C1a: {_committed('C1a').verdict_text}" in found and f"C1b: {_committed('C1b').verdict_text}" in found
    assert not re.search(r"\bnan\b", text.lower()) and not re.search(r"\bNone\b(?! of)", text)


@pytest.mark.slow
def test_training_sentence_states_the_records_and_the_grid(local):
    frame = pd.read_csv(ROOT / "data" / "results" / "local-minilm" / "results.csv")
    sentence = next(t for t in chapter_outputs(local, "text/markdown") if t.startswith("Our records of"))
    seeds = frame[frame.matrix_type == "original"].groupby("task").seed.nunique()
    shown = f"{seeds.min()}" if seeds.min() == seeds.max() else f"{seeds.min()}–{seeds.max()}"
    assert sentence.startswith(f"Our records of all-MiniLM-L6-v2 hold {shown} seeds of each task's original probe")
    from papa_lib.analysis import claims

    for name in claims.LOCAL_FOLDERS[1:]:  # every other committed model states its own seeds
        other = ROOT / "data" / "results" / name / "results.csv"
        if other.is_file():
            model = pd.read_csv(other).model.iloc[0]
            assert f"; those of {model}, " in sentence
    assert "MRPC at 1e-4 (Table 3: 2e-5)" in sentence  # the grid file's rate, not Table 3's
    full_sst2 = ROOT.parent / "shared" / "data" / "glue" / "SST-2" / "train.tsv"
    if full_sst2.is_file():  # the chapter counts the full set where it has it (not on the packaged sample)
        assert "of SST-2's 67,349 training sentences" in sentence
    assert "a CPU" in sentence


@pytest.mark.slow
def test_figures_name_their_metric_draw_the_baseline_and_show_every_marker(local):
    specs = chapter_outputs(local, VEGALITE)
    fig2 = next(s for s in specs if "Fig. 2" in str(s.get("title")))
    titles = {layer["encoding"]["y"]["title"] for panel in fig2["concat"] for layer in panel["layer"]}
    assert {"CoLA MCC", "MRPC F1", "SST-2 accuracy", "MNLI accuracy", "NER F1 (seqeval)"} <= titles
    assert "majority-class baseline" in str(fig2)
    fig3 = next(s for s in specs if "Fig. 3" in str(s.get("title")))
    assert fig3["encoding"]["shape"]["legend"] is not None and "model: mean over tasks" in str(fig3)
    drop = next(s for s in specs if "Relative drop vs fraction" in str(s.get("title")))
    assert {layer["encoding"]["y"]["title"] for layer in drop["layer"]} == {"relative drop from the original"}
    text = "\n".join(chapter_outputs(local, "text/markdown"))
    assert "Averaged over the tasks every model has" in text and "no trend to read" not in text


@pytest.mark.slow
def test_one_model_shows_no_pair_and_every_cell_runs_at_smoke(smoke):
    errors = [o for c in smoke.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    text = "\n".join(chapter_outputs(smoke, "text/markdown"))
    assert "**C3**" not in text and "side by side" not in text and "there is one diamond and no trend" in text
    assert "On tiny-random-bert (smoke profile)" in text
