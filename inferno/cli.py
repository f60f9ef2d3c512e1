"""The `inferno` command: generate text, or run a subcommand (`inferno score`, `inferno batch`,
`inferno serve`, `inferno backends`, `inferno bench`).

    inferno "The quick brown fox" -n 50
    inferno --preset sample -s 1 "Once upon a time"
    inferno "Q: What is 2+2?\nA:" --stop "\n" --json --logprobs 3
    echo "Once upon a time" | inferno          # the prompt from stdin
    inferno "Summary:" -f notes.txt            # the argument, a newline, then the file's text
    inferno score essay.txt --json
    inferno score texts.jsonl -o scores.jsonl  # every {"id", "text"} row; resumable (inferno/score_batch.py)
    inferno backends --json
    inferno -- backends            # generate from the prompt "backends"

Bad flags and bad files end with one line on stderr and exit code 2, never a traceback (missing model
files take two: what is missing, and what to run).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import stat
import sys
import time
from collections.abc import Callable, Sequence

from inferno import __version__

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A problem the user can fix; printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line instead of usage + message
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _number(kind: type, check: Callable[[float], bool], expected: str) -> Callable[[str], float]:
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not check(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    parse.__name__ = expected  # argparse shows this name in its messages
    return parse


_temperature = _number(float, lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0")
_top_p = _number(float, lambda v: 0 < v <= 1, "a number in (0, 1]")
_non_negative = _number(int, lambda v: v >= 0, "an integer >= 0")
_positive = _number(int, lambda v: v >= 1, "an integer >= 1")
_seed = _number(int, lambda v: v >= 0, "an integer >= 0")


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'"}


def _unescape(text: str) -> str:
    """Backslash escapes in a --stop string (\\n, \\t, \\r, \\\\, \\", \\'), as llama.cpp reads them."""
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(0)), text)


def _bias(text: str) -> tuple[int, float]:
    token, sep, value = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return int(token), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ID=BIAS (e.g. 50256=-100), got {text!r}") from None


_bias.__name__ = "ID=BIAS"


def _add_model_args(p: argparse.ArgumentParser) -> None:
    arg = p.add_argument
    arg("-m", "--model-dir", metavar="DIR", help="folder with config.json, model.safetensors, tokenizer.json "
        "(default: ./gpt2, then the Hugging Face cache, then a download)")
    arg("-b", "--backend", metavar="NAME", help="compute backend, optionally with options: "
        "NAME[:key=value,...] (default: $INFERNO_BACKEND or numpy; see 'inferno backends')")
    arg("--threads", metavar="N", type=_positive,
        help="worker threads (cpu-threaded, torch, half; default: usable cores); other backends reject it")


def _generate_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="inferno",
        description="Generate text with GPT-2 (124M) on the CPU. The prompt is PROMPT, then (on a new line) "
        "the text of -f FILE or, without -f, of stdin when it is a pipe or a file; one trailing newline of "
        "that text is dropped.",
        epilog="Subcommands: 'inferno score FILE' gives a text's perplexity; 'inferno batch IN -o OUT' "
        "generates for a JSONL file of prompts; 'inferno serve' runs an OpenAI-compatible server; "
        "'inferno backends [--json]' lists compute backends; 'inferno bench' measures them. Everything "
        "after '--' is the prompt, not flags: put flags before it, and use it for a prompt that is a "
        "subcommand's name or starts with '-': inferno -n 5 -- backends",
    )
    p.add_argument("prompt", nargs="?", default="",
                   help="prompt text, quoted as one argument (empty: unconditional generation)")
    p.add_argument("-f", "--file", metavar="FILE",
                   help="read the prompt from FILE (UTF-8; - for stdin), after PROMPT if both are given")
    _add_model_args(p)
    arg = p.add_argument
    arg("-n", "--max-new-tokens", metavar="N", type=_non_negative, default=50, help="tokens to generate (50)")
    arg("-t", "--temperature", metavar="T", type=_temperature,
        help="0 = greedy (default); higher = more random")
    arg("--top-k", metavar="K", type=_non_negative, help="sample from the k most likely tokens (0 = off)")
    arg("--top-p", metavar="P", type=_top_p, help="nucleus sampling mass in (0, 1] (1 = off)")
    arg("-s", "--seed", metavar="S", type=_seed, help="random seed: the same seed gives the same text")
    p.add_argument("--preset", choices=["greedy", "sample"],
                   help="sample = temperature 0.8 + top-k 40; explicit flags override it")
    arg("--stop", metavar="S", action="append", type=_unescape,
        help="stop before this text (repeatable, up to 16; \\n, \\t, \\\\ are read as escapes)")
    arg("--repetition-penalty", metavar="R", type=_number(float, math.isfinite, "a number"),
        help="divide a seen token's logit by R (multiply if negative); 1 = off, > 1 repeats less")
    arg("--presence-penalty", metavar="P", type=_number(float, math.isfinite, "a number"),
        help="subtract P from the logit of every token generated so far; in [-2, 2], 0 = off")
    arg("--frequency-penalty", metavar="F", type=_number(float, math.isfinite, "a number"),
        help="subtract F times its count from a generated token's logit; in [-2, 2], 0 = off")
    arg("--logit-bias", metavar="ID=BIAS", action="append", type=_bias,
        help="add BIAS in [-100, 100] to token ID's logit (repeatable; -100 bans it)")
    arg("--logprobs", metavar="N", type=_non_negative,
        help="with --json: each new token's log-probability and the N (0-20) most likely alternatives")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past <|endoftext|>")
    p.add_argument("--show-ids", action="store_true",
                   help="print the prompt and generated token ids on stderr (not with --json, whose "
                   "prompt_ids and ids hold them)")
    p.add_argument("-j", "--json", action="store_true",
                   help="print one JSON object instead of streaming text")
    p.add_argument("--version", action="version", version=f"inferno {__version__}")
    return p


def _options(args: argparse.Namespace):
    """The generation options the flags ask for; a bad value is a CliError naming the flag."""
    from inferno.options import GenerationOptions, OptionError
    from inferno.sampling import PRESETS

    chosen = dict(PRESETS[args.preset or "greedy"])
    for name in ("temperature", "top_k", "top_p", "repetition_penalty", "presence_penalty",
                 "frequency_penalty", "logprobs"):
        if getattr(args, name) is not None:
            chosen[name] = getattr(args, name)
    if args.logprobs is not None and not args.json:
        raise CliError("--logprobs is shown in the --json output; add --json")
    try:
        return GenerationOptions(**chosen, seed=args.seed, stop=tuple(args.stop or ()),
                                 logit_bias=dict(args.logit_bias or ()))
    except OptionError as exc:
        flag = "--" + exc.field.split("[")[0].replace("_", "-")
        raise CliError(f"{flag}: {exc.reason}") from None


def _load(args: argparse.Namespace):
    import inferno
    from inferno.backends.registry import BackendOptionError, get_backend

    backend = args.backend
    if args.threads is not None:
        try:
            backend = get_backend(args.backend, threads=args.threads)
        except BackendOptionError as exc:
            raise CliError(f"--threads: {exc}") from None
    return inferno.load(args.model_dir, backend)


def _parse_generate(argv: Sequence[str]) -> argparse.Namespace:
    """The generate flags; extra words get a hint to quote the prompt (or to move flags before '--')."""
    parser = _generate_parser()
    args, extra = parser.parse_known_args(argv)
    if not extra:
        return args
    argv = list(argv)
    after = argv[argv.index("--") + 1:] if "--" in argv else []
    flags = [e for e in extra if e.startswith("-") and len(e) > 1]
    if len(after) > 1:
        moved = [a for a in after if a.startswith("-") and len(a) > 1]
        words = [a for a in after if a not in moved]
        example = " ".join(["inferno", *moved, "--", shlex.quote(" ".join(words))]) if moved and words else \
            f"inferno -- {shlex.quote(' '.join(after))}"
        parser.error(f"everything after '--' is the prompt, here {len(after)} words: put flags before '--' "
                     f"and quote a prompt of several words ({example})")
    if flags:
        parser.error(f"unrecognized arguments: {' '.join(flags)} (a prompt that starts with '-' goes after "
                     "'--': inferno -- \"-1 is a number\")")
    words = [args.prompt, *extra] if args.prompt else extra
    parser.error(f"the prompt is one argument: quote it (inferno {shlex.quote(' '.join(words))})")
    raise AssertionError("unreachable")  # parser.error exits


#: Seconds of silence on a stdin pipe before saying that the prompt is being read from it.
STDIN_NOTE_AFTER_S = 1.0


def _stdin_has_text() -> bool:
    """Whether stdin is a pipe, a socket or a file (not a terminal, not /dev/null or another device)."""
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (AttributeError, OSError, ValueError):  # closed or replaced stdin
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISREG(mode)


def _read_stdin_prompt() -> str:
    if sys.stdin.isatty():
        print("inferno: reading the prompt from the terminal; end it with Ctrl-D", file=sys.stderr)
    elif not stat.S_ISREG(os.fstat(sys.stdin.fileno()).st_mode):
        try:
            import select

            ready = select.select([sys.stdin], [], [], STDIN_NOTE_AFTER_S)[0]
        except (ImportError, OSError, ValueError):  # select() cannot wait on pipes everywhere (Windows)
            ready = [True]
        if not ready:  # an open pipe nobody writes to (ssh, a CI runner): say why nothing happens
            print("inferno: reading the prompt from stdin (end it with Ctrl-D; '< /dev/null' skips it)",
                  file=sys.stderr, flush=True)
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = f"byte 0x{data[exc.start]:02x} at offset {exc.start}"
        raise CliError(f"stdin: not UTF-8 text ({bad})") from None


def _prompt(args: argparse.Namespace) -> str:
    """PROMPT, then on a new line the text of -f FILE or of piped stdin, less one trailing newline."""
    if args.file == "-":
        text = _read_stdin_prompt()
    elif args.file is not None:
        if os.path.isdir(args.file):
            raise CliError(f"{args.file}: is a folder, not a text file")
        text = _read_text(args.file)
    elif _stdin_has_text():
        text = _read_stdin_prompt()
    else:
        return args.prompt
    text = text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text
    return "\n".join(part for part in (args.prompt, text) if part)


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _summary(prompt_tokens: int, new_tokens: int, first_s: float | None, rest_s: float) -> str:
    """The stderr summary. The prompt's time is the time to the first new token (prefill and its
    sampling); the new tokens' time is the rest, and tok/s is the rate of the tokens after the first."""
    prompt = f"prompt {_count(prompt_tokens, 'token')}"
    if first_s is None:  # no new token: nothing ran
        return f"[{prompt}, 0 new tokens]"
    prompt += f" in {first_s:.2f}s"
    if new_tokens < 2:
        return f"[{prompt}, {_count(new_tokens, 'new token')}]"
    rate = (new_tokens - 1) / rest_s if rest_s > 0 else 0.0
    return f"[{prompt}, {new_tokens} new tokens in {rest_s:.2f}s, {rate:.1f} tok/s]"


def _run_generate(argv: Sequence[str]) -> int:
    args = _parse_generate(argv)
    options = _options(args)
    if args.show_ids and args.json:
        raise CliError("--show-ids adds the ids to the streamed text; the --json output already holds them "
                       "(prompt_ids, ids): drop one of the two")
    if options.temperature == 0 and (args.top_k or (args.top_p is not None and args.top_p < 1)):
        print("inferno: note: --top-k/--top-p only apply when sampling; add --temperature (greedy now)",
              file=sys.stderr)
    prompt = _prompt(args)
    # Never die on a terminal or pipe that cannot encode what GPT-2 writes (cp1252, ascii).
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="replace")

    pipe = _load(args)
    stream = pipe.tokens(prompt, args.max_new_tokens, stop_at_eos=not args.ignore_eos, options=options)
    start = time.perf_counter()
    first = None
    try:
        for step in stream.steps():
            if first is None:
                first = time.perf_counter()
            if not args.json:
                sys.stdout.write(step.text)
                sys.stdout.flush()
    except KeyboardInterrupt:
        if not args.json:
            sys.stdout.write(stream.state.finish("interrupted"))
            sys.stdout.flush()
        print(f"\n[interrupted after {len(stream.state.ids)} new tokens]", file=sys.stderr)
        return EXIT_INTERRUPTED
    end = time.perf_counter()
    result = stream.result(end - start)
    if args.json:
        # ASCII escapes: valid and exact whatever stdout's encoding.
        print(json.dumps(result.to_dict(lambda i: pipe.tokenizer.decode([i]))))
        return 0
    sys.stdout.write("\n")
    sys.stdout.flush()
    if args.show_ids:
        print(f"prompt ids: {stream.prompt_ids}", file=sys.stderr)
        print(f"new ids:    {result.ids}", file=sys.stderr)
    rest = end - first if first is not None else 0.0
    print(_summary(len(stream.prompt_ids), result.new_tokens, None if first is None else first - start, rest),
          file=sys.stderr)
    return 0


def _run_score(argv: Sequence[str]) -> int:
    p = _Parser(prog="inferno score", description="Score a text: the log-probability of every token and "
                "the perplexity (a sliding window for texts longer than the context). With -o, score every "
                "text of a JSONL file, one JSON line per text appended to OUT.")
    p.add_argument("file", nargs="?", default="-", metavar="FILE", help="UTF-8 text file, or - for stdin "
                   "(the default)")
    _add_model_args(p)
    p.add_argument("--stride", metavar="N", type=_positive,
                   help="sliding-window step for long texts (default: half the context)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: ids, logprobs, total_logprob, perplexity, stride")
    from inferno.integrations import add_ray_args, run_ray_job, without_ray

    p.add_argument("-o", "--output", metavar="OUT.jsonl", help="score many texts: FILE is then a JSONL file "
                   "of {\"id\", \"text\", \"stride\"} rows (id and stride optional; with --ray also a "
                   "Parquet file or a folder), and the --json object of each row, with its id, is appended "
                   "to OUT (never truncated; ids already in OUT are skipped, so a rerun resumes)")
    p.add_argument("--strict", action="store_true", help="with -o: any malformed row is an error (exit 2) "
                   "before anything is scored (without it, malformed rows are reported and skipped)")
    add_ray_args(p)
    args = p.parse_args(argv)
    if args.ray is not None:  # a scoring job on Ray Data: inferno/integrations/ray_batch.py
        if args.output is None:
            raise CliError("--ray needs -o OUT.jsonl (one JSON line per scored row)")
        args.input = args.file
        return run_ray_job("score", args, "inferno score")
    flag = without_ray(args)
    if flag:
        raise CliError(f"{flag} needs --ray (one process scores the texts one after another)")
    if args.output is not None:  # many texts, in this process: inferno/score_batch.py
        from inferno.score_batch import run_score_jsonl

        return run_score_jsonl(args)
    if args.strict:
        raise CliError("--strict needs -o OUT.jsonl (it is about the rows of a JSONL file of texts)")
    text = _read_text(args.file)
    pipe = _load(args)
    start = time.perf_counter()
    result = pipe.score(text, args.stride)
    seconds = time.perf_counter() - start
    if args.json:
        print(json.dumps(result.to_dict()))
        return 0
    print(f"{result.perplexity:.6g}")
    n = len(result.ids)
    print(f"[perplexity over {n} tokens ({n - 1} scored, stride {result.stride}), total logprob "
          f"{result.total_logprob:.4f}, {seconds:.2f}s, {n / seconds:.1f} tok/s]", file=sys.stderr)
    return 0


def _read_text(name: str) -> str:
    if name == "-":
        if sys.stdin.isatty():
            raise CliError("give a FILE to score, or pipe the text in: inferno score - < FILE")
        data, name = sys.stdin.buffer.read(), "stdin"
    else:
        with open(name, "rb") as f:
            data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = f"byte 0x{data[exc.start]:02x} at offset {exc.start}"
        raise CliError(f"{name}: not UTF-8 text ({bad})") from None


def _run_backends(argv: Sequence[str]) -> int:
    p = _Parser(prog="inferno backends", description="List the compute backends and whether they can run.")
    p.add_argument("--json", action="store_true", help="print a JSON list of objects")
    args = p.parse_args(argv)

    from dataclasses import asdict

    from inferno.backends.registry import default_backend_name, list_backends

    infos = list_backends()
    if args.json:
        print(json.dumps([asdict(i) for i in infos], indent=2))
        return 0
    default = default_backend_name()
    rows = [("name", "status", "origin", "description")]
    for i in infos:
        origin = i.origin if i.origin == "built-in" else f"{i.origin} {i.version}".strip()
        mark = " (default)" if i.name == default else ""
        rows.append((i.name + mark, i.status, origin, i.description))
    widths = [max(len(r[c]) for r in rows) for c in range(3)]
    for r in rows:
        print("  ".join(r[c].ljust(widths[c]) for c in range(3)) + "  " + r[3])
    from inferno.blas import summary  # what numpy and cpu-threaded run on

    blas = summary()
    if blas is not None:
        print(f"\n{blas}")
    return 0


def _run_batch(argv: Sequence[str]) -> int:
    from inferno.batch import run_batch_cli

    return run_batch_cli(argv)


def _run_bench(argv: Sequence[str]) -> int:
    from inferno.bench import run_bench_cli  # imported only when asked for: it is not small

    return run_bench_cli(argv)


#: What `inferno serve` needs beyond the core (the serve extra and what it pulls in).
_SERVE_EXTRA = ("fastapi", "uvicorn", "sse_starlette", "prometheus_client", "starlette", "pydantic")


def _run_serve(argv: Sequence[str]) -> int:
    try:
        from inferno.serve.cli import run_serve_cli
    except ImportError as exc:
        import importlib.util

        extra_missing = (exc.name or "").split(".")[0] in _SERVE_EXTRA
        if not (extra_missing or importlib.util.find_spec("fastapi") is None):
            raise
        print('inferno serve needs the serve extra: pip install "inferno[serve]"', file=sys.stderr)
        return EXIT_USAGE
    return run_serve_cli(argv)


SUBCOMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "backends": _run_backends, "batch": _run_batch, "bench": _run_bench, "score": _run_score,
    "serve": _run_serve,
}


def _user_errors() -> tuple[type[BaseException], ...]:
    from inferno.backends.registry import BackendOptionError, BackendUnavailableError, UnknownBackendError
    from inferno.config import ConfigError
    from inferno.generate import GenerationError
    from inferno.hub import ModelFilesMissing
    from inferno.sampling import SamplingError
    from inferno.scoring import ScoringError
    from inferno.tokenizer import TokenizerError
    from inferno.weights import WeightsError

    return (CliError, ConfigError, WeightsError, TokenizerError, ModelFilesMissing, UnknownBackendError,
            BackendUnavailableError, BackendOptionError, GenerationError, SamplingError, ScoringError,
            OSError)


# Commands whose result does not go to stdout: they run with stdout closed.
_NO_STDOUT_RESULT = ("batch", "serve")


def _closed_streams(argv: Sequence[str]) -> int | None:
    """`inferno ... >&-` or `2>&-`: Python sets a closed standard stream to None. Status lines then go
    nowhere (never to stdout instead); a result with nowhere to go is an error, not a silent exit 0."""
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - for the life of the process
    if sys.stdout is None:
        if argv and argv[0] in _NO_STDOUT_RESULT:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
            return None
        print("inferno: error: standard output is closed: nowhere to write the result", file=sys.stderr)
        return EXIT_USAGE
    return None


def _flush_stdout(report: bool = True) -> int:
    """Write out what is buffered; a failure (disk full, closed descriptor) is one line (unless an error
    was already reported) and exit 2, and what could not be written is dropped so that the
    interpreter's own flush at exit stays quiet."""
    try:
        sys.stdout.flush()
        return 0
    except BrokenPipeError:
        code = 0  # `inferno ... | head`: the reader has what it wanted
    except OSError as exc:
        if report:
            print(f"inferno: error: cannot write the output: {exc.strerror or exc}", file=sys.stderr)
        code = EXIT_USAGE
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return code


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    closed = _closed_streams(argv)
    if closed is not None:
        return closed
    code = _main(argv)
    return _flush_stdout(report=code == 0) or code


def _main(argv: list[str]) -> int:
    try:
        if argv and argv[0] in SUBCOMMANDS:
            return SUBCOMMANDS[argv[0]](argv[1:])
        return _run_generate(argv)
    except KeyboardInterrupt:
        print("\n[interrupted]", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _flush_stdout()  # drop the rest quietly
        return 0
    except _user_errors() as exc:
        # Our loaders raise these with messages that name the file, tensor, key or flag; anything else
        # is a bug and keeps its traceback. Missing model files take two lines: what is missing, and
        # what to run.
        from inferno.hub import ModelFilesMissing

        lines = exc.lines if isinstance(exc, ModelFilesMissing) else (str(exc),)
        first, *rest = ("; ".join(p.strip() for p in line.splitlines() if p.strip()) for line in lines)
        print(f"inferno: error: {first}", *rest, sep="\n", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
