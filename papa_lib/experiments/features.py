"""Frozen-backbone features for the probes (paper Sec. 3.3): a store that keeps real tokens only, and a streaming
source with the same interface for when the store would not fit its budget.

The probes of Sec. 3.3 read the hidden states of every layer (embeddings included) of a frozen, possibly PAPA-modified
backbone. Under the App. A layout every real token has a fixed position and padding never influences it, so the
backbone runs on packed batches (:func:`papa_lib.core.packing.pack`: real tokens only, with their App. A position ids)
and only real tokens are kept:

* sentence tasks: for example ``i`` the rows ``values[offsets[i]:offsets[i+1]]`` ``[n_i, layers+1, D]`` (float16) and
  the App. A position of each row (``positions``), which the sentence probe's per-position weights need;
* token tasks (NER, POS): one row per kept word (its first sub-token), ``words[offsets[i]:offsets[i+1]]`` for
  sentence ``i``.

A :class:`FeatureStore` writes those rows to memory-mapped files under ``results_dir/features/<key>/`` (never held per
padding position, never committed). When a split's rows would exceed the budget, :class:`StreamedFeatures` runs the
backbone instead, one chunk of examples at a time; both sources answer :meth:`rows` with the same
:class:`RaggedRows`, so the probe trainer (:mod:`papa_lib.experiments.training`) gives the same numbers either way.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..core.artefacts import set_aside, write_atomic
from ..core.layout import EncodedBatch
from ..core.models import adapter_for, model_inputs, run_backbone
from ..core.packing import pack, packing_notice, supports_packing
from ..errors import PapaInputError
from .loop import IGNORE_INDEX
from .probes import RaggedSentences

#: Default budget for cached features: a quarter of the machine's memory (the files are memory-mapped, so the
#: page cache holds what the probes read every epoch), at most half of the free disk space of the results folder.
DEFAULT_BUDGET_FRACTION = 0.25


def default_budget(results_dir: str | Path | None = None) -> int:
    """A sensible feature-cache budget in bytes for this machine (see :data:`DEFAULT_BUDGET_FRACTION`)."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 8 << 30
    budget = int(memory * DEFAULT_BUDGET_FRACTION)
    if results_dir is not None:
        folder = Path(results_dir)
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        budget = min(budget, shutil.disk_usage(folder).free // 2)
    return budget


def parse_bytes(text: str | int | float) -> int:
    """``"8G"``, ``"512M"``, ``"1.5T"`` or a plain number of bytes -> bytes (a clear error otherwise)."""
    if isinstance(text, (int, float)):
        return int(text)
    units = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    value = str(text).strip().upper().removesuffix("IB").removesuffix("B")
    number, unit = (value[:-1], value[-1]) if value and value[-1] in units else (value, "")
    try:
        return int(float(number) * units[unit])
    except ValueError:
        raise PapaInputError(f"cache budget {text!r} is not a size (use e.g. 8G, 512M or a number of bytes)") from None


def select_rows(encoded: EncodedBatch, rows) -> EncodedBatch:
    """The examples ``rows`` of an encoded batch, as an encoded batch."""
    index = torch.as_tensor(rows, dtype=torch.long)
    word_index = encoded.word_index[index] if encoded.word_index is not None else None
    return EncodedBatch({k: v[index] for k, v in encoded.items()}, layout=encoded.layout,
                        max_length=encoded.max_length, num_truncated=0, word_index=word_index,
                        model_type=getattr(encoded, "model_type", None))


def masked_rows(encoded: EncodedBatch, labels: torch.Tensor, rows, kind: str) -> EncodedBatch:
    """The examples ``rows`` of an encoded batch (:func:`select_rows`); for a token task, the words whose label is
    :data:`~papa_lib.experiments.loop.IGNORE_INDEX` get word index -1, so that the backbone's rows leave them out, as
    the probe's targets do."""
    part = select_rows(encoded, rows)
    if kind == "token":
        part.word_index[labels[rows][:, : part.word_index.shape[1]] == IGNORE_INDEX] = -1
    return part


@dataclass
class RaggedRows:
    """Features of a set of examples: ``values [rows, layers+1, D]`` with ``offsets [n+1]`` per example.

    Sentence tasks also carry ``positions [rows]`` (App. A position of each real token). :meth:`sentence_batch` and
    :meth:`token_batch` turn a subset of the examples into a probe's inputs.
    """

    values: torch.Tensor
    offsets: torch.Tensor
    positions: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.offsets.numel() - 1)

    def to(self, device) -> RaggedRows:
        """The same rows with every tensor on ``device`` (values stay fp16): batches are then gathered there."""
        move = lambda t: t.to(device) if t is not None else None  # noqa: E731
        return RaggedRows(move(self.values), move(self.offsets), move(self.positions))

    def _flat_index(self, examples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        examples = examples.to(self.offsets.device)
        starts, ends = self.offsets[examples], self.offsets[examples + 1]
        lengths = ends - starts
        width = int(lengths.max()) if lengths.numel() else 0
        columns = torch.arange(width, device=self.offsets.device)
        real = columns[None, :] < lengths[:, None]
        return (starts[:, None] + columns[None, :]).clamp_max(max(self.values.shape[0] - 1, 0)), real

    def sentence_batch(self, examples, device="cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(hidden [B, layers+1, W, D] float32, mask [B, W], positions [B, W])`` for a sentence probe."""
        examples = torch.as_tensor(examples, dtype=torch.long)
        index, real = self._flat_index(examples)
        hidden = self.values[index.reshape(-1)].reshape(*index.shape, *self.values.shape[1:])
        hidden = hidden.to(device=device, dtype=torch.float32) * real[..., None, None].to(device)
        positions = self.positions[index] * real
        return hidden.permute(0, 2, 1, 3), real.long().to(device), positions.long().to(device)

    def ragged_sentences(self, examples, device="cpu") -> RaggedSentences:
        """The real-token rows of ``examples`` for a sentence probe, without padding them to a common width."""
        examples = torch.as_tensor(examples, dtype=torch.long)
        index, real = self._flat_index(examples)
        flat = index[real]
        example = torch.arange(len(examples), device=real.device)[:, None].expand_as(real)[real]
        return RaggedSentences(self.values[flat].to(device), example.to(device), self.positions[flat].to(device),
                               len(examples))

    def token_batch(self, examples, device="cpu") -> torch.Tensor:
        """``[words, layers+1, D]`` float32: every kept word of the given sentences, in order."""
        examples = torch.as_tensor(examples, dtype=torch.long)
        index, real = self._flat_index(examples)
        return self.values[index[real]].to(device=device, dtype=torch.float32)


def on_device(rows: RaggedRows, device, share: float = 0.25) -> RaggedRows:
    """``rows`` moved to an accelerator when they take at most ``share`` of its free memory, else left where they
    are: gathering batches next to the probe avoids copying every batch over from host memory each epoch."""
    device = torch.device(device)
    if device.type != "cuda":
        return rows
    free, _ = torch.cuda.mem_get_info(device)
    size = rows.values.numel() * rows.values.element_size()
    return rows.to(device) if size <= share * free else rows


def row_counts(encoded: EncodedBatch, labels: torch.Tensor, kind: str) -> torch.Tensor:
    """Rows each example keeps: real tokens (sentence tasks) or labelled words (token tasks; words cut off by
    truncation carry :data:`~papa_lib.experiments.loop.IGNORE_INDEX`)."""
    if kind == "token":
        return (labels != IGNORE_INDEX).sum(dim=1)
    return encoded["attention_mask"].sum(dim=1).long()


def feature_rows_bytes(rows: float, layers: int, hidden: int, kind: str = "sentence", *, positions: bool = False,
                       bytes_per_value: int = 2) -> int:
    """Bytes of ``rows`` rows of frozen features, each a vector of every layer and the embeddings: ``rows x
    (layers+1) x hidden x bytes_per_value`` (float16 by default), the layout of :class:`FeatureStore`. ``layers`` is
    the backbone's number of transformer layers (the embeddings add one vector); ``rows`` may be an estimate
    (fractional).

    ``positions``: also count the int16 App. A position the store keeps with each row of a sentence task (2 bytes a
    row; a token task keeps none).
    """
    if kind not in ("sentence", "token"):
        raise ValueError(f"feature_rows_bytes: kind must be 'sentence' or 'token', got {kind!r}")
    values = rows * (int(layers) + 1) * int(hidden) * int(bytes_per_value)
    return int(values + (rows * 2 if positions and kind == "sentence" else 0))


def feature_bytes(encoded: EncodedBatch, labels: torch.Tensor, kind: str, layers: int, hidden: int) -> int:
    """Bytes the store keeps for a split (:func:`feature_rows_bytes` of its rows, positions included; ``layers``: the
    backbone's transformer layers, as there)."""
    rows = int(row_counts(encoded, labels, kind).sum())
    return feature_rows_bytes(rows, layers, hidden, kind, positions=True)


def length_sorted_chunks(lengths: torch.Tensor, batch_size: int, rows=None):
    """Split example indices (``rows``, default all) into batches of similar real length: padding-free packing is
    only as narrow as the longest row of its batch."""
    rows = torch.arange(len(lengths)) if rows is None else torch.as_tensor(rows, dtype=torch.long)
    order = rows[torch.argsort(lengths[rows], stable=True)]
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def decoder_features(hidden: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """A decoder LM's probe features (decision rule R14): each layer's hidden state of each token divided by its root
    mean square over the hidden dimension (an RMSNorm without weight), in float32.

    Why: Gemma 3's residual stream grows to magnitudes of 10^2-10^4 in the middle layers (its first token's to about
    10^5, beyond float16), and its own RMSNorms, not the raw states, are what every later block reads; the paper's
    probe (a tanh MLP over a learned mix of the layers) fed the raw states stays at the majority class."""
    hidden = hidden.float()
    return hidden * torch.rsqrt(hidden.pow(2).mean(dim=-1, keepdim=True) + eps)


def backbone_batch(part: EncodedBatch, model, packed: bool) -> tuple:
    """``(inputs, real, positions, word_index)`` of one batch for the backbone: packed
    (:func:`~papa_lib.core.packing.pack`: real tokens only, with their App. A positions), or the padded batch itself
    with its columns as positions."""
    if packed:
        inputs = pack(part, model=model)
        return inputs, inputs.real, inputs.positions, inputs.word_index
    real = part["attention_mask"].bool()
    return part, real, torch.arange(part.max_length).expand_as(real), part.word_index


def word_rows(hidden: torch.Tensor, word_index: torch.Tensor) -> torch.Tensor:
    """The rows of the kept words (``word_index >= 0``, sentence by sentence) of ``hidden [B, W, ...]``."""
    keep = word_index >= 0
    batch_rows = torch.arange(hidden.shape[0])[:, None].expand_as(word_index)
    return hidden[batch_rows[keep], word_index[keep].to(hidden.device)]


class BackboneRunner:
    """Runs the frozen (possibly overridden) backbone on a set of examples and returns their :class:`RaggedRows`.

    Packed by default (:func:`papa_lib.core.packing.pack`); models whose adapter cannot pack (DeBERTa's relative
    positions follow sequence indices; decoder LMs, right-padded) run padded, and the real rows are taken from the
    padded output — the same rows. A decoder LM's bare decoder runs (:func:`papa_lib.core.models.run_backbone`), never
    its LM head.
    """

    def __init__(self, model, encoded: EncodedBatch, labels: torch.Tensor, kind: str, batch_size: int = 64,
                 packed: bool = True):
        self.model, self.encoded, self.labels, self.kind = model, encoded, labels, kind
        self.batch_size = batch_size
        self.causal = bool(adapter_for(model).causal)
        self.packed = bool(packed) and supports_packing(model) and not self.causal
        if packed and not self.packed and not self.causal:
            packing_notice(model)
        self.lengths = encoded["attention_mask"].sum(dim=1).long()
        self.counts = row_counts(encoded, labels, kind)

    def _forward(self, part: EncodedBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Hidden states of the real rows of one batch in example order: ``(values, positions)`` (token tasks: no
        positions)."""
        if self.causal:  # right-padded: cut the batch to its longest real row (a causal row never sees padding)
            width = int(part["attention_mask"].sum(dim=1).max())
            inputs = {"input_ids": part["input_ids"][:, :width], "attention_mask": part["attention_mask"][:, :width]}
            outputs = run_backbone(self.model, inputs, output_hidden_states=True)
            hidden = decoder_features(torch.stack(outputs.hidden_states, dim=2)).to(torch.float16).cpu()
            real = inputs["attention_mask"].bool()
            return hidden[real], torch.arange(width).expand_as(real)[real]
        inputs, real, positions, word_index = backbone_batch(part, self.model, self.packed)
        # App. A position ids: the packed batch's, else the padded batch's own or layout_position_ids (model_inputs)
        outputs = run_backbone(self.model, model_inputs(self.model, inputs), output_hidden_states=True)
        hidden = torch.stack(outputs.hidden_states, dim=2).to(torch.float16).cpu()  # [B, W, layers+1, D]
        if self.kind == "token":
            return word_rows(hidden, word_index), None
        return hidden[real], positions[real]

    @torch.inference_mode()
    def rows(self, examples, progress: bool = False, desc: str = "features", allocate=None) -> RaggedRows:
        """Features of ``examples`` (in that order). ``allocate(shape)`` gives the float16 tensor they are written
        into (default: a new one in memory; :meth:`FeatureStore.build`: a map of the store's file)."""
        from tqdm.auto import tqdm

        examples = torch.as_tensor(examples, dtype=torch.long)
        counts = self.counts[examples]
        offsets = torch.zeros(len(examples) + 1, dtype=torch.long)
        offsets[1:] = counts.cumsum(0)
        values = None
        positions = torch.zeros(int(offsets[-1]), dtype=torch.int16) if self.kind != "token" else None
        slot = torch.empty(len(self.lengths), dtype=torch.long)
        slot[examples] = torch.arange(len(examples))
        chunks = length_sorted_chunks(self.lengths, self.batch_size, examples)
        for chunk in tqdm(chunks, disable=not progress, desc=desc, leave=False):
            part = masked_rows(self.encoded, self.labels, chunk, self.kind)
            batch_values, batch_positions = self._forward(part)
            if values is None:
                shape = (int(offsets[-1]), *batch_values.shape[1:])
                values = allocate(shape) if allocate is not None else torch.empty(shape, dtype=torch.float16)
            starts = offsets[slot[chunk]]
            index = torch.cat([torch.arange(int(s), int(s) + int(n)) for s, n in zip(starts, self.counts[chunk])])
            values[index] = batch_values
            if positions is not None:
                positions[index] = batch_positions.to(torch.int16)
        if values is None:
            values = torch.empty((0, 1, 1), dtype=torch.float16)
        return RaggedRows(values, offsets, positions)


class FeatureStore:
    """Memory-mapped real-token features under ``root/<key>/<split>.*`` (float16 values, int64 offsets, int16
    positions), written atomically: a folder appears only once complete."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def _folder(self, key: str) -> Path:
        return self.root / key

    def remove(self, key: str) -> None:
        """Delete a key's files (all splits)."""
        shutil.rmtree(self._folder(key), ignore_errors=True)

    def has(self, key: str, split: str) -> bool:
        """Whether whole features of ``split`` are stored. Damaged ones (an unreadable index, a missing file or one of
        another size than written) are set aside as ``<key>.damaged`` with a one-line notice, and count as absent."""
        if not (self._folder(key) / f"{split}.json").exists():
            return False
        why = self._damage(key, split)
        if why is not None:
            set_aside(self._folder(key), f"{split}: {why}")
        return why is None

    def _damage(self, key: str, split: str) -> str | None:
        folder = self._folder(key)
        try:
            meta = json.loads((folder / f"{split}.json").read_text())
            shape = tuple(meta["shape"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            return f"its index {split}.json cannot be read ({error})"
        sizes = meta.get("bytes") or {f"{split}.values": 2 * math.prod(shape)}  # older folders: the values file
        for name, size in sizes.items():
            actual = (folder / name).stat().st_size if (folder / name).exists() else None
            if actual != size and size:
                return f"{name} has {actual} bytes where {size} were written" if actual is not None else f"no {name}"
        return None

    def load(self, key: str, split: str) -> RaggedRows:
        folder = self._folder(key)
        meta = json.loads((folder / f"{split}.json").read_text())
        shape = tuple(meta["shape"])
        values = torch.zeros(shape, dtype=torch.float16)
        if shape[0]:
            values = torch.from_numpy(np.memmap(folder / f"{split}.values", dtype=np.float16, mode="c", shape=shape))
        offsets = torch.from_numpy(np.load(folder / f"{split}.offsets.npy"))
        positions = torch.from_numpy(np.load(folder / f"{split}.positions.npy")) if meta["positions"] else None
        return RaggedRows(values, offsets, positions)

    def save(self, key: str, split: str, rows: RaggedRows) -> None:
        """Store features already in memory (:meth:`build`, copying them into the values file)."""
        def copy(allocate):
            values = allocate(tuple(rows.values.shape))
            values.copy_(rows.values)
            return RaggedRows(values, rows.offsets, rows.positions)

        self.build(key, split, copy)

    def build(self, key: str, split: str, compute) -> RaggedRows:
        """Features computed straight into the store, returned as loaded from it (:meth:`load`).

        ``compute(allocate)`` returns the :class:`RaggedRows`, its float16 values written into ``allocate(shape)``: a
        writable memory map of the values file, so the features are never held twice in memory (filled in memory and
        then saved, SST-2's 9.66 GiB of MPNet features needed 21 GB at the peak). Every file is written atomically
        (:func:`~papa_lib.core.artefacts.write_atomic`; the values under a temporary name until whole), the index
        with each file's size last: a split counts as stored only once whole.
        """
        folder = self._folder(key)
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{split}.values"
        held = {}

        def allocate(shape):
            if math.prod(shape) == 0:  # nothing to map
                return torch.empty(shape, dtype=torch.float16)
            fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
            os.close(fd)
            held["path"] = Path(name)
            held["array"] = np.memmap(name, dtype=np.float16, mode="w+", shape=tuple(shape))
            return torch.from_numpy(held["array"])

        try:
            rows = compute(allocate)
            if "array" in held:
                held.pop("array").flush()
                with open(held["path"], "rb+") as handle:
                    os.fsync(handle.fileno())
                os.replace(held.pop("path"), target)
        except BaseException:
            if "path" in held:
                held["path"].unlink(missing_ok=True)
            raise
        sizes = {target.name: target.stat().st_size} if rows.values.numel() else {}
        files = {f"{split}.offsets.npy": _npy(rows.offsets.numpy())}
        if rows.positions is not None:
            files[f"{split}.positions.npy"] = _npy(rows.positions.numpy())
        sizes |= {name: write_atomic(folder / name, write, sums=False).stat().st_size for name, write in files.items()}
        meta = {"shape": list(rows.values.shape), "positions": rows.positions is not None, "bytes": sizes}
        del rows
        write_atomic(folder / f"{split}.json", lambda tmp: tmp.write_text(json.dumps(meta)), sums=False)
        return self.load(key, split)


def _npy(array: np.ndarray):
    """A writer of ``array`` in .npy format into a given file (np.save on a name would add ``.npy`` to it)."""
    def write(path: Path) -> None:
        with open(path, "wb") as handle:
            np.save(handle, array)
    return write

