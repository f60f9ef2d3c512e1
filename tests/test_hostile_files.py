"""Hostile and careless input to the command line and the JSONL jobs (issue 29's second probe, and the
papercuts of issue 28): special files, the input as its own output, lines no parser should die on, a
byte-order mark, and mistyped flags and subcommands. Each message is one line naming what is wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from cli_helpers import assert_one_line_error, offline_env, run_inferno


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    return offline_env(tmp_path)


def lines_of(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def requests_file(tmp_path, rows: list[str]):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(row + "\n" for row in rows))
    return path


GOOD = ['{"id": 1, "prompt": "Hi", "max_new_tokens": 2}', '{"id": 3, "prompt": "Yo", "max_new_tokens": 2}']


@pytest.mark.parametrize("command", [["batch"], ["score"]])
def test_stdin_that_is_out_is_refused_before_anything_is_written(tmp_path, env, model_dir, command):
    src = requests_file(tmp_path, GOOD if command == ["batch"] else ['{"id": 1, "text": "Hi there"}'])
    before = src.read_bytes()
    with open(src, "rb") as stdin:  # `inferno batch - -o same.jsonl < same.jsonl`: the process's own stdin
        proc = subprocess.run([sys.executable, "-m", "inferno", *command, "-", "-o", str(src), "-m",
                               str(model_dir)], stdin=stdin, capture_output=True, text=True, env=env,
                              timeout=120)
    assert_one_line_error(proc, f"-o {src}: that is the input file")
    assert src.read_bytes() == before


@pytest.mark.parametrize("out", ["/dev/full", "/dev/zero", "fifo"])
def test_a_special_file_as_out_is_refused_without_reading_it(tmp_path, env, model_dir, out):
    if out == "fifo":
        out = str(tmp_path / "fifo")
        os.mkfifo(out)
    src = requests_file(tmp_path, GOOD)
    proc = run_inferno(["batch", str(src), "-o", out, "-m", str(model_dir)], env, timeout=30)
    kind = "a named pipe (FIFO)" if out.endswith("fifo") else "a character device"
    assert_one_line_error(proc, f"-o {out}: not a regular file: it is {kind}")


@pytest.mark.parametrize("args", [["batch", "/dev/zero", "-o", "OUT"], ["score", "/dev/zero"],
                                  ["-f", "/dev/zero", "Hi"], ["score", "/dev/zero", "-o", "OUT"]])
def test_a_special_file_as_input_is_refused_not_read(tmp_path, env, model_dir, args):
    args = [str(tmp_path / "out.jsonl") if a == "OUT" else a for a in args]
    proc = run_inferno([*args, "-m", str(model_dir)], env, timeout=30)
    assert_one_line_error(proc, "/dev/zero", "not a regular file: it is a character device")
    assert not (tmp_path / "out.jsonl").exists()


def test_a_missing_prompt_file_names_the_flag(tmp_path, env, model_dir):
    proc = run_inferno(["-f", str(tmp_path / "nope.txt"), "-m", str(model_dir)], env)
    assert_one_line_error(proc, f"-f {tmp_path / 'nope.txt'}: No such file or directory")


@pytest.mark.parametrize("bad, message", [
    ('{"id": 2, "prompt": "Hi", "seed": ' + "9" * 5000 + "}", "not valid JSON: a number too long to read"),
    ('{"id": 2, "prompt": [' + "1" * 5000 + "]}", "not valid JSON: a number too long to read"),
    ("[" * 100_000 + "]" * 100_000, "not valid JSON: nested too deeply"),
])
def test_one_unreadable_line_is_that_lines_error_and_the_rest_run(tmp_path, env, model_dir, bad, message):
    src = requests_file(tmp_path, [GOOD[0], bad, GOOD[1]])
    out = tmp_path / "out.jsonl"
    proc = run_inferno(["batch", str(src), "-o", str(out), "-m", str(model_dir)], env)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[0].startswith(f"inferno batch: {src}:2: {message}"), proc.stderr
    assert sorted(line["id"] for line in lines_of(out)) == [1, 3]
    strict = run_inferno(["batch", str(src), "-o", str(tmp_path / "strict.jsonl"), "--strict", "-m",
                          str(model_dir)], env)
    assert strict.returncode == 2 and not (tmp_path / "strict.jsonl").exists()


def test_a_byte_order_mark_is_not_part_of_the_prompt(tmp_path, env, model_dir):
    plain, marked = tmp_path / "plain.txt", tmp_path / "bom.txt"
    plain.write_bytes(b"BOM prompt")
    marked.write_bytes(b"\xef\xbb\xbfBOM prompt")
    ids = [json.loads(run_inferno(["-f", str(p), "-n", "1", "-j", "-m", str(model_dir)], env).stdout)
           ["prompt_ids"] for p in (plain, marked)]
    assert ids[0] == ids[1]


def test_a_mistyped_flag_gets_the_flag_it_resembles(env, model_dir):
    proc = run_inferno(["--temprature", "1", "Hi", "-m", str(model_dir)], env)
    assert_one_line_error(proc, "--temprature", "did you mean --temperature?")


def test_a_word_like_a_subcommand_stops_before_loading_and_says_how_to_generate_from_it(env, model_dir):
    """A one-word prompt one edit from a subcommand is taken for a typo (exit 2, nothing loaded); after
    `--` or with `-p` it is a prompt, and the same prompt either way."""
    proc = run_inferno(["backend", "-m", str(model_dir), "-n", "2", "-j"], env)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "did you mean `inferno backends`?" in proc.stderr
    assert "inferno -- backend" in proc.stderr and "inferno -p backend" in proc.stderr
    quiet = run_inferno(["-m", str(model_dir), "-n", "2", "-j", "--", "backend"], env)
    flag = run_inferno(["-m", str(model_dir), "-n", "2", "-j", "-p", "backend"], env)
    assert quiet.returncode == flag.returncode == 0, quiet.stderr + flag.stderr
    assert "did you mean" not in quiet.stderr + flag.stderr
    assert json.loads(flag.stdout)["prompt_ids"] == json.loads(quiet.stdout)["prompt_ids"]
    far = run_inferno(["elephant", "-m", str(model_dir), "-n", "1"], env)
    assert far.returncode == 0 and "did you mean" not in far.stderr


def test_scoring_nothing_says_no_text_was_given(env, model_dir):
    proc = run_inferno(["score", "-m", str(model_dir)], env, input="")
    assert_one_line_error(proc, "no text given")


def test_a_logprobs_flag_out_of_range_says_the_range_only(env, model_dir):
    proc = run_inferno(["--logprobs", "21", "--json", "Hi", "-m", str(model_dir)], env)
    assert_one_line_error(proc, "--logprobs: must be an integer in [0, 20], got 21")
    assert "None" not in proc.stderr


def test_a_full_disk_keeps_whole_lines_and_says_how_many(tmp_path, env, model_dir, monkeypatch):
    """The disk fills in the middle of the third result: OUT keeps what it had and the two whole lines
    of this run, never a partial one, and the message names OUT and the count; a rerun resumes."""
    import errno

    import inferno.jobs.output as output

    src = requests_file(tmp_path, [f'{{"id": {i}, "prompt": "Hi", "max_new_tokens": 2}}' for i in range(5)])
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": "old"}\n')
    real_write, calls = os.write, []

    def full_disk(fd, data):
        calls.append(fd)
        if len(calls) == 3:  # half of the third line reaches the file, then the disk is full
            real_write(fd, bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(output.os, "write", full_disk)
    proc = run_inferno(["batch", str(src), "-o", str(out), "-m", str(model_dir), "--slots", "1"], env)
    assert_one_line_error(proc, f"-o {out}: cannot write (No space left on device); 2 results")
    lines = out.read_text().splitlines(keepends=True)
    assert all(line.endswith("\n") for line in lines) and len(lines) == 3
    assert json.loads(lines[0]) == {"id": "old"}
    monkeypatch.setattr(output.os, "write", real_write)
    again = run_inferno(["batch", str(src), "-o", str(out), "-m", str(model_dir)], env)
    assert again.returncode == 0, again.stderr
    assert sorted(json.loads(line)["id"] for line in out.read_text().splitlines()[1:]) == [0, 1, 2, 3, 4]


def test_ctrl_c_in_the_middle_of_a_write_finishes_that_line_and_counts_it(tmp_path, env, model_dir):
    """SIGINT arrives while the second result is being written: that line is finished and counted, the
    command exits 130 with its summary, and OUT holds only whole lines (a rerun resumes)."""
    import signal

    import inferno.jobs.output as output

    src = requests_file(tmp_path, [f'{{"id": {i}, "prompt": "Hi", "max_new_tokens": 2}}' for i in range(6)])
    out = tmp_path / "out.jsonl"
    real_write, calls = os.write, []

    def interrupted_write(fd, data):
        calls.append(fd)
        if len(calls) == 2:  # Ctrl-C between the two halves of the second line
            written = real_write(fd, bytes(data[: len(data) // 2]))
            os.kill(os.getpid(), signal.SIGINT)
            return written
        return real_write(fd, data)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal's process
    output.os.write = interrupted_write
    try:
        proc = run_inferno(["batch", str(src), "-o", str(out), "-m", str(model_dir), "--slots", "1"], env)
    finally:
        output.os.write = real_write
        signal.signal(signal.SIGINT, previous)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"[interrupted: 2 of 6 requests written to {out}]"
    lines = out.read_text().splitlines(keepends=True)
    assert len(lines) == 2 and all(json.loads(line)["new_tokens"] == 2 for line in lines)


def test_an_out_that_cannot_be_written_names_itself(tmp_path, env, model_dir):
    src = requests_file(tmp_path, GOOD)
    proc = run_inferno(["batch", str(src), "-o", "/proc/version", "-m", str(model_dir)], env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    # (first, the resume's note that the file's text is not an output line)
    assert proc.stderr.splitlines()[-1].startswith("inferno batch: error: -o /proc/version: cannot write")
