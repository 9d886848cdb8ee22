"""Concepts kept once: the repository root, the Markdown helper the chapters share, Eq. 2; build tooling outside the
library; every name imported from the module that defines it."""

from __future__ import annotations

from pathlib import Path

import torch
from papa_book import build, chapters

from papa_lib.book import display, profiles

REPO = Path(__file__).resolve().parents[1]


def test_one_find_repo_root_for_the_build_and_the_profiles(tmp_path):
    for module in (build, chapters):  # the book's tooling defines no root lookup of its own
        assert vars(module)["find_repo_root"] is profiles.find_repo_root
    assert profiles.find_repo_root(REPO / "book") == REPO
    assert profiles.find_repo_root(REPO / "book" / "intro.md") == REPO
    (tmp_path / "_config.yml").write_text("title: t\n")
    assert profiles.find_repo_root(tmp_path) == tmp_path.resolve()  # _config.yml alone: not a root
    assert profiles.find_repo_root(tmp_path, fallback="package") == REPO
    (tmp_path / "_toc.yml").write_text("root: x\n")
    (tmp_path / "deep" / "er").mkdir(parents=True)
    assert profiles.find_repo_root(tmp_path / "deep" / "er", fallback="package") == tmp_path.resolve()
    library = tmp_path / "lib"  # a checkout without chapters: _config.yml beside the package
    (library / "papa_lib").mkdir(parents=True)
    (library / "_config.yml").write_text("title: t\n")
    assert profiles.find_repo_root(library / "papa_lib") == library.resolve()


def test_pages_share_one_markdown_helper():
    shown = display.markdown("**bold**")
    from IPython.display import Markdown

    assert shown.data == "**bold**" and isinstance(shown, Markdown) and repr(shown) == "**bold**"
    assert repr(display.markdown("")) == ""  # an empty one shows nothing, never the object's repr
    from IPython.core.formatters import DisplayFormatter

    # ... and publishes no output at all: a page shows no empty output box where a note had nothing to say
    assert DisplayFormatter().format(display.markdown("")) == ({}, {})
    assert set(DisplayFormatter().format(shown)[0]) == {"text/plain", "text/markdown"}
    for path in (REPO / "papa_lib").rglob("*.py"):
        assert "def _markdown" not in path.read_text(), f"{path.name} defines its own Markdown helper"


def test_eq2_has_one_implementation():
    from papa_lib.analysis import patterns
    from papa_lib.core.averaging import PadAwareAverage

    attentions = torch.rand(4, 2, 6, 6, dtype=torch.float64)
    masks = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 1], [1, 1, 1, 0, 0, 1], [1, 0, 0, 0, 0, 1]])
    mean, counts = patterns.pad_aware_mean(attentions, masks)
    streamed = PadAwareAverage(1, 2)
    for row in range(4):  # one input at a time, as average_attention streams batches
        streamed.add([(0, attentions[row:row + 1])], masks[row:row + 1])
    expected, expected_counts = streamed.means()
    assert torch.equal(counts, expected_counts) and torch.allclose(mean, expected[0], atol=1e-12)
    assert counts[0, 0] == 4 and counts[2, 3] == 1 and mean[0, 3, 4] == attentions[0, 0, 3, 4]
    assert "PadAwareAverage" in Path(patterns.__file__).read_text()


def test_linting_is_configured():
    import tomllib
    import yaml

    ruff = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["ruff"]
    assert ruff["line-length"] == 120 and {"E", "F", "W", "I", "B", "UP"} <= set(ruff["lint"]["select"])
    hooks = [hook for repo in yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())["repos"]
             for hook in repo["hooks"]]
    assert "ruff" in {hook["id"] for hook in hooks}
    sync = next(hook for hook in hooks if hook["id"] == "chapters-in-sync")
    assert sync["entry"] == "env PYTHONPATH=book/_ext python -m papa_book check"


def test_the_library_imports_no_build_tooling():
    """Sphinx, docutils, MyST and Jupyter Book belong to the book's build (book/_ext/papa_book), not to papa_lib."""
    import ast

    tooling = ("sphinx", "docutils", "myst_parser", "myst_nb", "jupyter_book", "papa_book")
    found = []
    for path in (REPO / "papa_lib").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] in tooling]
    assert not found, found


def test_no_private_name_is_imported_across_modules():
    """A name another module needs is public in the module that defines it, in the library and in the book's tooling
    (issue 57: files split to meet a size cap had left 38 private names imported across modules)."""
    import ast

    found = []
    for path in [*(REPO / "papa_lib").rglob("*.py"), *(REPO / "book" / "_ext" / "papa_book").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(("papa_lib",
                                                                                                   "papa_book"))):
                found += [f"{path.relative_to(REPO)}: {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, found


#: The packages whose modules are held to one home per name, and the folder each one's import path starts from: the
#: library, and the book's tooling (``book/_ext/papa_book``, imported with ``book/_ext`` on the path).
CHECKED_PACKAGES = {"papa_lib": REPO, "papa_book": REPO / "book" / "_ext"}


def _module_name(path: Path) -> tuple[str, bool]:
    """``(dotted name, is a package)`` of a file of papa_lib or papa_book."""
    root = next((root for package, root in CHECKED_PACKAGES.items() if path.is_relative_to(root / package)), REPO)
    parts = path.relative_to(root).with_suffix("").parts
    return (".".join(parts[:-1]), True) if parts[-1] == "__init__" else (".".join(parts), False)


def _top_level_names(tree) -> set[str]:
    """What a module defines at its top level (def, class, assignment; inside a top-level if/try/with too)."""
    import ast

    names: set[str] = set()
    statements = list(tree.body)
    while statements:
        node = statements.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            statements += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            statements += [s for handler in getattr(node, "handlers", []) for s in handler.body]
    return names


def _python_sources():
    """``(where, source, module)`` of every piece of Python that imports papa_lib: the library, the tests, the book's
    tooling, a chapter's code cells (one namespace: one source) and the Python blocks of the top-level documents;
    ``where(line)`` names a line, ``module`` is None outside papa_lib and papa_book."""
    import re

    import jupytext
    from papa_book.chapters import CHAPTER_FORMAT

    def joined(name: str, kind: str, blocks: list[str]):
        starts, lines = [], []
        for block in blocks:
            starts.append(len(lines) + 1)
            lines += [line for line in block.splitlines() if not line.lstrip().startswith(("%", "!"))] + [""]

        def where(line: int) -> str:
            number = sum(start <= line for start in starts)  # counted from 1
            return f"{name} ({kind} {number}, line {line - starts[number - 1] + 1})"

        return where, "\n".join(lines), None

    for folder in ("papa_lib", "tests", "book/_ext"):
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            yield (lambda line, rel=rel: f"{rel}:{line}"), path.read_text(encoding="utf-8"), (
                None if folder == "tests" else _module_name(path)[0])
    for path in sorted((REPO / "book").glob("*.md")):
        cells = jupytext.read(path, fmt=CHAPTER_FORMAT).cells
        yield joined(f"book/{path.name}", "code cell", [cell.source for cell in cells if cell.cell_type == "code"])
    for name in ("README.md", "CONTRIBUTING.md", "BENCHMARKS.md"):
        text = (REPO / name).read_text(encoding="utf-8")
        yield joined(name, "python block", re.findall(r"^```python[^\n]*\n(.*?)^```", text, re.M | re.S))


def _names_reached_through_another_module() -> list[str]:
    """Every ``from papa_lib.x.y import N`` and ``y.N`` (``y`` bound by an import of the module ``papa_lib.x.y``)
    whose module does not define ``N`` at its top level: a name reached through a module that only imports it. The
    book's tooling (``papa_book``, its relative imports resolved) and the tests' own modules (``conftest``) are held
    to the same. Packages (their ``__init__``: the public API) are exempt; so are modules from outside papa_lib and
    papa_book (``results.os``). An alias also bound any other way in the same file (a local variable called
    ``plan``) is not followed."""
    import ast

    defined, packages, trees = {}, set(), {}
    for path in [path for package, root in CHECKED_PACKAGES.items() for path in (root / package).rglob("*.py")]:
        name, package = _module_name(path)
        trees[name] = ast.parse(path.read_text(encoding="utf-8"))
        defined[name] = _top_level_names(trees[name])
        if package:
            packages.add(name)
    for path in (REPO / "tests").glob("*.py"):
        trees[path.stem] = ast.parse(path.read_text(encoding="utf-8"))
        defined[path.stem] = _top_level_names(trees[path.stem])

    def module_names(module: str) -> set[str]:
        """The names ``module`` binds to modules outside papa_lib and papa_book (``import os``: ``results.os`` is
        os); a module of theirs has its own home (``engine.selection`` is ``papa_lib.experiments.selection``)."""
        return {alias.asname or alias.name.split(".")[0] for node in ast.walk(trees[module])
                if isinstance(node, ast.Import) for alias in node.names
                if alias.name.split(".")[0] not in CHECKED_PACKAGES}

    def home_lacks(module: str, name: str) -> bool:
        if module in packages or module not in defined or name in defined[module] or name.startswith("__"):
            return False
        return name not in module_names(module)

    def absolute(node, module: str | None) -> str | None:
        if not node.level:
            return node.module
        if module is None:
            return None  # a relative import outside papa_lib and papa_book is not about them
        base = module.split(".")
        base = base[: len(base) - node.level + (module in packages)]
        return ".".join(base + ([node.module] if node.module else []))

    found = []
    for where, source, module in _python_sources():
        tree = ast.parse(source)
        bound: dict[str, set[str]] = {}  # names bound by an import of a module checked here
        assigned: set[str] = set()  # names bound any other way (a local variable called like a module)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source_module = absolute(node, module)
                for alias in node.names:
                    target = f"{source_module}.{alias.name}"
                    if target in defined:
                        bound.setdefault(alias.asname or alias.name, set()).add(target)
                    elif source_module in defined and home_lacks(source_module, alias.name):
                        found.append(f"{where(node.lineno)}: from {source_module} import {alias.name}")
                    else:
                        assigned.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in defined and (alias.asname or "." not in alias.name):
                        bound.setdefault(alias.asname or alias.name, set()).add(alias.name)
                    else:
                        assigned.add(alias.asname or alias.name.split(".")[0])
            elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                assigned.add(node.id)
            elif isinstance(node, ast.arg):
                assigned.add(node.arg)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                assigned.add(node.name)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                assigned.add(node.name)
        modules = {name: next(iter(targets)) for name, targets in bound.items()
                   if len(targets) == 1 and name not in assigned}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                    and home_lacks(modules[node.value.id], node.attr)):
                found.append(f"{where(node.lineno)}: {node.value.id}.{node.attr} ({modules[node.value.id]})")
    return found


def test_every_name_is_imported_from_its_home():
    """Issue 57 ("each concept once"): modules split to meet a size cap had kept importing the moved names for their
    callers. Every name is imported from the module that defines it; a package's ``__init__`` (the public API) is the
    one place that gathers names defined elsewhere, and no other module keeps an import only for others."""
    import ast

    found = _names_reached_through_another_module()
    assert not found, "\n".join(found)
    kept = [f"{path.relative_to(REPO)}:{number}" for package, root in CHECKED_PACKAGES.items()
            for path in (root / package).rglob("*.py")
            if path.name != "__init__.py"
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if "noqa: F401" in line or line.startswith("def __getattr__(")]  # an unused import; a lazy one
    assert not kept, kept
    listed = []  # a module's __all__ names only what it defines (papa_book.build had listed 22 names of others)
    for package, root in CHECKED_PACKAGES.items():
        for path in (root / package).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            names = [ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                     and any(isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets)]
            if path.name != "__init__.py" and names:
                listed += [f"{path.relative_to(REPO)}: {name}" for name in names[0]
                           if name not in _top_level_names(tree)]
    assert not listed, listed
