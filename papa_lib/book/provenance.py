"""Where a page's numbers come from: the banner at the top of every chapter.

A chapter shows two kinds of numbers. Some are read from a **committed run** (``data/results/<folder>``): their
model, data, seeds and the machine they ran on are read from the records themselves (the ``model``,
``data_source``, ``seed``, ``device`` and ``finished_at`` columns of
:class:`papa_lib.experiments.results.ResultsStore`), never from the reader's setup. Others are **computed live** by
the chapter's cells on the machine that executes the page: their model and data come from the resolved profile
(:class:`papa_lib.book.profiles.Setup`): the packaged sample, a data folder, generated data or the hub.

:func:`committed_facts` says the first in a few words, :func:`live_facts` the second, and :func:`banner` puts both
into one small box (HTML that wraps inside the page's column; plain text in a terminal).
"""

from __future__ import annotations

import html
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

from .profiles import shown_folder
from .records import data_label, model_label

__all__ = ["Banner", "banner", "committed_facts", "live_facts", "seeds_label", "shown_path", "where_label"]

#: Words for the ``device`` column of the records.
DEVICE_WORDS = {"cuda": "a CUDA GPU", "cpu": "a CPU", "mps": "an Apple GPU"}


def seeds_label(seeds: Iterable) -> str:
    """``'3 seeds (0, 1, 2)'`` from the ``seed`` values of some records (missing ones skipped); ``''`` for none."""
    values = sorted({int(s) for s in seeds if s is not None and not pd.isna(s)})
    if not values:
        return ""
    word = "seed" if len(values) == 1 else "seeds"
    return f"{len(values)} {word} ({', '.join(str(v) for v in values)})"


def seeds_per_setting(frame: pd.DataFrame) -> str:
    """:func:`seeds_label` of the records when every setting (task and variant) has the same seeds, else
    ``'3 to 10 seeds (0-9)'``: the fewest and most seeds of a setting (e.g. λ at 3 beside originals at 10)."""
    from ..experiments.summaries import seeds_per_config

    if "seed" not in frame.columns:
        return ""
    counts = seeds_per_config(frame)
    if counts.empty or counts.min() == counts.max():
        return seeds_label(frame["seed"])
    values = sorted({int(v) for v in frame["seed"].dropna()})
    return f"{counts.min()} to {counts.max()} seeds ({values[0]}-{values[-1]})"


def where_label(frame: pd.DataFrame) -> str:
    """Where the records ran and when: ``'a CUDA GPU (51 runs) and a CPU (180 runs), 2026-11-21 to 2026-11-24'``.
    Records that read λ learned on another kind of device say so (``lambda_device``, decision rule R16):
    ``'a CPU (560 runs; 54 of them read λ learned on a CUDA GPU)'``."""
    parts = []
    if "device" in frame.columns:
        rows = frame.reset_index(drop=True)  # by row, whatever the frame's index
        made = rows["device"].dropna().astype(str)
        learned = (rows["lambda_device"].fillna("").astype(str).str.split(":").str[0]
                   if "lambda_device" in rows.columns else pd.Series("", index=rows.index))
        for device, n in made.value_counts().items():
            kind = device.split(":")[0]
            mine = learned[made.index[made == device]]
            elsewhere = mine[~mine.isin(["", "not recorded", kind])].value_counts()
            notes = "".join(f"; {'it' if n == 1 else f'{k} of them'} read λ learned on "
                            f"{DEVICE_WORDS.get(other, other)}" for other, k in elsewhere.items())
            parts.append(f"{DEVICE_WORDS.get(kind, device)} ({n} {'run' if n == 1 else 'runs'}{notes})")
    text = " and ".join(parts) if len(parts) <= 2 else ", ".join(parts)
    if "finished_at" in frame.columns:
        days = pd.to_datetime(frame["finished_at"].dropna(), errors="coerce", utc=True, format="mixed").dropna()
        if len(days):
            first, last = days.min().strftime("%Y-%m-%d"), days.max().strftime("%Y-%m-%d")
            when = first if first == last else f"{first} to {last}"
            text = f"{text}, {when}" if text else when
    return text


def _relative(path: str | os.PathLike, root: Path | None) -> str:
    """A folder as the reader should see it: relative to the repository root when inside it, else its name only
    (never a machine path such as ``/tmp/…`` or a home folder)."""
    path = Path(path)
    if root is not None:
        try:
            return path.resolve().relative_to(Path(root).resolve()).as_posix()
        except ValueError:
            pass
    return path.name


def shown_path(text, setup) -> str:
    """``text`` with the profile's data folder written as a reader should see it: relative to the repository when it
    lies beside it (``../shared/data``), ``papa_lib/samples`` for the packaged sample, else the folder's name
    (a temporary folder such as ``/tmp/papa-smoke-data`` becomes ``papa-smoke-data``)."""
    text = str(text)
    if setup.data_dir is None:
        return text
    folder = Path(setup.data_dir)
    shown = "papa_lib/samples" if setup.data_source == "sample" else shown_folder(folder, setup.root)
    return text.replace(str(folder.resolve()), shown).replace(str(folder), shown)


def committed_facts(frame: pd.DataFrame | None, folder: str | os.PathLike | None = None,
                    root: Path | None = None) -> str:
    """One sentence on a committed run: folder, record count, model, data, seeds, where and when it ran, all read
    from the records; ``''`` when there are none."""
    if frame is None or not len(frame):
        return ""
    pieces = []
    if "model" in frame.columns:
        pieces.append(f"model {model_label(frame['model'].dropna())}")
    if "data_source" in frame.columns:
        profile = None
        if "profile" in frame.columns and frame["profile"].dropna().nunique() == 1:
            profile = str(frame["profile"].dropna().iloc[0])
        data = data_label(frame["data_source"].dropna(), profile)
        if data:
            pieces.append(f"data {data}")
    if "seed" in frame.columns:
        seeds = seeds_per_setting(frame)
        if seeds:
            pieces.append(seeds)
    where = where_label(frame)
    if where:
        pieces.append(f"ran on {where} (BENCHMARKS.md has the timings)")
    place = f"`{_relative(folder, root)}`, " if folder is not None else ""
    return f"{place}{len(frame)} record{'s' if len(frame) != 1 else ''}: " + "; ".join(pieces)


def live_facts(setup, what: str | None = None) -> str:
    """One sentence on what this page computes on the machine executing it: the profile's model and data."""
    if setup.data_source == "local":
        data = f"the data folder `{shown_folder(setup.data_dir, setup.root)}`"
    else:
        data = setup.data_label
        if setup.data_source == "sample" and setup.sample_reason:
            data += f", since {setup.sample_reason}"
    text = f"model {setup.model_label}, data: {data}, profile `{setup.profile}`"
    return f"{text}: {what}" if what else text


class Banner:
    """The provenance box of one page: HTML in a notebook or a built page, plain text elsewhere."""

    def __init__(self, committed: str, live: str):
        self.committed, self.live = committed, live

    def lines(self) -> list[tuple[str, str]]:
        return [("From the committed run", self.committed or "nothing: this page reads no committed records"),
                ("Computed live on this machine", self.live or "nothing: every number is read from records")]

    def __str__(self) -> str:
        return "\n".join(f"{head}: {text.replace('`', '')}" for head, text in self.lines())

    __repr__ = __str__

    def _repr_markdown_(self) -> str:
        return "\n\n".join(f"**{head}:** {text}" for head, text in self.lines())

    def _repr_html_(self) -> str:
        def code(text: str) -> str:
            pieces = html.escape(text).split("`")
            return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(pieces))

        rows = "".join(f"<p><strong>{html.escape(head)}:</strong> {code(text)}</p>" for head, text in self.lines())
        return ('<div class="papa-provenance" style="border-left:4px solid #4c78a8;background:#f3f6fa;'
                'padding:0.4em 0.8em;margin:0.5em 0;overflow-wrap:anywhere;white-space:normal">'
                f"{rows}</div>")


def banner(setup, frame: pd.DataFrame | None = None, *, folder: str | os.PathLike | None = None,
           live: str | None = "", committed_note: str = "", records: bool = True,
           also: Mapping[str | os.PathLike, pd.DataFrame] | None = None) -> Banner:
    """The provenance box of a page.

    ``frame`` holds the committed records the page shows (read from ``folder``'s ``results.csv`` when ``frame`` is
    None and ``folder`` is given; ``folder`` defaults to the profile's results folder). ``live`` names the cells that
    compute on this machine (``None``: the page computes nothing live). ``committed_note`` is appended to the
    committed-run sentence (e.g. which of its parts the page shows). ``records=False``: the page reads no
    committed records. ``also``: folder -> records of other committed runs the page shows beside them (e.g. a second
    model's, :func:`papa_lib.book.records.other_local_models`); each gets its own sentence (model, data, seeds,
    device, all read from its records).
    """
    from ..experiments.results import read_results

    folder = Path(folder) if folder is not None else Path(setup.results_dir)
    if not folder.is_absolute():
        folder = setup.root / folder
    if not records:
        frame = None
    elif frame is None and (folder / "results.csv").is_file():
        frame = read_results(folder)
    committed = committed_facts(frame, folder, setup.root)
    if committed and committed_note:
        committed = f"{committed}; {committed_note}"
    more = [committed_facts(other, path, setup.root) for path, other in (also or {}).items() if records]
    committed = ". Beside it, ".join(c for c in [committed, *more] if c)
    return Banner(committed, live_facts(setup, live) if live is not None else "")
