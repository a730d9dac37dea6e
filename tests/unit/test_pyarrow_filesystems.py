"""pyarrow filesystems wherever minitrain takes a filesystem.

Ray's storage API is typed on `pyarrow.fs.FileSystem`; minitrain works on fsspec. These tests pass
pyarrow's own filesystems (local, SubTree, S3 against a real S3 API on loopback, and Ray's
`PyFileSystem(FSSpecHandler(fs))` wrapping) through RunConfig, Storage, Checkpoint, Result.from_path and
the data readers, and run Ray's documented pyarrow snippets (`get_file_info`, `copy_files`) on what
minitrain hands back.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import uuid

import fsspec
import pytest
from fsspec.implementations.arrow import ArrowFSWrapper
from fsspec.implementations.local import LocalFileSystem

pafs = pytest.importorskip("pyarrow.fs")

from minitrain import Checkpoint, ConfigError, Result, RunConfig  # noqa: E402
from minitrain.data import read_csv  # noqa: E402
from minitrain.storage import user_filesystems  # noqa: E402
from minitrain.storage.filesystem import Storage  # noqa: E402
from minitrain.storage.user_filesystems import as_fsspec  # noqa: E402


def _tree(root, files: dict) -> str:
    for rel, text in files.items():
        target = os.path.join(root, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w") as handle:
            handle.write(text)
    return str(root)


# ---------------------------------------------------------------------------------- what is accepted


def test_as_fsspec_unwraps_fsspec_handler_and_wraps_other_pyarrow_filesystems(tmp_path):
    memory = fsspec.filesystem("memory")
    assert as_fsspec(memory, "x") is memory
    assert as_fsspec(pafs.PyFileSystem(pafs.FSSpecHandler(memory)), "x") is memory
    assert isinstance(as_fsspec(pafs.LocalFileSystem(), "x"), LocalFileSystem)
    subtree = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    wrapped = as_fsspec(subtree, "x")
    assert isinstance(wrapped, ArrowFSWrapper) and wrapped.fs is subtree


@pytest.mark.parametrize("bad", ["s3", 42, object()])
def test_anything_else_is_a_config_error_naming_the_field_type_and_fix(bad, tmp_path):
    type_name = f"{type(bad).__module__}.{type(bad).__qualname__}"
    for build, field in ((lambda: RunConfig(storage_filesystem=bad), "RunConfig.storage_filesystem"),
                         (lambda: Checkpoint("/x", filesystem=bad), "Checkpoint(filesystem=...)"),
                         (lambda: Result.from_path(str(tmp_path), storage_filesystem=bad),
                          "Result.from_path(storage_filesystem=...)"),
                         (lambda: read_csv(str(tmp_path), filesystem=bad), "read_csv(filesystem=...)")):
        with pytest.raises(ConfigError) as caught:
            build()
        text = str(caught.value)
        assert field in text and type_name in text and "pyarrow.fs.FileSystem" in text and "fsspec" in text


def test_run_config_keeps_the_pyarrow_filesystem_and_path_as_given():
    given = pafs.LocalFileSystem()
    config = RunConfig(name="r", storage_path="relative/runs", storage_filesystem=given)
    assert config.storage_filesystem is given and config.storage_path == "relative/runs"


def test_checking_a_filesystem_never_imports_pyarrow(tmp_path, monkeypatch):
    # pyarrow is optional: with it made unimportable, fsspec filesystems and bad values are still judged.
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.fs", None)
    memory = fsspec.filesystem("memory")
    assert RunConfig(storage_filesystem=memory).storage_filesystem is memory
    assert Checkpoint(str(tmp_path), filesystem=LocalFileSystem()).path == str(tmp_path)
    with pytest.raises(ConfigError, match="RunConfig.storage_filesystem"):
        RunConfig(storage_filesystem=object())
    with pytest.raises(ConfigError, match="Checkpoint"):
        Checkpoint(str(tmp_path), filesystem="local")


# ---------------------------------------------------------------------------------- Checkpoint


def _pyarrow_filesystems(root: str):
    """(pyarrow filesystem, path of `root` on it) for each way a Ray user may hand us a local directory."""
    return [(pafs.LocalFileSystem(), root),
            (pafs.PyFileSystem(pafs.FSSpecHandler(LocalFileSystem())), root),
            (pafs.SubTreeFileSystem(os.path.dirname(root), pafs.LocalFileSystem()), os.path.basename(root))]


def test_checkpoint_on_pyarrow_filesystems_answers_rays_pyarrow_calls(tmp_path):
    source = _tree(tmp_path / "ckpt", {"model.pt": "weights", "sub/opt.pt": "state"})
    for filesystem, path in _pyarrow_filesystems(source):
        checkpoint = Checkpoint(path, filesystem=filesystem)
        assert checkpoint.filesystem is filesystem  # handed back as given: Ray's code sees pyarrow
        # Ray's docs: inspect and copy a checkpoint through pyarrow.
        assert checkpoint.filesystem.get_file_info(checkpoint.path).type == pafs.FileType.Directory
        selector = pafs.FileSelector(checkpoint.path, recursive=True)
        names = sorted(info.base_name for info in checkpoint.filesystem.get_file_info(selector)
                       if info.type == pafs.FileType.File)
        assert names == ["model.pt", "opt.pt"]
        copied = tmp_path / f"copy-{uuid.uuid4().hex}"
        copied.mkdir()
        pafs.copy_files(checkpoint.path, str(copied), source_filesystem=checkpoint.filesystem)
        assert (copied / "sub" / "opt.pt").read_text() == "state"
        # minitrain's own methods on the same object.
        assert open(os.path.join(checkpoint.to_directory(str(tmp_path / f"to-{uuid.uuid4().hex}")),
                                 "model.pt")).read() == "weights"
        with checkpoint.as_directory() as local:
            assert open(os.path.join(local, "sub", "opt.pt")).read() == "state"
        checkpoint.set_metadata({"epoch": 3})
        assert Checkpoint(path, filesystem=filesystem).get_metadata() == {"epoch": 3}
        back = pickle.loads(pickle.dumps(checkpoint))
        assert type(back.filesystem) is type(filesystem) and back.get_metadata() == {"epoch": 3}
        os.remove(os.path.join(source, ".metadata.json"))


def test_checkpoint_filesystem_is_pyarrow_on_default_storage_too(tmp_path):
    """Ray's `ray.train.Checkpoint` docstring: `Checkpoint.from_directory(dir).filesystem` is a pyarrow
    LocalFileSystem; a URL or an fsspec filesystem is shown through pyarrow's FSSpecHandler over that
    same fsspec filesystem, and I/O keeps going through the fsspec one."""
    source = _tree(tmp_path / "c", {"a.txt": "a", "sub/b.txt": "bb"})
    for checkpoint in (Checkpoint.from_directory(source), Checkpoint(source), Checkpoint(f"file://{source}")):
        assert type(checkpoint.filesystem) is pafs.LocalFileSystem and isinstance(checkpoint._fs, LocalFileSystem)
        assert checkpoint.filesystem is checkpoint.filesystem  # built once
        assert checkpoint.path == source
        assert checkpoint.filesystem.get_file_info(f"{checkpoint.path}/sub/b.txt").size == 2
        with checkpoint.filesystem.open_input_file(f"{checkpoint.path}/a.txt") as handle:
            assert handle.read() == b"a"
        with checkpoint.as_directory() as local:  # what users rely on is unchanged
            assert local == source
        assert open(os.path.join(checkpoint.to_directory(str(tmp_path / f"to-{uuid.uuid4().hex}")),
                                 "sub", "b.txt")).read() == "bb"
    memory = fsspec.filesystem("memory")
    root = f"/minitrain-test-{uuid.uuid4().hex}"
    try:
        memory.pipe_file(f"{root}/ck/model.txt", b"weights")
        for checkpoint in (Checkpoint(f"{root}/ck", filesystem=memory), Checkpoint(f"memory://{root}/ck")):
            shown = checkpoint.filesystem
            assert isinstance(shown, pafs.PyFileSystem) and shown.handler.fs is memory
            assert checkpoint._fs is memory
            assert shown.get_file_info(f"{root}/ck/model.txt").type == pafs.FileType.File
            with shown.open_input_file(f"{root}/ck/model.txt") as handle:
                assert handle.read() == b"weights"
            (tmp_path / "out").mkdir(exist_ok=True)
            pafs.copy_files(checkpoint.path, str(tmp_path / "out"), source_filesystem=shown)
            assert (tmp_path / "out" / "model.txt").read_text() == "weights"
            # What is handed back can be handed in again: the same fsspec filesystem underneath.
            again = Checkpoint(checkpoint.path, filesystem=shown)
            assert again._fs is memory and again.filesystem is shown
            with again.as_directory() as local:
                assert open(os.path.join(local, "model.txt")).read() == "weights"
            back = pickle.loads(pickle.dumps(checkpoint))  # crosses to workers; the view is rebuilt there
            assert back._shown is None and isinstance(back.filesystem, pafs.PyFileSystem)
    finally:
        memory.rm(root, recursive=True)


def test_result_filesystem_is_pyarrow_on_default_storage_too(tmp_path):
    entry = {"checkpoint_dir_name": "c1", "metrics": {"loss": 0.5}, "report_index": 0}
    run = tmp_path / "run"
    _tree(run, {"c1/model.txt": "m", "checkpoint_manager_snapshot.json":
                json.dumps({"checkpoint_results": [entry], "latest_checkpoint_result": entry})})
    result = Result.from_path(str(run))
    assert type(result.filesystem) is pafs.LocalFileSystem and result.filesystem is result.filesystem
    assert type(result.checkpoint.filesystem) is pafs.LocalFileSystem
    listed = result.filesystem.get_file_info(pafs.FileSelector(result.path, recursive=True))
    assert {"checkpoint_manager_snapshot.json", "model.txt"} <= {info.base_name for info in listed}


# ---------------------------------------------------------------------------------- Storage


@pytest.fixture(params=["pyarrow-local", "fsspec-handler", "subtree", "pyarrow-s3"])
def arrow_storage(request, tmp_path):
    if request.param == "pyarrow-s3":  # pyarrow's own S3 client against a real S3 API (moto)
        s3 = request.getfixturevalue("s3")
        host = s3.endpoint_url.split("://", 1)[1]
        given = pafs.S3FileSystem(access_key=s3.access_key, secret_key=s3.secret_key, region=s3.region,
                                  endpoint_override=host, scheme="http")
        return Storage.for_run(f"{s3.bucket}/results", "run", given), given
    given = {"pyarrow-local": pafs.LocalFileSystem(),
             "fsspec-handler": pafs.PyFileSystem(pafs.FSSpecHandler(LocalFileSystem())),
             "subtree": pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())}[request.param]
    base = "results" if request.param == "subtree" else str(tmp_path / "results")
    return Storage.for_run(base, "run", given), given


def test_storage_works_on_pyarrow_filesystems(arrow_storage, tmp_path):
    storage, given = arrow_storage
    assert storage.public_fs is given
    storage.validate_writable()
    storage.write_text_atomic("checkpoint_manager_snapshot.json", json.dumps({"a": 1}))
    storage.append_text("metrics.jsonl", "one\n")
    storage.append_text("metrics.jsonl", "two\n")
    assert storage.read_text("metrics.jsonl") == "one\ntwo\n"
    rank0 = _tree(tmp_path / "rank0", {"r0.txt": "zero", "sub/a.txt": "a"})
    rank1 = _tree(tmp_path / "rank1", {"r1.txt": "one"})
    storage.upload_dir(rank0, ".staging/attempt_0/rank_0/checkpoint_000000")
    storage.upload_dir(rank1, ".staging/attempt_0/rank_1/checkpoint_000000")
    storage.promote([".staging/attempt_0/rank_0/checkpoint_000000",
                     ".staging/attempt_0/rank_1/checkpoint_000000"], "checkpoint_000000")
    assert storage.list_entries("checkpoint_000000") == ["r0.txt", "r1.txt", "sub"]
    assert "checkpoint_000000" in storage.list_dirs()
    out = tmp_path / "down"
    assert storage.download_dir("checkpoint_000000", str(out)) == len("zero") + 1 + len("one")
    assert (out / "sub" / "a.txt").read_text() == "a"
    back = pickle.loads(pickle.dumps(storage))  # a Storage travels to the workers
    assert back.root == storage.root and type(back.public_fs) is type(given)
    assert back.read_text("checkpoint_manager_snapshot.json") == '{"a": 1}'
    # Ray's docs read results through pyarrow: the filesystem handed back answers those calls.
    info = storage.public_fs.get_file_info(storage.path("checkpoint_000000/r1.txt"))
    assert info.type == pafs.FileType.File and info.size == len("one")
    storage.remove_tree("checkpoint_000000")
    assert not storage.exists("checkpoint_000000")


def test_a_checkpoint_of_a_storage_shows_what_public_fs_shows_and_builds_it_only_when_asked(arrow_storage, tmp_path,
                                                                                                  monkeypatch):
    """Workers and the driver build Checkpoints on `Storage.checkpoint_fs`: the same filesystem is shown as
    with `public_fs`, without building it (importing pyarrow cost every restarted worker ~40 ms)."""
    storage, given = arrow_storage
    checkpoint = Checkpoint(storage.path("checkpoint_000000"), filesystem=storage.checkpoint_fs)
    assert checkpoint.filesystem is given is storage.public_fs
    for fs in (LocalFileSystem(), fsspec.filesystem("memory")):
        plain = Storage(fs, str(tmp_path / "plain"))
        checkpoint = Checkpoint(plain.path("checkpoint_000000"), filesystem=plain.checkpoint_fs)
        assert checkpoint._fs is fs and type(checkpoint.filesystem) is type(plain.public_fs)
    views = []
    monkeypatch.setattr(user_filesystems, "pyarrow_view", lambda fs: views.append(fs) or pafs.LocalFileSystem())
    plain = Storage(LocalFileSystem(), str(tmp_path / "plain"))
    checkpoint = Checkpoint(plain.path("checkpoint_000000"), filesystem=plain.checkpoint_fs)
    assert views == []  # nothing of pyarrow's is built with the checkpoint ...
    checkpoint.filesystem
    assert views == [plain.fs]  # ... only when it is shown


# ---------------------------------------------------------------------------------- Result.from_path


def test_result_from_path_with_a_pyarrow_filesystem(tmp_path):
    entry = {"checkpoint_dir_name": "c1", "metrics": {"loss": 0.5}, "report_index": 0}
    run = tmp_path / "run"
    _tree(run, {"c1/model.txt": "m", "checkpoint_manager_snapshot.json":
                json.dumps({"checkpoint_results": [entry], "latest_checkpoint_result": entry})})
    for given, path in _pyarrow_filesystems(str(run)):
        result = Result.from_path(path, storage_filesystem=given)
        assert result.filesystem is given and result.checkpoint.filesystem is given
        assert result.metrics == {"loss": 0.5}
        files = result.filesystem.get_file_info(pafs.FileSelector(result.path, recursive=True))
        assert "model.txt" in {info.base_name for info in files}
        dest = tmp_path / f"dl-{uuid.uuid4().hex}"
        dest.mkdir()  # pyarrow's copy_files creates the subdirectories, not the destination itself
        pafs.copy_files(result.checkpoint.path, str(dest), source_filesystem=result.filesystem)
        assert (dest / "model.txt").read_text() == "m"


# ---------------------------------------------------------------------------------- data readers


def test_read_csv_takes_a_pyarrow_filesystem(tmp_path):
    _tree(tmp_path / "data", {"a.csv": "x,y\n1,2\n3,4\n"})
    subtree = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    for given, path in ((pafs.LocalFileSystem(), str(tmp_path / "data")), (subtree, "data")):
        rows = list(read_csv(path, filesystem=given).iter_rows())
        assert [(int(r["x"]), int(r["y"])) for r in rows] == [(1, 2), (3, 4)]
