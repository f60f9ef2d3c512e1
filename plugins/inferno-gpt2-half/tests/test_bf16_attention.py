"""attention=bfloat16 (`_kernels.c`, "attention in bfloat16"): a long prompt's attention with bfloat16
products summed in float32, on AMX-BF16 tiles or, where the CPU has AVX512-BF16 without AMX (AMD Zen 4 and
5) or AMX is switched off, on VDPBF16PS. Each path is checked against a float64 emulation of its
roundings; each test runs on the paths this machine has and skips the others, saying what is missing
(`_kernels.bf16_attention()`). Where the CPU lacks AMX, the AMX-BF16 path runs on the tiles emulated in C
(`amx_kernels.py`)."""

from __future__ import annotations

import inferno
import numpy as np
import pytest
from amx_kernels import bf16_path_kernels
from inferno.models.config import Gpt2Config
from inferno.testing_fixtures import write_model_dir

import inferno_half.backend as hb

KERNELS = hb._KERNELS
pytestmark = pytest.mark.skipif(KERNELS is None, reason="the C kernels are not built")
PATHS = ["AMX-BF16", "AVX512-BF16"]


@pytest.fixture(params=PATHS)
def bf16_kernels(request, monkeypatch):
    """The kernels of each bfloat16 path this machine has (`amx_kernels.bf16_path_kernels`)."""
    yield from bf16_path_kernels(request.param, monkeypatch, "bf16_attention")


def _bf16(a: np.ndarray) -> np.ndarray:
    """float32 → bfloat16 (nearest, ties to even) as float64."""
    return hb.from_bits(hb.to_bits(a.astype(np.float32), "bfloat16"), "bfloat16").astype(np.float64)


def _attention_bf16_reference(q, k, v, offset):
    """What both paths compute, in float64: q, k, v rounded to bfloat16; the scores and an exact softmax;
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


@pytest.mark.parametrize("b, h, hkv, t, offset, d", [(1, 2, 2, 65, 0, 64), (1, 3, 3, 100, 0, 32),
                                                     (2, 2, 2, 80, 37, 64), (1, 2, 2, 66, 1, 64),
                                                     (1, 4, 2, 70, 5, 128), (1, 1, 1, 200, 0, 96)])
@pytest.mark.parametrize("threads", [1, 2])
def test_bf16_attention_is_the_bfloat16_computation(bf16_kernels, b, h, hkv, t, offset, d, threads):
    # Every query row of a tile of 16 (the last one partial), positions past the first (a chunked prompt),
    # an odd and an even number of keys (VDPBF16PS takes keys in pairs), grouped-query heads, head sizes
    # of 1 to 4 tiles of 32.
    rng = np.random.default_rng(t * 7 + d)
    q = (rng.standard_normal((b, h, t, d)) * 0.5).astype(np.float32)
    k = (rng.standard_normal((b, hkv, offset + t + 3, d)) * 0.5).astype(np.float32)
    v = rng.standard_normal((b, hkv, offset + t + 3, d)).astype(np.float32)
    out = np.full_like(q, np.nan)
    assert bf16_kernels.attention(q, k, v, offset, out, threads, True)
    want = _attention_bf16_reference(q, k, v, offset)
    # (float32 sums in another order than float64's; a softmax weight within float32's rounding of a
    # bfloat16 tie may round the other way: a bfloat16 step of one weight, ~1e-5 of the range at most here)
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-5 * np.abs(want).max())
    exact = np.full_like(q, np.nan)
    # float32: within bfloat16's rounding
    assert bf16_kernels.attention(q, k, v, offset, exact, threads, False)
    assert not np.array_equal(out, exact)
    np.testing.assert_allclose(out, exact, rtol=0, atol=2e-2 * np.abs(exact).max())


def test_bf16_attention_declines_what_it_cannot_take(bf16_kernels):
    # A head size not a multiple of 32, or a short prompt (a decode step): the float32 attention runs.
    rng = np.random.default_rng(1)
    for t, d in [(100, 48), (64, 64), (1, 64)]:
        q, k, v = (rng.standard_normal((1, 2, t, d)).astype(np.float32) for _ in range(3))
        got, want = np.empty_like(q), np.empty_like(q)
        assert bf16_kernels.attention(q, k, v, 0, got, 2, True)
        assert bf16_kernels.attention(q, k, v, 0, want, 2, False)
        np.testing.assert_array_equal(got, want)


def test_without_a_bfloat16_path_it_runs_in_float32():
    if KERNELS.simd() < 1:
        pytest.skip("CPU lacks AVX2, FMA or F16C")
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 2, 100, 64)).astype(np.float32) for _ in range(3))
    got, want = np.empty_like(q), np.empty_like(q)
    try:
        KERNELS.force_avx2(1)
        assert KERNELS.bf16_attention() == ("", "a lesser path than AVX-512 runs")
        assert KERNELS.attention(q, k, v, 0, got, 2, True) and KERNELS.attention(q, k, v, 0, want, 2, False)
    finally:
        KERNELS.force_avx2(0)
    np.testing.assert_array_equal(got, want)


def test_the_backend_names_the_bfloat16_path():
    path, why = KERNELS.bf16_attention()
    runs_on = hb.HalfBackend.runs_on()
    if path:
        assert f"{path} for attention=bfloat16" in runs_on
    else:
        assert "attention=bfloat16" not in runs_on and why


def test_prefill_with_bf16_attention_is_close_to_float32(bf16_kernels, tmp_path):
    config = Gpt2Config(vocab_size=50257, n_positions=128, n_embd=128, n_layer=2, n_head=2,  # heads of 64
                        bos_token_id=50256, eos_token_id=50256)
    model_dir = write_model_dir(tmp_path, config)
    ids = list(np.random.default_rng(8).integers(0, 50257, 100))
    exact = inferno.load(model_dir, "half:dtype=int8,inputs=rows", download=False).logits(ids)
    fast = "half:dtype=int8,inputs=rows,attention=bfloat16"
    bf16 = inferno.load(model_dir, fast, download=False).logits(ids)
    assert not np.array_equal(bf16, exact)  # (the bfloat16 path ran)
    assert np.abs(bf16 - exact).max() <= 2e-2 * np.abs(exact).max()
