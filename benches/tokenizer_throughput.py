"""Encode throughput of inferno's tokenizer beside Hugging Face tokenizers and tiktoken, in MB/s.

    python benches/tokenizer_throughput.py [--size 2000000] [--rounds 5]

All three encode the same ~2 MB of mixed real text (licences, Python docs and sources, Debian
copyright files, vim tutors in 30 languages, ...; see build_corpus in tests/test_tokenizer_oracles.py)
in one process, rounds interleaved, so that a busy machine slows them alike. "cold" is a freshly
loaded Tokenizer (empty piece cache) for each round, "warm" the same one again. tokenizers encodes the
whole string with ``Tokenizer.encode``; tiktoken with ``encode_ordinary``. MB/s is UTF-8 megabytes
(10^6 bytes) per second, from the median round; "best" is the fastest round. "CPU" divides by the
process's CPU time instead of the wall clock: steadier on a shared machine, and the same as wall time
for these encoders when the machine is idle (each runs on one thread).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER_JSON = ROOT / "inferno" / "data" / "gpt2" / "tokenizer.json"


def oracle_helpers() -> ModuleType:
    """tests/test_tokenizer_oracles.py, for its corpus builder and offline oracles."""
    path = ROOT / "tests" / "test_tokenizer_oracles.py"
    spec = importlib.util.spec_from_file_location("_tokenizer_oracles", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def corpus_text(size: int) -> str:
    return "".join(text for _, text in oracle_helpers().build_corpus(size))


def _timed(fn: Callable[..., Any], *args: Any) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) for one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn(*args)
    return time.perf_counter() - wall, time.process_time() - cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=2_000_000, help="corpus size in bytes (about)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    from inferno.tokenizer import Tokenizer

    helpers = oracle_helpers()
    text = corpus_text(args.size)
    megabytes = len(text.encode("utf-8")) / 1e6
    hf = helpers.load_hf()
    tt = helpers.load_tiktoken()

    warm = Tokenizer.from_file(TOKENIZER_JSON)
    expected = warm.encode(text)
    assert hf.encode(text).ids == expected == tt.encode_ordinary(text), "the three disagree on the corpus"

    times: dict[str, list[tuple[float, float]]] = {
        "inferno cold": [],
        "inferno warm": [],
        "tokenizers": [],
        "tiktoken": [],
    }
    loads: list[tuple[float, float]] = []
    for _ in range(args.rounds):
        loads.append(_timed(Tokenizer.from_file, TOKENIZER_JSON))
        fresh = Tokenizer.from_file(TOKENIZER_JSON)
        times["inferno cold"].append(_timed(fresh.encode, text))
        times["inferno warm"].append(_timed(warm.encode, text))
        times["tokenizers"].append(_timed(hf.encode, text))
        times["tiktoken"].append(_timed(tt.encode_ordinary, text))

    def rate(ts: list[tuple[float, float]], which: int, pick: Callable = statistics.median) -> float:
        return megabytes / pick([t[which] for t in ts])

    print(f"corpus: {megabytes:.2f} MB of UTF-8, {len(expected)} tokens, {args.rounds} rounds")
    print("| encoder        | MB/s (median) | MB/s (best) | MB/s (CPU, median) |")
    print("|----------------|--------------:|------------:|-------------------:|")
    for name, ts in times.items():
        print(f"| {name:<14} | {rate(ts, 0):>13.2f} | {rate(ts, 0, min):>11.2f} | {rate(ts, 1):>18.2f} |")
    wall_ms = [1e3 * t[0] for t in loads]
    cpu_ms = [1e3 * t[1] for t in loads]
    print(
        f"tokenizer.json load: {statistics.median(wall_ms):.0f} ms median, {min(wall_ms):.0f} ms best, "
        f"{statistics.median(cpu_ms):.0f} ms CPU (median)"
    )
    cold = statistics.median(t[0] for t in times["inferno cold"])
    hf_median = statistics.median(t[0] for t in times["tokenizers"])
    print(f"inferno cold vs tokenizers: {hf_median / cold:.1f}x (median wall time)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
