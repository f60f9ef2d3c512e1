"""The AMX int8 path (`_kernels.c`, "AMX int8 products"): its output is the VNNI path's bit for bit, on
every shape, with bias and GELU, with inf/NaN in an input, on 1 and 2 threads, and end to end through
`half:dtype=int8`. Where the CPU has AMX-INT8 and the OS grants tile data, on the real tiles; elsewhere
(a CPU with AVX-512 VNNI) on the tiles emulated in C (`amx_kernels.py`), which checks the paths' layouts
and arithmetic but not the instructions; without either each test skips, saying what is missing."""

from __future__ import annotations

import inferno
import numpy as np
import pytest
from amx_kernels import amx_kernels
from inferno.models.config import Gpt2Config
from inferno.testing_fixtures import write_model_dir

import inferno_half.backend as hb

KERNELS, WHY_NOT, _ = amx_kernels()
pytestmark = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT or "AMX runs here")
INT8 = hb.FORMATS["int8"]
BY_ROW = INT8 | hb.FMT_ROWS  # inputs=rows: one input scale per row, the tiles at full depth
Q4 = hb.FORMATS["q4"]  # its panels unpacked to int8 tiles a task at a time


@pytest.fixture(autouse=True)
def default_paths(monkeypatch):
    """Each test runs the backend on KERNELS (the emulated ones where the CPU lacks AMX) and leaves the
    detected path and the default AMX threshold behind it."""
    monkeypatch.setattr(hb, "_KERNELS", KERNELS)
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
