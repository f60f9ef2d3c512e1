"""Model names → model files: a local folder, a Hub repo in the Hugging Face cache, or random weights.

A name (``-m``, ``inferno.load(name)``) is one of:

* ``random`` / ``random:tiny``: random weights built in memory (GPT-2 124M's shape, or a small one) with
  the shipped GPT-2 tokenizer: no file, no download (the text is gibberish by design);
* a short name: ``gpt2``, ``gpt2-medium``, ``gpt2-large``, ``gpt2-xl`` (openai-community's repos) or
  ``distilgpt2`` (``distilbert/distilgpt2``); the default is ``gpt2``;
* a local folder: a path that exists, or starts with ``/``, ``./``, ``../`` or ``~`` (so ``./gpt2`` is
  the folder, ``gpt2`` the Hub model);
* a Hub repo id ``ORG/NAME``, optionally ``@REVISION`` (a branch, tag or commit), as any name above.

Hub files live in the Hugging Face cache, laid out as huggingface_hub does (``models--ORG--NAME/`` with
``blobs/``, ``refs/`` and ``snapshots/<commit>/`` links), so every tool that uses it shares one copy:
``HF_HUB_CACHE``, ``HF_HOME`` and ``XDG_CACHE_HOME`` choose where; ``HF_HUB_OFFLINE`` (or
``INFERNO_OFFLINE``) set to 1/true/yes/on means no request is made. A model found in the cache is used
without a request. Otherwise the files are fetched with huggingface_hub when it is installed, else with the
standard library (``INFERNO_DOWNLOADER=urllib`` forces the latter); both draw a progress bar and resume.

What is fetched: config.json first (a model that is not GPT-2 is refused before its weights come down),
then tokenizer.json (vocab.json + merges.txt when the repo has none), then model.safetensors. For ``gpt2``
at its main revision, the config.json and tokenizer.json that ship with inferno stand in for the Hub's
when the cache lacks them, so only the weights are fetched.

The standard-library downloader asks the Hub for each file's commit, size and checksum (a HEAD request,
as huggingface_hub does), streams it into ``blobs/<etag>.incomplete`` (resumed from where a previous run
stopped, with a Range request; opened without following links), verifies it (its size; its SHA-256, or
its git blob hash for small files; its contents: a config.json must be JSON, a tokenizer.json a usable
tokenizer, model.safetensors a safetensors header matching the config) and only then moves it into
place, never over an existing file. A file that fails verification is deleted; an interrupted one is kept
for the next run to resume.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import http.client
import os
import re
import shlex
import shutil
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from inferno.config import Gpt2Config
from inferno.errors import squash

__all__ = [
    "DEFAULT_MODEL",
    "SHORT_NAMES",
    "RANDOM_MODELS",
    "REQUIRED_FILES",
    "ModelNameError",
    "ModelFilesMissing",
    "DownloadVerificationError",
    "ModelSpec",
    "ModelFiles",
    "parse_model_name",
    "model_id",
    "resolve_model",
    "resolve_model_dir",
    "hf_cache_dir",
    "repo_cache_dir",
    "find_cached_snapshot",
    "shipped_gpt2_file",
    "is_offline",
]

DEFAULT_MODEL = "gpt2"
#: The short names and the Hub repos they stand for.
SHORT_NAMES = {
    "gpt2": "openai-community/gpt2",
    "gpt2-medium": "openai-community/gpt2-medium",
    "gpt2-large": "openai-community/gpt2-large",
    "gpt2-xl": "openai-community/gpt2-xl",
    "distilgpt2": "distilbert/distilgpt2",
}
#: Random models: name → shape (the shipped tokenizer's vocabulary; fixed seed 0).
RANDOM_MODELS = {
    "random": Gpt2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12),
    "random:tiny": Gpt2Config(vocab_size=50257, n_positions=1024, n_embd=128, n_layer=2, n_head=4),
}
# What a model folder holds; the tokenizer is tokenizer.json, or vocab.json + merges.txt.
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")
_BPE_FILES = ("vocab.json", "merges.txt")
_ALL_FILES = (*REQUIRED_FILES, *_BPE_FILES)
_SHIPPED_REPO = "openai-community/gpt2"  # whose config.json and tokenizer.json ship with inferno
DEFAULT_ENDPOINT = "https://huggingface.co"
CONNECT_TIMEOUT_S = 10.0
_CHUNK = 1 << 20
_ATTEMPTS = 5  # tries of one download when the connection drops midway (each resumes the last)
_TRUE = {"1", "true", "yes", "on"}
# The Hub's rules for repo ids (huggingface_hub's validate_repo_id): ORG/NAME of word characters, "-", ".".
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
PIP_HUB = 'pip install "inferno-gpt2[hub]"'
RANDOM_HINT = "-m random (random weights: gibberish, but no download)"


# ------------------------------------------------------------------------------------------- names


class ModelNameError(FileNotFoundError, ValueError):
    """A model name that is neither a folder, a Hub repo id, a short name nor ``random``: one line. (A
    FileNotFoundError, as a folder that is not there would be, and a ValueError.)"""


@dataclass(frozen=True)
class ModelSpec:
    """What a model name means. `kind` is "folder", "hub" or "random"."""

    name: str  # as given
    kind: str
    path: Path | None = None  # a folder
    repo_id: str | None = None  # a Hub repo
    revision: str = "main"
    random_config: Gpt2Config | None = None

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


def parse_model_name(name: str | os.PathLike[str] | None = None) -> ModelSpec:
    """What `name` refers to (see the module docstring); None is ``gpt2``. Raises `ModelNameError` (one line)
    for a name that is none of them, or `TypeError` for something that is not a string or path."""
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
        return ModelSpec(name, "folder", path=_folder(name))
    repo, _, revision = name.partition("@")
    if "@" in name and not revision:
        raise ModelNameError(f"model {name!r}: nothing after '@' (give a revision: a branch, tag or commit)")
    revision = revision or "main"
    if repo in SHORT_NAMES:
        return ModelSpec(name, "hub", repo_id=SHORT_NAMES[repo], revision=revision)
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


# ------------------------------------------------------------------------------------------- files


@dataclass(frozen=True)
class ModelFiles:
    """Where a model's files are. `tokenizer` is a tokenizer.json, or None and then `vocab` + `merges`."""

    config: Path
    weights: Path
    tokenizer: Path | None
    vocab: Path | None = None
    merges: Path | None = None
    id: str = ""


def shipped_gpt2_file(name: str) -> Path:
    """The config.json or tokenizer.json of openai-community/gpt2 that ship with inferno."""
    folder = Path(__file__).resolve().parent / "data" / "gpt2"  # package data (pyproject.toml)
    if (folder / name).is_file():
        return folder / name
    raise ModelFilesMissing([name], [folder],
                            reason="the copy that ships with inferno is missing (a broken install?)")


def _files_in(directory: Path, spec_id: str, cache: bool = True) -> tuple[ModelFiles | None, list[str]]:
    """The model files in one folder, or None and what is missing. In the cache, a link to a deleted
    blob counts as missing (it is fetched again); in a user's folder, whatever is there is the user's
    (a FIFO, a dangling link: the loaders then say what is wrong with it)."""
    there = Path.is_file if cache else os.path.lexists
    have = {n for n in _ALL_FILES if there(directory / n)}
    missing = [n for n in ("config.json", "model.safetensors") if n not in have]
    if "tokenizer.json" not in have and not set(_BPE_FILES) <= have:
        missing.append("tokenizer.json")
    if missing:
        return None, missing
    tok = directory / "tokenizer.json" if "tokenizer.json" in have else None
    bpe = (None, None) if tok else (directory / "vocab.json", directory / "merges.txt")
    return ModelFiles(directory / "config.json", directory / "model.safetensors", tok, *bpe, id=spec_id), []


def resolve_model(name: str | os.PathLike[str] | None = None, *, download: bool = True,
                  progress: bool = True) -> ModelFiles:
    """The files of model `name` (a folder or a Hub name; see the module docstring), fetched into the
    Hugging Face cache when missing there and `download` is true and not offline.

    Raises `ModelNameError` for a name that means nothing, `ModelFilesMissing` (one line, or two as
    ``lines``) when files are missing and cannot be fetched, and `ConfigError` when a Hub model's
    config.json is not GPT-2's (before its weights are fetched).
    """
    spec = parse_model_name(name)
    if spec.kind == "random":
        raise ModelNameError(f"{spec.name!r} has no files: it is built in memory (inferno.load builds it)")
    if spec.kind == "folder":
        return _folder_files(spec)
    return _hub_files(spec, download=download, progress=progress)


def _folder_files(spec: ModelSpec) -> ModelFiles:
    path = spec.path
    if not os.path.lexists(path):
        raise ModelFilesMissing([], [path], spec=spec, reason=f"no such folder: {path}")
    if not path.is_dir():
        raise NotADirectoryError(f"model folder {path} is a file; expected a folder holding "
                                 f"{', '.join(REQUIRED_FILES)}")
    files, missing = _files_in(path, spec.id, cache=False)
    if files is None:
        raise ModelFilesMissing(missing, [path], spec=spec)
    return files


def _hub_files(spec: ModelSpec, *, download: bool, progress: bool, shipped: bool = True) -> ModelFiles:
    snapshot = find_cached_snapshot(spec.repo_id, spec.revision)
    use_shipped = shipped and spec.repo_id == _SHIPPED_REPO and spec.revision == "main"
    if snapshot is not None:
        files = _with_shipped(snapshot, spec, use_shipped)
        if files is not None:
            return files
    searched = [repo_cache_dir(spec.repo_id) / "snapshots"]
    missing = _missing_after_shipped(snapshot, use_shipped)
    if not download:
        raise ModelFilesMissing(missing, searched, spec=spec, reason="downloading disabled")
    if is_offline():
        raise ModelFilesMissing(missing, searched, spec=spec, reason=_offline_reason())
    try:
        snapshot = _fetch(spec, skip=("config.json", "tokenizer.json") if use_shipped else (),
                          progress=progress)
    except _Failed as exc:
        raise ModelFilesMissing(exc.missing or missing, searched, spec=spec, reason=exc.reason) from None
    files = _with_shipped(snapshot, spec, use_shipped)
    assert files is not None, snapshot  # _fetch returns only complete snapshots
    return files


def _with_shipped(snapshot: Path, spec: ModelSpec, use_shipped: bool) -> ModelFiles | None:
    files, missing = _files_in(snapshot, spec.id)
    if files is not None or not use_shipped or "model.safetensors" in missing:
        return files
    config = snapshot / "config.json"
    config = config if config.is_file() else shipped_gpt2_file("config.json")
    tok = snapshot / "tokenizer.json"
    tok = tok if tok.is_file() else shipped_gpt2_file("tokenizer.json")
    return ModelFiles(config, snapshot / "model.safetensors", tok, id=spec.id)


def _missing_after_shipped(snapshot: Path | None, use_shipped: bool) -> list[str]:
    missing = list(REQUIRED_FILES) if snapshot is None else _files_in(snapshot, "")[1]
    return [n for n in missing if not (use_shipped and n in ("config.json", "tokenizer.json"))]


def resolve_model_dir(model_dir: str | os.PathLike[str] | None = None, *, download: bool = True,
                      progress: bool = True) -> Path:
    """One folder holding all of a model's files (for code that passes a folder on): a local folder, or
    the Hub model's cache snapshot, fetching whatever it lacks (the shipped config.json and tokenizer.json
    do not stand in here). Prefer `resolve_model`. Raises as `resolve_model` does."""
    spec = parse_model_name(model_dir)
    if spec.kind == "random":
        raise ModelNameError(f"{spec.name!r} has no folder: it is built in memory")
    if spec.kind == "folder":
        return _folder_files(spec).config.parent
    return _hub_files(spec, download=download, progress=progress, shipped=False).weights.parent


# ------------------------------------------------------------------------------------------- cache


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def is_offline() -> bool:
    """Whether downloads are disabled (HF_HUB_OFFLINE or INFERNO_OFFLINE)."""
    return _env_true("HF_HUB_OFFLINE") or _env_true("INFERNO_OFFLINE")


def _offline_reason() -> str:
    names = [n for n in ("HF_HUB_OFFLINE", "INFERNO_OFFLINE") if _env_true(n)]
    return f"not downloading: offline ({' and '.join(f'{n}={os.environ[n]}' for n in names)})"


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, resolved the way huggingface_hub does."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def repo_cache_dir(repo_id: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``<cache>/models--ORG--NAME``."""
    cache = Path(cache_dir) if cache_dir is not None else hf_cache_dir()
    return cache / ("models--" + repo_id.replace("/", "--"))


def find_cached_snapshot(repo_id: str = _SHIPPED_REPO, revision: str = "main",
                         cache_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The snapshot folder of `repo_id` at `revision` in the HF cache, or None.

    A commit hash is its own snapshot; a branch or tag is looked up in ``refs/``. For ``main`` without a
    ref (a cache filled by hand), the newest snapshot holding config.json and model.safetensors.
    """
    repo = repo_cache_dir(repo_id, cache_dir)
    snapshots = repo / "snapshots"
    if _COMMIT.fullmatch(revision):
        return snapshots / revision if (snapshots / revision).is_dir() else None
    commit = _read_ref(repo, revision)
    if commit:
        return snapshots / commit if (snapshots / commit).is_dir() else None
    if revision != "main":
        return None
    try:
        candidates = [p for p in snapshots.iterdir()
                      if p.is_dir() and (p / "config.json").is_file() and (p / "model.safetensors").is_file()]
    except OSError:
        return None
    return max(candidates, key=lambda p: p.stat().st_mtime) if candidates else None


def _read_ref(repo: Path, revision: str) -> str | None:
    if ".." in revision.split("/"):
        return None
    try:
        commit = (repo / "refs" / revision).read_text().strip()
    except OSError:
        return None
    return commit if _COMMIT.fullmatch(commit) else None


# ------------------------------------------------------------------------------------------- errors


class ModelFilesMissing(FileNotFoundError):
    """The model files are not available; ``str()`` is one line saying what is missing, where we
    looked, why a download did not happen or failed, and what to do; ``lines`` is the same in two
    lines (what is missing, what to do), as the CLI prints it."""

    def __init__(
        self,
        missing: Iterable[str],
        searched: Iterable[str | os.PathLike[str]],
        *,
        spec: ModelSpec | None = None,
        reason: str | None = None,
    ) -> None:
        self.missing = list(missing)
        self.searched = [os.fspath(p) for p in searched]
        self.spec = spec
        self.reason = reason
        # A single argument keeps OSError from formatting it as "[Errno ...]".
        super().__init__(self._message())

    @property
    def problem(self) -> str:
        """What is missing, where we looked and why no download happened or it failed."""
        what = f" of {self.spec.id}" if self.spec is not None and self.spec.kind == "hub" else ""
        parts = [f"GPT-2 model file(s){what} missing: {', '.join(self.missing)}"] if self.missing else []
        parts.append(f"looked in {', '.join(self.searched)}")
        if self.reason:
            parts.append(" ".join(self.reason.split()))  # one line, whatever the network library said
        return "; ".join(parts)

    @property
    def remedy(self) -> str:
        """What to do: for a folder, what it must hold; for a Hub model, how to fetch it (`hf download`
        where that command exists, else how to get it) or to try `-m random`."""
        spec = self.spec
        if spec is None or spec.kind != "hub":
            return ("put the files there, or name a Hub model instead (gpt2, ORG/NAME); or try "
                    + RANDOM_HINT)
        offline = [n for n in ("HF_HUB_OFFLINE", "INFERNO_OFFLINE") if _env_true(n)]
        if offline:
            return f"unset {' and '.join(offline)} to download it, or try {RANDOM_HINT}"
        if shutil.which("hf"):
            return f"fetch it with: {shlex.join(fetch_command(spec, self.missing))}; or try {RANDOM_HINT}"
        return f"try {RANDOM_HINT}; to fetch it yourself: {PIP_HUB}, then hf download {spec.repo_id}"

    @property
    def lines(self) -> tuple[str, str]:
        return self.problem, self.remedy

    def _message(self) -> str:
        return "; ".join(self.lines)

    def __str__(self) -> str:
        return self._message()


def fetch_command(spec: ModelSpec, missing: Iterable[str] = ()) -> list[str]:
    """The `hf download` command (as argv) that puts `spec`'s files in the cache: file names are plain
    arguments (``--include`` takes one glob and is ignored when names are given)."""
    revision = [] if spec.revision == "main" else ["--revision", spec.revision]
    return ["hf", "download", spec.repo_id, *missing, *revision]


class DownloadVerificationError(OSError):
    """A downloaded file failed its checks (size, checksum, contents); it was not saved."""


class _Failed(Exception):
    """A fetch that did not work: the reason, in one line, and the files still missing."""

    def __init__(self, reason: str, missing: list[str] | None = None) -> None:
        super().__init__(reason)
        self.reason, self.missing = reason, missing or []


class _NotOnHub(Exception):
    """The repo has no such file (HTTP 404 EntryNotFound)."""


# ------------------------------------------------------------------------------------------- fetch


def _endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def _use_huggingface_hub() -> bool:
    choice = os.environ.get("INFERNO_DOWNLOADER", "").strip().lower()
    if choice == "urllib":
        return False
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        return False
    return True


def _fetch(spec: ModelSpec, *, skip: tuple[str, ...], progress: bool) -> Path:
    """Fetch what the cache lacks of `spec` into it; returns the complete snapshot folder. Raises
    `_Failed` (the reason in one line), or `ConfigError` when the config is not GPT-2's."""
    get = _get_with_huggingface_hub if _use_huggingface_hub() else _get_with_urllib
    snapshot = find_cached_snapshot(spec.repo_id, spec.revision)
    have = set() if snapshot is None else {n for n in _ALL_FILES if (snapshot / n).is_file()}
    revision = spec.revision if snapshot is None else snapshot.name
    # The weights are checked against this config as they arrive (the shipped one for gpt2).
    config_file = shipped_gpt2_file("config.json") if "config.json" in skip else None

    probe = get is _get_with_huggingface_hub  # once, before the first download (see _unreachable)

    def fetch(name: str) -> Path:
        nonlocal revision, probe
        if probe and (unreachable := _unreachable(_endpoint())) is not None:
            raise _Failed(f"download failed: {unreachable}")  # at once: it would retry for ~23 s first
        probe = False
        path = get(spec.repo_id, revision, name, progress, config_file)
        revision = path.parent.name  # the commit: every later file comes from the same one
        return path

    try:
        if "config.json" not in skip:
            config = snapshot / "config.json" if "config.json" in have else fetch("config.json")
            Gpt2Config.from_file(config)  # not GPT-2: refused here, before gigabytes of weights
        if "tokenizer.json" not in skip and "tokenizer.json" not in have and not set(_BPE_FILES) <= have:
            try:
                fetch("tokenizer.json")
            except _NotOnHub:
                try:
                    for name in _BPE_FILES:
                        fetch(name)
                except _NotOnHub:
                    raise _Failed(f"{spec.repo_id} has neither tokenizer.json nor vocab.json + merges.txt",
                                  ["tokenizer.json"]) from None
        if "model.safetensors" not in have:
            try:
                path = fetch("model.safetensors")
            except _NotOnHub:
                raise _Failed(f"{spec.repo_id} has no model.safetensors (inferno reads one safetensors "
                              f"file; not a pytorch_model.bin or sharded weights)",
                              ["model.safetensors"]) from None
        else:
            path = snapshot / "model.safetensors"
    except _NotOnHub as exc:
        raise _Failed(str(exc)) from None
    snapshot = path.parent
    if spec.revision != snapshot.name and not _COMMIT.fullmatch(spec.revision):
        _write_ref(repo_cache_dir(spec.repo_id), spec.revision, snapshot.name)
    return snapshot


def _write_ref(repo: Path, revision: str, commit: str) -> None:
    ref = repo / "refs" / revision
    if _read_ref(repo, revision) == commit:
        return
    ref.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".ref.", dir=ref.parent)
    with os.fdopen(fd, "w") as f:
        f.write(commit)
    os.replace(tmp, ref)


# -------------------------------------------------------------------- huggingface_hub's downloader


def _get_with_huggingface_hub(repo_id: str, revision: str, name: str, progress: bool,
                              config: Path | None = None) -> Path:
    """One file through huggingface_hub.hf_hub_download (its own progress bar, size check and retries;
    the files are checked when loaded)."""
    import huggingface_hub
    from huggingface_hub import errors

    kwargs: dict[str, Any] = {}
    if not progress:
        from tqdm.auto import tqdm

        class _Quiet(tqdm):
            def __init__(self, *args: Any, **kw: Any) -> None:
                kw["disable"] = True
                super().__init__(*args, **kw)

        kwargs["tqdm_class"] = _Quiet
    try:
        path = huggingface_hub.hf_hub_download(repo_id, name, revision=revision, cache_dir=hf_cache_dir(),
                                               endpoint=_endpoint(), **kwargs)
    except errors.LocalEntryNotFoundError as exc:  # no connection (a subclass of EntryNotFoundError)
        raise _Failed(f"download failed: {_one_line(exc)}") from None
    except errors.EntryNotFoundError:
        raise _NotOnHub(f"{repo_id} has no {name}") from None
    except errors.RevisionNotFoundError:
        raise _Failed(f"{repo_id} has no revision {revision!r} on {_endpoint()}") from None
    except errors.GatedRepoError:
        raise _Failed(f"{repo_id} is gated: accept its terms on {_endpoint()}/{repo_id} and set HF_TOKEN") \
            from None
    except errors.RepositoryNotFoundError:
        raise _Failed(f"no repo {repo_id} on {_endpoint()} (or it is private: set HF_TOKEN)") from None
    except (OSError, ValueError, errors.HfHubHTTPError) as exc:
        # LocalEntryNotFoundError (no connection), HTTP errors, a bad endpoint URL.
        raise _Failed(f"download failed: {_one_line(exc)}") from None
    except Exception as exc:
        if type(exc).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore", "requests"):
            raise _Failed(f"download failed: {_one_line(exc)}") from None  # a connection error it let out
        raise
    return Path(path)


def _unreachable(endpoint: str) -> str | None:
    """Why no connection to the endpoint's host can be opened at all (no network, a wrong name, a closed
    port), or None. huggingface_hub retries such a failure five times, ~23 s, before saying so; a host
    that answers but flakes still gets its retries."""
    url = urllib.parse.urlsplit(endpoint)
    try:
        port = url.port or (443 if url.scheme == "https" else 80)
    except ValueError:  # a port that is not a number: huggingface_hub says what is wrong with it
        return None
    if not url.hostname or (url.scheme in urllib.request.getproxies()
                            and not urllib.request.proxy_bypass(url.hostname)):
        return None  # through a proxy, the host itself need not be reachable
    try:
        socket.create_connection((url.hostname, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        return f"cannot connect to {url.hostname}:{port} ({_one_line(exc)})"
    return None


def _one_line(exc: BaseException) -> str:
    text = squash(exc)
    return text if len(text) <= 400 else text[:397] + "..."


# ----------------------------------------------------------------------- the standard library's


@dataclass
class _Metadata:
    commit: str
    etag: str
    size: int | None
    location: str


class _NoForeignRedirects(urllib.request.HTTPRedirectHandler):
    """Follows redirects on the Hub's own host only; a redirect elsewhere (its CDN) is answered as is,
    since the file's metadata is on it, and the token must not leave the Hub."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 - urllib's API
        if urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            return None  # urllib then raises HTTPError with this response
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class _DropTokenOffHost(urllib.request.HTTPRedirectHandler):
    """Follows every redirect, without the Authorization header once it leaves the first host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 - urllib's API
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        host = urllib.parse.urlsplit(req.full_url).netloc
        if new is not None and urllib.parse.urlsplit(newurl).netloc != host:
            new.remove_header("Authorization")
        return new


def _headers(extra: dict[str, str] | None = None) -> dict[str, str]:
    headers = {"User-Agent": "inferno (urllib)", "Accept-Encoding": "identity"}
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token.strip()}"
    return {**headers, **(extra or {})}


def _normalize_etag(etag: str | None) -> str | None:
    if not etag:
        return None
    return etag.strip().removeprefix("W/").strip('"') or None


def _metadata(repo_id: str, revision: str, name: str) -> _Metadata:
    """HEAD of the file's resolve URL, as huggingface_hub does: its commit, etag, size and location."""
    url = f"{_endpoint()}/{repo_id}/resolve/{urllib.parse.quote(revision, safe='')}/{name}"
    opener = urllib.request.build_opener(_NoForeignRedirects())
    request = urllib.request.Request(url, headers=_headers(), method="HEAD")
    try:
        response = opener.open(request, timeout=CONNECT_TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        if exc.code in (301, 302, 303, 307, 308):
            response = exc  # a redirect to the CDN: the file's metadata is on it
        elif exc.code == 404 and exc.headers.get("X-Error-Code") in (None, "EntryNotFound"):
            raise _NotOnHub(f"{repo_id} has no {name}") from None
        elif exc.headers.get("X-Error-Code") == "RevisionNotFound":
            raise _Failed(f"{repo_id} has no revision {revision!r} on {_endpoint()}") from None
        elif exc.code in (401, 403, 404):
            gated = exc.headers.get("X-Error-Code") == "GatedRepo"
            raise _Failed(f"{repo_id} is gated: accept its terms on {_endpoint()}/{repo_id} and set HF_TOKEN"
                          if gated else f"no repo {repo_id} on {_endpoint()} (HTTP {exc.code}; or it is "
                          f"private: set HF_TOKEN)") from None
        else:
            raise
    with response:
        headers = response.headers
        location = urllib.parse.urljoin(url, headers.get("Location") or response.geturl())
        redirect = bool(headers.get("Location"))
    commit = (headers.get("X-Repo-Commit") or "").strip()
    etag = _normalize_etag(headers.get("X-Linked-Etag") or headers.get("ETag"))
    size_text = headers.get("X-Linked-Size") or (None if redirect else headers.get("Content-Length"))
    if not _COMMIT.fullmatch(commit) or not etag or "/" in etag:
        raise _Failed(f"the answer from {url} lacks the Hub's X-Repo-Commit and ETag headers (is HF_ENDPOINT "
                      f"a Hugging Face Hub?)")
    return _Metadata(commit, etag, int(size_text) if size_text and size_text.isdigit() else None, location)


def _get_with_urllib(repo_id: str, revision: str, name: str, progress: bool,
                     config: Path | None = None) -> Path:
    """One file into the cache with the standard library (see the module docstring); model.safetensors
    is checked against `config` (else the snapshot's config.json)."""
    try:
        meta = _metadata(repo_id, revision, name)
        repo = repo_cache_dir(repo_id)
        pointer = repo / "snapshots" / meta.commit / name
        blob = repo / "blobs" / meta.etag
        if not blob.is_file():
            blob.parent.mkdir(parents=True, exist_ok=True)
            with _lock(repo.parent / ".locks" / repo.name / f"{meta.etag}.lock"):
                if not blob.is_file():
                    _download_blob(meta, blob, name, config or pointer.parent / "config.json", progress)
        _link(pointer, blob)
        return pointer
    except (_Failed, _NotOnHub):
        raise
    except (OSError, http.client.HTTPException, ValueError) as exc:
        # URLError/HTTPError/timeouts are OSErrors; a short body is IncompleteRead; a bad HF_ENDPOINT is a
        # ValueError; DownloadVerificationError says what was wrong.
        raise _Failed(f"download failed: {_describe_error(exc)}", [name]) from None


def _describe_error(e: Exception) -> str:
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code} {e.reason} for {e.url}"
    if isinstance(e, urllib.error.URLError):
        return f"{e.reason} ({getattr(e, 'url', '') or _endpoint()})"
    return _one_line(e) or type(e).__name__


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (the lock file huggingface_hub takes for the same blob), so two
    downloads of one file never write it at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        try:
            import fcntl
        except ImportError:  # Windows: no flock; the unique temporary name still keeps files apart
            yield
            return
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _open_partial(path: Path) -> tuple[IO[bytes], int]:
    """The partial download at `path` opened for appending, and its size; created if absent. Never a link
    (O_NOFOLLOW) nor anything but a regular file."""
    flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o600)
    st = os.fstat(fd)
    import stat

    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise DownloadVerificationError(f"{path} is not a regular file: not written to")
    return os.fdopen(fd, "a+b"), st.st_size


def _hasher(etag: str, size: int | None) -> Any:
    """What checks the bytes: SHA-256 for large (LFS) files, the git blob hash for small ones; None when
    the etag is neither."""
    if _SHA256.fullmatch(etag):
        return hashlib.sha256()
    if re.fullmatch(r"[0-9a-f]{40}", etag) and size is not None:
        h = hashlib.sha1(usedforsecurity=False)
        h.update(b"blob %d\0" % size)
        return h
    return None


def _download_blob(meta: _Metadata, blob: Path, name: str, config: Path, progress: bool) -> None:
    """Stream the file into ``blob.incomplete`` (resuming it), verify it, then move it to `blob`."""
    part = blob.with_name(blob.name + ".incomplete")
    bar = _Progress(name, meta.location, sys.stderr) if progress else None
    out, have = _open_partial(part)
    keep = True  # an interrupted download is kept, to be resumed
    try:
        with out:
            if meta.size is not None and have > meta.size:
                out.truncate(0)
                have = 0
            digest = _hasher(meta.etag, meta.size)
            if digest is not None and have:
                out.seek(0)
                while chunk := out.read(_CHUNK):
                    digest.update(chunk)
            if bar:
                bar.start(meta.size, have)
            for attempt in range(_ATTEMPTS):
                before = have
                try:
                    have = _stream(meta, out, have, digest, bar)
                    break
                except _RangeIgnored:  # the server sends the whole file: start over
                    out.truncate(0)
                    have, digest = 0, _hasher(meta.etag, meta.size)
                    have = _stream(meta, out, have, digest, bar)
                    break
                except (OSError, http.client.HTTPException) as exc:
                    out.flush()
                    have = os.fstat(out.fileno()).st_size  # what arrived before the connection dropped
                    if isinstance(exc, urllib.error.HTTPError) or have == before or attempt == _ATTEMPTS - 1:
                        raise  # no progress, or an answer that is no dropped connection: give up
                    time.sleep(min(2.0, 0.1 * 2**attempt))
            out.flush()
            os.fsync(out.fileno())
        keep = False  # from here a failure means bad bytes: they go
        if meta.size is not None and have != meta.size:
            raise DownloadVerificationError(f"{name} is {have} bytes, but the Hub lists {meta.size}: "
                                            "not saved")
        if digest is not None and digest.hexdigest() != meta.etag:
            what = "SHA-256" if digest.name == "sha256" else "git blob hash"
            raise DownloadVerificationError(f"{name} has {what} {digest.hexdigest()}, but the Hub lists "
                                            f"{meta.etag}: not saved")
        _verify_contents(part, name, config)
        os.chmod(part, 0o666 & ~_umask())  # the cache is shared like huggingface_hub's, not private
        _move_into_place(part, blob)
        if bar:
            bar.finish(have)
    except BaseException:
        # Network errors and Ctrl-C keep the partial file for the next run; failed checks delete it.
        if bar:
            bar.abort()
        if not keep:
            part.unlink(missing_ok=True)
        raise


class _RangeIgnored(Exception):
    """A Range request answered with the whole file."""


def _stream(meta: _Metadata, out: IO[bytes], have: int, digest: Any, bar: _Progress | None) -> int:
    """GET the file from byte `have` on (a Range request), appending to `out`; returns the bytes held."""
    extra = {"Range": f"bytes={have}-"} if have else {}
    headers = _headers(extra)
    if urllib.parse.urlsplit(meta.location).netloc != urllib.parse.urlsplit(_endpoint()).netloc:
        headers.pop("Authorization", None)  # the token is for the Hub, not for its CDN
    request = urllib.request.Request(meta.location, headers=headers)
    opener = urllib.request.build_opener(_DropTokenOffHost())
    with opener.open(request, timeout=CONNECT_TIMEOUT_S) as response:
        if have and response.status != 206:
            raise _RangeIgnored
        length = response.headers.get("Content-Length")
        expected = have + int(length) if length and length.isdigit() else None
        while chunk := response.read(_CHUNK):
            out.write(chunk)
            if digest is not None:
                digest.update(chunk)
            have += len(chunk)
            if bar:
                bar.update(have)
        if expected is not None and have != expected:
            raise http.client.IncompleteRead(b"", expected - have)
    return have


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _verify_contents(tmp: Path, name: str, config_file: Path) -> None:
    """Check that a downloaded file is what its name says (an HTML error page served with status 200 is
    not); raises `DownloadVerificationError` with the reason. A config.json need only be a JSON object
    here: one that is not GPT-2's is refused afterwards, naming the field."""
    from inferno.config import ConfigError, parse_json, read_regular_file
    from inferno.tokenizer import Tokenizer, TokenizerError
    from inferno.weights import WeightsError, plan_tensors, read_safetensors_header

    def bad(reason: str) -> DownloadVerificationError:
        reason = reason.replace(os.fspath(tmp), name)
        return DownloadVerificationError(f"the downloaded {name} is not usable ({reason}): not saved")

    try:
        if name in ("config.json", "vocab.json"):
            text = read_regular_file(tmp, 64 << 20, f"a {name}")
            if not isinstance(parse_json(text, name, ConfigError), dict):
                raise ConfigError(name, ["expected a JSON object"])
        elif name == "tokenizer.json":
            Tokenizer.from_file(tmp)
        elif name == "model.safetensors":
            header = read_safetensors_header(tmp)
            try:  # against the config beside it, when there is a usable one (else at load)
                config = Gpt2Config.from_file(config_file)
            except ConfigError:
                return
            _, problems = plan_tensors(header, config)
            if problems:
                raise WeightsError(tmp, [f"it does not match config.json: {'; '.join(problems)}"])
    except (ConfigError, TokenizerError, WeightsError, OSError, UnicodeDecodeError) as exc:
        raise bad(_one_line(exc)) from None


def _move_into_place(part: Path, dest: Path) -> None:
    """Rename ``part`` (our own file) to ``dest`` atomically without ever replacing an existing ``dest``
    (a symlink, even a dangling one, counts as existing)."""
    try:
        os.link(part, dest, follow_symlinks=False)  # fails if dest exists, unlike rename
    except FileExistsError:
        pass  # someone else put it there meanwhile: theirs wins
    except OSError:
        # Filesystems without hard links: a plain rename, after checking.
        if not os.path.lexists(dest):
            os.replace(part, dest)
            return
    part.unlink(missing_ok=True)


def _link(pointer: Path, blob: Path) -> None:
    """``snapshots/<commit>/<name>`` → ``../../blobs/<etag>``, as huggingface_hub links them. A file that
    is there already is left alone; only a link that no longer leads anywhere is replaced."""
    if pointer.is_file():
        return
    pointer.parent.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(pointer) and not pointer.is_symlink():
        raise DownloadVerificationError(f"{pointer} is in the way (not a file, not a link): not replaced")
    target = os.path.relpath(blob, pointer.parent)
    tmp = pointer.with_name(f".{pointer.name}.{os.getpid()}.inferno-link")
    tmp.unlink(missing_ok=True)
    try:
        os.symlink(target, tmp)
    except OSError:  # no symlinks here (some Windows setups): a hard link, as a copy that costs nothing
        os.link(blob, tmp)
    os.replace(tmp, pointer)


class _Progress:
    """A text progress bar on a terminal; start/finish lines otherwise."""

    min_interval_s = 0.1  # redraw at most this often

    def __init__(self, name: str, url: str, stream: IO[str]) -> None:
        self.name, self.url, self.stream = name, url, stream
        self.live = hasattr(stream, "isatty") and stream.isatty()
        self.total: int | None = None
        self.last = 0.0
        self.drawn = False

    def start(self, total: int | None, have: int = 0) -> None:
        self.total = total
        if not self.live:
            size = f" ({total / 1e6:.1f} MB)" if total is not None else ""
            resumed = f", resuming at {have / 1e6:.1f} MB" if have else ""
            print(f"downloading {self.url}{size}{resumed}", file=self.stream, flush=True)

    def update(self, received: int) -> None:
        now = time.monotonic()
        if not self.live or now - self.last < self.min_interval_s:
            return
        self.last = now
        mb = received / 1e6
        if self.total:
            frac = min(1.0, received / self.total)
            filled = int(frac * 30)
            bar = "#" * filled + "." * (30 - filled)
            line = f"{self.name} [{bar}] {mb:.1f}/{self.total / 1e6:.1f} MB {frac:4.0%}"
        else:
            line = f"{self.name} {mb:.1f} MB"
        self.stream.write("\r" + line)
        self.stream.flush()
        self.drawn = True

    def finish(self, received: int) -> None:
        if self.live:
            self.last = float("-inf")  # always draw the final state
            self.update(received)
            self.stream.write("\n")
            self.stream.flush()
        else:
            print(f"downloaded {self.name} ({received / 1e6:.1f} MB)", file=self.stream, flush=True)

    def abort(self) -> None:
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()
