"""The safetensors format, read by hand: the header (parsed and checked against the file's size) and each
tensor streamed into its final float32 array. `inferno.models.weights` builds the loaders on it.

We parse the header ourselves (8-byte little-endian length, then a JSON object; see
https://github.com/huggingface/safetensors) instead of using the library, because:

* the file is never memory-mapped: a file truncated while mapped kills the process with SIGBUS;
* each tensor is read with ``readinto`` straight into its final float32 array (F16/BF16 go through
  one temporary the size of that tensor), so the process never holds two copies of the weights; a
  tensor the backend wants in Fortran order is read a few rows at a time into its final array;
* every problem (bad header, offsets past the end, overlaps, unsupported dtypes) is found before any
  data is read, and all of them are reported at once in one :class:`WeightsError` naming the file.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from inferno.files import NotARegularFileError, open_regular_file

__all__ = [
    "WeightsError",
    "WeightsMemoryError",
    "TensorInfo",
    "SafetensorsHeader",
    "read_safetensors_header",
    "SUPPORTED_DTYPES",
    "MAX_HEADER_BYTES",
    "TRANSPOSE_CHUNK_BYTES",
    "READ_CHUNK_BYTES",
]


# Bytes per element of every dtype the safetensors format defines; only some of them can be loaded.
_DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8,
}  # fmt: skip
SUPPORTED_DTYPES = ("F32", "F16", "BF16")
# The upper-case limits and chunk sizes below are public so that tests (and a user tuning a load) can set
# them. The safetensors library refuses headers above 100 MB; a real GPT-2 header is ~15 kB.
MAX_HEADER_BYTES = 100_000_000
# The message lists this many problems; the exception's ``problems`` attribute keeps all of them.
_MAX_PROBLEM_LINES = 40
# Chunk size for reading a tensor into Fortran order (the size the transposing copy ran fastest at in
# docs/benchmarks.md).
TRANSPOSE_CHUNK_BYTES = 1 << 20
# Pieces a row-major float32 tensor is read in, each summed while still in the CPU's cache (the NaN/Inf
# check; see _read_tensor).
READ_CHUNK_BYTES = 1 << 20
# Elements per slice of the non-finite check: slices measured faster than one np.isfinite(a).all() per
# tensor (which also allocates a temporary as big as the tensor), min()/max() or a float64 sum, and the
# check is a small part of a cold start (docs/benchmarks.md).
_FINITE_CHUNK = 1 << 16


class WeightsError(ValueError):
    """A weights file that cannot be used; ``problems`` lists each one, ``path`` names the file."""

    def __init__(self, path: str | os.PathLike[str], problems: list[str], family: str = "GPT-2") -> None:
        self.path = os.fspath(path)
        self.problems = list(problems)
        if len(self.problems) == 1:
            message = f"cannot load {family} weights from {self.path}: {self.problems[0]}"
        else:
            shown = self.problems[:_MAX_PROBLEM_LINES]
            lines = "".join(f"\n  - {p}" for p in shown)
            if len(self.problems) > len(shown):
                lines += f"\n  ... and {len(self.problems) - len(shown)} more (see WeightsError.problems)"
            message = f"cannot load {family} weights from {self.path}: {len(self.problems)} problems:{lines}"
        super().__init__(message)


class WeightsMemoryError(WeightsError, MemoryError):
    """The weights do not fit in memory; the message says how much they need."""


# What a header problem means for the user: the file is damaged, or is not what it claims to be.
_DAMAGED = "delete it and run again to download a fresh copy, or replace it"


@dataclass(frozen=True)
class TensorInfo:
    """One header entry. ``start``/``end`` are absolute byte offsets in the file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class SafetensorsHeader:
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    data_start: int  # absolute offset of the data section (8 + header length)
    file_size: int


def _shape_str(shape: tuple[int, ...] | list[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_header(f: BinaryIO, path: str | os.PathLike[str], file_size: int) -> SafetensorsHeader:
    """Parse and check the header against the real file size. Raises WeightsError listing every problem."""
    if file_size < 8:
        raise WeightsError(path, [f"file is {file_size} bytes, too short to be a safetensors file; "
                                  f"{_DAMAGED}"])
    header_len = int.from_bytes(_read_exact(f, 8, path, "the header length"), "little")
    if header_len > file_size - 8:
        raise WeightsError(
            path,
            [f"header length {header_len} is bigger than the rest of the file ({file_size - 8} bytes): "
             f"truncated or not a safetensors file; {_DAMAGED}"],
        )
    if header_len > MAX_HEADER_BYTES:
        raise WeightsError(path, [f"header length {header_len} exceeds the {MAX_HEADER_BYTES}-byte limit"])
    raw = _read_exact(f, header_len, path, "the header")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as e:
        # ValueError covers bad UTF-8, bad JSON and integers too long to convert; deep nesting recurses.
        reason = str(e) if len(str(e)) < 100 else str(e)[:97] + "..."
        problem = f"header is not valid JSON ({reason}): truncated or not a safetensors file; {_DAMAGED}"
        raise WeightsError(path, [problem]) from None
    if not isinstance(header, dict):
        raise WeightsError(path, [f"header must be a JSON object, found {type(header).__name__}"])

    data_start = 8 + header_len
    data_size = file_size - data_start
    problems: list[str] = []
    metadata: dict[str, str] = {}
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            if entry is None:  # the safetensors library accepts a null metadata too
                continue
            if isinstance(entry, dict) and all(isinstance(v, str) for v in entry.values()):
                metadata = dict(entry)
            else:
                problems.append("'__metadata__' must be an object of strings")
            continue
        info = _parse_entry(name, entry, data_start, data_size, problems)
        if info is not None:
            tensors[name] = info

    # The format requires the data section to be covered exactly: no overlaps, no holes, nothing after.
    position = data_start
    previous = None
    for info in sorted(tensors.values(), key=lambda t: (t.start, t.end)):
        if info.start < position:
            problems.append(f"tensor '{info.name}' data overlaps tensor '{previous}'")
        elif info.start > position:
            problems.append(
                f"gap of {info.start - position} bytes in the data section before tensor '{info.name}'"
            )
        if info.end > position:
            position, previous = info.end, info.name
    if position < file_size and not problems:
        problems.append(f"{file_size - position} unused bytes after the last tensor's data")
    if problems:
        raise WeightsError(path, problems)
    return SafetensorsHeader(tensors=tensors, metadata=metadata, data_start=data_start, file_size=file_size)


def _parse_entry(
    name: str, entry: Any, data_start: int, data_size: int, problems: list[str]
) -> TensorInfo | None:
    if not isinstance(entry, dict):
        problems.append(f"tensor '{name}': header entry must be an object, found {type(entry).__name__}")
        return None
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    bad = []
    if not isinstance(dtype, str):
        bad.append(f"'dtype' must be a string, found {dtype!r}")
    if not (isinstance(shape, list) and all(_is_int(d) and d >= 0 for d in shape)):
        bad.append(f"'shape' must be a list of non-negative integers, found {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) and o >= 0 for o in offsets)):
        bad.append(f"'data_offsets' must be [begin, end] non-negative integers, found {offsets!r}")
    elif offsets[0] > offsets[1]:
        bad.append(f"'data_offsets' {offsets} has begin after end")
    elif offsets[1] > data_size:
        bad.append(
            f"data_offsets {offsets} run past the end of the file (data section is {data_size} bytes): "
            "file truncated?"
        )
    if bad:
        problems.append(f"tensor '{name}': " + "; ".join(bad))
        return None
    begin, end = offsets
    shape_t = tuple(shape)
    if dtype in _DTYPE_SIZES:
        expected = _DTYPE_SIZES[dtype] * math.prod(shape_t)
        if end - begin != expected:
            problems.append(
                f"tensor '{name}': data_offsets {offsets} hold {end - begin} bytes, "
                f"but {dtype} {_shape_str(shape_t)} needs {expected}"
            )
            return None
    return TensorInfo(name=name, dtype=dtype, shape=shape_t, start=data_start + begin, end=data_start + end)


def _read_exact(f: BinaryIO, n: int, path: str | os.PathLike[str], what: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise WeightsError(path, [f"file ended while reading {what} (file changed while reading?)"])
    return data


def read_safetensors_header(path: str | os.PathLike[str]) -> SafetensorsHeader:
    """Parse and validate a safetensors header (no tensor data is read).

    Checks the header length and every tensor's offsets against the real file size, so reading any
    tensor afterwards stays inside the file. Raises :class:`WeightsError` on any problem.
    """
    with _open(path) as f:
        return _parse_header(f, path, os.fstat(f.fileno()).st_size)


def _open(path: str | os.PathLike[str]) -> BinaryIO:
    try:
        # Unbuffered: readinto then goes straight from the kernel into our arrays. Only a regular file:
        # a FIFO would block forever, a link to /dev/zero be read without end.
        return open_regular_file(path, buffering=0)
    except FileNotFoundError:
        raise WeightsError(path, ["file not found"]) from None
    except IsADirectoryError:
        raise WeightsError(path, ["is a directory, expected a .safetensors file"]) from None
    except NotARegularFileError as e:
        raise WeightsError(path, [str(e.strerror)]) from None
    except OSError as e:
        raise WeightsError(path, [f"cannot open file: {e.strerror or e}"]) from None


def _readinto(f: BinaryIO, buf: np.ndarray, info: TensorInfo, path: str | os.PathLike[str],
              seek: bool = True) -> None:
    if seek:
        f.seek(info.start)
    view = memoryview(buf).cast("B")
    done = 0
    while done < len(view):
        n = f.readinto(view[done:])
        if not n:
            raise WeightsError(
                path, [f"file ended while reading tensor '{info.name}' (file truncated while loading?)"]
            )
        done += n


def _read_plain(f: BinaryIO, info: TensorInfo, path: str | os.PathLike[str]) -> np.ndarray:
    """Read one tensor as a C-order float32 array (a single allocation for F32)."""
    if info.dtype == "F32":
        out = np.empty(info.shape, dtype="<f4")
        _readinto(f, out, info, path)
    elif info.dtype == "F16":
        tmp = np.empty(info.shape, dtype="<f2")
        _readinto(f, tmp, info, path)
        out = tmp.astype(np.float32)
    else:  # BF16 is the top half of a float32: widen the bits and shift them into place.
        tmp = np.empty(info.shape, dtype="<u2")
        _readinto(f, tmp, info, path)
        bits = tmp.astype(np.uint32)
        del tmp
        bits <<= 16
        out = bits.view(np.float32)
    if out.dtype != np.float32:  # big-endian host: the file is always little-endian
        out = out.astype(np.float32)
    return out


def _read_tensor(f: BinaryIO, info: TensorInfo, path: str | os.PathLike[str], order: str = "C"
                 ) -> tuple[np.ndarray, bool]:
    """One tensor as a float32 array in `order` ("C", or "F" for a 2-D tensor: see `_read_transposed`),
    and whether every value is sure to be finite (False: count them, see `_count_nonfinite`). The check
    sums each piece right after reading it, while it is in the CPU's cache, so it costs next to nothing:
    a float sum is finite only if every term is (NaN and Inf propagate; a sum that overflows is a false
    alarm the count then clears)."""
    if order == "F" and len(info.shape) == 2:
        return _read_transposed(f, info, path)
    with np.errstate(over="ignore", invalid="ignore"):
        if info.dtype != "F32" or np.dtype("<f4") != np.float32:
            out = _read_plain(f, info, path)
            return out, _sums_finite(out)
        out = np.empty(info.shape, dtype=np.float32)
        flat = out.reshape(-1)
        f.seek(info.start)
        finite = True
        step = READ_CHUNK_BYTES // 4
        for e0 in range(0, flat.size, step):
            piece = flat[e0 : e0 + step]
            _readinto(f, piece, info, path, seek=False)
            finite = finite and _sums_finite(piece)
        return out, finite


def _sums_finite(a: np.ndarray) -> bool:
    """Called under np.errstate(over="ignore", invalid="ignore"): an overflow is an answer here."""
    return bool(np.isfinite(np.add.reduce(a, axis=None)))


def _read_transposed(f: BinaryIO, info: TensorInfo, path: str | os.PathLike[str]) -> tuple[np.ndarray, bool]:
    """Read a 2-D tensor into a Fortran-order float32 array, a few rows at a time: the transposed copy
    is made chunk by chunk, so the process never holds the tensor twice. Also whether its values are
    sure to be finite (see `_read_tensor`).

    The strided copy costs more than the read; a helper thread copies half of each chunk's columns,
    and goes on with them while the next chunk is read (NumPy's copy and the read release the GIL)."""
    out = np.empty(info.shape, dtype=np.float32, order="F")
    parts, cols = list(_row_parts(info, TRANSPOSE_CHUNK_BYTES)), info.shape[1]
    half = cols // 2 if len(parts) > 1 else 0  # one chunk: nothing to overlap

    def place(r0: int, rows: np.ndarray, c0: int, c1: int) -> None:
        out[r0 : r0 + rows.shape[0], c0:c1] = rows[:, c0:c1]

    finite = True
    with np.errstate(over="ignore", invalid="ignore"), ThreadPoolExecutor(1, "inferno-load") as helper:
        pending: Future[None] | None = None
        for r0, part in parts:
            rows = _read_plain(f, part, path)  # a new buffer: the helper may still copy from the last one
            finite = finite and _sums_finite(rows)
            if pending is not None:
                pending.result()
            pending = helper.submit(place, r0, rows, 0, half) if half else None
            place(r0, rows, half, cols)
        if pending is not None:
            pending.result()
    return out, finite


def _row_parts(info: TensorInfo, chunk_bytes: int) -> Iterator[tuple[int, TensorInfo]]:
    """(first row, TensorInfo of the rows) for consecutive chunks of about `chunk_bytes` of a tensor's
    rows (as stored in the file; at least one row)."""
    rows = info.shape[0]
    row_bytes = _DTYPE_SIZES[info.dtype] * math.prod(info.shape[1:])
    step = max(1, chunk_bytes // max(1, row_bytes))
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        yield r0, TensorInfo(info.name, info.dtype, (r1 - r0, *info.shape[1:]),
                             info.start + r0 * row_bytes, info.start + r1 * row_bytes)  # fmt: skip


def _count_nonfinite(a: np.ndarray) -> int:
    """How many elements of `a` are NaN or ±Inf: 0 after one pass in slices of _FINITE_CHUNK elements
    (no temporary as big as the tensor); counted exactly only when there are some."""
    flat = a.reshape(-1, order="A")  # a view for C- and Fortran-order arrays alike
    for i in range(0, flat.size, _FINITE_CHUNK):
        if not np.isfinite(flat[i : i + _FINITE_CHUNK]).all():
            return int(flat.size - np.count_nonzero(np.isfinite(flat)))
    return 0


def _size(n: int) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _nonfinite(name: str, a: np.ndarray, bad: int) -> str:
    return f"tensor '{name}' holds {bad} non-finite value{'s' if bad > 1 else ''} (NaN or Inf) of {a.size}"
