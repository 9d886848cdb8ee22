"""Pad-free execution (App. A): packed batches give the padded run's numbers on every architecture and mode."""

from __future__ import annotations

import pytest
import torch

import papa_lib
from papa_lib import smoke
from papa_lib.core.models import adapter_for, layout_position_ids, model_inputs
from papa_lib.core.override import MODES, AttentionOverride
from papa_lib.core.packing import pack, supports_packing, unpack

PACKABLE = [arch for arch in smoke.ARCHITECTURES if adapter_for(smoke.tiny_config(arch)).packable]
TEXTS = ["a b c d", "e f", "g h i j k l m", "n"]
PAIRS = ["x y", "z", "w v u", "t s r q"]


def _padded_inputs(model, batch):
    inputs = model_inputs(model, batch)
    inputs["position_ids"] = layout_position_ids(batch, model)  # RoBERTa: App. A ids, as packed
    return inputs


def _check_every_mode(model, batch, atol=1e-5):
    packed = pack(batch, model=model)
    assert packed["input_ids"].shape[1] == int(batch["attention_mask"].sum(1).max()) < batch["input_ids"].shape[1]
    constants = papa_lib.average_attention(model, [batch], progress=False)
    real = batch["attention_mask"][..., None].bool()
    for mode in MODES:
        heads = [(0, 0), (1, 1), (1, 2)] if mode == "mix" else "all"
        for fast in (True, False):
            state = AttentionOverride(model, constants, heads, mode, fast=fast)
            with torch.inference_mode(), state.applied(model):
                padded = model(**_padded_inputs(model, batch), output_hidden_states=True).hidden_states
                hidden = model(**packed, output_hidden_states=True).hidden_states
            for layer, (p, q) in enumerate(zip(padded, hidden)):
                diff = (unpack(q, packed) - torch.where(real, p, 0.0)).abs().max()
                assert diff < atol, f"{model.config.model_type} {mode} fast={fast} layer {layer}: {diff}"


def test_every_architecture_but_deberta_packs():
    assert set(smoke.ARCHITECTURES) - set(PACKABLE) == {"deberta", "deberta-v2"}


@pytest.mark.parametrize("arch", PACKABLE)
@pytest.mark.parametrize("pairs", [False, True])
def test_packed_equals_padded_for_every_mode(arch, pairs):
    torch.manual_seed(0)
    model, tokenizer = smoke.tiny_encoder(arch)
    batch = papa_lib.encode(tokenizer, TEXTS, PAIRS if pairs else None, max_length=24)
    _check_every_mode(model, batch)


@pytest.mark.slow
def test_packed_equals_padded_on_the_embedded_model():
    model, tokenizer = papa_lib.load_encoder()
    batch = papa_lib.encode(tokenizer, ["A gripping, beautifully shot film.", "Dull."],
                            ["It works.", "Far too long and far too loud for its own good."], max_length=40)
    _check_every_mode(model, batch)


@pytest.mark.parametrize("arch", PACKABLE)
def test_packed_average_equals_padded_average(arch):
    model, tokenizer = smoke.tiny_encoder(arch)
    batches = [papa_lib.encode(tokenizer, TEXTS[:2], PAIRS[:2], max_length=20),
               papa_lib.encode(tokenizer, TEXTS[2:], PAIRS[2:], max_length=20)]
    with_ids = []
    for batch in batches:
        batch["position_ids"] = layout_position_ids(batch, model)
        with_ids.append(batch)
    padded = papa_lib.average_attention(model, with_ids, progress=False)
    packed = papa_lib.average_attention(model, [pack(b, model=model) for b in batches], progress=False)
    assert packed.max_length == 20
    assert packed.metadata["layout"] == padded.metadata["layout"] == "papa"  # the layout survives packing
    assert torch.equal(packed.counts, padded.counts)
    assert torch.allclose(packed.matrices, padded.matrices, atol=1e-6)


def test_pack_keeps_app_a_positions_and_remaps_words():
    model, tokenizer = smoke.tiny_encoder("bert")
    batch = papa_lib.encode_words(tokenizer, [["a", "bb", "c"], ["d"]], max_length=12)
    packed = pack(batch, model=model)
    for row in range(2):
        real = batch["attention_mask"][row].nonzero().flatten()
        assert packed.positions[row, : len(real)].tolist() == real.tolist()
        assert packed["position_ids"][row, : len(real)].tolist() == real.tolist()
        assert (packed.positions[row, len(real):] == -1).all()
        for word, column in enumerate(batch.word_index[row].tolist()):
            if column >= 0:
                assert packed["input_ids"][row, packed.word_index[row, word]] == batch["input_ids"][row, column]
    hidden = torch.randn(2, packed["input_ids"].shape[1], 3)
    full = unpack(hidden, packed)
    assert full.shape == (2, 12, 3)
    assert (full[~batch["attention_mask"].bool()] == 0).all()


def test_roberta_position_ids_start_after_the_padding_index():
    model, tokenizer = smoke.tiny_encoder("roberta")
    batch = papa_lib.encode(tokenizer, ["a b"], max_length=8)
    packed = pack(batch, model=model)
    first = model.config.pad_token_id + 1
    assert packed["position_ids"][0].tolist() == (packed.positions[0] + first).tolist()


@pytest.mark.parametrize("arch", ["deberta", "deberta-v2"])
def test_deberta_runs_padded_with_a_clear_message(arch):
    model, tokenizer = smoke.tiny_encoder(arch)
    assert not supports_packing(model) and not adapter_for(model).packable
    batch = papa_lib.encode(tokenizer, TEXTS, max_length=16)
    with pytest.raises(ValueError, match="relative positions from sequence indices"):
        pack(batch, model=model)
    assert layout_position_ids(batch, model) is None
