"""Loading in pieces (inferno/models/weights.py), with the piece sizes made small so that a small model's
tensors span many of them: the Fortran-order read a few rows at a time (with its helper thread), the count of
non-finite values slice by slice, and the finiteness check's sums, which must not warn when a sum of
finite values overflows or when +Inf meets -Inf."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from inferno.models import safetensors_reader as reader
from inferno.models.weights import WeightsError, load_weights
from inferno.testing import random_state_dict, save_tensors, small_config

F_ORDER = ("c_attn.weight", "c_fc.weight", "wte.weight")


@pytest.fixture(scope="module")
def config():
    return small_config()


@pytest.fixture(scope="module")
def sd(config):
    return random_state_dict(config, seed=5)


def _order(name: str) -> str:
    return "F" if name.endswith(F_ORDER) else "C"


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
@pytest.mark.parametrize("chunk", [64, 2048, 1 << 20])  # many rows a piece, a few, the whole tensor
def test_a_fortran_order_tensor_read_in_pieces_is_the_same_tensor(tmp_path, config, sd, monkeypatch, dtype,
                                                                   chunk):
    path = save_tensors(tmp_path / "model.safetensors", sd, dtype)
    want = load_weights(path, config)
    monkeypatch.setattr(reader, "TRANSPOSE_CHUNK_BYTES", chunk)
    got = load_weights(path, config, _order)
    for name, a in got.items():
        assert a.flags.f_contiguous if _order(name) == "F" else a.flags.c_contiguous, name
        np.testing.assert_array_equal(a, want[name], err_msg=name)
        assert a.dtype == np.float32


@pytest.mark.parametrize("order", [None, _order])
def test_a_nan_in_any_slice_is_counted(tmp_path, config, sd, monkeypatch, order):
    monkeypatch.setattr(reader, "_FINITE_CHUNK", 4)
    monkeypatch.setattr(reader, "TRANSPOSE_CHUNK_BYTES", 64)
    bad = dict(sd)
    w = bad["h.0.mlp.c_fc.weight"].copy()
    w.flat[-1] = np.nan  # far past the first slices
    w.flat[-3] = np.inf
    bad["h.0.mlp.c_fc.weight"] = w
    path = save_tensors(tmp_path / "model.safetensors", bad)
    with pytest.raises(WeightsError, match=r"tensor 'h\.0\.mlp\.c_fc\.weight' holds 2 non-finite values"):
        load_weights(path, config, order)


@pytest.mark.parametrize("order", [None, _order])
def test_sums_that_overflow_or_meet_opposite_infinities_do_not_warn(tmp_path, config, sd, order):
    big = dict(sd)
    w = np.full_like(sd["h.0.mlp.c_fc.weight"], 3e38)  # every value finite, their sum is not
    big["h.0.mlp.c_fc.weight"] = w
    path = save_tensors(tmp_path / "big.safetensors", big)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = load_weights(path, config, order)  # a false alarm of the sums, cleared by the count
    np.testing.assert_array_equal(got["h.0.mlp.c_fc.weight"], w)

    w = sd["h.0.attn.c_attn.weight"].copy()
    w.flat[0], w.flat[1] = np.inf, -np.inf  # inf + -inf is NaN: an "invalid" operation
    path = save_tensors(tmp_path / "inf.safetensors", {**sd, "h.0.attn.c_attn.weight": w})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(WeightsError, match="holds 2 non-finite values"):
            load_weights(path, config, order)


@pytest.mark.parametrize("chunk", [64, 4096])
def test_a_float32_tensor_read_in_pieces_is_the_same_tensor(tmp_path, config, sd, monkeypatch, chunk):
    path = save_tensors(tmp_path / "model.safetensors", sd)
    monkeypatch.setattr(reader, "READ_CHUNK_BYTES", chunk)  # each piece read where the last one ended
    got = load_weights(path, config)
    for name, a in got.items():
        np.testing.assert_array_equal(a, sd[name], err_msg=name)
