"""The continuous-batching scheduler: the `Engine`, its wait queue, slots and step loop.

One decode step reads every weight once whether it advances one sequence or sixteen, so the engine
runs all its sequences through one `Gpt2.forward_ragged` per step:

    submit ─▶ wait queue (bounded) ─▶ a free KV slot ─▶ prompt, a chunk per step ─▶ one token per step
                                                                        ─▶ finish: the slot is free again

Each step (1) ends cancelled sequences and frees their slots, (2) admits waiting requests into free
slots, (3) builds one ragged batch: a decode row (one token) for every sequence past its prompt, and
prompt chunks of at most `prefill_chunk` tokens in all, so a long prompt never stalls the running
streams for more than one chunk, and (4) hands each sequence its row of logits: the options module
(`SequenceState.step`, the same code as the batch-1 loop) picks the token, and the handle gets it.

Automatic prefix caching: a slot's keys and values stay valid after its sequence ends, until the slot
is overwritten, so the engine remembers which token ids each slot holds and indexes them by a chained
hash of blocks of `prefix_block` tokens (as vLLM does). A new sequence reuses the longest cached prefix
of its prompt, in whole blocks: it takes the very slot that holds it when that slot is free (no copy),
else the least recently used free slot, into which the prefix is copied from the slot that holds it
(running or free); then only the rest of the prompt is prefilled (at least its last token, whose logits
are needed). Free slots are overwritten least recently used first; `slots` still bounds the memory.
Slot-level rather than paged blocks: the backends' attention kernels read one contiguous cache per slot
(see docs/prefix-caching-and-speculation.md).

A step whose forward pass fails ends only the sequences whose rows fail (`forward.forward_rows`).

Submissions and cancellations may come from any thread while the step loop runs in its own.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from numbers import Integral

from inferno.engine.forward import forward_rows
from inferno.engine.handle import Handle, RunningSequence
from inferno.engine.prefix_cache import PrefixIndex
from inferno.engine.sequence import EngineSequence, draft_row, verify_row
from inferno.generate import check_request, new_token_budget
from inferno.kv import KvSlots
from inferno.models.causal_lm import CausalLM
from inferno.models.gpt2 import Gpt2
from inferno.options import GenerationOptions, SequenceState, TextDecoder, TokenLogprob, token_logprob
from inferno.speculative import SpeculationStats, check_speculation

#: Default KV slots: 16 sequences at once. A slot takes 72 MiB at the 124M shape in float32
#: (`inferno.kv.slot_bytes`), so 16 take 1.1 GiB when every sequence fills the whole context;
#: memory is touched only as far as sequences actually reach.
DEFAULT_SLOTS = 16
DEFAULT_QUEUE = 256
DEFAULT_PREFILL_CHUNK = 64
#: Tokens per prefix-cache block: a prompt's prefix is reused in whole blocks (see docs/benchmarks.md).
DEFAULT_PREFIX_BLOCK = 16


class EngineError(RuntimeError):
    """The engine cannot take or finish a request; the message says why."""


class QueueFullError(EngineError):
    """The wait queue is full (a server answers 429)."""


class EngineClosedError(EngineError):
    """The engine was closed."""


@dataclass
class EngineStats:
    steps: int = 0
    tokens: int = 0  # new tokens chosen
    prompt_tokens: int = 0  # prompt tokens prefilled
    rows: int = 0  # rows run (one per running sequence per step)
    seconds: float = 0.0  # time inside steps
    finished: collections.Counter = field(default_factory=collections.Counter)
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache (vLLM's name)
    prefix_cache_hits: int = 0  # of those, tokens found cached and not prefilled again
    prefix_cache_copies: int = 0  # hits copied from another slot (the rest reused their slot in place)
    #: Speculative decoding's drafts and accepted drafts, overall and per draft position (llama.cpp's
    #: and vLLM's counters).
    speculation: SpeculationStats = field(default_factory=SpeculationStats)



class Engine:
    """Continuous batching over a `Gpt2`: `submit` requests, iterate their handles.

    `slots`: sequences run at once (each takes one KV slot); `max_queue`: requests that may wait for a
    slot beyond those the free slots will take (None: no bound; 0: only what fits now), beyond which
    `submit` raises `QueueFullError`; `prefill_chunk`: prompt tokens
    run per step; `sample_limit`: ids below it may be generated (a padded vocabulary); `decoder`: a
    factory of incremental text decoders, needed for stop strings (the pipeline passes its tokenizer's);
    `autostart`: start the step loop thread on the first submission (False: call `step` yourself);
    `no_prefix_cache`: prefill every prompt in full (no automatic prefix caching); `prefix_block`: tokens
    per prefix-cache block.

    Speculative decoding (see `inferno.speculative`): `speculative` "ngram" (prompt lookup) or "draft"
    (the default when `draft_model`, a model with this one's vocabulary, is given), with
    `num_speculative_tokens` drafts in a sequence's first round (it adapts after). Each decode row then
    carries the sequence's drafts, verified in the same ragged step; a sequence whose output is
    constrained (structured output) decodes without drafts.
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
        no_prefix_cache: bool = False,
        prefix_block: int = DEFAULT_PREFIX_BLOCK,
        speculative: str | None = None,
        draft_model: CausalLM | None = None,
        num_speculative_tokens: int | None = None,
    ) -> None:
        for name, value in (("slots", slots), ("prefill_chunk", prefill_chunk),
                            ("prefix_block", prefix_block)):
            if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
                raise EngineError(f"{name} must be an integer >= 1, got {value!r}")
        if max_queue is not None and (isinstance(max_queue, bool) or not isinstance(max_queue, Integral)
                                      or max_queue < 0):
            raise EngineError(f"max_queue must be an integer >= 0 or None, got {max_queue!r}")
        self.speculative = check_speculation(model, speculative, draft_model, num_speculative_tokens)
        self.draft_model, self.num_speculative_tokens = draft_model, num_speculative_tokens
        self.model = model
        self.max_queue = max_queue
        self.prefill_chunk = int(prefill_chunk)
        self.sample_limit = sample_limit
        self.decoder = decoder
        self.autostart = autostart
        self.slots: KvSlots = model.new_slots(int(slots))
        self.stats = EngineStats()
        # The next slot to take is the last; a freed slot goes first (least recently used is taken next).
        self._free = list(range(int(slots)))[::-1]
        self.prefix_cache = not no_prefix_cache
        self.prefix_block = int(prefix_block)
        self._prefixes = PrefixIndex(int(slots), self.prefix_block)
        self._waiting: collections.deque[EngineSequence] = collections.deque()
        self._running: list[EngineSequence] = []
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
        prompt_logprobs: int | None = None,
    ) -> Handle:
        """Queue a request; raises at once if the request is invalid (`GenerationError`,
        `OptionError`), the queue is full (`QueueFullError`; with `block`, wait up to `timeout` for room)
        or the engine is closed. `stop_ids` end it in addition to the options' own (e.g. <|endoftext|>).
        The step loop starts on the first submission (see `start` and `autostart`). `prompt_logprobs`:
        see `submit_many`."""
        return self.submit_many(prompt_ids, max_new_tokens, [options or GenerationOptions()],
                                stop_ids=stop_ids, block=block, timeout=timeout,
                                prompt_logprobs=prompt_logprobs)[0]

    def submit_many(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        options: Sequence[GenerationOptions],
        *,
        stop_ids: Iterable[int] = (),
        block: bool = False,
        timeout: float | None = None,
        prompt_logprobs: int | None = None,
    ) -> list[Handle]:
        """Several sequences of one prompt (an OpenAI request with n > 1), one per entry of `options`:
        the prompt is prefilled once and its KV cache copied to the others, which then sample their own
        continuations. They are admitted together, so there must be as many slots.

        `prompt_logprobs` (an int N >= 0; None: not wanted) scores the prompt as it is prefilled: each
        handle's `prompt_logprobs` is then, before its first step, each prompt token's `TokenLogprob`
        with the N most likely alternatives (None for the first token, which has no context), as
        `Pipeline.score` gives them. Such a prompt reuses a cached prefix only as far as the cache also
        holds its tokens' logprobs (from an earlier scored prompt; see `PrefixIndex`), and with
        `max_new_tokens` 0 it is prefilled and ends ("length") without a new token."""
        top = prompt_logprobs
        if top is not None and (isinstance(top, bool) or not isinstance(top, Integral) or top < 0):
            raise EngineError(f"prompt_logprobs must be an integer >= 0 or None, got {prompt_logprobs!r}")
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
            seqs.append(EngineSequence(Handle(self, next(self._ids), prompt, state), prompt, budget,
                                  prompt_logprobs=prompt_logprobs))
        handles = [q.handle for q in seqs]
        with self._cv:
            if self._closed:
                raise EngineClosedError("the engine is closed")
            if budget <= 0 and prompt_logprobs is None:  # nothing to do: done without taking a slot
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

    def _everyone(self) -> list[EngineSequence]:
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
                self._take_slot(seq)
                for q in seq.followers:
                    q.slot = self._free.pop()
                    self._prefixes.truncate(q.slot, 0)
                for q in (seq, *seq.followers):
                    q.handle.admitted = time.perf_counter()
                self._running.append(seq)
            self._cv.notify_all()  # room in the queue for blocked submitters

    def _take_slot(self, seq: EngineSequence) -> None:
        """Give `seq` a free slot, with the longest cached prefix of its prompt in it (see the module's
        docstring); its prefill starts after that prefix."""
        index, prompt, top = self._prefixes, seq.prompt, seq.prompt_logprobs
        if not self.prefix_cache:
            seq.slot = self._free.pop()
            index.truncate(seq.slot, 0)
            return
        src, n = index.longest(prompt, prefer=self._free, scored=top)
        n, scored = self._usable(seq, src, n)
        self.stats.prefix_cache_queries += len(prompt)
        if n > 0 and src in self._free:
            self._free.remove(src)  # the slot holding the prefix: reused in place
            seq.slot = src
            index.truncate(src, n)
        else:
            seq.slot = self._free.pop()
            index.truncate(seq.slot, 0)
            if n > 0:
                self._copy_prefix(src, seq.slot, n)
                self.stats.prefix_cache_copies += 1
        seq.cached, seq.scored = n, scored
        self.stats.prefix_cache_hits += n
        # A sequence admitted before, still prefilling a longer common prefix: wait for it rather than
        # prefill the same tokens side by side (the usual case of requests sent together). A scored
        # prompt waits only for one scored with as many alternatives (it needs their logprobs too).
        block = self.prefix_block
        for other in self._running:
            if other.cached < len(other.prompt) and not other.ghost and other.slot >= 0 and (
                    top is None or (other.prompt_logprobs is not None and other.prompt_logprobs >= top)):
                common = 0
                for a, b in zip(other.prompt, prompt, strict=False):
                    if a != b:
                        break
                    common += 1
                share = min(common // block * block, len(prompt) - (top is None))
                if share - (top is not None) > seq.cached and share > seq.share:
                    seq.source, seq.share = other, share

    def _usable(self, seq: EngineSequence, src: int, n: int) -> tuple[int, list[TokenLogprob]]:
        """Of the first `n` tokens of `seq`'s prompt, cached in slot `src`: how many `seq` need not
        prefill, and the logprobs of its tokens 1 .. that many when it is scored. At least the last
        prompt token is run (its logits pick the first new token); a scored prompt runs the last cached
        one again too (its logits score the first token it prefills), and reuses nothing unless the slot
        holds the logprobs of the tokens it skips (see `PrefixIndex.cached_scores`)."""
        top = seq.prompt_logprobs
        if top is None or n <= 0:
            return max(min(n, len(seq.prompt) - 1), 0), []
        n = min(n, len(seq.prompt)) - 1
        scored = self._prefixes.cached_scores(src, n, top) if n > 0 else None
        return (0, []) if scored is None else (n, scored)

    def _copy_pending(self) -> None:
        """Sequences waiting on another's prefill (see `_take_slot`): copy the shared prefix once it is
        in that slot; if that sequence has ended, take what the cache still holds and prefill the rest."""
        for seq in self._running:
            src = seq.source
            if src is None:
                continue
            if src in self._running and src.slot >= 0 and src.cached < seq.share:
                continue  # not there yet
            if src in self._running and src.slot >= 0:
                slot, n = src.slot, seq.share
            else:
                slot, n = self._prefixes.longest(seq.prompt, scored=seq.prompt_logprobs)
            seq.source, seq.share = None, 0
            n, scored = self._usable(seq, slot, n)
            if n > seq.cached:
                self._copy_prefix(slot, seq.slot, n)
                self.stats.prefix_cache_hits += n - seq.cached
                self.stats.prefix_cache_copies += 1
                seq.cached, seq.scored = n, scored

    def _copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Copy the first `n` positions of slot `src`'s keys and values into slot `dst`."""
        be = self.model.backend
        for layer in self.slots.layers:
            k_src, v_src = layer[src]
            k, v = layer[dst]
            layer[dst] = be.write_kv(k, v, k_src[:, :, :n, :], v_src[:, :, :n, :], 0)
        self._prefixes.write(dst, 0, self._prefixes.tokens[src][:n])
        self._prefixes.set_scores(dst, self._prefixes.scores[src], self._prefixes.tops[src])

    def _run_batch(self) -> None:
        self._copy_pending()
        rows, wanted, members = [], [], []  # wanted: how many of the row's last positions need logits
        prefill_left = self.prefill_chunk
        for seq in self._running:
            if seq.source is not None:
                continue  # waiting for the prefix another sequence is prefilling
            if seq.cached < len(seq.prompt):
                if prefill_left == 0:
                    continue
                n = min(prefill_left, len(seq.prompt) - seq.cached)
                prefill_left -= n
                rows.append((seq.prompt[seq.cached : seq.cached + n], seq.slot, seq.cached))
                last = seq.cached + n == len(seq.prompt)
                wanted.append(n if seq.prompt_logprobs is not None else int(last))
                self.stats.prompt_tokens += n
            else:
                seq.drafts, seq.dists = draft_row(seq, self.model, self.speculative, self.draft_model,
                                                  self.num_speculative_tokens, self.sample_limit)
                rows.append(([seq.next_token, *seq.drafts], seq.slot, seq.cached))
                wanted.append(1 + len(seq.drafts))
            members.append(seq)
        if not rows:
            return
        parts = forward_rows(self.model, self.slots, rows, wanted)  # (a failed row: its error)
        self.stats.rows += len(rows)
        for seq, row, n, seq_logits in zip(members, rows, wanted, parts, strict=True):
            if isinstance(seq_logits, BaseException):
                self._finish(seq, None, seq_logits)
                continue
            tokens, slot, offset = row
            self._prefixes.write(slot, offset, tokens)  # what the slot now holds, for the prefix cache
            start = seq.cached
            seq.cached += len(tokens)
            if not n:
                continue
            seq_logits = seq_logits[:, : self.sample_limit]
            if start >= len(seq.prompt) and seq.speculation:
                emitted, reason, error = verify_row(seq, start, seq_logits, self.stats.speculation)
                self.stats.tokens += emitted
                if reason is not None or error is not None:
                    self._finish(seq, reason, error)
                continue
            if seq.prompt_logprobs is not None and start < len(seq.prompt) and not self._score(seq, start,
                                                                                               seq_logits):
                continue  # the scoring failed: the sequence has ended with the error
            if seq.cached < len(seq.prompt):
                continue  # a chunk of a scored prompt, not its last
            row_logits = seq_logits[-1]
            if seq.budget <= 0:  # a scored prompt with nothing to generate: it ends here, with its group
                followers, seq.followers = seq.followers, []
                for q in (*followers, seq):
                    if not q.ghost:
                        q.handle.state.finish("length")
                    self._finish(q, "length")
                continue
            if seq.followers:  # its prefill is done: the group's other sequences start from it
                self._start_followers(seq, row_logits)
            if seq.ghost:
                self._running.remove(seq)
                self._free.insert(0, seq.slot)
                continue
            self._sample(seq, row_logits)

    def _score(self, seq: EngineSequence, start: int, logits) -> bool:
        """A scored prompt's chunk from position `start` on, and `logits` its rows: each prompt token's
        `TokenLogprob`, handed to the group's handles once the prompt is done. False when it failed (the
        sequence has then ended with the error)."""
        prompt = seq.prompt
        try:
            for j in range(min(len(logits), len(prompt) - 1 - start)):
                seq.scored.append(token_logprob(logits[j], prompt[start + j + 1], seq.prompt_logprobs))
        except Exception as exc:  # a failure of this sequence only
            self._finish(seq, None, exc)
            return False
        if self.prefix_cache:  # kept with the slot's tokens, for a later prompt that shares them
            self._prefixes.set_scores(seq.slot, seq.scored, seq.prompt_logprobs)
        if seq.cached == len(prompt):
            for q in (seq, *seq.followers):
                q.handle.prompt_logprobs = [None, *seq.scored]
        return True

    def _start_followers(self, leader: EngineSequence, logits) -> None:
        n = leader.cached
        with self._cv:
            followers, leader.followers = leader.followers, []
            # Running before their caches are copied: should a copy fail, `step` ends them with the
            # error and frees their slots, as it does the leader's.
            self._running.extend(followers)
        for f in followers:
            self._copy_prefix(leader.slot, f.slot, n)
        for f in followers:
            f.cached = n
            self._sample(f, logits)

    def _sample(self, seq: EngineSequence, logits) -> None:
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

    def _finish(self, seq: EngineSequence, reason: str | None, error: BaseException | None = None) -> None:
        """End a sequence (reason "cancelled" or its own finish reason; or an error) and free its slot;
        with an error, the followers waiting on it share its fate."""
        if seq in self._running:
            self._running.remove(seq)
        if seq.slot >= 0:
            self._free.insert(0, seq.slot)  # taken last: its cached prefix may serve a later prompt
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
