"""The real all-mpnet-base-v2 through the override seam at L = 64: PAPA's exactness checks on a 12 x 12 model."""

from __future__ import annotations

import pytest
import torch
from test_core import naive_average
from test_packing import _check_every_mode

import papa_lib
from papa_lib.core.models import layout_position_ids, model_inputs

pytestmark = pytest.mark.slow
L = 64
TEXTS = ["A gripping, beautifully shot film about grief.", "Dull.", "Far too long and far too loud for its own good."]
PAIRS = ["It is moving.", "The film bored me to tears, and the ending made it worse.", "It is short."]


def _encode(tokenizer, model, texts, pairs):
    batch = papa_lib.encode(tokenizer, texts, pairs, max_length=L)
    batch["position_ids"] = layout_position_ids(batch, model)  # App. A positions (RoBERTa-style offset), also for
    return batch  # averaging: without them MPNet numbers positions by counting non-pad tokens


def _run(model, batch, **kwargs):
    inputs = model_inputs(model, batch)
    with torch.no_grad():
        return model(**inputs, **kwargs)


def test_one_example_constant_equals_the_original(mpnet):
    model, tokenizer = mpnet
    batch = _encode(tokenizer, model, TEXTS[:1], PAIRS[:1])
    constants = papa_lib.average_attention(model, [batch], progress=False)
    original = _run(model, batch).last_hidden_state
    with papa_lib.override(model, constants):
        replaced = _run(model, batch).last_hidden_state
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(replaced[real], original[real], atol=1e-4, rtol=0)
    with papa_lib.override(model, constants, mode="zeros"):  # and the seam does change the output
        assert (_run(model, batch).last_hidden_state[real] - original[real]).abs().max() > 0.1


def test_mix_at_theta_30_equals_the_original(mpnet):
    model, tokenizer = mpnet
    batch = _encode(tokenizer, model, TEXTS, PAIRS)
    constants = papa_lib.average_attention(model, [batch], progress=False)
    original = _run(model, batch).last_hidden_state
    with papa_lib.override(model, constants, mode="mix") as papa:
        papa.theta.data.fill_(30.0)
        mixed = _run(model, batch).last_hidden_state
        papa.theta.data.fill_(-30.0)
        constant_side = _run(model, batch).last_hidden_state
    with papa_lib.override(model, constants):
        constant = _run(model, batch).last_hidden_state
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(mixed[real], original[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(constant_side[real], constant[real], atol=1e-4, rtol=0)


@pytest.mark.parametrize("mode", ["original", "constant", "mix", "toeplitz", "identity"])
def test_pad_content_never_leaks(mpnet, mode):
    model, tokenizer = mpnet
    batch = _encode(tokenizer, model, TEXTS, PAIRS)
    constants = papa_lib.average_attention(model, [batch], progress=False)
    other = dict(batch)
    noise = torch.randint(1000, 20000, batch["input_ids"].shape, generator=torch.Generator().manual_seed(0))
    other["input_ids"] = torch.where(batch["attention_mask"].bool(), batch["input_ids"], noise)
    heads = {(layer, head): mode for layer in range(12) for head in range(0, 12, 2)}
    with papa_lib.override(model, constants, heads=heads) as papa:
        papa.theta.data.normal_(generator=torch.Generator().manual_seed(1))
        first = _run(model, batch).last_hidden_state
        second = _run(model, other).last_hidden_state
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(first[real], second[real], atol=1e-5, rtol=0)


def test_averaging_equals_an_independent_reference(mpnet):
    model, tokenizer = mpnet
    batches = [_encode(tokenizer, model, TEXTS[:2], PAIRS[:2]), _encode(tokenizer, model, TEXTS[2:], PAIRS[2:])]
    constants = papa_lib.average_attention(model, batches, progress=False)
    expected, counts = naive_average(model, batches)
    assert constants.matrices.shape == (12, 12, L, L)
    torch.testing.assert_close(constants.matrices, expected, atol=1e-6, rtol=1e-5)
    assert torch.equal(constants.counts, counts.long())


def test_packed_equals_padded_at_real_positions(mpnet):
    model, tokenizer = mpnet
    batch = papa_lib.encode(tokenizer, TEXTS, PAIRS, max_length=L)
    _check_every_mode(model, batch, atol=1e-4)
