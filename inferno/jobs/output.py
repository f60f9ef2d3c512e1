"""A job's files: the input read whole, and OUT, only ever appended to, one whole line a result, so that
a rerun resumes where the last one stopped (the ids OUT already holds are skipped).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferno.jobs.lines import JobError

#: Reports about lines of an existing OUT that are not output lines, before they are only counted.
MAX_OUT_REPORTS = 10


@dataclass
class Done:
    """What an existing OUT already holds."""

    ids: set
    notes: list[str]  # problems found, as "LINE: what" (reported, never fixed)
    needs_newline: bool  # OUT does not end with a newline: the next line must start on a new one


def read_done(path: Path) -> Done:
    """The ids of the complete output lines of `path` (absent: none)."""
    ids: set = set()
    notes: list[str] = []
    bad = 0
    needs_newline = False
    if not path.exists():
        return Done(ids, notes, False)
    with open(path, "rb") as f:
        for line, raw in enumerate(f, 1):
            complete = raw.endswith(b"\n")
            if not complete:
                needs_newline = True
            if not raw.strip():
                continue
            rid, why = _output_id(raw)
            if rid is not None:
                ids.add(rid)
                continue
            if not complete:
                notes.append(f"{line}: a partial last line ({len(raw)} bytes, no newline: an interrupted "
                             "write?) is left as it is and not counted")
                continue
            bad += 1
            if bad <= MAX_OUT_REPORTS:
                notes.append(f"{line}: not an output line ({why}); left as it is and not counted")
        if bad > MAX_OUT_REPORTS:
            notes.append(f"{line}: ... and {bad - MAX_OUT_REPORTS} more lines that are not output lines")
    return Done(ids, notes, needs_newline)


def _output_id(raw: bytes) -> tuple[str | int | None, str]:
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None, "not JSON"
    if not isinstance(obj, dict) or "id" not in obj:
        return None, "no id"
    rid = obj["id"]
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        return None, "its id is not a string or an integer"
    return rid, ""


class Output:
    """Appends whole lines to OUT: one `os.write` per line, so a line is in the file entirely or not at all
    (a line written across several calls only if the OS returns a short write, which it does not for
    regular files). Nothing that was in OUT is ever truncated: a write that fails (a full disk) takes
    back only the part of its own line that reached the file, and is a `JobError` saying how many
    results this run kept."""

    def __init__(self, path: Path, needs_newline: bool) -> None:
        self.path = path
        try:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_BINARY", 0)
            self.fd = os.open(path, flags, 0o666)
        except OSError as exc:
            raise JobError(f"-o {path}: cannot open it for writing: {exc.strerror or exc}") from None
        self.prefix = b"\n" if needs_newline else b""
        self.lines = 0  # lines this run wrote whole

    def write(self, obj: dict[str, Any]) -> None:
        self.write_line(json.dumps(obj))

    def write_line(self, line: str) -> None:
        """One line already serialized by `json.dumps` (ASCII), written whole."""
        data = self.prefix + line.encode("ascii") + b"\n"
        view = memoryview(data)
        start = None
        try:
            start = os.lseek(self.fd, 0, os.SEEK_END)
            while view:
                view = view[os.write(self.fd, view):]
        except OSError as exc:
            try:
                if start is not None:
                    os.ftruncate(self.fd, start)  # no partial line: a rerun resumes after the last whole one
            except OSError:
                pass
            raise JobError(f"-o {self.path}: cannot write ({exc.strerror or exc}); {self.lines} results of "
                           "this run were kept, and the same command resumes after them") from None
        self.prefix = b""
        self.lines += 1

    def close(self) -> None:
        os.close(self.fd)


def same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop, before Python 3.13
        return False


#: The most bytes a job reads as its input: a bound on what /dev/zero or a runaway pipe can make it hold.
MAX_INPUT_BYTES = 1 << 30


def read_input(name: str, prog: str, items: str = "requests") -> bytes:
    """The bytes of IN (``-``: stdin). A folder, a special file (FIFO, device) or more than
    `MAX_INPUT_BYTES` is a `JobError` naming the file and what it is."""
    from inferno.config import read_regular_file

    if name == "-":
        if sys.stdin.isatty():
            raise JobError(f"give an IN.jsonl file, or pipe the {items} in: {prog} - -o OUT < IN.jsonl")
        data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        if len(data) > MAX_INPUT_BYTES:
            raise JobError(f"stdin: more than the {MAX_INPUT_BYTES}-byte limit for a JSONL file")
        return data
    if Path(name).is_dir():
        raise JobError(f"{name}: is a folder, not a JSONL file")
    try:
        return read_regular_file(name, MAX_INPUT_BYTES, "a JSONL file")
    except OSError as exc:
        raise JobError(f"{name}: {exc.strerror or exc}") from None


def _stdin_is(path: Path) -> bool:
    """Whether stdin is the file `path` (``< OUT``): results appended to it would be read as input."""
    try:
        return os.path.samestat(os.fstat(sys.stdin.fileno()), os.stat(path))
    except (OSError, ValueError, AttributeError):  # no such OUT yet, or no real stdin
        return False


def check_output(name: str, input_name: str) -> Path:
    if name == "-":
        raise JobError("-o: give a file (results are appended to it, and it makes the run resumable)")
    out = Path(name)
    if same_file(out, Path(input_name)) if input_name != "-" else _stdin_is(out):
        raise JobError(f"-o {name}: that is the input file; give another file for the results")
    if out.exists() and not out.is_dir() and not out.is_file():  # resuming would read it: never a device
        from inferno.config import file_kind

        raise JobError(f"-o {name}: not a regular file: it is {file_kind(os.stat(out).st_mode)}")
    parent = out.parent
    if not parent.is_dir():
        raise JobError(f"-o {name}: the folder {parent} does not exist")
    if out.is_dir():
        raise JobError(f"-o {name}: is a folder")
    return out
