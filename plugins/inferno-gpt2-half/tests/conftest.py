"""Shared fixtures (inferno's, shared with the other plugins): `model_dir`, a small random GPT-2 on disk
with the real GPT-2 tokenizer."""

from inferno.testing_fixtures import model_dir  # noqa: F401 - pytest finds the fixture by its name
