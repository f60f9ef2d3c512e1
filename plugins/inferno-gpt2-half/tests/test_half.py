"""inferno-gpt2-half: the 16-bit formats, the compiled kernel against its NumPy fallback and a float64
reference, options, and generation against `numpy` (the conformance suite runs separately:
``pytest --pyargs inferno.conformance --backend half``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import inferno
import numpy as np
import pytest
from inferno.backends.registry import get_backend, list_backends
from inferno.models.resolve import shipped_gpt2_file
from safetensors.numpy import load_file, save_file

import inferno_half.backend as hb
from inferno_half import HalfBackend

ROWS = "int8,inputs=rows"  # int8 weights, the products' inputs quantized with one scale per row
FORMATS = ["float16", "bfloat16", "int8", ROWS, "q4"]
QUANTIZED = ("int8", ROWS, "q4")  # their products quantize the inputs
SIXTEEN = FORMATS[:2]


def backend(fmt: str = "float16", **kw) -> HalfBackend:
    """The backend of `fmt`, a dtype and its options ("int8,inputs=rows")."""
    name, *options = fmt.split(",")
    return HalfBackend(name, **dict(o.split("=") for o in options), **kw)


def pack(w: np.ndarray, fmt: str) -> hb.Weight16:
    return hb.pack(w, fmt.split(",")[0])


def code(fmt: str) -> int:
    """The kernels' format code of `fmt` (with inputs=rows, int8's and the FMT_ROWS flag)."""
    return hb.FORMATS[fmt.split(",")[0]] | (hb.FMT_ROWS if fmt == ROWS else 0)
PROMPTS = ["Hello", "The quick brown fox", "Once upon a time", "def main():", "Numbers: 1, 2, 3,", "新年快乐"]


def bf16_reference(a: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (nearest, ties to even) by exact float64 arithmetic, as float32: the
    two neighbouring bfloat16 values around each x, and the closer one (the even one on a tie)."""
    x = a.astype(np.float64)
    bits = a.view(np.uint32)
    lo = (bits & np.uint32(0xFFFF0000)).view(np.float32).astype(np.float64)  # truncated toward zero
    hi_bits = (bits & np.uint32(0xFFFF0000)) + np.uint32(0x10000)
    hi = hi_bits.view(np.float32).astype(np.float64)  # next one away from zero
    d_lo, d_hi = np.abs(x - lo), np.abs(hi - x)
    even_lo = ((bits >> 16) & 1) == 0
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & ~even_lo)
    return np.where(pick_hi, hi, lo).astype(np.float32)


def test_float16_bits_are_numpys_float16():
    a = np.random.default_rng(0).standard_normal(10_000).astype(np.float32) * 10
    np.testing.assert_array_equal(hb.from_bits(hb.to_bits(a, "float16"), "float16"),
                                  a.astype(np.float16).astype(np.float32))


def test_bfloat16_rounds_to_nearest_even():
    rng = np.random.default_rng(1)
    a = rng.standard_normal(10_000).astype(np.float32) * 100
    # Exact ties: the low 16 bits 0x8000, with an even and an odd bfloat16 below.
    ties = np.array([0x3F808000, 0x3F818000, 0xBF808000, 0x40498000], dtype=np.uint32).view(np.float32)
    a = np.concatenate([a, ties, [0.0, -0.0, 1e-30, 3e38]]).astype(np.float32)
    np.testing.assert_array_equal(hb.from_bits(hb.to_bits(a, "bfloat16"), "bfloat16"), bf16_reference(a))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n, k", [(21, 13), (64, 768 // 8), (50, 40), (8, 8), (1, 3)])
def test_pack_keeps_every_value_and_row_gather(fmt, n, k, monkeypatch):
    a = np.random.default_rng(n * k).standard_normal((n, k)).astype(np.float32)
    w = pack(a, fmt)
    want = _rounded(a.T, fmt).T.astype(np.float32)
    be = backend(fmt)
    np.testing.assert_array_equal(be.to_numpy(w), want)
    ids = np.array([[0, n - 1, n // 2], [n // 3, 0, n - 1]])
    np.testing.assert_array_equal(w.row_values(ids), want[ids])
    assert w.shape == (k, n) and w.rows == (n, k)
    monkeypatch.setattr(hb, "_KERNELS", None)  # the NumPy fallback's gather and unpacking
    np.testing.assert_array_equal(w.row_values(ids), want[ids])
    np.testing.assert_array_equal(be._unpack(w, n // 3, n), want[n // 3 :])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 12, 13, 16, 40, 64, 65])
@pytest.mark.parametrize("n, k", [(21, 13), (67, 48), (300, 96)])
def test_linear_matches_float64_of_the_rounded_weights(fmt, m, n, k, monkeypatch, kernel_path):
    # Both paths (the compiled kernel up to SMALL_M rows, unpacked BLAS above) and the NumPy fallback:
    # every tile shape of the kernel (1, 2, 3 rows over several panels; tiles of up to 12 rows, balanced),
    # outputs not a multiple of the panel's 32.
    rng = np.random.default_rng(m * 1000 + n)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w_in_out = rng.standard_normal((k, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    be = backend(fmt, threads=2)
    w = be.prepare_weight("h.0.mlp.c_fc.weight", w_in_out)
    rounded = _rounded(w_in_out, fmt)
    want = _inputs(x, fmt) @ rounded + b
    scale = np.abs(x).sum(axis=1, keepdims=True) * np.abs(rounded).max() + 1
    got = be.linear(x[None], w, b)[0]
    assert got.shape == (m, n) and got.dtype == np.float32
    assert np.all(np.abs(got - want) <= 1e-6 * scale)
    monkeypatch.setattr(hb, "_KERNELS", None)  # the fallback: every product unpacked in NumPy
    np.testing.assert_allclose(be.linear(x[None], w, b)[0], got, rtol=1e-5, atol=1e-5 * float(scale.max()))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m", [97, 200])
def test_kernel_product_of_many_rows_matches_float64(fmt, m, kernel_path):
    # More rows than one pass over the weights takes (MC = 96): the kernel's row chunks, GELU included.
    rng = np.random.default_rng(m)
    k, n = 40, 70
    x = rng.standard_normal((m, k)).astype(np.float32)
    w_in_out = rng.standard_normal((k, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    w = pack(w_in_out.T, fmt)
    y = np.empty((m, n), np.float32)
    assert hb._KERNELS.matmul(x, w.blocks, n, b, y, code(fmt), 2, True)
    want = _gelu64(_inputs(x, fmt) @ _rounded(w_in_out, fmt) + b)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", QUANTIZED)
def test_quantized_product_of_every_short_row_matches_float64(fmt, kernel_path):
    # Every k from 1 to 70: each way a row's last block of 32 can end within a vector of 8 or 16 inputs,
    # which the SIMD quantizers load masked. Each row 10x the one before, so that a block reading past its
    # row's end (into the next) gets another scale, and a padding input that quantized to non-zero moves
    # q4's correction.
    rng = np.random.default_rng(70)
    m, n = 3, 40
    for k in range(1, 71):
        x = (rng.standard_normal((m, k)) * 10.0 ** np.arange(m)[:, None]).astype(np.float32)
        w_in_out = rng.standard_normal((k, n)).astype(np.float32)
        w = pack(w_in_out.T, fmt)
        y = np.full((m, n), np.nan, np.float32)
        assert hb._KERNELS.matmul(x, w.blocks, n, None, y, code(fmt), 2, False)
        want = _inputs(x, fmt) @ _rounded(w_in_out, fmt)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * np.abs(want).max(), err_msg=f"k = {k}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_kernel_product_of_every_row_count_matches_float64(fmt, kernel_path):
    # Every m from 1 to two passes over the weights (MC = 96) and one more: each m is its own tile plan
    # (25 rows once made a tile larger than the AVX-512 table and jumped to a null function).
    rng = np.random.default_rng(25)
    k, n = 24, 40
    x_all = rng.standard_normal((2 * 96 + 1, k)).astype(np.float32)
    w_in_out = rng.standard_normal((k, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    w = pack(w_in_out.T, fmt)
    want_all = _inputs(x_all, fmt) @ _rounded(w_in_out, fmt) + b
    for m in range(1, len(x_all) + 1):
        y = np.full((m, n), np.nan, np.float32)
        assert hb._KERNELS.matmul(x_all[:m], w.blocks, n, b, y, code(fmt), 2, False)
        np.testing.assert_allclose(y, want_all[:m], rtol=1e-5, atol=1e-5, err_msg=f"{m} rows")


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_row_gets_the_same_bits_in_any_batch_and_on_either_simd_path(fmt):
    # Each output is one FMA chain over k whatever the tile, so a sequence's logits do not depend on who
    # shares its step; and the AVX2 and AVX-512 paths compute the same chains.
    rng = np.random.default_rng(5)
    k, n = 200, 300
    x = rng.standard_normal((40, k)).astype(np.float32)
    w = pack(rng.standard_normal((n, k)).astype(np.float32), fmt)
    b = rng.standard_normal(n).astype(np.float32)

    def product(rows):
        y = np.empty((len(rows), n), np.float32)
        assert hb._KERNELS.matmul(np.ascontiguousarray(rows), w.blocks, n, b, y, code(fmt), 2, False)
        return y

    paths = [hb._KERNELS.simd()]
    try:
        if paths[0] == 2 and hb._KERNELS.force_avx2(1) == 1:
            paths.append(1)
        results = []
        for p in paths:
            hb._KERNELS.force_avx2(p == 1)
            whole = product(x)
            for m in (1, 2, 3, 5, 16, 39):
                np.testing.assert_array_equal(product(x[:m]), whole[:m])
            np.testing.assert_array_equal(product(x[7:8]), whole[7:8])
            results.append(whole)
    finally:
        hb._KERNELS.force_portable(0)
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])


def test_q4_gets_the_same_bits_on_every_path_and_in_every_tile():
    # q4's sums are exact and its one FMA a block is fmaf on the portable path: every path, and every tile
    # a row lands in (AVX2's of 1 to 4 rows, which unpack the nibbles once for them all; AVX-512's of 1 to
    # 6), gives the same bits as portable C's one row at a time.
    rng = np.random.default_rng(44)
    k, n = 200, 300
    x = rng.standard_normal((21, k)).astype(np.float32)
    w = pack(rng.standard_normal((n, k)).astype(np.float32), "q4")

    def product(rows):
        y = np.empty((len(rows), n), np.float32)
        assert hb._KERNELS.matmul(np.ascontiguousarray(rows), w.blocks, n, None, y, code("q4"), 2, False)
        return y

    try:
        hb._KERNELS.force_portable(1)
        want = np.concatenate([product(x[i : i + 1]) for i in range(len(x))])
    finally:
        hb._KERNELS.force_portable(0)
    paths = ["detected"] + (["avx2"] if hb._KERNELS.simd() == 2 else [])
    try:
        for path in paths:
            hb._KERNELS.force_avx2(path == "avx2")
            for m in range(1, len(x) + 1):
                np.testing.assert_array_equal(product(x[:m]), want[:m], err_msg=f"{path}, {m} rows")
    finally:
        hb._KERNELS.force_portable(0)


@pytest.mark.parametrize("fmt", ["int8", ROWS])
def test_an_input_on_a_rounding_tie_quantizes_alike_on_every_path(fmt):
    # x * id rounded to float32 lands exactly on k + 0.5 (then to even) though the exact product does not:
    # a multiply and add fused by the compiler (-ffp-contract) rounded it the other way on the AVX-512 path.
    rng = np.random.default_rng(11)
    k, n = 64, 48
    x = rng.uniform(-1, 1, (1, k)).astype(np.float32)
    x[0, 0] = np.float32(11.49156)  # the largest: d and id fixed for the row (and its block of 32)
    d = np.float32(np.abs(x).max() / np.float32(127))
    inv = np.float32(1) / d
    ties = []
    for j in range(-60, 60):
        t = np.float32((j + 0.5) / inv)
        for step in range(-8, 9):
            v = np.float32(t + np.float32(step) * np.spacing(t))
            if np.float32(v * inv) == j + 0.5 and float(v) * float(inv) != j + 0.5:
                ties.append(v)
    assert len(ties) >= 20
    x[0, 1 : 1 + 20] = ties[:20]
    x[0, 33 : 33 + 20] = ties[-20:]
    x[0, 32] = np.float32(11.49156)  # the second block's largest too
    w_in_out = rng.standard_normal((k, n)).astype(np.float32)
    w = pack(w_in_out.T, fmt)
    results = []  # detected, AVX2 (where the CPU has it), portable C
    for path in ("detected", "avx2", "portable"):
        if path == "avx2" and hb._KERNELS.force_avx2(1) != 1:
            continue
        if path == "portable":
            hb._KERNELS.force_portable(1)
        try:
            y = np.empty((1, n), np.float32)
            assert hb._KERNELS.matmul(x, w.blocks, n, None, y, code(fmt), 1, False)
        finally:
            hb._KERNELS.force_portable(0)
        results.append(y)
    want = _inputs(x, fmt) @ _rounded(w_in_out, fmt)
    for y in results:  # (one input a step off moves outputs by ~1e-3 of the largest)
        np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
    if len(results) == 3:  # the SIMD paths' bits are the same (portable C adds without FMA)
        np.testing.assert_array_equal(results[1], results[0])


def _rounded(w_in_out: np.ndarray, fmt: str) -> np.ndarray:
    """The weights the backend holds for `w_in_out` [in, out], in float64: rounded to the 16-bit format,
    for int8 each output's column quantized over max |column| / 127 and multiplied back, for q4 as
    `_q4_rounded`."""
    fmt = fmt.split(",")[0]
    if fmt == "q4":
        return _q4_rounded(w_in_out)
    if fmt != "int8":
        return hb.from_bits(hb.to_bits(w_in_out, fmt), fmt).astype(np.float64)
    scale = np.abs(w_in_out).max(axis=0) / np.float32(127)
    scale[scale == 0] = 1
    q = np.clip(np.round(w_in_out / scale), -127, 127)
    assert np.all(np.abs(q * scale - w_in_out) <= scale * 0.5001)
    return q.astype(np.float64) * scale.astype(np.float64)


def _q4_rounded(w_in_out: np.ndarray) -> np.ndarray:
    """q4 as llama.cpp's q4_0, in float64: each output's column in blocks of 32 inputs (zero-padded), the
    block's scale s = m / -8 for its entry m of largest magnitude, rounded to float16, then x / s rounded
    to nearest in -8 .. 7, times s. Every value within s of the weight (7 / 8 |m| is the top level; 8 |s|
    may miss |m| by float16's rounding of s, 8 * 2^-11 of s)."""
    k, n = w_in_out.shape
    kp = -(-k // 32) * 32
    padded = np.zeros((kp, n), np.float32)
    padded[:k] = w_in_out
    blocks = padded.reshape(kp // 32, 32, n)
    m = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=1)[:, None, :], axis=1)
    s = (m / np.float32(-8)).astype(np.float16).astype(np.float32)
    q = np.clip(np.rint(blocks / np.where(s != 0, s, 1)), -8, 7) * (s != 0)
    rounded = (q.astype(np.float64) * s.astype(np.float64)).reshape(kp, n)[:k]
    assert np.all(np.abs(rounded - w_in_out) <= np.repeat(np.abs(s), 32, axis=1).reshape(kp, n)[:k] * 1.005)
    return rounded


@pytest.mark.parametrize("m", [1, 2, 5, 16])
def test_q4_sums_are_exact_at_the_largest_nibbles_and_inputs(m, kernel_path):
    # The AVX2 path adds a block's vpmaddubsw pairs in int16 before widening: 16 products of 15 * 127 a
    # lane, 30480 of 32767. Here every product is at that bound (one weight a block at q = -8, the rest at
    # q = 7: nibble 15; every input +-1: q = +-127), so an int16 sum carried past a block would wrap.
    k, n = 96, 64
    w_in_out = np.full((k, n), -0.875, np.float32)
    w_in_out[::32] = 1.0  # each block's largest: s = 1 / -8, so -0.875 is q = 7
    signs = np.where(np.arange(m)[:, None] % 2 == 0, 1.0, -1.0)
    x = np.ones((m, k), np.float32) * signs.astype(np.float32)
    w = pack(w_in_out.T, "q4")
    y = np.full((m, n), np.nan, np.float32)
    assert hb._KERNELS.matmul(x, w.blocks, n, None, y, code("q4"), 2, False)
    want = _inputs(x, "q4") @ _q4_rounded(w_in_out)
    assert np.abs(want).max() == pytest.approx(3 * (31 * 0.875 - 1))
    np.testing.assert_allclose(y, want, rtol=1e-6, err_msg=kernel_path)


@pytest.mark.parametrize("fmt", QUANTIZED)
@pytest.mark.parametrize("m", [1, 3, 20])
def test_quantized_product_of_a_non_finite_input_is_nan_not_garbage(fmt, m, kernel_path):
    # int8 and q4 products quantize their inputs: a block holding inf or NaN must not round to some int8
    # and give finite garbage; its rows come out NaN (as float products would), the other rows unchanged.
    rng = np.random.default_rng(m)
    k, n = 70, 40
    x = rng.standard_normal((m, k)).astype(np.float32)
    w_in_out = rng.standard_normal((k, n)).astype(np.float32)
    w = pack(w_in_out.T, fmt)
    want = _inputs(x, fmt) @ _rounded(w_in_out, fmt)
    x[0, 40] = np.inf
    x[-1, 69] = np.nan  # in the last, partial block
    y = np.zeros((m, n), np.float32)
    assert hb._KERNELS.matmul(x, w.blocks, n, None, y, code(fmt), 2, False)
    assert np.all(np.isnan(y[0])) and np.all(np.isnan(y[-1]))
    np.testing.assert_allclose(y[1:-1], want[1:-1], rtol=1e-5, atol=1e-5)


def _inputs(x: np.ndarray, fmt: str) -> np.ndarray:
    """What a product multiplies for the inputs x [..., k], in float64: x itself; for int8, x quantized as
    llama.cpp's q8_0 does, in blocks of 32 along k over d = max |block| / 127, x / d rounded to nearest
    even (in float32, as the kernel computes it), times d; with inputs=rows, one block the whole row.
    (q4's products quantize theirs the same way.)"""
    x = np.asarray(x, np.float32)
    if fmt not in QUANTIZED:
        return x.astype(np.float64)
    lead, k = x.shape[:-1], x.shape[-1]
    kp = -(-k // 32) * 32
    padded = np.zeros((*lead, kp), np.float32)
    padded[..., :k] = x
    blocks = padded.reshape(*lead, 1, kp) if fmt == ROWS else padded.reshape(*lead, kp // 32, 32)
    d = np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, np.float32(1)), np.float32(0))
    q = np.clip(np.rint(blocks * inv.astype(np.float32)), -127, 127)
    assert np.all(np.abs(q * d.astype(np.float64) - blocks) <= d * 0.5001)
    return (q * d.astype(np.float64)).reshape(*lead, kp)[..., :k]


def _assert_chained_products_match(got: np.ndarray, want: np.ndarray, fmt: str) -> None:
    """got [..., c] (a chain of products: the MLP, an attention block) matches the float64 `want` within
    1e-4. For int8, the second product's inputs are quantized from what the kernel computed in float32
    and the reference in float64: where one lies on a rounding boundary of its block the two may round to
    neighbouring int8 values, which moves that token's outputs by one step of the grid (d times a weight).
    So a few tokens (at most 2%, at least 1) may differ by up to 1% of the outputs' range; the rest match.
    (q4 likewise.)"""
    if fmt not in QUANTIZED:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        return
    got2, want2 = got.reshape(-1, got.shape[-1]), want.reshape(-1, want.shape[-1])
    off = ~np.all(np.abs(got2 - want2) <= 1e-4 + 1e-4 * np.abs(want2), axis=1)
    assert off.sum() <= max(1, len(off) // 50), f"{off.sum()} of {len(off)} tokens differ beyond 1e-4"
    assert np.abs(got2 - want2).max() <= 1e-2 * np.abs(want2).max()


def _gelu64(x: np.ndarray) -> np.ndarray:
    # GPT-2's tanh GELU in float64, as x * sigmoid(2u): (1 + tanh u) / 2 cancels to 0 for u below -19,
    # where the sigmoid form still holds the tiny true value the kernel computes.
    u = np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-2.0 * u))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("b, t", [(1, 1), (2, 3), (1, 8), (1, 9)])
@pytest.mark.parametrize("c", [48, 44])
def test_mlp_matches_float64_of_the_rounded_weights(fmt, b, t, c, kernel_path):
    # Up to SMALL_M rows the GELU runs inside the first product's kernel (c=44: 4C = 176 and C padded to
    # multiples of 8, the padding zero); 9 rows take BLAS and NumPy's GELU.
    rng = np.random.default_rng(b * 100 + t + c)
    x = (rng.standard_normal((b, t, c)) * 2).astype(np.float32)
    w_fc, w_proj = (rng.standard_normal(s).astype(np.float32) * 0.5 for s in ((c, 4 * c), (4 * c, c)))
    b_fc, b_proj = (rng.standard_normal(n).astype(np.float32) for n in (4 * c, c))
    be = backend(fmt, threads=2)
    got = be.mlp(x, be.prepare_weight("h.0.mlp.c_fc.weight", w_fc), b_fc,
                 be.prepare_weight("h.0.mlp.c_proj.weight", w_proj), b_proj)
    hidden = _gelu64(_inputs(x, fmt) @ _rounded(w_fc, fmt) + b_fc)
    want = _inputs(hidden, fmt) @ _rounded(w_proj, fmt) + b_proj
    assert got.shape == (b, t, c) and got.dtype == np.float32
    _assert_chained_products_match(got, want, fmt)


def test_gelu_of_the_kernel_holds_at_the_extremes(kernel_path):
    # Very negative inputs (e^-2u beyond float32: the kernel clamps the exponent), zero, very positive.
    be = HalfBackend("float16", threads=1)
    x = np.array([[-1e4, -60.0, -9.0, -3.0, -1e-3, 0.0, 1e-3, 0.5, 3.0, 9.0, 60.0, 1e4, 2.0, -2.0, 1.0,
                   -1.0]], np.float32)
    eye = be.prepare_weight("h.0.mlp.c_fc.weight", np.eye(16, dtype=np.float32))
    got = be._matmul(x, eye, None, gelu=True)
    np.testing.assert_allclose(got, _gelu64(x.astype(np.float64)), rtol=2e-6, atol=1e-30)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("b, t, offset", [(1, 1, 0), (1, 1, 37), (2, 3, 5), (1, 8, 0), (1, 9, 4), (3, 1, 60),
                                          (1, 100, 0), (2, 77, 13)])
@pytest.mark.parametrize("n_head, d", [(4, 16), (2, 12), (1, 64)])
def test_self_attention_matches_float64_and_writes_the_cache(fmt, b, t, offset, n_head, d, kernel_path):
    # One C call writes the cache and attends (d=16, 64: the x86 path, 12: portable); prompts of more than
    # 64 queries attend in tiles on the AVX-512 path (d a multiple of 16) and take the composed NumPy path
    # elsewhere. All against the composition in float64 on the rounded weights.
    from inferno.backends.numpy_backend import NumpyBackend

    c = n_head * d
    rng = np.random.default_rng(b * 1000 + t * 10 + offset + d)
    x = rng.standard_normal((b, t, c)).astype(np.float32)
    w_attn, w_proj = (rng.standard_normal(s).astype(np.float32) * 0.3 for s in ((c, 3 * c), (c, c)))
    b_attn, b_proj = (rng.standard_normal(n).astype(np.float32) for n in (3 * c, c))
    length = offset + t + 2
    caches = [rng.standard_normal((b, n_head, length, d)).astype(np.float32) for _ in range(2)]
    be = backend(fmt, threads=2)
    kv = tuple(a.copy() for a in caches)
    got, (k_got, v_got) = be.self_attention(x, be.prepare_weight("h.0.attn.c_attn.weight", w_attn), b_attn,
                                            be.prepare_weight("h.0.attn.c_proj.weight", w_proj), b_proj,
                                            kv, offset, n_head)
    class Reference(NumpyBackend):  # float64, each product on the inputs the kernel multiplies
        def linear(self, x, w, b):
            return super().linear(_inputs(x, fmt), w, b)

    ref = Reference("float64")
    kv64 = tuple(a.astype(np.float64) for a in caches)
    want, (k_want, v_want) = ref.self_attention(x.astype(np.float64), _rounded(w_attn, fmt), b_attn,
                                                _rounded(w_proj, fmt), b_proj, kv64, offset, n_head)
    assert got.shape == (b, t, c) and got.dtype == np.float32
    _assert_chained_products_match(got, want, fmt)
    np.testing.assert_allclose(k_got, k_want, rtol=1e-5, atol=1e-5)  # new keys in place, the rest kept
    np.testing.assert_allclose(v_got, v_want, rtol=1e-5, atol=1e-5)


def test_kernel_is_compiled_and_uses_simd_here():
    # CI builds the extension; a silent fallback to NumPy would make every decode 10x slower.
    assert hb._KERNELS is not None, "the C kernels were not built (see pip's build log)"
    assert HalfBackend().compiled
    import platform
    if platform.machine() in ("x86_64", "AMD64"):
        flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
        if re.search(r"\bavx512f\b", flags) and re.search(r"\bavx512bw\b", flags):
            assert hb._KERNELS.simd() == 2
        elif re.search(r"\bavx2\b", flags) and re.search(r"\bf16c\b", flags):
            assert hb._KERNELS.simd() == 1
        else:
            assert hb._KERNELS.simd() in (0, 1, 2)


def test_registered_with_its_options():
    info = {b.name: b for b in list_backends()}["half"]
    assert "16-bit weights" in info.description
    be = get_backend("half:dtype=bfloat16,threads=1")
    assert (be.fmt, be.threads, be.dtype) == ("bfloat16", 1, "bfloat16")
    assert get_backend("half").dtype == np.float16


@pytest.mark.parametrize("spec, needle", [
    ("half:dtype=float32", "option dtype='float32' is not supported (choose float16, bfloat16, int8 or q4)"),
    ("half:dtype=int8,head=q4", "option head='q4' applies to dtype=q4 only"),
    ("half:dtype=q4,head=float16", "option head='float16' is not supported (choose q4 or int8)"),
    ("half:dtype=q4,inputs=rows", "option inputs='rows' applies to dtype=int8 only"),
    ("half:dtype=int8,inputs=row", "option inputs='row' is not supported (choose blocks or rows; "
                                   "bfloat16 with dtype=bfloat16)"),
    ("half:inputs=bfloat16", "option inputs='bfloat16' applies to dtype=bfloat16 only"),
    ("half:dtype=bfloat16,inputs=rows", "option inputs='rows' applies to dtype=int8 only"),
    ("half:attention=float16", "option attention='float16' is not supported (choose float32 or bfloat16)"),
    ("half:threads=0", "option threads=0 must be an integer >= 1 or 'auto'"),
    ("half:threads=5000", "option threads=5000 must be at most 1024"),
])
def test_bad_options_name_the_option(spec, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        get_backend(spec)


def test_weight_beyond_float16_range_is_refused_by_name():
    a = np.ones((4, 8), np.float32)
    a[1, 2] = 1e5
    with pytest.raises(ValueError, match=r"weight 'h.3.attn.c_proj.weight' holds 1e\+05, beyond float16's "
                                         r"range \(65504\); use half:dtype=bfloat16"):
        HalfBackend().prepare_weight("h.3.attn.c_proj.weight", a)
    assert HalfBackend("bfloat16").prepare_weight("h.3.attn.c_proj.weight", a).rows == (8, 4)


def test_q4_weights_beyond_its_scales_range_are_refused_by_name():
    # A q4 block's scale is max |w| / 8 in float16: beyond 8 * 65504 it would be inf.
    a = np.ones((4, 32), np.float32)
    a[1, 2] = -6e5
    with pytest.raises(ValueError, match=r"weight 'h.0.mlp.c_fc.weight' holds 6e\+05, beyond q4's range "
                                         r"\(524032\); use half:dtype=bfloat16"):
        HalfBackend("q4").prepare_weight("h.0.mlp.c_fc.weight", a)
    a[1, 2] = -5e5  # within it: kept, its block's largest weight exactly
    w = HalfBackend("q4").prepare_weight("h.0.mlp.c_fc.weight", a)
    scale = np.float32(-5e5 / 8).astype(np.float16).astype(np.float32)
    assert HalfBackend("q4").to_numpy(w)[2, 1] == scale * 8


def test_q4_keeps_the_embeddings_and_head_in_int8_on_request():
    a = np.random.default_rng(0).standard_normal((40, 64)).astype(np.float32)
    for head, want in ((None, "q4"), ("q4", "q4"), ("int8", "int8")):
        be = HalfBackend("q4", head=head)
        assert be.prepare_weight("wte.weight", a).fmt == want
        assert be.prepare_weight("lm_head.weight", a).fmt == want
        assert be.prepare_weight("model.embed_tokens.weight", a).fmt == want
        assert be.prepare_weight("h.0.mlp.c_fc.weight", a).fmt == "q4"  # the linear weights stay q4


# ---------------------------------------------------------------------------------------- end to end

@pytest.fixture(scope="module")
def numpy_pipe(model_dir):
    return inferno.load(model_dir, "numpy", download=False)


def greedy_agrees(want: inferno.api.Pipeline, got_ids: list[int], prompt: str, margin: float) -> None:
    """`got_ids` equals numpy's greedy ids, or first differs where numpy's top two logits are within
    `margin` of each other (a near-tie, which 16-bit weights may break the other way)."""
    assert got_ids, f"no ids generated for {prompt!r}: nothing to compare"
    ids = want.encode(prompt)
    for i, token in enumerate(got_ids):
        logits = want.logits(ids)[-1]
        top2 = np.sort(logits)[-2:]
        best = int(np.argmax(logits))
        if token != best:
            assert top2[1] - top2[0] <= margin, (prompt, i, token, best, top2)
            return
        ids = [*ids, best]


@pytest.mark.parametrize("fmt", FORMATS)
def test_greedy_ids_match_numpy_up_to_near_ties(model_dir, numpy_pipe, fmt):
    pipe = inferno.load(model_dir, f"half:dtype={fmt}", download=False)
    margin = {"float16": 0.02, "bfloat16": 0.1, "int8": 0.3, ROWS: 0.3, "q4": 1.0}[fmt]
    for prompt in PROMPTS:
        got = pipe.generate(prompt, max_new_tokens=16, stop_at_eos=False)
        assert len(got.ids) == 16, got.ids
        greedy_agrees(numpy_pipe, got.ids, prompt, margin)


@pytest.mark.parametrize("fmt, tolerance", [("float16", 2e-3), ("bfloat16", 2e-2), ("int8", 5e-2),
                                            (ROWS, 5e-2), ("float16,attention=bfloat16", 2e-2),
                                            (ROWS + ",attention=bfloat16", 5e-2),
                                            ("q4", 0.3), ("q4,head=int8", 0.3)])
def test_logits_match_numpy(model_dir, numpy_pipe, fmt, tolerance):
    pipe = inferno.load(model_dir, f"half:dtype={fmt}", download=False)
    ids = numpy_pipe.encode("The quick brown fox jumps over the lazy dog. " * 3)
    want = numpy_pipe.logits(ids)
    got = pipe.logits(ids)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.abs(got - want).max() <= tolerance * np.abs(want).max()


@pytest.mark.parametrize("stored", ["F16", "BF16"])
def test_sixteen_bit_files_load_exactly(model_dir, tmp_path, stored):
    # A checkpoint already in the backend's format converts without rounding: the backend holds the
    # file's values bit for bit, and computes what it computes from a float32 file of the same values.
    import shutil

    fmt = {"F16": "float16", "BF16": "bfloat16"}[stored]
    weights = load_file(str(model_dir / "model.safetensors"))
    bits = {k: hb.to_bits(v, fmt) for k, v in weights.items()}
    sixteen, thirty_two = tmp_path / "sixteen", tmp_path / "thirty-two"
    for d in (sixteen, thirty_two):
        d.mkdir()
        for name in ("config.json", "tokenizer.json"):
            shutil.copy(model_dir / name, d / name)
    if stored == "F16":
        save_file({k: b.view(np.float16) for k, b in bits.items()}, str(sixteen / "model.safetensors"))
    else:
        _save_bf16(bits, sixteen / "model.safetensors")
    save_file({k: hb.from_bits(b, fmt) for k, b in bits.items()}, str(thirty_two / "model.safetensors"))
    pipe = inferno.load(sixteen, f"half:dtype={fmt}", download=False)
    held = pipe.model.backend.to_numpy(pipe.model.blocks[1].fc_w)
    np.testing.assert_array_equal(held, hb.from_bits(bits["h.1.mlp.c_fc.weight"], fmt).T)
    same = inferno.load(thirty_two, f"half:dtype={fmt}", download=False)
    ids = same.encode("Hello there")
    np.testing.assert_array_equal(pipe.logits(ids), same.logits(ids))


def _save_bf16(bits: dict[str, np.ndarray], path) -> None:
    """A safetensors file of BF16 tensors (safetensors.numpy has no bfloat16 dtype): the format by hand."""
    import json

    header, offset, blobs = {}, 0, []
    for name, b in bits.items():
        data = np.ascontiguousarray(b, dtype="<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(b.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(len(head).to_bytes(8, "little") + head + b"".join(blobs))


RSS_SCRIPT = r"""
import sys
from pathlib import Path

from inferno.backends.registry import get_backend
from inferno.models.config import Gpt2Config
from inferno.models.gpt2 import Gpt2
from inferno.models.weights import iter_weights


def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024


directory = Path(sys.argv[1])
be = get_backend(sys.argv[2])
config = Gpt2Config.from_file(directory / "config.json")
base = status("VmRSS")
# What inferno.load does with the weights (the tokenizer's memory is not the weights').
model = Gpt2.from_weights(config, iter_weights(directory / "model.safetensors", config, be.weight_order), be)
held = sum(a.nbytes for _, a in model.named_weights())
print(status("VmHWM") - base, held)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status (Linux)")
@pytest.mark.parametrize("fmt", SIXTEEN)
def test_load_peak_memory_is_at_most_1_2x_the_weights_held(tmp_path, fmt):
    # inferno.load streams the file one tensor at a time and the backend converts each as it comes, so
    # the float32 weights are never all in memory: the peak is the 16-bit weights plus the largest
    # float32 tensor (wte, read first), not 3x (the float32 dict, then the copies).
    # At GPT-2 124M's shape, where wte (float32: 154 MB) is a fraction of the 16-bit weights (251 MB).
    import json
    import shutil

    from inferno.models.config import GPT2_124M
    from inferno.testing import random_weights

    directory = tmp_path / "model"
    directory.mkdir()
    save_file(random_weights(GPT2_124M), str(directory / "model.safetensors"))
    config = {k: getattr(GPT2_124M, k) for k in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")}
    (directory / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    shutil.copy(shipped_gpt2_file("tokenizer.json"), directory / "tokenizer.json")
    out = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(directory), f"half:dtype={fmt}"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    peak, held = map(int, out.stdout.split())
    assert held > 240e6  # 16-bit weights of this shape
    assert peak <= 1.2 * held, f"peak RSS grew {peak / 1e6:.0f} MB loading {held / 1e6:.0f} MB of weights"


@pytest.mark.parametrize("offset, t", [(0, 1), (0, 5), (3, 4), (6, 1), (60, 1), (40, 8), (0, 9), (2, 30)])
@pytest.mark.parametrize("d", [16, 24, 64, 12])
def test_attention_matches_numpy(offset, t, d, kernel_path):
    # The C kernel takes up to SMALL_M queries; more go to NumPy's matmuls. Both against numpy's kernel.
    # Head sizes: 16 and 64 (the x86 path's 16-wide loop), 24 (its 8-wide tail), 12 (portable C).
    from inferno.backends.numpy_backend import NumpyBackend

    rng = np.random.default_rng(offset * 100 + t + d)
    q = rng.standard_normal((2, 3, t, d), dtype=np.float32)
    k_cache, v_cache = (rng.standard_normal((2, 3, 80, d), dtype=np.float32) * 3 for _ in range(2))
    want = NumpyBackend("float64").attention(q.astype(np.float64), k_cache.astype(np.float64),
                                             v_cache.astype(np.float64), offset)
    got = HalfBackend().attention(q, k_cache, v_cache, offset)
    assert got.shape == q.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("offset, t, threads", [(4100, 1, 1), (4100, 2, 2), (5000, 1, 2), (30, 1, 1)])
@pytest.mark.parametrize("peak", [1.0, 60.0])
def test_attention_long_cache_and_peaked_scores(offset, t, threads, peak, kernel_path):
    # Beyond 4096 keys the scores go to the heap, not the stack; 4 heads x 4101+ keys take both threads.
    # peak=60 makes most probabilities underflow (exponents far below -87, where the kernel's exp clamps).
    from inferno.backends.numpy_backend import NumpyBackend

    rng = np.random.default_rng(offset + t)
    length = offset + t + 3
    q = rng.standard_normal((1, 4, t, 16), dtype=np.float32) * np.float32(peak)
    k_cache, v_cache = (rng.standard_normal((1, 4, length, 16), dtype=np.float32) for _ in range(2))
    want = NumpyBackend("float64").attention(q.astype(np.float64), k_cache.astype(np.float64),
                                             v_cache.astype(np.float64), offset)
    got = HalfBackend(threads=threads).attention(q, k_cache, v_cache, offset)
    assert np.isfinite(got).all()
    # Scores near 60 hold ~1e-5 of float32 rounding, which the exponent passes on to the weights.
    tol = 1e-5 if peak == 1.0 else 1e-4
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("shape", [(1, 1, 768), (2, 7, 64), (1, 3, 13)])
def test_layernorm_matches_float64(shape, kernel_path):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 5 + 300).astype(np.float32)  # a large mean: sums must not cancel
    gamma, beta = (rng.standard_normal(shape[-1]).astype(np.float32) for _ in range(2))
    x64 = x.astype(np.float64)
    mean, var = x64.mean(-1, keepdims=True), x64.var(-1, keepdims=True)
    want = (x64 - mean) / np.sqrt(var + 1e-5) * gamma + beta
    got = HalfBackend().layernorm(x, gamma, beta, 1e-5)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_decode_runs_in_the_c_kernels_only(model_dir, monkeypatch):
    # A prompt of up to SMALL_M tokens and every decode step take the C kernels: none of them may fall
    # back to NumPy's (a kernel that declined what it should take would be correct, and 2x slower).
    from inferno.backends.numpy_backend import NumpyBackend

    pipe = inferno.load(model_dir, "half", download=False)
    want = pipe.generate("Hello there", max_new_tokens=6, stop_at_eos=False).ids

    def refused(name):
        def kernel(*args, **kwargs):
            raise AssertionError(f"NumPy's {name} ran in a decode step")
        return kernel

    for name in ("layernorm", "attention", "self_attention", "mlp", "linear", "lm_head", "gelu_new"):
        monkeypatch.setattr(NumpyBackend, name, refused(name))
    assert pipe.generate("Hello there", max_new_tokens=6, stop_at_eos=False).ids == want


def _decode_inputs(c=64, n_head=4, b=1, t=1, length=16, offset=3, fmt="float16"):
    """The arguments of each C function for a small decode step (all of them what it takes)."""
    rng = np.random.default_rng(0)
    be = backend(fmt, threads=2)
    x = rng.standard_normal((b, t, c)).astype(np.float32)
    w_attn = be.prepare_weight("h.0.attn.c_attn.weight", rng.standard_normal((c, 3 * c)).astype(np.float32))
    w_proj = be.prepare_weight("h.0.attn.c_proj.weight", rng.standard_normal((c, c)).astype(np.float32))
    w_fc = be.prepare_weight("h.0.mlp.c_fc.weight", rng.standard_normal((c, 4 * c)).astype(np.float32))
    w_out = be.prepare_weight("h.0.mlp.c_proj.weight", rng.standard_normal((4 * c, c)).astype(np.float32))
    vec = {n: rng.standard_normal(n).astype(np.float32) for n in (c, 3 * c, 4 * c)}
    k, v = (rng.standard_normal((b, n_head, length, c // n_head)).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((b, n_head, t, c // n_head)).astype(np.float32)
    fmt_code = code(fmt)
    rows = x.reshape(b * t, c)
    return {
        "matmul": [rows, w_fc.blocks, 4 * c, vec[4 * c], np.empty((b * t, 4 * c), np.float32), fmt_code, 2,
                   False],
        "layernorm": [x, vec[c], vec[c], 1e-5, np.empty_like(x)],
        "attention": [q, k, v, offset, np.empty_like(q), 2],
        "self_attention": [x, w_attn.blocks, vec[3 * c], w_proj.blocks, vec[c], k, v, offset, n_head,
                           fmt_code, 2, np.empty_like(x)],
        "mlp": [rows, w_fc.blocks, 4 * c, vec[4 * c], w_out.blocks, vec[c], fmt_code, 2, np.empty_like(rows)],
    }


# Each C function's output argument, and arguments it must decline (return False, writing nothing): the
# wrong dtype, Fortran order, a wrong shape, a bias of the wrong length, a read-only output, caches too
# short for the new tokens or one array as both caches.
OUT = {"matmul": 4, "layernorm": 4, "attention": 4, "self_attention": 11, "mlp": 8}
DECLINED = [
    ("matmul", 0, lambda a: a.astype(np.float64)),
    ("matmul", 0, lambda a: np.asfortranarray(np.repeat(a, 2, axis=0))),
    ("matmul", 1, lambda a: a[:-1]),
    ("matmul", 2, lambda n: n + 8),
    ("matmul", 3, lambda b: b[:-1]),
    ("matmul", 4, lambda y: y[:, :-1]),
    ("layernorm", 0, lambda a: a.astype(np.float16)),
    ("layernorm", 1, lambda g: g[:-1]),
    ("layernorm", 2, lambda g: None),
    ("layernorm", 4, lambda y: _read_only(y)),
    ("attention", 0, lambda q: q[:, :, :, ::2]),
    ("attention", 1, lambda k: k[:, :, :3]),
    ("attention", 2, lambda v: v[:1, :1]),
    ("attention", 3, lambda o: -1),
    ("self_attention", 0, lambda x: x[:, :, ::2]),
    ("self_attention", 1, lambda w: w.view(np.int16)),
    ("self_attention", 2, lambda b: b[:-1]),
    ("self_attention", 5, lambda k: k[:, :, :3]),
    ("self_attention", 6, lambda v: v.reshape(-1)),
    ("self_attention", 8, lambda h: h * 2),
    ("self_attention", 11, lambda y: y[:, :, :-1]),
    ("mlp", 1, lambda w: w[:, :-1]),
    ("mlp", 4, lambda w: w[:-1]),
    ("mlp", 5, lambda b: b.astype(np.float64)),
    ("mlp", 8, lambda y: _read_only(y)),
    ("mlp", 8, lambda y: y.reshape(y.shape[1], y.shape[0])),
    ("mlp", 6, lambda fmt: 2),
    ("attention", 4, lambda o: o.reshape(o.shape[0], o.shape[1], o.shape[3], o.shape[2])),
    ("self_attention", 9, lambda fmt: -1),
    ("self_attention", 11, lambda y: y.reshape(y.shape[0], y.shape[2], y.shape[1])),
    ("matmul", 5, lambda fmt: 7),
    ("layernorm", 4, lambda y: y.reshape(-1)),
]


def _read_only(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("name", sorted(OUT))
def test_c_functions_take_a_decode_steps_arrays(name):
    args = _decode_inputs()[name]
    assert getattr(hb._KERNELS, name)(*args) is True
    assert np.isfinite(args[OUT[name]]).all()


@pytest.mark.parametrize("name, i, change", DECLINED)
def test_c_functions_decline_what_they_do_not_take(name, i, change):
    # The backend then runs NumPy's kernel, so a result is right or NumPy's, never a misread array.
    args = _decode_inputs()[name]
    args[i] = change(args[i])
    out = args[OUT[name]]
    before = np.array(out, copy=True)
    assert getattr(hb._KERNELS, name)(*args) is False
    np.testing.assert_array_equal(out, before)


def test_self_attention_declines_one_array_as_both_caches():
    args = _decode_inputs()["self_attention"]
    args[6] = args[5]
    assert hb._KERNELS.self_attention(*args) is False


@pytest.mark.parametrize("name", sorted(OUT))
def test_c_functions_refuse_a_wrong_number_of_arguments(name):
    args = _decode_inputs()[name]
    with pytest.raises(TypeError, match=rf"{name}\(\) takes {len(args)} arguments \({len(args) - 1} given\)"):
        getattr(hb._KERNELS, name)(*args[:-1])


def _ragged_case(c, n_head, rows, length, fmt="float16", seed=0):
    """x, weights, slots and RaggedRows of a ragged step: rows = (slot, offset, tokens); every slot's
    caches random (garbage past each row's offset, which it must overwrite or ignore)."""
    from inferno.backends.base import RaggedRow

    rng = np.random.default_rng(seed)
    be = backend(fmt, threads=2)
    w_attn, w_proj = (rng.standard_normal(s).astype(np.float32) * 0.3 for s in ((c, 3 * c), (c, c)))
    b_attn, b_proj = (rng.standard_normal(n).astype(np.float32) for n in (3 * c, c))
    packed, start = [], 0
    for slot, offset, t in rows:
        packed.append(RaggedRow(slot, offset, start, t))
        start += t
    x = rng.standard_normal((1, start, c)).astype(np.float32)
    n_slots = max(r[0] for r in rows) + 2
    slots = [tuple(rng.standard_normal((1, n_head, length, c // n_head)).astype(np.float32) for _ in "kv")
             for _ in range(n_slots)]
    weights = (be.prepare_weight("h.0.attn.c_attn.weight", w_attn), b_attn,
               be.prepare_weight("h.0.attn.c_proj.weight", w_proj), b_proj)
    return be, x, weights, (w_attn, b_attn, w_proj, b_proj), slots, packed


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("c, n_head", [(64, 4), (15, 3)])
@pytest.mark.parametrize("rows", [[(0, 5, 2), (2, 11, 3), (1, 0, 1)], [(1, 3, 1)],
                                  [(3, 0, 9), (0, 20, 1), (2, 30, 1)],
                                  [(0, 7, 5), (1, 0, 1), (4, 13, 1), (3, 2, 7), (2, 30, 1), (5, 21, 1)]])
def test_ragged_self_attention_matches_float64_in_one_call(fmt, c, n_head, rows, kernel_path, monkeypatch):
    # One C call for the step (d = 16: the x86 attention; d = 5: portable), against each row's batch-1
    # attention in float64 on the rounded weights; the caches hold the new keys and values, the rest kept.
    # The last two cases are split between the two threads by keys, mid-token (items_split).
    from inferno.backends.numpy_backend import NumpyBackend
    from inferno.conformance import reference as ref

    be, x, weights, host, slots, packed = _ragged_case(c, n_head, rows, 32, fmt)
    before = [tuple(a.copy() for a in kv) for kv in slots]
    calls = []
    original = NumpyBackend.attention
    try:
        NumpyBackend.attention = lambda *a: calls.append(a) or original(*a)
        got = be.ragged_self_attention(x, *weights, slots, packed, n_head)
    finally:
        NumpyBackend.attention = original
    assert not calls, "the ragged step ran NumPy's attention"
    w_attn, b_attn, w_proj, b_proj = host
    linear = ref.linear
    monkeypatch.setattr(ref, "linear", lambda x, w, b: linear(_inputs(x, fmt), w, b))
    want, k_want, v_want = ref.ragged_self_attention(
        x, _rounded(w_attn, fmt), b_attn, _rounded(w_proj, fmt), b_proj, n_head,
        [(r.slot, r.offset, r.start, r.length) for r in packed], [k for k, _ in before],
        [v for _, v in before])
    _assert_chained_products_match(got, want, fmt)
    for slot, (k, v) in enumerate(slots):
        np.testing.assert_allclose(k, k_want[slot], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(v, v_want[slot], rtol=1e-5, atol=1e-5)


def _ragged_args(rows=((0, 5, 2), (2, 11, 3), (1, 0, 1))):
    be, x, weights, _, slots, packed = _ragged_case(64, 4, list(rows), 32)
    table = np.array([(r.slot, r.offset, r.start, r.length) for r in packed], dtype=np.int64)
    w_attn, b_attn, w_proj, b_proj = weights
    return [x, w_attn.blocks, b_attn, w_proj.blocks, b_proj, slots, table, 4, 0, 2, np.empty_like(x)]


def _short_cache(args):
    slots = list(args[5])
    slots[2] = tuple(a[:, :, :13] for a in slots[2])  # row 1 writes positions 11 .. 13
    return slots


RAGGED_DECLINED = [
    (5, lambda s: tuple(s)),                                     # slot_kv not a list
    (5, _short_cache),                                           # a cache without room for its row
    (5, lambda s: [s[0], (s[1][0], s[1][0]), *s[2:]]),          # one array as both caches
    (5, lambda s: [s[0], s[1][:1], *s[2:]]),                     # a slot that is not a pair
    (6, lambda t: t[:, :3]),                                     # rows not [R, 4]
    (6, lambda t: t.astype(np.int32)),
    (6, lambda t: np.array([[0, 5, 0, 2], [0, 11, 2, 3], [1, 0, 5, 1]])),  # a slot twice
    (6, lambda t: np.array([[0, 5, 0, 2], [2, 11, 3, 3], [1, 0, 6, 1]])),  # a gap between rows
    (6, lambda t: np.array([[0, 5, 0, 2], [2, 11, 2, 3], [9, 0, 5, 1]])),  # no such slot
    (6, lambda t: np.array([[0, 5, 0, 2], [2, 11, 2, 3]])),                # rows cover 5 of 6 tokens
]


@pytest.mark.parametrize("i, change", RAGGED_DECLINED)
def test_ragged_self_attention_declines_what_it_does_not_take(i, change):
    # The backend then runs the default composition: nothing may have been computed or written.
    args = _ragged_args()
    slots = args[5]
    args[i] = change(args if i == 5 and change is _short_cache else args[i])
    args[10] = np.full_like(args[10], 7.0)
    assert hb._KERNELS.ragged_self_attention(*args) is False
    assert (args[10] == 7.0).all()
    for kv, fresh in zip(slots, _ragged_args()[5], strict=True):
        for a, b in zip(kv, fresh, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("fmt", FORMATS)
def test_batched_rows_get_the_ids_of_their_batch_1_runs(model_dir, fmt, monkeypatch):
    # Through the engine (forward_ragged, every step in the C kernels) each sequence gets the greedy ids
    # it gets alone, not merely up to near-ties: its products, attention and norms are the same
    # arithmetic, bit for bit, whoever shares the step.
    from inferno.backends.numpy_backend import NumpyBackend

    pipe = inferno.load(model_dir, f"half:dtype={fmt}", download=False)
    alone = [pipe.generate(p, max_new_tokens=8, stop_at_eos=False).ids for p in PROMPTS]

    def refused(name):
        def kernel(*args, **kwargs):
            raise AssertionError(f"NumPy's {name} ran in a ragged step")
        return kernel

    for name in ("layernorm", "attention", "self_attention", "ragged_self_attention", "mlp", "linear",
                 "lm_head", "gelu_new"):
        monkeypatch.setattr(NumpyBackend, name, refused(name))
    together = [r.ids for r in pipe.generate_batch(PROMPTS, max_new_tokens=8, stop_at_eos=False)]
    assert together == alone


def test_inferno_backends_says_whether_the_compiled_kernels_or_the_fallback_run(monkeypatch):
    from inferno.backends.registry import get_backend_info

    simd = {2: "AVX-512", 1: "AVX2 + FMA + F16C", 0: "portable C"}[hb._KERNELS.simd()]
    assert get_backend_info("half").runs_on.startswith(f"compiled C ({simd}, ")
    monkeypatch.setattr(hb, "_KERNELS", None)  # as when the extension did not build
    assert get_backend_info("half").runs_on == "NumPy fallback (C kernels not built: slow)"
