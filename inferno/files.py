"""Reading the small files a model comes with, safely: regular files only (a FIFO or a device cannot hang
the process), with a size limit, and JSON whose every failure is one line naming the file."""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from typing import IO, Any

__all__ = ["NotARegularFileError", "FileTooLargeError", "file_kind", "open_regular_file", "read_regular_file",
           "parse_json", "find_surrogate"]


class NotARegularFileError(OSError):
    """A model file that is not a regular file (a FIFO, a device, a socket), after following links:
    opening or reading it could block forever or never end."""


class FileTooLargeError(OSError):
    """A file bigger than the size limit for what it should be."""


def file_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


def _not_regular(path: str | os.PathLike[str], mode: int) -> NotARegularFileError:
    where = os.fspath(path)
    real = os.path.realpath(where)
    via = f" ({real}, through a symlink)" if os.path.islink(where) or real != os.path.abspath(where) else ""
    return NotARegularFileError(errno.EINVAL, f"not a regular file: it is {file_kind(mode)}{via}", where)


def open_regular_file(path: str | os.PathLike[str], buffering: int = -1) -> IO[bytes]:
    """Open `path` for binary reading if it is a regular file once links are resolved.

    A FIFO, device or socket raises `NotARegularFileError` (an OSError) saying what it is, without
    blocking: the file is opened non-blocking and checked with fstat before anything is read, so a FIFO
    with no writer, or a link to /dev/zero, cannot hang the process. A directory raises
    IsADirectoryError; a missing file FileNotFoundError, as `open` does.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket (or a FIFO opened for writing): say what it is
            try:
                mode = os.stat(path).st_mode
            except OSError:
                raise exc from None
            raise _not_regular(path, mode) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory", os.fspath(path))
        if not stat.S_ISREG(mode):
            raise _not_regular(path, mode)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=buffering)
    except BaseException:
        os.close(fd)
        raise


def read_regular_file(path: str | os.PathLike[str], limit: int, what: str) -> bytes:
    """The bytes of a regular file (see `open_regular_file`) of at most `limit` bytes, else
    `FileTooLargeError` naming `what` the file should be. Never reads more than `limit + 1` bytes."""
    with open_regular_file(path) as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(limit + 1) if size <= limit else b""
        if size > limit or len(data) > limit:
            size = max(size, len(data))
            raise FileTooLargeError(
                errno.EFBIG, f"is {size} bytes, more than the {limit}-byte limit for {what}", os.fspath(path)
            )
    return data



def parse_json(text: str | bytes, source: str, error: Any) -> Any:
    """json.loads, with every way it can fail (bad JSON, nesting deeper than the interpreter's recursion
    limit, an integer too long to convert) turned into ``error(source, [one line])``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        where = f"line {e.lineno}, column {e.colno}"
        raise error(source, [f"not valid JSON: {e.msg} ({where})"]) from None
    except RecursionError:
        raise error(source, ["not usable JSON: nested too deeply"]) from None
    except ValueError as e:  # an integer literal longer than sys.get_int_max_str_digits(), bad UTF-8
        reason = str(e).split(";")[0].split(":")[0]
        raise error(source, [f"not usable JSON: {reason}"]) from None


_SURROGATE = re.compile(r"[\ud800-\udfff]")


def find_surrogate(value: Any, where: str = "") -> tuple[str, bool] | None:
    """Where parsed JSON `value` first holds a lone UTF-16 surrogate, which is not Unicode text (json.loads
    lets ``"\\ud800"`` through; the tokenizer would make it U+FFFD without a word): (the field, as
    ``prompt``, ``stop[1]`` or ``logit_bias``, "" for `value` itself; whether it is one of that object's
    keys), else None. The server's bodies and the jobs' lines refuse such text with it."""
    if isinstance(value, str):
        return (where, False) if _SURROGATE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            if _SURROGATE.search(key):
                return where, True
            found = find_surrogate(item, f"{where}.{key}" if where else key)
            if found:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = find_surrogate(item, f"{where}[{i}]")
            if found:
                return found
    return None
