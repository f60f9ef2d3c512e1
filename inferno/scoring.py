"""Scoring text: the log-probability the model gives each token, and the perplexity.

Texts longer than the context are scored with a sliding window exactly as the Hugging Face perplexity
guide defines it (https://huggingface.co/docs/transformers/perplexity): windows of the context length
start every `stride` tokens, and each token is scored once, in the first window that predicts it, with
all the context that window gives it. Each window is one batched forward pass, not a token-by-token loop.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral

import numpy as np

from inferno.models.causal_lm import CausalLM
from inferno.options import logsumexp, top_logprobs

#: Rows of logits turned into float64 log-probabilities at a time: 8 rows (3 MiB of float64) stay in the
#: cache and reuse the allocator's pages; larger chunks ran the log-softmax slower
#: (benches/options_overhead.py, docs/benchmarks.md).
ROWS_PER_CHUNK = 8


class ScoringError(ValueError):
    """A bad scoring request (too few tokens, a bad stride); the message says which."""


@dataclass
class ScoreResult:
    ids: list[int]
    logprobs: list[float | None]  # log P(ids[i] | ids[:i]); the first token has no context: None
    total_logprob: float  # the sum of the logprobs
    perplexity: float  # exp(-total_logprob / (len(ids) - 1))
    stride: int
    top: list[list[tuple[int, float]] | None] | None = None  # with top_logprobs=N: per token, like logprobs

    def to_dict(self) -> dict:
        out = {"ids": self.ids, "logprobs": self.logprobs, "total_logprob": self.total_logprob,
               "perplexity": self.perplexity, "stride": self.stride}
        if self.top is not None:
            out["top"] = [None if t is None else [{"id": i, "logprob": lp} for i, lp in t] for t in self.top]
        return out


def windows(n_tokens: int, context: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, first target) of each window, as the Hugging Face perplexity guide's loop makes them:
    tokens begin..end-1 are the window's input, first..end-1 the tokens it scores."""
    out, prev_end = [], 0
    for begin in range(0, n_tokens, stride):
        end = min(begin + context, n_tokens)
        out.append((begin, end, max(prev_end, begin + 1)))
        prev_end = end
        if end == n_tokens:
            break
    return out


def check_stride(stride, context: int) -> int:
    # A stride of the whole context would leave each later window's first token without a prediction.
    if isinstance(stride, bool) or not isinstance(stride, Integral) or not 1 <= stride < context:
        raise ScoringError(f"stride must be an integer in [1, {context - 1}] (below the context), "
                           f"got {stride!r}")
    return int(stride)


def check_request(ids: Sequence[int], stride: int | None, sample_limit: int, config) -> int:
    """What scoring `ids` needs of them (>= 2 tokens, each below `sample_limit` and the vocabulary) and
    of `stride` (None: half the context), in that order; returns the stride. Raises `ScoringError`."""
    if len(ids) < 2:
        raise ScoringError(f"scoring needs at least 2 tokens (the first has no context), got {len(ids)}")
    limit = min(sample_limit, config.vocab_size)
    bad = [i for i in ids if not 0 <= i < limit]
    if bad:
        raise ScoringError(f"token id {bad[0]} is outside the vocabulary [0, {limit})")
    return check_stride(config.n_positions // 2 if stride is None else stride, config.n_positions)


def score_ids(model: CausalLM, ids: Sequence[int], stride: int | None = None, top_logprobs_n: int = 0,
              sample_limit: int | None = None) -> ScoreResult:
    """Score `ids` (any length; >= 2 tokens). `stride` defaults to half the context.

    `sample_limit` restricts the distribution to the ids below it (a vocabulary padded past the
    tokenizer's), as generation does.
    """
    c = model.config
    ids = [int(i) for i in ids]
    stride = check_request(ids, stride, c.vocab_size if sample_limit is None else sample_limit, c)
    if isinstance(top_logprobs_n, bool) or not isinstance(top_logprobs_n, Integral) or top_logprobs_n < 0:
        raise ScoringError(f"top_logprobs must be an integer >= 0, got {top_logprobs_n!r}")

    logprobs: list[float | None] = [None] * len(ids)
    top: list[list[tuple[int, float]] | None] | None = [None] * len(ids) if top_logprobs_n else None
    be = model.backend
    for begin, end, first in windows(len(ids), c.n_positions, stride):
        # Position j predicts token j + 1: the window's last token is input to nothing, so leave it out.
        window = np.asarray([ids[begin : end - 1]])
        logits = be.to_numpy(model.forward(window, last=end - first))[0, :, :sample_limit]
        targets = np.asarray(ids[first:end])
        for r in range(0, len(targets), ROWS_PER_CHUNK):
            rows, tgt = logits[r : r + ROWS_PER_CHUNK], targets[r : r + ROWS_PER_CHUNK]
            lse = logsumexp(rows)
            chosen = rows[np.arange(len(tgt)), tgt].astype(np.float64) - lse
            for k, value in enumerate(chosen.tolist()):
                logprobs[first + r + k] = value
                if top is not None:
                    top[first + r + k] = top_logprobs(rows[k], top_logprobs_n, float(lse[k]))
    total = math.fsum(lp for lp in logprobs if lp is not None)
    return ScoreResult(ids, logprobs, total, math.exp(-total / (len(ids) - 1)), stride, top)
