"""What every JSONL job does before it runs (inferno/jobs/plan.py), in this process: stdin as the input
and its name in reports, --strict's count of malformed lines (before and after the model is loaded),
the message for a terminal as stdin, a job whose every line is malformed, OUT locked while a job writes
it, and a resumed job whose input changed."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap

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
    monkeypatch.setattr(sys, "stdin", _Stdin(b'{"text": "a"}\n{"text": "b"}\n'))
    plan, said = _plan(tmp_path, "-", strict=False,
                       check=lambda pipe, row: row.text == "a" and check(pipe, row))
    assert [row.text for row in plan.todo] == ["b"] and plan.malformed == 1
    assert said == ["stdin:1: too long for the pipe"]


def test_a_terminal_as_stdin_says_how_to_give_the_input(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stdin", _Stdin(b"", tty=True))
    with pytest.raises(JobError) as info:
        _plan(tmp_path, "-", strict=False)
    assert str(info.value) == "give an IN.jsonl file, or pipe the texts in: inferno score - -o OUT < IN.jsonl"


@pytest.mark.parametrize("late", [False, True], ids=["malformed lines", "rows the model refuses"])
def test_a_file_whose_every_line_is_malformed_is_an_error(tmp_path, late):
    # It used to end as a job that did nothing, with exit code 0.
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"text": "a"}\n{"text": "b"}\n' if late else b"[]\nnot json\n")

    def check(pipe, row):
        raise LineError("too long")

    with pytest.raises(JobError) as info:
        _plan(tmp_path, str(source), strict=False, check=check if late else lambda pipe, row: None)
    assert str(info.value) == f"{source}: every line (2) is malformed, as reported above; nothing was scored"
    assert not (tmp_path / "out.jsonl").exists()


def test_out_is_locked_while_a_job_writes_it(tmp_path):
    """A second job on the same OUT stops before it reads OUT, naming the job that holds it; once that
    job ends, the same command runs. (Two jobs used to write one OUT at once: rows twice, ids twice.)"""
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"text": "a"}\n')
    out = tmp_path / "out.jsonl"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from inferno.jobs.output import lock_output
        fd = lock_output(Path({str(out)!r}))
        print("locked", flush=True)
        sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(JobError) as info:
            _plan(tmp_path, str(source), strict=False)
        message = str(info.value)
        assert message.startswith(f"-o {out}: OUT is being written by another job"), message
        if os.path.exists("/proc/locks"):
            assert f"(pid {holder.pid})" in message
    finally:
        holder.communicate("", timeout=30)
    plan, _ = _plan(tmp_path, str(source), strict=False)
    assert [row.text for row in plan.todo] == ["a"]
    os.close(plan.out_fd)


def _write_out(tmp_path, source, rows) -> None:
    """Run a scoring job's plan on `rows` and write a result line for each, as `run_scoring` does."""
    from inferno.jobs.output import Output

    source.write_bytes("".join(json.dumps(r) + "\n" for r in rows).encode())
    plan, _ = _plan(tmp_path, str(source), strict=False)
    output = Output(plan.out_path, plan.needs_newline, plan.out_fd)
    for row in plan.todo:
        output.write({"id": row.id, "perplexity": 1.0}, row.digest)
    output.close()


def test_a_resumed_job_refuses_an_input_that_changed(tmp_path):
    """A line inserted above rows numbered by their line: id 1 is now another text, so resuming would
    skip it and run the old first row again as id 3. Refused, naming the line and how to start over."""
    source = tmp_path / "in.jsonl"
    _write_out(tmp_path, source, [{"text": "first"}, {"text": "second"}])
    out = tmp_path / "out.jsonl"
    before = out.read_bytes()
    source.write_bytes(b'{"text": "new"}\n{"text": "first"}\n{"text": "second"}\n')
    with pytest.raises(JobError) as info:
        _plan(tmp_path, str(source), strict=False)
    assert str(info.value) == (
        f"{source}:1: the line of id 1 is not the one whose result {out} holds (and 1 more): the input "
        f"changed since {out} was written; to start over, remove {out} or give another -o file (or "
        "restore the input)")
    assert out.read_bytes() == before
    # Unchanged lines resume as before; lines appended at the end run.
    source.write_bytes(b'{"text": "first"}\n{"text": "second"}\n{"text": "third"}\n')
    plan, _ = _plan(tmp_path, str(source), strict=False)
    assert [(row.id, row.text) for row in plan.todo] == [(3, "third")] and plan.skipped == 2
    os.close(plan.out_fd)


def test_results_written_without_a_fingerprint_are_taken_as_they_are(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"id": "a", "text": "changed"}\n{"id": "b", "text": "b"}\n')
    (tmp_path / "out.jsonl").write_text('{"id": "a", "perplexity": 2.0}\n')  # an older version's line
    plan, _ = _plan(tmp_path, str(source), strict=False)
    assert [row.id for row in plan.todo] == ["b"]
    os.close(plan.out_fd)
