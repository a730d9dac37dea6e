"""Checkpoints end to end: real workers upload, the coordinator commits, runs resume.

Each test runs 2 gloo workers on CPU through `TorchTrainer.fit()` with storage under tmp_path (or
a real S3-compatible server on loopback).
"""

from __future__ import annotations

import json
import os
import tempfile

import pytest

import minitrain
from minitrain import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from minitrain.storage.checkpoint_manager import INDEX_NAME
from minitrain.torch import TorchTrainer

pytestmark = pytest.mark.e2e


def _fit(fn, tmp_path, config=None, name="ckpt", num_workers=2, **run_kwargs):
    run_kwargs.setdefault("storage_path", str(tmp_path / "results"))
    return TorchTrainer(fn, train_loop_config=config or {},
                        scaling_config=ScalingConfig(num_workers=num_workers),
                        run_config=RunConfig(name=name, **run_kwargs)).fit()


def _run_dirs(run_path: str) -> set[str]:
    return {d for d in os.listdir(run_path) if os.path.isdir(os.path.join(run_path, d)) and d != "logs"}


# ---------------------------------------------------------------------------------- merged directories


def train_each_rank_writes_a_file(config):
    rank = minitrain.get_context().get_world_rank()
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, f"rank{rank}.txt"), "w") as handle:
            handle.write(f"from rank {rank}")
        minitrain.report({"rank": rank}, checkpoint=minitrain.Checkpoint.from_directory(tmp))
    # This rank's own get_checkpoint() now points at the persisted, merged directory.
    with minitrain.get_checkpoint().as_directory() as merged:
        assert os.path.exists(os.path.join(merged, f"rank{rank}.txt"))


def test_ranks_merge_into_one_committed_directory(tmp_path):
    result = _fit(train_each_rank_writes_a_file, tmp_path)

    merged = result.checkpoint.path
    assert sorted(os.listdir(merged)) == ["rank0.txt", "rank1.txt"]
    assert os.path.basename(merged) == "checkpoint_000000"
    index = json.loads(open(os.path.join(result.path, INDEX_NAME)).read())
    assert index["latest_checkpoint_result"]["checkpoint_dir_name"] == "checkpoint_000000"


# ---------------------------------------------------------------------------------- top-K retention


def train_scored_rounds(config):
    rank = minitrain.get_context().get_world_rank()
    for step, score in enumerate(config["scores"]):
        metrics = {"step": step} if score is None else {"step": step, "score": score}
        checkpoint = None
        with tempfile.TemporaryDirectory() as tmp:
            if rank == 0:  # the usual pattern: rank 0 saves, the others pass None
                with open(os.path.join(tmp, "model.txt"), "w") as handle:
                    handle.write(str(step))
                checkpoint = minitrain.Checkpoint.from_directory(tmp)
            minitrain.report(metrics, checkpoint=checkpoint)


def test_top_k_on_disk_after_six_rounds(tmp_path):
    scores = [5, None, 1, 7, None, 3]
    result = _fit(train_scored_rounds, tmp_path, {"scores": scores},
                  checkpoint_config=CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="score",
                                                     checkpoint_score_order="max"))

    # Kept: the two best (scores 7 and 5) and, always, the latest (3). Missing scores rank worst.
    assert _run_dirs(result.path) == {"checkpoint_000000", "checkpoint_000003", "checkpoint_000005"}
    assert [m["score"] for _, m in result.best_checkpoints] == [5, 7]
    assert result.checkpoint.path.endswith("checkpoint_000005")
    assert result.get_best_checkpoint("score", "max").path.endswith("checkpoint_000003")
    history = [json.loads(line) for line in open(os.path.join(result.path, "metrics.jsonl"))]
    assert [h["metrics"]["step"] for h in history] == list(range(6))
    assert result.metrics == {"step": 5, "score": 3}


# ---------------------------------------------------------------------------------- ASYNC uploads


def train_async(config):
    rank = minitrain.get_context().get_world_rank()
    seen_before_upload = []
    for step in range(3):
        with tempfile.TemporaryDirectory() as tmp:  # deleted as soon as report() returns
            with open(os.path.join(tmp, f"r{rank}_s{step}.txt"), "w") as handle:
                handle.write("x" * 1000)
            minitrain.report({"step": step}, checkpoint=minitrain.Checkpoint.from_directory(tmp),
                             checkpoint_upload_mode=minitrain.CheckpointUploadMode.ASYNC)
        target = os.path.join(config["run_path"], f"checkpoint_{step:06d}", f"r{rank}_s{step}.txt")
        seen_before_upload.append(os.path.exists(target))
        minitrain.report({"step": step, "metrics_only": True})  # queued behind the upload, in order
    if rank == 0:
        with open(config["probe"], "w") as handle:
            json.dump(seen_before_upload, handle)


def test_async_uploads_return_at_once_and_all_commit_in_order(tmp_path):
    from tests_support_slowfs import SlowLocalFileSystem

    run_path = str(tmp_path / "results" / "async")
    probe = str(tmp_path / "probe.json")
    result = _fit(train_async, tmp_path, {"run_path": run_path, "probe": probe}, name="async",
                  storage_filesystem=SlowLocalFileSystem(delay_s=0.4))

    assert json.load(open(probe)) == [False, False, False]  # report() did not wait for the upload
    assert _run_dirs(run_path) == {"checkpoint_000000", "checkpoint_000002", "checkpoint_000004"}
    for step, name in enumerate(["checkpoint_000000", "checkpoint_000002", "checkpoint_000004"]):
        assert sorted(os.listdir(os.path.join(run_path, name))) == [f"r0_s{step}.txt", f"r1_s{step}.txt"]
    history = [json.loads(line)["metrics"] for line in open(os.path.join(run_path, "metrics.jsonl"))]
    assert history == [{"step": 0}, {"step": 0, "metrics_only": True}, {"step": 1},
                       {"step": 1, "metrics_only": True}, {"step": 2}, {"step": 2, "metrics_only": True}]
    assert result.metrics == {"step": 2, "metrics_only": True}


# ---------------------------------------------------------------------------------- resume


def train_epochs_with_resume(config):
    start = 0
    checkpoint = minitrain.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            start = json.load(open(os.path.join(directory, "state.json")))["epoch"] + 1
    import torch.distributed as dist

    rank = minitrain.get_context().get_world_rank()
    for epoch in range(start, config["epochs"]):
        dist.barrier()  # lock-step like DDP's gradient all-reduce: no rank runs an epoch ahead
        if config.get("fail_at") == epoch and rank == 1 and not os.path.exists(config["failed_once"]):
            open(config["failed_once"], "w").close()
            raise RuntimeError(f"injected failure at epoch {epoch}")
        with tempfile.TemporaryDirectory() as tmp:
            json.dump({"epoch": epoch}, open(os.path.join(tmp, "state.json"), "w"))
            minitrain.report({"epoch": epoch, "start": start}, checkpoint=minitrain.Checkpoint.from_directory(tmp))
    return {"started_at": start}


def test_rerunning_fit_resumes_from_the_latest_checkpoint(tmp_path):
    first = _fit(train_epochs_with_resume, tmp_path, {"epochs": 3}, name="resume")
    assert first.metrics == {"epoch": 2, "start": 0} and first.return_value == {"started_at": 0}

    second = _fit(train_epochs_with_resume, tmp_path, {"epochs": 5}, name="resume")
    assert second.metrics == {"epoch": 4, "start": 3} and second.return_value == {"started_at": 3}
    history = [json.loads(line) for line in open(os.path.join(second.path, "metrics.jsonl"))]
    assert [h["metrics"]["epoch"] for h in history] == [0, 1, 2, 3, 4]
    assert [h["report_index"] for h in history] == [0, 1, 2, 3, 4]
    assert [m["epoch"] for _, m in second.best_checkpoints] == [0, 1, 2, 3, 4]


def test_restore_and_can_restore(tmp_path):
    run_path = str(tmp_path / "results" / "restorable")
    assert not TorchTrainer.can_restore(run_path)
    _fit(train_epochs_with_resume, tmp_path, {"epochs": 2}, name="restorable")
    assert TorchTrainer.can_restore(run_path)

    trainer = TorchTrainer.restore(run_path, train_epochs_with_resume, train_loop_config={"epochs": 3},
                                   scaling_config=ScalingConfig(num_workers=2))
    result = trainer.fit()
    assert result.metrics == {"epoch": 2, "start": 2}
    assert minitrain.Result.from_path(run_path).checkpoint.path.endswith("checkpoint_000002")


def test_failure_within_budget_restarts_from_the_latest_checkpoint(tmp_path):
    config = {"epochs": 4, "fail_at": 2, "failed_once": str(tmp_path / "failed_once")}
    result = _fit(train_epochs_with_resume, tmp_path, config, name="restart",
                  failure_config=FailureConfig(max_failures=1))
    assert result.metrics == {"epoch": 3, "start": 2}  # attempt 1 resumed after epoch 1's checkpoint
    assert os.path.exists(config["failed_once"])


# ---------------------------------------------------------------------------------- memory:// on one node


def test_memory_storage_on_one_node_commits_evicts_and_resumes(tmp_path):
    import glob
    import uuid

    import fsspec

    fs = fsspec.filesystem("memory")
    base = f"/minitrain-e2e-{uuid.uuid4().hex}"
    staging = os.path.join(tempfile.gettempdir(), "minitrain_memory_run_*")
    staged_before = set(glob.glob(staging))
    keep_two = CheckpointConfig(num_to_keep=2)
    try:
        first = _fit(train_epochs_with_resume, tmp_path, {"epochs": 3}, name="mem",
                     storage_path=f"memory://{base}", checkpoint_config=keep_two)
        second = _fit(train_epochs_with_resume, tmp_path, {"epochs": 5}, name="mem",
                      storage_path=f"memory://{base}", checkpoint_config=keep_two)

        assert first.metrics == {"epoch": 2, "start": 0}
        assert second.metrics == {"epoch": 4, "start": 3}  # resumed from the memory run directory
        run = f"{base}/mem"
        # Result.filesystem is pyarrow's wrapper of the run's fsspec filesystem when pyarrow is installed.
        handed = second.filesystem
        assert second.path == run and (handed is fs or handed.handler.fs is fs)
        dirs = {p.rsplit("/", 1)[1] for p in fs.ls(run, detail=False) if fs.isdir(p)}
        assert dirs == {"checkpoint_000003", "checkpoint_000004", "logs"}  # evictions reached memory too
        assert fs.exists(f"{run}/{INDEX_NAME}") and fs.exists(f"{run}/logs/attempt_0/rank_1.log")
        history = [json.loads(line)["metrics"]["epoch"] for line in fs.cat_file(f"{run}/metrics.jsonl").splitlines()]
        assert history == [0, 1, 2, 3, 4]
        assert second.checkpoint.path == f"{run}/checkpoint_000004"
        with second.checkpoint.as_directory() as local:
            assert json.load(open(os.path.join(local, "state.json"))) == {"epoch": 4}
        assert set(glob.glob(staging)) == staged_before  # the local working copies are gone
    finally:
        if fs.exists(base):
            fs.rm(base, recursive=True)


# ---------------------------------------------------------------------------------- S3 on loopback


def test_s3_storage_on_a_loopback_server(tmp_path, s3):
    fs = s3.filesystem()
    result = _fit(train_epochs_with_resume, tmp_path, {"epochs": 2}, name="s3run",
                  storage_path=f"{s3.bucket}/runs", storage_filesystem=fs)

    assert fs.exists(f"{s3.bucket}/runs/s3run/{INDEX_NAME}")
    assert fs.exists(f"{s3.bucket}/runs/s3run/checkpoint_000001/state.json")
    assert fs.exists(f"{s3.bucket}/runs/s3run/logs/attempt_0/rank_0.log")
    with result.checkpoint.as_directory() as local:
        assert json.load(open(os.path.join(local, "state.json"))) == {"epoch": 1}
    again = minitrain.Result.from_path(f"{s3.bucket}/runs/s3run", storage_filesystem=fs)
    assert again.checkpoint.path == result.checkpoint.path


# ---------------------------------------------------------------------------------- guarantees


def train_checkpoint_then_die(config):
    import time

    import torch.distributed as dist

    rank = minitrain.get_context().get_world_rank()
    with tempfile.TemporaryDirectory() as tmp:
        open(os.path.join(tmp, f"rank{rank}.txt"), "w").close()
        minitrain.report({"step": 0}, checkpoint=minitrain.Checkpoint.from_directory(tmp))
    dist.barrier()  # now report() has returned on every rank
    if rank == 1:
        os._exit(1)  # dies right after
    time.sleep(600)


def test_checkpoint_that_returned_on_every_rank_is_committed_even_if_a_rank_dies_next(tmp_path):
    with pytest.raises(minitrain.WorkerGroupError):
        _fit(train_checkpoint_then_die, tmp_path, name="durable")
    run_path = tmp_path / "results" / "durable"
    index = json.loads((run_path / INDEX_NAME).read_text())
    assert index["latest_checkpoint_result"]["checkpoint_dir_name"] == "checkpoint_000000"
    assert sorted(os.listdir(run_path / "checkpoint_000000")) == ["rank0.txt", "rank1.txt"]


def train_reports_then_raises(config):
    for i in range(config["reports"]):
        minitrain.report({"i": i})
    raise ValueError("after the reports")


def test_metrics_only_reports_are_flushed_before_a_failure(tmp_path):
    with pytest.raises(minitrain.WorkerGroupError):
        _fit(train_reports_then_raises, tmp_path, {"reports": 500}, name="flushed", num_workers=1)
    lines = (tmp_path / "results" / "flushed" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["metrics"]["i"] for line in lines] == list(range(500))


def train_lists_checkpoints(config):
    import torch.distributed as dist

    rank = minitrain.get_context().get_world_rank()
    for step in range(3):
        with tempfile.TemporaryDirectory() as tmp:
            open(os.path.join(tmp, f"w{rank}.txt"), "w").close()
            # Every rank passes a checkpoint, so each report() returns once recorded ...
            minitrain.report({"step": step}, checkpoint=minitrain.Checkpoint.from_directory(tmp))
    dist.barrier()  # ... and after this barrier every round has been committed.
    listed = minitrain.get_all_reported_checkpoints()
    if minitrain.get_context().get_world_rank() == 0:
        json.dump([[os.path.basename(c.checkpoint.path), c.metrics] for c in listed], open(config["out"], "w"))


def test_get_all_reported_checkpoints_lists_the_committed_ones(tmp_path):
    out = str(tmp_path / "listed.json")
    _fit(train_lists_checkpoints, tmp_path, {"out": out}, name="listed")
    assert json.load(open(out)) == [["checkpoint_000000", {"step": 0}], ["checkpoint_000001", {"step": 1}],
                                    ["checkpoint_000002", {"step": 2}]]
