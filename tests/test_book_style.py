"""The chapters read like a book, not a lab notebook: little visible code, none of it wider than the page.

The rule, checked on every ``book/*.md`` chapter (jupytext MyST, the source of truth):

* a code cell is **visible** unless it is tagged ``hide-input``, ``remove-input`` or ``remove-cell`` (Jupyter Book
  then shows only its output, or nothing);
* no visible code line is longer than :data:`MAX_LINE` (88) characters — the width of the page's code blocks;
* a visible code cell has at most :data:`MAX_CELL_LINES` (15) non-blank lines; at most :data:`MAX_LONG_CELLS` (3)
  cells per chapter may be longer, up to :data:`MAX_LONG_CELL_LINES` (30) lines, for code that is the subject of
  the chapter (the override seam, a probe, a computation done by hand). The ``parameters`` cell (papermill) and the
  Colab ``install`` cell (one template for every chapter) are exempt from the cell-length rule, not from the line
  width;
* a chapter owns its presentation: its chart specifications (altair) live in the chapter, in cells tagged
  ``hide-input`` so the built book shows the figure and Jupyter shows the code; visible code is about the method.

:func:`visible_code_lines` is the count reported for issue 12 (non-blank lines of visible code cells, the
``parameters`` cell included).
"""

from __future__ import annotations

import re
from pathlib import Path

import jupytext
import pytest

from conftest import JUPYTEXT_HEADER

REPO = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((REPO / "book").glob("*.md"))
HIDDEN_TAGS = {"hide-input", "remove-input", "remove-cell"}
MAX_LINE = 88
MAX_CELL_LINES = 15
MAX_LONG_CELLS = 3
MAX_LONG_CELL_LINES = 30
ALTAIR_CODE = re.compile(r"\balt\.(Chart|layer|hconcat|vconcat|X|Y|Color|Tooltip)\(")


def visible_cells(text: str) -> list[tuple[list[str], set[str]]]:
    """(source lines, tags) of every visible code cell of a MyST chapter's text."""
    notebook = jupytext.reads(text, fmt="md:myst")
    cells = []
    for cell in notebook.cells:
        tags = set(cell.metadata.get("tags", []))
        if cell.cell_type == "code" and not tags & HIDDEN_TAGS:
            cells.append((cell.source.splitlines(), tags))
    return cells


def visible_code_lines(text: str) -> int:
    """How many non-blank code lines a reader sees in a chapter (every visible code cell, parameters included)."""
    return sum(1 for lines, _ in visible_cells(text) for line in lines if line.strip())


def _length(lines: list[str]) -> int:
    return sum(1 for line in lines if line.strip())


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_visible_code_fits_the_page(chapter):
    wide = [(i, line) for lines, _ in visible_cells(chapter.read_text(encoding="utf-8"))
            for i, line in enumerate(lines, 1) if len(line) > MAX_LINE]
    assert not wide, f"{chapter.name}: visible code lines over {MAX_LINE} characters: " + "; ".join(
        f"{line.strip()[:60]}… ({len(line)})" for _, line in wide)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_visible_code_cells_are_short(chapter):
    cells = [(lines, tags) for lines, tags in visible_cells(chapter.read_text(encoding="utf-8"))
             if not tags & {"parameters", "install"}]
    long = [lines for lines, _ in cells if _length(lines) > MAX_CELL_LINES]
    assert len(long) <= MAX_LONG_CELLS, (
        f"{chapter.name}: {len(long)} visible code cells over {MAX_CELL_LINES} lines (at most {MAX_LONG_CELLS} "
        f"allowed): " + " | ".join(lines[0][:50] for lines in long))
    too_long = [lines for lines in long if _length(lines) > MAX_LONG_CELL_LINES]
    assert not too_long, f"{chapter.name}: cells over {MAX_LONG_CELL_LINES} lines: " + " | ".join(
        lines[0][:50] for lines in too_long)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_chart_specifications_sit_in_hidden_input_cells(chapter):
    found = [line.strip() for lines, _ in visible_cells(chapter.read_text(encoding="utf-8")) for line in lines
             if ALTAIR_CODE.search(line)]
    assert not found, f"{chapter.name}: a chart specification in a visible cell (tag the cell hide-input): {found[:3]}"


def test_visible_code_lines_counts_only_what_a_reader_sees():
    text = JUPYTEXT_HEADER + """
# T

```{code-cell} ipython3
a = 1

b = 2
```

```{code-cell} ipython3
:tags: [hide-input]

c = 3
```

```{code-cell} ipython3
:tags: [parameters]

d = 4
```
"""
    assert visible_code_lines(text) == 3
    assert [tags for _, tags in visible_cells(text)] == [set(), {"parameters"}]
