"""Numbers in a chapter's text come from the records through myst-nb's ``glue``.

A chapter computes a dict of short, already formatted strings (``*_values`` functions of the page helpers, e.g.
:func:`papa_lib.book.intro_pages.findings`), glues each under its name with :func:`glue`, and its markdown says
``{glue:text}`name``` where the number belongs: the argument lives in the markdown, and the numbers cannot drift
from the records. :func:`glue_all` does the loop.

:func:`values` declares the names a ``*_values`` function returns (checked on every call, and read by the test that
every ``{glue:text}`` name of a chapter is glued by it); :func:`number` formats one number, "not measured" where
there is none.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

from .display import markdown  # re-exported: the one Markdown helper of the pages
from .tables import name_tasks

__all__ = ["NOT_MEASURED", "glue", "glue_all", "markdown", "not_measured", "number", "values"]

NOT_MEASURED = "not measured"



def glue(name: str, value: Any) -> None:
    """``myst_nb.glue(name, value, display=False)``; a no-op where myst-nb is not installed."""
    try:
        from myst_nb import glue as myst_glue
    except ImportError:  # pragma: no cover - the book extra brings myst-nb
        return
    myst_glue(name, value, display=False)


def glue_all(values: Mapping[str, Any]) -> None:
    """Glue every item of ``values`` under its key (returns nothing, so a cell ending with it shows nothing); task ids
    in text read as the book names the tasks (:func:`papa_lib.book.tables.name_tasks`)."""
    for name, value in values.items():
        glue(name, name_tasks(value))


def number(value: Any, spec: str = ".3g") -> str:
    """``format(value, spec)``, or :data:`NOT_MEASURED` for None or NaN."""
    try:
        if value is None or math.isnan(float(value)):
            return NOT_MEASURED
    except (TypeError, ValueError):
        return str(value)
    return format(value, spec)


def not_measured(names: tuple[str, ...] | Callable) -> dict[str, str]:
    """Every name (or every name a :func:`values` function declares) mapped to :data:`NOT_MEASURED`."""
    names = getattr(names, "glue_names", names)
    return {name: NOT_MEASURED for name in names}


def values(*names: str) -> Callable:
    """Declare the glue names a ``*_values`` function returns: the decorated function carries them as
    ``glue_names`` and raises ``ValueError`` when a call returns other keys."""
    def wrap(function: Callable) -> Callable:
        @functools.wraps(function)
        def checked(*args: Any, **kwargs: Any) -> dict[str, str]:
            out = function(*args, **kwargs)
            if set(out) != set(names):
                raise ValueError(f"{function.__qualname__} returned {sorted(set(out) ^ set(names))} beside or "
                                 "instead of its declared glue names")
            return {name: str(out[name]) for name in names}

        checked.glue_names = tuple(names)  # type: ignore[attr-defined]
        return checked

    return wrap
