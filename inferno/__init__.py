"""inferno: GPT-2 (124M) text generation on the CPU with pluggable compute backends."""

__version__ = "0.1.0"
