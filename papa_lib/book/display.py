"""What a chapter cell shows besides charts and tables: text rendered as Markdown in Jupyter."""

from __future__ import annotations

from typing import Any

__all__ = ["markdown"]


def markdown(text: str) -> Any:
    """``text`` as an ``IPython.display.Markdown`` object (a notebook renders it; ``.data`` holds the text)."""
    from IPython.display import Markdown

    return Markdown(text)
