"""A small random GPT-2, end to end: this backend's logits against the numpy backend in float64."""

import pytest

from inferno.conformance.checks import all_checks


@pytest.mark.parametrize("check", all_checks(["model"]), ids=str)
def test_model(run_check, check):
    run_check(check)
