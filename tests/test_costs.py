"""One cost model (papa_lib.ops.costs) serves ``papa grid --plan``, the scale chapter's cost tables and the benchmarks'
FLOP count: the per-layer FLOPs and the feature bytes are computed once, and the chapter's numbers are those it
showed before the three models were made one."""

from __future__ import annotations

import pytest
import torch

from papa_lib.experiments import features
from papa_lib.ops import bench, costs, plan


def _plan(task: str, **config):
    from papa_lib.experiments.variants import Variant
    from papa_lib.experiments.workspace import ExperimentConfig

    settings = ExperimentConfig(task, seeds=(0, 1, 2), epochs=2, **config).resolved()
    return plan.plan_task(task, [Variant()], settings, layers=6, hidden=384, tokens_per_second=1e4,
                          step_seconds=1e-3, budget=2**30)


def test_the_benchmarks_use_the_cost_models_flop_count():
    called = vars(bench)  # the names the benchmarks call are the cost model's own functions, not copies
    assert all(called[name] is getattr(costs, name) for name in ("decoder_shape", "flop_limit", "lm_head_flops"))
    assert costs.lm_head_flops(512, 640, 262144) == 512 * 640 * 262144 * 2


def test_one_per_layer_count_gives_the_flop_limit_and_the_encoder_cost_ratio(monkeypatch):
    assert costs.flop_limit(128, 384, 1536) == pytest.approx(1.2258, abs=1e-4)
    assert costs.encoder_cost_ratio(costs.MODEL_SHAPES["roberta-base"]) == 8.0
    calls = []

    def stand_in(length, hidden, intermediate, constant, **shape):  # a made-up count: 3 n·d, n·d when constant
        calls.append((length, hidden, intermediate, constant))
        return length * hidden * (1 if constant else 3)

    monkeypatch.setattr(costs, "layer_flops", stand_in)
    assert costs.flop_limit(128, 384, 1536) == 3.0  # the benchmarks' limit follows the one count ...
    assert costs.encoder_cost_ratio(costs.MODEL_SHAPES["roberta-base"]) == 12 * 768 / (6 * 384)  # ... and the ratio
    assert costs.encoder_cost_ratio(costs.MODEL_SHAPES["roberta-base"], length=128) == 4.0
    assert {(128, 384, 1536, False), (128, 384, 1536, True), (1, 768, 3072, False), (128, 768, 3072, False)} \
        <= set(calls)


def test_the_encoder_cost_ratio_leaves_the_attention_products_out_unless_given_a_length():
    for name in costs.MODEL_SHAPES:  # 4d² + 2·d·d_ff multiply-adds per token and layer, as the chapter says
        layers, d, f = costs.MODEL_SHAPES[name]
        expected = layers * (4 * d * d + 2 * d * f) / (6 * (4 * 384 * 384 + 2 * 384 * 1536))
        assert costs.encoder_cost_ratio(costs.MODEL_SHAPES[name]) == expected
    linear = [costs.layer_flops(n, 768, 3072, False, attention_products=False) / n for n in (1, 64, 512)]
    assert linear[0] == linear[1] == linear[2]
    base = costs.MODEL_SHAPES["roberta-base"]
    at = {n: costs.encoder_cost_ratio(base, length=n) for n in (128, 512)}
    assert at[128] == pytest.approx(12 * costs.layer_flops(128, 768, 3072, False)
                                    / (6 * costs.layer_flops(128, 384, 1536, False)))
    # the products grow with L·d, less than the projections' d²: counting them narrows the gap to the small model
    assert 1 < at[512] < at[128] < costs.encoder_cost_ratio(base)
    with pytest.raises(ValueError, match="length must be > 0"):
        costs.encoder_cost_ratio(base, length=0)


def test_the_scale_chapters_numbers_are_unchanged():
    """The values book/scale.md shows, computed before the FLOP and feature-byte models were made one."""
    from papa_lib.book import profiles

    shown = {name: round(costs.encoder_cost_ratio(costs.MODEL_SHAPES[name]), 1)
             for name in ("all-MiniLM-L6-v2", *profiles.PAPER_MODELS)}
    assert set(shown.values()) <= {1.0, 8.0, 28.4} and shown["roberta-large"] == 28.4
    assert costs.encoder_cost_ratio(costs.MODEL_SHAPES["roberta-large"]) == 28.444444444444443
    before = {  # (kind, examples, model, real tokens, L): (store, padded bytes)
        ("sentence", 8551, "roberta-base", 11.0, 64): (1878210048, 10927767552),
        ("sentence", 67349, "roberta-base", 13.3, 64): (17886170265, 86068789248),
        ("sentence", 67349, "roberta-large", 13.3, 64): (45861975040, 220689203200),
        ("sentence", 392702, "roberta-large", 42.0, 256): (844466380800, 5147223654400),
        ("sentence", 3668, "roberta-base", 53.0, 128): (3881859072, 9375055872),
        ("token", 203621, "roberta-base", 24.0, 128): (4065904128, 4065904128),
        ("token", 203621, "roberta-large", 24.0, 128): (10425395200, 10425395200),
    }
    for (kind, examples, name, tokens, length), (real, padded) in before.items():
        layers, hidden, _ = costs.MODEL_SHAPES[name]
        assert costs.feature_cache_bytes(kind, examples, layers, hidden, length=length,
                                         tokens_per_example=tokens) == real
        assert costs.feature_cache_bytes(kind, examples, layers, hidden, length=length) == padded
    assert costs.PAPER_TRAIN_SIZES["mnli"] == 392702 and plan.TYPICAL_TOKENS["sst2"] == 13.3


def test_the_plans_feature_bytes_are_the_cost_models():
    assert vars(plan)["PAPER_TRAIN_SIZES"] is costs.PAPER_TRAIN_SIZES
    for task, limit in (("cola", None), ("mrpc", 1000), ("sst2", None)):
        planned = _plan(task, limit=limit)
        assert planned.data.startswith("paper data sizes")  # no data at hand: the paper's sizes, typical tokens
        train = planned.train_examples
        store = train if limit is None else round(train * (1 - (1 - limit / train) ** 3))  # 3 seeds' subsets
        examples = store + planned.validation_examples
        assert planned.feature_bytes == costs.feature_cache_bytes(
            "sentence", examples, 6, 384, tokens_per_example=plan.TYPICAL_TOKENS[task], positions=True)
    ner = _plan("ner")
    words = (ner.train_examples + ner.validation_examples) * plan.TYPICAL_TOKENS["ner"] * 0.6
    assert ner.feature_bytes == features.feature_rows_bytes(words, 6, 384, "token", positions=True)
    assert ner.feature_bytes == features.feature_rows_bytes(words, 6, 384, "token")  # a token task keeps no positions


def test_the_cost_models_feature_bytes_are_what_the_store_keeps():
    """features.feature_bytes counts the rows of encoded data, the same count as feature_rows_bytes of those rows (both
    take the transformer layers; the embeddings add one vector), and the cost model's split estimate agrees."""
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    labels = torch.tensor([[0, 1, -100], [1, 1, 1], [-100, -100, -100]])
    layers, hidden = 6, 384
    for kind, rows in (("sentence", 9), ("token", 5)):
        stored = features.feature_bytes({"attention_mask": mask}, labels, kind, layers, hidden)
        assert stored == features.feature_rows_bytes(rows, layers, hidden, kind, positions=True)
    assert stored == 5 * 7 * 384 * 2  # a token task: 5 kept words x (6 layers + embeddings) x D, no positions
    assert features.feature_rows_bytes(9, layers, hidden, "sentence") == 9 * 7 * 384 * 2  # values alone
    assert costs.feature_cache_bytes("sentence", 3, layers, hidden, tokens_per_example=3.0, positions=True) \
        == features.feature_bytes({"attention_mask": mask}, labels, "sentence", layers, hidden)
    with pytest.raises(ValueError, match="kind must be"):
        features.feature_rows_bytes(9, layers, hidden, "pair")
