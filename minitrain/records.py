"""Domain records shared by every layer (L0: stdlib only).

Records are frozen dataclasses (`ReportRecord`, made per report, is a named tuple): facts that cross a boundary (agent -> coordinator, worker ->
coordinator, coordinator -> trainer). Protobuf messages are converted to and from these in
`minitrain.rpc.convert` only; past that edge the code sees records.
"""

from __future__ import annotations

import enum
import json
import signal as _signal
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

from minitrain.run_state import RunState


class Phase(enum.IntEnum):
    """Where a worker was in its life when something happened (values match the proto enum)."""

    UNSPECIFIED = 0
    STARTUP = 1
    DIST_INIT = 2
    TRAINING = 3
    CHECKPOINT_UPLOAD = 4
    FINISHING = 5

    @property
    def description(self) -> str:
        """Human words for error messages: 'during process-group init'."""
        return _PHASE_WORDS[self]


_PHASE_WORDS = {
    Phase.UNSPECIFIED: "before it connected",
    Phase.STARTUP: "during start-up",
    Phase.DIST_INIT: "during process-group init",
    Phase.TRAINING: "during training",
    Phase.CHECKPOINT_UPLOAD: "during checkpoint upload",
    Phase.FINISHING: "while finishing",
}


def signal_name(signum: int) -> str:
    """'SIGKILL' for 9; 'signal 77' for a number with no name."""
    try:
        return _signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node as its agent described itself in its hello."""

    node_id: str
    hostname: str
    address: str  # the address other nodes and the coordinator reach this node by
    agent_pid: int
    cpus: int
    memory_bytes: int
    gpu_ids: tuple[int, ...] = ()
    python: str = ""
    minitrain_version: str = ""
    ifname: str = ""  # the interface holding `address` (for GLOO/NCCL_SOCKET_IFNAME)


@dataclass(frozen=True, slots=True)
class WorkerAssignment:
    """Where one rank runs in one attempt. Ranks are ordered by node, then local rank."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    node_id: str
    gpu_ids: tuple[int, ...] = ()  # indices into the node's CUDA_VISIBLE_DEVICES


class FailureKind(enum.Enum):
    """What failed. Set once where the failure is learned and carried, typed, to the error class the
    user catches (`errors.rebuild_exception`); protobuf never carries it (a worker only ever reports
    EXCEPTION, and rpc/convert.py says so)."""

    EXCEPTION = "exception"  # code in the worker raised; `exc_type` names the class -> that exception
    PROCESS = "process"  # the process died or could not start (exit code / signal) -> WorkerProcessError
    HANG = "hang"  # no progress for FailureConfig.worker_hang_timeout_s -> WorkerHangError
    NODE_LOST = "node_lost"  # the rank's node agent was lost -> NodeLostError
    COMMIT = "commit"  # the coordinator refused or could not commit the rank's report -> RemoteWorkerError


@dataclass(frozen=True, slots=True)
class WorkerFailure:
    """Everything known about one rank's failure; rendered by `errors.render_failures`.

    Either an exception was captured (`exc_type`, `message`, `traceback`), or the process died
    (`exit_code` / `signal`), or both (the worker reported its exception, then exited 1). `kind`
    says which error class the user gets.
    """

    rank: int
    node: str
    pid: int
    phase: Phase
    time: float
    exc_type: str = ""
    message: str = ""
    traceback: str = ""
    exit_code: int | None = None
    signal: int | None = None
    oom_suspected: bool = False
    consequence: bool = False  # known to be an effect of another rank's failure (e.g. stuck in a collective)
    kind: FailureKind = FailureKind.EXCEPTION

    @property
    def cause(self) -> str:
        """One line: 'ValueError: boom', 'killed by signal SIGKILL (9)' or 'exited with code 3'."""
        if self.exc_type:
            short = self.exc_type.rsplit(".", 1)[-1]
            return f"{short}: {self.message}" if self.message else short
        if self.signal:
            text = f"killed by signal {signal_name(self.signal)} ({self.signal})"
            if self.oom_suspected:
                text += ", likely by the out-of-memory killer (the cgroup's oom_kill counter rose)"
            return text
        if self.exit_code is not None:
            return f"exited with code {self.exit_code}"
        return "failed for an unknown reason"


class ReportRecord(NamedTuple):
    """One `report()` call of one rank, as received by the coordinator. `metrics_json` is the JSON
    object the worker sent; `metrics` parses it (at each access: take it once).

    A named tuple, and the metrics left as text, because the coordinator makes one per report of every
    rank: at thousands of ranks a frozen dataclass and an eager `json.loads` were most of the intake's
    cost per report, and only rank 0's metrics (and a round's, for the callbacks that ask) are read."""

    attempt: int
    rank: int
    round: int
    metrics_json: str
    reported_at: float
    checkpoint_dir_name: str = ""
    wants_ack: bool = False
    staged: bool = False  # uploaded to the staging area (minitrain.storage.layout.staged_dir), moved at commit
    wants_receipt: bool = False  # the rank waits for a ReportReceipt once this report is recorded
    in_tier: bool = False  # its files wait in the rank's node's memory tier (minitrain.storage.memory_tier)

    @property
    def metrics(self) -> dict:
        """The reported metrics (a new dict, parsed from `metrics_json`)."""
        return json.loads(self.metrics_json)


@dataclass(frozen=True, slots=True)
class RunEvent:
    """Base of the facts the controller consumes; see coordinator/facts/events.py for the kinds."""


@dataclass(frozen=True)
class RunPayload:
    """What every worker unpickles: the training function, its config, and the run's storage.

    `storage` is a `minitrain.storage.filesystem.Storage` (fsspec filesystems pickle), so workers upload to the
    same place the coordinator commits in. `datasets` maps each name of `TorchTrainer(datasets=...)`
    to a `minitrain.data.staging.ShardSpec` (small: large tables are staged, not pickled in here).
    `backend` is the worker's `minitrain.worker.backend.Backend` (torch.distributed's when None).
    """

    train_fn: Any
    config: Any
    takes_config: bool
    storage: Any
    datasets: Any = None
    backend: Any = None


@dataclass(frozen=True)
class PreemptionInfo:
    """An imminent preemption, as `minitrain.get_preemption_info()` returns it (Ray's
    `ray.train.PreemptionInfo`: the same constructor, fields and properties).

    `deadline_ms`: when the run stops at the latest (UNIX time in milliseconds: the first signal plus
    `FailureConfig.preemption_timeout_s`). `preempted_node_to_ranks`: each signalled node id -> the
    world ranks on it (every node of the attempt when the driver was signalled). minitrain extensions:
    `round`, the agreed round (this attempt's report count from which every rank sees the info: the
    round whose report should carry the checkpoint), and `signal`, the first signal's name."""

    deadline_ms: Optional[int]
    preempted_node_to_ranks: dict
    round: int = -1
    signal: str = ""

    @property
    def preempted_node_ids(self) -> list:
        """The preempted node ids, sorted."""
        return sorted(self.preempted_node_to_ranks)

    @property
    def preempted_ranks(self) -> list:
        """Every affected rank across the preempted nodes, sorted ascending."""
        return sorted({rank for ranks in self.preempted_node_to_ranks.values() for rank in ranks})


@dataclass(frozen=True)
class FailedAttempt:
    """One attempt of a run that ended with a failure, as the end-of-run summary groups them
    (`minitrain.errors.render_failed_attempts`) and `WorkerGroupError.failed_attempts` keeps them: the
    root cause's `host`, `rank`, `phase` and `cause` (its one line, as `WorkerFailure.cause`; no pid, so
    that the same failure in every attempt reads the same). `progressed`: the attempt committed a round
    beyond the furthest one committed before it; `charged`: the failure counted against `max_failures`
    (False for an elastic run's shrink after a lost node, which is a resize)."""

    attempt: int
    host: str
    rank: int
    phase: Phase
    cause: str
    progressed: bool = False
    charged: bool = True

    @property
    def what(self) -> str:
        """'rank 0 during training: RuntimeError: CUDA error': the failure, without its host."""
        return f"rank {self.rank} {self.phase.description}: {self.cause}"


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """What the coordinator hands back to the trainer when a run ends."""

    state: RunState  # SUCCEEDED | FAILED | ABORTED
    attempt: int
    last_metrics: dict | None  # rank 0's latest; every rank-0 report is in the run's metrics.jsonl
    failures: tuple[WorkerFailure, ...] = ()
    exceptions: dict = field(default_factory=dict)  # rank -> pickled exception, for WorkerGroupError
    error_message: str = ""
    return_value: bytes = b""  # rank 0's pickled return value
    # set when the run was preempted (ended ABORTED after a preemption signal): fit() raises PreemptionError
    preemption: Optional[PreemptionInfo] = None
    drain_timed_out: bool = False  # the preemption stopped the workers before every rank reached its round
    failed_attempts: tuple[FailedAttempt, ...] = ()  # every attempt that ended with a failure, in order
    # > 0 when the run stopped because that many attempts in a row failed without progress: NoProgressError
    no_progress: int = 0


@dataclass(frozen=True)
class GpuSample:
    """One GPU of a rank, as NVML saw it."""

    index: int
    util_percent: float
    memory_used_bytes: int
    memory_total_bytes: int


@dataclass(frozen=True)
class TelemetrySample:
    """One rank's telemetry sample (minitrain.worker.telemetry; at most one a second).

    `time` is the worker's wall clock; `reports` its report() calls in this attempt so far. Step time
    is the mean interval between report() calls; the waits are seconds per step blocked inside
    report(), in minitrain.collective and in the data iterators of prepare_data_loader and
    get_dataset_shard. None: not measured (data_wait_s: no such iterator was used). `gpus` is empty
    without a GPU. `total` is the number of report() calls the training function declared
    (minitrain.set_progress_total), or None. The worker's sampler makes one from its own figures
    (`attempt` and `rank` travel on its stream, not in the message); the coordinator's controller
    fills in `host`, `pid` and `phase` before its observers see it."""

    attempt: int
    rank: int
    time: float
    reports: int
    step_time_s: Optional[float] = None
    report_wait_s: Optional[float] = None
    collective_wait_s: Optional[float] = None
    data_wait_s: Optional[float] = None
    cpu_percent: Optional[float] = None
    rss_bytes: Optional[int] = None
    gpus: tuple[GpuSample, ...] = ()
    total: Optional[int] = None
    host: str = ""
    pid: int = 0
    phase: str = ""
