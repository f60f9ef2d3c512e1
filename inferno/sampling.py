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
        # Work in float64 so that top-p sums and the draw do not depend on float32 rounding; subtract
        # the maximum before dividing so that a tiny temperature cannot overflow to inf - inf.
        z = _tame(np.asarray(logits, dtype=np.float64))
        with np.errstate(over="ignore"):  # far below the maximum at a tiny temperature: -inf, weight 0
            z = (z - z.max()) / (p.temperature or 1.0)
        ids = np.arange(z.shape[0])
        if 0 < p.top_k < z.shape[0]:
            ids = np.argpartition(-z, p.top_k - 1)[: p.top_k]
        if p.top_k or p.top_p < 1.0:
            # Candidates by descending logit; ties broken by id so the order is reproducible.
            ids = ids[np.lexsort((ids, -z[ids]))]
        probs = np.exp(z[ids] - z[ids].max())
        probs /= probs.sum()
        if p.top_p < 1.0:
            # Keep the smallest prefix whose mass reaches top_p, including the token that crosses it.
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1
            ids, probs = ids[:keep], probs[:keep] / probs[:keep].sum()
        return ids, probs

    def __call__(self, logits: np.ndarray) -> int:
        p = self.params
        if p.greedy:
            return int(np.argmax(logits))
        if not p.top_k and p.top_p >= 1.0:
            # No cut: the distribution over every id in order, built in place in one float64 array
            # (the same draw as `distribution` gives, with a fraction of its passes over the vocabulary).
            z = _tame(np.array(logits, dtype=np.float64))
            z -= z.max()
            if p.temperature != 1.0:
                with np.errstate(over="ignore"):
                    z /= p.temperature
            np.exp(z, out=z)
            cdf = np.cumsum(z, out=z)
            i = int(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right"))
            return min(i, len(cdf) - 1)
        ids, probs = self.distribution(logits)
        cdf = np.cumsum(probs)
        i = int(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right"))
        return int(ids[min(i, len(ids) - 1)])
