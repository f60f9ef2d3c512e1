"""The `inferno` command: generate text, or run a subcommand (`inferno score`, `inferno backends`,
`inferno bench`).

    inferno "The quick brown fox" --max-new-tokens 50
    inferno --preset sample --seed 1 "Once upon a time"
    inferno "Q: What is 2+2?\nA:" --stop "\n" --json --logprobs 3
    inferno score essay.txt --json
    inferno backends --json
    inferno -- backends            # generate from the prompt "backends"

Bad flags and bad files end with one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import re
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
    arg("--model-dir", metavar="DIR", help="folder with config.json, model.safetensors, tokenizer.json "
        "(default: ./gpt2, then the Hugging Face cache, then a download)")
    arg("--backend", metavar="NAME", help="compute backend, optionally with options: NAME[:key=value,...] "
        "(default: $INFERNO_BACKEND or numpy; see 'inferno backends')")
    arg("--threads", metavar="N", type=_positive,
        help="worker threads (cpu-threaded, torch; default: usable cores); other backends reject it")


def _generate_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="inferno",
        description="Generate text with GPT-2 (124M) on the CPU.",
        epilog="Subcommands: 'inferno score FILE' gives a text's perplexity; 'inferno batch IN -o OUT' "
        "generates for a JSONL file of prompts; 'inferno backends [--json]' "
        "lists compute backends; 'inferno bench' measures them. To use a subcommand's name as the prompt, "
        "put it after '--': inferno -- backends",
    )
    p.add_argument("prompt", nargs="?", default="", help="prompt text (empty: unconditional generation)")
    _add_model_args(p)
    arg = p.add_argument
    arg("--max-new-tokens", metavar="N", type=_non_negative, default=50, help="tokens to generate (50)")
    arg("--temperature", metavar="T", type=_temperature, help="0 = greedy (default); higher = more random")
    arg("--top-k", metavar="K", type=_non_negative, help="sample from the k most likely tokens (0 = off)")
    arg("--top-p", metavar="P", type=_top_p, help="nucleus sampling mass in (0, 1] (1 = off)")
    arg("--seed", metavar="S", type=_seed, help="random seed: the same seed gives the same text")
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
    p.add_argument("--show-ids", action="store_true", help="print the prompt and generated token ids")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
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


def _run_generate(argv: Sequence[str]) -> int:
    args = _generate_parser().parse_args(argv)
    options = _options(args)
    if options.temperature == 0 and (args.top_k or (args.top_p is not None and args.top_p < 1)):
        print("inferno: note: --top-k/--top-p only apply when sampling; add --temperature (greedy now)",
              file=sys.stderr)
    # Never die on a terminal or pipe that cannot encode what GPT-2 writes (cp1252, ascii).
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="replace")

    pipe = _load(args)
    stream = pipe.tokens(args.prompt, args.max_new_tokens, stop_at_eos=not args.ignore_eos, options=options)
    start = time.perf_counter()
    try:
        for step in stream.steps():
            if not args.json:
                sys.stdout.write(step.text)
                sys.stdout.flush()
    except KeyboardInterrupt:
        if not args.json:
            sys.stdout.write(stream.state.finish("interrupted"))
            sys.stdout.flush()
        print(f"\n[interrupted after {len(stream.state.ids)} new tokens]", file=sys.stderr)
        return EXIT_INTERRUPTED
    result = stream.result(time.perf_counter() - start)
    if args.json:
        # ASCII escapes: valid and exact whatever stdout's encoding.
        print(json.dumps(result.to_dict(lambda i: pipe.tokenizer.decode([i]))))
        return 0
    sys.stdout.write("\n")
    sys.stdout.flush()
    if args.show_ids:
        print(f"prompt ids: {stream.prompt_ids}", file=sys.stderr)
        print(f"new ids:    {result.ids}", file=sys.stderr)
    print(f"[{result.new_tokens} new tokens in {result.seconds:.2f}s, {result.tokens_per_second:.1f} tok/s]",
          file=sys.stderr)
    return 0


def _run_score(argv: Sequence[str]) -> int:
    p = _Parser(prog="inferno score", description="Score a text: the log-probability of every token and "
                "the perplexity (a sliding window for texts longer than the context).")
    p.add_argument("file", nargs="?", default="-", metavar="FILE", help="UTF-8 text file, or - for stdin "
                   "(the default)")
    _add_model_args(p)
    p.add_argument("--stride", metavar="N", type=_positive,
                   help="sliding-window step for long texts (default: half the context)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: ids, logprobs, total_logprob, perplexity, stride")
    args = p.parse_args(argv)
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
    return 0


def _run_batch(argv: Sequence[str]) -> int:
    from inferno.batch import run_batch_cli

    return run_batch_cli(argv)


def _run_bench(argv: Sequence[str]) -> int:
    from inferno.bench import run_bench_cli  # imported only when asked for: it is not small

    return run_bench_cli(argv)


SUBCOMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "backends": _run_backends, "batch": _run_batch, "bench": _run_bench, "score": _run_score,
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
