"""Checks of the book's sources: paired notebooks, house-style cells, and papa_lib.book helpers.

Every ``book/*.md`` chapter (jupytext MyST, the source of truth) must have an ``.ipynb`` twin
whose cells equal what jupytext produces from the markdown, a papermill ``parameters`` cell,
the Colab badge built from ``_config.yml`` and a Colab-guarded install cell.
"""

from __future__ import annotations

import ast
import json
import re
import textwrap
from pathlib import Path

import jupytext
import nbformat
import pytest
from papa_book import build, chapters

from conftest import JUPYTEXT_HEADER

REPO = Path(__file__).resolve().parents[1]
BOOK_DIR = REPO / "book"
CONFIG = REPO / "_config.yml"
CHAPTERS = sorted(BOOK_DIR.glob("*.md"))
HINT = "run `PYTHONPATH=book/_ext python -m papa_book sync`"


def _cells(notebook) -> list[tuple[str, str, tuple[str, ...]]]:
    """(cell type, source, tags) of every cell."""
    out = []
    for cell in notebook.cells:
        source = cell.source if isinstance(cell.source, str) else "".join(cell.source)
        out.append((cell.cell_type, source, tuple(cell.metadata.get("tags", []))))
    return out


def _tagged(notebook, tag: str) -> list[tuple[int, object]]:
    """(index, cell) of the code cells carrying ``tag``."""
    return [
        (i, c) for i, c in enumerate(notebook.cells) if c.cell_type == "code" and tag in c.metadata.get("tags", [])
    ]


def test_book_has_chapters():
    assert (BOOK_DIR / "intro.md").is_file(), "book/intro.md (the house-style template chapter) is missing"
    assert CHAPTERS


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.name)
def test_chapter_is_jupytext_myst(chapter):
    notebook = jupytext.read(chapter)
    meta = notebook.metadata
    # jupytext keeps the front matter's format in the metadata of the notebook it reads
    text = chapter.read_text(encoding="utf-8")
    assert text.startswith("---\n"), f"{chapter.name}: no jupytext front matter"
    assert "format_name: myst" in text.split("\n---", 1)[0], f"{chapter.name}: jupytext format_name must be myst"
    assert meta["kernelspec"]["name"] == "python3", f"{chapter.name}: kernelspec must be python3"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.name)
def test_chapter_has_matching_paired_notebook(chapter):
    twin = chapter.with_suffix(".ipynb")
    assert twin.is_file(), f"{chapter.name}: paired notebook {twin.name} is missing; {HINT}"
    expected = _cells(jupytext.read(chapter))
    actual = _cells(nbformat.read(twin, as_version=4))
    if expected != actual:
        first = next((i for i, (e, a) in enumerate(zip(expected, actual)) if e != a), min(len(expected), len(actual)))
        pytest.fail(
            f"{chapter.name}: {twin.name} is out of date ({len(actual)} cells vs {len(expected)} from the markdown, "
            f"first difference at cell {first}); {HINT}"
        )
    stored = nbformat.read(twin, as_version=4)
    for cell in stored.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{twin.name}: twins carry no outputs; {HINT}"


def test_no_orphan_notebooks():
    orphans = [p.name for p in BOOK_DIR.glob("*.ipynb") if not p.with_suffix(".md").is_file()]
    assert not orphans, f"paired notebooks without a markdown chapter: {orphans}"


def test_check_notebooks_reports_nothing_for_the_repo():
    assert chapters.check_notebooks(BOOK_DIR) == []


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.name)
def test_chapter_has_one_parameters_cell_defining_profile(chapter):
    notebook = jupytext.read(chapter)
    cells = _tagged(notebook, chapters.PARAMETERS_TAG)
    assert len(cells) == 1, f"{chapter.name}: needs exactly one code cell tagged 'parameters', found {len(cells)}"
    tree = ast.parse(cells[0][1].source)
    names = {t.id for node in tree.body if isinstance(node, ast.Assign)
             for t in node.targets if isinstance(t, ast.Name)}
    assert "profile" in names, f"{chapter.name}: the parameters cell must assign `profile`"
    assert all(isinstance(node, ast.Assign) for node in tree.body), (
        f"{chapter.name}: the parameters cell should only assign values (papermill overrides them)"
    )


#: The widest code line the rendered page shows without a scroll bar (sphinx-book-theme's column at a 1280 px
#: window, measured in headless Chromium: 80 monospace characters); PEP 8's 79 keeps one character spare.
CODE_LINE_LIMIT = 79


#: A cell tagged hide-input shows only its output in the built book (its code folds behind a toggle) and is the
#: chapter's presentation code in Jupyter: it keeps to the library's own line length instead.
HIDDEN_LINE_LIMIT = 120


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.name)
def test_code_cells_fit_the_page(chapter):
    long = [
        f"{chapter.name}: code cell {i}, line {j}: {len(line)} characters"
        for i, (kind, source, tags) in enumerate(_cells(jupytext.read(chapter)))
        if kind == "code"
        for j, line in enumerate(source.splitlines(), 1)
        if len(line) > (HIDDEN_LINE_LIMIT if "hide-input" in tags else CODE_LINE_LIMIT)
    ]
    assert not long, (f"lines past {CODE_LINE_LIMIT} characters ({HIDDEN_LINE_LIMIT} in hide-input cells) scroll "
                      "sideways on the page:\n" + "\n".join(long))


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.name)
def test_shell_blocks_in_the_prose_fit_the_page(chapter):
    """Fenced command blocks (```bash) in the prose fit the page as the code cells do."""
    long, fence = [], None
    for j, line in enumerate(chapter.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
        elif fence in ("bash", "shell", "console", "text", "") and len(line) > CODE_LINE_LIMIT:
            long.append(f"{chapter.name}, line {j}: {len(line)} characters")
    assert not long, f"lines past {CODE_LINE_LIMIT} characters scroll sideways on the page:\n" + "\n".join(long)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.name)
def test_library_code_shown_on_the_page_fits_it(chapter):
    """The method's code a chapter shows (``literalinclude`` with ``:pyobject:``) fits the page as its cells do."""
    import importlib
    import inspect

    text = chapter.read_text(encoding="utf-8")
    shown = re.findall(r"```\{literalinclude\} \.\./(\S+)\.py\n:pyobject: (\S+)", text)
    long = []
    for module, name in shown:
        target = importlib.import_module(module.replace("/", "."))
        for part in name.split("."):
            target = getattr(target, part)
        lines = inspect.getsource(target).splitlines()
        long += [f"{chapter.name}: {module}.py {name}, line {j}: {len(line)} characters"
                 for j, line in enumerate(lines, 1) if len(line) > CODE_LINE_LIMIT]
    assert not long, f"lines past {CODE_LINE_LIMIT} characters scroll sideways on the page:\n" + "\n".join(long)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.name)
def test_chapter_has_colab_badge_from_config(chapter):
    badge = chapters.colab_badge(chapter.relative_to(REPO), CONFIG)
    assert badge in chapter.read_text(encoding="utf-8"), (
        f"{chapter.name}: missing or stale Colab badge (expected {badge}); {HINT}"
    )


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.name)
def test_chapter_has_the_install_cell_of_the_template(chapter):
    """One install cell, before the parameters cell, whose source is the template filled from _config.yml."""
    notebook = jupytext.read(chapter)
    cells = _tagged(notebook, chapters.INSTALL_TAG)
    assert len(cells) == 1, f"{chapter.name}: needs exactly one code cell tagged 'install', found {len(cells)}"
    index, cell = cells[0]
    parameters_index = _tagged(notebook, chapters.PARAMETERS_TAG)[0][0]
    assert index < parameters_index, f"{chapter.name}: the install cell must come before the parameters cell"
    assert cell.source == chapters.install_cell(CONFIG), (
        f"{chapter.name}: the install cell is not papa_book.chapters.install_cell() of _config.yml; {HINT}"
    )


def _assigned(source: str, name: str):
    """The constant a cell's source assigns to ``name`` (at any depth)."""
    values = [node.value.value for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Assign)
              and [ast.unparse(t) for t in node.targets] == [name] and isinstance(node.value, ast.Constant)]
    assert len(values) == 1, f"{name} is assigned {len(values)} times"
    return values[0]


def test_install_cell_template_is_guarded_and_clones_checks_out_installs_and_cds():
    """The template, read as Python: it does everything under `"google.colab" in sys.modules` (outside Colab it
    only imports), names _config.yml's repository and version, and clones, checks out, installs the light colab
    extra and moves into the clone; its lines fit the page."""
    source = chapters.install_cell(CONFIG)
    tree = ast.parse(source)
    guarded = [node for node in tree.body if not isinstance(node, (ast.Import, ast.ImportFrom))]
    assert len(guarded) == 1 and isinstance(guarded[0], ast.If), "the cell is its imports and one `if`"
    test = guarded[0].test
    first = test.values[0] if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else test
    assert ast.unparse(first) == "'google.colab' in sys.modules", "the install cell runs in Colab only"
    assert _assigned(source, "repository") == chapters._repository(CONFIG)[0]
    assert _assigned(source, "version") == chapters.repository_version(CONFIG)
    body = "\n".join(ast.unparse(node) for node in guarded[0].body)
    for step in ("'clone'", "'checkout'", "'pip', 'install'", f"'.[{chapters.COLAB_EXTRA}]'", "os.chdir("):
        assert step in body, f"the install cell must clone, check out, install and cd ({step})"
    assert max(len(line) for line in source.splitlines()) <= CODE_LINE_LIMIT


def test_badges_and_install_cells_name_one_repository_and_version():
    """The badge (at blob/<version>), the GitHub button (Jupyter Book's theme reads repository.url) and the install
    cell all come from repository.url; badge and install cell name repository.version, a fixed tag or commit."""
    config = chapters.load_config(CONFIG)["repository"]
    url = chapters._repository(CONFIG)[0]
    version = chapters.repository_version(CONFIG)
    assert config["url"].rstrip("/") == url
    assert config.get("version") and version == str(config["version"]), (
        "_config.yml must name the fixed version (a tag or commit) Colab clones"
    )
    owner_repo = url.split("github.com/")[1]
    for chapter in CHAPTERS:
        text = chapter.read_text(encoding="utf-8")
        badges = re.findall(r"colab\.research\.google\.com/github/([^)\s]+?)/blob/([^/)\s]+)/", text)
        assert badges == [(owner_repo, version)], f"{chapter.name}: Colab badges {badges}; {HINT}"
        install = _tagged(jupytext.read(chapter), chapters.INSTALL_TAG)
        assert [_assigned(c.source, "version") for _, c in install] == [version], chapter.name
    assert chapters.check_install_cells(BOOK_DIR, CONFIG) == []


# ---------------------------------------------------------------------------------------------
# papa_lib.book helpers, on a throw-away book
# ---------------------------------------------------------------------------------------------

HEADER = JUPYTEXT_HEADER


def _chapter(body: str) -> str:
    return HEADER + "\n" + textwrap.dedent(body)


def _make_book(root: Path, url: str = "https://github.com/someone/somebook", pages: dict | None = None) -> Path:
    (root / "book").mkdir(parents=True)
    (root / "_config.yml").write_text(f"title: t\nrepository:\n  url: {url}\n  branch: dev\n", encoding="utf-8")
    pages = pages or {}
    names = list(pages)
    toc = "format: jb-book\n"
    if names:
        toc += f"root: book/{names[0]}\n"
    if names[1:]:
        toc += "chapters:\n" + "".join(f"  - file: book/{n}\n" for n in names[1:])
    (root / "_toc.yml").write_text(toc, encoding="utf-8")
    for name, text in pages.items():
        (root / "book" / f"{name}.md").write_text(text, encoding="utf-8")
    return root


def test_colab_badge_and_install_spec(tmp_path):
    _make_book(tmp_path)
    config = tmp_path / "_config.yml"
    assert chapters.colab_url("book/ch1.md", config) == (
        "https://colab.research.google.com/github/someone/somebook/blob/dev/book/ch1.ipynb"
    )
    assert chapters.colab_badge(tmp_path / "book" / "ch1.md", config) == (
        "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
        "(https://colab.research.google.com/github/someone/somebook/blob/dev/book/ch1.ipynb)"
    )
    assert chapters.install_spec(config) == "git+https://github.com/someone/somebook@dev"
    cell = chapters.install_cell(config)  # without repository.version: the branch, as the badge
    assert 'repository = "https://github.com/someone/somebook"' in cell and 'version = "dev"' in cell
    assert 'folder = "somebook"' in cell
    assert chapters.placeholder_warning(config) is None
    (tmp_path / "_config.yml").write_text(
        f"repository:\n  url: {chapters.PLACEHOLDER_URL}\n  branch: main\n  version: abc123\n", encoding="utf-8")
    assert chapters.repository_version(config) == "abc123"
    assert chapters.install_spec(config).endswith("@abc123")
    assert chapters.colab_url("book/ch1.md", config).endswith("/blob/abc123/book/ch1.ipynb")  # the version, not main
    assert 'version = "abc123"' in chapters.install_cell(config)
    warning = chapters.placeholder_warning(config)
    assert warning.startswith("papa: warning:") and "\n" not in warning and chapters.PLACEHOLDER_URL in warning


def test_colab_url_needs_a_github_repository(tmp_path):
    _make_book(tmp_path, url="https://gitlab.com/a/b")
    with pytest.raises(ValueError, match="GitHub"):
        chapters.colab_url("book/x.md", tmp_path / "_config.yml")


def test_chapter_without_myst_header_is_rejected(tmp_path):
    _make_book(tmp_path, pages={"plain": "# Just markdown\n"})
    with pytest.raises(ValueError, match=r"plain\.md.*format_name: myst"):
        chapters.sync_notebooks(tmp_path / "book")


def test_sync_is_deterministic_and_refreshes_links(tmp_path):
    stale_badge = (
        "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
        "(https://colab.research.google.com/github/old/repo/blob/main/book/ch.ipynb)"
    )
    text = _chapter(
        f"""\
        # Chapter

        {stale_badge}

        ```{{code-cell}} ipython3
        :tags: [install]

        import sys
        if "google.colab" in sys.modules:
            repository, version = "https://github.com/old/repo", "v0"
        ```

        ```{{code-cell}} ipython3
        :tags: [parameters]

        profile = "local"
        ```

        ```{{code-cell}} ipython3
        repository = "https://github.com/old/repo"  # not an install cell: kept
        ```
        """
    )
    _make_book(tmp_path, pages={"ch": text})
    md = tmp_path / "book" / "ch.md"
    config = tmp_path / "_config.yml"
    assert len(chapters.check_install_cells(tmp_path / "book")) == 2  # stale badge, stale install cell
    written = chapters.sync_notebooks(tmp_path / "book")
    twin = md.with_suffix(".ipynb")
    assert written == [twin]
    first = twin.read_bytes()
    assert chapters.sync_notebooks(tmp_path / "book") == []  # unchanged content is not rewritten
    twin.unlink()
    chapters.sync_notebooks(tmp_path / "book")
    assert twin.read_bytes() == first  # same bytes every time (stable cell ids)
    new_text = md.read_text(encoding="utf-8")
    assert chapters.colab_badge("book/ch.md", config) in new_text
    cells = jupytext.read(md).cells
    assert cells[1].source == chapters.install_cell(config) and cells[1].metadata["tags"] == ["install"]
    assert cells[3].source == 'repository = "https://github.com/old/repo"  # not an install cell: kept'
    assert new_text.count("old/repo") == 1
    assert chapters.check_install_cells(tmp_path / "book") == []
    stored = json.loads(first)
    assert stored["metadata"]["jupytext"]["formats"] == "ipynb,md:myst"
    assert [c["metadata"].get("tags") for c in stored["cells"]] == [None, ["install"], ["parameters"], None]
    assert "".join(stored["cells"][1]["source"]) == chapters.install_cell(config)
    assert all(c.get("execution_count") is None for c in stored["cells"] if c["cell_type"] == "code")
    assert chapters.check_notebooks(tmp_path / "book") == []

    edited = md.read_text(encoding="utf-8").replace('version = "dev"', 'version = "v9"')
    md.write_text(edited, encoding="utf-8")
    problems = chapters.check_notebooks(tmp_path / "book")
    assert len(problems) == 1 and problems[0].startswith("ch.md:") and "python -m papa_book sync" in problems[0]
    problems = chapters.check_install_cells(tmp_path / "book")
    assert len(problems) == 1 and "install cell" in problems[0] and "python -m papa_book sync" in problems[0]
    assert build.main(["check", "--book-dir", str(tmp_path / "book")]) == 1
    (tmp_path / "book" / "gone.ipynb").write_text(first.decode(), encoding="utf-8")
    assert any(p.startswith("gone.ipynb") for p in chapters.check_notebooks(tmp_path / "book"))


def test_sync_rewrites_the_whole_install_cell_whatever_its_options(tmp_path):
    """The install cell's body is replaced whole, its options kept: `:tags:` lines or a YAML block, other options,
    a longer fence; a chapter without one gets none (check_install_cells reports it)."""
    yaml_block = _chapter(
        """\
        ````{code-cell} ipython3
        ---
        tags: [install, hide-input]
        ---
        print("old install")
        ```python
        a fenced block inside the cell
        ```
        ````

        ```{code-cell} ipython3
        :tags: [parameters]

        profile = "local"
        ```
        """
    )
    none = _chapter("# no install cell\n")
    _make_book(tmp_path, pages={"a": yaml_block, "b": none})
    chapters.sync_notebooks(tmp_path / "book")
    config = tmp_path / "_config.yml"
    cells = jupytext.read(tmp_path / "book" / "a.md").cells
    assert [c.metadata.get("tags") for c in cells] == [["install", "hide-input"], ["parameters"]]
    assert cells[0].source == chapters.install_cell(config) and cells[1].source == 'profile = "local"'
    assert "old install" not in (tmp_path / "book" / "a.md").read_text(encoding="utf-8")
    problems = chapters.check_install_cells(tmp_path / "book")
    assert [p.split(":")[0] for p in problems] == ["a.md", "b.md", "b.md"]  # a: no badge; b: no badge, no cell
    assert "found 0" in problems[2]


def test_toc_chapters_follow_reading_order(tmp_path):
    chapter = _chapter("# x\n")
    _make_book(tmp_path, pages={"b_first": chapter, "a_second": chapter})
    assert [p.name for p in chapters.toc_chapters(tmp_path)] == ["b_first.md", "a_second.md"]


def test_run_chapters_injects_parameters_resumes_and_keeps_done_chapters(tmp_path):
    good = _chapter(
        """\
        # Good

        ```{code-cell} ipython3
        :tags: [parameters]

        profile = "local"
        value = 1
        ```

        ```{code-cell} ipython3
        import json, pathlib
        pathlib.Path("out.json").write_text(json.dumps({"profile": profile, "value": value}))
        ```
        """
    )
    bad = _chapter(
        """\
        # Bad

        ```{code-cell} ipython3
        :tags: [parameters]

        profile = "local"
        ```

        ```{code-cell} ipython3
        raise RuntimeError("deliberate failure " + profile)
        ```
        """
    )
    root = _make_book(tmp_path / "repo", pages={"good": good, "bad": bad})
    runs = tmp_path / "runs"
    with pytest.raises(build.ChapterExecutionError, match=r"chapter bad .*smoke.*deliberate failure smoke") as caught:
        build.run_chapters("smoke", runs, parameters={"value": 5}, root=root)
    line = build.failure_line("a chapter failed", caught.value)  # what papa reproduce prints: chapter and cell
    assert "\n" not in str(caught.value) and "chapter bad (" in line and "(in cell [" in line
    # the good chapter ran in the repository root with the injected parameters, and is kept
    assert json.loads((root / "out.json").read_text()) == {"profile": "smoke", "value": 5}
    done_nb = runs / "smoke" / "good.ipynb"
    assert done_nb.is_file() and (runs / "smoke" / "good.done").is_file()
    assert not (runs / "smoke" / "bad.done").exists()
    marker = json.loads((runs / "smoke" / "good.done").read_text())
    assert marker["parameters"] == {"profile": "smoke", "value": 5}
    executed = nbformat.read(done_nb, as_version=4)
    assert any("injected-parameters" in c.metadata.get("tags", []) for c in executed.cells)

    fixed = bad.replace('raise RuntimeError("deliberate failure " + profile)', "ok = True")
    (root / "book" / "bad.md").write_text(fixed)
    mtime = done_nb.stat().st_mtime_ns
    (root / "out.json").unlink()
    paths = build.run_chapters("smoke", runs, parameters={"value": 5}, root=root)
    assert [p.name for p in paths] == ["good.ipynb", "bad.ipynb"]
    assert done_nb.stat().st_mtime_ns == mtime and not (root / "out.json").exists()  # resumed, not re-run
    assert (runs / "smoke" / "bad.done").is_file()


def test_run_chapters_bounds_each_cell(tmp_path, monkeypatch):
    """A cell that outlives ``cell_timeout`` fails its chapter by name (a hung kernel must not block a batch run
    for ever); without one, the book's own ``execute.timeout`` applies, as in the build."""
    slow = _chapter(
        """\
        # Slow

        ```{code-cell} ipython3
        :tags: [parameters]

        profile = "local"
        ```

        ```{code-cell} ipython3
        import time
        time.sleep(60)
        ```
        """
    )
    root = _make_book(tmp_path / "repo", pages={"slow": slow})
    with pytest.raises(build.ChapterExecutionError, match=r"chapter slow .*timed out.*2 seconds"):
        build.run_chapters("smoke", tmp_path / "runs", root=root, cell_timeout=2)
    assert not (tmp_path / "runs" / "smoke" / "slow.done").exists()
    for bad in (0, -1, True, "60"):
        with pytest.raises(ValueError, match="cell_timeout"):
            build.run_chapters("smoke", tmp_path / "refused", root=root, cell_timeout=bad)
    assert not (tmp_path / "refused").exists()  # refused before anything is written

    import papermill

    seen = []
    monkeypatch.setattr(papermill, "execute_notebook", lambda *a, **k: seen.append(k["execution_timeout"]))
    build.run_chapters("smoke", tmp_path / "runs", root=root, resume=False)
    config = root / "_config.yml"
    config.write_text(config.read_text(encoding="utf-8") + "execute:\n  timeout: 7\n", encoding="utf-8")
    build.run_chapters("smoke", tmp_path / "runs", root=root, resume=False)
    assert seen == [build.DEFAULT_CELL_TIMEOUT, 7]


def test_run_chapters_rejects_bad_arguments(tmp_path):
    root = _make_book(tmp_path, pages={"c": _chapter("# c\n")})
    with pytest.raises(ValueError, match="profile"):
        build.run_chapters("../escape", tmp_path / "runs", root=root)
    with pytest.raises(ValueError, match="profile"):
        build.run_chapters("smoke", tmp_path / "runs", parameters={"profile": "x"}, root=root)
    with pytest.raises(FileNotFoundError, match="nope"):
        build.run_chapters("smoke", tmp_path / "runs", chapters=["nope"], root=root)
