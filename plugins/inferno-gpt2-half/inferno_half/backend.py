"""The ``half`` backend: 16-bit or 8-bit weights, float32 activations, compiled kernels for the products.

    inferno --backend half "Hello"                       # float16 weights
    inferno --backend half:dtype=bfloat16 "Hello"        # bfloat16 weights (a BF16 file stays exact)
    inferno --backend half:dtype=int8 "Hello"            # int8 weights, quantized at load
    inferno --backend half:dtype=q4 "Hello"              # 4-bit weights in blocks of 32 (as q4_0)
    inferno --backend half:threads=1 "Hello"

In the 16-bit formats only the weights are rounded (to float16 or bfloat16); activations, the KV cache
(unless kv=float16), every sum and the logits stay float32: this is `numpy`'s backend with different
matrix products. int8 quantizes the weights at load, one float32 scale per output (max |row| / 127, see
`quantize`), and each product's inputs as it runs, in blocks of 32 (`quantize_blocks`, as llama.cpp's
q8_0), so that the products are int8 dot products with int32 sums (VNNI where the CPU has it: four times
float32's multiply-adds per instruction); everything between the products stays float32. A step of one
sequence reads every weight once, so its speed is the memory bandwidth over the bytes of the weights,
which 16 bits halve and int8 halves again; a prompt, or a step of many sequences, is bound by the
arithmetic.
q4 (`inferno_half.q4`) stores 4-bit weights with a float16 scale per block of 32 inputs (llama.cpp's
q4_0): 0.56 of int8's bytes, for the one-user speed; its products multiply the same quantized inputs.
Two options trade a little accuracy for the matrix engine (see the README): `inputs=rows` (int8: one
input scale per row, so AMX's tiles sum all of k at full depth) and `attention=bfloat16` (a long prompt
attends on AMX-BF16 tiles). `kv=float16` keeps the KV cache in float16: half the bytes that a decode
step of many sequences reads.

What runs in C (`_kernels.c`), and why:

* Every matrix product. The weights are packed once at load in panels of 32 outputs ([out/32][in][32]),
  which the kernel streams in order; for each input, a panel's 32 weights are widened to float32 in
  registers once and multiplied into a tile of up to 24 rows, so a step of many sequences (or a prompt)
  reads and widens each weight once per tile and is bound by the FMAs, not by unpacking. Each output is
  one FMA chain over its inputs, the same for any number of rows: a sequence gets the same bits batched
  or alone. int8 panels hold 4 inputs of an output side by side (VNNI's operand), and a tile's int32
  block sums are exact on every path. Paths by CPU feature at run time: AVX-512 (with VNNI for int8, and
  AMX tiles for int8 products of many rows where the CPU and OS allow: the same bits), AVX2 + FMA + F16C,
  portable C; OpenMP threads.
* The rest of a decode step, because at one token a step NumPy's calls cost more than the work: the
  layer norms; the attention block in one call per layer (the fused c_attn product, the cache writes,
  the attention, c_proj), over all the rows of a ragged engine step at once; the MLP with its GELU
  inside the first product; the embedding gather. Long prompts attend in tiles of 12 queries (AVX-512).
* The Llama family's small kernels, on the same SIMD paths: RMS norm (reading the heads' view of Qwen3's
  q/k norm through its strides), the rotary embedding (likewise, writing the heads contiguous), the gated
  MLP's silu(gate) * up, and grouped-query attention in the attention kernel, each query head reading its
  group's key/value head in place. The Llama family's projections and embedding are packed like GPT-2's.

Each C function takes the NumPy arrays themselves through the buffer protocol (cheaper than ctypes per
array), releases the GIL, and declines (returns False, computing nothing) an array it does not take
(another dtype, order or shape, a cache without room): the NumPy path runs instead.

Without the compiled kernels (no C compiler at install) every product unpacks the weights in NumPy and
calls BLAS: correct, and slow; `inferno backends` says so in the description of the backend. Measured
figures are in docs/benchmarks-half.md.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np
from inferno.backends.hookspecs import hookimpl
from inferno.backends.numpy_backend import NumpyBackend, kv_zeros
from inferno.cpu import MAX_THREADS, blas_threads, resolve_threads

from inferno_half.q4 import pack_q4, q4_rows

#: The matrices kept in 16 or 8 bits: the linear weights, handed over [in, out] (GPT-2's Conv1D layout;
#: the Llama family's nn.Linear weights transposed by the loader), by the ends of their Hub names ...
LINEAR = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight",
          "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
          "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")
#: ... and the [V, C] embeddings and LM heads, by their whole names.
EMBEDDINGS = ("wte.weight", "lm_head.weight", "model.embed_tokens.weight")
MATRICES = LINEAR + EMBEDDINGS
#: The formats, by option value: the kernel's format code. int8: symmetric, one float32 scale per output
#: (row of the [out, in] matrix), max |w| / 127; see `quantize`. q4: see `inferno_half.q4`.
DTYPES = {"float16": 0, "bfloat16": 1, "int8": 2, "q4": 3}
#: bfloat16 weights for inputs=bfloat16 (`INPUTS_BF16`): each output's inputs in pairs
#: ([in/2][32][2] a panel), the operand of VDPBF16PS and of AMX-BF16's tiles, so that no product
#: shuffles them (`_kernels.c`'s FMT_BF16P).
PAIRS = "bfloat16-pairs"
#: Every weight format by name: the kernel's format code.
FORMATS = {**DTYPES, PAIRS: 4}
#: q4's embeddings and LM head by default: int8 or q4 (the `head` option), see docs/benchmarks-half.md.
HEAD_DEFAULT = "q4"
#: The formats whose products quantize their inputs (in blocks of `QB`, `quantize_blocks`).
QUANTIZED = ("int8", "q4")
#: How int8's products quantize their inputs (the `inputs` option): "blocks" of `QB` (the default, as
#: llama.cpp's q8_0) or "rows", one scale per row (per token, as vLLM's W8A8 int8 and oneDNN's dynamic
#: quantization): a row's int32 sum then runs over all of k, which AMX's tiles do at full depth.
INPUTS = ("blocks", "rows")
#: bfloat16's products with their inputs rounded to bfloat16 as well (`inputs=bfloat16`), as PyTorch's
#: bfloat16: pairs of products summed in float32 on AMX-BF16 tiles, or by VDPBF16PS (AVX512-BF16: twice
#: float32 FMAs' rate), where the CPU has one (`_kernels.bf16_products()`); elsewhere the inputs stay float32.
INPUTS_BF16 = "bfloat16"
#: The flag on int8's format code for inputs=rows (`_kernels.c`'s FMT_ROWS).
FMT_ROWS = 16
#: How a long prompt attends (the `attention` option): "float32" (the default: every value and sum), or
#: "bfloat16": on AMX-BF16 tiles, or VDPBF16PS where the CPU has AVX512-BF16 but no AMX (queries, keys,
#: values and softmax weights rounded to bfloat16, sums float32, as PyTorch's bfloat16 attention), elsewhere
#: as float32.
ATTENTION = ("float32", "bfloat16")
#: The KV cache's element (the `kv` option): "float32" (the default), or "float16", as llama.cpp's
#: default cache: half the bytes, of which a decode step of many sequences over long contexts reads more
#: than of the weights. float16 keeps 11 significant bits (bfloat16 8) and raises on a finite key or
#: value beyond its range instead of making it inf.
KV = ("float32", "float16")
#: The flag on self_attention's format code for attention=bfloat16 (`_kernels.c`'s FMT_ATT16).
FMT_ATT16 = 32
#: Outputs per panel of the packed weights (`_kernels.c`'s PANEL).
PANEL = 32
#: int8 products quantize their inputs in blocks of this many (`_kernels.c`'s QB).
QB = 32
#: Queries up to this many a sequence (decode, short prompts, prefill chunks) attend in the C kernel one at a
#: time; a longer prompt attends in C in tiles of queries on the AVX-512 path, elsewhere in NumPy (BLAS).
SMALL_M = 64
#: Ragged steps of up to this many tokens (decode rows and prompt chunks) run their attention block in C.
RAGGED_TOKENS = 256
#: Float32 bytes converted at a time when packing, and unpacked per BLAS call on the fallback path.
UNPACK_BYTES = 8 << 20


def _load_kernels() -> Any:
    """The compiled kernels (`_kernels.c`), or None when the extension was not built."""
    try:
        from inferno_half import _kernels
    except ImportError:
        return None
    return _kernels


_KERNELS = _load_kernels()

#: INFERNO_HALF_ISA caps the kernels' instruction set, process-wide: "portable" (C), "avx2" (AVX2 + FMA
#: + F16C), "avx512" (AVX-512 and VNNI, no AMX tiles) or "native" (the best the CPU has: the default), so
#: that a lesser path can be run, tested or compared on any machine.
ISA_LEVELS = ("portable", "avx2", "avx512", "native")
ISA_CAP = os.environ.get("INFERNO_HALF_ISA", "").strip().lower() or "native"


def _cap_isa(kernels: Any, cap: str) -> None:
    if kernels is None or cap not in ISA_LEVELS:
        return  # an unknown value is refused when a backend is made (`_check_isa_cap`)
    if cap == "portable":
        kernels.force_portable(1)
    elif cap == "avx2":
        kernels.force_avx2(1)
    elif cap == "avx512":
        kernels.amx_rows(0)


def _check_isa_cap() -> None:
    if ISA_CAP not in ISA_LEVELS:
        raise ValueError(f"half backend: INFERNO_HALF_ISA={ISA_CAP!r} is not a path (choose "
                         f"{', '.join(ISA_LEVELS)})")


_cap_isa(_KERNELS, ISA_CAP)


def to_bits(a: np.ndarray, fmt: str) -> np.ndarray:
    """float32 → the 16-bit pattern of `fmt` (uint16), rounding to nearest even."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    if fmt == "float16":
        with np.errstate(over="ignore"):
            return a.astype(np.float16).view(np.uint16)
    u = a.view(np.uint32)
    # bfloat16 is the top half of a float32: add half an ulp (ties to even), then keep the top 16 bits.
    # NaN cannot occur (weights are checked finite at load).
    return ((u + (np.uint32(0x7FFF) + ((u >> 16) & 1))) >> 16).astype(np.uint16)


def from_bits(bits: np.ndarray, fmt: str) -> np.ndarray:
    """The uint16 patterns of `fmt` → float32."""
    if fmt == "float16":
        return bits.view(np.float16).astype(np.float32)
    return (bits.astype(np.uint32) << 16).view(np.float32)


class Weight16:
    """A matrix of a `linear` (or the embedding/head) as this backend keeps it: the [out, in] matrix in
    16 bits, its outputs padded with zeros to a multiple of `PANEL` and stored in panels
    [out/32][in][32] (the 32 weights of one input for 32 outputs side by side), so that the kernel reads
    them in order. ``shape`` is [in, out], the protocol's view of a linear weight; ``rows`` is [out, in],
    the embedding's."""

    __slots__ = ("blocks", "rows", "fmt")

    def __init__(self, blocks: np.ndarray, rows: tuple[int, int], fmt: str) -> None:
        self.blocks, self.rows, self.fmt = blocks, rows, fmt

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows[1], self.rows[0]

    @property
    def nbytes(self) -> int:
        return self.blocks.nbytes

    def row_values(self, ids: np.ndarray) -> np.ndarray:
        """The float32 rows `ids` (any shape of integers) of the [out, in] matrix: the embedding gather."""
        n, k = self.rows
        flat = ids.reshape(-1)
        if _KERNELS is not None:
            # One C call a row: NumPy's gather across the panels cost more than the row itself.
            out = np.empty((len(flat), k), np.float32)
            if all(_KERNELS.unpack(self.blocks, n, j, j + 1, k, out[i : i + 1], FORMATS[self.fmt], 1)
                   for i, j in enumerate(flat.tolist())):
                return out.reshape(*ids.shape, k)
        if self.fmt == "int8":
            return (_int8_rows(self, flat) * self.scales()[flat][:, None]).reshape(*ids.shape, k)
        if self.fmt == "q4":
            return q4_rows(self.blocks, flat, k).reshape(*ids.shape, k)
        got = _rows16(self, flat)
        return from_bits(got, self.fmt).reshape(*ids.shape, k)

    def scales(self) -> np.ndarray:
        """int8: the float32 scale of each output (padding included), from the end of each panel."""
        kp = kpad(self.rows[1])
        return np.ascontiguousarray(self.blocks[:, kp:, :]).view(np.float32).reshape(-1)

    def __repr__(self) -> str:
        return f"Weight16({self.rows[0]}x{self.rows[1]} [out, in], {self.fmt}, panels of {PANEL})"


def pack(out_in: np.ndarray, fmt: str) -> Weight16:
    """A float32 [out, in] matrix → `Weight16`, converted a few panels at a time (no full-size temporary)."""
    n, k = out_in.shape
    count = -(-n // PANEL)
    step = max(PANEL, (UNPACK_BYTES // max(1, 4 * k)) // PANEL * PANEL)  # outputs converted at a time
    if fmt == "int8":
        return _pack_int8(out_in, count, step)
    if fmt == "q4":
        return Weight16(pack_q4(out_in, kpad(k), step), (n, k), "q4")
    kp = kpad(k) if fmt == PAIRS else k  # (pairs: zeros up to whole tiles of 32 inputs)
    blocks = np.zeros((count, kp, PANEL), dtype=np.uint16)
    for j0 in range(0, n, step):
        j1 = min(n, j0 + step)
        part = np.zeros((-(-(j1 - j0) // PANEL) * PANEL, kp), dtype=np.uint16)
        part[: j1 - j0, :k] = to_bits(out_in[j0:j1], "bfloat16" if fmt == PAIRS else fmt)
        p0, panels = j0 // PANEL, part.shape[0] // PANEL
        if fmt == PAIRS:  # [panels][32][kp] → [panels][kp/2][32][2]
            paired = part.reshape(panels, PANEL, kp // 2, 2).transpose(0, 2, 1, 3)
            blocks[p0 : p0 + panels] = paired.reshape(panels, kp, PANEL)
        else:
            blocks[p0 : p0 + panels] = part.reshape(panels, PANEL, k).transpose(0, 2, 1)
    return Weight16(blocks, (n, k), fmt)


def _rows16(w: Weight16, ids: np.ndarray) -> np.ndarray:
    """The uint16 rows `ids` of a 16-bit `w`'s [out, in] matrix: row j's input i sits at
    blocks[j // PANEL, i, j % PANEL], or in `PAIRS` at [i // 2, j % PANEL, i % 2] of its panel viewed as
    [in/2][32][2]."""
    k = w.rows[1]
    if w.fmt != PAIRS:
        return np.ascontiguousarray(w.blocks[ids // PANEL, :k, ids % PANEL])
    paired = w.blocks.reshape(len(w.blocks), -1, PANEL, 2)  # [panels][kp/2][32][2]
    return np.ascontiguousarray(paired[ids // PANEL, :, ids % PANEL].reshape(len(ids), -1)[:, :k])


def quantize(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 [r, k] → (int8 [r, k], float32 scales [r]): each row over max |row| / 127, rounded to
    nearest (ties to even), so that row ≈ q * scale within scale / 2; a zero row gets scale 1."""
    if not rows.size:
        return rows.astype(np.int8), np.ones(len(rows), np.float32)
    scales = (np.abs(rows).max(axis=1) / np.float32(127)).astype(np.float32)
    scales[scales == 0] = 1
    q = np.rint(rows / scales[:, None]).clip(-127, 127).astype(np.int8)
    return q, scales.astype(np.float32)


def kpad(k: int) -> int:
    """k rounded up to whole blocks of `QB`: the inputs an int8 panel holds (`_kernels.c`'s kpad)."""
    return -(-k // QB) * QB


def _pack_int8(out_in: np.ndarray, count: int, step: int) -> Weight16:
    """`pack` for int8: per panel of 32 outputs, the inputs padded with zeros to `kpad(in)` in groups of
    4 ([kpad/4][32][4]: VNNI's operand layout, 4 inputs of an output side by side), then the 32 float32
    scales (128 bytes): an int8 array [out/32][kpad + 4][32] (its middle axis is bytes / 32, not inputs),
    quantized `step` outputs (whole panels) at a time."""
    n, k = out_in.shape
    kp = kpad(k)
    blocks = np.zeros((count, kp + 4, PANEL), dtype=np.int8)
    for j0 in range(0, n, step):
        j1 = min(n, j0 + step)
        q, sc = quantize(np.asarray(out_in[j0:j1], dtype=np.float32))
        rows = -(-(j1 - j0) // PANEL) * PANEL
        part, scales = np.zeros((rows, kp), np.int8), np.ones(rows, np.float32)
        part[: j1 - j0, :k], scales[: j1 - j0] = q, sc
        p0, panels = j0 // PANEL, rows // PANEL
        grouped = part.reshape(panels, PANEL, kp // 4, 4).transpose(0, 2, 1, 3)
        blocks[p0 : p0 + panels, :kp] = grouped.reshape(panels, kp, PANEL)
        blocks[p0 : p0 + panels, kp:] = scales.reshape(panels, PANEL).view(np.int8).reshape(panels, 4, PANEL)
    return Weight16(blocks, (n, k), "int8")


def _int8_rows(w: Weight16, ids: np.ndarray) -> np.ndarray:
    """The int8 values of outputs `ids` (1-D) of `w` as [len(ids), in], undoing `_pack_int8`'s groups for
    those rows only (the fallback unpacks a slice at a time: not the whole matrix each time)."""
    k = w.rows[1]
    kp = kpad(k)
    grouped = w.blocks[ids // PANEL, :kp].reshape(len(ids), kp // 4, PANEL, 4)
    return grouped[np.arange(len(ids)), :, ids % PANEL].reshape(len(ids), kp)[:, :k]


def quantize_blocks(x: np.ndarray, by_row: bool = False) -> np.ndarray:
    """float32 [m, k] → the values the int8 kernels multiply: each row in blocks of `QB` inputs (by_row:
    one block, the whole row) over d = max |block| / 127, q = x / d rounded to nearest even, as float32
    q * d (NaN for a block holding inf or NaN). The NumPy fallback's int8 products run on these, as the
    kernel does."""
    m, k = x.shape
    kp = kpad(k)
    blocks = np.zeros((m, kp), np.float32)
    blocks[:, :k] = x
    blocks = blocks.reshape(m, 1, kp) if by_row else blocks.reshape(m, kp // QB, QB)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        amax = np.abs(blocks).max(axis=2, keepdims=True)
        d = amax / np.float32(127)
        inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), np.float32(0)).astype(np.float32)
        q = np.clip(np.rint(blocks * inv), -127, 127)
        out = (q * d).astype(np.float32)
    out[~np.isfinite(amax[..., 0])] = np.nan
    return out.reshape(m, kp)[:, :k]


def _long_prompt_in_c(d: int) -> bool:
    """Whether a long prompt's attention (heads of size d) runs in C: on the AVX-512 path in tiles of
    queries (d a multiple of 16), and on AVX2 a query at a time (d a multiple of 8), which still beats
    NumPy's batched matmuls on one BLAS thread there (docs/benchmarks-half.md, "On AMD EPYC Zen 3");
    portable C does not."""
    simd = _KERNELS.simd()
    return (simd == 2 and d % 16 == 0) or (simd == 1 and d % 8 == 0)


def _in_c(q: np.ndarray) -> bool:
    """Whether the attention of queries q [B, H, T, D] runs in C: a few queries a sequence always (one at a
    time), a long prompt where `_long_prompt_in_c`; else NumPy's batched matmuls (BLAS)."""
    return _KERNELS is not None and (q.shape[2] <= SMALL_M or _long_prompt_in_c(q.shape[3]))


class HalfBackend(NumpyBackend):
    name = "half"
    description = ("16-bit weights (dtype=float16|bfloat16), 8-bit (dtype=int8) or 4-bit ones (dtype=q4), "
                   "float32 activations and sums; compiled kernels (threads=N up to 1024); faster prompts: "
                   "inputs=rows (int8), inputs=bfloat16 (bfloat16), attention=bfloat16; kv=float16 (the KV "
                   "cache in half the bytes)")

    @classmethod
    def runs_on(cls) -> str:
        if _KERNELS is None:
            return "NumPy fallback (C kernels not built: slow)"
        simd = {2: "AVX-512", 1: "AVX2 + FMA + F16C"}.get(_KERNELS.simd(), "portable C")
        if _KERNELS.int8_path(96) == "AMX-INT8":  # (a chunk of MC rows: whether AMX runs at all)
            simd += ", AMX-INT8 for int8 and q4 batches"
        bf16_path = _KERNELS.bf16_attention()[0]
        if bf16_path:
            simd += f", {bf16_path} for attention=bfloat16"
        products_path = _KERNELS.bf16_products()[0]
        if products_path:
            simd += f", {products_path} for inputs=bfloat16"
        threads = _KERNELS.max_threads()
        capped = f", capped by INFERNO_HALF_ISA={ISA_CAP}" if ISA_CAP != "native" else ""
        return f"compiled C ({simd}, {'OpenMP' if threads > 1 else 'one thread'}{capped})"

    def __init__(self, dtype: Any = "float16", threads: Any = None, head: Any = None,
                 inputs: Any = None, attention: Any = "float32", kv: Any = "float32") -> None:
        """`dtype`: how the weights are stored, "float16" (default: 11 significant bits), "bfloat16"
        (8 bits, float32's range; what a BF16 checkpoint holds exactly), "int8" (quantized at load:
        8-bit integers and one float32 scale per output; half the bytes again) or "q4" (4-bit integers
        and a float16 scale per block of 32 inputs, as llama.cpp's q4_0: 0.56 of int8's bytes). `head`
        (q4 only): the format of the embeddings and the LM head, "q4" (the default, `HEAD_DEFAULT`) or
        "int8". `inputs` (int8): how the products quantize their inputs, "blocks" of 32 (the
        default) or "rows" (one scale per row: less exact, and several times faster on AMX; see
        `INPUTS`); (bfloat16) "bfloat16", the inputs rounded to bfloat16 too (`INPUTS_BF16`).
        `attention`: "float32" or "bfloat16", how a long prompt attends (`ATTENTION`). `kv`:
        the KV cache's element, "float32" or "float16" (`KV`).
        `threads`: threads of the compiled kernel, None or "auto" for $INFERNO_THREADS,
        else the usable cores (`inferno.cpu`). Bad values raise ValueError naming the option."""
        super().__init__("float32")
        _check_isa_cap()
        name = str(dtype).removeprefix("torch.").removeprefix("numpy.")
        if name not in DTYPES:
            raise ValueError(f"half backend: option dtype={dtype!r} is not supported (choose float16, "
                             "bfloat16, int8 or q4)")
        self.fmt = name
        if head is not None and name != "q4":
            raise ValueError(f"half backend: option head={head!r} applies to dtype=q4 only")
        if name == "q4" and head not in (None, "q4", "int8"):
            raise ValueError(f"half backend: option head={head!r} is not supported (choose q4 or int8)")
        if inputs == INPUTS_BF16 and name != "bfloat16":
            raise ValueError(f"half backend: option inputs={inputs!r} applies to dtype=bfloat16 only")
        if inputs not in (None, INPUTS_BF16) and name != "int8":
            raise ValueError(f"half backend: option inputs={inputs!r} applies to dtype=int8 only")
        if inputs not in (None, *INPUTS, INPUTS_BF16):
            raise ValueError(f"half backend: option inputs={inputs!r} is not supported (choose blocks or "
                             "rows; bfloat16 with dtype=bfloat16)")
        #: bfloat16's products on bfloat16 inputs (`INPUTS_BF16`), where the CPU has a path for them: its
        #: weights are then held in pairs (`PAIRS`), the format that says so to the kernels
        self.in16 = inputs == INPUTS_BF16 and _KERNELS is not None and bool(_KERNELS.bf16_products()[0])
        #: the format the weights are held in, and the embeddings' and LM head's (q4's own: `head`)
        self.weight_fmt = PAIRS if self.in16 else name
        self.head_fmt = (head or HEAD_DEFAULT) if name == "q4" else self.weight_fmt
        self._code = FORMATS[self.weight_fmt]
        #: int8's inputs quantized by row (`INPUTS`), in every product (the LM head's too)
        self.by_row = inputs == "rows"
        if self.by_row:
            self._code |= FMT_ROWS
        if attention not in ATTENTION:
            raise ValueError(f"half backend: option attention={attention!r} is not supported (choose float32 "
                             "or bfloat16)")
        #: a long prompt's attention on AMX-BF16 tiles (where the CPU has them)
        self.attention_bf16 = attention == "bfloat16"
        if kv not in KV:
            raise ValueError(f"half backend: option kv={kv!r} is not supported (choose float32 or float16)")
        #: the KV cache's element type (`KV`)
        self.kv_dtype = np.dtype(kv)
        # The conformance suite's tolerances follow the rounding of the weights.
        # (int8 and q4 have no entry there: they get the loosest, bfloat16's.)
        self.dtype = np.dtype(np.float16) if name == "float16" else name
        self.threads = _threads(threads)
        self.compiled = _KERNELS is not None
        self._workers: ThreadPoolExecutor | None = None  # for products of many rows, made when needed

    # ----------------------------------------------------------------------------------------- boundary

    def from_numpy(self, a: np.ndarray) -> np.ndarray:
        a = np.asarray(a)
        return np.ascontiguousarray(a, dtype=np.float32) if a.dtype.kind == "f" else np.ascontiguousarray(a)

    def to_numpy(self, a: Any) -> np.ndarray:
        if isinstance(a, Weight16):
            n, k = a.rows
            return self._unpack(a, 0, n)
        return super().to_numpy(a)

    def weight_order(self, name: str) -> str:
        # Fortran order [in, out] is C order [out, in]: the loader reads straight into it.
        return "F" if name.endswith(LINEAR) else "C"

    def prepare_weight(self, name: str, a: np.ndarray) -> Any:
        if name.endswith(LINEAR):  # [in, out] as the file has it: pack the transpose
            _check_range(name, a, self.fmt)
            return pack(a.T, self.weight_fmt)
        if name in EMBEDDINGS:  # [V, C] is [out, in] already
            _check_range(name, a, self.head_fmt)
            return pack(a, self.head_fmt)
        return np.ascontiguousarray(a, dtype=np.float32)

    def new_kv_cache(self, batch, n_head, length, head_dim):
        shape = (batch, n_head, length, head_dim)
        return kv_zeros(shape, self.kv_dtype), kv_zeros(shape, self.kv_dtype)

    def write_kv(self, k_cache, v_cache, k, v, offset):
        if k_cache.dtype == np.float16:
            k, v = _to_kv16(k), _to_kv16(v)
        return super().write_kv(k_cache, v_cache, k, v, offset)

    # ------------------------------------------------------------------------------------------ kernels

    def linear(self, x, w, b):
        if not isinstance(w, Weight16):
            return super().linear(x, w, b)
        lead = x.shape[:-1]
        return self._matmul(x.reshape(-1, x.shape[-1]), w, b).reshape(*lead, w.rows[0])

    def lm_head(self, x, wte):
        if not isinstance(wte, Weight16):
            return super().lm_head(x, wte)
        return self.linear(x, wte, None)

    def embedding(self, wte, wpe, ids, offset):
        if not isinstance(wte, Weight16):
            return super().embedding(wte, wpe, ids, offset)
        tok = wte.row_values(np.asarray(ids))
        if not isinstance(offset, (int, np.integer)):
            return tok + wpe[offset]
        return tok + wpe[offset : offset + ids.shape[-1]]

    def layernorm(self, x, gamma, beta, eps):
        # One C call: NumPy's six passes over one row cost more than the work, 25 times a decode step.
        if _KERNELS is not None:
            x = np.ascontiguousarray(x)
            out = np.empty_like(x)
            if _KERNELS.layernorm(x, _f32(gamma), _f32(beta), float(eps), out, self.threads):
                return out
        return super().layernorm(x, gamma, beta, eps)

    def attention(self, q, k_cache, v_cache, offset):
        if _in_c(q):
            # A few queries (decode): one C call instead of NumPy's stacked matmuls and softmax, whose
            # calls cost more than the work at one token (docs/benchmarks.md).
            q = _f32(q)
            out = np.empty_like(q)
            if _KERNELS.attention(q, k_cache, v_cache, int(offset), out, self.threads, self.attention_bf16):
                return out
        # Its matmuls on one BLAS thread: OpenBLAS's pool, once woken, spins and slows the kernel that
        # runs next (see `_one_blas_thread`).
        with _one_blas_thread():
            return super().attention(q, k_cache, v_cache, offset)

    def mlp(self, x, w_fc, b_fc, w_proj, b_proj):
        rows = x.reshape(-1, x.shape[-1])
        if (_KERNELS is not None and type(w_fc) is Weight16
                and type(w_proj) is Weight16):
            # Decode: both products in one C call, the GELU inside the first (it saves NumPy's nine
            # passes over 3072 values, 12 times a step).
            rows = _f32(rows)
            out = np.empty((rows.shape[0], w_proj.rows[0]), np.float32)
            if _KERNELS.mlp(rows, w_fc.blocks, w_fc.rows[0], _bias(b_fc), w_proj.blocks, _bias(b_proj),
                            self._code, self.threads, out):
                return out.reshape(x.shape)
        return super().mlp(x, w_fc, b_fc, w_proj, b_proj)

    def self_attention(self, x, w_attn, b_attn, w_proj, b_proj, kv, offset, n_head):
        b, t, c = x.shape
        code = self._code | (FMT_ATT16 if self.attention_bf16 else 0)
        if (_KERNELS is not None and (b * t <= SMALL_M or _long_prompt_in_c(c // n_head))
                and type(w_attn) is Weight16 and type(w_proj) is Weight16):
            # Decode: one C call runs the fused projection, writes the new keys and values into the cache,
            # attends (reading the heads where the projection left them: no split, copy or merge), and
            # runs c_proj. It declines (False) caches that are not this backend's own [B, H, L, D] float32
            # or float16 arrays with room for the new tokens.
            x = _f32(x)
            out = np.empty_like(x)
            if _KERNELS.self_attention(x, w_attn.blocks, _bias(b_attn), w_proj.blocks, _bias(b_proj), kv[0],
                                       kv[1], int(offset), n_head,
                                       code, self.threads, out):
                return out, kv
        return super().self_attention(x, w_attn, b_attn, w_proj, b_proj, kv, offset, n_head)

    def ragged_self_attention(self, x, w_attn, b_attn, w_proj, b_proj, slot_kv, rows, n_head):
        if (_KERNELS is not None and x.shape[1] <= RAGGED_TOKENS and type(w_attn) is Weight16
                and type(w_proj) is Weight16 and isinstance(slot_kv, list)):
            # One C call for the whole step: both products over all rows, every row's cache writes, and
            # the attention of all (token, head) pairs split among the threads (the default makes a call
            # per row, and NumPy's head split, slicing and merge around them).
            x = _f32(x)
            out = np.empty_like(x)
            table = _rows_table(rows)
            if _KERNELS.ragged_self_attention(x, w_attn.blocks, _bias(b_attn), w_proj.blocks, _bias(b_proj),
                                              slot_kv, table, n_head, self._code, self.threads, out):
                return out
        return super().ragged_self_attention(x, w_attn, b_attn, w_proj, b_proj, slot_kv, rows, n_head)

    # ---------------------------------------------------------------------- the Llama family's kernels
    #
    # In C where the kernels are built (`_kernels.c`: the same AVX-512 / AVX2 / portable paths as the
    # products), each one call; NumPy's float32 versions (`NumpyBackend`) where they are not, or decline.

    def embed_tokens(self, wte, ids):
        if not isinstance(wte, Weight16):
            return super().embed_tokens(wte, ids)
        return wte.row_values(np.asarray(ids))  # the rows widened from 16 or 8 bits

    def rms_norm(self, x, gamma, eps):
        # x may be a view (the heads of Qwen3's q/k norm): the kernel reads it through its strides.
        if _KERNELS is not None:
            out = np.empty(x.shape, np.float32)
            if _KERNELS.rms_norm(x, _f32(gamma), float(eps), out):
                return out
        return super().rms_norm(x, gamma, eps)

    def rotary(self, x, cos, sin):
        # x is the heads' view [B, H, T, D] of a projection: read through its strides, written contiguous.
        if _KERNELS is not None:
            out = np.empty(x.shape, np.float32)
            if _KERNELS.rotary(x, _f32(cos), _f32(sin), out):
                return out
        return super().rotary(x, cos, sin)

    def silu_mul(self, gate, up):
        if _KERNELS is not None:
            gate, up = _f32(gate), _f32(up)
            out = np.empty_like(gate)
            if _KERNELS.silu_mul(gate, up, out):
                return out
        return super().silu_mul(gate, up)

    def linears(self, x, weights, biases):
        ws = tuple(weights)
        if (_KERNELS is not None and 1 < len(ws) <= 3 and all(type(w) is Weight16 for w in ws)
                and len({w.fmt for w in ws}) == 1 and len({w.rows[1] for w in ws}) == 1):
            # q, k and v in one call: x quantized once (int8, q4) and all their panels in one parallel
            # loop: alone, k's and v's few panels leave most threads of a larger machine idle.
            lead = x.shape[:-1]
            rows = _f32(x.reshape(-1, x.shape[-1]))
            outs = tuple(np.empty((rows.shape[0], w.rows[0]), np.float32) for w in ws)
            if _KERNELS.linears(rows, tuple(w.blocks for w in ws), tuple(w.rows[0] for w in ws),
                                tuple(_bias(b) for b in biases), self._code_of(ws[0]), self.threads, outs):
                return [o.reshape(*lead, o.shape[1]) for o in outs]
        return super().linears(x, weights, biases)

    def gated_mlp(self, x, w_gate, w_up, w_down):
        ws = (w_gate, w_up, w_down)
        if _KERNELS is not None and all(type(w) is Weight16 for w in ws) and len({w.fmt for w in ws}) == 1:
            # One C call for the three products and silu_mul between them, as GPT-2's `mlp` (at one token a
            # step the calls cost more than the work; docs/benchmarks.md).
            rows = _f32(x.reshape(-1, x.shape[-1]))
            out = np.empty((rows.shape[0], w_down.rows[0]), np.float32)
            if _KERNELS.gated_mlp(rows, w_gate.blocks, w_up.blocks, w_gate.rows[0], w_down.blocks,
                                  self._code_of(w_gate), self.threads, out):
                return out.reshape(x.shape)
        return super().gated_mlp(x, w_gate, w_up, w_down)

    def gqa_attention(self, q, k_cache, v_cache, offset):
        if _in_c(q):
            # As `attention`: one C call, each query head reading its group's key/value head in place.
            q = _f32(q)
            out = np.empty_like(q)
            if _KERNELS.attention(q, k_cache, v_cache, int(offset), out, self.threads, self.attention_bf16):
                return out
        with _one_blas_thread():  # NumPy's batched matmul over the groups (see `attention`)
            return super().gqa_attention(q, k_cache, v_cache, offset)

    def ragged_gqa_attention(self, q, k, v, slot_kv, rows):
        n = q.shape[2]
        if _KERNELS is not None and n <= RAGGED_TOKENS and isinstance(slot_kv, list):
            # One C call a layer for the whole step, as GPT-2's `ragged_self_attention`: every row's cache
            # writes and the attention of all (token, head) pairs split among the threads (the default
            # makes two calls a row). It writes [1, N, H, D], the layout o_proj takes: `merge_heads` of
            # the transposed view is a reshape, no copy.
            out = np.empty((1, n, q.shape[1], q.shape[3]), np.float32)
            table = _rows_table(rows)
            if _KERNELS.ragged_attention(q, k, v, slot_kv, table, self.threads, out):
                return out.transpose(0, 2, 1, 3)
        return super().ragged_gqa_attention(q, k, v, slot_kv, rows)

    def _matmul(self, x: np.ndarray, w: Weight16, b: np.ndarray | None, gelu: bool = False) -> np.ndarray:
        """[M, K] float32 @ the [K, N] that `w` holds, + b (then gelu_new, with `gelu`): the kernel, or
        BLAS on weights unpacked a slice at a time where the kernel is not built (or declines)."""
        m, k = x.shape
        n = w.rows[0]
        if _KERNELS is not None:
            y = np.empty((m, n), np.float32)
            x = _f32(x)
            if _KERNELS.matmul(x, w.blocks, n, _bias(b), y, self._code_of(w), self.threads, gelu):
                return y
        if w.fmt in QUANTIZED:  # the kernel's arithmetic: int8 inputs as well as weights
            x = quantize_blocks(_f32(x), by_row=self.by_row and w.fmt == "int8")
        y = np.empty((m, n), np.float32)
        parts = _split(n, self.threads if _KERNELS is not None else 1)
        if len(parts) == 1:
            self._blas_rows(x, w, y, *parts[0])
        else:
            with _one_blas_thread():
                for f in [self._pool().submit(self._blas_rows, x, w, y, j0, j1) for j0, j1 in parts]:
                    f.result()
        if b is not None:
            y += b
        return self.gelu_new(y) if gelu else y

    def _code_of(self, w: Weight16) -> int:
        """The kernel's format code for a product by `w`, with this backend's input options."""
        return FORMATS[w.fmt] | (FMT_ROWS if self.by_row and w.fmt == "int8" else 0)

    def _blas_rows(self, x: np.ndarray, w: Weight16, y: np.ndarray, j0: int, j1: int) -> None:
        """y[:, j0:j1] = x @ rows j0 .. j1 - 1 of w, unpacked to float32 `UNPACK_BYTES` at a time."""
        k = x.shape[1]
        step = max(8, (UNPACK_BYTES // max(1, 4 * k)) // 8 * 8)
        for c0 in range(j0, j1, step):
            c1 = min(j1, c0 + step)
            y[:, c0:c1] = x @ self._unpack(w, c0, c1).T  # (matmul into a strided `out` skips BLAS)

    def _pool(self) -> ThreadPoolExecutor:
        if self._workers is None:
            self._workers = ThreadPoolExecutor(self.threads, thread_name_prefix="inferno_half")
        return self._workers

    def close(self) -> None:
        if self._workers is not None:
            self._workers.shutdown()
            self._workers = None

    def _unpack(self, w: Weight16, j0: int, j1: int) -> np.ndarray:
        """Rows j0 .. j1 - 1 of `w`'s [out, in] matrix as float32."""
        n, k = w.rows
        if _KERNELS is not None:
            out = np.empty((j1 - j0, k), np.float32)
            if _KERNELS.unpack(w.blocks, n, j0, j1, k, out, FORMATS[w.fmt], 1):
                return out
        if w.fmt == "int8":
            return _int8_rows(w, np.arange(j0, j1)) * w.scales()[j0:j1, None]
        if w.fmt == "q4":
            return q4_rows(w.blocks, np.arange(j0, j1), k)
        return from_bits(_rows16(w, np.arange(j0, j1)), w.fmt)


def _to_kv16(a: np.ndarray) -> np.ndarray:
    """Keys or values for a float16 cache, rounded as the kernels round them; ValueError for a finite value
    beyond float16's range (NumPy's cast would make it inf, with only a warning)."""
    a = np.asarray(a)
    if a.dtype == np.float16:
        return a
    with np.errstate(over="ignore"):
        h = a.astype(np.float16)
    inf = np.isinf(h)
    if inf.any() and np.isfinite(a[inf]).any():
        raise ValueError("kv=float16: a key or value is beyond float16's range (65504); this model needs the "
                         "float32 KV cache (kv=float32)")
    return h


def _rows_table(rows) -> np.ndarray:
    """A ragged step's RaggedRows as the kernels take them: int64 [R, 4] of (slot, offset, start, length)."""
    return np.array([(r.slot, r.offset, r.start, r.length) for r in rows], dtype=np.int64)


def _f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def _bias(b: np.ndarray | None) -> np.ndarray | None:
    return None if b is None else _f32(b)


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    """[0, n) in up to `parts` contiguous ranges whose starts are multiples of `PANEL`."""
    per = -(-n // max(1, parts) // PANEL) * PANEL or PANEL
    return [(j0, min(n, j0 + per)) for j0 in range(0, n, per)]


def _one_blas_thread() -> AbstractContextManager:
    """OpenBLAS on one thread while our own threads split a product among the cores, through
    `inferno.cpu.blas_threads` (process-wide and locked, so that a backend used from another thread at
    the same time cannot leave BLAS on one thread).

    OpenBLAS's threads spin for a while after each call: they would take the cores from the kernel's
    OpenMP threads during the first decode steps after a prefill. Called from our threads on one
    thread each, its pool never wakes up. Without the compiled kernels nothing runs in parallel with
    BLAS, and its threads are left alone.
    """
    return nullcontext() if _KERNELS is None else blas_threads(1)


def _check_range(name: str, a: np.ndarray, fmt: str) -> None:
    """float16 holds magnitudes up to 65504: a larger weight (or, in q4, a block scale |w| / 8 beyond it)
    would become inf, so refuse it by name."""
    if fmt not in ("float16", "q4") or a.size == 0:
        return
    largest = max(float(a.max()), -float(a.min()))  # (np.abs would copy a 154 MB wte)
    limit = 65504.0 * (8 if fmt == "q4" else 1)
    if largest > limit:
        raise ValueError(f"half backend: weight {name!r} holds {largest:.4g}, beyond {fmt}'s range "
                         f"({limit:g}); use half:dtype=bfloat16")


def _threads(threads: Any) -> int:
    if threads is None or threads == "auto":
        return resolve_threads(None, who="half backend")  # $INFERNO_THREADS, else the usable cores
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"half backend: option threads={threads!r} must be an integer >= 1 or 'auto'")
    if threads > MAX_THREADS:
        raise ValueError(f"half backend: option threads={threads} must be at most {MAX_THREADS}")
    return threads


@hookimpl
def register_backends(register) -> None:
    register(HalfBackend)
