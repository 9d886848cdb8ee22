"""The book's files agree with its toc; the GPU reproduction workflow (``.github/workflows/reproduce-gpu.yml``) and
the paper profile's grid file (``data/results/paper/grid.yaml``), which cannot run on these machines, say what they
should. (Every chapter is executed at the smoke profile in a plain kernel by tests/test_notebooks.py.)"""

from __future__ import annotations

from pathlib import Path

import yaml
from papa_book import chapters

from papa_lib.book.profiles import PAPER_MODELS
from papa_lib.experiments.grid import load_grid

REPO = Path(__file__).resolve().parents[1]
TOC_CHAPTERS = chapters.toc_chapters(REPO)


def test_toc_lists_every_chapter_and_nothing_else():
    on_disk = {p.resolve() for p in (REPO / "book").glob("*.md")}
    listed = {p.resolve() for p in TOC_CHAPTERS}
    assert not on_disk - listed, f"book/*.md not in _toc.yml: {sorted(p.name for p in on_disk - listed)}"
    assert not listed - on_disk, (
        f"_toc.yml lists files that are not book/*.md: {sorted(str(p) for p in listed - on_disk)}"
    )
    assert len(listed) == len(TOC_CHAPTERS), "a chapter is listed twice in _toc.yml"


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
