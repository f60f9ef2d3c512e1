"""Fixtures of the server's tests: model folders, the in-process pipeline, token texts.

Every server runs as a user runs it: a subprocess on 127.0.0.1 with a free port, started once per
module (or per test that needs its own flags), waited for until /health answers 200 (bounded), and
terminated in teardown; see `serve_helpers` (`SERVE` is the one place that says how it is started).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from goldens import golden_model, write_model_dir  # tests/ is on sys.path (tests/conftest.py)

import inferno
from inferno.testing import random_state_dict, small_config

# Without the serve-test extra only the tests that need none of it run (the rest would not import).
_EXTRA = ("fastapi", "uvicorn", "sse_starlette", "prometheus_client", "httpx")
if any(importlib.util.find_spec(name) is None for name in _EXTRA):
    collect_ignore_glob = [p.name for p in Path(__file__).parent.glob("test_*.py")
                           if p.name != "test_serve_no_extra.py"]


@pytest.fixture(scope="session")
def small_model_dir(tmp_path_factory) -> Path:
    """The golden 'greedy' model: the real vocabulary and tokenizer, context 128, tiny layers."""
    config, sd, _ = golden_model("greedy")
    return write_model_dir(tmp_path_factory.mktemp("serve-small"), config, sd)


@pytest.fixture(scope="session")
def long_model_dir(tmp_path_factory) -> Path:
    """Like the small one with a context of 1024, so that a stream can last seconds (load tests)."""
    config = small_config(vocab_size=50257, n_positions=1024, n_embd=32, n_layer=2, n_head=4)
    return write_model_dir(tmp_path_factory.mktemp("serve-long"), config, random_state_dict(config, 3))


@pytest.fixture(scope="session")
def small_pipe(small_model_dir):
    """The same model in process, to compare with what the server answers."""
    return inferno.load(small_model_dir, "numpy", download=False)


# ------------------------------------------------------------------------------------- token texts


@pytest.fixture(scope="session")
def token_texts(small_model_dir) -> dict[int, str]:
    """Each id's text as the server's logprobs should show it, from tokenizer.json itself: the token's
    bytes as UTF-8, else ``bytes:\\xNN...``."""
    from inferno.tokenizer import bytes_to_unicode

    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    data = json.loads((small_model_dir / "tokenizer.json").read_text())
    out = {}
    for token, i in data["model"]["vocab"].items():
        raw = bytes(to_byte[c] for c in token)
        try:
            out[i] = raw.decode("utf-8")
        except UnicodeDecodeError:
            out[i] = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
    for entry in data.get("added_tokens", []):
        out[entry["id"]] = entry["content"]
    return out
