"""The playground: ``GET /`` and ``/static/*`` (plain HTML, CSS and JavaScript in inferno/serve/static, no
build step, no CDN). The page calls ``/v1/completions`` from the browser; it needs no API key (it asks
for one when the API answers 401), and it is not part of the OpenAPI document."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from inferno.serve.routes.common import new_router

#: The playground's files (package data), served at / and /static/.
STATIC_DIR = Path(__file__).parent.parent / "static"

router = new_router()


@router.get("/", include_in_schema=False)
async def playground() -> FileResponse:
    """The playground page (no API key needed; it asks for one when the API answers 401)."""
    return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


def mount_static(app: FastAPI) -> None:
    """Serve the page's files at /static/ (a mount: routers cannot carry one)."""
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
