"""The slots of a ragged call (`ragged_self_attention`, `ragged_gqa_attention`), as their conformance checks
fill, call and check them: each used slot holds a past and garbage after it, a stale slot an earlier
sequence, an unused one values that must stay; each row is compared with its own batch-1 reference."""

from __future__ import annotations

import numpy as np

from inferno.backends.base import RaggedRow
from inferno.conformance.harness import _Run

_KV = {"k_cache": "keys", "v_cache": "values"}


def ragged_slots(run: _Run, hosts):
    """Backend slots (a list of (k_cache, v_cache), each [1, H, P, D]) holding the host contents `hosts`,
    and the float64 values they hold."""
    be = run.backend
    slot_kv, k64, v64 = [], [], []
    for k_host, v_host in hosts:
        _, h, length, d = k_host.shape
        kv = be.new_kv_cache(1, h, length, d)
        kv = be.write_kv(*kv, be.from_numpy(k_host), be.from_numpy(v_host), 0)
        slot_kv.append(tuple(kv))
        k64.append(np.array(run.host(kv[0], "k_cache"), dtype=np.float64))  # a copy: writes are in place
        v64.append(np.array(run.host(kv[1], "v_cache"), dtype=np.float64))
    return slot_kv, k64, v64


def ragged_hosts(run: _Run, shape, n_slots, offsets, stale):
    """The host contents of `n_slots` slots of `shape` [1, Hkv, P, D] for a ragged call: a used slot
    ({slot: offset} in `offsets`) holds a past at 0 .. offset - 1 and large garbage from offset on (that
    the row must overwrite or ignore); a slot in `stale` ({slot: n}) an earlier sequence of n positions,
    then zeros; an unused one random values that must stay."""
    _, h, _, d = shape
    hosts = []
    for slot in range(n_slots):
        kv = []
        for _ in "kv":
            if slot in stale:
                a = np.zeros(shape, np.float32)
                a[:, :, : stale[slot]] = run.normal((1, h, stale[slot], d))
            elif slot in offsets:
                a = run.normal(shape, scale=100.0)
                a[:, :, : offsets[slot]] = run.normal((1, h, offsets[slot], d))
            else:
                a = run.normal(shape)
            kv.append(a)
        hosts.append(tuple(kv))
    return hosts


def packed_rows(rows):
    """(slot, offset, T) rows as RaggedRows packed in this order, and their total tokens."""
    packed, start = [], 0
    for slot, offset, t in rows:
        packed.append(RaggedRow(slot, offset, start, t))
        start += t
    return packed, start


def row_name(i, r, stale):
    old = f" over a stale sequence of {stale[r.slot]}" if r.slot in stale else ""
    return f"row {i} (slot {r.slot}: {r.length} tokens at offset {r.offset}{old})"


def run_ragged(run: _Run, call, hosts, packed, shape, stale, tokens_axis):
    """`call(slot_kv)` on slots holding `hosts`; with `stale` slots, each of their rows' outputs compared
    with the same call on fresh (zeroed) slots. Returns (output on the host, slot_kv after the call, the
    float64 keys and values the slots held before it)."""
    slot_kv, k_held, v_held = ragged_slots(run, hosts)
    got = call(slot_kv)
    if stale:
        fresh = [(np.zeros(shape, np.float32),) * 2 if slot in stale else kv for slot, kv in enumerate(hosts)]
        got_fresh = call(ragged_slots(run, fresh)[0])
        for i, r in enumerate(packed):
            if r.slot in stale:
                sl = [slice(None)] * got.ndim
                sl[tokens_axis] = slice(r.start, r.start + r.length)
                run.expect(got[tuple(sl)], got_fresh[tuple(sl)], what=f"output of {row_name(i, r, stale)}",
                           against="the same row in a fresh (zeroed) slot")
    return got, slot_kv, k_held, v_held


def check_slots(run: _Run, slot_kv, packed, shape, stale, held, wanted) -> None:
    """Each slot after a ragged call: a used one holds its row's new keys/values (`wanted`) at the row's
    positions and what it `held` elsewhere; an unused one is untouched."""
    rows_of = {r.slot: (i, r) for i, r in enumerate(packed)}
    for slot in range(len(held[0])):
        entry = slot_kv[slot]
        if not isinstance(entry, tuple | list) or len(entry) != 2:
            run.fail(f"slot_kv[{slot}] is a {type(entry).__name__}, expected a pair (k_cache, v_cache)")
        for j, name in enumerate(("k_cache", "v_cache")):
            cache = run.host(entry[j], f"{name} of slot {slot}")
            if cache.shape != shape:
                run.fail(f"{name} of slot {slot} has shape {list(cache.shape)}, expected {list(shape)}")
            if slot not in rows_of:
                run.expect(cache, held[j][slot], what=f"{name} of slot {slot} (no row uses it)",
                           against="its contents before the call")
                continue
            i, r = rows_of[slot]
            new = np.zeros(shape[2], dtype=bool)
            new[r.offset : r.offset + r.length] = True
            span = f"positions {r.offset}..{r.offset + r.length - 1}"
            run.expect(cache[:, :, new], wanted[j][slot][:, :, new], factor=4,
                       what=f"{name} of slot {slot} at {span} (the new {_KV[name]} of "
                            f"{row_name(i, r, stale)})")
            run.expect(cache[:, :, ~new], held[j][slot][:, :, ~new], against="its contents before the call",
                       what=f"{name} of slot {slot} outside {span}")


def ragged_output(run: _Run, y, slot_kv, n_slots: int, shape: tuple, dims: str) -> np.ndarray:
    """A ragged call's output on the host, after checking it is one array of `shape` (named `dims`, as
    "[1, N, C]") and that slot_kv is still a list of `n_slots` slots."""
    if isinstance(y, tuple | list):
        run.fail(f"returned a {type(y).__name__}, expected the output array {dims} alone (the caches go back "
                 "into slot_kv)")
    if not isinstance(slot_kv, list) or len(slot_kv) != n_slots:
        run.fail(f"slot_kv is no longer a list of {n_slots} slots")
    got = run.host(y, "output")
    if got.shape != shape:
        run.fail(f"output has shape {list(got.shape)}, expected {list(shape)}")
    return got
