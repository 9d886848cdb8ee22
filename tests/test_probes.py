"""Tests for papa_lib.experiments.probes: probing classifiers of paper Sec. 3.3 and their AdamW training loop."""

from __future__ import annotations

import pytest
import torch

from papa_lib.experiments.loop import IGNORE_INDEX, set_seed
from papa_lib.experiments.probes import SentenceProbe, TokenProbe, make_probe, predict, train_probe

NUM_LAYERS, MAX_LEN, HIDDEN = 3, 8, 8


def _sentence_data(n: int, generator: torch.Generator):
    """Class = sign of the mean of layer 1 / dim 0 over REAL tokens; padding carries misleading large values."""
    labels = torch.randint(0, 2, (n,), generator=generator)
    lengths = torch.randint(2, MAX_LEN + 1, (n,), generator=generator)
    mask = (torch.arange(MAX_LEN)[None, :] < lengths[:, None]).long()
    features = torch.randn(n, NUM_LAYERS, MAX_LEN, HIDDEN, generator=generator)
    sign = (2 * labels - 1).float()
    features[:, 1, :, 0] += 1.5 * sign[:, None]
    # Padded positions point to the wrong class, strongly: a probe that looked at them would fail.
    pad = mask == 0
    features[:, 1, :, 0] = torch.where(pad, -10.0 * sign[:, None], features[:, 1, :, 0])
    return features, mask, labels


def _sentence_batches(features, mask, labels, batch_size, shuffle_seed=None):
    order = torch.arange(len(labels))
    if shuffle_seed is not None:
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(shuffle_seed))
    return [
        ((features[idx], mask[idx]), labels[idx])
        for idx in (order[i : i + batch_size] for i in range(0, len(labels), batch_size))
    ]


def _token_data(n: int, length: int, centers: torch.Tensor, generator: torch.Generator):
    """Per-token class = which well-separated cluster the token's layer-2 vector comes from; some targets ignored."""
    labels = torch.randint(0, centers.shape[0], (n, length), generator=generator)
    features = torch.randn(n, length, NUM_LAYERS, HIDDEN, generator=generator)
    features[:, :, 2, :] = 0.5 * features[:, :, 2, :] + centers[labels]
    targets = labels.clone()
    ignored = torch.rand(n, length, generator=generator) < 0.2
    targets[ignored] = IGNORE_INDEX
    return features, targets


def test_initial_pooling_is_mean_over_real_tokens():
    probe = SentenceProbe(NUM_LAYERS, MAX_LEN, HIDDEN, 2)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    weights = probe.pooling_weights(mask)
    assert weights.shape == (2, NUM_LAYERS, 5)
    expected = mask.float() / mask.sum(dim=1, keepdim=True)
    torch.testing.assert_close(weights, expected[:, None, :].expand(2, NUM_LAYERS, 5))
    # One position weight per layer per position, not shared across layers.
    assert probe.position_logits.shape == (NUM_LAYERS, MAX_LEN)


def test_sentence_probe_ignores_padding_content():
    torch.manual_seed(0)
    probe = SentenceProbe(NUM_LAYERS, MAX_LEN, HIDDEN, 3).eval()
    with torch.no_grad():
        probe.position_logits.normal_()  # non-trivial learned weights
    features = torch.randn(4, NUM_LAYERS, 6, HIDDEN)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0]])
    base = probe(features, mask)
    changed = features.clone()
    pad = (mask == 0)[:, None, :, None].expand_as(features)
    changed[pad] = 1e4 * torch.randn(int(pad.sum()))
    assert torch.equal(probe(changed, mask), base)
    changed[pad] = float("nan")
    assert torch.equal(probe(changed, mask), base)
    # Changing a REAL position does change the output (the test above could otherwise pass trivially).
    changed[1, :, 0, :] += 1.0
    assert not torch.allclose(probe(changed, mask)[1], base[1])


def test_sentence_probe_accepts_float16_and_shorter_inputs():
    probe = SentenceProbe(NUM_LAYERS, MAX_LEN, HIDDEN, 2).eval()
    features = torch.randn(2, NUM_LAYERS, 5, HIDDEN)
    mask = torch.ones(2, 5, dtype=torch.long)
    out16 = probe(features.half(), mask)
    assert out16.dtype == torch.float32 and out16.shape == (2, 2)
    torch.testing.assert_close(out16, probe(features.half().float(), mask))


def test_sentence_probe_learns_separable_task():
    set_seed(0)
    gen = torch.Generator().manual_seed(1)
    train = _sentence_data(512, gen)
    test = _sentence_data(256, gen)
    probe = make_probe("sentence", NUM_LAYERS, MAX_LEN, HIDDEN, 2)
    losses = train_probe(
        probe,
        probe.parameters(),
        lambda epoch: _sentence_batches(*train, batch_size=32, shuffle_seed=epoch),
        epochs=15,
        lr=1e-2,
    )
    assert len(losses) == 15
    assert losses[-1] < losses[0]
    assert not probe.training  # left in eval mode
    preds = predict(probe, _sentence_batches(*test, batch_size=64))
    assert preds.shape == (256,) and preds.dtype == torch.long
    accuracy = (preds == test[2]).float().mean().item()
    assert accuracy > 0.95, accuracy


def test_token_probe_learns_separable_task_and_ignores_minus_100():
    set_seed(0)
    gen = torch.Generator().manual_seed(2)
    centers = 3.0 * torch.randn(3, HIDDEN, generator=gen)
    train_x, train_y = _token_data(128, 10, centers, gen)
    test_x, test_y = _token_data(64, 7, centers, gen)
    probe = make_probe("token", NUM_LAYERS, None, HIDDEN, 3)
    assert isinstance(probe, TokenProbe)

    def batches(epoch):
        return [((train_x[i : i + 16],), train_y[i : i + 16]) for i in range(0, 128, 16)]

    losses = train_probe(probe, probe.parameters(), batches, epochs=10, lr=1e-2)
    assert all(loss == loss for loss in losses)  # -100 targets never turn the loss into NaN
    assert losses[-1] < losses[0]
    test_batches = [((test_x[i : i + 16],), test_y[i : i + 16]) for i in range(0, 64, 16)]
    preds = predict(probe, test_batches)
    flat_targets = torch.cat([y.reshape(-1) for _, y in test_batches])
    assert preds.shape == flat_targets.shape
    keep = flat_targets != IGNORE_INDEX
    accuracy = (preds[keep] == flat_targets[keep]).float().mean().item()
    assert accuracy > 0.95, accuracy
    # predict also accepts bare inputs (a single tensor per batch).
    assert torch.equal(predict(probe, [test_x[:16]]), preds[: 16 * 7])


def test_token_probe_shapes():
    probe = TokenProbe(NUM_LAYERS, HIDDEN, 5, mlp_hidden=11, activation="gelu")
    assert probe.mlp[0].out_features == 11
    assert probe(torch.randn(2, 4, NUM_LAYERS, HIDDEN)).shape == (2, 4, 5)
    assert probe(torch.randn(NUM_LAYERS, HIDDEN)).shape == (5,)
    with pytest.raises(ValueError, match="num_layers"):
        probe(torch.randn(2, 4, NUM_LAYERS + 1, HIDDEN))


def _train_once(seed: int):
    set_seed(seed)
    gen = torch.Generator().manual_seed(3)
    data = _sentence_data(96, gen)
    probe = make_probe("sentence", NUM_LAYERS, MAX_LEN, HIDDEN, 2, dropout=0.3)
    losses = train_probe(
        probe, probe.parameters(), lambda e: _sentence_batches(*data, batch_size=16, shuffle_seed=e), epochs=3, lr=1e-3
    )
    return losses, [p.detach().clone() for p in probe.parameters()]


def test_seeded_training_is_bit_identical():
    losses_a, params_a = _train_once(0)
    losses_b, params_b = _train_once(0)
    assert losses_a == losses_b  # exact float equality
    assert all(torch.equal(a, b) for a, b in zip(params_a, params_b))
    losses_c, _ = _train_once(1)
    assert losses_c != losses_a


def test_only_given_params_are_optimised_including_extra_ones():
    set_seed(0)
    probe = SentenceProbe(NUM_LAYERS, MAX_LEN, HIDDEN, 2, dropout=0.0)
    extra = torch.nn.Parameter(torch.zeros(()))  # e.g. a PAPA mixing weight owned by the caller

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.probe = probe

        def forward(self, features, mask):
            return self.probe(features * (1 + extra), mask)

    before = probe.position_logits.detach().clone()
    data = _sentence_data(32, torch.Generator().manual_seed(4))
    params = list(probe.mlp.parameters()) + [extra]
    train_probe(Wrapped(), params, lambda e: _sentence_batches(*data, batch_size=16), epochs=2, lr=1e-2)
    assert torch.equal(probe.position_logits, before)
    assert extra.item() != 0.0


def test_custom_loss_fn_is_used():
    calls = []

    def loss_fn(logits, targets):
        calls.append(logits.shape)
        return torch.nn.functional.cross_entropy(logits, targets)

    probe = SentenceProbe(NUM_LAYERS, MAX_LEN, HIDDEN, 2)
    data = _sentence_data(32, torch.Generator().manual_seed(5))
    train_probe(probe, probe.parameters(), lambda e: _sentence_batches(*data, batch_size=16), 1, 1e-3, loss_fn=loss_fn)
    assert calls == [torch.Size([16, 2]), torch.Size([16, 2])]


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="kind"):
        make_probe("span", NUM_LAYERS, MAX_LEN, HIDDEN, 2)
    with pytest.raises(ValueError, match="activation"):
        SentenceProbe(NUM_LAYERS, MAX_LEN, HIDDEN, 2, activation="swish")
    with pytest.raises(ValueError, match="num_labels"):
        TokenProbe(NUM_LAYERS, HIDDEN, 0)
    probe = SentenceProbe(NUM_LAYERS, MAX_LEN, HIDDEN, 2)
    with pytest.raises(ValueError, match="max_length"):
        probe(torch.randn(1, NUM_LAYERS, MAX_LEN + 1, HIDDEN), torch.ones(1, MAX_LEN + 1))
    with pytest.raises(ValueError, match="layers"):
        probe(torch.randn(1, NUM_LAYERS + 1, 4, HIDDEN), torch.ones(1, 4))
    with pytest.raises(ValueError, match="attention_mask"):
        probe(torch.randn(2, NUM_LAYERS, 4, HIDDEN), torch.ones(2, 5))
    with pytest.raises(ValueError, match="real position"):
        probe(torch.randn(2, NUM_LAYERS, 4, HIDDEN), torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]]))
    with pytest.raises(ValueError, match="params is empty"):
        train_probe(probe, [], lambda e: [], epochs=1, lr=1e-3)
    with pytest.raises(ValueError, match="epochs"):
        train_probe(probe, probe.parameters(), lambda e: [], epochs=-1, lr=1e-3)
    with pytest.raises(ValueError, match="lr"):
        train_probe(probe, probe.parameters(), lambda e: [], epochs=1, lr=0.0)
    with pytest.raises(ValueError, match="seed"):
        set_seed("zero")


def test_sentence_probe_on_packed_real_tokens_equals_padded():
    """Ragged (pad-free) features with their App. A positions give the padded input's logits, also for pair layouts
    whose real positions are not contiguous."""
    torch.manual_seed(0)
    probe = SentenceProbe(num_layers=3, max_length=10, hidden_size=4, num_labels=2).eval()
    torch.nn.init.normal_(probe.position_logits)
    mask = torch.tensor([[1, 1, 1, 0, 0, 1, 1, 0, 0, 1], [1, 1, 0, 0, 0, 0, 0, 0, 0, 1]])
    features = torch.randn(2, 3, 10, 4)
    padded = probe(features, mask)
    width = int(mask.sum(1).max())
    packed = torch.zeros(2, 3, width, 4)
    positions = torch.full((2, width), -1)
    packed_mask = torch.zeros(2, width, dtype=torch.long)
    for row in range(2):
        real = mask[row].nonzero().flatten()
        packed[row, :, : len(real)] = features[row][:, real]
        positions[row, : len(real)] = real
        packed_mask[row, : len(real)] = 1
    assert torch.allclose(probe(packed, packed_mask, positions), padded, atol=1e-6)
    with pytest.raises(ValueError, match="exceeds the probe's max_length"):
        probe(packed, packed_mask, positions.clamp_min(0) + 10)


def test_ragged_sentence_rows_give_the_padded_probe_output_and_gradients():
    """SentenceProbe pools real-token rows directly (no padded tensor); same logits and gradients as padded."""
    from papa_lib.experiments.features import RaggedRows

    torch.manual_seed(3)
    lengths = torch.tensor([3, 7, 1, 5])
    offsets = torch.zeros(5, dtype=torch.long)
    offsets[1:] = lengths.cumsum(0)
    values = torch.randn(int(offsets[-1]), 3, 8).half()
    positions = torch.cat([torch.randperm(10)[:n].sort().values for n in lengths.tolist()])  # App. A gaps
    rows = RaggedRows(values, offsets, positions)
    probe = SentenceProbe(3, 10, 8, 3).eval()
    with torch.no_grad():
        probe.position_logits.normal_()
    examples = torch.tensor([2, 0, 3, 1])
    padded = probe(*rows.sentence_batch(examples))
    padded.square().sum().backward()
    expected = [p.grad.clone() for p in probe.parameters()]
    probe.zero_grad()
    ragged = probe(rows.ragged_sentences(examples))
    ragged.square().sum().backward()
    torch.testing.assert_close(ragged, padded, atol=1e-6, rtol=1e-5)
    for got, want in zip((p.grad for p in probe.parameters()), expected):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_adamw_is_fused_on_cpu_and_matches_the_default_update():
    import torch.nn.functional as F

    from papa_lib.experiments.loop import adamw
    from papa_lib.experiments.probes import TokenProbe

    weights = {}
    for fused in (True, False):
        torch.manual_seed(0)
        probe = TokenProbe(3, 16, 5).eval()
        start = probe.mlp[0].weight.detach().clone()
        optimiser = adamw(probe.parameters(), 1e-2) if fused else torch.optim.AdamW(probe.parameters(), lr=1e-2,
                                                                                       weight_decay=0.0)
        assert optimiser.defaults["fused"] is (True if fused else None)
        generator = torch.Generator().manual_seed(1)
        for _ in range(50):
            x, y = torch.randn(12, 3, 16, generator=generator), torch.randint(0, 5, (12,), generator=generator)
            loss = F.cross_entropy(probe(x), y)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
        weights[fused] = probe.mlp[0].weight.detach().clone()
    assert (weights[True] - start).abs().max() > 1e-2  # the probe moved ...
    torch.testing.assert_close(weights[True], weights[False], atol=1e-6, rtol=1e-5)  # ... the same way
    groups = [
        {"params": [torch.nn.Parameter(torch.zeros(3))]},
        {"params": [torch.nn.Parameter(torch.zeros(2))], "lr": 1},
    ]
    assert adamw(groups, 1e-3).defaults["fused"] is True
