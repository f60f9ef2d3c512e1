"""The Array API promise end to end (issue #19): on every namespace tested here, `array-api:xp=NAME`
generates the numpy backend's greedy tokens, through the batch-1 loop, the batching engine and the
command line, and scores text to its numbers.

``array_api_strict`` (the test extra) raises on anything outside the standard, so it proves the model,
the loops and the kernels portable; ``jax.numpy`` (immutable arrays, compiled per shape) and
``dask.array`` (lazy) are extra namespaces, tested where installed (the ``array-api-namespaces`` extra)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import array_api_strict
import numpy as np
import pytest
from cli_helpers import offline_env

import inferno
from inferno.backends.array_api import ArrayApiBackend
from inferno.conformance import all_checks


def _namespace(module: str, install: str):
    top = module.split(".")[0]
    found = importlib.util.find_spec(top) is not None
    return pytest.param(module, id=top, marks=() if found else pytest.mark.skip(
        reason=f"{top} is not installed (pip install {install!r}, or the array-api-namespaces extra)"))


NAMESPACES = [
    _namespace("array_api_strict", "array-api-strict"),
    _namespace("jax.numpy", "jax[cpu]"),
    _namespace("dask.array", "dask[array]"),
]

PROMPTS = ["Hello", "The quick brown fox jumps over the lazy", "1, 2, 3,"]
#: Greedy ids may part only where float64 logits of the two ids are this close (relative to the largest
#: |logit|): the README's parity tolerance.
NEAR_TIE = 1e-4


@pytest.fixture(scope="module", params=NAMESPACES)
def xp_pipe(request, model_dir):
    return inferno.load(model_dir, f"array-api:xp={request.param}", download=False)


@pytest.fixture(scope="module")
def pipe64(model_dir):
    return inferno.load(model_dir, "numpy:dtype=float64", download=False)


def assert_same_greedy(pipe64, prompt: list[int], got: list[int], want: list[int]) -> None:
    """`got` equals `want` (numpy's greedy ids) up to the first near-tie of the float64 logits."""
    assert len(got) == len(want), (got, want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g != w:
            logits = pipe64.logits(prompt + want[:i])[-1].astype(np.float64)
            gap = (logits[w] - logits[g]) / np.abs(logits).max()
            assert gap <= NEAR_TIE, f"token {i}: {g} instead of {w} (relative gap {gap:.2g}); {got} vs {want}"
            return


def test_greedy_batch1_equals_numpy(xp_pipe, pipe, pipe64):
    for prompt in PROMPTS:
        got = xp_pipe.generate(prompt, max_new_tokens=10, stop_at_eos=False)
        want = pipe.generate(prompt, max_new_tokens=10, stop_at_eos=False)
        assert got.finish_reason == want.finish_reason == "length"
        assert_same_greedy(pipe64, pipe.encode(prompt), got.ids, want.ids)


def test_engine_equals_numpy(xp_pipe, pipe, pipe64):
    # Two slots for four prompts (slots are reused), chunks of 3 (long prompts beside decode rows), and
    # a prompt whose two sequences share one prefill (the engine copies its KV cache between slots).
    prompts = [*PROMPTS, "Once upon a time"]
    results = xp_pipe.generate_batch(prompts, max_new_tokens=8, slots=2, prefill_chunk=3, stop_at_eos=False)
    for prompt, got in zip(prompts, results, strict=True):
        want = pipe.generate(prompt, max_new_tokens=8, stop_at_eos=False)
        assert_same_greedy(pipe64, pipe.encode(prompt), got.ids, want.ids)
    with xp_pipe.engine(slots=2, prefill_chunk=4) as engine:
        ids = pipe.encode(PROMPTS[1])
        handles = engine.submit_many(ids, 6, [inferno.GenerationOptions()] * 2)
        shared = [h.result(timeout=300).ids for h in handles]
    want = pipe.generate(ids, max_new_tokens=6, stop_at_eos=False).ids
    for got in shared:
        assert_same_greedy(pipe64, ids, got, want)


def test_score_equals_numpy(xp_pipe, pipe):
    text = " ".join(["The quick brown fox jumps over the lazy dog, and the dog sleeps on."] * 12)
    assert len(pipe.encode(text)) > pipe.config.n_positions  # a sliding window of several forwards
    got, want = xp_pipe.score(text, stride=48, top_logprobs=3), pipe.score(text, stride=48, top_logprobs=3)
    assert got.ids == want.ids and got.logprobs[0] is None
    np.testing.assert_allclose(got.logprobs[1:], want.logprobs[1:], rtol=1e-4, atol=1e-4)
    assert got.perplexity == pytest.approx(want.perplexity, rel=1e-4)
    for g, w in zip(got.top[1:], want.top[1:], strict=True):
        np.testing.assert_allclose([lp for _, lp in g], [lp for _, lp in w], rtol=1e-4, atol=1e-4)


def test_the_issue_command_generates_on_strict(model_dir, pipe, tmp_path):
    # The command of issue #19, which raised IndexError in model.py before.
    proc = subprocess.run(
        [sys.executable, "-m", "inferno", "--model-dir", str(model_dir), "--backend",
         "array-api:xp=array_api_strict", "Hello", "-n", "8", "--ignore-eos", "--json"],
        capture_output=True, text=True, env=offline_env(tmp_path), timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ids"] == pipe.generate("Hello", max_new_tokens=8, stop_at_eos=False).ids
    assert out["backend"] == "array-api" and out["new_tokens"] == 8


# ------------------------------------------------------------------------- immutable arrays (JAX)


class ImmutableStrict(ArrayApiBackend):
    """array_api_strict through the code path of immutable namespaces: caches rebuilt by `xp.where`,
    attention over the whole cache."""

    def __init__(self) -> None:
        super().__init__(xp=array_api_strict)
        self._immutable = True


@pytest.mark.parametrize("check", all_checks(), ids=str)
def test_the_immutable_path_conforms(check):
    check(ImmutableStrict())


class _MatmulShapes:
    """A namespace that records the shapes of every matmul and passes everything through."""

    def __init__(self, xp) -> None:
        self._xp = xp
        self.shapes: set[tuple] = set()

    def __getattr__(self, name):
        return getattr(self._xp, name)

    def matmul(self, a, b):
        self.shapes.add((tuple(a.shape), tuple(b.shape)))
        return self._xp.matmul(a, b)


def test_decode_shapes_do_not_change_from_token_to_token_on_immutable_arrays(model_dir):
    # JAX compiles each operation once per shape (30-50 ms): were a step's shapes to depend on its
    # position, every token would compile anew (~1 s a token on the test model instead of ~5 ms).
    be = ImmutableStrict()
    p = inferno.load(model_dir, be, download=False)
    be.xp = recorder = _MatmulShapes(be.xp)
    steps = p.tokens("The quick brown fox", max_new_tokens=8, stop_at_eos=False).steps()
    next(steps)  # the prefill
    next(steps)  # the first decode step
    recorder.shapes.clear()
    next(steps)
    one_step = set(recorder.shapes)
    assert one_step
    for _ in steps:
        pass
    assert recorder.shapes == one_step


# ------------------------------------------------------------------------------- lazy arrays (dask)


@pytest.mark.skipif(importlib.util.find_spec("dask") is None, reason="dask is not installed "
                    "(pip install 'dask[array]', or the array-api-namespaces extra)")
def test_a_lazy_step_holds_that_step_only(model_dir):
    # Were the KV cache left lazy, each token's graph would hold the prompt and every step before it:
    # the 124M shape took 4, 6, 10, 14 s for its first four tokens.
    p = inferno.load(model_dir, "array-api:xp=dask.array", download=False)
    model, cache = p.model, p.model.new_cache(1, 16)
    logits = model.forward(np.asarray([p.encode("The quick brown fox")]), cache)
    tasks = []
    for _ in range(6):
        token = int(np.argmax(p.backend.to_numpy(logits)[0]))
        logits = model.forward(np.asarray([[token]]), cache)
        tasks.append(len(logits.__dask_graph__()))
    assert tasks == [tasks[0]] * 6, tasks
