"""Other clients: raw Server-Sent Events over plain HTTP (what `curl -N` sees), and simonw's `llm` CLI
pointed at the server as an OpenAI-compatible completion model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from serve_helpers import running, sse_data, stream_events

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def server(small_model_dir, tmp_path_factory):
    # llm's config below names the model gpt2: the name this server serves.
    flags = ("--served-model-name", "gpt2")
    with running(small_model_dir, *flags, home=tmp_path_factory.mktemp("clients")) as s:
        yield s


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def test_raw_sse_framing_done_and_usage(http, server):
    body = {"prompt": PROMPT, "max_tokens": 6, "stream": True, "seed": 3, "n": 2,
            "stream_options": {"include_usage": True}}
    with http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(r.iter_raw()).decode()
    # Every event is one "data: ..." line and a blank line; nothing else but keep-alive comments.
    events = raw.split("\n\n")
    assert events[-1] == ""
    events = events[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events), raw[:500]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 12
    assert usage["usage"]["prompt_tokens"] == 4 and usage["usage"]["total_tokens"] == 16
    for c in chunks[:-1]:
        assert c["object"] == "text_completion" and len(c["choices"]) == 1
        assert c["usage"] is None  # with include_usage, as OpenAI sends it
    finished = [c["choices"][0]["index"] for c in chunks[:-1] if c["choices"][0]["finish_reason"]]
    assert sorted(finished) == [0, 1]
    # The same events through the line parser, and the text they add up to.
    whole = http.post("/v1/completions", json={**body, "stream": False}).json()
    again = stream_events(http, server.url, body)
    for choice in whole["choices"]:
        pieces = [e["choices"][0]["text"] for e in again[:-2] if e["choices"][0]["index"] == choice["index"]]
        assert "".join(pieces) == choice["text"]


def test_raw_sse_without_usage_has_no_usage_chunk(http, server):
    events = stream_events(http, server.url, {"prompt": PROMPT, "max_tokens": 3, "stream": True})
    assert events[-1] == "[DONE]"
    assert all(e["choices"] and "usage" not in e for e in events[:-1])


def test_errors_before_a_stream_are_plain_json(http):
    r = http.post("/v1/completions", json={"prompt": PROMPT, "stream": True, "temperature": 5})
    assert r.status_code == 400 and r.headers["content-type"] == "application/json"
    assert r.json()["error"]["param"] == "temperature"


def test_sse_data_parser_checks_the_framing():
    assert list(sse_data(iter(["data: a", "", ": ping", "data: [DONE]", ""]))) == ["a", "[DONE]"]
    with pytest.raises(AssertionError):
        list(sse_data(iter(["event: x", ""])))


def test_llm_cli_streams_a_completion(server, tmp_path, small_pipe):
    pytest.importorskip("llm")
    llm = shutil.which("llm", path=str(Path(sys.executable).parent)) or shutil.which("llm")
    if llm is None:
        pytest.skip("the llm command is not installed")
    home = tmp_path / "llm"
    home.mkdir()
    (home / "extra-openai-models.yaml").write_text(
        "- model_id: inferno-test\n"
        "  model_name: gpt2\n"
        f"  api_base: \"{server.url}/v1\"\n"
        "  completion: true\n")
    env = dict(os.environ, LLM_USER_PATH=str(home), OPENAI_API_KEY="x")
    options = ["-o", "max_tokens", "8", "-o", "temperature", "0"]
    command = [llm, "-m", "inferno-test", "--no-log", *options, PROMPT]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    expected = small_pipe.generate(PROMPT, max_new_tokens=8, temperature=0.0).text
    assert proc.stdout == expected + "\n"
    log = server.log()
    assert '"POST /v1/completions" 200' in log
