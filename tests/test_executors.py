"""Grids on a Ray cluster (papa_lib.ops.executors): a real local Ray instance with two CPUs, a tiny random
model and generated data. The Ray executor gives the local executor's records run for run (same run ids, same
values for the same seeds with one torch thread on both sides), computes shared work (constant matrices, head
scores, a variant's features) once, survives a killed worker and resumes after a stopped driver."""

from __future__ import annotations

import importlib.util
import os
import signal
from pathlib import Path

import pandas as pd
import pytest
import torch

from papa_lib import cli, smoke
from papa_lib.core import models
from papa_lib.core.averaging import average_attention
from papa_lib.experiments import engine, features, matrices, rankings, results
from papa_lib.experiments.grid import GridBlock, grid_settings, task_config
from papa_lib.experiments.variants import Variant
from papa_lib.ops import executors

_skip = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install -e '.[ray]')"
)


def needs_ray(test):
    """A test on a real local Ray instance (markers ``ray`` and ``slow``), skipped where ray is not installed."""
    return pytest.mark.slow(pytest.mark.ray(_skip(test)))


#: Fields that describe the machine or the moment, not the run.
MACHINE = ("wall_time_s", "peak_memory_mb", "finished_at")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return smoke.generate_data_dir(tmp_path_factory.mktemp("data"), n_train=24, n_dev=12)


def comparable(store: results.ResultsStore) -> pd.DataFrame:
    frame = store.frame().set_index("run_id").sort_index()
    return frame.drop(columns=list(MACHINE))


def small_grid(data_dir, blocks=None) -> dict:
    return {"data_dir": str(data_dir), "profile": "smoke", "seeds": [0, 1], "max_length": {"default": 16, "mnli": 32},
            "epochs": 1, "lambda_epochs": 1, "inloop_epochs": 1,
            "blocks": blocks or [GridBlock("fig2", ["sst2"], fractions=[1, 0.5, 0]),
                                 GridBlock("table2", ["cola"], matrices_from="mnli", fractions=[0]),
                                 GridBlock("table1", ["pos"], matrix_types=["identity", "trainable_average"],
                                           fractions=[0])]}


# ------------------------------------------------------------------------------------------ without a cluster
def test_plan_groups_runs_into_tasks(tiny, data_dir, tmp_path):
    model, tokenizer = tiny
    spec = small_grid(data_dir, [GridBlock("a", ["sst2"], orders=["lambda", "first_to_last"], fractions=[1, 0.5])])
    settings, seeds = grid_settings(spec)
    plan = executors.plan_grid_units(spec, tmp_path, model, tokenizer, settings, seeds)
    units = {(u.variant.selection_order, u.seeds): u for u in plan.units}
    assert plan.total == 6 and plan.finished == 0 and len(plan.units) == 6
    assert plan.constants == {"sst2": [(None, "average")]}
    first, second = units[("first_to_last", (0,))], units[("first_to_last", (1,))]
    assert first.keep and second.keep and first.features == second.features and first.after is None
    assert plan.units[second.after] is first  # the second seed reads the features the first one caches
    assert units[("lambda", (0,))].features != units[("lambda", (1,))].features and not units[("lambda", (0,))].keep
    assert first.store_seeds == second.store_seeds == (0, 1)  # both read one store over both seeds' rows
    # over the cache budget the seeds stream in one pass, in one task
    settings["cache_budget"] = 0
    streamed = executors.plan_grid_units(spec, tmp_path, model, tokenizer, settings, seeds)
    assert {u.seeds for u in streamed.units if u.variant.selection_order == "first_to_last"} == {(0, 1)}
    # run ids are the engine's
    experiment = engine.TaskExperiment(task_config(settings, "sst2", seeds), model, tokenizer, progress=False)
    assert first.run_ids == (engine.run_id(experiment, Variant.make("average", "first_to_last", 0.5), 0),)


def test_executor_options(capsys, tmp_path, monkeypatch):
    assert isinstance(executors.make_executor("local"), executors.LocalExecutor)
    assert executors.make_executor("ray", address="auto", cpus_per_run=2).cpus_per_run == 2
    with pytest.raises(ValueError, match="need --executor ray"):
        executors.make_executor("local", address="auto")
    grid = tmp_path / "grid.yaml"
    grid.write_text("seeds: 1\nblocks:\n  - {name: a, tasks: [sst2], fractions: [1]}\n")
    assert cli.main(["grid", str(grid), "--address", "auto"]) == 2
    assert capsys.readouterr().err.strip() == "papa: error: --address only applies to --executor ray"
    assert cli.main(["grid", str(grid), "--executor", "ray", "--gpus-per-run", "-1"]) == 2
    assert "expected zero or more" in capsys.readouterr().err
    monkeypatch.setitem(__import__("sys").modules, "ray", None)  # as if Ray were not installed
    monkeypatch.setattr(models, "load_encoder", lambda *a, **k: smoke.tiny_encoder("bert"))
    data = smoke.generate_data_dir(tmp_path / "data", n_train=8, n_dev=4)
    assert cli.main(["grid", str(grid), "--executor", "ray", "--data-dir", str(data), "--max-length", "16"]) == 2
    assert "the ray executor needs Ray: pip install -e \".[ray]\"" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ on a local Ray cluster
@needs_ray
def test_cli_grid_on_ray_gives_the_local_records(tmp_path, data_dir, monkeypatch):
    """``papa grid FILE --executor ray`` starts its own local Ray instance and reproduces ``--executor local``."""
    monkeypatch.setattr(models, "load_encoder", lambda *a, **k: smoke.tiny_encoder("bert"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    grid = tmp_path / "grid.yaml"
    grid.write_text("seeds: 2\nmax_length: 16\nepochs: 1\nlambda_epochs: 1\n"
                    "blocks:\n  - {name: a, tasks: [sst2], orders: [lambda, first_to_last], fractions: [1, 0.5]}\n")
    common = ["grid", str(grid), "--data-dir", str(data_dir)]
    assert cli.main(common + ["--results-dir", str(tmp_path / "local")]) == 0
    assert cli.main(common + ["--results-dir", str(tmp_path / "ray"), "--executor", "ray", "--cpus-per-run", "1"]) == 0
    local, ray_store = results.ResultsStore(tmp_path / "local"), results.ResultsStore(tmp_path / "ray")
    assert len(local) == 6
    pd.testing.assert_frame_equal(comparable(local), comparable(ray_store))
    assert not list(tmp_path.glob("ray/.papa-ray-check-*")) and not any((tmp_path / "ray" / "features").iterdir())


@needs_ray
def test_cuda_runs_must_ask_for_gpus(tiny, data_dir, tmp_path):
    model, tokenizer = tiny
    spec = dict(small_grid(data_dir, [GridBlock("a", ["sst2"], fractions=[1])]), device="cuda")
    with pytest.raises(ValueError, match="device cuda needs GPUs per run .*--gpus-per-run 1"):
        executors.RayExecutor().run_grid(spec, tmp_path, model, tokenizer, progress=False)


@pytest.fixture(scope="module")
def cluster():
    """A real local Ray instance with two CPUs, shared by the tests below (the executor reuses it)."""
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


@pytest.fixture
def counted(tmp_path):
    """A constant builder and a head ranking that log each call to a file (registered in the driver: Ray workers
    get the driver's registries), to count how often shared work runs."""
    where = {"log": tmp_path / "calls.log"}

    def counting_builder(model, batches, **kwargs):
        with open(where["log"], "a") as log:
            log.write("constants\n")
        return average_attention(model, batches, **kwargs)

    def counted_scores(experiment, matrices_from, seed):
        with open(where["log"], "a") as log:
            log.write(f"scores {seed}\n")
        return torch.rand(experiment.layers, experiment.heads, generator=torch.Generator().manual_seed(seed))

    matrices.register_constant_builder("counting", packed=True)(counting_builder)
    matrices.register_matrix_type("counted", "constant", constants="counting")
    rankings.register_head_ranking("counted", counted_scores)
    yield where
    matrices.CONSTANT_BUILDERS.pop("counting")
    matrices.MATRIX_TYPES.pop("counted")
    rankings.HEAD_RANKINGS.pop("counted")


def calls(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@needs_ray
def test_ray_records_equal_local_and_shared_work_runs_once(cluster, tiny, data_dir, tmp_path, counted):
    model, tokenizer = tiny
    blocks = small_grid(data_dir)["blocks"] + [
        GridBlock(
            "mine", ["sst2"], matrix_types=["counted"], orders=["counted", "first_to_last"], fractions=[0.5, 0.25]
        )
    ]
    spec = small_grid(data_dir, blocks)
    counted["log"] = tmp_path / "local.log"
    local = executors.LocalExecutor().run_grid(spec, tmp_path / "local", model, tokenizer, progress=False)
    counted["log"] = tmp_path / "ray.log"
    feature_log = tmp_path / "features.log"

    def log_backbone_passes(unit):  # runs in the worker: log every backbone pass with the unit that made it
        if not getattr(features.BackboneRunner.rows, "logged", False):
            original = features.BackboneRunner.rows

            def rows(self, *args, **kwargs):
                with open(feature_log, "a") as log:
                    log.write(f"{os.environ['PAPA_UNIT']}\n")
                return original(self, *args, **kwargs)

            rows.logged = True
            features.BackboneRunner.rows = rows
        os.environ["PAPA_UNIT"] = f"{unit.variant.matrix_type} {unit.variant.selection_order} " \
                                  f"{unit.variant.fraction:g} {unit.seeds}"

    executor = executors.RayExecutor(cpus_per_run=1, before_run=log_backbone_passes)
    on_ray = executor.run_grid(spec, tmp_path / "ray", model, tokenizer, progress=False)
    assert len(local) == 2 * (3 + 1 + 2 + 4) == len(on_ray)
    pd.testing.assert_frame_equal(comparable(local), comparable(on_ray))
    # shared work ran once: the constants of each source, the scores of each seed (locally: per variant)
    assert sorted(calls(tmp_path / "ray.log")) == ["constants", "scores 0", "scores 1"]
    assert sorted(calls(tmp_path / "local.log")) == ["constants", "scores 0", "scores 0", "scores 1", "scores 1"]
    assert len(list((tmp_path / "ray" / "lambdas").glob("*.safetensors"))) == 2  # sst2's λ per seed
    # a seed-independent variant's features: one train and one validation pass, by its first seed's run
    passes = calls(feature_log)
    assert (
        sorted(p for p in passes if p.startswith("counted first_to_last 0.5")) == ["counted first_to_last 0.5 (0,)"] * 2
    )
    assert not any((tmp_path / "ray" / "features").iterdir())  # deleted once its runs were done


@needs_ray
def test_a_killed_worker_is_retried_and_costs_nothing(cluster, tiny, data_dir, tmp_path):
    model, tokenizer = tiny
    spec = small_grid(data_dir, [GridBlock("a", ["sst2"], orders=["lambda"], fractions=[0.5, 0])])
    local = executors.LocalExecutor().run_grid(spec, tmp_path / "local", model, tokenizer, progress=False)
    marker = tmp_path / "killed"

    def kill_once(unit):  # the first run to start kills its own worker process, once
        if unit.variant.fraction == 0.5 and unit.seeds == (1,) and not marker.exists():
            marker.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)

    on_ray = executors.RayExecutor(before_run=kill_once).run_grid(spec, tmp_path / "ray", model, tokenizer,
                                                                  progress=False)
    assert marker.exists()
    assert on_ray.run_ids() and len(on_ray) == len(local) == 4  # each record once
    pd.testing.assert_frame_equal(comparable(local), comparable(on_ray))


@needs_ray
def test_a_stopped_driver_resumes_losing_nothing(cluster, tiny, data_dir, tmp_path, monkeypatch):
    model, tokenizer = tiny
    spec = small_grid(data_dir, [GridBlock("a", ["sst2", "ner"], orders=["first_to_last"], fractions=[1, 0.5])])
    local = executors.LocalExecutor().run_grid(spec, tmp_path / "local", model, tokenizer, progress=False)
    folder = tmp_path / "ray"
    appended = []
    original = results.ResultsStore.append

    def append_then_stop(self, record, **kwargs):  # Ctrl-C in the driver after three records
        original(self, record, **kwargs)
        appended.append(record["run_id"])
        if len(appended) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(results.ResultsStore, "append", append_then_stop)
    with pytest.raises(KeyboardInterrupt):
        executors.RayExecutor().run_grid(spec, folder, model, tokenizer, progress=False)
    monkeypatch.setattr(results.ResultsStore, "append", original)
    kept = comparable(results.ResultsStore(folder))
    assert list(kept.index) == sorted(appended)
    started = tmp_path / "started.log"

    def log_start(unit):
        with open(started, "a") as log:
            log.write(" ".join(unit.run_ids) + "\n")

    executors.RayExecutor(before_run=log_start).run_grid(spec, folder, model, tokenizer, progress=False)
    rerun = {run_id for line in calls(started) for run_id in line.split()}
    assert rerun == set(local.run_ids()) - set(appended)  # the finished runs are not run again
    pd.testing.assert_frame_equal(comparable(local), comparable(results.ResultsStore(folder)))
    finished = results.ResultsStore(folder).frame().set_index("run_id")
    assert all(finished.loc[run_id, "finished_at"] for run_id in appended)
    # a third start finds nothing to do and starts no task
    executors.RayExecutor(before_run=log_start).run_grid(spec, folder, model, tokenizer, progress=False)
    assert len(calls(started)) == len(rerun)


@needs_ray
def test_workers_that_cannot_see_the_results_folder_are_named(cluster, tiny, data_dir, tmp_path, monkeypatch):
    model, tokenizer = tiny
    spec = small_grid(data_dir, [GridBlock("a", ["sst2"], fractions=[1])])
    monkeypatch.setattr(executors, "write_token", lambda folder, token: Path(folder) / "nothing-written")
    with pytest.raises(FileNotFoundError, match="do not see the results folder .* file system all nodes mount"):
        executors.RayExecutor().run_grid(spec, tmp_path / "ray", model, tokenizer, progress=False)
    assert len(results.ResultsStore(tmp_path / "ray")) == 0


@needs_ray
def test_a_failing_run_keeps_the_others_and_a_shard_runs_its_seeds(cluster, tiny, data_dir, tmp_path):
    model, tokenizer = tiny
    spec = small_grid(data_dir, [GridBlock("a", ["sst2"], orders=["lambda"], fractions=[0.5, 0])])
    local = executors.LocalExecutor().run_grid(spec, tmp_path / "local", model, tokenizer, progress=False)

    def fail(unit):
        if unit.variant.fraction == 0 and unit.seeds == (1,):
            raise ValueError("this run cannot go on")

    with pytest.raises(ValueError, match="this run cannot go on"):
        executors.RayExecutor(before_run=fail).run_grid(spec, tmp_path / "ray", model, tokenizer, progress=False)
    stored = comparable(results.ResultsStore(tmp_path / "ray"))
    assert len(stored) == 3
    pd.testing.assert_frame_equal(stored, comparable(local).loc[stored.index])
    # a shard (--only-seed 1) in another folder: the seed's records, equal to the full grid's
    shard = executors.RayExecutor().run_grid(spec, tmp_path / "shard", model, tokenizer, progress=False,
                                             only_seeds=[1])
    assert set(shard.frame().seed) == {1}
    pd.testing.assert_frame_equal(comparable(shard), comparable(local).loc[comparable(shard).index])
