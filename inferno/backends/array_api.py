"""The kernels written once against the Python Array API standard, for any conforming namespace.

Everything goes through the namespace `xp` (``xp.matmul``, ``xp.take``, ``xp.where`` ...): no NumPy
methods, no in-place arithmetic. The only mutation is `write_kv`'s slice assignment, which the standard
allows; namespaces whose arrays are immutable (JAX) get a new cache from ``xp.where`` instead, and then
attention runs over the whole cache with the positions past the queries masked. Both keep every shape
independent of the position, so a library that compiles each operation once per shape (JAX does, and a compile
costs far more than a step) compiles once per prompt length instead of at every generated token.

Lazy namespaces (dask.array) run too: the residual stream and the KV cache are computed at each step
(`_settle`), so a token's graph holds that step only.

    ArrayApiBackend()                           # array_api_compat.numpy: NumPy arrays (the registered one)
    ArrayApiBackend(xp=array_api_strict)        # the standard's strict checker (what the tests use)
    ArrayApiBackend(xp="torch", device="cpu")   # any namespace array_api_compat knows, by module name

From the CLI: ``--backend array-api:xp=array_api_strict,dtype=float64``.

It is meant to be subclassed by backends for other array libraries: pass the namespace and device to
``super().__init__`` and override only what the library does better (``to_numpy`` for device
transfers, a fused ``attention`` ...). Temporaries are created on the device of the arrays they are
combined with, so the kernels never need to know which device that is.
"""

from __future__ import annotations

import importlib
import math
import warnings
from numbers import Integral
from types import ModuleType
from typing import Any

import numpy as np

from inferno.backends.base import Array, Backend
from inferno.backends.hookspecs import hookimpl

_GELU_C = math.sqrt(2.0 / math.pi)


class ArrayApiBackend(Backend):
    name = "array-api"
    description = "Portable kernels on the Array API standard (array_api_compat); NumPy arrays by default."

    @classmethod
    def runs_on(cls) -> str:
        return "its Array API namespace"

    def __init__(
        self, xp: ModuleType | str | None = None, dtype: str = "float32", device: Any = None
    ) -> None:
        """`xp`: an Array API namespace, or any module or module name `array_api_compat` can wrap
        (numpy, torch, cupy ...); None means ``array_api_compat.numpy``. `dtype`: the floating dtype
        to compute in, by name. `device`: where `from_numpy` and `new_kv_cache` put arrays (None: the
        namespace's default).
        """
        self.xp = _namespace(xp)
        self.device = device
        self.float_dtype = self._resolve_dtype(str(dtype))
        if not self.xp.isdtype(self.float_dtype, "real floating"):
            raise ValueError(f"{self.name} backend: dtype must be a real floating dtype, got {dtype!r}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # JAX warns, then silently computes in float32
            probe = self.xp.zeros((), dtype=self.float_dtype, device=device)
        held = probe.dtype
        if held != self.float_dtype:
            raise ValueError(f"{self.name} backend: namespace {self.xp.__name__} makes {held} arrays when "
                             f"asked for {dtype} (JAX: set JAX_ENABLE_X64=1 for float64)")
        # The conformance suite picks its tolerances from a NumPy dtype (bfloat16 has none: keep the name).
        try:
            self.dtype = np.dtype(str(dtype))
        except TypeError:
            self.dtype = str(dtype)
        self._immutable: bool | None = None  # learnt on the first write_kv
        self._int_dtype = _default_int(self.xp, device)
        # Lazy arrays that can be computed in place of their graph (dask's persist; not in the standard).
        self._persist = callable(getattr(probe, "persist", None))

    def _resolve_dtype(self, name: str) -> Any:
        """The namespace's dtype object for `name`. Subclasses override this for dtypes outside the
        standard that their library has (bfloat16)."""
        dt = getattr(self.xp, name, None)
        if dt is None:
            raise ValueError(f"{self.name} backend: namespace {self.xp.__name__} has no dtype {name!r}")
        return dt

    @classmethod
    def unavailable_reason(cls) -> str | None:
        try:
            import array_api_compat  # noqa: F401
        except ImportError:
            return "needs array-api-compat (pip install array-api-compat)"
        return None

    def __repr__(self) -> str:
        where = f"xp={self.xp.__name__} dtype={self.dtype} device={self.device}"
        return f"<{type(self).__name__} {self.name!r} {where}>"

    # ----------------------------------------------------------------------------------------- boundary

    def from_numpy(self, a: np.ndarray) -> Array:
        a = np.asarray(a)
        xp = self.xp
        if a.size == 0 and a.dtype.kind == "f":
            # No values (a ragged step that samples no row: [0, V]). dask fails to make a large empty
            # array (its auto-chunking divides by zero), but slices one out of a non-empty one.
            full = xp.zeros(tuple(max(n, 1) for n in a.shape), dtype=self.float_dtype, device=self.device)
            return full[tuple(slice(0, n) for n in a.shape)]
        if a.dtype.kind == "f":
            return xp.asarray(a, dtype=self.float_dtype, device=self.device)
        if a.dtype.kind in "iu":
            # The namespace's default integer dtype: JAX's is int32 unless x64 is enabled, and asking it
            # for int64 warns. Token ids and positions fit either.
            return xp.asarray(a.astype(np.int64, copy=False), dtype=self._int_dtype, device=self.device)
        return xp.asarray(a, device=self.device)

    def to_numpy(self, a: Array) -> np.ndarray:
        xp = self.xp
        if xp.isdtype(a.dtype, "real floating") and a.dtype != xp.float32:
            a = xp.astype(a, xp.float32)  # also makes bfloat16 readable by NumPy
        return self._host(a)

    def _host(self, a: Array) -> np.ndarray:
        """A host NumPy array with the contents of `a` (no copy where the memory is already on the host).

        DLPack is the standard's way across libraries; a subclass whose arrays live on an accelerator
        overrides this (e.g. ``a.cpu().numpy()``).
        """
        try:
            return np.from_dlpack(a)
        except (AttributeError, BufferError, RuntimeError, TypeError):
            return np.asarray(a)

    # ------------------------------------------------------------------------------------------ kernels

    def linear(self, x, w, b):
        xp = self.xp
        # One 2-D matmul rather than a batched one: a single GEMM in most libraries.
        lead = tuple(x.shape[:-1])
        y = xp.matmul(xp.reshape(x, (-1, x.shape[-1])), w)
        if b is not None:
            y = y + b
        return xp.reshape(y, (*lead, w.shape[-1]))

    def gelu_new(self, x):
        return 0.5 * x * (1.0 + self.xp.tanh(_GELU_C * (x + 0.044715 * (x * x * x))))

    def layernorm(self, x, gamma, beta, eps):
        xp = self.xp
        # Two passes (mean, then the variance of x - mean): E[x²] - E[x]² cancels badly for large means.
        y = x - xp.mean(x, axis=-1, keepdims=True)
        var = xp.mean(y * y, axis=-1, keepdims=True)
        return y / xp.sqrt(var + eps) * gamma + beta

    def softmax(self, x):
        xp = self.xp
        e = xp.exp(x - xp.max(x, axis=-1, keepdims=True))
        return e / xp.sum(e, axis=-1, keepdims=True)

    def add(self, a, b):
        return self._settle(a + b)

    def _settle(self, a):
        """`a` computed, for a lazy namespace (dask), else `a` itself. Applied to the residual stream (the
        result of `add`) and to the KV cache: each lazy step then starts from computed arrays, and costs
        the same at every token instead of re-running the prompt and every step before it (without it,
        each token measured slower than the one before)."""
        return a.persist() if self._persist else a

    def embedding(self, wte, wpe, ids, offset):
        xp = self.xp
        b, t = ids.shape
        # The standard's take wants 1-D indices.
        tok = xp.reshape(xp.take(wte, xp.reshape(ids, (-1,)), axis=0), (b, t, wte.shape[-1]))
        if not isinstance(offset, Integral):  # each token's own position (a ragged batch)
            return tok + xp.reshape(xp.take(wpe, xp.reshape(offset, (-1,)), axis=0), (b, t, wpe.shape[-1]))
        return tok + wpe[offset : offset + t, :]

    def concat(self, arrays, axis):
        return self.xp.concat(list(arrays), axis=axis)

    def split_heads(self, qkv, n_head):
        xp = self.xp
        b, t, c3 = qkv.shape
        d = c3 // (3 * n_head)
        # [B, T, 3, H, D] → [3, B, H, T, D]
        y = xp.permute_dims(xp.reshape(qkv, (b, t, 3, n_head, d)), (2, 0, 3, 1, 4))
        return y[0, ...], y[1, ...], y[2, ...]

    def merge_heads(self, y):
        b, h, t, d = y.shape
        return self.xp.reshape(self.xp.permute_dims(y, (0, 2, 1, 3)), (b, t, h * d))

    def new_kv_cache(self, batch, n_head, length, head_dim):
        shape = (batch, n_head, length, head_dim)
        xp = self.xp
        return (xp.zeros(shape, dtype=self.float_dtype, device=self.device),
                xp.zeros(shape, dtype=self.float_dtype, device=self.device))

    def write_kv(self, k_cache, v_cache, k, v, offset):
        t = k.shape[2]
        if not self._immutable:
            try:
                k_cache[:, :, offset : offset + t, :] = k
                v_cache[:, :, offset : offset + t, :] = v
                self._immutable = False
                return self._settle(k_cache), self._settle(v_cache)
            except (TypeError, ValueError, NotImplementedError):
                if self._immutable is False:
                    raise  # assignment worked before: this is a real error (shape, dtype ...)
                self._immutable = True
        return self._splice(k_cache, k, offset), self._splice(v_cache, v, offset)

    def _splice(self, cache, new, offset):
        # Shapes independent of the offset (see the module docstring): every cache position takes its
        # new value where it has one, its old one elsewhere.
        xp = self.xp
        length, t = cache.shape[2], new.shape[2]
        pos = xp.arange(length, device=_device(cache)) - offset
        fresh = xp.take(new, xp.clip(pos, 0, t - 1), axis=2)  # [B, H, L, D]: new[pos] where 0 <= pos < t
        written = xp.reshape((pos >= 0) & (pos < t), (1, 1, length, 1))
        return xp.where(written, fresh, cache)

    def attention(self, q, k_cache, v_cache, offset):
        xp = self.xp
        t, d = q.shape[2], q.shape[3]
        # Immutable caches: the whole cache, so that the shapes do not change from token to token (the
        # mask hides every position past the queries; the cache only ever holds finite values written
        # by write_kv, so their zero weights contribute exactly 0).
        s = k_cache.shape[2] if self._immutable else offset + t
        k, v = (k_cache, v_cache) if self._immutable else (k_cache[:, :, :s, :], v_cache[:, :, :s, :])
        scores = xp.matmul(q, xp.matrix_transpose(k)) * (1.0 / math.sqrt(d))  # [B, H, T, S]
        if t > 1 or s > offset + t:
            # Query i sits at position offset + i and may not see keys after it.
            dev = _device(scores)
            rows = xp.reshape(xp.arange(t, device=dev), (t, 1)) + offset
            cols = xp.reshape(xp.arange(s, device=dev), (1, s))
            scores = xp.where(cols <= rows, scores, xp.asarray(-math.inf, dtype=scores.dtype, device=dev))
        return xp.matmul(self.softmax(scores), v)

    def lm_head(self, x, wte):
        xp = self.xp
        lead = tuple(x.shape[:-1])
        # Contract C with C, no transpose: JAX's eager matrix_transpose copies the whole of wte at
        # every call, much slower than this; NumPy and array_api_strict run the same GEMV.
        y = xp.tensordot(xp.reshape(x, (-1, x.shape[-1])), wte, axes=([1], [1]))
        return xp.reshape(y, (*lead, wte.shape[0]))

    # ---------------------------------------------------------------------- the Llama family's kernels

    def embed_tokens(self, wte, ids):
        xp = self.xp
        b, t = ids.shape
        return xp.reshape(xp.take(wte, xp.reshape(ids, (-1,)), axis=0), (b, t, wte.shape[-1]))

    def heads(self, x, n_head):
        xp = self.xp
        b, t, c = x.shape
        return xp.permute_dims(xp.reshape(x, (b, t, n_head, c // n_head)), (0, 2, 1, 3))

    def rms_norm(self, x, gamma, eps):
        xp = self.xp
        return x / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + eps) * gamma

    def rotary(self, x, cos, sin):
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return self.xp.concat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    def silu_mul(self, gate, up):
        return gate * (0.5 + 0.5 * self.xp.tanh(0.5 * gate)) * up  # the sigmoid without overflow

    def gqa_attention(self, q, k_cache, v_cache, offset):
        xp = self.xp
        b, n_head, t, d = q.shape
        n_kv = k_cache.shape[1]
        if n_kv == n_head:
            return self.attention(q, k_cache, v_cache, offset)
        r = n_head // n_kv
        # The r query heads of a group against their key/value head; the whole cache when it is
        # immutable (see `attention`).
        s = k_cache.shape[2] if self._immutable else offset + t
        k, v = (k_cache, v_cache) if self._immutable else (k_cache[:, :, :s, :], v_cache[:, :, :s, :])
        # Five dimensions, not one [r * T] block of rows: dask.array refuses a reshape that splits the
        # heads and merges the group with T in one step.
        qg = xp.reshape(q, (b, n_kv, r, t, d))
        kt = xp.reshape(xp.matrix_transpose(k), (b, n_kv, 1, d, s))
        scores = xp.matmul(qg, kt) * (1.0 / math.sqrt(d))  # [B, Hkv, r, T, S]
        if t > 1 or s > offset + t:
            dev = _device(scores)
            rows = xp.reshape(xp.arange(t, device=dev), (t, 1)) + offset
            cols = xp.reshape(xp.arange(s, device=dev), (1, s))
            scores = xp.where(cols <= rows, scores, xp.asarray(-math.inf, dtype=scores.dtype, device=dev))
        y = xp.matmul(self.softmax(scores), xp.reshape(v, (b, n_kv, 1, s, d)))  # [B, Hkv, r, T, D]
        return xp.reshape(y, (b, n_head, t, d))


def _namespace(xp: ModuleType | str | None) -> ModuleType:
    """An Array API namespace from a namespace, a library module, or a module name."""
    import array_api_compat

    if xp is None:
        import array_api_compat.numpy

        return array_api_compat.numpy
    if isinstance(xp, str):
        xp = importlib.import_module(xp)
    if array_api_compat.is_array_api_strict_namespace(xp) or xp.__name__.startswith("array_api_compat."):
        return xp
    # A plain library module (numpy, torch ...): let array_api_compat find its compliant wrapper.
    return array_api_compat.array_namespace(xp.asarray(0.0))


def _default_int(xp: ModuleType, device: Any) -> Any:
    """The namespace's default integer dtype (int64 where it cannot say: standards before 2023.12)."""
    info = getattr(xp, "__array_namespace_info__", None)
    if info is None:
        return xp.int64
    return info().default_dtypes(device=device)["integral"]


def _device(a: Array) -> Any:
    import array_api_compat

    return array_api_compat.device(a)


@hookimpl
def register_backends(register) -> None:
    register(ArrayApiBackend)
