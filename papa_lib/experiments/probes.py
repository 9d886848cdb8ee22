"""Probing classifiers trained on top of a frozen (possibly PAPA-modified) Transformer.

PAPA (Hassid et al., 2022) measures how much a pretrained model relies on input-dependent attention by
freezing the model and training a small classifier on its hidden states (paper Sec. 3.3, "Probing"):

* **Sentence-level tasks** (CoLA, SST-2, MNLI, MRPC): "for each layer a weighted (learned, non-attentive)
  representation of the different token representations", the layer summaries are concatenated and a
  2-layer MLP gives the logits -> :class:`SentenceProbe`.
* **Structured prediction** (NER, POS): "we concatenate for each token the representations across layers, and
  apply a 2-layer MLP" -> :class:`TokenProbe`.

Training uses AdamW with the learning rates of paper App. B, Table 3 (:func:`train_probe`, one model through the
library's one training loop, :func:`papa_lib.experiments.loop.fit`). This module is pure torch: it consumes
already-extracted hidden states and knows nothing about ``transformers``.

Choices the paper leaves open, and what this module does
---------------------------------------------------------
* **Layers used**: all hidden-state layers including the embedding output (``num_layers`` = number of
  Transformer layers + 1 for a Hugging Face model with ``output_hidden_states=True``).
* **Position weights**: one free scalar per layer *and* per position (shape ``[num_layers, max_length]``; not
  shared across layers, as the paper says "for each layer"). They do not depend on the input ("non-attentive").
  For each example they are soft-maxed over the *real* positions only (``attention_mask == 1``); padded
  positions get weight exactly 0 and their feature values are zeroed before pooling, so whatever is stored at
  padded positions (even NaN/inf) cannot change the output.
* **Initialisation of the position weights**: zeros, so pooling starts as the plain mean over real tokens.
* **Inputs shorter than ``max_length``**: the first ``L`` position weights are used; ``L > max_length`` is an error.
* **MLP**: ``Linear(in, mlp_hidden) -> activation -> Dropout(dropout) -> Linear(mlp_hidden, num_labels)``
  with ``in = num_layers * hidden_size``. ``mlp_hidden`` defaults to ``hidden_size``.
* **Activation**: ``tanh`` by default (the same squashing non-linearity as a BERT/RoBERTa pooler, and what the
  authors' released code uses); ``"gelu"`` and ``"relu"`` are available through ``activation=``.
* **Dropout**: 0.1 inside the MLP (after the activation) by default; active only in ``train()`` mode.
* **Linear layers**: PyTorch default initialisation.
* **Dtype**: features are cast to float32 (hidden states may be cached in float16).
* **Loss**: cross entropy; for token tasks targets equal to ``-100`` are ignored (sub-word continuations,
  special tokens, padding), matching the usual Hugging Face label convention. A batch whose targets are all
  ignored contributes no update and is not counted in the epoch mean.
* **Optimiser**: ``torch.optim.AdamW`` with betas (0.9, 0.999), eps 1e-8 and ``weight_decay=0.0`` by default
  (PyTorch's own AdamW default would be 0.01; the paper does not mention weight decay), through
  :func:`papa_lib.experiments.loop.adamw`:
  PyTorch's fused kernel on CPU and CUDA (the same update, about 10x faster on a probe's 1M weights). Constant learning
  rate: the paper mentions no schedule, warm-up or gradient clipping, so none is used.
* **Epoch loss**: the unweighted mean of the per-batch mean losses.

Determinism: after :func:`set_seed` the whole pipeline (probe initialisation, dropout masks, AdamW) is
bit-for-bit reproducible on CPU, provided ``batches_fn`` is itself deterministic for a given epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .loop import Member, as_inputs, fit, to_device

__all__ = [
    "SentenceProbe",
    "RaggedSentences",
    "TokenProbe",
    "make_probe",
    "train_probe",
    "predict",
    "ACTIVATIONS",
    "check_positive_int",
]


#: Activation functions selectable by name for the probe MLP.
ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "tanh": nn.Tanh,
    "gelu": nn.GELU,
    "relu": nn.ReLU,
}


def check_positive_int(name: str, value: Any) -> int:
    """``value`` as an ``int`` when it is a positive integer (a bool is not), else ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _attach_mlp(probe: nn.Module, hidden_size: int, num_labels: int, mlp_hidden: int | None, activation: str,
                dropout: float) -> None:
    """Check and set ``probe``'s ``hidden_size`` and ``num_labels`` and give it its MLP over the concatenated layers
    (``num_layers * hidden_size`` inputs; ``mlp_hidden`` default: ``hidden_size``)."""
    probe.hidden_size = check_positive_int("hidden_size", hidden_size)
    probe.num_labels = check_positive_int("num_labels", num_labels)
    mlp_hidden = probe.hidden_size if mlp_hidden is None else check_positive_int("mlp_hidden", mlp_hidden)
    probe.mlp = two_layer_mlp(probe.num_layers * probe.hidden_size, mlp_hidden, probe.num_labels, activation, dropout)


def two_layer_mlp(
    in_features: int, mlp_hidden: int, num_labels: int, activation: str, dropout: float
) -> nn.Sequential:
    """``Linear -> activation -> Dropout -> Linear``, the 2-layer MLP of paper Sec. 3.3."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose one of {sorted(ACTIVATIONS)}")
    if not 0.0 <= float(dropout) < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
    return nn.Sequential(
        nn.Linear(in_features, mlp_hidden),
        ACTIVATIONS[activation](),
        nn.Dropout(float(dropout)),
        nn.Linear(mlp_hidden, num_labels),
    )


@dataclass(frozen=True)
class RaggedSentences:
    """A batch of sentences as real-token rows only: ``values [T, num_layers, D]``, ``example [T]`` (which sentence
    of the batch each row belongs to, 0..size-1), ``positions [T]`` (its App. A position) and ``size`` (B)."""

    values: Tensor
    example: Tensor
    positions: Tensor
    size: int


class SentenceProbe(nn.Module):
    """Sentence-level probe of paper Sec. 3.3.

    Per layer, a learned (non-attentive) weight per position, softmax-normalised over the real positions only,
    gives a weighted sum of that layer's token vectors; the per-layer summaries are concatenated and fed to a
    2-layer MLP.

    Args:
        num_layers: number of hidden-state layers given to the probe (embeddings included).
        max_length: longest sequence length the probe accepts (one weight per position).
        hidden_size: size ``D`` of each token vector.
        num_labels: number of output classes.
        mlp_hidden: width of the MLP hidden layer (default ``hidden_size``).
        dropout: dropout probability inside the MLP.
        activation: ``"tanh"`` (default), ``"gelu"`` or ``"relu"``.
    """

    def __init__(
        self,
        num_layers: int,
        max_length: int,
        hidden_size: int,
        num_labels: int,
        mlp_hidden: int | None = None,
        dropout: float = 0.1,
        activation: str = "tanh",
    ) -> None:
        super().__init__()
        self.num_layers = check_positive_int("num_layers", num_layers)
        self.max_length = check_positive_int("max_length", max_length)
        # Zeros: the masked softmax then starts as a plain mean over the real tokens.
        self.position_logits = nn.Parameter(torch.zeros(self.num_layers, self.max_length))
        _attach_mlp(self, hidden_size, num_labels, mlp_hidden, activation, dropout)

    def pooling_weights(self, attention_mask: Tensor, positions: Tensor | None = None) -> Tensor:
        """Per-example pooling weights ``[B, num_layers, W]``: softmax over real positions, exactly 0 at padding.

        Without ``positions`` column ``j`` is App. A position ``j``; with ``positions`` ``[B, W]`` (packed, real tokens
        only) column ``j`` of example ``b`` takes the weight of position ``positions[b, j]``.
        """
        if attention_mask.dim() != 2:
            raise ValueError(f"attention_mask must be [batch, length], got shape {tuple(attention_mask.shape)}")
        length = attention_mask.shape[1]
        real = attention_mask.to(self.position_logits.device) != 0  # [B, W]
        if not bool(real.any(dim=1).all()):
            raise ValueError("every example needs at least one real position (attention_mask row of all zeros)")
        if positions is None:
            if length > self.max_length:
                raise ValueError(f"sequence length {length} exceeds the probe's max_length {self.max_length}")
            logits = self.position_logits[:, :length].unsqueeze(0)  # [1, n, L]
        else:
            positions = positions.to(self.position_logits.device).long()
            if tuple(positions.shape) != tuple(real.shape):
                raise ValueError(
                    f"positions shape {tuple(positions.shape)} does not match attention_mask {tuple(real.shape)}"
                )
            top = int(positions[real].max()) if real.any() else 0
            if top >= self.max_length:
                raise ValueError(f"position {top} exceeds the probe's max_length {self.max_length}")
            logits = self.position_logits[:, positions.clamp(0, self.max_length - 1)].permute(1, 0, 2)  # [B, n, W]
        logits = logits.masked_fill(~real.unsqueeze(1), float("-inf"))  # [B, n, W]
        return torch.softmax(logits, dim=-1)

    def pool_ragged(self, batch: RaggedSentences) -> Tensor:
        """Per-layer pooled vectors ``[B, num_layers, D]`` computed on real tokens only (no padded tensor).

        The same weighted sum as :meth:`forward`: softmax of ``position_logits[:, position]`` over each example's
        own tokens, then a segment sum of the weighted token vectors.
        """
        values = batch.values.to(device=self.position_logits.device, dtype=torch.float32)  # [T, n, D]
        example = batch.example.to(values.device)
        positions = batch.positions.to(values.device).long()
        if values.shape[1:] != (self.num_layers, self.hidden_size):
            raise ValueError(f"token rows have {tuple(values.shape[1:])} (layers, hidden); probe expects "
                             f"({self.num_layers}, {self.hidden_size})")
        if positions.numel() and int(positions.max()) >= self.max_length:
            raise ValueError(f"position {int(positions.max())} exceeds the probe's max_length {self.max_length}")
        logits = self.position_logits[:, positions].t()  # [T, n]
        index = example[:, None].expand_as(logits)
        top = logits.new_full((batch.size, self.num_layers), float("-inf"))
        top = top.scatter_reduce(0, index, logits.detach(), "amax", include_self=True)  # softmax is shift-invariant
        weights = torch.exp(logits - top[example])
        totals = weights.new_zeros((batch.size, self.num_layers)).index_add(0, example, weights)
        weights = weights / totals[example]
        pooled = values.new_zeros((batch.size, self.num_layers, self.hidden_size))
        return pooled.index_add(0, example, weights[..., None] * values)

    def forward(self, features, attention_mask: Tensor | None = None,
                positions: Tensor | None = None) -> Tensor:
        """``features`` [B, num_layers, W, D], ``attention_mask`` [B, W]
        (1 real, 0 pad) -> logits [B, num_labels].

        ``positions`` [B, W]: the App. A position of each column when the
        features hold real tokens only (packed); the result then equals the
        padded input's. ``features`` may also be a :class:`RaggedSentences`
        (real-token rows of a feature store), pooled without building a
        padded tensor (:meth:`pool_ragged`); same result.
        """
        if isinstance(features, RaggedSentences):
            pooled = self.pool_ragged(features)
            return self.mlp(pooled.reshape(
                features.size, self.num_layers * self.hidden_size))
        if attention_mask is None:
            raise ValueError("a padded features tensor needs its "
                             "attention_mask")
        if features.dim() != 4:
            raise ValueError(f"features must be [batch, layers, length, "
                             f"hidden], got shape {tuple(features.shape)}")
        batch, layers, length, hidden = features.shape
        if layers != self.num_layers or hidden != self.hidden_size:
            raise ValueError(
                f"features have {layers} layers x hidden {hidden}; probe "
                f"expects {self.num_layers} layers x hidden "
                f"{self.hidden_size}"
            )
        if tuple(attention_mask.shape) != (batch, length):
            raise ValueError(
                f"attention_mask shape {tuple(attention_mask.shape)} does "
                f"not match features [batch={batch}, length={length}]"
            )
        features = features.to(device=self.position_logits.device,
                               dtype=torch.float32)
        # [B, n, W]
        weights = self.pooling_weights(attention_mask, positions)
        mask = attention_mask.to(features.device) != 0
        real = mask[:, None, :, None]  # [B, 1, L, 1]
        zero = torch.zeros((), dtype=features.dtype, device=features.device)
        features = torch.where(real, features, zero)
        # [B, n, D]
        pooled = torch.einsum("bnl,bnld->bnd", weights, features)
        return self.mlp(pooled.reshape(batch, layers * hidden))


class TokenProbe(nn.Module):
    """Token-level probe of paper Sec. 3.3: concatenate each token's vectors across layers, then a 2-layer MLP.

    Args:
        num_layers: number of hidden-state layers given to the probe (embeddings included).
        hidden_size: size ``D`` of each token vector.
        num_labels: number of output classes (tags).
        mlp_hidden: width of the MLP hidden layer (default ``hidden_size``).
        dropout: dropout probability inside the MLP.
        activation: ``"tanh"`` (default), ``"gelu"`` or ``"relu"``.
    """

    def __init__(
        self,
        num_layers: int,
        hidden_size: int,
        num_labels: int,
        mlp_hidden: int | None = None,
        dropout: float = 0.1,
        activation: str = "tanh",
    ) -> None:
        super().__init__()
        self.num_layers = check_positive_int("num_layers", num_layers)
        _attach_mlp(self, hidden_size, num_labels, mlp_hidden, activation, dropout)

    def forward(self, features: Tensor) -> Tensor:
        """``features`` [..., num_layers, D] (e.g. [B, L, num_layers, D]) ->
        logits [..., num_labels]."""
        shape = (self.num_layers, self.hidden_size)
        if features.dim() < 2 or tuple(features.shape[-2:]) != shape:
            raise ValueError(
                f"features must end in [num_layers={self.num_layers}, "
                f"hidden={self.hidden_size}], "
                f"got shape {tuple(features.shape)}"
            )
        device = self.mlp[0].weight.device
        features = features.to(device=device, dtype=torch.float32)
        return self.mlp(features.flatten(start_dim=-2))


def make_probe(
    kind: str, num_layers: int, max_length: int | None, hidden_size: int, num_labels: int, **kwargs: Any
) -> nn.Module:
    """Build a probe by task kind: ``'sentence'`` -> :class:`SentenceProbe`, ``'token'`` -> :class:`TokenProbe`.

    ``max_length`` is ignored for token probes. Extra keyword arguments (``mlp_hidden``, ``dropout``,
    ``activation``) go to the probe constructor.
    """
    if kind == "sentence":
        if max_length is None:
            raise ValueError("a sentence probe needs max_length")
        return SentenceProbe(num_layers, max_length, hidden_size, num_labels, **kwargs)
    if kind == "token":
        return TokenProbe(num_layers, hidden_size, num_labels, **kwargs)
    raise ValueError(f"unknown probe kind {kind!r}; expected 'sentence' or 'token'")


def train_probe(
    probe: nn.Module,
    params: Iterable[nn.Parameter],
    batches_fn: Callable[[int], Iterable[tuple[Any, Tensor]]],
    epochs: int,
    lr: float,
    weight_decay: float = 0.0,
    device: torch.device | str = "cpu",
    progress: bool = False,
    loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
) -> list[float]:
    """Train ``probe`` with AdamW at a constant learning rate (paper App. B) and return the mean loss per epoch.

    One model, no early stopping, dropout from the global generator: :func:`papa_lib.experiments.loop.fit` with
    one member.

    Args:
        probe: module called as ``probe(*inputs)`` to get logits (``[B, C]`` or ``[B, L, C]``). It is moved to
            ``device``, put in ``train()`` mode while training and left in ``eval()`` mode afterwards.
        params: the parameters to optimise: the probe's, plus possibly extra ones owned by the caller (e.g. the
            PAPA mixing weights of Sec. 3.2). Parameters not listed are not updated.
        batches_fn: ``batches_fn(epoch)`` returns an iterable of ``(inputs, targets)``; ``inputs`` is a tuple of
            positional arguments for the probe (a single tensor is accepted too). Tensors are moved to
            ``device``. For token tasks use ``-100`` in ``targets`` for positions to ignore.
        epochs: number of passes (Table 3 gives 4 or 15 depending on the task).
        lr: learning rate (Table 3).
        weight_decay: AdamW decoupled weight decay (default 0).
        device: where the probe and the batches go.
        progress: show a tqdm bar over epochs.
        loss_fn: ``loss_fn(logits, targets) -> scalar``; default cross entropy with ``ignore_index=-100``.

    Returns:
        One float per epoch: the mean of that epoch's per-batch losses (NaN for an epoch without usable batches).
    """
    probe.to(device)
    member = Member(0, probe, [{"params": list(params)}])

    def steps(epoch, active):
        for batch in batches_fn(epoch):
            try:
                inputs, targets = batch
            except (TypeError, ValueError) as err:
                raise ValueError("each batch from batches_fn must be an (inputs, targets) pair") from err
            yield [(member, inputs, targets)]

    fit([member], steps, epochs=epochs, learning_rate=lr, weight_decay=weight_decay, loss_fn=loss_fn, device=device,
        progress=progress)
    return [sum(losses) / len(losses) if losses else float("nan") for losses in member.epoch_losses]


@torch.no_grad()
def predict(probe: nn.Module, batches: Iterable[Any], device: torch.device | str = "cpu") -> Tensor:
    """Arg-max predictions of ``probe`` over ``batches``, concatenated in batch order, as a CPU ``long`` tensor.

    Each item of ``batches`` is either ``(inputs, targets)`` exactly as yielded by a ``batches_fn`` of
    :func:`train_probe` (recognised by ``inputs`` being a tuple/list; ``targets`` is ignored), or the probe's
    inputs alone (a tuple/list of tensors, or a single tensor).

    Sentence probes give one prediction per example (shape ``[N]``). Token probes give ``[B, L]`` per batch;
    each is flattened row-major and the batches are concatenated, so the result lines up with
    ``torch.cat([t.reshape(-1) for t in targets_per_batch])`` and positions whose target is ``-100`` can be
    masked out afterwards. The probe is run in ``eval()`` mode; its previous mode is restored afterwards.
    """
    was_training = probe.training
    probe.to(device)
    probe.eval()
    outputs: list[Tensor] = []
    try:
        for item in batches:
            if isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], (tuple, list)):
                inputs = item[0]
            else:
                inputs = item
            logits = probe(*to_device(as_inputs(inputs), device))
            outputs.append(logits.argmax(dim=-1).reshape(-1).cpu())
    finally:
        probe.train(was_training)
    if not outputs:
        return torch.empty(0, dtype=torch.long)
    return torch.cat(outputs)
