"""Splitting text into pieces before BPE: the added-token matcher (one alternation built as a trie),
the pre-tokenizer stages a tokenizer.json names (GPT-2's regex, a ``Split`` regex, ``Digits``,
``ByteLevel``), and GPT-2's byte-to-unicode alphabet in which BPE sees a piece's UTF-8 bytes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Sequence

import regex

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


def _pin(pattern: str) -> str:
    """A pre-tokenizer regex with the _NEWER characters taken out of ``\\p{L}`` and ``\\p{N}`` (V1 syntax,
    nested sets), so that text holding them splits as Unicode 16 tables split it."""
    for cls in "LN":
        pattern = pattern.replace(rf"\p{{{cls}}}", rf"[\p{{{cls}}}--{_NEWER}]")
        pattern = pattern.replace(rf"\p{cls}", rf"[\p{{{cls}}}--{_NEWER}]")
    return "(?V1)" + pattern


def _alternation(tokens: Iterable[str]) -> str:
    """One ``re`` pattern that matches any of `tokens`, the longest where several start at one place.

    Written as a trie (``<|e(?:ndoftext|ot)\\|>``), so matching costs the length of the match, not one
    try per token: a plain alternation of 20k added tokens tries all 20k at every position of the text.
    A node that ends a token and goes on makes the rest optional and greedy: longest first.
    """
    root: dict[str, dict] = {}
    for token in tokens:
        node = root
        for char in token:
            node = node.setdefault(char, {})
        node[""] = {}  # a token ends here

    def emit(node: dict[str, dict]) -> str:
        branches = []
        for char, child in node.items():
            if not char:
                continue
            text = re.escape(char)
            while len(child) == 1 and "" not in child:  # a chain without branches: one literal
                ((char, child),) = child.items()
                text += re.escape(char)
            branches.append(text + emit(child))
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        if "" in node:
            return f"(?:{body})?"
        return body

    return emit(root)


def _splitter(tokens: Collection[str]) -> Callable[[str], list[str]] | None:
    """``split`` of one compiled pattern matching `tokens` (None for none): text, token, text, ..., text.

    A trie as deep as Python's recursion limit (hundreds of added tokens, each a prefix of the next)
    cannot be written or compiled; then a plain alternation, longest first: the same matches, slower."""
    if not tokens:
        return None
    try:
        return re.compile(f"({_alternation(tokens)})").split
    except RecursionError:
        flat = "|".join(map(re.escape, sorted(tokens, key=len, reverse=True)))
        return re.compile(f"({flat})").split


class PreTokenizer:
    """The pre-tokenizer of a tokenizer.json: text to the pieces that BPE works on.

    A chain of stages, each applied to every piece of the one before: a regex whose matches (and the
    text between them, as Hugging Face's ``Isolated`` split keeps it) are the pieces, or a space put in
    front of each piece that lacks one (ByteLevel's ``add_prefix_space``). ``findall`` splits with the
    regex module's tables, ``findall_pinned`` with Unicode 16's (see _NEWER).
    """

    def __init__(self, stages: Sequence[tuple[str, str | None, str | None]]) -> None:
        """Each stage is ``("regex", pattern, pinned_pattern)`` (pinned None: derived with `_pin`) or
        ``("prefix_space", None, None)``."""
        compiled: list[tuple[Callable[[str], list[str]] | None, Callable[[str], list[str]] | None]] = []
        for kind, pattern, pinned in stages:
            if kind == "prefix_space":
                compiled.append((None, None))
                continue
            assert pattern is not None
            findall = regex.compile(pattern).findall
            try:
                findall_pinned = regex.compile(pinned or _pin(pattern)).findall
            except regex.error:  # a pattern V1 reads otherwise (a "[" in a set): its own tables then
                findall_pinned = findall
            compiled.append((findall, findall_pinned))
        self.stages = tuple(stages)
        if len(compiled) == 1 and compiled[0][0] is not None:
            # One regex (GPT-2's own, or one Split): its findall itself, no per-piece Python at all.
            self.findall, self.findall_pinned = compiled[0]  # type: ignore[assignment]
        else:
            self.findall = self._chain([f for f, _ in compiled])
            self.findall_pinned = self._chain([p for _, p in compiled])

    @staticmethod
    def _chain(steps: list[Callable[[str], list[str]] | None]) -> Callable[[str], list[str]]:
        def findall(text: str) -> list[str]:
            pieces = [text]
            for step in steps:
                if step is None:
                    pieces = [p if p.startswith(" ") else " " + p for p in pieces]
                else:
                    pieces = [q for p in pieces for q in step(p)]
            return pieces

        return findall

    @classmethod
    def gpt2(cls) -> PreTokenizer:
        """ByteLevel's own regex, GPT-2's."""
        return cls([("regex", PATTERN, _PINNED_PATTERN)])

    @staticmethod
    def split_pattern(pattern: str) -> str:
        """A Split regex as a findall pattern: its matches, and the runs of text between them as pieces
        of their own (``Isolated``). The second branch takes a character only where no match starts."""
        return f"(?:{pattern})|(?:(?!(?:{pattern}))(?s:.))+"


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
