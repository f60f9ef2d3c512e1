"""inferno.blas: what `inferno backends` says about NumPy's BLAS, and when it hints at OPENBLAS_CORETYPE."""

from __future__ import annotations

import subprocess
import sys

import pytest

from inferno import blas

AVX512 = frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512vl"})
AVX2 = frozenset({"avx2", "fma"})


def info(arch: str, api: str = "openblas") -> dict:
    return {"user_api": "blas", "internal_api": api, "version": "0.3.31", "architecture": arch,
            "num_threads": 2}


@pytest.mark.parametrize("arch", ["Haswell", "Zen", "haswell", "SandyBridge"])
def test_avx2_kernels_on_an_avx512_cpu_are_hinted(arch):
    unset = blas.coretype_hint(info(arch), AVX512, {})
    assert unset is not None and unset.startswith(f"OpenBLAS runs its {arch} (AVX2) kernels")
    assert "OPENBLAS_CORETYPE=SkylakeX" in unset
    chosen = blas.coretype_hint(info(arch), AVX512, {"OPENBLAS_CORETYPE": arch})
    assert chosen is not None and chosen.startswith(f"OPENBLAS_CORETYPE={arch} makes OpenBLAS run {arch}")
    assert "unset before starting" in chosen


@pytest.mark.parametrize(("record", "flags"), [
    (info("SkylakeX"), AVX512),          # already the AVX-512 kernels
    (info("Cooperlake"), AVX512),
    (info("Haswell"), AVX2),             # the CPU has no AVX-512: Haswell is right
    (info("Haswell"), frozenset({"avx512f"})),  # AVX-512 foundation only, without BW/VL
    (info("Haswell", api="mkl"), AVX512),       # not OpenBLAS
    (None, AVX512),                             # no BLAS found
    ({"internal_api": "openblas"}, AVX512),     # no architecture reported
])
def test_no_hint_otherwise(record, flags):
    assert blas.coretype_hint(record, flags, {}) is None


def test_cpu_flags_come_from_the_first_flags_line(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\nbugs\t: x\n\nprocessor\t: 1\n"
                       "flags\t\t: other\n")
    assert blas.cpu_flags(str(cpuinfo)) == frozenset({"fpu", "avx2", "avx512f"})
    assert blas.cpu_flags(str(tmp_path / "missing")) == frozenset()
    (tmp_path / "noflags").write_text("processor\t: 0\n")
    assert blas.cpu_flags(str(tmp_path / "noflags")) == frozenset()


def test_summary_names_numpys_blas_as_threadpoolctl_sees_it():
    line = blas.summary()
    assert line is not None  # NumPy's wheels ship OpenBLAS
    record = blas.blas_info()
    assert "numpy" in record["filepath"]  # NumPy's own, not SciPy's (loaded once jax or dask is imported)
    first = line.splitlines()[0]
    assert first.startswith("BLAS: ") and record["version"] in first
    assert f"{record['num_threads']} threads" in first
    if record.get("architecture"):
        assert f"({record['architecture']} kernels, " in first


def test_line_is_the_summary_without_its_hint(monkeypatch):
    assert blas.line() == blas.summary().splitlines()[0]
    monkeypatch.setattr(blas, "blas_info", lambda: None)
    assert blas.line() == "BLAS: unknown" and blas.summary() is None


def test_numpys_blas_is_told_apart_from_scipys():
    # The full suite imports jax and dask, which load SciPy's OpenBLAS beside NumPy's.
    code = ("import scipy.linalg, numpy as np; from inferno import blas; "
            "from threadpoolctl import threadpool_info;"
            "scipy.linalg.blas.sgemm(1.0, np.ones((2, 2), np.float32), np.ones((2, 2), np.float32));"
            "print(sum(i['user_api'] == 'blas' for i in threadpool_info()), blas.blas_info()['filepath'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if out.returncode and "No module named 'scipy'" in out.stderr:
        pytest.skip("scipy is not installed")
    assert out.returncode == 0, out.stderr
    count, path = out.stdout.split()
    assert int(count) >= 2 and "numpy" in path and "scipy.libs" not in path


def test_inferno_backends_prints_the_blas_line_after_the_table():
    out = subprocess.run([sys.executable, "-m", "inferno", "backends"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.rstrip("\n").splitlines()
    blas_at = next(i for i, line in enumerate(lines) if line.startswith("BLAS: "))
    assert lines[blas_at - 1] == "" and lines[0].startswith("name")
    assert all(not line.startswith("BLAS") for line in lines[:blas_at])
