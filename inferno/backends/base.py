"""The `Backend` protocol: the kernels GPT-2 and the Llama family are written against.

Every kernel takes backend arrays and returns backend arrays, contiguous and row-major (weights are in
the layout the backend's own `prepare_weight` chose). A backend owns its array type: host NumPy arrays
cross the boundary only through `from_numpy` (weights at load, token ids) and `to_numpy` (the logits of
the position being sampled). Batch is the leading dimension everywhere.

Shapes use B = batch, T = query positions in this call, L = positions in the KV cache, C = n_embd,
H = n_head, D = C // H (head size), V = vocabulary size, P = n_positions.

A backend implements the abstract kernels below. The Llama family's kernels (`embed_tokens`, `heads`,
`rms_norm`, `rotary`, `silu_mul`, `gqa_attention`) came later: each has a default built from the
abstract ones (and the host), so a backend written for GPT-2 alone runs them too, slower; a backend
overrides them to run them natively. The *compositions* at the end (`mlp`, `gated_mlp`,
`self_attention`) are written in terms of the kernels; a faster backend may override them to fuse work,
and the conformance suite checks overrides against the same float64 reference as the kernels. Two
optional methods serve looking inside the model (`inferno.inspect`), never generation:
`attention_weights` and `self_attention_weights`, whose defaults compute the weights on the host.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from inferno.errors import (  # noqa: F401 - a backend's errors, importable beside its protocol
    BackendError,
    BackendOptionError,
    BackendUnavailableError,
    one_line,
    squash,
)

#: A backend's own array type (numpy.ndarray, torch.Tensor, an Array API array, ...).
Array = Any


@dataclass(frozen=True)
class RaggedRow:
    """One sequence of a ragged batch: `length` tokens packed from index `start` of the batch, sitting at
    positions ``offset .. offset + length - 1`` of KV slot `slot` (`offset` = the tokens it already holds)."""

    slot: int
    offset: int
    start: int
    length: int


class Backend(ABC):
    """Abstract compute backend. Subclass it, implement every abstract method, register it by name."""

    #: Registry name, e.g. "numpy". Lower case, no spaces.
    name: ClassVar[str] = ""
    #: One line for `inferno backends`.
    description: ClassVar[str] = ""

    #: The floating dtype the backend computes in, as a NumPy dtype (for tolerances in the conformance suite).
    dtype: np.dtype = np.dtype(np.float32)

    # ----------------------------------------------------------------------------------------- boundary

    @abstractmethod
    def from_numpy(self, a: np.ndarray) -> Array:
        """Host → backend. Floating arrays become the backend's compute dtype; integer arrays stay integer."""

    @abstractmethod
    def to_numpy(self, a: Array) -> np.ndarray:
        """Backend → host, as a NumPy array (float32 for floating data)."""

    def prepare_weight(self, name: str, a: np.ndarray) -> Array:
        """Convert one weight at load time. `name` is the Hub key, e.g. ``h.0.mlp.c_fc.weight``.

        The default is `from_numpy`. A backend that wants weights in another layout (pre-split blocks,
        a packed format) overrides this; it runs once per tensor at load, never per call.
        """
        return self.from_numpy(a)

    def weight_order(self, name: str) -> str:
        """The memory order `prepare_weight` wants the host weight `name` in: "C" (row-major, as stored
        in the file; the default) or "F" (column-major). The loader reads straight into that order, so
        a backend that keeps some weights transposed costs no second copy at load."""
        return "C"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """None when the backend can run here; otherwise one line saying why not (missing library...).

        Called by `inferno backends` for the status column, without constructing the backend.
        """
        return None

    @classmethod
    def runs_on(cls) -> str:
        """What executes the kernels here, in a few words, for `inferno backends`' "runs on" column:
        "NumPy (BLAS)", "compiled C (AVX-512, OpenMP)", "NumPy fallback (C kernels not built)". A backend
        with compiled code says whether it runs it or a fallback. Called without constructing it."""
        return ""

    def close(self) -> None:  # noqa: B027 (optional hook, deliberately empty)
        """Release resources (worker pools, device memory). The default has none."""

    # ------------------------------------------------------------------------------------------ kernels

    @abstractmethod
    def linear(self, x: Array, w: Array, b: Array | None) -> Array:
        """``x @ w + b``. x: [..., IN]; w: [IN, OUT] (the Hub's Conv1D layout); b: [OUT] or None.

        Returns [..., OUT].
        """

    @abstractmethod
    def gelu_new(self, x: Array) -> Array:
        """GPT-2's tanh GELU: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, elementwise."""

    @abstractmethod
    def layernorm(self, x: Array, gamma: Array, beta: Array, eps: float) -> Array:
        """Layer norm over the last axis: ``(x - mean) / sqrt(var + eps) * gamma + beta``.

        x: [..., C]; gamma, beta: [C]; var is the biased (population) variance.
        """

    @abstractmethod
    def softmax(self, x: Array) -> Array:
        """Softmax over the last axis, stable for large magnitudes (subtract the row maximum)."""

    @abstractmethod
    def add(self, a: Array, b: Array) -> Array:
        """Elementwise ``a + b`` of two arrays of the same shape (the residual connection)."""

    @abstractmethod
    def embedding(self, wte: Array, wpe: Array, ids: Array, offset: int | Array) -> Array:
        """Token plus absolute position embedding.

        wte: [V, C]; wpe: [P, C]; ids: [B, T] integer (from `from_numpy`). `offset` is an int: the
        tokens sit at positions ``offset .. offset + T - 1`` and the result is
        ``wte[ids] + wpe[offset : offset + T]``; or an integer array of each token's position, shaped
        like `ids` (a ragged batch packs rows at different positions): ``wte[ids] + wpe[offset]``.
        Returns [B, T, C].
        """

    @abstractmethod
    def concat(self, arrays: Sequence[Array], axis: int) -> Array:
        """Join arrays along `axis` (the ragged batch joins its rows' attention outputs)."""

    @abstractmethod
    def split_heads(self, qkv: Array, n_head: int) -> tuple[Array, Array, Array]:
        """Split the fused c_attn output into heads.

        qkv: [B, T, 3C] laid out as [q | k | v]. Returns q, k, v, each [B, H, T, D].
        """

    @abstractmethod
    def merge_heads(self, y: Array) -> Array:
        """[B, H, T, D] → [B, T, C] (heads concatenated along the last axis)."""

    @abstractmethod
    def new_kv_cache(self, batch: int, n_head: int, length: int, head_dim: int) -> tuple[Array, Array]:
        """Allocate one layer's key and value cache, each [B, H, L, D], zero-filled."""

    @abstractmethod
    def write_kv(
        self, k_cache: Array, v_cache: Array, k: Array, v: Array, offset: int
    ) -> tuple[Array, Array]:
        """Store k, v ([B, H, T, D]) at positions ``offset .. offset + T - 1`` of the cache.

        Returns the caches to use from now on: mutable backends write in place and return the same
        arrays; immutable array libraries may return new ones.
        """

    @abstractmethod
    def attention(self, q: Array, k_cache: Array, v_cache: Array, offset: int) -> Array:
        """Causal scaled dot-product attention for queries at positions ``offset .. offset + T - 1``.

        q: [B, H, T, D]; k_cache, v_cache: [B, H, L, D] with positions ``0 .. offset + T - 1`` valid
        (anything beyond is ignored). Query i attends keys ``0 .. offset + i``, scores scaled by
        1/sqrt(D). Returns [B, H, T, D]. One kernel serves prefill (offset 0, T = prompt length) and
        cached decode (T = 1 over the whole cache).
        """

    @abstractmethod
    def lm_head(self, x: Array, wte: Array) -> Array:
        """Logits with the LM head tied to the token embedding: ``x @ wte.T``.

        x: [..., C]; wte: [V, C] as stored (do not materialise a transposed copy). Returns [..., V].
        """

    # -------------------------------------------- the Llama family's kernels: each has a default (below)
    #
    # A backend written before these existed runs the Llama family with the defaults: `heads`,
    # `embed_tokens` and `gqa_attention` are composed exactly from the kernels above; `rms_norm`,
    # `rotary` and `silu_mul` go to the host and back (`to_numpy`, float64 arithmetic, `from_numpy`), so
    # they are slower and rounded through float32. Shapes: Hkv = key/value heads (H a multiple of it).

    def embed_tokens(self, wte: Array, ids: Array) -> Array:
        """Token embedding without positions: ``wte[ids]``. wte: [V, C]; ids: [B, T] integer. Returns
        [B, T, C]. Default: `embedding` with an all-zero position table."""
        t, c = ids.shape[-1], wte.shape[-1]
        return self.embedding(wte, self.from_numpy(np.zeros((t, c), dtype=np.float32)), ids, 0)

    def heads(self, x: Array, n_head: int) -> Array:
        """[B, T, H*D] → [B, H, T, D] (the projection of one of q, k, v split into its heads). Default:
        `split_heads` of x three times over, keeping the first third."""
        return self.split_heads(self.concat([x, x, x], axis=-1), n_head)[0]

    def rms_norm(self, x: Array, gamma: Array, eps: float) -> Array:
        """RMS norm over the last axis: ``x / sqrt(mean(x²) + eps) * gamma``. x: [..., N]; gamma: [N]."""
        h = np.asarray(self.to_numpy(x), dtype=np.float64)
        g = np.asarray(self.to_numpy(gamma), dtype=np.float64)
        return self.from_numpy(h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + eps) * g)

    def rotary(self, x: Array, cos: Array, sin: Array) -> Array:
        """Rotary position embedding, rotating the two halves of each head (transformers' rotate_half):
        ``[x1 cos - x2 sin, x2 cos + x1 sin]`` with x1, x2 = the first and second D/2 values. x: [B, H, T,
        D]; cos, sin: [T, D/2], the angles of each query's position (float, from `from_numpy`)."""
        h = np.asarray(self.to_numpy(x), dtype=np.float64)
        c = np.asarray(self.to_numpy(cos), dtype=np.float64)
        s = np.asarray(self.to_numpy(sin), dtype=np.float64)
        x1, x2 = h[..., : h.shape[-1] // 2], h[..., h.shape[-1] // 2 :]
        return self.from_numpy(np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1))

    def silu_mul(self, gate: Array, up: Array) -> Array:
        """The gated MLP's activation: ``silu(gate) * up``, silu(g) = g / (1 + exp(-g)), elementwise."""
        g = np.asarray(self.to_numpy(gate), dtype=np.float64)
        u = np.asarray(self.to_numpy(up), dtype=np.float64)
        return self.from_numpy(g * (0.5 + 0.5 * np.tanh(0.5 * g)) * u)  # the sigmoid, without overflow

    def gqa_attention(self, q: Array, k_cache: Array, v_cache: Array, offset: int) -> Array:
        """`attention` with fewer key/value heads than query heads (grouped-query attention): query head h
        reads key/value head ``h // (H // Hkv)``. q: [B, H, T, D]; k_cache, v_cache: [B, Hkv, L, D].
        Returns [B, H, T, D]. Default: `attention` once per member of a group (the query heads
        ``j, j + r, j + 2r ...``, r = H // Hkv, each on its own key/value head), the heads put back in
        order with `concat`."""
        n_head, n_kv = q.shape[1], k_cache.shape[1]
        r = n_head // n_kv
        if r == 1:
            return self.attention(q, k_cache, v_cache, offset)
        ys = [self.attention(q[:, j::r, :, :], k_cache, v_cache, offset) for j in range(r)]
        return self.concat([ys[h % r][:, h // r : h // r + 1, :, :] for h in range(n_head)], axis=1)

    def linears(self, x: Array, weights: Sequence[Array], biases: Sequence[Array | None]) -> list[Array]:
        """`linear` of one input by several weights (the projections that read the same input: the Llama
        family's q, k and v): ``[linear(x, w, b) for w, b in zip(weights, biases)]``, each [..., its out].
        Default: exactly that; a backend may run them as one product (x read once, one parallel loop)."""
        return [self.linear(x, w, b) for w, b in zip(weights, biases, strict=True)]

    def ragged_gqa_attention(
        self, q: Array, k: Array, v: Array, slot_kv: list[tuple[Array, Array]], rows: Sequence[RaggedRow]
    ) -> Array:
        """`gqa_attention` over a ragged batch (as `ragged_self_attention` packs it), the new keys and
        values written first: q [1, H, N, D] (rotated), k and v [1, Hkv, N, D], row r's tokens at ``r.start
        .. r.start + r.length - 1`` sitting at positions ``r.offset ..`` of slot ``r.slot``; slot_kv: this
        layer's (k_cache, v_cache) per slot, each [1, Hkv, P, D]. Writes each row's keys and values into
        its slot (replacing the entry of `slot_kv` when the backend returns new arrays) and returns
        [1, H, N, D]: each row's queries attending its own slot only. Default: `write_kv` and
        `gqa_attention` once per row, as a batch of one, the rows put back together with `concat`."""
        ys = []
        for r in rows:
            s, e = r.start, r.start + r.length
            k_cache, v_cache = self.write_kv(*slot_kv[r.slot], k[:, :, s:e, :], v[:, :, s:e, :], r.offset)
            slot_kv[r.slot] = (k_cache, v_cache)
            ys.append(self.gqa_attention(q[:, :, s:e, :], k_cache, v_cache, r.offset))
        return ys[0] if len(ys) == 1 else self.concat(ys, axis=2)

    # ------------------------------------------------------------------------ optional: looking inside

    def attention_weights(self, q: Array, k_cache: Array, offset: int) -> np.ndarray:
        """The softmax weights `attention` applies, for looking inside the model (`inferno.inspect`).

        q: [B, H, T, D] at positions ``offset .. offset + T - 1``; k_cache: [B, H, L, D] with positions
        ``0 .. offset + T - 1`` valid. Returns a host NumPy float32 array [B, H, T, S], S = offset + T:
        row i is query i's weights over keys ``0 .. S - 1``, exactly 0 past key ``offset + i``, summing
        to 1. The weights are reported, never computed on, so they come back on the host in float32
        whatever the compute dtype.

        Optional: the default reads q and the valid keys back with `to_numpy` and computes the causal
        softmax in float64 on the host, so every backend has it. Only inspection calls it; generation,
        scoring and the engine never do.
        """
        q64 = np.asarray(self.to_numpy(q), dtype=np.float64)
        t, d = q64.shape[2], q64.shape[3]
        s = offset + t
        k64 = np.asarray(self.to_numpy(k_cache), dtype=np.float64)[:, :, :s, :]
        scores = q64 @ k64.swapaxes(-1, -2) / np.sqrt(d)
        # Query i sits at position offset + i and may not see keys after it.
        scores[..., np.triu(np.ones((t, s), dtype=bool), k=offset + 1)] = -np.inf
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        return scores.astype(np.float32)

    # ------------------------------------------------------------------------------------- compositions

    def mlp(self, x: Array, w_fc: Array, b_fc: Array, w_proj: Array, b_proj: Array) -> Array:
        """The transformer MLP: ``linear(gelu_new(linear(x, w_fc, b_fc)), w_proj, b_proj)``.

        x: [B, T, C]; w_fc: [C, 4C]; w_proj: [4C, C]. Returns [B, T, C].
        """
        return self.linear(self.gelu_new(self.linear(x, w_fc, b_fc)), w_proj, b_proj)

    def gated_mlp(self, x: Array, w_gate: Array, w_up: Array, w_down: Array) -> Array:
        """The Llama family's MLP: ``linear(silu_mul(linear(x, w_gate), linear(x, w_up)), w_down)``, no
        biases. x: [B, T, C]; w_gate, w_up: [C, I]; w_down: [I, C]. Returns [B, T, C]."""
        gated = self.silu_mul(self.linear(x, w_gate, None), self.linear(x, w_up, None))
        return self.linear(gated, w_down, None)

    def self_attention(
        self,
        x: Array,
        w_attn: Array,
        b_attn: Array,
        w_proj: Array,
        b_proj: Array,
        kv: tuple[Array, Array],
        offset: int,
        n_head: int,
    ) -> tuple[Array, tuple[Array, Array]]:
        """Multi-head causal self-attention with a KV cache.

        x: [B, T, C] (already layer-normed); w_attn: [C, 3C]; w_proj: [C, C]; kv: this layer's
        (k_cache, v_cache); the T new positions start at `offset`. Returns ([B, T, C], updated kv).
        """
        q, k, v = self.split_heads(self.linear(x, w_attn, b_attn), n_head)
        k_cache, v_cache = self.write_kv(kv[0], kv[1], k, v, offset)
        y = self.merge_heads(self.attention(q, k_cache, v_cache, offset))
        return self.linear(y, w_proj, b_proj), (k_cache, v_cache)

    def self_attention_weights(
        self,
        x: Array,
        w_attn: Array,
        b_attn: Array,
        w_proj: Array,
        b_proj: Array,
        kv: tuple[Array, Array],
        offset: int,
        n_head: int,
    ) -> tuple[Array, tuple[Array, Array], np.ndarray]:
        """`self_attention` that also returns its attention weights: (output [B, T, C], updated kv,
        host float32 weights [B, H, T, offset + T] as `attention_weights` gives them).

        Optional, for looking inside the model (`inferno.inspect`): the default runs the composition of
        `self_attention` and takes the weights from its q and keys with `attention_weights`. A backend
        that fuses attention may override it to return the weights its own kernel computed.
        """
        q, k, v = self.split_heads(self.linear(x, w_attn, b_attn), n_head)
        k_cache, v_cache = self.write_kv(kv[0], kv[1], k, v, offset)
        y = self.merge_heads(self.attention(q, k_cache, v_cache, offset))
        weights = self.attention_weights(q, k_cache, offset)
        return self.linear(y, w_proj, b_proj), (k_cache, v_cache), weights

    def ragged_self_attention(
        self,
        x: Array,
        w_attn: Array,
        b_attn: Array,
        w_proj: Array,
        b_proj: Array,
        slot_kv: list[tuple[Array, Array]],
        rows: Sequence[RaggedRow],
        n_head: int,
    ) -> Array:
        """`self_attention` over a ragged batch: sequences at different positions packed in one array.

        x: [1, N, C], the rows' tokens one after another (row r holds ``x[:, r.start : r.start +
        r.length]``); slot_kv: this layer's (k_cache, v_cache) per KV slot, each [1, H, P, D]; row r's
        tokens sit at positions ``r.offset ..`` of slot ``r.slot`` and attend that slot only. Writes
        each row's keys and values into its slot (replacing the entry of `slot_kv` when the backend
        returns new arrays) and returns [1, N, C].

        The default runs the projections once over all N tokens and `write_kv` plus `attention` once
        per row, exactly as a batch of one would.
        """
        q, k, v = self.split_heads(self.linear(x, w_attn, b_attn), n_head)
        ys = []
        for r in rows:
            s, e = r.start, r.start + r.length
            k_cache, v_cache = slot_kv[r.slot]
            k_cache, v_cache = self.write_kv(k_cache, v_cache, k[:, :, s:e, :], v[:, :, s:e, :], r.offset)
            slot_kv[r.slot] = (k_cache, v_cache)
            ys.append(self.attention(q[:, :, s:e, :], k_cache, v_cache, r.offset))
        y = ys[0] if len(ys) == 1 else self.concat(ys, axis=2)
        return self.linear(self.merge_heads(y), w_proj, b_proj)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
