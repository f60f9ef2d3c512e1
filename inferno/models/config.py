"""GPT-2 hyper-parameters, read from a Hugging Face ``config.json`` and validated up front.

Everything wrong with a config is collected and reported in one :class:`ConfigError`, so a user
fixing a hand-edited file sees every problem at once instead of one per run.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from typing import Any

from inferno.files import parse_json, read_regular_file

__all__ = [
    "ConfigError",
    "Gpt2Config",
    "DEFAULT_EOS_TOKEN_ID",
    "SUPPORTED_ACTIVATIONS",
    "LIMITS",
]

# GPT-2's "<|endoftext|>"; the Hub config has it, hand-written ones often leave it out.
DEFAULT_EOS_TOKEN_ID = 50256
DEFAULT_BOS_TOKEN_ID = 50256
DEFAULT_LAYER_NORM_EPSILON = 1e-5
# The forward pass implements the tanh approximation of GELU only.
SUPPORTED_ACTIVATIONS = ("gelu_new",)

_REQUIRED_SIZES = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")

# The largest value of each size a GPT-2-family config may hold. Far beyond any real one (GPT-2 XL: 50257,
# 1024, 1600, 48, 25), but small enough that nothing the loader does before it compares the config with
# the weights file (one header entry per tensor, 12 tensors per layer) can take long or much memory: a
# hostile "n_layer": 10**9 is one line, not minutes and gigabytes.
LIMITS = {
    "vocab_size": 1 << 24,
    "n_positions": 1 << 20,
    "n_embd": 1 << 16,
    "n_layer": 1024,
    "n_head": 1 << 16,
}
# float32 computes with the epsilon: below its smallest normal number it vanishes (a zero-variance row
# then divides by zero), and far above 1 it is no longer an epsilon (1e308 overflows float32 to inf).
_MIN_EPSILON = float.fromhex("0x1p-126")  # 1.18e-38, float32's smallest normal
_MAX_EPSILON = 1.0
# config.json is under a kilobyte; anything this big is not one (and is not read into memory).
MAX_CONFIG_BYTES = 1 << 20


class ConfigError(ValueError):
    """A GPT-2 config that cannot be used; ``problems`` lists each one, ``source`` names the file."""

    def __init__(self, source: str, problems: list[str], family: str = "GPT-2") -> None:
        self.source = source
        self.problems = list(problems)
        if len(self.problems) == 1:
            message = f"invalid {family} config {source}: {self.problems[0]}"
        else:
            lines = "".join(f"\n  - {p}" for p in self.problems)
            message = f"invalid {family} config {source}: {len(self.problems)} problems:{lines}"
        super().__init__(message)


def _is_int(value: Any) -> bool:
    # bool is a subclass of int in Python, but `"n_layer": true` is a mistake, not 1.
    return isinstance(value, int) and not isinstance(value, bool)


def _show(value: Any) -> str:
    """repr(value), short: a huge integer is described (repr of one over 4300 digits raises), and so is a
    value too deeply nested to print."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**18:
        digits = int(abs(value).bit_length() * math.log10(2)) + 1
        return f"{'-' if value < 0 else ''}<an integer of about {digits} digits>"
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        return f"<a {type(value).__name__} too large to print>"
    return text if len(text) <= 40 else text[:37] + "..."


def _describe(value: Any) -> str:
    return f"{_show(value)} ({type(value).__name__})"


def _problems(values: dict[str, Any], *, explicit: frozenset[str] = frozenset()) -> list[str]:
    """Every problem with the field values (absent sizes are skipped: the caller reports them missing)."""
    problems: list[str] = []
    good_sizes: dict[str, int] = {}
    for key in _REQUIRED_SIZES:
        if key not in values:  # reported as missing by the caller
            continue
        value = values[key]
        if not _is_int(value):
            problems.append(f"'{key}' must be an integer, found {_describe(value)}")
        elif value <= 0:
            problems.append(f"'{key}' must be positive, found {_show(value)}")
        elif value > LIMITS[key]:
            limit = LIMITS[key]
            problems.append(f"'{key}' must be at most {limit} (a GPT-2-family size), found {_show(value)}")
        else:
            good_sizes[key] = value

    if "n_embd" in good_sizes and "n_head" in good_sizes and good_sizes["n_embd"] % good_sizes["n_head"]:
        problems.append(
            f"'n_embd' ({good_sizes['n_embd']}) must be divisible by 'n_head' ({good_sizes['n_head']})"
        )

    eps = values["layer_norm_epsilon"]
    if not (isinstance(eps, (int, float)) and not isinstance(eps, bool)):
        problems.append(f"'layer_norm_epsilon' must be a number, found {_describe(eps)}")
    elif not (math.isfinite(eps) and eps > 0):
        problems.append(f"'layer_norm_epsilon' must be a positive finite number, found {_show(eps)}")
    elif not _MIN_EPSILON <= eps <= _MAX_EPSILON:
        problems.append(f"'layer_norm_epsilon' must be in [{_MIN_EPSILON:.3g}, {_MAX_EPSILON:g}] (float32 "
                        f"computes with it), found {_show(eps)}")

    for key in ("bos_token_id", "eos_token_id"):
        value = values[key]
        if not _is_int(value):
            problems.append(f"'{key}' must be an integer, found {_describe(value)}")
        elif value < 0:
            problems.append(f"'{key}' must be non-negative, found {_show(value)}")
        elif value >= LIMITS["vocab_size"]:
            problems.append(f"'{key}' must be below {LIMITS['vocab_size']}, found {_show(value)}")
        elif key in explicit and "vocab_size" in good_sizes and value >= good_sizes["vocab_size"]:
            # Only checked when the file names the id: the 50256 default must not break small test configs.
            vocab = good_sizes["vocab_size"]
            problems.append(f"'{key}' ({value}) must be smaller than 'vocab_size' ({vocab})")

    act = values["activation_function"]
    if not isinstance(act, str):
        problems.append(f"'activation_function' must be a string, found {_describe(act)}")
    elif act not in SUPPORTED_ACTIVATIONS:
        problems.append(
            f"'activation_function' {act!r} is not supported (supported: {', '.join(SUPPORTED_ACTIVATIONS)})"
        )
    return problems


@dataclass(frozen=True)
class Gpt2Config:
    """The hyper-parameters the forward pass needs. Construct via :meth:`from_file` / :meth:`from_dict`.

    Direct construction validates too (raising :class:`ConfigError`), so a bad config never
    reaches the model.
    """

    vocab_size: int
    n_positions: int
    n_embd: int
    n_layer: int
    n_head: int
    layer_norm_epsilon: float = DEFAULT_LAYER_NORM_EPSILON
    bos_token_id: int = DEFAULT_BOS_TOKEN_ID
    eos_token_id: int = DEFAULT_EOS_TOKEN_ID
    activation_function: str = "gelu_new"

    def __post_init__(self) -> None:
        problems = _problems(asdict(self))
        if problems:
            raise ConfigError("(Gpt2Config arguments)", problems)
        # Store a float even when given an int like 1, so arithmetic downstream is uniform.
        object.__setattr__(self, "layer_norm_epsilon", float(self.layer_norm_epsilon))

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_kv_head(self) -> int:
        """Heads of the keys and values (the KV cache's): GPT-2 has one per query head."""
        return self.n_head

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return (self.eos_token_id,)

    @property
    def n_inner(self) -> int:
        """Width of the MLP's hidden layer (GPT-2 always uses 4 * n_embd)."""
        return 4 * self.n_embd

    def to_dict(self) -> dict[str, Any]:
        """The fields as a Hub-style ``config.json`` object (round-trips through :meth:`from_dict`)."""
        d = asdict(self)
        d["model_type"] = "gpt2"
        return d

    @classmethod
    def from_dict(cls, d: Any, source: str = "(dict)") -> Gpt2Config:
        """Build from a parsed ``config.json`` object; ``source`` names it in error messages.

        Unknown keys are ignored (the Hub config has many). ``n_ctx`` is ignored: ``n_positions``
        is the context length. Keys that would change the architecture away from GPT-2 are
        rejected rather than silently ignored.
        """
        if not isinstance(d, dict):
            raise ConfigError(source, [f"expected a JSON object, found {type(d).__name__}"])
        other = _other_architecture(d)
        if other:  # one line naming the field, not every GPT-2 key the other model lacks
            raise ConfigError(source, [other])

        problems: list[str] = []
        missing = [k for k in _REQUIRED_SIZES if k not in d]
        if missing:
            problems.append("missing key(s): " + ", ".join(f"'{k}'" for k in missing))

        defaults = {
            "layer_norm_epsilon": DEFAULT_LAYER_NORM_EPSILON,
            "bos_token_id": DEFAULT_BOS_TOKEN_ID,
            "eos_token_id": DEFAULT_EOS_TOKEN_ID,
            "activation_function": "gelu_new",
        }
        values: dict[str, Any] = {}
        explicit = set()
        for key in _REQUIRED_SIZES:
            if key in d:
                values[key] = d[key]
        for key, default in defaults.items():
            # An explicit null for a token id or epsilon means "use the default", as in transformers.
            if d.get(key) is None:
                values[key] = default
            else:
                values[key] = d[key]
                explicit.add(key)

        problems.extend(_problems(values, explicit=frozenset(explicit)))
        problems.extend(_unsupported_architecture(d))
        if problems:
            raise ConfigError(source, problems)
        return cls(**values)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], context: int | None = None) -> Gpt2Config:
        """Read and validate a ``config.json``; every failure is a :class:`ConfigError` naming the file.
        GPT-2's context is its learned position table's, so a `context` cap below it is refused."""
        config = cls._from_file(path)
        if context is not None and context < config.n_positions:
            raise ValueError(f"a context of {context} positions: GPT-2's is fixed at n_positions "
                             f"({config.n_positions}) by its learned position embeddings")
        return config

    @classmethod
    def _from_file(cls, path: str | os.PathLike[str]) -> Gpt2Config:
        return cls.from_dict(read_config_json(path, "GPT-2"), source=os.fspath(path))


def read_config_json(path: str | os.PathLike[str], family: str = "model") -> dict[str, Any]:
    """A config.json as a dict, every failure a `ConfigError` naming the file (and `family` in its
    "invalid ... config" words)."""
    source = os.fspath(path)

    def error(source: str, problems: list[str]) -> ConfigError:
        return ConfigError(source, problems, family)

    try:
        raw = read_regular_file(path, MAX_CONFIG_BYTES, "a config.json")
    except FileNotFoundError:
        raise error(source, ["file not found"]) from None
    except IsADirectoryError:
        raise error(source, ["is a directory, expected a config.json file"]) from None
    except OSError as e:
        raise error(source, [f"cannot read file: {e.strerror or e}"]) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise error(source, [f"not UTF-8 text ({e.reason} at byte {e.start})"]) from None
    d = parse_json(text, source, error)
    if not isinstance(d, dict):
        raise error(source, [f"expected a JSON object, found {type(d).__name__}"])
    return d


#: The transformers classes whose checkpoints hold GPT-2's language model (GPT2Model: without a head; GPT-2
#: ties it to wte anyway).
GPT2_ARCHITECTURES = ("GPT2LMHeadModel", "GPT2Model")


def _other_architecture(d: dict[str, Any]) -> str | None:
    """Why a config is some other kind of model than GPT-2's language model (`model_type`, then
    `architectures`), or None."""
    model_type = d.get("model_type")
    if model_type is not None and model_type != "gpt2":
        return f"'model_type' is {_show(model_type)}: inferno runs GPT-2 models only (model_type 'gpt2')"
    arch = d.get("architectures")
    if arch is not None:
        if not (isinstance(arch, list) and all(isinstance(a, str) for a in arch)):
            return f"'architectures' must be a list of class names, found {_describe(arch)}"
        others = [a for a in arch if a not in GPT2_ARCHITECTURES]
        if others:
            return (f"'architectures' is {_show(arch)}: inferno runs GPT-2's language model only "
                    f"({' or '.join(GPT2_ARCHITECTURES)})")
    return None


def _unsupported_architecture(d: dict[str, Any]) -> list[str]:
    """Keys that transformers honours and that would make this model something other than GPT-2."""
    problems = []
    n_inner = d.get("n_inner")
    n_embd = d.get("n_embd")
    # Only comparable with a valid n_embd; a bad n_embd is reported on its own.
    if n_inner is not None and _is_int(n_embd) and n_inner != 4 * n_embd:
        problems.append(f"'n_inner' {_show(n_inner)} is not supported (only null or 4 * n_embd)")
    for key, required in (
        ("scale_attn_weights", True),
        ("scale_attn_by_inverse_layer_idx", False),
        ("add_cross_attention", False),
    ):
        if key in d and d[key] is not required:
            problems.append(f"'{key}' must be {str(required).lower()} (found {_show(d[key])})")
    return problems


#: GPT-2 small ("124M"): the shape of the benchmarks and of `-m random`.
GPT2_124M = Gpt2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)
