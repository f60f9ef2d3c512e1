"""Whether a text can fit a model's context, decided before the text is tokenized.

Tokenizing a text of N characters holds several objects per character (the pre-tokenizer's pieces, the
ids), so a text of hundreds of megabytes cannot even be refused cheaply once it is encoded. But no token
stands for more characters than its own bytes (each character is at least one byte), so a text of N
characters encodes to at least N / L tokens, L being the most bytes any one token decodes to. When that
lower bound is already past the context, the text is refused without encoding it.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

#: Slack in the lower bound for tokenizers that normalize their input first (NFC or NFKC may fold a
#: few characters into one): the bound only ever refuses texts that cannot fit by a wide margin.
MARGIN = 4

_longest: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def longest_token(tokenizer: Any) -> int:
    """The most UTF-8 bytes any one token of `tokenizer` decodes to, plus one (a tokenizer may drop a
    leading space when it decodes a token alone); found once per tokenizer."""
    try:
        return _longest[tokenizer]
    except (KeyError, TypeError):
        pass
    # A byte that is not UTF-8 alone decodes to U+FFFD (three bytes): the count can only grow.
    longest = max((len(tokenizer.decode([i]).encode("utf-8", "surrogatepass"))
                   for i in range(len(tokenizer))), default=1) + 1
    try:
        _longest[tokenizer] = longest
    except TypeError:  # a tokenizer that cannot be weakly referenced: found again next time
        pass
    return longest


def fewest_tokens(tokenizer: Any, text: str) -> int:
    """A lower bound on the number of tokens `text` encodes to, found without encoding it."""
    return math.ceil(len(text) / (longest_token(tokenizer) * MARGIN))


def too_long(tokenizer: Any, text: str, context: int, what: str = "the prompt") -> str | None:
    """Why `text` cannot fit a context of `context` tokens, when that is clear without tokenizing it
    (else None: tokenize it and check the real length)."""
    if len(text) <= context:  # the bound below cannot refuse it: no need to look at the vocabulary
        return None
    fewest = fewest_tokens(tokenizer, text)
    if fewest <= context:
        return None
    return (f"{what} is {len(text)} characters long, at least {fewest} tokens, but the model's context holds "
            f"{context} (refused before tokenizing it)")
