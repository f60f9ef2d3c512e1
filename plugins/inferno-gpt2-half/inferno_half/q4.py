"""The 4-bit weight format (``half:dtype=q4``): how a matrix is quantized and laid out for `_kernels_q4.h`.

Each output's inputs in blocks of `QB` = 32, as llama.cpp's q4_0: 4-bit integers q in -8 .. 7 and one
float16 scale s per block, w ~ s * q. s = m / -8 where m is the block's weight of largest magnitude, so
that m itself is exactly -8 * s and the other 15 levels spread over [-|m|, |m| * 7 / 8]; s is rounded to
float16 first and q computed against the rounded s. 4.5 bits a weight: a batch-1 step, which reads every
weight once, reads 0.56 of int8's bytes.

Layout, per panel of `PANEL` = 32 outputs, per block (576 bytes): 8 groups of 4 inputs, 64 bytes each,
byte 4 * o + i holding input i of output o (0 .. 15) in its low nibble and of output 16 + o in its high
one, as q + 8; then the 32 float16 scales. Stored as int8 [out/32][blocks * 18][32] (the middle axis is
bytes / 32, as the int8 format's).
"""

from __future__ import annotations

import numpy as np

PANEL = 32
QB = 32
#: Bytes of one block of a panel: 32 x 32 nibbles, then 32 float16 scales.
BLOCK_BYTES = QB * PANEL // 2 + 2 * PANEL


def quantize_q4(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 [r, k] (k a multiple of `QB`) → (q int8 [r, k] in -8 .. 7, float16 scales [r, k / QB]), so
    that rows ≈ q * s by blocks (an all-zero block: s = 0, q = 0)."""
    r, k = rows.shape
    blocks = rows.reshape(r, k // QB, QB)
    at = np.abs(blocks).argmax(axis=2)[..., None]
    largest = np.take_along_axis(blocks, at, axis=2)[..., 0]
    with np.errstate(over="ignore"):
        scales = (largest / np.float32(-8)).astype(np.float16)
    s32 = scales.astype(np.float32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(s32 != 0, np.rint(blocks / np.where(s32 != 0, s32, 1)), 0)
    return q.clip(-8, 7).astype(np.int8).reshape(r, k), scales


def pack_q4(out_in: np.ndarray, kp: int, step: int) -> np.ndarray:
    """A float32 [out, in] matrix → the q4 panels (inputs padded with zeros to `kp`, outputs to whole
    panels), quantized `step` outputs (a multiple of `PANEL`) at a time: no full-size temporary."""
    n, k = out_in.shape
    count, kb = -(-n // PANEL), kp // QB
    out = np.zeros((count, kb * BLOCK_BYTES // PANEL, PANEL), dtype=np.int8)
    for j0 in range(0, n, step):
        j1 = min(n, j0 + step)
        rows = -(-(j1 - j0) // PANEL) * PANEL
        part = np.zeros((rows, kp), np.float32)
        part[: j1 - j0, :k] = out_in[j0:j1]
        q, scales = quantize_q4(part)
        panels = rows // PANEL
        # [panel, half, output, block, group, input] → [panel, block, group, output, input, half]
        nib = (q + 8).astype(np.uint8).reshape(panels, 2, PANEL // 2, kb, QB // 4, 4)
        nib = nib.transpose(0, 3, 4, 2, 5, 1)
        data = nib[..., 0] | (nib[..., 1] << 4)  # [panel, block, group, 16 outputs, 4 inputs]
        sc = scales.reshape(panels, PANEL, kb).transpose(0, 2, 1)  # [panel, block, output]
        whole = np.concatenate([data.reshape(panels, kb, -1),
                                np.ascontiguousarray(sc).view(np.uint8).reshape(panels, kb, -1)], axis=2)
        p0 = j0 // PANEL
        out[p0 : p0 + panels] = whole.reshape(panels, -1, PANEL).view(np.int8)
    return out


def q4_rows(blocks: np.ndarray, ids: np.ndarray, k: int) -> np.ndarray:
    """The float32 values s * q of outputs `ids` (1-D) over the first k inputs: undoes `pack_q4` for those
    rows only (the NumPy fallback's gather and unpacking)."""
    count, mid, _ = blocks.shape
    kb = mid * PANEL // BLOCK_BYTES
    raw = blocks[ids // PANEL].view(np.uint8).reshape(len(ids), kb, BLOCK_BYTES)
    data = raw[:, :, : QB * PANEL // 2].reshape(len(ids), kb, QB // 4, PANEL // 2, 4)
    scales = np.ascontiguousarray(raw[:, :, QB * PANEL // 2 :]).view(np.float16).astype(np.float32)
    j = ids % PANEL
    byte = data[np.arange(len(ids)), :, :, j % 16, :]  # [rows, block, group, input]
    nib = np.where((j < 16)[:, None, None, None], byte & 15, byte >> 4).astype(np.float32) - 8
    values = nib.reshape(len(ids), kb, QB) * scales[np.arange(len(ids)), :, j][..., None]
    return values.reshape(len(ids), kb * QB)[:, :k]
