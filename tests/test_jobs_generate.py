"""Generation jobs in this process (inferno/jobs/generate.py): each request line's checks and their exact
messages, the checks against the loaded model, and `run_generation` on the real engine (what it asks the
engine for, what it writes and counts, that it closes what it opened) and on engines that fail, stall or
die. Every run goes through `_bounded`: a run that never ends fails the test instead of hanging it."""

from __future__ import annotations

import io
import json
import os
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from inferno.jobs.generate import (
    REQUEST_KEYS,
    Request,
    check_request,
    known_keys,
    parse_line,
    run_generation,
)
from inferno.jobs.lines import LineError
from inferno.jobs.plan import JobPlan
from inferno.jobs.progress import JobReport, Progress
from inferno.options import GenerationOptions

EOS = 50256


def _line(obj: dict, line: int = 1) -> Request:
    return parse_line(json.dumps(obj), line, 16, True)


def _error(obj: dict) -> LineError:
    with pytest.raises(LineError) as info:
        _line(obj)
    return info.value


# ------------------------------------------------------------------------------------- one line


def test_a_line_gives_its_request_with_the_defaults_for_what_it_leaves_out():
    req = parse_line('{"prompt": "Hi", "temperature": 0.5}', 7, 9, False)
    assert (req.line, req.id, req.prompt, req.max_new_tokens, req.stop_at_eos) == (7, 7, "Hi", 9, False)
    assert req.options == GenerationOptions.from_kwargs(temperature=0.5)
    req = _line({"id": "x", "prompt": [1, 2], "max_new_tokens": 0, "stop_at_eos": False})
    assert (req.id, req.prompt, req.max_new_tokens, req.stop_at_eos) == ("x", [1, 2], 0, False)


def test_an_unknown_key_names_the_closest_known_one_and_lists_them_all():
    known = ", ".join(known_keys())
    assert known_keys()[:len(REQUEST_KEYS)] == REQUEST_KEYS and "temperature" in known_keys()
    assert str(_error({"prompt": "a", "temprature": 1})) == (
        f"unknown key 'temprature' (did you mean 'temperature'? known: {known})")
    # nothing close: no "did you mean"
    assert str(_error({"prompt": "a", "zzzzzz": 1})) == f"unknown key 'zzzzzz' (known: {known})"


@pytest.mark.parametrize("obj, message", [
    ({"id": 1}, 'no "prompt" (text, or a list of token ids; "" for unconditional text) nor "messages" (a '
                'conversation for the model\'s chat template)'),
    ({"prompt": 5}, "prompt must be text or a list of token ids, got 5"),
    ({"prompt": [1, "a"]}, 'prompt: a list of token ids must hold integers, got "a"'),
    ({"prompt": "a", "max_new_tokens": -1}, "max_new_tokens must be an integer >= 0, got -1"),
    ({"prompt": "a", "max_new_tokens": 1.5}, "max_new_tokens must be an integer >= 0, got 1.5"),
    ({"prompt": "a", "max_new_tokens": True}, "max_new_tokens must be an integer >= 0, got true"),
    ({"prompt": "a", "stop_at_eos": "yes"}, 'stop_at_eos must be true or false, got "yes"'),
    # JSON shapes the options would take too loosely (an object is an iterable of its keys)
    ({"prompt": "a", "stop": {"x": 1}}, "stop must be a string or a list of strings, got dict"),
    ({"prompt": "a", "stop_ids": {"1": 2}}, "stop_ids must be a list of token ids, got dict"),
    ({"prompt": "a", "stop_ids": 3}, "stop_ids must be a list of token ids, got 3"),
    ({"prompt": "a", "logit_bias": [1, 2]}, 'logit_bias must be an object {"token id": bias, ...}, got list'),
])
def test_what_is_wrong_with_a_line_is_said_exactly(obj, message):
    assert str(_error(obj)) == message


def test_a_line_with_an_error_still_claims_its_id():
    # so that a later line with the same id is a duplicate, not a second request (jobs.lines.parse_rows)
    assert _error({"id": "x", "prompt": 5}).id == "x"
    assert _error({"id": 3, "prompt": "a", "zzzzzz": 1}).id == 3
    with pytest.raises(LineError) as info:
        parse_line('{"prompt": 5}', 4, 16, True)
    assert info.value.id == 4  # no id: its line number


def test_the_options_are_checked_against_the_sample_limit_not_the_vocabulary(pipe):
    # A vocabulary padded past the tokenizer's: ids at or above the limit cannot be decoded.
    padded = SimpleNamespace(config=pipe.config, encode=pipe.encode, sample_limit=100,
                             tokenizer=pipe.tokenizer)
    req = _line({"prompt": "Hi", "logit_bias": {"150": 1.0}})
    check_request(pipe, req)  # below the vocabulary: fine
    assert req.prompt_ids == pipe.encode("Hi")
    with pytest.raises(LineError, match="150"):
        check_request(padded, _line({"prompt": "Hi", "logit_bias": {"150": 1.0}}))


# ------------------------------------------------------------------------------------- the run


def _bounded(fn: Any, seconds: float = 60.0) -> Any:
    """fn() in a thread, its result or its exception; a run still going after `seconds` fails the test."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the run did not end within {seconds} s"
    if "error" in out:
        raise out["error"]
    return out["value"]


def _plan(pipe: Any, tmp_path, rows: list[dict], *, malformed: int = 0, checked: bool = True) -> JobPlan:
    todo = [_line(row, line) for line, row in enumerate(rows, 1)]
    for req in todo:
        if checked:
            check_request(pipe, req)
        else:
            req.prompt_ids = pipe.encode(req.prompt)
    return JobPlan(pipe, todo, tmp_path / "out.jsonl", False, 0, malformed, "in.jsonl")


def _run(plan: JobPlan, **kwargs: Any) -> tuple[JobReport, list[str], list[dict]]:
    said: list[str] = []
    progress = Progress(len(plan.todo), io.StringIO())
    report = _bounded(lambda: run_generation(plan, progress, said.append, **kwargs))
    out = plan.out_path
    lines = [json.loads(raw) for raw in out.read_bytes().splitlines()] if out.exists() else []
    return report, said, lines


class _EngineSpy:
    """Records what `run_generation` asks `pipe.engine` for, and the engine it got."""

    def __init__(self, pipe: Any) -> None:
        self.make, self.kwargs, self.engines = pipe.engine, [], []

    def __call__(self, **kwargs: Any) -> Any:
        self.kwargs.append(kwargs)
        self.engines.append(self.make(**kwargs))
        return self.engines[-1]


def _open_fds() -> int | None:
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None


def test_each_result_is_written_counted_and_what_was_opened_is_closed(pipe, tmp_path, monkeypatch):
    spy = _EngineSpy(pipe)
    monkeypatch.setattr(pipe, "engine", spy)
    # EOS made certain: stop_at_eos decides whether a request ends there or runs to its length.
    eos = {"logit_bias": {str(EOS): 100.0}}
    rows = [{"id": "stops", "prompt": "Hi", "max_new_tokens": 4, "stop_at_eos": True, **eos},
            {"id": "runs", "prompt": "Hi", "max_new_tokens": 4, "stop_at_eos": False, **eos},
            {"id": "plain", "prompt": "Ho", "max_new_tokens": 3}]
    fds = _open_fds()
    start = time.perf_counter()
    report, said, lines = _run(_plan(pipe, tmp_path, rows, malformed=2))
    wall = time.perf_counter() - start
    assert said == []
    by_id = {line["id"]: line for line in lines}
    assert sorted(by_id) == ["plain", "runs", "stops"] and len(lines) == 3
    assert (by_id["stops"]["finish_reason"], by_id["stops"]["new_tokens"]) == ("stop", 1)
    assert (by_id["runs"]["finish_reason"], by_id["runs"]["ids"]) == ("length", [EOS] * 4)
    assert by_id["plain"]["new_tokens"] == 3
    assert (report.todo, report.written, report.tokens, report.failed, report.malformed) == (3, 3, 8, 0, 2)
    assert 0 < report.seconds <= wall
    # one engine, as many slots as requests, no queue bound (every request is submitted at once)
    assert spy.kwargs == [{"slots": 3, "max_queue": None, "prefill_chunk": 64}]
    assert not spy.engines[0].alive  # closed: its step thread stopped
    assert fds is None or _open_fds() == fds  # OUT closed


def test_slots_and_prefill_chunk_are_passed_on_and_one_request_gets_one_slot(pipe, tmp_path, monkeypatch):
    spy = _EngineSpy(pipe)
    monkeypatch.setattr(pipe, "engine", spy)
    _run(_plan(pipe, tmp_path, [{"prompt": "Hi", "max_new_tokens": 1}]))
    _run(_plan(pipe, tmp_path, [{"prompt": "Hi", "max_new_tokens": 1}]), slots=3, prefill_chunk=8)
    assert spy.kwargs == [{"slots": 1, "max_queue": None, "prefill_chunk": 64},
                          {"slots": 3, "max_queue": None, "prefill_chunk": 8}]


def test_requests_the_engine_refuses_are_said_counted_as_malformed_and_the_rest_run(pipe, tmp_path):
    # Not checked up front, so the engine's own check at submission refuses the prompts too long for it.
    long = [1] * (pipe.config.n_positions + 1)
    rows = [{"id": "a", "prompt": long}, {"id": "b", "prompt": long}, {"id": "c", "prompt": "Hi",
                                                                       "max_new_tokens": 2}]
    report, said, lines = _run(_plan(pipe, tmp_path, rows, malformed=1, checked=False))
    assert [line["id"] for line in lines] == ["c"]
    assert (report.written, report.malformed, report.failed) == (1, 3, 0)
    assert [s.split(": ", 1)[0] for s in said] == ["in.jsonl:1", "in.jsonl:2"]
    assert all(str(pipe.config.n_positions) in s for s in said), said


# Engines that are not the real one: a handle that ends late, an engine whose loop died, one that
# cannot be made.

@dataclass
class _Result:
    new_tokens: int = 2

    def to_dict(self, token_text: Any = None) -> dict:
        return {"text": "xy", "new_tokens": self.new_tokens}


@dataclass
class _Handle:
    delay: float | None  # seconds until it finishes; None: never
    error: BaseException | None = None
    callbacks: list = field(default_factory=list)
    cancelled: bool = False

    def add_done_callback(self, fn: Any) -> None:
        self.callbacks.append(fn)
        if self.delay is not None:
            threading.Timer(self.delay, fn, (self,)).start()

    def result(self) -> _Result:
        return _Result()

    def cancel(self) -> None:
        self.cancelled = True


class _Engine:
    def __init__(self, alive: bool) -> None:
        self.alive, self.closed = alive, False

    def close(self) -> None:
        self.closed = True


class _Pipe:
    def __init__(self, engine: Any, delay: float | None) -> None:
        self._engine, self.delay, self.handles = engine, delay, []
        self.tokenizer = SimpleNamespace(decode=lambda ids: "?")

    def engine(self, **kwargs: Any) -> Any:
        if isinstance(self._engine, BaseException):
            raise self._engine
        return self._engine

    def submit(self, engine: Any, ids: list[int], n: int, **kwargs: Any) -> _Handle:
        self.handles.append(_Handle(self.delay))
        return self.handles[-1]


def _fake_plan(pipe: _Pipe, tmp_path, count: int = 2) -> JobPlan:
    todo = [Request(i, i, "p", 2, True, GenerationOptions(), [1]) for i in range(1, count + 1)]
    return JobPlan(pipe, todo, tmp_path / "out.jsonl", False, 0, 0, "in.jsonl")


def test_results_that_come_after_the_first_poll_are_still_waited_for(tmp_path):
    engine = _Engine(alive=True)
    report, _, lines = _run(_fake_plan(_Pipe(engine, delay=0.3), tmp_path))
    assert (report.written, report.tokens, len(lines)) == (2, 4, 2)
    assert engine.closed


def test_an_engine_whose_loop_died_is_an_error_not_a_hang(tmp_path):
    engine = _Engine(alive=False)
    pipe = _Pipe(engine, delay=None)
    with pytest.raises(RuntimeError) as info:
        _run(_fake_plan(pipe, tmp_path))
    assert str(info.value) == "the engine's step loop stopped with requests in flight"
    assert engine.closed and len(pipe.handles) == 2


def test_an_engine_that_cannot_be_made_raises_its_own_error(tmp_path):
    with pytest.raises(MemoryError, match="no room"):
        _run(_fake_plan(_Pipe(MemoryError("no room"), delay=None), tmp_path))
