"""The generation loop: prefill the prompt, then one cached decode step per new token.

`generate_tokens` returns a `TokenStream`: iterate it for token ids, or call `steps()` for what each step
produced (id, released text, logprob, finish reason). The options (`inferno.options`) decide every
token; the stream ends with finish reason "stop" (a stop id such as ``<|endoftext|>``, or a stop
string) or "length" (`max_new_tokens` or the model's context, n_positions, ran out).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from numbers import Integral

import numpy as np

from inferno.models.causal_lm import CausalLM, ModelConfig
from inferno.options import GenerationOptions, SequenceState, Step, TextDecoder, TokenLogprob
from inferno.sampling import SamplingParams
from inferno.speculative import Speculation, new_speculation, speculative_steps


class GenerationError(ValueError):
    """A bad generation request (prompt ids, budget); the message says which."""


class ContextLengthError(GenerationError):
    """The prompt does not fit the model's context window."""


class PromptTypeError(GenerationError, TypeError):
    """A prompt that is neither text nor a sequence of int token ids (bytes, floats, None, ...)."""


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    ids: list[int]  # the new ids, including the stop id or the token that completed a stop string
    text: str  # the new text, without the stop token or stop string (and nothing after it)
    finish_reason: str  # "stop" or "length"
    seconds: float = 0.0
    backend: str = ""
    logprobs: list[TokenLogprob] | None = None  # one per new id, when asked for
    stop_reason: str | int | None = None  # the stop string or stop id that ended it

    @property
    def new_tokens(self) -> int:
        return len(self.ids)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self, token_text: Callable[[int], str] | None = None) -> dict:
        """The CLI's --json object; `token_text` (id → text) adds each logprob entry's text."""
        out = {"prompt_ids": self.prompt_ids, "ids": self.ids, "text": self.text,
               "finish_reason": self.finish_reason, "stop_reason": self.stop_reason, "backend": self.backend,
               "new_tokens": self.new_tokens, "seconds": round(self.seconds, 6),
               "tokens_per_second": round(self.tokens_per_second, 3)}
        if self.logprobs is not None:
            out["logprobs"] = [lp.to_dict(token_text) for lp in self.logprobs]
        return out


@dataclass
class TokenStream:
    """Iterator over new token ids; `finish_reason` is set once it is exhausted.

    With a `decoder` the stream also tracks the text (`steps()` gives each step's released piece), which
    stop strings need.
    """

    model: CausalLM
    prompt_ids: list[int]
    max_new_tokens: int
    options: GenerationOptions = field(default_factory=GenerationOptions)
    #: Ids that end the sequence besides the options' own stop_ids (the pipeline adds <|endoftext|>).
    extra_stop_ids: frozenset[int] = frozenset()
    #: Sample only among ids below this (a model whose vocabulary is padded past the tokenizer's).
    sample_limit: int | None = None
    decoder: TextDecoder | None = None
    #: Speculative decoding (`inferno.speculative`), or None; `speculation.stats` counts its drafts.
    speculation: Speculation | None = None
    state: SequenceState = field(init=False)

    def __post_init__(self) -> None:
        self.state = SequenceState(self.options, self.prompt_ids, self.decoder, self.extra_stop_ids)

    @property
    def stop_ids(self) -> frozenset[int]:
        return self.state.stop_ids

    @property
    def finish_reason(self) -> str | None:
        return self.state.finish_reason

    def steps(self) -> Iterator[Step]:
        """Each new token as a `Step`; the last one carries the finish reason and any held-back text."""
        prompt = self.prompt_ids
        budget = new_token_budget(self.model.config, len(prompt), self.max_new_tokens)
        if budget <= 0:
            self.state.finish("length")
            return
        if self.speculation is not None:
            yield from speculative_steps(self.model, prompt, budget, self.state, self.speculation,
                                         self.sample_limit)
            return
        # The last new token is never fed back, so the cache needs room for one position less.
        cache = self.model.new_cache(1, len(prompt) + budget - 1)
        # Overflow is detected on the logits (check_logits), with a better message than NumPy's warnings.
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            logits = self.model.forward(np.asarray([prompt]), cache)
        for i in range(budget):
            # Shape and finiteness of the one row sampled, on the host copy (cheap; see check_logits).
            host = self.model.check_logits(self.model.backend.to_numpy(logits), 1)
            step = self.state.step(host[0, : self.sample_limit], last=i + 1 == budget)
            yield step
            if step.finish_reason is not None:
                return
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                logits = self.model.forward(np.asarray([[step.id]]), cache)

    def __iter__(self) -> Iterator[int]:
        for step in self.steps():
            yield step.id

    def result(self, seconds: float = 0.0) -> GenerationResult:
        """The generation so far (all of it once the stream is exhausted)."""
        s = self.state
        return GenerationResult(self.prompt_ids, list(s.ids), s.text, s.finish_reason or "length", seconds,
                                self.model.backend.name, s.logprobs, s.stop_reason)


def _show(value: object) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a value that cannot even be shown
        text = "?"
    return text if len(text) <= 40 else text[:37] + "..."


def token_ids(ids: object) -> list[int]:
    """A prompt of token ids as a list of ints, or a `PromptTypeError` saying what was given.

    Accepted: a sequence (list, tuple, range, 1-D integer NumPy array, ...) of ints or NumPy integers.
    Rejected, rather than converted: text as bytes or bytearray (their items are ints, but they are text:
    decode them to str), floats (1.9 would become 1), strings ('15496'), booleans, and things that are
    not sequences (dicts, sets, None, a number).
    """
    what = type(ids).__name__
    if isinstance(ids, (bytes, bytearray, memoryview)):
        raise PromptTypeError(f"the prompt is {what} {_show(ids)}: give text as a str (decode the bytes "
                              "first) or token ids as a list of ints")
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise PromptTypeError(f"a NumPy prompt must be a 1-D array of integer token ids, got a "
                                  f"{ids.ndim}-D array of {ids.dtype}")
        return ids.tolist()
    if not isinstance(ids, Sequence) or isinstance(ids, str):
        raise PromptTypeError(f"the prompt must be a str or a sequence of int token ids, got {what} "
                              f"{_show(ids)}")
    out = list(ids)
    for n, i in enumerate(out):
        if type(i) is not int:
            if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
                raise PromptTypeError(f"prompt token ids must be ints, got {_show(i)} "
                                      f"({type(i).__name__}) at index {n}")
            out[n] = int(i)
    return out


def check_ids(ids: Sequence[int], config: ModelConfig) -> list[int]:
    """The prompt as a list of ints, or a `GenerationError` saying what is wrong with it (a
    `PromptTypeError` when it is not a sequence of ints at all; see `token_ids`)."""
    ids = token_ids(ids)
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


def check_request(config: ModelConfig, prompt_ids: Sequence[int], max_new_tokens: int,
                  options: Iterable[GenerationOptions], sample_limit: int | None = None) -> list[int]:
    """Everything about one request that can be checked before it runs: the budget, the prompt (see
    `check_ids`) and the token ids the options name (against `sample_limit`, else the vocabulary).
    Returns the prompt as a list of ints; raises `GenerationError` or `OptionError`. The batch-1 loop,
    the engine and `inferno batch` all check requests through it."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, Integral) or max_new_tokens < 0:
        raise GenerationError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    prompt = check_ids(prompt_ids, config)
    for o in options:
        o.check_vocab(config.vocab_size if sample_limit is None else sample_limit)
    return prompt


def new_token_budget(config: ModelConfig, prompt_len: int, max_new_tokens: int) -> int:
    """How many new tokens a prompt may still get: `max_new_tokens`, bounded by the context window."""
    return min(int(max_new_tokens), config.n_positions - prompt_len)


def generate_tokens(
    model: CausalLM,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    options: GenerationOptions | SamplingParams | None = None,
    stop_ids: Iterable[int] = (),
    sample_limit: int | None = None,
    decoder: TextDecoder | None = None,
    *,
    speculative: str | None = None,
    draft_model: CausalLM | None = None,
    num_speculative_tokens: int | None = None,
    adaptive: bool = True,
) -> TokenStream:
    """Stream new token ids for one prompt (batch 1). Validates the prompt, the budget and the options'
    token ids first. `stop_ids` end the stream in addition to the options' own.

    Speculative decoding (`inferno.speculative`): `speculative` "ngram" (prompt lookup) or "draft" (the
    default when `draft_model`, a model with the same vocabulary, is given); `num_speculative_tokens`: K,
    the drafts of the first round (it adapts unless `adaptive` is False). Greedy output is the same as
    without; sampled output has the same distribution."""
    if isinstance(options, SamplingParams):
        p = options
        options = GenerationOptions(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, seed=p.seed)
    options = options or GenerationOptions()
    prompt = check_request(model.config, prompt_ids, max_new_tokens, [options], sample_limit)
    stream = TokenStream(model, prompt, max_new_tokens, options, frozenset(stop_ids), sample_limit, decoder)
    if speculative is not None or draft_model is not None or num_speculative_tokens is not None:
        stream.speculation = new_speculation(model, stream.state, speculative, draft_model,
                                             num_speculative_tokens, sample_limit, adaptive)
    return stream
