"""The `ledger` workload: how soon a run that waits for the host gets it, against its targets.

- **second starts after first releases**: a holder process (`bench.ledger_jobs`) holds the whole host;
  this process asks for the whole host too, with the default poll, and at its first "waiting" tells the
  holder to release; the figure is from the holder's last instant before its release to the moment this
  process holds the claim. `rounds` times; the target is within 1 s every time.
- **SIGKILLed holder free again**: a holder holds the whole host and is SIGKILLed; the figures are from
  the kill to the ledger showing nothing held (looked at every millisecond), and to a waiting run
  holding the host (the default poll). `kills` times; the target is within 1 s.

Both use a ledger in the workload's temporary directory (MINITRAIN_LEDGER_DIR), never the host's own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

from bench.common import BenchError, fmt_s, say, summary
from bench.table import Row, WorkloadResult

TARGET_S = 1.0


class _Holder:
    def __init__(self, env: dict):
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.ledger_jobs"], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, start_new_session=True)

    def ask(self, command: str, key: str):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.answer(key)

    def answer(self, key: str):
        line = self.proc.stdout.readline()
        if not line:
            raise BenchError(f"the ledger holder ended (exit {self.proc.wait()})")
        message = json.loads(line)
        if key not in message:
            raise BenchError(f"the ledger holder said {message!r}, expected {key!r}")
        return message[key]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


def _after_release(env: dict, rounds: int) -> list[float]:
    from bench.ledger_jobs import LOCAL, whole_host
    from minitrain.hosts.reserve import reserve

    holder = _Holder(env)
    gaps = []
    try:
        for _ in range(rounds):
            holder.ask("claim", "held")
            released: dict = {}

            def on_wait(text: str) -> None:
                if not released:
                    released["at"] = holder.ask("release", "releasing")

            with reserve(LOCAL, whole_host(), "bench-second", on_wait=on_wait):
                got = time.time()
            holder.answer("released")
            if "at" not in released:
                raise BenchError("the second run never waited: the holder did not hold the host")
            gaps.append(got - released["at"])
    finally:
        holder.close()
    return gaps


def _after_kill(env: dict, kills: int) -> tuple[list[float], list[float]]:
    from bench.ledger_jobs import LOCAL, whole_host
    from minitrain.hosts.hold import this_host_ledger, this_host_totals
    from minitrain.hosts.reserve import reserve

    freed, started = [], []
    ledger, totals = this_host_ledger("localhost"), this_host_totals()
    for kill_waiter in (False, True):
        for _ in range(kills):
            holder = _Holder(env)
            try:
                holder.ask("claim", "held")
                if kill_waiter:  # a run waits; the holder is killed at its first look
                    killed: dict = {}

                    def on_wait(text: str) -> None:
                        if not killed:
                            killed["at"] = time.time()
                            os.kill(holder.proc.pid, signal.SIGKILL)

                    with reserve(LOCAL, whole_host(), "bench-second", on_wait=on_wait):
                        started.append(time.time() - killed["at"])
                else:
                    at = time.time()
                    os.kill(holder.proc.pid, signal.SIGKILL)
                    while ledger.snapshot(totals).claims:
                        time.sleep(0.001)
                    freed.append(time.time() - at)
            finally:
                holder.close()
    return freed, started


def _row(name: str, values: list[float]) -> Row:
    stats = summary(values)
    within = sum(1 for v in values if v <= TARGET_S)
    return Row("ledger", name, f"median {fmt_s(stats['median_s'], 3)}, max {fmt_s(stats['max_s'], 3)} "
               f"({within}/{len(values)} within {TARGET_S:g} s)", target=f"<= {TARGET_S:g} s, every time",
               met=within == len(values))


def bench_ledger(tmp: str, rounds: int, kills: int) -> WorkloadResult:
    """The workload (see the module doc)."""
    saved = os.environ.get("MINITRAIN_LEDGER_DIR")
    os.environ["MINITRAIN_LEDGER_DIR"] = os.path.join(tmp, "ledger")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    try:
        say(f"  second run after the first releases, {rounds} rounds")
        gaps = _after_release(env, rounds)
        say(f"  SIGKILLed holder, {kills} kills twice (ledger looked at, then a waiting run)")
        freed, started = _after_kill(env, kills)
    finally:
        if saved is None:
            os.environ.pop("MINITRAIN_LEDGER_DIR", None)
        else:
            os.environ["MINITRAIN_LEDGER_DIR"] = saved
    rows = [_row("second run holds the host after the first releases", gaps),
            _row("SIGKILLed holder: the ledger shows the host free", freed),
            _row("SIGKILLed holder: a waiting run holds the host", started)]
    return WorkloadResult("ledger", rows, {"after_release_s": gaps, "kill_free_s": freed, "kill_start_s": started})
