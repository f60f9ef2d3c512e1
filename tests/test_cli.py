"""The `inferno` command, run as a user runs it: a subprocess, its stdout, stderr and exit code."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, offline_env
from goldens import write_model_dir
from random_gpt2 import random_state_dict, small_config

#: The summary line: the prompt's time is the time to the first new token, the new tokens' the rest.
STATS = re.compile(r"^\[prompt \d+ tokens? in \d+\.\d\ds, \d+ new tokens in \d+\.\d\ds, \d+\.\d tok/s\]$")


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    return offline_env(tmp_path)


def run(args: list[str], env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "inferno", *args]
    # stdin is /dev/null: a piped stdin would be read as more prompt text.
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=120,
                          stdin=subprocess.DEVNULL)


def test_streams_text_and_stats(model_dir, env, pipe):
    args = ["The quick brown fox", "--model-dir", str(model_dir), "--max-new-tokens", "8", "--ignore-eos"]
    proc = run(args, env)
    assert proc.returncode == 0, proc.stderr
    expected = pipe.generate("The quick brown fox", max_new_tokens=8, stop_at_eos=False).text
    assert proc.stdout == expected + "\n"
    assert STATS.match(proc.stderr.strip().splitlines()[-1]), proc.stderr


def test_json_output(model_dir, env, pipe):
    proc = run(["Hello, world!", "--model-dir", str(model_dir), "--max-new-tokens", "6", "--json",
                "--preset", "sample", "--seed", "3"], env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)  # exactly one object, nothing else on stdout
    assert set(out) == {"prompt_ids", "ids", "text", "finish_reason", "stop_reason", "backend", "new_tokens",
                        "seconds", "tokens_per_second"}
    expected = pipe.generate("Hello, world!", max_new_tokens=6, temperature=0.8, top_k=40, seed=3)
    assert out["prompt_ids"] == pipe.tokenizer.encode("Hello, world!")
    assert out["ids"] == expected.ids and out["text"] == expected.text
    assert out["finish_reason"] == expected.finish_reason
    assert out["backend"] == "numpy" and out["new_tokens"] == len(expected.ids)


def test_show_ids(model_dir, env, pipe):
    args = ["Hello", "--model-dir", str(model_dir), "--max-new-tokens", "3", "--show-ids", "--ignore-eos"]
    proc = run(args, env)
    assert proc.returncode == 0, proc.stderr
    ids = pipe.generate("Hello", max_new_tokens=3, stop_at_eos=False).ids
    assert f"prompt ids: {pipe.tokenizer.encode('Hello')}" in proc.stderr
    assert f"new ids:    {ids}" in proc.stderr


def test_prompt_named_like_a_subcommand(model_dir, env, pipe):
    proc = run(["--model-dir", str(model_dir), "--max-new-tokens", "1", "--json", "--", "backends"], env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["prompt_ids"] == pipe.tokenizer.encode("backends")


def test_backends_json(env):
    proc = run(["backends", "--json"], env)
    assert proc.returncode == 0, proc.stderr
    listed = {b["name"]: b for b in json.loads(proc.stdout)}
    for name in ("numpy", "array-api"):
        assert listed[name]["status"] == "ok"


def test_backends_table(env):
    proc = run(["backends"], env)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^numpy\b.*\bok\b", proc.stdout, re.M), proc.stdout


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--temperature", "-1"], "--temperature"),
        (["--temperature", "nan"], "--temperature"),
        (["--temperature", "hot"], "--temperature"),
        (["--top-p", "0"], "--top-p"),
        (["--top-p", "1.5"], "--top-p"),
        (["--top-k", "-1"], "--top-k"),
        (["--max-new-tokens", "-1"], "--max-new-tokens"),
        (["--seed", "x"], "--seed"),
        (["--preset", "wild"], "--preset"),
        (["--no-such-flag"], "--no-such-flag"),
        (["--backend", "numpi"], "numpy"),  # "did you mean 'numpy'?"
        (["--backend", "numpy:dtype=float16"], "dtype"),
        (["--backend", "numpy:colour=red"], "colour"),
        (["--threads", "0"], "--threads"),
        (["--threads", "2"], "--threads"),  # numpy takes no threads option
        (["--seed", "-1"], "--seed"),
        (["--backend", "numpy:dtype"], "key=value"),
        (["--backend", ""], "no name"),
        (["--repetition-penalty", "0"], "--repetition-penalty: must be > 0"),
        (["--presence-penalty", "2.5"], "--presence-penalty: must be >= -2 and <= 2"),
        (["--frequency-penalty", "x"], "--frequency-penalty"),
        (["--logit-bias", "50256"], ("--logit-bias", "ID=BIAS")),
        (["--logit-bias", "50256=-101"], "--logit-bias: must be >= -100"),
        (["--logit-bias", "60000=1"], ("logit_bias", "60000")),  # past the vocabulary: known once loaded
        (["--logprobs", "3"], ("--logprobs", "--json")),
        (["--logprobs", "21", "--json"], "--logprobs: must be an integer in [0, 20]"),
        (["--stop", ""], "--stop: must hold non-empty strings"),
        (["--stop", "a"] * 17, "--stop: takes at most 16"),
    ],
)
def test_bad_flags(model_dir, env, flags, needles):
    needles = (needles,) if isinstance(needles, str) else needles
    assert_one_line_error(run(["Hi", "--model-dir", str(model_dir), *flags], env), *needles)


def assert_missing_files_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    """Missing model files: two lines, what is missing and what to run (tests/test_cli_firstrun.py)."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("inferno: error: GPT-2 model file(s) missing"), proc.stderr
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


def test_missing_weights_offline(tmp_path, env):
    # No --model-dir, no ./gpt2, an empty HF cache and no network: say what is missing and how to get it.
    proc = run(["Hi"], env, cwd=tmp_path)
    assert_missing_files_error(proc, "model.safetensors")
    assert "hf download" in proc.stderr or "copy them into gpt2" in proc.stderr


def test_missing_file_in_model_dir(model_dir, tmp_path, env):
    d = tmp_path / "m"
    d.mkdir()
    for name in ("config.json", "model.safetensors"):
        (d / name).write_bytes((model_dir / name).read_bytes())
    assert_missing_files_error(run(["Hi", "--model-dir", str(d)], env), "tokenizer.json")


def _copy_model(model_dir: Path, dest: Path) -> Path:
    dest.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (dest / name).write_bytes((model_dir / name).read_bytes())
    return dest


def test_truncated_weights(model_dir, tmp_path, env):
    d = _copy_model(model_dir, tmp_path / "m")
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert_one_line_error(run(["Hi", "--model-dir", str(d)], env), "model.safetensors")


def test_bad_config(model_dir, tmp_path, env):
    d = _copy_model(model_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["n_layer"] = True
    (d / "config.json").write_text(json.dumps(cfg))
    assert_one_line_error(run(["Hi", "--model-dir", str(d)], env), "config.json", "n_layer")


def test_wrong_shape_names_the_tensor(model_dir, tmp_path, env):
    d = _copy_model(model_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["n_embd"], cfg["n_head"] = 64, 4  # the file holds 32-wide tensors
    (d / "config.json").write_text(json.dumps(cfg))
    assert_one_line_error(run(["Hi", "--model-dir", str(d)], env), "model.safetensors", "wte.weight")


def test_bad_tokenizer(model_dir, tmp_path, env):
    d = _copy_model(model_dir, tmp_path / "m")
    (d / "tokenizer.json").write_text("{not json")
    assert_one_line_error(run(["Hi", "--model-dir", str(d)], env), "tokenizer.json")


def test_prompt_too_long(model_dir, env):
    proc = run(["word" + " word" * 199, "--model-dir", str(model_dir)], env)  # 200 tokens; n_positions is 128
    assert_one_line_error(proc, "200", "128")


def test_ctrl_c_stops_cleanly(tmp_path, env):
    # A context of 1024 so that generation is still running when the signal arrives.
    config = small_config(vocab_size=50257, n_positions=1024, n_embd=64, n_layer=4, n_head=4)
    model_dir = write_model_dir(tmp_path / "m", config, random_state_dict(config, seed=5))
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferno", "Hi", "--model-dir", str(model_dir), "--max-new-tokens", "1000",
         "--ignore-eos"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        proc.stdout.read(1)  # generation has started
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err


def test_stdout_that_cannot_encode_the_text(model_dir, env, pipe):
    # A terminal or pipe in ASCII (or cp1252) must not kill the stream: unencodable characters become '?'.
    kwargs = dict(max_new_tokens=24, temperature=1.0, stop_at_eos=False)
    seed = next(s for s in range(50) if not pipe.generate("Hi", seed=s, **kwargs).text.isascii())
    text = pipe.generate("Hi", seed=seed, **kwargs).text
    args = ["Hi", "--model-dir", str(model_dir), "--max-new-tokens", "24", "--temperature", "1",
            "--seed", str(seed), "--ignore-eos"]
    proc = subprocess.run([sys.executable, "-m", "inferno", *args], capture_output=True,
                          env=dict(env, PYTHONIOENCODING="ascii"), timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (text + "\n").encode("ascii", "replace")
    proc = subprocess.run([sys.executable, "-m", "inferno", *args, "--json"], capture_output=True,
                          env=dict(env, PYTHONIOENCODING="ascii"), timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["text"] == text


def test_top_k_without_temperature_says_it_is_greedy(model_dir, env):
    proc = run(["Hi", "--model-dir", str(model_dir), "--max-new-tokens", "1", "--top-k", "40"], env)
    assert proc.returncode == 0 and "--temperature" in proc.stderr


def test_model_dir_that_is_a_file(tmp_path, env):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"not a folder")
    assert_one_line_error(run(["Hi", "--model-dir", str(path)], env), str(path), "is a file")


def test_stop_and_penalty_flags(model_dir, env, pipe):
    kwargs = dict(max_new_tokens=16, temperature=1.0, seed=4, stop_at_eos=False, repetition_penalty=1.2,
                  presence_penalty=0.5, frequency_penalty=-0.5, logit_bias={11: -100, 13: 2.5})
    plain = pipe.generate("Hi", **kwargs)
    stop = plain.text[5:8]
    expected = pipe.generate("Hi", stop=[stop, "\n\n"], **kwargs)
    assert expected.finish_reason == "stop" and expected.text == plain.text[:5]
    args = ["Hi", "--model-dir", str(model_dir), "--max-new-tokens", "16", "--temperature", "1",
            "--seed", "4", "--ignore-eos", "--stop", stop, "--stop", "\\n\\n", "--repetition-penalty", "1.2",
            "--presence-penalty", "0.5", "--frequency-penalty", "-0.5", "--logit-bias", "11=-100",
            "--logit-bias", "13=2.5"]
    proc = run(args, env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == expected.text + "\n"
    out = json.loads(run([*args, "--json"], env).stdout)
    assert out["ids"] == expected.ids and out["finish_reason"] == expected.finish_reason
    assert out["stop_reason"] == expected.stop_reason


def test_json_logprobs(model_dir, env, pipe):
    proc = run(["Hello", "--model-dir", str(model_dir), "--max-new-tokens", "4", "--ignore-eos", "--json",
                "--logprobs", "2"], env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    expected = pipe.generate("Hello", max_new_tokens=4, stop_at_eos=False, logprobs=2)
    assert [e["id"] for e in out["logprobs"]] == out["ids"] == expected.ids
    for entry, lp in zip(out["logprobs"], expected.logprobs, strict=True):
        text = pipe.tokenizer.decode
        assert entry["logprob"] == pytest.approx(lp.logprob) and entry["text"] == text([lp.id])
        assert [(t["id"], t["text"]) for t in entry["top"]] == [(i, text([i])) for i, _ in lp.top]


def test_score_command(model_dir, env, pipe, tmp_path):
    text = "The quick brown fox jumps over the lazy dog. " * 4
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8")
    expected = pipe.score(text, stride=20)
    proc = run(["score", str(path), "--model-dir", str(model_dir), "--stride", "20", "--json"], env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out) == {"ids", "logprobs", "total_logprob", "perplexity", "stride"}
    assert out["ids"] == expected.ids and out["stride"] == 20 and out["logprobs"][0] is None
    assert out["perplexity"] == pytest.approx(expected.perplexity, rel=1e-12)
    # Plain output: the perplexity alone on stdout; from stdin when no FILE is given.
    proc = subprocess.run([sys.executable, "-m", "inferno", "score", "--model-dir", str(model_dir)],
                          input=text, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout) == pytest.approx(pipe.score(text).perplexity, rel=1e-5)
    assert "perplexity over" in proc.stderr


@pytest.mark.parametrize(
    ("content", "flags", "needles"),
    [
        (b"\xff\xfe not utf-8", [], ("text.txt", "not UTF-8", "offset 0")),
        (b"Hi", [], ("at least 2 tokens",)),
        (b"Hello there", ["--stride", "0"], ("--stride",)),
        (b"Hello there", ["--stride", "128"], ("stride", "[1, 127]")),
    ],
)
def test_score_errors(model_dir, env, tmp_path, content, flags, needles):
    path = tmp_path / "text.txt"
    path.write_bytes(content)
    assert_one_line_error(run(["score", str(path), "--model-dir", str(model_dir), *flags], env), *needles)
    assert path.read_bytes() == content  # never touched


def test_score_missing_file(model_dir, env, tmp_path):
    assert_one_line_error(run(["score", str(tmp_path / "nope.txt"), "--model-dir", str(model_dir)], env),
                          "nope.txt")
