"""The real 124M shape on random weights, through the real loader (`python -m pytest -m heavy`)."""

from __future__ import annotations

import numpy as np
import pytest
from goldens import write_model_dir

import inferno
from inferno.testing import random_state_dict, small_config

pytestmark = pytest.mark.heavy


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    config = small_config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
                          bos_token_id=50256, eos_token_id=50256)
    # The Hub's layout: no prefix, the 12 causal-mask buffers, no lm_head.weight.
    return write_model_dir(tmp_path_factory.mktemp("gpt2-124m"), config, random_state_dict(config, seed=3))


def test_cached_decode_equals_full_recompute(model_dir):
    pipe = inferno.load(model_dir, "numpy", download=False)
    assert pipe.config.n_layer == 12 and pipe.model.lm_head_w is pipe.model.wte  # tied, not copied
    ids = pipe.encode("The quick brown fox jumps over the lazy dog, and then")
    full = pipe.logits(ids)
    cache = pipe.model.new_cache(1, len(ids))
    steps = [pipe.model.forward(np.asarray([ids[:4]]), cache)[0]]
    steps += [pipe.model.forward(np.asarray([[i]]), cache)[0] for i in ids[4:]]
    scale = np.abs(full).max()
    assert np.abs(np.stack(steps) - full[3:]).max() <= 1e-4 * scale


@pytest.mark.parametrize("backend", ["array-api", "cpu-threaded"])
def test_backends_agree_with_numpy(model_dir, backend):
    ref = inferno.load(model_dir, "numpy", download=False)
    other = inferno.load(model_dir, backend, download=False)
    ids = ref.encode("Hello, world! " * 8)
    a, b = ref.logits(ids), other.logits(ids)
    assert np.abs(a - b).max() <= 1e-4 * np.abs(a).max()
    kwargs = dict(max_new_tokens=8, stop_at_eos=False)
    assert other.generate("The capital of France is", **kwargs).ids == ref.generate(
        "The capital of France is", **kwargs).ids
