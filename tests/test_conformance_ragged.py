"""The conformance suite's ragged-batch checks (embedding with positions, concat, ragged_self_attention,
model-ragged) catch broken backends and name the kernel and the case; and a backend with immutable caches,
which hands new arrays back through slot_kv, passes them."""

from __future__ import annotations

import math

import numpy as np
import pytest
from backend_helpers import conformance_failures

from inferno.backends.base import RaggedRow
from inferno.backends.numpy_backend import NumpyBackend
from inferno.conformance import all_checks
from inferno.conformance import reference as ref

RAGGED = {"embedding", "concat", "ragged_self_attention", "model"}


def test_the_ragged_cases_are_registered():
    ids = {c.id for c in all_checks()}
    assert {"embedding-positions-ragged", "embedding-positions-2d", "embedding-positions-T1", "concat-axis-2",
            "concat-axis-1", "concat-single", "ragged_self_attention-offsets",
            "ragged_self_attention-prefill-beside-decode", "ragged_self_attention-chunks-beside-decode",
            "ragged_self_attention-slot-reuse", "ragged_self_attention-slots-out-of-order",
            "ragged_self_attention-one-row", "model-ragged"} <= ids
    kinds = {c.id: c.kind for c in all_checks()}
    assert kinds["ragged_self_attention-offsets"] == "composition" and kinds["model-ragged"] == "model"
    assert kinds["concat-single"] == kinds["embedding-positions-2d"] == "kernel"


# ----------------------------------------------------------------------- deliberately broken backends


class EmbeddingIgnoresPositions(NumpyBackend):
    def embedding(self, wte, wpe, ids, offset):
        return super().embedding(wte, wpe, ids, offset if isinstance(offset, int) else 0)


class EmbeddingFirstPositionOnly(NumpyBackend):
    # The positions array read as "the first token's offset" (rows assumed to be consecutive).
    def embedding(self, wte, wpe, ids, offset):
        return super().embedding(wte, wpe, ids, offset if isinstance(offset, int) else int(offset[0, 0]))


class ConcatKeepsFirst(NumpyBackend):
    def concat(self, arrays, axis):
        return arrays[0].copy()


class ConcatReversed(NumpyBackend):
    def concat(self, arrays, axis):
        return np.concatenate(arrays[::-1], axis=axis)


class _Rows(NumpyBackend):
    """Runs the default ragged_self_attention on rows rewritten by `rows`."""

    def rows(self, rows):
        return rows

    def ragged_self_attention(self, x, w_attn, b_attn, w_proj, b_proj, slot_kv, rows, n_head):
        return super().ragged_self_attention(x, w_attn, b_attn, w_proj, b_proj, slot_kv, self.rows(rows),
                                             n_head)


class RaggedIgnoresOffset(_Rows):
    def rows(self, rows):
        return [RaggedRow(r.slot, 0, r.start, r.length) for r in rows]


class RaggedRowIndexAsSlot(_Rows):
    # Row i goes to slot i: right only when the rows happen to be in slot order.
    def rows(self, rows):
        return [RaggedRow(i, r.offset, r.start, r.length) for i, r in enumerate(rows)]


class RaggedReadsStaleKeys(NumpyBackend):
    """Attends every key the slot ever held (a high-water mark, as if slots were never reused)."""

    def __init__(self):
        super().__init__()
        self.high = {}

    def ragged_self_attention(self, x, w_attn, b_attn, w_proj, b_proj, slot_kv, rows, n_head):
        q, k, v = self.split_heads(self.linear(x, w_attn, b_attn), n_head)
        ys = []
        for r in rows:
            s, e = r.start, r.start + r.length
            kc, vc = self.write_kv(*slot_kv[r.slot], k[:, :, s:e], v[:, :, s:e], r.offset)
            # The positions held so far: the stale ones the suite put there count too.
            held = int(np.flatnonzero(np.abs(kc[0, 0]).sum(-1))[-1]) + 1
            top = max(held, r.offset + r.length)
            scores = q[:, :, s:e] @ kc[:, :, :top].swapaxes(-1, -2) / math.sqrt(q.shape[3])
            mask = np.arange(top)[None, :] > (r.offset + np.arange(r.length))[:, None]
            mask &= np.arange(top)[None, :] < r.offset + r.length  # the stale tail stays visible
            scores[..., mask] = -np.inf
            ys.append(self.softmax(scores) @ vc[:, :, :top])
        y = ys[0] if len(ys) == 1 else self.concat(ys, axis=2)
        return self.linear(self.merge_heads(y), w_proj, b_proj)


class RaggedZeroesOtherSlots(NumpyBackend):
    def ragged_self_attention(self, x, w_attn, b_attn, w_proj, b_proj, slot_kv, rows, n_head):
        y = super().ragged_self_attention(x, w_attn, b_attn, w_proj, b_proj, slot_kv, rows, n_head)
        used = {r.slot for r in rows}
        for i, (k, v) in enumerate(slot_kv):
            if i not in used:
                k[...] = 0
                v[...] = 0
        return y


class ImmutableCaches(NumpyBackend):
    """write_kv returns new arrays, as an immutable array library must."""

    def write_kv(self, k_cache, v_cache, k, v, offset):
        return super().write_kv(k_cache.copy(), v_cache.copy(), k, v, offset)


class RaggedDropsNewCaches(ImmutableCaches):
    # Never puts the new arrays back into slot_kv.
    def ragged_self_attention(self, x, w_attn, b_attn, w_proj, b_proj, slot_kv, rows, n_head):
        return super().ragged_self_attention(x, w_attn, b_attn, w_proj, b_proj, list(slot_kv), rows, n_head)


class RaggedReturnsTuple(NumpyBackend):
    def ragged_self_attention(self, x, w_attn, b_attn, w_proj, b_proj, slot_kv, rows, n_head):
        y = super().ragged_self_attention(x, w_attn, b_attn, w_proj, b_proj, slot_kv, rows, n_head)
        return y, slot_kv


ATTN = {"ragged_self_attention", "model"}
BROKEN = [
    # backend, the checks that must fail (with the start of the message), kernels allowed to fail
    (EmbeddingIgnoresPositions, {"embedding-positions-ragged": "output differs",
                                 "embedding-positions-2d": "output differs",
                                 "embedding-positions-T1": "output differs",
                                 # the model's guard names the backend and the kernel
                                 "model-ragged": "raised BackendError: backend 'numpy': embedding raised "
                                                 "ValueError"}, {"embedding", "model"}),
    (EmbeddingFirstPositionOnly, {"embedding-positions-ragged": "output differs",
                                  "embedding-positions-2d": "output differs"}, {"embedding", "model"}),
    (ConcatKeepsFirst, {"concat-axis-2": "output has shape", "concat-axis-1": "output has shape"},
     {"concat", *ATTN}),
    (ConcatReversed, {"concat-axis-2": "output differs", "concat-axis-1": "output differs",
                      "ragged_self_attention-offsets": "output of row 0"}, {"concat", *ATTN}),
    (RaggedIgnoresOffset, {"ragged_self_attention-offsets": "output of row 0 (slot 0: 2 tokens at offset 5)",
                           "ragged_self_attention-one-row": "output of row 0",
                           "model-ragged": "step 2 logits [0] (row 0: sequence D"}, ATTN),
    (RaggedRowIndexAsSlot, {"ragged_self_attention-slots-out-of-order": "output of row 0 (slot 3"}, ATTN),
    (RaggedReadsStaleKeys, {"ragged_self_attention-slot-reuse":
                            "output of row 1 (slot 1: 4 tokens at offset 0 over a stale sequence of 20) "
                            "differs from the same row in a fresh (zeroed) slot",
                            "model-ragged": "step 2 logits [2] (row 2: sequence E"}, ATTN),
    (RaggedZeroesOtherSlots, {"ragged_self_attention-slots-out-of-order":
                              "k_cache of slot 1 (no row uses it) differs from its contents before the call"},
     ATTN),
    (RaggedDropsNewCaches, {"ragged_self_attention-offsets": "k_cache of slot 0 at positions 5..6",
                            "model-ragged": "step 2 logits [0]"}, ATTN),
    (RaggedReturnsTuple, {"ragged_self_attention-offsets": "returned a tuple, expected the output array"},
     ATTN),
]


@pytest.mark.parametrize("cls, must_fail, allowed", BROKEN, ids=[b[0].__name__ for b in BROKEN])
def test_broken_ragged_backend_fails_naming_the_kernel(cls, must_fail, allowed):
    # Every kernel check (the unrelated ones must pass), and the larger checks built on the broken kernel.
    failures, checks = conformance_failures(cls, allowed)
    what = {c.id: c.what for c in checks}
    for check_id, message in must_fail.items():
        assert check_id in failures, f"{cls.__name__} passed {check_id}"
        exc = failures[check_id]
        kernel, case = check_id.split("-", 1)
        assert (exc.kernel, exc.case) == (kernel, case)
        assert str(exc).startswith(f"{kernel} [{case}: {what[check_id]}]: {message}"), str(exc)
    assert {e.kernel for e in failures.values()} <= allowed, sorted(failures)


def test_immutable_caches_pass_through_slot_kv():
    be = ImmutableCaches()
    for check in all_checks(kernels=RAGGED | {"self_attention", "kv_cache"}):
        check(be)


def test_reference_ragged_is_each_row_alone():
    rng = np.random.default_rng(1)
    c, h, p = 6, 2, 10
    w, b, wp, bp = rng.standard_normal((c, 3 * c)), rng.standard_normal(3 * c), rng.standard_normal((c, c)), \
        rng.standard_normal(c)
    ks, vs = list(rng.standard_normal((2, 3, 1, h, p, c // h)))
    x = rng.standard_normal((1, 5, c))
    rows = [(2, 4, 0, 3), (0, 0, 3, 2)]  # slot, offset, start, length; slot 1 unused
    out, k2, v2 = ref.ragged_self_attention(x, w, b, wp, bp, h, rows, ks, vs)
    for slot, offset, start, length in rows:
        y, k, v = ref.self_attention(x[:, start : start + length], w, b, wp, bp, h,
                                     ks[slot][:, :, :offset], vs[slot][:, :, :offset])
        np.testing.assert_allclose(out[:, start : start + length], y, rtol=1e-12)
        np.testing.assert_array_equal(k2[slot][:, :, : offset + length], k)
        np.testing.assert_array_equal(v2[slot][:, :, offset + length :], vs[slot][:, :, offset + length :])
    np.testing.assert_array_equal(k2[1], ks[1])
    assert not np.shares_memory(k2[1], ks[1])
    pos = np.array([[3, 0, 9]])
    wte, wpe = rng.standard_normal((7, 4)), rng.standard_normal((p, 4))
    np.testing.assert_array_equal(ref.embedding(wte, wpe, np.array([[1, 2, 6]]), pos)[0, 2], wte[6] + wpe[9])


# ------------------------------------------------- the Llama family's ragged step: ragged_gqa_attention


class _GqaRows(NumpyBackend):
    """Runs the default ragged_gqa_attention on rows rewritten by `rows`."""

    def rows(self, rows):
        return rows

    def ragged_gqa_attention(self, q, k, v, slot_kv, rows):
        return super().ragged_gqa_attention(q, k, v, slot_kv, self.rows(rows))


class GqaRaggedIgnoresOffset(_GqaRows):
    def rows(self, rows):
        return [RaggedRow(r.slot, 0, r.start, r.length) for r in rows]


class GqaRaggedRowIndexAsSlot(_GqaRows):
    def rows(self, rows):
        return [RaggedRow(i, r.offset, r.start, r.length) for i, r in enumerate(rows)]


class GqaRaggedGroupsByModulo(NumpyBackend):
    """Query head h on key/value head h % Hkv (the right one is h // (H / Hkv))."""

    def ragged_gqa_attention(self, q, k, v, slot_kv, rows):
        ys = []
        for r in rows:
            s, e = r.start, r.start + r.length
            kc, vc = self.write_kv(*slot_kv[r.slot], k[:, :, s:e], v[:, :, s:e], r.offset)
            slot_kv[r.slot] = (kc, vc)
            g = q.shape[1] // kc.shape[1]
            ys.append(self.attention(q[:, :, s:e], np.tile(kc, (1, g, 1, 1)), np.tile(vc, (1, g, 1, 1)),
                                     r.offset))
        return self.concat(ys, axis=2)


class GqaRaggedReadsPastItsRow(NumpyBackend):
    """Every row attends the whole slot up to the longest row's end (a batch's mask, not each row's)."""

    def ragged_gqa_attention(self, q, k, v, slot_kv, rows):
        top = max(r.offset + r.length for r in rows)
        ys = []
        for r in rows:
            s, e = r.start, r.start + r.length
            kc, vc = self.write_kv(*slot_kv[r.slot], k[:, :, s:e], v[:, :, s:e], r.offset)
            slot_kv[r.slot] = (kc, vc)
            ys.append(self.gqa_attention(q[:, :, s:e], kc, vc, top - r.length))
        return self.concat(ys, axis=2)


class GqaRaggedZeroesOtherSlots(NumpyBackend):
    def ragged_gqa_attention(self, q, k, v, slot_kv, rows):
        y = super().ragged_gqa_attention(q, k, v, slot_kv, rows)
        used = {r.slot for r in rows}
        for i, (kc, vc) in enumerate(slot_kv):
            if i not in used:
                kc[...] = 0
                vc[...] = 0
        return y


class GqaRaggedDropsNewCaches(ImmutableCaches):
    def ragged_gqa_attention(self, q, k, v, slot_kv, rows):
        return super().ragged_gqa_attention(q, k, v, list(slot_kv), rows)


class GqaRaggedReturnsTuple(NumpyBackend):
    def ragged_gqa_attention(self, q, k, v, slot_kv, rows):
        return super().ragged_gqa_attention(q, k, v, slot_kv, rows), slot_kv


GQA = {"ragged_gqa_attention", "model"}
GQA_BROKEN = [
    (GqaRaggedIgnoresOffset, {"ragged_gqa_attention-smollm2-decode": "output of row 0 (slot 0: 1 tokens at "
                                                                     "offset 20)",
                              "ragged_gqa_attention-one-row": "output of row 0",
                              "model-llama-ragged": "step 2 logits"}),
    (GqaRaggedRowIndexAsSlot, {"ragged_gqa_attention-chunks-odd-D": "output of row 0 (slot 3",
                               "ragged_gqa_attention-prompt-beside-decode": "output of row 0 (slot 1"}),
    # (model-llama-ragged's qwen3 has one key/value head, where h % 1 == h // H: it cannot tell.)
    (GqaRaggedGroupsByModulo, {"ragged_gqa_attention-smollm2-decode": "output of row 0",
                               "ragged_gqa_attention-prompt-beside-decode": "output of row 0"}),
    (GqaRaggedReadsPastItsRow, {"ragged_gqa_attention-smollm2-decode": "output of row 0",
                                "ragged_gqa_attention-ratio-1-slot-reuse": "output of row 1 (slot 1: 4 "
                                "tokens at offset 0 over a stale sequence of 20) differs from the same row "
                                "in a fresh (zeroed) slot",
                                "model-llama-ragged": "step 1 logits"}),
    (GqaRaggedZeroesOtherSlots, {"ragged_gqa_attention-chunks-odd-D":
                                 "k_cache of slot 2 (no row uses it) differs from its contents before the "
                                 "call"}),
    (GqaRaggedDropsNewCaches, {"ragged_gqa_attention-smollm2-decode": "k_cache of slot 0 at positions 20..20",
                               "model-llama-ragged": "step 2 logits"}),
    (GqaRaggedReturnsTuple, {"ragged_gqa_attention-one-row": "returned a tuple, expected the output array"}),
]


@pytest.mark.parametrize("cls, must_fail", GQA_BROKEN, ids=[b[0].__name__ for b in GQA_BROKEN])
def test_broken_ragged_gqa_attention_fails_naming_the_kernel(cls, must_fail):
    test_broken_ragged_backend_fails_naming_the_kernel(cls, must_fail, GQA)


def test_immutable_caches_pass_through_ragged_gqa_attention():
    for check in all_checks(kernels={"ragged_gqa_attention"}):
        check(ImmutableCaches())


def test_reference_ragged_gqa_is_each_row_alone():
    rng = np.random.default_rng(2)
    h, kv, d, p = 6, 2, 4, 10
    q, k, v = rng.standard_normal((1, h, 5, d)), *rng.standard_normal((2, 1, kv, 5, d))
    ks, vs = list(rng.standard_normal((2, 3, 1, kv, p, d)))
    rows = [(2, 4, 0, 3), (0, 0, 3, 2)]  # slot, offset, start, length; slot 1 unused
    out, k2, v2 = ref.ragged_gqa_attention(q, k, v, rows, ks, vs)
    for slot, offset, start, length in rows:
        sl = slice(start, start + length)
        kk = np.concatenate([ks[slot][:, :, :offset], k[:, :, sl]], axis=2)
        vv = np.concatenate([vs[slot][:, :, :offset], v[:, :, sl]], axis=2)
        want = ref.attention(q[:, :, sl], np.repeat(kk, h // kv, axis=1), np.repeat(vv, h // kv, axis=1),
                             offset)
        np.testing.assert_allclose(out[:, :, sl], want, rtol=1e-12)
        np.testing.assert_array_equal(k2[slot][:, :, : offset + length], kk)
        np.testing.assert_array_equal(v2[slot][:, :, offset + length :], vs[slot][:, :, offset + length :])
    np.testing.assert_array_equal(k2[1], ks[1])
    assert not np.shares_memory(k2[1], ks[1])
