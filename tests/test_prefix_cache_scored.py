"""The prefix cache for scored prompts (`prompt_logprobs`, the server's echo with logprobs): a scored
prefill leaves its tokens' logprobs with the slot (`PrefixIndex.set_scores`), and a later scored prompt
that shares the prefix reuses its keys and values and those logprobs, running only the last cached token
again (its logits score the first token after the prefix). Everything equals a run without the cache."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferno.backends.numpy_backend import NumpyBackend
from inferno.engine import Engine, PrefixIndex
from inferno.generate import generate_tokens
from inferno.models.gpt2 import Gpt2
from inferno.options import GenerationOptions, TokenLogprob
from inferno.scoring import score_ids
from inferno.testing import DISTINCT, random_state_dict, small_config

BLOCK = 4
TOLERANCE = 1e-4  # batched rows differ from a batch-1 forward by float32 rounding only


@pytest.fixture(scope="module")
def model() -> Gpt2:
    config = small_config(vocab_size=64, n_positions=64, n_embd=32, n_layer=2, n_head=2)
    return Gpt2.from_weights(config, random_state_dict(config, 3, **DISTINCT), NumpyBackend())


def _run(engine: Engine) -> None:
    steps = 0
    while engine.running or engine.waiting:
        engine.step()
        steps += 1
        assert steps < 1000


def _same_logprobs(got, want) -> None:
    assert len(got) == len(want) and got[0] is None and want[0] is None
    for a, b in zip(got[1:], want[1:], strict=True):
        assert a.id == b.id
        assert a.logprob == pytest.approx(b.logprob, abs=TOLERANCE)
        assert [i for i, _ in a.top] == [i for i, _ in b.top]
        assert [lp for _, lp in a.top] == pytest.approx([lp for _, lp in b.top], abs=TOLERANCE)


def _as_scoring(model: Gpt2, prompt: list[int], got, top: int) -> None:
    s = score_ids(model, prompt, top_logprobs_n=top)
    want = [None] + [TokenLogprob(prompt[k], s.logprobs[k], list(s.top[k]) if top else [])
                     for k in range(1, len(prompt))]
    _same_logprobs(got, want)


def test_a_scored_prompt_reuses_a_scored_prefix_and_its_logprobs(model):
    engine = Engine(model, slots=2, prefill_chunk=64, prefix_block=BLOCK, autostart=False)
    context = list(range(1, 18))  # 17 tokens: four whole blocks
    first = engine.submit(context + [30], 0, prompt_logprobs=2)
    _run(engine)
    before = engine.stats.prompt_tokens
    second = engine.submit(context + [40, 41], 0, prompt_logprobs=2)
    _run(engine)
    # 16 tokens cached; the 16th runs again for the logits that score the 17th.
    assert engine.stats.prefix_cache_hits == 15
    assert engine.stats.prompt_tokens - before == len(context) + 2 - 15
    _as_scoring(model, context + [30], first.prompt_logprobs, 2)
    _as_scoring(model, context + [40, 41], second.prompt_logprobs, 2)


def test_fewer_alternatives_reuse_more_do_not(model):
    engine = Engine(model, slots=2, prefix_block=BLOCK, autostart=False)
    context = list(range(20, 33))  # 13 tokens: three whole blocks
    _run_one = lambda p, top: (engine.submit(p, 0, prompt_logprobs=top), _run(engine))[0]  # noqa: E731
    _run_one(context + [1], 3)
    hits = engine.stats.prefix_cache_hits
    fewer = _run_one(context + [2], 1)
    assert engine.stats.prefix_cache_hits - hits == 11
    assert all(len(t.top) == 1 for t in fewer.prompt_logprobs[1:])
    _as_scoring(model, context + [2], fewer.prompt_logprobs, 1)
    # The slot now holds top-1 logprobs: a top-3 prompt cannot use them and prefills in full.
    engine2 = Engine(model, slots=1, prefix_block=BLOCK, autostart=False)
    engine2.submit(context + [1], 0, prompt_logprobs=1)
    _run(engine2)
    hits, before = engine2.stats.prefix_cache_hits, engine2.stats.prompt_tokens
    more = engine2.submit(context + [2], 0, prompt_logprobs=3)
    _run(engine2)
    assert engine2.stats.prefix_cache_hits == hits and engine2.stats.prompt_tokens - before == 14
    _as_scoring(model, context + [2], more.prompt_logprobs, 3)


def test_an_unscored_prefill_leaves_no_logprobs_but_a_scored_one_serves_both(model):
    engine = Engine(model, slots=1, prefix_block=BLOCK, autostart=False)
    context = list(range(2, 14))  # 12 tokens
    engine.submit(context + [1], 2)
    _run(engine)
    hits = engine.stats.prefix_cache_hits
    engine.submit(context + [5], 0, prompt_logprobs=0)
    _run(engine)
    assert engine.stats.prefix_cache_hits == hits  # no logprobs cached: prefilled in full
    plain = engine.submit(context + [7], 3)  # an unscored prompt reuses a scored prefix too
    _run(engine)
    assert engine.stats.prefix_cache_hits - hits == 12
    assert plain.state.ids == list(generate_tokens(model, context + [7], 3))


def test_continuations_sent_together_score_their_context_once(model):
    # lm-eval's multiple choice: one context, four continuations, all sent at once.
    engine = Engine(model, slots=4, prefill_chunk=8, prefix_block=BLOCK, autostart=False)
    context = list(range(1, 33))
    prompts = [context + [40 + i] * (i + 1) for i in range(4)]
    handles = [engine.submit(p, 0, prompt_logprobs=1) for p in prompts]
    _run(engine)
    # The context once; each other continuation runs its last cached token again, then its own.
    assert engine.stats.prompt_tokens == 32 + 1 + sum(1 + (i + 1) for i in range(1, 4))
    for h, p in zip(handles, prompts, strict=True):
        _as_scoring(model, p, h.prompt_logprobs, 1)


def test_the_index_keeps_logprobs_only_for_the_tokens_it_holds():
    index = PrefixIndex(2, 2)
    index.write(0, 0, [1, 2, 3, 4, 5])
    scores = [TokenLogprob(t, -float(t), [(t, -float(t)), (0, -9.0)]) for t in (2, 3, 4, 5)]
    index.set_scores(0, scores, 2)
    assert index.cached_scores(0, 4, 2) == scores
    assert index.cached_scores(0, 3, 1) == [TokenLogprob(t.id, t.logprob, t.top[:1]) for t in scores[:3]]
    assert index.cached_scores(0, 2, 3) is None  # more alternatives than kept
    assert index.longest([1, 2, 3, 4, 9], scored=2) == (0, 4)
    index.truncate(0, 3)
    assert index.cached_scores(0, 2, 2) == scores[:2] and index.cached_scores(0, 3, 2) is None
    # A slot whose logprobs do not reach the block's end does not serve a scored prompt.
    assert index.longest([1, 2, 3, 9], scored=0) == (0, 2)
    index.write(1, 0, [1, 2, 3, 4])
    assert index.longest([1, 2, 3, 4, 7], scored=0) == (0, 2)
    assert index.longest([1, 2, 3, 4, 7]) == (1, 4)


@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), slots=st.integers(1, 3), chunk=st.sampled_from([3, 8, 64]))
def test_scored_and_plain_mixes_equal_a_run_without_the_cache(model, seed, slots, chunk):
    # Random mixes of scored (0-3 alternatives) and unscored prompts sharing prefixes, more prefixes
    # than slots, some sent together, some cancelled: the same prompt logprobs and tokens as without it.
    rng = np.random.default_rng(seed)
    # Half the contexts end at a block's end: the token after the cached prefix then differs.
    sizes = [int(rng.integers(0, 5)) * BLOCK if rng.random() < 0.5 else int(rng.integers(0, 20))
             for _ in range(int(rng.integers(1, 4)))]
    bases = [rng.integers(0, 63, size).tolist() for size in sizes]
    requests = []
    for _ in range(int(rng.integers(2, 9))):
        prompt = bases[rng.integers(len(bases))] + rng.integers(0, 63, rng.integers(1, 5)).tolist()
        top = None if rng.random() < 0.3 else int(rng.integers(0, 4))
        requests.append((prompt, int(rng.integers(0, 3)), top))
    cancel = set(rng.choice(len(requests), len(requests) // 4, replace=False).tolist())

    def run(engine: Engine) -> list:
        handles, pending, steps = [], list(requests), 0
        while pending or engine.running or engine.waiting:
            for _ in range(int(rng.integers(1, 4))):
                if pending:
                    prompt, n, top = pending.pop(0)
                    handles.append(engine.submit(prompt, n, GenerationOptions(temperature=0.0),
                                                 prompt_logprobs=top))
            if steps == 1:
                for i in cancel & set(range(len(handles))):
                    handles[i].cancel()
            engine.step()
            steps += 1
            assert steps < 1000
        return handles

    cached = run(Engine(model, slots=slots, prefill_chunk=chunk, prefix_block=BLOCK, autostart=False))
    rng = np.random.default_rng(seed + 1)
    cancel_plain = cancel
    cancel = set()  # the plain run finishes everything
    plain = run(Engine(model, slots=slots, prefill_chunk=chunk, no_prefix_cache=True, autostart=False))
    for i, (a, b, (prompt, n, top)) in enumerate(zip(cached, plain, requests, strict=True)):
        if i in cancel_plain and a.finish_reason == "cancelled":
            assert a.state.ids == b.state.ids[: len(a.state.ids)]
            continue
        assert a.state.ids == b.state.ids == list(generate_tokens(model, prompt, n)), f"request {i}"
        if top is None:
            assert a.prompt_logprobs is None
        else:
            _same_logprobs(a.prompt_logprobs, b.prompt_logprobs)
