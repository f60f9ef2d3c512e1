"""Serving benchmark: time to first token, inter-token latency and aggregate output tokens/s of
``inferno serve`` under 1, 4, 16 and 32 concurrent streaming clients.

    python benches/serving.py                                  # random 124M-shape weights, numpy backend
    python benches/serving.py --backend cpu-threaded --levels 1,4,16
    python benches/serving.py --model-dir gpt2                 # real weights
    python benches/serving.py --url http://127.0.0.1:8000      # a server already running (any OpenAI one)
    python benches/serving.py --backend numpy --backend half --levels 16 --repeat 3   # side by side
    python benches/serving.py --backend half --backend "half --prefill-chunk 256" --levels 16  # serve flags

Each client sends `--rounds` streaming requests one after another: a prompt of `--prompt-tokens` random
token ids (a different one per client, round and run, the warm-up's too, and drawn from a new `--seed`
each invocation unless given, so that no prompt is found in the server's automatic prefix cache: a
repeat does the work of the first) and `--new-tokens` new tokens (ignore_eos, so every
request generates them all). The server (started here unless --url) has as many slots as the largest
level. TTFT is measured from sending the request to the first token's chunk; ITL between consecutive
token chunks of one request; output tok/s is all new tokens of a level over its wall time. Prints a
markdown table and the command that made it (--json: the numbers as JSON).

With several `--backend`s, one server per backend is started (idle ones cost no CPU) and each level
runs on each server in turn, `--repeat` times, so that a noisy neighbour slows all alike: the tables
hold the medians over repeats, and a last table each backend's output tok/s over the first's (the
median of the per-repeat ratios, and their range).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from inferno.bench import counts

ROOT = Path(__file__).resolve().parents[1]


def random_model_dir(directory: Path, seed: int = 0) -> Path:
    """config.json and tokenizer.json of ./gpt2, and random weights of the 124M shape (~500 MB)."""
    from safetensors.numpy import save_file

    from inferno.bench import GPT2_124M, random_weights

    directory.mkdir(parents=True, exist_ok=True)
    config = json.loads((ROOT / "inferno" / "data" / "gpt2" / "config.json").read_text())
    shape = (config["n_embd"], config["n_layer"], config["n_positions"])
    assert shape == (GPT2_124M.n_embd, GPT2_124M.n_layer, GPT2_124M.n_positions), shape
    (directory / "config.json").write_text(json.dumps(config))
    shutil.copy(ROOT / "inferno" / "data" / "gpt2" / "tokenizer.json", directory / "tokenizer.json")
    save_file(random_weights(GPT2_124M, seed), str(directory / "model.safetensors"))
    return directory


def start_server(model_dir: Path, backend: str, slots: int, port: int, log: Path,
                 name: str = "gpt2") -> subprocess.Popen:
    """`backend`: a backend spec, optionally followed by more `inferno serve` flags ("half --prefill-chunk
    256"), so that two settings of one backend can be measured side by side."""
    spec, *flags = backend.split()
    command = [sys.executable, "-m", "inferno", "serve", "--model-dir", str(model_dir), "--backend", spec,
               "--port", str(port), "--slots", str(slots), "--queue", "4096", "--served-model-name", name,
               *flags]  # the name the requests give (another is a 404)
    with open(log, "wb") as f:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        return subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT, env=env)


def wait_ready(url: str, proc: subprocess.Popen | None, timeout: float = 600.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url}/health did not answer 200 within {timeout:.0f} s")


async def one_request(client, body: dict) -> tuple[float, list[float], int]:
    """(TTFT, inter-token gaps, new tokens) of one streaming request."""
    start = time.perf_counter()
    first, last, gaps, tokens = None, None, [], 0
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if not chunk["choices"]:
                continue
            now = time.perf_counter()
            if first is None:
                first = now - start
            else:
                gaps.append(now - last)
            last = now
    return (first if first is not None else float("nan")), gaps, tokens


async def run_level(url: str, clients: int, rounds: int, args: argparse.Namespace, run: int) -> dict:
    """One level: `clients` streaming clients, `rounds` requests each. `run` numbers the calls of one
    benchmark, which draw their prompts from their own seeds."""
    import httpx

    from inferno.bench import prompt_ids

    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=3600, limits=limits) as client:
        async def worker(k: int) -> list[tuple[float, list[float], int]]:
            out = []
            for r in range(rounds):
                prompt = prompt_ids(args.prompt_tokens, 50257, seed=[args.seed, run, k, r])
                body = {"model": args.model, "prompt": prompt,
                        "max_tokens": args.new_tokens, "temperature": args.temperature, "seed": k,
                        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
                out.append(await one_request(client, body))
            return out

        start = time.perf_counter()
        results = [x for per_client in await asyncio.gather(*(worker(k) for k in range(clients)))
                   for x in per_client]
        seconds = time.perf_counter() - start
    ttft = [r[0] for r in results]
    itl = [g for r in results for g in r[1]]
    tokens = sum(r[2] for r in results)
    return {"clients": clients, "requests": len(results), "seconds": seconds, "new_tokens": tokens,
            "ttft_median_ms": 1e3 * float(np.median(ttft)),
            "ttft_p99_ms": 1e3 * float(np.percentile(ttft, 99)),
            "itl_median_ms": 1e3 * float(np.median(itl)) if itl else float("nan"),
            "itl_p99_ms": 1e3 * float(np.percentile(itl, 99)) if itl else float("nan"),
            "output_tok_s": tokens / seconds}


def table(rows: list[dict]) -> str:
    out = ["| clients | requests | TTFT median (ms) | TTFT p99 (ms) | ITL median (ms) | ITL p99 (ms) "
           "| output tok/s |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        out.append(f"| {r['clients']} | {r['requests']} | {r['ttft_median_ms']:.0f} | "
                   f"{r['ttft_p99_ms']:.0f} | {r['itl_median_ms']:.1f} | {r['itl_p99_ms']:.1f} | "
                   f"{r['output_tok_s']:.1f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--levels", type=counts, default=[1, 4, 16, 32], help="concurrent clients (1,4,16,32)")
    p.add_argument("--rounds", type=int, default=1, help="requests per client per level (1)")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--backend", action="append", help="the server's --backend (numpy); repeat it to "
                   "compare backends side by side")
    p.add_argument("--repeat", type=int, default=1, help="rounds over the levels and backends (1)")
    p.add_argument("--model-dir", help="real model files (default: random 124M-shape weights)")
    p.add_argument("--url", help="benchmark this running server instead of starting one")
    p.add_argument("--model", default="gpt2", help="the model field of the requests (gpt2)")
    p.add_argument("--port", type=int, default=8471, help="the first server's port (8471; the next +1, ...)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the prompts (default: a new one each invocation, so that a server given "
                        "by --url has none of them in its prefix cache)")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = p.parse_args(argv)
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "little")
    elif args.seed < 0:
        p.error("--seed must be >= 0")
    backends = args.backend or ["numpy"]
    if args.url and len(backends) > 1:
        p.error("--url benchmarks one running server: give no --backend with it")
    if args.repeat < 1:
        p.error("--repeat must be >= 1")

    procs, tmp = [], None
    urls = ([args.url.rstrip("/")] if args.url else
            [f"http://127.0.0.1:{args.port + i}" for i in range(len(backends))])
    runs: dict[str, list[list[dict]]] = {b: [[] for _ in args.levels] for b in backends}
    try:
        if args.url is None:
            tmp = Path(tempfile.mkdtemp(prefix="inferno-serving-"))
            model_dir = Path(args.model_dir) if args.model_dir else random_model_dir(tmp / "model")
            for i, backend in enumerate(backends):
                log = tmp / f"server-{i}.log"
                procs.append(start_server(model_dir, backend, max(args.levels), args.port + i, log,
                                          args.model))
                print(f"[{backend} server log: {log}]", file=sys.stderr)
        for i, url in enumerate(urls):
            wait_ready(url, procs[i] if procs else None)
            warm_up = argparse.Namespace(**{**vars(args), "new_tokens": 4})
            asyncio.run(run_level(url, 1, 1, warm_up, run=0))
        for r in range(args.repeat):
            for j, clients in enumerate(args.levels):
                for backend, url in zip(backends, urls, strict=True):
                    # Each backend's server gets the same prompts; no later run repeats them.
                    row = asyncio.run(run_level(url, clients, args.rounds, args,
                                                run=1 + r * len(args.levels) + j))
                    runs[backend][j].append(row)
                    print(f"[repeat {r + 1}, {backend}, {clients} clients: {row['output_tok_s']:.1f} tok/s]",
                          file=sys.stderr)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        if tmp is not None and args.model_dir is None:
            shutil.rmtree(tmp / "model", ignore_errors=True)
    medians = {b: [_median_row(level) for level in runs[b]] for b in backends}
    if args.json:
        print(json.dumps(medians[backends[0]] if len(backends) == 1 else
                         {"medians": medians, "runs": runs}, indent=2))
        return 0
    # This process's BLAS: a server started here inherits its environment.
    from inferno.cpu import blas_line

    for backend in backends:
        source = args.url or (args.model_dir or "random 124M-shape weights") + f", {backend} backend"
        print(f"Serving: {args.prompt_tokens}-token prompts, {args.new_tokens} new tokens, temperature "
              f"{args.temperature:g}, {args.rounds} request(s) per client, medians of {args.repeat} "
              f"({source}; prompts of --seed {args.seed}; {blas_line()})\n")
        print(table(medians[backend]) + "\n")
    if len(backends) > 1:
        print("| clients | " + " | ".join(f"{b} / {backends[0]}" for b in backends[1:]) + " |")
        print("| ---: |" + " ---: |" * (len(backends) - 1))
        for j, clients in enumerate(args.levels):
            cells = []
            for b in backends[1:]:
                ratios = [x["output_tok_s"] / y["output_tok_s"]
                          for x, y in zip(runs[b][j], runs[backends[0]][j], strict=True)]
                cells.append(f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
            print(f"| {clients} | " + " | ".join(cells) + " |")
    flags = " ".join(sys.argv[1:] if argv is None else argv)
    print(f"\n`python benches/serving.py{' ' + flags if flags else ''}`")
    return 0


def _median_row(rows: list[dict]) -> dict:
    """Each number of a level's row, the median over repeats."""
    out = {}
    for key, first in rows[0].items():
        if isinstance(first, int | float):
            median = statistics.median(r[key] for r in rows)
            out[key] = round(median) if isinstance(first, int) else median
        else:
            out[key] = first
    return out

if __name__ == "__main__":
    sys.exit(main())
