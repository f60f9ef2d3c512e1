"""The tokenizer read from vocab.json + merges.txt (repos without a tokenizer.json) against Hugging Face
tokenizers reading the same two files, and against inferno's own tokenizer.json reader.

The two files are OpenAI's encoder.json and vocab.bpe (the Hub's vocab.json and merges.txt for GPT-2),
rebuilt from gpt2/tokenizer.json and checked byte for byte against the SHA-256 sums tiktoken pins for them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from test_tokenizer_oracles import (
    ADVERSARIAL,
    ENCODER_JSON_SHA256,
    TOKENIZER_JSON,
    VOCAB_BPE_SHA256,
    build_corpus,
)

from inferno.tokenizer import Tokenizer, TokenizerError


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple[Path, Path]:
    data = json.loads(TOKENIZER_JSON.read_text(encoding="utf-8"))
    vocab = dict(data["model"]["vocab"])
    for added in data["added_tokens"]:
        vocab[added["content"]] = added["id"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    folder = tmp_path_factory.mktemp("bpe")
    vocab_json, merges_txt = folder / "vocab.json", folder / "merges.txt"
    vocab_json.write_text(json.dumps(vocab), encoding="utf-8")
    merges_txt.write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    assert hashlib.sha256(vocab_json.read_bytes()).hexdigest() == ENCODER_JSON_SHA256
    assert hashlib.sha256(merges_txt.read_bytes()).hexdigest() == VOCAB_BPE_SHA256
    return vocab_json, merges_txt


@pytest.fixture(scope="module")
def texts() -> list[str]:
    adversarial = ADVERSARIAL.read_bytes().decode("utf-8")
    return [text for _, text in build_corpus(1_000_000)] + adversarial.splitlines(keepends=True)


def test_same_ids_as_hf_tokenizers_reading_the_same_files(files, texts):
    tokenizers = pytest.importorskip("tokenizers")
    hf = tokenizers.Tokenizer(tokenizers.models.BPE.from_file(str(files[0]), str(files[1])))
    hf.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = tokenizers.decoders.ByteLevel()
    ours = Tokenizer.from_vocab_merges(*files)
    assert sum(map(len, texts)) > 500_000
    for text in texts:
        ids = ours.encode(text)
        assert ids == hf.encode(text).ids, text[:80]
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=False)


def test_same_as_tokenizer_json(files, texts):
    ours, reference = Tokenizer.from_vocab_merges(*files), Tokenizer.from_file(TOKENIZER_JSON)
    assert ours.vocab_size == reference.vocab_size == 50257 and ours.eos_id == 50256
    assert ours.special_tokens == reference.special_tokens == {"<|endoftext|>": 50256}
    for text in texts[:200] + ["a<|endoftext|>b"]:
        assert ours.encode(text, allow_special=True) == reference.encode(text, allow_special=True)


@pytest.mark.parametrize("merges, needle", [
    ("#version: 0.2\nĠ t\nh e f\n", "line 3 is not two tokens separated by a space: 'h e f'"),
    # Only the first line may be the header: a later "#version" line is a merge like any other.
    ("Ġ t\n#version: 0.2\n", "('#version: 0.2') uses '#version:', which is not in model.vocab"),
    ("Ġ t\nĠ zz\n", "'Ġzz', which is not in model.vocab"),
    (b"\xff\xfe", "not UTF-8"),
])
def test_bad_merges_name_the_file_and_line(tmp_path, files, merges, needle):
    path = tmp_path / "merges.txt"
    path.write_bytes(merges if isinstance(merges, bytes) else merges.encode())
    with pytest.raises(TokenizerError) as info:
        Tokenizer.from_vocab_merges(files[0], path)
    assert needle in str(info.value) and "merges.txt" in str(info.value), str(info.value)


@pytest.mark.parametrize("content, found", [("[1, 2]", "found list"), ("{}", "found an empty one")])
def test_a_bad_vocab_names_the_file_and_what_it_holds(tmp_path, files, content, found):
    path = tmp_path / "vocab.json"
    path.write_text(content)
    with pytest.raises(TokenizerError) as info:
        Tokenizer.from_vocab_merges(path, files[1])
    assert str(info.value) == f"{path}: expected a JSON object of token to id, {found}"


@pytest.mark.parametrize("which, what", [(0, "a vocab.json"), (1, "a merges.txt")])
def test_a_file_over_the_size_limit_is_refused_naming_the_file_and_what_it_is(tmp_path, files, which,
                                                                             what, monkeypatch):
    import inferno.tokenizer as tok

    paths = list(files)
    if which == 1:  # a merges.txt larger than the vocab.json (blank lines are allowed)
        paths[1] = tmp_path / "merges.txt"
        paths[1].write_bytes(files[1].read_bytes() + b"\n" * files[0].stat().st_size)
    limit = 100 if which == 0 else files[0].stat().st_size
    monkeypatch.setattr(tok.reader, "MAX_TOKENIZER_BYTES", limit)
    with pytest.raises(TokenizerError) as info:
        Tokenizer.from_vocab_merges(*paths)
    message, size = str(info.value), paths[which].stat().st_size
    assert message == f"{paths[which]}: is {size} bytes, more than the {limit}-byte limit for {what}"


def test_crlf_lines_a_bom_and_no_header_read_as_the_plain_file(tmp_path, files, texts):
    # merges.txt saved on Windows (CRLF, a UTF-8 BOM) and without the "#version" line: the same merges.
    lines = files[1].read_text(encoding="utf-8").split("\n")
    assert lines[0].startswith("#version")
    crlf, headless = tmp_path / "crlf.txt", tmp_path / "headless.txt"
    crlf.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode())
    headless.write_text("\n".join(lines[1:]), encoding="utf-8")
    plain = Tokenizer.from_vocab_merges(*files)
    for path in (crlf, headless):
        other = Tokenizer.from_vocab_merges(files[0], path)
        for text in texts[:300]:
            assert other.encode(text) == plain.encode(text), (path.name, text[:80])


def test_a_vocab_without_endoftext_has_no_special_token(tmp_path, files):
    vocab = json.loads(files[0].read_text(encoding="utf-8"))
    del vocab["<|endoftext|>"]
    path = tmp_path / "vocab.json"
    path.write_text(json.dumps(vocab), encoding="utf-8")
    tok = Tokenizer.from_vocab_merges(path, files[1])
    assert tok.special_tokens == {} and tok.vocab_size == 50256
    assert tok.encode("<|endoftext|>", allow_special=True) == Tokenizer.from_vocab_merges(*files).encode(
        "<|endoftext|>")
