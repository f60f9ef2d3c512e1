"""``inferno inspect``: the terminal view and --json against `Pipeline.inspect` on the same model (in this
process through `main`), and bad flags (exit 2, one line)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_helpers import assert_one_line_error, offline_env, run_inferno

from inferno.cli import main

TEXT = "The quick brown fox jumps"


def test_json_is_the_pipelines_result(model_dir, pipe, capsys):
    assert main(["inspect", TEXT, "-m", str(model_dir), "--json", "--top", "3", "--layer", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    want = pipe.inspect(TEXT, layers=[1], positions=[len(out["ids"]) - 1], top=3)
    assert out["ids"] == want.ids and out["tokens"] == want.tokens and out["position"] == len(want.ids) - 1
    assert out["layers"] == [1] and out["heads"] == list(range(pipe.config.n_head))
    rounded = np.round(want.attention.astype(np.float64), 4)
    np.testing.assert_array_equal(np.asarray(out["attention"]), rounded)
    assert len(out["logit_lens"]) == pipe.config.n_layer + 1
    for got, pairs in zip(out["logit_lens"], want.logit_lens, strict=True):
        assert [(e["id"], e["probability"]) for e in got] == pairs[0]
        assert [e["token"] for e in got] == [pipe.tokenizer.decode([i]) for i, _ in pairs[0]]


def test_the_terminal_view(model_dir, pipe, capsys):
    assert main(["inspect", TEXT, "-m", str(model_dir), "--head", "2", "--position", "1"]) == 0
    out = capsys.readouterr().out
    want = pipe.inspect(TEXT, heads=[2], positions=[1], top=5)
    lines = out.splitlines()
    assert lines[0] == f"{len(want.ids)} tokens; position 1 is ' quick'"
    heads = [line for line in lines if line.startswith("  layer") and " head " in line]
    assert len(heads) == pipe.config.n_layer  # one head of every block
    for layer, line in enumerate(heads):
        row = want.attention[layer, 0, 1, :2]
        best = int(np.argmax(row))
        assert line.startswith(f"  layer {layer:>2} head  2  {best}:{want.tokens[best]!r} {row[best]:.3f}")
    lens = [line for line in lines if line.startswith("  layer") and " head " not in line]
    assert len(lens) == pipe.config.n_layer + 1
    assert "embedding" in lens[0] and "output" in lens[-1]
    top_id, top_p = want.logit_lens[-1][0][0]
    assert f"{pipe.tokenizer.decode([top_id])!r} {top_p:.3f}" in lens[-1]


@pytest.mark.parametrize(("flags", "needles"), [
    (["--layer", "2"], ("--layer", "2 is not one of the model's layers")),
    (["--head", "4"], ("--head", "4 is not one of the model's heads")),
    (["--position", "9"], ("--position 9", "the text has 5 tokens")),
    (["--top", "0"], ("--top", "expected an integer >= 1")),
    (["--layer", "-1"], ("--layer", "expected an integer >= 0")),
])
def test_bad_flags(model_dir, tmp_path, flags, needles):
    proc = run_inferno(["inspect", TEXT, "-m", str(model_dir), *flags], offline_env(tmp_path))
    assert_one_line_error(proc, *needles)


def test_a_text_longer_than_the_context(model_dir, tmp_path):
    proc = run_inferno(["inspect", " a" * 200, "-m", str(model_dir)], offline_env(tmp_path))
    assert_one_line_error(proc, "200 tokens long but the model's context holds 128")
