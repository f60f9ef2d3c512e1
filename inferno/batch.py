"""``inferno batch``: generate for every request of a JSONL file through the continuous-batching engine.

    inferno batch requests.jsonl -o results.jsonl
    inferno batch requests.jsonl -o results.jsonl --slots 8 --max-new-tokens 100 --strict
    generate-requests | inferno batch - -o results.jsonl

Input: one JSON object per line (blank lines are skipped):

    {"id": "q1", "prompt": "The quick brown fox", "max_new_tokens": 20, "temperature": 0.8, "seed": 1}
    {"prompt": [464, 2068, 7586], "stop": ["\\n"], "logprobs": 2}

* ``id``: a string or an integer, unique in the file; without one, a request's id is its line number
  (1-based, counting blank lines).
* ``prompt`` (required): text, or a list of token ids; empty means unconditional generation.
* ``max_new_tokens`` (default: ``--max-new-tokens``), ``stop_at_eos`` (default: true, or false with
  ``--ignore-eos``), and every generation option: temperature, top_k, top_p, seed, stop, stop_ids,
  repetition_penalty, presence_penalty, frequency_penalty, logit_bias, logprobs (as `Pipeline.generate`
  takes them; logit_bias keys are token ids as strings). Any other key is an error for that line: a typo
  such as "temprature" must not silently produce greedy text.

Every line is parsed and checked (JSON, types, option values, prompt ids and length against the model)
before anything is generated. A malformed line is reported on stderr as ``inferno batch: IN:LINE: what``
and skipped; with ``--strict`` any malformed line ends the command (exit code 2) before anything is
generated, and OUT is neither created nor touched.

Output: one JSON object per finished request, ``{"id": ..., **the fields of inferno --json}``, written
(one write call per line, then flushed) as soon as that request finishes: the lines come in order of
completion, not input order, so join on ``id``. ``seconds`` and ``tokens_per_second`` of a line count
from the moment the request got a KV slot (not the time it waited for one), sharing each step with the
others. Non-ASCII text is escaped, so the file is exact whatever the locale.

Resuming: OUT is only ever appended to. When it exists, the ids of its complete lines are skipped and
the rest are run; a final line without its newline (a crash mid-write) and any line that is not an
output line are reported, left as they are, and not counted (their requests run again). Ctrl-C cancels
the requests in flight and reports ``[interrupted: N of M requests written to OUT]`` (M: the requests
this run had to do): OUT holds only complete lines, and the same command again finishes the job.

Progress goes to stderr: a tqdm bar when tqdm is installed and stderr is a terminal, else a line
rewritten in place on a terminal, else nothing per request; always a final line
``[N requests, T new tokens in S s, X tok/s; K skipped (already in OUT), E malformed]``.

``inferno score IN.jsonl -o OUT.jsonl`` (inferno/score_batch.py) scores texts with these same rules and
pieces: `parse_rows` (lines, ids, duplicates), `read_done` and `_Output` (resuming, whole lines),
`_DeferInterrupts`, `_Progress` and `_report`.

With ``--ray [ADDRESS]`` the same job runs on Ray Data, over ``--workers`` actors of ``--slots``
sequences each, and IN may also be Parquet or a folder (inferno/integrations/ray_batch.py).

Exit codes: 0 when every valid request was written (malformed lines were reported and skipped), 1 when
the engine failed some request (reported; rerun to retry them), 2 for usage errors and ``--strict``
failures, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from inferno.cli import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CliError,
    _add_model_args,
    _load,
    _non_negative,
    _Parser,
    _positive,
    _user_errors,
)
from inferno.errors import squash
from inferno.options import GenerationOptions

EXIT_FAILED = 1
PROG = "inferno batch"
#: The keys a request line may have, besides the generation options.
REQUEST_KEYS = ("id", "prompt", "max_new_tokens", "stop_at_eos")
#: Seconds between looks at the requests in flight while none has finished.
POLL_SECONDS = 0.05
#: Reports about lines of an existing OUT that are not output lines, before they are only counted.
MAX_OUT_REPORTS = 10


def known_keys() -> tuple[str, ...]:
    return REQUEST_KEYS + GenerationOptions.names()


class LineError(ValueError):
    """What is wrong with one input line; `id` is the line's request id when it was read before the
    problem was found."""

    def __init__(self, message: str, id: str | int | None = None) -> None:
        super().__init__(message)
        self.id = id


@dataclass
class Request:
    line: int  # 1-based line number in IN
    id: str | int
    prompt: str | list[int]
    max_new_tokens: int
    stop_at_eos: bool
    options: GenerationOptions
    prompt_ids: list[int] | None = None  # set once checked against the model


# ------------------------------------------------------------------------------------------ input


def _json_type(value: Any) -> str:
    names = {bool: "true or false", int: "a number", float: "a number", str: "a string", list: "a list",
             type(None): "null"}
    return names.get(type(value), type(value).__name__)


def read_object(text: str) -> dict[str, Any]:
    """One JSONL line as a JSON object (a key given twice is refused), or a `LineError` saying why not."""
    try:
        obj = json.loads(text, object_pairs_hook=_object)
    except json.JSONDecodeError as exc:
        raise LineError(f"not valid JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(obj, dict):
        raise LineError(f"expected a JSON object, got {_json_type(obj)}")
    return obj


def _describe(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, (dict, list)) else type(value).__name__


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise LineError(f"key {key!r} appears twice")
        seen[key] = value
    return seen


def parse_line(text: str, line: int, default_max_new_tokens: int, default_stop_at_eos: bool) -> Request:
    """One input line (not blank) as a `Request`, or a `LineError` saying what is wrong with it.

    The id is read first so that a line with a bad option still claims its id (see `parse_requests`):
    the error then carries it in `LineError.id`."""
    obj = read_object(text)

    if "id" in obj:
        rid = obj["id"]
        if isinstance(rid, bool) or not isinstance(rid, (str, int)):
            raise LineError(f"id must be a string or an integer, got {_describe(rid)}")
    else:
        rid = line
    try:
        return _fields(obj, rid, line, default_max_new_tokens, default_stop_at_eos)
    except LineError as exc:
        raise LineError(str(exc), rid) from None


def _fields(obj: dict[str, Any], rid: str | int, line: int, default_max_new_tokens: int,
            default_stop_at_eos: bool) -> Request:
    from inferno.options import OptionError
    from inferno.sampling import SamplingError

    known = known_keys()
    unknown = [key for key in obj if key not in known]
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise LineError(f"unknown key {unknown[0]!r} ({hint}known: {', '.join(known)})")

    if "prompt" not in obj:
        raise LineError('no "prompt" (text, or a list of token ids; "" for unconditional text)')
    prompt = obj["prompt"]
    if isinstance(prompt, list):
        bad = [i for i in prompt if isinstance(i, bool) or not isinstance(i, int)]
        if bad:
            raise LineError(f"prompt: a list of token ids must hold integers, got {_describe(bad[0])}")
    elif not isinstance(prompt, str):
        raise LineError(f"prompt must be text or a list of token ids, got {_describe(prompt)}")

    n = obj.get("max_new_tokens", default_max_new_tokens)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise LineError(f"max_new_tokens must be an integer >= 0, got {_describe(n)}")
    stop_at_eos = obj.get("stop_at_eos", default_stop_at_eos)
    if not isinstance(stop_at_eos, bool):
        raise LineError(f"stop_at_eos must be true or false, got {_describe(stop_at_eos)}")

    options = {key: value for key, value in obj.items() if key not in REQUEST_KEYS}
    # JSON shapes the options' own checks would take too loosely (a dict is an iterable of its keys).
    for key, kinds, expected in (("stop", (str, list), "a string or a list of strings"),
                                 ("stop_ids", (list,), "a list of token ids"),
                                 ("logit_bias", (dict,), 'an object {"token id": bias, ...}')):
        if options.get(key) is not None and not isinstance(options[key], kinds):
            raise LineError(f"{key} must be {expected}, got {_describe(options[key])}")
    try:
        opts = GenerationOptions.from_kwargs(**options)
    except (OptionError, SamplingError, TypeError) as exc:
        raise LineError(str(exc)) from None
    return Request(line, rid, prompt, n, stop_at_eos, opts)


def split_lines(data: bytes) -> list[tuple[int, bytes]]:
    """(line number, content) of every non-blank line; a UTF-8 byte-order mark and CR-LF are allowed."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [(i, raw.rstrip(b"\r")) for i, raw in enumerate(lines, 1) if raw.strip()]


def parse_requests(data: bytes, default_max_new_tokens: int,
                   default_stop_at_eos: bool) -> tuple[list[Request], list[tuple[int, str]]]:
    """Every request of an input file, and (line, message) for every malformed line. A duplicate id is
    an error for the later line, even when the earlier line was malformed for another reason."""
    return parse_rows(data, lambda text, line: parse_line(text, line, default_max_new_tokens,
                                                          default_stop_at_eos))


def parse_rows(data: bytes, parse: Callable[[str, int], Any]) -> tuple[list[Any], list[tuple[int, str]]]:
    """`parse(text, line)` of every non-blank line of an input file (an object with an ``id``, or a
    `LineError`), and (line, message) for every malformed line, duplicate ids included: the rules of
    `parse_requests`, for any kind of row (``inferno score -o`` reads its texts with them too)."""
    requests: list[Any] = []
    errors: list[tuple[int, str]] = []
    first_line: dict[str | int, int] = {}
    for line, raw in split_lines(data):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            errors.append((line, f"not UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})"))
            continue
        req, problem = None, None
        try:
            req = parse(text, line)
            rid = req.id
        except LineError as exc:
            rid, problem = exc.id, str(exc)
        if rid is not None and rid in first_line:
            problem = f"duplicate id {json.dumps(rid)} (first on line {first_line[rid]})"
        elif rid is not None:
            first_line[rid] = line
        if problem is not None:
            errors.append((line, problem))
        elif req is not None:
            requests.append(req)
    return requests, errors


def check_request(pipe: Any, req: Request) -> None:
    """Check a request against the loaded model (prompt ids, context length, option token ids) and
    record its prompt ids; raises `LineError`."""
    from inferno import generate
    from inferno.options import OptionError

    try:  # the very checks the engine makes at submission
        req.prompt_ids = generate.check_request(pipe.config, pipe.encode(req.prompt), req.max_new_tokens,
                                                [req.options], pipe.sample_limit)
    except (generate.GenerationError, OptionError) as exc:
        raise LineError(str(exc)) from None


# ----------------------------------------------------------------------------------------- output


@dataclass
class Done:
    """What an existing OUT already holds."""

    ids: set
    notes: list[str]  # problems found, as "LINE: what" (reported, never fixed)
    needs_newline: bool  # OUT does not end with a newline: the next line must start on a new one


def read_done(path: Path) -> Done:
    """The ids of the complete output lines of `path` (absent: none)."""
    ids: set = set()
    notes: list[str] = []
    bad = 0
    needs_newline = False
    if not path.exists():
        return Done(ids, notes, False)
    with open(path, "rb") as f:
        line = 0
        for line, raw in enumerate(f, 1):
            complete = raw.endswith(b"\n")
            if not complete:
                needs_newline = True
            if not raw.strip():
                continue
            rid, why = _output_id(raw)
            if rid is not None:
                ids.add(rid)
                continue
            if not complete:
                notes.append(f"{line}: a partial last line ({len(raw)} bytes, no newline: an interrupted "
                             "write?) is left as it is and not counted")
                continue
            bad += 1
            if bad <= MAX_OUT_REPORTS:
                notes.append(f"{line}: not an output line ({why}); left as it is and not counted")
        if bad > MAX_OUT_REPORTS:
            notes.append(f"{line}: ... and {bad - MAX_OUT_REPORTS} more lines that are not output lines")
    return Done(ids, notes, needs_newline)


def _output_id(raw: bytes) -> tuple[str | int | None, str]:
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None, "not JSON"
    if not isinstance(obj, dict) or "id" not in obj:
        return None, "no id"
    rid = obj["id"]
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        return None, "its id is not a string or an integer"
    return rid, ""


class _Output:
    """Appends whole lines to OUT: one `os.write` per line, so a line is in the file entirely or not at all
    (a line written across several calls only if the OS returns a short write, which it does not for
    regular files). Never truncates."""

    def __init__(self, path: Path, needs_newline: bool) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o666)
        self.prefix = b"\n" if needs_newline else b""

    def write(self, obj: dict[str, Any]) -> None:
        data = self.prefix + json.dumps(obj).encode("ascii") + b"\n"
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]
        self.prefix = b""

    def close(self) -> None:
        os.close(self.fd)


class _DeferInterrupts:
    """Ctrl-C as usual, except inside `critical()`: there it waits until the block ends, so that a line
    written to OUT is also counted (and no line is cut). Only in the main thread, and only when SIGINT
    has Python's default handler (not when it is ignored, as under nohup)."""

    def __init__(self) -> None:
        self.pending = False
        self.deferring = False
        self.previous: Any = None

    def __enter__(self) -> _DeferInterrupts:
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self.previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            self.previous = None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.deferring:
            self.pending = True
            return
        raise KeyboardInterrupt

    def hold(self) -> None:
        """Defer every further Ctrl-C until the end of the `with` block (which drops them)."""
        self.deferring = True

    def critical(self) -> _Critical:
        return _Critical(self)


class _Critical:
    def __init__(self, owner: _DeferInterrupts) -> None:
        self.owner = owner

    def __enter__(self) -> None:
        self.owner.deferring = True

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        self.owner.deferring = False
        if self.owner.pending and exc_type is None:
            self.owner.pending = False
            raise KeyboardInterrupt


class _Progress:
    """Requests done so far, on stderr: a tqdm bar if tqdm is installed (tqdm hides it when stderr is
    not a terminal), else one line rewritten in place on a terminal, else nothing."""

    def __init__(self, total: int, stream: IO[str], tqdm: Any = None, *, desc: str = PROG, unit: str = "req",
                 items: str = "requests", tokens: str = "new tokens") -> None:
        self.total, self.stream, self.tty = total, stream, stream.isatty()
        self.items, self.token_words = items, tokens
        self.done = self.tokens = 0
        self.start = time.perf_counter()
        self.bar = None
        if tqdm is not None:
            self.bar = tqdm(total=total, desc=desc, unit=unit, file=stream, disable=None, leave=False)

    def update(self, new_tokens: int) -> None:
        self.done += 1
        self.tokens += new_tokens
        seconds = time.perf_counter() - self.start
        rate = self.tokens / seconds if seconds > 0 else 0.0
        if self.bar is not None:
            self.bar.set_postfix_str(f"{self.tokens} tok, {rate:.1f} tok/s", refresh=False)
            self.bar.update(1)
        elif self.tty:
            self.stream.write(f"\r\x1b[K[{self.done}/{self.total} {self.items}, {self.tokens} "
                              f"{self.token_words}, {rate:.1f} tok/s]")
            self.stream.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.tty and self.done:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.done = 0


def _tqdm() -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


# -------------------------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Generate for every request of a JSONL file (one JSON object per "
                "line: id, prompt, max_new_tokens, stop_at_eos and generation options) through the "
                "continuous-batching engine; results are appended to OUT as they finish.",
                epilog="Output lines come in order of completion: join on \"id\". An existing OUT is "
                "resumed: requests whose id it holds are skipped. Exit codes: 0 done, 1 some requests "
                "failed, 2 usage errors and --strict failures, 130 Ctrl-C.")
    p.add_argument("input", metavar="IN.jsonl", help="requests, one JSON object per line; - for stdin")
    p.add_argument("-o", "--output", metavar="OUT.jsonl", required=True,
                   help="results, appended one JSON line per request (never truncated)")
    _add_model_args(p)
    arg = p.add_argument
    arg("--slots", metavar="N", type=_positive,
        help="sequences generated at once (default: the number of requests, at most 16)")
    arg("--prefill-chunk", metavar="N", type=_positive,
        help="prompt tokens run per engine step (default 64)")
    arg("--max-new-tokens", metavar="N", type=_non_negative, default=50,
        help="tokens to generate for requests that do not say (50)")
    arg("--ignore-eos", action="store_true",
        help="keep generating past <|endoftext|> in requests that do not set stop_at_eos")
    arg("--strict", action="store_true",
        help="any malformed line is an error (exit 2) before anything is generated")
    from inferno.integrations import add_ray_args  # the flags only: Ray itself is imported by --ray

    add_ray_args(p)
    return p


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def _read_input(name: str, prog: str = PROG, items: str = "requests") -> bytes:
    if name == "-":
        if sys.stdin.isatty():
            raise CliError(f"give an IN.jsonl file, or pipe the {items} in: {prog} - -o OUT < IN.jsonl")
        return sys.stdin.buffer.read()
    path = Path(name)
    if path.is_dir():
        raise CliError(f"{name}: is a folder, not a JSONL file")
    with open(path, "rb") as f:
        return f.read()


def _check_output(name: str, input_name: str) -> Path:
    if name == "-":
        raise CliError("-o: give a file (results are appended to it, and it makes the run resumable)")
    out = Path(name)
    if input_name != "-" and _same_file(out, Path(input_name)):
        raise CliError(f"-o {name}: that is the input file; give another file for the results")
    parent = out.parent
    if not parent.is_dir():
        raise CliError(f"-o {name}: the folder {parent} does not exist")
    if out.is_dir():
        raise CliError(f"-o {name}: is a folder")
    return out


def run_batch_cli(argv: Sequence[str]) -> int:
    """Entry point of ``inferno batch`` (`argv`: the arguments after ``batch``). Returns the exit code."""
    try:
        try:
            args = _parser().parse_args(list(argv))
        except SystemExit as exc:  # --help, or a bad flag (already reported on one line)
            return int(exc.code or 0)
        return _run(args)
    except KeyboardInterrupt:
        print("\n[interrupted]", file=sys.stderr)
        return EXIT_INTERRUPTED
    except _user_errors() as exc:
        message = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return EXIT_USAGE


def _run(args: argparse.Namespace) -> int:
    from inferno.integrations import run_ray_job, without_ray

    if args.ray is not None:  # the same job on Ray Data: inferno/integrations/ray_batch.py
        return run_ray_job("generate", args, PROG)
    flag = without_ray(args)
    if flag:
        raise CliError(f"{flag} needs --ray (one process runs one engine: use --slots)")
    out_path = _check_output(args.output, args.input)
    source = "stdin" if args.input == "-" else args.input
    requests, errors = parse_requests(_read_input(args.input), args.max_new_tokens, not args.ignore_eos)
    done = read_done(out_path)
    for note in done.notes:
        print(f"{PROG}: {args.output}:{note}", file=sys.stderr)

    # Lines wrong in themselves first (with --strict, before the model is loaded), then lines the model
    # cannot take (prompt ids, context length, option token ids).
    _report(errors, source, args.strict)
    pipe = _load(args)
    valid, late = checked(pipe, requests, check_request)
    _report(late, source, args.strict)
    errors += late

    todo = [req for req in valid if req.id not in done.ids]
    skipped = len(valid) - len(todo)
    return _generate(pipe, args, todo, out_path, done.needs_newline, skipped, len(errors), source)


def checked(pipe: Any, requests: list, check: Any) -> tuple[list, list[tuple[int, str]]]:
    """`requests` split by ``check(pipe, req)``: those it accepts, and (line, message) for those it
    rejects with a `LineError`."""
    valid, late = [], []
    for req in requests:
        try:
            check(pipe, req)
            valid.append(req)
        except LineError as exc:
            late.append((req.line, str(exc)))
    return valid, late


def _report(errors: list[tuple[int, str]], source: str, strict: bool, prog: str = PROG,
            done: str = "generated") -> None:
    for line, message in sorted(errors):
        print(f"{prog}: {source}:{line}: {message}", file=sys.stderr)
    if strict and errors:
        raise CliError(f"--strict: {len(errors)} malformed line{'s' * (len(errors) != 1)} in {source}; "
                       f"nothing was {done}")


def _generate(pipe: Any, args: argparse.Namespace, todo: list[Request], out_path: Path,
              needs_newline: bool, skipped: int, malformed: int, source: str) -> int:
    from inferno.engine import DEFAULT_PREFILL_CHUNK, DEFAULT_SLOTS

    run = _BatchRun(pipe, source, _Output(out_path, needs_newline), _Progress(len(todo), sys.stderr, _tqdm()))
    slots = args.slots or max(1, min(len(todo), DEFAULT_SLOTS))
    start = time.perf_counter()
    with run.interrupts:
        try:
            run.engine = pipe.engine(slots=slots, max_queue=None,
                                     prefill_chunk=args.prefill_chunk or DEFAULT_PREFILL_CHUNK)
            run.run(todo, slots)
        except KeyboardInterrupt:
            run.interrupts.hold()  # a second Ctrl-C must not cut the clean-up short
            run.cancel()
            print(f"[interrupted: {run.written} of {len(todo)} requests written to {args.output}]",
                  file=sys.stderr)
            return EXIT_INTERRUPTED
        finally:
            run.close()
    seconds = time.perf_counter() - start
    rate = run.tokens / seconds if seconds > 0 else 0.0
    tail = f", {run.failed} failed (run again to retry them)" if run.failed else ""
    print(f"[{run.written} requests, {run.tokens} new tokens in {seconds:.2f} s, {rate:.1f} tok/s; "
          f"{skipped} skipped (already in OUT), {malformed + run.rejected} malformed{tail}]", file=sys.stderr)
    return EXIT_FAILED if run.failed else 0


class _BatchRun:
    """Submits the requests to the engine and writes each result as soon as it is done."""

    def __init__(self, pipe: Any, source: str, output: _Output, progress: _Progress) -> None:
        self.pipe, self.source, self.output, self.progress = pipe, source, output, progress
        self.interrupts = _DeferInterrupts()
        self.engine: Any = None
        self.pending: list[tuple[Request, Any]] = []  # (request, handle), in submission order
        self.written = self.tokens = self.failed = self.rejected = 0

    def token_text(self, i: int) -> str:
        return self.pipe.tokenizer.decode([i])

    def run(self, todo: list[Request], slots: int) -> None:
        from inferno.generate import GenerationError
        from inferno.options import OptionError

        for req in todo:
            try:
                handle = self.pipe.submit(self.engine, req.prompt_ids, req.max_new_tokens,
                                          stop_at_eos=req.stop_at_eos, options=req.options)
            except (GenerationError, OptionError) as exc:  # checked up front: only if the engine checks more
                self.rejected += 1
                print(f"{PROG}: {self.source}:{req.line}: {exc}", file=sys.stderr)
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
            print(f"{PROG}: {self.source}:{req.line}: id {json.dumps(req.id)} failed: "
                  f"{type(handle.error).__name__}: {reason}", file=sys.stderr)
            return
        result = handle.result()
        line = {"id": req.id, **result.to_dict(self.token_text)}
        with self.interrupts.critical():  # written and counted, or neither
            self.output.write(line)
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


if __name__ == "__main__":
    sys.exit(run_batch_cli(sys.argv[1:]))
