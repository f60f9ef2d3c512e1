"""Continuous batching: aggregate decode throughput by concurrency, chunked prefill, batch 1 through the
engine; side by side in ONE run (124M-shape random weights).

    python benches/batching.py [--repeat 3] [--backends numpy,cpu-threaded] [--sizes 1,2,4,8,16,32]
    python benches/batching.py --backends numpy,half,half:dtype=int8 --sizes 1,16   # options: name:k=v,k=v
    python benches/batching.py --backends half:dtype=int8,half:dtype=int8,kv=float16 --sizes 16 \
        --prompt-tokens 512 --chunks ""                                # long contexts: the KV cache's bytes

* Aggregate decode: N sequences (`--prompt-tokens` prompts, 8) decode `--new-tokens` tokens together through
  `Engine.step`; tok/s is N over the median decode step (prefill excluded), and the ratio is to N = 1 of
  the same backend, as the median of the per-repeat ratios (and their range). Repeats interleave sizes. A
  second table gives each backend's tok/s over the first backend's at the same N (per-repeat ratios).
* Batch 1 through the engine vs the batch-1 `generate_tokens` loop: ms per decode token.
* Chunked prefill: 8 sequences decode while a 1,000-token prompt is admitted; the longest gap between two
  tokens of a running sequence, relative to their median gap (target <= 4x), for a few chunk sizes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from inferno.backends.registry import get_backend, parse_backend_spec
from inferno.bench import GPT2_124M, prompt_ids, random_weights
from inferno.engine import Engine
from inferno.generate import generate_tokens
from inferno.models.gpt2 import Gpt2

PROMPT, PAUSE = 8, 0.3
#: The clock of every timing: wall time, or with --cpu-time the process's CPU time (see main).
CLOCK = time.perf_counter


def decode_tok_s(model: Gpt2, n: int, new_tokens: int, prompt: int = PROMPT) -> float:
    """Aggregate tok/s of n sequences of `prompt`-token prompts decoding together: n over the median time
    of one decode step (their prefill is not timed; the median keeps a step disturbed by another process
    out)."""
    engine = Engine(model, slots=n, prefill_chunk=prompt * n, autostart=False)
    vocab = model.config.vocab_size
    handles = [engine.submit(prompt_ids(prompt, vocab, seed=i), new_tokens) for i in range(n)]
    engine.step()  # every prompt prefilled, the first token of each chosen
    assert all(len(h.state.ids) == 1 for h in handles)
    steps = []
    while True:
        start = CLOCK()
        if not engine.step():
            break
        steps.append(CLOCK() - start)
    engine.close()
    assert all(len(h.state.ids) == new_tokens for h in handles)
    return n / statistics.median(steps)


def batch1_ms(model: Gpt2, new_tokens: int, prompt: int = PROMPT) -> float:
    """Median ms per decode token of the batch-1 loop after a `prompt`-token prompt."""
    stream = iter(generate_tokens(model, prompt_ids(prompt, model.config.vocab_size, seed=0), new_tokens))
    next(stream)  # the prefill and the first token
    times, start = [], CLOCK()
    for _ in stream:
        now = CLOCK()
        times.append(now - start)
        start = now
    return statistics.median(times) * 1e3


def prefill_gaps(model: Gpt2, chunk: int, long_prompt: int = 1000, decoders: int = 8) -> tuple[float, float]:
    """(longest gap / median gap, median gap in ms) of `decoders` sequences while a long prompt arrives."""
    engine = Engine(model, slots=decoders + 1, prefill_chunk=chunk, autostart=False)
    vocab = model.config.vocab_size
    handles = [engine.submit(prompt_ids(PROMPT, vocab, seed=i), 400) for i in range(decoders)]
    for _ in range(3):
        engine.step()
    stamps: list[list[float]] = [[] for _ in handles]
    counts = [len(h.state.ids) for h in handles]

    def mark() -> None:
        now = CLOCK()
        for i, h in enumerate(handles):
            if len(h.state.ids) > counts[i]:
                counts[i] = len(h.state.ids)
                stamps[i].append(now)

    for _ in range(5):  # steady decoding first
        engine.step()
        mark()
    long = engine.submit(prompt_ids(long_prompt, model.config.vocab_size, seed=99), 4)
    while not long.state.ids:
        engine.step()
        mark()
    for _ in range(5):
        engine.step()
        mark()
    engine.close()
    gaps = [b - a for s in stamps for a, b in zip(s, s[1:], strict=False)]
    return max(gaps) / statistics.median(gaps), statistics.median(gaps) * 1e3


def backend_specs(text: str) -> list[str]:
    """"numpy,half:dtype=int8,threads=1" → ["numpy", "half:dtype=int8,threads=1"]: a part with "=" and
    no ":" is one more option of the spec before it."""
    specs: list[str] = []
    for part in text.split(","):
        if "=" in part and ":" not in part and specs:
            specs[-1] += "," + part
        else:
            specs.append(part)
    return specs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backends", default="numpy,cpu-threaded")
    parser.add_argument("--sizes", default="1,2,4,8,16,32")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=PROMPT, help="tokens of each decoding "
                        f"sequence's prompt ({PROMPT}): the context the decode steps attend over")
    parser.add_argument("--chunks", default="16,32,64")
    parser.add_argument("--cpu-time", action="store_true", help="time in process CPU seconds, BLAS on one "
                        "thread: give each backend one thread (e.g. half:threads=1), and the figures are "
                        "throughput per CPU-second, which neighbours on a shared machine disturb far less "
                        "than wall time")
    args = parser.parse_args(argv)
    if args.cpu_time:
        global CLOCK
        CLOCK = time.process_time
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
    sizes = [int(s) for s in args.sizes.split(",")]
    weights = random_weights()
    models = {}
    for spec in backend_specs(args.backends):
        name, options = parse_backend_spec(spec)
        models[spec] = Gpt2.from_weights(GPT2_124M, weights, get_backend(name, **options))
    tok_s = {(b, n): [] for b in models for n in sizes}
    b1 = {b: {"engine": [], "loop": []} for b in models}
    for model in models.values():
        decode_tok_s(model, 2, 4)  # warm-up
    for r in range(args.repeat):
        print(f"repeat {r + 1}/{args.repeat}", file=sys.stderr)
        for b, model in models.items():
            for n in sizes:
                time.sleep(PAUSE)
                tok_s[b, n].append(decode_tok_s(model, n, args.new_tokens, args.prompt_tokens))
            time.sleep(PAUSE)
            b1[b]["loop"].append(batch1_ms(model, args.new_tokens, args.prompt_tokens))
            time.sleep(PAUSE)
            b1[b]["engine"].append(1e3 / decode_tok_s(model, 1, args.new_tokens, args.prompt_tokens))

    from inferno.cpu import blas_line

    print(f"`python benches/batching.py {' '.join(argv if argv is not None else sys.argv[1:])}` "
          f"(124M shape, {args.prompt_tokens}-token prompts, {args.new_tokens} new tokens, "
          f"medians of {args.repeat}; "
          f"{blas_line()})\n")
    print("| sequences | " + " | ".join(f"{b} tok/s | {b} vs 1" for b in models) + " |")
    print("| --: | " + " | ".join("--: | --:" for _ in models) + " |")
    for n in sizes:
        cells = []
        for b in models:
            ratios = [x / y for x, y in zip(tok_s[b, n], tok_s[b, sizes[0]], strict=True)]
            cells.append(f"{statistics.median(tok_s[b, n]):.1f} | {statistics.median(ratios):.2f}x "
                         f"({min(ratios):.2f}-{max(ratios):.2f})")
        print(f"| {n} | " + " | ".join(cells) + " |")
    first, others = next(iter(models)), list(models)[1:]
    if others:
        print("\n| sequences | " + " | ".join(f"{b} / {first}" for b in others) + " |")
        print("| --: |" + " --: |" * len(others))
        for n in sizes:
            cells = []
            for b in others:
                ratios = [x / y for x, y in zip(tok_s[b, n], tok_s[first, n], strict=True)]
                cells.append(f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
            print(f"| {n} | " + " | ".join(cells) + " |")
    print("\n| backend | batch-1 loop ms/token | engine, 1 sequence, ms/token | engine / loop speed |")
    print("| --- | --: | --: | --: |")
    for b in models:
        ratios = [x / y for x, y in zip(b1[b]["loop"], b1[b]["engine"], strict=True)]
        print(f"| {b} | {statistics.median(b1[b]['loop']):.2f} | {statistics.median(b1[b]['engine']):.2f} | "
              f"{statistics.median(ratios):.2f}x |")
    print("\n| backend | prefill chunk | longest gap / median gap | median gap ms |")
    print("| --- | --: | --: | --: |")
    for b, model in models.items():
        for chunk in (int(c) for c in args.chunks.split(",") if c):  # --chunks "": none
            worst, median = prefill_gaps(model, chunk)
            print(f"| {b} | {chunk} | {worst:.2f}x | {median:.1f} |")
    for model in models.values():
        model.backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
