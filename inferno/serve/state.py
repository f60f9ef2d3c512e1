"""The state of one app: the model, its engine, the requests in flight, and the model's lifecycle.

The model loads in a background thread once the app starts (``/health`` answers 503 until it is
ready). Every request goes to one continuous-batching `Engine`. `ServerState.begin_shutdown` (on SIGTERM)
refuses new requests (503) and, after the grace period, ends the running ones with finish_reason
"cancelled". Routes reach the state of their app through the `State` dependency.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request

from inferno.api import Pipeline
from inferno.engine import Engine, EngineClosedError, EngineError, Handle, QueueFullError
from inferno.generate import GenerationError
from inferno.options import OptionError
from inferno.serve.chat_template import ChatTemplate, JinjaChatTemplate
from inferno.serve.completions import Completion, EchoPart, Plan, TokenTexts, echo_part
from inferno.serve.config import ServeConfig
from inferno.serve.errors import ApiError
from inferno.serve.metrics import Metrics

logger = logging.getLogger("inferno.serve")


class ServerState:
    """The model, its engine and the requests in flight, shared by the routes of one app."""

    def __init__(self, config: ServeConfig, pipeline: Pipeline | None = None) -> None:
        self.config = config
        self.pipe: Pipeline | None = None
        self.engine: Engine | None = None
        self.texts: TokenTexts | None = None
        self.chat_template: ChatTemplate | None = None
        self.status = "loading"  # then "ok" or "failed"
        self.load_error: str | None = None
        self.draining = False
        self.started = int(time.time())
        self.metrics = Metrics(lambda: self.engine)
        self.loop: asyncio.AbstractEventLoop | None = None
        #: Called (on the event loop) when the model fails to load: the CLI stops the server.
        self.on_fatal: Callable[[], None] | None = None
        self._pipeline = pipeline
        if config.chat_template is not None:  # a template that does not compile fails create_app
            JinjaChatTemplate(config.chat_template, bos_token="", eos_token="")
        self._completions: set[Completion] = set()
        # Scoring (echo) runs in worker threads besides the engine's; one at a time bounds its memory.
        self._score_lock = threading.Lock()

    # ------------------------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Load the model (a given pipeline at once, else in a background thread)."""
        if self._pipeline is not None:
            self._ready(self._pipeline, 0.0)
            return
        threading.Thread(target=self._load, name="inferno-serve-load", daemon=True).start()

    def _load(self) -> None:
        import inferno

        start = time.perf_counter()
        try:
            pipe = inferno.load(self.config.model_dir, self.config.backend, download=self.config.download)
            self._ready(pipe, time.perf_counter() - start)
        except Exception as exc:  # the message of our loaders' errors names the file, key or flag
            self.load_error = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or \
                type(exc).__name__
            self.status = "failed"
            logger.error("inferno serve: error: %s", self.load_error)
            if self.on_fatal is not None and self.loop is not None:
                self.loop.call_soon_threadsafe(self.on_fatal)

    def _ready(self, pipe: Pipeline, seconds: float) -> None:
        c = self.config
        self.engine = pipe.engine(slots=c.slots, max_queue=c.queue, prefill_chunk=c.prefill_chunk)
        self.texts = TokenTexts(pipe.tokenizer)
        self.chat_template = self._chat_template(pipe)
        self.pipe = pipe
        self.status = "ok"  # last: routes check it before using the rest
        logger.info("inferno serve: model %s ready (%s backend, %d layers, context %d; %d slots) in %.1fs",
                    c.model_id, pipe.backend.name, pipe.config.n_layer, pipe.config.n_positions, c.slots,
                    seconds)

    def _chat_template(self, pipe: Pipeline) -> ChatTemplate:
        if self.config.chat_template is None:
            return ChatTemplate()
        names = {i: t for t, i in pipe.tokenizer.special_tokens.items()}
        eos = names.get(pipe.config.eos_token_id, "")
        return JinjaChatTemplate(self.config.chat_template, bos_token=eos, eos_token=eos)

    def begin_shutdown(self) -> None:
        """Refuse new requests from now on; end the running ones after the grace period. Safe to call
        from a signal handler."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        if self.draining:
            return
        self.draining = True
        if self._completions:
            logger.info("inferno serve: shutting down; %d requests may finish within %gs",
                        len(self._completions), self.config.grace_seconds)
        assert self.loop is not None
        self.loop.call_later(self.config.grace_seconds, self._cancel_all)

    def _cancel_all(self) -> None:
        for completion in list(self._completions):
            completion.cancel()

    def close(self) -> None:
        self._cancel_all()
        if self.engine is not None:
            self.engine.close()

    # -------------------------------------------------------------------------------------- requests
    def require(self, *, draining_ok: bool = False) -> Pipeline:
        """The pipeline, or 503 while loading (or shutting down)."""
        if self.status == "loading":
            raise ApiError(503, "the model is still loading; retry shortly", headers={"Retry-After": "1"})
        if self.status == "failed":
            raise ApiError(503, f"the model failed to load: {self.load_error}")
        if self.draining and not draining_ok:
            raise ApiError(503, "the server is shutting down")
        assert self.pipe is not None
        return self.pipe

    def echoes(self, plan: Plan) -> list[EchoPart]:
        """The echoed prompts (worker thread): text, and logprobs scored by `Pipeline.score`."""
        pipe, out = self.pipe, []
        assert pipe is not None and self.texts is not None
        for ids in plan.ids:
            score = None
            if plan.logprobs is not None and len(ids) >= 2:  # a single token has nothing to score
                with self._score_lock:
                    score = pipe.score(ids, top_logprobs=plan.logprobs)
            out.append(echo_part(ids, pipe.tokenizer, self.texts, score, plan.logprobs, plan.return_ids))
        return out

    def submit(self, plan: Plan) -> list[Handle]:
        """Every prompt's n choices into the engine (each prompt's share its prefill); all or none."""
        assert self.engine is not None
        handles: list[Handle] = []
        try:
            for ids in plan.ids:
                handles += self.engine.submit_many(ids, plan.max_tokens, plan.options, stop_ids=plan.stop_ids)
        except BaseException as exc:
            for h in handles:
                h.cancel()
            if isinstance(exc, QueueFullError):
                raise ApiError(429, str(exc), code="queue_full", headers={"Retry-After": "1"}) from None
            if isinstance(exc, EngineClosedError):
                raise ApiError(503, "the server is shutting down") from None
            if isinstance(exc, (GenerationError, OptionError, EngineError)):
                raise ApiError(400, str(exc)) from None
            raise
        return handles

    def track(self, completion: Completion) -> None:
        self._completions.add(completion)

    def untrack(self, completion: Completion) -> None:
        self._completions.discard(completion)


def server_state(request: Request) -> ServerState:
    """The state of the app that received `request` (`create_app` puts it in ``app.state.inferno``)."""
    return request.app.state.inferno


#: A route's parameter ``state: State`` is its app's `ServerState`.
State = Annotated[ServerState, Depends(server_state)]
