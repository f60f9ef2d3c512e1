"""schemathesis against /openapi.json: whatever it sends (valid and invalid), no 5xx, and every answer
has a declared status, content type and schema."""

from __future__ import annotations

import json

import pytest
from serve_helpers import running, sse_data

from inferno.serve.schemas import ChatCompletionChunk, CompletionResponse, ErrorResponse

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

MAX_EXAMPLES = 50  # per operation and generation mode: bounded, deterministic (derandomized) runs
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]

# (method, path, examples, mode): the operations with a body get valid and invalid bodies; the others
# have no inputs, so a few calls say all there is.
_BODIES = [("POST", path) for path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize",
                                       "/v1/inspect")]
_GETS = [("GET", path) for path in ("/v1/models", "/health", "/tokenizer_info", "/metrics")]
# Chat's valid requests run to the context's end unless they set max_tokens: fewer of them.
OPERATIONS = [(m, p, MAX_EXAMPLES // 2 if p == "/v1/chat/completions" and mode == GenerationMode.POSITIVE
               else MAX_EXAMPLES, mode) for m, p in _BODIES
              for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)]
OPERATIONS += [(m, p, 3, GenerationMode.POSITIVE) for m, p in _GETS]


@pytest.fixture(scope="module")
def server(small_model_dir, tmp_path_factory):
    # Few slots and a short queue, so that large n and many prompts meet their 400s and 429s too.
    flags = ("--slots", "4", "--queue", "4")
    with running(small_model_dir, *flags, home=tmp_path_factory.mktemp("schema")) as s:
        yield s


@pytest.fixture(scope="module")
def api_schema(server):
    return schemathesis.openapi.from_url(server.url + "/openapi.json")


def check_stream(text: str, path: str) -> None:
    """Every event of a stream is a chunk (or an error) of the declared shape, then [DONE]: schemathesis
    checks each event's form, not the JSON inside its data."""
    events = list(sse_data(iter(text.split("\n"))))
    assert events and events[-1] == "[DONE]", text[-300:]
    for data in events[:-1]:
        obj = json.loads(data)
        if "error" in obj:
            ErrorResponse.model_validate(obj)
        elif path == "/v1/chat/completions":
            ChatCompletionChunk.model_validate(obj)
            assert obj["object"] == "chat.completion.chunk" and len(obj["choices"]) <= 1
        else:
            CompletionResponse.model_validate(obj)
            assert obj["object"] == "text_completion" and len(obj["choices"]) <= 1


# schemathesis' own pytest integration (`schemathesis.pytest.from_fixture`) does not run under pytest 9
# ("'Function' object has no attribute '_nodeid'"): drive its Hypothesis strategies directly instead.
@pytest.mark.parametrize("method, path, examples, mode", OPERATIONS,
                         ids=[f"{m} {p} {mode}" for m, p, _, mode in OPERATIONS])
@pytest.mark.slow
def test_api_conforms_to_its_schema(api_schema, server, method, path, examples, mode):
    operation = api_schema[path][method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case):
        response = case.call_and_validate(base_url=server.url, checks=CHECKS, timeout=60)
        if "text/event-stream" in str(response.headers.get("content-type")):
            check_stream(response.text, path)

    run()


def test_the_document_declares_the_routes(server):
    import httpx

    doc = httpx.get(server.url + "/openapi.json", timeout=30).json()
    paths = doc["paths"]
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/tokenize",
                 "/detokenize", "/tokenizer_info", "/metrics", "/v1/inspect"):
        assert path in paths
    completions = paths["/v1/completions"]["post"]["responses"]
    assert "text/event-stream" in completions["200"]["content"]
    assert {"400", "413", "429", "503"} <= set(completions) and "422" not in completions
