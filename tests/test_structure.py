"""Concepts kept once: the repository root, the Markdown helper the pages share, Eq. 2."""

from __future__ import annotations

from pathlib import Path

import torch

from papa_lib.book import build, display, profiles

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
    from papa_lib.book import alternatives_pages, probing_pages, selection_pages, transfer_pages

    shown = display.markdown("**bold**")
    from IPython.display import Markdown

    assert shown.data == "**bold**" and isinstance(shown, Markdown) and repr(shown) == "**bold**"
    assert repr(display.markdown("")) == ""  # an empty one shows nothing, never the object's repr
    from IPython.core.formatters import DisplayFormatter

    # ... and publishes no output at all: a page shows no empty output box where a note had nothing to say
    assert DisplayFormatter().format(display.markdown("")) == ({}, {})
    assert set(DisplayFormatter().format(shown)[0]) == {"text/plain", "text/markdown"}
    for module in (alternatives_pages, probing_pages, selection_pages, transfer_pages):
        assert module._markdown is display.markdown
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
    assert sync["entry"] == "python -m papa_lib.book check"
