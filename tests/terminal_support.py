"""A pseudo-terminal for the driver console's unit tests (tests/unit/test_console.py, test_tune_console.py,
test_console_log_handlers.py, test_concurrent_runs.py): the stream the driver writes to, the screen a
terminal would show of it, and the `terminal` fixture (import it by name into the test module); and
`run_on_a_terminal`, a whole command run on a pty for the end-to-end tests."""

from __future__ import annotations

import contextlib
import os
import pty
import re
import select
import time

import pytest

ERASE = "\x1b[1A\x1b[2K"  # the console's erase: cursor up one line, clear that line


class Terminal:
    """A pseudo-terminal: `out` is its slave end as a text stream (what the driver writes to), and
    `screen()` replays what reached the master end the way a terminal shows it (erase = the line
    above is gone)."""

    def __init__(self):
        self.master, slave = pty.openpty()
        self.out = open(slave, "w", buffering=1, encoding="utf-8")
        self._received = b""

    def read(self) -> str:
        os.set_blocking(self.master, False)
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            self._received += chunk
        return self._received.decode().replace("\r\n", "\n")

    def screen(self) -> list[str]:
        lines: list[str] = []
        for token in re.split(r"(\x1b\[1A\x1b\[2K|\n)", self.read()):
            if token == ERASE:
                lines.pop()
            elif token and token != "\n":
                lines.append(token)
        return lines

    def close(self):
        # The master first: a flush into a full pty buffer nobody reads would block for ever; with the
        # master gone it fails at once (EIO).
        os.close(self.master)
        with contextlib.suppress(OSError):
            self.out.close()


@pytest.fixture
def terminal():
    """A `Terminal`, closed after the test."""
    term = Terminal()
    yield term
    term.close()


def screen_ending_with(terminal: Terminal, last: str, timeout_s: float = 30.0) -> list[str]:
    """The screen once its last line is `last` (a pty hands written bytes to its reader a little later);
    after `timeout_s` without it, the screen as it is, for the caller's assertion to show."""
    deadline = time.monotonic() + timeout_s
    while True:
        screen = terminal.screen()
        if (screen and screen[-1] == last) or time.monotonic() > deadline:
            return screen
        time.sleep(0.01)


def run_on_a_terminal(argv: list[str], env: dict[str, str], timeout_s: float,
                      ctrl_c_after: str | None = None) -> tuple[int, str]:
    """Run `argv` with `env` on a pseudo-terminal (its controlling terminal, so ^C sends it SIGINT) until it
    ends or `timeout_s` passes; once `ctrl_c_after` was shown, type Ctrl-C once. Returns (exit code, the
    screen's text with "\r\n" as "\n")."""
    pid, master = pty.fork()
    if pid == 0:
        os.execvpe(argv[0], argv, env)
    received, sent, deadline = b"", False, time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if select.select([master], [], [], 0.2)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            received += chunk
        if ctrl_c_after is not None and not sent and ctrl_c_after.encode() in received:
            os.write(master, b"\x03")
            sent = True
    _, status = os.waitpid(pid, 0)
    os.close(master)
    return os.waitstatus_to_exitcode(status), received.decode(errors="replace").replace("\r\n", "\n")
