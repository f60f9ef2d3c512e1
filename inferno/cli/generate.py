"""``inferno [PROMPT]``: generate text, streamed to stdout, with a summary line on stderr.

    inferno "The quick brown fox" -n 50
    inferno --preset sample -s 1 "Once upon a time"
    inferno "Q: What is 2+2?\nA:" --stop "\n" --json --logprobs 3
    echo "Once upon a time" | inferno          # the prompt from stdin
    inferno "Summary:" -f notes.txt            # the argument, a newline, then the file's text
    inferno "Sentiment:" --choice positive --choice negative   # structured output (--json-schema, ...)
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import shlex
import stat
import sys
import time
from collections.abc import Sequence

from inferno import __version__
from inferno.cli._args import (
    EXIT_INTERRUPTED,
    CliError,
    Number,
    Parser,
    add_constraint_args,
    add_model_args,
    add_speculation_args,
    bias,
    check_utf8,
    constraint,
    count,
    decode_text,
    load,
    non_negative,
    read_stdin,
    read_text,
    seed,
    speculation_error,
    temperature,
    top_p,
    unescape,
)
from inferno.jobs.fits import too_long


def _generate_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="inferno",
        description="Generate text on the CPU with GPT-2 (124M), or with the GPT-2 or Llama-family model "
        "(Llama, SmolLM2, Qwen2/2.5/3, Mistral) that -m names. The prompt is PROMPT, then (on a new line) "
        "the text of -f FILE or, without -f, of stdin when it is a pipe or a file; one trailing newline of "
        "that text is dropped.",
        epilog="Subcommands: 'inferno score FILE' gives a text's perplexity; 'inferno batch IN -o OUT' "
        "generates for a JSONL file of prompts; 'inferno chat' talks with a chat model in the "
        "terminal; 'inferno serve' runs an OpenAI-compatible server; "
        "'inferno inspect TEXT' shows what the model attends to and each layer's prediction; "
        "'inferno backends [--json]' lists compute backends; 'inferno bench' measures them; "
        "'inferno help SUBCOMMAND' is 'inferno SUBCOMMAND --help'. Everything after '--' is the prompt, not "
        "flags: put flags before it, and use it (or -p) for a prompt that is a subcommand's name or "
        "starts with '-': inferno -n 5 -- backends",
    )
    p.add_argument("prompt", nargs="?", default="",
                   help="prompt text, quoted as one argument (empty: unconditional generation)")
    p.add_argument("-p", "--prompt", dest="prompt_flag", metavar="TEXT",
                   help="the prompt, as a flag: for a prompt that looks like a subcommand or a flag "
                   "(inferno -p serve, inferno -p=-5); not with PROMPT")
    p.add_argument("-f", "--file", metavar="FILE",
                   help="read the prompt from FILE (UTF-8; - for stdin), after PROMPT if both are given")
    add_model_args(p)
    arg = p.add_argument
    arg("-n", "--max-new-tokens", metavar="N", type=non_negative, default=50, help="tokens to generate (50)")
    arg("-t", "--temperature", metavar="T", type=temperature,
        help="0 = greedy (default); higher = more random")
    arg("--top-k", metavar="K", type=non_negative, help="sample from the k most likely tokens (0 = off)")
    arg("--top-p", metavar="P", type=top_p, help="nucleus sampling mass in (0, 1] (1 = off)")
    arg("-s", "--seed", metavar="S", type=seed, help="random seed: the same seed gives the same text")
    p.add_argument("--preset", choices=["greedy", "sample"],
                   help="sample = temperature 0.8 + top-k 40; explicit flags override it")
    arg("--stop", metavar="S", action="append", type=unescape,
        help="stop before this text (repeatable, up to 16; \\n, \\t, \\\\ are read as escapes)")
    arg("--repetition-penalty", metavar="R", type=Number(float, math.isfinite, "a number"),
        help="divide a seen token's logit by R (multiply if negative); 1 = off, > 1 repeats less")
    arg("--presence-penalty", metavar="P", type=Number(float, math.isfinite, "a number"),
        help="subtract P from the logit of every token generated so far; in [-2, 2], 0 = off")
    arg("--frequency-penalty", metavar="F", type=Number(float, math.isfinite, "a number"),
        help="subtract F times its count from a generated token's logit; in [-2, 2], 0 = off")
    arg("--logit-bias", metavar="ID=BIAS", action="append", type=bias,
        help="add BIAS in [-100, 100] to token ID's logit (repeatable; -100 bans it)")
    arg("--logprobs", metavar="N", type=non_negative,
        help="with --json: each new token's log-probability and the N (0-20) most likely alternatives")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past <|endoftext|>")
    p.add_argument("--show-ids", action="store_true",
                   help="print the prompt and generated token ids on stderr (not with --json, whose "
                   "prompt_ids and ids hold them)")
    p.add_argument("-j", "--json", action="store_true",
                   help="print one JSON object instead of streaming text")
    p.add_argument("--version", action="version", version=f"inferno {__version__}")
    add_speculation_args(p)
    add_constraint_args(p)
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
    structured = constraint(args)
    if structured is not None:
        chosen["constraint"] = structured
    try:
        return GenerationOptions(**chosen, seed=args.seed, stop=tuple(args.stop or ()),
                                 logit_bias=dict(args.logit_bias or ()))
    except OptionError as exc:
        flag = "--" + exc.field.split("[")[0].replace("_", "-")
        # "(or None)" is the API's way to turn an option off; on the command line, leaving the flag out is.
        raise CliError(f"{flag}: {exc.reason.replace(' (or None)', '')}") from None


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
        known = [o for action in parser._actions for o in action.option_strings]
        close = difflib.get_close_matches(flags[0].split("=")[0], known, n=1, cutoff=0.75)
        if close:
            parser.error(f"unrecognized arguments: {' '.join(flags)} (did you mean {close[0]}?)")
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
    return decode_text(read_stdin(what="a prompt"), "stdin")


def _prompt(args: argparse.Namespace) -> str:
    """PROMPT, then on a new line the text of -f FILE or of piped stdin, less one trailing newline."""
    if args.file == "-":
        text = _read_stdin_prompt()
    elif args.file is not None:
        if os.path.isdir(args.file):
            raise CliError(f"{args.file}: is a folder, not a text file")
        text = read_text(args.file, "-f")
    elif _stdin_has_text():
        text = _read_stdin_prompt()
    else:
        return args.prompt
    text = text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text
    return "\n".join(part for part in (args.prompt, text) if part)


def _summary(prompt_tokens: int, new_tokens: int, first_s: float | None, rest_s: float) -> str:
    """The stderr summary. The prompt's time is the time to the first new token (prefill and its
    sampling); the new tokens' time is the rest, and tok/s is the rate of the tokens after the first."""
    prompt = f"prompt {count(prompt_tokens, 'token')}"
    if first_s is None:  # no new token: nothing ran
        return f"[{prompt}, 0 new tokens]"
    prompt += f" in {first_s:.2f}s"
    if new_tokens < 2:
        return f"[{prompt}, {count(new_tokens, 'new token')}]"
    rate = (new_tokens - 1) / rest_s if rest_s > 0 else 0.0
    return f"[{prompt}, {new_tokens} new tokens in {rest_s:.2f}s, {rate:.1f} tok/s]"


def _edits(a: str, b: str) -> int:
    """Edit distance with adjacent transpositions (``scroe`` is one edit from ``score``)."""
    rows = [list(range(len(b) + 1))]
    for i, ca in enumerate(a, 1):
        row = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            row[j] = min(rows[-1][j] + 1, row[j - 1] + 1, rows[-1][j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                row[j] = min(row[j], rows[-2][j - 2] + 1)
        rows.append(row)
    return rows[-1][-1]


def _check_not_a_typo(args: argparse.Namespace, argv: Sequence[str], subcommands: Sequence[str]) -> None:
    """A prompt that is one word within an edit of a subcommand (two for words of six letters or more:
    `inferno servee`) is a mistyped command far more often than a prompt, and generating from it may
    start a model download: it is a `CliError` that names the subcommand and the two ways to mean the
    word as a prompt. (Two edits for short words would catch real prompts: "Hello" is two from "help".)"""
    word = args.prompt
    if not word or "--" in argv or len(word) < 4 or len(word.split()) != 1 or word != word.strip():
        return
    close = sorted((_edits(word.lower(), name), name) for name in subcommands)
    if close and close[0][0] <= (1 if len(word) <= 5 else 2):
        name = close[0][1]
        raise CliError(f"{word!r} is not a subcommand: did you mean `inferno {name}`? (to generate from that "
                       f"word, use `inferno -- {word}` or `inferno -p {word}`)")


def run(argv: Sequence[str], subcommands: Sequence[str] = ()) -> int:
    """``inferno [PROMPT]`` with `argv`; `subcommands`: the names a one-word prompt must not resemble."""
    args = _parse_generate(argv)
    _check_not_a_typo(args, argv, subcommands)
    if args.prompt_flag is not None:
        if args.prompt:
            raise CliError(f"give the prompt once: as PROMPT ({args.prompt!r}) or as -p, not both")
        args.prompt = args.prompt_flag
    args.prompt = check_utf8(args.prompt, "the prompt")
    if args.stop:
        args.stop = [check_utf8(stop, "--stop") for stop in args.stop]
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

    pipe = load(args)
    reason = too_long(pipe.tokenizer, prompt, pipe.config.n_positions)
    if reason:
        raise CliError(reason)
    from inferno.speculative import SpeculationError

    try:
        stream = pipe.tokens(prompt, args.max_new_tokens, stop_at_eos=not args.ignore_eos, options=options,
                             speculative=args.speculate, draft_model=args.draft_model,
                             num_speculative_tokens=args.num_speculative_tokens)
    except SpeculationError as exc:
        raise speculation_error(exc, args) from None
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


