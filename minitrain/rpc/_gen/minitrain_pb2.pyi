from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Phase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PHASE_UNSPECIFIED: _ClassVar[Phase]
    PHASE_STARTUP: _ClassVar[Phase]
    PHASE_DIST_INIT: _ClassVar[Phase]
    PHASE_TRAINING: _ClassVar[Phase]
    PHASE_CHECKPOINT_UPLOAD: _ClassVar[Phase]
    PHASE_FINISHING: _ClassVar[Phase]
PHASE_UNSPECIFIED: Phase
PHASE_STARTUP: Phase
PHASE_DIST_INIT: Phase
PHASE_TRAINING: Phase
PHASE_CHECKPOINT_UPLOAD: Phase
PHASE_FINISHING: Phase

class AgentMessage(_message.Message):
    __slots__ = ("run_id", "node_id", "sent_at", "hello", "heartbeat", "spawned", "exited", "logs", "stack_dump", "relayed", "preemption", "warmed", "batch", "persisted", "replica")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    SPAWNED_FIELD_NUMBER: _ClassVar[int]
    EXITED_FIELD_NUMBER: _ClassVar[int]
    LOGS_FIELD_NUMBER: _ClassVar[int]
    STACK_DUMP_FIELD_NUMBER: _ClassVar[int]
    RELAYED_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_FIELD_NUMBER: _ClassVar[int]
    WARMED_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    PERSISTED_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    node_id: str
    sent_at: float
    hello: AgentHello
    heartbeat: Heartbeat
    spawned: WorkerSpawned
    exited: WorkerExited
    logs: LogLines
    stack_dump: StackDump
    relayed: RelayedUp
    preemption: PreemptionSignal
    warmed: WarmedUp
    batch: AgentBatch
    persisted: ShardsPersisted
    replica: ReplicaReady
    def __init__(self, run_id: _Optional[str] = ..., node_id: _Optional[str] = ..., sent_at: _Optional[float] = ..., hello: _Optional[_Union[AgentHello, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., spawned: _Optional[_Union[WorkerSpawned, _Mapping]] = ..., exited: _Optional[_Union[WorkerExited, _Mapping]] = ..., logs: _Optional[_Union[LogLines, _Mapping]] = ..., stack_dump: _Optional[_Union[StackDump, _Mapping]] = ..., relayed: _Optional[_Union[RelayedUp, _Mapping]] = ..., preemption: _Optional[_Union[PreemptionSignal, _Mapping]] = ..., warmed: _Optional[_Union[WarmedUp, _Mapping]] = ..., batch: _Optional[_Union[AgentBatch, _Mapping]] = ..., persisted: _Optional[_Union[ShardsPersisted, _Mapping]] = ..., replica: _Optional[_Union[ReplicaReady, _Mapping]] = ...) -> None: ...

class ShardsPersisted(_message.Message):
    __slots__ = ("attempt", "dir_name", "ranks", "error", "to_peer")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DIR_NAME_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TO_PEER_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    dir_name: str
    ranks: _containers.RepeatedScalarFieldContainer[int]
    error: str
    to_peer: str
    def __init__(self, attempt: _Optional[int] = ..., dir_name: _Optional[str] = ..., ranks: _Optional[_Iterable[int]] = ..., error: _Optional[str] = ..., to_peer: _Optional[str] = ...) -> None: ...

class ReplicaReady(_message.Message):
    __slots__ = ("port",)
    PORT_FIELD_NUMBER: _ClassVar[int]
    port: int
    def __init__(self, port: _Optional[int] = ...) -> None: ...

class AgentBatch(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[AgentMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[AgentMessage, _Mapping]]] = ...) -> None: ...

class WarmedUp(_message.Message):
    __slots__ = ("ready", "detail")
    READY_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    detail: str
    def __init__(self, ready: _Optional[bool] = ..., detail: _Optional[str] = ...) -> None: ...

class PreemptionSignal(_message.Message):
    __slots__ = ("signal", "received_at")
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_AT_FIELD_NUMBER: _ClassVar[int]
    signal: str
    received_at: float
    def __init__(self, signal: _Optional[str] = ..., received_at: _Optional[float] = ...) -> None: ...

class RelayedUp(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[RelayedMessage]
    def __init__(self, items: _Optional[_Iterable[_Union[RelayedMessage, _Mapping]]] = ...) -> None: ...

class RelayedMessage(_message.Message):
    __slots__ = ("stream", "message", "closed", "digest")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    stream: int
    message: WorkerMessage
    closed: bool
    digest: ReportDigest
    def __init__(self, stream: _Optional[int] = ..., message: _Optional[_Union[WorkerMessage, _Mapping]] = ..., closed: _Optional[bool] = ..., digest: _Optional[_Union[ReportDigest, _Mapping]] = ...) -> None: ...

class ReportDigest(_message.Message):
    __slots__ = ("stream", "attempt", "rank", "round", "reported_at", "metrics_json", "wants_ack", "wants_receipt")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    REPORTED_AT_FIELD_NUMBER: _ClassVar[int]
    METRICS_JSON_FIELD_NUMBER: _ClassVar[int]
    WANTS_ACK_FIELD_NUMBER: _ClassVar[int]
    WANTS_RECEIPT_FIELD_NUMBER: _ClassVar[int]
    stream: _containers.RepeatedScalarFieldContainer[int]
    attempt: _containers.RepeatedScalarFieldContainer[int]
    rank: _containers.RepeatedScalarFieldContainer[int]
    round: _containers.RepeatedScalarFieldContainer[int]
    reported_at: _containers.RepeatedScalarFieldContainer[float]
    metrics_json: _containers.RepeatedScalarFieldContainer[str]
    wants_ack: _containers.RepeatedScalarFieldContainer[bool]
    wants_receipt: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, stream: _Optional[_Iterable[int]] = ..., attempt: _Optional[_Iterable[int]] = ..., rank: _Optional[_Iterable[int]] = ..., round: _Optional[_Iterable[int]] = ..., reported_at: _Optional[_Iterable[float]] = ..., metrics_json: _Optional[_Iterable[str]] = ..., wants_ack: _Optional[_Iterable[bool]] = ..., wants_receipt: _Optional[_Iterable[bool]] = ...) -> None: ...

class StackDump(_message.Message):
    __slots__ = ("attempt", "rank", "text")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    rank: int
    text: str
    def __init__(self, attempt: _Optional[int] = ..., rank: _Optional[int] = ..., text: _Optional[str] = ...) -> None: ...

class AgentHello(_message.Message):
    __slots__ = ("hostname", "pid", "minitrain_version", "python", "cpus", "memory_bytes", "gpu_ids", "address", "ifname")
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    MINITRAIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    PYTHON_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_IDS_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    IFNAME_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    pid: int
    minitrain_version: str
    python: str
    cpus: int
    memory_bytes: int
    gpu_ids: _containers.RepeatedScalarFieldContainer[int]
    address: str
    ifname: str
    def __init__(self, hostname: _Optional[str] = ..., pid: _Optional[int] = ..., minitrain_version: _Optional[str] = ..., python: _Optional[str] = ..., cpus: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., gpu_ids: _Optional[_Iterable[int]] = ..., address: _Optional[str] = ..., ifname: _Optional[str] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("sent_at",)
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    sent_at: float
    def __init__(self, sent_at: _Optional[float] = ...) -> None: ...

class WorkerSpawned(_message.Message):
    __slots__ = ("attempt", "rank", "pid")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    rank: int
    pid: int
    def __init__(self, attempt: _Optional[int] = ..., rank: _Optional[int] = ..., pid: _Optional[int] = ...) -> None: ...

class WorkerExited(_message.Message):
    __slots__ = ("attempt", "rank", "pid", "exit_code", "signal", "stopped_by_agent", "exited_at", "spawn_error", "oom_suspected")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    STOPPED_BY_AGENT_FIELD_NUMBER: _ClassVar[int]
    EXITED_AT_FIELD_NUMBER: _ClassVar[int]
    SPAWN_ERROR_FIELD_NUMBER: _ClassVar[int]
    OOM_SUSPECTED_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    rank: int
    pid: int
    exit_code: int
    signal: int
    stopped_by_agent: bool
    exited_at: float
    spawn_error: str
    oom_suspected: bool
    def __init__(self, attempt: _Optional[int] = ..., rank: _Optional[int] = ..., pid: _Optional[int] = ..., exit_code: _Optional[int] = ..., signal: _Optional[int] = ..., stopped_by_agent: _Optional[bool] = ..., exited_at: _Optional[float] = ..., spawn_error: _Optional[str] = ..., oom_suspected: _Optional[bool] = ...) -> None: ...

class LogLines(_message.Message):
    __slots__ = ("attempt", "rank", "stderr", "lines")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    rank: int
    stderr: bool
    lines: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, attempt: _Optional[int] = ..., rank: _Optional[int] = ..., stderr: _Optional[bool] = ..., lines: _Optional[_Iterable[str]] = ...) -> None: ...

class AgentCommand(_message.Message):
    __slots__ = ("start", "stop", "heartbeat", "shutdown", "dump_stacks", "prepare_fork_servers", "relayed", "persist", "drop")
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    SHUTDOWN_FIELD_NUMBER: _ClassVar[int]
    DUMP_STACKS_FIELD_NUMBER: _ClassVar[int]
    PREPARE_FORK_SERVERS_FIELD_NUMBER: _ClassVar[int]
    RELAYED_FIELD_NUMBER: _ClassVar[int]
    PERSIST_FIELD_NUMBER: _ClassVar[int]
    DROP_FIELD_NUMBER: _ClassVar[int]
    start: StartWorkers
    stop: StopWorkers
    heartbeat: Heartbeat
    shutdown: Shutdown
    dump_stacks: DumpStacks
    prepare_fork_servers: PrepareForkServers
    relayed: RelayedDown
    persist: PersistShards
    drop: DropShards
    def __init__(self, start: _Optional[_Union[StartWorkers, _Mapping]] = ..., stop: _Optional[_Union[StopWorkers, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., shutdown: _Optional[_Union[Shutdown, _Mapping]] = ..., dump_stacks: _Optional[_Union[DumpStacks, _Mapping]] = ..., prepare_fork_servers: _Optional[_Union[PrepareForkServers, _Mapping]] = ..., relayed: _Optional[_Union[RelayedDown, _Mapping]] = ..., persist: _Optional[_Union[PersistShards, _Mapping]] = ..., drop: _Optional[_Union[DropShards, _Mapping]] = ...) -> None: ...

class RelayedDown(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[RelayedCommand]
    def __init__(self, items: _Optional[_Iterable[_Union[RelayedCommand, _Mapping]]] = ...) -> None: ...

class RelayedCommand(_message.Message):
    __slots__ = ("stream", "command", "close")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    stream: int
    command: WorkerCommand
    close: bool
    def __init__(self, stream: _Optional[int] = ..., command: _Optional[_Union[WorkerCommand, _Mapping]] = ..., close: _Optional[bool] = ...) -> None: ...

class PersistShards(_message.Message):
    __slots__ = ("attempt", "dir_name", "ranks", "to_peer")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DIR_NAME_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    TO_PEER_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    dir_name: str
    ranks: _containers.RepeatedScalarFieldContainer[int]
    to_peer: Peer
    def __init__(self, attempt: _Optional[int] = ..., dir_name: _Optional[str] = ..., ranks: _Optional[_Iterable[int]] = ..., to_peer: _Optional[_Union[Peer, _Mapping]] = ...) -> None: ...

class Peer(_message.Message):
    __slots__ = ("node_id", "host", "port")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    host: str
    port: int
    def __init__(self, node_id: _Optional[str] = ..., host: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...

class Shard(_message.Message):
    __slots__ = ("attempt", "rank", "dir_name", "sources")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    DIR_NAME_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    rank: int
    dir_name: str
    sources: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, attempt: _Optional[int] = ..., rank: _Optional[int] = ..., dir_name: _Optional[str] = ..., sources: _Optional[_Iterable[str]] = ...) -> None: ...

class DropShards(_message.Message):
    __slots__ = ("shards",)
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    shards: _containers.RepeatedCompositeFieldContainer[Shard]
    def __init__(self, shards: _Optional[_Iterable[_Union[Shard, _Mapping]]] = ...) -> None: ...

class RestoreView(_message.Message):
    __slots__ = ("dir_name", "shards")
    DIR_NAME_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    dir_name: str
    shards: _containers.RepeatedCompositeFieldContainer[Shard]
    def __init__(self, dir_name: _Optional[str] = ..., shards: _Optional[_Iterable[_Union[Shard, _Mapping]]] = ...) -> None: ...

class DumpStacks(_message.Message):
    __slots__ = ("attempt",)
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    def __init__(self, attempt: _Optional[int] = ...) -> None: ...

class WorkerLaunch(_message.Message):
    __slots__ = ("rank", "local_rank")
    RANK_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RANK_FIELD_NUMBER: _ClassVar[int]
    rank: int
    local_rank: int
    def __init__(self, rank: _Optional[int] = ..., local_rank: _Optional[int] = ...) -> None: ...

class StartWorkers(_message.Message):
    __slots__ = ("attempt", "workers", "cwd", "env", "coordinator_address", "relay", "preemption_signals", "memory_tier_bytes", "storage", "restore", "replicas")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RELAY_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_SIGNALS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TIER_BYTES_FIELD_NUMBER: _ClassVar[int]
    STORAGE_FIELD_NUMBER: _ClassVar[int]
    RESTORE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    workers: _containers.RepeatedCompositeFieldContainer[WorkerLaunch]
    cwd: str
    env: _containers.ScalarMap[str, str]
    coordinator_address: str
    relay: bool
    preemption_signals: _containers.RepeatedScalarFieldContainer[str]
    memory_tier_bytes: int
    storage: bytes
    restore: RestoreView
    replicas: bool
    def __init__(self, attempt: _Optional[int] = ..., workers: _Optional[_Iterable[_Union[WorkerLaunch, _Mapping]]] = ..., cwd: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., coordinator_address: _Optional[str] = ..., relay: _Optional[bool] = ..., preemption_signals: _Optional[_Iterable[str]] = ..., memory_tier_bytes: _Optional[int] = ..., storage: _Optional[bytes] = ..., restore: _Optional[_Union[RestoreView, _Mapping]] = ..., replicas: _Optional[bool] = ...) -> None: ...

class PrepareForkServers(_message.Message):
    __slots__ = ("count", "for_start", "cwd", "env")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    COUNT_FIELD_NUMBER: _ClassVar[int]
    FOR_START_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    count: int
    for_start: bool
    cwd: str
    env: _containers.ScalarMap[str, str]
    def __init__(self, count: _Optional[int] = ..., for_start: _Optional[bool] = ..., cwd: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ...) -> None: ...

class StopWorkers(_message.Message):
    __slots__ = ("attempt", "grace_s")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    GRACE_S_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    grace_s: float
    def __init__(self, attempt: _Optional[int] = ..., grace_s: _Optional[float] = ...) -> None: ...

class Shutdown(_message.Message):
    __slots__ = ("reason", "preempted")
    REASON_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_FIELD_NUMBER: _ClassVar[int]
    reason: str
    preempted: bool
    def __init__(self, reason: _Optional[str] = ..., preempted: _Optional[bool] = ...) -> None: ...

class WorkerMessage(_message.Message):
    __slots__ = ("run_id", "attempt", "rank", "hello", "store_ready", "phase", "report", "done", "failure", "heartbeat", "list_checkpoints", "telemetry", "report_batch", "preemption_seen")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    STORE_READY_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    LIST_CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    REPORT_BATCH_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_SEEN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    attempt: int
    rank: int
    hello: WorkerHello
    store_ready: StoreReady
    phase: PhaseChange
    report: Report
    done: WorkerDone
    failure: WorkerFailure
    heartbeat: Heartbeat
    list_checkpoints: ListCheckpoints
    telemetry: Telemetry
    report_batch: ReportBatch
    preemption_seen: PreemptionSeen
    def __init__(self, run_id: _Optional[str] = ..., attempt: _Optional[int] = ..., rank: _Optional[int] = ..., hello: _Optional[_Union[WorkerHello, _Mapping]] = ..., store_ready: _Optional[_Union[StoreReady, _Mapping]] = ..., phase: _Optional[_Union[PhaseChange, _Mapping]] = ..., report: _Optional[_Union[Report, _Mapping]] = ..., done: _Optional[_Union[WorkerDone, _Mapping]] = ..., failure: _Optional[_Union[WorkerFailure, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., list_checkpoints: _Optional[_Union[ListCheckpoints, _Mapping]] = ..., telemetry: _Optional[_Union[Telemetry, _Mapping]] = ..., report_batch: _Optional[_Union[ReportBatch, _Mapping]] = ..., preemption_seen: _Optional[_Union[PreemptionSeen, _Mapping]] = ...) -> None: ...

class ReportBatch(_message.Message):
    __slots__ = ("reports",)
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    reports: _containers.RepeatedCompositeFieldContainer[Report]
    def __init__(self, reports: _Optional[_Iterable[_Union[Report, _Mapping]]] = ...) -> None: ...

class PreemptionSeen(_message.Message):
    __slots__ = ("rounds",)
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    rounds: int
    def __init__(self, rounds: _Optional[int] = ...) -> None: ...

class Telemetry(_message.Message):
    __slots__ = ("sampled_at", "reports", "step_time_s", "report_wait_s", "collective_wait_s", "data_wait_s", "cpu_percent", "rss_bytes", "gpus", "total")
    SAMPLED_AT_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    REPORT_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    DATA_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    sampled_at: float
    reports: int
    step_time_s: float
    report_wait_s: float
    collective_wait_s: float
    data_wait_s: float
    cpu_percent: float
    rss_bytes: int
    gpus: _containers.RepeatedCompositeFieldContainer[GpuSample]
    total: int
    def __init__(self, sampled_at: _Optional[float] = ..., reports: _Optional[int] = ..., step_time_s: _Optional[float] = ..., report_wait_s: _Optional[float] = ..., collective_wait_s: _Optional[float] = ..., data_wait_s: _Optional[float] = ..., cpu_percent: _Optional[float] = ..., rss_bytes: _Optional[int] = ..., gpus: _Optional[_Iterable[_Union[GpuSample, _Mapping]]] = ..., total: _Optional[int] = ...) -> None: ...

class GpuSample(_message.Message):
    __slots__ = ("index", "util_percent", "memory_used_bytes", "memory_total_bytes")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UTIL_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    index: int
    util_percent: float
    memory_used_bytes: int
    memory_total_bytes: int
    def __init__(self, index: _Optional[int] = ..., util_percent: _Optional[float] = ..., memory_used_bytes: _Optional[int] = ..., memory_total_bytes: _Optional[int] = ...) -> None: ...

class WorkerHello(_message.Message):
    __slots__ = ("pid", "hostname")
    PID_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    pid: int
    hostname: str
    def __init__(self, pid: _Optional[int] = ..., hostname: _Optional[str] = ...) -> None: ...

class StoreReady(_message.Message):
    __slots__ = ("address", "port")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    address: str
    port: int
    def __init__(self, address: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...

class PhaseChange(_message.Message):
    __slots__ = ("phase",)
    PHASE_FIELD_NUMBER: _ClassVar[int]
    phase: Phase
    def __init__(self, phase: _Optional[_Union[Phase, str]] = ...) -> None: ...

class Report(_message.Message):
    __slots__ = ("round", "metrics_json", "reported_at", "checkpoint_dir_name", "wants_ack", "staged", "wants_receipt", "in_tier")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    METRICS_JSON_FIELD_NUMBER: _ClassVar[int]
    REPORTED_AT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_DIR_NAME_FIELD_NUMBER: _ClassVar[int]
    WANTS_ACK_FIELD_NUMBER: _ClassVar[int]
    STAGED_FIELD_NUMBER: _ClassVar[int]
    WANTS_RECEIPT_FIELD_NUMBER: _ClassVar[int]
    IN_TIER_FIELD_NUMBER: _ClassVar[int]
    round: int
    metrics_json: str
    reported_at: float
    checkpoint_dir_name: str
    wants_ack: bool
    staged: bool
    wants_receipt: bool
    in_tier: bool
    def __init__(self, round: _Optional[int] = ..., metrics_json: _Optional[str] = ..., reported_at: _Optional[float] = ..., checkpoint_dir_name: _Optional[str] = ..., wants_ack: _Optional[bool] = ..., staged: _Optional[bool] = ..., wants_receipt: _Optional[bool] = ..., in_tier: _Optional[bool] = ...) -> None: ...

class WorkerDone(_message.Message):
    __slots__ = ("finished_at", "reports", "return_value")
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    RETURN_VALUE_FIELD_NUMBER: _ClassVar[int]
    finished_at: float
    reports: int
    return_value: bytes
    def __init__(self, finished_at: _Optional[float] = ..., reports: _Optional[int] = ..., return_value: _Optional[bytes] = ...) -> None: ...

class ListCheckpoints(_message.Message):
    __slots__ = ("request_id", "rounds")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    rounds: int
    def __init__(self, request_id: _Optional[int] = ..., rounds: _Optional[int] = ...) -> None: ...

class WorkerFailure(_message.Message):
    __slots__ = ("phase", "exc_type", "message", "traceback", "exc_pickle", "failed_at")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    EXC_TYPE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    EXC_PICKLE_FIELD_NUMBER: _ClassVar[int]
    FAILED_AT_FIELD_NUMBER: _ClassVar[int]
    phase: Phase
    exc_type: str
    message: str
    traceback: str
    exc_pickle: bytes
    failed_at: float
    def __init__(self, phase: _Optional[_Union[Phase, str]] = ..., exc_type: _Optional[str] = ..., message: _Optional[str] = ..., traceback: _Optional[str] = ..., exc_pickle: _Optional[bytes] = ..., failed_at: _Optional[float] = ...) -> None: ...

class WorkerCommand(_message.Message):
    __slots__ = ("assignment", "rendezvous", "abort", "phase_ack", "report_ack", "checkpoint_list", "release", "report_receipt", "preemption_notice", "preemption_round")
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    RENDEZVOUS_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    PHASE_ACK_FIELD_NUMBER: _ClassVar[int]
    REPORT_ACK_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_LIST_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    REPORT_RECEIPT_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_NOTICE_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_ROUND_FIELD_NUMBER: _ClassVar[int]
    assignment: Assignment
    rendezvous: Rendezvous
    abort: Abort
    phase_ack: PhaseAck
    report_ack: ReportAck
    checkpoint_list: CheckpointList
    release: Release
    report_receipt: ReportReceipt
    preemption_notice: PreemptionNotice
    preemption_round: PreemptionRound
    def __init__(self, assignment: _Optional[_Union[Assignment, _Mapping]] = ..., rendezvous: _Optional[_Union[Rendezvous, _Mapping]] = ..., abort: _Optional[_Union[Abort, _Mapping]] = ..., phase_ack: _Optional[_Union[PhaseAck, _Mapping]] = ..., report_ack: _Optional[_Union[ReportAck, _Mapping]] = ..., checkpoint_list: _Optional[_Union[CheckpointList, _Mapping]] = ..., release: _Optional[_Union[Release, _Mapping]] = ..., report_receipt: _Optional[_Union[ReportReceipt, _Mapping]] = ..., preemption_notice: _Optional[_Union[PreemptionNotice, _Mapping]] = ..., preemption_round: _Optional[_Union[PreemptionRound, _Mapping]] = ...) -> None: ...

class PreemptionNotice(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeRanks(_message.Message):
    __slots__ = ("node_id", "ranks")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    ranks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, node_id: _Optional[str] = ..., ranks: _Optional[_Iterable[int]] = ...) -> None: ...

class PreemptionRound(_message.Message):
    __slots__ = ("round", "deadline_ms", "preempted", "signal")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    round: int
    deadline_ms: int
    preempted: _containers.RepeatedCompositeFieldContainer[NodeRanks]
    signal: str
    def __init__(self, round: _Optional[int] = ..., deadline_ms: _Optional[int] = ..., preempted: _Optional[_Iterable[_Union[NodeRanks, _Mapping]]] = ..., signal: _Optional[str] = ...) -> None: ...

class Release(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReportAck(_message.Message):
    __slots__ = ("round",)
    ROUND_FIELD_NUMBER: _ClassVar[int]
    round: int
    def __init__(self, round: _Optional[int] = ...) -> None: ...

class ReportReceipt(_message.Message):
    __slots__ = ("round",)
    ROUND_FIELD_NUMBER: _ClassVar[int]
    round: int
    def __init__(self, round: _Optional[int] = ...) -> None: ...

class CheckpointEntry(_message.Message):
    __slots__ = ("dir_name", "metrics_json")
    DIR_NAME_FIELD_NUMBER: _ClassVar[int]
    METRICS_JSON_FIELD_NUMBER: _ClassVar[int]
    dir_name: str
    metrics_json: str
    def __init__(self, dir_name: _Optional[str] = ..., metrics_json: _Optional[str] = ...) -> None: ...

class CheckpointList(_message.Message):
    __slots__ = ("request_id", "checkpoints")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    checkpoints: _containers.RepeatedCompositeFieldContainer[CheckpointEntry]
    def __init__(self, request_id: _Optional[int] = ..., checkpoints: _Optional[_Iterable[_Union[CheckpointEntry, _Mapping]]] = ...) -> None: ...

class PhaseAck(_message.Message):
    __slots__ = ("phase",)
    PHASE_FIELD_NUMBER: _ClassVar[int]
    phase: Phase
    def __init__(self, phase: _Optional[_Union[Phase, str]] = ...) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("rank", "local_rank", "world_size", "local_world_size", "node_rank", "node_id", "experiment_name", "backend", "dist_timeout_s", "payload", "store_address", "gpu_ids", "storage_path", "initial_checkpoint_dir", "report_index_base", "committed_dir_names")
    RANK_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    NODE_RANK_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EXPERIMENT_NAME_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    DIST_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    STORE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GPU_IDS_FIELD_NUMBER: _ClassVar[int]
    STORAGE_PATH_FIELD_NUMBER: _ClassVar[int]
    INITIAL_CHECKPOINT_DIR_FIELD_NUMBER: _ClassVar[int]
    REPORT_INDEX_BASE_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_DIR_NAMES_FIELD_NUMBER: _ClassVar[int]
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    node_id: str
    experiment_name: str
    backend: str
    dist_timeout_s: float
    payload: bytes
    store_address: str
    gpu_ids: _containers.RepeatedScalarFieldContainer[int]
    storage_path: str
    initial_checkpoint_dir: str
    report_index_base: int
    committed_dir_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, rank: _Optional[int] = ..., local_rank: _Optional[int] = ..., world_size: _Optional[int] = ..., local_world_size: _Optional[int] = ..., node_rank: _Optional[int] = ..., node_id: _Optional[str] = ..., experiment_name: _Optional[str] = ..., backend: _Optional[str] = ..., dist_timeout_s: _Optional[float] = ..., payload: _Optional[bytes] = ..., store_address: _Optional[str] = ..., gpu_ids: _Optional[_Iterable[int]] = ..., storage_path: _Optional[str] = ..., initial_checkpoint_dir: _Optional[str] = ..., report_index_base: _Optional[int] = ..., committed_dir_names: _Optional[_Iterable[str]] = ...) -> None: ...

class Rendezvous(_message.Message):
    __slots__ = ("master_addr", "master_port")
    MASTER_ADDR_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    master_addr: str
    master_port: int
    def __init__(self, master_addr: _Optional[str] = ..., master_port: _Optional[int] = ...) -> None: ...

class Abort(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...
