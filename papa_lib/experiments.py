"""PAPA's experimental machinery: variants, feature caching, λ learning, probing runs and declared grids
(paper Sec. 3.2-3.3, 4, 5.2-5.4, App. B).

Vocabulary
----------
* A **variant** is what the frozen backbone runs: which heads are replaced and by what. It is described by
  ``matrix_type`` (``original``, ``average``, ``identity``, ``toeplitz``, ``zeros``, ``trainable_toeplitz``,
  ``trainable_average``), ``selection_order`` (:data:`papa_lib.selection.ORDERS`), ``fraction`` (share of heads that
  stay input-dependent) and ``matrices_from`` (the task whose training text the average matrices come from; Sec. 5.3
  uses MNLI for every task).
* A **run** is one variant probed with one seed; it writes one record to the :class:`~papa_lib.results.ResultsStore`.

Canonical variants: ``fraction == 1`` replaces nothing, so it is stored once as ``matrix_type="original"``; with
``fraction == 0`` every head is replaced, so the order does not matter and is stored as ``"none"``.

Feature cache (Sec. 3.3 probes a frozen model): variants whose backbone does not train (original, average,
identity, Toeplitz, zeros) run the backbone once over train and validation data; the hidden states of every layer
(embeddings included) are kept in float16 and reused across epochs and seeds. Variants that train inside the
backbone (the λ mixing of Sec. 3.2, trainable matrices of Sec. 5.2) run the backbone at every step.

λ selection (Sec. 3.2): every head mixes B = λA + (1-λ)C with λ = σ(θ), θ initialised at 0, and θ is trained jointly
with a probe on the task's training data; heads with the smallest λ are replaced first. We learn λ once per (model,
task, matrices) with seed 0 and ``lambda_epochs`` epochs — a pre-processing step, as the paper describes it — and
reuse that order for every seed. θ may get its own learning rate (``lambda_learning_rate``): with the paper's probe
learning rate and a CPU-sized training set, Adam moves θ by less than 0.01 and λ stays at 0.5.

Choices the paper leaves open (documented here, reported in the book)
----------------------------------------------------------------------
* The backbone is frozen and in eval mode, so there is no dropout inside it (the paper's code kept dropout on).
* Token tasks (NER, POS): the label sits on a word's first sub-token; words cut off by truncation are predicted as
  ``O`` (NER) or counted wrong (POS), so truncation can only lower our scores.
* The training subset (``limit``) is drawn once with ``data_seed`` and shared by all variants and seeds; ``seed``
  changes only the probe's initialisation and batch order (and the λ run uses seed 0).
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterable

import torch
from torch import nn

from . import layout, probes, results, selection, tasks
from .averaging import ConstantAttention, average_attention
from .models import load_encoder, model_id, model_inputs, num_layers_and_heads
from .override import AttentionOverride

MATRIX_TYPES = ("original", "average", "identity", "toeplitz", "zeros", "trainable_toeplitz", "trainable_average",
                "norm_average")
FROZEN_MATRIX_TYPES = ("original", "average", "identity", "toeplitz", "zeros", "norm_average")
# Label-free head rankings (beyond the paper, see papa_lib.norms): low score = least input-dependent = replaced first.
LABEL_FREE_ORDERS = ("attention_variance", "norm_variance")
ALL_ORDERS = selection.ORDERS + LABEL_FREE_ORDERS
_AVERAGE_TYPES = ("average", "trainable_average", "norm_average")
_MODE_OF = {
    "average": "constant",
    "norm_average": "constant",
    "identity": "identity",
    "toeplitz": "toeplitz",
    "zeros": "zeros",
    "trainable_toeplitz": "trainable",
    "trainable_average": "trainable",
}


@dataclass(frozen=True)
class Variant:
    """What the frozen backbone runs (see module docstring); always canonical (use :meth:`make`)."""

    matrix_type: str = "original"
    selection_order: str = "none"
    fraction: float = 1.0
    matrices_from: str | None = None

    @classmethod
    def make(cls, matrix_type="average", selection_order="lambda", fraction=1.0, matrices_from=None) -> "Variant":
        if matrix_type not in MATRIX_TYPES:
            raise ValueError(f"unknown matrix type {matrix_type!r}; choose one of {MATRIX_TYPES}")
        if selection_order not in ALL_ORDERS + ("none",):
            raise ValueError(f"unknown selection order {selection_order!r}; choose one of {ALL_ORDERS}")
        fraction = float(fraction)
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"fraction of input-dependent heads must be in [0, 1], got {fraction}")
        if fraction == 1.0 or matrix_type == "original":
            return cls("original", "none", 1.0, None)
        if fraction == 0.0:
            selection_order = "none"
        if matrix_type not in _AVERAGE_TYPES:
            matrices_from = None
        return cls(matrix_type, selection_order, fraction, matrices_from)

    @property
    def frozen(self) -> bool:
        return self.matrix_type in FROZEN_MATRIX_TYPES

    @property
    def needs_lambdas(self) -> bool:
        return self.selection_order in ("lambda", "reversed")

    @property
    def needs_scores(self) -> bool:
        return self.needs_lambdas or self.selection_order in LABEL_FREE_ORDERS


@dataclass
class ExperimentConfig:
    """Everything that defines a task's experiments except the variant and the seed."""

    task: str
    model: str | None = None
    data_dir: str | None = None
    profile: str = "local"
    limit: int | None = None
    eval_limit: int | None = None
    data_seed: int = 0
    max_length: int | None = None
    epochs: int | None = None
    lambda_epochs: int | None = None
    inloop_epochs: int | None = None
    learning_rate: float | None = None
    lambda_learning_rate: float | None = None
    batch_size: int | None = None
    feature_batch_size: int = 64
    device: str = "cpu"

    def resolved(self) -> "ExperimentConfig":
        """Fill unset hyperparameters from the paper's Table 3 (via :data:`papa_lib.tasks.TASKS`)."""
        spec = tasks.TASKS[self.task]
        return replace(
            self,
            max_length=self.max_length or spec.max_length,
            epochs=self.epochs or spec.epochs,
            lambda_epochs=self.lambda_epochs or self.epochs or spec.epochs,
            inloop_epochs=self.inloop_epochs or self.epochs or spec.epochs,
            learning_rate=self.learning_rate or spec.learning_rate,
            lambda_learning_rate=self.lambda_learning_rate or self.learning_rate or spec.learning_rate,
            batch_size=self.batch_size or spec.batch_size,
        )


@dataclass
class FeatureSet:
    """Cached frozen-backbone features for one split.

    Sentence tasks: ``features`` ``[N, layers+1, L, D]`` float16 and ``attention_mask`` ``[N, L]``.
    Token tasks: ``features`` ``[words, layers+1, D]`` float16 for every kept word's first sub-token.
    """

    features: torch.Tensor
    labels: torch.Tensor
    attention_mask: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass
class EncodedSplit:
    """A task split encoded in the PAPA layout, with labels (word-level labels padded with -100 for token tasks)."""

    encoded: layout.EncodedBatch
    labels: torch.Tensor
    examples: object = None
    words_per_sentence: list[int] = field(default_factory=list)


def encode_split(tokenizer, spec: tasks.TaskSpec, examples, max_length: int) -> EncodedSplit:
    """Encode a task split (App. A layout); token tasks get word-aligned labels (-100 where no first sub-token)."""
    if spec.kind == "token":
        encoded = layout.encode_words(tokenizer, examples.words, max_length=max_length)
        labels = torch.full(encoded.word_index.shape, probes.IGNORE_INDEX, dtype=torch.long)
        for row, tags in enumerate(examples.tags):
            kept = encoded.word_index[row, : len(tags)] >= 0
            labels[row, : len(tags)] = torch.where(kept, torch.tensor(tags, dtype=torch.long), torch.tensor(probes.IGNORE_INDEX))
        return EncodedSplit(encoded, labels, examples, [len(w) for w in examples.words])
    encoded = layout.encode(tokenizer, examples.texts, examples.pairs, max_length=max_length)
    return EncodedSplit(encoded, torch.tensor(examples.labels, dtype=torch.long), examples)


def _stack_hidden(outputs) -> torch.Tensor:
    return torch.stack(outputs.hidden_states, dim=1)  # [B, layers+1, L, D]


def _gather_words(hidden: torch.Tensor, word_index: torch.Tensor) -> torch.Tensor:
    """[B, layers+1, L, D] + [B, W] -> [B, W, layers+1, D] (index clamped; masked by labels later)."""
    index = word_index.clamp_min(0).to(hidden.device)
    batch = torch.arange(hidden.shape[0], device=hidden.device)[:, None]
    return hidden.permute(0, 2, 1, 3)[batch, index]


@torch.inference_mode()
def extract_features(model, split: EncodedSplit, kind: str, batch_size: int = 64, state: AttentionOverride | None = None,
                     progress: bool = False, desc: str = "features") -> FeatureSet:
    """Run the (possibly overridden) frozen backbone once over a split and keep every layer's hidden states."""
    from tqdm.auto import tqdm

    chunks, masks, labels = [], [], []
    context = state.applied(model) if state is not None else nullcontext()
    total = math.ceil(split.encoded.batch_size / batch_size)
    with context:
        for start, part in tqdm(enumerate(layout.batched(split.encoded, batch_size)), total=total, disable=not progress, desc=desc, leave=False):
            hidden = _stack_hidden(model(**model_inputs(model, part), output_hidden_states=True))
            rows = slice(start * batch_size, start * batch_size + part.batch_size)
            if kind == "token":
                words = _gather_words(hidden, part.word_index)
                y = split.labels[rows]
                keep = (y != probes.IGNORE_INDEX).to(words.device)
                chunks.append(words[keep].to(torch.float16).cpu())
                labels.append(y[keep.cpu()])
            else:
                chunks.append(hidden.to(torch.float16).cpu())
                masks.append(part["attention_mask"].cpu())
                labels.append(split.labels[rows])
    return FeatureSet(torch.cat(chunks), torch.cat(labels), torch.cat(masks) if masks else None)


class BackboneProbe(nn.Module):
    """A probe on top of a frozen backbone that runs at every step (for λ mixing and trainable matrices).

    ``train()`` only switches the probe: the backbone stays in eval mode (no dropout inside it).
    """

    def __init__(self, model, probe: nn.Module, kind: str):
        super().__init__()
        self.backbone = model
        self.probe = probe
        self.kind = kind

    def train(self, mode: bool = True):
        self.training = mode
        self.probe.train(mode)
        self.backbone.eval()
        return self

    def forward(self, input_ids, attention_mask, token_type_ids=None, word_index=None):
        batch = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            batch["token_type_ids"] = token_type_ids
        hidden = _stack_hidden(self.backbone(**model_inputs(self.backbone, batch), output_hidden_states=True))
        if self.kind == "token":
            return self.probe(_gather_words(hidden, word_index))
        return self.probe(hidden, attention_mask.to(hidden.device))


def _shuffled_batches(n: int, batch_size: int, seed: int, epoch: int):
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    order = torch.randperm(n, generator=generator)
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


def _feature_batches(features: FeatureSet, kind: str, batch_size: int, seed: int):
    def batches(epoch):
        for idx in _shuffled_batches(len(features), batch_size, seed, epoch):
            if kind == "token":
                yield (features.features[idx].float(),), features.labels[idx]
            else:
                yield (features.features[idx].float(), features.attention_mask[idx]), features.labels[idx]

    return batches


def _encoded_batches(split: EncodedSplit, batch_size: int, seed: int):
    def batches(epoch):
        for idx in _shuffled_batches(split.encoded.batch_size, batch_size, seed, epoch):
            enc = split.encoded
            inputs = (enc["input_ids"][idx], enc["attention_mask"][idx], enc.get("token_type_ids")[idx] if "token_type_ids" in enc else None,
                      enc.word_index[idx] if enc.word_index is not None else None)
            yield inputs, split.labels[idx]

    return batches


class TaskExperiment:
    """All PAPA runs of one (model, task): data, constant matrices, λ, features, probes, records.

    Expensive intermediate products are computed lazily and cached: the encoded splits, the constant matrices
    (per source task, also on disk under ``results_dir/matrices``), the learned λ (``results_dir/lambdas``) and the
    features of the most recent frozen variant.
    """

    def __init__(self, config: ExperimentConfig, model=None, tokenizer=None, results_dir: str | Path | None = None,
                 progress: bool = True):
        self.config = config.resolved()
        self.spec = tasks.TASKS[self.config.task]
        if model is None:
            model, tokenizer = load_encoder(self.config.model, device=self.config.device)
        self.model, self.tokenizer = model, tokenizer
        self.model.requires_grad_(False)
        self.model.eval()
        self.progress = progress
        self.store = results.ResultsStore(results_dir) if results_dir is not None else None
        self.results_dir = Path(results_dir) if results_dir is not None else None
        self.layers, self.heads = num_layers_and_heads(model)
        self._splits: dict[str, EncodedSplit] = {}
        self._constants: dict[str, ConstantAttention] = {}
        self._lambdas: dict[str | None, torch.Tensor] = {}
        self._features_key = None
        self._features = None

    # ------------------------------------------------------------------ data
    def split(self, name: str) -> EncodedSplit:
        if name not in self._splits:
            cfg = self.config
            limit = cfg.limit if name == "train" else cfg.eval_limit
            examples = tasks.load_task(cfg.task, name, data_dir=cfg.data_dir, limit=limit, seed=cfg.data_seed)
            self._splits[name] = encode_split(self.tokenizer, self.spec, examples, cfg.max_length)
        return self._splits[name]

    @property
    def data_source(self) -> str:
        return f"train: {self.split('train').examples.source}; validation: {self.split('validation').examples.source}"

    # ------------------------------------------------------------------ constant matrices (Sec. 3.1, 5.3)
    def unlabeled_split(self, source_task: str | None = None) -> EncodedSplit:
        """The training text of ``source_task`` (default: this task) encoded at this task's L (labels unused)."""
        source_task = source_task or self.config.task
        if source_task == self.config.task:
            return self.split("train")
        cfg = self.config
        examples = tasks.unlabeled_texts(source_task, data_dir=cfg.data_dir, limit=cfg.limit, seed=cfg.data_seed)
        return encode_split(self.tokenizer, tasks.TASKS[source_task], examples, cfg.max_length)

    def constants(self, source_task: str | None = None, kind: str = "average") -> ConstantAttention:
        """Constant matrices from the training text of ``source_task`` (default: this task), labels unused.

        ``kind="average"`` is PAPA's Eq. 2; ``kind="norm_average"`` averages the norm-weighted contributions
        α‖f(x)‖, row-normalised (:func:`papa_lib.norms.norm_weighted_attention`, beyond the paper).
        """
        source_task = source_task or self.config.task
        if (source_task, kind) in self._constants:
            return self._constants[(source_task, kind)]
        cfg = self.config
        key = results.config_hash({"model": model_id(self.model), "source": source_task, "L": cfg.max_length,
                                   "limit": cfg.limit, "data_seed": cfg.data_seed, "data_dir": str(cfg.data_dir),
                                   **({"kind": kind} if kind != "average" else {})})
        prefix = source_task if kind == "average" else f"{source_task}-{kind}"
        path = self.results_dir / "matrices" / f"{prefix}-L{cfg.max_length}-{key}.safetensors" if self.results_dir else None
        if path is not None and path.exists():
            constants = ConstantAttention.load(path)
        else:
            split = self.unlabeled_split(source_task)
            batches = layout.batched(split.encoded, cfg.feature_batch_size)
            total = math.ceil(split.encoded.batch_size / cfg.feature_batch_size)
            source = f"{source_task} train: {split.examples.source}"
            if kind == "average":
                constants = average_attention(self.model, batches, progress=self.progress, source=source, total=total)
            elif kind == "norm_average":
                from .norms import norm_weighted_attention

                constants = norm_weighted_attention(self.model, batches, progress=self.progress, source=source, total=total)
            else:
                raise ValueError(f"unknown constant-matrix kind {kind!r}")
            if path is not None:
                constants.save(path)
        constants.check_compatible(self.model, cfg.max_length)
        self._constants[(source_task, kind)] = constants
        return constants

    def head_scores(self, order: str, matrices_from: str | None = None) -> torch.Tensor:
        """Per-head scores ``[layers, heads]`` behind an order: λ (Sec. 3.2) or a label-free input-dependence score."""
        if order in ("lambda", "reversed"):
            return self.learn_lambdas(matrices_from)
        if order not in LABEL_FREE_ORDERS:
            raise ValueError(f"order {order!r} has no per-head scores")
        if order not in self._lambdas:
            from .norms import input_dependence_scores

            split = self.split("train")
            weighting = "attention" if order == "attention_variance" else "norm"
            self._lambdas[order] = input_dependence_scores(self.model, layout.batched(split.encoded, self.config.feature_batch_size),
                                                           weighting=weighting, progress=self.progress)
        return self._lambdas[order]

    # ------------------------------------------------------------------ λ (Sec. 3.2)
    def learn_lambdas(self, matrices_from: str | None = None) -> torch.Tensor:
        """Train θ (λ = σ(θ)) of every head jointly with a probe (seed 0); return λ ``[layers, heads]``."""
        source = matrices_from or self.config.task
        if source in self._lambdas:
            return self._lambdas[source]
        cfg = self.config
        key = results.config_hash({"model": model_id(self.model), "task": cfg.task, "matrices_from": source, "L": cfg.max_length,
                                   "limit": cfg.limit, "epochs": cfg.lambda_epochs, "lr": cfg.learning_rate, "bs": cfg.batch_size,
                                   "lambda_lr": cfg.lambda_learning_rate})
        path = self.results_dir / "lambdas" / f"{cfg.task}-from-{source}-{key}.pt" if self.results_dir else None
        if path is not None and path.exists():
            lambdas = torch.load(path)
        else:
            state = AttentionOverride(self.model, self.constants(source), "all", "mix")
            self._train_inloop(state, seed=0, epochs=cfg.lambda_epochs)
            lambdas = state.lambdas()
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                torch.save(lambdas, path)
        self._lambdas[source] = lambdas
        return lambdas

    # ------------------------------------------------------------------ variants
    def override_for(self, variant: Variant, seed: int = 0) -> AttentionOverride | None:
        """The :class:`AttentionOverride` a variant runs (``None`` for the original model)."""
        if variant.matrix_type == "original":
            return None
        scores = self.head_scores(variant.selection_order, variant.matrices_from) if variant.needs_scores else None
        order = variant.selection_order if variant.selection_order != "none" else "first_to_last"
        order = "lambda" if order in LABEL_FREE_ORDERS else order  # ascending score, like λ
        replaced = selection.heads_to_replace(order, variant.fraction, self.layers, self.heads, lambdas=scores, seed=seed)
        mode = _MODE_OF[variant.matrix_type]
        kind = "norm_average" if variant.matrix_type == "norm_average" else "average"
        matrices = self.constants(variant.matrices_from, kind) if variant.matrix_type in _AVERAGE_TYPES else None
        init = "toeplitz" if variant.matrix_type == "trainable_toeplitz" else "average"
        return AttentionOverride(self.model, matrices, replaced, mode, trainable_init=init, max_length=self.config.max_length)

    def features(self, variant: Variant) -> tuple[FeatureSet, FeatureSet]:
        """Cached (train, validation) features of a frozen variant (recomputed only when the variant changes)."""
        if not variant.frozen:
            raise ValueError(f"{variant.matrix_type} trains inside the backbone: it has no cached features")
        if self._features_key != variant:
            self._features = None  # free the previous variant's features first
            state = self.override_for(variant)
            self._features = tuple(self._cached_features(variant, state, name) for name in ("train", "validation"))
            self._features_key = variant
        return self._features

    def _cached_features(self, variant: Variant, state: AttentionOverride | None, name: str) -> FeatureSet:
        """Features of one split, shared on disk (``results_dir/features``, not committed) between tasks whose inputs
        and override are identical — CoNLL NER and POS read the same sentences, so their non-λ variants coincide."""
        split = self.split(name)
        path = None
        if self.results_dir is not None and not variant.needs_scores:
            import hashlib

            digest = hashlib.sha256()
            for key in ("input_ids", "attention_mask", "token_type_ids"):
                if key in split.encoded:
                    digest.update(split.encoded[key].numpy().tobytes())
            if split.encoded.word_index is not None:
                digest.update(split.encoded.word_index.numpy().tobytes())
            if state is not None:
                for layer_matrices in state._bases.values():
                    digest.update(layer_matrices.detach().cpu().numpy().tobytes())
            key = results.config_hash({"model": model_id(self.model), "variant": asdict(variant) | {"matrices_from": None},
                                       "kind": self.spec.kind, "inputs": digest.hexdigest()})
            path = self.results_dir / "features" / f"{key}.pt"
            if path.exists():
                cached = torch.load(path)
                labels = split.labels if self.spec.kind != "token" else split.labels[split.labels != probes.IGNORE_INDEX]
                return FeatureSet(cached["features"], labels, cached["attention_mask"])
        features = extract_features(self.model, split, self.spec.kind, self.config.feature_batch_size, state, self.progress,
                                    f"{name} features")
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            torch.save({"features": features.features, "attention_mask": features.attention_mask}, tmp)
            tmp.replace(path)
        return features

    # ------------------------------------------------------------------ probing
    def _new_probe(self) -> nn.Module:
        hidden = self.model.config.hidden_size
        return probes.make_probe(self.spec.kind, self.layers + 1, self.config.max_length, hidden, self.spec.num_labels)

    def _train_inloop(self, state: AttentionOverride | None, seed: int, epochs: int) -> BackboneProbe:
        probes.set_seed(seed)
        wrapper = BackboneProbe(self.model, self._new_probe(), self.spec.kind)
        params = [{"params": list(wrapper.probe.parameters())}]
        if state is not None:
            theta = [p for p in state.trainable_parameters() if p is state.theta]
            matrices = [p for p in state.trainable_parameters() if p is not state.theta]
            if theta:
                params.append({"params": theta, "lr": self.config.lambda_learning_rate})
            if matrices:
                params.append({"params": matrices})
        context = state.applied(self.model) if state is not None else nullcontext()
        with context:
            probes.train_probe(wrapper, params, _encoded_batches(self.split("train"), self.config.batch_size, seed), epochs,
                               self.config.learning_rate, device=self.config.device, progress=self.progress)
        return wrapper

    def _score(self, predictions: torch.Tensor, split: EncodedSplit, token_labels: torch.Tensor | None = None) -> float:
        if self.spec.kind != "token":
            return tasks.compute_metric(self.spec.name, predictions.tolist(), split.labels.tolist())
        # scatter kept-word predictions back into sentences; truncated words: 'O' for NER, wrong for POS
        examples = split.examples
        kept = split.labels != probes.IGNORE_INDEX
        filled = torch.full(split.labels.shape, -1, dtype=torch.long)
        filled[kept] = predictions
        preds, golds = [], []
        fallback = self.spec.label_names.index("O") if "O" in self.spec.label_names else -1
        for row, tags in enumerate(examples.tags):
            sentence = filled[row, : len(tags)].tolist()
            preds.append([p if p >= 0 else fallback for p in sentence])
            golds.append(list(tags))
        if self.spec.name == "pos":
            flat_p = [p for s in preds for p in s]
            flat_g = [g for s in golds for g in s]
            return sum(int(p == g) for p, g in zip(flat_p, flat_g)) / max(len(flat_g), 1)
        return tasks.compute_metric(self.spec.name, preds, golds)

    def evaluate_variant(self, variant: Variant, seed: int) -> float:
        """Train a probe for ``variant`` with ``seed`` and return the validation metric."""
        cfg = self.config
        if variant.frozen:
            train, val = self.features(variant)
            probes.set_seed(seed)
            probe = self._new_probe()
            probes.train_probe(probe, probe.parameters(), _feature_batches(train, self.spec.kind, cfg.batch_size, seed), cfg.epochs,
                               cfg.learning_rate, device=cfg.device, progress=self.progress)
            predictions = probes.predict(probe, self._ordered(val), device=cfg.device)
        else:
            state = self.override_for(variant, seed)
            wrapper = self._train_inloop(state, seed, cfg.inloop_epochs)
            with state.applied(self.model):
                val = extract_features(self.model, self.split("validation"), self.spec.kind, cfg.feature_batch_size, None, self.progress,
                                       "validation features")
            predictions = probes.predict(wrapper.probe, self._ordered(val), device=cfg.device)
        return self._score(predictions, self.split("validation"))

    def _ordered(self, features: FeatureSet, batch_size: int = 256):
        for start in range(0, len(features), batch_size):
            rows = slice(start, start + batch_size)
            if self.spec.kind == "token":
                yield (features.features[rows].float(),)
            else:
                yield (features.features[rows].float(), features.attention_mask[rows])

    # ------------------------------------------------------------------ records
    def relevant_config(self, variant: Variant) -> dict:
        """The settings that can change this variant's number (λ settings only for λ orders, in-loop epochs only for
        variants trained inside the backbone), so unrelated changes to a grid do not invalidate finished runs."""
        cfg = asdict(self.config)
        for key in ("device", "feature_batch_size", "lambda_epochs", "lambda_learning_rate", "inloop_epochs"):
            cfg.pop(key)
        cfg["model"] = model_id(self.model)
        if variant.needs_lambdas:
            cfg.update(lambda_epochs=self.config.lambda_epochs, lambda_learning_rate=self.config.lambda_learning_rate)
        if not variant.frozen:
            cfg["inloop_epochs"] = self.config.inloop_epochs
        return cfg

    def run_id(self, variant: Variant, seed: int) -> str:
        return results.config_hash({**self.relevant_config(variant), **asdict(variant), "seed": seed})

    def run(self, variant: Variant, seed: int) -> dict:
        """Probe one variant with one seed; append the record to the store (skipped if already finished)."""
        run_id = self.run_id(variant, seed)
        if self.store is not None and self.store.has(run_id):
            return self.store.get(run_id)
        started = time.time()
        value = self.evaluate_variant(variant, seed)
        record = {
            "run_id": run_id,
            "model": model_id(self.model),
            "task": self.spec.name,
            "matrix_type": variant.matrix_type,
            "matrices_from": variant.matrices_from or (self.spec.name if variant.matrix_type in _AVERAGE_TYPES else None),
            "selection_order": variant.selection_order,
            "fraction": variant.fraction,
            "seed": seed,
            "metric": self.spec.metric,
            "value": float(value),
            "eval_size": len(self.split("validation").examples),
            "train_size": len(self.split("train").examples),
            "config_hash": results.config_hash(self.relevant_config(variant)),
            "profile": self.config.profile,
            "data_source": self.data_source,
            "versions": results.package_versions(),
            "device": str(self.config.device),
            "wall_time_s": round(time.time() - started, 3),
        }
        if self.store is not None:
            self.store.append(record)
        return record


# ---------------------------------------------------------------------- grids
@dataclass
class GridBlock:
    """One block of a declared grid: the cross product of its lists, for each task."""

    name: str
    tasks: list[str]
    matrix_types: list[str] = field(default_factory=lambda: ["average"])
    orders: list[str] = field(default_factory=lambda: ["lambda"])
    fractions: list[float] = field(default_factory=lambda: list(selection.PAPER_FRACTIONS))
    matrices_from: str | None = None


def load_grid(path: str | Path) -> dict:
    """Read a grid YAML file: top-level settings plus ``blocks`` (see ``data/results/*/grid.yaml``)."""
    import yaml

    path = Path(path)
    try:
        spec = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ValueError(f"{where}: invalid YAML: {error}") from error
    if not isinstance(spec, dict) or "blocks" not in spec:
        raise ValueError(f"{path}: a grid needs a top-level mapping with a 'blocks' list")
    known = set(GridBlock.__dataclass_fields__)
    blocks = []
    for i, block in enumerate(spec["blocks"]):
        unknown = set(block) - known
        if unknown:
            raise ValueError(f"{path}: block {i} ({block.get('name', '?')}) has unknown keys {sorted(unknown)}")
        for task in block.get("tasks", []):
            if task not in tasks.TASKS:
                raise ValueError(f"{path}: block {block.get('name', i)} names unknown task {task!r}")
        blocks.append(GridBlock(**block))
    spec["blocks"] = blocks
    return spec


def grid_runs(blocks: Iterable[GridBlock]) -> dict[str, list[Variant]]:
    """Deduplicated canonical variants per task, in a cache-friendly order (grouped by variant)."""
    per_task: dict[str, list[Variant]] = {}
    for block in blocks:
        for task in block.tasks:
            for matrix_type in block.matrix_types:
                for order in block.orders:
                    for fraction in block.fractions:
                        variant = Variant.make(matrix_type, order, fraction, block.matrices_from)
                        variants = per_task.setdefault(task, [])
                        if variant not in variants:
                            variants.append(variant)
    return per_task


def run_grid(spec: dict, results_dir: str | Path, model=None, tokenizer=None, progress: bool = True,
             overrides: dict | None = None) -> results.ResultsStore:
    """Run every run of a declared grid, resuming: finished runs (same run id) are skipped.

    ``spec`` is :func:`load_grid`'s output. Top-level keys: ``model``, ``data_dir``, ``profile``, ``seeds`` (list or
    count), ``limit``, ``eval_limit``, ``max_length`` (int or per-task mapping with ``default``), ``epochs``,
    ``lambda_epochs``, ``inloop_epochs``, ``lambda_learning_rate``, ``learning_rate``, ``batch_size``, ``device`` (each of
    the per-task ones may be a mapping ``{task: value, default: value}``). ``overrides`` replace top-level keys (the CLI's flags).
    """
    from tqdm.auto import tqdm

    settings = {k: v for k, v in spec.items() if k != "blocks"}
    settings.update({k: v for k, v in (overrides or {}).items() if v is not None})
    seeds = settings.get("seeds", 3)
    seeds = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    if model is None:
        model, tokenizer = load_encoder(settings.get("model"), device=settings.get("device", "cpu"))
    store = results.ResultsStore(results_dir)
    plan = grid_runs(spec["blocks"])
    total = sum(len(v) for v in plan.values()) * len(seeds)
    bar = tqdm(total=total, disable=not progress, desc="grid runs")
    for task, variants in plan.items():
        config = ExperimentConfig(
            task=task,
            model=settings.get("model"),
            data_dir=settings.get("data_dir"),
            profile=settings.get("profile", "local"),
            limit=settings.get("limit"),
            eval_limit=settings.get("eval_limit"),
            max_length=_per_task(settings.get("max_length"), task),
            epochs=_per_task(settings.get("epochs"), task),
            lambda_epochs=_per_task(settings.get("lambda_epochs"), task),
            inloop_epochs=_per_task(settings.get("inloop_epochs"), task),
            lambda_learning_rate=_per_task(settings.get("lambda_learning_rate"), task),
            learning_rate=_per_task(settings.get("learning_rate"), task),
            batch_size=_per_task(settings.get("batch_size"), task),
            device=settings.get("device", "cpu"),
        )
        experiment = TaskExperiment(config, model, tokenizer, results_dir=results_dir, progress=progress)
        for variant in variants:
            for seed in seeds:
                bar.set_postfix_str(f"{task} {variant.matrix_type} {variant.selection_order} {variant.fraction:g} seed {seed}")
                experiment.run(variant, seed)
                bar.update(1)
        del experiment
    bar.close()
    return store


def _per_task(value, task: str):
    if isinstance(value, dict):
        return value.get(task, value.get("default"))
    return value
