"""Speculative decoding in the continuous-batching engine: each decode row carries its sequence's drafts,
verified in the same ragged step as the other sequences' rows. Greedy output is the plain loop's, token
for token, with every option, whatever the other sequences in the step; sampled output keeps the
target's distribution; a sequence goes on from the tokens kept (the prefix cache included); a
constrained sequence decodes without drafts; the engine counts drafts per position."""

from __future__ import annotations

import numpy as np
import pytest
from test_speculative import Chars, _chi2_critical, _exact_next_three, _model, _options

from inferno.engine import Engine
from inferno.generate import generate_tokens
from inferno.models.gpt2 import Gpt2
from inferno.options import GenerationOptions
from inferno.speculative import SpeculationError


@pytest.fixture(scope="module")
def target():
    return _model(32, 1)


@pytest.fixture(scope="module")
def draft():
    return _model(32, 2)


def _requests(n: int, seed: int) -> list[tuple[list[int], int, GenerationOptions]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        vocab = int(rng.choice([6, 32]))  # a small alphabet repeats itself: long n-gram drafts
        out.append((rng.integers(0, vocab, rng.integers(1, 24)).tolist(), int(rng.integers(1, 30)),
                    _options(rng)))
    return out


@pytest.mark.parametrize("how", ["ngram", "draft", "draft-is-target"])
def test_greedy_output_is_the_plain_loops_with_other_sequences_in_the_step(target, draft, how):
    kw = {"ngram": {"speculative": "ngram"}, "draft": {"draft_model": draft},
          "draft-is-target": {"draft_model": target}}[how]
    requests = _requests(40, seed=3)
    with Engine(target, slots=5, decoder=Chars, **kw) as engine:
        handles = [engine.submit(p, n, o) for p, n, o in requests]
        results = [h.result(timeout=60) for h in handles]
        stats = engine.stats.speculation
    assert stats.drafted > 100 and 0 < stats.accepted <= stats.drafted
    for (prompt, n, options), got, h in zip(requests, results, handles, strict=True):
        plain = generate_tokens(target, prompt, n, options, decoder=Chars())
        steps = list(plain.steps())
        what = f"prompt {prompt} options {options}"
        assert got.ids == [s.id for s in steps], what
        assert got.text == plain.result().text and got.finish_reason == plain.finish_reason, what
        assert h.state.stop_reason == plain.state.stop_reason
        if options.logprobs is not None:
            for a, b in zip(h.state.logprobs, plain.state.logprobs, strict=True):
                assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
                assert [i for i, _ in a.top] == [i for i, _ in b.top]


def test_a_prompt_continuing_an_output_reuses_its_slot_after_rejected_drafts(target, draft):
    # A draft model that disagrees often: rejected drafts are written to the slot in the step that
    # verifies them, and the sequence goes on from the tokens kept. A later prompt that continues an
    # earlier output reuses that slot's prefix and gets the plain loop's output.
    rng = np.random.default_rng(5)
    with Engine(target, slots=2, decoder=Chars, draft_model=draft, prefix_block=4) as engine:
        for _ in range(6):
            prompt = rng.integers(0, 32, 20).tolist()
            first = engine.submit(prompt, 24, GenerationOptions()).result(timeout=60)
            follow = prompt + first.ids[:20]
            hits = engine.stats.prefix_cache_hits
            got = engine.submit(follow, 10, GenerationOptions()).result(timeout=60)
            assert engine.stats.prefix_cache_hits - hits >= 32  # it did reuse the cached prefix
            assert got.ids == list(generate_tokens(target, follow, 10, GenerationOptions()))
        assert engine.stats.speculation.accepted < engine.stats.speculation.drafted  # some were rejected


def test_sampling_keeps_the_targets_distribution(target):
    # As tests/test_speculative.py checks the batch-1 loop: the joint distribution of the first three
    # new tokens, sampled through the engine with drafts from another model, against the exact one.
    small, drafter = _model(5, 11, n_embd=16), _model(5, 12, n_embd=16)
    prompt, samples = [0, 1, 2, 0, 1, 2, 3], 800
    expected = _exact_next_three(small, prompt).ravel() * samples
    counts = np.zeros_like(expected)
    with Engine(small, slots=8, draft_model=drafter, num_speculative_tokens=2, max_queue=None) as engine:
        handles = [engine.submit(prompt, 4, GenerationOptions(temperature=1.0, seed=s))
                   for s in range(samples)]
        for h in handles:
            a, b, c = h.result(timeout=120).ids[:3]
            counts[(a * 5 + b) * 5 + c] += 1
        assert engine.stats.speculation.drafted >= samples  # rounds did verify drafts
    keep = expected >= 5
    e = np.append(expected[keep], expected[~keep].sum())
    n = np.append(counts[keep], counts[~keep].sum())
    assert float(((n - e) ** 2 / e).sum()) < _chi2_critical(len(e) - 1)


def test_k_adapts_per_sequence_and_positions_are_counted(target):
    with Engine(target, slots=2, draft_model=target, num_speculative_tokens=1) as engine:
        engine.submit([1, 2, 3], 40, GenerationOptions()).result(timeout=60)
        stats = engine.stats.speculation
    # All accepted: K grows by 2 a round from 1 (1, 3, 5, ...), so later positions are drafted too.
    assert stats.drafted_at[0] == stats.rounds and len(stats.drafted_at) > 5
    assert stats.accepted_at == stats.drafted_at


def test_a_constrained_sequence_decodes_without_drafts():
    # Drafts would be verified against the unmasked target: a constrained sequence takes none, while
    # an unconstrained one in the same engine does, and the constrained output is batch one's.
    pytest.importorskip("llguidance")
    from inferno.api import Pipeline
    from inferno.backends.registry import get_backend
    from inferno.testing import random_weights, small_config
    from inferno.testing_fixtures import TOKENIZER_JSON
    from inferno.tokenizer import Tokenizer

    config = small_config(vocab_size=50257, n_positions=128, n_embd=16, n_layer=1, n_head=2)
    pipe = Pipeline(Gpt2.from_weights(config, random_weights(config, seed=3), get_backend("numpy")),
                    Tokenizer.from_file(TOKENIZER_JSON))
    ask = {"regex": r"(ab){2,9}!", "seed": 1, "temperature": 1.0}
    one = pipe.generate("ab ab ab", max_new_tokens=20, **ask)
    with pipe.engine(slots=2, speculative="ngram") as engine:
        got = pipe.submit(engine, "ab ab ab", 20, **ask).result(timeout=60)
        assert engine.stats.speculation.drafted == 0
        pipe.submit(engine, "ab ab ab ab ab ab", 20).result(timeout=60)
        assert engine.stats.speculation.drafted > 0
    assert (got.ids, got.text) == (one.ids, one.text)


def test_refusals_name_the_setting(target):
    with pytest.raises(SpeculationError, match="must be one of ngram, draft, got 'medusa'"):
        Engine(target, speculative="medusa")
    with pytest.raises(SpeculationError, match="vocabulary of 40 tokens, the target's has 32"):
        Engine(target, draft_model=_model(40, 3))
    with pytest.raises(SpeculationError, match=r"num_speculative_tokens must be an integer in \[1, 16\]"):
        Engine(target, speculative="ngram", num_speculative_tokens=0)
    with pytest.raises(SpeculationError, match="needs a draft model"):
        Engine(target, speculative="draft")


def test_the_pipelines_engine_takes_a_draft_model_by_name(tmp_path):
    import inferno
    from inferno.testing import make_llama_model

    folder = make_llama_model(tmp_path / "m", seed=3)
    pipe = inferno.load(folder, "numpy", download=False)
    with pipe.engine(slots=2, draft_model=str(folder)) as engine:  # the target drafting for itself
        got = pipe.submit(engine, "ab ab ab", 10).result(timeout=60)
        stats = engine.stats.speculation
    assert got.ids == pipe.generate("ab ab ab", max_new_tokens=10).ids
    assert stats.drafted > 0 and stats.accepted == stats.drafted
