"""inferno: language-model inference (GPT-2, the Llama family) on the CPU with pluggable compute backends.

    import inferno
    model = inferno.load()
    print(model.generate("The quick brown fox", max_new_tokens=20).text)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from inferno.version import __version__

__all__ = ["Backend", "GenerationOptions", "GenerationResult", "Gpt2Config", "Inspection", "Pipeline",
           "ScoreResult", "Tokenizer", "load", "__version__"]

# Imported lazily so that `import inferno` (and `inferno --help`) stays cheap.
_LAZY = {
    "load": "inferno.api",
    "Pipeline": "inferno.api",
    "GenerationResult": "inferno.generate",
    "GenerationOptions": "inferno.options",
    "ScoreResult": "inferno.scoring",
    "Inspection": "inferno.inspect",
    "Gpt2Config": "inferno.models.config",
    "Tokenizer": "inferno.tokenizer",
    "Backend": "inferno.backends.base",
}

if TYPE_CHECKING:
    from inferno.api import Pipeline, load
    from inferno.backends.base import Backend
    from inferno.generate import GenerationResult
    from inferno.inspect import Inspection
    from inferno.models.config import Gpt2Config
    from inferno.options import GenerationOptions
    from inferno.scoring import ScoreResult
    from inferno.tokenizer import Tokenizer


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'inferno' has no attribute {name!r}")
