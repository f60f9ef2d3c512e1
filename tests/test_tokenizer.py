"""Unit tests for inferno.tokenizer: interface, decoding, streaming, errors on bad ids and bad files.

Agreement with Hugging Face tokenizers and tiktoken on real and adversarial text is in
test_tokenizer_oracles.py.
"""

from __future__ import annotations

import codecs
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import inferno.tokenizer as tokmod
from inferno.tokenizer import IncrementalDecoder, Tokenizer, TokenizerError

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER_JSON = ROOT / "gpt2" / "tokenizer.json"
ADVERSARIAL = Path(__file__).resolve().parent / "data" / "tokenizer" / "adversarial.txt"

MIXED = (
    "Hello, world! Привет, мир! 你好，世界！ こんにちは 안녕하세요 مرحبا שלום नमस्ते "
    "😀 👨\u200d👩\u200d👧\u200d👦 🇺🇸 e\u0301 café naïve ½ ² 𝔘𝔫𝔦 \u00a0\u3000\r\n\tthey'LL don’t 12345"
)


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_file(TOKENIZER_JSON)


@pytest.fixture(scope="module")
def raw_json() -> dict:
    return json.loads(TOKENIZER_JSON.read_text(encoding="utf-8"))


def openai_bytes_to_unicode() -> dict[int, str]:
    """bytes_to_unicode as written in OpenAI's gpt-2 encoder.py, to check ours against."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(2**8):
        if b not in bs:
            bs.append(b)
            cs.append(2**8 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


@pytest.fixture(scope="module")
def id_bytes(raw_json: dict) -> dict[int, bytes]:
    """Each id's bytes, worked out here from tokenizer.json without inferno's tables."""
    inverse = {c: b for b, c in openai_bytes_to_unicode().items()}
    table = {i: bytes(inverse[c] for c in t) for t, i in raw_json["model"]["vocab"].items()}
    for added in raw_json["added_tokens"]:
        table[added["id"]] = added["content"].encode()
    return table


# ------------------------------------------------------------------------------------------ interface
def test_known_ids(tok: Tokenizer) -> None:
    assert tok.encode("Hello, world!") == [15496, 11, 995, 0]
    assert tok.decode([15496, 11, 995, 0]) == "Hello, world!"


def test_sizes_and_eos(tok: Tokenizer) -> None:
    assert len(tok) == tok.vocab_size == 50257
    assert tok.eos_id == 50256
    assert tok.special_tokens == {"<|endoftext|>": 50256}
    assert tok.decode([tok.eos_id]) == "<|endoftext|>"


def test_bytes_to_unicode_is_gpt2s() -> None:
    assert tokmod.bytes_to_unicode() == openai_bytes_to_unicode()


def test_special_tokens_only_when_allowed(tok: Tokenizer) -> None:
    text = "a<|endoftext|>b"
    plain = tok.encode(text)
    assert 50256 not in plain
    assert tok.decode(plain) == text
    special = tok.encode(text, allow_special=True)
    assert special == tok.encode("a") + [50256] + tok.encode("b")
    assert tok.encode("<|endoftext|><|endoftext|>", allow_special=True) == [50256, 50256]
    assert tok.decode(special) == text


def test_empty_and_type_errors(tok: Tokenizer) -> None:
    assert tok.encode("") == []
    assert tok.encode("", allow_special=True) == []
    assert tok.decode([]) == ""
    with pytest.raises(TypeError):
        tok.encode(b"bytes")  # type: ignore[arg-type]


def test_round_trip_adversarial(tok: Tokenizer) -> None:
    text = ADVERSARIAL.read_bytes().decode("utf-8")
    for part in [text, *text.split("\n")]:
        assert tok.decode(tok.encode(part)) == part
        assert tok.decode(tok.encode(part, allow_special=True)) == part


def test_lone_surrogates_become_replacement_chars(tok: Tokenizer) -> None:
    # Not encodable as UTF-8; like tiktoken, encode them as U+FFFD instead of failing.
    assert tok.encode("a\ud800b") == tok.encode("a\ufffdb")
    assert tok.encode("\ud83d\ude00") == tok.encode("😀")


def test_encode_accepts_numpy_ids_in_decode(tok: Tokenizer) -> None:
    assert tok.decode(np.array([15496, 11], dtype=np.int64)) == "Hello,"
    assert tok.decode([np.int32(995)]) == " world"


def test_pair_form_merges_give_same_ids(tok: Tokenizer, raw_json: dict, tmp_path: Path) -> None:
    data = json.loads(json.dumps(raw_json))
    data["model"]["merges"] = [m.split(" ") for m in data["model"]["merges"]]
    path = tmp_path / "pairs.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    pairs = Tokenizer.from_file(path)
    text = ADVERSARIAL.read_bytes().decode("utf-8")
    assert pairs.encode(text) == tok.encode(text)
    assert pairs.encode(MIXED, allow_special=True) == tok.encode(MIXED, allow_special=True)


def test_heap_merge_agrees_with_simple_merge(tok: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Force every piece through the heap-based merge (normally only for long pieces)."""
    text = ADVERSARIAL.read_bytes().decode("utf-8") + MIXED + Path(tokmod.__file__).read_text()
    expected = Tokenizer.from_file(TOKENIZER_JSON).encode(text)
    monkeypatch.setattr(tokmod, "_LONG_PIECE", 1)
    assert Tokenizer.from_file(TOKENIZER_JSON).encode(text) == expected


def test_every_token_is_what_bpe_makes_of_it(tok: Tokenizer) -> None:
    """Encoding takes a piece that is a whole token as that token without running BPE (as tiktoken
    does). That is exact only if BPE of each token's own text gives back the token: check."""
    for token, i in tok._vocab.items():
        if len(token) > 1 and i != tok.eos_id:
            assert tok._bpe_heap(token) == [token], token


def test_piece_cache_is_bounded(tok: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    text = ADVERSARIAL.read_bytes().decode("utf-8") + Path(tokmod.__file__).read_text()
    expected = tok.encode(text)
    monkeypatch.setattr(tokmod, "_CACHE_SIZE", 10)
    small = Tokenizer.from_file(TOKENIZER_JSON)
    base = len(small._cache)
    for _ in range(2):
        assert small.encode(text) == expected
        assert len(small._cache) <= base + 10


def test_long_pieces_are_not_cached(tok: Tokenizer) -> None:
    fresh = Tokenizer.from_file(TOKENIZER_JSON)
    base = len(fresh._cache)
    word = "qzx" * 1000
    assert fresh.decode(fresh.encode(word)) == word
    assert len(fresh._cache) == base


# ------------------------------------------------------------------------------------------- decoding
def test_decode_invalid_utf8_like_bytes_decode(tok: Tokenizer, id_bytes: dict[int, bytes]) -> None:
    emoji = tok.encode("😀")
    assert emoji == [47249, 222]
    for ids in ([emoji[0]], [emoji[1]], [emoji[0], 0, emoji[1]], [emoji[1], emoji[0]], [emoji[0]] * 3):
        expected = b"".join(id_bytes[i] for i in ids).decode("utf-8", "replace")
        assert tok.decode(ids) == expected
        assert "\ufffd" in expected


@pytest.mark.parametrize("bad", [-1, 50257, 10**12, 1.0, "3", None, True])
def test_decode_rejects_ids_outside_vocabulary(tok: Tokenizer, bad: object) -> None:
    with pytest.raises(ValueError, match=repr(bad).replace("(", r"\(")):
        tok.decode([15496, bad])  # type: ignore[list-item]


@pytest.mark.parametrize("bad", [-1, 50257, 2.5, "x"])
def test_feed_rejects_ids_outside_vocabulary(tok: Tokenizer, bad: object) -> None:
    decoder = tok.incremental_decoder()
    with pytest.raises(ValueError, match=repr(bad)):
        decoder.feed(bad)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ streaming
def test_streaming_holds_back_partial_characters(tok: Tokenizer) -> None:
    decoder = tok.incremental_decoder()
    assert isinstance(decoder, IncrementalDecoder)
    assert decoder.feed(47249) == ""
    assert decoder.feed(222) == "😀"
    assert decoder.flush() == ""


def test_streaming_mixed_script(tok: Tokenizer) -> None:
    ids = tok.encode(MIXED)
    decoder = tok.incremental_decoder()
    pieces = [decoder.feed(i) for i in ids]
    tail = decoder.flush()
    assert "".join(pieces) + tail == tok.decode(ids) == MIXED
    assert tail == ""
    # MIXED has no U+FFFD: any would be a partial character let out too early.
    assert not any("\ufffd" in p for p in pieces)
    # Some tokens are partial characters, so some feeds emit nothing.
    assert "" in pieces


def test_streaming_flush_replaces_incomplete_character(tok: Tokenizer) -> None:
    decoder = tok.incremental_decoder()
    assert decoder.feed(15496) == "Hello"
    assert decoder.feed(47249) == ""
    assert decoder.flush() == "\ufffd"
    # The decoder starts over after a flush.
    assert decoder.feed(47249) + decoder.feed(222) + decoder.flush() == "😀"


def test_streaming_invalid_bytes_in_the_middle(tok: Tokenizer, id_bytes: dict[int, bytes]) -> None:
    ids = [47249, 0, 222, 15496, 47249, 47249, 222]
    decoder = tok.incremental_decoder()
    streamed = "".join(decoder.feed(i) for i in ids) + decoder.flush()
    assert streamed == tok.decode(ids) == b"".join(id_bytes[i] for i in ids).decode("utf-8", "replace")


# Ids that are single bytes or pieces of multi-byte characters are the interesting ones.
_some_ids = st.one_of(
    st.integers(0, 255),
    st.sampled_from([47249, 222, 171, 119, 5008, 224, 33232, 18433, 9202]),
    st.integers(0, 50256),
)


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(_some_ids, max_size=40))
def test_streaming_equals_decode_for_any_ids(
    tok: Tokenizer, id_bytes: dict[int, bytes], ids: list[int]
) -> None:
    decoder = tok.incremental_decoder()
    streamed = "".join(decoder.feed(i) for i in ids) + decoder.flush()
    assert streamed == tok.decode(ids) == b"".join(id_bytes[i] for i in ids).decode("utf-8", "replace")
    # The stdlib's incremental decoder is what defines "the same as decoding all at once".
    reference = codecs.getincrementaldecoder("utf-8")(errors="replace")
    assert streamed == "".join(reference.decode(id_bytes[i]) for i in ids) + reference.decode(b"", True)


# ------------------------------------------------------------------------------------ bad tokenizer.json
def _write(tmp_path: Path, content: str | bytes) -> Path:
    path = tmp_path / "tokenizer.json"
    if isinstance(content, str):
        content = content.encode("utf-8")
    path.write_bytes(content)
    return path


def _minimal() -> dict:
    """A tiny but valid byte-level BPE tokenizer.json: the 256 bytes plus one merge."""
    vocab = {c: i for i, c in enumerate(tokmod.bytes_to_unicode().values())}
    vocab["ab"] = 256
    return {
        "added_tokens": [{"id": 257, "content": "<|endoftext|>", "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True},
        "model": {"type": "BPE", "vocab": vocab, "merges": ["a b"]},
    }


def test_minimal_tokenizer_json_loads(tmp_path: Path) -> None:
    tok = Tokenizer.from_file(_write(tmp_path, json.dumps(_minimal())))
    assert len(tok) == 258
    assert tok.eos_id == 257
    ab = tok.encode("abc")
    assert ab[0] == 256 and len(ab) == 2
    assert tok.decode(ab) == "abc"


def _broken(change) -> str:
    data = _minimal()
    change(data)
    return json.dumps(data)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "not a valid JSON"),
        ("{not json", "not a valid JSON"),
        (b"\xff\xfe{}", "not a valid JSON"),
        ("[1, 2]", "JSON object at the top level"),
        ('{"version": "1.0"}', "no 'model'"),
        (_broken(lambda d: d["model"].update(type="WordPiece")), "model.type is 'WordPiece'"),
        (_broken(lambda d: d["model"].pop("vocab")), "model.vocab is missing"),
        (_broken(lambda d: d["model"].update(vocab=[])), "model.vocab is missing"),
        (_broken(lambda d: d["model"].pop("merges")), "model.merges is missing"),
        (_broken(lambda d: d["model"].update(merges=["ab"])), r"model.merges\[0\] is not two tokens"),
        (_broken(lambda d: d["model"].update(merges=["a b c"])), r"model.merges\[0\] is not two tokens"),
        (_broken(lambda d: d["model"].update(merges=[["a"]])), r"model.merges\[0\] is not two tokens"),
        (_broken(lambda d: d["model"].update(merges=["a b", 7])), r"model.merges\[1\] is not two tokens"),
        (
            _broken(lambda d: d["model"].update(merges=["a b", "b c"])),
            r"model.merges\[1\].*'bc'.*not in model.vocab",
        ),
        (_broken(lambda d: d["model"]["vocab"].pop("a")), "lacks the byte-level tokens|'a', which is not in"),
        (_broken(lambda d: d["model"]["vocab"].pop("Ġ")), r"lacks the byte-level tokens for bytes \[32\]"),
        (_broken(lambda d: d["model"]["vocab"].update(ab="x")), "token 'ab' has id 'x'"),
        (_broken(lambda d: d["model"]["vocab"].update(ab=-3)), "token 'ab' has id -3"),
        (_broken(lambda d: d["model"]["vocab"].update(ab=0)), "id 0 is used by two tokens"),
        (_broken(lambda d: d["model"]["vocab"].update({"a b": 300})), "not in GPT-2's byte-level alphabet"),
        (_broken(lambda d: d["model"].update(continuing_subword_prefix="##")), "continuing_subword_prefix"),
        (_broken(lambda d: d.update(normalizer={"type": "NFC"})), "normalizer"),
        (
            _broken(lambda d: d.update(pre_tokenizer={"type": "Whitespace"})),
            "pre_tokenizer must be ByteLevel",
        ),
        (_broken(lambda d: d["pre_tokenizer"].update(add_prefix_space=True)), "add_prefix_space"),
        (_broken(lambda d: d.update(added_tokens={"a": 1})), "added_tokens is not a list"),
        (_broken(lambda d: d.update(added_tokens=[{"content": "x"}])), r"added_tokens\[0\] needs 'id'"),
        (_broken(lambda d: d["added_tokens"][0].update(id=5)), "reuses id 5"),
        (_broken(lambda d: d["added_tokens"][0].update(lstrip=True)), "sets lstrip: not supported"),
    ],
)
def test_bad_tokenizer_json(tmp_path: Path, content: str | bytes, message: str) -> None:
    path = _write(tmp_path, content)
    with pytest.raises(TokenizerError, match=message) as info:
        Tokenizer.from_file(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_missing_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        Tokenizer.from_file(tmp_path / "nope.json")
