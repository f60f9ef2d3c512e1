"""The conformance checks of kinds "composition" (mlp, self_attention, self_attention_weights,
ragged_self_attention) and "cache" (attention over a cache filled chunk by chunk equals a full prefill)."""

from __future__ import annotations

from functools import partial

import numpy as np

from inferno.conformance import reference as ref
from inferno.conformance.harness import Check, _Run, register
from inferno.conformance.ragged import (
    check_slots,
    packed_rows,
    ragged_hosts,
    ragged_output,
    row_name,
    run_ragged,
)

#: This module's checks, in the order they are added (`inferno.conformance.checks.all_checks` runs them).
CHECKS: list[Check] = []
_add = partial(register, CHECKS)

# -------------------------------------------------------------------------------------- compositions


def _mlp(run: _Run, x_shape) -> None:
    c = x_shape[-1]
    x, x64 = run.array(run.normal(x_shape))
    w_fc, w_fc64 = run.weight("h.0.mlp.c_fc.weight", run.normal((c, 4 * c), scale=c**-0.5))
    b_fc, b_fc64 = run.weight("h.0.mlp.c_fc.bias", run.normal(4 * c, scale=0.1))
    w_pr, w_pr64 = run.weight("h.0.mlp.c_proj.weight", run.normal((4 * c, c), scale=(4 * c) ** -0.5))
    b_pr, b_pr64 = run.weight("h.0.mlp.c_proj.bias", run.normal(c, scale=0.1))
    run.expect(run.backend.mlp(x, w_fc, b_fc, w_pr, b_pr), ref.mlp(x64, w_fc64, b_fc64, w_pr64, b_pr64),
               factor=2)


_add("mlp", "gpt2", "x [1, 4, 768], C 768 → 3072 → 768", _mlp, kind="composition", x_shape=(1, 4, 768))
_add("mlp", "batch-odd-C", "x [2, 3, 15], C 15 → 60 → 15", _mlp, kind="composition", x_shape=(2, 3, 15))


def _attn_weights(run: _Run, c):
    w = run.weight("h.0.attn.c_attn.weight", run.normal((c, 3 * c), scale=c**-0.5))
    b = run.weight("h.0.attn.c_attn.bias", run.normal(3 * c, scale=0.1))
    wp = run.weight("h.0.attn.c_proj.weight", run.normal((c, c), scale=c**-0.5))
    bp = run.weight("h.0.attn.c_proj.bias", run.normal(c, scale=0.1))
    return [p[0] for p in (w, b, wp, bp)], [p[1] for p in (w, b, wp, bp)]


def _self_attention(run: _Run, b, c, h, chunks, length) -> None:
    """Call self_attention on consecutive chunks of T positions, sharing one cache."""
    weights, weights64 = _attn_weights(run, c)
    kv = run.backend.new_kv_cache(b, h, length, c // h)
    k64 = v64 = None
    offset = 0
    for t in chunks:
        x, x64 = run.array(run.normal((b, t, c)))
        y, kv = run.backend.self_attention(x, *weights, kv, offset, h)
        want, k64, v64 = ref.self_attention(x64, *weights64, h, k64, v64)
        at = f"output of T={t} at offset {offset}"
        run.expect(y, want, what=at, factor=4)
        for name, cache, want_cache in (("k_cache", kv[0], k64), ("v_cache", kv[1], v64)):
            got = run.host(cache, name)[:, :, : offset + t]
            run.expect(got, want_cache, what=f"{name} positions 0..{offset + t - 1} after the {at}", factor=4)
        offset += t


_add("self_attention", "gpt2-prefill", "x [1, 6, 768], H 12, cache 16", _self_attention, kind="composition",
     b=1, c=768, h=12, chunks=[6], length=16)
_add("self_attention", "gpt2-decode", "x [1, 4, 768] then [1, 1, 768] twice, H 12, cache 8", _self_attention,
     kind="composition", b=1, c=768, h=12, chunks=[4, 1, 1], length=8)
_add("self_attention", "H3-D5-chunks", "x [2, T, 15] for T = 5, 1, 2, H 3, cache 9", _self_attention,
     kind="composition", b=2, c=15, h=3, chunks=[5, 1, 2], length=9)


def _self_attention_weights(run: _Run, b, c, h, t) -> None:
    """The optional inspection composition: self_attention's output and cache, and its weights."""
    weights, weights64 = _attn_weights(run, c)
    kv = run.backend.new_kv_cache(b, h, t, c // h)
    x, x64 = run.array(run.normal((b, t, c)))
    y, kv, got = run.backend.self_attention_weights(x, *weights, kv, 0, h)
    want, k64, _ = ref.self_attention(x64, *weights64, h)
    run.expect(y, want, what="output", factor=4)
    run.expect(run.host(kv[0], "k_cache")[:, :, :t], k64, what="k_cache", factor=4)
    q64 = ref.split_heads(ref.linear(x64, weights64[0], weights64[1]), h)[0]
    run.expect(got, ref.attention_weights(q64, k64, 0), what="weights", factor=4)


_add("self_attention_weights", "gpt2", "x [1, 6, 768], H 12, cache 6", _self_attention_weights,
     kind="composition", b=1, c=768, h=12, t=6)
_add("self_attention_weights", "H3-D5", "x [2, 7, 15], H 3, cache 7", _self_attention_weights,
     kind="composition", b=2, c=15, h=3, t=7)


def _ragged_self_attention(run: _Run, c, h, n_slots, length, rows, stale=None) -> None:
    """ragged_self_attention over `rows` = (slot, offset, T) packed in this order, the slots as
    `ragged_hosts` fills them (a slot in `stale` must give what a fresh, zeroed slot gives). Rows are
    compared with their own batch-1 attention (the float64 reference).
    """
    be, d, stale = run.backend, c // h, stale or {}
    shape = (1, h, length, d)
    weights, weights64 = _attn_weights(run, c)
    packed, start = packed_rows(rows)
    x, x64 = run.array(run.normal((1, start, c)))
    hosts = ragged_hosts(run, shape, n_slots, {r.slot: r.offset for r in packed}, stale)

    def call(slot_kv):
        y = be.ragged_self_attention(x, *weights, slot_kv, packed, h)
        return ragged_output(run, y, slot_kv, n_slots, (1, start, c), "[1, N, C]")

    got, slot_kv, k_held, v_held = run_ragged(run, call, hosts, packed, shape, stale, tokens_axis=1)
    want, k_want, v_want = ref.ragged_self_attention(
        x64, *weights64, h, [(r.slot, r.offset, r.start, r.length) for r in packed], k_held, v_held)
    for i, r in enumerate(packed):
        sl = slice(r.start, r.start + r.length)
        run.expect(got[:, sl], want[:, sl], what=f"output of {row_name(i, r, stale)}", factor=4)
    check_slots(run, slot_kv, packed, shape, stale, (k_held, v_held), (k_want, v_want))


for _case, _what, _params in [
    ("offsets", "x [1, 6, 15], H 3, 3 slots of 24: rows of 2, 3, 1 tokens at offsets 5, 11, 2",
     dict(c=15, h=3, n_slots=3, length=24, rows=[(0, 5, 2), (1, 11, 3), (2, 2, 1)])),
    ("prefill-beside-decode", "x [1, 8, 768], H 12, 3 slots of 32: a prompt of 6 at offset 0, decode "
     "steps at offsets 20 and 31 (the last position)",
     dict(c=768, h=12, n_slots=3, length=32, rows=[(0, 0, 6), (1, 20, 1), (2, 31, 1)])),
    ("chunks-beside-decode", "x [1, 10, 15], H 3, 4 slots of 16: chunks of 3 at offset 4 and 5 at 7, "
     "decode steps at 9 and 0",
     dict(c=15, h=3, n_slots=4, length=16, rows=[(0, 4, 3), (1, 9, 1), (2, 7, 5), (3, 0, 1)])),
    ("slot-reuse", "x [1, 6, 15], H 3, 3 slots of 24: a prompt of 4 at offset 0 in slot 1 over a stale "
     "sequence of 20 and one of 1 in slot 2 over a stale 10, beside a decode step at 8; as in fresh slots",
     dict(c=15, h=3, n_slots=3, length=24, rows=[(0, 8, 1), (1, 0, 4), (2, 0, 1)], stale={1: 20, 2: 10})),
    ("slots-out-of-order", "x [1, 6, 15], H 3, 5 slots of 16: rows in slots 3, 0, 2 (2 tokens at 6, 3 at "
     "0, 1 at 11); slots 1 and 4 unused, untouched",
     dict(c=15, h=3, n_slots=5, length=16, rows=[(3, 6, 2), (0, 0, 3), (2, 11, 1)])),
    ("one-row", "x [1, 4, 15], H 3, 2 slots of 12: one row of 4 tokens at offset 3 in slot 1",
     dict(c=15, h=3, n_slots=2, length=12, rows=[(1, 3, 4)])),
]:
    _add("ragged_self_attention", _case, _what, _ragged_self_attention, kind="composition", **_params)


# ------------------------------------------------------------------------------------------ KV cache


def _cached_decode(run: _Run, b, h, d, chunks, length) -> None:
    """Attention over a cache filled chunk by chunk (T=1 = token by token) equals one full prefill.

    Compared twice: with the backend's own full recompute and with the reference.
    """
    total = sum(chunks)
    q_host, k_host, v_host = (run.normal((b, h, total, d)) for _ in range(3))
    q_all, q64 = run.array(q_host)
    k_all, k64 = run.array(k_host)
    v_all, v64 = run.array(v_host)
    kv = run.backend.new_kv_cache(b, h, total, d)
    kv = run.backend.write_kv(*kv, k_all, v_all, 0)
    full = run.host(run.backend.attention(q_all, *kv, 0), "full prefill")

    k_cache, v_cache = run.backend.new_kv_cache(b, h, length, d)
    outs, offset = [], 0
    for t in chunks:
        sl = slice(offset, offset + t)
        k, _ = run.array(k_host[:, :, sl])
        v, _ = run.array(v_host[:, :, sl])
        q, _ = run.array(q_host[:, :, sl])
        k_cache, v_cache = run.backend.write_kv(k_cache, v_cache, k, v, offset)
        outs.append(run.host(run.backend.attention(q, k_cache, v_cache, offset), f"step at offset {offset}"))
        offset += t
    stepped = np.concatenate(outs, axis=2)
    run.expect(stepped, full, what="step-by-step outputs", against="the backend's own full prefill", factor=4)
    run.expect(stepped, ref.attention(q64, k64, v64, 0), what="step-by-step outputs", factor=4)


_add("kv_cache", "token-by-token", "B 2, H 3, D 5: 9 positions one at a time, cache 12", _cached_decode,
     kind="cache", b=2, h=3, d=5, chunks=[1] * 9, length=12)
_add("kv_cache", "chunked", "B 2, H 3, D 5: chunks of 4, 1, 3, 1, cache 9", _cached_decode,
     kind="cache", b=2, h=3, d=5, chunks=[4, 1, 3, 1], length=9)
_add("kv_cache", "gpt2-decode", "B 1, H 12, D 64: prefill 6, then 4 tokens, cache 16", _cached_decode,
     kind="cache", b=1, h=12, d=64, chunks=[6, 1, 1, 1, 1], length=16)

