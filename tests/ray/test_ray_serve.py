"""Ray Serve: the shipped config (examples/ray_serve.yaml, with this machine's model, port and 2 replicas)
deployed with `serve run`, as a user deploys it: the official `openai` client streams completions
through Serve's proxy, and after one replica is killed requests keep succeeding and a new replica
takes its place."""

from __future__ import annotations

import os
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
    app["args"].update(model_dir=str(ray_model_dir), slots=SLOTS)
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
    stream = client.completions.create(model="ray-model", prompt=prompt, max_tokens=12, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    pieces = [chunk.choices[0].text for chunk in stream]
    assert len(pieces) >= 2 and "".join(pieces) == expected
    whole = client.completions.create(model="ray-model", prompt=prompt, max_tokens=12, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert whole.choices[0].text == expected and whole.usage.completion_tokens == 12
    # The other routes of `inferno serve` answer through the proxy as well.
    models = httpx.get(f"{served}/v1/models", timeout=30).json()
    assert [m["id"] for m in models["data"]] == [ray_model_dir.name]  # the folder's name, as inferno serve
    health = httpx.get(f"{served}/health", timeout=30).json()
    assert health["status"] == "ok" and health["slots_total"] == SLOTS


def test_a_killed_replica_is_replaced_and_requests_keep_succeeding(served, client, local):
    replicas = wait_for("two replicas", lambda: len(processes(REPLICA)) == 2 and processes(REPLICA), 60)
    victim = replicas[0]
    os.kill(victim, signal.SIGKILL)
    prompts = [f"Request number {i}" for i in range(12)]
    for i, prompt in enumerate(prompts):  # right after the death: the proxy must route around it
        expected = local.generate(prompt, max_new_tokens=6, stop_at_eos=False).text
        if i % 2:
            stream = client.completions.create(model="m", prompt=prompt, max_tokens=6, temperature=0,
                                               stream=True, extra_body={"ignore_eos": True})
            text = "".join(chunk.choices[0].text for chunk in stream)
        else:
            text = client.completions.create(model="m", prompt=prompt, max_tokens=6, temperature=0,
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
        assert client.completions.create(model="m", prompt=prompt, max_tokens=6, temperature=0,
                                         extra_body={"ignore_eos": True}).choices[0].text == \
            local.generate(prompt, max_new_tokens=6, stop_at_eos=False).text
