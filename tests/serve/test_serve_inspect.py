"""``POST /v1/inspect``: the attention weights and the logit lens over HTTP (in process: Starlette's
TestClient), against `Pipeline.inspect` on the same model, and its bad requests in OpenAI's error shape."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest
from starlette.testclient import TestClient

from inferno.serve import ServeConfig, create_app


@pytest.fixture(scope="module")
def client(small_pipe):
    with TestClient(create_app(ServeConfig(model_id="tiny"), pipeline=small_pipe)) as c:
        yield c


def test_a_text_prompt(client, small_pipe, token_texts):
    text = "The quick brown fox<|endoftext|>"
    r = client.post("/v1/inspect", json={"prompt": text})
    assert r.status_code == 200, r.text
    body = r.json()
    ids = small_pipe.tokenizer.encode(text, allow_special=True)  # as /v1/completions reads a text
    assert body["object"] == "inspection" and body["model"] == "tiny"
    assert body["token_ids"] == ids and ids[-1] == 50256
    assert body["tokens"] == [token_texts[i] for i in ids]
    c, t = small_pipe.config, len(ids)
    assert body["layers"] == list(range(c.n_layer)) and body["heads"] == list(range(c.n_head))
    assert body["positions"] == list(range(t))
    want = small_pipe.inspect(ids)
    got = np.asarray(body["attention"])
    assert got.shape == (c.n_layer, c.n_head, t, t)
    np.testing.assert_array_equal(got, np.round(want.attention.astype(np.float64), 4))
    assert len(body["logit_lens"]) == c.n_layer + 1
    for layer, rows in enumerate(body["logit_lens"]):
        assert len(rows) == t
        for pos, entries in enumerate(rows):
            assert len(entries) == 5
            pairs = want.logit_lens[layer][pos]
            assert [e["token_id"] for e in entries] == [i for i, _ in pairs]
            assert [e["token"] for e in entries] == [token_texts[i] for i, _ in pairs]
            np.testing.assert_allclose([e["probability"] for e in entries], [p for _, p in pairs], rtol=1e-12)


def test_subsets_and_ids(client, small_pipe):
    ids = [464, 2068, 7586, 21831, 18045]
    r = client.post("/v1/inspect", json={"prompt": ids, "layers": [1], "heads": [3, 0], "positions": [4],
                                         "top": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["token_ids"] == ids and body["layers"] == [1] and body["heads"] == [0, 3]
    assert body["positions"] == [4]
    assert np.asarray(body["attention"]).shape == (1, 2, 5, 5)
    assert [len(layer) for layer in body["logit_lens"]] == [1] * (small_pipe.config.n_layer + 1)
    assert all(len(layer[0]) == 2 for layer in body["logit_lens"])
    # The lens at the last position of the last layer is the model's next-token distribution.
    logits = small_pipe.logits(ids)[-1].astype(np.float64)
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    best = body["logit_lens"][-1][0][0]
    assert best["token_id"] == int(np.argmax(probs))
    assert best["probability"] == pytest.approx(float(probs.max()), abs=1e-6)
    # The empty prompt is <|endoftext|>, as for completions.
    assert client.post("/v1/inspect", json={"prompt": ""}).json()["token_ids"] == [50256]


@pytest.mark.parametrize(("body", "status", "param", "match"), [
    ({}, 400, "prompt", "prompt"),
    ({"prompt": " a" * 200}, 400, "prompt", "maximum context length is 128 tokens, but prompt is 200"),
    ({"prompt": [1, 50257]}, 400, "prompt", "token id 50257 is outside the vocabulary"),
    ({"prompt": "a", "layers": [2]}, 400, "layers", r"layers: 2 is not one of the model's layers"),
    ({"prompt": "a", "heads": [1, 1]}, 400, "heads", "heads lists heads 1 twice"),
    ({"prompt": "a b", "positions": [2]}, 400, "positions", r"positions: 2 is not one of"),
    ({"prompt": "a", "top": 0}, 400, "top", "top"),
    ({"prompt": "a", "top": 21}, 400, "top", "top"),
    ({"prompt": "a", "layers": []}, 400, "layers", "layers"),
    ({"prompt": "a", "heads": ["0"]}, 400, "heads[0]", "heads"),
])
def test_bad_requests(client, body, status, param, match):
    r = client.post("/v1/inspect", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert re.search(match, err["message"]), err["message"]


def test_a_response_too_large_is_refused_before_it_runs(client, monkeypatch):
    import inferno.serve.serving_inspect as route

    monkeypatch.setattr(route, "MAX_INSPECT_WEIGHTS", 1000)
    r = client.post("/v1/inspect", json={"prompt": list(range(20))})  # 2 layers × 4 heads × 400
    assert r.status_code == 400
    assert "3200 weights, more than the 1000 one response holds: ask for fewer layers or heads" in r.text
    r = client.post("/v1/inspect", json={"prompt": list(range(20)), "layers": [0], "heads": [1, 2]})
    assert r.status_code == 200


# ------------------------------------------------------------------- hostile sizes (issue 39, bug 1)


@pytest.mark.parametrize(("key", "count"), [("layers", "n_layer"), ("heads", "n_head"),
                                            ("positions", "n_positions")])
def test_a_list_longer_than_what_it_indexes_is_refused_first_and_fast(client, small_pipe, key, count):
    limit = getattr(small_pipe.config, count)
    start = time.perf_counter()
    # 300000 zeros (600 KB): refused by its length, before the prompt is even encoded (it is too long too)
    r = client.post("/v1/inspect", json={"prompt": " a" * 500, key: [0] * 300_000})
    assert time.perf_counter() - start < 5
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == key
    assert f"{key} lists 300000 values; the model has {limit}" in err["message"]


def test_a_repeat_is_refused_at_the_first_one():
    from inferno.inspect import InspectionError, subset

    with pytest.raises(InspectionError, match="layers lists layers 3 twice"):
        subset("layers", [3, 1, 3, 1], 4, "layers")
    # One pass: a long list with its repeat at the end is answered at once (a quadratic check took
    # minutes for this; one pass takes under a second, a few on a busy 2-core machine).
    values = [*range(200_000), 5]
    start = time.perf_counter()
    with pytest.raises(InspectionError, match="positions lists positions 5 twice"):
        subset("positions", values, 300_000, "positions")
    assert time.perf_counter() - start < 5.0
    with pytest.raises(InspectionError, match="lists 5 layers, more than the 4 there are"):
        subset("layers", [0, 1, 2, 3, 0], 4, "layers")


def test_repeated_positions_are_400(client):
    r = client.post("/v1/inspect", json={"prompt": "a b c", "positions": [2, 0, 2]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "positions"
    assert "positions lists positions 2 twice" in r.json()["error"]["message"]


# ------------------------------------------------------------------------- at most N at once (429)


def test_inspections_beyond_the_cap_are_429(small_pipe, monkeypatch):
    import inferno.serve.serving_inspect as serving

    gate, entered = threading.Event(), threading.Semaphore(0)
    real = serving.inspect_ids

    def held(*args, **kwargs):
        entered.release()
        assert gate.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(serving, "inspect_ids", held)
    with TestClient(create_app(ServeConfig(model_id="tiny", max_inspections=2), pipeline=small_pipe)) as c:
        results: list = []

        def inspect():
            results.append(c.post("/v1/inspect", json={"prompt": "a"}))

        threads = [threading.Thread(target=inspect) for _ in range(2)]
        for t in threads:
            t.start()
        for _ in threads:
            assert entered.acquire(timeout=30)
        r = c.post("/v1/inspect", json={"prompt": "a"})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        err = r.json()["error"]
        assert err["type"] == "rate_limit_error" and err["code"] == "too_many_inspections"
        assert "--max-inspections" in err["message"]
        assert c.get("/health").status_code == 200  # the rest of the server answers
        gate.set()
        for t in threads:
            t.join(30)
        assert [x.status_code for x in results] == [200, 200]
        assert c.post("/v1/inspect", json={"prompt": "a"}).status_code == 200  # places given back


def test_health_answers_promptly_while_a_large_inspection_is_built(long_model_dir):
    """The inspection and its JSON (tens of MB) are built in a worker thread, a row at a time: /health
    keeps answering meanwhile (it waited for the whole JSON when that was written on the event loop)."""
    import inferno

    pipe = inferno.load(long_model_dir, "numpy", download=False)
    n = pipe.config.n_positions
    with TestClient(create_app(ServeConfig(model_id="long"), pipeline=pipe)) as c:
        done = threading.Event()
        out: list = []

        def inspect():
            body = {"prompt": [1] * n, "heads": [0, 1, 2, 3], "layers": [0], "positions": [0]}
            out.append(c.post("/v1/inspect", json=body))
            done.set()

        t = threading.Thread(target=inspect)
        t.start()
        latencies = []
        while not done.is_set():
            start = time.perf_counter()
            assert c.get("/health").status_code == 200
            latencies.append(time.perf_counter() - start)
            time.sleep(0.02)
        t.join(60)
        assert out[0].status_code == 200
        assert len(out[0].json()["attention"][0]) == 4
        assert len(latencies) >= 5, latencies  # it ran long enough to be watched
        assert max(latencies) < 1.0, max(latencies)
