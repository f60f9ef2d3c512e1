"""The conformance checks of kind "kernel": the from_numpy/to_numpy boundary and each GPT-2 kernel alone
(linear, gelu_new, layernorm, softmax, add, embedding, concat, split/merge heads, the KV cache's
new_kv_cache and write_kv, attention, attention_weights, lm_head)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

import numpy as np

from inferno.conformance import reference as ref
from inferno.conformance.harness import Check, _Run, _shape, register

#: This module's checks, in the order they are added (`inferno.conformance.checks.all_checks` runs them).
CHECKS: list[Check] = []
_add = partial(register, CHECKS)

# ------------------------------------------------------------------------------------------ boundary


def _roundtrip_float(run: _Run) -> None:
    # Values every float format holds approximately: the check is the trip, not the precision.
    host = run.normal((3, 7), scale=10.0)
    run.expect(run.backend.from_numpy(host), host, what="to_numpy(from_numpy(x))",
               against="the input")


def _roundtrip_ids(run: _Run) -> None:
    host = np.array([[0, 50256, 7], [1, 2, 50000]], dtype=np.int64)
    got = run.host(run.ids(host), "to_numpy(from_numpy(ids))")
    if got.dtype.kind not in "iu" or got.shape != host.shape or not np.array_equal(got, host):
        run.fail(f"integer ids came back as {got.dtype} {list(got.shape)} {got.tolist()}, "
                 f"expected integers {host.tolist()}")


def _roundtrip_empty(run: _Run) -> None:
    # The logits of an engine step that samples no row (every row a prompt chunk still going on).
    host = np.zeros((0, 50257), dtype=np.float32)
    run.expect(run.backend.from_numpy(host), host, what="to_numpy(from_numpy(x))", against="the input")


_add("from_numpy", "roundtrip-float", "x [3, 7] ~ N(0, 10²)", _roundtrip_float)
_add("from_numpy", "roundtrip-empty", "x [0, 50257] (the logits of a ragged step that samples no row)",
     _roundtrip_empty)
_add("from_numpy", "roundtrip-ids", "int64 ids [2, 3] up to 50256", _roundtrip_ids)


# ------------------------------------------------------------------------------------------- kernels


def _linear(run: _Run, x_shape, n_out, bias=True, name="h.0.mlp.c_fc") -> None:
    n_in = x_shape[-1]
    x, x64 = run.array(run.normal(x_shape))
    w, w64 = run.weight(f"{name}.weight", run.normal((n_in, n_out), scale=n_in**-0.5))
    b, b64 = run.weight(f"{name}.bias", run.normal(n_out, scale=0.1)) if bias else (None, None)
    run.expect(run.backend.linear(x, w, b), ref.linear(x64, w64, b64))


for _case, _x, _out, _bias, _name in [
    ("gpt2-c_attn", (1, 4, 768), 2304, True, "h.0.attn.c_attn"),
    ("gpt2-c_fc", (1, 4, 768), 3072, True, "h.0.mlp.c_fc"),
    ("gpt2-c_proj", (1, 4, 3072), 768, True, "h.0.mlp.c_proj"),
    ("batch-T1", (3, 1, 40), 24, True, "h.0.attn.c_proj"),
    ("no-bias", (2, 3, 17), 9, False, "h.0.mlp.c_fc"),
    ("2d-input", (5, 16), 8, True, "h.0.mlp.c_fc"),
]:
    _add("linear", _case, f"x {_shape(_x)} @ w [{_x[-1]}, {_out}]" + (" + b" if _bias else ", b None"),
         _linear, x_shape=_x, n_out=_out, bias=_bias, name=_name)


def _gelu(run: _Run, shape, scale) -> None:
    x, x64 = run.array(run.normal(shape, scale=scale))
    run.expect(run.backend.gelu_new(x), ref.gelu_new(x64))


_add("gelu_new", "gpt2-4C", "x [1, 4, 3072] ~ N(0, 3²)", _gelu, shape=(1, 4, 3072), scale=3.0)
_add("gelu_new", "large", "x [2, 3, 64] ~ N(0, 20²) (tanh saturates)", _gelu, shape=(2, 3, 64), scale=20.0)
_add("gelu_new", "T1", "x [1, 1, 768] ~ N(0, 1)", _gelu, shape=(1, 1, 768), scale=1.0)


def _layernorm(run: _Run, shape, loc=0.0, scale=1.0, eps=1e-5, factor=1.0) -> None:
    c = shape[-1]
    x, x64 = run.array(run.normal(shape, scale=scale, loc=loc))
    g, g64 = run.weight("h.0.ln_1.weight", run.normal(c, scale=0.2, loc=1.0))
    b, b64 = run.weight("h.0.ln_1.bias", run.normal(c, scale=0.2))
    run.expect(run.backend.layernorm(x, g, b, eps), ref.layernorm(x64, g64, b64, eps), factor=factor)


_add("layernorm", "gpt2", "x [2, 4, 768] ~ N(0, 1), eps 1e-5", _layernorm, shape=(2, 4, 768))
# Even a two-pass layer norm loses ~eps·mean/std here (the mean is rounded), hence the factor; a one-pass
# E[x²] - E[x]² loses eps·(mean/std)² and fails by far.
_add("layernorm", "large-mean", "x [2, 3, 768] ~ 1e4 + N(0, 10²), eps 1e-5 (var ≪ mean²)", _layernorm,
     shape=(2, 3, 768), loc=1e4, scale=10.0, factor=10)
_add("layernorm", "small-variance", "x [2, 3, 768] ~ N(0, 0.003²), eps 1e-5 (eps ~ variance)", _layernorm,
     shape=(2, 3, 768), scale=3e-3)
_add("layernorm", "eps-1e-3", "x [1, 2, 64] ~ N(0, 0.03²), eps 1e-3 (eps is an argument)", _layernorm,
     shape=(1, 2, 64), scale=0.03, eps=1e-3)
_add("layernorm", "2d-input", "x [3, 768] ~ N(0, 1), eps 1e-5", _layernorm, shape=(3, 768))
_add("layernorm", "T1-odd-C", "x [3, 1, 15] ~ N(0, 1), eps 1e-5", _layernorm, shape=(3, 1, 15))


def _softmax(run: _Run, shape, scale=1.0, loc=0.0, masked=False) -> None:
    host = run.normal(shape, scale=scale, loc=loc)
    if masked:
        # -inf where attention masks; column 0 stays finite so no row is all -inf.
        host[..., 1:][run.rng.random(host[..., 1:].shape) < 0.5] = -np.inf
    x, x64 = run.array(host)
    run.expect(run.backend.softmax(x), ref.softmax(x64))


_add("softmax", "gpt2-vocab", "x [2, 2, 50257] ~ N(0, 3²)", _softmax, shape=(2, 2, 50257), scale=3.0)
_add("softmax", "gpt2-scores", "x [1, 12, 9, 9] ~ N(0, 1)", _softmax, shape=(1, 12, 9, 9))
_add("softmax", "large-magnitude", "x [2, 3, 50] ~ N(0, 1e4²) (needs the max subtracted)", _softmax,
     shape=(2, 3, 50), scale=1e4)
_add("softmax", "large-negative", "x [2, 3, 50] ~ -2e4 + N(0, 3²) (needs the max subtracted)", _softmax,
     shape=(2, 3, 50), scale=3.0, loc=-2e4)
_add("softmax", "masked", "x [2, 4, 16] ~ N(0, 1) with half the entries -inf", _softmax,
     shape=(2, 4, 16), masked=True)


def _add_kernel(run: _Run) -> None:
    a, a64 = run.array(run.normal((2, 4, 768)))
    b, b64 = run.array(run.normal((2, 4, 768)))
    run.expect(run.backend.add(a, b), a64 + b64)


_add("add", "gpt2", "a, b [2, 4, 768]", _add_kernel)


def _embedding(run: _Run, v, c, p, ids, offset) -> None:
    """`offset` an int, or a nested list shaped like `ids` (each token's position, sent as an int array)."""
    ids = np.asarray(ids, dtype=np.int64)
    wte, wte64 = run.weight("wte.weight", run.normal((v, c), scale=0.5))
    wpe, wpe64 = run.weight("wpe.weight", run.normal((p, c), scale=0.1))
    if isinstance(offset, int):
        got = run.backend.embedding(wte, wpe, run.ids(ids), offset)
    else:
        offset = np.asarray(offset, dtype=np.int64)
        assert offset.shape == ids.shape, "the suite's own case is malformed"
        got = run.backend.embedding(wte, wpe, run.ids(ids), run.ids(offset))
    run.expect(got, ref.embedding(wte64, wpe64, ids, offset))


_add("embedding", "gpt2-vocab", "wte [50257, 32], wpe [1024, 32], ids [2, 5] incl. 0 and 50256, offset 0",
     _embedding, v=50257, c=32, p=1024, ids=[[0, 50256, 11, 11, 464], [50256, 3, 0, 25000, 9]], offset=0)
_add("embedding", "gpt2-width", "wte [300, 768], wpe [1024, 768], ids [1, 4], offset 0", _embedding,
     v=300, c=768, p=1024, ids=[[299, 5, 5, 0]], offset=0)
_add("embedding", "offset", "wte [50, 16], wpe [20, 16], ids [2, 3], offset 7", _embedding,
     v=50, c=16, p=20, ids=[[1, 2, 3], [49, 0, 7]], offset=7)
_add("embedding", "last-positions", "wte [50, 16], wpe [20, 16], ids [1, 4], offset 16 (up to P - 1)",
     _embedding, v=50, c=16, p=20, ids=[[4, 3, 2, 1]], offset=16)
_add("embedding", "T1", "wte [50, 16], wpe [20, 16], ids [3, 1], offset 11", _embedding,
     v=50, c=16, p=20, ids=[[5], [6], [49]], offset=11)
# Ragged batches: `offset` is an integer backend array of each token's own position, shaped like ids.
_add("embedding", "positions-ragged",
     "wte [50257, 32], wpe [1024, 32], ids [1, 10] packing rows of 3, 1, 6 tokens at offsets 0, 17, 5 "
     "(positions array [1, 10])", _embedding, v=50257, c=32, p=1024,
     ids=[[0, 50256, 11, 25000, 7, 7, 3, 0, 50256, 9]], offset=[[0, 1, 2, 17, 5, 6, 7, 8, 9, 10]])
_add("embedding", "positions-2d",
     "wte [50, 16], wpe [20, 16], ids [3, 4], positions array [3, 4] (rows at 0, 16 and out of order, "
     "up to P - 1)", _embedding, v=50, c=16, p=20,
     ids=[[1, 2, 3, 4], [49, 0, 7, 7], [5, 5, 30, 2]], offset=[[0, 1, 2, 3], [16, 17, 18, 19], [9, 3, 3, 0]])
_add("embedding", "positions-T1", "wte [50, 16], wpe [20, 16], ids [3, 1], positions array [[7], [0], [19]] "
     "(one decode step of three sequences)", _embedding, v=50, c=16, p=20, ids=[[5], [6], [49]],
     offset=[[7], [0], [19]])


def _concat(run: _Run, shapes, axis) -> None:
    parts = [run.array(run.normal(shape)) for shape in shapes]
    got = run.backend.concat([a for a, _ in parts], axis)
    run.expect(got, np.concatenate([a64 for _, a64 in parts], axis=axis))


_add("concat", "axis-2", "[1, 12, 6, 64], [1, 12, 1, 64], [1, 12, 3, 64] along axis 2 (rows' attention "
     "outputs)", _concat, shapes=[(1, 12, 6, 64), (1, 12, 1, 64), (1, 12, 3, 64)], axis=2)
_add("concat", "axis-1", "[1, 1, 48], [1, 3, 48], [1, 1, 48], [1, 2, 48] along axis 1", _concat,
     shapes=[(1, 1, 48), (1, 3, 48), (1, 1, 48), (1, 2, 48)], axis=1)
_add("concat", "single", "a list of one array [1, 3, 5] along axis 1", _concat, shapes=[(1, 3, 5)], axis=1)


def _split_heads(run: _Run, b, t, h, d) -> None:
    qkv, qkv64 = run.array(run.normal((b, t, 3 * h * d)))
    got = run.backend.split_heads(qkv, h)
    if not isinstance(got, tuple | list) or len(got) != 3:
        run.fail(f"returned {type(got).__name__}, expected a tuple (q, k, v)")
    for name, g, e in zip("qkv", got, ref.split_heads(qkv64, h), strict=True):
        run.expect(g, e, what=name)


def _merge_heads(run: _Run, b, t, h, d) -> None:
    y, y64 = run.array(run.normal((b, h, t, d)))
    run.expect(run.backend.merge_heads(y), ref.merge_heads(y64))


for _case, (_b, _t, _h, _d) in {
    "gpt2": (2, 5, 12, 64), "H3-D5": (2, 4, 3, 5), "T1": (1, 1, 12, 64)
}.items():
    _add("split_heads", _case, f"qkv [{_b}, {_t}, {3 * _h * _d}], H {_h}", _split_heads,
         b=_b, t=_t, h=_h, d=_d)
    _add("merge_heads", _case, f"y {_shape((_b, _h, _t, _d))}", _merge_heads, b=_b, t=_t, h=_h, d=_d)


def _new_kv_cache(run: _Run, shape) -> None:
    kv = run.backend.new_kv_cache(*shape)
    if not isinstance(kv, tuple | list) or len(kv) != 2:
        run.fail(f"returned {type(kv).__name__}, expected a tuple (k_cache, v_cache)")
    for name, a in zip(("k_cache", "v_cache"), kv, strict=True):
        run.expect(a, np.zeros(shape), what=name)


_add("new_kv_cache", "gpt2", "[2, 12, 16, 64]", _new_kv_cache, shape=(2, 12, 16, 64))
_add("new_kv_cache", "H3-D5", "[3, 3, 7, 5]", _new_kv_cache, shape=(3, 3, 7, 5))


def _write_kv(run: _Run, shape, writes) -> None:
    """Write chunks (offset, T) in turn; after each, the whole cache must hold exactly what was written."""
    b, h, length, d = shape
    k_cache, v_cache = run.backend.new_kv_cache(b, h, length, d)
    k_want, v_want = np.zeros(shape), np.zeros(shape)
    for offset, t in writes:
        k, k64 = run.array(run.normal((b, h, t, d)))
        v, v64 = run.array(run.normal((b, h, t, d)))
        k_cache, v_cache = run.backend.write_kv(k_cache, v_cache, k, v, offset)
        k_want[:, :, offset : offset + t], v_want[:, :, offset : offset + t] = k64, v64
        run.expect(k_cache, k_want, what=f"k_cache after writing {t} at offset {offset}")
        run.expect(v_cache, v_want, what=f"v_cache after writing {t} at offset {offset}")


_add("write_kv", "prefill-then-decode", "cache [2, 3, 10, 5]; write T=4 at 0, 1 at 4, 2 at 5", _write_kv,
     shape=(2, 3, 10, 5), writes=[(0, 4), (4, 1), (5, 2)])
_add("write_kv", "gpt2-offset", "cache [1, 12, 32, 64]; write T=7 at 9", _write_kv,
     shape=(1, 12, 32, 64), writes=[(9, 7)])
_add("write_kv", "to-the-end", "cache [2, 3, 6, 5]; write T=3 at 3 (the last slots)", _write_kv,
     shape=(2, 3, 6, 5), writes=[(3, 3)])


def _fill_cache(run: _Run, b, h, length, d, valid):
    """A cache whose first `valid` positions hold random keys/values, and the rest large garbage that
    attention must ignore. Returns (k_cache, v_cache, k64, v64) with k64, v64 the valid part."""
    k_cache, v_cache = run.backend.new_kv_cache(b, h, length, d)
    k, k64 = run.array(run.normal((b, h, valid, d)))
    v, v64 = run.array(run.normal((b, h, valid, d)))
    k_cache, v_cache = run.backend.write_kv(k_cache, v_cache, k, v, 0)
    if valid < length:
        junk_k, _ = run.array(run.normal((b, h, length - valid, d), scale=100.0))
        junk_v, _ = run.array(run.normal((b, h, length - valid, d), scale=100.0))
        k_cache, v_cache = run.backend.write_kv(k_cache, v_cache, junk_k, junk_v, valid)
    return k_cache, v_cache, k64, v64


def _attention(run: _Run, b, h, t, d, offset, length) -> None:
    k_cache, v_cache, k64, v64 = _fill_cache(run, b, h, length, d, offset + t)
    q, q64 = run.array(run.normal((b, h, t, d)))
    run.expect(run.backend.attention(q, k_cache, v_cache, offset), ref.attention(q64, k64, v64, offset))


#: (batch, heads, new positions, head size, offset, cache length) of the attention checks.
_ATTENTION_CASES = {
    "gpt2-prefill": (1, 12, 16, 64, 0, 16),
    "gpt2-decode": (1, 12, 1, 64, 20, 32),
    "chunk-at-offset": (2, 3, 4, 5, 6, 12),
    "T1-offset-0": (2, 3, 1, 5, 0, 4),
    "prefill-long-cache": (3, 5, 7, 7, 0, 9),
}


def _add_attention_cases(kernel: str, check: Callable[..., None], names: Iterable[str]) -> None:
    for name in names:
        b, h, t, d, off, length = _ATTENTION_CASES[name]
        _add(kernel, name,
             f"q {_shape((b, h, t, d))} at offset {off}, cache length {length} (garbage past {off + t})",
             check, b=b, h=h, t=t, d=d, offset=off, length=length)


_add_attention_cases("attention", _attention, _ATTENTION_CASES)


def _attention_weights(run: _Run, b, h, t, d, offset, length) -> None:
    # The optional inspection kernel: host float32 weights [B, H, T, offset + T], causal, rows summing to
    # 1, equal to the reference's softmax (garbage past the valid keys must not show).
    k_cache, _, k64, _ = _fill_cache(run, b, h, length, d, offset + t)
    q, q64 = run.array(run.normal((b, h, t, d)))
    got = run.backend.attention_weights(q, k_cache, offset)
    if not isinstance(got, np.ndarray) or got.dtype != np.float32:
        run.fail(f"returned {type(got).__name__} {getattr(got, 'dtype', '')}, expected a host NumPy float32 "
                 "array (the weights are reported, not computed on)")
    run.expect(got, ref.attention_weights(q64, k64, offset), what="weights")
    if np.triu(got, k=offset + 1).any():
        run.fail("weights above the causal diagonal (a query attending to a later key) are not 0")


_add_attention_cases("attention_weights", _attention_weights,
                     ("gpt2-prefill", "chunk-at-offset", "T1-offset-0"))


def _lm_head(run: _Run, x_shape, v) -> None:
    x, x64 = run.array(run.normal(x_shape))
    wte, wte64 = run.weight("wte.weight", run.normal((v, x_shape[-1]), scale=0.5))
    run.expect(run.backend.lm_head(x, wte), ref.lm_head(x64, wte64))


_add("lm_head", "gpt2-width", "x [1, 3, 768], wte [4099, 768]", _lm_head, x_shape=(1, 3, 768), v=4099)
_add("lm_head", "gpt2-vocab", "x [1, 2, 64], wte [50257, 64]", _lm_head, x_shape=(1, 2, 64), v=50257)
_add("lm_head", "2d-input", "x [3, 48], wte [97, 48] (the last position of each sequence)", _lm_head,
     x_shape=(3, 48), v=97)

