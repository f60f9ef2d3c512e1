"""A tiny random GPT-2 on disk (GPT-2's real tokenizer, so text prompts work end to end), and `llm`'s user
folder in a temporary directory for every test (its logs database, aliases and default options)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
# This plugin lives in inferno's repository; a plugin elsewhere would ship its own tokenizer.json.
TOKENIZER_JSON = REPO / "inferno" / "data" / "gpt2" / "tokenizer.json"

from inferno.testing import make_model_dir, small_config  # noqa: E402 - the one random GPT-2 maker


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    """GPT-2's vocabulary at a tiny width (loads in a fraction of a second); its next-token distribution
    is spread (entropy about 6 nats after "Hi"), so sampling visibly differs from greedy decoding."""
    config = small_config(vocab_size=50257, n_positions=64, n_embd=32, n_layer=2, n_head=2)
    directory, _, _ = make_model_dir(tmp_path_factory.mktemp("tiny-gpt2"), config, seed=0)
    shutil.copy(TOKENIZER_JSON, directory / "tokenizer.json")
    return directory


@pytest.fixture(scope="session")
def empty_logs_db(tmp_path_factory) -> Path:
    """An empty llm logs database, migrated once: llm migrates a new one at its first prompt, which
    takes seconds (hundreds of schema statements, each committed), so each test starts from a copy."""
    import sqlite_utils
    from llm.migrations import migrate

    path = tmp_path_factory.mktemp("llm-template") / "logs.db"
    migrate(sqlite_utils.Database(path))
    return path


@pytest.fixture(autouse=True)
def llm_user_path(tmp_path, monkeypatch, empty_logs_db) -> Path:
    """llm reads LLM_USER_PATH at every use, so no test touches the real ~/.config/io.datasette.llm;
    each test has its own, with its own logs."""
    path = tmp_path / "llm-user"
    path.mkdir()
    shutil.copy(empty_logs_db, path / "logs.db")
    monkeypatch.setenv("LLM_USER_PATH", str(path))
    # llm re-raises a model's errors instead of printing them when this is set; the tests want what
    # a user sees.
    monkeypatch.delenv("LLM_RAISE_ERRORS", raising=False)
    # No test may download: a name that is not a local folder must fail fast, offline.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return path
