"""The conformance suite over every backend, and the suite itself: it must catch broken backends and name
the kernel, and ``pytest --pyargs inferno.conformance --backend NAME`` must work from anywhere."""

from __future__ import annotations

import importlib.metadata
import math
import os
import subprocess
import sys
from pathlib import Path

import array_api_strict
import numpy as np
import pytest
from backend_helpers import conformance_failures

from inferno.backends.array_api import ArrayApiBackend
from inferno.backends.numpy_backend import NumpyBackend
from inferno.conformance import (
    ConformanceError,
    all_checks,
    check_backend,
    parametrize_with_checks,
    tolerance_for,
)
from inferno.conformance import reference as ref

PLUGINS = Path(__file__).parent / "plugins"


@pytest.mark.parametrize("check", all_checks(), ids=str)
def test_conformance(backend, check):
    check(backend)


# What a third party writes to run the suite inside its own tests.
@parametrize_with_checks([NumpyBackend("float64"), ArrayApiBackend(xp=array_api_strict)], kinds=["model"])
def test_parametrize_with_checks(backend, check):
    check(backend)


# ----------------------------------------------------------------------- deliberately broken backends


class WrongEpsLayernorm(NumpyBackend):
    def layernorm(self, x, gamma, beta, eps):
        return super().layernorm(x, gamma, beta, 1e-12)


class OnePassLayernorm(NumpyBackend):
    def layernorm(self, x, gamma, beta, eps):
        mean = x.mean(axis=-1, keepdims=True)
        var = (x * x).mean(axis=-1, keepdims=True) - mean * mean
        return (x - mean) / np.sqrt(np.maximum(var, 0) + eps) * gamma + beta


class NoCausalMask(NumpyBackend):
    def attention(self, q, k_cache, v_cache, offset):
        s = offset + q.shape[2]
        scores = q @ k_cache[:, :, :s].swapaxes(-1, -2) / math.sqrt(q.shape[3])
        return self.softmax(scores) @ v_cache[:, :, :s]


class SoftmaxWithoutMax(NumpyBackend):
    def softmax(self, x):
        with np.errstate(over="ignore", invalid="ignore"):
            e = np.exp(x)
            return e / e.sum(axis=-1, keepdims=True)


class SplitHeadsWrongOrder(NumpyBackend):
    def split_heads(self, qkv, n_head):
        b, t, c3 = qkv.shape
        q, k, v = qkv.reshape(b, t, n_head, 3, c3 // (3 * n_head)).transpose(3, 0, 2, 1, 4)
        return q, k, v


class AttentionReadsPastTheCache(NumpyBackend):
    def attention(self, q, k_cache, v_cache, offset):
        return super().attention(q, k_cache, v_cache, k_cache.shape[2] - q.shape[2])


class QuickGelu(NumpyBackend):
    def gelu_new(self, x):
        with np.errstate(over="ignore"):
            return x / (1 + np.exp(-1.702 * x))  # the sigmoid approximation, not GPT-2's tanh one


class WriteKvIgnoresOffset(NumpyBackend):
    def write_kv(self, k_cache, v_cache, k, v, offset):
        return super().write_kv(k_cache, v_cache, k, v, 0)


class EmbeddingWithoutOffset(NumpyBackend):
    def embedding(self, wte, wpe, ids, offset):
        return super().embedding(wte, wpe, ids, 0)


class FusedMlpWithoutBias(NumpyBackend):
    def mlp(self, x, w_fc, b_fc, w_proj, b_proj):
        return self.linear(self.gelu_new(self.linear(x, w_fc, b_fc)), w_proj, None)


# attention and everything built on it (the inspection checks too: their caches are written by write_kv)
ATTN = {"attention", "self_attention", "kv_cache", "model", "attention_weights", "self_attention_weights",
        "gqa_attention"}  # the numpy backend's gqa_attention is its attention when there are as many kv heads
BROKEN = [
    # backend, the check that must fail, kernels allowed to fail with it (those built on the broken one)
    (WrongEpsLayernorm, "layernorm-small-variance", {"layernorm", "model"}),
    (OnePassLayernorm, "layernorm-large-mean", {"layernorm", "model"}),
    (NoCausalMask, "attention-gpt2-prefill", ATTN),
    (SoftmaxWithoutMax, "softmax-large-magnitude", {"softmax", *ATTN}),
    (SplitHeadsWrongOrder, "split_heads-gpt2",
     {"split_heads", "self_attention", "self_attention_weights", "model"}),
    (AttentionReadsPastTheCache, "attention-gpt2-decode", ATTN),
    (QuickGelu, "gelu_new-gpt2-4C", {"gelu_new", "mlp", "model"}),
    (WriteKvIgnoresOffset, "write_kv-gpt2-offset", {"write_kv", *ATTN}),
    (EmbeddingWithoutOffset, "embedding-offset", {"embedding", "model"}),
    (FusedMlpWithoutBias, "mlp-gpt2", {"mlp", "model"}),
]


@pytest.mark.parametrize("cls, must_fail, allowed", BROKEN, ids=[b[0].__name__ for b in BROKEN])
def test_broken_backend_fails_naming_the_kernel(cls, must_fail, allowed):
    # Every kernel check (the unrelated ones must pass), and the larger checks built on the broken kernel.
    failures, checks = conformance_failures(cls, allowed)
    assert must_fail in failures, f"{cls.__name__} passed {must_fail}"
    exc = failures[must_fail]
    kernel, case = must_fail.split("-", 1)
    assert (exc.kernel, exc.case) == (kernel, case)
    assert str(exc).startswith(f"{kernel} [{case}: "), str(exc)
    assert {e.kernel for e in failures.values()} <= allowed, sorted(failures)


def test_failure_messages_say_what_is_wrong():
    check = {c.id: c for c in all_checks()}
    with pytest.raises(ConformanceError, match=r"^softmax \[large-magnitude: .*\]: output has \d+ non-fin"):
        check["softmax-large-magnitude"](SoftmaxWithoutMax())
    with pytest.raises(ConformanceError, match=r"^split_heads \[gpt2: .*\]: q differs from the float64 ref"):
        check["split_heads-gpt2"](SplitHeadsWrongOrder())

    class Crashes(NumpyBackend):
        def lm_head(self, x, wte):
            raise NotImplementedError("no lm_head yet")

    with pytest.raises(ConformanceError, match=r"^lm_head \[2d-input: .*\]: raised NotImplementedError"):
        check["lm_head-2d-input"](Crashes())
    with pytest.raises(AssertionError, match=r"(?s)conformance checks failed.*\nlm_head \[gpt2-width"):
        check_backend(Crashes(), all_checks(kernels=["lm_head", "add"]))


def test_tolerances_follow_the_dtype():
    assert tolerance_for(np.float64).rtol < tolerance_for(np.float32).rtol < tolerance_for("float16").rtol
    assert tolerance_for("bfloat16").rtol >= tolerance_for("float16").rtol
    assert tolerance_for(np.dtype("float32")) == tolerance_for("float32")
    assert tolerance_for(type("TorchLike", (), {"name": None, "__str__": lambda s: "torch.float16"})()) == \
        tolerance_for("float16")
    assert tolerance_for("float8_e4m3") == tolerance_for("bfloat16")  # unknown: the loosest


def test_reference_against_the_definitions():
    # The reference's attention, spelled out query by query.
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 2, 3, 4, 5))
    offset, (kc, vc) = 2, (rng.standard_normal((2, 3, 8, 5)) for _ in range(2))
    kc[:, :, :6], vc[:, :, :6] = rng.standard_normal((2, 2, 3, 6, 5))
    got = ref.attention(q, kc, vc, offset)
    for i in range(4):
        s = kc[:, :, : offset + i + 1] @ q[:, :, i, :, None] / math.sqrt(5)
        w = np.exp(s - s.max(axis=2, keepdims=True))
        want = (w / w.sum(axis=2, keepdims=True) * vc[:, :, : offset + i + 1]).sum(axis=2)
        np.testing.assert_allclose(got[:, :, i], want, rtol=1e-12)
    qkv = np.arange(2 * 3 * 3 * 4 * 5.0).reshape(2, 3, 60)
    q, k, v = ref.split_heads(qkv, 4)
    assert q[1, 2, 0].tolist() == qkv[1, 0, 10:15].tolist()
    assert v[0, 3, 2].tolist() == qkv[0, 2, 55:60].tolist()
    np.testing.assert_array_equal(ref.merge_heads(k), qkv[..., 20:40])


# ----------------------------------------------------------------------------- the Array API backend


def test_array_api_backend_on_strict_devices():
    # array_api_strict refuses to mix arrays of different devices: temporaries must follow their inputs.
    dev = array_api_strict.Device("device1")
    be = ArrayApiBackend(xp=array_api_strict, device=dev)
    for check in all_checks(kernels=["attention", "write_kv", "embedding", "self_attention"]):
        check(be)
    assert be.from_numpy(np.zeros(3)).device == dev


def test_array_api_backend_write_kv_without_item_assignment():
    be = ArrayApiBackend()
    k_cache, v_cache = be.new_kv_cache(1, 2, 5, 3)
    k_cache.flags.writeable = v_cache.flags.writeable = False  # as immutable as a JAX array
    k = be.from_numpy(np.ones((1, 2, 2, 3)))
    k2, v2 = be.write_kv(k_cache, v_cache, k, 2 * k, 1)
    assert k2 is not k_cache and be._immutable
    np.testing.assert_array_equal(be.to_numpy(k2)[0, 0, :, 0], [0, 1, 1, 0, 0])
    np.testing.assert_array_equal(be.to_numpy(v2)[0, 1, :, 2], [0, 2, 2, 0, 0])


def test_array_api_backend_options():
    assert ArrayApiBackend().xp.__name__ == "array_api_compat.numpy"
    assert ArrayApiBackend(xp="numpy").xp.__name__ == "array_api_compat.numpy"  # wrapped
    assert ArrayApiBackend(xp=array_api_strict, dtype="float64").dtype == np.float64
    with pytest.raises(ValueError, match="real floating"):
        ArrayApiBackend(dtype="int32")
    with pytest.raises(ValueError, match="no dtype 'float8'"):
        ArrayApiBackend(dtype="float8")
    be = ArrayApiBackend(xp=array_api_strict)
    ids = be.to_numpy(be.from_numpy(np.array([[1, 2]], dtype=np.int32)))
    assert ids.dtype.kind == "i" and ids.tolist() == [[1, 2]]


# ------------------------------------------------------------------------------- the pytest plugin


def _pytest(args: list[str], cwd: Path, plugins: list[str] = ()) -> subprocess.CompletedProcess:
    """Run pytest in a fresh process from `cwd` (outside the repository), as a third party would."""
    entry = any(ep.value == "inferno.conformance.plugin"
                for ep in importlib.metadata.entry_points(group="pytest11"))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*(str(PLUGINS / p) for p in plugins), env.get("PYTHONPATH", "")])
    env.pop("INFERNO_BACKEND", None)
    env.pop("PYTEST_ADDOPTS", None)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")  # small matrices, shared cores: threads only add overhead
    env["COLUMNS"] = "200"
    # Until the pytest11 entry point is installed, load the plugin by name (the documented fallback).
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
    if not entry:
        cmd += ["-p", "inferno.conformance.plugin"]
    return subprocess.run([*cmd, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # runs a pytest of its own
def test_suite_runs_from_anywhere(tmp_path):
    proc = _pytest(["--pyargs", "inferno.conformance", "--backend", "numpy"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "inferno conformance: backend 'numpy' (built-in " in proc.stdout
    assert "dtype float32; tolerance rtol=0.0001" in proc.stdout
    assert f" {len(all_checks())} passed" in proc.stdout


@pytest.mark.slow  # runs a pytest of its own
def test_suite_fails_a_broken_plugin_backend_naming_the_kernel(tmp_path):
    args = ["--pyargs", "inferno.conformance", "--backend", "broken-layernorm", "-k", "layernorm or add"]
    proc = _pytest(args, tmp_path, plugins=["broken_layernorm"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "backend 'broken-layernorm' (distribution inferno-fake-broken-layernorm 0.5.0)" in proc.stdout
    assert "FAILED test_kernels.py::test_kernel[layernorm-small-variance]" in proc.stdout
    assert "\nlayernorm [small-variance: x [2, 3, 768] ~ N(0, 0.003²), eps 1e-5" in proc.stdout
    assert "passed" in proc.stdout  # add, and the layer-norm cases where eps does not matter

    # Known failures listed in a file turn the run green (and only they are marked).
    (tmp_path / "xfails.txt").write_text("# eps is ignored\nlayernorm-small-variance\nlayernorm-eps-1e-3\n")
    proc = _pytest([*args, "--conformance-xfails", "xfails.txt"], tmp_path, plugins=["broken_layernorm"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 xfailed" in proc.stdout and "xfails from xfails.txt: 2 entries" in proc.stdout


@pytest.mark.slow  # runs a pytest of its own
def test_suite_reports_an_unknown_backend(tmp_path):
    proc = _pytest(["--pyargs", "inferno.conformance", "--backend", "nump"], tmp_path)
    assert proc.returncode == 4
    assert "cannot use backend 'nump': unknown backend 'nump'. Did you mean 'numpy'?" in proc.stderr


@pytest.mark.slow  # runs a pytest of its own
def test_plugin_is_inert_in_other_runs(tmp_path):
    # A project with its own --backend option and fixture: the plugin must neither clash nor interfere.
    (tmp_path / "conftest.py").write_text(
        "import pytest\n"
        "def pytest_addoption(parser):\n"
        "    parser.addoption('--backend', default='theirs')\n"
        "@pytest.fixture\n"
        "def backend(request):\n"
        "    return request.config.getoption('--backend')\n"
    )
    (tmp_path / "test_theirs.py").write_text("def test_it(backend):\n    assert backend == 'mine'\n")
    proc = _pytest(["--backend", "mine"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "inferno conformance" not in proc.stdout

    # Running the suite from there: --backend is theirs, so ours is spelled --inferno-backend.
    args = ["--pyargs", "inferno.conformance", "--inferno-backend", "array-api", "-k", "add"]
    proc = _pytest(args, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "inferno conformance: backend 'array-api'" in proc.stdout and "1 passed" in proc.stdout


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 8, 9, 16, 17, 130])
@pytest.mark.parametrize("order", ["C", "F"])
def test_numpy_matmul_rows_gives_each_row_its_own_product(rows, order):
    # GEMV for one or two rows, zero rows padded up to a multiple of 8 below 128: the same products.
    from inferno.backends.numpy_backend import _matmul_rows

    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 48)).astype(np.float32)
    w = np.asarray(rng.standard_normal((48, 40)).astype(np.float32), order=order)
    y = _matmul_rows(x, w)
    assert y.shape == (rows, 40) and y.flags.c_contiguous
    np.testing.assert_allclose(y, x.astype(np.float64) @ w.astype(np.float64), rtol=1e-5, atol=1e-5)
