"""A newcomer's first run and everyday use of `inferno` (issue #16): the fetch suggestion when model files
are missing, a bare name that is also a folder here (issue #39), the prompt from stdin or -f, short flags,
the summary line, hints for unquoted prompts and '--', `inferno serve`, the README's snippets, and random
weights whose sampling differs from greedy.

CLI tests run the real entry point in a subprocess, with stdin redirected explicitly (a piped stdin is
read as prompt text).
"""

from __future__ import annotations

import http.server
import json
import re
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import offline_env, run_inferno
from fake_hub import cache_snapshot
from goldens import TOKENIZER_JSON, golden_model, write_model_dir

import inferno
from inferno.models.resolve import RANDOM_HINT
from inferno.testing import random_state_dict, small_config, spread_state_dict

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    return offline_env(tmp_path)


def run(args: list[str], env: dict[str, str], *, stdin: bytes | None = None, cwd: Path | None = None,
        command: list[str] | None = None) -> subprocess.CompletedProcess:
    if stdin is None and command is None:  # in this process (see run_inferno)
        return run_inferno(args, env, cwd=cwd)
    command = command or [sys.executable, "-m", "inferno"]
    kwargs = {"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}
    proc = subprocess.run([*command, *args], capture_output=True, env=env, cwd=cwd, timeout=120, **kwargs)
    proc.stdout, proc.stderr = proc.stdout.decode(), proc.stderr.decode()
    return proc


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def prompt_ids(proc: subprocess.CompletedProcess) -> list[int]:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["prompt_ids"]


def path_with_hf(tmp_path: Path) -> str:
    """A PATH holding an executable named hf (what decides whether `hf download` is suggested)."""
    bin_dir = tmp_path / "bin-with-hf"
    bin_dir.mkdir()
    hf = bin_dir / "hf"
    hf.write_text("#!/bin/sh\nexit 1\n")
    hf.chmod(0o755)
    return str(bin_dir)


def path_without_hf(tmp_path: Path) -> str:
    bin_dir = tmp_path / "bin-without-hf"
    bin_dir.mkdir()
    return str(bin_dir)


def missing_files_lines(proc: subprocess.CompletedProcess) -> list[str]:
    """Missing model files: exit 2, two lines (what is missing; what to run)."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2, proc.stderr
    assert lines[0].startswith("inferno: error: model file(s) ") and " missing: " in lines[0], lines
    return lines


# ----------------------------------------------------------------- 1. the fetch command hf really runs


def hf_download_calls(argv: list[str], monkeypatch) -> tuple[list[tuple[str, dict]], list[str]]:
    """Run `hf <argv>` through huggingface_hub's own CLI in-process, with its download functions replaced
    by recorders: (the calls it would make, the warnings it gives)."""
    pytest.importorskip("huggingface_hub")
    download = pytest.importorskip("huggingface_hub.cli.download")
    from huggingface_hub.cli.hf import app

    calls: list[tuple[str, dict]] = []
    monkeypatch.setattr(download, "snapshot_download", lambda **kw: calls.append(("snapshot", kw)) or "/x")
    monkeypatch.setattr(download, "hf_hub_download", lambda **kw: calls.append(("file", kw)) or "/x")
    assert argv[0] == "hf"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        app(args=argv[1:], standalone_mode=False)
    return calls, [str(w.message) for w in caught]


def fetched(calls: list[tuple[str, dict]], repo: str = "openai-community/gpt2") -> tuple[list[str], str]:
    assert len(calls) == 1, calls
    kind, kw = calls[0]
    assert kw["repo_id"] == repo and kw.get("repo_type") in (None, "model")
    names = [kw["filename"]] if kind == "file" else list(kw["allow_patterns"])
    return names, kw["local_dir"]


def test_the_old_include_form_fetches_nothing_it_names(monkeypatch):
    # The check below is able to tell: hf ignores --include once file names are given.
    calls, caught = hf_download_calls(
        ["hf", "download", "openai-community/gpt2", "--include", "config.json", "model.safetensors",
         "--local-dir", "x"], monkeypatch)
    assert any("Ignoring" in w and "--include" in w for w in caught), caught
    assert fetched(calls)[0] == ["model.safetensors"]  # config.json went to --include and was dropped



def test_a_failed_download_names_the_hf_command_that_fetches_the_model(tmp_path, env, monkeypatch):
    """A Hub name that cannot be downloaded: the second line is an `hf download` that fetches what is
    missing into the shared cache (no --local-dir), checked against hf's own parser."""
    env = dict(env, PATH=path_with_hf(tmp_path), HF_ENDPOINT="http://127.0.0.1:9", no_proxy="*", NO_PROXY="*")
    del env["INFERNO_OFFLINE"]
    proc = run(["-m", "user/x", "Hi"], env, cwd=tmp_path)
    lines = missing_files_lines(proc)
    assert lines[1].startswith("fetch it with: hf download user/x "), lines
    argv = shlex.split(lines[1].removeprefix("fetch it with: ").split(";")[0])
    calls, caught = hf_download_calls(argv, monkeypatch)
    assert caught == []
    assert fetched(calls, "user/x") == (["config.json"], None)  # config first: a non-GPT-2 repo stops there
    assert list(tmp_path.iterdir()) == [tmp_path / "hf"] or not any(tmp_path.glob("user*"))


# ------------------------------------------------------- 2. without hf on PATH, and offline



def test_without_hf_offline_the_message_says_what_to_do(tmp_path, env):
    proc = run(["-m", "user/x", "Hi"], dict(env, PATH=path_without_hf(tmp_path)), cwd=tmp_path)
    lines = missing_files_lines(proc)
    assert lines[1].startswith("unset INFERNO_OFFLINE to download it, or try -m random"), lines
    assert "hf " not in proc.stderr and "pip install" not in proc.stderr



def test_without_hf_on_path_the_fetch_command_runs_hf_through_this_python(tmp_path, env, monkeypatch):
    # huggingface_hub is a dependency, so its CLI is there even when its `hf` script is not on PATH (a
    # virtual environment not activated): the command runs it as a module of this Python.
    env = dict(env, PATH=path_without_hf(tmp_path), HF_ENDPOINT="http://127.0.0.1:9", no_proxy="*",
               NO_PROXY="*")
    del env["INFERNO_OFFLINE"]
    lines = missing_files_lines(run(["-m", "user/x", "Hi"], env, cwd=tmp_path))
    assert "download failed" in lines[0] and "127.0.0.1:9" in lines[0]
    assert lines[1].startswith("fetch it with: ") and lines[1].endswith("; or try " + RANDOM_HINT), lines
    argv = shlex.split(lines[1].removeprefix("fetch it with: ").split(";")[0])
    assert argv[:3] == [sys.executable, "-m", "huggingface_hub.cli.hf"]
    calls, caught = hf_download_calls(["hf", *argv[3:]], monkeypatch)
    assert caught == [] and fetched(calls, "user/x") == (["config.json"], None)
    assert not any(tmp_path.glob("user*"))


# --------------------------------------------- a bare name that is also a folder here (#39, the first hour)


def test_a_short_name_that_is_also_a_folder_here_says_which_one_was_used(tmp_path, env):
    # `hf download openai-community/gpt2 --local-dir gpt2` leaves a ./gpt2 folder; `-m gpt2` is still the
    # Hub model (here a small stand-in in the cache), and one line says so and how to pick the folder.
    cache_snapshot(tmp_path / "hf" / "hub")
    work = tmp_path / "work"
    config, sd, _ = golden_model("greedy")
    write_model_dir(work / "gpt2", config, sd)  # the real GPT-2 tokenizer: "Hi" is one token
    hub = run(["-m", "gpt2", "-n", "1", "-j", "Hi"], env, cwd=work)
    assert hub.returncode == 0, hub.stderr
    assert hub.stderr.splitlines()[0] == ("inferno: note: using the Hub model openai-community/gpt2, not the "
                                          "folder ./gpt2 here (-m ./gpt2 for the folder)")
    assert len(json.loads(hub.stdout)["prompt_ids"]) == 2  # the stand-in's byte-level vocabulary
    folder = run(["-m", "./gpt2", "-n", "1", "-j", "Hi"], env, cwd=work)
    assert folder.returncode == 0 and "note:" not in folder.stderr, folder.stderr
    assert json.loads(folder.stdout)["prompt_ids"] == [17250]


def test_a_repo_id_that_is_also_a_folder_here_says_which_one_was_used(tmp_path, env):
    work = tmp_path / "work"
    config, sd, _ = golden_model("greedy")
    write_model_dir(work / "acme" / "tiny", config, sd)
    proc = run(["-m", "acme/tiny", "-n", "1", "-j", "Hi"], env, cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[0] == ("inferno: note: using the folder ./acme/tiny, not the Hub model "
                                           "of that name (-m acme/tiny@main for the Hub model)")
    other = run(["-m", "acme/tiny@main", "-n", "1", "-j", "Hi"], env, cwd=work)  # offline: not in the cache
    assert other.returncode == 2 and "of acme/tiny missing" in other.stderr and "note:" not in other.stderr


class _Files(http.server.SimpleHTTPRequestHandler):
    """Serves a model folder under /openai-community/gpt2/resolve/main/<file>, as the Hub does."""

    def translate_path(self, path: str) -> str:
        return str(Path(self.server.folder) / path.rsplit("/", 1)[-1])  # type: ignore[attr-defined]

    def log_message(self, *args: object) -> None:
        pass




# ----------------------------------------------------------------------------- 3. the prompt from stdin, -f


def test_piped_stdin_is_the_prompt(model_dir, env, pipe):
    proc = run(["-m", str(model_dir), "-n", "1", "-j"], env, stdin=b"piped prompt\n")
    assert prompt_ids(proc) == pipe.tokenizer.encode("piped prompt")  # echo's newline is dropped


def test_argument_then_stdin(model_dir, env, pipe):
    proc = run(["Summary:", "-m", str(model_dir), "-n", "1", "-j"], env, stdin=b"piped text\n\n")
    assert prompt_ids(proc) == pipe.tokenizer.encode("Summary:\npiped text\n")  # one newline dropped


def test_no_stdin_text_means_unconditional(model_dir, env, pipe):
    assert prompt_ids(run(["-m", str(model_dir), "-n", "1", "-j"], env)) == [pipe.tokenizer.eos_id]
    assert prompt_ids(run(["-m", str(model_dir), "-n", "1", "-j"], env, stdin=b"")) == [pipe.tokenizer.eos_id]


def test_file_flag(model_dir, env, pipe, tmp_path):
    path = tmp_path / "prompt.txt"
    path.write_bytes(b"Once upon a time\r\n")
    base = ["-m", str(model_dir), "-n", "1", "-j"]
    assert prompt_ids(run([*base, "-f", str(path)], env)) == pipe.tokenizer.encode("Once upon a time")
    assert prompt_ids(run(["Title", *base, "--file", str(path)], env, stdin=b"ignored")) == \
        pipe.tokenizer.encode("Title\nOnce upon a time")
    from_stdin = run([*base, "-f", "-"], env, stdin=b"from stdin")
    assert prompt_ids(from_stdin) == pipe.tokenizer.encode("from stdin")
    assert str(tmp_path / "nope") in one_line_error(run([*base, "-f", str(tmp_path / "nope")], env))
    assert "not UTF-8" in one_line_error(run([*base, "-f", "-"], env, stdin=b"\xff\xfe"))


def test_a_silent_stdin_pipe_is_explained(model_dir, env, pipe):
    # An open pipe nobody writes to (ssh, a CI runner) would look like a hang: inferno says why it waits.
    proc = subprocess.Popen([sys.executable, "-m", "inferno", "Hi", "-m", str(model_dir), "-n", "1", "-j"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        note = proc.stderr.readline().decode()
        assert "reading the prompt from stdin" in note and "Ctrl-D" in note
        out, _ = proc.communicate(b" there", timeout=60)
    finally:
        proc.kill()
    assert json.loads(out)["prompt_ids"] == pipe.tokenizer.encode("Hi\n there")


# ------------------------------------------------------------------------------------- 5. ergonomics


def test_short_flags_match_the_long_ones(model_dir, env):
    short = run(["Hi", "-m", str(model_dir), "-b", "numpy", "-n", "6", "-t", "0.8", "-s", "3", "-j"], env)
    long = run(["Hi", "--model-dir", str(model_dir), "--backend", "numpy", "--max-new-tokens", "6",
                "--temperature", "0.8", "--seed", "3", "--json"], env)
    assert short.returncode == long.returncode == 0, short.stderr + long.stderr
    drop = ("seconds", "tokens_per_second")
    a, b = ({k: v for k, v in json.loads(p.stdout).items() if k not in drop} for p in (short, long))
    assert a == b and a["new_tokens"] == 6


def test_score_takes_the_short_model_flags(model_dir, env, pipe):
    proc = run(["score", "-m", str(model_dir), "-b", "numpy", "--json"], env, stdin=b"Hello there")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ids"] == pipe.tokenizer.encode("Hello there")


def test_summary_line_splits_prompt_and_generation(model_dir, env, pipe):
    proc = run(["The quick brown fox", "-m", str(model_dir), "-n", "5", "--ignore-eos"], env)
    assert proc.returncode == 0, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    n = len(pipe.tokenizer.encode("The quick brown fox"))
    assert re.fullmatch(rf"\[prompt {n} tokens in \d+\.\d\ds, 5 new tokens in \d+\.\d\ds, \d+\.\d tok/s\]",
                        last), last


def test_summary_arithmetic():
    from inferno.cli.generate import _summary

    # The prompt's time is the time to the first token; tok/s is the rate of the tokens after it.
    assert _summary(8, 50, 0.04, 0.98) == "[prompt 8 tokens in 0.04s, 50 new tokens in 0.98s, 50.0 tok/s]"
    assert _summary(1, 1, 0.5, 0.0) == "[prompt 1 token in 0.50s, 1 new token]"
    assert _summary(3, 0, None, 0.0) == "[prompt 3 tokens, 0 new tokens]"


def test_version(env):
    proc = run(["--version"], env)
    assert proc.returncode == 0 and proc.stdout.strip() == f"inferno {inferno.__version__}"


def test_show_ids_with_json_is_rejected(model_dir, env):
    line = one_line_error(run(["Hi", "-m", str(model_dir), "--show-ids", "--json"], env))
    assert "--show-ids" in line and "prompt_ids" in line


def test_unquoted_prompt_gets_a_hint(model_dir, env):
    line = one_line_error(run(["Hi", "extra", "words", "-m", str(model_dir)], env))
    assert "quote it (inferno 'Hi extra words')" in line


def test_flags_after_double_dash_are_explained(model_dir, env, pipe):
    line = one_line_error(run(["-m", str(model_dir), "--", "backends", "--json"], env))
    assert "everything after '--' is the prompt" in line and "(inferno --json -- backends)" in line
    proc = run(["-m", str(model_dir), "-n", "1", "-j", "--", "-5 degrees"], env)
    assert prompt_ids(proc) == pipe.tokenizer.encode("-5 degrees")


def test_unknown_flag_is_still_named(model_dir, env):
    line = one_line_error(run(["Hi", "-m", str(model_dir), "--no-such-flag"], env))
    assert "unrecognized arguments: --no-such-flag" in line


def test_serve_help_through_the_inferno_command(env):
    pytest.importorskip("inferno.cli.serve")
    proc = run(["serve", "--help"], env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: inferno serve")


def test_serve_without_fastapi_says_how_to_install_it(env):
    # inferno.cli.serve failing to import because FastAPI is missing (sys.modules[name] = None makes an
    # import fail and find_spec return None).
    code = ("import sys; sys.modules['fastapi'] = None; sys.modules['inferno.cli.serve'] = None\n"
            "from inferno.cli import main; sys.exit(main())")
    proc = run(["serve", "--port", "0"], env, command=[sys.executable, "-c", code])
    assert one_line_error(proc) == 'inferno serve needs the serve extra: pip install "inferno-gpt2[serve]"'


# ------------------------------------------------------------------------------------- 4, 6. README


# ------------------------------------------------------------- 7. random weights that sample visibly


def _greedy_and_samples(model_dir: Path) -> tuple[list[int], list[list[int]]]:
    pipe = inferno.load(model_dir, "numpy", download=False)
    kwargs = dict(max_new_tokens=16, stop_at_eos=False)
    greedy = pipe.generate("The quick brown fox", **kwargs).ids
    samples = [pipe.generate("The quick brown fox", temperature=0.8, top_k=40, seed=s, **kwargs).ids
               for s in range(4)]
    return greedy, samples


def test_spread_weights_sample_unlike_greedy_where_the_default_ones_do_not(tmp_path):
    config = small_config(vocab_size=50257, n_positions=64, n_embd=256, n_layer=2, n_head=4)
    plain = write_model_dir(tmp_path / "plain", config, random_state_dict(config, 3))
    spread = write_model_dir(tmp_path / "spread", config, spread_state_dict(config, 3))
    greedy, samples = _greedy_and_samples(plain)
    assert sum(s == greedy for s in samples) >= 2  # the issue: sampling gives the greedy tokens
    greedy, samples = _greedy_and_samples(spread)
    assert all(s != greedy for s in samples) and len(set(greedy)) > 2


def test_preset_sample_differs_from_greedy_on_the_command_line(tmp_path, env):
    config = small_config(vocab_size=50257, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    d = write_model_dir(tmp_path / "m", config, spread_state_dict(config, 1))
    base = ["Once upon a time", "-m", str(d), "-n", "12", "--ignore-eos", "-j"]
    greedy = json.loads(run(base, env).stdout)["ids"]
    sampled = [json.loads(run([*base, "--preset", "sample", "-s", str(s)], env).stdout)["ids"]
               for s in (1, 2)]
    assert greedy not in sampled and sampled[0] != sampled[1]


@pytest.mark.heavy
def test_random_weights_spread_at_the_124m_shape():
    # What `inferno bench`, the benches and the threaded tests run on.
    from inferno.backends.registry import get_backend
    from inferno.bench import GPT2_124M, RANDOM_LOGIT_STD, random_weights
    from inferno.generate import generate_tokens
    from inferno.models.gpt2 import Gpt2
    from inferno.options import GenerationOptions

    model = Gpt2.from_weights(GPT2_124M, random_weights(GPT2_124M), get_backend("numpy"))
    ids = [464, 2068, 7586, 21831]
    logits = np.asarray(model.forward(np.asarray([ids])), dtype=np.float64)[0]
    assert abs(logits.std() - RANDOM_LOGIT_STD) < 0.3 * RANDOM_LOGIT_STD
    greedy = list(generate_tokens(model, ids, 8))
    sampled = list(generate_tokens(model, ids, 8, GenerationOptions(temperature=0.8, top_k=40, seed=0)))
    assert sampled != greedy


def test_the_golden_models_weights_are_unchanged():
    for kind in ("greedy", "logits"):
        golden_model(kind)  # regenerates the weights from their seed and checks them against the sha256
    assert TOKENIZER_JSON.is_file()
