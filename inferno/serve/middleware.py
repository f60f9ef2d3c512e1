"""Pure ASGI middleware: the access log (outermost), the API key, the body size limit and read timeout,
HEAD as GET.

Pure ASGI rather than Starlette's BaseHTTPMiddleware, which would buffer or wrap streaming responses and
hide the client's disconnect from the route.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from inferno.serve.errors import ApiError, send_error

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
        except BaseException:
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


class ApiKey:
    """With a key, every route but the public ones needs ``Authorization: Bearer KEY`` (else 401).
    Without one, this middleware is not installed: any Authorization header is ignored."""

    PUBLIC = frozenset({"/", "/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
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
