"""Model names → files: names, the Hugging Face cache layout, and downloads through huggingface_hub from a
local fake Hub (HF_ENDPOINT points at it), with inferno's checks of what it fetched."""

# The fixtures come from fake_hub (imported below), so their names are test arguments too.
# ruff: noqa: F811

from __future__ import annotations

import hashlib
import json
import os
import shlex
import sys
from pathlib import Path

import pytest
from fake_hub import (  # noqa: F401 - fixtures used below
    COMMIT,
    COMMIT2,
    CONFIG,
    CONTENT,
    FULL,
    FakeHub,
    cache_snapshot,
    config_json,
    env,
    fake_hub,
    git_blob_hash,
    weights_bytes,
)

import inferno
import inferno.models.download as download
import inferno.models.resolve as resolve
from inferno.models.config import ConfigError
from inferno.models.names import SHORT_NAMES, ModelNameError, model_id, parse_model_name
from inferno.models.resolve import (
    RANDOM_HINT,
    DownloadVerificationError,
    ModelFilesMissing,
    find_cached_snapshot,
    hf_cache_dir,
    resolve_model,
)
from inferno.tokenizer import Tokenizer

REPO = "user/fine-tune"
SHA = {n: hashlib.sha256(d).hexdigest() for n, d in CONTENT.items()}


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """The shipped gpt2 config.json and tokenizer.json, as small files matching the fake Hub's weights."""
    folder = tmp_path / "shipped"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (folder / name).write_bytes(CONTENT[name])
    monkeypatch.setattr(resolve, "shipped_gpt2_file", lambda name: folder / name)
    return folder


def repo_dir(env_cache: Path, repo_id: str) -> Path:
    return env_cache / ("models--" + repo_id.replace("/", "--"))


def missing_error(name=None, **kwargs) -> ModelFilesMissing:
    with pytest.raises(ModelFilesMissing) as info:
        resolve_model(name, **kwargs)
    assert "\n" not in str(info.value)
    return info.value


# ------------------------------------------------------------------------------------------- names


@pytest.mark.parametrize("name, repo, revision", [
    (None, "openai-community/gpt2", "main"),
    ("gpt2", "openai-community/gpt2", "main"),
    ("gpt2-medium", "openai-community/gpt2-medium", "main"),
    ("gpt2-large", "openai-community/gpt2-large", "main"),
    ("gpt2-xl", "openai-community/gpt2-xl", "main"),
    ("distilgpt2", "distilbert/distilgpt2", "main"),
    ("gpt2@v1.0", "openai-community/gpt2", "v1.0"),
    ("openai-community/gpt2-large", "openai-community/gpt2-large", "main"),
    ("distilbert/distilgpt2", "distilbert/distilgpt2", "main"),
    ("user/fine-tune@" + COMMIT, "user/fine-tune", COMMIT),
    ("user/fine_tune.v2@refs/pr/1", "user/fine_tune.v2", "refs/pr/1"),
])
def test_hub_names(env, name, repo, revision):
    spec = parse_model_name(name)
    assert (spec.kind, spec.repo_id, spec.revision) == ("hub", repo, revision)
    assert spec.id == repo + ("" if revision == "main" else f"@{revision}")


def test_short_names_are_the_hub_models_even_with_a_folder_of_that_name(env):
    (env / "gpt2").mkdir()  # like the project's checkout, which ships gpt2/config.json
    assert parse_model_name("gpt2").kind == "hub"
    assert parse_model_name("./gpt2").kind == "folder" and parse_model_name("./gpt2").path == env / "gpt2"
    assert parse_model_name(Path("gpt2")).kind == "folder"  # a Path is always a folder


def test_folders(env, tmp_path):
    (env / "mine").mkdir()
    (env / "org" / "name").mkdir(parents=True)
    assert parse_model_name("mine").path == env / "mine"  # an existing folder, by its bare name
    assert parse_model_name("org/name").kind == "folder"  # exists here, so not the Hub repo org/name
    assert parse_model_name(str(tmp_path)).path == tmp_path
    assert parse_model_name("~/m").path == Path.home() / "m"
    assert model_id("./mine") == "mine"


def test_random_names(env):
    assert parse_model_name("random").random_config.n_embd == 768
    tiny = parse_model_name("random:tiny").random_config
    assert tiny.vocab_size == 50257 and tiny.n_layer < 12
    assert model_id("random:tiny") == "random:tiny" and model_id("gpt2") == "openai-community/gpt2"


@pytest.mark.parametrize("name, needles", [
    ("gtp2", ["'gtp2'", "did you mean gpt2?", "ORG/NAME"]),
    ("gpt2-xxl", ["did you mean gpt2-xl?"]),
    ("random:big", ["random or random:tiny"]),
    ("", ["empty path"]),
    ("org/na me", ["is not a folder here"]),
    ("a/b/c", ["is not a folder here"]),
    ("org/name@", ["nothing after '@'"]),
])
def test_bad_names_are_one_line(env, name, needles):
    with pytest.raises(ModelNameError) as info:
        parse_model_name(name)
    assert "\n" not in str(info.value) and all(n in str(info.value) for n in needles), str(info.value)
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, ValueError)


def test_not_a_name_at_all(env):
    with pytest.raises(TypeError, match="not int"):
        parse_model_name(123)


# ------------------------------------------------------------------------------------------- cache


def test_found_in_the_cache_without_a_request(env, tmp_path, fake_hub):
    snapshot = cache_snapshot(tmp_path / "cache")
    files = resolve_model("gpt2")
    assert files.weights == snapshot / "model.safetensors" and files.config == snapshot / "config.json"
    assert files.weights.read_bytes() == CONTENT["model.safetensors"] and files.id == "openai-community/gpt2"
    assert fake_hub.requests == []


def test_cache_location(env, tmp_path, monkeypatch):
    assert hf_cache_dir() == tmp_path / "cache"
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    assert hf_cache_dir() == tmp_path / "hfhome" / "hub"
    snapshot = cache_snapshot(tmp_path / "hfhome" / "hub")
    assert resolve_model(download=False).weights.parent == snapshot
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hf_cache_dir() == tmp_path / "home" / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hf_cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"


def test_revisions_in_the_cache(env, tmp_path):
    cache = tmp_path / "cache"
    main = cache_snapshot(cache, REPO, commit=COMMIT)
    dev = cache_snapshot(cache, REPO, commit=COMMIT2, ref="dev")
    assert find_cached_snapshot(REPO, "main") == main
    assert find_cached_snapshot(REPO, "dev") == dev
    assert find_cached_snapshot(REPO, COMMIT2) == dev  # a commit is its own snapshot
    assert find_cached_snapshot(REPO, "v9") is None
    assert resolve_model(f"{REPO}@dev", download=False).weights.parent == dev


def test_main_without_a_ref_is_the_newest_complete_snapshot(env, tmp_path):
    cache = tmp_path / "cache"
    cache_snapshot(cache, commit=COMMIT, ref=None, files={"config.json": CONTENT["config.json"]})
    full = cache_snapshot(cache, commit=COMMIT2, ref=None)
    assert find_cached_snapshot() == full


def test_shipped_config_and_tokenizer_stand_in_for_gpt2(env, tmp_path, shipped):
    snapshot = cache_snapshot(tmp_path / "cache", files={"model.safetensors": CONTENT["model.safetensors"]})
    files = resolve_model("gpt2", download=False)
    assert files.weights == snapshot / "model.safetensors"
    assert files.config == shipped / "config.json" and files.tokenizer == shipped / "tokenizer.json"
    with pytest.raises(ModelFilesMissing):  # only for gpt2 at main
        resolve_model("gpt2@" + COMMIT2, download=False)


def test_a_pruned_blob_counts_as_missing(env, tmp_path, fake_hub, shipped):
    snapshot = cache_snapshot(tmp_path / "cache")
    (snapshot / "model.safetensors").resolve().unlink()  # the link now leads nowhere
    assert missing_error(download=False).missing == ["model.safetensors"]
    files = resolve_model(progress=False)
    assert files.weights.read_bytes() == CONTENT["model.safetensors"]
    assert fake_hub.names_requested() == ["model.safetensors"]


# ------------------------------------------------------------------------------------------- downloads


def test_gpt2_fetches_only_the_weights_into_the_cache_layout(env, tmp_path, fake_hub, shipped):
    files = resolve_model("gpt2", progress=False)
    repo = repo_dir(tmp_path / "cache", "openai-community/gpt2")
    assert fake_hub.names_requested() == ["model.safetensors"]
    assert files.weights == repo / "snapshots" / COMMIT / "model.safetensors"
    assert files.weights.is_symlink() and files.weights.resolve() == repo / "blobs" / SHA["model.safetensors"]
    assert files.weights.read_bytes() == CONTENT["model.safetensors"]
    assert (repo / "refs" / "main").read_text() == COMMIT
    assert not [p for p in (repo / "blobs").iterdir() if p.name.endswith(".incomplete")]
    # The second time, everything is in the cache: no request.
    fake_hub.requests.clear()
    assert resolve_model("gpt2") == files and fake_hub.requests == []


def test_any_repo_fetches_config_tokenizer_weights_from_one_commit(env, tmp_path, fake_hub):
    fake_hub.add(REPO, FULL, commit=COMMIT)
    fake_hub.add(REPO, {**FULL, "config.json": config_json(n_ctx=1)}, commit=COMMIT2, ref="v2")
    files = resolve_model(f"{REPO}@v2", progress=False)
    assert fake_hub.names_requested() == ["config.json", "tokenizer.json", "model.safetensors"]
    assert files.config.parent.name == COMMIT2 and files.config.read_bytes() == config_json(n_ctx=1)
    repo = repo_dir(tmp_path / "cache", REPO)
    assert (repo / "refs" / "v2").read_text() == COMMIT2
    assert (repo / "blobs" / git_blob_hash(config_json(n_ctx=1))).is_file()  # small files by git hash
    pipe = inferno.load(f"{REPO}@v2", "numpy")
    assert pipe.config.n_embd == CONFIG.n_embd and len(pipe.generate("the", max_new_tokens=3).ids) == 3


def test_a_repo_without_tokenizer_json_uses_vocab_and_merges(env, fake_hub):
    files = {n: CONTENT[n] for n in ("config.json", "model.safetensors", "vocab.json", "merges.txt")}
    fake_hub.add(REPO, files)
    got = resolve_model(REPO, progress=False)
    assert got.tokenizer is None and got.vocab.name == "vocab.json" and got.merges.name == "merges.txt"
    assert fake_hub.names_requested() == ["config.json", "vocab.json", "merges.txt", "model.safetensors"]
    assert "tokenizer.json" in fake_hub.names_requested("HEAD")  # asked for first
    pipe = inferno.load(REPO, "numpy")
    same = Tokenizer.from_dict(json.loads(CONTENT["tokenizer.json"]))  # the same vocabulary and merges
    space = same.encode(" ")[0]
    assert pipe.tokenizer.encode(" the he") == same.encode(" the he") == [256, 257, space, 257]


def test_another_architecture_is_refused_before_its_weights(env, fake_hub):
    gemma = b'{"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], "hidden_size": 4096}'
    fake_hub.add("google/gemma", {**FULL, "config.json": gemma})
    with pytest.raises(ConfigError) as info:
        resolve_model("google/gemma", progress=False)
    assert "'model_type'" in str(info.value) and "gemma2" in str(info.value) and "\n" not in str(info.value)
    assert "model.safetensors" not in fake_hub.names_requested()


@pytest.mark.parametrize("case, needles", [
    ("no weights", ["has no model.safetensors", "model.safetensors"]),
    ("no tokenizer", ["neither tokenizer.json nor vocab.json + merges.txt"]),
    ("no repo", ["no repo nobody/nothing"]),
    ("no revision", ["no revision 'v9'"]),
])
def test_hub_errors_are_one_line(env, fake_hub, case, needles):
    fake_hub.add(REPO, FULL)
    name = REPO
    if case == "no weights":
        fake_hub.file(REPO, "model.safetensors", None)
    elif case == "no tokenizer":
        fake_hub.file(REPO, "tokenizer.json", None)
    elif case == "no repo":
        name = "nobody/nothing"
    else:
        name = REPO + "@v9"
    e = missing_error(name, progress=False)
    for needle in needles:
        assert needle in str(e), str(e)
    assert "-m random" in e.remedy


def test_unreachable_hub(env, shipped):
    e = missing_error(progress=False)  # HF_ENDPOINT is a closed port (see the env fixture)
    assert "download failed" in str(e) and e.missing == ["model.safetensors"]
    assert "-m random" in e.remedy
    # Said at once, not after huggingface_hub's five retries.
    assert "cannot connect to 127.0.0.1:" in str(e) and "Connection refused" in str(e)


@pytest.mark.parametrize("var, value", [("HF_HUB_OFFLINE", "1"), ("INFERNO_OFFLINE", "1"),
                                        ("HF_HUB_OFFLINE", "true")])
def test_offline_makes_no_request(env, fake_hub, monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    e = missing_error("gpt2-large")
    assert fake_hub.requests == []
    assert "offline" in str(e) and var in str(e) and "openai-community/gpt2-large" in str(e)
    assert e.remedy == f"unset {var} to download it, or try {RANDOM_HINT}"


def test_offline_zero_means_online(env, fake_hub, monkeypatch, shipped):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    resolve_model(progress=False)
    assert fake_hub.requests


def test_download_false_makes_no_request(env, fake_hub, monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)  # no hf command on PATH: hf through this Python
    e = missing_error(REPO, download=False)
    assert fake_hub.requests == [] and "downloading disabled" in str(e)
    hf = shlex.join([sys.executable, "-m", "huggingface_hub.cli.hf"])
    assert e.remedy == (f"fetch it with: {hf} download {REPO} config.json model.safetensors tokenizer.json; "
                        f"or try {RANDOM_HINT}")


def test_the_remedy_names_the_hf_command_when_there_is_one(env, monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    e = missing_error(f"{REPO}@v2", download=False)
    assert e.lines[1].startswith(f"fetch it with: hf download {REPO} config.json model.safetensors "
                                 f"tokenizer.json --revision v2; or try -m random")


def test_a_folder_is_used_as_it_is(env, tmp_path, fake_hub):
    folder = tmp_path / "my model"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(CONTENT["tokenizer.json"])
    e = missing_error(folder)
    assert e.missing == ["config.json", "model.safetensors"] and str(folder) in str(e)
    assert fake_hub.requests == [] and sorted(p.name for p in folder.iterdir()) == ["tokenizer.json"]
    assert "no such folder" in str(missing_error(tmp_path / "nothing"))
    (folder / "config.json").write_bytes(CONTENT["config.json"])
    (folder / "model.safetensors").write_bytes(CONTENT["model.safetensors"])
    assert resolve_model(folder).weights == folder / "model.safetensors"


# ------------------------------------------------------------------------------------- progress, resume


def test_no_progress_output_when_disabled(env, fake_hub, capsys, shipped):
    resolve_model(progress=False)
    assert capsys.readouterr().err == ""


def test_a_dropped_connection_is_resumed_in_the_same_run(env, fake_hub, shipped):
    fake_hub.drop_after["model.safetensors"] = 300_000
    fake_hub.drops_left = 1
    files = resolve_model(progress=False)
    assert files.weights.read_bytes() == CONTENT["model.safetensors"]
    gets = [h for m, p, h in fake_hub.requests if m == "GET" and p.startswith("/cdn/")]
    assert len(gets) == 2, fake_hub.requests


# ------------------------------------------------------------------------------------- verification


def removed_from_the_cache(repo: Path, name: str) -> None:
    """Neither the snapshot link, nor a blob, nor a temporary file of `name` is left in `repo`."""
    assert not os.path.lexists(repo / "snapshots" / COMMIT / name)
    assert [p.name for p in (repo / "blobs").iterdir()] == []


def test_a_wrong_checksum_is_removed_from_the_cache(env, tmp_path, fake_hub, shipped):
    fake_hub.lie_sha256.add("model.safetensors")  # the Hub lists another SHA-256 than the bytes have
    e = missing_error(progress=False)
    assert "SHA-256" in str(e) and "removed from the cache" in str(e) and e.missing == ["model.safetensors"]
    removed_from_the_cache(repo_dir(tmp_path / "cache", "openai-community/gpt2"), "model.safetensors")


def test_an_html_page_is_not_kept_as_the_weights(env, tmp_path, fake_hub, shipped):
    # #39 bug 11: a proxy or captive portal answers model.safetensors with a 200 HTML page. It is removed
    # from the cache (blob and link), so the next run fetches it again rather than failing on its header.
    page = b"<!DOCTYPE html><html>Sign in</html>\n"
    fake_hub.file("openai-community/gpt2", "model.safetensors", page)
    e = missing_error(progress=False)
    assert "model.safetensors" in str(e) and "not usable" in str(e) and "removed from the cache" in str(e)
    removed_from_the_cache(repo_dir(tmp_path / "cache", "openai-community/gpt2"), "model.safetensors")
    assert missing_error(download=False).missing == ["model.safetensors"]  # not found in the cache
    fake_hub.file("openai-community/gpt2", "model.safetensors", CONTENT["model.safetensors"])
    assert resolve_model(progress=False).weights.read_bytes() == CONTENT["model.safetensors"]


def test_weights_that_do_not_match_the_config_are_removed_from_the_cache(env, tmp_path, fake_hub):
    fake_hub.add(REPO, {**FULL, "model.safetensors": weights_bytes(CONFIG.__class__(
        **{**CONFIG.__dict__, "n_embd": 32}))})
    e = missing_error(REPO, progress=False)
    assert "does not match config.json" in str(e) and "wte.weight" in str(e) and "removed" in str(e)
    repo = repo_dir(tmp_path / "cache", REPO)
    assert not os.path.lexists(repo / "snapshots" / COMMIT / "model.safetensors")
    assert (repo / "snapshots" / COMMIT / "config.json").is_file()  # the files that passed stay
    assert missing_error(REPO, download=False).missing == ["model.safetensors"]


def test_the_token_goes_to_the_hub_and_not_to_the_cdn(env, fake_hub, shipped, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    resolve_model(progress=False)
    hub_auth = [h.get("Authorization") for m, p, h in fake_hub.requests if "/resolve/" in p]
    cdn_auth = [h.get("Authorization") for m, p, h in fake_hub.requests if p.startswith("/cdn/")]
    assert hub_auth and set(hub_auth) == {"Bearer hf_secret"}
    assert cdn_auth and set(cdn_auth) == {None}


def test_a_file_in_the_snapshot_is_never_replaced(env, tmp_path, fake_hub):
    fake_hub.add(REPO, FULL)
    snapshot = repo_dir(tmp_path / "cache", REPO) / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / "tokenizer.json").write_bytes(CONTENT["tokenizer.json"])  # a plain file: someone's own
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text(COMMIT)
    files = resolve_model(REPO, progress=False)
    assert not files.tokenizer.is_symlink() and "tokenizer.json" not in fake_hub.names_requested()


def test_verification_errors_are_oserrors():
    assert issubclass(DownloadVerificationError, OSError)


def test_short_names_are_the_documented_ones():
    # The Llama family's: tests/test_hub_llama.py.
    gpt2 = {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "distilgpt2"}
    assert gpt2 <= set(SHORT_NAMES) and all(SHORT_NAMES[n].split("/")[0] in ("openai-community", "distilbert")
                                            for n in gpt2)
    assert os.fspath(resolve.shipped_gpt2_file("tokenizer.json")).endswith("tokenizer.json")


def test_behind_a_proxy_the_hub_host_is_not_probed(monkeypatch):
    # The fast "cannot connect" is for a host nothing can reach; through a proxy only the proxy must be.
    closed = "http://127.0.0.1:9"
    for var in ("http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
    assert "cannot connect to 127.0.0.1:9" in download.unreachable(closed)
    monkeypatch.setenv("http_proxy", "http://proxy.invalid:3128")
    assert download.unreachable(closed) is None
    monkeypatch.setenv("no_proxy", "127.0.0.1")  # bypassed: probed again
    assert "cannot connect" in download.unreachable(closed)
