"""The intro (book/intro.md) and the appendix (book/scale.md) build their sentences and tables in their own cells;
these tests execute the twins with papermill and read what the cells printed.

* intro, at ``local``: the by-hand Eq. 3 mix equals the library's on the running example; "What this book found"
  states the claims engine's C1a verdict; the claims table shows, for every row of the committed ``claims.csv``,
  its verdict; the C3 sentence is said once, with two models.
* intro, at ``smoke`` (no records): the findings say that nothing is measured.
* appendix, at ``smoke``: the records' devices and seeds are read from the committed records, the by-hand cost
  of one plan line equals :func:`papa_lib.ops.costs.estimate_compute`, and the coverage table is there.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(chapter: str, tmp_path: Path, **parameters) -> list[str]:
    """Execute ``book/<chapter>.ipynb`` in a plain kernel; every text and Markdown output, in cell order."""
    import papermill

    executed = tmp_path / f"{chapter}.ipynb"
    papermill.execute_notebook(str(REPO / "book" / f"{chapter}.ipynb"), str(executed), parameters=parameters,
                               cwd=str(REPO / "book"), kernel_name="python3", progress_bar=False,
                               request_save_on_cell_execute=False, execution_timeout=600)
    texts = []
    for cell in nbformat.read(executed, as_version=4).cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                texts.append(output["text"])
            elif "text/markdown" in output.get("data", {}):
                texts.append(output["data"]["text/markdown"])
    return texts


def _number(texts: list[str], pattern: str) -> float:
    found = [m for t in texts if (m := re.search(pattern, t))]
    assert found, f"no output matches {pattern!r}"
    return float(found[0].group(1))


@pytest.mark.slow
def test_intro_at_local_shows_the_claims_engine_rows_and_the_eq3_check(tmp_path):
    claims_csv = REPO / "data" / "results" / "local-minilm" / "claims.csv"
    if not claims_csv.is_file():
        pytest.skip("no committed local claims")
    texts = _run("intro", tmp_path, profile="local")
    assert _number(texts, r"by-hand Eq\. 3 vs papa_lib\.override: ([-+.e\d]+)") <= 1e-6
    rows = pd.read_csv(claims_csv)
    c1a = rows[(rows.claim == "C1a") & (rows.model == "all-MiniLM-L6-v2")].iloc[0]
    found = next(t for t in texts if t.startswith("On all-MiniLM-L6-v2 ("))
    assert f"reads it as **{c1a.verdict_text}**" in found
    if (rows.model == "gemma-3-270m").any():  # the decoder's paragraph, from its LM records and C9/C10
        from papa_lib.experiments import lm

        decoder = next(t for t in texts if t.startswith("On gemma-3-270m, making every one"))
        records = lm.lm_records(REPO / "data" / "results" / "local-gemma")
        nll = lm.nll_interval(lm.runs_of(records, "original", "none")).value
        assert f"from {nll:.3g} to " in decoder
        for claim in ("C9", "C10"):
            row = rows[(rows.claim == claim) & (rows.model == "gemma-3-270m")].iloc[0]
            assert f"{row.verdict_text} (claim {claim})" in decoder
    table = next(t for t in texts if t.startswith("| claim | model |"))
    for row in rows.itertuples():
        line = next(line for line in table.splitlines() if line.startswith(f"| {row.claim} | {row.model} |"))
        label, _, why = row.verdict.partition(": ")  # a reason goes to the notes under the table
        # the verdict, then what it means in the words of what was tested
        words = "" if why or row.verdict_text == label else f" ({row.verdict_text})"
        assert f"**{label}**{words}" in line and (not why or f". {why[:1].upper()}{why[1:]}." in table), row
        every = line.split(" | ")[6]  # "with every task": a verdict of its own, "same", or "—" when none is left out
        assert every in ("same", "—") or every.endswith(f"**{row.verdict_all_tasks}**"), (row, every)
        assert "****" not in line, line
    if rows.model.str.contains(" vs ").any():  # two models: the C3 sentence once
        assert sum(t.count("C3 compares") for t in texts) == 1


@pytest.mark.slow
def test_intro_without_records_says_nothing_is_measured(tmp_path):
    texts = _run("intro", tmp_path, profile="smoke", results_dir=str(tmp_path / "results"))
    assert any(t.startswith("No records in this profile's results folder yet") for t in texts)
    assert _number(texts, r"by-hand Eq\. 3 vs papa_lib\.override: ([-+.e\d]+)") <= 1e-6


@pytest.mark.slow
def test_appendix_reads_devices_and_seeds_from_the_records(tmp_path):
    folder = REPO / "data" / "results" / "local-minilm"
    if not (folder / "results.csv").is_file():
        pytest.skip("no committed local records")
    texts = _run("scale", tmp_path, profile="smoke", results_dir=str(tmp_path / "results"))
    records = pd.read_csv(folder / "results.csv")
    held = next(t for t in texts if t.startswith("`data/results/local-minilm` holds"))
    assert f"holds {len(records):,} records" in held
    for device in records.device.astype(str).unique():
        assert f"`{device}`" in held
    assert f"seeds {records.seed.min()}–{records.seed.max()}" in held
    assert _number(texts, r"largest difference from the library: ([-+.e\d]+) h") <= 1e-9
    coverage = next(t for t in texts if "distinct declared runs are in the records" in t)
    from papa_lib.analysis.claims import LOCAL_FOLDERS

    for name in LOCAL_FOLDERS:  # every committed local folder, each run counted once against its records
        if (REPO / "data" / "results" / name / "results.csv").is_file():
            assert f"`data/results/{name}` holds" in held and f"`data/results/{name}`'s " in coverage
    for declared, done, stored in re.findall(r"declares? ([\d,]+) distinct runs, ([\d,]+) of them in its ([\d,]+) "
                                             r"records", coverage):
        assert int(done.replace(",", "")) <= int(declared.replace(",", ""))
        assert int(done.replace(",", "")) <= int(stored.replace(",", ""))
