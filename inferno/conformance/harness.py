"""The harness of the conformance checks: tolerances by compute dtype, `Check` (one case of one kernel),
`_Run` (seeded inputs, conversions and the comparison with the float64 reference, failing with a
`ConformanceError` that names the kernel and the case) and the registry the check modules add to.
See `inferno.conformance.checks` for what is checked and why the tolerances are what they are.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from inferno.backends.base import Backend
from inferno.conformance import reference as ref

KINDS = ("kernel", "composition", "cache", "model")


class ConformanceError(AssertionError):
    """A backend's result differs from the reference. The message starts with the kernel and the case."""

    def __init__(self, kernel: str, case: str, message: str) -> None:
        self.kernel = kernel
        self.case = case
        super().__init__(message)


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    #: Relative to the largest magnitude of the expected output.
    atol: float

    def __str__(self) -> str:
        return f"rtol={self.rtol:g}, atol={self.atol:g}×max|expected|"


TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(1e-6, 1e-6),
    "float32": Tolerance(1e-4, 1e-5),
    "float16": Tolerance(1e-2, 1e-2),
    "bfloat16": Tolerance(5e-2, 5e-2),
    # 4-bit weights (half:dtype=q4), against a reference on the unrounded ones; see checks.py.
    "q4": Tolerance(0.15, 0.15),
}


def dtype_name(dtype: Any) -> str:
    """"float32" for np.float32, np.dtype("float32"), "float32", torch.float32 ..."""
    name = getattr(dtype, "name", None)
    if not isinstance(name, str):
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = str(dtype)
    return name.rsplit(".", 1)[-1]


def tolerance_for(dtype: Any) -> Tolerance:
    """The tolerance for a compute dtype; the loosest one for a dtype not in `TOLERANCES`."""
    return TOLERANCES.get(dtype_name(dtype), TOLERANCES["bfloat16"])


@dataclass(frozen=True)
class Check:
    """One case of one kernel. Call it with a backend: it returns None or raises `ConformanceError`."""

    kernel: str
    case: str
    kind: str
    #: The case in words (shapes, input distribution), for messages.
    what: str
    func: Callable[[_Run], None] = field(repr=False, compare=False)

    @property
    def id(self) -> str:
        return f"{self.kernel}-{self.case}"

    def __str__(self) -> str:
        return self.id

    def __call__(self, backend: Backend) -> None:
        run = _Run(backend, self)
        try:
            self.func(run)
        except ConformanceError:
            raise
        except Exception as exc:  # a kernel that crashes fails its check, named like any other failure
            raise ConformanceError(self.kernel, self.case,
                                   f"{run.label}: raised {type(exc).__name__}: {exc}") from exc


class _Run:
    """What a check function needs: seeded inputs, conversions, and the comparison."""

    def __init__(self, backend: Backend, check: Check) -> None:
        self.backend = backend
        self.check = check
        self.tol = tolerance_for(backend.dtype)
        self.rng = np.random.default_rng(zlib.crc32(check.id.encode()))
        self.label = f"{check.kernel} [{check.case}: {check.what}]"

    def normal(self, shape, scale: float = 1.0, loc: float = 0.0) -> np.ndarray:
        x = self.rng.standard_normal(shape, dtype=np.float32)
        return np.float32(loc) + np.float32(scale) * x

    def array(self, host: np.ndarray) -> tuple[Any, np.ndarray]:
        """(backend array, the values it holds as float64) for an activation."""
        a = self.backend.from_numpy(np.asarray(host, dtype=np.float32))
        return a, ref.f64(self.backend.to_numpy(a))

    def weight(self, name: str, host: np.ndarray) -> tuple[Any, np.ndarray]:
        """(prepared weight, the values it holds as float64); `name` is the Hub key it would have."""
        host = np.asarray(host, dtype=np.float32)
        held = ref.f64(self.backend.to_numpy(self.backend.from_numpy(host)))
        return self.backend.prepare_weight(name, host), held

    def ids(self, host: np.ndarray) -> Any:
        return self.backend.from_numpy(np.asarray(host, dtype=np.int64))

    def fail(self, message: str) -> None:
        raise ConformanceError(self.check.kernel, self.check.case, f"{self.label}: {message}")

    def host(self, actual: Any, what: str) -> np.ndarray:
        got = self.backend.to_numpy(actual)
        if not isinstance(got, np.ndarray):
            self.fail(f"{what}: to_numpy returned {type(got).__name__}, not a numpy.ndarray")
        return got

    def expect(self, actual: Any, expected: np.ndarray, what: str = "output", factor: float = 1.0,
               against: str = "the float64 reference") -> None:
        """Compare a backend array (or host array) with the expected float64 values."""
        got = actual if isinstance(actual, np.ndarray) else self.host(actual, what)
        expected = ref.f64(expected)
        if got.shape != expected.shape:
            self.fail(f"{what} has shape {list(got.shape)}, expected {list(expected.shape)}")
        if got.dtype.kind != "f":
            self.fail(f"{what} has dtype {got.dtype} after to_numpy, expected a floating dtype")
        got = ref.f64(got)
        finite = np.isfinite(got)
        if not finite.all():
            idx = tuple(int(i) for i in np.argwhere(~finite)[0])
            self.fail(f"{what} has {int((~finite).sum())} non-finite values of {got.size} "
                      f"(first at {idx}: {got[idx]}, expected {expected[idx]:.6g})")
        tol_r, tol_a = self.tol.rtol * factor, self.tol.atol * factor
        scale = float(np.abs(expected).max()) if expected.size else 0.0
        err = np.abs(got - expected)
        bad = err > tol_r * np.abs(expected) + tol_a * scale
        if bad.any():
            idx = tuple(int(i) for i in np.unravel_index(np.argmax(np.where(bad, err, -1)), err.shape))
            self.fail(
                f"{what} differs from {against} in {int(bad.sum())} of {got.size} elements; worst at "
                f"{idx}: got {got[idx]:.6g}, expected {expected[idx]:.6g} (error {err[idx]:.3g}; "
                f"{dtype_name(self.backend.dtype)}: {self.tol}{f', ×{factor:g}' if factor != 1 else ''}, "
                f"max|expected| = {scale:.3g})"
            )


# ------------------------------------------------------------------------------------------ registry


def register(checks: list[Check], kernel: str, case: str, what: str, func: Callable[..., None],
             kind: str = "kernel", **params: Any) -> None:
    """Add one check to `checks` (a check module's list); `params` are bound to `func`."""
    checks.append(Check(kernel, case, kind, what, partial(func, **params) if params else func))


def _shape(a) -> str:
    return "[" + ", ".join(str(n) for n in a) + "]"

