"""One file of a Hub repo into the Hugging Face cache, through huggingface_hub (the one downloader), guarded
while it arrives and checked once it is there.

`hf_download` calls ``huggingface_hub.hf_hub_download`` (its cache layout, progress bars, retries and
resumes, Xet, tokens, ``HF_ENDPOINT``) and adds:

* guards on the wire (`_Guard`, hooks on huggingface_hub's HTTP client, active only on the thread
  downloading): a redirect to anything but http(s) is refused; a body is asked for uncompressed (and
  refused compressed, since it could expand past its listed size); a commit or ETag that could not be a
  path in the cache is refused; no file is written past the size the Hub listed for it; a download that
  keeps fewer than `MIN_RATE` bytes a second over ``INFERNO_DOWNLOAD_STALL_SECONDS`` (default 60) gives up;
* checks of the fetched file (`_verify`): its SHA-256 or git blob hash against its blob's name, and its
  contents (a config.json, tokenizer_config.json, generation_config.json or index.json must be a JSON
  object, a tokenizer.json a usable tokenizer, a chat_template.jinja text, a .safetensors file a header
  matching the config: a shard holds the tensors its index names for it). A file that fails is removed
  from the cache (the blob and the snapshot link), so that the next run fetches it again;
* errors in one line (`DownloadFailed`, `NotOnHub`), and a quick "cannot connect" (`unreachable`) where
  huggingface_hub would retry for half a minute.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from inferno.errors import squash
from inferno.tokenizer import TokenizerError

__all__ = ["DownloadVerificationError", "DownloadFailed", "NotOnHub", "UnsupportedTokenizer",
           "check_tokenizer", "hf_download", "unreachable",
           "MIN_RATE", "STALL_SECONDS_VAR"]

CONNECT_TIMEOUT_S = 10.0
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
#: The slowest a download may go, in bytes a second, measured over each stall window.
MIN_RATE = 1024
STALL_SECONDS_VAR = "INFERNO_DOWNLOAD_STALL_SECONDS"
DEFAULT_STALL_SECONDS = 60.0
# The most a small file (config, tokenizer) may be when the Hub lists no size for it.
_SMALL_FILE_LIMIT = 256 << 20


class DownloadVerificationError(OSError):
    """A downloaded file failed a check (its size, checksum or contents, or the way it was served); it
    was not kept."""


class DownloadFailed(Exception):
    """A download that did not work: the reason, in one line, and the files still missing."""

    def __init__(self, reason: str, missing: list[str] | None = None) -> None:
        super().__init__(reason)
        self.reason, self.missing = reason, missing or []


class NotOnHub(Exception):
    """The repo has no such file (HTTP 404 EntryNotFound)."""


class UnsupportedTokenizer(TokenizerError):
    """A tokenizer.json of a kind inferno does not read (a TokenizerError, in one line naming the file):
    the model is refused before its weights are fetched, and the file, the Hub's own, stays cached."""


def hf_download(repo_id: str, revision: str, name: str, *, progress: bool, config: Path | None,
                cache_dir: Path, endpoint: str) -> Path:
    """One file into the cache through huggingface_hub.hf_hub_download, under a `_Guard`, then checked
    (see `_verify`; model.safetensors against `config`, else the snapshot's config.json). A file that
    fails its checks is removed from the cache."""
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
        with _Guard(name).active():
            path = Path(huggingface_hub.hf_hub_download(
                repo_id, name, revision=revision, cache_dir=cache_dir, endpoint=endpoint, **kwargs))
    except DownloadVerificationError as exc:  # refused by the guard; huggingface_hub kept nothing
        raise DownloadFailed(f"download failed: {one_line(exc)}", [name]) from None
    except errors.LocalEntryNotFoundError as exc:  # no connection (a subclass of EntryNotFoundError)
        raise DownloadFailed(f"download failed: {one_line(exc)}") from None
    except errors.EntryNotFoundError:
        raise NotOnHub(f"{repo_id} has no {name}") from None
    except errors.RevisionNotFoundError:
        raise DownloadFailed(f"{repo_id} has no revision {revision!r} on {endpoint}") from None
    except errors.GatedRepoError:
        raise DownloadFailed(f"{repo_id} is gated: accept its terms on {endpoint}/{repo_id} and set "
                             "HF_TOKEN") from None
    except errors.RepositoryNotFoundError:
        raise DownloadFailed(f"no repo {repo_id} on {endpoint} (or it is private: set HF_TOKEN)") from None
    except (OSError, ValueError, errors.HfHubHTTPError) as exc:
        # HTTP errors, a size that does not match, a bad endpoint URL.
        raise DownloadFailed(f"download failed: {one_line(exc)}", [name]) from None
    except Exception as exc:
        if type(exc).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore", "requests"):
            raise DownloadFailed(f"download failed: {one_line(exc)}", [name]) from None  # a connection error
        raise
    try:
        _verify(path, name, config or path.parent / "config.json")
    except DownloadVerificationError as exc:
        _discard(path, cache_dir / ("models--" + repo_id.replace("/", "--")))
        raise DownloadFailed(str(exc), [name]) from None
    return path


def unreachable(endpoint: str) -> str | None:
    """Why no connection to the endpoint's host can be opened at all (no network, a wrong name, a closed
    port), or None. huggingface_hub retries such a failure five times, with back-off, before saying so; a host
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
        return f"cannot connect to {url.hostname}:{port} ({one_line(exc)})"
    return None


def one_line(exc: BaseException) -> str:
    text = squash(exc)
    return text if len(text) <= 400 else text[:397] + "..."


# ------------------------------------------------------------------------------ guards on the wire

_active = threading.local()  # the `_Guard` of the download this thread runs, if any


def _stall_seconds() -> float:
    text = os.environ.get(STALL_SECONDS_VAR, "").strip()
    try:
        seconds = float(text) if text else DEFAULT_STALL_SECONDS
    except ValueError:
        raise DownloadVerificationError(f"{STALL_SECONDS_VAR}={text!r} is not a number of seconds") from None
    if not seconds > 0:
        raise DownloadVerificationError(f"{STALL_SECONDS_VAR}={text!r} must be above 0")
    return seconds


class _Guard:
    """Watches the HTTP answers huggingface_hub gets while it downloads one file (a response hook on its
    shared client, active only on the thread running `active()`): the Hub's HEAD answer gives the size
    every later body is held to; redirects go to http(s) only; a body that arrives slower than `MIN_RATE`
    bytes a second over the stall window is abandoned. Its errors are `DownloadVerificationError`s,
    which huggingface_hub does not retry; it then deletes its temporary file."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.size: int | None = None  # as the Hub listed it
        self.stall_s = _stall_seconds()

    @contextlib.contextmanager
    def active(self) -> Iterator[_Guard]:
        _install_hook()
        _active.guard = self
        try:
            yield self
        finally:
            _active.guard = None

    def refuse(self, why: str) -> DownloadVerificationError:
        return DownloadVerificationError(f"{self.name}: {why}; not saved")

    def on_request(self, request: Any) -> None:
        # The size the Hub lists is the file's own: a compressed body could expand past it unseen.
        request.headers["Accept-Encoding"] = "identity"

    def on_response(self, response: Any) -> None:
        url = str(response.request.url)
        location = response.headers.get("Location")
        if location:
            scheme = urllib.parse.urlsplit(urllib.parse.urljoin(url, location)).scheme.lower()
            if scheme not in ("http", "https"):
                raise self.refuse(f"the Hub redirected it to a {scheme}: URL (only http and https are "
                                  "followed)")
        if response.request.method == "HEAD":
            self._check_metadata(response)
        elif response.request.method == "GET" and response.status_code in (200, 206):
            encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                raise self.refuse(f"it came compressed ({encoding[:40]}) though it was asked for as is")
            response.stream = _guarded_stream(response.stream, self, self._limit(response))

    def _check_metadata(self, response: Any) -> None:
        """The commit and ETag become paths in the cache (snapshots/<commit>, blobs/<etag>): refuse any
        that could lead out of it. Note the size the Hub lists."""
        headers = response.headers
        commit = headers.get("X-Repo-Commit")
        if commit is not None and not _COMMIT.fullmatch(commit.strip()):
            raise self.refuse(f"the Hub's answer names commit {commit[:60]!r}, not 40 hex digits")
        etag = headers.get("X-Linked-Etag") or headers.get("ETag")
        if etag is not None:
            plain = etag.strip().removeprefix("W/").strip('"')
            if plain.strip(".") == "" or any(c in "/\\" or ord(c) < 32 for c in plain):
                raise self.refuse(f"the Hub's answer has ETag {etag[:60]!r}, which cannot name a file")
        redirect = "Location" in headers  # to the CDN: its Content-Length is the redirect's own
        size = headers.get("X-Linked-Size") or (None if redirect else headers.get("Content-Length"))
        if size is not None and size.strip().isdigit():
            self.size = int(size)

    def _limit(self, response: Any) -> int | None:
        """The most bytes this body may hold: what the Hub listed, less where a resumed body starts."""
        size = self.size
        if size is None and not self.name.endswith(".safetensors"):
            size = _SMALL_FILE_LIMIT
        if size is None:
            return None
        start = 0
        if response.status_code == 206:
            match = re.match(r"bytes (\d+)-", response.headers.get("Content-Range", ""))
            start = int(match.group(1)) if match else 0
        return max(0, size - start)


def _on_request(request: Any) -> None:
    guard = getattr(_active, "guard", None)
    if guard is not None:
        guard.on_request(request)


def _on_response(response: Any) -> None:
    guard = getattr(_active, "guard", None)
    if guard is not None:
        guard.on_response(response)


def _install_hook() -> None:
    """Add the guard's hooks to huggingface_hub's shared HTTP client (a client made by the user's own
    factory included), once per client."""
    from huggingface_hub.utils import get_session

    session = get_session()
    hooks = session.event_hooks
    if _on_response not in hooks["response"]:
        session.event_hooks = {"request": [*hooks["request"], _on_request],
                               "response": [*hooks["response"], _on_response]}


def _guarded_stream(inner: Any, guard: _Guard, limit: int | None) -> Any:
    import httpx2

    class GuardedStream(httpx2.SyncByteStream):
        """The body as it arrives, stopped before a byte past `limit` and when it trickles."""

        def __iter__(self) -> Iterator[bytes]:
            got, window_start, window_bytes = 0, time.monotonic(), 0
            for chunk in inner:
                got += len(chunk)
                if limit is not None and got > limit:
                    listed = guard.size if guard.size is not None else _SMALL_FILE_LIMIT
                    raise guard.refuse(f"the Hub sent more than the {listed} bytes it listed for it (stopped "
                                       f"before byte {listed + 1})")
                window_bytes += len(chunk)
                elapsed = time.monotonic() - window_start
                if elapsed >= guard.stall_s:
                    if window_bytes < MIN_RATE * elapsed:
                        raise guard.refuse(
                            f"the download stalled ({window_bytes} bytes in {elapsed:.1f} s, below "
                            f"{MIN_RATE} bytes/s; {STALL_SECONDS_VAR}={guard.stall_s:g} sets the window)")
                    window_start, window_bytes = time.monotonic(), 0
                yield chunk

        def close(self) -> None:
            inner.close()

        def __getattr__(self, attr: str) -> Any:  # `elapsed`, as the stream it wraps has it
            return getattr(inner, attr)

    return GuardedStream()


# ------------------------------------------------------------------------------ checks after download


def _verify(path: Path, name: str, config_file: Path) -> None:
    """Check that a fetched file is what its name says (an HTML page served with status 200 is not):
    its checksum against its blob's name (the SHA-256 of an LFS file, the git blob hash of a small one)
    and its contents. Raises `DownloadVerificationError` with the reason. A config.json need only be a
    JSON object here: one inferno does not run is refused afterwards, naming the field."""
    from inferno.files import parse_json, read_regular_file
    from inferno.models.config import ConfigError
    from inferno.models.weights import INDEX_FILE, WeightsError, checkpoint_files
    def bad(reason: str) -> DownloadVerificationError:
        reason = reason.replace(os.fspath(path), name)
        return DownloadVerificationError(f"the downloaded {name} is not usable ({reason}): removed from the "
                                         "cache")

    try:
        _check_checksum(path, name)
        if name.endswith(".json") and name != "tokenizer.json":
            text = read_regular_file(path, 64 << 20, f"a {name}")
            if not isinstance(parse_json(text, name, ConfigError), dict):
                raise ConfigError(name, ["expected a JSON object"])
            if name == INDEX_FILE:
                checkpoint_files(path)  # a weight_map of plain shard names beside it
        elif name == "tokenizer.json":
            check_tokenizer(path)
        elif name.endswith(".jinja"):
            read_regular_file(path, 64 << 20, f"a {name}").decode("utf-8")
        elif name.endswith(".safetensors"):
            _check_weights(path, name, config_file)
    except DownloadVerificationError as exc:
        raise bad(str(exc)) from None
    except UnsupportedTokenizer:
        raise  # the Hub's own file, of a kind inferno does not read: kept, and the model refused
    except (ConfigError, TokenizerError, WeightsError, OSError, UnicodeDecodeError) as exc:
        raise bad(one_line(exc)) from None


def check_tokenizer(path: Path) -> None:
    """A tokenizer.json inferno can use; one of a kind it does not read (SentencePiece, WordPiece,
    Unigram) is an `UnsupportedTokenizer`, any other failure a `TokenizerError` or `OSError`."""
    from inferno.tokenizer import Tokenizer
    from inferno.tokenizer.reader import SUPPORTED

    try:
        Tokenizer.from_file(path)
    except TokenizerError as exc:
        if SUPPORTED in str(exc):  # the reader's refusal of the kind, not of a broken file
            raise UnsupportedTokenizer(str(exc)) from None
        raise


def _check_weights(path: Path, name: str, config_file: Path) -> None:
    """A safetensors file's header, against the config beside it when there is a usable one (else at
    load): model.safetensors holds every tensor of the plan; a shard holds the tensors its index names
    for it, each one the plan's."""
    from inferno.models.config import ConfigError
    from inferno.models.families import read_config
    from inferno.models.weights import INDEX_FILE, WeightsError, read_safetensors_header

    header = read_safetensors_header(path)
    try:
        family, config = read_config(config_file)
    except (ConfigError, OSError, ValueError):
        return
    whole = name == "model.safetensors"
    problems = []
    if not whole:
        index = _read_json(path.parent / INDEX_FILE)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if isinstance(weight_map, dict):
            named = {t for t, shard in weight_map.items() if shard == name}
            if named != set(header.tensors):
                problems.append(f"it holds {len(header.tensors)} tensors; its index names {len(named)} for "
                                f"it ({len(named ^ set(header.tensors))} differ)")
    problems += family.load().header_problems(config, header.tensors.values(), whole)
    if problems:
        raise WeightsError(path, [f"it does not match config.json: {'; '.join(problems)}"], family.label)


def _read_json(path: Path) -> Any:
    """A small JSON file already checked, or None."""
    from inferno.files import parse_json, read_regular_file

    try:
        return parse_json(read_regular_file(path, 64 << 20, "a JSON file"), os.fspath(path), ValueError)
    except (OSError, ValueError):
        return None


def _check_checksum(path: Path, name: str) -> None:
    """huggingface_hub names each blob by its ETag: the SHA-256 of an LFS file, the git blob hash of a
    small one. It checks only the size of what it fetched over HTTP; this checks the bytes."""
    etag = Path(os.path.realpath(path)).name
    if _SHA256.fullmatch(etag):
        digest, what = hashlib.sha256(), "SHA-256"
    elif _COMMIT.fullmatch(etag):  # 40 hex digits: git's SHA-1 of "blob <size>\0" + the bytes
        digest, what = hashlib.sha1(usedforsecurity=False), "git blob hash"
        digest.update(b"blob %d\0" % path.stat().st_size)
    else:
        return
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    if digest.hexdigest() != etag:
        raise DownloadVerificationError(f"{what} {digest.hexdigest()}, but the Hub lists {etag}")


def _discard(pointer: Path, repo: Path) -> None:
    """Remove a fetched file from the cache: its snapshot link and the blob it leads to (only a blob in
    this repo's blobs/), so that the next run fetches it again."""
    blob = Path(os.path.realpath(pointer)) if pointer.is_symlink() else None
    pointer.unlink(missing_ok=True)
    if blob is not None and blob.parent == Path(os.path.realpath(repo / "blobs")):
        blob.unlink(missing_ok=True)
