"""Runs on other systems' runtimes: Ray Data batch jobs (`ray_batch`) and Ray Serve replicas
(`ray_serve`).

Each of those modules imports Ray at its top; this package does not, so that ``import inferno`` and the
command line stay free of Ray until ``--ray`` (or an import of one of the modules) asks for it. What
the command line needs before that (the --ray flags, the missing-extra check) lives here.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
from typing import TYPE_CHECKING

from inferno.cli import _number, _positive  # the command line's argument types, one definition

if TYPE_CHECKING:
    from collections.abc import Sequence

#: What to install: Ray Data and Ray Serve at the version the integrations are tested with.
RAY_INSTALL = 'pip install "inferno[ray]"'

#: The top-level modules each integration needs beyond the core (ray[data] brings pyarrow and pandas;
#: ray[serve] and the serve extra bring FastAPI and uvicorn).
_NEEDS = {"data": ("ray", "pyarrow", "pandas"), "serve": ("ray", "fastapi", "uvicorn", "sse_starlette")}

#: The flags that only mean something with --ray.
RAY_ONLY = ("workers", "cpus_per_worker")


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


def limit_blas_to_ray_cpus(default: float = 1.0) -> object:
    """In a Ray worker: cap BLAS at the CPUs Ray gave this worker (at least one thread), so that workers
    sharing a node do not oversubscribe it. Ray sets OMP_NUM_THREADS too, but only once NumPy (and its
    BLAS) may already be loaded. Returns the threadpoolctl limiter (keep it)."""
    import ray
    from threadpoolctl import threadpool_limits

    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", default)
    return threadpool_limits(limits=max(1, math.floor(cpus)), user_api="blas")


def add_ray_args(p: argparse.ArgumentParser) -> None:
    """The flags --ray adds to ``inferno batch`` and ``inferno score``."""
    arg = p.add_argument
    arg("--ray", metavar="ADDRESS", nargs="?", const="", type=_address,
        help="run on Ray Data (needs the ray extra): without ADDRESS, ray.init()'s default (RAY_ADDRESS, "
        "a Ray started on this machine, else a new local one); 'auto', HOST:PORT or ray://HOST:PORT for "
        "a cluster")
    arg("--workers", metavar="N", type=_positive_int,
        help="with --ray: Ray actors, each loading the model once (default 1)")
    arg("--cpus-per-worker", metavar="N", type=_positive_float,
        help="with --ray: CPUs Ray reserves for each worker, which are its BLAS threads (default 1)")


def _address(text: str) -> str:
    """"" (none given), "auto", "local", HOST:PORT or ray://HOST:PORT. Anything else (IN written right
    after a bare --ray) is refused, so that --ray never takes the input file for an address."""
    if text in ("", "auto", "local") or text.startswith("ray://"):
        return text
    host, sep, port = text.rpartition(":")
    if sep and host and port.isdigit():
        return text
    raise argparse.ArgumentTypeError(f"expected auto, HOST:PORT or ray://HOST:PORT, got {text!r} (write "
                                     "--ray after IN, or --ray=ADDRESS)")


_address.__name__ = "--ray ADDRESS"


_positive_int = _positive
_positive_float = _number(float, lambda v: math.isfinite(v) and v > 0, "a number > 0")


def without_ray(args: argparse.Namespace, extra: Sequence[str] = ()) -> str | None:
    """The first flag given that only works with --ray (None when --ray is given or none is)."""
    if getattr(args, "ray", None) is not None:
        return None
    for name in (*RAY_ONLY, *extra):
        if getattr(args, name, None) not in (None, False):
            return "--" + name.replace("_", "-")
    return None


def run_ray_job(kind: str, args: argparse.Namespace, prog: str) -> int:
    """Run the job the --ray flags ask for (kind "generate" or "score"); a missing extra is a `CliError`
    (one line, exit 2) naming what to install."""
    from inferno.cli import CliError

    missing = ray_missing("data")
    if missing:
        raise CliError(f"--ray {missing}")
    from inferno.integrations.ray_batch import run_cli

    return run_cli(kind, args, prog)
