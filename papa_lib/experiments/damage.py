"""Damaged CSV tables (the results store, :mod:`papa_lib.experiments.results`): find the rows that cannot be records
and set them aside into side files, so that a damaged table never blocks a run.

:func:`scan_table` reads a table line by line and returns its header, its intact rows and the damaged lines
(:class:`Damage`: line number, text, reason, whether it is the last line). A row is damaged when it cannot be parsed,
has another number of cells than the header, lacks its line end (only the last line can: a torn write), fails the
caller's ``row_problem`` check or repeats a ``run_id``. :func:`side_file` writes damaged lines, as they were, into
``<table>.<kind>-<UTC time>`` beside the table (``torn`` or ``damaged``), each after a ``# line N: reason`` comment.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ..errors import PapaInputError

__all__ = ["Damage", "DamagedStoreError", "row_problem", "scan_table", "side_file"]


class DamagedStoreError(PapaInputError):
    """A results table damaged before its last line: the message names the first damaged line (``file:line:``)."""

    def __init__(self, message: str, path: Path | None = None, lines: Sequence[int] = ()):
        super().__init__(message)
        self.path, self.lines = path, list(lines)


@dataclass
class Damage:
    """One damaged line of a table."""

    line: int  # 1-based line number in the file
    text: str  # the line as it was
    reason: str
    final: bool  # the last non-blank line of the file


def row_problem(row: Mapping[str, str], non_null: Sequence[str], floats: Sequence[str],
                integers: Sequence[str]) -> str | None:
    """Why a row with the right number of cells cannot be a record (None when it can)."""
    for field in non_null:
        if row.get(field, "") == "":
            return f"empty {field!r}"
    for fields, kind, what in ((floats, float, "a number"), (integers, int, "an integer")):
        for field in fields:
            if row.get(field, ""):
                try:
                    kind(row[field])
                except ValueError:
                    return f"{field!r} is not {what}: {row[field]!r}"
    return None


def scan_table(path: Path, required: Sequence[str],
               problem: Callable[[dict[str, str]], str | None]) -> tuple[list[str], list[dict[str, str]], list[Damage]]:
    """``(header, intact rows, damaged lines)`` of the CSV table at ``path`` (one record per line).

    A header that lacks a ``required`` column raises :class:`DamagedStoreError` (nothing there to keep)."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    lines = text.splitlines(keepends=True)
    if not lines:
        return [], [], []
    header = next(csv.reader([lines[0]]), [])
    lacking = [f for f in required if f not in header]
    if lacking:
        raise DamagedStoreError(f"{path}:1: results table header lacks column(s): {', '.join(lacking)}",
                                path=path, lines=[1])
    rows: list[dict[str, str]] = []
    damaged: list[Damage] = []
    seen: set[str] = set()
    last = max((i for i, line in enumerate(lines) if line.strip()), default=0)
    for index in range(1, len(lines)):
        line = lines[index]
        if not line.strip():
            continue
        final = index == last
        try:
            cells = next(csv.reader([line], strict=True))
            reason = None
        except csv.Error as error:
            cells, reason = [], f"unreadable row ({error})"
        if reason is None and len(cells) != len(header):
            reason = f"row has {len(cells)} cells, header has {len(header)} columns"
        if reason is None and final and not line.endswith("\n"):
            reason = "the last row has no line end (cut off while it was written)"
        row = dict(zip(header, cells))
        if reason is None:
            reason = problem(row)
        if reason is None and row.get("run_id") in seen:
            reason = f"duplicate run_id {row['run_id']!r}"
        if reason is not None:
            damaged.append(Damage(index + 1, line, reason, final))
            continue
        seen.add(row.get("run_id"))
        rows.append(row)
    return header, rows, damaged


def side_file(path: Path, kind: str, damaged: Sequence[Damage]) -> Path:
    """Write damaged lines (as they were) into ``<path>.<kind>-<UTC time>`` beside the table; its path."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    side = path.with_name(f"{path.name}.{kind}-{stamp}")
    with open(side, "w", encoding="utf-8", newline="") as handle:
        for item in damaged:
            handle.write(f"# line {item.line}: {item.reason}\n")
            handle.write(item.text if item.text.endswith("\n") else item.text + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    return side
