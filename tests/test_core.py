"""Core library: averaging (Sec. 3.1), the override seam (Sec. 3.2, 5.2) and the layout (App. A), on every
architecture."""

from __future__ import annotations

import copy

import pytest
import torch

import papa_lib
from conftest import random_batch
from papa_lib.core.models import model_inputs
from papa_lib.core.override import MODES
from papa_lib.smoke import tiny_model


def run(model, batch, **kwargs):
    with torch.no_grad():
        return model(**model_inputs(model, batch), **kwargs)


def real_positions(batch):
    return batch["attention_mask"].bool()


def naive_average(model, batches):
    """Reference for Eq. 2: per-example matrices kept in a list, averaged per entry over examples where both are
    real."""
    per_example, masks = [], []
    for batch in batches:
        attentions = run(model, batch, output_attentions=True).attentions
        for b in range(batch["input_ids"].shape[0]):
            per_example.append(torch.stack([a[b] for a in attentions]).double())
            real = batch["attention_mask"][b].double()
            masks.append(real[:, None] * real[None, :])
    stacked = torch.stack(per_example)  # [N, layers, heads, L, L]
    mask = torch.stack(masks)  # [N, L, L]
    counts = mask.sum(0)
    total = (stacked * mask[:, None, None]).sum(0)
    return torch.where(counts > 0, total / counts.clamp_min(1), torch.zeros_like(total)).float(), counts


# --------------------------------------------------------------------------- (a) nothing overridden
def test_no_override_equals_untouched_model(arch):
    model = tiny_model(arch)
    batch = random_batch()
    reference = run(model, batch).last_hidden_state
    with papa_lib.override(model, None, heads=[]):
        out = run(model, batch).last_hidden_state
    torch.testing.assert_close(out, reference, atol=1e-6, rtol=0)


def test_leaving_the_context_restores_the_model_exactly(arch):
    model = tiny_model(arch)
    batch = random_batch()
    state_before = copy.deepcopy(model.state_dict())
    modules_before = [name for name, _ in model.named_modules()]
    reference = run(model, batch, output_attentions=True)
    constants = papa_lib.average_attention(model, [random_batch(seed=3)], progress=False)
    with papa_lib.override(model, constants, mode="mix") as papa:
        papa.theta.data.normal_()
        changed = run(model, batch).last_hidden_state
    assert not torch.allclose(changed, reference.last_hidden_state)
    after = run(model, batch, output_attentions=True)
    assert torch.equal(after.last_hidden_state, reference.last_hidden_state)
    assert all(torch.equal(a, b) for a, b in zip(after.attentions, reference.attentions))
    assert [name for name, _ in model.named_modules()] == modules_before
    assert all(torch.equal(v, state_before[k]) for k, v in model.state_dict().items())
    assert model.config._attn_implementation == "eager"
    assert not any(hasattr(m, "_papa_state") for m in model.modules())


# --------------------------------------------------------------------------- (b) mixing limits
def test_mix_with_large_theta_is_original_and_small_theta_is_constant(arch):
    model = tiny_model(arch)
    batch = random_batch()
    constants = papa_lib.average_attention(model, [random_batch(seed=5), random_batch(seed=6)], progress=False)
    original = run(model, batch).last_hidden_state
    with papa_lib.override(model, constants, mode="constant"):
        constant = run(model, batch).last_hidden_state
    with papa_lib.override(model, constants, mode="mix") as papa:
        assert torch.allclose(papa.lambdas(), torch.full_like(papa.lambdas(), 0.5))  # θ initialised at 0
        papa.theta.data.fill_(30.0)
        high = run(model, batch).last_hidden_state
        papa.theta.data.fill_(-30.0)
        low = run(model, batch).last_hidden_state
    real = real_positions(batch)
    torch.testing.assert_close(high[real], original[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(low[real], constant[real], atol=1e-5, rtol=0)
    assert not torch.allclose(constant[real], original[real], atol=1e-3)


def test_mix_theta_receives_gradients(arch):
    model = tiny_model(arch)
    batch = random_batch()
    constants = papa_lib.average_attention(model, [random_batch(seed=5)], progress=False)
    with papa_lib.override(model, constants, mode="mix") as papa:
        out = model(**model_inputs(model, batch)).last_hidden_state
        out.pow(2).sum().backward()
    assert papa.theta.grad is not None and papa.theta.grad.abs().sum() > 0
    assert papa.trainable_parameters() == [papa.theta]


# --------------------------------------------------------------------------- (c) one-example average
def test_average_of_one_example_reproduces_that_example(arch):
    model = tiny_model(arch)
    batch = random_batch(batch=1, lengths=[7])
    constants = papa_lib.average_attention(model, [batch], progress=False)
    original = run(model, batch).last_hidden_state
    with papa_lib.override(model, constants):
        replaced = run(model, batch).last_hidden_state
    real = real_positions(batch)
    torch.testing.assert_close(replaced[real], original[real], atol=1e-5, rtol=0)


# --------------------------------------------------------------------------- (d) streaming average = naive reference
def test_average_attention_matches_naive_reference(arch):
    model = tiny_model(arch)
    batches = [random_batch(batch=3, seed=s, lengths=[12 - s, 5, 9 - s]) for s in range(3)]
    batches.append(random_batch(batch=1, seed=9, lengths=[3]))
    constants = papa_lib.average_attention(model, batches, progress=False, source="random ids")
    expected, counts = naive_average(model, batches)
    torch.testing.assert_close(constants.matrices, expected, atol=1e-6, rtol=1e-5)
    assert torch.equal(constants.counts, counts.long())
    assert constants.matrices.dtype == torch.float32
    assert constants.metadata["num_examples"] == 10
    assert constants.metadata["source"] == "random ids"
    # entries never covered by a real (query, key) pair stay exactly 0
    assert torch.all(constants.matrices[..., counts == 0] == 0)


def test_average_attention_streams_batches_lazily():
    model = tiny_model("bert")
    consumed = []

    def generator():
        for seed in range(4):
            consumed.append(seed)
            yield random_batch(seed=seed)

    constants = papa_lib.average_attention(model, generator(), progress=False)
    assert consumed == [0, 1, 2, 3]
    assert constants.metadata["num_examples"] == 12


# --------------------------------------------------------------------------- (e) padding invariance
@pytest.mark.parametrize("mode", MODES)
def test_padded_token_ids_do_not_change_real_positions(arch, mode):
    model = tiny_model(arch)
    batch = random_batch(batch=2, lengths=[6, 9])
    constants = papa_lib.average_attention(model, [random_batch(seed=2)], progress=False)
    other = dict(batch)
    noise = torch.randint(5, 120, batch["input_ids"].shape, generator=torch.Generator().manual_seed(1))
    other["input_ids"] = torch.where(batch["attention_mask"].bool(), batch["input_ids"], noise)
    assert not torch.equal(other["input_ids"], batch["input_ids"])
    heads = {(0, 0): mode, (1, 2): mode, (1, 3): "constant"}
    # model_inputs gives RoBERTa-style models (RoBERTa, XLM-R, MPNet) their App. A position ids: left to itself,
    # transformers numbers positions by counting non-pad ids, so a pad id swapped for a word id would shift the final
    # separator's position embedding.
    with papa_lib.override(model, constants, heads=heads, trainable_init="average") as papa:
        papa.theta.data.normal_(generator=torch.Generator().manual_seed(0))
        first = run(model, batch).last_hidden_state
        second = run(model, other).last_hidden_state
    real = real_positions(batch)
    torch.testing.assert_close(first[real], second[real], atol=1e-5, rtol=0)


# --------------------------------------------------------------------------- (f) row sums and zeros
def test_replacement_rows_sum_to_one_over_real_keys(arch):
    model = tiny_model(arch)
    batch = random_batch(batch=2, lengths=[6, 11])
    constants = papa_lib.average_attention(model, [random_batch(seed=4)], progress=False)
    real = real_positions(batch)
    for mode in ("constant", "toeplitz", "identity", "trainable"):
        with papa_lib.override(model, constants, mode=mode):
            attentions = run(model, batch, output_attentions=True).attentions
        for weights in attentions:
            rows = weights.sum(-1)  # [B, H, L]
            torch.testing.assert_close(
                rows[real[:, None, :].expand_as(rows)], torch.ones_like(rows[real[:, None, :].expand_as(rows)])
            )
            # no mass on padded keys
            assert torch.all(weights.masked_select(~real[:, None, None, :].expand_as(weights)) == 0)


def test_toeplitz_and_identity_values():
    model = tiny_model("bert")
    batch = random_batch(batch=1, length=6, lengths=[6])
    with papa_lib.override(model, None, mode="toeplitz"):
        toeplitz = run(model, batch, output_attentions=True).attentions[0][0, 0]
    expected = papa_lib.toeplitz_matrix(6)
    torch.testing.assert_close(toeplitz, expected / expected.sum(-1, keepdim=True))
    assert expected[0, 3] == pytest.approx(1 / 4)
    with papa_lib.override(model, None, mode="identity"):
        identity = run(model, batch, output_attentions=True).attentions[1][0, 2]
    assert torch.equal(identity, torch.eye(6))


def test_zeros_head_contributes_exactly_nothing(arch):
    model = tiny_model(arch)
    batch = random_batch()
    captured = {}
    module = papa_lib.core.models.self_attention_modules(model)[1]
    # the heads' context is the module's output, or the input of its output projection where the module has one
    projection = {"mpnet": "o", "distilbert": "out_lin", "albert": "dense", "modernbert": "Wo"}.get(arch)
    if projection is None:
        handle = module.register_forward_hook(lambda m, a, out: captured.__setitem__("context", out[0]))
    else:  # ALBERT's module serves both layers: the last call is layer 1
        handle = getattr(module, projection).register_forward_pre_hook(
            lambda m, a: captured.__setitem__("context", a[0]))
    with papa_lib.override(model, None, heads=[(1, 2)], mode="zeros"):
        run(model, batch)
    handle.remove()
    head_size = model.config.hidden_size // model.config.num_attention_heads
    context = captured["context"].reshape(*captured["context"].shape[:2], -1, head_size)
    assert torch.all(context[:, :, 2] == 0)
    assert context[:, :, 1].abs().sum() > 0


def test_trainable_matrices_stay_nonnegative_and_learn(arch):
    model = tiny_model(arch)
    batch = random_batch()
    constants = papa_lib.average_attention(model, [random_batch(seed=4)], progress=False)
    with papa_lib.override(model, constants, heads=[(0, 1)], mode="trainable", trainable_init="toeplitz") as papa:
        params = papa.trainable_parameters()
        assert len(params) == 1 and params[0].shape == (4, 12, 12)
        torch.testing.assert_close(params[0][1], papa_lib.toeplitz_matrix(12))
        optimiser = torch.optim.SGD(params, lr=10.0)
        model(**model_inputs(model, batch)).last_hidden_state.pow(2).mean().backward()
        optimiser.step()
        params[0].data[1, 0, :] = -1.0  # negative entries are clamped at 0 when used
        weights = run(model, batch, output_attentions=True).attentions[0][:, 1]
    assert torch.all(weights >= 0)
    assert params[0].grad[1].abs().sum() > 0


# --------------------------------------------------------------------------- batch sizes, devices, save/load
@pytest.mark.parametrize("arch_name", ["bert", "deberta-v2"])
def test_batch_size_does_not_matter(arch_name):
    model = tiny_model(arch_name)
    batch = random_batch(batch=3)
    constants = papa_lib.average_attention(model, [random_batch(seed=8)], progress=False)
    with papa_lib.override(model, constants, heads=[(0, 0), (1, 1)]):
        together = run(model, batch).last_hidden_state
        alone = torch.cat([run(model, {k: v[i : i + 1] for k, v in batch.items()}).last_hidden_state for i in range(3)])
    real = real_positions(batch)
    torch.testing.assert_close(together[real], alone[real], atol=1e-5, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_override_on_cuda():  # pragma: no cover - runs on GPU machines only
    model = tiny_model("bert").cuda()
    batch = random_batch()
    constants = papa_lib.average_attention(model, [batch], progress=False)
    with papa_lib.override(model, constants, mode="mix"):
        out = run(model, batch).last_hidden_state
    assert out.is_cuda


def test_save_and_load_roundtrip(tmp_path):
    model = tiny_model("roberta")
    constants = papa_lib.average_attention(model, [random_batch()], progress=False, source="test")
    path = constants.save(tmp_path / "c.safetensors")
    loaded = papa_lib.ConstantAttention.load(path)
    assert torch.equal(loaded.matrices, constants.matrices)
    assert torch.equal(loaded.counts, constants.counts)
    assert loaded.metadata["max_length"] == 12 and loaded.metadata["source"] == "test"
    from safetensors.torch import load_file

    assert set(load_file(str(path))) == {"matrices", "counts"}


# --------------------------------------------------------------------------- (h) clear errors
def test_unsupported_model_names_supported_types(tmp_path):
    from transformers import GPT2Config, GPT2Model

    gpt = GPT2Model(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=50))
    with pytest.raises(papa_lib.UnsupportedModelError, match="bert, roberta, electra, deberta, deberta-v2") as error:
        papa_lib.override(gpt, None, mode="zeros").__enter__()
    for model_type in papa_lib.SUPPORTED_MODEL_TYPES:  # every supported type is named
        assert f"{model_type}," in str(error.value) or f"{model_type} (" in str(error.value)
    gpt.save_pretrained(tmp_path / "gpt")
    with pytest.raises(papa_lib.UnsupportedModelError, match="'gpt2'"):
        papa_lib.load_encoder(tmp_path / "gpt")


def test_wrong_sequence_length_raises():
    model = tiny_model("bert")
    constants = papa_lib.average_attention(model, [random_batch(length=12)], progress=False)
    with pytest.raises(ValueError, match="L=12 but the input has L=10"):
        with papa_lib.override(model, constants):
            run(model, random_batch(length=10))


def test_empty_corpus_raises():
    with pytest.raises(ValueError, match="empty corpus"):
        papa_lib.average_attention(tiny_model("bert"), [], progress=False)


def test_mismatched_saved_matrices_raise(tmp_path):
    small = tiny_model("bert")
    bigger = tiny_model("bert", num_hidden_layers=3)
    path = papa_lib.average_attention(small, [random_batch()], progress=False).save(tmp_path / "c.safetensors")
    loaded = papa_lib.ConstantAttention.load(path)
    with pytest.raises(ValueError, match="2 layers x 4 heads .* but the model has 3 layers x 4 heads"):
        papa_lib.override(bigger, loaded).__enter__()
    with pytest.raises(FileNotFoundError):
        papa_lib.ConstantAttention.load(tmp_path / "missing.safetensors")
    from safetensors.torch import save_file

    save_file({"other": torch.zeros(2)}, str(tmp_path / "bad.safetensors"))
    with pytest.raises(ValueError, match="missing tensors"):
        papa_lib.ConstantAttention.load(tmp_path / "bad.safetensors")


def test_bad_override_arguments():
    model = tiny_model("bert")
    with pytest.raises(ValueError, match="need constant matrices"):
        papa_lib.override(model, None, mode="constant").__enter__()
    with pytest.raises(ValueError, match="outside the model"):
        papa_lib.override(model, None, heads=[(5, 0)], mode="zeros").__enter__()
    with pytest.raises(ValueError, match="unknown mode"):
        papa_lib.override(model, None, mode="nonsense").__enter__()
    constants = papa_lib.average_attention(model, [random_batch()], progress=False)
    with papa_lib.override(model, constants):
        with pytest.raises(RuntimeError, match="do not nest"):
            papa_lib.override(model, constants).__enter__()


# --------------------------------------------------------------------------- the real embedded model
def test_embedded_minilm_loads_offline_with_eager_attention(minilm):
    model, tokenizer = minilm
    assert model.config.model_type == "bert"
    assert (model.config.num_hidden_layers, model.config.num_attention_heads) == (6, 12)
    assert not model.training
    assert model.config._attn_implementation == "eager"
    batch = papa_lib.encode(tokenizer, ["The movie was wonderful.", "Terrible."], max_length=32)
    out = run(model, batch, output_attentions=True)
    assert len(out.attentions) == 6 and out.attentions[0].shape == (2, 12, 32, 32)


def test_embedded_minilm_one_example_average_and_mix(minilm):
    model, tokenizer = minilm
    batch = papa_lib.encode(tokenizer, ["A quiet, moving film about two brothers."], max_length=32)
    constants = papa_lib.average_attention(model, [batch], progress=False)
    original = run(model, batch).last_hidden_state
    with papa_lib.override(model, constants):
        replaced = run(model, batch).last_hidden_state
    real = real_positions(batch)
    torch.testing.assert_close(replaced[real], original[real], atol=1e-5, rtol=0)
