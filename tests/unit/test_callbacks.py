"""RunConfig.callbacks, in process: the CallbackRunner driven with RunObserver calls as the controller
makes them, a real run directory under tmp_path, and the real tracker libraries (TensorBoard's event
files read back with its EventAccumulator, the CSV and JSON files). MLflow runs `uname` on first use,
so it is in tests/process/test_tracker_callbacks.py; W&B starts a service process: tests/e2e."""

from __future__ import annotations

import csv
import json
import logging
import threading

import cloudpickle
import pytest

import minitrain
from minitrain import RunConfig, ScalingConfig
from minitrain.callbacks import Callback, CSVLoggerCallback, JsonLoggerCallback, TrainRunContext, UserCallback
from minitrain.callbacks.runner import CallbackRunner
from minitrain.config import FailureConfig
from minitrain.coordinator.observers import AttemptEnd, RunInfo
from minitrain.errors import ConfigError, RemoteWorkerError
from minitrain.records import RunOutcome
from minitrain.run_state import RunState
from minitrain.storage.filesystem import Storage
from minitrain.storage.retention import CheckpointRecord

from callbacks_support import WAIT_S, Recorder, context, failure, fit, round_


# ---------------------------------------------------------------------------------- config


def test_run_config_keeps_callbacks_and_names_a_bad_one_by_index():
    class AfterReportOnly:
        def after_report(self, run_context, metrics, checkpoint):
            pass

    good = [UserCallback(), AfterReportOnly()]
    assert RunConfig(name="r", callbacks=good).callbacks == tuple(good)
    with pytest.raises(ConfigError, match=r"callbacks\[1\] must be a minitrain.UserCallback.*builtins.int"):
        RunConfig(name="r", callbacks=[UserCallback(), 3])
    with pytest.raises(ConfigError, match=r"callbacks\[0\] is the class UserCallback, not an instance"):
        RunConfig(name="r", callbacks=[UserCallback])
    with pytest.raises(ConfigError, match="None or a list of callbacks"):
        RunConfig(name="r", callbacks=UserCallback())


@pytest.mark.parametrize("cls, kwargs, name", [
    (FailureConfig, {"relax_collectives_on_preemption": True}, "relax_collectives_on_preemption"),
    (FailureConfig, {"preemption_grace_s": 30.0}, "preemption_grace_s"),
    (ScalingConfig, {"elastic_resize_monitor_interval_s": 10}, "elastic_resize_monitor_interval_s"),
])
def test_rays_unsupported_arguments_name_themselves(cls, kwargs, name):
    with pytest.raises(ConfigError, match=rf"{cls.__name__}\.{name}=.* is not supported by minitrain yet"):
        cls(**kwargs)
    defaults = {"relax_collectives_on_preemption": False, "preemption_grace_s": 0,
                "elastic_resize_monitor_interval_s": 60.0}
    cls(**{name: defaults[name]})  # Ray's default is accepted: a ported script that spells it out runs


def test_user_callback_is_exported_where_ray_has_it():
    assert minitrain.UserCallback is UserCallback
    assert issubclass(Callback, UserCallback)


def test_a_missing_extra_is_named(monkeypatch):
    import sys

    from minitrain.callbacks.mlflow_logger import MLflowLoggerCallback

    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'minitrain\[mlflow\]'"):
        MLflowLoggerCallback()


# ---------------------------------------------------------------------------------- the runner


def test_calls_arrive_in_order_with_rays_arguments(tmp_path):
    recorder = Recorder()
    ctx = context(tmp_path, [recorder])
    (tmp_path / "run" / "checkpoint_1").mkdir()
    record = CheckpointRecord(dir_name="checkpoint_1", metrics={"loss": 1.0}, report_index=1)
    worker_error = ValueError("boom")
    failed = AttemptEnd(attempt=1, failures=(failure(),), root_cause="rank 1: ValueError: boom", restarting=True,
                        ended_at=0.0, exceptions={1: cloudpickle.dumps(worker_error)})
    runner = CallbackRunner([recorder], ctx)
    fit(runner, [round_(0, {"loss": 2.0}, {"loss": 2.5}), round_(1, {"loss": 1.0}, checkpoint=record)],
        failed_attempt=failed)
    names = [name for name, _, _ in recorder.calls]
    assert names == ["on_run_start", "on_attempt_start", "after_exception", "on_attempt_failure", "on_attempt_start",
                     "on_report", "after_report", "on_report", "on_checkpoint", "after_report", "on_run_end"]
    by_name = {}
    for name, args, kwargs in recorder.calls:
        by_name.setdefault(name, []).append((args, kwargs))
    (_, exc_kwargs), = by_name["after_exception"]
    assert exc_kwargs["run_context"] is ctx
    rebuilt = exc_kwargs["worker_exceptions"][1]
    assert type(rebuilt) is ValueError and str(rebuilt) == "boom"
    assert by_name["on_attempt_failure"][0][0][1:] == (1, "rank 1: ValueError: boom", True)
    first, second = by_name["after_report"]
    assert first[1]["metrics"] == [{"loss": 2.0}, {"loss": 2.5}] and first[1]["checkpoint"] is None
    checkpoint = second[1]["checkpoint"]
    assert isinstance(checkpoint, minitrain.Checkpoint) and checkpoint.path == str(tmp_path / "run" / "checkpoint_1")
    assert [args[1:] for args, _ in by_name["on_report"]] == [(0, {"loss": 2.0}), (1, {"loss": 1.0})]
    assert by_name["on_checkpoint"][0][0][1] == 1 and by_name["on_checkpoint"][0][0][2].path == checkpoint.path
    assert by_name["on_run_end"][0][0][1:] == ("SUCCEEDED", None)


def test_an_exception_the_driver_cannot_unpickle_arrives_as_a_remote_worker_error(tmp_path):
    recorder = Recorder()
    runner = CallbackRunner([recorder], context(tmp_path, [recorder]))
    failed = AttemptEnd(attempt=1, failures=(failure(exc_type="mymodule.DataError"),), root_cause="r",
                        restarting=False, ended_at=0.0, exceptions={1: b"not a pickle"})
    fit(runner, [], failed_attempt=failed, state=RunState.FAILED)
    (_, _, kwargs), = [c for c in recorder.calls if c[0] == "after_exception"]
    assert isinstance(kwargs["worker_exceptions"][1], RemoteWorkerError)
    assert [c[1][1:] for c in recorder.calls if c[0] == "on_run_end"] == [("FAILED", "it broke")]


def test_a_slow_callback_never_holds_up_the_controller(tmp_path):
    release = threading.Event()
    entered = threading.Event()

    class Slow(UserCallback):
        def after_report(self, run_context, metrics, checkpoint):
            entered.set()
            assert release.wait(WAIT_S)

    runner = CallbackRunner([Slow()], context(tmp_path))
    runner.on_run_start(RunInfo("fit1", "run", "p", 2, 0.0))
    for index in range(3):
        runner.on_round(round_(index, {"i": index}))  # returns while the callback is blocked
    assert entered.wait(WAIT_S)
    release.set()
    runner.on_run_end(RunOutcome(state=RunState.SUCCEEDED, attempt=1, last_metrics=None))
    assert not runner._thread.is_alive()


def test_the_drain_gives_up_after_its_deadline_and_says_which_call_is_stuck(tmp_path, caplog):
    release = threading.Event()

    class Stuck(UserCallback):
        def after_report(self, run_context, metrics, checkpoint):
            release.wait(WAIT_S)

    runner = CallbackRunner([Stuck()], context(tmp_path), drain_timeout_s=0.2)
    runner.on_run_start(RunInfo("fit1", "run", "p", 2, 0.0))
    runner.on_round(round_(0, {"i": 0}))
    with caplog.at_level(logging.WARNING, logger="minitrain"):
        runner.on_run_end(RunOutcome(state=RunState.SUCCEEDED, attempt=1, last_metrics=None))
    assert "still busy" in caplog.text and "Stuck.after_report" in caplog.text
    release.set()
    runner._thread.join(WAIT_S)
    assert not runner._thread.is_alive()


def test_a_raising_callback_is_logged_and_the_others_go_on(tmp_path, caplog):
    class Broken(UserCallback):
        def after_report(self, run_context, metrics, checkpoint):
            raise RuntimeError("tracker down")

    class BrokenAtStart(Callback):
        reports = 0

        def on_run_start(self, run_context):
            raise RuntimeError("cannot connect")

        def on_report(self, run_context, step, metrics):
            self.reports += 1

    broken_start, recorder = BrokenAtStart(), Recorder()
    runner = CallbackRunner([Broken(), broken_start, recorder], context(tmp_path))
    with caplog.at_level(logging.WARNING, logger="minitrain"):
        fit(runner, [round_(i, {"i": i}) for i in range(5)])
    assert runner.failures == {0: 5, 1: 1}
    assert caplog.text.count("RuntimeError: tracker down") == 3  # the first three, then only counted
    assert "is not called again in this run: its on_run_start failed" in caplog.text
    assert broken_start.reports == 0
    assert "Broken 5 time(s), BrokenAtStart 1 time(s)" in caplog.text
    assert [c[1][1] for c in recorder.calls if c[0] == "on_report"] == [0, 1, 2, 3, 4]


# ---------------------------------------------------------------------------------- file loggers


def test_csv_and_json_loggers_carry_on_in_the_same_files_across_a_resume(tmp_path):
    csv_logger, json_logger = CSVLoggerCallback(), JsonLoggerCallback()
    failed = AttemptEnd(attempt=1, failures=(failure(),), root_cause="rank 1: ValueError: boom", restarting=True,
                        ended_at=0.0)
    fit(CallbackRunner([csv_logger, json_logger], context(tmp_path)),
        [round_(0, {"loss": 3.0}), round_(1, {"loss": 2.0, "extra": {"acc": 0.5}})], failed_attempt=failed)
    (tmp_path / "run" / "checkpoint_3").mkdir()
    record = CheckpointRecord(dir_name="checkpoint_3", metrics={}, report_index=3)
    fit(CallbackRunner([CSVLoggerCallback(), JsonLoggerCallback()], context(tmp_path, run_id="fit2")),
        [round_(2, {"loss": 1.5, "step": 9}), round_(3, {"loss": 1.0}, checkpoint=record)])

    trackers = tmp_path / "run" / "trackers"
    rows = list(csv.DictReader((trackers / "progress.csv").open()))
    assert [row["step"] for row in rows] == ["0", "1", "2", "3"]
    assert [row["loss"] for row in rows] == ["3.0", "2.0", "1.5", "1.0"]
    assert [row["extra/acc"] for row in rows] == ["", "0.5", "", ""]  # a new column widened the header
    assert rows[2]["metrics/step"] == "9" and rows[0]["attempt"] == "2"
    lines = [json.loads(line) for line in (trackers / "result.json").read_text().splitlines()]
    assert [(entry["event"], entry["step"]) for entry in lines] == [
        ("attempt_failure", -1), ("report", 0), ("report", 1), ("run_end", 1),
        ("report", 2), ("report", 3), ("checkpoint", 3), ("run_end", 3)]
    assert lines[0]["error"] == "rank 1: ValueError: boom" and lines[0]["restarting"] is True
    assert lines[6]["path"] == str(tmp_path / "run" / "checkpoint_3")
    params = json.loads((trackers / "params.json").read_text())
    assert params == {"train_loop_config": {"lr": 0.1},
                      "scaling_config": {"num_workers": 2, "use_gpu": False, "resources_per_worker": {"CPU": 1.0}}}


# ---------------------------------------------------------------------------------- TensorBoard, MLflow


def test_tensorboard_events_read_back_as_one_run(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from minitrain.callbacks import TBXLoggerCallback, TensorBoardCallback

    assert TBXLoggerCallback is TensorBoardCallback
    fit(CallbackRunner([TensorBoardCallback()], context(tmp_path)), [round_(0, {"loss": 3.0, "n": {"a": 1}}),
                                                                     round_(1, {"loss": 2.0, "tag": "x"})])
    fit(CallbackRunner([TensorBoardCallback()], context(tmp_path, run_id="fit2")), [round_(2, {"loss": 1.0})])
    events = EventAccumulator(str(tmp_path / "run" / "trackers" / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(0, 3.0), (1, 2.0), (2, 1.0)]
    assert [e.step for e in events.Scalars("n/a")] == [0]
    assert len(events.Tensors("config")) == 1  # once, though the run was resumed
    config = json.loads(events.Tensors("config")[0].tensor_proto.string_val[0])
    assert config["train_loop_config"] == {"lr": 0.1}
    assert [e.tensor_proto.string_val[0] for e in events.Tensors("run_end")] == [b"SUCCEEDED", b"SUCCEEDED"]


def test_tensorboard_needs_a_logdir_for_a_remote_run_directory(tmp_path, caplog):
    from minitrain.callbacks import TensorBoardCallback

    storage = Storage.for_run("memory://tb-remote", "run")
    ctx = context(tmp_path)
    remote = TrainRunContext(**{**{f: getattr(ctx, f) for f in ctx.__dataclass_fields__}, "storage": storage})
    runner = CallbackRunner([TensorBoardCallback()], remote)
    with caplog.at_level(logging.ERROR, logger="minitrain"):
        fit(runner, [round_(0, {"loss": 1.0})])
    assert "Pass TensorBoardCallback(logdir=...)" in caplog.text and runner.failures == {0: 1}
