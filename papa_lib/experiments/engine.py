"""The experiment engine: one (model, task) pipeline from task data to records (paper Sec. 3.2-3.3, 4, 5.2-5.4).

The data flows one way, one stage per job, each stage a function of a
:class:`~papa_lib.experiments.workspace.Workspace` (the experiment's settings, backbone, paths and caches)::

    task data (stages.split, seed_plan) -> constant matrices (stages.constants; experiments.matrices registry)
      -> head order (stages.learn_lambdas, overrides.head_scores, override_for; experiments.rankings registry)
      -> features (overrides.use_cache, cached_rows, runner: store or stream)
      -> probes (runs.train_frozen, train_inside) -> record (runs.record, compute_records, run_variant)

:class:`TaskExperiment` is that workspace with the stages as methods (what the grid, the executors and the chapters
call); :class:`Variant` is :mod:`~papa_lib.experiments.variants`, :class:`ExperimentConfig`
:mod:`~papa_lib.experiments.workspace`.

Vocabulary
----------
* A **variant** is what the frozen backbone runs: ``matrix_type`` (a registered
  :data:`~papa_lib.experiments.matrices.MATRIX_TYPES` entry), ``selection_order`` (a registered
  :data:`~papa_lib.experiments.rankings.HEAD_RANKINGS` entry), ``fraction`` (share of heads that stay
  input-dependent) and ``matrices_from`` (the task whose training text the constant matrices come from; Sec. 5.3).
  ``fraction == 1`` is stored once as ``original``; with ``fraction == 0`` the order is ``none``.
* A **run** is one variant probed with one seed; it writes one record to the results store.

Seeds and data
--------------
Each seed draws its own training subset when ``limit`` is below the training set's size (otherwise every seed uses
the whole set), holds out :data:`~papa_lib.experiments.training.HELDOUT_FRACTION` of it for early stopping, learns
its own λ (Sec. 3.2: θ trained jointly with a probe for ``lambda_epochs``), and initialises and orders its probe with
its own seed. The constant matrices (Eq. 2) average the task's whole unlabeled training text.

Probes train until their held-out score stops improving (``patience`` epochs, at most ``epochs``), on features of
real tokens only: cached in a :class:`~papa_lib.experiments.features.FeatureStore` while they fit ``cache_budget``,
streamed from the backbone otherwise (all seeds of a variant in the same pass; same numbers either way). Variants
that train inside the backbone (trainable matrices, Sec. 5.2) get the same epoch budget and early stopping.

Choices the paper leaves open (documented here, reported in the book)
----------------------------------------------------------------------
* The backbone is frozen and in eval mode (no dropout inside it; the paper's code kept dropout on).
* Token tasks (NER, POS): the label sits on a word's first sub-token; words cut off by truncation are predicted as
  ``O`` (NER) or counted wrong (POS), so truncation can only lower our scores. A batch is ``batch_size`` sentences.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..core.decoders import load_model
from ..core.override import AttentionOverride
from . import overrides, runs, selection, stages  # noqa: F401  (selection: engine.selection.ORDERS for callers)
from .features import BackboneRunner, RaggedRows
from .matrices import MATRIX_TYPES
from .rankings import HEAD_RANKINGS
from .stages import packed_batches
from .training import SeedPlan
from .variants import Variant
from .workspace import EncodedSplit, ExperimentConfig, Workspace, encode_split, peak_memory_mb

__all__ = ["MATRIX_TYPES", "BackboneRunner", "EncodedSplit", "ExperimentConfig", "TaskExperiment", "Variant",
           "Workspace", "all_orders", "encode_split", "packed_batches", "peak_memory_mb"]


def all_orders() -> tuple[str, ...]:
    """Every registered head ranking (the paper's five, plus any registered by analyses)."""
    return tuple(HEAD_RANKINGS)


class TaskExperiment(Workspace):
    """All PAPA runs of one (model, task): a :class:`~papa_lib.experiments.workspace.Workspace` (loading the
    configured model, encoder or decoder LM, with :func:`~papa_lib.core.decoders.load_model` when none is given)
    with the stage functions of :mod:`~papa_lib.experiments.stages`, :mod:`~papa_lib.experiments.overrides` and
    :mod:`~papa_lib.experiments.runs` as methods; each product is computed once (in memory, and on disk under
    ``results_dir``: ``matrices/``, ``lambdas/``, ``features/``)."""

    def __init__(self, config: ExperimentConfig, model=None, tokenizer=None, results_dir: str | Path | None = None,
                 progress: bool = True):
        if model is None:
            model, tokenizer = load_model(config.model, device=config.device)
        super().__init__(config, model, tokenizer, results_dir=results_dir, progress=progress)

    # stage 1: task data and seeds
    def split(self, name: str) -> EncodedSplit:
        return stages.split(self, name)

    @property
    def data_key(self) -> str:
        return stages.data_key(self)

    @property
    def data_source(self) -> str:
        return stages.data_source(self)

    def data_files(self, matrices_from: str | None = None) -> dict[str, Path]:
        return stages.data_files(self, matrices_from)

    def seed_rows(self, seed: int) -> torch.Tensor:
        return stages.seed_rows(self, seed)

    def seed_plan(self, seed: int) -> SeedPlan:
        return stages.seed_plan(self, seed)

    # stage 2: constant matrices
    def unlabeled_split(self, source_task: str | None = None) -> EncodedSplit:
        return stages.unlabeled_split(self, source_task)

    def averaged_split(self, source_task: str | None = None) -> EncodedSplit:
        return stages.averaged_split(self, source_task)

    def constants(self, source_task: str | None = None, kind: str = "average"):
        return stages.constants(self, source_task, kind)

    # stage 3: head order
    def head_scores(self, order: str, matrices_from: str | None = None, seed: int = 0) -> torch.Tensor:
        return overrides.head_scores(self, order, matrices_from, seed)

    def cached_scores(self, name: str, compute) -> torch.Tensor:
        return overrides.cached_scores(self, name, compute)

    def lambda_path(self, source: str, seed: int) -> Path | None:
        return stages.lambda_path(self, source, seed)

    def learn_lambdas(self, matrices_from: str | None = None, seed: int = 0) -> torch.Tensor:
        return stages.learn_lambdas(self, matrices_from, seed)

    def override_for(self, variant: Variant, seed: int = 0) -> AttentionOverride | None:
        return overrides.override_for(self, variant, seed)

    # stage 4: features
    def feature_bytes(self, seeds=()) -> int:
        return overrides.variant_feature_bytes(self, seeds)

    def use_cache(self, seeds=()) -> bool:
        return overrides.use_cache(self, seeds)

    def _cached_rows(self, state, split_name: str, rows: torch.Tensor) -> RaggedRows:
        return overrides.cached_rows(self, state, split_name, rows)

    # stage 5: probes
    def score(self, split_name: str, examples, predictions: torch.Tensor) -> float:
        return runs.score(self, split_name, examples, predictions)

    def majority_baseline(self) -> float:
        return runs.majority_baseline(self)

    def majority_accuracy(self) -> float:
        return runs.majority_accuracy(self)

    # stage 6: records
    def relevant_config(self, variant: Variant) -> dict:
        return runs.relevant_config(self, variant)

    def run_id(self, variant: Variant, seed: int) -> str:
        return runs.run_id(self, variant, seed)

    def compute_records(self, variant: Variant, seeds, store_seeds=None, land=None) -> list[dict]:
        """Train and score ``variant`` for each seed (:func:`papa_lib.experiments.runs.compute_records`)."""
        return runs.compute_records(self, variant, seeds, store_seeds, land)

    def compute_record(self, variant: Variant, seed: int) -> dict:
        """One run's record (computed, not stored)."""
        return self.compute_records(variant, [seed])[0]

    def run_variant(self, variant: Variant, seeds) -> list[dict]:
        """Probe ``variant`` for every seed not yet in the store; append and return all its records."""
        return runs.run_variant(self, variant, seeds,
                                compute=lambda ws, v, todo, land=None: self.compute_records(v, todo, land=land))

    def run(self, variant: Variant, seed: int) -> dict:
        """Probe one variant with one seed; append the record to the store (skipped if already finished)."""
        return self.run_variant(variant, [seed])[0]

    def evaluate_variant(self, variant: Variant, seed: int) -> float:
        """Train a probe for ``variant`` with ``seed`` and return the validation metric."""
        return self.compute_record(variant, seed)["value"]
