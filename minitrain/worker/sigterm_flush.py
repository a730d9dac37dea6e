"""A stopped worker first sends what it queued, then dies of SIGTERM; the signal handler does no work.

When minitrain stops a worker (SIGTERM), the reports it queued must still reach the coordinator: a
report() that returned just before a peer failed counts. The flush takes the stream's lock and waits
for the coordinator, which a signal handler must never do: a Python handler runs on the main thread
between two bytecodes, possibly while that thread holds the very lock (a deadlock), and never while the
main thread is blocked in C (a collective), when the flush is needed most. So the handler only writes a
byte to a pipe, which is also the interpreter's wakeup fd (the C-level handler writes the signal number
there at once, even while the main thread is blocked in C); a flusher thread reads it, flushes with a
deadline, and ends the process by SIGTERM's default action, so its agent sees "killed by SIGTERM".

Only while SIGTERM has its default meaning: a handler of the user's, installed later, replaces ours
(the flusher then ignores SIGTERM: the user's handler decides).
"""

from __future__ import annotations

import os
import select
import signal
import threading

from minitrain import procs

SIGTERM_FLUSH_S = 1.0  # how long a stopped worker may spend sending what it queued
_JOIN_MARGIN_S = 0.5


def install(client, deadline_s: float = SIGTERM_FLUSH_S) -> bool:
    """On SIGTERM, flush `client` (its `close(timeout)`) within about `deadline_s` and die of SIGTERM.

    Call from the main thread. Returns False (nothing installed) when SIGTERM already has a handler."""
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)  # a full pipe drops the byte; one is enough

    def note_sigterm(_signum, _frame) -> None:  # takes no lock, does no work
        try:
            os.write(write_fd, bytes([signal.SIGTERM]))
        except OSError:
            pass

    signal.signal(signal.SIGTERM, note_sigterm)
    previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    if previous != -1:
        signal.set_wakeup_fd(previous)  # someone else's wakeup fd stays; the handler still writes ours
    threading.Thread(target=_flush_when_signalled, args=(client, read_fd, note_sigterm, deadline_s),
                     name="minitrain-sigterm-flush", daemon=True).start()
    return True


def _flush_when_signalled(client, read_fd: int, handler, deadline_s: float) -> None:
    while True:
        select.select([read_fd], [], [])
        signums = os.read(read_fd, 512)  # wakeup bytes name every signal with a Python handler
        if signal.SIGTERM in signums and signal.getsignal(signal.SIGTERM) is handler:
            break
    # On a thread of its own: the flush may wait for the stream's lock, which the interrupted main
    # thread may hold for good; the deadline holds regardless.
    flush = threading.Thread(target=client.close, args=(deadline_s,), name="minitrain-flush", daemon=True)
    flush.start()
    flush.join(deadline_s + _JOIN_MARGIN_S)
    procs.die_of_signal(signal.SIGTERM)
