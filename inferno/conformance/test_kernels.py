"""Every kernel, and the host boundary, against the float64 reference (see `inferno.conformance.checks`)."""

import pytest

from inferno.conformance.checks import all_checks


@pytest.mark.parametrize("check", all_checks(["kernel"]), ids=str)
def test_kernel(run_check, check):
    run_check(check)
