"""Gpt2Config: the real Hub config parses; every bad input is reported, all at once, naming the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferno.models.config import ConfigError, Gpt2Config

REPO_CONFIG = Path(__file__).resolve().parent.parent / "inferno" / "data" / "gpt2" / "config.json"

GOOD = {"vocab_size": 64, "n_positions": 16, "n_embd": 16, "n_layer": 2, "n_head": 2}


def error_for(d: object, source: str = "cfg.json") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        Gpt2Config.from_dict(d, source=source)
    assert source in str(info.value)
    return info.value


def test_real_hub_config_parses_with_real_values():
    c = Gpt2Config.from_file(REPO_CONFIG)
    assert (c.vocab_size, c.n_positions, c.n_embd, c.n_layer, c.n_head) == (50257, 1024, 768, 12, 12)
    assert c.layer_norm_epsilon == 1e-5
    assert c.bos_token_id == c.eos_token_id == 50256
    assert c.activation_function == "gelu_new"
    assert c.head_dim == 64
    assert c.n_inner == 3072


def test_defaults_when_optional_keys_absent():
    c = Gpt2Config.from_dict(GOOD)
    assert c.eos_token_id == 50256 and c.bos_token_id == 50256
    assert c.layer_norm_epsilon == 1e-5 and isinstance(c.layer_norm_epsilon, float)
    assert c.activation_function == "gelu_new"
    assert c.head_dim == 8


def test_null_optional_keys_mean_default():
    c = Gpt2Config.from_dict({**GOOD, "eos_token_id": None, "layer_norm_epsilon": None})
    assert c.eos_token_id == 50256 and c.layer_norm_epsilon == 1e-5


def test_n_ctx_is_ignored_and_n_positions_wins():
    c = Gpt2Config.from_dict({**GOOD, "n_ctx": 999})
    assert c.n_positions == 16
    # Even a nonsensical n_ctx is not our business.
    assert Gpt2Config.from_dict({**GOOD, "n_ctx": "whatever"}).n_positions == 16


def test_unknown_keys_are_fine():
    c = Gpt2Config.from_dict({**GOOD, "task_specific_params": {"x": 1}, "summary_type": "cls_index"})
    assert c.n_layer == 2


def test_integer_epsilon_is_accepted_as_float():
    assert Gpt2Config.from_dict({**GOOD, "layer_norm_epsilon": 1}).layer_norm_epsilon == 1.0


def test_frozen():
    c = Gpt2Config.from_dict(GOOD)
    with pytest.raises(AttributeError):
        c.n_layer = 3  # type: ignore[misc]


def test_round_trip_through_to_dict():
    c = Gpt2Config.from_file(REPO_CONFIG)
    assert Gpt2Config.from_dict(json.loads(json.dumps(c.to_dict()))) == c


def test_missing_keys_are_all_named():
    e = error_for({"vocab_size": 10, "n_head": 2})
    for key in ("n_positions", "n_embd", "n_layer"):
        assert key in str(e)
    assert "vocab_size" not in str(e) and "'n_head'" not in str(e)


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("n_layer", True, ["n_layer", "integer", "bool"]),
        ("n_embd", 768.0, ["n_embd", "integer", "768.0"]),
        ("n_head", 2.5, ["n_head", "integer"]),
        ("vocab_size", "64", ["vocab_size", "integer", "str"]),
        ("n_positions", None, ["n_positions", "integer"]),
        ("n_layer", 0, ["n_layer", "positive", "0"]),
        ("n_head", -2, ["n_head", "positive", "-2"]),
        ("layer_norm_epsilon", 0.0, ["layer_norm_epsilon", "positive finite"]),
        ("layer_norm_epsilon", -1e-5, ["layer_norm_epsilon", "positive finite"]),
        ("layer_norm_epsilon", float("inf"), ["layer_norm_epsilon", "inf"]),
        ("layer_norm_epsilon", float("nan"), ["layer_norm_epsilon", "nan"]),
        ("layer_norm_epsilon", "1e-5", ["layer_norm_epsilon", "number"]),
        ("layer_norm_epsilon", False, ["layer_norm_epsilon", "number", "bool"]),
        ("eos_token_id", 64, ["eos_token_id", "vocab_size"]),
        ("bos_token_id", -1, ["bos_token_id", "non-negative"]),
        ("eos_token_id", 1.0, ["eos_token_id", "integer"]),
        ("activation_function", "relu", ["activation_function", "relu", "gelu_new"]),
        ("activation_function", "gelu", ["activation_function", "'gelu'"]),
        ("activation_function", 3, ["activation_function", "string"]),
        ("model_type", "llama", ["model_type", "llama"]),
        ("n_inner", 100, ["n_inner", "100"]),
        ("scale_attn_by_inverse_layer_idx", True, ["scale_attn_by_inverse_layer_idx"]),
        ("add_cross_attention", True, ["add_cross_attention"]),
    ],
)
def test_each_bad_value_is_named(key, value, words):
    e = error_for({**GOOD, key: value})
    assert len(e.problems) == 1, e.problems
    for word in words:
        assert word in str(e)


def test_n_inner_equal_to_4c_is_fine():
    assert Gpt2Config.from_dict({**GOOD, "n_inner": 64}).n_inner == 64


def test_n_embd_not_divisible_by_n_head():
    e = error_for({**GOOD, "n_embd": 10, "n_head": 3})
    assert "n_embd" in str(e) and "n_head" in str(e) and "divisible" in str(e)


def test_every_problem_reported_at_once():
    bad = {
        "vocab_size": True,
        "n_positions": 1024.0,
        "n_embd": 768,
        "n_head": 5,
        "layer_norm_epsilon": float("nan"),
        "activation_function": "relu",
        "model_type": "gpt2",
    }
    e = error_for(bad)
    message = str(e)
    assert len(e.problems) == 6, e.problems
    keys = ("vocab_size", "n_positions", "n_layer", "n_head", "layer_norm_epsilon", "activation_function")
    assert all(key in message for key in keys), message


# A real config of each kind, trimmed to what matters: another architecture is one line naming the field,
# not a list of every GPT-2 key it lacks.
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
         "num_attention_heads": 32, "num_hidden_layers": 32, "vocab_size": 32000}
GPT2_CLASSIFIER = {**GOOD, "architectures": ["GPT2ForSequenceClassification"], "model_type": "gpt2"}


@pytest.mark.parametrize("config, field, value", [
    (LLAMA, "model_type", "llama"),
    ({**LLAMA, "model_type": None}, "architectures", "LlamaForCausalLM"),
    (GPT2_CLASSIFIER, "architectures", "GPT2ForSequenceClassification"),
    ({**GOOD, "architectures": "GPT2LMHeadModel"}, "architectures", "list"),
])
def test_another_architecture_is_one_line_naming_the_field(config, field, value):
    e = error_for(config)
    assert len(e.problems) == 1 and "\n" not in str(e), str(e)
    assert f"'{field}'" in str(e) and value in str(e) and "GPT-2" in str(e)


@pytest.mark.parametrize("arch", [["GPT2LMHeadModel"], ["GPT2Model"], None])
def test_gpt2_architectures_are_accepted(arch):
    assert Gpt2Config.from_dict({**GOOD, "architectures": arch}).n_layer == GOOD["n_layer"]


@pytest.mark.parametrize("value", [[1, 2], "config", 3, None])
def test_not_an_object(value):
    e = error_for(value)
    assert "JSON object" in str(e)


def test_direct_construction_validates():
    with pytest.raises(ConfigError) as info:
        Gpt2Config(vocab_size=64, n_positions=16, n_embd=10, n_layer=True, n_head=3)  # type: ignore[arg-type]
    assert "n_layer" in str(info.value) and "divisible" in str(info.value)


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


# ------------------------------------------------------------------------------------ from_file


def test_from_file_missing(tmp_path):
    path = tmp_path / "nope" / "config.json"
    with pytest.raises(ConfigError) as info:
        Gpt2Config.from_file(path)
    assert str(path) in str(info.value) and "not found" in str(info.value)


def test_from_file_directory(tmp_path):
    with pytest.raises(ConfigError) as info:
        Gpt2Config.from_file(tmp_path)
    assert str(tmp_path) in str(info.value) and "directory" in str(info.value)


def test_from_file_not_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"n_embd": 768,')
    with pytest.raises(ConfigError) as info:
        Gpt2Config.from_file(path)
    message = str(info.value)
    assert str(path) in message and "not valid JSON" in message and "line 1" in message


def test_from_file_not_utf8(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError) as info:
        Gpt2Config.from_file(path)
    assert str(path) in str(info.value) and "UTF-8" in str(info.value)


def test_from_file_not_an_object(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("[1, 2, 3]")
    with pytest.raises(ConfigError) as info:
        Gpt2Config.from_file(path)
    assert str(path) in str(info.value) and "JSON object" in str(info.value) and "list" in str(info.value)


def test_from_file_names_file_and_every_key(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"vocab_size": 64, "n_positions": 0, "n_embd": 16.0, "n_head": 2}))
    with pytest.raises(ConfigError) as info:
        Gpt2Config.from_file(path)
    e = info.value
    assert e.source == str(path)
    assert str(path) in str(e)
    assert len(e.problems) == 3
    for key in ("n_positions", "n_embd", "n_layer"):
        assert key in str(e)


def test_from_file_accepts_pathlike_and_str(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GOOD))
    assert Gpt2Config.from_file(path) == Gpt2Config.from_file(str(path))
