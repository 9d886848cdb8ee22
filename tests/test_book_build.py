"""`papa book` never reports success while a page shows a failure, and no page shows output of older library code.

Sphinx reads (and MyST-NB executes) only the pages whose source changed since the last build, so before
:mod:`papa_book.execution` a second build after a failed one reported success while the failed page still
showed its traceback, and a change to papa_lib left every page with the old library's output. Here: a tiny book
built for real with ``jupyter-book`` (the repository's ``_config.yml``, a copy of papa_lib inside it), and fast
checks of the fingerprint, the execution report, ``papa book``'s exit status and ``papa reproduce``'s markers.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml
from papa_book import build, chapters, execution

from conftest import JUPYTEXT_HEADER, copy_favicon
from papa_lib import cli

REPO = Path(__file__).resolve().parents[1]

CHAPTER = JUPYTEXT_HEADER + textwrap.dedent(
    """\

    # {name}

    ```{{code-cell}} ipython3
    :tags: [parameters]

    profile = "local"
    ```

    ```{{code-cell}} ipython3
    with open("{log}", "a") as log:  # relative to the working directory: book/ in a build, the root under papermill
        log.write("{name}\\n")
    {body}
    ```
    """
)


def _chapter(name: str, body: str = "", log: str = "executions.txt") -> str:
    return CHAPTER.format(name=name, body=body, log=log)


def _executions(root: Path) -> list[str]:
    path = root / "book" / "executions.txt"  # chapters run in book/ (run_in_temp: false)
    return path.read_text(encoding="utf-8").split() if path.is_file() else []


@pytest.fixture
def tiny_book(tmp_path) -> Path:
    """The repository's book configuration with two chapters, ``good`` and ``bad`` (raises), and its own papa_lib."""
    root = tmp_path / "book-root"
    (root / "book").mkdir(parents=True)
    shutil.copy2(REPO / "_config.yml", root / "_config.yml")
    copy_favicon(yaml.safe_load((REPO / "_config.yml").read_text(encoding="utf-8")), root)
    (root / "_toc.yml").write_text("format: jb-book\nroot: book/good\nchapters:\n  - file: book/bad\n",
                                   encoding="utf-8")
    shutil.copytree(REPO / "papa_lib", root / "papa_lib", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "book" / "_ext", root / "book" / "_ext", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "book" / "good.md").write_text(_chapter("good"), encoding="utf-8")
    (root / "book" / "bad.md").write_text(_chapter("bad", 'raise RuntimeError("deliberate failure")'), encoding="utf-8")
    return root


@pytest.mark.slow
def test_a_failed_page_fails_every_build_until_fixed_and_library_changes_execute_every_page(tiny_book):
    root = tiny_book
    with pytest.raises(build.BookBuildError):
        build.build_book(root)
    assert sorted(_executions(root)) == ["bad", "good"]
    report = execution.read_report(root / "_build")
    assert execution.failed_pages(report) == {"book/bad": "CellExecutionError"}
    assert report["pages"]["book/good"]["succeeded"] is True

    # Nothing changed: the failed page executes again (and fails), the good one is not redone. Warnings allowed,
    # so only the execution report can tell.
    with pytest.raises(build.BookBuildError, match=r"1 page\(s\) .* failed to execute: book/bad \(CellExecutionError"):
        build.build_book(root, warnings_as_errors=False)
    assert sorted(_executions(root)) == ["bad", "bad", "good"]

    # A change to papa_lib (here: its copy inside the book root, which the build imports) executes every page.
    with (root / "papa_lib" / "book" / "execution.py").open("a", encoding="utf-8") as handle:
        handle.write("# a change of the library\n")
    with pytest.raises(build.BookBuildError):
        build.build_book(root)
    assert sorted(_executions(root)) == ["bad", "bad", "bad", "good", "good"]

    # Fixed: the build succeeds, the page no longer shows the failure, the good page was not executed again.
    (root / "book" / "bad.md").write_text(_chapter("bad"), encoding="utf-8")
    html = build.build_book(root)
    assert sorted(_executions(root)) == ["bad", "bad", "bad", "bad", "good", "good"]
    assert execution.failed_pages(execution.read_report(root / "_build")) == {}
    assert "deliberate failure" not in (html / "book" / "bad.html").read_text(encoding="utf-8")


def test_fingerprint_follows_the_library_and_the_data_folder(tmp_path, monkeypatch):
    package, root = tmp_path / "pkg", tmp_path / "root"
    (package / "sub").mkdir(parents=True)
    (root / "data" / "results").mkdir(parents=True)
    (package / "sub" / "m.py").write_text("x = 1\n")
    (root / "data" / "results" / "results.csv").write_text("a,b\n1,2\n")
    first = execution.fingerprint(root, package=package)
    assert len(first) == 16 and execution.fingerprint(root, package=package) == first
    (package / "sub" / "__pycache__").mkdir()
    (package / "sub" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\0")
    assert execution.fingerprint(root, package=package) == first, "byte-code is not part of the library"
    (package / "sub" / "m.py").write_text("x = 2\n")
    second = execution.fingerprint(root, package=package)
    assert second != first
    (root / "data" / "results" / "results.csv").write_text("a,b\n1,3\n")
    assert execution.fingerprint(root, package=package) != second
    assert execution.fingerprint(None, package=package) == execution.fingerprint(tmp_path / "none", package=package)


def _fake_jupyter_book(monkeypatch, pages: dict | None, returncode: int = 0):
    """Replace the jupyter-book subprocess by one that writes ``pages`` as its execution report (None: no report)."""

    def run(command, cwd, **kwargs):
        if pages is not None:
            execution.write_report(Path(cwd) / "_build", pages, "0" * 16)
        return subprocess.CompletedProcess(command, returncode, stdout="build succeeded.\n")

    monkeypatch.setattr(build.subprocess, "run", run)


def test_build_book_reads_the_execution_report(tmp_path, monkeypatch):
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy2(REPO / name, tmp_path / name)
    ok = {"succeeded": True, "error": None, "method": "force", "runtime": 1.0, "mtime": 1.7e9}
    failed = dict(ok, succeeded=False, error="CellExecutionError")
    _fake_jupyter_book(monkeypatch, {"book/intro": ok, "book/mlm": failed, "genindex": None})
    with pytest.raises(build.BookBuildError, match=r"book/mlm \(CellExecutionError, traceback: .*mlm\.err\.log\)"):
        build.build_book(tmp_path)
    report = json.loads((tmp_path / "_build" / execution.REPORT_NAME).read_text())
    assert report["pages"]["genindex"] == {"executed": False}
    _fake_jupyter_book(monkeypatch, {"book/intro": ok, "book/mlm": ok})
    assert build.build_book(tmp_path) == tmp_path / "_build" / "html"
    _fake_jupyter_book(monkeypatch, None)  # the book's extension always writes one: its absence is a failure
    with pytest.raises(build.BookBuildError, match="wrote no execution report"):
        build.build_book(tmp_path)


def test_papa_book_exits_non_zero_when_the_build_fails(monkeypatch, capsys):
    monkeypatch.setattr(chapters, "sync_notebooks", lambda *args, **kwargs: [])

    def failing(*args, **kwargs):
        raise build.BookBuildError("1 page(s) of /x failed to execute: book/mlm (CellExecutionError, ...)")

    monkeypatch.setattr(build, "build_book", failing)
    assert cli.main(["book"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("papa: error: the book did not build: 1 page(s) of /x failed to execute: book/mlm")


def test_reproduce_runs_a_chapter_again_when_the_library_changed(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    (root / "book").mkdir(parents=True)
    (root / "_config.yml").write_text("title: t\n", encoding="utf-8")
    (root / "_toc.yml").write_text("format: jb-book\nroot: book/only\n", encoding="utf-8")
    (root / "book" / "only.md").write_text(_chapter("only", log="runs.txt"), encoding="utf-8")
    runs = lambda: (root / "runs.txt").read_text().split()  # noqa: E731  (papermill runs chapters in the root)
    monkeypatch.setattr(execution, "fingerprint", lambda *args, **kwargs: "a" * 16)
    build.run_chapters("smoke", tmp_path / "out", root=root)
    build.run_chapters("smoke", tmp_path / "out", root=root)
    assert runs() == ["only"]  # resumed
    monkeypatch.setattr(execution, "fingerprint", lambda *args, **kwargs: "b" * 16)
    build.run_chapters("smoke", tmp_path / "out", root=root)
    assert runs() == ["only", "only"]
    assert json.loads((tmp_path / "out" / "smoke" / "only.done").read_text())["library"] == "b" * 16
