"""The torch backend's own Llama-family kernels: each runs natively (the base class's default, which goes
to the host and back, is never called), matches its float64 reference within the conformance suite's
tolerance for the compute dtype, and a random Llama-family model runs on them with oneDNN-packed weights."""

from __future__ import annotations

import math

import numpy as np
import pytest
from inferno.backends.array_api import ArrayApiBackend
from inferno.backends.base import Backend
from inferno.backends.registry import get_backend
from inferno.conformance import reference as ref
from inferno.conformance.harness import tolerance_for

torch = pytest.importorskip("torch")

KERNELS = ("embed_tokens", "heads", "rms_norm", "rotary", "silu_mul", "gqa_attention")
DTYPES = ["float32", "bfloat16"]


@pytest.fixture
def no_defaults(monkeypatch):
    """Every Llama kernel of `Backend` (and the Array API versions torch's backend inherits) raises."""
    for cls in (Backend, ArrayApiBackend):
        for kernel in KERNELS:
            def refuse(*args, _kernel=kernel, **kwargs):
                raise AssertionError(f"the inherited {_kernel} was called")
            monkeypatch.setattr(cls, kernel, refuse)


def close(got, want, dtype: str) -> None:
    tol = tolerance_for(dtype)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol.rtol,
                               atol=tol.atol * float(np.abs(want).max()))


def held(be, a: np.ndarray):
    """(backend array, the float64 values it holds after rounding to the compute dtype)."""
    x = be.from_numpy(np.asarray(a, np.float32))
    return x, be.to_numpy(x).astype(np.float64)


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernels_are_native_and_match_the_reference(no_defaults, dtype):
    be = get_backend(f"torch:device=cpu,dtype={dtype}")
    rng = np.random.default_rng(0)
    normal = rng.standard_normal
    wte, wte64 = held(be, normal((50, 24)))
    ids = rng.integers(0, 50, (2, 5))
    close(be.to_numpy(be.embed_tokens(wte, be.from_numpy(ids))), ref.embed_tokens(wte64, ids), dtype)

    x, x64 = held(be, normal((2, 3, 4 * 6)))
    close(be.to_numpy(be.heads(x, 4)), ref.heads(x64, 4), dtype)

    x, x64 = held(be, normal((2, 3, 64)) * 4)
    g, g64 = held(be, 1 + 0.2 * normal(64))
    close(be.to_numpy(be.rms_norm(x, g, 1e-6)), ref.rms_norm(x64, g64, 1e-6), dtype)
    # Qwen3's q/k norm runs on the heads' view (not contiguous).
    h = be.heads(x, 4)
    close(be.to_numpy(be.rms_norm(h, g[:16], 1e-6)), ref.rms_norm(ref.heads(x64, 4), g64[:16], 1e-6), dtype)

    positions = np.array([0, 7, 4100, 8193])
    angles = positions[:, None] * (1e4 ** -(np.arange(0, 16, 2) / 16))[None, :]
    cos, cos64 = held(be, np.cos(angles))
    sin, sin64 = held(be, np.sin(angles))
    q, q64 = held(be, normal((2, 3, 4, 16)))
    close(be.to_numpy(be.rotary(q, cos, sin)), ref.rotary(q64, cos64, sin64), dtype)

    gate, gate64 = held(be, normal((2, 3, 40)) * 30)  # exp(-gate) overflows float32 for some
    up, up64 = held(be, normal((2, 3, 40)))
    close(be.to_numpy(be.silu_mul(gate, up)), ref.silu_mul(gate64, up64), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("h", "kv", "t", "d", "offset", "length"), [
    (9, 3, 5, 64, 0, 8),       # a prompt, ratio 3
    (6, 2, 1, 16, 11, 16),     # decode
    (8, 1, 3, 7, 4, 10),       # ratio 8, odd head size, queries past the start
    (4, 4, 2, 8, 3, 9),        # ratio 1
])
def test_gqa_attention_is_one_call_and_matches_the_reference(no_defaults, monkeypatch, dtype, h, kv, t, d,
                                                             offset, length):
    be = get_backend(f"torch:device=cpu,dtype={dtype}")
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(be, "_F", type("F", (), {
        "scaled_dot_product_attention": staticmethod(lambda *a, **k: calls.append(k) or sdpa(*a, **k))}))
    rng = np.random.default_rng(h * 100 + t)
    k_host = rng.standard_normal((2, kv, length, d))
    v_host = rng.standard_normal((2, kv, length, d))
    k_host[:, :, offset + t :] = 1e4  # garbage past the valid positions: must be ignored
    k, k64 = held(be, k_host)
    v, v64 = held(be, v_host)
    q, q64 = held(be, rng.standard_normal((2, h, t, d)))
    got = be.to_numpy(be.gqa_attention(q, k, v, offset))
    s = offset + t
    close(got, ref.gqa_attention(q64, k64[:, :, :s], v64[:, :, :s], offset), dtype)
    assert len(calls) == 1  # one fused call for every query head, not one per group member
    assert calls[0].get("enable_gqa", False) == (kv != h)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_llama_model_runs_on_the_native_kernels(no_defaults, dtype):
    from inferno.backends.numpy_backend import NumpyBackend
    from inferno.models.llama import LlamaConfig, from_state_dict
    from inferno.testing import llama_config, llama_state_dict

    from inferno_torch.backend import LinearWeight

    variant = llama_config("qwen3", tie_word_embeddings=True)
    config = LlamaConfig.from_dict(variant)
    sd = llama_state_dict(variant, seed=3)
    be = get_backend(f"torch:device=cpu,dtype={dtype}")
    model = from_state_dict(config, sd, be)
    if be.onednn:  # the projections and the tied head run on oneDNN-packed weights, as GPT-2's do
        assert isinstance(model.blocks[0].q_w, LinearWeight) and model.blocks[0].q_w.packed
        assert isinstance(model.blocks[0].down_w, LinearWeight) and model.blocks[0].down_w.packed
        assert model.embed_tokens._inferno_head.packed
    oracle = from_state_dict(config, sd, NumpyBackend("float64"))
    ids = np.random.default_rng(1).integers(0, config.vocab_size, (2, 7))
    want = oracle.forward(ids, all_logits=True)
    cache = model.new_cache(2)
    got = np.concatenate([be.to_numpy(model.forward(ids[:, :5], cache, all_logits=True)),
                          be.to_numpy(model.forward(ids[:, 5:6], cache, all_logits=True)),
                          be.to_numpy(model.forward(ids[:, 6:], cache, all_logits=True))], axis=1)
    tol = tolerance_for(dtype)
    worst = float(np.abs(got - want).max())
    assert worst <= 10 * tol.atol * float(np.abs(want).max()), f"{dtype}: max error {worst:.3g}"
    assert math.isfinite(worst)
