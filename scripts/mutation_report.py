"""The mutation-testing table of docs/mutation.md, from mutmut's results (run `mutmut run` first).

    python scripts/mutation_report.py                 # the table, per module, from ./mutants
    python scripts/mutation_report.py --survivors     # also every mutant not killed and not listed
    python scripts/mutation_report.py --mutants DIR   # the results of another run (scripts/mutate.py's)

Reads mutmut's per-file results (DIR/**/*.py.meta) and the equivalent or message-only mutants listed
in scripts/equivalent_mutants.md (lines starting with "- `inferno....__mutmut_N`"). A mutant counts as
killed when a test failed on it (or its test process crashed); one whose tests failed only by running
into their time limit (pytest-timeout, exit 70 from scripts/mutation_hooks.py) is a kill too, named
"hung" with --survivors. A timeout (mutmut's own limit) is not a kill: it is counted on its own, left
out of the score, and named with --survivors, so that it can be re-run alone (`mutmut run NAME`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "scripts" / "equivalent_mutants.md"
LISTED = re.compile(r"^- `(inferno\.[^`]+__mutmut_\d+)`", re.M)
# mutmut's exit codes: a failing test, pytest's internal error, the test process ending with 255 (a mutant
# that breaks what the tests' collection imports); and its timeouts (its own, or SIGXCPU).
KILLED = {1, 3, 255}
TIMEOUT = {36, 24, -24, 152}
# A session whose only failure was a test running into pytest-timeout's limit (mutation_hooks.py's
# MUTATION_HANG_EXIT): the mutant hangs the tests. A kill, counted apart from the assertions' kills.
HUNG = 70


def status(code: int | None) -> str:
    if code in KILLED:
        return "killed"
    if code == HUNG:
        return "hung"
    if code in TIMEOUT:
        return "timeout"
    return {0: "survived", None: "not checked", 5: "no tests", 33: "no tests", 2: "interrupted"}.get(
        code, f"exit {code}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--survivors", action="store_true",
                   help="list the mutants neither killed nor listed, and the timeouts")
    p.add_argument("--mutants", type=Path, default=ROOT / "mutants", help="mutmut's work folder")
    args = p.parse_args(argv)
    listed = set(LISTED.findall(DOC.read_text())) if DOC.exists() else set()
    metas = sorted(args.mutants.rglob("*.py.meta"))
    if not metas:
        print(f"no results under {args.mutants}: run `mutmut run` first", file=sys.stderr)
        return 1
    print("| module | mutants | killed | timeouts | score | equivalent / message-only "
          "| score excluding them |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    left = []
    for meta in metas:
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        if not codes:
            continue
        counts = Counter(status(c) for c in codes.values())
        if counts["not checked"] == len(codes):
            continue
        module = str(meta.relative_to(args.mutants)).removesuffix(".py.meta").replace("/", ".")
        killed, timeouts = counts["killed"] + counts["hung"], counts["timeout"]
        equivalent = sum(1 for k, c in codes.items() if k in listed and status(c) == "survived")
        scored = len(codes) - timeouts  # a timeout is neither a kill nor a survivor until re-run
        print(f"| {module.removeprefix('inferno.')} | {len(codes)} | {killed} | {timeouts} | "
              f"{killed / max(1, scored):.1%} | {equivalent} | {killed / max(1, scored - equivalent):.1%} |")
        left += [(k, status(c)) for k, c in codes.items()
                 if status(c) not in ("killed", "hung") and not (k in listed and status(c) == "survived")]
        left += [(k, "hung (killed by the test time limit)") for k, c in codes.items() if status(c) == "hung"]
        other = {s: n for s, n in counts.items() if s not in ("killed", "survived", "timeout")}
        if other:
            print(f"|   ({module}: {other}) | | | | | | |", file=sys.stderr)
    if args.survivors:
        for name, what in sorted(left):
            print(f"{what}: {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
