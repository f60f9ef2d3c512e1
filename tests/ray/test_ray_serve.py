"""Ray Serve: the shipped config (examples/ray_serve.yaml, with this machine's model, port and 2 replicas)
deployed with `serve run`, as a user deploys it: the official `openai` client streams completions
through Serve's proxy, and after one replica is killed requests keep succeeding and a new replica
takes its place."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from ray_helpers import COMMAND_TIMEOUT, processes, wait_for

import inferno

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "ray_serve.yaml"
#: Ray names a replica's process after its deployment.
REPLICA = "ServeReplica:inferno:InfernoServer"
SLOTS = 4
#: The served model's id: requests name it (another is a 404).
MODEL = "ray-model"

pytestmark = pytest.mark.filterwarnings("ignore:Using extra keyword arguments on `Field`")  # Ray's own


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(ray_address, ray_model_dir, tmp_path_factory):
    """The example config's application on 2 replicas (half a CPU each), its proxy on a free port of
    127.0.0.1; the base URL. Serve is shut down afterwards."""
    import yaml  # Ray's dependency
    from ray import serve

    config = yaml.safe_load(CONFIG.read_text())
    port = free_port()
    config["http_options"].update(host="127.0.0.1", port=port)
    app = config["applications"][0]
    app["args"].update(model_dir=str(ray_model_dir), slots=SLOTS, served_model_name=MODEL)
    deployment = app["deployments"][0]
    deployment["autoscaling_config"].update(min_replicas=2, initial_replicas=2, max_replicas=2)
    deployment["ray_actor_options"]["num_cpus"] = 0.5
    deployment["max_ongoing_requests"] = 2 * SLOTS
    path = tmp_path_factory.mktemp("serve") / "serve.yaml"
    path.write_text(yaml.safe_dump(config))
    serve_cli = Path(sys.executable).parent / "serve"
    proc = subprocess.run([str(serve_cli), "run", "--non-blocking", "--address", ray_address, str(path)],
                          capture_output=True, text=True, timeout=COMMAND_TIMEOUT, env=os.environ.copy())
    assert proc.returncode == 0, proc.stderr[-3000:]
    try:
        def running():
            status = serve.status().applications.get("inferno")
            return status is not None and status.status == "RUNNING"

        wait_for("the application to run", running, 120, interval=0.5)
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()


@pytest.fixture(scope="module")
def client(served):
    from openai import OpenAI

    return OpenAI(base_url=f"{served}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def local(ray_model_dir):
    return inferno.load(ray_model_dir, "numpy", download=False)


def test_the_openai_client_streams_completions_through_the_proxy(served, client, local, ray_model_dir):
    prompt = "The quick brown fox"
    expected = local.generate(prompt, max_new_tokens=12, stop_at_eos=False).text
    stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    pieces = [chunk.choices[0].text for chunk in stream]
    assert len(pieces) >= 2 and "".join(pieces) == expected
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert whole.choices[0].text == expected and whole.usage.completion_tokens == 12
    # The other routes of `inferno serve` answer through the proxy as well.
    models = httpx.get(f"{served}/v1/models", timeout=30).json()
    assert [m["id"] for m in models["data"]] == [MODEL]  # the served_model_name, as inferno serve
    health = httpx.get(f"{served}/health", timeout=30).json()
    assert health["status"] == "ok" and health["slots_total"] == SLOTS


def serve_logs() -> list[Path]:
    """This Ray session's log files that a replica writes: Serve's replica logs and its workers' stdout
    and stderr."""
    import ray

    session = Path(ray._private.worker._global_node.get_session_dir_path())  # noqa: SLF001
    logs = session / "logs"
    return sorted([*logs.glob("serve/replica_*.log"), *logs.glob("worker-*.out"), *logs.glob("worker-*.err")])


def new_text(offsets: dict[Path, int], only: str = "") -> str:
    """What the logs (whose names start with `only`) hold past `offsets` (a file that is new: all)."""
    parts = []
    for path in serve_logs():
        if path.name.startswith(only):
            with open(path, "rb") as f:
                f.seek(offsets.get(path, 0))
                parts.append(f.read().decode("utf-8", "replace"))
    return "".join(parts)


def test_a_client_that_leaves_a_stream_is_one_disconnected_line_not_an_internal_error(served):
    """Serve cancels the request of a client that disconnects; the replica logs it as `inferno serve`
    does, one access-log line ending "disconnected", with no traceback and no internal error (before
    #39: a 90-line traceback of a TaskCancelledError)."""
    import time

    offsets = {path: path.stat().st_size for path in serve_logs()}
    body = {"model": MODEL, "prompt": "A stream its client leaves", "max_tokens": 100, "stream": True,
            "ignore_eos": True}
    with httpx.stream("POST", f"{served}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert next(line for line in r.iter_lines() if line).startswith("data: {")
    # The connection is closed here, the stream not read to its end.
    ours = re.compile(r'"POST /v1/completions" 200 disconnected')
    wait_for("the replica's access-log line", lambda: ours.search(new_text(offsets)), 60, interval=0.5)
    time.sleep(2)  # anything logged after it (an error from the task Serve cancelled)
    text = new_text(offsets)
    assert "disconnected, cancelling request" in text, text[-5000:]  # Serve's proxy did cancel it
    assert len(ours.findall(new_text(offsets, "replica_"))) == 1, text[-5000:]  # (its stderr has it too)
    for needle in ("Traceback", "Internal Server Error", "internal error", "Exception in ASGI", "ERROR"):
        assert needle not in text, text[-5000:]
    # The replica serves on: another request through the proxy succeeds.
    r = httpx.post(f"{served}/v1/completions", json={**body, "stream": False, "max_tokens": 4}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text


def test_a_killed_replica_is_replaced_and_requests_keep_succeeding(served, client, local):
    replicas = wait_for("two replicas", lambda: len(processes(REPLICA)) == 2 and processes(REPLICA), 60)
    victim = replicas[0]
    os.kill(victim, signal.SIGKILL)
    prompts = [f"Request number {i}" for i in range(12)]
    for i, prompt in enumerate(prompts):  # right after the death: the proxy must route around it
        expected = local.generate(prompt, max_new_tokens=6, stop_at_eos=False).text
        if i % 2:
            stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0,
                                               stream=True, extra_body={"ignore_eos": True})
            text = "".join(chunk.choices[0].text for chunk in stream)
        else:
            text = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0,
                                             extra_body={"ignore_eos": True}).choices[0].text
        assert text == expected, prompt

    def replaced():
        now = processes(REPLICA)
        return now if len(now) == 2 and victim not in now else None

    now = wait_for("a new replica in place of the killed one", replaced, 90, interval=0.5)
    assert set(now) - set(replicas)
    from ray import serve

    wait_for("the application to be healthy again",
             lambda: serve.status().applications["inferno"].status == "RUNNING", 60, interval=0.5)
    for prompt in prompts[:4]:
        assert client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0,
                                         extra_body={"ignore_eos": True}).choices[0].text == \
            local.generate(prompt, max_new_tokens=6, stop_at_eos=False).text
