"""The model and the generation loop against Hugging Face transformers (float64 goldens), and against
itself (KV-cached decode == full recompute, batch == one by one, last-position logits)."""

from __future__ import annotations

import numpy as np
import pytest
from goldens import GOLDEN, golden_model, write_model_dir

import inferno
from inferno.api import Pipeline
from inferno.backends.numpy_backend import NumpyBackend
from inferno.generate import ContextLengthError, GenerationError, generate_tokens
from inferno.models.gpt2 import Gpt2
from inferno.models.weights import load_weights
from inferno.sampling import SamplingParams
from inferno.testing import random_state_dict, small_config

# Logits agree with HF's float64 forward to this fraction of the largest |logit| (float32 compute).
LOGITS_RTOL = 1e-4
# Greedy comparison stops at a step where HF's top two logits are closer than this (relative): a
# near-tie that float32 rounding may legitimately break the other way.
NEAR_TIE = 1e-4


@pytest.fixture(scope="module")
def logits_model(tmp_path_factory) -> tuple[Gpt2, np.lib.npyio.NpzFile, dict]:
    config, sd, meta = golden_model("logits")
    directory = write_model_dir(tmp_path_factory.mktemp("logits-model"), config, sd)
    # Through the real loader, from a file in the Hub's layout (mask buffers included).
    weights = load_weights(directory / "model.safetensors", config)
    return Gpt2.from_weights(config, weights, NumpyBackend()), np.load(GOLDEN / "logits.npz"), meta


@pytest.fixture(scope="module")
def greedy_pipeline(tmp_path_factory) -> tuple[Pipeline, dict]:
    config, sd, meta = golden_model("greedy")
    directory = write_model_dir(tmp_path_factory.mktemp("greedy-model"), config, sd)
    return inferno.load(directory, "numpy", download=False), meta


def test_logits_match_transformers(logits_model):
    model, golden, meta = logits_model
    for i in range(meta["prompts"]):
        ids, ref = golden[f"ids_{i}"], golden[f"logits_{i}"]
        ours = model.backend.to_numpy(model.forward(ids[None], all_logits=True))[0]
        assert ours.shape == ref.shape
        err = np.abs(ours - ref).max() / np.abs(ref).max()
        assert err <= LOGITS_RTOL, f"prompt {i} (T={len(ids)}): relative error {err:.2e}"


def test_last_position_logits_equal_full(logits_model):
    model, golden, _ = logits_model
    ids = golden["ids_4"]
    full = model.forward(ids[None], all_logits=True)
    last = model.forward(ids[None])
    np.testing.assert_allclose(last[0], full[0, -1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("prefill", [1, 5, 20])
def test_kv_cached_decode_equals_full_recompute(logits_model, prefill):
    model, golden, _ = logits_model
    ids = golden["ids_4"]  # 33 tokens
    full = model.forward(ids[None], all_logits=True)[0]
    cache = model.new_cache(1, len(ids))
    steps = [model.forward(ids[None, :prefill], cache)[0]]
    steps += [model.forward(ids[None, t : t + 1], cache)[0] for t in range(prefill, len(ids))]
    np.testing.assert_allclose(np.stack(steps), full[prefill - 1 :], rtol=1e-4, atol=1e-4)


def test_batch_equals_one_by_one(logits_model):
    model, golden, _ = logits_model
    a, b = golden["ids_3"], golden["ids_4"][:16]
    both = model.forward(np.stack([a, b]), all_logits=True)
    for row, ids in zip(both, (a, b), strict=True):
        np.testing.assert_allclose(row, model.forward(ids[None], all_logits=True)[0], rtol=1e-5, atol=1e-5)


def test_greedy_matches_transformers(greedy_pipeline):
    pipe, meta = greedy_pipeline
    compared = 0
    for case in meta["cases"]:
        assert pipe.encode(case["prompt"]) == case["prompt_ids"], case["prompt"]
        result = pipe.generate(case["prompt"], max_new_tokens=len(case["greedy_ids"]), stop_at_eos=False)
        steps = zip(result.ids, case["greedy_ids"], case["relative_gaps"], strict=True)
        for step, (ours, ref, gap) in enumerate(steps):
            if gap < NEAR_TIE:
                break
            assert ours == ref, f"{case['prompt']!r}: step {step}: ours {ours}, transformers {ref}"
            compared += 1
    assert compared >= 10 * 16, f"only {compared} greedy steps were compared"


def test_pipeline_logits_match_forward(greedy_pipeline):
    pipe, _ = greedy_pipeline
    ids = pipe.encode("Hello, world!")
    logits = pipe.logits(ids)
    assert logits.shape == (len(ids), pipe.config.vocab_size) and logits.dtype == np.float32
    nxt = pipe.generate(ids, max_new_tokens=1, stop_at_eos=False).ids[0]
    assert nxt == int(np.argmax(logits[-1]))


def test_stream_pieces_join_to_text(greedy_pipeline):
    pipe, _ = greedy_pipeline
    kwargs = dict(max_new_tokens=12, temperature=0.9, top_k=50, seed=3)
    pieces = list(pipe.stream("Once upon a time", **kwargs))
    assert "".join(pieces) == pipe.generate("Once upon a time", **kwargs).text


def test_empty_prompt_starts_from_endoftext(greedy_pipeline):
    pipe, _ = greedy_pipeline
    result = pipe.generate("", max_new_tokens=3, stop_at_eos=False)
    assert result.prompt_ids == [pipe.config.eos_token_id]
    assert result.ids == pipe.generate([pipe.config.eos_token_id], max_new_tokens=3, stop_at_eos=False).ids


def test_seeded_sampling_is_reproducible(greedy_pipeline):
    pipe, _ = greedy_pipeline
    kwargs = dict(max_new_tokens=16, temperature=1.0, top_k=0, stop_at_eos=False)
    a = pipe.generate("The", seed=1, **kwargs).ids
    assert a == pipe.generate("The", seed=1, **kwargs).ids
    assert a != pipe.generate("The", seed=2, **kwargs).ids


def test_stops_at_a_stop_id(greedy_pipeline):
    pipe, _ = greedy_pipeline
    first = pipe.generate("Hello", max_new_tokens=1, stop_at_eos=False).ids[0]
    stream = generate_tokens(pipe.model, pipe.encode("Hello"), 10, SamplingParams(), stop_ids=[first])
    assert list(stream) == [first] and stream.finish_reason == "stop"


def test_max_new_tokens_gives_length(greedy_pipeline):
    pipe, _ = greedy_pipeline
    result = pipe.generate("Hello", max_new_tokens=5, stop_at_eos=False)
    assert len(result.ids) == 5 and result.finish_reason == "length"
    result = pipe.generate("Hello", max_new_tokens=0)
    assert result.ids == [] and result.finish_reason == "length"


def test_context_window_ends_generation(greedy_pipeline):
    pipe, _ = greedy_pipeline
    n_pos = pipe.config.n_positions
    prompt = [11] * (n_pos - 3)
    result = pipe.generate(prompt, max_new_tokens=50, stop_at_eos=False)
    assert len(result.ids) == 3 and result.finish_reason == "length"
    result = pipe.generate([11] * n_pos, max_new_tokens=5, stop_at_eos=False)
    assert result.ids == [] and result.finish_reason == "length"


def test_prompt_longer_than_context_is_an_error(greedy_pipeline):
    pipe, _ = greedy_pipeline
    n_pos = pipe.config.n_positions
    with pytest.raises(ContextLengthError, match=rf"{n_pos + 1} tokens.*{n_pos}"):
        pipe.generate([11] * (n_pos + 1), max_new_tokens=1)
    with pytest.raises(ContextLengthError):
        pipe.logits([11] * (n_pos + 1))


def test_out_of_vocabulary_prompt_id_is_an_error(greedy_pipeline):
    pipe, _ = greedy_pipeline
    with pytest.raises(ValueError, match="50257"):
        pipe.generate([1, 50257], max_new_tokens=1)



@pytest.mark.parametrize(("ids", "needle"), [([], "no tokens"), ([-1], "-1"), ([50257], "50257")])
def test_logits_reject_bad_ids(greedy_pipeline, ids, needle):
    pipe, _ = greedy_pipeline
    with pytest.raises(GenerationError, match=needle):
        pipe.logits(ids)


def test_sample_limit_keeps_ids_below_it(greedy_pipeline):
    pipe, _ = greedy_pipeline
    prompt = pipe.encode("Hello")
    first = pipe.generate(prompt, max_new_tokens=1, stop_at_eos=False).ids[0]
    stream = generate_tokens(pipe.model, prompt, 1, SamplingParams(), sample_limit=first)
    assert list(stream)[0] < first


def test_padded_vocabulary_samples_only_tokenizer_ids(tmp_path):
    # Some exports pad the vocabulary (nanoGPT: 50304); ids past the tokenizer's could not be decoded.
    config = small_config(vocab_size=50304, n_positions=32, n_embd=16, n_layer=1, n_head=2,
                          bos_token_id=50256, eos_token_id=50256)  # the tokenizer's, as nanoGPT keeps them
    pipe = inferno.load(write_model_dir(tmp_path, config, random_state_dict(config, 7)), "numpy",
                        download=False)
    assert pipe.tokens("Hi", max_new_tokens=1).sample_limit == 50257


def test_numpy_backend_loads_decode_weights_transposed(greedy_pipeline):
    # The numpy backend keeps the c_proj weights and wte in Fortran order (faster GEMVs in decode); the
    # loader reads them that way, and the tied LM head stays the very same array.
    pipe, _ = greedy_pipeline
    model = pipe.model
    assert model.wte.flags.f_contiguous and model.lm_head_w is model.wte
    for blk in model.blocks:
        assert blk.attn_proj_w.flags.f_contiguous and blk.proj_w.flags.f_contiguous
        assert blk.attn_w.flags.c_contiguous and blk.fc_w.flags.c_contiguous


@pytest.mark.parametrize("backend", ["numpy", "cpu-threaded:threads=2"])
def test_load_hands_the_loaders_arrays_over_without_a_copy(tmp_path, monkeypatch, backend):
    import inferno.models.gpt2

    loaded = {}
    read = inferno.models.gpt2.iter_weights  # what the GPT-2 family's loader reads with

    def spy(*args, **kwargs):
        for name, a in read(*args, **kwargs):
            loaded[name] = a
            yield name, a

    monkeypatch.setattr(inferno.models.gpt2, "iter_weights", spy)
    config = small_config(vocab_size=50257, n_positions=32, n_embd=16, n_layer=2, n_head=2)
    directory = write_model_dir(tmp_path, config, random_state_dict(config, 3))
    model = inferno.load(directory, backend, download=False).model
    assert model.wte is loaded["wte.weight"] and model.wte.flags.f_contiguous and model.lm_head_w is model.wte
    for i, b in enumerate(model.blocks):
        assert b.proj_w is loaded[f"h.{i}.mlp.c_proj.weight"] and b.proj_w.flags.f_contiguous
        assert b.attn_w is loaded[f"h.{i}.attn.c_attn.weight"] and b.attn_w.flags.c_contiguous
    model.backend.close()


def test_numpy_prepare_weight_copies_only_to_change_layout():
    be = NumpyBackend()
    a = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    assert be.prepare_weight("h.0.mlp.c_proj.weight", a) is a
    c = np.ascontiguousarray(a)
    assert be.prepare_weight("h.0.mlp.c_fc.weight", c) is c
    moved = be.prepare_weight("wte.weight", c)
    assert moved.flags.f_contiguous and np.array_equal(moved, c)
    assert be.prepare_weight("h.0.attn.c_attn.weight", a).flags.c_contiguous
