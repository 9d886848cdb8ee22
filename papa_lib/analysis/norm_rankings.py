"""Norm-aware PAPA (beyond both papers; the book's chapter "Norm-based analysis").

Two ideas from Kobayashi et al. (2020) applied to PAPA (Hassid et al. 2022):

* :func:`norm_weighted_attention` builds constant matrices like PAPA's Eq. 2 (Sec. 3.1, pad-aware per-entry means) from
  the row-normalised norm-weighted attention ``w_ij = alpha_ij ||f(x_j)|| / sum_k alpha_ik ||f(x_k)||``
  (:func:`norm_weighted_rows`; matrix type ``norm_average``);
* :func:`input_dependence_scores` ranks heads without labels by the pooled per-entry variance of ``alpha`` (or ``w``)
  across inputs — the mean squared error of replacing the head by its constant matrix — an alternative to PAPA's
  learned λ (Sec. 3.2) (head orders ``attention_variance`` and ``norm_variance``).

This module registers the ``norm_average`` builder and matrix type (:mod:`papa_lib.experiments.matrices`) and the
two label-free rankings (:mod:`papa_lib.experiments.rankings`); ``import papa_lib`` imports it, so
:func:`papa_lib.experiments.grid.run_grid` (and a Ray worker) always has them.
:func:`norm_aware_blocks`/:func:`norm_aware_grid`
declare the grid (``data/results/norms-minilm/grid.yaml``); :func:`matrix_total_variation` compares two sets of
constant matrices.  The grid's records are read and compared with PAPA's own by :func:`norm_aware_results`,
:func:`label_free_comparison`, :func:`matrix_comparison`, :func:`head_score_table` and :func:`score_agreement`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd
import torch

from ..core.averaging import pair_mask
from ..experiments.matrices import register_matrix_type
from ..experiments.rankings import register_head_ranking
from .norms import attention_projections, encoder_layers, iter_alpha_and_fx_norms, prepare_batch

__all__ = [
    "INPUT_DEPENDENCE_WEIGHTINGS",
    "norm_weighted_rows",
    "norm_weighted_attention",
    "input_dependence_scores",
    "matrix_total_variation",
    "NORM_AWARE_ORDERS",
    "NORM_AWARE_FRACTIONS",
    "norm_aware_blocks",
    "norm_aware_grid",
    "NORM_RESULT_FOLDERS",
    "norm_results_folder",
    "norm_aware_results",
    "find_constant_matrices",
    "label_free_comparison",
    "matrix_comparison",
    "head_score_table",
    "head_scores",
    "score_agreement",
]

INPUT_DEPENDENCE_WEIGHTINGS: tuple[str, ...] = ("attention", "norm")


def norm_weighted_rows(alpha: torch.Tensor, fx_norm: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Row-normalised norm-weighted attention ``w_ij = alpha_ij ||f(x_j)|| / sum_{k real} alpha_ik ||f(x_k)||``.

    Args:
        alpha: [B, H, L, L] attention weights (query i, key j).
        fx_norm: [B, H, L] ``||f^h(x_j)||``.
        attention_mask: [B, L], 1 for real tokens.

    Returns:
        [B, H, L, L] float32: every row over the real keys sums to 1 (padded keys get 0); a row whose norm-weighted
        total is 0 is all zeros.  Like ``alpha``, ``w`` is a distribution over keys, but it measures how much of the
        head's output (its share of ``sum_j ||alpha_ij f(x_j)||``) comes from each key (Kobayashi Sec. 3).
    """
    if alpha.dim() != 4 or fx_norm.shape != alpha.shape[:3] or alpha.shape[-1] != alpha.shape[-2]:
        raise ValueError(
            f"alpha must be [B, H, L, L] and fx_norm [B, H, L]; got {tuple(alpha.shape)} and {tuple(fx_norm.shape)}"
        )
    if tuple(attention_mask.shape) != (alpha.shape[0], alpha.shape[-1]):
        raise ValueError(
            f"attention_mask must be [B, L] = {(alpha.shape[0], alpha.shape[-1])}, got {tuple(attention_mask.shape)}"
        )
    keys = attention_mask.to(device=alpha.device, dtype=torch.float32)[:, None, None, :]
    weighted = alpha.float().abs() * fx_norm.float()[:, :, None, :] * keys
    total = weighted.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, weighted / torch.where(total > 0, total, 1.0), 0.0)


def norm_weighted_attention(
    model: torch.nn.Module,
    batches: Iterable[Mapping[str, torch.Tensor]],
    progress: bool = True,
    source: str = "unspecified",
    total: int | None = None,
):
    """Constant matrices from norm-weighted attention: PAPA's Eq. 2 average applied to ``norm_weighted_rows``.

    For every example and head, ``w_ij = alpha_ij ||f^h(x_j)||`` is row-normalised over the real keys
    (:func:`norm_weighted_rows`); entry (q, k) of the result is the mean of ``w_qk`` over the examples in which both q
    and k are real, exactly like :func:`papa_lib.core.averaging.average_attention` (same ``counts``; entries no example
    covers are 0).  Where ``||f(x)||`` is the same for every token the result equals the plain average.  A constant
    matrix built this way puts its mass where a head's output comes from rather than where its weights are: a head that
    gives large weight to [SEP] but reads a short vector there (Kobayashi Sec. 4.2) gets a matrix that mostly averages
    the other tokens.  Beyond both papers; compared with plain averages in the book's "Norm-based analysis" chapter.

    Args:
        model: an encoder of a supported ``model_type`` in eval mode with eager attention.
        batches: iterable of encoded batches (``input_ids``, ``attention_mask``, optionally ``token_type_ids``), all
            of width L.
        progress: show a progress bar.
        source: where the text came from (stored in the metadata).
        total: number of batches, for the progress bar only.

    Returns:
        A :class:`papa_lib.core.averaging.ConstantAttention` with ``metadata['kind'] == 'norm_average'``.

    Memory does not grow with the corpus: one float64 ``[H, L, L]`` running sum per layer and one ``[L, L]`` count.
    """
    from tqdm.auto import tqdm

    from ..core.averaging import PadAwareAverage

    average = PadAwareAverage(
        len(encoder_layers(model)), attention_projections(model, 0).num_heads, kind="norm_average"
    )
    for batch in tqdm(batches, total=total, disable=not progress, desc="norm-weighted averaging", unit="batch"):
        inputs = prepare_batch(model, batch)
        mask = inputs["attention_mask"]
        per_layer = (
            (layer, norm_weighted_rows(alpha, fx_norm, mask))
            for layer, alpha, fx_norm in iter_alpha_and_fx_norms(model, inputs)
        )
        average.add(per_layer, mask, getattr(batch, "layout", None))
    return average.result(model, source)


def input_dependence_scores(
    model: torch.nn.Module,
    batches: Iterable[Mapping[str, torch.Tensor]],
    weighting: str = "attention",
    progress: bool = True,
) -> torch.Tensor:
    """A label-free score of how input-dependent each head's attention is (low = replaced first).

    For head h and every entry (q, k) let ``a_b`` be its value in example b (``alpha_qk`` for ``weighting="attention"``,
    the norm-weighted ``w_qk`` of :func:`norm_weighted_rows` for ``"norm"``), taken over the examples in which both q
    and k are real, and ``m_qk`` the mean of those values — the head's constant matrix (PAPA Eq. 2, or
    :func:`norm_weighted_attention`).  The score is the pooled within-entry variance

        score_h = sum_{q,k} sum_b (a_b - m_qk)^2 / sum_{q,k} n_qk

    i.e. the mean squared error, per real (query, key) entry of the corpus, that replacing the head's attention by
    its constant matrix makes.  A head with score 0 already is constant on this corpus.  Ranking heads by this score
    needs no labels and no training, unlike PAPA's λ (Sec. 3.2); ``papa_lib.experiments.engine`` uses it as the orders
    ``attention_variance`` and ``norm_variance`` (beyond the paper).

    Computed streaming with Chan et al.'s pairwise update of per-entry counts, means and sums of squared deviations
    (float64), so memory is ``3 * layers * H * L * L`` values whatever the corpus size.

    Returns:
        float64 tensor ``[layers, heads]``.
    """
    from tqdm.auto import tqdm

    if weighting not in INPUT_DEPENDENCE_WEIGHTINGS:
        raise ValueError(f"unknown weighting {weighting!r}; choose one of {INPUT_DEPENDENCE_WEIGHTINGS}")
    layers = len(encoder_layers(model))
    heads = attention_projections(model, 0).num_heads
    means: list[torch.Tensor] = []
    squares: list[torch.Tensor] = []
    counts = None
    length = None
    for batch in tqdm(batches, disable=not progress, desc=f"{weighting} input dependence", unit="batch"):
        inputs = prepare_batch(model, batch)
        width = int(inputs["input_ids"].shape[1])
        if length is not None and width != length:
            raise ValueError(f"all batches must have the same width L; got {width} after {length}")
        if length is None:
            length = width
            device = inputs["input_ids"].device
            means = [torch.zeros(heads, width, width, dtype=torch.float64, device=device) for _ in range(layers)]
            squares = [torch.zeros_like(m) for m in means]
            counts = torch.zeros(width, width, dtype=torch.float64, device=device)
        mask = inputs["attention_mask"]
        pair = pair_mask(mask)
        batch_counts = pair.sum(0).double()  # [L, L]
        seen = batch_counts > 0
        merged = counts + batch_counts
        for layer, alpha, fx_norm in iter_alpha_and_fx_norms(model, inputs):
            values = norm_weighted_rows(alpha, fx_norm, mask) if weighting == "norm" else alpha.float()  # [B,H,L,L]
            batch_mean = torch.einsum("bhqk,bqk->hqk", values, pair).double() / batch_counts.clamp_min(1)
            deviation = (values - batch_mean.float()[None]) * pair[:, None]
            batch_squares = deviation.pow(2).sum(0).double()
            delta = batch_mean - means[layer]
            gain = torch.where(seen, batch_counts / merged.clamp_min(1), 0.0)
            means[layer] = torch.where(seen, means[layer] + delta * gain, means[layer])
            squares[layer] = squares[layer] + torch.where(seen, batch_squares + delta.pow(2) * counts * gain, 0.0)
        counts = merged
    if length is None:
        raise ValueError("input_dependence_scores got an empty corpus: no batches")
    total = counts.sum()
    if total <= 0:
        raise ValueError("input_dependence_scores: the batches have no real tokens")
    return torch.stack([s.sum(dim=(-1, -2)) for s in squares]).cpu() / float(total)


def _label_free_scores(weighting: str):
    """A head ranking (:mod:`papa_lib.experiments.rankings`) from :func:`input_dependence_scores` on a seed's
    training text."""

    def scores(workspace, matrices_from, seed):
        from ..experiments import engine

        def compute():
            split = engine.split(workspace, "train")
            batches = engine.packed_batches(workspace.model, split.encoded, workspace.config.feature_batch_size,
                                            engine.seed_rows(workspace, seed), use_packing=False)
            return input_dependence_scores(workspace.model, batches, weighting=weighting,
                                           progress=workspace.progress)

        return engine.cached_scores(workspace, f"{weighting}-variance-{seed}", compute)

    return scores


def _label_free_pass(weighting: str):
    """The work of one batch of :func:`_label_free_scores` (``papa grid --plan`` times it)."""

    def score_pass(model, batch):
        input_dependence_scores(model, [batch], weighting=weighting, progress=False)

    return score_pass


# Beyond the paper: norm-weighted constant matrices and label-free head rankings, registered with the engine.
register_matrix_type("norm_average", "constant", builder=norm_weighted_attention, label="Norm-weighted average")
register_head_ranking("attention_variance", _label_free_scores("attention"), label="attention variance (label-free)",
                      replaced_first="smallest attention variance first", score_pass=_label_free_pass("attention"))
register_head_ranking("norm_variance", _label_free_scores("norm"), label="norm-weighted variance (label-free)",
                      replaced_first="smallest norm-weighted variance first", score_pass=_label_free_pass("norm"))


def matrix_total_variation(first, second) -> pd.DataFrame:
    """Per-head total-variation distance between two sets of constant matrices (e.g. norm-weighted vs plain).

    Each entry of a constant matrix is averaged over its own set of examples (pad-aware), so a row need not sum to
    exactly 1; like the override, which renormalises a row over the real keys of each input, every row is first
    renormalised to sum to 1.  Then ``TV_q = 0.5 * sum_k |P1_qk - P2_qk|`` is in [0, 1] (0: same row, 1: disjoint
    support), and rows are averaged with weight ``counts[q, q]`` (how many examples had q as a real token), so rows
    that real inputs use count more.  Both arguments are :class:`papa_lib.core.averaging.ConstantAttention` of the same
    shape.

    Columns: layer, head, total_variation.
    """
    if tuple(first.matrices.shape) != tuple(second.matrices.shape):
        raise ValueError(
            f"matrices differ in shape: {tuple(first.matrices.shape)} vs {tuple(second.matrices.shape)}"
        )
    weights = torch.diagonal(first.counts.to(torch.float64)).clamp_min(0)
    if float(weights.sum()) <= 0:
        raise ValueError("the constant matrices cover no query position (all counts are 0)")
    def rows(matrices):
        matrices = matrices.double().clamp_min(0)
        total = matrices.sum(-1, keepdim=True)
        return torch.where(total > 0, matrices / torch.where(total > 0, total, 1.0), 0.0)

    row_tv = 0.5 * (rows(first.matrices) - rows(second.matrices)).abs().sum(-1)  # [Ly, H, L]
    tv = (row_tv * weights).sum(-1) / weights.sum()
    layer, head = np.meshgrid(np.arange(tv.shape[0]), np.arange(tv.shape[1]), indexing="ij")
    return pd.DataFrame({"layer": layer.ravel(), "head": head.ravel(), "total_variation": tv.numpy().ravel()})


# ----------------------------------------------------------------------------------------------------------------------
# The norm-aware PAPA grid (run by papa_lib.experiments.grid.run_grid)
# ----------------------------------------------------------------------------------------------------------------------


#: Head orders and constant matrices the norm-aware grid compares with PAPA's λ order and plain averages.
NORM_AWARE_ORDERS: tuple[str, ...] = ("attention_variance", "norm_variance")
NORM_AWARE_FRACTIONS: tuple[float, ...] = (0.5, 0.125, 0.0625)


def norm_aware_blocks(
    label_free_tasks: Iterable[str] = ("sst2", "mnli"),
    matrix_tasks: Iterable[str] = ("sst2", "cola", "mnli", "ner", "pos"),
    fractions: Iterable[float] = NORM_AWARE_FRACTIONS,
    with_reference: bool = False,
) -> list:
    """Grid blocks (:class:`papa_lib.experiments.grid.GridBlock`) of the norm-aware PAPA experiments.

    * ``label_free``: the label-free orders :data:`NORM_AWARE_ORDERS` (:func:`input_dependence_scores`) with plain
      average matrices at ``fractions`` of input-dependent heads, on ``label_free_tasks``;
    * ``norm_matrices``: every head replaced (fraction 0) by :func:`norm_weighted_attention` matrices, on
      ``matrix_tasks``.

    What they are compared with — the λ order at the same fractions, the original model (fraction 1) and plain
    averages at fraction 0 — is part of the main grid (blocks fig2 and table1).  ``with_reference=True`` adds those
    runs as blocks ``reference_lambda`` and ``reference_average``, for a self-contained grid (the smoke profile).
    """
    from ..experiments.grid import GridBlock

    label_free_tasks, matrix_tasks, fractions = (
        list(label_free_tasks),
        list(matrix_tasks),
        [float(f) for f in fractions],
    )
    blocks = []
    if label_free_tasks:
        blocks.append(GridBlock("label_free", label_free_tasks, ["average"], list(NORM_AWARE_ORDERS), fractions))
    if matrix_tasks:
        blocks.append(GridBlock("norm_matrices", matrix_tasks, ["norm_average"], ["lambda"], [0.0]))
    if with_reference:
        if label_free_tasks:
            blocks.append(
                GridBlock("reference_lambda", label_free_tasks, ["average"], ["lambda"], [1.0, *fractions, 0.0])
            )
        if matrix_tasks:
            blocks.append(GridBlock("reference_average", matrix_tasks, ["average"], ["lambda"], [1.0, 0.0]))
    return blocks


def norm_aware_grid(reference_spec: Mapping, **block_options) -> dict:
    """A grid spec with ``reference_spec``'s top-level settings (model, data, seeds, sizes, epochs...) and the
    :func:`norm_aware_blocks` (``block_options`` are passed on).  Identical settings give identical run ids, so the
    λ-order and plain-average rows of the reference grid's results are directly comparable."""
    spec = {key: value for key, value in reference_spec.items() if key != "blocks"}
    spec["blocks"] = norm_aware_blocks(**block_options)
    return spec


# ----------------------------------------------------------------------------------------------------------------------
# The norm-aware grid's results and tables
# ----------------------------------------------------------------------------------------------------------------------

NORM_RESULT_FOLDERS = {"smoke": "runs/smoke/norms", "local": "data/results/norms-minilm",
                       "paper": "data/results/norms-paper"}


def find_constant_matrices(results_dir, task: str, kind: str = "average"):
    """The constant matrices the experiments saved under ``results_dir/matrices`` for ``task`` (built from that task's
    own training text), or ``None`` when there are none.  ``kind``: "average" or "norm_average".  When several
    files match (different settings), the most recently written one is returned."""
    from pathlib import Path

    from ..core.averaging import ConstantAttention

    if kind not in ("average", "norm_average"):
        raise ValueError(f"kind must be 'average' or 'norm_average', got {kind!r}")
    folder = Path(results_dir) / "matrices"
    prefix = task if kind == "average" else f"{task}-{kind}"
    files = sorted(folder.glob(f"{prefix}-L*.safetensors"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
    return ConstantAttention.load(files[-1]) if files else None


def norm_results_folder(setup, results_dir=None):
    """The norm-aware grid's results folder of a :class:`papa_lib.book.profiles.Setup` (:data:`NORM_RESULT_FOLDERS`)."""
    from pathlib import Path

    folder = Path(results_dir) if results_dir else Path(NORM_RESULT_FOLDERS[setup.profile])
    return folder if folder.is_absolute() else setup.root / folder


def norm_aware_results(setup, tasks: Iterable[str], ranking_tasks: Iterable[str], run_missing: bool = False,
                       results_dir=None, progress: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(norm_frame, reference_frame)``: the norm-aware grid's records and the records they are compared with.

    With ``run_missing``, first runs what :func:`norm_aware_grid` (with the profile's grid settings, ``ranking_tasks``
    for the label-free orders, ``tasks`` for norm-weighted matrices) still lacks.  The smoke profile's grid is
    self-contained (``with_reference=True``, one folder); other profiles compare with the profile's main results
    (blocks fig2 and table1, also run when ``run_missing``), cut to the seeds and training rows of the norm-aware
    records (:func:`matched_reference`, decision rule R15).
    """
    from ..experiments.grid import run_grid
    from ..experiments.results import ResultsStore

    folder = norm_results_folder(setup, results_dir)
    self_contained = setup.profile == "smoke"
    if run_missing:
        spec = norm_aware_grid(setup.grid(), label_free_tasks=list(ranking_tasks), matrix_tasks=list(tasks),
                               with_reference=self_contained)
        overrides = {"data_dir": str(setup.data_dir) if setup.data_dir else None, "device": setup.device}
        if setup.profile != "smoke":
            overrides["model"] = setup.model_name
        model, tokenizer = setup.encoder()
        run_grid(spec, folder, model=model, tokenizer=tokenizer, progress=progress, overrides=overrides)
    norm_frame = ResultsStore(folder).frame() if (folder / "results.csv").exists() else _empty_frame()
    if self_contained:
        return norm_frame, norm_frame
    reference = setup.results(run_missing=run_missing, blocks=["fig2", "table1"], progress=progress)
    return norm_frame, matched_reference(norm_frame, reference)


def matched_reference(norm_frame: pd.DataFrame, reference: pd.DataFrame) -> pd.DataFrame:
    """Decision rule R15: the rows of ``reference`` whose (task, seed, training rows) the norm-aware records have.

    A norm-aware configuration is compared only with PAPA rows of the same seeds and the same training subset, so a
    difference between them is the matrices' (or the head order's), not the data's.  No norm-aware record, no row.
    """
    keys = ["task", "seed", "train_size"]
    if norm_frame.empty or reference.empty:
        return reference.iloc[:0]
    made = set(norm_frame[keys].astype(str).itertuples(index=False, name=None))
    return reference[[row in made for row in reference[keys].astype(str).itertuples(index=False, name=None)]]


def _empty_frame() -> pd.DataFrame:
    from ..experiments.results import RECORD_FIELDS

    return pd.DataFrame({c: pd.Series(dtype="float64" if c in ("fraction", "value") else "object")
                         for c in RECORD_FIELDS})


def _own_matrices(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows whose matrices (if any) come from the task's own training text (Table 2's cross-task rows excluded)."""
    from ..experiments.summaries import own_text

    return frame if frame.empty else frame[own_text(frame)]


def label_free_comparison(norm_frame: pd.DataFrame, reference: pd.DataFrame, tasks: Iterable[str],
                          orders: Iterable[str] = ("lambda", *NORM_AWARE_ORDERS)) -> pd.DataFrame:
    """Score vs fraction of input-dependent heads for each head order, mean over seeds with a 95% CI.

    Plain-average matrices only.  The λ order and the shared end points come from ``reference`` (fraction 1: the
    original model; fraction 0: every head constant, which no order changes); the label-free orders from
    ``norm_frame``.  The end points are repeated for every order that has a record at an intermediate fraction of
    the task, so that each measured curve is complete and an order not yet run on a task draws no line there.
    Decision rule R15 per task: where the label-free orders have run, ``reference``'s rows (λ curve and end points)
    are those of the seeds they ran, so a task whose label-free orders have fewer seeds than its λ runs is compared
    on the same seeds.  Columns: task, order, fraction, mean, ci_low, ci_high, n, source ("norm grid" / "main grid"
    / "shared").
    """
    from ..experiments.summaries import curve_rows, summarize

    tasks, orders = list(tasks), list(orders)
    if not norm_frame.empty and not reference.empty:
        ran = norm_frame[norm_frame["selection_order"].isin(NORM_AWARE_ORDERS)]
        seeds = {task: set(rows["seed"]) for task, rows in ran.groupby("task")}
        reference = reference[[seed in seeds.get(task, {seed})
                               for task, seed in zip(reference["task"], reference["seed"])]]

    def inner(rows):  # a curve's partial fractions, strictly between its end points
        return rows["fraction"].between(0, 1, inclusive="neither")

    pieces = []
    grids = ((reference, "main grid", ["lambda"]), (norm_frame, "norm grid", list(NORM_AWARE_ORDERS)))
    for frame, source, wanted in grids:
        if frame.empty:
            continue
        frame = frame[frame["task"].isin(tasks)]
        for order in (o for o in wanted if o in orders):
            rows = curve_rows(frame, order)
            if inner(rows).any():
                summary = summarize(rows[inner(rows)].assign(order=order), ["task", "order", "fraction"])
                pieces.append(summary.assign(source=source))
    ends = []
    if not reference.empty:
        # curve_rows' end points belong to every order: those of the λ curve are the shared ones
        rows = curve_rows(reference[reference["task"].isin(tasks)], "lambda")
        shared = rows[~inner(rows)]
        measured = pd.concat(pieces)[["task", "order"]].drop_duplicates() if pieces else pd.DataFrame(
            columns=["task", "order"])
        if not shared.empty:
            summary = summarize(shared, ["task", "fraction"])
            ends.extend(summary.merge(measured[measured["order"] == order], on="task").assign(source="shared")
                        for order in orders)
    columns = ["task", "order", "fraction", "mean", "ci_low", "ci_high", "n", "source"]
    if not pieces and not ends:
        return pd.DataFrame(columns=columns)
    table = pd.concat([*pieces, *ends], ignore_index=True)[columns]
    return table.sort_values(["task", "order", "fraction"], ignore_index=True)


def matrix_comparison(norm_frame: pd.DataFrame, reference: pd.DataFrame, tasks: Iterable[str]) -> pd.DataFrame:
    """Every head replaced (fraction 0) by norm-weighted vs plain average matrices, and the original model.

    Columns: task, matrix_type ("original", "average", "norm_average"), mean, ci_low, ci_high, n.
    """
    from ..experiments.summaries import summarize

    tasks = list(tasks)
    frames = [f for f in (_own_matrices(reference), _own_matrices(norm_frame)) if not f.empty]
    columns = ["task", "matrix_type", "mean", "ci_low", "ci_high", "n"]
    if not frames:
        return pd.DataFrame(columns=columns)
    data = pd.concat(frames, ignore_index=True).drop_duplicates("run_id")
    keep = data["task"].isin(tasks) & (
        (data["matrix_type"] == "original")
        | (data["matrix_type"].isin(["average", "norm_average"]) & (data["fraction"] == 0))
    )
    data = data[keep]
    if data.empty:
        return pd.DataFrame(columns=columns)
    return summarize(data, ["task", "matrix_type"])[columns]


def head_score_table(model: torch.nn.Module, tokenizer, spec: Mapping, tasks: Iterable[str], results_dir=None,
                     seed: int = 0, progress: bool = False) -> pd.DataFrame:
    """Per head and task: the two label-free scores and, where available, PAPA's learned λ (Sec. 3.2), of ``seed``.

    Each task runs as the grid ``spec`` (:func:`papa_lib.experiments.grid.load_grid` output or
    :func:`norm_aware_grid`) configures it (:func:`~papa_lib.experiments.grid.task_config`), so the scores are
    :func:`input_dependence_scores` on ``seed``'s training rows, the scores its ``attention_variance`` and
    ``norm_variance`` runs used, and λ is the file in ``results_dir/lambdas`` (the main grid's folder) that ranks the
    heads of ``seed``'s λ-ordered runs (:func:`~papa_lib.experiments.engine.lambda_path`); NaN where there is none.
    Columns: task, layer, head, lambda, attention_variance, norm_variance.
    """
    from ..experiments import engine
    from ..experiments.grid import grid_settings, task_config
    from ..experiments.workspace import read_lambdas

    settings, seeds = grid_settings(dict(spec))
    settings["device"] = str(next(model.parameters()).device)
    frames = []
    for task in tasks:
        experiment = engine.TaskExperiment(task_config(settings, task, seeds), model, tokenizer,
                                           results_dir=results_dir, progress=progress)
        scores = {order: engine.head_scores(experiment, order, seed=seed).numpy() for order in NORM_AWARE_ORDERS}
        layers, heads = scores[NORM_AWARE_ORDERS[0]].shape
        path = engine.lambda_path(experiment, task, engine.lambda_seed(experiment, seed))
        lambdas = (read_lambdas(path).to(torch.float64).numpy().reshape(layers, heads)
                   if path is not None and path.is_file() else np.full((layers, heads), np.nan))
        layer, head = np.meshgrid(np.arange(layers), np.arange(heads), indexing="ij")
        frames.append(pd.DataFrame({"task": task, "layer": layer.ravel(), "head": head.ravel(),
                                    "lambda": lambdas.ravel(),
                                    **{order: value.ravel() for order, value in scores.items()}}))
    return pd.concat(frames, ignore_index=True)


def score_agreement(table: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """Spearman correlation between every pair of head scores of :func:`head_score_table`, per task.

    A high ρ between λ and a label-free score means both rank the heads alike (both replace low scores first).
    Columns: task, first, second, n_heads, spearman_rho, ci_low, ci_high (Fisher z, variance 1.06/(n-3)).
    """
    from .norm_statistics import correlate

    names = ["lambda", *NORM_AWARE_ORDERS]
    missing = [c for c in ("task", *names) if c not in table]
    if missing:
        raise ValueError(f"the head-score table lacks columns {missing}")
    rows = []
    for task, part in table.groupby("task", sort=False):
        for i, first in enumerate(names):
            for second in names[i + 1:]:
                pair = part[[first, second]].dropna()
                result = correlate(pair[first].to_numpy(float), pair[second].to_numpy(float), confidence)
                rows.append({"task": task, "first": first, "second": second, "n_heads": len(pair),
                             "spearman_rho": result["spearman_rho"], "ci_low": result["spearman_ci_low"],
                             "ci_high": result["spearman_ci_high"]})
    return pd.DataFrame(rows, columns=["task", "first", "second", "n_heads", "spearman_rho", "ci_low", "ci_high"])


def head_scores(setup, model: torch.nn.Module, tokenizer, folder, tasks: Iterable[str],
                recompute: bool) -> pd.DataFrame | None:
    """:func:`head_score_table` for a :class:`papa_lib.book.profiles.Setup`, recomputed and saved to
    ``<folder>/analysis/head_scores.csv`` when ``recompute``, else read from it (None when there is no such file).
    λ comes from the profile's main results (the smoke profile: ``folder``, its grid is self-contained)."""
    from pathlib import Path

    folder = Path(folder)
    path = folder / "analysis" / "head_scores.csv"
    if recompute:
        spec = norm_aware_grid(setup.grid())
        if setup.data_dir is not None:
            spec["data_dir"] = str(setup.data_dir)
        main = folder if setup.profile == "smoke" else Path(setup.results_dir)
        table = head_score_table(model, tokenizer, spec, tasks, results_dir=main)
        path.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(path, index=False)
    return pd.read_csv(path) if path.exists() else None
