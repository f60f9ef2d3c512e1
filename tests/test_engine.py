"""The continuous-batching engine (inferno/engine.py): every sequence gets the tokens it would get alone
(HF goldens for greedy, its own batch-1 run for sampling), whether it runs alone, with others or joins
mid-way; slots are reused and never leak; cancellation, the bounded queue and failures stay local.

Batched and batch-1 logits differ by float32 rounding (GEMM vs GEMV), which could only flip a token at a
near-tie; the models and seeds here have none, so the tests ask for exact equality."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import warnings

import numpy as np
import pytest
from backend_helpers import rows_holding_fail
from goldens import golden_model, write_model_dir

import inferno
from inferno.api import Pipeline
from inferno.engine import Engine, EngineClosedError, EngineError, QueueFullError
from inferno.generate import ContextLengthError, GenerationError
from inferno.models.gpt2 import Gpt2, NonFiniteLogitsError, slot_bytes
from inferno.models.resolve import shipped_gpt2_file
from inferno.options import GenerationOptions, OptionError

NEAR_TIE = 1e-4


@pytest.fixture(scope="module")
def greedy_golden(tmp_path_factory):
    config, sd, meta = golden_model("greedy")
    directory = write_model_dir(tmp_path_factory.mktemp("engine-model"), config, sd)
    return directory, sd, meta


@pytest.fixture(scope="module")
def pipe(greedy_golden) -> Pipeline:
    return inferno.load(greedy_golden[0], "numpy", download=False)


def test_twelve_prompts_together_match_transformers(greedy_golden, backend):
    # The committed goldens: HF transformers' float64 greedy ids for each prompt alone.
    directory, sd, meta = greedy_golden
    config = inferno.Gpt2Config.from_file(directory / "config.json")
    tokenizer = inferno.Tokenizer.from_file(directory / "tokenizer.json")
    pipe = Pipeline(Gpt2.from_weights(config, sd, backend), tokenizer)
    cases = meta["cases"]
    n = len(cases[0]["greedy_ids"])
    results = pipe.generate_batch([c["prompt"] for c in cases], max_new_tokens=n, stop_at_eos=False,
                                  prefill_chunk=16)
    compared = 0
    for case, result in zip(cases, results, strict=True):
        for step, (ours, ref, gap) in enumerate(zip(result.ids, case["greedy_ids"], case["relative_gaps"],
                                                     strict=True)):
            if gap < NEAR_TIE:
                break
            assert ours == ref, f"{case['prompt']!r} step {step}: ours {ours}, transformers {ref}"
            compared += 1
    assert len(cases) == 12 and compared >= 10 * 16


def test_batch_equals_solo_with_every_option(pipe):
    prompts = ["The quick brown fox", "Hello", "Once upon a time in a land far away", "A",
               "import numpy as np\n", "word " * 40]
    per_prompt = [
        {"seed": 1, "temperature": 1.0, "top_k": 40},
        {"seed": 2, "temperature": 0.7, "top_p": 0.9, "repetition_penalty": 1.3},
        {"presence_penalty": 0.5, "frequency_penalty": 0.5, "logit_bias": {13: 4.0}},
        {"seed": 3, "temperature": 1.2, "logprobs": 3},
        {"max_new_tokens": 5},
        {"seed": 4, "temperature": 1.0, "stop": ["e"], "logprobs": 1},
    ]
    solo = [pipe.generate(p, **{"max_new_tokens": 20, "stop_at_eos": False, **o})
            for p, o in zip(prompts, per_prompt, strict=True)]
    batch = pipe.generate_batch(prompts, max_new_tokens=20, stop_at_eos=False, per_prompt=per_prompt,
                                prefill_chunk=7)
    for a, b in zip(solo, batch, strict=True):
        assert (a.ids, a.text, a.finish_reason) == (b.ids, b.text, b.finish_reason)
        assert a.stop_reason == b.stop_reason
        assert (a.logprobs is None) == (b.logprobs is None)
        if a.logprobs:
            np.testing.assert_allclose([x.logprob for x in a.logprobs], [x.logprob for x in b.logprobs],
                                       atol=1e-5)
    assert batch[5].finish_reason == "stop" and batch[4].new_tokens == 5


def test_more_prompts_than_slots_reuse_slots(pipe):
    prompts = [f"Prompt number {i}" for i in range(9)]
    kwargs = dict(max_new_tokens=6, stop_at_eos=False, temperature=1.0)
    per = [{"seed": i, "max_new_tokens": 3 + i % 4} for i in range(9)]
    solo = [pipe.generate(p, **{**kwargs, **o}) for p, o in zip(prompts, per, strict=True)]
    batch = pipe.generate_batch(prompts, slots=2, per_prompt=per, **kwargs)
    assert [r.ids for r in batch] == [r.ids for r in solo]


def test_joining_mid_way(pipe):
    engine = pipe.engine(slots=4, prefill_chunk=3)
    try:
        first = pipe.submit(engine, "The first one starts alone", 100, stop_at_eos=False)
        deadline = time.monotonic() + 30
        while len(first.state.ids) < 5 and time.monotonic() < deadline:
            time.sleep(0.005)
        late = [pipe.submit(engine, p, 12, stop_at_eos=False, temperature=1.0, seed=i)
                for i, p in enumerate(["Then another", "and a third one with a longer prompt to chunk"])]
        assert len(first.state.ids) < 100  # it is still running: they join mid-way
        results = [h.result(timeout=60) for h in (first, *late)]
    finally:
        engine.close()
    alone = pipe.generate("The first one starts alone", max_new_tokens=100, stop_at_eos=False)
    assert results[0].ids == alone.ids
    later = ["Then another", "and a third one with a longer prompt to chunk"]
    for i, (p, r) in enumerate(zip(later, results[1:], strict=True)):
        assert r.ids == pipe.generate(p, max_new_tokens=12, stop_at_eos=False, temperature=1.0, seed=i).ids
    assert engine.stats.steps > 0 and engine.free_slots == 4


def test_handle_streams_steps_and_text(pipe):
    with pipe.engine(slots=2) as engine:
        handle = pipe.submit(engine, "Once upon a time", 10, stop_at_eos=False, logprobs=2)
        steps = list(handle)
    expected = pipe.generate("Once upon a time", max_new_tokens=10, stop_at_eos=False, logprobs=2)
    assert [s.id for s in steps] == expected.ids
    assert "".join(s.text for s in steps) == expected.text
    assert steps[-1].finish_reason == "length" and handle.finish_reason == "length"
    assert all(s.logprob is not None for s in steps)


def test_cancel_frees_the_slot(pipe):
    engine = pipe.engine(slots=1, max_queue=4)
    try:
        long = pipe.submit(engine, "A long one", 100, stop_at_eos=False)
        waiting = pipe.submit(engine, "Waits for the slot", 4, stop_at_eos=False)
        queued_then_cancelled = pipe.submit(engine, "Never runs", 4, stop_at_eos=False)
        queued_then_cancelled.cancel()
        it = iter(long)
        next(it)
        long.cancel()
        rest = list(it)  # ends soon after the cancellation
        assert long.finish_reason == "cancelled" and len(rest) < 99
        assert waiting.result(timeout=30).ids == pipe.generate("Waits for the slot", max_new_tokens=4,
                                                                 stop_at_eos=False).ids
        assert queued_then_cancelled.wait(5) and queued_then_cancelled.finish_reason == "cancelled"
        assert queued_then_cancelled.state.ids == []
    finally:
        engine.close()
    assert engine.free_slots == 1 and engine.running == 0 and engine.waiting == 0


def test_bounded_queue(pipe):
    engine = pipe.engine(slots=1, max_queue=1)
    try:
        with engine.paused():  # hold the step loop: nothing is admitted, so the queue stays full
            a = pipe.submit(engine, "one", 2, stop_at_eos=False)  # the free slot will take it
            b = pipe.submit(engine, "two", 2, stop_at_eos=False)  # queued
            with pytest.raises(QueueFullError, match=r"queue is full \(1 requests wait for 1 slots\)"):
                pipe.submit(engine, "three", 2, stop_at_eos=False)
            with pytest.raises(QueueFullError):
                engine.submit(pipe.encode("three"), 2, block=True, timeout=0.05)
        # Once the loop admits "one", a blocking submission gets in.
        c = pipe.submit(engine, "three", 2, stop_at_eos=False, block=True)
        assert [h.result(timeout=30).new_tokens for h in (a, b, c)] == [2, 2, 2]
    finally:
        engine.close()
    with pytest.raises(EngineClosedError):
        pipe.submit(engine, "three", 2)


def test_bad_requests_fail_alone(pipe):
    with pipe.engine(slots=2) as engine:
        good = pipe.submit(engine, "Fine", 8, stop_at_eos=False)
        with pytest.raises(ContextLengthError):
            pipe.submit(engine, [11] * (pipe.config.n_positions + 1), 4)
        with pytest.raises(OptionError, match="top_p"):
            pipe.submit(engine, "x", 4, top_p=2.0)
        with pytest.raises(OptionError, match="logit_bias"):
            pipe.submit(engine, "x", 4, logit_bias={10**6: 1})
        with pytest.raises(GenerationError, match="max_new_tokens"):
            engine.submit([1, 2], -1)
        assert good.result(timeout=30).ids == pipe.generate("Fine", max_new_tokens=8, stop_at_eos=False).ids


def test_a_backend_failure_fails_that_step_only(pipe, monkeypatch):
    engine = pipe.engine(slots=2)
    real = engine.model.forward_ragged
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("kernel exploded")
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.model, "forward_ragged", flaky)
    try:
        victim = pipe.submit(engine, "Caught in it", 10, stop_at_eos=False)
        with pytest.raises(RuntimeError, match="kernel exploded"):
            victim.result(timeout=30)
        later = pipe.submit(engine, "After it", 5, stop_at_eos=False)
        assert later.result(timeout=30).new_tokens == 5
    finally:
        engine.close()
    assert engine.free_slots == 2


def test_zero_budget_and_full_context(pipe):
    with pipe.engine(slots=1) as engine:
        h = pipe.submit(engine, "Hi", 0)
        assert h.done and h.result().ids == [] and h.finish_reason == "length"
        n = pipe.config.n_positions
        h = pipe.submit(engine, [11] * (n - 2), 10, stop_at_eos=False)
        assert h.result(timeout=30).new_tokens == 2 and h.finish_reason == "length"


def test_submissions_from_many_threads(pipe):
    prompts = [f"Thread {i} says" for i in range(8)]
    results: dict[int, list[int]] = {}
    with pipe.engine(slots=3) as engine:
        def client(i: int) -> None:
            results[i] = pipe.submit(engine, prompts[i], 6, stop_at_eos=False, temperature=1.0, seed=i,
                                     block=True).result(timeout=60).ids

        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    for i, p in enumerate(prompts):
        alone = pipe.generate(p, max_new_tokens=6, stop_at_eos=False, temperature=1.0, seed=i)
        assert results[i] == alone.ids


@pytest.mark.slow
def test_stress_random_requests_with_cancellations(pipe):
    rng = np.random.default_rng(0)
    n_requests, n_pos = 200, pipe.config.n_positions
    requests = []
    for i in range(n_requests):
        length = int(rng.integers(1, 40))
        prompt = rng.integers(0, 50256, length).tolist()
        options = {"max_new_tokens": int(rng.integers(0, 12)), "stop_at_eos": bool(rng.integers(0, 2))}
        if rng.random() < 0.6:
            options.update(temperature=float(rng.uniform(0.5, 1.5)), seed=i, top_k=int(rng.integers(0, 50)))
        if rng.random() < 0.3:
            options.update(repetition_penalty=float(rng.uniform(0.8, 1.5)), presence_penalty=0.3)
        if rng.random() < 0.2:
            options.update(stop=[" the", "\n"], logprobs=int(rng.integers(0, 3)))
        cancel_after = int(rng.integers(0, 6)) if rng.random() < 0.15 else None
        requests.append((prompt, options, cancel_after))
    assert all(len(p) < n_pos for p, _, _ in requests)

    engine = pipe.engine(slots=5, max_queue=None, prefill_chunk=16)
    start = time.monotonic()
    try:
        handles = [pipe.submit(engine, p, **o) for p, o, _ in requests]
        for h, (_, _, cancel_after) in zip(handles, requests, strict=True):
            if cancel_after is not None:
                for k, _ in enumerate(h):
                    if k >= cancel_after:
                        h.cancel()
                        break
        results = [h.wait(120) for h in handles]
    finally:
        engine.close()
    assert all(results) and time.monotonic() - start < 300
    assert engine.free_slots == 5 and engine.running == 0 and engine.waiting == 0  # no slot leaks
    cancelled = 0
    for h, (prompt, options, _) in zip(handles, requests, strict=True):
        assert h.error is None
        if h.finish_reason == "cancelled":
            cancelled += 1
            continue
        alone = pipe.generate(prompt, **options)
        got = h.result()
        assert (got.ids, got.text, got.finish_reason) == (alone.ids, alone.text, alone.finish_reason)
    assert 5 <= cancelled <= 40


def test_engine_arguments_are_checked(pipe):
    for kwargs, name in (({"slots": 0}, "slots"), ({"prefill_chunk": 0}, "prefill_chunk"),
                         ({"max_queue": -1}, "max_queue"), ({"slots": 1.5}, "slots")):
        with pytest.raises(EngineError, match=name):
            pipe.engine(**kwargs)
    with pytest.raises(GenerationError, match="list of prompts"):
        pipe.generate_batch("one prompt")
    with pytest.raises(GenerationError, match="per_prompt has 1 entries for 2 prompts"):
        pipe.generate_batch(["a", "b"], per_prompt=[{}])
    assert pipe.generate_batch([]) == []


def test_slot_memory():
    config = inferno.Gpt2Config.from_file(shipped_gpt2_file("config.json"))
    assert slot_bytes(config) == 2 * 12 * 1024 * 768 * 4 == 75_497_472  # 72 MiB per slot at 124M


def test_engine_without_a_decoder_rejects_stop_strings(pipe):
    with Engine(pipe.model, slots=1) as engine, pytest.raises(OptionError, match="stop"):
        engine.submit([1, 2], 3, GenerationOptions(stop="x"))


def test_n_sequences_of_one_prompt_share_its_prefill(pipe):
    prompt = pipe.encode("Several continuations of one prompt")
    options = [GenerationOptions(temperature=1.0, seed=s, logprobs=1) for s in range(4)]
    with pipe.engine(slots=4, prefill_chunk=4) as engine:
        handles = engine.submit_many(prompt, 8, options)
        results = [h.result(timeout=60) for h in handles]
        assert engine.stats.prompt_tokens == len(prompt)  # prefilled once, not four times
    for seed, r in enumerate(results):
        alone = pipe.generate(prompt, max_new_tokens=8, stop_at_eos=False, temperature=1.0, seed=seed,
                              logprobs=1)
        assert r.ids == alone.ids
        np.testing.assert_allclose([x.logprob for x in r.logprobs], [x.logprob for x in alone.logprobs],
                                   atol=1e-5)
    assert len({tuple(r.ids) for r in results}) > 1


@pytest.mark.parametrize("when", ["waiting", "prefilling"])
def test_cancelled_group_members(pipe, when):
    prompt = pipe.encode("A group whose leader leaves " * 3)
    options = [GenerationOptions(temperature=1.0, seed=s) for s in range(3)]
    engine = Engine(pipe.model, slots=3, prefill_chunk=2, autostart=False)
    leader, stays, leaves = engine.submit_many(prompt, 5, options)
    if when == "prefilling":
        engine.step()  # admitted; two of its prompt tokens are in
        assert engine.running == 1 and 0 < engine.running_sequences()[0].cached < len(prompt)
    leader.cancel()
    leaves.cancel()
    for _ in range(100):
        if not engine.step():
            break
    assert leader.finish_reason == "cancelled" and leaves.finish_reason == "cancelled"
    alone = pipe.generate(prompt, max_new_tokens=5, stop_at_eos=False, temperature=1.0, seed=1)
    assert stays.result(timeout=1).ids == alone.ids
    assert engine.free_slots == 3 and engine.running == 0
    assert engine.stats.finished == {"cancelled": 2, "length": 1}  # a leader that leaves counts once
    engine.close()


def test_a_group_needs_as_many_slots(pipe):
    with pipe.engine(slots=2) as engine, pytest.raises(EngineError, match="3 sequences of one prompt"):
        engine.submit_many([1, 2], 3, [GenerationOptions()] * 3)


def test_steps_async_for_an_event_loop(pipe):
    import asyncio

    async def consume(engine):
        handle = pipe.submit(engine, "Async client", 6, stop_at_eos=False)
        await asyncio.sleep(0.05)  # some steps may already be waiting: none is lost
        return [s.id async for s in handle.steps_async()]

    with pipe.engine(slots=2) as engine:
        ids = asyncio.run(consume(engine))
    assert ids == pipe.generate("Async client", max_new_tokens=6, stop_at_eos=False).ids


def test_a_queue_of_zero_takes_what_fits_now(pipe):
    engine = pipe.engine(slots=2, max_queue=0)
    try:
        with engine.paused():
            handles = [pipe.submit(engine, "fits", 2, stop_at_eos=False) for _ in range(2)]
            with pytest.raises(QueueFullError):
                pipe.submit(engine, "does not", 2, stop_at_eos=False)
        assert all(h.result(timeout=30).new_tokens == 2 for h in handles) and engine.n_slots == 2
    finally:
        engine.close()


# ------------------------------------------------------------------ details pinned by mutation testing


def test_engine_argument_errors_name_the_value(pipe):
    for kwargs, message in (
            ({"slots": 0}, "slots must be an integer >= 1, got 0"),
            ({"slots": True}, "slots must be an integer >= 1, got True"),
            ({"slots": "2"}, "slots must be an integer >= 1, got '2'"),
            ({"prefill_chunk": 0}, "prefill_chunk must be an integer >= 1, got 0"),
            ({"prefill_chunk": True}, "prefill_chunk must be an integer >= 1, got True"),
            ({"prefill_chunk": 2.0}, "prefill_chunk must be an integer >= 1, got 2.0"),
            ({"max_queue": -1}, "max_queue must be an integer >= 0 or None, got -1"),
            ({"max_queue": True}, "max_queue must be an integer >= 0 or None, got True"),
            ({"max_queue": 1.0}, "max_queue must be an integer >= 0 or None, got 1.0")):
        with pytest.raises(EngineError) as e:
            Engine(pipe.model, autostart=False, **kwargs)
        assert str(e.value) == message, kwargs


def test_engine_defaults_and_smallest_arguments(pipe):
    engine = Engine(pipe.model)
    assert (engine.n_slots, engine.free_slots, engine.max_queue, engine.prefill_chunk) == (16, 16, 256, 64)
    assert engine.autostart is True and engine.sample_limit is None and engine.decoder is None
    assert (engine.waiting, engine.running, engine.alive) == (0, 0, False)
    engine.close()
    engine = Engine(pipe.model, slots=np.int64(1), prefill_chunk=np.int64(1), max_queue=0, autostart=False)
    assert engine.n_slots == 1 and engine.prefill_chunk == 1 and type(engine.prefill_chunk) is int
    assert engine.max_queue == 0
    engine.close()
    assert Engine(pipe.model, max_queue=None, autostart=False).max_queue is None


def _drain(engine: Engine, limit: int = 200) -> int:
    steps = 0
    while engine.step():
        steps += 1
        assert steps < limit
    return steps


def test_stats_count_steps_rows_tokens_and_endings(pipe):
    # A 5-token prompt in chunks of 3 and 4 new tokens: step 1 prefills 3, step 2 the other 2 and samples
    # the first token, steps 3-5 one token each; nothing is left for a sixth.
    prompt = pipe.encode("one two three four five")
    assert len(prompt) == 5
    engine = Engine(pipe.model, slots=2, prefill_chunk=3, autostart=False)
    h = engine.submit(prompt, 4)
    assert engine.waiting == 1 and engine.running == 0 and engine.free_slots == 2
    assert not h.done and h.finish_reason is None and not h.wait(0)
    assert engine.step()
    assert engine.waiting == 0 and engine.running == 1 and engine.free_slots == 1
    assert (engine.stats.steps, engine.stats.prompt_tokens, engine.stats.tokens, engine.stats.rows) == (
        1, 3, 0, 1)
    assert _drain(engine) == 4
    s = engine.stats
    assert (s.steps, s.prompt_tokens, s.tokens, s.rows) == (5, 5, 4, 5)
    assert s.seconds > 0 and s.finished == {"length": 1}
    assert engine.free_slots == 2 and engine.running == 0 and not engine.step()
    assert engine.stats.steps == 5  # a step with nothing to do is not counted
    r = h.result(timeout=1)
    assert r.prompt_ids == prompt and r.new_tokens == 4 and r.finish_reason == "length"
    assert r.backend == pipe.model.backend.name
    assert 0 < r.seconds <= s.seconds + 1e-3  # from admission to the end
    assert r.ids == pipe.generate(prompt, max_new_tokens=4, stop_at_eos=False).ids
    engine.close()


def test_two_sequences_share_the_prefill_chunk(pipe):
    # Chunk 4: step 1 prefills a's 3 tokens and 1 of b's; step 2 b's last 2 and a's decode row.
    a, b = pipe.encode("one two three"), pipe.encode("four five six")
    engine = Engine(pipe.model, slots=2, prefill_chunk=4, autostart=False)
    ha, hb = engine.submit(a, 3), engine.submit(b, 3)
    engine.step()
    assert engine.stats.prompt_tokens == 4 and engine.stats.rows == 2 and engine.stats.tokens == 1
    assert len(ha.state.ids) == 1 and hb.state.ids == []
    engine.step()
    assert engine.stats.prompt_tokens == 6 and engine.stats.rows == 4 and engine.stats.tokens == 3
    _drain(engine)
    assert engine.stats.finished == {"length": 2}
    for p, h in ((a, ha), (b, hb)):
        assert h.result(timeout=1).ids == pipe.generate(p, max_new_tokens=3, stop_at_eos=False).ids
    engine.close()


def test_a_stopped_sequence_counts_its_reason(pipe):
    prompt = pipe.encode("Hello there")
    first = pipe.generate(prompt, max_new_tokens=3, stop_at_eos=False).ids
    engine = Engine(pipe.model, slots=1, autostart=False)
    end = first.index(first[1]) + 1  # the stop id's first appearance ends it
    h = engine.submit(prompt, 10, stop_ids=[first[1]])
    _drain(engine)
    assert h.finish_reason == "stop" and h.result().ids == first[:end]
    assert engine.stats.finished == {"stop": 1} and engine.stats.tokens == end
    engine.close()


def test_result_times_out_with_a_message(pipe):
    engine = Engine(pipe.model, slots=1, autostart=False)
    h = engine.submit([1, 2], 2)
    with pytest.raises(TimeoutError) as e:
        h.result(timeout=0.01)
    assert str(e.value) == f"request {h.id} did not finish within 0.01 s"
    engine.close()
    assert h.finish_reason == "cancelled" and h.result(timeout=0).ids == [] and h.result().seconds == 0


def test_request_ids_count_up(pipe):
    engine = Engine(pipe.model, slots=2, autostart=False)
    handles = [engine.submit([1], 1) for _ in range(2)]
    handles += engine.submit_many([1], 1, [GenerationOptions()] * 2)
    assert [h.id for h in handles] == [0, 1, 2, 3]
    engine.close()


def test_done_callbacks_run_once_at_the_end(pipe):
    engine = Engine(pipe.model, slots=1, autostart=False)
    h = engine.submit([1, 2], 2)
    calls = []
    h.add_done_callback(calls.append)
    h.add_done_callback(lambda x: calls.append("second"))
    engine.step()
    assert calls == []
    _drain(engine)
    assert calls == [h, "second"]
    h.add_done_callback(calls.append)  # already ended: at once
    assert calls == [h, "second", h]
    h._end()  # a second end changes nothing
    assert calls == [h, "second", h]
    engine.close()


def test_close_cancels_running_and_waiting_and_refuses_more(pipe):
    engine = Engine(pipe.model, slots=1, autostart=False)
    running, waiting = engine.submit([1, 2], 5), engine.submit([3], 5)
    engine.step()
    assert engine.running == 1 and engine.waiting == 1
    engine.close()
    assert running.finish_reason == "cancelled" and waiting.finish_reason == "cancelled"
    assert engine.stats.finished == {"cancelled": 2}
    assert engine.free_slots == 1 and engine.running == 0 and engine.waiting == 0
    steps = list(running)  # the one token it got, then the end
    assert len(steps) == 1 and steps[0].finish_reason is None and list(waiting) == []
    with pytest.raises(EngineClosedError, match="^the engine is closed$"):
        engine.submit([1], 1)
    before = _loop_threads()
    engine.start()  # closed: no thread starts
    assert not engine.alive and not _loop_threads() - before


def _loop_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "inferno-engine" and t.is_alive()}


def test_the_loop_thread_starts_on_submission_and_stops_on_close(pipe):
    before = _loop_threads()
    engine = pipe.engine(slots=1)
    assert not _loop_threads() - before and not engine.alive
    h = pipe.submit(engine, "x", 2, stop_at_eos=False)
    (thread,) = _loop_threads() - before
    assert thread.daemon and engine.alive
    engine.start()  # idempotent
    assert _loop_threads() - before == {thread}
    assert h.result(timeout=30).new_tokens == 2
    assert engine.alive
    engine.close()
    assert not engine.alive and not thread.is_alive()
    before = _loop_threads()
    manual = pipe.engine(slots=1, autostart=False)
    manual.submit([1], 1)
    assert not _loop_threads() - before and not manual.alive
    manual.close()


def test_a_blocked_submission_ends_when_the_engine_closes(pipe):
    engine = Engine(pipe.model, slots=1, max_queue=0, autostart=False)
    engine.submit([1], 3)
    errors = []

    def blocked():
        try:
            engine.submit([2], 3, block=True, timeout=10)
        except EngineError as exc:
            errors.append(exc)

    t = threading.Thread(target=blocked)
    t.start()
    time.sleep(0.2)
    assert t.is_alive()
    engine.close()
    t.join(5)
    assert len(errors) == 1 and type(errors[0]) is EngineClosedError


def test_a_failing_sequence_fails_alone(pipe):
    engine = Engine(pipe.model, slots=2, autostart=False)
    good, bad = engine.submit([1, 2], 3), engine.submit([3, 4], 3)

    def boom(*args, **kwargs):
        raise ValueError("this sequence broke")

    bad.state.step = boom
    _drain(engine)
    with pytest.raises(ValueError, match="this sequence broke"):
        bad.result()
    with pytest.raises(ValueError, match="this sequence broke"):
        list(bad)
    assert good.result().new_tokens == 3 and good.error is None
    assert engine.stats.finished == {"length": 1, "error": 1} and engine.free_slots == 2
    engine.close()


def _step_with_a_failing_forward(engine: Engine) -> None:
    """One step of `engine` whose forward pass raises RuntimeError("kernel exploded")."""
    real = engine.model.forward_ragged

    def boom(*args, **kwargs):
        raise RuntimeError("kernel exploded")

    engine.model.forward_ragged = boom
    try:
        engine.step()
    finally:
        engine.model.forward_ragged = real


def test_a_failing_leader_fails_its_group(pipe):
    engine = Engine(pipe.model, slots=3, prefill_chunk=2, autostart=False)
    handles = engine.submit_many([1, 2, 3, 4], 3, [GenerationOptions(temperature=1.0, seed=s)
                                                   for s in range(3)])
    engine.step()  # admitted, half prefilled
    _step_with_a_failing_forward(engine)
    for h in handles:
        assert h.done and isinstance(h.error, RuntimeError)
    assert engine.stats.finished == {"error": 3} and engine.free_slots == 3 and engine.running == 0
    engine.close()


@pytest.mark.parametrize("prefill_chunk", [64, 3])
def test_one_rows_failure_ends_its_sequence_only(pipe, prefill_chunk):
    # A forward pass that fails on one row (as kv=float16 does on a key beyond float16's range, or a row's
    # logits that are not finite): the step runs each row again alone, and only the sequence whose row
    # fails ends, with the error; the others finish with the ids they get alone (their slots' positions
    # written twice, the same values).
    poison = 999
    prompts = [[5, 6, 7, 8], [9, 10, poison, 12], [13, 14]]
    alone = [pipe.generate(p, max_new_tokens=6, stop_at_eos=False).ids for p in prompts[::2]]
    engine = Engine(pipe.model, slots=3, prefill_chunk=prefill_chunk, autostart=False)
    with rows_holding_fail(engine.model, poison) as calls:
        handles = [engine.submit(p, 6) for p in prompts]
        _drain(engine)
    assert isinstance(handles[1].error, ValueError) and "65504" in str(handles[1].error)
    assert [handles[0].result().ids, handles[2].result().ids] == alone
    assert max(calls) == 3 and calls.count(1) >= 3  # the joint step, then its rows one at a time
    assert engine.stats.finished == {"length": 2, "error": 1} and engine.free_slots == 3
    engine.close()


def test_submit_defaults_sixteen_tokens_and_does_not_block(pipe):
    engine = Engine(pipe.model, slots=1, max_queue=0, autostart=False)
    h = engine.submit([1, 2])
    with pytest.raises(QueueFullError):
        engine.submit([3])  # not blocking by default: at once
    _drain(engine)
    assert h.result().new_tokens == 16 and h.finish_reason == "length"
    engine.close()


def test_a_failure_outside_a_batch_fails_every_request_and_the_loop_goes_on(pipe):
    engine = pipe.engine(slots=1, max_queue=4)
    real = engine._admit
    calls = {"n": 0}

    def admit_once_broken():
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("admission broke")
        real()

    engine._admit = admit_once_broken
    try:
        with engine.paused():  # both are queued before the loop's first step
            handles = [engine.submit([1, 2], 3), engine.submit([3], 3)]
        for h in handles:
            assert h.wait(30)
            with pytest.raises(RuntimeError, match="^admission broke$"):
                h.result()
        assert engine.stats.finished == {"error": 2} and engine.waiting == 0
        later = engine.submit([4], 2)
        assert later.result(timeout=30).new_tokens == 2
    finally:
        engine.close()


def test_error_is_none_until_the_end(pipe):
    engine = Engine(pipe.model, slots=1, autostart=False)
    h = engine.submit([1, 2], 2)
    assert h.error is None
    engine.step()
    assert not h.done and h.error is None  # running, not failed
    _drain(engine)
    assert h.done and h.error is None
    engine.close()


def test_stats_seconds_are_the_time_inside_steps(pipe):
    engine = Engine(pipe.model, slots=1, autostart=False)
    engine.submit([1, 2], 3)
    start = time.perf_counter()
    _drain(engine)
    wall = time.perf_counter() - start
    assert engine.stats.steps == 3 and 0 < engine.stats.seconds <= wall
    engine.close()


def test_stats_seconds_add_up_every_step(pipe):
    # Each step's time is added: at least the time of every step's batch, not only the last step's.
    engine = Engine(pipe.model, slots=1, autostart=False)
    engine.submit([1, 2], 4)
    real, batches = engine._run_batch, []

    def timed() -> None:
        start = time.perf_counter()
        real()
        batches.append(time.perf_counter() - start)

    engine._run_batch = timed
    _drain(engine)
    assert engine.stats.steps == len(batches) == 4
    assert engine.stats.seconds >= sum(batches) > 0
    engine.close()


def test_a_closed_event_loop_cancels_its_stream(pipe):
    # A server's consumer whose event loop has closed: the next step it gets finds nobody listening, and
    # the sequence is cancelled before the step after, freeing its slot.
    engine = Engine(pipe.model, slots=1, autostart=False)
    h = engine.submit([1, 2], 50)
    engine.step()  # one step waits in the backlog
    loop = asyncio.new_event_loop()
    try:
        first = loop.run_until_complete(asyncio.wait_for(h.steps_async().__anext__(), 5))
    finally:
        loop.close()
    assert first.id == h.state.ids[0]
    assert engine.step()  # its step goes to the closed loop
    assert not h.done and len(h.state.ids) == 2
    assert not engine.step()  # cancelled before running again: nothing left to do
    assert h.finish_reason == "cancelled" and len(h.state.ids) == 2
    assert engine.free_slots == 1 and engine.running == 0 and engine.stats.finished == {"cancelled": 1}
    engine.close()


def test_a_sequence_cancelled_in_its_prefill_frees_its_slot_at_once(pipe):
    # Without followers there is nobody to keep prefilling for: the slot goes to the next in the queue.
    engine = Engine(pipe.model, slots=1, prefill_chunk=2, autostart=False)
    h, later = engine.submit([1, 2, 3, 4, 5, 6], 5), engine.submit([7], 2)
    engine.step()
    assert engine.stats.prompt_tokens == 2 and engine.waiting == 1
    h.cancel()
    engine.step()
    assert h.finish_reason == "cancelled" and h.state.ids == []
    assert [q.handle for q in engine.running_sequences()] == [later] and engine.waiting == 0
    assert engine.stats.prompt_tokens == 3 and engine.stats.finished == {"cancelled": 1}
    _drain(engine)
    assert later.result().ids == pipe.generate([7], max_new_tokens=2, stop_at_eos=False).ids
    assert engine.stats.prompt_tokens == 3 and engine.free_slots == 1
    engine.close()


def test_a_waiting_group_whose_leader_leaves_keeps_all_the_others(pipe):
    prompt = pipe.encode("Three of one prompt")
    options = [GenerationOptions(temperature=1.0, seed=s) for s in range(3)]
    engine = Engine(pipe.model, slots=3, prefill_chunk=4, autostart=False)
    leader, *others = engine.submit_many(prompt, 4, options)
    leader.cancel()
    _drain(engine)
    assert leader.finish_reason == "cancelled"
    for seed, h in enumerate(others, 1):
        assert h.done and h.finish_reason == "length"
        alone = pipe.generate(prompt, max_new_tokens=4, stop_at_eos=False, temperature=1.0, seed=seed)
        assert h.result().ids == alone.ids
    assert engine.stats.prompt_tokens == len(prompt)  # the new leader prefilled it for both
    assert engine.stats.finished == {"cancelled": 1, "length": 2} and engine.free_slots == 3
    engine.close()


def test_decode_rows_behind_prefills_out_of_budget_still_run(pipe):
    # Chunk 1. A group (g, f) of a 1-token prompt, then x and w of 3 tokens: step 1 prefills g, which
    # starts f behind x and w. In step 2 x takes the chunk (a row not sampled), w has no budget left, and
    # f, behind both, still decodes with g.
    options = [GenerationOptions(temperature=1.0, seed=s) for s in range(2)]
    engine = Engine(pipe.model, slots=4, prefill_chunk=1, autostart=False)
    g, f = engine.submit_many([1], 3, options)
    x, w = engine.submit([2, 3, 4], 2), engine.submit([5, 6, 7], 2)
    engine.step()
    assert [q.handle for q in engine.running_sequences()] == [g, x, w, f]
    assert engine.stats.rows == 1 and len(g.state.ids) == len(f.state.ids) == 1
    engine.step()
    assert engine.stats.rows == 4 and engine.stats.prompt_tokens == 2 and engine.stats.tokens == 4
    assert len(g.state.ids) == len(f.state.ids) == 2 and x.state.ids == w.state.ids == []
    assert [q.cached for q in engine.running_sequences()] == [2, 1, 0, 2]
    _drain(engine)
    for seed, h in enumerate((g, f)):
        alone = pipe.generate([1], max_new_tokens=3, stop_at_eos=False, temperature=1.0, seed=seed)
        assert h.result().ids == alone.ids
    for p, h in (([2, 3, 4], x), ([5, 6, 7], w)):
        assert h.result().ids == pipe.generate(p, max_new_tokens=2, stop_at_eos=False).ids
    engine.close()


def test_an_overflow_in_a_step_is_a_logits_error_not_a_numpy_warning(pipe):
    # The forward pass overflows (float32 inf) and then computes inf - inf (NaN): NumPy's overflow and
    # invalid-value warnings are silenced in the step, and the logits check fails it instead.
    config, sd, _ = golden_model("greedy")
    sd = {k: v.copy() for k, v in sd.items()}
    sd["h.0.mlp.c_fc.weight"][:] = 3e38
    engine = Engine(Gpt2.from_weights(config, sd, pipe.model.backend), slots=1, autostart=False)
    h = engine.submit([1, 2, 3], 2)
    with warnings.catch_warnings(), np.errstate(over="warn", invalid="warn"):
        warnings.simplefilter("error")
        assert engine.step()
    assert h.done and isinstance(h.error, NonFiniteLogitsError)
    assert "the weights are the likely cause" in str(h.error)
    assert engine.stats.finished == {"error": 1} and engine.free_slots == 1
    engine.close()


def test_a_handle_records_when_it_was_submitted_admitted_and_finished(pipe):
    engine = Engine(pipe.model, slots=1, autostart=False)
    before = time.perf_counter()
    h, queued = engine.submit([1, 2], 2), engine.submit([3], 2)
    after = time.perf_counter()
    for x in (h, queued):
        assert before <= x.submitted <= after and x.admitted is None and x.finished is None
    engine.step()
    assert after <= h.admitted <= time.perf_counter() and h.finished is None
    assert queued.admitted is None and queued.finished is None  # no slot for it yet
    queued.cancel()
    _drain(engine)
    assert h.admitted <= h.finished <= time.perf_counter()
    assert queued.admitted is None and queued.finished >= queued.submitted
    assert h.result().seconds == h.finished - h.admitted and queued.result().seconds == 0
    engine.close()


def test_the_lowest_free_slot_is_taken_first(pipe):
    engine = Engine(pipe.model, slots=3, autostart=False)
    assert engine.free_slot_ids() == [0, 1, 2]  # the next one to be taken first
    engine.submit([1], 3), engine.submit([2], 3)
    engine.step()
    assert [q.slot for q in engine.running_sequences()] == [0, 1] and engine.free_slot_ids() == [2]
    engine.close()


def test_the_engine_samples_and_checks_ids_below_its_sample_limit(pipe):
    prompt = pipe.encode("The quick brown fox")
    free = pipe.generate(prompt, max_new_tokens=8, stop_at_eos=False).ids
    assert max(free) >= 100  # unlimited, greedy picks ids the limit below rules out
    engine = Engine(pipe.model, slots=1, sample_limit=100, autostart=False)
    assert engine.sample_limit == 100
    for options, name in ((GenerationOptions(logit_bias={100: 1.0}), "logit_bias"),
                          (GenerationOptions(stop_ids=[150]), "stop_ids")):
        with pytest.raises(OptionError, match=f"^{name} names token id 1[05]0, outside the vocabulary "
                                              r"\[0, 100\)$"):
            engine.submit_many(prompt, 4, [options])
    h = engine.submit(prompt, 8, GenerationOptions(logit_bias={99: 0.5}))
    _drain(engine)
    ids = h.result().ids
    assert len(ids) == 8 and max(ids) < 100
    engine.close()


def test_submit_many_does_not_block_by_default(pipe):
    engine = Engine(pipe.model, slots=1, max_queue=0, autostart=False)
    engine.submit([1], 2)
    bound = threading.Timer(2.0, engine.close)  # a submission that blocks would end when it closes
    bound.start()
    try:
        start = time.monotonic()
        with pytest.raises(QueueFullError):
            engine.submit_many([2], 2, [GenerationOptions()])
        assert time.monotonic() - start < 1
    finally:
        bound.cancel()
        engine.close()


def test_a_zero_timeout_never_waits_even_on_a_clock_that_has_not_ticked(pipe, monkeypatch):
    # A coarse monotonic clock (Windows': about 15 ms) reads the same at the deadline and at the check:
    # no time is left, so the submission fails at once instead of waiting for room.
    import types

    import inferno.engine.scheduler as engine_module

    readings = itertools.chain([1000.0, 1000.0], itertools.count(1001.0))
    monkeypatch.setattr(engine_module, "time", types.SimpleNamespace(
        monotonic=lambda: next(readings), perf_counter=time.perf_counter))
    engine = Engine(pipe.model, slots=1, max_queue=0, autostart=False)
    engine.submit([1], 2)
    waits = []

    class Recording(threading.Condition):
        def wait(self, timeout=None):
            waits.append(timeout)
            return super().wait(timeout)

    engine._cv = Recording()
    with pytest.raises(QueueFullError):
        engine.submit([2], 2, block=True, timeout=0)
    assert waits == []
    engine.close()


def test_a_blocked_submission_waits_its_whole_timeout_for_room(pipe):
    # One second to wait: the running request ends 0.2 s in and the next step frees its slot for it.
    engine = Engine(pipe.model, slots=1, max_queue=0, autostart=False)
    first = engine.submit([1], 1)

    def later():
        time.sleep(0.2)
        engine.step()  # the first runs its one token and ends
        engine.step()  # nothing to run; the freed slot is announced

    helper = threading.Thread(target=later)
    helper.start()
    try:
        second = engine.submit([2], 2, block=True, timeout=1.0)
    finally:
        helper.join(5)
    assert first.done and not second.done and engine.waiting == 1
    _drain(engine)
    assert second.result().new_tokens == 2
    engine.close()


def test_a_blocked_submission_says_the_engine_closed(pipe):
    engine = Engine(pipe.model, slots=1, max_queue=0, autostart=False)
    engine.submit([1], 3)
    closer = threading.Timer(0.2, engine.close)
    closer.start()
    try:
        with pytest.raises(EngineClosedError) as e:
            engine.submit([2], 3, block=True, timeout=5)
    finally:
        closer.join(5)
    assert str(e.value) == "the engine is closed"


def test_close_waits_for_the_loop_thread_ten_seconds_or_its_timeout(pipe):
    engine = Engine(pipe.model, slots=1, autostart=False)
    joins = []

    class Loop:
        def join(self, timeout=None):
            joins.append(timeout)

    engine._thread = Loop()
    engine.close()
    engine.close(0.25)
    assert joins == [10.0, 0.25]


def test_a_leader_that_left_frees_its_slot_and_the_others_in_its_step_go_on(pipe):
    # Slots 0, 1 for the group (l, f), 2 for x. Chunk 4: step 1 prefills 4 of l's 5 tokens. l leaves;
    # step 2 prefills its last token, starts f, frees slot 0 and still prefills x, behind l in the step,
    # and samples its first token. Then y takes slot 0.
    prompt = [1, 2, 3, 4, 5]
    options = [GenerationOptions(temperature=1.0, seed=s) for s in range(2)]
    engine = Engine(pipe.model, slots=3, prefill_chunk=4, autostart=False)
    leader, follower = engine.submit_many(prompt, 3, options)
    x = engine.submit([5], 3)
    engine.step()
    assert x.state.ids == [] and engine.stats.prompt_tokens == 4
    leader.cancel()
    engine.step()
    assert leader.finish_reason == "cancelled" and len(follower.state.ids) == 1 and len(x.state.ids) == 1
    assert engine.stats.tokens == 2 and engine.stats.prompt_tokens == 6 and engine.free_slot_ids() == [0]
    y = engine.submit([6, 7], 3)
    engine.step()
    running = engine.running_sequences()
    assert [q.handle for q in running] == [x, follower, y] and running[2].slot == 0
    _drain(engine)
    alone = pipe.generate(prompt, max_new_tokens=3, stop_at_eos=False, temperature=1.0, seed=1)
    assert follower.result().ids == alone.ids
    for p, h in (([5], x), ([6, 7], y)):
        assert h.result().ids == pipe.generate(p, max_new_tokens=3, stop_at_eos=False).ids
    assert sorted(engine.free_slot_ids()) == [0, 1, 2]
    engine.close()


def test_an_ended_sequence_holds_no_slot_and_no_followers(pipe):
    # What `_finish` leaves, whether the sequence ended or failed: no slot to free twice, no group to fail
    # twice.
    engine = Engine(pipe.model, slots=3, prefill_chunk=2, autostart=False)
    done = engine.submit([1], 1)
    handles = engine.submit_many([1, 2, 3, 4], 3, [GenerationOptions()] * 2)
    ended, leader = engine._waiting
    seqs = [ended, leader, *leader.followers]
    engine.step()  # `done` runs its one token and ends; the group is half prefilled
    assert done.finish_reason == "length" and [q.handle for q in engine.running_sequences()] == [handles[0]]
    _step_with_a_failing_forward(engine)
    assert all(isinstance(h.error, RuntimeError) for h in handles)
    for q in seqs:
        assert q.slot < 0 and q.followers == [] and q.size == 1
    assert engine.free_slots == 3 and sorted(engine.free_slot_ids()) == [0, 1, 2]
    engine.close()


def test_a_failing_cache_copy_to_followers_fails_the_group_and_frees_its_slots(pipe, monkeypatch):
    # The followers of a group start from a copy of the leader's KV cache; if that copy fails (out of
    # memory on a device), every member ends with the error and no slot is lost.
    engine = Engine(pipe.model, slots=3, autostart=False)
    handles = engine.submit_many([1, 2, 3], 3, [GenerationOptions(temperature=1.0, seed=s) for s in range(3)])
    be = engine.model.backend
    real_forward, real_write = engine.model.forward_ragged, be.write_kv
    in_forward = []

    def forward(*args, **kwargs):
        in_forward.append(True)
        try:
            return real_forward(*args, **kwargs)
        finally:
            in_forward.pop()

    def write_kv(*args, **kwargs):
        if not in_forward:
            raise MemoryError("no room for the copy")
        return real_write(*args, **kwargs)

    monkeypatch.setattr(engine.model, "forward_ragged", forward)
    monkeypatch.setattr(be, "write_kv", write_kv)
    engine.step()
    for h in handles:
        assert h.wait(2) and isinstance(h.error, MemoryError)
    assert engine.free_slots == 3 and engine.running == 0 and engine.stats.finished == {"error": 3}
    engine.close()
