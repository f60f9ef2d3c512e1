"""``POST /v1/chat/completions``: OpenAI's chat completions (`inferno.serve.serving_chat`)."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from inferno.serve.routes.common import ERRORS, MODEL_NOT_FOUND, QUEUE_FULL, new_router, serving
from inferno.serve.schemas import ChatCompletionRequest, ChatCompletionResponse
from inferno.serve.serving_chat import ServingChat
from inferno.serve.sse import event_schema

router = new_router()


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses={
    200: {"content": {"text/event-stream": {"schema": event_schema("ChatCompletionChunk")}},
          "description": "A chat completion; with stream, Server-Sent Events: data: {chunk} ... "
                         "data: [DONE]"},
    **ERRORS, **MODEL_NOT_FOUND, **QUEUE_FULL})
async def chat_completions(body: ChatCompletionRequest, request: Request,
                           chat: serving(ServingChat)) -> Response:
    """OpenAI's chat completions: the messages become one prompt through the chat template."""
    return await chat.create(body, request)
