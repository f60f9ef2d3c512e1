"""numpy vs cpu-threaded vs Hugging Face transformers, side by side, measured in ONE run.

    python benches/compare.py                     # prefill 64/512/1000 and decode; median of 5 repeats
    python benches/compare.py --repeat 9 --scaling    # and cpu-threaded at 1, 2, 4, ... threads
    python benches/compare.py --no-hf             # without torch/transformers

Everyone gets the same random weights of the GPT-2 124M shape (speed does not depend on the values).
Each repeat runs every (case, implementation) pair once, round robin, so a noisy neighbour slows all of
them alike; the tables show the median and the spread ((max - min) / median) of the repeats, the ratios
as the median of the per-repeat ratios with their range, and the load average before and after: on a
machine shared with other work, read the spread before the ratios.

Cases: prefill of 64, 512 and 1000 tokens (the prompt through the model into a fresh KV cache, up to the
host logits of the last position), and decode (ms per token: 8 cached one-token steps after a 64-token
prefill, batch 1).

transformers runs with its defaults: float32, sdpa attention, no torch.compile, torch.set_num_threads(the
usable cores). Its prefill is ``model(ids, use_cache=True, logits_to_keep=1)``, the call ``generate()``
makes (logits of the last position only, like inferno); decode is one cached forward of one token.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

from inferno.backends.threaded import ThreadedBackend
from inferno.bench import GPT2_124M, prompt_ids, random_weights, time_decode, time_prefill, weights_in_layout
from inferno.cpu import usable_cores
from inferno.models.gpt2 import Gpt2

PREFILLS = (64, 512, 1000)
DECODE_PROMPT, DECODE_STEPS = 64, 8


class Impl:
    """One implementation under test: prefill(ids) -> seconds, decode(ids, steps) -> seconds per token."""

    def __init__(self, label: str, prefill: Callable, decode: Callable, backend=None) -> None:
        self.label, self.prefill, self.decode, self.backend = label, prefill, decode, backend


_LAYOUTS: dict = {}  # the weights once per memory layout, shared by the backends that want it


def inferno_impl(label: str, backend, weights) -> Impl:
    model = Gpt2.from_weights(GPT2_124M, weights_in_layout(weights, backend, _LAYOUTS), backend)
    return Impl(label, lambda ids: time_prefill(model, ids), lambda ids, n: time_decode(model, ids, n),
                backend)


def hf_impl(weights, threads: int) -> Impl:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.set_num_threads(threads)
    c = GPT2_124M
    config = GPT2Config(vocab_size=c.vocab_size, n_positions=c.n_positions, n_embd=c.n_embd,
                        n_layer=c.n_layer, n_head=c.n_head)
    model = GPT2LMHeadModel(config).eval()
    state = {f"transformer.{k}": torch.from_numpy(v) for k, v in weights.items()}
    state["lm_head.weight"] = state["transformer.wte.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    if [k for k in missing if not k.endswith("attn.bias")] or unexpected:
        raise RuntimeError(f"weights do not fit transformers' GPT-2: {missing=}, {unexpected=}")

    @torch.inference_mode()
    def prefill(ids):
        x = torch.tensor([ids])
        start = time.perf_counter()
        model(x, use_cache=True, logits_to_keep=1).logits.numpy()
        return time.perf_counter() - start

    @torch.inference_mode()
    def decode(ids, steps):
        out = model(torch.tensor([ids]), use_cache=True, logits_to_keep=1)
        start = time.perf_counter()
        for _ in range(steps):
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            out = model(token, past_key_values=out.past_key_values, use_cache=True)
            out.logits.numpy()
        return (time.perf_counter() - start) / steps

    label = (f"transformers (torch {torch.__version__}, {torch.get_num_threads()} threads, "
             f"{model.config._attn_implementation} attention)")
    return Impl(label, prefill, decode)


def measure(impls: list[Impl], repeat: int, pause: float) -> dict[tuple[str, str], list[float]]:
    cases = [(f"prefill {n}", n) for n in PREFILLS] + [("decode /token", 0)]
    prompts = {n: prompt_ids(n, GPT2_124M.vocab_size, seed=n) for n in (*PREFILLS, DECODE_PROMPT)}
    times: dict[tuple[str, str], list[float]] = {}
    for impl in impls:  # warm up: first calls allocate, page in weights, start threads
        impl.prefill(prompts[64][:16])
        impl.decode(prompts[64][:8], 2)
    for rep in range(repeat):
        for case, n in cases:
            for impl in impls:
                print(f"\r\x1b[Krepeat {rep + 1}/{repeat}: {case} {impl.label}", end="", file=sys.stderr,
                      flush=True)
                time.sleep(pause)  # let the previous implementation's spinning threads go to sleep
                if n:
                    seconds = impl.prefill(prompts[n])
                else:
                    seconds = impl.decode(prompts[DECODE_PROMPT], DECODE_STEPS)
                times.setdefault((case, impl.label), []).append(seconds)
    print("\r\x1b[K", end="", file=sys.stderr, flush=True)
    return times


def cell(values: list[float]) -> str:
    med = statistics.median(values)
    spread = (max(values) - min(values)) / med * 100
    return f"{med * 1e3:8.1f} ±{spread:3.0f}%"


def ratio(times, case, slow: str, fast: str) -> str:
    """The median of the per-repeat ratios (each repeat runs both back to back), and their range."""
    paired = [a / b for a, b in zip(times[(case, slow)], times[(case, fast)], strict=True)]
    return f"{statistics.median(paired):.2f}x ({min(paired):.2f}-{max(paired):.2f})"


def print_table(title: str, times, labels: list[str], ratios: list[tuple[str, str, str]]) -> None:
    cases = list(dict.fromkeys(case for case, _ in times))
    print(f"\n{title}")
    head = ["ms (median ±spread)"] + [short(label) for label in labels] + [name for name, _, _ in ratios]
    rows = [head]
    for case in cases:
        row = [case] + [cell(times[(case, label)]) for label in labels]
        row += [ratio(times, case, slow, fast) for _, slow, fast in ratios]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        cells = [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]
        print("  ".join([r[0].ljust(widths[0]), *cells]))


def short(label: str) -> str:
    return label.split(" (")[0]


def environment(threads: int) -> str:
    from threadpoolctl import threadpool_info

    blas = [f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')} kernel, "
            f"{i.get('num_threads')} threads)" for i in threadpool_info() if i.get("user_api") == "blas"]
    env = {k: v for k, v in os.environ.items() if k.startswith(("OPENBLAS", "OMP_", "MKL_"))}
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {usable_cores()} usable; "
            f"numpy {np.__version__}, BLAS: {'; '.join(blas) or 'unknown'}; env {env or '{}'}; "
            f"cpu-threaded threads={threads}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5, help="round-robin repeats (default 5)")
    p.add_argument("--no-hf", action="store_true", help="skip transformers")
    p.add_argument("--scaling", action="store_true", help="also cpu-threaded at 1, 2, 4, ... threads")
    p.add_argument("--pause", type=float, default=0.3, help="seconds of idle before each timed call "
                   "(default 0.3): OpenBLAS's and OpenMP's worker threads spin for ~0.1 s after a call and "
                   "would otherwise slow down whatever runs next")
    args = p.parse_args(argv)

    cores = usable_cores()
    print(f"# python benches/compare.py {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip())
    print(f"# {environment(cores)}")
    start = time.perf_counter()
    weights = random_weights(GPT2_124M)
    from inferno.backends.numpy_backend import NumpyBackend

    impls = [inferno_impl("numpy", NumpyBackend(), weights),
             inferno_impl("cpu-threaded", ThreadedBackend(threads=cores), weights)]
    if not args.no_hf:
        impls.append(hf_impl(weights, cores))
    scaling = [n for n in sorted({1, 2, 4, 8, 16, cores}) if n <= cores] if args.scaling else []
    for n in scaling:
        if n != cores:
            impls.append(inferno_impl(f"cpu-threaded:threads={n}", ThreadedBackend(threads=n), weights))
    load_before = os.getloadavg()
    times = measure(impls, args.repeat, args.pause)
    load_after = os.getloadavg()
    print(f"# load average (1 min) before {load_before[0]:.1f}, after {load_after[0]:.1f} on "
          f"{os.cpu_count()} CPUs; {args.repeat} repeats in {time.perf_counter() - start:.0f} s")

    labels = [impl.label for impl in impls[: 3 if not args.no_hf else 2]]
    ratios = [("threaded/numpy", "numpy", "cpu-threaded")]
    if not args.no_hf:
        ratios.append(("threaded/HF", labels[2], "cpu-threaded"))
    print_table("Speed-ups are time ratios: > 1 means cpu-threaded is faster. Targets: >= 1.3x numpy at "
                "prefill 512 and 1000, >= 1.0x HF at prefill 1000, >= 1.0x numpy at prefill 64 and decode.",
                {k: v for k, v in times.items() if k[1] in labels}, labels, ratios)
    if scaling:
        by_threads = {n: ("cpu-threaded" if n == cores else f"cpu-threaded:threads={n}") for n in scaling}
        table = {(case, f"threads={n}"): times[(case, label)] for n, label in by_threads.items()
                 for case in dict.fromkeys(c for c, _ in times)}
        print_table("Scaling: cpu-threaded by worker count (speed-up over threads=1)", table,
                    [f"threads={n}" for n in scaling],
                    [(f"x{n}", "threads=1", f"threads={n}") for n in scaling if n > 1])
    for impl in impls:
        if impl.backend is not None:
            impl.backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
