"""``inferno score IN.jsonl -o OUT.jsonl``: score every text of a JSONL file, in one process.

    inferno score texts.jsonl -o scores.jsonl
    inferno score texts.jsonl -o scores.jsonl --stride 256 --strict
    make-texts | inferno score - -o scores.jsonl

Input: one JSON object per line (blank lines are skipped), the rows ``inferno score --ray`` reads:

    {"id": "essay-1", "text": "The quick brown fox jumps over the lazy dog."}
    {"text": [464, 2068, 7586, 21831], "stride": 64}

* ``id``: a string or an integer, unique in the file; without one, a text's id is its line number
  (1-based, counting blank lines).
* ``text`` (required): the text to score, or a list of token ids.
* ``stride``: the sliding window's step for this text (default: ``--stride``, else half the context).

Any other key is an error for that line. Every line is parsed and checked (JSON, types, then against
the model: at least 2 tokens, ids in the vocabulary, a stride below the context) before anything is
scored; a malformed line is reported on stderr as ``inferno score: IN:LINE: what`` and skipped, with the
message ``inferno score FILE`` gives for that text. With ``--strict`` any malformed line ends the command
(exit code 2) before anything is scored, and OUT is neither created nor touched.

Output: one line per text, ``{"id": ..., **what inferno score --json prints for it}`` (the same
numbers), in input order, each written with one call and flushed as soon as it is scored. Resuming,
Ctrl-C, the progress bar and the exit codes are those of ``inferno batch`` (`inferno.batch`, whose
pieces this module uses): OUT is only ever appended to, the ids it already holds are skipped, and the
final line is ``[N texts, T tokens in S s, X tok/s; K skipped (already in OUT), E malformed]``.

Parquet files and folders of inputs need ``--ray`` (inferno/integrations/ray_batch.py, which reads its
rows with `parse_score_line` and checks them with `check_score_request`, both from here).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferno.batch import (
    EXIT_FAILED,
    LineError,
    _check_output,
    _DeferInterrupts,
    _describe,
    _Output,
    _Progress,
    _read_input,
    _report,
    _tqdm,
    checked,
    parse_rows,
    read_done,
    read_object,
)
from inferno.cli import EXIT_INTERRUPTED, CliError, _load
from inferno.errors import squash

PROG = "inferno score"
#: The keys a scoring row may have.
SCORE_KEYS = ("id", "text", "stride")


@dataclass
class ScoreRequest:
    id: str | int
    text: str | list[int]  # token ids once checked against the model
    stride: int | None
    line: int = 0  # 1-based line number in IN


def parse_score_line(text: str, line: int, default_stride: int | None) -> ScoreRequest:
    """One scoring row: ``{"id": ..., "text": ..., "stride": N}`` (id and stride optional). Raises
    `LineError`, carrying the id when it was read before the problem was found."""
    obj = read_object(text)
    rid = obj.get("id", line)
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        raise LineError(f"id must be a string or an integer, got {_describe(rid)}")
    unknown = [key for key in obj if key not in SCORE_KEYS]
    if unknown:
        close = difflib.get_close_matches(unknown[0], SCORE_KEYS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise LineError(f"unknown key {unknown[0]!r} ({hint}known: {', '.join(SCORE_KEYS)})", rid)
    if "text" not in obj:
        raise LineError('no "text" (the text to score, or a list of token ids)', rid)
    value = obj["text"]
    if isinstance(value, list):
        bad = [i for i in value if isinstance(i, bool) or not isinstance(i, int)]
        if bad:
            raise LineError(f"text: a list of token ids must hold integers, got {_describe(bad[0])}", rid)
    elif not isinstance(value, str):
        raise LineError(f"text must be a string or a list of token ids, got {_describe(value)}", rid)
    stride = obj.get("stride", default_stride)
    if stride is not None and (isinstance(stride, bool) or not isinstance(stride, int) or stride < 1):
        raise LineError(f"stride must be an integer >= 1, got {_describe(stride)}", rid)
    return ScoreRequest(rid, value, stride, line)


def parse_score_requests(data: bytes, default_stride: int | None) -> tuple[list[ScoreRequest],
                                                                           list[tuple[int, str]]]:
    """Every scoring row of a JSONL file, and (line, message) for every malformed line (duplicate ids
    included), by the rules of `inferno.batch.parse_requests`."""
    return parse_rows(data, lambda text, line: parse_score_line(text, line, default_stride))


def check_score_request(pipe: Any, req: ScoreRequest) -> None:
    """The model's checks of a row, those of `Pipeline.score` (`inferno.scoring.check_request`), as a
    `LineError`; replaces its text by its token ids."""
    from inferno.scoring import ScoringError, check_request

    ids = pipe.tokenizer.encode(req.text) if isinstance(req.text, str) else list(req.text)
    try:
        check_request(ids, req.stride, pipe.sample_limit, pipe.config)
    except ScoringError as exc:
        raise LineError(str(exc)) from None
    req.text = ids


# -------------------------------------------------------------------------------- the command line


def _ray_only(name: str, data: bytes | None = None) -> None:
    """Parquet, folders and cloud storage are read by Ray Data only: say so (a `CliError`)."""
    hint = "; without it IN is one JSONL file of {\"id\", \"text\"} rows (or - for stdin)"
    if "://" in name:
        raise CliError(f"{name}: reading from storage URIs needs --ray{hint}")
    if name != "-" and Path(name).is_dir():
        raise CliError(f"{name}: a folder of inputs needs --ray{hint}")
    if name.lower().endswith(".parquet") or (data is not None and data.startswith(b"PAR1")):
        raise CliError(f"{name}: Parquet input needs --ray{hint}")


def run_score_jsonl(args: argparse.Namespace) -> int:
    """``inferno score IN -o OUT`` without --ray (`args`: the parsed flags of ``inferno score``: file,
    output, strict, stride and the model's). Returns the exit code; usage problems and --strict
    failures raise `CliError` (one line, exit 2)."""
    _ray_only(args.file)
    out_path = _check_output(args.output, args.file)
    source = "stdin" if args.file == "-" else args.file
    data = _read_input(args.file, PROG, "texts")
    _ray_only(args.file, data)
    requests, errors = parse_score_requests(data, args.stride)
    done = read_done(out_path)
    for note in done.notes:
        print(f"{PROG}: {args.output}:{note}", file=sys.stderr)

    # Lines wrong in themselves first (with --strict, before the model is loaded), then lines the model
    # cannot take.
    _report(errors, source, args.strict, PROG, "scored")
    pipe = _load(args)
    valid, late = checked(pipe, requests, check_score_request)
    _report(late, source, args.strict, PROG, "scored")

    todo = [req for req in valid if req.id not in done.ids]
    return _score(pipe, todo, out_path, args.output, done.needs_newline, len(valid) - len(todo),
                  len(errors) + len(late), source)


def _score(pipe: Any, todo: list[ScoreRequest], out_path: Path, out_name: str, needs_newline: bool,
           skipped: int, malformed: int, source: str) -> int:
    output = _Output(out_path, needs_newline)
    progress = _Progress(len(todo), sys.stderr, _tqdm(), desc=PROG, unit="text", items="texts",
                         tokens="tokens")
    interrupts = _DeferInterrupts()
    written = tokens = failed = 0
    start = time.perf_counter()
    with interrupts:
        try:
            for req in todo:
                try:
                    result = pipe.score(req.text, req.stride)
                except Exception as exc:  # noqa: BLE001 - a backend's failure fails this text, as in batch
                    failed += 1
                    reason = squash(exc)
                    print(f"{PROG}: {source}:{req.line}: id {json.dumps(req.id)} failed: "
                          f"{type(exc).__name__}: {reason}", file=sys.stderr)
                    continue
                with interrupts.critical():  # written and counted, or neither
                    output.write({"id": req.id, **result.to_dict()})
                    written += 1
                    tokens += len(result.ids)
                progress.update(len(result.ids))
        except KeyboardInterrupt:
            interrupts.hold()  # a second Ctrl-C must not cut the clean-up short
            progress.close()
            print(f"[interrupted: {written} of {len(todo)} texts written to {out_name}]", file=sys.stderr)
            return EXIT_INTERRUPTED
        finally:
            progress.close()
            output.close()
    seconds = time.perf_counter() - start
    rate = tokens / seconds if seconds > 0 else 0.0
    tail = f", {failed} failed (run again to retry them)" if failed else ""
    print(f"[{written} texts, {tokens} tokens in {seconds:.2f} s, {rate:.1f} tok/s; {skipped} skipped "
          f"(already in OUT), {malformed} malformed{tail}]", file=sys.stderr)
    return EXIT_FAILED if failed else 0
