"""Model names: what ``-m NAME`` and ``inferno.load(NAME)`` mean, parsed once into a `ModelSpec`.

A name is one of:

* ``random`` / ``random:tiny``: random weights built in memory (GPT-2 124M's shape, or a small one) with
  the shipped GPT-2 tokenizer: no file, no download (the text is gibberish by design);
* a short name: ``gpt2``, ``gpt2-medium``, ``gpt2-large``, ``gpt2-xl`` (openai-community's repos) or
  ``distilgpt2`` (``distilbert/distilgpt2``); the default is ``gpt2``; and for the Llama family
  ``smollm2-135m``, ``smollm2-360m``, ``smollm2-1.7b``, ``qwen2.5-0.5b`` and ``llama-3.2-1b``, each also
  with ``-instruct``, and ``qwen3-0.6b`` (`SHORT_NAMES`);
* a local folder: a path that exists, or starts with ``/``, ``./``, ``../`` or ``~`` (so ``./gpt2`` is
  the folder, ``gpt2`` the Hub model);
* a Hub repo id ``ORG/NAME``, optionally ``@REVISION``, as any Hub name above.

A revision is a branch, a tag or a 40-hex commit, checked here, before any request: it becomes a path in
the cache (``refs/<revision>``), so ``..`` components, absolute paths, backslashes, empty components and
control characters are refused; a branch's own ``/`` (``refs/pr/1``, ``feature/x``) is allowed.

Nothing here touches the network or the cache: `inferno.models.resolve` turns a spec into files.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from inferno.models.config import Gpt2Config

__all__ = [
    "DEFAULT_MODEL",
    "SHORT_NAMES",
    "RANDOM_MODELS",
    "ModelNameError",
    "ModelSpec",
    "parse_model_name",
    "model_id",
    "revision_problem",
]

DEFAULT_MODEL = "gpt2"
#: The short names and the Hub repos they stand for.
SHORT_NAMES = {
    "gpt2": "openai-community/gpt2",
    "gpt2-medium": "openai-community/gpt2-medium",
    "gpt2-large": "openai-community/gpt2-large",
    "gpt2-xl": "openai-community/gpt2-xl",
    "distilgpt2": "distilbert/distilgpt2",
    # The Llama family (inferno.models.llama): small models that run on a CPU.
    "smollm2-135m": "HuggingFaceTB/SmolLM2-135M",
    "smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "smollm2-360m": "HuggingFaceTB/SmolLM2-360M",
    "smollm2-360m-instruct": "HuggingFaceTB/SmolLM2-360M-Instruct",
    "smollm2-1.7b": "HuggingFaceTB/SmolLM2-1.7B",
    "smollm2-1.7b-instruct": "HuggingFaceTB/SmolLM2-1.7B-Instruct",
    "qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B",
    "qwen2.5-0.5b-instruct": "Qwen/Qwen2.5-0.5B-Instruct",
    "qwen3-0.6b": "Qwen/Qwen3-0.6B",
    "llama-3.2-1b": "meta-llama/Llama-3.2-1B",  # gated: accept Meta's terms on the Hub, set HF_TOKEN
    "llama-3.2-1b-instruct": "meta-llama/Llama-3.2-1B-Instruct",
}
#: Random models: name → shape (the shipped tokenizer's vocabulary; fixed seed 0).
RANDOM_MODELS = {
    "random": Gpt2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12),
    "random:tiny": Gpt2Config(vocab_size=50257, n_positions=1024, n_embd=128, n_layer=2, n_head=4),
}
# The Hub's rules for repo ids (huggingface_hub's validate_repo_id): ORG/NAME of word characters, "-", ".".
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}")
COMMIT = re.compile(r"[0-9a-f]{40}")
# What git refuses in a branch or tag name (git check-ref-format), besides control characters and "\".
_NOT_IN_REFS = " ~^:?*["


class ModelNameError(FileNotFoundError, ValueError):
    """A model name that is neither a folder, a Hub repo id, a short name nor ``random``, or a Hub name
    with an invalid revision: one line. (A FileNotFoundError, as a folder that is not there would be, and
    a ValueError.)"""


@dataclass(frozen=True)
class ModelSpec:
    """What a model name means. `kind` is "folder", "hub" or "random". `note` is one line for the user
    when the name could have meant something else too (a bare name that is also a folder here): which
    one this is, and how to name the other."""

    name: str  # as given
    kind: str
    path: Path | None = None  # a folder
    repo_id: str | None = None  # a Hub repo
    revision: str = "main"
    random_config: Gpt2Config | None = None
    note: str | None = None

    @property
    def id(self) -> str:
        """The model's name for others (the server's /v1/models): the repo id (with ``@revision`` unless
        main), the folder's name, or ``random`` / ``random:tiny``."""
        if self.kind == "hub":
            return self.repo_id + ("" if self.revision == "main" else f"@{self.revision}")
        if self.kind == "folder":
            return self.path.name or os.fspath(self.path)
        return self.name


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~", ".\\", "..\\")) or name in (".", "..") or \
        (os.sep != "/" and os.sep in name)


def revision_problem(revision: str) -> str | None:
    """What makes `revision` unusable as a branch, tag or commit (it becomes a path in the cache), or
    None when it is fine. A 40-hex commit is always fine; otherwise git's rules for ref names."""
    if COMMIT.fullmatch(revision):
        return None
    if len(revision) > 255:
        return "longer than 255 characters"
    if any(ord(c) < 32 or ord(c) == 127 for c in revision):
        return "it holds a control character"
    if "\\" in revision:
        return "it holds a backslash"
    if revision.startswith("/"):
        return "it is an absolute path"
    for part in revision.split("/"):
        if part == "":
            return "it has an empty path component ('//' or a trailing '/')"
        if part in (".", ".."):
            return f"it has a {part!r} path component"
        if part.startswith("."):
            return f"the component {part!r} starts with '.'"
        if part.endswith((".lock", ".")):
            return f"the component {part!r} ends with {'.lock' if part.endswith('.lock') else repr('.')}"
    bad = next((c for c in revision if c in _NOT_IN_REFS), None)
    if bad is not None:
        return f"it holds {bad!r}, which no branch or tag may hold"
    if "@{" in revision:
        return "it holds '@{'"
    return None


def parse_model_name(name: str | os.PathLike[str] | None = None) -> ModelSpec:
    """What `name` refers to (see the module docstring); None is ``gpt2``. Raises `ModelNameError` (one line)
    for a name that is none of them or has an invalid revision, or `TypeError` for something that is not a
    string or path."""
    if name is None:
        name = DEFAULT_MODEL
    if isinstance(name, os.PathLike):  # a Path is always a folder
        return ModelSpec(os.fspath(name), "folder", path=_folder(os.fspath(name)))
    if not isinstance(name, str):
        raise TypeError(f"model must be a name or a folder (str or os.PathLike), not {type(name).__name__}")
    if name.strip() == "":
        # Path("") is the current directory: never load from, or download into, wherever this runs.
        raise ModelNameError(f"model name {name!r} is an empty path: give a folder, a Hub name such as gpt2 "
                             f"or ORG/NAME, or random")
    if name in RANDOM_MODELS:
        return ModelSpec(name, "random", random_config=RANDOM_MODELS[name])
    if name.startswith("random:"):
        raise ModelNameError(f"unknown random model {name!r}: choose {' or '.join(RANDOM_MODELS)}")
    if _looks_like_path(name) or (os.path.lexists(name) and name.split("@")[0] not in SHORT_NAMES):
        note = None
        if "@" not in name and _REPO_ID.fullmatch(name) and os.path.isdir(name):
            note = (f"note: using the folder ./{name}, not the Hub model of that name "
                    f"(-m {name}@main for the Hub model)")
        return ModelSpec(name, "folder", path=_folder(name), note=note)
    repo, _, revision = name.partition("@")
    if "@" in name and not revision:
        raise ModelNameError(f"model {name!r}: nothing after '@' (give a revision: a branch, tag or commit)")
    revision = revision or "main"
    problem = revision_problem(revision)
    if problem is not None:
        raise ModelNameError(f"invalid revision {revision!r} in model {name!r}: {problem}; give a branch, "
                             f"tag or 40-hex commit")
    if repo in SHORT_NAMES:
        note = None
        if os.path.isdir(name):
            note = (f"note: using the Hub model {SHORT_NAMES[repo]}, not the folder ./{name} here "
                    f"(-m ./{name} for the folder)")
        return ModelSpec(name, "hub", repo_id=SHORT_NAMES[repo], revision=revision, note=note)
    if _REPO_ID.fullmatch(repo) and ".." not in repo and "--" not in repo:
        return ModelSpec(name, "hub", repo_id=repo, revision=revision)
    known = [*SHORT_NAMES, *RANDOM_MODELS]
    close = difflib.get_close_matches(repo, known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}? " if close else ""
    raise ModelNameError(f"model {name!r} is not a folder here, a Hub repo id (ORG/NAME[@REVISION]) or a "
                         f"known name: {hint}known: {', '.join(known)}")


def _folder(name: str) -> Path:
    return Path(name).expanduser().absolute()


def model_id(name: str | os.PathLike[str] | None = None) -> str:
    """The id a model name is known by: `ModelSpec.id` (``gpt2`` is ``openai-community/gpt2``)."""
    return parse_model_name(name).id
