"""pytest fixtures that backend plugins share: a small random GPT-2 on disk, and a clean ``python``.

A plugin's ``tests/conftest.py`` imports the fixtures it uses::

    from inferno.testing_fixtures import model_dir, run_python  # noqa: F401 - pytest finds them by name

The model is random (`inferno.testing`, the one maker) but has GPT-2's vocabulary and the tokenizer.json
that ships with inferno, so text prompts work end to end; it is small enough that any backend runs it in
moments. This module imports pytest: only tests import it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from inferno.models.config import Gpt2Config
from inferno.testing import make_model_dir

__all__ = ["PLUGIN_CONFIG", "TOKENIZER_JSON", "model_dir", "run_python", "write_model_dir"]

#: GPT-2's tokenizer, as it ships inside the package (package data: found from any working directory).
TOKENIZER_JSON = Path(__file__).resolve().parent / "data" / "gpt2" / "tokenizer.json"

#: The plugins' test model: GPT-2's vocabulary at a small width.
PLUGIN_CONFIG = Gpt2Config(vocab_size=50257, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                           bos_token_id=50256, eos_token_id=50256)


def write_model_dir(directory: Path, config: Gpt2Config = PLUGIN_CONFIG, seed: int = 0) -> Path:
    """A random model with the real tokenizer.json in `directory`: a folder `inferno.load` accepts."""
    if not TOKENIZER_JSON.is_file():
        pytest.skip(f"needs GPT-2's tokenizer.json at {TOKENIZER_JSON}")
    directory, _, _ = make_model_dir(directory, config, seed=seed)
    shutil.copy(TOKENIZER_JSON, directory / "tokenizer.json")
    return directory


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`PLUGIN_CONFIG`'s random GPT-2, written once per session."""
    return write_model_dir(tmp_path_factory.mktemp("random-gpt2"), PLUGIN_CONFIG)


@pytest.fixture
def run_python(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess]:
    """``run_python(args)``: run ``python ARGS`` in a fresh folder and an environment without
    INFERNO_BACKEND, capturing text output. (A fixture, not a helper to import from a conftest:
    ``conftest`` is not a unique module name when several test folders run together.)"""
    env = {k: v for k, v in os.environ.items() if k != "INFERNO_BACKEND"}

    def run(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=timeout)

    return run
