"""The library's own API given a researcher's mistakes: each is a PapaInputError (a ValueError) with one line that
names it, before torch or transformers fail deep inside, and nothing is silently wrong. Found by an audit of the API
(2026-12-08); every case here was a silent wrong result or a traceback from inside torch or transformers before."""

from __future__ import annotations

import pytest
import torch

import papa_lib
from papa_lib import smoke
from papa_lib.core import averaging, models, packing
from papa_lib.core.decoders import next_token_nll
from papa_lib.errors import PapaInputError

TEXTS = ["the film was good", "a dull plot", "great acting and a fine score"]


@pytest.fixture(scope="module")
def bert():
    return smoke.tiny_encoder("bert")


def test_texts_must_be_lists_of_strings(bert):
    _, tokenizer = bert
    with pytest.raises(PapaInputError, match=r"texts\[1\] is int 3, not a string"):
        papa_lib.encode(tokenizer, ["ok", 3])
    with pytest.raises(PapaInputError, match="pairs must be a list of strings, not one string"):
        papa_lib.encode(tokenizer, ["the film"], "a plot")  # was "got 1 texts but 6 pairs"
    with pytest.raises(PapaInputError, match=r"sentences\[0\] is a string; each sentence is a list of words"):
        papa_lib.encode_words(tokenizer, ["the film was good"])  # was read as 17 one-character "words"
    with pytest.raises(PapaInputError, match="max_length must be an integer, got 16.0"):
        papa_lib.encode(tokenizer, TEXTS, max_length=16.0)
    with pytest.raises(PapaInputError, match="leaves no room for both texts of a pair"):
        papa_lib.encode(tokenizer, ["a"], ["b"], max_length=4)  # text b vanished without a word


def test_a_batch_must_fit_the_model(bert):
    model, tokenizer = bert
    limit = models.position_limit(model)
    with pytest.raises(PapaInputError, match=f"longer than the {limit} positions"):
        papa_lib.encode(tokenizer, TEXTS, max_length=limit + 2, model=model)
    other = smoke.tiny_tokenizer()
    batch = papa_lib.encode(other, TEXTS, max_length=16)
    batch["input_ids"][0, 1] = model.config.vocab_size  # an id the model's embedding does not have
    with pytest.raises(PapaInputError, match="outside the .*vocabulary .*another model's tokenizer"):
        papa_lib.average_attention(model, [batch], progress=False)


def test_averaging_refuses_mixed_layouts_one_batch_and_dropout(bert):
    model, tokenizer = bert
    papa = papa_lib.encode(tokenizer, TEXTS, max_length=16)
    standard = papa_lib.encode(tokenizer, TEXTS, max_length=16, layout="standard")
    with pytest.raises(PapaInputError, match="same layout; got 'standard' after 'papa'"):
        papa_lib.average_attention(model, [papa, standard], progress=False)
    with pytest.raises(PapaInputError, match=r"a list .* of batches, e.g. \[batch\]"):
        papa_lib.average_attention(model, papa, progress=False)
    empty = papa_lib.encode(tokenizer, [], max_length=16)
    reference = papa_lib.average_attention(model, [papa], progress=False)
    assert torch.equal(papa_lib.average_attention(model, [empty, papa], progress=False).matrices,
                       reference.matrices)  # an empty batch adds nothing (it crashed inside the model)
    model.train()  # the tiny BERT's attention dropout is 0.1
    try:  # dropout made two averages differ by up to 0.14
        assert torch.equal(papa_lib.average_attention(model, [papa], progress=False).matrices, reference.matrices)
        assert model.training  # the mode is restored
    finally:
        model.eval()


def test_override_checks_mode_heads_values_and_model(bert):
    model, tokenizer = bert
    batch = papa_lib.encode(tokenizer, TEXTS, max_length=16, model=model)
    constants = papa_lib.average_attention(model, [batch], progress=False)
    with pytest.raises(PapaInputError, match="unknown mode 'constnat'"):
        papa_lib.override(model, constants, heads=[], mode="constnat").__enter__()  # no head listed: it passed
    with pytest.raises(PapaInputError, match=r"heads=\(0, 1\): pass a list of \(layer, head\) pairs"):
        papa_lib.override(model, constants, heads=(0, 1)).__enter__()
    broken = constants.matrices.clone()
    broken[0, 0, 0, 0] = float("nan")
    with pytest.raises(PapaInputError, match="NaN or infinite"):
        papa_lib.override(model, broken).__enter__()
    state = papa_lib.AttentionOverride(model, constants, mode="zeros")
    other = smoke.tiny_model("bert", num_hidden_layers=models.num_layers_and_heads(model)[0] + 1)
    with pytest.raises(PapaInputError, match="built for .* layers"):  # an extra layer stayed original silently
        with state.applied(other):
            pass
    for size in (2.5, -1, "4"):
        with pytest.raises(PapaInputError, match="length must be a non-negative integer"):
            papa_lib.toeplitz_matrix(size)


def test_pack_and_unpack_refuse_what_they_cannot_use(bert):
    model, tokenizer = bert
    batch = papa_lib.encode(tokenizer, TEXTS, max_length=16, model=model)
    packed = papa_lib.pack(batch)
    with pytest.raises(PapaInputError, match="packed already"):
        papa_lib.pack(packed)
    hidden = model(**packed).last_hidden_state
    with pytest.raises(PapaInputError, match="must be the PackedBatch that pack"):
        papa_lib.unpack(hidden, batch)
    with pytest.raises(PapaInputError, match="do not fit the packed batch"):
        papa_lib.unpack(hidden[:2], packed)
    assert papa_lib.unpack(hidden, packed).shape[:2] == (len(TEXTS), 16)


def test_loaders_name_a_missing_folder_and_an_absent_device(tmp_path, monkeypatch):
    nowhere = tmp_path / "models" / "minilm"
    for load in (papa_lib.load_encoder, papa_lib.load_decoder):
        with pytest.raises(PapaInputError, match=f"model folder not found: {nowhere}"):
            load(str(nowhere))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(PapaInputError, match="torch sees no CUDA GPU"):
        papa_lib.load_encoder(device="cuda")
    with pytest.raises(PapaInputError, match="use auto, cpu, cuda, cuda:N or mps"):
        papa_lib.load_encoder(device="gpu")


def test_next_token_nll_needs_a_decoder_and_its_layout(bert):
    masked = smoke.tiny_model("bert")
    from transformers import BertForMaskedLM

    lm = BertForMaskedLM(masked.config).eval()
    _, tokenizer = bert
    with pytest.raises(PapaInputError, match="not a causal decoder LM"):
        next_token_nll(lm, papa_lib.encode(tokenizer, TEXTS, max_length=16))
    from conftest import tiny_decoder

    with pytest.raises(PapaInputError, match="a batch in the 'papa' layout"):  # a decoder reads 'causal' batches
        next_token_nll(tiny_decoder("llama"), papa_lib.encode(tokenizer, TEXTS, max_length=16, layout="papa"))


def test_an_adapter_with_an_unknown_position_offset_is_refused(restore_registries):
    with pytest.raises(ValueError, match="unknown position_offset 'padding'"):
        papa_lib.register_adapter(papa_lib.ArchitectureAdapter("foo2", "interface", position_offset="padding"))


def test_a_damaged_constants_file_is_named(tmp_path):
    path = tmp_path / "c.safetensors"
    path.write_bytes(b"not a safetensors file at all")
    with pytest.raises(PapaInputError, match=f"{path} is not a safetensors file of constant matrices"):
        averaging.ConstantAttention.load(path)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (a CPU batch stays on the CPU anyway)")
def test_pack_stays_on_the_batch_device(bert):
    model, tokenizer = bert
    batch = papa_lib.encode_words(tokenizer, [["a", "fine", "film"], ["dull"]], max_length=16, model=model)
    for key in ("input_ids", "attention_mask", "position_ids"):
        batch[key] = batch[key].to("cuda")
    packed = packing.pack(batch)
    assert packed.real.device.type == "cuda" and packed.word_index.device.type == "cuda"


def test_what_the_checks_must_still_let_through(bert):
    """A review of the checks above: none of these may be refused."""
    import numpy as np

    from conftest import tiny_decoder

    model, tokenizer = bert
    assert papa_lib.encode(tokenizer, TEXTS, max_length=np.int64(16))["input_ids"].shape == (3, 16)
    assert papa_lib.toeplitz_matrix(np.int64(3)).shape == (3, 3)
    assert papa_lib.encode(tokenizer, ["ok"], ["fine"], max_length=6)["input_ids"].shape == (1, 6)  # room for both
    gpt2 = tiny_decoder("gpt2")  # a causal LM papa has no adapter for: its NLL is still a next-token NLL
    ids = torch.tensor([[1, 5, 6, 7, 0]])
    nll, count = next_token_nll(gpt2, {"input_ids": ids, "attention_mask": (ids > 0).long()})
    assert count == 3 and nll > 0
    modern = smoke.tiny_model("modernbert")  # rotary positions: max_position_embeddings is no hard limit
    assert models.position_limit(modern) is None
    papa = papa_lib.encode(tokenizer, TEXTS, max_length=16)
    standard = papa_lib.encode(tokenizer, TEXTS, max_length=16, layout="standard")
    with pytest.raises(PapaInputError, match="same layout"):  # a first batch without a layout does not open the door
        papa_lib.average_attention(model, [dict(papa), standard, papa], progress=False)
    model.embeddings.train()  # one submodule in train mode: its own mode comes back
    try:
        papa_lib.average_attention(model, [papa], progress=False)
        assert model.embeddings.training and not model.training and not model.encoder.training
    finally:
        model.eval()
    assert models.check_device("auto") in ("cpu", "cuda") and not models.DEVICE_NAMES.fullmatch("cpu\n")
