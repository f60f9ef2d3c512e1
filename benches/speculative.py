"""Speculative decoding against plain batch-1 decoding, side by side in ONE run (random weights).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benches/speculative.py
        [--shape 124m|medium|large|xl|tiny] [--backend numpy] [--draft-shape tiny|distilgpt2|124m]
        [--new-tokens 64] [--repeat 3]

Random weights make a real draft model's acceptance meaningless, so what is measured is what does not
depend on it, and the rest is arithmetic:

* Verification cost: the target's forward pass over T = 1 .. K + 1 tokens at a decode position, over
  that of one token (the cost of a round whose drafts are all rejected is V(K + 1) - the plain step's).
* The ceiling: an oracle drafter that proposes exactly the tokens the target will choose (acceptance
  100%, no drafting cost): tok/s over plain decoding, K fixed and adaptive.
* Prompt lookup on a copy-heavy task: random weights do not copy a text that repeats its prompt, but
  their greedy decoding falls into loops, so the copy-heavy prompt is the target's own greedy text
  (`2 x --new-tokens` tokens after the plain prompt), which the continuation repeats as a real model
  repeats a text it is editing or summarising: tok/s and its acceptance.
* Every draft wrong (a drafter that proposes, at each position, a token the target will not choose; K
  fixed): the cost of rounds that are all rejected, measured whole.
* A draft model equal to the target (acceptance 100%, but each draft costs a target step): what the
  drafting machinery gives when every draft is right and drafting is as dear as decoding.
* A small draft model (`--draft-shape`: 2 layers of n_embd 128, or distilgpt2's or GPT-2's shape; the
  same vocabulary): tok/s at the acceptance random weights give it (near 0%), and its cost per drafted
  token relative to a target step, which the arithmetic below uses.
* The arithmetic: expected tokens per round E(a, K) = (1 - a^(K+1)) / (1 - a) at acceptance a, so the
  speed-up is E / (V(K + 1) + K * draft cost); the break-even acceptance solves it for 1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

from inferno.backends.registry import get_backend
from inferno.bench import GPT2_124M, prompt_ids, random_weights
from inferno.generate import generate_tokens
from inferno.models.config import Gpt2Config
from inferno.models.gpt2 import Gpt2
from inferno.sampling import Sampler
from inferno.speculative import DraftModelDrafter, NgramDrafter, Speculation

SHAPES = {"124m": GPT2_124M,
          "medium": Gpt2Config(vocab_size=50257, n_positions=1024, n_embd=1024, n_layer=24, n_head=16),
          "large": Gpt2Config(vocab_size=50257, n_positions=1024, n_embd=1280, n_layer=36, n_head=20),
          "xl": Gpt2Config(vocab_size=50257, n_positions=1024, n_embd=1600, n_layer=48, n_head=25),
          "tiny": Gpt2Config(vocab_size=50257, n_positions=1024, n_embd=128, n_layer=2, n_head=4)}
DRAFTS = {"tiny": SHAPES["tiny"], "124m": GPT2_124M,
          "distilgpt2": Gpt2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=6, n_head=12)}


class Oracle:
    """Drafts the tokens the target is known to choose next (the ceiling: every draft accepted)."""

    def __init__(self, prompt: list[int], future: list[int]) -> None:
        self.text = prompt + future

    def draft(self, context, k):
        n = len(context)
        out = self.text[n : n + k]
        return out, [None] * len(out)


class Wrong(Oracle):
    """Drafts a token the target will not choose at every position (every draft rejected)."""

    def __init__(self, prompt: list[int], future: list[int], vocab: int) -> None:
        super().__init__(prompt, [(t + 1) % vocab for t in future])


def forward_ms(model: Gpt2, t: int, reps: int) -> float:
    """Median ms of a forward pass of t tokens after a 64-token prompt (a decode position)."""
    times = []
    for _ in range(reps):
        cache = model.new_cache(1, 64 + t)
        model.forward(np.asarray([prompt_ids(64, model.config.vocab_size)]), cache)
        start = time.perf_counter()
        model.forward(np.asarray([prompt_ids(t, model.config.vocab_size, seed=1)]), cache, all_logits=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def decode_tok_s(model: Gpt2, prompt: list[int], n: int, speculation: Speculation | None) -> float:
    """Decode tokens per second after the first token (the prefill is not timed)."""
    stream = generate_tokens(model, prompt, n)
    stream.speculation = speculation
    steps = stream.steps()
    next(steps)
    start = time.perf_counter()
    count = sum(1 for _ in steps)
    return count / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="124m")
    ap.add_argument("--backend", default="numpy")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--draft-shape", choices=sorted(DRAFTS), default="tiny")
    ap.add_argument("-k", type=int, default=4, help="drafts per round (fixed K runs)")
    args = ap.parse_args(argv)
    be = get_backend(args.backend)
    config = SHAPES[args.shape]
    target = Gpt2.from_weights(config, random_weights(config), be)
    draft = Gpt2.from_weights(DRAFTS[args.draft_shape], random_weights(DRAFTS[args.draft_shape], seed=1), be)
    vocab, k, n = config.vocab_size, args.k, args.new_tokens
    print(f"shape {args.shape}, backend {args.backend}, draft shape {args.draft_shape}, {n} new tokens, "
          f"K = {k}; {len(os.sched_getaffinity(0))} usable cores, numpy {np.__version__}, load average "
          f"{os.getloadavg()[0]:.2f}")

    one = forward_ms(target, 1, 5)
    verify = {t: forward_ms(target, t, 5) / one for t in range(1, 2 * k + 2)}
    print(f"  target forward of 1 token: {one:.2f} ms; of T tokens, relative: "
          + ", ".join(f"T={t}: {v:.2f}" for t, v in verify.items()))
    draft_cost = forward_ms(draft, 1, 5) / one
    print(f"  draft model forward of 1 token, relative to the target's: {draft_cost:.3f}")

    prompt = prompt_ids(32, vocab, seed=3)
    future = list(generate_tokens(target, prompt, n))
    copy_prompt = prompt + list(generate_tokens(target, prompt, 2 * n))
    runs: dict[str, list[float]] = {}
    accept: dict[str, float] = {}
    for _ in range(args.repeat):  # interleaved: a disturbance hits every variant alike
        plain = decode_tok_s(target, prompt, n, None)
        for name, p, spec in (
            (f"oracle, K={k} fixed", prompt, Speculation(Oracle(prompt, future), k, adaptive=False)),
            (f"oracle, K from {k} adaptive", prompt, Speculation(Oracle(prompt, future), k)),
            ("prompt lookup (copy-heavy: the target's own loop)", copy_prompt, Speculation(_ngram(), k)),
            (f"every draft wrong, K={k} fixed", prompt, Speculation(Wrong(prompt, future, vocab), k,
                                                                  adaptive=False)),
            (f"draft model = the target, K={k} fixed", prompt,
             Speculation(DraftModelDrafter(target, Sampler()), k, adaptive=False)),
            ("draft model (random weights)", prompt, _draft_spec(target, draft, k)),
        ):
            base = plain if p is prompt else decode_tok_s(target, p, n, None)
            runs.setdefault(name, []).append(decode_tok_s(target, p, n, spec) / base)
            accept[name] = spec.stats.acceptance_rate
        runs.setdefault("plain tok/s", []).append(plain)
    print(f"  plain decoding: {statistics.median(runs.pop('plain tok/s')):.2f} tok/s; load average "
          f"{os.getloadavg()[0]:.2f}")
    for name, ratios in runs.items():
        print(f"  {name}: {statistics.median(ratios):.2f}x plain (range {min(ratios):.2f}-"
              f"{max(ratios):.2f}), acceptance {accept[name]:.0%}")
    rejected = verify[k + 1] - 1
    print(f"  a round of K={k} drafts all rejected costs {rejected:.2f} plain steps more than a plain step "
          "(prompt lookup; add K x the draft cost for a draft model)")
    for cost, label in ((0.0, "prompt lookup"), (draft_cost, "the draft model above")):
        v = verify[k + 1] + k * cost
        even = _break_even(k, v)
        estimates = ", ".join(f"{a:.0%}: {_tokens(a, k) / v:.2f}x" for a in (0.35, 0.5, 0.7, 0.9))
        print(f"  {label}: break-even acceptance {even:.0%}; expected speed-up at acceptance {estimates}")
    return 0


def _ngram() -> NgramDrafter:
    return NgramDrafter()


def _draft_spec(target: Gpt2, draft: Gpt2, k: int) -> Speculation:
    return Speculation(DraftModelDrafter(draft, Sampler()), k)


def _tokens(a: float, k: int) -> float:
    return float(k + 1) if a >= 1 else (1 - a ** (k + 1)) / (1 - a)


def _break_even(k: int, cost: float) -> float:
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _tokens(mid, k) < cost else (lo, mid)
    return hi


if __name__ == "__main__":
    sys.exit(main())
