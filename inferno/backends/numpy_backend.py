"""The reference backend: plain NumPy, one obvious line per kernel, BLAS for the matmuls.

It is also what most users run, so it avoids needless work: matmuls on 2-D views (one BLAS call, not one
per batch row), elementwise chains computed in place on the one buffer the kernel allocates, a KV cache
written in place (no per-step concatenation), and the LM head read from `wte` without a second copy.

Weight layout. A decode step is one GEMV per weight matrix, bound by how fast BLAS streams the weights
from memory, and OpenBLAS streams some shapes faster from the transposed layout: the two c_proj weights
and `wte` (whose transpose is the LM head) are kept in Fortran order, the rest as the file has them.
Shapes and values are unchanged, only strides differ. `python benches/weight_layout.py` measured this
mix faster per decoded token than every matrix row-major or every matrix transposed, with prefill
unchanged (docs/benchmarks.md).
"""

from __future__ import annotations

import math
import mmap
from numbers import Integral

import numpy as np

from inferno.backends.base import Backend
from inferno.backends.hookspecs import hookimpl

_GELU_C = math.sqrt(2.0 / math.pi)
# Weights kept in Fortran order (see the module docstring): suffixes of their Hub names.
_TRANSPOSED = ("attn.c_proj.weight", "mlp.c_proj.weight", "wte.weight", "lm_head.weight",
               # The Llama family's [in, out] projections in Fortran order are the file's own row-major
               # [out, in] (read with no transposing copy); its embedding as GPT-2's wte.
               "_proj.weight", "embed_tokens.weight")


def kv_zeros(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A zero-filled KV cache array whose memory the OS provides page by page as it is written, so that a
    slot costs what its sequences reach. np.zeros asks for transparent huge pages (NumPy madvises them on
    arrays of 4 MB and more): writing a sequence's first tokens into each head of a slot then made 2 MB at a
    time resident, most of the slot at once. An anonymous mmap gets small pages (where the kernel's THP mode
    is madvise, the default) and is zero until written."""
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    if nbytes < mmap.PAGESIZE:
        return np.zeros(shape, dtype)
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype).reshape(shape)


class NumpyBackend(Backend):
    name = "numpy"
    description = "Reference kernels in plain NumPy (BLAS matmuls); float32, or float64 for checks."

    @classmethod
    def runs_on(cls) -> str:
        return "NumPy + BLAS"

    def __init__(self, dtype: str | np.dtype = "float32") -> None:
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise ValueError(f"numpy backend: dtype must be float32 or float64, got {self.dtype}")

    def from_numpy(self, a: np.ndarray) -> np.ndarray:
        a = np.asarray(a)
        if a.dtype.kind == "f":
            return np.ascontiguousarray(a, dtype=self.dtype)
        return np.ascontiguousarray(a)

    def weight_order(self, name: str) -> str:
        return "F" if name.endswith(_TRANSPOSED) else "C"

    def prepare_weight(self, name: str, a: np.ndarray) -> np.ndarray:
        return np.asarray(a, dtype=self.dtype, order=self.weight_order(name))  # no copy when it fits

    def to_numpy(self, a: np.ndarray) -> np.ndarray:
        return np.asarray(a, dtype=np.float32) if a.dtype.kind == "f" else np.asarray(a)

    def linear(self, x, w, b):
        y = _matmul_rows(x.reshape(-1, x.shape[-1]), w).reshape(*x.shape[:-1], w.shape[-1])
        if b is not None:
            y += b
        return y

    def gelu_new(self, x):
        return gelu_new_into(x)

    def layernorm(self, x, gamma, beta, eps):
        return layernorm_into(x, gamma, beta, eps, np.empty_like(x))

    def softmax(self, x):
        return softmax_into(x, np.empty_like(x))

    def add(self, a, b):
        return a + b

    def embedding(self, wte, wpe, ids, offset):
        if not isinstance(offset, Integral):
            return wte[ids] + wpe[offset]  # each token's own position (a ragged batch)
        t = ids.shape[-1]
        return wte[ids] + wpe[offset : offset + t]

    def concat(self, arrays, axis):
        return np.concatenate(arrays, axis=axis)

    def split_heads(self, qkv, n_head):
        b, t, c3 = qkv.shape
        d = c3 // (3 * n_head)
        # [B, T, 3, H, D] → [3, B, H, T, D]: views, no copy.
        q, k, v = qkv.reshape(b, t, 3, n_head, d).transpose(2, 0, 3, 1, 4)
        return q, k, v

    def merge_heads(self, y):
        b, h, t, d = y.shape
        return y.transpose(0, 2, 1, 3).reshape(b, t, h * d)

    def new_kv_cache(self, batch, n_head, length, head_dim):
        shape = (batch, n_head, length, head_dim)
        return kv_zeros(shape, self.dtype), kv_zeros(shape, self.dtype)

    def write_kv(self, k_cache, v_cache, k, v, offset):
        t = k.shape[2]
        k_cache[:, :, offset : offset + t] = k
        v_cache[:, :, offset : offset + t] = v
        return k_cache, v_cache

    def attention(self, q, k_cache, v_cache, offset):
        t, d = q.shape[2], q.shape[3]
        s = offset + t
        scores = q @ k_cache[:, :, :s].swapaxes(-1, -2)  # [B, H, T, S]
        scores *= 1.0 / math.sqrt(d)
        if t > 1:
            # Query i sits at position offset + i and may not see keys after it.
            np.copyto(scores, -np.inf, where=np.triu(np.ones((t, s), dtype=bool), k=offset + 1))
        return self.softmax(scores) @ v_cache[:, :, :s]

    def lm_head(self, x, wte):
        # wte.T is a view (row-major, as wte is kept in Fortran order): no 150 MB copy.
        return _matmul_rows(x.reshape(-1, x.shape[-1]), wte.T).reshape(*x.shape[:-1], wte.shape[0])

    # ---------------------------------------------------------------------- the Llama family's kernels

    def embed_tokens(self, wte, ids):
        return wte[ids]

    def heads(self, x, n_head):
        b, t, c = x.shape
        return x.reshape(b, t, n_head, c // n_head).transpose(0, 2, 1, 3)  # a view

    def rms_norm(self, x, gamma, eps):
        out = np.square(x)
        ms = out.mean(axis=-1, keepdims=True)
        ms += eps
        np.sqrt(ms, out=ms)
        np.divide(x, ms, out=out)
        out *= gamma
        return out

    def rotary(self, x, cos, sin):
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        out = np.empty(x.shape, dtype=np.result_type(x, cos))
        np.multiply(x1, cos, out=out[..., :half])
        out[..., :half] -= x2 * sin
        np.multiply(x2, cos, out=out[..., half:])
        out[..., half:] += x1 * sin
        return out

    def silu_mul(self, gate, up):
        out = gate * 0.5
        np.tanh(out, out=out)
        out += 1.0
        out *= 0.5  # the sigmoid of gate, written with tanh: no overflow for large negative gates
        out *= gate
        out *= up
        return out

    def gqa_attention(self, q, k_cache, v_cache, offset):
        b, n_head, t, d = q.shape
        n_kv = k_cache.shape[1]
        if n_kv == n_head:
            return self.attention(q, k_cache, v_cache, offset)
        # The query heads of a group as one [r * T] block of rows against their key/value head.
        s = offset + t
        qg = q.reshape(b, n_kv, n_head // n_kv * t, d)
        scores = qg @ k_cache[:, :, :s].swapaxes(-1, -2)  # [B, Hkv, r*T, S]
        scores *= 1.0 / math.sqrt(d)
        if t > 1:
            mask = np.triu(np.ones((t, s), dtype=bool), k=offset + 1)
            np.copyto(scores, -np.inf, where=np.tile(mask, (n_head // n_kv, 1)))
        return (self.softmax(scores) @ v_cache[:, :, :s]).reshape(b, n_head, t, d)


# The elementwise kernels write into a given array (which may be the input itself), so that cpu-threaded
# can run the very same code on row tiles of a shared output.


def gelu_new_into(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """GPT-2's tanh GELU of `x`, written into `out` (may be `x`; None: a new array)."""
    t = x * x
    t *= x
    t *= 0.044715
    t += x
    t *= _GELU_C
    np.tanh(t, out=t)
    t += 1.0
    out = t if out is None else out
    np.multiply(x, t, out=out)
    out *= 0.5
    return out


def layernorm_into(x: np.ndarray, gamma, beta, eps: float, out: np.ndarray) -> np.ndarray:
    """Layer norm of `x` over its last axis, written into `out` (may be `x`)."""
    np.subtract(x, x.mean(axis=-1, keepdims=True), out=out)
    var = np.mean(out * out, axis=-1, keepdims=True)
    var += eps
    out /= np.sqrt(var)
    out *= gamma
    out += beta
    return out


def softmax_into(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Softmax of `x` over its last axis, written into `out` (may be `x`); the row max is subtracted."""
    np.subtract(x, x.max(axis=-1, keepdims=True), out=out)
    np.exp(out, out=out)
    out /= out.sum(axis=-1, keepdims=True)
    return out


#: Row counts OpenBLAS's SGEMM runs fastest at: multiples of its kernel's row block (docs/benchmarks.md
#: times the LM head at a few row counts); so a batch of a few rows is padded with zero rows up to the
#: next multiple (below `_PAD_BELOW` rows, where it pays).
_ROW_BLOCK, _PAD_BELOW = 8, 128


def _matmul_rows(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """[N, IN] @ [IN, OUT] as one BLAS call (a 3-D matmul would loop over the batch).

    A single row goes through GEMV: OpenBLAS's GEMM packs the whole weight matrix even for one row,
    which more than doubles the memory traffic of a decode step. Two rows are two GEMVs (faster on the
    LM head than one GEMM); a few more are padded to a multiple of 8 rows (see `_ROW_BLOCK`).
    Each row's result is the same dot products either way.
    """
    n = x.shape[0]
    if n == 1:
        return (x[0] @ w)[None]
    if n == 2:
        return np.stack([x[0] @ w, x[1] @ w])
    if n % _ROW_BLOCK and n < _PAD_BELOW:
        padded = np.zeros((n + _ROW_BLOCK - n % _ROW_BLOCK, x.shape[1]), dtype=x.dtype)
        padded[:n] = x
        return (padded @ w)[:n]
    return x @ w


@hookimpl
def register_backends(register) -> None:
    register(NumpyBackend)
