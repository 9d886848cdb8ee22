"""Grid files and custom-task specs are checked before anything runs: one line naming file and line, exit 2."""

from __future__ import annotations

import pytest

from papa_lib import cli
from papa_lib.experiments.grid import load_grid
from papa_lib.experiments.specs import SpecError

GOOD = "seeds: [0, 1]\nblocks:\n  - name: fig2\n    tasks: [sst2]\n"

# (file text, expected message, line)
CASES = [
    (
        "model: null\nprofile: local\nseed: [0, 1, 2, 3, 4]\nblocks:\n  - {name: b, tasks: [sst2]}\n",
        "unknown key 'seed' (did you mean 'seeds'?)",
        3,
    ),
    (
        "blocks:\n  - name: b\n    tasks: [sst2]\n    order: [lambda]\n",
        "unknown key 'order' in blocks[0] (did you mean 'orders'?)",
        4,
    ),
    ("seeds: [0, -1]\nblocks: []\n", "seeds[1]: must be a non-negative integer, got -1", 1),
    ("seeds: [0, 1.5]\nblocks: []\n", "seeds[1]: must be a non-negative integer, got 1.5", 1),
    ("seeds: 0\nblocks: []\n", "seeds: must be a number of seeds", 1),
    (
        "blocks:\n  - name: b\n    tasks: [sst2]\n    fractions: [1, 0.5,\n      1.5]\n",
        "blocks[0].fractions[2]: a fraction of input-dependent heads must be a number in [0, 1], got 1.5",
        5,
    ),
    ("blocks:\n  - name: b\n    tasks: [sst2]\n    fractions: [-0.5]\n", "blocks[0].fractions[0]: a fraction", 4),
    ("blocks:\n  - name: b\n    tasks: [sst2,\n            sts]\n", "blocks[0].tasks[1]: unknown task 'sts'", 4),
    (
        "blocks:\n  - {name: b, tasks: [sst2], matrix_types: [averag]}\n",
        "blocks[0].matrix_types[0]: unknown matrix type 'averag' (did you mean 'average'?)",
        2,
    ),
    (
        "blocks:\n  - {name: b, tasks: [sst2], orders: [lamda]}\n",
        "blocks[0].orders[0]: unknown order 'lamda' (did you mean 'lambda'?)",
        2,
    ),
    (
        "blocks:\n  - {name: b, tasks: [sst2], matrices_from: mnly}\n",
        "blocks[0].matrices_from: unknown task 'mnly' (did you mean 'mnli'?)",
        2,
    ),
    ("max_length: 3\nblocks: []\n", "max_length: must be an integer of at least 4", 1),
    ("max_length:\n  default: 64\n  sst2: 2\nblocks: []\n", "max_length.sst2: must be an integer of at least 4", 3),
    (
        "limit:\n  sts2: 8000\nblocks: []\n",
        "limit.sts2: unknown task 'sts2' in a per-task mapping (did you mean 'sst2'?)",
        2,
    ),
    ("epochs: 0\nblocks: []\n", "epochs: must be a positive integer, got 0", 1),
    ("learning_rate: -1e-4\nblocks: []\n", "learning_rate: must be a positive number", 1),
    ("profile: papers\nblocks: []\n", "profile: input should be 'smoke', 'local' or 'paper', got 'papers'", 1),
    ("device: gpu\nblocks: []\n", "device: must be auto, cpu, cuda, cuda:N or mps, got 'gpu'", 1),
    ("average_limit: many\nblocks: []\n", "average_limit: must be a positive integer, got 'many'", 1),
    ("seeds: 2\n", "the file lacks the key 'blocks'", 1),
    ("blocks:\n  - {tasks: [sst2]}\n", "blocks[0] lacks the key 'name'", 2),
    ("blocks:\n  - {name: b, tasks: []}\n", "blocks[0].tasks: list should have at least 1 item", 2),
    ("- just\n- a list\n", "a grid file is a mapping of settings", 1),
    ("blocks: [\n  - oops: {\n", "invalid YAML", 2),
    # custom tasks
    (
        "custom_tasks:\n  - name: x\n    train: t.tsv\n    validation: d.tsv\n    text_columns: a\n    label: y\n"
        "blocks: []\n",
        "unknown key 'label' in custom_tasks[0] (did you mean 'label_column'?)",
        6,
    ),
    (
        "custom_tasks:\n  - {name: x, train: t.tsv, validation: d.tsv, text_columns: a, label_column: y,\n"
        "     metric: recall}\nblocks: []\n",
        "custom_tasks[0].metric: input should be 'accuracy', 'f1', 'mcc'",
        3,
    ),
    (
        "custom_tasks:\n  - {name: x, train: t.tsv, validation: d.tsv, text_columns: a, label_column: y,\n"
        "     max_length: 2}\nblocks: []\n",
        "custom_tasks[0].max_length: must be an integer of at least 4",
        3,
    ),
    (
        "custom_tasks:\n  - {name: x, train: t.tsv, validation: d.tsv, text_columns: [a, b, c], label_column: y}\n"
        "blocks: []\n",
        "custom_tasks[0].text_columns: must be one column name or a list of two",
        2,
    ),
    (
        "custom_tasks:\n  - {name: x, train: t.tsv, validation: d.tsv, text_columns: a, label_column: y, epochs: 0}\n"
        "blocks: []\n",
        "custom_tasks[0].epochs: must be a positive integer, got 0",
        2,
    ),
    (
        "custom_tasks:\n  - {name: x, train: t.tsv, text_columns: a, label_column: y}\nblocks: []\n",
        "custom_tasks[0] lacks the key 'validation'",
        2,
    ),
    (
        "custom_tasks:\n  - {name: sst2, train: t.tsv, validation: d.tsv, text_columns: a, label_column: y}\n"
        "blocks: []\n",
        "custom task name 'sst2' is taken by one of the paper's tasks",
        2,
    ),
    (
        "custom_tasks:\n  - {name: x, train: t.tsv, validation: d.tsv, text_columns: a, label_column: y}\n"
        "  - {name: x, train: t.tsv, validation: d.tsv, text_columns: a, label_column: y}\nblocks: []\n",
        "custom task 'x' is declared twice",
        3,
    ),
    (
        "custom_tasks:\n  - {name: x, train: t.tsv, validation: d.tsv, text_columns: [a, b], label_column: y,"
        " max_length: 33}\nblocks: []\n",
        "a pair task needs an even max_length",
        2,
    ),
    (  # YAML keeps the last of two equal keys: five seeds where the first line says one
        "seeds: [0]\nblocks:\n  - {name: a, tasks: [sst2]}\nseeds: [0, 1, 2, 3, 4]\n",
        "the key 'seeds' is given twice (first on line 1); YAML would keep only the last",
        4,
    ),
    (
        "blocks:\n  - name: a\n    tasks: [sst2]\n    tasks: [cola]\n",
        "the key 'tasks' is given twice (first on line 3)",
        4,
    ),
    (
        "blocks:\n  - {name: a, tasks: [sst2]}\n  - {name: a, tasks: [cola]}\n",
        "a second block named 'a' (line 2); give each block its own name",
        3,
    ),
    (
        "device: gpu\nblocks:\n  - {name: a, tasks: [sst2]}\n",
        "must be auto, cpu, cuda, cuda:N or mps, got 'gpu'",
        1,
    ),
]


@pytest.mark.parametrize("text, message, line", CASES, ids=[c[1][:40] for c in CASES])
def test_bad_grid_file_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, text, message, line):
    grid = tmp_path / "grid.yaml"
    grid.write_text(text)
    out = tmp_path / "out"
    assert cli.main(["grid", str(grid), "--results-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("papa: error: ") and message in err[0], err[0]
    assert err[0].endswith(f"({grid}:{line})"), err[0]
    assert not out.exists()  # nothing run, nothing written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.yaml"]


def test_the_library_raises_spec_error_with_file_and_line(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text(CASES[0][0])
    with pytest.raises(SpecError, match=r"grid\.yaml:3: unknown key 'seed' \(did you mean 'seeds'\?\)"):
        load_grid(grid)


@pytest.mark.usefixtures("restore_registries")  # the committed grids register custom tasks (mnli_hypothesis_only)
def test_valid_grid_files_pass(tmp_path):
    from pathlib import Path

    grid = tmp_path / "grid.yaml"
    grid.write_text(GOOD.replace("seeds: [0, 1]\n", "") + "limit: {sst2: 8000, default: null}\n"
                    "max_length: {default: 64, mnli: 128}\ncache_budget: 8G\ndevice: auto\nseeds: 3\n")
    spec = load_grid(grid)
    assert spec["seeds"] == 3 and spec["blocks"][0].tasks == ["sst2"]
    from conftest import SHARED_DATA

    for committed in sorted((Path(__file__).resolve().parents[1] / "data" / "results").glob("*/grid*.yaml")):
        try:
            assert load_grid(committed)["blocks"], committed
        except FileNotFoundError as error:  # a custom task's files live in ../shared/data, absent on a fresh machine
            assert not SHARED_DATA.exists() and "file not found" in str(error), (committed, error)



def test_merge_keys_are_not_repeated_keys(tmp_path):
    """Two merge keys (<<) add the entries of two anchors: YAML keeps both, so the repeated-key check must too."""
    grid = tmp_path / "grid.yaml"
    grid.write_text("seeds: [0]\nblocks:\n  - &one {name: a, tasks: [sst2]}\n"
                    "  - &two {name: b, tasks: [cola], fractions: [1]}\n  - {<<: *one, <<: *two, name: c}\n")
    spec = load_grid(grid)
    assert [block.name for block in spec["blocks"]] == ["a", "b", "c"]
