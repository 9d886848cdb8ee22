"""Registries: named tables of what the library can run (architectures, tasks, matrix types, builders, rankings).

Each registry is a :class:`Registry` (a ``dict`` from name to entry) that knows what it holds, so an unknown name
is one clear error listing the choices. The library's own entries (its *built-ins*) are registered when
``papa_lib`` is imported -- every layer's, whatever module is imported first -- and :func:`seal_builtins` then marks
the end of them. Whatever is registered afterwards (a task of your own, a matrix type from a script) is an
*extension*: :func:`extensions` lists them per registry and :func:`install` adds them to another process. A Ray
worker imports ``papa_lib`` (so it has every built-in) and installs the driver's extensions, nothing else.
"""

from __future__ import annotations

from typing import Any

from ..errors import PapaInputError

__all__ = ["Registry", "extensions", "install", "seal_builtins"]

#: Every registry, by what it holds ("task", "matrix type", ...).
REGISTRIES: dict[str, Registry] = {}
_sealed = False


class Registry(dict):
    """``name -> entry`` for one kind of thing (``what``); entries set after :func:`seal_builtins` are extensions."""

    def __init__(self, what: str, entries: dict | None = None):
        super().__init__()
        self.what = what
        self.added: set[str] = set()
        REGISTRIES[what] = self
        self.update(entries or {})

    def __setitem__(self, name: str, entry: Any) -> None:
        super().__setitem__(name, entry)
        if _sealed:
            self.added.add(name)

    def update(self, entries=(), **more) -> None:
        for name, entry in dict(entries, **more).items():
            self[name] = entry

    def lookup(self, name: str) -> Any:
        """The entry registered as ``name``; ``ValueError`` naming the choices otherwise."""
        if name not in self:
            raise PapaInputError(f"unknown {self.what} {name!r}; choose one of {tuple(self)}")
        return self[name]

    def __reduce__(self):  # pickles as a plain dict: a copy must not register itself as the registry
        return dict, (dict(self),)


def seal_builtins() -> None:
    """Called once ``papa_lib`` has registered its own entries: later registrations are extensions."""
    global _sealed
    _sealed = True


def extensions() -> dict[str, dict]:
    """What this process registered beyond the built-ins, per registry (functions defined in a script travel by
    value when pickled with cloudpickle, as Ray does)."""
    found = {what: {name: registry[name] for name in sorted(registry.added) if name in registry}
             for what, registry in REGISTRIES.items()}
    return {what: entries for what, entries in found.items() if entries}


def install(snapshot: dict[str, dict]) -> None:
    """Register ``snapshot`` (:func:`extensions` of another process) here."""
    for what, entries in snapshot.items():
        REGISTRIES[what].update(entries)
