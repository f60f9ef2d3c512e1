"""inferno's tokenizer against two independent implementations of GPT-2's tokenizer.

- Hugging Face ``tokenizers`` reading the same gpt2/tokenizer.json (it recognises ``<|endoftext|>``,
  so it is compared with ``allow_special=True``);
- tiktoken, built offline from vocab.bpe/encoder.json that are derived here from tokenizer.json and
  checked against the sha256 sums tiktoken pins for OpenAI's files (compared with
  ``allow_special=False`` through ``encode_ordinary``).

Text: a few megabytes of real text found on the machine, tests/data/tokenizer/adversarial.txt,
every code point in context, and hypothesis-generated mixtures of scripts and whitespace.

The helpers here (``build_corpus``, ``load_tiktoken``, ``load_hf``) are also used by
benches/bench_tokenizer.py.
"""

from __future__ import annotations

import json
import os
import random
import sysconfig
import tempfile
from collections.abc import Callable
from itertools import accumulate
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferno.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER_JSON = ROOT / "inferno" / "data" / "gpt2" / "tokenizer.json"
ADVERSARIAL = Path(__file__).resolve().parent / "data" / "tokenizer" / "adversarial.txt"

# The sha256 sums tiktoken pins for OpenAI's GPT-2 vocab.bpe and encoder.json.
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"


# -------------------------------------------------------------------------------------------- helpers
def load_hf() -> Any:
    tokenizers = pytest.importorskip("tokenizers")
    return tokenizers.Tokenizer.from_file(str(TOKENIZER_JSON))


def load_tiktoken() -> Any:
    """GPT-2's tiktoken encoding without the network: OpenAI's two files are rebuilt from
    tokenizer.json (byte-identical, which the pinned hashes check) and loaded from a temp folder."""
    tiktoken = pytest.importorskip("tiktoken")
    tiktoken_load = pytest.importorskip("tiktoken.load")
    data = json.loads(TOKENIZER_JSON.read_text(encoding="utf-8"))
    vocab = dict(data["model"]["vocab"])
    for added in data["added_tokens"]:
        vocab[added["content"]] = added["id"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    saved = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = ""  # no cache: read the local files, write nothing
    try:
        with tempfile.TemporaryDirectory() as tmp:
            encoder_json = Path(tmp, "encoder.json")
            vocab_bpe = Path(tmp, "vocab.bpe")
            encoder_json.write_text(json.dumps(vocab), encoding="utf-8")
            vocab_bpe.write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
            ranks = tiktoken_load.data_gym_to_mergeable_bpe_ranks(
                str(vocab_bpe),
                str(encoder_json),
                vocab_bpe_hash=VOCAB_BPE_SHA256,
                encoder_json_hash=ENCODER_JSON_SHA256,
            )
    finally:
        if saved is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = saved
    # tiktoken's own GPT-2 pattern: written differently (possessive quantifiers) but the same split.
    pat_str = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
    return tiktoken.Encoding(
        name="gpt2-offline",
        pat_str=pat_str,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": 50256},
        explicit_n_vocab=50257,
    )


def _read_text(path: Path, limit: int) -> str | None:
    """A file's text if it is a smallish UTF-8 text file, else None."""
    try:
        if not path.is_file() or path.stat().st_size > limit:
            return None
        data = path.read_bytes()
        return None if b"\0" in data else data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def build_corpus(total: int = 3_000_000) -> list[tuple[str, str]]:
    """(path, text) for a deterministic selection of real text on this machine, about ``total`` bytes:
    licences, Python's documentation and sources, Debian copyright files, and text in many languages
    (vim's tutors, translated desktop metadata, the stdlib's CJK samples), whichever of them exist.
    Each group has a share of ``total``, and files in it a cap, so that none crowds out the others."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    share = Path("/usr/share")

    def glob(base: Path, pattern: str) -> list[Path]:
        return sorted(base.glob(pattern))

    groups: list[tuple[float, int, list[Path]]] = [  # (share of total, bytes per file, files)
        (0.05, 40_000, [stdlib / "LICENSE.txt", *glob(share, "common-licenses/*")]),
        (0.20, 600_000, [stdlib / "pydoc_data" / "topics.py"]),
        (
            0.20,
            12_000,
            [
                *glob(share, "vim/vim*/tutor/tutor.*utf-8"),
                *glob(share, "gnupg/help.*.txt"),
                *glob(stdlib, "test/cjkencodings/*utf8*"),
                *glob(share, "mime/packages/*.xml"),
                *glob(share, "polkit-1/actions/*.policy"),
                *glob(share, "X11/locale/*/Compose"),
            ],
        ),
        (0.15, 10_000, glob(share, "doc/*/copyright")),
        (0.40, 60_000, glob(stdlib, "*.py") + glob(stdlib, "*/*.py")),
    ]
    corpus: list[tuple[str, str]] = []
    seen: set[Path] = set()
    for fraction, per_file, paths in groups:
        budget = int(fraction * total)
        for path in paths:
            real = path.resolve()
            if real in seen or budget <= 0:
                continue
            seen.add(real)
            text = _read_text(path, limit=5_000_000)
            if text:
                limit = min(per_file, budget)  # in characters: close enough to bytes for a budget
                if len(text) > limit:
                    text = text[:limit]
                    text = text[: text.rfind("\n") + 1] or text  # end on a line boundary if there is one
                corpus.append((str(path), text))
                budget -= len(text.encode("utf-8"))
    return corpus


def mismatch(ours: list[int], theirs: list[int], decode: Callable[[list[int]], str]) -> str:
    """Where two id lists first differ, readably."""
    same = (k for k, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b)
    i = next(same, min(len(ours), len(theirs)))
    context = decode(theirs[max(0, i - 8) : i])
    a, b = ours[i : i + 6], theirs[i : i + 6]
    return (
        f"first difference at id #{i} after {context!r}: ours {a} = {decode(a)!r}, theirs {b} = {decode(b)!r}"
    )


# ------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_file(TOKENIZER_JSON)


@pytest.fixture(scope="module")
def hf() -> Any:
    return load_hf()


@pytest.fixture(scope="module")
def tt() -> Any:
    return load_tiktoken()


@pytest.fixture(scope="module")
def corpus() -> list[tuple[str, str]]:
    docs = build_corpus()
    size = sum(len(text.encode("utf-8")) for _, text in docs)
    assert size > 1_000_000, f"only {size} bytes of text found for the corpus"
    return docs


@pytest.fixture(scope="module")
def adversarial() -> list[str]:
    """The whole file, each line, and each line without its line break (start/end of text cases)."""
    text = ADVERSARIAL.read_bytes().decode("utf-8")
    return [text, *text.splitlines(keepends=True), *text.splitlines()]


def check(tok: Tokenizer, hf: Any | None, tt: Any | None, text: str, where: str = "") -> None:
    ours_special = tok.encode(text, allow_special=True)
    ours_plain = tok.encode(text)
    if hf is not None:
        theirs = hf.encode(text).ids
        assert ours_special == theirs, f"{where}: vs tokenizers, {mismatch(ours_special, theirs, tok.decode)}"
    if tt is not None:
        theirs = tt.encode_ordinary(text)
        assert ours_plain == theirs, f"{where}: vs tiktoken, {mismatch(ours_plain, theirs, tok.decode)}"
        theirs = tt.encode(text, allowed_special="all")
        assert ours_special == theirs, (
            f"{where}: vs tiktoken (special), {mismatch(ours_special, theirs, tok.decode)}"
        )
    assert tok.decode(ours_plain) == text, where
    assert tok.decode(ours_special) == text, where


# ------------------------------------------------------------------------------------------------ tests
def test_oracles_agree_on_known_ids(hf: Any, tt: Any, tok: Tokenizer) -> None:
    assert hf.encode("Hello, world!").ids == tt.encode_ordinary("Hello, world!") == [15496, 11, 995, 0]
    assert tok.encode("😀") == tt.encode_ordinary("😀") == hf.encode("😀").ids
    assert tt.n_vocab == len(tok) == hf.get_vocab_size(with_added_tokens=True)
    assert tt.eot_token == tok.eos_id == hf.token_to_id("<|endoftext|>")


def test_real_text_vs_tiktoken(tok: Tokenizer, tt: Any, corpus: list[tuple[str, str]]) -> None:
    for path, text in corpus:
        ours = tok.encode(text)
        theirs = tt.encode_ordinary(text)
        assert ours == theirs, f"{path}: {mismatch(ours, theirs, tok.decode)}"
        assert tok.decode(ours) == text, path


def test_real_text_vs_tokenizers(tok: Tokenizer, hf: Any, corpus: list[tuple[str, str]]) -> None:
    texts = [text for _, text in corpus]
    # encode_batch uses all cores: the slowest oracle, so let it.
    for (path, text), encoding in zip(corpus, hf.encode_batch(texts), strict=True):
        ours = tok.encode(text, allow_special=True)
        assert ours == encoding.ids, f"{path}: {mismatch(ours, encoding.ids, tok.decode)}"


def test_real_text_decodes_like_tokenizers(tok: Tokenizer, hf: Any, corpus: list[tuple[str, str]]) -> None:
    for path, text in corpus[:: max(1, len(corpus) // 50)]:
        ids = tok.encode(text)
        assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=False) == text, path


def test_adversarial_text(tok: Tokenizer, hf: Any, tt: Any, adversarial: list[str]) -> None:
    for n, text in enumerate(adversarial):
        check(tok, hf, tt, text, where=f"adversarial part {n} {text[:40]!r}")


def test_adversarial_text_has_the_cases_it_should(adversarial: list[str]) -> None:
    text = adversarial[0]
    for needle in ["\r\n", "\t", "    ", "\u00a0", "\u3000", "\u0301", "\u200d", "they'LL", "\u2019",
                   "\U0001f600", "\u4e2d", "1234567890", "<|endoftext|>", "\x85"]:  # fmt: skip
        assert needle in text, needle


def _code_points(astral_step: int) -> list[str]:
    """Planes 0 and 1 whole (but surrogates and the newline that separates lines), then every
    ``astral_step``-th code point of planes 2-3 and 14, and a thin sample of the (unassigned or
    private-use) rest."""
    points = [c for c in range(0x20000) if not 0xD800 <= c < 0xE000 and c != 0x0A]
    points += [*range(0x20000, 0x40000, astral_step), *range(0xE0000, 0xE1000, astral_step)]
    points += [*range(0x40000, 0xE0000, 997), *range(0xE1000, 0x110000, 997)]
    return [chr(c) for c in points]


@pytest.mark.parametrize("step", [None, 97])
def test_pre_tokenizer_splits_as_tokenizers_does(tok: Tokenizer, hf: Any, step: int | None) -> None:
    """`_split` (the pieces BPE works on) against HF tokenizers' pre-tokenizer, quick enough for every
    run: plain text, then every 97th line of the slow test below (letters newer than Unicode 16
    among them, which take the pinned pattern)."""
    if step is None:
        chunk = "Hello world's 123 don't  stop\n\n  tabs\there 3.14 ...!!"
    else:
        chunk = "\n".join(f"a{c}'s {c}1 {c}.{c}" for c in _code_points(astral_step=3)[::step])
    from inferno.tokenizer import _has_newer_chars

    assert bool(_has_newer_chars(chunk)) == (step is not None)  # both patterns
    ends = list(accumulate(map(len, tok._split(chunk))))
    assert ends == [end for _, (_, end) in hf.pre_tokenizer.pre_tokenize_str(chunk)]
    assert "".join(tok._split(chunk)) == chunk


@pytest.mark.slow
def test_pre_tokenizer_on_every_code_point(tok: Tokenizer, hf: Any) -> None:
    """How each code point splits: after a letter, before an apostrophe (a contraction only after
    a letter, digit or space), after a digit and a space, before a dot. This is where the engines'
    Unicode tables can differ, and where ids alone would often not show it."""
    lines = [f"a{c}'s {c}1 {c}.{c}" for c in _code_points(astral_step=3)]
    for start in range(0, len(lines), 5000):
        chunk = "\n".join(lines[start : start + 5000])
        ends = list(accumulate(map(len, tok._split(chunk))))
        theirs = [end for _, (_, end) in hf.pre_tokenizer.pre_tokenize_str(chunk)]
        if ends != theirs:
            i = next(k for k, (a, b) in enumerate(zip(ends, theirs, strict=False)) if a != b)
            where = chunk[max(0, ends[i] - 20) : ends[i] + 20]
            pytest.fail(f"pieces differ from tokenizers' at character {min(ends[i], theirs[i])} in {where!r}")


@pytest.mark.slow
def test_every_code_point_in_context(tok: Tokenizer, hf: Any, tt: Any) -> None:
    """Ids for each code point in contexts that make its class visible in the ids (''s' is one token
    only as a contraction), against both oracles."""
    lines = [f"{c}'s {c}1{c}" for c in _code_points(astral_step=13)]
    chunks = ["\n".join(lines[i : i + 2000]) for i in range(0, len(lines), 2000)]
    batches = zip(chunks, hf.encode_batch(chunks), tt.encode_ordinary_batch(chunks), strict=True)
    for chunk, hf_encoding, tt_ids in batches:
        ours = tok.encode(chunk)
        where = f"code points {chunk[0]!r}..{chunk[-6]!r}"
        assert ours == tt_ids, f"{where}: vs tiktoken, {mismatch(ours, tt_ids, tok.decode)}"
        assert ours == hf_encoding.ids, (
            f"{where}: vs tokenizers, {mismatch(ours, hf_encoding.ids, tok.decode)}"
        )
        assert tok.decode(ours) == chunk


_ATOMS = [
    "hello", " world", "Hello", "WORLD", "they", "'LL", "'ll", "'s", "'S", "'re", "'ve", "'m", "'d", "'t",
    "'", "\u2019", "\u2018", "don't", " ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\x0b", "\x0c", "\x85",
    "\u00a0", "\u3000", "\u2009", "\u202f", "\u2028", "\u200b", "\ufeff", "\u0301", "e\u0301", "\u0308",
    "\U0001f600", "\U0001f468\u200d\U0001f469\u200d\U0001f467", "\u200d", "\ufe0f", "\U0001f1fa\U0001f1f8",
    "\U0001f3fd", "\u4e2d\u6587", "\u65e5\u672c\u8a9e", "\ud55c\uad6d\uc5b4",
    "\u041f\u0440\u0438\u0432\u0435\u0442", "\u0645\u0631\u062d\u0628\u0627", "\u05e9\u05dc\u05d5\u05dd",
    "\u0939\u093f\u0928\u094d\u0926\u0940", "123", "4", "0.5", "\u0663", "\u00bd", "\u00b2", "\u2167", ".",
    ",", "!", "...", "--", "(", ")", "_", "x", "X", "\u00e9", "\u00df", "\ufb01", "\U0001d518", "\x00",
    "\ufffd", "<|endoftext|>", "<|", "|>", "endoftext",
]  # fmt: skip

mixed_text = st.lists(
    st.one_of(
        st.sampled_from(_ATOMS),
        st.text(st.characters(exclude_categories=["Cs"]), max_size=4),
        st.text(st.sampled_from(" \t\n\r\u00a0\u3000\u2003\x0b"), min_size=1, max_size=6),
    ),
    max_size=40,
).map("".join)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=mixed_text)
def test_mixed_scripts_and_whitespace(tok: Tokenizer, hf: Any, tt: Any, text: str) -> None:
    check(tok, hf, tt, text, where=repr(text))


# Long pieces take the heap-based merge; a small alphabet makes many equal-rank pairs (ties).
@settings(max_examples=100, deadline=None)
@given(text=st.text(st.sampled_from("aabeilnrst\u00e9\u4e2d"), min_size=33, max_size=2000))
def test_long_pieces(tok: Tokenizer, tt: Any, text: str) -> None:
    assert tok.encode(text) == tt.encode_ordinary(text)


@pytest.mark.parametrize("kind", ["letters", "repeated", "mixed", "digits", "punctuation"])
def test_100k_character_word(tok: Tokenizer, tt: Any, kind: str) -> None:
    rng = random.Random(kind)
    n = 100_000
    word = {
        "letters": lambda: "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=n)),
        "repeated": lambda: "a" * n,
        "mixed": lambda: "".join(rng.choices("abcdeéíüñ中文АБВ", k=n)),
        "digits": lambda: "".join(rng.choices("0123456789", k=n)),
        "punctuation": lambda: "".join(rng.choices("!#$%&()*+,-./:;<=>?@[]^_`{|}~", k=n)),
    }[kind]()
    assert len(tok._findall(word)) == 1  # one piece: a single, very long BPE problem
    ids = Tokenizer.from_file(TOKENIZER_JSON).encode(word)
    assert ids == tt.encode_ordinary(word)
    assert tok.decode(ids) == word


def test_letters_newer_than_unicode_16(tok: Tokenizer, hf: Any, tt: Any, adversarial: list[str]) -> None:
    """Text with letters/digits that Unicode 16 does not have yet is split as Unicode 16 would: the
    oracles' behaviour, whichever Unicode version the regex module has."""
    newer = ["\u0558", "\ua7ce", "\U00010940", "\U00011de0", "\U000323b0", "\U00033000", "\U0003d000"]
    texts = [f"a{c}'s {c}1 {c}.{c} they{c}'ll" for c in newer]
    texts.append(adversarial[0] + "".join(newer) + adversarial[0])
    for text in texts:
        check(tok, hf, tt, text, where=repr(text[:60]))


def test_pinned_pattern_splits_like_pattern_elsewhere(
    tok: Tokenizer, corpus: list[tuple[str, str]], adversarial: list[str]
) -> None:
    text = adversarial[0] + "".join(text for _, text in corpus[::7])[:300_000]
    assert tok._findall_pinned(text) == tok._findall(text)


def test_lone_surrogates_like_tiktoken(tok: Tokenizer, tt: Any) -> None:
    for text in ["a\ud800b", "\udfff", "x \ud83d\ude00 y", "\ud800\ud800'll"]:
        assert tok.encode(text) == tt.encode_ordinary(text), repr(text)


@settings(max_examples=200, deadline=None)
@given(text=mixed_text)
def test_streaming_mixed_text(tok: Tokenizer, text: str) -> None:
    """Fed one id at a time, the decoder gives back the text, and never a U+FFFD that is not in it
    (which would be a partial character let out too early)."""
    decoder = tok.incremental_decoder()
    pieces = [decoder.feed(i) for i in tok.encode(text, allow_special=True)]
    assert "".join(pieces) + decoder.flush() == text
    if "\ufffd" not in text:
        assert not any("\ufffd" in piece for piece in pieces)
