"""Issue #17, backends and plugins: wrong shapes and non-finite values from kernels (item 2), --threads
bounds (6), plugins that raise SystemExit on import (10), backend exceptions at the boundary (11), one
quiet line per broken plugin (12), cpu-threaded from several threads (17)."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import numpy as np
import pytest
import threadpoolctl
from goldens import golden_model
from test_faults_common import (
    assert_one_line_error,
    cli_env,
    fake_distribution,
    run_cli,
    with_path,
)

import inferno
from inferno.backends import registry
from inferno.backends.numpy_backend import NumpyBackend
from inferno.backends.registry import BackendError, BackendOptionError, get_backend
from inferno.backends.threaded import ThreadedBackend
from inferno.cpu import MAX_THREADS
from inferno.models.gpt2 import Gpt2, NonFiniteLogitsError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def weights():
    config, sd, _ = golden_model("greedy")
    return config, sd


# The fake plugin distribution: one module, several broken backends (items 2 and 11).
FAULTS = """
    import numpy as np
    from inferno.backends import hookimpl
    from inferno.backends.numpy_backend import NumpyBackend

    class NanLayernorm(NumpyBackend):
        name = "fake-nan-layernorm"
        description = "layernorm returns NaN"
        def layernorm(self, x, gamma, beta, eps):
            return np.full_like(x, np.nan)

    class NoDriver(NumpyBackend):
        name = "fake-no-driver"
        description = "the constructor fails"
        def __init__(self):
            raise RuntimeError("CUDA driver not found")

    class PrepareOom(NumpyBackend):
        name = "fake-prepare-oom"
        description = "prepare_weight runs out of memory"
        def prepare_weight(self, name, a):
            raise MemoryError()

    class FlatLogits(NumpyBackend):
        name = "fake-flat-logits"
        description = "lm_head returns 1-D logits"
        def lm_head(self, x, wte):
            return super().lm_head(x, wte).reshape(-1)

    class BadOrder(NumpyBackend):
        name = "fake-bad-order"
        description = "weight_order answers 'X'"
        def weight_order(self, name):
            return "X"

    class AttentionFails(NumpyBackend):
        name = "fake-attention-fails"
        description = "attention raises"
        def attention(self, q, k_cache, v_cache, offset):
            raise RuntimeError("kernel launch failed")

    @hookimpl
    def register_backends(register):
        for cls in (NanLayernorm, NoDriver, PrepareOom, FlatLogits, BadOrder, AttentionFails):
            register(cls)
"""


@pytest.fixture(scope="module")
def plugins(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fault-plugins")
    fake_distribution(root, "inferno-fake-faults", "inferno_fake_faults", FAULTS,
                      {"fake-faults": "inferno_fake_faults"})
    fake_distribution(root, "inferno-fake-exits", "inferno_fake_exits", "raise SystemExit(3)\n",
                      {"fake-exits": "inferno_fake_exits"}, version="0.1")
    fake_distribution(root, "inferno-fake-base", "inferno_fake_base",
                      "class Odd(BaseException):\n    pass\n\nraise Odd('not an Exception')\n",
                      {"fake-base": "inferno_fake_base"}, version="0.2")
    return root


# ------------------------------------------------------------------- item 2: wrong shapes, NaN


class NanLayernorm(NumpyBackend):
    name = "test-nan-layernorm"

    def layernorm(self, x, gamma, beta, eps):
        return np.full_like(x, np.nan)


class ShortLmHead(NumpyBackend):
    name = "test-short-lm-head"

    def lm_head(self, x, wte):
        return super().lm_head(x, wte)[..., :-1]


class BroadcastMlp(NumpyBackend):
    name = "test-broadcast-mlp"

    def mlp(self, x, w_fc, b_fc, w_proj, b_proj):
        return super().mlp(x, w_fc, b_fc, w_proj, b_proj)[:, :1, :]  # [B, 1, C]: x + it broadcasts


class OnePositionCache(NumpyBackend):
    name = "test-one-position-cache"

    def new_kv_cache(self, batch, n_head, length, head_dim):
        return super().new_kv_cache(batch, n_head, 1, head_dim)


@pytest.mark.parametrize(("cls", "error", "needles"), [
    (NanLayernorm, NonFiniteLogitsError, ("backend 'test-nan-layernorm'", "non-finite logits",
                                          "so the backend produced them", "its layernorm returned")),
    (ShortLmHead, BackendError, ("backend 'test-short-lm-head'", "lm_head returned an array of shape "
                                 "(1, 50256), expected (1, 50257)")),
    (BroadcastMlp, BackendError, ("backend 'test-broadcast-mlp'",
                                  "mlp returned an array of shape (1, 1, 32), expected (1, 3, 32)")),
    (OnePositionCache, BackendError, ("backend 'test-one-position-cache'",
                                      "new_kv_cache returned a cache of shape (1, 4, 1, 8)")),
], ids=lambda v: v.__name__ if isinstance(v, type) else "")
def test_backend_returning_garbage_is_an_error_naming_it_and_the_kernel(weights, cls, error, needles):
    config, sd = weights
    model = Gpt2.from_weights(config, sd, cls())
    from inferno.generate import generate_tokens

    with pytest.raises(error) as info:
        list(generate_tokens(model, [464, 2068, 7586], 4))
    for needle in needles:
        assert needle in str(info.value)
    if error is NonFiniteLogitsError:
        assert (info.value.cause, info.value.kernel) == ("backend", "layernorm")


def test_ragged_forward_checks_shapes_on_its_first_call(weights):
    config, sd = weights
    model = Gpt2.from_weights(config, sd, BroadcastMlp())
    slots = model.new_slots(2)
    # The first layer's MLP sees all 4 tokens of the two rows.
    with pytest.raises(BackendError, match=r"mlp returned an array of shape \(1, 1, 32\), expected \(1, 4"):
        model.forward_ragged([([1, 2, 3], 0, 0), ([4], 1, 0)], slots)
    good = Gpt2.from_weights(config, sd, NumpyBackend())
    assert good.backend.to_numpy(good.forward_ragged([([1, 2], 0, 0)], good.new_slots(1))).shape == (1, 50257)
    assert good.kernels.shapes_checked == {"forward_ragged"}  # later calls skip the shape checks


def test_broken_plugin_kernel_from_the_cli(model_dir, plugins, tmp_path):
    env = with_path(cli_env(tmp_path), plugins)
    proc = run_cli(["Hi", "--model-dir", str(model_dir), "--backend", "fake-nan-layernorm",
                    "--max-new-tokens", "3"], env)
    assert_one_line_error(proc, "backend 'fake-nan-layernorm'", "non-finite logits", "its layernorm returned")


# ------------------------------------------------------------------- item 6: thread bounds


@pytest.mark.parametrize(("flags", "extra_env", "needle"), [
    (["--backend", "cpu-threaded", "--threads", "100000"], {}, "threads must be at most 1024"),
    (["--backend", "cpu-threaded"], {"INFERNO_THREADS": "100000"}, "$INFERNO_THREADS must be at most 1024"),
])
def test_thread_count_is_bounded(model_dir, tmp_path, flags, extra_env, needle):
    proc = run_cli(["Hi", "--model-dir", str(model_dir), *flags], cli_env(tmp_path, **extra_env))
    assert_one_line_error(proc, needle)
    assert MAX_THREADS == 1024
    with pytest.raises(BackendOptionError, match="at most 1024"):
        get_backend("cpu-threaded", threads=MAX_THREADS + 1)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_torch_thread_count_is_bounded(model_dir, tmp_path):
    # The plugin as pip installs it: its entry point's metadata, its package from plugins/inferno-gpt2-torch.
    meta = fake_distribution(tmp_path / "meta", "inferno-gpt2-torch", "unused_module", "",
                             {"torch": "inferno_torch.backend"})
    env = with_path(cli_env(tmp_path), meta, ROOT / "plugins" / "inferno-gpt2-torch")
    args = ["Hi", "--model-dir", str(model_dir), "--backend", "torch:device=cpu", "--threads", "100000"]
    proc = run_cli(args, env, timeout=120)  # used to segfault (exit 139, no message)
    assert_one_line_error(proc, "--threads", "threads=100000 must be at most 1024")


# ------------------------------------------------------------------- items 10 and 12: broken plugins


def test_plugin_raising_system_exit_is_isolated_and_quiet(model_dir, plugins, tmp_path):
    env = with_path(cli_env(tmp_path), plugins)
    proc = run_cli(["backends"], env)
    assert proc.returncode == 0, proc.stderr
    assert "fake-exits" in proc.stdout and "SystemExit: 3" in proc.stdout
    assert "fake-base" in proc.stdout and "Odd: not an Exception" in proc.stdout
    assert "fake-nan-layernorm" in proc.stdout
    # One line per broken plugin, no Python source line (item 12).
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2, proc.stderr
    assert sum("inferno-fake-exits 0.1" in line for line in lines) == 1
    assert sum("inferno-fake-base 0.2" in line for line in lines) == 1
    assert all("BackendPluginWarning" in line for line in lines)

    # Another backend: nothing about the broken plugins at all.
    proc = run_cli(["Hi", "--model-dir", str(model_dir), "--max-new-tokens", "2"], env)
    assert proc.returncode == 0, proc.stderr
    assert "plugin" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1  # the stats line

    # Asking for the broken one: one line, exit 2.
    proc = run_cli(["Hi", "--model-dir", str(model_dir), "--backend", "fake-exits"], env)
    assert_one_line_error(proc, "backend 'fake-exits' (from inferno-fake-exits 0.1) is unavailable",
                          "SystemExit: 3")

    # -W still escalates (Python's own -W takes a built-in category: BackendPluginWarning is a UserWarning).
    proc = run_cli(["backends"], env, python_flags=("-W", "error::UserWarning"))
    assert proc.returncode != 0 and "BackendPluginWarning" in proc.stderr


def test_in_process_registry_isolates_base_exceptions(monkeypatch):
    class FakeEntryPoint:
        def __init__(self, name, exc):
            self.name, self.value, self._exc = name, f"fake_{name}", exc
            self.dist = type("Dist", (), {"name": f"inferno-{name}", "version": "1.0"})()

        def load(self):
            raise self._exc

    real = registry._entry_points()
    monkeypatch.setattr(registry, "_entry_points", lambda: [*real, FakeEntryPoint("exits", SystemExit(2)),
                                                            FakeEntryPoint("gen", GeneratorExit())])
    registry._reset()
    try:
        assert get_backend("numpy").name == "numpy"  # no warning, no exit
        with pytest.warns(registry.BackendPluginWarning) as record:
            infos = {i.name: i for i in registry.list_backends()}
        assert len(record) == 2
        assert infos["exits"].status == "failed to import 'fake_exits': SystemExit: 2"
        ctrl_c = FakeEntryPoint("ctrl-c", KeyboardInterrupt())
        monkeypatch.setattr(registry, "_entry_points", lambda: [ctrl_c])
        registry._reset()
        with pytest.raises(KeyboardInterrupt):
            registry.list_backends()
    finally:
        registry._reset()


# ------------------------------------------------------------------- item 11: exceptions, named


@pytest.mark.parametrize(("backend", "needles"), [
    ("fake-no-driver", ("backend 'fake-no-driver' (from inferno-fake-faults 1.0) failed to start",
                        "its constructor raised RuntimeError: CUDA driver not found")),
    ("fake-prepare-oom", ("backend 'fake-prepare-oom'",
                          "prepare_weight('wte.weight') raised MemoryError")),
    ("fake-flat-logits", ("backend 'fake-flat-logits'", "lm_head returned an array of shape (50257,), "
                          "expected (1, 50257)")),
    ("fake-bad-order", ("memory order must be 'C' or 'F', got 'X'",
                        "backend 'fake-bad-order': weight_order")),
    ("fake-attention-fails", ("backend 'fake-attention-fails'",
                              "self_attention raised RuntimeError: kernel launch failed")),
])
def test_backend_exceptions_name_the_backend_and_the_call(model_dir, plugins, tmp_path, backend, needles):
    env = with_path(cli_env(tmp_path), plugins)
    proc = run_cli(["Hi", "--model-dir", str(model_dir), "--backend", backend, "--max-new-tokens", "2"], env)
    assert_one_line_error(proc, *needles)


def test_backend_argument_of_the_wrong_type(model_dir):
    with pytest.raises(TypeError, match="backend must be a name such as 'numpy'.*not int"):
        inferno.load(model_dir, 123)
    with pytest.raises(TypeError, match="model must be a name or a folder"):
        inferno.load(123, "numpy")


# ------------------------------------------------------------------- item 17: several threads


def blas_threads() -> int:
    return max(i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas")


def test_cpu_threaded_from_four_threads_restores_blas_threads(weights):
    config, sd = weights
    before = blas_threads()
    if before < 2:
        pytest.skip("BLAS runs one thread here: nothing to restore")
    # Forced onto the pool everywhere, so every kernel limits BLAS to one thread while it runs.
    be = ThreadedBackend(threads=2, min_rows=1, min_macs=1, min_elements=1)
    model = Gpt2.from_weights(config, sd, be)
    reference = Gpt2.from_weights(config, sd, NumpyBackend())
    ids = np.arange(1, 100)[None]
    expected = reference.backend.to_numpy(reference.forward(ids))
    start = threading.Barrier(4)
    errors, results = [], []

    def work():
        try:
            start.wait(timeout=60)
            for _ in range(30):
                results.append(be.to_numpy(model.forward(ids)))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    # The main thread is one of the four (OpenBLAS honours its limit over the other threads').
    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    work()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "hung"
    assert not errors, errors
    assert len(results) == 120
    for r in results:
        np.testing.assert_allclose(r, expected, rtol=1e-4, atol=1e-4)
    assert blas_threads() == before  # used to be left at 1
    be.close()
