"""`inferno serve --speculate ngram` and `--draft-model NAME`: every request the engine runs speculates
(a constrained one excepted); greedy replies are those of a server without speculation, logprobs
included; /metrics counts rounds, drafted and accepted tokens, and both per draft position; a setting
that cannot work stops the server at start with exit 2 and the flag's name."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient

import inferno
from inferno.cli.serve import run as serve
from inferno.serve import create_app
from inferno.serve.config import ServeConfig
from inferno.testing import make_llama_model

BODIES = [
    ("/v1/completions", {"prompt": "ab ab ab ab ab ab", "max_tokens": 14, "temperature": 0, "logprobs": 2}),
    ("/v1/completions", {"prompt": ["abc abc abc", "hello hello"], "max_tokens": 10, "temperature": 0}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "xy xy xy xy"}], "max_tokens": 12,
                              "temperature": 0, "logprobs": True, "top_logprobs": 2}),
    ("/v1/completions", {"prompt": "ab ab ab", "max_tokens": 8, "temperature": 0, "stop": ["b a"],
                         "frequency_penalty": 0.5}),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("spec")
    return make_llama_model(root / "target", seed=3), make_llama_model(root / "draft", seed=4)


def _replies(pipe, **speculation) -> tuple[list[dict], str]:
    app = create_app(ServeConfig(model_dir="unused", backend="numpy", slots=3, **speculation), pipeline=pipe)
    out = []
    with TestClient(app) as c:
        for path, body in BODIES:
            r = c.post(path, json=body)
            assert r.status_code == 200, r.text
            reply = r.json()
            for key in ("id", "created", "system_fingerprint"):
                reply.pop(key, None)
            out.append(reply)
        metrics = c.get("/metrics").text
    return out, metrics


def _same(a, b) -> bool:
    """Equal, numbers to 1e-4 (a verification step's rows are computed K + 1 at a time: float32 sums
    in another order)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) < 1e-4
    return a == b


def _gauge(metrics: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", metrics, re.M))


@pytest.mark.parametrize("how", ["ngram", "draft"])
def test_greedy_replies_are_the_plain_servers_and_metrics_count_the_drafts(models, how):
    target, draft = models
    pipe = inferno.load(target, "numpy", download=False)
    plain, plain_metrics = _replies(pipe)
    kw = {"speculative": "ngram"} if how == "ngram" else {"draft_model": str(draft)}
    got, metrics = _replies(pipe, **kw)
    assert [i for i, (a, b) in enumerate(zip(got, plain, strict=True)) if not _same(a, b)] == []
    assert _gauge(plain_metrics, "inferno_spec_decode_num_draft_tokens") == 0
    drafted = _gauge(metrics, "inferno_spec_decode_num_draft_tokens")
    accepted = _gauge(metrics, "inferno_spec_decode_num_accepted_tokens")
    assert drafted > 0 and 0 <= accepted <= drafted
    assert _gauge(metrics, "inferno_spec_decode_num_drafted_tokens_per_pos") == drafted
    assert _gauge(metrics, "inferno_spec_decode_num_accepted_tokens_per_pos") == accepted
    assert _gauge(metrics, "inferno_spec_decode_num_drafts") == pytest.approx(
        float(re.search(r'^inferno_spec_decode_num_drafted_tokens_per_pos{position="0"} (\S+)$', metrics,
                        re.M).group(1)))


@pytest.mark.parametrize("flags, says", [
    (["--num-speculative-tokens", "0"], "--num-speculative-tokens: must be an integer in [1, 16], got 0"),
    (["--speculate", "ngram", "--draft-model", "x"], "--draft-model: a draft model is given but the "
     "speculative method is 'ngram'"),
])
def test_settings_that_cannot_work_are_refused_before_loading(models, flags, says, capsys):
    assert serve(["-m", str(models[0]), "--port", "0", *flags]) == 2
    assert says in capsys.readouterr().err


def test_a_draft_model_with_another_tokenizer_stops_the_server_naming_the_flag(models, tmp_path):
    other = make_llama_model(tmp_path / "other", seed=5, vocab_size=300)
    proc = subprocess.run([sys.executable, "-m", "inferno", "serve", "-m", str(models[0]), "--port", "0",
                           "--draft-model", str(other)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--draft-model: " in proc.stderr and "tokenizer" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
