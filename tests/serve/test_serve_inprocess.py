"""The app in process (Starlette's TestClient): what a subprocess cannot show on cue: /health while the
model loads, a load failure, an engine failure in the middle of a stream, several apps in one process."""

from __future__ import annotations

import json
import threading
import time

import pytest
from backend_helpers import rows_holding_fail
from serve_helpers import sse_data
from starlette.testclient import TestClient

import inferno
from inferno.serve import ServeConfig, create_app


def test_health_is_503_while_the_model_loads(monkeypatch, small_model_dir):
    gate = threading.Event()
    real_load = inferno.load

    def slow_load(*args, **kwargs):
        assert gate.wait(30)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(inferno, "load", slow_load)
    app = create_app(ServeConfig(model_dir=str(small_model_dir), backend="numpy", download=False))
    with TestClient(app) as c:
        r = c.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "loading"
        r = c.post("/v1/completions", json={"prompt": "a"})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert "loading" in r.json()["error"]["message"]
        assert c.get("/metrics").status_code == 200  # no engine yet: the gauges read 0
        gate.set()
        deadline = time.monotonic() + 30
        while c.get("/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        r = c.post("/v1/completions", json={"prompt": "a", "max_tokens": 2})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_a_load_failure_is_reported(tmp_path):
    app = create_app(ServeConfig(model_dir=str(tmp_path), backend="numpy", download=False))
    with TestClient(app) as c:
        deadline = time.monotonic() + 30
        while (h := c.get("/health").json())["status"] == "loading":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert h["status"] == "failed" and h["error"]
        r = c.post("/v1/completions", json={"prompt": "a"})
        assert r.status_code == 503 and "failed to load" in r.json()["error"]["message"]


@pytest.fixture
def flaky_pipe(small_model_dir, monkeypatch):
    """A pipeline whose forward pass fails from its 4th call on, until `heal()`."""
    pipe = inferno.load(small_model_dir, "numpy", download=False)
    real = pipe.model.forward_ragged
    state = {"calls": 0, "broken": True}

    def forward_ragged(*args, **kwargs):
        state["calls"] += 1
        if state["broken"] and state["calls"] > 3:
            raise RuntimeError("the backend fell over")
        return real(*args, **kwargs)

    monkeypatch.setattr(pipe.model, "forward_ragged", forward_ragged)
    pipe.heal = lambda: state.update(broken=False)
    return pipe


def test_an_engine_failure_mid_stream_is_an_error_event_then_done(flaky_pipe):
    with TestClient(create_app(ServeConfig(model_id="flaky"), pipeline=flaky_pipe)) as c:
        body = {"prompt": "a", "max_tokens": 10, "stream": True, "ignore_eos": True}
        with c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            events = list(sse_data(r.iter_lines()))
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert "the backend fell over" in error["message"] and error["type"] == "server_error"
        assert all("choices" in json.loads(e) for e in events[:-2])
        r = c.post("/v1/completions", json={**body, "stream": False})
        assert r.status_code == 500 and "the backend fell over" in r.json()["error"]["message"]
        flaky_pipe.heal()
        r = c.post("/v1/completions", json={**body, "stream": False})  # the engine kept serving
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 10


def test_a_request_that_breaks_the_numbers_fails_alone(small_model_dir):
    # A prompt holding a token that makes its row fail (as a key beyond kv=float16's range does) is a 500
    # in OpenAI's shape naming the cause, while a stream that shares its steps goes on to its end.
    poison = 31337
    pipe = inferno.load(small_model_dir, "numpy", download=False)
    with (rows_holding_fail(pipe.model, poison) as rows_seen,
          TestClient(create_app(ServeConfig(model_id="m", slots=4), pipeline=pipe)) as c):
        events: list[str] = []
        body = {"prompt": "a", "max_tokens": 60, "stream": True, "ignore_eos": True}
        started = threading.Event()

        def stream() -> None:
            with c.stream("POST", "/v1/completions", json=body) as r:
                for e in sse_data(r.iter_lines()):
                    events.append(e)
                    started.set()

        t = threading.Thread(target=stream)
        t.start()
        assert started.wait(30)
        r = c.post("/v1/completions", json={"prompt": [5, poison, 7], "max_tokens": 5})
        t.join(60)
        assert r.status_code == 500, r.text
        error = r.json()["error"]
        assert error["type"] == "server_error" and "generation failed" in error["message"]
        assert "65504" in error["message"]
    # Parsed, not searched: the stream's sampled text may itself hold the word "error".
    chunks = [json.loads(e) for e in events[:-1]]
    assert events[-1] == "[DONE]" and all("error" not in chunk for chunk in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert max(rows_seen) == 2  # the poisoned prompt shared a step with the stream


def test_apps_have_their_own_metrics(small_pipe):
    apps = [create_app(ServeConfig(model_id=f"m{k}"), pipeline=small_pipe) for k in range(2)]
    with TestClient(apps[0]) as a, TestClient(apps[1]) as b:
        assert a.post("/v1/completions", json={"prompt": "a", "max_tokens": 3}).status_code == 200
        assert "inferno_generation_tokens_total 3.0" in a.get("/metrics").text
        assert "inferno_generation_tokens_total 0.0" in b.get("/metrics").text
        assert b.get("/v1/models").json()["data"][0]["id"] == "m1"
