"""What one (model, task) experiment works with: its settings and its workspace (paths and caches).

The stages of :mod:`papa_lib.experiments.engine` are functions of a :class:`Workspace`: the resolved
:class:`ExperimentConfig`, the frozen backbone, where results, matrices, λ and features are written, and what is
computed once and reused (encoded splits, constant matrices, per-head scores). The one λ file format
(:func:`write_lambdas`, :func:`read_lambdas`, :func:`read_lambda_info`) is here, below the engine and the head-ranking
registry, so that the decoder LM's λ (:mod:`papa_lib.experiments.lm`), which a ranking reads, and the MLM curve's
(:mod:`papa_lib.analysis.mlm`) share it without an import cycle.
"""

from __future__ import annotations

import hashlib
import json
import re
import resource
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ..core import layout
from ..core.artefacts import write_atomic
from ..core.models import num_layers_and_heads
from ..errors import PapaInputError
from . import results
from .features import FeatureStore
from .loop import IGNORE_INDEX
from .task_specs import TASKS, TaskSpec


@dataclass
class ExperimentConfig:
    """Everything that defines a task's experiments except the variant and the seed.

    ``epochs`` caps probe training (early stopping after ``patience`` epochs without held-out improvement);
    ``limit`` subsamples each seed's probe training rows; the constant matrices average over the whole training text
    (as the paper does) unless ``average_limit`` caps it at a seeded subset of that many examples;
    ``seeds`` are the seeds whose training subsets the feature store covers; ``cache_budget`` (bytes) decides
    between cached and streamed features (None: :func:`~papa_lib.experiments.features.default_budget`); a variant's
    cached features are deleted once its records are written unless ``keep_features``. ``lambda_seed``: learn λ once,
    on that seed's training rows, and rank the heads of every seed's run by it (None: each seed learns its own λ, as
    the MiniLM runs do); it costs one λ training per matrices source instead of one per seed. ``inloop_*`` and
    ``matrix_learning_rate``: see :func:`papa_lib.experiments.engine.train_inside`."""

    task: str
    model: str | None = None
    data_dir: str | None = None
    profile: str = "local"
    limit: int | None = None
    average_limit: int | None = None
    eval_limit: int | None = None
    data_seed: int = 0
    max_length: int | None = None
    epochs: int | None = None
    patience: int = 3
    lambda_epochs: int | None = None
    inloop_epochs: int | None = None
    inloop_limit: int | None = None
    matrix_learning_rate: float | None = None
    learning_rate: float | None = None
    lambda_learning_rate: float | None = None
    lambda_seed: int | None = None
    batch_size: int | None = None
    feature_batch_size: int = 64
    seeds: tuple = (0, 1, 2)
    cache_budget: int | None = None
    keep_features: bool = False
    packed: bool = True
    device: str = "cpu"

    def resolved(self) -> ExperimentConfig:
        """Fill unset hyperparameters from the paper's Table 3 (via :data:`papa_lib.experiments.task_specs.TASKS`)."""
        spec = TASKS[self.task]
        return replace(
            self,
            max_length=self.max_length or spec.max_length,
            epochs=self.epochs or spec.epochs,
            lambda_epochs=self.lambda_epochs or self.epochs or spec.epochs,
            inloop_epochs=self.inloop_epochs or self.epochs or spec.epochs,
            matrix_learning_rate=self.matrix_learning_rate or self.learning_rate or spec.learning_rate,
            learning_rate=self.learning_rate or spec.learning_rate,
            lambda_learning_rate=self.lambda_learning_rate or self.learning_rate or spec.learning_rate,
            batch_size=self.batch_size or spec.batch_size,
            seeds=tuple(self.seeds),
        )


#: Settings that never change a run's numbers (left out of run ids).
NOT_IN_RUN_ID = ("device", "feature_batch_size", "lambda_epochs", "lambda_learning_rate", "lambda_seed",
                 "inloop_epochs", "inloop_limit", "matrix_learning_rate", "seeds",
                 "cache_budget", "keep_features", "packed")


@dataclass
class EncodedSplit:
    """A task split encoded in the PAPA layout (a decoder LM's: the causal one), with labels (word-level labels padded
    with -100 for token tasks)."""

    encoded: layout.EncodedBatch
    labels: torch.Tensor
    examples: object = None
    words_per_sentence: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def encode_split(tokenizer, spec: TaskSpec, examples, max_length: int) -> EncodedSplit:
    """Encode a task split: the App. A layout, or for a decoder LM's tokenizer (``papa_layout = "causal"``) the causal
    one, ``[bos] a <separator> b``, a pair joined by the layout's declared separator
    (:data:`~papa_lib.core.layout.DEFAULT_SEPARATOR`). Token tasks get word-aligned labels (-100 where no first
    sub-token); they run on encoders only (a :class:`~papa_lib.errors.PapaInputError` for a decoder's tokenizer)."""
    if spec.kind == "token":
        if getattr(tokenizer, "papa_layout", None) == "causal":
            raise PapaInputError(f"{spec.name} is a token task, which PAPA probes on encoders only: the decoder layout "
                                 "has no word-aligned encoding")
        encoded = layout.encode_words(tokenizer, examples.words, max_length=max_length)
        labels = torch.full(encoded.word_index.shape, IGNORE_INDEX, dtype=torch.long)
        for row, tags in enumerate(examples.tags):
            kept = encoded.word_index[row, : len(tags)] >= 0
            labels[row, : len(tags)] = torch.where(kept, torch.tensor(tags, dtype=torch.long),
                                                   torch.tensor(IGNORE_INDEX))
        return EncodedSplit(encoded, labels, examples, [len(w) for w in examples.words])
    encoded = layout.encode(tokenizer, examples.texts, examples.pairs, max_length=max_length)
    return EncodedSplit(encoded, torch.tensor(examples.labels, dtype=torch.long), examples)


class Workspace:
    """The small object every stage function takes: one (model, task) experiment's settings, backbone, paths and
    caches.

    ``config`` is resolved (Table 3 defaults filled in); the backbone is frozen and in eval mode. With a
    ``results_dir``, records go to its :class:`~papa_lib.experiments.results.ResultsStore`, constant matrices to
    ``matrices/``, λ to ``lambdas/`` and cached features to ``features/``. In memory: the encoded splits
    (``splits``), the constant matrices per (source task, kind) (``constants``), per-head scores (``scores``), and
    scores handed in from elsewhere (``given_scores``, keyed ``(order, matrices_from, seed)``: a Ray worker's scores
    computed by their own task), which the order stage uses instead of computing them.
    """

    def __init__(self, config: ExperimentConfig, model, tokenizer, results_dir: str | Path | None = None,
                 progress: bool = True):
        self.config = config.resolved()
        self.spec = TASKS[self.config.task]
        self.model, self.tokenizer = model, tokenizer
        self.model.requires_grad_(False)
        self.model.eval()
        self.progress = progress
        self.results_dir = Path(results_dir) if results_dir is not None else None
        self.store = results.ResultsStore(results_dir) if results_dir is not None else None
        self.features_store = FeatureStore(self.results_dir / "features") if self.results_dir else None
        self.layers, self.heads = num_layers_and_heads(model)
        self.splits: dict = {}
        self.constants_cache: dict = {}
        self.scores: dict = {}
        self.given_scores: dict = {}

    def under(self, folder: str, name: str) -> Path | None:
        """``results_dir/folder/name``, or None without a results folder (nothing is written then)."""
        return self.results_dir / folder / name if self.results_dir else None


def task_provenance(task: str, key: str = "provenance") -> dict:
    """``{key: ...}`` for a task of your own (files, columns: :mod:`papa_lib.experiments.custom`), else ``{}``."""
    provenance = TASKS[task].provenance if task in TASKS else None
    return {key: provenance} if provenance else {}


def source_files(source: str) -> dict[str, Path]:
    """``{name: path}`` of the files a split's ``source`` names (a path, or ``papa_lib/samples/...`` for the packaged
    sample, maybe followed by a note in parentheses); nothing for hub data."""
    from . import sample_data

    name = re.split(r" [(\[]", source)[0].strip()
    if name.startswith("papa_lib/samples/"):
        path = sample_data._unpacked_dir(sample_data.SAMPLE_PACK) / name[len("papa_lib/samples/"):]
    else:
        path = Path(name)
    return {name: path} if path.is_file() else {}


def fingerprint(*tensors: torch.Tensor) -> str:
    """16 hex digits of some tensors' contents (token ids, labels)."""
    digest = hashlib.sha256()
    for tensor in tensors:
        digest.update(tensor.cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def peak_memory_mb(device: str) -> float:
    """Peak memory of this process so far: resident set on CPU, allocated memory on a CUDA device."""
    if str(device).startswith("cuda") and torch.cuda.is_available():
        return round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


#: λ files are safetensors, like the constant matrices: one tensor ``lambda`` of shape [layers, heads], and what
#: it was learned under (JSON) in the file's metadata. The engine, the decoder's LM loss and the MLM curve use this one
#: format.
LAMBDA_SUFFIX = ".safetensors"


def write_lambdas(path: Path, lambdas: torch.Tensor, info: dict | None = None) -> None:
    """Save λ ``[layers, heads]`` atomically (with its checksum file) as safetensors; ``info`` (JSON-able: how λ was
    learned) goes in the file's metadata, where :func:`read_lambda_info` reads it."""
    from safetensors.torch import save_file

    metadata = None if info is None else {"info": json.dumps(info, sort_keys=True)}
    write_atomic(path, lambda tmp: save_file({"lambda": lambdas.detach().float().contiguous().cpu()}, str(tmp),
                                             metadata=metadata))


def read_lambdas(path: Path) -> torch.Tensor:
    """λ ``[layers, heads]`` from a file :func:`write_lambdas` wrote."""
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    if "lambda" not in tensors:
        raise ValueError(f"{path}: no 'lambda' tensor (found {sorted(tensors)})")
    return tensors["lambda"]


def read_lambda_info(path: Path) -> dict:
    """The ``info`` :func:`write_lambdas` stored beside λ; ``{}`` for a file written without it."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    return json.loads(metadata["info"]) if "info" in metadata else {}
