"""What a reader sees: the page scan finds what must never be shown, tables and charts are readable, internal links
resolve, and charts also carry the vega-lite mimetype and export as SVG and PDF."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from papa_book import build, page_check

from papa_lib.book import charts, grid_views, tables


@pytest.mark.parametrize("text, what", [
    ("<papa_lib.book.records.Foo object at 0x7f3a2b>", "object repr"),
    ("<IPython.core.display.Markdown object>", "object repr"),
    ("/x/.venv/lib/python3.12/site-packages/tqdm/auto.py:21: TqdmWarning: IProgress not found", "warning"),
    ("data folder /tmp/pytest-1/cache/sample-d02399f6c613", "machine path"),
    ("Traceback (most recent call last):", "traceback"),
    ("score NaN for this task", "NaN"),
    ("over 6 task(s)", "template grammar"),
    ("head 2.4 is the most diagonal", "raw head name"),
    ("share of the loss recovered −25.242543", "too many digits"),
    ("interval 0.0020000", "too many digits"),
])
def test_text_scan_finds_each_defect(text, what):
    assert any(p.startswith(what) for p in page_check.text_problems(text)), page_check.text_problems(text)


def test_text_scan_passes_clean_text():
    clean = ("8.4% [3.3%, 11.8%] over 6 tasks, fractions 1, 0.5, 0.0625; layer 2, head 4; torch 2.13.0; "
             "python -m venv .venv && . .venv/bin/activate; 7,696 examples; not measured")
    assert page_check.text_problems(clean) == []


def test_page_scan_reads_what_the_page_says_not_the_code_it_shows():
    code = ('<div class="cell_input docutils container"><div class="highlight-ipython3 notranslate">'
            '<div class="highlight"><pre>fill = np.nan  # a code comment with 0.123456</pre></div></div></div>')
    said = '<div class="cell_output docutils container"><p>distance nan</p></div>'
    assert page_check.html_problems(code) == []
    assert [p.split(":")[0] for p in page_check.html_problems(code + said)] == ["NaN"]


def test_chart_scan_finds_raw_identifier_titles_and_readable_titles_fix_them():
    spec = {"layer": [{"encoding": {"x": {"field": "ci_low", "type": "quantitative"},
                                    "x2": {"field": "ci_high"},
                                    "y": {"field": "task", "type": "nominal", "title": "best_data_free_score"},
                                    "color": {"field": "matrix_type", "legend": None}}}]}
    found = page_check.chart_problems(spec)
    assert {p.split(": ")[1] for p in found} == {"ci_low", "ci_high", "best_data_free_score"}
    fixed = charts.readable_titles(spec)
    assert page_check.chart_problems(fixed) == []
    assert fixed["layer"][0]["encoding"]["x"]["title"] is None  # the value's axis title is kept, not joined
    assert fixed["layer"][0]["encoding"]["y"]["title"] == "best data-free score"


def test_tables_show_words_three_significant_figures_and_no_row_numbers():
    frame = pd.DataFrame({"ci_low": [0.083989, np.nan], "train_size": [7696.0, 3.0], "task": ["sst2", "cola"]})
    html = tables.to_html(frame)
    assert page_check.html_problems(html) == []
    assert "0.084" in html and "7,696" in html and tables.MISSING in html and "95% interval, low" in html
    assert "SST-2" in html and "CoLA" in html and "sst2" not in html  # the book's task names, not the records' ids
    by_task = tables.display_frame(frame.set_index("task").T)
    assert list(by_task.columns) == ["SST-2", "CoLA"]  # task ids as headers too
    listed = tables.display_frame(pd.DataFrame({"tasks": ["cola, sst2; worst task: cola"], "x": ["positions"]}))
    assert listed.tasks[0] == "CoLA, SST-2; worst task: CoLA" and listed.x[0] == "positions"
    assert tables.name_tasks("inner positions of the pos task") == "inner positions of the POS task"
    kept = "`papa grid --task sst2` reads results/sst2/sst2-L64-ab.safetensors and mnli.tsv"
    assert tables.name_tasks(kept) == kept  # code spans and ids inside names are left alone
    assert tables.name_tasks("largest change: cola, -0.008 on sst2.") == "largest change: CoLA, -0.008 on SST-2."
    from papa_lib.book.display import markdown

    assert markdown("over cola and `cola`").data == "over CoLA and `cola`"  # every page's Markdown output

    raw = frame.to_html()
    assert any("raw identifier" in p for p in page_check.html_problems(raw))
    assert any("raw DataFrame index" in p for p in page_check.html_problems(raw))
    pipes = "<p>| claim | verdict |\n|—|—|\n| C1a | agrees |</p>"  # myst-nb's CommonMark leaves a table as text
    assert any("Markdown table printed as text" in p for p in page_check.html_problems(pipes))
    assert page_check.html_problems("<table><tr><td>a | b</td></tr></table><p>x | y</p>") == []
    assert tables.format_number(123.6694) == "124" and tables.format_number(-0.0051634) == "-0.00516"
    assert tables.plural(1, "task") == "1 task" and tables.plural(6, "task") == "6 tasks"


def test_charts_name_tasks_as_the_book_does_in_data_sort_orders_and_domains():
    alt = pytest.importorskip("altair")
    frame = pd.DataFrame({"task": ["sst2", "cola", "custom"], "value": [0.1, 0.2, 0.3]})
    chart = alt.Chart(frame).mark_bar().encode(
        x="value:Q", y=alt.Y("task:N", sort=["cola", "sst2", "custom"]),
        color=alt.Color("task:N", scale=alt.Scale(domain=["sst2", "cola", "custom"])))
    spec = charts._offline_renderer(chart.to_dict())[charts.VEGALITE_MIMETYPE]
    (rows,) = spec["datasets"].values()
    assert [row["task"] for row in rows] == ["SST-2", "CoLA", "custom"]  # an unknown task keeps its own name
    assert spec["encoding"]["y"]["sort"] == ["CoLA", "SST-2", "custom"]
    assert spec["encoding"]["color"]["scale"]["domain"] == ["SST-2", "CoLA", "custom"]
    facet = alt.Chart(frame).mark_bar().encode(x="value:Q").facet(facet=alt.Facet("task:N", sort=["sst2", "cola"]))
    assert charts._offline_renderer(facet.to_dict())[charts.VEGALITE_MIMETYPE]["facet"]["sort"] == ["SST-2", "CoLA"]
    assert frame.task.tolist() == ["sst2", "cola", "custom"]  # the caller's data is not changed


def test_offline_renderer_adds_the_vegalite_mimetype_and_exports_svg_and_pdf(tmp_path):
    alt = pytest.importorskip("altair")
    chart = alt.Chart(pd.DataFrame({"relative_drop": [0.1, 0.2], "task": ["a", "b"]})).mark_bar().encode(
        x="relative_drop:Q", y="task:N").properties(title="A test chart")
    charts.setup(export_to=tmp_path / "figures")
    try:
        bundle = charts._offline_renderer(chart.to_dict())
    finally:
        charts.setup()
    assert bundle[charts.VEGALITE_MIMETYPE]["encoding"]["x"]["title"] == "relative drop"
    assert 'class="papa-vega-chart"' in bundle["text/html"]
    pdf, svg = sorted((tmp_path / "figures").glob("01-a-test-chart.*"))
    assert pdf.suffix == ".pdf" and pdf.read_bytes().startswith(b"%PDF")
    assert svg.suffix == ".svg" and "<svg" in svg.read_text(encoding="utf-8")
    import nbformat

    output = nbformat.v4.new_output("display_data", data=bundle)
    nbformat.validate(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(outputs=[output])]))


def test_broken_internal_links_are_found_and_fail_the_check(tmp_path):
    (tmp_path / "book").mkdir()
    (tmp_path / "_static").mkdir()
    (tmp_path / "_static" / "style.css").write_text("", encoding="utf-8")
    (tmp_path / "book" / "a.html").write_text(
        '<link href="../_static/style.css"><a href="b.html#x">ok</a><a href="scale.md">bad</a>'
        '<a href="https://example.org/missing.html">external</a><a href="#top">anchor</a>'
        '<img src="../_static/missing.png">', encoding="utf-8")
    (tmp_path / "book" / "b.html").write_text("<p>b</p>", encoding="utf-8")
    assert page_check.broken_links(tmp_path) == ["book/a.html: scale.md", "book/a.html: ../_static/missing.png"]
    with pytest.raises(build.BookBuildError, match="2 broken internal link"):
        build.check_links(tmp_path)
    (tmp_path / "book" / "a.html").write_text('<a href="b.html">ok</a>', encoding="utf-8")
    build.check_links(tmp_path)


def test_stylers_get_readable_index_names_and_three_significant_figures():
    previous = (pd.get_option("styler.format.formatter"), pd.get_option("styler.format.na_rep"))
    pd.set_option("styler.format.formatter", tables._cell)
    pd.set_option("styler.format.na_rep", tables.MISSING)
    try:
        frame = pd.DataFrame({"x": [1.0, np.nan], "matrix_type": ["a", "b"], "task": ["mrpc", "ner"]})
        html = tables._styler_html(frame.set_index(["matrix_type", "task"]).style)
        cells = tables._styler_html(frame.style)  # a task column's cells
    finally:
        pd.set_option("styler.format.formatter", previous[0])
        pd.set_option("styler.format.na_rep", previous[1])
    assert page_check.html_problems(html) == [] and "matrix type" in html and tables.MISSING in html
    assert ">MRPC<" in html and ">NER<" in html and ">mrpc<" not in html
    assert ">MRPC<" in cells and ">mrpc<" not in cells


def test_link_check_skips_theme_templates(tmp_path):
    (tmp_path / "_static").mkdir()
    (tmp_path / "_static" / "webpack-macros.html").write_text('<link href="{{ pathto(\'x\') }}">', encoding="utf-8")
    (tmp_path / "index.html").write_text('<a href="book/missing.html">x</a>', encoding="utf-8")
    assert page_check.broken_links(tmp_path) == ["index.html: book/missing.html"]


def test_shown_matrices_are_float16_copies_found_after_the_grid_cache(tmp_path):
    import torch
    from safetensors import safe_open

    from papa_lib.core.averaging import ConstantAttention

    matrices = torch.rand(2, 3, 8, 8)
    constants = ConstantAttention(matrices / matrices.sum(-1, keepdim=True), torch.ones(8, 8, dtype=torch.long),
                                  {"model": "m", "max_length": 8, "num_examples": 5})
    path = grid_views.save_shown(constants, tmp_path / grid_views.SHOWN_FOLDER, "sst2-L8-abc.safetensors")
    with safe_open(str(path), framework="pt") as handle:
        assert handle.get_tensor("matrices").dtype == torch.float16
    found = grid_views.stored_matrices(tmp_path, "sst2", 8, model="m")
    assert found.matrices.dtype == torch.float32 and found.metadata["stored_as"] == "float16"
    assert torch.allclose(found.matrices, constants.matrices, atol=1e-3)
    assert grid_views.stored_matrices(tmp_path, "sst2", 8, model="other") is None
    constants.save(tmp_path / "matrices" / "sst2-L8-def.safetensors")  # the grid's own cache comes first
    assert "stored_as" not in grid_views.stored_matrices(tmp_path, "sst2", 8, model="m").metadata


def test_committed_shown_matrices_are_compact():
    folder = Path(__file__).resolve().parents[1] / "data" / "results" / "local-minilm" / grid_views.SHOWN_FOLDER
    files = sorted(folder.glob("*.safetensors"))
    assert {f.name.split("-L")[0] for f in files} >= {"sst2", "mnli"}, "transfer needs SST-2's own and MNLI's"
    assert sum(f.stat().st_size for f in files) < 2_000_000
    for path in files:
        constants = grid_views.load_matrices(path)
        assert constants.metadata["stored_as"] == "float16" and constants.metadata["model"] == "all-MiniLM-L6-v2"
