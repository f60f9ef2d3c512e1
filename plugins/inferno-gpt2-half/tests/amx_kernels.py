"""The kernels the AMX tests run: the installed ones where this CPU has AMX, else `_kernels.c` built with
its tiles emulated in plain C (`inferno_half/_amx_emulated.h`), so that every machine with AVX-512 VNNI
checks the AMX paths' layouts, edges and arithmetic; only their speed needs the real tiles.

The emulated build is compiled once per version of the C sources into the temporary directory (a lock
keeps test workers from building it twice) and imported as `_kernels_amx_emulated`. With
INFERNO_HALF_SANITIZE=1 it is built with AddressSanitizer and UBSan, and the whole suite runs on it
(conftest.py) whatever the CPU: on one without AVX-512 VNNI its AMX paths never run, but its AVX2 and
portable ones are checked all the same (CI's sanitized stage: every path's reads and writes; the process
must preload their runtimes, see `.ci/run`).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import inferno_half
import inferno_half.backend as hb

SOURCES = ["_kernels.c", "_kernels_q4.h", "_amx_emulated.h"]
NAME = "_kernels_amx_emulated"
#: The installed kernels, as imported (before `--amx-emulated` or a fixture puts others in the backend).
INSTALLED = hb._KERNELS


#: INFERNO_HALF_SANITIZE=1: the emulated build's sanitizers (an out-of-bounds access or undefined behaviour
#: ends the process with a report).
SANITIZE = ["-O1", "-fsanitize=address,undefined", "-fno-omit-frame-pointer",
            "-fno-sanitize-recover=undefined"]
SANITIZED = os.environ.get("INFERNO_HALF_SANITIZE") == "1"


def _build(src: Path) -> ModuleType:
    sanitize = SANITIZE if SANITIZED else []
    digest = hashlib.sha256(sys.version.encode() + " ".join(sanitize).encode())
    for name in SOURCES:
        digest.update((src / name).read_bytes())
    out = Path(tempfile.gettempdir()) / f"inferno-gpt2-half-amx-emulated-{digest.hexdigest()[:16]}"
    out.mkdir(exist_ok=True)
    lib = out / (NAME + sysconfig.get_config_var("EXT_SUFFIX"))
    with open(out / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not lib.exists():
            tmp = lib.with_suffix(".tmp")
            subprocess.run([shutil.which("cc") or "gcc", "-O2", "-ffp-contract=off", "-fopenmp", "-shared",
                            "-fPIC", "-DINFERNO_HALF_EMULATE_AMX", *sanitize,
                            f"-I{sysconfig.get_paths()['include']}", str(src / "_kernels.c"), "-o", str(tmp)],
                           check=True, capture_output=True)
            tmp.rename(lib)
    spec = importlib.util.spec_from_file_location(NAME, lib)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def amx_kernels(emulated: bool = False) -> tuple[ModuleType | None, str, str]:
    """(kernels, why not, how): the kernels whose AMX paths the tests run (the emulated ones where the CPU
    lacks AMX, or if `emulated`), or None and why not; how says whether the tiles are real or emulated."""
    real = INSTALLED
    if real is None:
        return None, "the C kernels are not built", ""
    if not real.amx_support() and not emulated:
        return real, "", "real AMX tiles"
    why = real.amx_support() or "asked for"
    src = Path(inferno_half.__file__).parent
    if sys.platform != "linux" or not all((src / name).exists() for name in SOURCES):
        return None, f"{why}, and the kernels' C sources are not here to emulate it", ""
    if not (shutil.which("cc") or shutil.which("gcc")):
        return None, f"{why}, and no C compiler to build the emulated tiles", ""
    try:
        module = _build(src)
    except subprocess.CalledProcessError as exc:
        return None, f"{why}, and the emulated build failed: {exc.stderr.decode()[-500:]}", ""
    if module.amx_support():  # no AVX-512 VNNI: the build runs, but never its AMX paths
        return module, module.amx_support(), ""
    sanitized = ", under AddressSanitizer and UBSan" if SANITIZED else ""
    return (module, "", f"AMX tiles emulated in C ({why}{sanitized}): the paths' arithmetic is checked, not "
            "the instructions")


def bf16_path_kernels(path: str, monkeypatch: pytest.MonkeyPatch, which: str) -> Iterator[ModuleType]:
    """A fixture's body: the kernels for bfloat16 path `path` of `which` ("bf16_attention" or
    "bf16_products"), the backend's too: "AMX-BF16" on real or emulated tiles (`amx_kernels`),
    "AVX512-BF16" on the installed kernels with AMX switched off. Skips where the machine lacks the path,
    saying why; the defaults restored after."""
    kernels = amx_kernels()[0] if path == "AMX-BF16" else INSTALLED
    if kernels is None:
        pytest.skip(f"{path} cannot run here: {amx_kernels()[1]}")
    monkeypatch.setattr(hb, "_KERNELS", kernels)
    kernels.amx_rows(-1 if path == "AMX-BF16" else 0)
    try:
        runs, why = getattr(kernels, which)()
        if runs != path:
            pytest.skip(f"{which}'s {path} path cannot run here: {why}")
        yield kernels
    finally:
        kernels.amx_rows(-1)
        kernels.force_avx2(0)
