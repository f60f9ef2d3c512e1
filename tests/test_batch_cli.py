"""`inferno batch`, run as a user runs it (a subprocess): every output line is what `Pipeline.generate` gives
for its request, per-line options included; malformed lines are reported with file:line and skipped (or,
with --strict, stop everything before OUT is touched); an existing OUT is resumed and only ever appended
to; Ctrl-C leaves only complete lines."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from backend_helpers import registered
from cli_helpers import (
    assert_line_reports,
    assert_one_line_error,
    offline_env,
    run_inferno,
    sigint_as_in_a_terminal,
)

from inferno.backends.numpy_backend import NumpyBackend
from inferno.cli.batch import run as run_batch_cli
from inferno.jobs.generate import parse_requests
from inferno.jobs.progress import Progress as _Progress

#: How the tests start the command. Until `batch` is in inferno.cli.SUBCOMMANDS it runs as a module;
#: afterwards this becomes [sys.executable, "-m", "inferno", "batch"].
BATCH = [sys.executable, "-m", "inferno", "batch"]

RESULT_KEYS = {"id", "input_hash", "prompt_ids", "ids", "text", "finish_reason", "stop_reason", "backend",
               "new_tokens", "seconds", "tokens_per_second"}
STATS = re.compile(r"^\[(\d+) requests, \d+ new tokens in \d+\.\d\d s, \d+\.\d tok/s; (\d+) skipped "
                   r"\(already in OUT\), (\d+) malformed\]$")


def run_batch(args: list[str], env: dict[str, str], *, cwd: Path | None = None,
              input: str | None = None) -> subprocess.CompletedProcess:
    return run_inferno(["batch", *args], env, cwd=cwd, input=input)


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    return offline_env(tmp_path)


def write_jsonl(path: Path, rows: list) -> Path:
    """Each row: a dict (dumped as JSON), or a str written as it is (blank or malformed lines)."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows),
                    encoding="utf-8")
    return path


def output_lines(path: Path) -> list[dict]:
    """The complete lines of OUT that are JSON (all of them are, unless a test planted others)."""
    data = path.read_bytes()
    out = []
    for raw in data.split(b"\n")[:-1]:
        try:
            out.append(json.loads(raw))
        except json.JSONDecodeError:
            pass
    return out


def stats(proc: subprocess.CompletedProcess) -> tuple[int, int, int]:
    match = STATS.match(proc.stderr.strip().splitlines()[-1])
    assert match, proc.stderr
    return tuple(int(g) for g in match.groups())


# ------------------------------------------------------------------------------------- the outputs


def test_each_line_is_what_generate_gives(model_dir, env, pipe, tmp_path):
    sampled = dict(temperature=1.0, seed=4, max_new_tokens=16, stop_at_eos=False, repetition_penalty=1.2,
                   presence_penalty=0.5, frequency_penalty=-0.5)
    plain = pipe.generate("Hi", **sampled, logit_bias={11: -100, 13: 2.5})
    stop = plain.text[5:8]
    greedy_ids = pipe.generate("The quick brown fox", max_new_tokens=8).ids
    rows = [
        ({"id": "greedy", "prompt": "The quick brown fox", "max_new_tokens": 8},
         ("The quick brown fox", dict(max_new_tokens=8, stop_at_eos=False))),
        ("", None),  # blank: skipped, but it counts as a line
        ({"prompt": "Hello, world!", "max_new_tokens": 6, "temperature": 0.8, "top_k": 40, "seed": 3},
         ("Hello, world!", dict(max_new_tokens=6, temperature=0.8, top_k=40, seed=3, stop_at_eos=False))),
        ({"id": 7, "prompt": [464, 2068, 7586], "max_new_tokens": 4, "stop_at_eos": True, "logprobs": 2},
         ([464, 2068, 7586], dict(max_new_tokens=4, logprobs=2))),
        ({"id": "stop", "prompt": "Hi", **sampled, "stop": [stop, "\n\n"],
          "logit_bias": {"11": -100, "13": 2.5}},  # JSON keys are strings
         ("Hi", dict(sampled, stop=[stop, "\n\n"], logit_bias={11: -100, 13: 2.5}))),
        ({"id": "defaults", "prompt": "Once upon a time"},  # --max-new-tokens 5, --ignore-eos
         ("Once upon a time", dict(max_new_tokens=5, stop_at_eos=False))),
        ({"id": "stop-id", "prompt": "The quick brown fox", "stop_ids": [greedy_ids[2]], "top_p": 0.5},
         ("The quick brown fox", dict(max_new_tokens=5, stop_at_eos=False, stop_ids=[greedy_ids[2]],
                                      top_p=0.5))),
        ({"id": "unconditional", "prompt": "", "max_new_tokens": 3, "temperature": 1.0, "seed": 9},
         ("", dict(max_new_tokens=3, temperature=1.0, seed=9, stop_at_eos=False))),
        ({"id": "nothing", "prompt": "x", "max_new_tokens": 0}, ("x", dict(max_new_tokens=0))),
    ]
    src = write_jsonl(tmp_path / "in.jsonl", [r for r, _ in rows])
    out = tmp_path / "out.jsonl"
    proc = run_batch([str(src), "-o", str(out), "--model-dir", str(model_dir), "--slots", "3",
                      "--prefill-chunk", "5", "--max-new-tokens", "5", "--ignore-eos"], env)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and stats(proc) == (8, 0, 0), proc.stderr

    data = out.read_bytes()
    assert data.isascii() and data.endswith(b"\n")
    got = {line["id"]: line for line in output_lines(out)}
    assert len(got) == 8 == len(data.splitlines())
    ids = {line: row.get("id", line) for line, (row, _) in enumerate(rows, 1) if isinstance(row, dict)}
    assert set(got) == set(ids.values()) and ids[3] == 3  # no id: the line number (the blank line counts)
    for line, (row, (prompt, kwargs)) in ((n, r) for n, r in enumerate(rows, 1) if r[1] is not None):
        expected = pipe.generate(prompt, **kwargs)
        line_out = got[ids[line]]
        assert set(line_out) == RESULT_KEYS | ({"logprobs"} if "logprobs" in kwargs else set())
        assert line_out["prompt_ids"] == pipe.encode(prompt)
        assert (line_out["ids"], line_out["text"]) == (expected.ids, expected.text), row
        assert (line_out["finish_reason"], line_out["stop_reason"]) == (expected.finish_reason,
                                                                        expected.stop_reason), row
        assert line_out["new_tokens"] == len(expected.ids) and line_out["backend"] == "numpy"
    assert got["stop"]["finish_reason"] == "stop" and got["stop"]["stop_reason"] == stop
    assert got["stop"]["text"] == plain.text[:5]
    assert got["stop-id"]["stop_reason"] == greedy_ids[2] and got["stop-id"]["ids"] == greedy_ids[:3]
    assert got["nothing"]["ids"] == [] and got["nothing"]["finish_reason"] == "length"
    # Logprobs carry each token's text, as `inferno --json --logprobs` gives them.
    expected = pipe.generate([464, 2068, 7586], max_new_tokens=4, logprobs=2)
    for entry, lp in zip(got[7]["logprobs"], expected.logprobs, strict=True):
        text = pipe.tokenizer.decode
        assert entry["id"] == lp.id and entry["text"] == text([lp.id])
        assert entry["logprob"] == pytest.approx(lp.logprob, abs=1e-5)
        assert [(t["id"], t["text"]) for t in entry["top"]] == [(i, text([i])) for i, _ in lp.top]


def test_stdin(model_dir, env, pipe, tmp_path):
    requests = "".join(json.dumps({"id": i, "prompt": p, "max_new_tokens": 3}) + "\n"
                       for i, p in enumerate(["Hello", "The quick brown fox"]))
    out = tmp_path / "out.jsonl"
    proc = run_batch(["-", "-o", str(out), "--model-dir", str(model_dir)], env, input=requests)
    assert proc.returncode == 0, proc.stderr
    got = {line["id"]: line["ids"] for line in output_lines(out)}
    assert got == {0: pipe.generate("Hello", max_new_tokens=3).ids,
                   1: pipe.generate("The quick brown fox", max_new_tokens=3).ids}


# ------------------------------------------------------------------------------------- bad input


MALFORMED = [
    # (line, what is written, what the report says)
    ({"id": "ok1", "prompt": "Hi", "max_new_tokens": 2}, None),
    ('{"id": "broken", "prompt": ', ("not valid JSON",)),
    ({"id": "typo", "prompt": "Hi", "temprature": 0.8},
     ("unknown key 'temprature'", "did you mean 'temperature'", "known:", "top_k", "logit_bias")),
    ({"id": "bad-top-p", "prompt": "Hi", "top_p": 0}, ("top_p", "(0, 1]")),
    ({"id": "bad-seed", "prompt": "Hi", "seed": 1.5}, ("seed", "integer")),
    ({"id": "long", "prompt": "word" + " word" * 199}, ("200", "128")),  # the context holds 128
    ({"id": "ok1", "prompt": "again"}, ("duplicate id \"ok1\"", "line 1")),
    ({"id": "number-prompt", "prompt": 42}, ("prompt must be text or a list of token ids",)),
    ({"id": "bool-id-in-prompt", "prompt": [464, True]}, ("prompt", "integers", "true")),
    ({"id": "outside", "prompt": [50257]}, ("prompt token id 50257", "vocabulary")),
    ([1, 2], ("expected a JSON object, got a list",)),
    ({"id": "bias", "prompt": "Hi", "logit_bias": {"60000": 1}}, ("logit_bias", "60000")),
    ({"id": ["x"], "prompt": "Hi"}, ("id must be a string or an integer",)),
    ({"id": "negative", "prompt": "Hi", "max_new_tokens": -1}, ("max_new_tokens", ">= 0")),
    ('{"prompt": "Hi", "prompt": "Ho"}', ("'prompt' appears twice",)),
    ({"id": "no-prompt"}, ('no "prompt"',)),
    ({"id": "eos", "prompt": "Hi", "stop_at_eos": "yes"}, ("stop_at_eos", "true or false")),
    ({"id": "stop-type", "prompt": "Hi", "stop": {"a": 1}}, ("stop must be a string or a list",)),
    ({"id": "ok2", "prompt": "Hello", "max_new_tokens": 2}, None),
]


def test_malformed_lines_are_reported_and_skipped(model_dir, env, pipe, tmp_path):
    write_jsonl(tmp_path / "in.jsonl", [row for row, _ in MALFORMED])
    proc = run_batch(["in.jsonl", "-o", "out.jsonl", "--model-dir", str(model_dir)], env, cwd=tmp_path)
    assert_line_reports(proc, "inferno batch", "in.jsonl", MALFORMED)
    bad = [row for row, needles in MALFORMED if needles]
    assert stats(proc) == (2, 0, len(bad))
    got = {line["id"]: line["ids"] for line in output_lines(tmp_path / "out.jsonl")}
    assert got == {"ok1": pipe.generate("Hi", max_new_tokens=2).ids,
                   "ok2": pipe.generate("Hello", max_new_tokens=2).ids}


def test_strict_stops_before_out_is_touched(model_dir, env, tmp_path):
    write_jsonl(tmp_path / "in.jsonl", [row for row, _ in MALFORMED])
    proc = run_batch(["in.jsonl", "-o", "out.jsonl", "--model-dir", str(model_dir), "--strict"], env,
                     cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "in.jsonl:2: not valid JSON" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("inferno batch: error: --strict")
    assert not (tmp_path / "out.jsonl").exists()
    # Lines only the model can reject (a prompt longer than the context) count as well; an existing OUT
    # keeps every byte.
    write_jsonl(tmp_path / "in2.jsonl", [{"id": "a", "prompt": "Hi"}, {"id": "b", "prompt": "word " * 200}])
    before = b'{"id": "x", "text": "earlier"}\n{"id": "a", "te'
    (tmp_path / "out.jsonl").write_bytes(before)
    proc = run_batch(["in2.jsonl", "-o", "out.jsonl", "--model-dir", str(model_dir), "--strict"], env,
                     cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "in2.jsonl:2: the prompt is 201 tokens long" in proc.stderr
    assert (tmp_path / "out.jsonl").read_bytes() == before


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["in.jsonl", "-o", "in.jsonl"], ("-o in.jsonl", "input file")),
        (["in.jsonl", "-o", "./in.jsonl"], ("input file",)),
        (["in.jsonl", "-o", "link.jsonl"], ("input file",)),  # a symbolic link to it
        (["in.jsonl", "-o", "no/such/dir/out.jsonl"], ("no/such/dir", "does not exist")),
        (["in.jsonl"], ("-o",)),
        (["in.jsonl", "-o", "out.jsonl", "--slots", "0"], ("--slots",)),
        (["in.jsonl", "-o", "out.jsonl", "--prefill-chunk", "x"], ("--prefill-chunk",)),
        (["nope.jsonl", "-o", "out.jsonl"], ("nope.jsonl",)),
        (["in.jsonl", "-o", "out.jsonl", "--backend", "numpi"], ("numpy",)),
    ],
)
def test_usage_errors(model_dir, env, tmp_path, args, needles):
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "Hi", "max_new_tokens": 1}])
    content = src.read_bytes()
    if hasattr(os, "symlink"):
        (tmp_path / "link.jsonl").symlink_to(src)
    assert_one_line_error(run_batch([*args, "--model-dir", str(model_dir)], env, cwd=tmp_path), *needles)
    assert src.read_bytes() == content
    assert not (tmp_path / "out.jsonl").exists()


# ------------------------------------------------------------------------------------------- resuming


def test_resume_skips_what_out_holds_and_only_appends(model_dir, env, pipe, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": f"r{i}", "prompt": f"Request {i}", "max_new_tokens": 3}
                                              for i in range(6)])
    out = tmp_path / "out.jsonl"
    # An earlier run wrote r1 and r3 (marked: a regenerated line would not say "earlier run"), then died
    # in the middle of the line for r4.
    before = (json.dumps({"id": "r1", "text": "earlier run"}) + "\n"
              + json.dumps({"id": "r3", "text": "earlier run"}) + "\n"
              + '{"id": "r4", "prompt_ids": [18453, 60').encode()
    out.write_bytes(before)
    proc = run_batch([str(src), "-o", str(out), "--model-dir", str(model_dir)], env)
    assert proc.returncode == 0, proc.stderr
    assert "out.jsonl:3: a partial last line" in proc.stderr
    assert stats(proc) == (4, 2, 0)
    after = out.read_bytes()
    assert after.startswith(before) and after[len(before):len(before) + 1] == b"\n"
    lines = output_lines(out)
    assert Counter(line["id"] for line in lines) == Counter(f"r{i}" for i in range(6))
    by_id = {line["id"]: line for line in lines}
    assert by_id["r1"]["text"] == by_id["r3"]["text"] == "earlier run"
    for i in (0, 2, 4, 5):
        assert by_id[f"r{i}"]["ids"] == pipe.generate(f"Request {i}", max_new_tokens=3).ids

    # Once everything is there, a rerun generates nothing and leaves every byte as it was; the old partial
    # line (now followed by a newline) is reported and still not counted.
    proc = run_batch([str(src), "-o", str(out), "--model-dir", str(model_dir)], env)
    assert proc.returncode == 0, proc.stderr
    assert stats(proc) == (0, 6, 0)
    assert "out.jsonl:3: not an output line" in proc.stderr
    assert out.read_bytes() == after


def test_out_whose_last_complete_line_lacks_its_newline(model_dir, env, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "prompt": "Hi", "max_new_tokens": 2},
                                              {"id": "b", "prompt": "Ho", "max_new_tokens": 2}])
    out = tmp_path / "out.jsonl"
    before = b'not an output line\n{"id": "a", "text": "kept"}'
    out.write_bytes(before)
    proc = run_batch([str(src), "-o", str(out), "--model-dir", str(model_dir)], env)
    assert proc.returncode == 0, proc.stderr
    assert "out.jsonl:1: not an output line" in proc.stderr and stats(proc) == (1, 1, 0)
    after = out.read_bytes()
    assert after.startswith(before + b"\n")
    assert [line["id"] for line in output_lines(out)] == ["a", "b"]


# ------------------------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_leaves_only_complete_lines(model_dir, env, tmp_path):
    n = 400  # about a minute and a half of work: far from done when the signal comes
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": f"Story {i}:"} for i in range(n)])
    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen([*BATCH, str(src), "-o", str(out), "--model-dir", str(model_dir), "--slots", "2",
                             "--max-new-tokens", "100", "--ignore-eos"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=sigint_as_in_a_terminal)
    try:
        deadline = time.monotonic() + 60
        while not (out.exists() and b"\n" in out.read_bytes()):
            assert proc.poll() is None and time.monotonic() < deadline, "no output line appeared"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    pattern = rf"^\[interrupted: (\d+) of {n} requests written to {re.escape(str(out))}\]$"
    match = re.search(pattern, err, re.M)
    assert match, err
    data = out.read_bytes()
    assert data.endswith(b"\n")
    lines = [json.loads(raw) for raw in data.splitlines()]  # every line complete JSON
    assert 1 <= len(lines) == int(match.group(1)) < n
    assert len({line["id"] for line in lines}) == len(lines)
    assert all(line["new_tokens"] == 100 for line in lines)


# --------------------------------------------------------------------------------- the parts in-process


def test_line_numbers_blank_lines_bom_and_crlf():
    data = b'\xef\xbb\xbf{"prompt": "a"}\r\n\r\n   \n{"prompt": "b", "id": "x"}\n{"prompt": "c"}'
    requests, errors = parse_requests(data, 7, True)
    assert errors == []
    assert [(r.line, r.id, r.prompt, r.max_new_tokens, r.stop_at_eos) for r in requests] == [
        (1, 1, "a", 7, True), (4, "x", "b", 7, True), (5, 5, "c", 7, True)]
    # An explicit id may collide with another line's number: the later line is the error.
    requests, errors = parse_requests(b'{"prompt": "a"}\n{"prompt": "b", "id": 1}\n', 7, True)
    assert [r.line for r in requests] == [1] and errors == [(2, 'duplicate id 1 (first on line 1)')]
    requests, errors = parse_requests(b'{"prompt": "\xff"}\n', 7, True)
    assert errors == [(1, "not UTF-8 (byte 0xff at column 13)")]


class BrokenBackend(NumpyBackend):
    name = "broken-batch-test"
    description = "fails in the LM head"

    def lm_head(self, x, wte):
        raise FloatingPointError("the LM head broke")


@pytest.fixture
def broken_backend():
    with registered(BrokenBackend) as name:
        yield name


def test_requests_the_engine_fails_are_reported_and_not_written(model_dir, tmp_path, capsys, broken_backend):
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "prompt": "Hi"}, {"id": "b", "prompt": "Ho"}])
    out = tmp_path / "out.jsonl"
    code = run_batch_cli([str(src), "-o", str(out), "--model-dir", str(model_dir),
                          "--backend", broken_backend])
    err = capsys.readouterr().err
    assert code == 1, err
    for line, rid in ((1, "a"), (2, "b")):
        # The model names the backend and the kernel that raised (inferno.models.gpt2's guard).
        assert (f'in.jsonl:{line}: id "{rid}" failed: BackendError: backend \'broken-batch-test\': lm_head '
                "raised FloatingPointError: the LM head broke") in err
    assert err.strip().splitlines()[-1].endswith("0 malformed, 2 failed (run again to retry them)]")
    assert out.read_bytes() == b""  # a later run retries them


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_without_tqdm():
    tty = _Terminal()
    progress = _Progress(2, tty, tqdm=None)
    progress.update(5)
    progress.update(7)
    progress.close()
    text = tty.getvalue()
    assert "\r\x1b[K[1/2 requests, 5 new tokens" in text and "\r\x1b[K[2/2 requests, 12 new tokens" in text
    assert text.endswith("\r\x1b[K")
    pipe_like = io.StringIO()  # not a terminal: nothing per request
    progress = _Progress(2, pipe_like, tqdm=None)
    progress.update(5)
    progress.close()
    assert pipe_like.getvalue() == ""
