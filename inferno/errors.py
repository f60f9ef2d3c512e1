"""The errors every layer may raise or catch, and how an error becomes one line of a message.

They live at the bottom of the house so that the loaders and the model can raise a backend's errors
without importing the plugin registry.
"""

from __future__ import annotations


class BackendUnavailableError(RuntimeError):
    """The backend is known but cannot run here (missing library, or its plugin failed to load)."""


class BackendError(BackendUnavailableError):
    """A backend failed in a call (its constructor, `prepare_weight`, `weight_order`, a kernel) or
    returned something unusable (a wrong shape, non-finite values); the message names the backend and
    the call. A `BackendUnavailableError`: the backend cannot run this."""


class BackendOptionError(ValueError):
    """The options given to a backend were rejected: unknown names or bad values."""


def squash(message: object) -> str:
    """`message` as one line: its whitespace runs (newlines included) become single spaces."""
    return " ".join(str(message).split())


def one_line(exc: BaseException) -> str:
    """An exception as one line that names its type: ``ValueError: bad shape``."""
    text = squash(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
