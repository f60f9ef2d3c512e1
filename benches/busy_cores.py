"""Batch-1 decode and a prompt's prefill while other programs keep cores busy, side by side in ONE run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benches/busy_cores.py [--rounds 3] \\
        [--backends half:dtype=int8 half:dtype=int8,threads=1] [--neighbours 0,1] [--steps 32] [--prompt 64]

A neighbour is a process that spins on one core (a pure-Python loop), started before a timing and killed
after it. Each round times every backend with each number of neighbours in turn, so that the machine's
own swings fall on all of them alike; the table shows medians over rounds, tok/s. The compiled kernels
split each product evenly among their threads and wait at its end for the last one, so a thread that
shares its core with a neighbour holds every product up: this measures how much, and what a backend
given fewer threads (``threads=N``) gets back. The random weights of the GPT-2 124M shape (seeded).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import numpy as np

from inferno.backends.registry import get_backend, parse_backend_spec
from inferno.bench import GPT2_124M, prompt_ids, random_weights, time_decode, time_prefill
from inferno.models.gpt2 import Gpt2

SPIN = "while True: pass"


def with_neighbours(count: int, work):
    """work() while `count` processes spin, one a core; returns what it returns."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(count)]
    try:
        time.sleep(0.3 if count else 0.0)  # (for them to be running, not starting)
        return work()
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--backends", nargs="+", default=["half:dtype=int8", "half:dtype=int8,threads=1"])
    p.add_argument("--neighbours", default="0,1", help="numbers of busy neighbours, comma-separated (0,1)")
    p.add_argument("--steps", type=int, default=32, help="decode steps a timing (32)")
    p.add_argument("--prompt", type=int, default=64, help="tokens of the timed prompt (64)")
    args = p.parse_args(argv)
    counts = [int(c) for c in args.neighbours.split(",")]
    weights = random_weights()
    models = {}
    for spec in args.backends:
        name, opts = parse_backend_spec(spec)
        be = get_backend(name, **opts)
        host = {k: np.asarray(a, order=be.weight_order(k)) for k, a in weights.items()}
        models[spec] = Gpt2.from_weights(GPT2_124M, host, be)
    del weights
    ids = prompt_ids(64, GPT2_124M.vocab_size)
    prompt = prompt_ids(args.prompt, GPT2_124M.vocab_size, seed=1)
    for model in models.values():  # warm up (thread pools, first-touch pages)
        time_decode(model, ids, 4)
        time_prefill(model, prompt)
    decode: dict = {(s, c): [] for s in models for c in counts}
    prefill: dict = {(s, c): [] for s in models for c in counts}
    for r in range(args.rounds):
        for spec, model in models.items():
            for c in counts:
                step = with_neighbours(c, lambda m=model: time_decode(m, ids, args.steps))
                decode[spec, c].append(1.0 / step)
                seconds = with_neighbours(c, lambda m=model: time_prefill(m, prompt))
                prefill[spec, c].append(args.prompt / seconds)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    command = " ".join(argv if argv is not None else sys.argv[1:])
    print(f"\n`python benches/busy_cores.py {command}`: GPT-2 124M shape, random weights; medians of "
          f"{args.rounds} rounds, tok/s\n")
    print("| backend | neighbours | decode, batch 1 | prefill " + str(args.prompt) + " |")
    print("| --- | --: | --: | --: |")
    for spec in models:
        for c in counts:
            print(f"| {spec} | {c} | {statistics.median(decode[spec, c]):.1f} | "
                  f"{statistics.median(prefill[spec, c]):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
