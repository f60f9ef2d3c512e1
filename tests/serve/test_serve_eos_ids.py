"""A reply ends at any of the model's end ids: config.json's and generation_config.json's (a Llama 3
Instruct reply ends at ``<|eot_id|>``, which only generation_config.json may list)."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

import inferno
from inferno.serve import create_app
from inferno.serve.config import ServeConfig
from inferno.testing import make_llama_model


def test_chat_and_completions_stop_at_an_end_id_only_generation_config_lists(tmp_path):
    folder = make_llama_model(tmp_path / "m", "llama", seed=3, eos_token_id=257)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [257, 260]}))
    pipe = inferno.load(folder, "numpy", download=False)
    assert pipe.config.eos_token_ids == (257,) and pipe.eos_ids == (257, 260)
    app = create_app(ServeConfig(model_dir="unused", backend="numpy", slots=2), pipeline=pipe)
    force = {"logit_bias": {"260": 100}, "max_tokens": 5, "temperature": 0}
    with TestClient(app) as c:
        chat = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], **force})
        text = c.post("/v1/completions", json={"prompt": "hi", **force})
        ignored = c.post("/v1/completions", json={"prompt": "hi", "ignore_eos": True, **force})
    assert chat.status_code == text.status_code == ignored.status_code == 200, chat.text + text.text
    assert chat.json()["choices"][0]["finish_reason"] == "stop"
    assert chat.json()["usage"]["completion_tokens"] == 1
    assert text.json()["choices"][0]["finish_reason"] == "stop"
    assert text.json()["usage"]["completion_tokens"] == 1
    assert ignored.json()["usage"]["completion_tokens"] == 5  # the same id, not an end with ignore_eos
    assert pipe.generate("hi", logit_bias={260: 100}, max_new_tokens=5).finish_reason == "stop"
