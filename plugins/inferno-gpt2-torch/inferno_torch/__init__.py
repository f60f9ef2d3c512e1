"""inferno-gpt2-torch: a PyTorch compute backend for inferno, shipped as a separate distribution.

Installing it registers the backend ``torch`` (entry-point group ``inferno.backends``)::

    pip install -e plugins/inferno-gpt2-torch
    inferno --backend torch "Hello"
    pytest --pyargs inferno.conformance --backend torch

Importing this package does not import torch (see `inferno_torch.backend`).
"""

from inferno_torch.backend import TorchBackend

__version__ = "0.1.0"

__all__ = ["TorchBackend", "__version__"]
