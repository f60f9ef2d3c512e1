"""Print the validation table of README.md: our logits and greedy ids against Hugging Face transformers
(float64, eager attention) on seeded random GPT-2 weights.

    pip install -e ".[test,oracle]" && python scripts/parity_report.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from goldens import TOKENIZER_JSON, write_model_dir  # noqa: E402
from hf_oracle import hf_greedy, hf_logits, hf_model  # noqa: E402

import inferno  # noqa: E402
from inferno.testing import make_model_dir, random_state_dict, small_config  # noqa: E402

PROMPTS = ["The quick brown fox", "Hello, world!", "The capital of France is"]


def main() -> None:
    print("| model | file | backend | max abs err / max abs logit | greedy ids equal |")
    print("| --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        cases = [("small (C=40, L=3, H=5, V=300)", dict(vocab_size=300, n_positions=48, n_embd=40, n_layer=3,
                                                         n_head=5), layout, dtype)
                 for layout, dtype in [("hub", "F32"), ("save_pretrained", "F32"), ("hub", "F16"),
                                       ("hub", "BF16")]]
        for i, (label, shape, layout, dtype) in enumerate(cases):
            d, config, stored = make_model_dir(Path(tmp) / f"m{i}", small_config(**shape), seed=21,
                                               layout=layout, dtype=dtype)
            shutil.copy(TOKENIZER_JSON, d / "tokenizer.json")
            ref = hf_model(config, stored)
            ids = np.random.default_rng(1).integers(0, config.vocab_size, 40).tolist()
            for backend in ("numpy", "array-api"):
                pipe = inferno.load(d, backend, download=False)
                want = hf_logits(ref, ids)
                err = np.abs(pipe.logits(ids) - want).max() / np.abs(want).max()
                print(f"| {label} | {layout} {dtype} | {backend} | {err:.1e} | |")

        config = small_config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)
        sd = random_state_dict(config, seed=24)
        d = write_model_dir(Path(tmp) / "full", config, sd)
        ref = hf_model(config, sd)
        del sd
        pipe = inferno.load(d, "numpy", download=False)
        ids = pipe.encode("The quick brown fox jumps over the lazy dog. " * 3)
        want = hf_logits(ref, ids)
        err = np.abs(pipe.logits(ids) - want).max() / np.abs(want).max()
        equal = total = 0
        for text in PROMPTS:
            p = pipe.encode(text)
            theirs, _ = hf_greedy(ref, p, 8)
            ours = pipe.generate(p, max_new_tokens=8, stop_at_eos=False).ids
            equal += sum(a == b for a, b in zip(ours, theirs, strict=True))
            total += len(theirs)
        print(f"| 124M shape (random weights) | hub F32 | numpy | {err:.1e} | {equal}/{total} |")


if __name__ == "__main__":
    main()
