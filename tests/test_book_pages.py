"""The book layer the chapters call: figures say where their numbers come from (the records, not the reader's
setup), sentences carry the records' numbers, the scale chapter has a figure without timings, the badge is local."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from test_figures import example_frame

from papa_lib.book import charts, probing_pages, records, scale_pages
from papa_book import offline_badge

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


def test_headline_renders_the_claims_engine_rows():
    from papa_lib.book import claims

    frame = example_frame().assign(profile="local", data_source=LOCAL_SOURCE)
    text = probing_pages.headline_text(frame).data
    engine = claims.claims_table(frame)
    drops = (0.09 / 0.85 + 0.2) / 2
    c1a = engine.set_index("claim").loc["C1a"]
    assert c1a.ours == pytest.approx(drops) and "local files: SST-2" in text
    for claim in probing_pages.HEADLINE_CLAIMS:
        assert claims.verdict_sentence(claim, engine) in text
    table = probing_pages.headline(frame)
    assert list(table.index) == ["C1a", "C1b", "C2"]
    every = engine.set_index("claim")
    for claim in table.index:  # "same" exactly where every task changes neither number nor verdict
        same = (every.loc[claim, "verdict_all_tasks"] == every.loc[claim, "verdict"]
                and claims.ours_text(every.loc[claim]) == claims.ours_text(
                    {"ours": every.loc[claim, "ours_all_tasks"], "ci_low": every.loc[claim, "ci_low_all_tasks"],
                     "ci_high": every.loc[claim, "ci_high_all_tasks"]}))
        assert (table.loc[claim, "with every task"] == "same") == same
    assert list(table.verdict) == [engine.set_index("claim").loc[c, "verdict"] for c in table.index]
    assert table.loc["C1a", "ours [95% interval]"] == claims.ours_text(c1a)
    assert "No Fig. 2 runs" in probing_pages.fig2(frame.iloc[0:0]).data


def _setup(tmp_path, with_records: bool, device: str = "cuda"):
    from papa_lib.book import profiles

    root = tmp_path / "repo"
    local = root / profiles.RESULT_FOLDERS["local"]
    paper = root / profiles.RESULT_FOLDERS["paper"]
    local.mkdir(parents=True)
    paper.mkdir(parents=True)
    grid = "seeds: [0]\nblocks:\n  - name: fig2\n    tasks: [sst2]\n    fractions: [1, 0]\n"
    (paper / "grid.yaml").write_text(grid)
    (local / "grid.yaml").write_text(grid.replace("seeds: [0]", "seeds: [0]\nmax_length: 64"))
    if with_records:
        from papa_lib.experiments.results import ResultsStore

        store = ResultsStore(local)
        for i, (matrix_type, fraction) in enumerate([("original", 1.0), ("average", 0.0)]):
            store.append({"run_id": f"r{i}", "model": "all-MiniLM-L6-v2", "task": "sst2", "matrix_type": matrix_type,
                          "matrices_from": "sst2" if matrix_type == "average" else None,
                          "selection_order": "none", "fraction": fraction, "seed": 0, "metric": "accuracy",
                          "value": 0.8, "eval_size": 10, "train_size": 1000, "config_hash": "x", "profile": "local",
                          "data_source": LOCAL_SOURCE, "versions": "{}", "device": device, "wall_time_s": 64.0})
    return SimpleNamespace(root=root)


def test_scale_estimate_has_a_figure_with_and_without_timings(tmp_path):
    plan_only = scale_pages.estimate(_setup(tmp_path / "a", with_records=False), gpu_speedup=50)
    assert not plan_only.timed and plan_only.rows["hours"].isna().all()
    assert int(plan_only.rows["runs"].sum()) == 2 * 7  # 2 variants x 1 seed x 7 paper models
    spec = plan_only.chart().to_dict()
    assert spec["encoding"]["x"]["field"] == "runs" and "no timings" in str(spec["title"])

    gpu = scale_pages.estimate(_setup(tmp_path / "b", with_records=True, device="cuda:0"), gpu_speedup=50)
    assert gpu.timed and gpu.device == "cuda" and gpu.speedup == 1.0
    # 64 s / (1000 examples x L 64) per token, x 67,349 examples x L 64 x the model's cost ratio
    minilm = gpu.rows[gpu.rows.model == "roberta-base"]
    assert minilm["hours"].sum() == pytest.approx(2 * 64 / 64000 * 67349 * 64 * 8.0 / 3600)
    assert "measured on a GPU" in str(gpu.chart().to_dict()["encoding"]["x"]["title"])
    assert "data: local files: SST-2" in str(gpu.chart().to_dict()["title"]["subtitle"])

    cpu = scale_pages.estimate(_setup(tmp_path / "c", with_records=True, device="cpu"), gpu_speedup=50)
    assert cpu.speedup == 50 and math.isclose(cpu.rows.hours.sum() * 50, gpu.rows.hours.sum() * 1)


def test_colab_badge_is_inlined_in_the_built_page():
    from docutils import nodes

    doctree = nodes.paragraph()
    badge = nodes.image(uri=offline_badge.REMOTE_IMAGE, alt="Open In Colab")
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


def test_against_majority_sets_the_original_probe_against_guessing():
    def rows(task, metric, values, baseline, single=()):
        return [{"task": task, "metric": metric, "matrix_type": "original", "selection_order": "none",
                 "fraction": 1.0, "matrices_from": None, "seed": seed, "value": value,
                 "majority_baseline": baseline, "single_class": seed in single} for seed, value in enumerate(values)]

    frame = pd.DataFrame(rows("cola", "matthews_corrcoef", [0.16, 0.15, 0.17], 0.0)
                         + rows("mrpc", "f1", [0.818, 0.814, 0.823], 0.812)
                         + rows("sst2", "accuracy", [0.51], 0.509, single=(0,)))
    frame.loc[len(frame)] = {**frame.iloc[0].to_dict(), "matrix_type": "zeros", "value": 0.0, "seed": 1,
                             "single_class": True}
    table = probing_pages.against_majority(frame)
    assert list(table.index) == ["cola", "mrpc", "sst2"]
    assert table.loc["cola", "verdict"] == "clearly above" and table.loc["mrpc", "verdict"] == "not clearly above"
    assert table.loc["sst2", "verdict"] == "one seed: no interval"
    assert table.loc["cola", "single-class probes"] == "1 of 4: Zeros (seed 1)"
    assert table.loc["mrpc", "single-class probes"] == "0 of 3" and table.loc["mrpc", "majority baseline"] == "0.812"
    assert probing_pages.against_majority(frame, tasks=["mrpc"]).index.tolist() == ["mrpc"]
    as_text = frame.assign(single_class=frame["single_class"].map(str))  # how a results CSV may hand them back
    assert probing_pages.against_majority(as_text).equals(table)
    assert "original accuracy" not in table  # older records carry no accuracy: no column
    accurate = frame.assign(accuracy=[0.70, 0.72, 0.71, 0.72, 0.74, 0.73, 0.51, 0.4],
                            majority_accuracy=[0.69] * 3 + [0.684] * 3 + [0.509, 0.69])
    shown = probing_pages.against_majority(accurate)
    assert shown.loc["mrpc", "majority accuracy"] == "0.684"
    assert shown.loc["mrpc", "original accuracy"].startswith("0.730")
    assert shown.loc["cola", "original accuracy"].startswith("0.710")  # the zeros run's 0.4 is not the original's
    assert shown.loc["sst2", "majority accuracy"] == "0.509" and shown.loc["sst2", "original accuracy"] == "0.510"
    partial = accurate.assign(majority_accuracy=[None] * 3 + [0.684] * 3 + [None, None])
    assert probing_pages.against_majority(partial).loc["cola", "original accuracy"] == "—"

    shown, note = probing_pages.majority_view(table)  # what the page shows: narrow, names in a note
    assert "95% CI" not in shown and shown.loc["cola", "metric"] == "MCC" and shown.loc["mrpc", "metric"] == "F1"
    assert shown.loc["cola", "single-class probes"] == "1 of 4" and shown.loc["sst2", "single-class probes"] == "1 of 1"
    assert "CoLA: Zeros (seed 1)" in note.data and "SST-2: Original (seed 0)" in note.data
    assert probing_pages.majority_view(table[table.index == "mrpc"])[1].data == ""  # nothing single-class: no note
    merged = probing_pages.majority_view(probing_pages.against_majority(accurate))[0]
    assert merged.loc["mrpc", "accuracy: original vs majority class"] == \
        f"{probing_pages.against_majority(accurate).loc['mrpc', 'original accuracy']} vs 0.684"
    assert "majority accuracy" not in merged

    two = pd.concat([frame.assign(model="a"), frame[frame.task == "cola"].assign(model="b", value=0.3)])
    both = probing_pages.against_majority(two)  # several models: a row per (model, task)
    assert both.index.tolist() == [("a", "cola"), ("a", "mrpc"), ("a", "sst2"), ("b", "cola")]
    assert both.loc[("b", "cola"), "original"].startswith("0.300")
    assert "b CoLA: Zeros (seed 1)" in probing_pages.majority_view(both)[1].data
    more = frame.copy()  # a variant's single-class seeds are listed once, by its registered label
    for matrix_type, seed in (("zeros", 2), ("toeplitz", 0)):
        more.loc[len(more)] = {**frame.iloc[0].to_dict(), "matrix_type": matrix_type, "seed": seed,
                               "single_class": True}
    assert probing_pages.against_majority(more).loc["cola", "single-class probes"] == \
        "3 of 6: Toeplitz (seed 0), Zeros (seeds 1, 2)"


def test_more_seeds_repeats_the_guessing_check_with_a_diagnostic_run(tmp_path):
    from papa_lib.experiments.results import ResultsStore

    def record(i, task, value, model="m", matrix_type="original"):
        return {"run_id": f"r{i}", "model": model, "task": task, "matrix_type": matrix_type, "matrices_from": None,
                "selection_order": "none", "fraction": 1.0 if matrix_type == "original" else 0.0, "seed": i % 8,
                "metric": "f1", "value": value, "eval_size": 10, "train_size": 100, "config_hash": "x",
                "profile": "local", "data_source": "d", "versions": "{}", "device": "cpu", "wall_time_s": 1.0,
                "majority_baseline": 0.812, "single_class": False}

    grid = pd.DataFrame([record(i, "mrpc", v) for i, v in enumerate([0.8175, 0.8143, 0.8226])]
                        + [record(20, "mrpc", 0.80, matrix_type="zeros")])
    results_dir = tmp_path / "local-minilm"
    assert probing_pages.more_seeds(grid, results_dir).empty  # no diagnostic run beside it
    assert set(probing_pages.more_seeds_values(probing_pages.against_majority(grid), pd.DataFrame()).values()) == {
        "not measured"}
    store = ResultsStore(tmp_path / probing_pages.MORE_SEEDS_FOLDERS[0])
    values = [0.8175, 0.8143, 0.8226, 0.8156, 0.8174, 0.8204, 0.8195, 0.8147]
    for i, value in enumerate(values):
        store.append(record(10 + i, "mrpc", value))
    store.append(record(30, "mrpc", 0.5, model="other"))  # another model's run: not this frame's
    store.append(record(31, "sst2", 0.9))  # a task the frame does not show
    more = probing_pages.more_seeds(grid, results_dir)
    assert more.index.tolist() == ["mrpc"] and more.loc["mrpc", "seeds"] == 8
    assert more.loc["mrpc", "verdict"] == "clearly above" and more.loc["mrpc", "95% CI"] == "[0.815, 0.820]"
    glued = probing_pages.more_seeds_values(probing_pages.against_majority(grid), more)
    assert (glued["ms_task"], glued["ms_grid_seeds"], glued["ms_seeds"]) == ("mrpc", "3", "8")
    assert glued["ms_grid_verdict"] == "not clearly above" and glued["ms_verdict"] == "clearly above"
    assert glued["ms_majority"] == "0.812" and glued["ms_ci"] == "[0.815, 0.820]"
    assert more.loc["mrpc", "in the grid"] == glued["ms_shared"] == "none"  # run ids r10-r17: not the grid's
    for folder, first in (("c", 0.8175), ("d", 0.8176)):  # the grid's own seeds 0-2 (same run ids), then new ones
        store = ResultsStore(tmp_path / folder / probing_pages.MORE_SEEDS_FOLDERS[0])
        for i, value in enumerate([first, 0.8143, 0.8226] + values[3:]):
            store.append(record(i, "mrpc", value))
    assert probing_pages.more_seeds(grid, tmp_path / "c" / "x").loc["mrpc", "in the grid"] == "3 of 8, same scores"
    assert probing_pages.more_seeds(grid, tmp_path / "d" / "x").loc["mrpc", "in the grid"] == "3 of 8, scores differ"
    worse = [v - 0.004 for v in values]
    store = ResultsStore(tmp_path / "b" / probing_pages.MORE_SEEDS_FOLDERS[0])
    for i, value in enumerate(worse):
        store.append(record(10 + i, "mrpc", value))
    assert probing_pages.more_seeds(grid, tmp_path / "b" / "x").loc["mrpc", "verdict"] == "not clearly above"


def test_premise_use_sets_the_pair_probe_beside_the_hypothesis_alone(tmp_path):
    from papa_lib.book import alternatives_pages
    from papa_lib.experiments.results import ResultsStore

    def record(i, task, matrix_type, fraction, value, matrices_from=None):
        return {"run_id": f"r{i}", "model": "m", "task": task, "matrix_type": matrix_type,
                "matrices_from": matrices_from,
                "selection_order": "none", "fraction": fraction, "seed": i % 3, "metric": "accuracy", "value": value,
                "eval_size": 10, "train_size": 100, "config_hash": "x", "profile": "local", "data_source": "d",
                "versions": "{}", "device": "cpu", "wall_time_s": 1.0, "majority_baseline": 0.35}

    pair = pd.DataFrame([record(i, "mnli", "original", 1.0, v) for i, v in enumerate([0.52, 0.50, 0.54])]
                        + [record(3 + i, "mnli", "zeros", 0.0, v) for i, v in enumerate([0.46, 0.47, 0.45])]
                        + [record(6 + i, "mnli", "average", 0.0, v, "mnli") for i, v in enumerate([0.48, 0.47, 0.49])]
                        + [record(9, "mnli", "average", 0.5, 0.51, "mnli")])  # not every head constant: left out
    results_dir = tmp_path / "local-minilm"
    assert alternatives_pages.premise_use(pair, results_dir).empty  # no hypothesis-only run beside it
    empty = alternatives_pages.premise_use_values(pd.DataFrame())
    assert set(empty.values()) == {"not measured"}
    assert set(empty) == set(alternatives_pages.premise_use_values.glue_names)
    store = ResultsStore(tmp_path / alternatives_pages.HYPOTHESIS_ONLY_FOLDER)
    for i, value in enumerate([0.50, 0.51, 0.49]):
        store.append(record(20 + i, "mnli_hypothesis_only", "original", 1.0, value))
    table = alternatives_pages.premise_use(pair, results_dir)
    assert table.loc["hypothesis alone: original", "accuracy"] == pytest.approx(0.50)
    assert table.loc["pair: original", "accuracy"] == pytest.approx(0.52)
    assert table.loc["pair: every head Zeros", "seeds"] == 3
    assert table.loc["pair: every head Average (PAPA)", "accuracy"] == pytest.approx(0.48)
    assert table.loc["majority class", "accuracy"] == pytest.approx(0.35)
    values = alternatives_pages.premise_use_values(table)
    assert values["pu_gap"] == "+0.020" and (values["pu_below"], values["pu_kinds"]) == ("2", "2")
    assert (values["pu_const_min"], values["pu_const_max"]) == ("0.460", "0.480")
    assert values["pu_spread_vs_widest"] in ("less than", "not less than")
    better = pair.assign(value=pair.value.where(pair.matrix_type != "average", 0.505))
    assert alternatives_pages.premise_use_values(alternatives_pages.premise_use(better, results_dir))["pu_below"] == "1"


def _two_model_setup(root):
    return SimpleNamespace(profile="local", root=root, results_dir=root / "data" / "results" / "local-minilm")


@pytest.mark.parametrize("with_mpnet", [True, False])
def test_probing_shows_every_committed_model_and_nothing_empty_without_the_second(tmp_path, with_mpnet):
    """The probing chapter's Fig. 3 and its neighbours read the committed MiniLM and MPNet folders (or a copy of only
    MiniLM's): with both, the figures hold both models, the side-by-side table has finite numbers for each shared task,
    the pair's caveat and the engine's C3 sentence are shown, and the banner names MPNet's records; without MPNet,
    none of that appears (no empty table, no promise)."""
    import shutil

    from papa_lib.book import claims, provenance
    from papa_lib.experiments.results import read_results

    repo = ROOT if with_mpnet else tmp_path
    if not with_mpnet:
        shutil.copytree(ROOT / "data" / "results" / "local-minilm", tmp_path / "data" / "results" / "local-minilm")
    setup = _two_model_setup(repo)
    frame = read_results(setup.results_dir)
    others = records.other_local_models(setup, frame)
    models = records.with_models(frame, others)
    mpnet = claims.read_folders([ROOT / "data" / "results" / "local-mpnet"]).get("all-mpnet-base-v2")
    has_second = with_mpnet and mpnet is not None and len(mpnet) > 0
    assert set(models.model) == ({"all-MiniLM-L6-v2", "all-mpnet-base-v2"} if has_second else {"all-MiniLM-L6-v2"})
    assert len(models) == len(frame) + (len(mpnet) if has_second else 0)

    shown = page_objects = probing_pages.two_models(models, None, claims.for_setup(setup))
    fig3 = probing_pages.fig3(models).to_dict()
    points = next(d for d in fig3["datasets"].values() if any("task" in r for r in d))
    diamonds = next(d for d in fig3["datasets"].values() if any("over" in r for r in d))
    assert {r["model"] for r in diamonds} == {r["model"] for r in points}
    for axis in ("x", "y"):  # one title per axis: a layer without its own adds its field's name to it
        assert len({layer["encoding"][axis]["title"] for layer in fig3["layer"]}) == 1
    text = str(provenance.banner(setup, frame, also=others, live=None))
    side = probing_pages.models_side_by_side(models)
    if not has_second:
        assert shown == [] and side is None and probing_pages.pair_text(models, claims.for_setup(setup)) is None
        assert "local-mpnet" not in text and "all-mpnet-base-v2" not in text
        assert {r["model"] for r in points} == {"all-MiniLM-L6-v2"}
        return
    # the side-by-side table holds the tasks where MPNet has both ends: the original and every head constant
    ends = mpnet[(mpnet.matrix_type == "original") | ((mpnet.matrix_type == "average") & (mpnet.fraction == 0))]
    both = ends.groupby("task").matrix_type.nunique()
    shared = sorted(set(both[both == 2].index) & set(frame.task))
    assert side is not None and sorted(side.index.get_level_values("task").unique()) == shared
    assert not side.isna().any().any() and not side.map(lambda v: "nan" in str(v).lower()).any().any()
    assert set(side.index.get_level_values("model")) == {"all-MiniLM-L6-v2", "all-mpnet-base-v2"}
    assert {r["model"] for r in points} == {"all-MiniLM-L6-v2", "all-mpnet-base-v2"}
    words = "\n".join(getattr(o, "data", "") for o in page_objects if hasattr(o, "data"))
    assert "direction, not a trend" in words and "MLM-pretrained" in words and "contrastively" in words
    c3 = claims.claim_row("C3", claims.for_setup(setup), "all-MiniLM-L6-v2 vs all-mpnet-base-v2")
    assert f"Verdict: **{c3.verdict}**" in words and c3.verdict in ("direction agrees", "direction differs",
                                                                      "inconclusive")
    assert "nan" not in words.lower()
    mpnet_line = text.split("Beside it, ")[1]
    assert "data/results/local-mpnet" in mpnet_line and "model all-mpnet-base-v2" in mpnet_line
    assert f"{len(mpnet)} records" in mpnet_line and "seeds" in mpnet_line and "ran on " in mpnet_line


def test_alternatives_take_a_second_model_only_once_its_data_free_rows_exist(tmp_path):
    """Table 1 shows another committed model only when its records hold data-free rows; then the table, the chart and
    the C4 sentences carry both models."""
    import shutil

    from papa_lib.book import alternatives_pages, claims
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
    six = ["cola", "mrpc", "sst2", "mnli", "ner", "pos"]
    styled = alternatives_pages.table1(models, six)
    table = styled.data
    assert set(table.index.get_level_values(0)) == {"all-MiniLM-L6-v2", "all-mpnet-base-v2"}
    assert "Average (PAPA)" in set(table.index.get_level_values(1))  # labelled as with one model
    cell = table.loc[("all-MiniLM-L6-v2", "Average (PAPA)"), "cola"]
    mean, half = cell.split(" ± ")
    assert f"{mean}<br><small>±\u00a0{half}</small>" in styled.to_html()  # the interval under its mean
    chart = alternatives_pages.table1_chart(models, six).to_dict()
    assert '"shape"' in str(chart).replace("'", '"')
    text = alternatives_pages.verdict_text(models, six).data
    assert "Ours (all-MiniLM-L6-v2;" in text and "Ours (all-mpnet-base-v2;" in text


def test_the_pair_caveat_is_said_once_in_the_intro_and_only_with_two_models(tmp_path):
    import shutil

    from papa_lib.book import claims, intro_pages

    assert claims.pair_caveat(["all-MiniLM-L6-v2"]) == ""
    short = claims.pair_caveat(["all-MiniLM-L6-v2", "all-mpnet-base-v2"])
    assert "contrastively fine-tuned" in short and "MLM-pretrained" in short and "direction, not a trend" in short
    assert short.count(".") == 1  # one sentence in the intro; the probing chapter's long form adds the why
    assert claims.pair_caveat(["all-MiniLM-L6-v2", "all-mpnet-base-v2"], long=True).startswith(short)
    assert "contrastively" not in claims.pair_caveat(["all-MiniLM-L6-v2", "roberta-base"])
    shutil.copytree(ROOT / "data" / "results" / "local-minilm", tmp_path / "data" / "results" / "local-minilm")
    alone = intro_pages.claims_summary(_two_model_setup(tmp_path)).data
    assert "C3 compares" not in alone
    if (ROOT / "data" / "results" / "local-mpnet" / "results.csv").is_file():
        assert intro_pages.claims_summary(_two_model_setup(ROOT)).data.count(short) == 1


def test_relative_drops_tell_the_models_apart_only_when_there_are_several():
    frame = pd.read_csv(ROOT / "data" / "results" / "local-minilm" / "results.csv")
    one = probing_pages.relative_drops(frame).to_dict()
    two = probing_pages.relative_drops(pd.concat([frame, frame.assign(model="all-mpnet-base-v2")])).to_dict()
    by_model = "'strokeDash': {'field': 'model'"  # an encoding (the paper's reference lines are dashed marks)
    assert by_model not in str(one) and by_model in str(two)
