"""What every subcommand shares: exit codes, `CliError`, the one-line parser, the number types, the
model flags (``-m/-b/--threads``), loading the model they name, reading a text file, and the --ray flags.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A problem the user can fix; printed as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line instead of usage + message
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class Number(NamedTuple):
    """An argparse type: `kind(text)`, refused with "expected {expected}, got ..." unless `check`
    holds for it. A tuple with `__call__` rather than a closure, so that its code runs when a flag is
    parsed, under a test, not when this module is imported (where mutation testing cannot see it)."""

    kind: type
    check: Callable[[float], bool]
    expected: str

    def __call__(self, text: str):
        try:
            value = self.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {self.expected}, got {text!r}") from None
        if not self.check(value):
            raise argparse.ArgumentTypeError(f"expected {self.expected}, got {text!r}")
        return value


temperature = Number(float, lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0")
top_p = Number(float, lambda v: 0 < v <= 1, "a number in (0, 1]")
non_negative = Number(int, lambda v: v >= 0, "an integer >= 0")
positive = Number(int, lambda v: v >= 1, "an integer >= 1")
seed = Number(int, lambda v: v >= 0, "an integer >= 0")


ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'"}


def unescape(text: str) -> str:
    """Backslash escapes in a --stop string (\\n, \\t, \\r, \\\\, \\", \\'), as llama.cpp reads them."""
    return re.sub(r"\\(.)", lambda m: ESCAPES.get(m.group(1), m.group(0)), text)


def bias(text: str) -> tuple[int, float]:
    token, sep, value = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return int(token), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ID=BIAS (e.g. 50256=-100), got {text!r}") from None


bias.__name__ = "ID=BIAS"


def add_model_args(p: argparse.ArgumentParser) -> None:
    arg = p.add_argument
    arg("-m", "--model", "--model-dir", dest="model_dir", metavar="NAME",
        help="a folder, a Hub name (gpt2, gpt2-medium, gpt2-large, gpt2-xl, distilgpt2, or "
        "ORG/NAME[@REVISION] of a GPT-2 or Llama-family model, as HuggingFaceTB/SmolLM2-135M-Instruct) or "
        "random / random:tiny (default: gpt2 from the Hugging Face cache; see docs/models.md)")
    arg("-b", "--backend", metavar="NAME", help="compute backend, optionally with options: "
        "NAME[:key=value,...] (default: $INFERNO_BACKEND or numpy; see 'inferno backends')")
    arg("--threads", metavar="N", type=positive,
        help="worker threads (cpu-threaded, torch, half; default: usable cores); other backends reject it")


def load(args: argparse.Namespace):
    import inferno
    from inferno.backends.registry import BackendOptionError, get_backend

    backend = args.backend
    if args.threads is not None:
        try:
            backend = get_backend(args.backend, threads=args.threads)
        except BackendOptionError as exc:
            raise CliError(f"--threads: {exc}") from None
    return inferno.load(args.model_dir, backend)


def count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


#: The most bytes read as one text (a prompt, a text to score): far beyond any context, and a bound on
#: what /dev/zero or a runaway pipe can make the command hold.
MAX_TEXT_BYTES = 64 << 20


def read_stdin(limit: int = MAX_TEXT_BYTES, what: str = "a text") -> bytes:
    """All of stdin, refused (a `CliError`) past `limit` bytes."""
    data = sys.stdin.buffer.read(limit + 1)
    if len(data) > limit:
        raise CliError(f"stdin: more than the {limit}-byte limit for {what}")
    return data


def read_text(name: str, flag: str = "") -> str:
    """The UTF-8 text of file `name` (``-``: stdin), less a byte-order mark. A missing, special (FIFO,
    device) or oversized file is a `CliError` naming `flag` and the file."""
    from inferno.files import read_regular_file

    if name == "-":
        if sys.stdin.isatty():
            raise CliError("give a FILE to score, or pipe the text in: inferno score - < FILE")
        data, name = read_stdin(), "stdin"
    else:
        try:
            data = read_regular_file(name, MAX_TEXT_BYTES, "a text")
        except OSError as exc:
            raise CliError(f"{flag + ' ' if flag else ''}{name}: {exc.strerror or exc}") from None
    return decode_text(data, name)


def decode_text(data: bytes, name: str) -> str:
    """`data` as UTF-8 text, a leading byte-order mark dropped (it is not part of the text)."""
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        bad = f"byte 0x{data[exc.start]:02x} at offset {exc.start}"
        raise CliError(f"{name}: not UTF-8 text ({bad})") from None
    return text.removeprefix("\ufeff")


def check_utf8(text: str, what: str) -> str:
    """`text` from the command line as UTF-8 text, or a `CliError` when it is not Unicode text: bytes that
    are not UTF-8 (Python keeps them as lone surrogates) or a lone UTF-16 surrogate. The server and
    jobs refuse these too; silently they would become U+FFFD."""
    try:
        data = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        raise CliError(f"{what} holds a lone UTF-16 surrogate (U+{ord(text[exc.start]):04X}), which is not "
                       "Unicode text") from None
    if any("\udc80" <= c <= "\udcff" for c in text):  # bytes Python could not decode, kept as they were
        return decode_text(data, what)  # raises, naming the byte and its offset, unless they are UTF-8
    return text


def user_errors() -> tuple[type[BaseException], ...]:
    from inferno.backends.registry import BackendOptionError, BackendUnavailableError, UnknownBackendError
    from inferno.generate import GenerationError
    from inferno.jobs import JobError
    from inferno.models.config import ConfigError
    from inferno.models.resolve import ModelFilesMissing
    from inferno.models.weights import WeightsError
    from inferno.sampling import SamplingError
    from inferno.scoring import ScoringError
    from inferno.tokenizer import TokenizerError

    return (CliError, JobError, ConfigError, WeightsError, TokenizerError, ModelFilesMissing,
            UnknownBackendError, BackendUnavailableError, BackendOptionError, GenerationError, SamplingError,
            ScoringError, OSError)


# ------------------------------------------------------------------- structured output (#42)

#: The flags that constrain the output, one of which at most may be given (argparse refuses two).
CONSTRAINT_FLAGS = ("--json-schema", "--json-object", "--regex", "--choice", "--grammar")


def add_constraint_args(p: argparse.ArgumentParser) -> None:
    """The flags that constrain the output to a JSON Schema, any JSON object, a regular expression, one
    of a list of choices or a Lark grammar (docs/structured-output.md). `-j/--json` is the output format,
    hence ``--json-object`` for JSON mode."""
    group = p.add_mutually_exclusive_group()
    arg = group.add_argument
    arg("--json-schema", metavar="FILE|JSON",
        help="the output is JSON valid against this JSON Schema: a .json file, or inline JSON starting "
        "with '{' (needs the structured extra, as do the four flags below)")
    arg("--json-object", action="store_true", help="the output is one JSON object (any keys)")
    arg("--regex", metavar="PATTERN", help="the output matches this regular expression, whole")
    arg("--choice", metavar="TEXT", action="append",
        help="the output is exactly one of these texts (repeatable: --choice yes --choice no)")
    arg("--grammar", metavar="FILE", help="the output is a sentence of this Lark grammar (a file)")


def constraint(args: argparse.Namespace):
    """The `inferno.structured.Constraint` the flags of `add_constraint_args` ask for (None when none
    is given). A bad file, JSON, schema, pattern or grammar, or llguidance missing, is a `CliError`
    naming the flag."""
    from inferno.structured import Constraint, ConstraintError

    try:
        if args.json_schema is not None:
            return Constraint.json_schema(_schema(args.json_schema), field="--json-schema")
        if args.json_object:
            return Constraint.json_object(field="--json-object")
        if args.regex is not None:
            return Constraint.regex(check_utf8(args.regex, "--regex"), field="--regex")
        if args.choice is not None:
            return Constraint.choice([check_utf8(c, "--choice") for c in args.choice], field="--choice")
        if args.grammar is not None:
            return Constraint.grammar(_constraint_file(args.grammar, "--grammar"), field="--grammar")
    except ConstraintError as exc:
        sep = " " if exc.reason.startswith(("is ", "must ", "has ", "needs ")) else ": "
        raise CliError(" ".join(f"{exc.field}{sep}{exc.reason}".split())) from None  # it may span lines
    return None


def _constraint_file(name: str, flag: str) -> str:
    if name == "-":
        raise CliError(f"{flag}: give a file (stdin is where the prompt comes from)")
    if os.path.isdir(name):
        raise CliError(f"{flag} {name}: is a folder, not a file")
    return read_text(name, flag)


def _schema(value: str):
    """--json-schema's JSON Schema: inline JSON (text starting with '{'), else the JSON of that file."""
    inline = value.lstrip().startswith("{")
    text = check_utf8(value, "--json-schema") if inline else _constraint_file(value, "--json-schema")
    where = "--json-schema" if inline else f"--json-schema {value}"
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        hint = "" if inline or value.endswith(".json") else " (inline JSON starts with '{')"
        raise CliError(f"{where}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
                       f"{hint}") from None
    except RecursionError:
        raise CliError(f"{where}: not valid JSON: nested too deeply") from None


# ------------------------------------------------------------------------------- --ray (Ray Data)

#: The flags that only mean something with --ray.
RAY_ONLY = ("workers", "cpus_per_worker")


def add_speculation_args(p: argparse.ArgumentParser) -> None:
    """Speculative decoding's flags (`inferno.speculative`), as generate, batch and serve take them."""
    group = p.add_argument_group("speculative decoding (same output; faster when drafts are accepted)")
    arg = group.add_argument
    arg("--speculate", choices=["ngram"], help="draft by prompt lookup: tokens copied from the prompt and "
        "output so far (text that repeats its prompt: summaries, edits, code)")
    arg("--draft-model", metavar="NAME", help="draft with this smaller model (same tokenizer), loaded on "
        "the same backend")
    arg("--num-speculative-tokens", metavar="K", type=non_negative,
        help="tokens drafted in a sequence's first round (4); it adapts after")


def speculation(args: argparse.Namespace, pipe) -> dict:
    """The engine's speculative-decoding keywords that `add_speculation_args`' flags ask for, the draft
    model loaded; a setting that cannot work is a `CliError` naming its flag."""
    from inferno.speculative import SpeculationError, check_speculation

    if args.speculate is None and args.draft_model is None and args.num_speculative_tokens is None:
        return {}
    try:
        draft = None if args.draft_model is None else pipe.draft(args.draft_model).model
        check_speculation(pipe.model, args.speculate, draft, args.num_speculative_tokens)
    except SpeculationError as exc:
        raise speculation_error(exc, args) from None
    return {"speculative": args.speculate, "draft_model": draft,
            "num_speculative_tokens": args.num_speculative_tokens}


def speculation_error(exc: Exception, args: argparse.Namespace) -> CliError:
    """A `SpeculationError` as the one-line error of the flag it is about."""
    message = str(exc)
    if message.startswith("num_speculative_tokens "):
        flag, message = "--num-speculative-tokens", message.removeprefix("num_speculative_tokens ")
    else:
        flag = "--draft-model" if args.draft_model else "--speculate"
    return CliError(f"{flag}: {message}")


def add_ray_args(p: argparse.ArgumentParser) -> None:
    """The flags --ray adds to ``inferno batch`` and ``inferno score``."""
    arg = p.add_argument
    arg("--ray", metavar="ADDRESS", nargs="?", const="", type=_address,
        help="run on Ray Data (needs the ray extra): without ADDRESS, ray.init()'s default (RAY_ADDRESS, "
        "a Ray started on this machine, else a new local one); 'auto', HOST:PORT or ray://HOST:PORT for "
        "a cluster")
    arg("--workers", metavar="N", type=positive,
        help="with --ray: Ray actors, each loading the model once (default 1)")
    arg("--cpus-per-worker", metavar="N", type=_positive_float,
        help="with --ray: CPUs Ray reserves for each worker, which are its BLAS threads (default 1)")


def _address(text: str) -> str:
    """"" (none given), "auto", "local", HOST:PORT or ray://HOST:PORT. Anything else (IN written right
    after a bare --ray) is refused, so that --ray never takes the input file for an address."""
    if text in ("", "auto", "local") or text.startswith("ray://"):
        return text
    host, sep, port = text.rpartition(":")
    if sep and host and port.isdigit():
        return text
    raise argparse.ArgumentTypeError(f"expected auto, HOST:PORT or ray://HOST:PORT, got {text!r} (write "
                                     "--ray after IN, or --ray=ADDRESS)")


_address.__name__ = "--ray ADDRESS"


_positive_float = Number(float, lambda v: math.isfinite(v) and v > 0, "a number > 0")


def without_ray(args: argparse.Namespace, extra: Sequence[str] = ()) -> str | None:
    """The first flag given that only works with --ray (None when --ray is given or none is)."""
    if getattr(args, "ray", None) is not None:
        return None
    for name in (*RAY_ONLY, *extra):
        if getattr(args, name, None) not in (None, False):
            return "--" + name.replace("_", "-")
    return None


def run_ray_job(kind: str, args: argparse.Namespace, prog: str) -> int:
    """``inferno batch --ray`` (kind "generate") and ``inferno score --ray`` ("score") with their parsed
    flags; returns the exit code. A missing extra is a `CliError` naming what to install."""
    from inferno.integrations import ray_missing

    missing = ray_missing("data")
    if missing:
        raise CliError(f"--ray {missing}")
    from inferno.engine import DEFAULT_PREFILL_CHUNK, DEFAULT_SLOTS
    from inferno.integrations.ray_batch import GENERATE, JobConfig, run_job

    config = JobConfig(kind=kind, model_dir=args.model_dir, backend=args.backend, threads=args.threads,
                       workers=args.workers or 1, cpus_per_worker=args.cpus_per_worker or 1.0,
                       prefill_chunk=getattr(args, "prefill_chunk", None) or DEFAULT_PREFILL_CHUNK,
                       max_new_tokens=getattr(args, "max_new_tokens", 50),
                       stop_at_eos=not getattr(args, "ignore_eos", False),
                       stride=getattr(args, "stride", None), strict=args.strict,
                       slots=getattr(args, "slots", None) or DEFAULT_SLOTS)
    address = args.ray or None  # a bare --ray: ray.init()'s default
    report = run_job(config, args.input, args.output, address,
                     lambda m: print(f"{prog}: {m}", file=sys.stderr, flush=True))
    what, tokens = ("requests", "new tokens") if kind == GENERATE else ("texts", "tokens")
    print(report.summary(what, tokens, args.output, of_todo=False), file=sys.stderr)
    return exit_code(report)


def exit_code(report) -> int:
    """A job's exit code: 130 interrupted, 1 when some rows failed, else 0."""
    return EXIT_INTERRUPTED if report.interrupted else EXIT_FAILED if report.failed else 0
