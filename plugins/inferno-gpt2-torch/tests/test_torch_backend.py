"""The torch backend in this process: options, devices, and whole models against the numpy backend."""

from __future__ import annotations

import re

import inferno
import numpy as np
import pytest
from inferno.backends.registry import get_backend

torch = pytest.importorskip("torch")

from inferno_torch import TorchBackend  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else []) + (
    ["mps"] if torch.backends.mps.is_available() else [])

# End-to-end tolerance on the logits, relative to the largest |logit|: float32 agrees with NumPy's float32
# to rounding (~1e-6 measured); the half types round every activation to 8 (bfloat16) or 11 (float16)
# significant bits (measured ~1e-2 and ~1e-3 on this model), the conformance suite's own tolerances.
TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}

PROMPTS = [
    "Hello", "The quick brown fox", "Once upon a time", "In 1492, Columbus", "def main():",
    "¿Dónde está la biblioteca?", "GPT-2 is a transformer", "   leading spaces", "Numbers: 1, 2, 3,",
    "新年快乐",
]


@pytest.fixture(scope="module")
def numpy_pipe(model_dir):
    return inferno.load(model_dir, "numpy", download=False)


# ------------------------------------------------------------------------------------------- options


def test_defaults():
    be = get_backend("torch")
    assert isinstance(be, TorchBackend)
    assert be.dtype == np.float32 and be.float_dtype == torch.float32
    want = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    assert be.device.type == want  # auto: cuda, then mps, then cpu


@pytest.mark.parametrize("spec, device, dtype, conformance_dtype", [
    ("torch:device=cpu", "cpu", torch.float32, "float32"),
    ("torch:device=auto,dtype=float32", None, torch.float32, "float32"),
    ("torch:device=CPU", "cpu", torch.float32, "float32"),
    ("torch:device=cpu,dtype=bfloat16", "cpu", torch.bfloat16, "bfloat16"),
    ("torch:dtype=float16", None, torch.float16, "float16"),
    ("torch:device=cpu,dtype=float64", "cpu", torch.float64, "float64"),
])
def test_options(spec, device, dtype, conformance_dtype):
    from inferno.conformance.checks import dtype_name

    be = get_backend(spec)
    assert be.float_dtype == dtype
    assert device is None or be.device == torch.device(device)
    # The conformance suite picks its tolerances from `dtype` (NumPy has no bfloat16: then the name).
    assert dtype_name(be.dtype) == conformance_dtype
    assert be.from_numpy(np.ones(3, np.float32)).dtype == dtype
    assert be.from_numpy(np.arange(3)).dtype == torch.int64


def test_python_api_takes_torch_objects():
    be = TorchBackend(device=torch.device("cpu"), dtype=torch.bfloat16)
    assert (be.device, be.float_dtype) == (torch.device("cpu"), torch.bfloat16)


@pytest.mark.parametrize("spec, needle", [
    ("torch:dtype=int8", "option dtype='int8' is not supported (choose one of float32, bfloat16, float16"),
    ("torch:dtype=fp32", "option dtype='fp32'"),
    ("torch:dtype=16", "option dtype=16"),
    ("torch:device=gpu", "option device='gpu' is not a device (expected auto, cpu, cuda, cuda:N or mps)"),
    ("torch:device=meta", "device type 'meta' is not supported"),
    ("torch:device=true", "option device=True is not a device"),
    ("torch:device=cuda:99", "option device='cuda:99'"),
    ("torch:threads=0", "option threads=0 must be an integer >= 1 or 'auto'"),
    ("torch:threads=two", "option threads='two'"),
    ("torch:threads=1.5", "option threads=1.5"),
    ("torch:devcie=cpu", "'devcie' (its options: device, dtype, threads, onednn)"),  # the registry's check
])
def test_bad_options_name_the_option(spec, needle):
    with pytest.raises(ValueError, match="backend 'torch'") as info:  # the registry's BackendOptionError
        get_backend(spec)
    assert needle in str(info.value)


def test_threads_option():
    before = torch.get_num_threads()
    try:
        get_backend("torch:device=cpu,threads=1")
        assert torch.get_num_threads() == 1
        get_backend("torch:threads=auto")
        assert torch.get_num_threads() == 1  # auto leaves torch's setting alone
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_missing_is_a_clear_error():
    with pytest.raises(ValueError, match=r"option device='cuda': CUDA is not available \("):
        get_backend("torch:device=cuda")


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="MPS is available here")
def test_mps_missing_is_a_clear_error():
    with pytest.raises(ValueError, match="option device='mps': MPS is not available here"):
        get_backend("torch:device=mps")


def test_unavailable_reason(monkeypatch):
    assert TorchBackend.unavailable_reason() is None
    import importlib.util

    real = importlib.util.find_spec

    def find_spec(name, *args):
        if name == "torch":
            raise ModuleNotFoundError("blocked")
        return real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert "needs PyTorch: pip install torch" in TorchBackend.unavailable_reason()


# ------------------------------------------------------------------------------------------- kernels


def test_to_numpy_is_float32_and_on_the_host():
    be = get_backend("torch:device=cpu,dtype=bfloat16")
    out = be.to_numpy(be.from_numpy(np.array([1.5, -2.0], np.float32)))
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    assert out.tolist() == [1.5, -2.0]


def test_kv_cache_is_written_in_place():
    be = get_backend("torch:device=cpu")
    k_cache, v_cache = be.new_kv_cache(1, 2, 6, 4)
    k = be.from_numpy(np.ones((1, 2, 3, 4), np.float32))
    k2, v2 = be.write_kv(k_cache, v_cache, k, 2 * k, 1)
    assert k2 is k_cache and v2 is v_cache
    assert be.to_numpy(v_cache)[0, 0, :, 0].tolist() == [0, 2, 2, 2, 0, 0]


@pytest.mark.parametrize("offset, t", [(0, 5), (3, 4), (6, 1), (0, 1)])
def test_attention_masks_like_the_array_api_kernel(offset, t):
    # Every mask path of the SDPA override (none, is_causal, explicit) against the inherited kernel.
    from inferno.backends.array_api import ArrayApiBackend

    be = get_backend("torch:device=cpu,dtype=float64")
    rng = np.random.default_rng(offset * 10 + t)
    q = be.from_numpy(rng.standard_normal((2, 3, t, 8)))
    k_cache, v_cache = (be.from_numpy(rng.standard_normal((2, 3, 12, 8))) for _ in range(2))
    got = be.to_numpy(be.attention(q, k_cache, v_cache, offset))
    want = be.to_numpy(ArrayApiBackend.attention(be, q, k_cache, v_cache, offset))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_logits_match_numpy(model_dir, numpy_pipe, device, dtype):
    pipe = inferno.load(model_dir, f"torch:device={device},dtype={dtype}", download=False)
    ids = numpy_pipe.encode("The quick brown fox jumps over the lazy dog. " * 3)
    want = numpy_pipe.logits(ids)
    got = pipe.logits(ids)
    assert got.dtype == np.float32 and got.shape == want.shape == (len(ids), 50257)
    scale = float(np.abs(want).max())
    worst = float(np.abs(got - want).max())
    assert worst <= TOLERANCE[dtype] * scale, f"{dtype}: max error {worst:.3g}, max |logit| {scale:.3g}"


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_ids_match_numpy(model_dir, numpy_pipe, device):
    # Greedy decoding runs the prefill and then the cached T=1 steps.
    pipe = inferno.load(model_dir, f"torch:device={device}", download=False)
    for prompt in PROMPTS:
        want = numpy_pipe.generate(prompt, max_new_tokens=12, stop_at_eos=False)
        got = pipe.generate(prompt, max_new_tokens=12, stop_at_eos=False)
        assert got.ids == want.ids, prompt
        assert got.backend == "torch"


# ------------------------------------------------------------------------- oneDNN-packed weights (CPU)

ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
needs_onednn = pytest.mark.skipif(not ONEDNN, reason=f"torch {torch.__version__} is built without oneDNN")


@needs_onednn
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_onednn_packs_the_linear_weights_and_the_head(dtype):
    from inferno_torch.backend import LinearWeight

    be = get_backend(f"torch:device=cpu,dtype={dtype}")
    if dtype == "bfloat16" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        assert not be.onednn
        return
    assert be.onednn
    w = be.prepare_weight("h.0.mlp.c_fc.weight", np.ones((4, 6), np.float32))
    assert isinstance(w, LinearWeight) and w.packed and w.shape == (4, 6)
    assert be.weight_order("h.0.mlp.c_fc.weight") == "F" and be.weight_order("h.0.ln_1.weight") == "C"
    wte = be.prepare_weight("wte.weight", np.ones((10, 4), np.float32))
    assert isinstance(wte, torch.Tensor) and wte._inferno_head.packed  # plain for the gather, packed head


def test_onednn_false_keeps_plain_tensors():
    be = get_backend("torch:device=cpu,onednn=false")
    assert not be.onednn
    assert isinstance(be.prepare_weight("h.0.mlp.c_fc.weight", np.ones((4, 6), np.float32)), torch.Tensor)
    assert be.weight_order("h.0.mlp.c_fc.weight") == "C"


@pytest.mark.parametrize("spec, needle", [
    ("torch:device=cpu,dtype=float16,onednn=true", "option onednn=true is not available: it is used for "
                                                    "float32 and bfloat16, not float16"),
    ("torch:onednn=maybe", "option onednn='maybe' must be auto, true or false"),
    ("torch:onednn=2", "option onednn=2 must be auto, true or false"),
])
def test_bad_onednn_option(spec, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        get_backend(spec)


@needs_onednn
@pytest.mark.parametrize("onednn", ["true", "false"])
def test_greedy_ids_and_logits_with_and_without_onednn(model_dir, numpy_pipe, onednn):
    # Packed weights, the fused GELU post-op and the packed head give numpy's greedy ids and logits.
    pipe = inferno.load(model_dir, f"torch:device=cpu,onednn={onednn}", download=False)
    for prompt in PROMPTS:
        want = numpy_pipe.generate(prompt, max_new_tokens=12, stop_at_eos=False)
        assert pipe.generate(prompt, max_new_tokens=12, stop_at_eos=False).ids == want.ids, prompt
    ids = numpy_pipe.encode(PROMPTS[0])
    want = numpy_pipe.logits(ids)
    assert np.abs(pipe.logits(ids) - want).max() <= TOLERANCE["float32"] * np.abs(want).max()


# ------------------------------------------------------------------------------------- load memory

RSS_SCRIPT = r"""
import sys
from pathlib import Path

from inferno.backends.registry import get_backend
from inferno.models.config import Gpt2Config
from inferno.models.gpt2 import Gpt2
from inferno.models.weights import iter_weights


def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024


def size(a):
    return 0 if a is None else int(getattr(a, "weight", a).nbytes)  # a LinearWeight wraps its tensor


directory = Path(sys.argv[1])
be = get_backend(sys.argv[2])
config = Gpt2Config.from_file(directory / "config.json")
base = status("VmRSS")
# What inferno.load does with the weights (the tokenizer's memory is not the weights').
model = Gpt2.from_weights(config, iter_weights(directory / "model.safetensors", config, be.weight_order), be)
held = sum(size(a) + size(getattr(a, "_inferno_head", None))
           for name, a in model.named_weights() if not (name == "lm_head.weight" and a is model.wte))
print(status("VmHWM") - base, held)
"""


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.parametrize("dtype, held_at_least", [("float32", 640e6), ("bfloat16", 320e6)])
def test_load_peak_memory_is_at_most_1_2x_the_weights_held(tmp_path, dtype, held_at_least):
    # At GPT-2 124M's shape, on the CPU with oneDNN-packed weights (wte held twice: plain and packed).
    # Each linear weight passes through freed temporaries that glibc's heap would keep without the
    # backend's malloc_trim (measured above this limit in bfloat16 without it; docs/benchmarks.md).
    import json
    import subprocess
    import sys

    from inferno.models.config import GPT2_124M
    from inferno.testing import random_weights
    from safetensors.numpy import save_file

    if not TorchBackend(device="cpu", dtype=dtype).onednn:  # bfloat16 also needs the CPU's support
        pytest.skip(f"oneDNN does not run {dtype} with this torch on this CPU: nothing is packed")
    directory = tmp_path / "model"
    directory.mkdir()
    save_file(random_weights(GPT2_124M), str(directory / "model.safetensors"))
    config = {k: getattr(GPT2_124M, k) for k in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")}
    (directory / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    spec = f"torch:device=cpu,dtype={dtype}"
    out = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(directory), spec],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    peak, held = map(int, out.stdout.split())
    assert held > held_at_least
    assert peak <= 1.2 * held, f"peak RSS grew {peak / 1e6:.0f} MB loading {held / 1e6:.0f} MB of weights"
