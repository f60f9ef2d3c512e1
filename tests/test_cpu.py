"""inferno.cpu: the usable cores (affinity, cgroup quota, $INFERNO_THREADS), the one locked BLAS-thread
limit that every backend goes through (two threads on two backends leave BLAS as they found it), and
what `inferno backends` says about NumPy's BLAS (with its OPENBLAS_CORETYPE hint)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading

import pytest
import threadpoolctl

from inferno import cpu
from inferno.backends.threaded import ThreadedBackend
from inferno.cpu import ENV_THREADS, cgroup_cpu_quota, resolve_threads, usable_cores

AVX512 = frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512vl"})
AVX2 = frozenset({"avx2", "fma"})


def info(arch: str, api: str = "openblas") -> dict:
    return {"user_api": "blas", "internal_api": api, "version": "0.3.31", "architecture": arch,
            "num_threads": 2}


@pytest.mark.parametrize("arch", ["Haswell", "Zen", "haswell", "SandyBridge"])
def test_avx2_kernels_on_an_avx512_cpu_are_hinted(arch):
    unset = cpu.coretype_hint(info(arch), AVX512, {})
    assert unset is not None and unset.startswith(f"OpenBLAS runs its {arch} (AVX2) kernels")
    assert "OPENBLAS_CORETYPE=SkylakeX" in unset
    chosen = cpu.coretype_hint(info(arch), AVX512, {"OPENBLAS_CORETYPE": arch})
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
    assert cpu.coretype_hint(record, flags, {}) is None


def test_cpu_flags_come_from_the_first_flags_line(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\nbugs\t: x\n\nprocessor\t: 1\n"
                       "flags\t\t: other\n")
    assert cpu.cpu_flags(str(cpuinfo)) == frozenset({"fpu", "avx2", "avx512f"})
    assert cpu.cpu_flags(str(tmp_path / "missing")) == frozenset()
    (tmp_path / "noflags").write_text("processor\t: 0\n")
    assert cpu.cpu_flags(str(tmp_path / "noflags")) == frozenset()


def test_summary_names_numpys_blas_as_threadpoolctl_sees_it():
    line = cpu.summary()
    assert line is not None  # NumPy's wheels ship OpenBLAS
    record = cpu.blas_info()
    assert "numpy" in record["filepath"]  # NumPy's own, not SciPy's (loaded once jax or dask is imported)
    first = line.splitlines()[0]
    assert first.startswith("BLAS: ") and record["version"] in first
    assert f"{record['num_threads']} threads" in first
    if record.get("architecture"):
        assert f"({record['architecture']} kernels, " in first


def test_line_is_the_summary_without_its_hint(monkeypatch):
    assert cpu.blas_line() == cpu.summary().splitlines()[0]
    monkeypatch.setattr(cpu, "blas_info", lambda: None)
    assert cpu.blas_line() == "BLAS: unknown" and cpu.summary() is None


def test_numpys_blas_is_told_apart_from_scipys():
    # The full suite imports jax and dask, which load SciPy's OpenBLAS beside NumPy's.
    code = ("import scipy.linalg, numpy as np; from inferno import cpu; "
            "from threadpoolctl import threadpool_info;"
            "scipy.linalg.blas.sgemm(1.0, np.ones((2, 2), np.float32), np.ones((2, 2), np.float32));"
            "print(sum(i['user_api'] == 'blas' for i in threadpool_info()), cpu.blas_info()['filepath'])")
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


# ------------------------------------------------------------------------------------- usable cores


def test_threads_option_env_and_default(monkeypatch):
    monkeypatch.delenv(ENV_THREADS, raising=False)
    assert resolve_threads(4) == 4
    assert resolve_threads("3") == 3
    assert resolve_threads(None) == resolve_threads("auto") == resolve_threads(0) == usable_cores()
    monkeypatch.setenv(ENV_THREADS, "5")
    assert resolve_threads(None) == 5
    assert resolve_threads(2) == 2  # the option wins over the environment
    monkeypatch.setenv(ENV_THREADS, "auto")
    assert resolve_threads(None) == usable_cores()


@pytest.mark.parametrize("bad", [-1, "many", 2.5, True, "1.5"])
def test_bad_threads_option(bad, monkeypatch):
    monkeypatch.delenv(ENV_THREADS, raising=False)
    with pytest.raises(ValueError, match=r"cpu-threaded: threads must be a positive integer or 'auto'"):
        resolve_threads(bad)
    with pytest.raises(ValueError, match=r"^half backend: threads must be"):
        resolve_threads(bad, who="half backend")


def test_bad_threads_env(monkeypatch):
    monkeypatch.setenv(ENV_THREADS, "-2")
    with pytest.raises(ValueError, match=r"\$INFERNO_THREADS must be a positive integer .* got '-2'"):
        ThreadedBackend()
    monkeypatch.setenv(ENV_THREADS, "2000")
    with pytest.raises(ValueError, match=r"\$INFERNO_THREADS must be at most 1024, got 2000"):
        resolve_threads(None)


def test_usable_cores_respects_affinity_and_quota(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5}, raising=False)
    monkeypatch.setattr(cpu, "cgroup_cpu_quota", lambda: None)
    assert usable_cores() == 6
    monkeypatch.setattr(cpu, "cgroup_cpu_quota", lambda: 2.5)  # 250 ms per 100 ms: 3 cores' worth
    assert usable_cores() == 3
    monkeypatch.setattr(cpu, "cgroup_cpu_quota", lambda: 0.2)
    assert usable_cores() == 1
    monkeypatch.setattr(cpu, "cgroup_cpu_quota", lambda: 64.0)  # a quota above the affinity: the affinity
    assert usable_cores() == 6


def test_cgroup_quota_files(tmp_path):
    none = tmp_path / "no-membership"
    assert cgroup_cpu_quota(tmp_path, none) is None  # no cgroup files at all
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(tmp_path, none) is None
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_quota(tmp_path, none) == 1.5
    (tmp_path / "cpu.max").write_text("garbage\n")
    assert cgroup_cpu_quota(tmp_path, none) is None
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_quota(tmp_path, none) is None
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("400000\n")
    assert cgroup_cpu_quota(tmp_path, none) == 4.0


def test_cgroup_v2_quota_of_this_process_group_and_its_parents(tmp_path):
    # /proc/self/cgroup's "0::/a/b" is this process's v2 group: its cpu.max and its parents' count, the
    # smallest wins; a sibling's does not.
    membership = tmp_path / "self-cgroup"
    membership.write_text("12:cpu,cpuacct:/ignored\n0::/a/b\n")
    group = tmp_path / "a" / "b"
    group.mkdir(parents=True)
    (tmp_path / "sibling").mkdir()
    (tmp_path / "sibling" / "cpu.max").write_text("10000 100000\n")
    assert cgroup_cpu_quota(tmp_path, membership) is None
    (group / "cpu.max").write_text("300000 100000\n")
    assert cgroup_cpu_quota(tmp_path, membership) == 3.0
    (tmp_path / "a" / "cpu.max").write_text("200000 100000\n")
    assert cgroup_cpu_quota(tmp_path, membership) == 2.0  # the parent's is smaller
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(tmp_path, membership) == 2.0


# ------------------------------------------------------------------------------------- BLAS threads


def blas_now() -> int:
    return max(i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas")


def test_blas_threads_sets_and_restores_and_nests():
    before = cpu.current_blas_threads()
    assert before == blas_now()
    with cpu.blas_threads(1):
        assert blas_now() == 1
        with cpu.blas_threads(1):  # re-entrant in one thread
            assert blas_now() == 1
        assert blas_now() == 1
    assert blas_now() == before
    with pytest.raises(RuntimeError), cpu.blas_threads(1):
        raise RuntimeError("restored on the way out of an exception too")
    assert blas_now() == before


# The tests of limits set from several threads at once run in a fresh process: no other test's
# threads or limits in it.
PRELUDE = """
import sys, threading
import numpy as np
import threadpoolctl
from inferno import cpu

def blas_now():
    return max(i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas")

def in_a_thread(fn, *args):
    t = threading.Thread(target=fn, args=args)
    t.start()
    return t

def probe():
    with cpu.blas_threads(1):
        seen.append(blas_now())

before, seen = blas_now(), []
in_a_thread(probe).join()
if before < 2 or seen != [1] or blas_now() != before:
    print("SKIP", before, seen)
    sys.exit(0)
"""


def run_fresh(body: str) -> str:
    proc = subprocess.run([sys.executable, "-c", PRELUDE + body], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if proc.stdout.startswith("SKIP"):
        pytest.skip(f"BLAS runs one thread here, or ignores a limit: {proc.stdout}")
    return proc.stdout


def test_set_blas_threads_waits_for_a_limited_section_and_is_not_undone_by_it():
    out = run_fresh("""
inside, done = threading.Event(), threading.Event()
def limited():
    with cpu.blas_threads(1):
        inside.set()
        done.wait(timeout=30)
holder = in_a_thread(limited)
assert inside.wait(timeout=30)
setter = in_a_thread(cpu.set_blas_threads, 1)
setter.join(timeout=0.3)
waited = setter.is_alive()
done.set()
holder.join(timeout=30)
setter.join(timeout=30)
print(waited, blas_now())
""")
    assert out.split() == ["True", "1"]  # it waited, and the section's restore did not undo it


def test_a_limit_set_from_another_thread_takes_effect_after_the_main_thread_set_one():
    # threadpoolctl lets only the first thread that sets OpenBLAS's threads set them while it lives
    # (here pytest's main thread), and silently ignores the others: an engine thread's limit did nothing.
    before = blas_now()
    if before < 2:
        pytest.skip("BLAS runs one thread here: nothing to tell apart")
    cpu.set_blas_threads(before)  # from the main thread
    seen = []

    def limited() -> None:
        with cpu.blas_threads(1):
            seen.append(blas_now())
        seen.append(blas_now())

    thread = threading.Thread(target=limited)
    thread.start()
    thread.join(timeout=60)
    assert seen == [1, before]
    with cpu.blas_threads(1):  # and the main thread can still set it
        assert blas_now() == 1
    assert blas_now() == before


#: Work that limits BLAS to one thread on each call, by backend.
WORK = {
    # cpu-threaded forced onto its pool: every product runs under one BLAS thread.
    "cpu-threaded": """
from inferno.backends.threaded import ThreadedBackend
be = ThreadedBackend(threads=2, min_rows=1, min_macs=1, min_elements=1)
rng = np.random.default_rng(0)
x, w, b = (rng.standard_normal(s, dtype=np.float32) for s in ((64, 96), (96, 128), (128,)))
works.append(lambda: be.linear(x, w, b))
""",
    # the half plugin's attention of a long prompt: NumPy's, under one BLAS thread.
    "half": """
from inferno_half.backend import SMALL_M, HalfBackend
half = HalfBackend("float16", threads=2)
if not half.compiled:
    print("SKIP the half plugin's kernels are not built: it never limits BLAS")
    sys.exit(0)
q = np.random.default_rng(1).standard_normal((1, 2, SMALL_M + 8, 16), dtype=np.float32)
works.append(lambda: half.attention(q, q, q, 0))
""",
}
HALF = pytest.mark.skipif(importlib.util.find_spec("inferno_half") is None,
                          reason="the inferno-gpt2-half plugin is not installed")


@pytest.mark.parametrize("kinds", [("cpu-threaded", "cpu-threaded"),
                                   pytest.param(("cpu-threaded", "half"), marks=HALF)],
                         ids=lambda k: "+".join(k))
def test_two_threads_on_two_backends_leave_blas_threads_as_they_were(kinds):
    # Each limit saves, sets and restores BLAS's one process-wide count: unless every backend goes
    # through one lock, thread A saves 2 and sets 1, B saves 1, A restores 2, B restores 1, and the
    # process is left on one BLAS thread for good.
    setup = "works = []\n" + "".join(WORK[k] for k in kinds)
    out = run_fresh(setup + """
start, errors = threading.Barrier(2), []
def work(run):
    try:
        start.wait(timeout=60)
        for _ in range(300):
            run()
    except BaseException as exc:
        errors.append(repr(exc))
threads = [in_a_thread(work, run) for run in works]
for t in threads:
    t.join(timeout=120)
assert not any(t.is_alive() for t in threads), "hung"
assert not errors, errors
print(before, blas_now())
""")
    before, after = out.split()
    assert after == before
