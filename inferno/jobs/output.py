"""A job's files: the input read whole, and OUT, only ever appended to, one whole line a result, so that
a rerun resumes where the last one stopped (the ids OUT already holds are skipped).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferno.jobs.lines import JobError

#: Reports about lines of an existing OUT that are not output lines, before they are only counted.
MAX_OUT_REPORTS = 10
#: The key of an output line that holds the fingerprint of its input line (`lines.line_digest`): a
#: resumed job compares it with the input's line of the same id, to notice an input that changed.
INPUT_HASH = "input_hash"


@dataclass
class Done:
    """What an existing OUT already holds."""

    ids: set
    notes: list[str]  # problems found, as "LINE: what" (reported, never fixed)
    needs_newline: bool  # OUT does not end with a newline: the next line must start on a new one
    hashes: dict = field(default_factory=dict)  # id -> the `INPUT_HASH` of the line that produced it


def read_done(path: Path) -> Done:
    """The ids of the complete output lines of `path` (absent: none)."""
    ids: set = set()
    hashes: dict = {}
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
            rid, why, digest = _output_id(raw)
            if rid is not None:
                ids.add(rid)
                if digest is not None:
                    hashes[rid] = digest
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
    return Done(ids, notes, needs_newline, hashes)


def _output_id(raw: bytes) -> tuple[str | int | None, str, str | None]:
    """(id, why it has none, the fingerprint of its input line) of one line of OUT. A line in the shape
    of OpenAI's Batch API output is known by its ``custom_id``."""
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None, "not JSON", None
    if not isinstance(obj, dict):
        return None, "no id", None
    key = "custom_id" if "custom_id" in obj and "response" in obj else "id"
    if key not in obj:
        return None, "no id", None
    rid = obj[key]
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        return None, f"its {key} is not a string or an integer", None
    digest = obj.get(INPUT_HASH)
    return rid, "", digest if isinstance(digest, str) else None


def _open_for_append(path: Path) -> int:
    try:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_BINARY", 0)
        return os.open(path, flags, 0o666)
    except OSError as exc:
        raise JobError(f"-o {path}: cannot open it for writing: {exc.strerror or exc}") from None


def lock_output(path: Path) -> int:
    """OUT opened for appending (created when absent) and locked for this job alone, as a descriptor for
    `Output`: the lock lasts until it is closed. Two jobs appending to one OUT would each run the rows
    the other is running; the second is a `JobError` naming the first (its pid, where the system
    says)."""
    fd = _open_for_append(path)
    try:
        import fcntl
    except ImportError:  # no advisory locks on this system (Windows)
        return fd
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _lock_holder(fd)
        os.close(fd)
        raise JobError(f"-o {path}: OUT is being written by another job{holder}; wait for it to end, or "
                       "give another -o file") from None
    except OSError:  # a file system without flock (some network mounts): the job runs unlocked
        pass
    return fd


def _lock_holder(fd: int) -> str:
    """" (pid N)" of the process holding a flock on `fd`'s file, read from /proc/locks (Linux), else ""."""
    st = os.fstat(fd)
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as f:
            for row in f:
                fields = row.split()
                if "FLOCK" in fields and device in fields:
                    pid = fields[fields.index(device) - 1]
                    if pid.isdigit() and pid != "0":
                        return f" (pid {pid})"
    except OSError:
        pass
    return ""


class Output:
    """Appends whole lines to OUT: one `os.write` per line, so a line is in the file entirely or not at all
    (a line written across several calls only if the OS returns a short write, which it does not for
    regular files). Nothing that was in OUT is ever truncated: a write that fails (a full disk) takes
    back only the part of its own line that reached the file, and is a `JobError` saying how many
    results this run kept. `fd`: OUT already opened for appending (`lock_output`), else it is opened
    here."""

    def __init__(self, path: Path, needs_newline: bool, fd: int | None = None) -> None:
        self.path = path
        self.fd = _open_for_append(path) if fd is None else fd
        self.prefix = b"\n" if needs_newline else b""
        self.lines = 0  # lines this run wrote whole

    def write(self, obj: dict[str, Any], input_hash: str | None = None) -> None:
        """`obj` as one line, with the fingerprint of its input line when given."""
        self.write_line(json.dumps(obj if input_hash is None else {**obj, INPUT_HASH: input_hash}))

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
    from inferno.files import read_regular_file

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
        from inferno.files import file_kind

        raise JobError(f"-o {name}: not a regular file: it is {file_kind(os.stat(out).st_mode)}")
    parent = out.parent
    if not parent.is_dir():
        raise JobError(f"-o {name}: the folder {parent} does not exist")
    if out.is_dir():
        raise JobError(f"-o {name}: is a folder")
    return out
