"""The GPU reproduction workflow (.github/workflows/reproduce-gpu.yml) cannot run here: its YAML is checked against
what it must do (resume, no job over 24 hours, one job per model and task, the book from the paper profile)."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import yaml

from papa_lib.book.profiles import PAPER_MODELS
from papa_lib.experiments.grid import load_grid

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "reproduce-gpu.yml"


def _workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def expand(matrix: dict) -> list[dict]:
    """GitHub Actions' matrix expansion: the product of the list-valued keys, then ``exclude``, then ``include``
    (an include that matches no combination adds a job of its own)."""
    keys = [k for k in matrix if k not in ("include", "exclude")]
    jobs = [dict(zip(keys, values)) for values in itertools.product(*(matrix[k] for k in keys))]
    for rule in matrix.get("exclude", []):
        jobs = [job for job in jobs if any(job.get(k) != v for k, v in rule.items())]
    for extra in matrix.get("include", []):
        matched = [job for job in jobs if all(job.get(k) == v for k, v in extra.items() if k in keys)]
        if matched:
            for job in matched:
                job.update(extra)
        else:
            jobs.append(dict(extra))
    return jobs


def test_expand_follows_github_semantics():
    matrix = {"a": [1, 2], "b": ["x", "y"], "exclude": [{"a": 2, "b": "y"}], "include": [{"a": 1, "c": True},
                                                                                       {"a": 3, "b": "z"}]}
    assert expand(matrix) == [{"a": 1, "b": "x", "c": True}, {"a": 1, "b": "y", "c": True}, {"a": 2, "b": "x"},
                              {"a": 3, "b": "z"}]


def test_workflow_schema():
    flow = _workflow()
    assert {"name", "jobs"} <= set(flow) and "workflow_dispatch" in (flow.get("on") or flow.get(True))
    for name, job in flow["jobs"].items():
        assert {"runs-on", "steps", "timeout-minutes"} <= set(job), name
        assert "gpu" in job["runs-on"] and "self-hosted" in job["runs-on"], name
        assert 0 < job["timeout-minutes"] <= 24 * 60, f"{name} may run longer than 24 hours"
        for step in job["steps"]:
            assert ("uses" in step) != ("run" in step), (name, step)
            if step.get("uses", "").startswith("actions/checkout@"):
                assert step["with"]["clean"] is False, f"{name}: checkout must keep runs/, .venv and results"
        for step in job["steps"]:  # inputs and matrix values reach scripts through env, never pasted in
            assert "${{" not in step.get("run", ""), (name, step["name"])


def test_one_job_per_model_and_task_of_the_paper_grid():
    grid = _workflow()["jobs"]["grid"]
    tasks = sorted({task for block in load_grid(ROOT / "data" / "results" / "paper" / "grid.yaml")["blocks"]
                    for task in block.tasks})
    jobs = expand(grid["strategy"]["matrix"])
    assert sorted((job["model"], job["task"]) for job in jobs) == sorted(itertools.product(PAPER_MODELS, tasks))
    assert len(jobs) == len(PAPER_MODELS) * len(tasks) <= 256  # GitHub's limit per matrix
    assert grid["strategy"]["fail-fast"] is False  # one slow or failing job does not cancel the others
    script = next(step["run"] for step in grid["steps"] if "papa grid" in step.get("run", ""))
    assert 'papa grid data/results/paper/grid.yaml --model "$MODEL" --task "$TASK" --device cuda' in script
    step = next(step for step in grid["steps"] if "papa grid" in step.get("run", ""))
    assert step["env"] == {"MODEL": "${{ matrix.model }}", "TASK": "${{ matrix.task }}"}


def test_the_book_is_built_from_the_paper_profiles_results():
    book = _workflow()["jobs"]["book"]
    assert book["needs"] == "grid"
    runs = [step.get("run", "") for step in book["steps"]]
    merge = next(i for i, run in enumerate(runs) if 'ResultsStore("data/results/paper")' in run)
    reproduce = next(i for i, run in enumerate(runs) if "papa reproduce --profile paper" in run)
    build = next(i for i, run in enumerate(runs) if "papa book" in run)
    assert merge < reproduce < build
    assert 'profile = "paper"' in runs[build]
    uploaded = [step for step in book["steps"] if step.get("uses", "").startswith("actions/upload-artifact")]
    assert any(step["with"]["path"] == "_build/html" and "paper" in step["with"]["name"] for step in uploaded)
    # the step that sets the chapters' profile finds exactly one parameter in every chapter of the book
    pattern = re.compile(r'^profile = "local"', re.M)
    chapters = sorted((ROOT / "book").glob("*.md"))
    assert chapters and all(len(pattern.findall(path.read_text())) == 1 for path in chapters)
