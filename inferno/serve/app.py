"""The FastAPI app: routes, errors in OpenAI's shape, the model's lifecycle.

    from inferno.serve import ServeConfig, create_app
    app = create_app(ServeConfig(model_dir="gpt2", slots=8))     # then: uvicorn.run(app)

Routes: ``POST /v1/completions``, ``GET /v1/models``, ``GET /health``, ``POST /tokenize``,
``POST /detokenize``, ``GET /tokenizer_info``, ``GET /metrics`` (and ``/openapi.json``, ``/docs``).
``GET /`` is the playground (inferno/serve/static: plain HTML, CSS and JavaScript, no build step, no
CDN), which calls ``/v1/completions`` from the browser; it and ``/static/*`` need no API key.

The model loads in a background thread once the app starts (``/health`` answers 503 until it is
ready). Every request goes to one continuous-batching `Engine`; a client that disconnects while queued
or generating is cancelled, which frees its KV slot before the next step. `ServerState.begin_shutdown`
(on SIGTERM) refuses new requests (503) and, after the grace period, ends the running ones with
finish_reason "cancelled".

Errors are ``{"error": {"message", "type", "param", "code"}}``: 400 for anything wrong with a request
(invalid JSON, NaN, wrong types, out-of-range values, token ids outside the vocabulary, prompts longer
than the context), 401 (API key), 404/405, 413 (body over 1 MiB), 429 with Retry-After (the engine's
wait queue is full), 503 (loading, shutting down). An error after a stream started is an SSE event
``data: {"error": ...}`` followed by ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import threading
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from sse_starlette.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from inferno import __version__
from inferno.api import Pipeline
from inferno.engine import Engine, EngineClosedError, EngineError, Handle, QueueFullError
from inferno.generate import GenerationError
from inferno.options import OptionError
from inferno.serve.completions import (
    Completion,
    EchoPart,
    Plan,
    TokenTexts,
    echo_part,
    encode_prompts,
    plan_request,
)
from inferno.serve.config import ServeConfig
from inferno.serve.errors import ApiError
from inferno.serve.metrics import Metrics
from inferno.serve.middleware import LOG_KEY, AccessLog, ApiKey, BodyLimit
from inferno.serve.schemas import (
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorResponse,
    Health,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
    TokenizerInfo,
)

logger = logging.getLogger("inferno.serve")

ROUTES = ("/v1/completions", "/v1/models", "/health", "/tokenize", "/detokenize", "/tokenizer_info",
          "/metrics", "/")

#: The playground's files (package data), served at / and /static/.
STATIC_DIR = Path(__file__).parent / "static"


class ServerState:
    """The model, its engine and the requests in flight, shared by the routes of one app."""

    def __init__(self, config: ServeConfig, pipeline: Pipeline | None = None) -> None:
        self.config = config
        self.pipe: Pipeline | None = None
        self.engine: Engine | None = None
        self.texts: TokenTexts | None = None
        self.status = "loading"  # then "ok" or "failed"
        self.load_error: str | None = None
        self.draining = False
        self.started = int(time.time())
        self.metrics = Metrics(lambda: self.engine)
        self.loop: asyncio.AbstractEventLoop | None = None
        #: Called (on the event loop) when the model fails to load: the CLI stops the server.
        self.on_fatal: Callable[[], None] | None = None
        self._pipeline = pipeline
        self._completions: set[Completion] = set()
        # Scoring (echo) runs in worker threads besides the engine's; one at a time bounds its memory.
        self._score_lock = threading.Lock()

    # ------------------------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Load the model (a given pipeline at once, else in a background thread)."""
        if self._pipeline is not None:
            self._ready(self._pipeline, 0.0)
            return
        threading.Thread(target=self._load, name="inferno-serve-load", daemon=True).start()

    def _load(self) -> None:
        import inferno

        start = time.perf_counter()
        try:
            pipe = inferno.load(self.config.model_dir, self.config.backend, download=self.config.download)
            self._ready(pipe, time.perf_counter() - start)
        except Exception as exc:  # the message of our loaders' errors names the file, key or flag
            self.load_error = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or \
                type(exc).__name__
            self.status = "failed"
            logger.error("inferno serve: error: %s", self.load_error)
            if self.on_fatal is not None and self.loop is not None:
                self.loop.call_soon_threadsafe(self.on_fatal)

    def _ready(self, pipe: Pipeline, seconds: float) -> None:
        c = self.config
        self.engine = pipe.engine(slots=c.slots, max_queue=c.queue, prefill_chunk=c.prefill_chunk)
        self.texts = TokenTexts(pipe.tokenizer)
        self.pipe = pipe
        self.status = "ok"  # last: routes check it before using the rest
        logger.info("inferno serve: model %s ready (%s backend, %d layers, context %d; %d slots) in %.1fs",
                    c.model_id, pipe.backend.name, pipe.config.n_layer, pipe.config.n_positions, c.slots,
                    seconds)

    def begin_shutdown(self) -> None:
        """Refuse new requests from now on; end the running ones after the grace period. Safe to call
        from a signal handler."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        if self.draining:
            return
        self.draining = True
        if self._completions:
            logger.info("inferno serve: shutting down; %d requests may finish within %gs",
                        len(self._completions), self.config.grace_seconds)
        assert self.loop is not None
        self.loop.call_later(self.config.grace_seconds, self._cancel_all)

    def _cancel_all(self) -> None:
        for completion in list(self._completions):
            completion.cancel()

    def close(self) -> None:
        self._cancel_all()
        if self.engine is not None:
            self.engine.close()

    # -------------------------------------------------------------------------------------- requests
    def require(self, *, draining_ok: bool = False) -> Pipeline:
        """The pipeline, or 503 while loading (or shutting down)."""
        if self.status == "loading":
            raise ApiError(503, "the model is still loading; retry shortly", headers={"Retry-After": "1"})
        if self.status == "failed":
            raise ApiError(503, f"the model failed to load: {self.load_error}")
        if self.draining and not draining_ok:
            raise ApiError(503, "the server is shutting down")
        assert self.pipe is not None
        return self.pipe

    def echoes(self, plan: Plan) -> list[EchoPart]:
        """The echoed prompts (worker thread): text, and logprobs scored by `Pipeline.score`."""
        pipe, out = self.pipe, []
        assert pipe is not None and self.texts is not None
        for ids in plan.ids:
            score = None
            if plan.logprobs is not None and len(ids) >= 2:  # a single token has nothing to score
                with self._score_lock:
                    score = pipe.score(ids, top_logprobs=plan.logprobs)
            out.append(echo_part(ids, pipe.tokenizer, self.texts, score, plan.logprobs, plan.return_ids))
        return out

    def submit(self, plan: Plan) -> list[Handle]:
        """Every prompt's n choices into the engine (each prompt's share its prefill); all or none."""
        assert self.engine is not None
        handles: list[Handle] = []
        try:
            for ids in plan.ids:
                handles += self.engine.submit_many(ids, plan.max_tokens, plan.options, stop_ids=plan.stop_ids)
        except BaseException as exc:
            for h in handles:
                h.cancel()
            if isinstance(exc, QueueFullError):
                raise ApiError(429, str(exc), code="queue_full", headers={"Retry-After": "1"}) from None
            if isinstance(exc, EngineClosedError):
                raise ApiError(503, "the server is shutting down") from None
            if isinstance(exc, (GenerationError, OptionError, EngineError)):
                raise ApiError(400, str(exc)) from None
            raise
        return handles

    def track(self, completion: Completion) -> None:
        self._completions.add(completion)

    def untrack(self, completion: Completion) -> None:
        self._completions.discard(completion)


# ---------------------------------------------------------------------------------------- JSON bodies


class _StrictJsonRequest(Request):
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


class _JsonRoute(APIRoute):
    """Reads bodies with `_StrictJsonRequest`; a body without a Content-Type is taken as JSON."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            scope = request.scope
            if not any(k == b"content-type" for k, _ in scope.get("headers", ())):
                scope["headers"] = [*scope.get("headers", ()), (b"content-type", b"application/json")]
            return await handler(_StrictJsonRequest(scope, request.receive))

        return route


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
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


def _error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "A bad request (the message says what, param where)"},
    401: {"model": ErrorResponse, "description": "--api-key is set and the bearer token is not it"},
    413: {"model": ErrorResponse, "description": "The body is larger than 1 MiB"},
    503: {"model": ErrorResponse, "description": "The model is loading, or the server is shutting down"},
}


#: One event of a completion stream (before OpenAPI 3.2's itemSchema, `schema` describes each event):
#: its data is a chunk (a CompletionResponse with one choice, or none and the usage), an error, or [DONE].
_SSE_EVENT = {
    "type": "object", "required": ["data"],
    "properties": {"event": {"type": "string"}, "data": {"anyOf": [
        {"const": "[DONE]"},
        {"type": "string", "contentMediaType": "application/json",
         "contentSchema": {"anyOf": [{"$ref": "#/components/schemas/CompletionResponse"},
                                     {"$ref": "#/components/schemas/ErrorResponse"}]}}]}},
}


def _streaming_kwargs(grace_seconds: float) -> dict[str, Any]:
    # sse-starlette >= 3 ends streams itself on shutdown after shutdown_grace_period; give ours time to
    # end them first, with a finish reason. (Older versions end them at once.)
    params = inspect.signature(EventSourceResponse.__init__).parameters
    out: dict[str, Any] = {"sep": "\n"}
    if "shutdown_grace_period" in params:
        out["shutdown_grace_period"] = grace_seconds + 2.0
    return out


class _Stream(EventSourceResponse):
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


async def _disconnected(request: Request) -> None:
    """Return when the client has gone (the body is read: the next message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


# ---------------------------------------------------------------------------------------------- the app


def create_app(config: ServeConfig | None = None, *, pipeline: Pipeline | None = None) -> FastAPI:
    """The server's ASGI app. `pipeline`: serve this loaded pipeline instead of loading `config.model_dir`."""
    config = config or ServeConfig()
    state = ServerState(config, pipeline)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.loop = asyncio.get_running_loop()
        state.start()
        try:
            yield
        finally:
            state.close()

    app = FastAPI(title="inferno", version=__version__, lifespan=lifespan,
                  description="OpenAI-compatible completions from GPT-2 on the CPU (continuous batching).")
    app.router.route_class = _JsonRoute
    app.state.inferno = state
    stream_kwargs = _streaming_kwargs(config.grace_seconds)

    # ------------------------------------------------------------------------------------- errors
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return _error_response(ApiError(400, message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return _error_response(ApiError(exc.status_code, detail, code=code, headers=exc.headers))

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("inferno serve: internal error on %s %s", request.method, request.url.path)
        return _error_response(ApiError(500, f"internal error: {type(exc).__name__}: {exc}"))

    # ------------------------------------------------------------------------------------- routes
    @app.post("/v1/completions", response_model=CompletionResponse, responses={
        200: {"content": {"text/event-stream": {"schema": _SSE_EVENT}},
              "description": "A completion; with stream, Server-Sent Events: data: {chunk} ... data: [DONE]"},
        **_ERRORS,
        429: {"model": ErrorResponse, "description": "The engine's wait queue is full; see Retry-After"}})
    async def completions(body: CompletionRequest, request: Request) -> Response:
        """OpenAI's legacy completions (see `inferno.serve.completions` for the conventions)."""
        started = time.perf_counter()
        pipe = state.require()
        engine = state.engine
        assert engine is not None and state.texts is not None
        info = request.scope.setdefault(LOG_KEY, {})
        if config.log_prompts:
            info["prompt"] = body.prompt
        eos = pipe.config.eos_token_id
        plan = plan_request(body, eos_id=eos, sample_limit=pipe.sample_limit, slots=engine.slots.n_slots,
                            queue=config.queue)
        await run_in_threadpool(encode_prompts, plan, pipe.tokenizer, eos_id=eos,
                                sample_limit=pipe.sample_limit, context=pipe.config.n_positions)
        echoes = await run_in_threadpool(state.echoes, plan) if plan.echo else None
        handles = state.submit(plan)
        completion = Completion(plan, handles, echoes, state.texts, config.model_id, state.metrics, started)
        state.track(completion)
        state.metrics.prompt_tokens.inc(completion.prompt_tokens)
        info["prompt_tokens"] = completion.prompt_tokens

        def done() -> None:
            completion.cancel()
            state.untrack(completion)
            info["completion_tokens"] = completion.completion_tokens
            info["finish_reasons"] = ",".join(sorted({c.finish_reason or "-" for c in completion.choices}))

        if plan.stream:
            async def events():
                async for data in completion.stream():
                    yield {"data": data}

            return _Stream(events(), done, **stream_kwargs)

        collect = asyncio.ensure_future(completion.collect())
        gone = asyncio.ensure_future(_disconnected(request))
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

    @app.get("/v1/models", response_model=ModelList, responses={503: _ERRORS[503]})
    async def models() -> dict:
        """The one model: its id is --served-model-name, else the --model-dir folder's name, else "gpt2"."""
        pipe = state.require(draining_ok=True)
        card = {"id": config.model_id, "object": "model", "created": state.started, "owned_by": "inferno",
                "max_model_len": pipe.config.n_positions}
        return {"object": "list", "data": [card]}

    @app.get("/health", response_model=Health, responses={503: {"model": Health, "description": "Not ready"}})
    async def health() -> JSONResponse:
        """200 when the model is loaded and requests are taken; 503 while loading or shutting down."""
        status = "shutting_down" if state.draining else state.status
        out: dict[str, Any] = {"status": status, "model": config.model_id}
        e = state.engine
        if e is not None:
            out.update(slots_total=e.slots.n_slots, slots_free=e.free_slots, requests_running=e.running,
                       requests_waiting=e.waiting)
        if state.load_error:
            out["error"] = state.load_error
        return JSONResponse(out, status_code=200 if status == "ok" else 503)

    @app.post("/tokenize", response_model=TokenizeResponse, responses=_ERRORS)
    async def tokenize(body: TokenizeRequest) -> dict:
        """Text (``content``, or ``prompt``) to token ids; <|endoftext|> is id 50256 unless parse_special
        is false."""
        pipe = state.require(draining_ok=True)
        text = body.content if body.content is not None else body.prompt
        if text is None:
            raise ApiError(400, "send the text to tokenize as content (or prompt)", param="content")
        ids = await run_in_threadpool(pipe.tokenizer.encode, text, body.parse_special is not False)
        return {"tokens": ids, "count": len(ids), "max_model_len": pipe.config.n_positions}

    @app.post("/detokenize", response_model=DetokenizeResponse, responses=_ERRORS)
    async def detokenize(body: DetokenizeRequest) -> dict:
        """Token ids to text (``content``, and the same as ``prompt``)."""
        pipe = state.require(draining_ok=True)
        limit = pipe.tokenizer.vocab_size
        bad = next((i for i in body.tokens if i >= limit), None)
        if bad is not None:
            raise ApiError(400, f"token id {bad} is outside the vocabulary [0, {limit})", param="tokens")
        try:
            text = pipe.tokenizer.decode(body.tokens)
        except ValueError as exc:  # an id no token uses
            raise ApiError(400, str(exc), param="tokens") from None
        return {"content": text, "prompt": text}

    @app.get("/tokenizer_info", response_model=TokenizerInfo, responses={503: _ERRORS[503]})
    async def tokenizer_info() -> dict:
        pipe = state.require(draining_ok=True)
        tok, eos = pipe.tokenizer, pipe.config.eos_token_id
        special = tok.special_tokens
        names = {i: t for t, i in special.items()}
        return {"model": config.model_id, "tokenizer": "GPT-2 byte-level BPE",
                "eos_token": names.get(eos, ""), "eos_token_id": eos, "vocab_size": tok.vocab_size,
                "max_model_len": pipe.config.n_positions, "special_tokens": special}

    @app.get("/metrics", response_class=Response,
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                              "description": "Prometheus text format"}})
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=state.metrics.content_type)

    @app.get("/", include_in_schema=False)
    async def playground() -> FileResponse:
        """The playground page (no API key needed; it asks for one when the API answers 401)."""
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    _clean_openapi(app)
    app.add_middleware(BodyLimit, limit=config.max_body_bytes)
    if config.api_key:
        app.add_middleware(ApiKey, key=config.api_key)
    app.add_middleware(AccessLog, logger=logger, log_prompts=config.log_prompts,
                       on_request=state.metrics.request, paths=ROUTES)
    return app


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
