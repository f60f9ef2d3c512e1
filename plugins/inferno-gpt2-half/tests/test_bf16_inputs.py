"""inputs=bfloat16 (`_kernels.c`, "bfloat16 inputs"): dtype=bfloat16's products with their inputs rounded
to bfloat16 too, pairs of products summed in float32 on AMX-BF16 tiles or by VDPBF16PS (AVX512-BF16). Checked
against float64 on the same rounded operands, row by row the same in any batch, and end to end, on each path:
AMX-BF16 on real tiles or, where the CPU lacks AMX, on tiles emulated in C (`amx_kernels.py`); VDPBF16PS with
AMX switched off. A path the machine lacks skips, naming what is missing (`_kernels.bf16_products()`); without
either the option must change nothing."""

from __future__ import annotations

import inferno
import numpy as np
import pytest
from amx_kernels import bf16_path_kernels
from inferno.models.config import Gpt2Config
from inferno.testing_fixtures import write_model_dir
from test_half import PROMPTS, _gelu64

import inferno_half.backend as hb

KERNELS = hb._KERNELS
pytestmark = pytest.mark.skipif(KERNELS is None, reason="the C kernels are not built")
BF16 = hb.FORMATS["bfloat16"]
IN16 = hb.FORMATS[hb.PAIRS]  # bfloat16 weights in input pairs: their products take bfloat16 inputs


def _both(w: np.ndarray) -> tuple[hb.Weight16, hb.Weight16]:
    """w packed for bfloat16 inputs (in pairs) and for float32 inputs."""
    return hb.pack(w, hb.PAIRS), hb.pack(w, "bfloat16")


@pytest.fixture(params=["AMX-BF16", "AVX512-BF16"])
def bf16_kernels(request, monkeypatch):
    """The kernels of each bfloat16 path this machine has (`amx_kernels.bf16_path_kernels`)."""
    yield from bf16_path_kernels(request.param, monkeypatch, "bf16_products")


def _bf16(a: np.ndarray) -> np.ndarray:
    """float32 → bfloat16 (nearest, ties to even) as float64."""
    return hb.from_bits(hb.to_bits(np.asarray(a, np.float32), "bfloat16"), "bfloat16").astype(np.float64)


def _product(x, w_packed, n, b, code, threads=2, gelu=False):
    y = np.full((x.shape[0], n), np.nan, np.float32)
    assert hb._KERNELS.matmul(x, w_packed.blocks, n, b, y, code, threads, gelu)
    return y


@pytest.mark.parametrize("m", [1, 2, 3, 12, 13, 25, 97, 200])
@pytest.mark.parametrize("n, k", [(64, 32), (33, 5), (100, 77), (96, 768), (1, 1)])
def test_product_is_float32_sums_of_the_bfloat16_operands(bf16_kernels, m, n, k):
    # One row to more than an MC chunk, odd k (the last pair half empty), n not a multiple of a panel:
    # within float32's rounding of the exact sum of the rounded operands (k sums at most).
    rng = np.random.default_rng(m * 100 + k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((n, k)) * 0.1).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    y = _product(x, hb.pack(w, hb.PAIRS), n, b, IN16)
    xr, wr = _bf16(x), _bf16(w)
    want = xr @ wr.T + b
    bound = 2.0**-23 * (k + 1) * (np.abs(xr) @ np.abs(wr).T + np.abs(b))
    assert np.all(np.abs(y - want) <= bound), float(np.max(np.abs(y - want) - bound))


def test_the_gelu_and_no_bias_ends(bf16_kernels):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((20, 96)).astype(np.float32)
    w = hb.pack((rng.standard_normal((70, 96)) * 0.3).astype(np.float32), hb.PAIRS)
    plain = _product(x, w, 70, None, IN16)
    np.testing.assert_allclose(_product(x, w, 70, None, IN16, gelu=True), _gelu64(plain.astype(np.float64)),
                               rtol=1e-5, atol=1e-6)


def test_a_row_gets_the_same_bits_in_any_batch_and_thread_count(bf16_kernels):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((40, 768)).astype(np.float32)
    w, plain = _both((rng.standard_normal((300, 768)) * 0.05).astype(np.float32))
    b = rng.standard_normal(300).astype(np.float32)
    batch = _product(x, w, 300, b, IN16, threads=2)
    for i in (0, 7, 39):
        np.testing.assert_array_equal(_product(x[i : i + 1], w, 300, b, IN16, threads=1)[0], batch[i])
    np.testing.assert_array_equal(_product(x[5:30], w, 300, b, IN16, threads=1), batch[5:30])
    exact = _product(x, plain, 300, b, BF16)  # float32 inputs: within bfloat16's rounding of the inputs
    assert not np.array_equal(batch, exact)
    np.testing.assert_allclose(batch, exact, rtol=0, atol=1e-2 * np.abs(exact).max())


def test_without_the_path_the_option_changes_nothing():
    if KERNELS.simd() < 1:
        pytest.skip("CPU lacks AVX2, FMA or F16C")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((30, 64)).astype(np.float32)
    w, plain = _both(rng.standard_normal((40, 77)).astype(np.float32))
    x = np.ascontiguousarray(np.pad(x, ((0, 0), (0, 13))))
    try:
        KERNELS.force_avx2(1)
        assert KERNELS.bf16_products() == ("", "a lesser path than AVX-512 runs")
        # (weights paired while a path ran: unpaired again, float32 inputs, the same bits)
        np.testing.assert_array_equal(_product(x, w, 40, None, IN16), _product(x, plain, 40, None, BF16))
    finally:
        KERNELS.force_avx2(0)


def test_the_backend_names_the_path():
    path, why = KERNELS.bf16_products()
    runs_on = hb.HalfBackend.runs_on()
    assert (f"{path} for inputs=bfloat16" in runs_on) if path else ("inputs=bfloat16" not in runs_on and why)


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    config = Gpt2Config(vocab_size=50257, n_positions=128, n_embd=128, n_layer=2, n_head=2,
                        bos_token_id=50256, eos_token_id=50256)
    return write_model_dir(tmp_path_factory.mktemp("in16"), config)


def _composed(be, x, w_attn, b_attn, w_proj, b_proj, n_head, code):
    """An attention block without a cache composed of the kernels' own products (format `code`) and the
    backend's attention: what the fused C calls compute."""
    t, c = x.shape[1], x.shape[2]
    qkv = _product(x[0], w_attn, 3 * c, b_attn, code).reshape(1, t, 3, n_head, c // n_head)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3).copy() for i in range(3))
    y = be.attention(q, k, v, 0).transpose(0, 2, 1, 3).reshape(t, c)
    return _product(np.ascontiguousarray(y), w_proj, c, b_proj, code)[None]


@pytest.mark.parametrize("t", [1, 5, 100])
def test_the_fused_calls_take_bfloat16_inputs(bf16_kernels, t):
    # The decode block (t = 1, 5), a prompt through it (100: tiled attention), the ragged step and the MLP
    # run their products on bfloat16 inputs: as composed of the IN16 products (up to the attention's sum
    # order), not of float32 inputs' products.
    from inferno.backends.base import RaggedRow

    n_head, c = 4, 64
    rng = np.random.default_rng(t)
    be = hb.HalfBackend("bfloat16", inputs="bfloat16", threads=2)
    x = rng.standard_normal((1, t, c)).astype(np.float32)
    (w_attn, plain_attn), (w_proj, plain_proj) = (_both((rng.standard_normal(s) * 0.3).astype(np.float32))
                                                  for s in ((3 * c, c), (c, c)))
    b_attn, b_proj = (rng.standard_normal(n).astype(np.float32) for n in (3 * c, c))
    want = _composed(be, x, w_attn, b_attn, w_proj, b_proj, n_head, IN16)
    other = _composed(be, x, plain_attn, b_attn, plain_proj, b_proj, n_head, BF16)
    scale = np.abs(want).max()
    kv = be.new_kv_cache(1, n_head, t, c // n_head)
    fused, _ = be.self_attention(x, w_attn, b_attn, w_proj, b_proj, kv, 0, n_head)
    slots = [be.new_kv_cache(1, n_head, t, c // n_head)]
    ragged = be.ragged_self_attention(x, w_attn, b_attn, w_proj, b_proj, slots, [RaggedRow(0, 0, 0, t)],
                                      n_head)
    for got in (fused, ragged):
        # (the attention's sums in another order may move a value of y across a bfloat16 rounding boundary
        # of c_proj's inputs: that token's outputs then move by a bfloat16 step; at most one token here)
        off = np.abs(got - want).max(axis=-1)[0] > 1e-5 * scale
        assert off.sum() <= max(1, t // 50) and np.abs(got - want).max() <= 2e-2 * scale
        assert np.abs(got - other).max() > 1e-4 * scale
    w_fc = hb.pack((rng.standard_normal((4 * c, c)) * 0.3).astype(np.float32), hb.PAIRS)
    w_p2 = hb.pack((rng.standard_normal((c, 4 * c)) * 0.3).astype(np.float32), hb.PAIRS)
    b_fc, b_p2 = rng.standard_normal(4 * c).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    hidden = _product(x[0], w_fc, 4 * c, b_fc, IN16, gelu=True)
    np.testing.assert_array_equal(be.mlp(x, w_fc, b_fc, w_p2, b_p2)[0], _product(hidden, w_p2, c, b_p2, IN16))
    np.testing.assert_array_equal(be.lm_head(x, w_fc)[0], _product(x[0], w_fc, 4 * c, None, IN16))


def test_a_model_with_bfloat16_inputs_is_within_their_rounding_of_float32_inputs(bf16_kernels, small_model):
    ids = list(np.random.default_rng(8).integers(0, 50257, 90))
    fast = inferno.load(small_model, "half:dtype=bfloat16,inputs=bfloat16", download=False).logits(ids)
    exact = inferno.load(small_model, "half:dtype=bfloat16", download=False).logits(ids)
    assert not np.array_equal(fast, exact)
    np.testing.assert_allclose(fast, exact, rtol=0, atol=1e-2 * np.abs(exact).max())


def test_batched_sequences_get_the_ids_they_get_alone(bf16_kernels, small_model, monkeypatch):
    from inferno.backends.numpy_backend import NumpyBackend

    pipe = inferno.load(small_model, "half:dtype=bfloat16,inputs=bfloat16", download=False)
    alone = [pipe.generate(p, max_new_tokens=8, stop_at_eos=False).ids for p in PROMPTS]
    for name in ("linear", "mlp", "ragged_self_attention", "lm_head"):
        monkeypatch.setattr(NumpyBackend, name, lambda *a, name=name: pytest.fail(f"NumPy's {name} ran"))
    together = [r.ids for r in pipe.generate_batch(PROMPTS, max_new_tokens=8, stop_at_eos=False)]
    assert together == alone


@pytest.mark.parametrize("variant", ["qwen3", "llama-gqa4-bias"])
def test_a_llama_model_with_bfloat16_inputs(bf16_kernels, variant, monkeypatch):
    # The Llama family's projections and gated MLP go through the same products (its BF16 checkpoints are
    # what the option is for): each product of the model takes bfloat16 inputs, and the logits stay within
    # their rounding of float32 inputs'.
    from inferno.models.llama import LlamaConfig, from_state_dict
    from inferno.testing import llama_config, llama_state_dict

    cfg = llama_config(variant, tie_word_embeddings=True)
    config = LlamaConfig.from_dict(cfg)
    sd = llama_state_dict(cfg, seed=5)
    ids = np.random.default_rng(1).integers(0, config.vocab_size, (2, 7))
    codes, kernels = [], hb._KERNELS

    class Spy:  # the kernels, recording each product's format code
        def __getattr__(self, name):
            return getattr(kernels, name)

        def matmul(self, *args):
            codes.append(args[5])
            return kernels.matmul(*args)

    monkeypatch.setattr(hb, "_KERNELS", Spy())
    fast = from_state_dict(config, sd, hb.HalfBackend("bfloat16", inputs="bfloat16", threads=2)).forward(ids)
    assert codes and set(codes) == {IN16}
    monkeypatch.undo()
    exact = from_state_dict(config, sd, hb.HalfBackend("bfloat16", threads=2)).forward(ids)
    assert not np.array_equal(fast, exact)
    np.testing.assert_allclose(fast, exact, rtol=0, atol=1e-2 * np.abs(exact).max())


@pytest.mark.parametrize("n, k", [(70, 77), (32, 64), (5, 1)])
def test_weights_in_pairs_hold_the_same_values(n, k, monkeypatch):
    # The paired layout (odd k, a partial panel, k padded to whole tiles) read back by every reader: the C
    # unpack (the embedding's gather, a weight's host copy), unpack_t (BLAS's operand) and NumPy's fallbacks.
    w = np.random.default_rng(n + k).standard_normal((n, k)).astype(np.float32)
    pairs, plain = _both(w)
    assert pairs.blocks.shape == (-(-n // hb.PANEL), hb.kpad(k), hb.PANEL)
    want = hb.from_bits(hb.to_bits(w, "bfloat16"), "bfloat16")
    be = hb.HalfBackend("bfloat16", threads=1)
    ids = np.array([[n - 1, 0], [n // 2, n - 1]])
    np.testing.assert_array_equal(be._unpack(pairs, 0, n), want)
    np.testing.assert_array_equal(pairs.row_values(ids), want[ids])
    count = len(pairs.blocks)
    got_t, plain_t = (np.empty((k, count * hb.PANEL), np.float32) for _ in range(2))
    assert KERNELS.unpack_t(pairs.blocks, n, 0, count, k, got_t, IN16, 1)
    assert KERNELS.unpack_t(plain.blocks, n, 0, count, k, plain_t, BF16, 1)
    np.testing.assert_array_equal(got_t, plain_t)
    monkeypatch.setattr(hb, "_KERNELS", None)  # NumPy's readers of the layout
    np.testing.assert_array_equal(be._unpack(pairs, 1, n), want[1:])
    np.testing.assert_array_equal(pairs.row_values(ids), want[ids])


def test_the_backend_holds_its_weights_in_pairs_where_a_path_runs(bf16_kernels):
    be = hb.HalfBackend("bfloat16", inputs="bfloat16", threads=1)
    w = np.random.default_rng(9).standard_normal((48, 96)).astype(np.float32)
    assert be.prepare_weight("h.0.mlp.c_fc.weight", np.asfortranarray(w.T)).fmt == hb.PAIRS
    assert be.prepare_weight("wte.weight", w).fmt == hb.PAIRS
    assert be._code == IN16


def test_without_a_path_the_weights_stay_as_bfloat16(monkeypatch):
    class NoPath:  # the kernels of a CPU without a bfloat16 path
        def __getattr__(self, name):
            return getattr(KERNELS, name)

        def bf16_products(self):
            return "", "CPU lacks AVX512-BF16"

    monkeypatch.setattr(hb, "_KERNELS", NoPath())
    be = hb.HalfBackend("bfloat16", inputs="bfloat16", threads=1)
    w = np.random.default_rng(9).standard_normal((48, 96)).astype(np.float32)
    assert be.prepare_weight("wte.weight", w).fmt == "bfloat16" and be._code == BF16
