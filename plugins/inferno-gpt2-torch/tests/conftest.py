"""Shared fixtures: a small random GPT-2 on disk (with the real GPT-2 tokenizer), and subprocess helpers.

The model is random but has GPT-2's vocabulary, so text prompts work end to end; it is small enough that
both backends run it in milliseconds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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
