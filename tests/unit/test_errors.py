"""minitrain.errors: the rendering of worker failures and the public error types."""

from __future__ import annotations

import copy
import pickle
import signal

import pytest

from minitrain import errors
from minitrain.errors import (
    ConfigError,
    ControllerError,
    LaunchError,
    MinitrainError,
    RemoteWorkerError,
    TrainingFailedError,
    WorkerGroupError,
    WorkerProcessError,
    render_failures,
    root_cause_line,
)
from minitrain.records import Phase, WorkerFailure


def failure(rank: int, time: float, **fields) -> WorkerFailure:
    values = dict(rank=rank, node=f"host-{rank}", pid=4000 + rank, phase=Phase.TRAINING, time=time)
    values.update(fields)
    return WorkerFailure(**values)


def _blocks(text: str) -> list[str]:
    """The group header lines (they start with '[rank')."""
    return [line for line in text.splitlines() if line.startswith("[rank")]


# ---------------------------------------------------------------------------------- render_failures


def test_no_failures_says_so():
    assert "no worker reported a failure" in render_failures([], attempt=0)


def test_root_cause_is_the_earliest_failure_not_the_first_learned():
    late = failure(0, 20.0, exit_code=1)
    early = failure(3, 10.0, exc_type="builtins.RuntimeError", message="NCCL timeout",
                    phase=Phase.DIST_INIT)
    text = render_failures([late, early], attempt=4)
    lines = text.splitlines()
    assert lines[0] == "Training failed due to worker errors (attempt 4)."
    assert lines[1] == ("Root cause: rank 3 on host-3 (pid 4003) during process-group init: "
                        "RuntimeError: NCCL timeout")
    blocks = _blocks(text)
    assert blocks[0].startswith("[rank 3 (root cause)]") and blocks[1].startswith("[rank 0]")


@pytest.mark.parametrize("failures", [
    [failure(0, 20.0, exit_code=1), failure(3, 10.0, exc_type="builtins.RuntimeError", message="NCCL timeout")],
    [failure(2, 5.0, exit_code=1), failure(1, 5.0, signal=9, oom_suspected=True)],
    [failure(1, 1.0, exc_type="x.Y", message="Connection reset by peer"), failure(0, 2.0, exit_code=3)],
])
def test_the_root_cause_line_is_the_report_s_root_cause_line(failures):
    assert root_cause_line(failures) == render_failures(failures, 0).splitlines()[1].removeprefix("Root cause: ")


def test_no_failures_have_no_root_cause_line():
    assert root_cause_line([]) == ""


def test_equal_times_break_ties_by_rank():
    text = render_failures([failure(2, 5.0, exit_code=1), failure(1, 5.0, exit_code=2)], attempt=0)
    assert text.splitlines()[1].startswith("Root cause: rank 1 ")


def test_identical_failures_differing_only_in_numbers_are_grouped():
    def tb(rank: int, pid: int, port: int) -> str:
        return (f"Traceback (most recent call last):\n  File \"train.py\", line 12, in loop\n"
                f"ConnectionError: rank {rank} (pid {pid}) lost 10.0.0.{rank}:{port}\n")

    failures = [
        failure(rank, 1.0 + rank, exc_type="builtins.ConnectionError",
                message=f"rank {rank} (pid {4000 + rank}) lost 10.0.0.{rank}:{29500 + rank}",
                traceback=tb(rank, 4000 + rank, 29500 + rank))
        for rank in (1, 2, 3)
    ]
    failures.append(failure(0, 0.5, exc_type="builtins.ValueError", message="bad batch",
                            traceback="Traceback ...\nValueError: bad batch\n"))
    text = render_failures(failures, attempt=0)
    blocks = _blocks(text)
    assert len(blocks) == 2, text
    assert blocks[0].startswith("[rank 0 (root cause)]")
    assert blocks[1].startswith("[ranks 1,2,3] during training: ConnectionError:")
    for rank in (1, 2, 3):
        assert f"rank {rank} on host-{rank} pid {4000 + rank}" in blocks[1]
    # The grouped traceback is shown once (the first member's).
    assert text.count("ConnectionError: rank 1 (pid 4001)") == 2  # cause line + its traceback
    assert "rank 2 (pid 4002) lost" not in text.split(blocks[1])[1]


def test_failures_in_different_phases_are_not_grouped():
    text = render_failures([failure(0, 1.0, exit_code=1, phase=Phase.TRAINING),
                            failure(1, 2.0, exit_code=1, phase=Phase.DIST_INIT)], attempt=0)
    assert len(_blocks(text)) == 2


def test_different_signals_are_not_grouped():
    text = render_failures([failure(0, 1.0, signal=int(signal.SIGKILL)),
                            failure(1, 2.0, signal=int(signal.SIGSEGV))], attempt=0)
    assert len(_blocks(text)) == 2
    assert "SIGKILL (9)" in text and f"SIGSEGV ({int(signal.SIGSEGV)})" in text


def test_different_exit_codes_are_not_hidden_by_grouping():
    text = render_failures([failure(0, 1.0, exit_code=1), failure(1, 2.0, exit_code=137)], attempt=0)
    assert "exited with code 137" in text, text


def test_long_traceback_keeps_head_and_tail():
    head = "Traceback (most recent call last):\nHEAD-MARKER\n"
    middle = "".join(f"  File \"deep.py\", line {i}, in f{i}\n    MIDDLE-MARKER()\n" for i in range(2000))
    tail = "RuntimeError: TAIL-MARKER the real error\n"
    tb = head + middle + tail
    text = render_failures([failure(0, 1.0, exc_type="builtins.RuntimeError",
                                    message="TAIL-MARKER the real error", traceback=tb)], attempt=0)
    assert "HEAD-MARKER" in text
    assert text.rstrip().endswith("RuntimeError: TAIL-MARKER the real error")
    assert "characters skipped" in text
    assert len(text) < len(tb) // 4
    # The snippet's bounds come from the module's constants.
    shown = text.split("(root cause)]", 1)[1]
    assert len(shown) < errors._SNIPPET_HEAD + errors._SNIPPET_TAIL + 500


def test_short_traceback_is_kept_whole():
    tb = "Traceback (most recent call last):\n  File \"x.py\", line 1\nKeyError: 'k'"
    text = render_failures([failure(0, 1.0, exc_type="builtins.KeyError", message="'k'", traceback=tb)],
                           attempt=0)
    assert tb in text and "skipped" not in text


def test_signal_name_appears():
    text = render_failures([failure(2, 1.0, signal=9)], attempt=1)
    assert "killed by signal SIGKILL (9)" in text
    assert "out-of-memory" not in text


def test_unknown_signal_number_still_renders():
    text = render_failures([failure(0, 1.0, signal=77)], attempt=0)
    assert "signal 77 (77)" in text


def test_oom_annotation_when_suspected():
    text = render_failures([failure(0, 1.0, signal=9, oom_suspected=True)], attempt=0)
    assert "SIGKILL (9)" in text and "out-of-memory killer" in text


def test_exit_code_and_unknown_cause():
    text = render_failures([failure(0, 1.0, exit_code=3), failure(1, 2.0, phase=Phase.STARTUP)], attempt=0)
    assert "exited with code 3" in text
    assert "failed for an unknown reason" in text


def test_exception_cause_uses_short_type_name():
    f = failure(0, 1.0, exc_type="torch.distributed.DistBackendError", message="timeout", exit_code=1)
    assert f.cause == "DistBackendError: timeout"
    assert failure(0, 1.0, exc_type="builtins.KeyboardInterrupt").cause == "KeyboardInterrupt"


def test_hint_is_the_last_line():
    text = render_failures([failure(0, 1.0, exit_code=1)], attempt=0, remaining_hint="Raise max_failures.")
    assert text.splitlines()[-1] == "Raise max_failures."


# ---------------------------------------------------------------------------------- error types


def _roundtrip(exc: BaseException) -> BaseException:
    return pickle.loads(pickle.dumps(exc))


def test_worker_group_error_survives_pickle():
    inner = {0: ValueError("boom"), 3: WorkerProcessError("rank 3 died", exit_code=None, signal=9)}
    exc = WorkerGroupError("2 ranks failed", inner)
    back = _roundtrip(exc)
    assert type(back) is WorkerGroupError and str(back) == "2 ranks failed"
    assert sorted(back.worker_failures) == [0, 3]
    assert type(back.worker_failures[0]) is ValueError and back.worker_failures[0].args == ("boom",)
    assert back.worker_failures[3].signal == 9 and back.worker_failures[3].exit_code is None
    assert copy.deepcopy(exc).worker_failures.keys() == exc.worker_failures.keys()


def test_worker_group_error_copies_its_mapping():
    mapping = {0: ValueError("x")}
    exc = WorkerGroupError("m", mapping)
    mapping[1] = ValueError("y")
    assert list(exc.worker_failures) == [0]


def test_controller_error_survives_pickle():
    exc = ControllerError(OSError(28, "No space left on device"))
    back = _roundtrip(exc)
    assert type(back) is ControllerError and str(back) == str(exc)
    assert str(back).startswith("Training failed due to controller error:")
    assert isinstance(back.controller_failure, OSError) and back.controller_failure.errno == 28


def test_remote_worker_error_survives_pickle():
    exc = RemoteWorkerError("mylib.CustomError", "it broke", "Traceback ...\nmylib.CustomError: it broke")
    back = _roundtrip(exc)
    assert type(back) is RemoteWorkerError
    assert (back.exc_type, back.remote_message, back.traceback) == (exc.exc_type, "it broke", exc.traceback)
    assert str(back) == "mylib.CustomError: it broke"
    assert str(_roundtrip(RemoteWorkerError("mylib.Empty", ""))) == "mylib.Empty"


@pytest.mark.parametrize(("exit_code", "sig"), [(3, None), (None, 9), (None, None)])
def test_worker_process_error_survives_pickle(exit_code, sig):
    exc = WorkerProcessError("rank 1 died", exit_code=exit_code, signal=sig)
    back = _roundtrip(exc)
    assert type(back) is WorkerProcessError and str(back) == "rank 1 died"
    assert (back.exit_code, back.signal) == (exit_code, sig)


def test_config_error_survives_pickle():
    back = _roundtrip(ConfigError("ScalingConfig.num_workers=0: use >= 1"))
    assert type(back) is ConfigError and "num_workers" in str(back)


def test_hierarchy():
    assert not issubclass(TrainingFailedError, RuntimeError)
    assert issubclass(TrainingFailedError, MinitrainError)
    for cls in (WorkerGroupError, ControllerError):
        assert issubclass(cls, TrainingFailedError)
    assert issubclass(ConfigError, ValueError) and issubclass(ConfigError, MinitrainError)
    for cls in (LaunchError, RemoteWorkerError, WorkerProcessError):
        assert issubclass(cls, MinitrainError)
    with pytest.raises(TrainingFailedError):
        raise WorkerGroupError("m", {})


def test_public_names_are_exported_from_the_package():
    import minitrain

    for name in ("TrainingFailedError", "WorkerGroupError", "ControllerError", "ConfigError",
                 "RemoteWorkerError", "WorkerProcessError", "NoProgressError"):
        assert getattr(minitrain, name) is getattr(errors, name)


def test_peer_loss_errors_are_not_chosen_as_root_cause():
    # Rank 0's gloo error is stamped before rank 1's death was seen: the death is still the root.
    consequence = failure(0, 1.0, exc_type="builtins.RuntimeError",
                          message="[gloo/pair.cc:553] Connection closed by peer [127.0.0.1]:5000")
    death = failure(1, 1.2, signal=int(signal.SIGKILL))
    text = render_failures([consequence, death], attempt=0)
    assert "Root cause: rank 1 " in text and "SIGKILL" in text.splitlines()[1]
    # With only consequences at hand, the earliest one is still named.
    assert "Root cause: rank 0 " in render_failures([consequence], attempt=0)


# ---------------------------------------------------------------------------------- typed failure kinds


def _failure(kind, exc_type="", message="m", **fields):
    from minitrain.records import FailureKind

    return WorkerFailure(rank=1, node="h", pid=7, phase=Phase.TRAINING, time=0.0, exc_type=exc_type,
                         message=message, kind=FailureKind[kind], **fields)


@pytest.mark.parametrize("kind, exc_type, expected", [
    ("HANG", "WorkerHangError", "WorkerHangError"),
    ("NODE_LOST", "NodeLostError", "NodeLostError"),
    ("PROCESS", "", "WorkerProcessError"),
    ("PROCESS", "WorkerProcessError", "WorkerProcessError"),  # could not be started
    ("EXCEPTION", "mymodule.DataError", "RemoteWorkerError"),
    ("COMMIT", "StorageError", "RemoteWorkerError"),
    # A user's own exception class that happens to share a name with ours stays the user's.
    ("EXCEPTION", "mymodule.WorkerHangError", "RemoteWorkerError"),
    ("EXCEPTION", "NodeLostError", "RemoteWorkerError"),
])
def test_the_failure_kind_alone_picks_the_error_class(kind, exc_type, expected):
    from minitrain.errors import rebuild_exception

    rebuilt = rebuild_exception(_failure(kind, exc_type, exit_code=3), None)
    assert type(rebuilt).__name__ == expected


def test_a_worker_reports_only_exceptions_and_the_kind_never_travels():
    from minitrain.records import FailureKind
    from minitrain.rpc.convert import failure_from_message, failure_message

    sent = failure_message(_failure("HANG", "WorkerHangError"))  # whatever the record says ...
    assert not any(field.name == "kind" for field in sent.DESCRIPTOR.fields)
    received = failure_from_message(1, "h", 7, sent)
    assert received.kind is FailureKind.EXCEPTION  # ... a worker's report is an exception it raised


CUDA = "RuntimeError: CUDA error: an illegal memory access"


def _attempt(n: int, host: str = "vm", rank: int = 0, cause: str = CUDA, phase=Phase.TRAINING):
    from minitrain.records import FailedAttempt

    return FailedAttempt(attempt=n, host=host, rank=rank, phase=phase, cause=cause)


def test_the_failed_attempts_are_summed_up_by_host_with_their_repeats():
    assert errors.render_failed_attempts([_attempt(0), _attempt(1), _attempt(2)]) == (
        f"3 attempts failed on host vm: 3x rank 0 during training: {CUDA}")
    mixed = [_attempt(0, "gpu2", 3, "exited with code 1", Phase.STARTUP), _attempt(1), _attempt(2, "gpu2", 3),
             _attempt(3, "gpu2", 3, "exited with code 1", Phase.STARTUP), _attempt(4, "gpu1", 1, "ValueError: x")]
    assert errors.render_failed_attempts(mixed).splitlines() == [
        f"3 attempts failed on host gpu2: 2x rank 3 during start-up: exited with code 1; 1x rank 3 during training: "
        f"{CUDA}",
        f"1 attempt failed on host vm: 1x rank 0 during training: {CUDA}",
        "1 attempt failed on host gpu1: 1x rank 1 during training: ValueError: x"]
    many = [_attempt(n, cause=f"ValueError: {n % 5}") for n in range(10)]
    assert errors.render_failed_attempts(many).endswith("; 4x other causes")
    assert errors.render_failed_attempts([]) == ""


def test_the_no_progress_line_names_each_cause_once_and_the_last_committed_round():
    assert errors.no_progress_line([_attempt(0), _attempt(1), _attempt(2)], 41) == (
        f"no progress in the last 3 attempts: each failed during training with {CUDA} (rank 0 on vm); "
        "last committed round 41")
    assert errors.no_progress_line([_attempt(0), _attempt(1, "h2", 1, "exited with code 3", Phase.DIST_INIT),
                                    _attempt(2)], None) == (
        f"no progress in the last 3 attempts: 2 failed during training with {CUDA} (rank 0 on vm), 1 failed "
        "during process-group init with exited with code 3 (rank 1 on h2); no round committed yet")


def test_no_progress_error_is_a_worker_group_error_that_survives_pickle():
    attempts = (_attempt(0), _attempt(1))
    exc = errors.NoProgressError("no progress", {0: ValueError("x")}, attempts, attempts=2)
    assert isinstance(exc, WorkerGroupError) and isinstance(exc, TrainingFailedError)
    back = _roundtrip(exc)
    assert type(back) is errors.NoProgressError and str(back) == "no progress"
    assert (back.failed_attempts, back.attempts, list(back.worker_failures)) == (attempts, 2, [0])
    plain = _roundtrip(WorkerGroupError("m", {}, attempts))
    assert plain.failed_attempts == attempts and _roundtrip(WorkerGroupError("m", {})).failed_attempts == ()
