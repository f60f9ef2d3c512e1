"""Which architecture a checkpoint is: a registry keyed by config.json's `model_type` and `architectures`.

    family = family_of(config_dict, "path/config.json")     # a `Family`, or ConfigError in one line
    model = load_model("path/config.json", "path/model.safetensors", backend)

Each family is one module under `inferno/models/` (imported only when a checkpoint of it is loaded) that
provides ``config_from_file(path)``, ``iter_weights(weights_path, config, order)``,
``from_weights(config, weights, backend)`` and ``header_problems(config, tensors, whole)`` (what is wrong
with a safetensors header's tensors, for the downloader); the model it builds satisfies
`inferno.models.causal_lm`.
Adding an architecture is that module and one `Family` line below.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from inferno.models.config import ConfigError, read_config_json


def _refused(source: str, problems: list[str]) -> ConfigError:
    """A `ConfigError` about a config before its family is known ("invalid model config ...")."""
    return ConfigError(source, problems, "model")


@dataclass(frozen=True)
class Family:
    """One architecture: its name, the module that implements it, the config.json values that mean it,
    whether it reads sharded checkpoints (a model.safetensors.index.json and its shards), and the optional
    files of a Hub repo it reads beside config.json, the tokenizer and the weights (fetched when there)."""

    name: str
    module: str
    model_types: tuple[str, ...]
    architectures: tuple[str, ...]
    sharded: bool = False
    files: tuple[str, ...] = ()
    label: str = ""  # its name in messages

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", self.name)

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)


FAMILIES = (
    Family("gpt2", "inferno.models.gpt2", ("gpt2",), ("GPT2LMHeadModel", "GPT2Model"), label="GPT-2"),
    Family("llama", "inferno.models.llama", ("llama", "mistral", "qwen2", "qwen3"),
           ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"), sharded=True,
           files=("tokenizer_config.json", "generation_config.json", "chat_template.jinja"), label="Llama"),
)


def supported() -> str:
    """The supported model types, for messages: "gpt2, llama, mistral, qwen2, qwen3"."""
    return ", ".join(t for f in FAMILIES for t in f.model_types)


def family_of(config: Any, source: str = "(dict)") -> Family:
    """The family of a parsed config.json: by `model_type`, else by `architectures`; a config without
    either is GPT-2's (hand-written GPT-2 configs often have neither). Anything else is a `ConfigError`
    of one line naming the value and listing the supported ones."""
    if not isinstance(config, dict):
        raise _refused(source, [f"expected a JSON object, found {type(config).__name__}"])
    model_type = config.get("model_type")
    if model_type is not None:
        for family in FAMILIES:
            if model_type in family.model_types:
                return family
        raise _refused(source, [f"'model_type' is {str(model_type)[:40]!r}: inferno runs {supported()} "
                                   "models"])
    arch = config.get("architectures")
    if isinstance(arch, list) and arch:
        for family in FAMILIES:
            if all(a in family.architectures for a in arch):
                return family
        known = ", ".join(a for f in FAMILIES for a in f.architectures)
        raise _refused(source, [f"'architectures' is {str(arch)[:60]}: inferno runs {known}"])
    return FAMILIES[0]


def read_config_dict(path: str | os.PathLike[str]) -> dict:
    """config.json as a dict, every failure a `ConfigError` naming the file."""
    return read_config_json(path, "model")


def read_config(path: str | os.PathLike[str], context: int | None = None) -> tuple[Family, Any]:
    """The family and the validated config of a config.json (a `ConfigError` naming the file).
    `context` caps the positions served, so the KV cache of each sequence, where the family allows it
    (the Llama family's contexts run to 128k; GPT-2's learned positions fix its own)."""
    family = family_of(read_config_dict(path), os.fspath(path))
    module = family.load()
    if context is None:
        return family, module.config_from_file(path)
    return family, module.config_from_file(path, context=context)


def load_model(config_path: str | os.PathLike[str], weights_path: str | os.PathLike[str], backend: Any,
               config: Any = None, context: int | None = None) -> Any:
    """A `CausalLM` from a config.json and its weights (a model.safetensors, a sharded checkpoint's
    model.safetensors.index.json, or the folder holding either), converted one tensor at a time by
    `backend` (so a backend that converts the weights never holds all the float32 ones). `config`: one
    already read; `context`: as for `read_config`."""
    if config is None:
        family, config = read_config(config_path, context)
    else:
        family = family_of(config.to_dict())
    module = family.load()
    weights = module.iter_weights(weights_path, config, backend.weight_order)
    return module.from_weights(config, weights, backend)


def from_weights(config: Any, weights: Iterable[tuple[str, Any]] | dict, backend: Any) -> Any:
    """A `CausalLM` of the family of `config` (a `Gpt2Config` or a `LlamaConfig`) from host weights."""
    d = config.to_dict()
    return family_of(d).load().from_weights(config, weights, backend)

