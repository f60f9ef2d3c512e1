"""Batch-1 decode and prefill with 16-bit weights against float32 `numpy`, side by side in ONE run.

    python benches/sixteen_bit.py                    # 5 interleaved rounds
    python benches/sixteen_bit.py --rounds 9 --steps 64 --json out.json
    python benches/sixteen_bit.py --accuracy         # each format's logits and greedy ids against float32
    python benches/sixteen_bit.py --xl --backends numpy half half:dtype=int8   # GPT-2 XL shape, peak RSS

Backends (each skipped with a note when not installed): `numpy` (float32, the baseline), `torch` in
float32 and bfloat16 (the inferno-gpt2-torch plugin: oneDNN-packed weights on the CPU), and `half` with
float16, bfloat16 and int8 weights (the inferno-gpt2-half plugin: float32 activations, compiled kernels).

All get the same random weights of the GPT-2 124M shape. Each round runs every backend once, in turn,
so that a noisy neighbour slows all of them alike (with a rest of `PAUSE` before each timed part, for
the previous one's thread pools to stop spinning); the table shows medians over rounds, and each ratio
is the median of the per-round ratios to `numpy`. Decode is the median step time of `--steps` cached
one-token steps after a 64-token prefill, the first `WARMUP` steps left out; prefill is the prompt through
a fresh KV cache up to the host logits of its last position. A memory-bandwidth probe (reading a
512 MB array) says what the floor is: bytes of weights per step / bandwidth.

`--accuracy` instead compares each backend's weights with float32's (`numpy`) on the same random
weights: the logits of a prompt of 8 tokens and the 256 tokens float32 generates greedily after it
(teacher-forced: the max |logit error| over max |logit|, and the share of those 256 positions whose
argmax is float32's), and the backend's own free-running greedy run (how many of the 256 tokens match
before the first difference).

`--simulate q4_0 q4_1` adds, to `--accuracy`, float32 `numpy` on weights rounded by a 4-bit scheme and
back (the matrices only: weight-only error, no quantized inputs): llama.cpp's q4_0 (a scale per block of
32, symmetric: `half:dtype=q4`'s) and q4_1 (a scale and a minimum per block), to pick between them.

`--xl` runs the GPT-2 XL shape (1.5B parameters): random weights written once to a safetensors file,
then each backend in a fresh process that loads it as `inferno.load` does (streamed, one tensor at a
time) and reports its peak RSS over the bytes of weights it holds, its batch-1 decode and its 16-sequence
aggregate decode (through the engine; one round each, `--steps` steps).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

from inferno.backends.registry import (
    BackendUnavailableError,
    UnknownBackendError,
    get_backend,
    parse_backend_spec,
)
from inferno.bench import GPT2_124M, prompt_ids, random_weights
from inferno.models.config import Gpt2Config
from inferno.models.gpt2 import Gpt2

SPECS = ("numpy", "torch:device=cpu", "torch:device=cpu,dtype=bfloat16", "half", "half:dtype=bfloat16",
         "half:dtype=int8")
PREFILLS = (64, 1000)
WARMUP = 4
#: Seconds of rest before each timed part: the thread pools of the part before (OpenBLAS's spin ~0.1 s
#: after a call, OpenMP's for a while) would otherwise take cores from this one's first steps.
PAUSE = 0.3
#: The clock of every timing: wall time, or with --cpu-time the process's CPU time (see main).
CLOCK = time.perf_counter


def decode_ms(model: Gpt2, ids: list[int], steps: int) -> float:
    """Median ms of one cached decode step (one token in, host logits out)."""
    cache = model.new_cache(1, len(ids) + steps + 1)
    be = model.backend
    logits = be.to_numpy(model.forward(np.asarray([ids]), cache))
    times = []
    for _ in range(steps):
        token = int(np.argmax(logits[0]))
        start = CLOCK()
        logits = be.to_numpy(model.forward(np.asarray([[token]]), cache))
        times.append(CLOCK() - start)
    return 1e3 * statistics.median(times[WARMUP:] if steps > 2 * WARMUP else times)


def prefill_s(model: Gpt2, ids: list[int]) -> float:
    """Seconds (of CLOCK) for the prompt through a fresh cache up to the host logits of its last position."""
    cache = model.new_cache(1, len(ids) + 1)
    start = CLOCK()
    model.backend.to_numpy(model.forward(np.asarray([ids]), cache))
    return CLOCK() - start


def bandwidth_gbs(threads: int) -> float:
    """Read bandwidth: the best of 5 sums over a 512 MB float32 array, split among `threads` threads."""
    from concurrent.futures import ThreadPoolExecutor

    a = np.ones(128 << 20, dtype=np.float32)
    parts = np.array_split(a, threads)
    with ThreadPoolExecutor(threads) as pool:
        best = min(_timed(lambda: list(pool.map(np.sum, parts))) for _ in range(5))
    return a.nbytes / best / 1e9


def _timed(f) -> float:
    start = time.perf_counter()
    f()
    return time.perf_counter() - start


def weight_bytes(model: Gpt2) -> int:
    """Bytes the backend holds for the weights (a packed copy of the tied head included)."""
    def size(a) -> int:
        inner = getattr(a, "weight", a)  # inferno-gpt2-torch's LinearWeight wraps a tensor
        return int(inner.nbytes)

    total = 0
    for name, a in model.named_weights():
        if name == "lm_head.weight" and a is model.wte:
            continue  # tied: the same array as wte
        total += size(a)
        head = getattr(a, "_inferno_head", None)
        if head is not None:
            total += size(head)
    return total


def greedy(model: Gpt2, ids: list[int], steps: int) -> list[int]:
    """`steps` greedy tokens after `ids` (the logits' argmax each step)."""
    cache = model.new_cache(1, len(ids) + steps)
    logits = model.backend.to_numpy(model.forward(np.asarray([ids]), cache))
    out = []
    for _ in range(steps):
        out.append(int(np.argmax(logits[0])))
        logits = model.backend.to_numpy(model.forward(np.asarray([[out[-1]]]), cache))
    return out


def simulated(a: np.ndarray, scheme: str) -> np.ndarray:
    """[out, in] float32 rounded by `scheme` (q4_0 or q4_1, blocks of 32 inputs, float16 scales) and back."""
    n, k = a.shape
    blocks = np.zeros((n, -(-k // 32) * 32), np.float32)
    blocks[:, :k] = a
    blocks = blocks.reshape(n, -1, 32)
    if scheme == "q4_0":
        from inferno_half.q4 import quantize_q4

        q, s = quantize_q4(blocks.reshape(n, -1))
        out = q.reshape(blocks.shape) * s.astype(np.float32)[..., None]
    else:  # q4_1: 16 levels from the block's minimum to its maximum
        lo, hi = blocks.min(axis=2, keepdims=True), blocks.max(axis=2, keepdims=True)
        d = ((hi - lo) / 15).astype(np.float16).astype(np.float32)
        m = lo.astype(np.float16).astype(np.float32)
        q = np.clip(np.rint((blocks - m) / np.where(d > 0, d, 1)), 0, 15)
        out = q * d + m
    return out.reshape(n, -1)[:, :k].astype(np.float32)


def accuracy(models: dict[str, Gpt2], steps: int = 256) -> list[dict]:
    """Each model's logits and greedy tokens against the first one's (float32 `numpy`)."""
    prompt = prompt_ids(8, GPT2_124M.vocab_size)
    ref_model = next(iter(models.values()))
    ref_ids = greedy(ref_model, prompt, steps)
    seq = np.asarray([prompt + ref_ids[:-1]])
    ref = ref_model.backend.to_numpy(ref_model.forward(seq, all_logits=True))[0, len(prompt) - 1 :]
    rows = []
    for spec, model in models.items():
        got = model.backend.to_numpy(model.forward(seq, all_logits=True))[0, len(prompt) - 1 :]
        own = greedy(model, prompt, steps)
        same = next((i for i, (a, b) in enumerate(zip(own, ref_ids, strict=True)) if a != b), steps)
        error = float(np.abs(got - ref).max() / np.abs(ref).max())
        rows.append({"backend": spec, "max_rel_logit_error": error,
                     "argmax_agreement": float((got.argmax(-1) == np.asarray(ref_ids)).mean()),
                     "greedy_prefix": same})
    return rows


GPT2_XL = Gpt2Config(vocab_size=50257, n_positions=1024, n_embd=1600, n_layer=48, n_head=25)


def _rss(key: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    return 0


def xl_child(path: str, spec: str, steps: int) -> dict:
    """One backend on the XL file: load (streamed), peak RSS, batch-1 decode ms, 16-sequence tok/s."""
    from inferno.engine import Engine
    from inferno.models.weights import iter_weights

    name, opts = parse_backend_spec(spec)
    be = get_backend(name, **opts)
    base = _rss("VmRSS")
    model = Gpt2.from_weights(GPT2_XL, iter_weights(path, GPT2_XL, be.weight_order), be)
    peak = _rss("VmHWM") - base
    held = weight_bytes(model)
    decode = decode_ms(model, prompt_ids(64, GPT2_XL.vocab_size), steps)
    engine = Engine(model, slots=16, prefill_chunk=128, autostart=False)
    for i in range(16):
        engine.submit(prompt_ids(8, GPT2_XL.vocab_size, seed=i), steps + 1)
    engine.step()
    times = []
    for _ in range(steps):
        start = CLOCK()
        engine.step()
        times.append(CLOCK() - start)
    engine.close()
    return {"backend": spec, "held_MB": held / 1e6, "peak_rss_MB": peak / 1e6, "decode_tok_s": 1e3 / decode,
            "seq16_tok_s": 16 / statistics.median(times)}


def xl(specs: list[str], steps: int) -> int:
    import subprocess
    import tempfile

    from safetensors.numpy import save_file

    with tempfile.TemporaryDirectory(prefix="inferno-xl-") as tmp:
        path = os.path.join(tmp, "model.safetensors")
        save_file(random_weights(GPT2_XL), path)
        rows = []
        for spec in specs:
            flags = ["--cpu-time"] if CLOCK is time.process_time else []
            out = subprocess.run([sys.executable, __file__, "--xl-child", path, spec, "--steps", str(steps),
                                  *flags], capture_output=True, text=True)
            if out.returncode:
                print(f"{spec} failed:\n{out.stderr}", file=sys.stderr)
                continue
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"{spec} done", file=sys.stderr)
    from inferno.cpu import blas_line

    clock = "CPU time, one thread each" if CLOCK is time.process_time else "wall time"
    print(f"\nGPT-2 XL shape (1.5B), random weights; one run of {steps} steps each ({clock}); {blas_line()}")
    print("| backend | weights held MB | peak RSS MB | peak / held | decode tok/s | 16 sequences tok/s |")
    print("| --- | --: | --: | --: | --: | --: |")
    for r in rows:
        print(f"| {r['backend']} | {r['held_MB']:.0f} | {r['peak_rss_MB']:.0f} | "
              f"{r['peak_rss_MB'] / r['held_MB']:.2f} | {r['decode_tok_s']:.1f} | {r['seq16_tok_s']:.1f} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=32, help="decode steps per round (default 32)")
    p.add_argument("--backends", nargs="+", default=list(SPECS))
    p.add_argument("--no-prefill-1000", action="store_true", help="skip the 1000-token prefill (slow)")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--accuracy", action="store_true", help="compare logits and greedy ids with float32 "
                   "instead of timing (the first backend is the reference: keep numpy first)")
    p.add_argument("--simulate", nargs="*", default=[], choices=("q4_0", "q4_1"),
                   help="with --accuracy: also numpy on weights rounded by these 4-bit schemes")
    p.add_argument("--cpu-time", action="store_true", help="time in process CPU seconds, BLAS on one "
                   "thread: give each backend one thread (e.g. half:threads=1); far less disturbed by "
                   "neighbours on a shared machine than wall time")
    p.add_argument("--xl", action="store_true", help="the GPT-2 XL shape: peak RSS, decode, 16 sequences")
    p.add_argument("--xl-child", nargs=2, metavar=("FILE", "SPEC"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.cpu_time:
        global CLOCK
        CLOCK = time.process_time
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
    if args.xl_child:
        print(json.dumps(xl_child(args.xl_child[0], args.xl_child[1], args.steps)))
        return 0
    if args.xl:
        return xl(args.backends, args.steps)

    weights = random_weights()
    models: dict[str, Gpt2] = {}
    for spec in args.backends:
        name, opts = parse_backend_spec(spec)
        try:
            be = get_backend(name, **opts)
        except (UnknownBackendError, BackendUnavailableError, ValueError) as exc:
            print(f"skipped {spec}: {exc}", file=sys.stderr)
            continue
        host = {k: np.asarray(a, order=be.weight_order(k)) for k, a in weights.items()}
        models[spec] = Gpt2.from_weights(GPT2_124M, host, be)
    for scheme in args.simulate if args.accuracy else ():
        be = get_backend("numpy")
        # Linear weights are [in, out] (Conv1D): blocks run along `in`, the first axis; wte is [out, in].
        host = {k: simulated(a, scheme) if k == "wte.weight" else simulated(a.T, scheme).T if a.ndim == 2
                and k != "wpe.weight" else a for k, a in weights.items()}
        models[f"numpy, {scheme} weights (simulated)"] = Gpt2.from_weights(GPT2_124M, host, be)
    del weights
    if args.accuracy:
        rows = accuracy(models)
        print(f"\nGPT-2 124M shape, random weights: each backend against {next(iter(models))} over a prompt "
              "of 8 tokens and the 256 tokens it generates greedily")
        print("| backend | max logit error / max logit | argmax = float32's (teacher-forced) | "
              "greedy tokens equal before the first difference |")
        print("| --- | --: | --: | --: |")
        for row in rows:
            print(f"| {row['backend']} | {row['max_rel_logit_error']:.2e} | {row['argmax_agreement']:.3f} | "
                  f"{row['greedy_prefix']} / 256 |")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        return 0
    prefills = PREFILLS[:1] if args.no_prefill_1000 else PREFILLS
    prompts = {n: prompt_ids(n, GPT2_124M.vocab_size) for n in (64, *prefills)}
    results: dict[str, dict[str, list[float]]] = {s: {} for s in models}
    load_before = os.getloadavg()[0]
    gbs = bandwidth_gbs(len(os.sched_getaffinity(0)))
    for r in range(args.rounds):
        for spec, model in models.items():
            res = results[spec]
            time.sleep(PAUSE)
            res.setdefault("decode_ms", []).append(decode_ms(model, prompts[64], args.steps))
            for n in prefills:
                time.sleep(PAUSE)
                res.setdefault(f"prefill{n}_tok_s", []).append(n / prefill_s(model, prompts[n]))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    load_after = os.getloadavg()[0]

    base = results.get("numpy")
    rows = []
    for spec, res in results.items():
        row = {"backend": spec, "weights_MB": weight_bytes(models[spec]) / 1e6,
               "decode_tok_s": 1e3 / statistics.median(res["decode_ms"])}
        if base:
            pairs = zip(base["decode_ms"], res["decode_ms"], strict=True)
            row["decode_x_numpy"] = statistics.median(b / d for b, d in pairs)
        for n in prefills:
            key = f"prefill{n}_tok_s"
            row[key] = statistics.median(res[key])
            if base:
                row[f"prefill{n}_x_numpy"] = statistics.median(
                    v / b for v, b in zip(res[key], base[key], strict=True))
        row["floor_tok_s"] = gbs * 1e9 / (row["weights_MB"] * 1e6)
        rows.append(row)

    from inferno.cpu import blas_line

    print(f"\nGPT-2 124M shape, random weights; {args.rounds} interleaved rounds, {args.steps} decode steps; "
          f"read bandwidth {gbs:.1f} GB/s; load average {load_before:.2f} -> {load_after:.2f}; "
          f"{blas_line()}")
    head = "| backend | weights MB | decode tok/s | x numpy | " + " | ".join(
        f"prefill {n} tok/s | x numpy" for n in prefills) + " | bandwidth floor tok/s |"
    print(head)
    print("|" + " --- |" * (head.count("|") - 1))
    for row in rows:
        cells = [row["backend"], f"{row['weights_MB']:.0f}", f"{row['decode_tok_s']:.1f}",
                 f"{row.get('decode_x_numpy', float('nan')):.2f}"]
        for n in prefills:
            ratio = row.get(f"prefill{n}_x_numpy", float("nan"))
            cells += [f"{row[f'prefill{n}_tok_s']:.0f}", f"{ratio:.2f}"]
        cells.append(f"{row['floor_tok_s']:.0f}")
        print("| " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bandwidth_GBs": gbs, "rows": rows, "raw": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
