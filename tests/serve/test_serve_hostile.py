"""Hostile input against a real `inferno serve` process (issue 29): huge digit strings in every numeric
and id field, unparseable numbers and deep nesting, the rule and the field in validation errors, lone
surrogates, HEAD probes, an overflowing repetition penalty. No input may reach a 500; the log never holds a
traceback."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serve_helpers import running

JSON = {"content-type": "application/json"}
VOCAB = 50257


@pytest.fixture(scope="module")
def server(small_model_dir, tmp_path_factory):
    home = tmp_path_factory.mktemp("hostile")
    with running(small_model_dir, "--slots", "4", "--queue", "8", home=home) as s:
        yield s
        assert "Traceback" not in s.log() and " 500 " not in s.log(), s.log()[-3000:]


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def post(http, body: bytes | str, path: str = "/v1/completions") -> httpx.Response:
    return http.post(path, content=body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body,
                     headers=JSON)


def error(r: httpx.Response, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    return r.json()["error"]


# ---------------------------------------------------------------------------- huge digit strings


def bias_body(key: str) -> str:
    return '{"prompt": "a", "max_tokens": 1, "logit_bias": {"' + key + '": 1}}'


def test_a_logit_bias_key_of_5000_digits_is_outside_the_vocabulary(http):
    e = error(post(http, bias_body("9" * 5000)))
    assert e["param"] == "logit_bias"
    assert "outside the vocabulary [0, 50257)" in e["message"] and "(5000 digits)" in e["message"]
    assert len(e["message"]) < 200  # the id is abbreviated, not echoed whole


def test_leading_zeros_do_not_make_an_id_long(http):
    r = post(http, bias_body("0" * 5000 + "7"))
    assert r.status_code == 200, r.text


#: Where a number goes in each request: the schema's numeric and id fields (and a logit_bias key, a
#: string of digits). "{}" is replaced by the number's text.
NUMBER_SLOTS = [
    ("/v1/completions", '{"prompt": "a", "max_tokens": {}}'),
    ("/v1/completions", '{"prompt": "a", "max_tokens": 1, "temperature": {}}'),
    ("/v1/completions", '{"prompt": "a", "max_tokens": 1, "top_p": {}}'),
    ("/v1/completions", '{"prompt": "a", "max_tokens": 1, "top_k": {}}'),
    ("/v1/completions", '{"prompt": "a", "max_tokens": 1, "n": {}}'),
    ("/v1/completions", '{"prompt": "a", "max_tokens": 1, "seed": {}}'),
    ("/v1/completions", '{"prompt": "a", "max_tokens": 1, "logprobs": {}}'),
    ("/v1/completions", '{"prompt": "a", "max_tokens": 1, "presence_penalty": {}}'),
    ("/v1/completions", '{"prompt": "a", "max_tokens": 1, "frequency_penalty": {}}'),
    ("/v1/completions", '{"prompt": "a", "max_tokens": 1, "repetition_penalty": {}}'),
    ("/v1/completions", '{"prompt": "a", "max_tokens": 1, "best_of": {}}'),
    ("/v1/completions", '{"prompt": "a", "max_tokens": 1, "logit_bias": {"1": {}}}'),
    ("/v1/completions", '{"prompt": "a", "max_tokens": 1, "logit_bias": {"{}": 1}}'),
    ("/v1/completions", '{"prompt": "a", "max_tokens": 1, "stop_token_ids": [{}]}'),
    ("/v1/completions", '{"prompt": [{}], "max_tokens": 1}'),
    ("/v1/completions", '{"prompt": [[1, {}]], "max_tokens": 1}'),
    ("/detokenize", '{"tokens": [{}]}'),
    ("/v1/inspect", '{"prompt": [1, {}]}'),
    ("/v1/inspect", '{"prompt": "a", "layers": [{}]}'),
    ("/v1/inspect", '{"prompt": "a", "heads": [0, {}]}'),
    ("/v1/inspect", '{"prompt": "a", "positions": [{}]}'),
    ("/v1/inspect", '{"prompt": "a", "top": {}}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "a"}], "max_tokens": {}}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "a"}], "max_tokens": 1, '
     '"max_completion_tokens": {}}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "a"}], "max_tokens": 1, '
     '"logprobs": true, "top_logprobs": {}}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "a"}], "max_tokens": 1, "seed": {}}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "a"}], "max_tokens": 1, '
     '"logit_bias": {"{}": 1}}'),
]

digit_runs = st.integers(1, 9000).map(lambda n: "9" * n) | st.integers(1, 9000).map(lambda n: "1" + "0" * n)
numbers = st.tuples(st.sampled_from(["", "-"]), digit_runs,
                    st.sampled_from(["", ".5", "e5", "e-400", "e400", ".0"])).map("".join)


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(slot=st.sampled_from(NUMBER_SLOTS), number=numbers)
def test_huge_numbers_anywhere_are_never_a_server_error(http, slot, number):
    path, template = slot
    # A logit_bias key is a string of digits: the sign, fraction and exponent make it a non-id key.
    r = post(http, template.replace("{}", number), path)
    assert r.status_code in (200, 400), (path, template, number[:50], r.status_code, r.text[:300])
    if r.status_code == 400:
        message = r.json()["error"]["message"]
        assert "constrained" not in message and "function-" not in message and "[key]" not in message


# ------------------------------------------------------------------------- unparseable JSON


def test_a_number_longer_than_python_reads_says_where(http):
    head = '{"prompt": "a", "seed": '
    e = error(post(http, head + "9" * 5000 + "}"))
    assert e["message"] == (f"invalid JSON in the request body at character {len(head)}: a number of 5000 "
                            "digits (this server reads at most 4300)")
    # A digit string inside a string is text, not a number.
    head = '{"prompt": "' + "9" * 5000 + '", "seed": '
    message = error(post(http, head + "9" * 5000 + "}"))["message"]
    assert message.startswith(f"invalid JSON in the request body at character {len(head)}:")


def test_deep_nesting_says_where(http):
    e = error(post(http, '{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}"))
    assert e["message"] == "invalid JSON in the request body at character 42: nested deeper than 32 levels"
    # Brackets inside strings do not count; nesting a request needs is fine.
    assert post(http, json.dumps({"prompt": "[" * 40, "max_tokens": 1})).status_code == 200
    assert post(http, json.dumps({"prompt": [[1, 2]] * 50, "max_tokens": 1})).status_code == 400  # > queue


# -------------------------------------------------------------------------- validation messages


@pytest.mark.parametrize("field, value, param, words", [
    ("stop", ["x"] * 17, "stop", ["at most 16", "got 17"]),
    ("stop", "", "stop", ["non-empty"]),
    ("stop", ["a", ""], "stop", ["stop[1] is empty"]),
    ("stop", 5, "stop", ["a non-empty string or a list"]),
    ("logit_bias", {"x": 1}, "logit_bias", ["token ids in decimal digits", "'x'"]),
    ("logit_bias", {"1": "x"}, "logit_bias.1", ["valid number"]),
    ("stop_token_ids", [1, -1], "stop_token_ids[1]", ["greater than or equal to 0"]),
    ("stream_options", "x", "stream_options", ["must be a JSON object"]),
    ("prompt", [[1], "a"], "prompt", ["a list of token-id lists"]),
])
def test_errors_say_the_rule_and_name_the_field_as_sent(http, field, value, param, words):
    e = error(post(http, json.dumps({"prompt": "a", "max_tokens": 1, field: value})))
    assert e["param"] == param
    assert e["message"].startswith(param)
    for w in words:
        assert w in e["message"]
    for internal in ("constrained", "[key]", "instance of", "function-", "list["):
        assert internal not in e["message"]


# ------------------------------------------------------------------------------ lone surrogates


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", '{"prompt": "a\\ud800", "max_tokens": 1}', "prompt"),
    ("/v1/completions", '{"prompt": ["ok", "\\udfff b"], "max_tokens": 1}', "prompt[1]"),
    ("/v1/completions", '{"prompt": "a", "stop": "\\udc00", "max_tokens": 1}', "stop"),
    ("/v1/completions", '{"prompt": "a", "stop": ["x", "\\uDBFF"], "max_tokens": 1}', "stop[1]"),
    ("/v1/completions", '{"prompt": "a", "user": "\\ud800", "max_tokens": 1}', "user"),
    ("/v1/completions", '{"prompt": "a", "logit_bias": {"\\ud800": 1}, "max_tokens": 1}', "logit_bias"),
    ("/tokenize", '{"content": "\\ud800"}', "content"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi \\ud800"}]}',
     "messages[0].content"),
    ("/v1/chat/completions",
     '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udc00"}]}]}',
     "messages[0].content[0].text"),
])
def test_escaped_lone_surrogates_are_refused_naming_the_field(http, path, body, param):
    e = error(post(http, body, path))
    assert e["param"] == param and "lone UTF-16 surrogate" in e["message"]
    assert e["message"].startswith(param)


def test_raw_surrogate_bytes_are_refused_like_escaped_ones(http):
    raw = b'{"prompt": "a\xed\xa0\x80", "max_tokens": 1}'  # U+D800 encoded as if it were a character
    e = error(post(http, raw))
    assert e["param"] == "prompt" and "lone UTF-16 surrogate" in e["message"]


def test_a_surrogate_pair_is_a_character(http):
    r = post(http, '{"prompt": "\\ud83d\\ude00", "max_tokens": 1, "echo": true}')
    assert r.status_code == 200 and r.json()["choices"][0]["text"].startswith("\U0001f600")


# ------------------------------------------------------------------------------------------ HEAD


@pytest.mark.parametrize("path", ["/health", "/v1/models", "/tokenizer_info", "/metrics", "/",
                                  "/openapi.json"])
def test_head_answers_as_get_without_a_body(http, path):
    got = http.get(path)
    head = http.head(path)
    assert head.status_code == got.status_code == 200
    assert head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"]
    if path != "/metrics":  # the counters move between the two requests
        assert head.headers["content-length"] == got.headers["content-length"]


def test_head_of_a_post_route_is_405(http):
    assert http.head("/v1/completions").status_code == 405


# ----------------------------------------------------------------------------- infinite logits


def test_a_repetition_penalty_that_overflows_samples_the_seen_tokens(http, small_pipe):
    # 1e-310 divides every seen token's (positive) logit into +inf: the mass is theirs, not <|endoftext|>'s.
    prompt = "The quick brown fox jumps over the lazy dog"
    r = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 8, "temperature": 1, "seed": 0,
                                           "repetition_penalty": 1e-310, "logprobs": 0,
                                           "return_token_ids": True})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert set(choice["logprobs"]["token_ids"]) <= set(small_pipe.tokenizer.encode(prompt))
