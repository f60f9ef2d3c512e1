"""Shared fixtures: a small random GPT-2 on disk (with the real GPT-2 tokenizer), and subprocess helpers.

The model is random but has GPT-2's vocabulary, so text prompts work end to end; it is small enough that
both backends run it in milliseconds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from inferno.config import Gpt2Config
from safetensors.numpy import save_file

HERE = Path(__file__).resolve().parent
# This plugin lives in inferno's repository; a plugin elsewhere would point at its own copy of gpt2/.
TOKENIZER_JSON = HERE.parents[2] / "gpt2" / "tokenizer.json"

CONFIG = Gpt2Config(vocab_size=50257, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                    bos_token_id=50256, eos_token_id=50256)


def random_weights(config: Gpt2Config, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights under the Hub's names; every tensor (biases, gains too) is random, so a
    kernel that drops or swaps one changes the logits."""
    rng = np.random.default_rng(seed)
    c, v, p = config.n_embd, config.vocab_size, config.n_positions

    def normal(shape, scale: float, loc: float = 0.0) -> np.ndarray:
        return (loc + scale * rng.standard_normal(shape)).astype(np.float32)

    w = {"wte.weight": normal((v, c), 0.5), "wpe.weight": normal((p, c), 0.3),
         "ln_f.weight": normal(c, 0.2, 1.0), "ln_f.bias": normal(c, 0.2)}
    for i in range(config.n_layer):
        for ln in ("ln_1", "ln_2"):
            w[f"h.{i}.{ln}.weight"] = normal(c, 0.2, 1.0)
            w[f"h.{i}.{ln}.bias"] = normal(c, 0.2)
        for name, n_in, n_out in (("attn.c_attn", c, 3 * c), ("attn.c_proj", c, c),
                                  ("mlp.c_fc", c, 4 * c), ("mlp.c_proj", 4 * c, c)):
            w[f"h.{i}.{name}.weight"] = normal((n_in, n_out), n_in**-0.5)
            w[f"h.{i}.{name}.bias"] = normal(n_out, 0.2)
    return w


def write_model_dir(directory: Path, config: Gpt2Config, seed: int = 0) -> Path:
    """config.json, model.safetensors and the real tokenizer.json: a folder `inferno.load` accepts."""
    if not TOKENIZER_JSON.is_file():
        pytest.skip(f"needs GPT-2's tokenizer.json at {TOKENIZER_JSON}")
    directory.mkdir(parents=True, exist_ok=True)
    keys = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "bos_token_id", "eos_token_id")
    config_json = {key: getattr(config, key) for key in keys}
    config_json.update(model_type="gpt2", n_ctx=config.n_positions, activation_function="gelu_new",
                       layer_norm_epsilon=config.layer_norm_epsilon)
    (directory / "config.json").write_text(json.dumps(config_json, indent=2))
    save_file(random_weights(config, seed), str(directory / "model.safetensors"))
    shutil.copy(TOKENIZER_JSON, directory / "tokenizer.json")
    return directory


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("random-gpt2"), CONFIG)


@pytest.fixture
def run_python(tmp_path):
    """``run_python(args)``: run ``python ARGS`` in a fresh folder and an environment without
    INFERNO_BACKEND, capturing text output. (A fixture, not an import: ``conftest`` is not a unique
    module name when several test folders run together.)"""
    env = {k: v for k, v in os.environ.items() if k != "INFERNO_BACKEND"}

    def run(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=timeout)

    return run
