"""The last two stages of one (model, task) experiment, as functions of a :class:`~.workspace.Workspace`.

5. **probe**: probes of a variant trained to held-out convergence on frozen features, all seeds of a seed-independent
   variant together (:func:`train_frozen`), or trainable matrices trained inside the backbone first
   (:func:`train_inside`, Sec. 5.2); scored with the task's metric (:func:`score`);
6. **record**: one record per (variant, seed) with its run id (:func:`run_id`, :func:`record`), computed
   (:func:`compute_records`) and appended to the results store unless already there (:func:`run_variant`).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path

import torch

from ..core import artefacts
from ..core.models import model_id
from ..core.override import AttentionOverride
from . import metrics, probes, results
from .features import on_device
from .loop import EpochCheckpoint, optimizer_for
from .matrices import matrix_type
from .overrides import cached_rows, features_key, override_for, runner, use_cache
from .provenance import run_provenance
from .rankings import head_ranking
from .stages import data_files, data_key, data_source, new_probe, seed_plan, split, store_rows
from .training import predict_rows, train_seeds
from .variants import Variant
from .workspace import NOT_IN_RUN_ID, EncodedSplit, Workspace, peak_memory_mb, task_provenance


# ---------------------------------------------------------------------- stage 5: probes
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
    kept = labels != probes.IGNORE_INDEX
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
    labels = labels[labels != probes.IGNORE_INDEX]
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
        pick = torch.randperm(len(rows), generator=torch.Generator().manual_seed(7_919 * seed + 3))
        rows = rows[pick[: cfg.inloop_limit]].sort().values
    train = split(ws, "train")
    initial = [p.detach().clone() for p in state.trainable.values()]
    probes.set_seed(seed)
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


# ---------------------------------------------------------------------- stage 6: records
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
    return results.config_hash({**relevant_config(ws, variant), **asdict(variant), "seed": seed})


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
        "config_hash": results.config_hash(relevant_config(ws, variant)),
        "profile": cfg.profile,
        "data_source": data_source(ws),
        "versions": results.package_versions(),
        "device": str(cfg.device),
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
