"""GPT-2, written once against the `Backend` protocol.

    x = wte[ids] + wpe[positions]
    for each block:  x = x + attn(ln_1(x))      (causal, multi-head, KV-cached)
                     x = x + mlp(ln_2(x))       (c_fc → gelu_new → c_proj)
    logits = ln_f(x) @ wte.T                    (the LM head is tied to the token embedding)

The model holds its weights as backend arrays (converted once, here) and never touches NumPy itself,
apart from the token ids it hands to the backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from inferno.backends.base import Array, Backend, RaggedRow
from inferno.config import Gpt2Config


@dataclass
class Block:
    ln_1_g: Array
    ln_1_b: Array
    attn_w: Array
    attn_b: Array
    attn_proj_w: Array
    attn_proj_b: Array
    ln_2_g: Array
    ln_2_b: Array
    fc_w: Array
    fc_b: Array
    proj_w: Array
    proj_b: Array


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
    are simply overwritten: a row attends only to the positions it has written). In float32 a slot
    takes ``2 * n_layer * n_positions * n_embd * 4`` bytes: 72 MiB at the 124M shape.
    """

    layers: list[list[tuple[Array, Array]]]
    capacity: int

    @property
    def n_slots(self) -> int:
        return len(self.layers[0]) if self.layers else 0


def slot_bytes(config: Gpt2Config, itemsize: int = 4) -> int:
    """Bytes of KV cache one slot takes (keys and values of every layer, the whole context)."""
    return 2 * config.n_layer * config.n_positions * config.n_embd * itemsize


@dataclass
class Gpt2:
    config: Gpt2Config
    backend: Backend
    wte: Array
    wpe: Array
    blocks: list[Block]
    ln_f_g: Array
    ln_f_b: Array
    lm_head_w: Array  # wte itself unless the file carries its own lm_head.weight

    @classmethod
    def from_weights(cls, config: Gpt2Config, weights: dict[str, np.ndarray], backend: Backend) -> Gpt2:
        """Convert host weights (canonical Hub names, see `inferno.weights`) to backend arrays, once."""

        def w(name: str) -> Array:
            return backend.prepare_weight(name, weights[name])

        names = ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                 "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                 "mlp.c_proj.weight", "mlp.c_proj.bias")  # in Block's field order
        blocks = [Block(*(w(f"h.{i}.{n}") for n in names)) for i in range(config.n_layer)]
        wte = w("wte.weight")
        lm_head = w("lm_head.weight") if "lm_head.weight" in weights else wte
        return cls(config, backend, wte, w("wpe.weight"), blocks, w("ln_f.weight"), w("ln_f.bias"), lm_head)

    def new_cache(self, batch: int = 1, capacity: int | None = None) -> KvCache:
        """An empty KV cache for `batch` sequences of up to `capacity` (default n_positions) tokens."""
        capacity = self.config.n_positions if capacity is None else capacity
        c = self.config
        layers = [self.backend.new_kv_cache(batch, c.n_head, capacity, c.head_dim) for _ in range(c.n_layer)]
        return KvCache(layers, capacity)

    def new_slots(self, n_slots: int) -> KvSlots:
        """`n_slots` KV cache slots of the full context each (see `KvSlots`)."""
        c = self.config
        layers = [[self.backend.new_kv_cache(1, c.n_head, c.n_positions, c.head_dim) for _ in range(n_slots)]
                  for _ in range(c.n_layer)]
        return KvSlots(layers, c.n_positions)

    def forward_ragged(self, rows: Sequence[tuple[Sequence[int], int, int]], slots: KvSlots,
                       logits_for: Sequence[bool] | None = None) -> Array:
        """One forward step over a ragged batch: each row is (new token ids, slot, offset), the offset
        being how many tokens that slot already holds for its sequence. Rows may mix prompt chunks
        (many tokens) and decode steps (one token).

        Returns logits [R, V] of the last token of each row with `logits_for[r]` true (default: every
        row), in row order: the LM head is computed for those rows only.
        """
        be, c = self.backend, self.config
        logits_for = [True] * len(rows) if logits_for is None else list(logits_for)
        ids, positions, packed, start = [], [], [], 0
        for (tokens, slot, offset) in rows:
            n = len(tokens)
            if n == 0 or offset < 0 or offset + n > c.n_positions or not 0 <= slot < slots.n_slots:
                raise ValueError(f"row of {n} tokens at offset {offset} in slot {slot} does not fit "
                                 f"{slots.n_slots} slots of {c.n_positions} positions")
            ids.extend(tokens)
            positions.extend(range(offset, offset + n))
            packed.append(RaggedRow(slot, offset, start, n))
            start += n
        ids_a = np.asarray([ids], dtype=np.int64)
        x = be.embedding(self.wte, self.wpe, be.from_numpy(ids_a), be.from_numpy(np.asarray([positions])))
        for i, blk in enumerate(self.blocks):
            h = be.layernorm(x, blk.ln_1_g, blk.ln_1_b, c.layer_norm_epsilon)
            h = be.ragged_self_attention(h, blk.attn_w, blk.attn_b, blk.attn_proj_w, blk.attn_proj_b,
                                         slots.layers[i], packed, c.n_head)
            x = be.add(x, h)
            if i == c.n_layer - 1:
                # Only the last token of each row that is sampled goes on (see `forward`).
                last = [x[:, r.start + r.length - 1 : r.start + r.length, :]
                        for r, keep in zip(packed, logits_for, strict=True) if keep]
                if not last:
                    return be.from_numpy(np.zeros((0, c.vocab_size), dtype=np.float32))
                x = last[0] if len(last) == 1 else be.concat(last, axis=1)
            h = be.layernorm(x, blk.ln_2_g, blk.ln_2_b, c.layer_norm_epsilon)
            x = be.add(x, be.mlp(h, blk.fc_w, blk.fc_b, blk.proj_w, blk.proj_b))
        x = be.layernorm(x, self.ln_f_g, self.ln_f_b, c.layer_norm_epsilon)
        return be.lm_head(x, self.lm_head_w)[0, :, :]

    def forward(
        self, ids: np.ndarray, cache: KvCache | None = None, *, all_logits: bool = False,
        last: int | None = None,
    ) -> Array:
        """Run `ids` ([B, T] ints, or [T]) through the model, appending them to `cache`.

        Returns logits [B, V] for the last position (what generation needs), [B, last, V] for the last
        `last` positions (what scoring needs), or [B, T, V] when `all_logits`. Without a cache, a
        temporary one of exactly T positions is used.
        """
        be, c = self.backend, self.config
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim == 1:
            ids = ids[None, :]
        t = ids.shape[1]
        if last is not None and not 1 <= last <= t:
            raise ValueError(f"logits of the last {last} positions asked of {t} positions")
        keep = t if all_logits else (last or 1)
        if cache is None:
            cache = self.new_cache(ids.shape[0], t)
        offset = cache.length
        if offset + t > min(cache.capacity, c.n_positions):
            raise ValueError(f"{offset + t} positions do not fit a KV cache of {cache.capacity} "
                             f"and a context of {c.n_positions}")

        x = be.embedding(self.wte, self.wpe, be.from_numpy(ids), offset)
        for i, blk in enumerate(self.blocks):
            h = be.layernorm(x, blk.ln_1_g, blk.ln_1_b, c.layer_norm_epsilon)
            h, cache.layers[i] = be.self_attention(
                h, blk.attn_w, blk.attn_b, blk.attn_proj_w, blk.attn_proj_b, cache.layers[i], offset, c.n_head
            )
            x = be.add(x, h)
            if i == c.n_layer - 1 and keep < t:
                # Only the positions whose logits are wanted go on: past the last attention (which
                # filled the cache for every position) the others need neither the MLP nor the LM head.
                x = x[:, t - keep :, :]  # every axis indexed: the Array API requires it
            h = be.layernorm(x, blk.ln_2_g, blk.ln_2_b, c.layer_norm_epsilon)
            x = be.add(x, be.mlp(h, blk.fc_w, blk.fc_b, blk.proj_w, blk.proj_b))
        cache.length = offset + t

        if not all_logits and last is None:
            x = x[:, 0, :]
        x = be.layernorm(x, self.ln_f_g, self.ln_f_b, c.layer_norm_epsilon)
        return be.lm_head(x, self.lm_head_w)
