"""Every route of the server in this process (Starlette's TestClient on `create_app`), each answer
compared with what the same model gives in process: completions and chat (whole and streamed, the
access log's line), the model card, /health, /metrics, the tokenizer routes, /v1/inspect, and each
route's 400s in OpenAI's error shape. The subprocess tests show the same through a real server; these
are the ones mutation testing can see."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from serve_helpers import sse_data
from starlette.testclient import TestClient

from inferno.serve import ServeConfig, create_app
from inferno.serve.schemas import MAX_INSPECT_WEIGHTS

MODEL = "tiny-test"
TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"


def _app(small_pipe, small_model_dir, **config):
    return create_app(ServeConfig(model_dir=str(small_model_dir), backend="numpy", download=False,
                                  model_id=MODEL, slots=2, chat_template=TEMPLATE, **config),
                      pipeline=small_pipe)


@pytest.fixture(scope="module")
def client(small_pipe, small_model_dir):
    with TestClient(_app(small_pipe, small_model_dir, log_prompts=True)) as c:
        yield c


def _error(r, status: int, message: str, param: str | None, code: str | None = None) -> None:
    assert r.status_code == status, r.text
    assert r.json() == {"error": {"message": message, "type": "invalid_request_error", "param": param,
                                  "code": code}}


def _events(client, path: str, body: dict) -> list:
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        return [data if data == "[DONE]" else json.loads(data) for data in sse_data(r.iter_lines())]


def _access_line(caplog, path: str) -> str:
    lines = [r.getMessage() for r in caplog.records
             if r.name == "inferno.serve" and f" {path}\"" in r.getMessage()]
    assert lines, [r.getMessage() for r in caplog.records]
    return lines[-1]


# ------------------------------------------------------------------------------------- completions


def test_a_completion_is_what_the_model_gives_and_the_log_says_its_tokens(client, small_pipe, caplog):
    caplog.set_level(logging.INFO, logger="inferno.serve")
    expected = small_pipe.generate("Hello", max_new_tokens=5, stop_at_eos=False)
    r = client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 5, "temperature": 0,
                                             "ignore_eos": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["object"], body["model"]) == ("text_completion", MODEL)
    assert body["choices"][0]["text"] == expected.text
    assert body["choices"][0]["finish_reason"] == "length"
    prompt_tokens = len(small_pipe.encode("Hello"))
    assert body["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 5,
                             "total_tokens": prompt_tokens + 5}
    line = _access_line(caplog, "/v1/completions")
    assert f"prompt_tokens={prompt_tokens} completion_tokens=5 finish_reasons=length" in line
    assert line.endswith('prompt="Hello"')  # --log-prompts
    assert "disconnected" not in line


def test_a_streamed_completion_gives_the_same_text(client, small_pipe, caplog):
    caplog.set_level(logging.INFO, logger="inferno.serve")
    events = _events(client, "/v1/completions", {"prompt": "Hello", "max_tokens": 5, "temperature": 0,
                                                 "ignore_eos": True, "stream": True})
    assert events[-1] == "[DONE]"
    text = "".join(e["choices"][0]["text"] for e in events[:-1])
    assert text == small_pipe.generate("Hello", max_new_tokens=5, stop_at_eos=False).text
    assert "completion_tokens=5 finish_reasons=length" in _access_line(caplog, "/v1/completions")


def test_echo_puts_the_prompt_before_the_completion(client, small_pipe):
    r = client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2, "temperature": 0,
                                             "ignore_eos": True, "echo": True})
    expected = small_pipe.generate("Hello", max_new_tokens=2, stop_at_eos=False)
    assert r.json()["choices"][0]["text"] == "Hello" + expected.text


def test_an_echo_is_scored_by_the_engine_and_streams_as_it_collects(client, small_pipe, monkeypatch):
    # No second batch-1 path: Pipeline.score is never called; the prompt's tokens are prefilled (and scored)
    # by the engine, once for the two choices of the prompt.
    def no_score(*args, **kwargs):
        raise AssertionError("an echo must not score the prompt outside the engine")

    monkeypatch.setattr(small_pipe, "score", no_score)
    engine = client.app.state.inferno.engine
    body = {"prompt": "The cat sat on the", "max_tokens": 2, "n": 2, "seed": 3, "echo": True, "logprobs": 2}
    before = engine.stats.prompt_tokens
    whole = client.post("/v1/completions", json=body).json()
    n_prompt = whole["usage"]["prompt_tokens"]
    assert engine.stats.prompt_tokens - before == n_prompt
    chunks = [e for e in _events(client, "/v1/completions", {**body, "stream": True}) if e != "[DONE]"]
    for choice in whole["choices"]:
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == choice["index"]]
        assert mine[0]["text"] == "The cat sat on the"  # the echo first, with the prompt's logprobs
        assert "".join(c["text"] for c in mine) == choice["text"]
        lps = [c["logprobs"] for c in mine if c["logprobs"] is not None]
        assert [t for lp in lps for t in lp["token_logprobs"]] == choice["logprobs"]["token_logprobs"]
        assert choice["logprobs"]["token_logprobs"][0] is None
        assert len(choice["logprobs"]["tokens"]) == n_prompt + 2
        assert all(isinstance(v, float) for v in choice["logprobs"]["token_logprobs"][1:])
    assert whole["choices"][0]["logprobs"]["token_logprobs"][:n_prompt] == \
        whole["choices"][1]["logprobs"]["token_logprobs"][:n_prompt]


def test_completion_errors(client, small_pipe):
    n = small_pipe.config.n_positions
    r = client.post("/v1/completions", json={"prompt": [1] * (n + 1), "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert r.json()["error"]["code"] == "context_length_exceeded"
    _error(client.post("/v1/completions", json={"prompt": "a", "n": 3}), 400,
           "n=3 needs 3 KV slots at once; this server has 2 (--slots)", "n")


def test_a_server_without_log_prompts_logs_no_prompt(small_pipe, small_model_dir, caplog):
    caplog.set_level(logging.INFO, logger="inferno.serve")
    with TestClient(_app(small_pipe, small_model_dir)) as c:
        assert c.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 1}).status_code == 200
        assert c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                    "max_tokens": 1}).status_code == 200
    assert "prompt=" not in _access_line(caplog, "/v1/completions")
    assert "prompt=" not in _access_line(caplog, "/v1/chat/completions")


# ------------------------------------------------------------------------------------- chat


MESSAGES = [{"role": "user", "content": "Hi there"}]


def test_a_chat_completion_is_the_model_on_the_template(client, small_pipe, caplog):
    caplog.set_level(logging.INFO, logger="inferno.serve")
    prompt = "user: Hi there\nassistant:"
    expected = small_pipe.generate(prompt, max_new_tokens=4, stop_at_eos=False)
    r = client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 4, "temperature": 0,
                                                  "ignore_eos": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["object"], body["model"]) == ("chat.completion", MODEL)
    assert body["choices"][0]["message"] == {"role": "assistant", "content": expected.text}
    assert body["usage"]["prompt_tokens"] == len(small_pipe.encode(prompt))
    line = _access_line(caplog, "/v1/chat/completions")
    assert "completion_tokens=4 finish_reasons=length" in line
    assert line.endswith(f"prompt={json.dumps(MESSAGES)}")

    events = _events(client, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4,
                                                      "temperature": 0, "ignore_eos": True, "stream": True})
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]
                   if e["choices"]) == expected.text


def test_chat_errors(client, small_pipe):
    n = small_pipe.config.n_positions
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a " * n}],
                                                  "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
    assert r.json()["error"]["code"] == "context_length_exceeded"
    _error(client.post("/v1/chat/completions", json={"messages": MESSAGES, "n": 3}), 400,
           "n=3 needs 3 KV slots at once; this server has 2 (--slots)", "n")


# ------------------------------------------------------------------------------------- the server


def test_the_model_card(client, small_pipe):
    r = client.get("/v1/models")
    assert r.status_code == 200
    (card,) = r.json()["data"]
    assert r.json()["object"] == "list"
    assert card == {"id": MODEL, "object": "model", "created": card["created"], "owned_by": "inferno",
                    "max_model_len": small_pipe.config.n_positions, "family": "gpt2", "architecture": "gpt2"}
    assert isinstance(card["created"], int) and card["created"] > 1_700_000_000


def test_health_says_the_slots_and_requests(client):
    r = client.get("/health")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "model": MODEL, "slots_total": 2, "slots_free": 2,
                        "requests_running": 0, "requests_waiting": 0}


def test_metrics_count_what_the_completions_did(client):
    client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 3, "ignore_eos": True})
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in r.text.splitlines()
              if line and not line.startswith("#")}
    assert values["inferno_slots_total"] == 2 and values["inferno_prompt_tokens_total"] >= 1
    assert values["inferno_generation_tokens_total"] >= 3


# ------------------------------------------------------------------------------------- tokenizer


def test_tokenize(client, small_pipe):
    text = "Hello<|endoftext|>"
    ids = small_pipe.tokenizer.encode(text, True)
    assert ids[-1] == 50256
    n = small_pipe.config.n_positions
    assert client.post("/tokenize", json={"content": text}).json() == {"tokens": ids, "count": len(ids),
                                                                       "max_model_len": n}
    assert client.post("/tokenize", json={"prompt": text}).json()["tokens"] == ids
    plain = client.post("/tokenize", json={"content": text, "parse_special": False}).json()["tokens"]
    assert plain == small_pipe.tokenizer.encode(text, False) and 50256 not in plain
    assert client.post("/tokenize", json={"content": text, "parse_special": True}).json()["tokens"] == ids
    _error(client.post("/tokenize", json={}), 400, "send the text to tokenize as content (or prompt)",
           "content")


def test_tokenize_adds_the_special_tokens_when_asked(client, small_pipe, monkeypatch):
    # GPT-2 has no BOS: give its tokenizer one, as a Llama tokenizer has, to see the field honoured.
    monkeypatch.setattr(small_pipe.tokenizer, "prefix_ids", (50256,))
    ids = small_pipe.tokenizer.encode("Hello", True)
    for body in ({}, {"add_special_tokens": False}, {"add_special": False}):
        assert client.post("/tokenize", json={"content": "Hello", **body}).json()["tokens"] == ids
    both = {"add_special": True, "add_special_tokens": True}
    for body in ({"add_special_tokens": True}, {"add_special": True}, both):
        assert client.post("/tokenize", json={"content": "Hello", **body}).json()["tokens"] == [50256, *ids]
    clash = {"content": "Hello", "add_special_tokens": True, "add_special": False}
    _error(client.post("/tokenize", json=clash), 400,
           "add_special_tokens and add_special are the same field: send one, or the same value in both",
           "add_special")


def test_detokenize(client, small_pipe):
    ids = small_pipe.tokenizer.encode("Hello world", True)
    assert client.post("/detokenize", json={"tokens": ids}).json() == {"content": "Hello world",
                                                                       "prompt": "Hello world"}
    limit = small_pipe.tokenizer.vocab_size
    _error(client.post("/detokenize", json={"tokens": [1, limit]}), 400,
           f"token id {limit} is outside the vocabulary [0, {limit})", "tokens")


def test_tokenizer_info(client, small_pipe):
    tok = small_pipe.tokenizer
    assert client.get("/tokenizer_info").json() == {
        "model": MODEL, "tokenizer": "GPT-2 byte-level BPE", "eos_token": "<|endoftext|>",
        "eos_token_id": 50256, "vocab_size": tok.vocab_size, "max_model_len": small_pipe.config.n_positions,
        "special_tokens": tok.special_tokens}


# ------------------------------------------------------------------------------------- inspect


def _texts(small_pipe, ids):
    from inferno.serve.token_texts import TokenTexts

    texts = TokenTexts(small_pipe.tokenizer)
    return [texts[i] for i in ids]


@pytest.mark.parametrize("body", [{"prompt": "Hello world"}, {"prompt": "Hello world", "layers": [1],
                                                              "heads": [0, 2], "positions": [1], "top": 3}])
def test_inspect_is_the_models_own_inspection(client, small_pipe, body):
    ids = small_pipe.encode("Hello world")
    kwargs = {k: body[k] for k in ("layers", "heads", "positions") if k in body}
    expected = small_pipe.inspect(ids, top=body.get("top", 5), **kwargs)
    r = client.post("/v1/inspect", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert (out["object"], out["model"], out["token_ids"]) == ("inspection", MODEL, ids)
    assert out["tokens"] == _texts(small_pipe, ids)
    assert (out["layers"], out["heads"], out["positions"]) == (expected.layers, expected.heads,
                                                               expected.positions)
    assert out["attention"] == np.round(expected.attention.astype(np.float64), 4).tolist()
    lens = [[[(e["token_id"], e["token"], e["probability"]) for e in pos] for pos in layer]
            for layer in out["logit_lens"]]
    assert lens == [[[(i, _texts(small_pipe, [i])[0], p) for i, p in pairs] for pairs in layer]
                    for layer in expected.logit_lens]
    assert all(len(pos) == body.get("top", 5) for layer in lens for pos in layer)


def test_inspect_takes_ids_and_an_empty_prompt_is_the_end_of_text(client, small_pipe):
    ids = small_pipe.encode("Hi")
    assert client.post("/v1/inspect", json={"prompt": ids}).json()["token_ids"] == ids
    assert client.post("/v1/inspect", json={"prompt": ""}).json()["token_ids"] == [50256]
    out = client.post("/v1/inspect", json={"prompt": "Hi", "top": 20, "positions": [0], "layers": [0],
                                           "heads": [0]}).json()
    lens = out["logit_lens"]
    assert [len(pos) for layer in lens for pos in layer] == [20] * (small_pipe.config.n_layer + 1)


def test_inspect_errors(client, small_pipe):
    c, limit = small_pipe.config, small_pipe.sample_limit
    _error(client.post("/v1/inspect", json={"prompt": [1, limit]}), 400,
           f"prompt: token id {limit} is outside the vocabulary [0, {limit})", "prompt")
    _error(client.post("/v1/inspect", json={"prompt": [1] * (c.n_positions + 1)}), 400,
           f"This model's maximum context length is {c.n_positions} tokens, but prompt is "
           f"{c.n_positions + 1} tokens long; shorten it", "prompt", "context_length_exceeded")
    from inferno.inspect import InspectionError

    # each bad subset is answered with what inspection itself says of it
    for key, value in (("layers", [c.n_layer]), ("heads", [c.n_head]), ("positions", [99])):
        with pytest.raises(InspectionError) as info:
            small_pipe.inspect("Hi", **{key: value})
        _error(client.post("/v1/inspect", json={"prompt": "Hi", key: value}), 400, str(info.value), key)


def test_inspect_takes_id_0_a_whole_context_and_the_end_of_text_in_text(client, small_pipe):
    n = small_pipe.config.n_positions
    assert client.post("/v1/inspect", json={"prompt": [0, 1]}).json()["token_ids"] == [0, 1]
    r = client.post("/v1/inspect", json={"prompt": [1] * n, "layers": [0], "heads": [0], "positions": [0]})
    assert r.status_code == 200 and len(r.json()["token_ids"]) == n
    ids = small_pipe.tokenizer.encode("Hi<|endoftext|>", True)
    assert ids[-1] == 50256  # text is encoded as /v1/completions encodes it: special tokens parsed
    assert client.post("/v1/inspect", json={"prompt": "Hi<|endoftext|>"}).json()["token_ids"] == ids


def test_inspect_refuses_more_weights_than_one_response_holds(client, small_pipe, monkeypatch):
    from inferno.serve import serving_inspect as route

    c = small_pipe.config
    text = "Hello world, once more"
    ids = small_pipe.encode(text)
    assert len(ids) > 2  # so that len ** 2 is not len * 2
    weights = c.n_layer * c.n_head * len(ids) ** 2
    monkeypatch.setattr(route, "MAX_INSPECT_WEIGHTS", weights - 1)
    _error(client.post("/v1/inspect", json={"prompt": text}), 400,
           f"the attention of {c.n_layer} layers × {c.n_head} heads over {len(ids)} tokens is {weights} "
           f"weights, more than the {weights - 1} one response holds: ask for fewer layers or heads",
           "layers")
    monkeypatch.setattr(route, "MAX_INSPECT_WEIGHTS", weights)
    assert client.post("/v1/inspect", json={"prompt": text}).status_code == 200
    # one layer and one head: n_layer * n_head times fewer
    monkeypatch.setattr(route, "MAX_INSPECT_WEIGHTS", len(ids) ** 2)
    one = {"prompt": text, "layers": [0], "heads": [1]}
    assert client.post("/v1/inspect", json=one).status_code == 200
    assert MAX_INSPECT_WEIGHTS == 1 << 24


# ------------------------------------------------------------------------------------- what else a route does


def _state(client):
    return client.app.state.inferno


def test_while_shutting_down_the_info_and_tokenizer_routes_still_answer(client):
    state = _state(client)
    state.draining = True
    try:
        r = client.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "shutting_down"
        for method, path, body in (("GET", "/v1/models", None), ("GET", "/tokenizer_info", None),
                                   ("POST", "/tokenize", {"content": "a"}),
                                   ("POST", "/detokenize", {"tokens": [64]})):
            assert client.request(method, path, json=body).status_code == 200, path
        assert client.post("/v1/completions", json={"prompt": "a", "max_tokens": 1}).status_code == 503
        assert client.post("/v1/inspect", json={"prompt": "a"}).status_code == 503
    finally:
        state.draining = False
    assert client.get("/health").status_code == 200


def test_bodies_are_read_as_strict_json(client):
    r = client.post("/v1/completions", content=b'{"prompt": "a", "temperature": NaN}',
                    headers={"content-type": "application/json"})
    _error(r, 400, "invalid JSON in the request body: NaN is not valid JSON (numbers must be finite)", None)


@pytest.mark.parametrize("path, body", [("/v1/completions", {"prompt": "a"}),
                                        ("/v1/chat/completions", {"messages": MESSAGES})])
def test_logit_bias_ids_are_checked_against_the_sample_limit(client, small_pipe, path, body):
    limit = small_pipe.sample_limit
    _error(client.post(path, json={**body, "logit_bias": {str(limit): 1}}), 400,
           f"logit_bias names token id {limit}, outside the vocabulary [0, {limit})", "logit_bias")


@pytest.mark.parametrize("path, body, text", [
    ("/v1/completions", {"prompt": "Hello"}, lambda c: c["text"]),
    ("/v1/chat/completions", {"messages": MESSAGES}, lambda c: c["message"]["content"]),
])
def test_the_end_of_text_ends_a_completion_unless_ignore_eos(client, path, body, text):
    eos = {"logit_bias": {"50256": 100}, "max_tokens": 3, "temperature": 0}
    choice = client.post(path, json={**body, **eos}).json()["choices"][0]
    assert (choice["finish_reason"], text(choice)) == ("stop", "")
    choice = client.post(path, json={**body, **eos, "ignore_eos": True}).json()["choices"][0]
    assert choice["finish_reason"] == "length"


def test_an_empty_prompt_is_the_end_of_text_token(client):
    assert client.post("/v1/completions", json={"prompt": "", "max_tokens": 1}).json()["usage"][
        "prompt_tokens"] == 1


def test_a_chat_template_that_renders_nothing_starts_from_the_end_of_text(small_pipe, small_model_dir):
    app = create_app(ServeConfig(model_dir=str(small_model_dir), backend="numpy", download=False,
                                 chat_template="{{ '' }}"), pipeline=small_pipe)
    with TestClient(app) as c:
        r = c.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 1


def test_a_chat_without_max_tokens_may_run_to_the_end_of_the_context(client, small_pipe):
    prompt = len(small_pipe.encode("user: Hi there\nassistant:"))
    r = client.post("/v1/chat/completions", json={"messages": MESSAGES, "temperature": 0, "ignore_eos": True})
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] == prompt
    assert usage["completion_tokens"] == small_pipe.config.n_positions - prompt


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_chat_max_tokens_beyond_the_context_is_refused(client, small_pipe, field):
    prompt = len(small_pipe.encode("user: Hi there\nassistant:"))
    n = small_pipe.config.n_positions
    _error(client.post("/v1/chat/completions", json={"messages": MESSAGES, field: 5000}), 400,
           f"This model's maximum context length is {n} tokens. However, you requested {prompt + 5000} "
           f"tokens ({prompt} in messages, 5000 in {field}). Please reduce the length of messages or "
           f"{field}.",
           field, "context_length_exceeded")
    body = {"messages": MESSAGES, field: n - prompt, "ignore_eos": True}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == n - prompt


def test_chat_logprobs_and_metrics(client, small_pipe):
    before = _metric(client, "inferno_generation_tokens_total")
    r = client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 3, "temperature": 0,
                                                  "ignore_eos": True, "logprobs": True, "top_logprobs": 2})
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert "".join(e["token"] for e in content) == r.json()["choices"][0]["message"]["content"]
    assert all(len(e["top_logprobs"]) == 2 for e in content) and len(content) == 3
    assert _metric(client, "inferno_generation_tokens_total") == before + 3
    assert not _state(client)._completions  # each completion is let go of when it ends


def _metric(client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split(" ")[1])
    raise AssertionError(name)


def test_a_client_that_leaves_is_answered_499_and_logged_so(client, caplog):
    import asyncio

    caplog.set_level(logging.INFO, logger="inferno.serve")
    body = json.dumps({"prompt": "Hello", "max_tokens": 100, "ignore_eos": True}).encode()

    async def leave() -> list:
        sent, pending = [], [{"type": "http.request", "body": body, "more_body": False}]

        async def receive():
            if pending:
                return pending.pop(0)
            await asyncio.sleep(0.01)
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
                 "query_string": b"", "root_path": "", "client": ("127.0.0.1", 9), "server": ("test", 80),
                 "headers": [(b"content-type", b"application/json"),
                             (b"content-length", str(len(body)).encode())]}
        await client.app(scope, receive, send)
        return sent

    sent = client.portal.call(leave)
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 499
    line = _access_line(caplog, "/v1/completions")
    assert " 499 disconnected " in line and "finish_reasons=-" in line, line
    assert not _state(client)._completions


def test_the_playground_page_is_not_cached(client):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["cache-control"] == "no-cache"


def test_an_id_the_tokenizer_refuses_is_a_400_naming_tokens(client, small_pipe, monkeypatch):
    def refuse(ids):
        raise ValueError(f"no token has id {ids[0]}")

    monkeypatch.setattr(small_pipe.tokenizer, "decode", refuse)  # a vocabulary with a gap in its ids
    _error(client.post("/detokenize", json={"tokens": [7]}), 400, "no token has id 7", "tokens")


def test_tokenizer_info_without_an_end_of_text_token(client, small_pipe, monkeypatch):
    monkeypatch.setattr(type(small_pipe.tokenizer), "special_tokens", property(lambda self: {}))
    info = client.get("/tokenizer_info").json()
    assert (info["eos_token"], info["eos_token_id"], info["special_tokens"]) == ("", 50256, {})


def test_the_access_log_lists_each_finish_reason_once(client, small_pipe, caplog):
    caplog.set_level(logging.INFO, logger="inferno.serve")
    first = small_pipe.generate("Hello", max_new_tokens=1, stop_at_eos=False).text
    other = next(p for p in ("Ho", "The", "A", "One", "It")
                 if first not in small_pipe.generate(p, max_new_tokens=3, stop_at_eos=False).text)
    r = client.post("/v1/completions", json={"prompt": ["Hello", other, other], "max_tokens": 3,
                                             "temperature": 0, "ignore_eos": True, "stop": [first]})
    assert sorted(c["finish_reason"] for c in r.json()["choices"]) == ["length", "length", "stop"]
    assert "finish_reasons=length,stop " in _access_line(caplog, "/v1/completions")


def test_events_end_with_one_newline(client):
    body = {"prompt": "Hello", "max_tokens": 2, "stream": True}
    with client.stream("POST", "/v1/completions", json=body) as r:
        raw = b"".join(r.iter_bytes())
    assert raw.endswith(b"data: [DONE]\n\n") and b"\r" not in raw


def test_the_playground_files_have_a_name_to_build_their_urls_from(small_pipe, small_model_dir):
    app = _app(small_pipe, small_model_dir)
    assert app.url_path_for("static", path="app.js") == "/static/app.js"
