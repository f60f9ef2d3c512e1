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


def pytest_addoption(parser):
    parser.addoption("--amx-emulated", action="store_true",
                     help="run every test on the kernels built with AMX's tiles emulated in C "
                          "(amx_kernels.py): the AMX paths wherever a test's rows take them, on any CPU with "
                          "AVX-512 VNNI")


def pytest_configure(config):
    """With --amx-emulated, or INFERNO_HALF_SANITIZE=1, the backend's kernels are the emulated build (the
    sanitized one) before any test module reads them. Sanitized, a CPU without AVX-512 VNNI runs that
    build's other paths; --amx-emulated needs the emulation itself."""
    from amx_kernels import SANITIZED, amx_kernels

    emulate = config.getoption("--amx-emulated")
    if emulate or SANITIZED:
        kernels, why, _ = amx_kernels(emulated=True)
        if kernels is None or (emulate and why):
            raise pytest.UsageError(f"{'--amx-emulated' if emulate else 'INFERNO_HALF_SANITIZE=1'}: {why}")
        hb._KERNELS = kernels


def pytest_report_header(config):
    """Says in the run's header how the AMX tests run here (on real tiles, emulated, or not at all), and
    whether the kernels under test are sanitized."""
    from amx_kernels import SANITIZED, amx_kernels

    _, why, how = amx_kernels(emulated=config.getoption("--amx-emulated") or SANITIZED)
    sanitized = "; every kernel built under AddressSanitizer and UBSan" if SANITIZED else ""
    return f"inferno-gpt2-half's AMX paths: {how or 'not tested: ' + why}{sanitized}"
