"""Live parity with Hugging Face transformers (float64, eager attention) on the same random weights.

Run with `tox -e oracle` or `python -m pytest -m oracle` (needs the `oracle` extra: torch + transformers).
Tolerances: logits within 1e-4 of the largest |logit| (we compute in float32); greedy ids identical
until HF's top two logits come within 1e-4 (relative) of each other, where float32 may break the tie.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from goldens import TOKENIZER_JSON, write_model_dir  # noqa: E402
from hf_oracle import hf_greedy, hf_logits, hf_model  # noqa: E402

import inferno  # noqa: E402
from inferno.sampling import Sampler, SamplingParams  # noqa: E402
from inferno.testing import make_model_dir, random_state_dict, small_config  # noqa: E402

pytestmark = pytest.mark.oracle

LOGITS_RTOL = 1e-4
NEAR_TIE = 1e-4
PROMPTS = [
    "The quick brown fox", "Hello, world!", "The capital of France is", "Once upon a time",
    "import numpy as np\n", "In 1969, astronauts", "¿Dónde está la biblioteca?", "東京は日本の首都です。",
    "def fibonacci(n):", "   leading spaces\tand tabs", "A", "they'LL say 42",
]


def relative_error(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


def assert_greedy_matches(pipe, model, prompts, n: int) -> int:
    compared = 0
    for text in prompts:
        ids = pipe.encode(text)
        ref, gaps = hf_greedy(model, ids, n)
        ours = pipe.generate(ids, max_new_tokens=n, stop_at_eos=False).ids
        for step, (a, b, gap) in enumerate(zip(ours, ref, gaps, strict=True)):
            if gap < NEAR_TIE:
                break
            assert a == b, f"{text!r} step {step}: ours {a}, transformers {b}"
            compared += 1
    return compared


@pytest.mark.parametrize("layout", ["hub", "save_pretrained"])
@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
def test_logits_small(tmp_path, layout, dtype):
    config = small_config(vocab_size=300, n_positions=48, n_embd=40, n_layer=3, n_head=5)
    directory, config, stored = make_model_dir(tmp_path, config, seed=21, layout=layout, dtype=dtype)
    shutil.copy(TOKENIZER_JSON, directory / "tokenizer.json")
    pipe = inferno.load(directory, "numpy", download=False)
    model = hf_model(config, stored)  # HF holds the same values the file stores (rounded for F16/BF16)
    ids = np.random.default_rng(1).integers(0, config.vocab_size, 40).tolist()
    assert relative_error(pipe.logits(ids), hf_logits(model, ids)) <= LOGITS_RTOL


def test_file_written_by_transformers_save_pretrained(tmp_path):
    config = small_config(vocab_size=320, n_positions=40, n_embd=24, n_layer=2, n_head=3)
    model = hf_model(config, random_state_dict(config, seed=22))
    model.float().save_pretrained(tmp_path)  # transformers' own writer: its key layout, its config.json
    model.double()
    shutil.copy(TOKENIZER_JSON, tmp_path / "tokenizer.json")
    pipe = inferno.load(tmp_path, "numpy", download=False)
    ids = list(range(5, 37))
    assert relative_error(pipe.logits(ids), hf_logits(model, ids)) <= LOGITS_RTOL


def test_greedy_small(tmp_path):
    config = small_config(vocab_size=50257, n_positions=96, n_embd=32, n_layer=2, n_head=2)
    sd = random_state_dict(config, seed=23)
    pipe = inferno.load(write_model_dir(tmp_path, config, sd), "numpy", download=False)
    assert assert_greedy_matches(pipe, hf_model(config, sd), PROMPTS, 32) >= 10 * 16


def test_full_124m_shape(tmp_path):
    config = small_config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)
    sd = random_state_dict(config, seed=24)
    pipe = inferno.load(write_model_dir(tmp_path, config, sd), "numpy", download=False)
    model = hf_model(config, sd)
    del sd
    ids = pipe.encode("The quick brown fox jumps over the lazy dog. " * 3)
    assert relative_error(pipe.logits(ids), hf_logits(model, ids)) <= LOGITS_RTOL
    assert assert_greedy_matches(pipe, model, PROMPTS[:3], 8) >= 12


@pytest.mark.parametrize(("top_k", "top_p"), [(40, 1.0), (0, 0.9), (50, 0.5), (0, 0.3)])
def test_top_k_top_p_keep_what_transformers_keeps(top_k, top_p):
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    rng = np.random.default_rng(5)
    for _ in range(20):
        logits = rng.standard_normal(2000) * 3
        scores = torch.from_numpy(logits / 0.7)[None]
        if top_k:
            scores = TopKLogitsWarper(top_k)(None, scores)
        if top_p < 1.0:
            scores = TopPLogitsWarper(top_p)(None, scores)
        hf_kept = set(torch.isfinite(scores[0]).nonzero().flatten().tolist())
        ids, _ = Sampler(SamplingParams(temperature=0.7, top_k=top_k, top_p=top_p)).distribution(logits)
        assert set(ids.tolist()) == hf_kept
