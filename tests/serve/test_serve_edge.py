"""The server's edge, in this process (Starlette's TestClient on `create_app`): unknown request fields
and models (OpenAI's 400 and 404), ``GET /v1/models/{id}``, JSON-only bodies (415), the Origin check and
CORS, no CDN-backed ``/docs``, the API key rules, the shutdown guard, the --slots memory check, the
playground's narrow-screen CSS and the package's exports (issue 39)."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import re
from types import SimpleNamespace

import numpy as np
import pytest
from starlette.testclient import TestClient

from inferno.serve import ServeConfig, create_app
from inferno.serve.middleware import ShutdownGuard

MODEL = "tiny-edge"
ALIAS = "acme/tiny-edge"
BODY = {"prompt": "a", "max_tokens": 1}


def _app(small_pipe, **config):
    config = {"slots": 2, **config}
    return create_app(ServeConfig(model_id=MODEL, model_aliases=(ALIAS,), download=False, **config),
                      pipeline=small_pipe)


@pytest.fixture(scope="module")
def client(small_pipe):
    with TestClient(_app(small_pipe)) as c:
        yield c


def _error(r, status: int, param: str | None, code: str | None, *needles: str) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["param"], error["code"]) == (param, code), error
    for needle in needles:
        assert needle in error["message"], error["message"]
    return error


# ------------------------------------------------------------------------------ fields and models


@pytest.mark.parametrize("path, body, field, hint", [
    ("/v1/completions", {**BODY, "temprature": 0}, "temprature", "did you mean 'temperature'?"),
    ("/v1/completions", {**BODY, "max_token": 3}, "max_token", "did you mean 'max_tokens'?"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "sed": 1},
     "sed", "did you mean 'seed'?"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "contnet": "hi"}], "max_tokens": 1},
     "messages[0].contnet", "did you mean 'content'?"),
    ("/v1/completions", {**BODY, "stream_options": {"include_usgae": True}}, "stream_options.include_usgae",
     "did you mean 'include_usage'?"),
    ("/tokenize", {"content": "a", "frobnicate": 1}, "frobnicate", "the fields: content, prompt"),
    ("/v1/inspect", {"prompt": "a", "layer": [0]}, "layer", "did you mean 'layers'?"),
])
def test_an_unknown_field_is_a_400_naming_it_with_a_hint(client, path, body, field, hint):
    _error(client.post(path, json=body), 400, field, None, field, "is not a field of this request", hint)


def test_openai_fields_not_implemented_are_accepted_off_and_refused_on(client):
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    off = {"store": False, "tool_choice": "none", "metadata": None, "parallel_tool_calls": True}
    assert client.post("/v1/chat/completions", json={**chat, **off}).status_code == 200
    back = {"role": "assistant", "content": "x", "refusal": None, "tool_calls": None}
    r = client.post("/v1/chat/completions", json={**chat, "messages": [*chat["messages"], back,
                                                                       *chat["messages"]]})
    assert r.status_code == 200, r.text
    _error(client.post("/v1/chat/completions", json={**chat, "store": True}), 400, "store", None,
           "does not support (only null or false)")
    _error(client.post("/v1/chat/completions", json={**chat, "audio": {"voice": "x"}}), 400, "audio", None,
           "does not support")


def test_a_model_this_server_does_not_serve_is_a_404(client):
    for name in (MODEL, ALIAS, None):
        r = client.post("/v1/completions", json={**BODY, "model": name})
        assert r.status_code == 200 and r.json()["model"] == MODEL, r.text
    _error(client.post("/v1/completions", json={**BODY, "model": "gpt-4o"}), 404, "model", "model_not_found",
           "'gpt-4o' does not exist", MODEL)
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "model": "tiny-edg"}
    _error(client.post("/v1/chat/completions", json=chat), 404, "model", "model_not_found")


def test_get_a_model_by_id(client):
    listed = client.get("/v1/models").json()["data"][0]
    assert client.get(f"/v1/models/{MODEL}").json() == listed
    assert client.get(f"/v1/models/{ALIAS}").json() == listed  # an id with "/", as Hub repo ids have
    _error(client.get("/v1/models/gpt2-xl"), 404, "model", "model_not_found", "gpt2-xl")
    assert "/v1/models/{model}" in client.get("/openapi.json").json()["paths"]


# ---------------------------------------------------------------------------------- JSON only


@pytest.mark.parametrize("headers", [{}, {"content-type": "text/plain"},
                                     {"content-type": "text/plain;charset=UTF-8"},
                                     {"content-type": "application/x-www-form-urlencoded"},
                                     {"content-type": "multipart/form-data; boundary=x"}])
def test_a_post_body_that_is_not_application_json_is_a_415(client, headers):
    # What a page on any site can send without a CORS preflight: fetch(url, {mode: "no-cors", body: blob}).
    r = client.post("/v1/completions", content=json.dumps(BODY).encode(), headers=headers)
    _error(r, 415, None, "unsupported_media_type", "Content-Type: application/json")
    assert r.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("kind", ["application/json", "application/json; charset=utf-8", "Application/JSON"])
def test_json_content_types_pass(client, kind):
    r = client.post("/v1/completions", content=json.dumps(BODY).encode(), headers={"content-type": kind})
    assert r.status_code == 200, r.text


# ----------------------------------------------------------------------------- Origin and CORS


def test_a_page_from_another_origin_is_refused_and_the_servers_own_page_is_not(client):
    for origin in ("http://evil.example", "null", "http://testserver.evil.example", "http://testserver:81"):
        r = client.post("/v1/completions", json=BODY, headers={"origin": origin})
        _error(r, 403, None, "origin_not_allowed", origin, "--allowed-origins")
        assert r.json()["error"]["type"] == "permission_error"
        assert "access-control-allow-origin" not in r.headers
    # The playground: its page came from this host, so its Origin is this host's.
    own = client.post("/v1/completions", json=BODY, headers={"origin": "http://testserver"})
    assert own.status_code == 200, own.text
    assert client.get("/health", headers={"origin": "http://evil.example"}).status_code == 403
    # No CORS without --allowed-origins: a preflight is refused.
    r = client.options("/v1/completions", headers={"origin": "http://evil.example",
                                                   "access-control-request-method": "POST"})
    assert r.status_code == 403


def test_allowed_origins_get_cors(small_pipe):
    app = _app(small_pipe, allowed_origins=("http://localhost:3000",), api_key="k3y")
    with TestClient(app) as c:
        pre = c.options("/v1/completions", headers={
            "origin": "http://localhost:3000", "access-control-request-method": "POST",
            "access-control-request-headers": "authorization,content-type"})
        assert pre.status_code == 200, pre.text
        assert pre.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert "authorization" in pre.headers["access-control-allow-headers"].lower()
        auth = {"origin": "http://localhost:3000", "authorization": "Bearer k3y"}
        r = c.post("/v1/completions", json=BODY, headers=auth)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
        # The page can read an error too (a wrong key).
        r = c.post("/v1/completions", json=BODY, headers={**auth, "authorization": "Bearer no"})
        assert r.status_code == 401 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
        r = c.post("/v1/completions", json=BODY, headers={**auth, "origin": "http://localhost:3001"})
        assert r.status_code == 403
    with TestClient(_app(small_pipe, allowed_origins=("*",))) as c:
        r = c.post("/v1/completions", json=BODY, headers={"origin": "https://anything.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"


def test_parse_origins():
    from inferno.serve.config import parse_origins

    assert parse_origins(["http://a:1, https://b/", "http://a:1", "*"]) == ("http://a:1", "https://b", "*")
    for bad in ("localhost:3000", "http://a/path", "ftp://a", "http://"):
        with pytest.raises(ValueError, match="is not an origin"):
            parse_origins([bad])


# ------------------------------------------------------------------------------------- docs


def test_no_cdn_backed_docs_pages_and_the_document_is_served(client):
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        assert client.get(path).status_code == 404
    assert client.get("/openapi.json").json()["info"]["title"] == "inferno"


# ------------------------------------------------------------------------------------ API key


@pytest.mark.parametrize("key", ["", " ", " k3y", "k3y\n", "\tk3y"])
def test_an_empty_or_padded_api_key_is_refused(small_pipe, key):
    with pytest.raises(ValueError, match="api_key"):
        create_app(ServeConfig(api_key=key), pipeline=small_pipe)


# -------------------------------------------------------------------------------- shutdown guard


def _run_guard(inner, settle: float = 0.0) -> list[dict]:
    """Run `inner` behind a ShutdownGuard whose grace period ends at once; the messages sent."""
    sent: list[dict] = []

    async def main() -> None:
        event = asyncio.Event()
        guard = ShutdownGuard(inner, grace_over=lambda: event, settle=settle)

        async def receive():
            await asyncio.sleep(3600)

        async def send(message):
            sent.append(message)

        call = asyncio.ensure_future(guard({"type": "http", "method": "POST", "path": "/v1/inspect"},
                                           receive, send))
        await asyncio.sleep(0.01)
        event.set()
        await asyncio.wait_for(call, 5)

    asyncio.run(main())
    return sent


def test_the_shutdown_guard_answers_503_for_a_request_still_waiting():
    abandoned = []

    async def waiting(scope, receive, send):  # a route awaiting a worker thread
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            abandoned.append(True)
            raise

    sent = _run_guard(waiting)
    assert sent[0]["status"] == 503
    assert dict(sent[0]["headers"])[b"content-type"] == b"application/json"
    error = json.loads(sent[1]["body"])["error"]
    assert error["type"] == "service_unavailable" and error["code"] == "shutting_down"
    assert abandoned == [True]


def test_the_shutdown_guard_leaves_a_started_response_alone():
    async def streaming(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await asyncio.sleep(0.1)
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    sent = _run_guard(streaming)
    assert [m.get("status") for m in sent] == [200, None] and sent[1]["body"] == b"data: [DONE]\n\n"


# ---------------------------------------------------------------------------------------- slots


def test_slots_that_cannot_fit_are_refused_naming_the_memory(small_pipe, monkeypatch):
    from inferno.kv import slot_bytes
    from inferno.serve import state

    each = slot_bytes(small_pipe.config)
    monkeypatch.setattr("inferno.models.weights.memory_limit", lambda: 1000 * each)
    state.check_slots_fit(small_pipe, 1000)  # exactly fits
    with pytest.raises(state.SlotsError) as info:
        state.check_slots_fit(small_pipe, 1001)
    message = str(info.value)
    assert message.startswith("--slots 1001: the KV cache needs ")
    assert re.search(r"needs [\d.]+ [TGM]B \([\d.]+ [TGM]B a slot × 1001 slots", message), message
    assert "but this machine has" in message and "lower --slots" in message
    with pytest.raises(state.SlotsError), TestClient(_app(small_pipe, slots=5000)):
        pass
    # Counted in the bytes of the cache the backend allocates (not its compute dtype): a float16 cache
    # takes half as much; a backend computing in float16 over a float32 cache, as much.
    def pipe(cache, compute):
        backend = SimpleNamespace(new_kv_cache=lambda *shape: (np.zeros(shape, cache),) * 2,
                                  dtype=np.dtype(compute))
        return SimpleNamespace(config=small_pipe.config, backend=backend)

    state.check_slots_fit(pipe(np.float16, np.float32), 2000)
    with pytest.raises(state.SlotsError):
        state.check_slots_fit(pipe(np.float32, np.float16), 2000)


# --------------------------------------------------------------------------- playground, package


def test_the_playground_fits_a_narrow_screen():
    # The lens table of a long text is ~900 px wide: at 485 px the page scrolled sideways. Its panel
    # (a flex item, as wide as its content unless told otherwise) must shrink and scroll inside.
    from inferno.serve.routes.playground import STATIC_DIR

    css = re.sub(r"/\*.*?\*/", "", (STATIC_DIR / "style.css").read_text(), flags=re.S)
    rules = {m.group(1).strip(): m.group(2) for m in re.finditer(r"([^{}]+)\{([^}]*)\}", css)}
    panel = rules[".inspect-panels figure"]
    for declaration in ("min-width: 0", "max-width: 100%", "overflow-x: auto"):
        assert declaration in panel, panel
    assert "minmax(min(" in rules["#heatmaps"]  # a heatmap column is never wider than its panel


def test_star_import_of_the_package_works():
    namespace: dict = {}
    exec("from inferno.serve import *", namespace)
    assert {"ServeConfig", "create_app"} <= set(namespace)


def test_serve_help_names_every_endpoint():
    from inferno.cli.serve import _parser

    text = _parser().format_help()
    for needle in ("/v1/completions", "/v1/chat/completions", "/v1/inspect", "/v1/models", "playground",
                   "/tokenize", "/metrics", "/health", "/openapi.json", "--api-key-file", "INFERNO_API_KEY",
                   "--allowed-origins"):
        assert needle in text, needle


# ----------------------------------------------------------------------------------- disconnects


class RequestCancelledError(Exception):
    """Named as Ray Serve's (ray.serve.exceptions): what a request sees when Serve cancels it because
    its client disconnected."""


def test_client_gone_knows_the_ways_a_client_leaves():
    import builtins

    from inferno.serve.middleware import client_gone

    # Built in from Python 3.11; anyio's backport before.
    group = getattr(builtins, "ExceptionGroup", None) or pytest.importorskip("exceptiongroup").ExceptionGroup
    gone = [asyncio.CancelledError(), ConnectionResetError(), BrokenPipeError(), RequestCancelledError("x"),
            group("g", [RequestCancelledError(), ConnectionResetError()])]
    assert all(client_gone(e) for e in gone)
    from starlette.requests import ClientDisconnect

    assert client_gone(ClientDisconnect())
    for bug in (ValueError("x"), RuntimeError(), group("g", [RequestCancelledError(), KeyError()])):
        assert not client_gone(bug)


def test_a_request_cancelled_as_ray_serve_cancels_it_is_one_disconnected_line(small_pipe, caplog):
    app = _app(small_pipe)

    async def cancelled_by_serve():
        raise RequestCancelledError("Request abc was cancelled.")

    async def a_real_bug():
        raise ZeroDivisionError("x")

    app.add_api_route("/v1/cancelled", cancelled_by_serve, methods=["GET"])
    app.add_api_route("/v1/bug", a_real_bug, methods=["GET"])
    caplog.set_level(logging.INFO, logger="inferno.serve")
    # No exception from the app (what Serve would log with its traceback); no response (nobody reads it).
    with TestClient(app, raise_server_exceptions=True) as c:
        logging.getLogger("inferno.serve").propagate = True  # the CLI turns it off; caplog needs it
        caplog.clear()
        with pytest.raises(AssertionError, match="did not receive any response"):
            c.get("/v1/cancelled")
        lines = [rec.getMessage() for rec in caplog.records]
        assert len(lines) == 1, lines
        assert re.search(r'"GET /v1/cancelled" - disconnected \d+\.\d{3}s$', lines[0]), lines
        assert not any(rec.exc_info for rec in caplog.records)
    with TestClient(app, raise_server_exceptions=False) as c:
        caplog.clear()
        assert c.get("/v1/bug").status_code == 500  # a bug is still one
        bug = [rec for rec in caplog.records if "internal error on GET /v1/bug" in rec.getMessage()]
        assert bug and bug[0].exc_info


def test_a_cancelled_task_ends_quietly_and_the_access_log_says_disconnected(caplog):
    from inferno.serve.middleware import AccessLog, QuietDisconnects

    async def cancelled(scope, receive, send):  # Ray Serve cancels the request's task
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise asyncio.CancelledError

    logger = logging.getLogger("test-quiet-disconnects")
    app = QuietDisconnects(AccessLog(cancelled, logger))

    async def send(message):
        pass

    caplog.set_level(logging.INFO, logger=logger.name)
    asyncio.run(app({"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}, None, send))
    [line] = [rec.getMessage() for rec in caplog.records]
    assert re.search(r'^- "POST /v1/completions" 200 disconnected \d+\.\d{3}s$', line), line

    async def broken(scope, receive, send):
        raise ValueError("a bug")

    with pytest.raises(ValueError):
        asyncio.run(QuietDisconnects(broken)({"type": "http"}, None, send))


class TaskCancelledError(Exception):
    """Named as Ray's `ray.exceptions.TaskCancelledError`, which `client_gone` knows by name."""


def _cancel_guard_while_receiving(fails_with: type[BaseException]) -> list[dict]:
    """A request cancelled from outside (as Ray Serve cancels one whose client left) while its route waits
    in receive(), which then raises `fails_with` (as Ray's does); what asyncio's exception handler got."""
    reported: list[dict] = []

    async def route(scope, receive, send):
        await receive()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: reported.append(context))
        guard = ShutdownGuard(route, grace_over=lambda: asyncio.Event())

        async def receive():
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                raise fails_with("the request was cancelled") from None

        call = asyncio.ensure_future(guard({"type": "http", "method": "POST", "path": "/v1/completions"},
                                           receive, None))
        await asyncio.sleep(0.01)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        for _ in range(3):  # the route's task ends, its callbacks run, it is collected
            await asyncio.sleep(0.01)
            gc.collect()

    asyncio.run(main())
    return reported


def test_a_request_cancelled_as_its_client_leaves_logs_no_unread_task_exception():
    # Before: the route's task ended with TaskCancelledError after the guard was cancelled, and asyncio
    # logged "Task exception was never retrieved" with its traceback (a Ray Serve test caught it).
    assert _cancel_guard_while_receiving(TaskCancelledError) == []


def test_a_real_error_after_a_cancellation_is_logged_not_lost(caplog):
    caplog.set_level(logging.ERROR, logger="inferno.serve")
    assert _cancel_guard_while_receiving(ValueError) == []
    [record] = [r for r in caplog.records if r.name == "inferno.serve"]
    assert "after it was cancelled" in record.getMessage() and isinstance(record.exc_info[1], ValueError)


def test_a_route_error_the_guard_passes_on_is_not_logged_again(caplog):
    # The guard's caller gets the route's own error as before; the guard logs nothing of its own.
    caplog.set_level(logging.ERROR, logger="inferno.serve")

    async def route(scope, receive, send):
        raise ValueError("the route failed")

    async def main() -> None:
        guard = ShutdownGuard(route, grace_over=lambda: asyncio.Event())
        with pytest.raises(ValueError, match="the route failed"):
            await guard({"type": "http", "method": "POST", "path": "/v1/completions"}, None, None)
        await asyncio.sleep(0.01)

    asyncio.run(main())
    assert not [r for r in caplog.records if r.name == "inferno.serve"]
