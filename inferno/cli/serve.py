"""``inferno serve``: parse the flags, bind the socket, run uvicorn; the model loads in the background.

    inferno serve -m gpt2 --port 8000 --slots 16 --queue 256

Exit codes: 0 after a clean shutdown (SIGTERM or Ctrl-C: running requests get --grace-seconds to
finish), 2 for usage errors (an empty API key among them), a missing ``serve`` extra, a port that
cannot be bound, a model that fails to load, or --slots whose KV cache cannot fit in memory.
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

from inferno.cli._args import (
    EXIT_USAGE,
    Number,
    Parser,
    add_model_args,
    add_speculation_args,
    non_negative,
    positive,
    speculation_error,
)
from inferno.engine import DEFAULT_PREFILL_CHUNK, DEFAULT_QUEUE, DEFAULT_SLOTS
from inferno.serve.config import BODY_TIMEOUT, HEADER_TIMEOUT, MAX_CONNECTIONS, ServeConfig, parse_origins

_EXTRA = ("fastapi", "uvicorn", "sse_starlette", "prometheus_client")


_port = Number(int, lambda v: 0 <= v <= 65535, "a port number in [0, 65535]")
_seconds = Number(float, lambda v: math.isfinite(v) and v >= 0, "a number of seconds >= 0")


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="inferno serve", description="Serve the model over HTTP: an OpenAI-compatible API "
               "and a playground page.", epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    arg("--no-prefix-cache", action="store_true",
        help="prefill every prompt in full (no automatic prefix caching of the KV slots)")
    add_speculation_args(p)
    arg("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY' on every route but /health, "
        "/openapi.json and the playground's page (also from --api-key-file or $INFERNO_API_KEY; the flag "
        "is visible in ps)")
    arg("--api-key-file", metavar="PATH", help="read the API key from this file (one line)")
    arg("--allowed-origins", metavar="ORIGINS", action="append", default=[],
        help="web pages of these origins may call the API from a browser (CORS), e.g. "
        "http://localhost:3000; comma-separated or repeated; * for any. Default: none (only the "
        "server's own playground)")
    arg("--grace-seconds", metavar="S", type=_seconds, default=10.0,
        help="on SIGTERM, running requests may finish for S seconds (10), then end with finish_reason "
        "'abort' (requests not yet answering: 503)")
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
    arg("--max-inspections", metavar="N", type=positive, default=2, help="/v1/inspect requests run at "
        "once (2); beyond, 429 with Retry-After")
    arg("--chat-template", metavar="FILE", help="a Jinja2 chat template in Hugging Face's format for "
        "/v1/chat/completions (default: 'User: ...' / 'Assistant:' lines; see docs/serving.md)")
    return p


_EPILOG = """\
endpoints:
  POST /v1/completions       OpenAI completions: streaming, n, logprobs, echo, stop, seed
  POST /v1/chat/completions  OpenAI chat completions (--chat-template), streaming
  GET  /v1/models[/ID]       the served model (--served-model-name)
  POST /v1/inspect           attention weights and the logit lens of a prompt (extension)
  POST /tokenize, /detokenize; GET /tokenizer_info
  GET  /health               200 when ready (no API key needed), 503 while loading or stopping
  GET  /metrics              Prometheus metrics
  GET  /openapi.json         the API's OpenAPI document
  GET  /                     the playground: generate, score and look inside, in a browser

API key: --api-key, else --api-key-file, else $INFERNO_API_KEY; none: an open API.
See docs/serving.md for every request field and its default.
"""

#: The environment variable that gives the API key when neither flag does.
API_KEY_ENV = "INFERNO_API_KEY"


def _api_key(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(the key or None, an error message or None): from --api-key, --api-key-file or $INFERNO_API_KEY,
    in that order; a key that is empty or padded with whitespace is refused, naming where it came from."""
    import os

    from inferno.serve.config import api_key_problem

    if args.api_key is not None and args.api_key_file is not None:
        return None, "--api-key and --api-key-file: give one of them"
    if args.api_key is not None:
        key, source = args.api_key, "--api-key"
    elif args.api_key_file is not None:
        source = f"--api-key-file {args.api_key_file}"
        try:
            with open(args.api_key_file, encoding="utf-8") as f:
                key = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            return None, f"{source}: cannot read it: {getattr(exc, 'strerror', None) or exc}"
        # The one newline a file's last line ends with is not part of the key.
        key = key[:-2] if key.endswith("\r\n") else key[:-1] if key.endswith("\n") else key
    elif API_KEY_ENV in os.environ:
        key, source = os.environ[API_KEY_ENV], f"${API_KEY_ENV}"
    else:
        return None, None
    problem = api_key_problem(key)
    return (None, f"{source}: {problem}") if problem else (key, None)


def _model_aliases(name: str | None, spec) -> tuple[str, ...]:
    """The names a request's ``model`` may give besides the served id: --model-dir as given, and the
    model's own id (a Hub repo id also without its @revision)."""
    names = [spec.id]
    if name:
        names.append(name)
    if spec.kind == "hub" and spec.repo_id:
        names.append(spec.repo_id)
    return tuple(dict.fromkeys(names))


def _exit_now_if_workers_remain(code: int) -> int:
    """A worker thread still computing (an inspection or a scoring whose client got its 503) would keep
    the interpreter from exiting until it finishes; the server is done, so leave without it."""
    import os

    me = threading.current_thread()
    busy = [t for t in threading.enumerate() if t is not me and not t.daemon and t.is_alive()]
    if busy:
        logging.getLogger("inferno.serve").info("inferno serve: %d worker thread(s) still busy; exiting "
                                                "without them", len(busy))
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


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
    api_key, problem = _api_key(args)
    if problem:
        return _fail(problem)
    try:
        origins = parse_origins(args.allowed_origins)
    except ValueError as exc:
        return _fail(f"--allowed-origins: {exc}")
    from inferno.speculative import SpeculationError, check_settings

    try:  # what can be checked before the models load (the draft model's tokenizer is checked then)
        check_settings(args.speculate, args.draft_model is not None, args.num_speculative_tokens)
    except SpeculationError as exc:
        return _fail(str(speculation_error(exc, args)))
    template = None
    if args.chat_template is not None:
        from inferno.chat_template import ChatTemplateError, load_chat_template

        try:
            template = load_chat_template(args.chat_template)
        except ChatTemplateError as exc:
            return _fail(f"--chat-template: {exc}")
    from inferno.models.names import ModelNameError, parse_model_name

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
                         queue=args.queue, prefill_chunk=args.prefill_chunk, api_key=api_key,
                         grace_seconds=args.grace_seconds, log_prompts=args.log_prompts,
                         header_timeout=args.timeout_headers or None, body_timeout=args.timeout_body or None,
                         max_connections=args.max_connections or None, chat_template=template,
                         model_aliases=_model_aliases(args.model_dir, spec), allowed_origins=origins,
                         max_inspections=args.max_inspections, prefix_cache=not args.no_prefix_cache,
                         speculative=args.speculate, draft_model=args.draft_model,
                         num_speculative_tokens=args.num_speculative_tokens)
    app = create_app(config)
    state = app.state.inferno

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame) -> None:
            state.begin_shutdown()
            super().handle_exit(sig, frame)

    # The streams get the grace period from us (then end as "abort"), requests waiting on a worker a 503
    # a second later (middleware.ShutdownGuard); uvicorn's own timeout is only a backstop for
    # connections that still will not close.
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
    return _exit_now_if_workers_remain(EXIT_USAGE if state.status == "failed" else 0)
