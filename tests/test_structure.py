"""Concepts kept once: the repository root, the Markdown helper the chapters share, Eq. 2; build tooling outside the
library."""

from __future__ import annotations

from pathlib import Path

import torch
from papa_book import build

from papa_lib.book import display, profiles

REPO = Path(__file__).resolve().parents[1]


def test_one_find_repo_root_for_the_build_and_the_profiles(tmp_path):
    assert build.find_repo_root is profiles.find_repo_root
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
    """A name another module needs is public in the module that defines it (issue 57: files split to meet a size cap
    had left 38 private names imported across modules)."""
    import ast

    found = []
    for path in (REPO / "papa_lib").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("papa_lib")):
                found += [f"{path.relative_to(REPO)}: {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, found
