"""The `inferno` command: generate text, or run a subcommand (`inferno backends`, `inferno bench`).

    inferno "The quick brown fox" --max-new-tokens 50
    inferno --preset sample --seed 1 "Once upon a time"
    inferno backends --json
    inferno -- backends            # generate from the prompt "backends"

Bad flags and bad files end with one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
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


def _generate_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="inferno",
        description="Generate text with GPT-2 (124M) on the CPU.",
        epilog="Subcommands: 'inferno backends [--json]' lists compute backends; 'inferno bench' measures "
        "them. To use a subcommand's name as the prompt, put it after '--': inferno -- backends",
    )
    p.add_argument("prompt", nargs="?", default="", help="prompt text (empty: unconditional generation)")
    arg = p.add_argument
    arg("--model-dir", metavar="DIR", help="folder with config.json, model.safetensors, tokenizer.json "
        "(default: ./gpt2, then the Hugging Face cache, then a download)")
    arg("--backend", metavar="NAME", help="compute backend, optionally with options: NAME[:key=value,...] "
        "(default: $INFERNO_BACKEND or numpy; see 'inferno backends')")
    arg("--threads", metavar="N", type=_positive,
        help="worker threads (cpu-threaded, torch; default: usable cores); other backends reject it")
    arg("--max-new-tokens", metavar="N", type=_non_negative, default=50, help="tokens to generate (50)")
    arg("--temperature", metavar="T", type=_temperature, help="0 = greedy (default); higher = more random")
    arg("--top-k", metavar="K", type=_non_negative, help="sample from the k most likely tokens (0 = off)")
    arg("--top-p", metavar="P", type=_top_p, help="nucleus sampling mass in (0, 1] (1 = off)")
    arg("--seed", metavar="S", type=_seed, help="random seed: the same seed gives the same text")
    p.add_argument("--preset", choices=["greedy", "sample"],
                   help="sample = temperature 0.8 + top-k 40; explicit flags override it")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past <|endoftext|>")
    p.add_argument("--show-ids", action="store_true", help="print the prompt and generated token ids")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    p.add_argument("--version", action="version", version=f"inferno {__version__}")
    return p


def _sampling_kwargs(args: argparse.Namespace) -> dict:
    from inferno.sampling import PRESETS

    chosen = dict(PRESETS[args.preset or "greedy"])
    for name in ("temperature", "top_k", "top_p"):
        if getattr(args, name) is not None:
            chosen[name] = getattr(args, name)
    return {**chosen, "seed": args.seed, "max_new_tokens": args.max_new_tokens,
            "stop_at_eos": not args.ignore_eos}


def _run_generate(argv: Sequence[str]) -> int:
    args = _generate_parser().parse_args(argv)
    kwargs = _sampling_kwargs(args)
    if kwargs["temperature"] == 0 and (args.top_k or (args.top_p is not None and args.top_p < 1)):
        print("inferno: note: --top-k/--top-p only apply when sampling; add --temperature (greedy now)",
              file=sys.stderr)
    # Never die on a terminal or pipe that cannot encode what GPT-2 writes (cp1252, ascii).
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="replace")

    import inferno
    from inferno.backends.registry import BackendOptionError, get_backend

    backend = args.backend
    if args.threads is not None:
        try:
            backend = get_backend(args.backend, threads=args.threads)
        except BackendOptionError as exc:
            raise CliError(f"--threads: {exc}") from None
    pipe = inferno.load(args.model_dir, backend)
    stream = pipe.tokens(args.prompt, **kwargs)
    decoder = pipe.tokenizer.incremental_decoder()
    ids: list[int] = []
    start = time.perf_counter()
    try:
        for token in stream:
            ids.append(token)
            if args.json or token in stream.stop_ids:
                continue
            sys.stdout.write(decoder.feed(token))
            sys.stdout.flush()
    except KeyboardInterrupt:
        sys.stdout.write(decoder.flush())
        sys.stdout.flush()
        print(f"\n[interrupted after {len(ids)} new tokens]", file=sys.stderr)
        return EXIT_INTERRUPTED
    result = stream.result(ids, pipe.tokenizer.decode, time.perf_counter() - start)
    if args.json:
        print(json.dumps(result.to_dict()))  # ASCII escapes: valid and exact whatever stdout's encoding
        return 0
    sys.stdout.write(decoder.flush() + "\n")
    sys.stdout.flush()
    if args.show_ids:
        print(f"prompt ids: {stream.prompt_ids}", file=sys.stderr)
        print(f"new ids:    {ids}", file=sys.stderr)
    print(f"[{result.new_tokens} new tokens in {result.seconds:.2f}s, {result.tokens_per_second:.1f} tok/s]",
          file=sys.stderr)
    return 0


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
    return 0


def _run_bench(argv: Sequence[str]) -> int:
    from inferno.bench import run_bench_cli  # imported only when asked for: it is not small

    return run_bench_cli(argv)


SUBCOMMANDS: dict[str, Callable[[Sequence[str]], int]] = {"backends": _run_backends, "bench": _run_bench}


def _user_errors() -> tuple[type[BaseException], ...]:
    from inferno.backends.registry import BackendOptionError, BackendUnavailableError, UnknownBackendError
    from inferno.config import ConfigError
    from inferno.generate import GenerationError
    from inferno.hub import ModelFilesMissing
    from inferno.sampling import SamplingError
    from inferno.tokenizer import TokenizerError
    from inferno.weights import WeightsError

    return (CliError, ConfigError, WeightsError, TokenizerError, ModelFilesMissing, UnknownBackendError,
            BackendUnavailableError, BackendOptionError, GenerationError, SamplingError, OSError)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in SUBCOMMANDS:
            return SUBCOMMANDS[argv[0]](argv[1:])
        return _run_generate(argv)
    except KeyboardInterrupt:
        print("\n[interrupted]", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0
    except _user_errors() as exc:
        # Our loaders raise these with messages that name the file, tensor, key or flag; anything else
        # is a bug and keeps its traceback.
        message = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        print(f"inferno: error: {message}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
