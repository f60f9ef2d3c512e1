"""Shared fixtures."""

from __future__ import annotations

import importlib.util
import json
import os
from collections import defaultdict
from pathlib import Path

import pytest
from goldens import golden_model, write_model_dir

import inferno
from inferno.backends.registry import get_backend, list_backends


def _backend_specs() -> list:
    """Every registered backend that can run here, plus variants worth checking on their own."""
    params = [pytest.param(info.name, id=info.name) for info in list_backends() if info.ok]
    params.append(pytest.param("numpy:dtype=float64", id="numpy-float64"))
    # array_api_strict rejects anything outside the Array API standard: the portable backend's proof.
    strict = importlib.util.find_spec("array_api_strict") is not None
    params.append(pytest.param("array-api:xp=array_api_strict", id="array-api-strict",
                               marks=() if strict else pytest.mark.skip(reason="needs array-api-strict")))
    return params


def _parametrized_by_a_mark(metafunc, name: str) -> bool:
    for marker in metafunc.definition.iter_markers("parametrize"):
        names = marker.args[0] if marker.args else marker.kwargs.get("argnames", ())
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        if name in names:
            return True
    return False


def pytest_collection_modifyitems(config, items):
    # Under mutmut (a mutant's run, with -x), the test files that took least time in its stats run go
    # first: a mutant is then killed by the quick unit tests of its module rather than after seconds of
    # slower files that also reach it (mutmut passes the tests in no particular order). Each file's own
    # order is kept, so that its module- and session-scoped fixtures are set up as usual.
    if not os.environ.get("MUTANT_UNDER_TEST") or not Path("mutmut-stats.json").is_file():
        return
    try:
        durations = json.loads(Path("mutmut-stats.json").read_text())["duration_by_test"]
    except (OSError, ValueError, KeyError):
        return
    per_file: dict[str, float] = defaultdict(float)
    for item in items:
        per_file[item.nodeid.split("::")[0]] += durations.get(item.nodeid, 0.0)
    items.sort(key=lambda item: per_file[item.nodeid.split("::")[0]])
    # The tests' time limit (--timeout, pytest-timeout) is for a test that hangs, never for one that is
    # slow on a loaded machine: a test gets ten times what it took in the stats run, when that is more.
    if base := getattr(config.option, "timeout", None):
        for item in items:
            if 10 * durations.get(item.nodeid, 0.0) > base:
                item.add_marker(pytest.mark.timeout(10 * durations[item.nodeid]))


#: Exit status of a mutant's test session that failed only by running into pytest-timeout's limit (the
#: mutation environment's ``--timeout``): scripts/mutation_report.py counts such a mutant as hung, beside
#: the kills, so that a hang is never reported as an assertion catching the mutant.
MUTATION_HANG_EXIT = 70
_timed_out: list[str] = []


def pytest_runtest_logreport(report):
    under_mutation = os.environ.get("MUTANT_UNDER_TEST")
    if report.failed and under_mutation and "from pytest-timeout" in str(report.longrepr):
        _timed_out.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    if _timed_out and exitstatus == pytest.ExitCode.TESTS_FAILED:
        session.exitstatus = MUTATION_HANG_EXIT


def pytest_generate_tests(metafunc):
    # The `backend` fixture's parameters are worked out here, when a test that uses it is collected, not
    # when this file is imported: then a registry that fails (a mutant under mutation testing, a broken
    # plugin) fails those tests instead of the whole session.
    if "backend" in metafunc.fixturenames and not _parametrized_by_a_mark(metafunc, "backend"):
        metafunc.parametrize("backend", _backend_specs(), indirect=True, scope="session")


@pytest.fixture(scope="session")
def backend(request):
    """A constructed backend, parametrized like SciPy's ``xp``: every registered backend that can run."""
    be = get_backend(request.param)
    yield be
    be.close()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """The 'greedy' golden model (GPT-2's vocabulary, 2 layers, n_positions 128) with the real
    tokenizer.json, written once for every test that only reads it (a test that breaks a model folder
    copies it first)."""
    config, sd, _ = golden_model("greedy")
    return write_model_dir(tmp_path_factory.mktemp("greedy-model"), config, sd)


@pytest.fixture(scope="session")
def pipe(model_dir):
    """That model loaded on the numpy backend."""
    return inferno.load(model_dir, "numpy", download=False)
