"""Tooling for the PAPA Jupyter Book: paired notebooks, builds, Colab badges, profile runs.

The book reproduces "How Much Does Attention Actually Attend?" (Hassid et al. 2022) and the
norm-based attention analysis (Kobayashi et al. 2020) as executable chapters.  Chapters live in
``book/*.md`` as jupytext MyST markdown (the text is the source of truth); a paired ``.ipynb``
next to each one is generated for Google Colab.  This module

* regenerates and checks those twins (:func:`sync_notebooks`, :func:`check_notebooks`),
* builds the book with Jupyter Book 1.x (:func:`build_book`), failing when any page failed to
  execute, in this build or in an earlier one it did not redo (:mod:`papa_lib.book.execution`),
* writes the "Open in Colab" badge of a chapter (:func:`colab_badge`),
* executes every chapter under a run profile with papermill (:func:`run_chapters`), which backs
  ``papa reproduce --profile P``,
* and, with :mod:`papa_lib.book.sphinx_hooks`, makes up the tiny Sphinx extension (``setup``,
  loaded through ``sphinx.local_extensions`` in ``_config.yml``) that writes the offline vega
  bundle of :mod:`papa_lib.book.charts` into the book's ``_static`` folder and adds it to every
  page, copies MathJax 2 (from the ``jupyter-server-mathjax`` package) next to it so that
  equations need no CDN either, and keeps executed pages honest (:mod:`papa_lib.book.execution`).

Command line: ``python -m papa_lib.book {sync,check,build,badge,run} ...`` (see :func:`main`).
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
from pathlib import Path
from typing import Any, Iterable, Sequence

from .profiles import find_repo_root

__all__ = [
    "BookBuildError",
    "failure_line",
    "ChapterExecutionError",
    "chapter_files",
    "check_notebooks",
    "colab_badge",
    "colab_url",
    "build_book",
    "find_repo_root",
    "install_spec",
    "load_config",
    "main",
    "notebook_from_chapter",
    "run_chapters",
    "sync_notebooks",
    "toc_chapters",
]

logger = logging.getLogger(__name__)

#: jupytext format of the chapters.
CHAPTER_FORMAT = "md:myst"
#: Tag of the papermill parameters cell every chapter must have.
PARAMETERS_TAG = "parameters"
#: Tag of the Colab install cell every chapter must have.
INSTALL_TAG = "install"
#: Image of the Colab badge.
COLAB_BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
#: The badge markdown, as a regex (used by :func:`sync_notebooks` to refresh its target).
COLAB_BADGE_RE = re.compile(
    r"\[!\[Open In Colab\]\(" + re.escape(COLAB_BADGE_IMAGE) + r"\)\]\([^)\s]*\)"
)
#: The line of the install cells that names the repository and the version Colab clones (refreshed by
#: :func:`sync_notebooks` from ``repository.url`` and ``repository.version`` in ``_config.yml``).
INSTALL_LINE_RE = re.compile(r'repository, version = "[^"]*", "[^"]*"')
#: The repository URL ``_config.yml`` ships with until the book has a home: ``papa book`` warns while it is set.
PLACEHOLDER_URL = "https://github.com/papa-book/papa-book"
#: Environment variable papermill-free code can read to know the book is being built.
BUILD_ENV_FLAG = "PAPA_BOOK_BUILD"


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
# Locations and configuration
# --------------------------------------------------------------------------------------------


def load_config(config: str | os.PathLike = "_config.yml") -> dict:
    """Read a Jupyter Book ``_config.yml`` (a file, or a folder holding one) into a dict."""
    import yaml

    path = Path(config)
    if path.is_dir():
        path = path / "_config.yml"
    if not path.is_file():
        raise FileNotFoundError(f"book config not found: {path}")
    with path.open(encoding="utf-8") as handle:
        data = yaml.safe_load(handle) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a YAML mapping at the top level, got {type(data).__name__}")
    return data


def _repository(config: str | os.PathLike) -> tuple[str, str, str, Path]:
    """Return (url without .git, branch, path_to_book, config path) from the book config."""
    path = Path(config)
    if path.is_dir():
        path = path / "_config.yml"
    repo = load_config(path).get("repository") or {}
    url = str(repo.get("url") or "").strip().rstrip("/")
    if url.endswith(".git"):
        url = url[: -len(".git")]
    if not url:
        raise ValueError(f"{path}: repository.url is not set; the Colab badge and install cell need it")
    branch = str(repo.get("branch") or "main").strip()
    path_to_book = str(repo.get("path_to_book") or "").strip().strip("/")
    return url, branch, path_to_book, path


def repository_version(config: str | os.PathLike = "_config.yml") -> str:
    """The fixed version (a tag or a commit) of the repository that Colab's install cell clones:
    ``repository.version`` in ``_config.yml``, else the branch."""
    path = Path(config)
    if path.is_dir():
        path = path / "_config.yml"
    repo = load_config(path).get("repository") or {}
    return str(repo.get("version") or _repository(path)[1]).strip()


def install_spec(config: str | os.PathLike = "_config.yml") -> str:
    """Return the pip requirement ``git+<repository.url>@<version>`` of the book's library (results not included)."""
    url, _, _, _ = _repository(config)
    return f"git+{url}@{repository_version(config)}"


def install_line(config: str | os.PathLike = "_config.yml") -> str:
    """The install cells' ``repository, version = "<url>", "<version>"`` line, from ``_config.yml``."""
    url, _, _, _ = _repository(config)
    return f'repository, version = "{url}", "{repository_version(config)}"'


def placeholder_warning(config: str | os.PathLike = "_config.yml") -> str | None:
    """One line saying that ``repository.url`` is still the placeholder (Colab links and the install cell then lead
    nowhere), or ``None`` once it names the book's real repository."""
    try:
        url, _, _, path = _repository(config)
    except (FileNotFoundError, ValueError):
        return None
    if url != PLACEHOLDER_URL:
        return None
    return (f"papa: warning: {path.name}'s repository.url is the placeholder {url}: the Colab badges, the GitHub "
            "button and the install cells lead nowhere until it names the book's repository (README: Colab)")


def colab_url(chapter_path: str | os.PathLike, config: str | os.PathLike = "_config.yml") -> str:
    """Return the Colab URL that opens the ``.ipynb`` twin of ``chapter_path`` from GitHub.

    ``chapter_path`` is relative to the folder of ``config`` (the book root), or absolute.
    """
    url, branch, path_to_book, config_path = _repository(config)
    match = re.fullmatch(r"https?://github\.com/([^/]+)/([^/]+)", url)
    if not match:
        raise ValueError(
            f"{config_path}: repository.url must be a GitHub repository "
            f"(https://github.com/<owner>/<repo>) for Colab links, got {url!r}"
        )
    owner, repo = match.groups()
    chapter = Path(chapter_path)
    book_root = config_path.resolve().parent
    if chapter.is_absolute():
        try:
            chapter = chapter.resolve().relative_to(book_root)
        except ValueError:
            raise ValueError(f"chapter {chapter_path} is not inside the book root {book_root}") from None
    rel = chapter.with_suffix(".ipynb").as_posix()
    if path_to_book:
        rel = f"{path_to_book}/{rel}"
    return f"https://colab.research.google.com/github/{owner}/{repo}/blob/{branch}/{rel}"


def colab_badge(chapter_path: str | os.PathLike, config: str | os.PathLike = "_config.yml") -> str:
    """Return the markdown "Open in Colab" badge for a chapter (see :func:`colab_url`)."""
    return f"[![Open In Colab]({COLAB_BADGE_IMAGE})]({colab_url(chapter_path, config)})"


# --------------------------------------------------------------------------------------------
# Chapters and their paired notebooks
# --------------------------------------------------------------------------------------------


def _front_matter(path: Path) -> dict:
    """Return the YAML front matter of a markdown file ({} when it has none)."""
    import yaml

    text = path.read_text(encoding="utf-8")
    match = re.match(r"---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(\r?\n|$)", text, flags=re.S)
    if not match:
        return {}
    try:
        data = yaml.safe_load(match.group(1))
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: invalid YAML front matter: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _check_chapter_header(path: Path) -> None:
    """Raise ValueError unless ``path`` is a jupytext MyST notebook with a python3 kernel."""
    meta = _front_matter(path)
    fmt = (((meta.get("jupytext") or {}).get("text_representation") or {}).get("format_name"))
    if fmt != "myst":
        raise ValueError(
            f"{path}:1: not a jupytext MyST chapter: its front matter needs "
            "jupytext.text_representation.format_name: myst (see book/intro.md)"
        )
    kernel = (meta.get("kernelspec") or {}).get("name")
    if kernel != "python3":
        raise ValueError(f"{path}:1: kernelspec.name must be python3, got {kernel!r}")


def chapter_files(book_dir: str | os.PathLike = "book") -> list[Path]:
    """Return every chapter ``book_dir/*.md``, sorted by name; each must be a MyST notebook."""
    folder = Path(book_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"book folder not found: {folder}")
    chapters = sorted(folder.glob("*.md"))
    for chapter in chapters:
        _check_chapter_header(chapter)
    return chapters


def _toc_files(entries: Iterable[Any]) -> Iterable[str]:
    """Yield every ``file:`` of a (nested) ``_toc.yml`` entry list, in reading order."""
    for entry in entries or []:
        if not isinstance(entry, dict):
            continue
        if "file" in entry:
            yield str(entry["file"])
        for key in ("parts", "chapters", "sections"):
            yield from _toc_files(entry.get(key) or [])


def toc_chapters(root: str | os.PathLike = ".") -> list[Path]:
    """Return the markdown chapters listed in ``root/_toc.yml``, in reading order."""
    import yaml

    root = Path(root)
    toc_path = root / "_toc.yml"
    if not toc_path.is_file():
        raise FileNotFoundError(f"table of contents not found: {toc_path}")
    toc = yaml.safe_load(toc_path.read_text(encoding="utf-8")) or {}
    files = ([str(toc["root"])] if toc.get("root") else []) + list(_toc_files([toc]))
    chapters: list[Path] = []
    for name in files:
        candidate = root / name
        if candidate.suffix != ".md":
            candidate = candidate.with_name(candidate.name + ".md")
        if not candidate.is_file():
            if candidate.with_suffix(".ipynb").is_file() or (root / name).is_file():
                continue  # not a markdown chapter (e.g. a plain notebook page)
            raise FileNotFoundError(f"{toc_path}: listed file {name!r} not found ({candidate})")
        if candidate not in chapters:
            chapters.append(candidate)
    return chapters


def _cell_id(stem: str, index: int, cell: Any) -> str:
    """Deterministic cell id (nbformat 4.5 ids must match [a-zA-Z0-9-_]{1,64})."""
    digest = hashlib.sha1(f"{stem}\0{index}\0{cell.cell_type}\0{cell.source}".encode("utf-8"))
    return digest.hexdigest()[:12]


def notebook_from_chapter(md_path: str | os.PathLike) -> Any:
    """Return the paired notebook of a MyST chapter: jupytext's cells, no outputs, stable ids."""
    import jupytext

    path = Path(md_path)
    if not path.is_file():
        raise FileNotFoundError(f"chapter not found: {path}")
    _check_chapter_header(path)
    notebook = jupytext.read(path, fmt=CHAPTER_FORMAT)
    for index, cell in enumerate(notebook.cells):
        cell["id"] = _cell_id(path.stem, index, cell)
        if cell.cell_type == "code":
            cell["execution_count"] = None
            cell["outputs"] = []
    meta = notebook.metadata
    jupytext_meta = dict(meta.get("jupytext") or {})
    jupytext_meta.pop("text_representation", None)
    jupytext_meta["formats"] = f"ipynb,{CHAPTER_FORMAT}"
    meta["jupytext"] = jupytext_meta
    meta.setdefault("language_info", {"name": "python"})
    notebook.nbformat, notebook.nbformat_minor = 4, 5
    return notebook


def _notebook_text(notebook: Any) -> str:
    """Serialise a notebook exactly as the twins are stored (nbformat JSON, sorted keys)."""
    import nbformat

    nbformat.validate(notebook)
    text = nbformat.writes(notebook, version=4)
    return text if text.endswith("\n") else text + "\n"


def _refresh_links(md_path: Path, config: Path) -> bool:
    """Point the chapter's Colab badge and git install requirement at the configured repository.

    Returns True when the markdown file was changed.
    """
    text = md_path.read_text(encoding="utf-8")
    rel = md_path.resolve().relative_to(config.resolve().parent)
    new = COLAB_BADGE_RE.sub(lambda _m: colab_badge(rel, config), text)
    new = INSTALL_LINE_RE.sub(lambda _m: install_line(config), new)
    if new != text:
        md_path.write_text(new, encoding="utf-8")
        return True
    return False


def sync_notebooks(book_dir: str | os.PathLike = "book", update_links: bool = True) -> list[Path]:
    """Regenerate the ``.ipynb`` twin of every ``book_dir/*.md`` chapter with jupytext.

    Output is deterministic (no outputs or execution counts, stable cell ids); a twin is
    only rewritten when its content changes.  With ``update_links`` the chapters' Colab
    badges and ``git+…`` install requirements are first refreshed from the book config's
    ``repository`` (when a ``_config.yml`` is found above ``book_dir``).  Returns the twins
    that were written.  Twins whose markdown chapter is gone are reported as warnings.
    """
    folder = Path(book_dir)
    chapters = chapter_files(folder)
    config = find_repo_root(folder) / "_config.yml"
    written: list[Path] = []
    for chapter in chapters:
        if update_links and config.is_file():
            if _refresh_links(chapter, config):
                logger.info("updated the Colab badge / install URL in %s", chapter)
        twin = chapter.with_suffix(".ipynb")
        text = _notebook_text(notebook_from_chapter(chapter))
        if not twin.is_file() or twin.read_text(encoding="utf-8") != text:
            twin.write_text(text, encoding="utf-8")
            written.append(twin)
    stems = {chapter.stem for chapter in chapters}
    for twin in sorted(folder.glob("*.ipynb")):
        if twin.stem not in stems:
            logger.warning("%s has no markdown chapter %s.md; delete it or restore the chapter", twin, twin.stem)
    return written


def _cell_summary(cell: Any) -> tuple[str, str, tuple[str, ...]]:
    """(cell type, source, tags): what a twin must share with its chapter."""
    source = cell.get("source", "")
    if isinstance(source, list):
        source = "".join(source)
    return cell.get("cell_type"), source, tuple(cell.get("metadata", {}).get("tags", []))


def check_notebooks(book_dir: str | os.PathLike = "book") -> list[str]:
    """Return one problem per chapter whose ``.ipynb`` twin is missing or out of date (or per
    orphan twin); an empty list means every twin matches its markdown chapter."""
    import nbformat

    folder = Path(book_dir)
    problems: list[str] = []
    chapters = chapter_files(folder)
    hint = "run `python -m papa_lib.book sync`"
    for chapter in chapters:
        twin = chapter.with_suffix(".ipynb")
        if not twin.is_file():
            problems.append(f"{chapter.name}: paired notebook {twin.name} is missing; {hint}")
            continue
        expected = [_cell_summary(c) for c in notebook_from_chapter(chapter).cells]
        actual = [_cell_summary(c) for c in nbformat.read(twin, as_version=4).cells]
        if expected != actual:
            first = next(
                (i for i, (e, a) in enumerate(zip(expected, actual)) if e != a),
                min(len(expected), len(actual)),
            )
            problems.append(
                f"{chapter.name}: {twin.name} differs from the markdown "
                f"({len(actual)} vs {len(expected)} cells, first difference at cell {first}); {hint}"
            )
    stems = {chapter.stem for chapter in chapters}
    for twin in sorted(folder.glob("*.ipynb")):
        if twin.stem not in stems:
            problems.append(f"{twin.name}: no markdown chapter {twin.stem}.md; delete the orphan notebook")
    return problems


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


def _with_pythonpath(env: dict[str, str], root: Path) -> dict[str, str]:
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
    execution status to ``_build/papa-execution.json`` (:mod:`papa_lib.book.execution`), which is
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
    env = _with_pythonpath(os.environ, root)
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
    (:func:`papa_lib.book.page_check.broken_links`): a chapter linking a page that is not in ``_toc.yml``."""
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
        if "papa_lib.book" in extensions:
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
) -> list[Path]:
    """Execute chapters with papermill under a run profile; return the executed notebooks.

    Each chapter (default: every markdown chapter of ``_toc.yml``, in reading order) is
    converted with jupytext to ``out_dir/<profile>/_inputs/<chapter>.ipynb`` and executed by
    papermill with ``parameters=dict(profile=profile, **parameters)`` (injected after the cell
    tagged ``parameters``) and the repository root as working directory.  The executed
    notebook goes to ``out_dir/<profile>/<chapter>.ipynb`` and a JSON done-marker to
    ``<chapter>.done``.  With ``resume`` a chapter whose notebook and marker exist (with the
    same parameters, chapter source and library fingerprint: papa_lib's files and ``data/``,
    :func:`papa_lib.book.execution.fingerprint`) is skipped.  A failing chapter raises
    :class:`ChapterExecutionError`; its partial notebook and the chapters already done are kept,
    and it has no marker, so the next run executes it again.
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
    parser = argparse.ArgumentParser(prog="python -m papa_lib.book", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("sync", help="regenerate the paired .ipynb of every book/*.md chapter")
    p.add_argument("--book-dir", default="book", help="folder of the chapters (default: book)")
    p.add_argument("--no-links", action="store_true", help="do not refresh Colab badges / install URLs")

    p = sub.add_parser("check", help="fail when a paired .ipynb is missing or out of date")
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
