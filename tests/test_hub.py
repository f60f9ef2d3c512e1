"""resolve_model_dir: the search order, the HF cache layout, and downloads against a local fake Hub."""

from __future__ import annotations

import http.server
import io
import json
import os
import threading
from pathlib import Path

import pytest
from safetensors.numpy import save as safetensors_bytes

import inferno.hub as hub
from inferno.hub import (
    REQUIRED_FILES,
    ModelFilesMissing,
    find_cached_snapshot,
    hf_cache_dir,
    resolve_model_dir,
)
from inferno.testing import hub_layout, random_state_dict, small_config
from inferno.tokenizer import bytes_to_unicode

PREFIX = "/openai-community/gpt2/resolve/main/"
# Valid files, since downloads are verified: a small GPT-2 config, weights that match it (bigger than the
# 1 MiB read chunk, so streaming and the progress bar take several steps), and a byte-level tokenizer.
_CONFIG = small_config(vocab_size=4352, n_positions=16, n_embd=64, n_layer=1, n_head=2)
_BYTES = bytes_to_unicode()
CONTENT = {
    "config.json": json.dumps({**{k: getattr(_CONFIG, k) for k in (
        "vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "bos_token_id", "eos_token_id")},
        "model_type": "gpt2"}).encode() + b"\n",
    "model.safetensors": safetensors_bytes(hub_layout(random_state_dict(_CONFIG), _CONFIG)),
    "tokenizer.json": json.dumps(
        {"model": {"type": "BPE", "merges": [], "vocab": {c: i for i, c in enumerate(_BYTES.values())}}}
    ).encode(),
}


class FakeHub:
    """A local stand-in for huggingface.co serving files under /openai-community/gpt2/resolve/main/."""

    def __init__(self) -> None:
        self.files = dict(CONTENT)
        self.requests: list[str] = []
        self.truncate: set[str] = set()  # send a full Content-Length, then only half the body
        self.redirect = False  # answer with a 302 to /cdn/<name>, as the real Hub does
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                fake.requests.append(self.path)
                if self.path.startswith(PREFIX) and fake.redirect:
                    self.send_response(302)
                    self.send_header("Location", "/cdn/" + self.path[len(PREFIX):])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                name = self.path.split("/")[-1]
                served = self.path.startswith(PREFIX) or (fake.redirect and self.path.startswith("/cdn/"))
                if not served or name not in fake.files:
                    self.send_error(404, "Entry not found")
                    return
                body = fake.files[name]
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: len(body) // 2] if name in fake.truncate else body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # A short poll interval keeps shutdown() (and so each test's teardown) quick.
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True)
        self.thread.start()

    def names_requested(self) -> list[str]:
        return [p.split("/")[-1] for p in self.requests if p.startswith(PREFIX)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A clean working directory and HF cache; no real network can be reached."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for var in ("HF_HUB_OFFLINE", "INFERNO_OFFLINE", "HF_HOME", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    # Port 9 (discard) on localhost: nothing listens, so a stray request fails at once.
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.setenv("NO_PROXY", "*")
    return work


@pytest.fixture
def fake_hub(env, monkeypatch):
    server = FakeHub()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    yield server
    server.close()


def fill(directory: Path, names=REQUIRED_FILES, content: dict[str, bytes] = CONTENT) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).write_bytes(content[name])
    return directory


def make_cache_snapshot(cache: Path, revision: str = "abc", names=REQUIRED_FILES, refs: bool = True) -> Path:
    """The huggingface_hub cache layout: blobs, snapshot symlinks to them, refs/main naming the revision."""
    repo = cache / "models--openai-community--gpt2"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for name in names:
        blob = repo / "blobs" / f"{revision}-{name}"
        blob.write_bytes(CONTENT[name])
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    if refs:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(revision)
    return snapshot


def resolve_error(*args, **kwargs) -> ModelFilesMissing:
    with pytest.raises(ModelFilesMissing) as info:
        resolve_model_dir(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    # What to run: `hf download` with the names as plain arguments where hf exists, else what to do offline.
    assert "--include" not in message
    assert "fetch them with: hf download openai-community/gpt2 " in message or "copy them into" in message
    return info.value


# ------------------------------------------------------------------------------------ search order


def test_explicit_dir_with_all_files(env, tmp_path, fake_hub):
    d = fill(tmp_path / "mine")
    assert resolve_model_dir(d) == d
    assert resolve_model_dir(str(d)) == d
    assert fake_hub.requests == []


def test_explicit_dir_wins_over_local_gpt2(env, tmp_path):
    fill(env / "gpt2")
    d = fill(tmp_path / "mine")
    assert resolve_model_dir(d) == d


def test_local_gpt2_dir(env):
    fill(env / "gpt2")
    assert resolve_model_dir() == (env / "gpt2").absolute()


def test_hf_cache_snapshot(env, tmp_path):
    snapshot = make_cache_snapshot(tmp_path / "cache")
    assert resolve_model_dir() == snapshot
    assert (resolve_model_dir() / "model.safetensors").read_bytes() == CONTENT["model.safetensors"]


def test_local_gpt2_wins_over_cache(env, tmp_path):
    make_cache_snapshot(tmp_path / "cache")
    fill(env / "gpt2")
    assert resolve_model_dir() == (env / "gpt2").absolute()


def test_incomplete_local_gpt2_falls_back_to_cache(env, tmp_path):
    fill(env / "gpt2", ["config.json", "tokenizer.json"])  # like the repo's own gpt2/
    snapshot = make_cache_snapshot(tmp_path / "cache")
    assert resolve_model_dir() == snapshot


def test_cache_respects_hf_home(env, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    snapshot = make_cache_snapshot(tmp_path / "hfhome" / "hub")
    assert hf_cache_dir() == tmp_path / "hfhome" / "hub"
    assert resolve_model_dir() == snapshot


def test_cache_default_location(env, monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hf_cache_dir() == tmp_path / "home" / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hf_cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"


def test_cache_prefers_refs_main(env, tmp_path):
    cache = tmp_path / "cache"
    make_cache_snapshot(cache, "old", refs=False)
    main = make_cache_snapshot(cache, "new")
    assert find_cached_snapshot(cache) == main


def test_cache_without_refs_uses_a_complete_snapshot(env, tmp_path):
    cache = tmp_path / "cache"
    make_cache_snapshot(cache, "partial", names=["config.json"], refs=False)
    full = make_cache_snapshot(cache, "full", refs=False)
    assert find_cached_snapshot(cache) == full


def test_incomplete_or_broken_cache_is_ignored(env, tmp_path, fake_hub):
    snapshot = make_cache_snapshot(tmp_path / "cache")
    blob = (snapshot / "model.safetensors").resolve()
    blob.unlink()  # dangling symlink: the cache was pruned
    assert find_cached_snapshot(tmp_path / "cache") is None
    e = resolve_error(download=False)
    assert e.missing == list(REQUIRED_FILES)


# ------------------------------------------------------------------------------------ downloads


def test_download_into_local_gpt2(env, fake_hub, capsys):
    d = resolve_model_dir()
    assert d == (env / "gpt2").absolute()
    for name in REQUIRED_FILES:
        assert (d / name).read_bytes() == CONTENT[name]
    assert sorted(fake_hub.names_requested()) == sorted(REQUIRED_FILES)
    assert not list(d.glob("*.part"))
    # stderr is not a terminal here: one line per file, no bar.
    err = capsys.readouterr().err
    assert "downloading" in err and "downloaded model.safetensors" in err and "\r" not in err


def test_only_missing_files_are_fetched_and_existing_ones_kept(env, fake_hub):
    mine = {name: b"the user's own " + name.encode() for name in REQUIRED_FILES}
    fill(env / "gpt2", ["config.json", "tokenizer.json"], mine)
    d = resolve_model_dir()
    assert fake_hub.names_requested() == ["model.safetensors"]
    assert (d / "config.json").read_bytes() == mine["config.json"]
    assert (d / "tokenizer.json").read_bytes() == mine["tokenizer.json"]
    assert (d / "model.safetensors").read_bytes() == CONTENT["model.safetensors"]


def test_download_into_explicit_dir(env, tmp_path, fake_hub):
    target = tmp_path / "new" / "model"
    assert resolve_model_dir(target, progress=False) == target
    assert all((target / n).read_bytes() == CONTENT[n] for n in REQUIRED_FILES)
    assert not (env / "gpt2").exists()


def test_redirects_are_followed(env, fake_hub):
    fake_hub.redirect = True
    d = resolve_model_dir(progress=False)
    assert (d / "model.safetensors").read_bytes() == CONTENT["model.safetensors"]
    assert any(p.startswith("/cdn/") for p in fake_hub.requests)


def test_a_part_file_is_not_ours_and_is_kept(env, fake_hub):
    # Downloads go to a temporary file inferno creates itself: a model.safetensors.part is the user's.
    d = fill(env / "gpt2", ["config.json", "tokenizer.json"])
    (d / "model.safetensors.part").write_bytes(b"left over from an interrupted run" * 100)
    resolve_model_dir(progress=False)
    assert (d / "model.safetensors").read_bytes() == CONTENT["model.safetensors"]
    assert (d / "model.safetensors.part").read_bytes() == b"left over from an interrupted run" * 100


def test_http_404_is_one_line_error(env, fake_hub):
    del fake_hub.files["model.safetensors"]
    e = resolve_error(progress=False)
    message = str(e)
    assert isinstance(e, FileNotFoundError)
    # The download stops at the first failure; config.json arrived before it and no longer counts.
    assert e.missing == ["model.safetensors", "tokenizer.json"]
    assert "404" in message and "model.safetensors" in message
    assert str(env / "gpt2") in message and "models--openai-community--gpt2" in message
    # The files that did arrive are complete and stay; nothing half-written is left.
    d = env / "gpt2"
    assert (d / "config.json").read_bytes() == CONTENT["config.json"]
    assert not (d / "model.safetensors").exists() and not list(d.glob("*.part"))


def test_truncated_download_leaves_nothing_behind(env, fake_hub):
    fake_hub.truncate.add("model.safetensors")
    d = fill(env / "gpt2", ["config.json", "tokenizer.json"])
    e = resolve_error(progress=False)
    assert e.missing == ["model.safetensors"] and "download failed" in str(e)
    assert not (d / "model.safetensors").exists()
    assert not (d / "model.safetensors.part").exists()


def test_unreachable_endpoint_is_one_line_error(env):
    # HF_ENDPOINT points at a closed port (see the env fixture).
    e = resolve_error(progress=False)
    message = str(e)
    assert "download failed" in message and "127.0.0.1:9" in message
    assert "config.json, model.safetensors, tokenizer.json" in message
    assert not (env / "gpt2").exists()  # the directory made for the download is removed again


def test_bad_endpoint_url_is_one_line_error(env, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "not a url")
    assert "download failed" in str(resolve_error(progress=False))


@pytest.mark.parametrize(
    "var, value", [("HF_HUB_OFFLINE", "1"), ("INFERNO_OFFLINE", "1"), ("HF_HUB_OFFLINE", "true")]
)
def test_offline_makes_no_request(env, fake_hub, monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    e = resolve_error()
    assert fake_hub.requests == []
    assert "offline" in str(e) and var in str(e)
    e = resolve_error(env / "elsewhere")
    assert fake_hub.requests == []
    assert str(env / "elsewhere") in str(e)


def test_offline_zero_means_online(env, fake_hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    resolve_model_dir(progress=False)
    assert fake_hub.requests


def test_download_false_makes_no_request(env, fake_hub):
    fill(env / "gpt2", ["config.json"])
    e = resolve_error(download=False)
    assert fake_hub.requests == []
    assert e.missing == ["model.safetensors", "tokenizer.json"]
    assert ("gpt2 model.safetensors tokenizer.json --local-dir gpt2" in str(e)
            or "copy them into gpt2 " in str(e))
    assert "downloading disabled" in str(e)


def test_explicit_dir_error_names_it(env, tmp_path):
    d = fill(tmp_path / "my model", ["tokenizer.json"])
    e = resolve_error(d, download=False)
    assert e.missing == ["config.json", "model.safetensors"]
    assert str(d) in str(e)
    assert f"--local-dir '{d}'" in str(e) or f"copy them into '{d}'" in str(e)  # quoted: it has a space
    assert "models--" not in str(e)  # an explicit directory is the only place looked


def test_progress_bar_on_a_terminal(env, fake_hub, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(hub, "_CHUNK", 100_000)  # several updates
    monkeypatch.setattr(hub._Progress, "min_interval_s", 0.0)
    terminal = Terminal()
    monkeypatch.setattr(hub.sys, "stderr", terminal)
    resolve_model_dir()
    out = terminal.getvalue()
    assert out.count("\r") > 3 and "MB" in out and "100%" in out and "model.safetensors [" in out


def test_no_progress_output_when_disabled(env, fake_hub, capsys):
    resolve_model_dir(progress=False)
    assert capsys.readouterr().err == ""


def test_move_into_place_never_overwrites(tmp_path):
    part, dest = tmp_path / "f.part", tmp_path / "f"
    part.write_bytes(b"downloaded")
    dest.write_bytes(b"user's")
    hub._move_into_place(part, dest)
    assert dest.read_bytes() == b"user's" and not part.exists()
    part.write_bytes(b"downloaded")
    hub._move_into_place(part, tmp_path / "g")
    assert (tmp_path / "g").read_bytes() == b"downloaded" and not part.exists()


def test_model_files_missing_message_is_one_line(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")  # the hf command is installed
    e = ModelFilesMissing(["model.safetensors"], ["/a", "/b"], reason="download failed: boom\nsecond line")
    assert str(e) == (
        "GPT-2 model file(s) missing: model.safetensors; looked in /a, /b; "
        "download failed: boom second line; "
        "fetch them with: hf download openai-community/gpt2 model.safetensors --local-dir gpt2"
    )
    assert isinstance(e, FileNotFoundError)
