"""A variant: what the frozen backbone runs in one PAPA run (matrix type, head order, fraction, matrices' source)."""

from __future__ import annotations

from dataclasses import dataclass

from .matrices import MATRIX_TYPES
from .rankings import HEAD_RANKINGS, head_ranking


@dataclass(frozen=True)
class Variant:
    """What the frozen backbone runs (see :mod:`papa_lib.experiments.engine`); always canonical (use :meth:`make`)."""

    matrix_type: str = "original"
    selection_order: str = "none"
    fraction: float = 1.0
    matrices_from: str | None = None

    @classmethod
    def make(cls, matrix_type="average", selection_order="lambda", fraction=1.0, matrices_from=None) -> Variant:
        entry = MATRIX_TYPES.lookup(matrix_type)
        if selection_order != "none":
            head_ranking(selection_order)
        fraction = float(fraction)
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"fraction of input-dependent heads must be in [0, 1], got {fraction}")
        if fraction == 1.0 or entry.name == "original":
            return cls("original", "none", 1.0, None)
        if fraction == 0.0:
            selection_order = "none"
        if entry.constants is None:
            matrices_from = None
        return cls(matrix_type, selection_order, fraction, matrices_from)

    @property
    def frozen(self) -> bool:
        return MATRIX_TYPES[self.matrix_type].frozen

    @property
    def needs_lambdas(self) -> bool:
        return self.selection_order != "none" and HEAD_RANKINGS[self.selection_order].learned

    @property
    def needs_scores(self) -> bool:
        return self.selection_order != "none" and HEAD_RANKINGS[self.selection_order].scored

    @property
    def seed_dependent(self) -> bool:
        """Whether the backbone differs between seeds (λ is learned per seed; random orders are drawn per seed; a
        ranking whose scores are the same for every seed, such as ``lm_lambda``, is not)."""
        if self.needs_scores and HEAD_RANKINGS[self.selection_order].same_for_every_seed:
            return False
        return self.needs_scores or self.selection_order == "random"

    def backbone_per_seed(self, lambda_seed: int | None = None) -> bool:
        """:attr:`seed_dependent` under a config: with a shared ``lambda_seed`` (one λ for every seed) a λ order's
        backbone is the same for every seed, so all seeds train from one pass, as a seed-independent variant's do."""
        if self.needs_lambdas and lambda_seed is not None:
            return False
        return self.seed_dependent
