"""Kobayashi et al. (2020)'s corpus analyses of attention norms (their Sec. 4), streamed over a corpus.

:func:`corpus_norm_statistics` (:mod:`papa_lib.analysis.norm_corpus`) streams
:func:`papa_lib.analysis.norms.attention_norms` over batches and the functions below turn the statistics into tidy
tables: the coefficient of variation of ``||f(x)||`` per head (Sec. 4.1), weight-based vs norm-based attention to
[CLS]/[SEP]/punctuation (Sec. 4.2, Fig. 3), the correlation between the weight given to [SEP] and ``||f([SEP])||``
(Sec. 4.2, Fig. 4; :func:`head_level_correlation` across heads, "Evidence 2") and the relation between token frequency
and ``||f(x)||`` (Sec. 4.3, Fig. 5), by the token categories of :mod:`papa_lib.analysis.norm_corpus`.  The book's
chapter runs these on WikiText through :func:`papa_lib.analysis.norm_findings.run_analyses`.

The per-head [SEP]/[CLS] correlations (:func:`sep_weight_norm_correlation`, one observation per [SEP] occurrence) and
the per-layer, per-type frequency correlation on the sample's own counts (:func:`frequency_norm_correlation`) are
extras of this book.  The paper's own computations (every query-to-[SEP] pair pooled over heads and layers; every
token occurrence against its type's corpus-wide frequency) are :mod:`papa_lib.analysis.norm_findings`, from the
samples kept here (:class:`UniformSample`: ``CorpusNormStatistics.pooled_pairs`` and ``.occurrences``).

The same statistics of a decoder LM (where "cls" is ``<bos>``, :mod:`papa_lib.analysis.norm_corpus`) ask Kobayashi's
questions of a decoder: :func:`first_token_table` (weight vs norm of the first token, where attention sinks, per
head), :func:`head_level_correlation` with ``token="first"`` on that table (across heads), and
:func:`token_weight_norm_table`/:func:`frequency_weight_norm_correlation` (weight received and ``||f(x)||`` against
log token frequency).  They work for encoders too ([CLS] is their first token).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
from scipy import stats as scipy_stats

from ..experiments.summaries import check_confidence, percentile_interval
from .norm_corpus import (  # the streamed statistics these tables read
    CATEGORY_NAMES,
    CorpusNormStatistics,
    TokenCategorizer,
)

__all__ = [
    "fx_norm_variation",
    "attention_share_by_category",
    "sep_weight_norm_correlation",
    "sep_observations",
    "fx_norm_by_category",
    "token_frequency_table",
    "frequency_norm_correlation",
    "head_level_correlation",
    "correlations",
    "spearman_rho",
    "correlate",
    "fisher_interval",
    "token_type_means",
    "padded_counts",
    "sentence_shares",
    "first_token_table",
    "token_weight_norm_table",
    "frequency_weight_norm_correlation",
]


# ----------------------------------------------------------------------------------------------------------------------
# Analyses (tidy DataFrames; layers and heads are 0-based)
# ----------------------------------------------------------------------------------------------------------------------


def _coefficient_of_variation(n, s1, s2):
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = s1 / n
        variance = np.clip(s2 / n - mean**2, 0.0, None) * n / (n - 1)  # sample variance (ddof=1)
        std = np.sqrt(variance)
        return mean, std, std / mean


def fx_norm_variation(stats: CorpusNormStatistics, confidence: float = 0.95) -> pd.DataFrame:
    """Coefficient of variation of ``||f^h(x)||`` over the corpus's real tokens, per head (Kobayashi Sec. 4.1).

    Columns: layer, head, n_tokens, mean_fx_norm, std_fx_norm (ddof=1), cv, cv_ci_low, cv_ci_high (percentile
    Poisson bootstrap over sentences).
    """
    n = float(stats.num_tokens)
    mean, std, cv = _coefficient_of_variation(n, stats.fx_sum.numpy(), stats.fx_sq_sum.numpy())
    _, _, boot_cv = _coefficient_of_variation(
        stats.boot_tokens.numpy()[:, None, None], stats.boot_fx_sum.numpy(), stats.boot_fx_sq_sum.numpy()
    )
    low, high = percentile_interval(boot_cv, confidence)
    layer, head = np.meshgrid(np.arange(stats.num_layers), np.arange(stats.num_heads), indexing="ij")
    return pd.DataFrame(
        {
            "layer": layer.ravel(),
            "head": head.ravel(),
            "n_tokens": stats.num_tokens,
            "mean_fx_norm": mean.ravel(),
            "std_fx_norm": std.ravel(),
            "cv": cv.ravel(),
            "cv_ci_low": low.ravel(),
            "cv_ci_high": high.ravel(),
        }
    )


_SHARE_METHODS = ("weight", "norm")


def attention_share_by_category(
    stats: CorpusNormStatistics, per_head: bool = False, confidence: float = 0.95
) -> pd.DataFrame:
    """Weight-based vs norm-based share of attention given to each token category (Kobayashi Sec. 4.2, Fig. 3).

    For each query row, the share of category c is ``sum_{j in c} alpha_ij / sum_j alpha_ij`` (method
    "weight") or the same with ``||alpha_ij f^h(x_j)||`` (method "norm"), keys restricted to real tokens; shares are
    averaged over all query rows of the corpus (every real token of an encoder; a decoder's from position 1 on).
    With ``per_head=False`` the per-head shares are averaged over the heads of each layer and a third method
    "norm_heads_summed" uses ``||sum_h alpha^h_ij f^h(x_j)||``.

    Columns: layer, [head,] method, category, share, ci_low, ci_high (percentile Poisson bootstrap over sentences).
    """
    n = float(stats.num_queries)
    boot_n = stats.boot_queries.numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        if per_head:
            value = stats.share_sum.numpy() / n  # [Ly, H, C, M]
            boot = stats.boot_share_sum.numpy() / boot_n[:, None, None, None, None]
        else:
            per_layer = stats.share_sum.numpy().mean(axis=1) / n  # [Ly, C, M]
            boot_layer = stats.boot_share_sum.numpy().mean(axis=2) / boot_n[:, None, None, None]
            summed = stats.summed_share_sum.numpy() / n  # [Ly, C]
            boot_summed = stats.boot_summed_share_sum.numpy() / boot_n[:, None, None]
            value = np.concatenate([per_layer, summed[..., None]], axis=-1)
            boot = np.concatenate([boot_layer, boot_summed[..., None]], axis=-1)
    low, high = percentile_interval(boot, confidence)
    methods = _SHARE_METHODS if per_head else (*_SHARE_METHODS, "norm_heads_summed")
    index_names = ["layer", "head", "category", "method"] if per_head else ["layer", "category", "method"]
    grids = np.meshgrid(*[np.arange(s) for s in value.shape], indexing="ij")
    frame = pd.DataFrame({name: grid.ravel() for name, grid in zip(index_names, grids)})
    frame["category"] = np.asarray(CATEGORY_NAMES)[frame["category"].to_numpy()]
    frame["method"] = np.asarray(methods)[frame["method"].to_numpy()]
    frame["share"] = value.ravel()
    frame["ci_low"] = low.ravel()
    frame["ci_high"] = high.ravel()
    columns = ["layer", "head"] if per_head else ["layer"]
    return frame[[*columns, "method", "category", "share", "ci_low", "ci_high"]].sort_values(
        [*columns, "method", "category"], ignore_index=True
    )


def fisher_interval(r: float, n: int, confidence: float, variance_factor: float = 1.0) -> tuple[float, float]:
    """Fisher z interval for a correlation; variance_factor 1.06 for Spearman (Fieller, Hartley & Pearson 1957)."""
    tail = check_confidence(confidence)
    if n <= 3 or not np.isfinite(r):
        return math.nan, math.nan
    z = math.atanh(min(max(r, -0.9999999), 0.9999999))
    half = scipy_stats.norm.ppf(1.0 - tail) * math.sqrt(variance_factor / (n - 3))
    return math.tanh(z - half), math.tanh(z + half)


def _undefined(x: np.ndarray, y: np.ndarray) -> bool:
    """A correlation of ``x`` and ``y`` is undefined: fewer than 3 points, or a constant variable."""
    return len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0


def spearman_rho(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho (``scipy.stats.spearmanr``; ties: average ranks), NaN when undefined: the statistic alone, as a
    bootstrap recomputes it for every replicate."""
    return math.nan if _undefined(x, y) else float(scipy_stats.spearmanr(x, y).statistic)


def correlations(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float]:
    """Pearson r, its p-value, Spearman rho, its p-value (NaN when undefined)."""
    if _undefined(x, y):
        return math.nan, math.nan, math.nan, math.nan
    pearson, spearman = scipy_stats.pearsonr(x, y), scipy_stats.spearmanr(x, y)
    return float(pearson.statistic), float(pearson.pvalue), float(spearman.statistic), float(spearman.pvalue)


def correlate(x: np.ndarray, y: np.ndarray, confidence: float = 0.95) -> dict[str, float]:
    """Pearson's r and Spearman's rho of ``x`` and ``y`` (:func:`correlations`) with their Fisher z intervals
    (:func:`fisher_interval`; Spearman's with variance 1.06/(n-3)), NaN where undefined.

    Keys: pearson_r, pearson_p, pearson_ci_low, pearson_ci_high, spearman_rho, spearman_p, spearman_ci_low,
    spearman_ci_high.
    """
    r, r_p, rho, rho_p = correlations(x, y)
    r_low, r_high = fisher_interval(r, len(x), confidence)
    s_low, s_high = fisher_interval(rho, len(x), confidence, 1.06)
    return {"pearson_r": r, "pearson_p": r_p, "pearson_ci_low": r_low, "pearson_ci_high": r_high,
            "spearman_rho": rho, "spearman_p": rho_p, "spearman_ci_low": s_low, "spearman_ci_high": s_high}


_SPECIAL_TOKENS = ("sep", "cls")


def _special_observations(stats: CorpusNormStatistics, token: str) -> np.ndarray:
    if token not in _SPECIAL_TOKENS:
        raise ValueError(f"token must be one of {_SPECIAL_TOKENS}, got {token!r}")
    return getattr(stats, f"{token}_observations").to(torch.float64).numpy()


def sep_weight_norm_correlation(
    stats: CorpusNormStatistics, confidence: float = 0.95, token: str = "sep"
) -> pd.DataFrame:
    """Correlation between the attention weight given to [SEP] and ``||f^h([SEP])||`` per head (extra, after Fig. 4).

    Not the paper's computation, which pools every (query, [SEP]) pair over heads and layers
    (:func:`papa_lib.analysis.norm_findings.pooled_weight_norm_correlation`); this per-head variant is the book's.
    One observation per [SEP] occurrence (from the reservoir sample): x = mean over the sentence's real query tokens
    of alpha to that [SEP], y = ``||f^h([SEP])||``.  Intervals: Fisher z (Spearman with variance 1.06/(n-3)); they
    treat the [SEP] occurrences as independent, which is optimistic when a sentence has several.
    ``token="cls"`` does the same for [CLS] (one occurrence per sentence; column names say ``cls``).

    Columns: layer, head, n_observations, mean_alpha_to_sep, mean_fx_norm_sep, pearson_r, pearson_p,
    pearson_ci_low, pearson_ci_high, spearman_rho, spearman_p, spearman_ci_low, spearman_ci_high.
    """
    check_confidence(confidence)
    observations = _special_observations(stats, token)
    n = observations.shape[0]
    rows = []
    for layer in range(stats.num_layers):
        for head in range(stats.num_heads):
            x, y = observations[:, layer, head, 0], observations[:, layer, head, 1]
            rows.append(
                {
                    "layer": layer,
                    "head": head,
                    "n_observations": n,
                    f"mean_alpha_to_{token}": float(x.mean()) if n else math.nan,
                    f"mean_fx_norm_{token}": float(y.mean()) if n else math.nan,
                    **correlate(x, y, confidence),
                }
            )
    return pd.DataFrame(rows)


def sep_observations(
    stats: CorpusNormStatistics, layer: int | None = None, head: int | None = None, token: str = "sep"
) -> pd.DataFrame:
    """The reservoir of [SEP] observations in long form, for scatter plots (Kobayashi Fig. 4).

    Columns: observation, layer, head, alpha_to_sep, fx_norm_sep; optionally filtered to one layer and/or head.
    ``token="cls"``: the [CLS] reservoir (columns alpha_to_cls, fx_norm_cls).
    """
    observations = _special_observations(stats, token)
    for name, value, limit in (("layer", layer, stats.num_layers), ("head", head, stats.num_heads)):
        if value is not None and not 0 <= value < limit:
            raise ValueError(f"{name} {value} out of range [0, {limit})")
    obs, lay, hd = np.meshgrid(
        np.arange(observations.shape[0]), np.arange(stats.num_layers), np.arange(stats.num_heads), indexing="ij"
    )
    frame = pd.DataFrame(
        {
            "observation": obs.ravel(),
            "layer": lay.ravel(),
            "head": hd.ravel(),
            f"alpha_to_{token}": observations[..., 0].ravel(),
            f"fx_norm_{token}": observations[..., 1].ravel(),
        }
    )
    if layer is not None:
        frame = frame[frame["layer"] == layer]
    if head is not None:
        frame = frame[frame["head"] == head]
    return frame.reset_index(drop=True)


def fx_norm_by_category(stats: CorpusNormStatistics, confidence: float = 0.95) -> pd.DataFrame:
    """Mean ``||f^h(x)||`` of each token category per layer and head (Kobayashi Sec. 4.2, "Evidence 2").

    Columns: layer, head, category, n_tokens, mean_fx_norm, ci_low, ci_high (percentile Poisson bootstrap).
    """
    counts = stats.category_count.numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = stats.category_fx_sum.numpy() / counts  # [Ly, H, C]
        boot = stats.boot_category_fx_sum.numpy() / stats.boot_category_count.numpy()[:, None, None, :]
    low, high = percentile_interval(boot, confidence)
    layer, head, cat = np.meshgrid(
        np.arange(stats.num_layers), np.arange(stats.num_heads), np.arange(len(CATEGORY_NAMES)), indexing="ij"
    )
    return pd.DataFrame(
        {
            "layer": layer.ravel(),
            "head": head.ravel(),
            "category": np.asarray(CATEGORY_NAMES)[cat.ravel()],
            "n_tokens": counts[cat.ravel()].astype(np.int64),
            "mean_fx_norm": mean.ravel(),
            "ci_low": low.ravel(),
            "ci_high": high.ravel(),
        }
    )


_TYPE_SUMS = {"fx_norm": "token_fx_sum", "alpha": "token_alpha_sum"}


def token_type_means(stats: CorpusNormStatistics, min_count: int = 1,
                     quantity: str = "fx_norm") -> tuple[np.ndarray, list[str], np.ndarray]:
    """The token types of the sample seen at least ``min_count`` times, and per layer the mean over each type's
    occurrences of ``quantity``: the head-averaged ``||f^h(x)||`` (``"fx_norm"``) or the weight the type receives
    (``"alpha"``, ``CorpusNormStatistics.token_alpha_sum``).  Returns ``(token ids, token strings, means [layers,
    types])``; a type without a kept string is named by its id."""
    if min_count < 1:
        raise ValueError(f"min_count must be >= 1, got {min_count}")
    counts = stats.token_count.numpy()
    ids = np.nonzero(counts >= min_count)[0]
    means = getattr(stats, _TYPE_SUMS[quantity]).numpy()[:, ids] / counts[ids]  # [Ly, T]
    return ids, [stats.token_strings.get(int(i), str(int(i))) for i in ids], means


def padded_counts(stats: CorpusNormStatistics, corpus_counts) -> np.ndarray:
    """``corpus_counts`` (one count per token id, e.g. :func:`papa_lib.analysis.norm_findings.corpus_token_counts`)
    as int64, padded with zeros to the statistics' vocabulary."""
    counts = np.asarray(corpus_counts, dtype=np.int64)
    if counts.ndim != 1:
        raise ValueError("corpus_counts must be one count per token id")
    vocab = len(stats.token_count)
    if len(counts) < vocab:
        counts = np.concatenate([counts, np.zeros(vocab - len(counts), dtype=np.int64)])
    return counts


def token_frequency_table(stats: CorpusNormStatistics, min_count: int = 1) -> pd.DataFrame:
    """Token types seen in the corpus with their frequency rank and mean ``||f(x)||`` per layer (Kobayashi Fig. 5).

    ``frequency_rank`` is 1 for the most frequent token (ties get the average rank); ``mean_fx_norm`` is the mean
    over occurrences of the head-averaged ``||f^h(x)||``.  Only types with ``count >= min_count`` are listed.
    Columns: token_id, token, count, frequency_rank, layer, mean_fx_norm.
    """
    ids, tokens, means = token_type_means(stats, min_count)
    if ids.size == 0:
        return pd.DataFrame(columns=["token_id", "token", "count", "frequency_rank", "layer", "mean_fx_norm"])
    counts = stats.token_count.numpy()
    ranks = scipy_stats.rankdata(-counts[ids], method="average")
    frames = [
        pd.DataFrame(
            {
                "token_id": ids,
                "token": tokens,
                "count": counts[ids],
                "frequency_rank": ranks,
                "layer": layer,
                "mean_fx_norm": means[layer],
            }
        )
        for layer in range(stats.num_layers)
    ]
    return pd.concat(frames, ignore_index=True)


def frequency_norm_correlation(
    stats: CorpusNormStatistics, min_count: int = 1, confidence: float = 0.95
) -> pd.DataFrame:
    """Spearman correlation between a token type's frequency rank and its mean ``||f(x)||``, per layer (extra, Sec.
    4.3).

    Not the paper's computation, which counts frequencies over a whole corpus and correlates over token occurrences
    with ``||f(x)||`` averaged over heads and layers
    (:func:`papa_lib.analysis.norm_findings.occurrence_frequency_correlation`); this per-type, per-layer variant on
    the sample's own counts is the book's.
    Frequencies are counted on the analysed corpus (real tokens, special tokens included).  Interval: Fisher z with
    variance 1.06/(n-3) over the ``n`` token types (it ignores the sampling noise of each type's mean norm).
    Columns: layer, n_token_types, spearman_rho, spearman_p, ci_low, ci_high.
    """
    check_confidence(confidence)
    table = token_frequency_table(stats, min_count=min_count)
    rows = []
    for layer in range(stats.num_layers):
        part = table[table["layer"] == layer]
        result = correlate(part["frequency_rank"].to_numpy(float), part["mean_fx_norm"].to_numpy(float), confidence)
        rows.append(
            {
                "layer": layer,
                "n_token_types": len(part),
                "spearman_rho": result["spearman_rho"],
                "spearman_p": result["spearman_p"],
                "ci_low": result["spearman_ci_low"],
                "ci_high": result["spearman_ci_high"],
            }
        )
    return pd.DataFrame(rows)


def head_level_correlation(correlation_table: pd.DataFrame, token: str = "sep", confidence: float = 0.95) -> dict:
    """Across heads: Spearman correlation between the mean weight a head gives ``token`` and its mean
    ``||f(token)||`` (Kobayashi Sec. 4.2, "Evidence 2": heads that attend much to [SEP] read a short vector there).

    ``correlation_table`` is :func:`sep_weight_norm_correlation`'s output (or the saved CSV), or
    :func:`first_token_table`'s with ``token="first"``.  Returns a dict with n_heads, spearman_rho, spearman_p,
    ci_low, ci_high (Fisher z with variance 1.06/(n-3)), and Pearson's pearson_r, pearson_p, pearson_ci_low,
    pearson_ci_high (Fisher z).
    """
    x_name, y_name = f"mean_alpha_to_{token}", f"mean_fx_norm_{token}"
    if x_name not in correlation_table or y_name not in correlation_table:
        raise ValueError(f"the table has no columns {x_name!r} and {y_name!r}; pass the {token} correlation table")
    part = correlation_table[[x_name, y_name]].dropna()
    result = correlate(part[x_name].to_numpy(float), part[y_name].to_numpy(float), confidence)
    return {"n_heads": len(part), "spearman_rho": result["spearman_rho"], "spearman_p": result["spearman_p"],
            "ci_low": result["spearman_ci_low"], "ci_high": result["spearman_ci_high"],
            **{key: result[key] for key in ("pearson_r", "pearson_p", "pearson_ci_low", "pearson_ci_high")}}


def sentence_shares(model: torch.nn.Module, tokenizer, text: str, max_length: int = 64) -> pd.DataFrame:
    """Where one sentence's attention looks (weights) vs where its output comes from (norms), per layer and token.

    For every layer, key token j gets ``mean over heads and real queries i`` of its row share
    ``alpha_ij / sum_k alpha_ik`` (method "weight") and ``||alpha_ij f^h(x_j)|| / sum_k ||alpha_ik f^h(x_k)||``
    (method "norm") — Kobayashi's Fig. 3 for a single input.  The text is encoded in the standard layout.
    Columns: layer, position, token, category, method, share.
    """
    from ..core.layout import encode
    from .norms import attention_norms

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


# ----------------------------------------------------------------------------------------------------------------------
# The first token (where attention sinks) and token frequency, for decoders and encoders alike
# ----------------------------------------------------------------------------------------------------------------------

_FIRST = CATEGORY_NAMES.index("cls")


def first_token_table(stats: CorpusNormStatistics, confidence: float = 0.95) -> pd.DataFrame:
    """Weight vs norm of the first token, per layer and head: a decoder's ``<bos>``, where attention sinks (an
    encoder's [CLS]; the category "cls" of :class:`TokenCategorizer`, so a ``<bos>`` later in an input would count
    too) -- Kobayashi's [SEP] question (Sec. 4.2) asked of the first token.

    Over the query rows (an encoder's real tokens; a decoder's from position 1 on, as the first position can only see
    itself, :mod:`papa_lib.analysis.norm_corpus`):

    * ``mean_alpha_to_first``: the mean of ``alpha_{i,0}``, the weight-based share of the first token (rows of alpha
      sum to 1; 0 in rows whose sliding window no longer reaches it), with ``alpha_ci_low``/``alpha_ci_high``
      (percentile Poisson bootstrap over sequences);
    * ``norm_share_first``: the mean of ``||alpha_{i,0} f(x_0)|| / sum_j ||alpha_ij f(x_j)||``, the norm-based share
      (Kobayashi's Fig. 3; a row scale such as Gemma's ``r_i`` cancels in it), with ``norm_ci_low``/``norm_ci_high``;
    * ``mean_fx_norm_first``: the mean ``||f^h(x_0)||`` over the first tokens (one per sequence);
      ``mean_fx_norm_other``: the mean ``||f^h(x_j)||`` over every other real token; ``fx_norm_ratio``: first / other;
    * from the uniform sample of (query row, first token) pairs (``CorpusNormStatistics.pooled_pairs["cls"]``;
      ``n_pairs`` of them for the head): ``mean_row_scale`` (``r_i``; 1 without a post-attention norm),
      ``mean_afx_first`` (the mean of ``||alpha_{i,0} f(x_0)|| r_i``, the first token's contribution as it reaches the
      residual stream), and ``pearson_r``/``spearman_rho``, the within-head correlation over those pairs of
      ``x = alpha_{i,0}`` and ``y = ||alpha_{i,0} f(x_0)|| r_i``.  In a decoder ``x_0`` is the same vector in every
      sequence (the first position attends only to itself), so ``||f(x_0)||`` is one number per head and without a
      row scale ``y`` is proportional to ``x`` (correlation 1 by construction).  With Gemma's ``r_i`` it asks whether
      the post-attention norm gives back what the sink withholds: rows that put more weight on ``<bos>`` have a
      smaller summed output, hence a larger ``r_i``.

    The correlation of weight and norm *across* heads -- Kobayashi's "Evidence 2", and, since a decoder's ``||f(x_0)||``
    varies only between heads, what his pooled Fig. 4 correlation over every (query, [SEP]) pair reduces to for a
    decoder's first token -- is ``head_level_correlation(first_token_table(stats), token="first")``; the pooled one is
    :func:`papa_lib.analysis.norm_findings.pooled_weight_norm_correlation` with ``token="cls"``.

    Columns: layer, head, n_queries, mean_alpha_to_first, alpha_ci_low, alpha_ci_high, norm_share_first,
    norm_ci_low, norm_ci_high, mean_fx_norm_first, mean_fx_norm_other, fx_norm_ratio, n_pairs, mean_row_scale,
    mean_afx_first, pearson_r, spearman_rho.
    """
    n = float(stats.num_queries)
    boot_n = stats.boot_queries.numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = stats.share_sum.numpy()[:, :, _FIRST] / n  # [Ly, H, 2]
        boot = stats.boot_share_sum.numpy()[:, :, :, _FIRST] / boot_n[:, None, None, None]  # [R, Ly, H, 2]
        counts = stats.category_count.numpy()
        fx = stats.category_fx_sum.numpy()  # [Ly, H, C]
        fx_first = fx[:, :, _FIRST] / counts[_FIRST]
        fx_other = (fx.sum(axis=-1) - fx[:, :, _FIRST]) / (counts.sum() - counts[_FIRST])
    low, high = percentile_interval(boot, confidence)
    pairs = pd.DataFrame(stats.pooled_pairs["cls"].numpy()) if "cls" in stats.pooled_pairs else pd.DataFrame()
    by_head = dict(list(pairs.groupby(["layer", "head"]))) if len(pairs) else {}
    no_pairs = pd.DataFrame({"alpha": [], "fx_norm": [], "row_scale": []})
    rows = []
    for layer in range(stats.num_layers):
        for head in range(stats.num_heads):
            part = by_head.get((layer, head), no_pairs)
            x, fx, scale = (part[name].to_numpy(np.float64) for name in ("alpha", "fx_norm", "row_scale"))
            y = x * fx * scale
            r, _, rho, _ = correlations(x, y)
            rows.append({
                "layer": layer, "head": head, "n_queries": stats.num_queries,
                "mean_alpha_to_first": shares[layer, head, 0], "alpha_ci_low": low[layer, head, 0],
                "alpha_ci_high": high[layer, head, 0], "norm_share_first": shares[layer, head, 1],
                "norm_ci_low": low[layer, head, 1], "norm_ci_high": high[layer, head, 1],
                "mean_fx_norm_first": fx_first[layer, head], "mean_fx_norm_other": fx_other[layer, head],
                "fx_norm_ratio": fx_first[layer, head] / fx_other[layer, head], "n_pairs": len(x),
                "mean_row_scale": float(scale.mean()) if len(x) else math.nan,
                "mean_afx_first": float(y.mean()) if len(x) else math.nan, "pearson_r": r, "spearman_rho": rho,
            })
    return pd.DataFrame(rows)


def token_weight_norm_table(stats: CorpusNormStatistics, corpus_counts=None, *, min_count: int = 1,
                            per_layer: bool = False) -> pd.DataFrame:
    """Every token type of the sample seen at least ``min_count`` times: its frequency, the weight it receives and
    its ``||f(x)||`` (Kobayashi Sec. 4.3, Fig. 5, with the weight beside the norm).

    ``mean_alpha``: the mean over the type's occurrences and the heads of the weight a key receives, the mean
    ``alpha_ij`` over the query rows ``i`` that may see it (for a decoder: the later positions within the window, so
    it also depends on where the token sits); ``mean_fx_norm``: the mean over its occurrences and the heads of
    ``||f^h(x)||``.  Both averaged over the layers, or one row per layer with ``per_layer=True``.
    ``corpus_count``: the type's count in ``corpus_counts`` (one count per token id, e.g.
    :func:`papa_lib.analysis.norm_findings.corpus_token_counts` over the corpus the sample comes from), or its count in
    the sample when ``corpus_counts`` is ``None``; ``log_frequency``: its natural log (NaN for a count of 0).

    Columns: token_id, token, category, count, corpus_count, log_frequency, [layer,] mean_alpha, mean_fx_norm.
    """
    ids, tokens, fx = token_type_means(stats, min_count)
    _, _, alpha = token_type_means(stats, min_count, "alpha")
    sample_counts = stats.token_count.numpy()
    counted = sample_counts if corpus_counts is None else padded_counts(stats, corpus_counts)
    with np.errstate(divide="ignore"):
        log_frequency = np.where(counted[ids] > 0, np.log(np.maximum(counted[ids], 1)), np.nan)
    base = {"token_id": ids, "token": tokens,
            "category": [stats.token_categories.get(int(i), "") for i in ids], "count": sample_counts[ids],
            "corpus_count": counted[ids], "log_frequency": log_frequency}
    if not per_layer:
        return pd.DataFrame({**base, "mean_alpha": alpha.mean(axis=0), "mean_fx_norm": fx.mean(axis=0)})
    return pd.concat([pd.DataFrame({**base, "layer": layer, "mean_alpha": alpha[layer], "mean_fx_norm": fx[layer]})
                      for layer in range(stats.num_layers)], ignore_index=True)


def frequency_weight_norm_correlation(stats: CorpusNormStatistics, corpus_counts=None, *, min_count: int = 1,
                                      exclude: tuple[str, ...] = (), per_layer: bool = False,
                                      confidence: float = 0.95) -> pd.DataFrame:
    """Across token types: Pearson and Spearman correlation of log frequency with the weight a type receives
    (quantity "alpha") and with its ``||f(x)||`` (quantity "fx_norm"), from :func:`token_weight_norm_table`.

    Kobayashi (Sec. 4.3) finds frequent tokens get short ``f(x)`` (a positive correlation of frequency *rank* with
    ``||f(x)||``, i.e. a negative one of log frequency with it) while the weight does not discount them.  Types with
    a corpus count of 0 and those whose category is in ``exclude`` (e.g. ``("cls",)``: a decoder's ``<bos>``, the
    attention sink at position 0, whose weight and norm are positional rather than a frequency effect) are left out.
    Intervals: Fisher z over the types (Spearman with variance 1.06/(n-3)), ignoring the noise of each type's mean.

    Columns: [layer,] quantity, n_token_types, pearson_r, pearson_p, pearson_ci_low, pearson_ci_high,
    spearman_rho, spearman_p, spearman_ci_low, spearman_ci_high.
    """
    check_confidence(confidence)
    unknown = set(exclude) - set(CATEGORY_NAMES)
    if unknown:
        raise ValueError(f"exclude names unknown categories {sorted(unknown)}; choose from {CATEGORY_NAMES}")
    table = token_weight_norm_table(stats, corpus_counts, min_count=min_count, per_layer=per_layer)
    table = table[table["log_frequency"].notna() & ~table["category"].isin(exclude)]
    groups = table.groupby("layer") if per_layer else [(None, table)]
    rows = []
    for layer, part in groups:
        x = part["log_frequency"].to_numpy(float)
        for quantity, column in (("alpha", "mean_alpha"), ("fx_norm", "mean_fx_norm")):
            row = {} if layer is None else {"layer": int(layer)}
            rows.append({**row, "quantity": quantity, "n_token_types": len(part),
                         **correlate(x, part[column].to_numpy(float), confidence)})
    return pd.DataFrame(rows)
