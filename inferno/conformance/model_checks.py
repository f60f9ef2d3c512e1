"""The conformance checks of kind "model": a small random GPT-2 through `inferno.models.gpt2` against the
numpy backend in float64, batched and ragged, and the paths generation and scoring take (the last
position's logits, ``forward(last=n)``, the greedy loop of `inferno.generate`, the batching engine)."""

from __future__ import annotations

from functools import partial

import numpy as np

from inferno.conformance.harness import Check, _Run, dtype_name, register

#: This module's checks, in the order they are added (`inferno.conformance.checks.all_checks` runs them).
CHECKS: list[Check] = []
_add = partial(register, CHECKS)

# ---------------------------------------------------------------------------------------- end to end


def _model(run: _Run, n_embd, n_head, n_layer, vocab, batch, chunks) -> None:
    """A small random GPT-2 through `inferno.models.gpt2`: logits on this backend against the numpy backend
    in float64, for a prefill and the cached decode steps after it."""
    from inferno.backends.numpy_backend import NumpyBackend
    from inferno.models.config import Gpt2Config
    from inferno.models.gpt2 import Gpt2

    total = sum(chunks)
    config = Gpt2Config(vocab_size=vocab, n_positions=total + 3, n_embd=n_embd, n_layer=n_layer,
                        n_head=n_head, bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    weights = _random_weights(run, config)
    ids = run.rng.integers(0, vocab, size=(batch, total))
    oracle = Gpt2.from_weights(config, weights, NumpyBackend("float64"))
    want = oracle.forward(ids, all_logits=True)  # [B, total, V], no cache: one prefill

    model = Gpt2.from_weights(config, weights, run.backend)
    cache = model.new_cache(batch)
    offset = 0
    for t in chunks:
        logits = run.host(model.forward(ids[:, offset : offset + t], cache, all_logits=True), "logits")
        run.expect(logits, want[:, offset : offset + t], factor=10,
                   what=f"logits of positions {offset}..{offset + t - 1}" + (" (cached)" if offset else ""),
                   against="the numpy backend in float64")
        offset += t


def _random_weights(run: _Run, config) -> dict[str, np.ndarray]:
    """Random weights drawn from the check's own generator (not `inferno.testing`'s): the suite's own
    tests pin which decode step each broken kernel is caught at, with these draws."""
    c, v, p = config.n_embd, config.vocab_size, config.n_positions
    w = {"wte.weight": run.normal((v, c), scale=0.5), "wpe.weight": run.normal((p, c), scale=0.1),
         "ln_f.weight": run.normal(c, scale=0.2, loc=1.0), "ln_f.bias": run.normal(c, scale=0.2)}
    for i in range(config.n_layer):
        for ln in ("ln_1", "ln_2"):
            w[f"h.{i}.{ln}.weight"] = run.normal(c, scale=0.2, loc=1.0)
            w[f"h.{i}.{ln}.bias"] = run.normal(c, scale=0.2)
        for name, n_in, n_out in (("attn.c_attn", c, 3 * c), ("attn.c_proj", c, c),
                                  ("mlp.c_fc", c, 4 * c), ("mlp.c_proj", 4 * c, c)):
            w[f"h.{i}.{name}.weight"] = run.normal((n_in, n_out), scale=n_in**-0.5)
            w[f"h.{i}.{name}.bias"] = run.normal(n_out, scale=0.1)
    return w


_add("model", "small", "random GPT-2 C 48, H 3, 2 layers, V 101; B 2: prefill 5, then 3 tokens", _model,
     kind="model", n_embd=48, n_head=3, n_layer=2, vocab=101, batch=2, chunks=[5, 1, 1, 1])
_add("model", "T1-prefill", "random GPT-2 C 40, H 5, 3 layers, V 67; B 1: prefill 1, then 4 tokens",
     _model, kind="model", n_embd=40, n_head=5, n_layer=3, vocab=67, batch=1, chunks=[1, 1, 1, 1, 1])


def _model_ragged(run: _Run, n_embd, n_head, n_layer, vocab, n_positions, n_slots, steps) -> None:
    """Continuous batching through `Gpt2.forward_ragged`: each step is a list of rows (sequence, slot,
    start, end, wants logits), the row feeding tokens start..end-1 of the sequence at offset start. The
    logits of a row equal the batch-1 `Gpt2.forward` of tokens 0..end-1 of its sequence on the numpy
    backend in float64."""
    from inferno.backends.numpy_backend import NumpyBackend
    from inferno.models.config import Gpt2Config
    from inferno.models.gpt2 import Gpt2

    config = Gpt2Config(vocab_size=vocab, n_positions=n_positions, n_embd=n_embd, n_layer=n_layer,
                        n_head=n_head, bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    weights = _random_weights(run, config)
    lengths: dict[str, int] = {}
    for step in steps:
        for seq, _, _, end, _ in step:
            lengths[seq] = max(lengths.get(seq, 0), end)
    tokens = {seq: run.rng.integers(0, vocab, size=n) for seq, n in sorted(lengths.items())}
    oracle = Gpt2.from_weights(config, weights, NumpyBackend("float64"))

    model = Gpt2.from_weights(config, weights, run.backend)
    slots = model.new_slots(n_slots)
    for n, step in enumerate(steps, 1):
        rows = [(tokens[seq][start:end].tolist(), slot, start) for seq, slot, start, end, _ in step]
        logits_for = [keep for *_, keep in step]
        got = run.host(model.forward_ragged(rows, slots, logits_for), f"step {n} logits")
        wanted = [(i, row) for i, row in enumerate(step) if row[4]]
        if got.shape != (len(wanted), vocab):
            run.fail(f"step {n} logits have shape {list(got.shape)}, expected {[len(wanted), vocab]} (the "
                     f"last token of the {len(wanted)} rows of {len(step)} that want logits)")
        for j, (i, (seq, slot, start, end, _)) in enumerate(wanted):
            want = oracle.forward(tokens[seq][None, :end])[0]
            run.expect(got[j], want, factor=10,
                       against="batch-1 forward of the sequence on the numpy backend in float64",
                       what=f"step {n} logits [{j}] (row {i}: sequence {seq}, tokens {start}..{end - 1} "
                       f"at offset {start} in slot {slot})")


# Step 1: A's first prompt chunk (no logits), B, C and D whole prompts. Step 2, rows out of slot order: D
# and B decode one token each, A finishes its prompt, and E (a new sequence) takes C's slot at offset 0.
_add("model", "ragged", "random GPT-2 C 48, H 3, 2 layers, V 101, 5 slots of 16 (forward_ragged): step 1 "
     "prefills A[0:5] (no logits), B[0:4], C[0:6], D[0:12]; step 2 D[12], A[5:9], E[0:2] in C's slot, B[4]",
     _model_ragged, kind="model", n_embd=48, n_head=3, n_layer=2, vocab=101, n_positions=16, n_slots=5,
     steps=[[("A", 2, 0, 5, False), ("B", 0, 0, 4, True), ("C", 3, 0, 6, True), ("D", 1, 0, 12, True)],
            [("D", 1, 12, 13, True), ("A", 2, 5, 9, True), ("E", 3, 0, 2, True), ("B", 0, 4, 5, True)]])


# -------------------------------------------------------------------- what generation and scoring do


def _small_model(run: _Run, n_embd, n_head, n_layer, vocab, n_positions):
    """A random GPT-2 on the backend under test, and the same weights on the numpy backend in float64.

    Its logits are spread as real weights' are (`inferno.testing.spread_logits`): with the plain random
    weights the tied LM head makes greedy decoding repeat the current token whatever the attention
    computed, and a greedy check would see nothing."""
    from inferno.backends.numpy_backend import NumpyBackend
    from inferno.models.config import Gpt2Config
    from inferno.models.gpt2 import Gpt2
    from inferno.testing import spread_logits

    config = Gpt2Config(vocab_size=vocab, n_positions=n_positions, n_embd=n_embd, n_layer=n_layer,
                        n_head=n_head, bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    weights = spread_logits(_random_weights(run, config))
    return Gpt2.from_weights(config, weights, run.backend), Gpt2.from_weights(config, weights,
                                                                             NumpyBackend("float64"))


def _model_last_position(run: _Run, batch, prompt, steps) -> None:
    """What the batch-1 loop does: a prefill that returns the last position's logits only ([B, V]: the
    model slices its hidden states and the LM head gets a 2-D input), then cached decode steps of one
    token each, in a cache of exactly the positions used."""
    total = prompt + steps
    model, oracle = _small_model(run, n_embd=48, n_head=3, n_layer=2, vocab=101, n_positions=total + 4)
    ids = run.rng.integers(0, 101, size=(batch, total))
    want = oracle.forward(ids, all_logits=True)  # [B, total, V]
    cache = model.new_cache(batch, total)
    got = run.host(model.forward(ids[:, :prompt], cache), "prefill logits")
    run.expect(got, want[:, prompt - 1], factor=10, against="the numpy backend in float64",
               what=f"prefill logits [B, V] of position {prompt - 1} (the last of {prompt})")
    for pos in range(prompt, total):
        got = run.host(model.forward(ids[:, pos : pos + 1], cache), f"decode logits at position {pos}")
        run.expect(got, want[:, pos], factor=10, against="the numpy backend in float64",
                   what=f"cached decode logits [B, V] at position {pos}")


_add("model", "last-position", "random GPT-2 C 48, H 3, 2 layers, V 101; B 2: prefill 6 to the last "
     "position's logits [B, V], then 4 cached decode steps, cache of exactly 10", _model_last_position,
     kind="model", batch=2, prompt=6, steps=4)
_add("model", "last-position-T1", "random GPT-2 C 48, H 3, 2 layers, V 101; B 1: prefill 1 to its logits "
     "[1, V], then 5 cached decode steps, cache of exactly 6", _model_last_position,
     kind="model", batch=1, prompt=1, steps=5)


def _model_last_n(run: _Run, batch, length, lasts) -> None:
    """What scoring does: one forward without a cache, logits of the last n positions ([B, n, V])."""
    model, oracle = _small_model(run, n_embd=40, n_head=5, n_layer=2, vocab=67, n_positions=length + 2)
    ids = run.rng.integers(0, 67, size=(batch, length))
    want = oracle.forward(ids, all_logits=True)
    for n in lasts:
        got = run.host(model.forward(ids, last=n), f"logits of the last {n}")
        run.expect(got, want[:, length - n :], factor=10, against="the numpy backend in float64",
                   what=f"forward(ids [{batch}, {length}], last={n}) logits [B, {n}, V]")


_add("model", "last-n", "random GPT-2 C 40, H 5, 2 layers, V 67; ids [2, 9], forward(last=n) for n = 1, 4 "
     "and 9 (scoring's logits)", _model_last_n, kind="model", batch=2, length=9, lasts=[1, 4, 9])


def _near_tie(run: _Run, logits: np.ndarray, got: int, want: int) -> bool:
    """Whether the float64 reference's logits for `got` and `want` are so close that a backend within
    the model checks' tolerance (×10) may rank them either way."""
    scale = float(np.abs(logits).max())
    slack = 10 * (run.tol.rtol * abs(float(logits[want])) + run.tol.atol * scale)
    return float(logits[want]) - float(logits[got]) <= 2 * slack


def _same_greedy(run: _Run, oracle, prompt: list[int], got: list[int], want: list[int], what: str) -> None:
    """`got` must be the reference's greedy ids `want`, up to the first near-tie (where either is right
    and the sequences may part)."""
    if len(got) != len(want):
        run.fail(f"{what}: {len(got)} new tokens, expected {len(want)} ({got} vs {want})")
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g == w:
            continue
        logits = oracle.forward(np.asarray([prompt + want[:i]]), all_logits=True)[0, -1]
        if _near_tie(run, logits, g, w):
            return
        run.fail(f"{what}: new token {i} is id {g}, expected {w} (greedy on the numpy backend in float64, "
                 f"whose logit for {g} is {float(logits[w] - logits[g]):.3g} below {w}'s: not a near-tie "
                 f"within {dtype_name(run.backend.dtype)} tolerance; ids so far {got[: i + 1]}, expected "
                 f"{want[: i + 1]})")


def _model_greedy(run: _Run, prompts, new_tokens) -> None:
    """The batch-1 generation loop (`inferno.generate`), greedy: the ids equal the reference's."""
    from inferno.generate import generate_tokens

    model, oracle = _small_model(run, n_embd=48, n_head=3, n_layer=2, vocab=101, n_positions=32)
    for n in prompts:
        prompt = run.rng.integers(0, 101, size=n).tolist()
        want = list(generate_tokens(oracle, prompt, new_tokens))
        got = list(generate_tokens(model, prompt, new_tokens))
        _same_greedy(run, oracle, prompt, got, want, f"greedy generation from a prompt of {n}")


_add("model", "greedy", "random GPT-2 C 48, H 3, 2 layers, V 101: greedy generation (inferno.generate) of 8 "
     "tokens from prompts of 1, 5 and 11 ids equals the numpy backend's in float64", _model_greedy,
     kind="model", prompts=[1, 5, 11], new_tokens=8)


def _model_engine(run: _Run, slots, prefill_chunk, requests, group) -> None:
    """The continuous-batching engine (`inferno.engine`), greedy, stepped by hand: sequences of different
    lengths share each step (prompt chunks beside decode rows), wait for a slot and reuse one another's;
    a group of one prompt copies its KV cache to its other slots. Every sequence's ids equal the
    reference's batch-1 greedy ids."""
    from inferno.engine import Engine
    from inferno.generate import generate_tokens
    from inferno.options import GenerationOptions

    model, oracle = _small_model(run, n_embd=48, n_head=3, n_layer=2, vocab=101, n_positions=32)
    engine = Engine(model, slots=slots, prefill_chunk=prefill_chunk, max_queue=None, autostart=False)
    submitted = []
    try:
        for n, budget in requests:
            prompt = run.rng.integers(0, 101, size=n).tolist()
            submitted.append((prompt, budget, engine.submit(prompt, budget)))
        n, budget, copies = group
        prompt = run.rng.integers(0, 101, size=n).tolist()
        for h in engine.submit_many(prompt, budget, [GenerationOptions()] * copies):
            submitted.append((prompt, budget, h))
        for _ in range(1000):  # far more steps than these requests take: a stuck engine fails
            if not engine.step():
                break
    finally:
        engine.close()
    for i, (prompt, budget, h) in enumerate(submitted):
        if h.error is not None:
            raise h.error
        if not h.done:
            run.fail(f"sequence {i} (prompt of {len(prompt)}) did not finish")
        want = list(generate_tokens(oracle, prompt, budget))
        _same_greedy(run, oracle, prompt, list(h.state.ids), want,
                     f"engine sequence {i} (prompt of {len(prompt)}, {budget} new tokens)")


_add("model", "engine", "random GPT-2 C 48, H 3, 2 layers, V 101, engine of 2 slots, prefill chunks of 3: "
     "greedy sequences from prompts of 7, 2 and 4 ids (6, 5, 3 new tokens), then 2 of one prompt of 5 "
     "sharing its prefill (4 new tokens), equal the numpy backend's batch-1 greedy ids in float64",
     _model_engine, kind="model", slots=2, prefill_chunk=3, requests=[(7, 6), (2, 5), (4, 3)],
     group=(5, 4, 2))
