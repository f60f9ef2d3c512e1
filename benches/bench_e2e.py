"""End-to-end benchmarks on random weights of the GPT-2 124M shape, for every registered backend.

    python -m pytest benches/bench_e2e.py --benchmark-only --benchmark-columns=min,median,rounds

* prefill-64: a 64-token prompt into a fresh KV cache, up to the host logits of its last position;
* decode-8: 8 cached one-token steps after a 64-token prefill (the prefill is setup, not timed);
* generate-16: greedy generation of 16 new tokens from a 16-token prompt, through `generate_tokens`.

For longer prompts and the side-by-side table against numpy and transformers, see ``compare.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from inferno.bench import prompt_ids
from inferno.generate import generate_tokens

VOCAB = 50257


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    return prompt_ids(64, VOCAB, seed=1)


def test_prefill_64(benchmark, gpt2_model, prompt):
    def prefill():
        cache = gpt2_model.new_cache(1, 65)
        return gpt2_model.backend.to_numpy(gpt2_model.forward(np.asarray([prompt]), cache))

    benchmark(prefill)


def test_decode_8(benchmark, gpt2_model, prompt):
    def setup():
        cache = gpt2_model.new_cache(1, 64 + 8)
        logits = gpt2_model.backend.to_numpy(gpt2_model.forward(np.asarray([prompt]), cache))
        return (cache, logits), {}

    def decode(cache, logits):
        for _ in range(8):
            token = int(np.argmax(logits[0]))
            logits = gpt2_model.backend.to_numpy(gpt2_model.forward(np.asarray([[token]]), cache))
        return logits

    benchmark.pedantic(decode, setup=setup, rounds=5, iterations=1, warmup_rounds=1)


def test_generate_16(benchmark, gpt2_model, prompt):
    def generate():
        ids = list(generate_tokens(gpt2_model, prompt[:16], 16, stop_ids=()))
        assert len(ids) == 16
        return ids

    benchmark.pedantic(generate, rounds=5, iterations=1, warmup_rounds=1)
