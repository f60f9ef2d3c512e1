"""The sampler: greedy, temperature, top-k, top-p (keeping the crossing token), seeded draws."""

from __future__ import annotations

import math

import numpy as np
import pytest

from inferno.sampling import PRESETS, Sampler, SamplingParams


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def frequencies(sampler: Sampler, logits: np.ndarray, n: int) -> np.ndarray:
    counts = np.bincount([sampler(logits) for _ in range(n)], minlength=logits.shape[0])
    return counts / n


def test_greedy_is_argmax():
    logits = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    assert Sampler()(logits) == int(np.argmax(logits))


def test_temperature_follows_the_softmax():
    logits = np.log(np.array([0.1, 0.2, 0.3, 0.4]))
    for t in (1.0, 0.5):
        freq = frequencies(Sampler(SamplingParams(temperature=t, seed=0)), logits, 20000)
        np.testing.assert_allclose(freq, softmax(logits / t), atol=0.015)


def test_top_k_keeps_the_k_most_likely():
    logits = np.random.default_rng(1).standard_normal(500)
    sampler = Sampler(SamplingParams(temperature=2.0, top_k=5, seed=0))
    ids, probs = sampler.distribution(logits)
    assert set(ids) == set(np.argsort(logits)[-5:])
    np.testing.assert_allclose(probs, softmax(logits[ids] / 2.0))
    assert set(frequencies(sampler, logits, 2000).nonzero()[0]) <= set(ids)


@pytest.mark.parametrize(
    ("top_p", "kept"),
    [(0.45, [0]), (0.55, [0, 1]), (0.79, [0, 1]), (0.81, [0, 1, 2]), (1.0, [0, 1, 2, 3])],
)
def test_top_p_keeps_the_token_that_crosses(top_p, kept):
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    ids, probs = Sampler(SamplingParams(temperature=1.0, top_p=top_p)).distribution(logits)
    assert ids.tolist() == kept
    assert math.isclose(probs.sum(), 1.0)


def test_top_k_then_top_p():
    logits = np.log(np.array([0.05, 0.5, 0.3, 0.15]))
    ids, _ = Sampler(SamplingParams(temperature=1.0, top_k=2, top_p=0.9)).distribution(logits)
    assert ids.tolist() == [1, 2]


def test_same_seed_same_draws():
    logits = np.random.default_rng(2).standard_normal(50257).astype(np.float32)
    params = SamplingParams(temperature=0.8, top_k=40, seed=7)
    a = [Sampler(params)(logits) for _ in range(1)] + [s for s in _draws(params, logits, 20)]
    b = [Sampler(params)(logits) for _ in range(1)] + [s for s in _draws(params, logits, 20)]
    assert a == b
    assert _draws(params, logits, 20) != _draws(SamplingParams(temperature=0.8, top_k=40, seed=8), logits, 20)


def _draws(params: SamplingParams, logits: np.ndarray, n: int) -> list[int]:
    sampler = Sampler(params)
    return [sampler(logits) for _ in range(n)]


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"seed": "x"}, "seed"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_params_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)


def test_sample_preset_is_temperature_08_top_k_40():
    assert PRESETS["sample"] == {"temperature": 0.8, "top_k": 40, "top_p": 1.0}


def test_tiny_temperature_is_almost_greedy():
    # Dividing first would overflow to inf - inf = nan and pick the least likely token.
    logits = np.random.default_rng(3).standard_normal(1000).astype(np.float32) * 5
    for t in (1e-3, 1e-200, 1e-320):
        assert Sampler(SamplingParams(temperature=t, seed=0))(logits) == int(np.argmax(logits))
