"""The compositions (mlp, self_attention, fused or not) and cached decode against a full recompute."""

import pytest

from inferno.conformance.checks import all_checks


@pytest.mark.parametrize("check", all_checks(["composition"]), ids=str)
def test_composition(run_check, check):
    run_check(check)


@pytest.mark.parametrize("check", all_checks(["cache"]), ids=str)
def test_kv_cache(run_check, check):
    run_check(check)
