"""Registry of head rankings: which heads are replaced first (paper Sec. 3.2, 5.4).

A ranking either fixes the order (``first_to_last``, ``last_to_first``, ``random``; Sec. 5.4) or scores every head
``[layers, heads]`` (low score = least input-dependent = replaced first): ``lambda`` uses the λ learned by mixing
B = λA + (1-λ)C (Sec. 3.2, Eq. 3); ``reversed`` replaces the largest λ first. ``lm_lambda`` (a decoder LM, beyond the
paper) uses the λ learned once on the decoder's own next-token loss (:mod:`papa_lib.experiments.lm`, read from the
results folder's ``lm/lambdas.safetensors``), the same for every task and seed. Label-free scores (beyond the paper)
are registered in :mod:`papa_lib.analysis.norm_rankings`, which ``import papa_lib`` imports.

Every ranking reads a variant's ``fraction`` the same way: the share of heads that **stay input-dependent**
(1: none replaced, 0: all replaced); the heads replaced are a prefix of the ranking's replacement order, so with
scores the ``fraction`` of heads with the *largest* scores keep their attention (:func:`replaced_first` says which
end goes first, in words).

A new ranking is one call (all built-ins, the label-free ones included, are registered when ``papa_lib`` is
imported)::

    register_head_ranking("my_score", my_scores, label="my score")   # my_scores(workspace, matrices_from, seed)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..core.registry import Registry


@dataclass(frozen=True)
class HeadRanking:
    """``scores(experiment, matrices_from, seed) -> Tensor [layers, heads]`` (None for fixed orders); ``order`` is
    the :func:`papa_lib.experiments.selection.heads_to_replace` order that uses the scores; ``learned`` rankings
    depend on λ training settings (they enter the run id), and without ``scores`` of their own are scored by the λ
    the experiment learns (:func:`papa_lib.experiments.engine.learn_lambdas`, which
    :func:`~papa_lib.experiments.engine.head_scores` calls: this registry sits below the engine, which imports it);
    ``label`` names it in tables and charts;
    ``replaced_first`` says which heads go first, i.e. which ``1 - fraction`` of them a variant replaces;
    ``depends_on(experiment) -> dict``: what scores read from elsewhere depend on (e.g. a fingerprint of a file),
    which enters the run id, so that other scores never reuse a stored record; ``same_for_every_seed``: the scores do
    not depend on the run's seed, so every seed's probe trains on one backbone pass; ``score_pass(model, batch)``:
    the work ``scores`` does on one padded batch of a seed's training rows (it scores every row of them), which
    ``papa grid --plan`` times to cost the scores (None: the scores cost nothing worth planning)."""

    name: str
    order: str
    scores: Callable | None = None
    learned: bool = False
    label: str = ""
    replaced_first: str = ""
    depends_on: Callable | None = None
    same_for_every_seed: bool = False
    score_pass: Callable | None = None

    @property
    def scored(self) -> bool:
        """Whether heads are ordered by per-head scores (registered ones, or the learned λ)."""
        return self.scores is not None or self.learned

    @property
    def uses_lambda(self) -> bool:
        """Whether the λ the experiment learns scores the heads (a learned ranking without scores of its own)."""
        return self.scores is None and self.learned


HEAD_RANKINGS: Registry = Registry("selection order")


def register_head_ranking(name: str, scores: Callable | None = None, *, order: str | None = None,
                          learned: bool = False, label: str | None = None,
                          replaced_first: str | None = None, depends_on: Callable | None = None,
                          same_for_every_seed: bool = False, score_pass: Callable | None = None) -> HeadRanking:
    """Register a ranking; with ``scores`` the heads are replaced in ascending score order (the smallest first)."""
    order = order or ("lambda" if scores is not None or learned else name)
    if replaced_first is None:
        replaced_first = (f"smallest {name} score first" if order == "lambda"
                          else "largest score first" if order == "reversed" else f"{name} order")
    entry = HeadRanking(name, order, scores, learned, label or name, replaced_first, depends_on, same_for_every_seed,
                        score_pass)
    HEAD_RANKINGS[name] = entry
    return entry


def head_ranking(name: str) -> HeadRanking:
    return HEAD_RANKINGS.lookup(name)


def ranking_label(name: str) -> str:
    """How tables name a ranking; an unregistered name (or ``none``) as it is."""
    return HEAD_RANKINGS[name].label if name in HEAD_RANKINGS else name


def _lm_lambdas(workspace, matrices_from=None, seed=0):
    """The λ learned on the decoder's LM loss (:func:`papa_lib.experiments.lm.read_lm_lambdas`), checked against the
    model's ``[layers, heads]``; one line (:class:`~papa_lib.errors.PapaInputError`) when there is none."""
    from ..errors import PapaInputError
    from .lm import lm_lambdas_path, read_lm_lambdas

    if workspace.results_dir is None:
        raise PapaInputError("the lm_lambda order reads the λ learned on the LM loss from a results folder "
                             "(lm/lambdas.safetensors): give the experiment one")
    lambdas = read_lm_lambdas(workspace.results_dir)
    if tuple(lambdas.shape) != (workspace.layers, workspace.heads):
        raise PapaInputError(f"{lm_lambdas_path(workspace.results_dir)}: λ of shape {list(lambdas.shape)}, but the "
                             f"model has {workspace.layers} layers x {workspace.heads} heads")
    return lambdas


def _lm_lambdas_fingerprint(workspace) -> dict:
    from .workspace import fingerprint

    return {"lm_lambdas": fingerprint(_lm_lambdas(workspace).float().contiguous())}


register_head_ranking("lambda", order="lambda", learned=True,                            # Sec. 3.2
                      label="λ (smallest first)", replaced_first="smallest learned λ first")
register_head_ranking("reversed", order="reversed", learned=True,                        # Sec. 5.4
                      label="reversed λ", replaced_first="largest learned λ first")
register_head_ranking("first_to_last", label="first layer → last",                       # Sec. 5.4
                      replaced_first="first layer first, heads in the model's order")
register_head_ranking("last_to_first", label="last layer → first",
                      replaced_first="last layer first, heads in the model's order")
register_head_ranking("random", label="random", replaced_first="a random permutation drawn from the seed")
register_head_ranking("lm_lambda", _lm_lambdas, order="lambda", label="LM λ (smallest first)",  # a decoder's LM loss
                      replaced_first="smallest λ learned on the LM loss first", depends_on=_lm_lambdas_fingerprint,
                      same_for_every_seed=True)
