"""What the command line refuses before any work, each as one line and exit code 2: a one-word prompt
that is a mistyped subcommand (`inferno servee` used to start a gpt2 download), arguments that are not
UTF-8 text (they used to become U+FFFD), a prompt far past the context (refused before it is
tokenized), a job on an OUT another job is writing, a resumed job whose input changed. And
`inferno help`, which used to be a prompt."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from cli_helpers import assert_one_line_error, offline_env, run_inferno

from inferno.cli import SUBCOMMANDS


@pytest.fixture
def env(tmp_path):
    return offline_env(tmp_path)


# ------------------------------------------------------------------------------ typos of subcommands


@pytest.mark.parametrize(("argv", "name"), [
    (["servee"], "serve"), (["Serve"], "serve"), (["batc"], "batch"), (["-n", "3", "scroe"], "score"),
    (["inspct", "-j"], "inspect"), (["backend"], "backends"), (["hepl"], "help"), (["benchh"], "bench"),
    (["bakcend"], "backends"), (["sevre"], "serve"),
])
def test_a_word_that_is_nearly_a_subcommand_stops_with_the_hint(env, argv, name):
    """No model is loaded (none is given, and none is cached here: the error would be another)."""
    word = next(a for a in argv if not a.startswith("-") and not a.isdigit())
    assert_one_line_error(run_inferno(argv, env),
                          f"inferno: error: {word!r} is not a subcommand: did you mean `inferno {name}`? (to "
                          f"generate from that word, use `inferno -- {word}` or `inferno -p {word}`)")


@pytest.mark.parametrize("argv", [["--", "servee"], ["-p", "servee"], ["-p", "serve"], ["serve the soup"],
                                  ["Hello"], ["ser"], ["Watching"]])
def test_the_ways_to_mean_such_a_word_as_a_prompt(model_dir, env, pipe, argv):
    proc = run_inferno(["-m", str(model_dir), "-n", "1", "-j", *argv], env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["prompt_ids"] == pipe.encode(argv[-1])


def test_the_prompt_is_given_once(model_dir, env):
    assert_one_line_error(run_inferno(["-m", str(model_dir), "Hello", "-p", "there"], env),
                          "give the prompt once: as PROMPT ('Hello') or as -p, not both")


# ---------------------------------------------------------------------------------------------- help


def test_help_lists_every_subcommand(env):
    proc = run_inferno(["--help"], env)
    assert proc.returncode == 0
    said = " ".join(proc.stdout.split())  # as wrapped for any terminal width
    for name in SUBCOMMANDS:
        assert f"'inferno {name}" in said, name
    assert "'inferno help SUBCOMMAND'" in said


def test_help_is_help_not_a_prompt(env):
    proc = run_inferno(["help"], env)
    assert proc.returncode == 0 and proc.stdout == run_inferno(["--help"], env).stdout
    proc = run_inferno(["help", "batch"], env)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: inferno batch")
    assert_one_line_error(run_inferno(["help", "nope"], env), "help: no subcommand 'nope'",
                          "backends, batch, bench, chat, inspect, score, serve")


# ----------------------------------------------------------------------------- arguments that are not text


def test_arguments_that_are_not_utf8_are_refused(model_dir, env):
    """Bytes that are not UTF-8 on the command line (Python keeps them as lone surrogates) used to be
    generated from as U+FFFD; the server refuses such text, and now so does the command line."""
    proc = subprocess.run([sys.executable, "-m", "inferno", "-m", str(model_dir), b"caf\xe9 au lait"],
                          capture_output=True, env=env, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count(b"\n") == 1, proc.stderr
    assert proc.stderr == b"inferno: error: the prompt: not UTF-8 text (byte 0xe9 at offset 3)\n"


@pytest.mark.parametrize(("argv", "needle"), [
    (["a\udcff"], "the prompt: not UTF-8 text (byte 0xff at offset 1)"),
    (["Hi", "--stop", "x\udc80"], "--stop: not UTF-8 text (byte 0x80 at offset 1)"),
    (["Hi\ud800"], "the prompt holds a lone UTF-16 surrogate (U+D800), which is not Unicode text"),
    (["inspect", "b\udcfe"], "TEXT: not UTF-8 text (byte 0xfe at offset 1)"),
])
def test_text_arguments_must_be_unicode_text(model_dir, env, argv, needle):
    assert_one_line_error(run_inferno([*argv, "-m", str(model_dir)], env), needle)


# -------------------------------------------------------------------------------- far past the context


@pytest.mark.parametrize("how", ["-f", "inspect"])
def test_a_text_far_past_the_context_is_refused_before_it_is_tokenized(model_dir, env, tmp_path, how):
    """The context holds 128 tokens; 5 million characters are at least ~9700 of them, whatever they are.
    They used to be tokenized whole (a GB of memory for 25 MB), then refused."""
    text = "ab " * 1_700_000
    (tmp_path / "long.txt").write_text(text)
    argv, what = (["-f", "long.txt"], "the prompt") if how == "-f" else (["inspect", text], "TEXT")
    proc = run_inferno([*argv, "-m", str(model_dir)], env, cwd=tmp_path)
    proc.args = argv[0]  # not five million characters in a failure's report
    assert_one_line_error(proc, f"{what} is {len(text)} characters long, at least",
                          "but the model's context holds 128 (refused before tokenizing it)")


# --------------------------------------------------------------------------------- one OUT, one job


def test_a_second_job_on_the_same_out_stops(model_dir, env, tmp_path):
    (tmp_path / "in.jsonl").write_text('{"prompt": "Hi"}\n')
    out = tmp_path / "out.jsonl"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from inferno.jobs.output import lock_output
        fd = lock_output(Path({str(out)!r}))
        print("locked", flush=True)
        sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        for argv in (["batch", "in.jsonl"], ["score", "in.jsonl"]):
            if argv[0] == "score":
                (tmp_path / "in.jsonl").write_text('{"text": "Hello there"}\n')
            proc = run_inferno([*argv, "-o", "out.jsonl", "-m", str(model_dir)], env, cwd=tmp_path)
            assert_one_line_error(proc, "-o out.jsonl: OUT is being written by another job "
                                  f"(pid {holder.pid}); wait for it to end, or give another -o file")
    finally:
        holder.communicate("", timeout=30)
    assert out.read_bytes() == b""


def test_a_resumed_job_whose_input_changed_stops(model_dir, env, tmp_path):
    """A line inserted at the top of rows numbered by their line: one row would never run and another
    would run twice. The rerun stops before anything runs; OUT keeps every byte."""
    import hashlib

    rows = ['{"prompt": "Hello", "max_new_tokens": 1}', '{"prompt": "World", "max_new_tokens": 1}']
    (tmp_path / "in.jsonl").write_text("\n".join(rows) + "\n")
    first = run_inferno(["batch", "in.jsonl", "-o", "out.jsonl", "-m", str(model_dir)], env, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    out = (tmp_path / "out.jsonl").read_bytes()
    hashes = {json.loads(line)["id"]: json.loads(line)["input_hash"] for line in out.splitlines()}
    assert hashes == {i: hashlib.sha256(row.encode()).hexdigest()[:16] for i, row in enumerate(rows, 1)}
    (tmp_path / "in.jsonl").write_text("\n".join(['{"prompt": "New", "max_new_tokens": 1}', *rows]) + "\n")
    proc = run_inferno(["batch", "in.jsonl", "-o", "out.jsonl", "-m", str(model_dir)], env, cwd=tmp_path)
    assert_one_line_error(proc, "inferno batch: error: in.jsonl:1: the line of id 1 is not the one whose "
                          "result out.jsonl holds (and 1 more): the input changed since out.jsonl was "
                          "written; to start over, remove out.jsonl or give another -o file (or restore the "
                          "input)")
    assert (tmp_path / "out.jsonl").read_bytes() == out
