"""Work stops when the client leaves (issue 39): an abandoned inspection stops before its next block, an
abandoned echo with logprobs is cancelled in the engine before its prompts are all scored, and the
access log says "disconnected". The app runs in process under uvicorn on 127.0.0.1, so that the test can
drop a real connection and watch the server's own counters."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from goldens import write_model_dir  # tests/ is on sys.path (tests/conftest.py)
from serve_helpers import free_port

import inferno
from inferno.serve import ServeConfig, create_app
from inferno.testing import random_state_dict, small_config

BOUND = 10.0  # seconds for the work to stop after the client has gone


@pytest.fixture(scope="module")
def deep_pipe(tmp_path_factory):
    """Tiny and eight blocks deep: an inspection has eight places to stop."""
    config = small_config(vocab_size=50257, n_positions=64, n_embd=16, n_layer=8, n_head=2)
    folder = write_model_dir(tmp_path_factory.mktemp("deep"), config, random_state_dict(config, 5))
    return inferno.load(folder, "numpy", download=False)


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def server(deep_pipe) -> Iterator[tuple[str, object, Lines]]:
    app = create_app(ServeConfig(model_id="deep"), pipeline=deep_pipe)
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    log, logger = Lines(), logging.getLogger("inferno.serve")
    logger.addHandler(log)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.02)
    try:
        yield f"127.0.0.1:{port}", app, log
    finally:
        srv.should_exit = True
        thread.join(30)
        logger.removeHandler(log)
        logger.setLevel(old_level)


def post_and_leave(address: str, path: str, body: dict, started) -> None:
    """Send a POST, wait until `started()` says the work began, then close the connection unanswered."""
    host, port = address.split(":")
    data = json.dumps(body).encode()
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        deadline = time.monotonic() + 30
        while not started():
            assert time.monotonic() < deadline, "the work never started"
            time.sleep(0.005)


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_an_abandoned_inspection_stops_before_its_next_block(server, deep_pipe, monkeypatch):
    address, app, log = server
    calls = []
    real = deep_pipe.model.block

    def slow_block(*args, **kwargs):  # each block takes a while, so the client leaves mid-way
        calls.append(time.monotonic())
        time.sleep(0.2)
        return real(*args, **kwargs)

    monkeypatch.setattr(deep_pipe.model, "block", slow_block)
    post_and_leave(address, "/v1/inspect", {"prompt": "a b c"}, lambda: len(calls) >= 1)
    left = len(calls)
    serving = app.state.inferno_ServingInspect
    wait_for(lambda: serving.running == 0, "the inspection kept its place")
    time.sleep(0.5)
    assert len(calls) <= left + 1 < deep_pipe.config.n_layer, calls  # at most the block it was in
    wait_for(lambda: any('"POST /v1/inspect"' in line for line in log.lines), "no access log line")
    line = next(line for line in log.lines if '"POST /v1/inspect"' in line)
    assert "disconnected" in line and " 200 " not in line, line


def test_an_abandoned_echo_is_cancelled_in_the_engine_before_its_prompts_are_all_scored(server, deep_pipe,
                                                                                         monkeypatch):
    # An echo's prompts are scored by the engine as it prefills them (a 64-token chunk a step): a client
    # that leaves cancels its choices like any others, and the prompts not yet prefilled never are.
    address, app, log = server
    steps = []
    real = deep_pipe.model.forward_ragged

    def slow_step(*args, **kwargs):
        steps.append(time.monotonic())
        time.sleep(0.2)
        return real(*args, **kwargs)

    monkeypatch.setattr(deep_pipe.model, "forward_ragged", slow_step)
    prompts = [f"prompt number {k}: " + "the cat sat on the mat " * 4 for k in range(20)]
    total = sum(len(deep_pipe.tokenizer.encode(p)) for p in prompts)
    body = {"prompt": prompts, "echo": True, "logprobs": 1, "max_tokens": 1}
    post_and_leave(address, "/v1/completions", body, lambda: len(steps) >= 1)
    engine = app.state.inferno.engine
    wait_for(lambda: engine.running == 0 and engine.waiting == 0, "the echo kept its slots")
    wait_for(lambda: any('"POST /v1/completions"' in line for line in log.lines), "no access log line")
    assert engine.stats.prompt_tokens < total / 2, (engine.stats.prompt_tokens, total)
    line = next(line for line in log.lines if '"POST /v1/completions"' in line)
    assert "disconnected" in line and " 200 " not in line, line
