"""Regenerate the golden files the default tests compare against (needs torch + transformers).

    pip install -e ".[test,oracle]" && python scripts/make_goldens.py

Each golden is produced by Hugging Face `GPT2LMHeadModel` in float64 (eager attention) on seeded random
weights from `tests/random_gpt2.py`; the weights are not committed, only their seed, shape and sha256
(the tests regenerate them and check the hash, so a change in the generator is caught, not masked).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from goldens import build_model, check_distinct, weights_sha256  # noqa: E402
from hf_oracle import hf_greedy, hf_logits, hf_model  # noqa: E402

from inferno.testing import DISTINCT  # noqa: E402
from inferno.tokenizer import Tokenizer  # noqa: E402

OUT = ROOT / "tests" / "data" / "golden"

# Small vocabulary, every position's logits: the logits parity check.
LOGITS_MODEL = dict(vocab_size=384, n_positions=64, n_embd=48, n_layer=3, n_head=3, seed=11)
# The real vocabulary and tokenizer, greedy continuations of text prompts; position embeddings and
# attention scaled up (random_gpt2.DISTINCT) so that greedy decoding does not repeat one token: a decode
# loop that feeds back stale logits, or a wrong position, then changes the ids.
GREEDY_MODEL = dict(vocab_size=50257, n_positions=128, n_embd=32, n_layer=2, n_head=4, seed=12, **DISTINCT)
GREEDY_TOKENS = 32
PROMPTS = [
    "The quick brown fox",
    "Hello, world!",
    "The capital of France is",
    "Once upon a time",
    "import numpy as np\n",
    "In 1969, astronauts",
    "¿Dónde está la biblioteca?",
    "東京は日本の首都です。",
    "def fibonacci(n):",
    "   leading spaces and\ttabs",
    "A",
    "The meaning of life is 42, they'LL say",
]


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)

    config, sd = build_model(LOGITS_MODEL)
    model = hf_model(config, sd)
    prompts = [rng.integers(0, config.vocab_size, size=n).tolist() for n in (1, 2, 7, 16, 33, 64)]
    arrays = {f"logits_{i}": hf_logits(model, p) for i, p in enumerate(prompts)}
    arrays.update({f"ids_{i}": np.asarray(p) for i, p in enumerate(prompts)})
    np.savez_compressed(OUT / "logits.npz", **arrays)
    meta = {"model": LOGITS_MODEL, "weights_sha256": weights_sha256(sd), "prompts": len(prompts)}
    (OUT / "logits.json").write_text(json.dumps(meta, indent=2) + "\n")

    config, sd = build_model(GREEDY_MODEL)
    model = hf_model(config, sd)
    tok = Tokenizer.from_file(ROOT / "inferno" / "data" / "gpt2" / "tokenizer.json")
    cases = []
    for text in PROMPTS:
        ids = tok.encode(text)
        new, gaps = hf_greedy(model, ids, GREEDY_TOKENS)
        cases.append({"prompt": text, "prompt_ids": ids, "greedy_ids": new, "relative_gaps": gaps})
    check_distinct(cases)
    meta = {"model": GREEDY_MODEL, "weights_sha256": weights_sha256(sd), "cases": cases,
            "source": "transformers GPT2LMHeadModel, float64, eager attention, argmax of full recompute"}
    (OUT / "greedy.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {OUT}/logits.npz, logits.json, greedy.json")


if __name__ == "__main__":
    main()
