"""Warm spare workers: processes that already imported torch, waiting for their bootstrap line.

A restart spends most of its time starting Python and importing torch in each new worker. When the
run may restart, the agent keeps one spare per local slot, so the next attempt's workers are taken
ready-made and a restart costs a rendezvous instead of an interpreter start. Spares are started from
the agent's main thread (the parent-death signal follows the spawning thread) when the coordinator
says the attempt's start-up is over (so they never compete with it), and only for the environment
they were started with: a start with another environment or working directory discards them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Optional

from minitrain import procs

WORKER_ARGV = (sys.executable, "-m", "minitrain.worker")


def anonymous_file() -> int:
    """A read-write file descriptor with no name: nothing is left on disk, whoever dies first."""
    handle, path = tempfile.mkstemp(prefix="minitrain-stacks-")  # created 0600
    os.unlink(path)
    return handle


@dataclass
class Spare:
    """A started worker process waiting on stdin, and the stack-dump file it was given."""

    process: subprocess.Popen
    stack_fd: int


def start_worker(env: dict, cwd: Optional[str], preload: bool) -> Spare:
    """Start a worker process (optionally importing torch before it reads its bootstrap line)."""
    stack_fd = anonymous_file()
    argv = [*WORKER_ARGV, "--preload"] if preload else list(WORKER_ARGV)
    try:
        return Spare(procs.spawn(argv, env=env, cwd=cwd, pass_fds=(stack_fd,)), stack_fd)
    except BaseException:
        os.close(stack_fd)
        raise


@dataclass
class SparePool:
    """Spares for one (environment, working directory). Not thread-safe: main thread only."""

    key: Optional[tuple] = None
    spares: list = field(default_factory=list)
    wanted: int = 0
    env: dict = field(default_factory=dict)
    cwd: Optional[str] = None

    def take(self, key: tuple) -> Optional[Spare]:
        """A live spare started for `key`, or None (spares of another key are discarded)."""
        if key != self.key:
            self.clear()
            return None
        while self.spares:
            spare = self.spares.pop()
            if spare.process.poll() is None:
                return spare
            _discard(spare)
        return None

    def want(self, key: tuple, count: int, env: dict, cwd: Optional[str]) -> None:
        """Keep `count` spares for `key` from now on (see `refill`)."""
        if key != self.key:
            self.clear()
        self.key, self.wanted, self.env, self.cwd = key, count, env, cwd

    def refill(self) -> None:
        """Start missing spares; call from the agent's main thread."""
        if self.wanted <= len(self.spares):
            return
        while len(self.spares) < self.wanted:
            try:
                self.spares.append(start_worker(self.env, self.cwd, preload=True))
            except OSError:
                self.wanted = 0  # cannot start processes now: run without spares
                return

    def clear(self) -> None:
        """Stop every spare (their stdin closes: they exit; the group stop makes sure)."""
        for spare in self.spares:
            _discard(spare)
        self.spares.clear()
        self.key = None
        self.wanted = 0


def _discard(spare: Spare) -> None:
    for stream in (spare.process.stdin, spare.process.stdout, spare.process.stderr):
        if stream is not None:
            stream.close()
    procs.stop_process_group(spare.process, grace_s=0.0)
    os.close(spare.stack_fd)
