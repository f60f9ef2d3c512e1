"""Issue #17, the download path: nothing of the user's is deleted, followed or overwritten (item 7), and a
download is verified before it is moved into place; a corrupt file in place says to delete it (item 8)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from test_faults_common import assert_one_line_error, cli_env, copy_model, model_folder, run_cli, tree_digest
from test_hub import CONTENT, PREFIX, FakeHub, env, fake_hub, fill  # noqa: F401 - fixtures used below

from inferno.hub import ModelFilesMissing, resolve_model_dir


def resolve_fails(*args, **kwargs) -> ModelFilesMissing:
    with pytest.raises(ModelFilesMissing) as info:
        resolve_model_dir(*args, **kwargs)
    assert "\n" not in str(info.value)
    return info.value


def no_temporary_files(d: Path) -> bool:
    return not [p for p in d.iterdir() if p.name.endswith(".inferno-download")]


# ------------------------------------------------------------------- item 7: the user's files


def test_users_part_file_survives_a_failed_download(env, fake_hub):  # noqa: F811
    d = fill(env / "gpt2", ["config.json", "tokenizer.json"])
    (d / "model.safetensors.part").write_bytes(b"my own notes, not a download")
    del fake_hub.files["model.safetensors"]  # the download never starts: 404
    before = tree_digest(d)
    e = resolve_fails(progress=False)
    assert "404" in str(e)
    assert tree_digest(d) == before  # byte for byte, the .part included
    assert no_temporary_files(d)


def test_symlinked_part_file_is_not_written_through(env, fake_hub, tmp_path):  # noqa: F811
    d = fill(env / "gpt2", ["config.json", "tokenizer.json"])
    precious = tmp_path / "precious.bin"
    precious.write_bytes(b"the user's precious file")
    (d / "model.safetensors.part").symlink_to(precious)
    resolve_model_dir(progress=False)
    assert precious.read_bytes() == b"the user's precious file"
    part = d / "model.safetensors.part"
    assert part.is_symlink() and os.readlink(part) == str(precious)
    dest = d / "model.safetensors"
    assert not dest.is_symlink() and dest.read_bytes() == CONTENT["model.safetensors"]
    assert no_temporary_files(d)


def test_dangling_symlink_in_place_is_not_written_through(env, fake_hub, tmp_path):  # noqa: F811
    d = fill(env / "gpt2", ["config.json", "tokenizer.json"])
    target = tmp_path / "elsewhere" / "model.safetensors"  # does not exist
    (d / "model.safetensors").symlink_to(target)
    before = tree_digest(d)
    resolve_model_dir(d, progress=False)  # the link is the user's: nothing is fetched for it
    assert fake_hub.names_requested() == []
    assert not target.exists() and tree_digest(d) == before


def test_interrupted_download_leaves_only_the_users_files(env, fake_hub, monkeypatch):  # noqa: F811
    import inferno.hub as hub

    d = fill(env / "gpt2", ["config.json", "tokenizer.json"])
    before = tree_digest(d)

    def interrupt(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(hub, "_verify_contents", interrupt)
    with pytest.raises(KeyboardInterrupt):
        resolve_model_dir(progress=False)
    assert tree_digest(d) == before and no_temporary_files(d)


# ------------------------------------------------------------------- item 8: verified downloads


def test_html_page_is_not_saved_as_the_weights(env, fake_hub):  # noqa: F811
    d = fill(env / "gpt2", ["config.json", "tokenizer.json"])
    fake_hub.files["model.safetensors"] = b"<!DOCTYPE html><html><body>Sign in to continue</body></html>\n"
    before = tree_digest(d)
    e = resolve_fails(progress=False)
    assert "model.safetensors" in str(e) and "not usable" in str(e) and "not saved" in str(e)
    assert tree_digest(d) == before and not (d / "model.safetensors").exists()
    # The next run tries again (nothing bad was left in place).
    fake_hub.files["model.safetensors"] = CONTENT["model.safetensors"]
    resolve_model_dir(progress=False)
    assert (d / "model.safetensors").read_bytes() == CONTENT["model.safetensors"]


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json"])
def test_html_page_is_not_saved_as_config_or_tokenizer(env, fake_hub, name):  # noqa: F811
    fake_hub.files[name] = b"<html>rate limited</html>"
    e = resolve_fails(progress=False)
    assert name in str(e) and "not saved" in str(e)
    assert not (env / "gpt2" / name).exists()


def test_weights_that_do_not_match_the_config_are_not_saved(env, fake_hub):  # noqa: F811
    d = fill(env / "gpt2", ["tokenizer.json"])
    fake_hub.files["config.json"] = CONTENT["config.json"].replace(b'"n_embd": 64', b'"n_embd": 32')
    e = resolve_fails(progress=False)
    assert "does not match config.json" in str(e) and "wte.weight" in str(e)
    assert not (d / "model.safetensors").exists()


class ChecksumHub(FakeHub):
    """Redirects like the real Hub, with the file's SHA-256 and size on the 302 (X-Linked-Etag/-Size)."""

    def __init__(self, sha: str, size: int) -> None:
        super().__init__()
        self.redirect = True
        handler = self.server.RequestHandlerClass
        send_header = handler.send_header

        def with_checksum(this, key, value):
            send_header(this, key, value)
            if key == "Location" and this.path.endswith("model.safetensors"):
                send_header(this, "X-Linked-Etag", f'"{sha}"')
                send_header(this, "X-Linked-Size", str(size))

        handler.send_header = with_checksum


@pytest.mark.parametrize("good", [True, False])
def test_published_checksum_is_verified(env, monkeypatch, good):  # noqa: F811
    data = CONTENT["model.safetensors"]
    sha = hashlib.sha256(data if good else data + b"x").hexdigest()
    server = ChecksumHub(sha, len(data))
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    try:
        d = fill(env / "gpt2", ["config.json", "tokenizer.json"])
        if good:
            resolve_model_dir(progress=False)
            assert (d / "model.safetensors").read_bytes() == data
        else:
            e = resolve_fails(progress=False)
            assert "SHA-256" in str(e) and sha in str(e)
            assert not (d / "model.safetensors").exists() and no_temporary_files(d)
    finally:
        server.close()


def test_corrupt_weights_in_place_say_to_delete_them(tmp_path):
    d = copy_model(model_folder(tmp_path / "good"), tmp_path / "m")
    (d / "model.safetensors").write_bytes(b"<html>not weights</html>" * 10)
    before = tree_digest(d)
    proc = run_cli(["Hi", "--model-dir", str(d)], cli_env(tmp_path))
    assert_one_line_error(proc, str(d / "model.safetensors"), "delete it")
    assert tree_digest(d) == before  # said, not done
