"""The one probe training loop (paper Sec. 3.3, App. B): AdamW at a constant rate, epochs of steps, per-member early
stopping, several models trained together.

Every probe of the library trains here (:func:`fit`): the probes on frozen features of all seeds of a variant
(:func:`papa_lib.experiments.training.train_seeds`), probes trained inside the backbone with λ or trainable
matrices (:mod:`papa_lib.experiments.inloop`), the MLM probe and MLM λ (:mod:`papa_lib.analysis.mlm`), and the
plain loop of :func:`papa_lib.experiments.probes.train_probe`. What differs between them are hooks:

* a **member** (:class:`Member`) is one model with its own parameter groups (the probe's, plus θ or trainable
  matrices with their own learning rates), its own random stream for dropout (or the global one), and a
  :class:`TrainedProbe` that collects its learning curve;
* ``steps(epoch, active)`` yields the training steps of an epoch; a step is a list of ``(member, inputs, targets)``,
  at most one batch per member;
* ``evaluate(member, epoch)`` (optional) scores a member's held-out slice after each epoch: ``(score, loss)``; a
  member stops after ``patience`` epochs without improvement (:func:`improves`) and keeps its best state
  (``Member.snapshot`` / ``Member.restore``);
* ``on_stop(member)`` (optional) is called as soon as a member stops early, already restored to its best epoch and
  in ``eval()`` mode: its result is final then, so a caller can record it before the others finish (a run killed
  later keeps it);
* ``checkpoint`` (optional, :class:`EpochCheckpoint`) saves each member's whole training state after every epoch
  (weights, AdamW moments, random stream, best snapshot, curve, early-stopping count), one file per member, and
  brings it back at the start: a run stopped mid-training goes on from its last finished epoch, to the numbers it
  would have reached unstopped (a member restored at epoch k sits out the epochs before k while the others catch up).

Members that step together share one backward pass and one AdamW call (PyTorch's fused kernel updates each tensor
on its own, and a parameter without a gradient is skipped, step count included). A member that has no batch in a
step, or that has stopped, is not touched. So a member's trajectory is bit for bit the one it has when it trains
alone: same initialisation, same batches in the same order, same dropout draws, same early stopping
(``tests/test_training.py`` checks ``torch.equal`` for sentence and token probes).
"""

from __future__ import annotations

import copy
import pickle
import random
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.artefacts import read_or_heal, set_aside, write_atomic

__all__ = [
    "IGNORE_INDEX",
    "EpochCheckpoint",
    "Member",
    "RandomStream",
    "TrainedProbe",
    "adamw",
    "default_loss",
    "fit",
    "improves",
    "optimizer_name",
]

#: Target value ignored by the loss (Hugging Face convention).
IGNORE_INDEX = -100


def adamw(params, lr: float, weight_decay: float = 0.0, betas=(0.9, 0.999), eps: float = 1e-8
          ) -> torch.optim.AdamW:
    """AdamW (paper App. B: the probes' optimiser) over ``params`` (tensors or parameter groups), with PyTorch's
    fused kernel when every parameter lives on a device that has one (CPU, CUDA).

    The fused kernel applies the same update rule in one pass over the weights instead of about ten: on a 2-core
    AMD EPYC a step over a probe's 1.03 M weights takes 0.55 ms instead of 6.2 ms (one thread), which is half of a
    token probe's step at Table 3's batch of 8 sentences. After 300 steps its weights equal the default
    implementation's to 1e-8 (float rounding).
    """
    params = list(params)
    tensors = [t for group in params for t in (group["params"] if isinstance(group, dict) else [group])]
    fused = bool(tensors) and all(t.device.type in ("cpu", "cuda") and t.is_floating_point() for t in tensors)
    return torch.optim.AdamW(params, lr=float(lr), betas=betas, eps=eps, weight_decay=float(weight_decay),
                             fused=True if fused else None)


def optimizer_name(optimizer: torch.optim.Optimizer) -> str:
    """How ``optimizer`` updates, for a record's provenance: e.g. ``torch.optim.AdamW(fused=True)``."""
    defaults = optimizer.defaults
    flags = [f"{key}={defaults[key]}" for key in ("fused", "foreach") if defaults.get(key) is not None]
    return f"torch.optim.{type(optimizer).__name__}({', '.join(flags)})"


def optimizer_for(device="cpu") -> str:
    """What :func:`adamw` builds for parameters on ``device`` (records' ``optimizer`` column)."""
    return optimizer_name(adamw([torch.zeros(1, device=device, requires_grad=True)], 1e-3))


@dataclass
class TrainedProbe:
    """A model trained to its best held-out epoch, with its learning curve."""

    seed: int
    probe: nn.Module
    best_epoch: int = 0
    best_score: float = float("-inf")
    best_loss: float = float("inf")
    updates: int = 0
    updates_at_best: int = 0
    curve: list[dict] = field(default_factory=list)


def set_seed(seed: int) -> None:
    """Seed Python's ``random``, NumPy and torch (and every CUDA device when CUDA is available)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    seed = int(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


class RandomStream:
    """A private torch random stream (CPU and CUDA) so a model's dropout does not depend on other models' steps."""

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


@dataclass
class Member:
    """One model trained by :func:`fit`.

    ``module(*inputs)`` gives logits; ``groups`` are its AdamW parameter groups (a group without ``lr`` takes the
    loop's rate); ``stream`` its dropout's random stream (``None``: the global generator); ``snapshot()`` /
    ``restore(state)`` save and bring back its best epoch (default: ``module``'s state dict).
    """

    seed: int
    module: nn.Module
    groups: list[dict]
    stream: RandomStream | None = None
    snapshot: Callable[[], Any] | None = None
    restore: Callable[[Any], None] | None = None
    result: TrainedProbe | None = None
    stale: int = 0
    stopped: bool = False
    best: Any = None
    losses: list[float] = field(default_factory=list)
    epoch_losses: list[list[float]] = field(default_factory=list)
    epochs_done: int = 0

    def __post_init__(self):
        if self.result is None:
            self.result = TrainedProbe(self.seed, self.module)
        if self.snapshot is None:
            self.snapshot = lambda: copy.deepcopy(self.module.state_dict())
        if self.restore is None:
            self.restore = self.module.load_state_dict

    def random(self):
        return self.stream.active() if self.stream is not None else nullcontext()


class EpochCheckpoint:
    """Each member's training state after its last finished epoch, in ``folder/<name>.pt`` (``names``: member seed
    -> file stem, e.g. the run id), written atomically with a checksum (:func:`~papa_lib.core.artefacts.write_atomic`).

    :func:`fit` calls :meth:`restore` before its first epoch and :meth:`save` after each; whoever stores a member's
    result deletes its file (:meth:`file`, :func:`~papa_lib.core.artefacts.remove`). ``seconds(seed)``: the wall time
    a member's earlier processes had spent (their share of it), so that a record's time covers every process that
    trained it.
    """

    def __init__(self, folder: str | Path, names: dict[int, str]):
        self.folder, self.names = Path(folder), dict(names)
        self.opened = time.time()
        self.prior: dict[int, float] = {}
        self._members = 1

    @staticmethod
    def file(folder: str | Path, name: str) -> Path:
        """The file of the member named ``name`` in ``folder``."""
        return Path(folder) / f"{name}.pt"

    def path(self, seed: int) -> Path:
        return self.file(self.folder, self.names[seed])

    def saved_epochs(self, seed: int) -> int:
        """How many epochs the member's saved state holds (0 when there is none, or it is not that member's): what a
        resumed run skips. Read only, the weights mapped and never loaded (``papa grid --plan``)."""
        try:
            state = torch.load(self.path(seed), weights_only=True, mmap=True, map_location="cpu")
        except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError):  # absent or damaged (set aside)
            return 0
        return 0 if _foreign(state, self.names[seed]) is not None else int(state["epochs"])

    def seconds(self, seed: int) -> float:
        return self.prior.get(seed, 0.0)

    def restore(self, members: list[Member], optimizer: torch.optim.Optimizer) -> int:
        """Bring back every member that has a whole file; the first epoch still to run (the smallest restored)."""
        self._members = max(len(members), 1)
        for member in members:
            path = self.path(member.seed)
            state = read_or_heal(path, lambda path: torch.load(path, weights_only=True))
            if state is None:
                continue
            why = _misfit(state, member, self.names[member.seed])
            if why is not None:  # another run's or another version's state: train this member from the start
                set_aside(path, why)
                continue
            member.module.load_state_dict(state["module"])
            for param, saved in zip(_params(member), state["optimizer"]):
                if saved:
                    optimizer.state[param] = dict(saved)
            if member.stream is not None and state["stream"] is not None:
                member.stream.cpu, member.stream.cuda = state["stream"]
            elif state["global_rng"] is not None:
                torch.set_rng_state(state["global_rng"])
            for key, value in state["result"].items():
                setattr(member.result, key, value)
            member.stale, member.stopped, member.best = state["stale"], state["stopped"], state["best"]
            member.epoch_losses, member.epochs_done = state["epoch_losses"], state["epochs"]
            self.prior[member.seed] = state["seconds"]
        return min((m.epochs_done for m in members if not m.stopped), default=0)

    def save(self, members: list[Member], optimizer: torch.optim.Optimizer) -> None:
        """Write the state of ``members`` (those that have just finished an epoch)."""
        share = (time.time() - self.opened) / self._members
        for member in members:
            result = member.result
            state = {
                "name": self.names[member.seed],
                "epochs": member.epochs_done,
                "module": member.module.state_dict(),
                "optimizer": [dict(optimizer.state.get(param, {})) for param in _params(member)],
                "stream": None if member.stream is None else [member.stream.cpu, member.stream.cuda],
                "global_rng": torch.get_rng_state() if member.stream is None else None,
                "result": {key: getattr(result, key) for key in
                           ("best_epoch", "best_score", "best_loss", "updates", "updates_at_best", "curve")},
                "stale": member.stale, "stopped": member.stopped, "best": member.best,
                "epoch_losses": member.epoch_losses,
                "seconds": self.prior.get(member.seed, 0.0) + share,
            }
            write_atomic(self.path(member.seed), lambda tmp, state=state: torch.save(state, tmp))


def _params(member: Member) -> list[Tensor]:
    return [param for group in member.groups for param in group["params"]]


_STATE_KEYS = {"name", "epochs", "module", "optimizer", "stream", "global_rng", "result", "stale", "stopped", "best",
               "epoch_losses", "seconds"}


def _foreign(state: Any, name: str) -> str | None:
    """Why a saved state is not the training state named ``name`` of this version (None when it is)."""
    if not isinstance(state, dict) or not _STATE_KEYS <= set(state):
        return "it is not a training state of this version of papa_lib"
    if state["name"] != name:
        return f"it holds run {state['name']}, not {name}"
    return None


def _misfit(state: Any, member: Member, name: str) -> str | None:
    """Why a saved state cannot be ``member``'s (None when it can): checked before anything is applied."""
    foreign = _foreign(state, name)
    if foreign is not None:
        return foreign
    mine = member.module.state_dict()
    saved = state["module"]
    if set(saved) != set(mine) or any(tuple(saved[k].shape) != tuple(mine[k].shape) for k in mine):
        return "its weights do not fit the probe"
    if len(state["optimizer"]) != len(_params(member)):
        return "its optimiser state does not fit the probe"
    return None


def improves(score: float, loss: float | None, best: TrainedProbe) -> bool:
    """Early-stopping rule: a higher held-out score, or the same score with a lower held-out loss (a probe still at
    the majority class, MCC 0, keeps training while its loss falls)."""
    if score > best.best_score:
        return True
    return score == best.best_score and loss is not None and loss < best.best_loss


def default_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Cross entropy over the last logits dimension, ignoring targets equal to ``IGNORE_INDEX``."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1).long(), ignore_index=IGNORE_INDEX)


def to_device(value: Any, device) -> Any:
    if isinstance(value, Tensor):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(to_device(v, device) for v in value)
    return value


def as_inputs(inputs: Any) -> tuple:
    """A module's positional inputs: a tuple/list as is, a single tensor wrapped in a 1-tuple."""
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs)
    return (inputs,)


def fit(
    members: list[Member],
    steps: Callable[[int, list[Member]], Iterable[list[tuple[Member, Any, Tensor]]]],
    *,
    epochs: int,
    learning_rate: float,
    weight_decay: float = 0.0,
    evaluate: Callable[[Member, int], tuple[float, float | None]] | None = None,
    patience: int | None = None,
    loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
    device="cpu",
    progress: bool | str = False,
    on_stop: Callable[[Member], None] | None = None,
    checkpoint: EpochCheckpoint | None = None,
) -> list[Member]:
    """Train ``members`` together for up to ``epochs`` (see the module docstring); returns them, each in ``eval()``
    mode, restored to its best held-out epoch when ``evaluate`` is given.

    Each epoch appends one entry to every active member's ``result.curve``: ``epoch``, ``updates``, ``train_loss``
    (mean of the epoch's per-batch losses; 0 without batches; ``losses`` keeps them) and, with ``evaluate``,
    ``heldout_loss`` and ``heldout_score``. A batch whose targets are all ``IGNORE_INDEX`` is skipped (default loss).
    """
    if isinstance(epochs, bool) or not isinstance(epochs, (int, np.integer)) or epochs < 0:
        raise ValueError(f"epochs must be a non-negative integer, got {epochs!r}")
    if not (float(learning_rate) > 0.0):
        raise ValueError(f"lr must be positive, got {learning_rate!r}")
    if not (float(weight_decay) >= 0.0):
        raise ValueError(f"weight_decay must be non-negative, got {weight_decay!r}")
    groups = [group for member in members for group in member.groups if group["params"]]
    if not groups:
        raise ValueError("params is empty: nothing to optimise")
    skip_empty = loss_fn is None
    loss_fn = default_loss if loss_fn is None else loss_fn
    optimizer = adamw(groups, learning_rate, weight_decay=weight_decay)
    from tqdm.auto import tqdm

    bar = tqdm(total=int(epochs), disable=not progress, leave=False,
               desc=progress if isinstance(progress, str) else "probe epochs")
    taken_steps = 0  # optimizer steps, shown beside the epoch bar
    start = checkpoint.restore(members, optimizer) if checkpoint is not None else 0
    bar.update(min(start, int(epochs)))
    if on_stop is not None:  # restored stopped but not yet handed up (saved after its last epoch, before on_stop)
        for member in members:
            if member.stopped and member.epochs_done:
                _restore_best(member)
                on_stop(member)
    try:
        for epoch in range(start, int(epochs)):
            if all(member.stopped for member in members):
                break
            active = [member for member in members if not member.stopped and member.epochs_done <= epoch]
            if not active:  # restored members ahead of this epoch wait for the others
                bar.update(1)
                continue
            for member in active:
                member.module.train()
                member.losses = []
            for step in steps(epoch, active):
                taken = []
                for member, inputs, targets in step:
                    targets = targets.to(device)
                    if skip_empty and not bool((targets != IGNORE_INDEX).any()):
                        continue  # every target ignored: the loss would be NaN
                    with member.random():
                        logits = member.module(*to_device(as_inputs(inputs), device))
                    taken.append((member, loss_fn(logits, targets)))
                if not taken:
                    continue
                optimizer.zero_grad(set_to_none=True)
                total = taken[0][1] if len(taken) == 1 else torch.stack([loss for _, loss in taken]).sum()
                total.backward()
                optimizer.step()
                for member, loss in taken:
                    member.result.updates += 1
                    member.losses.append(float(loss.detach()))
                taken_steps += 1
                if progress and taken_steps % 20 == 0:  # a long epoch shows that it moves
                    bar.set_postfix_str(f"{taken_steps} steps", refresh=True)
            for member in active:
                _end_epoch(member, epoch, evaluate, patience)
                member.epochs_done = epoch + 1
                if member.stopped and on_stop is not None:  # frozen from now on: its result is final
                    _restore_best(member)
            if checkpoint is not None:
                checkpoint.save(active, optimizer)
            if on_stop is not None:
                for member in active:
                    if member.stopped:
                        on_stop(member)
            bar.update(1)
    finally:
        bar.close()
        for member in members:
            if member.best is not None:
                _restore_best(member)
            elif evaluate is None:
                member.result.best_epoch = len(member.result.curve)
                member.result.updates_at_best = member.result.updates
            member.module.eval()
    return members


def _restore_best(member: Member) -> None:
    """Bring ``member`` back to its best epoch (once) and put it in ``eval()`` mode."""
    if member.best is not None:
        member.restore(member.best)
        member.best = None
    member.module.eval()


def _end_epoch(member: Member, epoch: int, evaluate, patience) -> None:
    """One member's curve entry and early-stopping decision after ``epoch``."""
    result = member.result
    member.epoch_losses.append(member.losses)
    entry = {"epoch": epoch + 1, "updates": result.updates,
             "train_loss": sum(member.losses) / max(len(member.losses), 1)}
    if evaluate is not None:
        value, held_loss = evaluate(member, epoch)
        value = float(value)
        entry.update(heldout_loss=held_loss, heldout_score=value)
        if improves(value, held_loss, result):
            result.best_score, result.best_loss = value, held_loss
            result.best_epoch, result.updates_at_best = epoch + 1, result.updates
            member.best = member.snapshot()
            member.stale = 0
        else:
            member.stale += 1
            if patience is not None and member.stale >= patience:
                member.stopped = True
    result.curve.append(entry)
