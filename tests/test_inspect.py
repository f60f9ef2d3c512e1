"""Looking inside the model (inferno/inspect.py, `Pipeline.inspect`): the properties of the attention
weights and the logit lens on every backend, subsets, bad requests, and that nothing else pays for it.

The values themselves are checked against transformers in tests/test_inspect_oracle.py (-m oracle).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferno.backends.numpy_backend import NumpyBackend
from inferno.inspect import Inspection, InspectionError, inspect_ids
from inferno.models.gpt2 import Gpt2
from inferno.testing import random_state_dict, small_config

CONFIG = small_config(vocab_size=211, n_positions=40, n_embd=30, n_layer=2, n_head=3)
SD = random_state_dict(CONFIG, seed=41, attn_gain=2.0)
IDS = np.random.default_rng(3).integers(0, CONFIG.vocab_size, 29).tolist()


@pytest.fixture(scope="module")
def model() -> Gpt2:
    return Gpt2.from_weights(CONFIG, SD, NumpyBackend())


def _softmax64(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=-1, keepdims=True)


def test_properties_on_every_backend(backend):
    model = Gpt2.from_weights(CONFIG, SD, backend)
    got = inspect_ids(model, IDS, top=4)
    t = len(IDS)
    a = got.attention
    assert isinstance(got, Inspection) and a.dtype == np.float32
    assert a.shape == (CONFIG.n_layer, CONFIG.n_head, t, t)
    assert got.layers == [0, 1] and got.heads == [0, 1, 2] and got.positions == list(range(t))
    # Causal: every weight above the diagonal is exactly 0; every row sums to 1.
    assert not np.triu(a, k=1).any()
    assert np.abs(a.sum(axis=-1, dtype=np.float64) - 1).max() <= 1e-6
    assert (a >= 0).all() and a[:, :, 3:].max() > 0.5  # not uniform: the weights mean something
    # The lens: n_layer + 1 layers, `top` pairs a position, most likely first, probabilities in (0, 1].
    assert len(got.logit_lens) == CONFIG.n_layer + 1 == got.n_layers
    for rows in got.logit_lens:
        assert len(rows) == t
        for pairs in rows:
            probs = [p for _, p in pairs]
            assert len(pairs) == 4 and probs == sorted(probs, reverse=True) and 0 < probs[-1] <= probs[0] <= 1
    # The last layer's lens is the model's own next-token distribution at every position.
    logits = backend.to_numpy(model.forward(np.asarray([IDS]), all_logits=True))[0]
    probs = _softmax64(logits)
    tol = 1e-5 if backend.dtype in (np.float32, np.float64) else 2e-3
    for pos, pairs in enumerate(got.logit_lens[-1]):
        assert [i for i, _ in pairs] == np.argsort(-probs[pos], kind="stable")[:4].tolist()
        np.testing.assert_allclose([p for _, p in pairs], probs[pos][[i for i, _ in pairs]], atol=tol)


@settings(max_examples=12, deadline=None)
@given(t=st.integers(2, 40), k=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_a_prefix_gives_the_prefix_rows(model, t, k, seed):
    # Causal attention: inspecting the first k tokens gives the first k rows (and keys) of the longer
    # text's result, and the same lens there.
    k = min(k, t)
    ids = np.random.default_rng(seed).integers(0, CONFIG.vocab_size, t).tolist()
    full, prefix = inspect_ids(model, ids, top=3), inspect_ids(model, ids[:k], top=3)
    # float32: BLAS blocks a k-row and a t-row matmul differently, and the few ulp that moves reach
    # 1.1e-6 in a probability after the layers (seen in CI); 1e-5 is the file's float32 tolerance.
    np.testing.assert_allclose(prefix.attention, full.attention[:, :, :k, :k], atol=1e-5, rtol=0)
    for layer in range(CONFIG.n_layer + 1):
        for pos in range(k):
            a, b = prefix.logit_lens[layer][pos], full.logit_lens[layer][pos]
            np.testing.assert_allclose([p for _, p in a], [p for _, p in b], atol=1e-5)


@pytest.mark.parametrize("spec", ["numpy", "half:dtype=bfloat16"])
def test_subsets_are_the_full_result_sliced(spec):
    # layers / heads / positions only leave things out: what is kept is the full result's values.
    if spec.startswith("half"):
        pytest.importorskip("inferno_half")
    from inferno.backends.registry import get_backend

    model = Gpt2.from_weights(CONFIG, SD, get_backend(spec))
    full = inspect_ids(model, IDS)
    part = inspect_ids(model, IDS, layers=[1], heads=[2, 0], positions=[28, 0, 17], top=3)
    assert part.layers == [1] and part.heads == [0, 2] and part.positions == [0, 17, 28]
    np.testing.assert_allclose(part.attention, full.attention[np.ix_([1], [0, 2])], atol=1e-6)
    for layer in range(CONFIG.n_layer + 1):
        for j, pos in enumerate(part.positions):
            kept = [i for i, _ in full.logit_lens[layer][pos][:3]]
            assert [i for i, _ in part.logit_lens[layer][j]] == kept
    one = inspect_ids(model, IDS, layers=0, heads=1, positions=5, top=1)
    assert one.attention.shape == (1, 1, len(IDS), len(IDS)) and len(one.logit_lens[0]) == 1


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"ids": []}, "no tokens"),
    ({"ids": list(range(41))}, "41 tokens long but the model's context holds 40"),
    ({"ids": [5, 211]}, "token id 211 is outside the vocabulary"),
    ({"layers": [2]}, r"layers: 2 is not one of the model's layers \(integers in \[0, 2\)\)"),
    ({"layers": []}, "layers must be a non-empty list"),
    ({"layers": "0"}, "layers must be a non-empty list"),
    ({"heads": [0, 0]}, "heads lists heads 0 twice"),
    ({"heads": [-1]}, "heads: -1 is not one of"),
    ({"heads": [True]}, "heads: True is not one of"),
    ({"positions": [3]}, r"positions: 3 is not one of the model's positions \(integers in \[0, 3\)\)"),
    ({"top": 0}, r"top must be an integer in \[1, 211\]"),
    ({"top": 1.5}, "top must be an integer"),
])
def test_bad_requests_are_errors_that_say_what(model, kwargs, match):
    ids = kwargs.pop("ids", [1, 2, 3])
    with pytest.raises(InspectionError, match=match):
        inspect_ids(model, ids, **kwargs)


class _NoLooking(NumpyBackend):
    """A backend whose inspection methods fail: generation, scoring and the engine must never call them."""

    name = "no-looking"

    def attention_weights(self, q, k_cache, offset):
        raise AssertionError("attention_weights called outside inspection")

    def self_attention_weights(self, *args):
        raise AssertionError("self_attention_weights called outside inspection")


def test_nothing_else_pays_for_it(pipe):
    from inferno.api import Pipeline

    model = Gpt2.from_weights(pipe.config, dict(pipe.model.named_weights()), _NoLooking())
    p = Pipeline(model, pipe.tokenizer)
    assert p.generate("Hello", max_new_tokens=3).ids
    assert p.score("Hello there, world").logprobs
    assert p.generate_batch(["a", "b c"], max_new_tokens=2)
    with pytest.raises(Exception, match="self_attention_weights called outside inspection"):
        p.inspect("Hello")


def test_pipeline_inspect_text_and_tokens(pipe):
    got = pipe.inspect("The quick brown fox", top=2)
    assert got.ids == pipe.encode("The quick brown fox")
    assert got.tokens == [pipe.tokenizer.decode([i]) for i in got.ids]
    assert "".join(got.tokens) == "The quick brown fox"
    assert len(got.logit_lens[-1][-1]) == 2
    # Ids work too, and the empty prompt is <|endoftext|> as for generate.
    assert pipe.inspect([464, 2068]).ids == [464, 2068]
    assert pipe.inspect("").ids == [pipe.config.eos_token_id]


def test_a_broken_attention_weights_is_an_error_naming_the_backend():
    class Broken(NumpyBackend):
        name = "broken-weights"

        def attention_weights(self, q, k_cache, offset):
            w = super().attention_weights(q, k_cache, offset)
            return w * 2  # rows summing to 2: garbage the checks must catch

    model = Gpt2.from_weights(CONFIG, SD, Broken())
    with pytest.raises(Exception, match="backend 'broken-weights': self_attention_weights returned attention "
                                        "weights that are not finite or whose rows do not sum to 1"):
        inspect_ids(model, IDS)


def test_the_conformance_suite_catches_a_wrong_override():
    # A plugin that overrides attention_weights proves it in the suite: one that forgets the causal mask
    # (or rounds the weights to 16 bits) fails there, with the kernel and case named.
    from inferno.conformance.checks import ConformanceError, all_checks

    class Unmasked(NumpyBackend):
        name = "unmasked"

        def attention_weights(self, q, k_cache, offset):
            t = q.shape[2]
            scores = q @ k_cache[:, :, : offset + t].swapaxes(-1, -2) / np.sqrt(q.shape[3])
            return self.softmax(scores).astype(np.float32)

    class Float16(NumpyBackend):
        name = "float16-weights"

        def attention_weights(self, q, k_cache, offset):
            return super().attention_weights(q, k_cache, offset).astype(np.float16).astype(np.float32)

    checks = all_checks(kernels=["attention_weights", "self_attention_weights"])
    assert len(checks) == 5
    for check in checks:
        check(NumpyBackend())
    with pytest.raises(ConformanceError, match=r"attention_weights \[chunk-at-offset: .*weights differs"):
        next(c for c in checks if c.id == "attention_weights-chunk-at-offset")(Unmasked())
    with pytest.raises(ConformanceError, match=r"attention_weights \[gpt2-prefill: .*weights differs"):
        next(c for c in checks if c.id == "attention_weights-gpt2-prefill")(Float16())
