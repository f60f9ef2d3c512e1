"""pytest hooks for mutation runs only: loaded by mutmut through ``-p scripts.mutation_hooks`` (setup.cfg's
``[mutmut] pytest_add_cli_args``), never by the test suite itself.

* Under a mutant (``MUTANT_UNDER_TEST`` set), the test files that took least time in mutmut's stats run
  go first: a mutant is then killed by the quick unit tests of its module rather than after seconds of
  slower files that also reach it (mutmut passes the tests in no particular order). Each file's own
  order is kept, so that its module- and session-scoped fixtures are set up as usual.
* A test's time limit (pytest-timeout's ``--timeout``) is for a test that hangs, never for one that is
  slow on a loaded machine: a test gets ten times what it took in the stats run, when that is more.
* A mutant's session that failed only by running into that limit ends with `MUTATION_HANG_EXIT`, which
  scripts/mutation_report.py counts as hung beside the kills, so that a hang is never reported as an
  assertion catching the mutant.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

#: Exit status of a mutant's test session that failed only by running into pytest-timeout's limit.
MUTATION_HANG_EXIT = 70
_timed_out: list[str] = []


def _under_a_mutant() -> bool:
    return bool(os.environ.get("MUTANT_UNDER_TEST"))


def pytest_collection_modifyitems(config, items):
    if not _under_a_mutant() or not Path("mutmut-stats.json").is_file():
        return
    try:
        durations = json.loads(Path("mutmut-stats.json").read_text())["duration_by_test"]
    except (OSError, ValueError, KeyError):
        return
    per_file: dict[str, float] = defaultdict(float)
    for item in items:
        per_file[item.nodeid.split("::")[0]] += durations.get(item.nodeid, 0.0)
    items.sort(key=lambda item: per_file[item.nodeid.split("::")[0]])
    if base := getattr(config.option, "timeout", None):
        for item in items:
            if 10 * durations.get(item.nodeid, 0.0) > base:
                item.add_marker(pytest.mark.timeout(10 * durations[item.nodeid]))


def pytest_runtest_logreport(report):
    if report.failed and _under_a_mutant() and "from pytest-timeout" in str(report.longrepr):
        _timed_out.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    if _timed_out and exitstatus == pytest.ExitCode.TESTS_FAILED:
        session.exitstatus = MUTATION_HANG_EXIT
