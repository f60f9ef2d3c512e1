"""What the command-line tests share: an offline environment, the one-line error check, and the check
of a JSONL job's reports of malformed lines."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path


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
