"""PAPA on a decoder's own objective: next-token loss on WikiText-2 with some heads constant (issue 60).

The paper explains its large MLM drops by the models being specialised in their pretraining objective (Sec. 5.5);
no encoder here has its MLM head, but a causal LM's own tied head measures that objective directly. This module runs
PAPA's Fig. 2 on it: the fraction of the heads kept input-dependent against the next-token negative log-likelihood
(nats per predicted token), per head order, plus the data-free alternatives with every head replaced.

The experiment, declared in a grid file's ``language_model:`` section (:class:`LMSettings`), runs in five steps:

1. **Windows** (:func:`token_windows`): the corpus split's article lines (:func:`~papa_lib.experiments.tasks.
   load_wikitext`, headings dropped) joined by newlines and tokenized once without special tokens, cut into
   consecutive non-overlapping windows of ``length - 1`` tokens; ``count`` of them evenly spaced over the split
   (window ``i * (n // count)``), each prefixed with ``<bos>``: a ``[count, length]`` tensor, no padding.
2. **Constants** (Eq. 2): :func:`papa_lib.core.averaging.average_attention` over ``average_windows`` validation
   windows, through the causal seam (entries above the diagonal and outside a local layer's window are 0).
3. **λ on the LM loss** (Eq. 3, :func:`learn_lm_lambdas`): every head mixed, B = λA + (1-λ)C with one θ per query
   head (λ = σ(θ), θ = 0 at the start), θ trained with Adam on the mean next-token loss
   (:func:`papa_lib.core.decoders.next_token_nll_backward`) over ``lambda_windows`` validation windows for
   ``lambda_epochs`` epochs, one window per step, the window order shuffled by ``lambda_seed``; the model's own
   weights stay frozen. λ is saved at :func:`lm_lambdas_path`, where the probes' ``lm_lambda`` order reads it.
4. **Runs** (:func:`lm_runs`, :func:`run_language_model`): the original model; for each order and each fraction
   strictly between 0 and 1, the first ``72 - round(fraction * 72)`` heads of that order constant (the ``random``
   order once per ``random_seeds`` entry); every head constant; every head replaced by each data-free alternative;
   and the model-free ``unigram`` baseline (:func:`unigram_nll`: no context at all, the floor of claim C10).
   Each run's record holds the mean NLL of every test window (``window_nll``), so that intervals resample windows.
   Records go to ``results_dir/lm/results.csv`` as each run finishes; a run whose id is there is skipped (resume).
5. **Intervals** (:func:`nll_interval`, :func:`paired_difference`): the percentile bootstrap over test windows
   (``resamples`` draws, generator seed ``bootstrap_seed``), paired for differences (the same windows resampled for
   both runs); a ``random`` order's value is the mean over its seeds, window by window.
"""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ..core.artefacts import read_or_heal, write_atomic
from ..core.averaging import ConstantAttention, average_attention
from ..core.decoders import next_token_nll, next_token_nll_backward
from ..core.models import frozen_parameters, model_device, model_id, num_layers_and_heads
from ..core.override import AttentionOverride, override
from .provenance import config_hash, run_provenance
from .selection import num_input_dependent, replacement_order
from .summaries import percentile_interval
from .tasks import load_wikitext
from .workspace import read_lambda_info, read_lambdas, write_lambdas

__all__ = [
    "DATA_FREE",
    "UNIGRAM",
    "LMRun",
    "LMSettings",
    "learn_lm_lambdas",
    "lm_lambdas_path",
    "lm_records",
    "lm_results_path",
    "lm_runs",
    "nll_interval",
    "paired_difference",
    "plan_language_model",
    "read_lm_lambdas",
    "run_language_model",
    "runs_of",
    "constant_share",
    "token_windows",
    "unigram_nll",
    "window_nll",
]

#: The data-free alternatives a decoder's heads can be replaced by (:data:`papa_lib.core.override.MODES`).
DATA_FREE = ("identity", "zeros", "previous", "uniform")
#: The baseline run that uses no context at all: each test token's probability under the validation split's token
#: frequencies, add-one smoothed over the vocabulary (the floor of claim C10, decision rule R12).
UNIGRAM = "unigram"

#: The record's columns, in order.
COLUMNS = ("run_id", "model", "corpus", "length", "matrix_type", "order", "fraction", "seed", "input_dependent",
           "replaced", "nll", "windows", "tokens", "window_nll", "seconds", "device", "git_commit", "data_sha256",
           "torch_version", "transformers_version", "processor", "threads", "finished")


@dataclass(frozen=True)
class LMSettings:
    """A grid file's ``language_model:`` section (see the module docstring for what each step does)."""

    corpus: str = "wikitext-2"
    length: int = 1024
    test_windows: int = 32
    average_windows: int = 32
    lambda_windows: int = 32
    lambda_epochs: int = 2
    lambda_learning_rate: float = 0.05
    lambda_seed: int = 0
    orders: tuple[str, ...] = ("lambda", "reversed", "random")
    random_seeds: tuple[int, ...] = (0, 1, 2)
    fractions: tuple[float, ...] = (1, 0.5, 0.125, 0.0625, 0)
    alternatives: tuple[str, ...] = DATA_FREE
    resamples: int = 2000
    bootstrap_seed: int = 0

    @classmethod
    def from_mapping(cls, values: dict | None) -> LMSettings:
        values = dict(values or {})
        for key in ("orders", "random_seeds", "fractions", "alternatives"):
            if key in values:
                values[key] = tuple(values[key])
        return cls(**values)


@dataclass(frozen=True)
class LMRun:
    """One run of the LM experiment: a matrix type (``original``, ``average`` or a data-free mode), an order, the
    fraction of heads kept input-dependent and the random order's seed (0 for the others)."""

    matrix_type: str
    order: str
    fraction: float
    seed: int = 0

    @property
    def uses_lambda(self) -> bool:
        return self.order in ("lambda", "reversed")


def lm_lambdas_path(results_dir: str | Path) -> Path:
    """Where the LM experiment saves the λ it learned on the LM loss (``[layers, heads]``, safetensors; the settings,
    epoch losses and seconds it was learned with are in its metadata, read by
    :func:`papa_lib.experiments.workspace.read_lambda_info`)."""
    return Path(results_dir) / "lm" / "lambdas.safetensors"


def lm_results_path(results_dir: str | Path) -> Path:
    """The LM experiment's records (one CSV row per run)."""
    return Path(results_dir) / "lm" / "results.csv"


def read_lm_lambdas(results_dir: str | Path) -> torch.Tensor:
    """The λ learned on the LM loss, for ranking heads of the same decoder on other tasks (probes)."""
    path = lm_lambdas_path(results_dir)
    lambdas = read_or_heal(path, read_lambdas)  # None: absent, or damaged and set aside
    if lambdas is None:
        from ..errors import PapaInputError

        raise PapaInputError(f"{path}: no λ learned on the LM loss yet; run the grid's language_model section first")
    return lambdas


# ---------------------------------------------------------------------------------------------- the data
def token_windows(tokenizer, lines: Iterable[str], length: int, count: int, *, spaced: bool = True) -> torch.Tensor:
    """``count`` windows of ``[bos] + (length - 1)`` tokens of ``lines`` joined by newlines (tokenized once without
    special tokens, cut into consecutive non-overlapping pieces of ``length - 1``): evenly spaced over the text
    (window ``i * (n // count)`` of its ``n``), or with ``spaced=False`` the first ``count``, consecutive."""
    if length < 2 or count < 1:
        raise ValueError(f"windows need length >= 2 and count >= 1, got length={length}, count={count}")
    ids = tokenizer("\n".join(lines), add_special_tokens=False)["input_ids"]
    size = length - 1
    available = len(ids) // size
    if available < count:
        raise ValueError(f"the text has {available} windows of {size} tokens, fewer than the {count} asked for")
    bos = tokenizer.bos_token_id
    if bos is None:
        raise ValueError("the tokenizer has no <bos> token to start each window with")
    step = available // count if spaced else 1
    rows = [[bos] + ids[i * step * size:(i * step + 1) * size] for i in range(count)]
    return torch.tensor(rows, dtype=torch.long)


def corpus_windows(tokenizer, settings: LMSettings, data_dir) -> dict[str, torch.Tensor]:
    """The test windows and the validation windows the constants and λ use (validation window ``i`` serves both)."""
    name = settings.corpus
    test = token_windows(tokenizer, load_wikitext("test", data_dir, name=name), settings.length, settings.test_windows)
    count = max(settings.average_windows, settings.lambda_windows)
    valid = token_windows(tokenizer, load_wikitext("validation", data_dir, name=name), settings.length, count)
    return {"test": test, "average": valid[:settings.average_windows], "lambda": valid[:settings.lambda_windows]}


def _batch(row: torch.Tensor) -> dict:
    return {"input_ids": row[None], "attention_mask": torch.ones_like(row[None])}


def unigram_nll(tokenizer, reference_lines: Iterable[str], windows: torch.Tensor) -> np.ndarray:
    """Mean NLL of each window's predicted tokens (all but the first) under the unigram distribution of
    ``reference_lines`` (joined by newlines, tokenized without special tokens), add-one smoothed over the
    tokenizer's vocabulary: the model-free floor of claim C10 (decision rule R12)."""
    ids = tokenizer("\n".join(reference_lines), add_special_tokens=False)["input_ids"]
    size = max(len(tokenizer), int(windows.max()) + 1)
    counts = np.bincount(np.asarray(ids, dtype=np.int64), minlength=size).astype(np.float64) + 1.0
    log_p = np.log(counts) - np.log(counts.sum())
    return np.asarray([-log_p[row[1:].numpy()].mean() for row in windows], dtype=np.float64)


# ---------------------------------------------------------------------------------------------- the measurements
def window_nll(model, windows: torch.Tensor, state: AttentionOverride | None = None) -> np.ndarray:
    """Mean next-token NLL (nats per predicted token) of each window, under ``state`` (``None``: the original)."""
    values = []
    with override(model, state=state) if state is not None else nullcontext():
        for row in windows:
            total, count = next_token_nll(model, _batch(row))
            values.append(total / count)
    return np.asarray(values, dtype=np.float64)


def learn_lm_lambdas(model, constants: ConstantAttention, windows: torch.Tensor, *, epochs: int = 2,
                     learning_rate: float = 0.05, seed: int = 0, progress: Callable[[int, float], None] | None = None
                     ) -> tuple[torch.Tensor, list[float]]:
    """λ per query head learned on the LM loss (step 3 of the module docstring): ``(λ [layers, heads], the mean loss
    of each epoch)``. The model's parameters are frozen during training and restored afterwards."""
    state = AttentionOverride(model, constants, heads="all", mode="mix")
    optimizer = torch.optim.Adam([state.theta], lr=learning_rate)
    generator = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    step = 0
    with frozen_parameters(model), override(model, state=state):
        for _ in range(epochs):
            total = tokens = 0
            for index in torch.randperm(len(windows), generator=generator).tolist():
                optimizer.zero_grad(set_to_none=True)
                loss, count = next_token_nll_backward(model, _batch(windows[index]))
                optimizer.step()
                total, tokens, step = total + loss, tokens + count, step + 1
                if progress is not None:
                    progress(step, loss / count)
            losses.append(total / tokens)
    return state.lambdas().detach().cpu(), losses


def lm_runs(settings: LMSettings) -> list[LMRun]:
    """Every run the settings declare, in the order they run (the original first)."""
    runs = [LMRun("original", "none", 1.0)]
    for order in settings.orders:
        seeds = settings.random_seeds if order == "random" else (0,)
        for fraction in settings.fractions:
            if 0.0 < fraction < 1.0:
                runs.extend(LMRun("average", order, float(fraction), int(seed)) for seed in seeds)
    runs.append(LMRun("average", "all", 0.0))
    runs.extend(LMRun(mode, "all", 0.0) for mode in settings.alternatives)
    runs.append(LMRun(UNIGRAM, "none", 0.0))  # the no-information baseline of claim C10 (decision rule R12)
    return runs


def run_id(model_id: str, settings: LMSettings, run: LMRun) -> str:
    """A run's id: what its number depends on (λ settings only for the λ orders)."""
    config = {"model": model_id, "corpus": settings.corpus, "length": settings.length,
              "test_windows": settings.test_windows, "run": asdict(run)}
    if run.matrix_type == "average":
        config["average_windows"] = settings.average_windows
    if run.uses_lambda:
        config["lambda"] = {k: getattr(settings, k) for k in ("lambda_windows", "lambda_epochs",
                                                               "lambda_learning_rate", "lambda_seed")}
    return "lm-" + config_hash(config)


def _replaced_heads(run: LMRun, num_layers: int, num_heads: int, lambdas: torch.Tensor | None):
    total = num_layers * num_heads
    if run.order in ("none", "all"):
        return [] if run.matrix_type == "original" else "all"
    ordered = replacement_order(run.order, num_layers, num_heads, lambdas=lambdas, seed=run.seed)
    return ordered[:total - num_input_dependent(run.fraction, total)]


# ---------------------------------------------------------------------------------------------- records
def lm_records(results_dir: str | Path) -> list[dict]:
    """The LM experiment's records (``window_nll`` as a list of floats); none yet: ``[]``."""
    path = lm_results_path(results_dir)
    if not path.is_file():
        return []
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        for key in ("length", "seed", "input_dependent", "replaced", "windows", "tokens", "threads"):
            row[key] = int(row[key])
        for key in ("fraction", "nll", "seconds"):
            row[key] = float(row[key])
        row["window_nll"] = [float(v) for v in row["window_nll"].split()]
    return rows


def _append(path: Path, record: dict) -> None:
    existing = path.read_text(encoding="utf-8") if path.is_file() else ""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    if not existing:
        writer.writeheader()
    writer.writerow(record)
    write_atomic(path, lambda tmp: tmp.write_text(existing + buffer.getvalue(), encoding="utf-8"), sums=False)


# ---------------------------------------------------------------------------------------------- the experiment
def run_language_model(model, tokenizer, settings: LMSettings, results_dir: str | Path, data_dir=None, *,
                       progress: bool = True, log: Callable[[str], None] = print) -> list[dict]:
    """Run (or resume) every run of :func:`lm_runs`; returns all records. Constants are cached under
    ``results_dir/lm/matrices/``; λ at :func:`lm_lambdas_path` (learned once, reused)."""
    from tqdm.auto import tqdm

    results_dir = Path(results_dir)
    name = model_id(model)
    done = {row["run_id"] for row in lm_records(results_dir)}
    runs = [run for run in lm_runs(settings) if run_id(name, settings, run) not in done]
    if not runs:
        return lm_records(results_dir)
    windows = corpus_windows(tokenizer, settings, data_dir)
    num_layers, num_heads = num_layers_and_heads(model)
    constants = None
    if any(run.matrix_type == "average" for run in runs):
        constants = _constants(model, settings, windows["average"], results_dir, log)
    lambdas = None
    if any(run.uses_lambda for run in runs):
        lambdas = _lambdas(model, constants, settings, windows["lambda"], results_dir, log)
    data_files = _data_files(data_dir, settings.corpus)
    device = str(model_device(model))
    for run in tqdm(runs, disable=not progress, desc="language-model runs"):
        started = time.time()
        if run.matrix_type == UNIGRAM:
            values, replaced = unigram_nll(tokenizer, load_wikitext("validation", data_dir, name=settings.corpus),
                                           windows["test"]), 0
        else:
            heads = _replaced_heads(run, num_layers, num_heads, lambdas)
            state = None
            if run.matrix_type != "original":
                mode = "constant" if run.matrix_type == "average" else run.matrix_type
                state = AttentionOverride(model, constants if mode == "constant" else None, heads=heads, mode=mode)
            values = window_nll(model, windows["test"], state)
            replaced = num_layers * num_heads if heads == "all" else len(heads)
        record = {
            "run_id": run_id(name, settings, run), "model": name, "corpus": f"{settings.corpus} test",
            "length": settings.length, "matrix_type": run.matrix_type, "order": run.order,
            "fraction": run.fraction, "seed": run.seed,
            "input_dependent": 0 if run.matrix_type == UNIGRAM else num_layers * num_heads - replaced,
            "replaced": replaced, "nll": float(values.mean()), "windows": len(values),
            "tokens": len(values) * (settings.length - 1), "window_nll": " ".join(f"{v:.6f}" for v in values),
            "seconds": round(time.time() - started, 1), "device": device,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        record.update(run_provenance(device, data_files))
        record = {key: record.get(key) for key in COLUMNS}
        _append(lm_results_path(results_dir), record)
        log(f"lm {run.matrix_type} {run.order} {run.fraction:g} seed {run.seed}: {record['nll']:.4f} nats/token "
            f"({record['seconds']:.0f} s)")
    return lm_records(results_dir)


def _data_files(data_dir, corpus: str) -> dict[str, Path]:
    if data_dir is None:
        return {}
    folder = Path(data_dir) / corpus
    return {f"{corpus}/{name}": folder / name for name in ("wiki.valid.tokens", "wiki.test.tokens")}


def _constants_path(results_dir: str | Path, settings: LMSettings) -> Path:
    """Where the constants of ``settings`` (averaged over its ``average_windows``) are cached."""
    name = f"average-{settings.corpus}-L{settings.length}-n{settings.average_windows}.safetensors"
    return Path(results_dir) / "lm" / "matrices" / name


def _lambda_settings(settings: LMSettings) -> dict:
    """What the learned λ depends on (kept beside it, so a changed setting learns it again)."""
    return {k: getattr(settings, k) for k in ("corpus", "length", "average_windows", "lambda_windows",
                                              "lambda_epochs", "lambda_learning_rate", "lambda_seed")}


def _lambdas_stored(results_dir: str | Path, settings: LMSettings) -> bool:
    """Whether λ learned under ``settings`` is stored (for the plan, which reads and moves nothing: an unreadable
    file counts as not stored)."""
    path = lm_lambdas_path(results_dir)
    try:
        return path.is_file() and read_lambda_info(path).get("settings") == _lambda_settings(settings)
    except Exception:  # noqa: BLE001 - a damaged file is learned again
        return False


def _stored_lambdas(results_dir: str | Path, settings: LMSettings) -> torch.Tensor | None:
    """The λ stored for ``settings``; ``None`` when absent, learned under other settings (then overwritten), or
    damaged (then set aside with a notice, as the grid's λ are: :func:`papa_lib.core.artefacts.read_or_heal`)."""
    def read(path: Path) -> torch.Tensor | None:
        return read_lambdas(path) if read_lambda_info(path).get("settings") == _lambda_settings(settings) else None

    return read_or_heal(lm_lambdas_path(results_dir), read)


def _constants(model, settings: LMSettings, windows: torch.Tensor, results_dir: Path, log) -> ConstantAttention:
    path = _constants_path(results_dir, settings)
    stored = read_or_heal(path, ConstantAttention.load)  # None: absent, or damaged and set aside
    if stored is not None:
        return stored
    started = time.time()
    batches = [_batch(row) for row in windows]
    constants = average_attention(model, batches, progress=False,
                                  source=f"{settings.corpus} validation, {len(windows)} windows of {settings.length}")
    constants.save(path)
    log(f"lm constants: {len(windows)} validation windows averaged in {time.time() - started:.0f} s")
    return constants


def _lambdas(model, constants, settings: LMSettings, windows: torch.Tensor, results_dir: Path, log) -> torch.Tensor:
    stored = _stored_lambdas(results_dir, settings)
    if stored is not None:
        return stored
    path = lm_lambdas_path(results_dir)
    started = time.time()
    lambdas, losses = learn_lm_lambdas(model, constants, windows, epochs=settings.lambda_epochs,
                                       learning_rate=settings.lambda_learning_rate, seed=settings.lambda_seed)
    seconds = round(time.time() - started, 1)
    write_lambdas(path, lambdas, {"settings": _lambda_settings(settings), "epoch_loss": losses, "seconds": seconds})
    log(f"lm λ: {settings.lambda_epochs} epochs on {len(windows)} windows in {seconds:.0f} s; "
        f"epoch losses {', '.join(f'{v:.4f}' for v in losses)}")
    return lambdas


# ---------------------------------------------------------------------------------------------- intervals
@dataclass(frozen=True)
class Interval:
    """A value with its percentile-bootstrap 95% interval over test windows."""

    value: float
    low: float
    high: float
    resamples: int = 2000


def _per_window(records: list[dict]) -> np.ndarray:
    """The window-by-window mean over ``records`` (a random order's seeds), checked to cover the same windows."""
    arrays = [np.asarray(r["window_nll"], dtype=np.float64) for r in records]
    if not arrays or len({len(a) for a in arrays}) != 1:
        raise ValueError("records to combine must exist and cover the same number of windows")
    return np.mean(arrays, axis=0)


def _bootstrap(statistic: Callable[[np.ndarray], np.ndarray], windows: int, resamples: int, seed: int) -> Interval:
    """``statistic`` of the windows (it maps index arrays ``[..., windows]`` to values) with its percentile
    bootstrap 95% interval: ``resamples`` draws of the windows with replacement, the same draws for every series the
    statistic reads (paired)."""
    rng = np.random.default_rng(seed)
    draws = statistic(rng.integers(0, windows, size=(resamples, windows)))
    low, high = percentile_interval(draws, 0.95)
    return Interval(float(statistic(np.arange(windows))), float(low), float(high), resamples)


def _mean_of(values: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    return lambda index: values[index].mean(axis=-1)


def nll_interval(records: list[dict], resamples: int = 2000, seed: int = 0) -> Interval:
    """Mean NLL of ``records`` (one run, or a random order's seeds) with its bootstrap interval over windows."""
    values = _per_window(records)
    return _bootstrap(_mean_of(values), len(values), resamples, seed)


def paired_difference(variant: list[dict], reference: list[dict], resamples: int = 2000, seed: int = 0) -> Interval:
    """``variant − reference`` mean NLL (positive: the variant predicts worse), windows resampled in pairs."""
    values = _per_window(variant) - _per_window(reference)
    return _bootstrap(_mean_of(values), len(values), resamples, seed)


def runs_of(records: list[dict], matrix_type: str, order: str = "all", fraction: float | None = None) -> list[dict]:
    """The records of one configuration (every seed of a random order)."""
    return [r for r in records if r["matrix_type"] == matrix_type and r["order"] == order
            and (fraction is None or abs(r["fraction"] - fraction) < 1e-9)]


def constant_share(records: list[dict], unit: str = "chance", resamples: int = 2000, seed: int = 0) -> Interval:
    """What every head constant costs the LM, windows resampled in pairs (decision rule R12): ``chance``, the share
    of the original's advantage over the unigram baseline lost, ``(NLL_const - NLL_orig) / (NLL_unigram -
    NLL_orig)``; ``relative``, C1a's relative drop of the score -NLL, ``(NLL_const - NLL_orig) / NLL_orig``."""
    original = _per_window(runs_of(records, "original", "none"))
    constant = _per_window(runs_of(records, "average", "all", 0.0))
    if unit == "chance":
        floor = _per_window(runs_of(records, UNIGRAM, "none"))
    elif unit == "relative":
        floor = None
    else:
        raise ValueError(f"unknown unit {unit!r} (chance or relative)")

    def share(index):
        o, c = original[index].mean(axis=-1), constant[index].mean(axis=-1)
        return (c - o) / ((floor[index].mean(axis=-1) - o) if floor is not None else o)

    return _bootstrap(share, len(original), resamples, seed)


def plan_language_model(model, settings: LMSettings, results_dir: str | Path | None = None) -> dict:
    """What ``papa grid --plan`` says of a ``language_model`` section; nothing is trained. Times one window of
    ``length`` tokens through the model and its chunked LM loss, then counts: ``runs`` declared, ``stored`` (their
    ids already in the records), ``left``, whether constants and λ are stored, and ``seconds``, an estimate of what
    is left (a scored window per test window and run; λ training as three forward passes per step; averaging as
    one pass per window)."""
    runs = lm_runs(settings)
    done = {row["run_id"] for row in lm_records(results_dir)} if results_dir is not None else set()
    left = [run for run in runs if run_id(model_id(model), settings, run) not in done]
    vocabulary = int(getattr(model.config, "vocab_size", 1000))
    window = torch.randint(0, vocabulary, (settings.length,))
    started = time.time()
    window_nll(model, window[None])
    per_window = time.time() - started
    lambdas_stored = results_dir is not None and _lambdas_stored(results_dir, settings)
    constants_stored = results_dir is not None and _constants_path(results_dir, settings).is_file()
    scored = sum(run.matrix_type != UNIGRAM for run in left) * settings.test_windows
    seconds = scored * per_window
    if any(run.uses_lambda for run in left) and not lambdas_stored:
        seconds += 3 * per_window * settings.lambda_windows * settings.lambda_epochs
    if any(run.matrix_type == "average" for run in left) and not constants_stored:
        seconds += per_window * settings.average_windows
    return {"runs": len(runs), "stored": len(runs) - len(left), "left": len(left), "seconds_per_window": per_window,
            "lambdas_stored": lambdas_stored, "constants_stored": constants_stored, "seconds": seconds,
            "tokens_per_second": settings.length / per_window if per_window > 0 else float("inf")}
