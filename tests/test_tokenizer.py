"""Unit tests for inferno.tokenizer: interface, decoding, streaming, errors on bad ids and bad files.

Agreement with Hugging Face tokenizers and tiktoken on real and adversarial text is in
test_tokenizer_oracles.py.
"""

from __future__ import annotations

import codecs
import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import inferno.tokenizer as tokmod
from inferno.tokenizer import IncrementalDecoder, Tokenizer, TokenizerError

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER_JSON = ROOT / "inferno" / "data" / "gpt2" / "tokenizer.json"
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
    with pytest.raises(TypeError) as info:
        tok.encode(b"bytes")  # type: ignore[arg-type]
    assert str(info.value) == "encode() takes a str, not bytes"


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
    text = ADVERSARIAL.read_bytes().decode("utf-8") + MIXED + Path(tokmod.bpe.__file__).read_text()
    expected = Tokenizer.from_file(TOKENIZER_JSON).encode(text)
    monkeypatch.setattr(tokmod.bpe, "_LONG_PIECE", 1)
    assert Tokenizer.from_file(TOKENIZER_JSON).encode(text) == expected


def test_every_token_is_what_bpe_makes_of_it(tok: Tokenizer) -> None:
    """Encoding takes a piece that is a whole token as that token without running BPE (as tiktoken
    does). That is exact only if BPE of each token's own text gives back the token: check."""
    for token, i in tok._vocab.items():
        if len(token) > 1 and i != tok.eos_id:
            assert tok._bpe_heap(token) == [token], token


def test_piece_cache_is_bounded(tok: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    text = ADVERSARIAL.read_bytes().decode("utf-8") + Path(tokmod.bpe.__file__).read_text()
    expected = tok.encode(text)
    monkeypatch.setattr(tokmod.bpe, "_CACHE_SIZE", 10)
    small = Tokenizer.from_file(TOKENIZER_JSON)
    base = len(small._cache)
    for _ in range(2):
        assert small.encode(text) == expected
        assert len(small._cache) <= base + 10
    # Bounded at every moment, not only after a whole text: piece by piece, it never holds an 11th.
    for word in text.split()[:3000]:
        small.encode(word)
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


def _nested_json(depth: int) -> str:
    return '{"model": ' + "[" * depth + "]" * depth + "}"


# Each message is the start of the error after "PATH: " (compared as text, not as a pattern).
@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "not a valid JSON file (Expecting value: line 1 column 1 (char 0))"),
        ("{not json", "not a valid JSON file (Expecting property name enclosed in double quotes"),
        (b"\xff\xfe{}", "not a valid JSON file ("),
        (_nested_json(100_000), "not a usable JSON file (nested too deeply)"),
        ("[1, 2]", "expected a JSON object at the top level, found list"),
        ('"text"', "expected a JSON object at the top level, found str"),
        ('{"version": "1.0"}', "no 'model' object"),
        ('{"model": [1]}', "no 'model' object"),
        (_broken(lambda d: d["model"].update(type="WordPiece")),
         "model.type is 'WordPiece' (a WordPiece tokenizer): inferno reads byte-level BPE tokenizers only"),
        (_broken(lambda d: d["model"].update(type="Unigram")),
         "model.type is 'Unigram' (a SentencePiece Unigram tokenizer): inferno reads byte-level BPE"),
        (_broken(lambda d: d["model"].update(byte_fallback=True)),
         "model.byte_fallback is set (a SentencePiece-style BPE tokenizer): inferno reads byte-level BPE"),
        (_broken(lambda d: d.update(pre_tokenizer={"type": "Metaspace", "replacement": "▁"})),
         "pre_tokenizer is Metaspace (a SentencePiece-style tokenizer): inferno reads byte-level BPE"),
        (_broken(lambda d: d.update(pre_tokenizer=None)),
         "no pre_tokenizer (text is not mapped to bytes): inferno reads byte-level BPE"),
        (_broken(lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": " "}, "behavior": "Isolated", "invert": False}]})),
         "the pre_tokenizer has no ByteLevel step (text is not mapped to bytes): inferno reads byte-level"),
        (_broken(lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": " "}, "behavior": "Removed", "invert": False},
            {"type": "ByteLevel", "use_regex": False}]})),
         "pre_tokenizer.pretokenizers[0]: Split with behavior 'Removed' is not supported (only Isolated)"),
        (_broken(lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "(("}, "behavior": "Isolated"},
            {"type": "ByteLevel", "use_regex": False}]})),
         "pre_tokenizer.pretokenizers[0].pattern does not compile: "),
        (_broken(lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
            {"type": "ByteLevel"}, {"type": "Digits"}]})),
         "pre_tokenizer.pretokenizers[1] (Digits) comes after ByteLevel: not supported"),
        (_broken(lambda d: d.update(decoder={"type": "ByteFallback"})),
         "decoder 'ByteFallback' is not ByteLevel: inferno reads byte-level BPE"),
        (_broken(lambda d: d.update(post_processor={"type": "RobertaProcessing"})),
         "post_processor 'RobertaProcessing' is not supported (only TemplateProcessing, ByteLevel)"),
        (_broken(lambda d: d["model"].update(dropout=0.1)), "model.dropout 0.1 is not supported"),
        (_broken(lambda d: d["model"].update(ignore_merges="yes")),
         "model.ignore_merges is 'yes', not true or false"),
        (_broken(lambda d: d.update(normalizer={"type": "NFC"}) or d["added_tokens"][0].update(
            normalized=True)),
         "added_tokens[0] ('<|endoftext|>') is matched after the normalizer (normalized: true): not"),
        (_broken(lambda d: d["model"].pop("vocab")), "model.vocab is missing or not a non-empty object"),
        (_broken(lambda d: d["model"].update(vocab=[])), "model.vocab is missing or not a non-empty object"),
        (_broken(lambda d: d["model"].update(vocab={})), "model.vocab is missing or not a non-empty object"),
        (_broken(lambda d: d["model"].update(vocab=["a"])),
         "model.vocab is missing or not a non-empty object"),
        (_broken(lambda d: d["model"].pop("merges")), "model.merges is missing or not a list"),
        (_broken(lambda d: d["model"].update(merges="a b")), "model.merges is missing or not a list"),
        (_broken(lambda d: d["model"].update(merges=["ab"])), "model.merges[0] is not two tokens, 'a b' or"),
        (_broken(lambda d: d["model"].update(merges=["a b c"])), "model.merges[0] is not two tokens"),
        (_broken(lambda d: d["model"].update(merges=[["a"]])), "model.merges[0] is not two tokens"),
        (_broken(lambda d: d["model"].update(merges=["a b", 7])), "model.merges[1] is not two tokens"),
        (_broken(lambda d: d["model"].update(merges=["a  b"])), "model.merges[0] is not two tokens"),
        (_broken(lambda d: d["model"].update(merges=[" b"])), "model.merges[0] is not two tokens"),
        (_broken(lambda d: d["model"].update(merges=[["", "b"]])), "model.merges[0] is not two tokens"),
        (_broken(lambda d: d["model"].update(merges=["a b", "b c"])),
         "model.merges[1] ('b c') uses 'bc', which is not in model.vocab"),
        # The merges are checked first: the merge "a b" names the missing token.
        (_broken(lambda d: d["model"]["vocab"].pop("a")),
         "model.merges[0] ('a b') uses 'a', which is not in model.vocab"),
        (_broken(lambda d: d["model"].update(merges=["a b", "zz b"])),
         "model.merges[1] ('zz b') uses 'zz', which is not in model.vocab"),
        (_broken(lambda d: d["model"].update(merges=[["a", "zz"]])),
         "model.merges[0] (['a', 'zz']) uses 'zz', which is not in model.vocab"),
        (_broken(lambda d: d["model"].update(merges=["a "])), "model.merges[0] is not two tokens"),
        (_broken(lambda d: d["model"].update(merges=[["a", ""]])), "model.merges[0] is not two tokens"),
        (_broken(lambda d: d["model"].update(merges=[["a", 3]])), "model.merges[0] is not two tokens"),
        (_broken(lambda d: d["model"]["vocab"].update({"a b": 300, "a bc": 301}) or
                 d["model"].update(merges=["a b", ["a b", "c"]])),
         "model.merges has a token with a space in it"),
        (_broken(lambda d: d["model"]["vocab"].pop("Ġ")),
         "model.vocab lacks the byte-level tokens for bytes [32] "
                                                          "(not byte-level BPE?)"),
        (_broken(lambda d: d["model"]["vocab"].update(ab="x")),
         "token 'ab' has id 'x', not a non-negative integer"),
        (_broken(lambda d: d["model"]["vocab"].update(ab=-3)),
         "token 'ab' has id -3, not a non-negative integer"),
        (_broken(lambda d: d["added_tokens"][0].update(id=-1)),
         "token '<|endoftext|>' has id -1, not a non-negative integer"),
        (_broken(lambda d: d["model"]["vocab"].update(ab=0)), "id 0 is used by two tokens in model.vocab"),
        (_broken(lambda d: d["model"]["vocab"].update({"a b": 300})),
         "model.vocab token 'a b' is not in GPT-2's "
                                                                      "byte-level alphabet"),
        (_broken(lambda d: d["model"]["vocab"].update(ab=10**6)),
         "ids are far too sparse (258 tokens, largest id 1000000)"),
        (_broken(lambda d: d["added_tokens"].append({"id": 258, "content": ""})),
         "special token '' is not a non-empty string"),
        (_broken(lambda d: d["added_tokens"].append({"id": 257, "content": "<|other|>"})),
         "added tokens '<|endoftext|>' and '<|other|>' share id 257"),
        (_broken(lambda d: d["added_tokens"].append({"id": 258, "content": "<|endoftext|>"})),
         "added_tokens[1] ('<|endoftext|>') repeats an added token with another id (257 and 258)"),
        (_broken(lambda d: d["added_tokens"].append({"id": 256, "content": "xy"})),
         "special token 'xy' reuses id 256 of model.vocab token b'ab'"),
        (_broken(lambda d: d["added_tokens"][0].update(id=5)),
         "special token '<|endoftext|>' reuses id 5 of model.vocab token b'&'"),
        (_broken(lambda d: d["model"]["vocab"].update({"ab": 256, "cd": 259})),
         "no token has id 258: the ids of model.vocab and added_tokens must run from 0 to 259 without gaps"),
        (_broken(lambda d: d["model"].update(continuing_subword_prefix="##")),
         "model.continuing_subword_prefix '##' is not supported"),
        (_broken(lambda d: d["model"].update(end_of_word_suffix="</w>")),
         "model.end_of_word_suffix '</w>' is not supported"),
        (_broken(lambda d: d.update(normalizer={"type": "NFKC"})),
         "normalizer 'NFKC' is not supported (only NFC)"),
        (_broken(lambda d: d.update(pre_tokenizer={"type": "Whitespace"})),
         "pre_tokenizer is 'Whitespace': inferno reads byte-level BPE tokenizers only"),
        (_broken(lambda d: d.update(pre_tokenizer="ByteLevel")),
         "pre_tokenizer is 'ByteLevel', not an object"),
        (_broken(lambda d: d.update(added_tokens={"a": 1})), "added_tokens is not a list"),
        (_broken(lambda d: d.update(added_tokens=[{"content": "x"}])),
         "added_tokens[0] needs 'id' and 'content'"),
        (_broken(lambda d: d.update(added_tokens=[5])), "added_tokens[0] needs 'id' and 'content'"),
        (_broken(lambda d: d.update(added_tokens=[{"id": 258, "content": 5}])),
         "added_tokens[0] needs 'id' and 'content'"),
        (_broken(lambda d: d["added_tokens"][0].update(lstrip=True)),
         "added_tokens[0] ('<|endoftext|>') sets lstrip: not supported"),
        (_broken(lambda d: d["added_tokens"][0].update(rstrip=True)),
         "added_tokens[0] ('<|endoftext|>') sets rstrip: not supported"),
        (_broken(lambda d: d["added_tokens"][0].update(single_word=True, lstrip=True)),
         "added_tokens[0] ('<|endoftext|>') sets lstrip, single_word: not supported"),
    ],
)
def test_bad_tokenizer_json(tmp_path: Path, content: str | bytes, message: str) -> None:
    path = _write(tmp_path, content)
    with pytest.raises(TokenizerError) as info:
        Tokenizer.from_file(path)
    assert str(info.value).startswith(f"{path}: {message}"), str(info.value)
    assert isinstance(info.value, ValueError)


def test_an_integer_too_long_for_python_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path, '{"model": {"vocab": {"a": ' + "9" * 5000 + "}}}")
    with pytest.raises(TokenizerError) as info:
        Tokenizer.from_file(path)
    # Python's own reason, up to its first ':' or ';' (the digit count and the advice are dropped).
    reason = "Exceeds the limit (4300 digits) for integer string conversion"
    assert str(info.value) == f"{path}: not a usable JSON file ({reason})"


def test_a_tokenizer_json_that_is_not_a_regular_file_or_too_large(tmp_path: Path, monkeypatch) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(TokenizerError) as info:
        Tokenizer.from_file(fifo)
    assert str(info.value) == f"{fifo}: not a regular file: it is a named pipe (FIFO)"
    path = _write(tmp_path, json.dumps(_minimal()))
    size = path.stat().st_size
    monkeypatch.setattr(tokmod.reader, "MAX_TOKENIZER_BYTES", size - 1)
    with pytest.raises(TokenizerError) as info:
        Tokenizer.from_file(path)
    limit = f"more than the {size - 1}-byte limit for a tokenizer.json"
    assert str(info.value) == f"{path}: is {size} bytes, {limit}"
    monkeypatch.setattr(tokmod.reader, "MAX_TOKENIZER_BYTES", size)
    assert len(Tokenizer.from_file(path)) == 258


def test_from_dict_names_its_source() -> None:
    with pytest.raises(TokenizerError) as info:
        Tokenizer.from_dict([])
    assert str(info.value) == "<tokenizer.json>: expected a JSON object at the top level, found list"
    with pytest.raises(TokenizerError, match="^mine.json: no 'model' object$"):
        Tokenizer.from_dict({}, source="mine.json")
    assert repr(Tokenizer.from_dict(_minimal())) == "Tokenizer('<tokenizer.json>', vocab_size=258)"


def test_merges_in_any_sequence_or_both_forms(tmp_path: Path) -> None:
    # "aab": the merge "a b" gives "a" + "ab"; without it, three bytes.
    vocab = _vocab(ab=256)
    a, b = vocab["a"], vocab["b"]
    for merges in (["a b"], ("a b",), (m for m in ["a b"]), [["a", "b"]], [("a", "b")]):
        assert Tokenizer(vocab, merges).encode("aab") == [a, 256]
    assert Tokenizer(vocab, []).encode("aab") == [a, a, b]
    mixed = _vocab(ab=256, abc=257)
    assert Tokenizer(mixed, ["a b", ["ab", "c"]]).encode("xabc") == [mixed["x"], 257]
    assert Tokenizer(mixed, [["a", "b"], "ab c"]).encode("xabc") == [mixed["x"], 257]


def test_gaps_are_listed_up_to_eight(tmp_path: Path) -> None:
    def message(top: int) -> str:
        with pytest.raises(TokenizerError) as info:
            _tokenizer(tmp_path, lambda d: d["model"]["vocab"].update(ab=top))
        return str(info.value).split(": ", 1)[1].split(":")[0]

    assert message(265) == "no token has id 256, 258, 259, 260, 261, 262, 263, 264"  # eight gaps
    assert message(266) == "no token has id 256, 258, 259, 260, 261, 262, 263, 264, ... (1 more)"  # nine


def test_pieces_up_to_256_characters_are_cached() -> None:
    fresh = Tokenizer.from_file(TOKENIZER_JSON)
    base = len(fresh._cache)
    for n, cached in ((256, 1), (257, 0)):
        word = "qz" * (n // 2) + "q" * (n % 2)
        assert fresh.decode(fresh.encode(word)) == word
        assert len(fresh._cache) == base + cached, n
        base = len(fresh._cache)


class _BadIndex:
    def __index__(self):
        raise TypeError("no index")


def test_decode_rejects_ids_outside_the_vocabulary_naming_the_range(tok: Tokenizer) -> None:
    for bad in (50257, -1, _BadIndex()):
        with pytest.raises(ValueError) as info:
            tok.decode([bad])
        assert str(info.value) == f"token id {bad!r} is not in the vocabulary (0..50256)"
    assert tok.decode([np.int16(15496)]) == "Hello"


def _tokenizer(tmp_path: Path, change) -> Tokenizer:
    return Tokenizer.from_file(_write(tmp_path, _broken(change)))


def test_a_duplicate_merge_keeps_its_first_rank(tmp_path: Path) -> None:
    # "a b" before "b c": "abc" merges to "ab" + "c". Were the repeat's later rank kept, "b c" would win.
    def change(d):
        d["model"]["vocab"]["bc"] = 257
        d["added_tokens"][0]["id"] = 258
        d["model"]["merges"] = ["a b", "b c", "a b"]

    tok = _tokenizer(tmp_path, change)
    assert tok.encode("abc") == [256, tok.encode("c")[0]]
    change_pairs = lambda d: change(d) or d["model"].update(merges=[["a", "b"], ["b", "c"], ["a", "b"]])  # noqa: E731
    assert _tokenizer(tmp_path, change_pairs).encode("abc") == [256, tok.encode("c")[0]]
    # Without the repeat, the order of the merges decides.
    reordered = lambda d: change(d) or d["model"].update(merges=["b c", "a b"])  # noqa: E731
    assert _tokenizer(tmp_path, reordered).encode("abc") == [tok.encode("a")[0], 257]


def test_merges_without_any_leave_every_piece_as_bytes(tmp_path: Path) -> None:
    tok = _tokenizer(tmp_path, lambda d: d["model"].update(merges=[]))
    assert tok.encode("abab") == [tok.encode("a")[0], tok.encode("b")[0]] * 2
    # A token that no merge builds is not what BPE makes of "ab" (Hugging Face agrees: [64, 65]), unless
    # the file says to take a piece that is a whole token whole (Llama 3's ignore_merges).
    assert tok.encode("ab") == [64, 65]
    whole = _tokenizer(tmp_path, lambda d: d["model"].update(merges=[], ignore_merges=True))
    assert whole.encode("ab") == [256] and whole.encode("abab") == [64, 65, 64, 65]


def test_the_longest_special_token_wins(tmp_path: Path) -> None:
    def change(d):
        d["added_tokens"] += [{"id": 258, "content": "<|x|>"}, {"id": 259, "content": "<|x|>y"}]

    tok = _tokenizer(tmp_path, change)
    assert tok.encode("<|x|>y<|x|>z", allow_special=True) == [259, 258, tok.encode("z")[0]]
    assert tok.special_tokens == {"<|endoftext|>": 257, "<|x|>": 258, "<|x|>y": 259}


def test_eos_only_in_the_vocabulary(tmp_path: Path) -> None:
    def change(d):
        d["added_tokens"] = []
        d["model"]["vocab"]["<|endoftext|>"] = 257

    tok = _tokenizer(tmp_path, change)
    assert tok.eos_id == 257 and tok.special_tokens == {} and len(tok) == 258
    assert tok.decode([257]) == "<|endoftext|>"
    # Not an added token: matched by the pre-tokenizer like any text, so not as one piece.
    assert tok.encode("<|endoftext|>", allow_special=True) == tok.encode("<|endoftext|>") != [257]


def test_no_eos_anywhere(tmp_path: Path) -> None:
    tok = _tokenizer(tmp_path, lambda d: d.update(added_tokens=[]))
    assert tok.eos_id is None and len(tok) == 257
    assert tok.encode("<|endoftext|>", allow_special=True) == tok.encode("<|endoftext|>")


def test_an_added_token_may_repeat_a_vocabulary_token_with_its_id(tmp_path: Path) -> None:
    def change(d):
        d["added_tokens"].append({"id": 256, "content": "ab"})

    tok = _tokenizer(tmp_path, change)
    assert tok.encode("xab", allow_special=True) == [tok.encode("x")[0], 256]
    assert tok.special_tokens["ab"] == 256


def test_the_same_added_token_twice_with_its_id(tmp_path: Path) -> None:
    tok = _tokenizer(tmp_path, lambda d: d["added_tokens"].append(dict(d["added_tokens"][0])))
    assert tok.special_tokens == {"<|endoftext|>": 257}


def test_ids_may_be_somewhat_sparse_only_if_they_have_no_gaps(tmp_path: Path) -> None:
    # The bound: ids up to 10 per token + 1024 (258 tokens: ids below 3604); past it, too sparse.
    with pytest.raises(TokenizerError, match=r"ids are far too sparse \(258 tokens, largest id 3604\)"):
        _tokenizer(tmp_path, lambda d: d["model"]["vocab"].update(ab=3604))
    # Below it, the gaps are named: 256 and 258-3602, the first eight shown.
    with pytest.raises(TokenizerError, match=r"no token has id 256, 258, 259, 260, 261, 262, 263, 264, "
                                             r"\.\.\. \(3338 more\): .* from 0 to 3603 without gaps"):
        _tokenizer(tmp_path, lambda d: d["model"]["vocab"].update(ab=3603))
    with pytest.raises(TokenizerError, match=r"no token has id 256: the ids"):
        _tokenizer(tmp_path, lambda d: d["model"]["vocab"].update(ab=258))


def _vocab(**extra) -> dict:
    vocab = {c: i for i, c in enumerate(tokmod.bytes_to_unicode().values())}
    return {**vocab, **extra}


@pytest.mark.parametrize(
    ("bad_id", "shown"),
    [
        (-(10**18), "<an integer of about 19 digits>"),
        (-(10**18) + 1, "-999999999999999999"),
        (-(10**40), "<an integer of about 41 digits>"),
        (-(10**5000), "<an integer of about 5001 digits>"),  # repr() of it would raise
        ("x" * 58, "'" + "x" * 58 + "'"),  # a repr of 60 characters is shown whole
        ("x" * 59, "'" + "x" * 56 + "..."),  # of 61, cut to 57 and "..."
        (2.5, "2.5"),
    ],
    ids=["-10**18", "-10**18+1", "-10**40", "-10**5000", "repr-60", "repr-61", "float"],
)
def test_a_bad_id_is_shown_short(bad_id, shown) -> None:
    with pytest.raises(TokenizerError) as info:
        Tokenizer(_vocab(ab=bad_id), ["a b"])
    assert str(info.value) == f"<tokenizer>: token 'ab' has id {shown}, not a non-negative integer"


def test_an_id_that_cannot_be_shown() -> None:
    nested: list = []
    for _ in range(100_000):
        nested = [nested]
    with pytest.raises(TokenizerError) as info:
        Tokenizer(_vocab(ab=nested), ["a b"])
    assert str(info.value) == "<tokenizer>: token 'ab' has id <a list>, not a non-negative integer"


def test_a_tokenizer_built_in_code_is_named_tokenizer() -> None:
    tok = Tokenizer(_vocab(ab=256), ["a b"])
    assert repr(tok) == "Tokenizer('<tokenizer>', vocab_size=257)" and tok.encode("ab") == [256]
    with pytest.raises(TokenizerError, match="^<tokenizer>: "):
        Tokenizer({"a": 0}, [])
    with pytest.raises(TokenizerError, match="^mine: "):
        Tokenizer({"a": 0}, [], source="mine")


def test_missing_byte_tokens_are_listed_up_to_eight() -> None:
    chars = tokmod.bytes_to_unicode()
    vocab = {c: i for i, c in enumerate(c for b, c in chars.items() if b >= 10)}
    with pytest.raises(TokenizerError) as info:
        Tokenizer(vocab, [])
    assert str(info.value) == ("<tokenizer>: model.vocab lacks the byte-level tokens for bytes "
                               "[0, 1, 2, 3, 4, 5, 6, 7] (not byte-level BPE?)")


def test_exact_messages_for_added_tokens_and_foreign_characters(tmp_path: Path) -> None:
    def message(change) -> str:
        with pytest.raises(TokenizerError) as info:
            _tokenizer(tmp_path, change)
        return str(info.value).split("tokenizer.json: ", 1)[1]

    assert message(lambda d: d["added_tokens"].append({"id": 300, "content": "ab"})) == \
        "added token 'ab' has id 300, but model.vocab gives it id 256"
    assert message(lambda d: d["model"]["vocab"].update({"a b": 257}) or d["added_tokens"].clear()) == \
        "model.vocab token 'a b' is not in GPT-2's byte-level alphabet"


def test_a_fresh_tokenizer_splits_letters_newer_than_unicode_16_as_unicode_16_does() -> None:
    # The piece cache of a new Tokenizer counts the pieces with such letters from zero: the text takes the
    # pinned pattern, as Hugging Face tokenizers (the reference here) split it.
    from reference import hf_encode

    for text in ("a\u0558b", "\u0558!", "x\u0c5c1 and more", " \u0558 a\ua7ceb"):
        assert Tokenizer.from_file(TOKENIZER_JSON).encode(text) == hf_encode(text), repr(text)


def test_a_token_holding_a_newer_letter_is_not_taken_whole(tmp_path: Path) -> None:
    # The vocabulary holds "\u0558" and "\u0558!" (merged from it and "!"). Unicode 16 has no letter
    # U+0558, so "\u0558!" is one piece ("other" characters) and one token; were the cached whole token
    # "\u0558" found first (the letter run of newer regex tables), it would be two.
    chars = tokmod.bytes_to_unicode()
    letter = "".join(chars[b] for b in "\u0558".encode())

    def change(d):
        d["model"]["vocab"].update({letter: 257, letter + "!": 258})
        d["model"]["merges"] += [f"{letter[0]} {letter[1]}", f"{letter} !"]
        d["added_tokens"][0]["id"] = 259

    tok = _tokenizer(tmp_path, change)
    assert tok.encode("\u0558!") == [258]
    assert tok.encode("\u0558") == [257] and tok.decode([258]) == "\u0558!"


def test_repr_names_the_source(tmp_path: Path) -> None:
    path = _write(tmp_path, json.dumps(_minimal()))
    assert repr(Tokenizer.from_file(path)) == f"Tokenizer({str(path)!r}, vocab_size=258)"


def test_missing_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        Tokenizer.from_file(tmp_path / "nope.json")


def test_a_file_without_a_pre_tokenizer_key_is_read_as_gpt2s(tmp_path: Path) -> None:
    # Hand-written files leave it out; a null pre_tokenizer (no pre-tokenization at all) is refused.
    data = _minimal()
    del data["pre_tokenizer"]
    text = "ab cab's  12\n"
    assert Tokenizer.from_dict(data).encode(text) == Tokenizer.from_dict(_minimal()).encode(text)
