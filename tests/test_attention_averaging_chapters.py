"""The attention and averaging chapters build Eq. 1 and Eq. 2 in view and print how far their teaching code is from
the model and from :func:`papa_lib.average_attention`: these tests execute the notebooks (papermill, a plain kernel,
as Jupyter and Colab run them) and read those printed checks, so that a teaching cell that drifts from the library
fails here, not only on the page.

* attention at ``smoke``: Eq. 1 by hand equals ``output_attentions`` in every head, ``A V`` equals the head's output,
  the App. A layout puts ``[CLS]`` at 0 and ``[SEP]`` at L-1, rows sum to 1 and padded keys get no weight;
* averaging at ``smoke``: Eq. 2 by hand and the streaming sum equal the library, counts included;
* averaging at ``local``: the chapter shows the committed SST-2 matrices and counts the other committed model
  (all-mpnet-base-v2) by the same rules, with the shares :func:`papa_lib.analysis.patterns.pattern_summary` gives.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
#: Printed differences between a teaching implementation and the model or library above this fail the test.
TOLERANCE = 1e-5


def _execute(chapter: str, out: Path, **parameters) -> str:
    """Run ``book/<chapter>.ipynb`` with papermill and return every text it shows (streams, Markdown, HTML)."""
    import papermill

    executed = out / f"{chapter}.ipynb"
    papermill.execute_notebook(
        str(REPO / "book" / f"{chapter}.ipynb"), str(executed), parameters=parameters, cwd=str(REPO / "book"),
        kernel_name="python3", progress_bar=False, request_save_on_cell_execute=False, execution_timeout=600,
    )
    texts = []
    for cell in nbformat.read(executed, as_version=4).cells:
        for output in cell.get("outputs", []):
            assert output.get("output_type") != "error", f"{chapter}: {output.get('ename')}: {output.get('evalue')}"
            if output.get("output_type") == "stream":
                texts.append(output["text"])
            for kind in ("text/markdown", "text/html"):
                value = output.get("data", {}).get(kind)
                if value and "papa-vega-chart" not in value:
                    texts.append(value if isinstance(value, str) else "".join(value))
    return "\n".join(texts)


def _number(pattern: str, text: str) -> float:
    found = re.search(pattern, text)
    assert found, f"not printed: {pattern!r}"
    return float(found.group(1))


@pytest.mark.slow
def test_attention_chapter_rebuilds_eq1_and_the_head_output(tmp_path):
    text = _execute("attention", tmp_path, profile="smoke", results_dir=str(tmp_path / "results"))
    assert _number(r"largest \|Eq\. 1 by hand - model\| = (\S+)", text) < TOLERANCE
    assert _number(r"over all \d+ heads: (\S+)", text) < TOLERANCE
    assert _number(r"largest \|A V by hand - the head's output in the model\| = (\S+)", text) < TOLERANCE
    layout = re.findall(r"^0:\S+ .* (\d+):(\S+)$", text, re.M)
    assert layout and all(position == "63" and token == "[SEP]" for position, token in layout)  # L-1 (App. A)
    assert "row sums: from 1.000 to 1.000" in text
    assert _number(r"largest weight on a padded key: (\S+)", text) == 0
    assert "reproduces the model's attention matrices" in text  # the closing sentences


@pytest.mark.slow
def test_averaging_chapter_rebuilds_eq2_and_its_stream(tmp_path):
    text = _execute("averaging", tmp_path, profile="smoke", results_dir=str(tmp_path / "results"))
    assert _number(r"largest difference from papa_lib\.average_attention: (\S+)", text) < TOLERANCE
    assert _number(r"largest \|by hand - library\| = (\S+) on C", text) < TOLERANCE
    assert _number(r"on C, (\S+) on N", text) == 0
    assert "shown below: the live average" in text  # a fresh results folder holds no stored matrices


@pytest.mark.slow
def test_averaging_counts_the_other_committed_models_by_the_same_rules(tmp_path, shared_data):
    from papa_lib.analysis import patterns
    from papa_lib.book import grid_views

    text = _execute("averaging", tmp_path, profile="local", n_sentences=64)
    assert "the probing runs' matrices (67,349 sentences)" in text  # local-minilm/shown
    mpnet = grid_views.stored_matrices(REPO / "data" / "results" / "local-mpnet", "sst2", 64)
    assert mpnet is not None and mpnet.metadata["model"] == "all-mpnet-base-v2"
    assert tuple(mpnet.matrices.shape) == (12, 12, 64, 64) and mpnet.metadata["num_examples"] == 67349
    column = "ours: all-mpnet-base-v2, SST-2 train, 67,349 sentences (local files)"
    assert column in text
    summary = patterns.pattern_summary(mpnet)
    assert (f"all-mpnet-base-v2's matrices have {summary['diagonal'].mean():.0%} diagonal and "
            f"{summary['cls_sep'].mean():.0%} [CLS]/[SEP] heads") in text
