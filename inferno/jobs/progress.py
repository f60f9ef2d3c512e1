"""What a job shows while it runs and when it ends: a progress bar or line on stderr, the summary line,
and Ctrl-C held back while a result is being written (so that a line in OUT is also counted).
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any


class DeferInterrupts:
    """Ctrl-C as usual, except inside `critical()`: there it waits until the block ends, so that a line
    written to OUT is also counted (and no line is cut). Only in the main thread, and only when SIGINT
    has Python's default handler (not when it is ignored, as under nohup)."""

    def __init__(self) -> None:
        self.pending = False
        self.deferring = False
        self.previous: Any = None

    def __enter__(self) -> DeferInterrupts:
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self.previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            self.previous = None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.deferring:
            self.pending = True
            return
        raise KeyboardInterrupt

    def hold(self) -> None:
        """Defer every further Ctrl-C until the end of the `with` block (which drops them)."""
        self.deferring = True

    def critical(self) -> _Critical:
        return _Critical(self)


class _Critical:
    def __init__(self, owner: DeferInterrupts) -> None:
        self.owner = owner

    def __enter__(self) -> None:
        self.owner.deferring = True

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        self.owner.deferring = False
        if self.owner.pending and exc_type is None:
            self.owner.pending = False
            raise KeyboardInterrupt


class Progress:
    """Requests done so far, on stderr: a tqdm bar if tqdm is installed (tqdm hides it when stderr is
    not a terminal), else one line rewritten in place on a terminal, else nothing."""

    def __init__(self, total: int, stream: IO[str], tqdm: Any = None, *, desc: str = "inferno batch",
                 unit: str = "req",
                 items: str = "requests", tokens: str = "new tokens") -> None:
        self.total, self.stream, self.tty = total, stream, stream.isatty()
        self.items, self.token_words = items, tokens
        self.done = self.tokens = 0
        self.start = time.perf_counter()
        self.bar = None
        if tqdm is not None:
            self.bar = tqdm(total=total, desc=desc, unit=unit, file=stream, disable=None, leave=False)

    def update(self, new_tokens: int) -> None:
        self.done += 1
        self.tokens += new_tokens
        seconds = time.perf_counter() - self.start
        rate = self.tokens / seconds if seconds > 0 else 0.0
        if self.bar is not None:
            self.bar.set_postfix_str(f"{self.tokens} tok, {rate:.1f} tok/s", refresh=False)
            self.bar.update(1)
        elif self.tty:
            self.stream.write(f"\r\x1b[K[{self.done}/{self.total} {self.items}, {self.tokens} "
                              f"{self.token_words}, {rate:.1f} tok/s]")
            self.stream.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.tty and self.done:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.done = 0


def tqdm_or_none() -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


@dataclass
class JobReport:
    """What a job did."""

    todo: int = 0  # the rows this run had to do
    written: int = 0
    tokens: int = 0  # new tokens (generation) or tokens scored
    seconds: float = 0.0
    skipped: int = 0  # ids already in OUT
    malformed: int = 0
    failed: int = 0  # rows the engine or backend failed (rerun to retry them)
    repeated: int = 0  # rows of batches Ray ran again, dropped (Ray jobs only)
    interrupted: bool = False
    messages: list[str] = field(default_factory=list)  # the lines it reported (Ray jobs)

    def summary(self, items: str, tokens: str, output: str, of_todo: bool = True) -> str:
        """The final line: ``[N requests, T new tokens in S s, X tok/s; K skipped (already in OUT), E
        malformed]``, or ``[interrupted: N of M requests written to OUT]``."""
        if self.interrupted:
            count = f"{self.written} of {self.todo}" if of_todo else f"{self.written}"
            return f"[interrupted: {count} {items} written to {output}]"
        rate = self.tokens / self.seconds if self.seconds > 0 else 0.0
        tail = f", {self.failed} failed (run again to retry them)" if self.failed else ""
        if self.repeated:  # a worker died: Ray ran its batches again; their rows were written once
            tail += f", {self.repeated} repeated rows of retried batches dropped"
        return (f"[{self.written} {items}, {self.tokens} {tokens} in {self.seconds:.2f} s, {rate:.1f} tok/s; "
                f"{self.skipped} skipped (already in OUT), {self.malformed} malformed{tail}]")
