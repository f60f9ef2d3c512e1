"""The conformance suite's --conformance-skips FILE (README: "List known failures in a file ... and pass
--conformance-xfails FILE (or --conformance-skips FILE)"): run as a third party runs it, in a fresh
pytest process outside the repository, on a deliberately broken plugin backend."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

PLUGINS = Path(__file__).parent / "plugins"
ARGS = ["--pyargs", "inferno.conformance", "--backend", "broken-layernorm", "-k", "layernorm or add", "-rfs"]


def run_suite(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    entry = any(ep.value == "inferno.conformance.plugin"
                for ep in importlib.metadata.entry_points(group="pytest11"))
    env = dict(os.environ, COLUMNS="200", OPENBLAS_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(PLUGINS / "broken_layernorm"), env.get("PYTHONPATH", "")])
    env.pop("INFERNO_BACKEND", None)
    env.pop("PYTEST_ADDOPTS", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *([] if entry else
                                                                        ["-p", "inferno.conformance.plugin"])]
    return subprocess.run([*cmd, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_listed_failures_are_skipped_and_the_run_passes(tmp_path):
    # The broken layer norm ignores eps: exactly these two checks fail without the list.
    (tmp_path / "skips.txt").write_text("# eps is ignored\nlayernorm-small-variance\n"
                                        "layernorm-eps-1e-3  # as well\n")
    proc = run_suite([*ARGS, "--conformance-skips", "skips.txt"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "skips from skips.txt: 2 entries" in proc.stdout
    assert " 2 skipped" in proc.stdout and "failed" not in proc.stdout and "xfailed" not in proc.stdout
    assert "SKIPPED [2] " in proc.stdout and ": listed in skips.txt" in proc.stdout  # -rs: why


@pytest.mark.slow
def test_a_kernel_name_skips_all_its_checks_and_unused_entries_are_named(tmp_path):
    from inferno.conformance import all_checks

    layernorm = [c for c in all_checks(["kernel"]) if c.kernel == "layernorm"]
    (tmp_path / "skips.txt").write_text("layernorm\nsoftmax-no-such-case\n")
    proc = run_suite([*ARGS, "--conformance-skips", "skips.txt"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "entries matching no test: softmax-no-such-case" in proc.stdout
    assert f" {len(layernorm)} skipped" in proc.stdout and "failed" not in proc.stdout


@pytest.mark.slow
def test_without_the_list_the_same_run_fails(tmp_path):
    proc = run_suite(ARGS, tmp_path)
    assert proc.returncode == 1
    assert "FAILED test_kernels.py::test_kernel[layernorm-small-variance]" in proc.stdout
    assert "FAILED test_kernels.py::test_kernel[layernorm-eps-1e-3]" in proc.stdout


@pytest.mark.slow
def test_an_unreadable_skips_file_is_a_usage_error(tmp_path):
    proc = run_suite([*ARGS, "--conformance-skips", "missing.txt"], tmp_path)
    assert proc.returncode == 4
    assert "inferno conformance: cannot read missing.txt" in proc.stderr
