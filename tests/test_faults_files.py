"""Issue #17, hostile model folders: FIFOs and devices (item 3), hostile config values (4), deep or huge
JSON (5), the empty model path (9), config/header details (14), weights too big for memory (18)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
from test_faults_common import assert_one_line_error, cli_env, copy_model, run_cli

import inferno
import inferno.models.weights as weights_module
from inferno.models.config import ConfigError, Gpt2Config
from inferno.models.weights import WeightsError, WeightsMemoryError, load_weights
from inferno.testing import random_state_dict, small_config, write_hub_safetensors, write_safetensors_raw
from inferno.tokenizer import Tokenizer, TokenizerError


def generate(d: Path, tmp_path: Path, *flags: str):
    return run_cli(["Hi", "--model-dir", str(d), "--max-new-tokens", "2", *flags], cli_env(tmp_path))


# ------------------------------------------------------------------- item 3: FIFOs and /dev/zero


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "tokenizer.json"])
def test_fifo_model_file_is_refused_not_waited_on(model_dir, tmp_path, name):
    d = copy_model(model_dir, tmp_path / "m")
    (d / name).unlink()
    os.mkfifo(d / name)  # nobody ever writes: opening it for reading used to block forever
    start = time.monotonic()
    assert_one_line_error(generate(d, tmp_path), name, "not a regular file", "named pipe")
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "tokenizer.json"])
def test_link_to_dev_zero_is_refused_not_read(model_dir, tmp_path, name):
    d = copy_model(model_dir, tmp_path / "m")
    (d / name).unlink()
    (d / name).symlink_to("/dev/zero")  # used to be read until a 3.8 GB MemoryError
    start = time.monotonic()
    assert_one_line_error(generate(d, tmp_path), name, "character device", "/dev/zero")
    assert time.monotonic() - start < 30


def test_oversized_config_and_tokenizer_are_not_read_whole(tmp_path):
    big = tmp_path / "config.json"
    with open(big, "wb") as f:
        f.truncate(2 << 30)  # 2 GiB (sparse): refused from its size, never read
    with pytest.raises(ConfigError, match="more than the 1048576-byte limit"):
        Gpt2Config.from_file(big)
    with pytest.raises(TokenizerError, match="limit for a tokenizer.json"):
        Tokenizer.from_file(big)


# ------------------------------------------------------------------- item 4: hostile config values


@pytest.mark.parametrize("value", [10**9, 10**6])
def test_huge_n_layer_is_one_line_at_once(model_dir, tmp_path, value):
    d = copy_model(model_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["n_layer"] = value  # 10**9 used to run 90 s to 6.9 GB, then a traceback
    (d / "config.json").write_text(json.dumps(cfg))
    start = time.monotonic()
    assert_one_line_error(generate(d, tmp_path), "config.json", "'n_layer' must be at most 1024")
    assert time.monotonic() - start < 10


@pytest.mark.parametrize(("key", "value"), [("vocab_size", 10**12), ("n_positions", 2**40), ("n_embd", 10**7),
                                            ("n_head", 10**9), ("eos_token_id", 10**15)])
def test_every_size_is_bounded(key, value):
    d = {"vocab_size": 64, "n_positions": 16, "n_embd": 16, "n_layer": 2, "n_head": 2, key: value}
    with pytest.raises(ConfigError, match=key):
        Gpt2Config.from_dict(d)


def test_file_comparison_does_not_scale_with_the_configs_n_layer(tmp_path):
    cfg = small_config()
    path = write_hub_safetensors(tmp_path / "m.safetensors", random_state_dict(cfg), cfg)
    # A config object the validation never saw (duck-typed, with a hostile n_layer): the loader compares
    # it with the file's 2 layers without building 12 * 10**9 expected names.
    hostile = object.__new__(Gpt2Config)
    for field, value in vars(cfg).items():
        object.__setattr__(hostile, field, value)
    object.__setattr__(hostile, "n_layer", 10**9)
    start = time.monotonic()
    with pytest.raises(WeightsError, match=r"missing tensors \(11999999976\).*through layer h.999999999"):
        load_weights(path, hostile)
    assert time.monotonic() - start < 2


# ------------------------------------------------------------------- item 5: deep and huge JSON


@pytest.mark.parametrize(("text", "needle"), [
    ('{"n_layer": ' + "[" * 2000 + "]" * 2000 + "}", "nested too deeply"),
    ('{"n_layer": ' + "7" * 5000 + "}", "integer string conversion"),
])
def test_deep_or_huge_json_config_is_one_line(model_dir, tmp_path, text, needle):
    d = copy_model(model_dir, tmp_path / "m")
    (d / "config.json").write_text(text)
    assert_one_line_error(generate(d, tmp_path), "config.json", needle)


@pytest.mark.parametrize(("text", "needle"), [
    ('{"model": ' + "[" * 2000 + "]" * 2000 + "}", "nested too deeply"),
    ('{"model": {"vocab": {"a": ' + "7" * 5000 + "}}}", "integer string conversion"),
])
def test_deep_or_huge_json_tokenizer_is_one_line(model_dir, tmp_path, text, needle):
    d = copy_model(model_dir, tmp_path / "m")
    (d / "tokenizer.json").write_text(text)
    assert_one_line_error(generate(d, tmp_path), "tokenizer.json", needle)


def test_huge_integer_values_are_described_not_printed():
    with pytest.raises(ConfigError, match="an integer of about 5000 digits") as info:
        Gpt2Config.from_dict({"vocab_size": 10**4999, "n_positions": 16, "n_embd": 16, "n_layer": 2,
                              "n_head": 2})
    assert len(str(info.value)) < 300


# ------------------------------------------------------------------- item 9: the empty path


def test_empty_model_dir_is_refused(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    env = cli_env(tmp_path, INFERNO_OFFLINE="0", HF_ENDPOINT="http://127.0.0.1:9")
    proc = run_cli(["Hi", "--model-dir", ""], env, cwd=work)
    assert_one_line_error(proc, "empty path")
    assert list(work.iterdir()) == []  # nothing was downloaded into the current directory
    with pytest.raises(FileNotFoundError, match="empty path"):
        inferno.load("", "numpy", download=False)


# ------------------------------------------------------------------- item 14: config and header details


def test_epsilon_that_overflows_float32_is_rejected(model_dir, tmp_path):
    d = copy_model(model_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["layer_norm_epsilon"] = 1e308
    (d / "config.json").write_text(json.dumps(cfg))
    assert_one_line_error(generate(d, tmp_path), "config.json", "'layer_norm_epsilon' must be in")
    for bad in (1e308, 2.0, 1e-300):
        with pytest.raises(ConfigError, match="layer_norm_epsilon"):
            Gpt2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2, layer_norm_epsilon=bad)


def test_null_metadata_is_accepted_like_the_safetensors_library(tmp_path):
    from safetensors.numpy import load_file

    path = write_safetensors_raw(tmp_path / "m.safetensors", {"x": ("F32", (2,), b"\0" * 8)},
                                 header_override={"__metadata__": None})
    assert set(load_file(str(path))) == {"x"}  # the library's own reading
    assert weights_module.read_safetensors_header(path).metadata == {}


# ------------------------------------------------------------------- item 18: too big for memory


def test_weights_too_big_for_memory_say_how_much_they_need(model_dir, tmp_path):
    # A 1.1 TB (sparse) model.safetensors matching its config: refused before anything is allocated.
    d = copy_model(model_dir, tmp_path / "m")
    v, c = 1 << 24, 1 << 14
    cfg = Gpt2Config(vocab_size=v, n_positions=1, n_embd=c, n_layer=1, n_head=1, bos_token_id=0,
                     eos_token_id=0)
    shapes = weights_module.expected_shapes(cfg)
    header, offset = {}, 0
    for name, shape in shapes.items():
        n = 4 * int(np.prod(shape))
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    with open(d / "model.safetensors", "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        f.truncate(8 + len(raw) + offset)
    (d / "config.json").write_text(json.dumps({**cfg.to_dict(), "model_type": "gpt2"}))
    start = time.monotonic()
    assert_one_line_error(generate(d, tmp_path), "model.safetensors", "the weights need 1.1 TB of memory")
    assert time.monotonic() - start < 30


def test_memory_error_while_reading_says_how_much_is_needed(tmp_path, monkeypatch):
    cfg = small_config()
    path = write_hub_safetensors(tmp_path / "m.safetensors", random_state_dict(cfg), cfg)

    def no_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate 4.00 KiB")

    monkeypatch.setattr(weights_module, "_read_tensor", no_memory)
    with pytest.raises(WeightsMemoryError, match=r"not enough memory: the weights need \d+ bytes as float32"):
        load_weights(path, cfg)
    monkeypatch.setattr(weights_module, "memory_limit", lambda: 1000)
    with pytest.raises(WeightsMemoryError, match="more than the 1000 bytes this process can have") as info:
        load_weights(path, cfg)
    assert isinstance(info.value, MemoryError) and isinstance(info.value, WeightsError)
