"""The rows of a JSONL job file: one JSON object a line, each with a unique id (its line number when it
has none), parsed and checked before anything runs; a malformed line is a `LineError` for that line.

A line is read with the standard library's JSON parser, a key given twice refused; every kind of row
(generation requests, texts to score) shares `parse_rows`' rules for ids and duplicates.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any


class JobError(Exception):
    """A problem with the job as asked (its input, its output, a --strict failure, a Ray cluster that
    cannot be reached); one line."""


class LineError(ValueError):
    """What is wrong with one input line; `id` is the line's request id when it was read before the
    problem was found."""

    def __init__(self, message: str, id: str | int | None = None) -> None:
        super().__init__(message)
        self.id = id


def _json_type(value: Any) -> str:
    names = {bool: "true or false", int: "a number", float: "a number", str: "a string", list: "a list",
             type(None): "null"}
    return names.get(type(value), type(value).__name__)


def read_object(text: str) -> dict[str, Any]:
    """One JSONL line as a JSON object (a key given twice is refused), or a `LineError` saying why not."""
    try:
        obj = json.loads(text, object_pairs_hook=_object)
    except json.JSONDecodeError as exc:
        raise LineError(f"not valid JSON: {exc.msg} at column {exc.colno}") from None
    except LineError:
        raise
    except ValueError:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise LineError("not valid JSON: a number too long to read "
                        f"(more than {sys.get_int_max_str_digits()} digits)") from None
    except RecursionError:
        raise LineError("not valid JSON: nested too deeply") from None
    if not isinstance(obj, dict):
        raise LineError(f"expected a JSON object, got {_json_type(obj)}")
    return obj


def describe(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, (dict, list)) else type(value).__name__


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise LineError(f"key {key!r} appears twice")
        seen[key] = value
    return seen


def split_lines(data: bytes) -> list[tuple[int, bytes]]:
    """(line number, content) of every non-blank line; a UTF-8 byte-order mark and CR-LF are allowed."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    # The empty piece after a final newline is blank, so left out like any blank line.
    return [(i, raw.rstrip(b"\r")) for i, raw in enumerate(data.split(b"\n"), 1) if raw.strip()]


def parse_rows(data: bytes, parse: Callable[[str, int], Any]) -> tuple[list[Any], list[tuple[int, str]]]:
    """`parse(text, line)` of every non-blank line of an input file (an object with an ``id``, or a
    `LineError`), and (line, message) for every malformed line, duplicate ids included: the rules of
    `parse_requests`, for any kind of row (``inferno score -o`` reads its texts with them too)."""
    requests: list[Any] = []
    errors: list[tuple[int, str]] = []
    first_line: dict[str | int, int] = {}
    for line, raw in split_lines(data):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            errors.append((line, f"not UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})"))
            continue
        req, problem = None, None
        try:
            req = parse(text, line)
            rid = req.id
        except LineError as exc:
            rid, problem = exc.id, str(exc)
        if rid is not None and rid in first_line:
            problem = f"duplicate id {json.dumps(rid)} (first on line {first_line[rid]})"
        elif rid is not None:
            first_line[rid] = line
        if problem is not None:
            errors.append((line, problem))
        elif req is not None:
            requests.append(req)
    return requests, errors


def checked(pipe: Any, requests: list, check: Any) -> tuple[list, list[tuple[int, str]]]:
    """`requests` split by ``check(pipe, req)``: those it accepts, and (line, message) for those it
    rejects with a `LineError`."""
    valid, late = [], []
    for req in requests:
        try:
            check(pipe, req)
            valid.append(req)
        except LineError as exc:
            late.append((req.line, str(exc)))
    return valid, late
