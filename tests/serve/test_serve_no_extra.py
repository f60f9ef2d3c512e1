"""What must hold without the serve extra: the core never imports it, and `inferno serve` says how to
install it. (This module needs none of the extra, so it runs everywhere.)"""

from __future__ import annotations

import subprocess
import sys

EXTRA = ("fastapi", "uvicorn", "sse_starlette", "prometheus_client", "starlette", "pydantic")


def test_the_core_and_the_cli_do_not_import_the_extra():
    code = ("import sys, inferno, inferno.api, inferno.engine, inferno.cli\n"
            "import inferno.serve, inferno.cli.serve, inferno.serve.config\n"
            f"loaded = sorted(set({EXTRA!r}) & set(sys.modules))\n"
            "assert not loaded, loaded\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def run_without_extra(*flags: str) -> subprocess.CompletedProcess:
    # sys.modules[name] = None makes both `import name` and importlib.util.find_spec(name) fail.
    code = ("import sys\n"
            "sys.modules['fastapi'] = None\n"
            "from inferno.cli.serve import run as run_serve_cli\n"
            "sys.exit(run_serve_cli(sys.argv[1:]))\n")
    return subprocess.run([sys.executable, "-c", code, *flags], capture_output=True, text=True, timeout=60)


def test_serve_without_the_extra_exits_2_saying_how_to_install_it():
    proc = run_without_extra("--port", "0")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and 'pip install "inferno-gpt2[serve]"' in lines[0], proc.stderr
    assert "fastapi" in lines[0] and "Traceback" not in proc.stderr


def test_serve_help_works_without_the_extra():
    proc = run_without_extra("--help")
    assert proc.returncode == 0 and "--grace-seconds" in proc.stdout
