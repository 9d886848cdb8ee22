"""Registry of the matrices a replaced head can use (paper Sec. 3.1, 5.2): one registered entry per matrix type.

A **matrix type** names what a replaced head runs (:data:`MATRIX_TYPES`) and carries everything that the engine, the
grid, the figures and the claims read about it: the override mode of :mod:`papa_lib.core.override`, the kind of
constant matrices it needs (if any), whether it trains inside the backbone, how trainable matrices start, its
readable ``label``, its ``construction`` (what data it needs: Table 1's first column; ``data_free`` is one of them)
and its ``table_order`` (its row in Table 1 / Table 4). A **constant builder** turns a task's unlabeled training text
into :class:`~papa_lib.core.averaging.ConstantAttention` (Eq. 2's average, or another estimator).

Adding a matrix type is one call; the engine, the grid, the figures and the claims look it up by name::

    def median_attention(model, batches, progress=False, source=None, total=None): ...

    register_matrix_type("median", "constant", builder=median_attention, label="Median", construction="unlabeled")

Every built-in (the norm-weighted one of Kobayashi et al. 2020 from :mod:`papa_lib.analysis.norm_rankings`
included) is registered when ``papa_lib`` is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..core.averaging import average_attention
from ..core.registry import Registry

#: What a matrix type needs (Table 1's first column), in the paper's order.
CONSTRUCTIONS = ("attention", "data-free", "labeled", "unlabeled")


@dataclass(frozen=True)
class MatrixType:
    """What a replaced head runs: override ``mode``, the ``constants`` kind it needs (None: none), whether it is
    ``frozen`` (features can be cached) and, for trainable matrices, their ``trainable_init``; how tables name it
    (``label``), what data it needs (``construction``, one of :data:`CONSTRUCTIONS`) and its Table 1 row
    (``table_order``; None: after the paper's rows)."""

    name: str
    mode: str
    constants: str | None = None
    frozen: bool = True
    trainable_init: str = "average"
    label: str = ""
    construction: str = "unlabeled"
    table_order: float | None = None

    @property
    def data_free(self) -> bool:
        """Needs no data at all (Sec. 5.2 (1)-(3)): the baselines an average must beat."""
        return self.construction == "data-free"

    @property
    def from_text(self) -> bool:
        """Built from a task's text: its records name the text (``matrices_from``) and it can transfer (Sec. 5.3)."""
        return self.constants is not None


MATRIX_TYPES: Registry = Registry("matrix type")
CONSTANT_BUILDERS: Registry = Registry("constant-matrix kind")


def _construction(mode: str, constants: str | None, frozen: bool) -> str:
    if mode == "original":
        return "attention"
    if not frozen:
        return "labeled"
    return "unlabeled" if constants is not None else "data-free"


def register_matrix_type(name: str, mode: str, *, constants: str | None = None, frozen: bool = True,
                         trainable_init: str = "average", label: str | None = None, construction: str | None = None,
                         table_order: float | None = None, builder: Callable | None = None,
                         packed: bool = False) -> MatrixType:
    """Register a matrix type: the override ``mode`` it runs, the ``constants`` kind it needs and how tables show it.

    ``builder`` (``fn(model, batches, progress=, source=, total=) -> ConstantAttention``) also registers the
    constant builder, under ``constants`` or, when that is not given, under ``name``. ``construction`` defaults from
    the rest: original attention, data-free (no constants), labeled (trained), unlabeled (constants from text).
    """
    if builder is not None:
        constants = constants or name
        register_constant_builder(constants, packed=packed)(builder)
    construction = construction or _construction(mode, constants, frozen)
    if construction not in CONSTRUCTIONS:
        raise ValueError(f"matrix type {name!r}: construction must be one of {CONSTRUCTIONS}, got {construction!r}")
    entry = MatrixType(name, mode, constants, frozen, trainable_init, label or name, construction, table_order)
    MATRIX_TYPES[name] = entry
    return entry


def register_constant_builder(kind: str, *, packed: bool = False):
    """Decorator: register ``fn(model, batches, progress=, source=, total=) -> ConstantAttention`` under ``kind``;
    ``packed=True`` if it accepts packed batches (:func:`papa_lib.core.packing.pack`), else it gets padded ones."""

    def decorate(fn):
        CONSTANT_BUILDERS[kind] = (fn, packed)
        return fn

    return decorate


def matrix_type(name: str) -> MatrixType:
    return MATRIX_TYPES.lookup(name)


def constant_builder(kind: str) -> tuple[Callable, bool]:
    """``(builder, accepts_packed_batches)`` registered under ``kind``."""
    return CONSTANT_BUILDERS.lookup(kind)


def matrix_label(name: str) -> str:
    """How tables name a matrix type (the paper's row label); an unregistered name as it is."""
    return MATRIX_TYPES[name].label if name in MATRIX_TYPES else name


def table_order() -> tuple[str, ...]:
    """Every registered matrix type in table row order: the paper's Table 1 rows, then the others as registered."""
    entries = list(MATRIX_TYPES.values())
    ranked = sorted((e for e in entries if e.table_order is not None), key=lambda e: e.table_order)
    return tuple(e.name for e in ranked) + tuple(e.name for e in entries if e.table_order is None)


def data_free_types() -> tuple[str, ...]:
    """Registered matrix types that need no data (identity, Toeplitz, zeros, and any registered as data-free)."""
    return tuple(name for name, entry in MATRIX_TYPES.items() if entry.data_free)


register_constant_builder("average", packed=True)(average_attention)  # Eq. 2

register_matrix_type("original", "original", label="Original (input-dependent)", table_order=0)
register_matrix_type("average", "constant", constants="average", label="Average (PAPA)", table_order=6)  # Sec. 3.1
register_matrix_type("identity", "identity", label="Identity", table_order=1)                # Sec. 5.2 (1)
register_matrix_type("toeplitz", "toeplitz", label="Toeplitz", table_order=2)                # Sec. 5.2 (2)
register_matrix_type("zeros", "zeros", label="Zeros", table_order=3)                         # Sec. 5.2 (3)
register_matrix_type("trainable_toeplitz", "trainable", frozen=False, trainable_init="toeplitz",  # Sec. 5.2 (4)
                     label="Trainable, Toeplitz init.", table_order=4)
register_matrix_type("trainable_average", "trainable", constants="average", frozen=False,        # Sec. 5.2 (5)
                     label="Trainable, average init.", table_order=5)
