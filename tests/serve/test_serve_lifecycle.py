"""The server's life as a process: flags, exit codes, the API key, the access log, SIGTERM."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import subprocess
import time

import httpx
import pytest
from cli_helpers import assert_one_line_error
from serve_helpers import finished, launch, running, serve_command, server_env

openai = pytest.importorskip("openai")


def run_cli(*flags: str, home, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(serve_command(*flags), capture_output=True, text=True, env=server_env(home),
                          timeout=timeout)


@pytest.mark.parametrize("flags, needle", [
    (["--slots", "0"], "--slots"),
    (["--port", "http"], "--port"),
    (["--grace-seconds", "-1"], "--grace-seconds"),
    (["--queue", "0"], "--queue"),
    (["--backend", "no-such-backend"], "--backend"),
    (["--backend", "numpy", "--threads", "2"], "--threads"),
    (["--model-dir", "/no/such/folder"], "--model-dir"),
    (["--timeout-headers", "-1"], "--timeout-headers"),
    (["--timeout-body", "soon"], "--timeout-body"),
    (["--max-connections", "-1"], "--max-connections"),
])
def test_bad_flags_are_one_line_and_exit_2(tmp_path, flags, needle):
    assert_one_line_error(run_cli(*flags, home=tmp_path), needle)


def test_a_port_in_use_is_one_line_and_exit_2(small_model_dir, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = run_cli("--model-dir", str(small_model_dir), "--port", str(port), home=tmp_path)
    assert_one_line_error(proc, "cannot listen", str(port))


def test_a_model_that_fails_to_load_exits_2(small_model_dir, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("model.safetensors", "tokenizer.json"):
        (broken / name).symlink_to(small_model_dir / name)
    (broken / "config.json").write_text(json.dumps({"n_embd": "wide"}))
    server = launch(broken, home=tmp_path, wait=False)
    try:
        rc = server.proc.wait(60)
    finally:
        server.stop(signal.SIGKILL)
    assert rc == 2, server.log()
    assert "inferno serve: error:" in server.log() and "Traceback" not in server.log()


def test_api_key_and_access_log_with_prompts(small_model_dir, tmp_path):
    with running(small_model_dir, "--api-key", "s3cret", "--log-prompts", home=tmp_path) as server:
        good = openai.OpenAI(base_url=server.url + "/v1", api_key="s3cret", max_retries=0)
        assert good.completions.create(model="m", prompt="Say the secret word", max_tokens=2).choices
        bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as info:
            bad.completions.create(model="m", prompt="x", max_tokens=2)
        assert info.value.body["code"] == "invalid_api_key"
        for headers in ({}, {"Authorization": "Bearer"}, {"Authorization": "Basic s3cret"}):
            r = httpx.post(server.url + "/v1/completions", json={"prompt": "x"}, headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        for path in ("/v1/models", "/metrics", "/tokenizer_info"):
            assert httpx.get(server.url + path).status_code == 401
        assert httpx.get(server.url + "/health").status_code == 200  # for load balancers
        assert httpx.get(server.url + "/openapi.json").status_code == 200
        log = server.log()
    assert "Say the secret word" in log
    lines = [line for line in log.splitlines() if '"POST /v1/completions" 200' in line]
    assert len(lines) == 1
    assert re.search(r'^127\.0\.0\.1:\d+ "POST /v1/completions" 200 prompt_tokens=4 completion_tokens=2 '
                     r'finish_reasons=length \d+\.\d{3}s prompt="Say the secret word"$', lines[0]), lines[0]
    assert sum('"POST /v1/completions" 401' in line for line in log.splitlines()) == 4
    assert 'HTTP/1.1" 200' not in log  # uvicorn's own access log is off


def test_sigterm_during_streams_ends_them_with_a_finish_reason(long_model_dir, tmp_path):
    # Six streams far too long for the grace period (1000 tokens, over 2 s here), two that finish
    # within it (12 tokens: a few steps, even on a loaded machine; they may end before the signal).
    server = launch(long_model_dir, "--slots", "8", "--grace-seconds", "1", home=tmp_path)
    budgets = [1000] * 6 + [12] * 2

    async def main() -> tuple[list[list], float, bool]:
        started = [asyncio.Event() for _ in range(8)]

        async def stream(c: httpx.AsyncClient, k: int) -> list:
            body = {"prompt": f"Stream {k} of the shutdown", "max_tokens": budgets[k], "ignore_eos": True,
                    "stream": True, "seed": k}
            events: list = []
            async with c.stream("POST", "/v1/completions", json=body) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        data = line[len("data: "):]
                        events.append(data if data == "[DONE]" else json.loads(data))
                        if len(events) >= 2:
                            started[k].set()
            return events

        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            tasks = [asyncio.ensure_future(stream(c, k)) for k in range(8)]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
            t0 = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            try:  # no new connections once it is shutting down
                refused = (await c.get("/health")).status_code == 503
            except httpx.TransportError:
                refused = True
            results = await asyncio.wait_for(asyncio.gather(*tasks), 60)
            return results, time.monotonic() - t0, refused

    try:
        results, seconds, refused = asyncio.run(main())
        rc = server.proc.wait(30)
    finally:
        server.stop(signal.SIGKILL)
    assert rc == 0, server.log()
    assert refused
    for events, budget in zip(results, budgets, strict=True):
        assert events[-1] == "[DONE]"
        assert finished(events) == {0: "cancelled" if budget == 1000 else "length"}, events[-3:]
        assert all(e["choices"][0]["finish_reason"] is None for e in events[:-2])
    assert seconds < 1 + 5, seconds  # the grace period, not the 1000 tokens
    log = server.log()
    assert re.search(r"shutting down; [678] requests may finish within 1s", log), log
    assert "Traceback" not in log
    assert "Stream 0 of the shutdown" not in log  # no prompts without --log-prompts
