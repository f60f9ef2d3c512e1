"""What every job does before it runs: read and parse the input, report the malformed lines (refuse them
all with --strict, or when no line is left), load the model, check the rows against it, lock OUT for
this job, find what it already holds (refusing an input that changed since), and keep the rows still to
do.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferno.jobs.lines import JobError, checked
from inferno.jobs.output import check_output, lock_output, read_done, read_input


@dataclass
class JobPlan:
    pipe: Any  # the loaded `Pipeline`
    todo: list  # the rows to run, in input order
    out_path: Path
    needs_newline: bool  # OUT ends without a newline (a crash mid-write): the next line starts a new one
    skipped: int  # rows whose id OUT already holds
    malformed: int  # rows reported and left out
    source: str  # the input's name in messages ("stdin" for -)
    out_fd: int | None = None  # OUT, open for appending and locked for this job (`lock_output`)


def report_malformed(errors: list[tuple[int, str]], source: str, strict: bool, say: Callable[[str], None],
                     done: str) -> None:
    """Say ``SOURCE:LINE: what`` for each malformed line; with `strict`, any is a `JobError`."""
    for line, message in sorted(errors):
        say(f"{source}:{line}: {message}")
    if strict and errors:
        raise JobError(f"--strict: {len(errors)} malformed line{'s' * (len(errors) != 1)} in {source}; "
                       f"nothing was {done}")


def _nothing_valid(errors: list[tuple[int, str]], source: str, done: str) -> JobError:
    n = len(errors)
    every = "the one line" if n == 1 else f"every line ({n})"
    return JobError(f"{source}: {every} is malformed, as reported above; nothing was {done}")


def check_unchanged(rows: list, hashes: dict, source: str, output_name: str) -> None:
    """A `JobError` when a row's id is in OUT with the fingerprint of another input line: IN changed
    since OUT was written (a line inserted above rows numbered by their line, an edited prompt), and
    resuming would skip a row that never ran and run another twice. Results written without a
    fingerprint are taken as they are."""
    changed = [row for row in rows
               if getattr(row, "digest", None) is not None and hashes.get(row.id, row.digest) != row.digest]
    if not changed:
        return
    first = changed[0]
    more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
    raise JobError(f"{source}:{first.line}: the line of id {json.dumps(first.id)} is not the one whose "
                   f"result {output_name} holds{more}: the input changed since {output_name} was written; to "
                   f"start over, remove {output_name} or give another -o file (or restore the input)")


def plan_job(input_name: str, output_name: str, *, parse: Callable[[bytes], tuple[list, list]],
             check: Callable[[Any, Any], None], load: Callable[[], Any], say: Callable[[str], None],
             strict: bool, prog: str, items: str, done: str,
             check_data: Callable[[bytes], None] | None = None) -> JobPlan:
    """The plan of a job from IN to OUT. `parse(data)` gives (rows, (line, message) errors); `check(pipe,
    row)` raises `LineError` for a row the model cannot take; `say` reports a line (on stderr).
    Lines wrong in themselves are reported first (with `strict`, before the model is loaded), then the
    lines the model cannot take. A file whose every line is malformed is a `JobError`. OUT is then
    locked for this job (created when absent), and read for the ids it holds, checking that the input
    lines that produced them are still the same."""
    out_path = check_output(output_name, input_name)
    source = "stdin" if input_name == "-" else input_name
    data = read_input(input_name, prog, items)
    if check_data is not None:
        check_data(data)
    rows, errors = parse(data)
    del data  # the rows hold what is needed
    report_malformed(errors, source, strict, say, done)
    if errors and not rows:
        raise _nothing_valid(errors, source, done)
    pipe = load()
    valid, late = checked(pipe, rows, check)
    report_malformed(late, source, strict, say, done)
    if late and not valid:
        raise _nothing_valid(errors + late, source, done)
    fd = lock_output(out_path)  # before reading it: another job's lines may still be coming
    try:
        existing = read_done(out_path)
        for note in existing.notes:
            say(f"{output_name}:{note}")
        check_unchanged(valid, existing.hashes, source, output_name)
    except BaseException:
        os.close(fd)
        raise
    todo = [row for row in valid if row.id not in existing.ids]
    return JobPlan(pipe, todo, out_path, existing.needs_newline, len(valid) - len(todo),
                   len(errors) + len(late), source, fd)
