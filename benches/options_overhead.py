"""What the generation options and scoring cost, against plain decode and prefill, side by side in ONE run.

    python benches/options_overhead.py [--repeat 5] [--new-tokens 64] [--backend numpy] [--blas-threads 1]

Random weights of the GPT-2 124M shape (speed does not depend on the values) and the real tokenizer
(gpt2/tokenizer.json), called through `inferno.api.Pipeline` as a user calls it. Every case of a table is
measured in every repeat, in an order rotated from repeat to repeat, so that a noisy neighbour slows all
cases alike; tables show medians (and the best repeat where a case is one long call: a neighbour only adds
time), each ratio is the median of the per-repeat ratios with their range. Nothing is asserted: the
targets are printed next to the measurements.

1. Decode with options (target: all options >= 0.95x plain, greedy and sampled). An 8-token prompt,
   ``stop_at_eos=False``, `--new-tokens` + 1 new tokens; the first one (the prefill) is not timed, so the
   figure is tok/s of the cached decode steps only. The streams of all ten cases are open at once and
   advanced in turn, one token each (after a 0.3 s rest at the start of each repeat: OpenBLAS's workers
   spin after a call), and each step is timed on its own: cases compared are never more than a few
   decode steps apart, which a shared machine's load changes little in. Ratios to plain decode with the
   same sampler: per repeat, and per step (the median over all steps of plain's time over this case's
   time at the same token index of the same round). Options: logprobs=5; four stop strings that do not
   occur, so every run spends its whole budget (a run that stops early is reported); repetition 1.1,
   presence 0.5, frequency 0.5 and a logit_bias of 4 ids; and all of them at once. Greedy, and sampled
   (temperature 0.8, top_k 40, seeded).
2. What each option itself costs: `SequenceState.step` (penalties, sampler, logprobs, detokenizing, stop
   matching), microseconds per step, timed inside the decode streams above (caches as the forward leaves
   them), and over logits rows captured from a real decode, one step after another, without the model
   (best of 3 passes in each repeat: free of the forward's noise, but with warm caches).
3. Scoring vs prefill (target: score >= 0.9x prefill, in tokens of text per second). ``pipe.score(ids)``
   of 1,000 random ids (one window of the 1,024 context) against ``model.forward(ids)`` of the same
   1,000 ids (last position's logits, as generation prefills), and the split of the scoring time: the
   forward with the logits of all 999 predicting positions (``last=999``), the LM head alone on 999 rows,
   and the float64 log-softmax/gather that `inferno.scoring` runs on those logits; each case is one call,
   after a 0.3 s rest.
4. Other ways to compute that log-softmax/gather, on the same logits: other row chunks, the log-sum-exp
   only (the log-probability of the target, never the whole log-softmax row), float32 exponentials summed
   in float64; each with its largest difference from what scoring.py computes now, and the score/prefill
   ratio it would give (the measured score time with the log-softmax part swapped for it).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from inferno import scoring
from inferno.api import Pipeline
from inferno.backends.registry import get_backend
from inferno.bench import GPT2_124M, prompt_ids, random_weights, weights_in_layout
from inferno.models.gpt2 import Gpt2
from inferno.options import GenerationOptions, SequenceState, logsumexp
from inferno.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
PROMPT, SCORE_TOKENS = 8, 1000

STOP = ("\n\n\n", "###", "<END>", "Q:")
LOGIT_BIAS = {50256: -100.0, 198: -5.0, 13: 2.0, 262: 1.5}
PENALTIES = {"repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": 0.5,
             "logit_bias": LOGIT_BIAS}
OPTIONS = {
    "plain": {},
    "logprobs=5": {"logprobs": 5},
    "stop (4 strings)": {"stop": STOP},
    "penalties + logit_bias": PENALTIES,
    "all options": {"logprobs": 5, "stop": STOP, **PENALTIES},
}
SAMPLERS = {"greedy": {}, "sampled": {"temperature": 0.8, "top_k": 40, "seed": 1}}


def variants() -> dict[tuple[str, str], GenerationOptions]:
    return {(s, o): GenerationOptions(**skw, **okw)
            for s, skw in SAMPLERS.items() for o, okw in OPTIONS.items()}


# ------------------------------------------------------------------------------------------ timing


def capture_rows(model: Gpt2, prompt: list[int], n: int, limit: int) -> list[np.ndarray]:
    """The host logits rows of `n` greedy decode steps (what `SequenceState.step` is given)."""
    be = model.backend
    cache = model.new_cache(1, len(prompt) + n)
    logits = model.forward(np.asarray([prompt]), cache)
    rows = []
    for _ in range(n):
        rows.append(np.array(be.to_numpy(logits)[0, :limit]))
        logits = model.forward(np.asarray([[int(np.argmax(rows[-1]))]]), cache)
    return rows


def step_seconds(tokenizer: Tokenizer, prompt: list[int], rows: list[np.ndarray],
                 options: GenerationOptions) -> tuple[float, int]:
    """(seconds per `SequenceState.step`, steps run) over `rows`, with text tracking as the pipeline does."""
    state = SequenceState(options, prompt, tokenizer.incremental_decoder())
    n = 0
    start = time.perf_counter()
    for i, row in enumerate(rows):
        n += 1
        if state.step(row, last=i + 1 == len(rows)).finish_reason == "stop":
            break
    return (time.perf_counter() - start) / n, n


def timed_method(method: Callable, into: list[float]) -> Callable:
    """`method`, appending the seconds of each call to `into`."""
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        out = method(*args, **kwargs)
        into.append(time.perf_counter() - start)
        return out

    return wrapper


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


# ------------------------------------------------------------------ the log-softmax/gather, other ways


def lsm_as_is(logits: np.ndarray, targets: np.ndarray, rows: int) -> np.ndarray:
    """What `inferno.scoring.score_ids` does per window (without top_logprobs), with `rows` per chunk."""
    out: list[float] = []
    for r in range(0, len(targets), rows):
        chunk, tgt = logits[r : r + rows], targets[r : r + rows]
        out.extend((chunk[np.arange(len(tgt)), tgt].astype(np.float64) - logsumexp(chunk)).tolist())
    return np.asarray(out)


def lse_float64(logits: np.ndarray, targets: np.ndarray, rows: int) -> np.ndarray:
    """log p(target) = z[target] - (max + log sum exp(z - max)), in float64 in one reused buffer: the same
    values as `lsm_as_is` (same operations, same order), without the whole log-softmax row."""
    buf = np.empty((rows, logits.shape[1]), dtype=np.float64)
    out = np.empty(len(targets))
    for r in range(0, len(targets), rows):
        chunk = logits[r : r + rows]
        n = chunk.shape[0]
        z = buf[:n]
        m = chunk.max(axis=1).astype(np.float64)  # exact in float32
        np.subtract(chunk, m[:, None], out=z)
        np.exp(z, out=z)
        out[r : r + n] = chunk[np.arange(n), targets[r : r + n]] - (m + np.log(z.sum(axis=1)))
    return out


def lse_float32_exp(logits: np.ndarray, targets: np.ndarray, rows: int) -> np.ndarray:
    """As `lse_float64`, but z - max and its exponential in float32, summed in float64."""
    buf = np.empty((rows, logits.shape[1]), dtype=np.float32)
    out = np.empty(len(targets))
    for r in range(0, len(targets), rows):
        chunk = logits[r : r + rows]
        n = chunk.shape[0]
        z = buf[:n]
        m = chunk.max(axis=1)
        np.subtract(chunk, m[:, None], out=z)
        np.exp(z, out=z)
        lse = m.astype(np.float64) + np.log(z.sum(axis=1, dtype=np.float64))
        out[r : r + n] = chunk[np.arange(n), targets[r : r + n]].astype(np.float64) - lse
    return out


SMALL_CHUNK = 8  # the row chunk also measured end to end, in a real pipe.score (see the report)
NOW = f"scoring.py now: logsumexp, {scoring.ROWS_PER_CHUNK}-row chunks"
LSM_VARIANTS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    NOW: lambda z, t: lsm_as_is(z, t, scoring.ROWS_PER_CHUNK),
    f"logsumexp, {SMALL_CHUNK}-row chunks": lambda z, t: lsm_as_is(z, t, SMALL_CHUNK),
    "logsumexp, 16-row chunks": lambda z, t: lsm_as_is(z, t, 16),
    "logsumexp, 64-row chunks": lambda z, t: lsm_as_is(z, t, 64),
    f"log-sum-exp in one reused buffer, {SMALL_CHUNK}-row chunks":
        lambda z, t: lse_float64(z, t, SMALL_CHUNK),
    f"log-sum-exp only, float32 exp + float64 sum, {SMALL_CHUNK}-row chunks":
        lambda z, t: lse_float32_exp(z, t, SMALL_CHUNK),
}


# ------------------------------------------------------------------------------------------ output


def med(values: list[float]) -> float:
    return statistics.median(values)


def spread(values: list[float]) -> str:
    return f"±{(max(values) - min(values)) / med(values) * 100:.0f}%"


def paired(num: list[float], den: list[float]) -> str:
    """The median of the per-repeat ratios num/den, with their range."""
    r = [a / b for a, b in zip(num, den, strict=True)]
    return f"{med(r):.3f}x ({min(r):.3f}-{max(r):.3f})"


def paired_median(num: list[float], den: list[float]) -> float:
    return med([a / b for a, b in zip(num, den, strict=True)])


def table(head: list[str], rows: list[list[str]]) -> None:
    print("| " + " | ".join(head) + " |")
    print("| " + " | ".join(["---"] + ["--:"] * (len(head) - 1)) + " |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def environment(backend: str) -> str:
    try:
        from threadpoolctl import threadpool_info

        blas = "; ".join(f"{i.get('internal_api')} {i.get('version')} ({i.get('num_threads')} threads)"
                         for i in threadpool_info() if i.get("user_api") == "blas")
    except ImportError:
        blas = "unknown"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"backend {backend}; {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
            f"{cores} usable; numpy {np.__version__}, BLAS {blas or 'unknown'}")


# --------------------------------------------------------------------------------------------- run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5, help="interleaved repeats (default 5)")
    p.add_argument("--new-tokens", type=int, default=64,
                   help="timed decode steps per run, after the untimed first token (default 64)")
    p.add_argument("--backend", default="numpy", help="registered backend name or spec (default numpy)")
    p.add_argument("--pause", type=float, default=0.3, help="seconds of rest before each timed call")
    p.add_argument("--blas-threads", type=int, default=None,
                   help="limit BLAS to N threads for the whole run (default: as configured). On a machine "
                   "shared with other busy processes, 1 gives far steadier figures: OpenBLAS's threads wait "
                   "on each other, and one that is descheduled stalls the rest")
    args = p.parse_args(argv)
    if args.repeat < 1 or not 1 <= args.new_tokens <= GPT2_124M.n_positions - PROMPT - 1:
        p.error(f"--repeat must be >= 1 and --new-tokens in [1, {GPT2_124M.n_positions - PROMPT - 1}]")

    with contextlib.ExitStack() as stack:
        if args.blas_threads is not None:
            from threadpoolctl import threadpool_limits

            stack.enter_context(threadpool_limits(limits=args.blas_threads, user_api="blas"))
        return run(args, argv)


def run(args, argv: list[str] | None) -> int:
    print(f"# python benches/options_overhead.py {' '.join(sys.argv[1:] if argv is None else argv)}".rstrip())
    print(f"# {environment(args.backend)}")
    started = time.perf_counter()
    be = get_backend(args.backend)
    try:
        model = Gpt2.from_weights(GPT2_124M, weights_in_layout(random_weights(GPT2_124M), be, {}), be)
        pipe = Pipeline(model, Tokenizer.from_file(ROOT / "inferno" / "data" / "gpt2" / "tokenizer.json"))
        load_before = os.getloadavg()[0]
        decode, per_step, in_loop, steps, short = measure_decode(pipe, args)
        score, lsm, lsm_diff = measure_scoring(pipe, args)
        load_after = os.getloadavg()[0]
    finally:
        be.close()
    print(f"# load average (1 min) before {load_before:.1f}, after {load_after:.1f}; {args.repeat} repeats "
          f"in {time.perf_counter() - started:.0f} s")
    report_decode(decode, per_step, in_loop, steps, short, args)
    report_scoring(score, lsm, lsm_diff)
    return 0


def measure_decode(pipe: Pipeline, args) -> tuple[dict, dict, dict, dict, dict]:
    """Every variant's stream advanced one token at a time, round robin, each step timed on its own."""
    cases = variants()
    keys = list(cases)
    prompt = prompt_ids(PROMPT, GPT2_124M.vocab_size, seed=1)
    for options in cases.values():  # warm-up: first calls allocate and page the weights in
        for _ in pipe.tokens(prompt, 3, stop_at_eos=False, options=options).steps():
            pass
    rows = capture_rows(pipe.model, prompt, args.new_tokens, pipe.sample_limit)
    decode: dict = {key: [] for key in keys}  # seconds per token, one value per repeat
    per_step: dict = {key: [] for key in keys}  # per step: plain (same sampler) time / this time
    in_loop: dict = {key: [] for key in keys}  # seconds per SequenceState.step in the decode, per repeat
    steps: dict = {key: [] for key in keys}  # seconds per SequenceState.step on captured rows, per repeat
    short: dict = {}  # key -> steps run, where a stop fired before the budget was spent
    for rep in range(args.repeat):
        print(f"\r\x1b[Kdecode, repeat {rep + 1}/{args.repeat}", end="", file=sys.stderr, flush=True)
        order = keys[rep % len(keys):] + keys[: rep % len(keys)]
        streams, step_times = {}, {}
        for key in order:
            stream = pipe.tokens(prompt, args.new_tokens + 1, stop_at_eos=False, options=cases[key])
            stream.state.step = timed_method(stream.state.step, step_times.setdefault(key, []))
            streams[key] = stream.steps()
        for key in order:
            next(streams[key])  # the prefill and the first token: not timed
        time.sleep(args.pause)
        times: dict = {key: [] for key in order}
        done: set = set()
        for i in range(args.new_tokens):
            for key in order:
                if key in done:
                    continue
                start = time.perf_counter()
                try:
                    next(streams[key])
                except StopIteration:
                    done.add(key)
                    short[key] = i
                    continue
                times[key].append(time.perf_counter() - start)
        for key in keys:
            decode[key].append(statistics.fmean(times[key]) if times[key] else float("nan"))
            in_loop[key].append(med(step_times[key][1:]) if len(step_times[key]) > 1 else float("nan"))
            base = times[(key[0], "plain")]
            per_step[key].extend(b / t for b, t in zip(base, times[key], strict=False))
        for key in order:  # no BLAS here, so no rest; the best of 3 passes, as a neighbour only adds time
            seconds, n = min(step_seconds(pipe.tokenizer, prompt, rows, cases[key]) for _ in range(3))
            steps[key].append(seconds)
            if n != len(rows):
                short[("SequenceState.step", *key)] = n
    print("\r\x1b[K", end="", file=sys.stderr, flush=True)
    return decode, per_step, in_loop, steps, short


def measure_scoring(pipe: Pipeline, args) -> tuple[dict, dict, dict]:
    model, be = pipe.model, pipe.backend
    ids = prompt_ids(SCORE_TOKENS, GPT2_124M.vocab_size, seed=2)
    targets = np.asarray(ids[1:])
    hidden = be.from_numpy(np.random.default_rng(3).standard_normal((1, len(ids) - 1, GPT2_124M.n_embd),
                                                                    dtype=np.float32))
    held: dict = {}

    def score(rows: int | None = None) -> None:
        """pipe.score(ids) with scoring.ROWS_PER_CHUNK = rows (None: as it is), timing its forward inside
        and keeping the logits that forward made."""
        saved = scoring.ROWS_PER_CHUNK
        spent: list[float] = []

        def forward(*a, **kw):
            start = time.perf_counter()
            out = Gpt2.forward(model, *a, **kw)
            spent.append(time.perf_counter() - start)
            if rows is None:
                held["logits"] = be.to_numpy(out)[0, :, : pipe.sample_limit]
            return out

        scoring.ROWS_PER_CHUNK = saved if rows is None else rows  # read by score_ids at each call
        model.forward = forward  # an instance attribute over the method, for this call only
        try:
            held[f"logprobs {rows}"] = np.asarray(pipe.score(ids).logprobs[1:])
        finally:
            scoring.ROWS_PER_CHUNK = saved
            del model.forward
        held[f"forward {rows}"] = sum(spent)

    cases: dict[str, Callable[[], object]] = {
        "prefill": lambda: be.to_numpy(model.forward(np.asarray([ids]))),
        "score": score,
        "lm_head": lambda: be.to_numpy(be.lm_head(hidden, model.lm_head_w)),
        f"score_{SMALL_CHUNK}": lambda: score(SMALL_CHUNK),
    }
    small = ids[:64]  # warm-up
    be.to_numpy(model.forward(np.asarray([small])))
    pipe.score(small)
    be.to_numpy(be.lm_head(hidden[:, :64], model.lm_head_w))

    times: dict[str, list[float]] = {name: [] for name in [*cases, *LSM_VARIANTS]}
    times.update({"score forward": [], f"score_{SMALL_CHUNK} forward": []})
    diffs: dict[str, float] = {name: 0.0 for name in [*LSM_VARIANTS, f"score_{SMALL_CHUNK}"]}
    keys = list(cases)
    for rep in range(args.repeat):
        order = keys[rep % len(keys):] + keys[: rep % len(keys)]
        for name in order:
            print(f"\r\x1b[Kscoring, repeat {rep + 1}/{args.repeat}: {name}", end="", file=sys.stderr,
                  flush=True)
            time.sleep(args.pause)
            times[name].append(timed(cases[name])[0])
        times["score forward"].append(held.pop("forward None"))
        times[f"score_{SMALL_CHUNK} forward"].append(held.pop(f"forward {SMALL_CHUNK}"))
        diffs[f"score_{SMALL_CHUNK}"] = max(diffs[f"score_{SMALL_CHUNK}"], float(np.abs(
            held.pop(f"logprobs {SMALL_CHUNK}") - held.pop("logprobs None")).max()))
        logits = held["logits"]
        lsm_keys = list(LSM_VARIANTS)
        for name in lsm_keys[rep % len(lsm_keys):] + lsm_keys[: rep % len(lsm_keys)]:
            fn = LSM_VARIANTS[name]
            fn(logits, targets)  # untimed: every variant is timed with the allocator already warm
            time.sleep(args.pause)
            seconds, out = timed(lambda f=fn, z=logits: f(z, targets))
            times[name].append(seconds)
            held[name] = out
        ref = held[NOW]
        for name in LSM_VARIANTS:
            diffs[name] = max(diffs[name], float(np.abs(held.pop(name) - ref).max()))
    held.clear()
    print("\r\x1b[K", end="", file=sys.stderr, flush=True)
    return {k: times[k] for k in times if k not in LSM_VARIANTS}, {k: times[k] for k in LSM_VARIANTS}, diffs


def report_decode(decode: dict, per_step: dict, in_loop: dict, steps: dict, short: dict, args) -> None:
    print(f"\n## (a) decode with options: {args.new_tokens} decode steps after the first token "
          f"({PROMPT}-token prompt, 124M shape, stop_at_eos=False), the {len(decode)} streams advanced in "
          "turn, token by token")
    print("Ratios are tok/s over plain decode: per repeat (median and range of the repeats' ratios), and per "
          "step (median of the ratios of steps taken back to back). Target: all options >= 0.95x.\n")
    rows = []
    for (sampler, option), values in decode.items():
        base = decode[(sampler, "plain")]
        same = option == "plain"
        rows.append([f"{sampler}, {option}", f"{1 / med(values):.1f}", f"{med(values) * 1e3:.2f}",
                     spread(values), "1" if same else paired(base, values),
                     "1" if same else f"{med(per_step[(sampler, option)]):.3f}x",
                     paired(decode[("greedy", "plain")], values)])
    table(["case", "tok/s (median)", "ms/token", "spread", "vs plain, same sampler: per repeat",
           "per step", "vs plain greedy"], rows)
    print()
    for sampler in SAMPLERS:
        r = paired_median(decode[(sampler, "plain")], decode[(sampler, "all options")])
        r_step = med(per_step[(sampler, "all options")])
        note = "" if (r >= 0.95) == (r_step >= 0.95) else " (the per-repeat figure disagrees: a noisy repeat)"
        print(f"target (a), {sampler}: all options at {r_step:.3f}x plain per step (the steadier figure), "
              f"{r:.3f}x per repeat: {'meets' if r_step >= 0.95 else 'BELOW'} >= 0.95x{note}")
    if short:
        print(f"\nnote: a stop fired before the budget was spent (steps run): {short}")

    print("\n## (a) the options alone: `SequenceState.step`, µs per step (medians)")
    print("In the decode loop: timed inside the streams measured above (every step but the first), caches "
          "as the forward leaves them; on captured rows: over the logits rows of a real decode, one step "
          "after another (best of 3 passes), caches warm. Added: over plain with the same sampler; share: "
          "of the plain greedy decode step above; implied: the decode ratio the added in-loop time makes.\n")
    plain_greedy = med(decode[("greedy", "plain")])
    rows = []
    for (sampler, option), values in in_loop.items():
        added = med([a - b for a, b in zip(values, in_loop[(sampler, "plain")], strict=True)])
        rows_values = steps[(sampler, option)]
        added_rows = med([a - b for a, b in zip(rows_values, steps[(sampler, "plain")], strict=True)])
        rows.append([f"{sampler}, {option}", f"{med(values) * 1e6:.0f}", f"{added * 1e6:+.0f}",
                     f"{med(values) / plain_greedy * 100:.2f}%",
                     f"{plain_greedy / (plain_greedy + max(added, 0.0)):.3f}x",
                     f"{med(rows_values) * 1e6:.0f}", f"{added_rows * 1e6:+.0f}"])
    table(["case", "in the decode loop", "added", "share of a decode step", "implied ratio",
           "on captured rows", "added"], rows)


def report_scoring(score: dict, lsm: dict, diffs: dict) -> None:
    c, n, k = GPT2_124M, SCORE_TOKENS, SMALL_CHUNK
    print(f"\n## (b) scoring {n} tokens vs a {n}-token prefill (124M shape)")
    print("Target: score >= 0.9x prefill in tokens of text per second, i.e. prefill time / score time. "
          "Best: the fastest repeat (a neighbour only adds time); ratios: median and range of the "
          "per-repeat ratios, and the ratio of the bests. A score call's forward is timed inside the "
          "call; the rest of the call is the log-softmax/gather and what goes with it.\n")
    p, t, t_small = score["prefill"], score["score"], score[f"score_{k}"]
    fwd = score["score forward"]
    rest = [a - b for a, b in zip(t, fwd, strict=True)]
    rest_small = [a - b for a, b in zip(t_small, score[f"score_{k} forward"], strict=True)]
    labelled = [
        (f"prefill {n}: model.forward(ids), last position's logits", p, True),
        (f"score {n}: pipe.score(ids), as shipped (ROWS_PER_CHUNK = {scoring.ROWS_PER_CHUNK})", t, True),
        (f"  its forward: {n - 1} positions, all logits (last={n - 1})", fwd, True),
        (f"    the LM head alone, {n - 1}x{c.n_embd} @ {c.n_embd}x{c.vocab_size} (a separate call)",
         score["lm_head"], False),
        ("  the rest of the call: float64 log-softmax + gather", rest, False),
        ("    the same log-softmax + gather alone, allocator warm (a separate call)", lsm[NOW], False),
        (f"score {n} with scoring.ROWS_PER_CHUNK = {k} (set by this script)", t_small, True),
        ("  the rest of the call: float64 log-softmax + gather", rest_small, False),
    ]
    rows = []
    for label, values, rate in labelled:
        rows.append([label, f"{med(values) * 1e3:.0f}", f"{min(values) * 1e3:.0f}", spread(values),
                     f"{n / med(values):.0f}" if rate else "", f"{med(values) / med(t) * 100:.0f}%",
                     paired(p, values), f"{min(p) / min(values):.3f}x"])
    table(["case", "ms (median)", "ms (best)", "spread", "tok/s", "share of score (medians)",
           "prefill time / this", "same, of the bests"], rows)

    r, r_best = paired_median(p, t), min(p) / min(t)
    r_small = paired_median(p, t_small)
    ceiling, ceiling_best = paired_median(p, fwd), min(p) / min(fwd)
    d = c.n_embd
    body = 12 * d * d  # multiply-adds per token per layer: c_attn 3d², c_proj d², MLP 8d²
    attn = 2 * n * n * d  # per layer: q @ k^T and p @ v over the whole square (the causal mask is applied)
    prefill_macs = ((c.n_layer - 1) * n * body + n * 4 * d * d + 8 * d * d  # last layer: MLP of one row
                    + c.n_layer * attn + d * c.vocab_size)
    score_macs = c.n_layer * ((n - 1) * body + 2 * (n - 1) ** 2 * d) + (n - 1) * d * c.vocab_size
    if (r >= 0.9) == (r_best >= 0.9):
        verdict = "meets >= 0.9x" if r >= 0.9 else "BELOW >= 0.9x"
    else:
        verdict = ("UNSURE whether >= 0.9x: the median and the bests disagree, a neighbour's load hit some "
                   "repeats (see the spreads); rerun, or use --blas-threads 1")
    print(f"\ntarget (b): score at {r:.3f}x prefill (median of the repeats' ratios; {r_best:.3f}x of the "
          f"bests): {verdict}. With ROWS_PER_CHUNK = {k}: {r_small:.3f}x (median; "
          f"{min(p) / min(t_small):.3f}x of the bests; the same logprobs within {diffs[f'score_{k}']:.1e}).")
    print(f"The scoring forward alone is {ceiling:.3f}x prefill (median), {ceiling_best:.3f}x (bests): the "
          f"ceiling for score/prefill with a free log-softmax. Matmul work: prefill "
          f"{2 * prefill_macs / 1e9:.0f} GFLOP (the last layer's MLP and the LM head on one row only), score "
          f"{2 * score_macs / 1e9:.0f} GFLOP (the LM head alone is "
          f"{2 * (n - 1) * d * c.vocab_size / 1e9:.0f}): {prefill_macs / score_macs:.2f}x at an equal "
          "FLOP rate.")
    print(f"In a real call the {scoring.ROWS_PER_CHUNK}-row chunks cost more than alone: their float64 "
          f"temporaries ({scoring.ROWS_PER_CHUNK * c.vocab_size * 8 / 1e6:.0f} MB each) are above glibc's "
          "mmap threshold as the forward leaves it, so they come as fresh pages (faulted in and zeroed by "
          f"the kernel); {k}-row chunks ({k * c.vocab_size * 8 / 1e6:.1f} MB) reuse freed memory.")

    print(f"\n## (b) the log-softmax/gather of {n - 1} rows of {c.vocab_size} logits, other ways (the logits "
          "of the score call's forward, interleaved, allocator warm)")
    print(f"Projected score/prefill: each repeat's score call with ROWS_PER_CHUNK = {k}, its log-softmax "
          f"({k}-row chunks, alone) swapped for this one.\n")
    rows = []
    small = f"logsumexp, {k}-row chunks"
    for name, values in lsm.items():
        projected = [pp / (ts - a + v) for pp, ts, a, v in zip(p, t_small, lsm[small], values, strict=True)]
        rows.append([name, f"{med(values) * 1e3:.1f}", f"{min(values) * 1e3:.1f}", spread(values),
                     paired(lsm[NOW], values), f"{diffs[name]:.1e}",
                     f"{med(projected):.3f}x" if name != NOW else "(see above)"])
    table(["log-softmax + gather", "ms (median)", "ms (best)", "spread", "speed-up over now",
           "max |Δ logprob|", "projected score/prefill"], rows)


if __name__ == "__main__":
    sys.exit(main())
