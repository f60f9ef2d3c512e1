"""Shared fixtures (inferno's, shared with the other plugins): `model_dir`, a small random GPT-2 on disk
with the real GPT-2 tokenizer, and `run_python`, a clean ``python`` subprocess."""

from inferno.testing_fixtures import model_dir, run_python  # noqa: F401 - pytest finds fixtures by name
