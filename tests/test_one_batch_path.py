"""One way to run a batch (issue 57): a batch from ``papa_lib.encode`` gets the paper's App. A positions on every
architecture, whether it is passed to the model directly, packed or averaged; head selection takes the model's shape.

The README's ten lines run as written, on a tiny random model of each architecture in place of the embedded one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import papa_lib
from papa_lib import smoke
from papa_lib.core.models import adapter_for, model_inputs
from papa_lib.core.packing import pack, unpack
from papa_lib.experiments.selection import heads_to_replace

README = Path(__file__).resolve().parents[1] / "README.md"
PACKABLE = [arch for arch in smoke.ARCHITECTURES if adapter_for(smoke.tiny_config(arch)).packable]
ATOL = 1e-5


def ten_lines() -> str:
    """The python block after '## The library in ten lines' in README.md."""
    section = README.read_text(encoding="utf-8").split("## The library in ten lines", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def tiny(arch: str):
    """A tiny random model of ``arch`` and a tokenizer that matches it as a real checkpoint's does: the tokenizer's
    pad token is the model's padding index (so transformers' own RoBERTa numbering, which counts non-pad tokens, is
    the one a real RoBERTa gets), and it returns token type ids only to a model with segment embeddings."""
    from transformers import AutoModel

    tokenizer = smoke.tiny_tokenizer()
    config = smoke.tiny_config(arch, vocab_size=len(tokenizer))
    config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(0)
    model = AutoModel.from_config(config, attn_implementation="eager").eval()
    if not adapter_for(model).uses_token_type_ids:
        tokenizer.model_input_names = [name for name in tokenizer.model_input_names if name != "token_type_ids"]
    return model, tokenizer


def run_readme(monkeypatch, model, tokenizer) -> dict:
    monkeypatch.setattr(papa_lib, "load_encoder", lambda *args, **kwargs: (model, tokenizer))
    namespace: dict = {}
    with torch.inference_mode():
        exec(compile(ten_lines(), str(README), "exec"), namespace)  # noqa: S102 - the README's own code
    return namespace


def real_diff(a: torch.Tensor, b: torch.Tensor, real: torch.Tensor) -> float:
    return float((a - b)[real].abs().max())


def max_diff(hidden_a, hidden_b, real) -> float:
    return max(real_diff(a, b, real) for a, b in zip(hidden_a, hidden_b))


def test_the_readme_block_is_ten_lines_and_selects_by_model():
    code = ten_lines().splitlines()
    assert len(code) == 10
    assert any('heads_to_replace("first_to_last", 0.5, model)' in line for line in code)


@pytest.mark.parametrize("arch", smoke.ARCHITECTURES)
def test_readme_lines_direct_packed_and_library_paths_agree(arch, monkeypatch):
    model, tokenizer = tiny(arch)
    ns = run_readme(monkeypatch, model, tokenizer)
    batch, constants, heads, texts = ns["batch"], ns["constants"], ns["heads"], ns["texts"]
    layers, per_layer = model.config.num_hidden_layers, model.config.num_attention_heads
    assert len(heads) == layers * per_layer // 2  # half of this model's heads, whatever its shape
    real = batch["attention_mask"].bool()
    assert not real.all()  # the App. A padding sits before the final separator

    for_model = papa_lib.encode(tokenizer, texts, max_length=batch.max_length, model=model)
    adapter = adapter_for(model)
    if adapter.packable:
        first = adapter.first_position_id(model.config)
        assert torch.equal(for_model["position_ids"][0], torch.arange(batch.max_length) + first)
    else:
        assert "position_ids" not in for_model  # DeBERTa: transformers' default is App. A already
    if not adapter.uses_token_type_ids:
        assert "token_type_ids" not in for_model

    with torch.inference_mode(), papa_lib.override(model, constants, heads=heads):
        library = model(**model_inputs(model, batch), output_hidden_states=True).hidden_states
        direct = model(**for_model, output_hidden_states=True).hidden_states
        assert max_diff(direct, library, real) <= ATOL, arch
        if adapter.position_offset == "none":  # BERT-like: the README's own direct call is App. A too
            assert max_diff(ns["hidden"], library, real) <= ATOL, arch
        if arch in PACKABLE:
            for packed in (pack(for_model), pack(batch, model=model), pack(for_model, model=model)):
                assert torch.equal(packed["position_ids"], pack(batch, model=model)["position_ids"])
                hidden = model(**packed, output_hidden_states=True).hidden_states
                full = [unpack(h, packed) for h in hidden]
                assert max_diff(full, library, real) <= ATOL, arch

    # averaging: the batch without positions, with them, and packed give the same constants
    averaged = [papa_lib.average_attention(model, [for_model], progress=False).matrices]
    if arch in PACKABLE:
        averaged.append(papa_lib.average_attention(model, [pack(for_model)], progress=False).matrices)
    for matrices in averaged:
        torch.testing.assert_close(matrices, constants.matrices, atol=1e-6, rtol=0)


@pytest.mark.parametrize("arch", ["roberta", "mpnet"])
def test_roberta_style_direct_call_needs_the_model_at_encode(arch):
    """Without ``model=`` transformers numbers a RoBERTa-style model's positions by counting non-pad tokens, which is
    not App. A; with it the batch carries the App. A ids and every path agrees (measured on all-mpnet-base-v2: packed
    against a plain ``model(**batch)`` differed by up to 0.73)."""
    model, tokenizer = tiny(arch)
    texts = ["a good film", "the story was very dull and the cast was weak ."]
    plain = papa_lib.encode(tokenizer, texts, max_length=24)
    for_model = papa_lib.encode(tokenizer, texts, max_length=24, model=model)
    real = plain["attention_mask"].bool()
    with torch.inference_mode():
        default = model(**plain).last_hidden_state
        library = model(**model_inputs(model, plain)).last_hidden_state
        direct = model(**for_model).last_hidden_state
    assert real_diff(direct, library, real) <= ATOL
    assert real_diff(default, library, real) > 1e-3  # why encode takes the model


def test_pack_infers_positions_or_refuses():
    model, tokenizer = tiny("roberta")
    texts = ["a good film", "dull"]
    plain = papa_lib.encode(tokenizer, texts, max_length=16)
    with pytest.raises(ValueError, match="cannot know this batch's position ids"):
        pack(plain)
    carried = pack(papa_lib.encode(tokenizer, texts, max_length=16, model=model))
    assert torch.equal(carried["position_ids"], pack(plain, model=model)["position_ids"])
    assert carried["position_ids"][0, 0] == model.config.pad_token_id + 1
    # ids that are not App. A positions (transformers' pad-counting ones) are refused, not packed
    wrong = dict(plain)
    wrong["position_ids"] = torch.cumsum(plain["attention_mask"], 1) * plain["attention_mask"] + 1
    with pytest.raises(ValueError, match="not App. A positions"):
        pack(wrong)
    deberta, deberta_tokenizer = tiny("deberta")
    with pytest.raises(ValueError, match="cannot run packed"):
        pack(papa_lib.encode(deberta_tokenizer, texts, max_length=16, model=deberta))


def test_positions_encoded_for_another_model_are_an_error():
    roberta, tokenizer = tiny("roberta")
    bert, _ = tiny("bert")
    batch = papa_lib.encode(tokenizer, ["a good film"], max_length=12, model=roberta)
    with pytest.raises(ValueError, match="not App. A positions for this bert model"):
        model_inputs(bert, batch)
    with pytest.raises(ValueError, match="not App. A positions for this bert model"):
        pack(batch, model=bert)
    assert torch.equal(model_inputs(roberta, batch)["position_ids"], batch["position_ids"])  # used as they are


def test_heads_to_replace_takes_the_model_shape():
    from transformers import BertConfig

    minilm_like, base_like = BertConfig(num_hidden_layers=6, num_attention_heads=12), BertConfig()
    assert len(heads_to_replace("first_to_last", 0.5, minilm_like)) == 36
    assert len(heads_to_replace("first_to_last", 0.5, base_like)) == 72  # half of 12 x 12, not 36
    model, _ = tiny("bert")
    assert heads_to_replace("first_to_last", 0.5, model) == heads_to_replace("first_to_last", 0.5, num_layers=2,
                                                                             num_heads=4)
    assert len(heads_to_replace("first_to_last", 0.5, model, num_layers=2, num_heads=4)) == 4
    with pytest.raises(ValueError, match="num_layers=6 does not match the model, which has 12 layers of 12 heads"):
        heads_to_replace("first_to_last", 0.5, base_like, num_layers=6, num_heads=12)
    with pytest.raises(ValueError, match="num_heads=12 does not match"):
        heads_to_replace("first_to_last", 0.5, model, num_heads=12)
    with pytest.raises(ValueError, match="num_layers= and num_heads="):
        heads_to_replace("first_to_last", 0.5)
    with pytest.raises(ValueError, match="num_layers= and num_heads="):
        heads_to_replace("first_to_last", 0.5, num_layers=6)
    with pytest.raises(TypeError, match="num_layers= and num_heads="):
        heads_to_replace("first_to_last", 0.5, 6)
