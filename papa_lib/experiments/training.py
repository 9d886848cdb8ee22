"""Training probes to convergence on frozen features, all seeds in one pass over the data (paper Sec. 3.3, App. B).

Each seed has its own training rows and a held-out slice of them (:class:`SeedPlan`). An epoch walks the task's
training pool in a seeded random order, one chunk of examples at a time; every chunk's features are produced once
(gathered from the :class:`~papa_lib.experiments.features.FeatureStore`, or computed by the backbone when streaming)
and every active seed takes the rows it owns, in batches of ``batch_size``. After each epoch every seed scores its
held-out slice; a seed stops after ``patience`` epochs without improvement (or at ``max_epochs``) and keeps its best
checkpoint. Its learning curve (epoch, updates, train loss, held-out score) goes into the record's CSV.

The seeds train together in the library's one loop (:func:`papa_lib.experiments.loop.fit`): the i-th batch of every
active seed in one step, one backward pass and one AdamW call for all of them; a seed that has stopped is frozen.
A seed's trajectory depends only on its own rows, its seed and the pool's order, not on which other seeds train
alongside: the order is drawn over the whole training pool, and each seed's dropout draws from its own random stream.
So cached and streamed features give the same numbers, and so does training the seeds one at a time (bit for bit,
``tests/test_training.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .features import RaggedRows
from .loop import IGNORE_INDEX, EpochCheckpoint, Member, RandomStream, TrainedProbe, fit, set_seed

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
def batched_predictions(logits_of: Callable[[torch.Tensor], torch.Tensor], examples, kind: str, batch_size: int,
                        labels: torch.Tensor | None = None) -> tuple[torch.Tensor, float | None]:
    """Predicted classes (argmax of ``logits_of(part)``, batch by batch of ``examples``) and, given ``labels``, the
    mean cross-entropy over every target (:func:`flat_targets`: per example, or per kept word); else None."""
    examples = torch.as_tensor(examples, dtype=torch.long)
    predictions, loss_sum, count = [], 0.0, 0
    for i in range(0, len(examples), batch_size):
        part = examples[i : i + batch_size]
        logits = logits_of(part)
        predictions.append(logits.argmax(-1).cpu())
        if labels is not None:
            targets = flat_targets(labels, part, kind).to(logits.device)
            loss_sum += float(F.cross_entropy(logits, targets, reduction="sum"))
            count += int(targets.numel())
    out = torch.cat(predictions) if predictions else torch.zeros(0, dtype=torch.long)
    return out, (loss_sum / max(count, 1) if labels is not None else None)


@torch.no_grad()
def evaluate_rows(probe, rows: RaggedRows, examples, kind: str, device="cpu", labels: torch.Tensor | None = None,
                  batch_size: int = 256) -> tuple[torch.Tensor, float | None]:
    """Predicted classes for ``examples`` (per example, or per kept word) and, given ``labels``, the mean loss."""
    probe.eval()
    return batched_predictions(lambda part: probe(*probe_inputs(rows, part, kind, device)), examples, kind,
                               batch_size, labels)


def predict_rows(probe, rows: RaggedRows, examples, kind: str, device="cpu", batch_size: int = 256) -> torch.Tensor:
    """Predicted classes for ``examples`` (per example, or per kept word for token tasks)."""
    return evaluate_rows(probe, rows, examples, kind, device, batch_size=batch_size)[0]


def _local_labels(labels: torch.Tensor, examples: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
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
    batched: bool = True,
    on_stop: Callable[[int, TrainedProbe], None] | None = None,
    checkpoint: EpochCheckpoint | None = None,
) -> dict[int, TrainedProbe]:
    """Train one probe per :class:`SeedPlan` with early stopping, all in the same passes over the data.

    ``source(examples)`` returns the features of a chunk as ``(rows, local_index)`` (``rows`` may be a whole store,
    ``local_index`` says where each example sits in it); ``heldout_rows(plan)`` does the same for a seed's held-out
    slice; ``score(plan, predictions)`` turns held-out predictions into the task's metric (higher is better).

    ``batched`` (default): the seeds step together, the i-th batch of every seed in one backward pass and one AdamW
    call (:func:`papa_lib.experiments.loop.fit`); otherwise each seed takes all its batches of a chunk in turn. Both
    give the same probes bit for bit.

    ``on_stop(seed, result)``: called as soon as a seed stops early, its probe already at its best epoch (final: a
    stopped seed is frozen), so that its record can land before the slower seeds finish.
    """
    members = []
    for plan in plans:
        set_seed(plan.seed)
        probe = make_probe(plan.seed).to(device)
        members.append(Member(plan.seed, probe, [{"params": list(probe.parameters())}], RandomStream(plan.seed)))
    owned = {plan.seed: torch.zeros(pool_size, dtype=torch.bool) for plan in plans}
    for plan in plans:
        owned[plan.seed][plan.train] = True
    needed = torch.stack(list(owned.values())).any(0)
    held = {plan.seed: heldout_rows(plan) for plan in plans}
    plan_of = {plan.seed: plan for plan in plans}

    def member_batches(member, rows, local, chunk):
        mine = owned[member.seed][chunk].nonzero().flatten()
        for i in range(0, len(mine), batch_size):
            part = mine[i : i + batch_size]
            targets = flat_targets(labels, chunk[part], kind)
            if kind == "token" and targets.numel() == 0:
                continue
            yield member, probe_inputs(rows, local[part], kind, device), targets

    def steps(epoch, active):
        order = torch.randperm(pool_size, generator=torch.Generator().manual_seed(1_000_003 * order_seed + epoch))
        for start in range(0, pool_size, chunk_size):
            chunk = order[start : start + chunk_size]
            chunk = chunk[needed[chunk] & torch.stack([owned[m.seed][chunk] for m in active]).any(0)]
            if len(chunk) == 0:
                continue
            rows, local = source(chunk)
            if batched:
                lanes = [member_batches(m, rows, local, chunk) for m in active]
                while lanes:
                    step = []
                    for lane in list(lanes):
                        taken = next(lane, None)
                        if taken is None:
                            lanes.remove(lane)
                        else:
                            step.append(taken)
                    if step:
                        yield step
            else:
                for member in active:
                    for taken in member_batches(member, rows, local, chunk):
                        yield [taken]

    def evaluate(member, epoch):
        plan = plan_of[member.seed]
        rows, local = held[member.seed]
        predictions, held_loss = evaluate_rows(member.module, rows, local, kind, device,
                                               labels=_local_labels(labels, plan.heldout, local))
        return float(score(plan, predictions)), held_loss

    fit(members, steps, epochs=max_epochs, learning_rate=learning_rate, evaluate=evaluate, patience=patience,
        device=device, progress=progress, checkpoint=checkpoint,
        on_stop=None if on_stop is None else (lambda member: on_stop(member.seed, member.result)))
    return {member.seed: member.result for member in members}
