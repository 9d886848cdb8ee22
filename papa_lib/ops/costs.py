"""What a grid costs: compute estimates from the wall times of finished runs, scaled to other encoders and to the
paper's data sizes (the scale chapter), and the feature-cache bytes of a task.

The paper's training-set sizes are those of its Sec. 4.1 datasets; model shapes are the published configurations.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import pandas as pd

from ..book.figures import empty_frame, sort_by_task
from ..book.grid_views import block_variants, check_frame, grid_seeds
from ..experiments import matrices

#: Training-set sizes of the paper's data (GLUE train splits; CoNLL-2003 eng.train sentences), for estimates.
PAPER_TRAIN_SIZES = {"cola": 8551, "sst2": 67349, "mrpc": 3668, "mnli": 392702, "ner": 14041, "pos": 14041}
#: Words in CoNLL-2003 eng.train (the token tasks' probe sees one vector per word).
PAPER_TRAIN_WORDS = {"ner": 203621, "pos": 203621}
#: (layers, hidden size, feed-forward size) of the encoders the book runs, for :func:`encoder_cost_ratio`.
MODEL_SHAPES = {
    "all-MiniLM-L6-v2": (6, 384, 1536),
    "bert-base-uncased": (12, 768, 3072),
    "roberta-base": (12, 768, 3072),
    "microsoft/deberta-base": (12, 768, 3072),
    "google/electra-base-discriminator": (12, 768, 3072),
    "bert-large-uncased": (24, 1024, 4096),
    "roberta-large": (24, 1024, 4096),
    "microsoft/deberta-large": (24, 1024, 4096),
}


def encoder_cost_ratio(shape: Sequence[int], reference: Sequence[int] = MODEL_SHAPES["all-MiniLM-L6-v2"]) -> float:
    """Per-token compute of an encoder relative to ``reference``, from (layers, hidden, feed-forward) sizes.

    A layer costs about ``4 d^2`` (Q, K, V, output projections) + ``2 d d_ff`` (feed-forward) multiply-adds per
    token; the attention product itself (``~2 L d`` per token) is small at L <= 256 and left out.
    """
    def per_token(dims: Sequence[int]) -> float:
        if len(dims) != 3 or any(int(v) <= 0 for v in dims):
            raise ValueError(f"encoder_cost_ratio: a shape is (layers, hidden, feed_forward) > 0, got {tuple(dims)}")
        layers, hidden, ff = (int(v) for v in dims)
        return layers * (4 * hidden * hidden + 2 * hidden * ff)

    return per_token(shape) / per_token(reference)


def feature_cache_bytes(kind: str, examples: int, layers: int, hidden: int, length: int | None = None,
                        bytes_per_value: int = 2, tokens_per_example: float | None = None) -> int:
    """Bytes of frozen features of one split, float16, every layer and the embeddings.

    The feature store (:class:`papa_lib.experiments.features.FeatureStore`) keeps real tokens only: for a sentence
    task ``examples x tokens_per_example x (layers+1) x D``. Without ``tokens_per_example``, a sentence task counts
    every one of its ``L`` positions (``examples x (layers+1) x L x D``: what a padded cache would hold). Token tasks
    keep one vector per word and layer: ``examples (words) x (layers+1) x D``.
    """
    if kind not in ("sentence", "token"):
        raise ValueError(f"feature_cache_bytes: kind must be 'sentence' or 'token', got {kind!r}")
    if kind == "sentence" and not length and not tokens_per_example:
        raise ValueError("feature_cache_bytes: a sentence task needs its length L or its real tokens per example")
    positions = (tokens_per_example or length) if kind == "sentence" else 1
    return int(int(examples) * (int(layers) + 1) * int(hidden) * positions * int(bytes_per_value))


def _run_kind(matrix_type: str) -> str:
    """``in-loop`` for matrix types that train inside the backbone (registered as not ``frozen``), else ``frozen``."""
    entry = matrices.MATRIX_TYPES.get(str(matrix_type))
    trains = not entry.frozen if entry is not None else str(matrix_type).startswith("trainable")
    return "in-loop" if trains else "frozen"


def grid_plan(spec: Mapping, blocks: Iterable[str] | None = None) -> pd.DataFrame:
    """The runs a grid declares, per (block, task, kind): ``runs`` = distinct canonical variants x seeds.

    ``kind`` is ``in-loop`` for trainable matrices and ``frozen`` otherwise (see :func:`run_costs`). A variant that
    several of the chosen ``blocks`` share (e.g. the original model) is counted in the first block that declares
    it, as :func:`papa_lib.experiments.grid.grid_runs` runs it once.
    """
    if not isinstance(spec, Mapping) or "blocks" not in spec:
        raise ValueError("grid_plan: spec must be a grid mapping with 'blocks' (papa_lib.experiments.grid.load_grid)")
    n_seeds = len(grid_seeds(spec))
    wanted = None if blocks is None else set(blocks)
    seen: set = set()
    counts: dict[tuple[str, str, str], int] = {}
    for block in spec["blocks"]:
        for name, task, variant in block_variants(block):
            if (wanted is not None and name not in wanted) or (task, variant) in seen:
                continue
            seen.add((task, variant))
            key = (name, task, _run_kind(variant.matrix_type))
            counts[key] = counts.get(key, 0) + n_seeds
    rows = [(block, task, kind, runs) for (block, task, kind), runs in counts.items()]
    return pd.DataFrame(rows, columns=["block", "task", "kind", "runs"])


def run_costs(frame: pd.DataFrame, lengths: Mapping[str, int] | int, device: str | None = "cpu") -> pd.DataFrame:
    """Measured cost per (task, kind) of run: ``frozen`` (cached features) or ``in-loop`` (trainable matrices).

    ``lengths``: the sequence length L each task ran at (a mapping with an optional ``default``, or one int).
    ``device``: only runs recorded on this device (a frame without a ``device`` column is taken whole); ``None``
    takes every run. Runs made on another machine would mix two speeds in one cost.
    Columns: task, kind, runs, wall_hours (total), mean_wall_s (per run), train_size (mean), seconds_per_token
    (mean over runs of ``wall_time_s / (train_size * L)``, the unit :func:`estimate_compute` scales).
    """
    check_frame(frame, "run_costs", extra=("wall_time_s", "train_size"))
    columns = ["task", "kind", "runs", "wall_hours", "mean_wall_s", "train_size", "seconds_per_token"]
    rows = frame[frame["wall_time_s"].notna() & frame["train_size"].notna()].copy()
    if device is not None and "device" in rows.columns:
        rows = rows[rows["device"].astype(str).str.startswith(device)]
    if rows.empty:
        return empty_frame(columns)

    def length(task: str) -> int:
        if isinstance(lengths, Mapping):
            value = lengths.get(task, lengths.get("default"))
        else:
            value = lengths
        if value is None or int(value) <= 0:
            raise ValueError(f"run_costs: no sequence length for task {task!r} in {lengths!r}")
        return int(value)

    rows["kind"] = rows["matrix_type"].map(_run_kind)
    rows["train_size"] = rows["train_size"].astype(float)
    rows["seconds_per_token"] = rows["wall_time_s"] / (rows["train_size"] * rows["task"].map(length))
    grouped = rows.groupby(["task", "kind"], sort=False)
    out = grouped.agg(runs=("wall_time_s", "size"), wall_hours=("wall_time_s", "sum"),
                      mean_wall_s=("wall_time_s", "mean"), train_size=("train_size", "mean"),
                      seconds_per_token=("seconds_per_token", "mean")).reset_index()
    out["wall_hours"] = out["wall_hours"] / 3600.0
    return sort_by_task(out, before=(), after=["kind"])[columns]


def estimate_compute(costs: pd.DataFrame, plan: pd.DataFrame, lengths: Mapping[str, int],
                     train_sizes: Mapping[str, int] = PAPER_TRAIN_SIZES, cost_ratio: float = 1.0,
                     speedup: float = 1.0, epoch_factor: Mapping[str, float] | None = None) -> pd.DataFrame:
    """Scale measured per-token costs (:func:`run_costs`) to a planned grid.

    ``plan`` has one row per (task, kind) with ``runs`` (variants x seeds). Each planned run costs
    ``seconds_per_token x train_sizes[task] x lengths[task] x cost_ratio / speedup`` seconds, times
    ``epoch_factor[task]`` for ``in-loop`` runs (target over measured epochs; default 1). A (task, kind) we did not
    measure borrows the mean per-token cost of that kind over the measured tasks (``source`` says so); with no
    measurement of the kind at all, the mean over every measurement. Columns: task, kind, runs, seconds_per_token,
    source, hours.
    """
    for name in ("task", "kind", "runs"):
        if name not in plan.columns:
            raise ValueError(f"estimate_compute: plan lacks column {name!r}")
    if cost_ratio <= 0 or speedup <= 0:
        raise ValueError(f"estimate_compute: cost_ratio and speedup must be > 0, got {cost_ratio}, {speedup}")
    columns = ["task", "kind", "runs", "seconds_per_token", "source", "hours"]
    if costs.empty:
        raise ValueError("estimate_compute: no measured run costs (the results table has no wall times yet)")
    measured = {(r.task, r.kind): r.seconds_per_token for r in costs.itertuples(index=False)}
    per_kind = costs.groupby("kind")["seconds_per_token"].mean().to_dict()
    overall = float(costs["seconds_per_token"].mean())
    records = []
    for row in plan.itertuples(index=False):
        if row.task not in train_sizes or row.task not in lengths:
            raise ValueError(f"estimate_compute: no training-set size or length for task {row.task!r}")
        if (row.task, row.kind) in measured:
            unit, source = measured[(row.task, row.kind)], "measured"
        elif row.kind in per_kind:
            unit, source = per_kind[row.kind], f"mean of measured {row.kind} runs"
        else:
            unit, source = overall, "mean of all measured runs"
        factor = (epoch_factor or {}).get(row.task, 1.0) if row.kind == "in-loop" else 1.0
        seconds = row.runs * unit * train_sizes[row.task] * lengths[row.task] * cost_ratio * factor / speedup
        records.append((row.task, row.kind, int(row.runs), unit, source, seconds / 3600.0))
    return pd.DataFrame(records, columns=columns)
