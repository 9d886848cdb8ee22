"""What a chapter cell shows besides charts and tables: text rendered as Markdown in Jupyter."""

from __future__ import annotations

from typing import Any

__all__ = ["markdown"]


def markdown(text: str) -> Any:
    """``text`` as an ``IPython.display.Markdown`` object (a notebook renders it; ``.data`` holds the text) whose
    plain-text form is the text itself, so that no page ever shows ``<IPython.core.display.Markdown object>`` (what
    an empty Markdown falls back to) and an empty one shows nothing."""
    from IPython.display import Markdown

    class Prose(Markdown):
        def __repr__(self) -> str:
            return self.data or ""

    return Prose(text)
