"""A plugin backend that loads fine but computes layer norm with the wrong epsilon: the conformance
suite must fail it, naming the kernel."""

from inferno.backends import hookimpl
from inferno.backends.numpy_backend import NumpyBackend


class BrokenLayernormBackend(NumpyBackend):
    name = "broken-layernorm"
    description = "NumPy kernels, except layernorm ignores eps (uses 1e-12)."

    def layernorm(self, x, gamma, beta, eps):
        return super().layernorm(x, gamma, beta, 1e-12)


@hookimpl
def register_backends(register):
    register(BrokenLayernormBackend)
