"""Slow clients against a real `inferno serve` process (issue 29): a connection that never finishes its
headers or its body is answered 408 and closed within the deadlines (--timeout-headers,
--timeout-body), a keep-alive connection may still idle between requests, and connections beyond
--max-connections get 503 and are closed."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from serve_helpers import running


@pytest.fixture(scope="module")
def guarded(small_model_dir, tmp_path_factory):
    flags = ("--timeout-headers", "1", "--timeout-body", "1", "--max-connections", "40")
    with running(small_model_dir, *flags, home=tmp_path_factory.mktemp("slow")) as s:
        yield s


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    return s


def read_all(s: socket.socket, timeout: float) -> tuple[bytes, bool]:
    """What the server sends until it closes (True) or `timeout` passes (False)."""
    s.settimeout(timeout)
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
        return out, True
    except TimeoutError:
        return out, False
    except ConnectionResetError:
        return out, True


def test_unfinished_headers_and_bodies_are_timed_out(guarded):
    nothing = [connect(guarded.url) for _ in range(5)]
    headers = [connect(guarded.url) for _ in range(10)]
    bodies = [connect(guarded.url) for _ in range(5)]
    for s in headers:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-")
    for s in bodies:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"prompt\": ")
    start = time.monotonic()
    for s in nothing + headers:
        data, closed = read_all(s, 5)
        assert closed and data.startswith(b"HTTP/1.1 408 "), data
        assert b"--timeout-headers" in data
    for s in bodies:
        data, closed = read_all(s, 5)
        assert closed and data.startswith(b"HTTP/1.1 408 "), data
        assert b'"code": "request_timeout"' in data.replace(b'":"', b'": "') and b"--timeout-body" in data
    assert time.monotonic() - start < 4  # within the 1 s deadlines (and a loaded machine's slack)
    for s in nothing + headers + bodies:
        s.close()


def test_headers_sent_slowly_byte_by_byte_are_timed_out(guarded):
    s = connect(guarded.url)
    request = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100
    start = time.monotonic()
    try:
        for byte in request:
            s.sendall(bytes([byte]))
            time.sleep(0.05)
            if time.monotonic() - start > 3:
                break
    except (BrokenPipeError, ConnectionResetError):
        pass
    data, closed = read_all(s, 3)
    s.close()
    assert closed and data.startswith(b"HTTP/1.1 408 "), data


def test_a_keep_alive_connection_may_idle_between_requests(guarded):
    with httpx.Client(base_url=guarded.url, timeout=10) as c:
        assert c.get("/health").status_code == 200
        time.sleep(1.5)  # past --timeout-headers, within uvicorn's 5 s keep-alive
        assert c.post("/v1/completions", json={"prompt": "a", "max_tokens": 2}).status_code == 200


def test_connections_beyond_the_cap_get_503_and_are_closed(guarded):
    held = [connect(guarded.url) for _ in range(40)]
    try:
        time.sleep(0.2)
        extra = connect(guarded.url)
        data, closed = read_all(extra, 3)
        extra.close()
        assert closed and data.startswith(b"HTTP/1.1 503 "), data
        assert b"--max-connections" in data and b"retry-after: 1" in data.lower()
    finally:
        for s in held:
            s.close()
    time.sleep(0.3)
    assert httpx.get(guarded.url + "/health", timeout=10).status_code == 200  # the cap is free again
    assert "refusing more" in guarded.log()
