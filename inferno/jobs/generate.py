"""Generation jobs: every request of a JSONL file through the continuous-batching engine, each result
appended to OUT as soon as it finishes (``inferno batch``; the Ray job reads its rows with the same
`parse_line` and `check_request`).

A request line is ``{"id", "prompt", "max_new_tokens", "stop_at_eos", **generation options}``: id
optional (its line number), prompt text or token ids, every option as `Pipeline.generate` takes it
(logit_bias keys are token ids as strings). Instead of a prompt a line may give ``messages``, a
conversation that the model's chat template renders into the prompt when the line is checked against the
model (`chat`). Any other key is an error for that line: a typo such as "temprature" must not silently
produce greedy text. A line of OpenAI's Batch API format (``custom_id``, ``method``, ``url``, ``body``)
runs its /v1/completions or /v1/chat/completions body and is answered in that format (`openai_batch`).
"""

from __future__ import annotations

import difflib
import json
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inferno.errors import squash
from inferno.jobs.chat import chat_prompt, read_messages
from inferno.jobs.constraints import CONSTRAINT_KEYS, pop_constraint
from inferno.jobs.fits import too_long
from inferno.jobs.lines import LineError, describe, parse_rows, read_object
from inferno.jobs.openai_batch import is_batch_line, native_line, response_line, token_bytes
from inferno.jobs.output import Output
from inferno.jobs.plan import JobPlan
from inferno.jobs.progress import DeferInterrupts, JobReport, Progress
from inferno.options import GenerationOptions

#: The keys a request line may have, besides the generation options.
REQUEST_KEYS = ("id", "prompt", "messages", "max_new_tokens", "stop_at_eos")
#: Seconds between looks at the requests in flight while none has finished.
POLL_SECONDS = 0.05


def known_keys() -> tuple[str, ...]:
    """The keys a line may have: the request's, the structured-output fields as the server takes them
    (`constraints`), and the generation options but ``constraint`` (a line says it with those fields)."""
    return REQUEST_KEYS + CONSTRAINT_KEYS + tuple(n for n in GenerationOptions.names() if n != "constraint")


@dataclass
class Request:
    line: int  # 1-based line number in IN
    id: str | int
    prompt: str | list[int]  # a conversation's: rendered by `check_request`
    max_new_tokens: int | None  # None until checked: a chat line without a budget runs to the context's end
    stop_at_eos: bool
    options: GenerationOptions
    prompt_ids: list[int] | None = None  # set once checked against the model
    digest: str | None = None  # the fingerprint of its input line (`lines.line_digest`)
    openai: dict[str, Any] | None = None  # a Batch API line: what its response needs (`openai_batch`)
    messages: list[dict[str, str]] | None = None  # a conversation, for the model's chat template


def parse_line(text: str, line: int, default_max_new_tokens: int, default_stop_at_eos: bool) -> Request:
    """One input line (not blank) as a `Request`, or a `LineError` saying what is wrong with it.

    The id is read first so that a line with a bad option still claims its id (see `parse_requests`):
    the error then carries it in `LineError.id`."""
    obj = read_object(text)
    if is_batch_line(obj):  # OpenAI's Batch API format: run as inferno's own line, answered in its shape
        custom_id, native, meta = native_line(obj)
        chat_budget = None if "messages" in native else default_max_new_tokens  # OpenAI's: the context
        try:
            req = _fields(native, custom_id, line, chat_budget, default_stop_at_eos)
        except LineError as exc:
            raise LineError(f"body: {exc}", custom_id) from None
        req.openai = meta
        return req

    if "id" in obj:
        rid = obj["id"]
        if isinstance(rid, bool) or not isinstance(rid, (str, int)):
            raise LineError(f"id must be a string or an integer, got {describe(rid)}")
    else:
        rid = line
    try:
        return _fields(obj, rid, line, default_max_new_tokens, default_stop_at_eos)
    except LineError as exc:
        raise LineError(str(exc), rid) from None


def _fields(obj: dict[str, Any], rid: str | int, line: int, default_max_new_tokens: int | None,
            default_stop_at_eos: bool) -> Request:
    from inferno.options import OptionError
    from inferno.sampling import SamplingError

    known = known_keys()
    unknown = [key for key in obj if key not in known]
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise LineError(f"unknown key {unknown[0]!r} ({hint}known: {', '.join(known)})")

    messages = None
    if "messages" in obj:
        if "prompt" in obj:
            raise LineError('"prompt" and "messages" both give the prompt: give one of them')
        messages = read_messages(obj["messages"], "messages")
        prompt: Any = ""  # rendered with the model's chat template once it is loaded (`check_request`)
    elif "prompt" not in obj:
        raise LineError('no "prompt" (text, or a list of token ids; "" for unconditional text) nor '
                        '"messages" (a conversation for the model\'s chat template)')
    else:
        prompt = obj["prompt"]
    if isinstance(prompt, list):
        bad = [i for i in prompt if isinstance(i, bool) or not isinstance(i, int)]
        if bad:
            raise LineError(f"prompt: a list of token ids must hold integers, got {describe(bad[0])}")
    elif not isinstance(prompt, str):
        raise LineError(f"prompt must be text or a list of token ids, got {describe(prompt)}")

    n = obj.get("max_new_tokens", default_max_new_tokens)
    given = n is not None or "max_new_tokens" in obj  # None: a chat line's budget, the context's end
    if given and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
        raise LineError(f"max_new_tokens must be an integer >= 0, got {describe(n)}")
    stop_at_eos = obj.get("stop_at_eos", default_stop_at_eos)
    if not isinstance(stop_at_eos, bool):
        raise LineError(f"stop_at_eos must be true or false, got {describe(stop_at_eos)}")

    options = {key: value for key, value in obj.items() if key not in REQUEST_KEYS}
    structured = pop_constraint(options)
    if structured is not None:
        options["constraint"] = structured
    # JSON shapes the options' own checks would take too loosely (a dict is an iterable of its keys).
    for key, kinds, expected in (("stop", (str, list), "a string or a list of strings"),
                                 ("stop_ids", (list,), "a list of token ids"),
                                 ("logit_bias", (dict,), 'an object {"token id": bias, ...}')):
        if options.get(key) is not None and not isinstance(options[key], kinds):
            raise LineError(f"{key} must be {expected}, got {describe(options[key])}")
    try:
        opts = GenerationOptions.from_kwargs(**options)
    except (OptionError, SamplingError, TypeError) as exc:
        raise LineError(str(exc)) from None
    return Request(line, rid, prompt, n, stop_at_eos, opts, messages=messages)


def parse_requests(data: bytes, default_max_new_tokens: int,
                   default_stop_at_eos: bool) -> tuple[list[Request], list[tuple[int, str]]]:
    """Every request of an input file, and (line, message) for every malformed line. A duplicate id is
    an error for the later line, even when the earlier line was malformed for another reason."""
    return parse_rows(data, lambda text, line: parse_line(text, line, default_max_new_tokens,
                                                          default_stop_at_eos))


def check_request(pipe: Any, req: Request) -> None:
    """Check a request against the loaded model (its conversation rendered with the model's chat
    template, prompt ids, context length, option token ids) and record its prompt ids; raises
    `LineError`."""
    from inferno import generate
    from inferno.options import OptionError

    where = ""  # a conversation's prompt: what is wrong with it names the field
    if req.messages is not None:
        field = "body.messages" if req.openai is not None else "messages"
        req.prompt = chat_prompt(pipe, req.messages, field)
        where = f"{field} (rendered by the chat template): "
    if req.max_new_tokens is None:  # as much as the context leaves
        req.max_new_tokens = pipe.config.n_positions
    if isinstance(req.prompt, str):
        reason = too_long(pipe.tokenizer, req.prompt, pipe.config.n_positions)
        if reason:
            raise LineError(where + reason)
    if (req.openai is not None or req.messages is not None) and isinstance(req.prompt, str):
        # As the server reads a prompt; a chat template writes the special tokens it needs as text.
        ids = pipe.tokenizer.encode(req.prompt, allow_special=True) or [pipe.empty_prompt_id]
    else:
        ids = pipe.encode(req.prompt)
    try:  # the very checks the engine makes at submission
        req.prompt_ids = generate.check_request(pipe.config, ids, req.max_new_tokens, [req.options],
                                                pipe.sample_limit)
    except generate.GenerationError as exc:
        raise LineError(where + str(exc)) from None
    except OptionError as exc:
        raise LineError(str(exc)) from None


def run_generation(plan: JobPlan, progress: Progress, say: Callable[[str], None], *, slots: int | None = None,
                   prefill_chunk: int | None = None, engine_options: dict | None = None) -> JobReport:
    """Generate for `plan.todo` on one engine of `slots` sequences (default: the number of requests, at
    most 16), writing each result to OUT as it finishes; `engine_options`: more of `Engine`'s keywords
    (speculative decoding's). Ctrl-C cancels the requests in flight: the
    report then says `interrupted`, and OUT holds only complete lines."""
    from inferno.engine import DEFAULT_PREFILL_CHUNK, DEFAULT_SLOTS

    todo = plan.todo
    output = Output(plan.out_path, plan.needs_newline, plan.out_fd)
    run = _GenerationRun(plan.pipe, plan.source, output, progress, say)
    slots = slots or max(1, min(len(todo), DEFAULT_SLOTS))
    report = JobReport(todo=len(todo), skipped=plan.skipped)
    start = time.perf_counter()
    with run.interrupts:
        try:
            run.engine = plan.pipe.engine(slots=slots, max_queue=None,
                                          prefill_chunk=prefill_chunk or DEFAULT_PREFILL_CHUNK,
                                          **(engine_options or {}))
            run.run(todo)
        except KeyboardInterrupt:
            run.interrupts.hold()  # a second Ctrl-C must not cut the clean-up short
            run.cancel()
            report.interrupted = True
        finally:
            run.close()
    report.seconds = time.perf_counter() - start
    report.written, report.tokens, report.failed = run.written, run.tokens, run.failed
    report.malformed = plan.malformed + run.rejected
    return report


class _GenerationRun:
    """Submits the requests to the engine and writes each result as soon as it is done."""

    def __init__(self, pipe: Any, source: str, output: Output, progress: Progress,
                 say: Callable[[str], None]) -> None:
        self.pipe, self.source, self.output, self.progress, self.say = pipe, source, output, progress, say
        self.interrupts = DeferInterrupts()
        self.engine: Any = None
        self.pending: list[tuple[Request, Any]] = []  # (request, handle), in submission order
        self.written = self.tokens = self.failed = self.rejected = 0

    def token_text(self, i: int) -> str:
        return self.pipe.tokenizer.decode([i])

    def token_bytes(self, i: int) -> bytes:
        return token_bytes(self.pipe.tokenizer)(i)

    def run(self, todo: list[Request]) -> None:
        from inferno.generate import GenerationError
        from inferno.options import OptionError

        for req in todo:
            try:
                handle = self.pipe.submit(self.engine, req.prompt_ids, req.max_new_tokens,
                                          stop_at_eos=req.stop_at_eos, options=req.options)
            except (GenerationError, OptionError) as exc:  # checked up front: only if the engine checks more
                self.rejected += 1
                self.say(f"{self.source}:{req.line}: {exc}")
                continue
            self.pending.append((req, handle))
        # Each handle reports its own end; lines are written here, in the main thread, as they come.
        done: queue.SimpleQueue = queue.SimpleQueue()
        for req, handle in self.pending:
            handle.add_done_callback(lambda h, req=req: done.put((req, h)))
        left = len(self.pending)
        while left:
            try:
                req, handle = done.get(timeout=POLL_SECONDS)
            except queue.Empty:
                _check_alive(self.engine)
                continue
            self._finished(req, handle)
            left -= 1

    def _finished(self, req: Request, handle: Any) -> None:
        if handle.error is not None:
            self.failed += 1
            reason = squash(handle.error)
            self.say(f"{self.source}:{req.line}: id {json.dumps(req.id)} failed: "
                     f"{type(handle.error).__name__}: {reason}")
            return
        result = handle.result()
        line = {"id": req.id, **result.to_dict(self.token_text)}
        if req.openai is not None:
            line = response_line(req.id, req.openai, req.prompt_ids, line, self.token_text, self.token_bytes)
        with self.interrupts.critical():  # written and counted, or neither
            self.output.write(line, req.digest)
            self.written += 1
            self.tokens += result.new_tokens
        self.progress.update(result.new_tokens)

    def cancel(self) -> None:
        for _, handle in self.pending:
            handle.cancel()
        self.close()

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        self.progress.close()
        if self.output is not None:
            self.output.close()
            self.output = None


def _check_alive(engine: Any) -> None:
    # If the step loop had stopped (it fails requests rather than dying), no handle would ever finish.
    if not engine.alive:
        raise RuntimeError("the engine's step loop stopped with requests in flight")
