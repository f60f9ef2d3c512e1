"""Live parity of the Llama family with Hugging Face transformers' LlamaForCausalLM, MistralForCausalLM,
Qwen2ForCausalLM and Qwen3ForCausalLM, in float64, on the same random weights (every variant of
`inferno.testing.LLAMA_VARIANTS`), on the numpy, array-api (array_api_strict) and cpu-threaded backends.

transformers' float64 models are not float64 throughout: RMSNorm computes in float32 and the rotary
angles come from float32 inverse frequencies and positions. So each comparison is made twice:

- as transformers runs: logits within 1e-5 of the largest |logit| (float32's rounding, no more);
- in float64 throughout: transformers' RMSNorm and rotary modules run the same formulas without the
  float32 casts, and our model takes transformers' (float32) inverse frequencies, so that the two agree
  to float64 rounding (1e-10). Our own inverse frequencies, rope scalings included, are checked against
  transformers' separately.

Run with ``python -m pytest -m oracle tests/test_llama_oracle.py`` (needs torch + transformers).
"""

from __future__ import annotations

import inspect
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import array_api_strict  # noqa: E402

from inferno.backends.array_api import ArrayApiBackend  # noqa: E402
from inferno.backends.numpy_backend import NumpyBackend  # noqa: E402
from inferno.backends.threaded import ThreadedBackend  # noqa: E402
from inferno.models.families import load_model  # noqa: E402
from inferno.models.llama import inverse_frequencies  # noqa: E402
from inferno.testing import LLAMA_VARIANTS, llama_config, make_llama_dir  # noqa: E402

pytestmark = pytest.mark.oracle

VARIANTS = list(LLAMA_VARIANTS)
BACKENDS = {
    "numpy": lambda: NumpyBackend("float64"),
    "array-api-strict": lambda: ArrayApiBackend(xp=array_api_strict, dtype="float64"),
    "cpu-threaded": lambda: ThreadedBackend(2, "float64", min_rows=1, min_macs=1, min_elements=1),
}
PROMPT = [3, 17, 42, 5, 63, 0, 9, 9, 28, 41, 7, 1, 60, 12, 33, 2, 50, 19, 4]
STEPS = 64


def _rms_norm64(self, hidden_states):
    """transformers' RMSNorm without its float32 cast."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _rotary64(self, x, position_ids):
    """transformers' rotary embedding with the angles in float64 (its inverse frequencies as they are)."""
    freqs = position_ids[..., None].to(torch.float64) * self.inv_freq.to(torch.float64)
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


def hf_model(directory, float64_throughout: bool):
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float64,
                                                              attn_implementation="sdpa").eval()
    if float64_throughout:
        for module in model.modules():
            name = type(module).__name__
            if name.endswith("RMSNorm"):
                module.forward = types.MethodType(_rms_norm64, module)
            elif name.endswith("RotaryEmbedding"):
                module.forward = types.MethodType(_rotary64, module)
    return model


def hf_inverse_frequencies(model) -> np.ndarray:
    return model.model.rotary_emb.inv_freq.to(torch.float64).numpy()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    # A context long enough for the prompt and 64 generated tokens.
    return {v: make_llama_dir(tmp_path_factory.mktemp(v), llama_config(v, max_position_embeddings=128),
                              seed=i) for i, v in enumerate(VARIANTS)}


def relative_error(ours, ref) -> float:
    return float(np.abs(np.asarray(ours, np.float64) - ref).max() / np.abs(ref).max())


def hf_logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


@pytest.mark.parametrize("variant", VARIANTS)
def test_inverse_frequencies_and_rope_scaling_match(folders, variant):
    directory, _, _ = folders[variant]
    ours = load_model(directory / "config.json", directory, NumpyBackend("float64"))
    hf = hf_model(directory, float64_throughout=False)
    np.testing.assert_allclose(inverse_frequencies(ours.config), hf_inverse_frequencies(hf), rtol=1e-6)


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("variant", VARIANTS)
def test_logits_match_transformers(folders, variant, backend):
    directory, _, _ = folders[variant]
    model = load_model(directory / "config.json", directory, BACKENDS[backend]())
    ours = np.from_dlpack(model.forward(np.asarray([PROMPT]), all_logits=True))[0]
    assert relative_error(ours, hf_logits(hf_model(directory, False), PROMPT)) < 1e-5
    exact = hf_model(directory, float64_throughout=True)
    model.inv_freq = hf_inverse_frequencies(exact)
    ours = np.from_dlpack(model.forward(np.asarray([PROMPT]), all_logits=True))[0]
    assert relative_error(ours, hf_logits(exact, PROMPT)) < 1e-10


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_ids_match_transformers_for_64_steps(folders, variant):
    directory, _, _ = folders[variant]
    model = load_model(directory / "config.json", directory, NumpyBackend("float64"))
    exact = hf_model(directory, float64_throughout=True)
    model.inv_freq = hf_inverse_frequencies(exact)
    cache, ours = model.new_cache(1, len(PROMPT) + STEPS), []
    logits = model.forward(np.asarray([PROMPT]), cache)
    for _ in range(STEPS):  # with the KV cache
        ours.append(int(np.argmax(logits[0])))
        logits = model.forward(np.asarray([[ours[-1]]]), cache)
    # transformers with its own KV cache (the keyword is `cache` from transformers 5.x on).
    keyword = "cache" if "cache" in inspect.signature(exact.forward).parameters else "past_key_values"
    theirs: list[int] = []
    with torch.no_grad():
        out = exact(torch.tensor([PROMPT]), use_cache=True)
        for _ in range(STEPS):
            theirs.append(int(out.logits[0, -1].argmax()))
            past = out.past_key_values if hasattr(out, "past_key_values") else out.cache
            out = exact(torch.tensor([[theirs[-1]]]), use_cache=True, **{keyword: past})
    assert ours == theirs


@pytest.mark.parametrize("variant", ["llama-gqa4-bias", "qwen3", "mistral-odd", "qwen2"])
def test_inspect_matches_transformers_attentions_and_hidden_states(folders, variant):
    from inferno.inspect import inspect_ids

    directory, _, _ = folders[variant]
    model = load_model(directory / "config.json", directory, NumpyBackend("float64"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float64,
                                                           attn_implementation="eager").eval()
    with torch.no_grad():
        out = hf(torch.tensor([PROMPT]), output_attentions=True, output_hidden_states=True)
    seen = inspect_ids(model, PROMPT, top=5)
    attentions = np.stack([a[0].numpy() for a in out.attentions])  # [L, H, T, T], softmax in float32
    assert np.abs(seen.attention - attentions).max() < 1e-5
    # The logit lens of layer l is the final norm and the LM head on the stream before block l; the
    # last one is the model's own distribution.
    with torch.no_grad():
        lens = [hf.lm_head(hf.model.norm(h))[0].numpy() for h in out.hidden_states[:-1]]
    lens.append(out.logits[0].numpy())
    for layer, logits in enumerate(lens):
        for j, pos in enumerate(seen.positions):
            probs = np.exp(logits[pos] - logits[pos].max())
            probs /= probs.sum()
            top = np.argsort(-probs)[:5]
            assert [i for i, _ in seen.logit_lens[layer][j]] == list(top)
            assert np.allclose([p for _, p in seen.logit_lens[layer][j]], probs[top], rtol=1e-5)


#: The real shapes of SmolLM2-135M and Qwen2.5-0.5B (random weights).
REAL_SHAPES = {
    "smollm2-135m": llama_config("llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                 num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                                 max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
                                 tie_word_embeddings=True),
    "qwen2.5-0.5b": llama_config("qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                                 num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                                 max_position_embeddings=32768, rope_theta=1000000.0,
                                 tie_word_embeddings=True, sliding_window=32768, use_sliding_window=False),
}


@pytest.mark.heavy
@pytest.mark.parametrize("shape", list(REAL_SHAPES))
def test_logits_match_transformers_at_real_shapes(tmp_path, shape):
    directory, _, _ = make_llama_dir(tmp_path, REAL_SHAPES[shape], seed=7)
    model = load_model(directory / "config.json", directory, NumpyBackend("float64"))
    exact = hf_model(directory, float64_throughout=True)
    model.inv_freq = hf_inverse_frequencies(exact)
    prompt = [11, 4000, 17, 42, 9, 30000, 5, 123]
    ours = np.from_dlpack(model.forward(np.asarray([prompt]), all_logits=True))[0]
    assert relative_error(ours, hf_logits(exact, prompt)) < 1e-10


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_config_transformers_writes_reads_the_same(folders, variant, tmp_path):
    # transformers 5 writes `rope_parameters` (and a null rope_theta) where 4 wrote rope_theta/rope_scaling.
    from inferno.models.llama import LlamaConfig

    directory, _, _ = folders[variant]
    transformers.AutoConfig.from_pretrained(directory).save_pretrained(tmp_path)
    assert LlamaConfig.from_file(tmp_path / "config.json") == LlamaConfig.from_file(directory / "config.json")
