"""A worker's life: connect, load the training function, bring up its backend (torch.distributed, ...), run, report.

Every failure, in any phase, is captured as a record (phase, exception type, message, traceback, and
the pickled exception when it pickles) and sent to the coordinator before the process exits with
code 1; no decorator is needed in user code.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import signal
import socket
import sys
import time
import traceback
from typing import Any, Optional

from minitrain import _session
from minitrain.commands import Assignment
from minitrain.context import TrainContext
from minitrain.records import FailureKind, Phase, RunPayload, WorkerFailure
from minitrain.rpc import local_stream
from minitrain.storage.memory_tier import MemoryTier
from minitrain.worker import distributed, telemetry
from minitrain.worker.backend import StoreLink, TorchBackend
from minitrain.worker.session import UploadFailed, WorkerSession
from minitrain.worker.transport.client import StreamClosed, WorkerClient
from minitrain.worker.transport.grpc_client import GrpcWorkerClient
from minitrain.worker.transport.local_client import LocalWorkerClient

ASSIGNMENT_TIMEOUT_S = 120.0
CLOSE_TIMEOUT_S = 10.0
SIGTERM_FLUSH_S = 1.0  # a stopped worker sends what it queued (reports that returned) before it dies
PHASE_ACK_TIMEOUT_S = 30.0
RELEASE_TIMEOUT_S = 7 * 24 * 3600.0  # other ranks may train much longer; a stop ends the wait anyway


def read_bootstrap(stream) -> dict:
    """The JSON line the agent writes on our stdin: coordinator address, token, the run's TLS
    certificate (PEM, empty for a loopback coordinator), run, attempt, rank."""
    line = stream.readline()
    if not line:
        raise SystemExit("minitrain.worker: no bootstrap line on stdin (workers are started by an agent)")
    return json.loads(line)


def _qualified_name(exc: BaseException) -> str:
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


# What a failure may carry to the driver. A 50 MB exception message once took the driver 69 s and
# 742 MiB to handle; the full text always goes to the rank's log file.
MAX_MESSAGE_CHARS = 16 * 1024
MAX_TRACEBACK_CHARS = 64 * 1024
MAX_EXCEPTION_PICKLE_BYTES = 1024 * 1024  # larger: the driver rebuilds a RemoteWorkerError from the text


def _pickle_exception(exc: BaseException) -> bytes:
    try:
        import cloudpickle

        data = cloudpickle.dumps(exc)
        if len(data) > MAX_EXCEPTION_PICKLE_BYTES:
            return b""
        cloudpickle.loads(data)  # refuse what would not come back (e.g. unpicklable arguments)
        return data
    except Exception:
        return b""


def truncated(text: str, limit: int) -> str:
    """`text` cut to about `limit` characters, head and tail kept, saying how much was left out."""
    if len(text) <= limit:
        return text
    keep = limit // 2
    return (f"{text[:keep]}\n... [{len(text) - 2 * keep} characters left out; the full text is in this "
            f"rank's log file] ...\n{text[-keep:]}")


def _user_traceback(exc: BaseException) -> str:
    """The traceback without minitrain's own bootstrap frames at its top."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__ and tb.tb_next is not None:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def capture_failure(rank: int, phase: Phase, exc: BaseException) -> tuple[WorkerFailure, bytes, str]:
    """(the record of a captured exception, with its message and traceback cut to MAX_MESSAGE_CHARS
    and MAX_TRACEBACK_CHARS; the exception pickled, b"" past MAX_EXCEPTION_PICKLE_BYTES; the full
    traceback, for the rank's log)."""
    full = _user_traceback(exc)
    failure = WorkerFailure(
        rank=rank, node=socket.gethostname(), pid=os.getpid(), phase=phase, time=time.time(),
        exc_type=_qualified_name(exc), message=truncated(str(exc), MAX_MESSAGE_CHARS),
        traceback=truncated(full, MAX_TRACEBACK_CHARS), kind=FailureKind.EXCEPTION,
    )
    return failure, _pickle_exception(exc), full


def _connect(b: dict) -> WorkerClient:
    """The worker's stream on the address its agent gave: the agent's relay (a local stream, holding a
    lease on the agent that ends this process when the agent stops answering) or the coordinator itself
    (gRPC, TLS pinned to the run's certificate unless loopback; the coordinator ends it when it loses
    this node, and gRPC's keepalive when the coordinator itself is lost)."""
    if local_stream.is_local(b["coordinator"]):
        rank = b["rank"]
        return LocalWorkerClient(b["coordinator"], b["token"], b["run_id"], b["attempt"], rank,
                                 on_agent_lost=lambda reason: end_worker(f"rank {rank}: {reason}"))
    return GrpcWorkerClient(b["coordinator"], b["token"], b["run_id"], b["attempt"], b["rank"],
                            tls_cert=b.get("tls_cert", "").encode("ascii"))


def end_worker(reason: str) -> None:
    """End this worker process and its process group now (SIGKILL), after one line on stderr naming
    `reason`: what a relayed worker does when its agent stopped answering (its lease ran out, see
    `minitrain.worker.transport.local_client`). Such an agent can neither stop its workers nor take their
    last messages, and its coordinator has written the node off; SIGKILL to the group also ends what the
    worker started (data loader workers), so nothing of it keeps its GPU memory beside the next attempt.
    The line is written without waiting: stderr is a pipe to the agent, which may have stopped reading it.
    Never returns."""
    try:
        os.set_blocking(2, False)
        os.write(2, f"minitrain.worker: {reason}; this worker and its process group end now\n".encode())
    except OSError:
        pass  # the pipe is full or gone: the exit itself still shows, as a SIGKILL, when the agent runs again
    pid = os.getpid()
    if os.getpgrp() == pid:  # a worker leads its own group (procs.spawn, fork_server): never the agent's
        os.killpg(pid, signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)


def _context(assignment: Assignment) -> TrainContext:
    worker = assignment.worker
    return TrainContext(
        experiment_name=assignment.experiment_name, world_size=worker.world_size,
        world_rank=worker.rank, local_rank=worker.local_rank,
        local_world_size=worker.local_world_size, node_rank=worker.node_rank,
        device_indices=worker.gpu_ids, storage_path=assignment.storage_path,
    )


def _preimport(module: str) -> None:
    try:
        importlib.import_module(module)
    except Exception:  # the main thread's own import reports the problem in the right phase
        pass


def _preimport_torch() -> None:
    _preimport("torch.distributed")


def _load_payload(payload: bytes) -> RunPayload:
    import cloudpickle

    return cloudpickle.loads(payload)


def _dataset_shards(payload: RunPayload, context: TrainContext) -> dict:
    """This rank's lazy shard of every dataset (nothing is read until the training function iterates)."""
    if not payload.datasets:
        return {}
    from minitrain.data.staging import make_shards

    return make_shards(payload.datasets, context)


def _pickle_return_value(value: Any) -> bytes:
    """Rank 0's return value for `Result.return_value`; ValueError when it cannot travel."""
    import cloudpickle

    if value is None:
        return b""
    try:
        return cloudpickle.dumps(value)
    except Exception as exc:
        raise ValueError(f"the training function's return value on rank 0 cannot be pickled ({exc}); "
                         "return plain values (numbers, strings, lists, dicts) or nothing.") from exc


class WorkerRun:
    """One worker process's run; `execute()` returns the process exit code."""

    def __init__(self, bootstrap: dict):
        self._bootstrap = bootstrap
        self._phase = Phase.UNSPECIFIED
        self._client: WorkerClient | None = None
        self._session: WorkerSession | None = None

    def _enter(self, phase: Phase) -> None:
        self._phase = phase
        self._client.send_phase(phase)

    def execute(self) -> int:
        """Run the phases; capture any failure; flush everything to the coordinator."""
        b = self._bootstrap
        try:
            self._client = _connect(b)
            self._client.send_hello(os.getpid(), socket.gethostname())
            _flush_on_sigterm(self._client)
            self._enter(Phase.STARTUP)
            # Importing torch takes most of a worker's start-up. Do it while gRPC's own threads carry
            # the hello and fetch the assignment. It stays on this thread: importing torch from two
            # threads at once breaks its C-extension initialisation.
            _preimport_torch()
            assignment = self._client.wait_assignment(ASSIGNMENT_TIMEOUT_S)
            distributed.set_rank_environment(assignment)
            payload = _load_payload(assignment.payload)
            self._session = self._make_session(assignment, payload.storage)
            self._session.dataset_shards = _dataset_shards(payload, self._session.context)
            _session.set_current(self._session)
            self._enter(Phase.DIST_INIT)
            backend = payload.backend if payload.backend is not None else TorchBackend()
            store = distributed.open_store(assignment, self._client)
            address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
            backend.setup(StoreLink(assignment, store, address, port))
            self._session.attach_collective(address, port, assignment.dist_timeout_s, b["run_id"], b["attempt"],
                                            b["token"])
            self._enter(Phase.TRAINING)
            self._client.wait_phase_ack(Phase.TRAINING, PHASE_ACK_TIMEOUT_S)
            sampling = telemetry.start(assignment.worker.gpu_ids, self._client.send_telemetry,
                                       attempt=b["attempt"], rank=b["rank"], world_size=assignment.worker.world_size)
            try:
                with backend.training():  # e.g. XGBoost's communicator
                    value = payload.train_fn(payload.config) if payload.takes_config else payload.train_fn()
            finally:
                if sampling is not None:
                    sampling.stop()
            self._session.finish()  # pending ASYNC uploads belong to the training
            self._enter(Phase.FINISHING)
            returned = _pickle_return_value(value) if assignment.worker.rank == 0 else b""
            del store
        except StreamClosed:
            # The coordinator ended this attempt (stale or stopping); there is nobody to tell.
            return 0 if self._phase <= Phase.STARTUP else 1
        except BaseException as exc:  # noqa: BLE001 - every failure is reported, SystemExit included
            self._report_failure(exc)
            return 1
        self._client.send_done(self._session.rounds_reported, returned)
        if b["rank"] == 0:
            # Rank 0 hosts the TCPStore: stay until every rank is done with it (an exit barrier).
            self._client.wait_release(RELEASE_TIMEOUT_S)
        self._client.close(CLOSE_TIMEOUT_S)
        backend.teardown()  # every rank is done with the collective layer (rank 0 waited for its release)
        return 0


    def _failure_phase(self) -> Phase:
        uploading = self._session is not None and self._session.upload_in_progress
        return Phase.CHECKPOINT_UPLOAD if uploading else self._phase

    def _report_failure(self, exc: BaseException) -> None:
        phase = Phase.CHECKPOINT_UPLOAD if isinstance(exc, UploadFailed) else self._failure_phase()
        failure, exc_pickle, full_traceback = capture_failure(self._bootstrap["rank"], phase, exc)
        sys.stderr.write(full_traceback)
        if self._client is not None:
            self._client.send_failure(failure, exc_pickle)
            self._client.close(CLOSE_TIMEOUT_S)

    def _memory_tier(self) -> Optional[MemoryTier]:
        """The node's memory tier its agent named in the bootstrap line (None: none)."""
        tier = self._bootstrap.get("memory_tier")
        return MemoryTier(tier["root"], int(tier["capacity"])) if tier else None

    def _restore(self) -> Optional[tuple[str, str]]:
        """(dir_name, path) of the tier's view of the checkpoint this attempt resumes from, if any."""
        view = self._bootstrap.get("restore")
        return (view["dir_name"], view["path"]) if view else None

    def _make_session(self, assignment: Assignment, storage: Any) -> WorkerSession:
        session = WorkerSession(
            self._client, _context(assignment), storage, report_index_base=assignment.report_index_base,
            initial_checkpoint_dir=assignment.initial_checkpoint_dir,
            committed_dir_names=assignment.committed_dir_names, memory_tier=self._memory_tier(),
            restore=self._restore())
        session.on_async_failure(self._fail_from_upload_thread)
        return session

    def _fail_from_upload_thread(self, exc: BaseException) -> None:
        """An ASYNC upload failed on the upload thread: that is this worker's failure; end now."""
        failure, exc_pickle, full_traceback = capture_failure(self._bootstrap["rank"], Phase.CHECKPOINT_UPLOAD, exc)
        sys.stderr.write(full_traceback)
        self._client.send_failure(failure, exc_pickle)
        self._client.close(CLOSE_TIMEOUT_S)
        sys.stderr.flush()
        os._exit(1)


def _flush_on_sigterm(client: WorkerClient) -> None:
    """When minitrain stops this worker (SIGTERM), first send the reports it queued: a report() that
    returned just before a peer failed still reaches the coordinator. Only while SIGTERM has its
    default meaning (a handler of the user's, installed later, replaces this one); the process then
    dies of SIGTERM as it would have. The handler runs when the main thread next runs Python code; a
    main thread blocked in C (a collective) is killed at the end of the grace period as before."""
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def flush_then_die(signum, _frame) -> None:
        client.close(SIGTERM_FLUSH_S)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, flush_then_die)


def _arm_stack_dumps(fd: int | None) -> None:
    """On SIGUSR1, write every thread's Python stack to the file descriptor the agent passed us
    (the agent asks when a rank hangs, and reads the dump from its side of the same file)."""
    if fd is None or fd < 0:
        return
    import faulthandler

    faulthandler.register(signal.SIGUSR1, file=fd, all_threads=True, chain=False)


def _ignore_signals(names) -> None:
    """Ignore the run's preemption signals other than SIGTERM (the agent's bootstrap names them): the
    agent on this node reports them to the coordinator, which agrees a round; a worker that died of the
    same signal (a scheduler signals every process of the node) would lose that round."""
    for name in names:
        signal.signal(signal.Signals[name], signal.SIG_IGN)


def main() -> None:
    """Entry point of `python -m minitrain.worker`."""
    from minitrain import procs

    args = sys.argv[1:]
    stack_fd = None
    if "--fork-server" in args:
        # A fork server: die with the agent from the start, import torch once, then fork workers.
        from minitrain.worker import fork_server

        procs.die_with_parent(expected_parent=os.getppid())
        _preimport_torch()
        # DistributedDataParallel's constructor imports torch._dynamo (~800 modules, over a second);
        # the fork server pays for it once, not each restarted worker. Workers are forked from the
        # state before it meanwhile (a start-up crash must not wait for it).
        # Returns only in a forked worker (see fork_server.py), which then goes on as a spawned one.
        stack_fd = fork_server.serve(int(args[args.index("--fork-server") + 1]),
                                     then=lambda: _preimport("torch._dynamo"))
    bootstrap = read_bootstrap(sys.stdin)
    procs.die_with_parent(expected_parent=bootstrap.get("agent_pid"))
    _ignore_signals(bootstrap.get("ignore_signals", ()))
    _arm_stack_dumps(stack_fd if stack_fd is not None else bootstrap.get("stack_fd"))
    sys.stdin.close()
    sys.stdin = open(os.devnull)
    code = WorkerRun(bootstrap).execute()
    # Run the user's atexit hooks, then skip interpreter teardown: joining library threads (gRPC,
    # gloo) at shutdown is where stuck exits come from.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
