"""What tests of deliberately broken backends share."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from inferno.backends import registry
from inferno.backends.base import Backend
from inferno.conformance import ConformanceError, all_checks


def conformance_failures(cls: type[Backend], allowed: Iterable[str]) -> tuple[dict, list]:
    """Run every kernel check, and the larger checks built on the `allowed` kernels, on `cls()`.
    Returns ({check id: its ConformanceError}, the checks run)."""
    checks = all_checks(["kernel"]) + all_checks(["composition", "cache", "model"], kernels=allowed)
    failures = {}
    for check in checks:
        try:
            check(cls())
        except ConformanceError as exc:
            failures[check.id] = exc
    return failures, checks


@contextmanager
def registered(cls: type[Backend]) -> Iterator[str]:
    """`cls` in this process's backend registry for the duration (as a built-in); yields its name."""
    reg = registry._get()
    reg._add(cls, registry.BUILT_IN, registry._inferno_version(), cls.__module__)
    try:
        yield cls.name
    finally:
        registry._reset()
