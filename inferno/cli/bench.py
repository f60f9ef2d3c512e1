"""``inferno bench``: end-to-end generation speed of each backend on this machine, with ratios to numpy
(`inferno.bench` runs the measurement)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from inferno.bench import BenchError, BenchProgress, BenchRequest, choose_backends, format_table, run_bench
from inferno.cli._args import EXIT_USAGE, non_negative, positive
from inferno.errors import squash


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        raise BenchError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="inferno bench", description="Measure end-to-end generation speed of each backend "
                "on this machine, with ratios to the numpy reference.")
    p.add_argument("--backends", metavar="A,B,...",
                   help="backends to measure, with options (numpy,cpu-threaded:threads=2); default: every "
                   "usable one. numpy is always measured: it is the baseline")
    p.add_argument("-m", "--model", "--model-dir", dest="model_dir", metavar="NAME",
                   help="measure on this model's weights: a folder, a Hub name already in the cache, or "
                   "random (default: gpt2 if it is in the Hugging Face cache, else random weights of the "
                   "124M shape)")
    p.add_argument("--prompt-tokens", type=positive, default=64, help="prompt length (default 64)")
    p.add_argument("--new-tokens", type=positive, default=32, help="tokens to generate (default 32)")
    p.add_argument("--repeat", type=positive, default=3, help="timed runs per backend (default 3)")
    p.add_argument("--warmup", type=non_negative, default=1, help="short untimed runs first (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompt and weights")
    p.add_argument("--pause", type=float, default=0.2, metavar="SECONDS",
                   help="idle time before each timed run (default 0.2): BLAS and OpenMP worker threads "
                   "spin for ~0.1 s after a call and would slow down the next backend")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return p


def run(argv: Sequence[str]) -> int:
    """Entry point of ``inferno bench`` (`argv`: the arguments after ``bench``). Returns the exit code."""
    try:
        try:
            args = _parser().parse_args(list(argv))
        except SystemExit as exc:  # --help
            return int(exc.code or 0)
        specs, notes = choose_backends(args.backends)
        if not 0 <= args.pause <= 60:
            raise BenchError(f"argument --pause: expected seconds in [0, 60], got {args.pause}")
        request = BenchRequest(specs, args.prompt_tokens, args.new_tokens, args.repeat, args.warmup,
                               args.seed, args.model_dir, args.pause)
        report = run_bench(request, BenchProgress(sys.stderr, quiet=args.quiet))
    except BenchError as exc:
        print(f"inferno bench: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (OSError, ValueError) as exc:  # unreadable config or weights, and the like
        print(f"inferno bench: error: {squash(exc)}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        report["skipped"] = notes
        print(json.dumps(report, indent=2))
    else:
        print(format_table(report))
        for note in notes:
            print(note, file=sys.stderr)
    return 0 if all(row["status"] == "ok" for row in report["results"]) else 1
