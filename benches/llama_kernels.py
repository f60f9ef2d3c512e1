"""The Llama family's kernels in a plugin backend, native against what it ran before, side by side.

    python benches/llama_kernels.py                                  # half, half:dtype=int8, torch
    python benches/llama_kernels.py --backends torch:dtype=bfloat16 --new-tokens 16

A random model of SmolLM2-135M's shape (30 layers, hidden 576, 9 query heads over 3 key/value heads,
vocabulary 49152, tied head; or with ``--shape qwen2.5-0.5b`` Qwen2.5-0.5B's) runs a prompt and then
decode steps (`Llama.forward` with a KV cache) on three variants of each backend, built from the same
weights and timed in turn, round after round (the machine is shared: compare the ratios of one run):

* ``defaults``: the base class's Llama kernels (`rms_norm`, `rotary` and `silu_mul` through the host in
  float64, `gqa_attention` as `attention` once per group member, `heads` composed from GPT-2's kernels;
  the plugin's own `embed_tokens`), the weights held as the plugin holds them: what the plugin's own
  kernels gain.
* ``before``: the plugin before it had Llama kernels of its own: the ones it inherited (`half`: NumPy's,
  `torch`: the Array API backend's), and the Llama family's matrices as plain float32 (`half`) or
  compute-dtype (`torch`) arrays, with no 16/8-bit or oneDNN packing.
* ``native``: the plugin as it is.

Reports the median time per prompt token and per decoded token of each variant, and the median over the
rounds of its ratio to ``native`` in the same round.

With ``--ragged N``, N sequences instead run through `Llama.forward_ragged` as the batching engine runs
them (each prompt its own step, then decode steps of all N rows together; ms per decoded token = a step
over N), and the variant ``rowwise`` is the plugin as it is but for `ragged_gqa_attention`, which runs
the base class's default (`write_kv` and `gqa_attention` once per row): what the one-call kernel gains.
The variant ``unfused`` is the plugin as it is but for `gated_mlp`, the base class's composition (three
`linear` calls and `silu_mul`): what the plugin's one-call MLP gains; ``separate`` but for `linears`, a
`linear` call for each of q, k and v.

    python benches/llama_kernels.py --backends half:dtype=q4,half:dtype=int8 --ragged 16 \
        --variants rowwise,native --prompt-tokens 64 --repeat 5
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import numpy as np

from inferno.backends.base import Backend
from inferno.backends.registry import get_backend
from inferno.models.llama import Llama, LlamaConfig, tensor_plan
from inferno.testing import llama_state_dict

KERNELS = ("embed_tokens", "heads", "rms_norm", "rotary", "silu_mul", "gqa_attention", "ragged_gqa_attention")
#: The Llama family's matrices (under "model."): what the plugins did not pack before.
LLAMA_MATRICES = ("_proj.weight", "model.embed_tokens.weight")
#: The variants that are the plugin as it is but for one kernel, the base class's default.
ONE_DEFAULT = {"rowwise": "ragged_gqa_attention", "unfused": "gated_mlp", "separate": "linears"}
SMOLLM2_135M = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 576,
                "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
                "num_key_value_heads": 3, "vocab_size": 49152, "max_position_embeddings": 8192,
                "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": True,
                "hidden_act": "silu"}
QWEN25_05B = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 896,
              "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
              "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 8192,
              "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True,
              "hidden_act": "silu"}
SHAPES = {"smollm2-135m": ("SmolLM2-135M", SMOLLM2_135M), "qwen2.5-0.5b": ("Qwen2.5-0.5B", QWEN25_05B)}


def variant(backend: Backend, kind: str) -> Backend:
    """`backend` itself (``native``), or turned into a subclass that runs the base class's kernels
    (``defaults``), or the inherited kernels on plain Llama matrices (``before``)."""
    if kind == "native":
        return backend
    cls = type(backend)
    if kind in ONE_DEFAULT:
        name = ONE_DEFAULT[kind]
        backend.__class__ = type(f"{cls.__name__}_{kind}", (cls,), {name: getattr(Backend, name)})
        return backend
    # The nearest built-in ancestor: what the plugin inherited its Llama kernels from.
    parent = next(c for c in cls.__mro__[1:] if c.__module__.startswith("inferno.backends."))
    ns = {k: getattr(Backend if kind == "defaults" else parent, k) for k in KERNELS}
    if kind == "defaults":
        # (Not embed_tokens: its default reads [V, C] from wte.shape, which a packed half embedding does not
        # have; one gather a forward either way.)
        del ns["embed_tokens"]
        backend.__class__ = type(f"{cls.__name__}_{kind}", (cls,), ns)
        return backend

    def plain(name: str) -> bool:
        return name.startswith("model.") and name.endswith(LLAMA_MATRICES)

    def weight_order(self, name: str) -> str:
        return "C" if plain(name) else cls.weight_order(self, name)

    def prepare_weight(self, name: str, a: np.ndarray):
        if plain(name):
            return self.from_numpy(np.ascontiguousarray(a))
        return cls.prepare_weight(self, name, a)

    ns.update(weight_order=weight_order, prepare_weight=prepare_weight)
    backend.__class__ = type(f"{cls.__name__}_{kind}", (cls,), ns)
    return backend


def load(config: LlamaConfig, sd: dict[str, np.ndarray], backend: Backend) -> Llama:
    """The model on `backend`, each weight handed over in the memory order its `weight_order` asks for,
    as the loader reads a checkpoint."""
    plan = tensor_plan(config)
    return Llama.from_weights(config, ((n, np.asarray(a.T if n in plan.transposed else a,
                                                      order=backend.weight_order(n)))
                                       for n, a in sd.items() if n in plan.shapes), backend)


def time_model(model, ids: np.ndarray, new_tokens: int) -> tuple[float, float]:
    """(seconds per prompt token, seconds per decoded token) of one run."""
    cache = model.new_cache(1, ids.shape[1] + new_tokens)
    t0 = time.perf_counter()
    logits = model.forward(ids, cache)
    model.backend.to_numpy(logits)
    t1 = time.perf_counter()
    tok = ids[:, -1:]
    for _ in range(new_tokens):
        model.backend.to_numpy(model.forward(tok, cache))
    t2 = time.perf_counter()
    return (t1 - t0) / ids.shape[1], (t2 - t1) / new_tokens


def time_ragged(model, ids: np.ndarray, new_tokens: int) -> tuple[float, float]:
    """(seconds per prompt token, seconds per decoded token) of the rows of ids [N, T] through
    `forward_ragged`: each prompt a step of its own, then `new_tokens` steps of all N rows."""
    n, t = ids.shape
    if getattr(model, "bench_slots", None) is None or model.bench_slots.n_slots < n:
        # Allocated once, as a server's: fresh zeroed slots would time their pages' first touch.
        model.bench_slots = model.new_slots(n)
    slots = model.bench_slots
    t0 = time.perf_counter()
    for r in range(n):
        model.backend.to_numpy(model.forward_ragged([(ids[r].tolist(), r, 0)], slots))
    t1 = time.perf_counter()
    for i in range(new_tokens):
        step = [(ids[r, -1:].tolist(), r, t + i) for r in range(n)]
        model.backend.to_numpy(model.forward_ragged(step, slots))
    t2 = time.perf_counter()
    return (t1 - t0) / (n * t), (t2 - t1) / (new_tokens * n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="half,half:dtype=int8,torch",
                    help="backend specs, split at ',' or, where a spec has options of its own, at ';' "
                         "('half:dtype=q4;half:dtype=q4,kv=float16')")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--variants", default="defaults,before,native",
                    help="of defaults, before, rowwise, unfused, separate, native")
    ap.add_argument("--ragged", type=int, default=0, metavar="N", help="N sequences through forward_ragged")
    ap.add_argument("--shape", choices=SHAPES, default="smollm2-135m")
    args = ap.parse_args()
    run = time_model if not args.ragged else time_ragged
    title, shape = SHAPES[args.shape]
    config = LlamaConfig.from_dict(shape)
    sd = llama_state_dict(shape, seed=0)
    ids = np.random.default_rng(1).integers(0, config.vocab_size, (max(1, args.ragged), args.prompt_tokens))
    kinds = args.variants.split(",")
    rows = f"{args.ragged} sequences through forward_ragged; " if args.ragged else ""
    print(f"{title} shape, random weights; {rows}prompt {args.prompt_tokens} tokens, {args.new_tokens} "
          f"decoded, median of {args.repeat} interleaved rounds")
    specs = args.backends.split(";" if ";" in args.backends else ",")
    wide = max(22, *(len(s) for s in specs))
    print(f"{'backend':<{wide}} {'variant':<10} {'prefill ms/tok':>15} {'decode ms/tok':>14} "
          f"{'x native':>17}")
    for spec in specs:
        models = {k: load(config, sd, variant(get_backend(spec), k)) for k in kinds}
        for m in models.values():  # warm up: first calls, thread pools, oneDNN primitives
            run(m, ids[:, :8], 2)
        runs: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
        for _ in range(args.repeat):
            for k in kinds:
                time.sleep(0.2)  # let BLAS/OpenMP worker threads stop spinning
                runs[k].append(run(models[k], ids, args.new_tokens))
        med = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v))
               for k, v in runs.items()}
        base = runs.get("native")
        for k in kinds:
            p, d = med[k]
            ratio = ""
            if base:  # the median of the per-round ratios: a round's variants ran back to back
                rp = statistics.median(r[0] / b[0] for r, b in zip(runs[k], base, strict=True))
                rd = statistics.median(r[1] / b[1] for r, b in zip(runs[k], base, strict=True))
                ratio = f"{rp:.2f} / {rd:.2f}"
            print(f"{spec:<{wide}} {k:<10} {1e3 * p:>15.2f} {1e3 * d:>14.2f} {ratio:>17}")
        for m in models.values():
            m.backend.close()
        del models
        gc.collect()


if __name__ == "__main__":
    main()
