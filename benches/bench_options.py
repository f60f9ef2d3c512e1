"""Benchmarks of the generation options and of scoring, on random weights of the GPT-2 124M shape.

    python -m pytest benches/bench_options.py --benchmark-only --benchmark-columns=min,median,rounds

* generate-16-all-options: 16 new tokens from an 8-token prompt through `Pipeline.generate` with
  logprobs=5, four stop strings that do not occur, repetition/presence/frequency penalties and a logit
  bias, greedy and sampled (temperature 0.8, top_k 40, seeded); for every registered backend;
* score-256: `Pipeline.score` of 256 token ids (one window: a forward with the logits of 255 positions,
  then the float64 log-softmax), for every registered backend;
* step-32: 32 `SequenceState.step` calls on 50257-wide logits rows, plain and with every option, greedy,
  sampled and at temperature 1 without a cut (a draw over the whole vocabulary), with a top-p cut alone
  (0.9 at temperature 1; 0.95 at temperature 3, where the cut keeps most of the vocabulary), without a
  model (what the options add to decode steps; backend-independent).

For the side-by-side ratios against plain decode and prefill, see ``options_overhead.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inferno.api import Pipeline
from inferno.bench import prompt_ids
from inferno.options import GenerationOptions, SequenceState
from inferno.tokenizer import Tokenizer

VOCAB = 50257
TOKENIZER_JSON = Path(__file__).resolve().parents[1] / "inferno" / "data" / "gpt2" / "tokenizer.json"
ALL_OPTIONS = {"logprobs": 5, "stop": ["\n\n\n", "###", "<END>", "Q:"], "repetition_penalty": 1.1,
               "presence_penalty": 0.5, "frequency_penalty": 0.5,
               "logit_bias": {50256: -100.0, 198: -5.0, 13: 2.0, 262: 1.5}}
SAMPLERS = {"greedy": {}, "sampled": {"temperature": 0.8, "top_k": 40, "seed": 1},
            "temperature-1": {"temperature": 1.0, "seed": 1},  # (the OpenAI API's default: no cut)
            "top-p": {"temperature": 1.0, "top_p": 0.9, "seed": 1},
            "top-p-hot": {"temperature": 3.0, "top_p": 0.95, "seed": 1}}  # (a flat row: the cut keeps most)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(TOKENIZER_JSON)


@pytest.fixture
def pipe(gpt2_model, tokenizer) -> Pipeline:
    return Pipeline(gpt2_model, tokenizer)


@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_generate_16_all_options(benchmark, pipe, sampler):
    prompt = prompt_ids(8, VOCAB, seed=1)
    options = GenerationOptions(**ALL_OPTIONS, **SAMPLERS[sampler])

    def generate():
        result = pipe.generate(prompt, max_new_tokens=16, stop_at_eos=False, options=options)
        assert result.finish_reason == "length" and len(result.logprobs) == 16
        return result

    benchmark.pedantic(generate, rounds=5, iterations=1, warmup_rounds=1)


def test_score_256(benchmark, pipe):
    ids = prompt_ids(256, VOCAB, seed=2)

    def score():
        result = pipe.score(ids)
        assert len(result.logprobs) == 256 and np.isfinite(result.total_logprob)
        return result

    benchmark.pedantic(score, rounds=5, iterations=1, warmup_rounds=1)


@pytest.mark.parametrize("sampler", list(SAMPLERS))
@pytest.mark.parametrize("options", ["plain", "all-options"])
def test_step_32(benchmark, tokenizer, options, sampler):
    kwargs = {**(ALL_OPTIONS if options == "all-options" else {}), **SAMPLERS[sampler]}
    rows = np.random.default_rng(0).standard_normal((32, VOCAB), dtype=np.float32) * 3
    prompt = prompt_ids(8, VOCAB, seed=1)

    def setup():
        return (SequenceState(GenerationOptions(**kwargs), prompt, tokenizer.incremental_decoder()),), {}

    def steps(state):
        for row in rows:
            if state.step(row).finish_reason is not None:
                break
        return state

    benchmark.pedantic(steps, setup=setup, rounds=10, iterations=1, warmup_rounds=1)
