"""``POST /v1/completions``: OpenAI's legacy completions (see `inferno.serve.completions` for the
conventions where OpenAI leaves room)."""

from __future__ import annotations

import time

from fastapi import Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from inferno.serve.completions import Completion, encode_prompts, plan_request
from inferno.serve.routes.common import ERRORS, QUEUE_FULL, log_info, new_router, respond
from inferno.serve.schemas import CompletionRequest, CompletionResponse
from inferno.serve.sse import event_schema
from inferno.serve.state import State

router = new_router()


async def completions(body: CompletionRequest, request: Request, state: State) -> Response:
    """OpenAI's legacy completions (see `inferno.serve.completions` for the conventions)."""
    started = time.perf_counter()
    pipe = state.require()
    engine = state.engine
    assert engine is not None and state.texts is not None
    if state.config.log_prompts:
        log_info(request)["prompt"] = body.prompt
    eos = pipe.config.eos_token_id
    plan = plan_request(body, eos_id=eos, sample_limit=pipe.sample_limit, slots=engine.slots.n_slots,
                        queue=state.config.queue)
    await run_in_threadpool(encode_prompts, plan, pipe.tokenizer, eos_id=eos,
                            sample_limit=pipe.sample_limit, context=pipe.config.n_positions)
    echoes = await run_in_threadpool(state.echoes, plan) if plan.echo else None
    handles = state.submit(plan)
    completion = Completion(plan, handles, echoes, state.texts, state.config.model_id, state.metrics, started)
    return await respond(state, request, completion, plan.stream)

router.add_api_route("/v1/completions", completions, methods=["POST"], response_model=CompletionResponse,
                     responses={
    200: {"content": {"text/event-stream": {"schema": event_schema("CompletionResponse")}},
          "description": "A completion; with stream, Server-Sent Events: data: {chunk} ... data: [DONE]"},
    **ERRORS, **QUEUE_FULL})
