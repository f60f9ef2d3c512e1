"""The request and response models of inferno.serve.schemas, in-process: every field's bounds and types,
NaN and infinity, defaults, the custom errors and the field they name, and the responses' shapes."""

from __future__ import annotations

import math
import sys

import pytest
from pydantic import ValidationError

from inferno.options import MAX_ABS_BIAS, MAX_ABS_PENALTY, MAX_LOGPROBS, MAX_STOP_STRINGS
from inferno.serve.schemas import (
    MAX_N,
    ChatCompletionRequest,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorInfo,
    ErrorResponse,
    Health,
    ModelCard,
    ModelList,
    StreamOptions,
    TokenizeRequest,
    TokenizeResponse,
    TokenizerInfo,
)

PROMPT_MESSAGE = ("must be a string, a list of strings, a list of token ids, or a list of token-id lists "
                  "(none empty)")


def one_error(cls, /, **fields) -> dict:
    """The single error a request with these fields gets."""
    with pytest.raises(ValidationError) as e:
        cls(**fields)
    errors = e.value.errors()
    assert len(errors) == 1, errors
    return errors[0]


# ------------------------------------------------------------------------------------------ defaults

def test_completion_request_defaults_are_none_and_an_empty_prompt():
    r = CompletionRequest()
    assert r.prompt == ""
    for name in ("model", "max_tokens", "temperature", "top_p", "top_k", "n", "seed", "stop",
                 "stop_token_ids", "stream", "stream_options", "logprobs", "echo", "presence_penalty",
                 "frequency_penalty", "repetition_penalty", "logit_bias", "ignore_eos",
                 "return_token_ids", "user", "best_of", "suffix"):
        assert getattr(r, name) is None, name


def test_every_optional_field_takes_null():
    fields = dict.fromkeys(("model", "max_tokens", "temperature", "top_p", "top_k", "n", "seed", "stop",
                            "stop_token_ids", "stream", "stream_options", "logprobs", "echo",
                            "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
                            "ignore_eos", "return_token_ids", "user", "best_of", "suffix"))
    r = CompletionRequest(**fields)
    assert all(getattr(r, k) is None for k in fields)


def test_unknown_fields_are_refused_with_the_closest_field():
    err = one_error(CompletionRequest, prompt="hi", temprature=0)
    assert (err["type"], err["loc"]) == ("unknown_field", ("temprature",))
    assert err["msg"] == "is not a field of this request; did you mean 'temperature'?"
    err = one_error(TokenizeRequest, content="x", other=1)
    assert err["loc"] == ("other",) and err["msg"].startswith("is not a field of this request (the fields: ")
    err = one_error(ChatCompletionRequest, messages=[{"role": "user", "content": "x", "nmae": "a"}])
    assert err["loc"] == ("messages", 0, "nmae") and "did you mean 'name'?" in err["msg"]


def test_openai_fields_not_implemented_are_accepted_only_off():
    messages = [{"role": "assistant", "content": "x", "refusal": None, "tool_calls": []}]
    r = ChatCompletionRequest(messages=messages, store=False, tool_choice="none", metadata={})
    assert not hasattr(r, "store") and not hasattr(r.messages[0], "refusal")
    for name, value in (("store", True), ("tool_choice", "auto"), ("audio", {}), ("store", 0)):
        err = one_error(ChatCompletionRequest, messages=messages, **{name: value})
        assert (err["type"], err["loc"]) == ("unsupported_field", (name,))
        assert err["msg"].startswith("is an OpenAI field this server does not support (only null")


# ------------------------------------------------------------------------------------------- prompt

@pytest.mark.parametrize("prompt", ["", "hello", ["a", "b"], [0, 5, 50256], [[1, 2], [3]], [""]])
def test_prompt_accepts_its_four_forms(prompt):
    assert CompletionRequest(prompt=prompt).prompt == prompt


def test_prompt_token_ids_given_as_integral_floats_are_ints():
    p = CompletionRequest(prompt=[1.0, 2]).prompt
    assert p == [1, 2] and all(type(t) is int for t in p)
    p = CompletionRequest(prompt=[[3.0]]).prompt
    assert p == [[3]] and type(p[0][0]) is int


@pytest.mark.parametrize("prompt", [[], [[]], [[1], []], [-1], [1.5], 5, None, True, [True], ["a", 1],
                                    [[1], "a"], {"a": 1}, [math.nan], [math.inf], b"x"])
def test_a_bad_prompt_gets_one_error_naming_the_forms(prompt):
    err = one_error(CompletionRequest, prompt=prompt)
    assert err["type"] == "prompt_type"
    assert err["loc"] == ("prompt",)
    assert err["msg"] == PROMPT_MESSAGE


# ------------------------------------------------------------------------------------ integer fields

INT_FIELDS = {  # name: (lowest valid, highest valid or None)
    "max_tokens": (0, None), "top_k": (-1, None), "n": (1, MAX_N), "seed": (0, None),
    "logprobs": (0, MAX_LOGPROBS),
}


@pytest.mark.parametrize("name", INT_FIELDS)
def test_integer_fields_bounds(name):
    low, high = INT_FIELDS[name]
    assert getattr(CompletionRequest(**{name: low}), name) == low
    err = one_error(CompletionRequest, **{name: low - 1})
    assert err["type"] == "greater_than_equal" and err["loc"] == (name,)
    if high is None:
        assert getattr(CompletionRequest(**{name: 10**12}), name) == 10**12
    else:
        assert getattr(CompletionRequest(**{name: high}), name) == high
        err = one_error(CompletionRequest, **{name: high + 1})
        assert err["type"] == "less_than_equal" and err["loc"] == (name,)


def test_limits_are_the_documented_ones():
    assert MAX_N == 16
    assert CompletionRequest(n=16).n == 16
    assert one_error(CompletionRequest, n=17)["type"] == "less_than_equal"


@pytest.mark.parametrize("name", INT_FIELDS)
def test_integer_fields_take_integral_floats_as_ints(name):
    low, _ = INT_FIELDS[name]
    value = getattr(CompletionRequest(**{name: float(low + 1)}), name)
    assert value == low + 1 and type(value) is int


@pytest.mark.parametrize("name", INT_FIELDS)
@pytest.mark.parametrize("bad", [2.5, "2", True, False, math.nan, math.inf, -math.inf, [1]])
def test_integer_fields_reject_non_integers(name, bad):
    err = one_error(CompletionRequest, **{name: bad})
    assert err["loc"][0] == name


def test_an_integral_float_below_the_bound_is_still_out_of_range():
    # The float becomes an int before the bound is checked, so the bound's error, not a type error.
    err = one_error(CompletionRequest, max_tokens=-1.0)
    assert err["type"] == "greater_than_equal"
    err = one_error(CompletionRequest, n=17.0)
    assert err["type"] == "less_than_equal"


def test_a_non_integral_float_is_an_int_type_error():
    err = one_error(CompletionRequest, max_tokens=2.5)
    assert err["type"] == "int_type" and err["input"] == 2.5


def test_the_integral_float_check_needs_a_float():
    # A string that looks integral stays a (rejected) string; an integral float becomes an int.
    err = one_error(CompletionRequest, seed="3")
    assert err["type"] == "int_type" and err["input"] == "3"
    assert CompletionRequest(seed=3.0).seed == 3


# -------------------------------------------------------------------------------------- float fields

FLOAT_FIELDS = {  # name: (low, low inclusive, high or None, high inclusive)
    "temperature": (0, True, 2, True),
    "top_p": (0, False, 1, True),
    "presence_penalty": (-MAX_ABS_PENALTY, True, MAX_ABS_PENALTY, True),
    "frequency_penalty": (-MAX_ABS_PENALTY, True, MAX_ABS_PENALTY, True),
    "repetition_penalty": (0, False, None, False),
}


@pytest.mark.parametrize("name", FLOAT_FIELDS)
def test_float_fields_bounds(name):
    low, low_in, high, high_in = FLOAT_FIELDS[name]
    if low_in:
        assert getattr(CompletionRequest(**{name: low}), name) == low
        assert one_error(CompletionRequest, **{name: low - 1e-9})["type"] == "greater_than_equal"
    else:
        assert one_error(CompletionRequest, **{name: low})["type"] == "greater_than"
        assert getattr(CompletionRequest(**{name: low + 1e-9}), name) == low + 1e-9
    if high is None:
        assert getattr(CompletionRequest(**{name: 1e6}), name) == 1e6
    else:
        assert getattr(CompletionRequest(**{name: high}), name) == high
        assert one_error(CompletionRequest, **{name: high + 1e-9})["type"] == "less_than_equal"


@pytest.mark.parametrize("name", FLOAT_FIELDS)
def test_float_fields_take_ints(name):
    low, _, high, _ = FLOAT_FIELDS[name]
    value = 1 if (high is None or high >= 1) else 0
    assert getattr(CompletionRequest(**{name: value}), name) == value


@pytest.mark.parametrize("name", FLOAT_FIELDS)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_float_fields_reject_nan_and_infinity(name, bad):
    err = one_error(CompletionRequest, **{name: bad})
    assert err["type"] == "finite_number" and err["loc"] == (name,)


@pytest.mark.parametrize("name", FLOAT_FIELDS)
@pytest.mark.parametrize("huge", [10**400, -(10**400)])
def test_float_fields_refuse_an_integer_no_float_holds_and_say_so(name, huge):
    # JSON's 1e400 written out in digits parses as a Python int; a float field says it overflows.
    err = one_error(CompletionRequest, **{name: huge})
    assert (err["type"], err["loc"]) == ("finite_number", (name,))
    assert err["msg"] == "Input should be a finite number (this one overflows a 64-bit float)"


@pytest.mark.parametrize("name", FLOAT_FIELDS)
@pytest.mark.parametrize("largest", [int(sys.float_info.max), -int(sys.float_info.max)])
def test_float_fields_take_the_largest_integer_a_float_holds(name, largest):
    # The largest finite float written out in digits fits a float: taken, or out of the field's bounds,
    # but not "overflows a 64-bit float".
    try:
        CompletionRequest(**{name: largest})
    except ValidationError as e:
        assert [err["loc"] for err in e.errors()] == [(name,)]
        assert e.errors()[0]["type"] in ("less_than_equal", "greater_than_equal", "less_than", "greater_than")


@pytest.mark.parametrize("name", FLOAT_FIELDS)
@pytest.mark.parametrize("bad", ["1", True, [1.0], {}])
def test_float_fields_reject_non_numbers(name, bad):
    err = one_error(CompletionRequest, **{name: bad})
    assert err["loc"] == (name,)


# ------------------------------------------------------------------------------ stop and token lists

def test_stop_takes_a_string_or_up_to_the_limit_of_strings():
    assert CompletionRequest(stop="x").stop == "x"
    assert CompletionRequest(stop=["a"] * MAX_STOP_STRINGS).stop == ["a"] * MAX_STOP_STRINGS
    assert CompletionRequest(stop=[]).stop == []
    with pytest.raises(ValidationError):
        CompletionRequest(stop=["a"] * (MAX_STOP_STRINGS + 1))


@pytest.mark.parametrize("bad", ["", [""], ["a", ""], [1], 1, True])
def test_stop_rejects_empty_strings_and_non_strings(bad):
    with pytest.raises(ValidationError) as e:
        CompletionRequest(stop=bad)
    assert all(err["loc"][0] == "stop" for err in e.value.errors())


STOP_RULE = f"must be a non-empty string or a list of at most {MAX_STOP_STRINGS} non-empty strings"


@pytest.mark.parametrize(("bad", "detail"), [
    ("", ""), (1, ""), (True, ""),
    ([""], "; stop[0] is empty"), (["a", ""], "; stop[1] is empty"), ([1], "; stop[0] is not a string"),
    (["a", 2, ""], "; stop[1] is not a string"),  # the first bad entry
    (["a"] * (MAX_STOP_STRINGS - 1) + [""], f"; stop[{MAX_STOP_STRINGS - 1}] is empty"),  # not too many
    (["a"] * (MAX_STOP_STRINGS + 1), f"; got {MAX_STOP_STRINGS + 1} strings"),
])
def test_a_bad_stop_gets_one_stop_rule_error_that_names_the_culprit(bad, detail):
    err = one_error(CompletionRequest, stop=bad)
    assert (err["type"], err["loc"], err["msg"]) == ("stop_rule", ("stop",), STOP_RULE + detail)


def test_stop_token_ids():
    assert CompletionRequest(stop_token_ids=[0, 50256]).stop_token_ids == [0, 50256]
    assert CompletionRequest(stop_token_ids=[]).stop_token_ids == []
    assert CompletionRequest(stop_token_ids=[2.0]).stop_token_ids == [2]
    for bad in ([-1], [1.5], ["1"], [True], 1):
        err = one_error(CompletionRequest, stop_token_ids=bad)
        assert err["loc"][0] == "stop_token_ids"


def test_logit_bias_keys_are_digit_strings_and_values_bounded():
    r = CompletionRequest(logit_bias={"0": -MAX_ABS_BIAS, "50256": MAX_ABS_BIAS, "7": 1})
    assert r.logit_bias == {"0": -100.0, "50256": 100.0, "7": 1}
    assert MAX_ABS_BIAS == 100.0
    for key in ("-1", "a", "1a", "", " 1", "1.0"):
        err = one_error(CompletionRequest, logit_bias={key: 1.0})
        assert err["loc"] == ("logit_bias",) and err["type"] == "bias_key", key  # the rule, not a regex
        assert err["msg"] == f"keys must be token ids in decimal digits, got {key!r}"
    for value in (100.5, -100.5, math.nan, math.inf, "1", True):
        err = one_error(CompletionRequest, logit_bias={"1": value})
        assert err["loc"] == ("logit_bias", "1"), value


# ------------------------------------------------------------------------------------------ booleans

@pytest.mark.parametrize("name", ["stream", "echo", "ignore_eos", "return_token_ids"])
def test_booleans_are_strict(name):
    assert getattr(CompletionRequest(**{name: True}), name) is True
    assert getattr(CompletionRequest(**{name: False}), name) is False
    for bad in (1, 0, "true", 1.0):
        assert one_error(CompletionRequest, **{name: bad})["type"] == "bool_type"


def test_stream_options():
    assert CompletionRequest(stream_options={"include_usage": True}).stream_options.include_usage is True
    assert StreamOptions().include_usage is None
    assert one_error(StreamOptions, include_usage=None, other=1)["loc"] == ("other",)
    assert one_error(StreamOptions, include_usage=1)["type"] == "bool_type"
    err = one_error(CompletionRequest, stream_options={"include_usage": "yes"})
    assert err["loc"] == ("stream_options", "include_usage")


def test_strings_are_strict():
    for name in ("model", "user"):
        assert getattr(CompletionRequest(**{name: "m"}), name) == "m"
        assert one_error(CompletionRequest, **{name: 1})["type"] == "string_type"


# --------------------------------------------------------------------------- unsupported: best_of, suffix

def test_best_of_only_null_or_one():
    assert CompletionRequest(best_of=1).best_of == 1
    assert CompletionRequest(best_of=1.0).best_of == 1
    for bad in (0, 2, 1.5, "1", True, math.nan):
        err = one_error(CompletionRequest, best_of=bad)
        assert err["type"] == "unsupported", bad
        assert err["loc"] == ("best_of",)
        assert err["msg"] == "is not supported (only null or 1); use n for several choices"


def test_suffix_only_null_or_empty():
    assert CompletionRequest(suffix="").suffix == ""
    for bad in ("x", 1, ["x"]):
        err = one_error(CompletionRequest, suffix=bad)
        assert err["type"] == "unsupported", bad
        assert err["loc"] == ("suffix",)
        assert err["msg"] == "is not supported (only null or empty)"


def test_errors_of_several_fields_each_name_theirs():
    with pytest.raises(ValidationError) as e:
        CompletionRequest(prompt=5, best_of=2, suffix="s", n=0)
    by_field = {err["loc"][0]: err["type"] for err in e.value.errors()}
    assert by_field == {"prompt": "prompt_type", "best_of": "unsupported", "suffix": "unsupported",
                        "n": "greater_than_equal"}


# --------------------------------------------------------------------------- tokenize and detokenize

def test_tokenize_request():
    r = TokenizeRequest()
    assert (r.content, r.prompt, r.add_special_tokens, r.add_special, r.parse_special) == (None,) * 5
    r = TokenizeRequest(content="a", prompt="b", add_special_tokens=True, add_special=False,
                        parse_special=False)
    assert (r.content, r.prompt, r.add_special_tokens, r.add_special, r.parse_special) == (
        "a", "b", True, False, False)
    assert one_error(TokenizeRequest, content=1)["loc"] == ("content",)
    assert one_error(TokenizeRequest, parse_special=1)["type"] == "bool_type"


def test_detokenize_request():
    assert DetokenizeRequest(tokens=[0, 1.0, 50256]).tokens == [0, 1, 50256]
    assert DetokenizeRequest(tokens=[]).tokens == []
    assert one_error(DetokenizeRequest)["type"] == "missing"
    for bad in ([-1], [0.5], ["1"], [True], "1"):
        assert one_error(DetokenizeRequest, tokens=bad)["loc"][0] == "tokens", bad


# --------------------------------------------------------------------------------------- responses

def test_completion_response_shape_and_defaults():
    lp = CompletionLogprobs(tokens=["a"], token_logprobs=[None], top_logprobs=[None], text_offset=[0])
    assert lp.token_ids is None and lp.top_token_ids is None
    choice = CompletionChoice(text="a", index=0, logprobs=lp, finish_reason="length")
    r = CompletionResponse(id="cmpl-1", created=5, model="gpt2", choices=[choice],
                           usage={"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3})
    d = r.model_dump()
    assert d["object"] == "text_completion"
    assert d["usage"] == {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    assert d["choices"][0]["finish_reason"] == "length"
    assert CompletionChoice(text="", index=1).model_dump() == {
        "text": "", "index": 1, "logprobs": None, "finish_reason": None}
    assert CompletionResponse(id="x", created=0, model="m", choices=[]).usage is None
    for reason in ("stop", "length", "abort"):
        assert CompletionChoice(text="", index=0, finish_reason=reason).finish_reason == reason
    with pytest.raises(ValidationError):
        CompletionChoice(text="", index=0, finish_reason="eos")


def test_model_list_health_tokenizer_and_errors():
    card = ModelCard(id="gpt2", created=1, max_model_len=1024, family="gpt2", architecture="gpt2")
    assert card.object == "model" and card.owned_by == "inferno"
    assert ModelList(data=[card]).model_dump()["object"] == "list"
    h = Health(status="ok", model="gpt2")
    assert (h.slots_total, h.slots_free, h.requests_running, h.requests_waiting, h.error) == (None,) * 5
    for status in ("ok", "loading", "shutting_down", "failed"):
        assert Health(status=status, model="m").status == status
    with pytest.raises(ValidationError):
        Health(status="up", model="m")
    assert TokenizeResponse(tokens=[1], count=1, max_model_len=8).count == 1
    assert DetokenizeResponse(content="a", prompt="a").prompt == "a"
    info = TokenizerInfo(model="m", tokenizer="t", eos_token="<|endoftext|>", eos_token_id=50256,
                         vocab_size=50257, max_model_len=1024, special_tokens={"<|endoftext|>": 50256})
    assert info.special_tokens == {"<|endoftext|>": 50256}
    e = ErrorResponse(error={"message": "bad", "type": "invalid_request_error"})
    assert e.model_dump() == {"error": {"message": "bad", "type": "invalid_request_error", "param": None,
                                        "code": None}}
    assert ErrorInfo(message="m", type="t", param="n", code=400).code == 400
