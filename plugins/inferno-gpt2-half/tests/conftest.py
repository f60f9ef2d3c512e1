"""Shared fixtures: a small random GPT-2 on disk (with the real GPT-2 tokenizer), as inferno-gpt2-torch has.

The model is random but has GPT-2's vocabulary, so text prompts work end to end; it is small enough that
both backends run it in milliseconds.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from inferno.config import Gpt2Config
from inferno.testing import random_state_dict
from safetensors.numpy import save_file

HERE = Path(__file__).resolve().parent
# This plugin lives in inferno's repository; a plugin elsewhere would point at its own copy of gpt2/.
TOKENIZER_JSON = HERE.parents[2] / "gpt2" / "tokenizer.json"

CONFIG = Gpt2Config(vocab_size=50257, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                    bos_token_id=50256, eos_token_id=50256)


def random_weights(config: Gpt2Config, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights under the Hub's names (inferno's one maker): every tensor (biases, gains
    too) is random, so a kernel that drops or swaps one changes the logits."""
    return random_state_dict(config, seed)


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
    return write_model_dir(tmp_path_factory.mktemp("random-gpt2-half"), CONFIG)
