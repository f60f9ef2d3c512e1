"""The batch-1 generation loop (inferno/generate.py) and Pipeline.generate/stream/tokens, against
references written without it: the transformers goldens, full recompute with a sampler written from
its definition (tests/reference.py), Hugging Face tokenizers for the text."""

from __future__ import annotations

import numpy as np
import pytest
from goldens import golden_model
from reference import hf_decode, reference_generate

from inferno.generate import (
    ContextLengthError,
    GenerationError,
    GenerationResult,
    check_request,
    generate_tokens,
    new_token_budget,
)
from inferno.options import GenerationOptions, OptionError
from inferno.sampling import SamplingParams

EOS = 50256
#: The first byte of the emoji 😀 (47249, then 222): alone it is an incomplete UTF-8 character.
SPLIT_CHAR_START = 47249
NEAR_TIE = 1e-4


@pytest.fixture(scope="module")
def cases():
    return golden_model("greedy")[2]["cases"]


def compared_prefix(case: dict) -> int:
    """How many golden steps to compare: up to the first near-tie."""
    gaps = case["relative_gaps"]
    return next((i for i, g in enumerate(gaps) if g < NEAR_TIE), len(gaps))


# ------------------------------------------------------------------------------ against references


def test_generate_tokens_and_stream_give_the_transformers_greedy_ids_and_their_text(pipe, cases):
    compared = 0
    for case in cases:
        n = compared_prefix(case)
        expected = case["greedy_ids"][:n]
        result = pipe.generate(case["prompt"], max_new_tokens=n, stop_at_eos=False)
        assert result.ids == expected, case["prompt"]
        assert result.prompt_ids == case["prompt_ids"]
        assert list(pipe.tokens(case["prompt"], n, stop_at_eos=False)) == expected
        assert result.text == hf_decode(expected)
        streamed = pipe.stream(case["prompt"], max_new_tokens=n, stop_at_eos=False)
        assert "".join(streamed) == hf_decode(expected)
        compared += n
    assert compared >= 12 * 28


@pytest.mark.parametrize(
    ("prompt", "kwargs"),
    [
        ("Once upon a time", dict(temperature=1.0, seed=1)),
        ("The quick brown fox", dict(temperature=0.7, top_k=40, seed=2)),
        ("import numpy as np\n", dict(temperature=1.2, top_p=0.8, seed=3)),
        ("Hello, world!", dict(temperature=0.9, top_k=20, top_p=0.5, seed=4)),
        ("A", dict(temperature=1.0, top_k=1, seed=5)),
    ],
)
def test_sampled_ids_equal_full_recompute_with_a_reference_sampler(pipe, prompt, kwargs):
    # Every step's logits fed in order: a loop sampling from the logits of the step before (stale
    # logits), from a wrong position or a wrong cache, gives other ids.
    n = 20
    expected = reference_generate(pipe, pipe.encode(prompt), n, **kwargs)
    assert pipe.generate(prompt, max_new_tokens=n, stop_at_eos=False, **kwargs).ids == expected
    assert len(set(expected)) >= 10 or kwargs.get("top_k") == 1


def test_sampling_params_are_generation_options(pipe):
    ids = pipe.encode("The capital of France is")
    params = SamplingParams(temperature=0.8, top_k=30, top_p=0.9, seed=7)
    stream = generate_tokens(pipe.model, ids, 12, params)
    assert stream.options == GenerationOptions(temperature=0.8, top_k=30, top_p=0.9, seed=7)
    assert list(stream) == reference_generate(pipe, ids, 12, temperature=0.8, top_k=30, top_p=0.9, seed=7)


def test_generate_tokens_defaults_to_greedy(pipe, cases):
    case = cases[0]
    stream = generate_tokens(pipe.model, case["prompt_ids"], 8)
    assert stream.options == GenerationOptions() and stream.stop_ids == frozenset()
    assert list(stream) == case["greedy_ids"][:8]


# ------------------------------------------------------------------------------------------ stopping


def test_stop_at_eos_through_generate_stream_and_tokens(pipe):
    forced = dict(max_new_tokens=5, logit_bias={EOS: 100})  # <|endoftext|> first, whatever the model says
    result = pipe.generate("Hello", **forced)
    assert (result.ids, result.text, result.finish_reason, result.stop_reason) == ([EOS], "", "stop", EOS)
    assert list(pipe.stream("Hello", **forced)) == []
    stream = pipe.tokens("Hello", **forced)
    assert list(stream) == [EOS] and stream.finish_reason == "stop"
    # Without stop_at_eos it is an ordinary token: its text is kept and the budget runs out.
    result = pipe.generate("Hello", stop_at_eos=False, **forced)
    assert result.ids == [EOS] * 5 and result.text == "<|endoftext|>" * 5
    assert result.finish_reason == "length" and result.stop_reason is None
    assert "".join(pipe.stream("Hello", stop_at_eos=False, **forced)) == "<|endoftext|>" * 5


def forced_pair(pipe, prompt_ids: list[int], first: int, second: int) -> dict:
    """Options that make greedy decoding give `first`, then `second`: logit biases on both, and
    presence and frequency penalties of 2 (which take 4 off `first` once generated), with the biases'
    difference in the middle of the window where `first` wins step 1 and `second` step 2 (worked out
    from the full-recompute logits)."""
    step1 = pipe.logits(prompt_ids)[-1].astype(np.float64)
    step2 = pipe.logits([*prompt_ids, first])[-1].astype(np.float64)
    lo = step1[second] - step1[first]  # above: `first` wins step 1
    hi = step2[second] - step2[first] + 4  # below: `second` wins step 2
    assert hi - lo > 0.4, (lo, hi)
    delta = (lo + hi) / 2
    b1, b2 = (100.0, 100.0 - delta) if delta > 0 else (100.0 + delta, 100.0)
    step1[first] += b1
    step1[second] += b2
    step2[first] += b1 - 4
    step2[second] += b2
    assert np.argsort(step1)[-1] == first and np.argsort(step2)[-1] == second
    return dict(temperature=0.0, logit_bias={first: b1, second: b2}, presence_penalty=2.0,
                frequency_penalty=2.0)


def test_stream_skips_the_stop_id_and_flushes_a_split_character(pipe):
    # 😀's first byte, then <|endoftext|>: the byte is held back until the end, where it becomes U+FFFD;
    # the stop token's text is never yielded.
    prompt = pipe.encode("Hello")
    options = forced_pair(pipe, prompt, SPLIT_CHAR_START, EOS)
    result = pipe.generate(prompt, max_new_tokens=5, **options)
    assert result.ids == [SPLIT_CHAR_START, EOS]
    assert result.text == "\ufffd" == hf_decode([SPLIT_CHAR_START])
    assert (result.finish_reason, result.stop_reason) == ("stop", EOS)
    assert list(pipe.stream(prompt, max_new_tokens=5, **options)) == ["\ufffd"]
    steps = list(pipe.tokens(prompt, 5, **options).steps())
    assert [(s.id, s.text, s.finish_reason) for s in steps] == [(SPLIT_CHAR_START, "", None),
                                                                (EOS, "\ufffd", "stop")]


def test_stream_flushes_a_split_character_when_the_budget_ends(pipe):
    prompt = pipe.encode("Hello")
    options = dict(logit_bias={SPLIT_CHAR_START: 100})
    assert list(pipe.stream(prompt, max_new_tokens=2, **options)) == ["\ufffd\ufffd"]
    steps = list(pipe.tokens(prompt, 2, **options).steps())
    assert [(s.text, s.finish_reason) for s in steps] == [("", None), ("\ufffd\ufffd", "length")]


def test_a_stop_id_ends_the_stream_and_is_kept_in_the_ids(pipe, cases):
    case = cases[3]
    stop = case["greedy_ids"][4]
    assert stop not in case["greedy_ids"][:4]
    stream = pipe.tokens(case["prompt"], 20, stop_at_eos=False, stop_ids=[stop])
    assert list(stream) == case["greedy_ids"][:5]
    assert stream.finish_reason == "stop" and stream.stop_ids == frozenset({stop})
    result = stream.result()
    assert result.stop_reason == stop and result.text == hf_decode(case["greedy_ids"][:4])
    # generate_tokens' own stop_ids add to the options' ones.
    both = generate_tokens(pipe.model, case["prompt_ids"], 20, GenerationOptions(stop_ids=[stop]),
                           stop_ids=[EOS])
    assert both.stop_ids == frozenset({stop, EOS}) and list(both) == case["greedy_ids"][:5]


# --------------------------------------------------------------------------------- length and budget


@pytest.mark.parametrize("n", [1, 3])
def test_finish_reason_length_is_set_when_the_budget_runs_out(pipe, n):
    stream = pipe.tokens("Hello", n, stop_at_eos=False)
    assert stream.finish_reason is None
    ids = list(stream)
    assert len(ids) == n and stream.finish_reason == "length"
    assert stream.result().finish_reason == "length" and stream.result().stop_reason is None


def test_finish_reason_length_without_any_token(pipe):
    stream = pipe.tokens("Hello", 0)
    assert list(stream) == [] and stream.finish_reason == "length"
    ctx = pipe.config.n_positions
    full = pipe.tokens([11] * ctx, 5)
    assert list(full) == [] and full.finish_reason == "length"


def test_the_context_window_bounds_the_budget(pipe):
    ctx = pipe.config.n_positions
    assert new_token_budget(pipe.config, ctx - 3, 50) == 3
    assert new_token_budget(pipe.config, 5, 7) == 7
    assert new_token_budget(pipe.config, ctx, 7) == 0
    stream = pipe.tokens([11] * (ctx - 3), 50, stop_at_eos=False)
    assert len(list(stream)) == 3 and stream.finish_reason == "length"


@pytest.mark.parametrize("bad", [-1, True, False, 2.5, "3", None, np.float64(2.0)])
def test_max_new_tokens_must_be_an_integer_at_least_0(pipe, bad):
    message = f"max_new_tokens must be an integer >= 0, got {bad!r}"
    for call in (lambda: pipe.generate("Hi", max_new_tokens=bad), lambda: pipe.tokens("Hi", bad),
                 lambda: list(pipe.stream("Hi", max_new_tokens=bad)),
                 lambda: generate_tokens(pipe.model, [1, 2], bad)):
        with pytest.raises(GenerationError) as info:
            call()
        assert str(info.value) == message


def test_numpy_integer_budgets_are_accepted(pipe, cases):
    case = cases[1]
    assert pipe.generate(case["prompt"], max_new_tokens=np.int64(4), stop_at_eos=False).ids == \
        case["greedy_ids"][:4]


def test_kv_cache_is_sized_to_the_prompt_and_the_budget(pipe, monkeypatch):
    # README: "The KV cache is allocated by the backend, sized to prompt + budget" (the last new token
    # is never fed back, so one position less).
    sizes = []
    real = pipe.model.new_cache

    def spy(batch=1, capacity=None):
        sizes.append((batch, capacity))
        return real(batch, capacity)

    monkeypatch.setattr(pipe.model, "new_cache", spy)
    prompt = pipe.encode("The quick brown fox")
    pipe.generate(prompt, max_new_tokens=9, stop_at_eos=False)
    ctx = pipe.config.n_positions
    pipe.generate([11] * (ctx - 4), max_new_tokens=50, stop_at_eos=False)  # the context bounds it
    pipe.generate(prompt, max_new_tokens=1)
    assert sizes == [(1, len(prompt) + 9 - 1), (1, ctx - 1), (1, len(prompt))]


def test_the_model_refuses_positions_past_its_kv_cache(pipe):
    model = pipe.model
    cache = model.new_cache(1, 4)
    model.forward(np.asarray([[1, 2, 3]]), cache)
    with pytest.raises(ValueError, match=r"^5 positions do not fit a KV cache of 4 "):
        model.forward(np.asarray([[4, 5]]), cache)
    model.forward(np.asarray([[4]]), cache)  # exactly full
    with pytest.raises(ValueError, match=r"^5 positions do not fit a KV cache of 4 "):
        model.forward(np.asarray([[6]]), cache)


# ---------------------------------------------------------------------------------- request checks


def test_check_request_checks_option_ids_against_the_sample_limit(pipe):
    config = pipe.config
    assert check_request(config, (1, 2), 3, [GenerationOptions(stop_ids=[99])], sample_limit=100) == [1, 2]
    with pytest.raises(OptionError, match=r"stop_ids names token id 100, outside the vocabulary \[0, 100\)"):
        check_request(config, [1], 3, [GenerationOptions(stop_ids=[100])], sample_limit=100)
    with pytest.raises(OptionError, match=r"logit_bias names token id 50257, outside the vocabulary"):
        check_request(config, [1], 3, [GenerationOptions(logit_bias={50257: 1.0})])
    with pytest.raises(ContextLengthError):
        check_request(config, [1] * (config.n_positions + 1), 3, [])


def test_sample_limit_keeps_generated_ids_below_it(pipe, cases):
    case = cases[0]
    limit = case["greedy_ids"][0]  # the greedy choice is not allowed
    ids = list(generate_tokens(pipe.model, case["prompt_ids"], 6, sample_limit=limit))
    assert all(i < limit for i in ids)
    logits = pipe.logits(case["prompt_ids"])[-1]
    assert ids[0] == int(np.argmax(logits[:limit]))


# -------------------------------------------------------------------------------------- the result


def test_result_timing_fields():
    r = GenerationResult([1], [5, 6, 7, 8], "abcd", "length", seconds=0.5, backend="numpy")
    assert r.new_tokens == 4 and r.tokens_per_second == 8.0
    assert GenerationResult([1], [5], "a", "stop", seconds=0.0).tokens_per_second == 0.0
    d = GenerationResult([1], [5, 6, 7], "abc", "length", seconds=1.23456789, backend="numpy").to_dict()
    assert d == {"prompt_ids": [1], "ids": [5, 6, 7], "text": "abc", "finish_reason": "length",
                 "stop_reason": None, "backend": "numpy", "new_tokens": 3, "seconds": 1.234568,
                 "tokens_per_second": 2.43}


def test_result_of_a_pipeline_run(pipe):
    result = pipe.generate("Hello", max_new_tokens=3, stop_at_eos=False)
    assert result.backend == "numpy" and result.seconds > 0 and result.logprobs is None
    assert result.tokens_per_second == pytest.approx(3 / result.seconds)
