"""uvicorn's HTTP/1.1 protocol (h11) with what it lacks against slow clients: a deadline for a request's
headers, and a cap on open connections.

uvicorn times out only idle keep-alive connections, and its timer is reset by every byte, so a client
that sends one header byte a second (or nothing at all after connecting) holds its socket for ever; its
``limit_concurrency`` answers 503 only once a request's headers are complete. No ASGI app can do better:
it is called once the headers are in. So this subclass arms a timer when a connection opens and when
the first byte of each later request arrives, disarms it when h11 has parsed the request's headers,
and otherwise answers 408 and closes; and it closes a connection beyond the cap at once with a 503.
(The body's deadline is the app's, `inferno.serve.middleware.BodyLimit`, so that it holds under any
ASGI server.)
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger("inferno.serve")

#: At most one "connection refused" warning per this many seconds (a flood must not flood the log).
_WARN_EVERY = 10.0


def _raw_response(status: int, reason: str, message: str, code: str, extra: str = "") -> bytes:
    """A whole response, written before h11 has a request to answer (it cannot send one then)."""
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error" if status < 500 else
                                 "service_unavailable", "param": None, "code": code}}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"connection: close\r\n{extra}\r\n")
    return head.encode("latin-1") + body


class GuardedH11Protocol(H11Protocol):
    """H11Protocol with `header_timeout` (seconds, or None) and `max_connections` (or None); see
    `guarded_protocol`, which sets them."""

    header_timeout: float | None = None
    max_connections: int | None = None
    _last_warning = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        cap = self.max_connections
        if cap is not None and len(self.connections) > cap:
            self._warn(f"inferno serve: {len(self.connections) - 1} connections are open (--max-connections "
                       f"{cap}); refusing more")
            self._refuse(_raw_response(503, "Service Unavailable", f"the server has {cap} connections open "
                                       "(--max-connections); retry shortly", "too_many_connections",
                                       "retry-after: 1\r\n"))
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the first byte of a request after the previous response
        super().data_received(data)
        if self._header_timer is not None and self.conn.their_state is not h11.IDLE:
            self._disarm()  # h11 has the request line and headers

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self.header_timeout is not None:
            self._disarm()
            self._header_timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self._refuse(_raw_response(408, "Request Timeout", f"the request headers did not arrive within "
                                       f"{self.header_timeout:g} s (--timeout-headers)", "request_timeout"))

    def _refuse(self, response: bytes) -> None:
        self.transport.write(response)
        try:
            self.conn.send(h11.ConnectionClosed())
        except h11.LocalProtocolError:
            pass
        self.transport.close()

    @classmethod
    def _warn(cls, message: str) -> None:
        now = time.monotonic()
        if now - GuardedH11Protocol._last_warning >= _WARN_EVERY:
            GuardedH11Protocol._last_warning = now
            logger.warning(message)


def guarded_protocol(header_timeout: float | None, max_connections: int | None) -> type[H11Protocol]:
    """The protocol class to give ``uvicorn.Config(http=...)``."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,),
                {"header_timeout": header_timeout, "max_connections": max_connections})
