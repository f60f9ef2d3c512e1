"""Time to first token in the engine alone (no HTTP): N prompts submitted together, as `inferno serve`'s
16-client benchmark sends them, against what the prefill arithmetic allows, side by side in ONE run.

    python benches/first_token.py                           # half, 16 prompts of 64 tokens, chunks 64,256
    python benches/first_token.py --backends numpy,half --chunks 64 --repeat 5

Each repeat makes a fresh engine (N slots) for every backend and prefill chunk in turn, submits N
prompts of `--prompt-tokens` random ids at once (temperature 1, `--new-tokens` each), and records when
each request's first token arrives. Printed: the median and last first token, the aggregate tok/s, and
the backend's prefill rate on its own: one forward of the N prompts as one ragged batch, in tokens/s and
in GFLOP/s (2 x the block parameters x tokens; attention and the one sampled LM-head row per prompt left
out). The floor of the median first token under first-come-first-served admission is the prefill of the
first half of the prompts: (N/2 + 1/2) x prompt tokens / that rate, before any decode row or HTTP.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import threading
import time

from inferno.backends.registry import get_backend
from inferno.bench import GPT2_124M, prompt_ids, random_weights
from inferno.engine import Engine
from inferno.models.gpt2 import Gpt2
from inferno.models.weights import expected_shapes
from inferno.options import GenerationOptions


def block_params(config) -> int:
    """The blocks' matrix parameters (each one a multiply-add per token)."""
    shapes = expected_shapes(config)
    return sum(math.prod(s) for name, s in shapes.items() if name.startswith("h.") and len(s) == 2)


def first_tokens(model: Gpt2, prompts: list[list[int]], new: int, chunk: int) -> tuple[list[float], float]:
    with Engine(model, slots=len(prompts), prefill_chunk=chunk) as engine:
        start = time.perf_counter()
        handles = [engine.submit(p, new, GenerationOptions(temperature=1.0, seed=i))
                   for i, p in enumerate(prompts)]
        firsts: list[float] = []

        def wait_first(h) -> None:
            for _ in h:
                firsts.append(time.perf_counter() - start)
                break

        threads = [threading.Thread(target=wait_first, args=(h,)) for h in handles]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for h in handles:
            h.result()
        return sorted(firsts), time.perf_counter() - start


def prefill_rate(model: Gpt2, prompts: list[list[int]]) -> float:
    slots = model.new_slots(len(prompts))
    rows = [(p, i, 0) for i, p in enumerate(prompts)]
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        model.backend.to_numpy(model.forward_ragged(rows, slots, [True] * len(rows)))
        best = min(best, time.perf_counter() - start)
    return sum(map(len, prompts)) / best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="half")
    p.add_argument("--chunks", default="64,256", help="the engine's prefill_chunk values (64,256)")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()

    weights = random_weights()
    models = {spec: Gpt2.from_weights(GPT2_124M, dict(weights), get_backend(spec))
              for spec in args.backends.split(",")}
    chunks = [int(c) for c in args.chunks.split(",")]
    seeds = itertools.count()

    def new_prompts() -> list[list[int]]:
        return [prompt_ids(args.prompt_tokens, GPT2_124M.vocab_size, next(seeds))
                for _ in range(args.prompts)]

    results: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    for r in range(args.repeat):
        for spec, model in models.items():
            for chunk in chunks:
                firsts, total = first_tokens(model, new_prompts(), args.new_tokens, chunk)
                results.setdefault((spec, chunk), []).append(
                    (statistics.median(firsts), firsts[-1], args.prompts * args.new_tokens / total))
                print(f"[repeat {r + 1}, {spec}, chunk {chunk}: median first token "
                      f"{statistics.median(firsts) * 1e3:.0f} ms]", flush=True)

    flops = 2 * block_params(GPT2_124M)
    print(f"\n{args.prompts} prompts of {args.prompt_tokens} tokens submitted together, "
          f"{args.new_tokens} new tokens each, temperature 1; medians of {args.repeat} repeats\n")
    print("| backend | prefill chunk | first token, median (ms) | last (ms) | output tok/s |")
    print("| --- | --: | --: | --: | --: |")
    for (spec, chunk), runs in results.items():
        med, last, tps = (statistics.median(x[i] for x in runs) for i in range(3))
        print(f"| {spec} | {chunk} | {med * 1e3:.0f} | {last * 1e3:.0f} | {tps:.0f} |")
    print("\n| backend | ragged prefill of all prompts, tok/s | GFLOP/s "
          "| floor of the median first token (ms) |")
    print("| --- | --: | --: | --: |")
    half_tokens = (args.prompts / 2 + 0.5) * args.prompt_tokens
    for spec, model in models.items():
        rate = prefill_rate(model, new_prompts())
        print(f"| {spec} | {rate:.0f} | {rate * flops / 1e9:.0f} | {half_tokens / rate * 1e3:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
