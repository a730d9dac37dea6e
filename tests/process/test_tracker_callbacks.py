"""The MLflow tracker callback against a real MLflow file store under tmp_path, read back with MlflowClient
(tests/process: MLflow runs `uname -p` on its first use). The whole-run version is in
tests/e2e/test_tracker_runs.py."""

from __future__ import annotations

from minitrain.callbacks.runner import CallbackRunner
from minitrain.coordinator.observers import AttemptEnd
from minitrain.run_state import RunState
from minitrain.storage.retention import CheckpointRecord

from callbacks_support import context, failure, fit, round_


def test_mlflow_keeps_one_run_across_a_restart_and_a_resume(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps the file store behind this switch
    from mlflow.tracking import MlflowClient

    from minitrain.callbacks import MLflowLoggerCallback

    uri = (tmp_path / "mlruns").as_uri()
    failed = AttemptEnd(attempt=1, failures=(failure(),), root_cause="rank 1: ValueError: boom", restarting=True,
                        ended_at=0.0)
    (tmp_path / "run" / "checkpoint_1").mkdir(parents=True)
    (tmp_path / "run" / "checkpoint_1" / "model.txt").write_text("weights")
    record = CheckpointRecord(dir_name="checkpoint_1", metrics={}, report_index=1)
    first = MLflowLoggerCallback(uri, experiment_name="exp", tags={"team": "a"}, save_artifact=True)
    fit(CallbackRunner([first], context(tmp_path)), [round_(0, {"loss": 3.0}), round_(1, {"loss": 2.0}, checkpoint=record)],
        failed_attempt=failed, state=RunState.FAILED)
    second = MLflowLoggerCallback(uri, experiment_name="exp", tags={"team": "a"})
    fit(CallbackRunner([second], context(tmp_path, run_id="fit2")), [round_(2, {"loss": 1.0, "note": "text"})])

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("exp")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1 and first.run_id == second.run_id == runs[0].info.run_id
    run = runs[0]
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(0, 3.0), (1, 2.0), (2, 1.0)]
    assert run.data.params == {"train_loop_config/lr": "0.1", "scaling_config/num_workers": "2",
                               "scaling_config/use_gpu": "False", "scaling_config/resources_per_worker/CPU": "1.0"}
    assert run.data.tags["team"] == "a" and run.data.tags["minitrain.attempt_1.failure"] == "rank 1: ValueError: boom"
    assert run.data.tags["minitrain.latest_checkpoint"] == str(tmp_path / "run" / "checkpoint_1")
    assert run.info.status == "FINISHED"  # the resume succeeded, after the first fit ended FAILED
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id, "checkpoints/checkpoint_1")]
    assert artifacts == ["checkpoints/checkpoint_1/model.txt"]
