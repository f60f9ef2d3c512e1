"""Helpers of the server's tests: how a server subprocess is started, waited for and stopped, and how
Server-Sent Events are read. (A module of its own, not conftest.py: `from conftest import` would find
whichever conftest module pytest imported last.)"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx

#: How the tests start a server (the flags follow). Once `inferno serve` is wired into inferno/cli.py,
#: this can be ``[sys.executable, "-m", "inferno", "serve"]``.
SERVE = [sys.executable, "-m", "inferno", "serve"]

STARTUP_TIMEOUT = 60.0  # seconds for /health to answer 200 (imports + loading a tiny model: ~2 s)


def serve_command(*flags: str) -> list[str]:
    return [*SERVE, *flags]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(home: Path) -> dict[str, str]:
    # No network, no real Hugging Face cache, no backend chosen by the environment.
    env = dict(os.environ, INFERNO_OFFLINE="1", HF_HOME=str(home / "hf"), PYTHONUNBUFFERED="1")
    env.pop("INFERNO_BACKEND", None)
    env.pop("HF_HUB_CACHE", None)
    env.pop("INFERNO_API_KEY", None)  # a developer's own key would lock every test out
    return env


class Server:
    """A running server subprocess: its URL, its log (stdout and stderr), and how to stop it."""

    def __init__(self, proc: subprocess.Popen, url: str, log_path: Path) -> None:
        self.proc = proc
        self.url = url
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def rss_kib(self) -> int:
        """The server's resident memory (VmRSS), in KiB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS in /proc/PID/status")

    def health(self) -> httpx.Response:
        import httpx

        return httpx.get(self.url + "/health", timeout=5)

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(httpx.TransportError):
                if self.health().status_code == 200:
                    return
            time.sleep(0.05)
        raise AssertionError(f"/health did not answer 200 within {timeout} s:\n{self.log()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Send `sig` and wait for the exit (killing it after `timeout`); returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def launch(model_dir: Path, *flags: str, home: Path, wait: bool = True) -> Server:
    """Start a server on `model_dir` (numpy backend, a free port) and wait until it is ready."""
    port = free_port()
    log_path = home / f"server-{port}.log"
    command = serve_command("--model-dir", str(model_dir), "--backend", "numpy", "--port", str(port), *flags)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=server_env(home))
    server = Server(proc, f"http://127.0.0.1:{port}", log_path)
    if wait:
        try:
            server.wait_ready()
        except BaseException:
            server.stop(signal.SIGKILL)
            raise
    return server


@contextlib.contextmanager
def running(model_dir: Path, *flags: str, home: Path) -> Iterator[Server]:
    server = launch(model_dir, *flags, home=home)
    try:
        yield server
    finally:
        server.stop()


# ------------------------------------------------------------------------------------------------ SSE


def sse_data(lines: Iterator[str]) -> Iterator[str]:
    """The data of each Server-Sent Event, from a response's text lines (as `curl -N` shows them);
    checks the framing: every event is ``data: ...`` lines, then a blank line."""
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):  # a comment (sse-starlette's keep-alive ping)
            continue
        assert line.startswith("data: "), f"not an SSE data line: {line!r}"
        data.append(line[len("data: "):])
    assert not data, f"an event without its blank line at the end: {data}"


def stream_events(client: httpx.Client, url: str, body: dict, **kwargs) -> list[dict | str]:
    """POST a streaming completion and return its events: chunks as dicts, "[DONE]" as is."""
    with client.stream("POST", url + "/v1/completions", json=body, **kwargs) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        return [d if d == "[DONE]" else json.loads(d) for d in sse_data(r.iter_lines())]


async def astream(client: httpx.AsyncClient, body: dict, *, stop_after: int | None = None,
                  delay: float = 0.0) -> tuple[int, list, dict]:
    """POST a streaming completion with an httpx.AsyncClient: (status, events, headers). Events are chunk
    dicts and "[DONE]"; `stop_after` N events, disconnect; `delay`: sleep before reading each event."""
    import asyncio

    events: list = []
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return r.status_code, [r.json()], dict(r.headers)
        data: list[str] = []
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                data.append(line[len("data: "):])
            elif line == "" and data:
                if delay:
                    await asyncio.sleep(delay)
                text = "\n".join(data)
                data = []
                events.append(text if text == "[DONE]" else json.loads(text))
                if stop_after is not None and len(events) >= stop_after:
                    break
        return r.status_code, events, dict(r.headers)


def finished(events: list) -> dict[int, str]:
    """Each choice's finish reason in a stream's events (a complete stream ends with [DONE])."""
    out = {}
    for e in events:
        if isinstance(e, dict) and e.get("choices") and e["choices"][0].get("finish_reason"):
            out[e["choices"][0]["index"]] = e["choices"][0]["finish_reason"]
    return out
