"""What a JSON Schema constraint costs per token, against the same run unconstrained, side by side in ONE run.

    python benches/structured.py [--repeat 5] [--new-tokens 64] [--batch-backend numpy]
                                 [--engine-backend half:dtype=int8] [--sequences 16]

Random weights of the GPT-2 124M shape (speed does not depend on the values) and the real tokenizer,
called through `inferno.api.Pipeline` as a user calls it, sampling at temperature 1 (seeded). The schema
(`SCHEMA`) is an array of at least 1,000 small objects (a string with a length bound, an integer range,
an enum, a nested array of numbers): it cannot close within the budget, so constrained and unconstrained
runs decode the same number of tokens, and the constraint's mask is computed through nested objects,
arrays, strings and numbers all along. A second schema (`FREE_STRINGS`, an array of at least 1,000
unbounded strings) is the worst case: almost every token is allowed at almost every step, so the step
masks the whole row and draws over all of it, where with `SCHEMA` most steps allow few tokens (or one),
and drawing among few costs less than an unconstrained draw over the whole vocabulary.
``stop_at_eos=False`` on both sides. Every case is measured in every repeat, in an order rotated from
repeat to repeat; figures are medians, ratios the median of the per-repeat ratios with their range.
Nothing is asserted: the targets are printed next to the figures.

1. Batch 1 (target: constrained <= 1.10x the unconstrained time per token, on `--batch-backend`):
   ``pipe.tokens(...)`` decode steps after the first (the prefill is not timed).
2. `--sequences` sequences through the engine (target: <= 1.15x, on `--engine-backend`):
   ``pipe.generate_batch`` of that many 8-token prompts, wall time over new tokens.
   Both with each schema.
3. Where the time goes, without the model: `SequenceState.step` on logits rows captured from a decode,
   with and without the constraint, and the mask alone (`ConstraintMatcher.allowed`), microseconds per
   step, for each schema.
4. Compiling: building llguidance's tokenizer from inferno's (once per tokenizer), checking a schema
   (`Constraint.json_schema`), compiling it for the tokenizer (the first sequence; cached after), a
   sequence's start from the cache, and its first mask.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np

from inferno import structured
from inferno.api import Pipeline
from inferno.backends.registry import get_backend
from inferno.bench import GPT2_124M, prompt_ids, random_weights
from inferno.models.gpt2 import Gpt2
from inferno.options import GenerationOptions, SequenceState
from inferno.structured import Constraint
from inferno.testing_fixtures import TOKENIZER_JSON
from inferno.tokenizer import Tokenizer

ITEM = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "role": {"enum": ["admin", "user", "guest"]},
    "scores": {"type": "array", "items": {"type": "number"}, "maxItems": 4},
}, "required": ["name", "age", "role"], "additionalProperties": False}
SCHEMA = {"type": "array", "items": ITEM, "minItems": 1000}
#: The worst case for the mask's cost: inside a string without bounds almost every token is allowed, so
#: a step masks the whole row and draws over it, as an unconstrained step draws.
FREE_STRINGS = {"type": "array", "items": {"type": "string"}, "minItems": 1000}
SAMPLING = {"temperature": 1.0, "seed": 1}


def med(values: list[float]) -> float:
    return statistics.median(values)


def paired(num: list[float], den: list[float]) -> str:
    r = [a / b for a, b in zip(num, den, strict=True)]
    return f"{med(r):.3f}x ({min(r):.3f}-{max(r):.3f})"


def machine() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{platform.machine()}, {cores} usable cores; numpy {np.__version__}"


def batch1_seconds_per_token(pipe: Pipeline, prompt: list[int], n: int,
                             constraint: Constraint | None) -> float:
    """Seconds per decode step after the first token (the prefill is not timed)."""
    steps = pipe.tokens(prompt, n + 1, stop_at_eos=False, constraint=constraint, **SAMPLING).steps()
    next(steps)
    start = time.perf_counter()
    count = sum(1 for _ in steps)
    return (time.perf_counter() - start) / count


def engine_seconds_per_token(pipe: Pipeline, prompts: list[list[int]], n: int,
                             constraint: Constraint | None) -> float:
    start = time.perf_counter()
    results = pipe.generate_batch(prompts, n, stop_at_eos=False, constraint=constraint, **SAMPLING)
    return (time.perf_counter() - start) / sum(r.new_tokens for r in results)


def capture_rows(pipe: Pipeline, prompt: list[int], n: int, schema: dict) -> list[np.ndarray]:
    """Host logits rows of a constrained decode (what `SequenceState.step` is given)."""
    rows: list[np.ndarray] = []
    model = pipe.model
    cache = model.new_cache(1, len(prompt) + n)
    logits = model.forward(np.asarray([prompt]), cache)
    state = SequenceState(GenerationOptions(constraint=Constraint.json_schema(schema), **SAMPLING), prompt,
                          pipe.tokenizer.incremental_decoder())
    for _ in range(n):
        rows.append(np.array(model.backend.to_numpy(logits)[0, : pipe.sample_limit]))
        logits = model.forward(np.asarray([[state.step(rows[-1]).id]]), cache)
    return rows


def step_us(pipe: Pipeline, prompt: list[int], rows: list[np.ndarray],
            constraint: Constraint | None) -> float:
    state = SequenceState(GenerationOptions(constraint=constraint, **SAMPLING), prompt,
                          pipe.tokenizer.incremental_decoder())
    start = time.perf_counter()
    for row in rows:
        state.step(row)
    return (time.perf_counter() - start) / len(rows) * 1e6


def mask_us(pipe: Pipeline, rows: list[np.ndarray], prompt: list[int], schema: dict) -> float:
    """The mask alone, over the tokens the constrained decode chose."""
    state = SequenceState(GenerationOptions(constraint=Constraint.json_schema(schema), **SAMPLING), prompt,
                          pipe.tokenizer.incremental_decoder())
    ids = [state.step(row).id for row in rows]
    m = Constraint.json_schema(schema).start(pipe.tokenizer)
    start = time.perf_counter()
    for i in ids:
        m.allowed()
        m.consume(i)
    return (time.perf_counter() - start) / len(ids) * 1e6


def compile_ms(tokenizer_json: str) -> dict[str, float]:
    out = {}
    tok = Tokenizer.from_file(tokenizer_json)  # a fresh tokenizer: llguidance's view is built anew
    t = time.perf_counter()
    structured.lltokenizer(tok)
    out["llguidance's tokenizer from inferno's (once per tokenizer)"] = time.perf_counter() - t
    schema = {**SCHEMA, "description": f"fresh {time.time()}"}  # never cached before
    t = time.perf_counter()
    c = Constraint.json_schema(schema)
    out["check the schema (Constraint.json_schema)"] = time.perf_counter() - t
    t = time.perf_counter()
    m = c.start(tok)
    out["compile for the tokenizer (first sequence)"] = time.perf_counter() - t
    t = time.perf_counter()
    m.allowed()
    out["first mask"] = time.perf_counter() - t
    t = time.perf_counter()
    c.start(tok)
    out["start a sequence from the cache"] = time.perf_counter() - t
    return {k: v * 1e3 for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batch-backend", default="numpy")
    ap.add_argument("--engine-backend", default="half:dtype=int8")
    ap.add_argument("--sequences", type=int, default=16)
    args = ap.parse_args(argv)
    n = args.new_tokens
    print(f"{machine()}; python {sys.version.split()[0]}")
    print(f"GPT-2 124M shape, random weights; {n} new tokens; {args.repeat} repeats; schema: an array of "
          f">= 1000 objects (string <= 12, integer 0-150, enum, array of <= 4 numbers)")
    tokenizer = Tokenizer.from_file(TOKENIZER_JSON)
    weights = random_weights(GPT2_124M)
    constraint = Constraint.json_schema(SCHEMA)
    free = Constraint.json_schema(FREE_STRINGS)
    pipes = {name: Pipeline(Gpt2.from_weights(GPT2_124M, dict(weights), get_backend(name)), tokenizer)
             for name in dict.fromkeys([args.batch_backend, args.engine_backend])}
    one, many = pipes[args.batch_backend], pipes[args.engine_backend]
    prompt = prompt_ids(8, 50257, seed=2)
    prompts = [prompt_ids(8, 50257, seed=10 + i) for i in range(args.sequences)]
    one.generate(prompt, max_new_tokens=4, constraint=constraint)  # compile and warm up, outside the timing
    many.generate_batch(prompts[:2], 4, constraint=constraint)

    cases = {
        "batch 1, unconstrained": lambda: batch1_seconds_per_token(one, prompt, n, None),
        "batch 1, JSON Schema": lambda: batch1_seconds_per_token(one, prompt, n, constraint),
        "batch 1, free strings": lambda: batch1_seconds_per_token(one, prompt, n, free),
        "engine, unconstrained": lambda: engine_seconds_per_token(many, prompts, n, None),
        "engine, JSON Schema": lambda: engine_seconds_per_token(many, prompts, n, constraint),
        "engine, free strings": lambda: engine_seconds_per_token(many, prompts, n, free),
    }
    runs: dict[str, list[float]] = {k: [] for k in cases}
    names = list(cases)
    for r in range(args.repeat):
        for name in names[r % len(names):] + names[: r % len(names)]:
            time.sleep(0.3)
            runs[name].append(cases[name]())

    print(f"\n1. Batch 1 on {args.batch_backend} (target <= 1.10x)")
    for k in names[:3]:
        print(f"   {k:<24} {med(runs[k]) * 1e3:8.2f} ms/token")
    for k in names[1:3]:
        print(f"   {k} / unconstrained: {paired(runs[k], runs[names[0]])}")
    print(f"\n2. {args.sequences} sequences through the engine on {args.engine_backend} (target <= 1.15x)")
    for k in names[3:]:
        print(f"   {k:<24} {med(runs[k]) * 1e3:8.2f} ms/token (wall over all new tokens)")
    for k in names[4:]:
        print(f"   {k} / unconstrained: {paired(runs[k], runs[names[3]])}")

    print("\n3. Without the model, microseconds per step (best of 3)")
    rows = capture_rows(one, prompt, n, SCHEMA)
    plain = min(step_us(one, prompt, rows, None) for _ in range(3))
    print(f"   SequenceState.step, unconstrained          {plain:8.0f}")
    for label, schema in (("JSON Schema", SCHEMA), ("free strings", FREE_STRINGS)):
        rows = capture_rows(one, prompt, n, schema)
        step = min(step_us(one, prompt, rows, Constraint.json_schema(schema)) for _ in range(3))
        mask = min(mask_us(one, rows, prompt, schema) for _ in range(3))
        print(f"   SequenceState.step, {label:<22} {step:8.0f}")
        print(f"   the mask alone, {label:<26} {mask:8.0f}")

    print("\n4. Compiling, ms")
    for k, v in compile_ms(str(TOKENIZER_JSON)).items():
        print(f"   {k:<58} {v:8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
