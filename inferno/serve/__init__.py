"""``inferno serve``: an OpenAI-compatible HTTP server over the continuous-batching engine.

    pip install "inferno-gpt2[serve]"
    inferno serve --model-dir gpt2 --port 8000 --slots 16
    curl -N localhost:8000/v1/completions -H 'content-type: application/json' \\
         -d '{"prompt": "The quick brown fox", "max_tokens": 20, "stream": true}'

Modules: `config` (the settings, no third-party imports), `schemas` (the protocol: pydantic request and
response models, the OpenAPI document), `routes` (one `APIRouter` a concern; each route one call into
its serving object), the serving objects, one per endpoint, each owning its request's flow
(`serving_completions`, `serving_chat`, `serving_inspect`, `serving_tokenize`, over `serving`), the
generation pieces they share (`planning`: fields to options and prompts to ids; `echo`: the echoed
prompt and its logprobs; `running`: choices in the engine, their chunks and the answer; `token_texts`:
token texts and the logprob floor), `chat_template`, `protocol` (uvicorn's h11 protocol with a header
deadline and a connection cap), `state` (the model, its engine and the requests in flight),
`bodies` (strict JSON bodies, validation messages), `sse` (Server-Sent Events),
`app` (`create_app`: routers, errors, middleware), `middleware` (access log, shutdown guard, Origin
check, API key, JSON bodies, body limit), `metrics` (Prometheus). The command line is
`inferno.cli.serve`.

Only `config` may be imported without the ``serve`` extra: everything else imports FastAPI, and
nothing in the core imports this package.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ServeConfig", "create_app"]


def __getattr__(name: str) -> Any:
    # Lazy, so that `inferno.cli.serve` can say "pip install inferno-gpt2[serve]" when FastAPI is missing.
    if name == "create_app":
        from inferno.serve.app import create_app

        return create_app
    if name == "ServeConfig":
        from inferno.serve.config import ServeConfig

        return ServeConfig
    raise AttributeError(f"module 'inferno.serve' has no attribute {name!r}")
