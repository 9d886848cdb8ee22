"""The first stages of one (model, task) experiment, as functions of a :class:`~.workspace.Workspace`.

1. **data**: the encoded splits, each seed's training rows and held-out slice (:func:`split`, :func:`seed_plan`);
2. **matrices**: the constant matrices (Eq. 2 and the other registered builders; Sec. 3.1, 5.3) from a task's
   unlabeled training text (:func:`constants`);
3. **order**, its learned part: λ trained jointly with a probe (:func:`learn_lambdas`; Sec. 3.2), which the
   ``lambda`` and ``reversed`` rankings score heads by.

The rest of stage 3 and stage 4 (scores, the override a variant runs, features) are
:mod:`papa_lib.experiments.overrides`; stages 5 and 6 (probes, records) :mod:`papa_lib.experiments.runs`. Every product
is computed once per workspace (and, with a results folder, once on disk). This module imports no ranking registry,
so a ranking's score function may call it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..core.artefacts import read_or_heal, write_atomic
from ..core.averaging import ConstantAttention
from ..core.models import model_id
from ..core.packing import pack, supports_packing
from . import probes, results, tasks
from .features import length_sorted_chunks, select_rows
from .matrices import constant_builder
from .training import HELDOUT_FRACTION, SeedPlan, heldout_split
from .workspace import EncodedSplit, Workspace, encode_split, fingerprint, source_files, task_provenance


# ---------------------------------------------------------------------- stage 1: task data and seeds
def split(ws: Workspace, name: str) -> EncodedSplit:
    """The encoded split: the whole training set (seeds draw their subsets), validation up to ``eval_limit``."""
    if name not in ws.splits:
        cfg = ws.config
        limit = None if name == "train" else cfg.eval_limit
        examples = tasks.load_task(cfg.task, name, data_dir=cfg.data_dir, limit=limit, seed=cfg.data_seed)
        ws.splits[name] = encode_split(ws.tokenizer, ws.spec, examples, cfg.max_length)
    return ws.splits[name]


def data_key(ws: Workspace) -> str:
    """A fingerprint of the encoded training and validation data (not of where the files lie), so run ids and
    caches follow the data: the same files in another folder, or on another machine, give the same ids."""
    train, validation = split(ws, "train"), split(ws, "validation")
    return fingerprint(train.encoded["input_ids"], train.labels, validation.encoded["input_ids"], validation.labels)


def data_source(ws: Workspace) -> str:
    return f"train: {split(ws, 'train').examples.source}; validation: {split(ws, 'validation').examples.source}"


def data_files(ws: Workspace, matrices_from: str | None = None) -> dict[str, Path]:
    """The data files a record of this task reads (training, validation, and ``matrices_from``'s training text),
    named as the records' ``data_source`` shows them; hub data has none."""
    sources = [split(ws, "train").examples.source, split(ws, "validation").examples.source]
    if matrices_from and matrices_from != ws.config.task:
        sources.append(unlabeled_split(ws, matrices_from).examples.source)
    return {name: path for source in sources for name, path in source_files(source).items()}


def seed_rows(ws: Workspace, seed: int) -> torch.Tensor:
    """The training examples of ``seed``: a seeded subset of ``limit`` examples, or the whole training set."""
    n = len(split(ws, "train"))
    limit = ws.config.limit
    if limit is None or limit >= n:
        return torch.arange(n)
    generator = torch.Generator().manual_seed(1_000_033 * ws.config.data_seed + seed)
    return torch.randperm(n, generator=generator)[:limit].sort().values


def seed_plan(ws: Workspace, seed: int) -> SeedPlan:
    """``seed``'s training rows and its held-out slice for early stopping."""
    train, heldout = heldout_split(seed_rows(ws, seed), HELDOUT_FRACTION, seed)
    return SeedPlan(seed, train, heldout)


def store_rows(ws: Workspace, seeds=()) -> torch.Tensor:
    """Training examples the feature store covers: the union of the subsets of ``seeds``, the seeds a call trains
    (default: the configured seeds). A resumed run that has only some seeds left extracts and keeps only their
    rows: with ``limit`` 8,000 of SST-2's 67,349, seven seeds cover 58% of the training set, ten seeds 72%."""
    chosen = sorted(set(seeds)) or sorted(set(ws.config.seeds))
    return torch.unique(torch.cat([seed_rows(ws, s) for s in chosen]))


# ---------------------------------------------------------------------- stage 2: constant matrices (Sec. 3.1, 5.3)
def unlabeled_split(ws: Workspace, source_task: str | None = None) -> EncodedSplit:
    """The whole training text of ``source_task`` (default: this task) encoded at this task's L."""
    source_task = source_task or ws.config.task
    if source_task == ws.config.task:
        return split(ws, "train")
    examples = tasks.unlabeled_texts(source_task, data_dir=ws.config.data_dir)
    return encode_split(ws.tokenizer, tasks.TASKS[source_task], examples, ws.config.max_length)


def averaged_split(ws: Workspace, source_task: str | None = None) -> EncodedSplit:
    """The text the constant matrices average over: :func:`unlabeled_split`, or a seeded subset of
    ``average_limit`` of its examples."""
    text, limit = unlabeled_split(ws, source_task), ws.config.average_limit
    count = int(text.encoded["input_ids"].shape[0])
    if limit is None or limit >= count:
        return text
    generator = torch.Generator().manual_seed(1_000_037 * ws.config.data_seed + 17)
    rows = torch.randperm(count, generator=generator)[:limit].sort().values
    labels = text.labels[rows] if text.labels.shape[:1] == (count,) else text.labels
    return EncodedSplit(select_rows(text.encoded, rows), labels, text.examples)


def packed_batches(model, encoded, batch_size: int, rows=None, use_packing: bool = True):
    """Length-sorted batches of ``rows`` (default all), packed to their real tokens where the model allows it."""
    lengths = encoded["attention_mask"].sum(dim=1)
    for chunk in length_sorted_chunks(lengths, batch_size, rows):
        part = select_rows(encoded, chunk)
        yield pack(part, model=model) if use_packing and supports_packing(model) else part


def constants_path(ws: Workspace, source_task: str | None = None, kind: str = "average") -> Path | None:
    """Where :func:`constants` keeps the matrices of ``kind`` from ``source_task``'s text: keyed by the model, L, the
    averaged text's fingerprint and the task's provenance (None without a results folder)."""
    source_task = source_task or ws.config.task
    if ws.results_dir is None:
        return None
    text = fingerprint(averaged_split(ws, source_task).encoded["input_ids"])
    key = results.config_hash({"model": model_id(ws.model), "source": source_task, "L": ws.config.max_length,
                               "text": text,
                               **({"kind": kind} if kind != "average" else {}), **task_provenance(source_task)})
    prefix = source_task if kind == "average" else f"{source_task}-{kind}"
    return ws.under("matrices", f"{prefix}-L{ws.config.max_length}-{key}.safetensors")


def constants(ws: Workspace, source_task: str | None = None, kind: str = "average") -> ConstantAttention:
    """Constant matrices of ``kind`` (a registered builder; Eq. 2 for ``average``) from the training text of
    ``source_task``, labels unused; cached in memory and under ``results_dir/matrices``."""
    source_task = source_task or ws.config.task
    if (source_task, kind) in ws.constants_cache:
        return ws.constants_cache[(source_task, kind)]
    cfg, path = ws.config, constants_path(ws, source_task, kind)
    matrices = read_or_heal(path, ConstantAttention.load)  # None: absent, or damaged and set aside
    if matrices is None:
        text_split = averaged_split(ws, source_task)
        builder, accepts_packed = constant_builder(kind)
        batches = list(packed_batches(ws.model, text_split.encoded, cfg.feature_batch_size,
                                      use_packing=cfg.packed and accepts_packed))
        matrices = builder(ws.model, batches, progress=ws.progress, total=len(batches),
                           source=f"{source_task} train: {text_split.examples.source}")
        if path is not None:
            matrices.save(path)
    matrices.check_compatible(ws.model, cfg.max_length)
    ws.constants_cache[(source_task, kind)] = matrices
    return matrices


# ---------------------------------------------------------------------- stage 3, learned: λ (Sec. 3.2)
def lambda_path(ws: Workspace, source: str, seed: int) -> Path | None:
    cfg = ws.config
    key = results.config_hash({"model": model_id(ws.model), "task": cfg.task, "matrices_from": source,
                               "L": cfg.max_length, "limit": cfg.limit, "epochs": cfg.lambda_epochs,
                               "lr": cfg.learning_rate, "bs": cfg.batch_size, "lambda_lr": cfg.lambda_learning_rate,
                               "seed": seed, "data_seed": cfg.data_seed,
                               **({"average_limit": cfg.average_limit} if cfg.average_limit is not None else {}),
                               **task_provenance(cfg.task), **task_provenance(source, "source")})
    return ws.under("lambdas", f"{cfg.task}-from-{source}-{key}{LAMBDA_SUFFIX}")


#: λ files are safetensors, like the constant matrices: one tensor ``lambda`` of shape [layers, heads].
LAMBDA_SUFFIX = ".safetensors"


def write_lambdas(path: Path, lambdas: torch.Tensor) -> None:
    """Save λ ``[layers, heads]`` atomically (with its checksum file) as safetensors."""
    from safetensors.torch import save_file

    write_atomic(path, lambda tmp: save_file({"lambda": lambdas.detach().float().contiguous().cpu()}, str(tmp)))


def read_lambdas(path: Path) -> torch.Tensor:
    """λ ``[layers, heads]`` from a file :func:`write_lambdas` wrote."""
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    if "lambda" not in tensors:
        raise ValueError(f"{path}: no 'lambda' tensor (found {sorted(tensors)})")
    return tensors["lambda"]


def lambda_seed(ws: Workspace, seed: int) -> int:
    """The seed whose λ ranks the heads of ``seed``'s run: its own, or the config's shared ``lambda_seed``."""
    return seed if ws.config.lambda_seed is None else ws.config.lambda_seed


def new_probe(ws: Workspace) -> torch.nn.Module:
    """A fresh probe of the task's kind over every layer's features (Sec. 3.3)."""
    hidden = ws.model.config.hidden_size
    return probes.make_probe(ws.spec.kind, ws.layers + 1, ws.config.max_length, hidden, ws.spec.num_labels)


def learn_lambdas(ws: Workspace, matrices_from: str | None = None, seed: int = 0) -> torch.Tensor:
    """Train θ (λ = σ(θ)) of every head jointly with a probe on ``seed``'s training rows
    (:func:`papa_lib.experiments.inloop.learn_lambdas`); λ ``[layers, heads]``, saved under ``results_dir/lambdas``."""
    from .inloop import BackboneProbe, inloop_batches
    from .inloop import learn_lambdas as learn

    source = matrices_from or ws.config.task
    if ("lambda", source, seed) in ws.scores:
        return ws.scores[("lambda", source, seed)]
    cfg, path = ws.config, lambda_path(ws, source, seed)
    lambdas = read_or_heal(path, read_lambdas)  # None: absent, or damaged and set aside
    if lambdas is None:
        matrices, train = constants(ws, source), split(ws, "train")
        probes.set_seed(seed)
        probe = new_probe(ws)
        lambdas = learn(
            ws.model, matrices, probe,
            lambda state: BackboneProbe(ws.model, probe, ws.spec.kind, cfg.packed).to(cfg.device),
            inloop_batches(train.encoded, train.labels, ws.spec.kind, seed_plan(ws, seed).train, cfg.batch_size,
                           seed),
            seed=seed, epochs=cfg.lambda_epochs, learning_rate=cfg.learning_rate,
            theta_learning_rate=cfg.lambda_learning_rate, device=cfg.device,
            progress=f"learning λ ({ws.config.task}, seed {seed})" if ws.progress else False)
        if path is not None:
            write_lambdas(path, lambdas)
    ws.scores[("lambda", source, seed)] = lambdas
    return lambdas
