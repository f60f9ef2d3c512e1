"""Why a step's logits are not finite (`CheckedBackend.check_logits` and `diagnose`, inferno/backends/
checked.py), on a stand-in model: non-finite values the backend holds in a weight, weights large enough
to overflow float32 (the threshold included), or moderate weights and a check forward that is finite.
Each message compared whole."""

from __future__ import annotations

import numpy as np
import pytest

from inferno.backends.checked import LARGE_WEIGHT, CheckedBackend, NonFiniteLogitsError
from inferno.backends.numpy_backend import NumpyBackend


class _Model:
    """What `diagnose` reads: the weights as the backend holds them, and a one-token forward pass."""

    def __init__(self, weights: list[tuple[str, object]]) -> None:
        self.weights = weights
        self.forwards: list[tuple] = []

    def named_weights(self):
        return iter(self.weights)

    def new_cache(self, batch: int = 1, capacity: int | None = None):
        return ("cache", batch, capacity)

    def forward(self, ids, cache=None):
        self.forwards.append((ids.tolist(), ids.dtype, cache))
        return np.zeros((1, 1, 3), dtype=np.float32)


class _Unreadable:
    """A weight the backend cannot copy back to the host: skipped."""


class _Backend(NumpyBackend):
    def to_numpy(self, a):
        if isinstance(a, _Unreadable):
            raise RuntimeError("cannot read it")
        return super().to_numpy(a)


def _diagnose(weights, logits) -> tuple[NonFiniteLogitsError, _Model]:
    checked = CheckedBackend(_Backend(), 4, 3)
    model = _Model(weights)
    with pytest.raises(NonFiniteLogitsError) as info:
        checked.check_logits(np.asarray(logits, dtype=np.float32), 1, model)
    assert checked.diagnosing is False
    return info.value, model


def test_non_finite_values_held_by_the_backend_are_its_prepare_weight():
    err, model = _diagnose([("a", np.ones(2)), ("b", np.array([0.5, np.nan]))], [[np.nan, 1.0, np.inf]])
    assert str(err) == (
        "backend 'numpy' returned 2 non-finite logits (NaN or Inf): the backend holds non-finite values in "
        "weight 'b' (weights loaded by inferno are checked finite, so its prepare_weight made them, or the "
        "model was built from unchecked weights)")
    assert (err.cause, err.backend, err.kernel) == ("backend", "numpy", "prepare_weight")
    assert model.forwards == []  # found in the weights: no check forward


@pytest.mark.parametrize("large", [LARGE_WEIGHT, 3e38])
def test_weights_at_or_past_the_threshold_are_the_likely_cause(large):
    weights = [("u", _Unreadable()), ("b", np.array([-large, 1.0])), ("c", np.array([large])),
               ("d", np.zeros(0))]
    err, model = _diagnose(weights, [[1.0, np.nan, 2.0]])
    assert str(err) == (
        "backend 'numpy' returned 1 non-finite logit (NaN or Inf); the weights are the likely cause: they "
        f"are finite (checked at load) but hold values up to {large:.3g} (in 'b'), which overflow float32 "
        "arithmetic")
    assert (err.cause, err.backend, err.kernel) == ("weights", "numpy", None)
    assert model.forwards == []


def test_moderate_weights_and_a_finite_check_forward_blame_the_backend_without_a_kernel():
    weights = [("e", np.zeros(0)), ("a", np.array([0.25, -0.5])), ("u", _Unreadable()),
               ("b", np.array([LARGE_WEIGHT / 2]))]
    err, model = _diagnose(weights, [[np.inf, np.inf, 0.0]])
    assert str(err) == (
        "backend 'numpy' returned 2 non-finite logits (NaN or Inf); the weights are finite (checked at load) "
        "and moderate (largest magnitude 5e+03), so the backend produced them (a one-token check forward "
        "was finite: the kernel is not known)")
    assert (err.cause, err.backend, err.kernel) == ("backend", "numpy", None)
    [(ids, dtype, cache)] = model.forwards
    assert (ids, dtype, cache) == ([[0]], np.int64, ("cache", 1, 1))


def test_the_largest_magnitude_of_small_weights_is_reported_as_it_is():
    err, _ = _diagnose([("e", np.zeros(0)), ("a", np.array([0.25, -0.5]))], [[np.nan, 0.0, 0.0]])
    assert "moderate (largest magnitude 0.5)" in str(err) and "1 non-finite logit (NaN" in str(err)
