"""The ``papa`` console script (papa_entry.py): ``--version`` without importing papa_lib (torch), the rest passed on."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _entry():
    """papa_entry from the checkout (an editable install made before it existed does not map it)."""
    spec = importlib.util.spec_from_file_location("papa_entry", ROOT / "papa_entry.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_console_script_is_the_light_entry():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["papa"] == "papa_entry:main" and "papa_entry" in setuptools["py-modules"]


def test_version_answers_without_torch():
    """In a fresh interpreter, ``papa --version`` prints the version and leaves torch, transformers and papa_lib
    unimported."""
    code = ("import sys; sys.argv = ['papa', '--version']; import papa_entry; rc = papa_entry.main(); "
            "print(rc, *(name in sys.modules for name in ('torch', 'transformers', 'papa_lib')))")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    seconds = time.perf_counter() - start
    assert done.returncode == 0, done.stderr
    import papa_lib

    assert done.stdout.splitlines() == [f"papa {papa_lib.__version__}", "0 False False False"]
    assert seconds < 30, seconds  # about 0.1 s; importing papa_lib takes seconds


def test_version_matches_the_library_and_other_arguments_go_to_the_cli(monkeypatch, capsys):
    import papa_lib
    import papa_lib.cli

    entry = _entry()
    assert entry.version() == papa_lib.__version__
    assert entry.main(["--debug", "--version"]) == 0 and capsys.readouterr().out == f"papa {papa_lib.__version__}\n"
    seen = []
    monkeypatch.setattr(papa_lib.cli, "main", lambda argv: seen.append(argv) or 7)
    assert entry.main(["probe", "--version"]) == 7 and entry.main(["--version", "--help"]) == 7
    monkeypatch.setattr(sys, "argv", ["papa", "grid", "x.yaml"])
    assert entry.main() == 7
    assert seen == [["probe", "--version"], ["--version", "--help"], ["grid", "x.yaml"]]
