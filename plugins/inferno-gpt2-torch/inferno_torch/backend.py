"""The ``torch`` backend: inferno's Array API kernels on PyTorch tensors, on CUDA, MPS or the CPU.

    inferno --backend torch "Hello"                          # device auto: cuda, then mps, then cpu
    inferno --backend torch:device=cpu "Hello"
    inferno --backend torch:device=cuda,dtype=bfloat16 "Hello"

Most kernels are inherited from `ArrayApiBackend`, written once against the Array API standard and run
here through ``array_api_compat.torch``: the embedding gather, the head split/merge views, the KV cache
(zeros, then written in place by slice assignment) and the LM head (a matmul with ``wte.mT``, a view).
The few overridden below are where torch has a fused kernel that is clearly faster or more accurate;
each says why.

What runs where on the CPU, and why (docs/benchmarks.md compares it with `numpy`, with the commands).
A decode step is one GEMV per weight matrix (the 48 of the blocks, then the LM head), so it is bound by
how fast each GEMM routine streams its weights. torch's float32 GEMM is MKL's, which need not stream
them as fast as OpenBLAS does for `numpy`, and its float16 GEMV only has a fast path for the [out, in]
layout; oneDNN's packed layout streams them best in float32 and bfloat16. So on the CPU, in float32 and
bfloat16, the linear weights are kept [out, in] (the loader reads them so: `weight_order` "F") and
packed once at load into oneDNN's blocked layout (``torch.ops.mkldnn._reorder_linear_weight``, what
torch.compile's CPU freezing uses), then run with ``torch.ops.mkldnn._linear_pointwise``, whose GELU
post-op also fuses `mlp`'s activation into the c_fc GEMM. `wte` stays plain for the embedding gather and
gets a packed copy for the LM head. In float16 on the CPU the weights are kept [out, in] for F.linear.
``onednn=false`` turns the packing off. `python benches/sixteen_bit.py` times whole decode steps
against `numpy` side by side, each timed part preceded by a rest (OpenBLAS's threads spin a while after
a call, and whichever pool ran last would slow the other's GEMVs).

The float32 attention of a decode step is SDPA's blocked kernel; in bfloat16 the same call is slower:
the CPU has no fast bfloat16 kernel for such small matrices, so bfloat16 here trades attention speed for
weight bandwidth.

No `torch.inference_mode`: the weights come from NumPy and never require grad, so autograd records
nothing already, and entering it around every kernel call only costs time.

This module must stay importable without torch: the registry imports it on every machine to call the
hook, so torch is imported only when a `TorchBackend` is constructed.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

import numpy as np
from inferno.backends.array_api import ArrayApiBackend
from inferno.backends.base import Array
from inferno.backends.hookspecs import hookimpl
from inferno.backends.registry import BackendUnavailableError
from inferno.cpu import MAX_THREADS

if TYPE_CHECKING:
    import torch

#: Compute dtypes by name. float32 is the default; float64 is for checks (not on MPS).
DTYPES = ("float32", "bfloat16", "float16", "float64")
DEVICE_TYPES = ("cpu", "cuda", "mps")


#: The linear weights, handed over [in, out] (GPT-2's Conv1D layout; the Llama family's nn.Linear weights
#: transposed by the loader). This backend keeps them [out, in] (nn.Linear's layout): the layout oneDNN
#: packs, and the one torch's own half-precision GEMV reads at full speed.
LINEAR_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight",
                  "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                  "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                  "mlp.down_proj.weight")
#: The token embeddings whose transpose is the tied LM head: GPT-2's and the Llama family's.
EMBEDDINGS = ("wte.weight", "model.embed_tokens.weight")


class LinearWeight:
    """A weight of `linear` as this backend keeps it: ``weight`` [out, in], or (``packed``) oneDNN's
    blocked layout of it, which only ``torch.ops.mkldnn._linear_pointwise`` can read."""

    __slots__ = ("weight", "packed")

    def __init__(self, weight: torch.Tensor, packed: bool) -> None:
        self.weight, self.packed = weight, packed

    @property
    def shape(self) -> tuple[int, int]:
        out, inp = self.weight.shape
        return inp, out  # the protocol's [IN, OUT]

    def __repr__(self) -> str:
        out, inp = self.weight.shape
        return f"LinearWeight([{out}, {inp}] as [out, in], {self.weight.dtype}, packed={self.packed})"


class TorchBackend(ArrayApiBackend):
    name = "torch"
    description = ("PyTorch tensors through array-api-compat on CUDA, MPS or the CPU "
                   "(device=auto|cpu|cuda[:N]|mps, dtype=float32|bfloat16|float16, threads=N up to 1024, "
                   "onednn=auto|true|false).")

    def __init__(self, device: Any = None, dtype: Any = "float32", threads: Any = None,
                 onednn: Any = "auto") -> None:
        """`device`: None or "auto" (cuda if available, then mps, then cpu), "cpu", "cuda", "cuda:N",
        "mps" or a `torch.device`. `dtype`: the compute dtype, "float32" (default), "bfloat16",
        "float16" or "float64" (a `torch.dtype` works too). `threads`: torch's CPU thread count
        (`torch.set_num_threads`, which is process-wide); None or "auto" leaves torch's default.
        `onednn`: on the CPU in float32 or bfloat16, run the linear layers and the LM head on
        oneDNN-packed weights (the default where torch has oneDNN; see the module docstring for why);
        false keeps torch's plain GEMM. Bad values raise ValueError naming the option.
        """
        try:
            import array_api_compat.torch as xp
            import torch
        except ImportError as exc:  # found by unavailable_reason, but broken (a missing shared library...)
            raise BackendUnavailableError(f"backend 'torch' is unavailable: torch failed to import: {exc}") \
                from exc
        self._torch = torch
        self._F = torch.nn.functional
        dtype_name = _dtype_name(dtype)
        torch_device = _resolve_device(torch, device)
        n_threads = _threads(threads)
        if torch_device.type == "mps" and dtype_name == "float64":
            raise ValueError("torch backend: option dtype='float64' is not supported on MPS "
                             f"(choose one of {', '.join(d for d in DTYPES if d != 'float64')})")
        super().__init__(xp=xp, dtype=dtype_name, device=torch_device)
        self.onednn = _onednn(torch, onednn, torch_device, dtype_name)
        self._sdpa_gqa = True  # until an older torch refuses enable_gqa (see gqa_attention)
        # [out, in] weights where they pay: oneDNN packs from it, and on the CPU torch's float16 GEMV
        # reads it much faster than the [in, out] layout (see the module docstring).
        self._out_in = self.onednn or (torch_device.type == "cpu" and dtype_name == "float16")
        if self.onednn:
            self._pointwise = torch.ops.mkldnn._linear_pointwise
        if n_threads is not None:
            # On a busy machine fewer threads than cores can be much faster: every parallel region
            # waits for its slowest thread, and a descheduled one holds everybody up.
            torch.set_num_threads(n_threads)

    @classmethod
    def runs_on(cls) -> str:
        return "PyTorch (its own CPU or GPU kernels)"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        # Only look for the packages: importing torch takes seconds, and `inferno backends` asks every
        # backend. A torch that is found but fails to import is reported when the backend is constructed.
        for module, hint in (("torch", "needs PyTorch: pip install torch (see pytorch.org for CUDA builds)"),
                             ("array_api_compat", "needs array-api-compat: pip install array-api-compat")):
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):  # blocked, or a half-imported module without a spec
                found = False
            if not found:
                return hint
        return None

    # ----------------------------------------------------------------------------------------- boundary

    def to_numpy(self, a: Array) -> np.ndarray:
        # The inherited DLPack path cannot read device memory: copy to the host first (a no-op on the
        # CPU), then widen bfloat16/float16, which moves half the bytes over the bus.
        t = a.detach().cpu()
        if t.is_floating_point() and t.dtype != self._torch.float32:
            t = t.float()
        return t.numpy()

    def weight_order(self, name: str) -> str:
        # Fortran order [in, out] is C order [out, in]: the loader reads straight into it.
        return "F" if self._out_in and name.endswith(LINEAR_WEIGHTS) else "C"

    def prepare_weight(self, name: str, a: np.ndarray) -> Any:
        if self._out_in and name.endswith(LINEAR_WEIGHTS):
            packed = self._linear_weight(self.from_numpy(np.ascontiguousarray(a.T)))
            _release_freed_memory()
            return packed
        t = self.from_numpy(a)
        if self.onednn and name == "lm_head.weight":  # an untied head: [V, C] is already [out, in]
            return self._linear_weight(t)
        if self.onednn and name in EMBEDDINGS:
            # Tied: the embedding gathers rows of the plain tensor, the LM head reads a packed copy
            # (oneDNN's GEMV), so the backend holds wte twice (+77 MB in bfloat16).
            t._inferno_head = self._linear_weight(t)
        return t

    def _linear_weight(self, w_out_in: torch.Tensor) -> LinearWeight:
        if not self.onednn:
            return LinearWeight(w_out_in, packed=False)
        return LinearWeight(self._torch.ops.mkldnn._reorder_linear_weight(w_out_in, None), packed=True)

    # ------------------------------------------------------------------------------------------ kernels

    def linear(self, x, w, b):
        if isinstance(w, LinearWeight):
            if w.packed:
                return self._pointwise(x, w.weight, b, "none", [], "")
            return self._F.linear(x, w.weight, b)
        # addmm adds the bias inside the GEMM: one kernel and one pass over the output, not two.
        x2 = x.reshape(-1, x.shape[-1])
        y = self._torch.mm(x2, w) if b is None else self._torch.addmm(b, x2, w)
        return y.reshape(*x.shape[:-1], w.shape[-1])

    def mlp(self, x, w_fc, b_fc, w_proj, b_proj):
        if isinstance(w_fc, LinearWeight) and w_fc.packed:
            # GELU as the GEMM's post-op: the [T, 4C] activations are written once, not three times.
            h = self._pointwise(x, w_fc.weight, b_fc, "gelu", [], "tanh")
            return self.linear(h, w_proj, b_proj)
        return super().mlp(x, w_fc, b_fc, w_proj, b_proj)

    def lm_head(self, x, wte):
        head = wte if isinstance(wte, LinearWeight) else getattr(wte, "_inferno_head", None)
        if head is not None:
            return self.linear(x, head, None)
        if self._out_in:  # float16 on the CPU: wte [V, C] is [out, in] already
            return self._F.linear(x, wte)
        return super().lm_head(x, wte)

    def gelu_new(self, x):
        # One fused kernel instead of eight elementwise passes; it computes half types in float32, where
        # the inherited x³ overflows float16 for |x| > 40.
        return self._F.gelu(x, approximate="tanh")

    def layernorm(self, x, gamma, beta, eps):
        # One fused pass (Welford) instead of the inherited five elementwise and reduction passes.
        return self._F.layer_norm(x, (x.shape[-1],), gamma, beta, eps)

    def softmax(self, x):
        # Fused and max-subtracting, with float32 accumulation for half types.
        return self._torch.softmax(x, dim=-1)

    def attention(self, q, k_cache, v_cache, offset):
        # scaled_dot_product_attention picks a fused kernel for the device (flash / memory-efficient on
        # CUDA, a blocked flash kernel on the CPU): the [T, S] scores are not materialised.
        return self._sdpa(q, k_cache, v_cache, offset)

    def _sdpa(self, q, k_cache, v_cache, offset, **gqa):
        t = q.shape[2]
        s = offset + t
        k, v = k_cache[:, :, :s], v_cache[:, :, :s]
        if t == 1:
            # The only query is the newest position: it sees every valid key, no mask needed.
            return self._F.scaled_dot_product_attention(q, k, v, **gqa)
        if offset == 0:
            return self._F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)
        # SDPA's is_causal aligns the mask top-left, which is wrong when the queries start at offset > 0:
        # query i (at position offset + i) may see keys 0 .. offset + i. True = attend.
        rows = self._torch.arange(t, device=q.device)[:, None] + offset
        mask = self._torch.arange(s, device=q.device)[None, :] <= rows
        return self._F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **gqa)

    # ---------------------------------------------------------------------- the Llama family's kernels
    #
    # Each one torch call (or a few) in the compute dtype, where the base class's defaults would go to the
    # host in float64 and back; half types reduce and exponentiate in float32 inside torch's kernels.

    def embed_tokens(self, wte, ids):
        return self._F.embedding(ids, wte)  # one gather, [B, T, C]

    def heads(self, x, n_head):
        b, t, c = x.shape
        return x.reshape(b, t, n_head, c // n_head).transpose(1, 2)  # a view

    def rms_norm(self, x, gamma, eps):
        # Fused; bfloat16 and float16 accumulate the mean square in float32.
        return self._F.rms_norm(x, (x.shape[-1],), gamma, eps)

    def rotary(self, x, cos, sin):
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        # (Writing the halves into one output with out= was slower on the CPU than this concatenation.)
        return self._torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def silu_mul(self, gate, up):
        # silu is one fused kernel (float32 inside for half types), and saturates without overflow.
        return self._F.silu(gate).mul_(up)

    def gqa_attention(self, q, k_cache, v_cache, offset):
        if q.shape[1] == k_cache.shape[1]:
            return self._sdpa(q, k_cache, v_cache, offset)
        if self._sdpa_gqa:
            try:
                # SDPA's own grouped-query attention (torch >= 2.5): query head h reads key/value head
                # h // (H // Hkv), as the protocol says, with no copy of the caches.
                return self._sdpa(q, k_cache, v_cache, offset, enable_gqa=True)
            except TypeError:  # an older torch: no enable_gqa
                self._sdpa_gqa = False
        return super().gqa_attention(q, k_cache, v_cache, offset)  # one batched matmul over the groups


def _onednn(torch: Any, option: Any, device: torch.device, dtype_name: str) -> bool:
    """Whether to run the GEMMs on oneDNN-packed weights: asked for (true), refused (false), or "auto"
    (where it exists: the CPU, float32 or bfloat16, a torch built with oneDNN, and for bfloat16 a CPU
    that oneDNN runs it on)."""
    if isinstance(option, str) and option.strip().lower() in ("auto", "true", "false"):
        option = {"auto": "auto", "true": True, "false": False}[option.strip().lower()]
    if option not in ("auto", True, False) or isinstance(option, int) and not isinstance(option, bool):
        raise ValueError(f"torch backend: option onednn={option!r} must be auto, true or false")
    if option is False:
        return False
    ops = getattr(torch.ops, "mkldnn", None)
    why = None
    if device.type != "cpu":
        why = f"it runs on the CPU only, not on {device.type}"
    elif dtype_name not in ("float32", "bfloat16"):
        why = f"it is used for float32 and bfloat16, not {dtype_name}"
    elif not (torch.backends.mkldnn.is_available() and hasattr(ops, "_linear_pointwise")
              and hasattr(ops, "_reorder_linear_weight")):
        why = f"torch {torch.__version__} is built without it"
    elif dtype_name == "bfloat16" and not ops._is_mkldnn_bf16_supported():
        why = "this CPU has no bfloat16 support for it"
    if why is not None and option is True:
        raise ValueError(f"torch backend: option onednn=true is not available: {why}")
    return why is None


def _dtype_name(dtype: Any) -> str:
    # Accept "bfloat16" and torch.bfloat16 alike.
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"torch backend: option dtype={dtype!r} is not supported "
                         f"(choose one of {', '.join(DTYPES)})")
    return name


def _threads(threads: Any) -> int | None:
    # At most inferno.cpu.MAX_THREADS: torch segfaults when its pool cannot start them all (threads=100000).
    if threads is None or threads == "auto":
        return None
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"torch backend: option threads={threads!r} must be an integer >= 1 or 'auto'")
    if threads > MAX_THREADS:
        raise ValueError(f"torch backend: option threads={threads} must be at most {MAX_THREADS}")
    return threads


def _resolve_device(torch: Any, device: Any) -> torch.device:
    """A `torch.device` for the `device` option, checked to exist here."""
    given = device  # for the messages
    if isinstance(device, str):
        device = device.strip().lower()
    if device is None or device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available(torch):
            return torch.device("mps")
        return torch.device("cpu")
    bad = f"torch backend: option device={given!r}"
    expected = "expected auto, cpu, cuda, cuda:N or mps"
    # bool is an int, and torch.device(1) would mean cuda:1: `device=true` is a mistake, not a GPU.
    if isinstance(device, bool) or not isinstance(device, str | int | torch.device):
        raise ValueError(f"{bad} is not a device ({expected})")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise ValueError(f"{bad} is not a device ({expected})") from None
    if dev.type not in DEVICE_TYPES:
        raise ValueError(f"{bad}: device type {dev.type!r} is not supported ({expected})")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "no GPU found" if torch.version.cuda else f"torch {torch.__version__} is built without CUDA"
            raise ValueError(f"{bad}: CUDA is not available ({why})")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"{bad}: there are {count} CUDA devices (cuda:0 .. cuda:{count - 1})")
    if dev.type == "mps" and not _mps_available(torch):
        raise ValueError(f"{bad}: MPS is not available here")
    return dev


def _mps_available(torch: Any) -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def _release_freed_memory() -> None:
    """Give the memory freed so far back to the OS (glibc's ``malloc_trim``; elsewhere nothing).

    Each linear weight passes through two temporaries (the transposed float32 copy, the [out, in]
    tensor oneDNN packs from) that are freed right away; but once wte's 154 MB has been freed, glibc
    serves such sizes from its heap, which keeps them: trimming after each weight lowers the peak
    memory of a load well below what it is without (the test's measure: a fresh process's VmHWM).
    """
    global _TRIM
    if _TRIM is None:
        import ctypes
        import ctypes.util

        try:
            _TRIM = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (OSError, AttributeError):  # not glibc: musl, macOS, Windows
            _TRIM = False
    if _TRIM:
        _TRIM(0)


_TRIM: Any = None


@hookimpl
def register_backends(register) -> None:
    register(TorchBackend)
