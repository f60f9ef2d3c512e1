"""The matrix products of one decode step at M rows, through NumPy's BLAS: the ceiling of batched decode.

    python benches/small_m_gemm.py                         # M = 1, 2, 4, 8, 16, 32
    python benches/small_m_gemm.py --rows 1,16 --coretypes Haswell,Zen,SkylakeX

A step of M sequences multiplies an [M, 768] activation by each of the 48 block matrices of GPT-2 124M
(12 layers of distinct weights, so they stream from memory as in a real step) and by the 768 x 50257 LM
head. This times those products alone, best of `--repeat` runs, in several ways:

* ``C``: ``x @ w`` with w row-major [in, out] (numpy's layout for the blocks);
* ``F``: w in Fortran order (the layout numpy keeps c_proj in);
* ``T``: ``(w.T @ x.T).T`` with w.T row-major (the big matrix as BLAS's A operand);
* ``split-N`` / ``split-M``: our own two threads each take half of the outputs / of the rows, BLAS on one
  thread each (what cpu-threaded could do);
* ``half`` / ``half-i8`` (where the inferno-gpt2-half plugin is installed): its kernel on the same weights
  packed in float16 / int8 panels, on two threads (one pass over each panel serves every row);
* ``unpacked``: the float16 panels unpacked to a float32 [in, out] matrix per product, then BLAS (the
  other way to run a prefill on 16-bit weights: ``--rows 64,1000`` compares them);

and the head as numpy runs it (``x @ wte.T``, wte in Fortran order). With `--coretypes`, each OpenBLAS
kernel (``OPENBLAS_CORETYPE``) runs in a fresh process. Columns: ms for the 48 block products, and
GFLOP/s; the last line is the ratio that matters for batching: M rows' products over one row's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import numpy as np
from threadpoolctl import threadpool_limits

SHAPES = ((768, 2304), (768, 768), (768, 3072), (3072, 768))  # [in, out] of c_attn, c_proj, c_fc, c_proj
LAYERS, VOCAB, C = 12, 50257, 768
BLOCK_FLOP = 2 * LAYERS * sum(i * o for i, o in SHAPES)  # per row
HEAD_FLOP = 2 * C * VOCAB
#: The clock and inferno-gpt2-half's threads: wall time and 2, or with --cpu-time CPU time and 1 (BLAS too).
CLOCK, THREADS = time.perf_counter, 2


def best_ms(f, repeat: int) -> float:
    f()
    times = []
    for _ in range(repeat):
        start = CLOCK()
        f()
        times.append(CLOCK() - start)
    return 1e3 * min(times)


def _product(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return (x[0] @ w)[None] if x.shape[0] == 1 else x @ w  # one row: GEMV, as the numpy backend does


def _blocks(kind: str, xs: list, blocks: list, fortran: list, pool: ThreadPoolExecutor) -> None:
    """The 48 block products of one step, `kind` as in the module docstring."""
    for layer, layer_f in zip(blocks, fortran, strict=True):
        for x, w, wf in zip(xs, layer, layer_f, strict=True):
            if kind == "C":
                _product(x, w)
            elif kind == "F":
                _product(x, wf)
            elif kind == "T":
                wf.T @ x.T  # wf.T is w.T, row-major
            elif kind == "split-N":
                n = w.shape[1] // 2
                a, b = pool.submit(_product, x, w[:, :n]), pool.submit(_product, x, w[:, n:])
                a.result(), b.result()
            else:  # split-M
                h = max(1, x.shape[0] // 2)
                a, b = pool.submit(np.matmul, x[:h], w), pool.submit(np.matmul, x[h:], w)
                a.result(), b.result()


def _half_blocks(kernels, xs: list, packed: list, code: int) -> None:
    """The 48 block products through inferno-gpt2-half's kernel (two threads)."""
    for layer in packed:
        for x, w in zip(xs, layer, strict=True):
            y = np.empty((x.shape[0], w.rows[0]), np.float32)
            kernels.matmul(x, w.blocks, w.rows[0], None, y, code, THREADS, False)


def _unpacked_blocks(kernels, xs: list, packed: list) -> None:
    """The 48 block products on float16 panels unpacked to float32 per product, then BLAS."""
    for layer in packed:
        for x, w in zip(xs, layer, strict=True):
            n, k = w.rows
            t = np.empty((k, w.blocks.shape[0] * 32), np.float32)
            kernels.unpack_t(w.blocks, n, 0, w.blocks.shape[0], k, t, 0, THREADS)
            x @ (t if t.shape[1] == n else t[:, :n])


def _half():
    """inferno-gpt2-half's backend module, or None where the plugin (or its compiled kernels) is missing."""
    try:
        import inferno_half.backend as hb
    except ImportError:
        return None
    return hb if hb._KERNELS is not None else None


def measure(rows: list[int], repeat: int) -> dict:
    rng = np.random.default_rng(0)
    blocks = [[rng.standard_normal(s, dtype=np.float32) for s in SHAPES] for _ in range(LAYERS)]
    fortran = [[np.asfortranarray(w) for w in layer] for layer in blocks]
    wte = np.asfortranarray(rng.standard_normal((VOCAB, C), dtype=np.float32))
    hb = _half()
    packed = {fmt: [[hb.pack(w.T, fmt) for w in layer] for layer in blocks] for fmt in ("float16", "int8")} \
        if hb else {}
    pool = ThreadPoolExecutor(2)
    results: dict = {}
    for m in rows:
        xs = [rng.standard_normal((m, i), dtype=np.float32) for i, _ in SHAPES]
        xh = rng.standard_normal((m, C), dtype=np.float32)
        row = {kind: best_ms(partial(_blocks, kind, xs, blocks, fortran, pool), repeat) for kind in "CFT"}
        with threadpool_limits(1):  # BLAS on one thread, our two threads split the product
            for kind in ("split-N",) + (("split-M",) if m > 1 else ()):
                row[kind] = best_ms(partial(_blocks, kind, xs, blocks, fortran, pool), repeat)
        for kind, fmt in (("half", "float16"), ("half-i8", "int8")):
            if fmt in packed:
                run = partial(_half_blocks, hb._KERNELS, xs, packed[fmt], hb.FORMATS[fmt])
                row[kind] = best_ms(run, repeat)
        if "float16" in packed:
            row["unpacked"] = best_ms(partial(_unpacked_blocks, hb._KERNELS, xs, packed["float16"]), repeat)
        row["head"] = best_ms(partial(_product, xh, wte.T), repeat)
        results[m] = row
        cells = [f"{k} {v:6.1f} ms ({m * BLOCK_FLOP / v / 1e6:4.0f} GF/s)"
                 for k, v in row.items() if k != "head"]
        cells.append(f"head {row['head']:5.1f} ms ({m * HEAD_FLOP / row['head'] / 1e6:4.0f} GF/s)")
        print(f"  M={m:3d}  " + "  ".join(cells), file=sys.stderr, flush=True)
    pool.shutdown()
    return results


def report(label: str, results: dict) -> None:
    kinds = [k for k in results[min(results)] if k != "head"]
    print(f"\n{label}: ms for the 48 block products (best of runs) and the LM head")
    print("| rows | " + " | ".join(kinds) + " | head | best step products | x one row |")
    print("| --: |" + " --: |" * (len(kinds) + 3))
    one = min(results[1][k] for k in kinds) + results[1]["head"] if 1 in results else None
    for m, row in results.items():
        best = min(row.get(k, float("inf")) for k in kinds) + row["head"]
        ratio = f"{best / one:.2f}" if one else "-"
        cells = " | ".join(f"{row[k]:.1f}" if k in row else "-" for k in kinds)
        print(f"| {m} | {cells} | {row['head']:.1f} | {best:.1f} | {ratio} |")
    if one and 16 in results:
        best16 = min(results[16].get(k, float("inf")) for k in kinds) + results[16]["head"]
        print(f"\n16 rows: products alone {best16 / one:.2f}x one row's; a 16-sequence step at 6x one "
              f"sequence's would need the whole step within {16 / 6:.2f}x (products, attention, sampling).")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,2,4,8,16,32", help="row counts M (default 1,2,4,8,16,32)")
    p.add_argument("--repeat", type=int, default=7, help="runs of each measurement (default 7)")
    p.add_argument("--coretypes", default="", help="OpenBLAS kernels to compare, comma-separated "
                   "(each in a fresh process with OPENBLAS_CORETYPE; default: the one chosen here)")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # a child's output
    p.add_argument("--cpu-time", action="store_true", help="one thread for BLAS and the half kernel (the "
                   "split kinds still use two), timed in CPU seconds: steadier on a shared machine")
    args = p.parse_args(argv)
    if args.cpu_time:
        global CLOCK, THREADS
        CLOCK, THREADS = time.process_time, 1
        threadpool_limits(1)
    try:
        rows = sorted({int(r) for r in args.rows.split(",")})
    except ValueError:
        p.error(f"--rows: expected comma-separated integers, got {args.rows!r}")
    if any(r < 1 for r in rows) or args.repeat < 1:
        p.error("--rows and --repeat must be >= 1")
    if args.json:
        json.dump(measure(rows, args.repeat), sys.stdout)
        return 0
    if not args.coretypes:
        from threadpoolctl import threadpool_info

        blas = next((i for i in threadpool_info() if i.get("user_api") == "blas"), {})
        name = f"{blas.get('internal_api', 'BLAS')} {blas.get('version', '')}"
        report(f"{name} ({blas.get('architecture', '?')}, {blas.get('num_threads', '?')} threads)",
               measure(rows, args.repeat))
        return 0
    for core in args.coretypes.split(","):
        print(f"OPENBLAS_CORETYPE={core}", file=sys.stderr, flush=True)
        command = [sys.executable, __file__, "--rows", args.rows, "--repeat", str(args.repeat), "--json"]
        out = subprocess.run(command, env={**os.environ, "OPENBLAS_CORETYPE": core}, capture_output=True,
                             text=True)
        if out.returncode:
            print(out.stderr, file=sys.stderr)
            return out.returncode
        report(f"OPENBLAS_CORETYPE={core}", {int(k): v for k, v in json.loads(out.stdout).items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
