"""The float64 reference the conformance suite checks backends against.

Written straight from the definitions in `inferno.backends.base`, for clarity over speed, and
independently of the NumPy backend (which is itself checked against it). Every function takes and
returns float64 NumPy arrays.
"""

from __future__ import annotations

import math

import numpy as np


def f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def linear(x, w, b=None):
    y = f64(x) @ f64(w)
    return y if b is None else y + f64(b)


def gelu_new(x):
    x = f64(x)
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def layernorm(x, gamma, beta, eps):
    x = f64(x)
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # biased, and in two passes
    return (x - mean) / np.sqrt(var + eps) * f64(gamma) + f64(beta)


def softmax(x):
    x = f64(x)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def embedding(wte, wpe, ids, offset):
    """`offset` an int: positions offset .. offset + T - 1; or an integer array shaped like `ids`: each
    token's own position (a ragged batch)."""
    if not isinstance(offset, int | np.integer):
        return f64(wte)[ids] + f64(wpe)[np.asarray(offset)]
    t = ids.shape[-1]
    return f64(wte)[ids] + f64(wpe)[offset : offset + t]


def split_heads(qkv, n_head):
    """[B, T, 3C] as [q | k | v] → three [B, H, T, D]."""
    qkv = f64(qkv)
    b, t, c3 = qkv.shape
    c = c3 // 3
    d = c // n_head
    parts = qkv[..., :c], qkv[..., c : 2 * c], qkv[..., 2 * c :]
    return tuple(p.reshape(b, t, n_head, d).transpose(0, 2, 1, 3) for p in parts)


def merge_heads(y):
    y = f64(y)
    b, h, t, d = y.shape
    return y.transpose(0, 2, 1, 3).reshape(b, t, h * d)


def attention(q, k, v, offset):
    """Causal attention of queries at positions offset.. over keys/values 0 .. offset + T - 1.

    k, v may be longer than offset + T (a cache): the extra positions are ignored.
    """
    q = f64(q)
    t, d = q.shape[2], q.shape[3]
    s = offset + t
    k, v = f64(k)[:, :, :s], f64(v)[:, :, :s]
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(d)
    visible = np.arange(s)[None, :] <= (offset + np.arange(t))[:, None]  # [T, S]
    return softmax(np.where(visible, scores, -np.inf)) @ v


def attention_weights(q, k, offset):
    """The softmax weights [B, H, T, offset + T] of `attention` (the keys past offset + T ignored)."""
    q = f64(q)
    t, d = q.shape[2], q.shape[3]
    s = offset + t
    scores = q @ f64(k)[:, :, :s].swapaxes(-1, -2) / math.sqrt(d)
    visible = np.arange(s)[None, :] <= (offset + np.arange(t))[:, None]  # [T, S]
    return softmax(np.where(visible, scores, -np.inf))


def lm_head(x, wte):
    return f64(x) @ f64(wte).T


def mlp(x, w_fc, b_fc, w_proj, b_proj):
    return linear(gelu_new(linear(x, w_fc, b_fc)), w_proj, b_proj)


def self_attention(x, w_attn, b_attn, w_proj, b_proj, n_head, k_past=None, v_past=None):
    """Self-attention of x (positions offset.., offset = the past's length) after a past of keys/values.

    Returns (output [B, T, C], k, v) where k, v [B, H, offset + T, D] include the past.
    """
    q, k, v = split_heads(linear(x, w_attn, b_attn), n_head)
    offset = 0
    if k_past is not None:
        offset = k_past.shape[2]
        k, v = np.concatenate([f64(k_past), k], axis=2), np.concatenate([f64(v_past), v], axis=2)
    y = merge_heads(attention(q, k, v, offset))
    return linear(y, w_proj, b_proj), k, v


def ragged_self_attention(x, w_attn, b_attn, w_proj, b_proj, n_head, rows, k_slots, v_slots):
    """`self_attention` of a ragged batch, row by row, each row over its own slot only.

    x: [1, N, C]; rows: (slot, offset, start, length) tuples; k_slots, v_slots: per slot
    [1, H, P, D]. Row r is the batch-1 self-attention of ``x[:, start : start + length]`` after the past
    ``k_slots[slot][:, :, :offset]`` (anything past it, stale or not, is ignored). Returns (output
    [1, N, C], k_slots, v_slots) with copies of the slots holding each row's new keys/values at positions
    offset .. offset + length - 1.
    """
    x = f64(x)
    out = np.zeros(x.shape[:2] + (w_proj.shape[-1],))
    k_slots, v_slots = [f64(k).copy() for k in k_slots], [f64(v).copy() for v in v_slots]
    for row in rows:
        slot, offset, start, length = row
        end = start + length
        k_past, v_past = k_slots[slot][:, :, :offset], v_slots[slot][:, :, :offset]
        y, k, v = self_attention(x[:, start:end], w_attn, b_attn, w_proj, b_proj, n_head, k_past, v_past)
        out[:, start:end] = y
        k_slots[slot][:, :, offset : offset + length] = k[:, :, offset:]
        v_slots[slot][:, :, offset : offset + length] = v[:, :, offset:]
    return out, k_slots, v_slots


# ---------------------------------------------------------------------------- the Llama family's kernels


def embed_tokens(wte, ids):
    return f64(wte)[np.asarray(ids)]


def heads(x, n_head):
    """[B, T, H*D] → [B, H, T, D]."""
    x = f64(x)
    b, t, c = x.shape
    return x.reshape(b, t, n_head, c // n_head).transpose(0, 2, 1, 3)


def rms_norm(x, gamma, eps):
    x = f64(x)
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * f64(gamma)


def rotary(x, cos, sin):
    """transformers' rotate_half convention: the first and second halves of each head are the pairs."""
    x = f64(x)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = f64(cos), f64(sin)
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def silu_mul(gate, up):
    gate = f64(gate)
    with np.errstate(over="ignore"):  # exp(-gate) overflows to inf for very negative gates: silu is then -0
        return gate / (1.0 + np.exp(-gate)) * f64(up)


def gqa_attention(q, k, v, offset):
    """`attention` with each key/value head repeated for its H // Hkv query heads."""
    r = q.shape[1] // k.shape[1]
    return attention(q, np.repeat(f64(k), r, axis=1), np.repeat(f64(v), r, axis=1), offset)


def ragged_gqa_attention(q, k, v, rows, k_slots, v_slots):
    """`gqa_attention` of a ragged batch, row by row, each row over its own slot only: q [1, H, N, D], k
    and v [1, Hkv, N, D]; rows: (slot, offset, start, length); k_slots, v_slots: per slot [1, Hkv, P, D].
    Row r's queries attend its slot's past ``:offset`` (anything after it ignored) and its own new keys
    and values. Returns (output [1, H, N, D], copies of the slots holding each row's new keys/values)."""
    q, k, v = f64(q), f64(k), f64(v)
    out = np.zeros(q.shape)
    k_slots, v_slots = [f64(a).copy() for a in k_slots], [f64(a).copy() for a in v_slots]
    for slot, offset, start, length in rows:
        end = start + length
        k_slots[slot][:, :, offset : offset + length] = k[:, :, start:end]
        v_slots[slot][:, :, offset : offset + length] = v[:, :, start:end]
        out[:, :, start:end] = gqa_attention(q[:, :, start:end], k_slots[slot][:, :, : offset + length],
                                             v_slots[slot][:, :, : offset + length], offset)
    return out, k_slots, v_slots


def gated_mlp(x, w_gate, w_up, w_down):
    return linear(silu_mul(linear(x, w_gate), linear(x, w_up)), w_down)
