"""A plugin that registers a class that is not a Backend subclass."""

from inferno.backends import hookimpl


class NotABackend:
    name = "fake-not-a-backend"


@hookimpl
def register_backends(register):
    register(NotABackend)
