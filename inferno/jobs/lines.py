"""The rows of a JSONL job file: one JSON object a line, each with a unique id (its line number when it
has none), parsed and checked before anything runs; a malformed line is a `LineError` for that line.

A line is read with the standard library's JSON parser, a key given twice refused; every kind of row
(generation requests, texts to score) shares `parse_rows`' rules for ids and duplicates.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

from inferno.files import find_surrogate

#: The most bytes one input line may have: the bound `inferno score FILE` puts on one text. A longer
#: line is refused before it is decoded, so that one runaway line cannot make the job hold several
#: copies of it (the bytes, the text, the parsed strings, the tokens).
MAX_LINE_BYTES = 64 << 20

# A lone surrogate can only come from a \u escape: UTF-8 input cannot encode one.
_MAYBE_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


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
    if _MAYBE_SURROGATE.search(text):
        found = find_surrogate(obj)
        if found is not None:
            field, key = found
            where = (f"a key of {field}" if field else "a key") if key else (field or "the line")
            # The server refuses these too: they are not Unicode text, and the tokenizer would turn
            # them into U+FFFD without a word.
            raise LineError(f"{where} holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not Unicode "
                            "text; write UTF-8 text (a character beyond U+FFFF may be an escaped pair)")
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


class LongLine(int):
    """In place of a line longer than `split_lines`' limit: its length in bytes, the line unread."""


def split_lines(data: bytes, limit: int | None = None) -> Iterator[tuple[int, bytes | LongLine]]:
    """(line number, content) of every non-blank line; a UTF-8 byte-order mark and CR-LF are allowed.
    One line at a time, so that the file is never held twice; a line of more than `limit` bytes (before
    its newline) comes as its `LongLine` length, without being copied."""
    lines = io.BytesIO(data)  # shares `data`'s bytes, not a copy
    if data.startswith(b"\xef\xbb\xbf"):
        lines.seek(3)
    line = 0
    while True:
        start = lines.tell()
        raw = lines.readline(-1 if limit is None else limit + 1)
        if not raw:
            return
        line += 1
        if limit is not None and len(raw) > limit and not raw.endswith(b"\n"):  # left unread past the limit
            end = data.find(b"\n", start)
            end = len(data) if end < 0 else end
            lines.seek(end + 1)
            yield line, LongLine(end - start)
            continue
        raw = raw[:-1] if raw.endswith(b"\n") else raw
        if raw.strip():  # strip() copies only a line that has spaces around it
            yield line, raw.rstrip(b"\r")


def line_digest(raw: bytes) -> str:
    """A fingerprint of an input line (its bytes, less surrounding whitespace), which a job writes with
    each result so that a resumed job can tell whether its input changed."""
    return hashlib.sha256(raw.strip()).hexdigest()[:16]


def parse_rows(data: bytes, parse: Callable[[str, int], Any]) -> tuple[list[Any], list[tuple[int, str]]]:
    """`parse(text, line)` of every non-blank line of an input file (an object with an ``id``, or a
    `LineError`), and (line, message) for every malformed line, duplicate ids included: the rules of
    `parse_requests`, for any kind of row (``inferno score -o`` reads its texts with them too)."""
    requests: list[Any] = []
    errors: list[tuple[int, str]] = []
    first_line: dict[str | int, int] = {}
    for line, raw in split_lines(data, MAX_LINE_BYTES):
        if isinstance(raw, LongLine):
            errors.append((line, f"{raw} bytes: more than the {MAX_LINE_BYTES}-byte limit for a line"))
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            errors.append((line, f"not UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})"))
            continue
        req, problem = None, None
        try:
            req = parse(text, line)
            rid = req.id
            req.digest = line_digest(raw)
        except LineError as exc:
            rid, problem = exc.id, str(exc)
        del text
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
