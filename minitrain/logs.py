"""Worker output in the driver: prefixed console lines and per-attempt, per-rank log files (L1).

Every forwarded line is shown as `(rank 1, host) text` on the driver's stdout or stderr (matching the
worker's stream) and appended to `<run>/logs/attempt_<n>/rank_<r>.log`, which is kept after failures.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Optional, TextIO

from minitrain.storage.layout import rank_log

logger = logging.getLogger("minitrain")


def line_prefix(rank: int, node: str) -> str:
    """The console prefix of one worker's lines."""
    return f"(rank {rank}, {node}) "


class LogSink:
    """Writes worker lines to the console and to per-rank files under `logs_dir` (a local path).

    `console=False` keeps lines out of the console (files only). Thread-safe. `close()` closes files.
    """

    def __init__(self, logs_dir: str, console: bool = True,
                 stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None):
        self._logs_dir = logs_dir
        self._console = console
        self._stdout = stdout
        self._stderr = stderr
        self._files: dict[tuple[int, int], TextIO] = {}
        self._lock = threading.Lock()

    def path(self, attempt: int, rank: int) -> str:
        """Where rank `rank`'s output of attempt `attempt` is kept."""
        return os.path.join(self._logs_dir, *rank_log(attempt, rank).split("/"))

    def _file(self, attempt: int, rank: int) -> TextIO:
        handle = self._files.get((attempt, rank))
        if handle is None:
            path = self.path(attempt, rank)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            handle = open(path, "a", encoding="utf-8", buffering=1)
            self._files[(attempt, rank)] = handle
        return handle

    def open(self, attempt: int, rank: int) -> None:
        """Create the (possibly empty) log file of a worker that was just started."""
        with self._lock:
            self._file(attempt, rank)

    def write(self, attempt: int, rank: int, node: str, stderr: bool, lines: list[str]) -> None:
        """Show and store lines of one worker's output."""
        prefix = line_prefix(rank, node)
        with self._lock:
            handle = self._file(attempt, rank)
            handle.write("".join(line + "\n" for line in lines))
            if self._console:
                out = (self._stderr or sys.stderr) if stderr else (self._stdout or sys.stdout)
                out.write("".join(prefix + line + "\n" for line in lines))
                out.flush()

    def close(self) -> None:
        """Flush and close every log file."""
        with self._lock:
            for handle in self._files.values():
                handle.close()
            self._files.clear()


def configure_driver_logging(level: str = "INFO") -> None:
    """Give the `minitrain` logger a stderr handler unless the application configured logging."""
    root_configured = bool(logging.getLogger().handlers)
    if not logger.handlers and not root_configured:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("minitrain %(levelname)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(level)
