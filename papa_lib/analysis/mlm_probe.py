"""Masked-language-modelling (MLM) probing (paper Sec. 5.5, Fig. 6a; App. B Table 3 "MLM" row): data, masking,
the probe and its score.

The pieces :func:`papa_lib.analysis.mlm.run_mlm_curve` puts together. The authors' released code has an MLM probe
(all layers' vectors of a token concatenated, a linear layer to the hidden size, the model's activation (GELU for
BERT/RoBERTa), a decoder tied to the input embeddings with its own bias); ours keeps its input and tied decoder,
with the differences stated below (Probe), and the data, masking and scoring choices, which neither the paper nor
that code fix for our offline setting, are our own.

Data (:func:`load_mlm_corpus`, :func:`mlm_sequences`)
    * Hub (``data_dir=None``): the probe is trained on WikiText-103 *train* (``Salesforce/wikitext``, raw) and
      evaluated on WikiText-103 *validation*, the split of Fig. 6a. Because the train split has ~100M tokens,
      ``train_sequences=None`` means :data:`HUB_TRAIN_SEQUENCES_DEFAULT` sequences there.
    * Local (``data_dir`` laid out like ``/work/shared/data``): the token files of WikiText-103 when present,
      else WikiText-2 (:func:`papa_lib.experiments.tasks.load_wikitext`). No train file is available offline, so the
      probe is trained on ``wiki.valid.tokens`` and evaluated on ``wiki.test.tokens`` (a stand-in for the paper's
      setup).
      The tokenised files write unknown words as ``<unk>``; these become the tokenizer's own unknown token,
      which is special and therefore never masked or predicted.
    * Article lines (headings and blank lines dropped) are tokenised without special tokens, concatenated in
      file order and cut into consecutive chunks of ``L - (number of special tokens)`` tokens (``L = 128``,
      Table 3). Each chunk is laid out as ``[CLS] chunk [SEP]`` (or the tokenizer's equivalent), so the final
      separator sits at ``L - 1`` as the PAPA layout requires (App. A) and no sequence has padding. A trailing
      partial chunk is dropped. ``train_sequences`` / ``eval_sequences`` keep the *first* N chunks.

Masking (:func:`mask_tokens`)
    Per sequence, exactly ``round(0.15 * n)`` of its ``n`` real non-special tokens are selected (at least one),
    and each selected token is independently replaced by the mask token with probability 0.8, by a random token
    (uniform over the non-special ids of the tokenizer) with probability 0.1, or left unchanged with
    probability 0.1 (BERT's 80/10/10 recipe). A fixed count per sequence (rather than a Bernoulli draw per token)
    makes every full sequence carry the same number of targets, so the per-sequence and per-token averages of
    the score coincide. The random draws come from ``numpy.random.default_rng([mask_seed, sequence_index])``:
    the mask depends only on the seed and the sequence (its index and content), never on the model variant, so
    every fraction and every probe seed of a model is scored on exactly the same masked tokens.

Probe (:class:`MLMProbe`)
    Where it departs from the released code's MLM probe (one linear layer, GELU, tied decoder): it uses the token
    probe's tanh MLP and a layer norm before the tied decoder. Like the token probe of Sec. 3.3: a masked token's
    vectors from *all* hidden-state layers (embedding output
    included) are concatenated and fed to a 2-layer MLP (``Linear -> tanh -> Dropout(0.1) -> Linear``) whose
    output has the size of the model's input word embeddings. As in BERT's own MLM head, that output is
    layer-normalised (learned affine, initialised to the identity) so that its scale suits the embedding space
    from the first step (in a pilot on all-MiniLM-L6-v2 / WikiText-2, 400 training sequences, this raised the
    score from -6.73 to -6.48; initialising the bias to log unigram frequencies did not help and is not done).
    The decoder is *tied* to the input embeddings ``E`` and frozen, plus a trainable per-token output bias ``b``
    (initialised at 0): ``logits = LayerNorm(MLP(x)) @ E^T + b``. Tying keeps the probe small
    (an untied 30k x 384 decoder would dominate its parameters and could not be learned from a few thousand
    masked tokens) and works for every model, including ELECTRA's discriminator, which has no MLM head. Only the
    features of masked positions are ever needed, so only those are extracted and cached (float16), once per
    model variant, and reused across epochs. Training: AdamW at a constant learning rate, lr 5e-4, batches of 8
    sequences (all masked positions of 8 sequences), 2 epochs
    (Table 3, :data:`papa_lib.experiments.task_specs.MLM_HPARAMS`).
    The backbone stays frozen and in eval mode (no dropout inside it).

Score (:func:`sequence_log_probs`, :func:`neg_log_perplexity`)
    For each evaluation sequence, the mean log-probability of the *original* tokens at its masked positions;
    the reported value is the mean over sequences with a 95% Student-t interval
    (:func:`papa_lib.experiments.summaries.mean_ci`).
    This is the negative log perplexity (``log PPL = -mean log p``), so higher is better, 0 is perfect.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.layout import EncodedBatch, special_token_template
from ..core.models import base_encoder, model_inputs
from ..core.override import AttentionOverride
from ..experiments.probes import train_probe, two_layer_mlp
from ..experiments.sample_data import describe, is_sample
from ..experiments.summaries import mean_ci
from ..experiments.task_specs import MLM_HPARAMS
from ..experiments.tasks import load_wikitext

__all__ = [
    "MASK_PROBABILITY",
    "REPLACEMENT_SPLIT",
    "HUB_TRAIN_SEQUENCES_DEFAULT",
    "KIND_NONE",
    "KIND_MASK",
    "KIND_RANDOM",
    "KIND_UNCHANGED",
    "MaskedSequences",
    "MaskedFeatures",
    "MLMProbe",
    "load_mlm_corpus",
    "mlm_sequences",
    "mask_tokens",
    "extract_masked_features",
    "epoch_batches",
    "train_mlm_probe",
    "masked_token_log_probs",
    "sequence_log_probs",
    "neg_log_perplexity",
    "evaluate_mlm_probe",
]

#: Share of the real non-special tokens of each sequence that are selected as targets (BERT's 15%).
MASK_PROBABILITY = 0.15
#: How selected tokens are corrupted: (mask token, random token, unchanged).
REPLACEMENT_SPLIT = (0.8, 0.1, 0.1)
#: ``train_sequences=None`` on the hub means this many sequences of WikiText-103 train (it has ~800k).
HUB_TRAIN_SEQUENCES_DEFAULT = 4000

KIND_NONE, KIND_MASK, KIND_RANDOM, KIND_UNCHANGED = 0, 1, 2, 3


# ----------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------


def load_mlm_corpus(data_dir: str | Path | None = None) -> dict:
    """The probe's training and evaluation text lines, and a description of where they came from.

    Hub (``data_dir=None``): WikiText-103 train -> validation. Local: ``wiki.valid.tokens`` -> ``wiki.test.tokens``
    of ``data_dir/wikitext-103`` or, when absent, ``data_dir/wikitext-2``; the packaged sample
    (:mod:`papa_lib.experiments.sample_data`) is named as such, with the corpus id ``local-wikitext-2-sample``.

    Returns:
        ``{'train_lines', 'eval_lines', 'source' (human-readable), 'corpus' (stable id used in run ids),
        'hub' (bool), 'files' ({name: path} of the local files read; absent for the hub)}``.
    """
    if data_dir is None:
        train = load_wikitext("train", None, name="wikitext-103")
        evaluation = load_wikitext("validation", None, name="wikitext-103")
        return {
            "train_lines": train, "eval_lines": evaluation, "hub": True,
            "source": "hub:Salesforce/wikitext/wikitext-103-raw-v1 (probe: train, score: validation)",
            "corpus": "hub-wikitext-103:train->validation",
        }
    root = Path(data_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"MLM data folder {root} does not exist")
    corpus = "wikitext-103" if (root / "wikitext-103").is_dir() else "wikitext-2"
    train = load_wikitext("validation", root, name=corpus)
    evaluation = load_wikitext("test", root, name=corpus)
    sample = is_sample(root)  # the packaged sample: its own corpus id, so its runs never pass for full-file ones
    return {
        "train_lines": train, "eval_lines": evaluation, "hub": False,
        "files": {f"{describe(root / corpus / name).split(' (')[0]}": root / corpus / name
                  for name in ("wiki.valid.tokens", "wiki.test.tokens")},
        "source": f"{describe(root / corpus)} (probe: wiki.valid.tokens, score: wiki.test.tokens)",
        "corpus": f"local-{corpus}{'-sample' if sample else ''}:valid->test",
    }


def mlm_sequences(
    tokenizer, lines: Sequence[str], max_length: int = 128, limit: int | None = None, chunk_lines: int = 256
) -> EncodedBatch:
    """Concatenate the lines' tokens and cut them into full sequences of width ``max_length`` in the PAPA layout.

    Each sequence is ``prefix + chunk + suffix`` (e.g. ``[CLS] chunk [SEP]``) with ``len(chunk) = max_length -
    number of special tokens``; the final separator is at ``max_length - 1`` and there is no padding. A trailing
    partial chunk is dropped. ``limit`` keeps the first ``limit`` sequences (the lines are tokenised only as far as
    needed). ``<unk>`` in WikiText token files is mapped to the tokenizer's unknown token.

    Raises:
        ValueError: ``max_length`` leaves no room for text, a bad ``limit``, or the lines do not fill one sequence.
    """
    if isinstance(lines, str):
        raise TypeError("lines must be a sequence of strings, not one string")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1):
        raise ValueError(f"limit must be a positive integer or None, got {limit!r}")
    template = special_token_template(tokenizer)
    prefix, suffix = list(template.single_prefix), list(template.single_suffix)
    room = int(max_length) - len(prefix) - len(suffix)
    if room < 1:
        raise ValueError(
            f"max_length={max_length} leaves no room for text next to {len(prefix) + len(suffix)} special tokens"
        )
    unk = getattr(tokenizer, "unk_token", None)
    lines = [line.replace("<unk>", unk) for line in lines] if unk and unk != "<unk>" else list(lines)
    rows: list[list[int]] = []
    pending: list[int] = []
    for start in range(0, len(lines), chunk_lines):
        if limit is not None and len(rows) >= limit:
            break
        encoded = tokenizer(lines[start : start + chunk_lines], add_special_tokens=False, verbose=False)["input_ids"]
        for ids in encoded:
            pending.extend(ids)
        while len(pending) >= room and (limit is None or len(rows) < limit):
            rows.append(prefix + pending[:room] + suffix)
            pending = pending[room:]
    if not rows:
        raise ValueError(
            f"the text ({len(lines)} lines) does not fill a single sequence of {room} tokens at max_length={max_length}"
        )
    input_ids = torch.tensor(rows, dtype=torch.long)
    tensors = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    if template.uses_token_type_ids:
        tensors["token_type_ids"] = torch.full_like(input_ids, template.type_a)
    return EncodedBatch(tensors, layout="papa", max_length=int(max_length), num_truncated=0)


# ----------------------------------------------------------------------------------------------------------------
# Masking
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class MaskedSequences:
    """Sequences with some tokens corrupted for MLM, and what to predict.

    Attributes:
        inputs: the corrupted sequences (an :class:`EncodedBatch`: ``input_ids`` with masks/random tokens,
            ``attention_mask``, maybe ``token_type_ids``) — what the model sees.
        original_ids: ``[N, L]`` the uncorrupted ids.
        selected: ``[N, L]`` bool, True at the positions to predict.
        kinds: ``[N, L]`` int8: 0 not selected, 1 replaced by the mask token, 2 by a random token, 3 unchanged.
        seed: the masking seed.
    """

    inputs: EncodedBatch
    original_ids: Tensor
    selected: Tensor
    kinds: Tensor
    seed: int

    def __len__(self) -> int:
        return int(self.original_ids.shape[0])

    @property
    def num_targets(self) -> int:
        """Total number of masked (selected) positions."""
        return int(self.selected.sum())


def _special_ids(tokenizer) -> set[int]:
    ids = set(int(i) for i in getattr(tokenizer, "all_special_ids", []) if i is not None)
    template = special_token_template(tokenizer)
    ids.update(template.single_prefix + template.single_suffix + template.middle + (template.pad_id,))
    return ids


def mask_tokens(
    encoded: dict,
    tokenizer,
    seed: int = 0,
    mask_probability: float = MASK_PROBABILITY,
    replacement_split: Sequence[float] = REPLACEMENT_SPLIT,
    first_index: int = 0,
) -> MaskedSequences:
    """Select and corrupt MLM targets, deterministically from ``(seed, sequence index)`` (see the module docstring).

    Args:
        encoded: ``input_ids`` / ``attention_mask`` (/ ``token_type_ids``) ``[N, L]``, e.g. from :func:`mlm_sequences`.
        tokenizer: gives the mask token, the special ids (never selected, never used as random tokens) and the
            vocabulary size.
        seed: masking seed (non-negative).
        mask_probability: share of the real non-special tokens selected per sequence (``round``, at least 1).
        replacement_split: probabilities (mask token, random token, unchanged); must sum to 1.
        first_index: index of the first sequence in its corpus (the RNG of sequence ``i`` is seeded with
            ``[seed, first_index + i]``), so masking a slice gives the same result as masking the whole corpus.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if not 0.0 < float(mask_probability) <= 1.0:
        raise ValueError(f"mask_probability must be in (0, 1], got {mask_probability!r}")
    split = [float(p) for p in replacement_split]
    if len(split) != 3 or min(split) < 0 or not math.isclose(sum(split), 1.0, abs_tol=1e-9):
        raise ValueError(
            f"replacement_split must be three non-negative probabilities summing to 1, got {replacement_split!r}"
        )
    mask_id = getattr(tokenizer, "mask_token_id", None)
    if mask_id is None:
        raise ValueError(f"tokenizer {type(tokenizer).__name__} has no mask token; MLM needs one")
    special = _special_ids(tokenizer)
    vocabulary = np.array([i for i in range(len(tokenizer)) if i not in special], dtype=np.int64)
    if vocabulary.size == 0:
        raise ValueError("the tokenizer has no non-special tokens to draw random replacements from")
    input_ids = encoded["input_ids"]
    real = encoded["attention_mask"].bool()
    original = input_ids.clone()
    special_tensor = torch.tensor(sorted(special), dtype=input_ids.dtype)
    candidates = real & ~torch.isin(input_ids, special_tensor)
    corrupted = input_ids.clone()
    selected = torch.zeros_like(real)
    kinds = torch.zeros(input_ids.shape, dtype=torch.int8)
    for row in range(input_ids.shape[0]):
        positions = candidates[row].nonzero().flatten().numpy()
        if positions.size == 0:
            continue
        rng = np.random.default_rng([int(seed), int(first_index) + row])
        count = max(1, math.floor(float(mask_probability) * positions.size + 0.5))
        chosen = np.sort(rng.choice(positions, size=min(count, positions.size), replace=False))
        draws = rng.random(chosen.size)
        random_ids = vocabulary[rng.integers(0, vocabulary.size, size=chosen.size)]
        kind = np.where(draws < split[0], KIND_MASK, np.where(draws < split[0] + split[1], KIND_RANDOM, KIND_UNCHANGED))
        chosen_t = torch.from_numpy(chosen)
        selected[row, chosen_t] = True
        kinds[row, chosen_t] = torch.from_numpy(kind.astype(np.int8))
        new_ids = np.where(
            kind == KIND_MASK, mask_id, np.where(kind == KIND_RANDOM, random_ids, original[row, chosen_t].numpy())
        )
        corrupted[row, chosen_t] = torch.from_numpy(new_ids.astype(np.int64)).to(corrupted.dtype)
    tensors = {**encoded, "input_ids": corrupted}
    inputs = EncodedBatch(
        tensors, layout=getattr(encoded, "layout", "papa"), max_length=int(input_ids.shape[1]), num_truncated=0
    )
    return MaskedSequences(inputs, original, selected, kinds, int(seed))


# ----------------------------------------------------------------------------------------------------------------
# Features and the probe
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class MaskedFeatures:
    """Backbone features at the masked positions only.

    Attributes:
        features: ``[T, num_layers, D]`` float16 (all hidden-state layers, embeddings included) for the T targets.
        targets: ``[T]`` original token ids.
        sequence_index: ``[T]`` which sequence each target belongs to (0..N-1).
        num_sequences: N.
    """

    features: Tensor
    targets: Tensor
    sequence_index: Tensor
    num_sequences: int

    def rows_of(self, sequences: Tensor) -> Tensor:
        """Indices into ``features`` of every target of the given sequences (in the given sequence order)."""
        starts, counts = self._offsets
        return (
            torch.cat([torch.arange(starts[s], starts[s] + counts[s]) for s in sequences.tolist()])
            if len(sequences)
            else torch.empty(0, dtype=torch.long)
        )

    @cached_property
    def _offsets(self) -> tuple[list[int], list[int]]:
        """The first row and the number of rows of every sequence, computed once."""
        counts = torch.bincount(self.sequence_index, minlength=self.num_sequences)
        starts = torch.cumsum(counts, 0) - counts
        if not bool((self.sequence_index[1:] >= self.sequence_index[:-1]).all()):
            raise ValueError("MaskedFeatures rows must be grouped by sequence in ascending order")
        return starts.tolist(), counts.tolist()


def masked_batch_inputs(model, encoded: dict, index: Tensor | slice) -> dict:
    """The inputs of ``model`` for the sequences ``index`` of ``encoded`` (masked sequences, none padded): their
    tensors through :func:`papa_lib.core.models.model_inputs` (on the model's device, App. A position ids)."""
    return model_inputs(model, {key: value[index] for key, value in encoded.items() if isinstance(value, Tensor)})


def gather_layers(hidden_states: Sequence[Tensor], rows: Tensor, cols: Tensor) -> Tensor:
    """``[T, num_layers, D]``: every layer's vector at the (row, col) positions."""
    return torch.stack([layer[rows, cols] for layer in hidden_states], dim=1)


@torch.inference_mode()
def extract_masked_features(
    model, masked: MaskedSequences, batch_size: int = 8, state: AttentionOverride | None = None, progress: bool = False
) -> MaskedFeatures:
    """Run the frozen backbone (optionally under a PAPA override ``state``) and keep features at masked positions.

    The backbone is :func:`papa_lib.core.models.base_encoder` of ``model`` (an MLM head, if any, is not run).
    Features are stored on the CPU as float16.
    """
    from contextlib import nullcontext

    from tqdm.auto import tqdm

    encoder = base_encoder(model)
    device = next(encoder.parameters()).device
    chunks, targets, sequence_index = [], [], []
    context = state.applied(encoder) if state is not None else nullcontext()
    with context:
        starts = range(0, len(masked), batch_size)
        for start in tqdm(starts, disable=not progress, desc="features", unit="batch", leave=False):
            index = slice(start, start + batch_size)
            inputs = masked_batch_inputs(encoder, masked.inputs, index)
            outputs = encoder(**inputs, output_hidden_states=True)
            rows, cols = masked.selected[index].nonzero(as_tuple=True)
            chunks.append(
                gather_layers(outputs.hidden_states, rows.to(device), cols.to(device)).to("cpu", torch.float16)
            )
            targets.append(masked.original_ids[index][rows, cols])
            sequence_index.append(rows + start)
    return MaskedFeatures(torch.cat(chunks), torch.cat(targets), torch.cat(sequence_index), len(masked))


class MLMProbe(nn.Module):
    """The MLM probe: concatenated per-token layer vectors -> 2-layer MLP -> LayerNorm -> tied, frozen decoder + bias.

    ``logits = LayerNorm(MLP(concat_layers(x))) @ E^T + b`` where ``E`` ``[V, E_dim]`` is the model's input
    word-embedding matrix (a frozen buffer, not a parameter) and ``b`` ``[V]`` is learned (initialised at 0).

    Args:
        num_layers: hidden-state layers given to the probe (embeddings included).
        hidden_size: size D of each layer vector.
        embeddings: ``[V, E_dim]`` input word embeddings of the model (e.g. ``model.get_input_embeddings().weight``).
        mlp_hidden: width of the MLP's hidden layer (default ``hidden_size``).
        dropout, activation: as for :class:`papa_lib.experiments.probes.TokenProbe` (0.1, ``'tanh'``).
    """

    def __init__(
        self,
        num_layers: int,
        hidden_size: int,
        embeddings: Tensor,
        mlp_hidden: int | None = None,
        dropout: float = 0.1,
        activation: str = "tanh",
    ) -> None:
        super().__init__()
        if embeddings.dim() != 2:
            raise ValueError(f"embeddings must be [vocab, dim], got shape {tuple(embeddings.shape)}")
        if num_layers < 1 or hidden_size < 1:
            raise ValueError(f"num_layers and hidden_size must be positive, got {num_layers}, {hidden_size}")
        self.num_layers, self.hidden_size = int(num_layers), int(hidden_size)
        vocab, dim = embeddings.shape
        self.mlp = two_layer_mlp(
            self.num_layers * self.hidden_size, mlp_hidden or self.hidden_size, dim, activation, dropout
        )
        self.norm = nn.LayerNorm(dim)
        self.register_buffer("decoder_weight", embeddings.detach().to(torch.float32), persistent=False)
        self.bias = nn.Parameter(torch.zeros(vocab))

    @property
    def vocab_size(self) -> int:
        return int(self.decoder_weight.shape[0])

    def forward(self, features: Tensor) -> Tensor:
        """``features`` ``[..., num_layers, D]`` -> vocabulary logits ``[..., V]``."""
        if features.dim() < 2 or tuple(features.shape[-2:]) != (self.num_layers, self.hidden_size):
            raise ValueError(
                f"features must end in [num_layers={self.num_layers}, hidden={self.hidden_size}], "
                f"got {tuple(features.shape)}"
            )
        hidden = self.norm(self.mlp(features.to(device=self.bias.device, dtype=torch.float32).flatten(start_dim=-2)))
        return hidden @ self.decoder_weight.T + self.bias


def make_mlm_probe(model, num_layers: int) -> MLMProbe:
    """An :class:`MLMProbe` over ``num_layers`` hidden-state layers of ``model``, tied to its input embeddings."""
    encoder = base_encoder(model)
    embedding = encoder.get_input_embeddings()
    if embedding is None:
        raise ValueError(f"{type(model).__name__} exposes no input embeddings to tie the MLM probe's decoder to")
    return MLMProbe(num_layers, int(encoder.config.hidden_size), embedding.weight)


def epoch_batches(num_sequences: int, seed: int, epoch: int, batch_size: int):
    """The sequence indices of each batch of an epoch: a permutation seeded by ``(seed, epoch)`` cut into runs of
    ``batch_size``."""
    generator = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(epoch))
    order = torch.randperm(num_sequences, generator=generator)
    for start in range(0, len(order), batch_size):
        yield order[start : start + batch_size]


def train_mlm_probe(
    probe: MLMProbe,
    train: MaskedFeatures,
    *,
    seed: int = 0,
    epochs: int = int(MLM_HPARAMS["epochs"]),
    batch_size: int = int(MLM_HPARAMS["batch_size"]),
    lr: float = float(MLM_HPARAMS["learning_rate"]),
    device: str | torch.device = "cpu",
    progress: bool = False,
) -> list[float]:
    """Train ``probe`` on cached masked-position features (Table 3: lr 5e-4, batch 8 sequences, 2 epochs).

    Sequences are shuffled each epoch with a generator seeded by ``(seed, epoch)`` (:func:`epoch_batches`); call
    :func:`papa_lib.experiments.loop.set_seed` before building the probe for a reproducible initialisation. Returns
    the mean loss per epoch.
    """

    def batches(epoch: int):
        for index in epoch_batches(train.num_sequences, seed, epoch, batch_size):
            rows = train.rows_of(index)
            if len(rows):
                yield (train.features[rows],), train.targets[rows]

    return train_probe(probe, list(probe.parameters()), batches, epochs, lr, device=device, progress=progress)


# ----------------------------------------------------------------------------------------------------------------
# Scores
# ----------------------------------------------------------------------------------------------------------------


def masked_token_log_probs(logits: Tensor, targets: Tensor) -> Tensor:
    """``log softmax(logits)[target]`` per row: ``logits`` ``[T, V]``, ``targets`` ``[T]`` -> ``[T]`` float64."""
    if logits.dim() != 2 or targets.dim() != 1 or logits.shape[0] != targets.shape[0]:
        raise ValueError(
            f"expected logits [T, V] and targets [T], got {tuple(logits.shape)} and {tuple(targets.shape)}"
        )
    log_probs = F.log_softmax(logits.double(), dim=-1)
    return log_probs.gather(1, targets.long().to(logits.device)[:, None]).squeeze(1).cpu()


def sequence_log_probs(token_log_probs: Tensor, sequence_index: Tensor, num_sequences: int | None = None) -> Tensor:
    """Per-sequence mean of the masked tokens' log-probabilities; sequences without targets are left out."""
    token_log_probs = token_log_probs.double().cpu()
    sequence_index = sequence_index.long().cpu()
    if token_log_probs.shape != sequence_index.shape:
        raise ValueError("token_log_probs and sequence_index must have the same shape")
    size = (
        int(num_sequences) if num_sequences is not None else int(sequence_index.max()) + 1 if len(sequence_index) else 0
    )
    sums = torch.zeros(size, dtype=torch.float64).index_add_(0, sequence_index, token_log_probs)
    counts = torch.bincount(sequence_index, minlength=size)
    keep = counts > 0
    return sums[keep] / counts[keep]


def neg_log_perplexity(per_sequence: Tensor | Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """``(mean, ci_low, ci_high)``: mean per-sequence log-probability with its Student-t interval (higher is better)."""
    values = torch.as_tensor(per_sequence, dtype=torch.float64).flatten().tolist()
    return mean_ci(values, confidence)


@torch.no_grad()
def evaluate_mlm_probe(probe: MLMProbe, evaluation: MaskedFeatures, device="cpu", chunk: int = 1024) -> dict:
    """Score a trained probe: ``{'value', 'ci_low', 'ci_high', 'masked_accuracy', 'per_sequence'}``."""
    probe.to(device)
    was_training = probe.training
    probe.eval()
    log_probs, correct = [], 0
    try:
        for start in range(0, len(evaluation.targets), chunk):
            logits = probe(evaluation.features[start : start + chunk].to(device))
            targets = evaluation.targets[start : start + chunk]
            log_probs.append(masked_token_log_probs(logits, targets))
            correct += int((logits.argmax(-1).cpu() == targets).sum())
    finally:
        probe.train(was_training)
    per_sequence = sequence_log_probs(torch.cat(log_probs), evaluation.sequence_index, evaluation.num_sequences)
    mean, low, high = neg_log_perplexity(per_sequence)
    return {
        "value": mean, "ci_low": low, "ci_high": high,
        "masked_accuracy": correct / max(1, len(evaluation.targets)), "per_sequence": per_sequence,
    }
