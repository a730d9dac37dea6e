"""Checkpoint commit, retention on disk, resume, corrupt indexes, garbage, and crash safety
(minitrain.storage.checkpoint_manager), on the local filesystem, memory:// and a real S3 API (moto).

The crash property runs on local and memory:// only (fast); S3 differs from them in no way the
manager relies on.
"""

from __future__ import annotations

import json
import logging
import math
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minitrain.storage.checkpoint_manager import (INDEX_NAME, METRICS_NAME, CheckpointIndexError, CheckpointManager)
from minitrain.config import CheckpointConfig
from minitrain.storage.filesystem import TEMP_SUFFIX, VALIDATE_MARKER, Storage, StorageError, is_temp_name
from minitrain.storage.layout import STAGING_DIR, staged_dir
from minitrain.storage.retention import CheckpointRecord, retain

FILE = "model.txt"


def _memory_storage() -> Storage:
    return Storage.for_run(f"memory://minitrain-test-{uuid.uuid4().hex}", "run")


def _drop(storage: Storage) -> None:
    if not storage.is_local and storage.fs.exists(storage.root):  # memory:// is process-global
        storage.fs.rm(storage.root, recursive=True)


def _make_storage(request, tmp_path):
    if request.param == "s3":  # a real S3 API (moto) with its own bucket; skipped without s3fs/moto
        s3 = request.getfixturevalue("s3")
        yield Storage.for_run(s3.url("results"), "run", filesystem=s3.filesystem())
        return
    made = Storage.for_run(str(tmp_path / "results"), "run") if request.param == "local" else _memory_storage()
    yield made
    _drop(made)


@pytest.fixture(params=["local", "memory"])
def storage(request, tmp_path):
    yield from _make_storage(request, tmp_path)


@pytest.fixture(params=["local", "memory", "s3"])
def any_storage(request, tmp_path):
    """Also S3, for the tests where a backend could matter (~1 s each against moto)."""
    yield from _make_storage(request, tmp_path)


def upload(storage, name: str) -> None:
    """What a worker's checkpoint upload does: the directory, then its file."""
    storage.makedirs(name)
    storage.write_text_atomic(f"{name}/{FILE}", name)


def stage(storage, name: str) -> None:
    """What a worker's upload does now: the files of checkpoint `name` in rank 0's staging directory."""
    storage.makedirs(staged_dir(0, 0, name))
    storage.write_text_atomic(f"{staged_dir(0, 0, name)}/{FILE}", name)


def record(index: int, score=None, attempt: int = 0) -> CheckpointRecord:
    metrics = {"epoch": index} if score is None else {"epoch": index, "score": score}
    return CheckpointRecord(f"checkpoint_{index:06d}", metrics, index, attempt, committed_at=1000.0 + index)


def commit(manager: CheckpointManager, index: int, score=None):
    upload(manager.storage, f"checkpoint_{index:06d}")
    return manager.register(record(index, score))


def names(records):
    return [r.dir_name for r in records]


TOP2 = CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="score", checkpoint_score_order="max")


# ---------------------------------------------------------------------------------- commits


def test_disk_holds_exactly_the_kept_checkpoints(any_storage):
    storage = any_storage
    manager = CheckpointManager.load(storage, TOP2)
    assert not manager.resumed and manager.records == () and manager.latest is None
    scores = [5, None, 1, 7, None, 3, 9, 2, 8, 8]
    for index, score in enumerate(scores, start=1):
        retention = commit(manager, index, score)
        assert set(storage.list_dirs()) == manager.committed_dir_names
        assert not set(names(retention.evicted)) & manager.committed_dir_names
        assert manager.latest == record(index, score) and manager.report_index == index
        assert len(manager.records) <= 3
    assert names(manager.records) == ["checkpoint_000010", "checkpoint_000007"]  # 8 (the newer 8), 9
    assert names(manager.best()) == ["checkpoint_000010", "checkpoint_000007"]
    index = json.loads(storage.read_text(INDEX_NAME))
    assert set(index) == {"minitrain_version", "format", "checkpoint_config", "checkpoint_results",
                          "latest_checkpoint_result", "current_report_index", "created_uncommitted",
                              "preemptions"}
    assert index["checkpoint_config"] == {"num_to_keep": 2, "checkpoint_score_attribute": "score",
                                          "checkpoint_score_order": "max"}
    assert [r["checkpoint_dir_name"] for r in index["checkpoint_results"]] == names(manager.records)
    assert index["checkpoint_results"][0] == {"checkpoint_dir_name": "checkpoint_000010",
                                              "metrics": {"epoch": 10, "score": 8}, "report_index": 10,
                                              "attempt": 0, "committed_at": 1010.0, "durable_at": 0.0}
    assert index["latest_checkpoint_result"]["checkpoint_dir_name"] == "checkpoint_000010"
    assert index["current_report_index"] == 10


def test_latest_is_kept_beyond_the_top_k(storage):
    manager = CheckpointManager.load(storage, TOP2)
    for index, score in enumerate([5, 7, 1], start=1):
        commit(manager, index, score)
    assert names(manager.records) == ["checkpoint_000003", "checkpoint_000001", "checkpoint_000002"]
    assert names(manager.best()) == ["checkpoint_000001", "checkpoint_000002"]
    assert storage.list_dirs() == ["checkpoint_000001", "checkpoint_000002", "checkpoint_000003"]


def test_resume_continues_where_the_index_left_off(any_storage):
    storage = any_storage
    first = CheckpointManager.load(storage, TOP2)
    for index, score in enumerate([5, 1, 7, 3], start=1):
        commit(first, index, score)
    first.advance_report_index(6)  # two rounds without a checkpoint
    first.save()
    resumed = CheckpointManager.load(storage, TOP2)
    assert resumed.resumed
    assert resumed.records == first.records and resumed.latest == first.latest == record(4, 3)
    assert resumed.report_index == 6
    with pytest.raises(ValueError, match="increasing order"):
        resumed.register(record(4, 99))
    commit(resumed, 7, 6)
    assert names(resumed.records) == ["checkpoint_000007", "checkpoint_000003"]  # 6 and 7; 3 and 5 evicted
    assert set(storage.list_dirs()) == resumed.committed_dir_names


def test_a_resumed_run_with_a_new_config_deletes_nothing_until_the_next_commit(any_storage):
    storage = any_storage
    keep_all = CheckpointConfig(checkpoint_score_attribute="score")
    manager = CheckpointManager.load(storage, keep_all)
    for index, score in enumerate([5, 1, 7, 3], start=1):
        commit(manager, index, score)
    narrower = CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="score")
    resumed = CheckpointManager.load(storage, narrower)
    assert names(resumed.records) == ["checkpoint_000004", "checkpoint_000003"]  # latest (3) + best (7)
    assert len(storage.list_dirs()) == 4 and resumed.garbage_dirs() == []  # the index on disk names them
    retention = commit(resumed, 5, 2)
    assert set(names(retention.evicted)) == {"checkpoint_000001", "checkpoint_000002", "checkpoint_000004"}
    assert storage.list_dirs() == ["checkpoint_000003", "checkpoint_000005"]


def test_reusing_a_directory_name_replaces_the_record_and_keeps_the_directory(storage):
    manager = CheckpointManager.load(storage, CheckpointConfig(num_to_keep=1))
    upload(storage, "ckpt")
    manager.register(CheckpointRecord("ckpt", {"step": 1}, 1))
    upload(storage, "ckpt")
    retention = manager.register(CheckpointRecord("ckpt", {"step": 2}, 2))
    assert retention.evicted == () and names(manager.records) == ["ckpt"]
    assert manager.latest.metrics == {"step": 2} and storage.list_dirs() == ["ckpt"]


def test_register_refuses_a_missing_directory_and_bad_names(storage):
    manager = CheckpointManager.load(storage, TOP2)
    with pytest.raises(StorageError, match="checkpoint_000001"):
        manager.register(record(1, 1.0))
    for bad in ("", "a/b", "..", "logs", INDEX_NAME, METRICS_NAME, VALIDATE_MARKER):
        with pytest.raises(ValueError):
            manager.register(CheckpointRecord(bad, {}, 1))
    assert not storage.exists(INDEX_NAME)


def test_a_non_numeric_score_changes_nothing(storage):
    manager = CheckpointManager.load(storage, TOP2)
    commit(manager, 1, 1.0)
    upload(storage, "checkpoint_000002")
    with pytest.raises(ValueError, match="'score' of checkpoint 'checkpoint_000002' is 'high'"):
        manager.register(record(2, "high"))
    assert names(manager.records) == ["checkpoint_000001"] and manager.report_index == 1
    assert names(CheckpointManager.load(storage, TOP2).records) == ["checkpoint_000001"]


def test_missing_score_attribute_warns_once_per_run(storage, caplog):
    manager = CheckpointManager.load(storage, TOP2)
    with caplog.at_level(logging.WARNING, logger="minitrain"):
        commit(manager, 1, None)
        commit(manager, 2, None)
        commit(manager, 3, 4.0)
    warnings = [r for r in caplog.records if "have no metric 'score'" in r.getMessage()]
    assert len(warnings) == 1 and "checkpoint_000001" in warnings[0].getMessage()


def test_nan_scores_survive_the_index(storage):
    manager = CheckpointManager.load(storage, TOP2)
    commit(manager, 1, math.nan)
    commit(manager, 2, 1.0)
    resumed = CheckpointManager.load(storage, TOP2)
    assert math.isnan(resumed.records[0].metrics["score"])


# ---------------------------------------------------------------------------------- broken indexes


def _committed_run(storage):
    manager = CheckpointManager.load(storage, TOP2)
    commit(manager, 1, 1.0)
    commit(manager, 2, 2.0)
    return json.loads(storage.read_text(INDEX_NAME))


def _mutations():
    def drop(key):
        return lambda index: {k: v for k, v in index.items() if k != key}

    def set_(key, value):
        return lambda index: {**index, key: value}

    def result(field, value):
        return lambda index: {**index, "checkpoint_results": [
            {**r, field: value} for r in index["checkpoint_results"]]}

    return {
        "top-level list": lambda index: [index],
        "no format": drop("format"),
        "future format": set_("format", 3),
        "results not a list": set_("checkpoint_results", {"a": 1}),
        "no config": drop("checkpoint_config"),
        "result without dir": result("checkpoint_dir_name", None),
        "result dir escapes": result("checkpoint_dir_name", "../elsewhere"),
        "metrics not a dict": result("metrics", [1]),
        "negative report index": result("report_index", -1),
        "latest is not the newest": set_("latest_checkpoint_result", None),
        "counter below the latest": set_("current_report_index", 1),
        "duplicate dirs": lambda index: {**index, "checkpoint_results": index["checkpoint_results"] * 2},
    }


@pytest.mark.parametrize("mutation", list(_mutations()))
def test_an_index_of_the_wrong_shape_is_refused(storage, mutation):
    index = _mutations()[mutation](_committed_run(storage))
    storage.write_text_atomic(INDEX_NAME, json.dumps(index))
    with pytest.raises(CheckpointIndexError) as info:
        CheckpointManager.load(storage, TOP2)
    text = str(info.value)
    assert storage.url(INDEX_NAME) in text and "move the file away" in text


@pytest.mark.parametrize("content", [b"{not json", b"", b"\xff\xfe\x00garbage", b'{"format": 1'])
def test_an_unreadable_index_is_refused_never_started_fresh(storage, content):
    _committed_run(storage)
    storage.fs.pipe_file(storage.path(INDEX_NAME), content)
    with pytest.raises(CheckpointIndexError) as info:
        CheckpointManager.load(storage, TOP2)
    assert storage.url(INDEX_NAME) in str(info.value) and "not valid JSON" in str(info.value)
    assert storage.list_dirs() == ["checkpoint_000001", "checkpoint_000002"]  # nothing touched


def test_an_index_naming_a_missing_directory_is_refused(any_storage):
    storage = any_storage
    _committed_run(storage)
    storage.remove_tree("checkpoint_000001")
    with pytest.raises(CheckpointIndexError) as info:
        CheckpointManager.load(storage, TOP2)
    text = str(info.value)
    assert storage.url(INDEX_NAME) in text and storage.url("checkpoint_000001") in text


# ---------------------------------------------------------------------------------- garbage


def test_delete_garbage_deletes_only_what_the_run_created(any_storage):
    storage = any_storage
    manager = CheckpointManager.load(storage, TOP1)
    storage.validate_writable()
    storage.append_text(METRICS_NAME, "{}\n")
    storage.write_text_atomic("logs/attempt_0/rank_0.log", "hello\n")
    storage.write_text_atomic("images/cat.png", "the user's")  # not minitrain's: never touched
    storage.write_text_atomic("checkpoint_000009/model.txt", "a directory of unknown origin")
    commit(manager, 1, 1.0)
    commit(manager, 2, 2.0)  # evicts checkpoint_000001
    storage.write_text_atomic(f"{staged_dir(3, 1, 'checkpoint_000003')}/rank_1.bin", "x")  # a failed attempt's
    stray = f".{INDEX_NAME}.abc123{TEMP_SUFFIX}"  # an atomic write that died before its rename
    storage.write_text_atomic(stray, "{")
    assert manager.garbage_dirs() == sorted([stray, STAGING_DIR])
    assert manager.unknown_entries() == ["checkpoint_000009", "images"]
    assert manager.delete_garbage() == sorted([stray, STAGING_DIR])
    assert storage.list_entries() == sorted([VALIDATE_MARKER, INDEX_NAME, METRICS_NAME, "logs", "images",
                                             "checkpoint_000009", "checkpoint_000002"])
    assert manager.garbage_dirs() == []


def test_an_empty_staging_area_is_deleted_without_being_named(any_storage):
    """A staging area that holds only the empty directories of committed uploads is deleted without a
    "removed what earlier attempts left uncommitted: .staging" notice: a clean run says nothing of it."""
    storage = any_storage
    manager = CheckpointManager.load(storage, TOP1)
    storage.validate_writable()
    storage.write_text_atomic(f"{staged_dir(0, 0, 'checkpoint_000001')}/rank_0.bin", "x")
    storage.remove_tree(f"{staged_dir(0, 0, 'checkpoint_000001')}/rank_0.bin")  # committed: moved away
    storage.makedirs(staged_dir(0, 1, "checkpoint_000001"))
    assert manager.garbage_dirs() in ([STAGING_DIR], [])  # an object store has no empty directories
    assert manager.delete_garbage() == []
    assert STAGING_DIR not in storage.list_entries()


def test_an_eviction_a_crash_interrupted_is_deleted_by_the_next_run(storage):
    manager = CheckpointManager.load(storage, TOP1)
    commit(manager, 1, 1.0)
    real_delete = manager._delete
    manager._delete = lambda evicted: None  # the driver died between the index write and the deletion
    commit(manager, 2, 2.0)
    manager._delete = real_delete
    assert "checkpoint_000001" in storage.list_dirs()
    resumed = CheckpointManager.load(storage, TOP1)
    assert resumed.garbage_dirs() == ["checkpoint_000001"]  # recorded as created, no longer committed
    resumed.delete_garbage()
    assert storage.list_dirs() == ["checkpoint_000002"]


def test_commit_moves_every_ranks_staged_files_into_one_directory(any_storage):
    storage = any_storage
    manager = CheckpointManager.load(storage, TOP2)
    for rank in (0, 1):
        storage.write_text_atomic(f"{staged_dir(0, rank, 'ckpt')}/shard_{rank}.bin", f"rank {rank}")
    storage.write_text_atomic(f"{staged_dir(0, 1, 'ckpt')}/sub/extra.txt", "nested")
    manager.commit(CheckpointRecord("ckpt", {"score": 1}, 0, 0),
                   (staged_dir(0, 0, "ckpt"), staged_dir(0, 1, "ckpt")))
    files = sorted(p[len(storage.path("ckpt")) + 1:] for p in storage.fs.find(storage.path("ckpt")))
    assert files == ["shard_0.bin", "shard_1.bin", "sub/extra.txt"]
    assert storage.read_text("ckpt/shard_1.bin") == "rank 1"
    assert not storage.fs.find(storage.path(staged_dir(0, 0, "ckpt")))


def test_commit_never_writes_into_a_directory_it_did_not_create(storage):
    manager = CheckpointManager.load(storage, TOP2)
    storage.write_text_atomic("mine/notes.txt", "the user's")
    storage.write_text_atomic(f"{staged_dir(0, 0, 'mine')}/model.bin", "x")
    with pytest.raises(StorageError, match="did not create"):
        manager.commit(CheckpointRecord("mine", {"score": 1}, 0, 0), (staged_dir(0, 0, "mine"),))
    assert storage.read_text("mine/notes.txt") == "the user's" and storage.list_entries("mine") == ["notes.txt"]
    commit(manager, 1, 1.0)
    storage.write_text_atomic(f"{staged_dir(1, 0, 'checkpoint_000001')}/late.bin", "a stale attempt")
    with pytest.raises(StorageError, match="never written again"):
        manager.commit(CheckpointRecord("checkpoint_000001", {"score": 1}, 2, 1),
                       (staged_dir(1, 0, "checkpoint_000001"),))
    assert storage.list_entries("checkpoint_000001") == [FILE]


TOP1 = CheckpointConfig(num_to_keep=1)


# ---------------------------------------------------------------------------------- crashes


class SimulatedCrash(Exception):
    """The process died here (raised by CrashingStorage)."""


class CrashingStorage:
    """A named fake of `Storage` that dies at its `crash_at`-th operation.

    `mode` says how: "before" the operation, "after" it completed, or "torn" in its middle (an atomic
    write leaves its temporary file and nothing else; a tree removal removes one file, not the tree).
    Path computations (`path`, `url`) are not operations.
    """

    def __init__(self, real: Storage, crash_at: int, mode: str):
        self.real, self.crash_at, self.mode, self.ops = real, crash_at, mode, 0

    def path(self, rel=""):
        return self.real.path(rel)

    def url(self, rel=""):
        return self.real.url(rel)

    def _op(self, method, *args, torn=None):
        self.ops += 1
        if self.ops != self.crash_at:
            return getattr(self.real, method)(*args)
        if self.mode == "after":
            getattr(self.real, method)(*args)
        elif self.mode == "torn" and torn is not None:
            torn()
        raise SimulatedCrash(f"crash at operation {self.ops} ({self.mode} {method}{args})")

    def exists(self, rel):
        return self._op("exists", rel)

    def isdir(self, rel):
        return self._op("isdir", rel)

    def read_text(self, rel):
        return self._op("read_text", rel)

    def makedirs(self, rel=""):
        return self._op("makedirs", rel)

    def list_dirs(self, rel=""):
        return self._op("list_dirs", rel)

    def list_entries(self, rel=""):
        return self._op("list_entries", rel)

    def write_text_atomic(self, rel, text):
        directory, _, base = rel.rpartition("/")
        stray = f"{directory + '/' if directory else ''}.{base}.{uuid.uuid4().hex[:8]}{TEMP_SUFFIX}"
        return self._op("write_text_atomic", rel, text,
                        torn=lambda: self.real.fs.pipe_file(self.real.path(stray), text[: len(text) // 2].encode()))

    def promote(self, sources, rel):
        def move_one_file():
            files = self.real.fs.find(self.real.path(sources[0]))
            if files:
                self.real.fs.makedirs(self.real.path(rel), exist_ok=True)
                self.real.fs.mv(files[0], self.real.path(f"{rel}/{files[0].rsplit('/', 1)[1]}"))
        return self._op("promote", sources, rel, torn=move_one_file)

    def remove_tree(self, rel):
        def remove_one_file():
            files = self.real.fs.find(self.real.path(rel))
            if files:
                self.real.fs.rm(files[0])
        return self._op("remove_tree", rel, torn=remove_one_file)


def _real_storage(backend, tmp_path) -> Storage:
    if backend == "local":
        return Storage.for_run(str(tmp_path / uuid.uuid4().hex), "run")
    return _memory_storage()


@settings(max_examples=150, deadline=None, database=None,  # no example files in the repo
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # each example uses its own dir
@given(scores=st.lists(st.one_of(st.none(), st.integers(0, 4), st.just(math.nan)), min_size=1, max_size=8),
       num_to_keep=st.one_of(st.none(), st.integers(1, 3)), order=st.sampled_from(["max", "min"]),
       crash_at=st.integers(1, 60), mode=st.sampled_from(["before", "after", "torn"]),
       backend=st.sampled_from(["local", "memory"]))
def test_a_crash_anywhere_leaves_a_consistent_run(tmp_path, scores, num_to_keep, order, crash_at, mode, backend):
    real = _real_storage(backend, tmp_path)
    config = CheckpointConfig(num_to_keep=num_to_keep, checkpoint_score_attribute="score",
                              checkpoint_score_order=order)
    crashing = CrashingStorage(real, crash_at, mode)
    before, after, in_flight, crashed = set(), set(), None, False
    try:
        manager = CheckpointManager.load(crashing, config)
        for index, score in enumerate(scores, start=1):
            new = record(index, score)
            in_flight, before = new.dir_name, manager.committed_dir_names  # == the index on disk
            after = set(names(retain(manager.records + (new,), num_to_keep, "score", order).kept))
            stage(crashing, new.dir_name)
            manager.commit(new, (staged_dir(0, 0, new.dir_name),))
            in_flight = None
    except SimulatedCrash:
        crashed = True

    reloaded = CheckpointManager.load(real, config)
    on_index = reloaded.committed_dir_names
    for name in on_index:  # every committed checkpoint is complete
        assert real.read_text(f"{name}/{FILE}") == name
    assert on_index in (before, after)  # the old index or the new one, nothing in between
    assert len(on_index) <= (len(scores) if num_to_keep is None else num_to_keep + 1)
    extras = set(real.list_dirs()) - on_index - {STAGING_DIR}
    if crashed:  # at most the interrupted commit's upload and the evictions it had not finished
        assert extras <= before | {in_flight}
    else:
        assert not extras and on_index == after

    reloaded.delete_garbage()
    assert set(real.list_dirs()) == on_index  # the interrupted commit's directory was recorded as created
    assert not [name for name in real.list_entries() if is_temp_name(name)]
    nxt = reloaded.report_index + 1  # and the run goes on
    upload(real, f"checkpoint_{nxt:06d}")
    reloaded.register(record(nxt, 1))
    assert set(real.list_dirs()) == reloaded.committed_dir_names
    _drop(real)
