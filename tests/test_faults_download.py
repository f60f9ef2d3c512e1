"""The download path under attack: issue #17 (nothing of the user's is deleted, followed or overwritten; a
download is verified, a corrupt file in place says to delete it) and issue #39 (revisions that are paths,
a redirect to file://, a body far past its listed size, a trickle, an HTML page as the weights, headers that
are paths). Downloads go through huggingface_hub from a local fake Hub; a local folder is only ever read."""

# The fixtures come from fake_hub (imported below), so their names are test arguments too.
# ruff: noqa: F811

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_hub import COMMIT, CONTENT, FULL, env, fake_hub  # noqa: F401 - fixtures
from test_faults_common import assert_one_line_error, cli_env, copy_model, model_folder, run_cli, tree_digest

from inferno.models.names import ModelNameError, parse_model_name
from inferno.models.resolve import ModelFilesMissing, resolve_model

REPO = "user/fine-tune"


def resolve_fails(*args, **kwargs) -> ModelFilesMissing:
    with pytest.raises(ModelFilesMissing) as info:
        resolve_model(*args, **kwargs)
    assert "\n" not in str(info.value)
    return info.value


def repo_dir(tmp_path: Path, repo_id: str = REPO) -> Path:
    return tmp_path / "cache" / ("models--" + repo_id.replace("/", "--"))


def hub_env(tmp_path: Path, hub) -> dict[str, str]:
    """The CLI's environment, online, with the cache of the `env` fixture and the fake Hub."""
    return cli_env(tmp_path, INFERNO_OFFLINE="0", HF_HUB_CACHE=str(tmp_path / "cache"), HF_ENDPOINT=hub.url)


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() or p.is_symlink()) if folder.exists() else []


def nothing_kept(tmp_path: Path, name: str, data: bytes | None = None, repo_id: str = REPO) -> None:
    """No snapshot link of `name`, no temporary file, and no blob holding `data` is left in the cache."""
    repo = repo_dir(tmp_path, repo_id)
    assert not os.path.lexists(repo / "snapshots" / COMMIT / name)
    blobs = files_under(repo / "blobs")
    assert not [p for p in blobs if p.name.endswith(".incomplete")]
    assert data is None or not [p for p in blobs if p.read_bytes() == data]


def missing_files_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Missing model files: exit 2, no traceback, two lines (what is missing and why; what to do)."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2, proc.stderr
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


# ------------------------------------------------------------------- #17 item 7: the user's files


def test_a_local_folder_is_never_written(env, fake_hub, tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "config.json").write_bytes(CONTENT["config.json"])
    (d / "model.safetensors.part").write_bytes(b"my own notes, not a download")
    (d / "tokenizer.json").symlink_to(tmp_path / "elsewhere" / "tokenizer.json")  # dangling: the user's
    before = tree_digest(d)
    e = resolve_fails(d, progress=False)
    assert e.missing == ["model.safetensors"]  # the dangling link is the user's: the loader names it
    assert tree_digest(d) == before and fake_hub.requests == []
    assert not (tmp_path / "elsewhere").exists()


def test_a_dangling_cache_link_is_replaced_not_written_through(env, fake_hub, tmp_path):
    fake_hub.add(REPO, FULL)
    snapshot = repo_dir(tmp_path) / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    target = tmp_path / "elsewhere" / "model.safetensors"  # does not exist
    (snapshot / "model.safetensors").symlink_to(target)
    files = resolve_model(REPO, progress=False)
    assert not target.exists()
    assert files.weights.read_bytes() == CONTENT["model.safetensors"]
    assert files.weights.resolve().parent == repo_dir(tmp_path) / "blobs"


# ------------------------------------------------------------------- #17 item 8, #39 bug 11: verified


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json"])
def test_an_html_page_is_not_kept_as_config_or_tokenizer(env, fake_hub, tmp_path, name):
    page = b"<html>rate limited</html>"
    fake_hub.add(REPO, {**FULL, name: page})
    e = resolve_fails(REPO, progress=False)
    assert name in str(e) and "removed from the cache" in str(e)
    nothing_kept(tmp_path, name, page)


def test_corrupt_weights_in_place_say_to_delete_them(tmp_path):
    d = copy_model(model_folder(tmp_path / "good"), tmp_path / "m")
    (d / "model.safetensors").write_bytes(b"<html>not weights</html>" * 10)
    before = tree_digest(d)
    proc = run_cli(["Hi", "--model-dir", str(d)], cli_env(tmp_path))
    assert_one_line_error(proc, str(d / "model.safetensors"), "delete it")
    assert tree_digest(d) == before  # said, not done


# ------------------------------------------------------------------- #39 bug 2: revisions that are paths


@pytest.mark.parametrize("revision", ["{victim}", "x/../../../../victim", "..", "a//b", "main/", "a\\b",
                                      "v1\n", ".hidden", "C:x", "x.lock"])
def test_a_revision_that_is_a_path_is_refused_before_any_request(env, fake_hub, tmp_path, revision):
    fake_hub.add("acme/tiny", FULL)
    revision = revision.format(victim=tmp_path / "victim")
    before = files_under(tmp_path)
    with pytest.raises(ModelNameError) as info:
        resolve_model(f"acme/tiny@{revision}", progress=False)
    assert str(info.value).startswith("invalid revision ") and "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)
    assert fake_hub.requests == [] and files_under(tmp_path) == before


@pytest.mark.parametrize("revision", ["/abs/victim", "x/../../victim"])
def test_the_cli_refuses_a_revision_that_is_a_path(env, fake_hub, tmp_path, revision):
    fake_hub.add("acme/tiny", FULL)
    if revision.startswith("/"):
        revision = str(tmp_path / "victim")
    env = hub_env(tmp_path, fake_hub)
    before = files_under(tmp_path)
    proc = run_cli(["-m", f"acme/tiny@{revision}", "Hi"], env, cwd=tmp_path / "work")
    assert_one_line_error(proc, "invalid revision", repr(revision))
    assert fake_hub.requests == [] and files_under(tmp_path) == before
    assert not (tmp_path / "victim").exists()


@pytest.mark.parametrize("revision", ["main", "v1.0", "refs/pr/1", "feature/x-y_z", "a" * 40, "release@2"])
def test_branches_tags_and_commits_are_revisions(env, revision):
    assert parse_model_name(f"acme/tiny@{revision}").revision == revision


# ------------------------------------------------------------------- #39 bug 3: a redirect to file://


def test_a_redirect_to_a_local_file_is_not_followed(env, fake_hub, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the first line of a private file\n")
    secret.chmod(0o600)
    fake_hub.add(REPO, FULL)
    fake_hub.redirect["model.safetensors"] = secret.as_uri()
    e = resolve_fails(REPO, progress=False)
    assert "file: URL" in str(e) and "only http and https" in str(e) and e.missing == ["model.safetensors"]
    assert "private file" not in str(e)
    for path in files_under(tmp_path / "cache"):
        assert b"private file" not in path.read_bytes()
    nothing_kept(tmp_path, "model.safetensors")


# ------------------------------------------------------------------- #39 bug 4: past the listed size


def test_a_body_past_its_listed_size_stops_there(env, fake_hub, tmp_path):
    # The Hub lists config.json's size, then streams 64 MB. At most the listed size reaches the disk (the
    # rest is refused before it is written: a child with a 1 MiB file-size limit would be killed
    # otherwise), the connection is dropped early, and the error says why.
    fake_hub.add(REPO, FULL)
    fake_hub.oversize["config.json"] = 64 << 20
    listed = len(CONTENT["config.json"])
    code = ("import sys, resource; resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))\n"
            "from inferno.cli import main; sys.exit(main())")
    env = hub_env(tmp_path, fake_hub)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code, "-m", REPO, "Hi"], capture_output=True, text=True,
                          env=env, timeout=60, stdin=subprocess.DEVNULL)
    missing_files_error(proc, f"more than the {listed} bytes it listed", "config.json")
    assert time.monotonic() - start < 30
    assert fake_hub.sent["config.json"] < 32 << 20  # the client hung up long before the end
    nothing_kept(tmp_path, "config.json")
    assert "model.safetensors" not in fake_hub.names_requested()


def test_a_compressed_body_that_would_expand_past_its_size_is_refused(env, fake_hub, tmp_path):
    # The listed size is the file's own; a gzipped body is counted before it expands. So bodies are asked
    # for as they are, and one that comes compressed anyway (here 64 MB of zeros in ~64 KB) is refused.
    fake_hub.add(REPO, FULL)
    fake_hub.gzip["config.json"] = 64 << 20
    e = resolve_fails(REPO, progress=False)
    assert "config.json" in str(e) and "came compressed (gzip)" in str(e)
    assert fake_hub.accept_encoding == ["identity"]
    nothing_kept(tmp_path, "config.json")
    assert [p for p in files_under(tmp_path / "cache") if p.stat().st_size > 1 << 20] == []


def test_the_file_size_limit_would_catch_an_unbounded_write(tmp_path):
    # What the test above leans on: past RLIMIT_FSIZE a write fails (SIGXFSZ ignored here), so a download
    # that wrote on would end in "File too large", not in the message that test looks for.
    code = ("import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))\n"
            f"open({str(tmp_path / 'big')!r}, 'wb').write(b'x' * (2 << 20))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "File too large" in proc.stderr


# ------------------------------------------------------------------- #39 weak spot: a trickle


def test_a_download_that_trickles_gives_up(env, fake_hub, tmp_path, monkeypatch):
    fake_hub.add(REPO, FULL)
    fake_hub.trickle["config.json"] = 0.4  # one byte every 0.4 s
    monkeypatch.setenv("INFERNO_DOWNLOAD_STALL_SECONDS", "1")
    start = time.monotonic()
    e = resolve_fails(REPO, progress=False)
    assert time.monotonic() - start < 10
    assert "config.json" in str(e) and "stalled" in str(e) and "INFERNO_DOWNLOAD_STALL_SECONDS=1" in str(e)
    nothing_kept(tmp_path, "config.json")


def test_a_slow_but_steady_download_is_not_stopped(env, fake_hub, tmp_path, monkeypatch):
    # The same window, and a body that arrives well above the minimum rate: it completes.
    fake_hub.add(REPO, FULL)
    monkeypatch.setenv("INFERNO_DOWNLOAD_STALL_SECONDS", "1")
    assert resolve_model(REPO, progress=False).config.read_bytes() == CONTENT["config.json"]


def test_a_stall_window_that_is_not_a_number_is_one_line(env, fake_hub, monkeypatch):
    fake_hub.add(REPO, FULL)
    monkeypatch.setenv("INFERNO_DOWNLOAD_STALL_SECONDS", "soon")
    assert "INFERNO_DOWNLOAD_STALL_SECONDS='soon' is not a number" in str(resolve_fails(REPO, progress=False))


# ------------------------------------------------------------------- headers that would be paths


@pytest.mark.parametrize("header, value, needle", [
    ("X-Repo-Commit", "../../../../victim", "not 40 hex digits"),
    ("ETag", '"../../../victim"', "cannot name a file"),
])
def test_a_commit_or_etag_that_is_a_path_is_refused(env, fake_hub, tmp_path, header, value, needle):
    fake_hub.add(REPO, FULL)
    fake_hub.extra_headers["config.json"] = {header: value}
    e = resolve_fails(REPO, progress=False)
    assert needle in str(e) and "config.json" in str(e)
    assert [p for p in files_under(tmp_path) if "victim" in p.name] == []
