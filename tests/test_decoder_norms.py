"""Kobayashi et al.'s norm view on decoder LMs: tiny random Gemma 3 (grouped-query heads, sliding window, the
post-attention RMSNorm), Llama and GPT-2 through the encoders' functions (papa_lib.analysis.norms and the corpus
statistics), the first token where attention sinks and token frequency."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import conftest
import papa_lib
from papa_lib.analysis import norm_corpus, norm_findings, norm_statistics, norms

VOCAB = 96
WINDOW = 3  # the tiny Gemma's sliding window (layers 0 and 1; layer 2 is global)
WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "big", "red", "and", ".", ","]
SENTENCES = ["the cat sat on the mat .", "a dog ran , the cat sat .", "the big red dog sat on a mat .",
             "a cat and a dog ran .", "the mat .", "big cats ran and sat on a red mat ."]


def tiny_decoder(model_type: str, seed: int = 0):
    """conftest's tiny random decoder with random biases and (Gemma 3) post-attention norm weights, so that the
    decomposition has every term to get right."""
    return conftest.tiny_decoder(model_type, seed, VOCAB, with_biases=True)


def decoder_tokenizer(eos: bool = True):
    """A word-level decoder tokenizer: <bos>/<eos>/<pad>, no [CLS]/[SEP] (GPT-2-like with ``eos=False``: its end
    token is its <bos>)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3, **{w: i + 4 for i, w in enumerate(WORDS)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>" if eos else "<bos>",
                                   pad_token="<pad>", unk_token="<unk>")


def batches(tokenizer, width: int = 12):
    return [dict(papa_lib.encode(tokenizer, SENTENCES[i:i + 3], max_length=width, layout="causal"))
            for i in (0, 3)]


ARCHS = ("gemma3_text", "llama", "gpt2")


@pytest.fixture(params=ARCHS)
def arch(request):
    return request.param


def _captured(model, batch, module_of_layer, want="output"):
    """The output (or the input, ``want="input"``) of one module per layer, captured by hooks of the test's own."""
    layers = norms.encoder_layers(model)
    got = {}
    handles = []
    for k, layer in enumerate(layers):
        module = module_of_layer(layer)
        if want == "output":
            handles.append(module.register_forward_hook(lambda m, a, o, k=k: got.__setitem__(k, o.detach())))
        else:
            handles.append(module.register_forward_pre_hook(
                lambda m, a, kw, k=k: got.__setitem__(k, kw.get("hidden_states", a[0] if a else None).detach()),
                with_kwargs=True))
    try:
        with torch.no_grad():
            model(**batch, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return [got[k] for k in range(len(layers))]


# ------------------------------------------------------------------------------------------------- exactness

def test_gemma_sum_over_heads_and_keys_is_the_post_attention_norm_output():
    """sum_h sum_j alpha_ij f'^h(x_j) r_i + b_O' r_i = post_attention_layernorm(o_proj(attn(x~))) to 1e-5, with
    f' = diag(1 + w) W_O^h W_V x~ (GQA values repeated per query head) and r_i = 1 / rms(o_i) read off o_proj."""
    model = tiny_decoder("gemma3_text")
    batch = batches(decoder_tokenizer())[0]
    assert (batch["attention_mask"] == 0).any()
    post = _captured(model, batch, lambda layer: layer.post_attention_layernorm)
    summed = _captured(model, batch, lambda layer: layer.self_attn.o_proj)
    entering = _captured(model, batch, lambda layer: layer.self_attn, want="input")
    results = norms.attention_norms(model, batch)
    unscaled = norms.attention_norms(model, batch, scale_rows=False)
    real = batch["attention_mask"].bool()
    for k, layer_norms in enumerate(results):
        layer = model.model.layers[k]
        assert not torch.allclose(layer.post_attention_layernorm.weight, torch.zeros(1))  # (1 + w) really folded
        rms = torch.sqrt(summed[k].pow(2).mean(-1) + layer.post_attention_layernorm.eps)
        torch.testing.assert_close(layer_norms.row_scale, 1.0 / rms, rtol=1e-6, atol=1e-6)
        vectors = norms.transformed_vectors(model, k, entering[k])  # [B, H, L, D]
        proj = norms.attention_projections(model, k)
        rebuilt = (torch.einsum("bhij,bhjd->bid", layer_norms.alpha, vectors) + proj.output_bias) / rms[..., None]
        assert (rebuilt - post[k])[real].abs().max() <= 1e-5
        # the norms are the norms of those very terms
        terms = layer_norms.alpha[..., None] * vectors[:, :, None] / rms[:, None, :, None, None]  # [B, H, L, L, D]
        torch.testing.assert_close(layer_norms.afx_norm, terms.norm(dim=-1), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(layer_norms.summed_afx_norm, terms.sum(1).norm(dim=-1), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(unscaled[k].afx_norm * layer_norms.row_scale[:, None, :, None],
                                   layer_norms.afx_norm)
        torch.testing.assert_close(unscaled[k].fx_norm, layer_norms.fx_norm)  # ||f'(x_j)|| carries no r_i
    check = norms.decomposition_check(model, batch)
    assert (check["relative_error"] < 1e-5).all() and len(check) == 3


def test_the_decomposition_is_exact_on_every_decoder(arch):
    model = tiny_decoder(arch)
    batch = batches(decoder_tokenizer())[1]
    check = norms.decomposition_check(model, batch)
    assert len(check) == len(norms.encoder_layers(model)) and (check["relative_error"] < 1e-5).all()
    assert (check["max_abs_output"] > 1e-3).all() and norms.is_causal(model)
    assert arch in norms.decomposable_model_types(causal=True) and arch not in norms.decomposable_model_types()


def test_values_are_shared_by_a_group_and_output_slices_are_per_query_head():
    for arch, groups in (("gemma3_text", 4), ("llama", 2)):
        proj = norms.attention_projections(tiny_decoder(arch), 0)
        value = proj.value_weight.view(proj.num_heads, proj.head_size, -1)
        bias = proj.value_bias.view(proj.num_heads, proj.head_size)
        assert proj.num_heads == 4
        for head in range(4):
            first = head - head % groups
            assert torch.equal(value[head], value[first]) and torch.equal(bias[head], bias[first])
        assert not torch.equal(value[0], value[-1]) or groups == 4
        out = proj.output_weight.view(-1, proj.num_heads, proj.head_size)
        assert not torch.allclose(out[:, 0], out[:, 1])


def test_alpha_is_causal_windowed_and_sums_to_one_over_the_allowed_keys(arch):
    model = tiny_decoder(arch)
    batch = batches(decoder_tokenizer())[0]
    real = batch["attention_mask"].bool()
    length = real.shape[1]
    index = torch.arange(length)
    for layer_norms in norms.attention_norms(model, batch):
        alpha, allowed = layer_norms.alpha, layer_norms.allowed
        window = WINDOW if arch == "gemma3_text" and layer_norms.layer < 2 else length
        expected = ((index[None, :] <= index[:, None]) & (index[:, None] - index[None, :] < window))[None, None]
        assert torch.equal(allowed, expected & real[:, None, None, :])
        queries = real[:, None, :, None].expand_as(alpha)  # real query rows (a padded row may be anything)
        outside = alpha.masked_fill(allowed, 0.0)[queries]
        assert (outside == 0).all()  # 0 above the diagonal, outside the window and on padded keys
        rows = alpha.sum(-1)[real[:, None, :].expand(-1, alpha.shape[1], -1)]
        torch.testing.assert_close(rows, torch.ones_like(rows))
        assert (layer_norms.afx_norm.masked_fill(allowed, 0.0)[queries] == 0).all()
        if arch != "gemma3_text":
            assert layer_norms.row_scale is None


def test_the_norms_follow_the_weights_of_an_override():
    """Through the override seam: the weights the model used under PAPA (here uniform over the causal window) are the
    alpha of the decomposition, and it stays exact."""
    model = tiny_decoder("gemma3_text")
    batch = batches(decoder_tokenizer())[0]
    with papa_lib.override(model, heads=[(0, 1), (2, 3)], mode="uniform"):
        result = norms.attention_norms(model, batch)
        check = norms.decomposition_check(model, batch)
    assert (check["relative_error"] < 1e-5).all()
    allowed = result[0].allowed[:, 0].to(result[0].alpha.dtype)
    uniform = allowed / allowed.sum(-1, keepdim=True).clamp_min(1.0)
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(result[0].alpha[:, 1][real], uniform[real])


# ------------------------------------------------------------------------------------------------- corpus statistics

def test_a_decoder_tokenizer_categorises_bos_as_the_first_token():
    categorizer = norm_corpus.TokenCategorizer(decoder_tokenizer())
    names = [norm_corpus.CATEGORY_NAMES[int(c)] for c in categorizer(torch.tensor([1, 2, 0, 4, 15, 16]))]
    assert names == ["cls", "sep", "other", "other", "punctuation", "punctuation"]
    gpt2_like = norm_corpus.TokenCategorizer(decoder_tokenizer(eos=False))
    assert gpt2_like.sep_token_id is None and int(gpt2_like(torch.tensor([2]))[0]) == 3  # <eos> unused: "other"


@pytest.fixture(scope="module", params=("gemma3_text", "llama"))
def decoder_corpus(request):
    tokenizer = decoder_tokenizer()
    model = tiny_decoder(request.param)
    data = batches(tokenizer)
    stats = norm_corpus.corpus_norm_statistics(model, data, tokenizer, bootstrap_replicates=20, seed=0)
    direct = [(batch, norms.attention_norms(model, batch)) for batch in data]
    return {"arch": request.param, "model": model, "tokenizer": tokenizer, "stats": stats, "direct": direct}


def test_decoder_statistics_leave_out_the_first_query(decoder_corpus):
    stats, direct = decoder_corpus["stats"], decoder_corpus["direct"]
    tokens = sum(int(b["attention_mask"].sum()) for b, _ in direct)
    assert stats.num_tokens == tokens and stats.num_queries == tokens - len(SENTENCES)
    shares = norm_statistics.attention_share_by_category(stats, per_head=True)
    np.testing.assert_allclose(shares.groupby(["layer", "head", "method"])["share"].sum(), 1.0, rtol=1e-6)
    # Kobayashi's pooled pairs: every query row that may see <bos> (a local layer's window hides it from later rows)
    expected = 0
    for batch, result in direct:
        queries = batch["attention_mask"].bool().clone()
        queries[:, 0] = False
        for layer_norms in result:
            expected += int((queries & layer_norms.allowed[:, 0, :, 0]).sum()) * layer_norms.alpha.shape[1]
    assert stats.pooled_pairs["cls"].seen == expected
    pooled = norm_findings.pooled_weight_norm_correlation(stats, "cls", replicates=10)
    assert pooled["n_seen"] == expected and -1.0 <= pooled["spearman_rho"] <= 1.0


def test_first_token_table(decoder_corpus):
    stats, direct = decoder_corpus["stats"], decoder_corpus["direct"]
    table = norm_statistics.first_token_table(stats)
    assert list(table.columns) == [
        "layer", "head", "n_queries", "mean_alpha_to_first", "alpha_ci_low", "alpha_ci_high", "norm_share_first",
        "norm_ci_low", "norm_ci_high", "mean_fx_norm_first", "mean_fx_norm_other", "fx_norm_ratio", "n_pairs",
        "mean_row_scale", "mean_afx_first", "pearson_r", "spearman_rho"]
    heads = direct[0][1][0].alpha.shape[1]
    assert len(table) == len(direct[0][1]) * heads
    for layer in range(len(direct[0][1])):
        alphas, shares, first_fx = [], [], []
        for batch, result in direct:
            queries = batch["attention_mask"].bool().clone()
            queries[:, 0] = False
            norms_ = result[layer]
            alphas.append(norms_.alpha[:, :, :, 0].permute(0, 2, 1)[queries])  # [rows, H]
            share = norms_.afx_norm[:, :, :, 0] / norms_.afx_norm.sum(-1)
            shares.append(share.permute(0, 2, 1)[queries])
            first_fx.append(norms_.fx_norm[:, :, 0])  # [B, H]
        got = table[table["layer"] == layer].sort_values("head")
        np.testing.assert_allclose(got["mean_alpha_to_first"], torch.cat(alphas).double().mean(0), rtol=1e-5)
        np.testing.assert_allclose(got["norm_share_first"], torch.cat(shares).double().mean(0), rtol=1e-5)
        first_fx = torch.cat(first_fx)
        # a decoder's first position sees only itself: x_0, hence ||f(x_0)||, is the same in every sequence
        torch.testing.assert_close(first_fx, first_fx[:1].expand_as(first_fx))
        np.testing.assert_allclose(got["mean_fx_norm_first"], first_fx[0].double(), rtol=1e-5)
    assert (table["alpha_ci_low"] <= table["mean_alpha_to_first"] + 1e-9).all()
    assert (table["n_pairs"] > 0).all()
    if decoder_corpus["arch"] == "llama":  # no row scale: y = ||f(x_0)|| alpha exactly, correlation 1
        assert (table["mean_row_scale"] == 1.0).all()
        np.testing.assert_allclose(table["pearson_r"].dropna(), 1.0, atol=1e-6)
    else:
        assert (table["mean_row_scale"] != 1.0).all() and table["pearson_r"].notna().all()
    across = norm_statistics.head_level_correlation(table, token="first")
    assert across["n_heads"] == len(table)
    assert {"pearson_r", "pearson_p", "pearson_ci_low", "pearson_ci_high", "spearman_rho"} <= set(across)
    r = np.corrcoef(table["mean_alpha_to_first"], table["mean_fx_norm_first"])[0, 1]
    assert across["pearson_r"] == pytest.approx(r)


def test_frequency_tables(decoder_corpus):
    stats, direct, tokenizer = decoder_corpus["stats"], decoder_corpus["direct"], decoder_corpus["tokenizer"]
    table = norm_statistics.token_weight_norm_table(stats)
    assert list(table.columns) == ["token_id", "token", "category", "count", "corpus_count", "log_frequency",
                                   "mean_alpha", "mean_fx_norm"]
    the = table.set_index("token").loc["the"]
    assert the["category"] == "other" and the["log_frequency"] == pytest.approx(np.log(the["count"]))
    assert table.set_index("token").loc["<bos>", "category"] == "cls"
    # the weight "the" receives: per occurrence, mean over heads of the mean alpha over the query rows that see it
    the_id = tokenizer.convert_tokens_to_ids("the")
    per_layer = []
    for layer in range(len(direct[0][1])):
        values = []
        for batch, result in direct:
            norms_ = result[layer]
            queries = batch["attention_mask"].bool().clone()
            queries[:, 0] = False
            sees = norms_.allowed[:, 0] & queries[:, :, None]  # [B, i, j]
            received = (norms_.alpha * sees[:, None]).sum(2) / sees.sum(1).clamp_min(1)[:, None]  # [B, H, L]
            values.append(received.mean(1)[batch["input_ids"] == the_id])
        per_layer.append(torch.cat(values).double().mean())
    assert the["mean_alpha"] == pytest.approx(float(torch.stack(per_layer).mean()), rel=1e-5)
    layered = norm_statistics.token_weight_norm_table(stats, per_layer=True)
    assert "layer" in layered and len(layered) == len(table) * len(direct[0][1])
    counts = np.bincount(np.concatenate([b["input_ids"][b["attention_mask"].bool()].numpy() for b, _ in direct]),
                         minlength=VOCAB) * 10
    counts[1] = 0  # <bos> not counted in the corpus: left out (no log frequency)
    correlation = norm_statistics.frequency_weight_norm_correlation(stats, counts)
    assert list(correlation.columns) == [
        "quantity", "n_token_types", "pearson_r", "pearson_p", "pearson_ci_low", "pearson_ci_high", "spearman_rho",
        "spearman_p", "spearman_ci_low", "spearman_ci_high"]
    assert list(correlation["quantity"]) == ["alpha", "fx_norm"]
    assert (correlation["n_token_types"] == len(table) - 1).all()
    without_bos = norm_statistics.frequency_weight_norm_correlation(stats, exclude=("cls",))
    kept = table[table["category"] != "cls"]
    rho = pd.Series(kept["log_frequency"]).rank().corr(pd.Series(kept["mean_fx_norm"]).rank())
    assert without_bos.set_index("quantity").loc["fx_norm", "spearman_rho"] == pytest.approx(rho)
    per_layer_rows = norm_statistics.frequency_weight_norm_correlation(stats, per_layer=True)
    assert list(per_layer_rows.columns[:2]) == ["layer", "quantity"] and len(per_layer_rows) == 2 * len(direct[0][1])
    with pytest.raises(ValueError, match="unknown categories"):
        norm_statistics.frequency_weight_norm_correlation(stats, exclude=("bos",))


# ---------------------------------------------------------------------------------------------- the decoder runner
def _wikitext(tmp_path):
    folder = tmp_path / "wikitext-2"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    lines = [" = Heading = "] + [" ".join(rng.choice(WORDS, 16)) for _ in range(40)]
    for name in ("wiki.valid.tokens", "wiki.test.tokens"):
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return tmp_path


def test_the_decoder_runner_writes_the_findings_claims_c8c_and_c9_read(tmp_path):
    from papa_lib.analysis import claims

    model, tokenizer = tiny_decoder("gemma3_text"), decoder_tokenizer()
    data = _wikitext(tmp_path / "data")
    windows = norm_findings.decoder_windows(tokenizer, data, n_windows=6, length=10)
    assert windows.shape == (6, 10) and bool((windows[:, 0] == tokenizer.bos_token_id).all())
    tables = norm_findings.run_decoder_analyses(model, tokenizer, data, tmp_path / "analysis", n_windows=6,
                                                length=10, batch_size=3, bootstrap_replicates=20)
    findings = tables["kobayashi_findings"].set_index("finding")
    assert list(findings.index) == list(norm_findings.DECODER_FINDINGS)
    # every (query i >= 1, <bos>) pair where <bos> is an allowed key, in every head: on the two local layers
    # (window 3) queries 1 and 2 see it, on the global layer all 9 queries
    assert int(findings.loc["first_token_weight_vs_norm", "n_seen"]) == 6 * 4 * (2 * 2 + 9)
    assert findings.loc["first_token_weight_vs_norm", "n_clusters"] == 6
    # Kobayashi's f(x_0) by hand in layer 0: W_O^h W_V x~_0, x~_0 the input-normed <bos> embedding
    unnormed = norm_findings.unnormed_first_token_norms(model, tokenizer.bos_token_id)
    first = model.model.layers[0]
    with torch.no_grad():
        x = first.input_layernorm(model.model.embed_tokens(torch.tensor([[tokenizer.bos_token_id]])))[0, 0]
        value = first.self_attn.v_proj(x)  # one key/value head serves the four query heads
        size = first.self_attn.head_dim
        by_hand = [float((first.self_attn.o_proj.weight[:, h * size:(h + 1) * size] @ value).norm())
                   for h in range(4)]
    assert unnormed.shape == (3, 4) and np.allclose(unnormed[0], by_hand, rtol=1e-5)
    rows = claims.norm_claims(tmp_path / "analysis", "gemma-3-270m")
    assert [r["claim"] for r in rows] == ["C8c", "C9"]
    assert all(r["verdict"] in ("agrees", "differs", "negligible", "inconclusive") for r in rows)
