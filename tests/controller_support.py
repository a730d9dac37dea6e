"""Named fakes for stepping the coordinator's shell in process (the real `Controller`, `CurrentAttempt`,
`Membership`, `WorkerGroup`, `Commits`, `Preemption`) without agents, workers or a server: what stands in
for the launcher's agent handles, for the controller's outbox, for a run observer and for the clock, and
builders of a real controller over a run directory in the test's tmp_path (new, or already training).
"""

from __future__ import annotations

import queue
import time
from typing import Callable, Mapping, Optional

from minitrain.config import CheckpointConfig, FailureConfig
from minitrain.coordinator.controller import Controller, LaunchSettings, RunSpec
from minitrain.coordinator.facts import events as ev
from minitrain.coordinator.facts.attempt import AttemptTracker
from minitrain.coordinator.facts.metrics_log import MetricsLog
from minitrain.coordinator.facts.worker_group import ResumePoint, WorkerGroup
from minitrain.coordinator.transport.service import Hub
from minitrain.records import NodeInfo, Phase, WorkerAssignment
from minitrain.storage.checkpoint_manager import CheckpointManager
from minitrain.storage.filesystem import Storage


class FakeAgents:
    """Stands in for the launcher's agent handles (`minitrain.coordinator.facts.membership.AgentHandles`,
    which `minitrain.hosts.launcher.LaunchedAgents` implements).

    `dead` (node_id -> why) are the agents whose process ended; a node in `relaunchable` can be given a new
    agent. Records the nodes relaunched (`relaunched`, every call, in order) and forgotten (`forgotten`). A
    forgotten node's agent is no longer reported dead, as the launcher stops it and expects its exit.
    """

    def __init__(self, dead: Optional[Mapping[str, str]] = None, relaunchable=()) -> None:
        self.dead: dict[str, str] = dict(dead or {})
        self.relaunchable: set[str] = set(relaunchable)
        self.relaunched: list[str] = []
        self.forgotten: list[str] = []

    def dead_agents(self) -> dict[str, str]:
        return dict(self.dead)

    def relaunch(self, node_id: str) -> bool:
        self.relaunched.append(node_id)
        return node_id in self.relaunchable

    def forget(self, node_id: str) -> None:
        self.forgotten.append(node_id)
        self.dead.pop(node_id, None)


class RecordingOutbox:
    """Stands in for the controller's `outbox`: the `Outbox` protocol (`minitrain.coordinator.facts.outbox`)
    that `minitrain.coordinator.transport.service.Hub` implements over gRPC.

    Keeps every command offered to it, whole and in order, in `sent`: ("agent", node_id, command),
    ("worker", (attempt, rank), command) or ("close", (attempt, rank), None). A stream named in `gone` (a node
    id, or an (attempt, rank)) has ended: a command to it is kept in `sent` but refused (False, as the Hub
    answers), and the views of what was delivered (`agent_kinds`, `worker_kinds`, `delivered`) leave it out.
    """

    def __init__(self, gone=()) -> None:
        self.sent: list[tuple[str, object, object]] = []
        self.gone: set = set(gone)
        self._refused: set[int] = set()  # indices in `sent` of the commands to a stream in `gone`

    def to_agent(self, node_id, command) -> bool:
        return self._offer("agent", node_id, command)

    def to_worker(self, attempt, rank, command) -> bool:
        return self._offer("worker", (attempt, rank), command)

    def close_worker(self, attempt, rank) -> None:
        self.sent.append(("close", (attempt, rank), None))

    def _offer(self, kind: str, address, command) -> bool:
        if address in self.gone:
            self._refused.add(len(self.sent))
        self.sent.append((kind, address, command))
        return address not in self.gone

    def take(self) -> list[tuple[str, object, object]]:
        """Everything offered since the last take (delivered or not), in order; then forgets it."""
        sent, self.sent, self._refused = self.sent, [], set()
        return sent

    def delivered(self, kind: str, what: type = object) -> list[tuple[object, object]]:
        """(address, command) of each command of type `what` delivered to a stream of `kind` ("agent" or
        "worker"), in order."""
        return [(address, command) for i, (k, address, command) in enumerate(self.sent)
                if k == kind and isinstance(command, what) and i not in self._refused]

    def agent_kinds(self, what: type) -> list:
        """The node ids that were delivered a command of type `what`, once per command, in order."""
        return [node_id for node_id, _ in self.delivered("agent", what)]

    def worker_kinds(self, what: type) -> list:
        """The (attempt, rank) of each worker that was delivered a command of type `what`, in order."""
        return [address for address, _ in self.delivered("worker", what)]

    @property
    def closed(self) -> list[tuple[int, int]]:
        """The (attempt, rank) of each worker stream closed, in order."""
        return [address for kind, address, _ in self.sent if kind == "close"]


class RecordingObserver:
    """Stands in for a run observer (`minitrain.coordinator.observers.RunObserver`): keeps every hook it is
    told in `calls`, in order, as (hook name, payload); a hook of more than one argument keeps their tuple."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def __getattr__(self, name):
        if not name.startswith("on_"):
            raise AttributeError(name)
        return lambda *args: self.calls.append((name, args[0] if len(args) == 1 else args))

    def named(self, name: str) -> list:
        """The payloads of the hook `name`, in the order told."""
        return [payload for hook, payload in self.calls if hook == name]


class FakeClock:
    """Stands in for `time.time` (the controller's `clock`): reads `now`, which moves only when the test
    moves it (`advance`, or setting `now`), or by `tick_s` before each read."""

    def __init__(self, now: float = 0.0, tick_s: float = 0.0) -> None:
        self.now = now
        self.tick_s = tick_s

    def __call__(self) -> float:
        self.now += self.tick_s
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def agent_node(node_id: str, **fields) -> NodeInfo:
    """The `NodeInfo` of an agent's hello: host `host-<node_id>` at 127.0.0.1, one CPU and 1 GiB, unless
    `fields` say otherwise."""
    values = dict(hostname=f"host-{node_id}", address="127.0.0.1", agent_pid=1, cpus=1, memory_bytes=1 << 30)
    values.update(fields)
    return NodeInfo(node_id=node_id, **values)


def run_storage(tmp_path) -> Storage:
    """The run directory `<tmp_path>/run`, created: where a run's checkpoints and metrics.jsonl go."""
    storage = Storage.for_run(str(tmp_path), "run")
    storage.makedirs()
    return storage


def make_controller(tmp_path, outbox, agents, *, events: Optional[queue.SimpleQueue] = None,
                    clock: Callable[[], float] = time.time, observers=(), payload: bytes = b"", cwd: str = "",
                    worker_env: Optional[Mapping[str, str]] = None, failure_limits=None, **spec) -> Controller:
    """A real `Controller` of run "r" over a fresh run directory in tmp_path (`run_storage`), whose workers
    would be told LaunchSettings("e", <the run directory>, `payload`, "gloo", 60 s, `cwd`, `worker_env`).
    `spec` holds the other `RunSpec` fields (num_workers and node_ids at least); `failure_limits` defaults to
    `FailureConfig()`; `events` is the queue the test plays events into (a new one if None)."""
    storage = run_storage(tmp_path)
    launch = LaunchSettings("e", storage.url(), payload, "gloo", 60.0, cwd, dict(worker_env or {}))
    run_spec = RunSpec(run_id="r", launch=launch, failure_limits=failure_limits or FailureConfig(), **spec)
    return Controller(run_spec, outbox, events if events is not None else queue.SimpleQueue(), agents,
                      CheckpointManager.load(storage, CheckpointConfig()), MetricsLog(storage), clock=clock,
                      observers=observers)


def training_controller(tmp_path, ranks: int, failure_limits, clock, observers=()):
    """A `make_controller` controller with one attempt of `ranks` ranks in training on node n0, every rank
    connected and starting up; it sends through the real (unconnected) `Hub`, with no agents and no server.
    Returns (controller, the attempt's tracker)."""
    nodes = {"n0": agent_node("n0", hostname="n0", cpus=ranks)}
    controller = make_controller(tmp_path, Hub(), None, clock=clock, observers=observers, num_workers=ranks,
                                 node_ids=("n0",), failure_limits=failure_limits)
    tracker = AttemptTracker.create(0, [WorkerAssignment(r, r, ranks, ranks, 0, "n0") for r in range(ranks)],
                                    {"n0": "n0"})
    for state in tracker.ranks.values():
        state.connected = state.stream_open = True
        state.phase = Phase.STARTUP
    controller._membership.connected(ev.AgentConnected(nodes["n0"]))
    controller._commits.start_attempt(ranks)
    controller._current.group = WorkerGroup(tracker, controller._outbox, nodes, controller._spec.launch,
                                            ResumePoint("", 0, ()), clock)
    return controller, tracker
