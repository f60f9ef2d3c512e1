"""The state of one app: the model, its engine, the requests in flight, and the model's lifecycle.

The model loads in a background thread once the app starts (``/health`` answers 503 until it is
ready). Every request goes to one continuous-batching `Engine`. `ServerState.begin_shutdown` (on SIGTERM)
refuses new requests (503) and, after the grace period, ends the running ones with finish_reason
"abort"; requests still waiting for a worker thread (an inspection) are answered 503
(`middleware.ShutdownGuard`). Routes reach the state of their app through the `State` dependency.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Annotated, Protocol

from fastapi import Depends, Request

from inferno.api import Pipeline
from inferno.chat_template import ChatTemplate, JinjaChatTemplate, model_template
from inferno.engine import Engine
from inferno.serve.config import ServeConfig
from inferno.serve.errors import ApiError
from inferno.serve.metrics import Metrics
from inferno.serve.token_texts import TokenTexts
from inferno.speculative import check_speculation

logger = logging.getLogger("inferno.serve")


class Cancellable(Protocol):
    """What the state tracks while a request runs: a completion, or a worker's cancel flag."""

    def cancel(self) -> None: ...


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
        #: The names a request's ``model`` may give: the served id and its aliases.
        self.model_names = frozenset((config.model_id, *config.model_aliases))
        #: Set once the grace period of a shutdown is over (`middleware.ShutdownGuard` answers 503 then).
        self.grace_over = asyncio.Event()
        self._pipeline = pipeline
        if config.chat_template is not None:  # a template that does not compile fails create_app
            JinjaChatTemplate(config.chat_template, bos_token="", eos_token="")
        self._completions: set[Cancellable] = set()

    # ------------------------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Load the model (a given pipeline at once, else in a background thread). On the event loop."""
        self.grace_over = asyncio.Event()  # of this loop (an app may be started again, on another)
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
        check_slots_fit(pipe, c.slots)  # before the engine allocates them
        draft = None
        if c.draft_model is not None:
            try:
                draft = pipe.draft(c.draft_model).model
            except Exception as exc:  # the load fails with it, named for its flag
                raise RuntimeError(f"--draft-model: {exc}") from None
        check_speculation(pipe.model, c.speculative, draft, c.num_speculative_tokens)
        self.engine = pipe.engine(slots=c.slots, max_queue=c.queue, prefill_chunk=c.prefill_chunk,
                                  no_prefix_cache=not c.prefix_cache, speculative=c.speculative,
                                  draft_model=draft, num_speculative_tokens=c.num_speculative_tokens)
        self.texts = TokenTexts(pipe.tokenizer)
        self.chat_template = self._chat_template(pipe)
        self.pipe = pipe
        self.status = "ok"  # last: routes check it before using the rest
        logger.info("inferno serve: model %s ready (%s backend, %d layers, context %d; %d slots) in %.1fs",
                    c.model_id, pipe.backend.name, pipe.config.n_layer, pipe.config.n_positions, c.slots,
                    seconds)

    def _chat_template(self, pipe: Pipeline) -> ChatTemplate:
        """--chat-template, else the model's own, else the plain default (`inferno.chat_template`)."""
        template = model_template(pipe.tokenizer, self.config.chat_template,
                                  eos_token_id=pipe.config.eos_token_id)
        return ChatTemplate() if template is None else template

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
        if self.draining:
            self.grace_over.set()

    def close(self) -> None:
        self._cancel_all()
        if self.engine is not None:
            self.engine.close()

    # -------------------------------------------------------------------------------------- requests
    def require(self, *, draining_ok: bool = False, model: str | None = None) -> Pipeline:
        """The pipeline, or 503 while loading (or shutting down); 404 when a request names a `model` this
        server does not serve."""
        if model is not None and model not in self.model_names:
            raise ApiError(404, f"The model {model!r} does not exist: this server serves "
                           f"{self.config.model_id!r} (see GET /v1/models)", param="model",
                           code="model_not_found")
        if self.status == "loading":
            raise ApiError(503, "the model is still loading; retry shortly", headers={"Retry-After": "1"})
        if self.status == "failed":
            raise ApiError(503, f"the model failed to load: {self.load_error}")
        if self.draining and not draining_ok:
            raise ApiError(503, "the server is shutting down")
        assert self.pipe is not None
        return self.pipe

    def track(self, work: Cancellable) -> None:
        """Hold `work` (a completion, or the cancel flag of work in a worker thread) until `untrack`:
        a shutdown cancels it after the grace period."""
        self._completions.add(work)

    def untrack(self, work: Cancellable) -> None:
        self._completions.discard(work)


class SlotsError(ValueError):
    """--slots asks for more KV cache than this machine has; the message says how much of each."""


def _gb(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1e6:.1f} MB"


def _mem_available() -> int | None:
    """/proc/meminfo's MemAvailable plus SwapFree, in bytes (None where there is no /proc)."""
    try:
        with open("/proc/meminfo") as f:
            fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.count(" ") >= 1}
    except (OSError, ValueError, IndexError):
        return None
    if "MemAvailable" not in fields:
        return None
    return fields["MemAvailable"] + fields.get("SwapFree", 0)


def check_slots_fit(pipe: Pipeline, slots: int) -> None:
    """Refuse `slots` whose KV cache (`inferno.kv.slot_bytes` each, at the whole context) is larger than
    all the memory this process may ever have (`memory_limit`: memory plus swap, or the cgroup's limit):
    that server could never hold its slots, and the engine's allocation alone would exhaust the machine.
    Within the limit but beyond what is free now is only logged: a slot's memory is touched only as far
    as its sequences reach."""
    from inferno.kv import slot_bytes
    from inferno.models.weights import memory_limit

    # The bytes of a cache element as the backend allocates it (its compute dtype need not be the cache's:
    # half computes in float32 over float16 weights, with a float32 or float16 cache).
    itemsize = getattr(pipe.backend.new_kv_cache(1, 1, 1, 1)[0], "itemsize", 4)
    itemsize = itemsize if isinstance(itemsize, int) and itemsize > 0 else 4
    each = slot_bytes(pipe.config, itemsize)
    need = each * slots
    limit, free = memory_limit(), _mem_available()
    if limit is not None and need > limit:
        now = f", {_gb(free)} of it available now" if free is not None else ""
        raise SlotsError(f"--slots {slots}: the KV cache needs {_gb(need)} ({_gb(each)} a slot × {slots} "
                         f"slots at a context of {pipe.config.n_positions}) but this machine has "
                         f"{_gb(limit)} (memory and swap, or its cgroup limit){now}; lower --slots")
    if free is not None and need > free:
        logger.warning("inferno serve: warning: --slots %d may need %s of KV cache once every slot fills "
                       "its context; %s is available now", slots, _gb(need), _gb(free))


def server_state(request: Request) -> ServerState:
    """The state of the app that received `request` (`create_app` puts it in ``app.state.inferno``)."""
    return request.app.state.inferno


#: A route's parameter ``state: State`` is its app's `ServerState`.
State = Annotated[ServerState, Depends(server_state)]
