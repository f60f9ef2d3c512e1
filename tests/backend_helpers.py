"""What tests of deliberately broken backends share."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

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


#: What a row that breaks the numbers raises in `rows_holding_fail` (as kv=float16's cache does).
NUMBERS_BROKEN = "kv=float16: a key or value is beyond float16's range (65504)"


@contextmanager
def rows_holding_fail(model: Any, poison: int) -> Iterator[list[int]]:
    """`model.forward_ragged` raising ValueError(NUMBERS_BROKEN) for any step with a row that holds the
    token `poison` (as a key beyond float16's range does), for the duration; yields the row count of
    every step asked of it."""
    real, rows_seen = model.forward_ragged, []

    def forward_ragged(rows, *args, **kwargs):
        rows_seen.append(len(rows))
        if any(poison in list(tokens) for tokens, _, _ in rows):
            raise ValueError(NUMBERS_BROKEN)
        return real(rows, *args, **kwargs)

    model.forward_ragged = forward_ragged
    try:
        yield rows_seen
    finally:
        model.forward_ragged = real
