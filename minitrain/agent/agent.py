"""The node agent: holds its lease with the coordinator, runs that node's workers, reports facts.

The agent decides nothing about the run. It starts workers when told, stops them when told, and
reports what happened (spawned, exited with code or signal, their output lines). If its stream with
the coordinator breaks or goes silent past the lease timeout, it kills its workers and exits: no
worker outlives its coordinator. It never imports torch. Its workers' streams go through it: they
dial the agent's relay (minitrain.agent.transport.relay), whose messages share the agent's one stream.

This module supervises processes; the stream itself (the lease, heartbeats, the relay, protobuf) is
`minitrain.agent.transport.stream.CoordinatorStream`. The agent gets the coordinator's commands from it as the
records of `minitrain.commands` and reports its facts through its typed methods.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Mapping, Optional

import minitrain
from minitrain import commands as cmd
from minitrain import procs
from minitrain.agent.descendants import Descendants
from minitrain.agent.fork_servers import READY_WAIT_S, StartedWorker, ForkServerPool, start_worker
from minitrain.agent.tier_keeper import TierKeeper
from minitrain.agent.transport.stream import CoordinatorStream
from minitrain.hosts import hostinfo
from minitrain.lease import LEASE_TIMEOUT_S
from minitrain.records import NodeInfo

logger = logging.getLogger("minitrain.agent")

COMMAND_POLL_S = 0.2  # how often an idle command loop tends the fork server and reaps orphans
LOST_LEASE_GRACE_S = 1.0  # the coordinator is gone: nobody waits for a graceful stop
OUTPUT_DRAIN_S = 2.0  # a grandchild may hold a worker's pipe open; do not wait on it forever
STACK_DUMP_WAIT_S = 2.0


@dataclass
class WorkerProcess:
    """One worker the agent started."""

    attempt: int
    rank: int
    process: object  # subprocess.Popen, or procs.AdoptedChild when forked by the fork server
    readers: list = field(default_factory=list)
    stopped_by_agent: bool = False
    exited: threading.Event = field(default_factory=threading.Event)
    stack_fd: int = -1  # an unlinked file shared with the worker: its faulthandler writes there on SIGUSR1


class NodeAgent:
    """Runs one node's workers for one run; see the module docstring.

    `run()` returns the process exit code: 0 after the coordinator's Shutdown, 1 when the lease broke.
    `local_stream` ("local:<path>", the coordinator's socket on this machine): the agent's stream goes
    there instead of to `coordinator_address` over gRPC (`CoordinatorStream`).
    """

    def __init__(self, coordinator_address: str, node_id: str, run_id: str, token: str,
                 lease_timeout_s: float = LEASE_TIMEOUT_S, tls_cert: bytes = b"", local_stream: str = ""):
        self._address = coordinator_address
        self._node_id = node_id
        self._run_id = run_id
        self._token = token
        self._tls_cert = tls_cert  # the run's certificate (PEM) to pin; empty for a loopback coordinator
        self._stream = CoordinatorStream(coordinator_address, node_id, run_id, token, lease_timeout_s, tls_cert,
                                         local_address=local_stream)
        self._workers: dict[tuple[int, int], WorkerProcess] = {}
        self._lock = threading.Lock()
        self._signalled: Optional[str] = None  # set by a signal handler, without any lock (see note_signal)
        # Preemption signals (StartWorkers.preemption_signals): appended by their handler, sent by run()
        self._preemptions: list[tuple[str, float]] = []
        self._preemptions_sent = 0
        self._preemption_handlers: set[str] = set()
        self._parent_pid = os.getppid()
        self._oom_baseline = procs.oom_kill_count()
        self._fork_server = ForkServerPool()
        self._last_start: Optional[tuple] = None
        # When a warm-up for a start (PrepareForkServers with an environment) asked for its answer
        # (monotonic), until the answer went (`_answer_warm_up`) or workers were started here.
        self._warm_up_asked: Optional[float] = None
        # Held while a child is started (until it is in _workers or the fork server pool) and while
        # orphans are reaped or swept: the sweep must never take a child being started for a leftover.
        self._children_lock = threading.Lock()
        self._unexited: dict[int, int] = {}  # attempt -> its workers on this node that have not exited
        self._descendants: Optional[Descendants] = None  # made by run(): it may create cgroups
        # The node's memory tier (minitrain.agent.tier_keeper), and the replicas of other nodes' shards.
        self._tier = TierKeeper(self._stream.persisted, self._stream.replica_ready, token)

    def _node_info(self) -> NodeInfo:
        """This node as the hello describes it: its address is the one on its route to the coordinator."""
        coordinator_host = self._address.rsplit(":", 1)[0].strip("[]")
        address, ifname = hostinfo.route_to(coordinator_host)
        return NodeInfo(node_id=self._node_id, hostname=hostinfo.hostname(), address=address, ifname=ifname,
                         agent_pid=os.getpid(), cpus=hostinfo.cpu_count(),
                         memory_bytes=hostinfo.memory_bytes(), gpu_ids=hostinfo.gpu_ids(),
                         python=sys.executable, minitrain_version=minitrain.__version__)

    def run(self) -> int:
        """Serve the stream until Shutdown or lease loss, then stop every worker and return.

        Commands are executed on the calling (main) thread: workers get a parent-death signal, which
        Linux ties to the thread that spawned them, so they must come from a thread that lives as
        long as the agent.
        """
        # Workers forked by the fork server are re-parented to us: they are our children to wait for.
        procs.become_subreaper()
        node = self._node_info()
        self._tier.node_address = node.address
        # Daemons that workers start (their own sessions) are ended with their attempt: see descendants.py.
        self._descendants = Descendants(self._run_id, self._kept_children, self._children_lock)
        try:
            self._stream.open(node)  # the relay listens before any worker can start
        except BaseException:
            self._descendants.close()
            raise
        try:
            while self._serving():
                command = self._stream.next_command(timeout_s=COMMAND_POLL_S)
                self._send_preemptions()
                if command is not None:
                    self._execute(command)
                elif self._serving():  # idle (not woken by the stream's end): tend the children
                    self._refill_fork_server()
                    self._reap_orphans()
                self._answer_warm_up()
        finally:
            if self._signalled is not None:
                self.request_stop(self._signalled)
            self._fork_server.clear()
            self._stop_all(grace_s=2.0 if self._stream.shutdown is not None else LOST_LEASE_GRACE_S)
            self._tier.close()
            self._descendants.close()
            self._stream.close()  # after the workers: their streams' last messages and ends go up first
        if self._stream.shutdown is None:
            logger.warning("lease with the coordinator at %s ended (%s); workers stopped",
                           self._address, self._stream.end_reason)
            return 1
        return 0

    @property
    def preempted(self) -> bool:
        """The coordinator's Shutdown said the run ended preempted (it resumes on the next run)."""
        return self._stream.shutdown is not None and self._stream.shutdown.preempted

    @property
    def end_reason(self) -> str:
        """Why the stream with the coordinator ended ("" while it has not): what a joiner reports."""
        return self._stream.end_reason

    @property
    def signalled(self) -> Optional[str]:
        """"received SIGTERM" (or the signal's name) when a signal stopped the agent; else None."""
        return self._signalled

    def _serving(self) -> bool:
        return not self._stream.ended and self._signalled is None

    def request_stop(self, reason: str) -> None:
        """End the stream from another thread: workers are stopped, run() returns. Never from a signal
        handler (it takes a lock): use `note_signal` there."""
        self._stream.end(reason)

    def note_signal(self, name: str) -> None:
        """A signal asks the agent to stop; the command loop acts on it within one poll (0.2 s).

        Takes no lock: a Python signal handler runs on the main thread between two bytecodes, possibly
        while that thread holds the very lock it would take. Event.set() there deadlocked an agent whose
        driver was SIGKILLed: SIGTERM (the parent-death signal) and SIGHUP came together, the second
        handler ran inside the first one's Event.set(), and the agent never exited."""
        if self._signalled is None:
            self._signalled = f"received {name}"

    def note_preemption(self, signum: int) -> None:
        """A preemption signal's handler: remember it and wake the command loop, which tells the
        coordinator (`_send_preemptions`). Nothing else happens here: no lock, no I/O, no stop (the
        coordinator decides). A SIGTERM after the agent's parent died is the parent-death signal,
        not a preemption: it stops the agent as before."""
        name = signal.Signals(signum).name
        if signum == signal.SIGTERM and os.getppid() != self._parent_pid:
            self.note_signal(name)
            return
        self._preemptions.append((name, time.time()))
        self._stream.wake()

    def _send_preemptions(self) -> None:
        while self._preemptions_sent < len(self._preemptions):
            name, received_at = self._preemptions[self._preemptions_sent]
            self._preemptions_sent += 1
            logger.warning("received %s: telling the coordinator the node is preempted", name)
            self._stream.preemption(name, received_at)

    def _install_preemption_handlers(self, names: tuple[str, ...]) -> None:
        """From the run's first StartWorkers on (the main thread runs commands), the run's preemption
        signals are reported, not obeyed; before that there are no workers whose work could be saved."""
        for name in names:
            if name not in self._preemption_handlers:
                self._preemption_handlers.add(name)
                signal.signal(signal.Signals[name], lambda signum, _frame: self.note_preemption(signum))

    def _execute(self, command: cmd.AgentCommand) -> None:
        """Act on one of the coordinator's commands (a Shutdown never comes here: it ends the stream)."""
        if isinstance(command, cmd.StartWorkers):
            self._install_preemption_handlers(command.preemption_signals)
            self._start_workers(command)
        elif isinstance(command, cmd.StopWorkers):
            # Stopping waits out the grace period; do it aside so commands keep flowing.
            threading.Thread(target=self._stop_attempt, args=(command.attempt, command.grace_s),
                             daemon=True, name="agent-stop").start()
        elif isinstance(command, cmd.PrepareForkServers) and command.env is not None:
            key, env = self._worker_env(command.env, command.cwd)
            self._fork_server.want(key, env, command.cwd or None)
            self._refill_fork_server()
            self._warm_up_asked = time.monotonic()
        elif isinstance(command, cmd.PrepareForkServers) and self._last_start is not None:
            key, env, cwd = self._last_start
            self._fork_server.want(key, env, cwd)
            self._refill_fork_server()
        elif isinstance(command, cmd.PersistShards):
            self._tier.persist(command)
        elif isinstance(command, cmd.DropShards):
            self._tier.drop(command)
        elif isinstance(command, cmd.DumpStacks):
            threading.Thread(target=self._dump_stacks, args=(command.attempt,),
                             daemon=True, name="agent-dump-stacks").start()

    def _answer_warm_up(self) -> None:
        """Once the fork server a warm-up asked for is ready, or will not be (or is not within
        READY_WAIT_S, as long as a start would wait for it), say so to the coordinator: an elastic run
        grows onto this node only then (docs/elastic.md)."""
        if self._warm_up_asked is None:
            return
        answer = self._fork_server.readiness()
        if answer is None and time.monotonic() - self._warm_up_asked >= READY_WAIT_S:
            answer = (False, f"its fork server was not ready within {READY_WAIT_S:g} s")
        if answer is not None:
            self._warm_up_asked = None
            self._stream.warmed(*answer)

    def _refill_fork_server(self) -> None:
        with self._children_lock:
            self._fork_server.refill()

    def _kept_children(self) -> set[int]:
        """Our children that are not leftovers: workers not yet reaped, and the fork server."""
        with self._lock:
            workers = {w.process.pid for w in self._workers.values() if w.process.returncode is None}
        return workers | set(self._fork_server.pids())

    def _reap_orphans(self) -> None:
        """As a subreaper we adopt orphans (a dead worker's leftover children): reap the dead ones
        that nobody else waits for."""
        with self._children_lock:
            procs.reap_orphans(self._kept_children())

    # ------------------------------------------------------------------ workers

    @staticmethod
    def _worker_env(start_env: Mapping[str, str], cwd: str) -> tuple[tuple, dict]:
        """The workers' environment for a start with `start_env` in `cwd`, and the fork server key of
        that start (a fork server serves only starts with the same key)."""
        env = dict(os.environ)
        env.update(start_env)
        if "CUDA_VISIBLE_DEVICES" in start_env:  # ids of our gpu_ids: UUID lists need them mapped back
            env["CUDA_VISIBLE_DEVICES"] = hostinfo.workers_visible_devices(start_env["CUDA_VISIBLE_DEVICES"])
        env["PYTHONUNBUFFERED"] = "1"
        return (tuple(sorted(env.items())), cwd), env

    def _start_workers(self, start: cmd.StartWorkers) -> None:
        self._warm_up_asked = None  # the start came: it takes the fork server as it is
        key, env = self._worker_env(start.env, start.cwd)
        with self._lock:
            live = frozenset(self._unexited)
        tier = self._tier.configure(start, live)
        view = self._tier.restore(start.attempt, start.restore)
        checkpoints = {}
        if tier is not None:
            checkpoints["memory_tier"] = {"root": tier.root, "capacity": tier.capacity}
        if view is not None:
            checkpoints["restore"] = {"dir_name": view[0], "path": view[1]}
        with self._lock:
            self._unexited[start.attempt] = self._unexited.get(start.attempt, 0) + len(start.workers)
        with self._children_lock:  # from the forks until every worker is known (see _kept_children)
            # One request for all the local ranks: the fork server forks them side by side.
            forked = self._fork_server.take(key, len(start.workers))
            workers = [self._adopt(start, launch, started, env) for launch, started in zip(start.workers, forked)]
        for launch, worker in zip(start.workers, workers):
            if worker is not None:
                self._bootstrap(start, launch, worker, checkpoints)
        self._last_start = (key, env, start.cwd or None)

    def _adopt(self, start: cmd.StartWorkers, launch: cmd.WorkerLaunch, started: Optional[StartedWorker],
               env: dict) -> Optional[WorkerProcess]:
        """Rank `launch.rank`'s process: the forked one, else spawned now; None (its exit reported) when it
        could not be started. Called under the children lock, so the worker is known before it is reaped."""
        attempt, rank = start.attempt, launch.rank
        if started is None:
            try:
                started = start_worker(env, start.cwd or None)
            except OSError as exc:
                self._send_exit(attempt, rank, 0, None, exc=exc)
                self._worker_gone(attempt)
                return None
        worker = WorkerProcess(attempt, rank, started.process, stack_fd=started.stack_fd)
        with self._lock:
            self._workers[(attempt, rank)] = worker
        return worker

    def _bootstrap(self, start: cmd.StartWorkers, launch: cmd.WorkerLaunch, worker: WorkerProcess,
                   checkpoints: dict) -> None:
        """Put the new worker into its attempt's cgroup, write its bootstrap line, watch its output and exit.
        `checkpoints`: the node's memory tier and the view to restore from, when there are."""
        attempt, rank = start.attempt, launch.rank
        process, stack_fd = worker.process, worker.stack_fd
        if self._descendants is not None:
            # Before the bootstrap line: the worker runs no user code, so it has started nothing yet.
            self._descendants.add_worker(process.pid, attempt)
        if start.relay:  # our relay: a local socket, plaintext (minitrain.agent.transport.relay)
            coordinator, tls_cert = self._stream.relay_address, ""
        else:  # a direct stream to the coordinator
            coordinator = start.coordinator_address or self._address
            tls_cert = self._tls_cert.decode("ascii")
        bootstrap = {"coordinator": coordinator, "token": self._token, "tls_cert": tls_cert,
                     "run_id": self._run_id, "attempt": attempt, "rank": rank, "node_id": self._node_id,
                     "agent_pid": os.getpid(), "stack_fd": stack_fd,
                     # A scheduler may signal every process of the node (Slurm's --signal reaches the
                     # whole job step): the agent reports the run's preemption signals, the workers must
                     # not die of them. SIGTERM stays: it is how an agent stops its workers.
                     "ignore_signals": [name for name in start.preemption_signals if name != "SIGTERM"],
                     **checkpoints}
        try:
            process.stdin.write(json.dumps(bootstrap).encode() + b"\n")
            process.stdin.close()
        except OSError:
            pass  # it died already; the waiter reports how
        for stream, is_stderr in ((process.stdout, False), (process.stderr, True)):
            reader = threading.Thread(target=self._forward_output, args=(worker, stream, is_stderr),
                                      daemon=True, name=f"worker-{rank}-{'err' if is_stderr else 'out'}")
            reader.start()
            worker.readers.append(reader)
        self._stream.spawned(attempt, rank, process.pid)
        threading.Thread(target=self._wait_for_exit, args=(worker,), daemon=True,
                         name=f"worker-{rank}-wait").start()

    def _forward_output(self, worker: WorkerProcess, stream, is_stderr: bool) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            self._stream.log_line(worker.attempt, worker.rank, is_stderr, line)
        stream.close()

    def _wait_for_exit(self, worker: WorkerProcess) -> None:
        returncode = worker.process.wait()
        exited_at = time.time()  # before draining output: the root-cause order depends on it
        for reader in worker.readers:
            reader.join(timeout=OUTPUT_DRAIN_S)
        # Leftovers of its process group (e.g. DataLoader children) must not outlive the worker.
        procs.stop_process_group(worker.process, grace_s=0.0)
        os.close(worker.stack_fd)
        if self._worker_gone(worker.attempt) and self._descendants is not None:
            # The attempt's last worker here: what its workers started in sessions of their own
            # must not outlive it (a daemon keeping a port). Before this exit is reported, so the
            # next attempt never starts beside them.
            self._descendants.end_attempt(worker.attempt)
        self._send_exit(worker.attempt, worker.rank, worker.process.pid, returncode,
                        stopped=worker.stopped_by_agent, exited_at=exited_at)
        worker.exited.set()

    def _worker_gone(self, attempt: int) -> bool:
        """Count one worker of `attempt` as exited; True when it was the attempt's last one here."""
        with self._lock:
            self._unexited[attempt] -= 1
            if self._unexited[attempt] > 0:
                return False
            del self._unexited[attempt]
            return True

    def _send_exit(self, attempt: int, rank: int, pid: int, returncode: Optional[int],
                   stopped: bool = False, exc: Optional[BaseException] = None,
                   exited_at: Optional[float] = None) -> None:
        exit_code, signum = procs.decode_returncode(returncode) if returncode is not None else (None, None)
        oom = False
        if signum == signal.SIGKILL and not stopped:
            count = procs.oom_kill_count()
            oom = count is not None and self._oom_baseline is not None and count > self._oom_baseline
        self._stream.exited(attempt, rank, pid, exit_code=exit_code, signal=signum, stopped_by_agent=stopped,
                            exited_at=exited_at if exited_at is not None else time.time(),
                            spawn_error=f"{type(exc).__name__}: {exc}" if exc else "", oom_suspected=oom)

    def _dump_stacks(self, attempt: int) -> None:
        """Ask every worker of the attempt for all its threads' stacks (faulthandler on SIGUSR1)."""
        with self._lock:
            targets = [w for (a, _), w in self._workers.items() if a == attempt and not w.exited.is_set()]
        sizes = {}
        for worker in targets:
            sizes[worker.rank] = _size(worker.stack_fd)
            try:
                os.kill(worker.process.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        for worker in targets:
            text = _read_when_settled(worker.stack_fd, sizes[worker.rank], STACK_DUMP_WAIT_S)
            self._stream.stack_dump(attempt, worker.rank, text)

    def _stop_attempt(self, attempt: int, grace_s: float) -> None:
        with self._lock:
            targets = [w for (a, _), w in self._workers.items() if a == attempt]
        self._stop(targets, grace_s)

    def _stop_all(self, grace_s: float) -> None:
        with self._lock:
            targets = list(self._workers.values())
        self._stop(targets, grace_s)
        for worker in targets:
            worker.exited.wait(timeout=OUTPUT_DRAIN_S)

    def _stop(self, workers: list[WorkerProcess], grace_s: float) -> None:
        """Stop the workers in parallel; each: SIGTERM its group, grace, SIGKILL, bounded wait."""
        threads = []
        for worker in workers:
            if procs.has_exited(worker.process.pid):
                # It is dying or dead on its own (peers that saw its sockets close are why we were
                # told to stop): that exit is a fact to report, not our doing.
                continue
            worker.stopped_by_agent = True
            thread = threading.Thread(target=procs.stop_process_group, args=(worker.process,),
                                      kwargs={"grace_s": grace_s}, daemon=True)
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join(timeout=grace_s + 10)


def _size(fd: int) -> int:
    try:
        return os.fstat(fd).st_size
    except OSError:
        return 0


def _read_when_settled(fd: int, start: int, timeout_s: float) -> str:
    """The bytes a worker appended after `start`, once they stop growing (bounded wait).

    A stopped (SIGSTOP) or kernel-blocked process never writes: the result is then empty.
    """
    deadline = time.monotonic() + timeout_s
    last = start
    settled_since = None
    while time.monotonic() < deadline:
        size = _size(fd)
        if size > start and size == last:
            settled_since = settled_since or time.monotonic()
            if time.monotonic() - settled_since > 0.1:
                break
        else:
            settled_since = None
        last = size
        time.sleep(0.02)
    try:
        return os.pread(fd, max(_size(fd) - start, 0), start).decode("utf-8", "replace")
    except OSError:
        return ""


def install_signal_handlers(agent: NodeAgent) -> None:
    """SIGTERM, SIGINT and SIGHUP stop the workers and end the agent cleanly."""
    def handle(signum, _frame):
        agent.note_signal(signal.Signals(signum).name)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, handle)


def default_node_id() -> str:
    """A node id for an agent started by hand: the host name."""
    return socket.gethostname()
