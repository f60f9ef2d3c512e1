"""Generation options (inferno/options.py): validation, penalties and bias against the formulas written
out here, the order they apply in, logprobs from the raw distribution, and stop strings (hypothesis:
streamed pieces join to the final text, which is the longest prefix before the first stop string)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from goldens import TOKENIZER_JSON, golden_model, log_softmax, write_model_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import inferno
from inferno.conformance.checks import dtype_name, tolerance_for
from inferno.options import (
    GenerationOptions,
    LogitsProcessor,
    OptionError,
    SequenceState,
    StopStrings,
)
from inferno.sampling import Sampler, SamplingParams
from inferno.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_file(TOKENIZER_JSON)


# --- validation -----------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"repetition_penalty": -1.0}, "repetition_penalty"),
        ({"repetition_penalty": float("nan")}, "repetition_penalty"),
        ({"repetition_penalty": True}, "repetition_penalty"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"presence_penalty": -2.01}, "presence_penalty"),
        ({"frequency_penalty": "1"}, "frequency_penalty"),
        ({"frequency_penalty": float("inf")}, "frequency_penalty"),
        ({"logit_bias": {5: 101}}, "logit_bias"),
        ({"logit_bias": {5: -100.5}}, "logit_bias"),
        ({"logit_bias": {-1: 1}}, "logit_bias"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {1.5: 1}}, "logit_bias"),
        ({"logit_bias": [1, 2]}, "logit_bias"),
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": -1}, "logprobs"),
        ({"logprobs": True}, "logprobs"),
        ({"logprobs": 2.0}, "logprobs"),
        ({"stop": ""}, "stop"),
        ({"stop": ["a", ""]}, "stop"),
        ({"stop": [1]}, "stop"),
        ({"stop": 5}, "stop"),
        ({"stop": [str(i) for i in range(17)]}, "stop"),
        ({"stop_ids": "12"}, "stop_ids"),
        ({"stop_ids": [-3]}, "stop_ids"),
        ({"stop_ids": [True]}, "stop_ids"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": 1.5}, "top_k"),
        ({"seed": -2}, "seed"),
    ],
)
def test_bad_options_name_the_option(kwargs, name):
    with pytest.raises(OptionError, match=name) as info:
        GenerationOptions(**kwargs)
    assert info.value.field.startswith(name)


def test_option_ranges_are_inclusive():
    o = GenerationOptions(presence_penalty=-2, frequency_penalty=2, logit_bias={0: -100, "7": 100},
                          logprobs=20,
                          stop=[str(i) for i in range(16)], repetition_penalty=1e-3)
    assert o.logit_bias == {0: -100.0, 7: 100.0} and o.logprobs == 20 and len(o.stop) == 16


def test_options_normalise():
    o = GenerationOptions(stop="\n", stop_ids=[3, 3, np.int64(4)], logprobs=np.int32(2))
    assert o.stop == ("\n",) and o.stop_ids == frozenset({3, 4}) and o.logprobs == 2
    assert GenerationOptions(stop=["a", "b", "a"]).stop == ("a", "b")
    assert not GenerationOptions().penalised
    assert GenerationOptions(logit_bias={1: 0.5}).penalised


def test_unknown_option_lists_the_known_ones():
    with pytest.raises(OptionError, match="max_tokens is not a generation option.*repetition_penalty"):
        GenerationOptions.from_kwargs(max_tokens=3)


def test_token_ids_are_checked_against_the_vocabulary(pipe):
    with pytest.raises(OptionError, match=r"logit_bias names token id 50257, outside the vocabulary \[0, 5"):
        pipe.generate("Hi", max_new_tokens=1, logit_bias={50257: 1})
    with pytest.raises(OptionError, match="stop_ids.*99999"):
        pipe.generate("Hi", max_new_tokens=1, stop_ids=[99999])


def test_pipeline_rejects_unknown_and_doubled_options(pipe):
    with pytest.raises(OptionError, match="top_n"):
        pipe.generate("Hi", top_n=3)
    with pytest.raises(OptionError, match="temperature cannot be given together with options="):
        pipe.generate("Hi", options=GenerationOptions(), temperature=1.0)


# --- penalties and bias against the formulas --------------------------------------------------------

def reference_logits(logits, prompt, generated, rep=1.0, presence=0.0, frequency=0.0, bias=None):
    """HF's RepetitionPenaltyLogitsProcessor over prompt + generated, then OpenAI's
    logit - frequency * count - presence * (count > 0) over generated, then the bias; in float64."""
    z = np.asarray(logits, dtype=np.float64).copy()
    for t in set(prompt) | set(generated):
        z[t] = z[t] * rep if z[t] < 0 else z[t] / rep
    for t, count in Counter(generated).items():
        z[t] -= frequency * count + presence * (count > 0)
    for t, b in (bias or {}).items():
        z[t] += b
    return z


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rep": 1.3}, {"rep": 0.7}, {"presence": 0.8}, {"frequency": -1.5},
        {"presence": -0.5, "frequency": 2.0},
        {"bias": {0: 5.0, 7: -100.0}},
        {"rep": 1.2, "presence": 0.4, "frequency": 0.3, "bias": {3: 2.0, 11: -1.0}},
    ],
)
def test_processor_matches_the_formulas(kwargs):
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal(40) * 3).astype(np.float32)
    prompt = rng.integers(0, 40, 6).tolist()
    options = GenerationOptions(repetition_penalty=kwargs.get("rep", 1.0),
                                presence_penalty=kwargs.get("presence", 0.0),
                                frequency_penalty=kwargs.get("frequency", 0.0), logit_bias=kwargs.get("bias"))
    proc = LogitsProcessor(options, prompt)
    generated: list[int] = []
    for token in rng.integers(0, 40, 25).tolist():  # repeats included, so counts reach 2 and more
        np.testing.assert_allclose(proc(logits), reference_logits(logits, prompt, generated, **kwargs),
                                   rtol=0, atol=1e-12)
        proc.append(token)
        generated.append(token)
    assert max(Counter(generated).values()) >= 2
    assert proc(logits).dtype == np.float64 and logits.dtype == np.float32  # the raw row is untouched


def test_penalties_and_bias_apply_before_temperature_top_k_top_p():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal(60) * 2
    prompt, generated = [1, 2, 3], [4, 4, 5]
    weakest = int(np.argmin(logits))
    options = GenerationOptions(temperature=0.7, top_k=10, top_p=0.8, repetition_penalty=1.4,
                                presence_penalty=0.5, frequency_penalty=0.7, logit_bias={weakest: 9})
    state = SequenceState(options, prompt)
    for t in generated:
        state.processor.append(t)
    processed = reference_logits(logits, prompt, generated, 1.4, 0.5, 0.7, options.logit_bias)
    ids, probs = state.sampler.distribution(state.processor(logits))
    ref_ids, ref_probs = Sampler(SamplingParams(0.7, 10, 0.8)).distribution(processed)
    assert ids.tolist() == ref_ids.tolist() and int(np.argmin(logits)) in ids.tolist()
    np.testing.assert_allclose(probs, ref_probs, rtol=1e-12)
    # Not the same as cutting first and penalising after: the biased token was outside the raw top 10.
    assert int(np.argmin(logits)) not in Sampler(SamplingParams(0.7, 10, 0.8)).distribution(logits)[0]


def test_greedy_honours_bias_and_penalties():
    logits = np.array([0.0, 3.0, 2.9, -1.0])
    assert SequenceState(GenerationOptions(), [0]).choose(logits) == 1
    assert SequenceState(GenerationOptions(logit_bias={1: -100}), [0]).choose(logits) == 2
    assert SequenceState(GenerationOptions(repetition_penalty=1.1), [1]).choose(logits) == 2  # 3.0/1.1 < 2.9
    state = SequenceState(GenerationOptions(presence_penalty=0.2), [0])
    assert state.step(logits).id == 1 and state.step(logits).id == 2  # 3.0 - 0.2 < 2.9


def test_negative_logits_are_multiplied_by_the_repetition_penalty():
    logits = np.array([-1.0, -1.2, -5.0])
    # -1.0 * 1.5 = -1.5 < -1.2: the seen token loses its place.
    assert SequenceState(GenerationOptions(repetition_penalty=1.5), [0]).choose(logits) == 1


def test_penalties_off_cost_no_processor():
    assert SequenceState(GenerationOptions(temperature=1.0, top_k=5), [1, 2]).processor is None


# --- logprobs -------------------------------------------------------------------------------------

def test_logprobs_come_from_the_raw_logits():
    rng = np.random.default_rng(2)
    logits = (rng.standard_normal(500) * 4).astype(np.float32)
    options = GenerationOptions(temperature=0.5, top_k=3, repetition_penalty=2.0, logit_bias={7: 50},
                                logprobs=5, seed=0)
    state = SequenceState(options, [int(np.argmax(logits))])
    step = state.step(logits)
    assert step.id == 7  # the bias decided the draw ...
    raw = log_softmax(logits.astype(np.float64))
    assert step.logprob.logprob == pytest.approx(raw[7], abs=1e-12)  # ... the logprob is the model's own
    order = np.argsort(-raw, kind="stable")[:5]
    assert [i for i, _ in step.logprob.top] == order.tolist()
    np.testing.assert_allclose([lp for _, lp in step.logprob.top], raw[order], atol=1e-12)
    assert math.isclose(np.exp(raw).sum(), 1.0)
    assert state.logprobs == [step.logprob]


def test_top_logprob_ties_are_broken_by_id():
    state = SequenceState(GenerationOptions(logprobs=3), [0])
    step = state.step(np.array([1.0, 2.0, 2.0, 2.0, 0.0]))
    assert [i for i, _ in step.logprob.top] == [1, 2, 3] and step.id == 1


def test_pipeline_logprobs(pipe):
    result = pipe.generate("The quick brown fox", max_new_tokens=6, logprobs=3, stop_at_eos=False)
    assert len(result.logprobs) == 6 and [lp.id for lp in result.logprobs] == result.ids
    full = pipe.logits(result.prompt_ids + result.ids)
    for k, lp in enumerate(result.logprobs):
        raw = log_softmax(full[len(result.prompt_ids) - 1 + k])
        assert lp.logprob == pytest.approx(raw[lp.id], abs=1e-4)
        assert lp.top[0][0] == lp.id  # greedy: the chosen token is the most likely
        assert len(lp.top) == 3
    assert pipe.generate("Hi", max_new_tokens=2, logprobs=0).logprobs[0].top == []
    assert pipe.generate("Hi", max_new_tokens=2).logprobs is None
    d = result.to_dict(lambda i: pipe.tokenizer.decode([i]))
    assert set(d["logprobs"][0]) == {"id", "text", "logprob", "top"}
    assert set(d["logprobs"][0]["top"][0]) == {"id", "text", "logprob"}


# --- stop strings ---------------------------------------------------------------------------------

def test_stop_string_spanning_tokens_and_starting_mid_token(pipe):
    kwargs = dict(max_new_tokens=24, temperature=1.0, seed=5, stop_at_eos=False)
    plain = pipe.generate("Once upon a time", **kwargs)
    pieces = [pipe.tokenizer.decode([i]) for i in plain.ids]
    assert "".join(pieces) == plain.text and len(pieces[2]) >= 2, pieces  # a stop can start inside the third
    start = len(pieces[0]) + len(pieces[1]) + 1  # one character into the third token ...
    stop = plain.text[start : start + len(pieces[2]) + 1]  # ... and into the fourth
    assert plain.text.find(stop) == start
    result = pipe.generate("Once upon a time", stop=["never occurs", stop], **kwargs)
    assert result.text == plain.text[:start]
    assert result.finish_reason == "stop" and result.stop_reason == stop
    assert result.ids == plain.ids[:4]  # up to the token that completed the stop string
    streamed = list(pipe.stream("Once upon a time", stop=["never occurs", stop], **kwargs))
    assert "".join(streamed) == result.text


def test_stop_ids_end_with_stop(pipe):
    plain = pipe.generate("Once upon a time", max_new_tokens=12, temperature=1.0, seed=8, stop_at_eos=False)
    target = plain.ids[3]
    first = plain.ids.index(target)
    result = pipe.generate("Once upon a time", max_new_tokens=12, temperature=1.0, seed=8, stop_at_eos=False,
                           stop_ids=[target])
    assert result.ids == plain.ids[: first + 1] and result.finish_reason == "stop"
    assert result.stop_reason == target
    assert result.text == pipe.tokenizer.decode(plain.ids[:first])


def test_unmatched_stop_prefix_is_released_at_the_end(pipe):
    plain = pipe.generate("Hello", max_new_tokens=5, stop_at_eos=False)
    stop = plain.text[-2:] + "\x00never"  # the text ends with the start of the stop string
    pieces = list(pipe.stream("Hello", max_new_tokens=5, stop_at_eos=False, stop=stop))
    assert "".join(pieces) == plain.text
    assert pieces[-1].endswith(plain.text[-2:])  # held back until the end, then released
    result = pipe.generate("Hello", max_new_tokens=5, stop_at_eos=False, stop=stop)
    assert result.text == plain.text and result.finish_reason == "length" and result.stop_reason is None


def test_stop_strings_need_a_decoder():
    with pytest.raises(OptionError, match="stop"):
        SequenceState(GenerationOptions(stop="x"), [0])


@pytest.mark.parametrize(
    ("stops", "pieces", "released", "matched"),
    [
        (["ab"], ["xa", "b", "c"], ["x", ""], "ab"),
        (["abc"], ["ab", "d"], ["", "abd"], None),
        (["abc", "bcd"], ["abcd"], [""], "abc"),  # the earliest start wins
        (["cd", "abcde"], ["abcd"], ["ab"], "cd"),  # ... as soon as the text contains one
        (["aab"], ["a", "a", "a", "b"], ["", "", "a", ""], "aab"),
        (["\n\n"], ["one\n", "two\n", "\n"], ["one", "\ntwo", ""], "\n\n"),
    ],
)
def test_stop_string_matcher(stops, pieces, released, matched):
    m = StopStrings(stops)
    got, found = [], None
    for piece in pieces:
        text, found = m.feed(piece)
        got.append(text)
        if found:
            break
    assert got == released and found == matched


def _brute_hold(text: str, stops) -> int:
    """Length of the longest tail of `text` that is a proper prefix of some stop string."""
    return max([k for s in stops for k in range(1, min(len(s), len(text) + 1)) if text.endswith(s[:k])],
               default=0)


@st.composite
def ids_and_stops(draw):
    # Common English tokens, multi-byte pieces (split characters) and arbitrary ids.
    common = st.integers(0, 2000)
    # Pieces of ’é😀 “” — 東京 (characters split across tokens), ".", "\n", "\n\n".
    split = st.sampled_from([13, 105, 109, 198, 222, 247, 250, 251, 421, 447, 564, 628, 851, 2634, 5191,
                             10545, 12859, 12876, 47249])
    ids = draw(st.lists(st.one_of(common, split, st.integers(0, 50255)), min_size=1, max_size=30))
    return ids, draw(st.data())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=ids_and_stops())
def test_stop_strings_property(tok, case):
    ids, data = case
    full = tok.decode(ids)
    # Stop strings cut from the text itself (so they do occur: across tokens, from mid-token), overlapping
    # each other, plus short random ones.
    stops = []
    for _ in range(data.draw(st.integers(1, 4), label="n_stops")):
        if full and data.draw(st.booleans(), label="from_text"):
            a = data.draw(st.integers(0, len(full) - 1), label="start")
            b = data.draw(st.integers(a + 1, min(len(full), a + 8)), label="end")
            stops.append(full[a:b])
        else:
            stops.append(data.draw(st.text(alphabet="ab \n.,e’", min_size=1, max_size=4), label="random"))
    state = SequenceState(GenerationOptions(stop=stops), [0], tok.incremental_decoder())
    logits = np.zeros(tok.vocab_size, dtype=np.float32)
    fed = ""  # what the incremental decoder has produced (complete characters), as the matcher sees it
    fed_decoder = tok.incremental_decoder()
    pieces = []
    for k, token in enumerate(ids):
        logits[:] = 0
        logits[token] = 1.0  # greedy picks `token`
        step = state.step(logits, last=k == len(ids) - 1)
        assert step.id == token
        pieces.append(step.text)
        fed += fed_decoder.feed(token)
        released = "".join(pieces)
        if step.finish_reason is None:
            # Hold back only what could still become a stop string: exactly the longest such tail.
            assert fed.startswith(released)
            assert len(fed) - len(released) == _brute_hold(fed, stops)
        if step.finish_reason is not None:
            break
    text = "".join(pieces)
    assert text == state.text
    assert not any(s in text for s in stops)
    used = tok.decode(state.ids)
    cut = min([i for i in (used.find(s) for s in stops) if i >= 0], default=len(used))
    assert text == used[:cut]  # the longest prefix before the first stop string
    if state.finish_reason == "stop":
        assert state.stop_reason in stops
        before = tok.incremental_decoder()
        seen_before = "".join(before.feed(t) for t in state.ids[:-1])
        assert not any(s in seen_before for s in stops)  # it stopped as soon as the text held one
    else:
        assert state.finish_reason == "length" and state.ids == ids and text == full


def test_every_backend_generates_alike_with_options(backend, pipe):
    # The options run on host logits, so every backend gives numpy's tokens (up to float32 near-ties,
    # which this model's seeded draws do not hit).
    other = inferno.api.Pipeline(inferno.api.Gpt2.from_weights(pipe.config, _host_weights(pipe), backend),
                                 pipe.tokenizer)
    kwargs = dict(max_new_tokens=10, temperature=0.9, top_k=50, seed=2, repetition_penalty=1.3,
                  presence_penalty=0.4, frequency_penalty=0.2, logit_bias={13: 3.0}, logprobs=2,
                  stop_at_eos=False, stop=["never"])
    a, b = pipe.generate("Once upon", **kwargs), other.generate("Once upon", **kwargs)
    assert a.ids == b.ids and a.text == b.text
    # Logprobs to float32 rounding; a backend with 16-bit weights (half) to its conformance tolerance.
    atol = 1e-4 if dtype_name(backend.dtype) in ("float32", "float64") else tolerance_for(backend.dtype).atol
    np.testing.assert_allclose([lp.logprob for lp in a.logprobs], [lp.logprob for lp in b.logprobs],
                               atol=atol)


def _host_weights(pipe) -> dict:
    return golden_model("greedy")[1]


def test_repetition_penalty_with_prompt_ids_past_the_sampled_ones(tmp_path):
    # A vocabulary padded past the tokenizer's: prompt ids there are valid but never sampled.
    from random_gpt2 import random_state_dict, small_config

    config = small_config(vocab_size=50260, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    pipe = inferno.load(write_model_dir(tmp_path, config, random_state_dict(config, 1)), "numpy",
                        download=False)
    result = pipe.generate([1, 2, 50258], max_new_tokens=3, repetition_penalty=1.2, stop_at_eos=False)
    assert len(result.ids) == 3 and max(result.ids) < 50257
