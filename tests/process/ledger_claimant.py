"""A process that claims half or all of this host's CPUs in the resource ledger, for the ledger's process
tests and benchmarks: ``python ledger_claimant.py MODE DIR`` (MINITRAIN_LEDGER_DIR must be set).

- ``hold``: claim the whole host, print "held", then hold until stdin ends (or the process is killed);
- ``race``: print "ready", wait for a line on stdin (every racer starts at once), then ROUNDS times:
  claim half the host (two fit at once), put a marker in DIR, count the markers (more than 2 would be
  an oversubscription), take the marker away and release; print the most markers it saw;
- ``lock``: what any local user can do, minitrain or not: hold ``flock`` on the ledger's ``.lock``, print
  "locked", then hold it until stdin ends (or the process is killed).
"""

from __future__ import annotations

import fcntl
import os
import sys

from minitrain.hosts import hostinfo
from minitrain.hosts.cluster import ClusterConfig, HostSpec
from minitrain.hosts.demand import Need
from minitrain.hosts.hold import this_host_ledger, this_host_totals
from minitrain.hosts.ledger import LOCK_NAME
from minitrain.hosts.reserve import reserve

LOCAL = ClusterConfig(hosts=(HostSpec("localhost"),))
ROUNDS = 10


def main() -> int:
    mode, directory = sys.argv[1], sys.argv[2]
    cpus = float(hostinfo.cpu_count())
    if mode == "hold":
        with reserve(LOCAL, Need(1, cpus=cpus), "holder", poll_s=0.01):
            print("held", flush=True)
            sys.stdin.read()
        return 0
    if mode == "lock":
        ledger = this_host_ledger("localhost")
        ledger.snapshot(this_host_totals())  # makes the directory
        fd = os.open(os.path.join(ledger.directory, LOCK_NAME), os.O_RDONLY | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("locked", flush=True)
        sys.stdin.read()
        return 0
    print("ready", flush=True)
    sys.stdin.readline()  # every racer is told to go at once
    most = 0
    for _ in range(ROUNDS):
        with reserve(LOCAL, Need(1, cpus=cpus / 2), f"racer-{os.getpid()}", poll_s=0.001):
            marker = os.path.join(directory, str(os.getpid()))
            open(marker, "w").close()
            most = max(most, len(os.listdir(directory)))
            for _ in range(50):  # stay a little while, so the other slot's holder overlaps with this one
                os.listdir(directory)
            os.unlink(marker)
    print(most, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
