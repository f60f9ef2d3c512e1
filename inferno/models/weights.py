"""Weight plans: which tensors a checkpoint must hold, checked against its safetensors headers before a
byte of data is read, then read one tensor at a time (`inferno.models.safetensors_reader` reads the
format itself).

* GPT-2 (`load_weights`, `iter_weights`, `plan_tensors`): both key layouts are accepted, the Hub's
  ``openai-community/gpt2`` file (``wte.weight``, ``h.0.attn.c_attn.weight``, ... plus ``h.{i}.attn.bias``
  causal-mask buffers, skipped) and what ``save_pretrained`` writes (``transformer.``-prefixed keys and a
  top-level ``lm_head.weight``). GPT-2 ties the output projection to ``wte.weight``: an ``lm_head.weight``
  identical to ``wte.weight`` (after conversion to float32) is dropped to save memory, so callers must
  treat a missing ``lm_head.weight`` as "tied to ``wte.weight``"; one that differs is kept.
* Any other architecture (`TensorPlan`, `iter_planned`): the Hub's tensor names and shapes, from one
  model.safetensors or the shards a ``model.safetensors.index.json`` lists (`checkpoint_files`).

Every problem (missing/unexpected tensors, wrong shapes, unsupported dtypes, weights bigger than the
memory this process may use) is reported at once in one :class:`WeightsError` naming the file.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from inferno.errors import BackendError, squash
from inferno.files import parse_json, read_regular_file
from inferno.models.config import Gpt2Config
from inferno.models.safetensors_reader import (
    _DTYPE_SIZES,
    SUPPORTED_DTYPES,
    SafetensorsHeader,
    TensorInfo,
    WeightsError,
    WeightsMemoryError,
    _count_nonfinite,
    _nonfinite,
    _open,
    _parse_header,
    _read_plain,
    _read_tensor,
    _row_parts,
    _shape_str,
    _size,
    read_safetensors_header,
)

__all__ = [
    "WeightsError",
    "WeightsMemoryError",
    "WeightOrderError",
    "TensorInfo",
    "SafetensorsHeader",
    "read_safetensors_header",
    "expected_shapes",
    "plan_tensors",
    "load_weights",
    "iter_weights",
    "memory_limit",
    "SUPPORTED_DTYPES",
    "INDEX_FILE",
    "TensorPlan",
    "checkpoint_files",
    "plan_problems",
    "iter_planned",
]

# Causal-mask buffers that older transformers versions saved with the weights; not parameters.
_MASK_BUFFER = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")
_PREFIX = "transformer."
_LM_HEAD = "lm_head.weight"
# Chunk size for comparing lm_head.weight against wte.weight without a second full copy.
COMPARE_CHUNK_BYTES = 4 << 20
# Which header names belong to a layer, and its index (at most 9 digits: a hostile index never becomes a
# huge int).
_LAYER = re.compile(r"(?:transformer\.)?h\.(\d{1,9})\.")


class WeightOrderError(BackendError, ValueError):
    """The `order` callback (a backend's `weight_order`) raised or returned something but "C" or "F"."""


def expected_shapes(config: Gpt2Config) -> dict[str, tuple[int, ...]]:
    """Canonical tensor names (no prefix, without lm_head.weight) and their shapes for ``config``."""
    return _expected_shapes(config, config.n_layer)


def _expected_shapes(config: Gpt2Config, n_layer: int) -> dict[str, tuple[int, ...]]:
    V, P, C = config.vocab_size, config.n_positions, config.n_embd
    shapes: dict[str, tuple[int, ...]] = {"wte.weight": (V, C), "wpe.weight": (P, C)}
    for i in range(n_layer):
        h = f"h.{i}."
        shapes.update({
            h + "ln_1.weight": (C,),
            h + "ln_1.bias": (C,),
            h + "attn.c_attn.weight": (C, 3 * C),
            h + "attn.c_attn.bias": (3 * C,),
            h + "attn.c_proj.weight": (C, C),
            h + "attn.c_proj.bias": (C,),
            h + "ln_2.weight": (C,),
            h + "ln_2.bias": (C,),
            h + "mlp.c_fc.weight": (C, 4 * C),
            h + "mlp.c_fc.bias": (4 * C,),
            h + "mlp.c_proj.weight": (4 * C, C),
            h + "mlp.c_proj.bias": (C,),
        })  # fmt: skip
    shapes["ln_f.weight"] = (C,)
    shapes["ln_f.bias"] = (C,)
    return shapes


def _canonical(name: str) -> str:
    return name[len(_PREFIX):] if name.startswith(_PREFIX) else name


def _list_names(names: list[str], limit: int = 12) -> str:
    shown = ", ".join(f"'{n}'" for n in names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def _file_layers(header: SafetensorsHeader) -> int:
    """1 + the largest layer index among the file's tensor names (0 when it has none)."""
    top = -1
    for name in header.tensors:
        m = _LAYER.match(name)
        if m:
            top = max(top, int(m.group(1)))
    return top + 1


def plan_tensors(header: SafetensorsHeader, config: Gpt2Config) -> tuple[dict[str, TensorInfo], list[str]]:
    """Map canonical names to header entries and collect every mismatch with the config."""
    # Layers past the file's last one are all missing: they are counted, not listed, so that nothing is
    # built in proportion to a config's n_layer the file does not back (expected_shapes builds 12 entries
    # a layer).
    built = min(config.n_layer, _file_layers(header) + 1)
    unbuilt = config.n_layer - built
    expected = _expected_shapes(config, built)
    expected[_LM_HEAD] = (config.vocab_size, config.n_embd)
    problems: list[str] = []
    chosen: dict[str, TensorInfo] = {}
    unexpected: list[str] = []
    for info in header.tensors.values():
        name = _canonical(info.name)
        if _MASK_BUFFER.fullmatch(name):
            continue
        if name not in expected or (name == _LM_HEAD and info.name != _LM_HEAD):
            unexpected.append(info.name)
            continue
        if name in chosen:
            problems.append(f"tensor '{name}' appears twice: as '{chosen[name].name}' and as '{info.name}'")
            continue
        chosen[name] = info

    missing = [n for n in expected if n != _LM_HEAD and n not in chosen]
    if missing or unbuilt:
        count = len(missing) + 12 * unbuilt
        shown = _list_names(missing) if not unbuilt else \
            ", ".join(f"'{n}'" for n in missing[:12]) + f", ... ({count - min(12, len(missing))} more, " \
            f"through layer h.{config.n_layer - 1})"
        problems.append(f"missing tensors ({count}): {shown}")
    if unexpected:
        problems.append(f"unexpected tensors ({len(unexpected)}): {_list_names(sorted(unexpected))}")
    for name in expected:  # canonical order reads better than the file's alphabetical one
        info = chosen.get(name)
        if info is None:
            continue
        if info.dtype not in SUPPORTED_DTYPES:
            supported = ", ".join(SUPPORTED_DTYPES)
            problems.append(
                f"tensor '{info.name}' has unsupported dtype {info.dtype} (supported: {supported})"
            )
        if info.shape != expected[name]:
            found, want = _shape_str(info.shape), _shape_str(expected[name])
            problems.append(f"tensor '{info.name}' has shape {found}, expected {want}")
    return chosen, problems


def _orders(order: Callable[[str], str] | None, chosen: dict[str, TensorInfo]) -> dict[str, str]:
    """The memory order of each tensor; a callback that raises or answers anything but "C" or "F" is a
    `WeightOrderError` naming the backend it belongs to (before any data is read)."""
    if order is None:
        return dict.fromkeys(chosen, "C")
    owner = getattr(order, "__self__", None)
    who = f"backend {owner.name!r}: weight_order" if isinstance(getattr(owner, "name", None), str) \
        else "the order callback"
    orders = {}
    for name in chosen:
        try:
            orders[name] = order(name)
        except Exception as exc:  # noqa: BLE001 - a plugin's bug, reported with its name
            text = squash(exc)
            raise WeightOrderError(f"{who}({name!r}) raised {type(exc).__name__}"
                                   f"{': ' + text if text else ''}") from exc
    bad = {name: o for name, o in orders.items() if not (isinstance(o, str) and o in ("C", "F"))}
    if bad:
        raise WeightOrderError("memory order must be 'C' or 'F', got " +
                               ", ".join(f"{o!r} for tensor '{name}'" for name, o in list(bad.items())[:3]) +
                               f" (from {who})")
    return orders


def memory_limit() -> int | None:
    """Bytes of memory this process may use at most: physical memory plus swap, capped by a cgroup
    memory limit (v2 memory.max, v1 memory.limit_in_bytes); None when unknown."""
    limits = []
    try:
        limits.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") + swap_bytes())
    except (AttributeError, ValueError, OSError):
        pass
    for name in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(name) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            limits.append(int(text))
    return min(limits) if limits else None


def swap_bytes() -> int:
    """Bytes of swap space (/proc/meminfo's SwapTotal), 0 when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("SwapTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _read_all(f: BinaryIO, path: str | os.PathLike[str], chosen: dict[str, TensorInfo],
              lm_head: TensorInfo | None, orders: dict[str, str]) -> Iterator[tuple[str, np.ndarray, bool]]:
    """(name, float32 array, sure to be finite) of every tensor kept: the largest first (`wte`: a consumer
    that converts each array as it comes then peaks at the largest one plus what it converted), then in
    file order, so the reads are sequential; a separate `lm_head.weight` last, only when it differs from
    `wte`."""
    largest = max(chosen, key=lambda n: math.prod(chosen[n].shape))
    rest = sorted((n for n in chosen if n != largest), key=lambda n: chosen[n].start)
    for name in (largest, *rest):
        yield name, *_read_tensor(f, chosen[name], path, orders[name])
    if lm_head is not None and not _same_tensors(f, lm_head, chosen["wte.weight"], path):
        yield _LM_HEAD, *_read_tensor(f, lm_head, path, orders[_LM_HEAD])


def _same_tensors(f: BinaryIO, a: TensorInfo, b: TensorInfo, path: str | os.PathLike[str]) -> bool:
    """Whether two [V, C] tensors of the file hold the same values (as float32), a few rows at a time."""
    rows = max(1, COMPARE_CHUNK_BYTES // (4 * math.prod(a.shape[1:])))  # the same rows from both
    parts_a = _row_parts(a, rows * _DTYPE_SIZES[a.dtype] * math.prod(a.shape[1:]))
    parts_b = _row_parts(b, rows * _DTYPE_SIZES[b.dtype] * math.prod(b.shape[1:]))
    for (_, part_a), (_, part_b) in zip(parts_a, parts_b, strict=True):
        if not np.array_equal(_read_plain(f, part_a, path), _read_plain(f, part_b, path)):
            return False
    return True


def _check_memory(path: str | os.PathLike[str], need: int) -> None:
    """Refuse, before allocating anything, weights that cannot fit in this machine's memory."""
    limit = memory_limit()
    if limit is not None and need > limit:
        raise WeightsMemoryError(path, [f"the weights need {_size(need)} of memory as float32, more than "
                                        f"the {_size(limit)} this process can have"])


def load_weights(
    path: str | os.PathLike[str], config: Gpt2Config, order: Callable[[str], str] | None = None
) -> dict[str, np.ndarray]:
    """Load every GPT-2 parameter from a safetensors file as float32 numpy arrays.

    Arrays are C-contiguous, or in the memory order ``order(name)`` returns ("C" or "F"; anything else
    is a ValueError, raised before any data is read): pass a backend's `weight_order` so that it gets
    its preferred layout without a second copy at load (a Fortran-order tensor costs a transposing copy
    made a few rows at a time, slower than a C-order read).

    Keys are canonical Hub names without prefix (``wte.weight``, ``h.0.attn.c_attn.weight``, ...;
    see :func:`expected_shapes`). Linear weights keep the Hub's Conv1D layout ``[in, out]``.
    ``lm_head.weight`` is present only when the file has one that differs from ``wte.weight``;
    otherwise the head is tied to ``wte.weight``.

    F32, F16 and BF16 storage are supported. Raises :class:`WeightsError` listing every problem
    (malformed file, missing/unexpected tensors, shape or dtype mismatches) before reading any data,
    :class:`WeightsMemoryError` when the weights cannot fit in memory (saying how much they need), and
    :class:`WeightsError` naming every tensor that holds NaN or Inf, with the count, after reading (the
    check is one pass in slices; see _FINITE_CHUNK). A bad `order` is a :class:`WeightOrderError`.
    """
    read = list(_stream(path, config, order, check_each=False))
    file_names = {name: file_name for name, file_name, _, _ in read}
    weights = {name: a for name, _, a, _ in read}
    suspect = {name for name, _, _, finite in read if not finite}
    del read
    # Canonical order (embeddings, blocks, final norm) reads better when inspected.
    rank = {name: i for i, name in enumerate(expected_shapes(config))}
    weights = {name: weights[name] for name in sorted(weights, key=lambda n: rank.get(n, len(rank)))}
    # NaN or Inf anywhere gives garbage text on every backend: refuse it, naming each tensor and the count.
    nonfinite = [_nonfinite(file_names[name], a, bad)
                 for name, a in weights.items() if name in suspect and (bad := _count_nonfinite(a))]
    if nonfinite:
        raise WeightsError(path, nonfinite)
    return weights


def iter_weights(
    path: str | os.PathLike[str], config: Gpt2Config, order: Callable[[str], str] | None = None
) -> Iterator[tuple[str, np.ndarray]]:
    """`load_weights` one tensor at a time: (canonical name, float32 array) pairs, the largest tensor
    first, so that a caller that converts each array as it arrives (a backend with 16-bit weights)
    never holds the float32 weights all at once. Every check on the header runs before the first
    pair; a tensor with NaN or Inf raises `WeightsError` when it is reached, naming it."""
    for name, _, a, _ in _stream(path, config, order, check_each=True):
        yield name, a


def iter_checkpoint(path: str | os.PathLike[str], config: Gpt2Config,
                    order: Callable[[str], str] | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """`iter_weights` of a GPT-2 checkpoint: its model.safetensors, or the folder holding it (a sharded
    checkpoint is refused: GPT-2's weights are one file)."""
    path = os.path.join(path, "model.safetensors") if os.path.isdir(path) else os.fspath(path)
    if path.endswith(".index.json"):
        raise WeightsError(path, ["a sharded checkpoint: inferno reads GPT-2 weights from one "
                                  "model.safetensors"])
    return iter_weights(path, config, order)


def header_problems(config: Gpt2Config, tensors: Iterable[TensorInfo], whole: bool = True) -> list[str]:
    """What is wrong with a model.safetensors header's tensors for a GPT-2 `config` (a GPT-2 checkpoint
    is one file: always checked whole)."""
    header = SafetensorsHeader({t.name: t for t in tensors}, {}, 0, 0)
    return plan_tensors(header, config)[1]


def _stream(path: str | os.PathLike[str], config: Gpt2Config, order: Callable[[str], str] | None,
            check_each: bool) -> Iterator[tuple[str, str, np.ndarray, bool]]:
    """(canonical name, name in the file, array, sure to be finite) of every tensor, after every check on
    the header; with `check_each`, a tensor with NaN or Inf raises when it is reached."""
    if not isinstance(config, Gpt2Config):
        raise TypeError(f"config must be a Gpt2Config, not {type(config).__name__}")
    with _open(path) as f:
        header = _parse_header(f, path, os.fstat(f.fileno()).st_size)
        chosen, problems = plan_tensors(header, config)
        if problems:
            raise WeightsError(path, problems)

        orders = _orders(order, chosen)
        lm_head = chosen.pop(_LM_HEAD, None)
        # float32 bytes of every tensor kept (a separate lm_head counted: it may differ from wte).
        need = sum(4 * math.prod(info.shape) for info in (*chosen.values(), *([lm_head] if lm_head else [])))
        _check_memory(path, need)
        names = {name: info.name for name, info in (*chosen.items(), (_LM_HEAD, lm_head)) if info}
        try:
            for name, a, finite in _read_all(f, path, chosen, lm_head, orders):
                if check_each and not finite and (bad := _count_nonfinite(a)):
                    raise WeightsError(path, [_nonfinite(names[name], a, bad)])
                yield name, names[name], a, finite
        except MemoryError:
            limit = memory_limit()
            here = f" ({_size(limit)} of memory here)" if limit else ""
            raise WeightsMemoryError(path, [f"not enough memory: the weights need {_size(need)} as "
                                            f"float32{here}"]) from None


# ------------------------------------------------------------------ any architecture's plan, sharded files

#: A sharded checkpoint's index (``save_pretrained`` writes it beside the shards when they are many).
INDEX_FILE = "model.safetensors.index.json"


@dataclass(frozen=True)
class TensorPlan:
    """What an architecture's checkpoint holds: each tensor's name in the file and its shape there
    (`shapes`; every one is required), the names the model takes transposed (torch's ``[out, in]``
    Linear weights handed over as ``[in, out]``), names present in some files but not read (`ignored`:
    a tied ``lm_head.weight``, rotary buffers), and the family's name for messages."""

    shapes: dict[str, tuple[int, ...]]
    transposed: frozenset[str] = frozenset()
    ignored: re.Pattern[str] | None = None
    family: str = "model"


def checkpoint_files(path: str | os.PathLike[str]) -> list[str]:
    """The safetensors files of a checkpoint: `path` itself (a .safetensors file), the shards named by an
    index.json, or what a folder holds (model.safetensors, else the index). Shard names must be plain
    file names beside the index: a hostile index cannot point outside its folder."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "model.safetensors")
    if os.path.basename(path) == "model.safetensors" and not os.path.lexists(path):
        index = os.path.join(os.path.dirname(path), INDEX_FILE)  # a sharded checkpoint has no single file
        path = index if os.path.lexists(index) else path
    if not path.endswith(".index.json"):
        return [path]
    try:
        index = parse_json(read_regular_file(path, 64 << 20, "an index.json"), path, WeightsError)
    except FileNotFoundError:
        raise WeightsError(path, ["file not found"]) from None
    except OSError as e:
        raise WeightsError(path, [f"cannot read file: {e.strerror or e}"]) from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not (isinstance(weight_map, dict) and weight_map
            and all(isinstance(v, str) for v in weight_map.values())):
        raise WeightsError(path, ["'weight_map' must be a non-empty object of tensor name → shard file"])
    shards = list(dict.fromkeys(weight_map.values()))
    bad = [s for s in shards if os.path.basename(s) != s or s in ("", ".", "..")]
    if bad:
        raise WeightsError(path, [f"shard {bad[0]!r} is not a file name beside the index"])
    folder = os.path.dirname(path)
    return [os.path.join(folder, s) for s in shards]


def plan_problems(plan: TensorPlan, tensors: Iterable[TensorInfo], whole: bool = True) -> list[str]:
    """What is wrong with a checkpoint's tensors (the headers of all its files, or of one shard when not
    `whole`) against `plan`: tensors missing (only when `whole`), unexpected, of a dtype that cannot be
    loaded or of the wrong shape. An empty list when they fit."""
    problems: list[str] = []
    seen, unexpected = set(), []
    for info in tensors:
        seen.add(info.name)
        if info.name not in plan.shapes:
            if plan.ignored is None or not plan.ignored.fullmatch(info.name):
                unexpected.append(info.name)
            continue
        if info.dtype not in SUPPORTED_DTYPES:
            problems.append(f"tensor '{info.name}' has unsupported dtype {info.dtype} (supported: "
                            f"{', '.join(SUPPORTED_DTYPES)})")
        if info.shape != plan.shapes[info.name]:
            problems.append(f"tensor '{info.name}' has shape {_shape_str(info.shape)}, expected "
                            f"{_shape_str(plan.shapes[info.name])}")
    missing = [n for n in plan.shapes if n not in seen] if whole else []
    head = []
    if missing:
        head.append(f"missing tensors ({len(missing)}): {_list_names(missing)}")
    if unexpected:
        head.append(f"unexpected tensors ({len(unexpected)}): {_list_names(sorted(unexpected))}")
    return head + problems


def iter_planned(path: str | os.PathLike[str], plan: TensorPlan, order: Callable[[str], str] | None = None
                 ) -> Iterator[tuple[str, np.ndarray]]:
    """(name, float32 array) of every tensor of `plan`, from a checkpoint of one file or many (see
    `checkpoint_files`), one tensor at a time, file after file. Every header is parsed and checked
    against the plan before the first tensor is read (missing, unexpected, duplicated tensors, shapes,
    dtypes: all reported at once in one `WeightsError`), and the memory they need against what the
    process may use; a tensor holding NaN or Inf raises when it is reached, naming it.

    A transposed tensor is read in the order opposite to the one ``order(name)`` asks for and handed
    over as its transpose, a view: either way no second copy of it is made."""
    files = checkpoint_files(path)
    where: dict[str, tuple[str, TensorInfo]] = {}
    problems: list[str] = []
    for file in files:
        for info in read_safetensors_header(file).tensors.values():
            if info.name in where:
                problems.append(f"tensor '{info.name}' appears in {where[info.name][0]} and in {file}")
            else:
                where[info.name] = (file, info)
    problems += plan_problems(plan, [info for _, info in where.values()])
    where = {name: w for name, w in where.items() if name in plan.shapes}
    where_shown = path if len(files) > 1 else files[0]
    if problems:
        raise WeightsError(where_shown, problems, plan.family)
    orders = _orders(order, {name: info for name, (_, info) in where.items()})
    _check_memory(where_shown, sum(4 * math.prod(info.shape) for _, info in where.values()))
    for file in files:
        with _open(file) as f:
            for name, (_, info) in sorted(((n, w) for n, w in where.items() if w[0] == file),
                                          key=lambda item: item[1][1].start):
                flip = name in plan.transposed and len(info.shape) == 2
                want = orders[name] if not flip else ("F" if orders[name] == "C" else "C")
                a, finite = _read_tensor(f, info, file, want)
                if not finite and (bad := _count_nonfinite(a)):
                    raise WeightsError(file, [_nonfinite(name, a, bad)], plan.family)
                yield name, (a.T if flip else a)
                del a
