"""Automatic prefix caching in the engine (inferno/engine.py): a prompt reuses the longest cached prefix
of a KV slot (in place, or copied from another slot) and prefills only the rest, with the same tokens as
without the cache; evictions are least recently used first; the counters say what was reused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferno.backends.numpy_backend import NumpyBackend
from inferno.engine import Engine, PrefixIndex, block_hashes
from inferno.generate import generate_tokens
from inferno.models.gpt2 import Gpt2
from inferno.options import GenerationOptions
from inferno.testing import DISTINCT, random_state_dict, small_config

BLOCK = 4
LOGPROB_TOLERANCE = 1e-4  # batched rows differ from each other by float32 rounding only


@pytest.fixture(scope="module")
def model() -> Gpt2:
    config = small_config(vocab_size=64, n_positions=64, n_embd=32, n_layer=2, n_head=2)
    return Gpt2.from_weights(config, random_state_dict(config, 3, **DISTINCT), NumpyBackend())


def _run(engine: Engine, requests, cancel_after: dict[int, int]) -> list:
    """Submit `requests` (prompt, max_new_tokens, options) a few per step, cancel request i after
    `cancel_after[i]` steps, run to the end; the handles in order."""
    handles, steps = [], 0
    pending = list(requests)
    while pending or engine.running or engine.waiting:
        for _ in range(2):  # two submissions per step: sequences join mid-way
            if pending:
                prompt, n, options = pending.pop(0)
                handles.append(engine.submit(prompt, n, options))
        for i, h in enumerate(handles):
            if cancel_after.get(i) == steps:
                h.cancel()
        engine.step()
        steps += 1
        assert steps < 1000
    return handles


requests_strategy = st.integers(0, 2**31 - 1)


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=requests_strategy, slots=st.integers(1, 3), n_bases=st.integers(1, 5),
       n_requests=st.integers(1, 10), chunk=st.sampled_from([3, 8, 64]))
def test_the_same_tokens_with_and_without_the_cache(model, seed, slots, n_bases, n_requests, chunk):
    # Random mixes of prompts sharing prefixes (more distinct prefixes than slots: evictions), greedy and
    # sampled, some cancelled: every finished request gets the tokens (and logprobs) it gets without the
    # cache and alone; a cancelled one a prefix of them.
    rng = np.random.default_rng(seed)
    bases = [rng.integers(0, 63, rng.integers(0, 24)).tolist() for _ in range(n_bases)]
    requests = []
    for _ in range(n_requests):
        prompt = bases[rng.integers(n_bases)] + rng.integers(0, 63, rng.integers(1, 6)).tolist()
        sampled = rng.random() < 0.4
        options = GenerationOptions(temperature=0.9 if sampled else 0.0, seed=int(rng.integers(1000)),
                                    logprobs=2, repetition_penalty=1.3 if rng.random() < 0.3 else 1.0)
        requests.append((prompt, int(rng.integers(1, 6)), options))
    cancel_after = {int(i): int(rng.integers(0, 4)) for i in rng.choice(n_requests, n_requests // 4,
                                                                          replace=False)}

    cached = Engine(model, slots=slots, prefill_chunk=chunk, prefix_block=BLOCK, autostart=False)
    plain = Engine(model, slots=slots, prefill_chunk=chunk, no_prefix_cache=True, autostart=False)
    with_cache = _run(cached, requests, cancel_after)
    without = _run(plain, requests, {})
    for i, (a, b, (prompt, n, options)) in enumerate(zip(with_cache, without, requests, strict=True)):
        alone = generate_tokens(model, prompt, n, options)
        alone_ids = list(alone)
        assert b.state.ids == alone_ids
        ids = a.state.ids
        if a.finish_reason == "cancelled":
            assert ids == alone_ids[: len(ids)], f"request {i}"
            continue
        assert ids == alone_ids, f"request {i}: {prompt}"
        for x, y in zip(a.state.logprobs, b.state.logprobs, strict=True):
            assert x.logprob == pytest.approx(y.logprob, abs=LOGPROB_TOLERANCE)
            assert [t for t, _ in x.top] == [t for t, _ in y.top]
    assert cached.stats.prefix_cache_hits <= cached.stats.prefix_cache_queries
    assert plain.stats.prefix_cache_queries == 0
    # Nothing leaks: every slot is free again, once each.
    assert sorted(cached.free_slot_ids()) == list(range(slots))


def _finish(engine: Engine, handle) -> None:
    while not handle.done:
        engine.step()


def test_a_shared_prefix_is_reused_in_place(model):
    engine = Engine(model, slots=2, prefix_block=BLOCK, autostart=False)
    context = list(range(1, 18))  # 17 tokens: four whole blocks
    first = engine.submit(context + [30], 3)
    _finish(engine, first)
    slot = engine.free_slot_ids()[-1]  # the slot it used: freed last, so taken last
    assert engine.stats.prefix_cache_hits == 0
    prefilled = engine.stats.prompt_tokens
    second = engine.submit(context + [40, 41], 3)
    engine.step()
    (running,) = engine.running_sequences()
    assert running.slot == slot  # the very slot that holds the prefix: no copy
    assert engine.stats.prefix_cache_hits == 16
    assert engine.stats.prefix_cache_copies == 0
    assert engine.stats.prompt_tokens - prefilled == len(context) + 2 - 16
    _finish(engine, second)
    assert second.state.ids == list(generate_tokens(model, context + [40, 41], 3))


def test_a_prefix_held_by_a_running_sequence_is_copied(model):
    engine = Engine(model, slots=2, prefix_block=BLOCK, autostart=False)
    context = list(range(5, 21))  # 16 tokens
    first = engine.submit(context + [1], 20)
    engine.step()  # prefilled; running
    second = engine.submit(context + [2, 3], 4)
    engine.step()
    slots = {r.handle.id: r.slot for r in engine.running_sequences()}
    assert slots[first.id] != slots[second.id]
    assert engine.stats.prefix_cache_hits == 16 and engine.stats.prefix_cache_copies == 1
    _finish(engine, second)
    _finish(engine, first)
    assert second.state.ids == list(generate_tokens(model, context + [2, 3], 4))
    assert first.state.ids == list(generate_tokens(model, context + [1], 20))


def test_the_whole_prompt_cached_still_runs_its_last_token(model):
    engine = Engine(model, slots=1, prefix_block=BLOCK, autostart=False)
    prompt = list(range(8))  # two whole blocks
    a = engine.submit(prompt, 2)
    _finish(engine, a)
    b = engine.submit(prompt, 2)
    _finish(engine, b)
    assert engine.stats.prefix_cache_hits == 7  # the 8th is run again: its logits choose the first token
    assert a.state.ids == b.state.ids


def test_free_slots_are_overwritten_least_recently_used_first(model):
    engine = Engine(model, slots=3, prefix_block=BLOCK, autostart=False)
    prompts = [[i] * 9 for i in (1, 2, 3)]
    for p in prompts:
        _finish(engine, engine.submit(p, 1))
    # Slot of prompt 1 was freed first: a new prefix overwrites it, and prompts 2 and 3 stay cached.
    _finish(engine, engine.submit([9] * 9, 1))
    hits = engine.stats.prefix_cache_hits
    _finish(engine, engine.submit(prompts[1] + [5], 1))
    _finish(engine, engine.submit(prompts[2] + [5], 1))
    assert engine.stats.prefix_cache_hits - hits == 16
    hits = engine.stats.prefix_cache_hits
    _finish(engine, engine.submit(prompts[0] + [5], 1))
    assert engine.stats.prefix_cache_hits == hits  # evicted


def test_no_prefix_cache_prefills_everything(model):
    engine = Engine(model, slots=1, no_prefix_cache=True, autostart=False)
    for _ in range(2):
        _finish(engine, engine.submit(list(range(40)), 1))
    assert engine.stats.prompt_tokens == 80
    assert engine.stats.prefix_cache_hits == engine.stats.prefix_cache_queries == 0


def test_n_sequences_of_a_cached_prompt(model):
    engine = Engine(model, slots=3, prefix_block=BLOCK, autostart=False)
    prompt = list(range(3, 23))
    _finish(engine, engine.submit(prompt, 1))
    options = [GenerationOptions(temperature=1.0, seed=s) for s in (1, 2, 3)]
    handles = engine.submit_many(prompt, 4, options)
    while not all(h.done for h in handles):
        engine.step()
    assert engine.stats.prefix_cache_hits == 19  # five whole blocks, less the last token
    for h, o in zip(handles, options, strict=True):
        assert h.state.ids == list(generate_tokens(model, prompt, 4, o))


def test_block_hashes_chain_and_the_index_checks_the_ids():
    assert block_hashes([1, 2, 3, 4, 5], 2) == block_hashes([1, 2, 3, 4], 2)
    a, b = block_hashes([1, 2, 3, 4], 2), block_hashes([9, 9, 3, 4], 2)
    assert a[1] != b[1]  # the same block after a different prefix
    index = PrefixIndex(2, 2)
    index.write(0, 0, [1, 2, 3, 4, 5])
    assert index.longest([1, 2, 3, 4, 7]) == (0, 4)
    assert index.longest([1, 2, 3, 9]) == (0, 2)
    assert index.longest([7, 2]) == (-1, 0)
    index.write(1, 0, [1, 2, 3])
    assert index.longest([1, 2, 3, 4], prefer=[1]) == (0, 4)
    assert index.longest([1, 2, 8], prefer=[1]) == (1, 2)
    index.truncate(0, 3)
    assert index.longest([1, 2, 3, 4]) in {(0, 2), (1, 2)}
    # A colliding hash cannot serve wrong ids: the ids are compared.
    index.slots_of[block_hashes([5, 5], 2)[0]] = {0}
    assert index.longest([5, 5, 1]) == (-1, 0)


def test_requests_sent_together_prefill_their_shared_context_once(model):
    engine = Engine(model, slots=4, prefill_chunk=8, prefix_block=BLOCK, autostart=False)
    context = list(range(1, 33))
    prompts = [context + [40 + i] * (i + 1) for i in range(4)]
    handles = [engine.submit(p, 3) for p in prompts]
    while not all(h.done for h in handles):
        engine.step()
    assert engine.stats.prompt_tokens == 32 + sum(range(1, 5))
    assert engine.stats.prefix_cache_hits == 3 * 32
    for h, p in zip(handles, prompts, strict=True):
        assert h.state.ids == list(generate_tokens(model, p, 3))


@pytest.mark.parametrize("when", [0, 2])
def test_a_cancelled_source_leaves_the_waiting_sequences_to_prefill_the_rest(model, when):
    engine = Engine(model, slots=3, prefill_chunk=8, prefix_block=BLOCK, autostart=False)
    context = list(range(1, 33))
    first = engine.submit(context + [50], 4)
    others = [engine.submit(context + [51 + i], 4) for i in range(2)]
    for _ in range(when):
        engine.step()
    first.cancel()
    while not all(h.done for h in others):
        engine.step()
    assert first.finish_reason == "cancelled"
    for i, h in enumerate(others):
        assert h.state.ids == list(generate_tokens(model, context + [51 + i], 4))
    assert sorted(engine.free_slot_ids()) == [0, 1, 2]
