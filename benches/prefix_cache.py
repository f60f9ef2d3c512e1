"""Automatic prefix caching through `inferno serve`, with and without, side by side in ONE run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benches/prefix_cache.py \\
        [--backend half:dtype=int8] [--questions 50] [--concurrency 16] [--slots 32] [--repeat 3] [--turns 8]
        [--blocks 8,16,32,64]

Two servers are started on random weights of the GPT-2 124M shape and the real tokenizer, one as it
comes (prefix caching on) and one with `--no-prefix-cache`, each with `--slots` KV slots (the cache
lives in the slots no request holds, so more slots than concurrent requests); idle, a server costs no
CPU, and each measure runs on both in turn, `--repeat` times, so a noisy neighbour slows both alike.

* Multiple choice, as lm-eval's `local-completions` scores it: `--questions` questions, each a
  `--context`-token context followed by 4 continuations of 8-32 tokens; each continuation is one
  `/v1/completions` request with ``echo: true, logprobs: 1, max_tokens: 0`` (the logprob of every
  prompt token), question after question by `--concurrency` clients, each sending the next request
  when its last is answered (lm-eval's ``num_concurrent``); 0: every request at once, so that they
  reach the engine in whatever order the server's worker threads plan them. Requests per second with
  the cache over without (the median of the per-repeat ratios), and the hit rate from `/metrics`
  (inferno_prefix_cache_hits over inferno_prefix_cache_queries, the run's increase).
* Chat: a ~400-token system prompt and a short user message, one `/v1/chat/completions` stream at a
  time, each turn a new user message (its system prompt cached after the first): the median time to
  the first token on the server with the cache (a hit) over the one without (a miss).
* Block size (`--blocks`, in this process, no server): the multiple-choice prompts scored through an
  `Engine` of `--slots` slots (``prompt_logprobs=1``, as the server submits them, all at once in
  question order) at each block size, requests per second and hit rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import random_model_dir, start_server, wait_ready  # noqa: E402

from inferno.bench import prompt_ids  # noqa: E402

WORDS = ("the of and to in is was for on that with as by at from his her it an were which are this be "
         "not or have one had but they all their been has who would when there more its into only two "
         "other time new some could these may first then do any like my now over such our man me even "
         "most made after also did many before must through back years where much your way well down "
         "should because each just those people how too little state good very make world still own see "
         "men work long get here between both life being under never day same another know while last "
         "might us great old year off come since against go came right used take three").split()


def multiple_choice(questions: int, context: int, vocab: int) -> list[list[int]]:
    out = []
    for q in range(questions):
        ctx = prompt_ids(context, vocab, seed=1000 + q)
        for c in range(4):
            out.append(ctx + prompt_ids(8 + (q * 4 + c) * 7 % 25, vocab, seed=q * 4 + c))
    return out


def system_prompt(tokens: int) -> str:
    """English-like words, as many as make `tokens` GPT-2 tokens."""
    from inferno.tokenizer import Tokenizer

    tok = Tokenizer.from_file(Path(__file__).resolve().parents[1] / "inferno" / "data" / "gpt2" /
                              "tokenizer.json")
    rng = np.random.default_rng(7)
    words: list[str] = []
    while len(tok.encode(" ".join(words))) < tokens:
        words.append(str(rng.choice(WORDS)))
    return " ".join(words)


def metrics(client, url: str) -> dict[str, float]:
    out = {}
    for line in client.get(url + "/metrics").text.splitlines():
        if line.startswith("inferno_prefix_cache_"):
            name, value = line.split()
            out[name] = float(value)
    return out


async def run_mc(url: str, requests: list[list[int]], concurrency: int) -> float:
    """Requests per second, `concurrency` clients taking the requests in order (0: all at once)."""
    import httpx

    clients = concurrency or len(requests)
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    queue = list(reversed(requests))
    async with httpx.AsyncClient(base_url=url, timeout=3600, limits=limits) as client:
        async def one(prompt: list[int]) -> None:
            r = await client.post("/v1/completions", json={
                "model": "gpt2", "prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": 0,
                "temperature": 0})
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
            lps = r.json()["choices"][0]["logprobs"]["token_logprobs"]
            if len(lps) != len(prompt) or any(x is None for x in lps[1:]):
                raise RuntimeError("the echo lacks prompt logprobs")

        async def worker() -> None:
            while queue:
                await one(queue.pop())

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        return len(requests) / (time.perf_counter() - start)


async def ttft(url: str, system: str, turn: int) -> tuple[float, int]:
    """Time to the first content chunk of one chat stream, and its prompt tokens."""
    import httpx

    body = {"model": "gpt2", "max_tokens": 2, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": f"Question number {turn}: what comes next?"}]}
    first, prompt_tokens = float("nan"), 0
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        start = time.perf_counter()
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    prompt_tokens = chunk["usage"]["prompt_tokens"]
                if first != first and any(c.get("delta", {}).get("content") for c in chunk["choices"]):
                    first = time.perf_counter() - start
    return first, prompt_tokens


def block_sweep(model_dir: Path, backend: str, requests: list[list[int]], blocks: list[int],
                slots: int) -> None:
    from inferno.api import load
    from inferno.engine import Engine

    model = load(str(model_dir), backend).model
    for block in blocks:
        engine = Engine(model, slots=slots, max_queue=None, prefix_block=block)
        start = time.perf_counter()
        handles = [engine.submit(p, 0, prompt_logprobs=1) for p in requests]
        for h in handles:
            h.result()
        seconds = time.perf_counter() - start
        s = engine.stats
        engine.close()
        print(f"  block {block:3d} tokens: {len(requests) / seconds:7.2f} req/s, hit rate "
              f"{s.prefix_cache_hits / s.prefix_cache_queries:.1%}")


def main(argv: list[str] | None = None) -> int:
    import httpx

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="half:dtype=int8")
    ap.add_argument("--questions", type=int, default=50)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--concurrency", type=int, default=16, help="clients (0: every request at once)")
    ap.add_argument("--slots", type=int, default=32)
    ap.add_argument("--system-tokens", type=int, default=400)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--blocks", default="", help="block sizes to sweep in-process, e.g. 8,16,32,64")
    ap.add_argument("--port", type=int, default=8731)
    args = ap.parse_args(argv)
    print(f"{platform.machine()}, {len(os.sched_getaffinity(0))} usable cores, numpy {np.__version__}; "
          f"load average {os.getloadavg()[0]:.2f}")
    requests = multiple_choice(args.questions, args.context, 50257)
    system = system_prompt(args.system_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = random_model_dir(Path(tmp) / "model")
        servers = {}
        for i, (name, flags) in enumerate((("cache", ""), ("no cache", " --no-prefix-cache"))):
            url = f"http://127.0.0.1:{args.port + i}"
            proc = start_server(model_dir, args.backend + flags, args.slots, args.port + i,
                                Path(tmp) / f"{i}.log")
            servers[name] = (url, proc)
        try:
            for url, proc in servers.values():
                wait_ready(url, proc)
            print(f"backend {args.backend}, {len(requests)} multiple-choice requests ({args.questions} "
                  f"questions, {args.context}-token context, echo + logprobs 1, max_tokens 0), "
                  f"{args.concurrency or 'all'} at once, {args.slots} slots")
            rps: dict[str, list[float]] = {n: [] for n in servers}
            hit_rates = []
            with httpx.Client(timeout=60) as client:
                for r in range(args.repeat):  # interleaved; the order alternates
                    for name in (list(servers) if r % 2 == 0 else list(servers)[::-1]):
                        url = servers[name][0]
                        before = metrics(client, url)
                        time.sleep(0.5)
                        rps[name].append(asyncio.run(run_mc(url, requests, args.concurrency)))
                        after = metrics(client, url)
                        if name == "cache":
                            q = after["inferno_prefix_cache_queries"] - before["inferno_prefix_cache_queries"]
                            h = after["inferno_prefix_cache_hits"] - before["inferno_prefix_cache_hits"]
                            hit_rates.append(h / q)
                    print(f"  round {r + 1}: {rps['cache'][-1]:.2f} req/s with the cache, "
                          f"{rps['no cache'][-1]:.2f} without; hit rate {hit_rates[-1]:.1%}; "
                          f"load average {os.getloadavg()[0]:.2f}", flush=True)
            ratios = [a / b for a, b in zip(rps["cache"], rps["no cache"], strict=True)]
            print(f"  multiple choice: {statistics.median(rps['cache']):.2f} req/s with the cache, "
                  f"{statistics.median(rps['no cache']):.2f} without: {statistics.median(ratios):.2f}x "
                  f"(range {min(ratios):.2f}-{max(ratios):.2f}); hit rate {statistics.median(hit_rates):.1%}")

            times: dict[str, list[float]] = {n: [] for n in servers}
            tokens = 0
            for t in range(args.turns + 1):
                for name in servers:
                    first, tokens = asyncio.run(ttft(servers[name][0], system, t))
                    if t:  # the first turn fills the cache
                        times[name].append(first)
            hit, miss = statistics.median(times["cache"]), statistics.median(times["no cache"])
            print(f"  chat, {tokens}-token prompts ({args.system_tokens}-token system prompt), {args.turns} "
                  f"turns: p50 time to first token {hit * 1e3:.1f} ms on a hit, {miss * 1e3:.1f} ms on a "
                  f"miss ({hit / miss:.2f}x); load average {os.getloadavg()[0]:.2f}")
        finally:
            for _, proc in servers.values():
                proc.terminate()
                proc.wait(30)
        if args.blocks:
            blocks = [int(b) for b in args.blocks.split(",")]
            block_sweep(model_dir, args.backend, requests, blocks, args.slots)
    return 0


if __name__ == "__main__":
    sys.exit(main())
