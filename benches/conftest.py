"""Shared fixtures of the pytest-benchmark suite (``python -m pytest benches --benchmark-only``).

* Backend benchmarks are parametrized over every registered backend whose status is "ok"
  (`inferno.backends.registry.list_backends`); select some with ``-k``, e.g. ``-k "numpy or threaded"``.
* The random weights of the GPT-2 124M shape are built once per session (~1 s) and shared by every
  backend's model.
"""

from __future__ import annotations

import numpy as np
import pytest

from inferno.backends import registry
from inferno.bench import GPT2_124M, random_weights

BACKENDS = [info.name for info in registry.list_backends() if info.ok]


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request):
    be = registry.get_backend(request.param)
    yield be
    be.close()


_LAYOUTS: dict = {}  # the weights once per memory layout, shared by the backends that want it


@pytest.fixture(scope="session")
def gpt2_weights() -> dict[str, np.ndarray]:
    return random_weights(GPT2_124M)


@pytest.fixture(scope="session")
def gpt2_model(backend, gpt2_weights):
    """The 124M-shape model on `backend` (built once per backend)."""
    from inferno.bench import weights_in_layout
    from inferno.models.gpt2 import Gpt2

    return Gpt2.from_weights(GPT2_124M, weights_in_layout(gpt2_weights, backend, _LAYOUTS), backend)
