"""Registries: built-ins exist whatever is imported first; a new matrix type or ranking is one registration that the
engine, the figures and the claims read; what a script registers is what a Ray worker is sent."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from papa_lib.core import registry
from papa_lib.core.averaging import ConstantAttention
from papa_lib.experiments import matrices, rankings

ROOT = Path(__file__).resolve().parents[1]


def test_builtins_whatever_is_imported_first():
    code = ("import papa_lib.core.models\n"  # a core module first: the package registers every layer's built-ins
            "from papa_lib.experiments.engine import Variant\n"
            "v = Variant.make('norm_average', 'norm_variance', 0.5)\n"
            "from papa_lib.core.registry import extensions\n"
            "print(v.matrix_type, v.selection_order, extensions())")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["norm_average", "norm_variance", "{}"]


def _uniform(model, batches, progress=False, source=None, total=None):
    width = batches[0]["input_ids"].shape[-1]
    layers = model.config.num_hidden_layers
    heads = model.config.num_attention_heads
    return ConstantAttention(torch.ones(layers, heads, width, width), torch.ones(width, width, dtype=torch.long))


@pytest.fixture
def uniform():
    entry = matrices.register_matrix_type("uniform_test", "constant", builder=_uniform, label="Uniform (test)",
                                          construction="data-free", table_order=3.5)
    ranking = rankings.register_head_ranking("by_index", lambda experiment, source, seed: torch.zeros(1, 1),
                                             label="by index")
    yield entry, ranking
    matrices.MATRIX_TYPES.pop("uniform_test")
    matrices.CONSTANT_BUILDERS.pop("uniform_test")
    rankings.HEAD_RANKINGS.pop("by_index")


def test_a_registration_carries_what_tables_need(uniform):
    entry, ranking = uniform
    assert entry.data_free and entry.from_text and entry.label == "Uniform (test)"
    assert matrices.constant_builder("uniform_test") == (_uniform, False)
    assert matrices.table_order().index("uniform_test") == matrices.table_order().index("zeros") + 1
    assert "uniform_test" in matrices.data_free_types()
    assert rankings.ranking_label("by_index") == "by index" and ranking.scored and ranking.order == "lambda"
    assert "score" in ranking.replaced_first
    ext = registry.extensions()
    assert set(ext["matrix type"]) == {"uniform_test"} and set(ext["selection order"]) == {"by_index"}
    assert pickle.loads(pickle.dumps(ext["matrix type"]))["uniform_test"] == entry
    with pytest.raises(ValueError, match="construction must be one of"):
        matrices.register_matrix_type("bad", "constant", construction="free")


def test_figures_and_claims_read_the_registry(uniform):
    from papa_lib.book import figures

    rows = []
    for kind, value in [("original", 0.9), ("average", 0.8), ("identity", 0.5), ("uniform_test", 0.85)]:
        for seed in range(2):
            rows.append({"model": "m", "task": "sst2", "matrix_type": kind, "selection_order": "none", "seed": seed,
                         "fraction": 1.0 if kind == "original" else 0.0, "metric": "accuracy", "value": value,
                         "matrices_from": "sst2" if matrices.MATRIX_TYPES[kind].from_text else None})
    summary = figures.matrix_type_summary(pd.DataFrame(rows))
    assert list(summary.matrix_type) == ["original", "identity", "uniform_test", "average"]
    assert summary.set_index("matrix_type").construction["uniform_test"] == "data-free"
    verdict = figures.average_vs_data_free(summary)
    assert verdict.best_data_free[0] == "uniform_test" and not verdict.beats[0]
    assert matrices.matrix_label("uniform_test") == "Uniform (test)"
    assert "uniform_test" in matrices.data_free_types() and matrices.MATRIX_TYPES["uniform_test"].from_text
    from papa_lib.analysis import claims

    assert claims.DATA_FREE == ("identity", "toeplitz", "zeros")  # C4 names the paper's three, registry or not
    c4 = claims.data_free_margins(pd.DataFrame(rows).assign(majority_baseline=0.5))
    assert c4.empty  # the paper's Toeplitz and zeros are not in these records: C4 is not measured, not redefined


def test_unknown_names_are_one_clear_error():
    with pytest.raises(ValueError, match=r"unknown matrix type 'avg'; choose one of \('original', 'average'"):
        matrices.matrix_type("avg")
    with pytest.raises(ValueError, match="unknown selection order 'lamda'"):
        rankings.head_ranking("lamda")


def test_an_adapter_registered_after_import_is_an_extension():
    from papa_lib import ArchitectureAdapter, register_adapter
    from papa_lib.core import models

    adapter = register_adapter(ArchitectureAdapter("my-bert", "interface", layers="encoder.layer",
                                                   attention="attention.self"))
    try:
        assert registry.extensions()["architecture adapter"] == {"my-bert": adapter}
    finally:
        models._ADAPTERS.pop("my-bert")
    assert "architecture adapter" not in registry.extensions()
