"""``POST /v1/completions``: OpenAI's legacy completions, one request's flow from its fields to its
answer.

    request ─▶ plan (fields → GenerationOptions, one per choice of a prompt) ─▶ encode_prompts
            ─▶ Engine.submit_many per prompt (an echo's prompt scored as it is prefilled) ─▶ Completion
            ─▶ Completion.stream() (SSE chunks) or Completion.collect() (one response)

Conventions (where OpenAI leaves room, as vLLM does; see also `inferno.serve.planning`,
`inferno.serve.token_texts` and `inferno.serve.running`):

* Choice ``index`` is ``prompt_index * n + j``; choice j of every prompt samples with ``seed + j``.
* ``max_tokens`` defaults to 16; ``max_tokens`` 0 is only allowed with ``echo`` (the prompt's logprobs,
  nothing generated). A prompt and ``max_tokens`` that do not fit the context together are refused
  (400, ``context_length_exceeded``), as OpenAI does; the default 16 is bounded by the context.
* ``top_logprobs`` holds the N most likely tokens, most likely first, plus the chosen token when it is
  not among them, with the very float of ``token_logprobs``.
* The prompt's logprobs (``echo``) are the engine's, computed as it prefills the prompt
  (`inferno.serve.echo`), equal to `Pipeline.score`'s to float32 rounding; the first token has none
  (null in both lists). The new tokens' are the engine's (`GenerationOptions.logprobs`): the raw
  model distribution, before penalties and temperature.
* Extension ``return_token_ids: true`` (default false, so OpenAI's shape is unchanged): with
  ``logprobs``, the logprobs object also has ``token_ids`` (each token's id, parallel to ``tokens``)
  and ``top_token_ids`` (per token, the ids of its ``top_logprobs`` entries in their order, the chosen
  token last when it is not among the top N; null where ``top_logprobs`` is). The playground uses them
  to show ids: token texts alone cannot be mapped back to ids by a client without the vocabulary.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from fastapi import Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from inferno.serve.constraints import request_constraint
from inferno.serve.echo import echo_parts
from inferno.serve.errors import ApiError
from inferno.serve.planning import Plan, check_n, choice_options, encode_prompts, include_usage
from inferno.serve.schemas import CompletionRequest
from inferno.serve.serving import Serving

DEFAULT_MAX_TOKENS = 16


def plan_request(req: CompletionRequest, *, eos_ids: Sequence[int], sample_limit: int, slots: int,
                 queue: int) -> Plan:
    """Check what the schema cannot (unsupported fields, option rules, engine limits) and build the
    options; an `ApiError` (400) names the field."""
    # (best_of other than 1 and a suffix are refused by the schema.)
    n = check_n(req, slots)
    echo = bool(req.echo)
    max_tokens = DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
    if max_tokens == 0 and not echo:
        raise ApiError(400, "max_tokens must be at least 1 (0 is allowed with echo: the prompt only)",
                       param="max_tokens")

    p = req.prompt
    if not p and not isinstance(p, str):  # the schema says so too
        raise ApiError(400, "prompt must not be an empty list", param="prompt")
    if isinstance(p, str):
        prompts: list[str | list[int]] = [p]
    elif isinstance(p[0], (str, list)):
        prompts = list(p)
    else:
        prompts = [list(p)]
    if len(prompts) > queue:
        raise ApiError(400, f"at most {queue} prompts per request (the wait queue holds {queue}, --queue); "
                       f"got {len(prompts)}", param="prompt")
    constraint = request_constraint(req)
    options = choice_options(req, n=n, logprobs=req.logprobs, sample_limit=sample_limit,
                             constraint=constraint)
    return Plan(prompts, options, max_tokens, () if req.ignore_eos else tuple(eos_ids), echo, req.logprobs,
                bool(req.stream), include_usage(req), bool(req.return_token_ids),
                max_tokens_field=None if req.max_tokens is None else "max_tokens", constraint=constraint)


class ServingCompletions(Serving):
    """``/v1/completions`` for one app."""

    async def create(self, body: CompletionRequest, request: Request) -> Response:
        """The completion of `body`: a stream or one response (see the module's conventions)."""
        started = time.perf_counter()
        state = self.state
        pipe = state.require(model=body.model)
        assert state.engine is not None and state.texts is not None
        if state.config.log_prompts:
            self.log(request, prompt=body.prompt)
        limit = pipe.sample_limit
        # Off the event loop: a constraint compiles.
        plan = await run_in_threadpool(plan_request, body, eos_ids=pipe.eos_ids, sample_limit=limit,
                                       slots=state.engine.slots.n_slots, queue=state.config.queue)
        # An empty prompt is the model's BOS where it has one (Pipeline.empty_prompt_id), else the EOS.
        await run_in_threadpool(encode_prompts, plan, pipe.tokenizer, eos_id=pipe.empty_prompt_id,
                                sample_limit=limit, context=pipe.config.n_positions)
        echoes = await run_in_threadpool(echo_parts, plan, pipe.tokenizer) if plan.echo else None
        return await self.run(request, plan, echoes, None, started)
