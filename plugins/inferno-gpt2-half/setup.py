"""Builds the C kernels with this machine's compiler at install (`pip install plugins/inferno-gpt2-half`).

The extension is optional: where it does not build (no compiler, no OpenMP), the package installs
anyway and the backend runs its NumPy fallback. OpenMP is tried first, then plain C (one thread).
"""

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

OPENMP = [] if sys.platform == "win32" else ["-fopenmp"]


class BuildWithFallback(build_ext):
    """Compile with OpenMP; if that fails, without it; if that fails too, skip the extension."""

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
            return
        except Exception as exc:  # noqa: BLE001 - any compiler failure: retry without OpenMP
            print(f"inferno-gpt2-half: building with OpenMP failed ({exc}); trying without", file=sys.stderr)
        ext.extra_compile_args = [a for a in ext.extra_compile_args if a not in OPENMP]
        ext.extra_link_args = [a for a in ext.extra_link_args if a not in OPENMP]
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            print(f"inferno-gpt2-half: the C kernels did not build ({exc}); the NumPy fallback will run",
                  file=sys.stderr)


# -ffp-contract=off: the kernels' FMAs are the ones written (_mm*_fmadd_ps, fmaf). GCC otherwise fuses a
# multiply and an add of its own accord where the target has FMA, and the AVX-512 path then rounded x * id
# differently from the portable path's separate multiply (an input quantized one step apart).
flags = ["/O2"] if sys.platform == "win32" else ["-O3", "-ffp-contract=off", *OPENMP]
setup(
    ext_modules=[Extension("inferno_half._kernels", ["inferno_half/_kernels.c"],
                           depends=["inferno_half/_kernels_q4.h"], extra_compile_args=flags,
                           extra_link_args=OPENMP, optional=True)],
    cmdclass={"build_ext": BuildWithFallback},
)
