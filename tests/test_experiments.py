"""Experiment machinery (Sec. 3.2-3.3, 4, 5): variants, caching, grids on a tiny random model and generated data."""

from __future__ import annotations

import pytest
import torch

from papa_lib import experiments, results, smoke
from papa_lib.experiments import ExperimentConfig, TaskExperiment, Variant


@pytest.fixture(scope="module")
def tiny():
    return smoke.tiny_encoder("bert")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return smoke.generate_data_dir(tmp_path_factory.mktemp("data"), n_train=32, n_dev=16)


def test_variants_are_canonical():
    assert Variant.make("average", "random", 1.0) == Variant.make("zeros", "lambda", 1) == Variant()
    assert Variant.make("average", "random", 0.0) == Variant.make("average", "lambda", 0.0)
    assert Variant.make("identity", "lambda", 0.0, matrices_from="mnli").matrices_from is None
    assert Variant.make("average", "lambda", 0.0, matrices_from="mnli").matrices_from == "mnli"
    assert not Variant.make("trainable_average", "lambda", 0.0).frozen
    with pytest.raises(ValueError, match="unknown matrix type"):
        Variant.make("fourier")
    with pytest.raises(ValueError, match="unknown selection order"):
        Variant.make("average", "alphabetical", 0.5)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        Variant.make("average", "lambda", 1.5)


def test_grid_runs_deduplicate_shared_cells():
    blocks = [experiments.GridBlock("a", ["sst2"], orders=["lambda", "random"], fractions=[1, 0.5, 0]),
              experiments.GridBlock("b", ["sst2"], matrix_types=["average", "zeros"], fractions=[0])]
    plan = experiments.grid_runs(blocks)
    assert plan["sst2"] == [Variant(), Variant("average", "lambda", 0.5), Variant("average", "none", 0.0),
                            Variant("average", "random", 0.5), Variant("zeros", "none", 0.0)]


def test_frozen_features_are_computed_once_and_reused(tiny, data_dir):
    model, tokenizer = tiny
    experiment = TaskExperiment(ExperimentConfig("sst2", data_dir=str(data_dir), max_length=16, epochs=1), model, tokenizer, progress=False)
    calls = []
    original = experiments.extract_features

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    experiments.extract_features = counting
    try:
        variant = Variant.make("average", "first_to_last", 0.5)
        experiment.run(variant, 0)
        experiment.run(variant, 1)
        assert len(calls) == 2  # train + validation once, shared by both seeds
        experiment.run(Variant.make("zeros", "none", 0.0), 0)
        assert len(calls) == 4
    finally:
        experiments.extract_features = original


def test_same_seed_gives_the_same_number(tiny, data_dir):
    model, tokenizer = tiny
    config = ExperimentConfig("cola", data_dir=str(data_dir), max_length=16, epochs=2)
    variant = Variant.make("average", "first_to_last", 0.5)
    first = TaskExperiment(config, model, tokenizer, progress=False).evaluate_variant(variant, 3)
    second = TaskExperiment(config, model, tokenizer, progress=False).evaluate_variant(variant, 3)
    assert first == second


def test_token_task_features_keep_one_vector_per_kept_word(tiny, data_dir):
    model, tokenizer = tiny
    experiment = TaskExperiment(ExperimentConfig("ner", data_dir=str(data_dir), max_length=16, epochs=1), model, tokenizer, progress=False)
    train, _ = experiment.features(Variant())
    split = experiment.split("train")
    assert len(train) == int((split.labels != -100).sum())
    assert train.features.shape[1:] == (model.config.num_hidden_layers + 1, model.config.hidden_size)
    assert train.features.dtype == torch.float16


def test_lambda_learning_moves_theta(tiny, data_dir):
    model, tokenizer = tiny
    config = ExperimentConfig("sst2", data_dir=str(data_dir), max_length=16, epochs=1, lambda_learning_rate=0.1)
    lambdas = TaskExperiment(config, model, tokenizer, progress=False).learn_lambdas()
    assert lambdas.shape == (2, 4)
    assert not torch.allclose(lambdas, torch.full_like(lambdas, 0.5))


def test_one_epoch_grid_end_to_end_and_resume(tiny, data_dir, tmp_path):
    model, tokenizer = tiny
    spec = {
        "data_dir": str(data_dir), "profile": "smoke", "seeds": [0, 1], "max_length": {"default": 16, "mnli": 32},
        "epochs": 1, "lambda_epochs": 1, "inloop_epochs": 1,
        "blocks": [
            experiments.GridBlock("fig2", ["sst2", "ner"], fractions=[1, 0.5, 0]),
            experiments.GridBlock("table1", ["pos"], matrix_types=list(experiments.MATRIX_TYPES[1:7]), fractions=[0]),
            experiments.GridBlock("table2", ["cola"], matrices_from="mnli", fractions=[0]),
            experiments.GridBlock("fig5", ["mnli"], orders=list(experiments.selection.ORDERS), fractions=[0.5]),
        ],
    }
    store = experiments.run_grid(spec, tmp_path, model=model, tokenizer=tokenizer, progress=False)
    frame = store.frame()
    assert len(frame) == 2 * (3 + 3 + 6 + 1 + 5)
    assert set(frame.task) == {"sst2", "ner", "pos", "cola", "mnli"}
    assert frame.value.between(-1, 1).all()
    assert set(frame[frame.task == "cola"].matrices_from.dropna()) == {"mnli"}
    assert (tmp_path / "matrices").is_dir() and (tmp_path / "lambdas").is_dir()
    # re-running the same grid finds every run finished and computes nothing
    calls = []
    original = TaskExperiment.evaluate_variant
    TaskExperiment.evaluate_variant = lambda self, *a: calls.append(a) or original(self, *a)
    try:
        experiments.run_grid(spec, tmp_path, model=model, tokenizer=tokenizer, progress=False)
    finally:
        TaskExperiment.evaluate_variant = original
    assert calls == []
    assert len(results.ResultsStore(tmp_path).frame()) == len(frame)


def test_grid_file_errors_name_the_problem(tmp_path):
    bad = tmp_path / "grid.yaml"
    bad.write_text("blocks:\n  - name: x\n    tasks: [sst2]\n    colour: red\n")
    with pytest.raises(ValueError, match="unknown keys \\['colour'\\]"):
        experiments.load_grid(bad)
    bad.write_text("blocks:\n  - name: x\n    tasks: [sts]\n")
    with pytest.raises(ValueError, match="unknown task 'sts'"):
        experiments.load_grid(bad)
    bad.write_text("blocks: [\n  - oops: {\n")
    with pytest.raises(ValueError, match="grid.yaml:\\d+: invalid YAML"):
        experiments.load_grid(bad)


def test_committed_local_grid_file_parses():
    from pathlib import Path

    spec = experiments.load_grid(Path(__file__).resolve().parents[1] / "data" / "results" / "local-minilm" / "grid.yaml")
    plan = experiments.grid_runs(spec["blocks"])
    assert set(plan) == {"sst2", "cola", "mnli", "ner", "pos"}
    assert len(plan["mnli"]) == 1 + 4 + 5 + 12  # original + λ fractions/zero + other types + Fig. 5 orders


def test_cli_help_explains_itself(capsys):
    from papa_lib import cli

    for command in (["--help"], ["grid", "--help"], ["probe", "--help"], ["select", "--help"], ["averages", "--help"]):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(command)
        assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--model", "--task", "--data-dir", "--max-length", "--limit", "--seeds", "--epochs", "--device", "--results-dir"):
        assert flag in text


def test_cli_probe_runs_on_local_files(tmp_path, data_dir, monkeypatch):
    from papa_lib import cli, models

    monkeypatch.setattr(models, "load_encoder", lambda *a, **k: smoke.tiny_encoder("bert"))
    monkeypatch.setattr(experiments, "load_encoder", lambda *a, **k: smoke.tiny_encoder("bert"))
    code = cli.main(["probe", "--task", "sst2", "--data-dir", str(data_dir), "--max-length", "16", "--epochs", "1", "--seeds", "1",
                     "--fraction", "1", "1/2", "--order", "random", "--results-dir", str(tmp_path)])
    assert code == 0
    frame = results.ResultsStore(tmp_path).frame()
    assert sorted(frame.fraction) == [0.5, 1.0]
