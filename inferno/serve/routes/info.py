"""What the server is: ``GET /v1/models`` (the one model), ``GET /health``, ``GET /metrics``."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse, Response

from inferno.serve.routes.common import ERRORS, new_router
from inferno.serve.schemas import Health, ModelCard, ModelList
from inferno.serve.state import State

router = new_router()


async def models(state: State) -> ModelList:
    """The one model: its id is --served-model-name, else the --model-dir folder's name, else "gpt2"."""
    pipe = state.require(draining_ok=True)
    card = ModelCard(id=state.config.model_id, created=state.started, max_model_len=pipe.config.n_positions)
    return ModelList(data=[card])

router.add_api_route("/v1/models", models, methods=["GET"], response_model=ModelList,
                     responses={503: ERRORS[503]})


async def health(state: State) -> JSONResponse:
    """200 when the model is loaded and requests are taken; 503 while loading or shutting down."""
    status = "shutting_down" if state.draining else state.status
    out: dict[str, Any] = {"status": status, "model": state.config.model_id}
    e = state.engine
    if e is not None:
        out.update(slots_total=e.slots.n_slots, slots_free=e.free_slots, requests_running=e.running,
                   requests_waiting=e.waiting)
    if state.load_error:
        out["error"] = state.load_error
    return JSONResponse(out, status_code=200 if status == "ok" else 503)

router.add_api_route("/health", health, methods=["GET"], response_model=Health,
                     responses={503: {"model": Health, "description": "Not ready"}})


async def metrics(state: State) -> Response:
    return Response(state.metrics.render(), media_type=state.metrics.content_type)

router.add_api_route("/metrics", metrics, methods=["GET"], response_class=Response,
                     responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                                      "description": "Prometheus text format"}})
