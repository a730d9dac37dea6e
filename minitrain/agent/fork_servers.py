"""Warm workers for fast restarts: a fork server that already imported torch.

A restart spends most of its time starting Python and importing torch in each new worker. When the
run may restart, the agent keeps one fork server (`minitrain.worker.fork_server`) for the environment and
working directory of the last start; the next attempt's workers are forked from it in milliseconds,
so a restart costs a rendezvous instead of an interpreter start, however many restarts come and
however soon after each other. The coordinator asks for it with each start that a restart may follow,
so it imports torch while the attempt's own workers do: a crash at start-up (the commonest kind)
finds it ready or nearly so. It says ready once torch.distributed is imported and forks from a quick
server while it imports the rest (see minitrain.worker.fork_server), so a restart never waits for
those slower imports. It is started from the agent's main thread (the parent-death signal follows
the spawning thread); a start with another environment or working directory discards it, and
without a fork server workers are spawned as usual. A fork server still importing is waited for:
it is ahead of a worker that would start importing now.
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Optional

from minitrain import procs
from minitrain.rpc.fork_protocol import FORK, MAX_FORKS_PER_REQUEST, READY, WARM

logger = logging.getLogger("minitrain.agent")

WORKER_ARGV = (sys.executable, "-m", "minitrain.worker")
READY_WAIT_S = 60.0  # a fork server still importing torch is waited for: it is ahead of a cold start
REPLY_WAIT_S = 10.0  # a fork takes milliseconds; this bounds a wedged server
MAX_SERVER_STARTS = 3  # per key: a server that keeps dying is given up, workers are spawned instead


def anonymous_file() -> int:
    """A read-write file descriptor with no name: nothing is left on disk, whoever dies first."""
    handle, path = tempfile.mkstemp(prefix="minitrain-stacks-")  # created 0600
    os.unlink(path)
    return handle


@dataclass
class StartedWorker:
    """A started worker process waiting on stdin, and the stack-dump file it was given."""

    process: object  # subprocess.Popen, or procs.AdoptedChild for a worker forked by the fork server
    stack_fd: int


def start_worker(env: dict, cwd: Optional[str]) -> StartedWorker:
    """Start a worker process the usual way (a new interpreter, waiting for its bootstrap line)."""
    stack_fd = anonymous_file()
    try:
        return StartedWorker(procs.spawn(WORKER_ARGV, env=env, cwd=cwd, pass_fds=(stack_fd,)), stack_fd)
    except BaseException:
        os.close(stack_fd)
        raise


class ForkServer:
    """One fork server process and the agent's end of its socket (see minitrain.worker.fork_server).

    The agent must be a subreaper (`procs.become_subreaper`): forked workers become its children.
    Not thread-safe: the agent's main thread only.
    """

    def __init__(self, env: dict, cwd: Optional[str]):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = procs.spawn([*WORKER_ARGV, "--fork-server", str(theirs.fileno())], env=env, cwd=cwd,
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=None,
                                       pass_fds=(theirs.fileno(),))
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._sock = ours
        self.ready = False  # it can fork workers (torch imported)
        self.warm = False  # and every preload is done: its workers pay for no import (fork_protocol.WARM)

    def alive(self) -> bool:
        """False once the server process exited (or was closed)."""
        return self._sock is not None and self.process.poll() is None

    def wait_ready(self, timeout_s: float) -> bool:
        """True once the server has finished its imports (waits up to `timeout_s` for it)."""
        if self.ready or not self.alive():
            return self.ready
        if self._receive(timeout_s) == READY:
            self.ready = True
        return self.ready

    def is_warm(self) -> bool:
        """True once the server finished every preload; never blocks. (Only between forks, which are
        synchronous: no fork's answer can be pending here.)"""
        if not self.warm and self.wait_ready(0.0):
            self._receive(0.0)  # takes the WARM datagram if it came
        return self.warm

    def fork_workers(self, count: int) -> list[Optional[StartedWorker]]:
        """`count` new workers forked from the server, each waiting for its bootstrap line, in one
        request per MAX_FORKS_PER_REQUEST (the server forks them side by side); None for each it could not
        fork (all when the server is not ready or fails: it is closed then, and the caller spawns them)."""
        started: list[Optional[StartedWorker]] = []
        while len(started) < count and self.alive():
            batch = self._fork_batch(min(count - len(started), MAX_FORKS_PER_REQUEST))
            started += batch
            if None in batch:
                break
        return started + [None] * (count - len(started))

    def _fork_batch(self, count: int) -> list[Optional[StartedWorker]]:
        if not self.wait_ready(READY_WAIT_S):
            self.close()
            return [None] * count
        slots = []  # (stdin_w, stdout_r, stderr_r, stack_fd) we keep; (stdin_r, stdout_w, stderr_w) we send
        try:
            for _ in range(count):
                stdin_r, stdin_w = os.pipe()
                stdout_r, stdout_w = os.pipe()
                stderr_r, stderr_w = os.pipe()
                slots.append(((stdin_w, stdout_r, stderr_r, anonymous_file()), (stdin_r, stdout_w, stderr_w)))
            try:
                socket.send_fds(self._sock, [FORK], [fd for ours, (i, o, e) in slots for fd in (i, o, e, ours[3])])
                reply = json.loads(self._receive(REPLY_WAIT_S) or b"{}")
            except (OSError, ValueError) as exc:
                reply = {"error": str(exc)}
            if not isinstance(reply, dict):
                reply = {"error": f"an answer that is not an object: {reply!r:.80}"}
        finally:
            for _, theirs in slots:
                for fd in theirs:
                    os.close(fd)  # the workers hold their own copies now
        answers = [a if isinstance(a, dict) else {"error": f"a bad answer {a!r:.40}"}
                   for a in (reply.get("workers") if isinstance(reply.get("workers"), list) else [])][:count]
        answers += [{"error": str(reply.get("error", "no answer"))}] * (count - len(answers))
        started: list[Optional[StartedWorker]] = []
        for (stdin_w, stdout_r, stderr_r, stack_fd), _theirs in slots:
            answer = answers[len(started)]
            if not isinstance(answer, dict) or not isinstance(answer.get("pid"), int):
                for fd in (stdin_w, stdout_r, stderr_r, stack_fd):
                    os.close(fd)
                started.append(None)
                continue
            child = procs.AdoptedChild(answer["pid"], stdin=os.fdopen(stdin_w, "wb"), stdout=os.fdopen(stdout_r, "rb"),
                                       stderr=os.fdopen(stderr_r, "rb"))
            started.append(StartedWorker(child, stack_fd))
        if None in started:
            why = next(a.get("error", "no answer") for a in answers if not isinstance(a.get("pid"), int))
            logger.warning("the fork server could not start %d of %d workers (%s); starting them the usual way",
                           started.count(None), count, why)
            self.close()
        return started

    def _receive(self, timeout_s: float) -> bytes:
        deadline = time.monotonic() + timeout_s
        while self.alive():
            ready, _, _ = select.select([self._sock], [], [], min(0.1, max(0.0, deadline - time.monotonic())))
            if ready:
                message = self._sock.recv(4096)
                if message == WARM:  # the preloads are done (it may come between any two answers)
                    self.warm = True
                    continue
                return message
            if time.monotonic() >= deadline:
                break
        return b""

    def close(self) -> None:
        """Stop the server (its socket closes: it exits; the group stop makes sure)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        procs.stop_process_group(self.process, grace_s=0.0)


@dataclass
class ForkServerPool:
    """The fork server for one (environment, working directory). Not thread-safe: main thread only."""

    key: Optional[tuple] = None
    wanted: bool = False
    env: dict = field(default_factory=dict)
    cwd: Optional[str] = None
    server: Optional[ForkServer] = None
    starts: int = 0

    def take(self, key: tuple, count: int = 1) -> list[Optional[StartedWorker]]:
        """`count` workers forked for `key` (see `ForkServer.fork_workers`); None for each the caller must
        spawn instead (all of them when there is no server for `key`: a server of another key is
        stopped)."""
        if key != self.key:
            self.clear()
            return [None] * count
        if self.server is None:
            return [None] * count
        started = self.server.fork_workers(count)
        if not self.server.alive():
            self.server = None
        return started

    def want(self, key: tuple, env: dict, cwd: Optional[str]) -> None:
        """Keep a fork server for `key` from now on (see `refill`)."""
        if key != self.key:
            self.clear()
            self.starts = 0
        self.key, self.wanted, self.env, self.cwd = key, True, env, cwd

    def refill(self) -> None:
        """Start the fork server when wanted and not running; call from the agent's main thread."""
        if not self.wanted or (self.server is not None and self.server.alive()):
            return
        if self.server is not None:
            self.server.close()
            self.server = None
        if self.starts >= MAX_SERVER_STARTS:
            return
        self.starts += 1
        try:
            self.server = ForkServer(self.env, self.cwd)
        except OSError as exc:
            logger.warning("could not start a fork server (%s); workers will be spawned", exc)
            self.wanted = False

    def readiness(self) -> Optional[tuple[bool, str]]:
        """Whether the wanted fork server forks fully warm workers: (True, "") once every import and
        preload is done (`ForkServer.is_warm`), (False, why) when there will be none (it could not be
        started, or kept dying), None while it still imports or is about to be started again
        (`refill`). Never blocks."""
        if not self.wanted:
            return False, "no fork server could be started"
        if self.server is not None and self.server.alive():
            return (True, "") if self.server.is_warm() else None
        if self.starts >= MAX_SERVER_STARTS:
            return False, f"its fork server exited {self.starts} times"
        return None

    def pids(self) -> list[int]:
        """The fork server's pid, if one runs (the agent must not reap it as an orphan)."""
        return [self.server.process.pid] if self.server is not None else []

    def clear(self) -> None:
        """Stop the fork server; nothing is wanted until `want` is called again."""
        if self.server is not None:
            self.server.close()
            self.server = None
        self.key = None
        self.wanted = False
