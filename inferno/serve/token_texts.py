"""Token texts as the API writes them in ``logprobs`` and ``/v1/inspect``, and the logprob floor.

A token's text is its bytes as UTF-8; a token that is not valid UTF-8 on its own (part of a multi-byte
character) is written ``bytes:`` followed by ``\\xNN`` for each byte, as OpenAI's API wrote them
(``bytes:\\xe2\\x80``), so that no two tokens share a text. Log-probabilities below -9999 (-inf) are
reported as -9999, as vLLM does: JSON has no infinity.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from inferno.tokenizer import Tokenizer

#: The floor of reported log-probabilities (as vLLM's): JSON has no -inf (nor NaN, which lands here too).
MIN_LOGPROB = -9999.0


def _token_bytes(tokenizer: Tokenizer) -> Callable[[int], bytes]:
    # The tokenizer has no public id → bytes accessor yet; prefer one if it grows it.
    return getattr(tokenizer, "token_bytes", None) or tokenizer._token_bytes


def token_text(raw: bytes) -> str:
    """A token's text as logprobs show it: its UTF-8 text, or ``bytes:\\xNN...`` if it is not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


class TokenTexts:
    """Every token id's text (see `token_text`), computed once per model."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        get = _token_bytes(tokenizer)
        texts, raw = [], []
        for i in range(tokenizer.vocab_size):
            try:
                raw.append(get(i))
                texts.append(token_text(raw[-1]))
            except ValueError:  # an id no token uses (a sparse vocabulary): never sampled or accepted
                raw.append(b"")
                texts.append(f"token_id:{i}")
        self._texts = texts
        self._bytes = raw

    def __getitem__(self, i: int) -> str:
        return self._texts[i]

    def bytes_of(self, i: int) -> bytes:
        """The token's bytes (empty for an id no token uses)."""
        return self._bytes[i]

    def __len__(self) -> int:
        return len(self._texts)


def clamp_logprob(value: float) -> float:
    return value if value > MIN_LOGPROB else MIN_LOGPROB


def top_entries(texts: TokenTexts, chosen: int, chosen_lp: float, top: Sequence[tuple[int, float]] | None,
                ) -> dict[str, float]:
    """A token's ``top_logprobs`` (text → logprob): the top N, plus the chosen token when not among them,
    with the very float of its ``token_logprobs``."""
    out = {texts[i]: clamp_logprob(lp) for i, lp in top or ()}
    out.setdefault(texts[chosen], clamp_logprob(chosen_lp))
    return out


def top_ids(chosen: int, top: Sequence[tuple[int, float]] | None) -> list[int]:
    """The ids of `top_entries`'s entries, in its order (texts are unique per id, so the two lists pair)."""
    out = [i for i, _ in top or ()]
    if chosen not in out:
        out.append(chosen)
    return out
