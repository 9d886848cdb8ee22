"""GPU-made records against their CPU reruns (papa_lib.ops.devices): synthetic frames and the committed folders."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from papa_lib.ops.devices import config_label, device_check, device_summary

ROOT = Path(__file__).resolve().parents[1]
LOCAL = ROOT / "data" / "results" / "local-minilm"
CHECK = ROOT / "data" / "results" / "device-check"
GPU = ROOT / "data" / "results" / "local-minilm-gpu"  # the GPU-made records the reruns replaced


def _committed():
    """local-minilm as the check saw it: the GPU-made records back in place, seeds 0-2."""
    from papa_lib.ops.devices import as_committed

    return as_committed(LOCAL, GPU, seeds=(0, 1, 2))


def _record(run_id, task, matrix_type, fraction, seed, value, device, matrices_from=None, order="none"):
    return {"run_id": run_id, "task": task, "matrix_type": matrix_type, "fraction": fraction, "seed": seed,
            "value": value, "device": device, "matrices_from": matrices_from, "selection_order": order}


def _local() -> pd.DataFrame:
    return pd.DataFrame([
        _record("o0", "cola", "original", 1.0, 0, 0.20, "cuda"),
        _record("o1", "cola", "original", 1.0, 1, 0.30, "cuda:0"),
        _record("o2", "cola", "original", 1.0, 2, 0.40, "cuda"),
        _record("a0", "cola", "average", 0.0, 0, 0.10, "cuda", "cola"),
        _record("a1", "cola", "average", 0.0, 1, 0.12, "cuda", "cola"),
        _record("a2", "cola", "average", 0.0, 2, 0.08, "cpu", "cola"),  # made on the CPU already
        _record("m0", "cola", "average", 0.0, 0, 0.50, "cuda", "mnli"),  # not rerun
    ])


def _check() -> pd.DataFrame:
    return pd.DataFrame([
        _record("o0", "cola", "original", 1.0, 0, 0.25, "cpu"),
        _record("o1", "cola", "original", 1.0, 1, 0.29, "cpu"),
        _record("o2", "cola", "original", 1.0, 2, 0.40, "cpu"),
        _record("a0", "cola", "average", 0.0, 0, 0.30, "cpu", "cola"),
        _record("a1", "cola", "average", 0.0, 1, 0.12, "cpu", "cola"),
        _record("a2", "cola", "average", 0.0, 2, 0.081, "cpu", "cola"),
    ])


def test_device_check_pairs_gpu_rows_with_their_reruns():
    check = device_check(_local(), _check())
    # only GPU-made committed rows that were rerun: three originals and two averages (a2 ran on the CPU, m0 not rerun)
    assert sorted(check["run_id"]) == ["a0", "a1", "o0", "o1", "o2"]
    original = check[check["config"] == "original"].set_index("seed")
    assert original.loc[0, "gpu"] == pytest.approx(0.20) and original.loc[0, "cpu"] == pytest.approx(0.25)
    assert original.loc[0, "difference"] == pytest.approx(0.05)
    assert original.loc[1, "difference"] == pytest.approx(-0.01)
    sd = float(np.std([0.20, 0.30, 0.40], ddof=1))
    assert original["seed_sd"].tolist() == pytest.approx([sd] * 3)
    assert original.loc[0, "half_width"] == pytest.approx(stats.t.ppf(0.975, 2) * sd / math.sqrt(3))
    assert original.loc[0, "ratio"] == pytest.approx(0.05 / sd)
    # the spread of the average counts every committed seed, the CPU-made one too
    average = check[check["config"] == "average 0"]
    assert average["seed_sd"].iloc[0] == pytest.approx(float(np.std([0.10, 0.12, 0.08], ddof=1)))
    assert average["n_seeds"].iloc[0] == 3


def test_device_check_every_device_and_summary():
    every = device_check(_local(), _check(), committed_devices=None)
    assert "a2" in set(every["run_id"]) and set(every["committed_device"]) == {"cuda", "cuda:0", "cpu"}
    summary = device_summary(device_check(_local(), _check())).set_index("config")
    # original: |differences| 0.05, 0.01, 0 against sd 0.1 -> below; average: 0.2 against sd 0.02 -> not below
    assert bool(summary.loc["original", "below_spread"]) is True
    assert summary.loc["original", "max_abs_difference"] == pytest.approx(0.05)
    assert summary.loc["original", "mean_difference"] == pytest.approx((0.05 - 0.01 + 0.0) / 3)
    paired = np.array([0.05, -0.01, 0.0])
    assert summary.loc["original", "difference_half_width"] == pytest.approx(
        stats.t.ppf(0.975, 2) * np.std(paired, ddof=1) / math.sqrt(3))
    assert summary.loc["original", "cpu_sd"] == pytest.approx(float(np.std([0.25, 0.29, 0.40], ddof=1)))
    assert bool(summary.loc["average 0", "below_spread"]) is False
    assert summary.loc["average 0", "max_ratio"] == pytest.approx(0.2 / 0.02)
    assert device_summary(device_check(_local(), _check().iloc[0:0])).empty


def test_config_labels():
    assert config_label(_record("x", "cola", "original", 1.0, 0, 0, "cpu")) == "original"
    assert config_label(_record("x", "cola", "average", 0.0, 0, 0, "cpu", "cola")) == "average 0"
    assert config_label(_record("x", "cola", "average", 0.0, 0, 0, "cpu", "mnli")) == "average from mnli 0"
    assert config_label(_record("x", "cola", "average", 0.5, 0, 0, "cpu", "cola", "lambda")) == "average lambda 0.5"


def test_missing_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no results.csv"):
        device_check(tmp_path, tmp_path)


@pytest.mark.skipif(not (CHECK / "results.csv").is_file(), reason="no device-check records committed")
def test_committed_reruns_pair_with_gpu_records():
    from papa_lib.experiments.results import read_results

    local, rerun = _committed(), read_results(CHECK)
    assert set(rerun["device"].astype(str)) == {"cpu"}
    # the same grid settings give the same run ids: every rerun has its committed record
    assert set(rerun["run_id"]) <= set(local["run_id"])
    check = device_check(local, CHECK, committed_devices=None)
    assert len(check) == len(rerun)
    committed = local.set_index("run_id")["value"]
    assert check["gpu"].tolist() == pytest.approx(committed.loc[check["run_id"]].tolist())
    assert np.isfinite(check["difference"]).all() and (check["seed_sd"] > 0).all()
    gpu_made = device_check(local, CHECK)
    assert len(gpu_made) > 0 and set(gpu_made["committed_device"].str[:4]) == {"cuda"}
    # the replacement: local-minilm now holds the CPU reruns in place of the GPU-made records they repeat
    now = read_results(LOCAL).set_index("run_id")
    assert set(now.loc[rerun["run_id"], "device"].astype(str)) == {"cpu"}
    assert set(gpu_made["run_id"]) <= set(read_results(GPU)["run_id"])
    assert now.loc[rerun["run_id"], "value"].tolist() == rerun["value"].tolist()


@pytest.mark.skipif(not (CHECK / "results.csv").is_file(), reason="no device-check records committed")
def test_benchmarks_table_matches_the_records():
    """BENCHMARKS.md's "CPU rerun of GPU-made rows" table says what device_summary computes from the records."""
    text = (ROOT / "BENCHMARKS.md").read_text()
    section = text[text.index("## CPU rerun of GPU-made rows"):]
    section = section[:section.index("\n## ")] if "\n## " in section else section  # that section alone
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| task")]
    summary = device_summary(device_check(_committed(), CHECK)).set_index(["task", "config"])
    assert {(r[0], r[1]) for r in rows} == set(summary.index)
    for task, config, _, mean, _, ratio, below in rows:
        row = summary.loc[(task, config)]
        assert float(mean.split("±")[0]) == pytest.approx(row["mean_difference"], abs=1e-4)
        assert float(ratio) == pytest.approx(row["max_ratio"], abs=0.01)
        assert below == ("yes" if row["below_spread"] else "no")


PROCESSOR_CHECK = ROOT / "data" / "results" / "processor-check"


@pytest.mark.skipif(not (PROCESSOR_CHECK / "results.csv").is_file(), reason="no processor-check records committed")
def test_another_processor_repeats_frozen_runs_exactly_and_moves_a_lambda_run_less_than_a_seed():
    """The committed processor check: CPU-made records of local-minilm rerun on another processor (same run ids).
    The frozen path (features, probes) gives the same value to the last bit; the λ-ordered run moves, by less than a
    change of seed does, because the committed record ranks its heads by λ learned on the H100: the AMD CPU's own λ
    differs from that file, and the Intel CPU learning its own gives the AMD value to the last bit (BENCHMARKS.md,
    "Another processor, and where λ was learned")."""

    from papa_lib.experiments.results import read_results

    local, rerun = read_results(LOCAL), read_results(PROCESSOR_CHECK)
    assert set(rerun["run_id"]) <= set(local["run_id"])
    made = local.set_index("run_id").loc[rerun["run_id"], "processor"].astype(str)
    assert set(made) == {"Intel(R) Xeon(R) Processor"} and set(rerun["processor"].astype(str)) == {"AMD EPYC"}
    check = device_check(local, PROCESSOR_CHECK, committed_devices=None)
    assert len(check) == len(rerun) == 8
    frozen = check[check["selection_order"] == "none"]
    assert len(frozen) == 7 and (frozen["difference"] == 0).all()  # bit for bit
    learned = check[check["selection_order"] == "lambda"]
    assert len(learned) == 1 and 0 < learned["ratio"].iloc[0] < 1
    from papa_lib.experiments.workspace import read_lambdas

    name = "cola-from-cola-3b64ba7295ce9b06.safetensors"
    mine, theirs = read_lambdas(PROCESSOR_CHECK / "lambdas" / name), read_lambdas(LOCAL / "lambdas" / name)
    other_seed = read_lambdas(LOCAL / "lambdas" / "cola-from-cola-2c45f1a2be68aead.safetensors")
    assert 0 < (mine - theirs).abs().mean() < (other_seed - theirs).abs().mean() / 2
