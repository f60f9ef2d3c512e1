"""Reading request bodies: strict JSON, and validation errors as one message naming the field.

`JsonRoute` is the route class of every router: it reads bodies as `StrictJsonRequest` (JSON as RFC 8259
has it) and takes a body without a Content-Type as JSON. `validation_message` turns pydantic's errors
into the message and ``param`` of a 400.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.routing import APIRoute


class StrictJsonRequest(Request):
    """JSON as RFC 8259 has it: Python's json reads NaN and Infinity, which are not JSON."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()

            def no_constant(name: str) -> Any:
                raise json.JSONDecodeError(f"{name} is not valid JSON (numbers must be finite)", "", 0)

            try:
                self._json = json.loads(body, parse_constant=no_constant)
            except UnicodeDecodeError:
                raise json.JSONDecodeError("the body is not UTF-8 text", "", 0) from None
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


def validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    e = errors[0]
    loc = [str(x) for x in e.get("loc", ()) if x != "body"]
    kind = e.get("type", "")
    if kind == "json_invalid":
        reason = (e.get("ctx") or {}).get("error", "")
        pos = e.get("loc", ("body", 0))[-1]
        where = f" at character {pos}" if isinstance(pos, int) and pos > 0 else ""
        return f"invalid JSON in the request body{where}: {reason}".rstrip(": "), None
    if not loc:
        if kind == "missing":
            return "the request needs a JSON object body", None
        return "the request body must be a JSON object (Content-Type: application/json)", None
    param = ".".join(loc)
    message = e.get("msg", "invalid value")
    # Our own messages read on from the field's name ("prompt must be ..."); pydantic's stand alone.
    sep = " " if message.startswith(("is ", "must ")) else ": "
    return f"{param}{sep}{message}", param
