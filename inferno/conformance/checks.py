"""The conformance checks: every kernel, the compositions, the KV cache and a whole model.

Each `Check` runs one case of one kernel on a backend and raises `ConformanceError` (an
AssertionError) whose message starts with the kernel and the case, e.g.::

    layernorm [small-variance: x [2, 3, 768] ~ N(0, 0.003²), eps 1e-5 (eps ~ variance)]: output
    differs from the float64 reference in 4608 of 4608 elements; worst at (1, 0, 395): got -4.62025,
    expected -3.19036 (error 1.43; float32: rtol=0.0001, atol=1e-05×max|expected|, max|expected| = 3.19)

A backend whose kernel raises fails the same way (``lm_head [2d-input: ...]: raised TypeError: ...``).

Inputs are random (seeded by the check's id, so runs are reproducible), rounded to float32 on the host
and then to whatever the backend holds; the float64 reference (`inferno.conformance.reference`)
starts from exactly the values the backend holds, so only the kernel's own arithmetic is measured.

**Tolerances** depend on the backend's compute dtype (`Backend.dtype`). An element passes when

    |got - expected| <= rtol * |expected| + atol * max|expected|

i.e. `atol` is relative to the largest magnitude in the expected output, so it scales with the case.

    dtype      rtol    atol     why
    float64    1e-6    1e-6     results cross `to_numpy` as float32 (rounding ~6e-8)
    float32    1e-4    1e-5     a few float32 roundings, sums of up to 3072 terms
    float16    1e-2    1e-2     11-bit significand
    bfloat16   5e-2    5e-2     8-bit significand (unknown dtypes get these too)

Checks that chain kernels allow a multiple of that (`factor`): ×2 for mlp, ×4 for self_attention,
ragged_self_attention and cached decode, ×10 for the whole model. So does ``layernorm-large-mean`` (×10):
with a mean of 1e4 even a correct two-pass layer norm loses about eps·mean/std to the rounded mean (a
one-pass E[x²] - E[x]² loses eps·(mean/std)² and still fails by orders of magnitude).

The kinds of checks: "kernel" (each kernel alone, and the from_numpy/to_numpy boundary), "composition"
(mlp, self_attention, ragged_self_attention), "cache" (attention over a cache filled chunk by chunk equals
a full prefill) and "model" (a small random GPT-2 through `inferno.model`, against the numpy backend in
float64; ``model-ragged`` runs continuous batching through `Gpt2.forward_ragged` against batch-1 forwards).

The model checks take the paths generation and scoring take, so that a backend (or an Array API
namespace) that passes the suite also generates: ``model-last-position`` (a prefill to the last
position's logits [B, V], then cached decode steps), ``model-last-n`` (scoring's ``forward(last=n)``),
``model-greedy`` (the batch-1 loop of `inferno.generate`) and ``model-engine`` (the batching engine of
`inferno.engine`, stepped by hand: prompt chunks beside decode rows, slot reuse, a prompt shared by two
sequences). The greedy checks compare token ids with the reference's up to the first near-tie: a step
where the reference's logits of the two ids differ by less than twice the model tolerance (either id is
then right, and the sequences may part there).

**Looking inside** (`inferno.inspect`): ``attention_weights`` (host float32 weights [B, H, T, S], equal
to the reference's softmax, exactly 0 past each query's position, garbage past the valid keys unseen)
and ``self_attention_weights`` (its output, cache and weights). Both have defaults in `Backend`; a
backend that overrides them proves the override here.

**Ragged batches** (continuous batching): ``embedding`` with a positions array instead of an int offset,
``concat``, and ``ragged_self_attention``, whose reference is each row's own batch-1 causal attention over
its slot's keys 0 .. offset + i only: the checks put large garbage (or a stale earlier sequence) past
every row's valid positions, use slots out of order, and check that each row's keys and values land at
its positions of its slot (read back from the `slot_kv` list, whose entries an immutable backend
replaces) while every other position and every unused slot keeps its contents.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from inferno.backends.base import Backend, RaggedRow
from inferno.conformance import reference as ref

KINDS = ("kernel", "composition", "cache", "model")


class ConformanceError(AssertionError):
    """A backend's result differs from the reference. The message starts with the kernel and the case."""

    def __init__(self, kernel: str, case: str, message: str) -> None:
        self.kernel = kernel
        self.case = case
        super().__init__(message)


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    #: Relative to the largest magnitude of the expected output.
    atol: float

    def __str__(self) -> str:
        return f"rtol={self.rtol:g}, atol={self.atol:g}×max|expected|"


TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(1e-6, 1e-6),
    "float32": Tolerance(1e-4, 1e-5),
    "float16": Tolerance(1e-2, 1e-2),
    "bfloat16": Tolerance(5e-2, 5e-2),
}


def dtype_name(dtype: Any) -> str:
    """"float32" for np.float32, np.dtype("float32"), "float32", torch.float32 ..."""
    name = getattr(dtype, "name", None)
    if not isinstance(name, str):
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = str(dtype)
    return name.rsplit(".", 1)[-1]


def tolerance_for(dtype: Any) -> Tolerance:
    """The tolerance for a compute dtype; the loosest one for a dtype not in `TOLERANCES`."""
    return TOLERANCES.get(dtype_name(dtype), TOLERANCES["bfloat16"])


@dataclass(frozen=True)
class Check:
    """One case of one kernel. Call it with a backend: it returns None or raises `ConformanceError`."""

    kernel: str
    case: str
    kind: str
    #: The case in words (shapes, input distribution), for messages.
    what: str
    func: Callable[[_Run], None] = field(repr=False, compare=False)

    @property
    def id(self) -> str:
        return f"{self.kernel}-{self.case}"

    def __str__(self) -> str:
        return self.id

    def __call__(self, backend: Backend) -> None:
        run = _Run(backend, self)
        try:
            self.func(run)
        except ConformanceError:
            raise
        except Exception as exc:  # a kernel that crashes fails its check, named like any other failure
            raise ConformanceError(self.kernel, self.case,
                                   f"{run.label}: raised {type(exc).__name__}: {exc}") from exc


class _Run:
    """What a check function needs: seeded inputs, conversions, and the comparison."""

    def __init__(self, backend: Backend, check: Check) -> None:
        self.backend = backend
        self.check = check
        self.tol = tolerance_for(backend.dtype)
        self.rng = np.random.default_rng(zlib.crc32(check.id.encode()))
        self.label = f"{check.kernel} [{check.case}: {check.what}]"

    def normal(self, shape, scale: float = 1.0, loc: float = 0.0) -> np.ndarray:
        x = self.rng.standard_normal(shape, dtype=np.float32)
        return np.float32(loc) + np.float32(scale) * x

    def array(self, host: np.ndarray) -> tuple[Any, np.ndarray]:
        """(backend array, the values it holds as float64) for an activation."""
        a = self.backend.from_numpy(np.asarray(host, dtype=np.float32))
        return a, ref.f64(self.backend.to_numpy(a))

    def weight(self, name: str, host: np.ndarray) -> tuple[Any, np.ndarray]:
        """(prepared weight, the values it holds as float64); `name` is the Hub key it would have."""
        host = np.asarray(host, dtype=np.float32)
        held = ref.f64(self.backend.to_numpy(self.backend.from_numpy(host)))
        return self.backend.prepare_weight(name, host), held

    def ids(self, host: np.ndarray) -> Any:
        return self.backend.from_numpy(np.asarray(host, dtype=np.int64))

    def fail(self, message: str) -> None:
        raise ConformanceError(self.check.kernel, self.check.case, f"{self.label}: {message}")

    def host(self, actual: Any, what: str) -> np.ndarray:
        got = self.backend.to_numpy(actual)
        if not isinstance(got, np.ndarray):
            self.fail(f"{what}: to_numpy returned {type(got).__name__}, not a numpy.ndarray")
        return got

    def expect(self, actual: Any, expected: np.ndarray, what: str = "output", factor: float = 1.0,
               against: str = "the float64 reference") -> None:
        """Compare a backend array (or host array) with the expected float64 values."""
        got = actual if isinstance(actual, np.ndarray) else self.host(actual, what)
        expected = ref.f64(expected)
        if got.shape != expected.shape:
            self.fail(f"{what} has shape {list(got.shape)}, expected {list(expected.shape)}")
        if got.dtype.kind != "f":
            self.fail(f"{what} has dtype {got.dtype} after to_numpy, expected a floating dtype")
        got = ref.f64(got)
        finite = np.isfinite(got)
        if not finite.all():
            idx = tuple(int(i) for i in np.argwhere(~finite)[0])
            self.fail(f"{what} has {int((~finite).sum())} non-finite values of {got.size} "
                      f"(first at {idx}: {got[idx]}, expected {expected[idx]:.6g})")
        tol_r, tol_a = self.tol.rtol * factor, self.tol.atol * factor
        scale = float(np.abs(expected).max()) if expected.size else 0.0
        err = np.abs(got - expected)
        bad = err > tol_r * np.abs(expected) + tol_a * scale
        if bad.any():
            idx = tuple(int(i) for i in np.unravel_index(np.argmax(np.where(bad, err, -1)), err.shape))
            self.fail(
                f"{what} differs from {against} in {int(bad.sum())} of {got.size} elements; worst at "
                f"{idx}: got {got[idx]:.6g}, expected {expected[idx]:.6g} (error {err[idx]:.3g}; "
                f"{dtype_name(self.backend.dtype)}: {self.tol}{f', ×{factor:g}' if factor != 1 else ''}, "
                f"max|expected| = {scale:.3g})"
            )


# ------------------------------------------------------------------------------------------ registry

_CHECKS: list[Check] = []


def _add(kernel: str, case: str, what: str, func: Callable[..., None], kind: str = "kernel", **params):
    _CHECKS.append(Check(kernel, case, kind, what, partial(func, **params) if params else func))


def all_checks(kinds: Iterable[str] | None = None, kernels: Iterable[str] | None = None) -> list[Check]:
    """The checks, in a fixed order, optionally only some kinds ("kernel", "composition", "cache",
    "model") or kernels ("layernorm", ...)."""
    kinds = set(KINDS if kinds is None else kinds)
    unknown = kinds - set(KINDS)
    if unknown:
        raise ValueError(f"unknown check kinds {sorted(unknown)}; expected some of {KINDS}")
    keep = None if kernels is None else set(kernels)
    return [c for c in _CHECKS if c.kind in kinds and (keep is None or c.kernel in keep)]


def check_backend(backend: Backend, checks: Iterable[Check] | None = None) -> None:
    """Run every check (or `checks`) on `backend`; raise one AssertionError listing all the failures."""
    failures = []
    for check in all_checks() if checks is None else checks:
        try:
            check(backend)
        except ConformanceError as exc:
            failures.append(str(exc))
    if failures:
        head = f"{len(failures)} conformance checks failed for {backend!r}:"
        raise AssertionError("\n".join([head, *failures]))


def _shape(a) -> str:
    return "[" + ", ".join(str(n) for n in a) + "]"


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


# -------------------------------------------------------------------------------------- compositions


def _mlp(run: _Run, x_shape) -> None:
    c = x_shape[-1]
    x, x64 = run.array(run.normal(x_shape))
    w_fc, w_fc64 = run.weight("h.0.mlp.c_fc.weight", run.normal((c, 4 * c), scale=c**-0.5))
    b_fc, b_fc64 = run.weight("h.0.mlp.c_fc.bias", run.normal(4 * c, scale=0.1))
    w_pr, w_pr64 = run.weight("h.0.mlp.c_proj.weight", run.normal((4 * c, c), scale=(4 * c) ** -0.5))
    b_pr, b_pr64 = run.weight("h.0.mlp.c_proj.bias", run.normal(c, scale=0.1))
    run.expect(run.backend.mlp(x, w_fc, b_fc, w_pr, b_pr), ref.mlp(x64, w_fc64, b_fc64, w_pr64, b_pr64),
               factor=2)


_add("mlp", "gpt2", "x [1, 4, 768], C 768 → 3072 → 768", _mlp, kind="composition", x_shape=(1, 4, 768))
_add("mlp", "batch-odd-C", "x [2, 3, 15], C 15 → 60 → 15", _mlp, kind="composition", x_shape=(2, 3, 15))


def _attn_weights(run: _Run, c):
    w = run.weight("h.0.attn.c_attn.weight", run.normal((c, 3 * c), scale=c**-0.5))
    b = run.weight("h.0.attn.c_attn.bias", run.normal(3 * c, scale=0.1))
    wp = run.weight("h.0.attn.c_proj.weight", run.normal((c, c), scale=c**-0.5))
    bp = run.weight("h.0.attn.c_proj.bias", run.normal(c, scale=0.1))
    return [p[0] for p in (w, b, wp, bp)], [p[1] for p in (w, b, wp, bp)]


def _self_attention(run: _Run, b, c, h, chunks, length) -> None:
    """Call self_attention on consecutive chunks of T positions, sharing one cache."""
    weights, weights64 = _attn_weights(run, c)
    kv = run.backend.new_kv_cache(b, h, length, c // h)
    k64 = v64 = None
    offset = 0
    for t in chunks:
        x, x64 = run.array(run.normal((b, t, c)))
        y, kv = run.backend.self_attention(x, *weights, kv, offset, h)
        want, k64, v64 = ref.self_attention(x64, *weights64, h, k64, v64)
        at = f"output of T={t} at offset {offset}"
        run.expect(y, want, what=at, factor=4)
        for name, cache, want_cache in (("k_cache", kv[0], k64), ("v_cache", kv[1], v64)):
            got = run.host(cache, name)[:, :, : offset + t]
            run.expect(got, want_cache, what=f"{name} positions 0..{offset + t - 1} after the {at}", factor=4)
        offset += t


_add("self_attention", "gpt2-prefill", "x [1, 6, 768], H 12, cache 16", _self_attention, kind="composition",
     b=1, c=768, h=12, chunks=[6], length=16)
_add("self_attention", "gpt2-decode", "x [1, 4, 768] then [1, 1, 768] twice, H 12, cache 8", _self_attention,
     kind="composition", b=1, c=768, h=12, chunks=[4, 1, 1], length=8)
_add("self_attention", "H3-D5-chunks", "x [2, T, 15] for T = 5, 1, 2, H 3, cache 9", _self_attention,
     kind="composition", b=2, c=15, h=3, chunks=[5, 1, 2], length=9)


def _self_attention_weights(run: _Run, b, c, h, t) -> None:
    """The optional inspection composition: self_attention's output and cache, and its weights."""
    weights, weights64 = _attn_weights(run, c)
    kv = run.backend.new_kv_cache(b, h, t, c // h)
    x, x64 = run.array(run.normal((b, t, c)))
    y, kv, got = run.backend.self_attention_weights(x, *weights, kv, 0, h)
    want, k64, _ = ref.self_attention(x64, *weights64, h)
    run.expect(y, want, what="output", factor=4)
    run.expect(run.host(kv[0], "k_cache")[:, :, :t], k64, what="k_cache", factor=4)
    q64 = ref.split_heads(ref.linear(x64, weights64[0], weights64[1]), h)[0]
    run.expect(got, ref.attention_weights(q64, k64, 0), what="weights", factor=4)


_add("self_attention_weights", "gpt2", "x [1, 6, 768], H 12, cache 6", _self_attention_weights,
     kind="composition", b=1, c=768, h=12, t=6)
_add("self_attention_weights", "H3-D5", "x [2, 7, 15], H 3, cache 7", _self_attention_weights,
     kind="composition", b=2, c=15, h=3, t=7)


_KV = {"k_cache": "keys", "v_cache": "values"}


def _ragged_slots(run: _Run, hosts):
    """Backend slots (a list of (k_cache, v_cache), each [1, H, P, D]) holding the host contents `hosts`,
    and the float64 values they hold."""
    be = run.backend
    slot_kv, k64, v64 = [], [], []
    for k_host, v_host in hosts:
        _, h, length, d = k_host.shape
        kv = be.new_kv_cache(1, h, length, d)
        kv = be.write_kv(*kv, be.from_numpy(k_host), be.from_numpy(v_host), 0)
        slot_kv.append(tuple(kv))
        k64.append(np.array(run.host(kv[0], "k_cache"), dtype=np.float64))  # a copy: writes are in place
        v64.append(np.array(run.host(kv[1], "v_cache"), dtype=np.float64))
    return slot_kv, k64, v64


def _ragged_self_attention(run: _Run, c, h, n_slots, length, rows, stale=None) -> None:
    """ragged_self_attention over `rows` = (slot, offset, T) packed in this order.

    Every used slot holds a past at positions 0 .. offset - 1 and large garbage from offset on (that the
    row must overwrite or ignore); a slot in `stale` ({slot: n}) instead holds an earlier sequence of n
    positions (then zeros) and must give what a fresh, zeroed slot gives; unused slots hold random values
    that must stay. Rows are compared with their own batch-1 attention (the float64 reference).
    """
    be, d, stale = run.backend, c // h, stale or {}
    shape = (1, h, length, d)
    weights, weights64 = _attn_weights(run, c)
    packed, start = [], 0
    for slot, offset, t in rows:
        packed.append(RaggedRow(slot, offset, start, t))
        start += t
    x, x64 = run.array(run.normal((1, start, c)))
    offsets = {r.slot: r.offset for r in packed}
    hosts = []
    for slot in range(n_slots):
        kv = []
        for _ in "kv":
            if slot in stale:
                a = np.zeros(shape, np.float32)
                a[:, :, : stale[slot]] = run.normal((1, h, stale[slot], d))
            elif slot in offsets:
                a = run.normal(shape, scale=100.0)
                a[:, :, : offsets[slot]] = run.normal((1, h, offsets[slot], d))
            else:
                a = run.normal(shape)
            kv.append(a)
        hosts.append(tuple(kv))

    def call(slot_kv):
        y = be.ragged_self_attention(x, *weights, slot_kv, packed, h)
        if isinstance(y, tuple | list):
            run.fail(f"returned a {type(y).__name__}, expected the output array [1, N, C] alone (the "
                     "caches go back into slot_kv)")
        if not isinstance(slot_kv, list) or len(slot_kv) != n_slots:
            run.fail(f"slot_kv is no longer a list of {n_slots} slots")
        got = run.host(y, "output")
        if got.shape != (1, start, c):
            run.fail(f"output has shape {list(got.shape)}, expected {[1, start, c]}")
        return got

    def row_name(i, r):
        old = f" over a stale sequence of {stale[r.slot]}" if r.slot in stale else ""
        return f"row {i} (slot {r.slot}: {r.length} tokens at offset {r.offset}{old})"

    slot_kv, k_held, v_held = _ragged_slots(run, hosts)
    got = call(slot_kv)
    if stale:
        fresh = [(np.zeros(shape, np.float32),) * 2 if slot in stale else kv for slot, kv in enumerate(hosts)]
        got_fresh = call(_ragged_slots(run, fresh)[0])
        for i, r in enumerate(packed):
            if r.slot in stale:
                sl = slice(r.start, r.start + r.length)
                run.expect(got[:, sl], got_fresh[:, sl], what=f"output of {row_name(i, r)}",
                           against="the same row in a fresh (zeroed) slot")

    want, k_want, v_want = ref.ragged_self_attention(
        x64, *weights64, h, [(r.slot, r.offset, r.start, r.length) for r in packed], k_held, v_held)
    for i, r in enumerate(packed):
        sl = slice(r.start, r.start + r.length)
        run.expect(got[:, sl], want[:, sl], what=f"output of {row_name(i, r)}", factor=4)

    rows_of = {r.slot: (i, r) for i, r in enumerate(packed)}
    for slot in range(n_slots):
        entry = slot_kv[slot]
        if not isinstance(entry, tuple | list) or len(entry) != 2:
            run.fail(f"slot_kv[{slot}] is a {type(entry).__name__}, expected a pair (k_cache, v_cache)")
        for name, cache, held, wanted in (("k_cache", entry[0], k_held, k_want),
                                          ("v_cache", entry[1], v_held, v_want)):
            cache = run.host(cache, f"{name} of slot {slot}")
            if cache.shape != shape:
                run.fail(f"{name} of slot {slot} has shape {list(cache.shape)}, expected {list(shape)}")
            if slot not in rows_of:
                run.expect(cache, held[slot], what=f"{name} of slot {slot} (no row uses it)",
                           against="its contents before the call")
                continue
            i, r = rows_of[slot]
            new = np.zeros(length, dtype=bool)
            new[r.offset : r.offset + r.length] = True
            span = f"positions {r.offset}..{r.offset + r.length - 1}"
            run.expect(cache[:, :, new], wanted[slot][:, :, new], factor=4,
                       what=f"{name} of slot {slot} at {span} (the new {_KV[name]} of {row_name(i, r)})")
            run.expect(cache[:, :, ~new], held[slot][:, :, ~new], against="its contents before the call",
                       what=f"{name} of slot {slot} outside {span}")


for _case, _what, _params in [
    ("offsets", "x [1, 6, 15], H 3, 3 slots of 24: rows of 2, 3, 1 tokens at offsets 5, 11, 2",
     dict(c=15, h=3, n_slots=3, length=24, rows=[(0, 5, 2), (1, 11, 3), (2, 2, 1)])),
    ("prefill-beside-decode", "x [1, 8, 768], H 12, 3 slots of 32: a prompt of 6 at offset 0, decode "
     "steps at offsets 20 and 31 (the last position)",
     dict(c=768, h=12, n_slots=3, length=32, rows=[(0, 0, 6), (1, 20, 1), (2, 31, 1)])),
    ("chunks-beside-decode", "x [1, 10, 15], H 3, 4 slots of 16: chunks of 3 at offset 4 and 5 at 7, "
     "decode steps at 9 and 0",
     dict(c=15, h=3, n_slots=4, length=16, rows=[(0, 4, 3), (1, 9, 1), (2, 7, 5), (3, 0, 1)])),
    ("slot-reuse", "x [1, 6, 15], H 3, 3 slots of 24: a prompt of 4 at offset 0 in slot 1 over a stale "
     "sequence of 20 and one of 1 in slot 2 over a stale 10, beside a decode step at 8; as in fresh slots",
     dict(c=15, h=3, n_slots=3, length=24, rows=[(0, 8, 1), (1, 0, 4), (2, 0, 1)], stale={1: 20, 2: 10})),
    ("slots-out-of-order", "x [1, 6, 15], H 3, 5 slots of 16: rows in slots 3, 0, 2 (2 tokens at 6, 3 at "
     "0, 1 at 11); slots 1 and 4 unused, untouched",
     dict(c=15, h=3, n_slots=5, length=16, rows=[(3, 6, 2), (0, 0, 3), (2, 11, 1)])),
    ("one-row", "x [1, 4, 15], H 3, 2 slots of 12: one row of 4 tokens at offset 3 in slot 1",
     dict(c=15, h=3, n_slots=2, length=12, rows=[(1, 3, 4)])),
]:
    _add("ragged_self_attention", _case, _what, _ragged_self_attention, kind="composition", **_params)


# ------------------------------------------------------------------------------------------ KV cache


def _cached_decode(run: _Run, b, h, d, chunks, length) -> None:
    """Attention over a cache filled chunk by chunk (T=1 = token by token) equals one full prefill.

    Compared twice: with the backend's own full recompute and with the reference.
    """
    total = sum(chunks)
    q_host, k_host, v_host = (run.normal((b, h, total, d)) for _ in range(3))
    q_all, q64 = run.array(q_host)
    k_all, k64 = run.array(k_host)
    v_all, v64 = run.array(v_host)
    kv = run.backend.new_kv_cache(b, h, total, d)
    kv = run.backend.write_kv(*kv, k_all, v_all, 0)
    full = run.host(run.backend.attention(q_all, *kv, 0), "full prefill")

    k_cache, v_cache = run.backend.new_kv_cache(b, h, length, d)
    outs, offset = [], 0
    for t in chunks:
        sl = slice(offset, offset + t)
        k, _ = run.array(k_host[:, :, sl])
        v, _ = run.array(v_host[:, :, sl])
        q, _ = run.array(q_host[:, :, sl])
        k_cache, v_cache = run.backend.write_kv(k_cache, v_cache, k, v, offset)
        outs.append(run.host(run.backend.attention(q, k_cache, v_cache, offset), f"step at offset {offset}"))
        offset += t
    stepped = np.concatenate(outs, axis=2)
    run.expect(stepped, full, what="step-by-step outputs", against="the backend's own full prefill", factor=4)
    run.expect(stepped, ref.attention(q64, k64, v64, 0), what="step-by-step outputs", factor=4)


_add("kv_cache", "token-by-token", "B 2, H 3, D 5: 9 positions one at a time, cache 12", _cached_decode,
     kind="cache", b=2, h=3, d=5, chunks=[1] * 9, length=12)
_add("kv_cache", "chunked", "B 2, H 3, D 5: chunks of 4, 1, 3, 1, cache 9", _cached_decode,
     kind="cache", b=2, h=3, d=5, chunks=[4, 1, 3, 1], length=9)
_add("kv_cache", "gpt2-decode", "B 1, H 12, D 64: prefill 6, then 4 tokens, cache 16", _cached_decode,
     kind="cache", b=1, h=12, d=64, chunks=[6, 1, 1, 1, 1], length=16)


# ---------------------------------------------------------------------------------------- end to end


def _model(run: _Run, n_embd, n_head, n_layer, vocab, batch, chunks) -> None:
    """A small random GPT-2 through `inferno.model`: logits on this backend against the numpy backend
    in float64, for a prefill and the cached decode steps after it."""
    from inferno.backends.numpy_backend import NumpyBackend
    from inferno.config import Gpt2Config
    from inferno.model import Gpt2

    total = sum(chunks)
    config = Gpt2Config(vocab_size=vocab, n_positions=total + 3, n_embd=n_embd, n_layer=n_layer,
                        n_head=n_head, bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    weights = _random_weights(run, config)
    ids = run.rng.integers(0, vocab, size=(batch, total))
    oracle = Gpt2.from_weights(config, weights, NumpyBackend("float64"))
    want = oracle.forward(ids, all_logits=True)  # [B, total, V], no cache: one prefill

    model = Gpt2.from_weights(config, weights, run.backend)
    cache = model.new_cache(batch)
    offset = 0
    for t in chunks:
        logits = run.host(model.forward(ids[:, offset : offset + t], cache, all_logits=True), "logits")
        run.expect(logits, want[:, offset : offset + t], factor=10,
                   what=f"logits of positions {offset}..{offset + t - 1}" + (" (cached)" if offset else ""),
                   against="the numpy backend in float64")
        offset += t


def _random_weights(run: _Run, config) -> dict[str, np.ndarray]:
    """Random weights drawn from the check's own generator (not `inferno.testing`'s): the suite's own
    tests pin which decode step each broken kernel is caught at, with these draws."""
    c, v, p = config.n_embd, config.vocab_size, config.n_positions
    w = {"wte.weight": run.normal((v, c), scale=0.5), "wpe.weight": run.normal((p, c), scale=0.1),
         "ln_f.weight": run.normal(c, scale=0.2, loc=1.0), "ln_f.bias": run.normal(c, scale=0.2)}
    for i in range(config.n_layer):
        for ln in ("ln_1", "ln_2"):
            w[f"h.{i}.{ln}.weight"] = run.normal(c, scale=0.2, loc=1.0)
            w[f"h.{i}.{ln}.bias"] = run.normal(c, scale=0.2)
        for name, n_in, n_out in (("attn.c_attn", c, 3 * c), ("attn.c_proj", c, c),
                                  ("mlp.c_fc", c, 4 * c), ("mlp.c_proj", 4 * c, c)):
            w[f"h.{i}.{name}.weight"] = run.normal((n_in, n_out), scale=n_in**-0.5)
            w[f"h.{i}.{name}.bias"] = run.normal(n_out, scale=0.1)
    return w


_add("model", "small", "random GPT-2 C 48, H 3, 2 layers, V 101; B 2: prefill 5, then 3 tokens", _model,
     kind="model", n_embd=48, n_head=3, n_layer=2, vocab=101, batch=2, chunks=[5, 1, 1, 1])
_add("model", "T1-prefill", "random GPT-2 C 40, H 5, 3 layers, V 67; B 1: prefill 1, then 4 tokens",
     _model, kind="model", n_embd=40, n_head=5, n_layer=3, vocab=67, batch=1, chunks=[1, 1, 1, 1, 1])


def _model_ragged(run: _Run, n_embd, n_head, n_layer, vocab, n_positions, n_slots, steps) -> None:
    """Continuous batching through `Gpt2.forward_ragged`: each step is a list of rows (sequence, slot,
    start, end, wants logits), the row feeding tokens start..end-1 of the sequence at offset start. The
    logits of a row equal the batch-1 `Gpt2.forward` of tokens 0..end-1 of its sequence on the numpy
    backend in float64."""
    from inferno.backends.numpy_backend import NumpyBackend
    from inferno.config import Gpt2Config
    from inferno.model import Gpt2

    config = Gpt2Config(vocab_size=vocab, n_positions=n_positions, n_embd=n_embd, n_layer=n_layer,
                        n_head=n_head, bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    weights = _random_weights(run, config)
    lengths: dict[str, int] = {}
    for step in steps:
        for seq, _, _, end, _ in step:
            lengths[seq] = max(lengths.get(seq, 0), end)
    tokens = {seq: run.rng.integers(0, vocab, size=n) for seq, n in sorted(lengths.items())}
    oracle = Gpt2.from_weights(config, weights, NumpyBackend("float64"))

    model = Gpt2.from_weights(config, weights, run.backend)
    slots = model.new_slots(n_slots)
    for n, step in enumerate(steps, 1):
        rows = [(tokens[seq][start:end].tolist(), slot, start) for seq, slot, start, end, _ in step]
        logits_for = [keep for *_, keep in step]
        got = run.host(model.forward_ragged(rows, slots, logits_for), f"step {n} logits")
        wanted = [(i, row) for i, row in enumerate(step) if row[4]]
        if got.shape != (len(wanted), vocab):
            run.fail(f"step {n} logits have shape {list(got.shape)}, expected {[len(wanted), vocab]} (the "
                     f"last token of the {len(wanted)} rows of {len(step)} that want logits)")
        for j, (i, (seq, slot, start, end, _)) in enumerate(wanted):
            want = oracle.forward(tokens[seq][None, :end])[0]
            run.expect(got[j], want, factor=10,
                       against="batch-1 forward of the sequence on the numpy backend in float64",
                       what=f"step {n} logits [{j}] (row {i}: sequence {seq}, tokens {start}..{end - 1} "
                       f"at offset {start} in slot {slot})")


# Step 1: A's first prompt chunk (no logits), B, C and D whole prompts. Step 2, rows out of slot order: D
# and B decode one token each, A finishes its prompt, and E (a new sequence) takes C's slot at offset 0.
_add("model", "ragged", "random GPT-2 C 48, H 3, 2 layers, V 101, 5 slots of 16 (forward_ragged): step 1 "
     "prefills A[0:5] (no logits), B[0:4], C[0:6], D[0:12]; step 2 D[12], A[5:9], E[0:2] in C's slot, B[4]",
     _model_ragged, kind="model", n_embd=48, n_head=3, n_layer=2, vocab=101, n_positions=16, n_slots=5,
     steps=[[("A", 2, 0, 5, False), ("B", 0, 0, 4, True), ("C", 3, 0, 6, True), ("D", 1, 0, 12, True)],
            [("D", 1, 12, 13, True), ("A", 2, 5, 9, True), ("E", 3, 0, 2, True), ("B", 0, 4, 5, True)]])


# -------------------------------------------------------------------- what generation and scoring do


def _small_model(run: _Run, n_embd, n_head, n_layer, vocab, n_positions):
    """A random GPT-2 on the backend under test, and the same weights on the numpy backend in float64.

    Its logits are spread as real weights' are (`inferno.testing.spread_logits`): with the plain random
    weights the tied LM head makes greedy decoding repeat the current token whatever the attention
    computed, and a greedy check would see nothing."""
    from inferno.backends.numpy_backend import NumpyBackend
    from inferno.config import Gpt2Config
    from inferno.model import Gpt2
    from inferno.testing import spread_logits

    config = Gpt2Config(vocab_size=vocab, n_positions=n_positions, n_embd=n_embd, n_layer=n_layer,
                        n_head=n_head, bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    weights = spread_logits(_random_weights(run, config))
    return Gpt2.from_weights(config, weights, run.backend), Gpt2.from_weights(config, weights,
                                                                             NumpyBackend("float64"))


def _model_last_position(run: _Run, batch, prompt, steps) -> None:
    """What the batch-1 loop does: a prefill that returns the last position's logits only ([B, V]: the
    model slices its hidden states and the LM head gets a 2-D input), then cached decode steps of one
    token each, in a cache of exactly the positions used."""
    total = prompt + steps
    model, oracle = _small_model(run, n_embd=48, n_head=3, n_layer=2, vocab=101, n_positions=total + 4)
    ids = run.rng.integers(0, 101, size=(batch, total))
    want = oracle.forward(ids, all_logits=True)  # [B, total, V]
    cache = model.new_cache(batch, total)
    got = run.host(model.forward(ids[:, :prompt], cache), "prefill logits")
    run.expect(got, want[:, prompt - 1], factor=10, against="the numpy backend in float64",
               what=f"prefill logits [B, V] of position {prompt - 1} (the last of {prompt})")
    for pos in range(prompt, total):
        got = run.host(model.forward(ids[:, pos : pos + 1], cache), f"decode logits at position {pos}")
        run.expect(got, want[:, pos], factor=10, against="the numpy backend in float64",
                   what=f"cached decode logits [B, V] at position {pos}")


_add("model", "last-position", "random GPT-2 C 48, H 3, 2 layers, V 101; B 2: prefill 6 to the last "
     "position's logits [B, V], then 4 cached decode steps, cache of exactly 10", _model_last_position,
     kind="model", batch=2, prompt=6, steps=4)
_add("model", "last-position-T1", "random GPT-2 C 48, H 3, 2 layers, V 101; B 1: prefill 1 to its logits "
     "[1, V], then 5 cached decode steps, cache of exactly 6", _model_last_position,
     kind="model", batch=1, prompt=1, steps=5)


def _model_last_n(run: _Run, batch, length, lasts) -> None:
    """What scoring does: one forward without a cache, logits of the last n positions ([B, n, V])."""
    model, oracle = _small_model(run, n_embd=40, n_head=5, n_layer=2, vocab=67, n_positions=length + 2)
    ids = run.rng.integers(0, 67, size=(batch, length))
    want = oracle.forward(ids, all_logits=True)
    for n in lasts:
        got = run.host(model.forward(ids, last=n), f"logits of the last {n}")
        run.expect(got, want[:, length - n :], factor=10, against="the numpy backend in float64",
                   what=f"forward(ids [{batch}, {length}], last={n}) logits [B, {n}, V]")


_add("model", "last-n", "random GPT-2 C 40, H 5, 2 layers, V 67; ids [2, 9], forward(last=n) for n = 1, 4 "
     "and 9 (scoring's logits)", _model_last_n, kind="model", batch=2, length=9, lasts=[1, 4, 9])


def _near_tie(run: _Run, logits: np.ndarray, got: int, want: int) -> bool:
    """Whether the float64 reference's logits for `got` and `want` are so close that a backend within
    the model checks' tolerance (×10) may rank them either way."""
    scale = float(np.abs(logits).max())
    slack = 10 * (run.tol.rtol * abs(float(logits[want])) + run.tol.atol * scale)
    return float(logits[want]) - float(logits[got]) <= 2 * slack


def _same_greedy(run: _Run, oracle, prompt: list[int], got: list[int], want: list[int], what: str) -> None:
    """`got` must be the reference's greedy ids `want`, up to the first near-tie (where either is right
    and the sequences may part)."""
    if len(got) != len(want):
        run.fail(f"{what}: {len(got)} new tokens, expected {len(want)} ({got} vs {want})")
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g == w:
            continue
        logits = oracle.forward(np.asarray([prompt + want[:i]]), all_logits=True)[0, -1]
        if _near_tie(run, logits, g, w):
            return
        run.fail(f"{what}: new token {i} is id {g}, expected {w} (greedy on the numpy backend in float64, "
                 f"whose logit for {g} is {float(logits[w] - logits[g]):.3g} below {w}'s: not a near-tie "
                 f"within {dtype_name(run.backend.dtype)} tolerance; ids so far {got[: i + 1]}, expected "
                 f"{want[: i + 1]})")


def _model_greedy(run: _Run, prompts, new_tokens) -> None:
    """The batch-1 generation loop (`inferno.generate`), greedy: the ids equal the reference's."""
    from inferno.generate import generate_tokens

    model, oracle = _small_model(run, n_embd=48, n_head=3, n_layer=2, vocab=101, n_positions=32)
    for n in prompts:
        prompt = run.rng.integers(0, 101, size=n).tolist()
        want = list(generate_tokens(oracle, prompt, new_tokens))
        got = list(generate_tokens(model, prompt, new_tokens))
        _same_greedy(run, oracle, prompt, got, want, f"greedy generation from a prompt of {n}")


_add("model", "greedy", "random GPT-2 C 48, H 3, 2 layers, V 101: greedy generation (inferno.generate) of 8 "
     "tokens from prompts of 1, 5 and 11 ids equals the numpy backend's in float64", _model_greedy,
     kind="model", prompts=[1, 5, 11], new_tokens=8)


def _model_engine(run: _Run, slots, prefill_chunk, requests, group) -> None:
    """The continuous-batching engine (`inferno.engine`), greedy, stepped by hand: sequences of different
    lengths share each step (prompt chunks beside decode rows), wait for a slot and reuse one another's;
    a group of one prompt copies its KV cache to its other slots. Every sequence's ids equal the
    reference's batch-1 greedy ids."""
    from inferno.engine import Engine
    from inferno.generate import generate_tokens
    from inferno.options import GenerationOptions

    model, oracle = _small_model(run, n_embd=48, n_head=3, n_layer=2, vocab=101, n_positions=32)
    engine = Engine(model, slots=slots, prefill_chunk=prefill_chunk, max_queue=None, autostart=False)
    submitted = []
    try:
        for n, budget in requests:
            prompt = run.rng.integers(0, 101, size=n).tolist()
            submitted.append((prompt, budget, engine.submit(prompt, budget)))
        n, budget, copies = group
        prompt = run.rng.integers(0, 101, size=n).tolist()
        for h in engine.submit_many(prompt, budget, [GenerationOptions()] * copies):
            submitted.append((prompt, budget, h))
        for _ in range(1000):  # far more steps than these requests take: a stuck engine fails
            if not engine.step():
                break
    finally:
        engine.close()
    for i, (prompt, budget, h) in enumerate(submitted):
        if h.error is not None:
            raise h.error
        if not h.done:
            run.fail(f"sequence {i} (prompt of {len(prompt)}) did not finish")
        want = list(generate_tokens(oracle, prompt, budget))
        _same_greedy(run, oracle, prompt, list(h.state.ids), want,
                     f"engine sequence {i} (prompt of {len(prompt)}, {budget} new tokens)")


_add("model", "engine", "random GPT-2 C 48, H 3, 2 layers, V 101, engine of 2 slots, prefill chunks of 3: "
     "greedy sequences from prompts of 7, 2 and 4 ids (6, 5, 3 new tokens), then 2 of one prompt of 5 "
     "sharing its prefill (4 new tokens), equal the numpy backend's batch-1 greedy ids in float64",
     _model_engine, kind="model", slots=2, prefill_chunk=3, requests=[(7, 6), (2, 5), (4, 3)],
     group=(5, 4, 2))
