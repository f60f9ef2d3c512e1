"""`inferno batch --speculate ngram` / `--draft-model NAME`: the job's greedy rows are those of the job
without speculation; a setting that cannot work is exit 2 naming its flag, before OUT is made; with
--ray it is refused (speculation runs in one process)."""

from __future__ import annotations

import json

import pytest

from inferno.cli.batch import run as batch
from inferno.testing import make_llama_model

ROWS = [{"id": f"r{i}", "prompt": p, "max_new_tokens": 12, **extra} for i, (p, extra) in enumerate([
    ("ab ab ab ab ab ab", {}),
    ("abc abc abc abc", {"logprobs": 2}),
    ("hello hello hello", {"stop": ["lo h"]}),
    ("xy xy xy", {"repetition_penalty": 1.3}),
    ("one two one two one", {"logit_bias": {"100": 3}}),
])]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("jobs-spec")
    return make_llama_model(root / "target", seed=3), make_llama_model(root / "draft", seed=4)


def _rows(path) -> dict:
    timing = {"seconds", "tokens_per_second"}
    return {r["id"]: {k: v for k, v in r.items() if k not in timing}
            for r in map(json.loads, path.read_text().splitlines())}


def _close(a: dict, b: dict) -> bool:
    lp = [(x, y) for x, y in zip(a.pop("logprobs", []), b.pop("logprobs", []), strict=True)]
    return a == b and all(x["id"] == y["id"] and abs(x["logprob"] - y["logprob"]) < 1e-4 for x, y in lp)


@pytest.mark.parametrize("flags", [["--speculate", "ngram"], ["--draft-model", "DRAFT"],
                                   ["--speculate", "ngram", "--num-speculative-tokens", "1"]])
def test_greedy_rows_are_the_plain_jobs(models, tmp_path, flags):
    target, draft = models
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    flags = [str(draft) if f == "DRAFT" else f for f in flags]
    assert batch([str(src), "-o", str(tmp_path / "plain.jsonl"), "-m", str(target), "--slots", "3"]) == 0
    assert batch([str(src), "-o", str(tmp_path / "spec.jsonl"), "-m", str(target), "--slots", "3",
                  *flags]) == 0
    plain, spec = _rows(tmp_path / "plain.jsonl"), _rows(tmp_path / "spec.jsonl")
    assert plain.keys() == spec.keys() == {r["id"] for r in ROWS}
    assert [k for k in plain if not _close(spec[k], plain[k])] == []


@pytest.mark.parametrize("flags, says", [
    (["--draft-model", "OTHER"], "--draft-model: "),
    (["--num-speculative-tokens", "17"], "--num-speculative-tokens: must be an integer in [1, 16], got 17"),
    (["--speculate", "ngram", "--ray"], "--speculate: speculative decoding runs in one process, not yet "
     "with --ray"),
])
def test_a_setting_that_cannot_work_is_exit_2_before_out_is_made(models, tmp_path, capsys, flags, says):
    other = make_llama_model(tmp_path / "other", seed=5, vocab_size=300)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    flags = [str(other) if f == "OTHER" else f for f in flags]
    out = tmp_path / "out.jsonl"
    assert batch([str(src), "-o", str(out), "-m", str(models[0]), *flags]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    assert not out.exists()
