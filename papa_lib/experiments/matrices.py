"""Registry of the matrices a replaced head can use (paper Sec. 3.1, 5.2): one registered entry per matrix type.

A **matrix type** names what a replaced head runs (:data:`MATRIX_TYPES`): the override mode of
:mod:`papa_lib.core.override`, the kind of constant matrices it needs (if any), whether it trains inside the backbone
and how trainable matrices start. A **constant builder** turns a task's unlabeled training text into
:class:`~papa_lib.core.averaging.ConstantAttention` (Eq. 2's average, or another estimator).

Adding a matrix type or builder is one call (or decorator) here; the engine looks both up by name::

    @register_constant_builder("median")
    def median_attention(model, batches, progress=False, source=None, total=None): ...

    register_matrix_type("median", mode="constant", constants="median")

The norm-weighted builder (Kobayashi et al. 2020) registers itself from :mod:`papa_lib.analysis.norm_rankings`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..core.averaging import average_attention


@dataclass(frozen=True)
class MatrixType:
    """What a replaced head runs: override ``mode``, the ``constants`` kind it needs (None: none), whether it is
    ``frozen`` (features can be cached) and, for trainable matrices, their ``trainable_init``."""

    name: str
    mode: str
    constants: str | None = None
    frozen: bool = True
    trainable_init: str = "average"


MATRIX_TYPES: dict[str, MatrixType] = {}
CONSTANT_BUILDERS: dict[str, tuple[Callable, bool]] = {}


def register_matrix_type(name: str, mode: str, *, constants: str | None = None, frozen: bool = True,
                         trainable_init: str = "average") -> MatrixType:
    """Register a matrix type (the override mode it runs and the constants it needs)."""
    entry = MatrixType(name, mode, constants, frozen, trainable_init)
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
    if name not in MATRIX_TYPES:
        raise ValueError(f"unknown matrix type {name!r}; choose one of {tuple(MATRIX_TYPES)}")
    return MATRIX_TYPES[name]


def constant_builder(kind: str) -> tuple[Callable, bool]:
    """``(builder, accepts_packed_batches)`` registered under ``kind``."""
    if kind not in CONSTANT_BUILDERS:
        raise ValueError(f"unknown constant-matrix kind {kind!r}; choose one of {tuple(CONSTANT_BUILDERS)}")
    return CONSTANT_BUILDERS[kind]


register_constant_builder("average", packed=True)(average_attention)  # Eq. 2

register_matrix_type("original", "original")
register_matrix_type("average", "constant", constants="average")            # Sec. 3.1
register_matrix_type("identity", "identity")                                # Sec. 5.2 (1)
register_matrix_type("toeplitz", "toeplitz")                                # Sec. 5.2 (2)
register_matrix_type("zeros", "zeros")                                      # Sec. 5.2 (3)
register_matrix_type("trainable_toeplitz", "trainable", frozen=False, trainable_init="toeplitz")   # Sec. 5.2 (4)
register_matrix_type("trainable_average", "trainable", constants="average", frozen=False)           # Sec. 5.2 (5)
