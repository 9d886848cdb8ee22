"""Results store for PAPA's experiment grid.

Hassid et al. (2022), "How Much Does Attention Actually Attend?", Sec. 4.1-4.2 and Sec. 5:
every experiment is one cell of a grid

    (model, task, matrix type, selection order, fraction of input-dependent heads, seed)

where the fraction takes the values {1, 1/2, 1/8, 1/16, 0} (Sec. 4.2), and every configuration is run with
three random seeds; the paper reports the mean over seeds with a 95% confidence interval (Sec. 4.1) and the
*relative* drop of each variant from the original model, i.e. the model with all heads input-dependent
(fraction = 1; Sec. 4.2, Fig. 2-3: "an average relative drop of only 8%").

:class:`ResultsStore` keeps one row per finished run, keyed by ``run_id``, in a tidy CSV table
(``root/results.csv``); a grid resumes by skipping the run ids already stored
(:func:`papa_lib.experiments.engine.pending_seeds`). The provenance helpers for the records (``config_hash``,
``package_versions``) live in :mod:`papa_lib.experiments.provenance`, the paper's summary statistics
(``mean_ci``, ``summarize``, ``relative_drop``) in :mod:`papa_lib.experiments.summaries`.

The CSV is meant to be committed and diffed: fixed column order (:data:`RECORD_FIELDS` first, then any extra
columns in alphabetical order), rows sorted by ``finished_at`` then ``run_id``, floats written with Python's
shortest round-trip ``repr`` so that values survive a write/read cycle bit for bit.

Writers lock the store (:meth:`ResultsStore.writer_lock`), so processes appending to one store in parallel (grid
shards, lanes of ``papa grid --task``) lose no record; readers never wait. A full disk during an append leaves the
old table as it was. A torn last line is set aside into ``results.csv.torn-<time>`` (one-line notice) and its run
computed again; damage before it is reported with its line, and :meth:`ResultsStore.repair` (``papa grid FILE
--repair``) keeps every intact record, moving damaged lines into ``results.csv.damaged-<time>``.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.artefacts import notice, write_atomic
from ..errors import PapaInputError
from .damage import Damage, DamagedStoreError, row_problem, scan_table, side_file

__all__ = [
    "RECORD_FIELDS",
    "REQUIRED_FIELDS",
    "PROVENANCE_FIELDS",
    "RESULTS_FILENAME",
    "ResultsStore",
    "read_results",
]

#: Where a record was made, beside ``versions`` and ``device`` (:func:`papa_lib.experiments.provenance.run_provenance`):
#: the repository's git commit
#: (``unknown`` outside a git checkout; ``-dirty`` when tracked files differ from it), the SHA-256 of each data file
#: read (JSON ``{file: digest}``), torch and transformers versions, the processor (the GPU's name on a CUDA device,
#: else the CPU's model name), torch's thread count and the optimiser implementation. Records made before these
#: columns existed read them as empty (missing values); a record may leave them out (they are not required).
PROVENANCE_FIELDS: tuple[str, ...] = (
    "git_commit", "data_sha256", "torch_version", "transformers_version", "processor", "threads", "optimizer",
)

#: Columns of the tidy results table, in the order they are written.
RECORD_FIELDS: tuple[str, ...] = (
    "run_id", "model", "task", "matrix_type", "matrices_from", "selection_order", "fraction", "seed", "metric",
    "value", "eval_size", "train_size", "config_hash", "profile", "data_source", "versions", "device",
    "wall_time_s", "finished_at", *PROVENANCE_FIELDS,
)

#: Columns a results table's header must have (provenance columns may be absent: tables written before them).
_HEADER_FIELDS = tuple(f for f in RECORD_FIELDS if f not in PROVENANCE_FIELDS)

#: Fields a record passed to :meth:`ResultsStore.append` must contain (``finished_at`` is filled in).
REQUIRED_FIELDS: tuple[str, ...] = tuple(f for f in RECORD_FIELDS if f != "finished_at" and f not in PROVENANCE_FIELDS)

#: Fields that must hold a real value (not ``None``); the other required fields may be ``None`` when they do
#: not apply (e.g. ``matrix_type`` for the original model).
NON_NULL_FIELDS: tuple[str, ...] = ("run_id", "model", "task", "fraction", "seed", "metric", "value")

#: Name of the table inside a store's root directory.
RESULTS_FILENAME = "results.csv"
#: The writers' lock file beside it (see :meth:`ResultsStore.writer_lock`).
LOCK_FILENAME = ".results.lock"

_FLOAT_FIELDS = ("fraction", "value", "wall_time_s")
_INT_FIELDS = ("seed", "eval_size", "train_size", "threads")
_STRING_FIELDS = tuple(f for f in RECORD_FIELDS if f not in _FLOAT_FIELDS + _INT_FIELDS)


# --------------------------------------------------------------------------------------------------------------
# Learning curves
# --------------------------------------------------------------------------------------------------------------


def write_curve(results_dir: str | Path, run_id: str, curve: list[dict]) -> str:
    """Write a run's learning curve (one row per epoch) to ``results_dir/curves/<run_id>.csv``; its relative path."""
    def write(tmp: Path) -> None:
        with tmp.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(curve[0]) if curve else ["epoch"])
            writer.writeheader()
            writer.writerows(curve)

    path = write_atomic(Path(results_dir) / "curves" / f"{run_id}.csv", write, sums=False)  # written, never read back
    return str(path.relative_to(Path(results_dir)))


# --------------------------------------------------------------------------------------------------------------
# Cell encoding: record values <-> CSV text
# --------------------------------------------------------------------------------------------------------------


def _format_float(value: float) -> str:
    """Full-precision text for a float (``repr`` round-trips exactly)."""
    return repr(float(value))


def _encode_cell(field: str, value: Any) -> str:
    """Turn one record value into the exact text stored in the CSV ('' means missing)."""
    if value is None:
        return ""
    if isinstance(value, float) and math.isnan(value) and field not in ("value",):
        return ""
    if field in _FLOAT_FIELDS:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"record field {field!r} must be a number, got {value!r}") from None
        if isinstance(value, bool):
            raise ValueError(f"record field {field!r} must be a number, got bool {value!r}")
        return _format_float(number)
    if field in _INT_FIELDS:
        if isinstance(value, bool):
            raise ValueError(f"record field {field!r} must be an integer, got bool {value!r}")
        if isinstance(value, (float, np.floating)):
            if not float(value).is_integer():
                raise ValueError(f"record field {field!r} must be an integer, got {value!r}")
            value = int(value)
        try:
            return str(int(value))
        except (TypeError, ValueError):
            raise ValueError(f"record field {field!r} must be an integer, got {value!r}") from None
    if field == "versions":
        if isinstance(value, Mapping):
            return json.dumps(dict(value), sort_keys=True)
        if isinstance(value, str):
            try:
                json.loads(value)
            except json.JSONDecodeError as err:
                raise ValueError(f"record field 'versions' is not valid JSON ({err}): {value!r}") from None
            return value
        raise ValueError(f"record field 'versions' must be a dict or a JSON string, got {type(value).__name__}")
    if field in _STRING_FIELDS:
        return str(value)
    # Extra (non-standard) columns: numbers at full precision, containers as JSON, the rest as str.
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (float, np.floating)):
        return _format_float(value)
    if isinstance(value, (Mapping, list, tuple)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _normalize_record(record: Mapping[str, Any]) -> dict[str, str]:
    """Validate a record and return it as ``{column: csv text}``; raises ValueError naming every problem."""
    if not isinstance(record, Mapping):
        raise ValueError(f"a results record must be a dict, got {type(record).__name__}")
    missing = [f for f in REQUIRED_FIELDS if f not in record]
    if missing:
        raise ValueError(f"results record is missing required field(s): {', '.join(missing)}")
    bad_keys = [k for k in record if not isinstance(k, str) or not k]
    if bad_keys:
        raise ValueError(f"results record has non-string or empty column name(s): {bad_keys!r}")
    cells = {key: _encode_cell(key, val) for key, val in record.items()}
    null = [f for f in NON_NULL_FIELDS if cells[f] == ""]
    if null:
        raise ValueError(f"results record field(s) must not be empty/None: {', '.join(null)}")
    fraction = float(cells["fraction"])
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"record field 'fraction' must be in [0, 1] (share of input-dependent heads), got {fraction}")
    if not cells.get("finished_at"):
        cells["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="microseconds")
    return cells


def _decode_string(text: str) -> str | None:
    return text if text != "" else None


def _decode_extra_column(values: list[str]) -> pd.Series:
    """Extra columns come back as numbers when every non-empty cell parses as one, else as strings."""
    present = [v for v in values if v != ""]
    try:
        if present and all(str(int(v)) == v for v in present):
            return pd.Series([int(v) if v != "" else pd.NA for v in values], dtype="Int64")
    except ValueError:
        pass
    try:
        if present:
            return pd.Series([float(v) if v != "" else np.nan for v in values], dtype="float64")
    except ValueError:
        pass
    return pd.Series([_decode_string(v) for v in values], dtype="object")


# --------------------------------------------------------------------------------------------------------------
# The store
# --------------------------------------------------------------------------------------------------------------


class ResultsStore:
    """Append-only tidy table of finished runs in ``root/results.csv``, one row per ``run_id``.

    Every :meth:`append` rewrites the whole table to a temporary file in the same directory, fsyncs it and
    moves it over the old table with ``os.replace``; an interruption at any point therefore leaves either
    the old or the new table on disk, never a partially written one. Each read-add-write holds
    :meth:`writer_lock`, so several processes may append to the same store at once.
    """

    def __init__(self, root: str | Path, read_only: bool = False):
        """Open (and create when needed) the store directory ``root``. ``read_only`` (``papa grid --plan``): create
        nothing and write nothing; a torn last line is only named (its run counts as not stored)."""
        self.root = Path(root)
        self.read_only = read_only
        if self.root.exists() and not self.root.is_dir():
            raise NotADirectoryError(f"results store root {self.root} exists and is not a directory")
        if not read_only:
            self.root.mkdir(parents=True, exist_ok=True)
        self.path = self.root / RESULTS_FILENAME
        self._cache_key: tuple | None = None
        self._cache: tuple[list[str], list[dict[str, str]]] = ([], [])
        self._lock = None

    def __repr__(self) -> str:
        return f"ResultsStore({str(self.root)!r})"

    def __len__(self) -> int:
        """Number of stored runs."""
        return len(self._read_table()[1])

    # ---- reading --------------------------------------------------------------------------------------------

    def _read_table(self) -> tuple[list[str], list[dict[str, str]]]:
        """Return ``(header, rows)`` with rows as ``{column: raw text}``; cached until the file changes. A torn last
        line is set aside (:meth:`_set_aside_torn`); damage before it raises :class:`DamagedStoreError`."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._cache_key, self._cache = None, ([], [])
            return [], []
        key = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if key == self._cache_key:
            return self._cache
        header, rows, damaged = self._scan()
        if damaged:
            last = damaged[-1]
            if len(damaged) == 1 and last.final and self.read_only:
                notice(f"{self._last_line_words(last)}; a run would set it aside")
                return header, rows
            if len(damaged) == 1 and last.final:
                return self._set_aside_torn()
            raise self._damaged(damaged)
        table = (header, rows)
        self._cache_key, self._cache = key, table
        return table

    def _scan(self) -> tuple[list[str], list[dict[str, str]], list[Damage]]:
        """Parse the table: ``(header, intact rows, damaged lines)``; nothing is raised for a damaged row."""
        return scan_table(self.path, _HEADER_FIELDS, lambda row: row_problem(row, NON_NULL_FIELDS, _FLOAT_FIELDS,
                                                                              _INT_FIELDS))

    def _damaged(self, damaged: list[Damage]) -> DamagedStoreError:
        """The error for damaged lines: the first one's line and reason, and how many more there are."""
        first = damaged[0]
        return DamagedStoreError(
            f"{self.path}:{first.line}: {first.reason}"
            + (f" (and {len(damaged) - 1} more damaged line(s))" if len(damaged) > 1 else ""),
            path=self.path, lines=[d.line for d in damaged])

    def _set_aside_torn(self) -> tuple[list[str], list[dict[str, str]]]:
        """Move a torn final line into ``results.csv.torn-<time>`` (one-line notice) and rewrite the table."""
        with self.writer_lock():
            header, rows, damaged = self._scan()  # another writer may have healed it meanwhile
            if damaged:
                if not (len(damaged) == 1 and damaged[0].final):
                    raise self._damaged(damaged)
                side = side_file(self.path, "torn", damaged)
                self._write_table(header, rows)
                notice(f"{self._last_line_words(damaged[0])}; set it aside in {side}")
            stat = self.path.stat()
            self._cache_key = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
            self._cache = (header, rows)
        return self._cache

    def _last_line_words(self, last: Damage) -> str:
        """What a damaged last line is: a repeat of a stored run (kept), or a line cut off (its run runs again)."""
        if last.reason.startswith("duplicate run_id"):
            return (f"the last line of {self.path} (line {last.line}) repeats a stored run ({last.reason}); the stored "
                    "record is kept")
        return (f"the last line of {self.path} (line {last.line}) was cut off ({last.reason}); its run will be "
                "computed again")

    def repair(self) -> tuple[int, list[int], Path | None]:
        """Keep every intact record and move every damaged line into ``results.csv.damaged-<time>``.

        Returns ``(records kept, damaged line numbers, side file or None)``; the table is rewritten atomically.
        """
        with self.writer_lock():
            if not self.path.exists():
                return 0, [], None
            header, rows, damaged = self._scan()
            if not damaged:
                return len(rows), [], None
            side = side_file(self.path, "damaged", damaged)
            self._write_table(header, rows)
            self._cache_key = None
        return len(rows), [d.line for d in damaged], side

    def has(self, run_id: str) -> bool:
        """True when a run with this ``run_id`` is already stored."""
        return any(row["run_id"] == str(run_id) for row in self._read_table()[1])

    def run_ids(self) -> list[str]:
        """All stored run ids, in table order."""
        return [row["run_id"] for row in self._read_table()[1]]

    def frame(self) -> pd.DataFrame:
        """All records as a DataFrame (an empty one with :data:`RECORD_FIELDS` columns when none).

        Dtypes: ``fraction``/``value``/``wall_time_s`` float64, ``seed`` int64, ``eval_size``/``train_size``
        nullable Int64, text columns object with ``None`` for missing cells; ``versions`` stays a JSON string.
        """
        header, rows = self._read_table()
        if not rows:
            columns = list(RECORD_FIELDS) + [c for c in header if c not in RECORD_FIELDS]
            return pd.DataFrame({c: pd.Series(dtype=_empty_dtype(c)) for c in columns})
        data: dict[str, pd.Series] = {}
        for column in header:
            texts = [row[column] for row in rows]
            try:
                data[column] = _decode_column(column, texts)
            except ValueError as err:
                raise PapaInputError(f"{self.path}: column {column!r}: {err}") from None
        if "average_limit" in data:  # examples the constant matrices averaged; records from before it: all
            data["average_limit"] = pd.Series(["all" if _is_missing(v) or v == "all" else int(v)
                                               for v in data["average_limit"]], dtype=object)
        columns = list(RECORD_FIELDS) + [c for c in header if c not in RECORD_FIELDS]
        for column in columns:  # provenance columns of a table written before they existed: empty
            if column not in data:
                data[column] = _decode_column(column, [""] * len(rows))
        return pd.DataFrame({c: data[c] for c in columns})

    def get(self, run_id: str) -> dict:
        """The stored record of ``run_id`` as a dict (same types as :meth:`frame`); KeyError when absent."""
        frame = self.frame()
        match = frame[frame["run_id"] == str(run_id)]
        if match.empty:
            raise KeyError(f"run_id {run_id!r} is not in {self.path}")
        return _frame_records(match)[0]

    # ---- writing --------------------------------------------------------------------------------------------

    @contextmanager
    def writer_lock(self):
        """Hold the store's exclusive writer lock (``root/.results.lock``, :mod:`filelock`: ``flock`` on POSIX,
        ``msvcrt`` locking on Windows; released when the block ends or the process dies). Re-entrant. Every write
        holds it, so a read-only store (``papa grid --plan``) refuses here."""
        if self.read_only:
            raise RuntimeError(f"{self!r} was opened read-only (a plan): it writes nothing")
        if self._lock is None:
            from filelock import FileLock

            self._lock = FileLock(str(self.root / LOCK_FILENAME))
        with self._lock:
            yield

    def append(self, record: dict, *, replace: bool = False, exist_ok: bool = False) -> bool:
        """Validate ``record`` and add it to the table atomically; whether it was written.

        Every field of :data:`REQUIRED_FIELDS` must be present (missing ones are named in the ValueError);
        ``finished_at`` is filled with the current UTC time (ISO 8601) when absent. Extra keys become extra
        columns. A ``run_id`` that is already stored raises ValueError unless ``replace=True`` (overwrite it) or
        ``exist_ok=True`` (keep the stored record and return False: a parallel writer finished the run first).
        """
        cells = _normalize_record(record)
        with self.writer_lock():
            header, rows = self._read_table()
            run_id = cells["run_id"]
            exists = any(row["run_id"] == run_id for row in rows)
            if exists and exist_ok and not replace:
                return False
            if exists and not replace:
                raise ValueError(f"run_id {run_id!r} is already stored in {self.path} (pass replace=True to overwrite)")
            self._write_sorted([*header, *cells], [row for row in rows if row["run_id"] != run_id] + [cells])
        return True

    def merge(self, other: ResultsStore | str | Path) -> int:
        """Add the records of another store (e.g. a grid shard run in parallel) whose ``run_id`` is not here yet.

        Records are copied as stored (same run ids, same values); one atomic write. Returns how many were added.
        """
        other = other if isinstance(other, ResultsStore) else ResultsStore(other)
        other_header, other_rows = other._read_table()
        with self.writer_lock():
            header, rows = self._read_table()
            known = {row["run_id"] for row in rows}
            new = [row for row in other_rows if row["run_id"] not in known]
            if not new:
                return 0
            self._write_sorted(header + other_header, rows + new)
        return len(new)

    def _write_sorted(self, columns: list[str], rows: list[dict[str, str]]) -> None:
        """Write ``rows`` in the table's order (``finished_at``, then ``run_id``) under :data:`RECORD_FIELDS` and the
        other ``columns`` (alphabetical)."""
        rows.sort(key=lambda row: (row.get("finished_at", ""), row["run_id"]))
        self._write_table(list(RECORD_FIELDS) + sorted({c for c in columns if c not in RECORD_FIELDS}), rows)

    def _write_table(self, columns: list[str], rows: list[dict[str, str]]) -> None:
        """Write the full table to a temp file next to it, fsync, then ``os.replace`` it over the old one."""
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow([row.get(c, "") for c in columns])
        text = buffer.getvalue()

        try:
            mode = self.path.stat().st_mode & 0o777
        except FileNotFoundError:
            mode = 0o644

        def write(tmp: Path) -> None:
            with open(tmp, "w", encoding="utf-8", newline="") as handle:
                handle.write(text)

        try:
            write_atomic(self.path, write, sums=False, mode=mode)  # a temporary file next to it, then os.replace
        except OSError as error:
            if error.errno is not None and error.strerror:  # e.g. a full disk
                raise OSError(error.errno, f"{error.strerror}; could not write {self.path}, which is unchanged "
                                           f"(no record lost)") from error
            raise
        _fsync_directory(self.root)


def _fsync_directory(directory: Path) -> None:
    """Persist a rename on POSIX by fsyncing the directory (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _empty_dtype(column: str) -> str:
    if column in _FLOAT_FIELDS:
        return "float64"
    if column == "seed":
        return "int64"
    if column in _INT_FIELDS:
        return "Int64"
    return "object"


def _decode_column(column: str, texts: list[str]) -> pd.Series:
    """Turn a stored column of CSV texts back into a typed Series."""
    if column in _FLOAT_FIELDS:
        return pd.Series([float(t) if t != "" else np.nan for t in texts], dtype="float64")
    if column == "seed":
        return pd.Series([int(t) for t in texts], dtype="int64")
    if column in _INT_FIELDS:
        return pd.Series([int(t) if t != "" else pd.NA for t in texts], dtype="Int64")
    if column in RECORD_FIELDS:
        return pd.Series([_decode_string(t) for t in texts], dtype="object")
    return _decode_extra_column(texts)


def _frame_records(frame: pd.DataFrame) -> list[dict]:
    """Rows of a results frame as plain-Python dicts (missing text/int cells -> None, missing floats -> NaN)."""
    records = []
    for row in frame.to_dict(orient="records"):
        record = {}
        for key, val in row.items():
            if _is_missing(val):
                val = float("nan") if key in _FLOAT_FIELDS else None
            elif isinstance(val, np.generic):
                val = val.item()
            record[key] = val
        records.append(record)
    return records


def _is_missing(value: Any) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def read_results(root: str | Path) -> pd.DataFrame:
    """All records of the store at ``root`` (see :meth:`ResultsStore.frame`).

    Raises FileNotFoundError when ``root`` does not exist (rather than silently creating an empty store).
    """
    if not Path(root).is_dir():
        raise FileNotFoundError(f"results store directory {root} does not exist")
    return ResultsStore(root).frame()
