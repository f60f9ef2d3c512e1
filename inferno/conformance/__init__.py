"""The backend conformance suite: every kernel of a backend against a float64 reference.

Run it on any registered backend, from any folder, with only inferno and pytest installed::

    pytest --pyargs inferno.conformance --backend NAME[:key=value,...]

or from your own tests, like scikit-learn's ``parametrize_with_checks``::

    from inferno.conformance import parametrize_with_checks

    @parametrize_with_checks([MyBackend(), MyBackend(dtype="float64")])
    def test_conformance(backend, check):
        check(backend)

See `inferno.conformance.checks` for what is checked and the tolerances, and
`inferno.conformance.plugin` for the pytest options.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferno.backends.base import Backend
    from inferno.conformance.checks import Check, ConformanceError, all_checks, check_backend, tolerance_for

__all__ = [
    "Check", "ConformanceError", "all_checks", "check_backend", "parametrize_with_checks", "tolerance_for",
]


def parametrize_with_checks(backends: list[Backend], kinds: list[str] | None = None) -> Any:
    """A ``pytest.mark.parametrize("backend, check", ...)`` over every (backend, check) pair.

    Test ids read ``<backend name>-<dtype>-<kernel>-<case>``, e.g. ``numpy-float32-layernorm-large-mean``.
    `kinds` selects some kinds of checks ("kernel", "composition", "cache", "model"; default all).
    """
    import pytest

    from inferno.conformance.checks import all_checks, dtype_name

    pairs = [(b, c) for b in backends for c in all_checks(kinds)]
    ids = [f"{b.name or type(b).__name__}-{dtype_name(b.dtype)}-{c.id}" for b, c in pairs]
    return pytest.mark.parametrize("backend, check", pairs, ids=ids)


def __getattr__(name: str) -> Any:
    # Lazy, so that the pytest plugin (imported by every pytest run) does not import NumPy.
    if name in ("Check", "ConformanceError", "all_checks", "check_backend", "tolerance_for"):
        from inferno.conformance import checks

        return getattr(checks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
