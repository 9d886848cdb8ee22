"""papa_lib.analysis.patterns: input-dependence, Sec. 5.1 pattern statistics, λ tables, Fig. 5 order curves, packed heat
maps."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
import torch

import papa_lib
from conftest import random_batch
from papa_lib.analysis import patterns
from papa_lib.book import charts
from papa_lib.experiments import selection
from papa_lib.experiments.workspace import read_lambdas, write_lambdas
from papa_lib.smoke import tiny_model


@pytest.fixture(scope="module")
def tiny_run():
    """A tiny random BERT, a padded PAPA-layout batch and its attention ``[N, layers, heads, L, L]``."""
    torch.manual_seed(0)
    model = tiny_model("bert")
    batch = random_batch(4, 12)
    with torch.no_grad():
        attentions = torch.stack(model(**batch, output_attentions=True).attentions, 1)
    return model, batch, attentions


# ---------------------------------------------------------------------------------------------- input-dependence


def test_pad_aware_mean_equals_average_attention(tiny_run):
    model, batch, attentions = tiny_run
    mean, counts = patterns.pad_aware_mean(attentions, batch["attention_mask"])
    streamed = papa_lib.average_attention(model, [batch], progress=False)
    assert torch.allclose(mean.float(), streamed.matrices, atol=1e-6)
    assert torch.equal(counts, streamed.counts)


def test_restrict_to_input_is_what_the_override_uses(tiny_run):
    model, batch, _ = tiny_run
    constants = papa_lib.average_attention(model, [batch], progress=False)
    with torch.no_grad(), papa_lib.override(model, constants):
        used = torch.stack(model(**batch, output_attentions=True).attentions, 1)
    restricted = patterns.restrict_to_input(constants.matrices, batch["attention_mask"])
    assert restricted.shape == used.shape
    assert torch.allclose(restricted.float(), used, atol=1e-6)
    real = batch["attention_mask"].bool()
    sums = restricted.sum(-1)  # [N, layers, heads, L]
    assert torch.allclose(sums[real[:, None, None, :].expand_as(sums)], torch.ones(()).double())
    assert (sums[~real[:, None, None, :].expand_as(sums)] == 0).all()


def test_restrict_to_input_falls_back_to_uniform_rows():
    constant = torch.zeros(1, 4, 4)
    constant[0, 0, 0] = 1.0  # row 0 has mass, rows 1-3 none
    restricted = patterns.restrict_to_input(constant, torch.tensor([[1, 1, 0, 1]]))
    assert torch.allclose(restricted[0, 0, 0], torch.tensor([1.0, 0, 0, 0]).double())
    assert torch.allclose(restricted[0, 0, 1], torch.tensor([1 / 3, 1 / 3, 0, 1 / 3]).double())
    assert (restricted[0, 0, 2] == 0).all()  # padded query row


def test_input_distance_is_zero_for_a_head_that_ignores_its_input(tiny_run):
    _, batch, attentions = tiny_run
    same = attentions[:1].expand(3, *attentions.shape[1:])
    mask = batch["attention_mask"][:1].expand(3, -1)
    assert torch.allclose(patterns.input_variability(same, mask), torch.zeros(()).double(), atol=1e-7)
    # a real model on different inputs does vary, and a per-layer tensor gives per-head values
    variability = patterns.input_variability(attentions, batch["attention_mask"])
    assert variability.shape == attentions.shape[1:3] and (variability > 0).all() and (variability <= 1).all()
    per_layer = patterns.input_variability(attentions[:, 1], batch["attention_mask"])
    assert torch.allclose(per_layer, variability[1])


def test_input_distance_by_hand():
    # two inputs, one head, L = 3, all tokens real; input 0 attends to key 0, input 1 to key 1 (one-hot rows)
    a = torch.zeros(2, 1, 3, 3)
    a[0, 0, :, 0] = 1.0
    a[1, 0, :, 1] = 1.0
    mask = torch.ones(2, 3)
    # the average row is (0.5, 0.5, 0): each input is half a row away from it
    assert torch.allclose(patterns.input_distance(a, mask), torch.full((2, 1), 0.5).double())
    # against the other input's matrix the rows are disjoint: distance 1
    reference = a.flip(0)
    assert torch.allclose(patterns.input_distance(a, mask, reference=reference), torch.ones(2, 1).double())
    # padded query rows do not count: make row 2 of input 0 padding and give it garbage
    a[0, 0, 2] = torch.tensor([0.0, 0.0, 1.0])
    mask[0, 2] = 0
    a[0, 0, :2, 2] = 0.0
    distance = patterns.input_distance(a, mask, reference=reference)
    assert distance[0, 0] == pytest.approx(1.0)


def test_input_distance_rejects_bad_shapes():
    with pytest.raises(ValueError, match="masks must have shape"):
        patterns.input_variability(torch.rand(2, 1, 3, 3), torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"\[N, \.\.\., L, L\]"):
        patterns.input_variability(torch.rand(2, 3, 4), torch.ones(2, 4))
    with pytest.raises(ValueError, match="no real token"):
        patterns.input_variability(torch.rand(2, 1, 3, 3), torch.tensor([[1, 1, 1], [0, 0, 0]]))
    with pytest.raises(ValueError, match="reference has shape"):
        patterns.input_variability(torch.rand(2, 1, 3, 3), torch.ones(2, 3), reference=torch.rand(2, 3, 3))


# ---------------------------------------------------------------------------------------------- Sec. 5.1 patterns


def _counts(length: int, lengths: list[int]) -> torch.Tensor:
    """Counts of a PAPA-layout corpus of single texts: [CLS] + words at [0, n-1), the final [SEP] at L-1."""
    mask = torch.zeros(len(lengths), length)
    for row, n in enumerate(lengths):
        mask[row, : n - 1] = 1
        mask[row, -1] = 1
    return torch.einsum("bq,bk->qk", mask, mask).long()


def test_pattern_statistics_on_known_matrices():
    length = 10
    counts = _counts(length, [6, 8, 10])
    toeplitz = papa_lib.toeplitz_matrix(length).double()
    uniform = torch.ones(length, length)
    cls_heavy = torch.full((length, length), 0.02)
    cls_heavy[:, 0] = 0.6
    cls_heavy[:, -1] = 0.2
    shifted = torch.zeros(length, length)  # attends to the token 3 to the left: not diagonal
    for q in range(length):
        shifted[q, max(q - 3, 1)] = 1.0
    matrices = torch.stack([toeplitz, uniform, cls_heavy, shifted])[None]  # 1 layer x 4 heads
    summary = patterns.pattern_summary(matrices, counts)
    assert list(summary["head"]) == [0, 1, 2, 3]
    assert summary["diagonal"].tolist() == [True, False, False, False]
    assert summary["cls_sep"].tolist() == [False, False, True, False]
    assert summary.loc[0, "diagonal_rows"] == pytest.approx(1.0)
    # the uniform head's band mass is 3 keys out of the (row-normalised) whole row
    assert 0.2 < summary.loc[1, "diagonal_mass"] < 0.4
    assert summary.loc[2, "special_mass"] == pytest.approx(0.8 / (0.8 + 8 * 0.02))
    # a ConstantAttention works as well as (matrices, counts)
    constant = papa_lib.ConstantAttention(matrices.float(), counts)
    assert patterns.pattern_summary(constant).equals(summary)


def test_rows_weighted_by_how_often_the_query_is_real():
    length = 6
    counts = _counts(length, [3, 3, 3, 6])  # rows 1: 4 inputs, rows 2-4: only the long input
    matrix = papa_lib.toeplitz_matrix(length).double()
    matrix[2:5] = 0.0
    matrix[2:5, 1] = 1.0  # rows 2-4 attend to position 1 (row 2 is still in its band, rows 3 and 4 are not)
    rows, _ = patterns.diagonal_stats(matrix[None, None], counts)
    weights = torch.tensor([4.0, 1.0, 1.0, 1.0])  # word rows 1..4
    assert rows.item() == pytest.approx(float((weights * torch.tensor([1.0, 1.0, 0.0, 0.0])).sum() / weights.sum()))


def test_pattern_input_errors():
    counts = _counts(6, [6])
    with pytest.raises(ValueError, match="counts must have shape"):
        patterns.special_mass(torch.rand(1, 1, 6, 6), torch.ones(5, 5))
    with pytest.raises(ValueError, match="outside a matrix"):
        patterns.special_mass(torch.rand(1, 1, 6, 6), counts, special_positions=[9])
    with pytest.raises(ValueError, match="ConstantAttention"):
        patterns.pattern_summary(torch.rand(1, 1, 6, 6))
    with pytest.raises(ValueError, match="width"):
        patterns.diagonal_stats(torch.rand(1, 1, 6, 6), counts, width=-1)


def test_pattern_shares_sensitivity_table():
    summary = pd.DataFrame(
        {
            "diagonal_rows": [0.9, 0.55, 0.2, 0.65],
            "diagonal_mass": [0.5, 0.15, 0.05, 0.3],
            "special_mass": [0.1, 0.7, 0.45, 0.2],
        }
    )
    shares = patterns.pattern_shares(
        summary, diagonal_thresholds=(0.5, 0.6), mass_thresholds=(0.2,), special_thresholds=(0.4, 0.5)
    )
    lookup = {(r.criterion[:8], r.threshold): r.share for r in shares.itertuples()}
    assert lookup[("favourit", 0.5)] == 0.75 and lookup[("favourit", 0.6)] == 0.5
    assert lookup[("band |q-", 0.2)] == 0.5
    assert lookup[("mass on ", 0.4)] == 0.5 and lookup[("mass on ", 0.5)] == 0.25
    defaults = shares[shares["default"]]
    assert sorted(defaults["threshold"]) == [0.5, 0.5] and set(defaults["pattern"]) == {"diagonal", "[CLS]/[SEP]"}
    with pytest.raises(ValueError, match="missing columns"):
        patterns.pattern_shares(pd.DataFrame({"x": [1]}))


# ---------------------------------------------------------------------------------------------- λ and orders


def test_lambda_frame_ranks_the_heads_of_a_lambda_file(tmp_path):
    lambdas = torch.tensor([[0.1, 0.9, 0.5, 0.3], [0.7, 0.2, 0.8, 0.6]])
    path = tmp_path / "mnli-from-mnli-0123abcd.safetensors"
    write_lambdas(path, lambdas)
    records = [{"task": "mnli", "matrices_from": "mnli", "key": "0123abcd", "path": path,
                "lambdas": read_lambdas(path)},
               {"task": "sst2", "matrices_from": "mnli", "key": "89ef", "path": tmp_path / "sst2-from-mnli-89ef",
                "lambdas": lambdas.flip(0)}]
    frame = patterns.lambda_frame(records)
    assert list(frame["file"].unique()) == ["mnli-from-mnli-0123abcd.safetensors", "sst2-from-mnli-89ef"]
    mnli = frame[frame["task"] == "mnli"].set_index(["layer", "head"])
    order = selection.replacement_order("lambda", 2, 4, lambdas=lambdas)
    assert [mnli.loc[pair, "rank"] for pair in order] == list(range(8))
    assert mnli.loc[(0, 0), "lambda"] == pytest.approx(0.1)
    # 8 heads: 1/2 keeps the 4 largest λ, 1/8 and 1/16 (0.5 rounds up to 1) keep the largest only
    assert mnli.loc[(0, 1), "kept_until"] == 0.0625  # λ = 0.9
    assert mnli.loc[(1, 2), "kept_until"] == 0.5  # λ = 0.8
    assert mnli.loc[(0, 0), "kept_until"] == 1.0  # λ = 0.1, replaced first
    assert (mnli["kept_until"] == 0.5).sum() == 3


def _results_frame() -> pd.DataFrame:
    rows = []
    for seed in (0, 1):
        rows.append(("mnli", "original", None, "none", 1.0, seed, 0.70))
        rows.append(("mnli", "average", "mnli", "none", 0.0, seed, 0.50))
        rows.append(("mnli", "identity", None, "none", 0.0, seed, 0.30))  # table 1: not a Fig. 5 row
        rows.append(("sst2", "average", "sst2", "lambda", 0.5, seed, 0.99))  # another task
        for order, base in (("lambda", 0.68), ("reversed", 0.55), ("random", 0.6), ("first_to_last", 0.62)):
            for fraction, drop in ((0.5, 0.0), (0.125, 0.05), (0.0625, 0.07)):
                rows.append(("mnli", "average", "mnli", order, fraction, seed, base - drop + 0.001 * seed))
    columns = ["task", "matrix_type", "matrices_from", "selection_order", "fraction", "seed", "value"]
    frame = pd.DataFrame(rows, columns=columns)
    frame["metric"] = "accuracy"
    return frame


def test_order_curves_share_the_endpoints():
    curves = patterns.order_curves(
        _results_frame(), orders=("lambda", "reversed", "random", "first_to_last", "last_to_first")
    )
    lam = curves[curves["selection_order"] == "lambda"]
    assert sorted(lam["fraction"].unique()) == [0.0, 0.0625, 0.125, 0.5, 1.0]
    assert len(lam) == 10 and lam[lam["fraction"] == 0.0]["value"].tolist() == [0.5, 0.5]
    # an order without runs still gets the two shared endpoints
    last = curves[curves["selection_order"] == "last_to_first"]
    assert sorted(last["fraction"]) == [0.0, 0.0, 1.0, 1.0]
    assert 0.3 not in curves["value"].tolist() and 0.99 not in curves["value"].tolist()
    with pytest.raises(ValueError, match="lacks columns"):
        patterns.order_curves(pd.DataFrame({"task": ["mnli"]}))


def test_compare_orders_ranks_each_fraction():
    from papa_lib.experiments.summaries import summarize

    curves = patterns.order_curves(_results_frame(), orders=("lambda", "reversed", "random", "first_to_last"))
    table = patterns.compare_orders(summarize(curves, ["selection_order", "fraction"]))
    assert table["fraction"].tolist() == [0.5, 0.125, 0.0625, "mean"]
    assert table["best"].eq("lambda").all() and table["worst"].eq("reversed").all()
    assert table["lambda_best"].all() and table["reversed_worst"].all()
    assert table["lambda_rank"].eq(1).all() and table["reversed_rank"].eq(4).all() and table["orders"].eq(4).all()
    assert table.set_index("fraction").loc[0.5, "margin"] == pytest.approx(0.68 - 0.62)
    # swap two orders at one fraction: λ is no longer best there
    summary = summarize(curves, ["selection_order", "fraction"])
    summary.loc[(summary.selection_order == "random") & (summary.fraction == 0.125), "mean"] = 0.9
    table = patterns.compare_orders(summary)
    assert table.set_index("fraction").loc[0.125, "best"] == "random"
    assert not table.set_index("fraction").loc[0.125, "lambda_best"]


# ---------------------------------------------------------------------------------------------- heat maps


def test_position_labels_sort_like_positions():
    labels = patterns.position_labels([0, 1, 2, 63], ["[CLS]", "a", "b", "[SEP]"], length=64)
    assert labels == ["00 [CLS]", "01 a", "02 b", "63 [SEP]"] and sorted(labels) == labels
    assert patterns.position_labels([0, 9, 127]) == ["000", "009", "127"]
    with pytest.raises(ValueError, match="tokens"):
        patterns.position_labels([0, 1], ["a"])


def test_packed_heatmaps_crop_and_pack():
    matrices = torch.arange(2 * 16, dtype=torch.float32).reshape(2, 4, 4) / 100
    packed = patterns.packed_heatmaps(matrices, [{"head": 0}, {"head": 1}], labels=["0", "1", "3"], positions=[0, 1, 3])
    assert packed.columns.tolist() == ["head", "labels", "cells"]
    assert packed.loc[0, "cells"] == [0, 10, 30, 40, 50, 70, 120, 130, 150]
    with pytest.raises(ValueError, match="labels"):
        patterns.packed_heatmaps(matrices, [{"head": 0}, {"head": 1}], labels=["0", "1"])
    with pytest.raises(ValueError, match="keys"):
        patterns.packed_heatmaps(matrices, [{"head": 0}], labels=["0", "1", "2", "3"])


def test_heatmap_chart_unpacks_the_chosen_matrix_in_vega():
    """Render the chart with vl-convert: the drawn cells are exactly the chosen matrix, labelled by position."""
    import altair as alt
    import vl_convert

    matrices = torch.tensor([[[0.9, 0.1], [0.25, 0.75]], [[0.5, 0.5], [0.0, 1.0]], [[0.3, 0.7], [0.6, 0.4]]])
    keys = [{"head": 0, "input": "a"}, {"head": 1, "input": "a"}, {"head": 1, "input": "b"}]
    packed = patterns.packed_heatmaps(matrices, keys, labels=[["0 x", "1 y"], ["0 x", "1 y"], ["0 u", "1 v"]])
    head = alt.param(name="head_choice", value=1, bind=alt.binding_select(options=[0, 1], name="head "))
    chart = charts.heatmap_chart(packed, {"head": head}, facet="input", title="test")
    spec = chart.to_dict()
    assert spec["params"][0]["name"] == "head_choice" and len(spec["hconcat"]) == 2
    svg = vl_convert.vegalite_to_svg(spec)
    cells = re.findall(r'attention: ([0-9.]+); query: ([^;]+); key: ([^"]+)"', svg)
    drawn = sorted((query, key, float(value)) for value, query, key in cells)
    assert drawn == sorted(
        [("0 x", "0 x", 0.5), ("0 x", "1 y", 0.5), ("1 y", "0 x", 0.0), ("1 y", "1 y", 1.0),
         ("0 u", "0 u", 0.3), ("0 u", "1 v", 0.7), ("1 v", "0 u", 0.6), ("1 v", "1 v", 0.4)]
    )
    assert len(json.dumps(spec)) < 5000
    with pytest.raises(ValueError, match="selector field"):
        charts.heatmap_chart(packed, {"layer": head})


def test_heatmap_chart_without_selectors_in_rows():
    """No parameter: every facet value drawn, ``columns`` per row, one colour legend for all panels."""
    import vl_convert

    matrices = torch.eye(3).expand(3, 3, 3) * torch.tensor([0.2, 0.5, 0.9])[:, None, None]
    packed = patterns.packed_heatmaps(matrices, [{"pick": p} for p in "abc"], labels=["0", "1", "2"])
    spec = charts.heatmap_chart(packed, {}, facet="pick", columns=2).to_dict()
    assert "params" not in spec and len(spec["vconcat"]) == 2 and len(spec["vconcat"][0]["hconcat"]) == 2
    svg = vl_convert.vegalite_to_svg(spec)
    assert len(re.findall(r'aria-label="[^"]*attention: ', svg)) == 27
    assert svg.count("Gradient legend") == 1
    with pytest.raises(ValueError, match="columns"):
        charts.heatmap_chart(packed, {}, facet="pick", columns=0)


def test_heatmap_chart_shared_rows_draws_one_query_axis_per_row():
    """``shared_rows``: only the first panel of each row draws the query axis, the legend sits below and a list
    title is drawn one line per item, so three panels fit where two did; the drawn cells are unchanged."""
    import vl_convert

    matrices = torch.eye(3).expand(4, 3, 3) * torch.tensor([0.2, 0.5, 0.9, 0.4])[:, None, None]
    packed = patterns.packed_heatmaps(matrices, [{"pick": p} for p in "abcd"], labels=["0", "1", "2"])
    titles = [[f"pick {p}:", "layer 0"] for p in "abcd"]
    spec = charts.heatmap_chart(packed, {}, facet="pick", facet_titles=titles, columns=3,
                                shared_rows=True).to_dict()
    rows = [row["hconcat"] for row in spec["vconcat"]]
    assert [len(row) for row in rows] == [3, 1]
    drawn = [[panel["encoding"]["y"].get("axis", "drawn") is not None for panel in row] for row in rows]
    assert drawn == [[True, False, False], [True]]
    assert rows[0][1]["title"]["text"] == ["pick b:", "layer 0"]
    assert rows[0][0]["encoding"]["color"]["legend"]["orient"] == "bottom"
    svg = vl_convert.vegalite_to_svg(spec)
    assert len(re.findall(r'aria-label="[^"]*attention: ', svg)) == 36
    assert svg.count("Gradient legend") == 1
    plain = charts.heatmap_chart(packed, {}, facet="pick", columns=3).to_dict()
    assert all(panel["encoding"]["y"]["axis"] is not None for row in plain["vconcat"] for panel in row["hconcat"])


def test_heatmap_chart_keeps_every_key_label_where_they_fit():
    """At 12 px cells the -60 degree labels lie 10.4 px apart, room for 9 px text: the browser must not hide every
    other one (the final [SEP] among them); at 6 px cells they would touch, so the browser may thin them."""
    labels = patterns.position_labels(list(range(32)) + [63], length=64)
    packed = patterns.packed_heatmaps(torch.rand(1, 33, 33), [{"head": 0}], labels=labels)
    for cell, overlap in ((12, False), (11, False), (10, True), (6, True)):
        axis = charts.heatmap_chart(packed, {}, cell=cell).to_dict()["encoding"]["x"]["axis"]
        assert axis["labelOverlap"] is overlap, cell
