"""Choosing the next token from one row of logits: greedy, temperature, top-k, top-p; seeded."""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np

#: Named settings for the CLI's --preset (``sample`` is the seed project's ``just sample``).
PRESETS: dict[str, dict[str, float | int]] = {
    "greedy": {"temperature": 0.0, "top_k": 0, "top_p": 1.0},
    "sample": {"temperature": 0.8, "top_k": 40, "top_p": 1.0},
}


class SamplingError(ValueError):
    """A sampling parameter is out of range: `field` names it, `reason` says why; the message is both."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field} {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k 0 and top_p 1 mean "no cut"."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        t, k, p = self.temperature, self.top_k, self.top_p
        if isinstance(t, bool) or not isinstance(t, Real) or not math.isfinite(t) or t < 0:
            raise SamplingError("temperature", f"must be a finite number >= 0, got {t!r}")
        if isinstance(k, bool) or not isinstance(k, Integral) or k < 0:
            raise SamplingError("top_k", f"must be an integer >= 0 (0 = off), got {k!r}")
        if isinstance(p, bool) or not isinstance(p, Real) or not (0.0 < p <= 1.0):
            raise SamplingError("top_p", f"must be in (0, 1], got {p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, Integral)
                                      or self.seed < 0):
            raise SamplingError("seed", f"must be an integer >= 0, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _tame(z: np.ndarray) -> np.ndarray:
    """`z` (float64) with a finite maximum: when the largest logit is infinite, the tokens that hold it
    share all the mass (logit 0) and the rest have none (-inf), as greedy's argmax picks among them.
    (+inf: a penalty overflowed; all -inf: nothing is favoured, so every token is equally likely.)"""
    m = z.max()
    if math.isfinite(m):
        return z
    return np.where(z == m, 0.0, -np.inf)


def _shifted(logits: np.ndarray) -> np.ndarray:
    """A float64 copy of `logits` less its maximum (tamed: `_tame`), its maximum 0: one array of our own,
    worked on in place after (fresh temporaries of a vocabulary's float64 cost more in page faults than
    their arithmetic)."""
    z = np.array(logits, dtype=np.float64)
    m = z.max()
    if not math.isfinite(m):
        z = _tame(z)
        m = z.max()
    z -= m
    return z


def _tempered(logits: np.ndarray, temperature: float) -> np.ndarray:
    """`_shifted` logits divided by the temperature (not at 0, greedy's, nor at 1, which changes nothing).
    Shifted before dividing so that a tiny temperature cannot overflow to inf - inf."""
    z = _shifted(logits)
    if temperature and temperature != 1.0:
        with np.errstate(over="ignore"):  # far below the maximum at a tiny temperature: -inf, weight 0
            z /= temperature
    return z


#: Logits per block whose maxima bound `top_k_candidates`' search.
TOP_K_BLOCK = 64


def top_k_candidates(z: np.ndarray, k: int) -> np.ndarray:
    """Ids that include the k largest values of `z` (every id tied with the k-th largest among them), in
    id order: those at or above the k-th largest of the maxima of blocks of `TOP_K_BLOCK` (k blocks reach
    it, so at least k values do). Usually a few times k, found in a few passes; a partition of the whole
    vocabulary (np.argpartition) took most of a sampled step and picked among ties arbitrarily."""
    n = len(z)
    blocks = n // TOP_K_BLOCK
    if blocks < 2 * k:
        return np.arange(n)
    maxima = z[: blocks * TOP_K_BLOCK].reshape(blocks, TOP_K_BLOCK).max(axis=1)
    threshold = np.partition(maxima, blocks - k)[blocks - k]
    return np.flatnonzero(z >= threshold)


def top_p_candidates(z: np.ndarray, top_p: float) -> tuple[np.ndarray, float]:
    """Ids that include the smallest most-likely-first prefix of `z` (maximum 0) whose mass reaches top_p
    (`top_k_candidates` of a growing k, until their mass does), and the mass of every id: a sort of only
    those, where one of the whole vocabulary took milliseconds a token."""
    weights = np.exp(z)
    total = float(weights.sum())
    k = 64
    while True:
        ids = top_k_candidates(z, k)
        # (a margin for the sums' order: the cut itself sums the sorted prefix)
        if len(ids) == len(z) or weights[ids].sum() >= top_p * total * (1 + 1e-9):
            return ids, total
        k *= 4


#: Candidates few enough for `first_crossing` to sort outright, and the buckets it splits more into.
CROSSING_SORT = 2048
CROSSING_BUCKETS = 1024


def first_crossing(z: np.ndarray, weights: np.ndarray, target: float, strict: bool) -> tuple[int, float]:
    """In `Sampler.distribution`'s order (z descending, ties by id; z <= 0), the first id whose cumulative
    weight reaches `target` (exceeds it, if `strict`), and that cumulative weight; (-1, 0.0) if none does.
    The candidates go into `CROSSING_BUCKETS` buckets by value (one bincount of their weights), only the
    bucket the crossing is in is kept, a few rounds, and only what is left is sorted: a few passes where a
    sort of a flat distribution's whole vocabulary (a top-p cut at a high temperature keeps most of it) took
    milliseconds. (The sums' order differs from one cumsum's in the last bits: a target within that
    rounding of a boundary may fall on either side.)"""
    side = "right" if strict else "left"
    ids, before = np.arange(len(z)), 0.0
    depth = -z  # (>= 0: the order is ascending depth)
    finite = depth[np.isfinite(depth)]
    lo, hi = 0.0, max(float(finite.max()) if len(finite) else 0.0, 1.0)
    for _ in range(4):
        if len(ids) <= CROSSING_SORT or not hi > lo:
            break
        scale = CROSSING_BUCKETS / (hi - lo)
        with np.errstate(invalid="ignore"):  # (an infinite depth: the last bucket)
            bucket = np.minimum((depth[ids] - lo) * scale, CROSSING_BUCKETS - 1).astype(np.intp)
        mass = np.bincount(bucket, weights=weights[ids], minlength=CROSSING_BUCKETS)
        cum = np.cumsum(np.concatenate(([before], mass)))
        j = int(np.searchsorted(cum[1:], target, side=side))
        if j == CROSSING_BUCKETS:
            return -1, 0.0
        before = float(cum[j])
        ids = ids[bucket == j]
        lo, hi = lo + j / scale, lo + (j + 1) / scale
    order = ids[np.lexsort((ids, -z[ids]))]
    cum = np.cumsum(np.concatenate(([before], weights[order])))[1:]
    i = int(np.searchsorted(cum, target, side=side))
    return (int(order[i]), float(cum[i])) if i < len(order) else (-1, 0.0)


#: Weights per block of `draw`'s two-level search.
DRAW_BLOCK = 1024


def draw(weights: np.ndarray, r: float) -> int:
    """The index i with C[i - 1] <= r * C[-1] < C[i], C the cumulative sums of `weights` (float64, >= 0, not
    all 0; r in [0, 1)): a draw by the inverse CDF, never an index of weight 0. In two levels beyond
    `DRAW_BLOCK` weights, the blocks' sums and then one block's cumulative sums: NumPy's cumsum is a
    sequential loop, most of the time of a draw over a whole vocabulary. (The sums' order differs from one
    cumsum's only in the last bits: a draw within that rounding of a boundary may fall on either side.)"""
    n = len(weights)
    if n <= DRAW_BLOCK:
        cdf = np.cumsum(weights)
        return _last_weighted(weights, int(np.searchsorted(cdf, r * cdf[-1], side="right")))
    starts = np.arange(0, n, DRAW_BLOCK)
    blocks = np.cumsum(np.add.reduceat(weights, starts))
    u = r * blocks[-1]
    b = int(np.searchsorted(blocks, u, side="right"))
    if b == len(blocks):  # (r * total rounded up to the total)
        return _last_weighted(weights, n)
    lo = int(starts[b])  # (a block of nonzero sum: blocks[b] > u >= blocks[b - 1])
    cdf = np.cumsum(weights[lo : lo + DRAW_BLOCK])
    if b:
        cdf += blocks[b - 1]
    return lo + _last_weighted(weights[lo : lo + DRAW_BLOCK], int(np.searchsorted(cdf, u, side="right")))


def _last_weighted(weights: np.ndarray, i: int) -> int:
    """i, or where a draw at the very top of the sums (r * total rounding up to it) overran the end, the
    last index of nonzero weight."""
    return i if i < len(weights) else int(np.flatnonzero(weights)[-1])


class Sampler:
    """Picks token ids; the same params and seed give the same choices for the same logits."""

    def __init__(self, params: SamplingParams | None = None) -> None:
        self.params = params or SamplingParams()
        self.rng = np.random.default_rng(self.params.seed)

    def distribution(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The candidate ids and their probabilities after temperature, top-k, top-p.

        With a top-k or top-p cut the candidates come most likely first; without one they are all ids
        in order (no sort of the whole vocabulary per token).
        """
        p = self.params
        # Work in float64 so that top-p sums and the draw do not depend on float32 rounding.
        z = _tempered(logits, p.temperature)
        ids, total = None, None
        if 0 < p.top_k < z.shape[0]:
            ids = top_k_candidates(z, p.top_k)
        elif not p.top_k and p.top_p < 1.0:
            ids, total = top_p_candidates(z, p.top_p)  # (total: the mass of every id, for the cut)
        if ids is None:
            ids = np.arange(z.shape[0])
        if p.top_k or p.top_p < 1.0:
            # Candidates by descending logit; ties broken by id so the order is reproducible.
            ids = ids[np.lexsort((ids, -z[ids]))]
            ids = ids[: p.top_k or len(ids)]
        probs = np.exp(z[ids] - z[ids].max())  # (z's maximum is 0, and among the candidates)
        probs /= probs.sum() if total is None else total
        if p.top_p < 1.0:
            # Keep the smallest prefix whose mass reaches top_p, including the token that crosses it.
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1
            ids, probs = ids[:keep], probs[:keep] / probs[:keep].sum()
        return ids, probs

    def __call__(self, logits: np.ndarray) -> int:
        p = self.params
        if p.greedy:
            return int(np.argmax(logits))
        if not p.top_k:
            z = _tempered(logits, p.temperature)
            if p.top_p >= 1.0:
                # No cut: the distribution over every id in order, built in place in one float64 array
                # (the same draw as `distribution` gives, with a fraction of its passes over the vocabulary).
                np.exp(z, out=z)
                return draw(z, self.rng.random())
            # A top-p cut alone: the id where the sorted mass reaches top_p, then the draw's, each found
            # without sorting the vocabulary (`first_crossing`); the same draw as `distribution` gives.
            weights = np.exp(z)
            last, kept = first_crossing(z, weights, p.top_p * float(weights.sum()), strict=False)
            if last >= 0:
                token, _ = first_crossing(z, weights, self.rng.random() * kept, strict=True)
                return token if token >= 0 else last
        ids, probs = self.distribution(logits)
        return int(ids[draw(probs, self.rng.random())])
