"""Shared fixtures: `model_dir` (inferno's, shared with the other plugins), a small random GPT-2 on disk
with the real GPT-2 tokenizer; `kernel_path`, each kernel test on every SIMD path this CPU has."""

import pytest
from inferno.testing_fixtures import model_dir  # noqa: F401 - pytest finds the fixture by its name

import inferno_half.backend as hb


@pytest.fixture(params=["detected", "avx2", "portable"])
def kernel_path(request):
    """Each kernel test on every path this CPU can run: the detected one (AVX-512 where the CPU has it),
    AVX2 + FMA + F16C (what x86 CPUs without AVX-512 run), and portable C (ARM, older CPUs)."""
    kernels = hb._KERNELS  # (a test may monkeypatch hb._KERNELS away before this resets the path)
    if kernels is None:
        if request.param != "detected":
            pytest.skip("the C kernels are not built")
        yield request.param
        return
    if request.param == "portable":
        assert kernels.force_portable(1) == 0
    elif request.param == "avx2":
        if kernels.force_avx2(1) != 1:
            kernels.force_avx2(0)
            pytest.skip("this CPU has no AVX2 + FMA + F16C")
    try:
        yield request.param
    finally:
        kernels.force_portable(0)
