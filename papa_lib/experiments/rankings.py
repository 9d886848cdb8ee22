"""Registry of head rankings: which heads are replaced first (paper Sec. 3.2, 5.4).

A ranking either fixes the order (``first_to_last``, ``last_to_first``, ``random``; Sec. 5.4) or scores every head
``[layers, heads]`` (low score = least input-dependent = replaced first): ``lambda`` uses the λ learned by mixing
B = λA + (1-λ)C (Sec. 3.2, Eq. 3); ``reversed`` replaces the largest λ first. Label-free scores (beyond the paper)
register themselves from :mod:`papa_lib.analysis.norm_rankings`.

A new ranking is one call::

    register_head_ranking("my_score", my_scores)   # my_scores(experiment, matrices_from, seed) -> [layers, heads]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class HeadRanking:
    """``scores(experiment, matrices_from, seed) -> Tensor [layers, heads]`` (None for fixed orders); ``order`` is
    the :func:`papa_lib.experiments.selection.heads_to_replace` order that uses the scores; ``learned`` rankings
    depend on λ training settings (they enter the run id)."""

    name: str
    order: str
    scores: Callable | None = None
    learned: bool = False


HEAD_RANKINGS: dict[str, HeadRanking] = {}


def register_head_ranking(name: str, scores: Callable | None = None, *, order: str | None = None,
                          learned: bool = False) -> HeadRanking:
    """Register a ranking; with ``scores`` the heads are replaced in ascending score order."""
    entry = HeadRanking(name, order or ("lambda" if scores is not None else name), scores, learned)
    HEAD_RANKINGS[name] = entry
    return entry


def head_ranking(name: str) -> HeadRanking:
    if name not in HEAD_RANKINGS:
        raise ValueError(f"unknown selection order {name!r}; choose one of {tuple(HEAD_RANKINGS)}")
    return HEAD_RANKINGS[name]


def _learned_lambdas(experiment, matrices_from, seed):
    return experiment.learn_lambdas(matrices_from, seed)


register_head_ranking("lambda", _learned_lambdas, order="lambda", learned=True)       # Sec. 3.2
register_head_ranking("reversed", _learned_lambdas, order="reversed", learned=True)   # Sec. 5.4
register_head_ranking("first_to_last")                                               # Sec. 5.4
register_head_ranking("last_to_first")
register_head_ranking("random")
