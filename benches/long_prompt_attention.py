"""The half plugin's attention of a long prompt: in C (AVX-512: in tiles of queries; AVX2: a query at a
time) against NumPy's batched matmuls (what it ran before), side by side in ONE run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benches/long_prompt_attention.py
        [--backend half:dtype=int8] [--rounds 3] [--shapes gpt2-124m,smollm2-135m,qwen2.5-0.5b]

Random weights of GPT-2 124M's, SmolLM2-135M's and Qwen2.5-0.5B's shapes (speed does not depend on the
values); a prompt of 512 and of 1000 tokens through the model's `forward` into a fresh cache, the two
routings interleaved round by round (`inferno_half.backend._long_prompt_in_c`: the rule as it is, and one
that sends every prompt of more than SMALL_M queries to NumPy), medians of `--rounds`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import inferno_half.backend as hb
import numpy as np

from inferno.backends.registry import get_backend
from inferno.bench import GPT2_124M, random_weights, weights_in_layout
from inferno.models.gpt2 import Gpt2
from inferno.models.llama import LlamaConfig, from_state_dict
from inferno.testing import llama_state_dict

SHAPES = {
    "smollm2-135m": {"model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
                     "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
                     "num_key_value_heads": 3,
                     "tie_word_embeddings": True, "max_position_embeddings": 2048, "rope_theta": 100000.0},
    "qwen2.5-0.5b": {"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
                     "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
                     "num_key_value_heads": 2,
                     "tie_word_embeddings": True, "max_position_embeddings": 2048, "rope_theta": 1e6},
}


def _numpy(d: int) -> bool:
    return False


def _model(name: str, be):
    if name == "gpt2-124m":
        return Gpt2.from_weights(GPT2_124M, weights_in_layout(random_weights(), be, {}), be)
    cfg = SHAPES[name]
    return from_state_dict(LlamaConfig.from_dict(cfg), llama_state_dict(cfg), be)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="half:dtype=int8")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", default="gpt2-124m," + ",".join(SHAPES))
    args = ap.parse_args()
    be = get_backend(args.backend)
    now = hb._long_prompt_in_c
    print(f"{args.backend} on {type(be).runs_on()}; load average {os.getloadavg()[0]:.2f}")
    for name in args.shapes.split(","):
        model = _model(name, be)
        for t in (512, 1000):
            ids = np.random.default_rng(0).integers(0, 49000, (1, t))
            times: dict[str, list[float]] = {"before": [], "now": []}
            for _ in range(args.rounds):
                for label, rule in (("before", _numpy), ("now", now)):
                    hb._long_prompt_in_c = rule
                    cache = model.new_cache(1, t)
                    time.sleep(0.2)  # the other routing's threads settle
                    start = time.perf_counter()
                    model.forward(ids, cache)
                    times[label].append(time.perf_counter() - start)
            hb._long_prompt_in_c = now
            a, b = statistics.median(times["before"]), statistics.median(times["now"])
            print(f"  {name}, prefill {t}: NumPy attention {t / a:7.1f} tok/s, C {t / b:7.1f} tok/s: "
                  f"{a / b:.2f}x; load average {os.getloadavg()[0]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
