"""Stages 3 and 4 of one (model, task) experiment, as functions of a :class:`~.workspace.Workspace`.

3. **order**: per-head scores of a registered ranking (λ from :func:`papa_lib.experiments.stages.learn_lambdas`, or
   a label-free score) and the :class:`~papa_lib.core.override.AttentionOverride` a variant runs
   (:func:`head_scores`, :func:`override_for`);
4. **features**: real-token features of a split under an override, cached in the feature store or streamed
   (:func:`use_cache`, :func:`cached_rows`, :func:`runner`).
"""

from __future__ import annotations

import hashlib
from contextlib import nullcontext

import torch

from ..core.models import model_id
from ..core.override import AttentionOverride
from . import results, selection
from .features import BackboneRunner, RaggedRows, default_budget, feature_bytes, select_rows
from .matrices import matrix_type
from .rankings import head_ranking
from .stages import constants, split, store_rows
from .variants import Variant
from .workspace import Workspace


# ---------------------------------------------------------------------- stage 3: head order (Sec. 3.2, 5.4)
def head_scores(ws: Workspace, order: str, matrices_from: str | None = None, seed: int = 0) -> torch.Tensor:
    """Per-head scores ``[layers, heads]`` behind a scored ranking (λ, or a registered label-free score); scores
    handed in (``ws.given_scores``) are used as they are."""
    if (order, matrices_from, seed) in ws.given_scores:
        return ws.given_scores[(order, matrices_from, seed)]
    ranking = head_ranking(order)
    if ranking.scores is None:
        raise ValueError(f"order {order!r} has no per-head scores")
    return ranking.scores(ws, matrices_from, seed)


def cached_scores(ws: Workspace, name: str, compute) -> torch.Tensor:
    """Label-free scores are computed once per experiment (``compute()`` on first use)."""
    if (name,) not in ws.scores:
        ws.scores[(name,)] = compute()
    return ws.scores[(name,)]


def override_for(ws: Workspace, variant: Variant, seed: int = 0) -> AttentionOverride | None:
    """The :class:`AttentionOverride` a variant runs for ``seed`` (``None`` for the original model)."""
    if variant.matrix_type == "original":
        return None
    entry = matrix_type(variant.matrix_type)
    ranking = head_ranking(variant.selection_order) if variant.selection_order != "none" else None
    per_head = head_scores(ws, variant.selection_order, variant.matrices_from, seed) if variant.needs_scores else None
    order = ranking.order if ranking is not None else "first_to_last"
    replaced = selection.heads_to_replace(order, variant.fraction, ws.model, lambdas=per_head, seed=seed)
    matrices = constants(ws, variant.matrices_from, entry.constants) if entry.constants else None
    return AttentionOverride(ws.model, matrices, replaced, entry.mode, trainable_init=entry.trainable_init,
                             max_length=ws.config.max_length)


# ---------------------------------------------------------------------- stage 4: features
def features_key(ws: Workspace, state: AttentionOverride | None, split_name: str, rows: torch.Tensor) -> str:
    """The feature store's key of ``rows`` of a split under ``state`` (inputs, override plan, matrices)."""
    encoded = split(ws, split_name).encoded
    digest = hashlib.sha256()
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        if name in encoded:
            digest.update(encoded[name].numpy().tobytes())
    if encoded.word_index is not None:
        digest.update(encoded.word_index.numpy().tobytes())
    digest.update(rows.numpy().tobytes())
    if state is not None:
        digest.update(repr(sorted(state.plan.items())).encode())
        for layer_matrices in state._bases.values():
            if layer_matrices is not None:
                digest.update(layer_matrices.detach().cpu().numpy().tobytes())
        for learned in state.trainable.values():  # trainable matrices after their training phase
            digest.update(learned.detach().cpu().numpy().tobytes())
    return results.config_hash({"model": model_id(ws.model), "kind": ws.spec.kind, "inputs": digest.hexdigest(),
                                "L": ws.config.max_length})


def variant_feature_bytes(ws: Workspace, seeds=()) -> int:
    """Bytes the store would keep for one variant: the seeds' training rows plus the validation set."""
    hidden = ws.model.config.hidden_size
    train, validation = split(ws, "train"), split(ws, "validation")
    rows = store_rows(ws, seeds)
    part = select_rows(train.encoded, rows)
    return (feature_bytes(part, train.labels[rows], ws.spec.kind, ws.layers + 1, hidden)
            + feature_bytes(validation.encoded, validation.labels, ws.spec.kind, ws.layers + 1, hidden))


def use_cache(ws: Workspace, seeds=()) -> bool:
    """Whether a variant's features fit the cache budget (cached) or are streamed from the backbone."""
    budget = ws.config.cache_budget if ws.config.cache_budget is not None else default_budget(ws.results_dir)
    return variant_feature_bytes(ws, seeds) <= budget


def runner(ws: Workspace, split_name: str) -> BackboneRunner:
    """The backbone pass that streams a split's real-token features."""
    encoded = split(ws, split_name)
    return BackboneRunner(ws.model, encoded.encoded, encoded.labels, ws.spec.kind, ws.config.feature_batch_size,
                          ws.config.packed)


def cached_rows(ws: Workspace, state, split_name: str, rows: torch.Tensor) -> RaggedRows:
    """Features of ``rows`` of a split under ``state``, from the store (computed and saved on first use)."""
    key = features_key(ws, state, split_name, rows)
    if ws.features_store is not None and ws.features_store.has(key, split_name):
        return ws.features_store.load(key, split_name)
    with state.applied(ws.model) if state is not None else nullcontext():
        source = runner(ws, split_name)
        if ws.features_store is None:
            return source.rows(rows, ws.progress, f"{split_name} features")
        # written straight into the store's file: the features are never held twice in memory
        return ws.features_store.build(key, split_name, lambda allocate: source.rows(
            rows, ws.progress, f"{split_name} features", allocate=allocate))
