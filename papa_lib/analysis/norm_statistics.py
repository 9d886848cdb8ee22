"""Kobayashi et al. (2020)'s corpus analyses of attention norms (their Sec. 4), streamed over a corpus.

:func:`corpus_norm_statistics` (:mod:`papa_lib.analysis.norm_corpus`, re-exported here) streams
:func:`papa_lib.analysis.norms.attention_norms` over batches and the functions below turn the statistics into tidy
tables: the coefficient of variation of ``||f(x)||`` per head (Sec. 4.1), weight-based vs norm-based attention to
[CLS]/[SEP]/punctuation (Sec. 4.2, Fig. 3), the correlation between the weight given to [SEP] and ``||f([SEP])||``
(Sec. 4.2, Fig. 4; :func:`head_level_correlation` across heads, "Evidence 2") and the relation between token frequency
and ``||f(x)||`` (Sec. 4.3, Fig. 5).  Tokens fall into Kobayashi's categories :data:`CATEGORY_NAMES`
(:class:`TokenCategorizer`; "punctuation" is Kobayashi's periods and commas, :data:`PUNCTUATION_MARKS`).  The book's
chapter runs these on WikiText through :func:`papa_lib.analysis.norm_findings.run_analyses`.

The per-head [SEP]/[CLS] correlations (:func:`sep_weight_norm_correlation`, one observation per [SEP] occurrence) and
the per-layer, per-type frequency correlation on the sample's own counts (:func:`frequency_norm_correlation`) are
extras of this book.  The paper's own computations (every query-to-[SEP] pair pooled over heads and layers; every
token occurrence against its type's corpus-wide frequency) are :mod:`papa_lib.analysis.norm_findings`, from the
samples kept here (:class:`UniformSample`: ``CorpusNormStatistics.pooled_pairs`` and ``.occurrences``).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
from scipy import stats as scipy_stats

from .norm_corpus import (  # the streamed statistics these tables read (re-exported: one import for both)
    CATEGORY_NAMES,
    PUNCTUATION_MARKS,
    CorpusNormStatistics,
    TokenCategorizer,
    UniformSample,
    corpus_norm_statistics,
    empty_statistics,  # noqa: F401
)

__all__ = [
    "CorpusNormStatistics",
    "UniformSample",
    "TokenCategorizer",
    "CATEGORY_NAMES",
    "PUNCTUATION_MARKS",
    "corpus_norm_statistics",
    "fx_norm_variation",
    "attention_share_by_category",
    "sep_weight_norm_correlation",
    "sep_observations",
    "fx_norm_by_category",
    "token_frequency_table",
    "frequency_norm_correlation",
    "head_level_correlation",
    "correlations",
    "fisher_interval",
    "sentence_shares",
]


# ----------------------------------------------------------------------------------------------------------------------
# Analyses (tidy DataFrames; layers and heads are 0-based)
# ----------------------------------------------------------------------------------------------------------------------


def check_confidence(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return (1.0 - confidence) / 2.0


def _percentile_interval(replicates: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap interval over axis 0; NaN where there are no replicates."""
    tail = check_confidence(confidence)
    shape = replicates.shape[1:]
    if replicates.shape[0] == 0:
        return np.full(shape, np.nan), np.full(shape, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        low, high = np.nanquantile(replicates, [tail, 1.0 - tail], axis=0)
    return low, high


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
    low, high = _percentile_interval(boot_cv, confidence)
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

    For each real query row, the share of category c is ``sum_{j in c} alpha_ij / sum_j alpha_ij`` (method
    "weight") or the same with ``||alpha_ij f^h(x_j)||`` (method "norm"), keys restricted to real tokens; shares are
    averaged over all real query tokens of the corpus.  With ``per_head=False`` the per-head shares are averaged
    over the heads of each layer and a third method "norm_heads_summed" uses ``||sum_h alpha^h_ij f^h(x_j)||``.

    Columns: layer, [head,] method, category, share, ci_low, ci_high (percentile Poisson bootstrap over sentences).
    """
    n = float(stats.num_tokens)
    boot_n = stats.boot_tokens.numpy()
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
    low, high = _percentile_interval(boot, confidence)
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


def correlations(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float]:
    """Pearson r, its p-value, Spearman rho, its p-value (NaN when undefined)."""
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan, math.nan, math.nan, math.nan
    pearson = scipy_stats.pearsonr(x, y)
    spearman = scipy_stats.spearmanr(x, y)
    return float(pearson.statistic), float(pearson.pvalue), float(spearman.statistic), float(spearman.pvalue)


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
            pr, pp, sr, sp = correlations(x, y)
            p_low, p_high = fisher_interval(pr, n, confidence)
            s_low, s_high = fisher_interval(sr, n, confidence, 1.06)
            rows.append(
                {
                    "layer": layer,
                    "head": head,
                    "n_observations": n,
                    f"mean_alpha_to_{token}": float(x.mean()) if n else math.nan,
                    f"mean_fx_norm_{token}": float(y.mean()) if n else math.nan,
                    "pearson_r": pr,
                    "pearson_p": pp,
                    "pearson_ci_low": p_low,
                    "pearson_ci_high": p_high,
                    "spearman_rho": sr,
                    "spearman_p": sp,
                    "spearman_ci_low": s_low,
                    "spearman_ci_high": s_high,
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
    low, high = _percentile_interval(boot, confidence)
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


def token_frequency_table(stats: CorpusNormStatistics, min_count: int = 1) -> pd.DataFrame:
    """Token types seen in the corpus with their frequency rank and mean ``||f(x)||`` per layer (Kobayashi Fig. 5).

    ``frequency_rank`` is 1 for the most frequent token (ties get the average rank); ``mean_fx_norm`` is the mean
    over occurrences of the head-averaged ``||f^h(x)||``.  Only types with ``count >= min_count`` are listed.
    Columns: token_id, token, count, frequency_rank, layer, mean_fx_norm.
    """
    if min_count < 1:
        raise ValueError(f"min_count must be >= 1, got {min_count}")
    counts = stats.token_count.numpy()
    ids = np.nonzero(counts >= min_count)[0]
    if ids.size == 0:
        return pd.DataFrame(columns=["token_id", "token", "count", "frequency_rank", "layer", "mean_fx_norm"])
    ranks = scipy_stats.rankdata(-counts[ids], method="average")
    means = stats.token_fx_sum.numpy()[:, ids] / counts[ids]  # [Ly, T]
    tokens = [stats.token_strings.get(int(i), str(int(i))) for i in ids]
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
        x, y = part["frequency_rank"].to_numpy(float), part["mean_fx_norm"].to_numpy(float)
        _, _, rho, p = correlations(x, y)
        low, high = fisher_interval(rho, len(part), confidence, 1.06)
        rows.append(
            {
                "layer": layer,
                "n_token_types": len(part),
                "spearman_rho": rho,
                "spearman_p": p,
                "ci_low": low,
                "ci_high": high,
            }
        )
    return pd.DataFrame(rows)


def head_level_correlation(correlation_table: pd.DataFrame, token: str = "sep", confidence: float = 0.95) -> dict:
    """Across heads: Spearman correlation between the mean weight a head gives ``token`` and its mean
    ``||f(token)||`` (Kobayashi Sec. 4.2, "Evidence 2": heads that attend much to [SEP] read a short vector there).

    ``correlation_table`` is :func:`sep_weight_norm_correlation`'s output (or the saved CSV).  Returns a dict with
    n_heads, spearman_rho, spearman_p, ci_low, ci_high (Fisher z with variance 1.06/(n-3)).
    """
    x_name, y_name = f"mean_alpha_to_{token}", f"mean_fx_norm_{token}"
    if x_name not in correlation_table or y_name not in correlation_table:
        raise ValueError(f"the table has no columns {x_name!r} and {y_name!r}; pass the {token} correlation table")
    part = correlation_table[[x_name, y_name]].dropna()
    _, _, rho, p = correlations(part[x_name].to_numpy(float), part[y_name].to_numpy(float))
    low, high = fisher_interval(rho, len(part), confidence, 1.06)
    return {"n_heads": len(part), "spearman_rho": rho, "spearman_p": p, "ci_low": low, "ci_high": high}


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
