"""Automatic prefix caching: which token ids each KV slot holds, indexed by chained block hashes.

A slot's keys and values stay valid after its sequence ends, until the slot is overwritten, so the
engine remembers which token ids each slot holds and indexes them by a chained hash of blocks of
`prefix_block` tokens (as vLLM does). A new sequence reuses the longest cached prefix of its prompt, in
whole blocks (`Engine._take_slot` decides whether in place or by a copy).

A prompt scored as it is prefilled (`prompt_logprobs`, the server's echo) needs the logprob of every
one of its tokens, the cached ones too, so the index also keeps, per slot, the prompt logprobs a scored
prefill computed for the tokens it holds (with the number of alternatives they carry): a scored prompt
reuses a prefix only as far as they reach, instead of prefilling it again for its logits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from inferno.options import TokenLogprob


def block_hashes(tokens: Sequence[int], block: int, start: int = 0, prev: int | None = None) -> list[int]:
    """The chained hashes of the whole blocks of `tokens` from block `start` on (`prev`: the hash of the
    block before it): block i's hash covers every token up to the end of block i, as vLLM's do."""
    out = []
    for i in range(start, len(tokens) // block):
        prev = hash((prev, tuple(tokens[i * block : (i + 1) * block])))
        out.append(prev)
    return out


class PrefixIndex:
    """Which token ids each KV slot holds, and an index from block hashes to the slots holding them.

    `tokens[s]` are the ids whose keys and values slot s holds at positions 0 .. len - 1 (written by a
    finished step); `hashes[s]` the chained hashes of its whole blocks; `slots_of[h]` the slots whose
    content starts with the prefix of hash h. `scores[s][i]` is the logprob of `tokens[s][i + 1]` (given
    the tokens before it) with `tops[s]` alternatives, for as many tokens as a scored prefill reached."""

    def __init__(self, n_slots: int, block: int) -> None:
        self.block = block
        self.tokens: list[list[int]] = [[] for _ in range(n_slots)]
        self.hashes: list[list[int]] = [[] for _ in range(n_slots)]
        self.slots_of: dict[int, set[int]] = {}
        self.scores: list[list[TokenLogprob]] = [[] for _ in range(n_slots)]
        self.tops: list[int] = [0] * n_slots

    def truncate(self, slot: int, n: int) -> None:
        """Slot `slot` holds only its first `n` tokens from now on (the rest will be overwritten)."""
        del self.tokens[slot][n:]
        del self.scores[slot][max(n - 1, 0):]
        keep = n // self.block
        for h in self.hashes[slot][keep:]:
            holders = self.slots_of[h]
            holders.discard(slot)
            if not holders:
                del self.slots_of[h]
        del self.hashes[slot][keep:]

    def write(self, slot: int, offset: int, tokens: Sequence[int]) -> None:
        """Slot `slot` now holds `tokens` at positions offset .. offset + len - 1 (and nothing after)."""
        self.truncate(slot, offset)
        held = self.tokens[slot]
        held.extend(tokens)
        hashes = self.hashes[slot]
        new = block_hashes(held, self.block, len(hashes), hashes[-1] if hashes else None)
        for h in new:
            self.slots_of.setdefault(h, set()).add(slot)
        hashes.extend(new)

    def set_scores(self, slot: int, scores: Sequence[TokenLogprob], top: int) -> None:
        """The prompt logprobs of slot `slot`'s tokens 1 .. (as many as it holds of them), with `top`
        alternatives each."""
        self.scores[slot] = list(scores[: max(len(self.tokens[slot]) - 1, 0)])
        self.tops[slot] = top

    def cached_scores(self, slot: int, n: int, top: int) -> list[TokenLogprob] | None:
        """The logprobs of tokens 1 .. n of slot `slot` with `top` alternatives each, if a scored prefill
        left them (None if not)."""
        if len(self.scores[slot]) < n or self.tops[slot] < top:
            return None
        out = self.scores[slot][:n]
        if self.tops[slot] > top:  # the top N are the first N of a longer top list (same order)
            out = [TokenLogprob(t.id, t.logprob, t.top[:top]) for t in out]
        return out

    def longest(self, prompt: Sequence[int], prefer: Iterable[int] = (),
                scored: int | None = None) -> tuple[int, int]:
        """(slot, tokens) of the longest cached prefix of `prompt` in whole blocks; (-1, 0) if none. Among
        slots holding as much, one of `prefer` (free slots: reused without a copy) wins. With `scored`
        (a number of alternatives), only slots with the logprobs of the prefix's tokens but its first
        count (see `cached_scores`)."""
        best, n, prefer = -1, 0, list(prefer)
        for i, h in enumerate(block_hashes(prompt, self.block)):
            holders = self.slots_of.get(h)
            # Hashes may collide: the ids themselves decide.
            end = (i + 1) * self.block
            holders = [s for s in holders or () if self.tokens[s][:end] == list(prompt[:end])
                       and (scored is None or (len(self.scores[s]) >= end - 1 and self.tops[s] >= scored))]
            if not holders:
                break
            best = next((s for s in prefer if s in holders), min(holders))
            n = end
        return best, n

