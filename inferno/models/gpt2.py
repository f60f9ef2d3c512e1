"""GPT-2, written once against the `Backend` protocol.

    x = wte[ids] + wpe[positions]
    for each block:  x = x + attn(ln_1(x))      (causal, multi-head, KV-cached)
                     x = x + mlp(ln_2(x))       (c_fc → gelu_new → c_proj)
    logits = ln_f(x) @ wte.T                    (the LM head is tied to the token embedding)

Weights are backend arrays (converted once, at load); NumPy holds only the token ids. Every kernel call
goes through `CheckedBackend`, so a backend's failure or garbage is an error naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from inferno.backends.base import Array, Backend
from inferno.backends.checked import CheckedBackend, NonFiniteLogitsError  # noqa: F401 - raised from here
from inferno.kv import (  # noqa: F401
    KvCache,
    KvSlots,
    forward_start,
    last_tokens,
    new_cache,
    new_slots,
    pack_rows,
    slot_bytes,
)
from inferno.models import weights
from inferno.models.config import Gpt2Config

#: A block's weights under their Hub names (after ``h.{i}.``), in `Block`'s field order.
BLOCK_WEIGHTS = ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                 "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                 "mlp.c_proj.weight", "mlp.c_proj.bias")


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
class Gpt2:
    config: Gpt2Config
    backend: Backend
    wte: Array
    wpe: Array
    blocks: list[Block]
    ln_f_g: Array
    ln_f_b: Array
    lm_head_w: Array  # wte itself unless the file carries its own lm_head.weight
    kernels: CheckedBackend = field(default=None, repr=False, compare=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.kernels is None:
            self.kernels = CheckedBackend(self.backend, self.config.n_embd, self.config.vocab_size)

    @classmethod
    def from_weights(cls, config: Gpt2Config,
                     weights: Mapping[str, np.ndarray] | Iterable[tuple[str, np.ndarray]],
                     backend: Backend) -> Gpt2:
        """Host weights (Hub names, a dict or (name, array) pairs) to backend arrays, once: each converted
        as it arrives and let go, so a backend keeping its own copy never holds all the float32 ones."""
        kernels = CheckedBackend(backend, config.n_embd, config.vocab_size)
        pairs = weights.items() if isinstance(weights, Mapping) else weights
        w = {name: kernels.prepare_weight(name, host) for name, host in pairs}  # one host array at a time
        blocks = [Block(*(w[f"h.{i}.{n}"] for n in BLOCK_WEIGHTS)) for i in range(config.n_layer)]
        lm_head = w.get("lm_head.weight", w["wte.weight"])  # a missing weight is a KeyError naming it
        return cls(config, backend, w["wte.weight"], w["wpe.weight"], blocks, w["ln_f.weight"],
                   w["ln_f.bias"], lm_head, kernels)

    def named_weights(self) -> Iterator[tuple[str, Array]]:
        """Every weight the model holds, under its Hub name (``lm_head.weight`` only when not tied)."""
        yield "wte.weight", self.wte
        yield "wpe.weight", self.wpe
        for i, blk in enumerate(self.blocks):
            for name, a in zip(BLOCK_WEIGHTS, vars(blk).values(), strict=True):
                yield f"h.{i}.{name}", a
        yield from (("ln_f.weight", self.ln_f_g), ("ln_f.bias", self.ln_f_b))
        if self.lm_head_w is not self.wte:
            yield "lm_head.weight", self.lm_head_w

    def new_cache(self, batch: int = 1, capacity: int | None = None) -> KvCache:  # capacity: n_positions
        return new_cache(self.kernels, self.config, batch, capacity)

    def new_slots(self, n_slots: int) -> KvSlots:  # of the full context each (see `KvSlots`)
        return new_slots(self.kernels, self.config, n_slots)

    def check_logits(self, logits: np.ndarray, rows: int = 1) -> np.ndarray:  # [rows, V], finite
        return self.kernels.check_logits(logits, rows, self)

    def _blocks(self, be, x: Array, attend: Callable, keep: Callable) -> Array | None:  # keep: the last
        for i in range(len(self.blocks) - 1):
            x = self.block(be, i, x, attend)
        return self.block(be, len(self.blocks) - 1, x, attend, keep)

    def block(self, be, i: int, x: Array, attend: Callable[[int, Block, Array], Array],
              keep: Callable[[Array], Array | None] = lambda x: x) -> Array | None:
        """Block i: ``x + attn(ln_1(x))``, then ``+ mlp(ln_2(x))``; `attend(i, block, h)` is the attention,
        `keep(x)` the positions whose logits are wanted (the rest need no MLP), or None (also for inspect)."""
        blk, eps = self.blocks[i], self.config.layer_norm_epsilon
        if (x := keep(be.add(x, attend(i, blk, be.layernorm(x, blk.ln_1_g, blk.ln_1_b, eps))))) is None:
            return None
        h = be.layernorm(x, blk.ln_2_g, blk.ln_2_b, eps)
        return be.add(x, be.mlp(h, blk.fc_w, blk.fc_b, blk.proj_w, blk.proj_b))

    def embed(self, be, ids: np.ndarray) -> Array:
        """The embedding of ids [B, T] at positions 0 .. T - 1: block 0's input (for inspect)."""
        return be.embedding(self.wte, self.wpe, be.from_numpy(np.asarray(ids, dtype=np.int64)), 0)

    def attention_layer(self, be, i: int, h: Array, cache: KvCache, offset: int, weights: bool = False
                        ) -> Array | tuple[Array, np.ndarray]:
        """Block i's attention at `offset`, into `cache`; with `weights` also [B, H, T, offset + T]."""
        blk = self.blocks[i]
        args = (h, blk.attn_w, blk.attn_b, blk.attn_proj_w, blk.attn_proj_b, cache.layers[i], offset,
                self.config.n_head)
        if not weights:
            out, cache.layers[i] = be.self_attention(*args)
            return out
        out, cache.layers[i], w = be.self_attention_weights(*args)
        return out, w

    def logits(self, be, x: Array) -> Array:  # ln_f, then the LM head (inspect reads every layer so)
        return be.lm_head(be.layernorm(x, self.ln_f_g, self.ln_f_b, self.config.layer_norm_epsilon),
                          self.lm_head_w)

    def forward(self, ids: np.ndarray, cache: KvCache | None = None, *, all_logits: bool = False,
                last: int | None = None) -> Array:
        """Run `ids` ([B, T] ints, or [T]) through the model, appending them to `cache` (without one, a
        temporary cache of T positions). Logits [B, V] of the last position (generation), [B, last, V]
        (scoring), or [B, T, V] with `all_logits`."""
        be = self.kernels.kernels("forward")
        ids, cache, offset, keep = forward_start(self, ids, cache, last, all_logits)
        t = ids.shape[1]

        def attend(i: int, blk: Block, h: Array) -> Array:
            return self.attention_layer(be, i, h, cache, offset)

        def kept(x: Array) -> Array:  # every axis indexed: the Array API requires it
            return x if keep == t else x[:, t - keep :, :]

        x = self._blocks(be, be.embedding(self.wte, self.wpe, be.from_numpy(ids), offset), attend, kept)
        cache.length = offset + t
        return self.logits(be, x if all_logits or last is not None else x[:, 0, :])

    def forward_ragged(self, rows: Sequence[tuple[Sequence[int], int, int]], slots: KvSlots,
                       logits_for: Sequence[int] | None = None) -> Array:
        """One step over a ragged batch of rows (new token ids, slot, offset: the tokens that slot holds),
        prompt chunks and decode steps mixed. Logits of the last `logits_for[r]` tokens of each row (True:
        its last; default: all rows' last), in row order: the LM head runs for those positions only."""
        be, c = self.kernels.kernels("forward_ragged"), self.config
        logits_for = [True] * len(rows) if logits_for is None else list(logits_for)
        ids, positions, packed = pack_rows(rows, slots)

        def attend(i: int, blk: Block, h: Array) -> Array:
            return be.ragged_self_attention(h, blk.attn_w, blk.attn_b, blk.attn_proj_w, blk.attn_proj_b,
                                            slots.layers[i], packed, c.n_head)

        def kept(x: Array) -> Array | None:  # the last token of each row that is sampled
            return last_tokens(be, x, packed, logits_for)

        x = be.embedding(self.wte, self.wpe, be.from_numpy(np.asarray([ids], dtype=np.int64)),
                         be.from_numpy(np.asarray([positions])))
        x = self._blocks(be, x, attend, kept)
        if x is None:
            return be.from_numpy(np.zeros((0, c.vocab_size), dtype=np.float32))
        return self.logits(be, x)[0, :, :]


# ---- the family's entry points (families.py): config, weights one tensor at a time, the model
config_from_file = Gpt2Config.from_file
from_weights = Gpt2.from_weights
iter_weights = weights.iter_checkpoint  # the model.safetensors or its folder
header_problems = weights.header_problems  # a downloaded header checked before the weights come
