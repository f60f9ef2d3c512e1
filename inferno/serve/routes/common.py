"""What the routes share: their router class, the documented error responses, and how a completion
that runs in the engine is answered (a stream, or one response once every choice has ended)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from inferno.serve.bodies import JsonRoute
from inferno.serve.completions import Completion
from inferno.serve.middleware import LOG_KEY
from inferno.serve.schemas import ErrorResponse
from inferno.serve.sse import EventStream, streaming_kwargs
from inferno.serve.state import ServerState

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "A bad request (the message says what, param where)"},
    401: {"model": ErrorResponse, "description": "--api-key is set and the bearer token is not it"},
    413: {"model": ErrorResponse, "description": "The body is larger than 1 MiB"},
    503: {"model": ErrorResponse, "description": "The model is loading, or the server is shutting down"},
}
QUEUE_FULL = {429: {"model": ErrorResponse,
                    "description": "The engine's wait queue is full; see Retry-After"}}


def new_router() -> APIRouter:
    """A router whose routes read bodies as strict JSON (`JsonRoute`). The routes are added with
    `router.add_api_route(...)` after each function rather than decorated: mutmut does not mutate
    a decorated function, and these are where the server's logic lives."""
    return APIRouter(route_class=JsonRoute)


def log_info(request: Request) -> dict[str, Any]:
    """Where a route leaves what the access log line should say (tokens, prompt)."""
    return request.scope.setdefault(LOG_KEY, {})


async def disconnected(request: Request) -> None:
    """Return when the client has gone (the body is read: the next message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def respond(state: ServerState, request: Request, completion: Completion, stream: bool) -> Response:
    """Run `completion` (already submitted) to its end: SSE events as its tokens come, or one JSON
    response. However it ends, every choice still running is cancelled (the client left) and the access
    log learns the tokens and finish reasons."""
    info = log_info(request)
    state.track(completion)
    state.metrics.prompt_tokens.inc(completion.prompt_tokens)
    info["prompt_tokens"] = completion.prompt_tokens

    def done() -> None:
        completion.cancel()
        state.untrack(completion)
        info["completion_tokens"] = completion.completion_tokens
        info["finish_reasons"] = ",".join(sorted({c.finish_reason or "-" for c in completion.choices}))

    if stream:
        async def events():
            async for data in completion.stream():
                yield {"data": data}

        return EventStream(events(), done, **streaming_kwargs(state.config.grace_seconds))

    collect = asyncio.ensure_future(completion.collect())
    gone = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({collect, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not collect.done():
            collect.cancel()
        done()
    if not collect.done() or collect.cancelled():
        info["disconnected"] = True
        return Response(status_code=499)  # nobody reads it: the client has gone
    return JSONResponse(collect.result())
