"""The committed golden files (made by scripts/make_goldens.py from Hugging Face transformers, float64)
and the seeded random models they were made from."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
from random_gpt2 import random_state_dict, small_config, write_config, write_hub_safetensors

from inferno.config import Gpt2Config

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "golden"
TOKENIZER_JSON = ROOT / "gpt2" / "tokenizer.json"


def weights_sha256(sd: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(sd):
        h.update(name.encode())
        h.update(np.ascontiguousarray(sd[name], dtype="<f4").tobytes())
    return h.hexdigest()


def golden_model(kind: str) -> tuple[Gpt2Config, dict[str, np.ndarray], dict]:
    """(config, weights, metadata) of the 'logits' or 'greedy' golden model, hash-checked."""
    meta = json.loads((GOLDEN / f"{kind}.json").read_text())
    spec = dict(meta["model"])
    seed = spec.pop("seed")
    config = small_config(**spec)
    sd = random_state_dict(config, seed)
    assert weights_sha256(sd) == meta["weights_sha256"], (
        f"the random weights of the {kind!r} golden model changed (numpy's generator or "
        "tests/random_gpt2.py); rerun scripts/make_goldens.py"
    )
    return config, sd, meta


def write_model_dir(directory: Path, config: Gpt2Config, sd: dict[str, np.ndarray]) -> Path:
    """config.json + model.safetensors (Hub layout) + the real tokenizer.json."""
    directory.mkdir(parents=True, exist_ok=True)
    write_config(directory / "config.json", config)
    write_hub_safetensors(directory / "model.safetensors", sd, config)
    shutil.copy(TOKENIZER_JSON, directory / "tokenizer.json")
    return directory


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """The reference log-softmax over the last axis, in float64 (written out here, independently of
    inferno.options)."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
