"""`half`'s own AMX tiles against oneDNN's (through PyTorch), product by product, side by side in ONE run
(#44: "write the tiles in the plugin's C, or link oneDNN; decide by measuring both on these shapes").

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benches/onednn_products.py [--rounds 5] [--threads 2]

The GPT-2 124M shape's four products (random weights, seeded) at m = 1, 16, 96 and 1000 rows, each round
timing in turn (each the best of `--repeat` calls):

* **int8**: `half`'s int8 product with `inputs=rows` (one input scale per row: its tiles at full depth),
  from float32 rows (quantizing them is in its time), against oneDNN's u8 x s8 product with float32 out
  (`torch.ops.onednn.qlinear_pointwise`, the weights prepacked once by `qlinear_prepack`; one scale for
  the inputs, one per output), from rows already quantized (quantizing is *not* in its time);
* **bfloat16**: `half`'s `inputs=bfloat16` product (weights in pairs, `bfloat16-pairs`) from float32 rows
  (rounding them is in its time) to float32 outputs, against oneDNN's bfloat16 product
  (`torch.ops.mkldnn._linear_pointwise` on weights prepacked by `_reorder_linear_weight`, what
  `torch:dtype=bfloat16` runs) from bfloat16 rows to bfloat16 outputs.

The tables: GFLOP/s (the medians over rounds) and the median (range) of the per-round ratios
oneDNN time / half time (above 1: half is faster). Which paths ran is printed first: `half`'s from
`_kernels`, oneDNN's from its verbose log of one call of each (`ONEDNN_VERBOSE=1` in a subprocess).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

import numpy as np

from inferno.bench import best_time

SHAPES = {"c_attn 768->2304": (768, 2304), "c_fc 768->3072": (768, 3072), "c_proj 3072->768": (3072, 768),
          "lm_head 768->50257": (768, 50257)}
ROWS = (1, 16, 96, 1000)


def _onednn_calls(torch, m: int, k: int, n: int, rng: np.random.Generator):
    """oneDNN's int8 and bfloat16 products of m rows by an [n, k] weight, as zero-argument calls."""
    w = torch.from_numpy((rng.standard_normal((n, k)) * 0.05).astype(np.float32))
    w_scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-8)
    qw = torch.ops.onednn.qlinear_prepack(torch.round(w / w_scale[:, None]).to(torch.int8), [m, k])
    w_zp = torch.zeros(n, dtype=torch.int64)
    qx = torch.from_numpy(rng.integers(0, 256, (m, k), dtype=np.uint8))
    wb = torch.ops.mkldnn._reorder_linear_weight(w.to(torch.bfloat16), None)
    xb = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(torch.bfloat16)

    def int8():
        return torch.ops.onednn.qlinear_pointwise(qx, 0.02, 0, qw, w_scale, w_zp, None, 1.0, 0, torch.float32,
                                                  "none", [], "")

    def bf16():
        return torch.ops.mkldnn._linear_pointwise(xb, wb, None, "none", [], "")

    return int8, bf16


def _half_calls(hb, m: int, k: int, n: int, rng: np.random.Generator, threads: int):
    """half's int8 (inputs=rows) and inputs=bfloat16 products of m float32 rows, as zero-argument calls."""
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    w8, w16 = hb.pack(w, "int8"), hb.pack(w, hb.PAIRS)
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = np.empty((m, n), np.float32)
    rows, pairs = hb.FORMATS["int8"] | hb.FMT_ROWS, hb.FORMATS[hb.PAIRS]

    def int8():
        assert hb._KERNELS.matmul(x, w8.blocks, n, None, y, rows, threads, False)

    def bf16():
        assert hb._KERNELS.matmul(x, w16.blocks, n, None, y, pairs, threads, False)

    return int8, bf16


def _onednn_paths(threads: int) -> str:
    """The ISA oneDNN's verbose log names for one int8 and one bfloat16 product (c_attn, 96 rows)."""
    code = ("import torch, numpy as np, sys; sys.path.insert(0, 'benches'); import onednn_products as o; "
            f"torch.set_num_threads({threads}); "
            "[c() for c in o._onednn_calls(torch, 96, 768, 2304, np.random.default_rng(0))]")
    env = {**os.environ, "ONEDNN_VERBOSE": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env).stdout
    lines = [line for line in out.splitlines() if ",exec," in line and "matmul" in line]
    return "; ".join(" ".join(line.split(",")[5:7]) for line in lines) or "(no verbose log)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed (it carries the oneDNN compared here)", file=sys.stderr)
        return 1
    import inferno_half.backend as hb

    if hb._KERNELS is None:
        print("the C kernels are not built", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    print(f"`python benches/onednn_products.py {' '.join(argv if argv is not None else sys.argv[1:])}` "
          f"({args.threads} threads, medians of {args.rounds} rounds; torch {torch.__version__})\n")
    print(f"half: int8 inputs=rows on {hb._KERNELS.int8_path(96)} (96 rows), inputs=bfloat16 on "
          f"{hb._KERNELS.bf16_products()[0] or 'float32 inputs'}; oneDNN: {_onednn_paths(args.threads)}\n")
    print("| product | rows | int8 half GFLOP/s | oneDNN | oneDNN time / half's | bfloat16 half GFLOP/s "
          "| oneDNN | oneDNN time / half's |")
    print("| --- | --: | --: | --: | --: | --: | --: | --: |")
    rng = np.random.default_rng(0)
    for name, (k, n) in SHAPES.items():
        for m in ROWS:
            half = _half_calls(hb, m, k, n, rng, args.threads)
            calls = dict(zip(("half int8", "half bf16", "onednn int8", "onednn bf16"),
                             (*half, *_onednn_calls(torch, m, k, n, rng)), strict=True))
            repeat = max(1, args.repeat * (20 if m * n * k < 1e8 else 1))
            times: dict[str, list[float]] = {c: [] for c in calls}
            for _ in range(args.rounds):
                for label, call in calls.items():
                    times[label].append(best_time(call, repeat))
            flop = 2 * m * n * k
            cells = []
            for kind in ("int8", "bf16"):
                mine, theirs = times[f"half {kind}"], times[f"onednn {kind}"]
                ratios = [b / a for a, b in zip(mine, theirs, strict=True)]
                cells += [f"{flop / statistics.median(t) / 1e9:.0f}" for t in (mine, theirs)]
                cells.append(f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
            print(f"| {name} | {m} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
