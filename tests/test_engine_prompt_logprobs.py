"""Prompt logprobs from the engine (`Engine.submit_many(..., prompt_logprobs=N)`): each prompt token's
logprob and top N, as `score_ids` gives them, computed while the prompt is prefilled in the engine's
ragged steps beside other sequences (the server's ``echo`` with ``logprobs`` uses them)."""

from __future__ import annotations

import pytest

from inferno.backends.numpy_backend import NumpyBackend
from inferno.engine import Engine, EngineError
from inferno.models.gpt2 import Gpt2
from inferno.options import GenerationOptions
from inferno.scoring import score_ids
from inferno.testing import DISTINCT, random_state_dict, small_config

#: Batched rows differ from a batch-1 forward by float32 rounding only (relative: of the order of 1e-7;
#: this random model's logprobs reach -20, as tests/test_prefix_cache.py's do).
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def model() -> Gpt2:
    config = small_config(vocab_size=64, n_positions=64, n_embd=32, n_layer=2, n_head=2)
    return Gpt2.from_weights(config, random_state_dict(config, 5, **DISTINCT), NumpyBackend())


def _same_as_scoring(model: Gpt2, prompt: list[int], got, top: int) -> None:
    want = score_ids(model, prompt, top_logprobs_n=top) if len(prompt) > 1 else None
    assert got[0] is None and len(got) == len(prompt)
    for k in range(1, len(prompt)):
        assert got[k].id == prompt[k]
        assert got[k].logprob == pytest.approx(want.logprobs[k], abs=TOLERANCE)
        if top:
            assert [i for i, _ in got[k].top] == [i for i, _ in want.top[k]]
            assert [lp for _, lp in got[k].top] == pytest.approx([lp for _, lp in want.top[k]], abs=TOLERANCE)
        else:
            assert got[k].top == []


def _run(engine: Engine) -> None:
    steps = 0
    while engine.running or engine.waiting:
        engine.step()
        steps += 1
        assert steps < 500


@pytest.mark.parametrize("chunk", [3, 64])
def test_prompt_logprobs_are_the_scores_in_chunks_beside_other_sequences(model, chunk):
    engine = Engine(model, slots=3, prefill_chunk=chunk, autostart=False)
    other = engine.submit([1, 2, 3], 12)  # decoding while the scored prompts prefill
    engine.step()
    prompts = [[5, 9, 13, 2, 40, 41, 7, 7, 30, 11], [8, 3]]
    scored = [engine.submit(p, 2, prompt_logprobs=k) for p, k in zip(prompts, (2, 0), strict=True)]
    rows_before = engine.stats.rows
    engine.step()
    # The running sequence decodes beside the prompt chunks (a chunk of 3 holds one prompt's first three).
    assert engine.stats.rows - rows_before == (2 if chunk == 3 else 3)
    _run(engine)
    for p, h, k in zip(prompts, scored, (2, 0), strict=True):
        assert h.finish_reason == "length" and len(h.state.ids) == 2
        _same_as_scoring(model, p, h.prompt_logprobs, k)
    assert other.prompt_logprobs is None and len(other.state.ids) == 12


def test_a_scored_prompt_generates_what_an_unscored_one_does(model):
    prompt = [4, 8, 15, 16, 23, 42]
    engine = Engine(model, slots=2, prefill_chunk=4, autostart=False)
    plain = engine.submit(prompt, 6, GenerationOptions(temperature=0.0, logprobs=1))
    _run(engine)
    scored = engine.submit(prompt, 6, GenerationOptions(temperature=0.0, logprobs=1), prompt_logprobs=1)
    _run(engine)
    assert scored.state.ids == plain.state.ids
    assert [s.logprob for s in scored.state.logprobs] == pytest.approx(
        [s.logprob for s in plain.state.logprobs], abs=TOLERANCE)


def test_a_cached_prefix_is_prefilled_again_for_its_logits(model):
    prompt = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    engine = Engine(model, slots=2, prefill_chunk=64, prefix_block=4, autostart=False)
    engine.submit(prompt, 1)
    _run(engine)
    hits = engine.stats.prefix_cache_hits
    before = engine.stats.prompt_tokens
    h = engine.submit(prompt, 1, prompt_logprobs=3)
    _run(engine)
    assert engine.stats.prefix_cache_hits == hits and engine.stats.prompt_tokens - before == len(prompt)
    _same_as_scoring(model, prompt, h.prompt_logprobs, 3)


def test_max_tokens_0_scores_the_prompt_and_ends_for_every_choice(model):
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    engine = Engine(model, slots=2, prefill_chunk=3, autostart=False)
    handles = engine.submit_many(prompt, 0, [GenerationOptions(), GenerationOptions(seed=1)],
                                 prompt_logprobs=2)
    _run(engine)
    for h in handles:
        assert h.done and h.finish_reason == "length" and h.state.ids == [] and h.error is None
        _same_as_scoring(model, prompt, h.prompt_logprobs, 2)
    assert engine.free_slots == 2
    # Without prompt logprobs nothing is run at all.
    before = engine.stats.prompt_tokens
    assert engine.submit(prompt, 0).finish_reason == "length" and engine.stats.prompt_tokens == before


def test_a_one_token_prompt_has_one_null_entry(model):
    engine = Engine(model, slots=1, autostart=False)
    h = engine.submit([7], 0, prompt_logprobs=5)
    _run(engine)
    assert h.prompt_logprobs == [None] and h.finish_reason == "length"


def test_prompt_logprobs_arrive_before_the_first_step(model):
    engine = Engine(model, slots=1, autostart=False)
    h = engine.submit([2, 7, 1, 8], 3, prompt_logprobs=0)
    seen = []
    for _ in range(2):
        engine.step()
    h.add_done_callback(lambda handle: seen.append(handle.prompt_logprobs))
    _run(engine)
    assert seen and seen[0] is not None
    assert next(iter(h)).id == h.state.ids[0]  # the steps are there to read after


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_a_bad_prompt_logprobs_is_refused(model, bad):
    engine = Engine(model, slots=1, autostart=False)
    with pytest.raises(EngineError, match="prompt_logprobs must be an integer >= 0"):
        engine.submit([1, 2], 1, prompt_logprobs=bad)
