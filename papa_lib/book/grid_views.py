"""What a declared grid asks for, the constant matrices it stored, and how much of it the results table holds.

Beside the results' figures and tables (:mod:`papa_lib.book.figures`), this module holds:

* :func:`stored_matrices` -- the constant matrices a grid stored (where they put their weight:
  :func:`papa_lib.analysis.patterns.column_mass` and :func:`~papa_lib.analysis.patterns.self_mass`);
  :func:`save_shown`, :func:`load_matrices`, :func:`matrix_files` -- their compact committed copies on disk.
* :func:`grid_coverage`, :func:`task_lengths`, :func:`per_task_setting` -- what a declared grid
  (:func:`papa_lib.experiments.grid.load_grid`) asks for and which of its runs are in the table (results may be
  partial); :func:`declared_runs` and :func:`lm_declared_runs` list its distinct runs one by one (a run that several
  blocks or grid files declare can then be counted once).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence

import pandas as pd
import torch

from ..experiments import grid, matrices

__all__ = [
    "SHOWN_FOLDER",
    "RUN_KEY",
    "declared_runs",
    "grid_coverage",
    "lm_declared_runs",
    "load_matrices",
    "matrix_files",
    "per_task_setting",
    "save_shown",
    "stored_matrices",
    "task_lengths",
]


#: Columns of the results table (:meth:`papa_lib.experiments.results.ResultsStore.frame`) these helpers and
#: :mod:`papa_lib.book.figures` read.
_FRAME_COLUMNS = ("model", "task", "matrix_type", "matrices_from", "selection_order", "fraction", "seed", "metric",
                  "value")


def check_frame(frame: pd.DataFrame, what: str, extra: Sequence[str] = ()) -> pd.DataFrame:
    """Raise ValueError unless ``frame`` is a results table with the columns these helpers and figures read."""
    if not isinstance(frame, pd.DataFrame):
        raise ValueError(f"{what}: expected a results DataFrame (ResultsStore(...).frame()), "
                         f"got {type(frame).__name__}")
    missing = [c for c in (*_FRAME_COLUMNS, *extra) if c not in frame.columns]
    if missing:
        raise ValueError(f"{what}: the results frame lacks column(s) {', '.join(missing)} "
                         f"(have {list(frame.columns)})")
    return frame


def check_tasks(tasks: Iterable[str] | None, what: str) -> list[str] | None:
    """Validate task names against :data:`papa_lib.experiments.task_specs.TASKS` (a typo is an error; an absent task is
    not)."""
    if tasks is None:
        return None
    if isinstance(tasks, str):
        tasks = [tasks]
    from ..experiments.task_specs import TASKS

    tasks = list(tasks)
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise ValueError(f"{what}: unknown task(s) {unknown}; known tasks: {sorted(TASKS)}")
    return tasks


# ----------------------------------------------------------------------------------------------------------------
# Constant matrices on disk (Sec. 5.3, App. A)
# ----------------------------------------------------------------------------------------------------------------


def per_task_setting(spec: Mapping, key: str, tasks: Iterable[str],
                     fallback: Mapping[str, object] | None = None) -> dict:
    """A grid setting per task: ``spec[key]`` is one value or a mapping by task with a ``default``
    (as :func:`papa_lib.experiments.grid.run_grid` reads it, :func:`~papa_lib.experiments.grid.per_task_value`);
    unset values come from ``fallback`` (or are None)."""
    tasks = check_tasks(tasks, "per_task_setting") or []
    value = spec.get(key) if isinstance(spec, Mapping) else None
    settings = {}
    for task in tasks:
        chosen = grid.per_task_value(value, task)
        settings[task] = chosen if chosen is not None else (fallback or {}).get(task)
    return settings


def task_lengths(spec: Mapping, tasks: Iterable[str]) -> dict[str, int]:
    """The sequence length L each task runs at under a grid: its ``max_length`` (an int, or a mapping by task with
    a ``default``), else Table 3's length for the task (:data:`papa_lib.experiments.task_specs.TASKS`)."""
    from ..experiments.task_specs import TASKS

    tasks = check_tasks(tasks, "task_lengths") or []
    table3 = {task: TASKS[task].max_length for task in tasks}
    return {task: int(value) for task, value in per_task_setting(spec, "max_length", tasks, table3).items()}


#: Folder inside a results folder with compact float16 copies of the constant matrices the chapters show
#: (:func:`save_shown`), committed so that a fresh clone shows them; the grid's own ``matrices/`` cache comes first.
SHOWN_FOLDER = "shown"


def save_shown(constants, folder, name: str):
    """Write ``constants`` as a compact float16 copy ``folder/name`` (:data:`SHOWN_FOLDER`); returns the path."""
    from pathlib import Path

    from safetensors.torch import save_file

    path = Path(folder) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {str(k): json.dumps(v) for k, v in {**constants.metadata, "stored_as": "float16"}.items()}
    save_file({"matrices": constants.matrices.detach().half().contiguous(),
               "counts": constants.counts.to(torch.int32).contiguous()}, str(path), metadata=meta)
    return path


def load_matrices(path):
    """Constant matrices from a file of the grid's cache or of :data:`SHOWN_FOLDER`, as float32 / int64."""
    from ..core.averaging import ConstantAttention

    constants = ConstantAttention.load(path)
    return ConstantAttention(constants.matrices.float(), constants.counts.long(), constants.metadata)


def matrix_files(results_dir, source: str, max_length: int) -> list:
    """Files of constant matrices for text of ``source`` at length L: the grid's ``matrices/`` (newest first), then
    the committed compact copies in :data:`SHOWN_FOLDER`."""
    from pathlib import Path

    found = []
    for folder in ("matrices", SHOWN_FOLDER):
        found += sorted((Path(results_dir) / folder).glob(f"{source}-L{int(max_length)}-*.safetensors"),
                        key=lambda p: p.stat().st_mtime, reverse=True)
    return found


def stored_matrices(results_dir, source: str, max_length: int, model: str | None = None):
    """The constant matrices a grid saved under ``results_dir/matrices`` for text of ``source`` at length L, else
    their committed compact copy under ``results_dir/shown`` (:func:`matrix_files`).

    Files are named ``<source>-L<L>-<hash>.safetensors`` (:func:`papa_lib.experiments.engine.constants`);
    when several match (other data folders, sizes or models), the newest one (for ``model`` when given) is returned.
    ``None`` when there is none.
    """
    if int(max_length) <= 0:
        raise ValueError(f"stored_matrices: max_length must be positive, got {max_length}")
    for path in matrix_files(results_dir, source, max_length):
        constants = load_matrices(path)
        if model is None or constants.metadata.get("model") == model:
            return constants
    return None


# ----------------------------------------------------------------------------------------------------------------
# Grid coverage (partial tables)
# ----------------------------------------------------------------------------------------------------------------


#: The columns that name one declared run in :func:`declared_runs` (and :func:`lm_declared_runs`): the same
#: configuration and seed in two grid files, or in two blocks of one file, is the same run.
RUN_KEY = ("task", "matrix_type", "selection_order", "fraction", "matrices_from", "seed")


def _record_key(row) -> tuple:
    return (row.task, row.matrix_type, row.selection_order, round(float(row.fraction), 9),
            row.matrices_from if isinstance(row.matrices_from, str) else None, int(row.seed))


def _declared(spec: Mapping, blocks: Iterable[str] | None, what: str):
    """``(block name, run key)`` for every run a grid's blocks declare, in order, a run shared by several blocks once
    per block; the key is :func:`_record_key`'s (``matrices_from``: the task's own for a text-built type)."""
    if not isinstance(spec, Mapping) or "blocks" not in spec:
        raise ValueError(f"{what}: spec must be a grid mapping with 'blocks' (papa_lib.experiments.grid.load_grid)")
    seeds, wanted = grid.grid_seeds(spec), None if blocks is None else set(blocks)

    def keys():
        for block in spec["blocks"]:
            for name, task, variant in grid.block_variants(block):
                if wanted is not None and name not in wanted:
                    continue
                source = variant.matrices_from or (
                    task if matrices.matrix_type(variant.matrix_type).from_text else None)
                for seed in seeds:
                    yield name, (task, variant.matrix_type, variant.selection_order, round(variant.fraction, 9),
                                 source, seed)

    return keys()


def declared_runs(frame: pd.DataFrame | None, spec: Mapping, blocks: Iterable[str] | None = None,
                  model: str | None = None) -> pd.DataFrame:
    """Every distinct probe run a grid declares, one row each, and whether ``frame`` holds it.

    Columns: ``block`` (the first block that declares the run: a variant several blocks share, such as the original
    model, is one run, as :func:`papa_lib.experiments.grid.grid_runs` runs it once), then :data:`RUN_KEY`
    (``matrices_from``: the text the constants are built on, the task's own for a text-built type; None for a
    data-free one) and ``done``. A run is done as in :func:`grid_coverage`; with ``model``, only that model's rows
    count; ``frame`` None (or an empty frame without columns: a folder without records) holds no run. Concatenate the
    frames of several grid files and drop duplicate :data:`RUN_KEY` rows to count the runs of a folder once.
    """
    if frame is None or (frame.empty and frame.columns.empty):
        frame = None
    else:
        check_frame(frame, "declared_runs")
    declared = _declared(spec, blocks, "declared_runs")
    if frame is not None and model is not None:
        frame = frame[frame["model"] == model]
    done_keys = set() if frame is None else {_record_key(row) for row in frame.itertuples(index=False)}
    rows, seen = [], set()
    for name, key in declared:
        if key not in seen:
            seen.add(key)
            rows.append((name, *key, key in done_keys))
    return pd.DataFrame(rows, columns=["block", *RUN_KEY, "done"])


def lm_declared_runs(records: Sequence[Mapping], section: Mapping | None, model: str | None = None) -> pd.DataFrame:
    """Every run a grid's ``language_model`` section declares (:func:`papa_lib.experiments.lm.lm_runs`), one row each,
    and whether the LM ``records`` (:func:`papa_lib.experiments.lm.lm_records`) hold it.

    Columns as :func:`declared_runs`: ``block`` is ``"language_model"``, ``task`` the corpus, ``selection_order`` the
    run's order, ``matrices_from`` the corpus for the averaged matrices (None otherwise). A record matches a run by
    corpus, length, matrix type, order, fraction and seed (and ``model``, when given). No section: an empty frame.
    """
    from ..experiments import lm

    columns = ["block", *RUN_KEY, "done"]
    if not section:
        return pd.DataFrame(columns=columns)
    settings = lm.LMSettings.from_mapping(section)
    corpus = f"{settings.corpus} test"
    done_keys = {(r["matrix_type"], r["order"], round(float(r["fraction"]), 9), int(r["seed"])) for r in records
                 if r.get("corpus") == corpus and int(r.get("length", -1)) == settings.length
                 and (model is None or r.get("model") == model)}
    rows = []
    for run in lm.lm_runs(settings):
        key = (run.matrix_type, run.order, round(float(run.fraction), 9), int(run.seed))
        source = settings.corpus if run.matrix_type == "average" else None
        rows.append(("language_model", settings.corpus, run.matrix_type, run.order, key[2], source, run.seed,
                     key in done_keys))
    return pd.DataFrame(rows, columns=columns)


def grid_coverage(frame: pd.DataFrame, spec: Mapping, blocks: Iterable[str] | None = None,
                  model: str | None = None) -> pd.DataFrame:
    """How much of a declared grid (:func:`papa_lib.experiments.grid.load_grid`) the results table holds.

    Per (block, task): ``expected`` runs (canonical variants x seeds), ``done`` (those found in ``frame``; for
    ``model`` only when given) and ``missing`` = expected - done. A run counts as done when a row has its task,
    matrix type, order, fraction, matrices source and seed.
    """
    check_frame(frame, "grid_coverage")
    declared = _declared(spec, blocks, "grid_coverage")
    if model is not None:
        frame = frame[frame["model"] == model]
    done_keys = {_record_key(row) for row in frame.itertuples(index=False)}
    counts: dict[tuple[str, str], list[int]] = {}
    for name, key in declared:
        tally = counts.setdefault((name, key[0]), [0, 0])
        tally[0] += 1
        tally[1] += key in done_keys
    records = [(name, task, expected, done, expected - done) for (name, task), (expected, done) in counts.items()]
    return pd.DataFrame(records, columns=["block", "task", "expected", "done", "missing"])
