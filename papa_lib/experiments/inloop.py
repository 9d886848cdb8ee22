"""Training inside the backbone: λ mixing (paper Sec. 3.2, Eq. 3) and trainable matrices (Sec. 5.2 (4)-(5)).

The backbone stays frozen and in eval mode; what trains is the probe plus the override's own parameters (θ, with
λ = σ(θ), or the trainable matrices). Every step runs the backbone on a packed batch (real tokens only, App. A
positions; a padded one where the model cannot pack, e.g. a decoder LM, whose bare decoder runs without its LM head)
under the override. With a held-out slice, training stops after ``patience`` epochs without improvement
and restores the best probe and override parameters — the same budget as the probes on frozen features.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ..core.models import adapter_for, frozen_parameters, model_inputs, run_backbone
from ..core.packing import supports_packing
from .features import backbone_batch, decoder_features, masked_rows, word_rows
from .loop import Member, RandomStream, TrainedProbe, fit
from .training import batched_predictions, flat_targets


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
        inputs, real, positions, word_index = backbone_batch(part, self.backbone, self.use_packing)
        feed = model_inputs(self.backbone, inputs)  # App. A position ids, packed or padded
        outputs = run_backbone(self.backbone, feed, output_hidden_states=True)  # a decoder LM: its bare decoder
        hidden = torch.stack(outputs.hidden_states, dim=1)  # [B, n, W, D]
        if adapter_for(self.backbone).causal:  # a decoder's probe features (decision rule R14), as the frozen runs'
            hidden = decoder_features(hidden)
        if self.kind == "token":
            return self.probe(word_rows(hidden.permute(0, 2, 1, 3), word_index))
        return self.probe(hidden, real.long().to(device), positions.clamp_min(0).to(device))


def _batches(rows: torch.Tensor, batch_size: int, seed: int, epoch: int):
    order = rows[torch.randperm(len(rows), generator=torch.Generator().manual_seed(100_003 * seed + epoch))]
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


@torch.no_grad()
def predict_inloop(wrapper: BackboneProbe, encoded, labels, examples, kind: str, batch_size: int = 64,
                   with_loss: bool = False):
    """Predictions for ``examples`` (per example, or per kept word); with ``with_loss`` also the mean loss."""
    wrapper.eval()
    predictions, loss = batched_predictions(lambda part: wrapper(masked_rows(encoded, labels, part, kind)), examples,
                                            kind, batch_size, labels if with_loss else None)
    return (predictions, loss) if with_loss else predictions


def inloop_batches(encoded, labels, kind: str, train_rows, batch_size: int, seed: int):
    """``batches_fn(epoch)`` for a :class:`BackboneProbe`: ``seed``'s rows in a seeded order per epoch, as
    ``((encoded part,), targets)``; batches without a kept word are left out."""
    train_rows = torch.as_tensor(train_rows, dtype=torch.long)

    def batches(epoch):
        for part_rows in _batches(train_rows, batch_size, seed, epoch):
            targets = flat_targets(labels, part_rows, kind)
            if targets.numel():
                yield (masked_rows(encoded, labels, part_rows, kind),), targets

    return batches


def override_groups(state, extra_rates: dict | None = None) -> list[dict]:
    """AdamW groups of an override's trainable parameters: θ (λ = σ(θ)) and trainable matrices, each at its own rate
    when ``extra_rates`` names one (``"theta"``, ``"matrices"``), else at the loop's."""
    extra_rates = extra_rates or {}
    if state is None:
        return []
    groups = []
    theta = [p for p in state.trainable_parameters() if p is state.theta]
    matrices = [p for p in state.trainable_parameters() if p is not state.theta]
    if theta:
        groups.append({"params": theta, **({"lr": extra_rates["theta"]} if "theta" in extra_rates else {})})
    if matrices:
        groups.append({"params": matrices, **({"lr": extra_rates["matrices"]} if "matrices" in extra_rates else {})})
    return groups


def train_inloop(wrapper: BackboneProbe, state, encoded, labels, kind: str, train_rows, *, seed: int, epochs: int,
                 learning_rate: float, batch_size: int, extra_rates: dict | None = None, heldout_rows=None,
                 score=None, patience: int | None = None, device="cpu") -> TrainedProbe:
    """Train ``wrapper``'s probe and ``state``'s trainable parameters for up to ``epochs``; with ``heldout_rows``
    and ``score(predictions)``, stop early and restore the best epoch. ``extra_rates`` maps an override parameter
    group (``"theta"``, ``"matrices"``) to its own learning rate. The loop is :func:`papa_lib.experiments.loop.fit`."""
    member = Member(
        seed, wrapper, [{"params": list(wrapper.probe.parameters())}, *override_groups(state, extra_rates)],
        RandomStream(seed),
        snapshot=lambda: (copy.deepcopy(wrapper.probe.state_dict()),
                          copy.deepcopy(state.state_dict()) if state is not None else None),
        restore=lambda best: (wrapper.probe.load_state_dict(best[0]),
                              state.load_state_dict(best[1]) if state is not None else None))
    member.result.probe = wrapper.probe
    batches = inloop_batches(encoded, labels, kind, train_rows, batch_size, seed)

    def steps(epoch, active):
        for inputs, targets in batches(epoch):
            yield [(member, inputs, targets)]

    def evaluate(member, epoch):
        predictions, held_loss = predict_inloop(wrapper, encoded, labels, heldout_rows, kind, with_loss=True)
        return float(score(predictions)), held_loss

    fit([member], steps, epochs=epochs, learning_rate=learning_rate,
        evaluate=evaluate if heldout_rows is not None else None, patience=patience, device=device)
    return member.result


def learn_lambdas(model, constants, probe: nn.Module, joint, batches_fn, *, seed: int, epochs: int,
                  learning_rate: float, theta_learning_rate: float | None = None, own_stream: bool = True,
                  device="cpu", progress: bool | str = False) -> torch.Tensor:
    """λ^h = σ(θ^h) of every head (paper Sec. 3.2, Eq. 3), learned once for every task, MLM included: each head of
    ``model`` mixes ``λ A + (1-λ) C`` with ``constants`` while ``probe`` trains with it (θ at
    ``theta_learning_rate``, default the probe's rate). ``joint(state)`` builds the module that runs the backbone
    (under ``state``, applied around the whole training) and the probe, e.g. a :class:`BackboneProbe`;
    ``batches_fn(epoch)`` yields its ``(inputs, targets)``;
    ``own_stream``: dropout from a random stream of ``seed`` (else the global generator). The backbone's own weights
    do not train (their ``requires_grad`` is switched off meanwhile); ``progress``: a bar over the epochs (its text
    when a string), with the steps taken. Returns λ ``[layers, heads]`` on the CPU."""
    from ..core.override import AttentionOverride

    state = AttentionOverride(model, constants, "all", "mix")
    module = joint(state)
    rates = {"theta": theta_learning_rate} if theta_learning_rate is not None else {}
    member = Member(seed, module, [{"params": list(probe.parameters())}, *override_groups(state, rates)],
                    RandomStream(seed) if own_stream else None)

    def steps(epoch, active):
        for inputs, targets in batches_fn(epoch):
            yield [(member, inputs, targets)]

    with frozen_parameters(model), state.applied(model):
        fit([member], steps, epochs=epochs, learning_rate=learning_rate, device=device, progress=progress)
    return state.lambdas()
