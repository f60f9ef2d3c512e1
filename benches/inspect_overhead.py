"""What looking inside costs (`inferno.inspect`), against a prefill of the same text, side by side in ONE run.

    python benches/inspect_overhead.py [--repeat 5] [--tokens 64] [--backend numpy]
    python benches/inspect_overhead.py --shape xl --tokens 1024 --memory   # the 1.5B shape's peak memory

Random weights of the GPT-2 124M shape (speed does not depend on the values), in the layout the backend
asks for. Every case is measured in every repeat, in an order rotated from repeat to repeat, after a
0.3 s rest (OpenBLAS's workers spin after a call); the table shows medians, each ratio is the median of
the per-repeat ratios to the prefill, with their range. Nothing is asserted: the target (inspecting a
64-token text under 2x a 64-token prefill) is printed beside the measurement.

Cases, all on the same `--tokens` random ids:

- prefill: ``model.forward(ids)``, the last position's logits (what generation does first);
- inspect, all: ``inspect_ids(model, ids)``: every block's and head's attention and the logit lens at
  every position (n_layer + 1 LM heads over all T positions);
- inspect, lens at the last position: every attention, the lens at the last position only (what
  ``inferno inspect`` asks);
- inspect, one block and one position: ``layers=[0]``, ``positions=[T - 1]`` (what the playground asks per
  click).

``--memory`` runs the full attention (every block and head) with the lens at the last position once, and
reports the peak of NumPy's allocations during the call (tracemalloc: NumPy reports its buffers to it),
the size of the result's attention array, and the process's peak RSS (weights included).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import time
import tracemalloc

import numpy as np

from inferno.backends.registry import get_backend
from inferno.bench import GPT2_124M, prompt_ids, random_weights, weights_in_layout
from inferno.inspect import inspect_ids
from inferno.models.config import Gpt2Config
from inferno.models.gpt2 import Gpt2

SHAPES = {"124m": GPT2_124M,
          "xl": Gpt2Config(vocab_size=50257, n_positions=1024, n_embd=1600, n_layer=48, n_head=25)}
REST = 0.3


def build(shape: Gpt2Config, backend_spec: str) -> Gpt2:
    backend = get_backend(backend_spec)
    weights = random_weights(shape, seed=0)
    laid = weights_in_layout(weights, backend, {})
    del weights
    return Gpt2.from_weights(shape, ((n, laid.pop(n)) for n in list(laid)), backend)


def cases(model: Gpt2, ids: list[int]) -> dict[str, callable]:
    t, be = len(ids), model.backend
    return {
        "prefill": lambda: be.to_numpy(model.forward(np.asarray([ids]))),
        "inspect, all": lambda: inspect_ids(model, ids),
        "inspect, lens at the last position": lambda: inspect_ids(model, ids, positions=[t - 1]),
        "inspect, one block and one position": lambda: inspect_ids(model, ids, layers=[0], positions=[t - 1]),
    }


def timing(model: Gpt2, ids: list[int], repeat: int) -> None:
    run = cases(model, ids)
    names = list(run)
    for f in run.values():  # warm up: first-call shape checks, BLAS pools, page faults
        f()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeat):
        for n in names[r % len(names):] + names[: r % len(names)]:
            time.sleep(REST)
            start = time.perf_counter()
            run[n]()
            times[n].append(time.perf_counter() - start)
    print(f"{len(ids)} tokens, {model.config.n_layer} layers x {model.config.n_head} heads, "
          f"C {model.config.n_embd}; backend {model.backend.name}; {repeat} repeats (medians)\n")
    print(f"{'case':<40} {'seconds':>9} {'x prefill':>10} {'range':>15}")
    for n in names:
        ratios = [a / b for a, b in zip(times[n], times["prefill"], strict=True)]
        print(f"{n:<40} {statistics.median(times[n]):>9.3f} {statistics.median(ratios):>10.2f} "
              f"{min(ratios):>7.2f}-{max(ratios):<7.2f}")
    print("\ntarget: inspecting a 64-token text under 2x a 64-token prefill")


def memory(model: Gpt2, ids: list[int]) -> None:
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tracemalloc.start()
    start = time.perf_counter()
    result = inspect_ids(model, ids, positions=[len(ids) - 1])
    seconds = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    c = model.config
    print(f"{len(ids)} tokens, {c.n_layer} layers x {c.n_head} heads, C {c.n_embd}; backend "
          f"{model.backend.name}; every attention, the lens at the last position; {seconds:.1f} s")
    print(f"attention array: {result.attention.nbytes:,} bytes")
    print(f"peak of NumPy allocations during the call: {peak:,} bytes")
    print(f"process peak RSS: {rss_before:,} bytes after loading, {rss:,} bytes after inspecting")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--backend", default="numpy")
    p.add_argument("--shape", choices=sorted(SHAPES), default="124m")
    p.add_argument("--memory", action="store_true", help="one run: peak memory instead of timings")
    args = p.parse_args()
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
          f"numpy {np.__version__}")
    model = build(SHAPES[args.shape], args.backend)
    ids = prompt_ids(args.tokens, model.config.vocab_size)
    if args.memory:
        memory(model, ids)
    else:
        timing(model, ids, args.repeat)


if __name__ == "__main__":
    main()
