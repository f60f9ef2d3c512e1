"""The cpu-threaded backend: same results as numpy (kernels, conformance checks, greedy ids), the worker
pool's size, and its lifecycle (close, garbage collection, exit, exceptions, Ctrl-C, a dead worker, fork),
each lifecycle case in a subprocess where it matters."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import sigint_as_in_a_terminal

from inferno.backends import registry
from inferno.backends.numpy_backend import NumpyBackend
from inferno.backends.threaded import ThreadedBackend, WorkerError, WorkerPool
from inferno.conformance.checks import all_checks
from inferno.generate import generate_tokens
from inferno.models.gpt2 import Gpt2
from inferno.models.resolve import shipped_gpt2_file
from inferno.testing import random_state_dict, small_config

TESTS = Path(__file__).resolve().parent
THREAD_PREFIX = "inferno-cpu-threaded"
# Every kernel through the pool, even at the conformance suite's small shapes.
FORCED = {"min_rows": 1, "min_macs": 1, "min_elements": 1, "fused_mlp_rows": 1}

def helper_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]


@pytest.fixture(scope="module")
def forced():
    with ThreadedBackend(threads=3, **FORCED) as be:
        yield be


def assert_pool_runs_every_task(pool: WorkerPool) -> None:
    done = []
    pool.run(done.append, 10)
    assert sorted(done) == list(range(10))


def run_script(body: str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    code = f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          **kwargs)


# -------------------------------------------------------------------------------------- pool size


def test_pool_has_threads_minus_one_helpers():
    before = helper_threads()
    be = ThreadedBackend(threads=3)
    assert be.threads == 3
    assert len(helper_threads()) == len(before) + 2  # the caller is the third worker
    be.close()
    assert helper_threads() == before


# ----------------------------------------------------------------------------------------- results


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("check", all_checks(), ids=str)
def test_conformance_with_every_kernel_pooled(check, threads):
    with ThreadedBackend(threads=threads, **FORCED) as be:
        check(be)


@pytest.mark.parametrize("check", all_checks(["composition", "cache", "model"]), ids=str)
def test_conformance_default_thresholds(check):
    with ThreadedBackend(threads=2) as be:
        check(be)


@pytest.mark.parametrize("t, offset, batch", [(1, 0, 1), (1, 70, 2), (5, 3, 2), (64, 0, 1), (100, 37, 1),
                                              (130, 0, 3), (200, 0, 1)])
def test_attention_matches_numpy(forced, t, offset, batch):
    """Query tiles, the diagonal mask, skipped key blocks and head groups against the numpy kernel."""
    rng = np.random.default_rng(t + offset)
    h, d, length = 5, 16, offset + t + 3
    q = rng.standard_normal((batch, h, t, d), dtype=np.float32)
    k = rng.standard_normal((batch, h, length, d), dtype=np.float32)
    v = rng.standard_normal((batch, h, length, d), dtype=np.float32)
    want = NumpyBackend().attention(q, k, v, offset)
    np.testing.assert_allclose(forced.attention(q, k, v, offset), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows, n_in, n_out", [(1, 64, 1000), (7, 30, 50), (600, 48, 160), (300, 16, 3)])
def test_linear_blocks_match_numpy(forced, rows, n_in, n_out):
    """Row tiles (more rows than one tile holds) and weight-column blocks, with and without bias."""
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((1, rows, n_in), dtype=np.float32)
    w = rng.standard_normal((n_in, n_out), dtype=np.float32)
    b = rng.standard_normal(n_out, dtype=np.float32)
    for bias in (b, None):
        np.testing.assert_allclose(forced.linear(x, w, bias), NumpyBackend().linear(x, w, bias),
                                   rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(forced.lm_head(x[0], w.T), NumpyBackend().lm_head(x[0], w.T), rtol=1e-5,
                               atol=1e-4)


@pytest.mark.parametrize("fused_mlp_rows", [1, 40, 10_000])  # row tiles always, from 120 rows, never
@pytest.mark.parametrize("t", [1, 17, 150, 300])
def test_compositions_match_numpy(t, fused_mlp_rows):
    rng = np.random.default_rng(t)
    c, h = 48, 4
    x = rng.standard_normal((2, t, c), dtype=np.float32)
    w = {n: rng.standard_normal(s, dtype=np.float32) * s[0] ** -0.5
         for n, s in [("fc", (c, 4 * c)), ("pr", (4 * c, c)), ("at", (c, 3 * c)), ("ap", (c, c))]}
    b = {n: rng.standard_normal(w[n].shape[1], dtype=np.float32) for n in w}
    nb = NumpyBackend()
    with ThreadedBackend(threads=3, **{**FORCED, "fused_mlp_rows": fused_mlp_rows}) as forced:
        np.testing.assert_allclose(forced.mlp(x, w["fc"], b["fc"], w["pr"], b["pr"]),
                                   nb.mlp(x, w["fc"], b["fc"], w["pr"], b["pr"]), rtol=1e-5, atol=1e-5)
        kv_n, kv_t = nb.new_kv_cache(2, h, t + 2, c // h), forced.new_kv_cache(2, h, t + 2, c // h)
        y_n, kv_n = nb.self_attention(x, w["at"], b["at"], w["ap"], b["ap"], kv_n, 0, h)
        y_t, kv_t = forced.self_attention(x, w["at"], b["at"], w["ap"], b["ap"], kv_t, 0, h)
        np.testing.assert_allclose(y_t, y_n, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(kv_t[0], kv_n[0], rtol=1e-6, atol=1e-6)


def test_fused_mlp_rows_option():
    with ThreadedBackend(threads=2, fused_mlp_rows=7) as be:
        assert be.fused_mlp_rows == 7
    with pytest.raises(ValueError, match="fused_mlp_rows must be a positive integer, got 0"):
        ThreadedBackend(threads=2, fused_mlp_rows=0)


def greedy(model: Gpt2, prompt: list[int], n: int) -> list[int]:
    return list(generate_tokens(model, prompt, n, stop_ids=()))


@pytest.mark.parametrize("spec", [dict(threads=2), dict(threads=3, **FORCED), dict(threads=1)],
                         ids=["2", "3-forced", "1"])
@pytest.mark.parametrize("seed, n_embd, n_head, prompt_len", [(0, 32, 2, 5), (1, 48, 3, 40), (2, 64, 4, 90)])
def test_greedy_ids_equal_numpy(spec, seed, n_embd, n_head, prompt_len):
    config = small_config(vocab_size=97, n_positions=128, n_embd=n_embd, n_layer=2, n_head=n_head)
    sd = random_state_dict(config, seed)
    prompt = np.random.default_rng(seed).integers(0, 96, prompt_len).tolist()
    want = greedy(Gpt2.from_weights(config, sd, NumpyBackend()), prompt, 12)
    with ThreadedBackend(**spec) as be:
        model = Gpt2.from_weights(config, sd, be)
        assert greedy(model, prompt, 12) == want
        # Logits of every position at once, too (the LM head over many rows goes through the pool).
        full_t = model.forward(np.asarray([prompt]), all_logits=True)
    full_n = Gpt2.from_weights(config, sd, NumpyBackend()).forward(np.asarray([prompt]), all_logits=True)
    np.testing.assert_allclose(full_t, full_n, rtol=1e-4, atol=1e-4 * np.abs(full_n).max())


@pytest.mark.heavy
def test_greedy_ids_equal_numpy_at_124m_shape():
    from inferno.bench import GPT2_124M, prompt_ids, random_weights

    weights = random_weights(GPT2_124M, seed=1)
    with ThreadedBackend() as be:
        for n_prompt in (64, 600):
            prompt = prompt_ids(n_prompt, GPT2_124M.vocab_size, seed=n_prompt)
            want = greedy(Gpt2.from_weights(GPT2_124M, weights, NumpyBackend()), prompt, 8)
            assert greedy(Gpt2.from_weights(GPT2_124M, weights, be), prompt, 8) == want


# ---------------------------------------------------------------------------------------- registry


def test_registered_by_name_with_options():
    info = registry.get_backend_info("cpu-threaded")
    assert info.ok, info.status
    be = registry.get_backend("cpu-threaded:threads=2")
    try:
        assert isinstance(be, ThreadedBackend) and be.threads == 2
        assert "cpu-threaded" in [i.name for i in registry.list_backends() if i.ok]
    finally:
        be.close()


def test_unavailable_without_threadpoolctl(monkeypatch):
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)
    assert "threadpoolctl" in ThreadedBackend.unavailable_reason()


# --------------------------------------------------------------------------------------- the pool


def test_pool_runs_every_task_once():
    pool = WorkerPool(3)
    try:
        for n in (0, 1, 2, 7, 100):
            seen: list[int] = []
            lock = threading.Lock()

            def task(i, seen=seen, lock=lock):
                with lock:
                    seen.append(i)

            pool.run(task, n)
            assert sorted(seen) == list(range(n))
    finally:
        pool.close()


def test_exception_in_a_helper_reaches_the_caller_and_the_pool_survives():
    pool = WorkerPool(2)
    main = threading.current_thread()

    def task(i):
        if threading.current_thread() is not main:
            raise ArithmeticError(f"task {i} failed in a helper")
        time.sleep(0.01)  # leave tasks for the helper

    try:
        with pytest.raises(ArithmeticError, match="failed in a helper"):
            pool.run(task, 20)
        assert_pool_runs_every_task(pool)
    finally:
        pool.close()
    assert not any(t.is_alive() for t in pool._helpers)


def test_backend_error_propagates_and_backend_keeps_working(forced):
    x = np.ones((1, 20, 8), np.float32)
    with pytest.raises(ValueError):
        forced.linear(x, np.ones((9, 4), np.float32), None)  # shapes do not match
    np.testing.assert_allclose(forced.linear(x, np.ones((8, 4), np.float32), None), np.full((1, 20, 4), 8.0))


def test_keyboard_interrupt_in_the_caller_leaves_the_pool_usable():
    pool = WorkerPool(2)
    main = threading.current_thread()

    def task(i):
        if threading.current_thread() is main and i > 2:
            raise KeyboardInterrupt
        time.sleep(0.005)

    try:
        with pytest.raises(KeyboardInterrupt):
            pool.run(task, 50)
        assert_pool_runs_every_task(pool)
    finally:
        pool.close()


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="needs the main thread")
def test_ctrl_c_while_the_caller_waits_leaves_every_helper_free():
    """Ctrl-C lands while the caller waits for a helper's task: the helper finishes it, then takes part
    in the next call (nothing the caller held is left held), and close() stops it at once."""
    pool = WorkerPool(2)
    main = threading.current_thread()
    started, release = threading.Event(), threading.Event()

    def task(i):
        if threading.current_thread() is main:
            started.wait(10)  # the helper has task 1 before the caller claims past the end
        else:
            started.set()
            release.wait(10)

    def ctrl_c():
        started.wait(10)
        time.sleep(0.2)  # the caller is waiting for the helper by now
        import _thread
        _thread.interrupt_main()

    handler = signal.signal(signal.SIGINT, signal.default_int_handler)  # even when run with SIGINT ignored
    try:
        threading.Thread(target=ctrl_c).start()
        with pytest.raises(KeyboardInterrupt):
            pool.run(task, 2)
        release.set()
        barrier = threading.Barrier(2, timeout=10)  # both threads must take a task
        pool.run(lambda i: barrier.wait(), 2)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            pool.close()
    finally:
        signal.signal(signal.SIGINT, handler)
        release.set()
        pool.close()
    assert not any(t.is_alive() for t in pool._helpers)


def test_a_call_returns_only_after_every_helper_left_it():
    """A helper that comes late (busy with something else when the call began) finds no task left and
    reports at once: the caller must still wait for the one that is in a task."""
    pool = WorkerPool(3)
    gate, started, release = threading.Event(), threading.Event(), threading.Event()
    main, finished = threading.current_thread(), []

    class Busy:  # what keeps the second helper from the call until the gate opens
        def work(self):
            gate.wait(10)

    def task(i):
        if threading.current_thread() is main:
            started.wait(10)  # a helper has its task first
        elif not started.is_set():
            started.set()
            release.wait(10)
        finished.append(i)

    def later():
        started.wait(10)
        time.sleep(0.2)
        gate.set()  # the late helper reports while the first is still in its task
        time.sleep(0.3)
        release.set()

    pool._queues[1].put(Busy())
    threading.Thread(target=later).start()
    try:
        pool.run(task, 3)
        assert sorted(finished) == [0, 1, 2]
    finally:
        gate.set()
        release.set()
        pool.close()


def test_close_names_a_helper_that_did_not_stop():
    pool = WorkerPool(2)
    main = threading.current_thread()
    started, release = threading.Event(), threading.Event()

    def task(i):
        if threading.current_thread() is main:
            started.wait(10)
            raise ValueError("the caller leaves while the helper is still in its task")
        started.set()
        release.wait(10)

    try:
        with pytest.raises(ValueError):
            pool.run(task, 2)
        with pytest.warns(RuntimeWarning, match=r"^cpu-threaded: worker thread inferno-cpu-threaded-1 did "
                                                r"not stop within 0\.1 s$"):
            pool.close(timeout=0.1)
    finally:
        release.set()
    pool._helpers[0].join(10)
    assert not pool._helpers[0].is_alive()


def test_close_joins_threads_and_is_idempotent():
    before = helper_threads()
    be = ThreadedBackend(threads=4, **FORCED)
    be.close()
    be.close()
    assert helper_threads() == before
    with pytest.raises(WorkerError, match="closed"):
        be.mlp(*(np.ones(s, np.float32) for s in [(1, 64, 8), (8, 32), (32,), (32, 8), (8,)]))


def test_garbage_collected_backend_stops_its_threads():
    # This backend's own threads, by identity: another test's backend may be collected meanwhile.
    gc.collect()
    before = set(threading.enumerate())
    be = ThreadedBackend(threads=3, **FORCED)
    be.linear(np.ones((1, 40, 8), np.float32), np.ones((8, 512), np.float32), None)
    mine = [t for t in threading.enumerate() if t not in before and t.name.startswith(THREAD_PREFIX)]
    assert mine
    del be
    gc.collect()
    for t in mine:
        t.join(10)
    assert not [t.name for t in mine if t.is_alive()]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_dead_worker_is_a_clear_error_not_a_hang():
    before = helper_threads()
    be = ThreadedBackend(threads=3, **FORCED)

    class Poison:  # what a helper loop sees when something kills it outside any task
        def work(self):
            raise SystemExit

    be._pool._queues[0].put(Poison())
    be._pool._helpers[0].join(10)
    x, w = np.ones((1, 40, 8), np.float32), np.ones((8, 512), np.float32)
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"worker thread inferno-cpu-threaded-1 died"):
        be.linear(x, w, None)
    assert time.monotonic() - start < 5
    be.close()
    assert helper_threads() == before


def test_no_threads_left_at_exit_without_close():
    """A script that never calls close(): at exit the finalizer stops the helpers, and the process ends."""
    proc = run_script("""
        import atexit, threading
        # Registered first, so it runs last: after the backend's own exit handler.
        atexit.register(lambda: print("left:", [t.name for t in threading.enumerate()
                                                 if t.name.startswith("inferno")], flush=True))
        import numpy as np
        from inferno.backends.threaded import ThreadedBackend
        be = ThreadedBackend(threads=3, min_rows=1, min_macs=1)
        be.linear(np.ones((1, 40, 8), np.float32), np.ones((8, 512), np.float32), None)
        print("threads:", sum(t.name.startswith("inferno") for t in threading.enumerate()), flush=True)
    """, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "threads: 2" in proc.stdout
    assert "left: []" in proc.stdout


def test_uncaught_exception_exits_promptly():
    proc = run_script("""
        import numpy as np
        from inferno.backends.threaded import ThreadedBackend
        be = ThreadedBackend(threads=3, min_rows=1, min_macs=1)
        be.linear(np.ones((1, 40, 8), np.float32), np.ones((9, 8), np.float32), None)
    """, timeout=30)
    assert proc.returncode == 1
    assert "ValueError" in proc.stderr


def _interrupt(code: str, wait_for_output: bool = False) -> tuple[subprocess.CompletedProcess, float]:
    """Run `code` until it prints 'ready' (and, with `wait_for_output`, something more), send SIGINT;
    return (the finished process, seconds from the signal to its exit)."""
    code = f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n" + code
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=sigint_as_in_a_terminal)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        if wait_for_output:
            assert proc.stdout.read(1), proc.stderr.read()
        time.sleep(0.3)  # well inside the pooled work
        proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        out, err = proc.communicate(timeout=20)
        seconds = time.monotonic() - start
    finally:
        proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), seconds


def test_ctrl_c_during_pooled_work_exits_promptly():
    proc, seconds = _interrupt(textwrap.dedent("""
        import threading
        import numpy as np
        from inferno.testing import random_state_dict, small_config
        from inferno.backends.threaded import ThreadedBackend
        from inferno.models.gpt2 import Gpt2
        config = small_config(vocab_size=300, n_positions=256, n_embd=128, n_layer=4, n_head=4)
        backend = ThreadedBackend(threads=3, min_rows=1, min_macs=1)
        model = Gpt2.from_weights(config, random_state_dict(config), backend)
        ids = np.arange(256)[None] % 300
        print("ready", flush=True)
        try:
            while True:
                model.forward(ids)
        except KeyboardInterrupt:
            model.backend.close()
            print("left:", [t.name for t in threading.enumerate() if t.name.startswith("inferno")])
            raise
    """))
    assert proc.returncode == -signal.SIGINT, proc.stderr
    assert "left: []" in proc.stdout
    assert "did not stop" not in proc.stderr  # close() would have waited its 10 s for a blocked helper


def test_ctrl_c_in_the_cli_exits_130(tmp_path):
    from inferno.testing import write_config, write_hub_safetensors

    # Slow enough that the 1023 tokens it may generate take seconds.
    config = small_config(vocab_size=50257, n_positions=1024, n_embd=128, n_layer=4, n_head=4)
    write_config(tmp_path / "config.json", config)
    write_hub_safetensors(tmp_path / "model.safetensors", random_state_dict(config), config)
    (tmp_path / "tokenizer.json").write_bytes(shipped_gpt2_file("tokenizer.json").read_bytes())
    proc, seconds = _interrupt(textwrap.dedent(f"""
        print("ready", flush=True)
        from inferno.cli import main
        spec = "cpu-threaded:threads=2,min_rows=1,min_macs=1,min_elements=1"
        sys.exit(main(["--model-dir", {str(tmp_path)!r}, "--backend", spec, "--max-new-tokens", "100000",
                       "--ignore-eos", "Hello"]))
    """), wait_for_output=True)
    assert proc.returncode == 130, proc.stderr
    assert "interrupted" in proc.stderr
    assert "did not stop" not in proc.stderr


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_gets_its_own_threads():
    proc = run_script("""
        import os
        import numpy as np
        from inferno.backends.threaded import ThreadedBackend
        be = ThreadedBackend(threads=3, min_rows=1, min_macs=1)
        x, w = np.ones((1, 40, 8), np.float32), np.ones((8, 512), np.float32)
        be.linear(x, w, None)
        pid = os.fork()
        if pid == 0:
            ok = bool((be.linear(x, w, None) == 8).all())
            be.close()
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status), "parent", bool((be.linear(x, w, None) == 8).all()))
    """, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "child 0 parent True" in proc.stdout
