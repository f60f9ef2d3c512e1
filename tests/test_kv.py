"""The KV cache and slots (inferno/kv.py): their sizes and the shape of every layer's arrays, from the
backend through the checked wrapper."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from goldens import golden_model

from inferno.backends.numpy_backend import NumpyBackend
from inferno.kv import new_cache, new_slots, slot_bytes
from inferno.models.gpt2 import Gpt2


@pytest.fixture(scope="module")
def model() -> Gpt2:
    config, sd, _ = golden_model("logits")
    return Gpt2.from_weights(config, sd, NumpyBackend())


def _shapes(layers) -> set[tuple[int, ...]]:
    return {tuple(a.shape) for kv in layers for a in kv}


def test_a_cache_defaults_to_one_sequence_of_the_whole_context(model):
    c = model.config
    for cache in (new_cache(model.kernels, c), model.new_cache()):
        assert (cache.capacity, cache.length, len(cache.layers)) == (c.n_positions, 0, c.n_layer)
        assert _shapes(cache.layers) == {(1, c.n_head, c.n_positions, c.head_dim)}


def test_a_cache_of_a_given_batch_and_capacity(model):
    c = model.config
    cache = new_cache(model.kernels, c, 3, 7)
    assert (cache.capacity, len(cache.layers)) == (7, c.n_layer)
    assert _shapes(cache.layers) == {(3, c.n_head, 7, c.head_dim)}


def test_slots_hold_the_whole_context_each(model):
    c = model.config
    slots = new_slots(model.kernels, c, 3)
    assert (slots.capacity, slots.n_slots, len(slots.layers)) == (c.n_positions, 3, c.n_layer)
    assert all(len(layer) == 3 for layer in slots.layers)
    every = [kv for layer in slots.layers for kv in layer]
    assert _shapes(every) == {(1, c.n_head, c.n_positions, c.head_dim)}
    assert slot_bytes(c) == 2 * c.n_layer * c.n_positions * c.n_embd * 4
    assert slot_bytes(c, 2) == slot_bytes(c) // 2


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm (Linux)")
def test_a_slot_costs_the_memory_its_sequences_reach():
    # A sequence's first tokens written into each head of a layer's cache (16 heads x 16384 positions x 64:
    # 64 MB, beyond malloc's largest mmap threshold, so fresh pages): np.zeros's arrays are madvised for
    # transparent huge pages by NumPy, and each head's first write then makes 2 MB resident; the backend's
    # cache takes a page (4 KB) a head.
    def grown(make) -> int:
        a = make((1, 16, 16384, 64), np.float32)
        before = _rss()
        a[:, :, :4] = 1.0
        return _rss() - before

    huge = grown(np.zeros)
    if huge < 8 << 20:
        pytest.skip(f"this kernel gives np.zeros no huge pages ({huge >> 10} KB for 16 writes): "
                    "nothing to tell apart")
    k, v = NumpyBackend().new_kv_cache(1, 16, 16384, 64)
    assert k.flags.writeable and k.flags.c_contiguous and not k.any() and not v.any()
    assert grown(lambda shape, dtype: NumpyBackend().new_kv_cache(*shape)[0]) < 1 << 20
