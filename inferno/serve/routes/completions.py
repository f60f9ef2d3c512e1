"""``POST /v1/completions``: OpenAI's legacy completions (`inferno.serve.serving_completions`)."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from inferno.serve.routes.common import ERRORS, MODEL_NOT_FOUND, QUEUE_FULL, new_router, serving
from inferno.serve.schemas import CompletionRequest, CompletionResponse
from inferno.serve.serving_completions import ServingCompletions
from inferno.serve.sse import event_schema

router = new_router()


@router.post("/v1/completions", response_model=CompletionResponse, responses={
    200: {"content": {"text/event-stream": {"schema": event_schema("CompletionResponse")}},
          "description": "A completion; with stream, Server-Sent Events: data: {chunk} ... data: [DONE]"},
    **ERRORS, **MODEL_NOT_FOUND, **QUEUE_FULL})
async def completions(body: CompletionRequest, request: Request,
                      completions: serving(ServingCompletions)) -> Response:
    """OpenAI's legacy completions (see `inferno.serve.serving_completions` for the conventions)."""
    return await completions.create(body, request)
