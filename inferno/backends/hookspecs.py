"""The plugin hooks. A backend plugin implements `register_backends` and names its module in the
``inferno.backends`` entry-point group; the built-in backends do exactly the same.

    # my_backend.py
    from inferno.backends import Backend, hookimpl

    class MyBackend(Backend):
        name = "mine"
        description = "What it is, in one line."
        ...

    @hookimpl
    def register_backends(register):
        register(MyBackend)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from inferno.backends.base import Backend

PROJECT = "inferno"

hookspec = pluggy.HookspecMarker(PROJECT)
#: Decorate your plugin's hook functions with this.
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def register_backends(register: Callable[[type[Backend]], None]) -> None:
    """Register backend classes by calling ``register(BackendSubclass)`` once per backend.

    The class must subclass `inferno.backends.Backend` and set `name` (unique, lower case) and
    `description` (one line). It is constructed only when a user asks for it, with keyword options
    (e.g. ``dtype``); importing your module must stay cheap and must not import heavy libraries
    eagerly if it can avoid it (do that in ``__init__`` or ``unavailable_reason``).
    """
