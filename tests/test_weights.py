"""load_weights: both layouts and all dtypes round-trip; every bad file gets one clear WeightsError."""

from __future__ import annotations

import io
import json
import os
import random
import warnings

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import inferno.models.safetensors_reader as reader_module
import inferno.models.weights as weights_module
from inferno.models.weights import WeightsError, expected_shapes, load_weights, read_safetensors_header
from inferno.testing import (
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


# What a damaged file's message tells the user to do.
DAMAGED = "delete it and run again to download a fresh copy, or replace it"


def header_names(path) -> list[str]:
    """The names in a file's header, in its order (read here with json, not by the code under test)."""
    data = open(path, "rb").read()
    return list(json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")]))


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
    monkeypatch.setattr(weights_module, "COMPARE_CHUNK_BYTES", 3 * cfg.n_embd * 4)
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
    monkeypatch.setattr(reader_module, "TRANSPOSE_CHUNK_BYTES", chunk_rows * itemsize * config.n_embd)
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
    with pytest.raises(TypeError, match=r"^config must be a Gpt2Config, not dict$"):
        load_weights(path, cfg.to_dict())  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------ content errors


def test_missing_tensor(tmp_path, cfg, sd):
    tensors = hub_layout(sd, cfg)
    del tensors["h.1.mlp.c_fc.bias"]
    path = save_tensors(tmp_path / "m.safetensors", tensors)
    assert load_error(path, cfg).problems == ["missing tensors (1): 'h.1.mlp.c_fc.bias'"]


def test_unexpected_tensor(tmp_path, cfg, sd):
    tensors = {**hub_layout(sd, cfg), "h.0.attn.rotary.weight": np.zeros(3, np.float32)}
    path = save_tensors(tmp_path / "m.safetensors", tensors)
    assert load_error(path, cfg).problems == ["unexpected tensors (1): 'h.0.attn.rotary.weight'"]


def test_prefixed_lm_head_is_unexpected(tmp_path, cfg, sd):
    tensors = {**hub_layout(sd, cfg), "transformer.lm_head.weight": sd["wte.weight"]}
    e = load_error(save_tensors(tmp_path / "m.safetensors", tensors), cfg)
    assert e.problems == ["unexpected tensors (1): 'transformer.lm_head.weight'"]


def test_shape_mismatch_names_tensor_expected_and_found(tmp_path, cfg, sd):
    C = cfg.n_embd
    tensors = hub_layout(sd, cfg)
    tensors["h.0.attn.c_attn.weight"] = np.ascontiguousarray(tensors["h.0.attn.c_attn.weight"].T)
    path = save_tensors(tmp_path / "m.safetensors", tensors)
    assert load_error(path, cfg).problems == [
        f"tensor 'h.0.attn.c_attn.weight' has shape [{3 * C}, {C}], expected [{C}, {3 * C}]"]


def test_wrong_lm_head_shape(tmp_path, cfg, sd):
    path = write_save_pretrained_safetensors(tmp_path / "m.safetensors", sd, lm_head=sd["wte.weight"][:-1])
    V, C = cfg.vocab_size, cfg.n_embd
    assert load_error(path, cfg).problems == [
        f"tensor 'lm_head.weight' has shape [{V - 1}, {C}], expected [{V}, {C}]"]


def test_unsupported_dtype(tmp_path, cfg, sd):
    tensors = hub_layout(sd, cfg)
    tensors["ln_f.weight"] = tensors["ln_f.weight"].astype(np.float64)
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path))  # save_tensors would cast everything to one dtype
    assert load_error(path, cfg).problems == [
        "tensor 'ln_f.weight' has unsupported dtype F64 (supported: F32, F16, BF16)"]


def test_mask_buffers_of_any_dtype_are_skipped(tmp_path, cfg, sd):
    tensors = hub_layout(sd, cfg)
    tensors["h.0.attn.bias"] = tensors["h.0.attn.bias"].astype(np.uint8)
    save_file(tensors, str(tmp_path / "m.safetensors"))
    assert set(load_weights(tmp_path / "m.safetensors", cfg)) == set(sd)


def test_same_tensor_with_and_without_prefix(tmp_path, cfg, sd):
    tensors = {**hub_layout(sd, cfg), "transformer.wpe.weight": sd["wpe.weight"]}
    path = save_tensors(tmp_path / "m.safetensors", tensors)
    first, second = (n for n in header_names(path) if n.endswith("wpe.weight"))  # in the header's order
    assert load_error(path, cfg).problems == [
        f"tensor 'wpe.weight' appears twice: as '{first}' and as '{second}'"]


def test_every_problem_reported_at_once(tmp_path, cfg, sd):
    tensors = hub_layout(sd, cfg)
    del tensors["wpe.weight"]
    del tensors["h.0.ln_2.bias"]
    tensors["extra.weight"] = np.zeros(2, np.float32)
    tensors["h.1.mlp.c_proj.weight"] = np.zeros((3, 3), np.float32)
    tensors["ln_f.bias"] = np.zeros(cfg.n_embd, np.int32)
    save_file(tensors, str(tmp_path / "m.safetensors"))
    C = cfg.n_embd
    # Missing (grouped), unexpected, a shape, a dtype:
    assert load_error(tmp_path / "m.safetensors", cfg).problems == [
        "missing tensors (2): 'wpe.weight', 'h.0.ln_2.bias'",
        "unexpected tensors (1): 'extra.weight'",
        f"tensor 'h.1.mlp.c_proj.weight' has shape [3, 3], expected [{4 * C}, {C}]",
        "tensor 'ln_f.bias' has unsupported dtype I32 (supported: F32, F16, BF16)"]


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

    monkeypatch.setattr(reader_module, "open_regular_file", refuse)
    assert load_error(tmp_path / "m.safetensors", cfg).problems == [problem]


@pytest.mark.parametrize("content", [b"", b"\x01\x02\x03"])
def test_too_short(tmp_path, cfg, content):
    path = tmp_path / "m.safetensors"
    path.write_bytes(content)
    assert load_error(path, cfg).problems == [
        f"file is {len(content)} bytes, too short to be a safetensors file; {DAMAGED}"]


@pytest.mark.parametrize("length", [1000, 9])  # far past the end, and one byte past it
def test_header_length_bigger_than_file(tmp_path, cfg, length):
    path = tmp_path / "m.safetensors"
    path.write_bytes(length.to_bytes(8, "little") + b'{"a": 1}')
    assert load_error(path, cfg).problems == [
        f"header length {length} is bigger than the rest of the file (8 bytes): truncated or not a "
        f"safetensors file; {DAMAGED}"]


def test_absurd_header_length(tmp_path, cfg):
    path = tmp_path / "m.safetensors"
    path.write_bytes((2**63).to_bytes(8, "little") + b"{}")
    assert load_error(path, cfg).problems == [
        f"header length {2**63} is bigger than the rest of the file (2 bytes): truncated or not a "
        f"safetensors file; {DAMAGED}"]


def test_the_header_size_limit(tmp_path, monkeypatch):
    path = write_safetensors_raw(tmp_path / "m.safetensors", {"x": ("F32", (2,), b"\0" * 8)})
    header_len = int.from_bytes(path.read_bytes()[:8], "little")
    monkeypatch.setattr(reader_module, "MAX_HEADER_BYTES", header_len)
    assert set(read_safetensors_header(path).tensors) == {"x"}  # exactly at the limit: fine
    monkeypatch.setattr(reader_module, "MAX_HEADER_BYTES", header_len - 1)
    with pytest.raises(WeightsError) as info:
        read_safetensors_header(path)
    assert info.value.problems == [f"header length {header_len} exceeds the {header_len - 1}-byte limit"]


def json_reason(header: bytes) -> str:
    """Why Python's json refuses `header` (as the message quotes it: 100 characters at most)."""
    try:
        json.loads(header.decode("utf-8"))
    except (ValueError, RecursionError) as e:
        return str(e) if len(str(e)) < 100 else str(e)[:97] + "..."
    raise AssertionError("valid JSON")


@pytest.mark.parametrize(
    "header",
    [b'{"a": {"dtype": "F32", ', b"\xff\xfe{}", b"[" * 100_000 + b"]" * 100_000,
     b'{"a": {"shape": [' + b"9" * 5000 + b"]}}"],  # too long for int()
)
def test_a_header_that_is_not_json(tmp_path, cfg, header):
    path = tmp_path / "m.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header)
    reason = json_reason(header)
    assert load_error(path, cfg).problems == [
        f"header is not valid JSON ({reason}): truncated or not a safetensors file; {DAMAGED}"]


@pytest.mark.parametrize(
    "header, problem",
    [(b"[1, 2]", "header must be a JSON object, found list"),
     (b'"x"', "header must be a JSON object, found str"),
     (b'{"a": 3}', "tensor 'a': header entry must be an object, found int"),
     (b'{"a": [1]}', "tensor 'a': header entry must be an object, found list")],
)
def test_bad_header(tmp_path, cfg, header, problem):
    path = tmp_path / "m.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header)
    assert load_error(path, cfg).problems == [problem]


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
    for word in words:  # in the problems, not the message: the message holds the tmp path too
        assert word in " ".join(e.problems), word
    with pytest.raises(WeightsError) as info:
        read_safetensors_header(raw_file(tmp_path, override))
    assert info.value.problems == e.problems


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
    assert load_error(raw_file(tmp_path, override), cfg).problems == [
        "tensor 'a': data_offsets [0, 999] run past the end of the file (data section is 20 bytes): "
        "file truncated?",
        "tensor 'b': 'shape' must be a list of non-negative integers, found 'x'"]


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
    tensors = read_safetensors_header(path).tensors
    parse = weights_module._parse_header

    def parse_then_truncate(f, p, size):
        header = parse(f, p, size)
        os.truncate(path, size // 2)  # someone overwrites the file under us
        return header

    monkeypatch.setattr(weights_module, "_parse_header", parse_then_truncate)
    size = path.stat().st_size // 2
    (problem,) = load_error(path, cfg).problems
    head, tail = "file ended while reading tensor '", "' (file truncated while loading?)"
    assert problem.startswith(head) and problem.endswith(tail)
    assert tensors[problem[len(head) : -len(tail)]].end > size  # a tensor past the new end of the file


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
    from inferno.testing import _encode, save_pretrained_layout

    tensors = save_pretrained_layout(sd, lm_head=head)
    order = sorted(tensors, key=lambda k: k == "lm_head.weight")
    return write_safetensors_raw(path, {k: _encode(tensors[k], dtype) for k in order})


@pytest.mark.parametrize("dtype", DTYPES)
def test_truncated_untied_lm_head_is_a_weights_error(tmp_path, monkeypatch, cfg, sd, dtype):
    head = sd["wte.weight"].copy()
    head[0, 0] += 1.0  # differs in its first row: the comparison stops there, the full read hits the end
    path = _untied_file(tmp_path / "m.safetensors", sd, head, dtype)
    monkeypatch.setattr(weights_module, "COMPARE_CHUNK_BYTES", 4 * cfg.n_embd)  # compare one row at a time
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


# ------------------------------------------------------------------------------------ lists of names

# A block's twelve parameters, in the order GPT-2 defines them (the order "missing tensors" lists them in).
BLOCK = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
         "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
         "mlp.c_proj.weight", "mlp.c_proj.bias"]


def quoted(names) -> str:
    return ", ".join(f"'{n}'" for n in names)


def test_twelve_missing_tensors_are_all_named(tmp_path, cfg, sd):
    path = write_hub_safetensors(tmp_path / "m.safetensors", sd, cfg)
    e = load_error(path, small_config(n_layer=cfg.n_layer + 1))
    assert e.problems == [f"missing tensors (12): {quoted(f'h.{cfg.n_layer}.' + n for n in BLOCK)}"]


def test_layers_past_the_files_last_are_counted_not_listed(tmp_path, cfg, sd):
    path = write_hub_safetensors(tmp_path / "m.safetensors", sd, cfg)
    e = load_error(path, small_config(n_layer=cfg.n_layer + 3))
    last = cfg.n_layer + 2
    assert e.problems == [f"missing tensors (36): {quoted(f'h.{cfg.n_layer}.' + n for n in BLOCK)}, ... "
                          f"(24 more, through layer h.{last})"]


def test_twelve_unexpected_tensors_are_all_named_thirteen_are_cut(tmp_path, cfg, sd):
    path = write_hub_safetensors(tmp_path / "m.safetensors", sd, cfg)
    one_layer = small_config(n_layer=1)
    second = sorted("h.1." + n for n in BLOCK)
    assert load_error(path, one_layer).problems == [f"unexpected tensors (12): {quoted(second)}"]
    tensors = {**hub_layout(sd, cfg), "a.extra": np.zeros(1, np.float32)}
    path = save_tensors(tmp_path / "e.safetensors", tensors)
    assert load_error(path, one_layer).problems == [
        f"unexpected tensors (13): {quoted(['a.extra', *second[:11]])}, ... (1 more)"]
    tensors["b.extra"] = np.zeros(1, np.float32)
    path = save_tensors(tmp_path / "f.safetensors", tensors)
    assert load_error(path, one_layer).problems == [
        f"unexpected tensors (14): {quoted(['a.extra', 'b.extra', *second[:10]])}, ... (2 more)"]


# ------------------------------------------------------------------------------------ NaN and Inf


def with_values(sd, changes: dict[str, tuple]) -> dict[str, np.ndarray]:
    out = {k: v.copy() for k, v in sd.items()}
    for name, (index, values) in changes.items():
        out[name][index] = values
    return out


def test_every_non_finite_tensor_is_named_as_in_the_file_with_its_count(tmp_path, cfg, sd):
    bad = with_values(sd, {"wpe.weight": ((0, 0), np.nan),  # the very first element
                           "h.1.ln_2.bias": (slice(-2, None), [np.inf, -np.inf]),  # the last two
                           "h.0.attn.c_attn.weight": ((-1, slice(-3, None)), [np.nan, np.inf, np.nan])})
    path = write_save_pretrained_safetensors(tmp_path / "m.safetensors", bad)
    C = cfg.n_embd
    assert load_error(path, cfg).problems == [  # every one of them, in canonical order
        f"tensor 'transformer.wpe.weight' holds 1 non-finite value (NaN or Inf) of {cfg.n_positions * C}",
        f"tensor 'transformer.h.0.attn.c_attn.weight' holds 3 non-finite values (NaN or Inf) of {3 * C * C}",
        f"tensor 'transformer.h.1.ln_2.bias' holds 2 non-finite values (NaN or Inf) of {C}"]


def test_iter_weights_raises_when_it_reaches_the_non_finite_tensor(tmp_path, cfg, sd):
    bad = with_values(sd, {"ln_f.bias": ((3,), np.inf), "h.0.ln_1.weight": ((0,), np.nan)})
    path = write_hub_safetensors(tmp_path / "m.safetensors", bad, cfg)
    header = read_safetensors_header(path)
    first_bad = min(("ln_f.bias", "h.0.ln_1.weight"), key=lambda n: header.tensors[n].start)
    yielded = []
    with pytest.raises(WeightsError) as info:
        for name, _ in weights_module.iter_weights(path, cfg):
            yielded.append(name)
    assert info.value.problems == [
        f"tensor '{first_bad}' holds 1 non-finite value (NaN or Inf) of {cfg.n_embd}"]
    # Raised when that tensor is reached: the largest one (read first) and those stored before it came.
    assert sd[yielded[0]].size == max(a.size for a in sd.values())
    before = {n for n in sd if header.tensors[n].start < header.tensors[first_bad].start}
    assert set(yielded) == {yielded[0], *before} and len(yielded) == len(set(yielded)) > 1


@pytest.mark.parametrize("order", ["C", "F"])
def test_the_non_finite_check_sums_each_value_once_as_it_is_read(tmp_path, monkeypatch, cfg, sd, order):
    # Each piece is summed right after it is read (C order: views of the loaded array; F order: the rows
    # read before they are transposed), every value once; finite weights are never counted one by one.
    path = write_hub_safetensors(tmp_path / "m.safetensors", sd, cfg)
    monkeypatch.setattr(reader_module, "READ_CHUNK_BYTES", 28)
    monkeypatch.setattr(reader_module, "TRANSPOSE_CHUNK_BYTES", 4 * 2 * cfg.n_embd)
    seen, real = [], reader_module._sums_finite
    monkeypatch.setattr(reader_module, "_sums_finite", lambda a: seen.append(a) or real(a))
    monkeypatch.setattr(weights_module, "_count_nonfinite", lambda a: pytest.fail("counted"))
    w = load_weights(path, cfg, lambda name: order)
    monkeypatch.undo()
    assert sum(x.size for x in seen) == sum(a.size for a in sd.values())
    two_d = {n for n, a in sd.items() if a.ndim == 2}
    if order == "C":
        assert all(x.size <= 7 for x in seen)
        assert all(any(np.shares_memory(x, a) for a in w.values()) for x in seen)
    else:
        assert all(x.size <= 7 or x.shape[0] <= 2 for x in seen) and two_d
    assert w["h.0.mlp.c_fc.weight"].flags.f_contiguous == (order == "F")


def test_a_sum_that_overflows_is_no_false_alarm(tmp_path, cfg, sd):
    # float32 sums of huge finite values overflow to inf: the exact count then clears the tensor.
    sd = dict(sd)
    big = np.full_like(sd["h.0.mlp.c_fc.bias"], 3e38)
    sd["h.0.mlp.c_fc.bias"] = big
    w = load_weights(write_hub_safetensors(tmp_path / "m.safetensors", sd, cfg), cfg)
    assert np.array_equal(w["h.0.mlp.c_fc.bias"], big)


# ------------------------------------------------------------------------------------ memory order


class Toy:
    """An object whose bound method is the order callback (as a backend's `weight_order` is)."""

    def __init__(self, name, answer):
        self.name, self.answer = name, answer

    def weight_order(self, name):
        return self.answer(name)


def order_error(path, cfg, order) -> str:
    with pytest.raises(weights_module.WeightOrderError) as info:
        load_weights(path, cfg, order)
    assert isinstance(info.value, ValueError)
    return str(info.value)


def test_an_order_callback_that_raises_is_named_with_the_tensor(tmp_path, cfg, sd):
    path = write_hub_safetensors(tmp_path / "m.safetensors", sd, cfg)

    def refuse(name):
        if name == "ln_f.bias":
            raise ValueError("no\n   order   for it ")
        return "C"

    def bare(name):
        raise RuntimeError()

    assert order_error(path, cfg, refuse) == (
        "the order callback('ln_f.bias') raised ValueError: no order for it")
    first = next(n for n in header_names(path) if ".attn.bias" not in n)
    assert order_error(path, cfg, bare) == f"the order callback('{first}') raised RuntimeError"
    assert order_error(path, cfg, Toy("toy", refuse).weight_order) == (
        "backend 'toy': weight_order('ln_f.bias') raised ValueError: no order for it")
    assert order_error(path, cfg, Toy(3, refuse).weight_order) == (  # a name that is not a string
        "the order callback('ln_f.bias') raised ValueError: no order for it")


def test_every_bad_order_is_refused_the_first_three_named(tmp_path, cfg, sd):
    path = write_hub_safetensors(tmp_path / "m.safetensors", sd, cfg)
    answers = {"wte.weight": "T", "ln_f.bias": None, "h.1.ln_1.weight": b"C", "h.0.ln_2.bias": "f"}
    named = [n for n in header_names(path) if n in answers]  # in the header's order
    shown = ", ".join(f"{answers[n]!r} for tensor '{n}'" for n in named[:3])
    assert order_error(path, cfg, lambda n: answers.get(n, "F")) == (
        f"memory order must be 'C' or 'F', got {shown} (from the order callback)")
    assert order_error(path, cfg, Toy("toy", lambda n: answers.get(n, "C")).weight_order) == (
        f"memory order must be 'C' or 'F', got {shown} (from backend 'toy': weight_order)")
    one = {"wpe.weight": "FF"}
    assert order_error(path, cfg, lambda n: one.get(n, "C")) == (
        "memory order must be 'C' or 'F', got 'FF' for tensor 'wpe.weight' (from the order callback)")


# ------------------------------------------------------------------------------------ memory


def test_weights_bigger_than_the_memory_limit_are_refused_before_reading(tmp_path, monkeypatch, cfg, sd):
    path = write_hub_safetensors(tmp_path / "m.safetensors", sd, cfg)
    need = 4 * sum(a.size for a in sd.values())  # float32 bytes of every parameter
    reads = []
    read = weights_module._read_tensor
    monkeypatch.setattr(weights_module, "_read_tensor", lambda *args: reads.append(args) or read(*args))
    monkeypatch.setattr(weights_module, "memory_limit", lambda: need - 1)
    with pytest.raises(weights_module.WeightsMemoryError) as info:
        load_weights(path, cfg)
    assert info.value.problems == [f"the weights need {need} bytes of memory as float32, more than the "
                                   f"{need - 1} bytes this process can have"]
    assert isinstance(info.value, MemoryError) and not reads
    monkeypatch.setattr(weights_module, "memory_limit", lambda: need)  # exactly enough
    assert set(load_weights(path, cfg)) == set(sd)
    monkeypatch.setattr(weights_module, "memory_limit", lambda: None)  # unknown: not checked
    assert set(load_weights(path, cfg)) == set(sd)


def test_an_untied_head_counts_in_the_memory_needed(tmp_path, monkeypatch, cfg, sd):
    head = sd["wte.weight"] + np.float32(1)
    path = write_save_pretrained_safetensors(tmp_path / "m.safetensors", sd, lm_head=head)
    need = 4 * (sum(a.size for a in sd.values()) + head.size)
    monkeypatch.setattr(weights_module, "memory_limit", lambda: need - 1)
    assert load_error(path, cfg).problems == [f"the weights need {need} bytes of memory as float32, more "
                                              f"than the {need - 1} bytes this process can have"]
    monkeypatch.setattr(weights_module, "memory_limit", lambda: need)
    assert "lm_head.weight" in load_weights(path, cfg)


@pytest.mark.parametrize("limit, here", [(2_500_000, " (2.5 MB of memory here)"), (None, "")])
def test_running_out_of_memory_while_reading_says_how_much_is_needed(tmp_path, monkeypatch, cfg, sd,
                                                                      limit, here):
    path = write_hub_safetensors(tmp_path / "m.safetensors", sd, cfg)
    need = 4 * sum(a.size for a in sd.values())

    def no_memory(*args):
        raise MemoryError

    monkeypatch.setattr(weights_module, "memory_limit", lambda: limit)
    monkeypatch.setattr(weights_module, "_read_tensor", no_memory)
    for load in (load_weights, lambda *a: list(weights_module.iter_weights(*a))):
        with pytest.raises(weights_module.WeightsMemoryError) as info:
            load(path, cfg)
        assert info.value.problems == [f"not enough memory: the weights need {need} bytes as float32{here}"]
        assert info.value.path == str(path)


@pytest.mark.parametrize(
    "n, text",
    [(0, "0 bytes"), (999_999, "999999 bytes"), (1_000_000, "1.0 MB"), (2_540_000, "2.5 MB"),
     (999_949_999, "999.9 MB"), (1_000_000_000, "1.0 GB"), (38_600_000_000, "38.6 GB"),
     (1_000_000_000_000, "1.0 TB"), (1_100_000_000_000, "1.1 TB"), (123_000_000_000_000, "123.0 TB")],
)
def test_sizes_in_words(n, text):
    assert weights_module._size(n) == text


class FakeFiles:
    """`open` for inferno.models.weights: these paths hold this text, every other one does not exist."""

    def __init__(self, files: dict[str, str]):
        self.files = files

    def __call__(self, name, *args, **kwargs):
        if name not in self.files:
            raise FileNotFoundError(2, "No such file or directory", name)
        return io.StringIO(self.files[name])


def fake_sysconf(values: dict[str, int]):
    def sysconf(name):
        if name not in values:
            raise ValueError("unrecognized configuration name")
        return values[name]
    return sysconf


CGROUP_V2, CGROUP_V1 = "/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"
PAGES = {"SC_PHYS_PAGES": 1000, "SC_PAGE_SIZE": 4096}


@pytest.mark.parametrize(
    "sysconf, swap, files, limit",
    [(PAGES, 0, {}, 4_096_000),
     (PAGES, 5000, {}, 4_101_000),  # physical memory plus swap
     ({}, 5000, {}, None),  # nothing known
     ({"SC_PHYS_PAGES": 1000}, 0, {}, None),
     ({"SC_PAGE_SIZE": 4096}, 0, {}, None),
     (PAGES, 0, {CGROUP_V2: "5000\n"}, 5000),  # the cgroup's limit is lower
     (PAGES, 0, {CGROUP_V2: "9000000000"}, 4_096_000),  # the machine's is
     (PAGES, 0, {CGROUP_V2: "max\n"}, 4_096_000),  # no cgroup limit
     (PAGES, 0, {CGROUP_V1: "7000"}, 7000),
     ({}, 0, {CGROUP_V1: "7000"}, 7000),
     ({}, 0, {CGROUP_V2: "6000", CGROUP_V1: "7000"}, 6000),
     ({}, 0, {CGROUP_V2: "max", CGROUP_V1: "7000"}, 7000)],
)
def test_the_memory_limit(monkeypatch, sysconf, swap, files, limit):
    monkeypatch.setattr(weights_module.os, "sysconf", fake_sysconf(sysconf))
    monkeypatch.setattr(weights_module, "swap_bytes", lambda: swap)
    monkeypatch.setattr(weights_module, "open", FakeFiles(files), raising=False)
    assert weights_module.memory_limit() == limit


@pytest.mark.parametrize(
    "meminfo, swap",
    [("MemTotal:       16314320 kB\nSwapCached:  0 kB\nSwapTotal:       2097148 kB\nSwapFree: 1 kB\n",
      2097148 * 1024),
     ("MemTotal:       16314320 kB\nSwapTotal:             0 kB\n", 0),
     ("MemTotal:       16314320 kB\n", 0),
     ("SwapTotal: lots\n", 0),
     ("SwapTotal:\n", 0)],
)
def test_swap_from_proc_meminfo(monkeypatch, meminfo, swap):
    monkeypatch.setattr(weights_module, "open", FakeFiles({"/proc/meminfo": meminfo}), raising=False)
    assert weights_module.swap_bytes() == swap
    monkeypatch.setattr(weights_module, "open", FakeFiles({}), raising=False)
    assert weights_module.swap_bytes() == 0


# ------------------------------------------------------------------------------------ reading


class Trickle:
    """A file whose reads return at most `most` bytes at a time (a pipe, a network file system)."""

    def __init__(self, f, most: int):
        self.f, self.most, self.reads = f, most, 0

    def readinto(self, buffer):
        self.reads += 1
        with memoryview(buffer) as view:
            return self.f.readinto(view[: self.most])

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


@pytest.mark.parametrize("dtype", DTYPES)
def test_short_reads_are_continued(tmp_path, monkeypatch, dtype):
    directory, config, expected = make_model_dir(tmp_path, dtype=dtype, seed=5)
    opened = []
    real_open = weights_module._open
    monkeypatch.setattr(weights_module, "_open",
                        lambda p: opened.append(Trickle(real_open(p), 100)) or opened[-1])
    w = load_weights(directory / "model.safetensors", config, lambda name: "F" if "c_fc" in name else "C")
    assert opened[0].reads > len(w)  # some tensors took several reads
    for name, array in w.items():
        np.testing.assert_array_equal(array, expected[name], err_msg=name)


def test_row_parts():
    info = weights_module.TensorInfo("t", "F16", (5, 3), 100, 130)  # rows of 6 bytes
    TI = weights_module.TensorInfo
    assert list(weights_module._row_parts(info, 13)) == [  # 2 rows (12 bytes) per part
        (0, TI("t", "F16", (2, 3), 100, 112)), (2, TI("t", "F16", (2, 3), 112, 124)),
        (4, TI("t", "F16", (1, 3), 124, 130))]
    assert list(weights_module._row_parts(info, 5)) == [  # less than a row: one row each
        (r, TI("t", "F16", (1, 3), 100 + 6 * r, 106 + 6 * r)) for r in range(5)]
    assert list(weights_module._row_parts(info, 1000)) == [(0, info)]
    cube = TI("c", "F32", (3, 2, 2), 8, 56)  # rows of 16 bytes
    assert list(weights_module._row_parts(cube, 32)) == [(0, TI("c", "F32", (2, 2, 2), 8, 40)),
                                                         (2, TI("c", "F32", (1, 2, 2), 40, 56))]


@pytest.mark.parametrize("rows", [1, 2, 5])
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_head_is_compared_with_wte_a_few_rows_at_a_time(tmp_path, monkeypatch, cfg, sd, rows, dtype):
    # The comparison reads `rows` rows of each (COMPARE_CHUNK_BYTES of float32; at least one row), the
    # same rows from both, every row once.
    C, V = cfg.n_embd, cfg.vocab_size
    monkeypatch.setattr(weights_module, "COMPARE_CHUNK_BYTES", max(1, rows * 4 * C - 1) if rows == 1
                        else rows * 4 * C + 3)
    path = write_save_pretrained_safetensors(tmp_path / "m.safetensors", sd, dtype)
    parts = []
    read = weights_module._read_plain

    def spy(f, info, path):
        if info.shape[0] < V and info.name in ("lm_head.weight", "transformer.wte.weight"):
            parts.append((info.name, info.shape, info.start))
        return read(f, info, path)

    monkeypatch.setattr(weights_module, "_read_plain", spy)
    assert "lm_head.weight" not in load_weights(path, cfg)  # tied
    header = read_safetensors_header(path)
    row_bytes = C * (4 if dtype == "F32" else 2)
    want = []
    for r0 in range(0, V, rows):
        n = min(rows, V - r0)
        for name in ("lm_head.weight", "transformer.wte.weight"):
            want.append((name, (n, C), header.tensors[name].start + r0 * row_bytes))
    assert parts == want


def test_a_file_truncated_while_comparing_the_head_is_a_weights_error(tmp_path, monkeypatch, cfg, sd):
    # wte stored last, lm_head the same values before it: the comparison reads wte's last rows from a file
    # cut short since the header was read.
    from inferno.testing import _encode, save_pretrained_layout

    tensors = save_pretrained_layout(sd)
    order = sorted(tensors, key=lambda k: k == "transformer.wte.weight")
    path = write_safetensors_raw(tmp_path / "m.safetensors", {k: _encode(tensors[k], "F32") for k in order})
    same = weights_module._same_tensors

    def truncate_then_compare(f, a, b, p):
        os.truncate(path, b.end - 1)
        return same(f, a, b, p)

    monkeypatch.setattr(weights_module, "_same_tensors", truncate_then_compare)
    assert load_error(path, cfg).problems == [
        "file ended while reading tensor 'transformer.wte.weight' (file truncated while loading?)"]


class FstatLies:
    """`os` for inferno.models.weights, whose fstat says the file is bigger than it is (it shrank since)."""

    def __getattr__(self, name):
        return getattr(os, name)

    def fstat(self, fd):
        return os.stat_result((0, 0, 0, 0, 0, 0, 10_000, 0, 0, 0))


@pytest.mark.parametrize(
    "content, what",
    [(b"\1\2\3", "the header length"), ((100).to_bytes(8, "little") + b'{"a": 1}', "the header")],
)
def test_a_file_that_shrinks_before_the_header_is_read(tmp_path, monkeypatch, cfg, content, what):
    path = tmp_path / "m.safetensors"
    path.write_bytes(content)
    monkeypatch.setattr(weights_module, "os", FstatLies())
    monkeypatch.setattr(reader_module, "os", FstatLies())
    problem = f"file ended while reading {what} (file changed while reading?)"
    assert load_error(path, cfg).problems == [problem]
    with pytest.raises(WeightsError) as info:
        read_safetensors_header(path)
    assert info.value.problems == [problem]


def test_row_parts_of_empty_rows():
    TI = weights_module.TensorInfo
    empty = TI("z", "F32", (4, 0), 8, 8)  # rows of 0 bytes: chunk_bytes rows a part
    assert list(weights_module._row_parts(empty, 3)) == [(0, TI("z", "F32", (3, 0), 8, 8)),
                                                         (3, TI("z", "F32", (1, 0), 8, 8))]


def test_a_file_without_layers_has_every_layer_missing(tmp_path, cfg, sd):
    path = save_tensors(tmp_path / "m.safetensors", {k: v for k, v in sd.items() if not k.startswith("h.")})
    e = load_error(path, small_config(n_layer=3))
    assert e.problems == [f"missing tensors (36): {quoted('h.0.' + n for n in BLOCK)}, ... "
                          "(24 more, through layer h.2)"]


def test_missing_tensors_besides_whole_layers_are_named_first(tmp_path, cfg, sd):
    path = save_tensors(tmp_path / "m.safetensors", {k: v for k, v in sd.items() if k != "wpe.weight"})
    e = load_error(path, small_config(n_layer=cfg.n_layer + 2))
    # wpe and the first missing layer's twelve are the 13 listed or counted by name; one more layer after.
    names = ["wpe.weight", *(f"h.{cfg.n_layer}." + n for n in BLOCK)]
    assert e.problems == [f"missing tensors (25): {quoted(names[:12])}, ... (13 more, through layer "
                          f"h.{cfg.n_layer + 1})"]


def test_an_eight_byte_file_is_long_enough_to_hold_an_empty_header(tmp_path, cfg):
    path = tmp_path / "m.safetensors"
    path.write_bytes(b"\0" * 8)
    assert load_error(path, cfg).problems == [
        f"header is not valid JSON ({json_reason(b'')}): truncated or not a safetensors file; {DAMAGED}"]


def test_an_overlap_names_the_tensor_reaching_furthest(tmp_path):
    # c overlaps both a [0, 8) and b [4, 8): named after a, the first whose data reaches that far.
    override = {"b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
                "c": {"dtype": "F32", "shape": [1], "data_offsets": [6, 10]},
                "d": {"dtype": "F16", "shape": [5], "data_offsets": [10, 20]}}
    with pytest.raises(WeightsError) as info:
        read_safetensors_header(raw_file(tmp_path, override))
    assert info.value.problems == ["tensor 'b' data overlaps tensor 'a'",
                                   "tensor 'c' data overlaps tensor 'a'"]


def test_the_file_is_read_unbuffered_without_warnings(tmp_path, cfg, sd):
    path = write_hub_safetensors(tmp_path / "m.safetensors", sd, cfg)
    with weights_module._open(path) as f:  # straight from the kernel into the arrays
        assert isinstance(f, io.RawIOBase)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert set(load_weights(path, cfg)) == set(sd)


def test_iter_weights_gives_the_largest_first_then_the_file_order(tmp_path):
    config = small_config(vocab_size=10)  # wte is not the largest tensor here: the MLP's are
    sd = random_state_dict(config, seed=2)
    from inferno.testing import _encode

    names = sorted(sd, key=lambda k: (k.count("."), k[::-1]))  # neither alphabetical nor canonical
    path = write_safetensors_raw(tmp_path / "m.safetensors", {k: _encode(sd[k], "F32") for k in names})
    got = [name for name, _ in weights_module.iter_weights(path, config)]
    largest = max(a.size for a in sd.values())
    assert sd[got[0]].size == largest and got[0] != "wte.weight"
    assert got[1:] == [n for n in names if n != got[0]]
