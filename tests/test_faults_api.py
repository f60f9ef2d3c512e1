"""Issue #17: tokenizer.json details (item 13), prompt types (15), closed standard streams (16)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from goldens import TOKENIZER_JSON
from test_faults_common import TIME_BOUND_S, assert_one_line_error, cli_env, copy_model, model_folder, run_cli

import inferno
from inferno.generate import PromptTypeError, check_ids
from inferno.tokenizer import Tokenizer, TokenizerError, bytes_to_unicode

# ------------------------------------------------------------------- item 13: tokenizer.json


def minimal(**model) -> dict:
    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    vocab["ab"] = 256
    return {"added_tokens": [{"id": 257, "content": "<|endoftext|>", "special": True}],
            "model": {"type": "BPE", "vocab": vocab, "merges": ["a b"], **model}}


def test_vocabulary_with_id_gaps_is_rejected_at_load(tmp_path):
    data = minimal()
    data["model"]["vocab"]["ab"] = 300  # ids 256..299 have no token: generation could sample them
    with pytest.raises(TokenizerError, match=r"no token has id 256, 258, .*\(35 more\).* without gaps"):
        Tokenizer.from_dict(data, source="t.json")
    # Through the CLI: one line, at load (it used to crash mid-generation with a traceback).
    real = json.loads(TOKENIZER_JSON.read_text())
    real["model"]["vocab"]["Ġzzqxj"] = 50300  # ids 50257..50299 have no token
    d = copy_model(model_folder(tmp_path / "good"), tmp_path / "m")
    (d / "tokenizer.json").write_text(json.dumps(real))
    proc = run_cli(["Hi", "--model-dir", str(d), "--max-new-tokens", "2"], cli_env(tmp_path))
    assert_one_line_error(proc, "tokenizer.json", "no token has id 50257, 50258")


def test_added_token_reusing_an_id_is_a_clear_error():
    data = minimal()
    data["added_tokens"][0]["content"] = "ab"  # the vocabulary's 'ab' is 256: this used to be an IndexError
    with pytest.raises(TokenizerError, match="added token 'ab' has id 257, but model.vocab gives it id 256"):
        Tokenizer.from_dict(data, source="t.json")
    data = minimal()
    data["added_tokens"].append({"id": 257, "content": "<|pad|>"})
    with pytest.raises(TokenizerError, match="added tokens '<|endoftext|>' and '<|pad|>' share id 257"):
        Tokenizer.from_dict(data, source="t.json")
    data = minimal()
    data["added_tokens"].append({"id": 258, "content": "<|endoftext|>"})
    with pytest.raises(TokenizerError, match=r"added_tokens\[1\].*repeats an added token with another id"):
        Tokenizer.from_dict(data, source="t.json")


def test_empty_merges_are_a_valid_byte_level_tokenizer():
    # "merges": [] used to be reported as "a token with a space in it".
    tok = Tokenizer.from_dict(minimal(merges=[]), source="t.json")
    ids = tok.encode("abc")
    assert ids == [tok.encode("a")[0], tok.encode("b")[0], tok.encode("c")[0]] and tok.decode(ids) == "abc"


# ------------------------------------------------------------------- item 15: prompt types


@pytest.mark.parametrize(("prompt", "needle"), [
    (b"Hello", "the prompt is bytes b'Hello': give text as a str"),
    (bytearray(b"Hello"), "the prompt is bytearray"),
    ([1.9, 2.7], r"prompt token ids must be ints, got 1.9 \(float\) at index 0"),
    (["15496"], r"got '15496' \(str\) at index 0"),
    ([True, 5], r"got True \(bool\) at index 0"),
    ([np.bool_(True)], r"\(bool"),
    ({15496: "x"}, "got dict"),
    ({15496}, "got set"),
    (None, "got NoneType None"),
    (123, "got int 123"),
    (np.array([1.0, 2.0]), "1-D array of integer token ids, got a 1-D array of float64"),
    (np.array([[1, 2]]), "got a 2-D array"),
])
def test_prompts_that_are_neither_text_nor_ids_are_rejected(pipe, prompt, needle):
    with pytest.raises(PromptTypeError, match=needle) as info:
        pipe.generate(prompt, max_new_tokens=1)
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
    with pytest.raises(PromptTypeError):
        check_ids(prompt, pipe.config)  # the engine's check


def test_real_int_prompts_are_accepted(pipe):
    expected = pipe.generate([15496, 11], max_new_tokens=2).ids
    for prompt in ([np.int64(15496), np.int32(11)], (15496, 11), np.array([15496, 11]),
                   np.array([15496, 11], dtype=np.uint16)):
        assert pipe.generate(prompt, max_new_tokens=2).ids == expected
    assert pipe.generate("Hello,", max_new_tokens=2).ids == expected


def test_backend_of_the_wrong_type(model_dir):
    with pytest.raises(TypeError, match=r"backend must be a name such as 'numpy'.*not int \(123\)"):
        inferno.load(model_dir, 123)


# ------------------------------------------------------------------- item 16: closed streams


def shell(command: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, cwd=cwd,
                          stdin=subprocess.DEVNULL, timeout=TIME_BOUND_S)


@pytest.mark.parametrize("flags", ["", "--json"])
def test_closed_stdout_is_an_error_not_a_traceback_or_a_lost_result(model_dir, tmp_path, flags):
    cmd = f"{sys.executable} -m inferno Hi --model-dir {model_dir} --max-new-tokens 2 {flags} >&-"
    assert_one_line_error(shell(cmd, cli_env(tmp_path), tmp_path), "standard output is closed")


def test_closed_stderr_keeps_status_lines_off_stdout(model_dir, tmp_path, pipe):
    cmd = f"{sys.executable} -m inferno Hi --model-dir {model_dir} --max-new-tokens 2 2>&-"
    proc = shell(cmd, cli_env(tmp_path), tmp_path)
    assert proc.returncode == 0
    assert proc.stdout == pipe.generate("Hi", max_new_tokens=2).text + "\n"


def test_full_disk_is_one_line(model_dir, tmp_path):
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    cmd = f"{sys.executable} -m inferno Hi --model-dir {model_dir} --max-new-tokens 2 --json >/dev/full"
    proc = shell(cmd, cli_env(tmp_path), tmp_path)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
