"""The KV cache: keys and values of every layer, allocated by the backend and written in place.

`KvCache` serves one batch of sequences (batch-1 generation, scoring); `KvSlots` a fixed number of
slots that the continuous-batching engine hands to one sequence after another.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferno.backends.base import Array
from inferno.config import Gpt2Config


@dataclass
class KvCache:
    """Keys and values of every layer for `length` positions, room for `capacity`."""

    layers: list[tuple[Array, Array]]
    capacity: int
    length: int = 0


@dataclass
class KvSlots:
    """A fixed number of KV cache slots, each holding one sequence of up to n_positions tokens.

    ``layers[i][slot]`` is layer i's (k_cache, v_cache) of that slot, each [1, H, P, D], allocated once;
    a slot is taken by a sequence and given back for the next without reallocating (its old contents
    are simply overwritten: a row attends only to the positions it has written). A slot takes
    `slot_bytes` of memory.
    """

    layers: list[list[tuple[Array, Array]]]
    capacity: int

    @property
    def n_slots(self) -> int:
        return len(self.layers[0]) if self.layers else 0


def slot_bytes(config: Gpt2Config, itemsize: int = 4) -> int:
    """Bytes of KV cache one slot takes (keys and values of every layer, the whole context)."""
    return 2 * config.n_layer * config.n_positions * config.n_embd * itemsize


def new_cache(kernels, config: Gpt2Config, batch: int = 1, capacity: int | None = None) -> KvCache:
    """An empty KV cache for `batch` sequences of up to `capacity` (default n_positions) tokens, from
    `kernels` (a `CheckedBackend`, which checks the shapes the backend returns)."""
    capacity = config.n_positions if capacity is None else capacity
    c = config
    layers = [kernels.new_kv_cache(batch, c.n_head, capacity, c.head_dim) for _ in range(c.n_layer)]
    return KvCache(layers, capacity)


def new_slots(kernels, config: Gpt2Config, n_slots: int) -> KvSlots:
    """`n_slots` KV cache slots of the full context each (see `KvSlots`)."""
    c = config
    layers = [[kernels.new_kv_cache(1, c.n_head, c.n_positions, c.head_dim) for _ in range(n_slots)]
              for _ in range(c.n_layer)]
    return KvSlots(layers, c.n_positions)
