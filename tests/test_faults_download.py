"""Issue #17, the download path: nothing of the user's is deleted, followed or overwritten (item 7), and a
download is verified before it is moved into place; a corrupt file in place says to delete it (item 8).
Downloads go to the Hugging Face cache now: a local folder is only ever read."""

# The fixtures come from fake_hub (imported below), so their names are test arguments too.
# ruff: noqa: F811

from __future__ import annotations

from pathlib import Path

import pytest
from fake_hub import COMMIT, CONTENT, FULL, downloader, env, fake_hub  # noqa: F401 - fixtures
from test_faults_common import assert_one_line_error, cli_env, copy_model, model_folder, run_cli, tree_digest

import inferno.hub as hub
from inferno.hub import ModelFilesMissing, resolve_model

REPO = "user/fine-tune"


def resolve_fails(*args, **kwargs) -> ModelFilesMissing:
    with pytest.raises(ModelFilesMissing) as info:
        resolve_model(*args, **kwargs)
    assert "\n" not in str(info.value)
    return info.value


def repo_dir(tmp_path: Path, repo_id: str = REPO) -> Path:
    return tmp_path / "cache" / ("models--" + repo_id.replace("/", "--"))


# ------------------------------------------------------------------- item 7: the user's files


def test_a_local_folder_is_never_written(env, fake_hub, downloader, tmp_path):
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


def test_a_dangling_cache_link_is_replaced_not_written_through(env, fake_hub, tmp_path, monkeypatch):
    monkeypatch.setenv("INFERNO_DOWNLOADER", "urllib")
    fake_hub.add(REPO, FULL)
    snapshot = repo_dir(tmp_path) / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    target = tmp_path / "elsewhere" / "model.safetensors"  # does not exist
    (snapshot / "model.safetensors").symlink_to(target)
    files = resolve_model(REPO, progress=False)
    assert not target.exists()
    assert files.weights.read_bytes() == CONTENT["model.safetensors"]
    assert files.weights.resolve().parent == repo_dir(tmp_path) / "blobs"


def test_ctrl_c_keeps_only_a_partial_blob_to_resume(env, fake_hub, tmp_path, monkeypatch):
    monkeypatch.setenv("INFERNO_DOWNLOADER", "urllib")
    fake_hub.add(REPO, FULL)
    real = hub._stream

    def interrupted(meta, out, have, digest, bar):
        if "safetensors" in meta.location:
            out.write(CONTENT["model.safetensors"][:1000])
            raise KeyboardInterrupt
        return real(meta, out, have, digest, bar)

    monkeypatch.setattr(hub, "_stream", interrupted)
    with pytest.raises(KeyboardInterrupt):
        resolve_model(REPO, progress=False)
    snapshot = repo_dir(tmp_path) / "snapshots" / COMMIT
    assert not (snapshot / "model.safetensors").exists()
    partial = [p for p in (repo_dir(tmp_path) / "blobs").iterdir() if p.name.endswith(".incomplete")]
    assert len(partial) == 1 and partial[0].read_bytes() == CONTENT["model.safetensors"][:1000]
    monkeypatch.setattr(hub, "_stream", real)
    assert resolve_model(REPO, progress=False).weights.read_bytes() == CONTENT["model.safetensors"]
    assert fake_hub.requests[-1][2] == {"Range": "bytes=1000-"}


# ------------------------------------------------------------------- item 8: verified downloads


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json"])
def test_an_html_page_is_not_saved_as_config_or_tokenizer(env, fake_hub, tmp_path, monkeypatch, name):
    monkeypatch.setenv("INFERNO_DOWNLOADER", "urllib")
    fake_hub.add(REPO, {**FULL, name: b"<html>rate limited</html>"})
    e = resolve_fails(REPO, progress=False)
    assert name in str(e) and "not saved" in str(e)
    assert not (repo_dir(tmp_path) / "snapshots" / COMMIT / name).exists()
    assert not [p for p in (repo_dir(tmp_path) / "blobs").iterdir() if p.name.endswith(".incomplete")]


def test_corrupt_weights_in_place_say_to_delete_them(tmp_path):
    d = copy_model(model_folder(tmp_path / "good"), tmp_path / "m")
    (d / "model.safetensors").write_bytes(b"<html>not weights</html>" * 10)
    before = tree_digest(d)
    proc = run_cli(["Hi", "--model-dir", str(d)], cli_env(tmp_path))
    assert_one_line_error(proc, str(d / "model.safetensors"), "delete it")
    assert tree_digest(d) == before  # said, not done
