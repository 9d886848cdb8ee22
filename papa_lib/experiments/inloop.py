"""Training inside the backbone: λ mixing (paper Sec. 3.2, Eq. 3) and trainable matrices (Sec. 5.2 (4)-(5)).

The backbone stays frozen and in eval mode; what trains is the probe plus the override's own parameters (θ, with
λ = σ(θ), or the trainable matrices). Every step runs the backbone on a packed batch (real tokens only, App. A
positions) under the override. With a held-out slice, training stops after ``patience`` epochs without improvement
and restores the best probe and override parameters — the same budget as the probes on frozen features.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ..core.packing import layout_position_ids, pack, supports_packing
from .features import select_rows
from .probes import IGNORE_INDEX, adamw
from .training import TrainedProbe, _RandomStream, flat_targets, improves


class BackboneProbe(nn.Module):
    """A probe on a frozen backbone that runs at every step. ``train()`` switches the probe only."""

    def __init__(self, model, probe: nn.Module, kind: str, use_packing: bool = True):
        super().__init__()
        self.backbone, self.probe, self.kind = model, probe, kind
        self.use_packing = bool(use_packing) and supports_packing(model)

    def train(self, mode: bool = True):
        self.training = mode
        self.probe.train(mode)
        self.backbone.eval()
        return self

    def forward(self, part) -> torch.Tensor:
        """Logits for an :class:`~papa_lib.core.layout.EncodedBatch` (per example, or per kept word)."""
        device = next(self.probe.parameters()).device
        if self.use_packing:
            inputs = pack(part, model=self.backbone)
            real, positions, word_index = inputs.real, inputs.positions, inputs.word_index
        else:
            inputs, real, word_index = dict(part), part["attention_mask"].bool(), part.word_index
            position_ids = layout_position_ids(part, self.backbone)
            if position_ids is not None:
                inputs["position_ids"] = position_ids
            positions = torch.arange(part.max_length).expand_as(real)
        from ..core.models import adapter_for

        uses_types = adapter_for(self.backbone).uses_token_type_ids
        feed = {k: v.to(device) for k, v in inputs.items() if v is not None and (uses_types or k != "token_type_ids")}
        hidden = torch.stack(self.backbone(**feed, output_hidden_states=True).hidden_states, dim=1)  # [B, n, W, D]
        if self.kind == "token":
            keep = word_index >= 0
            rows = torch.arange(hidden.shape[0])[:, None].expand_as(word_index)
            return self.probe(hidden.permute(0, 2, 1, 3)[rows[keep], word_index[keep].to(hidden.device)])
        return self.probe(hidden, real.long().to(device), positions.clamp_min(0).to(device))


def _batches(encoded, rows: torch.Tensor, batch_size: int, seed: int, epoch: int):
    order = rows[torch.randperm(len(rows), generator=torch.Generator().manual_seed(100_003 * seed + epoch))]
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def _masked_part(encoded, labels, examples, kind):
    part = select_rows(encoded, examples)
    if kind == "token":
        part.word_index[labels[examples][:, : part.word_index.shape[1]] == IGNORE_INDEX] = -1
    return part


@torch.no_grad()
def predict_inloop(wrapper: BackboneProbe, encoded, labels, examples, kind: str, batch_size: int = 64,
                   with_loss: bool = False):
    """Predictions for ``examples`` (per example, or per kept word); with ``with_loss`` also the mean loss."""
    wrapper.eval()
    examples = torch.as_tensor(examples, dtype=torch.long)
    predictions, loss_sum, count = [], 0.0, 0
    for i in range(0, len(examples), batch_size):
        part = examples[i : i + batch_size]
        logits = wrapper(_masked_part(encoded, labels, part, kind))
        predictions.append(logits.argmax(-1).cpu())
        if with_loss:
            targets = flat_targets(labels, part, kind).to(logits.device)
            loss_sum += float(F.cross_entropy(logits, targets, reduction="sum"))
            count += int(targets.numel())
    out = torch.cat(predictions) if predictions else torch.zeros(0, dtype=torch.long)
    return (out, loss_sum / max(count, 1)) if with_loss else out


def train_inloop(wrapper: BackboneProbe, state, encoded, labels, kind: str, train_rows, *, seed: int, epochs: int,
                 learning_rate: float, batch_size: int, extra_rates: dict | None = None, heldout_rows=None,
                 score=None, patience: int | None = None, device="cpu") -> TrainedProbe:
    """Train ``wrapper``'s probe and ``state``'s trainable parameters for up to ``epochs``; with ``heldout_rows``
    and ``score(predictions)``, stop early and restore the best epoch. ``extra_rates`` maps an override parameter
    group (``"theta"``, ``"matrices"``) to its own learning rate."""
    extra_rates = extra_rates or {}
    groups = [{"params": list(wrapper.probe.parameters())}]
    if state is not None:
        theta = [p for p in state.trainable_parameters() if p is state.theta]
        matrices = [p for p in state.trainable_parameters() if p is not state.theta]
        if theta:
            groups.append({"params": theta, **({"lr": extra_rates["theta"]} if "theta" in extra_rates else {})})
        if matrices:
            groups.append({"params": matrices, **({"lr": extra_rates["matrices"]} if "matrices" in extra_rates else {})})
    optimiser = adamw(groups, learning_rate)
    stream = _RandomStream(seed)
    result = TrainedProbe(seed, wrapper.probe)
    best, stale = None, 0
    train_rows = torch.as_tensor(train_rows, dtype=torch.long)
    for epoch in range(epochs):
        wrapper.train()
        losses = []
        with stream.active():
            for part_rows in _batches(encoded, train_rows, batch_size, seed, epoch):
                targets = flat_targets(labels, part_rows, kind).to(device)
                if targets.numel() == 0:
                    continue
                logits = wrapper(_masked_part(encoded, labels, part_rows, kind))
                loss = F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX)
                optimiser.zero_grad(set_to_none=True)
                loss.backward()
                optimiser.step()
                result.updates += 1
                losses.append(float(loss.detach()))
        entry = {"epoch": epoch + 1, "updates": result.updates, "train_loss": sum(losses) / max(len(losses), 1)}
        if heldout_rows is not None:
            predictions, held_loss = predict_inloop(wrapper, encoded, labels, heldout_rows, kind, with_loss=True)
            value = float(score(predictions))
            entry.update(heldout_loss=held_loss, heldout_score=value)
            if improves(value, held_loss, result):
                result.best_score, result.best_loss = value, held_loss
                result.best_epoch, result.updates_at_best = epoch + 1, result.updates
                best = (copy.deepcopy(wrapper.probe.state_dict()),
                        copy.deepcopy(state.state_dict()) if state is not None else None)
                stale = 0
            else:
                stale += 1
        result.curve.append(entry)
        if patience is not None and heldout_rows is not None and stale >= patience:
            break
    if best is not None:
        wrapper.probe.load_state_dict(best[0])
        if state is not None:
            state.load_state_dict(best[1])
    else:
        result.best_epoch, result.updates_at_best = len(result.curve), result.updates
    wrapper.eval()
    return result

