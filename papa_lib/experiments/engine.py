"""The experiment engine: one (model, task) pipeline from task data to records (paper Sec. 3.2-3.3, 4, 5.2-5.4).

The data flows one way, one stage per job, each stage a function of a
:class:`~papa_lib.experiments.workspace.Workspace` (the experiment's settings, backbone, paths and caches), all of
them in this module, in this order::

    task data (split, seed_plan) -> constant matrices (constants; experiments.matrices registry)
      -> head order (learn_lambdas, head_scores, override_for; experiments.rankings registry)
      -> features (use_cache, cached_rows, runner: store or stream)
      -> probes (train_frozen, train_inside) -> record (record, compute_records, run_variant)

Every product is computed once per workspace (and, with a results folder, once on disk). :class:`TaskExperiment` is
that workspace with its model loaded and the run entry points as methods (what the grid, the executors and the
chapters call); :class:`Variant` is :mod:`~papa_lib.experiments.variants`, :class:`ExperimentConfig`
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

import hashlib
import time
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path

import torch

from ..core import artefacts
from ..core.artefacts import read_or_heal
from ..core.averaging import ConstantAttention
from ..core.decoders import load_model
from ..core.models import model_id
from ..core.override import AttentionOverride
from ..core.packing import pack, supports_packing
from . import metrics, probes, results, selection, tasks
from .features import (
    BackboneRunner,
    RaggedRows,
    default_budget,
    feature_bytes,
    length_sorted_chunks,
    on_device,
    select_rows,
)
from .loop import IGNORE_INDEX, EpochCheckpoint, optimizer_for, set_seed
from .matrices import constant_builder, matrix_type
from .provenance import config_hash, package_versions, run_provenance
from .rankings import HEAD_RANKINGS, head_ranking
from .task_specs import TASKS
from .training import HELDOUT_FRACTION, SeedPlan, heldout_split, predict_rows, train_seeds
from .variants import Variant
from .workspace import (
    LAMBDA_SUFFIX,
    NOT_IN_RUN_ID,
    EncodedSplit,
    ExperimentConfig,
    Workspace,
    encode_split,
    fingerprint,
    peak_memory_mb,
    read_lambda_info,
    read_lambdas,
    source_files,
    task_provenance,
    write_lambdas,
)

__all__ = [
    # 1. task data and seeds
    "data_files", "data_key", "data_source", "seed_plan", "seed_rows", "seeded_subset", "split", "store_rows",
    # 2. constant matrices
    "averaged_split", "constants", "constants_path", "packed_batches", "unlabeled_split",
    # 3. head order
    "all_orders", "cached_scores", "head_scores", "lambda_path", "lambda_seed", "learn_lambdas", "new_probe",
    "override_for",
    # 4. features
    "cached_rows", "features_key", "runner", "use_cache", "variant_feature_bytes",
    # 5. probes
    "majority_accuracy", "majority_baseline", "score", "token_metrics", "train_frozen", "train_inside",
    "validation_majority",
    # 6. records
    "CHECKPOINTS", "compute_records", "drop_checkpoint", "epoch_checkpoint", "pending_seeds", "record",
    "relevant_config", "run_id", "run_variant",
    "TaskExperiment",
]


# ---------------------------------------------------------------------- 1. task data and seeds
def split(ws: Workspace, name: str) -> EncodedSplit:
    """The encoded split: the whole training set (seeds draw their subsets), validation up to ``eval_limit``."""
    if name not in ws.splits:
        cfg = ws.config
        limit = None if name == "train" else cfg.eval_limit
        examples = tasks.load_task(cfg.task, name, data_dir=cfg.data_dir, limit=limit, seed=cfg.data_seed)
        ws.splits[name] = encode_split(ws.tokenizer, ws.spec, examples, cfg.max_length)
    return ws.splits[name]


def data_key(ws: Workspace) -> str:
    """A fingerprint of the encoded training and validation data (not of where the files lie), so run ids and
    caches follow the data: the same files in another folder, or on another machine, give the same ids."""
    train, validation = split(ws, "train"), split(ws, "validation")
    return fingerprint(train.encoded["input_ids"], train.labels, validation.encoded["input_ids"], validation.labels)


def data_source(ws: Workspace) -> str:
    return f"train: {split(ws, 'train').examples.source}; validation: {split(ws, 'validation').examples.source}"


def data_files(ws: Workspace, matrices_from: str | None = None) -> dict[str, Path]:
    """The data files a record of this task reads (training, validation, and ``matrices_from``'s training text),
    named as the records' ``data_source`` shows them; hub data has none."""
    sources = [split(ws, "train").examples.source, split(ws, "validation").examples.source]
    if matrices_from and matrices_from != ws.config.task:
        sources.append(unlabeled_split(ws, matrices_from).examples.source)
    return {name: path for source in sources for name, path in source_files(source).items()}


def seed_rows(ws: Workspace, seed: int) -> torch.Tensor:
    """The training examples of ``seed``: a seeded subset of ``limit`` examples, or the whole training set."""
    n = len(split(ws, "train"))
    limit = ws.config.limit
    if limit is None or limit >= n:
        return torch.arange(n)
    return seeded_subset(torch.arange(n), limit, 1_000_033 * ws.config.data_seed + seed)


def seeded_subset(rows: torch.Tensor, limit: int, seed: int) -> torch.Tensor:
    """``limit`` of ``rows``, drawn by a permutation seeded with ``seed``, in increasing order."""
    pick = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed))
    return rows[pick[:limit]].sort().values


def seed_plan(ws: Workspace, seed: int) -> SeedPlan:
    """``seed``'s training rows and its held-out slice for early stopping."""
    train, heldout = heldout_split(seed_rows(ws, seed), HELDOUT_FRACTION, seed)
    return SeedPlan(seed, train, heldout)


def store_rows(ws: Workspace, seeds=()) -> torch.Tensor:
    """Training examples the feature store covers: the union of the subsets of ``seeds``, the seeds a call trains
    (default: the configured seeds). A resumed run that has only some seeds left extracts and keeps only their
    rows: with ``limit`` 8,000 of SST-2's 67,349, seven seeds cover 58% of the training set, ten seeds 72%."""
    chosen = sorted(set(seeds)) or sorted(set(ws.config.seeds))
    return torch.unique(torch.cat([seed_rows(ws, s) for s in chosen]))


# ---------------------------------------------------------------------- 2. constant matrices
def unlabeled_split(ws: Workspace, source_task: str | None = None) -> EncodedSplit:
    """The whole training text of ``source_task`` (default: this task) encoded at this task's L."""
    source_task = source_task or ws.config.task
    if source_task == ws.config.task:
        return split(ws, "train")
    examples = tasks.unlabeled_texts(source_task, data_dir=ws.config.data_dir)
    return encode_split(ws.tokenizer, TASKS[source_task], examples, ws.config.max_length)


def averaged_split(ws: Workspace, source_task: str | None = None) -> EncodedSplit:
    """The text the constant matrices average over: :func:`unlabeled_split`, or a seeded subset of
    ``average_limit`` of its examples."""
    text, limit = unlabeled_split(ws, source_task), ws.config.average_limit
    count = int(text.encoded["input_ids"].shape[0])
    if limit is None or limit >= count:
        return text
    rows = seeded_subset(torch.arange(count), limit, 1_000_037 * ws.config.data_seed + 17)
    labels = text.labels[rows] if text.labels.shape[:1] == (count,) else text.labels
    return EncodedSplit(select_rows(text.encoded, rows), labels, text.examples)


def packed_batches(model, encoded, batch_size: int, rows=None, use_packing: bool = True):
    """Length-sorted batches of ``rows`` (default all), packed to their real tokens where the model allows it."""
    lengths = encoded["attention_mask"].sum(dim=1)
    for chunk in length_sorted_chunks(lengths, batch_size, rows):
        part = select_rows(encoded, chunk)
        yield pack(part, model=model) if use_packing and supports_packing(model) else part


def constants_path(ws: Workspace, source_task: str | None = None, kind: str = "average") -> Path | None:
    """Where :func:`constants` keeps the matrices of ``kind`` from ``source_task``'s text: keyed by the model, L, the
    averaged text's fingerprint and the task's provenance (None without a results folder)."""
    source_task = source_task or ws.config.task
    if ws.results_dir is None:
        return None
    text = fingerprint(averaged_split(ws, source_task).encoded["input_ids"])
    key = config_hash({"model": model_id(ws.model), "source": source_task, "L": ws.config.max_length,
                               "text": text,
                               **({"kind": kind} if kind != "average" else {}), **task_provenance(source_task)})
    prefix = source_task if kind == "average" else f"{source_task}-{kind}"
    return ws.under("matrices", f"{prefix}-L{ws.config.max_length}-{key}.safetensors")


def constants(ws: Workspace, source_task: str | None = None, kind: str = "average") -> ConstantAttention:
    """Constant matrices of ``kind`` (a registered builder; Eq. 2 for ``average``) from the training text of
    ``source_task``, labels unused; cached in memory and under ``results_dir/matrices``."""
    source_task = source_task or ws.config.task
    if (source_task, kind) in ws.constants_cache:
        return ws.constants_cache[(source_task, kind)]
    cfg, path = ws.config, constants_path(ws, source_task, kind)
    matrices = read_or_heal(path, ConstantAttention.load)  # None: absent, or damaged and set aside
    if matrices is None:
        text_split = averaged_split(ws, source_task)
        builder, accepts_packed = constant_builder(kind)
        batches = list(packed_batches(ws.model, text_split.encoded, cfg.feature_batch_size,
                                      use_packing=cfg.packed and accepts_packed))
        matrices = builder(ws.model, batches, progress=ws.progress, total=len(batches),
                           source=f"{source_task} train: {text_split.examples.source}")
        if path is not None:
            matrices.save(path)
    matrices.check_compatible(ws.model, cfg.max_length)
    ws.constants_cache[(source_task, kind)] = matrices
    return matrices


# ---------------------------------------------------------------------- 3. head order
def all_orders() -> tuple[str, ...]:
    """Every registered head ranking (the paper's five, plus any registered by analyses)."""
    return tuple(HEAD_RANKINGS)


def lambda_path(ws: Workspace, source: str, seed: int) -> Path | None:
    cfg = ws.config
    key = config_hash({"model": model_id(ws.model), "task": cfg.task, "matrices_from": source,
                               "L": cfg.max_length, "limit": cfg.limit, "epochs": cfg.lambda_epochs,
                               "lr": cfg.learning_rate, "bs": cfg.batch_size, "lambda_lr": cfg.lambda_learning_rate,
                               "seed": seed, "data_seed": cfg.data_seed,
                               **({"average_limit": cfg.average_limit} if cfg.average_limit is not None else {}),
                               **task_provenance(cfg.task), **task_provenance(source, "source")})
    return ws.under("lambdas", f"{cfg.task}-from-{source}-{key}{LAMBDA_SUFFIX}")


def lambda_seed(ws: Workspace, seed: int) -> int:
    """The seed whose λ ranks the heads of ``seed``'s run: its own, or the config's shared ``lambda_seed``."""
    return seed if ws.config.lambda_seed is None else ws.config.lambda_seed


def new_probe(ws: Workspace) -> torch.nn.Module:
    """A fresh probe of the task's kind over every layer's features (Sec. 3.3)."""
    hidden = ws.model.config.hidden_size
    return probes.make_probe(ws.spec.kind, ws.layers + 1, ws.config.max_length, hidden, ws.spec.num_labels)


def learn_lambdas(ws: Workspace, matrices_from: str | None = None, seed: int = 0) -> torch.Tensor:
    """Train θ (λ = σ(θ)) of every head jointly with a probe on ``seed``'s training rows
    (:func:`papa_lib.experiments.inloop.learn_lambdas`); λ ``[layers, heads]``, saved under ``results_dir/lambdas``."""
    from .inloop import BackboneProbe, inloop_batches
    from .inloop import learn_lambdas as learn

    source = matrices_from or ws.config.task
    if ("lambda", source, seed) in ws.scores:
        return ws.scores[("lambda", source, seed)]
    cfg, path = ws.config, lambda_path(ws, source, seed)
    lambdas = read_or_heal(path, read_lambdas)  # None: absent, or damaged and set aside
    if lambdas is None:
        matrices, train = constants(ws, source), split(ws, "train")
        set_seed(seed)
        probe = new_probe(ws)
        lambdas = learn(
            ws.model, matrices, probe,
            lambda state: BackboneProbe(ws.model, probe, ws.spec.kind, cfg.packed).to(cfg.device),
            inloop_batches(train.encoded, train.labels, ws.spec.kind, seed_plan(ws, seed).train, cfg.batch_size,
                           seed),
            seed=seed, epochs=cfg.lambda_epochs, learning_rate=cfg.learning_rate,
            theta_learning_rate=cfg.lambda_learning_rate, device=cfg.device,
            progress=f"learning λ ({ws.config.task}, seed {seed})" if ws.progress else False)
        if path is not None:  # where it was learned, in the file: a run that reads it later may run elsewhere
            where = {"device": str(cfg.device), **run_provenance(cfg.device, data_files(ws, matrices_from))}
            write_lambdas(path, lambdas, where)
    ws.scores[("lambda", source, seed)] = lambdas
    return lambdas


def lambda_device(ws: Workspace, variant: Variant, seed: int) -> str | None:
    """The device that learned the λ ranking ``variant``'s heads for ``seed``, as its file (:func:`lambda_path`,
    written by :func:`learn_lambdas`, also for λ handed in by a Ray worker) records it; ``"not recorded"`` for a file
    written without it; None when no stored λ ranks them (an order without λ, or no results folder). A record's
    ``device`` says where its probe ran."""
    if not variant.needs_scores or not head_ranking(variant.selection_order).uses_lambda:
        return None
    path = lambda_path(ws, variant.matrices_from or ws.config.task, lambda_seed(ws, seed))
    if path is None or not path.is_file():
        return None
    return read_lambda_info(path).get("device", "not recorded")


def head_scores(ws: Workspace, order: str, matrices_from: str | None = None, seed: int = 0) -> torch.Tensor:
    """Per-head scores ``[layers, heads]`` behind a scored ranking (λ, or a registered label-free score); scores
    handed in (``ws.given_scores``) are used as they are. A ``learned`` ranking without scores of its own
    (``lambda``, ``reversed``) is scored by the λ :func:`learn_lambdas` learns for :func:`lambda_seed`'s seed."""
    if (order, matrices_from, seed) in ws.given_scores:
        return ws.given_scores[(order, matrices_from, seed)]
    ranking = head_ranking(order)
    if ranking.uses_lambda:  # Sec. 3.2: the rankings sit below the engine that learns λ
        return learn_lambdas(ws, matrices_from, lambda_seed(ws, seed))
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


# ---------------------------------------------------------------------- 4. features
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
    return config_hash({"model": model_id(ws.model), "kind": ws.spec.kind, "inputs": digest.hexdigest(),
                                "L": ws.config.max_length})


def variant_feature_bytes(ws: Workspace, seeds=()) -> int:
    """Bytes the store would keep for one variant: the seeds' training rows plus the validation set."""
    hidden = ws.model.config.hidden_size
    train, validation = split(ws, "train"), split(ws, "validation")
    rows = store_rows(ws, seeds)
    part = select_rows(train.encoded, rows)
    return (feature_bytes(part, train.labels[rows], ws.spec.kind, ws.layers, hidden)
            + feature_bytes(validation.encoded, validation.labels, ws.spec.kind, ws.layers, hidden))


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


# ---------------------------------------------------------------------- 5. probes
def score(ws: Workspace, split_name: str, examples, predictions: torch.Tensor) -> float:
    """The task's metric for ``predictions`` on ``examples`` of a split (per example, or per kept word)."""
    encoded = split(ws, split_name)
    examples = torch.as_tensor(examples, dtype=torch.long)
    if ws.spec.kind != "token":
        return metrics.compute_metric(ws.spec.name, predictions.tolist(), encoded.labels[examples].tolist())
    return token_metrics(ws, encoded, examples, predictions)[0]


def token_metrics(ws: Workspace, encoded: EncodedSplit, examples, predictions) -> tuple[float, float]:
    """(primary metric, token accuracy) of kept-word predictions; truncated words: 'O' for NER, wrong for POS."""
    labels = encoded.labels[examples]
    kept = labels != IGNORE_INDEX
    filled = torch.full(labels.shape, -1, dtype=torch.long)
    filled[kept] = predictions
    names = ws.spec.label_names
    preds, golds = [], []
    for row, example in enumerate(examples.tolist()):
        tags = encoded.examples.tags[example]
        # a word cut off by L gets "O": outside every entity (NER) and matching no POS tag
        preds.append([names[p] if p >= 0 else "O" for p in filled[row, : len(tags)].tolist()])
        golds.append([names[g] for g in tags])
    flat_p = [p for s in preds for p in s]
    flat_g = [g for s in golds for g in s]
    accuracy = sum(int(p == g) for p, g in zip(flat_p, flat_g)) / max(len(flat_g), 1)
    return metrics.compute_metric(ws.spec.name, preds, golds), accuracy


def validation_majority(ws: Workspace) -> tuple[torch.Tensor, int]:
    """The validation labels that are scored (kept tokens for token tasks) and their most frequent class."""
    labels = split(ws, "validation").labels
    labels = labels[labels != IGNORE_INDEX]
    return labels, int(torch.mode(labels).values) if labels.numel() else 0


def majority_baseline(ws: Workspace) -> float:
    """The metric of always predicting the validation set's most frequent class (or tag)."""
    labels, majority = validation_majority(ws)
    return score(ws, "validation", torch.arange(len(split(ws, "validation"))),
                 torch.full((labels.numel(),), majority))


def majority_accuracy(ws: Workspace) -> float:
    """The share of validation labels (or kept tokens) that are the most frequent class: the accuracy of always
    predicting it, beside :func:`majority_baseline` for the metrics (MCC, F1) that are not accuracy."""
    labels, majority = validation_majority(ws)
    return float((labels == majority).float().mean()) if labels.numel() else float("nan")


def train_frozen(ws: Workspace, variant: Variant, seeds: list[int], state: AttentionOverride | None = None,
                 store_seeds=None, on_outcome=None, checkpoint: EpochCheckpoint | None = None) -> dict[int, dict]:
    """Probes of ``seeds`` on frozen features of ``variant`` (cached or streamed; ``state`` overrides the
    variant's own override, e.g. learned matrices); per seed its outcome.

    ``on_outcome(seed, outcome)``: with cached features, called as soon as a seed stops early with its final outcome
    (the validation features are at hand then; streamed, they are computed after training, and every outcome comes
    back at the end only). ``checkpoint``: the probes' state after each epoch (:func:`epoch_checkpoint`)."""
    cfg, kind = ws.config, ws.spec.kind
    state = state if state is not None else override_for(ws, variant, seeds[0])
    plans = [seed_plan(ws, seed) for seed in seeds]
    train, validation = split(ws, "train"), split(ws, "validation")
    all_val = torch.arange(len(validation))
    shared = list(store_seeds) if store_seeds else seeds  # the seeds whose rows the feature store covers
    cached = use_cache(ws, shared)
    if cached:
        covered = store_rows(ws, shared)
        local = torch.full((len(train),), -1, dtype=torch.long)
        local[covered] = torch.arange(len(covered))
        rows = on_device(cached_rows(ws, state, "train", covered), cfg.device)
        val_rows = on_device(cached_rows(ws, state, "validation", all_val), cfg.device)
        context = nullcontext()

        def source(chunk):
            return rows, local[chunk]

        def heldout(plan):
            return rows, local[plan.heldout]
    else:
        train_runner = runner(ws, "train")
        context = state.applied(ws.model) if state is not None else nullcontext()

        def source(chunk):
            return train_runner.rows(chunk), torch.arange(len(chunk))

        def heldout(plan):
            return train_runner.rows(plan.heldout), torch.arange(len(plan.heldout))
    plan_of, outcomes = {plan.seed: plan for plan in plans}, {}

    def outcome(seed, result):
        predictions = predict_rows(result.probe, val_rows, all_val, kind, cfg.device)
        return {"result": result, "predictions": predictions, "plan": plan_of[seed],
                "feature_mode": "cached" if cached else "streamed"}

    def stopped(seed, result):
        outcomes[seed] = outcome(seed, result)
        on_outcome(seed, outcomes[seed])

    with context:
        trained = train_seeds(
            lambda seed: new_probe(ws), plans, source, heldout,
            lambda plan, predictions: score(ws, "train", plan.heldout, predictions), train.labels, kind,
            pool_size=len(train), batch_size=cfg.batch_size, learning_rate=cfg.learning_rate,
            max_epochs=cfg.epochs, patience=cfg.patience, order_seed=cfg.data_seed, device=cfg.device,
            progress=ws.progress, on_stop=stopped if cached and on_outcome is not None else None,
            checkpoint=checkpoint)
        if not cached:
            val_rows = runner(ws, "validation").rows(all_val, ws.progress, "validation features")
    if cached and ws.features_store is not None and not cfg.keep_features:
        for split_name, kept_rows in (("train", covered), ("validation", all_val)):
            ws.features_store.remove(features_key(ws, state, split_name, kept_rows))
    for plan in plans:
        if plan.seed not in outcomes:
            outcomes[plan.seed] = outcome(plan.seed, trained[plan.seed])
    return {plan.seed: outcomes[plan.seed] for plan in plans}


def train_inside(ws: Workspace, variant: Variant, seed: int) -> dict:
    """Trainable matrices (Sec. 5.2 (4)-(5)): trained jointly with a probe inside the backbone for
    ``inloop_epochs`` on at most ``inloop_limit`` of the seed's rows at ``matrix_learning_rate``, then frozen; a
    fresh probe then trains on their features with every other row's budget, so Table 1's rows differ only in
    the matrices. ``matrices_moved``: relative Frobenius distance from the initialisation (largest layer)."""
    from .inloop import BackboneProbe, train_inloop

    cfg, kind, state, rows = ws.config, ws.spec.kind, override_for(ws, variant, seed), seed_plan(ws, seed).train
    if cfg.inloop_limit is not None and len(rows) > cfg.inloop_limit:
        rows = seeded_subset(rows, cfg.inloop_limit, 7_919 * seed + 3)
    train = split(ws, "train")
    initial = [p.detach().clone() for p in state.trainable.values()]
    set_seed(seed)
    wrapper = BackboneProbe(ws.model, new_probe(ws), kind, cfg.packed).to(cfg.device)
    with state.applied(ws.model):
        phase1 = train_inloop(wrapper, state, train.encoded, train.labels, kind, rows, seed=seed,
                              epochs=cfg.inloop_epochs, learning_rate=cfg.learning_rate, batch_size=cfg.batch_size,
                              extra_rates={"matrices": cfg.matrix_learning_rate}, device=cfg.device)
    for parameter in state.trainable_parameters():
        parameter.requires_grad_(False)
    moved = [float((p.detach().clamp_min(0) - p0.clamp_min(0)).norm() / p0.clamp_min(0).norm().clamp_min(1e-12))
             for p, p0 in zip(state.trainable.values(), initial)]
    outcome = train_frozen(ws, variant, [seed], state=state)[seed]
    return {**outcome, "matrices_moved": max(moved) if moved else 0.0, "matrix_updates": phase1.updates}


# ---------------------------------------------------------------------- 6. records
def relevant_config(ws: Workspace, variant: Variant) -> dict:
    """The settings that can change this variant's number (λ settings only for λ orders, in-loop epochs only for
    variants trained inside the backbone, what a ranking's scores are read from: its ``depends_on``), so unrelated
    changes to a grid do not invalidate finished runs."""
    cfg = asdict(ws.config)
    for key in NOT_IN_RUN_ID:
        cfg.pop(key)
    if cfg["average_limit"] is None or (matrix_type(variant.matrix_type).constants is None
                                        and not variant.needs_scores):  # λ mixes in the averages too
        cfg.pop("average_limit")  # run ids of averages over all the text stay those of before the setting
    cfg["model"] = model_id(ws.model)
    cfg["data_dir"] = data_key(ws)  # the data itself, wherever it lies
    cfg["engine"] = "packed-early-stopping-v2"
    if variant.needs_lambdas:
        cfg.update(lambda_epochs=ws.config.lambda_epochs, lambda_learning_rate=ws.config.lambda_learning_rate)
        if ws.config.lambda_seed is not None:  # one λ for every seed: other numbers than per-seed λ, other ids
            cfg.update(lambda_seed=ws.config.lambda_seed)
    if variant.needs_scores and head_ranking(variant.selection_order).depends_on is not None:
        cfg.update(head_ranking(variant.selection_order).depends_on(ws))  # e.g. the LM λ file's contents
    if not variant.frozen:
        cfg.update(inloop_epochs=ws.config.inloop_epochs, inloop_limit=ws.config.inloop_limit,
                   matrix_learning_rate=ws.config.matrix_learning_rate, inloop="train-then-probe")
    return cfg | task_provenance(ws.spec.name)


def run_id(ws: Workspace, variant: Variant, seed: int) -> str:
    return config_hash({**relevant_config(ws, variant), **asdict(variant), "seed": seed})


def record(ws: Workspace, variant: Variant, seed: int, outcome: dict, seconds: float) -> dict:
    """The record of one run from its outcome (:func:`train_frozen`, :func:`train_inside`)."""
    result, predictions, plan = outcome["result"], outcome["predictions"], outcome["plan"]
    validation = split(ws, "validation")
    examples = torch.arange(len(validation))
    if ws.spec.kind == "token":
        value, accuracy = token_metrics(ws, validation, examples, predictions)
    else:
        value = score(ws, "validation", examples, predictions)
        accuracy = float((predictions == validation.labels).float().mean()) if len(validation) else float("nan")
    identity = run_id(ws, variant, seed)
    curve_file = results.write_curve(ws.results_dir, identity, result.curve) if ws.results_dir else None
    entry = matrix_type(variant.matrix_type)
    cfg = ws.config
    return {
        "run_id": identity,
        "model": model_id(ws.model),
        "task": ws.spec.name,
        "matrix_type": variant.matrix_type,
        "matrices_from": variant.matrices_from or (ws.spec.name if entry.constants else None),
        "selection_order": variant.selection_order,
        "fraction": variant.fraction,
        "seed": seed,
        "metric": ws.spec.metric,
        "value": float(value),
        "token_accuracy" if ws.spec.kind == "token" else "accuracy": accuracy,
        "majority_baseline": float(majority_baseline(ws)),
        "majority_accuracy": majority_accuracy(ws),
        "single_class": bool(predictions.numel() > 0 and bool((predictions == predictions[0]).all())),
        "eval_size": len(validation.examples),
        "train_size": int(len(plan.train)),
        "average_limit": "all" if cfg.average_limit is None else cfg.average_limit,
        "heldout_size": int(len(plan.heldout)),
        "best_epoch": result.best_epoch,
        "epochs_run": len(result.curve),
        "updates": result.updates,
        "updates_at_best": result.updates_at_best,
        "heldout_score": result.best_score if result.best_score != float("-inf") else None,
        "feature_mode": outcome["feature_mode"],
        "matrices_moved": outcome.get("matrices_moved"),
        "matrix_updates": outcome.get("matrix_updates"),
        "peak_memory_mb": peak_memory_mb(cfg.device),
        "curve_file": curve_file,
        "config_hash": config_hash(relevant_config(ws, variant)),
        "profile": cfg.profile,
        "data_source": data_source(ws),
        "versions": package_versions(),
        "device": str(cfg.device),
        "lambda_device": lambda_device(ws, variant, seed),
        "wall_time_s": round(seconds, 3),
        **task_provenance(ws.spec.name),
        **run_provenance(cfg.device, data_files(ws, variant.matrices_from), optimizer_for(cfg.device)),
    }


def compute_records(ws: Workspace, variant: Variant, seeds, store_seeds=None, land=None) -> list[dict]:
    """Train and score ``variant`` for each seed (all seeds of a frozen, seed-independent variant in one pass);
    the records are returned, not stored. ``store_seeds``: the seeds whose rows a seed-independent variant's feature
    store covers when its seeds run in separate calls that share it (Ray units); default ``seeds``.

    ``land(record)``: called with a seed's record as soon as that seed stops early (seeds that train together on
    cached features), so that a caller can store it before the slower seeds finish. Its ``wall_time_s`` is its
    share of the time until then (elapsed / number of seeds); the seeds recorded at the end share the rest, so the
    records' times still add up to the call's."""
    seeds = list(seeds)
    started = time.time()
    landed = {}
    checkpoint = None
    if variant.frozen and not variant.backbone_per_seed(ws.config.lambda_seed):
        checkpoint = epoch_checkpoint(ws, variant, seeds)

    def before(seed):  # a seed's time in the processes that trained it before this one
        return checkpoint.seconds(seed) if checkpoint is not None else 0.0

    def on_outcome(seed, outcome):
        landed[seed] = record(ws, variant, seed, outcome, (time.time() - started) / max(len(seeds), 1) + before(seed))
        land(landed[seed])

    if not variant.frozen:
        outcomes = {seed: train_inside(ws, variant, seed) for seed in seeds}
    elif variant.backbone_per_seed(ws.config.lambda_seed):
        outcomes = {}
        for seed in seeds:
            outcomes.update(train_frozen(ws, variant, [seed]))
    else:
        outcomes = train_frozen(ws, variant, seeds, store_seeds=store_seeds,
                                on_outcome=on_outcome if land is not None else None, checkpoint=checkpoint)
    rest = [seed for seed in seeds if seed not in landed]
    spent = sum(entry["wall_time_s"] - before(seed) for seed, entry in landed.items())
    seconds = (time.time() - started - spent) / max(len(rest), 1)
    return [landed[seed] if seed in landed else record(ws, variant, seed, outcomes[seed], seconds + before(seed))
            for seed in seeds]


#: Folder of a results folder that holds the probes' training state between epochs (never committed).
CHECKPOINTS = "checkpoints"


def epoch_checkpoint(ws: Workspace, variant: Variant, seeds) -> EpochCheckpoint | None:
    """Where the probes of ``variant``'s seeds keep their state after each epoch: ``checkpoints/<run id>.pt`` in the
    results folder (None without one). A run stopped mid-training (a session's end, a killed job) goes on from
    there; a seed's file is deleted once its record is stored (:func:`drop_checkpoint`)."""
    if ws.results_dir is None:
        return None
    return EpochCheckpoint(ws.results_dir / CHECKPOINTS, {seed: run_id(ws, variant, seed) for seed in seeds})


def drop_checkpoint(results_dir, identity: str) -> None:
    """Delete a stored run's training state (:func:`epoch_checkpoint`), if any."""
    artefacts.remove(EpochCheckpoint.file(Path(results_dir) / CHECKPOINTS, identity))


def pending_seeds(ws: Workspace, variant: Variant, seeds, done, ids: dict[int, str] | None = None) -> list[int]:
    """The seeds of ``variant`` whose run id (:func:`run_id`; ``ids`` when the caller has them already, seed -> id) is
    not in ``done``, the run ids already stored: what :func:`run_variant` computes, ``papa grid --plan`` times and the
    Ray executor schedules."""
    return [seed for seed in seeds if (ids[seed] if ids is not None else run_id(ws, variant, seed)) not in done]


def run_variant(ws: Workspace, variant: Variant, seeds, compute=compute_records) -> list[dict]:
    """Probe ``variant`` for every seed not yet in the store; append and return all its records (``compute``:
    how the missing ones are computed, ``compute(ws, variant, seeds, land=...)``). A seed that stops early is
    appended at once (``land``), so a run stopped later keeps it and resumes with the others only."""
    store = ws.store
    todo = pending_seeds(ws, variant, seeds, set(store.run_ids()) if store is not None else set())
    stored = set()

    def land(entry):
        if store is not None and store.append(entry, exist_ok=True):
            stored.add(entry["seed"])
            drop_checkpoint(ws.results_dir, entry["run_id"])

    fresh = {entry["seed"]: entry for entry in compute(ws, variant, todo, land=land)} if todo else {}
    out = []
    for seed in seeds:
        if seed in stored:
            out.append(fresh[seed])
        elif seed in fresh:
            if store is not None and not store.append(fresh[seed], exist_ok=True):
                out.append(store.get(fresh[seed]["run_id"]))  # a parallel lane finished it first: theirs
                continue
            if store is not None:
                drop_checkpoint(ws.results_dir, fresh[seed]["run_id"])
            out.append(fresh[seed])
        else:
            identity = run_id(ws, variant, seed)
            drop_checkpoint(ws.results_dir, identity)  # stored by a run killed before it could delete its state
            out.append(store.get(identity))
    return out


# ---------------------------------------------------------------------- the run entry points
class TaskExperiment(Workspace):
    """All PAPA runs of one (model, task): a :class:`~papa_lib.experiments.workspace.Workspace` (loading the
    configured model, encoder or decoder LM, with :func:`~papa_lib.core.decoders.load_model` when none is given)
    whose methods run variants; the stages are this module's functions of it (:func:`split`, :func:`constants`,
    :func:`head_scores`, :func:`cached_rows`, :func:`train_frozen`, :func:`run_id`, ...), each product computed
    once (in memory, and on disk under ``results_dir``: ``matrices/``, ``lambdas/``, ``features/``)."""

    def __init__(self, config: ExperimentConfig, model=None, tokenizer=None, results_dir: str | Path | None = None,
                 progress: bool = True):
        if model is None:
            model, tokenizer = load_model(config.model, device=config.device)
        super().__init__(config, model, tokenizer, results_dir=results_dir, progress=progress)

    def compute_records(self, variant: Variant, seeds, store_seeds=None, land=None) -> list[dict]:
        """Train and score ``variant`` for each seed (:func:`papa_lib.experiments.engine.compute_records`)."""
        return compute_records(self, variant, seeds, store_seeds, land)

    def compute_record(self, variant: Variant, seed: int) -> dict:
        """One run's record (computed, not stored)."""
        return self.compute_records(variant, [seed])[0]

    def run_variant(self, variant: Variant, seeds) -> list[dict]:
        """Probe ``variant`` for every seed not yet in the store; append and return all its records."""
        return run_variant(self, variant, seeds,
                           compute=lambda ws, v, todo, land=None: self.compute_records(v, todo, land=land))

    def run(self, variant: Variant, seed: int) -> dict:
        """Probe one variant with one seed; append the record to the store (skipped if already finished)."""
        return self.run_variant(variant, [seed])[0]
