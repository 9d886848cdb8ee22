"""The book's chapters, their paired notebooks and the links they carry.

Chapters live in ``book/*.md`` as jupytext MyST markdown (the text is the source of truth); a paired ``.ipynb``
next to each one is generated for Google Colab.  This module

* reads the book's ``_config.yml`` and the repository it names (:func:`load_config`, :func:`install_spec`,
  :func:`placeholder_warning`),
* writes the "Open in Colab" badge of a chapter (:func:`colab_url`, :func:`colab_badge`) and the Colab install cell
  every chapter starts with (:func:`install_cell`, the one template of it; :func:`check_install_cells`), both at the
  configured ``repository.version``,
* lists the chapters (:func:`chapter_files`, :func:`toc_chapters`),
* and regenerates and checks their twins (:func:`notebook_from_chapter`, :func:`sync_notebooks`,
  :func:`check_notebooks`); :func:`sync_notebooks` first rewrites every chapter's badge and install cell from
  ``_config.yml``.

:mod:`papa_book.build` builds the book and runs the chapters (its ``sync``, ``check`` and ``badge`` commands call
these functions); every caller imports these names from here.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from papa_lib.book.profiles import find_repo_root

__all__ = [
    "chapter_files",
    "check_install_cells",
    "check_notebooks",
    "colab_badge",
    "colab_url",
    "install_cell",
    "install_spec",
    "load_config",
    "notebook_from_chapter",
    "placeholder_warning",
    "repository_version",
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
#: The pip extra the install cell installs the clone with (pyproject.toml: the charts' packages, no build tools).
COLAB_EXTRA = "colab"
#: The one line the install cell prints when the configured version is not in the repository (it then stays on the
#: default branch); ``{version}`` and ``{repository}`` are filled in Colab.
VERSION_NOT_FOUND = "papa: version {version} not found in {repository}; using the default branch"
#: The repository URL ``_config.yml`` ships with until the book has a home: ``papa book`` warns while it is set.
PLACEHOLDER_URL = "https://github.com/papa-book/papa-book"


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


def _clone_folder(url: str) -> str:
    """The folder the install cell clones ``url`` into: its last path component (``papa-book`` for
    ``https://github.com/papa-book/papa-book``)."""
    name = re.split(r"[/\\:]", url.rstrip("/\\"))[-1]
    if name.endswith(".git"):
        name = name[: -len(".git")]
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name) or name in (".", ".."):
        raise ValueError(f"repository.url {url!r} does not end in a folder name to clone into")
    return name


#: The install cell of every chapter (:func:`install_cell` fills it from ``_config.yml``). In Colab only, and only
#: outside a clone (no ``_config.yml`` in the working directory): clone the book's repository, check out its fixed
#: version (or, when the repository has no such version, stay on the default branch and say so in one line),
#: install the clone with its light ``colab`` extra and work inside it, where the chapters find ``data/results/``.
#: Run again (or after a runtime restart) it reuses the clone. Elsewhere it does nothing.
INSTALL_CELL_TEMPLATE = """\
import os
import subprocess
import sys

# Colab only: clone the book at its fixed version, install it, work inside it
if "google.colab" in sys.modules and not os.path.isfile("_config.yml"):
    repository = {repository}
    version = {version}
    folder = {folder}
    if not os.path.isdir(folder):
        git = ["git", "clone", "--quiet", repository, folder]
        subprocess.run(git, check=True)
        git = ["git", "-C", folder, "checkout", "--quiet", version]
        if subprocess.run(git, capture_output=True).returncode:
            print(f"papa: version {{version}} not found in {{repository}};"
                  " using the default branch")
    pip = [sys.executable, "-m", "pip", "install", "--quiet",
           "-e", ".[{extra}]"]
    subprocess.run(pip, cwd=folder, check=True)
    # chapters find data/results/ from the repository root
    os.chdir(folder)"""


def _literal(value: str) -> str:
    """``value`` as a double-quoted Python string literal (the house style of the chapters' code)."""
    import ast
    import json

    text = json.dumps(value)
    return text if ast.literal_eval(text) == value else repr(value)


def install_cell(config: str | os.PathLike = "_config.yml") -> str:
    """The source of every chapter's ``install`` cell, from ``repository.url`` and ``repository.version`` of
    ``_config.yml`` (:data:`INSTALL_CELL_TEMPLATE`; :func:`sync_notebooks` writes it, :func:`check_install_cells`
    checks it). The version is the one the Colab badges open (:func:`colab_url`)."""
    url, _, _, _ = _repository(config)
    version = repository_version(config)
    return INSTALL_CELL_TEMPLATE.format(
        repository=_literal(url), version=_literal(version), folder=_literal(_clone_folder(url)), extra=COLAB_EXTRA
    )


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
    """Return the Colab URL that opens the ``.ipynb`` twin of ``chapter_path`` from GitHub, at the configured
    version (:func:`repository_version`: the one the install cell checks out).

    ``chapter_path`` is relative to the folder of ``config`` (the book root), or absolute.
    """
    url, _, path_to_book, config_path = _repository(config)
    version = repository_version(config_path)
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
    return f"https://colab.research.google.com/github/{owner}/{repo}/blob/{version}/{rel}"


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
    digest = hashlib.sha1(f"{stem}\0{index}\0{cell.cell_type}\0{cell.source}".encode())
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


#: A MyST code cell of a chapter: its opening fence, its options (``:key: value`` lines or a ``---`` YAML block),
#: its body and its closing fence.
_CODE_CELL_RE = re.compile(
    r"^(?P<open>(?P<fence>`{3,})\{code-cell\}[^\n]*\n)"
    r"(?P<options>(?:---[ \t]*\n.*?\n---[ \t]*\n)|(?::[^\n]*\n)*)"
    r"(?P<body>.*?)"
    r"^(?P=fence)[ \t]*$",
    flags=re.M | re.S,
)


def _cell_tags(options: str) -> list[str]:
    """The ``tags`` of a MyST code cell's options text ([] when it has none)."""
    import yaml

    text = options.strip()
    if text.startswith("---"):
        text = text.strip("-\n \t")
    else:
        text = "\n".join(line[1:].replace(":", ": ", 1) for line in text.splitlines())
    try:
        data = yaml.safe_load(text) if text else {}
    except yaml.YAMLError:
        return []
    tags = data.get("tags") if isinstance(data, dict) else None
    return [str(tag) for tag in tags] if isinstance(tags, list) else []


def _with_install_cell(text: str, cell: str) -> str:
    """``text`` (a chapter's markdown) with the body of every ``install``-tagged code cell replaced by ``cell``,
    its fence and options (the tag) kept."""

    def replace(match: re.Match) -> str:
        if INSTALL_TAG not in _cell_tags(match["options"]):
            return match[0]
        # jupytext separates the options from the source by one blank line
        separator = "\n" if match["options"] else ""
        return f"{match['open']}{match['options']}{separator}{cell}\n{match['fence']}"

    return _CODE_CELL_RE.sub(replace, text)


def _refresh_links(md_path: Path, config: Path) -> bool:
    """Point the chapter's Colab badge at the configured repository and version, and write its install cell from
    the template (:func:`install_cell`).

    Returns True when the markdown file was changed.
    """
    text = md_path.read_text(encoding="utf-8")
    rel = md_path.resolve().relative_to(config.resolve().parent)
    new = COLAB_BADGE_RE.sub(lambda _m: colab_badge(rel, config), text)
    new = _with_install_cell(new, install_cell(config))
    if new != text:
        md_path.write_text(new, encoding="utf-8")
        return True
    return False


def check_install_cells(book_dir: str | os.PathLike = "book", config: str | os.PathLike | None = None) -> list[str]:
    """Return one problem per chapter whose Colab badge or install cell is not what ``_config.yml`` makes of it:
    no badge or a stale one (:func:`colab_badge`), not exactly one ``install``-tagged code cell, or one whose source
    is not :func:`install_cell` (so the badge and the install cell name one repository and one version). ``config``
    defaults to the ``_config.yml`` of the repository holding ``book_dir``; [] means all agree."""
    import jupytext

    folder = Path(book_dir)
    config_path = Path(config) if config is not None else find_repo_root(folder) / "_config.yml"
    if config_path.is_dir():
        config_path = config_path / "_config.yml"
    expected = install_cell(config_path)
    hint = "run `PYTHONPATH=book/_ext python -m papa_book sync`"
    problems: list[str] = []
    for chapter in chapter_files(folder):
        rel = chapter.resolve().relative_to(config_path.resolve().parent)
        badge = colab_badge(rel, config_path)
        if badge not in chapter.read_text(encoding="utf-8"):
            problems.append(f"{chapter.name}: missing or stale Colab badge (expected {badge}); {hint}")
        cells = [
            cell for cell in jupytext.read(chapter, fmt=CHAPTER_FORMAT).cells
            if cell.cell_type == "code" and INSTALL_TAG in cell.metadata.get("tags", [])
        ]
        if len(cells) != 1:
            problems.append(f"{chapter.name}: needs exactly one code cell tagged {INSTALL_TAG!r}, found {len(cells)}")
        elif cells[0].source != expected:
            problems.append(f"{chapter.name}: the install cell is not the template of _config.yml's repository "
                            f"and version (papa_book.chapters.install_cell); {hint}")
    return problems


def sync_notebooks(book_dir: str | os.PathLike = "book", update_links: bool = True) -> list[Path]:
    """Regenerate the ``.ipynb`` twin of every ``book_dir/*.md`` chapter with jupytext.

    Output is deterministic (no outputs or execution counts, stable cell ids); a twin is
    only rewritten when its content changes.  With ``update_links`` the chapters' Colab
    badges and their ``install`` cells (the whole body, from :func:`install_cell`; the tag is
    kept) are first rewritten from the book config's ``repository`` (when a ``_config.yml`` is
    found above ``book_dir``).  Returns the twins
    that were written.  Twins whose markdown chapter is gone are reported as warnings.
    """
    folder = Path(book_dir)
    chapters = chapter_files(folder)
    config = find_repo_root(folder) / "_config.yml"
    written: list[Path] = []
    for chapter in chapters:
        if update_links and config.is_file():
            if _refresh_links(chapter, config):
                logger.info("updated the Colab badge / install cell in %s", chapter)
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
    hint = "run `PYTHONPATH=book/_ext python -m papa_book sync`"
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
