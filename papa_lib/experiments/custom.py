"""Tasks of your own: PAPA's probing (Sec. 3.3, 4) on any single-text or text-pair classification data.

The paper probes six named tasks (Sec. 4.1).  A :class:`CustomTask` describes one more: a training and a validation
file (TSV or CSV with a header row), the column(s) holding the text (one column, or two for a pair, encoded in the
App. A layout like MRPC and MNLI), the label column and the metric.  :func:`register_custom_task` turns it into a
:class:`~papa_lib.experiments.task_specs.TaskSpec` with its own loader and adds it to
:data:`~papa_lib.experiments.task_specs.TASKS`, so :func:`~papa_lib.experiments.tasks.load_task`,
:func:`~papa_lib.experiments.metrics.compute_metric`, :class:`~papa_lib.experiments.engine.TaskExperiment` and every
function that looks a task up by name work for it unchanged (average matrices from its training text, Sec. 3.1; λ,
Sec. 3.2; all variants).

Files
-----
* The delimiter comes from the extension (``.tsv``/``.tab``: tab, ``.csv``: comma) unless given.  Tab-separated files
  are split on tabs only, without quoting (as GLUE's files are written); other delimiters follow CSV quoting rules
  (``"a, b"`` is one field, a quoted field may span lines).
* The first non-blank row is the header; blank rows are skipped; every row must have as many fields as the header.
  Files are UTF-8 (a byte-order mark is allowed).
* Labels are strings or integers.  The label set is the training file's, sorted deterministically (numerically when
  every label is an integer, else as text); a label id is the position in that order.  A validation label that does
  not occur in the training file is an error naming the file and line.
* ``metric``: ``accuracy``, ``mcc`` (Matthews correlation, as CoLA) or ``f1`` (F1 of the positive class, as MRPC:
  needs exactly two labels; the positive class is the second in the sorted order, e.g. ``1`` of ``0/1`` or ``pos``
  of ``neg/pos``).

Hyperparameters default to SST-2's row of App. B, Table 3 (learning rate 1e-4, batch 32, 4 epochs) with L = 128.

A task's ``provenance`` (files, their SHA-256, columns, delimiter, labels) goes into every record and into the run
id, so two data sets registered under the same name never share results.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.artefacts import checksum
from ..errors import PapaInputError
from .task_specs import TASKS, SentenceExamples, TaskSpec

__all__ = ["CustomTask", "METRICS", "register_custom_task", "register_custom_tasks"]

#: Metric names a custom task accepts, and the name :func:`~papa_lib.experiments.metrics.compute_metric` uses.
METRICS: dict[str, str] = {"accuracy": "accuracy", "f1": "f1", "mcc": "matthews_corrcoef",
                           "matthews_corrcoef": "matthews_corrcoef"}
_DELIMITERS = {".tsv": "\t", ".tab": "\t", ".csv": ","}
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_BUILTIN_TASKS = frozenset(TASKS)


@dataclass(frozen=True)
class CustomTask:
    """A classification task given by files (see the module docstring).

    Attributes:
        name: the task's name in :data:`~papa_lib.experiments.task_specs.TASKS` and in records (letters, digits,
            ``_.-``).
        train, validation: the two files.
        text_columns: one column name (single text) or two (a pair); a string ``"a,b"`` is split on commas.
        label_column: the column holding the label.
        metric: ``accuracy``, ``f1`` or ``mcc``.
        max_length: L (even for pairs, App. A layout); default 128.
        delimiter: field separator; default from the extension of each file.
        learning_rate, batch_size, epochs: the probe's hyperparameters (default: SST-2's row of Table 3).
    """

    name: str
    train: str | Path
    validation: str | Path
    text_columns: tuple[str, ...] | str
    label_column: str
    metric: str = "accuracy"
    max_length: int | None = None
    delimiter: str | None = None
    learning_rate: float = 1e-4
    batch_size: int = 32
    epochs: int = 4

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise PapaInputError(
                f"custom task name {self.name!r} must be letters, digits, '_', '.' or '-' (no spaces or '/')"
            )
        columns = self.text_columns
        if isinstance(columns, str):
            columns = columns.split(",")
        columns = tuple(str(c).strip() for c in columns)
        if not 1 <= len(columns) <= 2 or not all(columns):
            raise PapaInputError(
                f"custom task {self.name!r}: text columns must be one or two column names, got {self.text_columns!r}"
            )
        object.__setattr__(self, "text_columns", columns)
        if not str(self.label_column).strip():
            raise PapaInputError(f"custom task {self.name!r}: the label column name is empty")
        if self.label_column in columns:
            raise PapaInputError(
                f"custom task {self.name!r}: column {self.label_column!r} cannot be both text and label")
        if self.metric not in METRICS:
            raise PapaInputError(
                f"custom task {self.name!r}: unknown metric {self.metric!r}; choose accuracy, f1 or mcc")
        length = 128 if self.max_length is None else self.max_length
        if isinstance(length, bool) or not isinstance(length, int) or length < 4:
            raise PapaInputError(
                f"custom task {self.name!r}: max_length must be an integer >= 4, got {self.max_length!r}")
        if len(columns) == 2 and length % 2:
            raise PapaInputError(f"custom task {self.name!r}: a pair task needs an even max_length "
                             f"(the App. A layout puts the middle separator at L/2), got {length}")
        object.__setattr__(self, "max_length", length)
        for key in ("learning_rate", "batch_size", "epochs"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise PapaInputError(f"custom task {self.name!r}: {key} must be a positive number, got {value!r}")
        if self.delimiter is not None:
            object.__setattr__(self, "delimiter", _parse_delimiter(self.delimiter, self.name))

    @property
    def is_pair(self) -> bool:
        return len(self.text_columns) == 2

    def delimiter_of(self, path: str | Path) -> str:
        """The field separator of ``path``: the task's ``delimiter``, else the one its extension implies."""
        if self.delimiter is not None:
            return self.delimiter
        suffix = Path(path).suffix.lower()
        if suffix not in _DELIMITERS:
            raise PapaInputError(f"{path}: cannot tell the delimiter from the extension {suffix or '(none)'!r}; "
                             "name the file .tsv or .csv, or give the delimiter (--delimiter)")
        return _DELIMITERS[suffix]


def _parse_delimiter(text: str, name: str) -> str:
    named = {"tab": "\t", "\\t": "\t", "comma": ",", "semicolon": ";", "pipe": "|"}
    value = named.get(str(text).lower(), str(text))
    if len(value) != 1 or value in "\r\n\"":
        raise PapaInputError(
            f"custom task {name!r}: delimiter must be one character (or tab, comma, semicolon, pipe), got {text!r}"
        )
    return value


def _rows(path: Path, delimiter: str) -> Iterator[tuple[int, list[str], list[str]]]:
    """Yield (first line of the row, fields, header) for every data row; checks the field count."""
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    header = None
    try:
        with open(path, encoding="utf-8-sig", newline="") as handle:
            reader = csv.reader(handle, delimiter=delimiter, quoting=quoting, strict=True)
            end = 0
            while True:
                start = end + 1
                try:
                    row = next(reader)
                except StopIteration:
                    break
                except csv.Error as error:
                    raise PapaInputError(f"{path}:{reader.line_num}: {error}") from None
                end = reader.line_num
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if header is None:
                    header = [name.strip() for name in row]
                    continue
                if len(row) != len(header):
                    sep = "tab" if delimiter == "\t" else repr(delimiter)
                    raise PapaInputError(
                        f"{path}:{start}: expected {len(header)} {sep}-separated fields (as in the header), "
                        f"found {len(row)}"
                    )
                yield start, row, header
    except UnicodeDecodeError as error:
        raise PapaInputError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    if header is None:
        raise PapaInputError(f"{path}: file is empty (expected a header row)")


def _columns(task: CustomTask, path: Path, header: list[str]) -> list[int]:
    wanted = list(task.text_columns) + [task.label_column]
    missing = [name for name in wanted if name not in header]
    if missing:
        raise PapaInputError(f"{path}:1: no column {missing[0]!r} in the header {header}")
    return [header.index(name) for name in wanted]


def _header(task: CustomTask, path: Path) -> list[str]:
    """The header of ``path`` (checked for the task's columns), without reading the whole file."""
    delimiter = task.delimiter_of(path)
    with open(path, encoding="utf-8-sig", newline="") as handle:
        try:
            for row in csv.reader(
                handle, delimiter=delimiter, quoting=csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
            ):
                if row and any(field.strip() for field in row):
                    header = [name.strip() for name in row]
                    _columns(task, path, header)
                    return header
        except (UnicodeDecodeError, csv.Error) as error:
            raise PapaInputError(f"{path}:1: cannot read the header ({error})") from None
    raise PapaInputError(f"{path}: file is empty (expected a header row)")


def _read(task: CustomTask, path: Path) -> tuple[list[str], list[str] | None, list[str], list[int]]:
    """(texts, pairs, label strings, line numbers) of one file."""
    texts: list[str] = []
    pairs: list[str] | None = [] if task.is_pair else None
    labels: list[str] = []
    lines: list[int] = []
    cols = None
    for lineno, row, header in _rows(path, task.delimiter_of(path)):
        if cols is None:
            cols = _columns(task, path, header)
        label = row[cols[-1]].strip()
        if not label:
            raise PapaInputError(f"{path}:{lineno}: empty label in column {task.label_column!r}")
        texts.append(row[cols[0]])
        if pairs is not None:
            pairs.append(row[cols[1]])
        labels.append(label)
        lines.append(lineno)
    return texts, pairs, labels, lines


def _label_order(labels: Iterable[str]) -> tuple[str, ...]:
    """Distinct labels, numerically sorted when all are integers, else sorted as text."""
    distinct = set(labels)
    try:
        return tuple(sorted(distinct, key=lambda label: (int(label), label)))
    except ValueError:
        return tuple(sorted(distinct))


def _load(task: CustomTask, label_names: tuple[str, ...], split: str) -> SentenceExamples:
    path = Path(task.train if split == "train" else task.validation)
    texts, pairs, labels, lines = _read(task, path)
    ids = {label: i for i, label in enumerate(label_names)}
    for label, lineno in zip(labels, lines):
        if label not in ids:
            raise PapaInputError(f"{path}:{lineno}: label {label!r} does not occur in the training file {task.train} "
                             f"(its labels: {list(label_names)})")
    return SentenceExamples(texts=texts, pairs=pairs, labels=[ids[label] for label in labels], source=str(path))


def _check_not_builtin(name: str) -> None:
    """Refuse the name of one of the paper's tasks (a custom task never replaces one)."""
    if name in _BUILTIN_TASKS:
        raise PapaInputError(f"custom task name {name!r} is taken by one of the paper's tasks; choose another name")


def register_custom_task(task: CustomTask) -> TaskSpec:
    """Check ``task``'s files, build its :class:`TaskSpec` and add it to :data:`~papa_lib.experiments.task_specs.TASKS`.

    Reads the training file once (for the label set) and the validation file's header. Registering a name again
    replaces the earlier custom task; the names of the paper's tasks are refused.

    Raises:
        FileNotFoundError: a file is missing.
        ValueError: a bad file (message ``file:line: ...``), a missing column, fewer than two labels, or ``f1``
            with other than two labels.
    """
    _check_not_builtin(task.name)
    train, validation = Path(task.train), Path(task.validation)
    for what, path in (("training", train), ("validation", validation)):
        if not path.is_file():
            raise FileNotFoundError(f"custom task {task.name}: {what} file not found: {path}")
    _header(task, validation)
    _, _, labels, _ = _read(task, train)
    if not labels:
        raise PapaInputError(f"{train}: the training set of {task.name} is empty: the file has no examples")
    label_names = _label_order(labels)
    if len(label_names) < 2:
        raise PapaInputError(
            f"{train}: every example has the label {label_names[0]!r}; a classifier needs two labels or more"
        )
    if METRICS[task.metric] == "f1" and len(label_names) != 2:
        raise PapaInputError(f"custom task {task.name}: metric f1 scores the positive class of a two-label task, but "
                         f"{train} has {len(label_names)} labels; use accuracy or mcc")
    delimiters = [task.delimiter_of(train), task.delimiter_of(validation)]
    provenance = {
        "train": str(train), "validation": str(validation),
        "train_sha256": checksum(train), "validation_sha256": checksum(validation),
        "text_columns": list(task.text_columns), "label_column": task.label_column,
        "delimiter": delimiters[0] if delimiters[0] == delimiters[1] else delimiters, "labels": list(label_names),
    }
    spec = TaskSpec(
        name=task.name, kind="sentence", is_pair=task.is_pair, metric=METRICS[task.metric], label_names=label_names,
        learning_rate=float(task.learning_rate), batch_size=int(task.batch_size), epochs=int(task.epochs),
        max_length=task.max_length, validation_split=f"custom validation file {validation}",
        loader=lambda split: _load(task, label_names, split), provenance=provenance,
    )
    TASKS[task.name] = spec
    return spec


def register_custom_tasks(entries: Any, base: str | Path | None = None, where: str = "custom_tasks",
                          root=None) -> list[CustomTask]:
    """Register a grid file's ``custom_tasks:`` list (mappings with :class:`CustomTask`'s fields) or CustomTask objects.

    Each mapping is checked first (:class:`~papa_lib.experiments.specs.CustomTaskSpec`: unknown keys with the closest
    valid one, types, ranges); ``root`` (the grid file's YAML node tree) lets errors name the line. Relative file paths
    are taken relative to ``base`` (the grid file's folder); ``where`` names the source in errors. Returns the
    registered tasks (as :class:`CustomTask` with resolved paths).
    """
    from .specs import CustomTaskSpec, at, validate

    if entries is None:
        return []
    if not isinstance(entries, (list, tuple)):
        raise PapaInputError(f"{at(where, root, ('custom_tasks',))}: custom_tasks must be a list of tasks, "
                         f"got {type(entries).__name__}")
    checked: list[CustomTask] = []
    for i, entry in enumerate(entries):  # every entry checked before any file is read
        here = at(where, root, ("custom_tasks", i))
        if not isinstance(entry, CustomTask):
            if not isinstance(entry, dict):
                raise PapaInputError(f"{here}: custom task {i} must be a mapping with name, train, validation, "
                                 f"text_columns and label_column, got {entry!r}")
            validate(CustomTaskSpec, entry, where, root, base=("custom_tasks", i))
            entry = dict(entry)
            for key in ("train", "validation"):
                path = Path(str(entry[key]))
                entry[key] = str(path if base is None or path.is_absolute() else Path(base) / path)
            try:
                entry = CustomTask(**entry)
            except ValueError as error:
                raise PapaInputError(f"{here}: {error}") from None
        if entry.name in {t.name for t in checked}:
            raise PapaInputError(f"{here}: custom task {entry.name!r} is declared twice")
        try:
            _check_not_builtin(entry.name)
        except PapaInputError as error:
            raise PapaInputError(f"{here}: {error}") from None
        checked.append(entry)
    for i, entry in enumerate(checked):
        try:
            register_custom_task(entry)
        except FileNotFoundError as error:  # a missing data file: say where the grid file names it
            missing = "validation" if Path(entry.train).is_file() else "train"
            raise FileNotFoundError(f"{at(where, root, ('custom_tasks', i, missing))}: {error}") from None
    return checked
