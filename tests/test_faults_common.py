"""Shared helpers of the fault-injection tests (tests/test_faults_*.py; issue #17): the real CLI in a
subprocess under a time bound, the one-line-error check, a small model folder, and fake plugin
distributions written into a temporary folder. No tests here."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from cli_helpers import run_inferno
from goldens import golden_model, write_model_dir

#: Every CLI case must end within this many seconds: a hang is a failure (subprocess.TimeoutExpired).
TIME_BOUND_S = 60


def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """No network, no real Hugging Face cache, no backend from the environment."""
    env = dict(os.environ, INFERNO_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), PYTHONUNBUFFERED="1")
    for name in ("INFERNO_BACKEND", "HF_HUB_CACHE", "INFERNO_THREADS"):
        env.pop(name, None)
    env.update(extra)
    return env


def run_cli(args: list[str], env: dict[str, str], cwd: Path | None = None, python_flags: tuple = (),
            timeout: float = TIME_BOUND_S) -> subprocess.CompletedProcess:
    if not python_flags and args[:1] != ["serve"]:  # in this process (see run_inferno)
        return run_inferno(args, env, cwd=cwd, timeout=timeout)
    command = [sys.executable, *python_flags, "-m", "inferno", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit code 2, no traceback, exactly one line on stderr holding every needle; returns the line."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


def model_folder(directory: Path) -> Path:
    """The small 'greedy' golden model (GPT-2's vocabulary, 2 layers) with the real tokenizer.json."""
    config, sd, _ = golden_model("greedy")
    return write_model_dir(directory, config, sd)


def copy_model(source: Path, dest: Path) -> Path:
    dest.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (dest / name).write_bytes((source / name).read_bytes())
    return dest


def fake_distribution(root: Path, dist: str, module: str, code: str, backends: dict[str, str],
                      version: str = "1.0") -> Path:
    """A fake installed distribution in `root` (put `root` on PYTHONPATH): the module's source and a
    *.dist-info whose entry points name it in the inferno.backends group, as pip would install it."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(textwrap.dedent(code))
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    eps = "".join(f"{name} = {value}\n" for name, value in backends.items())
    (info / "entry_points.txt").write_text(f"[inferno.backends]\n{eps}")
    return root


def with_path(env: dict[str, str], *dirs: Path) -> dict[str, str]:
    return dict(env, PYTHONPATH=os.pathsep.join([*(str(d) for d in dirs), env.get("PYTHONPATH", "")]))


def tree_digest(directory: Path) -> dict[str, str]:
    """Every entry under `directory` (not following links): a file's SHA-256, a link's target."""
    out = {}
    for path in sorted(directory.rglob("*")):
        rel = str(path.relative_to(directory))
        if path.is_symlink():
            out[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out
