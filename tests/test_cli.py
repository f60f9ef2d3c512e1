"""The `inferno` command as a user runs it: its stdout, stderr and exit code (in this process through
`main(argv)`, in a subprocess where the process itself is what a test is about)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import assert_one_line_error, offline_env, run_inferno, sigint_as_in_a_terminal
from goldens import golden_model, log_softmax, write_model_dir
from reference import hf_decode, hf_encode, reference_generate

from inferno.testing import random_state_dict, small_config

#: The summary line: the prompt's time is the time to the first new token, the new tokens' the rest.
STATS = re.compile(r"^\[prompt (\d+) tokens? in (\d+\.\d\d)s, (\d+) new tokens in (\d+\.\d\d)s, "
                   r"(\d+\.\d) tok/s\]$")


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    return offline_env(tmp_path)


def run(args: list[str], env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    # stdin is /dev/null: a piped stdin would be read as more prompt text.
    return run_inferno(args, env, cwd=cwd)


@pytest.fixture(scope="module")
def golden():
    """The transformers greedy continuations of the model_dir model, by prompt (the independent
    reference for greedy runs)."""
    return {case["prompt"]: case for case in golden_model("greedy")[2]["cases"]}


def json_run(args: list[str], env: dict[str, str]) -> dict:
    proc = run(["--json", *args], env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # exactly one object, nothing else on stdout


def test_streams_text_and_stats(model_dir, env, golden):
    case = golden["The quick brown fox"]
    args = ["The quick brown fox", "--model-dir", str(model_dir), "--max-new-tokens", "8", "--ignore-eos"]
    proc = run(args, env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == hf_decode(case["greedy_ids"][:8]) + "\n"
    stats = STATS.match(proc.stderr.strip().splitlines()[-1])
    assert stats, proc.stderr
    assert int(stats[1]) == len(case["prompt_ids"]) and int(stats[3]) == 8


def test_json_output(model_dir, env, pipe):
    out = json_run(["Hello, world!", "--model-dir", str(model_dir), "--max-new-tokens", "6", "--preset",
                    "sample", "--seed", "3", "--ignore-eos"], env)
    assert set(out) == {"prompt_ids", "ids", "text", "finish_reason", "stop_reason", "backend", "new_tokens",
                        "seconds", "tokens_per_second"}
    assert out["prompt_ids"] == hf_encode("Hello, world!")
    assert out["ids"] == reference_generate(pipe, out["prompt_ids"], 6, temperature=0.8, top_k=40, seed=3)
    assert out["text"] == hf_decode(out["ids"])
    assert (out["finish_reason"], out["stop_reason"]) == ("length", None)
    assert out["backend"] == "numpy" and out["new_tokens"] == 6


def test_json_timings_agree_with_the_summary_line(model_dir, env):
    # --json's seconds run from before the prefill to the last token, as the summary line's two times
    # together; tokens_per_second is new_tokens / seconds.
    args = ["Once upon a time", "--model-dir", str(model_dir), "--max-new-tokens", "100", "--ignore-eos"]
    start = time.perf_counter()
    out = json_run(args, env)
    wall = time.perf_counter() - start
    assert 0 < out["seconds"] < wall
    # (seconds is rounded to the microsecond, tokens_per_second to 0.001, from the unrounded seconds)
    assert out["tokens_per_second"] == pytest.approx(out["new_tokens"] / out["seconds"], rel=1e-4)
    proc = run(args, env)
    stats = STATS.match(proc.stderr.strip().splitlines()[-1])
    assert stats, proc.stderr
    _, prompt_s, n, rest_s, rate = stats.groups()
    assert int(n) == out["new_tokens"] == 100
    # tok/s is the rate after the first token: (n - 1) / the new tokens' time, shown to 0.01 s.
    rest = float(rest_s)
    fastest = (int(n) - 1) / (rest - 0.005) if rest > 0.005 else float("inf")
    assert (int(n) - 1) / (rest + 0.005) - 0.05 <= float(rate) <= fastest + 0.05


def test_show_ids(model_dir, env, golden):
    case = golden["Hello, world!"]
    args = ["Hello, world!", "--model-dir", str(model_dir), "--max-new-tokens", "3", "--show-ids",
            "--ignore-eos"]
    proc = run(args, env)
    assert proc.returncode == 0, proc.stderr
    assert f"prompt ids: {case['prompt_ids']}" in proc.stderr
    assert f"new ids:    {case['greedy_ids'][:3]}" in proc.stderr


def test_prompt_named_like_a_subcommand(model_dir, env):
    out = json_run(["--model-dir", str(model_dir), "--max-new-tokens", "1", "--", "backends"], env)
    assert out["prompt_ids"] == hf_encode("backends")


# ------------------------------------------------------------------- what the README says of the flags


def test_explicit_flags_override_the_preset(model_dir, env, pipe, golden):
    case = golden["Once upon a time"]
    base = ["Once upon a time", "--model-dir", str(model_dir), "-n", "10", "--ignore-eos", "-s", "4"]
    # --temperature 0 over --preset sample: greedy, the transformers ids.
    out = json_run([*base, "--preset", "sample", "--temperature", "0"], env)
    assert out["ids"] == case["greedy_ids"][:10]
    # --top-k 5 over the preset's 40, the preset's temperature 0.8 kept.
    out = json_run([*base, "--preset", "sample", "--top-k", "5"], env)
    assert out["ids"] == reference_generate(pipe, case["prompt_ids"], 10, temperature=0.8, top_k=5, seed=4)
    # --temperature over --preset greedy's 0.
    out = json_run([*base, "--preset", "greedy", "--temperature", "1.3"], env)
    assert out["ids"] == reference_generate(pipe, case["prompt_ids"], 10, temperature=1.3, seed=4)


def test_top_p_on_the_command_line(model_dir, env, pipe):
    ids = hf_encode("The capital of France is")
    args = ["The capital of France is", "--model-dir", str(model_dir), "-n", "12", "--ignore-eos",
            "--temperature", "1.1", "--top-p", "0.6", "--seed", "9"]
    out = json_run(args, env)
    assert out["ids"] == reference_generate(pipe, ids, 12, temperature=1.1, top_p=0.6, seed=9)
    assert out["ids"] != reference_generate(pipe, ids, 12, temperature=1.1, seed=9)


@pytest.mark.parametrize("threads", ["1", "2"])
def test_threads_with_cpu_threaded(model_dir, env, golden, threads):
    case = golden["The meaning of life is 42, they'LL say"]
    out = json_run([case["prompt"], "--model-dir", str(model_dir), "-b", "cpu-threaded", "--threads", threads,
                    "-n", "12", "--ignore-eos"], env)
    assert out["backend"] == "cpu-threaded" and out["ids"] == case["greedy_ids"][:12]


def test_threads_must_be_positive_with_cpu_threaded(model_dir, env):
    assert_one_line_error(run(["Hi", "--model-dir", str(model_dir), "-b", "cpu-threaded", "--threads", "0"],
                              env), "--threads")


def test_same_seed_same_ids_across_processes(model_dir, env, pipe):
    args = ["In 1969, astronauts", "--model-dir", str(model_dir), "-n", "16", "--ignore-eos", "-t", "1"]
    first, second = (json_run([*args, "-s", "12345"], env)["ids"] for _ in range(2))
    assert first == second
    prompt = hf_encode("In 1969, astronauts")
    assert first == reference_generate(pipe, prompt, 16, temperature=1.0, seed=12345)
    assert json_run([*args, "-s", "12346"], env)["ids"] != first


def test_backends_json(env):
    proc = run(["backends", "--json"], env)
    assert proc.returncode == 0, proc.stderr
    listed = {b["name"]: b for b in json.loads(proc.stdout)}
    for name in ("numpy", "array-api"):
        assert listed[name]["status"] == "ok"
    assert listed["numpy"]["runs_on"] == "NumPy + BLAS"


def test_backends_table(env):
    proc = run(["backends"], env)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^numpy\b.*\bok\s+NumPy \+ BLAS\s+built-in\b", proc.stdout, re.M), proc.stdout
    assert proc.stdout.splitlines()[0].split()[:4] == ["name", "status", "runs", "on"]


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
    assert len(lines) == 2 and lines[0].startswith("inferno: error: model file(s) "), proc.stderr
    assert " missing: " in lines[0], proc.stderr
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


def test_missing_weights_offline(tmp_path, env):
    # No -m, an empty HF cache and no network: say what is missing and how to go on.
    proc = run(["Hi"], env, cwd=tmp_path)
    assert_missing_files_error(proc, "model.safetensors", "openai-community/gpt2")
    assert "unset INFERNO_OFFLINE to download it, or try -m random" in proc.stderr


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
        preexec_fn=sigint_as_in_a_terminal,
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


def test_stdout_that_cannot_encode_the_text(model_dir, env, golden):
    # A terminal or pipe in ASCII (or cp1252) must not kill the stream: unencodable characters become '?'.
    case = golden["The capital of France is"]
    text = hf_decode(case["greedy_ids"][:24])
    assert not text.isascii()
    args = [case["prompt"], "--model-dir", str(model_dir), "--max-new-tokens", "24", "--ignore-eos"]
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
    penalties = dict(repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=-0.5,
                     logit_bias={11: -100, 13: 2.5})
    prompt = hf_encode("Hi")
    ids = reference_generate(pipe, prompt, 16, temperature=1.0, seed=4, **penalties)
    text = hf_decode(ids)
    stops = [text[5:8], "\n\n"]
    assert "\ufffd" not in stops[0] and text.find(stops[0]) == 5
    # The text ends right before the first stop string; the ids end with the token that completed it.
    done = next(k for k in range(1, len(ids) + 1) if any(s in hf_decode(ids[:k]) for s in stops))
    args = ["Hi", "--model-dir", str(model_dir), "--max-new-tokens", "16", "--temperature", "1",
            "--seed", "4", "--ignore-eos", "--stop", stops[0], "--stop", "\\n\\n", "--repetition-penalty",
            "1.2", "--presence-penalty", "0.5", "--frequency-penalty", "-0.5", "--logit-bias", "11=-100",
            "--logit-bias", "13=2.5"]
    proc = run(args, env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == text[:5] + "\n"
    out = json_run(args, env)
    assert out["ids"] == ids[:done] and out["text"] == text[:5]
    assert (out["finish_reason"], out["stop_reason"]) == ("stop", stops[0])


def test_json_logprobs(model_dir, env, pipe, golden):
    case = golden["Hello, world!"]
    out = json_run([case["prompt"], "--model-dir", str(model_dir), "--max-new-tokens", "4", "--ignore-eos",
                    "--logprobs", "2"], env)
    assert [e["id"] for e in out["logprobs"]] == out["ids"] == case["greedy_ids"][:4]
    for k, entry in enumerate(out["logprobs"]):
        lp = log_softmax(pipe.logits(case["prompt_ids"] + out["ids"][:k])[-1])
        top = sorted(range(len(lp)), key=lambda i: (-lp[i], i))[:2]
        assert entry["logprob"] == pytest.approx(lp[entry["id"]], abs=1e-5)
        assert entry["text"] == hf_decode([entry["id"]])
        assert [(t["id"], t["text"]) for t in entry["top"]] == [(i, hf_decode([i])) for i in top]
        assert [t["logprob"] for t in entry["top"]] == pytest.approx([lp[i] for i in top], abs=1e-5)


def test_score_command(model_dir, env, pipe, tmp_path):
    text = "The quick brown fox jumps over the lazy dog. " * 4
    ids = hf_encode(text)
    assert len(ids) < pipe.config.n_positions  # one window: every token scored with all the ones before
    lp = log_softmax(pipe.logits(ids))
    logprobs = [float(lp[i - 1, ids[i]]) for i in range(1, len(ids))]
    perplexity = float(np.exp(-sum(logprobs) / len(logprobs)))
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8")
    proc = run(["score", str(path), "--model-dir", str(model_dir), "--stride", "20", "--json"], env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out) == {"ids", "logprobs", "total_logprob", "perplexity", "stride"}
    assert out["ids"] == ids and out["stride"] == 20 and out["logprobs"][0] is None
    assert out["logprobs"][1:] == pytest.approx(logprobs, abs=1e-5)
    assert out["total_logprob"] == pytest.approx(sum(logprobs), abs=1e-4)
    assert out["perplexity"] == pytest.approx(perplexity, rel=1e-5)
    # Plain output: the perplexity alone on stdout; from stdin when no FILE is given.
    proc = subprocess.run([sys.executable, "-m", "inferno", "score", "--model-dir", str(model_dir)],
                          input=text, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout) == pytest.approx(perplexity, rel=1e-5)
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
