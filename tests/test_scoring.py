"""Scoring text (inferno/scoring.py): per-token logprobs against the transformers float64 goldens, the
sliding window against the Hugging Face perplexity guide's loop, and bad requests."""

from __future__ import annotations

import math

import numpy as np
import pytest
from goldens import GOLDEN, TOKENIZER_JSON, golden_model, log_softmax, write_model_dir

import inferno
from inferno.api import Pipeline
from inferno.backends.numpy_backend import NumpyBackend
from inferno.conformance.checks import dtype_name, tolerance_for
from inferno.models.gpt2 import Gpt2
from inferno.scoring import ScoringError, score_ids, windows
from inferno.testing import random_state_dict, small_config
from inferno.tokenizer import Tokenizer

LOGPROB_ATOL = 1e-4  # float32 compute against float64 references


@pytest.fixture(scope="module")
def golden_logits_model():
    config, sd, meta = golden_model("logits")
    return Gpt2.from_weights(config, sd, NumpyBackend()), np.load(GOLDEN / "logits.npz"), meta


def test_logprobs_match_transformers_goldens(golden_logits_model):
    model, golden, meta = golden_logits_model
    for k in range(meta["prompts"]):
        ids, ref = golden[f"ids_{k}"].tolist(), golden[f"logits_{k}"]
        if len(ids) < 2:
            with pytest.raises(ScoringError, match="at least 2 tokens"):
                score_ids(model, ids)
            continue
        result = score_ids(model, ids)
        ref_lp = log_softmax(ref)  # float64 transformers logits: row j predicts token j + 1
        expected = [None] + [float(ref_lp[j - 1, ids[j]]) for j in range(1, len(ids))]
        assert result.logprobs[0] is None
        np.testing.assert_allclose(result.logprobs[1:], expected[1:], rtol=0, atol=LOGPROB_ATOL)
        total = math.fsum(expected[1:])
        assert result.total_logprob == pytest.approx(total, abs=LOGPROB_ATOL * len(ids))
        assert result.perplexity == pytest.approx(math.exp(-total / (len(ids) - 1)), rel=1e-5)
        assert result.ids == ids and result.stride == model.config.n_positions // 2


def hf_guide_targets(n: int, max_length: int, stride: int) -> list[tuple[int, int, list[int]]]:
    """The perplexity guide's loop (https://huggingface.co/docs/transformers/perplexity), written out:
    (begin, end, the absolute positions whose tokens that window's loss counts)."""
    out, prev_end_loc = [], 0
    for begin_loc in range(0, n, stride):
        end_loc = min(begin_loc + max_length, n)
        trg_len = end_loc - prev_end_loc
        labels = list(range(begin_loc, end_loc))
        masked = labels[: len(labels) - trg_len]  # target_ids[:, :-trg_len] = -100
        counted = [p for p in labels[1:] if p not in masked]  # the model shifts labels by one
        out.append((begin_loc, end_loc, counted))
        prev_end_loc = end_loc
        if end_loc == n:
            break
    return out


@pytest.mark.parametrize(("n", "context", "stride"), [(10, 16, 8), (16, 16, 8), (17, 16, 8), (100, 16, 5),
                                                      (100, 16, 15), (37, 16, 1), (2500, 1024, 512)])
def test_windows_are_the_perplexity_guides(n, context, stride):
    ours = windows(n, context, stride)
    ref = hf_guide_targets(n, context, stride)
    assert [(b, e, list(range(f, e))) for b, e, f in ours] == ref
    scored = [p for _, _, counted in ref for p in counted]
    assert sorted(scored) == list(range(1, n))  # every token but the first, once


@pytest.fixture(scope="module")
def long_pipe(tmp_path_factory) -> Pipeline:
    config = small_config(vocab_size=50257, n_positions=32, n_embd=16, n_layer=2, n_head=2)
    directory = write_model_dir(tmp_path_factory.mktemp("score-model"), config, random_state_dict(config, 31))
    return inferno.load(directory, "numpy", download=False)


@pytest.mark.parametrize("stride", [None, 1, 7, 31])
def test_sliding_window_scores_each_token_with_its_windows_context(long_pipe, stride):
    pipe = long_pipe
    ids = np.random.default_rng(4).integers(0, 50257, 90).tolist()
    result = pipe.score(ids, stride=stride)
    context = pipe.config.n_positions
    used = context // 2 if stride is None else stride
    assert result.stride == used
    for begin, end, counted in hf_guide_targets(len(ids), context, used):
        logits = pipe.logits(ids[begin:end])  # one full forward of the guide's window, independently
        for p in counted:
            lp = log_softmax(logits[p - begin - 1])[ids[p]]
            assert result.logprobs[p] == pytest.approx(lp, abs=1e-5), (begin, end, p)
    assert result.logprobs[0] is None and None not in result.logprobs[1:]
    assert result.total_logprob == pytest.approx(math.fsum(result.logprobs[1:]))
    assert result.perplexity == pytest.approx(math.exp(-result.total_logprob / 89))


def test_a_smaller_stride_gives_more_context(long_pipe):
    ids = np.random.default_rng(5).integers(0, 50257, 80).tolist()
    a, b = long_pipe.score(ids, stride=31), long_pipe.score(ids, stride=4)
    assert a.logprobs[:32] == pytest.approx(b.logprobs[:32])  # the first window (32 tokens) is the same
    assert a.logprobs[40] != pytest.approx(b.logprobs[40])  # then the contexts differ


def test_score_text_and_top_logprobs(long_pipe):
    pipe = long_pipe
    text = "The quick brown fox jumps over the lazy dog."
    result = pipe.score(text, top_logprobs=3)
    assert result.ids == pipe.tokenizer.encode(text)
    assert result.top[0] is None and all(len(t) == 3 for t in result.top[1:])
    for token, lp, top in zip(result.ids[1:], result.logprobs[1:], result.top[1:], strict=True):
        assert top[0][1] >= top[1][1] >= top[2][1] and top[0][1] >= lp
        assert dict(top).get(token, lp) == lp  # the token itself, where it is among the top, agrees
    d = result.to_dict()
    assert set(d) == {"ids", "logprobs", "total_logprob", "perplexity", "stride", "top"}
    assert set(pipe.score(text).to_dict()) == {"ids", "logprobs", "total_logprob", "perplexity", "stride"}


@pytest.mark.parametrize(
    ("text", "kwargs", "needle"),
    [
        ("", {}, "at least 2 tokens"),
        ("Hi", {}, "at least 2 tokens"),
        ("Hello world", {"stride": 0}, "stride"),
        ("Hello world", {"stride": 32}, r"stride must be an integer in \[1, 31\]"),
        ("Hello world", {"stride": 2.5}, "stride"),
        ([1, 50257], {}, "50257"),
        ([1, -1], {}, "-1"),
        ("Hello world", {"top_logprobs": -1}, "top_logprobs"),
    ],
)
def test_bad_scoring_requests(long_pipe, text, kwargs, needle):
    with pytest.raises(ScoringError, match=needle):
        long_pipe.score(text, **kwargs)


def test_forward_last_positions(golden_logits_model):
    model, golden, _ = golden_logits_model
    ids = golden["ids_4"][None]
    full = model.forward(ids, all_logits=True)
    np.testing.assert_allclose(model.forward(ids, last=5), full[:, -5:], rtol=1e-5, atol=1e-5)
    assert model.forward(ids, last=1).shape == (1, 1, model.config.vocab_size)
    with pytest.raises(ValueError, match="last 34"):
        model.forward(ids, last=34)


def test_padded_vocabulary_scores_over_the_tokenizers_ids(tmp_path):
    config = small_config(vocab_size=50304, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    model = Gpt2.from_weights(config, random_state_dict(config, 2), NumpyBackend())
    pipe = Pipeline(model, Tokenizer.from_file(TOKENIZER_JSON))
    ids = [1, 2, 3]
    logits = pipe.logits(ids)[:, :50257]
    result = pipe.score(ids)
    assert result.logprobs[1] == pytest.approx(log_softmax(logits[0])[2], abs=1e-5)
    with pytest.raises(ScoringError, match="50300"):
        pipe.score([1, 50300])


def test_every_backend_scores_alike(backend):
    config = small_config(vocab_size=300, n_positions=24, n_embd=16, n_layer=2, n_head=2)
    sd = random_state_dict(config, 9)
    ids = np.random.default_rng(6).integers(0, 300, 60).tolist()
    ref = score_ids(Gpt2.from_weights(config, sd, NumpyBackend(dtype="float64")), ids, stride=10)
    ours = score_ids(Gpt2.from_weights(config, sd, backend), ids, stride=10)
    # float32 rounding; a backend with 16-bit weights (half) to its conformance tolerance.
    full = dtype_name(backend.dtype) in ("float32", "float64")
    atol = LOGPROB_ATOL if full else tolerance_for(backend.dtype).atol
    np.testing.assert_allclose(ours.logprobs[1:], ref.logprobs[1:], rtol=0, atol=atol)
