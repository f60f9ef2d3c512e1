"""The conformance checks of the Llama family's kernels (`embed_tokens`, `heads`, `linears`, `rms_norm`,
`rotary`, `silu_mul`, `gqa_attention`, the `gated_mlp` and `ragged_gqa_attention` compositions) and of a small
random Llama-family model, registered beside the GPT-2 ones (`inferno.conformance.checks` runs them
after those), with the same tolerances and messages.

Every one of these kernels has a default in `Backend`, so a backend that does not implement them passes
through its defaults (built from its GPT-2 kernels and the host); one that does proves its own here.
The attention cases cover grouped-query ratios 1, 3 and 8, odd head sizes and positions past 4096; the
rotary cases positions past 4096 too, where float32 angles would already be off.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from inferno.conformance import reference as ref
from inferno.conformance.harness import Check, _Run, _shape, register
from inferno.conformance.kernel_checks import _fill_cache
from inferno.conformance.ragged import (
    check_slots,
    packed_rows,
    ragged_hosts,
    ragged_output,
    row_name,
    run_ragged,
)

#: This module's checks, in the order they are added (`inferno.conformance.checks.all_checks` runs them
#: after the GPT-2 ones).
CHECKS: list[Check] = []
_add = partial(register, CHECKS)

# ------------------------------------------------------------------------------------------ kernels


def _embed_tokens(run: _Run, v, c, ids_shape) -> None:
    wte, wte64 = run.weight("model.embed_tokens.weight", run.normal((v, c)))
    ids = run.rng.integers(0, v, size=ids_shape)
    run.expect(run.backend.embed_tokens(wte, run.ids(ids)), ref.embed_tokens(wte64, ids))


_add("embed_tokens", "smollm2", "wte [300, 576], ids [2, 5]", _embed_tokens, v=300, c=576, ids_shape=(2, 5))
_add("embed_tokens", "T1", "wte [50, 24], ids [1, 1]", _embed_tokens, v=50, c=24, ids_shape=(1, 1))


def _heads(run: _Run, b, t, h, d) -> None:
    x, x64 = run.array(run.normal((b, t, h * d)))
    run.expect(run.backend.heads(x, h), ref.heads(x64, h))


_add("heads", "qwen2.5-q", "x [1, 3, 896] into 14 heads of 64", _heads, b=1, t=3, h=14, d=64)
_add("heads", "odd", "x [2, 4, 15] into 3 heads of 5", _heads, b=2, t=4, h=3, d=5)


def _linears(run: _Run, x_shape, outs, bias) -> None:
    c = x_shape[-1]
    x, x64 = run.array(run.normal(x_shape))
    names = ("q_proj", "k_proj", "v_proj")[: len(outs)]
    ws, bs, want = [], [], []
    for name, n in zip(names, outs, strict=True):
        w, w64 = run.weight(f"model.layers.0.self_attn.{name}.weight", run.normal((c, n), scale=c**-0.5))
        b, b64 = (run.weight(f"model.layers.0.self_attn.{name}.bias", run.normal(n, scale=0.1)) if bias
                  else (None, None))
        ws.append(w)
        bs.append(b)
        want.append(ref.linear(x64, w64, b64))
    got = run.backend.linears(x, ws, bs)
    if not isinstance(got, list | tuple) or len(got) != len(outs):
        run.fail(f"returned a {type(got).__name__}, expected a list of {len(outs)} arrays")
    for i, (name, out, expected) in enumerate(zip(names, got, want, strict=True)):
        run.expect(out, expected, what=f"output {i} ({name})", factor=2)


_add("linears", "smollm2-qkv", "x [1, 3, 576] by q, k, v of 576, 192, 192 outputs", _linears,
     x_shape=(1, 3, 576), outs=(576, 192, 192), bias=False)
_add("linears", "qwen2-qkv-bias", "x [2, 2, 64] by q, k, v of 64, 32, 32 outputs, with biases", _linears,
     x_shape=(2, 2, 64), outs=(64, 32, 32), bias=True)
_add("linears", "odd-two", "x [1, 1, 35] by two weights of 40 and 7 outputs", _linears, x_shape=(1, 1, 35),
     outs=(40, 7), bias=True)


def _rms_norm(run: _Run, shape, scale=1.0, eps=1e-5) -> None:
    n = shape[-1]
    x, x64 = run.array(run.normal(shape, scale=scale))
    g, g64 = run.weight("model.layers.0.input_layernorm.weight", run.normal(n, scale=0.2, loc=1.0))
    run.expect(run.backend.rms_norm(x, g, eps), ref.rms_norm(x64, g64, eps))


_add("rms_norm", "smollm2", "x [2, 4, 576] ~ N(0, 1), eps 1e-5", _rms_norm, shape=(2, 4, 576))
_add("rms_norm", "per-head", "x [1, 3, 5, 128] ~ N(0, 4²) over each head (Qwen3's q/k norm), eps 1e-6",
     _rms_norm, shape=(1, 3, 5, 128), scale=4.0, eps=1e-6)
_add("rms_norm", "small-values", "x [2, 3, 64] ~ N(0, 0.003²), eps 1e-5 (eps ~ mean square)", _rms_norm,
     shape=(2, 3, 64), scale=3e-3)
_add("rms_norm", "odd", "x [1, 2, 35] ~ N(0, 30²), eps 1e-6", _rms_norm, shape=(1, 2, 35), scale=30.0,
     eps=1e-6)


def _rotary(run: _Run, b, h, d, positions, theta) -> None:
    x, x64 = run.array(run.normal((b, h, len(positions), d)))
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    angles = np.asarray(positions, dtype=np.float64)[:, None] * inv[None, :]
    cos, cos64 = run.array(np.cos(angles))
    sin, sin64 = run.array(np.sin(angles))
    run.expect(run.backend.rotary(x, cos, sin), ref.rotary(x64, cos64, sin64))


_add("rotary", "prefill", "x [1, 4, 5, 64] at positions 0..4, theta 1e4", _rotary, b=1, h=4, d=64,
     positions=range(5), theta=1e4)
_add("rotary", "past-4096", "x [2, 2, 4, 128] at positions 8190..8193, theta 5e5", _rotary, b=2, h=2, d=128,
     positions=range(8190, 8194), theta=5e5)
_add("rotary", "ragged-positions", "x [1, 3, 4, 6] at positions 0, 7, 4100, 3 (D/2 odd)", _rotary, b=1, h=3,
     d=6, positions=[0, 7, 4100, 3], theta=1e4)


def _silu_mul(run: _Run, shape, scale) -> None:
    g, g64 = run.array(run.normal(shape, scale=scale))
    u, u64 = run.array(run.normal(shape))
    run.expect(run.backend.silu_mul(g, u), ref.silu_mul(g64, u64))


_add("silu_mul", "smollm2", "gate, up [1, 4, 1536] ~ N(0, 3²), N(0, 1)", _silu_mul, shape=(1, 4, 1536),
     scale=3.0)
_add("silu_mul", "saturated", "gate ~ N(0, 100²) [2, 3, 40] (exp(-gate) overflows float32)", _silu_mul,
     shape=(2, 3, 40), scale=100.0)


def _gqa_attention(run: _Run, b, h, kv, t, d, offset, length) -> None:
    k_cache, v_cache, k64, v64 = _fill_cache(run, b, kv, length, d, offset + t)
    q, q64 = run.array(run.normal((b, h, t, d)))
    want = ref.gqa_attention(q64, k64, v64, offset)
    run.expect(run.backend.gqa_attention(q, k_cache, v_cache, offset), want)


#: (batch, query heads, key/value heads, new positions, head size, offset, cache length).
_GQA_CASES = {
    "ratio-1": (2, 3, 3, 4, 8, 2, 9),
    "ratio-3-smollm2": (1, 9, 3, 5, 64, 0, 8),
    "ratio-3-decode": (2, 6, 2, 1, 16, 11, 16),
    "ratio-8-odd-D": (1, 8, 1, 3, 7, 4, 10),
    "ratio-7-qwen2.5": (1, 14, 2, 2, 64, 5, 9),
    "odd-D5": (3, 4, 2, 6, 5, 0, 6),
    "past-4096": (1, 4, 2, 3, 16, 4100, 4104),
}
for _name, (_b, _h, _kv, _t, _d, _off, _len) in _GQA_CASES.items():
    _add("gqa_attention", _name, f"q {_shape((_b, _h, _t, _d))} over {_kv} key/value heads at offset {_off}, "
         f"cache length {_len} (garbage past {_off + _t})", _gqa_attention, b=_b, h=_h, kv=_kv, t=_t, d=_d,
         offset=_off, length=_len)


def _ragged_gqa_attention(run: _Run, h, kv, d, n_slots, length, rows, stale=None) -> None:
    """ragged_gqa_attention over `rows` = (slot, offset, T) packed in this order, the slots filled and
    checked as `ragged_self_attention`'s are (`inferno.conformance.ragged`); each row against its own batch-1
    grouped-query attention (the float64 reference)."""
    be, stale = run.backend, stale or {}
    shape = (1, kv, length, d)
    packed, n = packed_rows(rows)
    q, q64 = run.array(run.normal((1, h, n, d)))
    k, k64 = run.array(run.normal((1, kv, n, d)))
    v, v64 = run.array(run.normal((1, kv, n, d)))
    hosts = ragged_hosts(run, shape, n_slots, {r.slot: r.offset for r in packed}, stale)

    def call(slot_kv):
        y = be.ragged_gqa_attention(q, k, v, slot_kv, packed)
        return ragged_output(run, y, slot_kv, n_slots, (1, h, n, d), "[1, H, N, D]")

    got, slot_kv, k_held, v_held = run_ragged(run, call, hosts, packed, shape, stale, tokens_axis=2)
    want, k_want, v_want = ref.ragged_gqa_attention(
        q64, k64, v64, [(r.slot, r.offset, r.start, r.length) for r in packed], k_held, v_held)
    for i, r in enumerate(packed):
        sl = slice(r.start, r.start + r.length)
        run.expect(got[:, :, sl], want[:, :, sl], what=f"output of {row_name(i, r, stale)}", factor=4)
    check_slots(run, slot_kv, packed, shape, stale, (k_held, v_held), (k_want, v_want))


for _case, _what, _params in [
    ("smollm2-decode", "H 9 over 3 key/value heads of 64, 4 slots of 40: decode rows at offsets 20, 39 (the "
     "last position), 0 and 7", dict(h=9, kv=3, d=64, n_slots=4, length=40,
                                      rows=[(0, 20, 1), (1, 39, 1), (2, 0, 1), (3, 7, 1)])),
    ("prompt-beside-decode", "H 14 over 2 key/value heads of 16, 3 slots of 24: a prompt of 6 at offset 0 "
     "between decode steps at 11 and 23", dict(h=14, kv=2, d=16, n_slots=3, length=24,
                                                 rows=[(1, 11, 1), (0, 0, 6), (2, 23, 1)])),
    ("chunks-odd-D", "H 8 over 1 key/value head of 7, 4 slots of 16: chunks of 3 at offset 4 and 5 at 7 in "
     "slots 3 and 0, a decode step at 9; slot 2 unused, untouched",
     dict(h=8, kv=1, d=7, n_slots=4, length=16, rows=[(3, 4, 3), (1, 9, 1), (0, 7, 5)])),
    ("ratio-1-slot-reuse", "H 3 over 3 key/value heads of 5, 3 slots of 24: a prompt of 4 at offset 0 in "
     "slot 1 over a stale sequence of 20 and one of 1 in slot 2 over a stale 10, beside a decode step at 8; "
     "as in fresh slots", dict(h=3, kv=3, d=5, n_slots=3, length=24, rows=[(0, 8, 1), (1, 0, 4), (2, 0, 1)],
                          stale={1: 20, 2: 10})),
    ("one-row", "H 4 over 2 key/value heads of 8, 2 slots of 12: one row of 4 tokens at offset 3 in slot 1",
     dict(h=4, kv=2, d=8, n_slots=2, length=12, rows=[(1, 3, 4)])),
]:
    _add("ragged_gqa_attention", _case, _what, _ragged_gqa_attention, kind="composition", **_params)


# -------------------------------------------------------------------------------------- composition


def _gated_mlp(run: _Run, x_shape, inner) -> None:
    c = x_shape[-1]
    x, x64 = run.array(run.normal(x_shape))
    weights = []
    for name, n_in, n_out in (("gate_proj", c, inner), ("up_proj", c, inner), ("down_proj", inner, c)):
        weights.append(run.weight(f"model.layers.0.mlp.{name}.weight", run.normal((n_in, n_out),
                                                                                    scale=n_in**-0.5)))
    (wg, wg64), (wu, wu64), (wd, wd64) = weights
    run.expect(run.backend.gated_mlp(x, wg, wu, wd), ref.gated_mlp(x64, wg64, wu64, wd64), factor=2)


_add("gated_mlp", "smollm2-decode", "x [1, 1, 576], I 1536", _gated_mlp, kind="composition",
     x_shape=(1, 1, 576), inner=1536)
_add("gated_mlp", "odd", "x [2, 3, 35], I 40", _gated_mlp, kind="composition", x_shape=(2, 3, 35), inner=40)


# -------------------------------------------------------------------------------------------- model


def _llama_model(run: _Run, variant, chunks, ragged) -> None:
    """A small random Llama-family model through `inferno.models.llama`: logits on this backend against
    the numpy backend in float64, for a prefill and cached decode steps (`forward`), or two steps of a
    ragged batch (`forward_ragged`) against batch-1 forwards."""
    from inferno.backends.numpy_backend import NumpyBackend
    from inferno.models.llama import LlamaConfig, from_state_dict
    from inferno.testing import llama_config, llama_state_dict

    config = LlamaConfig.from_dict(llama_config(variant))
    sd = llama_state_dict(llama_config(variant), seed=int(run.rng.integers(1 << 30)))
    oracle = from_state_dict(config, sd, NumpyBackend("float64"))
    model = from_state_dict(config, sd, run.backend)
    total = sum(chunks)
    ids = run.rng.integers(0, config.vocab_size, size=(2, total))
    want = oracle.forward(ids, all_logits=True)
    if not ragged:
        cache, offset = model.new_cache(2), 0
        for t in chunks:
            logits = run.host(model.forward(ids[:, offset : offset + t], cache, all_logits=True), "logits")
            what = f"logits of positions {offset}..{offset + t - 1}" + (" (cached)" if offset else "")
            run.expect(logits, want[:, offset : offset + t], factor=10, what=what,
                       against="the numpy backend in float64")
            offset += t
        return
    slots = model.new_slots(3)
    a, b = ids[0].tolist(), ids[1].tolist()
    first = run.host(model.forward_ragged([(a[:5], 2, 0), (b[:3], 0, 0)], slots), "step 1 logits")
    run.expect(first, np.stack([want[0, 4], want[1, 2]]), factor=10, what="step 1 logits (two prompts)",
               against="batch-1 forwards on the numpy backend in float64")
    second = run.host(model.forward_ragged([(b[3:4], 0, 3), (a[5:total], 2, 5)], slots), "step 2 logits")
    run.expect(second, np.stack([want[1, 3], want[0, total - 1]]), factor=10,
               what="step 2 logits (a decode row beside a prompt chunk)",
               against="batch-1 forwards on the numpy backend in float64")


for _case, _variant in (("llama-gqa4-bias", "llama-gqa4-bias"), ("llama-qwen3", "qwen3"),
                        ("llama-mistral-odd", "mistral-odd"), ("llama-qwen2", "qwen2")):
    _add("model", _case, f"random {_variant} (inferno.testing.LLAMA_VARIANTS); B 2: prefill 5, then 3 tokens",
         _llama_model, kind="model", variant=_variant, chunks=[5, 1, 1, 1], ragged=False)
_add("model", "llama-ragged", "random qwen3 through forward_ragged: two prompts, then a decode row beside a "
     "prompt chunk", _llama_model, kind="model", variant="qwen3", chunks=[5, 3], ragged=True)
