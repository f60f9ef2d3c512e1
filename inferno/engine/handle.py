"""The caller's side of one request submitted to the engine: a `Handle` yields the request's `Step`s as
the engine's step loop chooses them (to a thread or an asyncio consumer), ends with its finish reason
or error, and cancels it."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from inferno.generate import GenerationResult
from inferno.options import SequenceState, Step, TokenLogprob


class Owner(Protocol):
    """What a handle needs of the engine that runs it (`inferno.engine.Engine`): its lock, a way to wake
    its step loop, and its model (for the backend's name)."""

    model: Any
    _cv: threading.Condition

    def _wake(self) -> None: ...


class Handle:
    """One submitted request: iterate it for its `Step`s as they are chosen; `result()` waits for the end.

    `finish_reason` is "stop", "length" or "cancelled" once it has ended; `error` is set (and raised by
    iteration and `result()`) if the engine failed it.
    """

    def __init__(self, engine: Owner, request_id: int, prompt_ids: list[int], state: SequenceState) -> None:
        self.engine = engine
        self.id = request_id
        self.prompt_ids = prompt_ids
        self.state = state
        self.error: BaseException | None = None
        #: With `prompt_logprobs` asked at submission: each prompt token's logprob (None for the first),
        #: set once the prompt is prefilled, before the first step.
        self.prompt_logprobs: list[TokenLogprob | None] | None = None
        self.submitted = time.perf_counter()
        self.admitted: float | None = None  # when it got a slot
        self.finished: float | None = None
        self._callbacks: list[Callable[[Handle], None]] = []
        self._events: queue.SimpleQueue[Step | None] = queue.SimpleQueue()
        self._listener: Callable[[Step | None], None] | None = None  # set by `steps_async`
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._cancel = False

    @property
    def finish_reason(self) -> str | None:
        return self.state.finish_reason if self._done.is_set() else None

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def cancel(self) -> None:
        """Stop this request; its slot is free before the next step. No-op once it has ended."""
        self._cancel = True
        self.engine._wake()

    def __iter__(self) -> Iterator[Step]:
        while True:
            event = self._events.get()
            if event is None:
                if self.error is not None:
                    raise self.error
                return
            yield event

    async def steps_async(self) -> AsyncIterator[Step]:
        """The steps, for an asyncio consumer (a server): awaits each without blocking the event loop.
        Iterate a handle once, either this way or with a plain ``for``."""
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[Step | None] = asyncio.Queue()
        with self._lock:
            backlog = []
            while True:
                try:
                    backlog.append(self._events.get_nowait())
                except queue.Empty:
                    break
            self._listener = lambda event: loop.call_soon_threadsafe(inbox.put_nowait, event)
        for event in backlog:
            inbox.put_nowait(event)
        while True:
            event = await inbox.get()
            if event is None:
                if self.error is not None:
                    raise self.error
                return
            yield event

    def add_done_callback(self, fn: Callable[[Handle], None]) -> None:
        """Call `fn(handle)` once it has ended (at once if it has), from the engine's thread."""
        with self.engine._cv:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        fn(self)

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def result(self, timeout: float | None = None) -> GenerationResult:
        """Wait for the end and return the whole result (as `Pipeline.generate` gives it)."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.id} did not finish within {timeout} s")
        if self.error is not None:
            raise self.error
        s = self.state
        # Generation time, from getting a slot (not from submission: waiting in the queue is not it).
        start = self.admitted or self.finished or self.submitted
        return GenerationResult(self.prompt_ids, list(s.ids), s.text, s.finish_reason or "length",
                                (self.finished or start) - start,
                                self.engine.model.backend.name, s.logprobs, s.stop_reason)

    # The engine's side.

    def _put(self, event: Step | None) -> None:
        with self._lock:
            if self._listener is None:
                self._events.put(event)
                return
            try:
                self._listener(event)
            except RuntimeError:  # the consumer's event loop is closed: nobody is listening any more
                self._cancel = True

    def _end(self, error: BaseException | None = None) -> None:
        with self.engine._cv:
            if self._done.is_set():
                return
            self.error = error
            self.finished = time.perf_counter()
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        self._put(None)
        for fn in callbacks:
            fn(self)


@dataclass(frozen=True)
class RunningSequence:
    """One running sequence as `Engine.running_sequences` reports it."""

    handle: Handle
    slot: int
    cached: int

