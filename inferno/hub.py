"""Finding the GPT-2 model files: an explicit directory, ./gpt2, the Hugging Face cache, or a download.

The download uses only the standard library (urllib) and fetches exactly the three files inferno
needs from ``{HF_ENDPOINT or https://huggingface.co}/openai-community/gpt2/resolve/main/<file>``.
Each file is streamed into a temporary file that inferno creates itself, exclusively, in the target
folder (``.<file>.XXXXXXXX.inferno-download``), verified, and only then moved into place: its size
against Content-Length (and the Hub's ``X-Linked-Size``), its SHA-256 against the Hub's
``X-Linked-Etag`` where one is given, and its contents (config.json must be a valid GPT-2 config,
tokenizer.json a usable tokenizer, model.safetensors a safetensors file whose header matches the
config). An interrupted or bad download leaves nothing behind, and nothing the user has is ever
followed, overwritten or deleted: not a model file already there (even a dangling symlink), not a
``model.safetensors.part`` of theirs.

Progress: with ``progress=True`` a live bar (MB and %) is drawn on stderr when stderr is a
terminal; otherwise one line is printed when each file starts and one when it is done, so logs
still say what happened without being flooded.

Offline: ``HF_HUB_OFFLINE`` or ``INFERNO_OFFLINE`` set to 1/true/yes/on means no request is made.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import shlex
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from inferno.errors import squash

__all__ = [
    "REPO_ID",
    "REQUIRED_FILES",
    "ModelFilesMissing",
    "resolve_model_dir",
    "hf_cache_dir",
    "find_cached_snapshot",
    "is_offline",
    "download_files",
]

REPO_ID = "openai-community/gpt2"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")
DEFAULT_ENDPOINT = "https://huggingface.co"
LOCAL_DIR = "gpt2"
CONNECT_TIMEOUT_S = 10.0
_CHUNK = 1 << 20
_TRUE = {"1", "true", "yes", "on"}


class ModelFilesMissing(FileNotFoundError):
    """The model files are not available; ``str()`` is one line saying what is missing, where we
    looked, why a download did not happen or failed, and what to run; ``lines`` is the same in two
    lines (what is missing, what to run), as the CLI prints it."""

    def __init__(
        self,
        missing: Iterable[str],
        searched: Iterable[str | os.PathLike[str]],
        *,
        target: str | os.PathLike[str] = LOCAL_DIR,
        reason: str | None = None,
    ) -> None:
        self.missing = list(missing)
        self.searched = [os.fspath(p) for p in searched]
        self.target = os.fspath(target)
        self.reason = reason
        # A single argument keeps OSError from formatting it as "[Errno ...]".
        super().__init__(self._message())

    @property
    def problem(self) -> str:
        """What is missing, where we looked and why no download happened or it failed."""
        parts = [
            f"GPT-2 model file(s) missing: {', '.join(self.missing)}",
            f"looked in {', '.join(self.searched)}",
        ]
        if self.reason:
            parts.append(" ".join(self.reason.split()))  # one line, whatever the network library said
        return "; ".join(parts)

    @property
    def remedy(self) -> str:
        """What to run: `hf download` with the file names as arguments where the hf command exists;
        otherwise (inferno downloads by itself) what to do offline."""
        import shutil

        target = shlex.quote(self.target)
        if shutil.which("hf"):
            return f"fetch them with: {shlex.join(fetch_command(self.missing, self.target))}"
        offline = [n for n in ("HF_HUB_OFFLINE", "INFERNO_OFFLINE") if _env_true(n)]
        if offline:
            return f"unset {' and '.join(offline)} to download them; offline, copy them into {target}"
        return f"to run offline, copy them into {target} from {_endpoint()}/{REPO_ID}"

    @property
    def lines(self) -> tuple[str, str]:
        return self.problem, self.remedy

    def _message(self) -> str:
        return "; ".join(self.lines)

    def __str__(self) -> str:
        return self._message()


def fetch_command(missing: Iterable[str], target: str | os.PathLike[str] = LOCAL_DIR) -> list[str]:
    """The `hf download` command (as argv) that fetches `missing` into `target`: file names are plain
    arguments (``--include`` takes one glob and is ignored when names are given)."""
    return ["hf", "download", REPO_ID, *missing, "--local-dir", os.fspath(target)]


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


def _missing(directory: Path) -> list[str]:
    # is_file() follows symlinks, so a cache entry pointing at a deleted blob counts as missing.
    return [name for name in REQUIRED_FILES if not (directory / name).is_file()]


def _absent(directory: Path) -> list[str]:
    return [name for name in REQUIRED_FILES if not os.path.lexists(directory / name)]


def find_cached_snapshot(cache_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """A snapshot of openai-community/gpt2 in the HF cache holding all required files, or None.

    Prefers the revision named by ``refs/main``; otherwise the newest complete snapshot.
    """
    repo_dir = Path(cache_dir) if cache_dir is not None else hf_cache_dir()
    repo_dir = repo_dir / ("models--" + REPO_ID.replace("/", "--"))
    snapshots = repo_dir / "snapshots"
    try:
        revision = (repo_dir / "refs" / "main").read_text().strip()
    except OSError:
        revision = ""
    if revision and "/" not in revision and not _missing(snapshots / revision):
        return snapshots / revision
    try:
        candidates = [p for p in snapshots.iterdir() if p.is_dir() and not _missing(p)]
    except OSError:
        return None
    if not candidates:
        return None
    return max(candidates, key=lambda p: p.stat().st_mtime)


def resolve_model_dir(
    model_dir: str | os.PathLike[str] | None = None,
    *,
    download: bool = True,
    progress: bool = True,
) -> Path:
    """The directory holding config.json, model.safetensors and tokenizer.json.

    1. ``model_dir`` if given (missing files are downloaded into it when allowed);
    2. else ``./gpt2`` if complete;
    3. else a complete snapshot of openai-community/gpt2 in the Hugging Face cache;
    4. else the missing files are downloaded into ``./gpt2`` (unless ``download=False`` or offline).

    Raises :class:`ModelFilesMissing` (one line) when none of that works.
    """
    if model_dir is not None:
        if not isinstance(model_dir, (str, os.PathLike)):
            raise TypeError(f"model_dir must be a path (str or os.PathLike), not {type(model_dir).__name__}")
        if os.fspath(model_dir) == "":
            # Path("") is the current directory: an empty --model-dir must not load from (or download
            # into) wherever the command happens to run.
            raise FileNotFoundError("model folder '' is an empty path: give a folder, or leave it out to use "
                                    "./gpt2, the Hugging Face cache or a download")
        target = Path(model_dir).expanduser().absolute()
        searched = [target]
    else:
        target = Path(LOCAL_DIR).absolute()
        if not _missing(target):
            return target
        cache = hf_cache_dir()
        snapshot = find_cached_snapshot(cache)
        if snapshot is not None:
            return snapshot
        searched = [target, cache / ("models--" + REPO_ID.replace("/", "--")) / "snapshots"]

    if target.exists() and not target.is_dir():
        raise NotADirectoryError(f"model folder {target} is a file; expected a folder holding "
                                 f"{', '.join(REQUIRED_FILES)}")
    # Only absent files are fetched: one that exists but is not a regular file (a FIFO, a device) is left
    # for the loaders to name; a dangling symlink is the user's and is never written through.
    missing = _absent(target)
    if not missing:
        return target
    shown_target = os.fspath(model_dir) if model_dir is not None else LOCAL_DIR
    if not download:
        reason = "downloading disabled"
    elif is_offline():
        reason = _offline_reason()
    else:
        try:
            download_files(missing, target, progress=progress)
            return target
        except (OSError, http.client.HTTPException, ValueError) as e:
            # URLError/HTTPError/timeouts are OSErrors; a short body is IncompleteRead; a bad
            # HF_ENDPOINT is a ValueError.
            reason = f"download failed: {_describe_error(e)}"
            missing = _absent(target) or missing  # files that did arrive are complete and stay
    raise ModelFilesMissing(missing, searched, target=shown_target, reason=reason) from None


def _endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def _describe_error(e: Exception) -> str:
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code} {e.reason} for {e.url}"
    if isinstance(e, urllib.error.URLError):
        return f"{e.reason} ({getattr(e, 'url', '') or _endpoint()})"
    return str(e) or type(e).__name__


class _DownloadError(OSError):
    pass


class DownloadVerificationError(_DownloadError):
    """A downloaded file failed its checks (size, checksum, contents); it was not saved."""


def download_files(
    names: Iterable[str], directory: str | os.PathLike[str], *, progress: bool = True
) -> list[Path]:
    """Download ``names`` from openai-community/gpt2 into ``directory`` (created if needed).

    Files already present (as anything, a dangling symlink included) are left untouched. Each file is
    verified before it is moved into place (see the module docstring). Raises OSError (urllib's errors
    and `DownloadVerificationError` included) on failure, leaving no temporary file behind.
    """
    directory = Path(directory)
    names = list(names)
    for name in names:
        if name not in REQUIRED_FILES:
            raise ValueError(f"{name!r} is not one of the model files {REQUIRED_FILES}")
    created = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    done = []
    try:
        for name in names:
            dest = directory / name
            if not os.path.lexists(dest):
                _download_one(f"{_endpoint()}/{REPO_ID}/resolve/main/{name}", dest, progress)
            done.append(dest)
    except BaseException:
        # Don't leave an empty ./gpt2 behind after a failed first download.
        if created and not any(directory.iterdir()):
            directory.rmdir()
        raise
    return done


class _RecordRedirects(urllib.request.HTTPRedirectHandler):
    """Follows redirects as usual and keeps each redirect's headers: the Hub sends the file's SHA-256
    (X-Linked-Etag) and size (X-Linked-Size) on the 302 to its CDN."""

    def __init__(self) -> None:
        self.headers: list = []

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 - urllib's API
        self.headers.append(headers)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_SHA256 = re.compile(r'^(?:W/)?"?([0-9a-f]{64})"?$')


def _published(all_headers: list) -> tuple[str | None, int | None]:
    """(SHA-256, size) the Hub published for the file, where it did (X-Linked-Etag, X-Linked-Size)."""
    sha, size = None, None
    for headers in all_headers:
        m = _SHA256.match((headers.get("X-Linked-Etag") or "").strip().lower())
        if m:
            sha = m.group(1)
        linked = (headers.get("X-Linked-Size") or "").strip()
        if linked.isdigit():
            size = int(linked)
    return sha, size


def _download_one(url: str, dest: Path, progress: bool) -> None:
    request = urllib.request.Request(url, headers={"User-Agent": "inferno (urllib)"})
    bar = _Progress(dest.name, url, sys.stderr) if progress else None
    redirects = _RecordRedirects()
    opener = urllib.request.build_opener(redirects)
    tmp: Path | None = None
    try:
        with opener.open(request, timeout=CONNECT_TIMEOUT_S) as response:
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            sha, linked_size = _published([*redirects.headers, response.headers])
            if bar:
                bar.start(total)
            received = 0
            digest = hashlib.sha256()
            # Our own file, created exclusively (O_EXCL, mode 0600) in the target folder: never a file or a
            # link of the user's, and on the same filesystem, so that moving it into place is a link.
            fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".inferno-download", dir=dest.parent)
            tmp = Path(name)
            with os.fdopen(fd, "wb") as out:
                while chunk := response.read(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    received += len(chunk)
                    if bar:
                        bar.update(received)
                if total is not None and received != total:
                    raise _DownloadError(f"connection closed after {received} of {total} bytes of {url}")
                out.flush()
                os.fsync(out.fileno())
        if linked_size is not None and received != linked_size:
            raise DownloadVerificationError(f"{dest.name} from {url} is {received} bytes, but the Hub "
                                            f"lists {linked_size}: not saved")
        if sha is not None and digest.hexdigest() != sha:
            raise DownloadVerificationError(f"{dest.name} from {url} has SHA-256 {digest.hexdigest()}, but "
                                            f"the Hub lists {sha}: not saved")
        _verify_contents(tmp, dest, url)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 would make the model private to this user
        _move_into_place(tmp, dest)
        if bar:
            bar.finish(received)
    except BaseException:
        # Covers network errors, a failed check and Ctrl-C alike: nothing half-written is left behind.
        if bar:
            bar.abort()
        raise
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)  # ours (a no-op once moved into place)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _verify_contents(tmp: Path, dest: Path, url: str) -> None:
    """Check that a downloaded file is what its name says (an HTML error page served with status 200 is
    not); raises `DownloadVerificationError` with the reason."""
    from inferno.config import ConfigError, Gpt2Config
    from inferno.tokenizer import Tokenizer, TokenizerError
    from inferno.weights import WeightsError, _plan, read_safetensors_header

    def bad(reason: str) -> DownloadVerificationError:
        reason = reason.replace(os.fspath(tmp), dest.name)
        return DownloadVerificationError(f"{dest.name} from {url} is not usable ({reason}): not saved")

    try:
        if dest.name == "config.json":
            Gpt2Config.from_file(tmp)
        elif dest.name == "tokenizer.json":
            Tokenizer.from_file(tmp)
        elif dest.name == "model.safetensors":
            header = read_safetensors_header(tmp)
            try:  # against the config beside it, when there is a usable one (else at load)
                config = Gpt2Config.from_file(dest.parent / "config.json")
            except ConfigError:
                return
            _, problems = _plan(header, config)
            if problems:
                raise WeightsError(tmp, [f"it does not match config.json: {'; '.join(problems)}"])
    except (ConfigError, TokenizerError, WeightsError) as exc:
        raise bad(squash(exc)) from None


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


class _Progress:
    """A text progress bar on a terminal; start/finish lines otherwise."""

    min_interval_s = 0.1  # redraw at most this often

    def __init__(self, name: str, url: str, stream: IO[str]) -> None:
        self.name, self.url, self.stream = name, url, stream
        self.live = hasattr(stream, "isatty") and stream.isatty()
        self.total: int | None = None
        self.last = 0.0
        self.drawn = False

    def start(self, total: int | None) -> None:
        self.total = total
        if not self.live:
            size = f" ({total / 1e6:.1f} MB)" if total is not None else ""
            print(f"downloading {self.url}{size}", file=self.stream, flush=True)

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
