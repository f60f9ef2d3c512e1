"""Helpers of the Ray tests: how the commands run, how their output is read, how a Ray worker process is
found (to kill it). A module of its own, not conftest.py (see tests/serve/serve_helpers.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

INFERNO = [sys.executable, "-m", "inferno"]
#: Seconds any one command of these tests may take (a Ray job here takes 5-20 s).
COMMAND_TIMEOUT = 180
#: The fields of an output line that are timings, so differ from run to run.
TIMINGS = ("seconds", "tokens_per_second")
STATS = re.compile(r"^\[(\d+) (?:requests|texts), (\d+) (?:new )?tokens in \d+\.\d\d s, \d+\.\d tok/s; "
                   r"(\d+) skipped \(already in OUT\), (\d+) malformed\]$", re.M)


def run(args: list[str], env: dict[str, str],
        timeout: float = COMMAND_TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run([*INFERNO, *args], capture_output=True, text=True, env=env, timeout=timeout)


def write_jsonl(path: Path, rows: list) -> Path:
    """Each row: a dict (dumped as JSON), or a str written as it is (a malformed line)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    path.write_text(text, encoding="utf-8")
    return path


def rows_by_id(path: Path, drop: tuple[str, ...] = TIMINGS) -> dict:
    """OUT's lines by id, without the timing fields; an id twice is an error."""
    out: dict = {}
    for raw in path.read_text(encoding="ascii").splitlines():
        row = json.loads(raw)
        key = json.dumps(row["id"])
        assert key not in out, f"id {key} is in {path} twice"
        out[key] = {k: v for k, v in row.items() if k not in drop}
    return out


def stats(stderr: str) -> tuple[int, int, int, int]:
    """(rows written, tokens, skipped, malformed) of the final line."""
    found = STATS.findall(stderr)
    assert found, stderr[-3000:]
    return tuple(int(g) for g in found[-1])


def reports(stderr: str, prog: str) -> list[str]:
    """The per-row reports ("PROG: FILE:LINE: what"), in order."""
    return [line for line in stderr.splitlines() if line.startswith(f"{prog}: ") and ": error: " not in line]


def processes(title: str) -> list[int]:
    """Pids of the live processes whose command line (Ray sets it to the actor's name) holds `title`,
    among the descendants of this process: the Ray cluster the tests started, not another on the
    machine."""
    parents, found = {}, []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        if title in cmdline and fields[0] != "Z":
            found.append(int(entry))
    me = os.getpid()

    def ours(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == me:
                return True
        return False

    return sorted(pid for pid in found if ours(pid))


def wait_for(what: str, check: Callable[[], object], timeout: float, interval: float = 0.1) -> object:
    """Poll `check` until it returns something true (returned), for at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
