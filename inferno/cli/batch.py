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

A line of OpenAI's Batch API format (``custom_id``, ``method``, ``url``, ``body``) runs its
/v1/completions body as the server would and is answered in that API's output shape; chat lines are
refused (inferno/jobs/openai_batch.py).

Every line is parsed and checked (JSON, types, option values, prompt ids and length against the model)
before anything is generated. A malformed line is reported on stderr as ``inferno batch: IN:LINE: what``
and skipped; with ``--strict`` any malformed line ends the command (exit code 2) before anything is
generated, and OUT is neither created nor touched; so does a file with no valid line.

Output: one JSON object per finished request, ``{"id": ..., **the fields of inferno --json,
"input_hash": the fingerprint of its input line}``, written
(one write call per line, then flushed) as soon as that request finishes: the lines come in order of
completion, not input order, so join on ``id``. ``seconds`` and ``tokens_per_second`` of a line count
from the moment the request got a KV slot (not the time it waited for one), sharing each step with the
others. Non-ASCII text is escaped, so the file is exact whatever the locale.

Resuming: OUT is only ever appended to, and locked while a job writes it (a second job on it ends
with exit code 2). When it exists, the ids of its complete lines are skipped and the rest are run (an
id whose result came from another input line, an input that changed, is exit code 2); a final line
without its newline (a crash mid-write) and any line that is not an output line are reported, left as
they are, and not counted (their requests run again). Ctrl-C cancels
the requests in flight and reports ``[interrupted: N of M requests written to OUT]`` (M: the requests
this run had to do): OUT holds only complete lines, and the same command again finishes the job.

Progress goes to stderr: a tqdm bar when tqdm is installed and stderr is a terminal, else a line
rewritten in place on a terminal, else nothing per request; always a final line
``[N requests, T new tokens in S s, X tok/s; K skipped (already in OUT), E malformed]``.

``inferno score IN.jsonl -o OUT.jsonl`` scores texts with these same rules: both run on `inferno.jobs`.

With ``--ray [ADDRESS]`` the same job runs on Ray Data, over ``--workers`` actors of ``--slots``
sequences each, and IN may also be Parquet or a folder (inferno/integrations/ray_batch.py).

Exit codes: 0 when every valid request was written (malformed lines were reported and skipped), 1 when
the engine failed some request (reported; rerun to retry them), 2 for usage errors, ``--strict``
failures, a file with no valid line, an OUT another job is writing and an input that changed since OUT
was written, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from inferno.cli._args import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CliError,
    Parser,
    add_model_args,
    add_ray_args,
    add_speculation_args,
    exit_code,
    load,
    non_negative,
    positive,
    run_ray_job,
    speculation,
    user_errors,
    without_ray,
)

PROG = "inferno batch"


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description="Generate for every request of a JSONL file (one JSON object per "
                "line: id, prompt, max_new_tokens, stop_at_eos and generation options; or OpenAI's Batch API "
                "format, custom_id, method, url, body, for /v1/completions) through the continuous-batching "
                "engine; results are appended to OUT as they finish.",
                epilog="Output lines come in order of completion: join on \"id\". An existing OUT is "
                "resumed: requests whose id it holds are skipped (an input that changed since is "
                "refused). Exit codes: 0 done, 1 some requests failed, 2 usage errors, --strict failures "
                "and a file with no valid line, 130 Ctrl-C.")
    p.add_argument("input", metavar="IN.jsonl", help="requests, one JSON object per line; - for stdin")
    p.add_argument("-o", "--output", metavar="OUT.jsonl", required=True,
                   help="results, appended one JSON line per request (never truncated)")
    add_model_args(p)
    arg = p.add_argument
    arg("--slots", metavar="N", type=positive,
        help="sequences generated at once (default: the number of requests, at most 16)")
    arg("--prefill-chunk", metavar="N", type=positive,
        help="prompt tokens run per engine step (default 64)")
    arg("-n", "--max-new-tokens", metavar="N", type=non_negative, default=50,
        help="tokens to generate for requests that do not say (50)")
    arg("--ignore-eos", action="store_true",
        help="keep generating past <|endoftext|> in requests that do not set stop_at_eos")
    arg("--strict", action="store_true",
        help="any malformed line is an error (exit 2) before anything is generated")
    add_speculation_args(p)
    add_ray_args(p)
    return p


def run(argv: Sequence[str]) -> int:
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
    except user_errors() as exc:
        message = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return EXIT_USAGE


def _run(args: argparse.Namespace) -> int:
    from inferno.jobs import Progress, plan_job
    from inferno.jobs.generate import check_request, parse_requests, run_generation
    from inferno.jobs.progress import tqdm_or_none

    if args.ray is not None:  # the same job on Ray Data: inferno/integrations/ray_batch.py
        asked = [f for f, v in (("--speculate", args.speculate), ("--draft-model", args.draft_model),
                                ("--num-speculative-tokens", args.num_speculative_tokens)) if v is not None]
        if asked:
            raise CliError(f"{asked[0]}: speculative decoding runs in one process, not yet with --ray")
        return run_ray_job("generate", args, PROG)
    flag = without_ray(args)
    if flag:
        raise CliError(f"{flag} needs --ray (one process runs one engine: use --slots)")
    engine_options: dict = {}

    def load_model():  # with the draft model, if any: a flag that cannot work fails before OUT is made
        pipe = load(args)
        engine_options.update(speculation(args, pipe))
        return pipe

    plan = plan_job(args.input, args.output,
                    parse=lambda data: parse_requests(data, args.max_new_tokens, not args.ignore_eos),
                    check=check_request, load=load_model, say=_say, strict=args.strict, prog=PROG,
                    items="requests", done="generated")
    progress = Progress(len(plan.todo), sys.stderr, tqdm_or_none())
    report = run_generation(plan, progress, _say, slots=args.slots, prefill_chunk=args.prefill_chunk,
                            engine_options=engine_options)
    print(report.summary("requests", "new tokens", args.output), file=sys.stderr)
    return exit_code(report)


def _say(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr)
