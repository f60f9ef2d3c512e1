"""``inferno score``: the log-probability of every token of a text and its perplexity; with -o, every
text of a JSONL file (`inferno.jobs.score`), resumable.

    inferno score essay.txt --json
    inferno score texts.jsonl -o scores.jsonl
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from inferno.cli._args import (
    CliError,
    Parser,
    add_model_args,
    add_ray_args,
    exit_code,
    load,
    positive,
    read_text,
    run_ray_job,
    without_ray,
)

PROG = "inferno score"


def run(argv: Sequence[str]) -> int:
    p = Parser(prog="inferno score", description="Score a text: the log-probability of every token and "
                "the perplexity (a sliding window for texts longer than the context). With -o, score every "
                "text of a JSONL file, one JSON line per text appended to OUT.")
    p.add_argument("file", nargs="?", default="-", metavar="FILE", help="UTF-8 text file, or - for stdin "
                   "(the default)")
    add_model_args(p)
    p.add_argument("--stride", metavar="N", type=positive,
                   help="sliding-window step for long texts (default: half the context)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: ids, logprobs, total_logprob, perplexity, stride")
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
        return _score_jsonl(args)
    if args.strict:
        raise CliError("--strict needs -o OUT.jsonl (it is about the rows of a JSONL file of texts)")
    text = read_text(args.file)
    if not text and args.file == "-":
        raise CliError("no text given: name a FILE, or pipe the text in: inferno score - < FILE")
    pipe = load(args)
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




def _ray_only(name: str, data: bytes | None = None) -> None:
    """Parquet, folders and cloud storage are read by Ray Data only: say so (a `CliError`)."""
    hint = "; without it IN is one JSONL file of {\"id\", \"text\"} rows (or - for stdin)"
    if "://" in name:
        raise CliError(f"{name}: reading from storage URIs needs --ray{hint}")
    if name != "-" and Path(name).is_dir():
        raise CliError(f"{name}: a folder of inputs needs --ray{hint}")
    if name.lower().endswith(".parquet") or (data is not None and data.startswith(b"PAR1")):
        raise CliError(f"{name}: Parquet input needs --ray{hint}")


def _score_jsonl(args) -> int:
    """``inferno score IN -o OUT`` without --ray: every row of IN scored in this process."""
    from inferno.jobs import Progress, plan_job
    from inferno.jobs.progress import tqdm_or_none
    from inferno.jobs.score import check_score_request, parse_score_requests, run_scoring

    _ray_only(args.file)
    plan = plan_job(args.file, args.output, parse=lambda data: parse_score_requests(data, args.stride),
                    check=check_score_request, load=lambda: load(args), say=_say, strict=args.strict,
                    prog=PROG, items="texts", done="scored",
                    check_data=lambda data: _ray_only(args.file, data))
    progress = Progress(len(plan.todo), sys.stderr, tqdm_or_none(), desc=PROG, unit="text", items="texts",
                        tokens="tokens")
    report = run_scoring(plan, progress, _say)
    print(report.summary("texts", "tokens", args.output), file=sys.stderr)
    return exit_code(report)


def _say(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr)
