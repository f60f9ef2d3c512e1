"""The mutation-testing table of docs/mutation.md, from mutmut's results (run `mutmut run` first).

    python scripts/mutation_report.py            # the table, per module
    python scripts/mutation_report.py --survivors  # also every mutant not killed and not listed

Reads mutmut's per-file results (mutants/**/*.py.meta) and the equivalent or message-only mutants listed
in docs/mutation.md (lines starting with "- `inferno....__mutmut_N`"). A mutant counts as killed when a
test failed on it or it timed out (mutmut's "killed" and "timeout").
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "mutation.md"
LISTED = re.compile(r"^- `(inferno\.[^`]+__mutmut_\d+)`", re.M)
KILLED = {1, 3, 24, -24, 36, 152, 255}  # mutmut: a failing test, pytest's internal error, a timeout


def status(code: int | None) -> str:
    if code in KILLED:
        return "killed"
    return {0: "survived", None: "not checked", 5: "no tests", 33: "no tests", 2: "interrupted"}.get(
        code, f"exit {code}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--survivors", action="store_true", help="list the mutants neither killed nor listed")
    args = p.parse_args()
    listed = set(LISTED.findall(DOC.read_text())) if DOC.exists() else set()
    metas = sorted((ROOT / "mutants").rglob("*.py.meta"))
    if not metas:
        print("no results under mutants/: run `mutmut run` first", file=sys.stderr)
        return 1
    print("| module | mutants | killed | score | equivalent / message-only | score excluding them |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    left = []
    for meta in metas:
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        if not codes:
            continue
        counts = Counter(status(c) for c in codes.values())
        if counts["not checked"] == len(codes):
            continue
        module = str(meta.relative_to(ROOT / "mutants")).removesuffix(".py.meta").replace("/", ".")
        killed = counts["killed"]
        equivalent = sum(1 for k, c in codes.items() if k in listed and status(c) != "killed")
        total = len(codes)
        print(f"| {module.removeprefix('inferno.').removeprefix('backends.')} | {total} | {killed} | "
              f"{killed / total:.1%} | {equivalent} | {killed / max(1, total - equivalent):.1%} |")
        left += [(k, status(c)) for k, c in codes.items() if status(c) != "killed" and k not in listed]
        other = {s: n for s, n in counts.items() if s not in ("killed", "survived")}
        if other:
            print(f"|   ({module}: {other}) | | | | | |", file=sys.stderr)
    if args.survivors:
        for name, what in sorted(left):
            print(f"{what}: {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
