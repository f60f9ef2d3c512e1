"""Ray Serve: the server of ``inferno serve`` (its FastAPI app, routes and all) on Ray Serve replicas.

    pip install "inferno-gpt2[ray]"
    serve run examples/ray_serve.yaml                      # replicas, autoscaling bounds, slots: see there
    serve run inferno.integrations.ray_serve:build_app model_dir=gpt2 slots=16

`InfernoServer` is a deployment whose ingress (``@serve.ingress``) is the app `inferno.serve.create_app`
makes, so the OpenAI endpoints, streaming (Server-Sent Events) included, work through Serve's HTTP
proxy as they do from ``inferno serve``. Each replica loads the model in its constructor, before Serve
routes anything to it, and runs one continuous-batching engine of `slots` sequences; Serve's proxy
spreads requests over the replicas, the autoscaler adds and removes them, and the controller replaces a
replica that dies (new requests go to the others meanwhile). Per-replica state stays per replica:
``/metrics`` and ``/health`` describe the replica that answered. Serve cancels a request whose client
disconnects; the app logs it as one access-log line ending "disconnected", as under ``inferno serve``
(`inferno.serve.middleware.client_gone`), not as an internal error.

`build_app` is the application builder that ``serve run`` and the config file name; its arguments are
`InfernoArgs` (``inferno serve``'s settings). It sets ``max_ongoing_requests`` to twice the slots, so a
replica keeps its slots busy with a short queue of its own while the rest wait in Serve's router for
whichever replica frees up first; a config file's ``deployments:`` section overrides it.
"""

# No `from __future__ import annotations`: Serve reads build_app's annotation to validate its arguments.

import logging
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from ray import serve
from ray.serve import Application

from inferno.engine import DEFAULT_PREFILL_CHUNK, DEFAULT_QUEUE, DEFAULT_SLOTS
from inferno.integrations import limit_blas_to_ray_cpus
from inferno.serve.config import DEFAULT_MODEL_ID, ServeConfig, api_key_problem, parse_origins

#: Requests Serve hands one replica at a time, per KV slot (the rest wait in Serve's router).
ONGOING_PER_SLOT = 2


class InfernoArgs(BaseModel):
    """The application's arguments: ``inferno serve``'s flags, under their Python names."""

    model_config = ConfigDict(extra="forbid")

    model_dir: str | None = Field(None, description="folder with config.json, model.safetensors, "
                                  "tokenizer.json (default: ./gpt2, the Hugging Face cache, a download)")
    backend: str | None = Field(None, description="compute backend spec, e.g. numpy or cpu-threaded")
    threads: int | None = Field(None, ge=1, description="threads of cpu-threaded or torch")
    slots: int = Field(DEFAULT_SLOTS, ge=1, description="sequences each replica generates at once")
    queue: int = Field(DEFAULT_QUEUE, ge=1, description="requests a replica lets wait for a slot")
    prefill_chunk: int = Field(DEFAULT_PREFILL_CHUNK, ge=1, description="prompt tokens run per step")
    served_model_name: str | None = Field(None, description="the model id in /v1/models and responses")
    api_key: str | None = Field(None, description="require 'Authorization: Bearer KEY' (not empty, no "
                                "surrounding whitespace)")
    allowed_origins: list[str] = Field([], description="origins whose web pages may call the API (CORS), "
                                       "e.g. http://localhost:3000, or *")
    grace_seconds: float = Field(10.0, ge=0, description="on shutdown, running requests may finish "
                                 "for this long")
    log_prompts: bool = False

    @field_validator("api_key")
    @classmethod
    def _usable_key(cls, key: str | None) -> str | None:
        # An empty key ("${UNSET}" in a config file) would otherwise serve an open API.
        problem = None if key is None else api_key_problem(key)
        if problem:
            raise ValueError(problem)
        return key

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, origins: list[str]) -> list[str]:
        return list(parse_origins(origins))


@serve.deployment(name="InfernoServer", health_check_period_s=10, health_check_timeout_s=30)
@serve.ingress()
class InfernoServer:
    """One replica: the model, its engine, and `inferno serve`'s app in front of them."""

    def __init__(self, **kwargs: Any) -> None:
        import inferno
        from inferno.backends.registry import get_backend
        from inferno.serve.app import create_app

        args = InfernoArgs(**kwargs)
        _log_to_the_replica_log()
        self.blas_threads = limit_blas_to_ray_cpus()  # the BLAS threads of this replica, set from now on
        backend = get_backend(args.backend, **({"threads": args.threads} if args.threads else {}))
        pipe = inferno.load(args.model_dir, backend)  # loaded before the replica takes requests
        folder = Path(args.model_dir).name if args.model_dir else DEFAULT_MODEL_ID
        model_id = args.served_model_name or folder
        config = ServeConfig(model_dir=args.model_dir, backend=backend, model_id=model_id, slots=args.slots,
                             queue=args.queue, prefill_chunk=args.prefill_chunk, api_key=args.api_key,
                             grace_seconds=args.grace_seconds, log_prompts=args.log_prompts,
                             model_aliases=(args.model_dir,) if args.model_dir else (),
                             allowed_origins=tuple(args.allowed_origins))
        self._app = create_app(config, pipeline=pipe)

    def __serve_build_asgi_app__(self) -> Any:
        return self._app

    def check_health(self) -> None:
        """Serve's health check: an unhealthy replica is replaced."""
        state = self._app.state.inferno
        if state.status != "ok" or state.engine is None:
            raise RuntimeError(f"inferno replica not ready: {state.status} {state.load_error or ''}".strip())


def _log_to_the_replica_log() -> None:
    """The app's access log (and its errors) in Serve's replica log, as Serve's own lines are: without a
    handler of its own the ``inferno.serve`` logger's INFO lines (a "disconnected" included) go nowhere."""
    ours = logging.getLogger("inferno.serve")
    if ours.handlers:
        return
    for handler in logging.getLogger("ray.serve").handlers:
        ours.addHandler(handler)
    ours.setLevel(logging.INFO)
    ours.propagate = False


def build_app(args: InfernoArgs) -> Application:
    """The application ``serve run`` deploys: `InfernoServer` with these arguments. A relative model_dir
    is taken from where ``serve run`` runs (the replicas may start elsewhere)."""
    settings = args.model_dump()
    model_dir = settings["model_dir"]
    if model_dir is not None and not os.path.isabs(model_dir) and os.path.isdir(model_dir):
        settings["model_dir"] = os.path.abspath(model_dir)
    deployment = InfernoServer.options(max_ongoing_requests=ONGOING_PER_SLOT * args.slots)
    return deployment.bind(**settings)
