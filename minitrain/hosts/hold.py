"""A remote host's ledger, held over SSH (L1): ``python -m minitrain.hosts.hold`` and its handle.

A run's claim on a remote host must be held by a process on that host, for as long as the run lasts.
The driver starts this module there over SSH (`RemoteHost`), and it answers one JSON line per request
on stdin: ``{"op": "snapshot"}`` (the host's ledger now), ``{"op": "claim", "workers": n, "need":
{...}, "run": name, "lock_wait_s": s}`` (claim there, atomically, or answer that it does not fit, or
``{"busy": who}`` when another process held the ledger's lock for ``lock_wait_s``), ``{"op": "release"}``.
It holds its claim until its stdin ends: when the driver ends, or dies (SIGKILL included: its ssh
connection closes, sshd closes our stdin), the holder exits and the kernel drops the claim's lock.

``python -m minitrain.hosts.hold --snapshot`` prints the host's ledger once (``--status``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import subprocess
import sys
import threading
from typing import Any, Optional

from minitrain import knobs, procs
from minitrain.errors import LaunchError
from minitrain.hosts import hostinfo
from minitrain.hosts.cluster import ClusterConfig, HostSpec
from minitrain.hosts.demand import Need
from minitrain.hosts.gpus import Gpu, host_gpus
from minitrain.hosts.ledger import (LOCK_WAIT_S, Claim, HeldClaim, Ledger, LedgerBusyError, LedgerError, Snapshot,
                                    Totals)
from minitrain.hosts.ssh import remote_python_command, ssh_argv

_ANSWER_TIMEOUT_S = 60.0


def this_host_totals() -> Totals:
    """What this host has, looked up now (GPUs from NVML: their busy processes change)."""
    return Totals(host_gpus(), float(hostinfo.cpu_count()), hostinfo.memory_bytes())


def this_host_ledger(name: str) -> Ledger:
    """This host's ledger, where and as the knobs say; LedgerError when MINITRAIN_LEDGER_DIR=off here."""
    directory = knobs.LEDGER_DIR.get()
    if directory is None:
        raise LedgerError(f"host {name} has MINITRAIN_LEDGER_DIR=off: it keeps no resource ledger. Set it off in "
                          f"the driver too (no run then claims), or unset it on that host.")
    return Ledger(directory, host=name, foreign_taken=knobs.LEDGER_FOREIGN_GPUS.get() == "taken")


def snapshot_to_dict(snapshot: Snapshot) -> dict:
    return dataclasses.asdict(snapshot)


def snapshot_from_dict(data: dict) -> Snapshot:
    totals = data["totals"]
    gpus = tuple(Gpu(g["index"], g["uuid"], g["name"], tuple(g["busy_pids"]), g["entry"]) for g in totals["gpus"])
    claims = tuple(Claim(**{**c, "gpus": tuple(c["gpus"])}) for c in data["claims"])
    return Snapshot(data["host"], Totals(gpus, totals["cpus"], totals["memory_bytes"]), claims,
                    tuple(data["problems"]), data["foreign_taken"])


def serve(name: str, stdin=sys.stdin, stdout=sys.stdout) -> int:
    """Answer requests until stdin ends; release the claim then. See the module doc."""
    held: Optional[HeldClaim] = None

    def answer(message: dict) -> None:
        stdout.write(json.dumps(message) + "\n")
        stdout.flush()

    try:
        ledger = this_host_ledger(name)
    except LedgerError as exc:  # said to the driver, which raises it there
        answer({"error": str(exc)})
        return 1
    try:
        answer({"ready": True})
        for line in stdin:
            try:
                request = json.loads(line)
                op = request["op"]
                if op == "snapshot":
                    answer({"snapshot": snapshot_to_dict(ledger.snapshot(this_host_totals()))})
                elif op == "claim":
                    if held is not None:
                        held.release()
                    need = Need(**request["need"])
                    lock_wait_s = min(float(request.get("lock_wait_s", LOCK_WAIT_S)), LOCK_WAIT_S)
                    try:
                        held = ledger.claim(this_host_totals(), request["run"],
                                            lambda snap: need.claim_for(request["workers"], snap), lock_wait_s)
                    except LedgerBusyError as exc:  # the driver's wait goes on: not an error there
                        answer({"busy": str(exc)})
                        continue
                    answer({"claim": None if held is None else dataclasses.asdict(held.claim)})
                elif op == "release":
                    if held is not None:
                        held.release()
                        held = None
                    answer({"released": True})
                else:
                    answer({"error": f"unknown request {op!r}"})
            except Exception as exc:  # noqa: BLE001 - said to the driver, which raises it there
                answer({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        if held is not None:
            held.release()
    return 0


class RemoteHost:
    """The driver's handle on a remote host's ledger: a holder started over SSH (see the module doc)."""

    def __init__(self, host: HostSpec, cluster: ClusterConfig, pythonpath: tuple[str, ...] = ()):
        self.spec = host
        command = remote_python_command(cluster.resolved_python(), cluster.resolved_workdir(), pythonpath,
                                        ["-m", "minitrain.hosts.hold", "--host", host.name])
        self._process = procs.spawn(ssh_argv(host, cluster.ssh, command), env=os.environ)
        self._lines: queue.Queue = queue.Queue()
        self._tail: list[str] = []
        threading.Thread(target=self._read, daemon=True, name=f"minitrain-hold-{host.name}").start()
        self._stderr = threading.Thread(target=self._read_stderr, daemon=True, name=f"minitrain-hold-{host.name}-err")
        self._stderr.start()
        try:
            self._answer("ready")
        except BaseException:  # ssh could not start it there: reap what was started
            self.close()
            raise

    def _read(self) -> None:
        for raw in iter(self._process.stdout.readline, b""):
            self._lines.put(raw)
        self._lines.put(None)

    def _read_stderr(self) -> None:
        for raw in iter(self._process.stderr.readline, b""):
            self._tail = (self._tail + [raw.decode("utf-8", "replace").rstrip()])[-20:]

    def _answer(self, key: str) -> Any:
        try:
            raw = self._lines.get(timeout=_ANSWER_TIMEOUT_S)
        except queue.Empty:
            raw = None
        message = json.loads(raw) if raw else {}
        if "busy" in message:  # that host's ledger lock is held by another process: the run waits on
            raise LedgerBusyError(message["busy"])
        if key not in message:
            if not raw:  # it ended: its last words on stderr say why (ssh's, or a traceback's)
                self._stderr.join(timeout=2.0)
            why = message.get("error") or "it ended" + (": " + " / ".join(self._tail) if self._tail else "")
            raise LaunchError(f"the resource ledger of host {self.spec.name} did not answer ({why})")
        return message[key]

    def _ask(self, request: dict, key: str) -> Any:
        try:
            self._process.stdin.write(json.dumps(request).encode() + b"\n")
            self._process.stdin.flush()
        except OSError as exc:
            raise LaunchError(f"the resource ledger of host {self.spec.name} is gone ({exc})") from None
        return self._answer(key)

    def snapshot(self) -> Snapshot:
        return snapshot_from_dict(self._ask({"op": "snapshot"}, "snapshot"))

    def claim(self, workers: int, need: Need, run: str, lock_wait_s: float = LOCK_WAIT_S) -> Optional[Claim]:
        """What `workers` of `need` hold there now, or None; LedgerBusyError when its ledger lock stays held."""
        found = self._ask({"op": "claim", "workers": workers, "need": dataclasses.asdict(need), "run": run,
                           "lock_wait_s": lock_wait_s}, "claim")
        return None if found is None else Claim(**{**found, "gpus": tuple(found["gpus"])})

    def release(self) -> None:
        self._ask({"op": "release"}, "released")

    def close(self) -> None:
        """End the holder (its claim with it) and wait for it."""
        try:
            self._process.stdin.close()
        except OSError:
            pass
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            procs.stop_process_group(self._process, grace_s=1.0)


def main(argv: Optional[list[str]] = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m minitrain.hosts.hold")
    parser.add_argument("--host", default=None, help="this host's name as the driver knows it")
    parser.add_argument("--snapshot", action="store_true", help="print the ledger once as JSON and exit")
    args = parser.parse_args(argv)
    name = args.host or hostinfo.hostname()
    if args.snapshot:
        print(json.dumps(snapshot_to_dict(this_host_ledger(name).snapshot(this_host_totals()))))
        return 0
    return serve(name)


if __name__ == "__main__":
    sys.exit(main())
