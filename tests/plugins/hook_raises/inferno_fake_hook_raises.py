"""A plugin whose hook raises."""

from inferno.backends import hookimpl


@hookimpl
def register_backends(register):
    raise RuntimeError("no accelerator found")
