"""A backend as the model sees it: every kernel call checked, so that a plugin's failure or garbage is
an error that names the backend and the kernel, never silently passed on.

`CheckedBackend` wraps a backend once, when the model is built. A kernel that raises becomes a
`BackendError`; on a model's first `forward` (and first `forward_ragged`) the shape of everything the
backend returns is checked too, and later calls skip that (the expected shapes are not even computed).
Where the logits come back to the host, `check_logits` checks their shape and that they are finite; a
non-finite row is a `NonFiniteLogitsError` saying whether the weights or the backend produced it,
found by `diagnose` on the error path only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import numpy as np

from inferno.backends.base import Array, Backend
from inferno.errors import BackendError, one_line

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


class _KernelNotFinite(BackendError):
    """Raised while diagnosing non-finite logits: the first kernel whose result held NaN or Inf."""

    def __init__(self, backend: str, kernel: str) -> None:
        super().__init__(f"backend {backend!r}: {kernel} returned non-finite values")
        self.kernel = kernel


class Diagnosable(Protocol):
    """What `diagnose` needs of a model: its weights, and a one-token forward pass."""

    def named_weights(self) -> Iterable[tuple[str, Array]]: ...

    def forward(self, ids: np.ndarray, cache: Any = None) -> Array: ...

    def new_cache(self, batch: int = 1, capacity: int | None = None) -> Any: ...


def _shape(a: Any) -> tuple | None:
    try:
        return tuple(int(d) for d in a.shape)
    except Exception:  # noqa: BLE001 - no shape, or a symbolic one: not an array we can use
        return None


class CheckedBackend:
    """`backend` behind the checks; `n_embd` and `vocab_size` give the shapes its results must have."""

    def __init__(self, backend: Backend, n_embd: int, vocab_size: int) -> None:
        self.backend = backend
        self.name = backend.name
        self.n_embd, self.vocab_size = n_embd, vocab_size
        #: The forward paths ("forward", "forward_ragged") whose kernels' shapes were checked once.
        self.shapes_checked: set[str] = set()
        #: While diagnosing non-finite logits, every kernel's result is also checked finite (costly).
        self.diagnosing = False

    def fail(self, call: str, problem: str) -> BackendError:
        return BackendError(f"backend {self.name!r}: {call} {problem}")

    def call(self, kernel: str, *args: Any) -> Any:
        try:
            return getattr(self.backend, kernel)(*args)
        except BackendError:
            raise
        except Exception as exc:  # noqa: BLE001 - a backend's failure, named; KeyboardInterrupt passes
            raise self.fail(kernel, f"raised {one_line(exc)}") from exc

    def kernels(self, path: str) -> _Guard:
        """The kernels for one forward pass of `path`: shapes checked until that path passed once."""
        return _Guard(self, path, shapes=path not in self.shapes_checked, finite=self.diagnosing)

    def prepare_weight(self, name: str, host: np.ndarray) -> Array:
        try:
            return self.backend.prepare_weight(name, host)
        except BackendError:
            raise
        except Exception as exc:  # noqa: BLE001 - a backend's failure, named
            raise self.fail(f"prepare_weight({name!r})", f"raised {one_line(exc)}") from exc

    def new_kv_cache(self, batch: int, n_head: int, length: int, head_dim: int) -> tuple[Array, Array]:
        """One layer's KV cache, its shape checked (a cache of the wrong length would silently attend to
        the wrong positions)."""
        kv = self.call("new_kv_cache", batch, n_head, length, head_dim)
        expected = (batch, n_head, length, head_dim)
        try:
            k, v = kv
        except (TypeError, ValueError):
            raise self.fail("new_kv_cache", "did not return (k_cache, v_cache)") from None
        for a in (k, v):
            if _shape(a) != expected:
                raise self.fail("new_kv_cache", f"returned a cache of shape {_shape(a)}, expected {expected}")
        return k, v

    def check_logits(self, logits: np.ndarray, rows: int, model: Diagnosable) -> np.ndarray:
        """Check host logits: shape ``[rows, vocab_size]`` and no NaN or Inf (one np.isfinite over the
        rows). Raises `BackendError` for a wrong shape, `NonFiniteLogitsError` (from `diagnose`) for
        non-finite values; returns `logits` unchanged."""
        shape = _shape(logits)
        if shape != (rows, self.vocab_size):
            raise BackendError(f"backend {self.name!r}: lm_head/to_numpy returned logits of shape "
                               f"{shape}, expected ({rows}, {self.vocab_size})")
        if not np.isfinite(logits).all():
            raise self.diagnose(logits, model)
        return logits

    def diagnose(self, logits: np.ndarray, model: Diagnosable) -> NonFiniteLogitsError:
        """Why the logits are not finite (the error path only: reads every weight back from the backend
        and runs a one-token forward with every kernel's result checked)."""
        be = self.name
        bad = int(logits.size - np.count_nonzero(np.isfinite(logits)))
        what = f"backend {be!r} returned {bad} non-finite logit{'s' if bad > 1 else ''} (NaN or Inf)"
        largest, where = 0.0, None
        for name, a in model.named_weights():
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
        kernel = self._failing_kernel(model)
        moderate = f"the weights are finite (checked at load) and moderate (largest magnitude {largest:.3g})"
        if kernel is None:
            return NonFiniteLogitsError(f"{what}; {moderate}, so the backend produced them (a one-token "
                                        "check forward was finite: the kernel is not known)", "backend", be)
        return NonFiniteLogitsError(f"{what}; {moderate}, so the backend produced them: its {kernel} "
                                    "returned non-finite values on a one-token check input",
                                    "backend", be, kernel)

    def _failing_kernel(self, model: Diagnosable) -> str | None:
        """The first kernel whose result is not finite in a one-token forward, or None."""
        self.diagnosing = True
        try:
            model.forward(np.zeros((1, 1), dtype=np.int64), model.new_cache(1, 1))
        except _KernelNotFinite as exc:
            return exc.kernel
        except Exception:  # noqa: BLE001 - diagnosing only: the step's own error is the one reported
            return None
        finally:
            self.diagnosing = False
        return None


class _Guard:
    """The kernels of one forward pass: each call names the backend and the kernel when it raises; with
    `shapes`, every result's shape is checked too; with `finite`, every result is also copied to the
    host and checked finite."""

    def __init__(self, owner: CheckedBackend, path: str, shapes: bool, finite: bool) -> None:
        self.owner, self.be, self.path = owner, owner.backend, path
        self.shapes = shapes or finite
        self.finite = finite
        self._call, self._fail = owner.call, owner.fail

    def _expect(self, kernel: str, out: Any, shape: tuple) -> Any:
        if self.shapes:
            got = _shape(out)
            if got != tuple(shape):
                raise self._fail(kernel, f"returned an array of shape {got}, expected {tuple(shape)}")
            if self.finite:
                host = np.asarray(self.be.to_numpy(out))
                if not np.isfinite(host).all():
                    raise _KernelNotFinite(self.owner.name, kernel)
        return out

    # The calls `Gpt2.forward` and `forward_ragged` make, in their order.
    def from_numpy(self, a: np.ndarray) -> Array:
        return self._expect("from_numpy", self._call("from_numpy", a), a.shape)

    def embedding(self, wte, wpe, ids, offset):
        out = self._call("embedding", wte, wpe, ids, offset)
        if not self.shapes:
            return out
        return self._expect("embedding", out, (*(_shape(ids) or ()), self.owner.n_embd))

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

    def self_attention_weights(self, x, w_attn, b_attn, w_proj, b_proj, kv, offset, n_head):
        """Inspection's attention (`inferno.inspect`). The weights are checked on every call, not only
        the first: they are host arrays that are shown as they are, so a wrong shape, a non-finite value
        or a row that does not sum to 1 must be an error here rather than a wrong picture."""
        result = self._call("self_attention_weights", x, w_attn, b_attn, w_proj, b_proj, kv, offset, n_head)
        try:
            out, new_kv, weights = result
        except (TypeError, ValueError):
            raise self._fail("self_attention_weights",
                             "did not return (output, (k_cache, v_cache), weights)") from None
        if self.shapes:
            self.self_attention_result("self_attention_weights", x, kv, (out, new_kv))
        b, t = (_shape(x) or (0, 0))[:2]
        self._check_weights("self_attention_weights", weights, (b, n_head, t, offset + t))
        return out, new_kv, weights

    def attention_weights(self, q, k_cache, offset):
        """Inspection's attention weights of one attention (the Llama family's, a group at a time),
        checked on every call as `self_attention_weights`' are."""
        weights = self._call("attention_weights", q, k_cache, offset)
        b, h, t = (_shape(q) or (0, 0, 0))[:3]
        self._check_weights("attention_weights", weights, (b, h, t, offset + t))
        return weights

    def _check_weights(self, kernel: str, weights: Any, expected: tuple) -> None:
        if not isinstance(weights, np.ndarray) or weights.shape != expected:
            what = f"shape {weights.shape}" if isinstance(weights, np.ndarray) else type(weights).__name__
            raise self._fail(kernel, f"returned attention weights of {what}, expected a NumPy array of shape "
                             f"{expected}")
        if not np.isfinite(weights).all() or np.abs(weights.sum(axis=-1, dtype=np.float64) - 1).max() > 1e-3:
            raise self._fail(kernel, "returned attention weights that are not finite or whose rows do not "
                             "sum to 1")

    def self_attention_result(self, kernel, x, kv_before, result) -> None:
        """The checks of a (output, (k_cache, v_cache)) pair against the input x and the caches before."""
        before = [_shape(a) for a in kv_before]
        try:
            out, (k, v) = result
        except (TypeError, ValueError):
            raise self._fail(kernel, "did not return (output, (k_cache, v_cache))") from None
        if [_shape(k), _shape(v)] != before:
            raise self._fail(kernel, f"returned KV caches of shapes {_shape(k)} and {_shape(v)}, expected "
                             f"{before[0]}")
        self._expect(kernel, out, _shape(x) or ())

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

    # The calls `Llama.forward` and `forward_ragged` make besides those above.
    def embed_tokens(self, wte, ids):
        out = self._call("embed_tokens", wte, ids)
        if not self.shapes:
            return out
        return self._expect("embed_tokens", out, (*(_shape(ids) or ()), self.owner.n_embd))

    def linear(self, x, w, b):
        out = self._call("linear", x, w, b)
        if self.shapes:
            self._expect_product("linear", x, w, out)
        return out

    def _expect_product(self, kernel: str, x: Any, w: Any, out: Any) -> None:
        w_shape = _shape(w)  # [in, out]; a packed weight may have no usable shape: then only the rank
        lead = (_shape(x) or ())[:-1]
        if w_shape is not None and len(w_shape) == 2:
            self._expect(kernel, out, (*lead, w_shape[1]))
        elif (got := _shape(out)) is None or got[:-1] != lead:
            raise self._fail(kernel, f"returned an array of shape {got}, expected {(*lead, '...')}")

    def linears(self, x, weights, biases):
        outs = self._call("linears", x, weights, biases)
        if not self.shapes:
            return outs
        if not isinstance(outs, list | tuple) or len(outs) != len(weights):
            raise self._fail("linears", f"returned a {type(outs).__name__}, expected a list of "
                             f"{len(weights)} arrays")
        for w, out in zip(weights, outs, strict=True):
            self._expect_product("linears", x, w, out)
        return list(outs)

    def heads(self, x, n_head):
        out = self._call("heads", x, n_head)
        if self.shapes:
            b, t, c = _shape(x) or (0, 0, 0)
            self._expect("heads", out, (b, n_head, t, c // n_head))
        return out

    def merge_heads(self, y):
        out = self._call("merge_heads", y)
        if self.shapes:
            b, h, t, d = _shape(y) or (0, 0, 0, 0)
            self._expect("merge_heads", out, (b, t, h * d))
        return out

    def rms_norm(self, x, gamma, eps):
        out = self._call("rms_norm", x, gamma, eps)
        return self._expect("rms_norm", out, _shape(x) or ()) if self.shapes else out

    def rotary(self, x, cos, sin):
        out = self._call("rotary", x, cos, sin)
        return self._expect("rotary", out, _shape(x) or ()) if self.shapes else out

    def write_kv(self, k_cache, v_cache, k, v, offset):
        result = self._call("write_kv", k_cache, v_cache, k, v, offset)
        if self.shapes:
            before = [_shape(k_cache), _shape(v_cache)]
            try:
                new_k, new_v = result
            except (TypeError, ValueError):
                raise self._fail("write_kv", "did not return (k_cache, v_cache)") from None
            if [_shape(new_k), _shape(new_v)] != before:
                raise self._fail("write_kv", f"returned KV caches of shapes {_shape(new_k)} and "
                                 f"{_shape(new_v)}, expected {before[0]}")
        return result

    def gqa_attention(self, q, k_cache, v_cache, offset):
        out = self._call("gqa_attention", q, k_cache, v_cache, offset)
        return self._expect("gqa_attention", out, _shape(q) or ()) if self.shapes else out

    def ragged_gqa_attention(self, q, k, v, slot_kv, rows):
        before = [_shape(a) for kv in slot_kv for a in kv] if self.shapes else None
        out = self._call("ragged_gqa_attention", q, k, v, slot_kv, rows)
        if not self.shapes:
            return out
        if [_shape(a) for kv in slot_kv for a in kv] != before:
            raise self._fail("ragged_gqa_attention", "changed the shape of a KV slot")
        return self._expect("ragged_gqa_attention", out, _shape(q) or ())

    def gated_mlp(self, x, w_gate, w_up, w_down):
        out = self._call("gated_mlp", x, w_gate, w_up, w_down)
        return self._expect("gated_mlp", out, _shape(x) or ()) if self.shapes else out

    def lm_head(self, x, wte):
        out = self._call("lm_head", x, wte)
        if self.shapes:
            self._expect("lm_head", out, (*(_shape(x) or ())[:-1], self.owner.vocab_size))
            self.owner.shapes_checked.add(self.path)  # the last kernel of a forward: all were right
        return out
