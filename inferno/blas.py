"""Which BLAS NumPy runs here, and a hint when OpenBLAS runs AVX2 kernels on a CPU with AVX-512.

OpenBLAS picks its kernels for the CPU it finds at load, unless ``OPENBLAS_CORETYPE`` names them. Two
ways to end up with AVX2-only kernels on an AVX-512 CPU:
- the variable is set to an older family. The development machine's environment sets
  ``OPENBLAS_CORETYPE=Haswell``, because older OpenBLAS builds fail on its CPU;
- an OpenBLAS older than the CPU falls back to such a family by itself.

On the development machine's AMD EPYC (Zen 5), the AVX-512 (SkylakeX) kernels that OpenBLAS picks by
itself ran prefill faster than the Haswell ones but decode slower (docs/benchmarks.md). So inferno only
says so (`inferno backends`) and leaves the choice to the user. The
variable is read when NumPy loads its BLAS, so it must be set or unset before the process starts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

#: OpenBLAS kernel families that use AVX2 at most, by the names threadpoolctl reports (lower case).
AVX2_KERNELS = frozenset({"haswell", "zen", "excavator", "sandybridge", "nehalem", "core2", "atom",
                          "prescott"})
AVX512 = frozenset({"avx512f", "avx512bw", "avx512vl"})


def blas_info() -> dict | None:
    """threadpoolctl's record of NumPy's BLAS (internal_api, version, architecture, num_threads, ...), or
    None when it cannot be told apart: SciPy (imported by JAX, Dask...) loads an OpenBLAS of its own, so
    the one in NumPy's wheel (``numpy.libs``, or inside the package) is preferred, and otherwise the only
    one loaded."""
    from pathlib import Path

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


def line() -> str:
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
