"""Scoring jobs: every text of a JSONL file scored in turn, each result appended to OUT (``inferno score
IN -o OUT``; the Ray job reads its rows with the same `parse_score_line` and `check_score_request`).

A row is ``{"id": ..., "text": "..." or token ids, "stride": N}`` (id and stride optional); any other key
is an error for that line. Rows are checked against the model (at least 2 tokens, ids in the vocabulary,
a stride below the context) with the message ``inferno score FILE`` gives for that text.
"""

from __future__ import annotations

import difflib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inferno.errors import squash
from inferno.jobs.lines import LineError, describe, parse_rows, read_object
from inferno.jobs.output import Output
from inferno.jobs.plan import JobPlan
from inferno.jobs.progress import DeferInterrupts, JobReport, Progress

#: The keys a scoring row may have.
SCORE_KEYS = ("id", "text", "stride")


@dataclass
class ScoreRequest:
    id: str | int
    text: str | list[int]  # token ids once checked against the model
    stride: int | None
    line: int = 0  # 1-based line number in IN
    digest: str | None = None  # the fingerprint of its input line (`lines.line_digest`)


def parse_score_line(text: str, line: int, default_stride: int | None) -> ScoreRequest:
    """One scoring row: ``{"id": ..., "text": ..., "stride": N}`` (id and stride optional). Raises
    `LineError`, carrying the id when it was read before the problem was found."""
    obj = read_object(text)
    rid = obj.get("id", line)
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        raise LineError(f"id must be a string or an integer, got {describe(rid)}")
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
            raise LineError(f"text: a list of token ids must hold integers, got {describe(bad[0])}", rid)
    elif not isinstance(value, str):
        raise LineError(f"text must be a string or a list of token ids, got {describe(value)}", rid)
    stride = obj.get("stride", default_stride)
    if stride is not None and (isinstance(stride, bool) or not isinstance(stride, int) or stride < 1):
        raise LineError(f"stride must be an integer >= 1, got {describe(stride)}", rid)
    return ScoreRequest(rid, value, stride, line)


def parse_score_requests(data: bytes, default_stride: int | None) -> tuple[list[ScoreRequest],
                                                                           list[tuple[int, str]]]:
    """Every scoring row of a JSONL file, and (line, message) for every malformed line (duplicate ids
    included), by the rules of `inferno.jobs.generate.parse_requests`."""
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


def run_scoring(plan: JobPlan, progress: Progress, say: Callable[[str], None]) -> JobReport:
    """Score `plan.todo` in input order, writing each result to OUT as it is scored. A text the backend
    fails is reported and counted as failed (rerun to retry it); Ctrl-C stops at once, with OUT holding
    only complete lines."""
    output = Output(plan.out_path, plan.needs_newline, plan.out_fd)
    interrupts = DeferInterrupts()
    report = JobReport(todo=len(plan.todo), skipped=plan.skipped, malformed=plan.malformed)
    start = time.perf_counter()
    with interrupts:
        try:
            for req in plan.todo:
                try:
                    result = plan.pipe.score(req.text, req.stride)
                except Exception as exc:  # noqa: BLE001 - a backend's failure fails this text, as in batch
                    report.failed += 1
                    say(f"{plan.source}:{req.line}: id {json.dumps(req.id)} failed: "
                        f"{type(exc).__name__}: {squash(exc)}")
                    continue
                with interrupts.critical():  # written and counted, or neither
                    output.write({"id": req.id, **result.to_dict()}, req.digest)
                    report.written += 1
                    report.tokens += len(result.ids)
                progress.update(len(result.ids))
        except KeyboardInterrupt:
            interrupts.hold()  # a second Ctrl-C must not cut the clean-up short
            report.interrupted = True
        finally:
            progress.close()
            output.close()
    report.seconds = time.perf_counter() - start
    return report
