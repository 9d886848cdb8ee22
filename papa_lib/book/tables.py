"""How the book's tables look: readable headers, task names, three significant figures, words for missing values.

:func:`install` (called by :func:`papa_lib.book.charts.setup`, once per chapter) registers an HTML formatter for
pandas DataFrames and Stylers in the running IPython kernel, so every table a chapter shows, whichever helper built
it, follows the same rules: task ids in headers, index and ``task``/``tasks`` columns read as the book names the tasks
(``sst2`` -> ``SST-2``, :data:`TASK_NAMES`), raw identifiers in headers become words (``ci_low`` ->
``95% interval, low``; :func:`readable`), a default 0, 1, 2 … index is hidden, numbers show
at most three significant figures (integers and large values as whole numbers with thousands separators), and a
missing value reads "—". :func:`display_frame` is the DataFrame those rules give, for tests and for text output.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..analysis import paper

__all__ = ["FIELD_TITLES", "METRIC_NAMES", "TASK_NAMES", "display_frame", "format_number", "install", "interval_below",
           "name_tasks", "paper_table", "plural", "readable", "task_name", "to_html"]

#: What a missing value reads as in a table.
MISSING = "—"


def plural(count: int, word: str, number: bool = True) -> str:
    """``'1 task'``, ``'6 tasks'`` (``number=False``: the word alone, in the form ``count`` needs): no ``task(s)``."""
    irregular = {"epoch": "epochs"}  # a "ch" said as "k" takes a plain "s"
    form = word if int(count) == 1 else irregular.get(word) or (
        word + "es" if word.endswith(("s", "x", "ch", "sh")) else word + "s")
    return f"{count} {form}" if number else form


def format_number(value: Any) -> Any:
    """A number with at most three significant figures (``0.083989`` -> ``0.084``, ``123.669`` -> ``124``,
    ``7696.0`` -> ``7,696``); missing values read ``—``; anything else is returned unchanged."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA or value is pd.NaT:
        return MISSING
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isinf(value):
            return "∞" if value > 0 else "−∞"
        if value == 0:
            return "0"
        if abs(value) >= 100 or float(value).is_integer():
            return f"{value:,.0f}"
        text = f"{value:.3g}"
        if "e" in text:
            text = f"{value:.2e}"
        return text
    if isinstance(value, np.integer):
        return f"{int(value):,}"
    if isinstance(value, np.floating):
        return format_number(float(value))
    return value


#: How the book names the records' metrics in its tables (the records keep the raw names).
METRIC_NAMES = {"matthews_corrcoef": "MCC", "f1": "F1", "accuracy": "accuracy", "seqeval_f1": "F1 (seqeval)"}

#: How the book names the tasks (the records keep the raw names).
TASK_NAMES = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "mnli": "MNLI", "ner": "NER", "pos": "POS"}


def task_name(task: str) -> str:
    """A task as the book names it: ``sst2`` -> ``SST-2``; a task it does not know keeps its own name."""
    return TASK_NAMES.get(task, task)


def name_tasks(text: Any) -> Any:
    """Every task id standing as a word in ``text`` as the book names it (``"cola, sst2; worst task: cola"`` ->
    ``"CoLA, SST-2; worst task: CoLA"``). Ids that are part of a name (``sst2-L64``, ``results/sst2``, ``mnli.tsv``)
    and Markdown code spans (`` `--task sst2` ``) keep them; anything but a string is returned unchanged."""
    import re

    if not isinstance(text, str):
        return text
    word = re.compile(r"(?<![\w/.#=\"'-])(" + "|".join(TASK_NAMES) + r")(?![\w/-]|\.\w)")
    parts = re.split(r"(`[^`]*`)", text)  # odd parts are code spans
    return "".join(part if i % 2 else word.sub(lambda m: TASK_NAMES[m.group(1)], part)
                   for i, part in enumerate(parts))


#: Readable titles of raw field names that charts plot without a title of their own.
FIELD_TITLES = {"ci_low": "95% interval, low", "ci_high": "95% interval, high", "relative_drop": "relative drop",
                "num_examples": "examples", "matrix_type": "matrix type", "matrices_from": "matrices from"}


def readable(name: str) -> str:
    """A raw identifier as words for a title: ``ci_low`` -> ``95% interval, low``, ``best_data_free_score`` ->
    ``best data-free score``; anything else is returned unchanged."""
    import re

    text = str(name)
    if text in FIELD_TITLES:
        return FIELD_TITLES[text]
    if re.fullmatch(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+", text):
        return text.replace("data_free", "data-free").replace("_", " ")
    return text


def _label(value: Any) -> Any:
    """A header or index entry as the reader sees it: task ids as the book names them (``sst2`` -> ``SST-2``), raw
    identifiers as words, numbers formatted."""
    if isinstance(value, str):
        return TASK_NAMES.get(value) or readable(value)
    if isinstance(value, float) or type(value).__module__ == "numpy":
        return format_number(value)
    return value


def _is_default_index(index: pd.Index) -> bool:
    """An unnamed integer index (0, 1, 2 … or what is left of it after filtering): row numbers, not data."""
    return (not isinstance(index, pd.MultiIndex) and index.name is None
            and pd.api.types.is_integer_dtype(index.dtype))


def display_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` as the book shows it: readable header and index labels, numbers formatted, missing values as words
    (a copy of strings; the original is not changed)."""
    shown = frame.copy()
    shown.columns = (shown.columns.map(lambda c: tuple(_label(x) for x in c) if isinstance(c, tuple) else _label(c))
                     if not isinstance(shown.columns, pd.MultiIndex)
                     else pd.MultiIndex.from_tuples([tuple(_label(x) for x in c) for c in shown.columns],
                                                    names=[_label(n) for n in shown.columns.names]))
    if not isinstance(shown.columns, pd.MultiIndex):
        shown.columns.name = _label(frame.columns.name)
    if not _is_default_index(shown.index):
        if isinstance(shown.index, pd.MultiIndex):
            shown.index = pd.MultiIndex.from_tuples([tuple(_label(x) for x in i) for i in shown.index],
                                                    names=[_label(n) for n in shown.index.names])
        else:
            shown.index = pd.Index([_label(i) for i in shown.index], name=_label(shown.index.name))
    for column, raw in zip(shown.columns, frame.columns):
        values = shown[column].astype(object)
        shown[column] = values.map(name_tasks) if raw in ("task", "tasks") else values.map(format_number)
    return shown


def to_html(frame: pd.DataFrame) -> str:
    """The HTML of :func:`display_frame` (no default 0, 1, 2 … index)."""
    shown = display_frame(frame)
    return shown.to_html(index=not _is_default_index(frame.index), na_rep=MISSING, escape=True,
                         classes="dataframe papa-table")


def interval_below(cell: Any) -> Any:
    """A ``"0.47 ± 0.02"`` cell (:func:`papa_lib.book.figures.format_mean_ci`) as HTML with the interval on a small
    line under the mean, for a Styler's ``format``: a table of several tasks' such cells never fits the page column
    on one line, and left to wrap the cells break at either space. Any other cell is returned unchanged."""
    mean, sep, half = cell.partition(" ± ") if isinstance(cell, str) else (cell, "", "")
    # 0.85em of the cell's own size: the theme sizes <small> in rem, larger than its small table text
    return f'{mean}<br><span style="font-size:0.85em">±\u00a0{half}</span>' if sep else cell


def paper_table(name: str, row: str, names: Callable[[str], str] | Mapping[str, str], index: str,
                tasks: Sequence[str]) -> Any:
    """One of the paper's tables (:func:`papa_lib.analysis.paper.table`) as a chapter shows it beside ours: a Styler
    whose rows are its ``row`` column named as ours (``names``, a function or a mapping; the index is called
    ``index``), whose columns are those of ``tasks`` it has, named as the book names them, with two decimals and a
    caption naming its source, model and data."""
    reported = paper.table(name)
    shown = reported.assign(**{index: reported[row].map(names)}).set_index(index)
    shown = shown[[t for t in tasks if t in reported]].rename(columns=task_name)
    return shown.style.format(precision=2).set_caption(
        f"{reported.attrs['source']} — model: {reported.attrs['model']}, data: GLUE / CoNLL-2003 validation")


def _cell(value: Any) -> Any:
    """A Styler cell: numbers as :func:`format_number`, anything else unchanged."""
    if isinstance(value, bool) or not isinstance(value, int | float) and type(value).__module__ != "numpy":
        return value
    return format_number(value)


def _styler_html(styler: Any) -> str:
    """A Styler's HTML with readable headers and no row numbers (its own number formats are kept)."""
    for axis in ("index", "columns"):  # raw names of the index levels (e.g. matrix_type) as words
        labels = getattr(styler, axis)
        renamed = labels.set_names([_label(n) if isinstance(n, str) else n for n in labels.names])
        setattr(styler, axis, renamed)
        setattr(styler.data, axis, renamed)
    tasks = [c for c in styler.data.columns if c in ("task", "tasks")]
    if tasks:  # a task column's cells name the tasks as the book does
        styler.format(name_tasks, subset=tasks)
    styler.format_index(_label, axis=1)
    if not _is_default_index(styler.data.index):
        styler.format_index(_label, axis=0)
    else:
        styler.hide(axis="index")
    return styler.to_html()


def install() -> bool:
    """Register :func:`to_html` for DataFrames (and the header rules for Stylers) with the running IPython kernel;
    False outside IPython."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return False
    shell = get_ipython()
    if shell is None:
        return False
    from pandas.io.formats.style import Styler

    # Stylers created from now on format numbers and missing values the same way unless they say otherwise
    pd.set_option("styler.format.formatter", _cell)
    pd.set_option("styler.format.na_rep", MISSING)
    formatter = shell.display_formatter.formatters["text/html"]
    formatter.for_type(pd.DataFrame, to_html)
    formatter.for_type(Styler, _styler_html)
    return True
