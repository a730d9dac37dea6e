"""A round whose ranks used different upload modes: the round hands back the ranks that wrote into the
run directory themselves (NO_UPLOAD, checkpoint_upload_fn), and the checkpoint manager merges the
staged ranks' files into the directory those ranks wrote instead of refusing it. The end-to-end mixes
are in tests/e2e/test_upload_mode_mixes.py."""

from __future__ import annotations

import pytest

from minitrain import CheckpointConfig
from minitrain.coordinator.policy.rounds import RoundTracker
from minitrain.storage.retention import CheckpointRecord
from minitrain.storage.checkpoint_manager import CheckpointManager
from minitrain.storage.filesystem import Storage, StorageError
from minitrain.storage.layout import staged_dir


def test_a_round_hands_back_its_staged_tier_and_in_place_ranks():
    tracker = RoundTracker(3)
    tracker.add(0, 0, "{}", "ckpt", staged=True)
    tracker.add(1, 0, "{}", "ckpt", in_tier=True)
    [done] = tracker.add(2, 0, "{}", "ckpt")
    assert (done.staged_ranks, done.tier_ranks, done.in_place_ranks) == ((0,), (1,), (2,))


def test_a_rank_without_a_checkpoint_is_not_in_place():
    tracker = RoundTracker(2)
    tracker.add(0, 0, "{}", "ckpt", staged=True)
    [done] = tracker.add(1, 0, "{}", "")
    assert done.in_place_ranks == ()


@pytest.fixture
def storage(tmp_path):
    storage = Storage.for_run(str(tmp_path), "run")
    storage.makedirs()
    return storage


def _write(storage, rel, text):
    storage.makedirs(rel)
    storage.write_text_atomic(f"{rel}/{text}", text)


def test_staged_files_merge_into_the_directory_a_no_upload_rank_wrote(storage):
    manager = CheckpointManager.load(storage, CheckpointConfig())
    _write(storage, "ckpt", "shard_1")  # rank 1 wrote in place
    _write(storage, staged_dir(0, 0, "ckpt"), "shard_0")  # rank 0 uploaded to staging
    manager.expect_in_place("ckpt")
    manager.commit(CheckpointRecord("ckpt", {}, 0, 0, committed_at=1.0), (staged_dir(0, 0, "ckpt"),))
    assert sorted(storage.list_entries("ckpt")) == ["shard_0", "shard_1"]
    assert [r.dir_name for r in manager.records] == ["ckpt"]


def test_a_directory_no_rank_of_the_round_wrote_is_still_refused(storage):
    manager = CheckpointManager.load(storage, CheckpointConfig())
    _write(storage, "ckpt", "planted")
    _write(storage, staged_dir(0, 0, "ckpt"), "shard_0")
    with pytest.raises(StorageError, match="did not create"):
        manager.commit(CheckpointRecord("ckpt", {}, 0, 0, committed_at=1.0), (staged_dir(0, 0, "ckpt"),))
    assert storage.list_entries("ckpt") == ["planted"]
