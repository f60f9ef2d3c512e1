"""The Llama family at the surface (#41): an empty prompt is the BOS, `inferno bench` and
`inferno backends` say the family, /v1/models names it."""

from __future__ import annotations

import time

import pytest

import inferno
from inferno.testing import make_llama_model


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return make_llama_model(tmp_path_factory.mktemp("llama"), "llama", seed=1)


def test_an_empty_prompt_is_the_bos_where_the_tokenizer_has_one(llama_dir):
    pipe = inferno.load(str(llama_dir), "numpy")
    assert pipe.config.eos_token_id == 257 and pipe.tokenizer.bos_id == 256
    assert pipe.encode("") == [256] and pipe.empty_prompt_id == 256
    out = pipe.generate("", max_new_tokens=3, stop_at_eos=False)
    assert len(out.ids) == 3
    gpt2 = inferno.load("random:tiny", "numpy")
    assert gpt2.tokenizer.bos_id is None and gpt2.encode("") == [gpt2.config.eos_token_id] == [50256]


def test_v1_models_says_the_family_and_chat_uses_the_models_template(llama_dir):
    pytest.importorskip("fastapi")
    from starlette.testclient import TestClient

    from inferno.serve import ServeConfig, create_app

    app = create_app(ServeConfig(model_dir=str(llama_dir), backend="numpy", download=False))
    with TestClient(app) as client:
        deadline = time.monotonic() + 30
        while client.get("/health").json()["status"] == "loading" and time.monotonic() < deadline:
            time.sleep(0.05)
        (card,) = client.get("/v1/models").json()["data"]
        assert card["family"] == "llama" and card["architecture"] == "llama" and card["max_model_len"] == 64
        r = client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "he"}], "max_tokens": 2, "ignore_eos": True})
        assert r.status_code == 200, r.text
        pipe = inferno.load(str(llama_dir), "numpy")
        want = pipe.tokenizer.encode(
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhe<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n", allow_special=True)
        # The Llama 3 template: 6 special tokens, "user" and "assistant" byte by byte, "he", 4 newlines.
        assert r.json()["usage"]["prompt_tokens"] == len(want) == 24, (r.json(), want)


def test_bench_says_the_family(llama_dir, capsys):
    from inferno.cli.bench import run

    fast = ["--prompt-tokens", "4", "--new-tokens", "2", "--repeat", "1", "--pause", "0", "--warmup", "0"]
    assert run(["-m", str(llama_dir), "--backends", "numpy", "--quiet", *fast]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Llama ({llama_dir}): prompt 4 tokens, 2 new tokens"), out
    assert run(["-m", str(llama_dir), "--backends", "numpy", "--quiet", "--json", *fast]) == 0
    report = __import__("json").loads(capsys.readouterr().out)
    assert report["family"] == "llama" and report["model_type"] == "llama"
    assert report["model"]["n_kv_head"] == 2


def test_backends_say_the_families_they_run(capsys):
    from inferno.cli.backends import families, run

    assert families("numpy") == "gpt2, llama"
    assert run(["--json"]) == 0
    rows = __import__("json").loads(capsys.readouterr().out)
    assert {r["name"]: r["families"] for r in rows}["numpy"] == "gpt2, llama"
