"""INFERNO_HALF_ISA: a lesser path chosen from the environment, for a whole process (#44)."""

import os
import subprocess
import sys

import pytest

_kernels = pytest.importorskip("inferno_half._kernels")

PROBE = """
import numpy as np
from inferno_half import _kernels
from inferno_half.backend import HalfBackend
be = HalfBackend(dtype="int8")
print(_kernels.simd(), _kernels.int8_path(96))
print(HalfBackend.runs_on())
"""


def probe(value: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "INFERNO_HALF_ISA": value}
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("value, simd", [("portable", 0), ("avx2", 1), ("AVX2", 1)])
def test_a_cap_forces_a_lesser_path(value, simd):
    if simd > _kernels.simd():
        pytest.skip(f"this CPU lacks the path {value}")
    done = probe(value)
    assert done.returncode == 0, done.stderr
    first, runs_on = done.stdout.splitlines()
    assert int(first.split()[0]) == simd
    assert "AMX" not in first and "AMX" not in runs_on
    assert f"capped by INFERNO_HALF_ISA={value.lower()}" in runs_on


def test_avx512_keeps_vnni_and_turns_amx_off():
    if _kernels.simd() < 2:
        pytest.skip("this CPU lacks AVX-512")
    done = probe("avx512")
    assert done.returncode == 0, done.stderr
    first, runs_on = done.stdout.splitlines()
    assert first.split()[0] == "2"
    assert "AMX" not in first and "AMX" not in runs_on


def test_native_is_the_default_path():
    done = probe("native")
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[0]) == _kernels.simd() and "capped" not in done.stdout


def test_an_unknown_cap_is_refused_by_name():
    done = probe("sse9")
    assert done.returncode != 0
    assert "INFERNO_HALF_ISA='sse9' is not a path (choose portable, avx2, avx512, native)" in done.stderr
