"""load_weights: both layouts and all dtypes round-trip; every bad file gets one clear WeightsError."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest
from random_gpt2 import (
    DTYPES,
    hub_layout,
    make_model_dir,
    random_state_dict,
    save_tensors,
    small_config,
    stored_state_dict,
    to_bf16_bits,
    write_hub_safetensors,
    write_safetensors_raw,
    write_save_pretrained_safetensors,
)
from safetensors.numpy import load_file, save_file

import inferno.weights as weights_module
from inferno.weights import WeightsError, expected_shapes, load_weights, read_safetensors_header


@pytest.fixture
def cfg():
    return small_config()


@pytest.fixture
def sd(cfg):
    return random_state_dict(cfg, seed=1)


def reference_load(path, dtype: str) -> dict[str, np.ndarray]:
    """The safetensors library's own reading of the file, as float32, keys without prefix."""
    if dtype == "BF16":  # numpy has no bfloat16: only torch can read it
        torch_numpy = pytest.importorskip("safetensors.torch")
        raw = {k: v.float().numpy() for k, v in torch_numpy.load_file(str(path)).items()}
    else:
        raw = {k: v.astype(np.float32) for k, v in load_file(str(path)).items()}
    return {k.removeprefix("transformer."): v for k, v in raw.items()}


def load_error(path, config) -> WeightsError:
    with pytest.raises(WeightsError) as info:
        load_weights(path, config)
    assert str(path) in str(info.value)
    return info.value


# ------------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["hub", "save_pretrained"])
def test_round_trip(tmp_path, layout, dtype):
    directory, config, expected = make_model_dir(tmp_path, layout=layout, dtype=dtype, seed=3)
    path = directory / "model.safetensors"
    w = load_weights(path, config)

    # Exactly the canonical names, in canonical order; the tied lm_head is dropped.
    assert list(w) == list(expected_shapes(config))
    reference = reference_load(path, dtype)
    for name, array in w.items():
        assert array.dtype == np.float32 and array.flags.c_contiguous, name
        assert array.shape == expected_shapes(config)[name]
        np.testing.assert_array_equal(array, expected[name], err_msg=name)
        np.testing.assert_array_equal(array, reference[name], err_msg=name)


@pytest.mark.parametrize("dtype", ["F16", "BF16"])
def test_half_precision_values_are_rounded_not_garbage(tmp_path, cfg, sd, dtype):
    path = write_hub_safetensors(tmp_path / "m.safetensors", sd, cfg, dtype)
    w = load_weights(path, cfg)
    tolerance = 1e-3 if dtype == "F16" else 1e-2  # relative precision of the format
    for name in sd:
        np.testing.assert_allclose(w[name], sd[name], rtol=tolerance, atol=1e-4, err_msg=name)


def test_bf16_rounding_matches_torch(sd):
    torch = pytest.importorskip("torch")
    a = sd["wte.weight"]
    ours = to_bf16_bits(a)
    theirs = torch.from_numpy(a).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(ours, theirs)


def test_hub_file_with_masked_bias_buffers(tmp_path, cfg, sd):
    path = write_hub_safetensors(tmp_path / "m.safetensors", sd, cfg, masked_bias=True)
    assert "h.0.attn.masked_bias" in read_safetensors_header(path).tensors
    w = load_weights(path, cfg)
    assert set(w) == set(sd)


def test_save_pretrained_without_lm_head(tmp_path, cfg, sd):
    path = write_save_pretrained_safetensors(tmp_path / "m.safetensors", sd, include_lm_head=False)
    assert set(load_weights(path, cfg)) == set(sd)


@pytest.mark.parametrize("dtype", DTYPES)
def test_untied_lm_head_is_kept(tmp_path, cfg, sd, dtype):
    head = sd["wte.weight"].copy()
    head[-1, -1] += 1.0  # differs only in the very last element: the chunked comparison must see it
    path = write_save_pretrained_safetensors(tmp_path / "m.safetensors", sd, dtype, lm_head=head)
    w = load_weights(path, cfg)
    assert "lm_head.weight" in w
    np.testing.assert_array_equal(w["lm_head.weight"], stored_state_dict({"x": head}, dtype)["x"])
    assert w["lm_head.weight"].flags.c_contiguous and w["lm_head.weight"].dtype == np.float32


def test_tied_lm_head_compared_in_chunks(tmp_path, monkeypatch, cfg, sd):
    # Force many chunks so the row arithmetic of the comparison is exercised.
    monkeypatch.setattr(weights_module, "_COMPARE_CHUNK_BYTES", 3 * cfg.n_embd * 4)
    path = write_save_pretrained_safetensors(tmp_path / "m.safetensors", sd)
    assert "lm_head.weight" not in load_weights(path, cfg)
    head = sd["wte.weight"].copy()
    head[cfg.vocab_size // 2, 0] = 42.0
    path = write_save_pretrained_safetensors(tmp_path / "u.safetensors", sd, lm_head=head)
    assert load_weights(path, cfg)["lm_head.weight"][cfg.vocab_size // 2, 0] == 42.0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk_rows", [1, 3, 10_000])
def test_fortran_order_on_request(tmp_path, monkeypatch, dtype, chunk_rows):
    # The transposed copy is made a few rows at a time: exercise one row, uneven chunks and one chunk.
    directory, config, expected = make_model_dir(tmp_path, dtype=dtype, seed=4)
    itemsize = 4 if dtype == "F32" else 2  # chunks are sized in the file's bytes
    monkeypatch.setattr(weights_module, "_TRANSPOSE_CHUNK_BYTES", chunk_rows * itemsize * config.n_embd)
    fortran = {"wte.weight", "h.1.mlp.c_proj.weight", "h.0.attn.c_attn.weight"}
    requested = []

    def order(name: str) -> str:
        requested.append(name)
        return "F" if name in fortran else "C"

    w = load_weights(directory / "model.safetensors", config, order)
    assert sorted(requested) == sorted(expected_shapes(config))  # asked once per tensor it returns
    for name, array in w.items():
        f_order = name in fortran
        assert array.dtype == np.float32, name
        assert array.flags.f_contiguous if f_order else array.flags.c_contiguous, name
        assert array.flags.c_contiguous != f_order, name
        np.testing.assert_array_equal(array, expected[name], err_msg=name)


def test_bad_memory_order_is_a_clear_error(tmp_path, monkeypatch, cfg, sd):
    path = write_hub_safetensors(tmp_path / "m.safetensors", sd, cfg)
    reads = []
    monkeypatch.setattr(weights_module, "_read_tensor", lambda *args: reads.append(args))
    with pytest.raises(ValueError, match=r"memory order must be 'C' or 'F', got 'T' for tensor 'wte.weight'"):
        load_weights(path, cfg, lambda name: "T" if name == "wte.weight" else "C")
    assert not reads  # checked before any data is read


def test_fortran_order_untied_lm_head(tmp_path, cfg, sd):
    head = sd["wte.weight"].copy()
    head[-1, -1] += 1.0
    path = write_save_pretrained_safetensors(tmp_path / "m.safetensors", sd, lm_head=head)
    w = load_weights(path, cfg, lambda name: "F" if name in ("wte.weight", "lm_head.weight") else "C")
    assert w["lm_head.weight"].flags.f_contiguous and w["wte.weight"].flags.f_contiguous
    np.testing.assert_array_equal(w["lm_head.weight"], head)
    path = write_save_pretrained_safetensors(tmp_path / "t.safetensors", sd)  # tied: still detected
    assert "lm_head.weight" not in load_weights(path, cfg, lambda name: "F")


@pytest.mark.parametrize("shape", [dict(n_layer=1, n_embd=8, n_head=1), dict(n_layer=3, n_embd=24, n_head=3)])
def test_other_shapes(tmp_path, shape):
    config = small_config(vocab_size=50, n_positions=7, **shape)
    directory, config, expected = make_model_dir(tmp_path, config, dtype="F16")
    w = load_weights(directory / "model.safetensors", config)
    assert all(np.array_equal(w[k], expected[k]) for k in expected)


def test_read_safetensors_header(tmp_path, cfg, sd):
    path = save_tensors(tmp_path / "m.safetensors", {"a": sd["wte.weight"], "b": sd["ln_f.bias"]}, "F16")
    header = read_safetensors_header(path)
    assert set(header.tensors) == {"a", "b"}
    a = header.tensors["a"]
    assert a.dtype == "F16" and a.shape == (cfg.vocab_size, cfg.n_embd) and a.nbytes == a.end - a.start
    assert header.file_size == path.stat().st_size
    assert max(t.end for t in header.tensors.values()) == header.file_size


def test_metadata_is_read(tmp_path):
    path = write_safetensors_raw(
        tmp_path / "m.safetensors", {"x": ("F32", (2,), b"\0" * 8)}, metadata={"format": "pt"}
    )
    assert read_safetensors_header(path).metadata == {"format": "pt"}


def test_config_must_be_a_gpt2_config(tmp_path, cfg, sd):
    path = write_hub_safetensors(tmp_path / "m.safetensors", sd, cfg)
    with pytest.raises(TypeError):
        load_weights(path, cfg.to_dict())  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------ content errors


def test_missing_tensor(tmp_path, cfg, sd):
    tensors = hub_layout(sd, cfg)
    del tensors["h.1.mlp.c_fc.bias"]
    path = save_tensors(tmp_path / "m.safetensors", tensors)
    e = load_error(path, cfg)
    assert "missing" in str(e) and "h.1.mlp.c_fc.bias" in str(e)


def test_unexpected_tensor(tmp_path, cfg, sd):
    tensors = {**hub_layout(sd, cfg), "h.0.attn.rotary.weight": np.zeros(3, np.float32)}
    path = save_tensors(tmp_path / "m.safetensors", tensors)
    e = load_error(path, cfg)
    assert "unexpected" in str(e) and "h.0.attn.rotary.weight" in str(e)


def test_prefixed_lm_head_is_unexpected(tmp_path, cfg, sd):
    tensors = {**hub_layout(sd, cfg), "transformer.lm_head.weight": sd["wte.weight"]}
    e = load_error(save_tensors(tmp_path / "m.safetensors", tensors), cfg)
    assert "unexpected" in str(e) and "transformer.lm_head.weight" in str(e)


def test_shape_mismatch_names_tensor_expected_and_found(tmp_path, cfg, sd):
    C = cfg.n_embd
    tensors = hub_layout(sd, cfg)
    tensors["h.0.attn.c_attn.weight"] = np.ascontiguousarray(tensors["h.0.attn.c_attn.weight"].T)
    path = save_tensors(tmp_path / "m.safetensors", tensors)
    e = load_error(path, cfg)
    assert len(e.problems) == 1
    assert "h.0.attn.c_attn.weight" in str(e)
    assert f"[{3 * C}, {C}]" in str(e) and f"expected [{C}, {3 * C}]" in str(e)


def test_wrong_lm_head_shape(tmp_path, cfg, sd):
    path = write_save_pretrained_safetensors(tmp_path / "m.safetensors", sd, lm_head=sd["wte.weight"][:-1])
    e = load_error(path, cfg)
    assert "lm_head.weight" in str(e) and f"expected [{cfg.vocab_size}, {cfg.n_embd}]" in str(e)


def test_unsupported_dtype(tmp_path, cfg, sd):
    tensors = hub_layout(sd, cfg)
    tensors["ln_f.weight"] = tensors["ln_f.weight"].astype(np.float64)
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path))  # save_tensors would cast everything to one dtype
    e = load_error(path, cfg)
    assert "ln_f.weight" in str(e) and "F64" in str(e) and "unsupported dtype" in str(e)


def test_mask_buffers_of_any_dtype_are_skipped(tmp_path, cfg, sd):
    tensors = hub_layout(sd, cfg)
    tensors["h.0.attn.bias"] = tensors["h.0.attn.bias"].astype(np.uint8)
    save_file(tensors, str(tmp_path / "m.safetensors"))
    assert set(load_weights(tmp_path / "m.safetensors", cfg)) == set(sd)


def test_same_tensor_with_and_without_prefix(tmp_path, cfg, sd):
    tensors = {**hub_layout(sd, cfg), "transformer.wpe.weight": sd["wpe.weight"]}
    e = load_error(save_tensors(tmp_path / "m.safetensors", tensors), cfg)
    assert "appears twice" in str(e) and "wpe.weight" in str(e)


def test_every_problem_reported_at_once(tmp_path, cfg, sd):
    tensors = hub_layout(sd, cfg)
    del tensors["wpe.weight"]
    del tensors["h.0.ln_2.bias"]
    tensors["extra.weight"] = np.zeros(2, np.float32)
    tensors["h.1.mlp.c_proj.weight"] = np.zeros((3, 3), np.float32)
    tensors["ln_f.bias"] = np.zeros(cfg.n_embd, np.int32)
    save_file(tensors, str(tmp_path / "m.safetensors"))
    e = load_error(tmp_path / "m.safetensors", cfg)
    message = str(e)
    assert len(e.problems) == 4, e.problems  # missing (grouped), unexpected, shape, dtype
    for word in ("wpe.weight", "h.0.ln_2.bias", "extra.weight", "h.1.mlp.c_proj.weight", "[3, 3]"):
        assert word in message, word
    for word in ("ln_f.bias", "I32"):
        assert word in message, word


def test_config_with_more_layers_than_the_file(tmp_path, cfg, sd):
    path = write_hub_safetensors(tmp_path / "m.safetensors", sd, cfg)
    bigger = small_config(n_layer=cfg.n_layer + 1)
    e = load_error(path, bigger)
    assert "missing tensors (12)" in str(e) and f"h.{cfg.n_layer}.ln_1.weight" in str(e)


def test_config_with_fewer_layers_than_the_file(tmp_path, cfg, sd):
    path = write_hub_safetensors(tmp_path / "m.safetensors", sd, cfg)
    e = load_error(path, small_config(n_layer=1))
    assert "unexpected tensors (12)" in str(e) and "h.1.ln_1.weight" in str(e)


def test_wrong_width_reports_every_tensor_and_caps_the_message(tmp_path):
    cfg = small_config(n_layer=4)
    sd = random_state_dict(cfg)
    path = write_hub_safetensors(tmp_path / "m.safetensors", sd, cfg)
    e = load_error(path, small_config(n_embd=32, n_head=2, n_layer=cfg.n_layer))
    # Every tensor has the wrong shape; all are in .problems, the message stays readable.
    assert len(e.problems) == len(sd)
    assert "more (see WeightsError.problems)" in str(e)
    assert str(e).count("\n") <= 42


# ------------------------------------------------------------------------------------ malformed files


def test_missing_file(tmp_path, cfg):
    path = tmp_path / "nope.safetensors"
    e = load_error(path, cfg)
    assert e.problems == ["file not found"] and e.path == str(path)
    assert str(e) == f"cannot load GPT-2 weights from {path}: file not found"


def test_directory(tmp_path, cfg):
    e = load_error(tmp_path, cfg)
    assert e.problems == ["is a directory, expected a .safetensors file"]


def test_a_named_pipe_is_refused_without_blocking(tmp_path, cfg):
    path = tmp_path / "m.safetensors"
    os.mkfifo(path)
    e = load_error(path, cfg)
    assert len(e.problems) == 1 and "named pipe" in e.problems[0]
    with pytest.raises(WeightsError, match="named pipe"):
        read_safetensors_header(path)


@pytest.mark.parametrize(
    ("error", "problem"),
    [(PermissionError(13, "Permission denied"), "cannot open file: Permission denied"),
     (OSError("no strerror here"), "cannot open file: no strerror here")],
)
def test_an_os_error_on_open_is_a_weights_error(tmp_path, monkeypatch, cfg, error, problem):
    def refuse(path, **kwargs):
        raise error

    monkeypatch.setattr(weights_module, "open_regular_file", refuse)
    assert load_error(tmp_path / "m.safetensors", cfg).problems == [problem]


@pytest.mark.parametrize("content", [b"", b"\x01\x02\x03"])
def test_too_short(tmp_path, cfg, content):
    path = tmp_path / "m.safetensors"
    path.write_bytes(content)
    assert "too short" in str(load_error(path, cfg))


def test_header_length_bigger_than_file(tmp_path, cfg):
    path = tmp_path / "m.safetensors"
    path.write_bytes((1000).to_bytes(8, "little") + b'{"a": 1}')
    e = load_error(path, cfg)
    assert "header length 1000" in str(e) and "bigger than the rest of the file" in str(e)


def test_absurd_header_length(tmp_path, cfg):
    path = tmp_path / "m.safetensors"
    path.write_bytes((2**63).to_bytes(8, "little") + b"{}")
    assert load_error(path, cfg).problems == [
        f"header length {2**63} is bigger than the rest of the file (2 bytes): truncated or not a "
        f"safetensors file; {weights_module._DAMAGED}"]


def test_the_header_size_limit(tmp_path, monkeypatch):
    path = write_safetensors_raw(tmp_path / "m.safetensors", {"x": ("F32", (2,), b"\0" * 8)})
    header_len = int.from_bytes(path.read_bytes()[:8], "little")
    monkeypatch.setattr(weights_module, "_MAX_HEADER_BYTES", header_len)
    assert set(read_safetensors_header(path).tensors) == {"x"}  # exactly at the limit: fine
    monkeypatch.setattr(weights_module, "_MAX_HEADER_BYTES", header_len - 1)
    with pytest.raises(WeightsError) as info:
        read_safetensors_header(path)
    assert info.value.problems == [f"header length {header_len} exceeds the {header_len - 1}-byte limit"]


@pytest.mark.parametrize(
    "header, words",
    [
        (b'{"a": {"dtype": "F32", ', ["not valid JSON"]),
        (b"\xff\xfe{}", ["not valid JSON"]),
        (b"[" * 100_000 + b"]" * 100_000, ["not valid JSON"]),
        (b'{"a": {"shape": [' + b"9" * 5000 + b"]}}", ["not valid JSON"]),  # too long for int()
        (b"[1, 2]", ["JSON object", "list"]),
        (b'{"a": 3}', ["'a'", "must be an object"]),
    ],
)
def test_bad_header(tmp_path, cfg, header, words):
    path = tmp_path / "m.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header)
    e = load_error(path, cfg)
    assert len(e.problems) == 1
    for word in words:
        assert word in e.problems[0]


@pytest.mark.parametrize("metadata", [{"x": 1}, "pt", ["format", "pt"], {"a": "b", "c": None}])
def test_metadata_must_be_an_object_of_strings(tmp_path, cfg, metadata):
    header = json.dumps({"__metadata__": metadata}).encode()
    path = tmp_path / "m.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header)
    assert load_error(path, cfg).problems == ["'__metadata__' must be an object of strings"]


def test_null_or_empty_metadata_is_no_metadata(tmp_path):
    for metadata in (None, {}):
        header = json.dumps({"__metadata__": metadata, "x": {"dtype": "F32", "shape": [1],
                                                             "data_offsets": [0, 4]}}).encode()
        path = tmp_path / "m.safetensors"
        path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
        header = read_safetensors_header(path)
        assert header.metadata == {} and set(header.tensors) == {"x"}


def test_the_parsed_header(tmp_path):
    path = write_safetensors_raw(tmp_path / "m.safetensors", {"a": ("F32", (2,), b"\0" * 8),
                                                              "b": ("F16", (3, 1), b"\0" * 6)},
                                 metadata={"format": "pt"})
    header = read_safetensors_header(path)
    start = 8 + int.from_bytes(path.read_bytes()[:8], "little")
    assert header.data_start == start and header.file_size == start + 14
    assert header.tensors == {
        "a": weights_module.TensorInfo("a", "F32", (2,), start, start + 8),
        "b": weights_module.TensorInfo("b", "F16", (3, 1), start + 8, start + 14)}
    assert header.tensors["b"].nbytes == 6 and header.metadata == {"format": "pt"}


def raw_file(tmp_path, override: dict, extra: bytes = b"") -> os.PathLike:
    entries = {"a": ("F32", (2,), b"\0" * 8), "b": ("F32", (3,), b"\0" * 12)}
    path = write_safetensors_raw(tmp_path / "m.safetensors", entries, header_override=override)
    with open(path, "ab") as f:
        f.write(extra)
    return path


@pytest.mark.parametrize(
    "override, words",
    [
        ({"b": {"dtype": "F32", "shape": [3], "data_offsets": [8, 400]}}, ["'b'", "past the end", "truncat"]),
        ({"b": {"dtype": "F32", "shape": [3], "data_offsets": [4, 16]}}, ["overlaps"]),
        ({"b": {"dtype": "F32", "shape": [3], "data_offsets": [12, 8]}}, ["'b'", "begin after end"]),
        ({"b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 20]}}, ["'b'", "12 bytes", "needs 8"]),
        ({"b": {"dtype": "F32", "shape": [-3], "data_offsets": [8, 20]}}, ["'b'", "shape"]),
        ({"b": {"dtype": "F32", "shape": "3", "data_offsets": [8, 20]}}, ["'b'", "shape"]),
        ({"b": {"dtype": 4, "shape": [3], "data_offsets": [8, 20]}}, ["'b'", "dtype"]),
        ({"b": {"dtype": "F32", "shape": [3], "data_offsets": [8]}}, ["'b'", "data_offsets"]),
        ({"b": {"dtype": "F32", "shape": [3], "data_offsets": [8.0, 20.0]}}, ["'b'", "data_offsets"]),
        ({"b": {"dtype": "F32", "shape": [3]}}, ["'b'", "data_offsets"]),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, ["gap of 4 bytes", "'b'"]),
        ({"b": {"dtype": "F32", "shape": [3], "data_offsets": [-4, 8]}}, ["'b'", "non-negative"]),
        ({"b": {"dtype": "F32", "shape": [3], "data_offsets": [False, 12]}}, ["'b'", "data_offsets"]),
        ({"b": {"dtype": "F32", "shape": [True], "data_offsets": [8, 12]}}, ["'b'", "shape"]),
        ({"b": {"dtype": "F32", "shape": [3], "data_offsets": [8, 8]}}, ["'b'", "hold 0 bytes", "needs 12"]),
        ({"b": {"dtype": "F32", "shape": [3], "data_offsets": [8, 20, 20]}}, ["'b'", "data_offsets"]),
    ],
)
def test_bad_offsets(tmp_path, cfg, override, words):
    e = load_error(raw_file(tmp_path, override), cfg)
    for word in words:
        assert word in str(e), word
    with pytest.raises(WeightsError):
        read_safetensors_header(raw_file(tmp_path, override))


def test_trailing_bytes(tmp_path, cfg):
    e = load_error(raw_file(tmp_path, {}, extra=b"junk"), cfg)
    assert e.problems == ["4 unused bytes after the last tensor's data"]


def test_offsets_problems_exactly(tmp_path):
    def problems(override: dict) -> list[str]:
        with pytest.raises(WeightsError) as info:
            read_safetensors_header(raw_file(tmp_path, override))
        return info.value.problems

    # (an overlap, not also the 4 bytes it leaves at the end: only the first problem of the layout)
    assert problems({"b": {"dtype": "F32", "shape": [3], "data_offsets": [4, 16]}}) == [
        "tensor 'b' data overlaps tensor 'a'"]
    assert problems({"b": {"dtype": "F32", "shape": [3], "data_offsets": [12, 8]}}) == [
        "tensor 'b': 'data_offsets' [12, 8] has begin after end"]
    assert problems({"b": {"dtype": "F32", "shape": [3], "data_offsets": [8, 24]}}) == [
        "tensor 'b': data_offsets [8, 24] run past the end of the file (data section is 20 bytes): "
        "file truncated?"]
    assert problems({"b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 20]}}) == [
        "tensor 'b': data_offsets [8, 20] hold 12 bytes, but F32 [2] needs 8"]
    assert problems({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}) == [
        "gap of 4 bytes in the data section before tensor 'b'"]
    assert problems({"b": {"dtype": 4, "shape": "3", "data_offsets": [8]}}) == [
        "tensor 'b': 'dtype' must be a string, found 4; 'shape' must be a list of non-negative integers, "
        "found '3'; 'data_offsets' must be [begin, end] non-negative integers, found [8]"]


def test_zero_size_tensors(tmp_path):
    # A [0, 3] tensor holds no bytes: anywhere in the data section, at its very end, or alone. (GPT-2's
    # own tensors are never empty: a config has no zero size.)
    entries = {"a": ("F32", (2,), b"\1" * 8), "empty": ("F16", (0, 3), b""), "b": ("F32", (3,), b"\2" * 12),
               "last": ("BF16", (4, 0), b"")}
    path = write_safetensors_raw(tmp_path / "m.safetensors", entries)
    header = read_safetensors_header(path)
    assert header.tensors["empty"].nbytes == 0 and header.tensors["empty"].shape == (0, 3)
    assert header.tensors["last"].start == header.tensors["last"].end == header.file_size
    alone = write_safetensors_raw(tmp_path / "e.safetensors", {"empty": ("F32", (0,), b"")})
    assert read_safetensors_header(alone).tensors["empty"].start == alone.stat().st_size


def test_a_dtype_the_format_does_not_define_passes_the_header_and_is_refused_by_the_loader(tmp_path, cfg, sd):
    tensors = hub_layout(sd, cfg)
    entries = {k: ("F32", v.shape, np.ascontiguousarray(v, "<f4").tobytes()) for k, v in tensors.items()}
    entries["ln_f.bias"] = ("Q7", (cfg.n_embd,), b"\0" * 3)  # its size per element is unknown: not checked
    path = write_safetensors_raw(tmp_path / "m.safetensors", entries)
    assert read_safetensors_header(path).tensors["ln_f.bias"].nbytes == 3
    assert load_error(path, cfg).problems == [
        "tensor 'ln_f.bias' has unsupported dtype Q7 (supported: F32, F16, BF16)"]


@pytest.mark.parametrize("n", [1, 2, 40, 41, 45])
def test_the_message_lists_up_to_40_problems(tmp_path, n):
    problems = [f"problem {i}" for i in range(n)]
    e = WeightsError(tmp_path / "m.safetensors", problems)
    assert e.problems == problems and e.path == str(tmp_path / "m.safetensors")
    head = f"cannot load GPT-2 weights from {tmp_path / 'm.safetensors'}: "
    if n == 1:
        assert str(e) == head + "problem 0"
        return
    lines = str(e).split("\n")
    assert lines[0] == head + f"{n} problems:"
    assert lines[1 : 1 + min(n, 40)] == [f"  - problem {i}" for i in range(min(n, 40))]
    assert lines[41:] == ([f"  ... and {n - 40} more (see WeightsError.problems)"] if n > 40 else [])


def test_several_header_problems_at_once(tmp_path, cfg):
    override = {
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 999]},
        "b": {"dtype": "F32", "shape": "x", "data_offsets": [8, 20]},
    }
    e = load_error(raw_file(tmp_path, override), cfg)
    assert len(e.problems) == 2 and "'a'" in str(e) and "'b'" in str(e)


def test_every_truncation_is_a_weights_error(tmp_path, cfg, sd):
    path = write_hub_safetensors(tmp_path / "m.safetensors", sd, cfg, "BF16")
    data = path.read_bytes()
    header_end = 8 + int.from_bytes(data[:8], "little")
    cut = tmp_path / "cut.safetensors"
    sampled = random.Random(0).sample(range(len(data)), 200)
    sizes = sorted({*range(0, header_end + 16), *sampled} - {len(data)})
    for size in sizes:
        cut.write_bytes(data[:size])
        with pytest.raises(WeightsError):
            load_weights(cut, cfg)


def test_header_corruption_never_escapes_as_another_exception(tmp_path, cfg, sd):
    path = write_hub_safetensors(tmp_path / "m.safetensors", sd, cfg)
    data = bytearray(path.read_bytes())
    header_end = 8 + int.from_bytes(data[:8], "little")
    rng = random.Random(1)
    bad = tmp_path / "bad.safetensors"
    refused = 0
    for _ in range(300):
        corrupt = bytearray(data[:header_end])
        for _ in range(rng.randint(1, 4)):
            corrupt[rng.randrange(len(corrupt))] = rng.choice(b'0123456789[]{}",:-.eE \x00\xff')
        bad.write_bytes(bytes(corrupt) + data[header_end:])
        try:
            w = load_weights(bad, cfg)  # anything but a WeightsError fails the test
        except WeightsError as e:
            assert e.problems and str(bad) in str(e)
            refused += 1
        else:  # the corruption left a valid header (a space in padding, a digit of equal value)
            assert set(w) == set(sd)
    assert refused >= 200  # most corruptions break the header


def test_file_truncated_while_loading(tmp_path, monkeypatch, cfg, sd):
    path = write_hub_safetensors(tmp_path / "m.safetensors", sd, cfg)
    parse = weights_module._parse_header

    def parse_then_truncate(f, p, size):
        header = parse(f, p, size)
        os.truncate(path, size // 2)  # someone overwrites the file under us
        return header

    monkeypatch.setattr(weights_module, "_parse_header", parse_then_truncate)
    e = load_error(path, cfg)
    assert "file ended while reading tensor" in str(e)


def _truncate_after_the_header_is_read(monkeypatch, path, size: int) -> None:
    parse = weights_module._parse_header

    def parse_then_truncate(f, p, file_size):
        header = parse(f, p, file_size)
        os.truncate(path, size)  # someone overwrites the file under us
        return header

    monkeypatch.setattr(weights_module, "_parse_header", parse_then_truncate)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fortran", [False, True])
def test_truncated_while_loading_names_the_tensor(tmp_path, monkeypatch, cfg, sd, dtype, fortran):
    # The last tensor read is cut 2 bytes short: every dtype's reader, C or Fortran order.
    path = write_hub_safetensors(tmp_path / "m.safetensors", sd, cfg, dtype)
    header = read_safetensors_header(path)
    last = max((t for t in header.tensors.values() if ".attn.bias" not in t.name), key=lambda t: t.end)
    _truncate_after_the_header_is_read(monkeypatch, path, last.end - 2)
    with pytest.raises(WeightsError) as info:
        load_weights(path, cfg, (lambda name: "F") if fortran else None)
    assert info.value.problems == [
        f"file ended while reading tensor '{last.name}' (file truncated while loading?)"]


def _untied_file(path, sd, head, dtype="F32"):
    """A save_pretrained-style file whose lm_head.weight is stored last."""
    from random_gpt2 import _encode, save_pretrained_layout

    tensors = save_pretrained_layout(sd, lm_head=head)
    order = sorted(tensors, key=lambda k: k == "lm_head.weight")
    return write_safetensors_raw(path, {k: _encode(tensors[k], dtype) for k in order})


@pytest.mark.parametrize("dtype", DTYPES)
def test_truncated_untied_lm_head_is_a_weights_error(tmp_path, monkeypatch, cfg, sd, dtype):
    head = sd["wte.weight"].copy()
    head[0, 0] += 1.0  # differs in its first row: the comparison stops there, the full read hits the end
    path = _untied_file(tmp_path / "m.safetensors", sd, head, dtype)
    header = read_safetensors_header(path)
    assert max(header.tensors.values(), key=lambda t: t.end).name == "lm_head.weight"
    np.testing.assert_array_equal(load_weights(path, cfg)["lm_head.weight"],
                                  stored_state_dict({"x": head}, dtype)["x"])
    _truncate_after_the_header_is_read(monkeypatch, path, header.file_size - 1)
    with pytest.raises(WeightsError) as info:
        load_weights(path, cfg)
    assert info.value.problems == [
        "file ended while reading tensor 'lm_head.weight' (file truncated while loading?)"]


def test_weights_error_is_a_value_error():
    assert issubclass(WeightsError, ValueError)


def test_header_written_by_json_with_spaces(tmp_path, cfg, sd):
    # Headers with whitespace and key order different from data order are valid.
    tensors = hub_layout(sd, cfg)
    entries, header, offset = [], {}, 0
    for name in reversed(list(tensors)):
        data = np.ascontiguousarray(tensors[name], "<f4").tobytes()
        shape = list(tensors[name].shape)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        entries.append(data)
        offset += len(data)
    encoded = json.dumps(dict(sorted(header.items())), indent=1).encode()
    path = tmp_path / "m.safetensors"
    path.write_bytes(len(encoded).to_bytes(8, "little") + encoded + b"".join(entries))
    w = load_weights(path, cfg)
    assert all(np.array_equal(w[k], sd[k]) for k in sd)
