"""Pure ASGI middleware, outermost first: quiet disconnects, the access log, the shutdown guard (503
once the grace period is over), the Origin check (and CORS, Starlette's, when origins are allowed), the
API key, JSON bodies only (415), the body size limit and read timeout, HEAD as GET.

Pure ASGI rather than Starlette's BaseHTTPMiddleware, which would buffer or wrap streaming responses and
hide the client's disconnect from the route.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from typing import Any

from inferno.serve.errors import ApiError, send_error

logger = logging.getLogger("inferno.serve")

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Where a route leaves what the access log should say (tokens, prompt): ``scope[LOG_KEY]``, a dict.
LOG_KEY = "inferno.log"

#: How the access log shows a prompt with --log-prompts (JSON, cut to this many characters).
MAX_LOGGED_PROMPT = 2000


class AccessLog:
    """One line per request on the ``inferno.serve`` logger: client, method and path, status, tokens,
    seconds; the prompt only with `log_prompts`. Also counts requests in the metrics.

    A client that leaves before its response is complete is logged as ``disconnected``.
    """

    def __init__(self, app: App, logger: logging.Logger, *, log_prompts: bool = False,
                 on_request: Callable[[str, int, float], None] | None = None,
                 paths: Iterable[str] = ()) -> None:
        self.app = app
        self.logger = logger
        self.log_prompts = log_prompts
        self.on_request = on_request
        self.paths = frozenset(paths)  # metric labels: known routes only, so labels stay few

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        info: dict[str, Any] = {}
        scope[LOG_KEY] = info
        status = 0
        complete = False

        async def send_logged(message: Message) -> None:
            nonlocal status, complete
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                complete = True
            await send(message)

        try:
            await self.app(scope, receive, send_logged)
        except BaseException as exc:
            if client_gone(exc):
                info["disconnected"] = True
            else:
                status = status or 500
            raise
        finally:
            seconds = time.perf_counter() - start
            self._log(scope, status, complete, info, seconds)
            if self.on_request is not None:
                path = scope.get("path", "")
                self.on_request(path if path in self.paths else "other", status, seconds)

    def _log(self, scope: Scope, status: int, complete: bool, info: dict, seconds: float) -> None:
        client = scope.get("client")
        who = f"{client[0]}:{client[1]}" if client else "-"
        parts = [who, f'"{scope.get("method", "")} {scope.get("path", "")}"', str(status or "-")]
        if not complete or info.get("disconnected"):
            parts.append("disconnected")
        for key in ("prompt_tokens", "completion_tokens", "finish_reasons"):
            if key in info:
                parts.append(f"{key}={info[key]}")
        parts.append(f"{seconds:.3f}s")
        if self.log_prompts and "prompt" in info:
            prompt = json.dumps(info["prompt"])
            if len(prompt) > MAX_LOGGED_PROMPT:
                prompt = prompt[:MAX_LOGGED_PROMPT] + "..."
            parts.append(f"prompt={prompt}")
        self.logger.info(" ".join(parts))


#: What Ray Serve raises in a request whose client left (`ray.serve.exceptions.RequestCancelledError`,
#: `ray.exceptions.TaskCancelledError`): named, as Ray is not imported here.
_CANCELLED_NAMES = frozenset({"RequestCancelledError", "TaskCancelledError", "ClientDisconnect"})


def client_gone(exc: BaseException) -> bool:
    """Whether `exc` only says the client left: the request's task cancelled (Ray Serve cancels it when
    its client disconnects), Starlette's ClientDisconnect, a broken connection, or a group of those."""
    group = getattr(exc, "exceptions", None)  # an ExceptionGroup (anyio's task groups raise them)
    if isinstance(group, (list, tuple)) and group:
        return all(isinstance(e, BaseException) and client_gone(e) for e in group)
    if isinstance(exc, (asyncio.CancelledError, ConnectionError)):
        return True
    return any(cls.__name__ in _CANCELLED_NAMES for cls in type(exc).__mro__)


class QuietDisconnects:
    """Outermost: a request that ends because its client left ends quietly (the access log inside says
    "disconnected"), not as an error with a traceback from the server around the app (Ray Serve cancels
    a request whose client disconnects, and logs what the app raises)."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        except BaseException as exc:
            if scope["type"] != "http" or not client_gone(exc):
                raise


class ApiKey:
    """With a key, every route but the public ones needs ``Authorization: Bearer KEY`` (else 401).
    Without one, this middleware is not installed: any Authorization header is ignored."""

    PUBLIC = frozenset({"/", "/health", "/openapi.json"})
    PUBLIC_PREFIXES = ("/static/",)  # the playground's files

    def __init__(self, app: App, key: str) -> None:
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in self.PUBLIC or path.startswith(self.PUBLIC_PREFIXES):
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), b"")
        scheme, _, token = header.partition(b" ")
        # compare_digest: the time taken says nothing about how much of the key matched.
        if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.key):
            message = "Incorrect API key provided" if header else "Missing API key (Authorization: Bearer)"
            await send_error(send, ApiError(401, message, code="invalid_api_key",
                                            headers={"WWW-Authenticate": "Bearer"}))
            return
        await self.app(scope, receive, send)


class BodyLimit:
    """Refuse bodies over `limit` bytes with 413: by Content-Length before reading, and by counting
    while reading (a chunked body has none); and bodies not complete within `timeout` seconds of the
    headers with 408 (a slow client holds a connection and its buffer). The body is read here, whole,
    and replayed to the app; after it, `receive` is the server's again, so routes still see the client's
    disconnect."""

    def __init__(self, app: App, limit: int, timeout: float | None = None) -> None:
        self.app = app
        self.limit = limit
        self.timeout = timeout

    def _too_large(self) -> ApiError:
        return ApiError(413, f"the request body is larger than {self.limit} bytes", code="request_too_large")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = next((v for k, v in scope.get("headers", ()) if k == b"content-length"), None)
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                await send_error(send, ApiError(400, "the Content-Length header is not a number"))
                return
            if declared > self.limit:
                await send_error(send, self._too_large())
                return
        try:
            body = await asyncio.wait_for(self._read(receive), self.timeout)
        except ApiError as error:
            await send_error(send, error)
            return
        except asyncio.TimeoutError:
            # "connection: close": the rest of the body may still come; it is not read.
            await send_error(send, ApiError(408, f"the request body did not arrive within {self.timeout:g} s "
                                            "(--timeout-body)", code="request_timeout",
                                            headers={"Connection": "close"}))
            return
        if body is None:  # gone before the body was complete
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read(self, receive: Receive) -> bytes | None:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            body = message.get("body", b"")
            size += len(body)
            if size > self.limit:
                raise self._too_large()
            chunks.append(body)
            if not message.get("more_body", False):
                return b"".join(chunks)


class HeadAsGet:
    """``HEAD`` of a route answers as its ``GET`` without the body (load balancers probe with HEAD):
    the app sees a GET; the headers, Content-Length included, are the GET's."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "HEAD":
            await self.app(scope, receive, send)
            return

        async def send_headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        # A copy: the server keeps its own scope, which says HEAD, and sends no body for it.
        await self.app({**scope, "method": "GET"}, receive, send_headers_only)


def _header(scope: Scope, name: bytes) -> bytes | None:
    return next((v for k, v in scope.get("headers", ()) if k == name), None)


class JsonBodies:
    """A request with a body (POST, PUT, PATCH) must say ``Content-Type: application/json`` (parameters
    such as ``charset=utf-8`` allowed), else 415. A browser sends any other type (or none, with a
    Blob) from any page without asking the server first (no CORS preflight): refusing them is what
    keeps a page on another site from making a local server work."""

    METHODS = frozenset({"POST", "PUT", "PATCH"})

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in self.METHODS:
            await self.app(scope, receive, send)
            return
        kind = (_header(scope, b"content-type") or b"").split(b";")[0].strip().lower()
        if kind != b"application/json":
            said = f"Content-Type {kind.decode('latin-1')}" if kind else "no Content-Type"
            await send_error(send, ApiError(415, f"the request body must be JSON with Content-Type: "
                                            f"application/json (this one has {said})",
                                            code="unsupported_media_type"))
            return
        await self.app(scope, receive, send)


class OriginCheck:
    """A request that carries an ``Origin`` header (a browser's, from a page) is refused with 403 unless
    the page is the server's own (the origin's host is the request's Host: the playground) or its
    origin is allowed (``--allowed-origins``; ``*`` allows every one). Requests without one (curl, the
    SDKs) pass. Runs before CORS, so a preflight from an origin not allowed is a 403 too."""

    def __init__(self, app: App, allowed: Collection[str] = ()) -> None:
        self.app = app
        self.allowed = frozenset(allowed)

    def allows(self, origin: str, host: str | None) -> bool:
        if "*" in self.allowed or origin in self.allowed:
            return True
        # Same origin: the host (and port) the page came from is the one this request went to.
        _, sep, netloc = origin.partition("://")
        return bool(sep) and host is not None and netloc.lower() == host.lower()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        origin = _header(scope, b"origin") if scope["type"] == "http" else None
        if origin is not None:
            host = _header(scope, b"host")
            text = origin.decode("latin-1")
            if not self.allows(text, host.decode("latin-1") if host is not None else None):
                await send_error(send, ApiError(403, f"requests from the origin {text} are not allowed: "
                                                "start the server with --allowed-origins to let its "
                                                "pages call this API", code="origin_not_allowed"))
                return
        await self.app(scope, receive, send)


class ShutdownGuard:
    """Once a shutdown's grace period is over (`grace_over` set) and `settle` seconds more have passed
    (for the engine's own cancellations to be answered), a request that has not started its response
    (one waiting for a worker thread: an inspection) is answered 503 in OpenAI's
    shape and its route abandoned: the thread's result is dropped. A started response (a stream) ends
    as the engine ends it."""

    def __init__(self, app: App, grace_over: Callable[[], asyncio.Event], settle: float = 1.0) -> None:
        self.app = app
        self.grace_over = grace_over
        self.settle = settle

    async def _deadline(self) -> None:
        await self.grace_over().wait()
        await asyncio.sleep(self.settle)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = preempted = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            if preempted:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        task = asyncio.ensure_future(self.app(scope, receive, send_tracked))
        deadline = asyncio.ensure_future(self._deadline())
        read = False  # whether how the task ended has been read here (returned, or raised on)
        try:
            await asyncio.wait({task, deadline}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done() and not started:
                preempted = True
                task.cancel()
                await send_error(send, ApiError(503, "the server is shutting down: this request did not "
                                                "finish within the grace period", code="shutting_down"))
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
                read = True
                return
            try:
                await task
            except asyncio.CancelledError:
                raise  # ours (or the task's): what the task ended with is read below
            except BaseException:
                read = True
                raise
            read = True
        finally:
            deadline.cancel()
            if not task.done():  # we were cancelled ourselves
                task.cancel()
            if not read:
                # Read how the task ends when it does: cancelled ourselves as it failed (Ray Serve cancels
                # a request whose client left, and the route's receive() raises too), it would be logged
                # by asyncio as "Task exception was never retrieved", a traceback for a disconnect.
                task.add_done_callback(_read_outcome)


def _read_outcome(task: asyncio.Future) -> None:
    """A done callback: `task`'s exception read, and logged only if it is not a client leaving."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None and not client_gone(exc):
        logger.error("a request ended with an error after it was cancelled", exc_info=exc)
