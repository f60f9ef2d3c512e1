"""What every job does before it runs: read and parse the input, find what OUT already holds, report the
malformed lines (refuse them all with --strict), load the model, check the rows against it, and keep the
rows still to do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferno.jobs.lines import JobError, checked
from inferno.jobs.output import check_output, read_done, read_input


@dataclass
class JobPlan:
    pipe: Any  # the loaded `Pipeline`
    todo: list  # the rows to run, in input order
    out_path: Path
    needs_newline: bool  # OUT ends without a newline (a crash mid-write): the next line starts a new one
    skipped: int  # rows whose id OUT already holds
    malformed: int  # rows reported and left out
    source: str  # the input's name in messages ("stdin" for -)


def report_malformed(errors: list[tuple[int, str]], source: str, strict: bool, say: Callable[[str], None],
                     done: str) -> None:
    """Say ``SOURCE:LINE: what`` for each malformed line; with `strict`, any is a `JobError`."""
    for line, message in sorted(errors):
        say(f"{source}:{line}: {message}")
    if strict and errors:
        raise JobError(f"--strict: {len(errors)} malformed line{'s' * (len(errors) != 1)} in {source}; "
                       f"nothing was {done}")


def plan_job(input_name: str, output_name: str, *, parse: Callable[[bytes], tuple[list, list]],
             check: Callable[[Any, Any], None], load: Callable[[], Any], say: Callable[[str], None],
             strict: bool, prog: str, items: str, done: str,
             check_data: Callable[[bytes], None] | None = None) -> JobPlan:
    """The plan of a job from IN to OUT. `parse(data)` gives (rows, (line, message) errors); `check(pipe,
    row)` raises `LineError` for a row the model cannot take; `say` reports a line (on stderr).
    Lines wrong in themselves are reported first (with `strict`, before the model is loaded), then the
    lines the model cannot take."""
    out_path = check_output(output_name, input_name)
    source = "stdin" if input_name == "-" else input_name
    data = read_input(input_name, prog, items)
    if check_data is not None:
        check_data(data)
    rows, errors = parse(data)
    existing = read_done(out_path)
    for note in existing.notes:
        say(f"{output_name}:{note}")
    report_malformed(errors, source, strict, say, done)
    pipe = load()
    valid, late = checked(pipe, rows, check)
    report_malformed(late, source, strict, say, done)
    todo = [row for row in valid if row.id not in existing.ids]
    return JobPlan(pipe, todo, out_path, existing.needs_newline, len(valid) - len(todo),
                   len(errors) + len(late), source)
