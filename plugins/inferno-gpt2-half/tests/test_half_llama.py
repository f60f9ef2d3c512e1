"""inferno-gpt2-half's Llama-family kernels: `rms_norm`, `rotary` and `silu_mul` in C on every SIMD path
this CPU can run (AVX-512, AVX2 + FMA, portable C), `gqa_attention` in one C call that reads each group's
key/value head in place, a ragged step's `ragged_gqa_attention` in one C call, the Llama family's matrices
kept in 16 or 8 bits, and a random Llama-family model run on them with no default of the base class
called."""

from __future__ import annotations

import numpy as np
import pytest
from inferno.backends.base import Backend
from inferno.backends.numpy_backend import NumpyBackend
from inferno.conformance import reference as ref

import inferno_half.backend as hb
from inferno_half import HalfBackend

KERNELS = ("embed_tokens", "heads", "rms_norm", "rotary", "silu_mul", "gqa_attention")
needs_kernels = pytest.mark.skipif(hb._KERNELS is None, reason="the C kernels are not built")


@pytest.fixture(params=["avx512", "avx2", "portable"])
def simd(request):
    """Each test on one SIMD path of the kernels, skipped (saying which feature is missing) where the CPU
    cannot run it."""
    kernels = hb._KERNELS
    if kernels is None:
        pytest.skip("the C kernels are not built")
    if request.param == "avx512" and kernels.simd() != 2:
        pytest.skip("this CPU has no AVX-512 (avx512f, avx512bw, avx512vl and avx512dq)")
    if request.param == "avx2" and kernels.force_avx2(1) != 1:
        kernels.force_avx2(0)
        pytest.skip("this CPU has no AVX2 + FMA + F16C")
    if request.param == "portable":
        assert kernels.force_portable(1) == 0
    try:
        yield request.param
    finally:
        kernels.force_portable(0)


@pytest.fixture
def no_defaults(monkeypatch):
    refuse_defaults(monkeypatch)


def refuse_defaults(monkeypatch) -> None:
    """The base class's Llama kernels (host float64 round trips, attention per group member) and the
    NumPy versions `HalfBackend` would fall back to all raise."""
    for kernel in KERNELS:
        def refuse(*args, _kernel=kernel, **kwargs):
            raise AssertionError(f"the inherited {_kernel} was called")
        monkeypatch.setattr(Backend, kernel, refuse)
        if kernel != "heads":  # NumPy's heads is a view: the half backend's own
            monkeypatch.setattr(NumpyBackend, kernel, refuse)


def close(got, want, rtol=1e-5):
    """float32 arithmetic against float64: a few roundings."""
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * float(np.abs(want).max()))


@pytest.mark.parametrize(("shape", "scale", "eps"), [
    ((2, 4, 576), 1.0, 1e-5),      # SmolLM2's hidden size
    ((1, 2, 35), 30.0, 1e-6),      # odd: the scalar tails
    ((2, 3, 64), 3e-3, 1e-5),      # eps ~ mean square
    ((3, 100), 1.0, 1e-6),         # 2-D
])
def test_rms_norm_in_c_matches_float64(simd, no_defaults, shape, scale, eps):
    rng = np.random.default_rng(shape[-1])
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    g = (1 + 0.2 * rng.standard_normal(shape[-1])).astype(np.float32)
    close(HalfBackend().rms_norm(x, g, eps), ref.rms_norm(x, g, eps))


def test_rms_norm_reads_the_heads_view_in_place(simd, no_defaults):
    # Qwen3's q/k norm normalises each head of the [B, H, T, D] view of a projection (not contiguous).
    rng = np.random.default_rng(1)
    be = HalfBackend()
    x = rng.standard_normal((2, 3, 4 * 128)).astype(np.float32) * 4
    g = (1 + 0.2 * rng.standard_normal(128)).astype(np.float32)
    view = be.heads(x, 4)
    assert not view.flags.c_contiguous
    out = np.empty(view.shape, np.float32)
    assert hb._KERNELS.rms_norm(view, g, 1e-6, out)  # taken as it is, not copied by a fallback
    close(be.rms_norm(view, g, 1e-6), ref.rms_norm(ref.heads(x, 4), g, 1e-6))


@pytest.mark.parametrize(("d", "positions", "theta"), [
    (64, range(5), 1e4),
    (128, range(8190, 8194), 5e5),     # positions past 4096
    (6, [0, 7, 4100, 3], 1e4),         # D/2 odd: the scalar tail only
    (40, [3], 1e4),                    # one SIMD block and a tail
])
def test_rotary_in_c_matches_float64_on_the_heads_view(simd, no_defaults, d, positions, theta):
    rng = np.random.default_rng(d)
    be = HalfBackend()
    t, h = len(positions), 3
    x = rng.standard_normal((2, t, h * d)).astype(np.float32)
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    angles = np.asarray(positions, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = be.from_numpy(np.cos(angles)), be.from_numpy(np.sin(angles))
    q = be.heads(x, h)  # [2, h, t, d], strided
    got = be.rotary(q, cos, sin)
    assert got.flags.c_contiguous
    close(got, ref.rotary(ref.heads(x, h), cos, sin))


@pytest.mark.parametrize(("shape", "scale"), [((1, 4, 1536), 3.0), ((2, 3, 40), 100.0), ((17,), 10.0)])
def test_silu_mul_in_c_matches_float64(simd, no_defaults, shape, scale):
    rng = np.random.default_rng(shape[-1])
    gate = (rng.standard_normal(shape) * scale).astype(np.float32)  # N(0, 100²): exp(-gate) overflows
    up = rng.standard_normal(shape).astype(np.float32)
    got = HalfBackend().silu_mul(gate, up)
    assert np.isfinite(got).all()
    close(got, ref.silu_mul(gate, up))


class _Counting:
    """The compiled kernels, counting the calls of each function."""

    def __init__(self, kernels):
        self._kernels, self.calls = kernels, []

    def __getattr__(self, name):
        fn = getattr(self._kernels, name)
        return lambda *a: self.calls.append(name) or fn(*a)


def _in_one_call(monkeypatch, name, run):
    """What `run()` returns, checking that it made one call of the compiled kernels, `name`."""
    counting = _Counting(hb._KERNELS)
    monkeypatch.setattr(hb, "_KERNELS", counting)
    out = run()
    assert [c for c in counting.calls if c != "simd"] == [name]
    return out


@pytest.mark.parametrize(("b", "h", "kv", "t", "d", "offset", "length"), [
    (2, 3, 3, 4, 8, 2, 9),          # ratio 1
    (1, 9, 3, 5, 64, 0, 8),         # ratio 3, SmolLM2's heads
    (2, 6, 2, 1, 16, 11, 16),       # decode
    (1, 8, 1, 3, 7, 4, 10),         # ratio 8, odd head size (the portable loop)
    (1, 14, 2, 2, 64, 5, 9),        # ratio 7, Qwen2.5-0.5B's heads
    (1, 4, 2, 3, 16, 4100, 4104),   # past 4096 keys (the scores on the heap)
])
def test_gqa_attention_is_one_c_call_over_the_groups(simd, no_defaults, monkeypatch, b, h, kv, t, d, offset,
                                                      length):
    counting = _Counting(hb._KERNELS)
    monkeypatch.setattr(hb, "_KERNELS", counting)
    rng = np.random.default_rng(h * 10 + d)
    k = rng.standard_normal((b, kv, length, d)).astype(np.float32)
    v = rng.standard_normal((b, kv, length, d)).astype(np.float32)
    k[:, :, offset + t :] = np.nan  # past the valid positions: never read
    q = rng.standard_normal((b, h, t, d)).astype(np.float32)
    got = HalfBackend(threads=2).gqa_attention(q, k, v, offset)
    s = offset + t
    close(got, ref.gqa_attention(q, k[:, :, :s], v[:, :, :s], offset), rtol=2e-5)
    assert counting.calls == ["attention"]


@pytest.mark.parametrize(("h", "kv", "d", "offset"), [
    (9, 3, 64, 0),      # SmolLM2's heads, a fresh prompt
    (14, 2, 64, 37),    # Qwen2.5-0.5B's, after a cached prefix
    (6, 6, 16, 5),      # ratio 1
    (8, 1, 32, 0),      # ratio 8
    (6, 2, 24, 3),      # a head size that is not a multiple of 16: no tiles (AVX2: in C)
    (6, 2, 12, 3),      # nor of 8: NumPy's on every path
])
def test_gqa_attention_of_a_long_prompt(simd, monkeypatch, h, kv, d, offset):
    # Beyond SMALL_M queries: in C on the AVX-512 path in tiles of queries (head sizes a multiple of 16)
    # and on AVX2 a query at a time (multiples of 8), else NumPy's own gqa_attention (one batched matmul
    # over the groups, BLAS), never the base class's attention per group member.
    monkeypatch.setattr(Backend, "gqa_attention", lambda *a: (_ for _ in ()).throw(AssertionError("default")))
    in_c = (simd == "avx512" and d % 16 == 0) or (simd == "avx2" and d % 8 == 0)
    if in_c:  # NumPy's must not run: the C kernel does it all
        monkeypatch.setattr(NumpyBackend, "gqa_attention",
                            lambda *a: (_ for _ in ()).throw(AssertionError("numpy's")))
    counting = _Counting(hb._KERNELS)
    monkeypatch.setattr(hb, "_KERNELS", counting)
    rng = np.random.default_rng(h * 100 + d + offset)
    t = hb.SMALL_M + 37
    s = offset + t
    q = rng.standard_normal((2, h, t, d)).astype(np.float32)
    k, v = (rng.standard_normal((2, kv, s + 5, d)).astype(np.float32) for _ in range(2))
    k[:, :, s:] = np.nan  # past the valid positions: never read
    v[:, :, s:] = np.nan
    got = HalfBackend(threads=2).gqa_attention(q, k, v, offset)
    close(got, ref.gqa_attention(q, k[:, :, :s], v[:, :, :s], offset), rtol=2e-5)
    assert [c for c in counting.calls if c != "simd"] == (["attention"] if in_c else [])


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "int8", "q4"])
@pytest.mark.parametrize(("m", "c", "inner"), [(1, 64, 96), (5, 64, 160), (70, 32, 64), (3, 40, 50)])
def test_gated_mlp_is_one_c_call_with_the_bits_of_its_three(simd, monkeypatch, fmt, m, c, inner):
    # The fused call runs the same products and silu_mul as the composition (Backend.gated_mlp: gate and
    # up products, silu_mul, the down product, each its own C call), so the same bits; odd sizes included.
    rng = np.random.default_rng(m * 1000 + inner)
    be = HalfBackend(fmt, threads=2)
    w = [be.prepare_weight(f"model.layers.0.mlp.{n}_proj.weight",
                           np.asfortranarray(rng.standard_normal(shape).astype(np.float32) * 0.2))
         for n, shape in (("gate", (c, inner)), ("up", (c, inner)), ("down", (inner, c)))]
    x = rng.standard_normal((1, m, c)).astype(np.float32)
    got = _in_one_call(monkeypatch, "gated_mlp", lambda: be.gated_mlp(x, *w))
    np.testing.assert_array_equal(got, Backend.gated_mlp(be, x, *w))


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "int8", "q4"])
@pytest.mark.parametrize(("m", "c", "outs"), [(1, 576, (576, 192, 192)), (16, 64, (64, 32, 32)),
                                              (100, 32, (96, 7)), (3, 40, (40, 50, 9))])
def test_linears_is_one_c_call_with_the_bits_of_each_linear(simd, monkeypatch, fmt, m, c, outs):
    # q, k and v in one call (int8 and q4: x quantized once, every panel in one parallel loop), the same
    # bits as a `linear` each; 100 rows cross a chunk of MC = 96; odd output counts end in partial panels.
    rng = np.random.default_rng(m + c)
    be = HalfBackend(fmt, threads=2)
    ws = [be.prepare_weight(f"model.layers.0.self_attn.{n}_proj.weight",
                            np.asfortranarray(rng.standard_normal((c, o)).astype(np.float32) * 0.2))
          for n, o in zip("qkv", outs, strict=False)]
    bs = [rng.standard_normal(o).astype(np.float32) if i != 1 else None for i, o in enumerate(outs)]
    x = rng.standard_normal((1, m, c)).astype(np.float32)
    want = [be.linear(x, w, b) for w, b in zip(ws, bs, strict=True)]
    got = _in_one_call(monkeypatch, "linears", lambda: be.linears(x, ws, bs))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


@needs_kernels
def test_linears_declines_what_it_does_not_take():
    rng = np.random.default_rng(0)
    be = HalfBackend("q4", threads=2)
    wq, wk = (be.prepare_weight("model.layers.0.self_attn.q_proj.weight",
                                rng.standard_normal((64, o)).astype(np.float32)) for o in (64, 32))
    x = rng.standard_normal((2, 64)).astype(np.float32)

    def args():
        return [x, (wq.blocks, wk.blocks), (64, 32), (None, None), be._code, 2,
                (np.full((2, 64), 7.0, np.float32), np.full((2, 32), 7.0, np.float32))]

    assert hb._KERNELS.linears(*args()) is True
    for i, change in [(0, lambda a: a[:, :33]), (1, lambda t: (t[1], t[0])), (1, lambda t: list(t)),
                      (2, lambda t: (64, 64)), (2, lambda t: (64,)),
                      (3, lambda t: (np.ones(3, np.float32), None)),
                      (6, lambda t: (t[0], t[0][:, :32])), (6, lambda t: (t[0][:1], t[1])),
                      (6, lambda t: (t[0], _read_only(t[1]))), (1, lambda t: t * 2)]:
        bad = args()
        bad[i] = change(bad[i])
        outs = [np.array(o, copy=True) for o in bad[6]]
        assert hb._KERNELS.linears(*bad) is False, f"argument {i} changed"
        for o, before in zip(bad[6], outs, strict=True):
            np.testing.assert_array_equal(o, before)


@needs_kernels
def test_gated_mlp_declines_what_it_does_not_take():
    rng = np.random.default_rng(0)
    be = HalfBackend("int8", threads=2)
    wg, wu = (be.prepare_weight("model.layers.0.mlp.up_proj.weight",
                                rng.standard_normal((16, 48)).astype(np.float32)) for _ in range(2))
    wd = be.prepare_weight("model.layers.0.mlp.down_proj.weight",
                           rng.standard_normal((48, 16)).astype(np.float32))
    x = rng.standard_normal((3, 16)).astype(np.float32)
    args = [x, wg.blocks, wu.blocks, 48, wd.blocks, be._code, 2, np.full((3, 16), 7.0, np.float32)]
    assert hb._KERNELS.gated_mlp(*args) is True
    for i, change in [(0, lambda a: a[:, :15]), (1, lambda a: wd.blocks), (3, lambda f: 80),
                      (4, lambda a: wg.blocks), (7, lambda o: o[:2]), (7, lambda o: _read_only(o))]:
        bad = list(args)
        bad[i] = change(bad[i])
        bad[7] = bad[7] if i == 7 else np.full((3, 16), 7.0, np.float32)
        before = np.array(bad[7], copy=True)
        assert hb._KERNELS.gated_mlp(*bad) is False, f"argument {i} changed"
        np.testing.assert_array_equal(bad[7], before)


def _ragged_gqa_case(h, kv, d, rows, length, kv_dtype=np.float32, seed=0):
    """q, k, v, slots and RaggedRows of a Llama-family ragged step: rows = (slot, offset, tokens); q, k and
    v views of their projections as `heads` gives them; every slot's caches random (garbage past each
    row's offset, which it must overwrite or ignore), one more slot than the rows use (untouched)."""
    from inferno.backends.base import RaggedRow

    rng = np.random.default_rng(seed)
    packed, n = [], 0
    for slot, offset, t in rows:
        packed.append(RaggedRow(slot, offset, n, t))
        n += t
    q, k, v = (NumpyBackend().heads(rng.standard_normal((1, n, heads * d)).astype(np.float32), heads)
               for heads in (h, kv, kv))
    slots = [tuple(rng.standard_normal((1, kv, length, d)).astype(kv_dtype) for _ in "kv")
             for _ in range(max(r[0] for r in rows) + 2)]
    return q, k, v, slots, packed


RAGGED_GQA = [
    # (query heads, key/value heads, head size, rows (slot, offset, tokens), cache length)
    (9, 3, 64, [(0, 20, 1), (1, 39, 1), (2, 0, 1), (3, 7, 1)], 40),            # SmolLM2: decode rows
    (14, 2, 64, [(1, 11, 1), (0, 0, 9), (2, 23, 1), (4, 30, 1)], 32),          # Qwen2.5: a prompt among them
    (4, 4, 16, [(0, 7, 5), (1, 0, 1), (4, 13, 1), (3, 2, 7), (2, 30, 1)], 32),  # ratio 1, split mid-token
    (8, 1, 7, [(0, 4, 3), (2, 9, 1)], 16),                                     # ratio 8, odd D: portable
    (6, 2, 16, [(1, 4500, 2), (0, 3, 1)], 4600),                               # past STACK_KEYS keys
]


@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16], ids=["kv32", "kv16"])
@pytest.mark.parametrize(("h", "kv", "d", "rows", "length"), RAGGED_GQA)
def test_ragged_gqa_attention_is_one_c_call_for_the_step(simd, no_defaults, monkeypatch, kv_dtype, h, kv, d,
                                                         rows, length):
    # Every row's cache writes and attention in one call (the default's write_kv and gqa_attention per row
    # refused), against each row's batch-1 attention in float64 over the caches as they were; the caches
    # hold the new keys and values (rounded to float16 in a float16 cache), the rest kept.
    monkeypatch.setattr(Backend, "ragged_gqa_attention",
                        lambda *a: (_ for _ in ()).throw(AssertionError("the default ran")))
    q, k, v, slots, packed = _ragged_gqa_case(h, kv, d, rows, length, kv_dtype)
    before = [tuple(a.astype(np.float64) for a in pair) for pair in slots]
    k16, v16 = (a.astype(kv_dtype).astype(np.float64) for a in (k, v))  # what a cache of kv_dtype keeps
    got = _in_one_call(monkeypatch, "ragged_attention",
                       lambda: HalfBackend(threads=2).ragged_gqa_attention(q, k, v, slots, packed))
    table = [(r.slot, r.offset, r.start, r.length) for r in packed]
    want, k_want, v_want = ref.ragged_gqa_attention(q, k16, v16, table, [a for a, _ in before],
                                                    [b for _, b in before])
    close(got, want, rtol=2e-5 if kv_dtype is np.float32 else 1e-4)
    for slot, (kc, vc) in enumerate(slots):
        np.testing.assert_array_equal(kc, k_want[slot])
        np.testing.assert_array_equal(vc, v_want[slot])


GROUPS = [
    # (query heads, key/value heads, head size, offset): decode steps whose groups the AVX-512 path attends
    # together (up to 4 query heads at D = 64, 2 at D = 128), split among 2 threads mid-group
    (9, 3, 64, 40),      # SmolLM2: groups of 3
    (14, 2, 64, 100),    # Qwen2.5-0.5B: 7 = 4 + 3
    (8, 2, 128, 30),     # Llama 3.2 1B's ratio at D = 128: 4 = 2 + 2
    (16, 8, 128, 7),     # Qwen3-0.6B: groups of 2
    (4, 1, 64, 4100),    # past STACK_KEYS keys (the scores on the heap)
]


def _alone(be, q, k, v, head, offset):
    """Query head `head` of q [B, H, T, D] attended alone over its key/value head (a group of one)."""
    r = q.shape[1] // k.shape[1]
    kv = slice(head // r, head // r + 1)
    return be.gqa_attention(np.ascontiguousarray(q[:, head : head + 1]), np.ascontiguousarray(k[:, kv]),
                            np.ascontiguousarray(v[:, kv]), offset)


@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16], ids=["kv32", "kv16"])
@pytest.mark.parametrize(("h", "kv", "d", "offset"), GROUPS)
def test_a_groups_query_heads_attended_together_keep_each_heads_bits(simd, kv_dtype, h, kv, d, offset):
    # Reading each key and value row once for the group changes no query's arithmetic: every head's output
    # is the bits of that head attended alone; and within float32's roundings of float64.
    rng = np.random.default_rng(h * 1000 + d + offset)
    k, v = (rng.standard_normal((2, kv, offset + 3, d)).astype(kv_dtype) for _ in "kv")
    q = rng.standard_normal((2, h, 1, d)).astype(np.float32)
    be = HalfBackend(threads=2)
    got = be.gqa_attention(q, k, v, offset)
    for head in range(h):
        np.testing.assert_array_equal(got[:, head : head + 1], _alone(be, q, k, v, head, offset))
    s = offset + 1
    close(got, ref.gqa_attention(q, k[:, :, :s].astype(np.float64), v[:, :, :s].astype(np.float64), offset),
          rtol=2e-5)


@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16], ids=["kv32", "kv16"])
def test_a_ragged_steps_groups_keep_each_heads_bits(simd, kv_dtype):
    # As above, in the ragged step's one call: decode rows (grouped) and a prompt row, each query head of
    # each row the bits of that head attended alone over its slot's caches as the call left them.
    rows = [(0, 20, 1), (1, 39, 1), (3, 0, 6), (2, 7, 1)]
    for h, kv, d, _ in GROUPS[:4]:
        q, k, v, slots, packed = _ragged_gqa_case(h, kv, d, rows, 48, kv_dtype, seed=h + d)
        be = HalfBackend(threads=2)
        got = be.ragged_gqa_attention(q, k, v, slots, packed)
        for r in packed:
            kc, vc = slots[r.slot]
            qr = q[:, :, r.start : r.start + r.length]
            for head in range(h):
                np.testing.assert_array_equal(got[:, head : head + 1, r.start : r.start + r.length],
                                              _alone(be, qr, kc, vc, head, r.offset))


def _ragged_gqa_args(rows=((0, 5, 2), (2, 11, 3), (1, 0, 1))):
    q, k, v, slots, packed = _ragged_gqa_case(6, 2, 16, list(rows), 32)
    table = np.array([(r.slot, r.offset, r.start, r.length) for r in packed], dtype=np.int64)
    return [q, k, v, slots, table, 2, np.empty((1, q.shape[2], 6, 16), np.float32)]


RAGGED_GQA_DECLINED = [
    (0, lambda q: q[:, :5]),                                     # query heads not a multiple of 2
    (0, lambda q: q.astype(np.float64)),
    (0, lambda q: q[..., ::2]),                                  # the head's values not contiguous
    (1, lambda k: k[:, :, :5]),                                  # keys for fewer tokens than the queries
    (2, lambda v: v[:, :1]),                                     # values of another head count
    (3, lambda s: tuple(s)),                                     # slot_kv not a list
    (3, lambda s: [s[0], s[1], tuple(a[:, :, :13] for a in s[2]), *s[3:]]),  # no room for row 1
    (3, lambda s: [s[0], (s[1][0], s[1][0]), *s[2:]]),          # one array as both caches
    (3, lambda s: [s[0], s[1], tuple(a[:, :1] for a in s[2]), *s[3:]]),      # a cache of 1 kv head
    (3, lambda s: [s[0], s[1], (s[2][0], s[2][1].astype(np.float16)), *s[3:]]),  # float16 beside float32
    (4, lambda t: t.astype(np.int32)),
    (4, lambda t: np.array([[0, 5, 0, 2], [0, 11, 2, 3], [1, 0, 5, 1]])),  # a slot twice
    (4, lambda t: np.array([[0, 5, 0, 2], [2, 11, 2, 3]])),                # rows cover 5 of 6 tokens
    (6, lambda o: o[:, :, :5]),                                  # out not [1, n, h, d]
    (6, lambda o: _read_only(o)),
]


@needs_kernels
@pytest.mark.parametrize(("i", "change"), RAGGED_GQA_DECLINED)
def test_ragged_attention_declines_what_it_does_not_take(i, change):
    # The backend then runs the default composition: nothing may have been computed or written.
    args = _ragged_gqa_args()
    slots = [tuple(a.copy() for a in pair) for pair in args[3]]
    args[i] = change(args[i])
    args[6] = np.full_like(args[6], 7.0) if i != 6 else args[6]
    before = np.array(args[6], copy=True)
    assert hb._KERNELS.ragged_attention(*args) is False
    np.testing.assert_array_equal(args[6], before)
    for pair, fresh in zip(args[3] if i != 3 else _ragged_gqa_args()[3], slots, strict=True):
        for a, b in zip(pair, fresh, strict=True):
            np.testing.assert_array_equal(a, b)


@needs_kernels
@pytest.mark.parametrize("fmt", ["float16", "int8", "q4"])
def test_a_llama_ragged_step_gives_each_row_its_batch_1_logits(monkeypatch, fmt):
    # Three sequences' prompts, then their decode steps, through forward_ragged (the rows' attention one C
    # call a layer) against each sequence run alone through forward. int8 and q4 are bit for bit (integer
    # sums: the same arithmetic whoever shares the step); the 16-bit products of 1, 3 or 27 rows may sum
    # in another order, a float32 rounding or two apart.
    from inferno.models.llama import LlamaConfig, from_state_dict
    from inferno.testing import llama_config, llama_state_dict

    cfg = llama_config("llama", num_attention_heads=6, num_key_value_heads=2, hidden_size=96)
    config = LlamaConfig.from_dict(cfg)
    model = from_state_dict(config, llama_state_dict(cfg, seed=3), HalfBackend(fmt, threads=2))
    ids = np.random.default_rng(4).integers(0, config.vocab_size, (3, 12)).tolist()
    alone = []
    for seq in ids:
        cache = model.new_cache(1)
        model.forward(np.asarray([seq[:9]]), cache)
        alone.append(model.forward(np.asarray([seq[9:12]]), cache, all_logits=True)[0])
    refuse_defaults(monkeypatch)
    monkeypatch.setattr(Backend, "ragged_gqa_attention",
                        lambda *a: (_ for _ in ()).throw(AssertionError("the default ran")))
    slots = model.new_slots(3)
    model.forward_ragged([(seq[:9], r, 0) for r, seq in enumerate(ids)], slots)
    for i in range(9, 12):
        got = model.forward_ragged([(seq[i : i + 1], r, i) for r, seq in enumerate(ids)], slots)
        for r in range(3):
            if fmt == "float16":
                close(got[r], alone[r][i - 9], rtol=1e-5)
            else:
                np.testing.assert_array_equal(got[r], alone[r][i - 9])


# Arguments of each new C function, and changes it must decline (False, computing nothing): the wrong
# dtype, a wrong length or shape, a read-only output, an odd head size, a last axis that is not contiguous.
def _args(name):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4, 16)).astype(np.float32)
    if name == "rms_norm":
        return [x, np.ones(16, np.float32), 1e-6, np.empty_like(x)], 3
    if name == "silu_mul":
        return [x, x * 2, np.empty_like(x)], 2
    cos = np.ones((4, 8), np.float32)
    return [x, cos, cos * 0.5, np.empty_like(x)], 3


DECLINED = [
    ("rms_norm", 0, lambda x: x.astype(np.float64)),
    ("rms_norm", 0, lambda x: x[..., ::2]),
    ("rms_norm", 1, lambda g: g[:-1]),
    ("rms_norm", 1, lambda g: None),
    ("rms_norm", 3, lambda o: o[..., :-1]),
    ("rms_norm", 3, lambda o: np.asfortranarray(o)),
    ("silu_mul", 1, lambda u: u[..., :-1]),
    ("silu_mul", 0, lambda g: g.astype(np.float16)),
    ("silu_mul", 2, lambda o: _read_only(o)),
    ("rotary", 0, lambda x: x[..., :15]),
    ("rotary", 1, lambda c: c[:-1]),
    ("rotary", 2, lambda s: s[:, :-1]),
    ("rotary", 3, lambda o: o.reshape(2, 3, 16, 4)),
]


def _read_only(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flags.writeable = False
    return a


@needs_kernels
@pytest.mark.parametrize("name", ["rms_norm", "silu_mul", "rotary"])
def test_new_c_functions_take_their_arrays(name):
    args, out = _args(name)
    assert getattr(hb._KERNELS, name)(*args) is True
    assert np.isfinite(args[out]).all()


@needs_kernels
@pytest.mark.parametrize(("name", "i", "change"), DECLINED)
def test_new_c_functions_decline_what_they_do_not_take(name, i, change):
    args, out = _args(name)
    args[i] = change(args[i])
    before = np.array(args[out], copy=True)
    assert getattr(hb._KERNELS, name)(*args) is False
    np.testing.assert_array_equal(args[out], before)


@needs_kernels
def test_attention_declines_query_heads_that_are_not_a_multiple_of_the_key_heads():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 5, 1, 8)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, 4, 8)).astype(np.float32) for _ in range(2))
    assert hb._KERNELS.attention(q, k, v, 3, np.empty_like(q), 1) is False


# --------------------------------------------------------------------------------------- the model


def _rounded_state_dict(sd: dict[str, np.ndarray], fmt: str) -> dict[str, np.ndarray]:
    """The state dict with the matrices the backend keeps in 16 bits rounded as it rounds them."""
    return {n: hb.from_bits(hb.to_bits(a, fmt), fmt).reshape(a.shape)
            if n.endswith(hb.LINEAR) or n in hb.EMBEDDINGS else a for n, a in sd.items()}


def _q4_state_dict(sd: dict) -> dict:
    """`sd` with its matrices as q4 holds them ([out, in] in the file: blocks of 32 along `in`)."""
    def held(a):
        w = hb.pack(np.ascontiguousarray(a, np.float32), "q4")
        return hb.q4_rows(w.blocks, np.arange(a.shape[0]), a.shape[1])

    return {n: held(a) if n.endswith(hb.LINEAR) or n in hb.EMBEDDINGS else a for n, a in sd.items()}


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "int8", "q4"])
@pytest.mark.parametrize("variant", ["qwen3", "llama-gqa4-bias"])
def test_a_llama_model_runs_in_16_8_or_4_bits_on_the_native_kernels(monkeypatch, fmt, variant):
    from inferno.models.llama import LlamaConfig, from_state_dict
    from inferno.testing import llama_config, llama_state_dict

    cfg = llama_config(variant, tie_word_embeddings=True)
    config = LlamaConfig.from_dict(cfg)
    sd = llama_state_dict(cfg, seed=5)
    be = HalfBackend(fmt, threads=2)
    model = from_state_dict(config, sd, be)
    blk = model.blocks[0]
    for w in (blk.q_w, blk.k_w, blk.v_w, blk.o_w, blk.gate_w, blk.up_w, blk.down_w, model.embed_tokens):
        assert isinstance(w, hb.Weight16) and w.fmt == fmt
    assert be.weight_order("model.layers.0.mlp.down_proj.weight") == "F"
    # float16/bfloat16: against float64 on the same rounded weights (activations stay float32 here); int8
    # also quantizes each product's inputs: against the unrounded weights, loosely; q4 against its own
    # rounded weights, as loosely (its inputs are quantized as int8's).
    held = {"int8": sd, "q4": _q4_state_dict(sd)}.get(fmt) or _rounded_state_dict(sd, fmt)
    oracle = from_state_dict(config, held, NumpyBackend("float64"))
    ids = np.random.default_rng(1).integers(0, config.vocab_size, (2, 7))
    want = oracle.forward(ids, all_logits=True)
    refuse_defaults(monkeypatch)  # (after the oracle, which runs NumPy's kernels)
    cache = model.new_cache(2)
    got = np.concatenate([model.forward(ids[:, :5], cache, all_logits=True),
                          model.forward(ids[:, 5:6], cache, all_logits=True),
                          model.forward(ids[:, 6:], cache, all_logits=True)], axis=1)
    tolerance = 0.15 if fmt in ("int8", "q4") else 1e-4
    worst = float(np.abs(got - want).max())
    assert worst <= tolerance * float(np.abs(want).max()), f"{fmt}: max error {worst:.3g}"
