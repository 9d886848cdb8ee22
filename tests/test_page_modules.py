"""Every chapter helper module runs in the quick loop (``-m "not slow"``), on the smoke profile's tiny model and
generated data, without executing a chapter: each test calls a page module as its chapter does and checks what it
returns. (The chapters themselves run in the slow tests.)"""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import papa_lib
from papa_lib.book import profiles

pytestmark = pytest.mark.usefixtures("restore_registries")  # premise_use reads a grid that registers a task

@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    setup = profiles.resolve("smoke", results_dir=tmp_path_factory.mktemp("results"))
    model, tokenizer = setup.encoder()
    return setup, model, tokenizer


def _spec(chart) -> dict:
    return chart.to_dict()


def test_attention_pages_and_inputs(smoke):
    from papa_lib.book import attention_pages as page
    from papa_lib.book import inputs

    setup, model, tokenizer = smoke
    texts, data_label = inputs.sentences(setup, limit=6)
    assert len(texts) == 6 and all(isinstance(t, str) and t for t in texts) and data_label
    batch = papa_lib.encode(tokenizer, texts, max_length=24)
    first = page.first_tokens(tokenizer, batch)
    lines = first.data
    positions = [p for p in lines.loc["position"].to_numpy().ravel() if p]
    shown = [t for t in lines.loc["token"].to_numpy().ravel() if t]
    assert positions[0] == "0" and positions[-1] == "23"  # [CLS] at 0, [SEP] at L-1 (App. A)
    assert shown[0] == tokenizer.cls_token and shown[-1] == tokenizer.sep_token and len(shown) == len(positions)
    assert lines.shape[1] == 8 and list(lines.index[:2]) == ["position", "token"]  # 8 to a line, then wraps
    assert "col_heading" not in first.to_html()  # no 0, 1, 2 … header over the lines
    with pytest.raises(ValueError, match="per_row"):
        page.first_tokens(tokenizer, batch, per_row=0)
    with torch.no_grad():
        attentions = torch.stack(model(**batch, output_attentions=True).attentions, dim=1)
    frame = page.variability(attentions, batch["attention_mask"])
    layers, heads = attentions.shape[1:3]
    assert len(frame) == layers * heads and frame["variability"].between(0, 1).all()
    label = dict(model=setup.model_label, data=data_label, profile="smoke")
    gallery = _spec(page.head_gallery(attentions, batch, tokenizer, texts, label, shown=2))
    assert {p["name"] for p in gallery["params"]} == {"layer_choice", "head_choice"}
    assert _spec(page.variability_chart(frame, label, 6))["mark"]["type"] == "rect"
    values = page.variability_values(frame, 6)
    assert values["var_sentences"] == "6" and 0 <= float(values["var_low"]) <= float(values["var_high"]) <= 1


def test_averaging_pages(smoke):
    from papa_lib.analysis import patterns
    from papa_lib.book import averaging_pages as page

    setup, model, tokenizer = smoke
    batch = papa_lib.encode(tokenizer, ["a short one", "a rather longer sentence than the first one"], max_length=16)
    constants = papa_lib.average_attention(model, [batch], progress=False, source="two sentences")
    label = dict(model=setup.model_label, data="two sentences", profile="smoke")
    assert _spec(page.counts_chart(constants.counts, label))
    assert page.stored_constants(setup, model, "sst2", 16) is None  # nothing stored in a fresh results folder
    # the book's task name, the sentence count, and no raw task id
    assert page.corpus_label(constants, "sst2").startswith("SST-2 train, 2 sentences")
    assert _spec(page.gallery(constants, label, shown_positions=8))
    summary = patterns.pattern_summary(constants)
    table = page.pattern_table(summary, label).data
    # the row labels say what the numbers are; the profile is not appended to the data label
    assert table.columns.name == "share of heads"  # in the table's corner
    assert list(table.columns)[1] == f"ours: {setup.model_label}, two sentences"
    assert _spec(page.pattern_scatter(summary, label))
    assert _spec(page.representative_heads(constants, summary, label, 8))
    assert _spec(page.sensitivity_chart(summary, label))
    assert page.patterns_values(summary, setup.model_label)["pat_model"] == setup.model_label


def test_intro_pages(smoke):
    from papa_lib.book import intro_pages as page

    setup, _, _ = smoke
    settings = page.settings(setup, ["sst2", "cola"], runs_missing=False)
    assert len(settings.data)  # a Styler (papa_lib.book.tables) over the settings frame
    assert settings.data.set_index("setting").loc["tasks", "value"] == "SST-2, CoLA"
    assert page.task_table(setup, ["sst2"]) is not None
    assert _spec(page.heads_chart("smoke"))
    assert "No records" in page.claims_table(setup).data  # none run yet
    rules = page.claims_rules(setup)
    assert rules is None or {"C4", "C5"} <= set(rules.index)


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """The local profile reading the committed records (nothing is run: run_missing stays False)."""
    return profiles.resolve("local")


def test_averaging_counts_the_other_committed_models_by_the_same_rules(local):
    from papa_lib.analysis import patterns
    from papa_lib.book import averaging_pages as page

    others = page.other_models_constants(local, "sst2", 64)
    assert set(others) == {"all-mpnet-base-v2"}  # local-mpnet/shown: its grid's SST-2 matrices at L = 64
    mpnet = others["all-mpnet-base-v2"]
    assert tuple(mpnet.matrices.shape) == (12, 12, 64, 64) and mpnet.metadata["num_examples"] == 67349
    own = page.stored_constants(local, local.encoder()[0], "sst2", 64)
    label = dict(model=local.model_label, data=page.corpus_label(own, "sst2"), profile="local")
    table = page.pattern_table(patterns.pattern_summary(own), label, others=others).data
    column = "ours: all-mpnet-base-v2, SST-2 train, 67,349 sentences (local files)"
    summary = patterns.pattern_summary(mpnet)
    assert table[column].tolist() == [summary["diagonal"].mean(), summary["cls_sep"].mean()]
    assert page.other_models_constants(profiles.resolve("smoke"), "sst2", 64) == {}  # local only


def test_mlm_figures_on_the_committed_run(local, capsys):
    from papa_lib.analysis import mlm_probe
    from papa_lib.book import mlm_figures as page

    plan = page.plan(local, None, None, run=False)
    assert plan.table() is not None
    mlm_frame, grid_frame, lambdas = plan.results()
    assert len(mlm_frame) and len(lambdas)
    tokenizer = plan.tokenizer()
    corpus = mlm_probe.load_mlm_corpus(local.data_dir)
    mlm_data = page.corpus_label(corpus, "local")
    examples = mlm_probe.mlm_sequences(tokenizer, corpus["eval_lines"], 32, limit=4)
    counts, targets = page.masked_targets(mlm_probe.mask_tokens(examples, tokenizer, seed=1), tokenizer)
    assert len(counts) and len(targets)
    assert page.lambda_spread(lambdas) is not None
    label = dict(model=plan.label, data=mlm_data, profile="local")
    assert _spec(page.lambda_chart(lambdas, label))
    assert page.fig6_coverage(plan, mlm_frame, grid_frame, ["mnli"]) is not None
    assert page.fig6(mlm_frame, grid_frame, ["mnli"], mlm_data, "local") is not None
    assert len(page.beside_paper(mlm_frame, mlm_data, "local"))
    assert page.reference_scores(mlm_frame) is not None
    assert page.drop_map(mlm_frame, mlm_data, "local", plan.label) is not None
    glued = page.minilm_values(local.root)
    assert glued["mlm_direction"] in ("rises", "falls", "moves both ways")
    assert glued["mlm_overlap"] in ("overlap", "do not overlap") and "nan" not in glued.values()
    assert float(glued["mlm_lambda_min"]) <= float(glued["mlm_lambda_max"]) and int(glued["mlm_train_size"]) > 0
    assert set(page.minilm_values(local.root / "nowhere").values()) == {"not measured"}


def test_norm_figures_on_the_committed_analyses(local, capsys):
    from papa_lib.book import norm_papa_figures as aware
    from papa_lib.book import norms_figures as fig
    from papa_lib.book import norms_pages

    tasks, ranking = ["sst2", "mnli"], ["sst2", "mnli"]
    norm_frame, frame = norms_pages.norm_aware_results(local, tasks, ranking, run_missing=False)
    folder = norms_pages.norm_results_folder(local, None)
    assert len(norm_frame) and len(frame)
    tables = norms_pages.read_analyses(folder / "analysis")
    label = fig.analysis_label(tables, "local")
    for chart in (fig.cv_chart, fig.shares_chart, fig.token_heads_chart, fig.observations_chart,
                  fig.frequency_chart, fig.types_chart):
        assert _spec(chart(tables, label)), chart.__name__
    legend = _spec(fig.shares_chart(tables, label))["spec"]["layer"][0]["encoding"]["color"]["legend"]
    assert all(f"\"{text}\"" in legend["labelExpr"] for text in fig.METHOD_LABELS.values())  # no raw method names
    cv, special = fig.cv_values(tables), fig.special_values(tables)
    assert float(cv["cv_min"]) <= float(cv["cv_median"]) <= float(cv["cv_max"])
    assert 0 <= int(cv["cv_excluding_zero"]) <= int(cv["cv_heads"])
    assert special["sp_sink"] in ("[CLS]", "[SEP]", "punctuation") and special["sp_sink_kept"].endswith("%")
    assert special["sp_reduction"] == "no reduction" or special["sp_reduction"].startswith("a factor")
    assert len(fig.special_table(tables)) and len(fig.evidence_table(tables))
    assert len(fig.comparison(tables, local.model_label, "local"))
    assert fig.comparison_verdicts(tables, local.model_label).data.count("Verdict") == 3
    assert aware.missing_runs(norm_frame, frame, tasks, ranking, 2) is not None
    assert _spec(aware.distance_chart(local, norm_frame, folder, "sst2"))
    distance = aware.distance_values(folder, "sst2")
    assert float(distance["dist_median"]) <= float(distance["dist_worst"])
    assert distance["dist_worst_head"].startswith("layer ")
    assert aware.changed_head_chart(local, norm_frame, folder, "sst2") is not None
    assert _spec(aware.matrix_chart(norm_frame, frame, tasks))
    matrix = aware.matrix_values(norm_frame, frame, tasks)
    assert int(matrix["mat_higher"]) + int(matrix["mat_lower"]) + int(matrix["mat_same"]) == int(
        matrix["mat_tasks"].split()[0])
    assert len(aware.matrix_verdicts(norm_frame, frame, tasks))
    assert _spec(aware.order_chart(norm_frame, frame, ranking))
    orders = aware.order_table(norm_frame, frame, ranking)  # the orders by name, not by their identifiers
    assert "λ" in orders.columns and "attention variance − λ" in orders.columns
    assert not orders["best"].str.contains("_|lambda").any()
    order = aware.order_values(norm_frame, frame, ranking)
    assert int(order["ord_comparisons"]) > 0 and " x" in order["ord_wins"] and "nan" not in order.values()
    assert "_" not in order["ord_wins"] and "lambda" not in order["ord_wins"]
    scores = aware.head_scores(local, None, None, folder, ranking, False)
    agreement = aware.agreement_table(scores)
    assert set(agreement["first"]) | set(agreement["second"]) <= set(aware.SHORT_NAMES.values())
    assert "ρ = " in aware.agreement_values(scores)["agr_rho"] and "_" not in aware.agreement_values(scores)["agr_rho"]
    assert aware.agreement_values(None) == {"agr_rho": "not measured"}
    assert aware.rank_chart(scores, norm_frame) is not None


def test_transfer_and_selection_pages_on_the_committed_records(local):
    from papa_lib.book import figures, records, selection_pages, transfer_pages

    tasks = ["cola", "mrpc", "sst2", "ner", "pos"]
    frame = local.results(run_missing=False, blocks=["fig2", "table2"])
    table2 = transfer_pages.table2(frame, tasks)  # a Styler over the table
    cell = table2.data.loc["per-task", "cola"]
    mean, half = cell.split(" ± ")
    assert f"{mean}<br><small>±\u00a0{half}</small>" in table2.to_html()  # the interval under its mean
    assert _spec(transfer_pages.changes_chart(frame, tasks)) and transfer_pages.changes_text(frame, tasks).data
    frame = local.results(run_missing=False, blocks=["fig5"])
    assert selection_pages.lambda_maps(local, frame) is not None and selection_pages.lambda_table(local) is not None
    glued = selection_pages.lambda_values(local)
    assert glued["lam_min"] != "not measured" and float(glued["lam_min"]) <= float(glued["lam_max"])
    assert glued["lam_first"].count("layer ") == 3
    # the λ file as a reader picks it: the task's name and the file's key, not "mnli (C from mnli, …)"
    assert glued["lam_run"].startswith("MNLI (λ file ") and "C from" not in glued["lam_run"]
    others = records.other_local_models(local, frame)
    if others:  # the other committed models' λ files join the menu, each run named with its model
        runs = selection_pages._lambdas(local, others)["run"]
        models = {str(f["model"].iloc[0]) for f in others.values()}
        assert all(run.split(": ")[0] in models | {local.model_label} for run in runs)
        assert {run.split(": ")[0] for run in runs} > {local.model_label}
        table = selection_pages.lambda_table(local, others).data  # one row per model and task
        assert table.index.names == ["model", "task"] and table.index.is_unique
        assert table["λ files"].sum() == runs.nunique()
    lengths = figures.task_lengths(records.grid_or_empty(local), tasks)
    layout = transfer_pages.layout_values(local, tasks, lengths)
    assert "nan" not in layout.values() and set(layout) == set(transfer_pages.layout_values.glue_names)
    if layout["lay_heads"] != "not measured":
        assert 0 <= int(layout["lay_gained"]) <= int(layout["lay_heads"]) and layout["lay_real"].endswith("%")
    assert selection_pages.fig5_missing(frame, records.grid_or_empty(local)) is not None
    assert _spec(selection_pages.fig5(frame))
    assert len(selection_pages.order_ranking(frame).data) and selection_pages.order_text(frame).data


def test_the_book_tool_runs_as_a_module():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "papa_lib.book", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "{sync,check,build,badge,run}" in out.stdout


def test_alternatives_pages_name_matrix_types_from_the_registry(local):
    from papa_lib.book import alternatives_pages as page
    from papa_lib.experiments import matrices

    tasks = ["cola", "mrpc", "sst2", "mnli", "ner", "pos"]
    frame = local.results(run_missing=False, blocks=["fig2", "table1"])
    table = page.table1(frame, tasks)
    shown = list((table.data if hasattr(table, "data") else table).index)
    assert shown == [matrices.matrix_label(m) for m in matrices.table_order() if matrices.matrix_label(m) in shown]
    assert shown[0] == "Original (input-dependent)" and "Average (PAPA)" in shown
    assert _spec(page.table1_chart(frame, tasks))
    verdicts = page.verdicts(frame, tasks)
    assert set(verdicts["best data-free"].dropna()) <= {matrices.matrix_label(m) for m in matrices.data_free_types()}
    assert list(verdicts.columns) == ["best data-free", "average − best data-free [95% interval]", "verdict",
                                      "enters C4"]  # four columns: the table fits the page column
    from papa_lib.book import claims

    margin = claims.data_free_margins(frame).set_index("task").loc["cola"]
    cell = verdicts.loc[(local.model_label, "cola"), "average − best data-free [95% interval]"]
    assert cell == f"{margin['average minus best data-free']:+.3f} [{margin.ci_low:.3f}, {margin.ci_high:.3f}]"
    assert page.verdict_text(frame, tasks).data
    premise = page.premise_use(frame, local.results_dir)
    glued = page.premise_use_values(premise)
    assert len(premise) and glued["pu_gap"].startswith(("+", "-")) and glued["pu_kinds"] != "not measured"
    shown = page.premise_table(premise)
    assert list(shown.columns) == ["seeds", "accuracy, mean ± 95% half-width"]
    assert shown.loc["pair: original"].iloc[1] == glued["pu_pair"] and shown.loc["majority class", "seeds"] == "—"


def test_head_weights_draws_one_row_per_kind_with_no_empty_panel(local):
    """Five panels in a 3-column grid left a sixth cell with a stray axis: the data-free heads now form one row and
    the stored average heads another, each as wide as its panels."""
    from papa_lib.book import alternatives_pages as page
    from papa_lib.book import figures, records

    tasks = ["sst2"]
    spec = records.grid_or_empty(local)
    chart = _spec(page.head_weights(local, local.results(run_missing=False, blocks=["fig2"]), tasks,
                                    figures.task_lengths(spec, tasks)))
    rows = chart["vconcat"]
    assert [row["columns"] for row in rows] == [3, 2]
    for row in rows:
        shown = set(pd.DataFrame(chart["datasets"][row["data"]["name"]])["matrix"])
        assert len(shown) == row["columns"]
