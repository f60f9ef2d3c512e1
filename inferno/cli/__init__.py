"""The `inferno` command: generate text, or run a subcommand (`inferno score`, `inferno batch`,
`inferno serve`, `inferno chat`, `inferno inspect`, `inferno backends`, `inferno bench`).

    inferno "The quick brown fox" -n 50
    inferno --preset sample -s 1 "Once upon a time"
    inferno "Q: What is 2+2?\nA:" --stop "\n" --json --logprobs 3
    echo "Once upon a time" | inferno          # the prompt from stdin
    inferno "Summary:" -f notes.txt            # the argument, a newline, then the file's text
    inferno score essay.txt --json
    inferno score texts.jsonl -o scores.jsonl  # every {"id", "text"} row; resumable (inferno/jobs)
    inferno inspect "The quick brown fox" --layer 5   # attention and the logit lens
    inferno backends --json
    inferno help batch             # inferno batch --help
    inferno -- backends            # generate from the prompt "backends" (or: inferno -p backends)

One module a subcommand (`generate` is the default one); `_args` holds what they share. Nothing in the
package imports this one: it is the leaf that turns flags into library calls. Bad flags and bad files
end with one line on stderr and exit code 2, never a traceback (missing model
files take two: what is missing, and what to run).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence

from inferno.cli import backends, batch, generate, inspect, score
from inferno.cli._args import EXIT_INTERRUPTED, EXIT_USAGE, CliError, user_errors  # noqa: F401 - CliError


def _run_bench(argv: Sequence[str]) -> int:
    from inferno.cli.bench import run  # imported only when asked for: it is not small

    return run(argv)


#: What `inferno serve` needs beyond the core (the serve extra and what it pulls in).
_SERVE_EXTRA = ("fastapi", "uvicorn", "sse_starlette", "prometheus_client", "starlette", "pydantic")


def _run_chat(argv: Sequence[str]) -> int:
    from inferno.cli.chat import run

    return run(argv)


def _run_serve(argv: Sequence[str]) -> int:
    try:
        from inferno.cli.serve import run as run_serve
    except ImportError as exc:
        import importlib.util

        extra_missing = (exc.name or "").split(".")[0] in _SERVE_EXTRA
        if not (extra_missing or importlib.util.find_spec("fastapi") is None):
            raise
        print('inferno serve needs the serve extra: pip install "inferno-gpt2[serve]"', file=sys.stderr)
        return EXIT_USAGE
    return run_serve(argv)


SUBCOMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "backends": backends.run, "batch": batch.run, "bench": _run_bench, "chat": _run_chat,
    "inspect": inspect.run, "score": score.run, "serve": _run_serve,
}


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


def _help(argv: list[str]) -> int:
    """``inferno help [SUBCOMMAND]``: the --help of the generate command, or of SUBCOMMAND."""
    if not argv:
        return generate.run(["--help"])
    if argv[0] in SUBCOMMANDS and len(argv) == 1:
        return SUBCOMMANDS[argv[0]](["--help"])
    raise CliError(f"help: no subcommand {' '.join(argv)!r}; the subcommands are {', '.join(SUBCOMMANDS)} "
                   "(inferno help SUBCOMMAND, or inferno --help)")


def _main(argv: list[str]) -> int:
    try:
        if argv and argv[0] in SUBCOMMANDS:
            return SUBCOMMANDS[argv[0]](argv[1:])
        if argv and argv[0] == "help":
            return _help(argv[1:])
        return generate.run(argv, subcommands=(*SUBCOMMANDS, "help"))
    except KeyboardInterrupt:
        print("\n[interrupted]", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _flush_stdout()  # drop the rest quietly
        return 0
    except user_errors() as exc:
        # Our loaders raise these with messages that name the file, tensor, key or flag; anything else
        # is a bug and keeps its traceback. Missing model files take two lines: what is missing, and
        # what to run.
        from inferno.models.resolve import ModelFilesMissing

        lines = exc.lines if isinstance(exc, ModelFilesMissing) else (str(exc),)
        first, *rest = ("; ".join(p.strip() for p in line.splitlines() if p.strip()) for line in lines)
        print(f"inferno: error: {first}", *rest, sep="\n", file=sys.stderr)
        return EXIT_USAGE


