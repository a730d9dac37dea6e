"""The driver's terminal, shared by worker output, minitrain's log lines and the live status (L1).

`LiveConsole` is the one writer: every write takes its lock. On a terminal (stderr is a TTY) the
status is a block of lines at the bottom of the screen, redrawn in place; a worker's line or a log
line first erases the block, is written, and the block is drawn again below it, so output is never
torn by the status. Off a terminal (CI, `| tee`, a file) there is no block: the status is one
summary line written now and then (`line()`; the caller chooses how often).

Environment: `MINITRAIN_STATUS=0` (or off/false/no) turns the status off; `MINITRAIN_STATUS=lines`
forces the summary lines even on a terminal.

Several runs at once in one process (fit()s on several threads) share one terminal: only one console
at a time draws a status block (the first to ask, `for_driver`); a console made while it does is in
lines mode and writes everything through it, so the block is erased and drawn again around its output
too and neither run's output tears the other's status. When the block's run ends (`finish` or
`release`), the next run to start may draw one again.

A console that cannot be written never breaks the run: `write()` raises the OSError/ValueError of a
closed stream to its caller (LogSink detaches the console then), `show()` and `line()` turn the
status off for good at their first failure.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
from contextlib import contextmanager
from typing import Iterator, Optional, TextIO

STATUS_ENV = "MINITRAIN_STATUS"
_ERASE_LINE_UP = "\x1b[1A\x1b[2K"  # cursor up one line, clear it


def status_mode(environ=os.environ, stream: Optional[TextIO] = None) -> Optional[str]:
    """"block" (a terminal), "lines" (not a terminal, or MINITRAIN_STATUS=lines) or None (off)."""
    value = environ.get(STATUS_ENV, "").strip().lower()
    if value in ("0", "off", "false", "no"):
        return None
    if value == "lines":
        return "lines"
    try:
        tty = bool(stream is not None and stream.isatty())
    except (OSError, ValueError):
        tty = False
    return "block" if tty else "lines"


class LiveConsole:
    """See the module doc. `stdout`/`stderr` default to sys.stdout/sys.stderr at each write (so a
    test's capture works); the status goes to stderr. `mode` is "block", "lines" or None."""

    def __init__(self, mode: Optional[str], stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None,
                 through: Optional["LiveConsole"] = None):
        self.mode = mode
        self._through = through  # the console drawing the status block, which this one writes through
        self._stdout = stdout
        self._stderr = stderr
        self._lock = threading.RLock()
        self._block: list[str] = []  # the status lines on screen now
        self._drawn = 0  # how many lines of the screen the block takes

    @classmethod
    def for_driver(cls) -> "LiveConsole":
        """A console for one run of this driver process, its mode from the environment and sys.stderr.
        While another run's console draws a status block, the new one is in lines mode (or off) and
        writes through that one (see the module doc). Call `finish` or `release` when the run ends."""
        global _block_owner
        mode = status_mode(os.environ, sys.stderr)
        with _owner_lock:
            owner = _block_owner
            if owner is not None and owner.mode == "block":
                return cls("lines" if mode else None, through=owner)
            console = cls(mode)
            if mode == "block":
                _block_owner = console
            return console

    def release(self) -> None:
        """This console's run is over: it no longer holds the terminal's status block, so a later
        run's console may draw one. Idempotent; `finish` does it too."""
        global _block_owner
        with _owner_lock:
            if _block_owner is self:
                _block_owner = None

    @property
    def stdout(self) -> TextIO:
        """The stream this console writes stdout lines to (the process's stdout unless one was given)."""
        return self._stdout or sys.stdout

    @property
    def stderr(self) -> TextIO:
        """The stream this console writes stderr lines to (the process's stderr unless one was given)."""
        return self._stderr or sys.stderr

    # ------------------------------------------------------------------ output of others

    def write(self, stream: TextIO, text: str) -> None:
        """Write `text` (whole lines) to `stream`, below an erased status block that is then drawn
        again. Raises what the stream raises (OSError, ValueError for a closed stream)."""
        if self._through is not None:
            self._through.write(stream, text)
            return
        with self._lock:
            if self._drawn and self._shares_screen(stream):
                self._erase()
                try:
                    stream.write(text)
                    stream.flush()
                finally:
                    self._draw()
            else:
                stream.write(text)
                stream.flush()

    def _shares_screen(self, stream: TextIO) -> bool:
        if stream is self.stderr:
            return True
        try:
            return stream.isatty()
        except (OSError, ValueError):
            return False

    # ------------------------------------------------------------------ the status

    def show(self, lines: list[str]) -> None:
        """Block mode: replace the status block with `lines`. Never raises."""
        if self.mode != "block":
            return
        with self._lock:
            try:
                self._erase()
                # A line longer than the terminal would wrap, and the erase would miss a screen line.
                width = max(shutil.get_terminal_size().columns - 1, 20)
                self._block = [line[:width] for line in lines]
                self._draw()
            except (OSError, ValueError):
                self._off()

    def line(self, text: str) -> None:
        """Lines mode: write one status line to stderr. Never raises."""
        if self.mode != "lines":
            return
        with self._lock:
            try:
                if self._through is not None:  # around the other run's status block
                    self._through.write(self.stderr, text.rstrip("\n") + "\n")
                else:
                    self.stderr.write(text.rstrip("\n") + "\n")
                    self.stderr.flush()
            except (OSError, ValueError):
                self._off()

    def finish(self, lines: Optional[list[str]] = None) -> None:
        """The run is over: block mode leaves `lines` (or the last block) on screen as ordinary output
        and stops redrawing; lines mode writes `lines` as its last status. Never raises."""
        with self._lock:
            if self.mode == "block":
                self.show(lines if lines is not None else self._block)
                self._block, self._drawn = [], 0  # stays on screen; later output goes below it
            elif self.mode == "lines" and lines:
                self.line(" | ".join(lines))
            self.mode = None
        self.release()

    def _erase(self) -> None:
        if self._drawn:
            self.stderr.write(_ERASE_LINE_UP * self._drawn)
            self._drawn = 0

    def _draw(self) -> None:
        if self._block and self.mode == "block":
            try:
                self.stderr.write("".join(line + "\n" for line in self._block))
                self.stderr.flush()
            except (OSError, ValueError):
                self._off()
                return
            self._drawn = len(self._block)

    def _off(self) -> None:
        self.mode = None
        self._block, self._drawn = [], 0

    # ------------------------------------------------------------------ log lines

    @contextmanager
    def owning_log_handlers(self, logger: logging.Logger) -> Iterator[None]:
        """While inside: `logger`'s stream handlers (and the root logger's, when it propagates) that
        write to this console's stdout or stderr write through it, so a log line is never torn by
        the status block either."""
        loggers = [logger] + ([logging.getLogger()] if logger.propagate else [])
        swapped = []
        for each in loggers:
            for handler in each.handlers:
                stream = getattr(handler, "stream", None)
                if isinstance(handler, logging.StreamHandler) and stream in (self.stdout, self.stderr):
                    handler.setStream(_Through(self, stream))
                    swapped.append((handler, stream))
        try:
            yield
        finally:
            for handler, stream in swapped:
                handler.setStream(stream)


# The console drawing the status block now, if any (one terminal per process; see the module doc).
_owner_lock = threading.Lock()
_block_owner: Optional[LiveConsole] = None


class _Through:
    """A text stream that writes through a LiveConsole (for logging handlers)."""

    def __init__(self, console: LiveConsole, stream: TextIO):
        self._console = console
        self._stream = stream

    def write(self, text: str) -> int:
        self._console.write(self._stream, text)
        return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError):
            pass

    def isatty(self) -> bool:
        return self._stream.isatty()
