"""Which attention heads PAPA replaces with constant matrices (paper Sec. 3.2 and Sec. 5.4).

Sec. 3.2 learns a mixing weight ``lambda^h`` in (0, 1) per head (``B^h = lambda^h A^h + (1 - lambda^h) C^h``,
Eq. 3) while training the probe, and then replaces the heads with the *smallest* ``lambda^h`` first (a small
``lambda`` means the head relies little on input-dependent attention). Sec. 5.4 compares this order with four
alternatives: first layer to last, last layer to first (both using the model's internal head order within a
layer), a random order, and 'Reversed' (largest ``lambda`` first).

Everything here is expressed as a *replacement order*: the list of all ``(layer, head)`` pairs, first =
replaced first. Replacing "k% of the heads" means taking a prefix of that list. The paper's experiments are
described by the fraction of heads that stay *input-dependent* (1, 1/2, 1/8, 1/16, 0: :data:`PAPER_FRACTIONS`),
so :func:`heads_to_replace` takes that fraction.

Choices the paper leaves open
-----------------------------
* Ties in ``lambda`` are broken by ``(layer, head)`` in ascending order, for both 'lambda' and 'reversed'
  (Python's stable sort on ``(lambda, layer, head)`` / ``(-lambda, layer, head)``).
* The number of heads kept input-dependent is ``floor(fraction * total + 0.5)`` (round half up), e.g.
  1/16 of 72 heads = 4.5 -> 5 kept, 67 replaced.
* 'random' uses ``random.Random(seed).shuffle`` of the first-to-last order: the same seed always gives the same
  permutation, on any platform, independent of the global RNG state.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import PapaInputError
from .probes import check_positive_int

__all__ = [
    "ORDERS",
    "PAPER_FRACTIONS",
    "replacement_order",
    "num_input_dependent",
    "heads_to_replace",
    "model_shape",
]

#: Head-replacement orders: Sec. 3.2 ('lambda') and the Sec. 5.4 alternatives.
ORDERS = ("lambda", "reversed", "first_to_last", "last_to_first", "random")

#: Fractions of heads kept input-dependent in the paper's experiments (all, 1/2, 1/8, 1/16, none).
PAPER_FRACTIONS = (1.0, 0.5, 0.125, 0.0625, 0.0)


def _lambda_values(lambdas: Any, num_layers: int, num_heads: int, order: str) -> list[list[float]]:
    """Validate ``lambdas`` ([num_layers, num_heads], finite) and return them as nested Python floats."""
    if lambdas is None:
        raise PapaInputError(f"order {order!r} needs lambdas of shape [num_layers={num_layers}, num_heads={num_heads}]")
    values = torch.as_tensor(lambdas).detach().to("cpu", torch.float64)
    if tuple(values.shape) != (num_layers, num_heads):
        raise PapaInputError(
            f"lambdas have shape {tuple(values.shape)}, expected [num_layers={num_layers}, num_heads={num_heads}]"
        )
    if not bool(torch.isfinite(values).all()):
        raise PapaInputError("lambdas contain NaN or infinite values")
    return values.tolist()


def replacement_order(
    order: str, num_layers: int, num_heads: int, lambdas: Tensor | None = None, seed: int = 0
) -> list[tuple[int, int]]:
    """All ``(layer, head)`` pairs in the order they get replaced by constant matrices (first = replaced first).

    Args:
        order: one of :data:`ORDERS`:
            ``'lambda'`` ascending ``lambda`` (least input-dependent first; Sec. 3.2);
            ``'reversed'`` descending ``lambda``;
            ``'first_to_last'`` layers 0..L-1, heads in internal order within each layer;
            ``'last_to_first'`` layers L-1..0, heads in internal order within each layer;
            ``'random'`` a permutation fixed by ``seed``.
        num_layers, num_heads: model shape.
        lambdas: ``[num_layers, num_heads]`` learned mixing weights (tensor, array or nested list); required
            for 'lambda' and 'reversed', ignored otherwise. Ties are broken by ``(layer, head)``.
        seed: seed of the 'random' order.
    """
    if order not in ORDERS:
        raise PapaInputError(f"unknown head-replacement order {order!r}; choose one of {ORDERS}")
    num_layers = check_positive_int("num_layers", num_layers)
    num_heads = check_positive_int("num_heads", num_heads)
    in_layer_order = [(layer, head) for layer in range(num_layers) for head in range(num_heads)]

    if order == "first_to_last":
        return in_layer_order
    if order == "last_to_first":
        return [(layer, head) for layer in reversed(range(num_layers)) for head in range(num_heads)]
    if order == "random":
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise PapaInputError(f"seed must be an integer, got {seed!r}")
        shuffled = list(in_layer_order)
        random.Random(int(seed)).shuffle(shuffled)
        return shuffled

    values = _lambda_values(lambdas, num_layers, num_heads, order)
    sign = 1.0 if order == "lambda" else -1.0
    return sorted(in_layer_order, key=lambda lh: (sign * values[lh[0]][lh[1]], lh[0], lh[1]))


def num_input_dependent(fraction: float, total_heads: int) -> int:
    """Number of heads kept input-dependent for ``fraction`` in [0, 1]: ``floor(fraction * total + 0.5)``.

    Round half up, e.g. 1/16 of 72 heads = 4.5 -> 5. Raises ``ValueError`` for a fraction outside [0, 1]
    (or NaN) and for a negative ``total_heads``.
    """
    if isinstance(fraction, bool):
        raise PapaInputError(f"fraction must be a number in [0, 1], got {fraction!r}")
    try:
        value = float(fraction)
    except (TypeError, ValueError) as err:
        raise PapaInputError(f"fraction must be a number in [0, 1], got {fraction!r}") from err
    if not 0.0 <= value <= 1.0:  # also rejects NaN
        raise PapaInputError(f"fraction must be in [0, 1], got {fraction!r}")
    if isinstance(total_heads, bool) or not isinstance(total_heads, (int, np.integer)) or total_heads < 0:
        raise PapaInputError(f"total_heads must be a non-negative integer, got {total_heads!r}")
    return min(int(total_heads), math.floor(value * int(total_heads) + 0.5))


def model_shape(model: Any = None, num_layers: int | None = None, num_heads: int | None = None) -> tuple[int, int]:
    """``(num_layers, num_heads)`` of ``model`` (a model or its config), or the explicit counts.

    Counts given with a model must match it; without a model both counts are required.

    Raises:
        ValueError: counts that do not match the model, or missing counts.
        TypeError: a number where the model goes (counts are keywords: ``num_layers=``, ``num_heads=``).
    """
    if model is None:
        if num_layers is None or num_heads is None:
            raise PapaInputError("give the model (or its config), or both num_layers= and num_heads=")
        return check_positive_int("num_layers", num_layers), check_positive_int("num_heads", num_heads)
    if isinstance(model, (bool, int, float, np.integer)):
        raise TypeError(f"expected a model or its config, got {model!r}; give explicit counts as num_layers= and "
                        "num_heads=")
    from ..core.models import num_layers_and_heads

    try:
        layers, heads = num_layers_and_heads(model)
    except AttributeError as err:
        raise TypeError(f"expected a model or its config (num_hidden_layers, num_attention_heads), got "
                        f"{type(model).__name__}") from err
    for name, given, actual in (("num_layers", num_layers, layers), ("num_heads", num_heads, heads)):
        if given is not None and check_positive_int(name, given) != actual:
            raise PapaInputError(f"{name}={given} does not match the model, which has {layers} layers of {heads} heads")
    return layers, heads


def heads_to_replace(
    order: str,
    fraction: float,
    model: Any = None,
    *,
    num_layers: int | None = None,
    num_heads: int | None = None,
    lambdas: Tensor | None = None,
    seed: int = 0,
) -> list[tuple[int, int]]:
    """Heads to replace so that ``fraction`` of all heads stay input-dependent.

    The first ``total - num_input_dependent(fraction, total)`` entries of :func:`replacement_order`.
    ``fraction=1`` -> ``[]`` (original model); ``fraction=0`` -> every head (fully attention-free).

    Args:
        order, lambdas, seed: as for :func:`replacement_order`.
        fraction: the fraction of all heads that stays input-dependent.
        model: the model (or its config) whose heads are chosen: its layer and head counts.
        num_layers, num_heads: explicit counts instead of (or, checked, with) the model.

    Raises:
        ValueError: counts that do not match ``model``, or neither a model nor both counts
            (:func:`model_shape`).

    Example: ``heads_to_replace("first_to_last", 0.5, model)`` replaces half of a 6 x 12 MiniLM's 72 heads and half
    of a 12 x 12 model's 144; ``heads_to_replace("first_to_last", 0.5, num_layers=6, num_heads=12)`` without one.
    """
    num_layers, num_heads = model_shape(model, num_layers, num_heads)
    ordered = replacement_order(order, num_layers, num_heads, lambdas=lambdas, seed=seed)
    total = len(ordered)
    return ordered[: total - num_input_dependent(fraction, total)]
