"""Model names → model files: a local folder, or a Hub repo in the Hugging Face cache (fetched there by
huggingface_hub, the one downloader: see `inferno.models.download`).

Hub files live in the Hugging Face cache as huggingface_hub lays it out (``models--ORG--NAME/`` with
``blobs/``, ``refs/`` and ``snapshots/<commit>/`` links), so every tool that uses it shares one copy:
``HF_HUB_CACHE``, ``HF_HOME`` and ``XDG_CACHE_HOME`` choose where; ``HF_HUB_OFFLINE`` (or
``INFERNO_OFFLINE``) set to 1/true/yes/on means no request is made. A model found in the cache is used
without a request.

Otherwise what is missing is fetched in this order: config.json first (a model inferno does not run is
refused before its weights come down; its family, `inferno.models.families`, says which other files it
needs), then tokenizer.json (vocab.json + merges.txt when the repo has none), then the optional files
the family reads (the Llama family's tokenizer_config.json, generation_config.json and
chat_template.jinja, when the repo has them), then the weights: model.safetensors, or for a family that
reads sharded checkpoints model.safetensors.index.json and the shards it lists, all from the commit the
first file came from. For ``gpt2`` at its main
revision, the config.json and tokenizer.json that ship with inferno stand in for the Hub's when the cache
lacks them, so only the weights are fetched. Errors are one line (`ModelFilesMissing`), with the offline
advice or the command that fetches what is missing.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from inferno.models.download import (
    DownloadFailed,
    DownloadVerificationError,
    NotOnHub,
    check_tokenizer,
    hf_download,
    one_line,
    unreachable,
)
from inferno.models.families import Family, read_config
from inferno.models.names import COMMIT, ModelNameError, ModelSpec, parse_model_name
from inferno.models.weights import INDEX_FILE, WeightsError, checkpoint_files

__all__ = [
    "REQUIRED_FILES",
    "ModelFilesMissing",
    "DownloadVerificationError",
    "ModelFiles",
    "resolve_model",
    "resolve_model_dir",
    "hf_cache_dir",
    "repo_cache_dir",
    "find_cached_snapshot",
    "shipped_gpt2_file",
    "is_offline",
    "fetch_command",
]

# What a model folder holds; the tokenizer is tokenizer.json, or vocab.json + merges.txt.
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")
_BPE_FILES = ("vocab.json", "merges.txt")
_ALL_FILES = (*REQUIRED_FILES, *_BPE_FILES)
_SHIPPED_REPO = "openai-community/gpt2"  # whose config.json and tokenizer.json ship with inferno
DEFAULT_ENDPOINT = "https://huggingface.co"
_TRUE = {"1", "true", "yes", "on"}
RANDOM_HINT = "-m random (random weights: gibberish, but no download)"


# ------------------------------------------------------------------------------------------- files


@dataclass(frozen=True)
class ModelFiles:
    """Where a model's files are. `weights` is a model.safetensors or a sharded checkpoint's
    model.safetensors.index.json (its shards beside it). `tokenizer` is a tokenizer.json, or None and
    then `vocab` + `merges`."""

    config: Path
    weights: Path
    tokenizer: Path | None
    vocab: Path | None = None
    merges: Path | None = None
    id: str = ""


def shipped_gpt2_file(name: str) -> Path:
    """The config.json or tokenizer.json of openai-community/gpt2 that ship with inferno."""
    folder = Path(__file__).resolve().parent.parent / "data" / "gpt2"  # package data (pyproject.toml)
    if (folder / name).is_file():
        return folder / name
    raise ModelFilesMissing([name], [folder],
                            reason="the copy that ships with inferno is missing (a broken install?)")


def _weights_in(directory: Path, there: Callable[[Path], bool]) -> tuple[Path | None, list[str]]:
    """The checkpoint in a folder: model.safetensors, else a model.safetensors.index.json whose shards are
    all there; or None and what is missing (the shards that are not there, or model.safetensors)."""
    if there(directory / "model.safetensors"):
        return directory / "model.safetensors", []
    index = directory / INDEX_FILE
    if not there(index):
        return None, ["model.safetensors"]
    try:
        shards = [Path(p) for p in checkpoint_files(index)]
    except WeightsError:
        return None, [INDEX_FILE]  # an index that cannot be read: fetched again (the loader says why)
    missing = [p.name for p in shards if not there(p)]
    return (None, missing) if missing else (index, [])


def _files_in(directory: Path, spec_id: str, cache: bool = True) -> tuple[ModelFiles | None, list[str]]:
    """The model files in one folder, or None and what is missing. In the cache, a link to a deleted
    blob counts as missing (it is fetched again); in a user's folder, whatever is there is the user's
    (a FIFO, a dangling link: the loaders then say what is wrong with it)."""
    there = Path.is_file if cache else os.path.lexists
    have = {n for n in _ALL_FILES if there(directory / n)}
    missing = [] if "config.json" in have else ["config.json"]
    weights, missing_weights = _weights_in(directory, there)
    missing += missing_weights
    if "tokenizer.json" not in have and not set(_BPE_FILES) <= have:
        missing.append("tokenizer.json")
    if missing:
        return None, missing
    tok = directory / "tokenizer.json" if "tokenizer.json" in have else None
    bpe = (None, None) if tok else (directory / "vocab.json", directory / "merges.txt")
    return ModelFiles(directory / "config.json", weights, tok, *bpe, id=spec_id), []


def resolve_model(name: str | os.PathLike[str] | ModelSpec | None = None, *, download: bool = True,
                  progress: bool = True) -> ModelFiles:
    """The files of model `name` (a name, or a `ModelSpec` parsed already; see `inferno.models.names`),
    fetched into the Hugging Face cache when missing there and `download` is true and not offline.
    With `progress`, huggingface_hub draws its progress bars, and a name that could also have meant a
    folder here gets one line on stderr saying which one this is.

    Raises `ModelNameError` for a name that means nothing, `ModelFilesMissing` (one line, or two as
    ``lines``) when files are missing and cannot be fetched, and `ConfigError` when a Hub model's
    config.json is not one inferno runs (before its weights are fetched).
    """
    spec = name if isinstance(name, ModelSpec) else parse_model_name(name)
    if spec.kind == "random":
        raise ModelNameError(f"{spec.name!r} has no files: it is built in memory (inferno.load builds it)")
    if progress and spec.note:
        print(f"inferno: {spec.note}", file=sys.stderr, flush=True)
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
    except DownloadFailed as exc:
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


def resolve_model_dir(model_dir: str | os.PathLike[str] | ModelSpec | None = None, *, download: bool = True,
                      progress: bool = True) -> Path:
    """One folder holding all of a model's files (for code that passes a folder on): a local folder, or
    the Hub model's cache snapshot, fetching whatever it lacks (the shipped config.json and tokenizer.json
    do not stand in here). Prefer `resolve_model`. Raises as `resolve_model` does."""
    spec = model_dir if isinstance(model_dir, ModelSpec) else parse_model_name(model_dir)
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
    """The Hugging Face hub cache, resolved the way huggingface_hub does (read on each call, so that a
    change of the environment after import counts)."""
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
    ref (a cache filled by hand), the newest snapshot holding config.json and model.safetensors (or a
    sharded checkpoint's index).
    """
    repo = repo_cache_dir(repo_id, cache_dir)
    snapshots = repo / "snapshots"
    if COMMIT.fullmatch(revision):
        return snapshots / revision if (snapshots / revision).is_dir() else None
    commit = _read_ref(repo, revision)
    if commit:
        return snapshots / commit if (snapshots / commit).is_dir() else None
    if revision != "main":
        return None
    try:
        candidates = [p for p in snapshots.iterdir()
                      if p.is_dir() and (p / "config.json").is_file()
                      and ((p / "model.safetensors").is_file() or (p / INDEX_FILE).is_file())]
    except OSError:
        return None
    return max(candidates, key=lambda p: p.stat().st_mtime) if candidates else None


def _read_ref(repo: Path, revision: str) -> str | None:
    if ".." in revision.split("/") or revision.startswith("/"):
        return None
    try:
        commit = (repo / "refs" / revision).read_text().strip()
    except OSError:
        return None
    return commit if COMMIT.fullmatch(commit) else None


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
        parts = [f"model file(s){what} missing: {', '.join(self.missing)}"] if self.missing else []
        parts.append(f"looked in {', '.join(self.searched)}")
        if self.reason:
            parts.append(" ".join(self.reason.split()))  # one line, whatever the network library said
        return "; ".join(parts)

    @property
    def remedy(self) -> str:
        """What to do: for a folder, what it must hold; for a Hub model, how to fetch it (`hf download`,
        through this Python when the command is not on PATH) or to try `-m random`."""
        spec = self.spec
        if spec is None or spec.kind != "hub":
            return ("put the files there, or name a Hub model instead (gpt2, ORG/NAME); or try "
                    + RANDOM_HINT)
        offline = [n for n in ("HF_HUB_OFFLINE", "INFERNO_OFFLINE") if _env_true(n)]
        if offline:
            return f"unset {' and '.join(offline)} to download it, or try {RANDOM_HINT}"
        return f"fetch it with: {shlex.join(fetch_command(spec, self.missing))}; or try {RANDOM_HINT}"

    @property
    def lines(self) -> tuple[str, str]:
        return self.problem, self.remedy

    def _message(self) -> str:
        return "; ".join(self.lines)

    def __str__(self) -> str:
        return self._message()


def fetch_command(spec: ModelSpec, missing: Iterable[str] = ()) -> list[str]:
    """The `hf download` command (as argv) that puts `spec`'s files in the cache: file names are plain
    arguments (``--include`` takes one glob and is ignored when names are given). `hf` comes with
    huggingface_hub; when it is not on PATH, it is run through this Python."""
    revision = [] if spec.revision == "main" else ["--revision", spec.revision]
    hf = ["hf"] if shutil.which("hf") else [sys.executable, "-m", "huggingface_hub.cli.hf"]
    return [*hf, "download", spec.repo_id, *missing, *revision]


# ------------------------------------------------------------------------------------------- fetch


def _endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


#: Files a family may read beside config.json, the tokenizer and the weights (see `Family.files`).
OPTIONAL_FILES = ("tokenizer_config.json", "generation_config.json", "chat_template.jinja")


def _check_architecture(config: Path) -> Family:
    """The family of a config.json; `ConfigError` (one line, naming the field) when inferno does not run
    its model."""
    return read_config(config)[0]


def _fetch(spec: ModelSpec, *, skip: tuple[str, ...], progress: bool) -> Path:
    """Fetch what the cache lacks of `spec` into it; returns the complete snapshot folder. Raises
    `DownloadFailed` (the reason in one line), or `ConfigError` when the config is not one inferno runs."""
    snapshot = find_cached_snapshot(spec.repo_id, spec.revision)
    revision = spec.revision if snapshot is None else snapshot.name
    # The weights are checked against this config once fetched (the shipped one for gpt2).
    config_file = shipped_gpt2_file("config.json") if "config.json" in skip else None
    probe = True  # once, before the first download

    def have(name: str) -> bool:
        return snapshot is not None and (snapshot / name).is_file()

    def fetch(name: str) -> Path:
        nonlocal revision, probe
        if probe and (why := unreachable(_endpoint())) is not None:
            # Said at once, where huggingface_hub would retry first; the command then fetches this file.
            raise DownloadFailed(f"download failed: {why}", [name])
        probe = False
        path = hf_download(spec.repo_id, revision, name, progress=progress, config=config_file,
                           cache_dir=hf_cache_dir(), endpoint=_endpoint())
        revision = path.parent.name  # the commit: every later file comes from the same one
        return path

    try:
        config = config_file
        if config is None:
            config = snapshot / "config.json" if have("config.json") else fetch("config.json")
        family = _check_architecture(config)  # refused here, before gigabytes of weights
        if have("tokenizer.json"):  # fetched before: one of a kind inferno does not read is refused here
            check_tokenizer(snapshot / "tokenizer.json")
        elif "tokenizer.json" not in skip and not all(map(have, _BPE_FILES)):
            try:
                fetch("tokenizer.json")
            except NotOnHub:
                try:
                    for name in _BPE_FILES:
                        fetch(name)
                except NotOnHub:
                    raise DownloadFailed(f"{spec.repo_id} has neither tokenizer.json nor vocab.json + "
                                         "merges.txt", ["tokenizer.json"]) from None
        for name in family.files:  # optional: a repo without one is fine
            if not have(name):
                with contextlib.suppress(NotOnHub):
                    fetch(name)
        return _fetch_weights(spec, family, snapshot, have, fetch)
    except NotOnHub as exc:
        raise DownloadFailed(str(exc)) from None


def _fetch_weights(spec: ModelSpec, family: Family, snapshot: Path | None, have: Callable[[str], bool],
                   fetch: Callable[[str], Path]) -> Path:
    """model.safetensors, else (for a family that reads them) the index of a sharded checkpoint and each
    shard it lists; returns the snapshot folder. `have(name)`: whether `snapshot` holds it already."""
    if snapshot is not None and have("model.safetensors"):
        return snapshot
    if snapshot is None or not have(INDEX_FILE):
        try:
            return fetch("model.safetensors").parent
        except NotOnHub:
            if not family.sharded:
                raise DownloadFailed(f"{spec.repo_id} has no model.safetensors (inferno reads {family.label} "
                                     "weights from one safetensors file; not a pytorch_model.bin or sharded "
                                     "weights)", ["model.safetensors"]) from None
        try:
            index = fetch(INDEX_FILE)
        except NotOnHub:
            raise DownloadFailed(f"{spec.repo_id} has neither model.safetensors nor {INDEX_FILE} (inferno "
                                 "reads safetensors weights, not pytorch_model.bin)", ["model.safetensors"]
                                 ) from None
    else:
        index = snapshot / INDEX_FILE
    try:
        shards = checkpoint_files(index)  # checked when it was fetched: plain names beside it
    except WeightsError as exc:
        raise DownloadFailed(one_line(exc), [INDEX_FILE]) from None
    for shard in shards:
        name = os.path.basename(shard)
        if not have(name):
            fetch(name)
    return index.parent

