"""Every option of one generation, with one meaning wherever it is used (API, CLI, engine, server).

One decode step of one sequence, in the order the options apply:

    raw logits (float32 row) ──▶ logprobs: logit - logsumexp of the raw row, in float64 (if asked)
               └─▶ repetition penalty ─▶ presence/frequency penalties ─▶ logit bias     (`LogitsProcessor`)
                   ─▶ constraint mask: disallowed ids get -inf                        (`inferno.structured`)
                   ─▶ temperature ─▶ top-k ─▶ top-p ─▶ draw, or argmax when greedy    (`Sampler`)
                   ─▶ id ─▶ stop ids ─▶ text ─▶ stop strings ─▶ constraint complete    (`StopStrings`)

* ``repetition_penalty`` (> 0, 1 = off): Hugging Face / CTRL semantics over the prompt and the generated
  tokens: a seen token's logit is divided by the penalty when positive, multiplied when negative.
* ``presence_penalty``, ``frequency_penalty`` (each in [-2, 2], 0 = off): OpenAI semantics over the
  generated tokens only: ``logit - frequency * count - presence * (count > 0)``.
* ``logit_bias`` ({id: bias in [-100, 100]}): added to the logits.
* ``logprobs`` (0-20): the chosen token's log-probability and the N most likely alternatives, taken from
  the model's own distribution (the raw logits), not from the penalised or temperature-scaled one that
  was sampled: a score means the same whatever sampling settings produced the text (as OpenAI and vLLM
  report them by default).
* ``stop`` (up to 16 strings), ``stop_ids``: generation ends as soon as the text contains a stop string
  (which is not part of the text) or a stop id is produced.
* ``constraint`` (an `inferno.structured.Constraint`, needs a tokenizer): only ids the constraint allows
  may be drawn, an end-of-text id only where the text may end; the sequence ends ("stop") once the
  constraint is complete and nothing may follow. Logprobs are then those of the masked distribution
  (the raw logits with the disallowed ids removed, renormalised): alternatives are allowed ids only, and
  a forced id (the only one allowed, `Step.forced`) has logprob 0 and is taken without a draw.

`SequenceState` holds what one sequence carries from step to step; the batch-1 loop and the engine both
call its `step`, so a request gives the same tokens whichever path runs it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from numbers import Integral, Real
from typing import Any, Protocol

import numpy as np

from inferno.sampling import Sampler, SamplingError, SamplingParams, top_k_candidates


class ConstraintMatcher(Protocol):
    """One sequence's place in its constraint (`inferno.structured`, which sits above this module: its
    errors are OptionErrors), as the step uses it."""

    allowed_count: int
    finished: bool

    def mask(self, vocab_size: int) -> np.ndarray: ...

    def consume(self, token: int) -> None: ...


class Constraint(Protocol):
    """What the step needs of an `inferno.structured.Constraint`: its kind, and a matcher per sequence."""

    kind: str

    def start(self, tokenizer: Any) -> ConstraintMatcher: ...

MAX_STOP_STRINGS = 16
MAX_LOGPROBS = 20
MAX_ABS_PENALTY = 2.0
MAX_ABS_BIAS = 100.0


class OptionError(SamplingError):
    """A generation option is invalid; `field` names it (as the API spells it), `reason` says why."""


def _number(name: str, value, lo: float, hi: float | None = None, *, open_lo: bool = False) -> float:
    # Every numeric option has a lower bound; only some have an upper one.
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise OptionError(name, f"must be a finite number, got {value!r}")
    if (value <= lo if open_lo else value < lo) or (hi is not None and value > hi):
        bounds = f"{'>' if open_lo else '>='} {lo:g}" + ("" if hi is None else f" and <= {hi:g}")
        raise OptionError(name, f"must be {bounds}, got {value!r}")
    return float(value)


def _token_id(name: str, value) -> int:
    # JSON object keys are strings: accept "50256" as well as 50256, nothing fuzzier. (One "-" at most, and
    # decimal digits only: "--5" and "²" pass isdigit() after lstrip("-") but int() refuses them.)
    if isinstance(value, str) and value.strip().removeprefix("-").isdecimal():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 0:
        raise OptionError(name, f"must hold token ids (integers >= 0), got {value!r}")
    return int(value)


@dataclass(frozen=True)
class GenerationOptions:
    """How one sequence is generated. Defaults: greedy, no penalties, no bias, no stop strings.

    temperature 0 means greedy; top_k 0 and top_p 1 mean "no cut"; seed None draws fresh entropy.
    Values are checked here, once; `check_vocab` checks token ids against a model's vocabulary.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_ids: frozenset[int] = frozenset()
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    logprobs: int | None = None
    constraint: Constraint | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise once, here
        try:
            set_(self, "sampling", SamplingParams(self.temperature, self.top_k, self.top_p, self.seed))
        except SamplingError as exc:
            raise OptionError(exc.field, exc.reason) from None

        stop = self.stop
        if stop is None:
            stop = ()
        elif isinstance(stop, str):
            stop = (stop,)
        elif isinstance(stop, Mapping) or not isinstance(stop, Iterable):
            raise OptionError("stop", f"must be a string or a list of strings, got {stop!r}")
        stop = tuple(stop)
        for s in stop:
            if not isinstance(s, str) or not s:
                raise OptionError("stop", f"must hold non-empty strings, got {s!r}")
        if len(stop) > MAX_STOP_STRINGS:
            raise OptionError("stop", f"takes at most {MAX_STOP_STRINGS} strings, got {len(stop)}")
        set_(self, "stop", tuple(dict.fromkeys(stop)))  # duplicates removed, order kept

        ids = () if self.stop_ids is None else self.stop_ids
        if isinstance(ids, (str, bytes, Mapping)) or not isinstance(ids, Iterable):
            raise OptionError("stop_ids", f"must be a list of token ids, got {ids!r}")
        set_(self, "stop_ids", frozenset(_token_id("stop_ids", i) for i in ids))

        set_(self, "repetition_penalty",
             _number("repetition_penalty", self.repetition_penalty, 0.0, open_lo=True))
        for name in ("presence_penalty", "frequency_penalty"):
            set_(self, name, _number(name, getattr(self, name), -MAX_ABS_PENALTY, MAX_ABS_PENALTY))

        bias = {} if self.logit_bias is None else self.logit_bias
        if not isinstance(bias, Mapping):
            raise OptionError("logit_bias", f"must map token ids to biases, got {bias!r}")
        clean: dict[int, float] = {}
        for key, value in bias.items():
            clean[_token_id("logit_bias", key)] = _number(f"logit_bias[{key!r}]", value, -MAX_ABS_BIAS,
                                                          MAX_ABS_BIAS)
        set_(self, "logit_bias", clean)

        n = self.logprobs
        if n is not None and (isinstance(n, bool) or not isinstance(n, Integral)
                              or not 0 <= n <= MAX_LOGPROBS):
            raise OptionError("logprobs", f"must be an integer in [0, {MAX_LOGPROBS}] (or None), got {n!r}")
        set_(self, "logprobs", None if n is None else int(n))

        c = self.constraint  # duck-typed: inferno.structured sits above this module
        if c is not None and not (isinstance(getattr(c, "kind", None), str)
                                  and callable(getattr(c, "start", None))):
            raise OptionError("constraint", f"must be an inferno.structured.Constraint (or None), got "
                                            f"{type(c).__name__}")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_kwargs(cls, **kwargs) -> GenerationOptions:
        """Like the constructor, but an unknown name is an `OptionError` listing the known ones."""
        unknown = sorted(set(kwargs) - set(cls.names()))
        if unknown:
            raise OptionError(unknown[0], f"is not a generation option (known: {', '.join(cls.names())})")
        return cls(**kwargs)

    @property
    def penalised(self) -> bool:
        """Whether any option changes the logits before sampling."""
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0 or bool(self.logit_bias))

    def check_vocab(self, vocab_size: int) -> None:
        """Every token id named by an option is a token of a vocabulary of `vocab_size`."""
        for name, ids in (("stop_ids", self.stop_ids), ("logit_bias", self.logit_bias)):
            bad = sorted(i for i in ids if i >= vocab_size)
            if bad:
                raise OptionError(name, f"names token id {bad[0]}, outside the vocabulary [0, {vocab_size})")


class LogitsProcessor:
    """Repetition, presence and frequency penalties, then logit bias, for one sequence.

    It remembers which tokens the sequence holds (prompt and generated) and how often each was
    generated, so that a step costs a few indexed operations on those ids, not a pass over the vocabulary.
    """

    def __init__(self, options: GenerationOptions, prompt_ids: Sequence[int]) -> None:
        self.options = options
        self._seen = np.unique(np.asarray(prompt_ids, dtype=np.int64))  # for the repetition penalty
        self._counts: dict[int, int] = {}  # generated ids → count, for presence and frequency
        self._count_ids = np.zeros(0, dtype=np.int64)
        self._count_values = np.zeros(0, dtype=np.float64)
        self._bias_ids = np.fromiter(options.logit_bias.keys(), dtype=np.int64, count=len(options.logit_bias))
        self._bias_values = np.fromiter(options.logit_bias.values(), dtype=np.float64,
                                        count=len(options.logit_bias))

    def append(self, token: int) -> None:
        """Record a generated token."""
        if token not in self._counts:
            pos = np.searchsorted(self._seen, token)
            if pos == len(self._seen) or self._seen[pos] != token:
                self._seen = np.insert(self._seen, pos, token)
        self._counts[token] = self._counts.get(token, 0) + 1
        self._count_ids = np.fromiter(self._counts.keys(), dtype=np.int64, count=len(self._counts))
        self._count_values = np.fromiter(self._counts.values(), dtype=np.float64, count=len(self._counts))

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        """The processed logits (float64, a new array; `logits` is left as it is)."""
        o = self.options
        z = np.array(logits, dtype=np.float64)
        if o.repetition_penalty != 1.0 and self._seen.size:
            # A prompt may hold ids past the sampled ones (a vocabulary padded past the tokenizer's).
            seen = self._seen[: np.searchsorted(self._seen, z.shape[0])]
            s = z[seen]
            # A tiny penalty can overflow a logit to +/-inf: the sampler puts all the mass there, as meant.
            with np.errstate(over="ignore"):
                z[seen] = np.where(s < 0, s * o.repetition_penalty, s / o.repetition_penalty)
        if (o.frequency_penalty or o.presence_penalty) and self._count_ids.size:
            z[self._count_ids] -= o.frequency_penalty * self._count_values + o.presence_penalty
        if self._bias_ids.size:
            z[self._bias_ids] += self._bias_values
        return z


@dataclass(frozen=True)
class TokenLogprob:
    """One new token's log-probability under the model, and the `top` alternatives (id, logprob),
    most likely first (ties by id)."""

    id: int
    logprob: float
    top: list[tuple[int, float]]

    def to_dict(self, token_text=None) -> dict:
        """JSON form; with `token_text` (id → str) each entry carries its decoded text as well."""
        def entry(i: int, lp: float) -> dict:
            return {"id": i, **({"text": token_text(i)} if token_text else {}), "logprob": lp}

        return {**entry(self.id, self.logprob), "top": [entry(i, lp) for i, lp in self.top]}


def logsumexp(logits: np.ndarray) -> np.ndarray:
    """log(sum(exp(logits))) over the last axis, in float64: one temporary the size of the input (a
    float scalar for one row). A row's log-probabilities are ``float64(logit) - logsumexp``."""
    m = np.max(logits, axis=-1, keepdims=True).astype(np.float64)
    z = np.asarray(logits, dtype=np.float64) - m
    np.exp(z, out=z)
    return m[..., 0] + np.log(z.sum(axis=-1))


def top_logprobs(logits: np.ndarray, n: int, lse: float) -> list[tuple[int, float]]:
    """The n most likely (id, logprob) of one row of logits whose logsumexp is `lse`, most likely first,
    ties broken by id (float32 → float64 keeps the order, so the cut is made on the row as it is)."""
    if n <= 0:
        return []
    n = min(n, logits.shape[-1])
    if n < logits.shape[-1]:
        # Every id at least as likely as the n-th (argpartition alone would pick any of the ids tied at
        # the cut, not the smallest), found above block maxima: a partition of the row took most of it.
        ids = top_k_candidates(logits, n)
    else:
        ids = np.arange(n)
    ids = ids[np.lexsort((ids, -logits[ids]))][:n]
    return [(int(i), float(np.float64(logits[i]) - lse)) for i in ids]


def masked_token_logprob(logits: np.ndarray, allowed: np.ndarray, token: int, n: int) -> TokenLogprob:
    """`token_logprob` of the distribution a constraint leaves: the raw `logits` with the ids not
    `allowed` removed (renormalised over the allowed ones); the alternatives are allowed ids only."""
    z = np.where(allowed, logits, -np.inf)
    lp = token_logprob(z, token, min(n, int(np.count_nonzero(allowed))))
    return lp


def token_logprob(logits: np.ndarray, token: int, n: int) -> TokenLogprob:
    """`token`'s log-probability under the raw `logits` row and the n most likely alternatives: every
    value is ``float64(logit) - logsumexp``, so a token's logprob and its entry among the top are the
    same float."""
    lse = float(logsumexp(logits))
    return TokenLogprob(int(token), float(np.float64(logits[token]) - lse), top_logprobs(logits, n, lse))


class StopStrings:
    """Cuts streamed text at the first stop string, holding back only what could still become one.

    `feed` takes the next piece of text and returns what can be released, and the stop string that
    ended the text (None while none has). Released text never contains a stop string, and all releases
    plus `flush` join to the longest prefix of the text before the first stop string.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        self._held = ""

    def feed(self, piece: str) -> tuple[str, str | None]:
        text = self._held + piece
        # The earliest occurrence of any stop string. Released text cannot contain the start of one:
        # whatever could still grow into a stop string is held back below.
        first, matched = len(text) + 1, None
        for s in self.stops:
            i = text.find(s)
            if 0 <= i < first:
                first, matched = i, s
        if matched is not None:
            self._held = ""
            return text[:first], matched
        # Hold back the longest tail that is the beginning of some stop string.
        hold = 0
        for s in self.stops:
            for start in range(max(0, len(text) - len(s) + 1), len(text) - hold):
                if s.startswith(text[start:]):
                    hold = len(text) - start
                    break
        self._held = text[len(text) - hold:] if hold else ""
        return text[: len(text) - hold], None

    def flush(self) -> str:
        """The held-back text, once no more text will come (it did not become a stop string)."""
        held, self._held = self._held, ""
        return held


class TextDecoder(Protocol):
    """What `SequenceState` needs of a detokenizer (`inferno.tokenizer.IncrementalDecoder` is one)."""

    def feed(self, token_id: int) -> str: ...

    def flush(self) -> str: ...


@dataclass
class Step:
    """What one decode step produced for one sequence."""

    id: int
    text: str  # the text this token released (may be empty while held back)
    logprob: TokenLogprob | None = None
    finish_reason: str | None = None  # "stop" when this token ended the sequence
    forced: bool = False  # the constraint allowed this token only


class SequenceState:
    """One sequence between steps: its options, penalty counts, sampler (and its RNG), stop matching,
    and the text and logprobs produced so far.

    Without a `decoder`, no text is tracked and stop strings cannot be used; a constraint needs a decoder
    that knows its tokenizer (``decoder.tokenizer``, as `inferno.tokenizer.IncrementalDecoder` does).
    """

    def __init__(
        self,
        options: GenerationOptions,
        prompt_ids: Sequence[int],
        decoder: TextDecoder | None = None,
        extra_stop_ids: Iterable[int] = (),
    ) -> None:
        if options.stop and decoder is None:
            raise OptionError("stop", "needs a tokenizer to match text (use inferno.load(...).generate)")
        self.options = options
        self.stop_ids = options.stop_ids | frozenset(extra_stop_ids)
        self.sampler = Sampler(options.sampling)
        self.processor = LogitsProcessor(options, prompt_ids) if options.penalised else None
        self.decoder = decoder
        self.stop_strings = StopStrings(options.stop) if options.stop else None
        self.matcher: ConstraintMatcher | None = None
        if options.constraint is not None:
            tokenizer = getattr(decoder, "tokenizer", None)
            if tokenizer is None:
                raise OptionError("constraint", "needs a tokenizer (use inferno.load(...).generate)")
            self.matcher = options.constraint.start(tokenizer)
            # The end of text the constraint allows ends the sequence, even where stop ids leave it out:
            # it is never part of constrained text.
            self.stop_ids = self.stop_ids | frozenset(tokenizer.eos_ids)
        self.ids: list[int] = []
        self.pieces: list[str] = []
        self.logprobs: list[TokenLogprob] | None = [] if options.logprobs is not None else None
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None  # the stop string or id that ended the sequence

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def choose(self, logits: np.ndarray) -> int:
        """The next id for this row of logits (penalties and bias, the constraint's mask, the sampler)."""
        z = self.processor(logits) if self.processor is not None else logits
        if self.matcher is not None:
            allowed = self.matcher.mask(z.shape[0])
            if self.matcher.allowed_count == 1:  # forced: no draw
                return int(np.argmax(allowed))
            if self.matcher.allowed_count <= z.shape[0] // 2:
                # Few allowed: sample among them alone, at a fraction of the cost. The same distribution
                # as the whole row with the others at -inf; without a top-k/top-p cut the same draw too
                # (their weight, exactly 0, changes no running sum).
                ids = np.flatnonzero(allowed)
                return int(ids[self.sampler(z[ids])])
            z = np.where(allowed, z, -np.inf)
        return self.sampler(z)

    def step(self, logits: np.ndarray, *, last: bool = False, token: int | None = None) -> Step:
        """Choose the next token from `logits` (one row, the ids that may be sampled), record it, and
        say what text it releases and whether it ends the sequence. `last`: no token may follow this
        one (the budget or the context is spent), so the sequence ends with "length" unless it stops.
        `token`: the id already chosen from these logits (speculative decoding's verification)."""
        step = self._step(logits, token)
        if last and step.finish_reason is None:
            step.text += self.finish("length")
            step.finish_reason = self.finish_reason
        return step

    def _step(self, logits: np.ndarray, token: int | None = None) -> Step:
        token = self.choose(logits) if token is None else int(token)
        forced = False
        lp = None
        if self.matcher is not None:
            forced = self.matcher.allowed_count == 1
            if self.logprobs is not None:
                allowed = self.matcher.mask(logits.shape[0])
                lp = masked_token_logprob(logits, allowed, token, self.options.logprobs)
            if token not in self.stop_ids:
                self.matcher.consume(token)
        elif self.logprobs is not None:
            lp = token_logprob(logits, token, self.options.logprobs)
        if lp is not None:
            self.logprobs.append(lp)
        self.ids.append(token)
        if self.processor is not None:
            self.processor.append(token)
        if token in self.stop_ids:
            return self._finish(Step(token, self._tail(), lp, forced=forced), token)
        piece = self.decoder.feed(token) if self.decoder is not None else ""
        matched = None
        if self.stop_strings is not None:
            piece, matched = self.stop_strings.feed(piece)
        if matched is not None:
            self.pieces.append(piece)
            return self._finish(Step(token, piece, lp, forced=forced), matched)
        self.pieces.append(piece)
        if self.matcher is not None and self.matcher.finished:
            # The constraint is complete and nothing may follow: the sequence ends here.
            piece += self._tail()
            self.finish_reason = "stop"
            return Step(token, piece, lp, "stop", forced)
        return Step(token, piece, lp, forced=forced)

    def finish(self, reason: str = "length") -> str:
        """End the sequence for `reason` (no more tokens will come); returns the text still held back.

        A stop string completed by that text makes the reason "stop"."""
        if self.finish_reason is not None:
            return ""
        tail = self._tail()
        self.finish_reason = "stop" if self.stop_reason is not None else reason
        return tail

    def _tail(self) -> str:
        """Text held back by the decoder (a split character) and by the stop matcher, released at the end."""
        tail = self.decoder.flush() if self.decoder is not None else ""
        if self.stop_strings is not None:
            tail, matched = self.stop_strings.feed(tail)
            if matched is None:
                tail += self.stop_strings.flush()
            else:
                self.stop_reason = matched
        self.pieces.append(tail)
        return tail

    def _finish(self, step: Step, reason: str | int) -> Step:
        step.finish_reason = self.finish_reason = "stop"
        if self.stop_reason is None:
            self.stop_reason = reason
        return step
