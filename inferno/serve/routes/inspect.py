"""``POST /v1/inspect`` (an extension): attention weights and the logit lens of one prompt
(`inferno.serve.serving_inspect`)."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from inferno.serve.routes.common import ERRORS, new_router, serving
from inferno.serve.schemas import ErrorResponse, InspectRequest, InspectResponse
from inferno.serve.serving_inspect import ServingInspect

router = new_router()

BUSY = {429: {"model": ErrorResponse, "description": "As many inspections as the server runs at once "
              "are running (--max-inspections); see Retry-After"}}


@router.post("/v1/inspect", response_model=InspectResponse, responses={**ERRORS, **BUSY})
async def inspect(body: InspectRequest, request: Request, inspect: serving(ServingInspect)) -> Response:
    """Attention weights ([layer][head][query][key]) and the logit lens ([layer][position] → the top
    tokens with their probabilities) of one prompt."""
    return await inspect.create(body, request)
