"""One row's product (a decode step's) of `half`'s formats side by side, in ONE run; or M rows' (a prompt's).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benches/one_row_products.py [--rounds 5] \\
        [--threads 2] [--codes int8 int8,rows q4 bfloat16 bfloat16,in16] [--rows 1]

Random weights of the GPT-2 124M shape's products (seeded): each round calls `_kernels.matmul` on one row
for every code in turn, `--repeat` times each; the table shows the medians over rounds in µs a call. A code
is a `dtype`, with `,rows` (inputs=rows) or `,in16` (inputs=bfloat16, the weights held in pairs). Small
products' weights stay in the CPU's cache between calls: this times the kernels, not the memory. With
`--rows M` each call multiplies M rows (fewer calls a round, as many multiply-adds), and the table adds
GFLOP/s; `INFERNO_HALF_ISA=avx2` times the AVX2 kernels on a CPU that has more.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

SHAPES = {"c_attn 768->2304": (768, 2304), "c_fc 768->3072": (768, 3072), "c_proj 3072->768": (3072, 768),
          "lm_head 768->50257": (768, 50257)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeat", type=int, default=100)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--codes", nargs="+", default=["int8", "int8,rows"])
    p.add_argument("--rows", type=int, default=1, help="rows a call (default 1: a decode step's product)")
    args = p.parse_args(argv)
    import inferno_half.backend as hb

    kernels = hb._KERNELS
    if kernels is None:
        print("the C kernels are not built", file=sys.stderr)
        return 1
    codes = {}
    for spec in args.codes:
        dtype, *extra = spec.split(",")
        if "in16" in extra:  # inputs=bfloat16: the weights held in pairs
            dtype = hb.PAIRS
        codes[spec] = (dtype, hb.FORMATS[dtype] | (hb.FMT_ROWS if "rows" in extra else 0))
    rng = np.random.default_rng(0)
    print(f"`python benches/one_row_products.py {' '.join(argv if argv is not None else sys.argv[1:])}` "
          f"({args.threads} threads, {args.rows} rows a call, {hb.ISA_CAP} kernels; µs a call"
          f"{' (GFLOP/s)' if args.rows > 1 else ''}, medians of {args.rounds} rounds)\n")
    print("| product | " + " | ".join(codes) + " |")
    print("| --- |" + " --: |" * len(codes))
    for name, (k, n) in SHAPES.items():
        w32 = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
        packed = {dtype: hb.pack(w32, dtype) for dtype, _ in codes.values()}
        x = rng.standard_normal((args.rows, k)).astype(np.float32)
        y = np.empty((args.rows, n), np.float32)
        repeat = max(1, args.repeat * 768 * 768 // (k * n * args.rows))
        times: dict[str, list[float]] = {spec: [] for spec in codes}
        for _ in range(args.rounds):
            for spec, (dtype, code) in codes.items():
                start = time.perf_counter()
                for _ in range(repeat):
                    kernels.matmul(x, packed[dtype].blocks, n, None, y, code, args.threads, False)
                times[spec].append((time.perf_counter() - start) / repeat * 1e6)
        cells = []
        for t in times.values():
            us = statistics.median(t)
            rate = f" ({2 * args.rows * k * n / us / 1e3:.0f})" if args.rows > 1 else ""
            cells.append(f"{us:.1f}{rate}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
