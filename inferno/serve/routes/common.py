"""What the routes share: their router class, the documented error responses, and the dependency that
gives a route its app's serving object."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Request

from inferno.serve.bodies import JsonRoute
from inferno.serve.schemas import ErrorResponse
from inferno.serve.state import server_state

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "A bad request (the message says what, param where)"},
    401: {"model": ErrorResponse, "description": "--api-key is set and the bearer token is not it"},
    413: {"model": ErrorResponse, "description": "The body is larger than 1 MiB"},
    503: {"model": ErrorResponse, "description": "The model is loading, or the server is shutting down"},
}
MODEL_NOT_FOUND = {404: {"model": ErrorResponse,
                         "description": "The request names a model this server does not serve"}}
QUEUE_FULL = {429: {"model": ErrorResponse,
                    "description": "The engine's wait queue is full; see Retry-After"}}

S = TypeVar("S")


def new_router() -> APIRouter:
    """A router whose routes read bodies as strict JSON (`JsonRoute`)."""
    return APIRouter(route_class=JsonRoute)


def serving(cls: type[S]) -> Any:
    """The type of a route parameter that is its app's one `cls` serving object (made on first use, from
    the app's `ServerState`): ``serving: serving(ServingChat)``."""
    key = f"inferno_{cls.__name__}"

    async def get(request: Request) -> S:  # async: runs on the event loop, so one is made per app
        obj = getattr(request.app.state, key, None)
        if obj is None:
            obj = cls(server_state(request))  # type: ignore[call-arg]
            setattr(request.app.state, key, obj)
        return obj

    return Annotated[cls, Depends(get)]
