"""Runs on other systems' runtimes: Ray Data batch jobs (`ray_batch`) and Ray Serve replicas
(`ray_serve`).

Each of those modules imports Ray at its top; this package does not, so that ``import inferno`` and the
command line stay free of Ray until ``--ray`` (or an import of one of the modules) asks for it: what
the command line needs before that (the missing-extra check) lives here.
"""

from __future__ import annotations

import importlib.util
import math

#: What to install: Ray Data and Ray Serve at the version the integrations are tested with.
RAY_INSTALL = 'pip install "inferno-gpt2[ray]"'

#: The top-level modules each integration needs beyond the core (ray[data] brings pyarrow and pandas;
#: ray[serve] and the serve extra bring FastAPI and uvicorn).
_NEEDS = {"data": ("ray", "pyarrow", "pandas"), "serve": ("ray", "fastapi", "uvicorn", "sse_starlette")}


def ray_missing(part: str = "data") -> str | None:
    """A one-line reason why Ray's `part` ("data" or "serve") cannot be used here, else None. Looks for
    the modules without importing them."""
    missing = [name for name in _NEEDS[part] if not _importable(name)]
    if not missing:
        return None
    return f"needs Ray {part.capitalize()} (missing: {', '.join(missing)}): {RAY_INSTALL}"


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a module blocked in sys.modules, a broken parent package
        return False


def limit_blas_to_ray_cpus(default: float = 1.0) -> int:
    """In a Ray worker: BLAS on the CPUs Ray gave this worker (at least one thread) from now on, so that
    workers sharing a node do not oversubscribe it; returns that thread count. Ray sets OMP_NUM_THREADS
    too, but only once NumPy (and its BLAS) may already be loaded. Set through `inferno.cpu`, whose lock
    keeps a backend's limited section from undoing it."""
    import ray

    from inferno.cpu import set_blas_threads

    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", default)
    threads = max(1, math.floor(cpus))
    set_blas_threads(threads)
    return threads
