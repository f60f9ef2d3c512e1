"""``POST /v1/inspect`` (an extension): what every layer and head attends to, and what every layer would
predict (the logit lens), for one prompt; see `inferno.inspect`.

Token texts are written as the completions' ``logprobs`` write them (``bytes:\\xNN`` for a token that is
not UTF-8 on its own). A text prompt is encoded as ``/v1/completions`` encodes it. The attention
weights are rounded to 4 decimals; a response holds at most `MAX_INSPECT_WEIGHTS` of them (ask for
fewer ``layers`` or ``heads`` beyond that).

An inspection is heavy (a forward pass block by block, and a large JSON body), so:

* the lengths of ``layers``, ``heads`` and ``positions`` are checked against the model's own sizes
  before anything else, and a repeated value is refused at its first repeat (one pass);
* at most ``ServeConfig.max_inspections`` run at once; beyond, 429 with Retry-After;
* the model's work and the JSON are done in a worker thread, the JSON a row at a time, so that the
  event loop (``/health``, streams) keeps answering;
* when the client leaves, the inspection stops before its next block, and the access log says
  "disconnected".
"""

from __future__ import annotations

import json
import threading

import numpy as np
from fastapi import Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from inferno.api import Pipeline
from inferno.inspect import Inspection, InspectionCancelled, InspectionError, inspect_ids, subset
from inferno.serve.errors import ApiError
from inferno.serve.running import ClientGone, gone, in_worker
from inferno.serve.schemas import MAX_INSPECT_WEIGHTS, InspectRequest
from inferno.serve.serving import CancelFlag, Serving
from inferno.serve.state import ServerState
from inferno.serve.token_texts import TokenTexts

DEFAULT_TOP = 5


def check_lengths(body: InspectRequest, n_layer: int, n_head: int, context: int) -> None:
    """Each list no longer than what it indexes (a longer one must repeat a value): checked first, so
    that nothing reads a list of any length the body limit lets through."""
    for name, values, count, what in (("layers", body.layers, n_layer, "layers"),
                                      ("heads", body.heads, n_head, "heads"),
                                      ("positions", body.positions, context, "positions (the context)")):
        if isinstance(values, list) and len(values) > count:
            raise ApiError(400, f"{name} lists {len(values)} values; the model has {count} {what}, each "
                           "listed at most once", param=name)


class ServingInspect(Serving):
    """``/v1/inspect`` for one app: at most `limit` inspections at once."""

    def __init__(self, state: ServerState) -> None:
        super().__init__(state)
        self.limit = state.config.max_inspections
        self.running = 0  # inspections holding a place (their worker thread may still be ending)
        self._lock = threading.Lock()

    def _enter(self) -> None:
        with self._lock:
            if self.running >= self.limit:
                raise ApiError(429, f"{self.running} inspections are running, as many as this server runs at "
                               "once (--max-inspections); retry shortly", code="too_many_inspections",
                               headers={"Retry-After": "1"})
            self.running += 1

    def _leave(self) -> None:
        with self._lock:
            self.running -= 1

    async def create(self, body: InspectRequest, request: Request) -> Response:
        """Attention weights ([layer][head][query][key]) and the logit lens ([layer][position] → the top
        tokens with their probabilities) of one prompt, as JSON."""
        state = self.state
        pipe = state.require()
        texts = state.texts
        assert texts is not None
        c, limit = pipe.config, pipe.sample_limit
        check_lengths(body, c.n_layer, c.n_head, c.n_positions)
        try:
            n_layers = len(subset("layers", body.layers, c.n_layer, "layers"))
            n_heads = len(subset("heads", body.heads, c.n_head, "heads"))
        except InspectionError as exc:
            raise ApiError(400, str(exc), param=exc.param) from None
        top = DEFAULT_TOP if body.top is None else body.top
        self._enter()
        working = False
        try:
            if isinstance(body.prompt, str):
                ids = await run_in_threadpool(pipe.tokenizer.encode, body.prompt, True)
            else:
                ids = list(body.prompt)
            ids = ids or [pipe.empty_prompt_id]
            bad = next((i for i in ids if not 0 <= i < limit), None)
            if bad is not None:
                raise ApiError(400, f"prompt: token id {bad} is outside the vocabulary [0, {limit})",
                               param="prompt")
            if len(ids) > c.n_positions:
                raise ApiError(400, f"This model's maximum context length is {c.n_positions} tokens, but "
                               f"prompt is {len(ids)} tokens long; shorten it", param="prompt",
                               code="context_length_exceeded")
            weights = n_layers * n_heads * len(ids) ** 2
            if weights > MAX_INSPECT_WEIGHTS:
                raise ApiError(400, f"the attention of {n_layers} layers × {n_heads} heads over {len(ids)} "
                               f"tokens is {weights} weights, more than the {MAX_INSPECT_WEIGHTS} one "
                               "response holds: ask for fewer layers or heads", param="layers")
            cancel = CancelFlag()
            state.track(cancel)  # a shutdown cancels it as it cancels completions
            working = True  # from here the worker gives the place back, when it has stopped
            try:
                data = await in_worker(request, cancel, self._work, pipe, texts, ids, body, min(top, limit),
                                       cancel)
            except ClientGone:
                return gone(request)
            except InspectionCancelled:
                raise ApiError(503, "the server is shutting down") from None
            except InspectionError as exc:
                raise ApiError(400, str(exc), param=exc.param) from None
            finally:
                state.untrack(cancel)
        finally:
            if not working:
                self._leave()
        return Response(data, media_type="application/json")

    def _work(self, pipe: Pipeline, texts: TokenTexts, ids: list[int], body: InspectRequest, top: int,
              cancel: threading.Event) -> bytes:
        """The inspection and its JSON (a worker thread); gives its place back however it ends."""
        try:
            result = inspect_ids(pipe.model, ids, layers=body.layers, heads=body.heads,
                                 positions=body.positions, top=top, sample_limit=pipe.sample_limit,
                                 cancelled=cancel.is_set)
            return response_json(result, texts, self.state.config.model_id, cancel)
        finally:
            self._leave()


def _dumps(value: object) -> str:
    # As the JSON responses of the other routes write it (Starlette's JSONResponse).
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _array(items: list[str], cancel: threading.Event) -> str:
    """A JSON array of items already in JSON; stops here once `cancel` is set."""
    if cancel.is_set():
        raise InspectionCancelled("cancelled while writing the response")
    return "[" + ",".join(items) + "]"


def response_json(r: Inspection, texts: TokenTexts, model: str, cancel: threading.Event) -> bytes:
    """The response's JSON, as one `_dumps` would write it whole, written one query row (and one lens
    layer) at a time: each piece is short, so the thread lets the event loop run between them."""
    attention = [_array([_array([_dumps(np.round(row.astype(np.float64), 4).tolist()) for row in head],
                                cancel) for head in layer], cancel) for layer in r.attention]
    lens = [_dumps([[{"token": texts[i], "token_id": i, "probability": p} for i, p in pairs]
                    for pairs in layer]) for layer in r.logit_lens]
    head = _dumps({"object": "inspection", "model": model, "tokens": [texts[i] for i in r.ids],
                   "token_ids": r.ids, "layers": r.layers, "heads": r.heads, "positions": r.positions})
    body = f'{head[:-1]},"attention":{_array(attention, cancel)},"logit_lens":{_array(lens, cancel)}}}'
    return body.encode()
