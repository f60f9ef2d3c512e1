"""The plugin as users meet it, each in a fresh interpreter: discovery through the entry point, the
conformance suite's own command, the CLI, and a machine without torch."""

from __future__ import annotations

import importlib.metadata
import json
import textwrap

import pytest

pytest.importorskip("torch")


def conformance_args(spec: str) -> list[str]:
    """``pytest --pyargs inferno.conformance --backend SPEC``, the command any plugin author runs."""
    return ["-m", "pytest", "--pyargs", "inferno.conformance", "--backend", spec, "-q",
            "-p", "no:cacheprovider"]


# The first is the acceptance command verbatim; threads=1 because on a busy machine torch's thread per
# core mostly waits (see the README).
@pytest.mark.parametrize("spec", ["torch", "torch:dtype=bfloat16,threads=1", "torch:dtype=float16,threads=1"])
def test_conformance_suite(spec, run_python):
    proc = run_python(conformance_args(spec))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout


def test_conformance_suite_rejects_bad_options(run_python):
    proc = run_python(conformance_args("torch:dtype=int8"))
    assert proc.returncode != 0
    assert "option dtype='int8' is not supported" in proc.stdout + proc.stderr


def test_discovered_through_the_entry_point(run_python):
    proc = run_python(["-m", "inferno", "backends", "--json"])
    assert proc.returncode == 0, proc.stderr
    infos = {i["name"]: i for i in json.loads(proc.stdout)}
    assert infos["torch"]["origin"] == "inferno-gpt2-torch"
    assert infos["torch"]["version"] == importlib.metadata.version("inferno-gpt2-torch")
    assert infos["torch"]["status"] == "ok"
    assert infos["numpy"]["status"] == "ok"


def test_listing_backends_does_not_import_torch(run_python):
    # `inferno backends` stays fast: torch is imported only when the backend is constructed.
    code = textwrap.dedent("""
        import sys
        from inferno.backends.registry import get_backend, list_backends
        assert {i.name: i.status for i in list_backends()}["torch"] == "ok"
        assert "torch" not in sys.modules, "listing imported torch"
        get_backend("torch:device=cpu")
        assert "torch" in sys.modules
    """)
    proc = run_python(["-c", code])
    assert proc.returncode == 0, proc.stderr


def test_cli_generates(model_dir, run_python):
    args = ["-m", "inferno", "--backend", "torch", "Hello", "--model-dir", str(model_dir),
            "--max-new-tokens", "5", "--ignore-eos", "--json", "--threads", "1"]
    proc = run_python(args)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["backend"] == "torch" and out["new_tokens"] == 5 and out["text"]


def test_cli_bad_option(model_dir, run_python):
    args = ["-m", "inferno", "--backend", "torch:device=gpu", "Hello", "--model-dir", str(model_dir)]
    proc = run_python(args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("inferno: error: backend 'torch'") and proc.stderr.count("\n") == 1
    assert "option device='gpu' is not a device" in proc.stderr


# A machine without torch, two ways: an import hook that refuses it, and the sys.modules[...] = None block.
_BLOCKERS = {
    "meta-path": """
        import importlib.abc
        class NoTorch(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None
        sys.meta_path.insert(0, NoTorch())
    """,
    "sys.modules": """
        sys.modules["torch"] = None
    """,
}


@pytest.mark.parametrize("blocker", sorted(_BLOCKERS))
def test_machine_without_torch(model_dir, blocker, run_python):
    code = "import sys\n" + textwrap.dedent(_BLOCKERS[blocker]) + textwrap.dedent(f"""
        import json, warnings
        warnings.simplefilter("error")  # a plugin that fails to import would only warn
        from inferno.backends.registry import BackendUnavailableError, get_backend, list_backends
        from inferno.cli import main

        statuses = {{i.name: i.status for i in list_backends()}}
        try:
            get_backend("torch")
            error = None
        except BackendUnavailableError as exc:
            error = str(exc)
        rc = main(["--backend", "numpy", "Hello", "--model-dir", {str(model_dir)!r}, "--max-new-tokens", "2",
                   "--json"])
        imported = sorted(m for m, mod in sys.modules.items() if m.split(".")[0] == "torch" and mod)
        print(json.dumps({{"statuses": statuses, "error": error, "rc": rc, "imported": imported}}))
    """)
    proc = run_python(["-c", code])
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["statuses"]["torch"].startswith("needs PyTorch: pip install torch")
    assert out["statuses"]["numpy"] == "ok" and out["statuses"]["array-api"] == "ok"
    assert "needs PyTorch" in out["error"]
    assert out["rc"] == 0  # numpy still generates
    assert out["imported"] == []
