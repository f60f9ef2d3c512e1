"""``POST /v1/chat/completions``: OpenAI's chat completions, through the chat template (see
`inferno.serve.chat` for the conventions and `inferno.serve.chat_template` for the template)."""

from __future__ import annotations

import time

from fastapi import Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from inferno.serve.chat import ChatFormat, plan_chat
from inferno.serve.completions import Completion, encode_prompts
from inferno.serve.routes.common import ERRORS, QUEUE_FULL, log_info, new_router, respond
from inferno.serve.schemas import ChatCompletionRequest, ChatCompletionResponse
from inferno.serve.sse import event_schema
from inferno.serve.state import State

router = new_router()


async def chat_completions(body: ChatCompletionRequest, request: Request, state: State) -> Response:
    """OpenAI's chat completions: the messages become one prompt through the chat template."""
    started = time.perf_counter()
    pipe = state.require()
    engine = state.engine
    assert engine is not None and state.texts is not None and state.chat_template is not None
    if state.config.log_prompts:
        log_info(request)["prompt"] = [m.model_dump(exclude_none=True) for m in body.messages]
    eos, context = pipe.config.eos_token_id, pipe.config.n_positions
    plan = plan_chat(body, state.chat_template, eos_id=eos, sample_limit=pipe.sample_limit,
                     slots=engine.slots.n_slots, context=context)
    await run_in_threadpool(encode_prompts, plan, pipe.tokenizer, eos_id=eos, sample_limit=pipe.sample_limit,
                            context=context, field="messages")
    handles = state.submit(plan)
    completion = Completion(plan, handles, None, state.texts, state.config.model_id, state.metrics, started,
                            ChatFormat(state.texts))
    return await respond(state, request, completion, plan.stream)

router.add_api_route("/v1/chat/completions", chat_completions, methods=["POST"],
                     response_model=ChatCompletionResponse, responses={
    200: {"content": {"text/event-stream": {"schema": event_schema("ChatCompletionChunk")}},
          "description": "A chat completion; with stream, Server-Sent Events: data: {chunk} ... "
                         "data: [DONE]"},
    **ERRORS, **QUEUE_FULL})
