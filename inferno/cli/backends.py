"""``inferno backends``: the compute backends, whether each can run, and the BLAS NumPy runs on."""

from __future__ import annotations

import json
from collections.abc import Sequence

from inferno.cli._args import Parser


def run(argv: Sequence[str]) -> int:
    p = Parser(prog="inferno backends", description="List the compute backends and whether they can run.")
    p.add_argument("--json", action="store_true", help="print a JSON list of objects")
    args = p.parse_args(argv)

    from dataclasses import asdict

    from inferno.backends.registry import default_backend_name, list_backends

    infos = list_backends()
    if args.json:
        print(json.dumps([asdict(i) for i in infos], indent=2))
        return 0
    default = default_backend_name()
    rows = [("name", "status", "runs on", "origin", "description")]
    for i in infos:
        origin = i.origin if i.origin == "built-in" else f"{i.origin} {i.version}".strip()
        mark = " (default)" if i.name == default else ""
        rows.append((i.name + mark, i.status, i.runs_on or "-", origin, i.description))
    widths = [max(len(r[c]) for r in rows) for c in range(4)]
    for r in rows:
        print("  ".join(r[c].ljust(widths[c]) for c in range(4)) + "  " + r[4])
    from inferno.blas import summary  # what numpy and cpu-threaded run on

    blas = summary()
    if blas is not None:
        print(f"\n{blas}")
    return 0


