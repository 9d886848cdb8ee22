"""The errors papa_lib raises on purpose, for a person to read (a leaf: it imports nothing from the package).

:class:`PapaError` marks an error whose message says what to fix: a bad input (:class:`PapaInputError`: a file, a
value, a grid file, a model papa does not support) or an environment that cannot provide something (an unreachable
hub, a packaged model whose pieces are missing). The ``papa`` command prints these, and only these (with a missing
file, invalid YAML and a bad command line), as one line ``papa: error: <what> (<file>:<line>)`` and exits with 2;
any other exception, a plain ``ValueError`` from deep inside included, is a bug and shows its traceback.
"""

from __future__ import annotations

__all__ = ["PapaError", "PapaInputError"]


class PapaError(Exception):
    """An error papa_lib raises on purpose: its message (one line, often ``<file>:<line>: <what>``) says what to fix."""


class PapaInputError(PapaError, ValueError):
    """Bad input: a data or grid file, a value, a setting, a model papa does not support (a ``ValueError``)."""
