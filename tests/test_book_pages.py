"""The book layer the chapters call: figures say where their numbers come from (the records, not the reader's
setup), sentences carry the records' numbers, the scale chapter has a figure without timings, the badge is local."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pandas as pd
from papa_book import chapters, offline_badge
from test_figures import example_frame

from papa_lib.book import charts, records

ROOT = Path(__file__).resolve().parents[1]
LOCAL_SOURCE = ("train: /tmp/x/data/glue/SST-2/train.tsv [subsample of 8000/67349, seed 0]; "
                "validation: /tmp/x/data/glue/SST-2/dev.tsv")
MNLI_SOURCE = ("train: ../shared/data/glue/MNLI-sample/train.tsv (MNLI-sample: a sample of MNLI training data); "
               "validation: ../shared/data/glue/MNLI-sample/dev.tsv (MNLI-sample: a sample of MNLI dev data)")


def test_data_label_names_the_kind_and_the_datasets():
    assert records.data_label([LOCAL_SOURCE, MNLI_SOURCE, LOCAL_SOURCE]) == "local files: SST-2, MNLI-sample"
    assert records.data_label(["train: /d/conll2003/eng.train; validation: /d/conll2003/eng.testa"]) == (
        "local files: CoNLL-2003")
    hub = "train: hub:nyu-mll/glue/sst2:train; validation: hub:nyu-mll/glue/sst2:validation"
    assert records.data_label([hub]) == "hub datasets: glue/sst2"
    assert records.data_label(["/work/shared/data/wikitext-2 (probe: wiki.valid.tokens, score: x)"]) == (
        "local files: WikiText-2")
    assert records.data_label(["train: /tmp/papa-smoke-data/glue/SST-2/train.tsv"]) == "generated data"
    assert records.data_label([LOCAL_SOURCE], profile="smoke") == "generated data"
    assert records.data_label([None, float("nan"), ""]) == ""


def test_describe_reads_the_records_and_falls_back_only_where_they_are_silent():
    frame = pd.DataFrame({"model": ["all-MiniLM-L6-v2"] * 2, "profile": ["local"] * 2,
                          "data_source": [LOCAL_SOURCE, MNLI_SOURCE]})
    # the reader's setup would say "hub datasets" (no ../shared here); the records say what produced them
    described = records.describe(frame, model="other", data="hub datasets", profile="paper")
    assert described == {"model": "all-MiniLM-L6-v2", "data": "local files: SST-2, MNLI-sample", "profile": "local"}
    assert records.describe(frame.drop(columns="profile"), profile="local")["profile"] == "local"
    assert records.describe(frame.iloc[0:0], model="m", data="d", profile="p") == {
        "model": "m", "data": "d", "profile": "p"}
    assert records.ours_label(frame) == "ours: all-MiniLM-L6-v2 (local)"
    assert records.model_label(["a", "b", "c", "d"]) == "4 models"


def test_records_title_is_wrapped_and_labelled_from_the_records():
    frame = pd.DataFrame({"model": ["m"], "profile": ["local"], "data_source": [LOCAL_SOURCE]})
    title = charts.records_title("A title " * 12, frame)
    assert isinstance(title.text, list) and all(len(line) <= charts.TITLE_CHARACTERS for line in title.text)
    assert title.subtitle == "model: m, data: local files: SST-2, profile: local"
    assert charts.panel_width(2) * 2 + 2 * 55 <= charts.CONTENT_WIDTH


def test_coverage_says_what_is_missing():
    from papa_lib.experiments.grid import GridBlock

    spec = {"seeds": [0, 1], "blocks": [GridBlock(name="fig2", tasks=["sst2", "cola"], fractions=[1, 0.5, 0])]}
    table, text = records.coverage(example_frame(), spec, ["fig2"], tasks=["sst2", "cola", "mrpc"])
    assert int(table["expected"].sum()) == 12 and text.startswith("12 of 12 declared runs")
    assert "Not in this profile's grid: mrpc." in text
    table, text = records.coverage(example_frame().iloc[0:3], spec, ["fig2"])
    assert "3 of 12" in text and "— = not run yet" in text
    assert "no grid file" in records.coverage(example_frame(), {"blocks": []}, ["fig2"])[1]
    assert "more runs" not in text  # every stored seed is one the grid lists
    one_seed = {**spec, "seeds": [0]}  # the table holds seed 1 too, as a seed file beside the grid adds seeds
    table, text = records.coverage(example_frame(), one_seed, ["fig2"], tasks=["sst2", "cola"])
    assert text.startswith("6 of 6 declared runs") and "holds 6 more runs" in text and "(seed 1, " in text


def test_colab_badge_is_inlined_in_the_built_page():
    from docutils import nodes

    doctree = nodes.paragraph()
    badge = nodes.image(uri=chapters.COLAB_BADGE_IMAGE, alt="Open In Colab")
    other = nodes.image(uri="figure.png")
    doctree += [badge, other]
    offline_badge._local_badge(None, doctree, "book/intro")
    assert badge["uri"].startswith("data:image/svg+xml;base64,") and other["uri"] == "figure.png"
    assert "Open in" in offline_badge.BADGE_SVG and "http" not in offline_badge.BADGE_SVG.replace(
        "http://www.w3.org/2000/svg", "")


def test_packaged_sample_sources_are_labelled_as_such():
    from papa_lib.book import records

    source = ("train: papa_lib/samples/glue/SST-2/train.tsv (packaged sample); "
              "validation: papa_lib/samples/glue/SST-2/dev.tsv (packaged sample)")
    assert records.data_label([source], "local") == "packaged sample: SST-2"
    assert records.data_label(["train: /x/glue/CoLA/train.tsv"], "local") == "local files: CoLA"


def _two_model_setup(root):
    return SimpleNamespace(profile="local", root=root, results_dir=root / "data" / "results" / "local-minilm")


def test_alternatives_take_a_second_model_only_once_its_data_free_rows_exist(tmp_path):
    """Table 1 (book/alternatives.md) shows another committed model only when its records hold data-free rows: the
    records view gives it only then (the chapter's table with both models:
    tests/test_alternatives_transfer_chapters.py)."""
    import shutil

    from papa_lib.analysis import claims
    from papa_lib.experiments.results import read_results

    results = tmp_path / "data" / "results"
    shutil.copytree(ROOT / "data" / "results" / "local-minilm", results / "local-minilm")
    setup = _two_model_setup(tmp_path)
    frame = read_results(setup.results_dir)
    (results / "local-mpnet").mkdir()
    no_data_free = frame[~frame.matrix_type.isin(claims.DATA_FREE)].assign(model="all-mpnet-base-v2")
    no_data_free.to_csv(results / "local-mpnet" / "results.csv", index=False)
    assert records.other_local_models(setup, frame, needs=claims.DATA_FREE) == {}
    assert len(records.other_local_models(setup, frame)) == 1  # the probing pages still show it
    frame.assign(model="all-mpnet-base-v2").to_csv(results / "local-mpnet" / "results.csv", index=False)
    others = records.other_local_models(setup, frame, needs=claims.DATA_FREE)
    models = records.with_models(frame, others)
    assert list(others) == [results / "local-mpnet"] and models.model.nunique() == 2
    margins = {m: claims.data_free_margins(rows) for m, rows in models.groupby("model")}
    assert set(margins) == {"all-MiniLM-L6-v2", "all-mpnet-base-v2"} and all(len(m) for m in margins.values())

