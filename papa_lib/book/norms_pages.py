"""The "Norm-based analysis" chapter's plumbing (book/norms.md): Kobayashi et al. (2020, Sec. 4) on WikiText and
the norm-aware PAPA grid, as the chapter reads and shows them.

* :func:`wikitext_pairs`, :func:`run_analyses`, :func:`read_analyses`: the four corpus analyses of Kobayashi Sec. 4
  (:mod:`papa_lib.analysis.norm_statistics`) on WikiText-2, saved as and read back from the CSVs of
  :data:`ANALYSIS_FILES`, with the paper's own Fig. 4/Fig. 5 correlations (:mod:`papa_lib.analysis.norm_findings`;
  word frequencies from :func:`wikitext_token_counts`, the whole of WikiText-2 that the data folder holds);
* :func:`kobayashi_table`, :func:`frequency_figure`, :func:`weight_norm_figure` (drawn in
  :mod:`papa_lib.book.norms_figures`): those findings for the chapter (the verdicts are
  :func:`papa_lib.book.claims.norm_claims`', claim C8);
* :func:`sentence_shares`: Kobayashi's Fig. 3 for a single sentence;
* :data:`NORM_RESULT_FOLDERS`, :func:`norm_results_folder`, :func:`norm_aware_results`, :func:`find_constant_matrices`,
  :func:`missing_norm_runs`: where each profile keeps the norm-aware grid (:mod:`papa_lib.analysis.norm_rankings`),
  running what is missing and loading the records and matrices;
* :func:`label_free_comparison`, :func:`matrix_comparison`, :func:`head_score_table`, :func:`score_agreement`: the
  tables that compare the label-free orders and norm-weighted matrices with PAPA's λ order (Sec. 3.2) and plain
  averages (Sec. 3.1).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd
import torch

from ..analysis.norm_findings import corpus_frequency_table, corpus_token_counts, kobayashi_findings, pooled_pairs
from ..analysis.norm_rankings import NORM_AWARE_ORDERS, norm_aware_blocks, norm_aware_grid
from ..analysis.norm_statistics import (
    CATEGORY_NAMES,
    TokenCategorizer,
    attention_share_by_category,
    corpus_norm_statistics,
    correlations,
    fisher_interval,
    frequency_norm_correlation,
    fx_norm_by_category,
    fx_norm_variation,
    sep_observations,
    sep_weight_norm_correlation,
    token_frequency_table,
)
from ..analysis.norms import attention_norms
from .norms_figures import frequency_figure, weight_norm_figure

__all__ = [
    "ANALYSIS_FILES",
    "wikitext_pairs",
    "wikitext_token_counts",
    "run_analyses",
    "read_analyses",
    "kobayashi_table",
    "frequency_figure",
    "weight_norm_figure",
    "sentence_shares",
    "NORM_RESULT_FOLDERS",
    "norm_results_folder",
    "norm_aware_results",
    "find_constant_matrices",
    "missing_norm_runs",
    "label_free_comparison",
    "matrix_comparison",
    "head_score_table",
    "score_agreement",
]

#: Where each profile keeps the norm-aware grid's results (relative to the repository root).
NORM_RESULT_FOLDERS = {"smoke": "runs/smoke/norms", "local": "data/results/norms-minilm",
                       "paper": "data/results/norms-paper"}


# ----------------------------------------------------------------------------------------------------------------------
# The chapter's corpus analyses, end to end (WikiText, Kobayashi Sec. 4)
# ----------------------------------------------------------------------------------------------------------------------

#: The CSV files written by :func:`run_analyses` (name -> what it holds).  "punctuation" is Kobayashi's periods and
#: commas.  Files marked "extra" are this book's variants, not the paper's computation.
ANALYSIS_FILES = {
    "fx_norm_variation": "coefficient of variation of ||f(x)|| per head (Sec. 4.1)",
    "attention_share": "weight-based vs norm-based share of attention per layer and token category (cls, sep, "
                       "punctuation = periods and commas, other) (Sec. 4.2, Fig. 3)",
    "attention_share_per_head": "the same per head",
    "kobayashi_findings": "the paper's correlations as it computes them: Spearman rho of alpha and ||f(x)|| over every "
                          "(query, [SEP]) and (query, [CLS]) pair pooled over heads and layers (Sec. 4.2, Fig. 4); "
                          "of corpus-wide frequency rank and ||f(x)|| (averaged over heads and layers) over token "
                          "occurrences (Sec. 4.3, Fig. 5); cluster-bootstrap 95% CIs over sequences",
    "corpus_frequency": "every token type of the sample: corpus-wide count and rank, count in the sample, mean "
                        "||f(x)|| over its occurrences, heads and layers (Sec. 4.3, Fig. 5, one point per type)",
    "sep_pairs": "a uniform sample of the pooled (query, [SEP]) pairs: layer, head, alpha, ||f([SEP])|| "
                 "(Fig. 4 points)",
    "cls_pairs": "the same for [CLS]",
    "sep_correlation": "extra: correlation between the mean weight given to a [SEP] occurrence and ||f([SEP])||, per "
                       "head (after Sec. 4.2, Fig. 4)",
    "sep_observations": "extra: a sample of those per-occurrence [SEP] observations per head, for scatter plots",
    "cls_correlation": "extra: the same per-head correlation for [CLS] (one per sequence)",
    "cls_observations": "extra: a sample of [CLS] observations per head",
    "fx_norm_by_category": "mean ||f(x)|| per layer, head and token category (Sec. 4.2)",
    "frequency_correlation": "extra: Spearman correlation between a type's frequency rank in the sample and its mean "
                             "||f(x)|| per layer, for token types seen at least min_count times (after Sec. 4.3)",
    "token_frequency": "extra: frequent token types with their rank in the sample and mean ||f(x)|| per layer",
}


def wikitext_pairs(tokenizer, data_dir, n_sequences: int, max_length: int = 128, layout: str = "standard",
                   split: str = "validation"):
    """Kobayashi's inputs ``[CLS] paragraph [SEP] next paragraph [SEP]`` from WikiText, encoded with
    :func:`papa_lib.encode`: consecutive article lines (headings dropped) are paired, the first ``n_sequences`` pairs
    are kept.  ``layout="standard"`` is the ordinary BERT input the model was pretrained on (PAPA's fixed-position
    layout is for constant matrices and is not needed here).  The WikiText token-file conventions are undone first
    (``<unk>`` becomes the tokenizer's unknown token, `` @-@ `` a hyphen, `` @,@ ``/`` @.@ `` digit separators), so that
    they do not turn into frequent sub-word junk (``<``, ``un``, ``##k``, ``>``, ``@``) in the frequency analysis.
    Returns ``(EncodedBatch, source description)``.
    """
    from ..core.layout import encode
    from ..experiments.sample_data import describe
    from ..experiments.tasks import load_wikitext

    if n_sequences < 1:
        raise ValueError(f"n_sequences must be >= 1, got {n_sequences}")
    raw = load_wikitext(split, data_dir=data_dir, name="wikitext-2")
    lines = [_detokenize_wikitext(line, tokenizer) for line in raw]
    pairs = len(lines) // 2
    if pairs == 0:
        raise ValueError(f"WikiText {split} in {data_dir} has fewer than two article lines")
    n = min(n_sequences, pairs)
    first, second = lines[0 : 2 * n : 2], lines[1 : 2 * n : 2]
    encoded = encode(tokenizer, first, second, max_length=max_length, layout=layout)
    where = "the hub" if data_dir is None else describe(data_dir)
    return encoded, (f"WikiText-2 {split} ({where}): {n} pairs of consecutive paragraphs, L={max_length}, "
                     f"{layout} layout")


_WIKITEXT_MARKUP = ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."))


def _detokenize_wikitext(line: str, tokenizer) -> str:
    for marker, text in _WIKITEXT_MARKUP:
        line = line.replace(marker, text)
    unknown = getattr(tokenizer, "unk_token", None) or ""
    return line.replace("<unk>", unknown)


def wikitext_token_counts(tokenizer, data_dir, splits: Iterable[str] = ("train", "validation", "test"),
                          vocab_size: int | None = None) -> tuple[np.ndarray, str]:
    """Token frequencies over the whole of WikiText-2 that ``data_dir`` holds (Kobayashi Sec. 4.3 counts a whole
    corpus, not the analysed sample): every split of ``splits`` that exists (a local folder usually has validation and
    test only; ``data_dir=None`` reads the hub), its article lines cleaned as :func:`wikitext_pairs` cleans them and
    paired the same way (``[CLS] line [SEP] next line [SEP]``, an odd last line alone), never truncated
    (:func:`papa_lib.analysis.norm_findings.corpus_token_counts`).  Returns ``(counts per token id, description)``.
    """
    from ..experiments.sample_data import describe
    from ..experiments.tasks import load_wikitext

    sequences, used = [], []
    for split in splits:
        try:
            lines = load_wikitext(split, data_dir=data_dir, name="wikitext-2")
        except FileNotFoundError:
            continue
        lines = [_detokenize_wikitext(line, tokenizer) for line in lines]
        sequences += list(zip(lines[0::2], lines[1::2])) + ([lines[-1]] if len(lines) % 2 else [])
        used.append(f"{split} ({len(lines)} lines)")
    if not used:
        raise FileNotFoundError(f"no WikiText-2 split of {list(splits)} in {data_dir}")
    counts = corpus_token_counts(tokenizer, sequences, vocab_size=vocab_size)
    where = "the hub" if data_dir is None else describe(data_dir)
    return counts, f"WikiText-2 {', '.join(used)} from {where}: {int(counts.sum())} tokens, {len(sequences)} inputs"


def run_analyses(
    model: torch.nn.Module,
    tokenizer,
    data_dir,
    out_dir,
    n_sequences: int = 300,
    max_length: int = 128,
    *,
    batch_size: int = 16,
    bootstrap_replicates: int = 200,
    max_sep_per_head: int = 150,
    max_pairs_saved: int = 5000,
    min_token_count: int = 3,
    frequency_min_counts: Iterable[int] = (1, 5, 25),
    corpus_splits: Iterable[str] = ("train", "validation", "test"),
    layout: str = "standard",
    seed: int = 0,
    progress: bool = False,
) -> dict[str, pd.DataFrame]:
    """Kobayashi et al.'s four corpus analyses on WikiText-2, saved as tidy CSVs (one per :data:`ANALYSIS_FILES`).

    Streams :func:`corpus_norm_statistics` over :func:`wikitext_pairs` and writes ``out_dir/<name>.csv`` plus
    ``out_dir/metadata.json`` (model, data, sizes, seconds).  ``out_dir=None`` writes nothing.  Returns the tables.

    ``kobayashi_findings`` holds the paper's own computations
    (:func:`papa_lib.analysis.norm_findings.kobayashi_findings`: pooled (query, [SEP]/[CLS]) pairs; token occurrences
    against frequencies counted by :func:`wikitext_token_counts` over ``corpus_splits``), with
    ``bootstrap_replicates`` cluster-bootstrap replicates; ``sep_pairs``/``cls_pairs`` keep ``max_pairs_saved`` of the
    pooled pairs (for plots).  The extras: the per-head correlations use every
    [SEP]/[CLS] occurrence (up to the 20,000 of ``corpus_norm_statistics``' reservoir), and the saved
    ``sep_observations``/``cls_observations`` keep at most ``max_sep_per_head`` of them per head; ``token_frequency``
    lists the types seen at least ``min_token_count`` times; ``frequency_correlation`` is computed over the types seen
    at least ``m`` times for each ``m`` in ``frequency_min_counts`` (column ``min_count``).

    The committed tables of ``data/results/norms-minilm/analysis`` are this function's output for the embedded
    all-MiniLM-L6-v2 on ``../shared/data`` with the defaults (300 pairs, L = 128), run from the repository root
    (about 3 minutes on two CPU cores)::

        from papa_lib.book import norms_pages, profiles
        model, tokenizer = profiles.resolve("local").encoder()
        norms_pages.run_analyses(model, tokenizer, "../shared/data", "data/results/norms-minilm/analysis")
    """
    import json
    import time
    from pathlib import Path

    from tqdm.auto import tqdm

    from ..core.layout import batched
    from ..core.models import model_id

    started = time.time()
    encoded, source = wikitext_pairs(tokenizer, data_dir, n_sequences, max_length, layout)
    batches = tqdm(batched(encoded, batch_size), total=math.ceil(encoded.batch_size / batch_size), disable=not progress,
                   desc="norm statistics", unit="batch")
    stats = corpus_norm_statistics(model, batches, tokenizer, bootstrap_replicates=bootstrap_replicates, seed=seed)
    vocab_size = int(getattr(model.config, "vocab_size", 0) or 0) or None
    corpus_counts, corpus = wikitext_token_counts(tokenizer, data_dir, corpus_splits, vocab_size=vocab_size)

    def sample(token):
        observations = sep_observations(stats, token=token)
        return observations[observations["observation"] < max_sep_per_head].reset_index(drop=True)

    def pairs(token):
        frame = pooled_pairs(stats, token)
        keep = np.random.default_rng(seed).permutation(len(frame))[:max_pairs_saved]
        return frame.iloc[np.sort(keep)].drop(columns="sentence").reset_index(drop=True)

    frequency = pd.concat(
        [frequency_norm_correlation(stats, min_count=int(m)).assign(min_count=int(m)) for m in frequency_min_counts],
        ignore_index=True,
    )
    tables = {
        "fx_norm_variation": fx_norm_variation(stats),
        "attention_share": attention_share_by_category(stats),
        "attention_share_per_head": attention_share_by_category(stats, per_head=True),
        "kobayashi_findings": kobayashi_findings(stats, corpus_counts, replicates=bootstrap_replicates, seed=seed),
        "corpus_frequency": corpus_frequency_table(stats, corpus_counts),
        "sep_pairs": pairs("sep"),
        "cls_pairs": pairs("cls"),
        "sep_correlation": sep_weight_norm_correlation(stats),
        "sep_observations": sample("sep"),
        "cls_correlation": sep_weight_norm_correlation(stats, token="cls"),
        "cls_observations": sample("cls"),
        "fx_norm_by_category": fx_norm_by_category(stats),
        "frequency_correlation": frequency[["min_count", *[c for c in frequency.columns if c != "min_count"]]],
        "token_frequency": token_frequency_table(stats, min_count=min_token_count),
    }
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for name, table in tables.items():
            table.to_csv(out / f"{name}.csv", index=False, float_format="%.6g")
        metadata = {
            "model": model_id(model),
            "data": source,
            "n_sequences": int(encoded.batch_size),
            "n_tokens": int(stats.num_tokens),
            "max_length": max_length,
            "layout": layout,
            "bootstrap_replicates": bootstrap_replicates,
            "sep_observations_seen": int(stats.sep_observations_seen),
            "cls_observations_seen": int(stats.cls_observations_seen),
            "pooled_pairs_seen": {token: int(sample.seen) for token, sample in stats.pooled_pairs.items()},
            "occurrences_seen": int(stats.occurrences.seen),
            "frequency_corpus": corpus,
            "punctuation": "periods and commas (Kobayashi et al. 2020, Sec. 4.2)",
            "seed": seed,
            "seconds": round(time.time() - started, 1),
            "files": ANALYSIS_FILES,
        }
        (out / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n")
    return tables


def read_analyses(folder) -> dict[str, pd.DataFrame]:
    """The tables written by :func:`run_analyses` (and ``metadata`` as a dict under key ``"metadata"``)."""
    import json
    from pathlib import Path

    folder = Path(folder)
    missing = [name for name in ANALYSIS_FILES if not (folder / f"{name}.csv").exists()]
    if missing:
        raise FileNotFoundError(f"{folder} lacks the analysis tables {missing}; "
                                "run papa_lib.book.norms_pages.run_analyses first")
    tables = {name: pd.read_csv(folder / f"{name}.csv", keep_default_na=False, na_values=[""])
              for name in ANALYSIS_FILES}
    meta = folder / "metadata.json"
    tables["metadata"] = json.loads(meta.read_text()) if meta.exists() else {}
    return tables

def kobayashi_table(analysis_dir) -> pd.DataFrame:
    """Kobayashi's [SEP], [CLS] and frequency findings on this run as claims C8a-c: the claims engine's rows
    (:func:`papa_lib.book.claims.norm_claims`, the intro's verdicts), read from the folder's
    ``kobayashi_findings.csv``: finding, paper, ours (Spearman ρ with its 95% cluster-bootstrap interval over
    sequences), sample, verdict, rule."""
    from . import claims

    rows = pd.DataFrame(claims.norm_claims(analysis_dir))
    return pd.DataFrame({"finding": rows["claim"] + ": " + rows["statistic"], "paper": rows["paper"],
                         "ours": [claims.ours_text(r) for _, r in rows.iterrows()], "sample": rows["tasks"],
                         "verdict": rows["verdict"], "rule": rows["rule"]})


# ----------------------------------------------------------------------------------------------------------------------
# The norm-aware grid's results and tables
# ----------------------------------------------------------------------------------------------------------------------


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
    (blocks fig2 and table1, also run when ``run_missing``).
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
    return norm_frame, reference


def _empty_frame() -> pd.DataFrame:
    from ..experiments.results import RECORD_FIELDS

    return pd.DataFrame({c: pd.Series(dtype="float64" if c in ("fraction", "value") else "object")
                         for c in RECORD_FIELDS})


def _own_matrices(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows whose matrices (if any) come from the task's own training text (Table 2's cross-task rows excluded)."""
    if frame.empty:
        return frame
    own = frame["matrices_from"].isna() | (frame["matrices_from"] == frame["task"])
    return frame[own]


def label_free_comparison(norm_frame: pd.DataFrame, reference: pd.DataFrame, tasks: Iterable[str],
                          orders: Iterable[str] = ("lambda", *NORM_AWARE_ORDERS)) -> pd.DataFrame:
    """Score vs fraction of input-dependent heads for each head order, mean over seeds with a 95% CI.

    Plain-average matrices only.  The λ order and the shared end points come from ``reference`` (fraction 1: the
    original model; fraction 0: every head constant, which no order changes); the label-free orders from
    ``norm_frame``.  The end points are repeated for every order so that each curve is complete.
    Columns: task, order, fraction, mean, ci_low, ci_high, n, source ("norm grid" / "main grid" / "shared").
    """
    from ..experiments.results import summarize

    tasks, orders = list(tasks), list(orders)
    pieces = []
    grids = ((reference, "main grid", ["lambda"]), (norm_frame, "norm grid", list(NORM_AWARE_ORDERS)))
    for frame, source, wanted in grids:
        part = _own_matrices(frame)
        if part.empty:
            continue
        part = part[part["task"].isin(tasks) & (part["matrix_type"] == "average")
                    & part["selection_order"].isin([o for o in wanted if o in orders])
                    & part["fraction"].between(0, 1, inclusive="neither")]
        if not part.empty:
            summary = summarize(part.rename(columns={"selection_order": "order"}), ["task", "order", "fraction"])
            pieces.append(summary.assign(source=source))
    ends = []
    reference_own = _own_matrices(reference)
    if not reference_own.empty:
        original = reference_own[reference_own["task"].isin(tasks) & (reference_own["matrix_type"] == "original")]
        constant = reference_own[reference_own["task"].isin(tasks) & (reference_own["matrix_type"] == "average")
                                 & (reference_own["fraction"] == 0)]
        for part in (original, constant):
            if not part.empty:
                summary = summarize(part, ["task", "fraction"])
                ends.extend(summary.assign(order=order, source="shared") for order in orders)
    columns = ["task", "order", "fraction", "mean", "ci_low", "ci_high", "n", "source"]
    if not pieces and not ends:
        return pd.DataFrame(columns=columns)
    table = pd.concat([*pieces, *ends], ignore_index=True)[columns]
    return table.sort_values(["task", "order", "fraction"], ignore_index=True)


def matrix_comparison(norm_frame: pd.DataFrame, reference: pd.DataFrame, tasks: Iterable[str]) -> pd.DataFrame:
    """Every head replaced (fraction 0) by norm-weighted vs plain average matrices, and the original model.

    Columns: task, matrix_type ("original", "average", "norm_average"), mean, ci_low, ci_high, n.
    """
    from ..experiments.results import summarize

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


def sentence_shares(model: torch.nn.Module, tokenizer, text: str, max_length: int = 64) -> pd.DataFrame:
    """Where one sentence's attention looks (weights) vs where its output comes from (norms), per layer and token.

    For every layer, key token j gets ``mean over heads and real queries i`` of its row share
    ``alpha_ij / sum_k alpha_ik`` (method "weight") and ``||alpha_ij f^h(x_j)|| / sum_k ||alpha_ik f^h(x_k)||``
    (method "norm") — Kobayashi's Fig. 3 for a single input.  The text is encoded in the standard layout.
    Columns: layer, position, token, category, method, share.
    """
    from ..core.layout import encode

    batch = encode(tokenizer, [text], max_length=max_length, layout="standard")
    real = batch["attention_mask"][0].bool()
    n = int(real.sum())
    ids = batch["input_ids"][0, :n]
    tokens = tokenizer.convert_ids_to_tokens(ids.tolist())
    categories = [CATEGORY_NAMES[int(c)] for c in TokenCategorizer(tokenizer, model.config.vocab_size)(ids)]
    rows = []
    for layer_norms in attention_norms(model, batch):
        for method, contribution in (("weight", layer_norms.alpha), ("norm", layer_norms.afx_norm)):
            part = contribution[0, :, :n, :n].double()  # real queries and keys only
            shares = (part / part.sum(-1, keepdim=True)).mean(dim=(0, 1))  # [n]
            rows.extend({"layer": layer_norms.layer, "position": j, "token": tokens[j], "category": categories[j],
                         "method": method, "share": float(shares[j])} for j in range(n))
    return pd.DataFrame(rows)


def missing_norm_runs(norm_frame: pd.DataFrame, reference: pd.DataFrame, tasks: Iterable[str],
                      ranking_tasks: Iterable[str], seeds: int) -> pd.DataFrame:
    """The runs the chapter compares that are not (or not for every seed) in the two results tables.

    Expected: the :func:`norm_aware_blocks` variants plus their references (λ order at the same fractions, the original
    model, plain averages at fraction 0).  Columns: task, matrix_type, selection_order, fraction, seeds_found, seeds.
    """
    from ..experiments.grid import grid_runs

    blocks = norm_aware_blocks(list(ranking_tasks), list(tasks), with_reference=True)
    frames = [f for f in (_own_matrices(norm_frame), _own_matrices(reference)) if not f.empty]
    data = pd.concat(frames, ignore_index=True).drop_duplicates("run_id") if frames else _empty_frame()
    rows = []
    for task, variants in grid_runs(blocks).items():
        for variant in variants:
            found = data[(data["task"] == task) & (data["matrix_type"] == variant.matrix_type)
                         & (data["selection_order"] == variant.selection_order)
                         & np.isclose(data["fraction"].astype(float), variant.fraction)]
            count = found["seed"].nunique() if not found.empty else 0
            if count < seeds:
                rows.append({"task": task, "matrix_type": variant.matrix_type,
                             "selection_order": variant.selection_order, "fraction": variant.fraction,
                             "seeds_found": int(count), "seeds": int(seeds)})
    return pd.DataFrame(rows, columns=["task", "matrix_type", "selection_order", "fraction", "seeds_found", "seeds"])


def head_score_table(model: torch.nn.Module, tokenizer, spec: Mapping, tasks: Iterable[str], lambdas_dir=None,
                     progress: bool = False) -> pd.DataFrame:
    """Per head and task: the two label-free scores and, where available, PAPA's learned λ (Sec. 3.2).

    The scores are :func:`input_dependence_scores` on the task's training subset exactly as the grid ``spec``
    (:func:`papa_lib.experiments.grid.load_grid` output or :func:`norm_aware_grid`) defines it — the scores the
    ``attention_variance``/``norm_variance`` runs used.  λ is read from ``lambdas_dir/<task>-from-<task>-*.pt``
    (written by the main grid; the newest file when several match); missing λ gives NaN.
    Columns: task, layer, head, lambda, attention_variance, norm_variance.
    """
    from pathlib import Path

    from ..experiments.engine import ExperimentConfig, TaskExperiment

    def per_task(value, task):
        return value.get(task, value.get("default")) if isinstance(value, Mapping) else value

    frames = []
    for task in tasks:
        config = ExperimentConfig(task=task, data_dir=spec.get("data_dir"), profile=spec.get("profile", "local"),
                                  limit=spec.get("limit"), max_length=per_task(spec.get("max_length"), task),
                                  device=str(next(model.parameters()).device))
        experiment = TaskExperiment(config, model, tokenizer, progress=progress)
        scores = {order: experiment.head_scores(order).numpy() for order in NORM_AWARE_ORDERS}
        layers, heads = scores[NORM_AWARE_ORDERS[0]].shape
        lambdas = np.full((layers, heads), np.nan)
        folder = Path(lambdas_dir) if lambdas_dir is not None else None
        files = (sorted(folder.glob(f"{task}-from-{task}-*.pt"), key=lambda p: p.stat().st_mtime)
                 if folder and folder.is_dir() else [])
        if files:
            lambdas = torch.load(files[-1]).detach().to(torch.float64).cpu().numpy().reshape(layers, heads)
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
    names = ["lambda", *NORM_AWARE_ORDERS]
    missing = [c for c in ("task", *names) if c not in table]
    if missing:
        raise ValueError(f"the head-score table lacks columns {missing}")
    rows = []
    for task, part in table.groupby("task", sort=False):
        for i, first in enumerate(names):
            for second in names[i + 1:]:
                pair = part[[first, second]].dropna()
                _, _, rho, _ = correlations(pair[first].to_numpy(float), pair[second].to_numpy(float))
                low, high = fisher_interval(rho, len(pair), confidence, 1.06)
                rows.append({"task": task, "first": first, "second": second, "n_heads": len(pair),
                             "spearman_rho": rho, "ci_low": low, "ci_high": high})
    return pd.DataFrame(rows, columns=["task", "first", "second", "n_heads", "spearman_rho", "ci_low", "ci_high"])
