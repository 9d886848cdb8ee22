"""Constant attention matrices: the pad-aware per-entry average of every head's attention (paper Sec. 3.1, Eq. 2).

For head h, C^h = (1/|D|) Σ_i A^h_i, taken entry-wise and only over non-padded entries: entry (q, k) of C^h is the
mean of A^h_i[q, k] over the examples i in which *both* position q and position k are real tokens. Entries that no
example covers are 0. :func:`average_attention` streams over batches, keeping one running sum per layer and a
count per entry, so memory does not grow with the corpus.

:class:`ConstantAttention` holds the result and saves/loads it with safetensors (tensors ``matrices`` and
``counts`` plus string metadata).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..errors import PapaInputError
from .models import adapter_for, model_id, model_inputs, num_layers_and_heads, run_backbone


@dataclass
class ConstantAttention:
    """Constant attention matrices C^h for every layer and head (Sec. 3.1).

    Attributes:
        matrices: float32 ``[layers, heads, L, L]``; row q, column k is the average attention of query position q to
            key position k.
        counts: int64 ``[L, L]``; how many examples had both q and k as real tokens.
        metadata: model id, ``max_length``, ``layout``, ``num_examples``, ``source`` (where the text came from), ...
    """

    matrices: torch.Tensor
    counts: torch.Tensor
    metadata: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.matrices.dim() != 4 or self.matrices.shape[-1] != self.matrices.shape[-2]:
            raise PapaInputError(f"matrices must have shape [layers, heads, L, L], got {tuple(self.matrices.shape)}")
        if tuple(self.counts.shape) != tuple(self.matrices.shape[-2:]):
            raise PapaInputError(
                f"counts must have shape [L, L] = {tuple(self.matrices.shape[-2:])}, got {tuple(self.counts.shape)}"
            )

    @property
    def num_layers(self) -> int:
        return int(self.matrices.shape[0])

    @property
    def num_heads(self) -> int:
        return int(self.matrices.shape[1])

    @property
    def max_length(self) -> int:
        return int(self.matrices.shape[-1])

    def check_compatible(self, model, max_length: int | None = None) -> None:
        """Raise ``ValueError`` if these matrices do not fit ``model`` (layers x heads) or an input width L."""
        layers, heads = num_layers_and_heads(model)
        if (layers, heads) != (self.num_layers, self.num_heads):
            raise PapaInputError(
                f"constant matrices are for {self.num_layers} layers x {self.num_heads} heads "
                f"(model {self.metadata.get('model', '?')!r}) but the model has {layers} layers x {heads} heads"
            )
        if max_length is not None and max_length != self.max_length:
            raise PapaInputError(
                f"constant matrices were built at max_length L={self.max_length} but the input has L={max_length}"
            )

    def save(self, path: str | Path) -> Path:
        """Save to a ``.safetensors`` file (tensors ``matrices`` and ``counts``; metadata as strings), atomically and
        with a checksum file beside it (:func:`papa_lib.core.artefacts.write_atomic`)."""
        from .artefacts import write_atomic

        meta = {str(k): json.dumps(v) for k, v in self.metadata.items()}
        tensors = {
            "matrices": self.matrices.detach().float().cpu().contiguous(),
            "counts": self.counts.cpu().contiguous(),
        }
        return write_atomic(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta))

    @classmethod
    def load(cls, path: str | Path) -> ConstantAttention:
        """Load matrices saved by :meth:`save`; a file without ``matrices`` and ``counts`` raises ``ValueError``."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no constant-attention file at {path}")
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as handle:
                raw_meta = handle.metadata() or {}
            tensors = load_file(str(path))
        except OSError:
            raise
        except Exception as error:  # noqa: BLE001 - safetensors' own errors do not name the file
            raise PapaInputError(f"{path} is not a safetensors file of constant matrices ({error})") from error
        missing = {"matrices", "counts"} - set(tensors)
        if missing:
            raise PapaInputError(f"{path} is not a PAPA constant-attention file: missing tensors {sorted(missing)}")
        metadata = {}
        for key, value in raw_meta.items():
            try:
                metadata[key] = json.loads(value)
            except json.JSONDecodeError:
                metadata[key] = value
        return cls(tensors["matrices"], tensors["counts"], metadata)


def pair_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, L]`` real-token mask -> ``[B, L, L]`` float mask, 1 where query and key are both real."""
    real = attention_mask.to(torch.float32)
    return real[:, :, None] * real[:, None, :]


class PadAwareAverage:
    """Streaming, pad-aware per-entry average of per-example ``[layers, heads, L, L]`` matrices (Eq. 2).

    Entry (q, k) is averaged over the examples in which both q and k are real tokens; entries no example covers stay 0.
    Memory is one float64 ``[heads, L, L]`` running sum per layer plus one ``[L, L]`` count, whatever the corpus size.
    Used for PAPA's attention averages here and for norm-weighted averages in :mod:`papa_lib.analysis.norms`.
    """

    def __init__(self, num_layers: int, num_heads: int, kind: str = "average"):
        self.num_layers, self.num_heads, self.kind = num_layers, num_heads, kind
        self.sums: list[torch.Tensor] | None = None
        self.counts: torch.Tensor | None = None
        self.length: int | None = None
        self.layout: str | None = None
        self.num_examples = 0
        self.started = time.time()

    def add(
        self,
        per_layer: Iterable[tuple[int, torch.Tensor]],
        attention_mask: torch.Tensor,
        layout: str | None = None,
        positions: torch.Tensor | None = None,
        length: int | None = None,
    ) -> None:
        """Add one batch: ``per_layer`` yields ``(layer, matrices [B, heads,
        W, W])``; ``attention_mask`` is ``[B, W]``.

        A padded batch has ``W = L``. A packed batch
        (:func:`papa_lib.core.packing.pack`) gives ``positions`` ``[B, W]``
        (App. A position of each token) and ``length`` L: entry (i, j) of
        example b is added at ``(positions[b, i], positions[b, j])``, so the
        sums equal the padded batch's.
        """
        packed = positions is not None
        width = int(length if packed else attention_mask.shape[1])
        device = attention_mask.device
        if self.length is None:
            self.length, self.layout = width, layout
            self.sums = [torch.zeros(self.num_heads, width, width,
                                     dtype=torch.float64, device=device)
                         for _ in range(self.num_layers)]
            self.counts = torch.zeros(width, width, dtype=torch.float64,
                                      device=device)
        elif width != self.length:
            raise PapaInputError(f"all batches must have the same width L; got {width} after {self.length}")
        elif layout is not None and self.layout is not None and layout != self.layout:
            raise PapaInputError(f"all batches must have the same layout; got {layout!r} after {self.layout!r}")
        if self.layout is None:  # a first batch without one (a plain dict) does not open the door to a mix
            self.layout = layout
        if not packed:
            pair = pair_mask(attention_mask)
            # float32 sums per batch (float64 when given float64)
            for layer, matrices in per_layer:
                values = (matrices if matrices.dtype == torch.float64
                          else matrices.float())
                summed = torch.einsum("bhqk,bqk->hqk", values,
                                      pair.to(values.dtype))
                self.sums[layer] += summed.double()
            self.counts += pair.sum(0).double()
        else:
            real = attention_mask.bool()
            pair = real[:, :, None] & real[:, None, :]  # [B, W, W]
            index = positions.to(device).clamp_min(0)
            # the App. A entry of every real pair
            flat = (index[:, :, None] * width + index[:, None, :])[pair]
            for layer, matrices in per_layer:
                # [heads, pairs]
                values = matrices.transpose(0, 1)[:, pair].double()
                self.sums[layer].view(self.num_heads, -1).index_add_(
                    1, flat, values)
            ones = torch.ones_like(flat, dtype=torch.float64)
            self.counts.view(-1).index_add_(0, flat, ones)
        self.num_examples += int(attention_mask.shape[0])

    def means(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(C [layers, heads, L, L] float64, counts [L, L] int64)``: Eq. 2 so far; an empty corpus raises
        ``ValueError``."""
        if self.num_examples == 0:
            raise PapaInputError(
                f"the {self.kind} matrices got an empty corpus: no batches (or only empty ones) to average over"
            )
        stacked = torch.stack([s.clone() for s in self.sums])  # plain tensors, editable outside inference mode
        zero = torch.zeros((), dtype=stacked.dtype, device=stacked.device)
        averages = torch.where(self.counts > 0, stacked / self.counts.clamp_min(1), zero)
        return averages, self.counts.clone().round().long()

    def result(self, model, source: str) -> ConstantAttention:
        """The averages as a :class:`ConstantAttention`; an empty corpus raises ``ValueError``."""
        matrices, counts = self.means()
        metadata = {
            "model": model_id(model),
            "max_length": self.length,
            "layout": self.layout or "unknown",
            "num_examples": self.num_examples,
            "source": source,
            "seconds": round(time.time() - self.started, 3),
            "kind": self.kind,
        }
        return ConstantAttention(matrices.float().cpu(), counts.cpu(), metadata)


def average_attention(
    model,
    batches: Iterable[dict],
    progress: bool = True,
    *,
    source: str = "unspecified",
    total: int | None = None,
) -> ConstantAttention:
    """Average every head's attention matrix over a corpus, entry-wise and pad-aware (Sec. 3.1, Eq. 2).

    Args:
        model: an encoder from :func:`papa_lib.load_encoder` (eager attention).
        batches: an iterable of dicts as returned by :func:`papa_lib.encode` (all of the same width L), or packed
            batches (:func:`papa_lib.core.packing.pack`) of the same L, whose entries are added at their App. A
            positions: the same average, computed on real tokens only.
        progress: show a progress bar.
        source: where the text came from (stored in the metadata).
        total: number of batches, for the progress bar only.

    Returns:
        A :class:`ConstantAttention`; ``counts[q, k]`` is the number of examples in which q and k were both real.

    Memory stays constant in the corpus size (:class:`PadAwareAverage`); no per-example matrix is kept.

    A decoder LM (an adapter with ``causal=True``, :mod:`papa_lib.core.decoders`) is averaged through the override
    seam with every head original, so causality, the sliding window and grouped-query heads are imposed by the seam
    itself (entry (i, j > i) and entries outside a local layer's window are 0); its bare decoder runs, not the LM head,
    and batches are right-padded (:func:`papa_lib.encode`'s ``"causal"`` layout).
    """
    from collections.abc import Mapping
    from contextlib import nullcontext

    from tqdm.auto import tqdm

    if isinstance(batches, Mapping):  # iterating one batch would give its keys
        raise PapaInputError("average_attention takes a list (or other iterable) of batches, e.g. [batch], not one "
                             "batch")
    if adapter_for(model).causal:
        from .override import override

        seam = override(model, heads=())
    else:
        seam = nullcontext()
    average = PadAwareAverage(*num_layers_and_heads(model))
    modes = {module: module.training for module in model.modules()}  # dropout would make C random: eval mode,
    model.eval()  # then every module's own mode back
    try:
        with torch.inference_mode(), seam:
            for batch in tqdm(batches, total=total, disable=not progress, desc="averaging attention", unit="batch"):
                if batch["input_ids"].shape[0] == 0:  # an empty batch adds nothing
                    continue
                inputs = model_inputs(model, batch)
                outputs = run_backbone(model, inputs, output_attentions=True)
                average.add(enumerate(outputs.attentions), inputs["attention_mask"], getattr(batch, "layout", None),
                            positions=getattr(batch, "positions", None), length=getattr(batch, "length", None))
    finally:
        for module, training in modes.items():
            module.training = training
    return average.result(model, source)
