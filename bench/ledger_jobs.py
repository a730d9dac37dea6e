"""The measured holder of the `ledger` workload (see `bench.ledger`).

`python -m bench.ledger_jobs` claims the whole host in the resource ledger (every CPU, as a run whose
`resources_per_worker` names them) on command, one JSON line per answer:
  stdin "claim"   -> claim (waiting as a run waits), then {"held": pid};
  stdin "release" -> {"releasing": time.time()} just before it gives the claim back, then {"released": true};
  stdin ends      -> exit.
MINITRAIN_LEDGER_DIR names the ledger. Only the standard library and minitrain.hosts are imported.
"""

from __future__ import annotations

import json
import os
import sys
import time

from minitrain.hosts import hostinfo
from minitrain.hosts.cluster import ClusterConfig, HostSpec
from minitrain.hosts.demand import Need
from minitrain.hosts.reserve import reserve

LOCAL = ClusterConfig(hosts=(HostSpec("localhost"),))


def whole_host() -> Need:
    """Every CPU of this host, named: a run that needs the whole host."""
    return Need(1, cpus=float(hostinfo.cpu_count()))


def _say(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> int:
    held = None
    for line in sys.stdin:
        command = line.strip()
        if command == "claim":
            held = reserve(LOCAL, whole_host(), "bench-holder")
            _say({"held": os.getpid()})
        elif command == "release" and held is not None:
            _say({"releasing": time.time()})
            held.release()
            held = None
            _say({"released": True})
    return 0


if __name__ == "__main__":
    sys.exit(main())
