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


@dataclass
class ServeConfig:
    """How the server loads its model and runs its engine.

    `model_dir` and `backend` are passed to `inferno.load` (`backend` may be a constructed `Backend`);
    `slots`, `queue` and `prefill_chunk` to `Pipeline.engine`. `model_id` is what /v1/models lists and
    every response's ``model`` says (requests may name any model: there is only one). `grace_seconds`:
    on SIGTERM, running requests may finish for this long before they are ended ("cancelled").
    `chat_template`: the text of a Jinja2 chat template in Hugging Face's format (None: the plain
    default of `inferno.serve.chat_template`). `body_timeout` is applied by the app; `header_timeout`
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
