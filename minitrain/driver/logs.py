"""Worker output in the driver: prefixed console lines and per-attempt, per-rank log files.

Every forwarded line is shown as `(rank 1, host) text` on the driver's stdout or stderr (matching the
worker's stream) and appended to `<run>/logs/attempt_<n>/rank_<r>.log`, which is kept after failures.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import sys
import threading
from typing import Iterator, Optional, TextIO

from minitrain.driver.console import LiveConsole
from minitrain.storage.filesystem import Storage, StorageError
from minitrain.storage.layout import LOGS_DIR, rank_log

logger = logging.getLogger("minitrain")


def line_prefix(rank: int, node: str) -> str:
    """The console prefix of one worker's lines."""
    return f"(rank {rank}, {node}) "


class LogSink:
    """Writes worker lines to the console and to per-rank files under `logs_dir` (a local path).

    `console=False` keeps lines out of the console (files only). Thread-safe. Never raises: the
    output of a healthy worker must never end its node's stream (a raise here would read as a lost
    node). A console that cannot be written (a closed pipe: `train.py | head -1`, EPIPE) is detached
    with one warning and the files go on. A log file that cannot be written (a full disk, no file
    descriptors left) is given up with one error naming it; `failures` keeps each as a `StorageError`.
    `live`: the driver's LiveConsole; console lines are written through it, so its status block
    never tears them.
    `run_storage`: the local run directory `logs_dir` lies in (`<run>/logs`); its files are then opened
    through it, no link followed and another user's file refused (`Storage.open_local`).
    A log file stays open while its attempt may write; the first worker started in a later attempt
    closes every file of the earlier ones (a late line reopens its file to append): otherwise each
    restart kept every rank's file open, and an attempt after the first at 16,384 ranks ran out of
    file descriptors (then the run's own files could not be opened).
    `open` returns at once: the files of started workers are made (and the earlier attempts' closed)
    on the sink's own thread, `minitrain-log-files`, started by the first `open` and ended by `close`.
    On the caller's thread (the coordinator's gRPC loop), making 14,744 of them was a quarter of that
    loop's time while a 16,384-rank attempt started.
    """

    def __init__(self, logs_dir: str, console: bool = True,
                 stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None,
                 live: Optional[LiveConsole] = None, run_storage: Optional[Storage] = None):
        self._logs_dir = logs_dir
        self._run_storage = run_storage
        self._console = console
        self._stdout = stdout
        self._stderr = stderr
        self._live = live
        self._files: dict[tuple[int, int], Optional[TextIO]] = {}  # None: given up after a failure
        self._tracebacks: dict[tuple[int, int, bool], list[str]] = {}  # console lines held, see _whole_tracebacks
        self._nodes: dict[int, str] = {}  # rank -> node, for the prefix of held lines shown at close()
        self._latest_attempt = -1  # the latest attempt a worker was started in (open())
        self._lock = threading.Lock()
        self._to_open: "queue.SimpleQueue[Optional[tuple[int, int]]]" = queue.SimpleQueue()
        self._opener: Optional[threading.Thread] = None  # makes the files open() asks for
        self._closed = False
        self.failures: list[StorageError] = []
        self.console_detached = False

    def path(self, attempt: int, rank: int) -> str:
        """Where rank `rank`'s output of attempt `attempt` is kept."""
        return os.path.join(self._logs_dir, *rank_log(attempt, rank).split("/"))

    def _file(self, attempt: int, rank: int) -> Optional[TextIO]:
        key = (attempt, rank)
        if key not in self._files:
            path = self.path(attempt, rank)
            try:
                if self._run_storage is not None:
                    fd = self._run_storage.open_local(f"{LOGS_DIR}/{rank_log(attempt, rank)}",
                                                      os.O_WRONLY | os.O_APPEND | os.O_CREAT)
                    self._files[key] = open(fd, "a", encoding="utf-8", buffering=1)
                else:
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    self._files[key] = open(path, "a", encoding="utf-8", buffering=1)
            except (OSError, StorageError) as exc:
                self._give_up(key, exc)
        return self._files[key]

    def _give_up(self, key: tuple[int, int], exc: Exception) -> None:
        handle = self._files.get(key)
        self._files[key] = None
        path = self.path(*key)
        error = StorageError(f"could not write the worker log {path}: {getattr(exc, 'strerror', None) or exc}; the rest of "
                             f"rank {key[1]}'s output of attempt {key[0]} is shown on the console only")
        self.failures.append(error)
        logger.error("%s", error)
        if handle is not None:
            try:
                handle.close()
            except OSError:
                pass

    def open(self, attempt: int, rank: int) -> None:
        """Have the (possibly empty) log file of a worker that was just started created, soon, on the
        sink's own thread (see the class docstring); the first of a later attempt closes the files of
        the earlier attempts (they were drained before it started). A line written meanwhile creates
        the file itself. After `close()`, the file is created at once."""
        with self._lock:
            if self._closed:
                self._make(attempt, rank)
                return
            if self._opener is None:
                self._opener = threading.Thread(target=self._open_files, name="minitrain-log-files", daemon=True)
                self._opener.start()
            self._to_open.put((attempt, rank))  # under the lock: never behind close()'s end marker

    def _open_files(self) -> None:
        while True:
            key = self._to_open.get()
            if key is None:
                return
            with self._lock:
                self._make(*key)

    def _make(self, attempt: int, rank: int) -> None:
        """(Under the lock.) Create the file of a started worker; close the earlier attempts' files."""
        if attempt > self._latest_attempt:
            self._latest_attempt = attempt
            self._close_files(lambda key: key[0] < attempt)
        self._file(attempt, rank)

    def _close_files(self, which) -> None:
        """Close (and forget) the open files whose (attempt, rank) `which` accepts; a file that cannot
        be closed is given up."""
        for key in [k for k in self._files if which(k)]:
            handle = self._files.pop(key)
            if handle is None:
                self._files[key] = None  # given up stays given up
                continue
            try:
                handle.close()
            except OSError as exc:
                self._files[key] = handle
                self._give_up(key, exc)

    def write(self, attempt: int, rank: int, node: str, stderr: bool, lines: list[str]) -> None:
        """Show and store lines of one worker's output."""
        prefix = line_prefix(rank, node)
        with self._lock:
            handle = self._file(attempt, rank)
            if handle is not None:
                try:
                    handle.write("".join(line + "\n" for line in lines))
                except OSError as exc:
                    self._give_up((attempt, rank), exc)
            self._nodes[rank] = node
            lines = self._whole_tracebacks((attempt, rank, stderr), lines)
            if self._console and lines:
                out = (self._stderr or sys.stderr) if stderr else (self._stdout or sys.stdout)
                text = "".join(prefix + line + "\n" for line in lines)
                try:
                    if self._live is not None:
                        self._live.write(out, text)
                    else:
                        out.write(text)
                        out.flush()
                except (OSError, ValueError) as exc:  # ValueError: the stream was closed
                    self._detach_console(exc)

    def _whole_tracebacks(self, key: tuple[int, int, bool], lines: list[str]) -> list[str]:
        """The console lines to show now: a traceback's lines are held until its exception line comes,
        so that it is shown in one piece, never split by the driver's own lines about the same failure
        (they race with it: the failure comes over the worker's stream, the lines over its agent's)."""
        held = self._tracebacks.pop(key, None)
        shown: list[str] = []
        for line in lines:
            if held is None:
                if line.startswith("Traceback (most recent call last):"):
                    held = [line]
                else:
                    shown.append(line)
                continue
            held.append(line)
            # The first unindented line after the header is the exception's own: the block is whole.
            if (line and not line[0].isspace() and not line.startswith("Traceback")) or len(held) >= 1000:
                shown.extend(held)
                held = None
        if held is not None:
            self._tracebacks[key] = held
        return shown

    def _release_tracebacks(self) -> None:
        """Show what is still held (a worker that died in the middle of writing a traceback)."""
        held, self._tracebacks = self._tracebacks, {}
        for (attempt, rank, stderr), lines in held.items():
            if self._console:
                out = (self._stderr or sys.stderr) if stderr else (self._stdout or sys.stdout)
                try:
                    out.write("".join(line_prefix(rank, self._nodes.get(rank, "?")) + line + "\n" for line in lines))
                except (OSError, ValueError):
                    pass

    def _detach_console(self, exc: BaseException) -> None:
        self._console = False
        self.console_detached = True
        logger.warning("the console cannot be written (%s): worker output goes on to the log files in %s "
                       "only", exc, self._logs_dir)

    def close(self) -> None:
        """Make the files asked for, show held traceback lines, flush and close every log file (a failure
        is recorded, not raised)."""
        with self._lock:
            self._closed = True
            opener = self._opener
        if opener is not None:
            self._to_open.put(None)
            opener.join()
        with self._lock:
            self._release_tracebacks()
            self._close_files(lambda key: True)
            self._files.clear()


def _ensure_driver_handler() -> None:
    root_configured = bool(logging.getLogger().handlers)
    if not logger.handlers and not root_configured:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("minitrain %(levelname)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False


# The levels of the runs (fit()s, sweeps) now going on in this process. The one `minitrain` logger is
# shared by them all, so it logs at the most verbose of their levels: a second fit() with
# log_level="WARNING" does not silence the INFO lines of a first one that asked for them, and the
# level from before comes back when the last run ends.
_levels_lock = threading.Lock()
_active_levels: list[int] = []
_level_before_runs = logging.NOTSET


def level_number(level: "str | int") -> int:
    """The numeric logging level of `level` ("DEBUG", "info", 20...); ValueError for an unknown name."""
    if isinstance(level, int):
        return level
    number = logging.getLevelName(str(level).strip().upper())
    if not isinstance(number, int):
        raise ValueError(f"unknown log level {level!r}: use DEBUG, INFO, WARNING, ERROR or CRITICAL")
    return number


@contextlib.contextmanager
def driver_logging(level: "str | int" = "INFO") -> Iterator[None]:
    """While inside (one run of the driver): the `minitrain` logger has a stderr handler unless the
    application configured logging, and logs at `level` or at a more verbose level another run going
    on at the same time asked for. When the last run ends, the level from before comes back."""
    global _level_before_runs
    number = level_number(level)
    with _levels_lock:
        _ensure_driver_handler()
        if not _active_levels:
            _level_before_runs = logger.level
        _active_levels.append(number)
        logger.setLevel(min(_active_levels))
    try:
        yield
    finally:
        with _levels_lock:
            _active_levels.remove(number)
            logger.setLevel(min(_active_levels) if _active_levels else _level_before_runs)
