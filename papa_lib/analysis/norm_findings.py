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

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from .norm_statistics import CorpusNormStatistics, _check_confidence

__all__ = [
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


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    rx, ry = scipy_stats.rankdata(x), scipy_stats.rankdata(y)
    return float(np.corrcoef(rx, ry)[0, 1])


def cluster_bootstrap_spearman(x, y, clusters, *, replicates: int = 200, confidence: float = 0.95,
                               seed: int = 0) -> dict:
    """Spearman's rho of ``x`` and ``y`` (ties: average ranks) with a percentile cluster-bootstrap interval.

    Each replicate draws a Poisson(1) weight per cluster (sequence) and repeats that cluster's observations as often,
    so the interval carries the dependence between the observations of one sequence.  Returns n, n_clusters,
    spearman_rho, ci_low, ci_high (NaN when rho is undefined or ``replicates`` is 0).
    """
    tail = _check_confidence(confidence)
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    clusters = np.asarray(clusters)
    if not (len(x) == len(y) == len(clusters)):
        raise ValueError(f"x, y and clusters differ in length: {len(x)}, {len(y)}, {len(clusters)}")
    labels, index = np.unique(clusters, return_inverse=True)
    rho = _spearman(x, y)
    low = high = math.nan
    if replicates > 0 and np.isfinite(rho):
        rng = np.random.default_rng(seed)
        draws = []
        for _ in range(replicates):
            repeat = rng.poisson(1.0, size=len(labels))[index]
            draws.append(_spearman(np.repeat(x, repeat), np.repeat(y, repeat)))
        draws = np.asarray(draws)
        if np.isfinite(draws).any():
            low, high = (float(v) for v in np.nanquantile(draws, [tail, 1.0 - tail]))
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


def _check_counts(stats: CorpusNormStatistics, corpus_counts) -> np.ndarray:
    counts = np.asarray(corpus_counts, dtype=np.int64)
    vocab = len(stats.token_count)
    if counts.ndim != 1:
        raise ValueError("corpus_counts must be one count per token id")
    if len(counts) < vocab:
        counts = np.concatenate([counts, np.zeros(vocab - len(counts), dtype=np.int64)])
    return counts


def occurrence_table(stats: CorpusNormStatistics, corpus_counts) -> pd.DataFrame:
    """The kept token occurrences with their type's corpus-wide count and rank (Kobayashi Sec. 4.3, Fig. 5 points).

    ``corpus_counts``: one count per token id (:func:`corpus_token_counts` over the whole corpus).
    Columns: token_id, sentence, corpus_count, corpus_rank, fx_norm (averaged over heads and layers).
    """
    counts = _check_counts(stats, corpus_counts)
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
    counts = _check_counts(stats, corpus_counts)
    ranks = frequency_ranks(counts)
    sample_counts = stats.token_count.numpy()
    ids = np.nonzero(sample_counts)[0]
    means = stats.token_fx_sum.numpy()[:, ids].mean(axis=0) / sample_counts[ids]
    frame = pd.DataFrame({"token_id": ids, "token": [stats.token_strings.get(int(i), str(int(i))) for i in ids],
                          "corpus_count": counts[ids], "corpus_rank": ranks[ids], "sample_count": sample_counts[ids],
                          "mean_fx_norm": means})
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
    rows = []
    for finding, result in results.items():
        source, observation, sign = FINDINGS[finding]
        rows.append({"finding": finding, "source": source, "observation": observation, "paper_sign": sign,
                     **{key: result[key] for key in ("n", "n_seen", "n_clusters", "spearman_rho", "ci_low",
                                                     "ci_high")}})
    return pd.DataFrame(rows)
