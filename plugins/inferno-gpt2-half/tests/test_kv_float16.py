"""kv=float16: the KV cache in float16 (half the bytes a decode step reads). The kernels write keys and
values rounded to nearest even, as NumPy's astype does, and read them widened to float32: every attention
path (decode, ragged, the tiled prompt paths, bfloat16) computes on a float16 cache exactly what it computes
on the same values held in float32. A finite key or value beyond float16's range raises, naming the option.
Each kernel test runs on every path this CPU has (`kernel_path`)."""

from __future__ import annotations

import inferno
import numpy as np
import pytest
from inferno.backends.numpy_backend import NumpyBackend
from inferno.models.config import Gpt2Config
from inferno.testing_fixtures import write_model_dir
from test_half import PROMPTS, _ragged_case, backend

import inferno_half.backend as hb

KERNELS = hb._KERNELS
pytestmark = pytest.mark.skipif(KERNELS is None, reason="the C kernels are not built")


def _edge_values(n: int, rng) -> np.ndarray:
    """n float32 values over float16's whole range: subnormals and their ties, the largest finite values,
    ties between neighbours, zeros of both signs, inf and NaN, then random magnitudes."""
    tiny = np.float32(2.0**-24)  # float16's smallest subnormal
    edge = [0.0, -0.0, tiny, tiny / 2, tiny * 1.5, tiny * 0.49, -tiny * 2.5, 6.1e-5, 6.097e-5, 65504.0,
            -65504.0, 65519.99, -65519.0, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 2049.0, 2051.0, np.inf, -np.inf,
            np.nan, 1e-8, 3e-5]
    rand = rng.standard_normal(n) * 10.0 ** rng.integers(-8, 5, n)
    return np.concatenate([np.array(edge, np.float32), rand.astype(np.float32)])[:n]


def _identity_block(be, c: int) -> tuple:
    """An attention block's weights and biases for `be`: c_attn [c, 3c] = [I I I], c_proj I, zero biases,
    so that the keys and values a step writes are its inputs, exactly (ones and zeros are exact in every
    16-bit format)."""
    eye = np.eye(c, dtype=np.float32)
    w_attn = be.prepare_weight("h.0.attn.c_attn.weight", np.concatenate([eye, eye, eye], axis=1))
    w_proj = be.prepare_weight("h.0.attn.c_proj.weight", eye)
    return w_attn, np.zeros(3 * c, np.float32), w_proj, np.zeros(c, np.float32)


@pytest.mark.parametrize("t", [1, 7, 100])
def test_cache_writes_round_as_numpy(t, kernel_path):
    # The fused decode block (and a 100-token prompt through it) writes float16 keys and values whose bits
    # are NumPy's float32 -> float16 rounding of the float32 cache's, on every path; the outputs are the
    # float32 attention of those values.
    n_head, d = 4, 16
    c = n_head * d
    x = _edge_values(t * c, np.random.default_rng(t)).reshape(1, t, c)
    x[~np.isfinite(x)] = 1.0  # (an inf or NaN key would make every output NaN; its bits are checked below)
    out, caches = {}, {}
    for kv in ("float32", "float16"):
        be = backend("float16", kv=kv, threads=2)
        cache = be.new_kv_cache(1, n_head, t + 3, d)
        assert cache[0].dtype == np.dtype(kv)
        out[kv], caches[kv] = be.self_attention(x, *_identity_block(be, c), cache, 0, n_head)
    for c16, c32 in zip(caches["float16"], caches["float32"], strict=True):
        np.testing.assert_array_equal(c16.view(np.uint16), c32.astype(np.float16).view(np.uint16))
        assert not c16[:, :, t:].any()
    assert (caches["float32"][0][:, :, :t] != 0).mean() > 0.9  # (the values are the edge values, written)
    want = out["float32"]
    np.testing.assert_allclose(out["float16"], want, rtol=0, atol=2e-3 * np.abs(want).max())


def test_every_value_rounds_as_numpy_through_the_ragged_step(kernel_path):
    # A NaN key stays a NaN, through the ragged step's writes.
    from inferno.backends.base import RaggedRow

    n_head, d, t = 2, 16, 40
    c = n_head * d
    x = _edge_values(t * c, np.random.default_rng(5)).reshape(1, t, c)
    x[~np.isfinite(x)] = 1.0
    x[0, -1, 3] = np.nan  # (the last token: its keys and values all NaN)
    caches = {}
    for kv in ("float32", "float16"):
        be = backend("float16", kv=kv, threads=2)
        slots = [be.new_kv_cache(1, n_head, t, d) for _ in range(2)]
        with np.errstate(invalid="ignore"):
            be.ragged_self_attention(x, *_identity_block(be, c), slots, [RaggedRow(1, 0, 0, t)], n_head)
        assert not any(a.any() for a in slots[0])
        caches[kv] = slots[1]
    for got, c32 in zip(caches["float16"], caches["float32"], strict=True):
        want = c32.astype(np.float16)
        assert np.isnan(want).any() and (np.abs(want) == 65504).any()
        assert np.array_equal(np.isnan(got), np.isnan(want))
        ok = ~np.isnan(want)
        np.testing.assert_array_equal(got[ok].view(np.uint16), want[ok].view(np.uint16))


@pytest.mark.parametrize("b, h, hkv, t, d, offset", [(2, 4, 4, 1, 64, 37), (1, 4, 2, 3, 32, 10),
                                                     (1, 2, 2, 100, 64, 5), (1, 3, 3, 70, 24, 0),
                                                     (1, 2, 1, 1, 12, 4100)])
@pytest.mark.parametrize("bf16", [False, True])
def test_attention_over_a_float16_cache_is_the_float32_attention_of_its_values(b, h, hkv, t, d, offset, bf16,
                                                                               kernel_path):
    # Decode (a query at a time), grouped-query heads, a long cache (scores on the heap), and prompts of
    # more than 64 queries (the tiled paths, float32 and bfloat16, on a widened copy): the same bits.
    rng = np.random.default_rng(t + d)
    length = offset + t + 3
    q = rng.standard_normal((b, h, t, d)).astype(np.float32)
    k, v = ((rng.standard_normal((b, hkv, length, d)) * 3).astype(np.float16) for _ in "kv")
    got, want = np.full_like(q, np.nan), np.full_like(q, np.nan)
    assert KERNELS.attention(q, k, v, offset, got, 2, bf16)
    assert KERNELS.attention(q, k.astype(np.float32), v.astype(np.float32), offset, want, 2, bf16)
    np.testing.assert_array_equal(got, want)


def test_caches_of_two_types_are_declined():
    q = np.ones((1, 2, 1, 16), np.float32)
    k = np.ones((1, 2, 4, 16), np.float16)
    out = np.full_like(q, 7.0)
    assert KERNELS.attention(q, k, k.astype(np.float32), 0, out, 1, False) is False
    assert (out == 7.0).all()


def test_the_ragged_step_on_float16_caches_is_the_float32_step_on_their_values(kernel_path):
    # The same step on float16 slots and on float32 slots holding the same values: the new keys and
    # values are the float32 ones rounded, and the outputs within float16's rounding of the keys.
    be32, x, weights, _, slots32, packed = _ragged_case(64, 4, [(0, 5, 2), (2, 11, 3), (1, 0, 1)], 32)
    slots32 = [tuple(a.astype(np.float16).astype(np.float32) for a in kv) for kv in slots32]
    slots16 = [tuple(a.astype(np.float16) for a in kv) for kv in slots32]
    be16 = backend("float16", kv="float16", threads=2)
    calls = []
    original = NumpyBackend.attention
    try:
        NumpyBackend.attention = lambda *a: calls.append(a) or original(*a)
        got = be16.ragged_self_attention(x, *weights, slots16, packed, 4)
    finally:
        NumpyBackend.attention = original
    assert not calls, "the ragged step ran NumPy's attention"
    want = be32.ragged_self_attention(x, *weights, slots32, packed, 4)
    for kv16, kv32 in zip(slots16, slots32, strict=True):
        for a16, a32 in zip(kv16, kv32, strict=True):
            np.testing.assert_array_equal(a16.view(np.uint16), a32.astype(np.float16).view(np.uint16))
    assert not np.array_equal(got, want)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-3 * np.abs(want).max())


@pytest.mark.parametrize("path", ["kernels", "numpy"])
def test_a_key_beyond_float16_range_raises_naming_the_option(path, monkeypatch):
    n_head, d = 2, 16
    c = n_head * d
    be = backend("float16", kv="float16", threads=1)
    block = _identity_block(be, c)
    if path == "numpy":
        monkeypatch.setattr(hb, "_KERNELS", None)
    x = np.ones((1, 3, c), np.float32)
    x[0, 1, 5] = 65520.0  # (65519.99 rounds to 65504; this, to inf)
    kv = be.new_kv_cache(1, n_head, 8, d)
    message = r"kv=float16: a key or value is beyond float16's range \(65504\).*kv=float32"
    with pytest.raises(ValueError, match=message):
        be.self_attention(x, *block, kv, 0, n_head)
    x[0, 1, 5] = 65519.99
    out, kv = be.self_attention(x, *block, kv, 0, n_head)
    assert np.isfinite(out).all() and kv[0][0, 0, 1, 5] == 65504.0


def test_the_option_is_checked_and_shown():
    assert backend("int8", kv="float16").new_kv_cache(2, 3, 5, 4)[1].dtype == np.float16
    assert backend("int8").new_kv_cache(2, 3, 5, 4)[1].dtype == np.float32
    with pytest.raises(ValueError, match=r"option kv='bfloat16' is not supported \(choose float32 or float1"):
        backend("float16", kv="bfloat16")
    assert "kv=float16" in hb.HalfBackend.description


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    config = Gpt2Config(vocab_size=50257, n_positions=160, n_embd=128, n_layer=2, n_head=2,
                        bos_token_id=50256, eos_token_id=50256)
    return write_model_dir(tmp_path_factory.mktemp("kv16"), config)


# (int8 quantizes each product's inputs: a change of an activation by float16's rounding can move an input
# across a quantization step, so there the two caches differ by up to int8's own error, ~1e-2)
@pytest.mark.parametrize("fmt, tolerance", [("float16", 2e-3), ("int8", 2e-2)])
def test_logits_are_within_float16s_rounding_of_the_float32_cache(small_model, fmt, tolerance):
    ids = list(np.random.default_rng(8).integers(0, 50257, 100))
    exact = inferno.load(small_model, f"half:dtype={fmt}", download=False).logits(ids)
    half = inferno.load(small_model, f"half:dtype={fmt},kv=float16", download=False).logits(ids)
    assert not np.array_equal(half, exact)  # (the float16 cache was used)
    assert np.abs(half - exact).max() <= tolerance * np.abs(exact).max()


def test_batched_sequences_get_the_ids_they_get_alone(small_model, monkeypatch):
    # Through the engine (ragged steps in the C kernels), each sequence's greedy ids equal its own run's:
    # a float16 cache keeps the batch invariance.
    pipe = inferno.load(small_model, "half:dtype=int8,kv=float16", download=False)
    prompts = PROMPTS
    alone = [pipe.generate(p, max_new_tokens=8, stop_at_eos=False).ids for p in prompts]
    for name in ("attention", "ragged_self_attention"):
        monkeypatch.setattr(NumpyBackend, name, lambda *a, name=name: pytest.fail(f"NumPy's {name} ran"))
    together = [r.ids for r in pipe.generate_batch(prompts, max_new_tokens=8, stop_at_eos=False)]
    assert together == alone


def test_a_prefix_copied_between_float16_slots_gives_the_tokens_of_a_run_alone(small_model):
    # Automatic prefix caching copies a running sequence's cached prefix into another slot (the backend's
    # write_kv, float16 to float16): the second sequence gets the ids it gets alone.
    from inferno.engine import Engine
    from inferno.generate import generate_tokens

    model = inferno.load(small_model, "half:dtype=int8,kv=float16", download=False).model
    engine = Engine(model, slots=2, prefix_block=4, autostart=False)
    context = list(range(1000, 1016))  # four whole blocks
    first = engine.submit([*context, 1], 12)
    engine.step()
    second = engine.submit([*context, 2, 3], 6)
    while not (first.done and second.done):
        engine.step()
    assert engine.stats.prefix_cache_hits == 16 and engine.stats.prefix_cache_copies == 1
    assert second.state.ids == list(generate_tokens(model, [*context, 2, 3], 6))
    assert first.state.ids == list(generate_tokens(model, [*context, 1], 12))


@pytest.mark.parametrize("variant", ["qwen3", "llama-gqa4-bias"])
def test_a_llama_model_on_a_float16_cache(variant):
    # The Llama family writes its rotated keys through write_kv and attends by groups of query heads
    # (one C call over the float16 cache): within float16's rounding of the float32 cache's logits.
    from inferno.models.llama import LlamaConfig, from_state_dict
    from inferno.testing import llama_config, llama_state_dict

    cfg = llama_config(variant, tie_word_embeddings=True)
    config = LlamaConfig.from_dict(cfg)
    sd = llama_state_dict(cfg, seed=5)
    ids = np.random.default_rng(1).integers(0, config.vocab_size, (2, 7))
    got = {}
    for kv in ("float32", "float16"):
        model = from_state_dict(config, sd, backend("float16", kv=kv, threads=2))
        cache = model.new_cache(2)
        assert cache.layers[0][0].dtype == np.dtype(kv)
        got[kv] = np.concatenate([model.forward(ids[:, :5], cache, all_logits=True),
                                  model.forward(ids[:, 5:], cache, all_logits=True)], axis=1)
    want = got["float32"]
    assert not np.array_equal(got["float16"], want)
    np.testing.assert_allclose(got["float16"], want, rtol=0, atol=2e-3 * np.abs(want).max())


def test_a_sequence_whose_key_overflows_fails_alone_in_the_engine():
    # One token of this model makes a key beyond float16's range in layer 0 (its embedding a spike in
    # dimension 0, which no other token or position uses; the keys' weights from that dimension large; the
    # other prompts never generate it): the sequence holding it ends with kv=float16's error, and the
    # others of its steps finish with the ids they get alone.
    from inferno.engine import Engine
    from inferno.errors import BackendError
    from inferno.models.gpt2 import Gpt2
    from inferno.testing import random_state_dict, small_config

    config = small_config(vocab_size=64, n_positions=32, n_embd=32, n_head=2)
    sd = random_state_dict(config, seed=3)
    poison, c = 7, config.n_embd
    sd["wte.weight"][:, 0] = 0.0
    sd["wpe.weight"][:, 0] = 0.0
    sd["wte.weight"][poison] = 0.0
    sd["wte.weight"][poison, 0] = 1000.0
    sd["h.0.attn.c_attn.weight"][0, c : 2 * c] = 30000.0  # (GPT-2's Conv1D: [in, out]; keys at c .. 2c)
    sd["ln_f.weight"][0] = sd["ln_f.bias"][0] = 0.0  # (the tied head: its logit 0, not 1000x the others')
    model = Gpt2.from_weights(config, sd, backend("float16", kv="float16", threads=2))
    prompts = [[1, 2, 3, 4], [5, 6, poison, 8], [9, 10]]
    engine = Engine(model, slots=3, autostart=False)
    try:
        alone = []
        for p in prompts[::2]:
            h = engine.submit(p, 5)
            while engine.step():
                pass
            alone.append(h.result().ids)
        handles = [engine.submit(p, 5) for p in prompts]
        while engine.step():
            pass
    finally:
        engine.close()
    with pytest.raises(BackendError, match=r"kv=float16: a key or value is beyond float16's range \(65504\)"):
        handles[1].result()
    assert [handles[0].result().ids, handles[2].result().ids] == alone


@pytest.mark.parametrize("kv", ["float32", "float16"])
def test_a_slot_takes_memory_as_its_sequences_reach(kv):
    # The caches come from the core's kv_zeros (small pages, zero until written), not np.zeros (NumPy
    # madvises huge pages on 4 MB and more: a slot's first tokens then made most of it resident). A
    # ragged step of 4-token rows into 2 slots of a 32-head layer (16384 positions: 64 MB or more an array,
    # beyond malloc's largest mmap threshold, so fresh pages) touches a page a head, not 2 MB.
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc/self/statm (Linux)")
    from inferno.backends.base import RaggedRow

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    be = hb.HalfBackend("int8", kv=kv, threads=2)
    slots = [be.new_kv_cache(1, 32, 16384, 64) for _ in range(2)]
    assert all(a.dtype == np.dtype(kv) and not a.any() for kc in slots for a in kc)
    rng = np.random.default_rng(0)
    k, v = (rng.standard_normal((1, 32, 8, 64)).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((1, 32, 8, 64)).astype(np.float32)
    before = rss()
    be.ragged_gqa_attention(q, k, v, slots, [RaggedRow(s, 0, 4 * s, 4) for s in range(2)])
    assert rss() - before < 4 << 20  # (huge pages: 2 slots x 2 arrays x 32 heads x 2 MB)
