"""The ``papa`` command for people (issue 11): one-line user errors with exit status 2 (a traceback only with
--debug), ``papa bench`` options passed through, and tasks of your own (``--task custom`` and a grid's
``custom_tasks:``) probed end to end on generated TSV and CSV files with a tiny random encoder."""

from __future__ import annotations

import csv
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from papa_lib import cli, smoke
from papa_lib.book import profiles
from papa_lib.core import models
from papa_lib.experiments import engine, metrics, results, summaries, task_specs, tasks, variants, workspace
from papa_lib.experiments.custom import CustomTask, register_custom_task
from papa_lib.experiments.grid import load_grid
from papa_lib.ops import bench

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def restore_tasks(monkeypatch):
    """Custom tasks register themselves in the global TASKS: put the paper's six back after each test."""
    saved = dict(task_specs.TASKS)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    yield
    task_specs.TASKS.clear()
    task_specs.TASKS.update(saved)


@pytest.fixture
def tiny(monkeypatch):
    """Every model the command loads is the tiny random BERT (160 positions)."""
    monkeypatch.setattr(models, "load_encoder", lambda *a, **k: smoke.tiny_encoder("bert"))


def _rows(n: int, seed: int, pair: bool):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        word = rng.choice(["good", "great", "funny"] if label == "pos" else ["bad", "dull", "awful"])
        text = f"the film was {word}, really"
        rows.append((text, f"a {word} story", label) if pair else (text, label))
    return rows


def write_tsv(path: Path, rows, header=("review", "summary", "sentiment")) -> Path:
    path.write_text("\t".join(header) + "\n" + "".join("\t".join(row) + "\n" for row in rows))
    return path


def write_csv(path: Path, rows, header=("text", "label")) -> Path:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


@pytest.fixture
def pair_files(tmp_path):
    return (write_tsv(tmp_path / "train.tsv", _rows(24, 0, True)), write_tsv(tmp_path / "dev.tsv", _rows(10, 1, True)))


PAIR = ["--text-columns", "review,summary", "--label-column", "sentiment"]
QUICK = ["--max-length", "16", "--epochs", "1", "--seeds", "1", "--fraction", "1"]


def papa_error(capsys, argv) -> str:
    """Run ``papa argv``, expect a user error; return its one line (checked: exit 2, no traceback)."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.startswith("papa: error: ")]
    assert len(lines) == 1, err
    return lines[0]


# ------------------------------------------------------------------ user errors: one line, exit 2, no traceback
def test_malformed_row_names_file_and_line(capsys, tmp_path, pair_files):
    bad = tmp_path / "bad.tsv"
    bad.write_text("review\tsummary\tsentiment\nthe film\tok\tpos\nbroken row\tneg\n")
    line = papa_error(
        capsys, ["probe", "--task", "custom", "--train", str(bad), "--validation", str(pair_files[1]), *PAIR]
    )
    assert line == f"papa: error: expected 3 tab-separated fields (as in the header), found 2 ({bad}:3)"


def test_empty_training_files_are_caught_at_load_time(capsys, tmp_path, pair_files):
    empty = tmp_path / "empty.tsv"
    empty.write_text("")
    line = papa_error(
        capsys, ["probe", "--task", "custom", "--train", str(empty), "--validation", str(pair_files[1]), *PAIR]
    )
    assert line == f"papa: error: file is empty (expected a header row) ({empty})"
    header_only = write_tsv(tmp_path / "header.tsv", [])
    line = papa_error(
        capsys, ["probe", "--task", "custom", "--train", str(header_only), "--validation", str(pair_files[1]), *PAIR]
    )
    assert line == f"papa: error: the training set of custom is empty: the file has no examples ({header_only})"


def test_empty_validation_set_of_a_paper_task_names_the_file(capsys, tmp_path, tiny):
    data = smoke.generate_data_dir(tmp_path / "data", n_train=8, n_dev=4)
    dev = data / "glue" / "SST-2" / "dev.tsv"
    dev.write_text("sentence\tlabel\n")
    with pytest.raises(ValueError, match="the validation set of sst2 is empty"):  # the library raises, as before
        tasks.load_task("sst2", "validation", data_dir=data)
    line = papa_error(
        capsys, ["probe", "--task", "sst2", "--data-dir", str(data), *QUICK, "--results-dir", str(tmp_path / "r")]
    )
    assert line == f"papa: error: the validation set of sst2 is empty: the file has no examples ({dev})"


def test_unseen_validation_label_names_file_and_line(capsys, tmp_path, pair_files, tiny):
    dev = write_tsv(tmp_path / "dev2.tsv", [("a film", "a story", "pos"), ("meh", "meh", "neutral")])
    line = papa_error(
        capsys,
        [
            "probe",
            "--task",
            "custom",
            "--train",
            str(pair_files[0]),
            "--validation",
            str(dev),
            *PAIR,
            *QUICK,
            "--results-dir",
            str(tmp_path / "r"),
        ],
    )
    assert line == (f"papa: error: label 'neutral' does not occur in the training file {pair_files[0]} "
                    f"(its labels: ['neg', 'pos']) ({dev}:3)")


def test_missing_file_column_and_options(capsys, tmp_path, pair_files):
    train, dev = map(str, pair_files)
    missing = str(tmp_path / "missing.tsv")
    assert papa_error(capsys, ["probe", "--task", "custom", "--train", train, "--validation", missing, *PAIR]) == (
        f"papa: error: custom task custom: validation file not found: {missing}")
    assert papa_error(capsys, ["probe", "--task", "custom", "--train", train, "--validation", dev,
                               "--text-columns", "review,nope", "--label-column", "sentiment"]) == (
        f"papa: error: no column 'nope' in the header ['review', 'summary', 'sentiment'] ({dev}:1)")
    assert papa_error(capsys, ["probe", "--task", "custom", "--train", train, "--validation", dev]) == (
        "papa: error: --task custom needs --text-columns, --label-column")
    assert papa_error(capsys, ["probe", "--task", "sst2", "--train", train]) == (
        "papa: error: --train only applies to --task custom")


def test_bad_values(capsys, pair_files):
    assert papa_error(capsys, ["probe", "--task", "sst2", "--fraction", "2"]) == (
        "papa: error: argument --fraction: a fraction of heads must be in [0, 1], got '2' (see 'papa probe --help')")
    assert papa_error(capsys, ["probe", "--task", "sst2", "--max-length", "0"]) == (
        "papa: error: argument --max-length: expected a positive integer, got '0' (see 'papa probe --help')")
    assert papa_error(capsys, ["probe", "--task", "nli"]).startswith(
        "papa: error: argument --task: invalid choice: 'nli'"
    )
    train, dev = map(str, pair_files)
    assert papa_error(
        capsys, ["probe", "--task", "custom", "--train", train, "--validation", dev, *PAIR, "--max-length", "33"]
    ) == (
        "papa: error: custom task 'custom': a pair task needs an even max_length (the App. A layout puts the middle "
        "separator at L/2), got 33"
    )
    assert papa_error(
        capsys, ["probe", "--task", "custom", "--train", train, "--validation", dev, *PAIR, "--metric", "f2"]
    ).startswith("papa: error: argument --metric: invalid choice: 'f2'")


def test_wrong_length_for_the_model(capsys, tmp_path, tiny):
    data = smoke.generate_data_dir(tmp_path / "data", n_train=8, n_dev=4)
    line = papa_error(capsys, ["probe", "--task", "sst2", "--data-dir", str(data), "--max-length", "400"])
    assert line == "papa: error: --max-length 400 is longer than the 160 positions of tiny-random-bert; use 160 or less"


def test_unsupported_model(capsys, tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_head=2, n_embd=8).save_pretrained(tmp_path / "gpt2")
    data = smoke.generate_data_dir(tmp_path / "data", n_train=8, n_dev=4)
    line = papa_error(capsys, ["probe", "--task", "sst2", "--data-dir", str(data), "--model", str(tmp_path / "gpt2")])
    assert line.startswith("papa: error: unsupported model type 'gpt2': PAPA supports encoders of types bert, roberta")


def test_missing_data_folder_and_unreachable_hub(capsys, tmp_path, monkeypatch, tiny):
    nope = tmp_path / "nope"
    assert (
        papa_error(capsys, ["probe", "--task", "sst2", "--data-dir", str(nope)])
        == f"papa: error: data directory not found: {nope}"
    )
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'nyu-mll/glue' on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    # no ../shared/data; the sample does not hold CoLA
    monkeypatch.setattr(profiles, "shared_data_dir", lambda root=None: nope)
    line = papa_error(capsys, ["probe", "--task", "cola", *QUICK, "--results-dir", str(tmp_path / "r")])
    assert line.startswith("papa: error: could not load nyu-mll/glue/cola:train from the Hugging Face hub "
                           "(ConnectionError: Couldn't reach 'nyu-mll/glue' on the Hub).")
    assert line.endswith("point data_dir (CLI: --data-dir) at a local copy of the data files instead.")


def test_bad_grid_files(capsys, tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("seeds: 1\nblocks:\n  - name: a\n    tasks: [sst2\n")
    line = papa_error(capsys, ["grid", str(broken)])
    assert line.startswith("papa: error: invalid YAML: while parsing a flow sequence") and line.endswith(
        f"({broken}:5)"
    )
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("blocks:\n  - name: a\n    tasks: [nosuchtask]\n")
    line = papa_error(capsys, ["grid", str(unknown)])
    assert line.startswith("papa: error: blocks[0].tasks[0]: unknown task 'nosuchtask'; known: cola, mnli, mrpc, ner")
    assert line.endswith(f"({unknown}:3)")


def test_debug_shows_the_traceback_and_bugs_always_do(capsys, tmp_path, monkeypatch):
    nope = str(tmp_path / "nope")
    assert cli.main(["--debug", "probe", "--task", "sst2", "--data-dir", nope]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "FileNotFoundError" in err
    assert err.strip().splitlines()[-1] == f"papa: error: data directory not found: {nope}"

    def buggy(args):
        raise AttributeError("'NoneType' object has no attribute 'shape'")

    monkeypatch.setattr(cli, "cmd_averages", buggy)
    with pytest.raises(AttributeError, match="no attribute 'shape'"):  # a bug is not dressed up as a user error
        cli.main(["averages", "--task", "sst2"])


def test_only_the_librarys_own_errors_are_user_errors(capsys, monkeypatch, tmp_path):
    """The rule: papa_lib's deliberate errors (PapaError, PapaInputError), a missing path, bad YAML and a bad command
    line are one line with exit 2; a plain ValueError from inside the library is a bug and keeps its traceback."""
    from papa_lib.core.packaged import PackagedModelError
    from papa_lib.errors import PapaError, PapaInputError
    from papa_lib.experiments.damage import DamagedStoreError
    from papa_lib.experiments.specs import SpecError

    for error in (PapaInputError, models.UnsupportedModelError, SpecError, DamagedStoreError):
        assert issubclass(error, PapaInputError) and issubclass(error, ValueError)  # callers' except ValueError holds
    assert issubclass(task_specs.HubUnavailableError, PapaError)
    assert issubclass(PackagedModelError, (PapaError, OSError))

    def boom(*args, **kwargs):
        raise ValueError("boom")

    data = smoke.generate_data_dir(tmp_path / "data", n_train=8, n_dev=4)
    monkeypatch.setattr(cli, "_check_length", boom)  # deep inside a command, after the model loaded
    monkeypatch.setattr(models, "load_encoder", lambda *a, **k: smoke.tiny_encoder("bert"))
    with pytest.raises(ValueError, match="boom"):  # not dressed up as "papa: error: boom" with exit 2
        cli.main(["probe", "--task", "sst2", "--data-dir", str(data), *QUICK, "--results-dir", str(tmp_path / "r")])
    assert "papa: error" not in capsys.readouterr().err
    script = ("import sys; from papa_lib import cli\n"
              "def boom(args): raise ValueError('boom')\n"
              "cli.cmd_select = boom\n"
              "sys.exit(cli.main(['select', '--task', 'sst2']))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 1 and "Traceback (most recent call last)" in done.stderr
    assert done.stderr.strip().splitlines()[-1] == "ValueError: boom" and "papa: error" not in done.stderr


def test_no_data_folder_means_the_packaged_sample_with_one_line(capsys, tmp_path, monkeypatch, tiny):
    """As the chapters do: no --data-dir and no ../shared/data -> sst2 runs on the packaged sample, and says so once;
    a grid file whose data_dir lacks sst2 falls back the same way; an explicit --data-dir must exist."""
    from papa_lib.experiments.sample_data import SAMPLE_LABEL

    monkeypatch.setattr(profiles, "shared_data_dir", lambda root=None: tmp_path / "shared" / "data")
    monkeypatch.setenv("PAPA_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "r"
    assert cli.main(["probe", "--task", "sst2", *QUICK, "--results-dir", str(out)]) == 0
    err = capsys.readouterr().err.replace("\r", "\n").splitlines()
    notices = [line for line in err if "packaged sample" in line]
    assert len(notices) == 1 and notices[0].startswith("papa: ") and "does not exist; using the packaged sample" \
        in notices[0], err
    frame = results.ResultsStore(out).frame()
    assert len(frame) == 1 and f"({SAMPLE_LABEL})" in frame.data_source.iloc[0]
    grid = tmp_path / "grid.yaml"
    grid.write_text(f"seeds: 1\nmax_length: 16\nepochs: 1\ndata_dir: {tmp_path / 'nowhere'}\n"
                    "blocks:\n  - {name: a, tasks: [sst2], fractions: [1]}\n")
    assert cli.main(["grid", str(grid), "--results-dir", str(out)]) == 0
    captured = capsys.readouterr()
    assert sum("using the packaged sample" in line for line in captured.err.replace("\r", "\n").splitlines()) == 1
    assert "1 computed now" not in captured.out and "0 computed now, 1 reused" in captured.out  # the same run
    nope = tmp_path / "nope"
    assert papa_error(capsys, ["probe", "--task", "sst2", "--data-dir", str(nope)]) == (
        f"papa: error: data directory not found: {nope}")


def test_help_shows_every_default_and_no_markup(capsys):
    import argparse

    parser = cli.build_parser()
    commands = parser._subparsers._group_actions[0].choices
    lacking = []
    for name, sub in commands.items():
        if name == "bench":  # its options are papa_lib.ops.bench's
            continue
        formatter = sub._get_formatter()
        for action in sub._actions:
            if not action.option_strings or action.nargs == 0 or action.required or isinstance(
                    action, argparse._HelpAction):
                continue
            text = formatter._expand_help(action)
            if "default" not in text and "required with" not in text:
                lacking.append((name, action.option_strings[0], text))
    assert lacking == []
    probe, grid = commands["probe"].format_help(), commands["grid"].format_help()
    assert "(default: data/results/cli)" in " ".join(probe.split())
    assert "(default: the grid file's folder)" in " ".join(grid.split())
    assert "(default: 1 0.5 0.125 0.0625 0)" in " ".join(probe.split())
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    top = capsys.readouterr().out
    assert top.startswith("usage: papa") and "data/results/cli" in top
    for markup in ("``", ":mod:", ":func:", ":class:", "::"):
        assert markup not in top, markup


def test_probe_and_grid_end_with_a_table_and_say_what_was_reused(tmp_path, pair_files, tiny, capsys):
    train, dev = pair_files
    out = tmp_path / "out"
    probe = ["probe", "--task", "custom", "--name", "reviews", "--train", str(train), "--validation", str(dev), *PAIR,
             "--max-length", "16", "--epochs", "1", "--seeds", "2", "--fraction", "1", "0", "--results-dir", str(out)]
    assert cli.main(probe) == 0
    lines = capsys.readouterr().out.splitlines()
    table = lines[lines.index(next(line for line in lines if line.startswith("task "))):]
    assert table[0].split() == ["task", "matrix", "type", "order", "fraction", "metric", "mean", "±", "95%", "CI",
                                "seeds"]
    assert len(table) == 4 and all(" ± " in row and row.split()[-1] == "2" for row in table[1:3])
    assert table[1].split()[:5] == ["reviews", "average", "none", "0", "accuracy"]
    frame = results.ResultsStore(out).frame()
    mean, low, high = summaries.mean_ci(frame[frame.fraction == 0].value)  # Student-t, 2 seeds
    assert f"{mean:.4f} ± {(high - low) / 2:.4f}" in table[1]
    assert table[3] == f"4 records in {out / 'results.csv'}: 4 computed now, 0 reused (already stored)"
    assert cli.main(probe) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith(": 0 computed now, 4 reused (already stored)")
    grid, out = _reviews_grid(tmp_path), tmp_path / "grid-out"  # 1 seed, fractions 1 and 1/2 of λ
    assert cli.main(["grid", str(grid), "--results-dir", str(out)]) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[-1] == f"2 records in {out / 'results.csv'}: 2 computed now, 0 reused (already stored)"
    assert [row.split()[:4] for row in said[-3:-1]] == [["reviews", "average", "lambda", "0.5"],
                                                        ["reviews", "original", "none", "1"]]
    assert all("(1 seed)" in row and "±" not in row for row in said[-3:-1])  # one seed: a mean, no interval
    assert cli.main(["grid", str(grid), "--results-dir", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith(": 0 computed now, 2 reused (already stored)")


def test_console_script_exits_with_2_and_one_line(tmp_path):
    missing = tmp_path / "missing.tsv"
    done = subprocess.run([sys.executable, "-m", "papa_lib.cli", "probe", "--task", "custom", "--train", str(missing),
                           "--validation", str(missing), *PAIR], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 2
    assert done.stderr == f"papa: error: custom task custom: training file not found: {missing}\n"


# ------------------------------------------------------------------ papa bench
def test_bench_help_and_options_reach_the_benchmarks(capsys, monkeypatch):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: papa bench") and "--quick" in out and "--device" in out

    calls = []
    monkeypatch.setattr(
        bench, "run_benchmarks", lambda names, quick=False, **kwargs: calls.append((names, quick, kwargs))
    )
    assert cli.main(["bench", "--quick"]) == 0
    assert cli.main(["bench", "averaging", "--quick", "--model", "tiny"]) == 0
    assert [(names, quick) for names, quick, _ in calls] == [(["all"], True), (["averaging"], True)]
    assert calls[1][2]["model"] == "tiny"
    assert papa_error(capsys, ["bench", "--quick", "--fast"]) == (
        "papa: error: unrecognized arguments: --fast (see 'papa bench --help')")


# ------------------------------------------------------------------ tasks of your own
def test_custom_pair_task_from_tsv_end_to_end(tmp_path, pair_files, tiny, capsys):
    store = tmp_path / "results"
    code = cli.main(["probe", "--task", "custom", "--name", "reviews", "--train", str(pair_files[0]), "--validation",
                     str(pair_files[1]), *PAIR, "--max-length", "24", "--epochs", "1", "--seeds", "1",
                     "--fraction", "1", "1/2", "--order", "random", "--results-dir", str(store)])
    assert code == 0
    assert "reviews\taverage\trandom\t0.5\tseed 0\taccuracy=" in capsys.readouterr().out
    frame = results.ResultsStore(store).frame()
    assert sorted(frame.fraction) == [0.5, 1.0] and set(frame.task) == {"reviews"} and set(frame.eval_size) == {10}
    assert set(frame.train_size + frame.heldout_size) == {24} and set(frame.metric) == {"accuracy"}
    provenance = json.loads(frame.provenance.iloc[0])
    assert provenance["train"] == str(pair_files[0]) and provenance["validation"] == str(pair_files[1])
    assert provenance["text_columns"] == ["review", "summary"] and provenance["label_column"] == "sentiment"
    assert provenance["delimiter"] == "\t" and provenance["labels"] == ["neg", "pos"]
    assert all(0.0 <= v <= 1.0 for v in frame.value)
    spec = task_specs.TASKS["reviews"]
    assert spec.is_pair and spec.label_names == ("neg", "pos") and spec.max_length == 24
    # the same name with different data never reuses the earlier runs (the files' digests are in the run id)
    write_tsv(pair_files[1], _rows(10, 2, True))
    assert (
        cli.main(
            [
                "probe",
                "--task",
                "custom",
                "--name",
                "reviews",
                "--train",
                str(pair_files[0]),
                "--validation",
                str(pair_files[1]),
                *PAIR,
                "--max-length",
                "24",
                "--epochs",
                "1",
                "--seeds",
                "1",
                "--fraction",
                "1",
                "--results-dir",
                str(store),
            ]
        )
        == 0
    )
    assert len(results.ResultsStore(store).frame()) == 3


def test_custom_single_text_task_from_csv(tmp_path, tiny):
    rows = [(text, label) for text, label in _rows(20, 3, False)]
    train = write_csv(tmp_path / "train.csv", rows)
    dev = write_csv(tmp_path / "dev.csv", _rows(8, 4, False))
    task = CustomTask("films", train, dev, "text", "label", metric="mcc", max_length=16, epochs=1)
    spec = register_custom_task(task)
    assert not spec.is_pair and spec.metric == "matthews_corrcoef" and spec.label_names == ("neg", "pos")
    examples = tasks.load_task("films", "train")
    assert examples.texts[0] == rows[0][0] and "," in examples.texts[0]  # a quoted comma stays inside the field
    assert examples.labels == [spec.label_names.index(label) for _, label in rows] and examples.pairs is None
    assert metrics.compute_metric("films", [0, 1], [0, 1]) == 1.0
    experiment = engine.TaskExperiment(workspace.ExperimentConfig(task="films"), *smoke.tiny_encoder("bert"),
                                       results_dir=tmp_path / "r", progress=False)
    record = experiment.run(variants.Variant.make("average", "first_to_last", 0.5), seed=0)
    assert record["task"] == "films" and record["metric"] == "matthews_corrcoef" and record["eval_size"] == 8
    assert record["provenance"]["text_columns"] == ["text"] and record["provenance"]["delimiter"] == ","
    assert -1.0 <= record["value"] <= 1.0


def test_custom_labels_order_and_metric_checks(tmp_path):
    train = write_tsv(tmp_path / "t.tsv", [("a", "10"), ("b", "2"), ("c", "2")], header=("s", "y"))
    spec = register_custom_task(CustomTask("ints", train, train, ["s"], "y", metric="f1"))
    assert spec.label_names == ("2", "10")  # integers sort numerically
    assert tasks.load_task("ints", "validation").labels == [1, 0, 0]
    three = write_tsv(tmp_path / "3.tsv", [("a", "x"), ("b", "y"), ("c", "z")], header=("s", "y"))
    with pytest.raises(ValueError, match="metric f1 scores the positive class of a two-label task"):
        register_custom_task(CustomTask("three", three, three, "s", "y", metric="f1"))
    with pytest.raises(ValueError, match="taken by one of the paper's tasks"):
        register_custom_task(CustomTask("sst2", three, three, "s", "y"))
    with pytest.raises(ValueError, match="cannot tell the delimiter"):
        register_custom_task(CustomTask("txt", tmp_path / "t.tsv", three.rename(tmp_path / "3.txt"), "s", "y"))


def test_grid_declares_custom_tasks(tmp_path, pair_files, tiny):
    grid = tmp_path / "grid.yaml"
    grid.write_text(
        "seeds: 1\nmax_length: 16\nepochs: 1\n"
        "custom_tasks:\n"
        "  - {name: reviews, train: train.tsv, validation: dev.tsv, text_columns: [review, summary],"
        " label_column: sentiment, metric: f1}\n"
        "blocks:\n  - {name: mine, tasks: [reviews], matrix_types: [average], orders: [random], fractions: [1, 0.5]}\n")
    assert cli.main(["grid", str(grid)]) == 0
    frame = results.ResultsStore(tmp_path).frame()
    assert set(frame.task) == {"reviews"} and set(frame.metric) == {"f1"} and len(frame) == 2
    assert json.loads(frame.provenance.iloc[0])["train"] == str(pair_files[0])
    from papa_lib.book import grid_views  # the chapters' helpers look tasks up in TASKS, so they accept it too

    assert grid_views.task_lengths(load_grid(grid), ["reviews"]) == {"reviews": 16}
    assert task_specs.TASKS["reviews"].max_length == 128 and task_specs.TASKS["reviews"].metric == "f1"
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "custom_tasks:\n  - {name: x, train: train.tsv, validation: dev.tsv, text_columns: review, label: y}\n"
        "blocks: []\n"
    )
    with pytest.raises(
        ValueError, match=r"bad.yaml:2: unknown key 'label' in custom_tasks\[0\] \(did you mean 'label_column'\?\)"
    ):
        load_grid(bad)


def _reviews_grid(tmp_path) -> Path:
    grid = tmp_path / "grid.yaml"
    grid.write_text(
        "seeds: 1\nmax_length: 16\nepochs: 1\nlambda_epochs: 1\n"
        "custom_tasks:\n"
        "  - {name: reviews, train: train.tsv, validation: dev.tsv, text_columns: [review, summary],"
        " label_column: sentiment}\n"
        "blocks:\n  - {name: mine, tasks: [reviews], matrix_types: [average], orders: [lambda], fractions: [1, 0.5]}\n")
    return grid


def _stored_reviews_grid(tmp_path) -> tuple[Path, Path, Path, str]:
    """``(grid file, results folder, results.csv, its text)`` after the reviews grid has run once."""
    grid = _reviews_grid(tmp_path)
    out = tmp_path / "out"
    assert cli.main(["grid", str(grid), "--results-dir", str(out)]) == 0
    table = out / "results.csv"
    return grid, out, table, table.read_text()


def test_grid_sets_a_torn_line_aside_and_repairs_damage_in_the_middle(tmp_path, pair_files, tiny, capsys):
    grid, out, table, whole = _stored_reviews_grid(tmp_path)
    lines = whole.splitlines(keepends=True)
    assert len(lines) == 3
    capsys.readouterr()
    # a torn last line: set aside with a one-line notice, its run computed again
    table.write_text(whole[: len(whole) - 60])
    assert cli.main(["grid", str(grid), "--results-dir", str(out)]) == 0
    notices = [
        line for line in capsys.readouterr().err.replace("\r", "\n").splitlines() if line.startswith("papa: notice:")
    ]
    assert len(notices) == 1 and "(line 3) was cut off" in notices[0]
    (side,) = out.glob("results.csv.torn-*")
    assert side.name in notices[0]
    assert len(results.ResultsStore(out)) == 2
    # damage in the middle: one line naming it, exit 2, and how to repair
    lines = table.read_text().splitlines(keepends=True)
    table.write_text(lines[0] + lines[1][:50] + "\n" + lines[2])
    line = papa_error(capsys, ["grid", str(grid), "--results-dir", str(out)])
    assert line.startswith("papa: error: row has ") and f"'papa grid {grid} --repair' keeps every intact record" in line
    assert line.endswith(f"({table}:2)")
    assert cli.main(["grid", str(grid), "--results-dir", str(out), "--repair"]) == 0
    said = capsys.readouterr().out.strip()
    assert said.startswith(f"repaired {table}: kept 1 intact records; moved 1 damaged line(s) (2) to ")
    assert results.ResultsStore(out).run_ids() == [lines[2].split(",")[0]]
    assert cli.main(["grid", str(grid), "--results-dir", str(out)]) == 0
    assert len(results.ResultsStore(out)) == 2


def test_damaged_matrices_and_lambdas_are_set_aside_and_recomputed(tmp_path, pair_files, tiny, capsys):
    grid = _reviews_grid(tmp_path)
    out = tmp_path / "out"
    assert cli.main(["grid", str(grid), "--results-dir", str(out)]) == 0
    first = results.ResultsStore(out).frame().set_index("run_id")["value"]
    (matrices,) = out.glob("matrices/*.safetensors")
    (lambdas,) = out.glob("lambdas/*.safetensors")
    assert (out / "matrices" / (matrices.name + ".sha256")).exists()
    matrices_bytes, lambda_bytes = matrices.read_bytes(), lambdas.read_bytes()
    matrices.write_bytes(matrices_bytes[:200])  # cut short, as by a crash or a full disk
    lambdas.write_bytes(lambda_bytes[:100])
    (out / "results.csv").unlink()  # so that the runs need them again
    capsys.readouterr()
    assert cli.main(["grid", str(grid), "--results-dir", str(out)]) == 0
    err = capsys.readouterr().err
    notices = [line for line in err.replace("\r", "\n").splitlines() if line.startswith("papa: notice:")]
    assert len(notices) == 2, repr(err)[-3000:]
    assert any(f"{matrices} is damaged (200 bytes where {len(matrices_bytes)} were written)" in n for n in notices)
    assert any(f"{lambdas} is damaged (100 bytes where {len(lambda_bytes)} were written)" in n for n in notices)
    assert (matrices.parent / (matrices.name + ".damaged")).read_bytes() == matrices_bytes[:200]
    import torch

    from papa_lib.core.artefacts import read_or_heal
    from papa_lib.core.averaging import ConstantAttention

    recomputed = ConstantAttention.load(matrices)  # the same numbers again (the metadata holds the time taken)
    (tmp_path / "old.safetensors").write_bytes(matrices_bytes)
    assert torch.equal(recomputed.matrices, ConstantAttention.load(tmp_path / "old.safetensors").matrices)
    from papa_lib.experiments.workspace import read_lambdas

    (tmp_path / "old.safetensors").write_bytes(lambda_bytes)
    assert torch.equal(read_lambdas(lambdas), read_lambdas(tmp_path / "old.safetensors"))
    again = results.ResultsStore(out).frame().set_index("run_id")["value"]
    assert again.to_dict() == first.to_dict()
    # without a checksum file (an older cache), a failed read is what shows the damage
    (out / "matrices" / (matrices.name + ".sha256")).unlink()
    matrices.write_bytes(matrices_bytes[:200])
    assert read_or_heal(matrices, ConstantAttention.load) is None
    assert "cannot be read" in capsys.readouterr().err and not matrices.exists()


def test_average_limit_caps_the_averaged_text_and_records_say_so(tmp_path, pair_files, tiny, capsys):
    train, dev = pair_files
    base = ["--task", "custom", "--train", str(train), "--validation", str(dev), *PAIR, "--max-length", "16",
            "--epochs", "1", "--seeds", "1"]
    out = tmp_path / "out"
    assert cli.main(["averages", *base, "--average-limit", "5", "--results-dir", str(out)]) == 0
    assert "from 5 examples" in capsys.readouterr().out
    assert cli.main(["averages", *base, "--results-dir", str(out)]) == 0
    assert "from 24 examples" in capsys.readouterr().out  # default: the whole training set
    assert cli.main(["probe", *base, "--fraction", "1", "0", "--average-limit", "5", "--results-dir", str(out)]) == 0
    assert cli.main(["probe", *base, "--fraction", "0", "--results-dir", str(out)]) == 0
    frame = results.ResultsStore(out).frame()
    limited = frame[frame.matrix_type == "average"].set_index("average_limit")
    assert sorted(map(str, limited.index)) == ["5", "all"] and len(frame) == 3  # the original model's run is shared
    assert limited.loc["all", "run_id"] != limited.loc[5, "run_id"]
    help_text = cli.build_parser()._subparsers._group_actions[0].choices["probe"].format_help()
    assert "still average over the whole training set" in " ".join(help_text.split())


def _options(parser):
    """Every (parser prog, option) of an argparse parser and its subparsers, with the option's help."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _options(sub)
        elif not isinstance(action, argparse._HelpAction) and action.help != argparse.SUPPRESS:
            yield parser.prog, "/".join(action.option_strings) or action.dest, action.help


def test_every_option_has_help():
    from papa_book import build

    parsers = [cli.build_parser(), build._build_parser()]

    class Recorder(cli._Parser):  # papa bench builds its parser inside bench.main
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            parsers.append(self)

    with pytest.raises(SystemExit):
        bench.main(["--help"], parser_class=Recorder)
    options = [option for parser in parsers for option in _options(parser)]
    assert len(options) > 60
    lacking = [(prog, name) for prog, name, text in options if not (text or "").strip()]
    assert lacking == []
    names = {(prog, name) for prog, name, _ in options}
    assert {("papa reproduce", "--device"), ("papa probe", "--order"), ("papa book", "--allow-warnings"),
            ("papa", "--version"), ("papa grid", "--repair"), ("papa grid", "--average-limit")} <= names


def test_version_is_defined_once(capsys):
    import tomllib

    import papa_lib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert papa_lib.__version__ == version
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"papa {version}"
    assert not any(f'"{version}"' in path.read_text() for path in (ROOT / "papa_lib").rglob("*.py"))


def test_reproduce_fails_in_one_line_naming_chapter_and_cell(monkeypatch, capsys):
    from papa_book import build

    def failing(*args, **kwargs):
        raise build.ChapterExecutionError("chapter probing (book/probing.md) failed under profile 'smoke': "
                                          "ZeroDivisionError: division by zero (in cell [7]); partial notebook: "
                                          "runs/smoke/probing.ipynb; chapters done and kept: intro")

    monkeypatch.setattr(build, "run_chapters", failing)
    assert cli.main(["reproduce", "--profile", "smoke"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    assert err[0].startswith("papa: error: a chapter failed: chapter probing (book/probing.md) failed under "
                             "profile 'smoke': ZeroDivisionError: division by zero (in cell [7])")
    assert build.failure_line("x", build.BookBuildError("first line\nlog tail")) == "papa: error: x: first line"


def test_reproduce_passes_chapter_parameters_as_papermill_does(monkeypatch, capsys):
    from papa_book import build

    seen = {}
    monkeypatch.setattr(build, "run_chapters", lambda profile, out, parameters=None, **kw: seen.update(parameters)
                        or [])
    assert cli.main(["reproduce", "--profile", "smoke", "-p", "n_sentences", "64", "-p", "tasks", "[sst2, cola]",
                     "-p", "figures_dir", "figs"]) == 0
    assert seen == {"n_sentences": 64, "tasks": ["sst2", "cola"], "figures_dir": "figs"}
    assert cli.main(["reproduce", "--profile", "smoke", "-p", "not-a-name", "1"]) == 2
    assert "not a Python identifier" in capsys.readouterr().err
    assert papa_error(capsys, ["reproduce", "--profile", "smoke", "-p", "profile", "local"]) == (
        "papa: error: -p profile: give the profile as --profile")
    assert papa_error(capsys, ["reproduce", "--profile", "smoke", "-p", "seeds", "[0,1"]) == (
        "papa: error: -p seeds: '[0,1' is not a YAML value (3, 0.5, x, [0, 1], ...)")


def test_device_auto_picks_cuda_when_present(monkeypatch):
    import torch

    from papa_lib.experiments.grid import grid_settings

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert models.resolve_device("auto") == "cuda"
    assert grid_settings({"device": "auto", "blocks": []})[0]["device"] == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert models.resolve_device("auto") == "cpu" and models.resolve_device(None) == "cpu"
    assert models.resolve_device("cuda:1") == "cuda:1"
    assert grid_settings({"device": "cpu", "blocks": []}, {"device": "auto"})[0]["device"] == "cpu"


def test_a_wrong_device_model_or_task_name_is_one_line_before_any_model_loads(capsys, tmp_path, monkeypatch):
    """Each of these was a traceback (exit 1) or transformers' puzzling hub message before."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    data = smoke.generate_data_dir(tmp_path / "data", n_train=8, n_dev=4)
    out = tmp_path / "r"
    probe = ["probe", "--task", "sst2", "--data-dir", str(data), *QUICK, "--results-dir", str(out)]
    assert papa_error(capsys, [*probe, "--device", "gpu"]) == (
        "papa: error: argument --device: expected auto, cpu, cuda, cuda:N or mps, got 'gpu' (see 'papa probe --help')")
    assert papa_error(capsys, [*probe, "--device", "cuda"]) == (
        "papa: error: device 'cuda': torch sees no CUDA GPU on this machine; use cpu or auto")
    nowhere = tmp_path / "no-model"
    assert papa_error(capsys, [*probe, "--model", str(nowhere)]) == f"papa: error: model folder not found: {nowhere}"
    assert papa_error(capsys, ["averages", "--task", "sst2", "--data-dir", str(data), "--matrices-from", "sst-2"]) \
        .startswith("papa: error: --matrices-from sst-2: not a task; choose one of cola, mnli, mrpc")
    assert not out.exists()
    grid = tmp_path / "grid.yaml"
    grid.write_text("seeds: 1\ndevice: cuda\nblocks:\n  - {name: a, tasks: [sst2]}\n")
    for plan in ([], ["--plan"]):
        assert papa_error(capsys, ["grid", str(grid), "--results-dir", str(out), *plan]) == (
            "papa: error: device 'cuda': torch sees no CUDA GPU on this machine; use cpu or auto")
        assert papa_error(capsys, ["grid", str(grid), "--model", str(nowhere), "--device", "cpu", *plan]) == (
            f"papa: error: model folder not found: {nowhere}")
    assert not out.exists()


def test_grid_command_lines_that_would_run_nothing_or_the_wrong_thing(capsys, tmp_path, pair_files, tiny):
    """--only-seed outside the file's seeds ran nothing and exited 0; --plan --repair repaired nothing; --plan
    planned an L the run refuses."""
    grid = _reviews_grid(tmp_path)
    out = tmp_path / "out"
    assert papa_error(capsys, ["grid", str(grid), "--results-dir", str(out), "--only-seed", "5"]) == (
        f"papa: error: --only-seed 5: not among the seeds [0] of {grid}")
    assert papa_error(capsys, ["grid", str(grid), "--plan", "--repair"]) == (
        "papa: error: --plan and --repair: give one (each runs nothing else)")
    assert papa_error(capsys, ["grid", str(grid), "--results-dir", str(out), "--plan", "--max-length", "400"]) == (
        "papa: error: --max-length 400 is longer than the 160 positions of tiny-random-bert; use 160 or less")
    assert not out.exists()
    missing = tmp_path / "missing.yaml"
    missing.write_text(grid.read_text().replace("train: train.tsv", "train: nothing.tsv"))
    line = papa_error(capsys, ["grid", str(missing), "--plan"])
    assert line.startswith("papa: error: custom task reviews: training file not found: ") and line.endswith(
        f"nothing.tsv ({missing}:6)"), line


def test_plan_writes_nothing_and_a_repeated_last_line_is_not_called_cut_off(capsys, tmp_path, pair_files, tiny):
    grid, out, table, whole = _stored_reviews_grid(tmp_path)
    table.write_text(whole[: len(whole) - 60])  # a torn last line
    capsys.readouterr()
    assert cli.main(["grid", str(grid), "--results-dir", str(out), "--plan"]) == 0
    assert table.read_text() == whole[: len(whole) - 60] and not list(out.glob("results.csv.torn-*"))
    assert "was cut off" in capsys.readouterr().err  # named, and left as it is: a plan writes nothing
    table.write_text(whole + whole.splitlines(keepends=True)[1])  # the last line repeats a stored run
    assert cli.main(["grid", str(grid), "--results-dir", str(out)]) == 0
    notices = [line for line in capsys.readouterr().err.splitlines() if line.startswith("papa: notice:")]
    assert len(notices) == 1 and "repeats a stored run (duplicate run_id" in notices[0], notices
    assert "the stored record is kept" in notices[0] and "cut off" not in notices[0]
    assert len(results.ResultsStore(out)) == 2 and table.read_text() == whole
