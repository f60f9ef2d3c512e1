"""Continuous batching: many sequences share every forward step.

One decode step reads every weight once whether it advances one sequence or sixteen, so the engine
runs all its sequences through one `Gpt2.forward_ragged` per step:

    submit ─▶ wait queue (bounded) ─▶ a free KV slot ─▶ prompt, a chunk per step ─▶ one token per step
                                                                        ─▶ finish: the slot is free again

Each step (1) ends cancelled sequences and frees their slots, (2) admits waiting requests into free
slots, (3) builds one ragged batch: a decode row (one token) for every sequence past its prompt, and
prompt chunks of at most `prefill_chunk` tokens in all, so a long prompt never stalls the running
streams for more than one chunk, and (4) hands each sequence its row of logits: the options module
(`SequenceState.step`, the same code as the batch-1 loop) picks the token, and the handle gets it.

Submissions and cancellations may come from any thread while the step loop runs in its own.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from numbers import Integral

import numpy as np

from inferno.generate import GenerationResult, check_request, new_token_budget
from inferno.kv import KvSlots
from inferno.model import Gpt2
from inferno.options import GenerationOptions, SequenceState, Step, TextDecoder

#: Default KV slots: 16 sequences at once. A slot takes 72 MiB at the 124M shape in float32
#: (`inferno.kv.slot_bytes`), so 16 take 1.1 GiB when every sequence fills the whole context;
#: memory is touched only as far as sequences actually reach.
DEFAULT_SLOTS = 16
DEFAULT_QUEUE = 256
DEFAULT_PREFILL_CHUNK = 64


class EngineError(RuntimeError):
    """The engine cannot take or finish a request; the message says why."""


class QueueFullError(EngineError):
    """The wait queue is full (a server answers 429)."""


class EngineClosedError(EngineError):
    """The engine was closed."""


class Handle:
    """One submitted request: iterate it for its `Step`s as they are chosen; `result()` waits for the end.

    `finish_reason` is "stop", "length" or "cancelled" once it has ended; `error` is set (and raised by
    iteration and `result()`) if the engine failed it.
    """

    def __init__(self, engine: Engine, request_id: int, prompt_ids: list[int], state: SequenceState) -> None:
        self.engine = engine
        self.id = request_id
        self.prompt_ids = prompt_ids
        self.state = state
        self.error: BaseException | None = None
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


@dataclass
class _Sequence:
    handle: Handle
    prompt: list[int]
    budget: int  # new tokens it may still take in all (max_new_tokens, bounded by the context)
    slot: int = -1
    cached: int = 0  # tokens of this sequence in its slot
    next_token: int | None = None  # the last chosen token, to feed in the next step
    #: Sequences of the same prompt (`submit_many`): they wait, holding their slots, until this one's
    #: prefill is done, then copy its KV cache and sample their first token from the same logits.
    followers: list[_Sequence] = field(default_factory=list)
    #: A leader whose own request was cancelled, still prefilling for its followers.
    ghost: bool = False

    @property
    def size(self) -> int:
        return 1 + len(self.followers)


@dataclass
class EngineStats:
    steps: int = 0
    tokens: int = 0  # new tokens chosen
    prompt_tokens: int = 0  # prompt tokens prefilled
    rows: int = 0  # rows run (one per running sequence per step)
    seconds: float = 0.0  # time inside steps
    finished: collections.Counter = field(default_factory=collections.Counter)


class Engine:
    """Continuous batching over a `Gpt2`: `submit` requests, iterate their handles.

    `slots`: sequences run at once (each takes one KV slot); `max_queue`: requests that may wait for a
    slot beyond those the free slots will take (None: no bound; 0: only what fits now), beyond which
    `submit` raises `QueueFullError`; `prefill_chunk`: prompt tokens
    run per step; `sample_limit`: ids below it may be generated (a padded vocabulary); `decoder`: a
    factory of incremental text decoders, needed for stop strings (the pipeline passes its tokenizer's);
    `autostart`: start the step loop thread on the first submission (False: call `step` yourself).
    """

    def __init__(
        self,
        model: Gpt2,
        *,
        slots: int = DEFAULT_SLOTS,
        max_queue: int | None = DEFAULT_QUEUE,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        sample_limit: int | None = None,
        decoder: Callable[[], TextDecoder] | None = None,
        autostart: bool = True,
    ) -> None:
        for name, value in (("slots", slots), ("prefill_chunk", prefill_chunk)):
            if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
                raise EngineError(f"{name} must be an integer >= 1, got {value!r}")
        if max_queue is not None and (isinstance(max_queue, bool) or not isinstance(max_queue, Integral)
                                      or max_queue < 0):
            raise EngineError(f"max_queue must be an integer >= 0 or None, got {max_queue!r}")
        self.model = model
        self.max_queue = max_queue
        self.prefill_chunk = int(prefill_chunk)
        self.sample_limit = sample_limit
        self.decoder = decoder
        self.autostart = autostart
        self.slots: KvSlots = model.new_slots(int(slots))
        self.stats = EngineStats()
        self._free = list(range(int(slots)))[::-1]  # a stack: the lowest slot is taken first
        self._waiting: collections.deque[_Sequence] = collections.deque()
        self._running: list[_Sequence] = []
        self._ids = itertools.count()
        self._cv = threading.Condition()
        self._step_lock = threading.Lock()
        self._closed = False
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------------------------- requests

    def submit(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int = 16,
        options: GenerationOptions | None = None,
        *,
        stop_ids: Iterable[int] = (),
        block: bool = False,
        timeout: float | None = None,
    ) -> Handle:
        """Queue a request; raises at once if the request is invalid (`GenerationError`,
        `OptionError`), the queue is full (`QueueFullError`; with `block`, wait up to `timeout` for room)
        or the engine is closed. `stop_ids` end it in addition to the options' own (e.g. <|endoftext|>).
        The step loop starts on the first submission (see `start` and `autostart`)."""
        return self.submit_many(prompt_ids, max_new_tokens, [options or GenerationOptions()],
                                stop_ids=stop_ids, block=block, timeout=timeout)[0]

    def submit_many(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        options: Sequence[GenerationOptions],
        *,
        stop_ids: Iterable[int] = (),
        block: bool = False,
        timeout: float | None = None,
    ) -> list[Handle]:
        """Several sequences of one prompt (an OpenAI request with n > 1), one per entry of `options`:
        the prompt is prefilled once and its KV cache copied to the others, which then sample their own
        continuations. They are admitted together, so there must be as many slots."""
        if not 1 <= len(options) <= self.slots.n_slots:
            raise EngineError(f"{len(options)} sequences of one prompt need as many KV slots; the engine "
                              f"has {self.slots.n_slots}")
        config = self.model.config
        prompt = check_request(config, prompt_ids, max_new_tokens, options, self.sample_limit)
        budget = new_token_budget(config, len(prompt), max_new_tokens)
        stop_ids = tuple(stop_ids)
        seqs = []
        for o in options:
            state = SequenceState(o, prompt, self.decoder() if self.decoder is not None else None, stop_ids)
            seqs.append(_Sequence(Handle(self, next(self._ids), prompt, state), prompt, budget))
        handles = [q.handle for q in seqs]
        with self._cv:
            if self._closed:
                raise EngineClosedError("the engine is closed")
            if budget <= 0:  # nothing to generate: done without taking a slot
                for q in seqs:
                    q.handle.state.finish("length")
                    q.handle._end()
                return handles
            deadline = None if timeout is None else time.monotonic() + timeout
            # Requests that a free slot will take at the next step do not count as queued.
            while self.max_queue is not None and len(self._waiting) >= self.max_queue + len(self._free):
                left = None if deadline is None else deadline - time.monotonic()
                if not block or (left is not None and left <= 0):
                    raise QueueFullError(f"the wait queue is full ({self.max_queue} requests wait for "
                                         f"{self.slots.n_slots} slots); retry later")
                self._cv.wait(left)
                if self._closed:
                    raise EngineClosedError("the engine is closed")
            leader = seqs[0]
            leader.followers = seqs[1:]
            self._waiting.append(leader)
            self._cv.notify_all()
        if self.autostart:
            self.start()
        return handles

    @property
    def n_slots(self) -> int:
        return self.slots.n_slots

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def running_sequences(self) -> list[RunningSequence]:
        """What each running sequence holds, in step order: its handle, its KV slot and how many of its
        tokens that slot has cached (a read-only copy, for monitoring and tests)."""
        with self._cv:
            return [RunningSequence(q.handle, q.slot, q.cached) for q in self._running]

    def free_slot_ids(self) -> list[int]:
        """The KV slots no sequence holds, the next one to be taken first."""
        with self._cv:
            return self._free[::-1]

    # --------------------------------------------------------------------------------- the loop

    def start(self) -> None:
        """Run the step loop in a background thread (idempotent)."""
        with self._cv:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._loop, name="inferno-engine", daemon=True)
                self._thread.start()

    def close(self, timeout: float | None = 10.0) -> None:
        """Stop the loop; requests still waiting or running end as "cancelled". `timeout` bounds the
        wait for the loop thread to stop; a step already inside the backend is still waited for (a
        kernel cannot be interrupted), then the requests end."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        with self._step_lock:
            for seq in self._everyone():
                self._finish(seq, "cancelled")
            self._waiting.clear()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the step loop between two steps: what is submitted inside is admitted together when the
        block ends (a group of requests that should prefill in one step; a queue filled on purpose)."""
        with self._step_lock:
            yield

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _everyone(self) -> list[_Sequence]:
        """Every sequence not yet ended: running, waiting, and the followers waiting on either."""
        leaders = [*self._running, *self._waiting]
        out = [*leaders, *(f for q in leaders for f in q.followers)]
        for q in leaders:
            q.followers = []
        return out

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    @property
    def alive(self) -> bool:
        """Whether the step loop is running (it starts with the first submission)."""
        return self._thread is not None and self._thread.is_alive() and not self._closed

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not self._waiting and not self._running:
                    self._cv.wait()
                if self._closed:
                    return
            try:
                self.step()
            except Exception as exc:  # never let the loop die with requests in it: fail them instead
                with self._step_lock:
                    for seq in self._everyone():
                        self._finish(seq, None, exc)
                    self._waiting.clear()

    def step(self) -> bool:
        """Run one step; False when there was nothing to do. The loop thread calls it; call it yourself
        on an engine made with ``autostart=False``."""
        with self._step_lock:
            start = time.perf_counter()
            self._admit()
            if not self._running:
                return False
            try:
                self._run_batch()
            except Exception as exc:  # a backend failure: fail the sequences of this step, keep serving
                for seq in list(self._running):
                    self._finish(seq, None, exc)
            self.stats.steps += 1
            self.stats.seconds += time.perf_counter() - start
            return True

    def _admit(self) -> None:
        with self._cv:
            for leader in [*self._running, *self._waiting]:
                for f in [f for f in leader.followers if f.handle._cancel]:
                    leader.followers.remove(f)
                    self._finish(f, "cancelled")
            for seq in [s for s in self._running if s.handle._cancel and not s.ghost]:
                if seq.followers and seq.cached < len(seq.prompt):
                    seq.ghost = True  # keep prefilling for the others
                    seq.handle.state.finish("cancelled")
                    self.stats.finished["cancelled"] += 1
                    seq.handle._end()
                else:
                    self._finish(seq, "cancelled")
            for seq in [s for s in self._waiting if s.handle._cancel]:
                self._waiting.remove(seq)
                self._finish(seq, "cancelled")
                if seq.followers:  # the next one leads the group in its place
                    seq.followers[0].followers = seq.followers[1:]
                    self._waiting.appendleft(seq.followers[0])
            # First come, first served: a group waits until it has all its slots.
            while self._waiting and len(self._free) >= self._waiting[0].size:
                seq = self._waiting.popleft()
                for q in (seq, *seq.followers):
                    q.slot = self._free.pop()
                    q.handle.admitted = time.perf_counter()
                self._running.append(seq)
            self._cv.notify_all()  # room in the queue for blocked submitters

    def _run_batch(self) -> None:
        rows, sampled, members = [], [], []
        prefill_left = self.prefill_chunk
        for seq in self._running:
            if seq.cached < len(seq.prompt):
                if prefill_left == 0:
                    continue
                n = min(prefill_left, len(seq.prompt) - seq.cached)
                prefill_left -= n
                rows.append((seq.prompt[seq.cached : seq.cached + n], seq.slot, seq.cached))
                sampled.append(seq.cached + n == len(seq.prompt))
                self.stats.prompt_tokens += n
            else:
                rows.append(([seq.next_token], seq.slot, seq.cached))
                sampled.append(True)
            members.append(seq)
        if not rows:
            return
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # checked right below
            logits = self.model.backend.to_numpy(self.model.forward_ragged(rows, self.slots, sampled))
        self.model.check_logits(logits, sum(map(bool, sampled)))
        self.stats.rows += len(rows)
        k = 0
        for seq, row, wanted in zip(members, rows, sampled, strict=True):
            seq.cached += len(row[0])
            if not wanted:
                continue
            row_logits = logits[k, : self.sample_limit]
            k += 1
            if seq.followers:  # its prefill is done: the group's other sequences start from it
                self._start_followers(seq, row_logits)
            if seq.ghost:
                self._running.remove(seq)
                self._free.append(seq.slot)
                continue
            self._sample(seq, row_logits)

    def _start_followers(self, leader: _Sequence, logits) -> None:
        be, n = self.model.backend, leader.cached
        with self._cv:
            followers, leader.followers = leader.followers, []
            # Running before their caches are copied: should a copy fail, `step` ends them with the
            # error and frees their slots, as it does the leader's.
            self._running.extend(followers)
        for layer in self.slots.layers:
            k_src, v_src = layer[leader.slot]
            for f in followers:
                k, v = layer[f.slot]
                layer[f.slot] = be.write_kv(k, v, k_src[:, :, :n, :], v_src[:, :, :n, :], 0)
        for f in followers:
            f.cached = n
            self._sample(f, logits)

    def _sample(self, seq: _Sequence, logits) -> None:
        try:
            state = seq.handle.state
            step = state.step(logits, last=len(state.ids) + 1 >= seq.budget)
        except Exception as exc:  # a failure of this sequence only
            self._finish(seq, None, exc)
            return
        self.stats.tokens += 1
        seq.next_token = step.id
        seq.handle._put(step)
        if step.finish_reason is not None:
            self._finish(seq, step.finish_reason)

    def _finish(self, seq: _Sequence, reason: str | None, error: BaseException | None = None) -> None:
        """End a sequence (reason "cancelled" or its own finish reason; or an error) and free its slot;
        with an error, the followers waiting on it share its fate."""
        if seq in self._running:
            self._running.remove(seq)
        if seq.slot >= 0:
            self._free.append(seq.slot)
            seq.slot = -1
        if error is not None:
            for f in seq.followers:
                self._finish(f, None, error)
            seq.followers = []
        if seq.ghost:
            return
        if reason == "cancelled":
            seq.handle.state.finish("cancelled")
        self.stats.finished[reason or "error"] += 1
        seq.handle._end(error)
