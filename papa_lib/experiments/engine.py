"""The experiment engine: one (model, task) pipeline from task data to records (paper Sec. 3.2-3.3, 4, 5.2-5.4).

The data flows one way, one stage per job::

    task data (experiments.tasks) -> layout and packing (core.layout, core.packing)
      -> constant matrices (experiments.matrices registry) -> head order (experiments.rankings registry)
      -> features (experiments.features: store or stream) -> probes (experiments.training) -> record (results)

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

import hashlib
import re
import resource
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from torch import nn

from ..core import layout
from ..core.averaging import ConstantAttention
from ..core.artefacts import read_or_heal, write_atomic
from ..core.models import load_encoder, model_id, num_layers_and_heads
from ..core.override import AttentionOverride
from ..core.packing import pack, supports_packing
from . import metrics, probes, results, selection, tasks
from .features import (BackboneRunner, FeatureStore, RaggedRows, default_budget, feature_bytes, length_sorted_chunks, on_device,
                       select_rows)
from .matrices import MATRIX_TYPES, constant_builder, matrix_type
from .rankings import HEAD_RANKINGS, head_ranking
from .loop import optimizer_for
from .provenance import run_provenance
from .training import HELDOUT_FRACTION, SeedPlan, heldout_split, train_seeds


def all_orders() -> tuple[str, ...]:
    """Every registered head ranking (the paper's five, plus any registered by analyses)."""
    return tuple(HEAD_RANKINGS)


@dataclass(frozen=True)
class Variant:
    """What the frozen backbone runs (see module docstring); always canonical (use :meth:`make`)."""

    matrix_type: str = "original"
    selection_order: str = "none"
    fraction: float = 1.0
    matrices_from: str | None = None

    @classmethod
    def make(cls, matrix_type="average", selection_order="lambda", fraction=1.0, matrices_from=None) -> "Variant":
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
        return self.selection_order != "none" and HEAD_RANKINGS[self.selection_order].scores is not None

    @property
    def seed_dependent(self) -> bool:
        """Whether the backbone differs between seeds (λ is learned per seed; random orders are drawn per seed)."""
        return self.needs_scores or self.selection_order == "random"


@dataclass
class ExperimentConfig:
    """Everything that defines a task's experiments except the variant and the seed.

    ``epochs`` caps probe training (early stopping after ``patience`` epochs without held-out improvement);
    ``limit`` subsamples each seed's probe training rows; the constant matrices average over the whole training text
    (as the paper does) unless ``average_limit`` caps it at a seeded subset of that many examples;
    ``seeds`` are the seeds whose training subsets the feature store covers; ``cache_budget`` (bytes) decides
    between cached and streamed features (None: :func:`~papa_lib.experiments.features.default_budget`); a variant's
    cached features are deleted once its records are written unless ``keep_features``. ``inloop_*`` and
    ``matrix_learning_rate``: see :meth:`TaskExperiment._train_inside`."""

    task: str
    model: str | None = None
    data_dir: str | None = None
    profile: str = "local"
    limit: int | None = None
    average_limit: int | None = None
    eval_limit: int | None = None
    data_seed: int = 0
    max_length: int | None = None
    epochs: int | None = None
    patience: int = 3
    lambda_epochs: int | None = None
    inloop_epochs: int | None = None
    inloop_limit: int | None = None
    matrix_learning_rate: float | None = None
    learning_rate: float | None = None
    lambda_learning_rate: float | None = None
    batch_size: int | None = None
    feature_batch_size: int = 64
    seeds: tuple = (0, 1, 2)
    cache_budget: int | None = None
    keep_features: bool = False
    packed: bool = True
    device: str = "cpu"

    def resolved(self) -> "ExperimentConfig":
        """Fill unset hyperparameters from the paper's Table 3 (via :data:`papa_lib.experiments.tasks.TASKS`)."""
        spec = tasks.TASKS[self.task]
        return replace(
            self,
            max_length=self.max_length or spec.max_length,
            epochs=self.epochs or spec.epochs,
            lambda_epochs=self.lambda_epochs or self.epochs or spec.epochs,
            inloop_epochs=self.inloop_epochs or self.epochs or spec.epochs,
            matrix_learning_rate=self.matrix_learning_rate or self.learning_rate or spec.learning_rate,
            learning_rate=self.learning_rate or spec.learning_rate,
            lambda_learning_rate=self.lambda_learning_rate or self.learning_rate or spec.learning_rate,
            batch_size=self.batch_size or spec.batch_size,
            seeds=tuple(self.seeds),
        )


#: Settings that never change a run's numbers (left out of run ids).
_NOT_IN_RUN_ID = ("device", "feature_batch_size", "lambda_epochs", "lambda_learning_rate", "inloop_epochs",
                  "inloop_limit", "matrix_learning_rate", "seeds",
                  "cache_budget", "keep_features", "packed")


@dataclass
class EncodedSplit:
    """A task split encoded in the PAPA layout, with labels (word-level labels padded with -100 for token tasks)."""

    encoded: layout.EncodedBatch
    labels: torch.Tensor
    examples: object = None
    words_per_sentence: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def encode_split(tokenizer, spec: tasks.TaskSpec, examples, max_length: int) -> EncodedSplit:
    """Encode a task split (App. A layout); token tasks get word-aligned labels (-100 where no first sub-token)."""
    if spec.kind == "token":
        encoded = layout.encode_words(tokenizer, examples.words, max_length=max_length)
        labels = torch.full(encoded.word_index.shape, probes.IGNORE_INDEX, dtype=torch.long)
        for row, tags in enumerate(examples.tags):
            kept = encoded.word_index[row, : len(tags)] >= 0
            labels[row, : len(tags)] = torch.where(kept, torch.tensor(tags, dtype=torch.long),
                                                   torch.tensor(probes.IGNORE_INDEX))
        return EncodedSplit(encoded, labels, examples, [len(w) for w in examples.words])
    encoded = layout.encode(tokenizer, examples.texts, examples.pairs, max_length=max_length)
    return EncodedSplit(encoded, torch.tensor(examples.labels, dtype=torch.long), examples)


def packed_batches(model, encoded: layout.EncodedBatch, batch_size: int, rows=None, use_packing: bool = True):
    """Length-sorted batches of ``rows`` (default all), packed to their real tokens where the model allows it."""
    lengths = encoded["attention_mask"].sum(dim=1)
    for chunk in length_sorted_chunks(lengths, batch_size, rows):
        part = select_rows(encoded, chunk)
        yield pack(part, model=model) if use_packing and supports_packing(model) else part


def peak_memory_mb(device: str) -> float:
    """Peak memory of this process so far: resident set on CPU, allocated memory on a CUDA device."""
    if str(device).startswith("cuda") and torch.cuda.is_available():
        return round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


class TaskExperiment:
    """All PAPA runs of one (model, task): the stages of the module docstring, each product computed once.

    The encoded splits, the constant matrices (per source task and kind, also on disk under
    ``results_dir/matrices``), the learned λ (per matrices source and seed, ``results_dir/lambdas``) and the features
    (``results_dir/features``) are computed lazily and reused.
    """

    def __init__(self, config: ExperimentConfig, model=None, tokenizer=None, results_dir: str | Path | None = None,
                 progress: bool = True):
        self.config = config.resolved()
        self.spec = tasks.TASKS[self.config.task]
        if model is None:
            model, tokenizer = load_encoder(self.config.model, device=self.config.device)
        self.model, self.tokenizer = model, tokenizer
        self.model.requires_grad_(False)
        self.model.eval()
        self.progress = progress
        self.results_dir = Path(results_dir) if results_dir is not None else None
        self.store = results.ResultsStore(results_dir) if results_dir is not None else None
        self.features_store = FeatureStore(self.results_dir / "features") if self.results_dir else None
        self.layers, self.heads = num_layers_and_heads(model)
        self._splits: dict[str, EncodedSplit] = {}
        self._constants: dict[tuple, ConstantAttention] = {}
        self._scores: dict[tuple, torch.Tensor] = {}

    # ------------------------------------------------------------------ stage 1: task data and seeds
    def split(self, name: str) -> EncodedSplit:
        """The encoded split: the whole training set (seeds draw their subsets), validation up to ``eval_limit``."""
        if name not in self._splits:
            cfg = self.config
            limit = None if name == "train" else cfg.eval_limit
            examples = tasks.load_task(cfg.task, name, data_dir=cfg.data_dir, limit=limit, seed=cfg.data_seed)
            self._splits[name] = encode_split(self.tokenizer, self.spec, examples, cfg.max_length)
        return self._splits[name]

    @property
    def data_key(self) -> str:
        """A fingerprint of the encoded training and validation data (not of where the files lie), so run ids and
        caches follow the data: the same files in another folder, or on another machine, give the same ids."""
        train, validation = self.split("train"), self.split("validation")
        return _fingerprint(train.encoded["input_ids"], train.labels, validation.encoded["input_ids"], validation.labels)

    @property
    def data_source(self) -> str:
        return f"train: {self.split('train').examples.source}; validation: {self.split('validation').examples.source}"

    def data_files(self, matrices_from: str | None = None) -> dict[str, Path]:
        """The data files a record of this task reads (training, validation, and ``matrices_from``'s training text),
        named as the records' ``data_source`` shows them; hub data has none."""
        sources = [self.split("train").examples.source, self.split("validation").examples.source]
        if matrices_from and matrices_from != self.config.task:
            sources.append(self.unlabeled_split(matrices_from).examples.source)
        return {name: path for source in sources for name, path in _source_files(source).items()}

    def seed_rows(self, seed: int) -> torch.Tensor:
        """The training examples of ``seed``: a seeded subset of ``limit`` examples, or the whole training set."""
        n = len(self.split("train"))
        limit = self.config.limit
        if limit is None or limit >= n:
            return torch.arange(n)
        generator = torch.Generator().manual_seed(1_000_033 * self.config.data_seed + seed)
        return torch.randperm(n, generator=generator)[:limit].sort().values

    def seed_plan(self, seed: int) -> SeedPlan:
        """``seed``'s training rows and its held-out slice for early stopping."""
        train, heldout = heldout_split(self.seed_rows(seed), HELDOUT_FRACTION, seed)
        return SeedPlan(seed, train, heldout)

    def _store_rows(self, seeds) -> torch.Tensor:
        """Training examples the feature store covers: the union of the configured seeds' subsets."""
        return torch.unique(torch.cat([self.seed_rows(s) for s in sorted(set(self.config.seeds) | set(seeds))]))

    # ------------------------------------------------------------------ stage 2: constant matrices (Sec. 3.1, 5.3)
    def unlabeled_split(self, source_task: str | None = None) -> EncodedSplit:
        """The whole training text of ``source_task`` (default: this task) encoded at this task's L."""
        source_task = source_task or self.config.task
        if source_task == self.config.task:
            return self.split("train")
        examples = tasks.unlabeled_texts(source_task, data_dir=self.config.data_dir)
        return encode_split(self.tokenizer, tasks.TASKS[source_task], examples, self.config.max_length)

    def averaged_split(self, source_task: str | None = None) -> EncodedSplit:
        """The text the constant matrices average over: :meth:`unlabeled_split`, or a seeded subset of
        ``average_limit`` of its examples."""
        split, limit = self.unlabeled_split(source_task), self.config.average_limit
        count = int(split.encoded["input_ids"].shape[0])
        if limit is None or limit >= count:
            return split
        generator = torch.Generator().manual_seed(1_000_037 * self.config.data_seed + 17)
        rows = torch.randperm(count, generator=generator)[:limit].sort().values
        labels = split.labels[rows] if split.labels.shape[:1] == (count,) else split.labels
        return EncodedSplit(select_rows(split.encoded, rows), labels, split.examples)

    def constants(self, source_task: str | None = None, kind: str = "average") -> ConstantAttention:
        """Constant matrices of ``kind`` (a registered builder; Eq. 2 for ``average``) from the training text of
        ``source_task``, labels unused; cached in memory and under ``results_dir/matrices``."""
        source_task = source_task or self.config.task
        if (source_task, kind) in self._constants:
            return self._constants[(source_task, kind)]
        cfg = self.config
        text = _fingerprint(self.averaged_split(source_task).encoded["input_ids"])
        key = results.config_hash({"model": model_id(self.model), "source": source_task, "L": cfg.max_length,
                                   "text": text,
                                   **({"kind": kind} if kind != "average" else {}), **_provenance(source_task)})
        prefix = source_task if kind == "average" else f"{source_task}-{kind}"
        path = self.results_dir / "matrices" / f"{prefix}-L{cfg.max_length}-{key}.safetensors" if self.results_dir else None
        constants = read_or_heal(path, ConstantAttention.load)  # None: absent, or damaged and set aside
        if constants is None:
            split = self.averaged_split(source_task)
            builder, accepts_packed = constant_builder(kind)
            batches = list(packed_batches(self.model, split.encoded, cfg.feature_batch_size,
                                          use_packing=cfg.packed and accepts_packed))
            constants = builder(self.model, batches, progress=self.progress, total=len(batches),
                                source=f"{source_task} train: {split.examples.source}")
            if path is not None:
                constants.save(path)
        constants.check_compatible(self.model, cfg.max_length)
        self._constants[(source_task, kind)] = constants
        return constants

    # ------------------------------------------------------------------ stage 3: head order (Sec. 3.2, 5.4)
    def head_scores(self, order: str, matrices_from: str | None = None, seed: int = 0) -> torch.Tensor:
        """Per-head scores ``[layers, heads]`` behind a scored ranking (λ, or a registered label-free score)."""
        ranking = head_ranking(order)
        if ranking.scores is None:
            raise ValueError(f"order {order!r} has no per-head scores")
        return ranking.scores(self, matrices_from, seed)

    def cached_scores(self, name: str, compute) -> torch.Tensor:
        """Label-free scores are computed once per experiment (``compute()`` on first use)."""
        if (name,) not in self._scores:
            self._scores[(name,)] = compute()
        return self._scores[(name,)]

    def lambda_path(self, source: str, seed: int) -> Path | None:
        cfg = self.config
        key = results.config_hash({"model": model_id(self.model), "task": cfg.task, "matrices_from": source,
                                   "L": cfg.max_length, "limit": cfg.limit, "epochs": cfg.lambda_epochs,
                                   "lr": cfg.learning_rate, "bs": cfg.batch_size, "lambda_lr": cfg.lambda_learning_rate,
                                   "seed": seed, "data_seed": cfg.data_seed,
                                   **({"average_limit": cfg.average_limit} if cfg.average_limit is not None else {}),
                                   **_provenance(cfg.task), **_provenance(source, "source")})
        return self.results_dir / "lambdas" / f"{cfg.task}-from-{source}-{key}.pt" if self.results_dir else None

    def learn_lambdas(self, matrices_from: str | None = None, seed: int = 0) -> torch.Tensor:
        """Train θ (λ = σ(θ)) of every head jointly with a probe on ``seed``'s training rows
        (:func:`papa_lib.experiments.inloop.learn_lambdas`); λ ``[layers, heads]``, saved under ``results_dir/lambdas``."""
        from .inloop import BackboneProbe, inloop_batches, learn_lambdas

        source = matrices_from or self.config.task
        if ("lambda", source, seed) in self._scores:
            return self._scores[("lambda", source, seed)]
        cfg, path = self.config, self.lambda_path(source, seed)
        lambdas = read_or_heal(path, torch.load)  # None: absent, or damaged and set aside
        if lambdas is None:
            constants, split = self.constants(source), self.split("train")
            probes.set_seed(seed)
            probe = self._new_probe()
            lambdas = learn_lambdas(
                self.model, constants, probe,
                lambda state: BackboneProbe(self.model, probe, self.spec.kind, cfg.packed).to(cfg.device),
                inloop_batches(split.encoded, split.labels, self.spec.kind, self.seed_plan(seed).train, cfg.batch_size,
                               seed),
                seed=seed, epochs=cfg.lambda_epochs, learning_rate=cfg.learning_rate,
                theta_learning_rate=cfg.lambda_learning_rate, device=cfg.device)
            if path is not None:
                write_atomic(path, lambda tmp: torch.save(lambdas, tmp))
        self._scores[("lambda", source, seed)] = lambdas
        return lambdas

    def override_for(self, variant: Variant, seed: int = 0) -> AttentionOverride | None:
        """The :class:`AttentionOverride` a variant runs for ``seed`` (``None`` for the original model)."""
        if variant.matrix_type == "original":
            return None
        entry = matrix_type(variant.matrix_type)
        ranking = head_ranking(variant.selection_order) if variant.selection_order != "none" else None
        scores = self.head_scores(variant.selection_order, variant.matrices_from, seed) if variant.needs_scores else None
        order = ranking.order if ranking is not None else "first_to_last"
        replaced = selection.heads_to_replace(order, variant.fraction, self.layers, self.heads, lambdas=scores,
                                              seed=seed)
        matrices = self.constants(variant.matrices_from, entry.constants) if entry.constants else None
        return AttentionOverride(self.model, matrices, replaced, entry.mode, trainable_init=entry.trainable_init,
                                 max_length=self.config.max_length)

    # ------------------------------------------------------------------ stage 4: features
    def _features_key(self, state: AttentionOverride | None, split_name: str, rows: torch.Tensor) -> str:
        split = self.split(split_name)
        digest = hashlib.sha256()
        for name in ("input_ids", "attention_mask", "token_type_ids"):
            if name in split.encoded:
                digest.update(split.encoded[name].numpy().tobytes())
        if split.encoded.word_index is not None:
            digest.update(split.encoded.word_index.numpy().tobytes())
        digest.update(rows.numpy().tobytes())
        if state is not None:
            digest.update(repr(sorted(state.plan.items())).encode())
            for layer_matrices in state._bases.values():
                if layer_matrices is not None:
                    digest.update(layer_matrices.detach().cpu().numpy().tobytes())
            for learned in state.trainable.values():  # trainable matrices after their training phase
                digest.update(learned.detach().cpu().numpy().tobytes())
        return results.config_hash({"model": model_id(self.model), "kind": self.spec.kind, "inputs": digest.hexdigest(),
                                    "L": self.config.max_length})

    def feature_bytes(self, seeds=()) -> int:
        """Bytes the store would keep for one variant: the seeds' training rows plus the validation set."""
        hidden = self.model.config.hidden_size
        train = self.split("train")
        rows = self._store_rows(seeds)
        part = select_rows(train.encoded, rows)
        return (feature_bytes(part, train.labels[rows], self.spec.kind, self.layers + 1, hidden)
                + feature_bytes(self.split("validation").encoded, self.split("validation").labels, self.spec.kind,
                                self.layers + 1, hidden))

    def use_cache(self, seeds=()) -> bool:
        budget = self.config.cache_budget if self.config.cache_budget is not None else default_budget(self.results_dir)
        return self.feature_bytes(seeds) <= budget

    def _runner(self, split_name: str) -> BackboneRunner:
        split = self.split(split_name)
        return BackboneRunner(self.model, split.encoded, split.labels, self.spec.kind, self.config.feature_batch_size,
                              self.config.packed)

    def _cached_rows(self, state, split_name: str, rows: torch.Tensor) -> RaggedRows:
        """Features of ``rows`` of a split under ``state``, from the store (computed and saved on first use)."""
        key = self._features_key(state, split_name, rows)
        if self.features_store is not None and self.features_store.has(key, split_name):
            return self.features_store.load(key, split_name)
        with state.applied(self.model) if state is not None else nullcontext():
            features = self._runner(split_name).rows(rows, self.progress, f"{split_name} features")
        if self.features_store is not None:
            self.features_store.save(key, split_name, features)
            return self.features_store.load(key, split_name)
        return features

    # ------------------------------------------------------------------ stage 5: probes
    def _new_probe(self) -> nn.Module:
        hidden = self.model.config.hidden_size
        return probes.make_probe(self.spec.kind, self.layers + 1, self.config.max_length, hidden, self.spec.num_labels)

    def score(self, split_name: str, examples, predictions: torch.Tensor) -> float:
        """The task's metric for ``predictions`` on ``examples`` of a split (per example, or per kept word)."""
        split = self.split(split_name)
        examples = torch.as_tensor(examples, dtype=torch.long)
        if self.spec.kind != "token":
            return metrics.compute_metric(self.spec.name, predictions.tolist(), split.labels[examples].tolist())
        return self._token_metrics(split, examples, predictions)[0]

    def _token_metrics(self, split: EncodedSplit, examples, predictions) -> tuple[float, float]:
        """(primary metric, token accuracy) of kept-word predictions; truncated words: 'O' for NER, wrong for POS."""
        labels = split.labels[examples]
        kept = labels != probes.IGNORE_INDEX
        filled = torch.full(labels.shape, -1, dtype=torch.long)
        filled[kept] = predictions
        names = self.spec.label_names
        preds, golds = [], []
        for row, example in enumerate(examples.tolist()):
            tags = split.examples.tags[example]
            # a word cut off by L gets "O": outside every entity (NER) and matching no POS tag
            preds.append([names[p] if p >= 0 else "O" for p in filled[row, : len(tags)].tolist()])
            golds.append([names[g] for g in tags])
        flat_p = [p for s in preds for p in s]
        flat_g = [g for s in golds for g in s]
        accuracy = sum(int(p == g) for p, g in zip(flat_p, flat_g)) / max(len(flat_g), 1)
        return metrics.compute_metric(self.spec.name, preds, golds), accuracy

    def _validation_majority(self) -> tuple[torch.Tensor, int]:
        """The validation labels that are scored (kept tokens for token tasks) and their most frequent class."""
        labels = self.split("validation").labels
        labels = labels[labels != probes.IGNORE_INDEX]
        return labels, int(torch.mode(labels).values) if labels.numel() else 0

    def majority_baseline(self) -> float:
        """The metric of always predicting the validation set's most frequent class (or tag)."""
        labels, majority = self._validation_majority()
        return self.score("validation", torch.arange(len(self.split("validation"))),
                          torch.full((labels.numel(),), majority))

    def majority_accuracy(self) -> float:
        """The share of validation labels (or kept tokens) that are the most frequent class: the accuracy of always
        predicting it, beside :meth:`majority_baseline` for the metrics (MCC, F1) that are not accuracy."""
        labels, majority = self._validation_majority()
        return float((labels == majority).float().mean()) if labels.numel() else float("nan")

    def _train_frozen(self, variant: Variant, seeds: list[int], state: AttentionOverride | None = None
                      ) -> dict[int, dict]:
        """Probes of ``seeds`` on frozen features of ``variant`` (cached or streamed; ``state`` overrides the
        variant's own override, e.g. learned matrices); per seed its outcome."""
        cfg, kind = self.config, self.spec.kind
        state = state if state is not None else self.override_for(variant, seeds[0])
        plans = [self.seed_plan(seed) for seed in seeds]
        train, validation = self.split("train"), self.split("validation")
        all_val = torch.arange(len(validation))
        cached = self.use_cache(seeds)
        if cached:
            store_rows = self._store_rows(seeds)
            local = torch.full((len(train),), -1, dtype=torch.long)
            local[store_rows] = torch.arange(len(store_rows))
            rows = on_device(self._cached_rows(state, "train", store_rows), cfg.device)
            val_rows = on_device(self._cached_rows(state, "validation", all_val), cfg.device)
            context = nullcontext()

            def source(chunk):
                return rows, local[chunk]

            def heldout(plan):
                return rows, local[plan.heldout]
        else:
            runner = self._runner("train")
            context = state.applied(self.model) if state is not None else nullcontext()

            def source(chunk):
                return runner.rows(chunk), torch.arange(len(chunk))

            def heldout(plan):
                return runner.rows(plan.heldout), torch.arange(len(plan.heldout))
        with context:
            trained = train_seeds(
                lambda seed: self._new_probe(), plans, source, heldout,
                lambda plan, predictions: self.score("train", plan.heldout, predictions), train.labels, kind,
                pool_size=len(train), batch_size=cfg.batch_size, learning_rate=cfg.learning_rate,
                max_epochs=cfg.epochs, patience=cfg.patience, order_seed=cfg.data_seed, device=cfg.device,
                progress=self.progress)
            if not cached:
                val_rows = self._runner("validation").rows(all_val, self.progress, "validation features")
        from .training import predict_rows

        if cached and self.features_store is not None and not cfg.keep_features:
            for split_name, rows in (("train", store_rows), ("validation", all_val)):
                self.features_store.remove(self._features_key(state, split_name, rows))
        outcomes = {}
        for plan in plans:
            result = trained[plan.seed]
            predictions = predict_rows(result.probe, val_rows, all_val, kind, cfg.device)
            outcomes[plan.seed] = {"result": result, "predictions": predictions, "plan": plan,
                                   "feature_mode": "cached" if cached else "streamed"}
        return outcomes

    def _train_inside(self, variant: Variant, seed: int) -> dict:
        """Trainable matrices (Sec. 5.2 (4)-(5)): trained jointly with a probe inside the backbone for
        ``inloop_epochs`` on at most ``inloop_limit`` of the seed's rows at ``matrix_learning_rate``, then frozen; a
        fresh probe then trains on their features with every other row's budget, so Table 1's rows differ only in
        the matrices. ``matrices_moved``: relative Frobenius distance from the initialisation (largest layer)."""
        from .inloop import BackboneProbe, train_inloop

        cfg, kind, state, rows = self.config, self.spec.kind, self.override_for(variant, seed), self.seed_plan(seed).train
        if cfg.inloop_limit is not None and len(rows) > cfg.inloop_limit:
            pick = torch.randperm(len(rows), generator=torch.Generator().manual_seed(7_919 * seed + 3))
            rows = rows[pick[: cfg.inloop_limit]].sort().values
        train = self.split("train")
        initial = [p.detach().clone() for p in state.trainable.values()]
        probes.set_seed(seed)
        wrapper = BackboneProbe(self.model, self._new_probe(), kind, cfg.packed).to(cfg.device)
        with state.applied(self.model):
            phase1 = train_inloop(wrapper, state, train.encoded, train.labels, kind, rows, seed=seed,
                                  epochs=cfg.inloop_epochs, learning_rate=cfg.learning_rate, batch_size=cfg.batch_size,
                                  extra_rates={"matrices": cfg.matrix_learning_rate}, device=cfg.device)
        for parameter in state.trainable_parameters():
            parameter.requires_grad_(False)
        moved = [float((p.detach().clamp_min(0) - p0.clamp_min(0)).norm() / p0.clamp_min(0).norm().clamp_min(1e-12))
                 for p, p0 in zip(state.trainable.values(), initial)]
        outcome = self._train_frozen(variant, [seed], state=state)[seed]
        return {**outcome, "matrices_moved": max(moved) if moved else 0.0, "matrix_updates": phase1.updates}

    # ------------------------------------------------------------------ stage 6: records
    def relevant_config(self, variant: Variant) -> dict:
        """The settings that can change this variant's number (λ settings only for λ orders, in-loop epochs only for
        variants trained inside the backbone), so unrelated changes to a grid do not invalidate finished runs."""
        cfg = asdict(self.config)
        for key in _NOT_IN_RUN_ID:
            cfg.pop(key)
        if cfg["average_limit"] is None or (matrix_type(variant.matrix_type).constants is None
                                            and not variant.needs_scores):  # λ mixes in the averages too
            cfg.pop("average_limit")  # run ids of averages over all the text stay those of before the setting
        cfg["model"] = model_id(self.model)
        cfg["data_dir"] = self.data_key  # the data itself, wherever it lies
        cfg["engine"] = "packed-early-stopping-v2"
        if variant.needs_lambdas:
            cfg.update(lambda_epochs=self.config.lambda_epochs, lambda_learning_rate=self.config.lambda_learning_rate)
        if not variant.frozen:
            cfg.update(inloop_epochs=self.config.inloop_epochs, inloop_limit=self.config.inloop_limit,
                       matrix_learning_rate=self.config.matrix_learning_rate, inloop="train-then-probe")
        return cfg | _provenance(self.spec.name)

    def run_id(self, variant: Variant, seed: int) -> str:
        return results.config_hash({**self.relevant_config(variant), **asdict(variant), "seed": seed})

    def _record(self, variant: Variant, seed: int, outcome: dict, seconds: float) -> dict:
        result, predictions, plan = outcome["result"], outcome["predictions"], outcome["plan"]
        validation = self.split("validation")
        examples = torch.arange(len(validation))
        if self.spec.kind == "token":
            value, accuracy = self._token_metrics(validation, examples, predictions)
        else:
            value = self.score("validation", examples, predictions)
            accuracy = float((predictions == validation.labels).float().mean()) if len(validation) else float("nan")
        run_id = self.run_id(variant, seed)
        curve_file = results.write_curve(self.results_dir, run_id, result.curve) if self.results_dir else None
        entry = matrix_type(variant.matrix_type)
        return {
            "run_id": run_id,
            "model": model_id(self.model),
            "task": self.spec.name,
            "matrix_type": variant.matrix_type,
            "matrices_from": variant.matrices_from or (self.spec.name if entry.constants else None),
            "selection_order": variant.selection_order,
            "fraction": variant.fraction,
            "seed": seed,
            "metric": self.spec.metric,
            "value": float(value),
            "token_accuracy" if self.spec.kind == "token" else "accuracy": accuracy,
            "majority_baseline": float(self.majority_baseline()),
            "majority_accuracy": self.majority_accuracy(),
            "single_class": bool(predictions.numel() > 0 and bool((predictions == predictions[0]).all())),
            "eval_size": len(validation.examples),
            "train_size": int(len(plan.train)),
            "average_limit": "all" if self.config.average_limit is None else self.config.average_limit,
            "heldout_size": int(len(plan.heldout)),
            "best_epoch": result.best_epoch,
            "epochs_run": len(result.curve),
            "updates": result.updates,
            "updates_at_best": result.updates_at_best,
            "heldout_score": result.best_score if result.best_score != float("-inf") else None,
            "feature_mode": outcome["feature_mode"],
            "matrices_moved": outcome.get("matrices_moved"),
            "matrix_updates": outcome.get("matrix_updates"),
            "peak_memory_mb": peak_memory_mb(self.config.device),
            "curve_file": curve_file,
            "config_hash": results.config_hash(self.relevant_config(variant)),
            "profile": self.config.profile,
            "data_source": self.data_source,
            "versions": results.package_versions(),
            "device": str(self.config.device),
            "wall_time_s": round(seconds, 3),
            **_provenance(self.spec.name),
            **run_provenance(self.config.device, self.data_files(variant.matrices_from),
                             optimizer_for(self.config.device)),
        }

    def compute_records(self, variant: Variant, seeds) -> list[dict]:
        """Train and score ``variant`` for each seed (all seeds of a frozen, seed-independent variant in one pass);
        the records are returned, not stored."""
        seeds = list(seeds)
        started = time.time()
        if not variant.frozen:
            outcomes = {seed: self._train_inside(variant, seed) for seed in seeds}
        elif variant.seed_dependent:
            outcomes = {}
            for seed in seeds:
                outcomes.update(self._train_frozen(variant, [seed]))
        else:
            outcomes = self._train_frozen(variant, seeds)
        seconds = (time.time() - started) / max(len(seeds), 1)
        return [self._record(variant, seed, outcomes[seed], seconds) for seed in seeds]

    def compute_record(self, variant: Variant, seed: int) -> dict:
        """One run's record (computed, not stored)."""
        return self.compute_records(variant, [seed])[0]

    def run_variant(self, variant: Variant, seeds) -> list[dict]:
        """Probe ``variant`` for every seed not yet in the store; append and return all its records."""
        todo = [seed for seed in seeds if self.store is None or not self.store.has(self.run_id(variant, seed))]
        fresh = {record["seed"]: record for record in self.compute_records(variant, todo)} if todo else {}
        out = []
        for seed in seeds:
            if seed in fresh:
                if self.store is not None and not self.store.append(fresh[seed], exist_ok=True):
                    out.append(self.store.get(fresh[seed]["run_id"]))  # a parallel lane finished it first: theirs
                    continue
                out.append(fresh[seed])
            else:
                out.append(self.store.get(self.run_id(variant, seed)))
        return out

    def run(self, variant: Variant, seed: int) -> dict:
        """Probe one variant with one seed; append the record to the store (skipped if already finished)."""
        return self.run_variant(variant, [seed])[0]

    def evaluate_variant(self, variant: Variant, seed: int) -> float:
        """Train a probe for ``variant`` with ``seed`` and return the validation metric."""
        return self.compute_record(variant, seed)["value"]


def _provenance(task: str, key: str = "provenance") -> dict:
    """``{key: ...}`` for a task of your own (files, columns: :mod:`papa_lib.experiments.custom`), else ``{}``."""
    provenance = tasks.TASKS[task].provenance if task in tasks.TASKS else None
    return {key: provenance} if provenance else {}


def _source_files(source: str) -> dict[str, Path]:
    """``{name: path}`` of the files a split's ``source`` names (a path, or ``papa_lib/samples/...`` for the packaged
    sample, maybe followed by a note in parentheses); nothing for hub data."""
    from . import sample_data

    name = re.split(r" [(\[]", source)[0].strip()
    if name.startswith("papa_lib/samples/"):
        path = sample_data._unpacked_dir(sample_data.SAMPLE_PACK) / name[len("papa_lib/samples/"):]
    else:
        path = Path(name)
    return {name: path} if path.is_file() else {}


def _fingerprint(*tensors: torch.Tensor) -> str:
    """16 hex digits of some tensors' contents (token ids, labels)."""
    digest = hashlib.sha256()
    for tensor in tensors:
        digest.update(tensor.cpu().numpy().tobytes())
    return digest.hexdigest()[:16]
