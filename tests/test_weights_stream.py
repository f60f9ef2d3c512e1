"""`iter_weights`: the weights one tensor at a time, so that a backend converting them (16-bit weights)
never holds every float32 array at once; and `inferno.load` reading through it."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import inferno
from inferno.backends.numpy_backend import NumpyBackend
from inferno.models.weights import WeightsError, iter_weights, load_weights
from inferno.testing import random_state_dict, save_pretrained_layout, save_tensors, small_config


@pytest.fixture(scope="module")
def config():
    return small_config()


@pytest.fixture(scope="module")
def sd(config):
    return random_state_dict(config, seed=3)


def test_same_tensors_as_load_weights_largest_first(tmp_path, config, sd):
    path = save_tensors(tmp_path / "model.safetensors", sd)
    pairs = list(iter_weights(path, config))
    want = load_weights(path, config)
    assert sorted(name for name, _ in pairs) == sorted(want)
    # The largest first (wte at GPT-2's shapes), so that a converting consumer peaks early and once.
    assert pairs[0][1].size == max(a.size for _, a in pairs)
    for name, a in pairs:
        np.testing.assert_array_equal(a, want[name])
    orders = dict(iter_weights(path, config, lambda n: "F" if n.endswith("c_fc.weight") else "C"))
    assert orders["h.0.mlp.c_fc.weight"].flags.f_contiguous


@pytest.mark.parametrize("differs", [False, True])
def test_lm_head_only_when_it_differs_from_wte(tmp_path, config, sd, differs):
    head = sd["wte.weight"] + (np.float32(1e-3) if differs else np.float32(0))
    path = save_tensors(tmp_path / "model.safetensors", save_pretrained_layout(sd, lm_head=head))
    names = [name for name, _ in iter_weights(path, config)]
    assert ("lm_head.weight" in names) == differs
    if differs:
        assert names[-1] == "lm_head.weight"
        np.testing.assert_array_equal(dict(iter_weights(path, config))["lm_head.weight"], head)


def test_a_non_finite_tensor_raises_naming_it(tmp_path, config, sd):
    bad = dict(sd)
    bad["h.1.mlp.c_proj.bias"] = bad["h.1.mlp.c_proj.bias"].copy()
    bad["h.1.mlp.c_proj.bias"][3] = np.nan
    path = save_tensors(tmp_path / "model.safetensors", bad)
    with pytest.raises(WeightsError, match=r"tensor 'h\.1\.mlp\.c_proj\.bias' holds 1 non-finite value "
                                           r"\(NaN or Inf\) of"):
        list(iter_weights(path, config))


def test_header_problems_raise_before_any_tensor(tmp_path, config, sd):
    partial = {k: v for k, v in sd.items() if k != "ln_f.bias"}
    path = save_tensors(tmp_path / "model.safetensors", partial)
    stream = iter_weights(path, config)
    with pytest.raises(WeightsError, match="missing tensors"):
        next(stream)


class CopyingBackend(NumpyBackend):
    """Keeps its own copy of every weight (as a 16-bit backend does), and counts the host arrays still
    alive each time it is handed one."""

    name = "copying-test"

    def __init__(self) -> None:
        super().__init__()
        self.hosts: list[weakref.ref] = []
        self.most_alive = 0

    def prepare_weight(self, name, a):
        gc.collect()
        self.most_alive = max(self.most_alive, sum(r() is not None for r in self.hosts))
        self.hosts.append(weakref.ref(a))
        return np.array(a, dtype=np.float32, copy=True)


@pytest.mark.slow
def test_inferno_load_hands_the_backend_one_host_tensor_at_a_time(model_dir):
    be = CopyingBackend()
    pipe = inferno.load(model_dir, be, download=False)
    assert len(be.hosts) >= 2 + 12 * pipe.model.config.n_layer
    # The array being converted and at most the one before it (still referenced by the generator's
    # frame until the next read): never the whole float32 state dict.
    assert be.most_alive <= 1
