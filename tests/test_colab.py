"""Colab works from a published repository: the chapters' install cell, its light ``colab`` extra, and a chapter run
as Colab runs it.

Every chapter starts with the same install cell (:func:`papa_book.chapters.install_cell`, from ``_config.yml``): in
Colab only, outside a clone, it clones ``repository.url``, checks out ``repository.version`` (or stays on the default
branch and says so in one line), installs the clone with ``.[colab]`` and moves into it. The quick tests here run the
template itself with a fake ``google.colab`` against a local git repository (pip is only recorded); the slow one
simulates Colab whole: a fresh virtual environment as the kernel, a fake ``google.colab`` loaded at its start, a
local clone of this repository's HEAD as the published repository, and one chapter's ``.ipynb`` run through
papermill from its first cell at the smoke profile.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import nbformat
import pytest
import tomllib
from papa_book import chapters

REPO = Path(__file__).resolve().parents[1]
VERSION = "v0.1.0"
#: The chapter the slow test runs in the simulated Colab (one of the cheapest at the smoke profile).
CHAPTER = "selection"
#: torch for the fresh environment: this release lies on this machine's disk (any other spec downloads gigabytes).
TORCH = "torch==2.13.0"
#: What the book's build and run tools are; none of them belongs in Colab's extra.
BUILD_TOOLS = {"jupyter-book", "sphinx", "jupytext", "papermill", "ipykernel", "myst-nb", "myst-parser",
               "jupyter-server-mathjax", "pytest", "ruff", "ray"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~ \[;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _git(*args: str, cwd: Path | None = None) -> str:
    command = ["git", "-c", "user.name=papa-test", "-c", "user.email=papa-test@example.invalid",
               "-c", "init.defaultBranch=main", "-c", "advice.detachedHead=false", *args]
    return subprocess.run(command, cwd=cwd, check=True, capture_output=True, text=True, timeout=120).stdout.strip()


def _config(path: Path, url: str, version: str = VERSION) -> Path:
    path.write_text(f"title: t\nrepository:\n  url: {url}\n  branch: main\n  version: {version}\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------
# The colab extra
# ---------------------------------------------------------------------------------------------


def test_colab_extra_is_the_charts_only():
    """The extra the install cell installs: the chapters' charts (altair, vl-convert), at the book extra's versions,
    and nothing of the build (Jupyter Book, jupytext, papermill, ipykernel: Colab has its own kernel)."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    colab = extras[chapters.COLAB_EXTRA]
    assert {_name(r) for r in colab} == {"altair", "vl-convert-python"}
    assert not {_name(r) for r in colab} & BUILD_TOOLS
    book = {_name(r): r for r in extras["book"]}
    for requirement in colab:
        assert book.get(_name(requirement)) == requirement, f"{requirement}: not the book extra's {book}"
    assert f'".[{chapters.COLAB_EXTRA}]"' in chapters.install_cell(REPO / "_config.yml")


# ---------------------------------------------------------------------------------------------
# The install cell, run in this process with a fake google.colab (pip recorded, not run)
# ---------------------------------------------------------------------------------------------


@pytest.fixture()
def published(tmp_path):
    """A local git repository standing for the published one (a _config.yml and a file), its file URL and config."""
    origin = tmp_path / "published" / "papa-book"
    origin.mkdir(parents=True)
    _git("init", "--quiet", cwd=origin)
    url = origin.as_uri()
    _config(origin / "_config.yml", url)
    (origin / "marker.txt").write_text("first\n", encoding="utf-8")
    _git("add", "-A", cwd=origin)
    _git("commit", "--quiet", "-m", "first", cwd=origin)
    return origin, url, _config(tmp_path / "_config.yml", url)


def _run_cell(source: str, cwd: Path, monkeypatch, colab: bool = True) -> tuple[list[list[str]], str]:
    """Execute an install cell in ``cwd`` (with a fake ``google.colab`` when ``colab``); git runs, pip is recorded.
    Returns the pip commands and what the cell printed."""
    import contextlib
    import io

    monkeypatch.chdir(cwd)
    if colab:
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    pips: list[list[str]] = []
    real_run = subprocess.run

    def run(command, *args, **kwargs):
        if command[:3] == [sys.executable, "-m", "pip"]:
            pips.append([*command, f"cwd={kwargs.get('cwd')}"])
            return subprocess.CompletedProcess(command, 0)
        assert command[0] == "git", command
        return real_run(command, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", run)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, "<install cell>", "exec"), {"__name__": "__main__"})
    return pips, out.getvalue()


def test_install_cell_does_nothing_outside_colab(tmp_path, published, monkeypatch):
    _, _, config = published
    work = tmp_path / "content"
    work.mkdir()
    pips, printed = _run_cell(chapters.install_cell(config), work, monkeypatch, colab=False)
    assert pips == [] and printed == "" and Path.cwd() == work and list(work.iterdir()) == []


def test_install_cell_clones_the_version_installs_the_colab_extra_and_moves_in(tmp_path, published, monkeypatch):
    origin, url, config = published
    tagged = _git("rev-parse", "HEAD", cwd=origin)
    _git("tag", VERSION, cwd=origin)
    (origin / "marker.txt").write_text("second\n", encoding="utf-8")  # the default branch moves on past the tag
    _git("commit", "--quiet", "-am", "second", cwd=origin)
    work = tmp_path / "content"
    work.mkdir()
    source = chapters.install_cell(config)
    pips, printed = _run_cell(source, work, monkeypatch)
    clone = work / "papa-book"
    assert Path.cwd() == clone and printed == ""
    assert _git("rev-parse", "HEAD", cwd=clone) == tagged and (clone / "marker.txt").read_text() == "first\n"
    assert pips == [[sys.executable, "-m", "pip", "install", "--quiet", "-e", ".[colab]", f"cwd={clone.name}"]]
    # run again inside the clone (the chapter's own folder is the clone now): nothing to do
    pips, printed = _run_cell(source, clone, monkeypatch)
    assert pips == [] and printed == "" and Path.cwd() == clone
    # run again after a runtime restart (back in the start folder): the clone is reused, the install redone
    pips, printed = _run_cell(source, work, monkeypatch)
    assert len(pips) == 1 and printed == "" and Path.cwd() == clone
    assert _git("rev-parse", "HEAD", cwd=clone) == tagged


def test_install_cell_without_the_version_stays_on_the_default_branch_and_says_so(tmp_path, published, monkeypatch):
    origin, url, config = published
    head = _git("rev-parse", "HEAD", cwd=origin)
    work = tmp_path / "content"
    work.mkdir()
    pips, printed = _run_cell(chapters.install_cell(config), work, monkeypatch)
    assert printed == chapters.VERSION_NOT_FOUND.format(version=VERSION, repository=url) + "\n"
    assert _git("rev-parse", "HEAD", cwd=work / "papa-book") == head and len(pips) == 1
    assert Path.cwd() == work / "papa-book"


# ---------------------------------------------------------------------------------------------
# A chapter in a simulated Colab
# ---------------------------------------------------------------------------------------------

#: Seconds for each step of the simulation (the whole test takes about 4 minutes here, most of it pip).
STEP_TIMEOUT = 420


def _run(command: list[str], timeout: int = STEP_TIMEOUT, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert result.returncode == 0, f"{command[:4]}... failed ({result.returncode}):\n{result.stdout[-3000:]}\n" \
                                   f"{result.stderr[-6000:]}"
    return result


@pytest.fixture(scope="module")
def colab_kernel(tmp_path_factory):
    """A fresh virtual environment as Colab's kernel: torch (which Colab has) and ipykernel, no papa_lib and no
    other package of the book; a fake ``google.colab``, imported at the kernel's start as Colab's is; returns
    (python, JUPYTER_PATH, kernel name)."""
    root = tmp_path_factory.mktemp("colab")
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "--quiet", TORCH, "ipykernel"])
    gone = subprocess.run([str(python), "-c", "import papa_lib"], capture_output=True, timeout=60, cwd=root)
    assert gone.returncode != 0, "the fresh environment must not have papa_lib yet"
    fake = root / "fake-colab"
    (fake / "google" / "colab").mkdir(parents=True)  # no google/__init__.py: other google.* packages stay visible
    (fake / "google" / "colab" / "__init__.py").write_text('"""A stand-in for Colab\'s module."""\n')
    (fake / "sitecustomize.py").write_text("import google.colab  # noqa: F401  (Colab's kernel has it loaded)\n")
    jupyter = root / "jupyter"
    _run([str(python), "-m", "ipykernel", "install", "--prefix", str(jupyter), "--name", "papa-colab"])
    spec_path = jupyter / "share" / "jupyter" / "kernels" / "papa-colab" / "kernel.json"
    spec = json.loads(spec_path.read_text())
    spec["env"] = {"PYTHONPATH": str(fake), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONNOUSERSITE": "1"}
    spec_path.write_text(json.dumps(spec))
    return python, jupyter / "share" / "jupyter", "papa-colab"


def _published_clone(root: Path, tag: bool) -> tuple[Path, str]:
    """This repository's HEAD cloned to ``root/papa-book``, its _config.yml's repository.url pointed at the clone
    itself (committed), tagged ``VERSION`` when ``tag``. Returns (clone, its file URL)."""
    clone = root / "papa-book"
    _git("clone", "--quiet", "--no-hardlinks", str(REPO), str(clone))
    url = clone.as_uri()
    config = clone / "_config.yml"
    import yaml

    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    old_url = data["repository"]["url"]
    text = config.read_text(encoding="utf-8")
    assert text.count(f"url: {old_url}") == 1
    config.write_text(text.replace(f"url: {old_url}", f"url: {url}").replace(
        f"version: {data['repository']['version']}", f"version: {VERSION}"), encoding="utf-8")
    _git("commit", "--quiet", "-am", "published at a local path", cwd=clone)
    if tag:
        _git("tag", VERSION, cwd=clone)
    return clone, url


def _chapter_notebook(clone: Path, out: Path, cells: list | None = None) -> Path:
    """The chapter's twin as published, with the install cell the template makes of the clone's _config.yml (what
    `papa_book sync` writes into every chapter); with ``cells``, the install and parameters cells and those only."""
    notebook = nbformat.read(clone / "book" / f"{CHAPTER}.ipynb", as_version=4)
    install = [c for c in notebook.cells if chapters.INSTALL_TAG in c.metadata.get("tags", [])]
    assert len(install) == 1
    install[0].source = chapters.install_cell(clone / "_config.yml")
    assert notebook.cells.index(install[0]) == next(i for i, c in enumerate(notebook.cells) if c.cell_type == "code")
    if cells is not None:
        parameters = [c for c in notebook.cells if chapters.PARAMETERS_TAG in c.metadata.get("tags", [])]
        notebook.cells = install + parameters + [nbformat.v4.new_code_cell(c) for c in cells]
    nbformat.write(notebook, out)
    return out


def _papermill(notebook: Path, output: Path, cwd: Path, jupyter: Path, kernel: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "JUPYTER_PATH")}
    env["JUPYTER_PATH"] = str(jupyter)
    command = [sys.executable, "-m", "papermill", str(notebook), str(output), "-k", kernel, "--cwd", str(cwd),
               "-p", "profile", "smoke", "--execution-timeout", str(STEP_TIMEOUT), "--log-level", "WARNING"]
    return _run(command, timeout=STEP_TIMEOUT + 60, env=env)


def _outputs(notebook: Path) -> str:
    cells = nbformat.read(notebook, as_version=4).cells
    return "".join(o.get("text", "") for c in cells if c.cell_type == "code" for o in c.outputs)


@pytest.mark.slow
def test_a_chapter_runs_in_colab_from_the_published_repository(tmp_path, colab_kernel):
    """A fresh Colab-like kernel runs the chapter from its first cell: the install cell clones the published
    repository at its version, installs it with the colab extra and works inside the clone, and the chapter then
    runs at the smoke profile; without the version the cell says so in one line and uses the default branch."""
    python, jupyter, kernel = colab_kernel
    start = time.monotonic()
    clone, url = _published_clone(tmp_path / "published", tag=True)
    content = tmp_path / "content"  # Colab's start folder: empty, no clone yet
    content.mkdir()
    output = tmp_path / f"{CHAPTER}.out.ipynb"
    _papermill(_chapter_notebook(clone, tmp_path / f"{CHAPTER}.ipynb"), output, content, jupyter, kernel)
    installed = content / "papa-book"
    assert (installed / "_config.yml").is_file()
    assert _git("rev-parse", "HEAD", cwd=installed) == _git("rev-parse", f"{VERSION}^{{commit}}", cwd=clone)
    assert "not found in" not in _outputs(output)
    where = _run([str(python), "-c", "import altair, vl_convert, papa_lib; print(papa_lib.__file__)"], cwd=tmp_path)
    assert Path(where.stdout.strip()).resolve().is_relative_to(installed.resolve()), where.stdout
    tools = ("jupyter_book", "jupytext", "papermill", "sphinx", "myst_nb")
    light = _run([str(python), "-c", f"import importlib.util as u; print([m for m in {tools} if u.find_spec(m)])"],
                 cwd=tmp_path)
    assert light.stdout.strip() == "[]", f"the colab extra brought build tools: {light.stdout}"
    print(f"chapter {CHAPTER} in simulated Colab: {time.monotonic() - start:.0f} s")

    # the published repository without the version: the default branch, and one line saying so
    untagged, untagged_url = _published_clone(tmp_path / "untagged", tag=False)
    content = tmp_path / "content-untagged"
    content.mkdir()
    probe = "import os, papa_lib\nprint('cwd', os.getcwd())\nprint('lib', papa_lib.__file__)"
    output = tmp_path / "untagged.out.ipynb"
    _papermill(_chapter_notebook(untagged, tmp_path / "untagged.ipynb", cells=[probe]), output, content, jupyter,
               kernel)
    printed = _outputs(output).splitlines()
    notice = chapters.VERSION_NOT_FOUND.format(version=VERSION, repository=untagged_url)
    assert printed.count(notice) == 1 and sum("papa:" in line for line in printed) == 1, printed
    installed = content / "papa-book"
    assert _git("rev-parse", "HEAD", cwd=installed) == _git("rev-parse", "HEAD", cwd=untagged)
    assert f"cwd {installed}" in printed and any(line.startswith(f"lib {installed}") for line in printed), printed
    print(f"both cases in simulated Colab: {time.monotonic() - start:.0f} s")


def test_the_header_launch_button_opens_the_version_the_badge_opens(tmp_path):
    """Jupyter Book points the header's Colab button at ``repository.branch``; the book's hook points it at
    ``repository.version``, as the badge and the install cell are (one version of a chapter, however it is opened)."""
    from papa_book import sphinx_hooks

    (tmp_path / "_config.yml").write_text("title: t\nrepository:\n  url: https://github.com/o/r\n  branch: main\n"
                                          "  version: v9.9\n", encoding="utf-8")
    config = types.SimpleNamespace(html_theme_options={"repository_url": "https://github.com/o/r",
                                                       "repository_branch": "main"})
    sphinx_hooks._launch_at_version(types.SimpleNamespace(confdir=str(tmp_path)), config)
    assert config.html_theme_options["repository_branch"] == "v9.9" == chapters.repository_version(tmp_path)
    assert "/blob/v9.9/" in chapters.colab_url("book/x.md", tmp_path / "_config.yml")  # the badge's link
