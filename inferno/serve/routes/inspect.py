"""``POST /v1/inspect`` (an extension): what every layer and head attends to, and what every layer would
predict (the logit lens), for one prompt; see `inferno.inspect`.

Token texts are written as the completions' ``logprobs`` write them (``bytes:\\xNN`` for a token that is
not UTF-8 on its own). A text prompt is encoded as ``/v1/completions`` encodes it. The attention
weights are rounded to 4 decimals; a response holds at most `MAX_INSPECT_WEIGHTS` of them (ask for
fewer ``layers`` or ``heads`` beyond that).
"""

from __future__ import annotations

import numpy as np
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from inferno.inspect import Inspection, InspectionError, subset
from inferno.serve.errors import ApiError
from inferno.serve.routes.common import ERRORS, new_router
from inferno.serve.schemas import MAX_INSPECT_WEIGHTS, InspectRequest, InspectResponse
from inferno.serve.state import State

router = new_router()

DEFAULT_TOP = 5


async def inspect(body: InspectRequest, state: State) -> JSONResponse:
    """Attention weights ([layer][head][query][key]) and the logit lens ([layer][position] → the top
    tokens with their probabilities) of one prompt."""
    pipe = state.require()
    texts = state.texts
    assert texts is not None
    c, limit = pipe.config, pipe.sample_limit
    if isinstance(body.prompt, str):
        ids = await run_in_threadpool(pipe.tokenizer.encode, body.prompt, True)
    else:
        ids = list(body.prompt)
    ids = ids or [c.eos_token_id]
    bad = next((i for i in ids if not 0 <= i < limit), None)
    if bad is not None:
        raise ApiError(400, f"prompt: token id {bad} is outside the vocabulary [0, {limit})", param="prompt")
    if len(ids) > c.n_positions:
        raise ApiError(400, f"This model's maximum context length is {c.n_positions} tokens, but prompt is "
                       f"{len(ids)} tokens long; shorten it", param="prompt", code="context_length_exceeded")
    try:
        n_layers = len(subset("layers", body.layers, c.n_layer, "layers"))
        n_heads = len(subset("heads", body.heads, c.n_head, "heads"))
    except InspectionError as exc:
        raise ApiError(400, str(exc), param=exc.param) from None
    weights = n_layers * n_heads * len(ids) ** 2
    if weights > MAX_INSPECT_WEIGHTS:
        raise ApiError(400, f"the attention of {n_layers} layers × {n_heads} heads over {len(ids)} tokens is "
                       f"{weights} weights, more than the {MAX_INSPECT_WEIGHTS} one response holds: ask for "
                       "fewer layers or heads", param="layers")
    top = DEFAULT_TOP if body.top is None else body.top
    try:
        result = await run_in_threadpool(pipe.inspect, ids, layers=body.layers, heads=body.heads,
                                         positions=body.positions, top=min(top, limit))
    except InspectionError as exc:
        raise ApiError(400, str(exc), param=exc.param) from None
    return JSONResponse(_response(result, texts, state.config.model_id))

router.add_api_route("/v1/inspect", inspect, methods=["POST"], response_model=InspectResponse,
                     responses=ERRORS)


def _response(r: Inspection, texts, model: str) -> dict:
    return {
        "object": "inspection", "model": model,
        "tokens": [texts[i] for i in r.ids], "token_ids": r.ids,
        "layers": r.layers, "heads": r.heads, "positions": r.positions,
        "attention": np.round(r.attention.astype(np.float64), 4).tolist(),
        "logit_lens": [[[{"token": texts[i], "token_id": i, "probability": p} for i, p in pairs]
                        for pairs in layer] for layer in r.logit_lens],
    }
