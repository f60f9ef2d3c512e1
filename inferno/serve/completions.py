"""One ``/v1/completions`` request: its prompts and options, its choices, their logprobs and chunks.

    request ─▶ plan_request (fields → GenerationOptions, one per choice of a prompt) ─▶ encode_prompts
            ─▶ Engine.submit_many per prompt (its n choices share the prefill) ─▶ Completion
            ─▶ Completion.stream() (SSE chunks) or Completion.collect() (one response)

Conventions (where OpenAI leaves room, as vLLM does):

* Choice ``index`` is ``prompt_index * n + j``; choice j of every prompt samples with ``seed + j``.
* ``temperature`` defaults to 1 (OpenAI's default), ``max_tokens`` to 16; ``max_tokens`` 0 is only
  allowed with ``echo`` (the prompt's logprobs, nothing generated).
* Token texts in ``logprobs`` (``tokens`` and the keys of ``top_logprobs``) are the token's bytes as
  UTF-8; a token that is not valid UTF-8 on its own (part of a multi-byte character) is written
  ``bytes:`` followed by ``\\xNN`` for each byte, as OpenAI's API wrote them (``bytes:\\xe2\\x80``), so
  that no two tokens share a text. ``top_logprobs`` holds the N most likely tokens, most likely first,
  plus the chosen token when it is not among them, with the very float of ``token_logprobs``.
* ``text_offset`` of a token is the number of characters of the choice's ``text`` (the echoed prompt
  included) released before it: where its text starts, except that a character split across tokens
  starts at the token that completes it, and text held back to match a stop string starts later.
* A text prompt is encoded with its special tokens (``<|endoftext|>`` is id 50256, as OpenAI's and
  vLLM's servers read it; `Pipeline.generate` reads it as plain text); an empty one is <|endoftext|>.
* Log-probabilities below -9999 (-inf) are reported as -9999, as vLLM does: JSON has no infinity.
* The prompt's logprobs (``echo``) are `Pipeline.score`'s; the first token has none (null in both
  lists). The new tokens' are the engine's (`GenerationOptions.logprobs`): the raw model distribution,
  before penalties and temperature. The stop token (<|endoftext|>) and the token that completed a stop
  string are listed and counted in ``usage``; neither the stop token nor the stop string is in the text.
* A choice ended by a server shutdown (after --grace-seconds) has finish_reason ``"cancelled"``.
* Extension ``return_token_ids: true`` (default false, so OpenAI's shape is unchanged): with
  ``logprobs``, the logprobs object also has ``token_ids`` (each token's id, parallel to ``tokens``)
  and ``top_token_ids`` (per token, the ids of its ``top_logprobs`` entries in their order, the chosen
  token last when it is not among the top N; null where ``top_logprobs`` is). The playground uses them
  to show ids: token texts alone cannot be mapped back to ids by a client without the vocabulary.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferno.engine import Handle
from inferno.options import GenerationOptions, OptionError, Step, TokenLogprob
from inferno.scoring import ScoreResult
from inferno.serve.errors import ApiError
from inferno.serve.schemas import CompletionRequest, GenerationRequest
from inferno.tokenizer import Tokenizer

DEFAULT_MAX_TOKENS = 16
DEFAULT_TEMPERATURE = 1.0

# OptionError.field → the request field that carries it (the rest are spelled alike).
_PARAMS = {"stop_ids": "stop_token_ids"}


def _token_bytes(tokenizer: Tokenizer) -> Callable[[int], bytes]:
    # The tokenizer has no public id → bytes accessor yet; prefer one if it grows it.
    return getattr(tokenizer, "token_bytes", None) or tokenizer._token_bytes


def token_text(raw: bytes) -> str:
    """A token's text as logprobs show it: its UTF-8 text, or ``bytes:\\xNN...`` if it is not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


class TokenTexts:
    """Every token id's text (see `token_text`), computed once per model."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        get = _token_bytes(tokenizer)
        texts, raw = [], []
        for i in range(tokenizer.vocab_size):
            try:
                raw.append(get(i))
                texts.append(token_text(raw[-1]))
            except ValueError:  # an id no token uses (a sparse vocabulary): never sampled or accepted
                raw.append(b"")
                texts.append(f"token_id:{i}")
        self._texts = texts
        self._bytes = raw

    def __getitem__(self, i: int) -> str:
        return self._texts[i]

    def bytes_of(self, i: int) -> bytes:
        """The token's bytes (empty for an id no token uses)."""
        return self._bytes[i]

    def __len__(self) -> int:
        return len(self._texts)


#: The floor of reported log-probabilities (as vLLM's): JSON has no -inf (nor NaN, which lands here too).
MIN_LOGPROB = -9999.0


def clamp_logprob(value: float) -> float:
    return value if value > MIN_LOGPROB else MIN_LOGPROB


def _top(texts: TokenTexts, chosen: int, chosen_lp: float, top: Sequence[tuple[int, float]] | None,
         ) -> dict[str, float]:
    out = {texts[i]: clamp_logprob(lp) for i, lp in top or ()}
    out.setdefault(texts[chosen], clamp_logprob(chosen_lp))  # the chosen token, when not among the top N
    return out


def _top_ids(chosen: int, top: Sequence[tuple[int, float]] | None) -> list[int]:
    """The ids of `_top`'s entries, in its order (texts are unique per id, so the two lists pair up)."""
    out = [i for i, _ in top or ()]
    if chosen not in out:
        out.append(chosen)
    return out


# ------------------------------------------------------------------------------------------ the plan


@dataclass
class Plan:
    """What a request asks for, checked: raw prompts (text or ids), one options per choice of a prompt."""

    prompts: list[str | list[int]]
    options: list[GenerationOptions]
    max_tokens: int
    stop_ids: tuple[int, ...]
    echo: bool
    logprobs: int | None
    stream: bool
    include_usage: bool
    return_ids: bool = False  # the return_token_ids extension
    ids: list[list[int]] = field(default_factory=list)  # the prompts' ids (`encode_prompts`)

    @property
    def n(self) -> int:
        return len(self.options)


def _abbreviated(digits: str) -> str:
    return digits if len(digits) <= 40 else f"{digits[:20]}...{digits[-20:]} ({len(digits)} digits)"


def _bias(bias: dict[str, float], sample_limit: int) -> dict[int, float]:
    """logit_bias with int keys; a key too long to be an id is refused before int() (which would
    refuse more than sys.get_int_max_str_digits() digits with a ValueError)."""
    out = {}
    for key, value in bias.items():
        digits = key.lstrip("0") or "0"
        if len(digits) > len(str(sample_limit)):
            raise ApiError(400, f"logit_bias names token id {_abbreviated(digits)}, outside the vocabulary "
                           f"[0, {sample_limit})", param="logit_bias")
        out[int(digits)] = value
    return out


def check_n(req: GenerationRequest, slots: int) -> int:
    n = req.n or 1
    if n > slots:
        raise ApiError(400, f"n={n} needs {n} KV slots at once; this server has {slots} (--slots)", param="n")
    return n


def choice_options(req: GenerationRequest, *, n: int, logprobs: int | None, sample_limit: int,
                   extra_stop: Sequence[str] = ()) -> list[GenerationOptions]:
    """The options of a prompt's n choices (choice j samples with seed + j), from the fields every
    generation request shares; an `ApiError` (400) names the field."""
    top_k = req.top_k or 0
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or ())
    base = dict(
        temperature=DEFAULT_TEMPERATURE if req.temperature is None else req.temperature,
        top_k=0 if top_k == -1 else top_k,
        top_p=1.0 if req.top_p is None else req.top_p,
        stop=(*stop, *extra_stop),
        stop_ids=req.stop_token_ids or (),
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        logit_bias=_bias(req.logit_bias or {}, sample_limit),
        logprobs=logprobs,
    )
    try:
        seeds = [None if req.seed is None else req.seed + j for j in range(n)]
        options = [GenerationOptions(**base, seed=seed) for seed in seeds]
        options[0].check_vocab(sample_limit)
    except OptionError as exc:
        name = exc.field.split("[")[0]
        param = _PARAMS.get(name, name)
        raise ApiError(400, f"{param} {exc.reason}", param=param) from None
    return options


def plan_request(req: CompletionRequest, *, eos_id: int, sample_limit: int, slots: int, queue: int) -> Plan:
    """Check what the schema cannot (unsupported fields, option rules, engine limits) and build the
    options; an `ApiError` (400) names the field."""
    # (best_of other than 1 and a suffix are refused by the schema.)
    n = check_n(req, slots)
    echo = bool(req.echo)
    max_tokens = DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
    if max_tokens == 0 and not echo:
        raise ApiError(400, "max_tokens must be at least 1 (0 is allowed with echo: the prompt only)",
                       param="max_tokens")

    p = req.prompt
    if not p and not isinstance(p, str):  # the schema says so too
        raise ApiError(400, "prompt must not be an empty list", param="prompt")
    if isinstance(p, str):
        prompts: list[str | list[int]] = [p]
    elif isinstance(p[0], (str, list)):
        prompts = list(p)
    else:
        prompts = [list(p)]
    if len(prompts) > queue:
        raise ApiError(400, f"at most {queue} prompts per request (the wait queue holds {queue}, --queue); "
                       f"got {len(prompts)}", param="prompt")
    options = choice_options(req, n=n, logprobs=req.logprobs, sample_limit=sample_limit)
    return Plan(prompts, options, max_tokens, () if req.ignore_eos else (eos_id,), echo, req.logprobs,
                bool(req.stream), include_usage(req), bool(req.return_token_ids))


def include_usage(req: GenerationRequest) -> bool:
    return bool(req.stream and req.stream_options and req.stream_options.include_usage)


def encode_prompts(plan: Plan, tokenizer: Tokenizer, *, eos_id: int, sample_limit: int, context: int,
                   field: str = "prompt") -> None:
    """Token ids of every prompt (text: <|endoftext|> is the special token; empty: <|endoftext|>),
    checked against the vocabulary and the context; errors name `field`. Runs in a worker thread: a
    long text takes a while."""
    ids_list = []
    for k, prompt in enumerate(plan.prompts):
        where = field if len(plan.prompts) == 1 else f"{field}[{k}]"
        ids = tokenizer.encode(prompt, allow_special=True) if isinstance(prompt, str) else prompt
        ids = ids or [eos_id]
        bad = next((i for i in ids if not 0 <= i < sample_limit), None)
        if bad is not None:
            raise ApiError(400, f"{where}: token id {bad} is outside the vocabulary [0, {sample_limit})",
                           param=field)
        if len(ids) > context:
            raise ApiError(400, f"This model's maximum context length is {context} tokens, but {where} is "
                           f"{len(ids)} tokens long; shorten it", param=field,
                           code="context_length_exceeded")
        ids_list.append(ids)
    plan.ids = ids_list


@dataclass
class EchoPart:
    """The echoed prompt of one prompt: its text and (when logprobs were asked for) their lists."""

    text: str
    logprobs: dict | None


def echo_part(ids: list[int], tokenizer: Tokenizer, texts: TokenTexts, score: ScoreResult | None,
              logprobs: int | None, return_ids: bool = False) -> EchoPart:
    """`score` is `Pipeline.score(ids, top_logprobs=logprobs)` (None for a one-token prompt)."""
    text = tokenizer.decode(ids)
    if logprobs is None:
        return EchoPart(text, None)
    decoder, offsets, at = tokenizer.incremental_decoder(), [], 0
    for i in ids:
        offsets.append(at)
        at += len(decoder.feed(i))
    token_lps: list[float | None] = [None]
    tops: list[dict | None] = [None]
    top_ids: list[list[int] | None] = [None]
    for k in range(1, len(ids)):
        lp = score.logprobs[k]
        top = score.top[k] if score.top is not None else None
        token_lps.append(clamp_logprob(lp))
        tops.append(_top(texts, ids[k], lp, top))
        top_ids.append(_top_ids(ids[k], top))
    out = {"tokens": [texts[i] for i in ids], "token_logprobs": token_lps, "top_logprobs": tops,
           "text_offset": offsets}
    if return_ids:
        out.update(token_ids=list(ids), top_token_ids=top_ids)
    return EchoPart(text, out)


# ------------------------------------------------------------------------------------------ running


class Observer:
    """What a completion reports as it runs (the metrics); these defaults do nothing."""

    def first_token(self, seconds: float) -> None: ...

    def next_token(self, seconds: float) -> None: ...

    def tokens(self, n: int) -> None: ...


@dataclass
class _Choice:
    index: int
    prompt: int
    handle: Handle
    text_len: int = 0  # characters of the choice's text released so far, the echo included
    sent: int = 0  # characters of the new text released so far
    finish_reason: str | None = None
    last_token_at: float | None = None
    lps: Any = None  # the accumulated logprobs (collect), in the format's shape


class Format:
    """How a completion's choices are written: OpenAI's legacy completions (this class), or chat
    (`inferno.serve.chat.ChatFormat`). `Completion` runs the choices; a format only shapes them."""

    id_prefix = "cmpl-"
    object = "text_completion"
    chunk_object = "text_completion"

    def __init__(self, texts: TokenTexts, return_ids: bool = False) -> None:
        self.texts = texts
        self.return_ids = return_ids

    def token_logprobs(self, t: TokenLogprob, text_offset: int) -> Any:
        """One new token's logprobs, as `extend` adds them to `empty_logprobs()`."""
        lp = {"tokens": [self.texts[t.id]], "token_logprobs": [clamp_logprob(t.logprob)],
              "top_logprobs": [_top(self.texts, t.id, t.logprob, t.top)], "text_offset": [text_offset]}
        if self.return_ids:
            lp.update(token_ids=[t.id], top_token_ids=[_top_ids(t.id, t.top)])
        return lp

    def empty_logprobs(self) -> Any:
        lps: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        if self.return_ids:
            lps.update(token_ids=[], top_token_ids=[])
        return lps

    def extend(self, lps: Any, more: Any) -> None:
        for key, values in more.items():
            lps[key].extend(values)

    def opening(self, index: int) -> dict | None:
        """A choice's first chunk before its text (chat: its role), or None."""
        return None

    def chunk_choice(self, index: int, text: str, lp: Any, finish_reason: str | None) -> dict:
        return {"index": index, "text": text, "logprobs": lp, "finish_reason": finish_reason}

    def choice(self, index: int, text: str, lps: Any, finish_reason: str | None) -> dict:
        return {"text": text, "index": index, "logprobs": lps, "finish_reason": finish_reason}


class Completion:
    """The choices of one request, running in the engine: `stream()` or `collect()` them, once."""

    def __init__(self, plan: Plan, handles: list[Handle], echoes: list[EchoPart] | None, texts: TokenTexts,
                 model_id: str, observer: Observer | None = None, started: float | None = None,
                 fmt: Format | None = None) -> None:
        self.plan = plan
        self.texts = texts
        self.model_id = model_id
        self.observer = observer or Observer()
        self.started = time.perf_counter() if started is None else started
        self.fmt = fmt or Format(texts, plan.return_ids)
        self.id = f"{self.fmt.id_prefix}{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.echoes = echoes
        n = plan.n
        self.choices = [_Choice(k, k // n, h) for k, h in enumerate(handles)]

    # -- usage
    @property
    def prompt_tokens(self) -> int:
        return sum(len(ids) for ids in self.plan.ids)

    @property
    def completion_tokens(self) -> int:
        return sum(len(c.handle.state.ids) for c in self.choices)

    def usage(self) -> dict:
        p, c = self.prompt_tokens, self.completion_tokens
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def cancel(self) -> None:
        """End every choice still running (the client left); a no-op for those that ended."""
        for c in self.choices:
            c.handle.cancel()

    # -- events
    async def _events(self) -> AsyncIterator[tuple[_Choice, Step | None]]:
        """(choice, step) as steps arrive, then (choice, None) when the choice has ended. An engine
        failure of a choice is raised. Every choice still running is cancelled if this stops early."""
        try:
            if len(self.choices) == 1:
                c = self.choices[0]
                async for step in c.handle.steps_async():
                    yield c, step
                yield c, None
                return
            inbox: asyncio.Queue[tuple[_Choice, Step | None | BaseException]] = asyncio.Queue()

            async def pump(c: _Choice) -> None:
                try:
                    async for step in c.handle.steps_async():
                        inbox.put_nowait((c, step))
                    inbox.put_nowait((c, None))
                except Exception as exc:
                    inbox.put_nowait((c, exc))

            tasks = [asyncio.ensure_future(pump(c)) for c in self.choices]
            try:
                left = len(tasks)
                while left:
                    c, event = await inbox.get()
                    if isinstance(event, BaseException):
                        raise event
                    if event is None:
                        left -= 1
                    yield c, event
            finally:
                for t in tasks:
                    t.cancel()
        finally:
            self.cancel()

    def _token(self, c: _Choice, step: Step) -> tuple[str, Any]:
        """Account for one new token of choice c: its released text and its logprobs (or None)."""
        now = time.perf_counter()
        if c.last_token_at is None:
            self.observer.first_token(now - self.started)
        else:
            self.observer.next_token(now - c.last_token_at)
        c.last_token_at = now
        self.observer.tokens(1)
        lp = None if step.logprob is None else self.fmt.token_logprobs(step.logprob, c.text_len)
        c.text_len += len(step.text)
        c.sent += len(step.text)
        if step.finish_reason is not None:
            c.finish_reason = step.finish_reason
        return step.text, lp

    def _end(self, c: _Choice) -> str | None:
        """The choice's handle has ended: the text it still holds when no step said so (it was cancelled,
        or had no room), and its finish reason; None when its last step carried them."""
        if c.finish_reason is not None:
            return None
        c.finish_reason = c.handle.finish_reason or "length"
        tail = c.handle.state.text[c.sent:]
        c.sent += len(tail)
        c.text_len += len(tail)
        return tail

    # -- streaming
    def _chunk(self, choices: list[dict], usage: dict | None = None) -> str:
        out: dict[str, Any] = {"id": self.id, "object": self.fmt.chunk_object, "created": self.created,
                               "model": self.model_id, "choices": choices}
        if self.plan.include_usage:
            out["usage"] = usage
        return json.dumps(out, allow_nan=False)

    async def stream(self) -> AsyncIterator[str]:
        """The SSE data of each event: chunks, the usage chunk (include_usage), then ``[DONE]``. An engine
        failure after the stream started is an error event."""
        fmt = self.fmt
        try:
            for c in self.choices:
                opening = fmt.opening(c.index)
                if opening is not None:
                    yield self._chunk([opening])
                if self.echoes is not None:
                    echo = self.echoes[c.prompt]
                    c.text_len = len(echo.text)
                    yield self._chunk([fmt.chunk_choice(c.index, echo.text, echo.logprobs, None)])
            async for c, step in self._events():
                if step is None:
                    tail = self._end(c)
                    if tail is not None:
                        yield self._chunk([fmt.chunk_choice(c.index, tail, None, c.finish_reason)])
                    continue
                text, lp = self._token(c, step)
                if text or lp is not None or step.finish_reason is not None:
                    yield self._chunk([fmt.chunk_choice(c.index, text, lp, step.finish_reason)])
            if self.plan.include_usage:
                yield self._chunk([], self.usage())
        except Exception as exc:  # after the headers: the client learns of it in the stream
            yield json.dumps(ApiError(500, f"generation failed: {exc}").body())
        yield "[DONE]"

    # -- one response
    async def collect(self) -> dict:
        """The whole response once every choice has ended."""
        fmt = self.fmt
        want_lp = self.plan.logprobs is not None
        for c in self.choices:
            if want_lp:
                c.lps = fmt.empty_logprobs()
            if self.echoes is not None:
                echo = self.echoes[c.prompt]
                c.text_len = len(echo.text)
                if want_lp:
                    fmt.extend(c.lps, echo.logprobs)
        try:
            async for c, step in self._events():
                if step is None:
                    self._end(c)
                    continue
                _, lp = self._token(c, step)
                if lp is not None and c.lps is not None:
                    fmt.extend(c.lps, lp)
        except ApiError:
            raise
        except Exception as exc:
            raise ApiError(500, f"generation failed: {exc}") from exc
        choices = []
        for c in self.choices:
            echo = self.echoes[c.prompt].text if self.echoes is not None else ""
            choices.append(fmt.choice(c.index, echo + c.handle.state.text, c.lps, c.finish_reason))
        return {"id": self.id, "object": fmt.object, "created": self.created, "model": self.model_id,
                "choices": choices, "usage": self.usage()}
