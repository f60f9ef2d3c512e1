"""Where a long prompt's time goes on `half:dtype=int8` (#44): the 124M shape's four int8 products and the
causal attention of one layer at T rows, each timed alone, against the whole prefill.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benches/prefill_breakdown.py [--tokens 1000]
    ... benches/prefill_breakdown.py --inputs rows     # half:dtype=int8,inputs=rows
    ... benches/prefill_breakdown.py --inputs rows --attention bfloat16

Each part is the best of `--repeat` calls (`_kernels.matmul` on random int8 weights, `_kernels.attention`
on random queries and a filled cache), times 12 layers; the prefill is `inferno.bench.time_prefill` on
random weights (best of `--repeat`). What the parts leave of the prefill is the rest of a layer (layer
norms, the GELU, the inputs' quantization, Python between the kernels) and the LM head's last row.
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import numpy as np

from inferno.bench import GPT2_124M, prompt_ids, random_weights, time_prefill, weights_in_layout

PRODUCTS = ((768, 2304), (768, 768), (768, 3072), (3072, 768))  # c_attn, attn c_proj, c_fc, mlp c_proj


def best(f, repeat: int) -> float:
    f()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--inputs", choices=("blocks", "rows"), default="blocks",
                   help="how int8's products quantize their inputs (the backend's `inputs` option)")
    p.add_argument("--attention", choices=("float32", "bfloat16"), default="float32",
                   help="the backend's `attention` option")
    args = p.parse_args(argv)
    import inferno_half.backend as hb
    from inferno_half import _kernels

    from inferno.backends.registry import get_backend
    from inferno.models.gpt2 import Gpt2

    rng = np.random.default_rng(0)
    t, h, d = args.tokens, GPT2_124M.n_head, GPT2_124M.n_embd // GPT2_124M.n_head
    q = rng.standard_normal((1, h, t, d)).astype(np.float32)
    k_cache = rng.standard_normal((1, h, t, d)).astype(np.float32)
    v_cache = rng.standard_normal((1, h, t, d)).astype(np.float32)
    out = np.empty_like(q)
    layers = GPT2_124M.n_layer
    bf16 = args.attention == "bfloat16"
    attention = best(lambda: _kernels.attention(q, k_cache, v_cache, 0, out, args.threads, bf16), args.repeat)
    products = 0.0
    code = hb.FORMATS["int8"] | (hb.FMT_ROWS if args.inputs == "rows" else 0)
    for k, n in PRODUCTS:
        w = hb.pack(rng.standard_normal((n, k)).astype(np.float32) * 0.02, "int8")
        x = rng.standard_normal((t, k)).astype(np.float32)
        y = np.empty((t, n), np.float32)
        call = partial(_kernels.matmul, x, w.blocks, n, None, y, code, args.threads, False)
        products += best(call, args.repeat)
    be = get_backend("half", dtype="int8", threads=args.threads, inputs=args.inputs, attention=args.attention)
    model = Gpt2.from_weights(GPT2_124M, weights_in_layout(random_weights(), be, {}), be)
    ids = prompt_ids(t, GPT2_124M.vocab_size)
    whole = min(time_prefill(model, ids) for _ in range(args.repeat))
    flops = 2 * t * sum(k * n for k, n in PRODUCTS)
    att_flops = 2 * 2 * h * d * t * (t + 1) / 2
    print(f"half:dtype=int8,inputs={args.inputs},attention={args.attention}, 124M shape, {t}-token prefill, "
          f"{args.threads} threads: "
          f"{whole * 1e3:.0f} ms "
          f"({t / whole:.0f} tok/s)")
    print(f"| part | ms (x{layers} layers) | share | GFLOP/s |")
    print("| --- | --: | --: | --: |")
    print(f"| int8 products | {layers * products * 1e3:.0f} | {layers * products / whole:.0%} | "
          f"{flops / products / 1e9:.0f} |")
    print(f"| causal attention | {layers * attention * 1e3:.0f} | {layers * attention / whole:.0%} | "
          f"{att_flops / attention / 1e9:.0f} |")
    rest = whole - layers * (products + attention)
    print(f"| the rest | {rest * 1e3:.0f} | {rest / whole:.0%} | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
