"""Shared fixtures. (The hooks of mutation runs are scripts/mutation_hooks.py, loaded only by them.)"""

from __future__ import annotations

import importlib.util

import pytest
from goldens import golden_model, write_model_dir

import inferno
from inferno.backends.registry import get_backend, list_backends


def _backend_specs() -> list:
    """Every registered backend that can run here, plus variants worth checking on their own."""
    params = [pytest.param(info.name, id=info.name) for info in list_backends() if info.ok]
    params.append(pytest.param("numpy:dtype=float64", id="numpy-float64"))
    # array_api_strict rejects anything outside the Array API standard: the portable backend's proof.
    strict = importlib.util.find_spec("array_api_strict") is not None
    params.append(pytest.param("array-api:xp=array_api_strict", id="array-api-strict",
                               marks=() if strict else pytest.mark.skip(reason="needs array-api-strict")))
    return params


def _parametrized_by_a_mark(metafunc, name: str) -> bool:
    for marker in metafunc.definition.iter_markers("parametrize"):
        names = marker.args[0] if marker.args else marker.kwargs.get("argnames", ())
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        if name in names:
            return True
    return False


def pytest_generate_tests(metafunc):
    # The `backend` fixture's parameters are worked out here, when a test that uses it is collected, not
    # when this file is imported: then a registry that fails (a mutant under mutation testing, a broken
    # plugin) fails those tests instead of the whole session.
    if "backend" in metafunc.fixturenames and not _parametrized_by_a_mark(metafunc, "backend"):
        metafunc.parametrize("backend", _backend_specs(), indirect=True, scope="session")


@pytest.fixture(scope="session")
def backend(request):
    """A constructed backend, parametrized like SciPy's ``xp``: every registered backend that can run."""
    be = get_backend(request.param)
    yield be
    be.close()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """The 'greedy' golden model (GPT-2's vocabulary, 2 layers, n_positions 128) with the real
    tokenizer.json, written once for every test that only reads it (a test that breaks a model folder
    copies it first)."""
    config, sd, _ = golden_model("greedy")
    return write_model_dir(tmp_path_factory.mktemp("greedy-model"), config, sd)


@pytest.fixture(scope="session")
def pipe(model_dir):
    """That model loaded on the numpy backend."""
    return inferno.load(model_dir, "numpy", download=False)
