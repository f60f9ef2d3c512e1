"""The project's own files: the committed GPT-2 files are the Hub's, and CI runs the README's test command."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The Hub's openai-community/gpt2 files (sha256 as listed by the Hub and by ../shared/gpt2/SHA256SUMS).
HUB_SHA256 = {
    "config.json": "0daed7749b4f02b8f76240d5444551d7b08712dab4d0adb8239c56ba823bb7b4",
    "tokenizer.json": "8414cab924d8b9b33013f0d221c5862f365ee9be39c5c2bfae8a5a9e970478a6",
}


@pytest.mark.parametrize("name", sorted(HUB_SHA256))
def test_gpt2_files_are_the_hubs(name):
    digest = hashlib.sha256((ROOT / "inferno" / "data" / "gpt2" / name).read_bytes()).hexdigest()
    assert digest == HUB_SHA256[name], f"gpt2/{name} differs from the Hub's file"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- test-command -->\s*```(?:sh|bash|console)?\n(.+?)\n```", readme, re.S)
    assert match, "README.md has no test command block (marked <!-- test-command -->)"
    command = match.group(1).strip().splitlines()[-1].strip()
    assert command in (ROOT / ".ci" / "run").read_text(), f".ci/run does not run the README's {command!r}"


#: Distribution names that are someone else's on PyPI: `inferno` (a map/reduce platform) and
#: `inferno-torch` (a Bayesian deep-learning library). Ours are inferno-gpt2, inferno-gpt2-half,
#: inferno-gpt2-torch and llm-inferno.
TAKEN_NAMES = re.compile(r'(?<![\w-])inferno\[|(?<![\w-])inferno-(?:torch|half)\b')


def test_no_message_or_doc_names_a_distribution_that_is_not_ours():
    paths = [ROOT / "README.md", ROOT / "pyproject.toml", ROOT / ".ci" / "run"]
    for folder in ("inferno", "plugins", "docs", "benches", "examples"):
        paths += [p for p in (ROOT / folder).rglob("*") if p.suffix in {".py", ".md", ".toml", ".c", ".yaml"}
                  and "egg-info" not in str(p)]
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in paths
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
             if TAKEN_NAMES.search(line)]
    assert not found, "\n".join(found)


@pytest.mark.slow
def test_the_wheel_ships_the_gpt2_files_and_the_playground(tmp_path):
    # `-m random`, `inferno bench` and the offline errors read openai-community/gpt2's config.json and
    # tokenizer.json from the package; a wheel without them would fail on first use. The build fetches
    # setuptools from the package index (as any `pip install` of the sdist does).
    import shutil
    import subprocess
    import sys
    import zipfile

    source = tmp_path / "source"  # a copy: no stale build/ of the checkout's can slip into the wheel
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "mutants", "*.egg-info", "__pycache__", ".tox", "plugins"))
    command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(source)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("inferno_gpt2-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("config.json", "tokenizer.json"):
        assert f"inferno/data/gpt2/{name}" in names
    assert {"inferno/serve/static/index.html", "inferno/serve/static/app.js"} <= names


def test_the_model_fits_on_one_screen():
    # The model is the file students read: the blocks, from_weights, forward and forward_ragged, each
    # written once (#26). Guards, caches and inspection live beside it.
    lines = (ROOT / "inferno" / "models" / "gpt2.py").read_text().splitlines()
    assert len(lines) <= 200, f"inferno/models/gpt2.py has {len(lines)} lines; keep it one screen"


def test_no_module_of_the_package_is_over_600_lines():
    # One concept a module: a file past 600 lines holds more than one; split it by concept (#40).
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
             for p in (ROOT / "inferno").rglob("*.py")}
    assert len(sizes) > 50, sorted(sizes)  # the walk found the package
    assert {p: n for p, n in sizes.items() if n > 600} == {}


def test_mutate_script_resolves_a_package_file_before_a_module_of_the_same_name():
    # "jobs/generate" is inferno/jobs/generate.py with the jobs tests, not inferno/generate.py
    import importlib.util

    spec = importlib.util.spec_from_file_location("mutate", ROOT / "scripts" / "mutate.py")
    assert spec is not None and spec.loader is not None
    sys.path.insert(0, str(ROOT / "scripts"))  # mutate.py imports its sibling mutation_report
    try:
        mutate = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mutate)
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert mutate.resolve("jobs/generate")[:2] == ("jobs-generate", ["inferno/jobs/generate.py"])
    assert mutate.resolve("generate")[:2] == ("generate", ["inferno/generate.py"])
    assert mutate.resolve("inferno/options.py")[0] == "options"
    assert mutate.resolve("cli/_args")[0] == "args"
    assert mutate.resolve("serve/schemas")[0] == "schemas"
    assert mutate.resolve("jobs/nothing") is None


def test_mutation_report_counts_a_hung_mutant_as_killed_and_names_it(tmp_path, capsys):
    # mutmut's exit codes per mutant: 1 a test failed, 70 only the tests' time limit did (hooks), 0
    # survived, 36 mutmut's own time limit (left out of the score).
    import importlib.util

    # scripts/mutation_hooks.py's constant, read as text (the plugin only mutation runs load)
    hooks = (ROOT / "scripts" / "mutation_hooks.py").read_text()
    hang_exit = int(re.search(r"^MUTATION_HANG_EXIT = (\d+)$", hooks, re.M).group(1))
    spec = importlib.util.spec_from_file_location("mutation_report", ROOT / "scripts" / "mutation_report.py")
    assert spec is not None and spec.loader is not None
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    assert report.HUNG == hang_exit
    meta = tmp_path / "inferno" / "engine.py.meta"
    meta.parent.mkdir()
    codes = {"inferno.engine.x_a__mutmut_1": 1, "inferno.engine.x_a__mutmut_2": hang_exit,
             "inferno.engine.x_a__mutmut_3": 0, "inferno.engine.x_a__mutmut_4": 36}
    meta.write_text(json.dumps({"exit_code_by_key": codes}))
    assert report.main(["--mutants", str(tmp_path), "--survivors"]) == 0
    out, err = capsys.readouterr()
    assert "| engine | 4 | 2 | 1 | 66.7% | 0 | 66.7% |" in out
    assert "hung (killed by the test time limit): inferno.engine.x_a__mutmut_2" in out
    assert "survived: inferno.engine.x_a__mutmut_3" in out and "timeout: inferno.engine.x_a__mutmut_4" in out
    assert "{'hung': 1}" in err


#: Extras a module may need that the test environment need not have: its import then skips.
OPTIONAL = {"ray", "fastapi", "starlette", "uvicorn", "sse_starlette", "torch", "jinja2", "pydantic",
            "prometheus_client", "pyarrow", "pandas", "transformers"}


def _public_modules() -> list[str]:
    import pkgutil

    import inferno

    return ["inferno"] + sorted(m.name for m in pkgutil.walk_packages(inferno.__path__, "inferno.")
                                if not any(p.startswith("_") for p in m.name.split(".")[1:]))


def test_the_public_modules_are_found():
    names = _public_modules()
    assert {"inferno.api", "inferno.cpu", "inferno.backends.registry", "inferno.serve"} <= set(names)


@pytest.mark.parametrize("name", _public_modules())
def test_from_each_public_module_import_star_works(name):
    # `from m import *` raises AttributeError for a name in __all__ that the module does not define.
    import importlib

    try:
        module = importlib.import_module(name)
    except ImportError as exc:  # (tests/ray/ makes `ray` a namespace package where Ray is missing)
        if exc.name and exc.name.split(".")[0] in OPTIONAL:
            pytest.skip(f"needs {exc.name}")
        raise
    missing = [n for n in getattr(module, "__all__", ()) if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what it does not define: {missing}"
    exec(f"from {name} import *", {})  # noqa: S102 - the statement under test


def test_mutation_hooks_run_a_mutants_quickest_files_first_and_mark_a_hang(tmp_path):
    # scripts/mutation_hooks.py, the plugin only mutation runs load (-p scripts.mutation_hooks)
    import os
    import subprocess

    (tmp_path / "test_slow.py").write_text("def test_s():\n    pass\n")
    (tmp_path / "test_quick.py").write_text(
        "import pytest\n\ndef test_q():\n    pass\n\n"
        "def test_hangs():\n    pytest.fail('Timeout (from pytest-timeout)')\n")
    (tmp_path / "mutmut-stats.json").write_text(json.dumps({"duration_by_test": {
        "test_slow.py::test_s": 5.0, "test_quick.py::test_q": 0.01, "test_quick.py::test_hangs": 0.01}}))

    def run(**env: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "pytest", "-v", "-p", "no:randomly", "-p", "no:cacheprovider",
                   "-p", "scripts.mutation_hooks", "test_slow.py", "test_quick.py"]
        environ = {k: v for k, v in os.environ.items() if k != "MUTANT_UNDER_TEST"}
        environ.update(PYTHONPATH=str(ROOT), PYTEST_ADDOPTS="", **env)
        return subprocess.run(command, cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=120)

    def order(proc: subprocess.CompletedProcess) -> list[str]:
        return [line.split(" ")[0] for line in proc.stdout.splitlines() if re.match(r"test_\w+\.py::", line)]

    plain, mutant = run(), run(MUTANT_UNDER_TEST="inferno.x.y__mutmut_1")
    assert order(mutant) == ["test_quick.py::test_q", "test_quick.py::test_hangs", "test_slow.py::test_s"]
    assert mutant.returncode == 70, mutant.stdout  # failed only by the time limit: hung
    # Outside a mutant's run: the files in their order, and an ordinary failure.
    assert order(plain)[0] == "test_slow.py::test_s" and plain.returncode == 1, plain.stdout
