"""One ``/v1/chat/completions`` request: its messages through the chat template to one prompt, then the
completions machinery (`inferno.serve.completions`) with chat's shapes.

    messages ─▶ ChatTemplate.render ─▶ prompt ─▶ Plan (the template's stops added) ─▶ Completion
             ─▶ ChatFormat: chat.completion, or chat.completion.chunk events

Conventions (where OpenAI leaves room, as vLLM does):

* ``max_completion_tokens`` wins over ``max_tokens``; with neither, a reply may run to the context's end.
* ``logprobs: true`` gives each new token's ``token``, ``logprob``, ``bytes`` and ``top_logprobs``
  (``top_logprobs`` N of them, most likely first; 0 when not given). Token texts and the -9999 floor are
  as in completions; ``bytes`` are the token's own bytes.
* A stream sends each choice's role first (``delta: {"role": "assistant", "content": ""}``), then its
  text, then an empty delta with its finish reason; with ``stream_options.include_usage`` a last chunk
  with no choices and the usage. Choice j samples with ``seed + j``.
* The template's stop strings count against the 16 of ``stop``.
"""

from __future__ import annotations

from typing import Any

from inferno.options import MAX_STOP_STRINGS, TokenLogprob
from inferno.serve.chat_template import ChatTemplate, ChatTemplateError, message_text
from inferno.serve.completions import (
    Format,
    Plan,
    TokenTexts,
    check_n,
    choice_options,
    clamp_logprob,
    include_usage,
)
from inferno.serve.errors import ApiError
from inferno.serve.schemas import ChatCompletionRequest


def plan_chat(req: ChatCompletionRequest, template: ChatTemplate, *, eos_id: int, sample_limit: int,
              slots: int, context: int) -> Plan:
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
    options = choice_options(req, n=n, logprobs=logprobs, sample_limit=sample_limit,
                             extra_stop=template.stops)
    max_tokens = req.max_completion_tokens or req.max_tokens or context
    return Plan([prompt], options, max_tokens, () if req.ignore_eos else (eos_id,), False, logprobs,
                bool(req.stream), include_usage(req))


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

    def token_logprobs(self, t: TokenLogprob, text_offset: int) -> list[dict]:
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
