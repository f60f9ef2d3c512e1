"""The server through the official OpenAI client (and plain HTTP where the client cannot say it):
completions, streaming, every prompt form, n, echo, logprobs against the in-process pipeline, errors."""

from __future__ import annotations

import json
import socket

import httpx
import pytest
from serve_helpers import running, stream_events

openai = pytest.importorskip("openai")

PROMPT = "The quick brown fox"
EOS = 50256


@pytest.fixture(scope="module")
def server(small_model_dir, tmp_path_factory):
    flags = ("--slots", "4", "--queue", "8", "--served-model-name", "gpt2")  # the model the requests name
    with running(small_model_dir, *flags, home=tmp_path_factory.mktemp("openai")) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def complete(client, **kwargs):
    return client.completions.create(model="gpt2", **{"prompt": PROMPT, **kwargs})


def check_logprobs_shape(lp, texts_of_ids=None):
    """Every position: the chosen token's float is its top_logprobs entry's; offsets never go back."""
    n = len(lp.tokens)
    assert len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    assert lp.text_offset == sorted(lp.text_offset)
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        if value is None:
            assert top is None
            continue
        assert top[token] == value  # the very same float


# -------------------------------------------------------------------------------------------- basics


def test_models_health_and_tokenizer_info(client, http):
    models = client.models.list().data
    assert [m.id for m in models] == ["gpt2"]  # --served-model-name
    assert http.get("/v1/models").json()["data"][0]["max_model_len"] == 128
    health = http.get("/health")
    assert health.status_code == 200
    assert health.json()["status"] == "ok" and health.json()["slots_total"] == 4
    info = http.get("/tokenizer_info").json()
    assert info["eos_token"] == "<|endoftext|>" and info["eos_token_id"] == EOS
    assert info["vocab_size"] == 50257 and info["max_model_len"] == 128


def test_greedy_text_and_logprobs_match_the_pipeline(client, small_pipe, token_texts):
    r = complete(client, max_tokens=8, temperature=0, logprobs=3)
    ref = small_pipe.generate(PROMPT, max_new_tokens=8, temperature=0.0, logprobs=3)
    (c,) = r.choices
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert c.index == 0 and c.text == ref.text and c.finish_reason == ref.finish_reason
    assert r.usage.prompt_tokens == len(ref.prompt_ids) == 4
    assert r.usage.completion_tokens == len(ref.ids) and r.usage.total_tokens == 4 + len(ref.ids)
    lp = c.logprobs
    assert lp.tokens == [token_texts[i] for i in ref.ids]
    check_logprobs_shape(lp)
    for k, t in enumerate(ref.logprobs):
        assert lp.token_logprobs[k] == pytest.approx(t.logprob, abs=1e-5)
        expected = {token_texts[i]: v for i, v in t.top}
        expected.setdefault(token_texts[t.id], t.logprob)
        assert list(lp.top_logprobs[k]) == list(expected)  # most likely first, then the chosen one
        assert lp.top_logprobs[k] == pytest.approx(expected, abs=1e-5)
    assert lp.text_offset[0] == 0


def test_sampling_with_a_seed_matches_the_pipeline(client, small_pipe, token_texts):
    r = complete(client, max_tokens=12, seed=7, logprobs=0)  # temperature defaults to 1, as OpenAI's
    ref = small_pipe.generate(PROMPT, max_new_tokens=12, temperature=1.0, seed=7)
    assert r.choices[0].text == ref.text
    assert r.choices[0].logprobs.tokens == [token_texts[i] for i in ref.ids]
    assert complete(client, max_tokens=12, seed=7).choices[0].text == ref.text  # reproducible


def test_streaming_pieces_join_to_the_text(client):
    for seed in (1, 2):
        whole = complete(client, max_tokens=20, seed=seed, logprobs=1)
        chunks = list(complete(client, max_tokens=20, seed=seed, logprobs=1, stream=True,
                               stream_options={"include_usage": True}))
        *token_chunks, usage = chunks
        assert usage.choices == [] and usage.usage == whole.usage
        assert all(ch.object == "text_completion" and ch.id == chunks[0].id for ch in chunks)
        assert "".join(ch.choices[0].text for ch in token_chunks) == whole.choices[0].text
        assert [ch.choices[0].finish_reason for ch in token_chunks][-1] == whole.choices[0].finish_reason
        assert all(ch.choices[0].finish_reason is None for ch in token_chunks[:-1])
        streamed = [t for ch in token_chunks for t in ch.choices[0].logprobs.tokens]
        assert streamed == whole.choices[0].logprobs.tokens
        offsets = [o for ch in token_chunks for o in ch.choices[0].logprobs.text_offset]
        assert offsets == whole.choices[0].logprobs.text_offset


def test_prompt_forms(client, small_pipe):
    ids = small_pipe.tokenizer.encode(PROMPT)
    text = complete(client, max_tokens=6, temperature=0).choices[0].text
    assert complete(client, prompt=ids, max_tokens=6, temperature=0).choices[0].text == text
    both = complete(client, prompt=[ids, ids[:2]], max_tokens=6, temperature=0)
    assert [c.index for c in both.choices] == [0, 1]
    assert both.choices[0].text == text
    short = complete(client, prompt=ids[:2], max_tokens=6, temperature=0)
    assert both.choices[1].text == short.choices[0].text
    assert both.usage.prompt_tokens == len(ids) + 2
    # An empty prompt is <|endoftext|>: unconditional text.
    assert complete(client, prompt="", max_tokens=5, temperature=0).choices[0].text == \
        complete(client, prompt=[EOS], max_tokens=5, temperature=0).choices[0].text
    # <|endoftext|> in a text prompt is the special token.
    assert complete(client, prompt="<|endoftext|>", max_tokens=1, echo=True, logprobs=0,
                    temperature=0).choices[0].logprobs.tokens[0] == "<|endoftext|>"


def test_n_choices_are_prompt_major_with_seed_plus_j(client, small_pipe):
    prompts = ["Once upon a time", "The meaning of life is"]
    # top_k: a draw from the long tail (temperature 1, no cut) can land on a neighbouring id when the
    # choices decode as one batch instead of alone (float32 rounding of a GEMM against a GEMV).
    top_k = {"top_k": 40}
    r = complete(client, prompt=prompts, n=3, seed=10, max_tokens=8, extra_body=top_k)
    assert [c.index for c in r.choices] == list(range(6))
    for i, prompt in enumerate(prompts):
        for j in range(3):
            alone = complete(client, prompt=prompt, seed=10 + j, max_tokens=8, extra_body=top_k).choices[0]
            assert r.choices[i * 3 + j].text == alone.text, (i, j)
    texts = [c.text for c in r.choices[:3]]
    assert len(set(texts)) > 1  # different seeds, different samples
    # A prompt's tokens count once, however many choices share them.
    assert r.usage.prompt_tokens == sum(len(small_pipe.tokenizer.encode(p)) for p in prompts)
    assert r.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in
                                            complete(client, prompt=prompts, n=3, seed=10, max_tokens=8,
                                                     logprobs=0).choices)


def test_n_streams_every_choice(client):
    whole = complete(client, prompt=["a", "b"], n=2, seed=3, max_tokens=10)
    chunks = list(complete(client, prompt=["a", "b"], n=2, seed=3, max_tokens=10, stream=True))
    for c in whole.choices:
        mine = [ch.choices[0] for ch in chunks if ch.choices[0].index == c.index]
        assert "".join(x.text for x in mine) == c.text
        assert mine[-1].finish_reason == c.finish_reason


# ---------------------------------------------------------------------------------------------- echo


def test_echo_with_max_tokens_0_is_the_score(client, small_pipe, token_texts):
    r = complete(client, echo=True, max_tokens=0, logprobs=2)
    score = small_pipe.score(PROMPT, top_logprobs=2)
    (c,) = r.choices
    assert c.text == PROMPT and c.finish_reason == "length"
    assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens == len(score.ids)
    lp = c.logprobs
    assert lp.tokens == [token_texts[i] for i in score.ids]
    # The engine scores the prompt as it prefills it: Pipeline.score's to float32 rounding (docs/serving.md).
    assert lp.token_logprobs[0] is None
    assert lp.token_logprobs[1:] == pytest.approx(score.logprobs[1:], abs=1e-5)
    assert lp.top_logprobs[0] is None
    for k in range(1, len(score.ids)):
        expected = {token_texts[i]: v for i, v in score.top[k]}
        expected.setdefault(token_texts[score.ids[k]], score.logprobs[k])
        assert lp.top_logprobs[k] == pytest.approx(expected, abs=1e-5)
    assert lp.text_offset == [0, 3, 9, 15]
    check_logprobs_shape(lp)


def test_echo_with_max_tokens_1(client, small_pipe, token_texts):
    r = complete(client, echo=True, max_tokens=1, logprobs=1, temperature=0)
    ref = small_pipe.generate(PROMPT, max_new_tokens=1, temperature=0.0, logprobs=1)
    score = small_pipe.score(PROMPT, top_logprobs=1)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == PROMPT + ref.text
    assert lp.tokens == [token_texts[i] for i in score.ids + ref.ids]
    assert lp.token_logprobs[0] is None
    assert lp.token_logprobs[1:4] == pytest.approx(score.logprobs[1:], abs=1e-5)
    assert lp.token_logprobs[4] == pytest.approx(ref.logprobs[0].logprob, abs=1e-5)
    assert lp.text_offset[4] == len(PROMPT)
    check_logprobs_shape(lp)
    assert r.usage.completion_tokens == 1


def test_echo_of_a_one_token_prompt(client):
    r = complete(client, prompt="The", echo=True, max_tokens=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == "The"
    assert lp.tokens == ["The"] and lp.token_logprobs == [None] and lp.top_logprobs == [None]


def test_echo_streams_the_prompt_first(client):
    chunks = list(complete(client, echo=True, max_tokens=3, seed=1, stream=True))
    assert chunks[0].choices[0].text == PROMPT
    whole = complete(client, echo=True, max_tokens=3, seed=1)
    assert "".join(ch.choices[0].text for ch in chunks) == whole.choices[0].text
    zero = list(complete(client, echo=True, max_tokens=0, stream=True))
    assert [ch.choices[0].text for ch in zero] == [PROMPT, ""]
    assert zero[-1].choices[0].finish_reason == "length"


def test_tokens_that_are_not_utf8_alone_are_bytes(client, token_texts):
    # "’" is two GPT-2 tokens: b"\xe2\x80" and b"\x99".
    r = complete(client, prompt=[447, 247], echo=True, max_tokens=0, logprobs=0)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == "’"
    assert lp.tokens == ["bytes:\\xe2\\x80", "bytes:\\x99"]
    assert lp.text_offset == [0, 0]  # the character starts with the token that completes it
    assert list(lp.top_logprobs[1]) == ["bytes:\\x99"]
    # Sampled tokens of a random model are often such pieces: the keys stay distinct per position.
    r = complete(client, max_tokens=40, seed=5, logprobs=20, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert any(t.startswith("bytes:") for top in lp.top_logprobs for t in top)
    assert all(len(top) in (20, 21) for top in lp.top_logprobs)
    assert set(lp.tokens) <= set(token_texts.values())


# ---------------------------------------------------------------------------- options and stopping


def test_stop_strings_are_cut_as_the_pipeline_cuts_them(client, small_pipe):
    full = small_pipe.generate(PROMPT, max_new_tokens=8, temperature=0.0).text
    stop = full[len(full) // 2:][:3]  # three characters from the middle of the greedy text
    assert "\ufffd" not in stop and full.index(stop) > 0
    ref = small_pipe.generate(PROMPT, max_new_tokens=8, temperature=0.0, stop=[stop])
    r = complete(client, max_tokens=8, temperature=0, stop=stop)
    assert r.choices[0].text == ref.text == full[: full.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    chunks = list(complete(client, max_tokens=8, temperature=0, stop=[stop, "zzz"], stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == ref.text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_eos_ends_a_choice_unless_ignore_eos(client):
    r = complete(client, max_tokens=5, temperature=0, logit_bias={str(EOS): 100})
    assert r.choices[0].text == "" and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == 1
    r = complete(client, max_tokens=5, temperature=0, logit_bias={str(EOS): 100}, logprobs=0,
                 extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    assert r.choices[0].logprobs.tokens == ["<|endoftext|>"] * 5


def test_max_tokens_beyond_the_context_is_refused_as_openai_does(client):
    # It was capped silently to what the context had left (issue 39): refused now, as OpenAI refuses it.
    with pytest.raises(openai.BadRequestError) as info:
        complete(client, max_tokens=5000, temperature=0)
    err = info.value.body
    assert info.value.status_code == 400 and err["param"] == "max_tokens"
    assert err["code"] == "context_length_exceeded"
    assert err["message"] == ("This model's maximum context length is 128 tokens. However, you requested "
                              "5004 tokens (4 in prompt, 5000 in max_tokens). Please reduce the length of "
                              "prompt or max_tokens.")
    r = complete(client, max_tokens=128 - 4, temperature=0, extra_body={"ignore_eos": True})  # just fits
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 128 - 4
    with pytest.raises(openai.BadRequestError, match="you requested 129 tokens"):
        complete(client, max_tokens=128 - 3, temperature=0)
    # The default max_tokens (16, not sent) is bounded by the context instead.
    full = complete(client, prompt=[464] * 128)
    assert full.choices[0].text == "" and full.choices[0].finish_reason == "length"


def test_extensions_and_penalties_match_the_pipeline(client, small_pipe):
    greedy = complete(client, max_tokens=10, temperature=0).choices[0].text
    assert complete(client, max_tokens=10, seed=3, extra_body={"top_k": 1}).choices[0].text == greedy
    for kwargs, ref_kwargs in [
        ({"extra_body": {"repetition_penalty": 1.5}}, {"repetition_penalty": 1.5}),
        ({"presence_penalty": 1.0, "frequency_penalty": 0.5},
         {"presence_penalty": 1.0, "frequency_penalty": 0.5}),
        ({"logit_bias": {"20101": -100}}, {"logit_bias": {20101: -100.0}}),
        ({"top_p": 0.5, "seed": 4, "temperature": 0.9}, {"top_p": 0.5, "seed": 4, "temperature": 0.9}),
    ]:
        r = complete(client, max_tokens=10, **{"temperature": 0, **kwargs})
        ref = small_pipe.generate(PROMPT, max_new_tokens=10, **{"temperature": 0.0, **ref_kwargs})
        assert r.choices[0].text == ref.text, kwargs


def raw_post(url: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """A request as written here, byte for byte (httpx refuses a header such as "Bearer ")."""
    host, port = url.removeprefix("http://").split(":")
    head = "".join(f"{k}: {v}\r\n" for k, v in {"Host": host, "Content-Length": str(len(body)),
                                                "Connection": "close", **headers}.items())
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\n{head}\r\n".encode() + body)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_unknown_fields_are_refused_and_authorization_ignored(http, server, client):
    r = http.post("/v1/completions", json={"prompt": "a", "max_tokens": 2, "frobnicate": [1]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "frobnicate"
    with pytest.raises(openai.BadRequestError, match="did you mean 'temperature'"):
        complete(client, max_tokens=2, extra_body={"temprature": 0})
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="gpt-3.5-turbo-instruct", prompt="a", max_tokens=2)
    assert info.value.body["code"] == "model_not_found"
    body = {"prompt": "a", "max_tokens": 2, "user": "u"}
    for headers in ({"Authorization": "Basic abc"}, {"Authorization": "Bearer x"}, {}):
        r = http.post("/v1/completions", json=body, headers=headers)
        assert r.status_code == 200, r.text
    raw = raw_post(server.url, "/v1/completions", json.dumps(body).encode(),
                   {"Content-Type": "application/json", "Authorization": "Bearer "})
    assert raw.startswith(b"HTTP/1.1 200"), raw[:200]


# -------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("kwargs, param", [
    ({"temperature": 3}, "temperature"),
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"n": 0}, "n"),
    ({"n": 17}, "n"),
    ({"n": 5}, "n"),  # more than the server's 4 slots
    ({"logprobs": 21}, "logprobs"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),  # only with echo
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"logit_bias": {"1": 101}}, "logit_bias.1"),
    ({"logit_bias": {"50257": 1}}, "logit_bias"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [[]]}, "prompt"),
    ({"prompt": [1.5]}, "prompt"),
    ({"prompt": [50257]}, "prompt"),
    ({"prompt": ["a"] * 9}, "prompt"),  # more prompts than the wait queue holds
    ({"stop": ["x"] * 17}, "stop"),
    ({"stop": ""}, "stop"),
    ({"seed": -1}, "seed"),
    ({"best_of": 2}, "best_of"),
    ({"suffix": "the end"}, "suffix"),
    ({"extra_body": {"top_k": -2}}, "top_k"),
    ({"extra_body": {"repetition_penalty": 0}}, "repetition_penalty"),
    ({"extra_body": {"stop_token_ids": [50257]}}, "stop_token_ids"),
])
def test_bad_values_are_400_naming_the_field(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as info:
        complete(client, **kwargs)
    e = info.value
    assert e.status_code == 400
    assert e.body["type"] == "invalid_request_error"
    assert e.body["param"] == param  # the field as the client sent it, no pydantic internals
    assert e.body["message"]


def test_unsupported_fields_say_so(client):
    with pytest.raises(openai.BadRequestError, match="best_of is not supported"):
        complete(client, best_of=3)
    with pytest.raises(openai.BadRequestError, match="suffix is not supported"):
        complete(client, suffix="x")


def test_a_prompt_longer_than_the_context(client):
    with pytest.raises(openai.BadRequestError) as info:
        complete(client, prompt=[464] * 200)
    body = info.value.body
    assert body["code"] == "context_length_exceeded" and body["param"] == "prompt"
    assert "128" in body["message"] and "200" in body["message"]


@pytest.mark.parametrize("content", [
    b'{"prompt": "a", "temperature": NaN}',
    b'{"prompt": "a", "temperature": Infinity}',
    b'{"prompt": "a", "logit_bias": {"1": -Infinity}}',
    b'{"prompt": "a",',
    b"[1, 2]",
    b'"a"',
    b"",
    b"\xff\xfe",
    b'{"prompt": "a", "max_tokens": "16"}',
    b'{"prompt": "a", "max_tokens": 1.5}',
    b'{"prompt": "a", "stream": 1}',
    b'{"prompt": "a", "echo": "true"}',
    b'{"prompt": {"a": 1}}',
    b'{"prompt": "a", "stream_options": {"include_usage": "yes"}}',
])
def test_malformed_bodies_are_400(http, content):
    r = http.post("/v1/completions", content=content, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_bodies_must_be_application_json(http):
    # A page on any site may send text/plain, or no type at all, without a CORS preflight: 415.
    for headers in ({"content-type": "text/plain"}, {}):
        r = http.post("/v1/completions", content=b'{"prompt": "a"}', headers=headers)
        assert r.status_code == 415 and "application/json" in r.json()["error"]["message"]
    r = http.post("/v1/completions", content=b'{"prompt": "a", "max_tokens": 1}',
                  headers={"content-type": "application/json; charset=utf-8"})
    assert r.status_code == 200, r.text


def test_unknown_routes_and_methods(http):
    r = http.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = http.get("/v1/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_bodies_over_1_mib_are_413(http):
    big = json.dumps({"prompt": "a" * (1 << 20)}).encode()
    r = http.post("/v1/completions", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    def chunked():  # no Content-Length: the limit is counted while reading
        for _ in range(20):
            yield b" " * 65536

    r = http.post("/v1/completions", content=chunked(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    # Just under the limit is read (and then refused for what it says).
    r = http.post("/v1/completions", content=b" " * ((1 << 20) - 100) + b'{"prompt": 1}',
                  headers={"content-type": "application/json"})
    assert r.status_code == 400


# ----------------------------------------------------------------------------------- other routes


def test_tokenize_and_detokenize(http, small_pipe):
    ids = small_pipe.tokenizer.encode("Hello world")
    for body in ({"content": "Hello world"}, {"prompt": "Hello world", "add_special_tokens": True}):
        r = http.post("/tokenize", json=body)
        assert r.status_code == 200
        assert r.json() == {"tokens": ids, "count": len(ids), "max_model_len": 128}
    special = http.post("/tokenize", json={"content": "Hi<|endoftext|>"}).json()["tokens"]
    assert special[-1] == EOS
    plain = http.post("/tokenize", json={"content": "Hi<|endoftext|>", "parse_special": False})
    plain = plain.json()["tokens"]
    assert EOS not in plain and len(plain) > 2
    assert http.post("/detokenize", json={"tokens": ids + [EOS]}).json() == {
        "content": "Hello world<|endoftext|>", "prompt": "Hello world<|endoftext|>"}
    assert http.post("/detokenize", json={"tokens": [50257]}).status_code == 400
    assert http.post("/detokenize", json={"tokens": [-1]}).status_code == 400
    assert http.post("/tokenize", json={}).status_code == 400


def test_metrics(http, client):
    with complete(client, max_tokens=3, n=2, stream=True) as stream:
        assert len(list(stream)) >= 2  # read to the end: closed at once, it may be cancelled before a token
    assert http.post("/v1/completions", json={"prompt": "a", "max_tokens": -1}).status_code == 400
    text = http.get("/metrics")
    assert text.headers["content-type"].startswith("text/plain")
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.text.splitlines()
              if line and not line.startswith("#")}
    for name in ("inferno_requests_running", "inferno_requests_waiting", "inferno_slots_busy"):
        assert name in values
    assert values["inferno_slots_total"] == 4
    assert values["inferno_prompt_tokens_total"] > 0 and values["inferno_generation_tokens_total"] > 0
    assert values["inferno_time_to_first_token_seconds_count"] > 0
    assert values["inferno_inter_token_latency_seconds_count"] > 0
    assert 'inferno_http_requests_total{path="/v1/completions",status="400"}' in values


def test_raw_stream_events(http, server):
    events = stream_events(http, server.url, {"prompt": "a", "max_tokens": 4, "stream": True, "seed": 1})
    assert events[-1] == "[DONE]"
    assert all(e["object"] == "text_completion" and "usage" not in e for e in events[:-1])
