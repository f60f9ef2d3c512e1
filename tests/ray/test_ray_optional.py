"""Ray is optional: importing inferno and running `inferno batch` or `inferno score` without --ray never
import it, and without Ray installed --ray is one line naming what to install (exit 2). Runs without
Ray (nothing here starts it)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cli_helpers import assert_one_line_error, offline_env

#: Runs the CLI in a fresh interpreter, optionally with Ray made unimportable (as if not installed),
#: and says on stdout which Ray modules got imported.
SCRIPT = """
import json, sys
if {hide}:
    for name in ("ray", "ray.data", "ray.serve"):
        sys.modules[name] = None  # `import ray` now fails as if Ray were not installed
from inferno.cli import main
code = main({argv})
sys.stdout.flush()
loaded = sorted(m for m in sys.modules if (m == "ray" or m.startswith("ray.")) and sys.modules[m] is not None)
print(json.dumps(loaded), file=sys.__stdout__)
sys.exit(code)
"""


def run_cli(argv: list[str], env: dict[str, str], hide_ray: bool = False) -> subprocess.CompletedProcess:
    code = SCRIPT.format(hide=hide_ray, argv=argv)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def loaded_ray_modules(proc: subprocess.CompletedProcess) -> list[str]:
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    return offline_env(tmp_path)


def test_importing_inferno_and_running_batch_and_score_never_import_ray(ray_model_dir, env, tmp_path):
    src = tmp_path / "requests.jsonl"
    src.write_text(json.dumps({"id": 1, "prompt": "Hi", "max_new_tokens": 2}) + "\n")
    proc = run_cli(["batch", str(src), "-o", str(tmp_path / "out.jsonl"), "-m", str(ray_model_dir)], env)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out.jsonl").read_text().count("\n") == 1
    assert loaded_ray_modules(proc) == []
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog")
    proc = run_cli(["score", str(text), "--json", "-m", str(ray_model_dir)], env)
    assert proc.returncode == 0, proc.stderr
    assert "perplexity" in proc.stdout and loaded_ray_modules(proc) == []
    code = "import sys, inferno, inferno.jobs.generate, inferno.cli, inferno.integrations; " \
        "print(sorted(m for m in " \
        "sys.modules if m.split('.')[0] == 'ray'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


@pytest.mark.parametrize("command", ["batch", "score"])
def test_without_ray_installed_ray_is_one_line_naming_the_extra(command, ray_model_dir, env, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": 1, "prompt": "Hi", "text": "Hi there"}) + "\n")
    argv = [command, str(src), "-o", str(tmp_path / "out.jsonl"), "-m", str(ray_model_dir), "--ray"]
    proc = run_cli(argv, env, hide_ray=True)
    assert_one_line_error(proc, "--ray", 'pip install "inferno-gpt2[ray]"')
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("argv, needles", [
    (["batch", "IN", "-o", "OUT", "--workers", "2"], ["--workers needs --ray"]),
    (["batch", "IN", "-o", "OUT", "--cpus-per-worker", "2"], ["--cpus-per-worker needs --ray"]),
    (["batch", "--ray", "IN", "-o", "OUT"], ["--ray", "expected auto, HOST:PORT or ray://HOST:PORT", "'IN'"]),
    (["batch", "IN", "-o", "OUT", "--ray", "--workers", "0"], ["--workers", "expected an integer >= 1"]),
    (["score", "IN", "-o", "OUT", "--workers", "2"], ["--workers needs --ray"]),
    (["score", "IN", "--strict"], ["--strict needs -o OUT.jsonl"]),  # -o without --ray: one process
    (["score", "IN", "--ray"], ["--ray needs -o OUT.jsonl"]),
])
def test_ray_flags_are_checked_before_anything_runs(argv, needles, env, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "inferno", *argv], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=60)
    assert_one_line_error(proc, *needles)
