"""What the server is: ``GET /v1/models`` (the one model) and ``/v1/models/{id}``, ``GET /health``,
``GET /metrics``."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse, Response

from inferno.serve.routes.common import ERRORS, new_router
from inferno.serve.schemas import ErrorResponse, Health, ModelCard, ModelList
from inferno.serve.state import State

router = new_router()


def _card(state, pipe) -> ModelCard:
    from inferno.models.families import family_of

    config = pipe.config.to_dict()
    return ModelCard(id=state.config.model_id, created=state.started, max_model_len=pipe.config.n_positions,
                     family=family_of(config).name, architecture=config.get("model_type") or "gpt2")


@router.get("/v1/models", response_model=ModelList, responses={503: ERRORS[503]})
async def models(state: State) -> ModelList:
    """The one model: its id is --served-model-name, else the --model-dir folder's name, else "gpt2"."""
    pipe = state.require(draining_ok=True)
    return ModelList(data=[_card(state, pipe)])


@router.get("/v1/models/{model:path}", response_model=ModelCard,
            responses={404: {"model": ErrorResponse, "description": "Not this server's model"},
                       503: ERRORS[503]})
async def model(model: str, state: State) -> ModelCard:
    """The model named `model` (its id, which may hold "/", or an alias): the card /v1/models lists;
    404 model_not_found for any other name."""
    pipe = state.require(draining_ok=True, model=model)
    return _card(state, pipe)


@router.get("/health", response_model=Health, responses={503: {"model": Health, "description": "Not ready"}})
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


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                             "description": "Prometheus text format"}})
async def metrics(state: State) -> Response:
    return Response(state.metrics.render(), media_type=state.metrics.content_type)
