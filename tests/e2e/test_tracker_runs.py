"""RunConfig.callbacks in real runs: 2 workers, rank 1 fails once (max_failures=1), then the run is
resumed with more epochs. One pair of fits carries every tracker at once, each read back with its own
tools: a UserCallback's calls, TensorBoard's EventAccumulator, an MLflow file store through
MlflowClient, W&B's offline run files (WANDB_MODE=offline, everything under tmp_path), CSV and JSON."""

from __future__ import annotations

import csv
import glob
import json
import struct

import psutil
import pytest

from minitrain import FailureConfig, RunConfig, ScalingConfig, UserCallback
from minitrain.callbacks import (
    CSVLoggerCallback, JsonLoggerCallback, MLflowLoggerCallback, TensorBoardCallback, WandbLoggerCallback,
)
from minitrain.torch import TorchTrainer


def train_fails_once(config):
    import json
    import os
    import tempfile

    import minitrain

    rank = minitrain.get_context().get_world_rank()
    epoch = 0
    checkpoint = minitrain.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            with open(os.path.join(directory, "state.json")) as handle:
                epoch = json.load(handle)["epoch"] + 1
    for epoch in range(epoch, config["epochs"]):
        if epoch == 2 and rank == 1 and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            raise RuntimeError("injected failure")
        metrics = {"loss": 10.0 - epoch, "epoch": epoch, "rank": rank}
        if rank == 0:
            with tempfile.TemporaryDirectory() as directory:
                with open(os.path.join(directory, "state.json"), "w") as handle:
                    json.dump({"epoch": epoch}, handle)
                minitrain.report(metrics, checkpoint=minitrain.Checkpoint.from_directory(directory))
        else:
            minitrain.report(metrics)


class Recorder(UserCallback):
    def __init__(self):
        self.reports = []
        self.exceptions = []

    def after_report(self, run_context, metrics, checkpoint):
        self.reports.append((run_context.run_id, metrics, checkpoint))

    def after_exception(self, run_context, worker_exceptions):
        self.exceptions.append(worker_exceptions)


def wandb_records(path):
    """The records of a W&B offline run file (a LevelDB-style log of protobuf records, 32 KiB blocks)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    pos, pending, block = 7, b"", 32 * 1024
    while pos < len(data):
        left = block - pos % block
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (kind == 0 and length == 0):  # the padding at the end of a block
            pos += left
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


@pytest.fixture
def offline_trackers(tmp_path, monkeypatch):
    """W&B offline with every directory it writes under tmp_path; MLflow's file store allowed."""
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        (tmp_path / name.lower()).mkdir()
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps the file store behind this switch
    yield tmp_path
    import wandb

    wandb.teardown()  # stops W&B's service process
    left = [p for p in psutil.Process().children(recursive=True) if "wandb" in " ".join(p.cmdline())]
    assert not left, left


def test_every_tracker_keeps_one_run_across_a_restart_and_a_resume(offline_trackers):
    tmp_path = offline_trackers
    mlflow_uri = (tmp_path / "mlruns").as_uri()
    recorder = Recorder()
    callbacks = [recorder, TensorBoardCallback(), MLflowLoggerCallback(mlflow_uri, experiment_name="exp"),
                 WandbLoggerCallback(project="minitrain-test"), CSVLoggerCallback(), JsonLoggerCallback()]
    run_config = RunConfig(name="tracked", storage_path=str(tmp_path), callbacks=callbacks,
                           failure_config=FailureConfig(max_failures=1))
    for epochs in (4, 6):  # the second fit resumes the run directory
        result = TorchTrainer(train_fails_once, train_loop_config={"epochs": epochs, "marker": str(tmp_path / "m")},
                              scaling_config=ScalingConfig(num_workers=2), run_config=run_config).fit()
        assert result.metrics["epoch"] == epochs - 1
    run_dir = tmp_path / "tracked"
    expected = [(step, 10.0 - step) for step in range(6)]  # each step once, in order, across both fits

    # Ray's UserCallback: every round with both ranks' metrics and the committed checkpoint.
    assert [[m["rank"] for m in metrics] for _, metrics, _ in recorder.reports] == [[0, 1]] * 6
    for _, metrics, checkpoint in recorder.reports:  # the committed checkpoint of the round, in the run
        assert checkpoint.path.startswith(str(run_dir) + "/")
        assert json.loads(open(f"{checkpoint.path}/state.json").read())["epoch"] == metrics[0]["epoch"]
    assert len({run_id for run_id, _, _ in recorder.reports}) == 2  # one run id per fit()
    (failed,) = recorder.exceptions
    assert isinstance(failed[1], RuntimeError) and "injected failure" in str(failed[1])

    # TensorBoard: one log directory, the config once.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "trackers" / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == expected
    assert len(events.Tensors("config")) == 1 and len(events.Tensors("attempt_failure")) == 1

    # MLflow: one run, metrics by step, params once, finished.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("exp").experiment_id])
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")] == expected
    assert run.data.params["train_loop_config/epochs"] == "4"  # logged by the first fit, not again
    assert run.info.status == "FINISHED" and "injected failure" in run.data.tags["minitrain.attempt_0.failure"]

    # W&B offline: two local run directories (one per fit) of ONE W&B run id; steps once each.
    files = sorted(glob.glob(str(tmp_path / "wandb_dir" / "wandb" / "offline-run-*" / "run-*.wandb")))
    assert len(files) == 2 and len({f.rsplit("run-", 1)[1] for f in files}) == 1
    history, configs = [], []
    for path in files:
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                history.append((record.history.step.num, items.get("loss", items)))
            elif kind == "run":
                configs.append({i.key: json.loads(i.value_json) for i in record.run.config.update
                                if not i.key.startswith("_")})
    assert sorted(history) == expected
    assert [c.get("train_loop_config", {}).get("epochs") for c in configs].count(4) == 1

    # CSV and JSON lines in the run directory.
    rows = list(csv.DictReader((run_dir / "trackers" / "progress.csv").open()))
    assert [(int(r["step"]), float(r["loss"])) for r in rows] == expected
    lines = [json.loads(line) for line in (run_dir / "trackers" / "result.json").read_text().splitlines()]
    assert [e["step"] for e in lines if e["event"] == "report"] == list(range(6))
    assert [e["event"] for e in lines].count("attempt_failure") == 1
    assert [e["status"] for e in lines if e["event"] == "run_end"] == ["SUCCEEDED", "SUCCEEDED"]
