"""A Ray generation worker writes a line of OpenAI's Batch API format (``custom_id``, ``method``, ``url``,
``body``) back in that API's output shape, as ``inferno batch`` does without Ray, and a native line in
``inferno --json``'s. The worker runs in this process (no cluster): its rows are what the driver appends."""

from __future__ import annotations

import json

import pytest
from conftest import ray_missing_reason

import inferno

pytestmark = pytest.mark.skipif(ray_missing_reason() is not None, reason=str(ray_missing_reason()))


def test_a_batch_api_line_comes_back_in_the_batch_output_shape(ray_model_dir, monkeypatch):
    from inferno.integrations import ray_batch

    monkeypatch.setattr(ray_batch, "limit_blas_to_ray_cpus", lambda cpus=1.0: 1)  # no Ray worker here
    worker = ray_batch._Generator({"model_dir": str(ray_model_dir), "backend": "numpy", "slots": 2})
    try:
        lines = [{"custom_id": "req-1", "method": "POST", "url": "/v1/completions",
                  "body": {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0,
                           "logprobs": 1}},
                 {"id": "native", "prompt": "Once upon a time", "max_new_tokens": 4, "temperature": 0}]
        batch = {"source": ["in.jsonl"] * 2, "line": [1, 2],
                 "key": [json.dumps("req-1"), json.dumps("native")],
                 "request": [json.dumps(line) for line in lines]}
        out = worker(batch)
    finally:
        worker.engine.close()
    assert out["kind"] == ["ok", "ok"], out["message"]
    openai, native = (json.loads(o) for o in out["out"])
    expected = inferno.load(str(ray_model_dir), "numpy", download=False).generate(
        "Once upon a time", max_new_tokens=4, temperature=0.0)
    assert native["id"] == "native" and native["text"] == expected.text and "custom_id" not in native
    assert openai["custom_id"] == "req-1" and openai["error"] is None
    response = openai["response"]
    assert response["status_code"] == 200
    body = response["body"]
    assert body["object"] == "text_completion" and body["model"] == "tiny"
    (choice,) = body["choices"]
    assert choice["text"] == expected.text and choice["index"] == 0
    assert len(choice["logprobs"]["tokens"]) == len(expected.ids)
    assert body["usage"]["completion_tokens"] == len(expected.ids)
