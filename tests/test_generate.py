"""The batch-1 generation loop (inferno/generate.py) and Pipeline.generate/stream/tokens, against
references written without it: the transformers goldens, full recompute with a sampler written from
its definition (tests/reference.py), Hugging Face tokenizers for the text."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from goldens import golden_model
from reference import hf_decode, reference_generate

from inferno.backends.numpy_backend import NumpyBackend
from inferno.generate import (
    ContextLengthError,
    GenerationError,
    GenerationResult,
    PromptTypeError,
    check_ids,
    check_request,
    generate_tokens,
    new_token_budget,
    token_ids,
)
from inferno.models.gpt2 import Gpt2, NonFiniteLogitsError
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
    result = stream.result()
    assert (result.finish_reason, result.stop_reason, result.seconds) == ("length", None, 0.0)
    assert result.tokens_per_second == 0.0 and stream.result(2.0).seconds == 2.0


def test_a_result_taken_mid_stream_is_the_generation_so_far(pipe, cases):
    case = cases[2]
    stream = pipe.tokens(case["prompt"], 10, stop_at_eos=False)
    steps = stream.steps()
    first = [next(steps).id for _ in range(3)]
    result = stream.result()
    assert first == result.ids == case["greedy_ids"][:3]
    assert result.text == hf_decode(first) and result.finish_reason == "length"
    assert stream.finish_reason is None  # the stream itself has not finished


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


# ------------------------------------------------------------------------------------ bad numbers


def overflowing_model(name: str, index, value: float = 3e38) -> Gpt2:
    """The golden model with one weight so large (finite, so loadable) that float32 overflows."""
    config, sd, _ = golden_model("greedy")
    sd = {k: v.copy() for k, v in sd.items()}
    sd[name][index] = value
    return Gpt2.from_weights(config, sd, NumpyBackend())


def test_overflow_in_the_prefill_is_an_error_not_a_numpy_warning():
    model = overflowing_model("h.0.mlp.c_fc.weight", slice(None))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NumPy's overflow and invalid-value warnings are silenced
        with pytest.raises(NonFiniteLogitsError, match="the weights are the likely cause"):
            list(generate_tokens(model, [1, 2, 3], 4))


def test_overflow_in_a_decode_step_is_an_error_not_a_numpy_warning():
    # Position 5 overflows: the prompt's 5 positions are fine, the first fed-back token is not.
    model = overflowing_model("wpe.weight", 5)
    stream = generate_tokens(model, [1, 2, 3, 4, 5], 4)
    steps = stream.steps()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = next(steps)
        with pytest.raises(NonFiniteLogitsError, match="non-finite logit"):
            next(steps)
    assert first.id == int(np.argmax(model.forward(np.asarray([[1, 2, 3, 4, 5]]))[0]))


# -------------------------------------------------------------------------------------- prompt types

NUMPY_PROMPT = "a NumPy prompt must be a 1-D array of integer token ids, got a "



@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        (b"Hi", "the prompt is bytes b'Hi': give text as a str (decode the bytes first) or token ids as a "
                "list of ints"),
        (bytearray(b"Hi"), "the prompt is bytearray bytearray(b'Hi'): give text as a str (decode the bytes "
                           "first) or token ids as a list of ints"),
        (memoryview(b"Hi"), "the prompt is memoryview"),
        (np.array([1.5]), NUMPY_PROMPT + "1-D array of float64"),
        (np.array([[1]]), NUMPY_PROMPT + "2-D array of int64"),
        (np.array(3), NUMPY_PROMPT + "0-D array of int64"),
        ("15496", "the prompt must be a str or a sequence of int token ids, got str '15496'"),
        (None, "the prompt must be a str or a sequence of int token ids, got NoneType None"),
        ({1: 2}, "the prompt must be a str or a sequence of int token ids, got dict {1: 2}"),
        (list(range(100)), None),
        ([1, 2.0], "prompt token ids must be ints, got 2.0 (float) at index 1"),
        ([1, True], "prompt token ids must be ints, got True (bool) at index 1"),
        ([np.bool_(False)], "prompt token ids must be ints, got np.False_ (bool) at index 0"),
        (["1"], "prompt token ids must be ints, got '1' (str) at index 0"),
    ],
)
def test_token_ids_rejects_what_is_not_a_prompt(prompt, message):
    if message is None:  # a long list of ints is fine
        assert token_ids(prompt) == list(range(100))
        return
    with pytest.raises(PromptTypeError) as info:
        token_ids(prompt)
    assert str(info.value).startswith(message)
    assert isinstance(info.value, GenerationError) and isinstance(info.value, TypeError)


def test_a_long_value_is_shown_cut_to_40_characters():
    with pytest.raises(PromptTypeError) as info:
        token_ids({i: i for i in range(30)})
    shown = repr({i: i for i in range(30)})[:37] + "..."
    assert str(info.value) == f"the prompt must be a str or a sequence of int token ids, got dict {shown}"

    # A repr of 40 characters is shown whole; of 41, cut to 37 and "...".
    with pytest.raises(PromptTypeError) as info:
        token_ids(["x" * 38])
    assert str(info.value) == f"prompt token ids must be ints, got '{'x' * 38}' (str) at index 0"
    with pytest.raises(PromptTypeError) as info:
        token_ids(["x" * 39])
    assert str(info.value) == f"prompt token ids must be ints, got '{'x' * 36}... (str) at index 0"

    class Unshowable:
        def __repr__(self):
            raise RuntimeError("no")

    with pytest.raises(PromptTypeError, match=r"got \? \(Unshowable\) at index 0"):
        token_ids([Unshowable()])


def test_token_ids_converts_numpy_integers_to_ints():
    ids = token_ids([np.int64(5), np.uint16(7), 9])
    assert ids == [5, 7, 9] and all(type(i) is int for i in ids)
    ids = token_ids(np.array([3, 4], dtype=np.uint8))
    assert ids == [3, 4] and all(type(i) is int for i in ids)
    ids = token_ids((1, 2))
    assert ids == [1, 2] and type(ids) is list
    assert token_ids(range(3)) == [0, 1, 2]


def test_check_ids_messages(pipe):
    config = pipe.config
    with pytest.raises(GenerationError) as info:
        check_ids([], config)
    assert str(info.value) == ("the prompt has no tokens (start from <|endoftext|> for unconditional text)")
    with pytest.raises(GenerationError) as info:
        check_ids([5, 50257, -1], config)
    assert str(info.value) == "prompt token id 50257 is outside the vocabulary [0, 50257)"
    with pytest.raises(GenerationError) as info:
        check_ids([-1], config)
    assert str(info.value) == "prompt token id -1 is outside the vocabulary [0, 50257)"
    assert check_ids([0, 50256], config) == [0, 50256]
    assert check_ids([1] * config.n_positions, config) == [1] * config.n_positions
    with pytest.raises(ContextLengthError) as info:
        check_ids([1] * (config.n_positions + 1), config)
    assert str(info.value) == "the prompt is 129 tokens long but the model's context holds 128"


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


def test_generate_tokens_checks_option_ids_against_its_sample_limit(pipe):
    outside = r"names token id \d+, outside the vocabulary \[0, 100\)$"
    with pytest.raises(OptionError, match="^stop_ids " + outside):
        generate_tokens(pipe.model, [1, 2], 3, GenerationOptions(stop_ids=[150]), sample_limit=100)
    with pytest.raises(OptionError, match="^logit_bias " + outside):
        generate_tokens(pipe.model, [1], 3, GenerationOptions(logit_bias={100: 1}), sample_limit=100)
    stream = generate_tokens(pipe.model, [1], 3, GenerationOptions(stop_ids=[99]), sample_limit=100)
    assert stream.stop_ids == {99}


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
    d = GenerationResult([1], [5, 6, 7], "abc", "length", seconds=0.7000004, backend="numpy").to_dict()
    assert d == {"prompt_ids": [1], "ids": [5, 6, 7], "text": "abc", "finish_reason": "length",
                 "stop_reason": None, "backend": "numpy", "new_tokens": 3, "seconds": 0.7,
                 "tokens_per_second": 4.286}
    d = GenerationResult([1], [5], "a", "stop", seconds=1.23456789, stop_reason=50256).to_dict()
    assert (d["seconds"], d["tokens_per_second"], d["stop_reason"]) == (1.234568, 0.81, 50256)


def test_result_of_a_pipeline_run(pipe):
    result = pipe.generate("Hello", max_new_tokens=3, stop_at_eos=False)
    assert result.backend == "numpy" and result.seconds > 0 and result.logprobs is None
    assert result.tokens_per_second == pytest.approx(3 / result.seconds)
