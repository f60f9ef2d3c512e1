"""The KV cache: keys and values of every layer, allocated by the backend and written in place.

`KvCache` serves one batch of sequences (batch-1 generation, scoring); `KvSlots` a fixed number of
slots that the continuous-batching engine hands to one sequence after another.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from inferno.backends.base import Array, RaggedRow


class CacheShape(Protocol):
    """What sizes a KV cache: a model config (`Gpt2Config`, `LlamaConfig`)."""

    n_layer: int
    n_positions: int

    @property
    def n_kv_head(self) -> int: ...

    @property
    def head_dim(self) -> int: ...


@dataclass
class KvCache:
    """Keys and values of every layer for `length` positions, room for `capacity`."""

    layers: list[tuple[Array, Array]]
    capacity: int
    length: int = 0


@dataclass
class KvSlots:
    """A fixed number of KV cache slots, each holding one sequence of up to n_positions tokens.

    ``layers[i][slot]`` is layer i's (k_cache, v_cache) of that slot, each [1, H, P, D] (H: the key and
    value heads, fewer than the query heads under grouped-query attention), allocated once;
    a slot is taken by a sequence and given back for the next without reallocating (its old contents
    are simply overwritten: a row attends only to the positions it has written). A slot takes
    `slot_bytes` of memory.
    """

    layers: list[list[tuple[Array, Array]]]
    capacity: int

    @property
    def n_slots(self) -> int:
        return len(self.layers[0]) if self.layers else 0


def slot_bytes(config: CacheShape, itemsize: int = 4) -> int:
    """Bytes of KV cache one slot takes (keys and values of every layer, the whole context)."""
    return 2 * config.n_layer * config.n_positions * config.n_kv_head * config.head_dim * itemsize


def new_cache(kernels, config: CacheShape, batch: int = 1, capacity: int | None = None) -> KvCache:
    """An empty KV cache for `batch` sequences of up to `capacity` (default n_positions) tokens, from
    `kernels` (a `CheckedBackend`, which checks the shapes the backend returns)."""
    capacity = config.n_positions if capacity is None else capacity
    c = config
    layers = [kernels.new_kv_cache(batch, c.n_kv_head, capacity, c.head_dim) for _ in range(c.n_layer)]
    return KvCache(layers, capacity)


def forward_start(model, ids, cache: KvCache | None, last: int | None,
                  all_logits: bool) -> tuple[np.ndarray, KvCache, int, int]:
    """What a model's `forward` starts from: `ids` as [B, T] int64, the cache it appends to (without one,
    `model.new_cache` of T positions), the offset it writes at, and how many of the last positions it
    keeps for the logits. ValueError for a `last` outside 1 .. T, or positions past the cache or context."""
    ids = np.atleast_2d(np.asarray(ids, dtype=np.int64))
    t = ids.shape[1]
    if last is not None and not 1 <= last <= t:
        raise ValueError(f"logits of the last {last} positions asked of {t} positions")
    if cache is None:
        cache = model.new_cache(ids.shape[0], t)
    offset, context = cache.length, model.config.n_positions
    if offset + t > min(cache.capacity, context):
        raise ValueError(f"{offset + t} positions do not fit a KV cache of {cache.capacity} "
                         f"and a context of {context}")
    return ids, cache, offset, t if all_logits else (last or 1)


def new_slots(kernels, config: CacheShape, n_slots: int) -> KvSlots:
    """`n_slots` KV cache slots of the full context each (see `KvSlots`)."""
    c = config
    layers = [[kernels.new_kv_cache(1, c.n_kv_head, c.n_positions, c.head_dim) for _ in range(n_slots)]
              for _ in range(c.n_layer)]
    return KvSlots(layers, c.n_positions)


def pack_rows(rows: Sequence[tuple[Sequence[int], int, int]], slots: KvSlots
              ) -> tuple[list[int], list[int], list[RaggedRow]]:
    """A ragged step's rows (new token ids, slot, offset) as one row of ids, their positions, and where
    each row sits in it; a row that does not fit its slot is a ValueError."""
    ids: list[int] = []
    positions: list[int] = []
    packed: list[RaggedRow] = []
    for tokens, slot, offset in rows:
        n = len(tokens)
        if n == 0 or offset < 0 or offset + n > slots.capacity or not 0 <= slot < slots.n_slots:
            raise ValueError(f"row of {n} tokens at offset {offset} in slot {slot} does not fit "
                             f"{slots.n_slots} slots of {slots.capacity} positions")
        packed.append(RaggedRow(slot, offset, len(ids), n))
        ids.extend(tokens)
        positions.extend(range(offset, offset + n))
    return ids, positions, packed


def last_tokens(be, x: Array, packed: Sequence[RaggedRow], wanted: Sequence[int]) -> Array | None:
    """The last `wanted[r]` positions of each packed row r (a bool: its last position or none; an int n:
    its last n, as a scored prompt's chunk needs), from x [1, T, C]: [1, sum(wanted), C], or None."""
    last = [x[:, r.start + r.length - int(w) : r.start + r.length, :]
            for r, w in zip(packed, wanted, strict=True) if w]
    return None if not last else last[0] if len(last) == 1 else be.concat(last, axis=1)
