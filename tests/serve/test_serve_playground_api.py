"""What the playground needs of the server, without a browser: its files at / and /static/ (no API key),
and the ``return_token_ids`` extension (off by default, so OpenAI's shape is unchanged)."""

from __future__ import annotations

import json

import pytest
from serve_helpers import sse_data
from starlette.testclient import TestClient

from inferno.serve import ServeConfig, create_app


@pytest.fixture(scope="module")
def client(small_pipe, small_model_dir):
    app = create_app(ServeConfig(model_dir=str(small_model_dir), backend="numpy", download=False,
                                 api_key="sesame"), pipeline=small_pipe)
    with TestClient(app) as c:
        yield c


AUTH = {"Authorization": "Bearer sesame"}


def test_the_page_and_its_files_need_no_api_key_but_the_api_does(client):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert '<script src="/static/app.js"' in r.text
    for name, kind in (("app.js", "javascript"), ("style.css", "text/css")):
        r = client.get(f"/static/{name}")
        assert r.status_code == 200 and kind in r.headers["content-type"]
    assert client.get("/static/nothing.js").status_code == 404
    assert client.post("/v1/completions", json={"prompt": "a", "max_tokens": 1}).status_code == 401
    assert "/" not in client.get("/openapi.json").json()["paths"]  # the page is not part of the API


def test_token_ids_are_off_by_default(client):
    r = client.post("/v1/completions", headers=AUTH, json={"prompt": "Hello", "max_tokens": 3, "logprobs": 2})
    keys = {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert set(r.json()["choices"][0]["logprobs"]) == keys


def test_token_ids_match_the_texts(client, small_pipe, token_texts):
    body = {"prompt": "Hello there", "max_tokens": 6, "logprobs": 3, "temperature": 0,
            "return_token_ids": True}
    lp = client.post("/v1/completions", headers=AUTH, json=body).json()["choices"][0]["logprobs"]
    assert [token_texts[i] for i in lp["token_ids"]] == lp["tokens"]
    for top, ids in zip(lp["top_logprobs"], lp["top_token_ids"], strict=True):
        assert [token_texts[i] for i in ids] == list(top)  # the same entries, in the same order

    streamed = []
    with client.stream("POST", "/v1/completions", headers=AUTH, json={**body, "stream": True}) as r:
        for data in sse_data(r.iter_lines()):
            if data != "[DONE]" and json.loads(data)["choices"][0]["logprobs"]:
                streamed += json.loads(data)["choices"][0]["logprobs"]["token_ids"]
    assert streamed == lp["token_ids"]

    echo = {"prompt": "The cat sat on the mat", "max_tokens": 0, "echo": True, "logprobs": 5,
            "return_token_ids": True}
    lp = client.post("/v1/completions", headers=AUTH, json=echo).json()["choices"][0]["logprobs"]
    assert lp["token_ids"] == small_pipe.tokenizer.encode("The cat sat on the mat")
    assert lp["top_token_ids"][0] is None and lp["top_logprobs"][0] is None
    for top, ids in zip(lp["top_logprobs"][1:], lp["top_token_ids"][1:], strict=True):
        assert [token_texts[i] for i in ids] == list(top)
