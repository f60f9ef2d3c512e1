"""``inferno serve``: parse the flags, bind the socket, run uvicorn; the model loads in the background.

    inferno serve -m gpt2 --port 8000 --slots 16 --queue 256

Exit codes: 0 after a clean shutdown (SIGTERM or Ctrl-C: running requests get --grace-seconds to
finish), 2 for usage errors, a missing ``serve`` extra, a port that cannot be bound, or a model that
fails to load.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import math
import signal
import socket
import sys
import threading
from collections.abc import Sequence

from inferno.cli._args import EXIT_USAGE, Number, Parser, add_model_args, non_negative, positive
from inferno.engine import DEFAULT_PREFILL_CHUNK, DEFAULT_QUEUE, DEFAULT_SLOTS
from inferno.serve.config import BODY_TIMEOUT, HEADER_TIMEOUT, MAX_CONNECTIONS, ServeConfig

_EXTRA = ("fastapi", "uvicorn", "sse_starlette", "prometheus_client")


_port = Number(int, lambda v: 0 <= v <= 65535, "a port number in [0, 65535]")
_seconds = Number(float, lambda v: math.isfinite(v) and v >= 0, "a number of seconds >= 0")


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="inferno serve", description="Serve the model over HTTP: OpenAI-compatible "
                "/v1/completions (streaming, n, logprobs, echo), /v1/models, /health, /tokenize, "
                "/detokenize, /tokenizer_info, /metrics.")
    add_model_args(p)  # -m/--model-dir, -b/--backend, --threads: as every subcommand has them
    arg = p.add_argument
    arg("--host", default="127.0.0.1", help="address to listen on (127.0.0.1; 0.0.0.0 for every interface)")
    arg("--port", type=_port, default=8000, help="port to listen on (8000; 0 picks a free one)")
    arg("--slots", metavar="N", type=positive, default=DEFAULT_SLOTS,
        help=f"sequences generated at once, one KV slot each ({DEFAULT_SLOTS}); also the largest n")
    arg("--queue", metavar="N", type=positive, default=DEFAULT_QUEUE,
        help=f"requests that may wait for a slot ({DEFAULT_QUEUE}); beyond, 429 with Retry-After")
    arg("--prefill-chunk", metavar="N", type=positive, default=DEFAULT_PREFILL_CHUNK,
        help=f"prompt tokens run per step ({DEFAULT_PREFILL_CHUNK}): bounds the stall of running streams")
    arg("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY' (all routes but /health "
        "and the API docs)")
    arg("--grace-seconds", metavar="S", type=_seconds, default=10.0,
        help="on SIGTERM, running requests may finish for S seconds (10), then end as 'cancelled'")
    arg("--log-prompts", action="store_true", help="put the prompt in each access log line")
    arg("--served-model-name", metavar="NAME", help="the model id in /v1/models and responses (default: "
        "the Hub repo id, the folder's name, or random)")
    # Slow clients (issue 29): 0 turns a limit off.
    arg("--timeout-headers", metavar="S", type=_seconds, default=HEADER_TIMEOUT, help="a request's headers "
        f"must arrive within S seconds of its first byte, else 408 and closed ({HEADER_TIMEOUT:g})")
    arg("--timeout-body", metavar="S", type=_seconds, default=BODY_TIMEOUT, help="a request's body must "
        f"arrive within S seconds of its headers, else 408 ({BODY_TIMEOUT:g})")
    arg("--max-connections", metavar="N", type=non_negative, default=MAX_CONNECTIONS, help="connections "
        f"open at once; beyond, 503 and closed ({MAX_CONNECTIONS})")
    arg("--chat-template", metavar="FILE", help="a Jinja2 chat template in Hugging Face's format for "
        "/v1/chat/completions (default: 'User: ...' / 'Assistant:' lines; see docs/serving.md)")
    return p


def _fail(message: str) -> int:
    print(f"inferno serve: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _missing_extra() -> str | None:
    missing = [name for name in _EXTRA if importlib.util.find_spec(name) is None]
    return ", ".join(missing) if missing else None


def _backend(args: argparse.Namespace):
    from inferno.backends.registry import get_backend

    if args.threads is not None:
        return get_backend(args.backend, threads=args.threads)
    return get_backend(args.backend)


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _logging() -> None:
    log = logging.getLogger("inferno.serve")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def run(argv: Sequence[str]) -> int:
    """``inferno serve`` with `argv` (the flags after ``serve``); returns the exit code."""
    args = _parser().parse_args(list(argv))
    missing = _missing_extra()
    if missing:
        return _fail(f"the server needs the serve extra (missing: {missing}): "
                     'pip install "inferno-gpt2[serve]"')

    from inferno.backends.registry import BackendOptionError, BackendUnavailableError, UnknownBackendError

    try:
        backend = _backend(args)
    except (UnknownBackendError, BackendUnavailableError, BackendOptionError) as exc:
        threads = args.threads is not None and isinstance(exc, BackendOptionError)
        flag = "--threads" if threads else "--backend"
        return _fail(f"{flag}: {exc}")
    template = None
    if args.chat_template is not None:
        from inferno.serve.chat_template import ChatTemplateError, read_chat_template

        try:
            template = read_chat_template(args.chat_template)
        except ChatTemplateError as exc:
            return _fail(f"--chat-template: {exc}")
    from inferno.hub import ModelNameError, parse_model_name

    try:  # the name is checked here; the files are found (or downloaded) as the model loads
        spec = parse_model_name(args.model_dir)
    except (ModelNameError, TypeError) as exc:
        return _fail(f"--model-dir: {exc}")
    if spec.kind == "folder" and not spec.path.is_dir():
        return _fail(f"--model-dir: {args.model_dir} is not a folder")
    model_id = args.served_model_name or spec.id
    try:
        sock = _listen(args.host, args.port)
    except OSError as exc:
        return _fail(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")

    import uvicorn

    from inferno.serve import create_app
    from inferno.serve.protocol import guarded_protocol

    _logging()
    config = ServeConfig(model_dir=args.model_dir, backend=backend, model_id=model_id, slots=args.slots,
                         queue=args.queue, prefill_chunk=args.prefill_chunk, api_key=args.api_key,
                         grace_seconds=args.grace_seconds, log_prompts=args.log_prompts,
                         header_timeout=args.timeout_headers or None, body_timeout=args.timeout_body or None,
                         max_connections=args.max_connections or None, chat_template=template)
    app = create_app(config)
    state = app.state.inferno

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame) -> None:
            state.begin_shutdown()
            super().handle_exit(sig, frame)

    # The streams get the grace period from us (then end as "cancelled"); uvicorn's own timeout is only
    # a backstop for connections that still will not close.
    server = Server(uvicorn.Config(app, log_level="info", access_log=False, lifespan="on",
                                   timeout_graceful_shutdown=int(math.ceil(args.grace_seconds)) + 5,
                                   http=guarded_protocol(config.header_timeout, config.max_connections)))

    def fatal() -> None:
        server.should_exit = True

    state.on_fatal = fatal
    host, port = sock.getsockname()[:2]
    logging.getLogger("inferno.serve").info(
        "inferno serve: listening on http://%s:%d (model %s loading; /health answers 200 when ready)",
        f"[{host}]" if ":" in host else host, port, model_id)
    # uvicorn re-raises the signal that stopped it once it has restored the previous handlers; make
    # those no-ops so that a SIGTERM or Ctrl-C shutdown ends with exit code 0, not a kill.
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: None)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        close = getattr(backend, "close", None)
        if close is not None:
            close()
    return EXIT_USAGE if state.status == "failed" else 0
