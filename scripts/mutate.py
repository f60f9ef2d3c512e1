"""Mutation-test one module with the tests that reach it, from scratch, and print the table row.

    python scripts/mutate.py options                   # inferno/options.py
    python scripts/mutate.py jobs --rerun-timeouts     # inferno/jobs/*.py, then each timeout alone
    python scripts/mutate.py --list                    # the modules and their test selections
    python scripts/mutate.py tokenizer --max-children 1  # one mutant at a time (a shared machine)

It copies the package, the tests and the configuration into .mutate/MODULE/ (git-ignored), with
setup.cfg's [mutmut] narrowed to that module (`only_mutate`) and its test selection (`TESTS` below),
runs `mutmut run` there from an empty mutants/ folder, and prints scripts/mutation_report.py's row and
survivors for it. The repository's own mutants/ and setup.cfg are left alone, so a run never reuses a
stale folder. On a shared machine put `nice -n 19` in front.
"""

from __future__ import annotations

import argparse
import configparser
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import mutation_report  # noqa: E402 - a sibling script, not a package

# Per module: the files mutated and the tests run against them (the ones that reach its code in this
# process; a test that runs the CLI or the server in a subprocess is invisible to mutmut), and any test
# deselected for costing seconds per mutant without reaching the module more than the others do.
TESTS: dict[str, tuple[list[str], list[str], list[str]]] = {
    "sampling": (["inferno/sampling.py"],
                 ["tests/test_sampling.py", "tests/test_options.py", "tests/test_generate.py"], []),
    "generate": (["inferno/generate.py"],
                 ["tests/test_generate.py", "tests/test_model.py", "tests/test_options.py"], []),
    "tokenizer": (["inferno/tokenizer/*.py"],
                  ["tests/test_tokenizer.py", "tests/test_tokenizer_oracles.py",
                   "tests/test_tokenizer_vocab_merges.py"], []),
    "weights": (["inferno/models/weights.py"],
                ["tests/test_weights.py", "tests/test_weights_stream.py", "tests/test_weights_chunks.py",
                 "tests/test_model.py",
                 "tests/test_generate.py"],
                ["tests/test_generate.py::test_generate_tokens_and_stream_give_the_transformers_greedy_ids_and_their_text",
                 "tests/test_model.py::test_greedy_matches_transformers"]),
    "registry": (["inferno/backends/registry.py"], ["tests/test_registry.py", "tests/test_backends.py"], []),
    "options": (["inferno/options.py"], ["tests/test_options.py", "tests/test_engine.py"], []),
    "engine": (["inferno/engine/*.py"],
               ["tests/test_engine.py", "tests/serve/test_serve_inprocess.py"], []),
    "schemas": (["inferno/serve/schemas.py"],
                ["tests/serve/test_schemas_unit.py", "tests/serve/test_serve_schema.py",
                 "tests/serve/test_serve_inprocess.py"], []),
    "jobs": (["inferno/jobs/*.py"],
             ["tests/test_jobs_lines.py", "tests/test_jobs_plan.py", "tests/test_jobs_progress.py",
              "tests/test_jobs_generate.py", "tests/test_jobs_output.py", "tests/test_batch_cli.py",
              "tests/test_score_jsonl.py", "tests/test_hostile_files.py"], []),
    "checked": (["inferno/backends/checked.py"],
                ["tests/test_checked_diagnose.py", "tests/test_checked_guard.py",
                 "tests/test_faults_nonfinite.py", "tests/test_faults_backends.py",
                 "tests/test_model.py"], []),
    "kv": (["inferno/kv.py"],
           ["tests/test_kv.py", "tests/test_model.py", "tests/test_engine.py",
            "tests/test_faults_backends.py"], []),
    # The server's logic: the serving objects and the generation pieces they share (the routes are one
    # call each into a serving object).
    "serving": (["inferno/serve/serving*.py", "inferno/serve/running.py", "inferno/serve/planning.py",
                 "inferno/serve/echo.py", "inferno/serve/token_texts.py"],
                ["tests/serve/test_serve_routes.py", "tests/serve/test_serve_inprocess.py",
                 "tests/serve/test_serve_playground_api.py", "tests/serve/test_serve_cancel.py"], []),
    "args": (["inferno/cli/_args.py"], ["tests/test_cli_args.py", "tests/test_cli.py"], []),
}
# The shipped gpt2 files are inside inferno/ (data/gpt2); scripts/ holds the hooks (mutation_hooks.py).
COPIED = ["inferno", "tests", "scripts", "pyproject.toml"]


def workdir(name: str, files: list[str], tests: list[str], deselect: list[str],
            timeout_constant: float | None = None) -> Path:
    """A fresh copy of what the tests need, with setup.cfg's [mutmut] narrowed to `name`."""
    work = ROOT / ".mutate" / name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    junk = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for rel in COPIED:
        src, dst = ROOT / rel, work / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=junk)
        else:
            shutil.copy2(src, dst)
    configure(work, files, tests, deselect, timeout_constant)
    return work


TEST_TIMEOUT: float | None = None  # --test-timeout: pytest-timeout's --timeout, for setup.cfg's


def configure(work: Path, files: list[str], tests: list[str], deselect: list[str],
              timeout_constant: float | None = None) -> None:
    """`work`'s setup.cfg: the repository's, with [mutmut] narrowed to `files` and `tests` (and
    mutmut's `timeout_constant` and the tests' time limit set, when given)."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    if timeout_constant is not None:
        cfg["mutmut"]["timeout_constant"] = str(timeout_constant)
    cfg["mutmut"]["only_mutate"] = "\n" + "\n".join(files)
    cfg["mutmut"]["pytest_add_cli_args_test_selection"] = "\n" + "\n".join(tests)
    extra = cfg["mutmut"].get("pytest_add_cli_args", "").split()
    if TEST_TIMEOUT is not None:
        extra[extra.index("--timeout") + 1] = f"{TEST_TIMEOUT:g}"
    for test in deselect:
        extra += ["--deselect", test]
    cfg["mutmut"]["pytest_add_cli_args"] = "\n" + "\n".join(extra)
    text = io.StringIO()
    cfg.write(text)
    (work / "setup.cfg").write_text(text.getvalue())


MAX_CHILDREN: int | None = None  # --max-children, passed to `mutmut run` (its default: the CPU count)


def mutmut(work: Path, *names: str) -> int:
    """`mutmut run [NAMES]` in `work`, its output shown as it comes and kept in mutmut.log."""
    limit = [] if MAX_CHILDREN is None else ["--max-children", str(MAX_CHILDREN)]
    with (work / "mutmut.log").open("a") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mutmut", "run", *limit, *names], cwd=work,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        held = ""  # mutmut redraws a spinner line in place: keep each stage's last state only
        for line in proc.stdout:
            if line[:1] and "\u2800" <= line[0] <= "\u28ff":
                if held and re.sub(r"\d", "", held[1:]) != re.sub(r"\d", "", line[1:]):
                    sys.stdout.write(held)
                    log.write(held)
                held = line
                continue
            line, held = held + line, ""
            sys.stdout.write(line)
            sys.stdout.flush()
            log.write(line)
        sys.stdout.write(held)
        log.write(held)
        return proc.wait()


def revision() -> str:
    """The commit the copy was made from, and whether the files copied had changes not committed."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    dirty = git("status", "--porcelain", "--", *COPIED, "setup.cfg")
    return git("rev-parse", "--short", "HEAD") + (" + uncommitted changes" if dirty else "")


def timeouts(work: Path) -> list[str]:
    import json

    return sorted(k for meta in (work / "mutants").rglob("*.py.meta")
                  for k, c in json.loads(meta.read_text())["exit_code_by_key"].items()
                  if c in mutation_report.TIMEOUT)


def resolve(module: str) -> tuple[str, list[str], list[str], list[str]] | None:
    """(work folder name, files, tests, deselected) for "options", "inferno/options.py", "serve.routes",
    "cli/_args", or one file of a package entry ("jobs/lines": jobs' tests on inferno/jobs/lines.py)."""
    parts = re.sub(r"^inferno[./]|\.py$", "", module).replace("/", ".").split(".")
    # a package's file first: "jobs/generate" is inferno/jobs/generate.py, not the entry "generate"
    if len(parts) >= 2 and parts[-2] in TESTS:
        files, tests, deselect = TESTS[parts[-2]]
        path = f"inferno/{'/'.join(parts)}.py"
        if any(Path(path).match(f) or path == f for f in files) and (ROOT / path).is_file():
            return "-".join(parts[-2:]), [path], tests, deselect
    for key in (parts[-1], parts[-1].lstrip("_")):
        if key in TESTS:
            return (key, *TESTS[key])
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("module", nargs="?", help=f"one of: {', '.join(TESTS)} (or PACKAGE/FILE, e.g. jobs/lines)")
    p.add_argument("--list", action="store_true", help="the modules, their files and test selections")
    p.add_argument("--rerun-timeouts", action="store_true",
                   help="then re-run each mutant that timed out, alone, and report again")
    p.add_argument("--again", nargs="+", metavar="MUTANT",
                   help="in the module's last folder, with the tests as they are now, re-run only these")
    p.add_argument("--max-children", type=int, metavar="N",
                   help="mutants tested at once (mutmut's default: one per CPU); 1 on a shared machine")
    p.add_argument("--timeout-constant", type=float, metavar="S",
                   help="mutmut's timeout_constant (setup.cfg: 20): a mutant's wall-clock limit is "
                        "(its tests' time in the stats run + S) x timeout_multiplier (5)")
    p.add_argument("--test-timeout", type=float, metavar="S",
                   help="each test's time limit (pytest-timeout; setup.cfg: 60): a mutant that hangs a test "
                        "is then a kill, counted as hung, instead of sleeping until mutmut's limit")
    args = p.parse_args()
    global MAX_CHILDREN, TEST_TIMEOUT
    MAX_CHILDREN, TEST_TIMEOUT = args.max_children, args.test_timeout
    if importlib.util.find_spec("pytest_timeout") is None:
        p.error("the mutation environment needs pytest-timeout (setup.cfg's --timeout): "
                "pip install mutmut==3.8.1 pytest-timeout")
    if args.list or not args.module:
        for name, (files, tests, deselect) in TESTS.items():
            print(f"{name}: {' '.join(files)}\n    tests: {' '.join(tests)}"
                  + "".join(f"\n    deselected: {d}" for d in deselect))
        return 0
    found = resolve(args.module)
    if found is None:
        p.error(f"unknown module {args.module!r} (known: {', '.join(TESTS)})")
    name, files, tests, deselect = found
    os.environ.pop("MUTANT_UNDER_TEST", None)
    if args.again:
        work = ROOT / ".mutate" / name
        if not (work / "mutants").is_dir():
            p.error(f"no earlier run in {work.relative_to(ROOT)}: run scripts/mutate.py {args.module} first")
        # The mutants are of the package as it was copied: new tests against changed code are a new run.
        changed = sorted(str(f.relative_to(ROOT)) for f in (ROOT / "inferno").rglob("*.py")
                         if not (work / f.relative_to(ROOT)).is_file()
                         or (work / f.relative_to(ROOT)).read_bytes() != f.read_bytes())
        if changed:
            p.error(f"changed since the run in {work.relative_to(ROOT)}: {', '.join(changed)}; "
                    f"run scripts/mutate.py {args.module} afresh")
        shutil.rmtree(work / "tests")
        shutil.copytree(ROOT / "tests", work / "tests", ignore=shutil.ignore_patterns("__pycache__"))
        # a test file added to the selection since is run too
        configure(work, files, tests, deselect, args.timeout_constant)
        start = time.monotonic()
        rc = mutmut(work, *args.again)
        print(f"\nmutmut run {' '.join(args.again)}: exit {rc}, {time.monotonic() - start:.0f} s")
        mutation_report.main(["--mutants", str(work / "mutants"), "--survivors"])
        return rc
    work = workdir(name, files, tests, deselect, args.timeout_constant)
    print(f"{time.strftime('%Y-%m-%d %H:%M')} {name}: {' '.join(files)} at {revision()}; "
          f"tests: {' '.join(tests)}")
    start = time.monotonic()
    rc = mutmut(work)
    print(f"\nmutmut run: exit {rc}, {time.monotonic() - start:.0f} s in {work.relative_to(ROOT)}")
    mutation_report.main(["--mutants", str(work / "mutants"), "--survivors"])
    if args.rerun_timeouts and (late := timeouts(work)):
        print(f"\nre-running the {len(late)} timeouts alone")
        start = time.monotonic()
        for mutant in late:
            mutmut(work, mutant)
        print(f"\ntimeouts re-run: {time.monotonic() - start:.0f} s")
        mutation_report.main(["--mutants", str(work / "mutants"), "--survivors"])
    return rc


if __name__ == "__main__":
    sys.exit(main())
