"""`inferno bench`: the table and the JSON report on a small model, the progress lines, the always
measured numpy baseline, and one-line errors (exit code 2) for every bad request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import backend_helpers
import pytest

from inferno.backends.numpy_backend import NumpyBackend
from inferno.bench import GPT2_124M, random_weights, split_specs, weights_in_layout
from inferno.cli.bench import run as run_bench_cli
from inferno.testing import random_state_dict, small_config, write_config, write_hub_safetensors

TOKENIZER = Path(__file__).resolve().parents[1] / "inferno" / "data" / "gpt2" / "tokenizer.json"
FAST = ["--prompt-tokens", "6", "--new-tokens", "3", "--repeat", "2", "--pause", "0", "--warmup", "0"]


class BrokenBackend(NumpyBackend):
    name = "broken-bench-test"
    description = "fails in the LM head"

    def lm_head(self, x, wte):
        raise FloatingPointError("the LM head broke")


@pytest.fixture
def registered():
    """A backend that fails in the LM head, in this process's registry for the test."""
    with backend_helpers.registered(BrokenBackend):
        yield


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("bench-model")
    config = small_config(vocab_size=50257, n_positions=64, n_embd=32, n_layer=2, n_head=2)
    write_config(directory / "config.json", config)
    write_hub_safetensors(directory / "model.safetensors", random_state_dict(config), config)
    (directory / "tokenizer.json").write_bytes(TOKENIZER.read_bytes())
    return directory


def bench(capsys, *args: str) -> tuple[int, str, str]:
    code = run_bench_cli(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_table_with_ratios_against_numpy(capsys, model_dir):
    spec = "cpu-threaded:threads=2"
    code, out, err = bench(capsys, "--model-dir", str(model_dir), "--backends", spec, *FAST)
    assert code == 0, err
    lines = out.splitlines()
    assert f"GPT-2 ({model_dir})" in lines[0] and "prompt 6 tokens, 3 new tokens" in lines[0]
    assert "median of 2" in lines[0]
    header = lines[2].split()
    assert header[:3] == ["backend", "prefill", "tok/s"]
    end = lines.index("", 3)
    rows = {line.split()[0]: line for line in lines[3:end]}
    assert set(rows) == {"numpy", "cpu-threaded:threads=2"}  # numpy is measured even when not named
    assert rows["numpy"].split()[-3:] == ["1.00x", "1.00x", "1.00x"]
    assert all(cell.endswith("x") for cell in rows["cpu-threaded:threads=2"].split()[-3:])
    # What ran each backend's kernels, as `inferno backends` says it.
    assert lines[end + 1 :] == ["runs on:", "  numpy: NumPy + BLAS",
                                "  cpu-threaded:threads=2: NumPy + BLAS, a thread pool"]
    # Progress goes to stderr, one line per step when it is not a terminal.
    assert "inferno bench: loading numpy" in err
    assert "inferno bench: round 2/2: cpu-threaded:threads=2 (prompt 6, 3 new tokens)" in err


def test_json_report(capsys, model_dir):
    code, out, err = bench(capsys, "--model-dir", str(model_dir), "--backends", "numpy,cpu-threaded",
                           "--json", "--quiet", *FAST)
    assert code == 0, err
    assert err == ""  # --quiet
    report = json.loads(out)
    assert report["weights"] == str(model_dir)
    assert (report["prompt_tokens"], report["new_tokens"], report["repeat"]) == (6, 3, 2)
    assert report["model"] == {"n_layer": 2, "n_head": 2, "n_kv_head": 2, "n_embd": 32, "vocab_size": 50257}
    assert (report["family"], report["model_type"]) == ("gpt2", "gpt2")
    assert report["machine"]["usable_cores"] >= 1
    rows = {r["backend"]: r for r in report["results"]}
    assert list(rows) == ["numpy", "cpu-threaded"]
    assert (rows["numpy"]["runs_on"], rows["cpu-threaded"]["runs_on"]) == ("NumPy + BLAS",
                                                                         "NumPy + BLAS, a thread pool")
    for row in rows.values():
        assert row["status"] == "ok" and row["samples"] == 2
        assert row["prefill_tokens_per_second"] > 0 and row["decode_tokens_per_second"] > 0
        assert row["total_tokens_per_second"] > 0
        # total: 3 new tokens over the prefill and 2 decode steps
        seconds = row["prefill_seconds"] + 2 * row["decode_seconds_per_token"]
        assert row["total_tokens_per_second"] == pytest.approx(3 / seconds)
    assert rows["numpy"]["vs_numpy"] == {"prefill": 1.0, "decode": 1.0, "total": 1.0}
    ratio = rows["cpu-threaded"]["prefill_tokens_per_second"] / rows["numpy"]["prefill_tokens_per_second"]
    assert rows["cpu-threaded"]["vs_numpy"]["prefill"] == pytest.approx(ratio)


def test_a_failing_backend_is_reported_and_the_others_still_run(capsys, registered, model_dir):
    code, out, err = bench(capsys, "--model-dir", str(model_dir), "--backends", "broken-bench-test", *FAST)
    assert code == 1
    # The model names the backend and the kernel that raised (inferno.models.gpt2's guard).
    assert ("broken-bench-test failed: BackendError: backend 'broken-bench-test': lm_head raised "
            "FloatingPointError: the LM head broke") in out
    assert any(line.startswith("numpy ") and line.endswith("1.00x") for line in out.splitlines())


def test_one_new_token_has_no_decode_rate(capsys, model_dir):
    code, out, err = bench(capsys, "--model-dir", str(model_dir), "--json", "--prompt-tokens", "4",
                           "--new-tokens", "1", "--repeat", "1", "--pause", "0")
    assert code == 0, err
    (row,) = [r for r in json.loads(out)["results"] if r["backend"] == "numpy"]
    assert row["decode_tokens_per_second"] is None and row["vs_numpy"]["decode"] is None


@pytest.mark.heavy
def test_random_weights_when_no_model_is_found(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./gpt2
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # and an empty Hugging Face cache
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    code, out, err = bench(capsys, "--backends", "numpy", "--json", "--prompt-tokens", "2",
                           "--new-tokens", "2", "--repeat", "1", "--pause", "0", "--warmup", "0")
    assert code == 0, err
    report = json.loads(out)
    assert report["weights"] == "random (GPT-2 124M shape)"
    assert report["model"] == {"n_layer": 12, "n_head": 12, "n_kv_head": 12, "n_embd": 768,
                               "vocab_size": 50257}
    assert "building random 124M-shape weights" in err


@pytest.mark.parametrize("args, needle", [
    (["--prompt-tokens", "0"], "argument --prompt-tokens: expected an integer >= 1, got '0'"),
    (["--new-tokens", "x"], "argument --new-tokens: expected an integer >= 1, got 'x'"),
    (["--repeat", "-1"], "argument --repeat: expected an integer >= 1, got '-1'"),
    (["--warmup", "-1"], "argument --warmup: expected an integer >= 0"),
    (["--pause", "-1"], "argument --pause: expected seconds in [0, 60]"),
    (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["extra"], "unrecognized arguments: extra"),
    (["--backends", "nump"], "unknown backend 'nump'. Did you mean 'numpy'?"),
    (["--backends", ","], "--backends names no backend"),
    (["--backends", "numpy:dtype"], "expected key=value"),
    (["--backends", "numpy:dtype=float16"], "numpy backend: dtype must be float32 or float64, got float16"),
    (["--backends", "cpu-threaded:threads=0.5"], "cpu-threaded: threads must be a positive integer"),
    (["--model-dir", "/nonexistent/model"], "/nonexistent/model"),
    (["--prompt-tokens", "1000", "--new-tokens", "100", "--model-dir", "MODEL"],
     "--prompt-tokens + --new-tokens = 1100 exceeds the model's context (64)"),
])
def test_bad_requests_are_one_line_errors(capsys, model_dir, args, needle):
    args = [str(model_dir) if a == "MODEL" else a for a in args]
    code, out, err = bench(capsys, *args, "--quiet")
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("inferno bench: error: "), err
    assert needle in lines[0]


def test_help(capsys):
    code, out, _ = bench(capsys, "--help")
    assert code == 0
    assert "--backends" in out and "--prompt-tokens" in out and "--json" in out


def test_split_specs_keeps_options_together():
    assert split_specs("numpy,cpu-threaded:threads=2,min_rows=8, array-api") == [
        "numpy", "cpu-threaded:threads=2,min_rows=8", "array-api"]
    assert split_specs("numpy:dtype=float64,,") == ["numpy:dtype=float64"]


@pytest.mark.heavy
def test_random_weights_have_the_124m_shape():
    from inferno.models.weights import expected_shapes

    weights = random_weights(GPT2_124M)
    assert {k: v.shape for k, v in weights.items()} == {
        k: tuple(v) for k, v in expected_shapes(GPT2_124M).items() if k != "lm_head.weight"}
    assert sum(v.size for v in weights.values()) == 124_439_808
    assert all(v.dtype == "float32" and v.flags.c_contiguous for v in weights.values())


def test_backends_wanting_one_layout_share_one_copy_of_the_weights():
    from inferno.backends.array_api import ArrayApiBackend
    from inferno.backends.threaded import ThreadedBackend

    config = small_config()
    weights = random_state_dict(config, 1)
    layouts: dict = {}
    with ThreadedBackend(threads=2) as threaded:
        for_numpy = weights_in_layout(weights, NumpyBackend(), layouts)
        assert weights_in_layout(weights, threaded, layouts) is for_numpy  # converted once, shared
    assert for_numpy["wte.weight"].flags.f_contiguous and for_numpy["h.0.mlp.c_fc.weight"] is weights[
        "h.0.mlp.c_fc.weight"]  # only what the layout changes is copied
    for_array_api = weights_in_layout(weights, ArrayApiBackend(), layouts)
    assert all(for_array_api[k] is weights[k] for k in weights)  # all row-major: the arrays as given
    assert len(layouts) == 2


def test_through_the_inferno_command(model_dir, tmp_path):
    env = dict(os.environ, INFERNO_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    command = [sys.executable, "-m", "inferno", "bench"]
    proc = subprocess.run([*command, "--model-dir", str(model_dir), "--json", "--backends", "numpy", *FAST],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert [r["backend"] for r in json.loads(proc.stdout)["results"]] == ["numpy"]
    bad = subprocess.run([*command, "--repeat", "0"], capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip() == "inferno bench: error: argument --repeat: expected an integer >= 1, got '0'"
