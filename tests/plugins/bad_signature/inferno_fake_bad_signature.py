"""A plugin whose hook has arguments the hookspec does not have (pluggy rejects it at register time)."""

from inferno.backends import hookimpl


@hookimpl
def register_backends(reg, extra):
    raise AssertionError("never called")
