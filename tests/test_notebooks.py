"""The chapters are the notebooks: what a reader opens in Jupyter or Colab reads as the built book does.

Two checks on every ``book/*.ipynb`` twin (the file the Colab badge opens):

* **No markup only Jupyter Book renders** in a markdown cell: no MyST role (``{glue:text}`name```), no directive
  (```` ```{literalinclude} ````, ```` ```{note} ````), no colon fence, target or substitution. Math (``$...$``),
  plain Markdown, links, images and HTML (``<details>``) read the same everywhere.
* **No count written by hand**: the seeds, training rows, learning rates and devices a chapter states come from
  a cell that reads them from the records or grid files, so a markdown cell names none of them as a literal
  (sentences about the paper itself, which mention "paper" or "Table 3", are exempt).

And (slow) each twin executed **in a plain Jupyter kernel** with papermill at the smoke profile, not through
Jupyter Book: no error, and every code cell whose last statement is an expression (a chart, a table, a sentence
displayed as Markdown) shows an output, and every chapter but a reference page renders a chart. A cell that ends
in an expression on purpose without output ends in ``;``.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "book").glob("*.ipynb"))
#: Chapters without a figure (the grid-file reference is a table); every other chapter draws at least one.
CHARTLESS_CHAPTERS = {"gridfile"}

#: (pattern, what it is) for markup that only Jupyter Book / MyST renders.
MYST_MARKUP = [
    (re.compile(r"(?<![\w`])\{[A-Za-z][\w.:-]*\}`[^`\n]+`"), "a MyST role"),
    (re.compile(r"^\s*(`{3,}|~{3,})\s*\{[\w.:-]+\}", re.M), "a MyST directive"),
    (re.compile(r"^\s*:{3,}", re.M), "a colon-fence directive"),
    (re.compile(r"^\s*\([\w.:-]+\)=\s*$", re.M), "a MyST target"),
    (re.compile(r"\{\{[^}]*\}\}"), "a MyST substitution"),
    (re.compile(r"^\s*\+\+\+", re.M), "a jupytext cell break left in the text"),
]

NUMBER = r"(?:\d[\d,]*|one|two|three|four|five|six|seven|eight|nine|ten)"
#: Counts that must come from the records: "3 seeds", "8,000 training sentences", "lr 1e-4", "on one H100".
HAND_COUNTS = re.compile(
    rf"\b{NUMBER}\s+(?:random\s+)?seeds?\b"
    rf"|\b{NUMBER}\s+(?:training|train)\s+(?:rows|sentences|examples|texts)\b"
    r"|\b\d(?:\.\d+)?e-\d+\b"
    rf"|\bon\s+{NUMBER}\s+(?:NVIDIA|H100|H200|A100|GPUs?)\b",
    re.I,
)
#: A sentence about the paper's own settings may state them.
PAPER_CONTEXT = re.compile(r"paper|Table 3|Hassid|Kobayashi", re.I)


def markup_problems(text: str) -> list[str]:
    """What in one markdown cell's text a Jupyter or Colab reader would see as raw markup."""
    found = []
    for pattern, what in MYST_MARKUP:
        for match in pattern.finditer(text):
            found.append(f"{what}: {match.group(0).strip()[:40]!r}")
    return found


def hand_counts(text: str) -> list[str]:
    """Counts a markdown cell states as literals, outside sentences about the paper."""
    found = []
    for sentence in re.split(r"(?<=[.!?])\s+|\n\n", text):
        if PAPER_CONTEXT.search(sentence):
            continue
        found += [m.group(0) for m in HAND_COUNTS.finditer(sentence)]
    return found


def _markdown_cells(path: Path):
    notebook = nbformat.read(path, as_version=4)
    return [(i, cell.source) for i, cell in enumerate(notebook.cells) if cell.cell_type == "markdown"]


def test_every_chapter_has_a_twin_to_scan():
    assert NOTEBOOKS and len(NOTEBOOKS) == len(list((REPO / "book").glob("*.md")))


@pytest.mark.parametrize("text, what", [
    ("{glue:text}`pat_heads` heads", "a MyST role"),
    ("see {ref}`probing`", "a MyST role"),
    ("```{literalinclude} ../papa_lib/core/averaging.py\n:pyobject: f\n```", "a MyST directive"),
    ("```{note}\nhi\n```", "a MyST directive"),
    (":::{admonition} x\n:::", "a colon-fence directive"),
    ("(probing-results)=\n# Results", "a MyST target"),
    ("{{ version }}", "a MyST substitution"),
])
def test_markup_scan_finds_each_kind(text, what):
    assert any(problem.startswith(what) for problem in markup_problems(text))


def test_markup_scan_passes_what_every_mode_renders():
    text = ("# Title\n\n$C^h = \\frac{1}{|D|}$ and $$x_{ij}$$, `code {x}`, [a link](probing.md),\n"
            "```python\nprint(1)\n```\n<details><summary>Solution</summary>\n\nx\n</details>")
    assert markup_problems(text) == []


@pytest.mark.parametrize("text", [
    "We trained 3 seeds per setting.", "AdamW at 1e-4.", "full training sets (8,000 training sentences)",
    "the first records ran on one NVIDIA H100", "three seeds"])
def test_count_scan_finds_hand_written_counts(text):
    assert hand_counts(text)


def test_count_scan_lets_sentences_about_the_paper_state_its_settings():
    assert hand_counts("The paper trains 5 seeds at Table 3's rate 2e-5. Our run is shown below.") == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_markdown_cells_hold_no_jupyter_book_markup(path):
    problems = [f"cell {i}: {p}" for i, text in _markdown_cells(path) for p in markup_problems(text)]
    assert not problems, f"{path.name} shows raw markup in Jupyter and Colab: " + "; ".join(problems[:8])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_markdown_cells_state_no_count_by_hand(path):
    problems = [f"cell {i}: {c!r}" for i, text in _markdown_cells(path) for c in hand_counts(text)]
    assert not problems, f"{path.name}: counts written by hand (compute them from the records): " + "; ".join(
        problems[:8])


def should_show_output(source: str) -> bool:
    """True when a code cell's last statement is an expression (so IPython displays it) not silenced by ``;``."""
    stripped = source.rstrip()
    if not stripped or stripped.endswith(";"):
        return False
    try:
        tree = ast.parse(source)
    except SyntaxError:  # IPython magics
        return False
    return bool(tree.body) and isinstance(tree.body[-1], ast.Expr)


def test_output_rule_reads_the_last_statement():
    assert should_show_output("x = 1\nchart")
    assert should_show_output("display(sentence)")
    assert not should_show_output("x = 1")
    assert not should_show_output("chart;")
    assert not should_show_output("for i in range(2):\n    print(i)")


@pytest.fixture(scope="module")
def smoke_folders(tmp_path_factory):
    """One results folder shared by every chapter: the first that needs the smoke grid runs it, later ones reuse."""
    root = tmp_path_factory.mktemp("plain-kernel")
    return root / "out", root / "results"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_twin_executes_in_a_plain_kernel_and_every_display_cell_shows_something(path, smoke_folders):
    import papermill

    out, results = smoke_folders
    out.mkdir(parents=True, exist_ok=True)
    executed = out / path.name
    papermill.execute_notebook(
        str(path), str(executed), parameters={"profile": "smoke", "results_dir": str(results)},
        cwd=str(path.parent), kernel_name="python3", progress_bar=False, request_save_on_cell_execute=False,
        execution_timeout=600,
    )
    notebook = nbformat.read(executed, as_version=4)
    silent = []
    for index, cell in enumerate(notebook.cells):
        tags = set(cell.metadata.get("tags", []))
        if cell.cell_type != "code" or tags & {"parameters", "injected-parameters", "install"}:
            continue
        assert not [o for o in cell.outputs if o.get("output_type") == "error"], f"{path.name} cell {index} failed"
        if should_show_output(cell.source) and not cell.outputs:
            silent.append(f"cell {index}: {cell.source.strip().splitlines()[-1][:60]}")
    assert not silent, f"{path.name}: cells that should show something showed nothing: " + "; ".join(silent)
    from papa_lib.book import charts

    drawn = sum(json.dumps(o.get("data", {})).count(charts.CHART_CLASS) for c in notebook.cells
                for o in c.get("outputs", []))
    assert drawn or path.stem in CHARTLESS_CHAPTERS, f"{path.name}: no chart was rendered at smoke"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_chapters_default_to_the_device_torch_sees(path):
    """``device = "auto"`` in every parameters cell (CUDA when torch sees a GPU, as in Colab; else the CPU): the
    plain-kernel run above executes each chapter with it, so every profile resolves it."""
    notebook = nbformat.read(path, as_version=4)
    (parameters,) = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
    assert re.search(r'^device = "auto"', parameters.source, re.M), f"{path.name}: device is not 'auto'"
