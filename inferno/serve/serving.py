"""What the serving objects share (one per endpoint: `ServingCompletions`, `ServingChat`, ...): the
app's state, the cancel flag of work done off the event loop, and running a plan in the engine to its
answer."""

from __future__ import annotations

import threading
import time

from fastapi import Request
from fastapi.responses import Response

from inferno.serve.echo import EchoPart
from inferno.serve.planning import Plan
from inferno.serve.running import Completion, Format, answer, log_info, submit
from inferno.serve.state import ServerState


class CancelFlag(threading.Event):
    """Set when a request's work in a worker thread should stop: its client left, or the server is
    shutting down (`ServerState` cancels what it tracks, as it cancels completions)."""

    def cancel(self) -> None:
        self.set()


class Serving:
    """One endpoint's flow over the app's `ServerState` (the model, its engine, what is in flight)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    def log(self, request: Request, **what: object) -> None:
        """Tell the access log line of `request` more (its prompt, its tokens)."""
        log_info(request).update(what)

    async def run(self, request: Request, plan: Plan, echoes: list[EchoPart] | None, fmt: Format | None,
                  started: float | None = None) -> Response:
        """Submit `plan`'s choices to the engine and answer with them as they run (see `running.answer`)."""
        state = self.state
        assert state.engine is not None and state.texts is not None
        completion = Completion(plan, submit(state.engine, plan), echoes, state.texts, state.config.model_id,
                                state.metrics, time.perf_counter() if started is None else started, fmt)

        def start(c: Completion) -> None:
            state.track(c)
            state.metrics.prompt_tokens.inc(c.prompt_tokens)

        return await answer(request, completion, plan.stream, grace_seconds=state.config.grace_seconds,
                            on_start=start, on_end=state.untrack)
