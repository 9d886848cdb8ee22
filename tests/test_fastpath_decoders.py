"""The decoder fast path (paper Sec. 3.4 on Gemma 3, Llama and GPT-2): no Q/K projections, Q·K or softmax for heads
that do not read the input, one shared [H, L, L] matrix times V, and the reference path's outputs."""

from __future__ import annotations

import pytest
import torch
from test_decoders import DECODERS, gpt2_registered, right_padded  # noqa: F401  (gpt2_registered: a fixture)

import papa_lib
from conftest import tiny_decoder
from papa_lib.core import fastpath
from papa_lib.core.models import self_attention_modules
from papa_lib.core.override import AttentionOverride

DATA_FREE = ("constant", "toeplitz", "previous", "uniform", "identity", "zeros")
BATCHES = {"unpadded": ([10, 10, 10], 10), "right-padded": ([10, 6, 3], 10), "shorter": ([8, 5], 8)}


@pytest.fixture(params=DECODERS)
def arch(request):
    return request.param


def constants_for(model, width=10):
    return papa_lib.average_attention(model, [right_padded([width, 6, 8], width=width, seed=3)], progress=False)


def both_paths(model, constants, batch, **kwargs):
    """Logits with the fast path and with the reference path."""
    outputs = []
    for fast in (True, False):
        with papa_lib.override(model, constants, fast=fast, **kwargs), torch.no_grad():
            outputs.append(model(**batch, use_cache=False).logits)
    return outputs


def left_padded(lengths, width=10, seed=0):
    batch = right_padded(lengths, width, seed)
    flipped = {k: v.flip(-1) for k, v in batch.items()}  # pads first, then the tokens in reverse order
    return flipped


@pytest.mark.parametrize("shape", list(BATCHES))
@pytest.mark.parametrize("mode", DATA_FREE)
def test_every_head_replaced_fast_equals_reference(arch, mode, shape):
    model = tiny_decoder(arch)
    constants = constants_for(model)
    lengths, width = BATCHES[shape]
    batch = right_padded(lengths, width=width, seed=1)
    fast, reference = both_paths(model, constants, batch, mode=mode)
    assert (fast - reference).abs().max() <= 1e-5  # every position, padded ones included
    with torch.no_grad():
        original = model(**batch, use_cache=False).logits
    assert (fast - original).abs().max() > 1e-4  # the override did something


@pytest.mark.parametrize("shape", list(BATCHES))
def test_mixed_plans_fast_equal_reference(arch, shape):
    model = tiny_decoder(arch)
    constants = constants_for(model)
    lengths, width = BATCHES[shape]
    batch = right_padded(lengths, width=width, seed=2)
    layers = model.config.num_hidden_layers
    plans = [
        {(layer, h): "constant" for layer in range(layers) for h in (0, 2)},  # half of each layer's heads constant
        {(layer, h): "constant" for layer in range(layers) for h in (1, 3)},
        {(layer, h): DATA_FREE[(layer + h) % len(DATA_FREE)] for layer in range(layers) for h in range(4)},
        {(0, 0): "previous", (0, 1): "identity", (1, 2): "uniform", (1, 3): "zeros", (layers - 1, 0): "toeplitz"},
        {(0, 0): "constant", (0, 1): "mix", (1, 1): "trainable", (1, 2): "identity"},  # falls back where it must
    ]
    for plan in plans:
        fast, reference = both_paths(model, constants, batch, heads=plan, trainable_init="average")
        real = batch["attention_mask"].bool()
        assert (fast - reference)[real].abs().max() <= 1e-5, plan
        assert torch.isfinite(fast).all()


@pytest.mark.parametrize("mode", ("constant", "previous", "uniform", "identity"))
def test_left_padding_takes_the_masked_way_and_stays_exact(arch, mode):
    model = tiny_decoder(arch)
    constants = constants_for(model)
    batch = left_padded([10, 6, 3])
    for heads in ("all", [(0, 0), (0, 1), (1, 2)]):
        fast, reference = both_paths(model, constants, batch, heads=heads, mode=mode)
        real = batch["attention_mask"].bool()
        assert (fast - reference)[real].abs().max() <= 1e-5


@pytest.mark.parametrize("padding", ("right", "left"))
def test_rows_without_mass_fall_back_to_the_causal_uniform_row(arch, padding):
    model = tiny_decoder(arch)
    matrices = constants_for(model).matrices.clone()
    matrices[:, :, 4, :] = 0.0  # query 4 has no mass anywhere
    matrices[:, 1, 7, :5] = 0.0  # query 7 of head 1: mass only on keys 5-7 (padded keys in a short example)
    batch = right_padded([10, 6, 3]) if padding == "right" else left_padded([10, 6, 3])
    for heads in ("all", [(0, 1), (1, 1), (1, 3)]):
        fast, reference = both_paths(model, matrices, batch, heads=heads, mode="constant")
        real = batch["attention_mask"].bool()
        assert (fast - reference)[real].abs().max() <= 1e-5


def test_the_attention_function_matches_reference_weights_times_values():
    """Direct check on Gemma's grouped-query shapes: output = the reference weights x V, every row (padded ones: 0)."""
    model = tiny_decoder("gemma3_text")
    module = self_attention_modules(model)[0]  # a local layer (window 3)
    state = AttentionOverride(model, constants_for(model), heads={(0, 0): "constant", (0, 1): "previous",
                                                                 (0, 2): "uniform", (0, 3): "toeplitz"})
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(3, 4, 10, 8, generator=generator)
    key, value = torch.randn(3, 1, 10, 8, generator=generator), torch.randn(3, 1, 10, 8, generator=generator)
    real = right_padded([10, 6, 3])["attention_mask"].bool()
    band = fastpath.causal_band(10, 3, "cpu")
    additive = torch.where(band[None] & real[:, None, :], 0.0, torch.finfo(torch.float32).min)[:, None]
    output, weights = fastpath.fast_causal_attention(state, 0, module, query, key, value, additive, None, 0.0, 3)
    assert weights is None
    expected = torch.matmul(state.head_weights(0, None, real, (band[None] & real[:, None, :])[:, None]),
                            value.expand(3, 4, 10, 8)).transpose(1, 2)
    torch.testing.assert_close(output, expected, atol=1e-6, rtol=1e-5)
    assert not output[~real].any()
    # a mask that forbids more than the band and the padded keys (a document mask) leaves it to the reference path
    document = additive.clone()
    document[0, 0, 8, 7] = torch.finfo(torch.float32).min
    assert fastpath.fast_causal_attention(state, 0, module, query, key, value, document, None, 0.0, 3) is None


# ------------------------------------------------------------------------------------------ what is (not) computed
def _watch(model):
    """Forward hooks on every attention module's q_proj/k_proj/v_proj: the strides of what each returned."""
    seen, handles = {}, []
    for layer, module in enumerate(self_attention_modules(model)):
        for name in ("q_proj", "k_proj", "v_proj"):
            def hook(_module, _args, output, key=(layer, name)):
                seen.setdefault(key, []).append((output.stride(), output.detach().clone()))
            handles.append(getattr(module, name).register_forward_hook(hook))
    return seen, handles


@pytest.mark.parametrize("arch_name", ("gemma3_text", "llama"))
def test_query_and_key_are_not_projected_in_fully_replaced_layers(arch_name, monkeypatch):
    from test_fastpath import LinearCalls

    model = tiny_decoder(arch_name)
    constants = constants_for(model)
    layers = self_attention_modules(model)
    plan = {(0, h): mode for h, mode in enumerate(("constant", "previous", "identity", "uniform"))}
    plan |= {(1, 0): "constant", (1, 2): "constant"}  # layer 1 half replaced; the last layer original
    seen, handles = _watch(model)
    calls = LinearCalls(monkeypatch)
    try:
        with papa_lib.override(model, constants, heads=plan), torch.no_grad():
            assert fastpath.projection_is_skipped(layers[0].q_proj) and fastpath.projection_is_skipped(layers[0].k_proj)
            assert fastpath.projection_rows(layers[1].q_proj) == ((8, 16), (24, 32))  # heads 1 and 3 (head_dim 8)
            model(**right_padded([10, 6]), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    assert calls.count(layers[0].q_proj) == 0 and calls.count(layers[0].k_proj) == 0  # no F.linear: not computed
    for name in ("q_proj", "k_proj"):
        (strides, output), = seen[(0, name)]
        assert strides == (0, 0, 0) and not output.any()  # a view of one zero
    assert calls.count(layers[0].v_proj) == 1 and 0 not in seen[(0, "v_proj")][0][0]  # V still computed
    (_, partial), = seen[(1, "q_proj")]  # only the query rows of the original heads 1 and 3 are computed
    assert not partial[..., :8].any() and not partial[..., 16:24].any()
    assert partial[..., 8:16].any() and partial[..., 24:].any()
    if len(layers) > 2:
        assert calls.count(layers[2].q_proj) == 1 and calls.count(layers[2].k_proj) == 1  # an original layer
    if arch_name == "gemma3_text":  # one key/value head serves the two original heads of layer 1: K computed
        assert calls.count(layers[1].k_proj) == 1 and fastpath.projection_rows(layers[1].k_proj) is None
    else:  # Llama: 2 key/value heads, each serving one original query head of layer 1 (heads 1 and 3)
        assert fastpath.projection_rows(layers[1].k_proj) is None
    for module in layers:  # restored exactly
        assert not {"forward"} & (set(module.q_proj.__dict__) | set(module.k_proj.__dict__))
        if arch_name == "gemma3_text":
            assert "forward" not in module.q_norm.__dict__ and "forward" not in module.k_norm.__dict__


def test_partial_key_rows_under_grouped_query_attention():
    model = tiny_decoder("llama")  # 4 query heads, 2 key/value heads: heads 0, 1 read key/value head 0
    constants = constants_for(model)
    layer = self_attention_modules(model)[0]
    plan = {(0, 2): "constant", (0, 3): "uniform"}  # key/value head 1 serves no original head
    with papa_lib.override(model, constants, heads=plan):
        assert fastpath.projection_rows(layer.q_proj) == ((0, 16),)
        assert fastpath.projection_rows(layer.k_proj) == ((0, 8),)
    fast, reference = both_paths(model, constants, right_padded([10, 6, 3]), heads=plan)
    assert (fast - reference).abs().max() <= 1e-5


def test_gemma_norms_are_skipped_with_the_projections():
    model = tiny_decoder("gemma3_text")
    norm = self_attention_modules(model)[0].q_norm
    with papa_lib.override(model, constants_for(model)):
        assert norm(torch.ones(2, 8)).eq(1).all()  # passed through while the projections are skipped
    assert not norm(torch.ones(2, 8)).eq(1).all()


def test_no_softmax_and_no_per_example_weights_when_every_head_is_constant(arch, monkeypatch):
    model = tiny_decoder(arch)
    constants = constants_for(model)
    softmax_calls = []
    original = torch.nn.functional.softmax
    monkeypatch.setattr(torch.nn.functional, "softmax", lambda *a, **k: softmax_calls.append(1) or original(*a, **k))

    def forbidden(*args, **kwargs):
        raise AssertionError("a per-example [B, H, L, L] weight tensor was built")

    with papa_lib.override(model, constants) as papa, torch.no_grad():
        monkeypatch.setattr(papa, "replacement_weights", forbidden)
        monkeypatch.setattr(papa, "head_weights", forbidden)
        model(**right_padded([10, 6]), use_cache=False)
    assert softmax_calls == []
    with papa_lib.override(model, constants, heads=[(0, 0)]), torch.no_grad():
        model(**right_padded([10, 6]), use_cache=False)
    assert len(softmax_calls) == model.config.num_hidden_layers  # one per layer, for the original heads only


def test_output_attentions_and_training_fall_back_to_the_reference_path():
    model = tiny_decoder("gemma3_text")
    constants = constants_for(model)
    batch = right_padded([10, 6])
    with papa_lib.override(model, constants), torch.no_grad():
        out = model(**batch, use_cache=False, output_attentions=True)
    assert len(out.attentions) == 3 and out.attentions[0].shape == (2, 4, 10, 10)
    grads = []
    for fast in (True, False):  # gradients through the fast path (and a partial Q projection) equal the reference
        model.zero_grad()
        with papa_lib.override(model, constants, heads={(0, 0): "constant", (0, 1): "identity", (1, 2): "previous",
                                                        (2, 0): "constant", (2, 1): "constant", (2, 2): "constant",
                                                        (2, 3): "constant"}, fast=fast):
            model(**batch, use_cache=False).logits.pow(2).mean().backward()
        modules = self_attention_modules(model)
        grads.append([m.q_proj.weight.grad for m in modules[:2]] + [m.v_proj.weight.grad for m in modules])
        assert modules[2].q_proj.weight.grad is None  # every head constant: the reference path does not read Q either
    for fast_grad, reference_grad in zip(*grads):
        torch.testing.assert_close(fast_grad, reference_grad, atol=1e-5, rtol=1e-4)


def test_the_packaged_loss_runs_the_fast_path():
    from papa_lib.core.decoders import next_token_nll

    model = tiny_decoder("gemma3_text")
    constants = constants_for(model)
    batch = right_padded([10, 6, 3])
    totals = []
    for fast in (True, False):
        with papa_lib.override(model, constants, fast=fast):
            totals.append(next_token_nll(model, batch, chunk_size=4)[0])
    assert abs(totals[0] - totals[1]) < 1e-4
