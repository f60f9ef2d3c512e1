"""The CPU this process runs on: the cores it may use, the BLAS NumPy runs, and BLAS's thread count.

Threads are decided here and nowhere else:

* `usable_cores()`: the CPU affinity (``os.sched_getaffinity``) capped by the cgroup CPU quota (v2
  ``cpu.max`` of this process's cgroup and its parents, or v1 ``cpu.cfs_quota_us``), so that a container
  given two CPUs of a 64-core host runs two threads, not 64.
* `resolve_threads(threads)`: a backend's worker count: its ``threads`` option, else
  ``$INFERNO_THREADS``, else the usable cores; at most `MAX_THREADS`.
* `blas_threads(n)`: BLAS on `n` threads for the length of a ``with`` block, and what it was afterwards.
  BLAS's thread count is process-wide, so every backend and plugin limits it through this one context,
  which holds a process-wide lock: two threads that each saved, set and restored it on their own would
  interleave (A saves 2 and sets 1, B saves 1, A restores 2, B restores 1) and leave the process on one
  BLAS thread.
* `set_blas_threads(n)`: the process's BLAS thread count from now on (a Ray worker given n CPUs).

And which BLAS: `blas_info()`, `summary()` (what ``inferno backends`` prints) with a hint when OpenBLAS
runs AVX2-only kernels on a CPU with AVX-512. OpenBLAS picks its kernels for the CPU it finds at load,
unless ``OPENBLAS_CORETYPE`` names them, and two ways end up with AVX2-only kernels on an AVX-512 CPU: the
variable set to an older family (an environment that works around older OpenBLAS builds), or an OpenBLAS
older than the CPU falling back to one by itself. The AVX-512 kernels are not better for every shape
(docs/benchmarks.md compares them), so inferno only says so and leaves the choice to the user; the
variable is read when NumPy loads its BLAS, so it must be set or unset before the process starts.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path

#: The environment variable that sets the worker count of a backend given no ``threads`` option.
ENV_THREADS = "INFERNO_THREADS"
#: The most worker threads one may ask for (threads=N, $INFERNO_THREADS, --threads): more is a mistake,
#: not a machine (100000 threads fail to start).
MAX_THREADS = 1024

# ------------------------------------------------------------------------------------------ cores


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by a cgroup CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def cgroup_cpu_quota(root: str | os.PathLike[str] = "/sys/fs/cgroup",
                     membership: str | os.PathLike[str] = "/proc/self/cgroup") -> float | None:
    """CPUs allowed by the cgroup quota (e.g. 1.5), or None when there is none.

    cgroup v2: ``cpu.max`` (``"max 100000"`` or ``"150000 100000"``) of this process's cgroup (the
    ``0::/path`` line of `membership`) and its parents, the smallest wins; cgroup v1:
    ``cpu/cpu.cfs_quota_us`` over ``cpu/cpu.cfs_period_us``.
    """
    root = Path(root)
    limits = []
    for directory in _cgroup_v2_dirs(root, Path(membership)):
        parts = _read(directory / "cpu.max").split()
        if len(parts) == 2 and parts[0] != "max":
            limits.append(_ratio(parts[0], parts[1]))
    for v1 in (root / "cpu", root / "cpu,cpuacct"):
        limits.append(_ratio(_read(v1 / "cpu.cfs_quota_us"), _read(v1 / "cpu.cfs_period_us")))
    limits = [q for q in limits if q is not None]
    return min(limits) if limits else None


def _cgroup_v2_dirs(root: Path, membership: Path) -> list[Path]:
    # "0::/some/group" names this process's v2 cgroup (just "/" in most containers).
    relative = ""
    for line in _read(membership).splitlines():
        if line.startswith("0::"):
            relative = line[3:].strip().strip("/")
    directory = root / relative if relative else root
    dirs = [directory]
    while directory != root and root in directory.parents:
        directory = directory.parent
        dirs.append(directory)
    return dirs


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def resolve_threads(threads: int | str | None = None, who: str = "cpu-threaded") -> int:
    """The worker count: `threads` if given, else ``$INFERNO_THREADS``, else `usable_cores()`.

    ``None``, ``"auto"`` and ``0`` mean "not given". Raises ValueError, starting with `who`, for anything
    but a positive integer up to `MAX_THREADS`.
    """
    source = "threads"
    if threads is None or threads == "auto" or (type(threads) is int and threads == 0):
        env = os.environ.get(ENV_THREADS, "").strip()
        if env in ("", "auto", "0"):
            return usable_cores()
        threads, source = env, f"${ENV_THREADS}"
    try:
        if isinstance(threads, bool) or isinstance(threads, float):
            raise ValueError
        n = int(threads)
    except (TypeError, ValueError):
        n = 0
    if n < 1:
        raise ValueError(f"{who}: {source} must be a positive integer or 'auto', got {threads!r}")
    if n > MAX_THREADS:
        raise ValueError(f"{who}: {source} must be at most {MAX_THREADS}, got {n} "
                         f"(this machine has {usable_cores()} usable cores)")
    return n


# ----------------------------------------------------------------------------------- BLAS threads

# One lock for the process, because BLAS's thread count is one for the process. Re-entrant, so that a
# limited section may call code that limits again. (A reference count, restoring when the last one
# leaves, is not enough: the last to leave need not be a thread that can set it.)
_lock = threading.RLock()
_controller = None


def _blas_libs() -> list:
    global _controller
    if _controller is None:
        import numpy  # noqa: F401 - loads its BLAS, which threadpoolctl finds only once loaded
        from threadpoolctl import ThreadpoolController

        _controller = ThreadpoolController().select(user_api="blas")
    return _controller.lib_controllers


def current_blas_threads() -> int:
    """BLAS's thread count now (the largest over its libraries; 1 when there is none)."""
    return max((lib.num_threads or 1 for lib in _blas_libs()), default=1)


class blas_threads(AbstractContextManager):  # noqa: N801 - used like a function: `with blas_threads(1):`
    """``with blas_threads(n):`` runs BLAS on `n` threads, and restores what it found on exit.

    The whole section holds the process-wide lock: the limited sections of different threads run one
    at a time, so each restores exactly what it found. They are the sections where the caller's own
    threads already use every core (a pool that splits a product), so little is lost by serialising
    them. Re-entrant within a thread. (A plain class rather than a generator: it runs around every
    kernel call of a prompt.)
    """

    __slots__ = ("n", "saved")

    def __init__(self, n: int) -> None:
        self.n = n

    def __enter__(self) -> blas_threads:
        _lock.acquire()
        try:
            self.saved = [(lib, lib.num_threads) for lib in _blas_libs()]
            for lib, threads in self.saved:
                if threads != self.n:
                    _set(lib, self.n)
        except BaseException:
            _lock.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            for lib, threads in self.saved:
                if lib.num_threads != threads:
                    _set(lib, threads)
        finally:
            _lock.release()


def set_blas_threads(n: int) -> None:
    """BLAS on `n` threads from now on, for the whole process (not restored): what a Ray worker given `n`
    CPUs wants. Waits for any limited section to end, so that its restore does not undo this."""
    with _lock:
        for lib in _blas_libs():
            _set(lib, n)


def _set(lib, n: int) -> None:
    # threadpoolctl (3.8 on) lets only one thread at a time set OpenBLAS's pthreads pool, the first to
    # try while it lives, and silently ignores the others: a limit set from an engine thread would do
    # nothing once the main thread had set one. Our lock already lets one thread at a time in, so the
    # thread holding it takes control for its call and gives it back.
    clear = getattr(type(lib), "clear_controlling_thread", None)
    if clear is not None:
        clear(force=True)
    lib.set_num_threads(n)
    if clear is not None:
        clear(force=True)


# ------------------------------------------------------------------------------------ which BLAS

#: OpenBLAS kernel families that use AVX2 at most, by the names threadpoolctl reports (lower case).
AVX2_KERNELS = frozenset({"haswell", "zen", "excavator", "sandybridge", "nehalem", "core2", "atom",
                          "prescott"})
AVX512 = frozenset({"avx512f", "avx512bw", "avx512vl"})


def blas_info() -> dict | None:
    """threadpoolctl's record of NumPy's BLAS (internal_api, version, architecture, num_threads, ...), or
    None when it cannot be told apart: SciPy (imported by JAX, Dask...) loads an OpenBLAS of its own, so
    the one in NumPy's wheel (``numpy.libs``, or inside the package) is preferred, and otherwise the only
    one loaded."""
    import numpy as np
    from threadpoolctl import threadpool_info

    np.ones((2, 2), np.float32) @ np.ones((2, 2), np.float32)  # NumPy loads its BLAS at the first product
    found = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    package = Path(np.__file__).resolve().parent
    roots = (str(package) + os.sep, str(package.parent / "numpy.libs") + os.sep)
    own = [i for i in found if str(Path(i.get("filepath", "")).resolve()).startswith(roots)]
    if len(own) == 1:
        return own[0]
    return found[0] if len(found) == 1 else None


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags from the first ``flags`` line of /proc/cpuinfo (empty elsewhere)."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def coretype_hint(info: Mapping | None, flags: frozenset[str], env: Mapping[str, str]) -> str | None:
    """One line when OpenBLAS runs AVX2-only kernels on a CPU with AVX-512 (saying whether
    ``OPENBLAS_CORETYPE`` chose them); None otherwise."""
    if info is None or info.get("internal_api") != "openblas":
        return None
    arch = str(info.get("architecture", ""))
    if arch.lower() not in AVX2_KERNELS or not AVX512 <= flags:
        return None
    chosen = env.get("OPENBLAS_CORETYPE")
    if chosen is not None:
        return (f"OPENBLAS_CORETYPE={chosen} makes OpenBLAS run {arch} (AVX2) kernels on this CPU, which "
                "has AVX-512; without it (unset before starting) OpenBLAS may pick faster ones for prefill "
                "and scoring (decode may be slower): measure with inferno bench")
    return (f"OpenBLAS runs its {arch} (AVX2) kernels on this CPU, which has AVX-512: "
            "OPENBLAS_CORETYPE=SkylakeX (set before starting) may speed up prefill and scoring, and may "
            "slow decode: measure with inferno bench")


def _describe(info: Mapping) -> str:
    api = str(info.get("internal_api"))
    name = {"openblas": "OpenBLAS", "mkl": "MKL", "blis": "BLIS"}.get(api, api)
    kernels = f"{info['architecture']} kernels, " if info.get("architecture") else ""
    return f"BLAS: {name} {info.get('version', '')} ({kernels}{info.get('num_threads', '?')} threads)"


def blas_line() -> str:
    """``BLAS: OpenBLAS 0.3.31 (Haswell kernels, 2 threads)``, or ``BLAS: unknown``: the benchmarks'
    header (`summary` without its hint)."""
    info = blas_info()
    return "BLAS: unknown" if info is None else _describe(info)


def summary() -> str | None:
    """``BLAS: OpenBLAS 0.3.31 (Haswell kernels, 2 threads)``, and the hint on a second line if any."""
    info = blas_info()
    if info is None:
        return None
    hint = coretype_hint(info, cpu_flags(), os.environ)
    return _describe(info) if hint is None else f"{_describe(info)}\nhint: {hint}"
