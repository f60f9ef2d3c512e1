"""Added tokens: found in one pass over the text, whatever their number (#39: a tokenizer.json with 20k
added tokens took 100 s to encode 1 MB, an alternation regex trying every token at every position)."""

from __future__ import annotations

import random
import time

import pytest

import inferno.tokenizer as tokmod
from inferno.tokenizer import Tokenizer


def _byte_vocab() -> dict[str, int]:
    return {c: i for i, c in enumerate(tokmod.bytes_to_unicode().values())}


def _with_added(n: int, *, special: bool = True) -> Tokenizer:
    vocab = _byte_vocab()
    added = {f"<|tok_{k}|>": 256 + k for k in range(n)}
    if special:
        return Tokenizer(vocab, [], added)
    return Tokenizer(vocab, [], {}, added_tokens=added)


def _text(n_chars: int, tokens: list[str]) -> str:
    rng = random.Random(0)
    words = ["hello", "world", "<|tok", "<|", "|>", "the", " ", "tok_1|>", "\n", *tokens]
    parts: list[str] = []
    size = 0
    while size < n_chars:
        parts.append(rng.choice(words))
        size += len(parts[-1])
    return "".join(parts)


def _seconds(fn) -> float:
    best = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def test_twenty_thousand_added_tokens_cost_about_what_one_does() -> None:
    # The time to find the added tokens must not grow with their number: with 20k of them, encoding
    # 100 KB takes a small multiple of the time with 2 (one pass per token took ~50x longer here).
    many, few = _with_added(20_000), _with_added(2)
    text = _text(100_000, ["<|tok_0|>", "<|tok_1|>", "<|tok_19999|>", "<|tok_1999|>"])
    ids = many.encode(text, allow_special=True)
    assert ids.count(256 + 19_999) > 0 and ids.count(256 + 1_999) > 0
    assert many.decode(ids) == text
    t_many = _seconds(lambda: many.encode(text, allow_special=True))
    t_few = _seconds(lambda: few.encode(text, allow_special=True))
    assert t_many < 5 * t_few + 0.5, (t_many, t_few)


def test_the_longest_added_token_wins_among_many() -> None:
    vocab = _byte_vocab()
    special = {"<|a|>": 256, "<|a|>b": 257, "<|a": 258, "<|ab|>": 259}
    tok = Tokenizer(vocab, [], special, added_tokens={"<x>": 260})
    b = vocab["b"]
    assert tok.encode("<|a|>b<|a|><|a<|ab|><|ab", allow_special=True) == [257, 256, 258, 259, 258, b]
    # Special tokens only when allowed; the others (not special) always, as Hugging Face does.
    plain = [vocab[c] for c in "<|a|>"]
    assert tok.encode("<|a|><x>") == [*plain[:1], *tok.encode("|a|>"), 260]
    assert tok.encode("<|a|><x>", allow_special=True) == [256, 260]


@pytest.mark.parametrize("special", [True, False])
def test_added_tokens_next_to_each_other_and_at_the_ends(special: bool) -> None:
    tok = _with_added(300, special=special)
    text = "<|tok_12|><|tok_123|>a<|tok_299|>"
    assert tok.encode(text, allow_special=True) == [268, 379, _byte_vocab()["a"], 555]
    assert tok.decode(tok.encode(text, allow_special=True)) == text


def test_added_tokens_each_a_prefix_of_the_next_still_match_longest_first() -> None:
    # 499 nested added tokens ("<<", "<<<", ...): a trie too deep for the regex parser; a plain
    # alternation then gives the same matches.
    vocab = _byte_vocab()
    tok = Tokenizer(vocab, [], {"<" * k: 254 + k for k in range(2, 501)})
    assert tok.encode("<" * 1000 + "b", allow_special=True) == [754, 754, vocab["b"]]
    assert tok.encode("<" * 501, allow_special=True) == [754, vocab["<"]]
