"""Ranks that report one round in different upload modes, end to end (Ray's
test_report_mixed_checkpoint_upload_modes and test_report_checkpoint_upload_fn, ported): every pair of
SYNC, ASYNC, NO_UPLOAD and no checkpoint between two ranks, and a checkpoint_upload_fn on one rank only,
each commit one merged directory holding every rank's files, with the memory tier on (the default) and
off. The second run also checks that RunConfig(worker_runtime_env=...) reaches every rank.

Two 2-worker fit() runs on CPU with storage under tmp_path."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

import minitrain
from minitrain import CheckpointUploadMode, RunConfig, ScalingConfig
from minitrain.torch import TorchTrainer

pytestmark = pytest.mark.e2e

# Per rank: the iterations reported in each mode (Ray's table: all 10 pairs of modes between 2 ranks).
MODES = {
    0: {"ASYNC": [0, 1, 2, 3], "SYNC": [4, 5, 6], "NO_UPLOAD": [7, 8], "NONE": [9]},
    1: {"ASYNC": [0], "SYNC": [1, 4], "NO_UPLOAD": [2, 5, 7], "NONE": [3, 6, 8, 9]},
}


def _iteration(checkpoint):
    return -1 if checkpoint is None else int(checkpoint.path.rstrip("/").split("_")[-1])


def train_mixed_modes(config):
    rank = minitrain.get_context().get_world_rank()
    mode_of = {i: mode for mode, iterations in MODES[rank].items() for i in iterations}
    previous = -1
    for i in range(10):
        metrics = {"metric": f"iteration_{i}_shard_{rank}"}
        if mode_of[i] == "NONE":
            minitrain.report(metrics)
            assert previous <= _iteration(minitrain.get_checkpoint())
            continue
        name = f"checkpoint_iteration_{i}"
        if mode_of[i] == "NO_UPLOAD":
            directory = minitrain.get_context().get_storage().build_checkpoint_path_from_name(name)
        else:
            directory = os.path.join(config["scratch"], name, f"_{rank}")
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, f"shard_{rank}"), "w") as handle:
            handle.write(f"iteration_{i}_shard_{rank}")
        checkpoint = minitrain.Checkpoint(directory)
        minitrain.report(metrics, checkpoint=checkpoint, checkpoint_dir_name=name,
                         checkpoint_upload_mode=CheckpointUploadMode[mode_of[i]])
        latest = minitrain.get_checkpoint()
        if mode_of[i] == "SYNC":
            assert _iteration(latest) == i
        assert previous <= _iteration(latest)
        previous = _iteration(latest)


def test_every_pair_of_upload_modes_commits_every_rank_s_files(tmp_path):
    scratch = tmp_path / "scratch"
    result = TorchTrainer(train_mixed_modes, train_loop_config={"scratch": str(scratch)},
                          scaling_config=ScalingConfig(num_workers=2),
                          run_config=RunConfig(name="mixed", storage_path=str(tmp_path / "results"))).fit()
    assert len(result.best_checkpoints) == 9  # the round where neither rank has a checkpoint makes none
    for i, (checkpoint, metrics) in enumerate(result.best_checkpoints):
        assert checkpoint.path.endswith(f"checkpoint_iteration_{i}")
        assert metrics["metric"] == f"iteration_{i}_shard_0"
        expected = {f"shard_{rank}" for rank in (0, 1) if i not in MODES[rank]["NONE"]}
        assert set(os.listdir(checkpoint.path)) == expected, i
        for shard in expected:
            with open(os.path.join(checkpoint.path, shard)) as handle:
                assert handle.read() == f"iteration_{i}_{shard}"


# (rank 0's mode, rank 1's mode) per round; "fn": a checkpoint_upload_fn, None: no checkpoint.
UPLOAD_FN_PLAN = [("fn", "SYNC"), ("SYNC", "NO_UPLOAD"), ("fn", None), ("NO_UPLOAD", "fn")]


def train_upload_fn_on_one_rank(config):
    """Without a memory tier: rank 0 persists through a checkpoint_upload_fn while rank 1 uploads (SYNC),
    writes in place (NO_UPLOAD) or reports no checkpoint."""
    rank = minitrain.get_context().get_world_rank()
    storage = minitrain.get_context().get_storage()
    # RunConfig(worker_runtime_env=...) reaches every rank: its env_vars, and working_dir as the cwd.
    assert (os.environ.get("MT_RUNTIME_ENV"), os.getcwd()) == ("on every rank", config["working_dir"])

    def upload(checkpoint, dir_name):  # Ray's test_report_checkpoint_upload_fn
        target = storage.build_checkpoint_path_from_name(dir_name)
        shutil.copytree(checkpoint.path, target, dirs_exist_ok=True)
        return minitrain.Checkpoint.from_directory(target)

    for i, modes in enumerate(UPLOAD_FN_PLAN):
        mode = modes[rank]
        if mode is None:
            minitrain.report({"i": i})
            continue
        name = f"ckpt_{i}"
        with tempfile.TemporaryDirectory() as tmp:
            directory = storage.build_checkpoint_path_from_name(name) if mode == "NO_UPLOAD" else tmp
            os.makedirs(directory, exist_ok=True)
            with open(os.path.join(directory, f"shard_{rank}"), "w") as handle:
                handle.write(f"{i}/{rank}")
            kwargs = {"checkpoint_upload_fn": upload} if mode == "fn" else {
                "checkpoint_upload_mode": CheckpointUploadMode[mode]}
            minitrain.report({"i": i}, checkpoint=minitrain.Checkpoint(directory), checkpoint_dir_name=name,
                             **kwargs)


def test_checkpoint_upload_fn_on_some_ranks_merges_with_uploads_without_a_tier(tmp_path):
    working_dir = tmp_path / "wd"
    working_dir.mkdir()
    runtime_env = {"env_vars": {"MT_RUNTIME_ENV": "on every rank"}, "working_dir": str(working_dir)}
    result = TorchTrainer(train_upload_fn_on_one_rank, train_loop_config={"working_dir": str(working_dir)},
                          scaling_config=ScalingConfig(num_workers=2),
                          run_config=RunConfig(name="fn", storage_path=str(tmp_path / "results"),
                                               checkpoint_config=minitrain.CheckpointConfig(memory_tier_bytes=0),
                                               worker_runtime_env=runtime_env)).fit()
    assert [os.path.basename(c.path) for c, _ in result.best_checkpoints] == [f"ckpt_{i}" for i in range(4)]
    for i, (checkpoint, _) in enumerate(result.best_checkpoints):
        ranks = [rank for rank in (0, 1) if UPLOAD_FN_PLAN[i][rank] is not None]
        assert sorted(os.listdir(checkpoint.path)) == [f"shard_{rank}" for rank in ranks], i
        for rank in ranks:
            with open(os.path.join(checkpoint.path, f"shard_{rank}")) as handle:
                assert handle.read() == f"{i}/{rank}"
