"""Generation options and scoring against Hugging Face transformers (float64, eager attention).

Both sides hold the same random weights: the real 50257-token vocabulary and tokenizer, small other sizes.

* logprobs (greedy, seeded sampling, sampling with a repetition penalty): each new token's logprob and its
  top 5 are log_softmax of HF's logits of the whole sequence, within 1e-4 absolute; top ids compare as sets,
  and may differ only where HF puts the swapped entries within 1e-4 of each other.
* `score`: per-token logprobs within 1e-4 absolute and perplexity within 1e-5 relative, for a text inside
  the context and for 2,500 tokens through the sliding window of the HF perplexity guide (HF's own loss).
* repetition penalty (prompt tokens included): greedy ids identical to `GPT2LMHeadModel.generate(
  repetition_penalty=...)` until HF's top two processed scores come within 1e-4 (relative) of each other,
  where float32 may break the tie.
* candidates after penalty, bias, temperature, top-k, top-p: the ids HF's logits-processor chain keeps,
  with probabilities within 1e-6, on the same float64 logits.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from goldens import write_model_dir  # noqa: E402
from hf_oracle import hf_logits, hf_model  # noqa: E402
from transformers.generation.logits_process import (  # noqa: E402
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import inferno  # noqa: E402
from inferno.options import GenerationOptions, LogitsProcessor  # noqa: E402
from inferno.sampling import Sampler  # noqa: E402
from inferno.testing import random_state_dict, small_config  # noqa: E402

pytestmark = pytest.mark.oracle

LOGPROB_ATOL = 1e-4
PPL_RTOL = 1e-5
PROB_ATOL = 1e-6
NEAR_TIE = 1e-4
TOP_N = 5
# Prompts whose greedy text every tested repetition penalty changes (random weights tend to repeat one token).
PROMPTS = ["The capital of France is", "Once upon a time", "import numpy as np\n", "they'LL say 42"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(inferno pipeline, HF model) on one random model; a 256-token context so 2,500 tokens need windows."""
    config = small_config(vocab_size=50257, n_positions=256, n_embd=32, n_layer=2, n_head=2)
    sd = random_state_dict(config, seed=41)
    directory = write_model_dir(tmp_path_factory.mktemp("model"), config, sd)
    # One torch thread: on a small machine torch's OpenMP pool and numpy's BLAS threads spin against each
    # other between calls (three times slower). Restored afterwards.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield inferno.load(directory, "numpy", download=False), hf_model(config, sd)
    torch.set_num_threads(threads)


def log_softmax(logits) -> np.ndarray:
    return torch.log_softmax(torch.as_tensor(logits, dtype=torch.float64), dim=-1).numpy()


def hf_chain(scores: torch.Tensor, seq: list[int], *, repetition_penalty=1.0, logit_bias=None,
             temperature=1.0, top_k=0, top_p=1.0) -> torch.Tensor:
    """HF's processors in inferno's documented order on one row [1, V]; removed ids are -inf."""
    input_ids = torch.tensor([seq])
    if repetition_penalty != 1.0:
        scores = RepetitionPenaltyLogitsProcessor(repetition_penalty)(input_ids, scores)
    if logit_bias:
        # Single-token sequences: HF adds their bias at every step, which is what a logit bias is.
        scores = SequenceBiasLogitsProcessor([[[i], b] for i, b in logit_bias.items()])(input_ids, scores)
    scores = TemperatureLogitsWarper(temperature)(input_ids, scores)
    if top_k:
        scores = TopKLogitsWarper(top_k)(input_ids, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(input_ids, scores)
    return scores


def assert_top_matches(top: list[tuple[int, float]], ref: np.ndarray, n: int = TOP_N) -> None:
    """`top` (id, logprob), most likely first, against HF's log-probability row `ref`."""
    ids = [i for i, _ in top]
    values = np.array([lp for _, lp in top])
    assert len(ids) == len(set(ids)) == n
    np.testing.assert_allclose(values, ref[ids], rtol=0, atol=LOGPROB_ATOL)  # each one's own logprob
    ref_ids = np.argsort(-ref, kind="stable")[:n]
    np.testing.assert_allclose(values, ref[ref_ids], rtol=0, atol=LOGPROB_ATOL)  # the k-th best, rank by rank
    cutoff = ref[ref_ids[-1]]
    for i in set(ids) ^ set(ref_ids.tolist()):  # a swap only across a near-tie at the cut
        assert abs(ref[i] - cutoff) <= LOGPROB_ATOL, f"top {n}: {sorted(ids)}, HF {sorted(ref_ids.tolist())}"


# ------------------------------------------------------------------------------------------- logprobs

LOGPROB_CASES = {
    "greedy": {},
    "sampled": {"temperature": 0.9, "top_k": 40, "seed": 7},
    # A penalty moves the sampled distribution further from the reported one (the raw logits').
    "sampled-penalised": {"temperature": 0.9, "top_k": 40, "seed": 7, "repetition_penalty": 1.3},
}


@pytest.mark.parametrize("case", LOGPROB_CASES)
@pytest.mark.parametrize("prompt", PROMPTS[:3])
def test_logprobs_are_the_models_own(pair, prompt, case):
    pipe, model = pair
    options = LOGPROB_CASES[case]
    prompt_ids = pipe.encode(prompt)
    out = pipe.generate(prompt_ids, max_new_tokens=24, stop_at_eos=False, logprobs=TOP_N, **options)
    assert len(out.ids) == len(out.logprobs) == 24
    logits = hf_logits(model, prompt_ids + out.ids)[len(prompt_ids) - 1 : -1]  # row i predicts out.ids[i]
    ref = log_softmax(logits)
    chain = {k: v for k, v in options.items() if k != "seed"}
    sampled_gap = 0.0
    for i, (token, lp) in enumerate(zip(out.ids, out.logprobs, strict=True)):
        assert lp.id == token
        assert abs(lp.logprob - ref[i, token]) <= LOGPROB_ATOL, f"step {i}"
        assert_top_matches(lp.top, ref[i])
        if "temperature" in options:
            sampled = log_softmax(hf_chain(torch.from_numpy(logits[i : i + 1]), prompt_ids + out.ids[:i],
                                           **chain)[0])
            assert np.isfinite(sampled[token]), f"step {i}: drew {token}, outside HF's candidates"
            sampled_gap = max(sampled_gap, abs(sampled[token] - lp.logprob))
    if "temperature" in options:
        # What was reported is not the distribution that was sampled (else this test could not tell).
        assert sampled_gap > 0.05
    if "repetition_penalty" in options:  # and the penalty was in force: the same seed draws other tokens
        plain = {k: v for k, v in options.items() if k != "repetition_penalty"}
        assert pipe.generate(prompt_ids, max_new_tokens=24, stop_at_eos=False, **plain).ids != out.ids


# ---------------------------------------------------------------------------------------------- score


def test_score_within_the_context(pair):
    pipe, model = pair
    text = "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs!"
    result = pipe.score(text, top_logprobs=TOP_N)
    ids = result.ids
    assert ids == pipe.tokenizer.encode(text) and 2 < len(ids) < pipe.config.n_positions
    ref = log_softmax(hf_logits(model, ids))[:-1]  # row j predicts ids[j + 1]
    assert result.logprobs[0] is None and result.top[0] is None
    np.testing.assert_allclose(result.logprobs[1:], ref[np.arange(len(ids) - 1), ids[1:]], rtol=0,
                               atol=LOGPROB_ATOL)
    for top, row in zip(result.top[1:], ref, strict=True):
        assert_top_matches(top, row)
    with torch.no_grad():  # HF's own mean NLL over the len - 1 predicted tokens
        loss = model(torch.tensor([ids]), labels=torch.tensor([ids])).loss.item()
    assert result.perplexity == pytest.approx(math.exp(loss), rel=PPL_RTOL)
    assert result.total_logprob == pytest.approx(-loss * (len(ids) - 1), rel=PPL_RTOL)


def hf_sliding_window(model, ids: list[int], stride: int) -> tuple[np.ndarray, float, int]:
    """The HF perplexity guide's loop on HF's loss: (logprob of each token from the window that scores it
    (NaN for the first), perplexity, tokens scored)."""
    max_length = model.config.n_positions
    encodings = torch.tensor([ids])
    seq_len = encodings.size(1)
    logprobs = np.full(seq_len, np.nan)
    nll_sum, n_tokens, prev_end_loc = 0.0, 0, 0
    for begin_loc in range(0, seq_len, stride):
        end_loc = min(begin_loc + max_length, seq_len)
        trg_len = end_loc - prev_end_loc
        input_ids = encodings[:, begin_loc:end_loc]
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        with torch.no_grad():
            outputs = model(input_ids, labels=target_ids)
        # The guide counts (target_ids != -100).sum() - 1, but the label shift drops a valid label only in
        # the first window: later ones start with -100 already, so that count is one short of what the loss
        # averaged and the guide's mean is mis-weighted (by ~3e-4 relative here). Count the averaged labels.
        labels = target_ids[0, 1:]
        num_loss_tokens = int((labels != -100).sum())
        nll_sum += outputs.loss.item() * num_loss_tokens
        n_tokens += num_loss_tokens
        # Per token: window position j predicts input j + 1; each scored label once, from this window.
        # The scored labels are the window's last num_loss_tokens.
        first = end_loc - num_loss_tokens
        rows = torch.log_softmax(outputs.logits[0, first - begin_loc - 1 : -1], dim=-1)
        lp = rows.gather(1, labels[-num_loss_tokens:, None])[:, 0].numpy()
        assert np.isnan(logprobs[first:end_loc]).all(), "a token scored twice"
        logprobs[first:end_loc] = lp
        # The same tokens as the loss (which HF computes from float32 logits: `logits.float()`).
        assert -lp.sum() == pytest.approx(outputs.loss.item() * num_loss_tokens, rel=1e-6)
        prev_end_loc = end_loc
        if end_loc == seq_len:
            break
    return logprobs, math.exp(nll_sum / n_tokens), n_tokens


@pytest.mark.parametrize("stride", [None, 100])
def test_score_sliding_window(pair, stride):
    pipe, model = pair
    ids = np.random.default_rng(3).integers(0, 50257, 2500).tolist()
    result = pipe.score(ids, stride=stride)
    n_positions = pipe.config.n_positions
    assert result.stride == (n_positions // 2 if stride is None else stride)
    ref, ppl, n_tokens = hf_sliding_window(model, ids, result.stride)
    assert n_tokens == len(ids) - 1 and np.isfinite(ref[1:]).all()  # every token but the first, once
    assert result.logprobs[0] is None
    np.testing.assert_allclose(result.logprobs[1:], ref[1:], rtol=0, atol=LOGPROB_ATOL)
    assert result.perplexity == pytest.approx(ppl, rel=PPL_RTOL)
    # Not vacuous: context matters, so the per-token match pins down which window scored each token.
    # Here the tokens of a second disjoint chunk, scored without the context the windows give them:
    chunk = ids[n_positions : 2 * n_positions]
    chunked = log_softmax(hf_logits(model, chunk))[np.arange(n_positions - 1), chunk[1:]]
    assert np.abs(chunked - ref[n_positions + 1 : 2 * n_positions]).max() > 1e-2


# -------------------------------------------------------------------------------- repetition penalty

N_GREEDY = 32


def hf_greedy_penalised(model, ids: list[int], n: int, penalty: float) -> tuple[list[int], list[float]]:
    """HF generate's greedy ids with `penalty`, and each step's gap between the top two processed scores
    relative to the largest |score| (recomputed here with HF's processor on HF's raw logits)."""
    out = model.generate(
        torch.tensor([ids]), max_new_tokens=n, do_sample=False, repetition_penalty=penalty,
        pad_token_id=model.config.eos_token_id, eos_token_id=None,  # no stopping at <|endoftext|>
        return_dict_in_generate=True, output_logits=True, output_scores=True,
    )
    seq = out.sequences
    assert seq.shape[1] == len(ids) + n
    process = RepetitionPenaltyLogitsProcessor(penalty)
    gaps = []
    for step, (logits, scores) in enumerate(zip(out.logits, out.scores, strict=True)):
        processed = process(seq[:, : len(ids) + step], logits.clone())
        # The penalty is all HF applied (no min_length, no_repeat_ngram, suppressed tokens, ...).
        assert torch.equal(processed, scores), f"step {step}: HF processed more than the penalty"
        top2 = torch.topk(processed[0], 2).values
        gaps.append(float((top2[0] - top2[1]) / processed[0].abs().max()))
    return seq[0, len(ids) :].tolist(), gaps


def assert_greedy_penalised_matches(pipe, model, ids: list[int], penalty: float) -> list[int]:
    """Our greedy ids with `penalty` equal HF generate's up to the first near-tie; returns ours up to it."""
    ref, gaps = hf_greedy_penalised(model, ids, N_GREEDY, penalty)
    ours = pipe.generate(ids, max_new_tokens=N_GREEDY, stop_at_eos=False, repetition_penalty=penalty).ids
    compared = 0
    for step, (a, b, gap) in enumerate(zip(ours, ref, gaps, strict=True)):
        if gap < NEAR_TIE:
            break
        assert a == b, f"step {step}: ours {a}, transformers {b}"
        compared += 1
    assert compared >= 24
    return ours[:compared]


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("penalty", [1.2, 0.8, 2.0])
def test_repetition_penalty_greedy_matches_generate(pair, penalty, prompt):
    pipe, model = pair
    ids = pipe.encode(prompt)
    ours = assert_greedy_penalised_matches(pipe, model, ids, penalty)
    # The penalty changed the greedy text within what was compared, so the match says something.
    plain = pipe.generate(ids, max_new_tokens=N_GREEDY, stop_at_eos=False).ids
    assert plain[: len(ours)] != ours


@pytest.mark.parametrize("prompt", [PROMPTS[1], PROMPTS[3]])
@pytest.mark.parametrize("penalty", [1.2, 2.0])
def test_repetition_penalty_counts_the_prompt(pair, penalty, prompt):
    pipe, model = pair
    # A prompt that ends in the model's favourite tokens, so that penalising the prompt decides the text.
    ids = pipe.encode(prompt)
    ids += pipe.generate(ids, max_new_tokens=3, stop_at_eos=False).ids
    ours = assert_greedy_penalised_matches(pipe, model, ids, penalty)
    generated_only = RepetitionPenaltyLogitsProcessor(penalty, prompt_ignore_length=len(ids))
    other = model.generate(torch.tensor([ids]), max_new_tokens=N_GREEDY, do_sample=False,
                           logits_processor=[generated_only], pad_token_id=model.config.eos_token_id,
                           eos_token_id=None)[0, len(ids) :].tolist()
    assert other[: len(ours)] != ours


# ------------------------------------------------------------------------ candidates after penalties

CHAINS = [
    {"repetition_penalty": 1.3, "temperature": 0.9, "top_k": 40},
    {"repetition_penalty": 0.8, "temperature": 1.2, "top_k": 50, "top_p": 0.8},
    {"repetition_penalty": 2.0, "temperature": 0.5, "top_p": 0.9},
    {"repetition_penalty": 1.2, "temperature": 0.7, "top_k": 200, "top_p": 0.6},
    # Biases on the second most likely token, the 12th, and <|endoftext|> (4786th) at this step.
    {"repetition_penalty": 1.5, "temperature": 1.0, "top_k": 20,
     "logit_bias": {12534: -5.0, 947: 3.0, 50256: 8.0}},
]


@pytest.mark.parametrize("history_in", ["prompt", "generated"])
@pytest.mark.parametrize("chain", CHAINS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_candidates_match_hf_processor_chain(pair, chain, history_in):
    pipe, model = pair
    prompt = pipe.encode("Once upon a time")
    history = pipe.generate(prompt, max_new_tokens=12, stop_at_eos=False).ids  # greedy: the top tokens
    logits = hf_logits(model, prompt + history)[-1]  # float64, fed to both
    options = GenerationOptions(**chain)
    # The penalty counts the history's tokens whether they came with the prompt or were generated.
    if history_in == "prompt":
        processor = LogitsProcessor(options, prompt + history)
    else:
        processor = LogitsProcessor(options, prompt)
        for token in history:
            processor.append(token)
    ids, probs = Sampler(options.sampling).distribution(processor(logits))

    def hf_probs(**kwargs) -> np.ndarray:
        scores = hf_chain(torch.from_numpy(logits[None]), prompt + history, **kwargs)[0]
        return torch.softmax(scores, dim=-1).numpy()

    ref = hf_probs(**chain)
    assert sorted(ids.tolist()) == np.flatnonzero(ref).tolist()
    np.testing.assert_allclose(probs, ref[ids], rtol=0, atol=PROB_ATOL)
    # Each option moved the distribution, so the match says something about each.
    for name in ("repetition_penalty", "logit_bias"):
        if name in chain:
            without = hf_probs(**{k: v for k, v in chain.items() if k != name})
            assert np.abs(without - ref).max() > 1e-2, name
