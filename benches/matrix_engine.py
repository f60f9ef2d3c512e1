"""The CPU's matrix engine (#44): the `half` plugin's int8 products on AMX tiles against AVX-512 VNNI,
side by side in ONE run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benches/matrix_engine.py
    python benches/matrix_engine.py --rounds 7 --threads 1 --json out.json

Two parts, both on random weights of the GPT-2 124M shape (seeded), `half:dtype=int8`:

* products: the int8 product (`_kernels.matmul`: quantize the rows, the int32 block sums, the float sum,
  the scales and bias) at m = 16, 64, 256 and 1000 rows for the [768 -> 2304] (c_attn), [768 -> 3072]
  (c_fc), [3072 -> 768] (mlp c_proj) and [768 -> 50257] (LM head) shapes, with AMX tiles for every row
  count (`amx_rows(1)`) and with VNNI only (`amx_rows(0)`). Each round times both, in turn, each the best
  of `--repeat` calls; the table shows the median over rounds and the median of the per-round ratios
  VNNI time / AMX time (above 1: AMX is faster). Both give the same bits (checked here too).
* prefill: tok/s of a 64- and a 1000-token prompt through the whole model (fresh cache, host logits of
  the last position, as `inferno.bench.time_prefill`), with the default AMX threshold and with AMX off;
  rounds interleaved, medians, the median of the per-round ratios.

The machine's load average (`os.getloadavg`) is printed before and after: timings on a shared machine
are noisy, which is why only ratios measured side by side are worth quoting. Where AMX cannot run (no
AMX-INT8, or the kernel refuses tile data) the script says why and stops.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

from inferno.bench import GPT2_124M, prompt_ids, random_weights, time_prefill, weights_in_layout

SHAPES = {"c_attn 768->2304": (768, 2304), "c_fc 768->3072": (768, 3072), "c_proj 3072->768": (3072, 768),
          "lm_head 768->50257": (768, 50257)}
ROWS = (16, 64, 256, 1000)
PREFILLS = (64, 1000)


def load_avg() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def products(kernels, hb, rounds: int, repeat: int, threads: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for name, (k, n) in SHAPES.items():
        w = hb.pack(rng.standard_normal((n, k), dtype=np.float32), "int8")
        b = rng.standard_normal(n, dtype=np.float32)
        for m in ROWS:
            x = rng.standard_normal((m, k), dtype=np.float32)
            y = {on: np.empty((m, n), np.float32) for on in (True, False)}
            times: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(rounds):
                for on in (True, False):
                    kernels.amx_rows(1 if on else 0)
                    best = float("inf")
                    for _ in range(repeat):
                        start = time.perf_counter()
                        kernels.matmul(x, w.blocks, n, b, y[on], hb.FORMATS["int8"], threads, False)
                        best = min(best, time.perf_counter() - start)
                    times[on].append(best)
            kernels.amx_rows(-1)
            same = bool(np.array_equal(y[True], y[False]))
            ratio = statistics.median(v / a for v, a in zip(times[False], times[True], strict=True))
            amx, vnni = statistics.median(times[True]), statistics.median(times[False])
            rows.append({"product": name, "m": m, "amx_ms": 1e3 * amx, "vnni_ms": 1e3 * vnni, "ratio": ratio,
                         "amx_gmacs": m * k * n / amx / 1e9, "vnni_gmacs": m * k * n / vnni / 1e9,
                         "same_bits": same})
            print(f"{name:20} m={m:5}  AMX {1e3 * amx:8.2f} ms ({rows[-1]['amx_gmacs']:5.0f} GMAC/s)  "
                  f"VNNI {1e3 * vnni:8.2f} ms ({rows[-1]['vnni_gmacs']:5.0f} GMAC/s)  VNNI/AMX {ratio:4.2f}"
                  f"{'' if same else '  BITS DIFFER'}", flush=True)
    return rows


def prefill(kernels, rounds: int, threads: int, seed: int) -> list[dict]:
    from inferno.backends.registry import get_backend
    from inferno.models.families import from_weights

    backend = get_backend(f"half:dtype=int8,threads={threads}")
    model = from_weights(GPT2_124M, weights_in_layout(random_weights(GPT2_124M, seed), backend, {}), backend)
    rows = []
    try:
        for tokens in PREFILLS:
            ids = prompt_ids(tokens, GPT2_124M.vocab_size, seed)
            time_prefill(model, ids[:8])  # warm up
            times: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(rounds):
                for on in (True, False):
                    kernels.amx_rows(-1 if on else 0)
                    time.sleep(0.2)  # the previous part's thread pools stop spinning
                    times[on].append(time_prefill(model, ids))
            kernels.amx_rows(-1)
            ratio = statistics.median(v / a for v, a in zip(times[False], times[True], strict=True))
            on, off = tokens / statistics.median(times[True]), tokens / statistics.median(times[False])
            rows.append({"prefill": tokens, "amx_tok_s": on, "vnni_tok_s": off, "ratio": ratio})
            print(f"prefill {tokens:5} tokens  AMX on {on:7.0f} tok/s  off (VNNI) {off:7.0f} tok/s  "
                  f"on/off {ratio:4.2f}", flush=True)
    finally:
        backend.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median over them)")
    parser.add_argument("--repeat", type=int, default=3, help="calls per product and round (the best)")
    parser.add_argument("--threads", type=int, default=None, help="kernel threads (default: usable cores)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-prefill", action="store_true")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)

    import inferno_half.backend as hb

    from inferno.cpu import resolve_threads

    kernels = hb._KERNELS
    if kernels is None:
        print("the half plugin's C kernels are not built", file=sys.stderr)
        return 1
    if kernels.amx_support():
        print(f"AMX cannot run here: {kernels.amx_support()}", file=sys.stderr)
        return 1
    threads = args.threads or resolve_threads(None, who="matrix_engine")
    print(f"threads {threads}; default AMX threshold {kernels.amx_rows(-1)} rows; load average {load_avg()}",
          flush=True)
    report = {"threads": threads, "load_before": load_avg(),
              "products": products(kernels, hb, args.rounds, args.repeat, threads, args.seed)}
    if not args.skip_prefill:
        report["prefill"] = prefill(kernels, args.rounds, threads, args.seed)
    report["load_after"] = load_avg()
    print(f"load average {report['load_after']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
