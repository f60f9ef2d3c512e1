"""The server's life as a process: flags, exit codes, the API key, the access log, SIGTERM."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from cli_helpers import assert_one_line_error
from serve_helpers import finished, launch, running, serve_command, server_env

openai = pytest.importorskip("openai")


def run_cli(*flags: str, home, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(serve_command(*flags), capture_output=True, text=True, env=server_env(home),
                          timeout=timeout)


BAD_FLAGS = [
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
    (["--api-key", ""], "--api-key", "empty"),  # --api-key "$UNSET": not an open API
    (["--api-key", " "], "--api-key", "whitespace"),
    (["--api-key", " s3cret"], "--api-key", "whitespace"),
    (["--api-key", "s3cret "], "--api-key", "whitespace"),
    (["--api-key", "a", "--api-key-file", "f"], "--api-key and --api-key-file"),
    (["--api-key-file", "/no/such/key"], "--api-key-file /no/such/key", "cannot read"),
    (["--allowed-origins", "localhost:3000"], "--allowed-origins", "scheme://host"),
]


@pytest.mark.parametrize("flags, needles", [(case[0], case[1:]) for case in BAD_FLAGS])
def test_bad_flags_are_one_line_and_exit_2(tmp_path, flags, needles):
    assert_one_line_error(run_cli(*flags, home=tmp_path), *needles)


@pytest.mark.parametrize("value, needle", [("", "empty"), (" k", "whitespace")])
def test_an_empty_or_padded_key_from_the_environment_or_a_file_exits_2(tmp_path, value, needle):
    env = {**server_env(tmp_path), "INFERNO_API_KEY": value}
    proc = subprocess.run(serve_command(), capture_output=True, text=True, env=env, timeout=60)
    assert_one_line_error(proc, "$INFERNO_API_KEY", needle)
    key_file = tmp_path / "key"
    key_file.write_text(value + "\n")
    assert_one_line_error(run_cli("--api-key-file", str(key_file), home=tmp_path), "--api-key-file", needle)


def test_the_api_key_from_a_file_or_the_environment(small_model_dir, tmp_path, monkeypatch):
    # A flag (--api-key or --api-key-file, not both) beats $INFERNO_API_KEY.
    from inferno.cli.serve import _api_key, _parser

    key_file = tmp_path / "key"
    key_file.write_text("from-the-file\n")  # the last newline is not part of the key
    monkeypatch.setenv("INFERNO_API_KEY", "from-the-env")
    for flags, key in ((["--api-key", "flag"], "flag"), (["--api-key-file", str(key_file)], "from-the-file"),
                       ([], "from-the-env")):
        assert _api_key(_parser().parse_args(flags)) == (key, None)
    monkeypatch.delenv("INFERNO_API_KEY")
    assert _api_key(_parser().parse_args([])) == (None, None)
    # Through a server: the key from a file.
    with running(small_model_dir, "--api-key-file", str(key_file), home=tmp_path) as server:
        def status(path: str, key: str) -> int:
            return httpx.get(server.url + path, headers={"Authorization": f"Bearer {key}"}).status_code

        assert [status("/v1/models", k) for k in ("from-the-file", "from-the-env", "x")] == [200, 401, 401]
        # The model may be named by the --model-dir given, as well as by its id.
        assert status(f"/v1/models/{small_model_dir}", "from-the-file") == 200
        assert status(f"/v1/models/{small_model_dir.name}", "from-the-file") == 200
        assert status("/v1/models/gpt2", "from-the-file") == 404


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
        model = small_model_dir.name  # the served id: the folder's name
        good = openai.OpenAI(base_url=server.url + "/v1", api_key="s3cret", max_retries=0)
        assert good.completions.create(model=model, prompt="Say the secret word", max_tokens=2).choices
        bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as info:
            bad.completions.create(model=model, prompt="x", max_tokens=2)
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
        # "abort", as vLLM says it: OpenAI's clients know no "cancelled".
        assert finished(events) == {0: "abort" if budget == 1000 else "length"}, events[-3:]
        assert all(e["choices"][0]["finish_reason"] is None for e in events[:-2])
    assert seconds < 1 + 5, seconds  # the grace period, not the 1000 tokens
    log = server.log()
    assert re.search(r"shutting down; [678] requests may finish within 1s", log), log
    assert "Traceback" not in log
    assert "Stream 0 of the shutdown" not in log  # no prompts without --log-prompts


def test_slots_that_cannot_fit_in_memory_exit_2(small_model_dir, tmp_path):
    # A billion slots: the engine would allocate until the kernel killed the process.
    server = launch(small_model_dir, "--slots", "1000000000", home=tmp_path, wait=False)
    try:
        rc = server.proc.wait(60)
    finally:
        server.stop(signal.SIGKILL)
    log = server.log()
    assert rc == 2, log
    size = r"[\d.]+ [TGM]B"
    assert re.search(rf"inferno serve: error: --slots 1000000000: the KV cache needs {size} \({size} a "
                     rf"slot × 1000000000 slots at a context of 128\) but this machine has {size}", log), log
    assert "Traceback" not in log


#: `inferno serve` with an inspection that takes two minutes and cannot be interrupted (as a long
#: inspection of a large model on a slow machine is, inside one block).
SLOW_INSPECTION = ("import sys, time\n"
                   "import inferno.inspect\n"
                   "inferno.inspect.inspect_ids = lambda *args, **kwargs: time.sleep(120)\n"
                   "from inferno.cli.serve import run\n"
                   "raise SystemExit(run(sys.argv[1:]))\n")


def test_sigterm_while_a_worker_inspects_answers_503_and_exits_in_time(small_model_dir, tmp_path):
    from serve_helpers import Server, free_port

    port = free_port()
    log_path = tmp_path / "server.log"
    command = [sys.executable, "-c", SLOW_INSPECTION, "--model-dir", str(small_model_dir), "--backend",
               "numpy", "--port", str(port), "--grace-seconds", "1"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=server_env(tmp_path))
    server = Server(proc, f"http://127.0.0.1:{port}", log_path)
    try:
        server.wait_ready()
        body = {"prompt": "Look inside every token of this"}
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            answer = pool.submit(httpx.post, server.url + "/v1/inspect", json=body, timeout=60)
            time.sleep(1.0)  # in the worker by now
            assert not answer.done()
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            r = answer.result(30)
            rc = proc.wait(30)
            seconds = time.monotonic() - t0
    finally:
        server.stop(signal.SIGKILL)
    assert r.status_code == 503 and r.headers["content-type"] == "application/json", r.text
    error = r.json()["error"]
    assert (error["type"], error["code"]) == ("service_unavailable", "shutting_down"), error
    assert rc == 0, server.log()
    assert seconds < 1 + 5, seconds  # the grace period (and uvicorn's backstop), not the two minutes
    log = server.log()
    assert "Traceback" not in log and "Internal Server Error" not in log
    assert re.search(r'"POST /v1/inspect" 503 ', log), log


SLOW_PREFILL = ("import sys, time\n"
                "from inferno.models.gpt2 import Gpt2\n"
                "ragged = Gpt2.forward_ragged\n"
                "def slow(self, *args, **kwargs):\n"
                "    time.sleep(0.2)\n"
                "    return ragged(self, *args, **kwargs)\n"
                "Gpt2.forward_ragged = slow\n"
                "from inferno.cli.serve import run\n"
                "raise SystemExit(run(sys.argv[1:]))\n")


def test_sigterm_before_an_echo_is_scored_answers_503_not_null_logprobs(small_model_dir, tmp_path):
    """Echo + logprobs are computed while the engine prefills the prompt: a shutdown that ends the request
    before then has no logprobs to give, so the answer is the 503 of an unfinished request."""
    from serve_helpers import Server, free_port

    port = free_port()
    log_path = tmp_path / "server.log"
    command = [sys.executable, "-c", SLOW_PREFILL, "--model-dir", str(small_model_dir), "--backend",
               "numpy", "--port", str(port), "--grace-seconds", "1", "--prefill-chunk", "1"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=server_env(tmp_path))
    server = Server(proc, f"http://127.0.0.1:{port}", log_path)
    try:
        server.wait_ready()
        body = {"prompt": " ".join(["word"] * 60), "echo": True, "logprobs": 1, "max_tokens": 0}
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            answer = pool.submit(httpx.post, server.url + "/v1/completions", json=body, timeout=60)
            time.sleep(1.5)  # a few of the 60 one-token prefill steps of 0.2 s are done
            assert not answer.done()
            proc.send_signal(signal.SIGTERM)
            r = answer.result(30)
            rc = proc.wait(30)
    finally:
        server.stop(signal.SIGKILL)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "shutting_down", r.text
    assert rc == 0, server.log()
    assert "Traceback" not in server.log()
