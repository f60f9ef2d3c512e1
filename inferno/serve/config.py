"""The server's settings (what ``inferno serve`` flags give); importable without the ``serve`` extra."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferno.engine import DEFAULT_PREFILL_CHUNK, DEFAULT_QUEUE, DEFAULT_SLOTS

#: Request bodies larger than this are refused with 413 (a 1 MiB prompt is ~250k tokens: far past any
#: context, so nothing legitimate is lost).
MAX_BODY_BYTES = 1 << 20

#: Slow clients (seconds; None: no limit): a connection must send a request's headers within
#: HEADER_TIMEOUT of its first byte (or of opening), and its body within BODY_TIMEOUT of its headers; at
#: most MAX_CONNECTIONS are open at once (beyond, 503 and closed). A connection holds a socket and
#: buffers: these bound what clients that never finish can take. The cap leaves room for the largest
#: --slots and --queue people run plus the /health and /metrics probes.
HEADER_TIMEOUT = 10.0
BODY_TIMEOUT = 30.0
MAX_CONNECTIONS = 1024

#: The model id when --model-dir is not given (and no --served-model-name).
DEFAULT_MODEL_ID = "gpt2"


def api_key_problem(key: str) -> str | None:
    """Why `key` cannot be an API key, or None. An empty key would turn authentication off (``--api-key
    "$UNSET"``), and one with surrounding whitespace could never match: the server strips the token a
    client sends."""
    if key == "":
        return "the API key is empty (an unset variable?); give a key, or no --api-key to serve without one"
    if key != key.strip():
        return "the API key starts or ends with whitespace, which no client can send; remove it"
    return None


def parse_origins(values: list[str]) -> tuple[str, ...]:
    """The allowed origins from ``--allowed-origins`` values (each comma-separated): ``*`` or
    ``scheme://host[:port]`` each, without a path; ValueError names a bad one."""
    out: list[str] = []
    for value in values:
        for origin in value.split(","):
            origin = origin.strip().rstrip("/")
            if not origin:
                continue
            scheme, sep, rest = origin.partition("://")
            if origin != "*" and not (sep and scheme in ("http", "https") and rest and "/" not in rest):
                raise ValueError(f"{origin!r} is not an origin: give scheme://host[:port] (as a browser's "
                                 "Origin header says it, e.g. http://localhost:3000) or *")
            if origin not in out:
                out.append(origin)
    return tuple(out)


@dataclass
class ServeConfig:
    """How the server loads its model and runs its engine.

    `model_dir` and `backend` are passed to `inferno.load` (`backend` may be a constructed `Backend`);
    `slots`, `queue` and `prefill_chunk` to `Pipeline.engine`. `model_id` is what /v1/models lists and
    every response's ``model`` says; a request naming another model (not one of `model_aliases`) is a
    404. `grace_seconds`: on SIGTERM, running requests may finish for this long before they are ended
    (finish_reason "abort"). `api_key`: None or a key (`api_key_problem` says which are refused).
    `allowed_origins`: the origins (or ``*``) whose pages may call the API from a browser (CORS); a
    request from any other origin is refused (403), one from the server's own page is not.
    `chat_template`: the text of a Jinja2 chat template in Hugging Face's format (None: the plain
    default of `inferno.chat_template`). `body_timeout` is applied by the app; `header_timeout`
    and `max_connections` by the HTTP server (`inferno.serve.protocol`), since no app sees a request
    before its headers are complete.
    """

    model_dir: str | None = None
    backend: Any = None
    model_id: str = DEFAULT_MODEL_ID
    slots: int = DEFAULT_SLOTS
    queue: int = DEFAULT_QUEUE
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK
    api_key: str | None = None
    grace_seconds: float = 10.0
    log_prompts: bool = False
    max_body_bytes: int = MAX_BODY_BYTES
    download: bool = True
    header_timeout: float | None = HEADER_TIMEOUT
    body_timeout: float | None = BODY_TIMEOUT
    max_connections: int | None = MAX_CONNECTIONS
    chat_template: str | None = None
    model_aliases: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    #: /v1/inspect requests that may run at once (each a forward pass and a large JSON body); beyond, 429.
    max_inspections: int = 2
    #: Automatic prefix caching in the engine (`inferno serve --no-prefix-cache` turns it off).
    prefix_cache: bool = True
    #: Speculative decoding for every request the engine runs (`inferno.speculative`): "ngram", or a
    #: draft model's name (loaded on the same backend), K drafts in a sequence's first round.
    speculative: str | None = None
    draft_model: str | None = None
    num_speculative_tokens: int | None = None
