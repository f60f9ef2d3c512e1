"""GPT-2's byte-level BPE tokenizer, read from a Hugging Face ``tokenizer.json``.

Pure Python (plus the ``regex`` module for ``\\p{L}``-style classes). Encoding is:

1. split out special tokens (only with ``allow_special=True``);
2. split the text into pieces with GPT-2's pre-tokenizer regex;
3. map each piece to ids: a dictionary hit when the piece is itself a token or was seen before,
   otherwise BPE over the piece's UTF-8 bytes (written in GPT-2's byte-to-unicode alphabet).

Step 3 is one C-level ``map`` over a dict whose ``__missing__`` runs BPE, so the common case does no
per-piece Python work at all.

The ids are those of Hugging Face tokenizers and of tiktoken (tests/test_tokenizer_oracles.py), also
for the letters and digits Unicode added after 16.0: see _NEWER.
"""

from __future__ import annotations

import codecs
import heapq
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import accumulate, chain, pairwise
from typing import Any

import regex

from inferno.config import FileTooLargeError, NotARegularFileError, read_regular_file

__all__ = ["PATTERN", "IncrementalDecoder", "Tokenizer", "TokenizerError", "bytes_to_unicode"]

# GPT-2's pre-tokenizer (the same as Hugging Face's ByteLevel one). Case-sensitive on purpose: "'LL"
# is not a contraction for GPT-2, it is "'" then "LL".
PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# Letters and digits that recent `regex` releases know but that Unicode 16.0 leaves unassigned (added
# in Unicode 17 and later). Hugging Face tokenizers and tiktoken still classify them with Unicode 16
# tables, that is, as neither letter nor digit; so do we, so that the ids do not depend on the regex
# module's Unicode version. (Found by comparing every code point with both; see the tests.)
_NEWER_BMP = r"\u0558\u058B-\u058C\u088F\u0C5C\u0CDC\u208F\u209D-\u209F\uA7CE-\uA7CF\uA7D2\uA7D4\uA7DD\uA7E2"
_NEWER_BMP += r"\uA7F1\uAB6C-\uAB6D"
_NEWER_ASTRAL = (
    r"\U000107BB-\U000107BF\U00010940-\U00010959\U00010EC5-\U00010EC7\U00010ED9-\U00010EEE\U00011B0A"
    r"\U00011DB0-\U00011DDB\U00011DE0-\U00011DE9\U00011DF1\U0001246F\U00012475-\U0001247F"
    r"\U00012550-\U00012686\U00016EA0-\U00016EB8\U00016EBB-\U00016ED3\U00016FF2-\U00016FF6"
    r"\U000187F8-\U000187FF\U00018CD6-\U00018CDA\U00018D09-\U00018D20\U00018D80-\U00018DF2"
    r"\U00018E00-\U00019191\U000191A0-\U000191D2\U0001B123-\U0001B128\U0001B168\U0001D6A6"
    r"\U0001DF1F-\U0001DF24\U0001DF2B-\U0001DF81\U0001DF90-\U0001DF96\U0001DFCD-\U0001DFFF"
    r"\U0001E6C0-\U0001E6DE\U0001E6E0-\U0001E6E2\U0001E6E4-\U0001E6E5\U0001E6E7-\U0001E6ED"
    r"\U0001E6F0-\U0001E6F4\U0001E6FE-\U0001E6FF\U0002B73A-\U0002B73F\U0002B81E\U0002CEA2-\U0002CEAD"
    r"\U000323B0-\U00033479\U0003D000-\U0003FC3F"
)
_NEWER = f"[{_NEWER_BMP}{_NEWER_ASTRAL}]"
_has_newer_chars = re.compile(_NEWER).search
# PATTERN with those characters moved from \p{L}/\p{N} to "other" (V1 for set operations). It is
# twice as slow, so encode only uses it on text that turns out to contain one of them.
_PINNED_PATTERN = (
    rf"""(?V1)'s|'t|'re|'ve|'m|'ll|'d| ?[\p{{L}}--{_NEWER}]+| ?[\p{{N}}--{_NEWER}]+"""
    rf"""| ?[[^\s\p{{L}}\p{{N}}]{_NEWER}]+|\s+(?!\S)|\s+"""
)

# Pieces longer than this (in bytes) use the heap-based merge, which is O(n log n) instead of O(n^2).
_LONG_PIECE = 32
# Pieces longer than this are not cached: they are rare and would pin a lot of memory.
_MAX_CACHED_PIECE = 256
# Upper bound on the number of cached pieces (beyond the vocabulary itself).
_CACHE_SIZE = 100_000
# Rank of a pair that is not a merge: larger than any real rank.
_NO_MERGE = 1 << 62
# GPT-2's tokenizer.json is 1.4 MB, the largest BPE vocabularies' (250k tokens) about 20 MB: a bigger file
# is not a tokenizer, and is not read into memory.
MAX_TOKENIZER_BYTES = 64 << 20


class TokenizerError(ValueError):
    """A tokenizer.json that cannot be used: says which file and what is wrong with it."""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable unicode characters.

    Printable latin-1 bytes map to themselves; the rest (control chars, space, ...) are shifted to
    U+0100 onwards, so that every token is a readable string without whitespace.
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return table


_BYTE_TO_CHAR = bytes_to_unicode()
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TO_CHAR.items()}
# str.translate tables: latin-1 string of raw bytes -> byte-level string, and back.
_ENCODE_TABLE = _BYTE_TO_CHAR
_DECODE_TABLE = {ord(c): b for c, b in _CHAR_TO_BYTE.items()}
# Characters below 256 that are not in the byte-level alphabet (space, controls) would otherwise pass
# through translate unchanged and look like valid bytes: send them out of latin-1 range instead.
_DECODE_TABLE.update({b: "\uffff" for b in range(256) if b not in _DECODE_TABLE})


def _to_byte_level(piece: str) -> str:
    """The byte-level spelling of a piece of text: its UTF-8 bytes, one character per byte."""
    try:
        raw = piece.encode()
    except UnicodeEncodeError:
        # Lone surrogates cannot be encoded; like tiktoken, replace them with U+FFFD (a valid surrogate
        # pair is joined into its character on the way).
        raw = piece.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode()
    return raw.decode("latin-1").translate(_ENCODE_TABLE)


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


class _PieceCache(dict):
    """piece of text -> tuple of ids. Pre-filled with every token whose bytes are valid UTF-8;
    ``__missing__`` runs BPE on anything else and remembers the answer (up to a size cap).

    A piece with one of the _NEWER characters is never in the cache: ``__missing__`` counts it in
    ``newer_seen`` and returns nothing, and ``Tokenizer.encode`` then starts over with _PINNED_PATTERN.
    So detecting those characters costs nothing for the pieces that are found in the cache.
    """

    def __init__(self, base: dict[str, tuple[int, ...]], tokenizer: Tokenizer) -> None:
        super().__init__(base)
        self._base = base
        self._limit = len(base) + _CACHE_SIZE
        self._tokenizer = tokenizer
        self.newer_seen = 0

    def __missing__(self, piece: str) -> tuple[int, ...]:
        if not piece.isascii() and _has_newer_chars(piece):
            self.newer_seen += 1
            return ()
        ids = self._tokenizer._bpe(_to_byte_level(piece))
        if len(piece) <= _MAX_CACHED_PIECE:
            if len(self) >= self._limit:
                # Start over rather than track recency: cheap, and the vocabulary part stays.
                self.clear()
                self.update(self._base)
            self[piece] = ids
        return ids


class IncrementalDecoder:
    """Turns ids into text one at a time, for streaming.

    ``feed`` returns the text that is complete so far: a character whose UTF-8 bytes are split across
    tokens is held back until its last byte arrives. ``flush`` returns what is left (an incomplete
    character becomes U+FFFD). All feeds plus the flush equal ``Tokenizer.decode`` of all the ids.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        # The stdlib's incremental decoder replaces invalid bytes exactly as bytes.decode does.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        return self._decoder.decode(self._tokenizer._token_bytes(token_id))

    def flush(self) -> str:
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return text


class Tokenizer:
    """GPT-2 byte-level BPE: ``encode`` text to ids and ``decode`` ids to text."""

    def __init__(
        self,
        vocab: Mapping[str, int],
        merges: Sequence[str | Sequence[str]],
        special_tokens: Mapping[str, int] | None = None,
        *,
        source: str = "<tokenizer>",
    ) -> None:
        """``vocab`` maps byte-level token strings to ids, ``merges`` lists BPE merges by priority (each
        ``"a b"`` or ``["a", "b"]``), ``special_tokens`` maps text such as ``<|endoftext|>`` to its id.
        ``source`` names where they came from, for error messages."""

        def fail(what: str) -> TokenizerError:
            return TokenizerError(f"{source}: {what}")

        special_tokens = dict(special_tokens or {})
        self._source = source

        self._vocab: dict[str, int] = dict(vocab)
        self._ranks = self._merge_ranks(merges, self._vocab, fail)

        missing = [b for b, c in _BYTE_TO_CHAR.items() if c not in self._vocab]
        if missing:
            raise fail(
                f"model.vocab lacks the byte-level tokens for bytes {missing[:8]} (not byte-level BPE?)"
            )

        for table in (self._vocab, special_tokens):
            if not all(type(i) is int and i >= 0 for i in table.values()):
                token, i = next((t, i) for t, i in table.items() if type(i) is not int or i < 0)
                raise fail(f"token {token!r} has id {_short(i)}, not a non-negative integer")
        size = max([*self._vocab.values(), *special_tokens.values()]) + 1
        if size > 10 * (len(self._vocab) + len(special_tokens)) + 1024:
            n = len(self._vocab) + len(special_tokens)
            raise fail(f"ids are far too sparse ({n} tokens, largest id {size - 1})")
        for text, i in special_tokens.items():
            if text in self._vocab and self._vocab[text] != i:
                raise fail(f"added token {text!r} has id {_short(i)}, but model.vocab gives it id "
                           f"{self._vocab[text]}")

        # id -> bytes, for decoding. All tokens are translated in one go: each byte-level character
        # is one byte, so token boundaries in the joined string are the same in the bytes.
        tokens = list(self._vocab)
        try:
            blob = "".join(tokens).translate(_DECODE_TABLE).encode("latin-1")
        except UnicodeEncodeError:
            token = next(t for t in tokens if any(c not in _CHAR_TO_BYTE for c in t))
            raise fail(f"model.vocab token {token!r} is not in GPT-2's byte-level alphabet") from None
        ends = list(accumulate(map(len, tokens)))
        raws = list(map(blob.__getitem__, map(slice, [0, *ends], ends)))
        id_to_bytes: list[bytes | None] = [None] * size
        # Every token that is valid UTF-8 text goes straight into the piece cache: most pieces of text
        # are whole tokens, and then encoding them is a single dictionary lookup.
        base: dict[str, tuple[int, ...]] = {}
        for raw, i in zip(raws, self._vocab.values(), strict=True):
            if id_to_bytes[i] is not None:
                raise fail(f"id {i} is used by two tokens in model.vocab")
            id_to_bytes[i] = raw
            try:
                base[raw.decode()] = (i,)
            except UnicodeDecodeError:
                pass  # part of a multi-byte character: never a whole piece of text
        for text in [t for t in base if not t.isascii() and _has_newer_chars(t)]:
            del base[text]  # see _PieceCache
        special_of: dict[int, str] = {}
        for text, i in special_tokens.items():
            if not isinstance(text, str) or not text:
                raise fail(f"special token {text!r} is not a non-empty string")
            raw = text.encode()
            if i in special_of:
                raise fail(f"added tokens {special_of[i]!r} and {text!r} share id {i}")
            special_of[i] = text
            if id_to_bytes[i] is not None and id_to_bytes[i] != raw:
                raise fail(f"special token {text!r} reuses id {i} of model.vocab token {id_to_bytes[i]!r}")
            id_to_bytes[i] = raw
        if None in id_to_bytes:
            # Generation samples any id below the vocabulary size: each must decode to something.
            gaps = [i for i, raw in enumerate(id_to_bytes) if raw is None]
            shown = ", ".join(map(str, gaps[:8])) + (f", ... ({len(gaps) - 8} more)" if len(gaps) > 8 else "")
            raise fail(f"no token has id {shown}: the ids of model.vocab and added_tokens must run from 0 to "
                       f"{size - 1} without gaps")
        self._id_to_bytes = id_to_bytes
        self._special = special_tokens
        self._cache = _PieceCache(base, self)
        self._findall = regex.compile(PATTERN).findall
        self._findall_pinned = regex.compile(_PINNED_PATTERN).findall
        # Longest first, so that a special token that is a prefix of another does not win.
        self._special_split = (
            regex.compile(
                "(" + "|".join(regex.escape(t) for t in sorted(special_tokens, key=len, reverse=True)) + ")"
            ).split
            if special_tokens
            else None
        )
        self.vocab_size: int = size
        self.eos_id: int | None = special_tokens.get("<|endoftext|>", vocab.get("<|endoftext|>"))

    @staticmethod
    def _merge_ranks(
        merges: Sequence[str | Sequence[str]], vocab: dict[str, int], fail: Callable[[str], TokenizerError]
    ) -> dict[str, int]:
        """Merge ranks keyed by "a b". Byte-level symbols never contain a space (it is spelled "Ġ"), so
        that string is unambiguous, and the usual "a b" form of model.merges is already the key."""
        if not isinstance(merges, list):
            merges = list(merges)
        if not merges:
            return {}  # BPE without merges: every piece is its bytes (valid, if useless)
        if all(type(m) is str for m in merges):
            keys = merges
        else:
            keys = [m if isinstance(m, str) else " ".join(m) if _is_pair(m) else "" for m in merges]
        # Check everything with C-level set operations, and look for the culprit only if that fails.
        parts = " ".join(keys).split(" ")
        # Byte-level tokens contain no newline either: it is a cheap separator for the merged tokens.
        merged = "\n".join(keys).replace(" ", "").split("\n")
        if (
            len(parts) != 2 * len(keys)
            or len(merged) != len(keys)
            or not all(map(vocab.__contains__, parts))  # also rules out "" parts: "" is no token
            or not all(map(vocab.__contains__, merged))
        ):
            for rank, merge in enumerate(merges):
                pair = merge.split(" ") if isinstance(merge, str) else merge
                if not _is_pair(pair) or not pair[0] or not pair[1]:
                    raise fail(f'model.merges[{rank}] is not two tokens, \'a b\' or ["a", "b"]: {merge!r}')
                for token in (pair[0], pair[1], pair[0] + pair[1]):
                    if token not in vocab:
                        raise fail(
                            f"model.merges[{rank}] ({merge!r}) uses {token!r}, which is not in model.vocab"
                        )
            raise fail("model.merges has a token with a space in it")
        ranks: dict[str, int] = {}
        for rank, key in enumerate(keys):
            ranks.setdefault(key, rank)  # a merge listed twice keeps its first (highest-priority) rank
        return ranks

    # ----------------------------------------------------------------------------------------- loading
    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Load a Hugging Face ``tokenizer.json`` holding a byte-level BPE model (such as GPT-2's)."""
        source = os.fspath(path)
        return cls.from_dict(_read_json(path, source), source=source)

    @classmethod
    def from_vocab_merges(cls, vocab_path: str | os.PathLike[str], merges_path: str | os.PathLike[str]
                          ) -> Tokenizer:
        """Load the older pair of files, ``vocab.json`` (token → id) and ``merges.txt`` (one ``a b`` merge
        a line, by priority, after an optional ``#version`` line), for repos without a tokenizer.json.
        ``<|endoftext|>``, when the vocabulary has it, is the special token, as in GPT-2's tokenizer.json."""
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
        return cls(vocab, merges, special, source=f"{vocab_source} + {os.path.basename(merges_source)}")

    @classmethod
    def from_dict(cls, obj: Any, *, source: str = "<tokenizer.json>") -> Tokenizer:
        """Build from the parsed contents of a ``tokenizer.json``."""

        def fail(what: str) -> TokenizerError:
            return TokenizerError(f"{source}: {what}")

        if not isinstance(obj, dict):
            raise fail(f"expected a JSON object at the top level, found {type(obj).__name__}")
        model = obj.get("model")
        if not isinstance(model, dict):
            raise fail("no 'model' object")
        kind = model.get("type", "BPE")  # GPT-2's own file omits it
        if kind != "BPE":
            raise fail(f"model.type is {kind!r}; only 'BPE' is supported")
        vocab = model.get("vocab")
        if not isinstance(vocab, dict) or not vocab:
            raise fail("model.vocab is missing or not a non-empty object")
        merges = model.get("merges")
        if not isinstance(merges, list):
            raise fail("model.merges is missing or not a list")
        for key in ("continuing_subword_prefix", "end_of_word_suffix"):
            if model.get(key):
                raise fail(f"model.{key} {model[key]!r} is not supported")
        if obj.get("normalizer") is not None:
            raise fail("a normalizer is not supported")
        pre = obj.get("pre_tokenizer")
        if pre is not None:
            if not isinstance(pre, dict) or pre.get("type") != "ByteLevel":
                raise fail(f"pre_tokenizer must be ByteLevel, found {pre!r}")
            if pre.get("add_prefix_space") or pre.get("use_regex", True) is not True:
                raise fail(
                    "pre_tokenizer ByteLevel with add_prefix_space or without use_regex is not supported"
                )
        added = obj.get("added_tokens") or []
        if not isinstance(added, list):
            raise fail("added_tokens is not a list")
        special: dict[str, int] = {}
        for n, entry in enumerate(added):
            if not isinstance(entry, dict) or not isinstance(entry.get("content"), str) or "id" not in entry:
                raise fail(f"added_tokens[{n}] needs 'id' and 'content'")
            # These change how the token is matched in text; GPT-2's has none of them.
            flags = [flag for flag in ("lstrip", "rstrip", "single_word") if entry.get(flag)]
            if flags:
                raise fail(f"added_tokens[{n}] ({entry['content']!r}) sets {', '.join(flags)}: not supported")
            if entry["content"] in special and special[entry["content"]] != entry["id"]:
                raise fail(f"added_tokens[{n}] ({entry['content']!r}) repeats an added token with another id "
                           f"({_short(special[entry['content']])} and {_short(entry['id'])})")
            special[entry["content"]] = entry["id"]
        return cls(vocab, merges, special, source=source)

    # ---------------------------------------------------------------------------------------- encoding
    def encode(self, text: str, allow_special: bool = False) -> list[int]:
        """Text to ids. Special tokens such as ``<|endoftext|>`` are only recognised with
        ``allow_special=True``; otherwise they are encoded as the plain text they are."""
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, not {type(text).__name__}")
        if not allow_special or self._special_split is None:
            return self._encode_ordinary(text)
        ids: list[int] = []
        # split() with a capturing group alternates: text, special, text, special, ..., text.
        for n, part in enumerate(self._special_split(text)):
            if n % 2:
                ids.append(self._special[part])
            elif part:
                ids += self._encode_ordinary(part)
        return ids

    def _split(self, text: str) -> list[str]:
        """The pre-tokenizer alone: text to the pieces that BPE works on (for tests and debugging)."""
        return (self._findall_pinned if _has_newer_chars(text) else self._findall)(text)

    def _encode_ordinary(self, text: str) -> list[int]:
        cache = self._cache
        seen = cache.newer_seen
        ids = list(chain.from_iterable(map(cache.__getitem__, self._findall(text))))
        if cache.newer_seen == seen:
            return ids
        # Rare: the text has letters or digits newer than Unicode 16 (see _NEWER). Start over with
        # the pattern that treats them as Unicode 16 does, without the cache's __missing__.
        ids = []
        for piece in self._findall_pinned(text):
            piece_ids = cache.get(piece)
            ids += self._bpe(_to_byte_level(piece)) if piece_ids is None else piece_ids
        return ids

    def _bpe(self, word: str) -> tuple[int, ...]:
        """BPE-merge a byte-level string: repeatedly merge the adjacent pair of lowest rank, leftmost
        first, until no pair has a rank."""
        vocab = self._vocab
        if word in vocab:
            # A whole token is taken as is (so is any piece in the cache's vocabulary part). That is
            # what BPE gives for every GPT-2 token, which tests/test_tokenizer.py checks.
            return (vocab[word],)
        if len(word) > _LONG_PIECE:
            return tuple(map(vocab.__getitem__, self._bpe_heap(word)))
        ranks_get = self._ranks.get
        symbols = list(word)
        # rank of each adjacent pair; _NO_MERGE (larger than any rank) where the pair is not a merge
        pair_ranks = [ranks_get(a + " " + b, _NO_MERGE) for a, b in pairwise(word)]
        while pair_ranks:
            best = min(pair_ranks)
            if best == _NO_MERGE:
                break
            i = pair_ranks.index(best)  # leftmost occurrence first
            merged = symbols[i] = symbols[i] + symbols.pop(i + 1)
            del pair_ranks[i]
            if i > 0:
                pair_ranks[i - 1] = ranks_get(symbols[i - 1] + " " + merged, _NO_MERGE)
            if i < len(pair_ranks):
                pair_ranks[i] = ranks_get(merged + " " + symbols[i + 1], _NO_MERGE)
        return tuple(map(vocab.__getitem__, symbols))

    def _bpe_heap(self, word: str) -> list[str]:
        """The same merges as ``_bpe`` in O(n log n): a heap of (rank, position) over a linked list.

        Heap entries are single ints, rank << shift | position, which compare much faster than tuples.
        """
        ranks_get = self._ranks.get
        symbols: list[str | None] = list(word)
        n = len(symbols)
        shift = n.bit_length()
        mask = (1 << shift) - 1
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        pair_ranks = map(ranks_get, map(" ".join, pairwise(word)))
        heap = [r << shift | i for i, r in enumerate(pair_ranks) if r is not None]
        heapq.heapify(heap)
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            entry = pop(heap)
            i = entry & mask
            left = symbols[i]
            j = nxt[i]
            if left is None or j < 0:
                continue  # merged away since it was queued
            right = symbols[j]
            if ranks_get(left + " " + right) != entry >> shift:
                continue  # the pair at i changed since it was queued
            merged = symbols[i] = left + right
            symbols[j] = None
            k = nxt[i] = nxt[j]
            if k >= 0:
                prv[k] = i
                r = ranks_get(merged + " " + symbols[k])
                if r is not None:
                    push(heap, r << shift | i)
            h = prv[i]
            if h >= 0:
                r = ranks_get(symbols[h] + " " + merged)
                if r is not None:
                    push(heap, r << shift | h)
        return [s for s in symbols if s is not None]

    # ---------------------------------------------------------------------------------------- decoding
    def _token_bytes(self, token_id: int) -> bytes:
        raw = None
        if type(token_id) is int or (not isinstance(token_id, bool) and hasattr(token_id, "__index__")):
            try:
                i = token_id.__index__()
            except TypeError:
                i = -1
            if 0 <= i < self.vocab_size:
                raw = self._id_to_bytes[i]
        if raw is None:
            raise ValueError(f"token id {token_id!r} is not in the vocabulary (0..{self.vocab_size - 1})")
        return raw

    def decode(self, ids: Iterable[int]) -> str:
        """Ids to text. Invalid UTF-8 becomes U+FFFD, exactly as with ``bytes.decode(errors="replace")``."""
        return b"".join(map(self._token_bytes, ids)).decode(errors="replace")

    def incremental_decoder(self) -> IncrementalDecoder:
        """A decoder for streaming: feed it one id at a time."""
        return IncrementalDecoder(self)

    # -------------------------------------------------------------------------------------- vocabulary
    def __len__(self) -> int:
        return self.vocab_size

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self._special)

    def __repr__(self) -> str:
        return f"Tokenizer({self._source!r}, vocab_size={self.vocab_size})"
