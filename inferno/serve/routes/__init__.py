"""The server's routes, one `APIRouter` a concern; `ROUTERS` is what `create_app` includes, in order."""

from __future__ import annotations

from inferno.serve.routes import chat, completions, info, inspect, playground, tokenizer

ROUTERS = (completions.router, chat.router, info.router, tokenizer.router, inspect.router, playground.router)
