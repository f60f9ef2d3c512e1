"""Compute backends: the `Backend` protocol, the plugin hooks and the registry."""

from inferno.backends.base import Array, Backend
from inferno.backends.hookspecs import hookimpl

__all__ = ["Array", "Backend", "hookimpl"]
