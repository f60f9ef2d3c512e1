"""Fixtures of the conformance suite (the backend under test comes from the plugin's --backend)."""

from __future__ import annotations

import pytest

from inferno.conformance.checks import Check, ConformanceError


@pytest.fixture(scope="session")
def backend(request: pytest.FixtureRequest):
    from inferno.conformance.plugin import session_backend

    return session_backend(request.config)


@pytest.fixture
def run_check(backend):
    """Run a check; a failure is reported by its message alone (it names the kernel and the case)."""

    def run(check: Check) -> None:
        try:
            check(backend)
        except ConformanceError as exc:
            pytest.fail(str(exc), pytrace=False)

    return run
