"""Training probes to convergence on frozen features, all seeds in one pass over the data (paper Sec. 3.3, App. B).

Each seed has its own training rows and a held-out slice of them (:class:`SeedPlan`). An epoch walks the task's
training pool in a seeded random order, one chunk of examples at a time; every chunk's features are produced once
(gathered from the :class:`~papa_lib.experiments.features.FeatureStore`, or computed by the backbone when streaming)
and every active seed takes the rows it owns, in batches of ``batch_size``. After each epoch every seed scores its
held-out slice; a seed stops after ``patience`` epochs without improvement (or at ``max_epochs``) and keeps its best
checkpoint. Its learning curve (epoch, updates, train loss, held-out score) goes into the record's CSV.

A seed's trajectory depends only on its own rows, its seed and the pool's order, not on which other seeds train
alongside: the order is drawn over the whole training pool, and each seed's dropout draws from its own random stream.
So cached and streamed features give the same numbers, and so does training the seeds one at a time.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from .features import RaggedRows
from .probes import IGNORE_INDEX, adamw, set_seed

#: Share of each seed's training rows held out for early stopping.
HELDOUT_FRACTION = 0.1


def heldout_split(rows: torch.Tensor, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split example indices into ``(train, heldout)`` with a seeded permutation (at least one row on each side)."""
    rows = torch.as_tensor(rows, dtype=torch.long)
    if len(rows) < 2:
        raise ValueError(f"a training set of {len(rows)} example(s) cannot spare a held-out slice")
    n_held = min(max(1, round(len(rows) * fraction)), len(rows) - 1)
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(10_007 * seed + 17))
    held = rows[order[:n_held]].sort().values
    train = rows[order[n_held:]].sort().values
    return train, held


@dataclass
class SeedPlan:
    """One seed's share of a task's training pool."""

    seed: int
    train: torch.Tensor
    heldout: torch.Tensor


@dataclass
class TrainedProbe:
    """A probe trained to its best held-out epoch, with its learning curve."""

    seed: int
    probe: torch.nn.Module
    best_epoch: int = 0
    best_score: float = float("-inf")
    best_loss: float = float("inf")
    updates: int = 0
    updates_at_best: int = 0
    curve: list[dict] = field(default_factory=list)


class _RandomStream:
    """A private torch random stream (CPU and CUDA) so a seed's dropout does not depend on other seeds' steps."""

    def __init__(self, seed: int):
        with torch.random.fork_rng(devices=range(torch.cuda.device_count()) if torch.cuda.is_available() else []):
            set_seed(seed)
            self.cpu = torch.get_rng_state()
            self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None

    @contextmanager
    def active(self):
        devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):
            torch.set_rng_state(self.cpu)
            if self.cuda is not None:
                torch.cuda.set_rng_state_all(self.cuda)
            yield
            self.cpu = torch.get_rng_state()
            if self.cuda is not None:
                self.cuda = torch.cuda.get_rng_state_all()


def probe_inputs(rows: RaggedRows, examples, kind: str, device) -> tuple:
    """A probe's positional inputs for ``examples`` of ``rows``."""
    if kind == "token":
        return (rows.token_batch(examples, device),)
    return (rows.ragged_sentences(examples, device),)


def flat_targets(labels: torch.Tensor, examples, kind: str) -> torch.Tensor:
    """Targets of ``examples``: one per example, or one per kept word (row order of :meth:`RaggedRows.token_batch`)."""
    chosen = labels[torch.as_tensor(examples, dtype=torch.long)]
    return chosen[chosen != IGNORE_INDEX] if kind == "token" else chosen


@torch.no_grad()
def evaluate_rows(probe, rows: RaggedRows, examples, kind: str, device="cpu", labels: torch.Tensor | None = None,
                  batch_size: int = 256) -> tuple[torch.Tensor, float | None]:
    """Predicted classes for ``examples`` (per example, or per kept word) and, given ``labels``, the mean loss."""
    probe.eval()
    examples = torch.as_tensor(examples, dtype=torch.long)
    predictions, loss_sum, count = [], 0.0, 0
    for i in range(0, len(examples), batch_size):
        part = examples[i : i + batch_size]
        logits = probe(*probe_inputs(rows, part, kind, device))
        predictions.append(logits.argmax(-1).cpu())
        if labels is not None:
            targets = flat_targets(labels, part, kind).to(logits.device)
            loss_sum += float(F.cross_entropy(logits, targets, reduction="sum"))
            count += int(targets.numel())
    out = torch.cat(predictions) if predictions else torch.zeros(0, dtype=torch.long)
    return out, (loss_sum / max(count, 1) if labels is not None else None)


def predict_rows(probe, rows: RaggedRows, examples, kind: str, device="cpu", batch_size: int = 256) -> torch.Tensor:
    """Predicted classes for ``examples`` (per example, or per kept word for token tasks)."""
    return evaluate_rows(probe, rows, examples, kind, device, batch_size=batch_size)[0]


def improves(score: float, loss: float | None, best: "TrainedProbe") -> bool:
    """Early-stopping rule: a higher held-out score, or the same score with a lower held-out loss (a probe still at
    the majority class, MCC 0, keeps training while its loss falls)."""
    if score > best.best_score:
        return True
    return score == best.best_score and loss is not None and loss < best.best_loss


def _local_labels(labels: torch.Tensor, examples: torch.Tensor, local: torch.Tensor, kind: str) -> torch.Tensor:
    """Labels indexed like ``local`` (the positions of ``examples`` in their feature rows)."""
    size = int(local.max()) + 1 if len(local) else 0
    out = torch.full((size, *labels.shape[1:]), IGNORE_INDEX, dtype=labels.dtype)
    out[local] = labels[examples]
    return out


def train_seeds(
    make_probe: Callable[[int], torch.nn.Module],
    plans: list[SeedPlan],
    source: Callable[[torch.Tensor], tuple[RaggedRows, torch.Tensor]],
    heldout_rows: Callable[[SeedPlan], tuple[RaggedRows, torch.Tensor]],
    score: Callable[[SeedPlan, torch.Tensor], float],
    labels: torch.Tensor,
    kind: str,
    *,
    pool_size: int,
    batch_size: int,
    learning_rate: float,
    max_epochs: int,
    patience: int,
    order_seed: int = 0,
    chunk_size: int = 4096,
    device="cpu",
    progress: bool = False,
) -> dict[int, TrainedProbe]:
    """Train one probe per :class:`SeedPlan` with early stopping, all in the same passes over the data.

    ``source(examples)`` returns the features of a chunk as ``(rows, local_index)`` (``rows`` may be a whole store,
    ``local_index`` says where each example sits in it); ``heldout_rows(plan)`` does the same for a seed's held-out
    slice; ``score(plan, predictions)`` turns held-out predictions into the task's metric (higher is better).
    """
    from tqdm.auto import tqdm

    trained, optimisers, streams, stale = {}, {}, {}, {}
    for plan in plans:
        set_seed(plan.seed)
        probe = make_probe(plan.seed).to(device)
        trained[plan.seed] = TrainedProbe(plan.seed, probe)
        optimisers[plan.seed] = adamw(probe.parameters(), learning_rate)
        streams[plan.seed] = _RandomStream(plan.seed)
        stale[plan.seed] = 0
    members = {plan.seed: torch.zeros(pool_size, dtype=torch.bool) for plan in plans}
    for plan in plans:
        members[plan.seed][plan.train] = True
    needed = torch.stack(list(members.values())).any(0)
    held = {plan.seed: heldout_rows(plan) for plan in plans}
    best_state = {}
    active = [plan for plan in plans]
    bar = tqdm(total=max_epochs, disable=not progress, desc="probe epochs", leave=False)
    for epoch in range(max_epochs):
        if not active:
            break
        order = torch.randperm(pool_size, generator=torch.Generator().manual_seed(1_000_003 * order_seed + epoch))
        losses = {plan.seed: [] for plan in active}
        for start in range(0, pool_size, chunk_size):
            chunk = order[start : start + chunk_size]
            chunk = chunk[needed[chunk] & torch.stack([members[p.seed][chunk] for p in active]).any(0)]
            if len(chunk) == 0:
                continue
            rows, local = source(chunk)
            for plan in active:
                mine = members[plan.seed][chunk].nonzero().flatten()
                probe, optimiser = trained[plan.seed].probe, optimisers[plan.seed]
                probe.train()
                with streams[plan.seed].active():
                    for i in range(0, len(mine), batch_size):
                        part = mine[i : i + batch_size]
                        targets = flat_targets(labels, chunk[part], kind).to(device)
                        if kind == "token" and targets.numel() == 0:
                            continue
                        logits = probe(*probe_inputs(rows, local[part], kind, device))
                        loss = F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX)
                        optimiser.zero_grad(set_to_none=True)
                        loss.backward()
                        optimiser.step()
                        trained[plan.seed].updates += 1
                        losses[plan.seed].append(float(loss.detach()))
        for plan in list(active):
            result = trained[plan.seed]
            rows, local = held[plan.seed]
            predictions, held_loss = evaluate_rows(result.probe, rows, local, kind, device,
                                                   labels=_local_labels(labels, plan.heldout, local, kind))
            value = float(score(plan, predictions))
            loss = sum(losses[plan.seed]) / max(len(losses[plan.seed]), 1)
            result.curve.append({"epoch": epoch + 1, "updates": result.updates, "train_loss": loss,
                                 "heldout_loss": held_loss, "heldout_score": value})
            if improves(value, held_loss, result):
                result.best_score, result.best_loss = value, held_loss
                result.best_epoch, result.updates_at_best = epoch + 1, result.updates
                best_state[plan.seed] = copy.deepcopy(result.probe.state_dict())
                stale[plan.seed] = 0
            else:
                stale[plan.seed] += 1
                if stale[plan.seed] >= patience:
                    active.remove(plan)
        bar.update(1)
    bar.close()
    for seed, result in trained.items():
        if seed in best_state:
            result.probe.load_state_dict(best_state[seed])
        result.probe.eval()
    return trained
