"""Kobayashi et al. (2020)'s correlations as the paper computes them (their Sec. 4.2, Fig. 4 and Sec. 4.3, Fig. 5).

:mod:`papa_lib.analysis.norm_statistics` streams the corpus and keeps uniform samples of the paper's observations
(``CorpusNormStatistics.pooled_pairs`` and ``.occurrences``); this module turns them into the paper's statistics.
Our reading of the paper (``shared/papers/norm-analysis-summary.md``; the authors' released analysis scripts were read
for facts only, no code was taken from them):

* **[SEP]: weight vs norm** (Sec. 4.2, Fig. 4, "Evidence 1"): one observation per (query token ``i``, [SEP] token
  ``j``) pair, in every head of every layer, all pooled: ``x = alpha^h_ij``, ``y = ||f^h(x_j)||``.  Every real token
  is a query, [SEP] included.  The paper reports a negative correlation: the weight given to [SEP] and the length of
  what [SEP] passes on cancel out.  :func:`pooled_weight_norm_correlation`; ``token="cls"`` asks the same of [CLS].
* **frequency vs norm** (Sec. 4.3, Fig. 5): the frequency of a *token* — an entry of the model's (sub-word)
  vocabulary, special tokens included, not a whitespace word — counted over a whole corpus (for BERT, its
  pre-training corpus), not over the analysed sample alone.  One observation per analysed token occurrence:
  ``x`` = the frequency rank of its type (1 = most frequent; tied counts share the smallest rank; a type the counted
  corpus lacks gets the rank after the last counted type), ``y`` = its ``||f(x)||`` averaged over the heads of a
  layer and then over the layers.  The paper reports a strong *positive* Spearman correlation between rank and
  ``||f(x)||``: frequent tokens (small rank) have short ``f(x)``.  Ranking by count reverses the sign exactly
  (``rho(count, y) = -rho(rank, y)``).  :func:`corpus_token_counts`, :func:`frequency_ranks`,
  :func:`occurrence_frequency_correlation`.

Intervals: the observations of one sequence are not independent (the same [SEP] vector meets every query; a
sequence repeats its frequent tokens), so a Fisher interval over millions of pairs would be far too narrow.  We use a
percentile cluster bootstrap: each replicate gives every sequence a Poisson(1) weight (as the streaming analyses do)
and recomputes Spearman's rho over the observations of the resampled sequences (:func:`cluster_bootstrap_spearman`).
When a stream has more observations than the sample keeps, the sample is uniform (bottom-k), so rho estimates the
value over all observations; ``n_seen`` says how many there were.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy import stats as scipy_stats

from ..experiments.summaries import check_confidence, percentile_interval
from .norm_corpus import CorpusNormStatistics, corpus_norm_statistics
from .norm_statistics import (
    attention_share_by_category,
    first_token_table,
    frequency_norm_correlation,
    fx_norm_by_category,
    fx_norm_variation,
    padded_counts,
    sep_observations,
    sep_weight_norm_correlation,
    spearman_rho,
    token_frequency_table,
    token_type_means,
)

__all__ = [
    "DECODER_FINDINGS",
    "decoder_findings",
    "decoder_windows",
    "run_decoder_analyses",
    "unnormed_first_token_norms",
    "corpus_token_counts",
    "frequency_ranks",
    "cluster_bootstrap_spearman",
    "pooled_pairs",
    "pooled_weight_norm_correlation",
    "occurrence_table",
    "occurrence_frequency_correlation",
    "corpus_frequency_table",
    "kobayashi_findings",
    "FINDINGS",
    "ANALYSIS_FILES",
    "wikitext_pairs",
    "wikitext_token_counts",
    "run_analyses",
    "read_analyses",
]

#: The paper's findings tested here: name -> (source, observation, the paper's sign of rho).
FINDINGS = {
    "sep_weight_vs_norm": ("Kobayashi et al. 2020, Sec. 4.2, Fig. 4",
                           "every (query, [SEP]) pair in every head and layer: x = alpha, y = ||f([SEP])||", -1),
    "cls_weight_vs_norm": ("the same for [CLS] (Kobayashi et al. 2020, Sec. 4.2)",
                           "every (query, [CLS]) pair in every head and layer: x = alpha, y = ||f([CLS])||", -1),
    "frequency_rank_vs_norm": ("Kobayashi et al. 2020, Sec. 4.3, Fig. 5",
                               "every token occurrence: x = corpus-wide frequency rank of its type (1 = most "
                               "frequent), y = ||f(x)|| averaged over heads and layers", +1),
}


# ----------------------------------------------------------------------------------------------------------------------
# Corpus-wide token frequencies
# ----------------------------------------------------------------------------------------------------------------------


def corpus_token_counts(tokenizer, sequences: Iterable[str | tuple[str, str]], vocab_size: int | None = None,
                        batch_size: int = 512) -> np.ndarray:
    """How often each token id occurs in a corpus, tokenised as the model reads it (Kobayashi Sec. 4.3).

    Each item of ``sequences`` is one model input: a text, or a ``(first, second)`` pair, encoded with the
    tokenizer's special tokens (``[CLS] first [SEP] second [SEP]``) and never truncated, so [CLS]/[SEP] are counted
    as often as the inputs hold them.  Returns int64 counts of length ``max(len(tokenizer), vocab_size)``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    counts = np.zeros(max(len(tokenizer), vocab_size or 0), dtype=np.int64)

    def flush(batch):
        singles = [item for item in batch if isinstance(item, str)]
        pairs = [item for item in batch if not isinstance(item, str)]
        encoded = []
        if singles:
            encoded += tokenizer(singles, add_special_tokens=True, truncation=False, verbose=False)["input_ids"]
        if pairs:
            first, second = zip(*pairs)
            encoded += tokenizer(list(first), list(second), add_special_tokens=True, truncation=False,
                                 verbose=False)["input_ids"]
        ids = np.concatenate([np.asarray(row, dtype=np.int64) for row in encoded])
        if ids.size and (ids.min() < 0 or ids.max() >= len(counts)):
            raise ValueError(f"token id {int(ids.max())} is outside the vocabulary ({len(counts)})")
        counts[:] += np.bincount(ids, minlength=len(counts))

    batch = []
    for item in sequences:
        if not isinstance(item, str) and len(item) != 2:
            raise ValueError(f"a sequence is a text or a (first, second) pair, got {item!r}")
        batch.append(item)
        if len(batch) == batch_size:
            flush(batch)
            batch = []
    if batch:
        flush(batch)
    return counts


def frequency_ranks(counts: np.ndarray) -> np.ndarray:
    """Frequency rank of every token id from corpus counts: 1 for the most frequent; tied counts share the smallest
    rank (1, 2, 2, 4); ids the corpus lacks (count 0) get the rank after the last counted type (Kobayashi Sec. 4.3)."""
    counts = np.asarray(counts)
    if counts.ndim != 1 or (counts < 0).any():
        raise ValueError("counts must be a 1-d array of non-negative counts")
    seen = counts > 0
    ranks = np.full(counts.shape, int(seen.sum()) + 1, dtype=np.int64)
    ranks[seen] = scipy_stats.rankdata(-counts[seen], method="min").astype(np.int64)
    return ranks


# ----------------------------------------------------------------------------------------------------------------------
# Spearman's rho with a cluster bootstrap
# ----------------------------------------------------------------------------------------------------------------------


def cluster_bootstrap_spearman(x, y, clusters, *, replicates: int = 200, confidence: float = 0.95,
                               seed: int = 0) -> dict:
    """Spearman's rho of ``x`` and ``y`` (ties: average ranks) with a percentile cluster-bootstrap interval.

    Each replicate draws a Poisson(1) weight per cluster (sequence) and repeats that cluster's observations as often,
    so the interval carries the dependence between the observations of one sequence.  Returns n, n_clusters,
    spearman_rho, ci_low, ci_high (NaN when rho is undefined or ``replicates`` is 0).
    """
    check_confidence(confidence)
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    clusters = np.asarray(clusters)
    if not (len(x) == len(y) == len(clusters)):
        raise ValueError(f"x, y and clusters differ in length: {len(x)}, {len(y)}, {len(clusters)}")
    labels, index = np.unique(clusters, return_inverse=True)
    rho = spearman_rho(x, y)
    low = high = math.nan
    if replicates > 0 and np.isfinite(rho):
        rng = np.random.default_rng(seed)
        draws = []
        for _ in range(replicates):
            repeat = rng.poisson(1.0, size=len(labels))[index]
            draws.append(spearman_rho(np.repeat(x, repeat), np.repeat(y, repeat)))
        draws = np.asarray(draws)
        if np.isfinite(draws).any():
            low, high = (float(v) for v in percentile_interval(draws, confidence))
    return {"n": int(len(x)), "n_clusters": int(len(labels)), "spearman_rho": rho, "ci_low": low, "ci_high": high}


# ----------------------------------------------------------------------------------------------------------------------
# Fig. 4: weight vs norm of [SEP] (and [CLS]), pooled over heads and layers
# ----------------------------------------------------------------------------------------------------------------------


def _sample_of(stats: CorpusNormStatistics, token: str):
    if token not in ("sep", "cls"):
        raise ValueError(f"token must be 'sep' or 'cls', got {token!r}")
    if token not in stats.pooled_pairs:
        raise ValueError("these statistics hold no pooled pairs; recompute them with corpus_norm_statistics")
    return stats.pooled_pairs[token]


def pooled_pairs(stats: CorpusNormStatistics, token: str = "sep") -> pd.DataFrame:
    """The kept (query, [SEP]) pairs (``token="cls"``: [CLS]) of every head and layer, Kobayashi's Fig. 4 points.

    Columns: sentence, layer, head, alpha, fx_norm.
    """
    columns = _sample_of(stats, token).numpy()
    return pd.DataFrame({name: columns[name] for name in ("sentence", "layer", "head", "alpha", "fx_norm")})


def pooled_weight_norm_correlation(stats: CorpusNormStatistics, token: str = "sep", *, replicates: int = 200,
                                   confidence: float = 0.95, seed: int = 0) -> dict:
    """Spearman's rho between ``alpha_ij`` and ``||f^h(x_j)||`` over every (query i, [SEP] j) pair, pooled over the
    heads and layers (Kobayashi Sec. 4.2, Fig. 4; ``token="cls"``: the same for [CLS]).

    Interval: :func:`cluster_bootstrap_spearman` over sequences.  Returns the dict of that function plus n_seen (all
    pairs of the corpus; ``n`` is the uniform sample used).
    """
    sample = _sample_of(stats, token)
    columns = sample.numpy()
    result = cluster_bootstrap_spearman(columns["alpha"], columns["fx_norm"], columns["sentence"],
                                        replicates=replicates, confidence=confidence, seed=seed)
    return {**result, "n_seen": int(sample.seen)}


# ----------------------------------------------------------------------------------------------------------------------
# Fig. 5: corpus-wide frequency vs ||f(x)||, over token occurrences
# ----------------------------------------------------------------------------------------------------------------------


def occurrence_table(stats: CorpusNormStatistics, corpus_counts) -> pd.DataFrame:
    """The kept token occurrences with their type's corpus-wide count and rank (Kobayashi Sec. 4.3, Fig. 5 points).

    ``corpus_counts``: one count per token id (:func:`corpus_token_counts` over the whole corpus).
    Columns: token_id, sentence, corpus_count, corpus_rank, fx_norm (averaged over heads and layers).
    """
    counts = padded_counts(stats, corpus_counts)
    ranks = frequency_ranks(counts)
    columns = stats.occurrences.numpy()
    ids = columns["token_id"]
    return pd.DataFrame({"token_id": ids, "sentence": columns["sentence"], "corpus_count": counts[ids],
                         "corpus_rank": ranks[ids], "fx_norm": columns["fx_norm"]})


def occurrence_frequency_correlation(stats: CorpusNormStatistics, corpus_counts, *, replicates: int = 200,
                                     confidence: float = 0.95, seed: int = 0) -> dict:
    """Spearman's rho between corpus-wide frequency rank and ``||f(x)||`` over token occurrences (Kobayashi Sec. 4.3).

    One observation per analysed token occurrence: x = the corpus-wide frequency rank of its type
    (:func:`frequency_ranks` of ``corpus_counts``), y = its ``||f(x)||`` averaged over heads and layers.  Positive rho:
    frequent tokens have short ``f(x)`` (the paper's finding).  Interval: :func:`cluster_bootstrap_spearman` over
    sequences.  Returns that dict plus n_seen, n_types (types among the occurrences), corpus_tokens and
    n_types_outside_corpus (analysed types the counted corpus lacks).
    """
    table = occurrence_table(stats, corpus_counts)
    result = cluster_bootstrap_spearman(table["corpus_rank"], table["fx_norm"], table["sentence"],
                                        replicates=replicates, confidence=confidence, seed=seed)
    outside = table.loc[table["corpus_count"] == 0, "token_id"].nunique()
    return {**result, "n_seen": int(stats.occurrences.seen), "n_types": int(table["token_id"].nunique()),
            "corpus_tokens": int(np.asarray(corpus_counts).sum()), "n_types_outside_corpus": int(outside)}


def corpus_frequency_table(stats: CorpusNormStatistics, corpus_counts) -> pd.DataFrame:
    """Every token type of the analysed sample with its corpus-wide count and rank and its mean ``||f(x)||`` over
    its occurrences, heads and layers (for Kobayashi's Fig. 5 scatter, one point per type).

    Columns: token_id, token, corpus_count, corpus_rank, sample_count, mean_fx_norm; sorted by corpus rank.
    """
    counts = padded_counts(stats, corpus_counts)
    ranks = frequency_ranks(counts)
    ids, tokens, means = token_type_means(stats)  # means: [layers, types]
    frame = pd.DataFrame({"token_id": ids, "token": tokens, "corpus_count": counts[ids], "corpus_rank": ranks[ids],
                          "sample_count": stats.token_count.numpy()[ids], "mean_fx_norm": means.mean(axis=0)})
    return frame.sort_values(["corpus_rank", "token_id"], ignore_index=True)


# ----------------------------------------------------------------------------------------------------------------------
# The three findings in one table
# ----------------------------------------------------------------------------------------------------------------------


def kobayashi_findings(stats: CorpusNormStatistics, corpus_counts, *, replicates: int = 200,
                       confidence: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """Kobayashi's Fig. 4 ([SEP], and [CLS]) and Fig. 5 (frequency) correlations as the paper computes them.

    Columns: finding (a key of :data:`FINDINGS`), source, observation, paper_sign (-1/+1), n (observations used),
    n_seen (observations in the corpus), n_clusters (sequences), spearman_rho, ci_low, ci_high (``confidence``
    percentile cluster bootstrap with ``replicates`` replicates).
    """
    results = {
        "sep_weight_vs_norm": pooled_weight_norm_correlation(stats, "sep", replicates=replicates,
                                                             confidence=confidence, seed=seed),
        "cls_weight_vs_norm": pooled_weight_norm_correlation(stats, "cls", replicates=replicates,
                                                             confidence=confidence, seed=seed),
        "frequency_rank_vs_norm": occurrence_frequency_correlation(stats, corpus_counts, replicates=replicates,
                                                                   confidence=confidence, seed=seed),
    }
    return _finding_rows(results, FINDINGS)


def _finding_rows(results: dict, table: dict) -> pd.DataFrame:
    """One row per finding: ``table``'s source, observation and sign beside the correlation's result."""
    rows = []
    for finding, result in results.items():
        source, observation, sign = table[finding]
        rows.append({"finding": finding, "source": source, "observation": observation, "paper_sign": sign,
                     **{key: result[key] for key in ("n", "n_seen", "n_clusters", "spearman_rho", "ci_low",
                                                     "ci_high")}})
    return pd.DataFrame(rows)


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

    if n_sequences < 1:
        raise ValueError(f"n_sequences must be >= 1, got {n_sequences}")
    lines = _wikitext_lines(tokenizer, data_dir, split)
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


def _wikitext_lines(tokenizer, data_dir, split: str) -> list[str]:
    """The article lines of a WikiText-2 split with the token-file conventions undone (:func:`wikitext_pairs`)."""
    from ..experiments.tasks import load_wikitext

    unknown = getattr(tokenizer, "unk_token", None) or ""
    lines = []
    for line in load_wikitext(split, data_dir=data_dir, name="wikitext-2"):
        for marker, text in _WIKITEXT_MARKUP:
            line = line.replace(marker, text)
        lines.append(line.replace("<unk>", unknown))
    return lines


def wikitext_token_counts(tokenizer, data_dir, splits: Iterable[str] = ("train", "validation", "test"),
                          vocab_size: int | None = None) -> tuple[np.ndarray, str]:
    """Token frequencies over the whole of WikiText-2 that ``data_dir`` holds (Kobayashi Sec. 4.3 counts a whole
    corpus, not the analysed sample): every split of ``splits`` that exists (a local folder usually has validation and
    test only; ``data_dir=None`` reads the hub), its article lines cleaned as :func:`wikitext_pairs` cleans them and
    paired the same way (``[CLS] line [SEP] next line [SEP]``, an odd last line alone), never truncated
    (:func:`papa_lib.analysis.norm_findings.corpus_token_counts`).  Returns ``(counts per token id, description)``.
    """
    from ..experiments.sample_data import describe

    sequences, used = [], []
    for split in splits:
        try:
            lines = _wikitext_lines(tokenizer, data_dir, split)
        except FileNotFoundError:
            continue
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

        from papa_lib.analysis import norm_findings
        from papa_lib.book import profiles
        model, tokenizer = profiles.resolve("local").encoder()
        norm_findings.run_analyses(model, tokenizer, "../shared/data", "data/results/norms-minilm/analysis")
    """
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
        _save(out_dir, tables, {
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
        })
    return tables


def _save(out_dir, tables: dict[str, pd.DataFrame], metadata: dict) -> None:
    """Write ``tables`` as ``out_dir/<name>.csv`` (6 significant digits) and ``metadata`` as ``metadata.json``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        table.to_csv(out / f"{name}.csv", index=False, float_format="%.6g")
    (out / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n")


def read_analyses(folder) -> dict[str, pd.DataFrame]:
    """The tables written by :func:`run_analyses` (and ``metadata`` as a dict under key ``"metadata"``)."""
    folder = Path(folder)
    missing = [name for name in ANALYSIS_FILES if not (folder / f"{name}.csv").exists()]
    if missing:
        raise FileNotFoundError(f"{folder} lacks the analysis tables {missing}; "
                                "run papa_lib.analysis.norm_findings.run_analyses first")
    tables = {name: pd.read_csv(folder / f"{name}.csv", keep_default_na=False, na_values=[""])
              for name in ANALYSIS_FILES}
    meta = folder / "metadata.json"
    tables["metadata"] = json.loads(meta.read_text()) if meta.exists() else {}
    return tables


# ----------------------------------------------------------------------------------------------------------------------
# The same questions asked of a decoder LM (issue 60; claims C8c and C9, decision rule R13)
# ----------------------------------------------------------------------------------------------------------------------

#: A decoder's findings (finding -> source, observation, the sign Kobayashi et al. report for [SEP] / frequency).
#: ``first_token_weight_vs_norm`` decides C9; the ``_folded`` and ``_kobayashi`` rows are its sensitivities.
DECODER_FINDINGS = {
    "first_token_weight_vs_norm": (
        "Kobayashi et al. 2020, Sec. 4.2, Fig. 4, asked of a decoder's first token",
        "every (query i >= 1, first token) pair in every head and layer: x = alpha, y = ||f'(x_0)|| r_i, what the "
        "layer adds to the residual stream (the post-attention RMSNorm's (1 + w) folded into W_O, its 1/rms_i "
        "applied)", -1),
    "first_token_weight_vs_norm_folded": (
        "the same pairs without the row scale", "y = ||f'(x_0)||: (1 + w) folded in, no 1/rms_i", -1),
    "first_token_weight_vs_norm_kobayashi": (
        "the same pairs with Kobayashi's f(x)", "y = ||W_O^h W_V^h x~_0||: no part of the post-attention norm", -1),
    "frequency_rank_vs_norm": FINDINGS["frequency_rank_vs_norm"],
}


def decoder_windows(tokenizer, data_dir, n_windows: int, length: int, split: str = "validation") -> torch.Tensor:
    """``n_windows`` consecutive windows of ``[bos] + (length - 1)`` tokens from the start of a WikiText-2 split's
    article text (headings dropped, WikiText's ``@-@`` markup undone as :func:`wikitext_pairs` does): ``[n, length]``,
    cut by :func:`papa_lib.experiments.lm.token_windows` with ``spaced=False``.
    """
    from ..experiments.lm import token_windows

    return token_windows(tokenizer, _wikitext_lines(tokenizer, data_dir, split), length, n_windows, spaced=False)


def unnormed_first_token_norms(model: torch.nn.Module, bos_token_id: int) -> np.ndarray:
    """``||W_O^h W_V^h x~_0||`` per layer and query head ([layers, heads]) for a decoder's first token: Kobayashi's
    f(x) with no part of the post-attention norm. Position 0 attends only to itself, so ``x~_0`` (the input-normed
    hidden state entering attention) is the same in every sequence; one forward pass of ``[bos]`` gives it."""
    from ..core.models import run_backbone
    from .norms import encoder_layers, transformed_vectors

    layers = encoder_layers(model)
    captured: dict[int, torch.Tensor] = {}
    hooks = [layer.self_attn.register_forward_pre_hook(
        lambda module, args, kwargs, i=i: captured.__setitem__(i, (args[0] if args else kwargs["hidden_states"])),
        with_kwargs=True) for i, layer in enumerate(layers)]
    try:
        with torch.no_grad():
            run_backbone(model, {"input_ids": torch.tensor([[bos_token_id]])})
    finally:
        for hook in hooks:
            hook.remove()
    with torch.no_grad():  # [1, H, 1, D] per layer: f^h(x~_0) without the norm's weight
        return np.stack([transformed_vectors(model, i, captured[i].float(), fold_norm=False).norm(dim=-1)[0, :, 0]
                         .numpy() for i in range(len(layers))])


def decoder_findings(stats: CorpusNormStatistics, corpus_counts, unnormed: np.ndarray, *, replicates: int = 200,
                     confidence: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """:data:`DECODER_FINDINGS` as a ``kobayashi_findings`` table (same columns as :func:`kobayashi_findings`): the
    first token's pooled pairs (statistics of a decoder: category ``cls`` is ``<bos>``) with three choices of y, and
    the occurrence-level frequency correlation; cluster bootstrap over windows."""
    sample = _sample_of(stats, "cls")
    columns = sample.numpy()
    alpha, clusters = columns["alpha"], columns["sentence"]
    kobayashi = unnormed[columns["layer"].astype(int), columns["head"].astype(int)]
    ys = {"first_token_weight_vs_norm": columns["fx_norm"] * columns["row_scale"],
          "first_token_weight_vs_norm_folded": columns["fx_norm"],
          "first_token_weight_vs_norm_kobayashi": kobayashi}
    results = {name: {**cluster_bootstrap_spearman(alpha, y, clusters, replicates=replicates, confidence=confidence,
                                                   seed=seed), "n_seen": int(sample.seen)} for name, y in ys.items()}
    results["frequency_rank_vs_norm"] = occurrence_frequency_correlation(stats, corpus_counts, replicates=replicates,
                                                                         confidence=confidence, seed=seed)
    return _finding_rows(results, DECODER_FINDINGS)


def run_decoder_analyses(model: torch.nn.Module, tokenizer, data_dir, out_dir, n_windows: int = 64,
                         length: int = 128, *, batch_size: int = 8, bootstrap_replicates: int = 200,
                         max_pooled_pairs: int = 2_000_000, seed: int = 0) -> dict[str, pd.DataFrame]:
    """The norm view on a decoder LM (decision rule R13), saved as CSVs in ``out_dir`` (``None``: nothing written):
    ``kobayashi_findings`` (:func:`decoder_findings`), ``first_token`` (per head: the weight and the norm share the
    first token gets, :func:`~papa_lib.analysis.norm_statistics.first_token_table`), ``attention_share`` (per layer
    and token category, weight- and norm-based), ``corpus_frequency`` (per token type) and ``metadata.json``.
    Windows: :func:`decoder_windows` of the validation split; frequencies: :func:`wikitext_token_counts` over the
    splits ``data_dir`` holds."""
    from ..core.models import model_id

    started = time.time()
    ids = decoder_windows(tokenizer, data_dir, n_windows, length)
    batches = [{"input_ids": ids[i:i + batch_size], "attention_mask": torch.ones_like(ids[i:i + batch_size])}
               for i in range(0, n_windows, batch_size)]
    stats = corpus_norm_statistics(model, batches, tokenizer, bootstrap_replicates=bootstrap_replicates,
                                   max_pooled_pairs=max_pooled_pairs, seed=seed)
    corpus_counts, corpus = wikitext_token_counts(tokenizer, data_dir, vocab_size=int(model.config.vocab_size))
    unnormed = unnormed_first_token_norms(model, int(tokenizer.bos_token_id))
    tables = {
        "kobayashi_findings": decoder_findings(stats, corpus_counts, unnormed, replicates=bootstrap_replicates,
                                               seed=seed),
        "first_token": first_token_table(stats),
        "attention_share": attention_share_by_category(stats),
        "corpus_frequency": corpus_frequency_table(stats, corpus_counts),
    }
    if out_dir is not None:
        _save(out_dir, tables, {
            "model": model_id(model), "data": f"WikiText-2 validation, {n_windows} windows of {length} tokens "
            "(<bos> first), from the start of the split", "n_windows": n_windows, "length": length,
            "n_tokens": int(stats.num_tokens), "n_queries": int(stats.num_queries),
            "bootstrap_replicates": bootstrap_replicates, "frequency_corpus": corpus,
            "pooled_pairs_seen": {token: int(s.seen) for token, s in stats.pooled_pairs.items()},
            "seed": seed, "seconds": round(time.time() - started, 1)})
    return tables
