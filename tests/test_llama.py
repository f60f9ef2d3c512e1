"""The Llama family (inferno/models/llama.py): its config, its weight plan and its forward pass, on random
weights at small shapes for every variant (`inferno.testing.LLAMA_VARIANTS`: GQA 1/2/4, tied and untied,
Qwen2's biases, Qwen3's q/k norms, an odd hidden size, both rope scalings).

The logits are checked against `reference_logits`, the architecture written out here in float64 NumPy
from the Hub's tensors (tests/test_llama_oracle.py checks the same against transformers); the KV cache
against recomputation, ragged batches against single runs, the engine against batch-1 generation, and a
backend written before the Llama kernels existed (the `Backend` defaults) against the native ones.
"""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

import inferno
from inferno.backends.array_api import ArrayApiBackend
from inferno.backends.base import Backend
from inferno.backends.numpy_backend import NumpyBackend
from inferno.backends.threaded import ThreadedBackend
from inferno.errors import BackendError
from inferno.models.config import ConfigError
from inferno.models.families import family_of, load_model
from inferno.models.llama import Llama, LlamaConfig, inverse_frequencies
from inferno.models.weights import WeightsError
from inferno.testing import LLAMA_VARIANTS, llama_config, llama_state_dict, make_llama_dir

VARIANTS = list(LLAMA_VARIANTS)


# ------------------------------------------------------------------------------------ the reference


def _rms(x: np.ndarray, g: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def reference_logits(config: dict, sd: dict, ids: list[int], inside: dict | None = None) -> np.ndarray:
    """Logits [T, V] of the Llama-family model of config.json object `config` with the Hub state dict `sd`
    (torch's [out, in] layout), written out plainly in float64, independent of inferno's model. `inside`
    (a dict) receives each layer's attention weights [H, T, T] ("attention") and the residual stream
    before each layer and after the last ("hidden")."""
    inside = {} if inside is None else inside
    inside["attention"], inside["hidden"] = [], []
    c = config
    w = {k: v.astype(np.float64) for k, v in sd.items()}
    n_head = c["num_attention_heads"]
    n_kv = c.get("num_key_value_heads") or n_head
    d = c.get("head_dim") or c["hidden_size"] // n_head
    eps, t = c["rms_norm_eps"], len(ids)
    inv = inverse_frequencies(LlamaConfig.from_dict(c))  # the rope scalings are checked in the oracle test
    angles = np.arange(t)[:, None] * inv[None, :]
    cos, sin = np.cos(angles), np.sin(angles)

    def rotate(x):  # [heads, T, D]
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    x = w["model.embed_tokens.weight"][ids]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        inside["hidden"].append(x)

        def proj(name, h, p=p):
            return h @ w[p + name + ".weight"].T + w.get(p + name + ".bias", 0.0)

        h = _rms(x, w[p + "input_layernorm.weight"], eps)
        q = proj("self_attn.q_proj", h).reshape(t, n_head, d).transpose(1, 0, 2)
        k = proj("self_attn.k_proj", h).reshape(t, n_kv, d).transpose(1, 0, 2)
        v = proj("self_attn.v_proj", h).reshape(t, n_kv, d).transpose(1, 0, 2)
        if p + "self_attn.q_norm.weight" in w:
            q = _rms(q, w[p + "self_attn.q_norm.weight"], eps)
            k = _rms(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k = rotate(q), rotate(k)
        k, v = np.repeat(k, n_head // n_kv, axis=0), np.repeat(v, n_head // n_kv, axis=0)
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(d) + np.triu(np.full((t, t), -np.inf), 1)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        inside["attention"].append(weights)
        x = x + proj("self_attn.o_proj", (weights @ v).transpose(1, 0, 2).reshape(t, n_head * d))
        h = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        gated = gate / (1 + np.exp(-gate)) * (h @ w[p + "mlp.up_proj.weight"].T)
        x = x + gated @ w[p + "mlp.down_proj.weight"].T
    inside["hidden"].append(x)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return _rms(x, w["model.norm.weight"], eps) @ head.T


def relative_error(ours, ref) -> float:
    return float(np.abs(np.asarray(ours, np.float64) - ref).max() / np.abs(ref).max())


class OldBackend(NumpyBackend):
    """A backend written before the Llama kernels existed: NumPy's GPT-2 kernels, and the `Backend`
    defaults for everything the Llama family added."""

    name = "old-numpy"


for _kernel in ("embed_tokens", "heads", "rms_norm", "rotary", "silu_mul", "gqa_attention", "gated_mlp"):
    setattr(OldBackend, _kernel, getattr(Backend, _kernel))


def backends():
    """(id, backend factory, relative tolerance against the float64 reference)."""
    import array_api_strict

    return [
        ("numpy-float64", lambda: NumpyBackend("float64"), 1e-12),
        ("numpy", lambda: NumpyBackend(), 2e-5),
        ("array-api-strict-float64", lambda: ArrayApiBackend(xp=array_api_strict, dtype="float64"), 1e-12),
        ("cpu-threaded-float64",
         lambda: ThreadedBackend(2, "float64", min_rows=1, min_macs=1, min_elements=1), 1e-12),
        # The defaults go through the host in float32 (to_numpy): float32's rounding, no more.
        ("old-backend-float64", lambda: OldBackend("float64"), 2e-6),
    ]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Every variant written as save_pretrained writes it: {variant: (folder, config, state dict)}."""
    return {v: make_llama_dir(tmp_path_factory.mktemp(v), v, seed=i) for i, v in enumerate(VARIANTS)}


IDS = [3, 17, 42, 5, 63, 0, 9, 9, 28, 41, 7, 1, 60, 12]


# ------------------------------------------------------------------------------------------ logits


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("make", backends(), ids=lambda b: b[0])
def test_logits_match_the_reference(folders, variant, make):
    directory, config, sd = folders[variant]
    _, factory, rtol = make
    model = load_model(directory / "config.json", directory, factory())
    # Read back in the compute dtype (to_numpy gives float32): DLPack, which every one of them has.
    ours = np.from_dlpack(model.forward(np.asarray([IDS]), all_logits=True))[0]
    assert relative_error(ours, reference_logits(config, sd, IDS)) < rtol


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_kv_cache_equals_recomputation(folders, variant):
    directory, config, sd = folders[variant]
    model = load_model(directory / "config.json", directory, NumpyBackend("float64"))
    full = model.forward(np.asarray([IDS]), all_logits=True)[0]
    cache = model.new_cache(1, len(IDS))
    steps = [model.forward(np.asarray([IDS[:5]]), cache, last=5)[0]]  # a prompt, then one token at a time
    steps += [model.forward(np.asarray([[i]]), cache)[0][None] for i in IDS[5:]]
    assert np.abs(np.concatenate(steps) - full).max() < 1e-12 * np.abs(full).max()
    assert cache.length == len(IDS)


@pytest.mark.parametrize("variant", ["llama", "qwen3", "mistral-odd", "llama-gqa4-bias"])
def test_a_ragged_batch_equals_single_runs(folders, variant):
    directory, config, sd = folders[variant]
    model = load_model(directory / "config.json", directory, NumpyBackend("float64"))
    seqs = [IDS, IDS[3:11], [7, 7, 7, 2, 40, 33]]
    slots = model.new_slots(3)
    # Step 1: two prompt chunks; step 2: a decode row, a chunk and a new prompt, one without logits.
    first = model.forward_ragged([(seqs[0][:6], 0, 0), (seqs[1][:3], 2, 0)], slots)
    second = model.forward_ragged([(seqs[0][6:7], 0, 6), (seqs[1][3:], 2, 3), (seqs[2], 1, 0)], slots,
                                  logits_for=[True, True, False])
    alone = [model.forward(np.asarray([s]), all_logits=True)[0] for s in seqs]
    expected = [alone[0][5], alone[1][2], alone[0][6], alone[1][len(seqs[1]) - 1]]
    got = np.concatenate([first, second])
    assert got.shape == (4, config["vocab_size"])
    assert np.abs(got - np.stack(expected)).max() < 1e-12 * np.abs(got).max()


def test_greedy_ids_are_the_same_with_and_without_the_cache(folders):
    directory, config, sd = folders["qwen2"]
    model = load_model(directory / "config.json", directory, NumpyBackend("float64"))
    prompt = [5, 9, 14]
    cache, ids = model.new_cache(1, 64), list(prompt)
    logits = model.forward(np.asarray([prompt]), cache)
    for _ in range(40):
        ids.append(int(np.argmax(logits[0])))
        logits = model.forward(np.asarray([[ids[-1]]]), cache)
    recomputed = list(prompt)
    for _ in range(40):
        recomputed.append(int(np.argmax(reference_logits(config, sd, recomputed)[-1])))
    assert ids == recomputed
    assert len(set(ids[3:])) > 3  # not one token repeated: a stale cache would show


# ---------------------------------------------------------------------------------- loading, engine


def test_a_sharded_checkpoint_loads_as_one_file(tmp_path):
    one, config, _ = make_llama_dir(tmp_path / "one", "qwen3", seed=4)
    many, _, _ = make_llama_dir(tmp_path / "many", "qwen3", seed=4, shards=3)
    assert not (many / "model.safetensors").exists() and len(list(many.glob("*.safetensors"))) == 3
    a = load_model(one / "config.json", one, NumpyBackend())
    b = load_model(many / "config.json", many / "model.safetensors.index.json", NumpyBackend())
    np.testing.assert_array_equal(a.forward(np.asarray([IDS])), b.forward(np.asarray([IDS])))
    # Named by the folder, or by the single file a resolver expects beside the config: the index is read.
    for where in (many, many / "model.safetensors"):
        c = load_model(many / "config.json", where, NumpyBackend())
        np.testing.assert_array_equal(a.forward(np.asarray([IDS])), c.forward(np.asarray([IDS])))


@pytest.mark.parametrize("dtype", ["F16", "BF16"])
def test_16_bit_checkpoints_load_rounded(tmp_path, dtype):
    directory, config, stored = make_llama_dir(tmp_path, "llama", dtype=dtype)
    model = load_model(directory / "config.json", directory, NumpyBackend("float64"))
    ours = model.forward(np.asarray([IDS]), all_logits=True)[0]
    assert relative_error(ours, reference_logits(config, stored, IDS)) < 1e-12


def test_inferno_load_runs_a_llama_folder_through_generation_and_the_engine(tmp_path):
    from inferno.models.resolve import shipped_gpt2_file

    directory, config, _ = make_llama_dir(tmp_path, "llama-gqa4-bias")
    shutil.copy(shipped_gpt2_file("tokenizer.json"), directory / "tokenizer.json")  # ids only matter
    pipe = inferno.load(directory, "numpy", download=False)
    assert isinstance(pipe.model, Llama)
    prompts = [[5, 9, 14], [1, 2, 3, 4, 5, 6], [60]]
    alone = [pipe.generate(p, max_new_tokens=12, stop_at_eos=False).ids for p in prompts]
    together = pipe.generate_batch(prompts, max_new_tokens=12, stop_at_eos=False, prefill_chunk=4)
    assert [r.ids for r in together] == alone
    score = pipe.score(IDS)
    assert len(score.logprobs) == len(IDS) and score.logprobs[0] is None
    assert math.isfinite(score.perplexity)


# ------------------------------------------------------------------------------------- refusals


def test_the_registry_names_an_unsupported_model_type_and_lists_the_supported_ones():
    with pytest.raises(ConfigError) as e:
        family_of({"model_type": "gemma2"}, "x/config.json")
    assert str(e.value) == ("invalid model config x/config.json: 'model_type' is 'gemma2': inferno runs "
                            "gpt2, llama, mistral, qwen2, qwen3 models")
    assert family_of({"architectures": ["Qwen2ForCausalLM"]}).name == "llama"
    assert family_of({"n_embd": 8}).name == "gpt2"


@pytest.mark.parametrize("change, field", [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "'rope_scaling' of type 'yarn'"),
    ({"mlp_bias": True}, "'mlp_bias'"),
    ({"hidden_act": "gelu"}, "'hidden_act'"),
    ({"partial_rotary_factor": 0.5}, "'partial_rotary_factor'"),
    ({"head_dim": 7}, "'head_dim'"),
    ({"num_key_value_heads": 3}, "'num_key_value_heads'"),
    ({"num_hidden_layers": 0}, "'num_hidden_layers'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "'low_freq_factor'"),
    ({"eos_token_id": [2, 64]}, "'eos_token_id' must be an id below 'vocab_size' (64)"),
    ({"bos_token_id": -1}, "'bos_token_id'"),
    ({"tie_word_embeddings": "yes"}, "'tie_word_embeddings' must be true or false"),
])
def test_a_config_that_changes_the_maths_is_refused_naming_the_field(change, field):
    with pytest.raises(ConfigError) as e:
        LlamaConfig.from_dict(llama_config("llama", **change), "m/config.json")
    message = str(e.value)
    assert message.startswith("invalid Llama config m/config.json: ") and field in message
    assert "\n" not in message


def test_a_sliding_window_smaller_than_the_context_is_refused():
    window = llama_config("mistral-odd", sliding_window=32)
    with pytest.raises(ConfigError, match="'sliding_window' 32 is smaller than the context of 64"):
        LlamaConfig.from_dict(window)
    assert LlamaConfig.from_dict(window, context=32).n_positions == 32  # a context it covers is fine
    assert LlamaConfig.from_dict(llama_config("mistral-odd", sliding_window=64)).n_positions == 64
    # Qwen's window applies only with use_sliding_window.
    assert LlamaConfig.from_dict(llama_config("qwen2", sliding_window=8)).n_positions == 64
    with pytest.raises(ConfigError, match="'sliding_window'"):
        LlamaConfig.from_dict(llama_config("qwen2", sliding_window=8, use_sliding_window=True))


def test_the_config_answers_to_the_names_the_layers_above_read():
    c = LlamaConfig.from_dict(llama_config("qwen3", eos_token_id=[2, 7]))
    assert (c.n_embd, c.n_layer, c.n_head, c.n_kv_head, c.head_dim, c.n_positions) == (24, 2, 4, 1, 6, 64)
    assert c.eos_token_ids == (2, 7) and c.eos_token_id == 2
    assert LlamaConfig.from_dict(c.to_dict()) == c


def test_weights_that_do_not_match_the_config_are_refused_naming_each_tensor(tmp_path):
    directory, config, _ = make_llama_dir(tmp_path, "llama")
    config["intermediate_size"] = 48
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError) as e:
        load_model(directory / "config.json", directory, NumpyBackend())
    assert "cannot load Llama weights" in str(e.value)
    wrong = "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [40, 24], expected [48, 24]"
    assert wrong in str(e.value)


def test_an_index_naming_a_shard_outside_its_folder_is_refused(tmp_path):
    directory, _, _ = make_llama_dir(tmp_path, "llama", shards=2)
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = "../elsewhere.safetensors"
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(WeightsError, match="is not a file name beside the index"):
        load_model(directory / "config.json", directory, NumpyBackend())


def test_a_backend_kernel_returning_the_wrong_shape_is_an_error_naming_it(folders):
    class BadNorm(NumpyBackend):
        name = "bad-norm"

        def rms_norm(self, x, gamma, eps):
            return super().rms_norm(x, gamma, eps)[..., :-1]

    directory, _, _ = folders["llama"]
    model = load_model(directory / "config.json", directory, BadNorm())
    with pytest.raises(BackendError, match="backend 'bad-norm': rms_norm returned an array of shape"):
        model.forward(np.asarray([IDS]))


def test_the_kv_cache_holds_the_key_value_heads_only(folders):
    directory, config, _ = folders["qwen3"]
    model = load_model(directory / "config.json", directory, NumpyBackend())
    k, v = model.new_cache(1, 10).layers[0]
    assert k.shape == v.shape == (1, 1, 10, 6)
    from inferno.kv import slot_bytes

    assert slot_bytes(model.config) == 2 * 2 * 64 * 1 * 6 * 4


def test_random_weights_keep_every_tensor_in_play():
    # Dropping any tensor changes the logits: every one is drawn, gains included.
    config = llama_config("qwen3")
    sd = llama_state_dict(config)
    ref = reference_logits(config, sd, IDS)
    for name in ("model.layers.1.self_attn.k_norm.weight", "model.layers.0.post_attention_layernorm.weight"):
        changed = dict(sd, **{name: np.ones_like(sd[name])})
        assert relative_error(reference_logits(config, changed, IDS), ref) > 1e-3


# --------------------------------------------------------------------------------- conformance suite

LLAMA_KERNELS = ["embed_tokens", "heads", "linears", "rms_norm", "rotary", "silu_mul", "gqa_attention",
                 "gated_mlp", "ragged_gqa_attention"]


def llama_checks(kernels=LLAMA_KERNELS):
    from inferno.conformance import all_checks

    return all_checks(kernels=kernels) + [c for c in all_checks(["model"]) if c.case.startswith("llama")]


def test_the_conformance_suite_passes_a_backend_running_the_defaults():
    from inferno.conformance import check_backend

    checks = llama_checks()
    assert {c.kind for c in checks} == {"kernel", "composition", "model"} and len(checks) > 25
    check_backend(OldBackend(), checks)
    check_backend(OldBackend("float64"), checks)


class GroupsByModulo(NumpyBackend):
    """Pairs query head h with key/value head h % Hkv instead of h // (H / Hkv)."""

    def gqa_attention(self, q, k_cache, v_cache, offset):
        r = q.shape[1] // k_cache.shape[1]
        return self.attention(q, np.tile(k_cache, (1, r, 1, 1)), np.tile(v_cache, (1, r, 1, 1)), offset)


class InterleavedRotary(NumpyBackend):
    """Rotates adjacent pairs (x0, x1), (x2, x3) ... (Meta's original layout) instead of the two halves."""

    def rotary(self, x, cos, sin):
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
        return out


class NoEpsilon(NumpyBackend):
    """Forgets eps in the RMS norm (which matters only where the mean square is small)."""

    def rms_norm(self, x, gamma, eps):
        return super().rms_norm(x, gamma, 0.0)


class LinearsReversed(NumpyBackend):
    """Hands the projections back in the reverse order (v, k, q)."""

    def linears(self, x, weights, biases):
        return super().linears(x, weights, biases)[::-1]


class LinearsWithoutBiases(NumpyBackend):
    def linears(self, x, weights, biases):
        return super().linears(x, weights, [None] * len(weights))


@pytest.mark.parametrize("broken, kernel, caught, in_the_model", [
    # With one key/value head, h % 1 == h // H: the ratio-8 case cannot tell them apart.
    (GroupsByModulo, "gqa_attention", {"ratio-3-smollm2", "ratio-3-decode", "ratio-7-qwen2.5", "odd-D5"},
     True),
    (InterleavedRotary, "rotary", {"prefill", "past-4096", "ragged-positions"}, True),
    (NoEpsilon, "rms_norm", {"small-values"}, False),
    (LinearsReversed, "linears", {"smollm2-qkv", "qwen2-qkv-bias", "odd-two"}, True),
    (LinearsWithoutBiases, "linears", {"qwen2-qkv-bias", "odd-two"}, True),
])
def test_the_conformance_suite_names_a_broken_llama_kernel(broken, kernel, caught, in_the_model):
    from inferno.conformance import all_checks
    from inferno.conformance.checks import ConformanceError

    failed = set()
    for check in all_checks(["kernel"], kernels=[kernel]):
        try:
            check(broken())
        except ConformanceError as e:
            assert str(e).startswith(f"{kernel} [{check.case}: ")
            failed.add(check.case)
    assert caught <= failed
    if in_the_model:  # and the whole model goes wrong with it
        from inferno.conformance import check_backend

        with pytest.raises(AssertionError, match=r"model \[llama-"):
            check_backend(broken(), llama_checks([]))


@pytest.mark.parametrize("variant", ["llama-gqa4-bias", "qwen3", "mistral-odd"])
def test_inspect_gives_each_query_heads_attention_and_the_logit_lens(folders, variant):
    from inferno.inspect import inspect_ids

    directory, config, sd = folders[variant]
    model = load_model(directory / "config.json", directory, NumpyBackend("float64"))
    inside: dict = {}
    reference_logits(config, sd, IDS, inside)
    seen = inspect_ids(model, IDS, heads=[0, 3], top=3)
    want = np.stack([a[[0, 3]] for a in inside["attention"]])
    assert seen.attention.shape == want.shape and np.abs(seen.attention - want).max() < 1e-6
    g = sd["model.norm.weight"].astype(np.float64)
    head = sd.get("lm_head.weight", sd["model.embed_tokens.weight"]).astype(np.float64)
    for layer, hidden in enumerate(inside["hidden"]):
        logits = _rms(hidden, g, config["rms_norm_eps"]) @ head.T
        for j, pos in enumerate(seen.positions):
            assert [i for i, _ in seen.logit_lens[layer][j]] == list(np.argsort(-logits[pos])[:3])


def test_generation_stops_at_any_of_the_eos_ids(tmp_path):
    from inferno.models.resolve import shipped_gpt2_file

    directory, config, _ = make_llama_dir(tmp_path, "llama")
    shutil.copy(shipped_gpt2_file("tokenizer.json"), directory / "tokenizer.json")
    free = inferno.load(directory, "numpy", download=False).generate([5, 9, 14], max_new_tokens=12,
                                                                      stop_at_eos=False).ids
    first = free.index(free[4])  # a token whose first appearance is at step `first`
    config["eos_token_id"] = [next(i for i in range(64) if i not in free), free[4]]
    (directory / "config.json").write_text(json.dumps(config))
    stopped = inferno.load(directory, "numpy", download=False).generate([5, 9, 14], max_new_tokens=12)
    assert stopped.finish_reason == "stop" and stopped.ids[:first] == free[:first]
    assert len(stopped.ids) <= first + 1


def test_non_finite_logits_are_traced_to_the_llama_kernel_that_made_them(folders):
    from inferno.backends.checked import NonFiniteLogitsError

    class NanSilu(NumpyBackend):
        name = "nan-silu"

        def silu_mul(self, gate, up):
            return np.full_like(gate, np.nan)

    directory, _, _ = folders["qwen3"]
    model = load_model(directory / "config.json", directory, NanSilu())
    logits = model.backend.to_numpy(model.forward(np.asarray([IDS])))
    with pytest.raises(NonFiniteLogitsError) as e:
        model.check_logits(logits)
    assert e.value.cause == "backend" and e.value.kernel == "gated_mlp"
    assert "backend 'nan-silu'" in str(e.value)


def test_the_engines_prefix_cache_serves_a_llama_model(tmp_path):
    # Prompts sharing a prefix of more than one prefix-cache block: the later ones copy its keys and values
    # (n_kv_head heads) from the slot that holds them, and still get what they would get alone.
    from inferno.models.resolve import shipped_gpt2_file

    directory, _, _ = make_llama_dir(tmp_path, "qwen3")
    shutil.copy(shipped_gpt2_file("tokenizer.json"), directory / "tokenizer.json")
    pipe = inferno.load(directory, "numpy", download=False)
    shared = [(7 * i + 3) % 64 for i in range(20)]
    prompts = [shared + [1], shared + [2, 9], shared[:18]]
    alone = [pipe.generate(p, max_new_tokens=6, stop_at_eos=False).ids for p in prompts]
    engine = pipe.engine(slots=2)
    try:
        results = [pipe.submit(engine, p, max_new_tokens=6, stop_at_eos=False).result() for p in prompts]
        assert engine.stats.prefix_cache_hits >= 16
    finally:
        engine.close()
    assert [r.ids for r in results] == alone


def test_a_smaller_context_keeps_the_kv_cache_small(folders):
    from inferno.models.families import read_config

    directory, _, _ = folders["llama"]
    model = load_model(directory / "config.json", directory, NumpyBackend(), context=16)
    assert model.config.n_positions == 16 and model.config.max_position_embeddings == 64
    assert model.new_slots(2).layers[0][0][0].shape == (1, 2, 16, 6)
    with pytest.raises(ValueError, match="do not fit a KV cache of 16"):
        model.forward(np.asarray([list(range(17))]), model.new_cache())
    assert read_config(directory / "config.json", context=1000)[1].n_positions == 64  # at most the model's
