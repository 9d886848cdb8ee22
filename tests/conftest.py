"""Shared fixtures: tiny random encoders of every supported architecture, tokenizers, and the real data folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
ARCHITECTURES = ("bert", "roberta", "electra", "deberta", "deberta-v2")


def tiny_config(model_type: str, **overrides):
    """A tiny config (2 layers, 4 heads, hidden 32) of one supported architecture."""
    from transformers import BertConfig, DebertaConfig, DebertaV2Config, ElectraConfig, RobertaConfig

    common = dict(
        vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=160, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, type_vocab_size=2,
    )
    common.update(overrides)
    if model_type == "bert":
        return BertConfig(**common)
    if model_type == "roberta":
        return RobertaConfig(**{**common, "pad_token_id": 1, "type_vocab_size": 1})
    if model_type == "electra":
        return ElectraConfig(**{**common, "embedding_size": 24})
    if model_type == "deberta":
        return DebertaConfig(**{**common, "relative_attention": True, "pos_att_type": ["c2p", "p2c"], "max_relative_positions": -1})
    if model_type == "deberta-v2":
        return DebertaV2Config(
            **{**common, "relative_attention": True, "pos_att_type": ["c2p", "p2c"], "position_buckets": 16,
               "norm_rel_ebd": "layer_norm", "share_att_key": True, "position_biased_input": False}
        )
    raise ValueError(model_type)


def tiny_model(model_type: str, seed: int = 0, **overrides):
    """A tiny randomly initialised encoder in eval mode with eager attention."""
    from transformers import AutoModel

    torch.manual_seed(seed)
    model = AutoModel.from_config(tiny_config(model_type, **overrides), attn_implementation="eager")
    model.eval()
    model.papa_model_id = f"tiny-{model_type}"
    return model


def random_batch(batch: int = 3, length: int = 12, vocab: int = 120, seed: int = 0, lengths=None):
    """Random ids with varied padding in the PAPA layout: real tokens first, padding, then a final real token."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (batch, length), generator=generator)
    lengths = lengths or [max(2, length - 1 - 3 * i) for i in range(batch)]
    mask = torch.zeros(batch, length, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, : n - 1] = 1
        mask[row, -1] = 1
    ids = torch.where(mask.bool(), ids, torch.full_like(ids, 1))
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


@pytest.fixture(params=ARCHITECTURES)
def arch(request):
    return request.param


@pytest.fixture(scope="session")
def minilm():
    """The embedded real model (all-MiniLM-L6-v2) and its tokenizer."""
    import papa_lib

    return papa_lib.load_encoder()


@pytest.fixture(scope="session")
def bert_tokenizer(minilm):
    return minilm[1]


@pytest.fixture(scope="session")
def roberta_tokenizer():
    """A tiny byte-level BPE tokenizer with RoBERTa's special-token layout (<s> a </s></s> b </s>), built offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import RobertaTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = ["hello there good morning the cat sat on the mat", "a dog ran in the park with a red ball"] * 20
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", tokenizer.token_to_id("</s>")), ("<s>", tokenizer.token_to_id("<s>")))
    tokenizer.decoder = decoders.ByteLevel()
    return RobertaTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
        pad_token="<pad>", unk_token="<unk>", mask_token="<mask>",
    )


@pytest.fixture(scope="session")
def shared_data():
    if not SHARED_DATA.exists():
        pytest.skip(f"real data folder {SHARED_DATA} not present")
    return SHARED_DATA
