"""The generation loop: prefill the prompt, then one cached decode step per new token.

`generate_tokens` yields token ids as they are chosen and leaves the finish reason on the iterator:
"stop" when a stop id (by default ``<|endoftext|>``) was produced, "length" when `max_new_tokens` or the
model's context (n_positions) ran out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from numbers import Integral

import numpy as np

from inferno.config import Gpt2Config
from inferno.model import Gpt2
from inferno.sampling import Sampler, SamplingParams


class GenerationError(ValueError):
    """A bad generation request (prompt ids, budget); the message says which."""


class ContextLengthError(GenerationError):
    """The prompt does not fit the model's context window."""


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    ids: list[int]  # the new ids, including the stop id when finish_reason is "stop"
    text: str  # the decoded new text, without the stop token
    finish_reason: str  # "stop" or "length"
    seconds: float = 0.0
    backend: str = ""

    @property
    def new_tokens(self) -> int:
        return len(self.ids)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        """The CLI's --json object."""
        return {"prompt_ids": self.prompt_ids, "ids": self.ids, "text": self.text,
                "finish_reason": self.finish_reason, "backend": self.backend, "new_tokens": self.new_tokens,
                "seconds": round(self.seconds, 6), "tokens_per_second": round(self.tokens_per_second, 3)}


@dataclass
class TokenStream:
    """Iterator over new token ids; `finish_reason` is set once it is exhausted."""

    model: Gpt2
    prompt_ids: list[int]
    max_new_tokens: int
    params: SamplingParams = field(default_factory=SamplingParams)
    stop_ids: frozenset[int] = frozenset()
    #: Sample only among ids below this (a model whose vocabulary is padded past the tokenizer's).
    sample_limit: int | None = None
    finish_reason: str | None = None

    def __iter__(self) -> Iterator[int]:
        n_pos = self.model.config.n_positions
        prompt = self.prompt_ids
        # The sequence (prompt + new tokens) may not exceed the context window.
        budget = min(int(self.max_new_tokens), n_pos - len(prompt))
        if budget <= 0:
            self.finish_reason = "length"
            return
        sample = Sampler(self.params)
        # The last new token is never fed back, so the cache needs room for one position less.
        cache = self.model.new_cache(1, len(prompt) + budget - 1)
        logits = self.model.forward(np.asarray([prompt]), cache)
        for step in range(budget):
            token = sample(self.model.backend.to_numpy(logits)[0, : self.sample_limit])
            yield token
            if token in self.stop_ids:
                self.finish_reason = "stop"
                return
            if step + 1 < budget:
                logits = self.model.forward(np.asarray([[token]]), cache)
        self.finish_reason = "length"

    def result(self, ids: list[int], decode: Callable[[list[int]], str], seconds: float) -> GenerationResult:
        """The finished generation of `ids` (as yielded); its text leaves out the stop token."""
        finish = self.finish_reason or "length"
        text = decode(ids[:-1] if finish == "stop" else ids)
        return GenerationResult(self.prompt_ids, ids, text, finish, seconds, self.model.backend.name)


def check_ids(ids: Sequence[int], config: Gpt2Config) -> list[int]:
    """The prompt as a list of ints, or a `GenerationError` saying what is wrong with it."""
    ids = [int(i) for i in ids]
    if not ids:
        raise GenerationError("the prompt has no tokens (start from <|endoftext|> for unconditional text)")
    bad = [i for i in ids if not 0 <= i < config.vocab_size]
    if bad:
        raise GenerationError(f"prompt token id {bad[0]} is outside the vocabulary [0, {config.vocab_size})")
    if len(ids) > config.n_positions:
        raise ContextLengthError(
            f"the prompt is {len(ids)} tokens long but the model's context holds {config.n_positions}"
        )
    return ids


def generate_tokens(
    model: Gpt2,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    params: SamplingParams | None = None,
    stop_ids: Iterable[int] = (),
    sample_limit: int | None = None,
) -> TokenStream:
    """Stream new token ids for one prompt (batch 1). Validates the prompt and the budget first."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, Integral) or max_new_tokens < 0:
        raise GenerationError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    prompt = check_ids(prompt_ids, model.config)
    return TokenStream(model, prompt, max_new_tokens, params or SamplingParams(), frozenset(stop_ids),
                       sample_limit)
