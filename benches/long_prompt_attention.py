"""The half plugin's attention of a long Llama-family prompt: in tiles of queries in C (AVX-512) against
NumPy's batched matmuls (what it ran before), side by side in ONE run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benches/long_prompt_attention.py
        [--backend half:dtype=int8] [--rounds 3]

Random weights of the SmolLM2-135M and Qwen2.5-0.5B shapes (speed does not depend on the values); a
prompt of 512 and of 1000 tokens through `Llama.forward` into a fresh cache, the two routings of
`gqa_attention` interleaved round by round (`inferno_half.backend._in_c`: the rule as it is, and the
earlier one that sent prompts of more than SMALL_M queries to NumPy), medians of `--rounds`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import inferno_half.backend as hb
import numpy as np

from inferno.backends.registry import get_backend
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


def _before(q: np.ndarray) -> bool:
    return hb._KERNELS is not None and q.shape[2] <= hb.SMALL_M


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="half:dtype=int8")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    be = get_backend(args.backend)
    now = hb._in_c
    print(f"{args.backend} on {type(be).runs_on()}; load average {os.getloadavg()[0]:.2f}")
    for name, cfg in SHAPES.items():
        model = from_state_dict(LlamaConfig.from_dict(cfg), llama_state_dict(cfg), be)
        for t in (512, 1000):
            ids = np.random.default_rng(0).integers(0, 49000, (1, t))
            times: dict[str, list[float]] = {"before": [], "now": []}
            for _ in range(args.rounds):
                for label, rule in (("before", _before), ("now", now)):
                    hb._in_c = rule
                    cache = model.new_cache(1, t)
                    time.sleep(0.2)  # the other routing's threads settle
                    start = time.perf_counter()
                    model.forward(ids, cache)
                    times[label].append(time.perf_counter() - start)
            hb._in_c = now
            a, b = statistics.median(times["before"]), statistics.median(times["now"])
            print(f"  {name}, prefill {t}: NumPy attention {t / a:7.1f} tok/s, C tiles {t / b:7.1f} tok/s: "
                  f"{a / b:.2f}x; load average {os.getloadavg()[0]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
