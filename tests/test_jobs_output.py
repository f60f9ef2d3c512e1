"""A job's files in this process (inferno/jobs/output.py): what an existing OUT is found to hold and how
each line that is not an output line is reported, OUT's checks (the input itself, stdin, a FIFO, a
folder, a symlink loop), the input's bounds, and `Output`'s file mode and error messages."""

from __future__ import annotations

import io
import os
import stat
import sys
from pathlib import Path

import pytest
from cli_helpers import FakeStdin

from inferno.jobs import output
from inferno.jobs.lines import JobError
from inferno.jobs.output import MAX_OUT_REPORTS, Output, check_output, read_done, read_input, same_file

posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX files (FIFOs, /dev/full, /proc)")


def _done(tmp_path: Path, data: bytes):
    path = tmp_path / "out.jsonl"
    path.write_bytes(data)
    return read_done(path)


# ------------------------------------------------------------------------------------- read_done


def test_a_missing_out_holds_nothing(tmp_path):
    done = read_done(tmp_path / "none.jsonl")
    assert (done.ids, done.notes) == (set(), [])
    assert done.needs_newline is False


def test_each_kind_of_line_that_is_not_an_output_line_is_said_and_not_counted(tmp_path):
    lines = [b'{"id": "a"}', b"", b'{"id": 2}', b"not json", b'"id"', b'["id"]', b'{"x": 1}',
             b'{"id": true}', b'{"id": 1.5}', b'{"id": null}', b"\xff"]
    done = _done(tmp_path, b"\n".join(lines) + b"\n")
    assert done.ids == {"a", 2}  # the ids after a blank line are read too
    assert done.needs_newline is False
    assert done.notes == [f"{n}: not an output line ({why}); left as it is and not counted" for n, why in (
        (4, "not JSON"), (5, "no id"), (6, "no id"), (7, "no id"),
        (8, "its id is not a string or an integer"), (9, "its id is not a string or an integer"),
        (10, "its id is not a string or an integer"), (11, "not JSON"))]


def test_a_partial_last_line_is_said_and_needs_a_newline_before_the_next(tmp_path):
    done = _done(tmp_path, b'{"id": "a"}\n{"id": "b", "te')
    assert (done.ids, done.needs_newline) == ({"a"}, True)
    assert done.notes == ["2: a partial last line (15 bytes, no newline: an interrupted write?) is left as "
                          "it is and not counted"]
    # a whole output line that only lacks its newline is counted, and still needs one
    done = _done(tmp_path, b'{"id": "a"}\n{"id": "b"}')
    assert (done.ids, done.notes, done.needs_newline) == ({"a", "b"}, [], True)


@pytest.mark.parametrize("bad", [MAX_OUT_REPORTS, MAX_OUT_REPORTS + 1, MAX_OUT_REPORTS + 3])
def test_at_most_ten_bad_lines_are_said_one_by_one_then_counted(tmp_path, bad):
    done = _done(tmp_path, b'{"id": 1}\n' + b"junk\n" * bad)
    one_by_one = [f"{n}: not an output line (not JSON); left as it is and not counted"
                  for n in range(2, 2 + MAX_OUT_REPORTS)]
    rest = bad - MAX_OUT_REPORTS
    more = [f"{bad + 1}: ... and {rest} more lines that are not output lines"] if rest else []
    assert done.notes == one_by_one + more


# ------------------------------------------------------------------------------------- check_output


def test_out_is_refused_when_it_is_not_a_file_to_append_to(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("{}\n")
    with pytest.raises(JobError) as info:
        check_output("-", str(src))
    assert str(info.value) == "-o: give a file (results are appended to it, and it makes the run resumable)"
    with pytest.raises(JobError) as info:
        check_output(str(tmp_path), str(src))
    assert str(info.value) == f"-o {tmp_path}: is a folder"
    with pytest.raises(JobError) as info:
        check_output(str(src), str(src))
    assert str(info.value) == f"-o {src}: that is the input file; give another file for the results"
    missing = tmp_path / "no" / "out.jsonl"
    with pytest.raises(JobError) as info:
        check_output(str(missing), str(src))
    assert str(info.value) == f"-o {missing}: the folder {missing.parent} does not exist"
    assert check_output(str(tmp_path / "out.jsonl"), str(src)) == tmp_path / "out.jsonl"


@posix_only
def test_out_that_is_the_input_by_another_name_or_a_fifo_is_refused(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("{}\n")
    link = tmp_path / "hard.jsonl"
    os.link(src, link)  # another name, the same file: resolve() differs, samefile does not
    assert same_file(link, src)
    with pytest.raises(JobError, match="that is the input file"):
        check_output(str(link), str(src))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(JobError) as info:
        check_output(str(fifo), str(src))  # resuming would read it, and block
    assert str(info.value) == f"-o {fifo}: not a regular file: it is a named pipe (FIFO)"


@posix_only
def test_out_that_is_stdin_is_refused(tmp_path, monkeypatch):
    out = tmp_path / "out.jsonl"
    out.write_text("")
    other = tmp_path / "other.jsonl"
    other.write_text("")
    with open(out, "rb") as stdin:  # `inferno batch - -o out.jsonl < out.jsonl`
        monkeypatch.setattr(sys, "stdin", stdin)
        with pytest.raises(JobError) as info:
            check_output(str(out), "-")
        assert str(info.value) == f"-o {out}: that is the input file; give another file for the results"
        assert check_output(str(other), "-") == other
    monkeypatch.setattr(sys, "stdin", io.StringIO())  # no file behind stdin: nothing to compare
    assert check_output(str(out), "-") == out


@posix_only
def test_a_symlink_loop_as_out_is_an_error_when_opened_not_a_traceback(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("{}\n")
    a, b = tmp_path / "a", tmp_path / "b"
    a.symlink_to(b)
    b.symlink_to(a)
    assert not same_file(a, src)
    assert check_output(str(a), str(src)) == a
    with pytest.raises(JobError) as info:
        Output(a, False)
    assert str(info.value) == f"-o {a}: cannot open it for writing: Too many levels of symbolic links"


# ------------------------------------------------------------------------------------- read_input


def test_stdin_is_read_up_to_its_bound(monkeypatch):
    monkeypatch.setattr(output, "MAX_INPUT_BYTES", 8)
    monkeypatch.setattr(sys, "stdin", FakeStdin(b"x" * 8))
    assert read_input("-", "inferno batch") == b"x" * 8  # exactly the limit: all of it
    monkeypatch.setattr(sys, "stdin", FakeStdin(None))
    with pytest.raises(JobError) as info:
        read_input("-", "inferno batch")
    assert str(info.value) == "stdin: more than the 8-byte limit for a JSONL file"


def test_a_terminal_as_stdin_says_how_to_give_the_input(monkeypatch):
    monkeypatch.setattr(sys, "stdin", FakeStdin(b"", tty=True))
    with pytest.raises(JobError) as info:
        read_input("-", "inferno batch")
    assert str(info.value) == ("give an IN.jsonl file, or pipe the requests in: "
                               "inferno batch - -o OUT < IN.jsonl")
    with pytest.raises(JobError, match="pipe the texts in: inferno score -"):
        read_input("-", "inferno score", "texts")


def test_an_input_that_is_a_folder_missing_or_too_large_is_named(tmp_path, monkeypatch):
    with pytest.raises(JobError) as info:
        read_input(str(tmp_path), "inferno batch")
    assert str(info.value) == f"{tmp_path}: is a folder, not a JSONL file"
    with pytest.raises(JobError) as info:
        read_input(str(tmp_path / "none.jsonl"), "inferno batch")
    assert str(info.value) == f"{tmp_path / 'none.jsonl'}: No such file or directory"
    big = tmp_path / "big.jsonl"
    big.write_bytes(b"{}\n" * 5)
    monkeypatch.setattr(output, "MAX_INPUT_BYTES", 8)
    with pytest.raises(JobError) as info:
        read_input(str(big), "inferno batch")
    assert str(info.value) == f"{big}: is 15 bytes, more than the 8-byte limit for a JSONL file"


# ------------------------------------------------------------------------------------- Output


@posix_only
def test_out_is_made_with_the_usual_file_mode(tmp_path):
    mask = os.umask(0o022)
    os.umask(mask)
    out = Output(tmp_path / "out.jsonl", False)
    out.close()
    assert stat.S_IMODE(os.stat(tmp_path / "out.jsonl").st_mode) == 0o666 & ~mask


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_write_that_fails_says_how_many_results_were_kept():
    out = Output(Path("/dev/full"), False)
    try:
        with pytest.raises(JobError) as info:
            out.write({"id": 1})
    finally:
        out.close()
    assert str(info.value) == ("-o /dev/full: cannot write (No space left on device); 0 results of this "
                               "run were kept, and the same command resumes after them")
