"""The coordinator's commands to node agents and workers, as frozen records (L0, stdlib only).

The coordinator's core (`WorkerGroup`, `Commits`, the controller) says what it wants done in these
records and hands them to its `minitrain.coordinator.facts.outbox.Outbox`; the gRPC `Hub` converts them to
protobuf in `minitrain.rpc.convert`. On the other side, the agent and the worker get the same records
back from `minitrain.rpc.convert`, so no runtime's core reads protobuf. They live below all three
runtimes because all three use them (runtimes never import each other).

Transport-only messages (heartbeats, relayed stream items, stream ends) are not commands: the
transport modules make and read them themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Union

from minitrain.records import Phase, WorkerAssignment

# ---------------------------------------------------------------------------- to node agents


@dataclass(frozen=True, slots=True)
class WorkerLaunch:
    """One worker an agent starts: its global and node-local rank."""

    rank: int
    local_rank: int


@dataclass(frozen=True, slots=True)
class Shard:
    """Rank `rank`'s files of checkpoint `dir_name`, reported in attempt `attempt`; `sources`: the
    "host:port" of agents whose tiers hold it (where an agent that lacks it fetches it)."""

    attempt: int
    rank: int
    dir_name: str
    sources: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Peer:
    """Another node's agent, and where its tier takes replicas (`ReplicaReady`)."""

    node_id: str
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class RestoreView:
    """The checkpoint a new attempt resumes from, made of `shards` (merged in that order): the agent
    builds its view from its memory tier before the workers start, when it holds every shard."""

    dir_name: str
    shards: tuple[Shard, ...]


@dataclass(frozen=True, slots=True)
class StartWorkers:
    """Start these workers of `attempt` in `cwd`, with `env` on top of the agent's environment (never
    secrets); `relay`: their streams go through the agent's relay, not straight to the coordinator.
    `coordinator_address`: the host:port they dial, "" for the agent's own coordinator address.
    `memory_tier_bytes`: the capacity of the node's memory tier (0: none; -1: the host's default, see
    `minitrain.storage.memory_tier.default_capacity`); `storage`: the run's `Storage`, pickled, where the
    agent persists its tier's shards; `restore`: what the workers resume from, if it may be in memory;
    `replicas`: the run has several nodes, so the tier takes other nodes' replicas (`ReplicaReady`)."""

    attempt: int
    workers: tuple[WorkerLaunch, ...]
    cwd: str
    env: Mapping[str, str]
    relay: bool = False
    coordinator_address: str = ""
    preemption_signals: tuple[str, ...] = ()  # names of the signals the agent turns into PreemptionSignal
    memory_tier_bytes: int = 0
    storage: bytes = b""
    restore: Optional[RestoreView] = None
    replicas: bool = False


@dataclass(frozen=True, slots=True)
class PersistShards:
    """Write these shards (`ranks` of checkpoint `dir_name` of `attempt`) from the memory tier to the
    run's staging area, or, with `to_peer`, into that agent's tier (a replica), after every PersistShards
    before it, and say when they are there."""

    attempt: int
    dir_name: str
    ranks: tuple[int, ...]
    to_peer: Optional[Peer] = None


@dataclass(frozen=True, slots=True)
class DropShards:
    """Remove these shards from the memory tier: no restart needs them and they are on storage (or lost)."""

    shards: tuple[Shard, ...]


@dataclass(frozen=True, slots=True)
class StopWorkers:
    """Stop the node's workers of `attempt`: SIGTERM, then SIGKILL after `grace_s` seconds."""

    attempt: int
    grace_s: float


@dataclass(frozen=True, slots=True)
class DumpStacks:
    """Send every thread's stack of each of the node's workers of `attempt` (faulthandler)."""

    attempt: int


@dataclass(frozen=True, slots=True)
class PrepareForkServers:
    """Keep a fork server warm for the next attempt's `count` workers: for the last start's environment,
    or, when `env` is given, for a start with `cwd` and `env` (as StartWorkers'; an elastic run warms a
    node that returned before it grows onto it)."""

    count: int
    env: Optional[Mapping[str, str]] = None
    cwd: str = ""


@dataclass(frozen=True, slots=True)
class Shutdown:
    """The run is over: stop every worker and exit. `preempted`: it ended preempted, so the next run of
    the job resumes; an agent that joined exits 143 then, asking its host (a pod's restart policy) to
    start it again for that resume, rather than 0 (a pod that succeeded is not restarted)."""

    reason: str
    preempted: bool = False


AgentCommand = Union[StartWorkers, StopWorkers, DumpStacks, PrepareForkServers, Shutdown, PersistShards, DropShards]

# ---------------------------------------------------------------------------- to workers


@dataclass(frozen=True, slots=True)
class Assignment:
    """What a worker is told after its hello: where it runs, how to reach its peers, and where the run
    stands (`initial_checkpoint_dir`: the latest committed checkpoint relative to the run directory, ""
    for none; `report_index_base`: the run-wide number of this attempt's round 0;
    `committed_dir_names`: names a new checkpoint must not reuse)."""

    worker: WorkerAssignment
    experiment_name: str
    backend: str  # gloo | nccl
    dist_timeout_s: float
    payload: bytes  # cloudpickle of (train function, config); see minitrain.worker.bootstrap
    store_address: str  # the address rank 0 binds its TCPStore to
    storage_path: str  # the run directory, as a URL or local path
    initial_checkpoint_dir: str = ""
    report_index_base: int = 0
    committed_dir_names: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """Where rank 0's TCPStore listens."""

    address: str
    port: int


@dataclass(frozen=True, slots=True)
class PhaseAck:
    """The coordinator recorded the worker's `phase` (it waits for this before running user code)."""

    phase: Phase


@dataclass(frozen=True, slots=True)
class ReportReceipt:
    """The coordinator recorded this worker's reports up to `round` (the report window's backpressure)."""

    round: int


@dataclass(frozen=True, slots=True)
class ReportAck:
    """Report `round` of this worker is recorded and its round committed (a checkpoint report waits)."""

    round: int


@dataclass(frozen=True, slots=True)
class CheckpointEntry:
    """One committed checkpoint: its directory name in the run directory and its metrics."""

    dir_name: str
    metrics: dict


@dataclass(frozen=True, slots=True)
class CheckpointList:
    """The answer to request `request_id`: the committed checkpoints kept, in retention order."""

    request_id: int
    checkpoints: tuple[CheckpointEntry, ...]


@dataclass(frozen=True, slots=True)
class Release:
    """Every rank of the attempt finished: rank 0 (which holds the TCPStore) may exit."""


@dataclass(frozen=True, slots=True)
class PreemptionNotice:
    """The run is preempted: say how many reports this rank has made (`PreemptionSeen`), and make no
    report past the next one until the agreed round is known (minitrain.worker.preemption)."""


@dataclass(frozen=True, slots=True)
class PreemptionRound:
    """The agreed round: `get_preemption_info()` is non-None once this rank made `round` reports.
    `node_ranks`: (node id, its ranks) of each preempted node; `deadline_ms`: UNIX ms; `signal`: the
    first signal's name."""

    round: int
    deadline_ms: int
    node_ranks: tuple[tuple[str, tuple[int, ...]], ...]
    signal: str


WorkerCommand = Union[Assignment, Rendezvous, PhaseAck, ReportReceipt, ReportAck, CheckpointList, Release,
                      PreemptionNotice, PreemptionRound]
