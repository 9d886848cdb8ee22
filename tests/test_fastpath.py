"""The fast path (paper Sec. 3.4) gives the reference path's outputs while skipping Q, K, softmax and weight
matrices."""

from __future__ import annotations

import copy

import pytest
import torch

import papa_lib
from conftest import random_batch
from papa_lib.core import fastpath
from papa_lib.core.models import model_inputs, self_attention_modules
from papa_lib.smoke import tiny_model

INTERFACE_ARCHITECTURES = ("bert", "roberta", "electra", "xlm-roberta", "distilbert", "albert", "modernbert")
REPLACING_MODES = ("constant", "identity", "zeros", "toeplitz")


def run(model, batch, **kwargs):
    with torch.no_grad():
        return model(**model_inputs(model, batch), **kwargs)


def both_paths(model, constants, batch, **override_kwargs):
    """Last hidden state with the fast path and with the reference path."""
    outputs = []
    for fast in (True, False):
        with papa_lib.override(model, constants, fast=fast, **override_kwargs):
            outputs.append(run(model, batch).last_hidden_state)
    return outputs


def constants_for(model, length=12):
    return papa_lib.average_attention(
        model, [random_batch(length=length, seed=7), random_batch(length=length, seed=8)], progress=False
    )


@pytest.fixture(params=INTERFACE_ARCHITECTURES)
def interface_arch(request):
    return request.param


@pytest.mark.parametrize("mode", REPLACING_MODES)
def test_all_heads_fast_equals_reference(interface_arch, mode):
    model = tiny_model(interface_arch)
    batch = random_batch(batch=3, lengths=[12, 7, 3])
    constants = constants_for(model)
    fast, reference = both_paths(model, constants, batch, mode=mode)
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(fast[real], reference[real], atol=1e-5, rtol=0)
    original = run(model, batch).last_hidden_state
    assert not torch.allclose(fast[real], original[real], atol=1e-3)  # the override did something


def test_partial_and_mixed_plans_fast_equals_reference(interface_arch):
    model = tiny_model(interface_arch, num_hidden_layers=3)
    batch = random_batch(batch=3, lengths=[12, 9, 5])
    constants = constants_for(model)
    plans = [
        {(0, 0): "constant", (1, 3): "identity", (2, 1): "zeros"},  # one replaced head per layer, rest original
        {(0, h): m for h, m in enumerate(REPLACING_MODES)} | {(1, 0): "toeplitz", (1, 2): "constant"},
        # all replaced, modes mixed
        {(layer, h): REPLACING_MODES[(layer + h) % 4] for layer in range(3) for h in range(4)},
        {(0, 0): "constant", (0, 1): "mix", (1, 1): "trainable", (2, 2): "identity"},  # falls back where it must
    ]
    real = batch["attention_mask"].bool()
    for plan in plans:
        fast, reference = both_paths(model, constants, batch, heads=plan)
        torch.testing.assert_close(fast[real], reference[real], atol=1e-5, rtol=0, msg=f"plan {plan}")


def test_padding_does_not_leak_through_the_fast_path(interface_arch):
    model = tiny_model(interface_arch)
    batch = random_batch(batch=2, lengths=[5, 10])
    other = dict(batch)
    noise = torch.randint(5, 120, batch["input_ids"].shape, generator=torch.Generator().manual_seed(3))
    other["input_ids"] = torch.where(batch["attention_mask"].bool(), batch["input_ids"], noise)
    constants = constants_for(model)  # run: model_inputs, App. A position ids (RoBERTa's not from counting non-pads)
    with papa_lib.override(model, constants, heads={(0, 0): "constant", (0, 1): "identity", (1, 2): "toeplitz"}):
        first = run(model, batch).last_hidden_state
        second = run(model, other).last_hidden_state
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(first[real], second[real], atol=1e-5, rtol=0)


def test_fast_attention_matches_reference_weights_at_every_position():
    """Direct check of the attention function: output of the fast path = reference weights x V, padded rows too."""
    torch.manual_seed(0)
    model = tiny_model("bert")
    constants = constants_for(model)
    matrices = constants.matrices.clone()
    matrices[0, 1, 3, :] = 0.0  # a row with no mass: uniform fallback over the real keys
    batch_size, heads, length, head_size = 3, 4, 12, 8
    value = torch.randn(batch_size, heads, length, head_size)
    query, key = torch.randn_like(value), torch.randn_like(value)
    mask = random_batch(batch=3, lengths=[12, 6, 2])["attention_mask"].bool()
    additive = torch.where(mask, 0.0, torch.finfo(torch.float32).min)[:, None, None, :]
    module = self_attention_modules(model)[0]
    plan = {(0, 0): "constant", (0, 1): "constant", (0, 2): "identity", (0, 3): "toeplitz"}
    state = papa_lib.AttentionOverride(model, matrices, heads=plan)
    output, weights = fastpath.fast_attention(state, 0, module, query, key, value, additive, None, 0.0)
    assert weights is None
    reference_weights = state.head_weights(0, None, mask)
    expected = torch.matmul(reference_weights, value).transpose(1, 2)
    torch.testing.assert_close(output, expected, atol=1e-6, rtol=1e-5)
    # the empty row really fell back to the mean of the real values
    torch.testing.assert_close(output[0, 3, 1], value[0, 1].mean(0), atol=1e-6, rtol=1e-5)


def test_embedded_minilm_fast_equals_reference(minilm):
    model, tokenizer = minilm
    texts = ["A quiet, moving film about two brothers.", "Dull.", "The plot is thin but the acting carries it."]
    batch = papa_lib.encode(tokenizer, texts, max_length=24)
    constants = papa_lib.average_attention(model, [batch], progress=False)
    real = batch["attention_mask"].bool()
    some_heads = {(layer, h): "constant" for layer in (0, 3, 5) for h in range(0, 12, 2)}
    for kwargs in ({"mode": "constant"}, {"heads": some_heads}):
        fast, reference = both_paths(model, constants, batch, **kwargs)
        torch.testing.assert_close(fast[real], reference[real], atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------ what is (not) computed
class LinearCalls:
    """Counts F.linear calls per weight tensor (nn.Linear.forward goes through F.linear)."""

    def __init__(self, monkeypatch):
        self.calls: dict[int, int] = {}
        original = torch.nn.functional.linear

        def counting(input, weight, bias=None):
            self.calls[id(weight)] = self.calls.get(id(weight), 0) + 1
            return original(input, weight, bias)

        monkeypatch.setattr(torch.nn.functional, "linear", counting)

    def count(self, linear):
        return self.calls.get(id(linear.weight), 0)


def test_query_and_key_are_not_projected_in_all_replaced_layers(interface_arch, monkeypatch):
    from papa_lib.core.models import adapter_for

    model = tiny_model(interface_arch)
    adapter = adapter_for(model)
    if adapter.projections is None or adapter.shared_layers:
        pytest.skip(f"{interface_arch}: fused QKV projection (ModernBERT) or one module for every layer (ALBERT)")
    q, k = adapter.projections
    v = {"query": "value", "q_lin": "v_lin"}[q]
    constants = constants_for(model)
    calls = LinearCalls(monkeypatch)
    layer0, layer1 = self_attention_modules(model)
    plan = {(0, h): REPLACING_MODES[h] for h in range(4)} | {(1, 0): "constant"}  # layer 0 all replaced, layer 1 not
    with papa_lib.override(model, constants, heads=plan):
        assert fastpath.projection_is_skipped(getattr(layer0, q)) and fastpath.projection_is_skipped(getattr(layer0, k))
        assert not fastpath.projection_is_skipped(getattr(layer1, q))
        run(model, random_batch())
    assert calls.count(getattr(layer0, q)) == 0 and calls.count(getattr(layer0, k)) == 0
    assert calls.count(getattr(layer0, v)) == 1
    assert calls.count(getattr(layer1, q)) == 1 and calls.count(getattr(layer1, k)) == 1
    with papa_lib.override(model, constants, mode="constant", fast=False):
        run(model, random_batch())
    assert calls.count(getattr(layer0, q)) == 1  # the reference path still projects


def test_no_softmax_in_all_constant_model(monkeypatch):
    model = tiny_model("bert")
    constants = constants_for(model)
    softmax_calls = []
    original = torch.nn.functional.softmax
    monkeypatch.setattr(torch.nn.functional, "softmax", lambda *a, **k: softmax_calls.append(1) or original(*a, **k))
    with papa_lib.override(model, constants, mode="constant"):
        run(model, random_batch())
    assert softmax_calls == []
    with papa_lib.override(model, constants, heads=[(0, 0)]):
        run(model, random_batch())
    assert len(softmax_calls) == 2  # one per layer, for the original heads only


def test_output_attentions_and_training_fall_back_to_reference():
    model = tiny_model("bert")
    constants = constants_for(model)
    batch = random_batch()
    with papa_lib.override(model, constants, mode="constant"):
        fast = run(model, batch, output_attentions=True)
    assert len(fast.attentions) == 2 and fast.attentions[0].shape == (3, 4, 12, 12)
    rows = fast.attentions[1].sum(-1)[batch["attention_mask"].bool()[:, None, :].expand(3, 4, 12)]
    torch.testing.assert_close(rows, torch.ones_like(rows))
    model.train()  # attention dropout active: the reference path (with dropout) must run, and Q/K stay unused
    torch.manual_seed(0)
    with papa_lib.override(model, constants, mode="constant"):
        train_fast = model(**model_inputs(model, batch)).last_hidden_state
    torch.manual_seed(0)
    with papa_lib.override(model, constants, mode="constant", fast=False):
        train_reference = model(**model_inputs(model, batch)).last_hidden_state
    torch.testing.assert_close(train_fast, train_reference, atol=1e-6, rtol=0)


def test_gradients_flow_through_the_fast_path():
    model = tiny_model("bert", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    constants = constants_for(model)
    batch = random_batch()
    grads = []
    for fast in (True, False):
        model.zero_grad()
        with papa_lib.override(
            model, constants, heads={(0, 0): "constant", (0, 1): "identity", (1, 2): "toeplitz"}, fast=fast
        ):
            model(**model_inputs(model, batch)).last_hidden_state.pow(2).sum().backward()
        grads.append(self_attention_modules(model)[0].value.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-4)


def test_restoration_after_exit_is_exact(interface_arch):
    model = tiny_model(interface_arch)
    batch = random_batch()
    constants = constants_for(model)
    state_before = copy.deepcopy(model.state_dict())
    reference = run(model, batch, output_attentions=True)
    dicts_before = [dict(m.__dict__) for m in model.modules()]
    with papa_lib.override(model, constants, mode="constant"):
        run(model, batch)
    after = run(model, batch, output_attentions=True)
    assert torch.equal(after.last_hidden_state, reference.last_hidden_state)
    assert all(torch.equal(a, b) for a, b in zip(after.attentions, reference.attentions))
    assert all(torch.equal(v, state_before[k]) for k, v in model.state_dict().items())
    for module, before in zip(model.modules(), dicts_before):
        assert set(module.__dict__) == set(before), type(module).__name__
    assert not any(fastpath.projection_is_skipped(m) for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert model.config._attn_implementation == "eager"


def test_restoration_after_an_error_inside_the_context():
    model = tiny_model("bert")
    constants = constants_for(model)
    with pytest.raises(ValueError, match="L=12 but the input has L=10"):
        with papa_lib.override(model, constants, mode="constant"):
            run(model, random_batch(length=10))
    assert not any(fastpath.projection_is_skipped(m) for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert "forward" not in self_attention_modules(model)[0].query.__dict__


def test_deberta_uses_the_reference_path_and_stays_correct():
    model = tiny_model("deberta-v2")
    constants = constants_for(model)
    batch = random_batch()
    fast, reference = both_paths(model, constants, batch, mode="constant")
    torch.testing.assert_close(fast, reference, atol=0, rtol=0)


def test_layer_plan_groups_heads():
    plan = fastpath.layer_plan(["original", "constant", "identity", "zeros", "toeplitz"])
    assert plan == fastpath.LayerPlan(original=(0,), matrix=(1, 4), identity=(2,), zeros=(3,))
    assert fastpath.layer_plan(["original", "original"]) is None
    assert fastpath.layer_plan(["constant", "mix"]) is None
    assert fastpath.layer_plan(["trainable", "zeros"]) is None


def test_skip_query_key_projections_rejects_non_linear():
    module = torch.nn.Module()
    module.query = torch.nn.Identity()
    module.key = torch.nn.Linear(2, 2)
    with pytest.raises(TypeError, match="query is Identity, not nn.Linear"):
        fastpath.skip_query_key_projections(module)


@pytest.mark.parametrize("heads", ["all", [(0, 1), (1, 0), (1, 3)]])
def test_strictly_positive_matrices_take_the_fused_path(heads):
    """Matrices with no zero entry skip the empty-row fallback (and, for whole layers, write the output in one pass)."""
    model = tiny_model("bert")
    matrices = torch.rand(2, 4, 12, 12, generator=torch.Generator().manual_seed(0)) + 0.01
    batch = random_batch(batch=3, lengths=[12, 8, 4])
    fast, reference = both_paths(model, matrices, batch, heads=heads, mode="constant")
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(fast[real], reference[real], atol=1e-5, rtol=0)
    # with gradients enabled the unfused branch runs; same numbers
    with papa_lib.override(model, matrices, heads=heads, mode="constant"):
        with_grad = model(**model_inputs(model, batch)).last_hidden_state
    torch.testing.assert_close(with_grad.detach()[real], reference[real], atol=1e-5, rtol=0)
