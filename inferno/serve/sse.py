"""Server-Sent Events: the response that streams a completion's chunks, and its OpenAPI description."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from sse_starlette.sse import EventSourceResponse


def event_schema(chunk: str) -> dict[str, Any]:
    """One event of a stream whose chunks are the component schema `chunk` (before OpenAPI 3.2's
    itemSchema, `schema` describes each event): its data is a chunk, an error, or ``[DONE]``."""
    return {
        "type": "object", "required": ["data"],
        "properties": {"event": {"type": "string"}, "data": {"anyOf": [
            {"const": "[DONE]"},
            {"type": "string", "contentMediaType": "application/json",
             "contentSchema": {"anyOf": [{"$ref": f"#/components/schemas/{chunk}"},
                                         {"$ref": "#/components/schemas/ErrorResponse"}]}}]}},
    }


def streaming_kwargs(grace_seconds: float) -> dict[str, Any]:
    """`EventStream`'s settings: events end with one newline; the library's own shutdown waits past ours."""
    # sse-starlette >= 3 ends streams itself on shutdown after shutdown_grace_period; give ours time to
    # end them first, with a finish reason. (Older versions end them at once.)
    params = inspect.signature(EventSourceResponse.__init__).parameters
    out: dict[str, Any] = {"sep": "\n"}
    if "shutdown_grace_period" in params:
        out["shutdown_grace_period"] = grace_seconds + 2.0
    return out


class EventStream(EventSourceResponse):
    """An SSE response that calls `on_close` however it ends (done, client gone, shutdown), even if the
    body generator never started."""

    def __init__(self, content: Any, on_close: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
