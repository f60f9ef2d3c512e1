"""Decode speed of the numpy backend by weight memory layout, side by side in ONE run.

    python benches/weight_layout.py [--repeat 7]

Three layouts of the same random 124M-shape weights: every matrix row-major (as the file stores them),
the backend's own choice (`NumpyBackend.weight_order`: the c_proj weights and `wte` column-major) and
every matrix column-major. Each repeat generates 128 greedy tokens after an 8-token prompt with each
layout in turn, after a 0.3 s rest (OpenBLAS's workers spin after a call); medians of ms per token, and
the median of the per-repeat ratios to row-major.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from inferno.backends.numpy_backend import NumpyBackend
from inferno.bench import GPT2_124M, prompt_ids, random_weights
from inferno.generate import generate_tokens
from inferno.models.gpt2 import Gpt2

NEW_TOKENS, PROMPT, PAUSE = 128, 8, 0.3


class _Layout(NumpyBackend):
    """The numpy backend with every matrix in one given memory order."""

    def __init__(self, order: str) -> None:
        super().__init__()
        self.order = order

    def weight_order(self, name: str) -> str:
        return self.order if name.endswith(".weight") and "ln_" not in name and name != "wpe.weight" else "C"


def ms_per_token(model: Gpt2, prompt: list[int]) -> float:
    stream = generate_tokens(model, prompt, NEW_TOKENS)
    start = time.perf_counter()
    n = sum(1 for _ in stream)
    return (time.perf_counter() - start) / n * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    weights = random_weights()
    backends = {"all row-major": _Layout("C"), "numpy backend's layout": NumpyBackend(),
                "all column-major": _Layout("F")}
    models = {label: Gpt2.from_weights(GPT2_124M, weights, be) for label, be in backends.items()}
    prompt = prompt_ids(PROMPT, GPT2_124M.vocab_size, seed=1)
    times: dict[str, list[float]] = {label: [] for label in models}
    for model in models.values():  # warm-up
        ms_per_token(model, prompt[:2])
    for r in range(args.repeat):
        print(f"repeat {r + 1}/{args.repeat}", file=sys.stderr)
        for label, model in models.items():
            time.sleep(PAUSE)
            times[label].append(ms_per_token(model, prompt))
    base = times["all row-major"]
    print(f"decode, {NEW_TOKENS} greedy tokens after {PROMPT}, 124M shape, {args.repeat} repeats")
    print("| layout | ms/token (median) | speed-up over row-major |")
    print("| --- | --: | --: |")
    for label, values in times.items():
        paired = [b / v for b, v in zip(base, values, strict=True)]
        print(f"| {label} | {statistics.median(values):.1f} | {statistics.median(paired):.2f}x "
              f"({min(paired):.2f}-{max(paired):.2f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
