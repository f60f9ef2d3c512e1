"""Speculative decoding for batch-1 generation: draft K tokens cheaply, verify them in one forward pass.

A decode step reads every weight to produce one token; the target model can check K drafted tokens in
the same one pass (K + 1 positions, all logits kept), so every accepted draft is a token for free:

    last token, d1 .. dK ──▶ target forward (K + 1 rows of logits) ──▶ row i decides token i + 1:
        greedy:   the target's own choice; d(i+1) is accepted while it equals it
        sampling: d(i+1) accepted with probability min(1, p/q), else a token drawn from the
                  normalised residual max(0, p - q) (the standard rejection scheme: the output has
                  exactly the target's distribution, whatever the draft)
    ──▶ the first rejection's token (or, all accepted, a bonus token from row K) ends the round;
        the KV cache is rolled back to the accepted positions (`cache.length`: a row attends only to
        the positions it has written, so what lies past them is simply overwritten later).

Every token goes through the sequence's `SequenceState` (penalties, logit bias, stop ids and strings,
logprobs) with the target's logits of its position, as in plain decoding, so greedy output is the same
token for token and logprobs are the target's.

Drafters: `NgramDrafter` (prompt lookup: the tokens that followed the latest earlier occurrence of the
longest suffix, up to `max_ngram` tokens, of the prompt and output so far) and `DraftModelDrafter`
(a smaller model with the same vocabulary, run greedily or sampled with the request's temperature,
top-k and top-p). K adapts by default: it grows by 2 when a round accepts every draft, shrinks by 1 when
one is rejected (as transformers' assisted generation does), within 1 .. `MAX_SPECULATIVE_TOKENS`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from inferno.models.causal_lm import CausalLM
from inferno.options import SequenceState, Step
from inferno.sampling import Sampler

DEFAULT_SPECULATIVE_TOKENS = 4
MAX_SPECULATIVE_TOKENS = 16
DEFAULT_MAX_NGRAM = 3
METHODS = ("ngram", "draft")


class SpeculationError(ValueError):
    """A speculative-decoding setting that cannot work (the message says which and why)."""


class Drafter(Protocol):
    def draft(self, context: Sequence[int], k: int) -> tuple[list[int], list[np.ndarray | None]]:
        """Up to `k` tokens likely to follow `context`, and for each the distribution it was drawn from
        over the sampled ids (None: chosen deterministically, a point mass)."""
        ...


class NgramDrafter:
    """Prompt lookup: find the longest suffix of the context (at most `max_ngram` tokens, at least one)
    that occurred before, and propose the tokens that followed its latest occurrence."""

    def __init__(self, max_ngram: int = DEFAULT_MAX_NGRAM) -> None:
        if isinstance(max_ngram, bool) or not isinstance(max_ngram, int) or max_ngram < 1:
            raise SpeculationError(f"max_ngram must be an integer >= 1, got {max_ngram!r}")
        self.max_ngram = max_ngram

    def draft(self, context: Sequence[int], k: int) -> tuple[list[int], list[np.ndarray | None]]:
        ids = np.asarray(context, dtype=np.int64)
        t = len(ids)
        for n in range(min(self.max_ngram, t - 1), 0, -1):
            suffix = ids[t - n :]
            # Windows of n tokens that end before the suffix starts ending: candidates, latest first.
            windows = np.lib.stride_tricks.sliding_window_view(ids[: t - 1], n)
            hits = np.flatnonzero((windows == suffix).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                out = ids[start : start + k].tolist()
                return out, [None] * len(out)
        return [], []


class DraftModelDrafter:
    """A smaller model with the target's vocabulary: its own KV cache holds the context it has seen,
    rolled back to what the target kept at each round."""

    def __init__(self, model: CausalLM, sampler: Sampler, sample_limit: int | None = None) -> None:
        self.model = model
        self.sampler = sampler
        self.sample_limit = sample_limit
        self.cache = model.new_cache(1, model.config.n_positions)
        self.ids: list[int] = []  # the tokens in the cache

    def draft(self, context: Sequence[int], k: int) -> tuple[list[int], list[np.ndarray | None]]:
        k = min(k, self.model.config.n_positions - len(context))
        if k <= 0:
            return [], []
        common = 0
        for a, b in zip(self.ids, context, strict=False):
            if a != b:
                break
            common += 1
        common = min(common, len(context) - 1)  # feed one token at least: its logits draft the first
        self.cache.length, self.ids = common, list(context)
        logits = self.model.forward(np.asarray([context[common:]]), self.cache)
        tokens, dists = [], []
        for i in range(k):
            row = self.model.backend.to_numpy(logits)[0, : self.sample_limit].astype(np.float64)
            if self.sampler.params.greedy:
                token, dist = int(np.argmax(row)), None
            else:
                ids, probs = self.sampler.distribution(row)
                dist = np.zeros(row.shape[0])
                dist[ids] = probs
                token = int(self.sampler.rng.choice(dist.shape[0], p=dist))
            tokens.append(token)
            dists.append(dist)
            if i + 1 < k:
                logits = self.model.forward(np.asarray([[token]]), self.cache)
                self.ids.append(token)
        return tokens, dists


@dataclass
class SpeculationStats:
    """llama.cpp's counters: tokens drafted and accepted, and per draft position how often it was
    drafted and accepted (acceptance rate per position = accepted[i] / drafted[i])."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    drafted_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def count(self, drafted: int, accepted: int) -> None:
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        grow = drafted - len(self.drafted_at)
        if grow > 0:
            self.drafted_at.extend([0] * grow)
            self.accepted_at.extend([0] * grow)
        for i in range(drafted):
            self.drafted_at[i] += 1
            self.accepted_at[i] += i < accepted


@dataclass
class Speculation:
    """How one generation speculates: a drafter, K (the first round's), whether K adapts."""

    drafter: Drafter
    num_tokens: int = DEFAULT_SPECULATIVE_TOKENS
    adaptive: bool = True
    stats: SpeculationStats = field(default_factory=SpeculationStats)

    def __post_init__(self) -> None:
        check_settings("ngram", False, self.num_tokens)


def check_draft_model(target: CausalLM, draft: CausalLM, name: str = "the draft model") -> None:
    """A draft must share the target's vocabulary (its tokenizer): else its ids mean other tokens."""
    v, w = target.config.vocab_size, draft.config.vocab_size
    if v != w:
        raise SpeculationError(f"{name} has a vocabulary of {w} tokens, the target's has {v}: a draft model "
                               "must use the target's tokenizer")


def check_settings(method: str | None, has_draft_model: bool = False,
                   num_speculative_tokens: int | None = None) -> str | None:
    """The method these settings ask for ("ngram", "draft"; None: no speculation), or a
    `SpeculationError` saying which setting cannot work (before any model is loaded)."""
    if method is None and not has_draft_model and num_speculative_tokens is None:
        return None
    method = method or ("draft" if has_draft_model else "ngram")
    if method not in METHODS:
        raise SpeculationError(f"speculative method must be one of {', '.join(METHODS)}, got {method!r}")
    if method == "draft" and not has_draft_model:
        raise SpeculationError("speculative method 'draft' needs a draft model")
    if method == "ngram" and has_draft_model:
        raise SpeculationError("a draft model is given but the speculative method is 'ngram'")
    k = DEFAULT_SPECULATIVE_TOKENS if num_speculative_tokens is None else num_speculative_tokens
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        raise SpeculationError(f"num_speculative_tokens must be an integer in [1, {MAX_SPECULATIVE_TOKENS}], "
                               f"got {k!r}")
    return method


def check_speculation(target: CausalLM, method: str | None, draft_model: CausalLM | None = None,
                      num_speculative_tokens: int | None = None) -> str | None:
    """`check_settings`, and that the draft model can draft for `target`."""
    method = check_settings(method, draft_model is not None, num_speculative_tokens)
    if method == "draft":
        check_draft_model(target, draft_model)
    return method


def adapt(k: int, drafted: int, accepted: int) -> int:
    """The next round's K: grow by 2 when every draft was accepted, shrink by 1 when one was not."""
    return min(k + 2, MAX_SPECULATIVE_TOKENS) if accepted == drafted else max(k - 1, 1)


def new_speculation(target: CausalLM, state: SequenceState, method: str | None = None,
                    draft_model: CausalLM | None = None, num_speculative_tokens: int | None = None,
                    sample_limit: int | None = None, adaptive: bool = True,
                    max_ngram: int = DEFAULT_MAX_NGRAM) -> Speculation:
    """The `Speculation` for one sequence: `method` "ngram" or "draft" (the default when `draft_model`
    is given); the draft model samples with the sequence's temperature, top-k and top-p."""
    if state.matcher is not None:
        # Drafts would be verified against the unmasked target: refused rather than quietly wrong.
        raise SpeculationError("speculative decoding cannot be combined with a constraint on the output "
                               "(structured output): drop one of them")
    method = check_speculation(target, method or ("draft" if draft_model is not None else "ngram"),
                               draft_model, num_speculative_tokens)
    if method == "draft":
        params = state.options.sampling  # the draft draws with its own generator, seeded apart
        seed = None if params.seed is None else params.seed + 1
        drafter: Drafter = DraftModelDrafter(draft_model, Sampler(replace(params, seed=seed)), sample_limit)
    else:
        drafter = NgramDrafter(max_ngram)
    k = DEFAULT_SPECULATIVE_TOKENS if num_speculative_tokens is None else num_speculative_tokens
    return Speculation(drafter, k, adaptive)


def _target_distribution(state: SequenceState, row: np.ndarray) -> np.ndarray:
    """The probabilities the sequence's sampler draws from for this row (penalties, bias, temperature,
    top-k, top-p applied), over every sampled id."""
    z = state.processor(row) if state.processor is not None else row
    ids, probs = state.sampler.distribution(z)
    p = np.zeros(row.shape[0])
    p[ids] = probs
    return p


def verify_draft(state: SequenceState, row: np.ndarray, draft: int | None, q: np.ndarray | None
            ) -> tuple[int, bool]:
    """The token for this position and whether it is the draft (`draft` None: no draft here)."""
    if state.sampler.params.greedy:
        token = state.choose(row)
        return token, token == draft
    if draft is None:
        return state.choose(row), False
    p = _target_distribution(state, row)
    rng = state.sampler.rng
    q_d = 1.0 if q is None else q[draft]
    if q_d > 0 and rng.random() < min(1.0, p[draft] / q_d):
        return draft, True
    residual = p.copy()
    if q is None:
        residual[draft] = 0.0
    else:
        residual = np.maximum(residual - q, 0.0)
    total = residual.sum()
    if total <= 0:  # p == q: nothing to correct (cannot happen after a rejection but for rounding)
        residual, total = p, p.sum()
    return int(rng.choice(residual.shape[0], p=residual / total)), False


def speculative_steps(model: CausalLM, prompt: list[int], budget: int, state: SequenceState,
                      speculation: Speculation, sample_limit: int | None = None) -> Iterator[Step]:
    """The steps of one generation of at most `budget` new tokens (at least 1), speculating."""
    cache = model.new_cache(1, len(prompt) + budget - 1)

    def rows(ids: list[int], all_logits: bool) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            out = model.forward(np.asarray([ids]), cache, all_logits=all_logits)
        host = model.backend.to_numpy(out)
        host = host[0] if all_logits else host
        return model.check_logits(host, host.shape[0])[:, :sample_limit]

    emitted = 0
    step = state.step(rows(prompt, False)[0], last=budget == 1)
    emitted += 1
    yield step
    context = list(prompt) + [step.id]
    k, stats = speculation.num_tokens, speculation.stats
    while step.finish_reason is None:
        # Drafts plus the target's own token must fit the budget (and so the cache).
        room = budget - emitted - 1
        drafts, dists = speculation.drafter.draft(context, min(k, room)) if room > 0 else ([], [])
        drafts, dists = drafts[: max(room, 0)], dists[: max(room, 0)]
        offset = cache.length
        logits = rows([context[-1], *drafts], True)
        accepted = 0
        for i in range(len(drafts) + 1):
            draft = drafts[i] if i < len(drafts) else None
            token, ok = verify_draft(state, logits[i], draft, dists[i] if i < len(drafts) else None)
            step = state.step(logits[i], last=emitted + 1 == budget, token=token)
            emitted += 1
            context.append(step.id)
            yield step
            if not ok or step.finish_reason is not None:
                break
            accepted += 1
        # Keep the positions of the tokens verified: the last one fed and the accepted drafts.
        cache.length = offset + 1 + accepted
        if drafts:
            stats.count(len(drafts), accepted)
            if speculation.adaptive:
                k = adapt(k, len(drafts), accepted)
