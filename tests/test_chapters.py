"""Every chapter of the book executes at the smoke profile (papermill), and the book's files agree with its toc.

The chapters are executed in the order of ``_toc.yml`` through :func:`papa_lib.book.run_chapters`, one test per
chapter, all pointed at one temporary results folder: the first chapter that needs the smoke grid's results runs
them (tiny random model, generated data) and the later chapters reuse them, so the grid runs once. Each executed
notebook must contain at least one rendered chart (the chapters draw their figures through ``papa_lib.book``; only
the chapters of :data:`CHARTLESS_CHAPTERS` may have none), and no error output.

Also checked here: the GPU reproduction workflow (``.github/workflows/reproduce-gpu.yml``) and the paper
profile's grid file (``data/results/paper/grid.yaml``), which cannot run on these machines.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
import yaml
from papa_book import build

from papa_lib.book import charts
from papa_lib.book.profiles import PAPER_MODELS
from papa_lib.experiments.grid import load_grid

REPO = Path(__file__).resolve().parents[1]
TOC_CHAPTERS = build.toc_chapters(REPO)
#: Chapters without a figure (the grid-file reference is a table).
CHARTLESS_CHAPTERS: set[str] = {"gridfile"}  # a reference table, no figure
#: Seconds a smoke-profile cell may run: a whole chapter takes 5-20 s here, so a kernel that stops answering fails
#: its chapter in minutes instead of holding CI to its limit.
SMOKE_CELL_TIMEOUT = 600


def _chart_outputs(executed: Path) -> int:
    """How many rendered charts (the offline renderer's ``<div class="papa-vega-chart">``) a notebook holds."""
    notebook = nbformat.read(executed, as_version=4)
    count = 0
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            html = output.get("data", {}).get("text/html", "")
            if isinstance(html, list):
                html = "".join(html)
            count += html.count(f'class="{charts.CHART_CLASS}"')
    return count


def _errors(executed: Path) -> list[str]:
    notebook = nbformat.read(executed, as_version=4)
    return [f"{o.get('ename')}: {o.get('evalue')}" for c in notebook.cells for o in c.get("outputs", [])
            if o.get("output_type") == "error"]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """One output folder and one results folder shared by every chapter of this module."""
    root = tmp_path_factory.mktemp("chapters")
    return {"out": root / "runs", "results": root / "results"}


def test_toc_lists_every_chapter_and_nothing_else():
    on_disk = {p.resolve() for p in (REPO / "book").glob("*.md")}
    listed = {p.resolve() for p in TOC_CHAPTERS}
    assert not on_disk - listed, f"book/*.md not in _toc.yml: {sorted(p.name for p in on_disk - listed)}"
    assert not listed - on_disk, (
        f"_toc.yml lists files that are not book/*.md: {sorted(str(p) for p in listed - on_disk)}"
    )
    assert len(listed) == len(TOC_CHAPTERS), "a chapter is listed twice in _toc.yml"


@pytest.mark.slow
@pytest.mark.parametrize("chapter", TOC_CHAPTERS, ids=lambda p: p.stem)
def test_chapter_executes_at_smoke_profile(chapter, smoke_run):
    try:
        executed = build.run_chapters(
            "smoke", smoke_run["out"], parameters={"results_dir": str(smoke_run["results"])}, chapters=[chapter],
            resume=False, root=REPO, cell_timeout=SMOKE_CELL_TIMEOUT,
        )
    except build.ChapterExecutionError as error:
        pytest.fail(f"{chapter.name} failed at the smoke profile: {error}")
    assert [p.name for p in executed] == [f"{chapter.stem}.ipynb"]
    notebook = executed[0]
    assert (notebook.parent / f"{chapter.stem}.done").is_file(), f"{chapter.name}: no done-marker was written"
    assert not _errors(notebook), f"{chapter.name}: error outputs {_errors(notebook)}"
    if chapter.stem not in CHARTLESS_CHAPTERS:
        assert _chart_outputs(notebook) >= 1, f"{chapter.name}: no chart was rendered at smoke"


def test_gpu_workflow_runs_the_paper_profile_and_uploads_artifacts():
    """(The matrix, the 24-hour limit and the resuming checkout: tests/test_workflow.py.)"""
    path = REPO / ".github" / "workflows" / "reproduce-gpu.yml"
    workflow = yaml.safe_load(path.read_text(encoding="utf-8"))
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as True
    assert "workflow_dispatch" in triggers
    job = workflow["jobs"]["book"]
    assert job["runs-on"] == ["self-hosted", "gpu"]
    scripts = "\n".join(step.get("run", "") for step in job["steps"])
    assert 'pip install -e ".[book]"' in scripts
    assert "papa reproduce" in scripts and "--profile paper" in scripts
    assert "papa book" in scripts
    assert "${{ inputs." not in scripts, "workflow inputs must reach scripts through env, not be pasted in"
    uploads = [
        step["with"]["path"] for step in job["steps"] if str(step.get("uses", "")).startswith("actions/upload-artifact")
    ]
    assert any("runs/" in path for path in uploads) and any("_build/html" in path for path in uploads)


def test_paper_grid_file_follows_table3():
    spec = load_grid(REPO / "data" / "results" / "paper" / "grid.yaml")
    assert spec["profile"] == "paper" and spec["device"] == "cuda"
    assert spec["seeds"] == [0, 1, 2]
    assert spec["limit"] is None and spec["eval_limit"] is None
    for key in ("max_length", "epochs", "lambda_epochs", "inloop_epochs", "lambda_learning_rate", "data_dir"):
        assert spec.get(key) is None, f"the paper grid must not override {key} (Table 3 / hub data)"
    assert spec["model"] in PAPER_MODELS
    blocks = {block.name: block for block in spec["blocks"]}
    assert list(blocks) == ["fig2", "table1", "table2", "fig5"]
    assert set(blocks["fig2"].tasks) == {"cola", "sst2", "mrpc", "mnli", "ner", "pos"}
    assert blocks["table2"].matrices_from == "mnli" and "mnli" not in blocks["table2"].tasks
    assert set(blocks["fig5"].orders) == {"lambda", "reversed", "first_to_last", "last_to_first", "random"}
