"""Tests for papa_lib.experiments.results: the atomic, resumable results store and the seed summaries (paper Sec. 4)."""

from __future__ import annotations

import json
import math
import os
import platform
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from papa_lib.experiments import damage, results
from papa_lib.experiments.provenance import config_hash, package_versions
from papa_lib.experiments.results import RECORD_FIELDS, ResultsStore, read_results
from papa_lib.experiments.summaries import mean_ci, relative_drop, summarize


def make_record(run_id: str = "r1", **overrides) -> dict:
    """A complete, valid record; overrides replace fields."""
    record = {
        "run_id": run_id,
        "model": "bert-tiny",
        "task": "sst2",
        "matrix_type": "average",
        "matrices_from": "train",
        "selection_order": "by_importance",
        "fraction": 0.5,
        "seed": 0,
        "metric": "accuracy",
        "value": 0.8125,
        "eval_size": 872,
        "train_size": 1000,
        "config_hash": "abc123",
        "profile": "smoke",
        "data_source": "shared/data/sst2",
        "versions": {"python": "3.11", "torch": "2.x"},
        "device": "cpu",
        "wall_time_s": 1.5,
    }
    record.update(overrides)
    return record


# ------------------------------------------------------------------------------------------------ roundtrip


def test_append_has_frame_roundtrip(tmp_path):
    store = ResultsStore(tmp_path / "store")
    assert (tmp_path / "store").is_dir()
    assert not store.has("r1")

    store.append(make_record("r1", value=1 / 3, fraction=1 / 16, finished_at="2024-01-01T00:00:00+00:00"))
    store.append(make_record("r2", seed=1, matrix_type=None, eval_size=None, finished_at="2024-01-01T00:00:01+00:00"))

    assert store.has("r1") and store.has("r2") and not store.has("r3")
    assert len(store) == 2

    frame = store.frame()
    assert list(frame.columns) == list(RECORD_FIELDS)
    assert list(frame["run_id"]) == ["r1", "r2"]
    row1 = frame.iloc[0]
    assert row1["value"] == 1 / 3  # bit-exact through the CSV
    assert row1["fraction"] == 1 / 16
    assert frame["fraction"].dtype == np.float64
    assert frame["seed"].dtype == np.int64
    assert list(frame["seed"]) == [0, 1]
    assert json.loads(row1["versions"]) == {"python": "3.11", "torch": "2.x"}
    assert row1["model"] == "bert-tiny"
    row2 = frame.iloc[1]
    assert row2["matrix_type"] is None
    assert pd.isna(row2["eval_size"])
    assert row1["eval_size"] == 872

    # A fresh store object on the same root sees the same data (nothing held only in memory).
    again = read_results(tmp_path / "store")
    pd.testing.assert_frame_equal(again, frame)


def test_empty_store_frame_has_record_columns(tmp_path):
    frame = ResultsStore(tmp_path).frame()
    assert frame.empty
    assert list(frame.columns) == list(RECORD_FIELDS)
    assert len(ResultsStore(tmp_path)) == 0


def test_finished_at_filled_with_utc_iso(tmp_path):
    store = ResultsStore(tmp_path)
    store.append(make_record("r1"))
    stamp = store.frame().loc[0, "finished_at"]
    parsed = datetime.fromisoformat(stamp)
    assert parsed.utcoffset().total_seconds() == 0


def test_table_text_is_stable_for_git(tmp_path):
    store = ResultsStore(tmp_path)
    # appended out of order: the file is sorted by finished_at, then run_id
    store.append(make_record("b", value=0.1, finished_at="2024-01-02T00:00:00+00:00"))
    store.append(make_record("z", value=2 / 3, finished_at="2024-01-01T00:00:00+00:00"))
    store.append(make_record("a", value=0.5, finished_at="2024-01-02T00:00:00+00:00"))
    lines = (tmp_path / "results.csv").read_text().splitlines()
    assert lines[0] == ",".join(RECORD_FIELDS)
    assert [line.split(",")[0] for line in lines[1:]] == ["z", "a", "b"]
    assert repr(2 / 3) in lines[1]  # full precision, not 0.666667
    before = (tmp_path / "results.csv").read_bytes()
    # rewriting the same content gives the same bytes
    store.append(make_record("a", value=0.5, finished_at="2024-01-02T00:00:00+00:00"), replace=True)
    assert (tmp_path / "results.csv").read_bytes() == before


def test_extra_columns_roundtrip(tmp_path):
    store = ResultsStore(tmp_path)
    store.append(make_record("r1", n_constant_heads=12, note="x", finished_at="2024-01-01T00:00:00+00:00"))
    store.append(make_record("r2", finished_at="2024-01-01T00:00:01+00:00"))
    frame = store.frame()
    assert list(frame.columns) == [*RECORD_FIELDS, "n_constant_heads", "note"]
    assert frame.loc[0, "n_constant_heads"] == 12
    assert pd.isna(frame.loc[1, "n_constant_heads"])
    assert frame.loc[0, "note"] == "x" and frame.loc[1, "note"] is None


def test_duplicate_run_id_rejected_unless_replace(tmp_path):
    store = ResultsStore(tmp_path)
    store.append(make_record("r1", value=0.1))
    with pytest.raises(ValueError, match="already stored"):
        store.append(make_record("r1", value=0.2))
    store.append(make_record("r1", value=0.2), replace=True)
    frame = store.frame()
    assert len(frame) == 1 and frame.loc[0, "value"] == 0.2


# ------------------------------------------------------------------------------------------------ validation


def test_missing_fields_are_named(tmp_path):
    store = ResultsStore(tmp_path)
    record = make_record()
    del record["seed"], record["metric"], record["versions"]
    with pytest.raises(ValueError) as info:
        store.append(record)
    message = str(info.value)
    for field in ("seed", "metric", "versions"):
        assert field in message
    assert "model" not in message
    assert not (tmp_path / "results.csv").exists()


def test_null_core_field_and_bad_values_rejected(tmp_path):
    store = ResultsStore(tmp_path)
    with pytest.raises(ValueError, match="value"):
        store.append(make_record(value=None))
    with pytest.raises(ValueError, match="fraction"):
        store.append(make_record(fraction=1.5))
    with pytest.raises(ValueError, match="seed"):
        store.append(make_record(seed=0.5))
    with pytest.raises(ValueError, match="versions"):
        store.append(make_record(versions="{not json"))
    assert len(store) == 0


def test_damage_before_the_last_line_reports_file_and_line(tmp_path):
    store = ResultsStore(tmp_path)
    store.append(make_record("r1"))
    store.append(make_record("r2", seed=1))
    path = tmp_path / "results.csv"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + "only,three,cells\n" + "".join(lines[1:]))
    with pytest.raises(damage.DamagedStoreError, match=r"results\.csv:2: row has 3 cells") as caught:
        ResultsStore(tmp_path).frame()
    assert caught.value.lines == [2]
    assert path.read_text().count("\n") == 4  # nothing was rewritten


def _torn_store(tmp_path, cut: int = 40):
    """A store of three records whose last line was cut to ``last[:cut]`` (no line end)."""
    store = ResultsStore(tmp_path)
    for i in range(3):
        store.append(make_record(f"r{i}", seed=i))
    path = tmp_path / "results.csv"
    text = path.read_text()
    last = text.rstrip("\n").rsplit("\n", 1)[1]
    path.write_text(text[: len(text) - len(last) - 1] + last[:cut])
    return path, last


@pytest.mark.parametrize("cut", [40, -1])  # too few cells; all cells but the last one cut short (no line end)
def test_torn_final_line_is_set_aside_with_a_notice(tmp_path, capsys, cut):
    path, last = _torn_store(tmp_path, cut)
    store = ResultsStore(tmp_path)
    assert store.run_ids() == ["r0", "r1"]  # the torn run is gone: it will be computed again
    notice = capsys.readouterr().err.strip().splitlines()
    assert len(notice) == 1 and "results.csv (line 4) was cut off" in notice[0]
    sides = sorted(tmp_path.glob("results.csv.torn-*"))
    assert len(sides) == 1 and sides[0].name in notice[0]
    kept = sides[0].read_text()
    assert kept.startswith("# line 4: ") and last[:20] in kept
    assert path.read_text().endswith("\n") and len(path.read_text().splitlines()) == 3
    store.append(make_record("r2", seed=2))  # the run resumes: the record is written again
    assert ResultsStore(tmp_path).run_ids() == ["r0", "r1", "r2"]
    assert capsys.readouterr().err == ""  # healed once


def test_repair_keeps_every_intact_record(tmp_path):
    store = ResultsStore(tmp_path)
    for i in range(4):
        store.append(make_record(f"r{i}", seed=i))
    path = tmp_path / "results.csv"
    lines = path.read_text().splitlines(keepends=True)
    lines[2] = lines[2][:30] + "\n"  # r1 cut short in the middle of the file
    lines[4] = lines[4].replace(",0.5,", ",half,", 1)  # r3: a fraction that is not a number
    path.write_text("".join(lines))
    with pytest.raises(damage.DamagedStoreError, match=r"results\.csv:3:.*1 more damaged"):
        ResultsStore(tmp_path).run_ids()
    kept, damaged, side = ResultsStore(tmp_path).repair()
    assert (kept, damaged) == (2, [3, 5])
    assert ResultsStore(tmp_path).run_ids() == ["r0", "r2"]
    assert (
        side.name.startswith("results.csv.damaged-") and lines[2] in side.read_text() and lines[4] in side.read_text()
    )
    assert ResultsStore(tmp_path).repair() == (2, [], None)


def test_full_disk_during_an_append_loses_no_record(tmp_path, monkeypatch):
    import errno

    store = ResultsStore(tmp_path)
    store.append(make_record("r1"))
    store.append(make_record("r2", seed=1))
    before = (tmp_path / "results.csv").read_bytes()
    real_open = open

    class FullDisk:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def write(self, text):  # half of it lands, then the disk is full
            self.handle.write(text[: len(text) // 2])
            self.handle.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(results, "open", lambda *a, **k: FullDisk(real_open(*a, **k)), raising=False)
    with pytest.raises(OSError, match="No space left on device; could not write .*unchanged") as caught:
        store.append(make_record("r3", seed=2))
    assert caught.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert (tmp_path / "results.csv").read_bytes() == before
    assert _temp_files(tmp_path) == []
    assert ResultsStore(tmp_path).run_ids() == ["r1", "r2"]


def test_read_results_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        read_results(tmp_path / "nope")


# ------------------------------------------------------------------------------------------------ atomicity


def _temp_files(root):
    return [p.name for p in root.iterdir() if p.name not in ("results.csv", results.LOCK_FILENAME)]


def test_failed_replace_leaves_old_table_intact(tmp_path, monkeypatch):
    store = ResultsStore(tmp_path)
    store.append(make_record("r1"))
    store.append(make_record("r2", seed=1))
    before = (tmp_path / "results.csv").read_bytes()

    calls = []

    def exploding_replace(src, dst):
        calls.append((os.fspath(src), os.fspath(dst)))
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(results.os, "replace", exploding_replace)
    with pytest.raises(OSError, match="simulated crash"):
        store.append(make_record("r3", seed=2))
    monkeypatch.undo()

    # the temp file lived next to the table (same filesystem -> atomic rename)
    assert len(calls) == 1
    assert os.path.dirname(calls[0][0]) == str(tmp_path)
    assert calls[0][1] == str(tmp_path / "results.csv")
    assert (tmp_path / "results.csv").read_bytes() == before
    assert _temp_files(tmp_path) == []
    fresh = ResultsStore(tmp_path)
    assert list(fresh.frame()["run_id"]) == ["r1", "r2"]
    assert not fresh.has("r3")


def test_crash_midway_through_write_leaves_old_table_intact(tmp_path, monkeypatch):
    store = ResultsStore(tmp_path)
    store.append(make_record("r1"))
    before = (tmp_path / "results.csv").read_bytes()

    def exploding_fsync(fd):
        raise OSError("simulated power loss during write")

    monkeypatch.setattr(results.os, "fsync", exploding_fsync)
    with pytest.raises(OSError, match="power loss"):
        store.append(make_record("r2", seed=1))
    monkeypatch.undo()

    assert (tmp_path / "results.csv").read_bytes() == before
    assert _temp_files(tmp_path) == []
    assert ResultsStore(tmp_path).run_ids() == ["r1"]
    # and the store keeps working afterwards
    store.append(make_record("r2", seed=1))
    assert ResultsStore(tmp_path).run_ids() == ["r1", "r2"]


def test_crash_on_first_write_leaves_no_table(tmp_path, monkeypatch):
    store = ResultsStore(tmp_path)
    monkeypatch.setattr(results.os, "replace", lambda src, dst: (_ for _ in ()).throw(OSError("boom")))
    with pytest.raises(OSError):
        store.append(make_record("r1"))
    monkeypatch.undo()
    assert not (tmp_path / "results.csv").exists()
    assert store.frame().empty


# ------------------------------------------------------------------------------------------------ statistics


def test_mean_ci_matches_student_t_by_hand():
    values = [0.80, 0.84, 0.85]
    n = 3
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    t_crit = stats.t.ppf(0.975, df=n - 1)
    assert t_crit == pytest.approx(4.30265272974946, rel=1e-12)  # textbook t_{0.975, 2}
    half = t_crit * sd / math.sqrt(n)

    got_mean, low, high = mean_ci(values)
    assert got_mean == pytest.approx(0.83, abs=1e-12)
    assert low == pytest.approx(mean - half, rel=1e-12)
    assert high == pytest.approx(mean + half, rel=1e-12)
    # numbers: sd = 0.026457513..., half width = 0.065722...
    assert high - low == pytest.approx(2 * 4.30265272974946 * 0.02645751311064591 / math.sqrt(3), rel=1e-9)

    _, low90, high90 = mean_ci(values, confidence=0.90)
    assert high90 - low90 < high - low


def test_mean_ci_edge_cases():
    assert mean_ci([0.7]) == (0.7, 0.7, 0.7)  # one seed: degenerate interval
    assert mean_ci(np.array([0.5, 0.5, 0.5])) == (0.5, 0.5, 0.5)
    with pytest.raises(ValueError, match="no values"):
        mean_ci([])
    with pytest.raises(ValueError, match="finite"):
        mean_ci([0.1, float("nan")])
    with pytest.raises(ValueError, match="confidence"):
        mean_ci([0.1, 0.2], confidence=95)


def test_summarize_groups_and_counts():
    df = pd.DataFrame(
        {
            "model": ["m"] * 5,
            "fraction": [1.0, 1.0, 1.0, 0.0, 0.0],
            "seed": [0, 1, 2, 0, 1],
            "value": [0.80, 0.84, 0.85, 0.5, 0.7],
        }
    )
    out = summarize(df, by=["model", "fraction"])
    assert list(out.columns) == ["model", "fraction", "mean", "ci_low", "ci_high", "n"]
    assert list(out["fraction"]) == [0.0, 1.0]
    assert list(out["n"]) == [2, 3]
    expected = mean_ci([0.80, 0.84, 0.85])
    assert tuple(out.iloc[1][["mean", "ci_low", "ci_high"]]) == pytest.approx(expected)
    half2 = stats.t.ppf(0.975, 1) * np.std([0.5, 0.7], ddof=1) / math.sqrt(2)
    assert out.iloc[0]["ci_high"] == pytest.approx(0.6 + half2)

    with pytest.raises(ValueError, match="nope"):
        summarize(df, by=["nope"])


def test_relative_drop_hand_computed():
    rows = []

    def add(model, task, metric, fraction, values, order="by_importance"):
        for seed, v in enumerate(values):
            rows.append(
                dict(
                    model=model, task=task, metric=metric, fraction=fraction, selection_order=order, seed=seed, value=v
                )
            )

    add("A", "sst2", "accuracy", 1.0, [0.9, 0.8])  # baseline mean 0.85
    add("A", "sst2", "accuracy", 0.5, [0.85, 0.85])  # drop 0
    add("A", "sst2", "accuracy", 0.0, [0.6, 0.7])  # mean 0.65, drop 0.2/0.85
    add("A", "sst2", "accuracy", 0.0, [0.425, 0.425], order="random")  # drop 0.5
    add("A", "cola", "mcc", 1.0, [-0.5])  # negative baseline: divide by |base|
    add("A", "cola", "mcc", 0.0, [-0.6])  # drop (-0.5 + 0.6)/0.5 = 0.2
    add("B", "sst2", "accuracy", 1.0, [0.5, 0.7, 0.6])  # baseline 0.6
    add("B", "sst2", "accuracy", 0.0, [0.9])  # improvement: drop -0.5
    df = pd.DataFrame(rows)

    out = relative_drop(df)
    assert list(out.columns) == [
        "model", "task", "metric", "selection_order", "fraction", "mean", "n", "baseline", "relative_drop"
    ]
    lookup = {
        (r.model, r.task, r.fraction, r.selection_order): (r.mean, r.baseline, r.relative_drop, r.n)
        for r in out.itertuples()
    }
    assert len(lookup) == len(out) == 8
    assert lookup[("A", "sst2", 1.0, "by_importance")][1:3] == pytest.approx((0.85, 0.0))
    assert lookup[("A", "sst2", 0.5, "by_importance")][2] == pytest.approx(0.0, abs=1e-12)
    assert lookup[("A", "sst2", 0.0, "by_importance")][0] == pytest.approx(0.65)
    assert lookup[("A", "sst2", 0.0, "by_importance")][2] == pytest.approx(0.2 / 0.85)
    assert lookup[("A", "sst2", 0.0, "by_importance")][3] == 2
    assert lookup[("A", "sst2", 0.0, "random")][2] == pytest.approx(0.5)
    assert lookup[("A", "cola", 0.0, "by_importance")][1:3] == pytest.approx((-0.5, 0.2))
    assert lookup[("B", "sst2", 0.0, "by_importance")][1:3] == pytest.approx((0.6, -0.5))

    # a custom baseline selector
    only_a = df[(df.model == "A") & (df.task == "sst2")]
    custom = relative_drop(only_a, by=["model"], baseline={"fraction": 0.0, "selection_order": "random"})
    full = custom[custom.fraction == 1.0].iloc[0]
    assert full["baseline"] == pytest.approx(0.425)
    assert full["relative_drop"] == pytest.approx((0.425 - 0.85) / 0.425)
    # B has no fraction-0.5 rows: its group has no baseline
    with pytest.raises(ValueError, match="no baseline rows"):
        relative_drop(df, baseline={"fraction": 0.5})


def test_relative_drop_errors():
    df = pd.DataFrame({"model": ["A", "A"], "task": ["t", "t"], "fraction": [1.0, 0.0], "value": [0.0, 0.1]})
    with pytest.raises(ValueError, match="baseline mean is 0"):
        relative_drop(df)
    with pytest.raises(ValueError, match="fraction"):
        relative_drop(df.drop(columns="fraction"))


def test_relative_drop_and_summarize_on_store_frame(tmp_path):
    store = ResultsStore(tmp_path)
    for seed, (fraction, value) in enumerate([(1.0, 0.9), (1.0, 0.8), (0.0, 0.68)]):
        store.append(make_record(f"r{seed}", seed=seed, fraction=fraction, value=value))
    frame = store.frame()
    drop = relative_drop(frame)
    row = drop[drop.fraction == 0.0].iloc[0]
    assert row["relative_drop"] == pytest.approx((0.85 - 0.68) / 0.85)
    summary = summarize(frame, by=["model", "task", "fraction"])
    assert list(summary["n"]) == [1, 2]


# ------------------------------------------------------------------------------------------------ provenance


def test_config_hash_stable_and_sensitive():
    config = {"model": "bert", "task": "sst2", "fraction": 1 / 16, "seed": 0, "heads": [1, 2], "opt": {"lr": 2e-5}}
    h = config_hash(config)
    assert len(h) == 16 and all(c in "0123456789abcdef" for c in h)
    assert config_hash(dict(reversed(list(config.items())))) == h  # key order irrelevant
    assert config_hash({**config, "fraction": 0.0625}) == h  # 1/16 is exactly 0.0625
    assert config_hash({**config, "heads": (1, 2)}) == h  # tuple == list
    assert config_hash({"fraction": 1}) == config_hash({"fraction": 1.0})
    # pinned value: same across processes and sessions (sha256 of canonical JSON, not Python's hash())
    assert config_hash({"a": 1, "b": [0.5, "x"]}) == "d9dda6d0c61c7433"

    variants = [
        {**config, "fraction": 1 / 8},
        {**config, "seed": 1},
        {**config, "heads": [2, 1]},
        {**config, "opt": {"lr": 3e-5}},
        {**config, "extra": None},
        {k: v for k, v in config.items() if k != "seed"},
    ]
    hashes = {config_hash(v) for v in variants}
    assert h not in hashes and len(hashes) == len(variants)

    with pytest.raises(ValueError, match="type object"):
        config_hash({"bad": object()})
    with pytest.raises(ValueError, match="dict"):
        config_hash(["not", "a", "dict"])


def test_package_versions_json():
    versions = json.loads(package_versions())
    assert set(versions) == {"python", "torch", "transformers", "papa_lib"}
    assert versions["python"] == platform.python_version()
    assert all(isinstance(v, str) and v for v in versions.values())
    import transformers

    assert versions["transformers"] == transformers.__version__


def test_merge_adds_only_unknown_runs(tmp_path):
    main, shard = ResultsStore(tmp_path / "main"), ResultsStore(tmp_path / "shard")
    main.append(make_record("a", value=0.5))
    shard.append(make_record("a", value=0.9))  # same run id: the stored one wins
    shard.append(make_record("b", value=0.7))
    assert main.merge(shard) == 1
    frame = main.frame().set_index("run_id")
    assert frame.loc["a", "value"] == 0.5 and frame.loc["b", "value"] == 0.7
    assert main.merge(tmp_path / "shard") == 0


# ------------------------------------------------------------------------------------------------ parallel writers

def _append_many(root: str, writer: int, count: int) -> None:
    store = ResultsStore(root)
    for i in range(count):
        store.append(make_record(f"w{writer}-{i}", seed=i))


@pytest.mark.skipif(os.name != "posix", reason="forks writer processes")
def test_parallel_writers_lose_no_record(tmp_path):
    """Processes appending to one store at once (grid shards, lanes): every record lands, the table stays whole."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_append_many, args=(str(tmp_path), w, 15)) for w in range(4)]
    for process in writers:
        process.start()
    for process in writers:
        process.join(60)
        assert process.exitcode == 0
    store = ResultsStore(tmp_path)
    assert sorted(store.run_ids()) == sorted(f"w{w}-{i}" for w in range(4) for i in range(15))
    assert len(store.frame()) == 60


def test_a_run_finished_twice_keeps_the_first_record(tmp_path):
    first, second = ResultsStore(tmp_path), ResultsStore(tmp_path)  # two lanes writing one folder
    assert first.append(make_record("r1", value=0.5)) is True
    assert second.append(make_record("r1", value=0.9), exist_ok=True) is False
    assert first.get("r1")["value"] == 0.5 and len(first) == 1
    with pytest.raises(ValueError, match="already stored"):
        second.append(make_record("r1", value=0.9))


def test_records_from_before_average_limit_read_as_all(tmp_path):
    store = ResultsStore(tmp_path)
    store.append(make_record("old"))
    store.append(make_record("new", seed=1, average_limit=5000))
    store.append(make_record("full", seed=2, average_limit="all"))
    assert list(store.frame()["average_limit"]) == ["all", 5000, "all"]


@pytest.mark.parametrize("folder", ["local-minilm", "norms-minilm"])
def test_grid_headers_say_what_their_records_hold(folder):
    """A grid file's "What results.csv holds" line states the record count and devices its records have."""
    import re

    import pandas as pd

    root = Path(__file__).resolve().parents[1] / "data" / "results" / folder
    header = " ".join(line.lstrip("# ") for line in (root / "grid.yaml").read_text().splitlines()
                      if line.startswith("#"))
    stated = re.search(r"What results\.csv holds \([^)]*\)[^:]*: (\d+) records", header)
    assert stated, f"{folder}/grid.yaml: no 'What results.csv holds' line"
    records = pd.read_csv(root / "results.csv")
    assert int(stated.group(1)) == len(records)
    if set(records.device) == {"cpu"}:
        assert "CPU" in header[stated.end():stated.end() + 400]
    if folder == "norms-minilm":  # decision rule R15: PAPA's own seeds and training rows
        assert "seeds 0-2 and PAPA's own training rows" in header and sorted(records.seed.unique()) == [0, 1, 2]
        local = pd.read_csv(root.parent / "local-minilm" / "results.csv")
        papa_rows = local.groupby(["task", "seed"]).train_size.agg(set)
        for (task, seed), sizes in records.groupby(["task", "seed"]).train_size.agg(set).items():
            assert sizes == papa_rows[(task, seed)], (task, seed)


def test_declared_version_check_reruns_equal_their_records():
    """Decision rule R9: the sample of old-version records rerun on the current versions (same run ids) differs from
    the committed values by less than their configuration's seed spread (here: not at all)."""
    import pandas as pd

    root = Path(__file__).resolve().parents[1] / "data" / "results"
    rerun = pd.read_csv(root / "version-check" / "results.csv")
    local = pd.read_csv(root / "local-minilm" / "results.csv")
    pairs = rerun.merge(local[["run_id", "value", "versions"]], on="run_id", suffixes=("", "_committed"))
    assert len(pairs) == len(rerun) == 9
    assert pairs.versions_committed.str.contains('"transformers": "5.23.0"').all()  # the sample: old-version rows
    assert pairs.versions.str.contains('"transformers": "5.24.0"').all()
    keys = ["task", "matrix_type", "fraction", "selection_order"]
    spread = local.fillna({"selection_order": "none"}).groupby(keys).value.std()
    for _, row in pairs.fillna({"selection_order": "none"}).iterrows():
        assert abs(row.value - row.value_committed) < spread[tuple(row[k] for k in keys)]
