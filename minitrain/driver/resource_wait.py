"""`fit()`'s wait for its hosts' resources, told on the console and the dashboard (L3).

`holding` claims what the run needs in its hosts' ledgers (`minitrain.hosts.reserve`) for the
`with` block, waiting as long as ``MINITRAIN_RESOURCE_WAIT_S`` allows. While it waits:

- a log line says what it waits for and who holds it, when it starts waiting and whenever that
  changes ("waiting for 2 GPUs on gpu1 since 12:03: held by run X (alice, pid 4242, since 11:40): ...");
- on a terminal the status block shows that line (one holder a line), refreshed at every look; off a terminal it is
  repeated as a status line every `MonitoringConfig.status_interval_s`;
- the monitor has it (`RunMonitor.note_waiting`), so the dashboard shows it in place of the start-up.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Any, Iterator

from minitrain import knobs
from minitrain.driver.console import LiveConsole
from minitrain.hosts.cluster import ClusterConfig
from minitrain.hosts.demand import Need
from minitrain.hosts.reserve import Reservation, reserve
from minitrain.monitoring.monitor import RunMonitor

logger = logging.getLogger("minitrain")


class _WaitDisplay:
    def __init__(self, run: str, live: LiveConsole, monitor: RunMonitor, line_every_s: float):
        self._run = run
        self._live = live
        self._monitor = monitor
        self._every_s = line_every_s
        self._logged = ""
        self._lined = 0.0
        self.waited = False

    def __call__(self, text: str) -> None:
        self.waited = True
        self._monitor.note_waiting(text)
        what, _, who = text.partition(": held by ")  # the holders: a new log line only when they change
        if who != self._logged:
            self._logged = who
            self._lined = time.monotonic()
            logger.info("run %r is %s", self._run, text)
        if self._live.mode == "block":  # one holder a line: the block cuts lines at the terminal's width
            self._live.show([f"minitrain: {self._run} | {what}"] + [f"  held by {h}" for h in who.split("; ") if h])
        elif time.monotonic() - self._lined >= self._every_s:
            self._lined = time.monotonic()
            self._live.line(f"minitrain: {self._run} | {text}")

    def done(self) -> None:
        self._monitor.note_waiting(None)
        if self._live.mode == "block":
            self._live.show([])


@contextmanager
def holding(cluster: ClusterConfig, scaling: Any, run: str, live: LiveConsole, monitor: RunMonitor,
            pythonpath: tuple[str, ...], line_every_s: float) -> Iterator[Reservation]:
    """The run's `Reservation` for the `with` block (see the module doc); released however it ends."""
    display = _WaitDisplay(run, live, monitor, line_every_s)
    need = Need.of(scaling)
    try:
        reservation = reserve(cluster, need, run, timeout_s=knobs.RESOURCE_WAIT_S.get(), on_wait=display,
                              pythonpath=pythonpath)
    finally:
        display.done()
    with reservation:
        if display.waited:
            held = sum(host.slots or 0 for host in reservation.cluster.hosts) or need.workers
            logger.info("run %r got %s on %s after waiting %.1f s", run, need.describe(held),
                        ",".join(h.name for h in reservation.cluster.hosts), reservation.waited_s)
        yield reservation
