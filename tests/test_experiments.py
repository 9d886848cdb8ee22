"""Experiment machinery (Sec. 3.2-3.3, 4, 5): variants, caching, grids on a tiny random model and generated data."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from papa_lib import smoke
from papa_lib.experiments import engine, features, results, selection
from papa_lib.experiments.engine import TaskExperiment
from papa_lib.experiments.grid import GridBlock, grid_runs, load_grid, run_grid
from papa_lib.experiments.variants import Variant
from papa_lib.experiments.workspace import ExperimentConfig


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
    blocks = [GridBlock("a", ["sst2"], orders=["lambda", "random"], fractions=[1, 0.5, 0]),
              GridBlock("b", ["sst2"], matrix_types=["average", "zeros"], fractions=[0])]
    plan = grid_runs(blocks)
    assert plan["sst2"] == [Variant(), Variant("average", "lambda", 0.5), Variant("average", "none", 0.0),
                            Variant("average", "random", 0.5), Variant("zeros", "none", 0.0)]


def test_frozen_features_are_computed_once_and_reused(tiny, data_dir, tmp_path, monkeypatch):
    model, tokenizer = tiny
    config = ExperimentConfig("sst2", data_dir=str(data_dir), max_length=16, epochs=1, seeds=(0, 1),
                              keep_features=True)
    experiment = TaskExperiment(config, model, tokenizer, results_dir=tmp_path, progress=False)
    calls = []
    original = features.BackboneRunner.rows
    monkeypatch.setattr(features.BackboneRunner, "rows",
                        lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    variant = Variant.make("average", "first_to_last", 0.5)
    experiment.run_variant(variant, [0, 1])
    assert len(calls) == 2  # train + validation once, shared by both seeds
    experiment.run(Variant.make("zeros", "none", 0.0), 0)
    assert len(calls) == 4
    # a new experiment over the same store reads the features from disk
    TaskExperiment(config, model, tokenizer, results_dir=tmp_path / "other", progress=False)
    again = TaskExperiment(config, model, tokenizer, results_dir=tmp_path, progress=False)
    again.compute_record(Variant.make("zeros", "none", 0.0), 1)
    assert len(calls) == 4
    # without keep_features a variant's store is deleted once its records are written
    lean = TaskExperiment(ExperimentConfig("sst2", data_dir=str(data_dir), max_length=16, epochs=1, seeds=(0,)),
                          model, tokenizer, results_dir=tmp_path / "lean", progress=False)
    lean.run(Variant(), 0)
    assert not any((tmp_path / "lean" / "features").glob("*/*.json"))


def test_cached_and_streamed_features_give_the_same_numbers(tiny, data_dir, tmp_path):
    model, tokenizer = tiny
    variant = Variant.make("average", "first_to_last", 0.5)
    numbers = {}
    for task in ("sst2", "ner"):
        for name, budget in (("cached", None), ("streamed", 0)):
            config = ExperimentConfig(task, data_dir=str(data_dir), max_length=16, epochs=3, patience=2,
                                      seeds=(0, 1), cache_budget=budget, learning_rate=1e-3)
            experiment = TaskExperiment(config, model, tokenizer, results_dir=tmp_path / task / name, progress=False)
            records = experiment.compute_records(variant, [0, 1])
            assert {r["feature_mode"] for r in records} == {name}
            numbers[(task, name)] = [(r["value"], r["best_epoch"], r["updates"]) for r in records]
        assert numbers[(task, "cached")] == numbers[(task, "streamed")]


def test_a_seed_trained_alone_matches_the_joint_pass(tiny, data_dir):
    model, tokenizer = tiny
    config = ExperimentConfig("mnli", data_dir=str(data_dir), max_length=32, epochs=3, patience=2, seeds=(0, 1, 2),
                              limit=24, learning_rate=1e-3)
    joint = TaskExperiment(config, model, tokenizer, progress=False).compute_records(Variant(), [0, 1, 2])
    alone = TaskExperiment(config, model, tokenizer, progress=False).compute_record(Variant(), 2)
    assert joint[2]["value"] == alone["value"] and joint[2]["updates"] == alone["updates"]


def test_each_seed_draws_its_own_subset_and_heldout_slice(tiny, data_dir):
    model, tokenizer = tiny
    experiment = TaskExperiment(ExperimentConfig("sst2", data_dir=str(data_dir), max_length=16, limit=20), model,
                                tokenizer, progress=False)
    plans = [engine.seed_plan(experiment, seed) for seed in (0, 1)]
    for plan in plans:
        assert len(plan.train) + len(plan.heldout) == 20
        assert not set(plan.train.tolist()) & set(plan.heldout.tolist())
    assert set(plans[0].train.tolist()) != set(plans[1].train.tolist())
    assert engine.seed_plan(experiment, 0).train.tolist() == plans[0].train.tolist()  # seeded
    full = TaskExperiment(ExperimentConfig("sst2", data_dir=str(data_dir), max_length=16), model, tokenizer,
                          progress=False)
    assert sorted(engine.seed_rows(full, 0).tolist()) == list(range(len(engine.split(full, "train"))))


def test_the_feature_store_covers_only_the_seeds_a_call_trains(tiny, data_dir):
    from papa_lib.experiments.engine import store_rows, variant_feature_bytes

    model, tokenizer = tiny
    experiment = TaskExperiment(ExperimentConfig("sst2", data_dir=str(data_dir), max_length=16, limit=12,
                                                 seeds=(0, 1, 2)), model, tokenizer, progress=False)
    one = set(store_rows(experiment, [2]).tolist())
    assert one == set(engine.seed_rows(experiment, 2).tolist())
    every = set(store_rows(experiment).tolist())
    assert every == set().union(*(set(engine.seed_rows(experiment, s).tolist()) for s in (0, 1, 2))) and one < every
    assert variant_feature_bytes(experiment, [2]) < variant_feature_bytes(experiment)


def test_seeds_run_in_separate_calls_share_one_store_of_their_rows(tiny, data_dir, tmp_path, monkeypatch):
    """What a Ray executor's one-seed units do (``store_seeds``): with a ``limit``, the second seed reads the store the
    first one made over both seeds' rows, and makes no backbone pass of its own."""
    from papa_lib.experiments.features import BackboneRunner

    model, tokenizer = tiny
    config = ExperimentConfig("sst2", data_dir=str(data_dir), max_length=16, epochs=1, limit=12, seeds=(0, 1),
                              keep_features=True)
    experiment = TaskExperiment(config, model, tokenizer, results_dir=tmp_path, progress=False)
    passes = []
    original = BackboneRunner.rows
    monkeypatch.setattr(BackboneRunner, "rows", lambda self, *a, **k: passes.append(1) or original(self, *a, **k))
    experiment.compute_records(Variant(), [0], store_seeds=[0, 1])
    made = len(passes)
    assert made > 0
    experiment.compute_records(Variant(), [1], store_seeds=[0, 1])
    assert len(passes) == made


def test_a_seed_that_stops_early_is_stored_at_once_and_a_stopped_run_resumes_with_the_rest(tiny, data_dir, tmp_path,
                                                                                            monkeypatch):
    """Seeds of a variant train together; one that stops early (patience) lands in the store before the slower ones
    finish. A run killed after that keeps it, and the resumed run trains only the others, to the same numbers."""
    model, tokenizer = tiny
    config = ExperimentConfig("sst2", data_dir=str(data_dir), max_length=16, epochs=12, patience=1, seeds=(0, 1, 2),
                              learning_rate=1e-2)
    keys = ("value", "best_epoch", "epochs_run", "updates")
    whole = TaskExperiment(config, model, tokenizer, results_dir=tmp_path / "whole", progress=False).run_variant(
        Variant(), [0, 1, 2])
    first = min(whole, key=lambda r: r["epochs_run"])
    assert first["epochs_run"] < max(r["epochs_run"] for r in whole)  # it stopped while others still trained

    class Killed(Exception):
        pass

    append = results.ResultsStore.append

    def append_then_die(self, record, **kw):
        append(self, record, **kw)
        raise Killed

    monkeypatch.setattr(results.ResultsStore, "append", append_then_die)
    killed = tmp_path / "killed"
    with pytest.raises(Killed):
        TaskExperiment(config, model, tokenizer, results_dir=killed, progress=False).run_variant(Variant(), [0, 1, 2])
    monkeypatch.setattr(results.ResultsStore, "append", append)
    kept = results.ResultsStore(killed).frame()
    assert len(kept) == 1 and int(kept.seed[0]) == first["seed"]
    assert float(kept.value[0]) == first["value"] and int(kept.epochs_run[0]) == first["epochs_run"]
    assert len(list((killed / "curves").glob("*.csv"))) == 1  # killed before any other seed was scored
    # every seed's state after the epoch it stopped in (papa_lib.experiments.loop.EpochCheckpoint)
    saved = {int(torch.load(path, weights_only=True)["epochs"]) for path in (killed / "checkpoints").glob("*.pt")}
    assert len(list((killed / "checkpoints").glob("*.pt"))) == 3 and saved == {first["epochs_run"]}

    trained = []
    compute = TaskExperiment.compute_records
    monkeypatch.setattr(TaskExperiment, "compute_records",
                        lambda self, variant, seeds, *a, **k: trained.append(list(seeds)) or compute(
                            self, variant, seeds, *a, **k))
    resumed = TaskExperiment(config, model, tokenizer, results_dir=killed, progress=False).run_variant(
        Variant(), [0, 1, 2])
    assert trained == [[s for s in (0, 1, 2) if s != first["seed"]]]
    assert not list((killed / "checkpoints").iterdir())  # deleted (with their checksums) once the records are stored
    assert [[r[k] for k in keys] for r in resumed] == [[r[k] for k in keys] for r in whole]
    assert len(results.ResultsStore(killed).frame()) == 3
    assert 0 < first["wall_time_s"] <= min(r["wall_time_s"] for r in whole)  # its share of the time until it landed


def test_records_carry_baseline_curve_and_mode(tiny, data_dir, tmp_path):
    model, tokenizer = tiny
    config = ExperimentConfig("cola", data_dir=str(data_dir), max_length=16, epochs=2, seeds=(0,), inloop_epochs=1,
                              inloop_limit=8, matrix_learning_rate=1e-2)
    experiment = TaskExperiment(config, model, tokenizer, results_dir=tmp_path, progress=False)
    record = experiment.run(Variant.make("trainable_average", "none", 0.0), 0)
    assert record["majority_baseline"] == 0.0  # MCC of a constant prediction
    # trained inside the backbone on 8 rows (one epoch), then probed on frozen features like every other row
    assert record["matrices_moved"] > 0 and record["matrix_updates"] == -(-8 // experiment.config.batch_size)
    assert record["feature_mode"] == "cached"
    assert (
        (tmp_path / record["curve_file"]).read_text().startswith("epoch,updates,train_loss,heldout_loss,heldout_score")
    )
    assert 1 <= record["best_epoch"] <= record["epochs_run"] <= 2
    assert record["peak_memory_mb"] > 0
    frozen = experiment.run(Variant(), 0)
    assert frozen["feature_mode"] == "cached" and isinstance(frozen["single_class"], bool)
    labels = engine.split(experiment, "validation").labels
    share = float((labels == torch.mode(labels).values).float().mean())
    assert frozen["majority_accuracy"] == pytest.approx(share) and 0.0 <= frozen["accuracy"] <= 1.0
    assert "token_accuracy" not in frozen


def test_same_seed_gives_the_same_number(tiny, data_dir):
    model, tokenizer = tiny
    config = ExperimentConfig("cola", data_dir=str(data_dir), max_length=16, epochs=2)
    variant = Variant.make("average", "first_to_last", 0.5)
    first = TaskExperiment(config, model, tokenizer, progress=False).compute_record(variant, 3)["value"]
    second = TaskExperiment(config, model, tokenizer, progress=False).compute_record(variant, 3)["value"]
    assert first == second


def test_token_task_features_keep_one_vector_per_kept_word(tiny, data_dir):
    model, tokenizer = tiny
    experiment = TaskExperiment(ExperimentConfig("ner", data_dir=str(data_dir), max_length=16, epochs=1), model,
                                tokenizer, progress=False)
    split = engine.split(experiment, "train")
    rows = torch.arange(len(split))
    train = engine.cached_rows(experiment, None, "train", rows)
    assert train.values.shape[0] == int((split.labels != -100).sum())
    assert train.values.shape[1:] == (model.config.num_hidden_layers + 1, model.config.hidden_size)
    assert train.values.dtype == torch.float16


def test_lambda_learning_moves_theta(tiny, data_dir):
    model, tokenizer = tiny
    config = ExperimentConfig("sst2", data_dir=str(data_dir), max_length=16, epochs=1, lambda_learning_rate=0.1)
    lambdas = engine.learn_lambdas(TaskExperiment(config, model, tokenizer, progress=False))
    assert lambdas.shape == (2, 4)
    assert not torch.allclose(lambdas, torch.full_like(lambdas, 0.5))


def test_a_lambda_file_says_where_it_was_learned_and_records_carry_it(tiny, data_dir, tmp_path):
    """λ learned on one machine and read by runs on another (the local grid's first λ came from an H100 and ranked
    heads for CPU probes) is visible: the file stores the device and machine it was learned on, and a λ-ordered
    record names it in ``lambda_device`` (``not recorded`` for a file without it; empty for runs that read no λ)."""
    from papa_lib.experiments.grid import run_grid
    from papa_lib.experiments.workspace import read_lambda_info, read_lambdas, write_lambdas

    model, tokenizer = tiny
    spec = {"data_dir": str(data_dir), "profile": "smoke", "seeds": [0], "max_length": 16, "epochs": 1,
            "lambda_epochs": 1, "blocks": [GridBlock("fig2", ["sst2"], fractions=[1, 0.5])]}
    frame = run_grid(spec, tmp_path, model=model, tokenizer=tokenizer, progress=False).frame().set_index("fraction")
    [path] = (tmp_path / "lambdas").glob("*.safetensors")
    info = read_lambda_info(path)
    assert info["device"] == "cpu" and info["processor"] and info["torch_version"] and "git_commit" in info
    assert "train.tsv" in info["data_sha256"]
    assert frame.loc[0.5, "lambda_device"] == "cpu" and pd.isna(frame.loc[1.0, "lambda_device"])
    write_lambdas(path, read_lambdas(path))  # as the committed files were written: no info
    rerun = run_grid({**spec, "epochs": 2, "blocks": [GridBlock("again", ["sst2"], fractions=[0.5])]}, tmp_path,
                     model=model, tokenizer=tokenizer, progress=False).frame()  # new run ids, the same λ file
    assert set(rerun.lambda_device.dropna()) == {"cpu", "not recorded"}


def test_lambda_learning_shows_its_progress(tiny, data_dir, capsys):
    """λ learning passes the model's whole training set through the backbone, forwards and backwards: on a CPU, tens
    of minutes with MPNet. With progress on, it says so; without, it prints nothing."""
    model, tokenizer = tiny
    config = ExperimentConfig("sst2", data_dir=str(data_dir), max_length=16, epochs=1, lambda_epochs=1)
    engine.learn_lambdas(TaskExperiment(config, model, tokenizer, progress=False))
    assert "learning λ" not in capsys.readouterr().err
    engine.learn_lambdas(TaskExperiment(config, model, tokenizer, progress=True))
    assert "learning λ (sst2, seed 0)" in capsys.readouterr().err


def test_a_shared_lambda_seed_learns_lambda_once_for_every_seed(tiny, data_dir, tmp_path, monkeypatch):
    """``lambda_seed``: every seed's λ-order run ranks heads by one λ (learned once, on that seed's rows); the runs'
    ids change (other numbers), the ids of runs that learn no λ do not."""
    from papa_lib.experiments.grid import run_grid

    model, tokenizer = tiny
    learned, trained = [], []
    original, frozen = engine.learn_lambdas, engine.train_frozen
    monkeypatch.setattr(engine, "learn_lambdas",
                        lambda ws, source=None, seed=0: learned.append(seed) or original(ws, source, seed))
    monkeypatch.setattr(engine, "train_frozen",
                        lambda ws, variant, seeds, state=None, **kw: trained.append((variant.fraction, list(seeds)))
                        or frozen(ws, variant, seeds, state, **kw))
    spec = {"data_dir": str(data_dir), "profile": "smoke", "seeds": [0, 1, 2], "max_length": 16, "epochs": 1,
            "lambda_epochs": 1, "blocks": [GridBlock("fig2", ["sst2"], fractions=[1, 0.5])]}
    shared = run_grid({**spec, "lambda_seed": 1}, tmp_path / "shared", model=model, tokenizer=tokenizer,
                      progress=False).frame()
    assert set(learned) == {1} and len(list((tmp_path / "shared" / "lambdas").glob("*.safetensors"))) == 1
    assert (0.5, [0, 1, 2]) in trained  # one λ order for all seeds: their probes train from one pass
    learned.clear()
    trained.clear()
    own = run_grid(spec, tmp_path / "own", model=model, tokenizer=tokenizer, progress=False).frame()
    assert sorted(set(learned)) == [0, 1, 2] and len(list((tmp_path / "own" / "lambdas").glob("*.safetensors"))) == 3
    assert [seeds for fraction, seeds in trained if fraction == 0.5] == [[0], [1], [2]]  # one λ order per seed
    ids = {name: frame.set_index(["fraction", "seed"]).run_id for name, frame in (("shared", shared), ("own", own))}
    assert (ids["shared"].loc[1.0] == ids["own"].loc[1.0]).all()  # the original learns no λ: same ids
    assert not set(ids["shared"].loc[0.5]) & set(ids["own"].loc[0.5])  # λ-order runs: other ids


def test_one_epoch_grid_end_to_end_and_resume(tiny, data_dir, tmp_path):
    model, tokenizer = tiny
    spec = {
        "data_dir": str(data_dir),
        "profile": "smoke",
        "seeds": [0, 1],
        "max_length": {"default": 16, "mnli": 32},
        "epochs": 1,
        "lambda_epochs": 1,
        "inloop_epochs": 1,
        "blocks": [
            GridBlock("fig2", ["sst2", "ner"], fractions=[1, 0.5, 0]),
            GridBlock(
                "table1",
                ["pos"],
                matrix_types=["average", "identity", "toeplitz", "zeros", "trainable_toeplitz", "trainable_average"],
                fractions=[0],
            ),
            GridBlock("table2", ["cola"], matrices_from="mnli", fractions=[0]),
            GridBlock("fig5", ["mnli"], orders=list(selection.ORDERS), fractions=[0.5]),
        ],
    }
    store = run_grid(spec, tmp_path, model=model, tokenizer=tokenizer, progress=False)
    frame = store.frame()
    assert len(frame) == 2 * (3 + 3 + 6 + 1 + 5)
    assert set(frame.task) == {"sst2", "ner", "pos", "cola", "mnli"}
    assert frame.value.between(-1, 1).all()
    assert set(frame[frame.task == "cola"].matrices_from.dropna()) == {"mnli"}
    assert (tmp_path / "matrices").is_dir() and (tmp_path / "lambdas").is_dir()
    # re-running the same grid finds every run finished and computes nothing
    calls = []
    original = TaskExperiment.compute_records
    TaskExperiment.compute_records = lambda self, *a: calls.append(a) or original(self, *a)
    try:
        run_grid(spec, tmp_path, model=model, tokenizer=tokenizer, progress=False)
    finally:
        TaskExperiment.compute_records = original
    assert calls == []
    assert len(results.ResultsStore(tmp_path).frame()) == len(frame)


def test_grid_file_errors_name_the_problem(tmp_path):
    bad = tmp_path / "grid.yaml"
    bad.write_text("blocks:\n  - name: x\n    tasks: [sst2]\n    colour: red\n")
    with pytest.raises(ValueError, match="grid.yaml:4: unknown key 'colour' in blocks\\[0\\]"):
        load_grid(bad)
    bad.write_text("blocks:\n  - name: x\n    tasks: [sts]\n")
    with pytest.raises(ValueError, match="grid.yaml:3: blocks\\[0\\].tasks\\[0\\]: unknown task 'sts'"):
        load_grid(bad)
    bad.write_text("lambda_seed: -1\nblocks:\n  - name: x\n    tasks: [sst2]\n")
    with pytest.raises(ValueError, match="grid.yaml:1: lambda_seed: must be a non-negative integer, got -1"):
        load_grid(bad)
    bad.write_text("blocks: [\n  - oops: {\n")
    with pytest.raises(ValueError, match="grid.yaml:\\d+: invalid YAML"):
        load_grid(bad)


def test_committed_local_grid_file_parses():
    from pathlib import Path

    spec = load_grid(Path(__file__).resolve().parents[1] / "data" / "results" / "local-minilm" / "grid.yaml")
    plan = grid_runs(spec["blocks"])
    assert set(plan) == {"sst2", "cola", "mrpc", "mnli", "ner", "pos"}
    assert len(plan["mnli"]) == 1 + 4 + 5 + 12  # original + λ fractions/zero + other types + Fig. 5 orders


def test_cli_help_explains_itself(capsys):
    from papa_lib import cli

    for command in (["--help"], ["grid", "--help"], ["probe", "--help"], ["select", "--help"], ["averages", "--help"]):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(command)
        assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for flag in (
        "--model",
        "--task",
        "--data-dir",
        "--max-length",
        "--limit",
        "--seeds",
        "--epochs",
        "--device",
        "--results-dir",
    ):
        assert flag in text


def test_cli_probe_runs_on_local_files(tmp_path, data_dir, monkeypatch):
    from papa_lib import cli
    from papa_lib.core import models

    monkeypatch.setattr(models, "load_encoder", lambda *a, **k: smoke.tiny_encoder("bert"))
    code = cli.main(
        [
            "probe",
            "--task",
            "sst2",
            "--data-dir",
            str(data_dir),
            "--max-length",
            "16",
            "--epochs",
            "1",
            "--seeds",
            "1",
            "--fraction",
            "1",
            "1/2",
            "--order",
            "random",
            "--results-dir",
            str(tmp_path),
        ]
    )
    assert code == 0
    frame = results.ResultsStore(tmp_path).frame()
    assert sorted(frame.fraction) == [0.5, 1.0]


def test_plan_counts_work_without_running_anything(tiny, data_dir, monkeypatch):
    from papa_lib.core import models
    from papa_lib.ops import plan

    monkeypatch.setattr(models, "load_encoder", lambda *a, **k: tiny)
    spec = {"data_dir": str(data_dir), "seeds": [0, 1], "max_length": 16, "epochs": 2, "limit": {"sst2": 10},
            "blocks": [GridBlock("fig2", ["sst2", "ner"], fractions=[1, 0.5, 0]),
                       GridBlock("t1", ["sst2"], matrix_types=["trainable_average"], fractions=[0])]}
    text = plan.plan_grid(spec, {"cache_budget": 10**12})
    lines = {line.split()[0]: line.split() for line in text.splitlines()[2:-1]}
    assert set(lines) == {"sst2", "ner"}
    sst2 = lines["sst2"]
    assert sst2[2] == "10" and sst2[6] == "4"  # 10 examples per seed; original, λ at 1/2, all-constant, trainable
    assert sst2[5] == "8"  # runs: 4 variants x 2 seeds
    assert sst2[8] == "2" and sst2[9] == "2"  # trainable runs for 2 seeds; λ learned per seed
    once = plan.plan_grid({**spec, "lambda_seed": 0, "cache_budget": "1T"}).splitlines()  # a grid file's size
    shared = next(line.split() for line in once if line.startswith("sst2"))
    assert shared[9] == "1" and (sst2[7], shared[7]) == ("4", "3")  # one λ, so ½'s seeds share one backbone
    assert "cache" in lines["ner"] and "measured" in lines["ner"][-1]
    parts = text.splitlines()[-1].split(";")
    at_most, at_least, shared = (float(parts[i].split(" h")[0].split()[-1]) for i in (0, 2, 3))
    assert 0 <= at_least <= at_most and "backbone passes alone" in text  # the floor never exceeds the estimate
    assert 0 <= shared <= at_least and "once per task" in text
    capped = plan.plan_grid({**spec, "average_limit": 3}, {"cache_budget": 10**12}).splitlines()
    passes = {line.split()[0]: float(line.split()[11]) for line in capped[2:-1]}
    assert passes["sst2"] < float(lines["sst2"][11])  # the matrices average over 3 examples, not the whole text
    assert sst2[10] == "0"  # λ orders: no registered head scores to time
    monkeypatch.setattr(plan, "measure_throughput", lambda *a, **k: (0.5, 0.0))  # slow enough to read in hours
    parts = plan.plan_grid(spec, {"cache_budget": 10**12}).splitlines()[-1].split(";")
    at_least, shared = (float(parts[i].split(" h")[0].split()[-1]) for i in (2, 3))
    assert 0 < shared < at_least  # λ learned per seed, and its per-seed backbones, cost passes
    streamed = plan.plan_grid(spec, {"cache_budget": 1})
    assert all("stream" in line for line in streamed.splitlines()[2:-1])


def test_plan_times_the_label_free_scores_per_seed(tiny, data_dir, monkeypatch):
    """A label-free order scores each seed's training rows once (HeadRanking.score_pass) and norm-weighted matrices
    average padded batches: the plan counts the score passes and adds the measured time of both, which the packed
    throughput does not price."""
    from papa_lib.analysis import norm_rankings  # noqa: F401  (registers the label-free orders)
    from papa_lib.core import models
    from papa_lib.ops import plan

    monkeypatch.setattr(models, "load_encoder", lambda *a, **k: tiny)
    spec = {"data_dir": str(data_dir), "seeds": [0, 1, 2], "max_length": 16, "epochs": 1, "limit": {"sst2": 10},
            "blocks": [GridBlock("free", ["sst2"], orders=["attention_variance", "norm_variance"],
                                 fractions=[0.5, 0.125])]}
    timed = []
    real_cost = plan.score_cost
    monkeypatch.setattr(plan, "score_cost", lambda ws, pending: timed.append(real_cost(ws, pending)) or timed[-1])
    row = next(line.split() for line in plan.plan_grid(spec, {"cache_budget": 10**12}).splitlines()
               if line.startswith("sst2"))
    assert row[10] == "6"  # two orders x three seeds, each scored once for both fractions
    passes, seconds, once = timed[0]
    assert passes == 6 and seconds > 0 and once == pytest.approx(seconds / 3)
    matrices = {**spec, "blocks": [GridBlock("nm", ["sst2"], matrix_types=["norm_average"], fractions=[0])]}
    plan.plan_grid(matrices, {"cache_budget": 10**12})  # norm-weighted matrices average padded batches: timed once
    passes, seconds, once = timed[1]
    assert passes == 0 and seconds > 0 and once == seconds


def test_plan_leaves_out_the_runs_already_stored(tiny, data_dir, monkeypatch, tmp_path):
    """A resumed grid's plan counts only what is left: the run ids are those the runner stores."""
    from papa_lib.core import models
    from papa_lib.experiments.grid import run_grid
    from papa_lib.ops import plan

    monkeypatch.setattr(models, "load_encoder", lambda *a, **k: tiny)
    spec = {"data_dir": str(data_dir), "seeds": [0, 1], "max_length": 16, "epochs": 1, "limit": {"sst2": 10},
            "blocks": [GridBlock("ends", ["sst2"], fractions=[1, 0])]}
    before = plan.plan_grid(spec, {"cache_budget": 10**12}, results_dir=tmp_path)
    assert before.splitlines()[2].split()[5] == "4" and "(0 already in" in before
    run_grid({**spec, "blocks": [GridBlock("original", ["sst2"], fractions=[1])]}, tmp_path, *tiny, progress=False)
    after = plan.plan_grid(spec, {"cache_budget": 10**12}, results_dir=tmp_path)
    row = after.splitlines()[2].split()
    assert row[5] == "2" and row[6] == "1"  # the all-constant variant's two seeds are left
    assert "total: 2 runs still to run (2 already in" in after
    hours = [float(t.splitlines()[-1].split("at most ")[1].split(" h")[0]) for t in (before, after)]
    assert hours[1] <= hours[0]


def test_a_resumed_plan_leaves_out_the_stored_matrices_and_lambdas(tiny, data_dir, monkeypatch, tmp_path):
    """A run stopped after its matrices and λ were saved (a killed fig2half run keeps no record, only those files)
    is planned without them: the resumed run reads them from the results folder."""
    from papa_lib.core import models
    from papa_lib.experiments.grid import run_grid
    from papa_lib.ops import plan

    monkeypatch.setattr(models, "load_encoder", lambda *a, **k: tiny)
    spec = {"data_dir": str(data_dir), "seeds": [0, 1], "max_length": 16, "epochs": 1, "limit": {"sst2": 10},
            "blocks": [GridBlock("half", ["sst2"], fractions=[0.5])]}
    before = plan.plan_grid(spec, {"cache_budget": 10**12}, results_dir=tmp_path).splitlines()[2].split()
    assert before[5] == "2" and before[9] == "2"  # two runs, λ learned per seed
    run_grid(spec, tmp_path, *tiny, progress=False, only_seeds=[1])
    assert len(list((tmp_path / "lambdas").glob("sst2-from-sst2-*.safetensors"))) == 1
    (tmp_path / "results.csv").unlink()  # as if the run was killed after λ: no record, the files stay
    after = plan.plan_grid(spec, {"cache_budget": 10**12}, results_dir=tmp_path).splitlines()[2].split()
    assert after[5] == "2" and after[9] == "1"  # both runs left, seed 1's λ is read from disk
    train, per_seed = int(before[1]), int(before[2])
    lambda_passes = (float(before[11]) - float(after[11]) - train) / (3 * per_seed)  # matrices: one pass of the text
    assert lambda_passes == pytest.approx(1, abs=0.2)  # one λ epoch (the grid's epochs) of seed 1's rows
    shared = plan.plan_grid({**spec, "lambda_seed": 1}, {"cache_budget": 10**12}, results_dir=tmp_path)
    assert shared.splitlines()[2].split()[9] == "0"  # one λ for every seed: seed 1's, on disk


def test_a_resumed_plan_leaves_out_the_saved_epochs_and_the_stored_features(tiny, data_dir, monkeypatch, tmp_path):
    """A run killed mid-training leaves its cached features and each seed's state after its last epoch; the resumed
    run reads both, so its plan counts neither that variant's backbone pass nor those epochs."""
    from papa_lib.core import models
    from papa_lib.experiments.loop import EpochCheckpoint
    from papa_lib.ops import plan

    monkeypatch.setattr(models, "load_encoder", lambda *a, **k: tiny)
    monkeypatch.setattr(plan, "measure_throughput", lambda *a, **k: (1e4, 3600.0))  # steps of an hour: read in hours
    monkeypatch.setattr(plan, "measure_seed_batching", lambda *a, **k: 1.0)
    spec = {"data_dir": str(data_dir), "seeds": [0, 1], "max_length": 16, "epochs": 3, "patience": 5,
            "limit": {"sst2": 10}, "blocks": [GridBlock("ends", ["sst2"], fractions=[1, 0])]}

    def probe_hours(text):
        return float(text.splitlines()[-1].split("probes ")[1].split(" h")[0])

    before = plan.plan_grid(spec, {"cache_budget": 10**12}, results_dir=tmp_path)
    assert before.splitlines()[2].split()[7] == "2" and ", 0 probe epochs of the rest and 0 variants" in before

    class Killed(Exception):
        pass

    save = EpochCheckpoint.save

    def save_then_die(self, members, optimizer):
        save(self, members, optimizer)
        raise Killed  # after the first epoch of the first variant (the original model)

    monkeypatch.setattr(EpochCheckpoint, "save", save_then_die)
    with pytest.raises(Killed):
        run_grid(spec, tmp_path, *tiny, progress=False)
    monkeypatch.setattr(EpochCheckpoint, "save", save)
    assert not (tmp_path / "results.csv").is_file() or results.ResultsStore(tmp_path).frame().empty
    after = plan.plan_grid(spec, {"cache_budget": 10**12}, results_dir=tmp_path)
    assert after.splitlines()[2].split()[7] == "1"  # the original's features are read back, not computed
    assert "2 probe epochs of the rest and 1 variants' features are saved" in after
    # 4 runs x 3 epochs, of which the two seeds' first epochs are saved
    assert probe_hours(before) > 1 and probe_hours(after) == pytest.approx(probe_hours(before) * 10 / 12, rel=0.02)
    monkeypatch.setattr(plan, "measure_throughput", lambda *a, **k: (0.5, 0.0))  # the backbone passes read in hours
    parts = plan.plan_grid(spec, {"cache_budget": 10**12}, results_dir=tmp_path).splitlines()[-1].split(";")
    at_least, shared = (float(parts[i].split(" h")[0].split()[-1]) for i in (2, 3))
    assert 0 < shared == at_least  # no λ, no random order: nothing for once-per-task to save, stored features or not
    for path in (tmp_path / "checkpoints").glob("*.pt"):  # damaged states are not counted (the run sets them aside)
        path.write_bytes(b"not a state")
    assert ", 0 probe epochs" in plan.plan_grid(spec, {"cache_budget": 10**12}, results_dir=tmp_path)


def test_a_shards_plan_counts_its_own_seeds(tiny, data_dir, monkeypatch, tmp_path):
    """--only-seed plans the shard: its seeds alone, and only its stored runs count as done."""
    from papa_lib.core import models
    from papa_lib.experiments.grid import run_grid
    from papa_lib.ops import plan

    monkeypatch.setattr(models, "load_encoder", lambda *a, **k: tiny)
    spec = {"data_dir": str(data_dir), "seeds": [0, 1, 2], "max_length": 16, "epochs": 1, "limit": {"sst2": 10},
            "blocks": [GridBlock("ends", ["sst2"], fractions=[1, 0])]}
    shard = plan.plan_grid(spec, {"cache_budget": 10**12}, results_dir=tmp_path, only_seeds=[1])
    assert shard.splitlines()[2].split()[5] == "2" and "total: 2 runs still to run (0 already in" in shard
    assert "one seed per variant" in shard
    run_grid({**spec, "blocks": [GridBlock("original", ["sst2"], fractions=[1])]}, tmp_path, *tiny, progress=False,
             only_seeds=[1])
    after = plan.plan_grid(spec, {"cache_budget": 10**12}, results_dir=tmp_path, only_seeds=[1])
    assert "total: 1 runs still to run (1 already in" in after
    whole = plan.plan_grid(spec, {"cache_budget": 10**12}, results_dir=tmp_path)
    assert "total: 5 runs still to run (1 already in" in whole
