"""What a run costs, in one model: the FLOPs of a transformer layer (:func:`layer_flops`; the benchmarks' limit of the
all-constant speed-up, :func:`flop_limit`, and the encoders' relative compute, :func:`encoder_cost_ratio`, both come
from it), the bytes of a task's frozen features (:func:`feature_cache_bytes`, the scale chapter's, from
:func:`papa_lib.experiments.features.feature_rows_bytes`, which ``papa grid --plan`` and the engine's cache decision
use too), and the scale chapter's compute estimates from the wall times of finished runs, scaled to other encoders
and to the paper's data sizes (:func:`run_costs`, :func:`estimate_compute`, :func:`grid_plan`).

The paper's training-set sizes are those of its Sec. 4.1 datasets; model shapes are the published configurations.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import pandas as pd

from ..book.figures import empty_frame, sort_by_task
from ..book.grid_views import check_frame
from ..experiments import matrices
from ..experiments.features import feature_rows_bytes
from ..experiments.grid import block_variants, grid_seeds, per_task_value

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


# ---------------------------------------------------------------------------------------------- the FLOP model
def layer_flops(length: int, hidden: int, intermediate: int, constant: bool, *, attention_width: int | None = None,
                kv_width: int | None = None, ffn_matrices: int = 2, attention_products: bool = True) -> int:
    """FLOPs of one transformer layer on one sequence of ``length`` tokens (1 multiply-add = 2 FLOPs).

    Original layer: the Q, K, V and O projections ``n·d·(a + 2·a_kv + a)·2`` (a = H·d′ the width of the query
    heads, a_kv = H_kv·d′ that of the key/value heads; an encoder has a = a_kv = d, so ``4·n·d²·2``), the scores QKᵀ
    and the product AV ``2·n²·a·2`` (summed over heads; grouped-query attention still computes them per query head)
    and the feed-forward block's ``ffn_matrices`` matrices ``m·n·d·d_ff·2`` (2 for BERT's, 3 for the gated blocks of
    Gemma and Llama). All-constant layer: only the V and O projections ``n·d·(a_kv + a)·2``, the product CV
    ``n²·a·2`` and the same feed-forward block. ``attention_products=False`` leaves the n² products (QKᵀ, AV, CV)
    out: what is left is linear in n, the same per token at every length.

    This is the paper's per-head count (Sec. 3.4: 2n²d′ + 3nd′² → n²d′ + nd′² multiply-adds, with the projection
    term read as n·d·d′ per head) summed over the H heads, plus the output projection and the feed-forward block,
    which the replacement does not touch. A decoder's causal mask and sliding window do not reduce the count: the
    eager attention and the fast path both compute the full ``n × n`` products. Softmax, scaling, masking, layer
    norms, rotary embeddings, activations and biases are not counted (they are O(n²·H) or O(n·d), small next to the
    matrix products in FLOPs, though not always in time).
    """
    n, d, f = int(length), int(hidden), int(intermediate)
    a = d if attention_width is None else int(attention_width)
    a_kv = a if kv_width is None else int(kv_width)
    feed_forward = int(ffn_matrices) * n * d * f * 2
    products = int(bool(attention_products))
    if constant:
        return n * d * (a_kv + a) * 2 + products * n * n * a * 2 + feed_forward
    return n * d * (2 * a + 2 * a_kv) * 2 + products * 2 * n * n * a * 2 + feed_forward


def lm_head_flops(length: int, hidden: int, vocab: int) -> int:
    """FLOPs of a decoder's LM head on one sequence of ``length`` tokens: the logits, ``n·d·V·2``."""
    return int(length) * int(hidden) * int(vocab) * 2


def flop_limit(length: int, hidden: int, intermediate: int, *, attention_width: int | None = None,
               kv_width: int | None = None, ffn_matrices: int = 2, layers: int = 1, other_flops: int = 0) -> float:
    """The FLOP-count limit of the all-constant speed-up: FLOPs(original stack) / FLOPs(all-constant stack).

    Every layer has the same shape, so without ``other_flops`` this is the per-layer ratio of :func:`layer_flops`.
    ``other_flops`` are the FLOPs of one sequence outside the ``layers`` layers that the replacement leaves alone (a
    decoder's LM head, :func:`lm_head_flops`): counted on both sides, they pull the limit towards 1.
    """
    shape = dict(attention_width=attention_width, kv_width=kv_width, ffn_matrices=ffn_matrices)
    original = layers * layer_flops(length, hidden, intermediate, False, **shape) + other_flops
    constant = layers * layer_flops(length, hidden, intermediate, True, **shape) + other_flops
    return original / constant


def decoder_shape(config) -> dict[str, int]:
    """The :func:`layer_flops` shape of a decoder's layers from its (text) config: ``hidden``, ``intermediate``,
    ``attention_width`` (H·d′), ``kv_width`` (H_kv·d′), ``ffn_matrices`` (3: the gated blocks of Gemma and Llama;
    2 for GPT-2), ``layers`` and ``vocab``."""
    config = getattr(config, "text_config", config)
    if getattr(config, "model_type", None) == "gpt2":
        hidden, heads = int(config.n_embd), int(config.n_head)
        intermediate, kv_heads, matrices = int(config.n_inner or 4 * hidden), heads, 2
        layers = int(config.n_layer)
        head_dim = hidden // heads
    else:
        hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
        intermediate, matrices, layers = int(config.intermediate_size), 3, int(config.num_hidden_layers)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    return {"hidden": hidden, "intermediate": intermediate, "attention_width": heads * head_dim,
            "kv_width": kv_heads * head_dim, "ffn_matrices": matrices, "layers": layers,
            "vocab": int(config.vocab_size)}


def encoder_cost_ratio(shape: Sequence[int], reference: Sequence[int] = MODEL_SHAPES["all-MiniLM-L6-v2"],
                       length: int | None = None) -> float:
    """Per-token compute of an encoder relative to ``reference``, from (layers, hidden, feed-forward) sizes: the
    ratio of their stacks' :func:`layer_flops` (original layers, a = a_kv = d, two feed-forward matrices).

    Without ``length`` the attention products are left out (``attention_products=False``): a layer then costs
    ``4 d^2`` (Q, K, V, output projections) + ``2 d d_ff`` (feed-forward) multiply-adds per token, whatever the
    length; the products themselves (``~2 L d`` per token) are small at L <= 256. With ``length`` they are counted
    at that sequence length L, for both encoders.
    """
    if length is not None and int(length) <= 0:
        raise ValueError(f"encoder_cost_ratio: length must be > 0, got {length}")

    def per_token(dims: Sequence[int]) -> float:
        if len(dims) != 3 or any(int(v) <= 0 for v in dims):
            raise ValueError(f"encoder_cost_ratio: a shape is (layers, hidden, feed_forward) > 0, got {tuple(dims)}")
        layers, hidden, ff = (int(v) for v in dims)
        if length is None:
            return layers * layer_flops(1, hidden, ff, False, attention_products=False)
        return layers * layer_flops(length, hidden, ff, False) / int(length)

    return per_token(shape) / per_token(reference)


# ---------------------------------------------------------------------------------------------- feature bytes
def feature_cache_bytes(kind: str, examples: int, layers: int, hidden: int, length: int | None = None,
                        bytes_per_value: int = 2, tokens_per_example: float | None = None,
                        positions: bool = False) -> int:
    """Bytes of frozen features of one split, float16, every layer and the embeddings
    (:func:`~papa_lib.experiments.features.feature_rows_bytes` of the split's rows; ``positions`` as there, left out
    by default).

    The feature store (:class:`papa_lib.experiments.features.FeatureStore`) keeps real tokens only: for a sentence
    task ``examples x tokens_per_example x (layers+1) x D``. Without ``tokens_per_example``, a sentence task counts
    every one of its ``L`` positions (``examples x (layers+1) x L x D``: what a padded cache would hold). Token tasks
    keep one vector per word and layer: ``examples (words) x (layers+1) x D``.
    """
    if kind not in ("sentence", "token"):
        raise ValueError(f"feature_cache_bytes: kind must be 'sentence' or 'token', got {kind!r}")
    if kind == "sentence" and not length and not tokens_per_example:
        raise ValueError("feature_cache_bytes: a sentence task needs its length L or its real tokens per example")
    per_example = (tokens_per_example or length) if kind == "sentence" else 1
    return feature_rows_bytes(int(examples) * per_example, layers, hidden, kind, positions=positions,
                              bytes_per_value=bytes_per_value)


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
        value = per_task_value(lengths, task)
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
