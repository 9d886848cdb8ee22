"""What is particular to some architectures: ALBERT's shared layers, ModernBERT's local windows, MPNet's relative
position bias, and adding an architecture with register_adapter (the shared exactness tests over every architecture
are in test_core, test_packing and test_fastpath)."""

from __future__ import annotations

import pytest
import torch

import papa_lib
from conftest import random_batch
from papa_lib.core import models
from papa_lib.core.models import ArchitectureAdapter, model_inputs
from papa_lib.smoke import tiny_model


def run(model, batch, **kwargs):
    with torch.no_grad():
        return model(**model_inputs(model, batch), **kwargs)


def test_albert_replaces_by_layer_position_although_its_layers_share_one_module():
    model = tiny_model("albert")
    modules = models.self_attention_modules(model)
    assert len(modules) == 2 and modules[0] is modules[1]
    batch = random_batch()
    original = run(model, batch, output_hidden_states=True, output_attentions=True)
    with papa_lib.override(model, None, heads=[(1, 0), (1, 1), (1, 2), (1, 3)], mode="zeros"):
        replaced = run(model, batch, output_hidden_states=True, output_attentions=True)
    real = batch["attention_mask"].bool()
    # layer 0 (the first call of the shared module) is untouched, layer 1 (the second) is replaced
    torch.testing.assert_close(replaced.hidden_states[1][real], original.hidden_states[1][real], atol=1e-6, rtol=0)
    assert torch.equal(replaced.attentions[0], original.attentions[0])
    assert (replaced.attentions[1] == 0).all() and (original.attentions[1] != 0).any()
    assert (replaced.hidden_states[2][real] - original.hidden_states[2][real]).abs().max() > 1e-3
    # and a second forward pass counts from layer 0 again
    with papa_lib.override(model, None, heads=[(0, 0)], mode="zeros"):
        for _ in range(2):
            attentions = run(model, batch, output_attentions=True).attentions
            assert (attentions[0][:, 0] == 0).all() and (attentions[1][:, 0] != 0).any()


def test_albert_constants_differ_per_layer_position():
    model = tiny_model("albert")
    constants = papa_lib.average_attention(model, [random_batch()], progress=False)
    assert constants.matrices.shape[:2] == (2, 4)
    assert not torch.allclose(constants.matrices[0], constants.matrices[1])


def test_modernbert_local_layers_keep_their_window():
    model = tiny_model("modernbert")
    assert [layer.attention_type for layer in model.layers] == ["full_attention", "sliding_attention"]
    window = model.config.sliding_window
    batch = random_batch(batch=2, length=12, lengths=[12, 8])
    distance = (torch.arange(12)[:, None] - torch.arange(12)[None, :]).abs()
    original = run(model, batch, output_attentions=True).attentions
    assert (original[1][..., distance > window] == 0).all()  # the model's own local layer
    constants = papa_lib.average_attention(model, [batch], progress=False)
    assert (constants.matrices[1][..., distance > window] == 0).all()  # so is its average
    for mode in ("toeplitz", "constant", "identity"):
        with papa_lib.override(model, constants, mode=mode):
            weights = run(model, batch, output_attentions=True).attentions
        assert (weights[1][..., distance > window] == 0).all(), mode  # replacements stay inside the window
        real = batch["attention_mask"].bool()
        rows = weights[1].sum(-1)[real[:, None, :].expand(-1, 4, -1)]
        torch.testing.assert_close(rows, torch.ones_like(rows))  # and their rows still sum to one
    with papa_lib.override(model, constants, mode="toeplitz"):
        weights = run(model, batch, output_attentions=True).attentions
    assert (weights[0][0][..., distance > window] > 0).any()  # the global layer is not cut


def test_mpnet_bias_follows_position_ids():
    """Shifting every App. A position by the same amount changes nothing in MPNet's relative bias."""
    model = models.prepare_model(tiny_model("mpnet"))
    batch = random_batch(batch=2)
    base = torch.arange(12).expand(2, 12) + 2
    with torch.no_grad():
        first = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=base)
        bias = model.encoder.compute_position_bias(first.last_hidden_state, position_ids=base)
        shifted = model.encoder.compute_position_bias(first.last_hidden_state, position_ids=base + 5)
        default = model.encoder.compute_position_bias(first.last_hidden_state)
    assert torch.equal(bias, shifted)
    torch.testing.assert_close(bias, default.expand_as(bias), atol=0, rtol=0)  # arange ids: the original bias
    gap = base.clone()
    gap[:, 6:] += 10  # a gap between segments, as packing leaves
    with torch.no_grad():
        assert not torch.equal(model.encoder.compute_position_bias(first.last_hidden_state, position_ids=gap), bias)
    import copy

    twin = copy.deepcopy(model)  # a copy computes its bias with its own weights
    with torch.no_grad():
        twin.encoder.relative_attention_bias.weight.add_(1.0)
        moved = twin.encoder.compute_position_bias(first.last_hidden_state, position_ids=base)
    torch.testing.assert_close(moved, bias + 1.0)


def test_register_adapter_adds_an_architecture(monkeypatch):
    from transformers import CamembertConfig, CamembertModel

    monkeypatch.setattr(models, "_ADAPTERS", dict(models._ADAPTERS))  # leave the registry as it was
    torch.manual_seed(0)
    model = CamembertModel(CamembertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                           intermediate_size=37, pad_token_id=1, type_vocab_size=1),
                           add_pooling_layer=False).eval()
    model.config._attn_implementation = "eager"
    with pytest.raises(papa_lib.UnsupportedModelError, match="'camembert'.*register_adapter"):
        papa_lib.override(model, None, mode="zeros").__enter__()
    papa_lib.register_adapter(ArchitectureAdapter("camembert", "interface", uses_token_type_ids=False,
                                                  position_offset="padding_idx"))
    assert "camembert" in models.supported_model_types() and "camembert" not in papa_lib.SUPPORTED_MODEL_TYPES
    batch = random_batch(batch=1, lengths=[7])
    constants = papa_lib.average_attention(model, [batch], progress=False)
    original = run(model, batch).last_hidden_state
    with papa_lib.override(model, constants):
        replaced = run(model, batch).last_hidden_state
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(replaced[real], original[real], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="already registered"):
        papa_lib.register_adapter(ArchitectureAdapter("camembert", "interface"))
    with pytest.raises(ValueError, match="unknown route"):
        papa_lib.register_adapter(ArchitectureAdapter("other", "hook"))


def test_an_adapter_pointing_at_missing_modules_says_where():
    model = tiny_model("bert")
    adapter = ArchitectureAdapter("bert", "interface", layers="encoder.blocks")
    with pytest.raises(papa_lib.UnsupportedModelError, match="no 'encoder.blocks'.*missing 'blocks'"):
        adapter.attention_modules(model)
