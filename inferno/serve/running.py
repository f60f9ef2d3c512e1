"""Running a planned request in the engine: its choices submitted, their steps turned into chunks
(a stream) or one response, and the answer sent while watching the client.

    Plan ─▶ submit (every prompt's n choices; each prompt's share its prefill) ─▶ Completion
         ─▶ answer: Completion.stream() as Server-Sent Events, or Completion.collect() as one JSON body

However a request ends (done, the client gone, a shutdown), every choice still running is cancelled, so
its KV slot is free before the next step, and the access log says "disconnected" when the client left.
Work done in a worker thread before the engine (an inspection) is run by `in_worker`, which sets the
work's cancel flag when the client leaves. An echo's prompt logprobs come from the engine, with its
choices (`inferno.serve.echo`).

* The stop token (<|endoftext|>) and the token that completed a stop string are listed and counted in
  ``usage``; neither the stop token nor the stop string is in the text.
* A choice ended by a server shutdown (after --grace-seconds) has finish_reason ``"abort"`` (the engine's
  "cancelled"; "abort" as vLLM says it, since no OpenAI client knows "cancelled").
* With a constraint and ``return_token_ids`` (the playground asks for both), a completion's logprobs
  also have ``forced``: per token, whether the constraint allowed that token only (false for an echoed
  prompt's tokens). Chat's logprobs keep OpenAI's shape.
* ``text_offset`` of a token is the number of characters of the choice's ``text`` (the echoed prompt
  included) released before it: where its text starts, except that a character split across tokens
  starts at the token that completes it, and text held back to match a stop string starts later.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from inferno.engine import Engine, EngineClosedError, EngineError, Handle, QueueFullError
from inferno.generate import GenerationError
from inferno.options import OptionError, Step, TokenLogprob
from inferno.serve.echo import EchoPart
from inferno.serve.errors import ApiError
from inferno.serve.middleware import LOG_KEY
from inferno.serve.planning import Plan
from inferno.serve.sse import EventStream, streaming_kwargs
from inferno.serve.token_texts import TokenTexts, clamp_logprob, top_entries, top_ids

T = TypeVar("T")


def log_info(request: Request) -> dict[str, Any]:
    """Where a serving object leaves what the access log line should say (tokens, prompt)."""
    return request.scope.setdefault(LOG_KEY, {})


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
    (`inferno.serve.serving_chat.ChatFormat`). `Completion` runs the choices; a format only shapes them."""

    id_prefix = "cmpl-"
    object = "text_completion"
    chunk_object = "text_completion"

    def __init__(self, texts: TokenTexts, return_ids: bool = False, forced: bool = False) -> None:
        self.texts = texts
        self.return_ids = return_ids
        self.forced = forced  # the logprobs say which tokens the constraint forced (`logprobs.forced`)

    def token_logprobs(self, t: TokenLogprob, text_offset: int, forced: bool = False) -> Any:
        """One new token's logprobs, as `extend` adds them to `empty_logprobs()`; `forced`: the constraint
        allowed this token only."""
        lp = {"tokens": [self.texts[t.id]], "token_logprobs": [clamp_logprob(t.logprob)],
              "top_logprobs": [top_entries(self.texts, t.id, t.logprob, t.top)], "text_offset": [text_offset]}
        if self.return_ids:
            lp.update(token_ids=[t.id], top_token_ids=[top_ids(t.id, t.top)])
        if self.forced:
            lp["forced"] = [forced]
        return lp

    def empty_logprobs(self) -> Any:
        lps: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        if self.return_ids:
            lps.update(token_ids=[], top_token_ids=[])
        if self.forced:
            lps["forced"] = []
        return lps

    def prompt_logprobs(self, lps: Any) -> Any:
        """An echoed prompt's logprobs (`inferno.serve.echo`) in this format: no prompt token is forced."""
        if lps is None or not self.forced:
            return lps
        return {**lps, "forced": [False] * len(lps["tokens"])}

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
        self.fmt = fmt or Format(texts, plan.return_ids, forced=plan.return_ids and plan.constrained)
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
        lp = None if step.logprob is None else self.fmt.token_logprobs(step.logprob, c.text_len, step.forced)
        c.text_len += len(step.text)
        c.sent += len(step.text)
        if step.finish_reason is not None:
            c.finish_reason = _reason(step.finish_reason)
        return step.text, lp

    def _end(self, c: _Choice) -> str | None:
        """The choice's handle has ended: the text it still holds when no step said so (it was cancelled,
        or had no room), and its finish reason; None when its last step carried them."""
        if c.finish_reason is not None:
            return None
        c.finish_reason = _reason(c.handle.finish_reason or "length")
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
        unscored: set[int] = set()  # choices whose echo waits for the engine's prompt logprobs
        try:
            for c in self.choices:
                opening = fmt.opening(c.index)
                if opening is not None:
                    yield self._chunk([opening])
                if self.echoes is not None:
                    c.text_len = len(self.echoes[c.prompt].text)
                    if self.plan.logprobs is None:  # nothing to wait for
                        yield self._echo_chunk(c)
                    else:  # sent with the choice's first event: its prompt is scored by then
                        unscored.add(c.index)
            async for c, step in self._events():
                if c.index in unscored:
                    unscored.discard(c.index)
                    yield self._echo_chunk(c)
                if step is None:
                    tail = self._end(c)
                    if tail is not None:
                        yield self._chunk([fmt.chunk_choice(c.index, tail, None, c.finish_reason)])
                    continue
                text, lp = self._token(c, step)
                if text or lp is not None or step.finish_reason is not None:
                    yield self._chunk([fmt.chunk_choice(c.index, text, lp, _reason(step.finish_reason))])
            if self.plan.include_usage:
                yield self._chunk([], self.usage())
        except Exception as exc:  # after the headers: the client learns of it in the stream
            yield json.dumps(ApiError(500, f"generation failed: {exc}").body())
        yield "[DONE]"

    def _echo_logprobs(self, c: _Choice) -> Any:
        """Choice c's echoed prompt's logprobs in the format (None without ``logprobs``): the engine's,
        on the choice's handle."""
        if self.plan.logprobs is None or self.echoes is None:
            return None
        scored = self.echoes[c.prompt].logprobs(self.texts, c.handle.prompt_logprobs, self.plan.return_ids)
        return self.fmt.prompt_logprobs(scored)

    def _unscored(self, c: _Choice) -> bool:
        """Whether the engine ended `c` before it had scored every token of its prompt (a shutdown)."""
        assert self.echoes is not None
        scored = c.handle.prompt_logprobs
        return scored is None or len(scored) < len(self.echoes[c.prompt].ids)

    def _echo_chunk(self, c: _Choice) -> str:
        assert self.echoes is not None
        text = self.echoes[c.prompt].text
        return self._chunk([self.fmt.chunk_choice(c.index, text, self._echo_logprobs(c), None)])

    # -- one response
    async def collect(self) -> dict:
        """The whole response once every choice has ended."""
        fmt = self.fmt
        want_lp = self.plan.logprobs is not None
        for c in self.choices:
            if want_lp:
                c.lps = fmt.empty_logprobs()
            if self.echoes is not None:
                c.text_len = len(self.echoes[c.prompt].text)
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
        if self.echoes is not None and want_lp and any(self._unscored(c) for c in self.choices):
            # A shutdown ended the request before its prompt was scored: null logprobs would read as
            # an answer, so it is an error, as for a request that had not started.
            raise ApiError(503, "the server is shutting down: the prompt was not scored before the grace "
                           "period ended", code="shutting_down")
        choices = []
        for c in self.choices:
            text, lps = c.handle.state.text, c.lps
            if self.echoes is not None:
                text = self.echoes[c.prompt].text + text
                if want_lp:  # the prompt's logprobs before the new tokens'
                    lps = fmt.empty_logprobs()
                    fmt.extend(lps, self._echo_logprobs(c))
                    fmt.extend(lps, c.lps)
            choices.append(fmt.choice(c.index, text, lps, c.finish_reason))
        return {"id": self.id, "object": fmt.object, "created": self.created, "model": self.model_id,
                "choices": choices, "usage": self.usage()}


# ------------------------------------------------------------------------------------ into the engine


def submit(engine: Engine, plan: Plan) -> list[Handle]:
    """Every prompt's n choices into the engine (each prompt's share its prefill); all or none."""
    handles: list[Handle] = []
    try:
        for ids in plan.ids:
            handles += engine.submit_many(ids, plan.max_tokens, plan.options, stop_ids=plan.stop_ids,
                                          prompt_logprobs=plan.logprobs if plan.echo else None)
    except BaseException as exc:
        for h in handles:
            h.cancel()
        if isinstance(exc, QueueFullError):
            raise ApiError(429, str(exc), code="queue_full", headers={"Retry-After": "1"}) from None
        if isinstance(exc, EngineClosedError):
            raise ApiError(503, "the server is shutting down") from None
        if isinstance(exc, (GenerationError, OptionError, EngineError)):
            raise ApiError(400, str(exc)) from None
        raise
    return handles


# --------------------------------------------------------------------------------- watching the client


def _reason(engine_reason: str | None) -> str | None:
    """The finish reason a client is told: the engine's, but "abort" for its "cancelled" (a shutdown)."""
    return "abort" if engine_reason == "cancelled" else engine_reason


class ClientGone(Exception):
    """The client disconnected before its answer was ready (the serving object answers `gone()`)."""


def gone(request: Request) -> Response:
    """The answer to a client that has left: nobody reads it; the access log says "disconnected"."""
    log_info(request)["disconnected"] = True
    return Response(status_code=499)


async def disconnected(request: Request) -> None:
    """Return when the client has gone (the body is read: the next message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def in_worker(request: Request, cancel: threading.Event, fn: Callable[..., T], *args: Any,
                    **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` in a worker thread, off the event loop, while watching the client: if it
    leaves first, `cancel` is set (`fn` checks it between pieces of its work and stops) and `ClientGone`
    is raised. `fn`'s exceptions are raised here."""
    work = asyncio.ensure_future(run_in_threadpool(fn, *args, **kwargs))
    watch = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done() and watch.exception() is not None:  # the client cannot be watched: wait
            await asyncio.wait({work})
    except asyncio.CancelledError:  # the server is stopping the request: stop the work too
        cancel.set()
        raise
    finally:
        watch.cancel()
        if not work.done():
            cancel.set()
            # The thread ends at its next check; its outcome is nobody's: retrieved and dropped.
            work.add_done_callback(lambda t: t.cancelled() or t.exception())
    if not work.done():
        raise ClientGone
    return work.result()


async def answer(request: Request, completion: Completion, stream: bool, *, grace_seconds: float,
                 on_start: Callable[[Completion], None] = lambda c: None,
                 on_end: Callable[[Completion], None] = lambda c: None) -> Response:
    """Run `completion` (already submitted) to its end: SSE events as its tokens come, or one JSON
    response. However it ends, every choice still running is cancelled (the client left) and the access
    log learns the tokens and finish reasons. `on_start` and `on_end` bracket it (the server's tracking
    of requests in flight); a stream's end waits `grace_seconds` past a shutdown for ours."""
    info = log_info(request)
    on_start(completion)
    info["prompt_tokens"] = completion.prompt_tokens

    def done() -> None:
        completion.cancel()
        on_end(completion)
        info["completion_tokens"] = completion.completion_tokens
        info["finish_reasons"] = ",".join(sorted({c.finish_reason or "-" for c in completion.choices}))

    if stream:
        async def events():
            async for data in completion.stream():
                yield {"data": data}

        return EventStream(events(), done, **streaming_kwargs(grace_seconds))

    collect = asyncio.ensure_future(completion.collect())
    watch = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({collect, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not collect.done():
            collect.cancel()
        done()
    if not collect.done() or collect.cancelled():
        return gone(request)
    return JSONResponse(collect.result())
