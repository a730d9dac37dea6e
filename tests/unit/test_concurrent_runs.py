"""What several runs at once in one driver process share, kept apart: the terminal's
status block (minitrain.driver.console), the `minitrain` logger's level (minitrain.driver.logs.driver_logging), a fixed
dashboard port (minitrain.dashboard.live_dashboard) and the local-mode session (minitrain._session)."""

from __future__ import annotations

import logging
import socket
import sys
import threading

import pytest

from dashboard_support import FixedRun
from minitrain import _session
from minitrain.dashboard import live_dashboard
from minitrain.driver.console import LiveConsole
from minitrain.driver.logs import driver_logging, level_number
from minitrain.errors import ConfigError
from terminal_support import terminal


def test_a_second_console_writes_lines_through_the_one_drawing_the_block(terminal, monkeypatch):
    monkeypatch.delenv("MINITRAIN_STATUS", raising=False)
    monkeypatch.setattr(sys, "stderr", terminal.out)
    first = LiveConsole.for_driver()
    second = LiveConsole.for_driver()
    try:
        assert first.mode == "block" and second.mode == "lines"
        first.show(["run A: step 1"])
        second.line("run B: step 1")
        second.write(terminal.out, "(rank 0, h) a line of run B\n")
        first.show(["run A: step 2"])
        # Run B's output went above run A's block, which was erased and drawn again: nothing torn.
        assert terminal.screen() == ["run B: step 1", "(rank 0, h) a line of run B", "run A: step 2"]
        first.finish(["run A: done"])
        third = LiveConsole.for_driver()  # the block is free again once its run is over
        assert third.mode == "block"
        third.release()
    finally:
        first.release()
        second.release()


def test_a_run_that_ends_without_finishing_releases_the_block(terminal, monkeypatch):
    monkeypatch.delenv("MINITRAIN_STATUS", raising=False)
    monkeypatch.setattr(sys, "stderr", terminal.out)
    first = LiveConsole.for_driver()
    first.release()
    first.release()  # idempotent
    second = LiveConsole.for_driver()
    assert second.mode == "block" and second._through is None
    second.release()


def test_concurrent_runs_log_at_the_most_verbose_level_and_restore_the_one_before():
    logger = logging.getLogger("minitrain")
    before = logger.level
    try:
        logger.setLevel(logging.ERROR)
        with driver_logging("INFO"):
            assert logger.level == logging.INFO
            with driver_logging("WARNING"):  # a second run asking for less does not silence the first
                assert logger.level == logging.INFO
                with driver_logging("DEBUG"):
                    assert logger.level == logging.DEBUG
                assert logger.level == logging.INFO
            assert logger.level == logging.INFO
        assert logger.level == logging.ERROR
        with pytest.raises(ValueError, match="unknown log level 'LOUD'"):
            level_number("LOUD")
    finally:
        logger.setLevel(before)


def test_runs_on_two_threads_keep_their_levels_until_both_end():
    logger = logging.getLogger("minitrain")
    before = logger.level
    entered, release = threading.Barrier(3, timeout=10), threading.Event()

    def run(level):
        with driver_logging(level):
            entered.wait()
            release.wait(10)

    threads = [threading.Thread(target=run, args=(level,)) for level in ("DEBUG", "WARNING")]
    for thread in threads:
        thread.start()
    entered.wait()
    assert logger.level == logging.DEBUG
    release.set()
    for thread in threads:
        thread.join(10)
    assert logger.level == before


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_second_live_dashboard_on_a_fixed_port_takes_a_free_one(monkeypatch, caplog):
    port = _free_port()
    monkeypatch.setenv("MINITRAIN_DASHBOARD", f"127.0.0.1:{port}")
    caplog.set_level(logging.INFO, logger="minitrain")
    with live_dashboard(FixedRun()) as first:
        with live_dashboard(FixedRun()) as second:
            second_port = second.port
            assert first.port == port and second_port not in (0, port)
        warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warning == [f"dashboard: http://127.0.0.1:{second_port}/ (MINITRAIN_DASHBOARD names port {port}, "
                           "which another run of this process serves now; this run's dashboard took a free port)"]
    with live_dashboard(FixedRun()) as again:  # the port is this run's again once the first has ended
        assert again.port == port


def test_a_fixed_port_held_by_something_else_is_still_a_clear_error(monkeypatch):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        monkeypatch.setenv("MINITRAIN_DASHBOARD", f"127.0.0.1:{port}")
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            with live_dashboard(FixedRun()):
                pass
    with live_dashboard(FixedRun()) as server:  # a failed start held nothing
        assert server.port == port


def test_a_bound_session_is_the_calling_threads_only():
    mine, theirs = object(), object()
    seen = {}
    bound_here = threading.Event()

    def other_thread():
        bound_here.wait(10)
        with _session.bound(theirs):
            seen["other"] = _session.current("report")
        try:
            _session.current("report")
        except RuntimeError:
            seen["after"] = None

    thread = threading.Thread(target=other_thread)
    thread.start()
    with _session.bound(mine):
        bound_here.set()
        thread.join(10)
        assert _session.current("report") is mine
    assert seen == {"other": theirs, "after": None}
    with pytest.raises(RuntimeError, match="minitrain.report\\(\\) cannot be used outside"):
        _session.current("report")
