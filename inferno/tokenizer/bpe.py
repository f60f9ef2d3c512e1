"""The byte-level BPE tokenizer (GPT-2, Llama 3, Qwen2/3, SmolLM2) of a Hugging Face ``tokenizer.json``.

Pure Python (plus the ``regex`` module for ``\\p{L}``-style classes). Encoding is:

1. split out the added tokens, in one pass over the text (one compiled alternation, built as a trie,
   leftmost-longest as Hugging Face's matcher): special ones such as ``<|endoftext|>`` only with
   ``allow_special=True``, the others (Qwen's ``<think>``) always;
2. normalize what is left (NFC, where the file says so);
3. split it into pieces with the file's own pre-tokenizer: GPT-2's regex (ByteLevel's own), or the
   chain it names (a ``Split`` regex such as Llama 3's or Qwen's, ``Digits``, ``ByteLevel``);
4. map each piece to ids: a dictionary hit when the piece is itself a token or was seen before,
   otherwise BPE over the piece's UTF-8 bytes (written in GPT-2's byte-to-unicode alphabet).

Step 4 is one C-level ``map`` over a dict whose ``__missing__`` runs BPE, so the common case does no
per-piece Python work at all.

Beside ``tokenizer.json`` a model folder may hold ``tokenizer_config.json`` (``bos_token``,
``eos_token``, ``add_bos_token``, ``chat_template``), ``generation_config.json`` and ``config.json``
(the ids that end a reply): `Tokenizer.from_dir` reads them all. Other kinds of tokenizer (SentencePiece,
WordPiece, Unigram) are refused in one line.

The ids are those of Hugging Face tokenizers (and of tiktoken for GPT-2): tests/test_tokenizer_oracles.py
and tests/test_tokenizer_families.py, also for the letters and digits Unicode added after 16.0: see _NEWER.
"""

from __future__ import annotations

import codecs
import heapq
import os
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import accumulate, chain, pairwise
from typing import Any

from inferno.tokenizer.pretokenizer import (
    _BYTE_TO_CHAR,
    _CHAR_TO_BYTE,
    _DECODE_TABLE,
    PreTokenizer,
    _has_newer_chars,
    _splitter,
    _to_byte_level,
)
from inferno.tokenizer.reader import (
    TokenizerError,
    _is_pair,
    _read_json,
    _read_text,
    _short,
    _sidecars,
    tokenizer_json_args,
    vocab_merges_args,
)

# Pieces longer than this (in bytes) use the heap-based merge, which is O(n log n) instead of O(n^2).
_LONG_PIECE = 32
# Pieces longer than this are not cached: they are rare and would pin a lot of memory.
_MAX_CACHED_PIECE = 256
# Upper bound on the number of cached pieces (beyond the vocabulary itself).
_CACHE_SIZE = 100_000
# Rank of a pair that is not a merge: larger than any real rank.
_NO_MERGE = 1 << 62


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

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer it decodes for (a constraint on the output reads its vocabulary)."""
        return self._tokenizer

    def feed(self, token_id: int) -> str:
        return self._decoder.decode(self._tokenizer._token_bytes(token_id))

    def flush(self) -> str:
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return text


class Tokenizer:
    """Byte-level BPE: ``encode`` text to ids and ``decode`` ids to text."""

    def __init__(
        self,
        vocab: Mapping[str, int],
        merges: Sequence[str | Sequence[str]],
        special_tokens: Mapping[str, int] | None = None,
        *,
        source: str = "<tokenizer>",
        added_tokens: Mapping[str, int] | None = None,
        normalized_tokens: Mapping[str, int] | None = None,
        pre_tokenizer: PreTokenizer | None = None,
        normalizer: str | None = None,
        ignore_merges: bool = False,
        prefix_ids: Sequence[int] = (),
        suffix_ids: Sequence[int] = (),
        eos_ids: Sequence[int] | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
        chat_template: str | list[Any] | None = None,
    ) -> None:
        """``vocab`` maps byte-level token strings to ids, ``merges`` lists BPE merges by priority (each
        ``"a b"`` or ``["a", "b"]``), ``special_tokens`` maps text such as ``<|endoftext|>`` to its id
        (recognised in text only with ``allow_special``), ``added_tokens`` the other added tokens (always
        recognised), ``normalized_tokens`` added tokens found after the normalizer has run (Hugging Face's
        ``normalized: true``). ``pre_tokenizer`` defaults to GPT-2's, ``normalizer`` may be ``"NFC"``;
        ``ignore_merges`` takes a piece that is a whole token as that token (Llama 3).

        ``prefix_ids``/``suffix_ids`` go around the text with ``encode(..., add_special=True)`` (a BOS);
        ``eos_ids`` end a reply (default: the id of ``eos_token``, else of ``<|endoftext|>``).
        ``bos_token``, ``eos_token`` and ``chat_template`` are kept for chat templates. ``source`` names
        where it all came from, for error messages."""

        def fail(what: str) -> TokenizerError:
            return TokenizerError(f"{source}: {what}")

        special_tokens = dict(special_tokens or {})
        added_tokens = dict(added_tokens or {})
        normalized_tokens = dict(normalized_tokens or {})
        self._source = source

        self._vocab: dict[str, int] = dict(vocab)
        self._ranks, merged = self._merge_ranks(merges, self._vocab, fail)

        missing = [b for b, c in _BYTE_TO_CHAR.items() if c not in self._vocab]
        if missing:
            raise fail(
                f"model.vocab lacks the byte-level tokens for bytes {missing[:8]} (not byte-level BPE?)"
            )

        both = {**normalized_tokens, **added_tokens, **special_tokens}
        for table in (self._vocab, both):
            if not all(type(i) is int and i >= 0 for i in table.values()):
                token, i = next((t, i) for t, i in table.items() if type(i) is not int or i < 0)
                raise fail(f"token {token!r} has id {_short(i)}, not a non-negative integer")
        size = max([*self._vocab.values(), *both.values()]) + 1
        if size > 10 * (len(self._vocab) + len(both)) + 1024:
            n = len(self._vocab) + len(both)
            raise fail(f"ids are far too sparse ({n} tokens, largest id {size - 1})")
        for text, i in both.items():
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
        # are whole tokens, and then encoding them is a single dictionary lookup. That is what BPE makes
        # of a token that a merge builds (every token of GPT-2 and Qwen, which the tests check); one
        # that no merge builds is taken whole only where the file says so (ignore_merges, Llama 3).
        reachable = None if ignore_merges else set(merged)
        base: dict[str, tuple[int, ...]] = {}
        for raw, (token, i) in zip(raws, self._vocab.items(), strict=True):
            if id_to_bytes[i] is not None:
                raise fail(f"id {i} is used by two tokens in model.vocab")
            id_to_bytes[i] = raw
            if reachable is not None and len(token) > 1 and token not in reachable:
                continue
            try:
                base[raw.decode()] = (i,)
            except UnicodeDecodeError:
                pass  # part of a multi-byte character: never a whole piece of text
        for text in [t for t in base if not t.isascii() and _has_newer_chars(t)]:
            del base[text]  # see _PieceCache
        self._reachable = reachable
        added_of: dict[int, str] = {}
        for text, i in both.items():
            kind = "special token" if text in special_tokens else "added token"
            if not isinstance(text, str) or not text:
                raise fail(f"{kind} {text!r} is not a non-empty string")
            raw = text.encode()
            if i in added_of:
                raise fail(f"added tokens {added_of[i]!r} and {text!r} share id {i}")
            added_of[i] = text
            if id_to_bytes[i] is not None and id_to_bytes[i] != raw:
                raise fail(f"{kind} {text!r} reuses id {i} of model.vocab token {id_to_bytes[i]!r}")
            id_to_bytes[i] = raw
        if None in id_to_bytes:
            # Generation samples any id below the vocabulary size: each must decode to something.
            gaps = [i for i, raw in enumerate(id_to_bytes) if raw is None]
            shown = ", ".join(map(str, gaps[:8])) + (f", ... ({len(gaps) - 8} more)" if len(gaps) > 8 else "")
            raise fail(f"no token has id {shown}: the ids of model.vocab and added_tokens must run from 0 to "
                       f"{size - 1} without gaps")
        self._id_to_bytes = id_to_bytes
        self._special = special_tokens
        self._added = both
        self._cache = _PieceCache(base, self)
        self.pre_tokenizer = pre_tokenizer or PreTokenizer.gpt2()
        self._findall = self.pre_tokenizer.findall
        self._findall_pinned = self.pre_tokenizer.findall_pinned
        if normalizer not in (None, "NFC"):
            raise fail(f"normalizer {normalizer!r} is not supported (only NFC)")
        self._normalizer = normalizer
        # The added tokens are found in one pass over the text, by one compiled trie (see _alternation):
        # all of them with allow_special, else only the ordinary added ones.
        self._split_all = _splitter(both)
        self._split_added = _splitter(added_tokens)
        self._split_normalized = _splitter(normalized_tokens)
        self.vocab_size: int = size
        for name, ids in (("prefix", prefix_ids), ("suffix", suffix_ids), ("eos", eos_ids or ())):
            bad = [i for i in ids if type(i) is not int or not 0 <= i < size]
            if bad:
                raise fail(f"{name} id {_short(bad[0])} is not a token id (0..{size - 1})")
        self.prefix_ids: tuple[int, ...] = tuple(prefix_ids)
        self.suffix_ids: tuple[int, ...] = tuple(suffix_ids)
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.chat_template = chat_template
        if eos_ids is None:
            eos_text = eos_token if eos_token is not None else "<|endoftext|>"
            eos = both.get(eos_text, vocab.get(eos_text))
            eos_ids = () if eos is None else (eos,)
        #: The ids that end a reply, most important first.
        self.eos_ids: tuple[int, ...] = tuple(dict.fromkeys(eos_ids))
        self.eos_id: int | None = self.eos_ids[0] if self.eos_ids else None
        #: The id of ``bos_token``, when it is a token.
        self.bos_id: int | None = None if bos_token is None else both.get(bos_token, vocab.get(bos_token))

    @staticmethod
    def _merge_ranks(
        merges: Sequence[str | Sequence[str]], vocab: dict[str, int], fail: Callable[[str], TokenizerError]
    ) -> tuple[dict[str, int], list[str]]:
        """Merge ranks keyed by "a b", and the tokens the merges make. Byte-level symbols never contain a
        space (it is spelled "Ġ"), so that string is unambiguous, and the usual "a b" form of model.merges
        is already the key."""
        if not isinstance(merges, list):
            merges = list(merges)
        if not merges:
            return {}, []  # BPE without merges: every piece is its bytes (valid, if useless)
        kinds = set(map(type, merges))
        if kinds == {str}:
            keys = merges
        elif kinds == {list} and all(type(p) is str for p in chain.from_iterable(merges)):
            keys = list(map(" ".join, merges))  # pairs (Qwen's form); a wrong length is caught below
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
        # Built from the end, so that a merge listed twice keeps its first (highest-priority) rank.
        ranks = dict(zip(reversed(keys), range(len(keys) - 1, -1, -1), strict=True))
        return ranks, merged

    # ----------------------------------------------------------------------------------------- loading
    @classmethod
    def from_file(
        cls,
        path: str | os.PathLike[str],
        *,
        tokenizer_config: str | os.PathLike[str] | None = None,
        generation_config: str | os.PathLike[str] | None = None,
        model_config: str | os.PathLike[str] | None = None,
    ) -> Tokenizer:
        """Load a Hugging Face ``tokenizer.json`` holding a byte-level BPE model (GPT-2's, Llama 3's, ...).

        The other files are optional: ``tokenizer_config.json`` gives ``bos_token``, ``eos_token``,
        ``add_bos_token``/``add_eos_token`` (which, when set, decide what ``add_special`` puts around the
        text, as transformers does) and the ``chat_template``; the EOS ids come from
        ``generation_config.json``'s ``eos_token_id`` when it has one, else from ``config.json``'s, else
        from ``eos_token``."""
        source = os.fspath(path)
        obj = _read_json(path, source)
        extra = _sidecars(tokenizer_config, generation_config, model_config)
        return cls.from_dict(obj, source=source, **extra)

    @classmethod
    def from_dir(cls, directory: str | os.PathLike[str]) -> Tokenizer:
        """The tokenizer of a model folder: ``tokenizer.json`` (else ``vocab.json`` + ``merges.txt``) with
        whichever of ``tokenizer_config.json``, ``generation_config.json`` and ``config.json`` are there
        (see `from_file`); a ``chat_template.jinja`` replaces tokenizer_config's template, as in
        transformers."""
        folder = os.fspath(directory)

        def there(name: str) -> str | None:
            path = os.path.join(folder, name)
            return path if os.path.exists(path) else None

        extra = _sidecars(there("tokenizer_config.json"), there("generation_config.json"),
                          there("config.json"))
        jinja = there("chat_template.jinja")
        if jinja is not None:
            extra["chat_template"] = _read_text(jinja, jinja, "a chat_template.jinja")
        tokenizer_json = there("tokenizer.json")
        if tokenizer_json is not None:
            return cls.from_dict(_read_json(tokenizer_json, tokenizer_json), source=tokenizer_json, **extra)
        if there("vocab.json") and there("merges.txt"):
            vocab_json, merges_txt = os.path.join(folder, "vocab.json"), os.path.join(folder, "merges.txt")
            return cls.from_vocab_merges(vocab_json, merges_txt, **extra)
        raise FileNotFoundError(f"{folder}: no tokenizer.json, nor vocab.json and merges.txt")

    @classmethod
    def from_vocab_merges(cls, vocab_path: str | os.PathLike[str], merges_path: str | os.PathLike[str],
                          **extra: Any) -> Tokenizer:
        """Load the older pair of files, ``vocab.json`` (token → id) and ``merges.txt`` (one ``a b`` merge
        a line, by priority, after an optional ``#version`` line), for repos without a tokenizer.json.
        ``<|endoftext|>``, when the vocabulary has it, is the special token, as in GPT-2's tokenizer.json.
        `extra`: what other files give, as for `from_dict`."""
        args, kwargs = vocab_merges_args(vocab_path, merges_path, extra)
        return cls(*args, **kwargs)

    @classmethod
    def from_dict(cls, obj: Any, *, source: str = "<tokenizer.json>", **extra: Any) -> Tokenizer:
        """Build from the parsed contents of a ``tokenizer.json``. `extra` are the keywords of
        `Tokenizer` that other files give (see `from_file`): ``add_bos_token``/``add_eos_token`` there
        replace the file's post-processor."""

        args, kwargs = tokenizer_json_args(obj, source, extra)
        return cls(*args, **kwargs)

    # ---------------------------------------------------------------------------------------- encoding
    def encode(self, text: str, allow_special: bool = False, *, add_special: bool = False) -> list[int]:
        """Text to ids. Special tokens such as ``<|endoftext|>`` are only recognised with
        ``allow_special=True``; otherwise they are encoded as the plain text they are. The other added
        tokens (Qwen's ``<think>``) are always recognised, as in Hugging Face tokenizers.
        ``add_special=True`` puts the tokenizer's ``prefix_ids`` (a BOS) and ``suffix_ids`` around the
        ids, as transformers' ``add_special_tokens`` does: for a prompt, not for a rendered chat template,
        which holds its own."""
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, not {type(text).__name__}")
        split = self._split_all if allow_special else self._split_added
        if split is None:
            ids = self._encode_ordinary(text)
        else:
            ids = []
            added = self._added
            # split() with a capturing group alternates: text, token, text, token, ..., text.
            for n, part in enumerate(split(text)):
                if n % 2:
                    ids.append(added[part])
                elif part:
                    ids += self._encode_ordinary(part)
        if add_special and (self.prefix_ids or self.suffix_ids):
            ids = [*self.prefix_ids, *ids, *self.suffix_ids]
        return ids

    def _split(self, text: str) -> list[str]:
        """The pre-tokenizer alone: text to the pieces that BPE works on (for tests and debugging)."""
        text = self._normalize(text)
        return (self._findall_pinned if _has_newer_chars(text) else self._findall)(text)

    def _normalize(self, text: str) -> str:
        if self._normalizer is None or unicodedata.is_normalized("NFC", text):
            return text
        return unicodedata.normalize("NFC", text)

    def _encode_ordinary(self, text: str) -> list[int]:
        if self._normalizer is not None:
            text = self._normalize(text)
            if self._split_normalized is not None:  # added tokens found in the normalized text
                ids: list[int] = []
                for n, part in enumerate(self._split_normalized(text)):
                    if n % 2:
                        ids.append(self._added[part])
                    elif part:
                        ids += self._encode_pieces(part)
                return ids
        return self._encode_pieces(text)

    def _encode_pieces(self, text: str) -> list[int]:
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
        if word in vocab and (self._reachable is None or len(word) == 1 or word in self._reachable):
            # A whole token is taken as is (so is any piece in the cache's vocabulary part): see __init__.
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
