"""Speculative decoding (inferno/speculative.py): greedy output is the plain loop's, token for token,
with every option (stop ids and strings inside a draft, penalties, logit bias, logprobs from the
target); sampled output has the target's distribution (chi-square on the next tokens); drafts come
from prompt lookup or a draft model with the same vocabulary; K adapts."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest

from inferno.backends.numpy_backend import NumpyBackend
from inferno.generate import generate_tokens
from inferno.models.gpt2 import Gpt2
from inferno.options import GenerationOptions
from inferno.speculative import (
    MAX_SPECULATIVE_TOKENS,
    NgramDrafter,
    SpeculationError,
    check_draft_model,
)
from inferno.testing import random_state_dict, small_config


def _model(vocab: int, seed: int, n_positions: int = 64, n_embd: int = 32) -> Gpt2:
    config = small_config(vocab_size=vocab, n_positions=n_positions, n_embd=n_embd, n_layer=2, n_head=2)
    return Gpt2.from_weights(config, random_state_dict(config, seed), NumpyBackend())


class Chars:
    """A decoder for stop strings: token i is the letter chr(97 + i % 26)."""

    def feed(self, token_id: int) -> str:
        return chr(97 + token_id % 26)

    def flush(self) -> str:
        return ""


@pytest.fixture(scope="module")
def target() -> Gpt2:
    return _model(32, 1)


@pytest.fixture(scope="module")
def draft() -> Gpt2:
    return _model(32, 2)


def _options(rng: np.random.Generator) -> GenerationOptions:
    kind = rng.integers(5)
    if kind == 0:
        return GenerationOptions(stop_ids=[int(rng.integers(32))])
    if kind == 1:
        return GenerationOptions(repetition_penalty=1.5, frequency_penalty=0.5, presence_penalty=0.3)
    if kind == 2:
        return GenerationOptions(logit_bias={int(rng.integers(32)): 5.0, int(rng.integers(32)): -100})
    if kind == 3:
        return GenerationOptions(stop=["".join(chr(97 + int(i)) for i in rng.integers(0, 6, 2))],
                                 logprobs=3)
    return GenerationOptions(logprobs=2)


def _sweep(target: Gpt2, draft: Gpt2, n_prompts: int, seed: int) -> int:
    rng = np.random.default_rng(seed)
    compared = 0
    for _ in range(n_prompts):
        vocab = int(rng.choice([6, 32]))  # a small alphabet repeats itself: long n-gram drafts
        prompt = rng.integers(0, vocab, rng.integers(1, 24)).tolist()
        options = _options(rng)
        n = int(rng.integers(1, 30))
        plain = generate_tokens(target, prompt, n, options, decoder=Chars())
        steps = list(plain.steps())
        for kw in ({"speculative": "ngram"}, {"draft_model": draft}, {"draft_model": target},
                   {"speculative": "ngram", "num_speculative_tokens": 1, "adaptive": False}):
            spec = generate_tokens(target, prompt, n, options, decoder=Chars(), **kw)
            got = list(spec.steps())
            what = f"{kw} prompt {prompt} options {options}"
            assert [s.id for s in got] == [s.id for s in steps], what
            assert [s.text for s in got] == [s.text for s in steps], what
            assert spec.finish_reason == plain.finish_reason and spec.result().text == plain.result().text
            assert spec.state.stop_reason == plain.state.stop_reason
            if options.logprobs is not None:
                for a, b in zip(spec.state.logprobs, plain.state.logprobs, strict=True):
                    assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
                    assert [i for i, _ in a.top] == [i for i, _ in b.top]
            compared += 1
    return compared


def test_greedy_output_is_the_plain_loops(target, draft):
    assert _sweep(target, draft, 20, seed=0) == 80


@pytest.mark.slow
def test_greedy_output_is_the_plain_loops_on_1000_prompts(target, draft):
    other = _model(32, 7, n_positions=48, n_embd=16)  # a draft with a shorter context
    assert _sweep(target, draft, 700, seed=1) == 2800
    assert _sweep(target, other, 400, seed=2) == 1600


def test_a_draft_equal_to_the_target_is_always_accepted_and_k_grows(target):
    stream = generate_tokens(target, [1, 2, 3], 40, draft_model=target, num_speculative_tokens=2)
    ids = list(stream)
    stats = stream.speculation.stats
    assert ids == list(generate_tokens(target, [1, 2, 3], 40))
    assert stats.drafted > 0 and stats.accepted == stats.drafted
    assert max(len(stats.drafted_at), 0) > 2  # K grew past its first value
    assert stats.rounds < len(ids) - 1  # fewer target forwards than tokens


def test_rejected_drafts_shrink_k_and_are_counted_per_position(target, draft):
    stream = generate_tokens(target, list(range(20)), 40, draft_model=draft, num_speculative_tokens=6)
    list(stream)
    s = stream.speculation.stats
    assert s.accepted < s.drafted
    assert s.drafted_at[0] == s.rounds
    assert all(a <= d for a, d in zip(s.accepted_at, s.drafted_at, strict=True))
    assert s.accepted == sum(s.accepted_at)
    assert 0 < s.acceptance_rate < 1


def test_prompt_lookup_finds_the_longest_latest_suffix():
    drafter = NgramDrafter(max_ngram=3)
    assert drafter.draft([1, 2, 3, 4, 9, 2, 3, 4, 7, 8, 2, 3, 4], 2)[0] == [7, 8]  # latest of 3-grams
    assert drafter.draft([5, 1, 2, 6, 1, 2], 5)[0] == [6, 1, 2]  # the continuation runs to the end
    assert drafter.draft([1, 2, 3], 4) == ([], [])
    assert drafter.draft([7], 4) == ([], [])
    assert NgramDrafter(1).draft([4, 5, 4, 6, 4], 1)[0] == [6]


def test_refusals_are_one_line(target):
    small = _model(16, 3)
    with pytest.raises(SpeculationError, match="vocabulary of 16 tokens, the target's has 32"):
        check_draft_model(target, small)
    with pytest.raises(SpeculationError, match="vocabulary"):
        generate_tokens(target, [1], 4, draft_model=small)
    with pytest.raises(SpeculationError, match="one of ngram, draft"):
        generate_tokens(target, [1], 4, speculative="medusa")
    with pytest.raises(SpeculationError, match="needs a draft model"):
        generate_tokens(target, [1], 4, speculative="draft")
    with pytest.raises(SpeculationError, match=r"num_speculative_tokens must be an integer in \[1, "):
        generate_tokens(target, [1], 4, speculative="ngram",
                        num_speculative_tokens=MAX_SPECULATIVE_TOKENS + 1)


def _chi2_critical(df: int, z: float = 3.29) -> float:
    """The chi-square quantile at the normal quantile z (3.29: p = 0.0005), by Wilson-Hilferty."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _probs(model: Gpt2, ids: list[int]) -> np.ndarray:
    z = model.backend.to_numpy(model.forward(np.asarray([ids])))[0].astype(np.float64)
    p = np.exp(z - z.max())
    return p / p.sum()


def _exact_next_three(model: Gpt2, prompt: list[int]) -> np.ndarray:
    """P(first, second, third new token | prompt) at temperature 1, from full forward passes."""
    v = model.config.vocab_size
    out = np.zeros((v, v, v))
    p1 = _probs(model, prompt)
    for a in range(v):
        p2 = _probs(model, prompt + [a])
        for b in range(v):
            out[a, b] = p1[a] * p2[b] * _probs(model, prompt + [a, b])
    return out


class Recomputed:
    """A model's logits for each context, computed from the whole context once and remembered, behind
    the interface the speculative loop uses (`new_cache`, `forward` appending at `cache.length`,
    `check_logits`): the cache semantics it relies on (a rollback sets `length`; what lies past it is
    overwritten) hold as in a KV cache, and 100k samples take seconds rather than 100k forward runs."""

    def __init__(self, model: Gpt2) -> None:
        self.model, self.config, self.backend = model, model.config, model.backend
        self._rows: dict[tuple[int, ...], np.ndarray] = {}

    def new_cache(self, batch: int, length: int):
        return types.SimpleNamespace(length=0, ids=[])

    def _row(self, context: tuple[int, ...]) -> np.ndarray:
        if context not in self._rows:
            self._rows[context] = self.model.backend.to_numpy(self.model.forward(np.asarray([context])))[0]
        return self._rows[context]

    def forward(self, ids, cache, *, all_logits: bool = False):
        new = [int(i) for i in np.asarray(ids)[0]]
        cache.ids = cache.ids[: cache.length] + new
        cache.length += len(new)
        rows = np.stack([self._row(tuple(cache.ids[: cache.length - len(new) + i + 1]))
                         for i in range(len(new))])
        return rows[None] if all_logits else rows[-1:]

    def check_logits(self, logits: np.ndarray, rows: int = 1) -> np.ndarray:
        return self.model.check_logits(logits, rows)


def _chi2_of_sampling(samples: int, draft: bool, recompute: bool = False) -> tuple[float, float]:
    # The first token is drawn before any draft; the second and third come from the round that verifies
    # two drafts (K = 2, fixed): the joint of all three is compared with the target's.
    target, drafter = _model(5, 11, n_embd=16), _model(5, 12, n_embd=16)
    if recompute:
        target, drafter = Recomputed(target), Recomputed(drafter)
    prompt = [0, 1, 2, 0, 1, 2, 3]
    expected = _exact_next_three(getattr(target, "model", target), prompt).ravel() * samples
    counts = np.zeros_like(expected)
    kw = {"draft_model": drafter} if draft else {"speculative": "ngram"}
    drafted = 0
    for seed in range(samples):
        o = GenerationOptions(temperature=1.0, seed=seed)
        stream = generate_tokens(target, prompt, 3 + 1, o, num_speculative_tokens=2, adaptive=False, **kw)
        a, b, c = list(stream)[:3]
        counts[(a * 5 + b) * 5 + c] += 1
        drafted += stream.speculation.stats.drafted
    assert drafted >= samples  # the round did verify drafts
    keep = expected >= 5  # cells expected fewer than 5 times are pooled into one
    e = np.append(expected[keep], expected[~keep].sum())
    n = np.append(counts[keep], counts[~keep].sum())
    chi2 = float(((n - e) ** 2 / e).sum())
    return chi2, _chi2_critical(len(e) - 1)


@pytest.mark.parametrize("draft", [True, False], ids=["draft-model", "ngram"])
def test_sampling_keeps_the_targets_distribution(draft):
    chi2, critical = _chi2_of_sampling(800, draft=draft)
    assert chi2 < critical


def test_the_recomputing_stand_in_draws_what_the_model_draws():
    # The 100k-sample test below runs on `Recomputed`: it must give the very draws of the model itself.
    target, drafter = _model(5, 11, n_embd=16), _model(5, 12, n_embd=16)
    prompt = [0, 1, 2, 0, 1, 2, 3]
    for kw, stand_in in (({"draft_model": drafter}, {"draft_model": Recomputed(drafter)}),
                         ({"speculative": "ngram"}, {"speculative": "ngram"})):
        for seed in range(40):
            o = GenerationOptions(temperature=1.0, seed=seed)
            real = list(generate_tokens(target, prompt, 5, o, num_speculative_tokens=2, **kw))
            assert list(generate_tokens(Recomputed(target), prompt, 5, o, num_speculative_tokens=2,
                                        **stand_in)) == real


@pytest.mark.slow
@pytest.mark.parametrize("draft", [True, False], ids=["draft-model", "ngram"])
def test_sampling_keeps_the_targets_distribution_over_100k_samples(draft):
    chi2, critical = _chi2_of_sampling(100_000, draft=draft, recompute=True)
    assert chi2 < critical


def test_the_pipeline_speculates_with_a_named_draft_or_by_prompt_lookup():
    import inferno

    pipe = inferno.load("random:tiny")
    prompt = "one two three one two three one two"
    plain = pipe.generate(prompt, max_new_tokens=12, logprobs=2)
    for kw in ({"speculative": "ngram"}, {"draft_model": "random:tiny"}, {"draft_model": pipe}):
        spec = pipe.generate(prompt, max_new_tokens=12, logprobs=2, num_speculative_tokens=3, **kw)
        assert spec.ids == plain.ids and spec.text == plain.text
        assert [lp.id for lp in spec.logprobs] == [lp.id for lp in plain.logprobs]
    assert pipe.draft("random:tiny") is pipe.draft("random:tiny")  # loaded once


def test_the_cli_flags(tmp_path):
    from cli_helpers import assert_one_line_error, offline_env, run_inferno

    env = offline_env(tmp_path)
    base = ["-m", "random:tiny", "a b a b a b", "-n", "6", "--json"]
    plain = run_inferno(base, env)
    assert plain.returncode == 0, plain.stderr
    for flags in (["--speculate", "ngram"],
                  ["--draft-model", "random:tiny", "--num-speculative-tokens", "2"]):
        spec = run_inferno(base + flags, env)
        assert spec.returncode == 0, spec.stderr
        assert json_ids(spec.stdout) == json_ids(plain.stdout)
    assert_one_line_error(run_inferno(base + ["--speculate", "ngram", "--num-speculative-tokens", "0"], env),
                          "--num-speculative-tokens: must be an integer in [1, 16], got 0")
    assert_one_line_error(run_inferno(base + ["--speculate", "ngram", "--draft-model", "random:tiny"], env),
                          "--draft-model:")


def json_ids(stdout: str) -> list[int]:
    import json

    return json.loads(stdout)["ids"]
