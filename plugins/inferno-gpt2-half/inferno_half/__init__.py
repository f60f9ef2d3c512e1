"""inferno-gpt2-half: a backend with 16-bit or 8-bit weights for inferno, shipped as a separate distribution.

Installing it (a C compiler builds its kernels; without one a NumPy fallback runs) registers ``half``::

    pip install plugins/inferno-gpt2-half
    inferno --backend half:dtype=bfloat16 "Hello"
    inferno --backend half:dtype=int8 "Hello"
    pytest --pyargs inferno.conformance --backend half
"""

from inferno_half.backend import HalfBackend

__version__ = "0.1.0"

__all__ = ["HalfBackend", "__version__"]
