"""What the command-line tests share: an offline environment, the one-line error check, the check
of a JSONL job's reports of malformed lines, and a stand-in for stdin."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
from pathlib import Path


def sigint_as_in_a_terminal() -> None:
    """`preexec_fn` for a child that a test sends Ctrl-C to: SIGINT at its default, as in a terminal.
    Tests started in the background (``pytest &``) inherit SIGINT ignored from the shell, and so would
    the child, which then never sees the signal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def offline_env(tmp_path: Path) -> dict[str, str]:
    """No network, no real Hugging Face cache, no backend from the caller: the tests see only what they
    build."""
    env = dict(os.environ, INFERNO_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), PYTHONUNBUFFERED="1")
    for var in ("INFERNO_BACKEND", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "HUGGINGFACE_HUB_CACHE"):
        env.pop(var, None)
    return env


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    """Exit code 2, no traceback, one line on stderr holding every needle."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


def assert_line_reports(proc: subprocess.CompletedProcess, prog: str, source: str,
                        rows: list[tuple[object, tuple[str, ...] | None]]) -> None:
    """A JSONL job ran through its malformed lines: exit 0, no traceback, and before its final line one
    report ``PROG: SOURCE:LINE: ...`` for each row with needles (its 1-based line), holding them all."""
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    *reports, _ = proc.stderr.strip().splitlines()
    bad = {line: needles for line, (_, needles) in enumerate(rows, 1) if needles}
    assert len(reports) == len(bad), proc.stderr
    head = re.compile(re.escape(f"{prog}: {source}:") + r"(\d+): ")
    for report in reports:
        match = head.match(report)
        assert match, report
        for needle in bad[int(match.group(1))]:
            assert needle in report, f"{needle!r} not in {report!r}"
    assert {int(head.match(r).group(1)) for r in reports} == set(bad)


def run_inferno(args: list[str], env: dict[str, str], *, cwd: Path | None = None,
                input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """`inferno ARGS` with `env` and `cwd`, its result as `subprocess.run` gives it. In this process
    (`inferno.cli.main(argv)`, stdin at /dev/null) unless `input` is given or `env` has a PYTHONPATH of
    its own: a piped stdin, and plugins discovered at start-up, need a process of their own."""
    if input is not None or env.get("PYTHONPATH") != os.environ.get("PYTHONPATH"):
        return subprocess.run([sys.executable, "-m", "inferno", *args], capture_output=True, text=True,
                              env=env, cwd=cwd, input=input, timeout=timeout)
    from inferno.cli import main

    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    saved_streams = sys.stdin, sys.stdout, sys.stderr
    out, err = io.BytesIO(), io.BytesIO()
    wrappers = [io.TextIOWrapper(b, encoding="utf-8", write_through=True) for b in (out, err)]
    try:
        os.environ.clear()
        os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        with open(os.devnull) as devnull:
            sys.stdin = devnull
            sys.stdout, sys.stderr = wrappers
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse's --help and one-line usage errors
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        for wrapper in wrappers:
            wrapper.flush()
            wrapper.detach()  # keeps the bytes readable once the wrapper is gone
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    text = [b.getvalue().decode("utf-8", "replace").replace("\r\n", "\n") for b in (out, err)]
    return subprocess.CompletedProcess(["inferno", *args], code, *text)


class FakeStdin:
    """A stdin holding `data` (None: endless, like /dev/zero) that fails the test on a read without a
    bound: what reads stdin must never ask for all of it. `isatty()` answers `tty`."""

    def __init__(self, data: bytes | None, tty: bool = False) -> None:
        self.data, self.tty, self.at = data, tty, 0
        self.buffer = self

    def isatty(self) -> bool:
        return self.tty

    def read(self, n: int | None = -1) -> bytes:
        assert n is not None and n >= 0, "stdin read without a bound"
        if self.data is None:
            return b"x" * n
        out = self.data[self.at : self.at + n]
        self.at += len(out)
        return out
