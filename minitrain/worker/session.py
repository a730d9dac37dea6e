"""The training session inside a worker: what `minitrain.report()` and friends talk to.

Metrics-only reports are validated, queued and sent by gRPC's thread: `report()` returns in
microseconds and never waits for other ranks, only for the coordinator when this rank has 256 reports
in flight that it has not recorded (backpressure; see minitrain.rpc.report_window).

A report with a checkpoint, on a node with a memory tier (minitrain.storage.memory_tier), puts the
directory's files into the tier (a copy into host memory, or renames when the caller gave the directory
up), hands the report to the agent, and, for SYNC, waits until the coordinator committed the round in
memory (every rank's files are in their tiers); ASYNC returns once the report is out of this process.
The agent, not this worker, writes the files to storage. Without a tier (or when it is full: one
warning), the report uploads the directory into this rank's staging directory
`<run>/.staging/attempt_<a>/rank_<r>/<dir>/`, sends the report, and waits until the coordinator has
committed the round (the ranks' staged files moved into `<run>/<dir>/`), as Ray's report with a
checkpoint waits for every rank. ASYNC uploads then run in order on one background thread, and reports
made meanwhile queue behind them so every rank's reports stay in call order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import queue
import shutil
import tempfile
import threading
import time
from datetime import timedelta
from typing import Any, Optional

from fsspec.implementations.local import LocalFileSystem

from minitrain.checkpoint import Checkpoint
from minitrain.context import TrainContext
from minitrain.metrics import encode_metrics
from minitrain.records import Phase
from minitrain.reporting import CheckpointUploadMode, ReportedCheckpoint
from minitrain.rpc import report_window
from minitrain.storage.layout import RESERVED_NAMES, staged_dir
from minitrain.storage.memory_tier import MemoryTier, TierFull
from minitrain.worker.preemption import PreemptionGate
from minitrain.worker.transport.client import WorkerClient

logger = logging.getLogger("minitrain")

# A checkpoint report waits for the round's commit, i.e. for the slowest rank's report: like a
# collective, it has no deadline of its own (hang detection names a rank that never comes).
ACK_TIMEOUT_S = 7 * 24 * 3600.0


class UploadFailed(RuntimeError):
    """An ASYNC checkpoint upload failed; the worker fails with it."""


def _check_dir_name(name: str) -> None:
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", ".."):
        raise ValueError(f"checkpoint_dir_name={name!r} must be a plain directory name (no '/'), e.g. "
                         "'checkpoint_epoch_3'.")
    if name in RESERVED_NAMES or name.startswith("."):
        raise ValueError(f"checkpoint_dir_name={name!r} is reserved for minitrain's own files in the run "
                         "directory; choose another name.")


class _AsyncUploads:
    """One background thread that uploads ASYNC checkpoints and sends queued reports in order."""

    def __init__(self, session: "WorkerSession"):
        self._session = session
        self._jobs: "queue.Queue" = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="minitrain-async-upload", daemon=True)
        self._thread.start()
        self._idle = threading.Condition()
        self._pending = 0
        self.error: Optional[BaseException] = None

    @property
    def busy(self) -> bool:
        """True while an upload (or a report queued behind one) is not sent yet."""
        return self._pending > 0

    def submit(self, job) -> None:
        """Queue a callable; it runs after every job queued before it."""
        with self._idle:
            self._pending += 1
        self._jobs.put(job)

    def drain(self) -> None:
        """Wait until every queued job ran; raises UploadFailed if one failed."""
        with self._idle:
            self._idle.wait_for(lambda: self._pending == 0 or self.error is not None)
        if self.error is not None:
            raise UploadFailed(f"an ASYNC checkpoint upload failed: {self.error}") from self.error

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 - an upload failure fails the worker
                self.error = exc
                with self._idle:
                    self._idle.notify_all()
                self._session.fail_from_upload_thread(exc)
                return
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()


class WorkerSession:
    """Implements `minitrain._session.Session` for one rank of one attempt.

    `phase_seconds` is an exported seam for benchmarks and telemetry: the seconds this rank spent in
    report()'s phases so far, {"upload_s", "ack_wait_s", "stage_s", "window_wait_s", "tier_s"} (waiting
    for the coordinator to record old reports, minitrain.rpc.report_window; putting files into the
    memory tier).

    `memory_tier`: the node's tier (None: none; checkpoints go straight to storage); `restore`:
    (dir_name, local path) of the tier's view of the checkpoint this attempt resumes from, when the
    agent built one: `get_checkpoint()` then reads it from memory.
    """

    def __init__(self, client: WorkerClient, context: TrainContext, storage: Any, *,
                 report_index_base: int = 0, initial_checkpoint_dir: str = "",
                 committed_dir_names: tuple[str, ...] = (), memory_tier: Optional[MemoryTier] = None,
                 restore: Optional[tuple[str, str]] = None):
        if storage is not None and context.storage is None:  # what get_context().get_storage() returns
            context = dataclasses.replace(context, storage=StorageContext(storage, context.storage_path,
                                                                          context.experiment_name))
        self.context = context
        self.storage = storage
        self.upload_in_progress = False
        self._client = client
        self._round = 0
        self._base = report_index_base
        self._used_names = set(committed_dir_names)
        self._tier = memory_tier
        self._tier_full_warned = False
        self._tier_reported: Optional[str] = None  # the last checkpoint reported through the tier, if latest
        self._checkpoint = self._checkpoint_at(initial_checkpoint_dir) if initial_checkpoint_dir else None
        if restore is not None and restore[0] == initial_checkpoint_dir:
            self._checkpoint = Checkpoint(restore[1])  # the tier's view: read from host memory
        self._async: Optional[_AsyncUploads] = None
        self._on_async_failure = None
        self._request_ids = 0
        self.dataset_shards: dict = {}  # name -> minitrain.data.DataIterator, for get_dataset_shard()
        self._collective_address: Optional[tuple] = None
        self._collective_store: Any = None
        self._collective_lock = threading.Lock()
        self.phase_seconds = {"upload_s": 0.0, "ack_wait_s": 0.0, "stage_s": 0.0, "window_wait_s": 0.0,
                              "tier_s": 0.0}
        self._preemption = PreemptionGate(client)
        client.count_reports_with(lambda: self._round)

    # ------------------------------------------------------------------ public contract

    @property
    def rounds_reported(self) -> int:
        """How many report() calls this rank made in this attempt."""
        return self._round

    def report(self, metrics: dict, checkpoint: Any = None, checkpoint_dir_name: Optional[str] = None,
               checkpoint_upload_mode: Any = CheckpointUploadMode.SYNC,
               delete_local_checkpoint_after_upload: Optional[bool] = None,
               checkpoint_upload_fn: Any = None, validation: Any = False) -> None:
        """One report of this rank (see `minitrain.report` for the contract)."""
        text = encode_metrics(metrics)
        if validation is not False and validation is not None:  # Ray's default is False
            raise ValueError(
                f"minitrain.report(validation={validation!r}) is not supported: minitrain has no asynchronous "
                "checkpoint validation (TorchTrainer(validation_config=...) is refused too; see docs/porting.md, "
                "'Not supported'). Evaluate the model in the training function, on rank 0 or every rank, and "
                "pass the validation metrics to this report() with its checkpoint: CheckpointConfig's "
                "checkpoint_score_attribute then ranks by them and Result.best_checkpoints shows them.")
        if report_window.must_wait(self._round, self._client.recorded_round):
            self._wait_for_window(report_window.oldest_allowed(self._round))
        if checkpoint is None:
            message = self._client.report_message(self._round, text, "", staged=False)
            self._round += 1
            if self._async is not None and self._async.busy:
                self._async.submit(lambda: self._client.put(message))
            else:
                self._client.put(message)
        else:
            self._report_checkpoint(text, checkpoint, checkpoint_dir_name,
                                    CheckpointUploadMode(checkpoint_upload_mode),
                                    delete_local_checkpoint_after_upload, checkpoint_upload_fn)
        if self._client.preemption_noticed:  # after the count went up: see WorkerClient._apply
            self._preemption.after_report(self._round)

    def get_preemption_info(self) -> Any:
        """`minitrain.get_preemption_info()` on this rank (minitrain.worker.preemption)."""
        return self._preemption.info(self._round)

    def get_checkpoint(self) -> Optional[Checkpoint]:
        """The latest committed checkpoint at attempt start, then this rank's last reported one. One
        reported through the memory tier is read from there when every rank's shard is in this node's
        tier (a merged view of hard links, made once); otherwise from storage, where it is once durable."""
        if self._tier_reported is not None:
            dir_name, self._tier_reported = self._tier_reported, None
            ranks = [(self._client.attempt, rank) for rank in range(self.context.get_world_size())]
            try:
                view = self._tier.build_view(dir_name, ranks)
            except OSError:
                view = None
            if view is not None:
                self._checkpoint = Checkpoint(view)
        return self._checkpoint

    def get_all_reported_checkpoints(self, timeout_s: Optional[float] = None) -> list[ReportedCheckpoint]:
        """The run's committed checkpoints (kept, retention order), after this rank's reports landed."""
        if self._async is not None:
            self._async.drain()
        self._request_ids += 1
        entries = self._client.list_checkpoints(self._request_ids, self._round, timeout_s or ACK_TIMEOUT_S)
        return [ReportedCheckpoint(self._checkpoint_at(name), metrics) for name, metrics in entries]

    def attach_collective(self, address: str, port: int, timeout_s: float, run_id: str, attempt: int,
                          token: str) -> None:
        """Where `minitrain.collective` finds this attempt's TCPStore, and what its keys and tags derive
        from (set by the bootstrap once the process group is up)."""
        namespace = f"minitrain/collective/{run_id}/{attempt}"
        secret = hashlib.sha256(b"minitrain collective\0" + token.encode()).digest()
        self._collective_address = (address, port, timeout_s, namespace, secret)

    def collective_channel(self) -> tuple[Any, str, bytes]:
        """(store, namespace, secret) for `minitrain.collective`: a TCPStore client of its own (opened on
        first use, so its waits never hold the lock of the process group's client), the attempt's key
        prefix, and the key that signs broadcast data. RuntimeError before the process group is up."""
        if self._collective_address is None:
            raise RuntimeError("minitrain.collective is not available before the process group is initialised.")
        address, port, timeout_s, namespace, secret = self._collective_address
        with self._collective_lock:
            if self._collective_store is None:
                import torch.distributed as dist

                self._collective_store = dist.TCPStore(address, port, is_master=False,
                                                       timeout=timedelta(seconds=timeout_s))
        return self._collective_store, namespace, secret

    def finish(self) -> None:
        """Called when the training function returned: wait for pending uploads (may raise)."""
        if self._async is not None:
            self._async.drain()

    def fail_from_upload_thread(self, exc: BaseException) -> None:
        """An ASYNC upload failed: report it as this worker's failure and end the process."""
        if self._on_async_failure is not None:
            self._on_async_failure(exc)

    def on_async_failure(self, callback) -> None:
        """Register what ends the worker when an ASYNC upload fails (set by the bootstrap)."""
        self._on_async_failure = callback

    # ------------------------------------------------------------------ checkpoints

    def _wait_for_window(self, oldest: int) -> None:
        """Backpressure (minitrain.rpc.report_window): wait until the coordinator recorded report `oldest`."""
        started = time.perf_counter()
        self._client.wait_recorded(oldest, ACK_TIMEOUT_S)
        self.phase_seconds["window_wait_s"] += time.perf_counter() - started

    def _staged(self, dir_name: str) -> str:
        return staged_dir(self._client.attempt, self._client.rank, dir_name)

    def _checkpoint_at(self, dir_name: str) -> Checkpoint:
        return Checkpoint(self.storage.path(dir_name), filesystem=self.storage.checkpoint_fs)

    def _dir_name_for(self, round_: int, requested: Optional[str]) -> str:
        if requested is None:
            return f"checkpoint_{self._base + round_:06d}"
        _check_dir_name(requested)
        if requested in self._used_names:
            raise ValueError(f"checkpoint_dir_name={requested!r} is already used by a committed checkpoint "
                             "or an earlier report of this run; committed checkpoints are never overwritten. "
                             "Use a unique name per report, e.g. f'checkpoint_epoch_{epoch}'.")
        return requested

    def _report_checkpoint(self, text: str, checkpoint: Any, requested_name: Optional[str],
                           mode: CheckpointUploadMode, delete_local: Optional[bool], upload_fn: Any) -> None:
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(f"minitrain.report(checkpoint=...) expects a minitrain.Checkpoint, got "
                            f"{type(checkpoint).__name__}; use minitrain.Checkpoint.from_directory(path).")
        round_ = self._round
        if delete_local is None:
            delete_local = (mode.default_delete_local_checkpoint_after_upload()
                            or getattr(checkpoint, "_owns_directory", False))
        if mode is CheckpointUploadMode.NO_UPLOAD:
            dir_name = self._name_in_run_dir(checkpoint, "NO_UPLOAD")
        else:
            dir_name = self._dir_name_for(round_, requested_name)
            if delete_local and self._inside_run_dir(checkpoint):
                raise ValueError("delete_local_checkpoint_after_upload=True would delete a directory inside "
                                 "the run directory; pass a checkpoint from a local scratch directory.")
        self._used_names.add(dir_name)
        self._round += 1
        if mode is not CheckpointUploadMode.NO_UPLOAD and upload_fn is None and \
                self._put_in_tier(round_, text, checkpoint, dir_name, delete_local, mode):
            return
        if mode is CheckpointUploadMode.ASYNC:
            self._submit_async(round_, text, checkpoint, dir_name, delete_local, upload_fn)
            return
        if self._async is not None:
            self._async.drain()  # earlier rounds first: every rank's reports stay in call order
        staged = False
        if mode is CheckpointUploadMode.SYNC:
            dir_name, staged = self._upload(checkpoint, dir_name, upload_fn)
        self._send_and_wait(round_, text, dir_name, staged)
        if delete_local and mode is not CheckpointUploadMode.NO_UPLOAD:
            shutil.rmtree(checkpoint.path, ignore_errors=True)

    def _put_in_tier(self, round_: int, text: str, checkpoint: Checkpoint, dir_name: str, delete_local: bool,
                     mode: CheckpointUploadMode) -> bool:
        """Report the checkpoint through the node's memory tier; False (nothing done) when there is no
        tier, the checkpoint is not a local directory, or it does not fit (warned once)."""
        if self._tier is None or not isinstance(checkpoint._fs, LocalFileSystem):
            return False
        if self._async is not None:
            self._async.drain()  # an earlier report still uploading from here goes first: call order
        started = time.perf_counter()
        try:
            self._tier.write_shard(self._client.attempt, self._client.rank, dir_name, checkpoint.path,
                                   move=delete_local)
        except TierFull as exc:
            if not self._tier_full_warned:
                self._tier_full_warned = True
                logger.warning("%s; %s and the checkpoints after it that do not fit go straight to storage "
                               "(CheckpointConfig.memory_tier_bytes sets its size). Logged once per worker.",
                               exc, dir_name)
            return False
        self.phase_seconds["tier_s"] += time.perf_counter() - started
        message = self._client.report_message(round_, text, dir_name, staged=False, in_tier=True)
        waits = mode is CheckpointUploadMode.SYNC
        if not waits and not self._client.hands_off_on_put:
            message.wants_receipt = True  # queued in this process: out of it only once recorded
        self._client.put(message)
        if waits:  # committed in memory: every rank's files are in their tiers
            self._wait_for_commit(round_)
        elif message.wants_receipt:
            started = time.perf_counter()
            self._client.wait_recorded(round_, ACK_TIMEOUT_S)
            self.phase_seconds["ack_wait_s"] += time.perf_counter() - started
        self._checkpoint = self._checkpoint_at(dir_name)
        self._tier_reported = dir_name
        if delete_local:
            shutil.rmtree(checkpoint.path, ignore_errors=True)
        return True

    def _upload(self, checkpoint: Checkpoint, dir_name: str, upload_fn: Any) -> tuple[str, bool]:
        """(directory name, staged): the upload lands in this rank's staging directory, except with
        `checkpoint_upload_fn`, which persists into the run directory itself."""
        # Cleared only on success: a failure that propagates keeps the flag set, so the worker's error
        # names the checkpoint-upload phase.
        self.upload_in_progress = True
        # The coordinator's hang clock gives an upload its own allowance (FailureConfig docs).
        self._client.send_phase(Phase.CHECKPOINT_UPLOAD)
        started = time.perf_counter()
        try:
            if upload_fn is not None:
                persisted = upload_fn(checkpoint, dir_name)
                result = self._name_in_run_dir(persisted, "checkpoint_upload_fn's result"), False
            else:
                with checkpoint.as_directory() as local_dir:
                    self.storage.upload_dir(local_dir, self._staged(dir_name))
                result = dir_name, True
        finally:  # also when it failed: user code that catches the error trains on under the normal clock
            self._client.send_phase(Phase.TRAINING)
        self.upload_in_progress = False
        self.phase_seconds["upload_s"] += time.perf_counter() - started
        return result

    def _send_and_wait(self, round_: int, text: str, dir_name: str, staged: bool) -> None:
        self._tier_reported = None
        self._client.put(self._client.report_message(round_, text, dir_name, staged))
        self._wait_for_commit(round_)
        self._checkpoint = self._checkpoint_at(dir_name)

    def _wait_for_commit(self, round_: int) -> None:
        """Wait until the coordinator committed round `round_` (every rank reported it): a wait on the
        peers, which the hang detection recognises by this function's name in a rank's stack
        (minitrain.coordinator.policy.hangs)."""
        started = time.perf_counter()
        self._client.wait_report_ack(round_, ACK_TIMEOUT_S)
        self.phase_seconds["ack_wait_s"] += time.perf_counter() - started

    def _submit_async(self, round_: int, text: str, checkpoint: Checkpoint, dir_name: str,
                      delete_local: bool, upload_fn: Any) -> None:
        if self._async is None:
            self._async = _AsyncUploads(self)
        local = isinstance(checkpoint._fs, LocalFileSystem)  # the fsspec one: .filesystem is pyarrow's
        if delete_local and upload_fn is None and local:
            # The caller gave the directory up: move its files into the run directory now (renames,
            # no bytes copied, no file shared with the caller). Only the report waits in the background.
            if self.storage.move_into(checkpoint.path, self._staged(dir_name)):
                def report_only() -> None:
                    self._send_and_wait(round_, text, dir_name, True)
                    shutil.rmtree(checkpoint.path, ignore_errors=True)

                self._async.submit(report_only)
                return
        # The caller may delete its directory as soon as report() returns (a TemporaryDirectory, say):
        # hard-link its files into a private staging directory first. That costs a link per file, not
        # a copy, because the staging directory sits beside the original on the same filesystem.
        started = time.perf_counter()
        staged = _stage(checkpoint.path) if local else None
        self.phase_seconds["stage_s"] += time.perf_counter() - started
        source = Checkpoint.from_directory(staged) if staged else checkpoint

        def job() -> None:
            try:
                name, in_staging = self._upload(source, dir_name, upload_fn)
            finally:
                if staged:
                    shutil.rmtree(staged, ignore_errors=True)
            self._send_and_wait(round_, text, name, in_staging)
            if delete_local:
                shutil.rmtree(checkpoint.path, ignore_errors=True)

        self._async.submit(job)

    def _inside_run_dir(self, checkpoint: Checkpoint) -> bool:
        root = self.storage.path("").rstrip("/") + "/"
        return type(checkpoint._fs) is type(self.storage.fs) and checkpoint.path.startswith(root)

    def _name_in_run_dir(self, checkpoint: Any, what: str) -> str:
        root = self.storage.path("").rstrip("/")
        path = getattr(checkpoint, "path", "").rstrip("/")
        parent, _, name = path.rpartition("/")
        if not isinstance(checkpoint, Checkpoint) or parent != root or not name:
            raise ValueError(f"{what}: the checkpoint must be a directory directly inside the run directory "
                             f"{self.storage.url('')!r} on the run's filesystem, got {path!r}.")
        _check_dir_name(name)
        return name


class StorageContext:
    """Ray's `StorageContext`, backed by minitrain's `Storage` of the run directory.

    `storage_path` (`RunConfig.storage_path`), `experiment_dir_name` (`RunConfig.name`),
    `storage_filesystem` (a `pyarrow.fs.FileSystem` whenever pyarrow is installed, as
    `Checkpoint.filesystem`), `experiment_fs_path` (the run directory as a path on that filesystem),
    `build_checkpoint_path_from_name(name)` (`<experiment_fs_path>/<name>`, for `NO_UPLOAD` writers) and
    `persist_current_checkpoint(checkpoint, checkpoint_dir_name)` (upload a checkpoint's files there and
    return the `Checkpoint` on storage, for `checkpoint_upload_fn`).
    """

    def __init__(self, storage: Any, run_path: str, experiment_dir_name: str):
        self._storage = storage
        # The worker is told the run directory `<storage_path>/<name>`; Ray's storage_path is its parent.
        suffix = "/" + experiment_dir_name
        self.storage_path = run_path[:-len(suffix)] if run_path.endswith(suffix) else run_path
        self.experiment_dir_name = experiment_dir_name

    @property
    def storage_filesystem(self) -> Any:
        """The run's filesystem, as `Checkpoint.filesystem` shows it (pyarrow when installed)."""
        return self._storage.public_fs

    @property
    def experiment_fs_path(self) -> str:
        """The run directory `<storage_path>/<name>` as a path on `storage_filesystem` (no protocol)."""
        return self._storage.path("")

    def build_checkpoint_path_from_name(self, checkpoint_dir_name: str) -> str:
        """`<experiment_fs_path>/<checkpoint_dir_name>`: where a `NO_UPLOAD` checkpoint of that name
        goes. ValueError for a name that is not a plain directory name or that minitrain reserves."""
        _check_dir_name(checkpoint_dir_name)
        return self._storage.path(checkpoint_dir_name)

    def persist_current_checkpoint(self, checkpoint: Any, checkpoint_dir_name: str) -> Any:
        """Upload `checkpoint`'s files into `<run>/<checkpoint_dir_name>/` and return the
        `minitrain.Checkpoint` there (what a `checkpoint_upload_fn` returns). Files of the same name
        already there are replaced; the directory is committed by the report that names it."""
        _check_dir_name(checkpoint_dir_name)
        with checkpoint.as_directory() as local_dir:
            self._storage.upload_dir(local_dir, checkpoint_dir_name)
        return Checkpoint(self._storage.path(checkpoint_dir_name), filesystem=self._storage.checkpoint_fs)

    def __repr__(self) -> str:
        return (f"StorageContext(storage_path={self.storage_path!r}, experiment_dir_name="
                f"{self.experiment_dir_name!r})")


def _stage(path: str) -> str:
    """Hard-link (or copy, across filesystems) every file of `path` into a fresh sibling directory."""
    parent = os.path.dirname(os.path.abspath(path))
    try:
        staged = tempfile.mkdtemp(prefix=".minitrain_staged_", dir=parent)
    except OSError:
        staged = tempfile.mkdtemp(prefix="minitrain_staged_")
    try:
        shutil.copytree(path, staged, dirs_exist_ok=True, copy_function=_link_or_copy)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return staged


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)
