"""Seeded random GPT-2 models, in memory or written the way real checkpoints are: the one maker that
the tests, `inferno bench`, `-m random`, the conformance suite and the plugins' tests share.

Every tensor is random, biases and layer-norm gains/biases included, so dropping or swapping any tensor
changes the logits; random weights make gibberish by design.

* `random_weights` - weights of any shape (124M by default) whose next-token distribution is spread as
  real weights' is (`spread_logits`), so that sampling visibly differs from greedy decoding.
* `small_config` - a small `Gpt2Config`; `random_state_dict` - the draws every test model is made of.
* `write_hub_safetensors`, `write_save_pretrained_safetensors`, `write_config`, `make_model_dir` - the
  files as the Hub ships them (``openai-community/gpt2``: no prefix, ``h.{i}.attn.bias`` mask buffers,
  no ``lm_head.weight``) or as ``save_pretrained`` writes them (``transformer.`` prefix, a tied
  ``lm_head.weight``).
* `stored_values` - what arrays become stored as F16/BF16 (the loader's expected output).

Storage dtypes are ``"F32"``, ``"F16"`` and ``"BF16"``; numpy has no bfloat16, so BF16 files go through
`write_safetensors_raw`, a minimal writer that is also handy for crafting broken files.

The Llama family (`inferno.models.llama`) has its own maker: `llama_config` (one of `LLAMA_VARIANTS`:
GQA ratios, tied and untied heads, Qwen2's biases, Qwen3's q/k norms, an odd hidden size, rope
scalings), `llama_state_dict` (Hub names, torch's layout) and `make_llama_dir` (a folder as
``save_pretrained`` writes it, one file or shards with their index.json).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from inferno.models.config import GPT2_124M, Gpt2Config

DTYPES = ("F32", "F16", "BF16")


#: The spread (standard deviation over the vocabulary) of the next-token logits that random weights are
#: scaled to, and the standard deviation of their token embeddings (GPT-2's initializer_range): together
#: they make sampling at temperature 0.8 visibly differ from greedy decoding at any width. Random
#: weights make gibberish whatever the scale; this only keeps sampling from looking broken.
RANDOM_LOGIT_STD = 2.0
RANDOM_EMBEDDING_STD = 0.02


def spread_logits(
    weights: dict[str, np.ndarray], logit_std: float = RANDOM_LOGIT_STD,
    embedding_std: float = RANDOM_EMBEDDING_STD,
) -> dict[str, np.ndarray]:
    """Rescale random `weights` (returned; the two or three arrays changed are replaced, not modified)
    so that their next-token distribution is spread: ``wte`` to `embedding_std`, then ``ln_f``'s gain
    and bias so that the logits spread by about `logit_std` over the vocabulary.

    Two things make random GPT-2 weights decode one token forever, with sampling giving the greedy
    tokens: the LM head is tied to ``wte``, so a large embedding, which the residual stream carries to
    the last layer, gives the current token a large logit (the model repeats it); and the logits spread
    with the width (std ~15 at n_embd 768 for N(0, 0.5²) embeddings), so the top token takes all the
    probability. The logits are ``ln_f(x) @ wte.T`` and ln_f's output has a norm of about
    sqrt(sum(gain² + bias²)), so their spread is about that norm times the standard deviation of wte's
    entries; scaling ln_f (which nothing else reads) scales the logits alone.
    """
    wte = weights["wte.weight"]
    std = float(np.std(wte, dtype=np.float64))
    if embedding_std is not None and std > 0 and abs(std / embedding_std - 1) > 0.01:  # else no 2nd copy
        weights["wte.weight"] = wte * np.float32(embedding_std / std)
        std = embedding_std
    gain, bias = weights["ln_f.weight"], weights["ln_f.bias"]
    norm = float(np.sqrt(np.square(gain, dtype=np.float64).sum() + np.square(bias, dtype=np.float64).sum()))
    if norm * std > 0:
        factor = np.float32(logit_std / (norm * std))
        weights["ln_f.weight"] = gain * factor
        weights["ln_f.bias"] = bias * factor
    return weights


def small_config(
    *,
    vocab_size: int = 64,
    n_positions: int = 16,
    n_embd: int = 16,
    n_layer: int = 2,
    n_head: int = 2,
    layer_norm_epsilon: float = 1e-5,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
) -> Gpt2Config:
    """A small config; bos/eos default to the last token id (the 50256 default would not fit)."""
    last = vocab_size - 1
    return Gpt2Config(
        vocab_size=vocab_size,
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        layer_norm_epsilon=layer_norm_epsilon,
        bos_token_id=last if bos_token_id is None else bos_token_id,
        eos_token_id=last if eos_token_id is None else eos_token_id,
    )


def random_state_dict(
    config: Gpt2Config, seed: int = 0, *, logit_std: float | None = None, wpe_std: float = 0.3,
    attn_gain: float = 1.0, logit_gain: float = 1.0, draw_dtype: type = np.float64,
) -> dict[str, np.ndarray]:
    """Random float32 parameters keyed by canonical Hub names (no prefix, no lm_head, no mask buffers).

    Matrices are scaled by 1/sqrt(fan_in) so activations stay O(1) through the layers; gains are
    1 + noise and biases are noise, so each one visibly matters.

    ``wpe_std`` (the position embeddings' standard deviation) and ``attn_gain`` (a factor on the
    ``c_attn`` weights' scale, so on the attention scores' spread) make a model whose greedy text does
    not repeat itself: with the defaults the residual stream is dominated by the current token's
    embedding, the tied LM head then gives that token the largest logit, and greedy decoding writes
    2-5 distinct ids in 32 tokens (a stale-logits bug would be invisible). ``logit_gain`` multiplies
    ``ln_f``'s gain and bias, so the logits (greedy decoding does not change): the two others alone
    spread the next-token distribution over hundreds of tokens (entropy ~6.5 nats), where a sampled
    token lands in the long tail often enough that a float32 rounding difference between two code paths
    (a GEMM or a GEMV, a KV cache or a full recompute) flips it to a neighbouring id. Measured, the
    batching engine against batch 1, 1,920 draws at temperature 1: 5 flips at logit_gain 1, 2 at 2,
    none at 3; but the logits' float32 rounding grows with them, and from 2.5 logprobs of the two
    paths differ by more than 1e-5. 2 gives an entropy of ~2.3 nats, about what GPT-2 gives real text.
    ``DISTINCT`` (wpe_std 1.0, attn_gain 3.0, logit_gain 2.0: 25-32 distinct ids in 32 greedy tokens,
    and the next token depends on the context, not only on the position) is what the greedy golden
    model uses. The same draws are made whatever the values, in the same order, so the defaults give
    exactly the weights they always gave. ``draw_dtype=np.float32`` draws in float32 directly: other
    values, several times faster at the 124M shape (what `random_weights` does).

    ``logit_std`` (opt-in; e.g. ``RANDOM_LOGIT_STD``) rescales ``wte`` and ``ln_f``
    afterwards (`spread_logits`) so that the logits spread by about that much and the
    current token does not dominate them: at wide shapes the default weights give logits so far apart
    that sampling returns the greedy tokens. The default (None) result, which the committed goldens are
    made from, stays exactly as drawn.
    """
    rng = np.random.default_rng(seed)
    V, P, C = config.vocab_size, config.n_positions, config.n_embd

    def normal(shape: tuple[int, ...], scale: float) -> np.ndarray:
        a = rng.standard_normal(shape, dtype=draw_dtype)
        a *= scale
        return a.astype(np.float32, copy=False)

    def gain(n: int) -> np.ndarray:
        return (1.0 + rng.standard_normal(n, dtype=draw_dtype) * 0.2).astype(np.float32, copy=False)

    sd: dict[str, np.ndarray] = {
        "wte.weight": normal((V, C), 0.5),
        "wpe.weight": normal((P, C), wpe_std),
    }
    for i in range(config.n_layer):
        h = f"h.{i}."
        sd[h + "ln_1.weight"] = gain(C)
        sd[h + "ln_1.bias"] = normal((C,), 0.2)
        sd[h + "attn.c_attn.weight"] = normal((C, 3 * C), attn_gain * C**-0.5)
        sd[h + "attn.c_attn.bias"] = normal((3 * C,), 0.2)
        sd[h + "attn.c_proj.weight"] = normal((C, C), C**-0.5)
        sd[h + "attn.c_proj.bias"] = normal((C,), 0.2)
        sd[h + "ln_2.weight"] = gain(C)
        sd[h + "ln_2.bias"] = normal((C,), 0.2)
        sd[h + "mlp.c_fc.weight"] = normal((C, 4 * C), C**-0.5)
        sd[h + "mlp.c_fc.bias"] = normal((4 * C,), 0.2)
        sd[h + "mlp.c_proj.weight"] = normal((4 * C, C), (4 * C) ** -0.5)
        sd[h + "mlp.c_proj.bias"] = normal((C,), 0.2)
    sd["ln_f.weight"] = gain(C) * np.float32(logit_gain)
    sd["ln_f.bias"] = normal((C,), 0.2 * logit_gain)
    if logit_std is not None:
        spread_logits(sd, logit_std)
    return sd


#: `random_state_dict` keywords for a model whose greedy continuations do not repeat (see there).
DISTINCT: dict[str, float] = {"wpe_std": 1.0, "attn_gain": 3.0, "logit_gain": 2.0}


def spread_state_dict(
    config: Gpt2Config, seed: int = 0, draw_dtype: type = np.float64
) -> dict[str, np.ndarray]:
    """`random_state_dict` with logits spread as real weights' are (`RANDOM_LOGIT_STD`), for tests that
    sample: temperature 0.8 then visibly differs from greedy at any width."""
    return random_state_dict(config, seed, logit_std=RANDOM_LOGIT_STD, draw_dtype=draw_dtype)


def random_weights(config: Gpt2Config = GPT2_124M, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights for `config` (default: the 124M shape) under the canonical Hub names, with
    the next-token distribution spread (`spread_state_dict`): what `inferno bench` and `-m random` run."""
    return spread_state_dict(config, seed, np.float32)


# ------------------------------------------------------------------------------------ dtype helpers


def to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest even like torch does (no NaNs)."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def stored_values(a: np.ndarray, dtype: str) -> np.ndarray:
    """``a`` as it reads back (in float32) after being stored in ``dtype``."""
    if dtype == "F32":
        return np.asarray(a, dtype=np.float32)
    if dtype == "F16":
        return np.asarray(a, dtype=np.float32).astype(np.float16).astype(np.float32)
    if dtype == "BF16":
        return from_bf16_bits(to_bf16_bits(a))
    raise ValueError(f"unknown dtype {dtype!r}")


def stored_state_dict(sd: dict[str, np.ndarray], dtype: str) -> dict[str, np.ndarray]:
    return {k: stored_values(v, dtype) for k, v in sd.items()}


# ------------------------------------------------------------------------------------ file writers


def write_safetensors_raw(
    path: str | os.PathLike[str],
    entries: dict[str, tuple[str, tuple[int, ...], bytes]],
    metadata: dict[str, str] | None = None,
    *,
    header_override: dict[str, Any] | None = None,
) -> Path:
    """Write ``{name: (dtype, shape, raw little-endian bytes)}`` as a safetensors file.

    Data is laid out contiguously in the given order. ``header_override`` replaces header entries
    verbatim after layout, for crafting malformed files.
    """
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, (dtype, shape, data) in entries.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    if header_override:
        header.update(header_override)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the reference writer pads the header to 8 bytes
    path = Path(path)
    with open(path, "wb") as f:
        f.write(len(encoded).to_bytes(8, "little"))
        f.write(encoded)
        for _dtype, _shape, data in entries.values():
            f.write(data)
    return path


def _encode(a: np.ndarray, dtype: str) -> tuple[str, tuple[int, ...], bytes]:
    a = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "F32":
        data = a.astype("<f4").tobytes()
    elif dtype == "F16":
        data = a.astype("<f2").tobytes()
    elif dtype == "BF16":
        data = to_bf16_bits(a).astype("<u2").tobytes()
    else:
        raise ValueError(f"unknown dtype {dtype!r}")
    return dtype, a.shape, data


def save_tensors(path: str | os.PathLike[str], tensors: dict[str, np.ndarray], dtype: str = "F32") -> Path:
    """Write float arrays stored as ``dtype`` (F32/F16 via safetensors itself, BF16 via our raw writer)."""
    path = Path(path)
    if dtype in ("F32", "F16"):
        np_dtype = np.float32 if dtype == "F32" else np.float16
        save_file({k: np.ascontiguousarray(v, dtype=np_dtype) for k, v in tensors.items()}, str(path))
    else:
        write_safetensors_raw(path, {k: _encode(v, dtype) for k, v in tensors.items()})
    return path


def hub_layout(
    sd: dict[str, np.ndarray], config: Gpt2Config, *, masked_bias: bool = False
) -> dict[str, np.ndarray]:
    """The tensors of a Hub ``openai-community/gpt2`` file: no prefix, causal-mask buffers, no lm_head."""
    P = config.n_positions
    mask = np.tril(np.ones((P, P), dtype=np.float32)).reshape(1, 1, P, P)
    out = {k: v for k, v in sd.items() if k != "lm_head.weight"}
    for i in range(config.n_layer):
        out[f"h.{i}.attn.bias"] = mask
        if masked_bias:
            out[f"h.{i}.attn.masked_bias"] = np.array(-1e4, dtype=np.float32)
    return out


def save_pretrained_layout(
    sd: dict[str, np.ndarray], *, lm_head: np.ndarray | None = None, include_lm_head: bool = True
) -> dict[str, np.ndarray]:
    """``transformer.``-prefixed keys plus top-level ``lm_head.weight`` (tied to wte unless given)."""
    out = {"transformer." + k: v for k, v in sd.items() if k != "lm_head.weight"}
    if include_lm_head:
        out["lm_head.weight"] = sd["wte.weight"] if lm_head is None else lm_head
    return out


def write_hub_safetensors(
    path: str | os.PathLike[str],
    sd: dict[str, np.ndarray],
    config: Gpt2Config,
    dtype: str = "F32",
    *,
    masked_bias: bool = False,
) -> Path:
    return save_tensors(path, hub_layout(sd, config, masked_bias=masked_bias), dtype)


def write_save_pretrained_safetensors(
    path: str | os.PathLike[str],
    sd: dict[str, np.ndarray],
    dtype: str = "F32",
    *,
    lm_head: np.ndarray | None = None,
    include_lm_head: bool = True,
) -> Path:
    tensors = save_pretrained_layout(sd, lm_head=lm_head, include_lm_head=include_lm_head)
    return save_tensors(path, tensors, dtype)


def write_config(path: str | os.PathLike[str], config: Gpt2Config, **extra: Any) -> Path:
    """A Hub-style config.json for ``config`` (with the Hub's extra keys; ``extra`` adds or overrides)."""
    d = {
        "activation_function": config.activation_function,
        "architectures": ["GPT2LMHeadModel"],
        "attn_pdrop": 0.1,
        "bos_token_id": config.bos_token_id,
        "embd_pdrop": 0.1,
        "eos_token_id": config.eos_token_id,
        "initializer_range": 0.02,
        "layer_norm_epsilon": config.layer_norm_epsilon,
        "model_type": "gpt2",
        "n_ctx": config.n_positions,
        "n_embd": config.n_embd,
        "n_head": config.n_head,
        "n_layer": config.n_layer,
        "n_positions": config.n_positions,
        "resid_pdrop": 0.1,
        "vocab_size": config.vocab_size,
    }
    d.update(extra)
    path = Path(path)
    path.write_text(json.dumps(d, indent=2) + "\n")
    return path


def make_model_dir(
    directory: str | os.PathLike[str],
    config: Gpt2Config | None = None,
    *,
    seed: int = 0,
    layout: str = "hub",
    dtype: str = "F32",
) -> tuple[Path, Gpt2Config, dict[str, np.ndarray]]:
    """Write config.json and model.safetensors into ``directory`` (created if needed).

    Returns ``(directory, config, expected)`` where ``expected`` is the state dict as the loader
    should return it (values rounded through ``dtype``). No tokenizer.json is written.
    """
    config = config or small_config()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    sd = random_state_dict(config, seed)
    write_config(directory / "config.json", config)
    if layout == "hub":
        write_hub_safetensors(directory / "model.safetensors", sd, config, dtype)
    elif layout == "save_pretrained":
        write_save_pretrained_safetensors(directory / "model.safetensors", sd, dtype)
    else:
        raise ValueError(f"unknown layout {layout!r} (hub or save_pretrained)")
    return directory, config, stored_state_dict(sd, dtype)


# ------------------------------------------------------------------------- random Llama-family models

#: Small Llama-family configs, one per variant the forward pass has: GQA ratios 1, 2 and 4, tied and untied
#: LM heads, Qwen2's q/k/v biases, Qwen3's q/k norms, Llama's attention_bias, an odd hidden size (with an
#: explicit head_dim, as Mistral's), and both kinds of rope_scaling.
LLAMA_VARIANTS: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 2},
    "llama-mha-tied": {"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 4,
                       "tie_word_embeddings": True},
    "llama-gqa4-bias": {"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 1,
                        "attention_bias": True},
    "llama3-scaling": {"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 2,
                       "rope_theta": 500000.0, "tie_word_embeddings": True,
                       "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0, "original_max_position_embeddings": 16}},
    "llama-linear-scaling": {"model_type": "llama", "num_attention_heads": 2, "num_key_value_heads": 1,
                             "rope_scaling": {"type": "linear", "factor": 2.0}},
    "mistral-odd": {"model_type": "mistral", "hidden_size": 35, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "head_dim": 8, "sliding_window": None},
    "qwen2": {"model_type": "qwen2", "num_attention_heads": 4, "num_key_value_heads": 2,
              "tie_word_embeddings": True, "use_sliding_window": False, "sliding_window": 4096},
    "qwen3": {"model_type": "qwen3", "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 6},
}
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                  "qwen3": "Qwen3ForCausalLM"}


def llama_config(variant: str = "llama", **overrides: Any) -> dict[str, Any]:
    """A small Llama-family config.json object: `LLAMA_VARIANTS[variant]` over these defaults (24 wide,
    2 layers, 64 tokens, a context of 64), then `overrides`."""
    d: dict[str, Any] = {"vocab_size": 64, "hidden_size": 24, "intermediate_size": 40, "num_hidden_layers": 2,
                         "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                         "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 1,
                         "eos_token_id": 2}
    d.update(LLAMA_VARIANTS[variant])
    d.update(overrides)
    d["architectures"] = [_ARCHITECTURES[d["model_type"]]]
    return d


def llama_state_dict(config: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights of a Llama-family config.json object under the Hub's names, in torch's
    layout ([out, in] Linear weights), as ``save_pretrained`` writes them (no lm_head.weight when tied).
    Every tensor is random, norms' gains included (1 + noise), so each one visibly matters."""
    rng = np.random.default_rng(seed)
    c = config
    C, V, inner, n_layer = c["hidden_size"], c["vocab_size"], c["intermediate_size"], c["num_hidden_layers"]
    heads = c["num_attention_heads"]
    kv_heads = c.get("num_key_value_heads") or heads
    d = c.get("head_dim") or C // heads
    o_bias = bool(c.get("attention_bias")) and c["model_type"] in ("llama", "qwen3")
    qkv_bias = c["model_type"] == "qwen2" or o_bias

    def normal(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def gain(n: int) -> np.ndarray:
        return (1.0 + rng.standard_normal(n) * 0.2).astype(np.float32)

    # A tied LM head reads the embedding back: a small one keeps the current token from dominating the
    # logits (greedy decoding would repeat it forever).
    tied = c.get("tie_word_embeddings", False)
    sd = {"model.embed_tokens.weight": normal(V, C, scale=0.1 if tied else 1.0)}
    for i in range(n_layer):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = gain(C)
        sd[p + "self_attn.q_proj.weight"] = normal(heads * d, C, scale=2 * C**-0.5)
        sd[p + "self_attn.k_proj.weight"] = normal(kv_heads * d, C, scale=2 * C**-0.5)
        sd[p + "self_attn.v_proj.weight"] = normal(kv_heads * d, C, scale=C**-0.5)
        sd[p + "self_attn.o_proj.weight"] = normal(C, heads * d, scale=(heads * d) ** -0.5)
        if qkv_bias:
            sd[p + "self_attn.q_proj.bias"] = normal(heads * d, scale=0.2)
            sd[p + "self_attn.k_proj.bias"] = normal(kv_heads * d, scale=0.2)
            sd[p + "self_attn.v_proj.bias"] = normal(kv_heads * d, scale=0.2)
        if o_bias:
            sd[p + "self_attn.o_proj.bias"] = normal(C, scale=0.2)
        if c["model_type"] == "qwen3":
            sd[p + "self_attn.q_norm.weight"] = gain(d)
            sd[p + "self_attn.k_norm.weight"] = gain(d)
        sd[p + "post_attention_layernorm.weight"] = gain(C)
        sd[p + "mlp.gate_proj.weight"] = normal(inner, C, scale=C**-0.5)
        sd[p + "mlp.up_proj.weight"] = normal(inner, C, scale=C**-0.5)
        sd[p + "mlp.down_proj.weight"] = normal(C, inner, scale=inner**-0.5)
    sd["model.norm.weight"] = gain(C)
    if not tied:
        sd["lm_head.weight"] = normal(V, C, scale=C**-0.5)
    return sd


def make_llama_dir(directory: str | os.PathLike[str], config: dict[str, Any] | str = "llama", *,
                   seed: int = 0, shards: int = 1, dtype: str = "F32") -> tuple[Path, dict, dict]:
    """Write config.json and the weights of a random Llama-family model into `directory` as
    ``save_pretrained`` does: one model.safetensors, or `shards` files with a model.safetensors.index.json.
    `config` is a config.json object or a `LLAMA_VARIANTS` name. Returns (directory, config object, the
    state dict as the loader reads it back: values rounded through `dtype`, torch's layout)."""
    config = llama_config(config) if isinstance(config, str) else dict(config)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    sd = llama_state_dict(config, seed)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if shards <= 1:
        save_tensors(directory / "model.safetensors", sd, dtype)
    else:
        names = list(sd)
        weight_map = {}
        for k in range(shards):
            part = {n: sd[n] for n in names[k::shards]}
            file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            save_tensors(directory / file, part, dtype)
            weight_map.update(dict.fromkeys(part, file))
        index = {"metadata": {"total_size": sum(4 * a.size for a in sd.values())}, "weight_map": weight_map}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return directory, config, stored_state_dict(sd, dtype)


# ------------------------------------------------------------------ a Llama-family model with its tokenizer

#: The special tokens of `llama_tokenizer_files` (Llama 3's names), after the 256 byte tokens.
LLAMA_SPECIAL_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                        "<|eot_id|>")
#: A chat template in Llama 3's format (shorter: no date, no tools).
LLAMA_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>"
    "\n\n{{ message['content'] | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")


def _byte_chars() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes, in byte order (as `inferno.tokenizer` has them)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def llama_tokenizer_files(chat_template: str | None = LLAMA_CHAT_TEMPLATE) -> dict[str, bytes]:
    """A byte-level BPE tokenizer as a Llama 3 repo ships it, small: tokenizer.json (the 256 bytes, two
    merges, `LLAMA_SPECIAL_TOKENS` from id 256), tokenizer_config.json (BOS, EOS, the chat template when
    given) and generation_config.json (EOS ids 257 and 260, as Llama 3 Instruct lists two)."""
    chars = _byte_chars()
    vocab = {c: i for i, c in enumerate(chars)}
    merges = ["Ġ t", "h e"]
    added = [{"id": 256 + k, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for k, t in enumerate(LLAMA_SPECIAL_TOKENS)]
    vocab.update({"Ġt": 256 + len(added), "he": 257 + len(added)})
    tokenizer = {"version": "1.0", "added_tokens": added, "normalizer": None,
                 "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                   "use_regex": True},
                 "post_processor": None, "decoder": {"type": "ByteLevel"},
                 "model": {"type": "BPE", "vocab": vocab, "merges": merges}}
    config: dict[str, Any] = {"bos_token": LLAMA_SPECIAL_TOKENS[0], "eos_token": LLAMA_SPECIAL_TOKENS[4]}
    if chat_template is not None:
        config["chat_template"] = chat_template
    return {"tokenizer.json": json.dumps(tokenizer).encode(),
            "tokenizer_config.json": json.dumps(config).encode(),
            "generation_config.json": json.dumps({"bos_token_id": 256, "eos_token_id": [257, 260]}).encode()}


def make_llama_model(directory: str | os.PathLike[str], variant: str = "llama", *, seed: int = 0,
                     shards: int = 1, chat_template: str | None = LLAMA_CHAT_TEMPLATE,
                     **overrides: Any) -> Path:
    """A random Llama-family model that `inferno.load` takes, text in and out: `make_llama_dir` at a
    vocabulary of 264 with `llama_tokenizer_files` beside it (the chat template too, unless None)."""
    config = llama_config(variant, **{"vocab_size": 264, "bos_token_id": 256, "eos_token_id": [257, 260],
                                      **overrides})
    directory, _, _ = make_llama_dir(directory, config, seed=seed, shards=shards)
    for name, data in llama_tokenizer_files(chat_template).items():
        (directory / name).write_bytes(data)
    return directory
