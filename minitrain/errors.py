"""Public error types and the rendering of worker failures (L0: stdlib only).

Names follow `ray.train`: `TrainingFailedError` is what `fit()` raises (not a `RuntimeError`, as in
Ray v2), `WorkerGroupError.worker_failures` maps world rank -> the original exception. User mistakes in
configuration raise `ConfigError`, a `ValueError`, before any process starts.
"""

from __future__ import annotations

import pickle
import re
from typing import Optional, Sequence

from minitrain.records import FailedAttempt, FailureKind, WorkerFailure

# Long tracebacks keep their head and tail (Ray keeps 500 characters of each); the end carries the error.
_SNIPPET_HEAD = 600
_SNIPPET_TAIL = 2400
_CAUSES_PER_HOST = 3  # the end-of-run summary names a host's commonest causes, and counts the rest


class MinitrainError(Exception):
    """Base of every error minitrain raises on purpose."""


class ConfigError(MinitrainError, ValueError):
    """A configuration value is invalid. The message names the field, the value and the fix."""


class TrainingFailedError(MinitrainError):
    """Training did not finish: the union of what `TorchTrainer.fit()` raises after it started."""


class WorkerGroupError(TrainingFailedError):
    """One or more workers failed and the failure budget is spent.

    `worker_failures` maps world rank -> the exception that rank raised, rebuilt in the driver with its
    original type when possible (else a `RemoteWorkerError`), or a `WorkerProcessError` when the
    process died without raising. Only ranks that failed on their own are present: ranks stopped by
    minitrain because another rank failed are not. These are the last attempt's; `failed_attempts`
    (minitrain extension) lists every attempt of the `fit()` that ended with a failure, as
    `records.FailedAttempt`s (host, rank, phase, cause), in order.
    """

    def __init__(self, error_message: str, worker_failures: dict[int, BaseException],
                 failed_attempts: tuple = ()):
        super().__init__(error_message)
        self.worker_failures = dict(worker_failures)
        self.failed_attempts = tuple(failed_attempts)

    def __reduce__(self):
        return (self.__class__, (self.args[0], self.worker_failures, self.failed_attempts))


class NoProgressError(WorkerGroupError):
    """The run stopped because `attempts` attempts in a row failed without progress
    (`FailureConfig.max_attempts_without_progress`), whatever `max_failures` allowed: restarting again
    would repeat the failure. A `WorkerGroupError` (the last attempt's `worker_failures`, every failed
    attempt in `failed_attempts`); `python -m minitrain.launch` exits 93 (`EXIT_NO_PROGRESS`), which a
    scheduler is to treat as final: a Slurm job is never requeued for it (docs/slurm.md), a Kubernetes
    job fails on it with a podFailurePolicy (docs/kubernetes.md).
    """

    def __init__(self, error_message: str, worker_failures: dict[int, BaseException],
                 failed_attempts: tuple = (), attempts: int = 0):
        super().__init__(error_message, worker_failures, failed_attempts)
        self.attempts = attempts

    def __reduce__(self):
        return (self.__class__, (self.args[0], self.worker_failures, self.failed_attempts, self.attempts))


class ControllerError(TrainingFailedError):
    """The coordinator itself failed (storage, launch, or an internal error); wraps the cause."""

    def __init__(self, controller_failure: BaseException):
        super().__init__(f"Training failed due to controller error:\n{controller_failure}")
        self.controller_failure = controller_failure

    def __reduce__(self):
        return (self.__class__, (self.controller_failure,))


class PreemptionError(TrainingFailedError):
    """The run was preempted (a preemption signal reached the driver or a node agent) and stopped at the
    agreed round; Ray's `ray.train.PreemptionError`, with its constructor and attributes.

    `preemption_info`: the `PreemptionInfo` every rank saw (its `round` is the agreed round).
    `drain_timed_out`: True when the workers were killed before every rank reached that round (a second
    signal, or `FailureConfig.preemption_timeout_s` ran out); the last committed checkpoint stands
    either way. minitrain extensions: `resumable` (False once the run's preemptions exceed
    `FailureConfig.max_preemption_failures`; `python -m minitrain.launch` exits 143 when True, 1 when
    False) and `checkpoint_dir`, the latest committed checkpoint a resume starts from ("" for none).
    """

    def __init__(self, preemption_info, drain_timed_out: bool = False, message: str = "",
                 resumable: bool = True, checkpoint_dir: str = ""):
        super().__init__(message or "Training was preempted.")
        self.preemption_info = preemption_info
        self.drain_timed_out = drain_timed_out
        self.resumable = resumable
        self.checkpoint_dir = checkpoint_dir

    def __reduce__(self):
        return (self.__class__, (self.preemption_info, self.drain_timed_out, self.args[0], self.resumable,
                                 self.checkpoint_dir))


class LaunchError(MinitrainError):
    """Nodes or workers could not be started (agent start-up, pre-flight)."""


class RemoteWorkerError(MinitrainError):
    """Stands in for a worker's exception whose type cannot be rebuilt in the driver.

    `exc_type` is the qualified name of the original type; `traceback` its remote traceback text.
    """

    def __init__(self, exc_type: str, message: str, traceback: str = ""):
        super().__init__(f"{exc_type}: {message}" if message else exc_type)
        self.exc_type = exc_type
        self.remote_message = message
        self.traceback = traceback

    def __reduce__(self):
        return (self.__class__, (self.exc_type, self.remote_message, self.traceback))


class WorkerHangError(MinitrainError):
    """A rank made no progress (no report) past its hang deadline (`FailureConfig.worker_hang_timeout_s`).

    The message names the rank, its host and pid, the deadline and how it was set, its last report
    that reached the coordinator, and the ranks found merely waiting for it in a collective.

    `stacks` holds every thread's Python stack of that rank when it was found hung (empty when the
    process did not answer: stopped, or blocked in the kernel).
    """

    def __init__(self, message: str, stacks: str = ""):
        super().__init__(message)
        self.stacks = stacks

    def __reduce__(self):
        return (self.__class__, (self.args[0], self.stacks))


class NodeLostError(MinitrainError):
    """The node a rank ran on was lost: its agent died or its host stopped answering."""


class WorkerProcessError(MinitrainError):
    """A worker process died without raising: it exited with a code or was killed by a signal."""

    def __init__(self, message: str, exit_code: int | None = None, signal: int | None = None):
        super().__init__(message)
        self.exit_code = exit_code
        self.signal = signal

    def __reduce__(self):
        return (self.__class__, (self.args[0], self.exit_code, self.signal))


def _snippet(text: str) -> str:
    text = text.rstrip()
    if len(text) <= _SNIPPET_HEAD + _SNIPPET_TAIL:
        return text
    skipped = len(text) - _SNIPPET_HEAD - _SNIPPET_TAIL
    return f"{text[:_SNIPPET_HEAD]}\n... ({skipped} characters skipped) ...\n{text[-_SNIPPET_TAIL:]}"


def _grouping_key(failure: WorkerFailure) -> tuple:
    """Failures that differ only in numbers inside their text (pids, ranks, ports, addresses) render
    once; the phase, exception type, exit code and signal must match exactly."""
    text = re.sub(r"\d+", "#", f"{failure.message}|{failure.traceback}")
    return (failure.phase, failure.exc_type, failure.exit_code, failure.signal, failure.oom_suspected, text)


# Errors a healthy rank raises because a peer died: they are consequences, not root causes.
_PEER_LOSS = re.compile(
    r"Connection reset by peer|Connection closed by peer|Broken pipe|Socket Timeout|"
    r"NCCL communicator was aborted|ProcessGroupNCCL.*(?:abort|watchdog|timed out)|"
    r"DistNetworkError|connection to the rendezvous store",
    re.IGNORECASE,
)


def looks_like_peer_loss(failure: WorkerFailure) -> bool:
    """True when the failure is a consequence of another rank's: flagged so, or a collective that broke
    because a peer went away."""
    if failure.consequence:
        return True
    return bool(failure.exc_type) and bool(_PEER_LOSS.search(f"{failure.message}\n{failure.traceback}"))


def root_cause(failures: list[WorkerFailure]) -> WorkerFailure:
    """The earliest failure that is not a consequence of a peer's loss (else the earliest)."""
    ordered = sorted(failures, key=lambda f: (f.time, f.rank))
    primary = [f for f in ordered if not looks_like_peer_loss(f)]
    return (primary or ordered)[0]


def root_cause_line(failures: list[WorkerFailure]) -> str:
    """One line naming the root cause of `failures` (`root_cause`): its rank, node, pid, phase and cause,
    as the "Root cause:" line of `render_failures` says it; "" when there are none."""
    return _describe(root_cause(failures)) if failures else ""


def _describe(failure: WorkerFailure) -> str:
    return f"rank {failure.rank} on {failure.node} (pid {failure.pid}) {failure.phase.description}: {failure.cause}"


def _ranks_text(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ",".join(str(r) for r in ranks)


def render_failures(failures: list[WorkerFailure], attempt: int, remaining_hint: str = "") -> str:
    """The text of a `WorkerGroupError`: root cause first, identical failures grouped by rank.

    The root cause is the earliest failure that is not a mere consequence of a peer's loss (a gloo
    "Connection reset by peer" on a healthy rank, say); see `root_cause`. Each group shows the ranks, node, pid, phase and cause,
    then the traceback tail of its first member. `remaining_hint` is appended as the last line.
    """
    if not failures:
        return "Training failed, but no worker reported a failure."
    ordered = sorted(failures, key=lambda f: (f.time, f.rank))
    root = root_cause(failures)
    lines = [
        f"Training failed due to worker errors (attempt {attempt}).",
        f"Root cause: {_describe(root)}",
    ]
    groups: dict[str, list[WorkerFailure]] = {}
    for failure in ordered:
        groups.setdefault(_grouping_key(failure), []).append(failure)
    for members in groups.values():
        first = members[0]
        ranks = [m.rank for m in members]
        where = ", ".join(f"rank {m.rank} on {m.node} pid {m.pid}" for m in members)
        tag = " (root cause)" if first is root else ""
        lines.append("")
        lines.append(f"[{_ranks_text(ranks)}{tag}] {first.phase.description}: {first.cause}  ({where})")
        if first.traceback:
            lines.append(_snippet(first.traceback))
    if remaining_hint:
        lines.append("")
        lines.append(remaining_hint)
    return "\n".join(lines)


def render_failed_attempts(attempts: Sequence[FailedAttempt]) -> str:
    """The end-of-run summary of the failed attempts: one line per host (the root cause's), the host with
    the most first, each failure with the number of attempts it ended, e.g. "3 attempts failed on host
    vm: 3x rank 0 during training: RuntimeError: CUDA error: an illegal memory access"; "" for none."""
    by_host: dict[str, dict[str, int]] = {}
    for attempt in attempts:
        causes = by_host.setdefault(attempt.host, {})
        causes[attempt.what] = causes.get(attempt.what, 0) + 1
    lines = []
    for host, causes in sorted(by_host.items(), key=lambda item: -sum(item[1].values())):
        total = sum(causes.values())
        ranked = sorted(causes.items(), key=lambda item: -item[1])
        listed = "; ".join(f"{count}x {what}" for what, count in ranked[:_CAUSES_PER_HOST])
        if len(ranked) > _CAUSES_PER_HOST:
            listed += f"; {sum(count for _, count in ranked[_CAUSES_PER_HOST:])}x other causes"
        lines.append(f"{total} attempt{'s' if total != 1 else ''} failed on host {host}: {listed}")
    return "\n".join(lines)


def no_progress_line(attempts: Sequence[FailedAttempt], last_round: Optional[int]) -> str:
    """Why a run stopped for lack of progress, in one line: the attempts without progress (identical root
    causes grouped) and the run-wide index of the last committed round (None: none was), e.g. "no progress
    in the last 3 attempts: each failed during training with RuntimeError: boom (rank 0 on vm); last
    committed round 12"."""
    groups: dict[tuple, int] = {}
    for attempt in attempts:
        key = (attempt.phase, attempt.cause, attempt.rank, attempt.host)
        groups[key] = groups.get(key, 0) + 1

    def failed(phase, cause, rank, host) -> str:
        return f"failed {phase.description} with {cause} (rank {rank} on {host})"

    if len(groups) == 1:
        what = "each " + failed(*next(iter(groups)))
    else:
        what = ", ".join(f"{count} {failed(*key)}" for key, count in groups.items())
    where = "no round committed yet" if last_round is None else f"last committed round {last_round}"
    return f"no progress in the last {len(attempts)} attempts: {what}; {where}"


def rebuild_exception(failure: WorkerFailure, exc_pickle: Optional[bytes]) -> BaseException:
    """The exception a rank failed with, as the user sees it (`WorkerGroupError.worker_failures`,
    callbacks' `after_exception`): its own, unpickled from the bytes the worker sent over the
    authenticated channel, when that works in the driver; otherwise a minitrain error describing it
    (`RemoteWorkerError` for an exception, `WorkerHangError`, `NodeLostError`, `WorkerProcessError`)."""
    if exc_pickle:
        try:
            # The worker pickled it with cloudpickle, whose bytes the standard library reads
            # (cloudpickle.loads is pickle.loads), so this module stays stdlib-only.
            rebuilt = pickle.loads(exc_pickle)
            if isinstance(rebuilt, BaseException):
                return rebuilt
        except Exception:  # the type does not exist in the driver: fall back below
            pass
    if failure.kind is FailureKind.HANG:
        return WorkerHangError(failure.message, failure.traceback)
    if failure.kind is FailureKind.NODE_LOST:
        return NodeLostError(failure.message)
    if failure.kind in (FailureKind.EXCEPTION, FailureKind.COMMIT) and failure.exc_type:
        return RemoteWorkerError(failure.exc_type, failure.message, failure.traceback)
    return WorkerProcessError(f"rank {failure.rank} on {failure.node} (pid {failure.pid}) "
                              f"{failure.phase.description}: {failure.cause}",
                              exit_code=failure.exit_code, signal=failure.signal)
