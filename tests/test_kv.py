"""The KV cache and slots (inferno/kv.py): their sizes and the shape of every layer's arrays, from the
backend through the checked wrapper."""

from __future__ import annotations

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
