"""Drive a CallbackRunner the way the controller does, on a real run directory under tmp_path: shared by
tests/unit/test_callbacks.py and tests/process/test_tracker_callbacks.py."""

from __future__ import annotations

from minitrain import RunConfig, ScalingConfig
from minitrain.callbacks import Callback, TrainRunContext
from minitrain.callbacks.runner import CallbackRunner
from minitrain.config import DataConfig, TorchConfig
from minitrain.coordinator.observers import AttemptInfo, RoundInfo, RunInfo
from minitrain.records import FailureKind, Phase, RunOutcome, WorkerFailure
from minitrain.run_state import RunState
from minitrain.storage.filesystem import Storage

WAIT_S = 60  # generous: other helpers share the machine


def context(tmp_path, callbacks=(), config=None, run_id="fit1") -> TrainRunContext:
    storage = Storage.for_run(str(tmp_path), "run")
    storage.makedirs()
    run_config = RunConfig(name="run", storage_path=str(tmp_path), callbacks=list(callbacks))
    return TrainRunContext(run_id=run_id, run_config=run_config, train_loop_config=config or {"lr": 0.1},
                           scaling_config=ScalingConfig(num_workers=2), backend_config=TorchConfig(),
                           datasets={}, dataset_config=DataConfig(), storage=storage)


def round_(index, rank0, rank1=None, checkpoint=None, attempt=1) -> RoundInfo:
    return RoundInfo(attempt=attempt, index=index, metrics_by_rank=(rank0, rank1 if rank1 is not None else rank0),
                     checkpoint=checkpoint, completed_at=0.0)


def failure(rank=1, exc_type="ValueError", message="boom") -> WorkerFailure:
    return WorkerFailure(rank=rank, node="h", pid=7, phase=Phase.TRAINING, time=0.0, exc_type=exc_type,
                         message=message, kind=FailureKind.EXCEPTION)


def fit(runner: CallbackRunner, rounds, failed_attempt=None, state=RunState.SUCCEEDED) -> None:
    """The calls the controller makes for one fit(): an optional failed first attempt, then `rounds`."""
    runner.on_run_start(RunInfo(runner.context.run_id, "run", runner.context.run_path, 2, 0.0))
    attempt = 1
    if failed_attempt is not None:
        runner.on_attempt_start(AttemptInfo(1, ("h", "h"), 0.0))
        runner.on_attempt_end(failed_attempt)
        attempt = 2
    runner.on_attempt_start(AttemptInfo(attempt, ("h", "h"), 0.0))
    for each in rounds:
        runner.on_round(each)
    runner.on_run_end(RunOutcome(state=state, attempt=attempt, last_metrics=None,
                                 error_message="" if state is RunState.SUCCEEDED else "it broke"))


class Recorder(Callback):
    def __init__(self):
        self.calls = []

    def __getattribute__(self, name):
        attr = object.__getattribute__(self, name)
        if name in ("on_run_start", "on_attempt_start", "on_report", "on_checkpoint", "on_attempt_failure",
                    "on_run_end", "after_report", "after_exception"):
            def record(*args, **kwargs):
                object.__getattribute__(self, "calls").append((name, args, kwargs))
            return record
        return attr
