"""Masked-language-modelling (MLM) probing with PAPA (paper Sec. 5.5, Fig. 6a; App. B Table 3 "MLM" row).

Sec. 5.5 reports the *negative log perplexity* (higher is better) of BASE models on the WikiText-103 validation
set as more and more heads are replaced by constant matrices, and contrasts MLM-pretrained models with ELECTRA's
discriminator, which was never trained to fill in masked tokens. The paper's released code has no MLM
experiment, so everything below is our own design; each choice is stated here.

Data (:func:`load_mlm_corpus`, :func:`mlm_sequences`)
    * Hub (``data_dir=None``): the probe is trained on WikiText-103 *train* (``Salesforce/wikitext``, raw) and
      evaluated on WikiText-103 *validation*, the split of Fig. 6a. Because the train split has ~100M tokens,
      ``train_sequences=None`` means :data:`HUB_TRAIN_SEQUENCES_DEFAULT` sequences there.
    * Local (``data_dir`` laid out like ``/work/shared/data``): the token files of WikiText-103 when present,
      else WikiText-2 (:func:`papa_lib.tasks.load_wikitext`). No train file is available offline, so the probe is
      trained on ``wiki.valid.tokens`` and evaluated on ``wiki.test.tokens`` (a stand-in for the paper's setup).
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
    Like the token probe of Sec. 3.3: a masked token's vectors from *all* hidden-state layers (embedding output
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
    sequences (all masked positions of 8 sequences), 2 epochs (Table 3, :data:`papa_lib.tasks.MLM_HPARAMS`).
    The backbone stays frozen and in eval mode (no dropout inside it).

Score (:func:`sequence_log_probs`, :func:`neg_log_perplexity`)
    For each evaluation sequence, the mean log-probability of the *original* tokens at its masked positions;
    the reported value is the mean over sequences with a 95% Student-t interval (:func:`papa_lib.results.mean_ci`).
    This is the negative log perplexity (``log PPL = -mean log p``), so higher is better, 0 is perfect.

Curve (:func:`run_mlm_curve`)
    1. Constant matrices C^h are averaged (Sec. 3.1, :func:`papa_lib.average_attention`) over the masked
       training sequences, i.e. over the inputs the model actually sees in this task.
    2. λ^h (Sec. 3.2, Eq. 3): the MLM probe is trained jointly with every head in ``mix`` mode, θ in the same
       AdamW optimiser as the probe, on the training sequences, with the probe's hyperparameters
       (:func:`learn_mlm_lambdas`). Heads with the smallest λ are replaced first
       (:func:`papa_lib.selection.heads_to_replace`, order ``'lambda'``). λ is learned once per seed, and only
       when some fraction strictly between 0 and 1 still has to run.
    3. For each fraction of input-dependent heads in {1, 1/2, 1/8, 1/16, 0}: the other heads run their constant
       matrix, the backbone's features are extracted, a fresh probe is trained and evaluated.
    4. Where the model carries a *pretrained* MLM head (load with ``load_encoder(name, with_mlm_head=True)``),
       that head's score on the same masked evaluation tokens is reported once as a reference
       (``matrix_type='pretrained_head'``, fraction 1). A head that ``transformers`` had to initialise because
       the checkpoint lacks it (e.g. the embedded all-MiniLM-L6-v2, a sentence encoder) is detected by
       :func:`mlm_head_status` and reported as unavailable instead of scoring random weights.

Reading the results (the book's chapter on Sec. 5.5)
    :func:`load_mlm_results` reads a profile's MLM store (:data:`MLM_RESULT_FOLDERS`), :func:`mlm_curves` turns it
    into Fig. 6a's points, :func:`mlm_drops` into the two numbers Sec. 5.5 discusses (the score with every head
    input-dependent, and how much it loses with every head constant), and :func:`paper_mlm_reference` gives the
    paper's values of those numbers. :func:`run_profile_mlm_curve` runs a curve at a profile's size
    (:data:`MLM_PROFILE_SETTINGS`); :func:`run_mnli_curve` runs Fig. 6b's MNLI curve, which is the ``fig2`` block of
    the profile's grid restricted to MNLI (:func:`mnli_curve_spec`), so its runs are Fig. 2's runs.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .averaging import ConstantAttention, average_attention
from .layout import EncodedBatch, batched, special_token_template
from .models import base_encoder, model_id, num_layers_and_heads
from .override import AttentionOverride
from .probes import _two_layer_mlp, set_seed, train_probe
from .results import ResultsStore, config_hash, mean_ci, package_versions
from .selection import PAPER_FRACTIONS, heads_to_replace
from .tasks import MLM_HPARAMS, load_wikitext

__all__ = [
    "MASK_PROBABILITY",
    "REPLACEMENT_SPLIT",
    "HUB_TRAIN_SEQUENCES_DEFAULT",
    "MaskedSequences",
    "MaskedFeatures",
    "MLMProbe",
    "load_mlm_corpus",
    "mlm_sequences",
    "mask_tokens",
    "extract_masked_features",
    "train_mlm_probe",
    "masked_token_log_probs",
    "sequence_log_probs",
    "neg_log_perplexity",
    "evaluate_mlm_probe",
    "learn_mlm_lambdas",
    "mlm_head_status",
    "pretrained_head_log_probs",
    "run_mlm_curve",
    "MLM_RESULT_FOLDERS",
    "MLM_PROFILE_SETTINGS",
    "FIG6_MODELS",
    "PRETRAINING_OBJECTIVES",
    "pretraining_objective",
    "short_model_name",
    "load_mlm_results",
    "load_mlm_lambdas",
    "mlm_curves",
    "mlm_drops",
    "mlm_reference_scores",
    "paper_mlm_reference",
    "mnli_curve_spec",
    "run_profile_mlm_curve",
    "run_mnli_curve",
]

#: Share of the real non-special tokens of each sequence that are selected as targets (BERT's 15%).
MASK_PROBABILITY = 0.15
#: How selected tokens are corrupted: (mask token, random token, unchanged).
REPLACEMENT_SPLIT = (0.8, 0.1, 0.1)
#: ``train_sequences=None`` on the hub means this many sequences of WikiText-103 train (it has ~800k).
HUB_TRAIN_SEQUENCES_DEFAULT = 4000
#: Bumped whenever the experiment's design changes, so stored results of an older design are not reused.
MLM_DESIGN_VERSION = "mlm-v1"

KIND_NONE, KIND_MASK, KIND_RANDOM, KIND_UNCHANGED = 0, 1, 2, 3


# ----------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------


def load_mlm_corpus(data_dir: str | Path | None = None) -> dict:
    """The probe's training and evaluation text lines, and a description of where they came from.

    Hub (``data_dir=None``): WikiText-103 train -> validation. Local: ``wiki.valid.tokens`` -> ``wiki.test.tokens``
    of ``data_dir/wikitext-103`` or, when absent, ``data_dir/wikitext-2``.

    Returns:
        ``{'train_lines', 'eval_lines', 'source' (human-readable), 'corpus' (stable id used in run ids),
        'hub' (bool)}``.
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
    return {
        "train_lines": train, "eval_lines": evaluation, "hub": False,
        "source": f"{root / corpus} (probe: wiki.valid.tokens, score: wiki.test.tokens)",
        "corpus": f"local-{corpus}:valid->test",
    }


def _replace_unk(lines: Iterable[str], tokenizer) -> Iterable[str]:
    unk = getattr(tokenizer, "unk_token", None)
    if not unk or unk == "<unk>":
        yield from lines
        return
    for line in lines:
        yield line.replace("<unk>", unk)


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
        raise ValueError(f"max_length={max_length} leaves no room for text next to {len(prefix) + len(suffix)} special tokens")
    lines = list(_replace_unk(lines, tokenizer))
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
        raise ValueError(f"replacement_split must be three non-negative probabilities summing to 1, got {replacement_split!r}")
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
        new_ids = np.where(kind == KIND_MASK, mask_id, np.where(kind == KIND_RANDOM, random_ids, original[row, chosen_t].numpy()))
        corrupted[row, chosen_t] = torch.from_numpy(new_ids.astype(np.int64)).to(corrupted.dtype)
    tensors = {k: v for k, v in encoded.items()}
    tensors["input_ids"] = corrupted
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
        starts, counts = self._offsets()
        return torch.cat([torch.arange(starts[s], starts[s] + counts[s]) for s in sequences.tolist()]) if len(sequences) else torch.empty(0, dtype=torch.long)

    def _offsets(self):
        cached = getattr(self, "_cached_offsets", None)
        if cached is None:
            counts = torch.bincount(self.sequence_index, minlength=self.num_sequences)
            starts = torch.cumsum(counts, 0) - counts
            if not bool((self.sequence_index[1:] >= self.sequence_index[:-1]).all()):
                raise ValueError("MaskedFeatures rows must be grouped by sequence in ascending order")
            cached = (starts.tolist(), counts.tolist())
            self._cached_offsets = cached
        return cached


def _model_inputs(encoded: dict, index: Tensor | slice, device, uses_token_type_ids: bool) -> dict:
    out = {"input_ids": encoded["input_ids"][index].to(device), "attention_mask": encoded["attention_mask"][index].to(device)}
    if uses_token_type_ids and encoded.get("token_type_ids") is not None:
        out["token_type_ids"] = encoded["token_type_ids"][index].to(device)
    return out


def _uses_token_type_ids(model) -> bool:
    from .models import adapter_for

    return adapter_for(model).uses_token_type_ids


def _gather_layers(hidden_states: Sequence[Tensor], rows: Tensor, cols: Tensor) -> Tensor:
    """``[T, num_layers, D]``: every layer's vector at the (row, col) positions."""
    return torch.stack([layer[rows, cols] for layer in hidden_states], dim=1)


@torch.inference_mode()
def extract_masked_features(
    model, masked: MaskedSequences, batch_size: int = 8, state: AttentionOverride | None = None, progress: bool = False
) -> MaskedFeatures:
    """Run the frozen backbone (optionally under a PAPA override ``state``) and keep features at masked positions.

    The backbone is :func:`papa_lib.models.base_encoder` of ``model`` (an MLM head, if any, is not run).
    Features are stored on the CPU as float16.
    """
    from contextlib import nullcontext

    from tqdm.auto import tqdm

    encoder = base_encoder(model)
    device = next(encoder.parameters()).device
    uses_types = _uses_token_type_ids(encoder)
    chunks, targets, sequence_index = [], [], []
    context = state.applied(encoder) if state is not None else nullcontext()
    with context:
        starts = range(0, len(masked), batch_size)
        for start in tqdm(starts, disable=not progress, desc="features", unit="batch", leave=False):
            index = slice(start, start + batch_size)
            outputs = encoder(**_model_inputs(masked.inputs, index, device, uses_types), output_hidden_states=True)
            rows, cols = masked.selected[index].nonzero(as_tuple=True)
            chunks.append(_gather_layers(outputs.hidden_states, rows.to(device), cols.to(device)).to("cpu", torch.float16))
            targets.append(masked.original_ids[index][rows, cols])
            sequence_index.append(rows + start)
    return MaskedFeatures(torch.cat(chunks), torch.cat(targets), torch.cat(sequence_index), len(masked))


class MLMProbe(nn.Module):
    """The MLM probe: concatenated per-token layer vectors -> 2-layer MLP -> LayerNorm -> tied, frozen decoder + bias.

    ``logits = LayerNorm(MLP(concat_layers(x))) @ E^T + b`` where ``E`` ``[V, E_dim]`` is the model's input word-embedding matrix
    (a frozen buffer, not a parameter) and ``b`` ``[V]`` is learned (initialised at 0).

    Args:
        num_layers: hidden-state layers given to the probe (embeddings included).
        hidden_size: size D of each layer vector.
        embeddings: ``[V, E_dim]`` input word embeddings of the model (e.g. ``model.get_input_embeddings().weight``).
        mlp_hidden: width of the MLP's hidden layer (default ``hidden_size``).
        dropout, activation: as for :class:`papa_lib.probes.TokenProbe` (0.1, ``'tanh'``).
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
        self.mlp = _two_layer_mlp(self.num_layers * self.hidden_size, mlp_hidden or self.hidden_size, dim, activation, dropout)
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
                f"features must end in [num_layers={self.num_layers}, hidden={self.hidden_size}], got {tuple(features.shape)}"
            )
        hidden = self.norm(self.mlp(features.to(device=self.bias.device, dtype=torch.float32).flatten(start_dim=-2)))
        return hidden @ self.decoder_weight.T + self.bias


def _input_embeddings(model) -> Tensor:
    embedding = base_encoder(model).get_input_embeddings()
    if embedding is None:
        raise ValueError(f"{type(model).__name__} exposes no input embeddings to tie the MLM probe's decoder to")
    return embedding.weight


def _make_probe(model, num_layers: int) -> MLMProbe:
    encoder = base_encoder(model)
    return MLMProbe(num_layers, int(encoder.config.hidden_size), _input_embeddings(model))


def _epoch_order(num_sequences: int, seed: int, epoch: int) -> Tensor:
    generator = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(epoch))
    return torch.randperm(num_sequences, generator=generator)


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

    Sequences are shuffled each epoch with a generator seeded by ``(seed, epoch)``; call
    :func:`papa_lib.probes.set_seed` before building the probe for a reproducible initialisation. Returns the mean
    loss per epoch.
    """

    def batches(epoch: int):
        order = _epoch_order(train.num_sequences, seed, epoch)
        for start in range(0, len(order), batch_size):
            rows = train.rows_of(order[start : start + batch_size])
            if len(rows):
                yield (train.features[rows],), train.targets[rows]

    return train_probe(probe, list(probe.parameters()), batches, epochs, lr, device=device, progress=progress)


# ----------------------------------------------------------------------------------------------------------------
# Scores
# ----------------------------------------------------------------------------------------------------------------


def masked_token_log_probs(logits: Tensor, targets: Tensor) -> Tensor:
    """``log softmax(logits)[target]`` per row: ``logits`` ``[T, V]``, ``targets`` ``[T]`` -> ``[T]`` float64."""
    if logits.dim() != 2 or targets.dim() != 1 or logits.shape[0] != targets.shape[0]:
        raise ValueError(f"expected logits [T, V] and targets [T], got {tuple(logits.shape)} and {tuple(targets.shape)}")
    log_probs = F.log_softmax(logits.double(), dim=-1)
    return log_probs.gather(1, targets.long().to(logits.device)[:, None]).squeeze(1).cpu()


def sequence_log_probs(token_log_probs: Tensor, sequence_index: Tensor, num_sequences: int | None = None) -> Tensor:
    """Per-sequence mean of the masked tokens' log-probabilities; sequences without targets are left out."""
    token_log_probs = token_log_probs.double().cpu()
    sequence_index = sequence_index.long().cpu()
    if token_log_probs.shape != sequence_index.shape:
        raise ValueError("token_log_probs and sequence_index must have the same shape")
    size = int(num_sequences) if num_sequences is not None else int(sequence_index.max()) + 1 if len(sequence_index) else 0
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


# ----------------------------------------------------------------------------------------------------------------
# λ (Sec. 3.2) for MLM
# ----------------------------------------------------------------------------------------------------------------


class _JointMLM(nn.Module):
    """Frozen backbone (under a ``mix`` override) + MLM probe, trained together so θ gets gradients."""

    def __init__(self, encoder: nn.Module, probe: MLMProbe, state: AttentionOverride):
        super().__init__()
        self.encoder = encoder
        self.probe = probe
        self.state = state

    def train(self, mode: bool = True):
        super().train(mode)
        self.encoder.eval()  # the backbone is frozen: no dropout inside it
        return self

    def forward(self, inputs: dict, rows: Tensor, cols: Tensor) -> Tensor:
        with self.state.applied(self.encoder):
            outputs = self.encoder(**inputs, output_hidden_states=True)
        return self.probe(_gather_layers(outputs.hidden_states, rows, cols))


def learn_mlm_lambdas(
    model,
    train: MaskedSequences,
    constants: ConstantAttention,
    *,
    seed: int = 0,
    epochs: int = int(MLM_HPARAMS["epochs"]),
    batch_size: int = int(MLM_HPARAMS["batch_size"]),
    lr: float = float(MLM_HPARAMS["learning_rate"]),
    device: str | torch.device = "cpu",
    progress: bool = False,
) -> Tensor:
    """Learn λ^h = σ(θ^h) for MLM: every head mixes ``λ A + (1-λ) C`` (Eq. 3) while an MLM probe is trained with it.

    θ and the probe's parameters share one AdamW optimiser (Table 3 hyperparameters); the backbone's own weights
    stay frozen (their ``requires_grad`` is switched off for the duration and restored). Returns λ
    ``[layers, heads]`` on the CPU.
    """
    encoder = base_encoder(model)
    layers, _ = num_layers_and_heads(encoder)
    set_seed(seed)
    probe = _make_probe(model, layers + 1)
    state = AttentionOverride(encoder, constants, "all", "mix")
    joint = _JointMLM(encoder, probe, state)
    uses_types = _uses_token_type_ids(encoder)
    encoder_device = next(encoder.parameters()).device

    def batches(epoch: int):
        order = _epoch_order(len(train), seed, epoch)
        for start in range(0, len(order), batch_size):
            index = order[start : start + batch_size]
            rows, cols = train.selected[index].nonzero(as_tuple=True)
            if len(rows) == 0:
                continue
            inputs = _model_inputs(train.inputs, index, encoder_device, uses_types)
            targets = train.original_ids[index][rows, cols]
            yield (inputs, rows.to(encoder_device), cols.to(encoder_device)), targets

    flags = [(p, p.requires_grad) for p in encoder.parameters()]
    for parameter, _ in flags:
        parameter.requires_grad_(False)
    try:
        params = list(probe.parameters()) + state.trainable_parameters()
        train_probe(joint, params, batches, epochs, lr, device=device, progress=progress)
    finally:
        for parameter, flag in flags:
            parameter.requires_grad_(flag)
        joint.eval()
    return state.lambdas()


# ----------------------------------------------------------------------------------------------------------------
# The pretrained MLM head (reference)
# ----------------------------------------------------------------------------------------------------------------


def _head_parameters(model) -> list[tuple[str, nn.Parameter]]:
    """Parameters of ``model`` outside its base encoder and not shared with the input embeddings."""
    encoder = base_encoder(model)
    if encoder is model:
        return []
    inside = {id(p) for p in encoder.parameters()}
    return [(name, p) for name, p in model.named_parameters(remove_duplicate=False) if id(p) not in inside]


def mlm_head_status(model) -> tuple[bool, str]:
    """Whether ``model`` carries a usable *pretrained* MLM head, and why (not).

    A model from ``load_encoder(name, with_mlm_head=True)`` always has a head, but ``transformers`` silently
    creates one with fresh weights when the checkpoint has none (e.g. the embedded all-MiniLM-L6-v2, or an ELECTRA
    discriminator loaded as ``ElectraForMaskedLM``). Detection, in order:

    1. ``model.papa_mlm_head_pretrained`` (bool), when a loader set it explicitly;
    2. ``model.papa_missing_keys`` (the ``missing_keys`` of ``from_pretrained(..., output_loading_info=True)``), when
       present: the head is pretrained iff none of its parameters is missing;
    3. otherwise the weights themselves: a freshly initialised head has every 1-D parameter (biases, LayerNorm
       weights and biases) exactly all-zero or all-one, which a trained head never has.
    """
    output_embeddings = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if output_embeddings is None:
        return False, f"{type(model).__name__} has no MLM head (load it with load_encoder(..., with_mlm_head=True))"
    head = _head_parameters(model)
    if not head:
        return False, f"{type(model).__name__} has no MLM head parameters"
    explicit = getattr(model, "papa_mlm_head_pretrained", None)
    if explicit is not None:
        return (True, "marked pretrained") if explicit else (False, "marked as not pretrained")
    missing = getattr(model, "papa_missing_keys", None)
    if missing is not None:
        names = {name for name, _ in head}
        lacking = sorted(k for k in missing if k in names)
        if lacking:
            return False, f"the checkpoint has no MLM head weights ({', '.join(lacking[:3])}...): newly initialised"
        return True, "loaded from the checkpoint"
    vectors = [(name, p) for name, p in head if p.dim() == 1]
    if vectors and all(bool((p == 0).all()) or bool((p == 1).all()) for _, p in vectors):
        return False, "the MLM head looks freshly initialised (all biases 0, LayerNorm 1/0): the checkpoint has none"
    return True, "MLM head weights look trained"


@torch.inference_mode()
def pretrained_head_log_probs(model, masked: MaskedSequences, batch_size: int = 8) -> Tensor:
    """Per-sequence mean log-probability of the original tokens under the model's own MLM head (original attention)."""
    device = next(model.parameters()).device
    uses_types = _uses_token_type_ids(model)
    token_log_probs, sequence_index = [], []
    for start in range(0, len(masked), batch_size):
        index = slice(start, start + batch_size)
        logits = model(**_model_inputs(masked.inputs, index, device, uses_types)).logits
        rows, cols = masked.selected[index].nonzero(as_tuple=True)
        token_log_probs.append(masked_token_log_probs(logits[rows.to(device), cols.to(device)], masked.original_ids[index][rows, cols]))
        sequence_index.append(rows + start)
    return sequence_log_probs(torch.cat(token_log_probs), torch.cat(sequence_index), len(masked))


# ----------------------------------------------------------------------------------------------------------------
# The curve
# ----------------------------------------------------------------------------------------------------------------


def _lambda_file(results_dir: Path) -> Path:
    return results_dir / "mlm_lambdas.json"


def _read_lambdas(results_dir: Path | None, key: str) -> Tensor | None:
    if results_dir is None or not _lambda_file(results_dir).is_file():
        return None
    stored = json.loads(_lambda_file(results_dir).read_text(encoding="utf-8"))
    entry = stored.get(key)
    return torch.tensor(entry["lambdas"]) if entry else None


def _write_lambdas(results_dir: Path | None, key: str, entry: dict) -> None:
    if results_dir is None:
        return
    path = _lambda_file(results_dir)
    stored = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    stored[key] = entry
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)


def run_mlm_curve(
    model,
    tokenizer,
    data_dir: str | Path | None = None,
    fractions: Sequence[float] = PAPER_FRACTIONS,
    seeds: Sequence[int] = (0,),
    max_length: int = int(MLM_HPARAMS["max_length"]),
    train_sequences: int | None = None,
    eval_sequences: int | None = None,
    epochs: int = int(MLM_HPARAMS["epochs"]),
    batch_size: int = int(MLM_HPARAMS["batch_size"]),
    lr: float = float(MLM_HPARAMS["learning_rate"]),
    device: str | torch.device = "cpu",
    results_dir: str | Path | None = None,
    progress: bool = True,
    *,
    mask_seed: int = 0,
    mask_probability: float = MASK_PROBABILITY,
) -> pd.DataFrame:
    """The MLM curve of Fig. 6a: negative log perplexity vs the fraction of input-dependent heads.

    See the module docstring for the design. ``model`` is a bare encoder or an MLM model (then its pretrained head,
    when it has one, is also scored once as a reference). The model is moved to ``device``.

    Returns:
        One row per ``fraction x seed`` (``matrix_type='average'``, ``selection_order='lambda'``, ``value`` =
        negative log perplexity, ``ci_low``/``ci_high`` its 95% interval over evaluation sequences, plus
        ``masked_accuracy``, ``num_replaced_heads``, target counts and the final training loss), and one
        ``matrix_type='pretrained_head'`` row where a pretrained head exists. With ``results_dir`` every record is
        appended to ``ResultsStore(results_dir)`` (task ``'mlm'``, metric ``'neg_log_perplexity'``) and runs whose
        ``run_id`` is already stored are not recomputed (their stored record is returned); the learned λ per seed
        go to ``results_dir/mlm_lambdas.json``.
    """
    from tqdm.auto import tqdm

    if not fractions:
        raise ValueError("fractions is empty")
    if not seeds:
        raise ValueError("seeds is empty")
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ValueError(f"seeds must be integers, got {seed!r}")
    model.to(device)
    model.eval()
    encoder = base_encoder(model)
    num_layers, num_heads = num_layers_and_heads(encoder)
    store = ResultsStore(results_dir) if results_dir is not None else None
    results_path = Path(results_dir) if results_dir is not None else None
    name = model_id(model)

    corpus = load_mlm_corpus(data_dir)
    if train_sequences is None and corpus["hub"]:
        train_sequences = HUB_TRAIN_SEQUENCES_DEFAULT
    base_config = {
        "design": MLM_DESIGN_VERSION, "model": name, "task": "mlm", "corpus": corpus["corpus"],
        "max_length": int(max_length), "train_sequences": train_sequences, "eval_sequences": eval_sequences,
        "epochs": int(epochs), "batch_size": int(batch_size), "lr": float(lr), "mask_seed": int(mask_seed),
        "mask_probability": float(mask_probability), "probe": "concat-layers-mlp-tied-decoder",
    }

    def run_config(fraction: float, seed: int, matrix_type: str, order: str | None) -> dict:
        return {**base_config, "fraction": float(fraction), "seed": int(seed), "matrix_type": matrix_type,
                "selection_order": order}

    curve_ids = {(float(f), int(s)): config_hash(run_config(f, s, "average", "lambda")) for s in seeds for f in fractions}
    head_id = config_hash(run_config(1.0, mask_seed, "pretrained_head", None))
    head_available, head_reason = mlm_head_status(model)
    stored = (lambda run_id: store is not None and store.has(run_id))
    records: dict[str, dict] = {}
    for run_id in [*curve_ids.values(), head_id]:
        if stored(run_id):
            records[run_id] = store.get(run_id)
    pending_curve = [key for key, run_id in curve_ids.items() if run_id not in records]
    pending_head = head_available and head_id not in records
    if not head_available and progress:
        print(f"[mlm] pretrained MLM head not scored: {head_reason}")

    if pending_curve or pending_head:
        train_encoded = mlm_sequences(tokenizer, corpus["train_lines"], max_length, train_sequences)
        eval_encoded = mlm_sequences(tokenizer, corpus["eval_lines"], max_length, eval_sequences)
        train_masked = mask_tokens(train_encoded, tokenizer, mask_seed, mask_probability)
        # mask_seed + 1 for the evaluation corpus, so its sequence i is not masked at the same offsets as train's i.
        eval_masked = mask_tokens(eval_encoded, tokenizer, mask_seed + 1, mask_probability)
        common = {
            "model": name, "task": "mlm", "metric": "neg_log_perplexity", "eval_size": len(eval_masked),
            "train_size": len(train_masked), "profile": None, "data_source": corpus["source"],
            "versions": package_versions(), "device": str(device),
            "eval_targets": eval_masked.num_targets, "train_targets": train_masked.num_targets,
        }

    if pending_head:
        started = time.time()
        per_sequence = pretrained_head_log_probs(model, eval_masked, batch_size)
        mean, low, high = neg_log_perplexity(per_sequence)
        records[head_id] = {
            **common, "run_id": head_id, "matrix_type": "pretrained_head", "matrices_from": None,
            "selection_order": None, "fraction": 1.0, "seed": int(mask_seed), "value": mean, "ci_low": low,
            "ci_high": high, "config_hash": head_id, "wall_time_s": time.time() - started, "num_replaced_heads": 0,
        }
        if store is not None:
            store.append(records[head_id])

    if pending_curve:
        constants = None
        feature_cache: dict[tuple, tuple[MaskedFeatures, MaskedFeatures]] = {}
        everything = tuple((l, h) for l in range(num_layers) for h in range(num_heads))

        def features_for(heads: list[tuple[int, int]]):
            key = tuple(sorted(heads))
            if key not in feature_cache:
                state = AttentionOverride(encoder, constants, list(key), "constant") if key else None
                pair = (extract_masked_features(encoder, train_masked, batch_size, state, progress),
                        extract_masked_features(encoder, eval_masked, batch_size, state, progress))
                # Only the original model and the fully constant one recur across seeds; keep just those.
                for old in [k for k in feature_cache if k not in ((), everything)]:
                    del feature_cache[old]
                feature_cache[key] = pair
            return feature_cache[key]

        bar = tqdm(total=len(pending_curve), disable=not progress, desc="mlm curve", unit="run")
        for seed in seeds:
            todo = [f for (f, s) in pending_curve if s == int(seed)]
            if not todo:
                continue
            if constants is None and any(f < 1.0 for f in todo):
                constants = average_attention(
                    encoder, batched(train_masked.inputs, batch_size),
                    progress=False, source=f"{corpus['source']} (masked MLM training sequences)",
                )
            lambdas = None
            if any(0.0 < f < 1.0 for f in todo):
                lambda_key = config_hash({**base_config, "seed": int(seed), "what": "lambdas"})
                lambdas = _read_lambdas(results_path, lambda_key)
                if lambdas is None:
                    started = time.time()
                    lambdas = learn_mlm_lambdas(model, train_masked, constants, seed=int(seed), epochs=epochs,
                                                batch_size=batch_size, lr=lr, device=device, progress=False)
                    _write_lambdas(results_path, lambda_key, {
                        "model": name, "seed": int(seed), "corpus": corpus["corpus"], "lambdas": lambdas.tolist(),
                        "seconds": round(time.time() - started, 1),
                    })
            for fraction in todo:
                started = time.time()
                heads = heads_to_replace("lambda", fraction, num_layers, num_heads,
                                         lambdas=lambdas if lambdas is not None else torch.zeros(num_layers, num_heads))
                train_features, eval_features = features_for(heads)
                set_seed(int(seed))
                probe = _make_probe(model, num_layers + 1)
                losses = train_mlm_probe(probe, train_features, seed=int(seed), epochs=epochs, batch_size=batch_size,
                                         lr=lr, device=device)
                scores = evaluate_mlm_probe(probe, eval_features, device)
                run_id = curve_ids[(float(fraction), int(seed))]
                records[run_id] = {
                    **common, "run_id": run_id, "matrix_type": "average", "matrices_from": "mlm_train",
                    "selection_order": "lambda", "fraction": float(fraction), "seed": int(seed),
                    "value": scores["value"], "ci_low": scores["ci_low"], "ci_high": scores["ci_high"],
                    "masked_accuracy": scores["masked_accuracy"], "num_replaced_heads": len(heads),
                    "final_train_loss": losses[-1] if losses else float("nan"),
                    "config_hash": run_id, "wall_time_s": time.time() - started,
                }
                if store is not None:
                    store.append(records[run_id])
                bar.update(1)
        bar.close()

    order = [*curve_ids.values()] + ([head_id] if head_id in records else [])
    return pd.DataFrame([records[run_id] for run_id in order if run_id in records])


# ----------------------------------------------------------------------------------------------------------------
# Reading the results: Fig. 6 and the numbers of Sec. 5.5
# ----------------------------------------------------------------------------------------------------------------

#: Where each profile keeps its MLM results store (relative to the repository root).
MLM_RESULT_FOLDERS = {"smoke": "runs/smoke/mlm", "local": "data/results/mlm", "paper": "data/results/paper/mlm"}

#: :func:`run_mlm_curve` sizes per profile. ``local`` is the committed all-MiniLM-L6-v2 run (CPU): the first 1200
#: WikiText-2 validation sequences train the probe, the first 300 test sequences score it. ``paper`` keeps the
#: defaults (WikiText-103 train, :data:`HUB_TRAIN_SEQUENCES_DEFAULT` sequences; the whole validation split).
#: ``smoke`` is a few short sequences of generated text and one epoch (seconds).
MLM_PROFILE_SETTINGS = {
    "smoke": {"max_length": 32, "train_sequences": 24, "eval_sequences": 12, "epochs": 1},
    "local": {"max_length": 128, "train_sequences": 1200, "eval_sequences": 300},
    "paper": {"max_length": 128, "train_sequences": None, "eval_sequences": None},
}

#: The models of Fig. 6 (Sec. 5.5): three MLM-pretrained BASE models and ELECTRA-base's discriminator.
FIG6_MODELS = ("bert-base-uncased", "roberta-base", "microsoft/deberta-base", "google/electra-base-discriminator")

#: How each model the book runs was pretrained (what its weights were last trained to do).
PRETRAINING_OBJECTIVES = {
    "bert-base-uncased": "MLM (+ next-sentence prediction)",
    "bert-large-uncased": "MLM (+ next-sentence prediction)",
    "roberta-base": "MLM",
    "roberta-large": "MLM",
    "microsoft/deberta-base": "MLM",
    "microsoft/deberta-large": "MLM",
    "google/electra-base-discriminator": "replaced-token detection",
    "all-MiniLM-L6-v2": "distilled, then contrastive sentence pairs",
}

_SHORT_NAMES = {
    "bert-base-uncased": "BERT-base",
    "bert-large-uncased": "BERT-large",
    "roberta-base": "RoBERTa-base",
    "roberta-large": "RoBERTa-large",
    "microsoft/deberta-base": "DeBERTa-base",
    "microsoft/deberta-large": "DeBERTa-large",
    "google/electra-base-discriminator": "ELECTRA-base",
}

_CURVE_COLUMNS = ["model", "objective", "fraction", "fraction_label", "mean", "ci_low", "ci_high", "n", "seeds",
                  "masked_accuracy", "num_replaced_heads", "drop"]
_DROP_COLUMNS = ["model", "objective", "original", "all_constant", "drop", "largest_drop", "fractions", "missing"]
_REFERENCE_COLUMNS = ["model", "objective", "value", "ci_low", "ci_high", "eval_size"]


def pretraining_objective(model: str) -> str:
    """The pretraining objective of a model id (:data:`PRETRAINING_OBJECTIVES`; ``'unknown'`` when not listed)."""
    name = str(model)
    if name in PRETRAINING_OBJECTIVES:
        return PRETRAINING_OBJECTIVES[name]
    if name.startswith("tiny-random"):
        return "none (random weights)"
    if "electra" in name.lower() and "discriminator" in name.lower():
        return "replaced-token detection"
    return "unknown"


def short_model_name(model: str) -> str:
    """The paper's name of a hub model (``'roberta-base'`` -> ``'RoBERTa-base'``); other ids are returned unchanged."""
    return _SHORT_NAMES.get(str(model), str(model))


def _fraction_label(fraction: float) -> str:
    from fractions import Fraction

    return str(Fraction(float(fraction)).limit_denominator(1024))


def load_mlm_results(results_dir: str | Path) -> pd.DataFrame:
    """The MLM rows (task ``'mlm'``) of the results store in ``results_dir``.

    A folder without a ``results.csv`` (nothing run yet) gives an empty frame with the store's columns, so a chapter
    can show what is missing instead of failing; the folder is not created.
    """
    from .results import RECORD_FIELDS, RESULTS_FILENAME

    root = Path(results_dir)
    if root.exists() and not root.is_dir():
        raise NotADirectoryError(f"MLM results folder {root} is not a directory")
    if not (root / RESULTS_FILENAME).is_file():
        return pd.DataFrame({column: pd.Series(dtype="object") for column in RECORD_FIELDS})
    frame = ResultsStore(root).frame()
    return frame[frame["task"] == "mlm"].reset_index(drop=True)


def load_mlm_lambdas(results_dir: str | Path) -> pd.DataFrame:
    """The λ^h learned for MLM (``results_dir/mlm_lambdas.json``) in long form.

    Columns: model, seed, corpus, layer, head, lambda (one row per head and stored entry). Empty when the file does
    not exist.

    Raises:
        ValueError: the file is not valid JSON or an entry lacks its λ matrix (the message names the file).
    """
    columns = ["model", "seed", "corpus", "layer", "head", "lambda"]
    path = _lambda_file(Path(results_dir))
    if not path.is_file():
        return pd.DataFrame({c: pd.Series(dtype="float64" if c == "lambda" else "object") for c in columns})
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}:{error.lineno}: invalid JSON: {error.msg}") from error
    if not isinstance(stored, dict):
        raise ValueError(f"{path}: expected a JSON object of λ entries")
    rows = []
    for key, entry in stored.items():
        matrix = entry.get("lambdas") if isinstance(entry, dict) else None
        if not isinstance(matrix, list) or not matrix or not all(isinstance(r, list) for r in matrix):
            raise ValueError(f"{path}: entry {key!r} has no [layers][heads] 'lambdas' matrix")
        for layer, values in enumerate(matrix):
            for head, value in enumerate(values):
                rows.append((entry.get("model"), entry.get("seed"), entry.get("corpus"), layer, head, float(value)))
    return pd.DataFrame(rows, columns=columns)


def _require(frame: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{what}: the frame lacks column(s) {', '.join(missing)} (have {list(frame.columns)})")


def _empty_frame(columns: Sequence[str], numeric: Sequence[str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="float64" if c in numeric else "object") for c in columns})


def mlm_curves(frame: pd.DataFrame) -> pd.DataFrame:
    """Fig. 6a: per (model, fraction of input-dependent heads) the mean negative log perplexity over probe seeds.

    Uses the rows of :func:`run_mlm_curve`'s curve (task ``'mlm'``, matrix type ``'average'``, order ``'lambda'``,
    every fraction including 1 and 0). ``ci_low``/``ci_high`` are the 95% interval over *evaluation sequences*
    (averaged over seeds when there are several: every seed scores the same masked tokens, so this is the
    uncertainty that comes from the evaluation text). ``drop`` = score at fraction 1 minus this score, in the same
    units (positive: worse than the original model; NaN without a fraction-1 row). Columns: model, objective,
    fraction, fraction_label, mean, ci_low, ci_high, n (seeds), seeds, masked_accuracy, num_replaced_heads, drop;
    sorted by model and decreasing fraction. Partial tables give partial curves, an empty table an empty frame.
    """
    _require(frame, ["model", "task", "matrix_type", "selection_order", "fraction", "seed", "value"], "mlm_curves")
    numeric = ["fraction", "mean", "ci_low", "ci_high", "n", "masked_accuracy", "num_replaced_heads", "drop"]
    rows = frame[(frame["task"] == "mlm") & (frame["matrix_type"] == "average") & (frame["selection_order"] == "lambda")]
    if rows.empty:
        return _empty_frame(_CURVE_COLUMNS, numeric)
    rows = rows.copy()
    rows["fraction"] = pd.to_numeric(rows["fraction"], errors="raise").astype(float)
    for column in ("value", "ci_low", "ci_high", "masked_accuracy", "num_replaced_heads"):
        rows[column] = pd.to_numeric(rows[column], errors="coerce") if column in rows else np.nan
    out = []
    for (model, fraction), group in rows.groupby(["model", "fraction"], sort=False):
        values = group["value"].dropna()
        low = group["ci_low"].fillna(group["value"]).mean()
        high = group["ci_high"].fillna(group["value"]).mean()
        out.append({
            "model": model, "objective": pretraining_objective(model), "fraction": float(fraction),
            "fraction_label": _fraction_label(fraction), "mean": float(values.mean()) if len(values) else np.nan,
            "ci_low": float(low), "ci_high": float(high), "n": int(len(values)),
            "seeds": ", ".join(str(int(s)) for s in sorted(group["seed"].dropna().astype(int).unique())),
            "masked_accuracy": float(group["masked_accuracy"].mean()),
            "num_replaced_heads": float(group["num_replaced_heads"].mean()),
        })
    curves = pd.DataFrame(out)
    originals = curves[np.isclose(curves["fraction"], 1.0)].set_index("model")["mean"]
    curves["drop"] = curves["model"].map(originals) - curves["mean"]
    curves = curves.sort_values(["model", "fraction"], ascending=[True, False], kind="stable").reset_index(drop=True)
    return curves[_CURVE_COLUMNS]


def mlm_drops(curves: pd.DataFrame, fractions: Sequence[float] = PAPER_FRACTIONS) -> pd.DataFrame:
    """Sec. 5.5's two numbers per model, from :func:`mlm_curves`: the original score and how much it loses.

    Columns: model, objective, ``original`` (every head input-dependent), ``all_constant`` (every head constant),
    ``drop`` = original - all_constant, ``largest_drop`` = original - the lowest score at any fraction below 1
    (the paper speaks of "the drop when gradually removing heads"), ``fractions`` (how many of ``fractions`` have a
    point) and ``missing`` (their labels, comma-separated; empty when complete). Missing points give NaN.
    """
    _require(curves, ["model", "fraction", "mean"], "mlm_drops")
    numeric = ["original", "all_constant", "drop", "largest_drop", "fractions"]
    if curves.empty:
        return _empty_frame(_DROP_COLUMNS, numeric)
    out = []
    for model, group in curves.groupby("model", sort=True):
        fraction = group["fraction"].astype(float).to_numpy()
        scores = group["mean"].astype(float).to_numpy()
        original = scores[np.isclose(fraction, 1.0)]
        constant = scores[np.isclose(fraction, 0.0)]
        below = scores[fraction < 1.0 - 1e-9]
        original = float(original[0]) if len(original) else np.nan
        present = [f for f in fractions if np.isclose(fraction, float(f)).any()]
        out.append({
            "model": model, "objective": pretraining_objective(model), "original": original,
            "all_constant": float(constant[0]) if len(constant) else np.nan,
            "drop": original - float(constant[0]) if len(constant) else np.nan,
            "largest_drop": original - float(np.nanmin(below)) if len(below) else np.nan,
            "fractions": len(present),
            "missing": ", ".join(_fraction_label(f) for f in fractions if f not in present),
        })
    return pd.DataFrame(out)[_DROP_COLUMNS]


def mlm_reference_scores(frame: pd.DataFrame) -> pd.DataFrame:
    """The pretrained MLM heads' own scores (``matrix_type='pretrained_head'`` rows; original attention).

    Columns: model, objective, value, ci_low, ci_high, eval_size. Empty when no model had a pretrained head.
    """
    _require(frame, ["model", "task", "matrix_type", "value"], "mlm_reference_scores")
    rows = frame[(frame["task"] == "mlm") & (frame["matrix_type"] == "pretrained_head")].copy()
    if rows.empty:
        return _empty_frame(_REFERENCE_COLUMNS, ["value", "ci_low", "ci_high", "eval_size"])
    rows["objective"] = rows["model"].map(pretraining_objective)
    for column in _REFERENCE_COLUMNS:
        if column not in rows:
            rows[column] = np.nan
    return rows[_REFERENCE_COLUMNS].sort_values("model", kind="stable").reset_index(drop=True)


def paper_mlm_reference() -> pd.DataFrame:
    """The paper's Sec. 5.5 numbers (``papa_lib.paper.headline``), one row per group of models.

    Columns: model, objective, original (score with every head input-dependent), approximate (the paper says
    "around"), drop_low, drop_high (the drop when heads are removed; equal for a single value), data, source.
    """
    from .paper import headline

    data = "WikiText-103 validation"
    return pd.DataFrame([
        {"model": "ELECTRA-base", "objective": PRETRAINING_OBJECTIVES["google/electra-base-discriminator"],
         "original": headline("electra_mlm_original"), "approximate": False,
         "drop_low": headline("electra_mlm_drop"), "drop_high": headline("electra_mlm_drop"),
         "data": data, "source": "Hassid et al. 2022, Sec. 5.5 / Fig. 6a"},
        {"model": "BERT-, RoBERTa-, DeBERTa-base", "objective": "MLM",
         "original": headline("mlm_models_mlm_original"), "approximate": True,
         "drop_low": headline("mlm_models_mlm_drop_low"), "drop_high": headline("mlm_models_mlm_drop_high"),
         "data": data, "source": "Hassid et al. 2022, Sec. 5.5 / Fig. 6a"},
    ])


def mnli_curve_spec(grid: dict, block: str = "fig2", task: str = "mnli") -> dict:
    """Fig. 6b's runs: a copy of a profile's grid keeping only ``block`` (Fig. 2's), restricted to ``task``.

    The runs are identical to (and share their run ids with) the Fig. 2 runs of that task.

    Raises:
        ValueError: the grid has no such block, or the block does not list ``task``.
    """
    from dataclasses import replace

    if not isinstance(grid, dict) or "blocks" not in grid:
        raise ValueError("mnli_curve_spec: grid must be a mapping with 'blocks' (papa_lib.experiments.load_grid)")
    names = [getattr(b, "name", None) for b in grid["blocks"]]
    chosen = [b for b in grid["blocks"] if getattr(b, "name", None) == block]
    if not chosen:
        raise ValueError(f"mnli_curve_spec: the grid has no block {block!r} (blocks: {names})")
    chosen = [replace(b, tasks=[task]) for b in chosen if task in b.tasks]
    if not chosen:
        raise ValueError(f"mnli_curve_spec: block {block!r} does not run task {task!r}")
    spec = {k: v for k, v in grid.items() if k != "blocks"}
    spec["blocks"] = chosen
    return spec


def _profile_model_name(setup, model_name: str | None) -> str | None:
    name = model_name if model_name is not None else setup.model_name
    if setup.profile == "smoke" and model_name is not None:
        raise ValueError(f"the smoke profile runs its tiny random BERT only, not {model_name!r}")
    if setup.profile == "paper" and name is None:
        raise ValueError(f"the paper profile needs a hub model name (e.g. one of {', '.join(FIG6_MODELS)})")
    return name


def run_profile_mlm_curve(
    setup, model_name: str | None = None, seeds: Sequence[int] = (0,), results_dir: str | Path | None = None,
    progress: bool = False, **sizes,
) -> pd.DataFrame:
    """Run (or resume) :func:`run_mlm_curve` at a profile's size (:data:`MLM_PROFILE_SETTINGS`).

    ``setup`` is a :class:`papa_lib.profiles.Setup`. The model is the smoke profile's tiny random BERT, or
    ``model_name`` (default ``setup.model_name``; ``None`` at ``local`` = the embedded MiniLM) loaded with its MLM
    head (``load_encoder(..., with_mlm_head=True)``) on ``setup.device``. ``results_dir`` defaults to the profile's
    :data:`MLM_RESULT_FOLDERS` entry under ``setup.root``. ``sizes`` override the profile's settings (``max_length``,
    ``train_sequences``, ``eval_sequences``, ``epochs``, ``batch_size``, ``lr``); ``None`` values are ignored.
    With the local defaults the run ids are those of the committed run, so nothing is recomputed.
    """
    allowed = {"max_length", "train_sequences", "eval_sequences", "epochs", "batch_size", "lr"}
    unknown = set(sizes) - allowed
    if unknown:
        raise ValueError(f"run_profile_mlm_curve: unknown size setting(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    if setup.profile not in MLM_PROFILE_SETTINGS:
        raise ValueError(f"unknown profile {setup.profile!r}; choose one of {sorted(MLM_PROFILE_SETTINGS)}")
    settings = dict(MLM_PROFILE_SETTINGS[setup.profile])
    settings.update({k: v for k, v in sizes.items() if v is not None})
    name = _profile_model_name(setup, model_name)
    folder = Path(results_dir) if results_dir is not None else setup.root / MLM_RESULT_FOLDERS[setup.profile]
    if not folder.is_absolute():
        folder = setup.root / folder
    if setup.profile == "smoke":
        model, tokenizer = setup.encoder()
    else:
        from .models import load_encoder

        model, tokenizer = load_encoder(name, with_mlm_head=True, device=setup.device)
    try:
        return run_mlm_curve(model, tokenizer, data_dir=setup.data_dir, seeds=list(seeds), device=setup.device,
                             results_dir=folder, progress=progress, **settings)
    finally:
        if setup.profile != "smoke":
            del model
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def run_mnli_curve(setup, model_name: str | None = None, progress: bool = False, task: str = "mnli"):
    """Run what a profile's grid lacks of Fig. 6b's MNLI curve (:func:`mnli_curve_spec`) for one model.

    ``task`` picks another task of the ``fig2`` block instead of MNLI (the paper shows MNLI only).

    Smoke uses the profile's tiny random BERT; otherwise ``model_name`` (default ``setup.model_name``) is loaded by
    :func:`papa_lib.experiments.run_grid` as a bare encoder. Results go to ``setup.results_dir`` with the same run
    ids as the Fig. 2 runs, so finished runs are skipped. Returns the :class:`papa_lib.results.ResultsStore`.
    """
    from .experiments import run_grid

    name = _profile_model_name(setup, model_name)
    spec = mnli_curve_spec(setup.grid(), task=task)
    overrides = {"data_dir": str(setup.data_dir) if setup.data_dir else None, "device": setup.device}
    if setup.profile == "smoke":
        model, tokenizer = setup.encoder()
    else:
        model = tokenizer = None
        overrides["model"] = name
    return run_grid(spec, setup.results_dir, model=model, tokenizer=tokenizer, progress=progress, overrides=overrides)
