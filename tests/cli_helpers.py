"""What the command-line tests share: an offline environment and the one-line error check."""

from __future__ import annotations

import os
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
