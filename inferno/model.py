"""GPT-2, written once against the `Backend` protocol.

    x = wte[ids] + wpe[positions]
    for each block:  x = x + attn(ln_1(x))      (causal, multi-head, KV-cached)
                     x = x + mlp(ln_2(x))       (c_fc → gelu_new → c_proj)
    logits = ln_f(x) @ wte.T                    (the LM head is tied to the token embedding)

The model holds its weights as backend arrays (converted once, here) and never touches NumPy itself,
apart from the token ids it hands to the backend.

**Checking the backend.** A plugin's kernels can fail or return garbage; the model never passes that on
silently. Every kernel call goes through a thin guard (`_Guard`: 30-90 µs a 12-layer decode step, under 1%
of a 124M step's ~10 ms, measured on 2 cores) that turns an exception
into a `BackendError` naming the backend and the kernel; on a model's first `forward` (and first
`forward_ragged`) it also checks the shape of everything the backend returns, and `new_cache` /
`new_slots` check the KV cache's. Where the logits come back to the host, `check_logits` checks their
shape and that they are finite (one np.isfinite over the sampled rows: ~10 µs a row of 50257), and a
non-finite row is a `NonFiniteLogitsError` saying whether the weights or the backend produced it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferno.backends.base import Array, Backend, RaggedRow
from inferno.backends.registry import BackendError
from inferno.config import Gpt2Config

#: Weights this large (in magnitude) are not trained GPT-2 weights (those stay below ~100): finite, they
#: still overflow float32 arithmetic (3e38 in c_fc makes inf, then NaN), so non-finite logits with such
#: weights are blamed on the weights, not the backend.
LARGE_WEIGHT = 1e4


class NonFiniteLogitsError(BackendError):
    """The logits of a step hold NaN or Inf. ``cause`` is "weights" (finite at load, checked, but so
    large that float32 overflows) or "backend" (the weights are moderate: the backend computed them);
    the message says which, names the backend and, where it can be found, the kernel."""

    def __init__(self, message: str, cause: str, backend: str, kernel: str | None = None) -> None:
        super().__init__(message)
        self.cause = cause
        self.backend = backend
        self.kernel = kernel


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _shape(a: Any) -> tuple | None:
    try:
        return tuple(int(d) for d in a.shape)
    except Exception:  # noqa: BLE001 - no shape, or a symbolic one: not an array we can use
        return None


class _Guard:
    """The backend as the forward pass sees it: each kernel call names the backend and the kernel when
    it raises; with `shapes`, every result's shape is checked too (a model's first forward); with
    `finite`, every result is also copied to the host and checked finite (diagnosing non-finite logits
    only: costly)."""

    def __init__(self, model: Gpt2, path: str, shapes: bool, finite: bool = False) -> None:
        self.be = model.backend
        self.model = model
        self.path = path
        self.shapes = shapes or finite
        self.finite = finite

    def _fail(self, kernel: str, problem: str) -> BackendError:
        return BackendError(f"backend {self.be.name!r}: {kernel} {problem}")

    def _call(self, kernel: str, *args: Any) -> Any:
        try:
            return getattr(self.be, kernel)(*args)
        except BackendError:
            raise
        except Exception as exc:  # noqa: BLE001 - a backend's failure, named; KeyboardInterrupt passes
            raise self._fail(kernel, f"raised {_one_line(exc)}") from exc

    def _expect(self, kernel: str, out: Any, shape: tuple) -> Any:
        if self.shapes:
            got = _shape(out)
            if got != tuple(shape):
                raise self._fail(kernel, f"returned an array of shape {got}, expected {tuple(shape)}")
            if self.finite:
                host = np.asarray(self.be.to_numpy(out))
                if not np.isfinite(host).all():
                    raise _KernelNotFinite(self.be.name, kernel)
        return out

    # The calls `Gpt2.forward` and `forward_ragged` make, in their order.
    def from_numpy(self, a: np.ndarray) -> Array:
        return self._expect("from_numpy", self._call("from_numpy", a), a.shape)

    # Past a model's first forward only exceptions are caught: the expected shapes are not even
    # computed (63 `_shape` calls a 12-layer step, ~1 us each).
    def embedding(self, wte, wpe, ids, offset):
        out = self._call("embedding", wte, wpe, ids, offset)
        if not self.shapes:
            return out
        return self._expect("embedding", out, (*(_shape(ids) or ()), self.model.config.n_embd))

    def layernorm(self, x, gamma, beta, eps):
        out = self._call("layernorm", x, gamma, beta, eps)
        return self._expect("layernorm", out, _shape(x) or ()) if self.shapes else out

    def self_attention(self, x, w_attn, b_attn, w_proj, b_proj, kv, offset, n_head):
        before = [_shape(a) for a in kv] if self.shapes else None
        result = self._call("self_attention", x, w_attn, b_attn, w_proj, b_proj, kv, offset, n_head)
        if self.shapes:
            try:
                out, (k, v) = result
            except (TypeError, ValueError):
                raise self._fail("self_attention", "did not return (output, (k_cache, v_cache))") from None
            if [_shape(k), _shape(v)] != before:
                raise self._fail("self_attention", f"returned KV caches of shapes {_shape(k)} and "
                                 f"{_shape(v)}, expected {before[0]}")
            self._expect("self_attention", out, _shape(x) or ())
        return result

    def ragged_self_attention(self, x, w_attn, b_attn, w_proj, b_proj, slot_kv, rows, n_head):
        before = [_shape(a) for kv in slot_kv for a in kv] if self.shapes else None
        out = self._call("ragged_self_attention", x, w_attn, b_attn, w_proj, b_proj, slot_kv, rows, n_head)
        if not self.shapes:
            return out
        if [_shape(a) for kv in slot_kv for a in kv] != before:
            raise self._fail("ragged_self_attention", "changed the shape of a KV slot")
        return self._expect("ragged_self_attention", out, _shape(x) or ())

    def add(self, a, b):
        out = self._call("add", a, b)
        return self._expect("add", out, _shape(a) or ()) if self.shapes else out

    def mlp(self, x, w_fc, b_fc, w_proj, b_proj):
        out = self._call("mlp", x, w_fc, b_fc, w_proj, b_proj)
        return self._expect("mlp", out, _shape(x) or ()) if self.shapes else out

    def concat(self, arrays, axis):
        out = self._call("concat", arrays, axis)
        if self.shapes:
            shapes = [_shape(a) or () for a in arrays]
            expected = list(shapes[0])
            expected[axis] = sum(s[axis] for s in shapes)
            self._expect("concat", out, tuple(expected))
        return out

    def lm_head(self, x, wte):
        out = self._call("lm_head", x, wte)
        if self.shapes:
            self._expect("lm_head", out, (*(_shape(x) or ())[:-1], self.model.config.vocab_size))
            self.model._shapes_checked.add(self.path)  # the last kernel of a forward: all were right
        return out


class _KernelNotFinite(BackendError):
    """Raised while diagnosing non-finite logits (see `Gpt2._diagnose`): the first kernel whose result
    held NaN or Inf."""

    def __init__(self, backend: str, kernel: str) -> None:
        super().__init__(f"backend {backend!r}: {kernel} returned non-finite values")
        self.kernel = kernel


@dataclass
class Block:
    ln_1_g: Array
    ln_1_b: Array
    attn_w: Array
    attn_b: Array
    attn_proj_w: Array
    attn_proj_b: Array
    ln_2_g: Array
    ln_2_b: Array
    fc_w: Array
    fc_b: Array
    proj_w: Array
    proj_b: Array


@dataclass
class KvCache:
    """Keys and values of every layer for `length` positions, room for `capacity`."""

    layers: list[tuple[Array, Array]]
    capacity: int
    length: int = 0


@dataclass
class KvSlots:
    """A fixed number of KV cache slots, each holding one sequence of up to n_positions tokens.

    ``layers[i][slot]`` is layer i's (k_cache, v_cache) of that slot, each [1, H, P, D], allocated once;
    a slot is taken by a sequence and given back for the next without reallocating (its old contents
    are simply overwritten: a row attends only to the positions it has written). In float32 a slot
    takes ``2 * n_layer * n_positions * n_embd * 4`` bytes: 72 MiB at the 124M shape.
    """

    layers: list[list[tuple[Array, Array]]]
    capacity: int

    @property
    def n_slots(self) -> int:
        return len(self.layers[0]) if self.layers else 0


def slot_bytes(config: Gpt2Config, itemsize: int = 4) -> int:
    """Bytes of KV cache one slot takes (keys and values of every layer, the whole context)."""
    return 2 * config.n_layer * config.n_positions * config.n_embd * itemsize


@dataclass
class Gpt2:
    config: Gpt2Config
    backend: Backend
    wte: Array
    wpe: Array
    blocks: list[Block]
    ln_f_g: Array
    ln_f_b: Array
    lm_head_w: Array  # wte itself unless the file carries its own lm_head.weight
    #: The forward paths ("forward", "forward_ragged") whose kernels' shapes were checked once.
    _shapes_checked: set[str] = field(default_factory=set, init=False, repr=False, compare=False)
    _diagnosing: bool = field(default=False, init=False, repr=False, compare=False)

    @classmethod
    def from_weights(cls, config: Gpt2Config,
                     weights: Mapping[str, np.ndarray] | Iterable[tuple[str, np.ndarray]],
                     backend: Backend) -> Gpt2:
        """Convert host weights (canonical Hub names, see `inferno.weights`) to backend arrays, once.

        `weights` is a dict, or (name, array) pairs such as `inferno.weights.iter_weights` yields: each
        is converted as it arrives and let go, so a backend that keeps its own copy (16-bit weights)
        never holds all of the float32 ones at once."""
        pairs = weights.items() if isinstance(weights, Mapping) else weights
        prepared: dict[str, Array] = {}
        for name, host in pairs:
            prepared[name] = cls._prepare(backend, name, host)
            del host
        return cls._from_prepared(config, prepared, backend)

    @staticmethod
    def _prepare(backend: Backend, name: str, host: np.ndarray) -> Array:
        try:
            return backend.prepare_weight(name, host)
        except BackendError:
            raise
        except Exception as exc:  # noqa: BLE001 - a backend's failure, named
            raise BackendError(f"backend {backend.name!r}: prepare_weight({name!r}) raised "
                               f"{_one_line(exc)}") from exc

    @classmethod
    def _from_prepared(cls, config: Gpt2Config, weights: dict[str, Array], backend: Backend) -> Gpt2:
        w = weights.__getitem__  # a missing weight is a KeyError naming it

        names = ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                 "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                 "mlp.c_proj.weight", "mlp.c_proj.bias")  # in Block's field order
        blocks = [Block(*(w(f"h.{i}.{n}") for n in names)) for i in range(config.n_layer)]
        wte = w("wte.weight")
        lm_head = w("lm_head.weight") if "lm_head.weight" in weights else wte
        return cls(config, backend, wte, w("wpe.weight"), blocks, w("ln_f.weight"), w("ln_f.bias"), lm_head)

    def new_cache(self, batch: int = 1, capacity: int | None = None) -> KvCache:
        """An empty KV cache for `batch` sequences of up to `capacity` (default n_positions) tokens."""
        capacity = self.config.n_positions if capacity is None else capacity
        c = self.config
        layers = [self._new_kv(batch, capacity) for _ in range(c.n_layer)]
        return KvCache(layers, capacity)

    def _new_kv(self, batch: int, length: int) -> tuple[Array, Array]:
        """One layer's KV cache from the backend, its shape checked (a cache of the wrong length would
        silently attend to the wrong positions)."""
        c = self.config
        guard = _Guard(self, "new_kv_cache", shapes=True)
        kv = guard._call("new_kv_cache", batch, c.n_head, length, c.head_dim)
        expected = (batch, c.n_head, length, c.head_dim)
        try:
            k, v = kv
        except (TypeError, ValueError):
            raise guard._fail("new_kv_cache", "did not return (k_cache, v_cache)") from None
        for a in (k, v):
            if _shape(a) != expected:
                raise guard._fail("new_kv_cache", f"returned a cache of shape {_shape(a)}, "
                                  f"expected {expected}")
        return k, v

    def new_slots(self, n_slots: int) -> KvSlots:
        """`n_slots` KV cache slots of the full context each (see `KvSlots`)."""
        c = self.config
        layers = [[self._new_kv(1, c.n_positions) for _ in range(n_slots)] for _ in range(c.n_layer)]
        return KvSlots(layers, c.n_positions)

    def forward_ragged(self, rows: Sequence[tuple[Sequence[int], int, int]], slots: KvSlots,
                       logits_for: Sequence[bool] | None = None) -> Array:
        """One forward step over a ragged batch: each row is (new token ids, slot, offset), the offset
        being how many tokens that slot already holds for its sequence. Rows may mix prompt chunks
        (many tokens) and decode steps (one token).

        Returns logits [R, V] of the last token of each row with `logits_for[r]` true (default: every
        row), in row order: the LM head is computed for those rows only.
        """
        be, c = self._kernels("forward_ragged"), self.config
        logits_for = [True] * len(rows) if logits_for is None else list(logits_for)
        ids, positions, packed, start = [], [], [], 0
        for (tokens, slot, offset) in rows:
            n = len(tokens)
            if n == 0 or offset < 0 or offset + n > c.n_positions or not 0 <= slot < slots.n_slots:
                raise ValueError(f"row of {n} tokens at offset {offset} in slot {slot} does not fit "
                                 f"{slots.n_slots} slots of {c.n_positions} positions")
            ids.extend(tokens)
            positions.extend(range(offset, offset + n))
            packed.append(RaggedRow(slot, offset, start, n))
            start += n
        ids_a = np.asarray([ids], dtype=np.int64)
        x = be.embedding(self.wte, self.wpe, be.from_numpy(ids_a), be.from_numpy(np.asarray([positions])))
        for i, blk in enumerate(self.blocks):
            h = be.layernorm(x, blk.ln_1_g, blk.ln_1_b, c.layer_norm_epsilon)
            h = be.ragged_self_attention(h, blk.attn_w, blk.attn_b, blk.attn_proj_w, blk.attn_proj_b,
                                         slots.layers[i], packed, c.n_head)
            x = be.add(x, h)
            if i == c.n_layer - 1:
                # Only the last token of each row that is sampled goes on (see `forward`).
                last = [x[:, r.start + r.length - 1 : r.start + r.length, :]
                        for r, keep in zip(packed, logits_for, strict=True) if keep]
                if not last:
                    return be.from_numpy(np.zeros((0, c.vocab_size), dtype=np.float32))
                x = last[0] if len(last) == 1 else be.concat(last, axis=1)
            h = be.layernorm(x, blk.ln_2_g, blk.ln_2_b, c.layer_norm_epsilon)
            x = be.add(x, be.mlp(h, blk.fc_w, blk.fc_b, blk.proj_w, blk.proj_b))
        x = be.layernorm(x, self.ln_f_g, self.ln_f_b, c.layer_norm_epsilon)
        return be.lm_head(x, self.lm_head_w)[0, :, :]

    def forward(
        self, ids: np.ndarray, cache: KvCache | None = None, *, all_logits: bool = False,
        last: int | None = None,
    ) -> Array:
        """Run `ids` ([B, T] ints, or [T]) through the model, appending them to `cache`.

        Returns logits [B, V] for the last position (what generation needs), [B, last, V] for the last
        `last` positions (what scoring needs), or [B, T, V] when `all_logits`. Without a cache, a
        temporary one of exactly T positions is used.
        """
        be, c = self._kernels("forward"), self.config
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim == 1:
            ids = ids[None, :]
        t = ids.shape[1]
        if last is not None and not 1 <= last <= t:
            raise ValueError(f"logits of the last {last} positions asked of {t} positions")
        keep = t if all_logits else (last or 1)
        if cache is None:
            cache = self.new_cache(ids.shape[0], t)
        offset = cache.length
        if offset + t > min(cache.capacity, c.n_positions):
            raise ValueError(f"{offset + t} positions do not fit a KV cache of {cache.capacity} "
                             f"and a context of {c.n_positions}")

        x = be.embedding(self.wte, self.wpe, be.from_numpy(ids), offset)
        for i, blk in enumerate(self.blocks):
            h = be.layernorm(x, blk.ln_1_g, blk.ln_1_b, c.layer_norm_epsilon)
            h, cache.layers[i] = be.self_attention(
                h, blk.attn_w, blk.attn_b, blk.attn_proj_w, blk.attn_proj_b, cache.layers[i], offset, c.n_head
            )
            x = be.add(x, h)
            if i == c.n_layer - 1 and keep < t:
                # Only the positions whose logits are wanted go on: past the last attention (which
                # filled the cache for every position) the others need neither the MLP nor the LM head.
                x = x[:, t - keep :, :]  # every axis indexed: the Array API requires it
            h = be.layernorm(x, blk.ln_2_g, blk.ln_2_b, c.layer_norm_epsilon)
            x = be.add(x, be.mlp(h, blk.fc_w, blk.fc_b, blk.proj_w, blk.proj_b))
        cache.length = offset + t

        if not all_logits and last is None:
            x = x[:, 0, :]
        x = be.layernorm(x, self.ln_f_g, self.ln_f_b, c.layer_norm_epsilon)
        return be.lm_head(x, self.lm_head_w)

    # ----------------------------------------------------------------------- checking the backend

    def _kernels(self, path: str) -> _Guard:
        """The backend behind its guard (see the module docstring): shapes checked on the first call of
        each forward path, every result checked finite while diagnosing."""
        return _Guard(self, path, shapes=path not in self._shapes_checked, finite=self._diagnosing)

    def check_logits(self, logits: np.ndarray, rows: int = 1) -> np.ndarray:
        """Check logits on the host (after `backend.to_numpy`): shape ``[rows, vocab_size]`` and no NaN
        or Inf. Raises `BackendError` for a wrong shape, `NonFiniteLogitsError` (saying whether the
        weights or the backend produced them) for non-finite values; returns `logits` unchanged.

        Cheap: one np.isfinite over the rows (~10 µs per row of 50257 floats); the diagnosis runs only
        when a check fails.
        """
        shape = _shape(logits)
        if shape != (rows, self.config.vocab_size):
            raise BackendError(f"backend {self.backend.name!r}: lm_head/to_numpy returned logits of shape "
                               f"{shape}, expected ({rows}, {self.config.vocab_size})")
        if not np.isfinite(logits).all():
            raise self._diagnose(logits)
        return logits

    def _named_weights(self) -> Iterator[tuple[str, Array]]:
        names = ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                 "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                 "mlp.c_proj.weight", "mlp.c_proj.bias")  # in Block's field order
        yield "wte.weight", self.wte
        yield "wpe.weight", self.wpe
        for i, blk in enumerate(self.blocks):
            for name, a in zip(names, vars(blk).values(), strict=True):
                yield f"h.{i}.{name}", a
        yield "ln_f.weight", self.ln_f_g
        yield "ln_f.bias", self.ln_f_b
        if self.lm_head_w is not self.wte:
            yield "lm_head.weight", self.lm_head_w

    def _diagnose(self, logits: np.ndarray) -> NonFiniteLogitsError:
        """Why the logits are not finite (the error path only: reads every weight back from the backend
        and runs a one-token forward with every kernel's result checked)."""
        be = self.backend.name
        bad = int(logits.size - np.count_nonzero(np.isfinite(logits)))
        what = f"backend {be!r} returned {bad} non-finite logit{'s' if bad > 1 else ''} (NaN or Inf)"
        largest, where = 0.0, None
        for name, a in self._named_weights():
            try:
                host = np.asarray(self.backend.to_numpy(a), dtype=np.float64)
            except Exception:  # noqa: BLE001 - diagnosing: a weight that cannot be read is skipped
                continue
            if not np.isfinite(host).all():
                return NonFiniteLogitsError(
                    f"{what}: the backend holds non-finite values in weight {name!r} (weights loaded by "
                    "inferno are checked finite, so its prepare_weight made them, or the model was built "
                    "from unchecked weights)", "backend", be, "prepare_weight")
            m = float(np.max(np.abs(host))) if host.size else 0.0
            if m > largest:
                largest, where = m, name
        if largest >= LARGE_WEIGHT:
            return NonFiniteLogitsError(
                f"{what}; the weights are the likely cause: they are finite (checked at load) but hold "
                f"values up to {largest:.3g} (in {where!r}), which overflow float32 arithmetic",
                "weights", be)
        kernel = self._failing_kernel()
        moderate = f"the weights are finite (checked at load) and moderate (largest magnitude {largest:.3g})"
        if kernel is None:
            return NonFiniteLogitsError(f"{what}; {moderate}, so the backend produced them (a one-token "
                                        "check forward was finite: the kernel is not known)", "backend", be)
        return NonFiniteLogitsError(f"{what}; {moderate}, so the backend produced them: its {kernel} "
                                    "returned non-finite values on a one-token check input",
                                    "backend", be, kernel)

    def _failing_kernel(self) -> str | None:
        """The first kernel whose result is not finite in a one-token forward, or None."""
        self._diagnosing = True
        try:
            self.forward(np.zeros((1, 1), dtype=np.int64), self.new_cache(1, 1))
        except _KernelNotFinite as exc:
            return exc.kernel
        except Exception:  # noqa: BLE001 - diagnosing only: the step's own error is the one reported
            return None
        finally:
            self._diagnosing = False
        return None

