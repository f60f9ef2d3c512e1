"""``POST /v1/chat/completions``: OpenAI's chat completions, one request's flow: the conversation becomes
one prompt through the chat template, then it runs as a completion does, with chat's shapes.

    messages ─▶ ChatTemplate.render ─▶ prompt ─▶ Plan (the template's stops added) ─▶ encode_prompts
             ─▶ Engine.submit_many ─▶ Completion ─▶ ChatFormat: chat.completion, or chunk events

Conventions (where OpenAI leaves room, as vLLM does):

* ``max_completion_tokens`` wins over ``max_tokens``; with neither, a reply may run to the context's end.
  One that does not fit the context after the prompt is refused (400, ``context_length_exceeded``).
* ``logprobs: true`` gives each new token's ``token``, ``logprob``, ``bytes`` and ``top_logprobs``
  (``top_logprobs`` N of them, most likely first; 0 when not given). Token texts and the -9999 floor are
  as in completions; ``bytes`` are the token's own bytes.
* A stream sends each choice's role first (``delta: {"role": "assistant", "content": ""}``), then its
  text, then an empty delta with its finish reason; with ``stream_options.include_usage`` a last chunk
  with no choices and the usage. Choice j samples with ``seed + j``.
* The template's stop strings count against the 16 of ``stop``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from inferno.chat_template import ChatTemplate, ChatTemplateError, message_text
from inferno.options import MAX_STOP_STRINGS, TokenLogprob
from inferno.serve.constraints import request_constraint
from inferno.serve.errors import ApiError
from inferno.serve.planning import Plan, check_n, choice_options, encode_prompts, include_usage
from inferno.serve.running import Format
from inferno.serve.schemas import ChatCompletionRequest
from inferno.serve.serving import Serving
from inferno.serve.token_texts import TokenTexts, clamp_logprob


def plan_chat(req: ChatCompletionRequest, template: ChatTemplate, *, eos_ids: Sequence[int],
              sample_limit: int, slots: int, context: int) -> Plan:
    """The conversation as one prompt and the options of its n choices; an `ApiError` names the field."""
    n = check_n(req, slots)
    if req.top_logprobs is not None and not req.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    user_stops = 1 if isinstance(req.stop, str) else len(req.stop or ())
    if user_stops + len(template.stops) > MAX_STOP_STRINGS:
        own = len(template.stops)
        raise ApiError(400, f"stop may hold at most {MAX_STOP_STRINGS - own} strings here (the chat template "
                       f"ends a reply at {own} of its own); got {user_stops}", param="stop")
    messages = [{"role": m.role, "content": message_text(m.content)} for m in req.messages]
    try:
        prompt = template.render(messages)
    except ChatTemplateError as exc:
        raise ApiError(400, str(exc), param="messages") from None
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    constraint = request_constraint(req)
    options = choice_options(req, n=n, logprobs=logprobs, sample_limit=sample_limit,
                             extra_stop=template.stops, constraint=constraint)
    asked = "max_completion_tokens" if req.max_completion_tokens else "max_tokens" if req.max_tokens else None
    max_tokens = req.max_completion_tokens or req.max_tokens or context
    return Plan([prompt], options, max_tokens, () if req.ignore_eos else tuple(eos_ids), False, logprobs,
                bool(req.stream), include_usage(req), max_tokens_field=asked, constraint=constraint)


class ServingChat(Serving):
    """``/v1/chat/completions`` for one app."""

    async def create(self, body: ChatCompletionRequest, request: Request) -> Response:
        """The reply to `body`'s conversation: a stream or one response (see the module's conventions)."""
        started = time.perf_counter()
        state = self.state
        pipe = state.require(model=body.model)
        assert state.engine is not None and state.texts is not None and state.chat_template is not None
        if state.config.log_prompts:
            self.log(request, prompt=[m.model_dump(exclude_none=True) for m in body.messages])
        context = pipe.config.n_positions
        # Off the event loop: a template renders in Jinja, and a constraint compiles.
        plan = await run_in_threadpool(plan_chat, body, state.chat_template, eos_ids=pipe.eos_ids,
                                       sample_limit=pipe.sample_limit, slots=state.engine.slots.n_slots,
                                       context=context)
        await run_in_threadpool(encode_prompts, plan, pipe.tokenizer, eos_id=pipe.empty_prompt_id,
                                sample_limit=pipe.sample_limit, context=context, field="messages")
        return await self.run(request, plan, None, ChatFormat(state.texts), started)


class ChatFormat(Format):
    """Chat's shapes of the same choices: a message per choice, deltas when streaming, and logprobs as
    a list of entries."""

    id_prefix = "chatcmpl-"
    object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def __init__(self, texts: TokenTexts) -> None:
        super().__init__(texts)

    def _entry(self, i: int, logprob: float) -> dict:
        return {"token": self.texts[i], "logprob": clamp_logprob(logprob),
                "bytes": list(self.texts.bytes_of(i))}

    def token_logprobs(self, t: TokenLogprob, text_offset: int, forced: bool = False) -> list[dict]:
        return [{**self._entry(t.id, t.logprob), "top_logprobs": [self._entry(i, lp) for i, lp in t.top]}]

    def empty_logprobs(self) -> list:
        return []

    def extend(self, lps: Any, more: Any) -> None:
        lps.extend(more)

    def opening(self, index: int) -> dict:
        return {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                "finish_reason": None}

    def chunk_choice(self, index: int, text: str, lp: Any, finish_reason: str | None) -> dict:
        return {"index": index, "delta": {"content": text} if text else {},
                "logprobs": None if lp is None else {"content": lp}, "finish_reason": finish_reason}

    def choice(self, index: int, text: str, lps: Any, finish_reason: str | None) -> dict:
        return {"index": index, "message": {"role": "assistant", "content": text},
                "logprobs": None if lps is None else {"content": lps}, "finish_reason": finish_reason}
