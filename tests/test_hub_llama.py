"""Llama-family models from the Hub (#41): the family chosen from config.json before the weights come
down, only the files it needs fetched (the tokenizer's sidecars, never a pytorch_model.bin), sharded
checkpoints (the index, then each shard, each checked), and the short names. The fake Hub (tests/fake_hub.py)
serves a tiny random Llama model with its tokenizer files, as one model.safetensors and as shards."""

# The fixtures come from fake_hub (imported below), so their names are test arguments too.
# ruff: noqa: F811

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from fake_hub import COMMIT, FULL, cache_snapshot, env, fake_hub  # noqa: F401 - fixtures used below

import inferno
from inferno.models.names import SHORT_NAMES, parse_model_name
from inferno.models.resolve import ModelFilesMissing, find_cached_snapshot, resolve_model
from inferno.testing import make_llama_model
from inferno.tokenizer import TokenizerError

REPO = "acme/tiny-llama"
SHARDED = "acme/tiny-llama-sharded"
DOCS = Path(__file__).resolve().parent.parent / "docs"


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def model_files(tmp_path_factory) -> dict[str, dict[str, bytes]]:
    """The same random Qwen3-shaped model (q/k norms, GQA, head_dim given) as one file and as 3 shards."""
    one = make_llama_model(tmp_path_factory.mktemp("one"), "qwen3", seed=3)
    many = make_llama_model(tmp_path_factory.mktemp("many"), "qwen3", seed=3, shards=3)
    return {"one": files_of(one), "many": files_of(many)}


def test_a_llama_repo_fetches_its_tokenizer_files_and_loads(env, fake_hub, model_files, tmp_path):
    fake_hub.add(REPO, model_files["one"])
    files = resolve_model(REPO, progress=False)
    assert fake_hub.names_requested() == ["config.json", "tokenizer.json", "tokenizer_config.json",
                                          "generation_config.json", "model.safetensors"]
    # Asked for, not there (fine): the family reads it when a repo has it. Never a pytorch_model.bin.
    assert "chat_template.jinja" in fake_hub.names_requested("HEAD")
    assert not [p for _, p, _ in fake_hub.requests if "pytorch_model" in p or "index.json" in p]
    assert files.weights.name == "model.safetensors" and files.config.parent.name == COMMIT
    pipe = inferno.load(REPO, "numpy")
    tok = pipe.tokenizer
    assert tok.chat_template and tok.eos_ids == (257, 260) and tok.bos_id == 256
    local = inferno.load(os.fspath(_folder(tmp_path / "local", model_files["one"])), "numpy")
    ids = pipe.tokenizer.encode("the he the")
    np.testing.assert_array_equal(pipe.logits(ids), local.logits(ids))
    fake_hub.requests.clear()  # the second time: all in the cache, no request
    assert resolve_model(REPO) == files and fake_hub.requests == []


def _folder(path: Path, files: dict[str, bytes]) -> Path:
    path.mkdir()
    for name, data in files.items():
        (path / name).write_bytes(data)
    return path


def test_a_sharded_checkpoint_comes_down_index_first(env, fake_hub, model_files):
    fake_hub.add(SHARDED, model_files["many"])
    files = resolve_model(SHARDED, progress=False)
    shards = [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    assert fake_hub.names_requested()[-4:] == ["model.safetensors.index.json", *shards]
    heads = [p.rsplit("/", 1)[-1] for m, p, _ in fake_hub.requests if m == "HEAD" and "/resolve/" in p]
    assert heads.index("model.safetensors") < heads.index("model.safetensors.index.json")  # tried first
    assert files.weights.name == "model.safetensors.index.json"
    assert all((files.weights.parent / s).is_symlink() for s in shards)
    fake_hub.add(REPO, model_files["one"])
    sharded, single = inferno.load(SHARDED, "numpy"), inferno.load(REPO, "numpy")
    ids = single.tokenizer.encode("he the")
    np.testing.assert_array_equal(sharded.logits(ids), single.logits(ids))
    fake_hub.requests.clear()
    assert resolve_model(SHARDED) == files and fake_hub.requests == []


def test_a_missing_shard_is_fetched_again(env, fake_hub, model_files, tmp_path):
    fake_hub.add(SHARDED, model_files["many"])
    files = resolve_model(SHARDED, progress=False)
    (files.weights.parent / "model-00002-of-00003.safetensors").resolve().unlink()  # a pruned blob
    with pytest.raises(ModelFilesMissing) as info:
        resolve_model(SHARDED, download=False)
    assert info.value.missing == ["model-00002-of-00003.safetensors"]
    fake_hub.requests.clear()
    assert resolve_model(SHARDED, progress=False) == files
    assert fake_hub.names_requested() == ["model-00002-of-00003.safetensors"]


def test_a_shard_that_does_not_match_the_config_is_removed(env, fake_hub, model_files, tmp_path):
    wrong = make_llama_model(tmp_path / "wrong", "qwen3", seed=3, shards=3, hidden_size=20)
    fake_hub.add(SHARDED, {**model_files["many"], "model-00002-of-00003.safetensors":
                           (wrong / "model-00002-of-00003.safetensors").read_bytes()})
    with pytest.raises(ModelFilesMissing) as info:
        resolve_model(SHARDED, progress=False)
    text = str(info.value)
    assert "model-00002-of-00003.safetensors" in text and "does not match config.json" in text
    assert "has shape" in text and "removed from the cache" in text and "\n" not in text
    snapshot = find_cached_snapshot(SHARDED)
    assert not os.path.lexists(snapshot / "model-00002-of-00003.safetensors")
    assert (snapshot / "model-00001-of-00003.safetensors").is_file()  # the one that passed stays
    assert "model-00003-of-00003.safetensors" not in fake_hub.names_requested()  # stopped at the bad one


def test_a_shard_holding_other_tensors_than_its_index_says_is_refused(env, fake_hub, model_files):
    many = dict(model_files["many"])
    many["model-00001-of-00003.safetensors"], many["model-00002-of-00003.safetensors"] = \
        many["model-00002-of-00003.safetensors"], many["model-00001-of-00003.safetensors"]
    fake_hub.add(SHARDED, many)
    with pytest.raises(ModelFilesMissing) as info:
        resolve_model(SHARDED, progress=False)
    assert "model-00001-of-00003.safetensors" in str(info.value) and "its index names" in str(info.value)


@pytest.mark.parametrize("index, needle", [
    ({"weight_map": {"model.norm.weight": "../evil.safetensors"}}, "not a file name beside the index"),
    ({"weight_map": {}}, "'weight_map' must be a non-empty object"),
    ([1, 2], "expected a JSON object"),
])
def test_a_bad_index_is_refused_before_any_shard(env, fake_hub, model_files, index, needle):
    fake_hub.add(SHARDED, {**model_files["many"], "model.safetensors.index.json": json.dumps(index).encode()})
    with pytest.raises(ModelFilesMissing) as info:
        resolve_model(SHARDED, progress=False)
    assert needle in str(info.value) and "model.safetensors.index.json" in str(info.value)
    assert not [n for n in fake_hub.names_requested() if n.endswith(".safetensors")]
    assert not os.path.lexists(find_cached_snapshot(SHARDED) / "model.safetensors.index.json")


def test_a_gpt2_repo_with_only_shards_is_refused_in_one_line(env, fake_hub):
    index = b'{"weight_map": {"a": "b.safetensors"}}'
    files = {n: FULL[n] for n in ("config.json", "tokenizer.json")}
    fake_hub.add("user/gpt2-sharded", {**files, "model.safetensors.index.json": index})
    with pytest.raises(ModelFilesMissing) as info:
        resolve_model("user/gpt2-sharded", progress=False)
    assert "has no model.safetensors (inferno reads GPT-2 weights from one safetensors" in str(info.value)
    assert "model.safetensors.index.json" not in fake_hub.names_requested()


def test_a_chat_template_jinja_is_fetched_and_wins(env, fake_hub, model_files):
    fake_hub.add(REPO, {**model_files["one"], "chat_template.jinja": b"{{ messages[0]['content'] }}!"})
    pipe = inferno.load(REPO, "numpy")
    assert "chat_template.jinja" in fake_hub.names_requested()
    assert pipe.tokenizer.chat_template == "{{ messages[0]['content'] }}!"


def test_gpt2_repos_fetch_no_llama_sidecars(env, fake_hub):
    fake_hub.add("user/gpt2-tune", FULL)
    resolve_model("user/gpt2-tune", progress=False)
    asked = fake_hub.names_requested("HEAD")
    assert not {"tokenizer_config.json", "generation_config.json", "chat_template.jinja"} & set(asked)


def test_a_llama_folder_in_the_cache_by_hand(env, tmp_path, model_files):
    # Filled by `hf download` or by hand, without refs: the newest snapshot with a config and weights.
    snapshot = cache_snapshot(tmp_path / "cache", SHARDED, model_files["many"], ref=None)
    assert find_cached_snapshot(SHARDED) == snapshot
    assert resolve_model(SHARDED, download=False).weights == snapshot / "model.safetensors.index.json"


# ------------------------------------------------------------------------------------------- names


def test_the_llama_short_names():
    spec = parse_model_name("smollm2-135m-instruct")
    assert spec.kind == "hub" and spec.repo_id == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert parse_model_name("qwen2.5-0.5b-instruct@v1").revision == "v1"
    assert parse_model_name("llama-3.2-1b").repo_id == "meta-llama/Llama-3.2-1B"


@pytest.mark.parametrize("page", ["models.md", "models-families.md"])
def test_every_short_name_is_documented(page):
    text = (DOCS / page).read_text()
    for name, repo in SHORT_NAMES.items():
        gpt2 = repo.startswith(("openai-community/", "distilbert/"))  # models.md's GPT-2 row abbreviates
        if page == "models-families.md" and gpt2:
            continue
        assert re.search(rf"`{re.escape(name)}`", text), (page, name)
        assert gpt2 or f"`{repo}`" in text, (page, repo)


def test_a_sentencepiece_tokenizer_is_refused_before_the_weights_and_kept(env, fake_hub, model_files):
    # Mistral 7B and Llama 2 ship a SentencePiece-style tokenizer.json (Metaspace, byte_fallback): the
    # model code would run them, the tokenizer is refused in one line, and nothing else is fetched.
    spm = {"model": {"type": "BPE", "vocab": {"<unk>": 0, "▁a": 1}, "merges": [], "byte_fallback": True},
           "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first"}}
    fake_hub.add("mistralai/tiny", {**model_files["one"], "tokenizer.json": json.dumps(spm).encode()})
    for attempt in range(2):
        fake_hub.requests.clear()
        with pytest.raises(TokenizerError) as info:
            resolve_model("mistralai/tiny", progress=False)
        text = str(info.value)
        assert "byte_fallback" in text and "inferno reads byte-level BPE tokenizers only" in text, text
        assert "\n" not in text and "removed" not in text
        assert not [n for n in fake_hub.names_requested() if n.endswith(".safetensors")]
        assert (find_cached_snapshot("mistralai/tiny") / "tokenizer.json").is_file()  # the Hub's own file
        assert ("tokenizer.json" in fake_hub.names_requested()) == (attempt == 0)
