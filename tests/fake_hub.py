"""A local stand-in for the Hugging Face Hub (two HTTP servers on 127.0.0.1), and small model files for it.
Tests point HF_ENDPOINT at it, so that huggingface_hub really downloads from it.

It answers as huggingface.co does, closely enough for huggingface_hub:

* ``HEAD``/``GET /{org}/{name}/resolve/{revision}/{file}`` on the Hub server: ``X-Repo-Commit``; for a small
  file ``ETag`` (its git blob hash) and the body; for a ``.safetensors`` file (stored with LFS on the Hub) a
  302 to the CDN server (another origin) with ``X-Linked-Etag`` (its SHA-256) and ``X-Linked-Size``;
* errors with the Hub's ``X-Error-Code``: ``RepoNotFound`` (401), ``RevisionNotFound`` and ``EntryNotFound``
  (404);
* the CDN server serves ``/cdn/<sha256>``, honouring ``Range`` (206), and can drop the connection midway.

And it misbehaves on demand, per file name: a redirect elsewhere (`redirect`), headers of its own
(`extra_headers`), a body far longer than the size it listed (`oversize`), a gzipped body that
expands far past it (`gzip`), a body that trickles (`trickle`). Every request is recorded (method, path,
Range and Authorization headers).
"""

from __future__ import annotations

import gzip
import hashlib
import http.server
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from safetensors.numpy import save as safetensors_bytes

from inferno.testing import hub_layout, random_state_dict, small_config
from inferno.tokenizer import bytes_to_unicode

COMMIT = "a" * 40
COMMIT2 = "b" * 40

# Valid files, since downloads are verified: a small GPT-2 config, weights that match it (bigger than the
# 1 MiB read chunk, so streaming and the progress bar take several steps), and a byte-level tokenizer.
CONFIG = small_config(vocab_size=4352, n_positions=16, n_embd=64, n_layer=1, n_head=2)
_BYTES = list(bytes_to_unicode().values())
_VOCAB = {c: i for i, c in enumerate(_BYTES)}
_MERGES = ["Ġ t", "h e"]
_VOCAB.update({"Ġt": 256, "he": 257})
_VOCAB.update({f"tok{i}": i for i in range(258, CONFIG.vocab_size)})  # filler so that every id decodes


def config_json(config=CONFIG, **extra) -> bytes:
    keys = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "bos_token_id", "eos_token_id")
    return json.dumps({**{k: getattr(config, k) for k in keys}, "model_type": "gpt2", **extra}).encode()


def weights_bytes(config=CONFIG, seed: int = 0) -> bytes:
    return safetensors_bytes(hub_layout(random_state_dict(config, seed), config))


CONTENT = {
    "config.json": config_json() + b"\n",
    "model.safetensors": weights_bytes(),
    "tokenizer.json": json.dumps({"model": {"type": "BPE", "merges": _MERGES, "vocab": _VOCAB},
                                  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False},
                                  "decoder": {"type": "ByteLevel"}}).encode(),
    "vocab.json": json.dumps(_VOCAB).encode(),
    "merges.txt": ("#version: 0.2\n" + "\n".join(_MERGES) + "\n").encode(),
}
FULL = {n: CONTENT[n] for n in ("config.json", "model.safetensors", "tokenizer.json")}


def git_blob_hash(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def is_lfs(name: str) -> bool:
    return name.endswith(".safetensors")


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]]  # commit → file name → contents
    refs: dict[str, str] = field(default_factory=lambda: {"main": COMMIT})


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.blobs: dict[str, bytes] = {}  # sha256 → contents, for the CDN
        self.requests: list[tuple[str, str, dict[str, str]]] = []  # (method, path, some headers)
        self.drop_after: dict[str, int] = {}  # file name → bytes the CDN sends before hanging up
        self.drops_left = 10**9  # how many times it hangs up
        self.ignore_range = False
        self.lie_sha256: set[str] = set()  # names whose X-Linked-Etag is wrong
        self.redirect: dict[str, str] = {}  # name → where the Hub sends it (a 302 with the file's metadata)
        self.extra_headers: dict[str, dict[str, str]] = {}  # name → headers that replace the Hub's
        self.oversize: dict[str, int] = {}  # name → bytes of junk its GET streams, without Content-Length
        self.trickle: dict[str, float] = {}  # name → seconds between the single bytes its GET sends
        self.gzip: dict[str, int] = {}  # name → zero bytes its GET sends gzipped, asked for or not
        self.accept_encoding: list[str | None] = []  # the Accept-Encoding of each GET
        self.sent: dict[str, int] = {}  # name → body bytes written before the client hung up (those two)
        self.hub = self._serve(self._hub_handler)
        self.cdn = self._serve(self._cdn_handler)
        self.url = f"http://127.0.0.1:{self.hub.server_address[1]}"
        self.cdn_url = f"http://127.0.0.1:{self.cdn.server_address[1]}"

    # ----------------------------------------------------------------------------- what it serves
    def add(self, repo_id: str, files: dict[str, bytes], commit: str = COMMIT,
            ref: str | None = "main") -> None:
        repo = self.repos.setdefault(repo_id, Repo({}, {}))
        repo.commits[commit] = dict(files)
        if ref:
            repo.refs[ref] = commit
        for data in files.values():
            self.blobs[hashlib.sha256(data).hexdigest()] = data

    def file(self, repo_id: str, name: str, data: bytes | None, commit: str = COMMIT) -> None:
        """Replace (or with None, delete) one file of a commit."""
        files = self.repos[repo_id].commits[commit]
        if data is None:
            files.pop(name, None)
        else:
            files[name] = data
            self.blobs[hashlib.sha256(data).hexdigest()] = data

    def names_requested(self, method: str = "GET") -> list[str]:
        """File names fetched (GET on the Hub for small files, on the CDN for LFS ones)."""
        out = []
        for m, path, _ in self.requests:
            if m != method:
                continue
            if "/resolve/" in path and not is_lfs(path):
                out.append(path.rsplit("/", 1)[-1])
            elif path.startswith("/cdn/"):
                out.append(path.split("/")[-1])
        return out

    # ----------------------------------------------------------------------------- the two servers
    def _serve(self, make_handler):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), make_handler())
        # A short poll interval keeps shutdown() (and so each test's teardown) quick.
        threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
        return server

    def _record(self, handler) -> None:
        keep = {k: handler.headers[k] for k in ("Range", "Authorization") if handler.headers.get(k)}
        self.requests.append((handler.command, handler.path, keep))

    def _hub_handler(self):
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:  # noqa: N802 - the http.server API
                self.answer(body=False)

            def do_GET(self) -> None:  # noqa: N802
                self.answer(body=True)

            def error(self, code: int, error_code: str, commit: str | None = None) -> None:
                self.send_response(code)
                self.send_header("X-Error-Code", error_code)
                if commit:
                    self.send_header("X-Repo-Commit", commit)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def answer(self, body: bool) -> None:
                fake._record(self)
                path = urllib.parse.unquote(self.path)
                parts = self.path.split("/")
                if len(parts) < 6 or parts[3] != "resolve":
                    return self.error(404, "EntryNotFound")
                repo_id, revision, name = f"{parts[1]}/{parts[2]}", urllib.parse.unquote(parts[4]), parts[-1]
                del path
                repo = fake.repos.get(repo_id)
                if repo is None:
                    return self.error(401, "RepoNotFound")
                commit = revision if revision in repo.commits else repo.refs.get(revision)
                if commit is None:
                    return self.error(404, "RevisionNotFound")
                data = repo.commits[commit].get(name)
                if data is None:
                    return self.error(404, "EntryNotFound", commit)
                extra = fake.extra_headers.get(name, {})
                if name in fake.redirect:
                    self.send_response(302)
                    self.send_header("X-Repo-Commit", commit)
                    self.send_header("Location", fake.redirect[name])
                    self.send_header("X-Linked-Etag", f'"{hashlib.sha256(data).hexdigest()}"')
                    self.send_header("X-Linked-Size", str(len(data)))
                    self.send_header("ETag", f'"{git_blob_hash(data)}"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(302 if is_lfs(name) else 200)
                self.send_header("X-Repo-Commit", extra.get("X-Repo-Commit", commit))
                if is_lfs(name):
                    sha = hashlib.sha256(data).hexdigest()
                    shown = hashlib.sha256(data + b"x").hexdigest() if name in fake.lie_sha256 else sha
                    self.send_header("Location", f"{fake.cdn_url}/cdn/{sha}/{name}")
                    self.send_header("X-Linked-Etag", f'"{shown}"')
                    self.send_header("X-Linked-Size", str(len(data)))
                    self.send_header("ETag", f'"{git_blob_hash(b"pointer " + data[:8])}"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_header("ETag", extra.get("ETag", f'"{git_blob_hash(data)}"'))
                if body:
                    fake.accept_encoding.append(self.headers.get("Accept-Encoding"))
                if body and name in fake.gzip:
                    data = gzip.compress(bytes(fake.gzip[name]))
                    self.send_header("Content-Encoding", "gzip")
                if not (body and name in fake.oversize):  # that one's length is the connection's
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    fake._send_body(self.wfile, name, data)

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def _cdn_handler(self):
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:  # noqa: N802
                self.answer(body=False)

            def do_GET(self) -> None:  # noqa: N802
                self.answer(body=True)

            def answer(self, body: bool) -> None:
                fake._record(self)
                parts = self.path.split("/")
                data = fake.blobs.get(parts[2]) if len(parts) == 4 and parts[1] == "cdn" else None
                if data is None:
                    self.send_error(404)
                    return
                start = 0
                ranged = self.headers.get("Range", "")
                if ranged.startswith("bytes=") and not fake.ignore_range:
                    start = int(ranged[6:].split("-")[0])
                self.send_response(206 if start else 200)
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(data) - start))
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.end_headers()
                if not body:
                    return
                name = parts[3]
                cut = fake.drop_after.get(name)
                if cut is not None and fake.drops_left > 0 and cut > start:
                    fake.drops_left -= 1
                    self.wfile.write(data[start:cut])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(data[start:])

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def _send_body(self, out, name: str, data: bytes) -> None:
        """`data`, or the misbehaviour asked for `name`: junk well past the listed size, or a trickle."""
        self.sent[name] = 0
        try:
            if name in self.oversize:
                junk = b"x" * 65536
                while self.sent[name] < self.oversize[name]:
                    out.write(junk)
                    self.sent[name] += len(junk)
            elif name in self.trickle:
                for i in range(len(data)):
                    out.write(data[i:i + 1])
                    out.flush()
                    self.sent[name] += 1
                    time.sleep(self.trickle[name])
            else:
                out.write(data)
                self.sent[name] = len(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client hung up, as it should

    def close(self) -> None:
        for server in (self.hub, self.cdn):
            server.shutdown()
            server.server_close()


# ------------------------------------------------------------------------------------- fixtures


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A clean working directory and HF cache; no real network can be reached; no token."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for var in ("HF_HUB_OFFLINE", "INFERNO_OFFLINE", "HF_HOME", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME",
                "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "INFERNO_DOWNLOAD_STALL_SECONDS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # huggingface_hub's token file: none
    # Port 9 (discard) on localhost: nothing listens, so a stray request fails at once.
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.setenv("NO_PROXY", "*")
    return work


@pytest.fixture
def fake_hub(env, monkeypatch):
    server = FakeHub()
    server.add("openai-community/gpt2", FULL)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    yield server
    server.close()


def cache_snapshot(cache: Path, repo_id: str = "openai-community/gpt2", files: dict[str, bytes] = FULL,
                   commit: str = COMMIT, ref: str | None = "main") -> Path:
    """The huggingface_hub cache layout, written by hand: blobs, snapshot links to them, refs/<ref>."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for name, data in files.items():
        blob = repo / "blobs" / (hashlib.sha256(data).hexdigest() if is_lfs(name) else git_blob_hash(data))
        blob.write_bytes(data)
        (snapshot / name).symlink_to(f"../../blobs/{blob.name}")
    if ref:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot
