"""inferno vs Hugging Face transformers at the GPT-2 124M shape, and against the memory-bandwidth floor.

    pip install -e ".[test,oracle]" && python benches/vs_transformers.py [--backend numpy] [--repeat 5]

Measured in ONE run on random weights of the real shape (speed does not depend on the values), every
case interleaved across repeats so a noisy neighbour slows both sides alike, with a 0.3 s rest before
each timed run (OpenBLAS's workers spin after a call and would slow the next one); medians reported.

- decode: tokens per second generating 128 new tokens (batch 1, KV cache, greedy, no early stop) after
  an 8-token prompt: `Pipeline`-level generation loop vs `GPT2LMHeadModel.generate`.
- prefill 64: one 64-token prompt to the logits of its last position (transformers: ``logits_to_keep=1``,
  what `generate` asks for).
- bandwidth floor: the bytes of weights a decode step must read (every parameter once, but only one
  `wpe` row), divided by the machine's read bandwidth measured in the same run (threads taking the max of
  a 1 GiB buffer, one per usable core, best of 3 reads; NumPy's max is SIMD and reads at memory speed
  on one core, where its pairwise sum is compute-bound at about 2/3 of it); decode tok/s as a fraction
  of floor tok/s, two ways: *paired* (the probe runs right before and right after each decode run and
  the floor uses their mean, since a shared host's bandwidth changes from second to second; median
  over repeats), and *against the best probe* of the whole run (the most demanding reading).
- cold start: wall time of `inferno PROMPT --max-new-tokens 1` in a fresh process (weights in the page
  cache), from spawn to exit, so it bounds the time to the first token; and that process's peak RSS
  against the size of the weights.

transformers runs with its defaults: float32, sdpa attention, no torch.compile, torch.set_num_threads =
usable cores.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from inferno.backends.registry import get_backend
from inferno.bench import GPT2_124M, prompt_ids, random_weights, read_bandwidth
from inferno.generate import generate_tokens
from inferno.models.gpt2 import Gpt2

ROOT = Path(__file__).resolve().parents[1]
NEW_TOKENS, DECODE_PROMPT, PREFILL = 128, 8, 64
PAUSE = 0.3  # seconds of rest before each timed run


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1



def write_model_dir(directory: Path, weights: dict[str, np.ndarray]) -> Path:
    """The Hub's layout: no prefix, causal-mask buffers, no lm_head; plus the real config and tokenizer."""
    from safetensors.numpy import save_file

    tensors = dict(weights)
    mask = np.tril(np.ones((1, 1, 1024, 1024), dtype=np.float32))
    for i in range(GPT2_124M.n_layer):
        tensors[f"h.{i}.attn.bias"] = mask
    save_file(tensors, str(directory / "model.safetensors"))
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(ROOT / "inferno" / "data" / "gpt2" / name, directory / name)
    return directory


def cold_start(directory: Path, backend: str) -> tuple[float, int]:
    """(seconds from spawn to exit, peak RSS in bytes) of one `inferno` run generating one token."""
    command = [sys.executable, "-m", "inferno", "The quick brown fox", "--model-dir", str(directory),
               "--max-new-tokens", "1", "--backend", backend]
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"inferno failed: {proc.stderr.read().decode()}")
    return seconds, usage.ru_maxrss * 1024  # ru_maxrss is in KiB on Linux


def measure_cold_start(backend: str) -> tuple[float, int]:
    """Median seconds and peak RSS of `inferno ... --max-new-tokens 1` on a 124M-shape model dir.

    Runs before this process holds anything big: a forked child starts with its parent's RSS as its
    peak, which would inflate the figure.
    """
    with tempfile.TemporaryDirectory() as tmp:
        directory = write_model_dir(Path(tmp), random_weights())
        cold_start(directory, backend)  # puts the file in the page cache
        runs = [cold_start(directory, backend) for _ in range(3)]
    return statistics.median(s for s, _ in runs), max(r for _, r in runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="numpy")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)

    start_s, rss = measure_cold_start(args.backend)
    results, bytes_per_token, weight_bytes, cores = measure_speed(args.backend, args.repeat)
    import torch

    med = {k: statistics.median(v) for k, v in results.items()}
    bandwidth = max(results["bandwidth"] + results["bandwidth_after"])
    floor = bandwidth / bytes_per_token
    paired = [rate * bytes_per_token / ((before + after) / 2) for rate, before, after in
              zip(results["ours_decode"], results["bandwidth"], results["bandwidth_after"], strict=True)]
    print(f"\nbackend {args.backend}, {cores} cores, {args.repeat} repeats, medians; "
          f"torch {torch.__version__}")
    print("| measure | inferno | transformers | ratio |")
    print("| --- | --- | --- | --- |")
    print(f"| decode, {NEW_TOKENS} new tokens (tok/s) | {med['ours_decode']:.1f} | {med['hf_decode']:.1f} "
          f"| {med['ours_decode'] / med['hf_decode']:.2f}x |")
    print(f"| prefill {PREFILL} (ms) | {med['ours_prefill'] * 1e3:.1f} | {med['hf_prefill'] * 1e3:.1f} "
          f"| {med['hf_prefill'] / med['ours_prefill']:.2f}x |")
    probes = " ".join(f"{b / 1e9:.0f}/{a / 1e9:.0f}" for b, a in zip(results["bandwidth"],
                                                                   results["bandwidth_after"], strict=True))
    print(f"\nread bandwidth before/after each decode run (GB/s): {probes}; weights read per token "
          f"{bytes_per_token / 1e6:.1f} MB")
    print(f"decode vs the bandwidth floor: {100 * statistics.median(paired):.0f}% paired (median; "
          f"{100 * min(paired):.0f}-{100 * max(paired):.0f}% across repeats); "
          f"{100 * med['ours_decode'] / floor:.0f}% of the best probe ({bandwidth / 1e9:.1f} GB/s, "
          f"floor {floor:.1f} tok/s)")
    print(f"cold start to first token (spawn to exit, median of 3): {start_s:.2f} s; peak RSS "
          f"{rss / 1e6:.0f} MB = {rss / weight_bytes:.2f}x the weights ({weight_bytes / 1e6:.0f} MB)")
    return 0


def measure_speed(backend: str, repeat: int) -> tuple[dict[str, list[float]], int, int, int]:
    """Decode and prefill of inferno and transformers, and the read bandwidth, interleaved."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    cores = usable_cores()
    torch.set_num_threads(cores)
    weights = random_weights()
    weight_bytes = sum(a.nbytes for a in weights.values())
    bytes_per_token = weight_bytes - weights["wpe.weight"].nbytes + weights["wpe.weight"][0].nbytes

    model = Gpt2.from_weights(GPT2_124M, weights, get_backend(backend))
    c = GPT2_124M
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=c.vocab_size, n_positions=c.n_positions, n_embd=c.n_embd,
                                    n_layer=c.n_layer, n_head=c.n_head)).eval()
    state = {f"transformer.{k}": torch.from_numpy(v) for k, v in weights.items()}
    state["lm_head.weight"] = state["transformer.wte.weight"]
    hf.load_state_dict(state, strict=False)
    hf.generation_config.pad_token_id = 0

    decode_prompt = prompt_ids(DECODE_PROMPT, c.vocab_size, seed=1)
    prefill_prompt = prompt_ids(PREFILL, c.vocab_size, seed=2)

    def ours_decode() -> float:
        stream = generate_tokens(model, decode_prompt, NEW_TOKENS)
        start = time.perf_counter()
        n = sum(1 for _ in stream)
        return n / (time.perf_counter() - start)

    def hf_decode() -> float:
        with torch.inference_mode():
            ids = torch.tensor([decode_prompt])
            start = time.perf_counter()
            out = hf.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
            return (out.shape[1] - len(decode_prompt)) / (time.perf_counter() - start)

    def ours_prefill() -> float:
        start = time.perf_counter()
        model.backend.to_numpy(model.forward(np.asarray([prefill_prompt])))
        return time.perf_counter() - start

    def hf_prefill() -> float:
        with torch.inference_mode():
            start = time.perf_counter()
            hf(torch.tensor([prefill_prompt]), use_cache=True, logits_to_keep=1).logits.numpy()
            return time.perf_counter() - start

    # 1 GiB, far beyond any cache, of random values (so that no page sharing or compression on the
    # host can make the probe read less than it claims).
    buffer = np.random.default_rng(0).random(256 * 1024 * 1024, dtype=np.float32)
    cases = {"ours_decode": ours_decode, "hf_decode": hf_decode, "ours_prefill": ours_prefill,
             "hf_prefill": hf_prefill}
    results: dict[str, list[float]] = {name: [] for name in [*cases, "bandwidth", "bandwidth_after"]}
    with ThreadPoolExecutor(cores) as pool:
        for fn in cases.values():  # warm-up
            fn()
        for r in range(repeat):
            print(f"repeat {r + 1}/{repeat}", file=sys.stderr)
            for name, fn in cases.items():
                # OpenBLAS's idle workers spin for ~0.1 s after a call and would slow whoever runs next.
                time.sleep(PAUSE)
                if name == "ours_decode":
                    results["bandwidth"].append(read_bandwidth(buffer, pool, cores))
                results[name].append(fn())
                if name == "ours_decode":
                    time.sleep(PAUSE)
                    results["bandwidth_after"].append(read_bandwidth(buffer, pool, cores))
    return results, bytes_per_token, weight_bytes, cores


if __name__ == "__main__":
    sys.exit(main())
