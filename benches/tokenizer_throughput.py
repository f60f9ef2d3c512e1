"""Encode throughput of inferno's tokenizer beside Hugging Face tokenizers and tiktoken, in MB/s.

    python benches/tokenizer_throughput.py [--size 2000000] [--rounds 5]

All three encode the same ~2 MB of mixed real text (licences, Python docs and sources, Debian
copyright files, vim tutors in 30 languages, ...; see build_corpus in tests/test_tokenizer_oracles.py)
in one process, rounds interleaved, so that a busy machine slows them alike. "cold" is a freshly
loaded Tokenizer (empty piece cache) for each round, "warm" the same one again. tokenizers encodes the
whole string with ``Tokenizer.encode``; tiktoken with ``encode_ordinary``. MB/s is UTF-8 megabytes
(10^6 bytes) per second, from the median round; "best" is the fastest round.
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

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER_JSON = ROOT / "gpt2" / "tokenizer.json"


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


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


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

    times: dict[str, list[float]] = {"inferno cold": [], "inferno warm": [], "tokenizers": [], "tiktoken": []}
    loads: list[float] = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        fresh = Tokenizer.from_file(TOKENIZER_JSON)
        loads.append(time.perf_counter() - start)
        times["inferno cold"].append(_timed(lambda t=fresh: t.encode(text)))
        times["inferno warm"].append(_timed(lambda: warm.encode(text)))
        times["tokenizers"].append(_timed(lambda: hf.encode(text)))
        times["tiktoken"].append(_timed(lambda: tt.encode_ordinary(text)))

    print(f"corpus: {megabytes:.2f} MB of UTF-8, {len(expected)} tokens, {args.rounds} rounds")
    print(f"| {'encoder':<14} | {'MB/s (median)':>13} | {'MB/s (best)':>11} |")
    print(f"|{'-' * 16}|{'-' * 14}:|{'-' * 12}:|")
    for name, ts in times.items():
        print(f"| {name:<14} | {megabytes / statistics.median(ts):>13.2f} | {megabytes / min(ts):>11.2f} |")
    print(
        f"tokenizer.json load: {1e3 * statistics.median(loads):.0f} ms median, {1e3 * min(loads):.0f} ms best"
    )
    cold, hf_median = statistics.median(times["inferno cold"]), statistics.median(times["tokenizers"])
    print(f"inferno cold vs tokenizers: {hf_median / cold:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
