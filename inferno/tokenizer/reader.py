"""Reading a tokenizer's files: ``tokenizer.json`` (its model, normalizer, pre-tokenizer, decoder,
added tokens and post-processor, each checked and refused in one line when inferno cannot follow it),
the older ``vocab.json`` + ``merges.txt``, and the sidecar files of a model folder
(``tokenizer_config.json``, ``generation_config.json``, ``config.json``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import regex

from inferno.files import FileTooLargeError, NotARegularFileError, read_regular_file
from inferno.tokenizer.pretokenizer import _PINNED_PATTERN, PATTERN, PreTokenizer

# GPT-2's tokenizer.json is 1.4 MB, the largest BPE vocabularies' (250k tokens) about 20 MB: a bigger file
# is not a tokenizer, and is not read into memory.
MAX_TOKENIZER_BYTES = 64 << 20


class TokenizerError(ValueError):
    """A tokenizer.json that cannot be used: says which file and what is wrong with it."""


# What a refused tokenizer is told is supported.
SUPPORTED = ("inferno reads byte-level BPE tokenizers only (model.type BPE with a ByteLevel pre-tokenizer, "
             "as GPT-2, Llama 3, Qwen2/3 and SmolLM2 use)")



def _short(value: object) -> str:
    """repr of a JSON value, short, and safe for huge integers (whose repr raises past 4300 digits)."""
    if type(value) is int and abs(value) >= 10**18:
        return f"<an integer of about {int(abs(value).bit_length() * 0.30103) + 1} digits>"
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        return f"<a {type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def _is_pair(obj: object) -> bool:
    return isinstance(obj, (list, tuple)) and len(obj) == 2 and all(isinstance(p, str) for p in obj)


def _read_bytes(path: str | os.PathLike[str], source: str, what: str) -> bytes:
    try:
        # A regular file of bounded size: a FIFO or a link to /dev/zero must not hang or fill memory.
        return read_regular_file(path, MAX_TOKENIZER_BYTES, what)
    except (NotARegularFileError, FileTooLargeError) as exc:
        raise TokenizerError(f"{source}: {exc.strerror}") from None


def _read_json(path: str | os.PathLike[str], source: str, what: str = "a tokenizer.json") -> Any:
    data = _read_bytes(path, source, what)
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"{source}: not a valid JSON file ({exc})") from None
    except RecursionError:
        raise TokenizerError(f"{source}: not a usable JSON file (nested too deeply)") from None
    except ValueError as exc:  # an integer literal longer than sys.get_int_max_str_digits()
        reason = str(exc).split(";")[0].split(":")[0]
        raise TokenizerError(f"{source}: not a usable JSON file ({reason})") from None


def _read_text(path: str | os.PathLike[str], source: str, what: str) -> str:
    data = _read_bytes(path, source, what)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TokenizerError(f"{source}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None

def vocab_merges_args(vocab_path: str | os.PathLike[str], merges_path: str | os.PathLike[str],
                      extra: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of `Tokenizer` that a ``vocab.json`` and a ``merges.txt`` give (with `extra`, what
    other files give): see `Tokenizer.from_vocab_merges`."""
    vocab_source, merges_source = os.fspath(vocab_path), os.fspath(merges_path)
    vocab = _read_json(vocab_path, vocab_source, "a vocab.json")
    if not isinstance(vocab, dict) or not vocab:
        raise TokenizerError(f"{vocab_source}: expected a JSON object of token to id, found "
                             f"{type(vocab).__name__ if vocab else 'an empty one'}")
    merges = []
    for n, line in enumerate(_read_text(merges_path, merges_source, "a merges.txt").split("\n"), 1):
        line = line.removesuffix("\r")
        if (n == 1 and line.startswith("#version")) or not line.strip():
            continue  # the header, and blank lines (the file ends with one)
        if len(line.split(" ")) != 2:
            raise TokenizerError(f"{merges_source}: line {n} is not two tokens separated by a space: "
                                 f"{_short(line)}")
        merges.append(line)
    eos = "<|endoftext|>"
    special = {eos: vocab[eos]} if eos in vocab else {}
    extra = dict(extra)
    extra.update(_template_ids(extra, vocab.get))
    return (vocab, merges, special), {"source": f"{vocab_source} + {os.path.basename(merges_source)}",
                                      **extra}


def tokenizer_json_args(obj: Any, source: str,
                        extra: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of `Tokenizer` that the parsed contents of a ``tokenizer.json`` give (with `extra`,
    what other files give): see `Tokenizer.from_dict`."""
    def fail(what: str) -> TokenizerError:
        return TokenizerError(f"{source}: {what}")

    def refuse(what: str) -> TokenizerError:
        return fail(f"{what}: {SUPPORTED}")

    if not isinstance(obj, dict):
        raise fail(f"expected a JSON object at the top level, found {type(obj).__name__}")
    model = obj.get("model")
    if not isinstance(model, dict):
        raise fail("no 'model' object")
    kind = model.get("type", "BPE")  # GPT-2's own file omits it
    if kind != "BPE":
        names = {"WordPiece": "a WordPiece tokenizer", "Unigram": "a SentencePiece Unigram tokenizer",
                 "WordLevel": "a word-level tokenizer"}
        name = names.get(kind, "not BPE") if isinstance(kind, str) else "not BPE"
        raise refuse(f"model.type is {_short(kind)} ({name})")
    if model.get("byte_fallback"):
        raise refuse("model.byte_fallback is set (a SentencePiece-style BPE tokenizer)")
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise fail("model.vocab is missing or not a non-empty object")
    merges = model.get("merges")
    if not isinstance(merges, list):
        raise fail("model.merges is missing or not a list")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise fail(f"model.{key} {_short(model[key])} is not supported")
    if model.get("dropout"):
        raise fail(f"model.dropout {_short(model['dropout'])} is not supported (random encoding)")
    ignore_merges = model.get("ignore_merges", False)
    if not isinstance(ignore_merges, bool):
        raise fail(f"model.ignore_merges is {_short(ignore_merges)}, not true or false")
    normalizer = _normalizer(obj.get("normalizer"), fail)
    # A file without the key (written by hand) is read as GPT-2's; a null one has no pre-tokenizer.
    pre = obj["pre_tokenizer"] if "pre_tokenizer" in obj else {"type": "ByteLevel"}
    pre_tokenizer = _pre_tokenizer(pre, fail, refuse)
    decoder = obj.get("decoder")
    sequence = isinstance(decoder, dict) and decoder.get("type") == "Sequence"
    decoders = decoder.get("decoders") if sequence else [decoder]
    for d in decoders or []:
        if d is not None and not (isinstance(d, dict) and d.get("type") == "ByteLevel"):
            what = d.get("type") if isinstance(d, dict) else d
            raise refuse(f"decoder {_short(what)} is not ByteLevel")
    added = obj.get("added_tokens") or []
    if not isinstance(added, list):
        raise fail("added_tokens is not a list")
    special: dict[str, int] = {}
    ordinary: dict[str, int] = {}
    normalized: dict[str, int] = {}
    for n, entry in enumerate(added):
        if not isinstance(entry, dict) or not isinstance(entry.get("content"), str) or "id" not in entry:
            raise fail(f"added_tokens[{n}] needs 'id' and 'content'")
        # These change how the token is matched in text; none of the supported families sets them.
        flags = [flag for flag in ("lstrip", "rstrip", "single_word") if entry.get(flag)]
        if flags:
            raise fail(f"added_tokens[{n}] ({entry['content']!r}) sets {', '.join(flags)}: not supported")
        # A file without the flag is an old GPT-2 one, whose one added token is special.
        is_special = entry.get("special", True)
        after_normalizer = normalizer is not None and entry.get("normalized", not is_special)
        if after_normalizer and is_special:
            raise fail(f"added_tokens[{n}] ({entry['content']!r}) is matched after the normalizer "
                       "(normalized: true): not supported")
        content, i = entry["content"], entry["id"]
        seen = special.get(content, ordinary.get(content, normalized.get(content)))
        if seen is not None and seen != i:
            raise fail(f"added_tokens[{n}] ({content!r}) repeats an added token with another id "
                       f"({_short(seen)} and {_short(i)})")
        (special if is_special else normalized if after_normalizer else ordinary)[content] = i
    for content in special:
        ordinary.pop(content, None)
        normalized.pop(content, None)
    added_ids = {**normalized, **ordinary, **special}
    prefix_suffix = _template_ids(extra, lambda t: added_ids.get(t, vocab.get(t)))
    if not prefix_suffix:
        prefix, suffix = _post_processor(obj.get("post_processor"), fail)
        prefix_suffix = {"prefix_ids": prefix, "suffix_ids": suffix}
    extra = {**prefix_suffix, **extra}  # ids given by the caller win
    return (vocab, merges, special), {"source": source, "added_tokens": ordinary,
                                      "normalized_tokens": normalized, "pre_tokenizer": pre_tokenizer,
                                      "normalizer": normalizer, "ignore_merges": ignore_merges, **extra}


# ------------------------------------------------------------------------------ the parts of tokenizer.json
def _normalizer(spec: Any, fail: Callable[[str], TokenizerError]) -> str | None:
    """None, or "NFC" (Qwen's): the only normalizers the byte-level families use."""
    parts = spec.get("normalizers") if isinstance(spec, dict) and spec.get("type") == "Sequence" else [spec]
    if not isinstance(parts, list):
        raise fail(f"normalizer {_short(spec)} is not supported (only NFC)")
    kinds = [p.get("type") if isinstance(p, dict) else p for p in parts if p is not None]
    if any(k != "NFC" for k in kinds):
        raise fail(f"normalizer {_short(next(k for k in kinds if k != 'NFC'))} is not supported (only NFC)")
    return "NFC" if kinds else None


def _pre_tokenizer(spec: Any, fail: Callable[[str], TokenizerError],
                   refuse: Callable[[str], TokenizerError]) -> PreTokenizer:
    """The pre-tokenizer a tokenizer.json names: ByteLevel, after any number of Split (Isolated) and
    Digits stages. Anything else (Metaspace, Whitespace, BertPreTokenizer, ...) is not byte-level BPE."""
    if spec is None:
        raise refuse("no pre_tokenizer (text is not mapped to bytes)")
    if not isinstance(spec, dict):
        raise fail(f"pre_tokenizer is {_short(spec)}, not an object")
    parts = spec.get("pretokenizers") if spec.get("type") == "Sequence" else [spec]
    if not isinstance(parts, list) or not parts:
        raise fail("pre_tokenizer Sequence has no 'pretokenizers' list")
    stages: list[tuple[str, str | None, str | None]] = []
    for n, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        where = "pre_tokenizer" if len(parts) == 1 and spec is part else f"pre_tokenizer.pretokenizers[{n}]"
        if not isinstance(part, dict) or not isinstance(kind, str):
            raise fail(f"{where} is {_short(part)}, not a pre-tokenizer object")
        if stages and stages[-1][0] == "byte_level":
            raise fail(f"{where} ({kind}) comes after ByteLevel: not supported")
        if kind == "Split":
            pattern = part.get("pattern")
            text = pattern.get("Regex", pattern.get("String")) if isinstance(pattern, dict) else None
            if not isinstance(text, str) or not text:
                raise fail(f"{where}.pattern is {_short(pattern)}, not {{'Regex': ...}} or {{'String': ...}}")
            if "String" in pattern:
                text = regex.escape(text)
            if part.get("behavior") != "Isolated" or part.get("invert"):
                raise fail(f"{where}: Split with behavior {_short(part.get('behavior'))}"
                           f"{' and invert' if part.get('invert') else ''} is not supported (only Isolated)")
            try:
                regex.compile(text)
            except (regex.error, RecursionError, OverflowError) as exc:
                raise fail(f"{where}.pattern does not compile: {exc}") from None
            stages.append(("regex", PreTokenizer.split_pattern(text), None))
        elif kind == "Digits":
            alone = part.get("individual_digits", False)
            stages.append(("regex", r"\p{N}|\P{N}+" if alone else r"\p{N}+|\P{N}+", None))
        elif kind == "ByteLevel":
            if part.get("add_prefix_space"):
                stages.append(("prefix_space", None, None))
            if part.get("use_regex", True):
                stages.append(("regex", PATTERN, _PINNED_PATTERN))
            stages.append(("byte_level", None, None))
        elif kind == "Metaspace":
            raise refuse(f"{where} is Metaspace (a SentencePiece-style tokenizer)")
        else:
            raise refuse(f"{where} is {_short(kind)}")
    if not stages or stages[-1][0] != "byte_level":
        raise refuse("the pre_tokenizer has no ByteLevel step (text is not mapped to bytes)")
    return PreTokenizer([s for s in stages if s[0] != "byte_level"] or [("regex", r"(?s).+", None)])


def _post_processor(spec: Any, fail: Callable[[str], TokenizerError]) -> tuple[list[int], list[int]]:
    """The ids a post-processor puts before and after one text: TemplateProcessing's ``single`` (Llama 3's
    ``<|begin_of_text|>``); ByteLevel adds none."""
    parts = spec.get("processors") if isinstance(spec, dict) and spec.get("type") == "Sequence" else [spec]
    prefix: list[int] = []
    suffix: list[int] = []
    for part in parts if isinstance(parts, list) else [parts]:
        kind = part.get("type") if isinstance(part, dict) else part
        if part is None or kind == "ByteLevel":
            continue
        if kind != "TemplateProcessing":
            raise fail(f"post_processor {_short(kind)} is not supported (only TemplateProcessing, ByteLevel)")
        single, specials = part.get("single"), part.get("special_tokens") or {}
        if not isinstance(single, list) or not isinstance(specials, dict):
            raise fail("post_processor TemplateProcessing needs a 'single' list, a 'special_tokens' object")
        seen_text = False
        for item in single:
            if isinstance(item, dict) and "Sequence" in item:
                if seen_text:
                    raise fail("post_processor TemplateProcessing: 'single' holds two sequences")
                seen_text = True
                continue
            name = item.get("SpecialToken", {}).get("id") if isinstance(item, dict) else None
            ids = specials.get(name, {}).get("ids") if isinstance(specials.get(name), dict) else None
            if not isinstance(ids, list) or not all(type(i) is int for i in ids):
                raise fail(f"post_processor TemplateProcessing: {_short(item)} is not a special token "
                           "listed with its ids")
            (suffix if seen_text else prefix).extend(ids)
    return prefix, suffix


def _template_ids(extra: dict[str, Any], id_of: Callable[[str], int | None]) -> dict[str, list[int]]:
    """BOS $A EOS as tokenizer_config's add_bos_token/add_eos_token ask (taken out of `extra`), as
    transformers builds it; {} when neither is set (the tokenizer.json's post-processor decides)."""
    if "add_bos_token" not in extra:
        return {}
    add_bos, add_eos = extra.pop("add_bos_token"), extra.pop("add_eos_token")
    bos, eos = extra.get("bos_token"), extra.get("eos_token")
    bos_id = id_of(bos) if add_bos and bos is not None else None
    eos_id = id_of(eos) if add_eos and eos is not None else None
    return {"prefix_ids": [] if bos_id is None else [bos_id],
            "suffix_ids": [] if eos_id is None else [eos_id]}


def _token_text(value: Any, source: str, key: str) -> str | None:
    """bos_token/eos_token of a tokenizer_config.json: a string, or an AddedToken object with content."""
    if isinstance(value, dict):
        value = value.get("content")
    if value is None or isinstance(value, str):
        return value
    raise TokenizerError(f"{source}: {key} is {_short(value)}, not a string")


def _eos_from(path: str | os.PathLike[str] | None, what: str) -> list[int] | None:
    """``eos_token_id`` (an id, or a list of them) of a generation_config.json or config.json."""
    if path is None:
        return None
    source = os.fspath(path)
    obj = _read_json(path, source, what)
    value = obj.get("eos_token_id") if isinstance(obj, dict) else None
    if value is None:
        return None
    ids = value if isinstance(value, list) else [value]
    if not ids or not all(type(i) is int and i >= 0 for i in ids):
        raise TokenizerError(f"{source}: eos_token_id is {_short(value)}, not a token id or a list of them")
    return ids


def _sidecars(tokenizer_config: str | os.PathLike[str] | None,
              generation_config: str | os.PathLike[str] | None,
              model_config: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The `Tokenizer` keywords that the files beside tokenizer.json give (see `Tokenizer.from_file`)."""
    extra: dict[str, Any] = {}
    bos = eos = None
    add_bos = add_eos = None
    if tokenizer_config is not None:
        source = os.fspath(tokenizer_config)
        conf = _read_json(tokenizer_config, source, "a tokenizer_config.json")
        if not isinstance(conf, dict):
            raise TokenizerError(f"{source}: expected a JSON object at the top level, found "
                                 f"{type(conf).__name__}")
        bos = _token_text(conf.get("bos_token"), source, "bos_token")
        eos = _token_text(conf.get("eos_token"), source, "eos_token")
        extra["bos_token"], extra["eos_token"] = bos, eos
        for key in ("add_bos_token", "add_eos_token"):
            if key in conf and not isinstance(conf[key], bool):
                raise TokenizerError(f"{source}: {key} is {_short(conf[key])}, not true or false")
        add_bos, add_eos = conf.get("add_bos_token"), conf.get("add_eos_token")
        template = conf.get("chat_template")
        if template is not None:
            extra["chat_template"] = template
    eos_ids = _eos_from(generation_config, "a generation_config.json")
    if eos_ids is None:
        eos_ids = _eos_from(model_config, "a config.json")
    if eos_ids is not None:
        extra["eos_ids"] = eos_ids
    if add_bos is not None or add_eos is not None:
        # As transformers: either flag set replaces tokenizer.json's post-processor with BOS $A EOS.
        extra["add_bos_token"], extra["add_eos_token"] = bool(add_bos), bool(add_eos)
    return extra
