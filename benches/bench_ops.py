"""Per-kernel benchmarks at GPT-2 (124M) shapes, for every registered backend.

    python -m pytest benches/bench_ops.py --benchmark-only --benchmark-columns=min,median,rounds
    python -m pytest benches/bench_ops.py --benchmark-only -k "linear and decode"

Inputs go through the backend's own `from_numpy` / `prepare_weight` (under the weight's Hub name), so a
backend that re-lays weights out at load is measured with its layout. Widths: "prompt" = 32 tokens,
"decode" = 1 token, "long" = 512 tokens (where cpu-threaded's pool takes over).
"""

from __future__ import annotations

import numpy as np
import pytest

C, H, D, V, P = 768, 12, 64, 50257, 1024
ROWS = {"prompt": 32, "decode": 1, "long": 512}
LINEAR = {  # name: (Hub weight name, in, out)
    "c_attn": ("h.0.attn.c_attn", C, 3 * C),
    "c_proj": ("h.0.attn.c_proj", C, C),
    "mlp_fc": ("h.0.mlp.c_fc", C, 4 * C),
    "mlp_proj": ("h.0.mlp.c_proj", 4 * C, C),
}


def normal(*shape: int, scale: float = 1.0, seed: int = 0) -> np.ndarray:
    a = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
    a *= scale
    return a


@pytest.mark.parametrize("width", ["prompt", "decode"])
@pytest.mark.parametrize("layer", list(LINEAR))
def test_linear(benchmark, backend, layer, width):
    name, n_in, n_out = LINEAR[layer]
    x = backend.from_numpy(normal(1, ROWS[width], n_in))
    w = backend.prepare_weight(f"{name}.weight", normal(n_in, n_out, scale=n_in**-0.5, seed=1))
    b = backend.prepare_weight(f"{name}.bias", normal(n_out, scale=0.1, seed=2))
    benchmark(backend.linear, x, w, b)


def test_add(benchmark, backend):
    a, b = backend.from_numpy(normal(1, 32, C)), backend.from_numpy(normal(1, 32, C, seed=1))
    benchmark(backend.add, a, b)


def test_gelu_new(benchmark, backend):
    benchmark(backend.gelu_new, backend.from_numpy(normal(1, 32, 4 * C, scale=3.0)))


@pytest.mark.parametrize("width", ["prompt", "long"])
def test_layernorm(benchmark, backend, width):
    x = backend.from_numpy(normal(1, ROWS[width], C))
    g = backend.prepare_weight("h.0.ln_1.weight", 1.0 + normal(C, scale=0.1, seed=1))
    b = backend.prepare_weight("h.0.ln_1.bias", normal(C, scale=0.1, seed=2))
    benchmark(backend.layernorm, x, g, b, 1e-5)


@pytest.mark.parametrize("shape", [(1, V), (1, H, 64, 64)], ids=["vocab", "attention-12x64x64"])
def test_softmax(benchmark, backend, shape):
    benchmark(backend.softmax, backend.from_numpy(normal(*shape, scale=3.0)))


def test_embedding(benchmark, backend):
    wte = backend.prepare_weight("wte.weight", normal(V, C, scale=0.1))
    wpe = backend.prepare_weight("wpe.weight", normal(P, C, scale=0.02, seed=1))
    ids = backend.from_numpy(np.random.default_rng(2).integers(0, V, size=(1, 32)))
    benchmark(backend.embedding, wte, wpe, ids, 0)


@pytest.mark.parametrize("mode", ["prefill-64", "decode-at-64", "prefill-512"])
def test_attention(benchmark, backend, mode):
    """Causal attention over a 64-position context: all 64 queries at once, or the 64th alone."""
    context = 512 if mode == "prefill-512" else 64
    t = 1 if mode.startswith("decode") else context
    k = backend.from_numpy(normal(1, H, context, D, seed=1))
    v = backend.from_numpy(normal(1, H, context, D, seed=2))
    k_cache, v_cache = backend.write_kv(*backend.new_kv_cache(1, H, context, D), k, v, 0)
    q = backend.from_numpy(normal(1, H, t, D))
    benchmark(backend.attention, q, k_cache, v_cache, context - t)


def test_lm_head(benchmark, backend):
    """The logits of one position: x [1, 768] against the whole tied embedding (154 MB)."""
    wte = backend.prepare_weight("wte.weight", normal(V, C, scale=0.1))
    benchmark(backend.lm_head, backend.from_numpy(normal(1, C)), wte)


@pytest.mark.parametrize("width", ["prompt", "decode", "long"])
def test_mlp(benchmark, backend, width):
    x = backend.from_numpy(normal(1, ROWS[width], C))
    w = [backend.prepare_weight(f"h.0.mlp.{n}", a) for n, a in [
        ("c_fc.weight", normal(C, 4 * C, scale=C**-0.5, seed=1)),
        ("c_fc.bias", normal(4 * C, scale=0.1, seed=2)),
        ("c_proj.weight", normal(4 * C, C, scale=(4 * C) ** -0.5, seed=3)),
        ("c_proj.bias", normal(C, seed=4)),
    ]]
    benchmark(backend.mlp, x, *w)


@pytest.mark.parametrize("width", ["prompt", "long"])
def test_self_attention(benchmark, backend, width):
    """Prefill of `width` tokens into an empty cache: c_attn, heads, causal attention, c_proj."""
    t = ROWS[width]
    x = backend.from_numpy(normal(1, t, C))
    w = [backend.prepare_weight(f"h.0.attn.{n}", a) for n, a in [
        ("c_attn.weight", normal(C, 3 * C, scale=C**-0.5, seed=1)),
        ("c_attn.bias", normal(3 * C, seed=2)),
        ("c_proj.weight", normal(C, C, scale=C**-0.5, seed=3)),
        ("c_proj.bias", normal(C, seed=4)),
    ]]
    kv = backend.new_kv_cache(1, H, t, D)
    benchmark(backend.self_attention, x, *w, kv, 0, H)
