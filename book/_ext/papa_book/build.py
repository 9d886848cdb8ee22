"""Tooling for the PAPA Jupyter Book: builds, profile runs and the command line.

The book reproduces "How Much Does Attention Actually Attend?" (Hassid et al. 2022) and the
norm-based attention analysis (Kobayashi et al. 2020) as executable chapters.  Chapters live in
``book/*.md`` as jupytext MyST markdown (the text is the source of truth); a paired ``.ipynb``
next to each one is generated for Google Colab.  The chapters, their twins
(:func:`~papa_book.chapters.sync_notebooks`, :func:`~papa_book.chapters.check_notebooks`) and their
Colab badges (:func:`~papa_book.chapters.colab_badge`) live in :mod:`papa_book.chapters`, the
repository's root (:func:`~papa_lib.book.profiles.find_repo_root`) in :mod:`papa_lib.book.profiles`:
import them from there (the ``sync``, ``check`` and ``badge`` commands here call them).  This module

* builds the book with Jupyter Book 1.x (:func:`build_book`), failing when any page failed to
  execute, in this build or in an earlier one it did not redo (:mod:`papa_book.execution`),
  or when a page links, inside the book, to a file that does not exist (:func:`check_links`),
* executes every chapter under a run profile with papermill (:func:`run_chapters`), which backs
  ``papa reproduce --profile P``,
* and, with :mod:`papa_book.sphinx_hooks`, makes up the tiny Sphinx extension (``setup``,
  loaded through ``sphinx.local_extensions`` in ``_config.yml``) that writes the offline vega
  bundle of :mod:`papa_lib.book.charts` into the book's ``_static`` folder and adds it to every
  page, copies MathJax 2 (from the ``jupyter-server-mathjax`` package) next to it so that
  equations need no CDN either, and keeps executed pages honest (:mod:`papa_book.execution`).

Command line: ``python -m papa_book {sync,check,build,badge,run} ...`` (see :func:`main`).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from papa_lib.book.profiles import find_repo_root

from .chapters import (
    check_install_cells,
    check_notebooks,
    colab_badge,
    load_config,
    notebook_from_chapter,
    placeholder_warning,
    sync_notebooks,
    toc_chapters,
)

__all__ = [
    "BUILD_ENV_FLAG",
    "DEFAULT_CELL_TIMEOUT",
    "BookBuildError",
    "ChapterExecutionError",
    "build_book",
    "check_links",
    "failure_line",
    "main",
    "run_chapters",
    "with_pythonpath",
]

logger = logging.getLogger(__name__)

#: Environment variable papermill-free code can read to know the book is being built.
BUILD_ENV_FLAG = "PAPA_BOOK_BUILD"

#: Seconds a chapter's cell may run under :func:`run_chapters` when the book's ``_config.yml`` sets no
#: ``execute.timeout`` (the book's own sets 1800, which the build and papermill runs share).
DEFAULT_CELL_TIMEOUT = 1800


class BookBuildError(RuntimeError):
    """``jupyter-book build`` failed; the message holds the tail of its log."""


class ChapterExecutionError(RuntimeError):
    """A chapter failed while :func:`run_chapters` executed it (the message names the chapter and the cell)."""


def failure_line(what: str, error: BaseException) -> str:
    """The one line ``papa book`` and ``papa reproduce`` print when a chapter or the build fails:
    ``papa: error: <what>: <the error's first line>`` (a log's tail stays in the log file the message names)."""
    text = str(error).strip()
    return f"papa: error: {what}: {text.splitlines()[0] if text else type(error).__name__}"


# --------------------------------------------------------------------------------------------
# Building the book
# --------------------------------------------------------------------------------------------


def _jupyter_book_command() -> list[str]:
    """The ``jupyter-book`` CLI of the running Python environment.

    jupyter-book 1.0.4 has no ``__main__`` module, so ``python -m jupyter_book`` does not
    work; the click entry point is called through ``python -c`` instead.
    """
    return [
        sys.executable,
        "-c",
        "import sys; from jupyter_book.cli.main import main; sys.exit(main())",
    ]


def with_pythonpath(env: dict[str, str], root: Path) -> dict[str, str]:
    """Return ``env`` with ``root`` first on PYTHONPATH (so kernels import this checkout)."""
    env = dict(env)
    parts = [str(root)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(root)]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def build_book(
    root: str | os.PathLike = ".",
    warnings_as_errors: bool = True,
    fresh: bool = False,
    builder: str = "html",
    log_tail_lines: int = 60,
) -> Path:
    """Build the book with ``jupyter-book build`` and return the HTML folder.

    Runs in a subprocess of the same Python environment; ``warnings_as_errors`` adds
    ``-W -n --keep-going`` (the project's standard), ``fresh`` adds ``--all`` (rebuild every
    page, not only the changed ones).  The full log is written to ``_build/papa-build.log``;
    on failure :class:`BookBuildError` is raised with its last ``log_tail_lines`` lines.

    A page whose execution failed fails the build even when warnings are allowed, and also on a
    later build that did not execute it again: the book's Sphinx extension writes every page's
    execution status to ``_build/papa-execution.json`` (:mod:`papa_book.execution`), which is
    checked here, and it executes failed pages again on the next build (and every page when
    papa_lib or ``data/`` changed), so a page never shows an old failure or older library code.
    """
    from . import execution

    root = Path(root).resolve()
    for required in ("_config.yml", "_toc.yml"):
        if not (root / required).is_file():
            raise FileNotFoundError(f"{root / required} not found: build_book() needs the book root")
    command = _jupyter_book_command() + ["build", str(root), "--builder", builder]
    if warnings_as_errors:
        command += ["-W", "-n", "--keep-going"]
    if fresh:
        command.append("--all")
    warning = placeholder_warning(root)
    if warning:
        print(warning, file=sys.stderr)
    env = with_pythonpath(os.environ, root)
    build_dir = root / "_build"
    (build_dir / execution.REPORT_NAME).unlink(missing_ok=True)  # only this build's report counts
    proc = subprocess.run(
        command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    log_path = build_dir / "papa-build.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text(proc.stdout, encoding="utf-8")
    out_dir = build_dir / ("html" if builder in ("html", "dirhtml", "singlehtml") else builder)
    failed = proc.returncode != 0 or "build finished with problems" in proc.stdout
    if failed:
        tail = "\n".join(proc.stdout.splitlines()[-log_tail_lines:])
        raise BookBuildError(
            f"jupyter-book build of {root} failed (exit code {proc.returncode}); "
            f"full log: {log_path}\n--- last {log_tail_lines} lines ---\n{tail}"
        )
    _check_execution_report(root, build_dir, out_dir)
    if builder in ("html", "dirhtml", "singlehtml"):
        check_links(out_dir)
    return out_dir


def check_links(html_dir: str | os.PathLike) -> None:
    """Raise :class:`BookBuildError` when a built page links, inside the book, to a file that does not exist
    (:func:`papa_book.page_check.broken_links`): a chapter linking a page that is not in ``_toc.yml``."""
    from .page_check import broken_links

    broken = broken_links(html_dir)
    if broken:
        shown = "; ".join(broken[:10]) + (f"; and {len(broken) - 10} more" if len(broken) > 10 else "")
        raise BookBuildError(f"{len(broken)} broken internal link(s) in {html_dir}: {shown}")


def _check_execution_report(root: Path, build_dir: Path, out_dir: Path) -> None:
    """Raise :class:`BookBuildError` when the build's execution report names a failed page, or when the book loads
    this package's Sphinx extension (which writes the report) and the report is missing."""
    from . import execution

    report = execution.read_report(build_dir)
    if report is None:
        extensions = ((load_config(root).get("sphinx") or {}).get("local_extensions") or {})
        if "papa_book" in extensions:
            raise BookBuildError(f"the build of {root} wrote no execution report ({build_dir / execution.REPORT_NAME})")
        return
    failed = execution.failed_pages(report)
    if failed:
        details = "; ".join(f"{doc} ({error}, traceback: {out_dir / 'reports' / (doc + '.err.log')})"
                            for doc, error in failed.items())
        raise BookBuildError(f"{len(failed)} page(s) of {root} failed to execute: {details}")


# --------------------------------------------------------------------------------------------
# Executing chapters under a profile (papa reproduce)
# --------------------------------------------------------------------------------------------

_PROFILE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def _resolve_chapters(root: Path, chapters: Sequence[str | os.PathLike] | None) -> list[Path]:
    """Map chapter names ("intro"), file names or paths to markdown files; default: the toc."""
    if chapters is None:
        return toc_chapters(root)
    resolved = []
    for item in chapters:
        text = str(item)
        candidates = [Path(text), root / text, root / "book" / text]
        candidates += [c.with_name(c.name + ".md") for c in candidates if c.suffix != ".md"]
        found = next((c for c in candidates if c.is_file() and c.suffix == ".md"), None)
        if found is None:
            raise FileNotFoundError(f"chapter {text!r} not found (looked in {root} and {root / 'book'})")
        resolved.append(found.resolve())
    return resolved


def _read_marker(marker: Path) -> dict | None:
    """Return a done-marker's content, or None when it is missing or unreadable."""
    try:
        return json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def run_chapters(
    profile: str,
    out_dir: str | os.PathLike,
    parameters: dict | None = None,
    chapters: Sequence[str | os.PathLike] | None = None,
    resume: bool = True,
    root: str | os.PathLike | None = None,
    kernel_name: str | None = None,
    log_output: bool = False,
    cell_timeout: float | None = None,
) -> list[Path]:
    """Execute chapters with papermill under a run profile; return the executed notebooks.

    Each chapter (default: every markdown chapter of ``_toc.yml``, in reading order) is
    converted with jupytext to ``out_dir/<profile>/_inputs/<chapter>.ipynb`` and executed by
    papermill with ``parameters=dict(profile=profile, **parameters)`` (injected after the cell
    tagged ``parameters``) and the repository root as working directory.  The executed
    notebook goes to ``out_dir/<profile>/<chapter>.ipynb`` and a JSON done-marker to
    ``<chapter>.done``.  With ``resume`` a chapter whose notebook and marker exist (with the
    same parameters, chapter source and library fingerprint: papa_lib's files and ``data/``,
    :func:`papa_book.execution.fingerprint`) is skipped.  A failing chapter raises
    :class:`ChapterExecutionError`; its partial notebook and the chapters already done are kept,
    and it has no marker, so the next run executes it again.

    ``cell_timeout`` bounds each cell in seconds (default: the book's own ``execute.timeout`` in ``_config.yml``,
    :data:`DEFAULT_CELL_TIMEOUT` without one), so a kernel that stops answering fails its chapter, naming it,
    instead of blocking a batch run for ever.
    """
    import nbformat
    import papermill

    from . import execution

    if not isinstance(profile, str) or not _PROFILE_RE.fullmatch(profile):
        raise ValueError(f"profile must be a name like 'smoke', 'local' or 'paper', got {profile!r}")
    parameters = dict(parameters or {})
    if "profile" in parameters:
        raise ValueError("pass the profile as run_chapters(profile=...), not inside parameters")
    all_parameters = {"profile": profile, **parameters}
    try:
        json.dumps(all_parameters)
    except TypeError as exc:
        raise ValueError(f"chapter parameters must be JSON-serialisable: {exc}") from exc
    root_path = find_repo_root(root if root is not None else Path.cwd())
    chapter_paths = _resolve_chapters(root_path, chapters)
    if cell_timeout is None:
        cell_timeout = (load_config(root_path).get("execute") or {}).get("timeout", DEFAULT_CELL_TIMEOUT)
    if not isinstance(cell_timeout, int | float) or isinstance(cell_timeout, bool) or cell_timeout <= 0:
        raise ValueError(f"cell_timeout must be a positive number of seconds, got {cell_timeout!r}")
    run_dir = Path(out_dir).resolve() / profile
    inputs_dir = run_dir / "_inputs"
    inputs_dir.mkdir(parents=True, exist_ok=True)

    library = execution.fingerprint(root_path)
    executed_paths: list[Path] = []
    for chapter in chapter_paths:
        name = chapter.stem
        executed = run_dir / f"{name}.ipynb"
        marker = run_dir / f"{name}.done"
        done = _read_marker(marker)
        if resume and executed.is_file() and done is not None:
            same = {"parameters": done.get("parameters") == all_parameters,
                    "chapter source": done.get("source_sha256") == hashlib.sha256(chapter.read_bytes()).hexdigest(),
                    "papa_lib or data/": done.get("library") == library}
            if all(same.values()):
                logger.info("%s: already executed under profile %s, skipping (resume)", name, profile)
                executed_paths.append(executed)
                continue
            changed = ", ".join(what for what, ok in same.items() if not ok)
            logger.info("%s: %s changed since the last run, executing again", name, changed)
        marker.unlink(missing_ok=True)
        source = notebook_from_chapter(chapter)
        input_path = inputs_dir / f"{name}.ipynb"
        nbformat.write(source, input_path)
        logger.info("%s: executing under profile %s -> %s", name, profile, executed)
        started = _dt.datetime.now(_dt.timezone.utc)
        try:
            papermill.execute_notebook(
                str(input_path),
                str(executed),
                parameters=all_parameters,
                cwd=str(root_path),
                kernel_name=kernel_name,
                progress_bar=False,
                log_output=log_output,
                execution_timeout=cell_timeout,
            )
        except Exception as exc:  # papermill raises PapermillExecutionError, kernels other errors
            finished = [p.stem for p in executed_paths]
            if hasattr(exc, "ename"):  # PapermillExecutionError: the exception raised in the cell
                summary = f"{exc.ename}: {exc.evalue} (in cell [{exc.exec_count}])"
            else:
                summary = f"{type(exc).__name__}: {str(exc).strip()[:2000]}"
            raise ChapterExecutionError(
                f"chapter {name} ({chapter}) failed under profile {profile!r}: {' '.join(summary.split())}; "
                f"partial notebook: {executed}; chapters done and kept: {finished or 'none'}"
            ) from exc
        marker.write_text(
            json.dumps(
                {
                    "chapter": name,
                    "source": str(chapter),
                    "source_sha256": hashlib.sha256(chapter.read_bytes()).hexdigest(),
                    "library": library,
                    "profile": profile,
                    "parameters": all_parameters,
                    "started": started.isoformat(),
                    "finished": _dt.datetime.now(_dt.timezone.utc).isoformat(),
                },
                indent=2,
                sort_keys=True,
            )
            + "\n",
            encoding="utf-8",
        )
        executed_paths.append(executed)
    return executed_paths


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def _parse_parameter(text: str) -> tuple[str, Any]:
    """Parse ``key=value`` (value as JSON when it parses, else a string)."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    key, value = text.split("=", 1)
    if not key.isidentifier():
        raise argparse.ArgumentTypeError(f"parameter name {key!r} is not a Python identifier")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m papa_book", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("sync", help="regenerate the paired .ipynb of every book/*.md chapter")
    p.add_argument("--book-dir", default="book", help="folder of the chapters (default: book)")
    p.add_argument("--no-links", action="store_true", help="do not rewrite the Colab badges and install cells")

    p = sub.add_parser("check", help="fail when a paired .ipynb, a Colab badge or an install cell is out of date")
    p.add_argument("--book-dir", default="book", help="folder of the chapters (default: book)")

    p = sub.add_parser("build", help="jupyter-book build (warnings are errors by default)")
    p.add_argument("--root", default=".", help="the book's root, holding _config.yml and _toc.yml (default: .)")
    p.add_argument("--allow-warnings", action="store_true", help="build even when Sphinx warns")
    p.add_argument("--all", dest="fresh", action="store_true", help="rebuild every page")

    p = sub.add_parser("badge", help="print the Colab badge markdown of a chapter")
    p.add_argument("chapter", help="chapter name or path (e.g. intro or book/intro.md)")
    p.add_argument("--config", default="_config.yml", help="the book's configuration (default: _config.yml)")

    p = sub.add_parser("run", help="execute the chapters with papermill under a profile")
    p.add_argument("--profile", required=True, help="smoke, local or paper")
    p.add_argument("--out-dir", default="runs", help="executed notebooks go to OUT_DIR/<profile>/ (default: runs)")
    p.add_argument("--chapter", action="append", dest="chapters", help="chapter name (repeatable)")
    p.add_argument("-p", "--parameter", action="append", type=_parse_parameter, default=[],
                   help="extra chapter parameter key=value (JSON values allowed)")
    p.add_argument("--no-resume", action="store_true", help="run chapters that already finished again")
    p.add_argument("--root", default=None, help="the book's root (default: found from the working directory)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the process exit status."""
    args = _build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.command == "sync":
            written = sync_notebooks(args.book_dir, update_links=not args.no_links)
            print(f"{len(written)} notebook(s) written" + "".join(f"\n  {p}" for p in written))
        elif args.command == "check":
            problems = check_notebooks(args.book_dir)
            if (find_repo_root(Path(args.book_dir)) / "_config.yml").is_file():
                problems += check_install_cells(args.book_dir)
            for problem in problems:
                print(problem, file=sys.stderr)
            return 1 if problems else 0
        elif args.command == "build":
            html_dir = build_book(args.root, warnings_as_errors=not args.allow_warnings, fresh=args.fresh)
            print(f"book built: {html_dir / 'index.html'}")
        elif args.command == "badge":
            print(colab_badge(args.chapter, args.config))
        elif args.command == "run":
            done = run_chapters(
                args.profile,
                args.out_dir,
                parameters=dict(args.parameter),
                chapters=args.chapters,
                resume=not args.no_resume,
                root=args.root,
            )
            print("\n".join(str(p) for p in done))
    except (BookBuildError, ChapterExecutionError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
