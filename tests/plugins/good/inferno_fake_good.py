"""A working third-party backend: the NumPy kernels under another name."""

from inferno.backends import hookimpl
from inferno.backends.numpy_backend import NumpyBackend


class FakeGoodBackend(NumpyBackend):
    name = "fake-good"
    description = "A fake plugin backend (NumPy kernels) for the registry tests."


@hookimpl
def register_backends(register):
    register(FakeGoodBackend)
