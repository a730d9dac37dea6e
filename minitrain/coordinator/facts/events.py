"""The facts the controller consumes. Servicer threads create them; only the controller acts on them."""

from __future__ import annotations

from dataclasses import dataclass

from minitrain.coordinator.observers import TelemetrySample
from minitrain.records import NodeInfo, Phase, ReportRecord, RunEvent, WorkerFailure


@dataclass(frozen=True, slots=True)
class AgentConnected(RunEvent):
    """An agent opened its stream and said hello; `stream` numbers its streams."""

    node: NodeInfo
    stream: int = 0


@dataclass(frozen=True, slots=True)
class AgentLost(RunEvent):
    """An agent's stream ended or its heartbeats stopped."""

    node_id: str
    reason: str
    stream: int = 0


@dataclass(frozen=True, slots=True)
class ShardsPersisted(RunEvent):
    """The agent of `node_id` wrote the shards of `ranks` of checkpoint `dir_name` (attempt `attempt`)
    from its memory tier to the run's staging area; `error` (non-empty) when it gave up after retries."""

    node_id: str
    attempt: int
    dir_name: str
    ranks: tuple[int, ...]
    error: str = ""
    to_peer: str = ""  # set: the answer to a copy into that node's tier (a replica), not to storage


@dataclass(frozen=True, slots=True)
class ReplicaReady(RunEvent):
    """The agent of `node_id` takes replicas into its memory tier on `port` of its node's address."""

    node_id: str
    port: int


@dataclass(frozen=True, slots=True)
class NodeWarmed(RunEvent):
    """The agent of `node_id` (on its stream `stream`) answered a warm-up for a start: its fork server
    is `ready`, or there will be none (`detail` says why)."""

    node_id: str
    stream: int
    ready: bool
    detail: str = ""


@dataclass(frozen=True, slots=True)
class StackDumped(RunEvent):
    """An agent sent the thread stacks of one worker (empty when it did not answer)."""

    attempt: int
    rank: int
    text: str


@dataclass(frozen=True, slots=True)
class StacksWanted(RunEvent):
    """An observer asked for the stacks of `rank` of the current attempt (RunInfo.request_stacks)."""

    rank: int


@dataclass(frozen=True, slots=True)
class WorkerSpawned(RunEvent):
    """An agent started a worker process."""

    node_id: str
    attempt: int
    rank: int
    pid: int


@dataclass(frozen=True, slots=True)
class WorkerExited(RunEvent):
    """A worker process ended (seen by its agent after its output was drained)."""

    node_id: str
    attempt: int
    rank: int
    pid: int
    exit_code: int | None
    signal: int | None
    stopped_by_agent: bool
    time: float
    spawn_error: str = ""
    oom_suspected: bool = False


@dataclass(frozen=True, slots=True)
class WorkerConnected(RunEvent):
    """A worker opened its stream."""

    attempt: int
    rank: int
    pid: int
    hostname: str


@dataclass(frozen=True, slots=True)
class WorkerStreamClosed(RunEvent):
    """A worker's stream ended; every message it sent came before this event."""

    attempt: int
    rank: int


@dataclass(frozen=True, slots=True)
class StoreReady(RunEvent):
    """Rank 0 opened its TCPStore at address:port."""

    attempt: int
    address: str
    port: int


@dataclass(frozen=True, slots=True)
class WorkerPhaseChanged(RunEvent):
    """A worker entered a new phase."""

    attempt: int
    rank: int
    phase: Phase


@dataclass(frozen=True, slots=True)
class ReportsReceived(RunEvent):
    """report() calls, in the order they arrived: one of a direct stream, or the consecutive reports of
    one batch an agent relayed (any of its ranks, possibly of different attempts). One event per batch
    keeps the controller's work per event off the path of every report."""

    reports: tuple[ReportRecord, ...]


@dataclass(frozen=True, slots=True)
class TelemetryReceived(RunEvent):
    """A rank's telemetry sample (host, pid and phase still empty)."""

    attempt: int
    sample: TelemetrySample


@dataclass(frozen=True, slots=True)
class WorkerDone(RunEvent):
    """A worker's training function returned and its reports were flushed."""

    attempt: int
    rank: int
    reports: int = 0
    return_value: bytes = b""


@dataclass(frozen=True, slots=True)
class CheckpointsRequested(RunEvent):
    """A worker asked for the run's committed checkpoints, after its first `rounds` reports."""

    attempt: int
    rank: int
    request_id: int
    rounds: int = 0


@dataclass(frozen=True, slots=True)
class WorkerFailed(RunEvent):
    """A worker captured an exception; `exc_pickle` may rebuild it in the driver."""

    attempt: int
    failure: WorkerFailure
    exc_pickle: bytes


@dataclass(frozen=True, slots=True)
class Interrupted(RunEvent):
    """Ctrl-C reached the driver (`Controller.interrupt`, from its SIGINT handler)."""


@dataclass(frozen=True, slots=True)
class PreemptionSignalled(RunEvent):
    """A preemption signal reached the driver (`node_id` "") or the agent of `node_id`."""

    node_id: str
    signal: str
    time: float


@dataclass(frozen=True, slots=True)
class PreemptionSeen(RunEvent):
    """A rank read the preemption notice after it had made `rounds` reports in `attempt`."""

    attempt: int
    rank: int
    rounds: int
