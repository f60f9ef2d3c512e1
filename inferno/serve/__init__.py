"""``inferno serve``: an OpenAI-compatible HTTP server over the continuous-batching engine.

    pip install "inferno-gpt2[serve]"
    inferno serve --model-dir gpt2 --port 8000 --slots 16
    curl -N localhost:8000/v1/completions -H 'content-type: application/json' \\
         -d '{"prompt": "The quick brown fox", "max_tokens": 20, "stream": true}'

Modules: `config` (the settings, no third-party imports), `schemas` (the protocol: pydantic request and
response models, the OpenAPI document), `completions` (a request's prompts and options, its choices,
logprobs and chunks), `chat` and `chat_template` (chat completions: messages to a prompt, chat's
shapes of the same choices), `protocol` (uvicorn's h11 protocol with a header deadline and a
connection cap), `state` (the model, its engine and the requests in flight), `routes` (one
`APIRouter` a concern), `bodies` (strict JSON bodies, validation messages), `sse` (Server-Sent Events),
`app` (`create_app`: routers, errors, middleware), `middleware` (body limit, API key, access log),
`metrics` (Prometheus), `cli` (``run_serve_cli``).

Only `config` and `cli` may be imported without the ``serve`` extra: everything else imports FastAPI,
and nothing in the core imports this package.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ServeConfig", "create_app", "run_serve_cli"]


def __getattr__(name: str) -> Any:
    # Lazy, so that `inferno.serve.cli` can say "pip install inferno-gpt2[serve]" when FastAPI is missing.
    if name == "create_app":
        from inferno.serve.app import create_app

        return create_app
    if name == "ServeConfig":
        from inferno.serve.config import ServeConfig

        return ServeConfig
    raise AttributeError(f"module 'inferno.serve' has no attribute {name!r}")
