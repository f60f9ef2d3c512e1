"""The Llama family (Llama 2/3, SmolLM2, Mistral, Qwen2/2.5, Qwen3), written once against the `Backend`
protocol.

    x = embed_tokens[ids]
    for each block:  x = x + attn(rms_norm(x))     (GQA: n_kv_head key/value heads shared by the query
                                                     heads; rotary positions on q and k; Qwen2: q/k/v
                                                     biases; Qwen3: an RMS norm on each q and k head)
                     x = x + mlp(rms_norm(x))      (down(silu(gate(x)) * up(x)))
    logits = rms_norm(x) @ lm_head.T               (lm_head is embed_tokens when tied)

Three parts, as gpt2.py has them: the config (`LlamaConfig`, read from config.json; a field that would
change the maths and is not implemented is refused in one line naming it), the weight plan (`tensor_plan`:
the Hub's tensor names, torch's ``[out, in]`` Linear weights handed to the backend as ``[in, out]``, a
transposed view and no copy) and the forward pass (`Llama`).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from inferno.backends.base import Array, Backend
from inferno.backends.checked import CheckedBackend
from inferno.kv import KvCache, KvSlots, forward_start, last_tokens, new_cache, new_slots, pack_rows
from inferno.models.config import ConfigError, read_config_json
from inferno.models.weights import TensorInfo, TensorPlan, iter_planned, plan_problems

# ------------------------------------------------------------------------------------------------ config

#: model_type → (the transformers class, whether q/k/v carry biases whatever attention_bias says, and
#: whether each q and k head is RMS-normed).
MODEL_TYPES = {
    "llama": ("LlamaForCausalLM", False, False),
    "mistral": ("MistralForCausalLM", False, False),
    "qwen2": ("Qwen2ForCausalLM", True, False),
    "qwen3": ("Qwen3ForCausalLM", False, True),
}
ROPE_TYPES = ("default", "linear", "llama3")
_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "max_position_embeddings")
#: The largest size a config may hold: far beyond any real one, small enough that nothing the loader builds
#: before comparing the config with the weights can take long or much memory.
LIMITS = {"vocab_size": 1 << 24, "hidden_size": 1 << 16, "intermediate_size": 1 << 20,
          "num_hidden_layers": 1024, "num_attention_heads": 1 << 12, "num_key_value_heads": 1 << 12,
          "head_dim": 1 << 12, "max_position_embeddings": 1 << 24}
#: Fields of related architectures that change the maths, with the value under which ours is the same.
_REFUSED = {"mlp_bias": False, "partial_rotary_factor": 1.0, "attn_logit_softcapping": None,
            "final_logit_softcapping": None, "logits_scaling": 1.0, "embedding_multiplier": 1.0,
            "residual_multiplier": 1.0, "attention_multiplier": None, "query_pre_attn_scalar": None,
            "num_local_experts": 0, "num_experts": 0, "use_qk_norm": False, "attention_chunk_size": None,
            "no_rope_layers": None}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class LlamaConfig:
    """The hyper-parameters of a Llama-family model, under config.json's names; `from_dict` reads them.

    The layers above the model read GPT-2's names (`n_embd`, `n_layer`, `n_head`, `n_positions`,
    `eos_token_id`): they are properties here. `n_positions` is the context served, at most
    `max_position_embeddings` (a smaller one keeps the KV cache small)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    context: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    # The names the layers above the model read (see inferno.models.causal_lm.ModelConfig).
    @property
    def n_embd(self) -> int:
        return self.hidden_size

    @property
    def n_layer(self) -> int:
        return self.num_hidden_layers

    @property
    def n_head(self) -> int:
        return self.num_attention_heads

    @property
    def n_kv_head(self) -> int:
        return self.num_key_value_heads

    @property
    def n_positions(self) -> int:
        return self.context

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    def to_dict(self) -> dict[str, Any]:
        """A config.json object for this config (round-trips through `from_dict`, given the same
        `context`)."""
        d = {k: v for k, v in asdict(self).items() if k not in ("context", "qkv_bias", "o_bias", "qk_norm",
                                                                 "eos_token_ids")}
        d["architectures"] = [MODEL_TYPES[self.model_type][0]]
        d["hidden_act"] = "silu"
        eos = self.eos_token_ids
        d["eos_token_id"] = eos[0] if len(eos) == 1 else list(eos) if eos else None
        if self.model_type in ("llama", "qwen3"):
            d["attention_bias"] = self.o_bias
        return d

    @classmethod
    def from_dict(cls, d: Any, source: str = "(dict)", context: int | None = None) -> LlamaConfig:
        """Validate a parsed config.json; every problem is listed in one `ConfigError` naming `source`.
        `context` caps the positions served (default: max_position_embeddings)."""
        if not isinstance(d, dict):
            raise ConfigError(source, [f"expected a JSON object, found {type(d).__name__}"], "Llama")
        if context is not None and not (_is_int(context) and context > 0):
            raise ValueError(f"context must be a positive number of positions, not {context!r:.40}")
        problems = _problems(d)
        if problems:
            raise ConfigError(source, problems, "Llama")
        model_type = d["model_type"]
        _, always_qkv_bias, qk_norm = MODEL_TYPES[model_type]
        heads = d["num_attention_heads"]
        kv_heads = d.get("num_key_value_heads") or heads
        head_dim = d.get("head_dim") or d["hidden_size"] // heads
        bias = bool(d.get("attention_bias", False)) and model_type in ("llama", "qwen3")
        eos = d.get("eos_token_id")
        eos_ids = () if eos is None else (eos,) if _is_int(eos) else tuple(eos)
        theta, scaling = _rope(d)
        limit = d["max_position_embeddings"]
        served = limit if context is None else min(context, limit)
        window = _sliding_window(d)
        if window is not None and window < served:
            raise ConfigError(source, [f"'sliding_window' {window} is smaller than the context of {served} "
                                       "positions: sliding-window attention is not supported (serve a "
                                       f"context of at most {window})"], "Llama")
        return cls(model_type, d["vocab_size"], d["hidden_size"], d["intermediate_size"],
                   d["num_hidden_layers"], heads, kv_heads, head_dim, limit, served,
                   float(d.get("rms_norm_eps") or 1e-6), theta, scaling,
                   bool(d.get("tie_word_embeddings", False)), bias or always_qkv_bias, bias, qk_norm,
                   d.get("bos_token_id"), eos_ids)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], context: int | None = None) -> LlamaConfig:
        return cls.from_dict(read_config_json(path, "Llama"), os.fspath(path), context)


def _rope(d: dict) -> tuple[float, dict | None]:
    """rope_theta and the scaling (None for plain RoPE), from transformers 4's `rope_theta` and
    `rope_scaling` or transformers 5's `rope_parameters` (checked by `_problems`)."""
    params = d.get("rope_parameters") or {}
    scaling = d.get("rope_scaling") or (params if params.get("rope_type", "default") != "default" else None)
    theta = params.get("rope_theta", d.get("rope_theta", 10000.0))
    if scaling is not None:
        scaling = dict(scaling)
        scaling["rope_type"] = scaling.get("rope_type", scaling.get("type"))
        scaling.pop("type", None)
        scaling.pop("rope_theta", None)
        if scaling["rope_type"] == "default":
            scaling = None
    return float(theta if theta is not None else 10000.0), scaling


def _sliding_window(d: dict) -> int | None:
    """The attention window, or None for full attention (Qwen's unless use_sliding_window; Mistral's
    when null; transformers' MistralConfig defaults to 4096 when the field is absent)."""
    if d["model_type"] in ("qwen2", "qwen3"):
        return d.get("sliding_window") if d.get("use_sliding_window") else None
    if d["model_type"] == "mistral":
        return d.get("sliding_window", 4096)
    return None


def _problems(d: dict) -> list[str]:
    """Every problem of a config.json object (one line each, naming the field)."""
    model_type = d.get("model_type")
    if model_type not in MODEL_TYPES:
        return [f"'model_type' is {str(model_type)[:40]!r}, expected one of {', '.join(MODEL_TYPES)}"]
    problems = []
    missing = [k for k in _REQUIRED if k not in d]
    if missing:
        problems.append("missing key(s): " + ", ".join(f"'{k}'" for k in missing))
    sizes = {}
    for key in (*_REQUIRED, "num_key_value_heads", "head_dim"):
        value = d.get(key)
        if value is None:
            continue
        if not _is_int(value) or not 0 < value <= LIMITS[key]:
            problems.append(f"'{key}' must be an integer in [1, {LIMITS[key]}], found {str(value)[:40]}")
        else:
            sizes[key] = value
    heads = sizes.get("num_attention_heads")
    kv = sizes.get("num_key_value_heads", heads)
    if heads and kv and heads % kv:
        problems.append(f"'num_attention_heads' ({heads}) must be a multiple of 'num_key_value_heads' ({kv})")
    if heads and "hidden_size" in sizes and "head_dim" not in sizes and sizes["hidden_size"] % heads:
        problems.append(f"'hidden_size' ({sizes['hidden_size']}) must be divisible by 'num_attention_heads' "
                        f"({heads}) when 'head_dim' is not given")
    head_dim = sizes.get("head_dim") or (sizes["hidden_size"] // heads if heads and "hidden_size" in sizes
                                          else 2)
    if head_dim % 2:
        problems.append(f"the head size ({head_dim}, 'head_dim') must be even: rotary embeddings rotate "
                        "pairs")
    act = d.get("hidden_act", "silu")
    if act != "silu":
        problems.append(f"'hidden_act' {str(act)[:40]!r} is not supported (supported: silu)")
    eps = d.get("rms_norm_eps")
    if eps is not None and not (_is_number(eps) and 0 < eps <= 1):
        problems.append(f"'rms_norm_eps' must be a number in (0, 1], found {str(eps)[:40]}")
    for key in ("tie_word_embeddings", "attention_bias", "use_sliding_window"):
        if key in d and d[key] is not None and not isinstance(d[key], bool):
            problems.append(f"'{key}' must be true or false, found {str(d[key])[:40]}")
    vocab = sizes.get("vocab_size", LIMITS["vocab_size"])
    for key in ("bos_token_id", "pad_token_id"):
        if d.get(key) is not None and not (_is_int(d[key]) and 0 <= d[key] < vocab):
            problems.append(f"'{key}' must be an id below 'vocab_size' ({vocab}) or null, found "
                            f"{str(d[key])[:40]}")
    eos = d.get("eos_token_id")
    if eos is not None and not ((_is_int(eos) and 0 <= eos < vocab) or (
            isinstance(eos, list) and eos and all(_is_int(e) and 0 <= e < vocab for e in eos))):
        problems.append(f"'eos_token_id' must be an id below 'vocab_size' ({vocab}) or a list of them, found "
                        f"{str(eos)[:40]}")
    window = _sliding_window(d)
    if window is not None and not (_is_int(window) and window > 0):
        problems.append(f"'sliding_window' must be a positive integer or null, found {str(window)[:40]}")
    layer_types = d.get("layer_types")
    if layer_types is not None and any(t != "full_attention" for t in layer_types or ()) \
            and window is not None:
        problems.append("'layer_types' holds sliding-window layers: not supported")
    for key, same in _REFUSED.items():
        if key in d and d[key] != same and not (same is None and d[key] is None):
            problems.append(f"'{key}' {str(d[key])[:40]} is not supported (only {same})")
    problems.extend(_rope_problems(d))
    return problems


def _rope_problems(d: dict) -> list[str]:
    for key in ("rope_scaling", "rope_parameters"):
        if d.get(key) is not None and not isinstance(d[key], dict):
            return [f"'{key}' must be an object or null, found {str(d[key])[:40]}"]
    try:
        theta, scaling = _rope(d)
    except (TypeError, ValueError):
        return ["'rope_theta' must be a positive number"]
    if not (theta > 0 and math.isfinite(theta)):
        return [f"'rope_theta' must be a positive number, found {theta}"]
    if scaling is None:
        return []
    kind = scaling["rope_type"]
    field_name = "rope_scaling" if d.get("rope_scaling") else "rope_parameters"
    if kind not in ROPE_TYPES:
        return [f"'{field_name}' of type {str(kind)[:30]!r} is not supported (supported: linear, llama3)"]
    needs = ("factor",) if kind == "linear" else ("factor", "low_freq_factor", "high_freq_factor",
                                                  "original_max_position_embeddings")
    bad = [k for k in needs if not (_is_number(scaling.get(k)) and scaling[k] > 0)]
    if bad:
        return [f"'{field_name}' of type {kind!r} needs a positive '{bad[0]}'"]
    if kind == "llama3" and scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        return [f"'{field_name}': 'high_freq_factor' must be larger than 'low_freq_factor'"]
    return []


def inverse_frequencies(config: LlamaConfig) -> np.ndarray:
    """RoPE's inverse frequencies [head_dim / 2] in float64, with the `rope_scaling` of the config
    (transformers' `_compute_default_rope_parameters`, `_compute_linear_scaling_rope_parameters`,
    `_compute_llama3_parameters`)."""
    d = config.head_dim
    inv = 1.0 / config.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    s = config.rope_scaling
    if s is None:
        return inv
    if s["rope_type"] == "linear":
        return inv / s["factor"]
    factor, low, high, old = s["factor"], s["low_freq_factor"], s["high_freq_factor"], \
        s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > old / low, inv / factor, inv)  # long wavelengths: slowed down by factor
    smooth = (old / wavelen - low) / (high - low)
    medium = (wavelen >= old / high) & (wavelen <= old / low)  # between the two: interpolated
    return np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


# ------------------------------------------------------------------------------------------- weight plan

#: A block's tensors under their Hub names (after ``model.layers.{i}.``), in `Block`'s field order; None
#: for one this config does not have.
BLOCK_TENSORS = ("input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.q_proj.bias",
                 "self_attn.k_proj.weight", "self_attn.k_proj.bias", "self_attn.v_proj.weight",
                 "self_attn.v_proj.bias", "self_attn.o_proj.weight", "self_attn.o_proj.bias",
                 "self_attn.q_norm.weight", "self_attn.k_norm.weight", "post_attention_layernorm.weight",
                 "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")


def tensor_plan(config: LlamaConfig) -> TensorPlan:
    """Every tensor of a checkpoint of `config` with its shape in the file (torch's layout), which are
    handed over transposed (the Linear weights), and which are left unread (a tied lm_head.weight,
    rotary buffers of old checkpoints)."""
    c = config
    C, V, inner = c.hidden_size, c.vocab_size, c.intermediate_size
    q, kv = c.n_head * c.head_dim, c.n_kv_head * c.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, C)}
    for i in range(c.n_layer):
        p = f"model.layers.{i}."
        layer = {"input_layernorm.weight": (C,), "self_attn.q_proj.weight": (q, C),
                 "self_attn.k_proj.weight": (kv, C), "self_attn.v_proj.weight": (kv, C),
                 "self_attn.o_proj.weight": (C, q), "post_attention_layernorm.weight": (C,),
                 "mlp.gate_proj.weight": (inner, C), "mlp.up_proj.weight": (inner, C),
                 "mlp.down_proj.weight": (C, inner)}
        if c.qkv_bias:
            layer.update({"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,),
                          "self_attn.v_proj.bias": (kv,)})
        if c.o_bias:
            layer["self_attn.o_proj.bias"] = (C,)
        if c.qk_norm:
            layer.update({"self_attn.q_norm.weight": (c.head_dim,), "self_attn.k_norm.weight": (c.head_dim,)})
        shapes.update({p + k: s for k, s in layer.items()})
    shapes["model.norm.weight"] = (C,)
    ignored = r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq"
    if c.tie_word_embeddings:
        ignored += r"|lm_head\.weight"
    else:
        shapes["lm_head.weight"] = (V, C)
    transposed = frozenset(n for n in shapes if n.endswith("_proj.weight"))
    return TensorPlan(shapes, transposed, re.compile(ignored), "Llama")


# ------------------------------------------------------------------------------------------------- model


@dataclass
class Block:
    input_norm: Array
    q_w: Array  # the projections as [in, out]
    q_b: Array | None
    k_w: Array
    k_b: Array | None
    v_w: Array
    v_b: Array | None
    o_w: Array
    o_b: Array | None
    q_norm: Array | None  # Qwen3: an RMS norm over each head's D values of q and of k
    k_norm: Array | None
    post_norm: Array
    gate_w: Array
    up_w: Array
    down_w: Array


@dataclass
class Llama:
    config: LlamaConfig
    backend: Backend
    embed_tokens: Array
    blocks: list[Block]
    norm: Array
    lm_head_w: Array  # embed_tokens itself when the embeddings are tied
    kernels: CheckedBackend = field(default=None, repr=False, compare=False)  # type: ignore[assignment]
    inv_freq: np.ndarray = field(default=None, repr=False, compare=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.kernels is None:
            self.kernels = CheckedBackend(self.backend, self.config.n_embd, self.config.vocab_size)
        if self.inv_freq is None:
            self.inv_freq = inverse_frequencies(self.config)

    @classmethod
    def from_weights(cls, config: LlamaConfig,
                     weights: Mapping[str, np.ndarray] | Iterable[tuple[str, np.ndarray]],
                     backend: Backend) -> Llama:
        """Convert host weights (Hub names; the Linear weights already ``[in, out]``, as `iter_weights`
        gives them) to backend arrays, once, each as it arrives."""
        kernels = CheckedBackend(backend, config.n_embd, config.vocab_size)
        pairs = weights.items() if isinstance(weights, Mapping) else weights
        w: dict[str, Array] = {}
        for name, host in pairs:
            w[name] = kernels.prepare_weight(name, host)
            del host
        blocks = []
        for i in range(config.n_layer):
            p = f"model.layers.{i}."
            optional = {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias",
                        "self_attn.o_proj.bias", "self_attn.q_norm.weight", "self_attn.k_norm.weight"}
            blocks.append(Block(*(w.get(p + n) if n in optional else w[p + n] for n in BLOCK_TENSORS)))
        embed = w["model.embed_tokens.weight"]
        head = embed if config.tie_word_embeddings else w["lm_head.weight"]
        return cls(config, backend, embed, blocks, w["model.norm.weight"], head, kernels)

    def named_weights(self) -> Iterator[tuple[str, Array]]:
        """Every weight the model holds, under its Hub name (``lm_head.weight`` only when not tied)."""
        yield "model.embed_tokens.weight", self.embed_tokens
        for i, blk in enumerate(self.blocks):
            for name, a in zip(BLOCK_TENSORS, vars(blk).values(), strict=True):
                if a is not None:
                    yield f"model.layers.{i}.{name}", a
        yield "model.norm.weight", self.norm
        if self.lm_head_w is not self.embed_tokens:
            yield "lm_head.weight", self.lm_head_w

    def new_cache(self, batch: int = 1, capacity: int | None = None) -> KvCache:
        """An empty KV cache (n_kv_head heads) for `batch` sequences of up to `capacity` tokens."""
        return new_cache(self.kernels, self.config, batch, capacity)

    def new_slots(self, n_slots: int) -> KvSlots:
        return new_slots(self.kernels, self.config, n_slots)

    def check_logits(self, logits: np.ndarray, rows: int = 1) -> np.ndarray:
        return self.kernels.check_logits(logits, rows, self)

    def rotary(self, be, positions: np.ndarray) -> tuple[Array, Array]:
        """cos and sin of each position's angles, [T, head_dim / 2], computed in float64 on the host once a
        forward pass and shared by every layer."""
        angles = np.asarray(positions, dtype=np.float64)[:, None] * self.inv_freq[None, :]
        return be.from_numpy(np.cos(angles)), be.from_numpy(np.sin(angles))

    def qkv(self, be, blk: Block, h: Array, cos: Array, sin: Array) -> tuple[Array, Array, Array]:
        """q [B, n_head, T, D], k and v [B, n_kv_head, T, D] of the normed stream h, q and k rotated."""
        c = self.config
        q, k, v = be.linears(h, [blk.q_w, blk.k_w, blk.v_w], [blk.q_b, blk.k_b, blk.v_b])
        q, k, v = be.heads(q, c.n_head), be.heads(k, c.n_kv_head), be.heads(v, c.n_kv_head)
        if blk.q_norm is not None:
            q, k = be.rms_norm(q, blk.q_norm, c.rms_norm_eps), be.rms_norm(k, blk.k_norm, c.rms_norm_eps)
        return be.rotary(q, cos, sin), be.rotary(k, cos, sin), v

    def embed(self, be, ids: np.ndarray) -> Array:
        """The token embedding of ids [B, T]: block 0's input."""
        return be.embed_tokens(self.embed_tokens, be.from_numpy(np.asarray(ids, dtype=np.int64)))

    def attention_layer(self, be, i: int, h: Array, cache: KvCache, offset: int, weights: bool = False
                        ) -> Array | tuple[Array, np.ndarray]:
        """Block i's attention of the normed stream h at `offset`, written to `cache`, o_proj applied; with
        `weights`, also its host float32 attention weights [B, n_head, T, offset + T] (for inspect: each
        query head's own, read through its key/value head)."""
        blk, c = self.blocks[i], self.config
        cos, sin = self.rotary(be, np.arange(offset, offset + h.shape[1]))
        q, k, v = self.qkv(be, blk, h, cos, sin)
        k_cache, v_cache = be.write_kv(*cache.layers[i], k, v, offset)
        cache.layers[i] = (k_cache, v_cache)
        out = be.linear(be.merge_heads(be.gqa_attention(q, k_cache, v_cache, offset)), blk.o_w, blk.o_b)
        if not weights:
            return out
        r, (b, _, t, _) = c.n_head // c.n_kv_head, q.shape
        w = np.empty((b, c.n_head, t, offset + t), dtype=np.float32)
        for j in range(r):  # query heads j, j + r, ... read key/value heads 0, 1, ...
            w[:, j::r] = be.attention_weights(q[:, j::r, :, :], k_cache, offset)
        return out, w

    def _blocks(self, be, x: Array, attend: Callable, keep: Callable) -> Array | None:
        for i in range(len(self.blocks) - 1):
            x = self.block(be, i, x, attend)
        return self.block(be, len(self.blocks) - 1, x, attend, keep)

    def block(self, be, i: int, x: Array, attend: Callable[[int, Block, Array], Array],
              keep: Callable[[Array], Array | None] = lambda x: x) -> Array | None:
        """Block i: ``x + attn(rms_norm(x))``, then ``+ mlp(rms_norm(x))``; `attend` and `keep` as in
        `Gpt2.block`. `attend(i, block, h)` returns the attention's output, o_proj applied."""
        blk, eps = self.blocks[i], self.config.rms_norm_eps
        if (x := keep(be.add(x, attend(i, blk, be.rms_norm(x, blk.input_norm, eps))))) is None:
            return None
        h = be.rms_norm(x, blk.post_norm, eps)
        return be.add(x, be.gated_mlp(h, blk.gate_w, blk.up_w, blk.down_w))

    def logits(self, be, x: Array) -> Array:
        return be.lm_head(be.rms_norm(x, self.norm, self.config.rms_norm_eps), self.lm_head_w)

    def forward(self, ids: np.ndarray, cache: KvCache | None = None, *, all_logits: bool = False,
                last: int | None = None) -> Array:
        """As `Gpt2.forward`: logits [B, V] of the last position, [B, last, V] or [B, T, V]."""
        be = self.kernels.kernels("forward")
        ids, cache, offset, keep = forward_start(self, ids, cache, last, all_logits)
        t = ids.shape[1]
        cos, sin = self.rotary(be, np.arange(offset, offset + t))

        def attend(i: int, blk: Block, h: Array) -> Array:
            q, k, v = self.qkv(be, blk, h, cos, sin)
            k_cache, v_cache = be.write_kv(*cache.layers[i], k, v, offset)
            cache.layers[i] = (k_cache, v_cache)
            return be.linear(be.merge_heads(be.gqa_attention(q, k_cache, v_cache, offset)), blk.o_w, blk.o_b)

        def kept(x: Array) -> Array:
            return x if keep == t else x[:, t - keep :, :]

        x = self._blocks(be, self.embed(be, ids), attend, kept)
        cache.length = offset + t
        return self.logits(be, x if all_logits or last is not None else x[:, 0, :])

    def forward_ragged(self, rows: Sequence[tuple[Sequence[int], int, int]], slots: KvSlots,
                       logits_for: Sequence[int] | None = None) -> Array:
        """As `Gpt2.forward_ragged`: rows of (new token ids, slot, offset) in one step; logits of the last
        `logits_for[r]` tokens of each row (True: its last)."""
        be, c = self.kernels.kernels("forward_ragged"), self.config
        logits_for = [True] * len(rows) if logits_for is None else list(logits_for)
        ids, positions, packed = pack_rows(rows, slots)
        cos, sin = self.rotary(be, np.asarray(positions))

        def attend(i: int, blk: Block, h: Array) -> Array:
            q, k, v = self.qkv(be, blk, h, cos, sin)
            y = be.ragged_gqa_attention(q, k, v, slots.layers[i], packed)  # each row over its own slot
            return be.linear(be.merge_heads(y), blk.o_w, blk.o_b)

        def kept(x: Array) -> Array | None:  # the last token of each row that is sampled
            return last_tokens(be, x, packed, logits_for)

        x = self._blocks(be, self.embed(be, np.asarray([ids])),
                         attend, kept)
        if x is None:
            return be.from_numpy(np.zeros((0, c.vocab_size), dtype=np.float32))
        return self.logits(be, x)[0, :, :]


# ------------------------------------------------------------------ the family's entry points (families.py)


def config_from_file(path: str | os.PathLike[str], context: int | None = None) -> LlamaConfig:
    return LlamaConfig.from_file(path, context)


def iter_weights(path: str | os.PathLike[str], config: LlamaConfig,
                 order: Callable[[str], str] | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """The checkpoint's tensors one at a time (see `inferno.models.weights.iter_planned`)."""
    return iter_planned(path, tensor_plan(config), order)


def header_problems(config: LlamaConfig, tensors: Iterable[TensorInfo], whole: bool = True) -> list[str]:
    """What is wrong with a checkpoint's tensors (of one shard when not `whole`) for `config`."""
    return plan_problems(tensor_plan(config), tensors, whole)


def from_weights(config: LlamaConfig, weights: Any, backend: Backend) -> Llama:
    return Llama.from_weights(config, weights, backend)


def from_state_dict(config: LlamaConfig, state_dict: Mapping[str, np.ndarray], backend: Backend) -> Llama:
    """A model from a state dict in the Hub's names and torch's layout (as the file holds it, as
    `inferno.testing.llama_state_dict` makes it): the Linear weights are handed over transposed."""
    plan = tensor_plan(config)
    return Llama.from_weights(config, ((n, a.T if n in plan.transposed else a) for n, a in state_dict.items()
                                       if n in plan.shapes), backend)
