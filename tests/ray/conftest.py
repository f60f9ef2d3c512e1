"""Fixtures of the Ray tests: a local Ray cluster on 127.0.0.1 with 2 CPUs (started once per module, by
the test process, and stopped after it), a small random model, the commands' environment.

Where Ray cannot be imported the tests that need it are skipped, saying so; the ones that check how
inferno behaves without Ray (tests/ray/test_ray_optional.py) run everywhere.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from cli_helpers import offline_env

from inferno.testing import small_config, spread_state_dict, write_config, write_hub_safetensors

# Ray picks the machine's outward address for its node unless told that this is a one-machine cluster;
# with this (read when Ray is imported) every Ray process listens on 127.0.0.1 only.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Serve's controller gives a new HTTP proxy 5 s to say it is ready, then kills it; on a busy CI machine
# (two test lanes on 2 cores) its imports alone took longer, and `serve run` failed with ActorDiedError.
# Ray's processes inherit these from this process's environment (read when Serve is imported there).
os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
os.environ.setdefault("RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S", "30")

ROOT = Path(__file__).resolve().parents[2]


def ray_missing_reason() -> str | None:
    """Why the Ray tests cannot run here (Ray Data or Ray Serve missing), else None."""
    from inferno.integrations import ray_missing

    return ray_missing("data") or ray_missing("serve")


@pytest.fixture(scope="module")
def ray_address():
    """A fresh local Ray (2 CPUs, no dashboard) for this module; its GCS address, HOST:PORT."""
    reason = ray_missing_reason()
    if reason:
        pytest.skip(f"the Ray tests need {reason.removeprefix('needs ')}")
    import ray

    assert not ray.is_initialized(), "a Ray from another test is still running"
    context = ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    address = context.address_info["gcs_address"]
    assert address.startswith("127.0.0.1:"), address
    try:
        yield address
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def ray_model_dir(tmp_path_factory) -> Path:
    """GPT-2's vocabulary and tokenizer, context 128, two tiny layers; logits spread as real weights'
    are, so that sampled text differs from greedy text."""
    config = small_config(vocab_size=50257, n_positions=128, n_embd=32, n_layer=2, n_head=4)
    directory = tmp_path_factory.mktemp("ray-model")
    write_config(directory / "config.json", config)
    write_hub_safetensors(directory / "model.safetensors", spread_state_dict(config, 7), config)
    shutil.copy(ROOT / "inferno" / "data" / "gpt2" / "tokenizer.json", directory / "tokenizer.json")
    return directory


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    """The commands' environment: offline, and one BLAS thread, as a Ray worker of one CPU has (the
    same rows need the same float32 sums: BLAS adds in another order on more threads)."""
    return {**offline_env(tmp_path), "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
