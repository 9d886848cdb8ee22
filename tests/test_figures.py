"""Tests for papa_lib.book.figures: results table -> the paper's figures and tables (Fig. 2-3, Tables 1-2, Sec. 4.2).

Every expectation below is computed by hand from the constructed rows (two seeds -> Student-t interval with
t_{0.975, 1} = 12.7062).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from papa_lib.book import figures, grid_views
from papa_lib.experiments.grid import GridBlock
from papa_lib.experiments.matrices import MATRIX_TYPES
from papa_lib.experiments.results import ResultsStore
from papa_lib.ops import costs

T1 = 12.706204736174698  # Student t, 97.5% quantile, 1 degree of freedom


def row(task, matrix_type, fraction, seed, value, order=None, matrices_from="own", model="m", metric=None, **extra):
    """One canonical results row (fraction 1 -> original; fraction 0 -> order none)."""
    if order is None:
        order = "none" if fraction in (0, 1) else "lambda"
    if matrices_from == "own":
        matrices_from = task if matrix_type in MATRIX_TYPES and MATRIX_TYPES[matrix_type].from_text else None
    return {
        "run_id": f"{model}-{task}-{matrix_type}-{order}-{fraction}-{matrices_from}-{seed}",
        "model": model,
        "task": task,
        "matrix_type": matrix_type,
        "matrices_from": matrices_from,
        "selection_order": order,
        "fraction": float(fraction),
        "seed": seed,
        "metric": metric or ("matthews_corrcoef" if task == "cola" else "accuracy"),
        "value": float(value),
        **extra,
    }


def example_frame() -> pd.DataFrame:
    rows = [
        # SST-2: original 0.85, half 0.85 (drop 0), all-constant 0.76 (drop 0.09/0.85)
        row("sst2", "original", 1, 0, 0.80),
        row("sst2", "original", 1, 1, 0.90),
        row("sst2", "average", 0.5, 0, 0.84),
        row("sst2", "average", 0.5, 1, 0.86),
        row("sst2", "average", 0.125, 0, 0.80),
        row("sst2", "average", 0, 0, 0.75),
        row("sst2", "average", 0, 1, 0.77),
        # rows the Fig. 2 curve must ignore
        row("sst2", "average", 0.5, 0, 0.10, order="first_to_last"),
        row("sst2", "average", 0, 0, 0.50, matrices_from="mnli"),
        row("sst2", "average", 0, 1, 0.52, matrices_from="mnli"),
        row("sst2", "identity", 0, 0, 0.70),
        row("sst2", "toeplitz", 0, 0, 0.72),
        row("sst2", "toeplitz", 0, 1, 0.74),
        row("sst2", "trainable_average", 0, 0, 0.78),
        # CoLA: original 0.40, half 0.42 (drop -0.05), all-constant 0.32 (drop 0.2)
        row("cola", "original", 1, 0, 0.40),
        row("cola", "original", 1, 1, 0.40),
        row("cola", "average", 0.5, 0, 0.42),
        row("cola", "average", 0.5, 1, 0.42),
        row("cola", "average", 0, 0, 0.30),
        row("cola", "average", 0, 1, 0.34),
        row("cola", "zeros", 0, 0, 0.35),
        # NER: original score 0 -> relative drop undefined
        row("ner", "original", 1, 0, 0.0, metric="seqeval_f1"),
        row("ner", "average", 0, 0, 0.0, metric="seqeval_f1"),
        # POS: only the all-constant rows (no original yet: a partial table)
        row("pos", "average", 0, 0, 0.9),
    ]
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------------------------


def test_fraction_label():
    assert [figures.fraction_label(f) for f in (1, 0.5, 0.125, 0.0625, 0)] == ["1", "1/2", "1/8", "1/16", "0"]
    with pytest.raises(ValueError, match="fraction"):
        figures.fraction_label(1.5)


def test_format_mean_ci():
    assert figures.format_mean_ci(0.85, 0.80, 0.90, 2) == "0.85 ± 0.05"
    assert figures.format_mean_ci(0.7, 0.7, 0.7, 1) == "0.70"
    assert figures.format_mean_ci(float("nan"), float("nan"), float("nan"), 0) == "—"


def test_fraction_curves_selects_the_curve_rows():
    curves = figures.fraction_curves(example_frame(), tasks=["sst2"])
    assert list(curves["fraction"]) == [1.0, 0.5, 0.125, 0.0]
    assert list(curves["fraction_label"]) == ["1", "1/2", "1/8", "0"]
    assert curves["mean"].tolist() == pytest.approx(
        [0.85, 0.85, 0.80, 0.76]
    )  # not 0.10 (first_to_last) nor 0.51 (mnli)
    assert curves["n"].tolist() == [2, 2, 1, 2]
    original = curves.iloc[0]
    half_width = T1 * np.std([0.8, 0.9], ddof=1) / math.sqrt(2)
    assert (original.ci_low, original.ci_high) == pytest.approx((0.85 - half_width, 0.85 + half_width))
    assert curves["relative_drop"].tolist() == pytest.approx([0.0, 0.0, 0.05 / 0.85, 0.09 / 0.85])


def test_fraction_curves_other_order_other_source_and_partial_tasks():
    frame = example_frame()
    other = figures.fraction_curves(frame, tasks=["sst2"], order="first_to_last")
    assert other["mean"].tolist() == pytest.approx([0.85, 0.10, 0.76])
    mnli = figures.fraction_curves(frame, tasks=["sst2"], matrices_from="mnli")
    assert mnli["mean"].tolist() == pytest.approx([0.85, 0.51])
    curves = figures.fraction_curves(frame)  # every task; ner has an undefined drop, pos has no original
    assert list(dict.fromkeys(curves["task"])) == ["cola", "sst2", "ner", "pos"]  # the paper's column order
    assert curves[curves.task == "ner"]["relative_drop"].isna().all()
    assert curves[curves.task == "pos"]["relative_drop"].isna().all()
    assert figures.fraction_curves(frame, tasks=["mrpc"]).empty
    with pytest.raises(ValueError, match="unknown task"):
        figures.fraction_curves(frame, tasks=["sst-2"])
    with pytest.raises(ValueError, match="lacks column"):
        figures.fraction_curves(frame.drop(columns="selection_order"))


def test_all_constant_drop_headline_numbers():
    summary = figures.all_constant_drop(example_frame())
    per = summary.per_task.set_index("task")
    assert list(per.index) == ["cola", "sst2"]
    assert per.loc["sst2", "original"] == pytest.approx(0.85)
    assert per.loc["sst2", "replaced"] == pytest.approx(0.76)
    assert per.loc["sst2", "relative_drop"] == pytest.approx(0.09 / 0.85)
    assert per.loc["cola", "relative_drop"] == pytest.approx(0.2)
    assert per.loc["cola", "n_original"] == 2 and per.loc["cola", "n_replaced"] == 2
    assert summary.mean == pytest.approx((0.09 / 0.85 + 0.2) / 2)
    assert summary.max == pytest.approx(0.2)
    assert summary.worst == "cola"
    assert summary.count == 2
    assert any(note.startswith("m/ner") and "undefined" in note for note in summary.missing)
    assert any(note.startswith("m/pos") and "no original" in note for note in summary.missing)


def test_all_constant_drop_of_an_empty_frame():
    empty = figures.all_constant_drop(example_frame().iloc[0:0])
    assert empty.per_task.empty and math.isnan(empty.mean) and empty.worst is None


def test_per_model_points_for_fig3():
    frame = pd.concat([example_frame(), example_frame().assign(model="big", value=lambda f: f.value * 0.5)])
    summary = figures.all_constant_drop(frame)
    assert summary.count == 4 and summary.worst in ("big/cola", "m/cola")
    per_model = summary.per_model().set_index("model")
    assert per_model.loc["m", "original"] == pytest.approx((0.85 + 0.40) / 2)
    assert per_model.loc["big", "original"] == pytest.approx((0.85 + 0.40) / 4)
    assert per_model.loc["m", "relative_drop"] == pytest.approx((0.09 / 0.85 + 0.2) / 2)
    assert per_model.loc["m", "tasks"] == 2


def test_matrix_type_summary():
    frame = example_frame()
    summary = figures.matrix_type_summary(frame, tasks=["sst2", "cola"])
    sst2 = summary[summary.task == "sst2"].set_index("matrix_type")
    assert list(sst2.index) == ["original", "identity", "toeplitz", "trainable_average", "average"]
    assert sst2.loc["average", "mean"] == pytest.approx(0.76)  # own text only, not the mnli-built 0.51
    assert sst2.loc["toeplitz", "mean"] == pytest.approx(0.73)
    assert sst2.loc["identity", "construction"] == "data-free"


def test_average_vs_data_free():
    summary = figures.matrix_type_summary(example_frame())
    verdict = figures.average_vs_data_free(summary).set_index("task")
    assert verdict.loc["sst2", "best_data_free"] == "toeplitz"
    assert verdict.loc["sst2", "margin"] == pytest.approx(0.03)
    assert verdict.loc["sst2", "beats"] is True and verdict.loc["sst2", "data_free_types"] == 2
    assert verdict.loc["cola", "best_data_free"] == "zeros" and verdict.loc["cola", "beats"] is False
    assert verdict.loc["pos", "beats"] is None  # no data-free row measured
    assert verdict.loc["sst2", "minus_trainable_average"] == pytest.approx(0.76 - 0.78)
    assert math.isnan(verdict.loc["sst2", "minus_trainable_toeplitz"])


def test_transfer_summary_and_differences():
    frame = example_frame()
    summary = figures.transfer_summary(frame)
    assert set(summary.matrices_from) == {"per-task", "mnli"}
    diff = figures.transfer_differences(frame).set_index("task")
    assert diff.loc["sst2", "difference"] == pytest.approx(0.51 - 0.76)
    assert diff.loc["sst2", "per_task_ci_half_width"] == pytest.approx(T1 * np.std([0.75, 0.77], ddof=1) / math.sqrt(2))
    assert math.isnan(diff.loc["cola", "mnli"])
    assert diff.loc["sst2", "within_ci"] is False  # |0.51 - 0.76| > 0.127
    assert diff.loc["cola", "within_ci"] is None


def test_grid_coverage_counts_done_and_missing():
    spec = {"seeds": [0, 1], "blocks": [
        GridBlock(name="fig2", tasks=["sst2", "cola"], fractions=[1, 0.5, 0]),
        {"name": "table2", "tasks": ["sst2"], "matrix_types": ["average"], "matrices_from": "mnli", "fractions": [0]},
    ]}
    coverage = grid_views.grid_coverage(example_frame(), spec).set_index(["block", "task"])
    assert coverage.loc[("fig2", "sst2"), "expected"] == 6 and coverage.loc[("fig2", "sst2"), "done"] == 6
    assert coverage.loc[("fig2", "cola"), "done"] == 6
    assert coverage.loc[("table2", "sst2"), "done"] == 2 and coverage.loc[("table2", "sst2"), "missing"] == 0
    only = grid_views.grid_coverage(example_frame().iloc[0:3], spec, blocks=["fig2"])
    assert set(only.block) == {"fig2"} and only.set_index("task").loc["sst2", "done"] == 3
    assert grid_views.grid_coverage(example_frame(), spec, model="other")["done"].sum() == 0


def test_declared_runs_count_a_run_once_however_many_blocks_and_files_declare_it():
    spec = {"seeds": [0, 1], "blocks": [
        GridBlock(name="fig2", tasks=["sst2", "cola"], fractions=[1, 0.5, 0]),
        GridBlock(name="table1", tasks=["sst2"], matrix_types=["average", "identity"], fractions=[1, 0]),
    ]}
    runs = grid_views.declared_runs(example_frame(), spec)
    # fig2: 2 tasks x 3 variants x 2 seeds; table1 adds only SST-2's identity runs (its original and average at 0
    # are fig2's), so grid_coverage's per-block sum (12 + 6) counts 4 runs twice
    assert len(runs) == 14 and set(runs[runs.block == "table1"].matrix_type) == {"identity"}
    assert grid_views.grid_coverage(example_frame(), spec)["expected"].sum() == 18
    assert runs.done.sum() == 13  # sst2 identity seed 1 is not in the table
    more_seeds = grid_views.declared_runs(example_frame(), {**spec, "seeds": [0, 1, 2]})
    union = pd.concat([runs, more_seeds]).drop_duplicates(list(grid_views.RUN_KEY))
    assert len(union) == 21 and union.done.sum() == 13
    assert grid_views.declared_runs(None, spec).done.sum() == 0
    assert grid_views.declared_runs(pd.DataFrame(), spec).done.sum() == 0


def test_lm_declared_runs_matches_records_by_configuration():
    from papa_lib.experiments import lm

    section = {"corpus": "wikitext-2", "length": 64, "orders": ["lambda", "random"], "random_seeds": [0, 1],
               "fractions": [1, 0.5, 0], "alternatives": ["zeros"]}
    declared = grid_views.lm_declared_runs([], section)
    settings = lm.LMSettings.from_mapping(section)
    assert len(declared) == len(lm.lm_runs(settings)) and not declared.done.any()
    assert set(declared.block) == {"language_model"} and set(declared.task) == {"wikitext-2"}
    record = {"corpus": "wikitext-2 test", "length": 64, "matrix_type": "average", "order": "random",
              "fraction": 0.5, "seed": 1, "model": "m"}
    found = grid_views.lm_declared_runs([record, {**record, "length": 128}], section)
    assert found.done.sum() == 1
    assert grid_views.lm_declared_runs([record], section, model="other").done.sum() == 0
    assert grid_views.lm_declared_runs([], None).empty


def test_frame_from_a_results_store(tmp_path):
    store = ResultsStore(tmp_path)
    base = {"eval_size": 10, "train_size": 100, "config_hash": "x", "profile": "smoke", "data_source": "generated",
            "versions": "{}", "device": "cpu", "wall_time_s": 1.0}
    for record in example_frame().to_dict(orient="records"):
        matrices_from = record["matrices_from"]
        record["matrices_from"] = (
            None
            if matrices_from is None or (isinstance(matrices_from, float) and math.isnan(matrices_from))
            else matrices_from
        )
        store.append({**base, **record})
    summary = figures.all_constant_drop(store.frame())
    assert summary.mean == pytest.approx((0.09 / 0.85 + 0.2) / 2)
    assert figures.fraction_curves(store.frame(), tasks=["sst2"])["mean"].tolist() == pytest.approx(
        [0.85, 0.85, 0.80, 0.76]
    )


def _constants(tmp_path=None):
    import torch

    from papa_lib.core.averaging import ConstantAttention

    matrices = torch.zeros(1, 2, 4, 4)
    matrices[0, 0, :, 2] = 0.5  # head 0 puts half of every row on key 2
    matrices[0, 1, :, 3] = 1.0  # head 1 puts everything on key 3
    matrices[0, 0, 3, 2] = 0.9  # ... except in a row never seen (ignored)
    counts = torch.tensor([[10, 10, 4, 0], [10, 10, 4, 0], [4, 4, 4, 0], [0, 0, 0, 0]])
    return ConstantAttention(matrices, counts, {"num_examples": 10, "model": "m"})


def test_column_mass_self_mass_and_stored_matrices(tmp_path):
    from papa_lib.analysis import patterns

    constants = _constants()
    mass = patterns.column_mass(constants, 2)
    assert mass.values.tolist() == [[0, 0, 0.5], [0, 1, 0.0]]
    assert patterns.column_mass(constants, 3)["mass"].tolist() == [0.0, 1.0]
    assert patterns.self_mass(constants)["mass"].tolist() == pytest.approx([0.5 / 3, 0.0])  # rows 0-2: 0, 0, 0.5
    with pytest.raises(ValueError, match="outside"):
        patterns.column_mass(constants, 4)
    assert grid_views.stored_matrices(tmp_path, "mnli", 4) is None
    constants.save(tmp_path / "matrices" / "mnli-L4-abc.safetensors")
    loaded = grid_views.stored_matrices(tmp_path, "mnli", 4)
    assert loaded is not None and loaded.metadata["model"] == "m"
    assert grid_views.stored_matrices(tmp_path, "mnli", 4, model="other") is None
    assert grid_views.stored_matrices(tmp_path, "mnli", 8) is None


def test_task_lengths():
    assert grid_views.task_lengths({"max_length": {"default": 64, "mnli": 128}}, ["sst2", "mnli"]) == {
        "sst2": 64,
        "mnli": 128,
    }
    assert grid_views.task_lengths({"max_length": 32}, ["ner"]) == {"ner": 32}
    assert grid_views.task_lengths({}, ["mnli", "mrpc", "pos"]) == {"mnli": 256, "mrpc": 128, "pos": 128}  # Table 3
    with pytest.raises(ValueError, match="unknown task"):
        grid_views.task_lengths({}, ["qqp"])


def test_per_task_setting_and_grid_plan():
    spec = {
        "seeds": [0, 1, 2],
        "inloop_epochs": {"default": 3, "cola": 5},
        "blocks": [
            GridBlock(name="fig2", tasks=["sst2"], fractions=[1, 0.5, 0]),
            GridBlock(
                name="table1",
                tasks=["sst2"],
                matrix_types=["average", "identity", "trainable_average"],
                fractions=[1, 0],
            ),
        ],
    }
    assert grid_views.per_task_setting(spec, "inloop_epochs", ["sst2", "cola"]) == {"sst2": 3, "cola": 5}
    assert grid_views.per_task_setting(spec, "epochs", ["sst2"], {"sst2": 4}) == {"sst2": 4}
    plan = costs.grid_plan(spec).set_index(["block", "task", "kind"])["runs"].to_dict()
    # fig2: original, average 1/2, average 0 -> 3 variants; table1 adds identity 0 (frozen) and trainable_average 0
    assert plan == {("fig2", "sst2", "frozen"): 9, ("table1", "sst2", "frozen"): 3, ("table1", "sst2", "in-loop"): 3}
    assert costs.grid_plan(spec, blocks=["table1"])["runs"].sum() == 3 * 4  # original + 3 types at fraction 0
    with pytest.raises(ValueError, match="blocks"):
        costs.grid_plan({"seeds": 1})


def test_feature_cache_bytes():
    assert costs.feature_cache_bytes("sentence", 10, 2, 4, length=8) == 10 * 3 * 8 * 4 * 2
    assert costs.feature_cache_bytes("token", 10, 2, 4) == 10 * 3 * 4 * 2
    # the store keeps real tokens only: 2.5 of the 8 positions on average
    assert costs.feature_cache_bytes("sentence", 10, 2, 4, length=8, tokens_per_example=2.5) == 10 * 3 * 2.5 * 4 * 2
    with pytest.raises(ValueError, match="length"):
        costs.feature_cache_bytes("sentence", 10, 2, 4)
    with pytest.raises(ValueError, match="kind"):
        costs.feature_cache_bytes("pair", 10, 2, 4, 8)


def test_encoder_cost_ratio():
    assert costs.encoder_cost_ratio(costs.MODEL_SHAPES["roberta-base"]) == pytest.approx(8.0)
    assert costs.encoder_cost_ratio(costs.MODEL_SHAPES["roberta-large"]) == pytest.approx(301989888 / 10616832)
    with pytest.raises(ValueError, match="layers, hidden"):
        costs.encoder_cost_ratio((12, 768))


def test_run_costs_and_estimate_compute():
    frame = pd.DataFrame([
        row("sst2", "original", 1, 0, 0.8, wall_time_s=100.0, train_size=1000),
        row("sst2", "average", 0, 0, 0.7, wall_time_s=300.0, train_size=1000),
        row("sst2", "trainable_average", 0, 0, 0.7, wall_time_s=640.0, train_size=1000),
        row("cola", "original", 1, 0, 0.4, wall_time_s=float("nan"), train_size=1000),  # unfinished timing: ignored
    ])
    measured = costs.run_costs(frame, {"default": 64})
    frozen = measured.set_index(["task", "kind"]).loc[("sst2", "frozen")]
    assert frozen["runs"] == 2 and frozen["wall_hours"] == pytest.approx(400 / 3600)
    assert frozen["seconds_per_token"] == pytest.approx(200 / 64000)
    plan = pd.DataFrame({"task": ["sst2", "mnli", "sst2"], "kind": ["frozen", "frozen", "in-loop"], "runs": [3, 2, 1]})
    estimate = costs.estimate_compute(measured, plan, {"sst2": 64, "mnli": 256}, {"sst2": 2000, "mnli": 1000},
                                        cost_ratio=8, speedup=4, epoch_factor={"sst2": 2})
    assert estimate["hours"].tolist() == pytest.approx([2400 / 3600, 3200 / 3600, 5120 / 3600])
    assert estimate["source"].tolist() == ["measured", "mean of measured frozen runs", "measured"]
    with pytest.raises(ValueError, match="no measured run costs"):
        costs.estimate_compute(measured.iloc[0:0], plan, {"sst2": 64}, {"sst2": 1})
    with pytest.raises(ValueError, match="no sequence length"):
        costs.run_costs(frame, {"cola": 64})


def test_the_causal_picture_is_written_again_only_when_it_changed(tmp_path):
    """A rerun of the decoder chapter whose float rounding differs leaves the committed copy of its picture as it
    is; a picture that changed is written, and what is read back is what was written."""
    import types

    import torch

    torch.manual_seed(0)
    matrices = torch.softmax(torch.randn(2, 3, 8, 8), dim=-1).tril()
    matrices = matrices / matrices.sum(-1, keepdim=True)
    config = types.SimpleNamespace(layer_types=["sliding_attention", "full_attention"], sliding_window=4)
    picture = figures.causal_picture(matrices, config, windows=5)
    path = tmp_path / "shown" / "picture.safetensors"
    assert figures.save_causal_picture(picture, path) is True
    read = figures.load_causal_picture(path)
    assert read["kinds"] == ["local", "global"] and read["windows"] == 5
    assert torch.equal(read["pooled"], picture["pooled"].float())
    jitter = dict(picture, pooled=picture["pooled"] + 1e-6)
    before = path.read_bytes()
    assert figures.save_causal_picture(jitter, path) is False and path.read_bytes() == before
    changed = dict(picture, pooled=picture["pooled"] + 1e-2)
    assert figures.save_causal_picture(changed, path) is True and path.read_bytes() != before
    assert figures.save_causal_picture(dict(changed, windows=6), path) is True  # the metadata count too
