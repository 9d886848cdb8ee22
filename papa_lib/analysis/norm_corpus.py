"""Kobayashi et al. (2020)'s corpus statistics of attention norms (their Sec. 4), streamed over a corpus.

:func:`corpus_norm_statistics` streams :func:`papa_lib.analysis.norms.attention_norms` over batches (one layer's norms
alive at a time; accumulators that do not grow with the corpus) into a :class:`CorpusNormStatistics`; tokens fall into
Kobayashi's categories :data:`CATEGORY_NAMES` (:class:`TokenCategorizer`; "punctuation" is Kobayashi's periods and
commas, :data:`PUNCTUATION_MARKS`) and :class:`UniformSample` keeps the samples that
:mod:`papa_lib.analysis.norm_findings` pools. The tables computed from the statistics are
:mod:`papa_lib.analysis.norm_statistics`.

Decoder LMs (:func:`papa_lib.analysis.norms.is_causal`) are streamed the same way, with two differences that the
causal mask makes necessary: the category "cls" is the tokenizer's ``<bos>``, the first token of every input of the
decoder layout (where attention sinks), and "sep" its ``<eos>`` (:class:`TokenCategorizer`); and the first position
is no query row -- it can only attend to itself (``alpha_00 = 1`` whatever the model), so the row tells nothing and
would add a point at ``alpha = 1`` to every first-token statistic.  Averages over query rows then divide by
``CorpusNormStatistics.num_queries`` (the real tokens less one per input), and a key's statistics over queries use
the queries that may see it (causal, within the sliding window).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from .norms import attention_projections, encoder_layers, is_causal, iter_layer_norms, prepare_batch

__all__ = [
    "CATEGORY_NAMES",
    "CorpusNormStatistics",
    "PUNCTUATION_MARKS",
    "TokenCategorizer",
    "UniformSample",
    "corpus_norm_statistics",
]

CATEGORY_NAMES: tuple[str, ...] = ("cls", "sep", "punctuation", "other")
_CLS, _SEP, _PUNCT, _OTHER = range(4)
#: Kobayashi's punctuation category: periods and commas only (Sec. 4.2, Fig. 3), not every punctuation mark.
PUNCTUATION_MARKS: tuple[str, ...] = (".", ",")


# ----------------------------------------------------------------------------------------------------------------------
# Token categories
# ----------------------------------------------------------------------------------------------------------------------


class TokenCategorizer:
    """Maps token ids to Kobayashi's categories ``CATEGORY_NAMES`` (cls, sep, punctuation, other).

    [CLS]/[SEP] are ``tokenizer.cls_token_id``/``sep_token_id`` (``<s>``/``</s>`` for RoBERTa-style tokenizers).
    A decoder's tokenizer has neither: there "cls" is ``bos_token_id`` (the first token of the decoder layout) and
    "sep" is ``eos_token_id`` (none when the tokenizer has no end token or its end token is its ``<bos>``, as GPT-2's).
    Punctuation is Kobayashi et al.'s "periods and commas" (Sec. 4.2, Fig. 3): every other token whose decoded text,
    stripped of whitespace (and of a WordPiece ``##`` prefix), is exactly ``.`` or ``,`` (:data:`PUNCTUATION_MARKS`;
    so both ``.`` and ``Ġ.`` of a byte-level BPE vocabulary).  Other marks (``!``, ``?``, ``;``, ``--``, ``...``),
    and everything else including other special tokens, are "other".
    """

    def __init__(self, tokenizer, vocab_size: int | None = None):
        cls_id, sep_id = getattr(tokenizer, "cls_token_id", None), getattr(tokenizer, "sep_token_id", None)
        if cls_id is None and sep_id is None and getattr(tokenizer, "bos_token_id", None) is not None:  # a decoder's
            cls_id, sep_id = tokenizer.bos_token_id, getattr(tokenizer, "eos_token_id", None)
            if sep_id == cls_id:
                sep_id = None
        elif cls_id is None or sep_id is None:
            raise ValueError("the tokenizer needs cls_token_id and sep_token_id to categorise tokens "
                             "(a decoder's tokenizer: bos_token_id)")
        tokenizer_size = len(tokenizer)
        size = max(tokenizer_size, vocab_size or 0)
        lookup = torch.full((size,), _OTHER, dtype=torch.long)
        texts = tokenizer.batch_decode([[i] for i in range(tokenizer_size)])
        for token_id, text in enumerate(texts):
            text = text.strip()
            if text.startswith("##") and len(text) > 2:
                text = text[2:]
            if text in PUNCTUATION_MARKS:
                lookup[token_id] = _PUNCT
        lookup[cls_id] = _CLS
        if sep_id is not None:
            lookup[sep_id] = _SEP
        self.lookup = lookup
        self.cls_token_id, self.sep_token_id = cls_id, sep_id

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Category index (into ``CATEGORY_NAMES``) of every id in ``input_ids``."""
        input_ids = torch.as_tensor(input_ids)
        if input_ids.numel() and int(input_ids.max()) >= len(self.lookup):
            raise ValueError(
                f"token id {int(input_ids.max())} is outside the tokenizer vocabulary ({len(self.lookup)})"
            )
        return self.lookup.to(input_ids.device)[input_ids]


# ----------------------------------------------------------------------------------------------------------------------
# Corpus statistics
# ----------------------------------------------------------------------------------------------------------------------


class UniformSample:
    """A uniform random sample, without replacement, of at most ``capacity`` rows of a stream of rows.

    Bottom-k sampling: every row gets an independent U(0, 1) key and the ``capacity`` rows with the smallest keys are
    kept, so every subset of that size is equally likely whatever the order and the chunking of the stream.  Rows are
    named columns of equal length (``dtypes``: name -> dtype), stored on the CPU; ``seen`` counts every row offered.
    """

    def __init__(self, capacity: int, dtypes: Mapping[str, torch.dtype]):
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.capacity = int(capacity)
        self.columns = {name: torch.zeros(0, dtype=dtype) for name, dtype in dtypes.items()}
        self.keys = torch.zeros(0, dtype=torch.float64)
        self.seen = 0

    def __len__(self) -> int:
        return int(self.keys.numel())

    def add(self, generator: torch.Generator, **columns: torch.Tensor) -> None:
        """Offer rows (one tensor per column, all of one length)."""
        if set(columns) != set(self.columns):
            raise ValueError(f"expected the columns {sorted(self.columns)}, got {sorted(columns)}")
        lengths = {int(value.shape[0]) for value in columns.values()}
        if len(lengths) != 1:
            raise ValueError(f"columns of different lengths: {sorted(lengths)}")
        n = lengths.pop()
        self.seen += n
        if n == 0 or self.capacity == 0:
            return
        self.keys = torch.cat([self.keys, torch.rand(n, generator=generator, dtype=torch.float64)])
        for name, value in columns.items():
            kept = self.columns[name]
            self.columns[name] = torch.cat([kept, value.detach().to("cpu", kept.dtype).reshape(-1)])
        if len(self) > self.capacity:
            keep = torch.topk(self.keys, self.capacity, largest=False).indices.sort().values
            self.keys = self.keys[keep]
            self.columns = {name: value[keep] for name, value in self.columns.items()}

    def numpy(self) -> dict[str, np.ndarray]:
        """The kept rows, column by column."""
        return {name: value.numpy() for name, value in self.columns.items()}


#: Columns of the pooled query-to-[SEP]/[CLS] pairs (``CorpusNormStatistics.pooled_pairs``): ``query`` is the query's
#: position and ``row_scale`` its ``r_i`` (Gemma 3's post-attention norm; 1 elsewhere, :mod:`papa_lib.analysis.norms`).
_PAIR_COLUMNS = {"sentence": torch.long, "layer": torch.int16, "head": torch.int16, "alpha": torch.float32,
                 "fx_norm": torch.float32, "query": torch.int32, "row_scale": torch.float32}
#: Columns of the token occurrences (``CorpusNormStatistics.occurrences``).
_OCCURRENCE_COLUMNS = {"token_id": torch.long, "sentence": torch.long, "fx_norm": torch.float32}


@dataclass
class CorpusNormStatistics:
    """Streaming accumulators for the corpus analyses (float64 on the CPU), built by ``corpus_norm_statistics``.

    ``Ly`` layers, ``H`` heads, ``C = len(CATEGORY_NAMES)`` categories, ``R`` bootstrap replicates, ``V`` vocabulary.

    Totals over real (non-padding) tokens; query rows are real tokens (a decoder's: less the first position, module
    docstring; ``num_queries`` of them) and keys are restricted to real tokens.
    ``boot_*`` arrays hold the same totals for ``R`` Poisson-bootstrap replicates over sentences (each sentence gets
    weight ~ Poisson(1) in each replicate; Hanley & MacGibbon 2006), which gives percentile confidence intervals with
    memory independent of corpus size.  ``share_sum[..., m]``: m = 0 weight-based (alpha), m = 1 norm-based
    (``||alpha f(x)||``), each the per-query-row share of the category, summed over query rows (``num_queries``;
    ``boot_queries`` per replicate).  ``token_alpha_sum``: per token id, the sum over its occurrences of the weight it
    receives -- the mean over the heads of the mean ``alpha_ij`` over the query rows ``i`` that may see it.
    ``sep_observations``: a uniform reservoir sample (at most ``max_sep_observations`` rows) of [SEP] occurrences,
    each row [Ly, H, 2] = (mean alpha given to this [SEP] by the query rows of its sentence that may see it,
    ``||f^h([SEP])||``);
    ``cls_observations`` the same for [CLS] (a reservoir of the same size).
    ``pooled_pairs`` and ``occurrences`` (:class:`UniformSample`, at most ``max_pooled_pairs``/``max_occurrences``
    rows; sentences are numbered in stream order) hold what :mod:`papa_lib.analysis.norm_findings` needs to compute
    Kobayashi's correlations as the paper does.
    """

    num_layers: int
    num_heads: int
    bootstrap_replicates: int
    max_sep_observations: int
    fx_sum: torch.Tensor  # [Ly, H] sum of ||f^h(x)|| over real tokens
    fx_sq_sum: torch.Tensor  # [Ly, H] sum of ||f^h(x)||^2
    share_sum: torch.Tensor  # [Ly, H, C, 2]
    summed_share_sum: torch.Tensor  # [Ly, C]  norm-based with heads combined (||sum_h alpha f^h||)
    category_count: torch.Tensor  # [C] real tokens per category
    category_fx_sum: torch.Tensor  # [Ly, H, C]
    boot_tokens: torch.Tensor  # [R]
    boot_fx_sum: torch.Tensor  # [R, Ly, H]
    boot_fx_sq_sum: torch.Tensor  # [R, Ly, H]
    boot_share_sum: torch.Tensor  # [R, Ly, H, C, 2]
    boot_summed_share_sum: torch.Tensor  # [R, Ly, C]
    boot_category_count: torch.Tensor  # [R, C]
    boot_category_fx_sum: torch.Tensor  # [R, Ly, H, C]
    token_count: torch.Tensor  # [V] occurrences of each token id (real tokens), int64
    token_fx_sum: torch.Tensor  # [Ly, V] sum over occurrences of mean_h ||f^h(x)||
    sep_observations: torch.Tensor  # [N <= max_sep_observations, Ly, H, 2] float32
    sep_observations_seen: int = 0
    num_sentences: int = 0
    num_tokens: int = 0
    token_strings: dict[int, str] = field(default_factory=dict)  # id -> token string, for the ids seen
    token_categories: dict[int, str] = field(default_factory=dict)  # id -> its CATEGORY_NAMES entry, for the ids seen
    cls_observations: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 0, 0, 2))  # like sep_observations
    cls_observations_seen: int = 0
    # Kobayashi's own observations (papa_lib.analysis.norm_findings): "sep"/"cls" -> every (query row i, [SEP] j)
    # pair of every head and layer (sentence, layer, head, alpha_ij, ||f^h(x_j)||, query i, r_i), uniformly sampled
    pooled_pairs: dict[str, UniformSample] = field(default_factory=dict)
    # every real token occurrence (token_id, sentence, ||f(x)|| averaged over the heads and then the layers), sampled
    occurrences: UniformSample = field(default_factory=lambda: UniformSample(0, _OCCURRENCE_COLUMNS))
    num_queries: int = 0  # query rows (num_tokens for an encoder; a decoder's first positions are no query rows)
    boot_queries: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))  # [R]
    token_alpha_sum: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 0, dtype=torch.float64))  # [Ly, V]


def empty_statistics(layers: int, heads: int, vocab: int, replicates: int, max_sep: int, max_pairs: int = 0,
                      max_occurrences: int = 0) -> CorpusNormStatistics:
    c = len(CATEGORY_NAMES)

    def zeros(*shape):
        return torch.zeros(*shape, dtype=torch.float64)

    return CorpusNormStatistics(
        num_layers=layers,
        num_heads=heads,
        bootstrap_replicates=replicates,
        max_sep_observations=max_sep,
        fx_sum=zeros(layers, heads),
        fx_sq_sum=zeros(layers, heads),
        share_sum=zeros(layers, heads, c, 2),
        summed_share_sum=zeros(layers, c),
        category_count=zeros(c),
        category_fx_sum=zeros(layers, heads, c),
        boot_tokens=zeros(replicates),
        boot_fx_sum=zeros(replicates, layers, heads),
        boot_fx_sq_sum=zeros(replicates, layers, heads),
        boot_share_sum=zeros(replicates, layers, heads, c, 2),
        boot_summed_share_sum=zeros(replicates, layers, c),
        boot_category_count=zeros(replicates, c),
        boot_category_fx_sum=zeros(replicates, layers, heads, c),
        token_count=torch.zeros(vocab, dtype=torch.long),
        token_fx_sum=zeros(layers, vocab),
        sep_observations=torch.zeros(0, layers, heads, 2, dtype=torch.float32),
        cls_observations=torch.zeros(0, layers, heads, 2, dtype=torch.float32),
        pooled_pairs={token: UniformSample(max_pairs, _PAIR_COLUMNS) for token in ("sep", "cls")},
        occurrences=UniformSample(max_occurrences, _OCCURRENCE_COLUMNS),
        boot_queries=zeros(replicates),
        token_alpha_sum=zeros(layers, vocab),
    )


def _row_shares(contribution: torch.Tensor, key_onehot: torch.Tensor) -> torch.Tensor:
    """Per-row share of each key category: contribution [B, (H,) L, L] (masked keys), key_onehot [B, L, C]."""
    total = contribution.sum(dim=-1, keepdim=True)
    per_category = torch.matmul(contribution, key_onehot.unsqueeze(1) if contribution.dim() == 4 else key_onehot)
    return torch.where(total != 0, per_category / torch.where(total != 0, total, 1.0), 0.0)


def _reservoir_add(
    stats: CorpusNormStatistics, rows: torch.Tensor, generator: torch.Generator, token: str = "sep"
) -> None:
    """Uniform reservoir sampling (Vitter's algorithm R) of observation rows (``token``: "sep" or "cls")."""
    cap = stats.max_sep_observations
    seen_name, kept_name = f"{token}_observations_seen", f"{token}_observations"
    if cap <= 0 or rows.shape[0] == 0:
        setattr(stats, seen_name, getattr(stats, seen_name) + rows.shape[0])
        return
    kept = getattr(stats, kept_name)
    seen = getattr(stats, seen_name)
    take = min(cap - kept.shape[0], rows.shape[0])
    if take > 0:
        kept = torch.cat([kept, rows[:take]])
        seen += take
        rows = rows[take:]
    for row in rows:  # reservoir full: row t (1-based) replaces a random slot with probability cap / t
        seen += 1
        slot = int(torch.randint(0, seen, (1,), generator=generator))
        if slot < cap:
            kept[slot] = row
    setattr(stats, kept_name, kept)
    setattr(stats, seen_name, seen)


def corpus_norm_statistics(
    model: torch.nn.Module,
    batches: Iterable[Mapping[str, torch.Tensor]],
    tokenizer,
    *,
    bootstrap_replicates: int = 200,
    max_sep_observations: int = 20_000,
    max_pooled_pairs: int = 200_000,
    max_occurrences: int = 1_000_000,
    seed: int = 0,
) -> CorpusNormStatistics:
    """Stream ``attention_norms`` over ``batches`` and accumulate what the analysis functions need.

    Args:
        model: as for ``attention_norms``.
        batches: iterable of batches (mappings with ``input_ids``, ``attention_mask``, optionally ``token_type_ids``);
            consumed once.
        tokenizer: the model's tokenizer, used for the token categories (``TokenCategorizer``) and token strings.
        bootstrap_replicates: ``R``, number of Poisson-bootstrap replicates over sentences (0 disables intervals).
        max_sep_observations: size of the reservoir of [SEP] observations for the per-head correlations.
        max_pooled_pairs: size of the uniform samples of (query, [SEP]) and (query, [CLS]) pairs, pooled over
            heads and layers (Kobayashi's Fig. 4 observations).
        max_occurrences: size of the uniform sample of token occurrences (Kobayashi's Fig. 5 observations).
        seed: seeds the bootstrap weights, the reservoir and (``seed + 1``) the uniform samples.

    Memory does not depend on the corpus size: besides one batch's forward pass (the model's attentions and hidden
    states of all layers) and one layer's norms at a time, it holds ``O(R*Ly*H*C + Ly*V + max_sep_observations*Ly*H
    + max_pooled_pairs + max_occurrences)`` numbers.

    A decoder LM works the same way (module docstring: "cls" is ``<bos>``, the first position is no query row);
    ``norms`` come from :func:`papa_lib.analysis.norms.iter_layer_norms` with its default row scale (Gemma 3), which
    leaves every share (a ratio within one row) and every ``||f(x)||`` unchanged; the pooled pairs keep ``r_i``.
    """
    if bootstrap_replicates < 0:
        raise ValueError(f"bootstrap_replicates must be >= 0, got {bootstrap_replicates}")
    if max_sep_observations < 0:
        raise ValueError(f"max_sep_observations must be >= 0, got {max_sep_observations}")
    layers = len(encoder_layers(model))
    heads = attention_projections(model, 0).num_heads
    causal = is_causal(model)
    vocab = int(getattr(model.config, "vocab_size", 0) or 0)
    categorizer = TokenCategorizer(tokenizer, vocab_size=vocab)
    vocab = len(categorizer.lookup)
    generator = torch.Generator().manual_seed(seed)
    sample_generator = torch.Generator().manual_seed(seed + 1)  # the samples leave the bootstrap's stream alone
    stats = empty_statistics(layers, heads, vocab, bootstrap_replicates, max_sep_observations, max_pooled_pairs,
                              max_occurrences)
    num_categories = len(CATEGORY_NAMES)
    empty = True

    for batch in batches:
        empty = False
        inputs = prepare_batch(model, batch)
        input_ids = inputs["input_ids"].cpu()
        mask = inputs["attention_mask"].cpu().bool()
        batch_size = input_ids.shape[0]
        categories = categorizer(input_ids)
        onehot = torch.nn.functional.one_hot(categories, num_categories).to(torch.float64) * mask[..., None]
        mask64 = mask.to(torch.float64)
        tokens_per_sentence = mask64.sum(dim=1)  # [B]
        queries = mask.clone()
        if causal:
            queries[:, 0] = False  # a decoder's first position sees only itself (alpha_00 = 1): no query row
        queries_per_sentence = queries.to(torch.float64).sum(dim=1)  # [B]
        real = mask.reshape(-1)
        real_ids = input_ids.reshape(-1)[real]

        # per-sentence totals of this batch, filled layer by layer
        fx_sum = torch.zeros(batch_size, layers, heads, dtype=torch.float64)
        fx_sq_sum = torch.zeros_like(fx_sum)
        share = torch.zeros(batch_size, layers, heads, num_categories, 2, dtype=torch.float64)
        summed_share = torch.zeros(batch_size, layers, num_categories, dtype=torch.float64)
        category_fx = torch.zeros(batch_size, layers, heads, num_categories, dtype=torch.float64)
        special = {token: torch.nonzero((categories == category) & mask, as_tuple=True)
                   for token, category in (("sep", _SEP), ("cls", _CLS))}
        special_rows = {token: [] for token in special}
        sentence_ids = stats.num_sentences + torch.arange(batch_size)  # numbered in stream order
        occurrence_fx = torch.zeros(batch_size, input_ids.shape[1], dtype=torch.float64)  # sum over layers of mean_h

        for layer_norms in iter_layer_norms(model, inputs):
            # the [B, H, L, L] work stays on the model's device in the norms' dtype; per-sentence totals go to CPU
            # float64 (float32 per-row shares are accurate to ~1e-7, far below the sampling noise)
            ell, device, dtype = layer_norms.layer, layer_norms.fx_norm.device, layer_norms.fx_norm.dtype
            alpha = layer_norms.alpha.to(dtype)
            fx = layer_norms.fx_norm
            real_mask = mask.to(device=device, dtype=dtype)
            query_mask = queries.to(device=device, dtype=dtype)
            key_onehot = onehot.to(device=device, dtype=dtype)
            # sees[b, i, j]: query row i may see key j (every real key for an encoder; causal, windowed for a decoder)
            sees = query_mask[:, :, None] * real_mask[:, None, :]
            if layer_norms.allowed is not None:
                sees = sees * layer_norms.allowed[:, 0].to(dtype)
            viewers = sees.sum(dim=1)  # [B, L] query rows that may see each key
            row_scale = layer_norms.row_scale
            row_scale = torch.ones_like(real_mask) if row_scale is None else row_scale.to(device=device, dtype=dtype)

            fx64 = fx.to("cpu", torch.float64)
            fx_real = fx64 * mask64[:, None, :]
            fx_sum[:, ell] = fx_real.sum(-1)
            fx_sq_sum[:, ell] = (fx_real * fx64).sum(-1)
            category_fx[:, ell] = torch.einsum("bhj,bjc->bhc", fx64, onehot)
            for method, contribution in enumerate((alpha, layer_norms.afx_norm)):
                shares = _row_shares(contribution * real_mask[:, None, None, :], key_onehot)  # [B, H, L, C]
                share[:, ell, :, :, method] = (shares * query_mask[:, None, :, None]).sum(dim=2).to("cpu",
                                                                                                    torch.float64)
            summed_shares = _row_shares(layer_norms.summed_afx_norm * real_mask[:, None, :], key_onehot)  # [B, L, C]
            summed_share[:, ell] = (summed_shares * query_mask[:, :, None]).sum(dim=1).to("cpu", torch.float64)

            stats.token_fx_sum[ell].index_add_(0, real_ids, fx64.mean(dim=1).reshape(-1)[real])
            received = (alpha * sees[:, None]).sum(dim=2) / viewers.clamp_min(1.0)[:, None, :]  # [B, H, L]
            stats.token_alpha_sum[ell].index_add_(0, real_ids, received.mean(dim=1).to("cpu", torch.float64)
                                                  .reshape(-1)[real])
            occurrence_fx += fx64.mean(dim=1)

            for token, (tok_b, tok_j) in special.items():
                if not tok_b.numel():
                    continue
                b_index, j_index = tok_b.to(device), tok_j.to(device)
                to_token = alpha[b_index, :, :, j_index]  # [N, H, L]: weight from every query to this token
                seeing = sees[b_index, :, j_index]  # [N, L]: the query rows that may see this token
                mean_to_token = (to_token * seeing[:, None, :]).sum(-1).to("cpu", torch.float64)
                mean_to_token = mean_to_token / seeing.sum(-1).clamp_min(1.0).to("cpu", torch.float64)[:, None]
                special_rows[token].append(torch.stack([mean_to_token, fx64[tok_b, :, tok_j]], dim=-1))  # [N, H, 2]
                # Kobayashi's Fig. 4 observations: every query row's weight to this token, in every head
                pair = (seeing > 0).cpu()[:, None, :].expand(-1, heads, -1)  # [N, H, L]
                stats.pooled_pairs[token].add(
                    sample_generator,
                    sentence=sentence_ids[tok_b][:, None, None].expand_as(pair)[pair],
                    layer=torch.full((int(pair.sum()),), ell, dtype=torch.int16),
                    head=torch.arange(heads)[None, :, None].expand_as(pair)[pair],
                    alpha=to_token.to("cpu", torch.float32)[pair],
                    fx_norm=fx64[tok_b, :, tok_j][:, :, None].expand_as(pair)[pair],
                    query=torch.arange(pair.shape[-1])[None, None, :].expand_as(pair)[pair],
                    row_scale=row_scale[b_index].to("cpu", torch.float32)[:, None, :].expand_as(pair)[pair],
                )

        stats.occurrences.add(
            sample_generator,
            token_id=input_ids[mask],
            sentence=sentence_ids[:, None].expand_as(mask)[mask],
            fx_norm=(occurrence_fx / layers)[mask],
        )
        stats.num_sentences += batch_size
        stats.num_tokens += int(mask.sum())
        stats.num_queries += int(queries.sum())
        stats.token_count.index_add_(0, real_ids, torch.ones_like(real_ids))
        for token_id in torch.unique(real_ids).tolist():
            if token_id not in stats.token_strings:
                stats.token_strings[token_id] = tokenizer.convert_ids_to_tokens(token_id)
                stats.token_categories[token_id] = CATEGORY_NAMES[int(categorizer.lookup[token_id])]
        stats.fx_sum += fx_sum.sum(0)
        stats.fx_sq_sum += fx_sq_sum.sum(0)
        stats.share_sum += share.sum(0)
        stats.summed_share_sum += summed_share.sum(0)
        stats.category_count += onehot.sum(dim=(0, 1))
        stats.category_fx_sum += category_fx.sum(0)
        if bootstrap_replicates:
            weights = torch.poisson(torch.ones(bootstrap_replicates, batch_size, dtype=torch.float64), generator)
            stats.boot_tokens += weights @ tokens_per_sentence
            stats.boot_queries += weights @ queries_per_sentence
            stats.boot_fx_sum += torch.einsum("rb,blh->rlh", weights, fx_sum)
            stats.boot_fx_sq_sum += torch.einsum("rb,blh->rlh", weights, fx_sq_sum)
            stats.boot_share_sum += torch.einsum("rb,blhcm->rlhcm", weights, share)
            stats.boot_summed_share_sum += torch.einsum("rb,blc->rlc", weights, summed_share)
            stats.boot_category_count += weights @ onehot.sum(dim=1)
            stats.boot_category_fx_sum += torch.einsum("rb,blhc->rlhc", weights, category_fx)
        for token, rows in special_rows.items():
            if rows:
                _reservoir_add(stats, torch.stack(rows, dim=1).to(torch.float32), generator, token)

    if empty:
        raise ValueError("batches was empty; nothing to accumulate")
    return stats
