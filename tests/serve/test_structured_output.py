"""Structured output through the server (issue #42): OpenAI's ``response_format``, vLLM's
``structured_outputs`` and its older ``guided_*`` names, on completions and chat, streaming or not,
n > 1, with logprobs (and the ``forced`` extension), stop strings and max_tokens; and the 400s.

The app runs in process (Starlette's TestClient) on the small random model at temperature 1, where
unconstrained text is gibberish: every answer that conforms is the constraint's doing. The official
OpenAI client talks to it through the TestClient."""

from __future__ import annotations

import json
import re
import sys
import time

import pytest
from serve_helpers import sse_data
from starlette.testclient import TestClient

from inferno.serve import ServeConfig, create_app

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance", reason="structured output needs llguidance (pip install "
                    "'inferno-gpt2[structured]')")

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pet": {"enum": ["cat", "dog", None]},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
CODE = r"[0-9]{3}-[a-z]{2}\."


@pytest.fixture(scope="module")
def http(small_pipe):
    app = create_app(ServeConfig(model_id="gpt2", slots=4, download=False), pipeline=small_pipe)
    with TestClient(app) as c:
        deadline = time.monotonic() + 30
        while c.get("/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        yield c


@pytest.fixture(scope="module")
def client(http):
    return openai.OpenAI(base_url=str(http.base_url) + "/v1", api_key="x", http_client=http, max_retries=0)


def _stream(http, path: str, body: dict) -> list:
    with http.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        return [d if d == "[DONE]" else json.loads(d) for d in sse_data(r.iter_lines())]


def _error(r, param: str, *needles: str) -> str:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    for needle in needles:
        assert needle in error["message"], error["message"]
    return error["message"]


# ------------------------------------------------------------------------------------ conforming text


def test_chat_json_schema_each_of_n_choices_validates(client):
    reply = client.chat.completions.create(
        model="gpt2", messages=[{"role": "user", "content": "Who?"}], n=3, temperature=1, seed=5,
        max_tokens=60, response_format=JSON_FORMAT)
    assert len(reply.choices) == 3
    texts = set()
    for choice in reply.choices:
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), PERSON)
        texts.add(choice.message.content)
    assert len(texts) > 1  # each choice samples on its own (seed + j)


def test_the_openai_clients_parse_with_a_pydantic_model(client):
    from typing import Literal

    from pydantic import BaseModel, Field

    class Pet(BaseModel):
        name: str = Field(max_length=6)
        kind: Literal["cat", "dog"]

    reply = client.chat.completions.parse(model="gpt2", messages=[{"role": "user", "content": "A pet?"}],
                                          temperature=1, seed=9, max_tokens=40, response_format=Pet)
    assert isinstance(reply.choices[0].message.parsed, Pet)  # the client's own strict schema and parser


def test_completions_json_schema_streamed_with_logprobs(client):
    stream = client.completions.create(model="gpt2", prompt="Data:", n=2, temperature=1, seed=3,
                                       max_tokens=60, logprobs=2, stream=True,
                                       extra_body={"response_format": JSON_FORMAT})
    texts, finish, tokens = {0: "", 1: ""}, {}, {0: [], 1: []}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.text
            if c.logprobs:
                tokens[c.index] += c.logprobs.tokens
                for top in c.logprobs.top_logprobs:
                    assert 1 <= len(top) <= 3  # only allowed tokens (and the chosen one)
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert finish == {0: "stop", 1: "stop"}
    for k in (0, 1):
        jsonschema.validate(json.loads(texts[k]), PERSON)
        assert len(tokens[k]) >= 5


def test_json_object_mode(client):
    reply = client.completions.create(model="gpt2", prompt="{", temperature=1, seed=1, max_tokens=24,
                                      stop=None, extra_body={"response_format": {"type": "json_object"}})
    choice = reply.choices[0]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.text), dict)
    else:  # the object did not close within 24 tokens: it is one as far as it got
        assert choice.finish_reason == "length" and choice.text.lstrip().startswith("{")


def test_regex_via_structured_outputs_with_forced_tokens(client):
    reply = client.completions.create(
        model="gpt2", prompt="Code:", n=2, temperature=1, seed=7, max_tokens=20, logprobs=1,
        extra_body={"structured_outputs": {"regex": CODE}, "return_token_ids": True})
    for choice in reply.choices:
        assert choice.finish_reason == "stop"
        assert re.fullmatch(CODE, choice.text), choice.text
        lp = choice.logprobs.model_extra
        forced = lp["forced"]
        assert len(forced) == len(choice.logprobs.tokens) == len(lp["token_ids"])
        # After the two letters "." is the only token the regex allows (a longer one would not end it).
        assert choice.logprobs.tokens[-1] == "." and forced[-1] is True
        assert not all(forced)  # the digits were chosen among many
        for k, f in enumerate(forced):  # a forced token is certain: logprob 0, no alternative
            if f:
                assert choice.logprobs.token_logprobs[k] == 0.0 and len(choice.logprobs.top_logprobs[k]) == 1


def test_the_engine_in_the_server_gives_the_python_apis_text(http, small_pipe):
    r = http.post("/v1/completions", json={"prompt": "Code:", "n": 2, "temperature": 1, "seed": 11,
                                           "max_tokens": 20, "guided_regex": CODE})
    for j, choice in enumerate(r.json()["choices"]):  # choice j samples with seed + j
        alone = small_pipe.generate("Code:", max_new_tokens=20, temperature=1, seed=11 + j, regex=CODE)
        assert (choice["text"], choice["finish_reason"]) == (alone.text, alone.finish_reason)


def test_guided_aliases_are_honoured(http):
    r = http.post("/v1/completions", json={"prompt": "Is it?", "n": 3, "temperature": 1, "seed": 2,
                                           "max_tokens": 8, "guided_choice": ["yes", "no", "maybe not"]})
    assert r.status_code == 200, r.text
    assert {c["text"] for c in r.json()["choices"]} <= {"yes", "no", "maybe not"}
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                "temperature": 1, "seed": 4, "max_tokens": 10,
                                                "guided_regex": "[A-Z][a-z]{1,3}!"})
    assert r.status_code == 200, r.text
    assert re.fullmatch("[A-Z][a-z]{1,3}!", r.json()["choices"][0]["message"]["content"])


def test_chat_streaming_choice_and_stop_strings(http):
    events = _stream(http, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Say it"}], "temperature": 1, "seed": 0, "max_tokens": 10,
        "structured_outputs": {"choice": ["hello world"]}, "stop": [" "]})
    assert events[-1] == "[DONE]"
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"])
    assert text == "hello"  # the constraint's text, cut by the stop string
    assert [e["choices"][0]["finish_reason"] for e in events[:-1] if e["choices"]][-1] == "stop"


def test_max_tokens_ends_it_early_with_length(http):
    r = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "temperature": 1, "seed": 0,
                                           "response_format": JSON_FORMAT})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length" and choice["text"].startswith("{")


def test_unconstrained_logprobs_keep_their_shape(http):
    r = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "logprobs": 1,
                                           "return_token_ids": True})
    assert "forced" not in r.json()["choices"][0]["logprobs"]


# ----------------------------------------------------------------------------------------------- 400s


@pytest.mark.parametrize("fields, param", [
    ({"structured_outputs": {"regex": "[0-9"}}, "structured_outputs.regex"),
    ({"guided_regex": "(a"}, "guided_regex"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "response_format.json_schema.schema"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"structured_outputs": {"grammar": "start: ("}}, "structured_outputs.grammar"),
    # Valid alone; refused only when compiled for the model's tokenizer (no token 99999).
    ({"structured_outputs": {"grammar": "start: <[99999]>"}}, "structured_outputs.grammar"),
])
def test_an_invalid_constraint_is_a_400_naming_its_field(http, fields, param):
    _error(http.post("/v1/completions", json={"prompt": "x", **fields}), param)


def test_two_constraints_are_a_400_naming_both(http):
    msg = _error(http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"},
        "guided_regex": "a"}), "guided_regex", "response_format")
    assert "one" in msg
    _error(http.post("/v1/completions", json={"prompt": "x", "structured_outputs": {"regex": "a",
                                                                                     "choice": ["b"]}}),
           "structured_outputs.choice", "structured_outputs.regex")


@pytest.mark.parametrize("fields, param, needle", [
    ({"response_format": {"type": "yaml"}}, "response_format", '"json_schema"'),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema", "required"),
    ({"structured_outputs": {}}, "structured_outputs", "regex"),
    ({"structured_outputs": {"regexp": "a"}}, "structured_outputs.regexp", "did you mean 'regex'"),
    ({"guided_regexp": "a"}, "guided_regexp", "did you mean 'guided_regex'"),
])
def test_malformed_fields_are_400s(http, fields, param, needle):
    _error(http.post("/v1/completions", json={"prompt": "x", **fields}), param, needle)


def test_without_llguidance_the_400_says_how_to_install_it(http, monkeypatch):
    monkeypatch.setitem(sys.modules, "llguidance", None)  # `import llguidance` raises ImportError
    msg = _error(http.post("/v1/completions", json={"prompt": "x", "guided_regex": "[a-z]{7}q"}),
                 "guided_regex")
    assert "pip install" in msg and "structured" in msg


def test_the_openapi_document_has_the_fields(http):
    doc = http.get("/openapi.json").json()
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        props = doc["components"]["schemas"][name]["properties"]
        assert {"response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
                "guided_grammar"} <= set(props)
    so = doc["components"]["schemas"]["StructuredOutputs"]["properties"]
    assert set(so) == {"json", "regex", "choice", "grammar", "json_object"}
    assert "schema" in doc["components"]["schemas"]["JsonSchemaFormat"]["properties"]
