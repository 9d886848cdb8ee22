"""What a chapter cell shows besides charts and tables: text rendered as Markdown in Jupyter."""

from __future__ import annotations

from typing import Any

from .tables import name_tasks

__all__ = ["markdown"]


def markdown(text: str) -> Any:
    """``text`` as an ``IPython.display.Markdown`` object (a notebook renders it; ``.data`` holds the text) whose
    plain-text form is the text itself, so that no page ever shows ``<IPython.core.display.Markdown object>`` (what
    an empty Markdown falls back to) and an empty one shows nothing: not even an empty output box, since it
    publishes no output at all (``_ipython_display_`` takes over and does nothing). Task ids read as the book names
    the tasks (:func:`papa_lib.book.tables.name_tasks`: ``sst2`` -> ``SST-2``, code spans kept)."""
    from IPython.display import Markdown

    class Prose(Markdown):
        def __repr__(self) -> str:
            return self.data or ""

    class NoProse(Prose):
        def _ipython_display_(self) -> None:
            """Nothing to show: IPython's ``display`` and the cell's result publish no output for it."""

    text = name_tasks(text)
    return Prose(text) if text else NoProse(text)
