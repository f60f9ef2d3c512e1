"""The FastAPI app factory: the routers, errors in OpenAI's shape, the middleware, the model's lifecycle.

    from inferno.serve import ServeConfig, create_app
    app = create_app(ServeConfig(model_dir="gpt2", slots=8))     # then: uvicorn.run(app)

Routes (`inferno.serve.routes`): ``POST /v1/completions``, ``POST /v1/chat/completions``,
``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health``, ``POST /tokenize``, ``POST /detokenize``,
``GET /tokenizer_info``, ``POST /v1/inspect``, ``GET /metrics`` and ``GET /openapi.json`` (no ``/docs``:
Swagger UI would load its files from a CDN, blank offline); ``GET /`` and ``/static/*`` are the
playground, which need no API key.
The model loads in the background (`inferno.serve.state`); a client that disconnects while queued or
generating is cancelled, which frees its KV slot before the next step.

Errors are ``{"error": {"message", "type", "param", "code"}}``: 400 for anything wrong with a request
(invalid JSON, NaN, wrong types, an unknown field, out-of-range values, token ids outside the
vocabulary, prompts longer than the context), 401 (API key), 403 (a page from an origin not allowed),
404 (a route, or a model this server does not serve: ``model_not_found``), 405, 413 (body over 1 MiB),
415 (a body that is not ``application/json``), 429 with Retry-After (the engine's wait queue is full),
503 (loading, shutting down). An error after a stream started is an SSE event
``data: {"error": ...}`` followed by ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from inferno import __version__
from inferno.api import Pipeline
from inferno.serve.bodies import validation_message
from inferno.serve.config import ServeConfig, api_key_problem
from inferno.serve.errors import ApiError
from inferno.serve.middleware import (
    AccessLog,
    ApiKey,
    BodyLimit,
    HeadAsGet,
    JsonBodies,
    OriginCheck,
    QuietDisconnects,
    ShutdownGuard,
)
from inferno.serve.routes import ROUTERS
from inferno.serve.routes.playground import mount_static
from inferno.serve.state import ServerState

logger = logging.getLogger("inferno.serve")


def create_app(config: ServeConfig | None = None, *, pipeline: Pipeline | None = None) -> FastAPI:
    """The server's ASGI app. `pipeline`: serve this loaded pipeline instead of loading `config.model_dir`."""
    config = config or ServeConfig()
    if config.api_key is not None and api_key_problem(config.api_key):
        raise ValueError(f"api_key: {api_key_problem(config.api_key)}")  # "" would turn the key off
    state = ServerState(config, pipeline)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.loop = asyncio.get_running_loop()
        state.start()
        try:
            yield
        finally:
            state.close()

    # No /docs or /redoc: their pages load Swagger UI / ReDoc from a CDN (blank offline); the document
    # itself is /openapi.json.
    app = FastAPI(title="inferno", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="OpenAI-compatible completions and chat completions from GPT-2 on the CPU "
                  "(continuous batching).")
    app.state.inferno = state
    _error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    mount_static(app)
    _clean_openapi(app)
    # Each add_middleware wraps the ones before: the last added sees a request first.
    app.add_middleware(HeadAsGet)
    app.add_middleware(BodyLimit, limit=config.max_body_bytes, timeout=config.body_timeout)
    app.add_middleware(JsonBodies)
    if config.api_key is not None:
        app.add_middleware(ApiKey, key=config.api_key)
    if config.allowed_origins:  # CORS outside the key: a preflight carries no Authorization
        app.add_middleware(CORSMiddleware, allow_origins=list(config.allowed_origins),
                           allow_methods=["GET", "POST"], allow_headers=["Authorization", "Content-Type"],
                           expose_headers=["Retry-After"], max_age=600)
    app.add_middleware(OriginCheck, allowed=config.allowed_origins)
    app.add_middleware(ShutdownGuard, grace_over=lambda: state.grace_over)
    # Metric labels: the known routes only, so that labels stay few.
    paths = [route.path for router in ROUTERS for route in router.routes]
    app.add_middleware(AccessLog, logger=logger, log_prompts=config.log_prompts,
                       on_request=state.metrics.request, paths=paths)
    # Innermost of Starlette's own ServerErrorMiddleware, which would log a request its client left as an
    # internal error (Ray Serve cancels it).
    app.add_middleware(QuietDisconnects)
    return app


def _response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def _error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's shape; a validation error is a 400 (not FastAPI's 422)."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _response(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(exc)
        return _response(ApiError(400, message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        param = getattr(exc, "param", None)  # a BodyError names the field
        return _response(ApiError(exc.status_code, detail, param=param, code=code, headers=exc.headers))

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("inferno serve: internal error on %s %s", request.method, request.url.path)
        return _response(ApiError(500, f"internal error: {type(exc).__name__}: {exc}"))


def _clean_openapi(app: FastAPI) -> None:
    """Drop FastAPI's default 422 responses from the document: every validation error here is a 400."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = generate()
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
