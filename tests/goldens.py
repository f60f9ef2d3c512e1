"""The committed golden files (made by scripts/make_goldens.py from Hugging Face transformers, float64)
and the seeded random models they were made from."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

from inferno.models.config import Gpt2Config
from inferno.testing import random_state_dict, small_config, write_config, write_hub_safetensors

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "golden"
TOKENIZER_JSON = ROOT / "inferno" / "data" / "gpt2" / "tokenizer.json"
#: Keys of a golden's "model" spec that are `random_state_dict` keywords; the rest are `small_config`'s.
WEIGHT_KEYS = ("seed", "wpe_std", "attn_gain", "logit_gain")
#: Each greedy golden of 32 tokens holds at least this many distinct ids: a model that repeats itself
#: would hide a decode loop feeding back stale logits, or a wrong position (issue #20).
MIN_DISTINCT_GREEDY_IDS = 20


def weights_sha256(sd: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(sd):
        h.update(name.encode())
        h.update(np.ascontiguousarray(sd[name], dtype="<f4").tobytes())
    return h.hexdigest()


def build_model(spec: dict) -> tuple[Gpt2Config, dict[str, np.ndarray]]:
    """(config, weights) of a golden's "model" spec: `small_config` sizes plus `random_state_dict`
    keywords (WEIGHT_KEYS)."""
    weight_kwargs = {k: v for k, v in spec.items() if k in WEIGHT_KEYS}
    config = small_config(**{k: v for k, v in spec.items() if k not in WEIGHT_KEYS})
    return config, random_state_dict(config, **weight_kwargs)


def check_distinct(cases: list[dict]) -> None:
    """Every greedy case of 32 tokens or more holds at least MIN_DISTINCT_GREEDY_IDS distinct ids."""
    for case in cases:
        ids = case["greedy_ids"]
        assert len(ids) >= 32, f"{case['prompt']!r}: a greedy golden of {len(ids)} tokens (32 expected)"
        distinct = len(set(ids[:32]))
        assert distinct >= MIN_DISTINCT_GREEDY_IDS, (
            f"{case['prompt']!r}: only {distinct} distinct ids in 32 greedy tokens: the model repeats itself "
            f"(see random_gpt2.DISTINCT)")


def golden_model(kind: str) -> tuple[Gpt2Config, dict[str, np.ndarray], dict]:
    """(config, weights, metadata) of the 'logits' or 'greedy' golden model, hash-checked; the greedy
    one's continuations are checked not to repeat themselves (`check_distinct`)."""
    meta = json.loads((GOLDEN / f"{kind}.json").read_text())
    config, sd = build_model(meta["model"])
    assert weights_sha256(sd) == meta["weights_sha256"], (
        f"the random weights of the {kind!r} golden model changed (numpy's generator or "
        "tests/random_gpt2.py); rerun scripts/make_goldens.py"
    )
    if "cases" in meta:
        check_distinct(meta["cases"])
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
