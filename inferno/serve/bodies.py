"""Reading request bodies: strict JSON, and validation errors as one message naming the field.

`JsonRoute` is the route class of every router: it reads bodies as `StrictJsonRequest` and takes a body
without a Content-Type as JSON. A body is refused with a 400 that says where and why when it is not
JSON as RFC 8259 has it (NaN and Infinity are not numbers), when it is not UTF-8, when it nests deeper
than `MAX_DEPTH`, when a number has more digits than Python reads (``sys.get_int_max_str_digits``), and
when any string in it holds a lone UTF-16 surrogate (``"\\ud800"``, or its bytes sent raw): that is
not Unicode text, and would be silently replaced or refused later depending on the field.
`validation_message` turns pydantic's errors into the message and ``param`` of a 400, naming the field
as the client sent it (``stop``, ``prompt[2]``, ``logit_bias.50256``), never a pydantic internal.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from typing import Any

from fastapi import HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.routing import APIRoute

from inferno.files import find_surrogate

#: How deep a body may nest (a request needs 4 levels: a chat message's content parts). json.loads
#: would recurse until it fails; this says where and why first.
MAX_DEPTH = 32

# A JSON string (skipped whole), or a bracket / a run of digits outside one.
_STRING = r'"(?:[^"\\]|\\.)*"'
_BRACKETS = re.compile(_STRING + r"|[\[\]{}]")
_NUMBERS = re.compile(_STRING + r"|-?[0-9]+")
# A surrogate, raw (bytes decoded with surrogatepass, as json.loads does) or escaped (\ud800-\udfff).
_MAYBE_SURROGATE = re.compile(r"[\ud800-\udfff]|\\u[dD][89a-fA-F]")


class BodyError(HTTPException):
    """A 400 for a body that parsed but holds what no field accepts; `param` names the field."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(400, message)
        self.param = param


def _text(body: bytes) -> str:
    # As json.loads(bytes) reads them: UTF-8 (or UTF-16/32 by their BOM-less pattern), surrogates passed.
    try:
        return body.decode(json.detect_encoding(body), "surrogatepass")
    except UnicodeDecodeError:
        raise json.JSONDecodeError("the body is not UTF-8 text", "", 0) from None


def _check_depth(text: str) -> None:
    if text.count("[") + text.count("{") <= MAX_DEPTH:  # the common case: no scan
        return
    depth = 0
    for m in _BRACKETS.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise json.JSONDecodeError(f"nested deeper than {MAX_DEPTH} levels", text, m.start())
        elif c in "]}":
            depth -= 1


def _long_number(text: str) -> json.JSONDecodeError | None:
    """The error for the first number with more digits than int() reads, if that is what failed."""
    limit = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 0
    for m in _NUMBERS.finditer(text):
        digits = len(m.group().lstrip("-"))
        if limit and m.group()[0] != '"' and digits > limit:
            return json.JSONDecodeError(f"a number of {digits} digits (this server reads at most {limit})",
                                        text, m.start())
    return None


def _path(parent: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else key


def parse_json(body: bytes) -> Any:
    """`body` as strict JSON; `json.JSONDecodeError` (where and why) or `BodyError` (which field)."""

    def no_constant(name: str) -> Any:
        raise json.JSONDecodeError(f"{name} is not valid JSON (numbers must be finite)", "", 0)

    text = _text(body)
    _check_depth(text)
    try:
        value = json.loads(text, parse_constant=no_constant)
    except json.JSONDecodeError:
        raise
    except ValueError:  # int() refuses a number of more than sys.get_int_max_str_digits() digits
        error = _long_number(text)
        if error is None:
            raise
        raise error from None
    except RecursionError:  # below MAX_DEPTH on a deep stack: still the client's doing
        raise json.JSONDecodeError("nested too deeply", text, 0) from None
    if _MAYBE_SURROGATE.search(text):
        found = find_surrogate(value)
        if found is not None:
            field, key = found
            what = (f"{field} has a key that holds" if field else "the body has a key that holds") if key \
                else f"{field or 'the body'} holds"
            raise BodyError(f"{what} a lone UTF-16 surrogate (\\ud800-\\udfff), which is not Unicode text; "
                            "send UTF-8 text (a character beyond U+FFFF may be an escaped pair)",
                            param=field or None)
    return value


class StrictJsonRequest(Request):
    """A request whose `json()` is `parse_json`'s."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = parse_json(await self.body())
        return self._json


class JsonRoute(APIRoute):
    """Reads bodies with `StrictJsonRequest`; a body without a Content-Type is taken as JSON."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            scope = request.scope
            if not any(k == b"content-type" for k, _ in scope.get("headers", ())):
                scope["headers"] = [*scope.get("headers", ()), (b"content-type", b"application/json")]
            return await handler(StrictJsonRequest(scope, request.receive))

        return route


# ------------------------------------------------------------------------------- validation errors

#: Messages that say the rule where pydantic's would name one of its own types.
_RULES = {"model_type": "must be a JSON object", "dict_type": "must be a JSON object",
          "model_attributes_type": "must be a JSON object"}


def _client_path(loc: tuple, body: Any) -> tuple[str, bool]:
    """The field as the client sent it, from pydantic's `loc`: the keys and indexes found in `body`,
    without the union members and validator names pydantic inserts (``stop.constrained-str``). Also
    whether the error is about a key itself (``[key]``)."""
    where, at, on_key = "", body, False
    for part in loc:
        if part == "body" and at is body and where == "":
            continue
        if isinstance(at, dict) and isinstance(part, str) and part in at:
            where, at = _path(where, part), at[part]
        elif isinstance(at, list) and isinstance(part, int) and 0 <= part < len(at):
            where, at = _path(where, part), at[part]
        elif part == "[key]":
            on_key = True
        # else: a name pydantic gives a union member or a validator; not the client's
    return where, on_key


def validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """The message and param of the first error of `exc`."""
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    e = errors[0]
    kind = e.get("type", "")
    if kind == "json_invalid":
        reason = (e.get("ctx") or {}).get("error", "")
        pos = e.get("loc", ("body", 0))[-1]
        where = f" at character {pos}" if isinstance(pos, int) and pos > 0 else ""
        return f"invalid JSON in the request body{where}: {reason}".rstrip(": "), None
    loc = tuple(e.get("loc", ()))
    param, on_key = _client_path(loc, exc.body)
    if kind == "missing" and param and isinstance(loc[-1], str):  # the field that is not there
        return f"{_path(param, loc[-1])} is required", _path(param, loc[-1])
    if not param:
        if kind == "missing" and len(loc) > 1:  # a required field: it is not in the body to be found
            param = ".".join(str(x) for x in loc if x != "body")
            return f"{param} is required", param
        if kind == "missing":
            return "the request needs a JSON object body", None
        return "the request body must be a JSON object (Content-Type: application/json)", None
    message = _RULES.get(kind, e.get("msg", "invalid value"))
    if on_key:
        key = param.rsplit(".", 1)[-1]
        param = param.rsplit(".", 1)[0]
        message = f"has the key {key!r}: {message}"
    # Our own messages read on from the field's name ("prompt must be ..."); pydantic's stand alone.
    sep = " " if message.startswith(("is ", "must ", "has ")) else ": "
    return f"{param}{sep}{message}", param
