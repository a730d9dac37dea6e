"""Worker output in the driver (minitrain.driver.logs.LogSink): a console or a log file that cannot be written
never raises (a raise would end the node's stream and read as a lost node)."""

from __future__ import annotations

import io
import logging
import os
import threading
import time

import pytest

from minitrain.driver.logs import LogSink
from minitrain.storage.filesystem import StorageError


class ClosedPipe(io.StringIO):
    """A console whose reader went away (`python train.py | head -1`)."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")


def test_lines_go_to_the_console_and_the_rank_file(tmp_path):
    out = io.StringIO()
    sink = LogSink(str(tmp_path), stdout=out)
    sink.write(0, 1, "h0", False, ["hello", "world"])
    sink.close()
    assert out.getvalue() == "(rank 1, h0) hello\n(rank 1, h0) world\n"
    assert (tmp_path / "attempt_0" / "rank_1.log").read_text() == "hello\nworld\n"


def test_a_closed_console_is_detached_and_the_files_go_on(tmp_path, caplog):
    sink = LogSink(str(tmp_path), stdout=ClosedPipe(), stderr=ClosedPipe())
    with caplog.at_level(logging.WARNING, logger="minitrain"):
        sink.write(0, 0, "h0", False, ["first"])
        sink.write(0, 0, "h0", True, ["second"])
    sink.close()
    assert sink.console_detached and sink.failures == []
    assert (tmp_path / "attempt_0" / "rank_0.log").read_text() == "first\nsecond\n"
    assert caplog.text.count("the console cannot be written") == 1


def test_a_full_disk_is_a_storage_error_naming_the_file_and_the_console_goes_on(tmp_path, caplog):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    (tmp_path / "attempt_0").mkdir()
    os.symlink("/dev/full", tmp_path / "attempt_0" / "rank_0.log")  # every write: ENOSPC
    out = io.StringIO()
    sink = LogSink(str(tmp_path), stdout=out)
    with caplog.at_level(logging.ERROR, logger="minitrain"):
        for n in range(3):
            sink.write(0, 0, "h0", False, [f"line {n}" * 2000])
    sink.close()
    assert len(sink.failures) == 1 and isinstance(sink.failures[0], StorageError)
    assert str(tmp_path / "attempt_0" / "rank_0.log") in str(sink.failures[0])
    assert "No space left on device" in str(sink.failures[0])
    assert out.getvalue().count("(rank 0, h0) line") == 3
    assert caplog.text.count("could not write the worker log") == 1


def test_a_log_file_that_cannot_be_opened_is_a_storage_error(tmp_path):
    (tmp_path / "attempt_0").write_text("a file where a folder should be")
    sink = LogSink(str(tmp_path), console=False)
    sink.open(0, 0)
    sink.write(0, 0, "h0", False, ["lost to the file, not to the run"])
    sink.close()
    assert len(sink.failures) == 1 and "attempt_0" in str(sink.failures[0])


def test_a_rank_traceback_is_shown_in_one_piece_across_batches(tmp_path):
    """A traceback that arrives in two batches is not split by what the driver writes
    in between (its WARNING about the same failure races with the lines)."""
    err = io.StringIO()
    sink = LogSink(str(tmp_path), stderr=err)
    sink.write(0, 1, "h0", True, ["before", "Traceback (most recent call last):", '  File "t.py", line 3, in f'])
    err.write("minitrain WARNING: the driver's own line\n")
    sink.write(0, 1, "h0", True, ["    raise ValueError(x)", "ValueError: bad", "after"])
    sink.close()
    assert err.getvalue().splitlines() == [
        "(rank 1, h0) before",
        "minitrain WARNING: the driver's own line",
        "(rank 1, h0) Traceback (most recent call last):",
        '(rank 1, h0)   File "t.py", line 3, in f',
        "(rank 1, h0)     raise ValueError(x)",
        "(rank 1, h0) ValueError: bad",
        "(rank 1, h0) after",
    ]
    # The file has every line at once, in order.
    assert (tmp_path / "attempt_0" / "rank_1.log").read_text().splitlines()[:3] == [
        "before", "Traceback (most recent call last):", '  File "t.py", line 3, in f']


def test_an_unfinished_traceback_is_shown_at_close(tmp_path):
    err = io.StringIO()
    sink = LogSink(str(tmp_path), stderr=err)
    sink.write(0, 0, "h0", True, ["Traceback (most recent call last):", '  File "t.py", line 3, in f'])
    assert err.getvalue() == ""
    sink.close()
    assert err.getvalue() == '(rank 0, h0) Traceback (most recent call last):\n(rank 0, h0)   File "t.py", line 3, in f\n'


def test_a_later_attempt_closes_the_files_of_the_earlier_ones(tmp_path):
    # Each restart kept every rank's file open: at 16,384 ranks the second attempt ran out of descriptors.
    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    def fds_settle_at(expected: int) -> int:  # the files are made on the sink's own thread
        deadline = time.monotonic() + 10
        while open_fds() != expected and time.monotonic() < deadline:
            time.sleep(0.01)
        return open_fds()

    sink = LogSink(str(tmp_path), console=False)
    before = open_fds()
    for rank in range(50):
        sink.open(0, rank)
    sink.write(0, 3, "h0", False, ["first"])
    assert fds_settle_at(before + 50) == before + 50
    sink.open(1, 0)  # the first worker of attempt 1: attempt 0 was drained before it started
    assert fds_settle_at(before + 1) == before + 1
    sink.write(0, 3, "h0", False, ["late"])  # a late line still lands in its own file
    sink.write(1, 0, "h0", False, ["next"])
    sink.close()
    assert open_fds() == before
    assert (tmp_path / "attempt_0" / "rank_3.log").read_text() == "first\nlate\n"
    assert (tmp_path / "attempt_1" / "rank_0.log").read_text() == "next\n"


def test_started_workers_files_are_made_off_the_callers_thread_and_all_exist_after_close(tmp_path, monkeypatch):
    """open() is called on the coordinator's gRPC loop, where making 14,744 files was a quarter of the loop
    while a 16,384-rank attempt started: the files are made on the sink's own thread, every one of them
    by close(), and an open() after close() makes its file at once."""
    makers = set()
    make = LogSink._make

    def recording_make(self, attempt, rank):
        makers.add(threading.current_thread().name)
        make(self, attempt, rank)

    monkeypatch.setattr(LogSink, "_make", recording_make)
    sink = LogSink(str(tmp_path), console=False)
    for rank in range(100):
        sink.open(0, rank)
    sink.close()
    assert makers == {"minitrain-log-files"}
    assert sorted(p.name for p in (tmp_path / "attempt_0").iterdir()) == sorted(f"rank_{r}.log" for r in range(100))
    sink.open(1, 0)
    assert (tmp_path / "attempt_1" / "rank_0.log").exists()
    sink.close()
