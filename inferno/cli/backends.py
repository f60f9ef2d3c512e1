"""``inferno backends``: the compute backends, whether each can run, the model families each runs
natively, and the BLAS NumPy runs on."""

from __future__ import annotations

import json
from collections.abc import Sequence

from inferno.cli._args import Parser

#: The kernels the Llama family adds to the protocol whose defaults in `Backend` are slower stand-ins built
#: from GPT-2's kernels or run on the host (`gated_mlp`'s default is its composition of native kernels).
LLAMA_KERNELS = ("embed_tokens", "heads", "rms_norm", "rotary", "silu_mul", "gqa_attention")


def families(name: str) -> str:
    """Which model families backend `name` runs, and how: every backend runs GPT-2 and the Llama family;
    one that implements none or some of the Llama kernels runs the rest through `Backend`'s defaults
    (slower). "-" when its class cannot be had here."""
    from inferno.backends.base import Backend
    from inferno.backends.registry import get_backend_class

    try:
        cls = get_backend_class(name)
    except (ValueError, RuntimeError, ImportError):
        return "-"
    native = sum(getattr(cls, k) is not getattr(Backend, k) for k in LLAMA_KERNELS)
    if native == len(LLAMA_KERNELS):
        return "gpt2, llama"
    return f"gpt2, llama ({native}/{len(LLAMA_KERNELS)} Llama kernels native, the rest by default)"


def run(argv: Sequence[str]) -> int:
    p = Parser(prog="inferno backends", description="List the compute backends and whether they can run.")
    p.add_argument("--json", action="store_true", help="print a JSON list of objects")
    args = p.parse_args(argv)

    from dataclasses import asdict

    from inferno.backends.registry import default_backend_name, list_backends

    infos = list_backends()
    if args.json:
        print(json.dumps([{**asdict(i), "families": families(i.name)} for i in infos], indent=2))
        return 0
    default = default_backend_name()
    rows = [("name", "status", "runs on", "origin", "families", "description")]
    for i in infos:
        origin = i.origin if i.origin == "built-in" else f"{i.origin} {i.version}".strip()
        mark = " (default)" if i.name == default else ""
        rows.append((i.name + mark, i.status, i.runs_on or "-", origin, families(i.name), i.description))
    widths = [max(len(r[c]) for r in rows) for c in range(5)]
    for r in rows:
        print("  ".join(r[c].ljust(widths[c]) for c in range(5)) + "  " + r[5])
    from inferno.cpu import summary  # what numpy and cpu-threaded run on

    blas = summary()
    if blas is not None:
        print(f"\n{blas}")
    return 0


