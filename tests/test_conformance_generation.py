"""The conformance suite's model checks cover what generation and scoring do (issue #19): a prefill to the
last position's logits, cached decode steps, `forward(last=n)`, the batch-1 greedy loop and the batching
engine. A backend that breaks one of those paths fails them, naming the check and what differs."""

from __future__ import annotations

import numpy as np
import pytest
from backend_helpers import conformance_failures

from inferno.backends.base import RaggedRow
from inferno.backends.numpy_backend import NumpyBackend
from inferno.conformance import all_checks
from inferno.conformance.checks import _near_tie, _Run

NEW = {"model-last-position", "model-last-position-T1", "model-last-n", "model-greedy", "model-engine"}


def test_the_generation_cases_are_registered():
    kinds = {c.id: c.kind for c in all_checks()}
    assert NEW <= set(kinds)
    assert {kinds[i] for i in NEW} == {"model"}


# ----------------------------------------------------------------------- deliberately broken backends


class LmHeadAssumes3d(NumpyBackend):
    """Reads a 2-D input [B, C] as one sequence [1, B, C]: right for full forwards, wrong for the last
    position's logits that generation asks for."""

    def lm_head(self, x, wte):
        return super().lm_head(x[None] if x.ndim == 2 else x, wte)


class DecodeMissesItsOwnKey(NumpyBackend):
    """A decode step (one query) attends the cached keys but not the one it just wrote."""

    def attention(self, q, k_cache, v_cache, offset):
        if q.shape[2] == 1 and offset > 0:
            return super().attention(q, k_cache[:, :, :offset], v_cache[:, :, :offset], offset - 1)
        return super().attention(q, k_cache, v_cache, offset)


class SlotOfRowIndex(NumpyBackend):
    """Row i of a ragged batch goes to slot i: right only while the rows happen to be in slot order."""

    def ragged_self_attention(self, x, w_attn, b_attn, w_proj, b_proj, slot_kv, rows, n_head):
        rows = [RaggedRow(i, r.offset, r.start, r.length) for i, r in enumerate(rows)]
        return super().ragged_self_attention(x, w_attn, b_attn, w_proj, b_proj, slot_kv, rows, n_head)


def _failures(cls, allowed):
    failures, _ = conformance_failures(cls, allowed)
    return failures


WHAT = {c.id: c.what for c in all_checks()}


def _starts(failures, check_id, message):
    kernel, case = check_id.split("-", 1)
    text = str(failures[check_id])
    assert text.startswith(f"{kernel} [{case}: {WHAT[check_id]}]: {message}"), text
    return text


def test_a_head_for_full_forwards_only_fails_the_generation_checks():
    failures = _failures(LmHeadAssumes3d, {"lm_head", "model"})
    # The model's guard names the backend, the kernel and the shapes.
    _starts(failures, "model-last-position", "raised BackendError: backend 'numpy': lm_head returned an "
            "array of shape (1, 2, 101), expected (2, 101)")
    _starts(failures, "model-greedy", "raised BackendError: backend 'numpy': lm_head returned an array of "
            "shape (1, 1, 101), expected (1, 101)")
    # Full forwards, forward(last=n) and the engine's ragged batch hand lm_head 3-D arrays: only the
    # checks of the batch-1 generation path see it.
    passing = {"model-small", "model-T1-prefill", "model-last-n", "model-ragged", "model-engine"}
    assert not passing & set(failures)


def test_a_decode_step_that_misses_its_own_key_fails_naming_the_position_and_token():
    failures = _failures(DecodeMissesItsOwnKey, {"attention", "kv_cache", "self_attention", "model"})
    _starts(failures, "model-last-position", "cached decode logits [B, V] at position 6 differs from the "
            "numpy backend in float64")
    greedy = _starts(failures, "model-greedy", "greedy generation from a prompt of 1: new token 1 is id ")
    assert "not a near-tie within float32 tolerance" in greedy
    _starts(failures, "model-engine", "engine sequence ")
    assert "model-last-n" not in failures  # no cache, no decode step


def test_rows_sent_to_the_wrong_slots_fail_the_engine_check():
    failures = _failures(SlotOfRowIndex, {"ragged_self_attention", "model"})
    engine = _starts(failures, "model-engine", "engine sequence ")
    assert "new token 0 is id " in engine and "not a near-tie" in engine
    # One sequence at a time is unaffected.
    assert not {"model-last-position", "model-greedy", "model-last-n"} & set(failures)


@pytest.mark.parametrize("gap, tie", [(0.0, True), (1e-4, True), (1e-2, False)])
def test_near_tie_is_the_model_checks_tolerance(gap, tie):
    # float32: 10 × (1e-4 × |top| + 1e-5 × max|logit|) on either side.
    run = _Run(NumpyBackend(), all_checks(["model"])[0])
    logits = np.array([1.0, 1.0 - gap, -1.0])
    assert _near_tie(run, logits, got=1, want=0) is tie
