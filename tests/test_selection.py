"""Tests for papa_lib.experiments.selection: head-replacement orders of paper Sec. 3.2 and Sec. 5.4."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from papa_lib.experiments.selection import (
    ORDERS,
    PAPER_FRACTIONS,
    heads_to_replace,
    num_input_dependent,
    replacement_order,
)

# A 2-layer x 3-head model; (0,1) and (1,1) tie at 0.1.
LAMBDAS = torch.tensor([[0.5, 0.1, 0.9], [0.3, 0.1, 0.7]])

EXPECTED = {
    "lambda": [(0, 1), (1, 1), (1, 0), (0, 0), (1, 2), (0, 2)],
    "reversed": [(0, 2), (1, 2), (0, 0), (1, 0), (0, 1), (1, 1)],
    "first_to_last": [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)],
    "last_to_first": [(1, 0), (1, 1), (1, 2), (0, 0), (0, 1), (0, 2)],
}


@pytest.mark.parametrize("order", sorted(EXPECTED))
def test_replacement_orders_match_hand_written_lists(order):
    assert replacement_order(order, 2, 3, lambdas=LAMBDAS) == EXPECTED[order]


@pytest.mark.parametrize("order", sorted(EXPECTED))
def test_heads_to_replace_takes_prefix_of_order(order):
    # fraction 0.5 of 6 heads -> 3 kept input-dependent, 3 replaced.
    assert heads_to_replace(order, 0.5, num_layers=2, num_heads=3, lambdas=LAMBDAS) == EXPECTED[order][:3]
    # 0.25 * 6 = 1.5 -> rounds half up to 2 kept, 4 replaced.
    assert heads_to_replace(order, 0.25, num_layers=2, num_heads=3, lambdas=LAMBDAS) == EXPECTED[order][:4]
    assert heads_to_replace(order, 1.0, num_layers=2, num_heads=3, lambdas=LAMBDAS) == []
    assert heads_to_replace(order, 0.0, num_layers=2, num_heads=3, lambdas=LAMBDAS) == EXPECTED[order]


def test_lambdas_accepted_as_numpy_and_lists():
    assert replacement_order("lambda", 2, 3, lambdas=LAMBDAS.numpy()) == EXPECTED["lambda"]
    assert replacement_order("reversed", 2, 3, lambdas=LAMBDAS.tolist()) == EXPECTED["reversed"]


def test_layer_orders_do_not_need_lambdas():
    assert replacement_order("first_to_last", 2, 3) == EXPECTED["first_to_last"]
    assert replacement_order("last_to_first", 2, 3) == EXPECTED["last_to_first"]


def test_random_order_is_seeded_permutation():
    first = replacement_order("random", 6, 12, seed=7)
    assert sorted(first) == replacement_order("first_to_last", 6, 12)
    # Same seed -> same order, whatever the global RNG state.
    random.seed(123)
    torch.manual_seed(123)
    np.random.seed(123)
    assert replacement_order("random", 6, 12, seed=7) == first
    others = {tuple(replacement_order("random", 6, 12, seed=s)) for s in range(5)}
    assert len(others) == 5
    assert first != replacement_order("first_to_last", 6, 12)
    assert heads_to_replace("random", 0.5, num_layers=6, num_heads=12, seed=7) == first[:36]


def test_num_input_dependent_rounds_half_up():
    assert [num_input_dependent(f, 72) for f in PAPER_FRACTIONS] == [72, 36, 9, 5, 0]
    assert num_input_dependent(0.0625, 72) == 5  # 4.5 -> 5
    assert num_input_dependent(0.5, 3) == 2  # 1.5 -> 2
    assert num_input_dependent(0.3, 10) == 3
    assert num_input_dependent(0.5, 0) == 0


def test_replaced_count_for_paper_fractions_on_minilm_shape():
    counts = [len(heads_to_replace("first_to_last", f, num_layers=6, num_heads=12)) for f in PAPER_FRACTIONS]
    assert counts == [0, 36, 63, 67, 72]


def test_orders_constant_is_complete():
    assert set(ORDERS) == {"lambda", "reversed", "first_to_last", "last_to_first", "random"}
    for order in ORDERS:
        heads = replacement_order(order, 2, 3, lambdas=LAMBDAS)
        assert len(heads) == 6 and len(set(heads)) == 6


def test_bad_order_name():
    with pytest.raises(ValueError, match="unknown head-replacement order"):
        replacement_order("lowest", 2, 3, lambdas=LAMBDAS)
    with pytest.raises(ValueError, match="unknown head-replacement order"):
        heads_to_replace("Lambda", 0.5, num_layers=2, num_heads=3, lambdas=LAMBDAS)


@pytest.mark.parametrize("order", ["lambda", "reversed"])
def test_missing_or_bad_lambdas(order):
    with pytest.raises(ValueError, match="needs lambdas"):
        replacement_order(order, 2, 3)
    with pytest.raises(ValueError, match="shape"):
        replacement_order(order, 2, 3, lambdas=torch.rand(3, 2))
    with pytest.raises(ValueError, match="NaN"):
        replacement_order(order, 2, 3, lambdas=torch.tensor([[0.1, float("nan"), 0.2], [0.3, 0.4, 0.5]]))


@pytest.mark.parametrize("fraction", [-0.01, 1.01, float("nan"), "half", None, True])
def test_bad_fractions(fraction):
    with pytest.raises(ValueError, match="fraction"):
        num_input_dependent(fraction, 72)
    with pytest.raises(ValueError, match="fraction"):
        heads_to_replace("first_to_last", fraction, num_layers=6, num_heads=12)


def test_bad_model_shape():
    with pytest.raises(ValueError, match="num_layers"):
        replacement_order("first_to_last", 0, 3)
    with pytest.raises(ValueError, match="num_heads"):
        replacement_order("first_to_last", 2, -1)
    with pytest.raises(ValueError, match="total_heads"):
        num_input_dependent(0.5, -1)
