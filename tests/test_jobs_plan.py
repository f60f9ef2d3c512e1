"""What every JSONL job does before it runs (inferno/jobs/plan.py), in this process: stdin as the input
and its name in reports, --strict's count of malformed lines (before and after the model is loaded),
and the message for a terminal as stdin."""

from __future__ import annotations

import io
import sys

import pytest

from inferno.jobs.lines import JobError, LineError
from inferno.jobs.plan import plan_job
from inferno.jobs.score import parse_score_requests


class _Stdin(io.TextIOWrapper):
    def __init__(self, data: bytes, tty: bool = False) -> None:
        super().__init__(io.BytesIO(data))
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


def _plan(tmp_path, input_name: str, *, strict: bool, check=lambda pipe, row: None):
    said: list[str] = []
    plan = plan_job(input_name, str(tmp_path / "out.jsonl"),
                    parse=lambda data: parse_score_requests(data, None), check=check,
                    load=lambda: "the pipe", say=said.append, strict=strict,
                    prog="inferno score", items="texts", done="scored")
    return plan, said


def test_stdin_is_read_and_named_stdin_in_reports(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stdin", _Stdin(b'{"text": "a"}\nnot json\n{"id": "b", "text": "c"}\n'))
    plan, said = _plan(tmp_path, "-", strict=False)
    assert (plan.source, plan.pipe, plan.malformed) == ("stdin", "the pipe", 1)
    assert [row.id for row in plan.todo] == [1, "b"]
    assert len(said) == 1 and said[0].startswith("stdin:2: not valid JSON")


@pytest.mark.parametrize(("lines", "count"), [(1, "1 malformed line"), (2, "2 malformed lines")])
def test_strict_counts_the_malformed_lines(tmp_path, lines, count):
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"[]\n" * lines + b'{"text": "fine"}\n')
    with pytest.raises(JobError) as info:
        _plan(tmp_path, str(source), strict=True)
    assert str(info.value) == f"--strict: {count} in {source}; nothing was scored"


def test_strict_refuses_the_rows_the_model_cannot_take(tmp_path, monkeypatch):
    def check(pipe, row):
        raise LineError(f"too long for {pipe}")

    monkeypatch.setattr(sys, "stdin", _Stdin(b'{"text": "a"}\n'))
    with pytest.raises(JobError) as info:
        _plan(tmp_path, "-", strict=True, check=check)
    assert str(info.value) == "--strict: 1 malformed line in stdin; nothing was scored"
    monkeypatch.setattr(sys, "stdin", _Stdin(b'{"text": "a"}\n'))
    plan, said = _plan(tmp_path, "-", strict=False, check=check)
    assert plan.todo == [] and plan.malformed == 1 and said == ["stdin:1: too long for the pipe"]


def test_a_terminal_as_stdin_says_how_to_give_the_input(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stdin", _Stdin(b"", tty=True))
    with pytest.raises(JobError) as info:
        _plan(tmp_path, "-", strict=False)
    assert str(info.value) == "give an IN.jsonl file, or pipe the texts in: inferno score - -o OUT < IN.jsonl"
