"""fit()'s wait for its hosts' ledgers as people see it (minitrain.driver.resource_wait), and a run's claims across
several hosts given back together when one of them fails (minitrain.hosts.reserve._try_claim)."""

from __future__ import annotations

import io
import logging

from minitrain.dashboard.pages import startup_html
from minitrain.driver.console import LiveConsole
from minitrain.driver.resource_wait import _WaitDisplay
from minitrain.hosts.cluster import HostSpec
from minitrain.hosts.demand import Need
from minitrain.hosts.ledger import Claim
from minitrain.hosts.reserve import _try_claim
from minitrain.monitoring.monitor import RunMonitor

WAITING = "waiting for 2 GPUs on gpu1 since 12:03: held by run X (alice, pid 7, since 11:40): 2 GPUs (0,1)"


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_wait_is_logged_once_per_holder_shown_live_and_given_to_the_dashboard(caplog, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # the block cuts its lines at the terminal's width
    stderr = _Tty()
    live = LiveConsole("block", stderr=stderr)
    monitor = RunMonitor()
    display = _WaitDisplay("second", live, monitor, line_every_s=30.0)
    with caplog.at_level(logging.INFO, logger="minitrain"):
        display(WAITING)
        display(WAITING)  # the same holders: no second log line
        display(WAITING.replace("run X (alice, pid 7", "run Y (bob, pid 8"))
    assert [r.getMessage() for r in caplog.records] == [f"run 'second' is {WAITING}",
                                                         f"run 'second' is {WAITING.replace('run X (alice, pid 7', 'run Y (bob, pid 8')}"]
    block = stderr.getvalue().rsplit("\x1b[2K", 1)[-1]  # the block drawn last
    assert block == ("minitrain: second | waiting for 2 GPUs on gpu1 since 12:03\n"
                     "  held by run Y (bob, pid 8, since 11:40): 2 GPUs (0,1)\n")
    assert monitor.run()["waiting"].startswith("waiting for 2 GPUs on gpu1")
    assert WAITING.split(":")[0] in startup_html(monitor.run(), [])  # the dashboard's start-up notice
    display.done()
    assert monitor.run()["waiting"] is None and display.waited


def test_a_held_ledger_lock_is_named_in_the_waiting_line_as_what_holds_the_run(caplog, monkeypatch):
    """A host whose ledger lock another process holds: the waiting line says who holds it (as
    `LedgerBusyError` words it), logged, and a holder line of its own in the status block."""
    from minitrain.hosts.demand import waiting_text
    from minitrain.hosts.gpus import Gpu
    from minitrain.hosts.ledger import Snapshot, Totals

    locked = ("pid 7 (bob), which holds the ledger's lock /var/tmp/minitrain-ledger/.lock on gpu1 longer than any "
              "claim takes")
    text = waiting_text(Need(2, gpus=1.0), [Snapshot("gpu1", Totals((Gpu(0), Gpu(1)), 8.0, 2**30))], 0.0, [locked])
    assert text.startswith("waiting for 2 GPUs on gpu1 since ") and text.endswith(f": held by {locked}")
    monkeypatch.setenv("COLUMNS", "200")
    stderr = _Tty()
    display = _WaitDisplay("second", LiveConsole("block", stderr=stderr), RunMonitor(), line_every_s=30.0)
    with caplog.at_level(logging.INFO, logger="minitrain"):
        display(text)
    assert [r.getMessage() for r in caplog.records] == [f"run 'second' is {text}"]
    assert stderr.getvalue().rsplit("\x1b[2K", 1)[-1].endswith(f"\n  held by {locked}\n")


def test_off_a_terminal_the_wait_is_a_status_line_now_and_then():
    stderr = io.StringIO()
    live = LiveConsole("lines", stderr=stderr)
    display = _WaitDisplay("second", live, RunMonitor(), line_every_s=0.0)
    display(WAITING)
    display(WAITING)
    assert stderr.getvalue().count(f"minitrain: second | {WAITING}") == 2


class _Host:
    """A named fake host: its claim succeeds or not, and it counts its releases."""

    def __init__(self, name: str, fits: bool):
        self.spec = HostSpec(name)
        self.fits = fits
        self.released = 0

    def claim(self, workers, need, run, lock_wait_s=0.0):
        return Claim(run, "u", 0, 1, 0.0, (0,) * workers) if self.fits else None

    def release(self):
        self.released += 1


def test_a_host_that_cannot_claim_gives_the_others_claims_back():
    hosts = [_Host("a", True), _Host("b", True), _Host("c", False)]
    assert _try_claim(hosts, {"a": 1, "b": 1, "c": 1}, Need(3, gpus=1.0), "r") is None
    assert [h.released for h in hosts] == [1, 1, 0]
    assert set(_try_claim(hosts[:2], {"a": 1, "b": 1}, Need(2, gpus=1.0), "r")) == {"a", "b"}
