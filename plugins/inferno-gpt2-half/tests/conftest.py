"""Shared fixtures: a small random GPT-2 on disk (with the real GPT-2 tokenizer), as inferno-gpt2-torch has.

The model is random but has GPT-2's vocabulary, so text prompts work end to end; it is small enough that
both backends run it in milliseconds.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from inferno.config import Gpt2Config
from inferno.testing import make_model_dir

HERE = Path(__file__).resolve().parent
# This plugin lives in inferno's repository; a plugin elsewhere would point at its own copy of gpt2/.
TOKENIZER_JSON = HERE.parents[2] / "inferno" / "data" / "gpt2" / "tokenizer.json"

CONFIG = Gpt2Config(vocab_size=50257, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                    bos_token_id=50256, eos_token_id=50256)




def write_model_dir(directory: Path, config: Gpt2Config, seed: int = 0) -> Path:
    """A random model (inferno's one maker) with the real tokenizer.json: a folder `inferno.load` accepts."""
    if not TOKENIZER_JSON.is_file():
        pytest.skip(f"needs GPT-2's tokenizer.json at {TOKENIZER_JSON}")
    directory, _, _ = make_model_dir(directory, config, seed=seed)
    shutil.copy(TOKENIZER_JSON, directory / "tokenizer.json")
    return directory


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("random-gpt2-half"), CONFIG)
