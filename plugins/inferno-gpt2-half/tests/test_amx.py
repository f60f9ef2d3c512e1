"""The AMX int8 path (`_kernels.c`, "AMX int8 products"): its output is the VNNI path's bit for bit, on
every shape, with bias and GELU, with inf/NaN in an input, on 1 and 2 threads, and end to end through
`half:dtype=int8`. Runs only where the CPU has AMX-INT8 and the OS grants tile data; elsewhere each test
skips, saying which of the two is missing (`_kernels.amx_support()`)."""

from __future__ import annotations

import inferno
import numpy as np
import pytest
from inferno.models.config import Gpt2Config
from inferno.testing_fixtures import write_model_dir

import inferno_half.backend as hb

KERNELS = hb._KERNELS
WHY_NOT = "the C kernels are not built" if KERNELS is None else KERNELS.amx_support()
pytestmark = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT or "AMX runs here")
INT8 = hb.FORMATS["int8"]
BY_ROW = INT8 | hb.FMT_ROWS  # inputs=rows: one input scale per row, the tiles at full depth
Q4 = hb.FORMATS["q4"]  # its panels unpacked to int8 tiles a task at a time


@pytest.fixture(autouse=True)
def default_paths():
    """Each test leaves the detected path and the default AMX threshold behind it."""
    try:
        yield
    finally:
        if KERNELS is not None:
            KERNELS.amx_rows(-1)
            KERNELS.force_portable(0)


def product(x, w, n, b, threads, gelu, amx, code=INT8):
    """y = x @ w.T + b (then gelu) on AMX for every row count (amx) or on VNNI only (not amx)."""
    assert KERNELS.amx_rows(1 if amx else 0) == (1 if amx else 0)
    assert KERNELS.int8_path(len(x)) == ("AMX-INT8" if amx else "AVX-512 VNNI")
    y = np.full((len(x), n), np.nan, np.float32)
    assert KERNELS.matmul(np.ascontiguousarray(x), w.blocks, n, b, y, code, threads, gelu)
    return y


# Rows around a tile's 16, the chunk's 96 (MC) and the default threshold; k not a multiple of 32 or 64 (the
# blocks' zero padding); n not a multiple of 16 or 32 (the last half panel, a partial one).
ROWS = [1, 2, 3, 5, 8, 12, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 95, 96, 97, 112, 127, 160, 193, 200]
SHAPES = [(33, 7), (70, 40), (96, 100), (130, 17), (768, 77)]
# inputs=rows runs on tiles where kpad(k) is a multiple of 64 (TDPBSSD's depth), else on VNNI: these do.
SHAPES_BY_ROW = [(33, 7), (64, 40), (128, 100), (190, 17), (768, 77)]


@pytest.mark.parametrize("code, k, n",
                         [(INT8, k, n) for k, n in SHAPES] + [(BY_ROW, k, n) for k, n in SHAPES_BY_ROW]
                         + [(Q4, k, n) for k, n in SHAPES],
                         ids=[f"blocks-{k}x{n}" for k, n in SHAPES]
                         + [f"rows-{k}x{n}" for k, n in SHAPES_BY_ROW] + [f"q4-{k}x{n}" for k, n in SHAPES])
@pytest.mark.parametrize("threads", [1, 2])
def test_amx_product_is_the_vnni_product_bit_for_bit(k, n, threads, code):
    rng = np.random.default_rng(k * 1000 + n)
    x_all = (rng.standard_normal((max(ROWS), k)) * rng.uniform(0.01, 10, (max(ROWS), 1))).astype(np.float32)
    w = hb.pack(rng.standard_normal((n, k)).astype(np.float32), "q4" if code == Q4 else "int8")
    b = rng.standard_normal(n).astype(np.float32)
    for m in ROWS:
        x = x_all[:m]
        for bias, gelu in [(b, False), (None, False), (b, True)]:
            want = product(x, w, n, bias, threads, gelu, amx=False, code=code)
            got = product(x, w, n, bias, threads, gelu, amx=True, code=code)
            np.testing.assert_array_equal(got, want, err_msg=f"m={m} bias={bias is not None} gelu={gelu}")


@pytest.mark.parametrize("code", [INT8, BY_ROW, Q4], ids=["blocks", "rows", "q4"])
def test_amx_product_of_non_finite_inputs_is_the_vnni_product(code):
    # A block holding inf or NaN has d = NaN: those rows come out NaN on both paths, the others unchanged.
    rng = np.random.default_rng(3)
    k, n, m = 256, 70, 40
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[3, 5], x[17, 100], x[18, 199], x[39, 0] = np.inf, np.nan, -np.inf, np.nan
    w = hb.pack(rng.standard_normal((n, k)).astype(np.float32), "q4" if code == Q4 else "int8")
    b = rng.standard_normal(n).astype(np.float32)
    for threads in (1, 2):
        want = product(x, w, n, b, threads, False, amx=False, code=code)
        got = product(x, w, n, b, threads, False, amx=True, code=code)
        np.testing.assert_array_equal(got, want)
        assert np.isnan(got[[3, 17, 18, 39]]).all() and np.isfinite(np.delete(got, [3, 17, 18, 39], 0)).all()


def test_a_row_gets_its_bits_alone_on_vnni_and_batched_on_amx():
    # The default threshold: one row runs on VNNI, a batch on AMX; a row's bits do not depend on which.
    assert KERNELS.amx_rows(-1) > 1
    assert KERNELS.int8_path(1) == "AVX-512 VNNI" and KERNELS.int8_path(200) == "AMX-INT8"
    rng = np.random.default_rng(4)
    k, n = 300, 260
    x = rng.standard_normal((150, k)).astype(np.float32)
    w = hb.pack(rng.standard_normal((n, k)).astype(np.float32), "int8")
    b = rng.standard_normal(n).astype(np.float32)

    def run(rows):
        y = np.empty((len(rows), n), np.float32)
        assert KERNELS.matmul(np.ascontiguousarray(rows), w.blocks, n, b, y, INT8, 2, False)
        return y

    whole = run(x)
    for i in (0, 1, 16, 95, 96, 149):
        np.testing.assert_array_equal(run(x[i : i + 1]), whole[i : i + 1])


def test_amx_only_on_the_avx512_path():
    # A lesser path (the tests force AVX2 or portable C so) never runs tiles.
    assert KERNELS.amx_rows(1) == 1 and KERNELS.int8_path(100) == "AMX-INT8"
    if KERNELS.force_avx2(1) == 1:
        assert KERNELS.int8_path(100) == "AVX2"
    KERNELS.force_portable(1)
    assert KERNELS.int8_path(100) == "portable C"


def test_backend_says_amx_runs():
    assert "AMX-INT8 for int8 and q4 batches" in hb.HalfBackend.runs_on()
    KERNELS.amx_rows(0)  # no tiles at all
    assert "AMX" not in hb.HalfBackend.runs_on()


@pytest.fixture(scope="module")
def long_model_dir(tmp_path_factory):
    """A small random GPT-2 (GPT-2's vocabulary) with room for a prompt of 100 tokens."""
    config = Gpt2Config(vocab_size=50257, n_positions=128, n_embd=96, n_layer=2, n_head=4,
                        bos_token_id=50256, eos_token_id=50256)
    return write_model_dir(tmp_path_factory.mktemp("random-gpt2-128"), config)


@pytest.mark.parametrize("spec", ["int8", "int8,inputs=rows", "q4"])
@pytest.mark.parametrize("threads", [1, 2])
def test_prefill_logits_are_identical_with_amx_on_and_off(long_model_dir, threads, spec):
    pipe = inferno.load(long_model_dir, f"half:dtype={spec},threads={threads}", download=False)
    ids = list(np.random.default_rng(7).integers(0, 50257, 100))
    KERNELS.amx_rows(-1)
    on = pipe.logits(ids)
    KERNELS.amx_rows(0)
    off = pipe.logits(ids)
    assert on.shape == (100, 50257) and np.isfinite(on).all()
    np.testing.assert_array_equal(on, off)


# ------------------------------------------------------------------ attention=bfloat16 on AMX-BF16 tiles
BF16_WHY_NOT = "the C kernels are not built" if KERNELS is None else KERNELS.amx_bf16_support()
needs_bf16_tiles = pytest.mark.skipif(bool(BF16_WHY_NOT), reason=BF16_WHY_NOT or "AMX-BF16 runs here")


def _bf16(a: np.ndarray) -> np.ndarray:
    """float32 → bfloat16 (nearest, ties to even) as float64."""
    return hb.from_bits(hb.to_bits(a.astype(np.float32), "bfloat16"), "bfloat16").astype(np.float64)


def _attention_bf16_reference(q, k, v, offset):
    """What the tiles compute, in float64: q, k, v rounded to bfloat16; the scores and an exact softmax;
    the softmax's weights rounded to bfloat16 before P V, divided by the sum of the unrounded ones."""
    b, h, t, d = q.shape
    hkv = k.shape[1]
    out = np.empty((b, h, t, d))
    for s in range(b):
        for j in range(h):
            kh, vh = _bf16(k[s, j // (h // hkv)]), _bf16(v[s, j // (h // hkv)])
            for i in range(t):
                n = offset + i + 1
                sc = (_bf16(q[s, j, i]) @ kh[:n].T).astype(np.float32) * np.float32(1 / np.sqrt(d))
                e = np.exp(sc.astype(np.float64) - sc.max())
                out[s, j, i] = (_bf16(e.astype(np.float32)) @ vh[:n]) / e.sum()
    return out


@needs_bf16_tiles
@pytest.mark.parametrize("b, h, hkv, t, offset, d", [(1, 2, 2, 65, 0, 64), (1, 3, 3, 100, 0, 32),
                                                     (2, 2, 2, 80, 37, 64),
                                                     (1, 4, 2, 70, 5, 128), (1, 1, 1, 200, 0, 96)])
@pytest.mark.parametrize("threads", [1, 2])
def test_bf16_attention_is_the_bfloat16_computation(b, h, hkv, t, offset, d, threads):
    # Every query row of a tile of 16 (the last one partial), positions past the first (a chunked prompt),
    # grouped-query heads, head sizes of 1 to 4 tiles of 32.
    rng = np.random.default_rng(t * 7 + d)
    q = (rng.standard_normal((b, h, t, d)) * 0.5).astype(np.float32)
    k = (rng.standard_normal((b, hkv, offset + t + 3, d)) * 0.5).astype(np.float32)
    v = rng.standard_normal((b, hkv, offset + t + 3, d)).astype(np.float32)
    out = np.full_like(q, np.nan)
    assert KERNELS.attention(q, k, v, offset, out, threads, True)
    want = _attention_bf16_reference(q, k, v, offset)
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-5 * np.abs(want).max())
    exact = np.full_like(q, np.nan)
    assert KERNELS.attention(q, k, v, offset, exact, threads, False)  # float32: within bfloat16's rounding
    assert not np.array_equal(out, exact)
    np.testing.assert_allclose(out, exact, rtol=0, atol=2e-2 * np.abs(exact).max())


@needs_bf16_tiles
def test_bf16_attention_declines_what_tiles_cannot_take():
    # A head size not a multiple of 32, or a short prompt (a decode step): the float32 attention runs.
    rng = np.random.default_rng(1)
    for t, d in [(100, 48), (64, 64), (1, 64)]:
        q, k, v = (rng.standard_normal((1, 2, t, d)).astype(np.float32) for _ in range(3))
        got, want = np.empty_like(q), np.empty_like(q)
        assert KERNELS.attention(q, k, v, 0, got, 2, True) and KERNELS.attention(q, k, v, 0, want, 2, False)
        np.testing.assert_array_equal(got, want)


@needs_bf16_tiles
def test_bf16_attention_off_with_amx_switched_off():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 2, 100, 64)).astype(np.float32) for _ in range(3))
    got, want = np.empty_like(q), np.empty_like(q)
    KERNELS.amx_rows(0)
    assert KERNELS.amx_bf16_support() != ""
    assert KERNELS.attention(q, k, v, 0, got, 2, True) and KERNELS.attention(q, k, v, 0, want, 2, False)
    np.testing.assert_array_equal(got, want)


@needs_bf16_tiles
def test_prefill_with_bf16_attention_is_close_to_float32(tmp_path):
    config = Gpt2Config(vocab_size=50257, n_positions=128, n_embd=128, n_layer=2, n_head=2,  # heads of 64
                        bos_token_id=50256, eos_token_id=50256)
    model_dir = write_model_dir(tmp_path, config)
    ids = list(np.random.default_rng(8).integers(0, 50257, 100))
    exact = inferno.load(model_dir, "half:dtype=int8,inputs=rows", download=False).logits(ids)
    fast = "half:dtype=int8,inputs=rows,attention=bfloat16"
    tiles = inferno.load(model_dir, fast, download=False).logits(ids)
    assert not np.array_equal(tiles, exact)  # (the tiles ran)
    assert np.abs(tiles - exact).max() <= 2e-2 * np.abs(exact).max()
