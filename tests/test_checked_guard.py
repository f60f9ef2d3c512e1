"""The checks `CheckedBackend` puts around every kernel (inferno/backends/checked.py), through a small
random model whose backend returns one malformed result at a time: a kernel that raises, a result of
the wrong shape (each kernel of `forward`, `forward_ragged` and inspection), attention that does not
return ``(output, (k_cache, v_cache))``, KV caches or slots that change shape, a new cache of the wrong
shape, attention weights that are not a distribution. Each message compared whole; and the shape
checks run on a path's first pass only, the finite checks while diagnosing."""

from __future__ import annotations

import numpy as np
import pytest

from inferno.backends.checked import CheckedBackend, NonFiniteLogitsError
from inferno.backends.numpy_backend import NumpyBackend
from inferno.errors import BackendError
from inferno.inspect import inspect_ids
from inferno.models.gpt2 import Gpt2
from inferno.testing import random_state_dict, small_config

CONFIG = small_config()  # n_embd 16, 2 heads of 8, 2 layers, vocab 64, 16 positions
SD = random_state_dict(CONFIG, seed=3)
IDS = [[1, 2, 3]]


def broken(**faults) -> Gpt2:
    """A model whose backend's kernels pass their result through `faults[kernel](result, *args)`; set
    after the weights are prepared (prepare_weight calls from_numpy itself)."""
    model = Gpt2.from_weights(CONFIG, SD, NumpyBackend())
    be = model.backend
    for kernel, fault in faults.items():
        real = getattr(be, kernel)
        setattr(be, kernel, lambda *args, real=real, fault=fault, **kw: fault(real(*args, **kw), *args, **kw))
    return model


def forward_error(model: Gpt2, cls: type[Exception] = BackendError) -> str:
    with pytest.raises(cls) as info:
        model.forward(np.asarray(IDS))
    assert type(info.value) is cls
    return str(info.value)


def wrong(kernel: str, got: tuple, expected: tuple) -> str:
    return f"backend 'numpy': {kernel} returned an array of shape {got}, expected {expected}"


@pytest.mark.parametrize(("kernel", "fault", "got", "expected"), [
    ("from_numpy", lambda out, a: out[:, :1], (1, 1), (1, 3)),
    ("embedding", lambda out, *a: out[..., :-1], (1, 3, 15), (1, 3, 16)),
    ("layernorm", lambda out, *a: out[:, :2], (1, 2, 16), (1, 3, 16)),
    ("add", lambda out, *a: out[:, :, :4], (1, 3, 4), (1, 3, 16)),
    ("mlp", lambda out, *a: out[:, :1], (1, 1, 16), (1, 3, 16)),
    ("lm_head", lambda out, *a: out[..., :-1], (1, 63), (1, 64)),
], ids=lambda v: v if isinstance(v, str) else "")
def test_a_result_of_the_wrong_shape_names_the_kernel_and_both_shapes(kernel, fault, got, expected):
    assert forward_error(broken(**{kernel: fault})) == wrong(kernel, got, expected)


def test_a_result_without_a_shape_is_shape_none():
    assert forward_error(broken(mlp=lambda out, *a: out.tolist())) == wrong("mlp", None, (1, 3, 16))


def test_a_kernel_that_raises_is_named_with_its_exception_on_one_line():
    def boom(out, *args):
        raise RuntimeError("device lost\nat launch")

    assert forward_error(broken(layernorm=boom)) == (
        "backend 'numpy': layernorm raised RuntimeError: device lost at launch")


def test_a_backend_error_from_a_kernel_is_passed_on_as_it_is():
    error = BackendError("the plugin's own words")

    def fail(out, *args):
        raise error

    with pytest.raises(BackendError) as info:
        broken(add=fail).forward(np.asarray(IDS))
    assert info.value is error


class _PrepareFails(NumpyBackend):
    def __init__(self, exc: Exception) -> None:
        super().__init__()
        self.exc = exc

    def prepare_weight(self, name, host):
        raise self.exc


def test_prepare_weight_failing_is_named_with_the_weight():
    with pytest.raises(BackendError) as info:
        Gpt2.from_weights(CONFIG, SD, _PrepareFails(MemoryError("out of\ndevice memory")))
    assert str(info.value) == (
        "backend 'numpy': prepare_weight('wte.weight') raised MemoryError: out of device memory")
    error = BackendError("its own words")
    with pytest.raises(BackendError) as info:
        Gpt2.from_weights(CONFIG, SD, _PrepareFails(error))
    assert info.value is error


# ------------------------------------------------------------------- attention and its caches

NOT_A_PAIR = "backend 'numpy': {} did not return (output, (k_cache, v_cache))"


@pytest.mark.parametrize("fault", [
    lambda out, *a: None,  # not iterable: TypeError
    lambda out, *a: out[0],  # the output alone: one row of [1, 3, 16] to unpack, ValueError
    lambda out, *a: (out[0], out[1][0]),  # the caches not a pair
], ids=["none", "output-alone", "one-cache"])
def test_attention_that_does_not_return_output_and_caches(fault):
    assert forward_error(broken(self_attention=fault)) == NOT_A_PAIR.format("self_attention")


def test_attention_that_changes_a_cache_shape_names_both_caches():
    def short_values(out, *args):
        y, (k, v) = out
        return y, (k, v[:, :, :1])

    assert forward_error(broken(self_attention=short_values)) == (
        "backend 'numpy': self_attention returned KV caches of shapes (1, 2, 3, 8) and (1, 2, 1, 8), "
        "expected (1, 2, 3, 8)")

    def short_keys(out, *args):
        y, (k, v) = out
        return y, (k[:, :1], v)

    assert forward_error(broken(self_attention=short_keys)) == (
        "backend 'numpy': self_attention returned KV caches of shapes (1, 1, 3, 8) and (1, 2, 3, 8), "
        "expected (1, 2, 3, 8)")


def test_attention_output_of_the_wrong_shape():
    def narrow(out, *args):
        y, kv = out
        return y[..., :8], kv

    assert forward_error(broken(self_attention=narrow)) == wrong("self_attention", (1, 3, 8), (1, 3, 16))


@pytest.mark.parametrize(("fault", "message"), [
    (lambda out, *a: None, "did not return (k_cache, v_cache)"),
    (lambda out, *a: (*out, out[0]), "did not return (k_cache, v_cache)"),
    (lambda out, *a: (out[0], out[1][:, :, :2]),
     "returned a cache of shape (1, 2, 2, 8), expected (1, 2, 3, 8)"),
    (lambda out, *a: (out[0][:1, :1], out[1]),
     "returned a cache of shape (1, 1, 3, 8), expected (1, 2, 3, 8)"),
], ids=["none", "three", "short-values", "one-head-keys"])
def test_a_new_kv_cache_of_the_wrong_form_or_shape(fault, message):
    assert forward_error(broken(new_kv_cache=fault)) == f"backend 'numpy': new_kv_cache {message}"


# ------------------------------------------------------------------- the ragged path


def ragged_error(model: Gpt2, rows=(([1, 2, 3], 0, 0), ([4], 1, 0))) -> str:
    with pytest.raises(BackendError) as info:
        model.forward_ragged(list(rows), model.new_slots(2))
    return str(info.value)


def test_ragged_attention_that_replaces_a_slot_with_another_shape():
    def shrink(out, x, w_attn, b_attn, w_proj, b_proj, slot_kv, rows, n_head):
        k, v = slot_kv[1]
        slot_kv[1] = (k, v[:, :, :4])
        return out

    assert ragged_error(broken(ragged_self_attention=shrink)) == (
        "backend 'numpy': ragged_self_attention changed the shape of a KV slot")


def test_ragged_attention_output_of_the_wrong_shape():
    model = broken(ragged_self_attention=lambda out, *a: out[:, :3])
    assert ragged_error(model) == wrong("ragged_self_attention", (1, 3, 16), (1, 4, 16))


def test_ragged_embedding_is_checked_against_the_packed_ids():
    model = broken(embedding=lambda out, *a: out[:, :2])
    assert ragged_error(model) == wrong("embedding", (1, 2, 16), (1, 4, 16))


def test_concat_of_the_kept_rows_is_checked():
    # Attention concatenates along axis 2 inside the backend (unchecked); the kept rows along axis 1.
    model = broken(concat=lambda out, arrays, axis: out[:, :1] if axis == 1 else out)
    assert ragged_error(model) == wrong("concat", (1, 1, 16), (1, 2, 16))
    three = broken(concat=lambda out, arrays, axis: out[..., :5] if axis == 1 else out)
    with pytest.raises(BackendError) as info:
        three.forward_ragged([([1], 0, 0), ([2, 3], 1, 0), ([4], 2, 0)], three.new_slots(3))
    assert str(info.value) == wrong("concat", (1, 3, 5), (1, 3, 16))


# ------------------------------------------------------------------- when the checks run


def test_the_shape_checks_run_on_a_paths_first_pass_only():
    model = broken()
    be = model.backend
    model.forward(np.asarray(IDS))
    assert model.kernels.shapes_checked == {"forward"}
    be.mlp = lambda *args: NumpyBackend.mlp(be, *args)[:, :1]  # broadcasts in the residual add
    out = be.to_numpy(model.forward(np.asarray(IDS)))  # not checked again: the cost is not paid twice
    assert out.shape == (1, 64)
    assert ragged_error(model) == wrong("mlp", (1, 1, 16), (1, 4, 16))  # the ragged path's first pass


def test_a_failed_first_pass_is_checked_again():
    model = broken(mlp=lambda out, *a: out[:, :1])
    for _ in range(2):
        assert forward_error(model) == wrong("mlp", (1, 1, 16), (1, 3, 16))
    assert model.kernels.shapes_checked == set()


def test_diagnosing_checks_every_result_finite_after_the_shapes_were_checked():
    model = broken()
    be = model.backend
    logits = be.to_numpy(model.forward(np.asarray(IDS)))
    assert model.kernels.shapes_checked == {"forward"}
    be.mlp = lambda *args: np.full_like(NumpyBackend.mlp(be, *args), np.nan)
    with pytest.raises(NonFiniteLogitsError) as info:
        model.check_logits(be.to_numpy(model.forward(np.asarray(IDS))))
    assert (info.value.cause, info.value.backend, info.value.kernel) == ("backend", "numpy", "mlp")
    assert str(info.value).endswith("so the backend produced them: its mlp returned non-finite values on "
                                    "a one-token check input")
    assert model.kernels.diagnosing is False
    assert model.check_logits(logits) is logits


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_a_guard_checks_nothing_finite_unless_diagnosing():
    model = broken(mlp=lambda out, *a: np.full_like(out, np.inf))
    logits = model.backend.to_numpy(model.forward(np.asarray(IDS)))  # shapes right: no error here
    assert not np.isfinite(logits).all()
    guard = CheckedBackend(model.backend, 16, 64).kernels("forward")
    assert (guard.shapes, guard.finite) == (True, False)


# ------------------------------------------------------------------- inspection's attention weights


def inspect_error(**faults) -> str:
    with pytest.raises(BackendError) as info:
        inspect_ids(broken(**faults), IDS[0])
    return str(info.value)


def test_inspection_attention_weights_malformed():
    name = "self_attention_weights"
    assert inspect_error(self_attention_weights=lambda out, *a: out[:2]) == (
        f"backend 'numpy': {name} did not return (output, (k_cache, v_cache), weights)")
    assert inspect_error(self_attention_weights=lambda out, *a: None) == (
        f"backend 'numpy': {name} did not return (output, (k_cache, v_cache), weights)")
    assert inspect_error(self_attention_weights=lambda out, *a: (out[0], out[1][0], out[2])) == (
        NOT_A_PAIR.format(name))
    assert inspect_error(self_attention_weights=lambda out, *a: (out[0][:, :2], out[1], out[2])) == (
        wrong(name, (1, 2, 16), (1, 3, 16)))
    assert inspect_error(self_attention_weights=lambda out, *a: (out[0], (out[1][0], out[1][1][:1, :1]),
                                                                 out[2])) == (
        f"backend 'numpy': {name} returned KV caches of shapes (1, 2, 3, 8) and (1, 1, 3, 8), expected "
        "(1, 2, 3, 8)")
    assert inspect_error(self_attention_weights=lambda out, *a: (*out[:2], out[2].tolist())) == (
        f"backend 'numpy': {name} returned attention weights of list, expected a NumPy array of shape "
        "(1, 2, 3, 3)")
    assert inspect_error(self_attention_weights=lambda out, *a: (*out[:2], out[2][..., :2])) == (
        f"backend 'numpy': {name} returned attention weights of shape (1, 2, 3, 2), expected a NumPy "
        "array of shape (1, 2, 3, 3)")


@pytest.mark.parametrize("factor", [1.002, 0.998, np.nan])
def test_inspection_attention_weights_that_are_not_a_distribution(factor):
    def scale(out, *args):
        w = out[2].copy()
        w[0, 1, 2] *= factor  # one row of one head
        return out[0], out[1], w

    assert inspect_error(self_attention_weights=scale) == (
        "backend 'numpy': self_attention_weights returned attention weights that are not finite or whose "
        "rows do not sum to 1")


def test_inspection_attention_weights_within_rounding_pass():
    def nudge(out, *args):
        w = out[2].copy()
        w[0, 1, 2] *= 1.0005
        return out[0], out[1], w

    got = inspect_ids(broken(self_attention_weights=nudge), IDS[0])
    assert got.attention.shape == (2, 2, 3, 3)


def test_the_ragged_path_passes_every_argument_and_result_through_on_every_pass():
    model = broken()
    be = model.backend
    rows = [[1, 2, 3], [4, 5]]
    expected = np.stack([be.to_numpy(model.forward(np.asarray([r])))[0] for r in rows])
    for _ in range(2):  # checked, then not
        got = be.to_numpy(model.forward_ragged([(rows[0], 0, 0), (rows[1], 1, 0)], model.new_slots(2)))
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert model.kernels.shapes_checked == {"forward", "forward_ragged"}


def test_inspection_through_the_guard_passes_every_argument_through():
    model = broken()
    logits = model.backend.to_numpy(model.forward(np.asarray(IDS), all_logits=True))[0].astype(np.float64)
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    got = inspect_ids(model, IDS[0], top=3)
    for position, lens in enumerate(got.logit_lens[-1]):  # the model's output: the forward's own logits
        top = np.argsort(-probs[position], kind="stable")[:3]
        assert [i for i, _ in lens] == top.tolist()
        np.testing.assert_allclose([p for _, p in lens], probs[position, top], rtol=1e-4)
