"""inferno's tokenizer against Hugging Face ``tokenizers`` (the oracle), id for id, for each byte-level
family.

- the real Llama 3 and Qwen3 tokenizers (tests/data/tokenizers/, see its README) and GPT-2's, on a seeded
  corpus of 3,000 varied strings (tests/tokenizer_corpus.py): with special tokens recognised, and without
  (``encode_special_tokens`` on Hugging Face's side);
- small tokenizers trained here with Hugging Face's trainer, one for each way of splitting text the code
  has: GPT-2's regex after Digits (SmolLM2's), Qwen's Split regex with NFC (Qwen2.5's), Llama 3's Split
  with ignore_merges and a BOS post-processor, ByteLevel's add_prefix_space, a Split that leaves gaps;
- the files beside tokenizer.json: BOS from add_bos_token, the EOS ids from generation_config.json.

The sweep over every code point in context is marked slow.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from tokenizer_corpus import SPECIAL_LOOKALIKES, corpus

from inferno.tokenizer import Tokenizer, TokenizerError

tokenizers = pytest.importorskip("tokenizers")

DATA = Path(__file__).resolve().parent / "data" / "tokenizers"
GPT2_JSON = Path(__file__).resolve().parent.parent / "inferno" / "data" / "gpt2" / "tokenizer.json"
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN_REGEX = LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")
# The synthetic tokenizers: one for each way of splitting text that inferno's tokenizer has.
SYNTHETIC = ["smollm2", "digit-runs", "qwen2.5", "llama3", "prefix-space", "gaps"]


def _unpack(name: str, folder: Path) -> Path:
    """tests/data/tokenizers/NAME as a model folder: tokenizer.json unzipped, tokenizer_config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(DATA / name / "tokenizer.json.gz") as src:
        (folder / "tokenizer.json").write_bytes(src.read())
    shutil.copy(DATA / name / "tokenizer_config.json", folder / "tokenizer_config.json")
    return folder


_LOADED: dict[str, tuple[Tokenizer, Any]] = {}


def _load(name: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Tokenizer, Any]:
    """inferno's and Hugging Face's tokenizer of a family, loaded once per session (a few seconds each)."""
    if name not in _LOADED:
        if name == "gpt2":
            _LOADED[name] = Tokenizer.from_file(GPT2_JSON), tokenizers.Tokenizer.from_file(str(GPT2_JSON))
        else:
            folder = _unpack(name, tmp_path_factory.mktemp(name))
            hf = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
            _LOADED[name] = Tokenizer.from_dir(folder), hf
    return _LOADED[name]


@pytest.fixture(scope="module", params=["gpt2", "llama3", "qwen3"])
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Tokenizer, Any]:
    return _load(request.param, tmp_path_factory)


def _mismatches(ours: Tokenizer, hf: Any, texts: list[str], *, allow_special: bool) -> list[tuple]:
    hf.encode_special_tokens = not allow_special
    try:
        theirs = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    finally:
        hf.encode_special_tokens = False
    wrong = []
    for text, want in zip(texts, theirs, strict=True):
        got = ours.encode(text, allow_special=allow_special)
        if got != want:
            wrong.append((text, got, want))
    return wrong


def _check(ours: Tokenizer, hf: Any, texts: list[str]) -> None:
    for allow_special in (True, False):
        wrong = _mismatches(ours, hf, texts, allow_special=allow_special)
        assert not wrong, \
            f"{len(wrong)} of {len(texts)} differ (allow_special={allow_special}), e.g. {wrong[:3]}"


# --------------------------------------------------------------------------------- the real families
def test_the_corpus_is_varied_and_seeded() -> None:
    texts = corpus(3000)
    assert len(set(texts)) == 3000 and texts == corpus(3000)
    joined = "".join(texts)
    for needle in ("<|im_start|>", "<|begin_of_text|>", "😀", "你好", "  \n", "e\u0301", "'LL", "12345",
                   "def "):
        assert needle in joined


def test_a_real_family_encodes_as_hugging_face_does(family: tuple[Tokenizer, Any]) -> None:
    ours, hf = family
    _check(ours, hf, corpus(3000))


def test_a_real_family_decodes_as_hugging_face_does(family: tuple[Tokenizer, Any]) -> None:
    ours, hf = family
    for text in corpus(300, seed=1):
        ids = hf.encode(text, add_special_tokens=False).ids
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=False), repr(text)


def test_llama3_and_qwen3_special_tokens_and_ends(tmp_path_factory: pytest.TempPathFactory) -> None:
    llama = _load("llama3", tmp_path_factory)[0]
    assert llama.bos_token == "<|begin_of_text|>" and llama.bos_id == 128000
    assert llama.eos_ids == (128001,) and llama.eos_id == 128001  # tokenizer_config's eos_token
    assert llama.encode("<|begin_of_text|>hi", allow_special=True)[0] == 128000
    assert llama.encode("<|begin_of_text|>")[0] != 128000
    assert len(llama) == 128256
    qwen = _load("qwen3", tmp_path_factory)[0]
    assert qwen.bos_token is None and qwen.bos_id is None and qwen.prefix_ids == ()
    assert qwen.eos_ids == (151645,)
    # <think> is an added token that is not special: recognised in any text, as Hugging Face does.
    assert qwen.encode("<think>") == [151667] and qwen.special_tokens["<|im_start|>"] == 151644
    assert "<think>" not in qwen.special_tokens


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama3", "qwen3"])
def test_every_code_point_in_context(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    ours, hf = _load(name, tmp_path_factory)
    points = [chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    # Each character between letters, digits and spaces, in lines of 64: every class the regexes know.
    texts = ["".join(f"a{c}1 {c}{c}b'{c}\n" for c in points[i:i + 64]) for i in range(0, len(points), 64)]
    # Once, with encode's default: no added token can be in these texts, so allow_special would only
    # choose which splitter looks for them and finds none; the corpus below, which holds them, is
    # checked both ways.
    wrong = _mismatches(ours, hf, texts, allow_special=False)
    assert not wrong, f"{len(wrong)} of {len(texts)} differ, e.g. {wrong[:3]}"
    _check(ours, hf, corpus(30000, seed=7))


@pytest.mark.slow
def test_every_qwen3_token_a_merge_builds_is_what_bpe_makes_of_it(tmp_path_factory: pytest.TempPathFactory
                                                                 ) -> None:
    """Qwen3 does not set ignore_merges, yet a piece that is a whole token is taken whole (the piece cache
    starts with the vocabulary) when a merge builds it: exact only if BPE gives the token back."""
    ours = _load("qwen3", tmp_path_factory)[0]
    wrong = [t for t in ours._vocab if len(t) > 1 and t in ours._reachable and ours._bpe_heap(t) != [t]]
    assert not wrong, wrong[:10]


@pytest.mark.slow
@pytest.mark.parametrize("kind", SYNTHETIC)
def test_a_synthetic_tokenizer_on_a_bigger_corpus(kind: str) -> None:
    hf = _synthetic(kind)
    _check(Tokenizer.from_dict(json.loads(hf.to_str()), source=kind), hf, corpus(10000, seed=11))


# ----------------------------------------------------------------------------- synthetic tokenizers
def _train(pre_tokenizer: Any, *, normalizer: Any = None, ignore_merges: bool = False,
           post_processor: Any = None, added: list[str] = ()) -> Any:
    """A small BPE tokenizer trained by Hugging Face on a seeded corpus, with the given pre-tokenizer."""
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.train_from_iterator(corpus(600, seed=42), trainer)
    if added:
        tok.add_tokens(list(added))
    if post_processor is not None:
        tok.post_processor = post_processor
    return tok


def _synthetic(kind: str) -> Any:
    from tokenizers import Regex, normalizers, pre_tokenizers, processors

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if kind == "smollm2":  # GPT-2's regex after single digits
        return _train(pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False)]))
    if kind == "digit-runs":
        return _train(pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=False),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False)]))
    if kind == "qwen2.5":  # Qwen's regex, NFC, added tokens that are not special
        split = pre_tokenizers.Split(Regex(QWEN_REGEX), "isolated")
        return _train(pre_tokenizers.Sequence([split, byte_level]), normalizer=normalizers.NFC(),
                      added=["<tool_call>", "</tool_call>", "<think>"])
    if kind == "llama3":  # Llama 3's regex, ignore_merges, a BOS from the post-processor
        bos = processors.TemplateProcessing(single="<|im_start|> $A", special_tokens=[("<|im_start|>", 1)])
        split = pre_tokenizers.Split(Regex(LLAMA3_REGEX), "isolated")
        return _train(pre_tokenizers.Sequence([split, byte_level]), ignore_merges=True,
                      post_processor=processors.Sequence([processors.ByteLevel(), bos]))
    if kind == "prefix-space":  # ByteLevel alone, a space in front of each piece of text
        return _train(pre_tokenizers.ByteLevel(add_prefix_space=True))
    if kind == "gaps":  # a Split whose matches do not cover the text: the rest are pieces too
        split = pre_tokenizers.Split(Regex(r"\p{L}+|\d"), "isolated")
        return _train(pre_tokenizers.Sequence([split, byte_level]))
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", SYNTHETIC)
def test_a_synthetic_tokenizer_encodes_as_hugging_face_does(kind: str) -> None:
    hf = _synthetic(kind)
    ours = Tokenizer.from_dict(json.loads(hf.to_str()), source=kind)
    texts = corpus(1000, seed=3)
    _check(ours, hf, texts)
    # With the post-processor's ids (a BOS) where add_special asks for them, as add_special_tokens does.
    for text in texts[:300]:
        assert ours.encode(text, allow_special=True, add_special=True) == hf.encode(text).ids, repr(text)
    if kind == "llama3":
        assert ours.prefix_ids == (1,) and ours.encode("hi", add_special=True)[0] == 1


def test_a_bos_from_tokenizer_config_replaces_the_post_processor(tmp_path: Path) -> None:
    # As transformers does: add_bos_token/add_eos_token in tokenizer_config.json, when set, decide.
    hf = _synthetic("llama3")
    (tmp_path / "tokenizer.json").write_text(hf.to_str())

    def config(**conf: Any) -> Tokenizer:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(conf))
        return Tokenizer.from_dir(tmp_path)

    assert config().prefix_ids == (1,)  # the post-processor's
    assert config(bos_token="<|im_start|>", add_bos_token=False).prefix_ids == ()
    both = config(bos_token="<|endoftext|>", eos_token="<|im_end|>", add_bos_token=True, add_eos_token=True)
    assert (both.prefix_ids, both.suffix_ids) == ((0,), (2,))
    assert both.encode("hi", add_special=True) == [0, *both.encode("hi"), 2]
    with pytest.raises(TokenizerError, match="add_bos_token is 'yes', not true or false"):
        config(add_bos_token="yes")


def test_eos_ids_from_generation_config_then_config_then_eos_token(tmp_path: Path) -> None:
    hf = _synthetic("qwen2.5")
    (tmp_path / "tokenizer.json").write_text(hf.to_str())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    assert Tokenizer.from_dir(tmp_path).eos_ids == (2,)
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 0}))
    assert Tokenizer.from_dir(tmp_path).eos_ids == (0,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0, 2]}))
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.eos_ids == (2, 0) and tok.eos_id == 2
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, "x"]}))
    with pytest.raises(TokenizerError, match=r"generation_config.json: eos_token_id is \[2, 'x'\], not a"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 10**6}))
    with pytest.raises(TokenizerError, match=r"eos id 1000000 is not a token id \(0\.\.70"):
        Tokenizer.from_dir(tmp_path)


def test_chat_template_comes_with_the_tokenizer(tmp_path: Path) -> None:
    hf = _synthetic("qwen2.5")
    (tmp_path / "tokenizer.json").write_text(hf.to_str())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    assert Tokenizer.from_dir(tmp_path).chat_template == "{{ messages }}"
    (tmp_path / "chat_template.jinja").write_text("{{ bos_token }}")  # newer repos: a file of its own
    assert Tokenizer.from_dir(tmp_path).chat_template == "{{ bos_token }}"


@pytest.mark.parametrize("kind", ["WordPiece", "Unigram"])
def test_other_kinds_of_tokenizer_are_refused_in_one_line(kind: str, tmp_path: Path) -> None:
    from tokenizers import models, pre_tokenizers

    if kind == "WordPiece":
        hf = tokenizers.Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
        hf.pre_tokenizer = pre_tokenizers.Whitespace()
    else:
        hf = tokenizers.Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0)], 0))
        hf.pre_tokenizer = pre_tokenizers.Metaspace()
    path = tmp_path / "tokenizer.json"
    path.write_text(hf.to_str())
    with pytest.raises(TokenizerError) as info:
        Tokenizer.from_file(path)
    message = str(info.value)
    assert "\n" not in message and message.endswith("Llama 3, Qwen2/3 and SmolLM2 use)")
    assert f"model.type is '{kind}'" in message and "byte-level BPE" in message


def test_special_token_lookalikes_stay_text_unless_allowed(family: tuple[Tokenizer, Any]) -> None:
    ours, _ = family
    for text in SPECIAL_LOOKALIKES:
        assert ours.decode(ours.encode(text)) == text
        plain = ours.encode(text)
        assert not set(plain) & set(ours.special_tokens.values()), text
