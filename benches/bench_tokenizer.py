"""Tokenizer benchmarks (pytest-benchmark): encode throughput and tokenizer.json load time.

    python -m pytest benches/bench_tokenizer.py --benchmark-only --benchmark-columns=min,median,rounds

inferno cold (a fresh Tokenizer, so an empty piece cache, each round) and warm, beside Hugging Face
tokenizers (``Tokenizer.encode`` on the whole string) and tiktoken (``encode_ordinary``), all on the
same ~2 MB of mixed real text in one run; ``extra_info`` has the MB/s of each. For a plain table,
``python benches/tokenizer_throughput.py``.
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path
from typing import Any

import pytest

from inferno.tokenizer import Tokenizer


def _load_throughput_script() -> Any:
    # By path, so that this works whether or not benches/ is a package or on sys.path.
    path = Path(__file__).with_name("tokenizer_throughput.py")
    spec = importlib.util.spec_from_file_location("_tokenizer_throughput", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_script = _load_throughput_script()
TOKENIZER_JSON, corpus_text, oracle_helpers = (
    _script.TOKENIZER_JSON,
    _script.corpus_text,
    _script.oracle_helpers,
)
CORPUS_BYTES = 2_000_000


@pytest.fixture(scope="module")
def text() -> str:
    return corpus_text(CORPUS_BYTES)


@pytest.fixture(scope="module")
def expected(text: str) -> list[int]:
    return Tokenizer.from_file(TOKENIZER_JSON).encode(text)


def _record(benchmark: Any, text: str) -> None:
    megabytes = len(text.encode("utf-8")) / 1e6
    benchmark.extra_info["MB"] = round(megabytes, 3)
    if benchmark.stats is not None:  # None under --benchmark-disable (a smoke run: nothing timed)
        benchmark.extra_info["MB/s (median)"] = round(megabytes / benchmark.stats.stats.median, 2)


@pytest.mark.benchmark(group="tokenizer-encode")
def test_encode_inferno_cold(benchmark: Any, text: str, expected: list[int]) -> None:
    def fresh() -> tuple[tuple[Tokenizer], dict]:
        return (Tokenizer.from_file(TOKENIZER_JSON),), {}

    ids = benchmark.pedantic(lambda tok: tok.encode(text), setup=fresh, rounds=5)
    assert ids == expected
    _record(benchmark, text)


@pytest.mark.benchmark(group="tokenizer-encode")
def test_encode_inferno_warm(benchmark: Any, text: str, expected: list[int]) -> None:
    tok = Tokenizer.from_file(TOKENIZER_JSON)
    tok.encode(text)
    ids = benchmark.pedantic(tok.encode, args=(text,), rounds=5)
    assert ids == expected
    _record(benchmark, text)


@pytest.mark.benchmark(group="tokenizer-encode")
def test_encode_hf_tokenizers(benchmark: Any, text: str, expected: list[int]) -> None:
    hf = oracle_helpers().load_hf()
    encoding = benchmark.pedantic(hf.encode, args=(text,), rounds=3)
    assert encoding.ids == expected
    _record(benchmark, text)


@pytest.mark.benchmark(group="tokenizer-encode")
def test_encode_tiktoken(benchmark: Any, text: str, expected: list[int]) -> None:
    tt = oracle_helpers().load_tiktoken()
    ids = benchmark.pedantic(tt.encode_ordinary, args=(text,), rounds=5)
    assert ids == expected
    _record(benchmark, text)


@pytest.mark.benchmark(group="tokenizer-load")
def test_load_tokenizer_json(benchmark: Any) -> None:
    tok = benchmark.pedantic(Tokenizer.from_file, args=(TOKENIZER_JSON,), rounds=10)
    assert len(tok) == 50257


@pytest.mark.benchmark(group="tokenizer-load")
def test_load_hf_tokenizers(benchmark: Any) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    tok = benchmark.pedantic(tokenizers.Tokenizer.from_file, args=(str(TOKENIZER_JSON),), rounds=10)
    assert tok.get_vocab_size() == 50257


@pytest.fixture(scope="module")
def long_word() -> str:
    """100,000 letters without a space: one piece, so one long BPE problem (the heap-based merge)."""
    return "".join(random.Random(0).choices("abcdefghijklmnopqrstuvwxyz", k=100_000))


@pytest.mark.benchmark(group="tokenizer-100k-word")
def test_long_word_inferno(benchmark: Any, long_word: str) -> None:
    tok = Tokenizer.from_file(TOKENIZER_JSON)
    ids = benchmark.pedantic(tok.encode, args=(long_word,), rounds=3)
    assert tok.decode(ids) == long_word


@pytest.mark.benchmark(group="tokenizer-100k-word")
def test_long_word_tiktoken(benchmark: Any, long_word: str) -> None:
    tt = oracle_helpers().load_tiktoken()
    ids = benchmark.pedantic(tt.encode_ordinary, args=(long_word,), rounds=3)
    assert ids == Tokenizer.from_file(TOKENIZER_JSON).encode(long_word)
