"""What a JSONL job shows and how it stops (inferno/jobs/progress.py), in this process: Ctrl-C held back
inside a result's write and dropped after `hold()`, the progress bar (tqdm's, or the line rewritten on a
terminal) and the summary line `inferno batch` and `inferno score -o` end with."""

from __future__ import annotations

import contextlib
import io
import signal
import sys
import threading
import time

import pytest

from inferno.jobs.progress import DeferInterrupts, JobReport, Progress, tqdm_or_none


def _ctrl_c() -> None:
    signal.raise_signal(signal.SIGINT)


@pytest.fixture
def default_sigint():
    """SIGINT with Python's default handler, as in a job started from a shell, and put back after."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@contextlib.contextmanager
def _no_stray_ctrl_c():
    """A KeyboardInterrupt the test did not expect fails the test (instead of ending pytest's session)."""
    try:
        yield
    except KeyboardInterrupt:
        pytest.fail("a Ctrl-C got through")


# ------------------------------------------------------------------------------------- DeferInterrupts


def test_ctrl_c_outside_a_critical_block_interrupts_at_once_and_the_handler_is_put_back(default_sigint):
    with _no_stray_ctrl_c():
        with DeferInterrupts() as interrupts:
            assert signal.getsignal(signal.SIGINT) == interrupts._handler
            with pytest.raises(KeyboardInterrupt):
                _ctrl_c()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert interrupts.previous is None


def test_ctrl_c_inside_a_critical_block_waits_for_its_end(default_sigint):
    with _no_stray_ctrl_c():
        written = []
        with DeferInterrupts() as interrupts:
            with pytest.raises(KeyboardInterrupt):
                with interrupts.critical():
                    _ctrl_c()
                    written.append("line")  # the write goes on: the line is written and counted
            assert written == ["line"]
            assert (interrupts.pending, interrupts.deferring) == (False, False)
            with interrupts.critical():  # the Ctrl-C was delivered once, not again at the next block
                written.append("next")
            with pytest.raises(KeyboardInterrupt):  # and a Ctrl-C after the block interrupts at once
                _ctrl_c()
        assert written == ["line", "next"]


def test_a_critical_block_without_ctrl_c_ends_quietly(default_sigint):
    with _no_stray_ctrl_c():
        with DeferInterrupts() as interrupts:
            with interrupts.critical():
                assert interrupts.deferring is True
            assert (interrupts.pending, interrupts.deferring) == (False, False)


def test_a_critical_block_ending_in_an_error_raises_that_error_not_the_ctrl_c(default_sigint):
    with _no_stray_ctrl_c():
        with DeferInterrupts() as interrupts:
            with pytest.raises(OSError, match="disk full"):
                with interrupts.critical():
                    _ctrl_c()
                    raise OSError("disk full")
            assert interrupts.deferring is False


def test_after_hold_every_ctrl_c_is_dropped(default_sigint):
    with _no_stray_ctrl_c():
        with DeferInterrupts() as interrupts:
            interrupts.hold()
            _ctrl_c()  # the clean-up is not cut short
            _ctrl_c()
            assert interrupts.pending is True
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # and none is raised at the end


def test_an_ignored_sigint_stays_ignored():
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as under nohup
    try:
        with DeferInterrupts() as interrupts:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert interrupts.previous is None
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_outside_the_main_thread_no_handler_is_installed(default_sigint):
    seen = []

    def job():
        with DeferInterrupts() as interrupts:
            seen.append((interrupts.previous, signal.getsignal(signal.SIGINT)))

    thread = threading.Thread(target=job)
    thread.start()
    thread.join()
    assert seen == [(None, signal.default_int_handler)]


def test_a_fresh_deferral_defers_nothing():
    interrupts = DeferInterrupts()
    assert (interrupts.pending, interrupts.deferring, interrupts.previous) == (False, False, None)


# -------------------------------------------------------------------------------------------- Progress


class _Terminal(io.StringIO):
    """A terminal that keeps what had been written at each flush."""

    def __init__(self, tty: bool = True) -> None:
        super().__init__()
        self.tty, self.flushed = tty, []

    def isatty(self) -> bool:
        return self.tty

    def flush(self) -> None:
        self.flushed.append(self.getvalue())


class _Clock:
    def __init__(self, *times: float) -> None:
        self.times = list(times)

    def __call__(self) -> float:
        return self.times.pop(0)


def test_on_a_terminal_without_tqdm_one_line_is_rewritten_and_flushed_per_request(monkeypatch):
    monkeypatch.setattr(time, "perf_counter", _Clock(10.0, 12.0, 14.0))
    tty = _Terminal()
    progress = Progress(3, tty)
    assert (progress.bar, progress.tty, progress.done, progress.tokens) == (None, True, 0, 0)
    progress.update(5)
    assert tty.flushed == ["\r\x1b[K[1/3 requests, 5 new tokens, 2.5 tok/s]"]
    progress.update(7)
    assert tty.flushed[-1] == tty.getvalue() == ("\r\x1b[K[1/3 requests, 5 new tokens, 2.5 tok/s]"
                                                 "\r\x1b[K[2/3 requests, 12 new tokens, 3.0 tok/s]")
    assert (progress.done, progress.tokens) == (2, 12)
    progress.close()
    assert tty.flushed[-1] == tty.getvalue() and tty.getvalue().endswith("tok/s]\r\x1b[K")
    assert progress.done == 0  # the line is cleared: nothing more to clear
    progress.close()  # a second close clears nothing more
    assert tty.getvalue().count("\r\x1b[K") == 3 and len(tty.flushed) == 3


def test_the_line_names_the_items_and_tokens_and_shows_no_rate_in_no_time(monkeypatch):
    monkeypatch.setattr(time, "perf_counter", _Clock(3.0, 3.0))
    tty = _Terminal()
    progress = Progress(2, tty, desc="inferno score", unit="text", items="texts", tokens="tokens")
    progress.update(4)
    assert tty.getvalue() == "\r\x1b[K[1/2 texts, 4 tokens, 0.0 tok/s]"


def test_the_rate_of_a_request_done_in_under_a_second(monkeypatch):
    monkeypatch.setattr(time, "perf_counter", _Clock(3.0, 3.5))
    tty = _Terminal()
    Progress(2, tty).update(4)
    assert tty.getvalue() == "\r\x1b[K[1/2 requests, 4 new tokens, 8.0 tok/s]"


def test_closing_a_terminal_line_that_showed_nothing_writes_nothing():
    tty = _Terminal()
    Progress(2, tty).close()
    assert tty.getvalue() == "" and tty.flushed == []


def test_not_on_a_terminal_and_without_tqdm_nothing_is_shown():
    pipe = _Terminal(tty=False)
    progress = Progress(2, pipe)
    progress.update(5)
    progress.close()
    assert pipe.getvalue() == "" and pipe.flushed == [] and progress.tokens == 5


class _Bar:
    made: list[_Bar] = []

    def __init__(self, **kwargs) -> None:
        self.kwargs, self.calls = kwargs, []
        _Bar.made.append(self)

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self.calls.append(("postfix", text, refresh))

    def update(self, n: int) -> None:
        self.calls.append(("update", n))

    def close(self) -> None:
        self.calls.append(("close",))


def test_with_tqdm_its_bar_counts_requests_and_shows_tokens(monkeypatch):
    monkeypatch.setattr(time, "perf_counter", _Clock(1.0, 5.0, 5.0))
    _Bar.made = []
    tty = _Terminal()
    progress = Progress(4, tty, tqdm=_Bar)
    [bar] = _Bar.made
    assert bar.kwargs == {"total": 4, "desc": "inferno batch", "unit": "req", "file": tty,
                          "disable": None, "leave": False}  # tqdm hides it when not a terminal
    progress.update(6)
    progress.update(2)
    progress.close()
    assert bar.calls == [("postfix", "6 tok, 1.5 tok/s", False), ("update", 1),
                         ("postfix", "8 tok, 2.0 tok/s", False), ("update", 1), ("close",)]
    assert progress.bar is None and tty.getvalue() == ""  # the bar draws itself, nothing else does


def test_the_bar_takes_the_jobs_own_names():
    _Bar.made = []
    Progress(1, _Terminal(), tqdm=_Bar, desc="inferno score", unit="text")
    assert (_Bar.made[0].kwargs["desc"], _Bar.made[0].kwargs["unit"]) == ("inferno score", "text")


def test_tqdm_or_none_is_tqdm_when_installed_and_none_without(monkeypatch):
    tqdm = pytest.importorskip("tqdm")
    assert tqdm_or_none() is tqdm.tqdm
    monkeypatch.setitem(sys.modules, "tqdm", None)  # as if not installed
    assert tqdm_or_none() is None


# ------------------------------------------------------------------------------------------- JobReport


def test_a_fresh_report_counts_nothing():
    report = JobReport()
    assert (report.todo, report.written, report.tokens, report.seconds, report.skipped, report.malformed,
            report.failed, report.repeated, report.interrupted, report.messages) == (
        0, 0, 0, 0.0, 0, 0, 0, 0, False, [])
    assert JobReport().messages is not report.messages  # each report its own list


def test_the_summary_line_of_a_finished_job():
    report = JobReport(todo=5, written=3, tokens=45, seconds=1.5, skipped=2, malformed=1)
    assert report.summary("requests", "new tokens", "OUT") == (
        "[3 requests, 45 new tokens in 1.50 s, 30.0 tok/s; 2 skipped (already in OUT), 1 malformed]")


def test_the_summary_line_in_no_time_shows_no_rate():
    assert JobReport(written=1, tokens=3).summary("texts", "tokens", "OUT") == (
        "[1 texts, 3 tokens in 0.00 s, 0.0 tok/s; 0 skipped (already in OUT), 0 malformed]")


def test_the_summary_line_of_a_job_done_in_under_a_second():
    assert JobReport(written=1, tokens=3, seconds=0.5).summary("texts", "tokens", "OUT") == (
        "[1 texts, 3 tokens in 0.50 s, 6.0 tok/s; 0 skipped (already in OUT), 0 malformed]")


def test_the_summary_line_names_failed_rows_and_repeated_rows():
    report = JobReport(written=2, tokens=8, seconds=2.0, failed=3)
    assert report.summary("requests", "new tokens", "out.jsonl") == (
        "[2 requests, 8 new tokens in 2.00 s, 4.0 tok/s; 0 skipped (already in OUT), 0 malformed, "
        "3 failed (run again to retry them)]")
    report = JobReport(written=2, tokens=8, seconds=2.0, repeated=4)
    assert report.summary("requests", "new tokens", "OUT") == (
        "[2 requests, 8 new tokens in 2.00 s, 4.0 tok/s; 0 skipped (already in OUT), 0 malformed, "
        "4 repeated rows of retried batches dropped]")
    report = JobReport(written=2, tokens=8, seconds=2.0, failed=1, repeated=1)
    assert report.summary("requests", "new tokens", "OUT").endswith(
        "0 malformed, 1 failed (run again to retry them), 1 repeated rows of retried batches dropped]")


def test_the_summary_line_of_an_interrupted_job():
    report = JobReport(todo=7, written=3, tokens=9, seconds=1.0, interrupted=True)
    assert report.summary("requests", "new tokens", "out.jsonl") == (
        "[interrupted: 3 of 7 requests written to out.jsonl]")
    assert report.summary("texts", "tokens", "OUT", of_todo=False) == "[interrupted: 3 texts written to OUT]"
