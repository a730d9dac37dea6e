"""The driver's terminal, shared by worker output, minitrain's log lines and the live status.

`LiveConsole` is the one writer: every write takes its lock. On a terminal (stderr is a TTY) the
status is a block of lines at the bottom of the screen, redrawn in place; a worker's line or a log
line first erases the block, is written, and the block is drawn again below it, so output is never
torn by the status. Off a terminal (CI, `| tee`, a file) there is no block: the status is one
summary line written now and then (`line()`; the caller chooses how often).

Environment: `MINITRAIN_STATUS=0` (or off/false/no) turns the status off; `MINITRAIN_STATUS=lines`
forces the summary lines even on a terminal (`minitrain.knobs.STATUS`).

Several runs at once in one process (fit()s on several threads) share one terminal: only one console
at a time draws a status block (the first to ask, `for_driver`); a console made while it does is in
lines mode and writes everything through it, so the block is erased and drawn again around its output
too and neither run's output tears the other's status. When the block's run ends (`finish` or
`release`), the next run to start may draw one again. The log handlers the runs own
(`owning_log_handlers`) are shared the same way: their original streams come back when the last of
the overlapping runs ends, whichever ends first.

A console that cannot be written never breaks the run: `write()` raises the OSError/ValueError of a
closed stream to its caller (LogSink detaches the console then), `show()` and `line()` turn the
status off for good at their first failure.
"""

from __future__ import annotations

import logging
import shutil
import sys
import threading
from contextlib import contextmanager
from typing import Iterator, Mapping, Optional, TextIO

from minitrain import knobs

_ERASE_LINE_UP = "\x1b[1A\x1b[2K"  # cursor up one line, clear it


def status_mode(environ: Optional[Mapping[str, str]] = None, stream: Optional[TextIO] = None) -> Optional[str]:
    """"block" (`stream` is a terminal), "lines" (it is not, or MINITRAIN_STATUS=lines) or None
    (MINITRAIN_STATUS=0), from `environ` (default: os.environ); ConfigError for an unknown value."""
    mode = knobs.STATUS.get(environ)
    if mode == "off":
        return None
    if mode == "lines":
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
        mode = status_mode(None, sys.stderr)
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
        write to this console's stdout or stderr write through a console, so a log line is never torn
        by a status block either.

        Overlapping runs in one process (fit()s on several threads) share the handlers: the first
        owner of a handler swaps its stream, later owners join it, and its original stream comes back
        only when the last of them leaves, in whatever order they leave, an exception included (a
        process-wide count under one lock). Meanwhile a log line goes through the owner that draws a
        status block now, else through the owner that joined last (a lines-mode console writes through
        the block's console anyway). A handler whose stream someone else set meanwhile keeps theirs."""
        loggers = [logger] + ([logging.getLogger()] if logger.propagate else [])
        handlers = list(dict.fromkeys(handler for each in loggers for handler in each.handlers))  # once each
        joined: list[logging.Handler] = []
        try:
            with _shared_lock:
                for handler in handlers:
                    if _join_handler(handler, self):
                        joined.append(handler)
            yield
        finally:
            with _shared_lock:
                for handler in joined:
                    _leave_handler(handler, self)


# The console drawing the status block now, if any (one terminal per process; see the module doc).
_owner_lock = threading.Lock()
_block_owner: Optional[LiveConsole] = None


# The log handlers owned by the runs of this process (owning_log_handlers), and the lock under which
# they are joined, left, and their streams swapped. Lock order: _shared_lock, then a handler's own lock
# (setStream); a log line (handler lock, then a console's) never takes _shared_lock, so no deadlock.
_shared_lock = threading.Lock()
_shared_handlers: dict[logging.Handler, "_SharedStream"] = {}


def _join_handler(handler: logging.Handler, console: LiveConsole) -> bool:
    """Under _shared_lock: make `console` an owner of `handler` if the handler writes to one of the
    console's streams (swapping its stream on the first owner). True if it joined."""
    shared = _shared_handlers.get(handler)
    if shared is None:
        stream = getattr(handler, "stream", None)
        if not isinstance(handler, logging.StreamHandler) or stream not in (console.stdout, console.stderr):
            return False
        shared = _SharedStream(stream, (console,))
        handler.setStream(shared)
        _shared_handlers[handler] = shared
        return True
    if shared.original not in (console.stdout, console.stderr):
        return False
    shared.owners = shared.owners + (console,)  # a new tuple: a log line reads it without the lock
    return True


def _leave_handler(handler: logging.Handler, console: LiveConsole) -> None:
    """Under _shared_lock: `console` no longer owns `handler` (one join of it, when a console nests);
    the last owner to leave puts the original stream back."""
    shared = _shared_handlers[handler]
    owners = list(shared.owners)
    del owners[max(i for i, owner in enumerate(owners) if owner is console)]
    shared.owners = tuple(owners)
    if owners:
        return
    del _shared_handlers[handler]
    if handler.stream is shared:  # not if someone else set the handler's stream meanwhile
        handler.setStream(shared.original)


class _SharedStream:
    """A handler's stream while runs own it: a text stream that writes the handler's `original` stream
    through one of its `owners` (the one drawing a status block, else the last to join)."""

    def __init__(self, original: TextIO, owners: tuple[LiveConsole, ...]):
        self.original = original
        self.owners = owners

    def console(self) -> Optional[LiveConsole]:
        """The console a log line goes through now (None once every owner has left)."""
        owners = self.owners
        for owner in reversed(owners):
            if owner.mode == "block":
                return owner
        return owners[-1] if owners else None

    def write(self, text: str) -> int:
        console = self.console()
        if console is None:  # a line logged while the last owner was leaving
            self.original.write(text)
        else:
            console.write(self.original, text)
        return len(text)

    def flush(self) -> None:
        try:
            self.original.flush()
        except (OSError, ValueError):
            pass

    def isatty(self) -> bool:
        return self.original.isatty()
