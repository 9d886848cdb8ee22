"""Numbers in a chapter's text come from the records through myst-nb's ``glue``.

A chapter computes a dict of short, already formatted strings (``*_values`` functions of the page helpers, e.g.
:func:`papa_lib.book.intro_pages.findings`), glues each under its name with :func:`glue`, and its markdown says
``{glue:text}`name``` where the number belongs: the argument lives in the markdown, and the numbers cannot drift
from the records. :func:`glue_all` does the loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .display import markdown  # re-exported: the one Markdown helper of the pages

__all__ = ["glue", "glue_all", "markdown"]


def glue(name: str, value: Any) -> None:
    """``myst_nb.glue(name, value, display=False)``; a no-op where myst-nb is not installed."""
    try:
        from myst_nb import glue as myst_glue
    except ImportError:  # pragma: no cover - the book extra brings myst-nb
        return
    myst_glue(name, value, display=False)


def glue_all(values: Mapping[str, Any]) -> None:
    """Glue every item of ``values`` under its key (returns nothing, so a cell ending with it shows nothing)."""
    for name, value in values.items():
        glue(name, value)
