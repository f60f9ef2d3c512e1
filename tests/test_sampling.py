"""The sampler: greedy, temperature, top-k, top-p (keeping the crossing token), seeded draws."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from reference import candidates, reference_draw

from inferno.sampling import (
    CROSSING_SORT,
    DRAW_BLOCK,
    PRESETS,
    Sampler,
    SamplingError,
    SamplingParams,
    draw,
    first_crossing,
)


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
        ({"temperature": True}, "temperature"),
        ({"temperature": "0.5"}, "temperature"),
        ({"top_p": True}, "top_p"),
        ({"top_p": "0.5"}, "top_p"),
        ({"top_k": True}, "top_k"),
        ({"seed": True}, "seed"),
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
    with pytest.raises(SamplingError) as info:
        SamplingParams(**kwargs)
    assert info.value.field == name
    assert str(info.value) == f"{name} {info.value.reason}" and repr(kwargs[name]) in info.value.reason


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -1}, "temperature must be a finite number >= 0, got -1"),
        ({"top_k": -1}, "top_k must be an integer >= 0 (0 = off), got -1"),
        ({"top_p": 0}, "top_p must be in (0, 1], got 0"),
        ({"seed": -1}, "seed must be an integer >= 0, got -1"),
    ],
)
def test_bad_params_messages(kwargs, message):
    with pytest.raises(SamplingError) as info:
        SamplingParams(**kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize(
    "kwargs",
    [{"temperature": 0}, {"temperature": 2}, {"top_k": np.int64(3)}, {"top_p": 1}, {"top_p": 1e-9},
     {"seed": 0}, {"seed": np.uint32(5)}],
)
def test_edge_values_are_accepted(kwargs):
    assert getattr(SamplingParams(**kwargs), next(iter(kwargs))) == next(iter(kwargs.values()))


def test_top_k_1_is_the_argmax():
    logits = np.random.default_rng(4).standard_normal(300)
    sampler = Sampler(SamplingParams(temperature=1.5, top_k=1, seed=0))
    ids, probs = sampler.distribution(logits)
    assert ids.tolist() == [int(np.argmax(logits))] and probs.tolist() == [1.0]
    assert {sampler(logits) for _ in range(50)} == {int(np.argmax(logits))}


def test_top_k_of_all_but_one_drops_only_the_least_likely():
    logits = np.random.default_rng(5).standard_normal(300)
    ids, probs = Sampler(SamplingParams(temperature=0.7, top_k=299)).distribution(logits)
    assert sorted(ids.tolist()) == sorted(set(range(300)) - {int(np.argmin(logits))})
    ref_ids, ref_probs = candidates(logits, 0.7, top_k=299)
    assert ids.tolist() == ref_ids
    np.testing.assert_allclose(probs, ref_probs, rtol=1e-12)


@pytest.mark.parametrize("top_k", [300, 1000])
def test_top_k_of_the_whole_vocabulary_keeps_every_id_most_likely_first(top_k):
    logits = np.random.default_rng(6).standard_normal(300)
    ids, probs = Sampler(SamplingParams(temperature=1.0, top_k=top_k)).distribution(logits)
    ref_ids, ref_probs = candidates(logits, 1.0)
    assert ids.tolist() == ref_ids
    np.testing.assert_allclose(probs, ref_probs, rtol=1e-12)


def test_top_p_on_unsorted_logits():
    # Probabilities .05, .5, .15, .3: most likely first that is 1 (.5) then 3 (.3), which crosses .6.
    logits = np.log(np.array([0.05, 0.5, 0.15, 0.3]))
    ids, probs = Sampler(SamplingParams(temperature=1.0, top_p=0.6)).distribution(logits)
    assert ids.tolist() == [1, 3]
    np.testing.assert_allclose(probs, [0.5 / 0.8, 0.3 / 0.8])
    sampler = Sampler(SamplingParams(temperature=1.0, top_p=0.6, seed=1))
    assert {sampler(logits) for _ in range(200)} == {1, 3}


def test_candidates_come_most_likely_first_ties_by_id():
    logits = np.array([1.0, 3.0, 3.0, 2.0, 3.0, 0.5])
    ids, _ = Sampler(SamplingParams(temperature=1.0, top_k=4)).distribution(logits)
    assert ids.tolist() == [1, 2, 4, 3]
    ids, _ = Sampler(SamplingParams(temperature=1.0, top_p=0.99)).distribution(logits)
    assert ids.tolist() == [1, 2, 4, 3, 0, 5][: len(ids)] and len(ids) >= 5


def test_without_a_cut_the_candidates_are_every_id_in_order():
    logits = np.random.default_rng(7).standard_normal(200)
    for t in (1.0, 0.6):
        ids, probs = Sampler(SamplingParams(temperature=t)).distribution(logits)
        assert ids.tolist() == list(range(200))
        np.testing.assert_allclose(probs, np.exp(logits / t) / np.exp(logits / t).sum(), rtol=1e-12)


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, 0, 1.0), (0.7, 0, 1.0), (2.0, 0, 1.0), (2.5, 0, 1.0), (0.8, 40, 1.0), (1.0, 0, 0.9),
     (1.3, 50, 0.7), (2.0, 30, 1.0), (1.0, 1, 1.0)],
)
def test_draws_equal_the_reference_inverse_cdf(temperature, top_k, top_p):
    # One rng.random() per token, the first candidate whose cumulative mass exceeds it: the same ids
    # as a draw written from the definition, for the fast path without a cut and the sorted one.
    logits = np.random.default_rng(8).standard_normal(2000).astype(np.float32) * 2
    sampler = Sampler(SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=11))
    rng = np.random.default_rng(11)
    ours = [sampler(logits) for _ in range(300)]
    assert ours == [reference_draw(logits, rng, temperature, top_k, top_p) for _ in range(300)]
    assert len(set(ours)) == 1 if top_k == 1 else len(set(ours)) > 20


class FixedDraw:
    """An rng whose every draw is `u`."""

    def __init__(self, u: float) -> None:
        self.u = u

    def random(self) -> float:
        return self.u


@pytest.mark.parametrize("top_k", [0, 2])
def test_a_draw_picks_the_first_candidate_whose_mass_exceeds_it(top_k):
    # Equal halves: u = 0.5 is the first candidate's upper edge, which belongs to the second (the
    # intervals are [F(k-1), F(k)), as in the reference). u = 0 never picks a token of probability 0.
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=top_k))
    sampler.rng = FixedDraw(0.5)
    assert sampler(np.array([0.0, 0.0])) == 1
    assert reference_draw(np.array([0.0, 0.0]), FixedDraw(0.5), 1.0, top_k) == 1
    sampler.rng = FixedDraw(0.0)
    assert sampler(np.array([-np.inf, 0.0, 0.0])) == 1


def _sorted_crossing(z, weights, target, strict):
    """first_crossing from its definition: sort by (z descending, id), one cumsum."""
    order = np.lexsort((np.arange(len(z)), -z))
    cum = np.cumsum(weights[order])
    i = int(np.searchsorted(cum, target, side="right" if strict else "left"))
    return (int(order[i]), float(cum[i])) if i < len(order) else (-1, 0.0)


@pytest.mark.parametrize("n", [100, CROSSING_SORT + 1, 50257, 151936])
@pytest.mark.parametrize("shape", ["flat", "peaked", "ties", "masked"])
def test_first_crossing_is_the_sorted_cumulative_crossing(n, shape):
    # Below and above the size it sorts outright; a flat row (a crossing deep in the vocabulary), a peaked
    # one (in the first bucket), a third of the ids tied, a quarter masked to -inf (weight 0).
    rng = np.random.default_rng(n)
    z = rng.standard_normal(n) * (8.0 if shape == "peaked" else 1.0)
    if shape == "ties":
        z[rng.integers(0, n, n // 3)] = z[7]
    if shape == "masked":
        z[rng.integers(0, n, n // 4)] = -np.inf
    z -= z.max()
    weights = np.exp(z)
    total = float(weights.sum())
    for q in [1e-9, 0.1, 0.5, 0.9, 0.999, *rng.random(8)]:
        for strict in (False, True):
            got = first_crossing(z, weights, q * total, strict)
            want = _sorted_crossing(z, weights, q * total, strict)
            # (the same id; the cumulative weight within the rounding of sums in another order)
            assert got[0] == want[0] and math.isclose(got[1], want[1], rel_tol=1e-12), (q, strict)
    assert first_crossing(z, weights, 2 * total, False) == (-1, 0.0)


@pytest.mark.parametrize("n", [3000, 50257, 151936])
@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 0.9), (2.0, 0.5), (0.7, 0.95), (100.0, 0.9),
                                                    (0.05, 0.9), (1.5, 0.1)])
def test_a_top_p_draw_is_the_draw_from_its_sorted_distribution(n, temperature, top_p):
    # The fast path of a top-p cut alone (no sort of the vocabulary) picks the id that `distribution`'s
    # sorted candidates and one draw pick, for the same random numbers: flat rows where the cut keeps most
    # of a vocabulary, ties, masked ids.
    rng = np.random.default_rng(n)
    logits = (rng.standard_normal(n) * 2).astype(np.float32)
    logits[rng.integers(0, n, n // 5)] = logits[3]
    logits[rng.integers(0, n, n // 7)] = -np.inf
    fast = Sampler(SamplingParams(temperature=temperature, top_p=top_p, seed=5))
    slow = Sampler(SamplingParams(temperature=temperature, top_p=top_p, seed=5))
    for _ in range(25):
        ids, probs = slow.distribution(logits)
        assert fast(logits) == int(ids[draw(probs, slow.rng.random())])


def test_top_p_1_keeps_candidates_whose_probability_rounds_away():
    # 1 - 2e-22 rounds to 1.0: a cut at top_p = 1 would stop after the first candidate.
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=2, top_p=1.0))
    ids, probs = sampler.distribution(np.array([0.0, -50.0]))
    assert ids.tolist() == [0, 1] and probs[1] > 0


@pytest.mark.parametrize(("top_k", "top_p", "n"),
                         [(0, 1.0, 100), (3, 1.0, 100), (0, 0.9, 100), (0, 0.9, 50257)])
def test_tiny_temperatures_do_not_warn(top_k, top_p, n):
    logits = np.random.default_rng(9).standard_normal(n) * 5
    sampler = Sampler(SamplingParams(temperature=1e-320, top_k=top_k, top_p=top_p, seed=0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow to -inf far below the maximum is expected, silently
        assert sampler(logits) == int(np.argmax(logits))


def test_a_draw_at_the_very_top_of_the_cdf_stays_in_range():
    # u * total reaching the last bin's edge (u = 1, which random() never gives, or rounding up).
    logits = np.array([0.0, 1.0, 2.0])
    for params in (SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, top_k=2)):
        sampler = Sampler(params)
        sampler.rng = FixedDraw(1.0)
        assert sampler(logits) == (2 if params.top_k == 0 else 1)


def test_sample_preset_is_temperature_08_top_k_40():
    assert PRESETS["sample"] == {"temperature": 0.8, "top_k": 40, "top_p": 1.0}
    assert PRESETS["greedy"] == {"temperature": 0.0, "top_k": 0, "top_p": 1.0}


def test_tiny_temperature_is_almost_greedy():
    # Dividing first would overflow to inf - inf = nan and pick the least likely token.
    logits = np.random.default_rng(3).standard_normal(1000).astype(np.float32) * 5
    for t in (1e-3, 1e-200, 1e-320):
        assert Sampler(SamplingParams(temperature=t, seed=0))(logits) == int(np.argmax(logits))
        assert Sampler(SamplingParams(temperature=t, top_k=5, seed=0))(logits) == int(np.argmax(logits))


# ------------------------------------------------------------------------------ infinite logits
# A repetition penalty of 1e-310 divides a seen token's logit into +inf (issue 29, bug 3): every path
# puts all the mass on the +inf tokens, as greedy does; -inf tokens are never drawn.

INF_PARAMS = [dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.7),
              dict(temperature=1.0, top_k=3), dict(temperature=1.0, top_p=0.75),
              dict(temperature=1.3, top_k=50, top_p=0.9)]


@pytest.mark.parametrize("kwargs", INF_PARAMS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_plus_infinite_logits_take_all_the_mass(kwargs):
    logits = np.random.default_rng(3).standard_normal(100)
    logits[[17, 60]] = np.inf
    logits[[0, 99]] = -np.inf
    sampler = Sampler(SamplingParams(seed=0, **kwargs))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no inf - inf on the way
        drawn = {sampler(logits) for _ in range(200)}
    assert drawn <= {17, 60}
    if kwargs["temperature"] and kwargs.get("top_k", 3) >= 2:
        assert drawn == {17, 60}  # the +inf tokens share the mass
    if kwargs["temperature"]:
        ids, probs = sampler.distribution(logits)
        kept = probs > 0
        assert dict(zip(ids[kept].tolist(), probs[kept].tolist(), strict=True)) == {17: 0.5, 60: 0.5}


@pytest.mark.parametrize("kwargs", INF_PARAMS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_minus_infinite_logits_are_never_drawn(kwargs):
    logits = np.array([-np.inf, np.log(0.25), -np.inf, np.log(0.75), -np.inf])
    sampler = Sampler(SamplingParams(seed=1, **kwargs))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        drawn = [sampler(logits) for _ in range(400)]
    assert set(drawn) <= {1, 3}
    if kwargs["temperature"] == 1.0 and "top_k" not in kwargs and "top_p" not in kwargs:
        assert 0.65 < drawn.count(3) / len(drawn) < 0.85


@pytest.mark.parametrize("kwargs", INF_PARAMS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_all_minus_infinite_logits_still_give_a_token(kwargs):
    sampler = Sampler(SamplingParams(seed=2, **kwargs))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert all(0 <= sampler(np.full(8, -np.inf)) < 8 for _ in range(20))


def _draw_reference(weights: np.ndarray, r: float) -> int:
    """The inverse-CDF draw from the definition: one cumulative sum over every weight."""
    cdf = np.cumsum(weights)
    return int(np.searchsorted(cdf, r * cdf[-1], side="right"))


@pytest.mark.parametrize("n", [1, 5, DRAW_BLOCK, DRAW_BLOCK + 1, 3 * DRAW_BLOCK - 7, 50257])
def test_the_two_level_draw_is_the_inverse_cdf(n):
    # Blocks' sums, then one block's cumulative sums: the index one cumulative sum over everything gives,
    # for random weights and draws, at the first and last weight, and with runs of zero weights (whole
    # zero blocks among them) that are never drawn.
    rng = np.random.default_rng(n)
    weights = rng.exponential(size=n)
    weights[rng.random(n) < 0.3] = 0.0
    if n > 2 * DRAW_BLOCK:
        weights[DRAW_BLOCK : 2 * DRAW_BLOCK] = 0.0
    weights[-1] = weights[-1] or 1.0
    cdf = np.cumsum(weights)
    edges = [0.0, np.nextafter(1.0, 0.0)] + [c / cdf[-1] for c in cdf[:: max(1, n // 50)]]
    for r in [*rng.random(300), *edges]:
        got = draw(weights, r)
        assert weights[got] > 0
        if r * cdf[-1] < cdf[-1]:  # (below the very top, where the two sums' last bits cannot matter)
            want = _draw_reference(weights, r)
            assert got == want or abs(r * cdf[-1] - cdf[min(got, want)]) <= 1e-12 * cdf[-1], (r, got, want)


def test_a_draw_at_the_top_never_takes_a_weightless_last_token():
    # r * total rounding up to the total overruns the sums: the last token of nonzero weight, not a
    # trailing one of weight 0 (a -inf logit).
    for n in (4, 5000):
        weights = np.zeros(n)
        weights[: n // 2] = 1.0
        assert draw(weights, 1.0) == n // 2 - 1


@pytest.mark.parametrize(("scale", "top_k", "top_p"), [(3.0, 40, 1.0), (3.0, 1, 1.0), (10.0, 200, 1.0),
                                                     (3.0, 40, 0.8), (10.0, 0, 0.9), (10.0, 0, 0.5),
                                                     (1.0, 0, 0.95), (30.0, 0, 0.999), (4.0, 0, 0.99),
                                                     (5.0, 0, 0.95)])
def test_a_vocabulary_wide_cut_keeps_the_reference_candidates(scale, top_k, top_p):
    # top_k and top_p over a GPT-2-wide vocabulary search a few candidates above a threshold (block
    # maxima; for top_p, a growing k until their mass reaches it) before sorting: the same ids, most
    # likely first, ties by id (logits rounded to one decimal: many ties at the cut), and probabilities
    # as the definition's.
    logits = np.round(np.random.default_rng(int(scale * 10) + top_k).standard_normal(50257) * scale, 1)
    sampler = Sampler(SamplingParams(temperature=0.7, top_k=top_k, top_p=top_p))
    ids, probs = sampler.distribution(logits)
    want_ids, want_probs = candidates(logits, 0.7, top_k, top_p)
    assert ids.tolist() == want_ids
    np.testing.assert_allclose(probs, want_probs, rtol=1e-9)
