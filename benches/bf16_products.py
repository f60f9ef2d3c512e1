"""`half:dtype=bfloat16`'s products with float32 inputs against `inputs=bfloat16` (VDPBF16PS, or AMX-BF16
tiles where the CPU has them), side by side in ONE run (#44: bfloat16 dot products on CPUs that have them).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benches/bf16_products.py [--rounds 5] [--threads 2]

Random weights of the GPT-2 124M shape's four products (seeded), m = 1, 16, 96 and 1000 rows: each round
times both, in turn, each the best of `--repeat` calls of `_kernels.matmul`; the table shows the medians
over rounds, GFLOP/s, and the median (range) of the per-round ratios float32 time / bfloat16 time (above 1:
bfloat16 inputs are faster), and which path ran; where AMX-BF16 runs, a last line says how many outputs it
and VDPBF16PS give different bits for. Where the CPU has neither path the script says why and stops.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from functools import partial

import numpy as np

from inferno.bench import best_time

SHAPES = {"c_attn 768->2304": (768, 2304), "c_fc 768->3072": (768, 3072), "c_proj 3072->768": (3072, 768),
          "lm_head 768->50257": (768, 50257)}
ROWS = (1, 16, 96, 1000)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    import inferno_half.backend as hb

    kernels = hb._KERNELS
    path, why = kernels.bf16_products() if kernels is not None else ("", "the C kernels are not built")
    if not path:
        print(f"inputs=bfloat16 has no bfloat16 path here: {why}", file=sys.stderr)
        return 1
    # float32 inputs on bfloat16 weights; bfloat16 inputs on the same weights held in pairs (inputs=bfloat16)
    codes = {"float32 inputs": "bfloat16", "bfloat16 inputs": hb.PAIRS}
    rng = np.random.default_rng(0)
    print(f"`python benches/bf16_products.py {' '.join(argv if argv is not None else sys.argv[1:])}` "
          f"({path}, {args.threads} threads, medians of {args.rounds} rounds)\n")
    print("| product | rows | float32 inputs ms | GFLOP/s | bfloat16 inputs ms | GFLOP/s | speed-up |")
    print("| --- | --: | --: | --: | --: | --: | --: |")
    for name, (k, n) in SHAPES.items():
        w32 = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
        packed = {fmt: hb.pack(w32, fmt) for fmt in codes.values()}
        for m in ROWS:
            x = rng.standard_normal((m, k)).astype(np.float32)
            y = np.empty((m, n), np.float32)
            times: dict[str, list[float]] = {c: [] for c in codes}
            for _ in range(args.rounds):
                for label, fmt in codes.items():
                    call = partial(kernels.matmul, x, packed[fmt].blocks, n, None, y, hb.FORMATS[fmt],
                                   args.threads, False)
                    times[label].append(best_time(call, args.repeat))
            f32, b16 = times["float32 inputs"], times["bfloat16 inputs"]
            ratios = [a / b for a, b in zip(f32, b16, strict=True)]
            flop = 2 * m * n * k
            cells = [f"{statistics.median(t) * 1e3:.2f} | {flop / statistics.median(t) / 1e9:.0f}"
                     for t in (f32, b16)]
            print(f"| {name} | {m} | {cells[0]} | {cells[1]} | {statistics.median(ratios):.2f}x "
                  f"({min(ratios):.2f}-{max(ratios):.2f}) |")
    if path == "AMX-BF16":
        print(_paths_agree(hb, kernels, args.threads))
    return 0


def _paths_agree(hb, kernels, threads: int) -> str:
    """Where AMX-BF16 runs: how many outputs of 16 rows its tiles and VDPBF16PS (AMX switched off) give
    the same bits for (why a row cannot take one path alone and the other batched)."""
    rng = np.random.default_rng(1)
    lines = []
    for name in ("c_attn 768->2304", "c_proj 3072->768"):
        k, n = SHAPES[name]
        w = hb.pack((rng.standard_normal((n, k)) * 0.05).astype(np.float32), hb.PAIRS)
        x = rng.standard_normal((16, k)).astype(np.float32)
        ys = []
        for rows in (-1, 0):  # the default threshold (AMX), then AMX off
            kernels.amx_rows(rows)
            y = np.empty((16, n), np.float32)
            kernels.matmul(x, w.blocks, n, None, y, hb.FORMATS[hb.PAIRS], threads, False)
            ys.append(y)
        kernels.amx_rows(-1)
        differ = ys[0] != ys[1]
        lines.append(f"{name}: {differ.mean():.0%} of the outputs differ, by up to "
                     f"{np.abs(ys[0] - ys[1]).max():.1e} (outputs up to {np.abs(ys[0]).max():.1f})")
    return "\nAMX-BF16 against VDPBF16PS, 16 rows: " + "; ".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
