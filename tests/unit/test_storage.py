"""The run directory on fsspec (minitrain.storage.filesystem): on the local filesystem, on memory://, and on a real
S3 API (moto, see tests/conftest.py). Object stores have no empty directories, so every directory these
tests expect holds a file."""

from __future__ import annotations

import os
import pickle
import uuid

import fsspec
import fsspec.core
import pytest

from minitrain.storage.filesystem import VALIDATE_MARKER, Storage, StorageError, is_temp_name


@pytest.fixture(params=["local", "memory", "s3"])
def storage(request, tmp_path):
    if request.param == "local":
        yield Storage.for_run(str(tmp_path / "results"), "run")
        return
    if request.param == "s3":  # a real S3 API (moto) with its own bucket; skipped without s3fs/moto
        s3 = request.getfixturevalue("s3")
        yield Storage.for_run(s3.url("results"), "run", filesystem=s3.filesystem())
        return
    root = f"memory://minitrain-test-{uuid.uuid4().hex}"
    made = Storage.for_run(root, "run")
    yield made
    if made.fs.exists(fsspec.core.url_to_fs(root)[1]):  # memory:// is process-global: clean up
        made.fs.rm(fsspec.core.url_to_fs(root)[1], recursive=True)


def _tree(path, files):
    for rel, text in files.items():
        target = path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return str(path)


def test_upload_dir_merges_the_ranks_directories(storage, tmp_path):
    rank0 = _tree(tmp_path / "rank0", {"rank0.txt": "zero", "sub/a.txt": "a", "same.txt": "from 0"})
    rank1 = _tree(tmp_path / "rank1", {"rank1.txt": "one", "sub/b.txt": "bb", "same.txt": "from 1"})
    assert storage.upload_dir(rank0, "checkpoint_000001") == len("zero") + 1 + len("from 0")
    assert storage.upload_dir(rank1, "checkpoint_000001") == len("one") + 2 + len("from 1")
    assert storage.list_entries("checkpoint_000001") == ["rank0.txt", "rank1.txt", "same.txt", "sub"]
    assert storage.list_entries("checkpoint_000001/sub") == ["a.txt", "b.txt"]
    assert storage.read_text("checkpoint_000001/same.txt") == "from 1"  # last writer wins
    assert storage.list_dirs() == ["checkpoint_000001"]


def test_upload_into_nested_new_parents_and_download_back(storage, tmp_path):
    source = _tree(tmp_path / "src", {"model.pt": "weights", "opt/state.pt": "state"})
    storage.upload_dir(source, "deep/er/ckpt")
    assert storage.isdir("deep/er/ckpt") and storage.exists("deep/er/ckpt/opt/state.pt")
    out = tmp_path / "out"
    assert storage.download_dir("deep/er/ckpt", str(out)) == len("weights") + len("state")
    assert (out / "model.pt").read_text() == "weights" and (out / "opt" / "state.pt").read_text() == "state"


def test_upload_of_a_missing_local_dir_and_download_of_a_missing_dir_raise(storage, tmp_path):
    with pytest.raises(StorageError, match="not a local directory"):
        storage.upload_dir(str(tmp_path / "nope"), "ckpt")
    with pytest.raises(StorageError, match="ckpt"):
        storage.download_dir("ckpt", str(tmp_path / "out"))


def test_write_text_atomic_replaces_and_leaves_no_temp_file(storage):
    storage.write_text_atomic("index.json", "one")
    storage.write_text_atomic("index.json", "two")
    storage.write_text_atomic("a/b/c.json", "nested")
    assert storage.read_text("index.json") == "two"
    assert storage.read_text("a/b/c.json") == "nested"
    assert storage.list_entries() == ["a", "index.json"]
    assert not any(is_temp_name(name) for name in storage.list_entries("a/b"))


def test_a_failed_local_atomic_write_cleans_its_temp_file(tmp_path):
    storage = Storage.for_run(str(tmp_path), "run")
    storage.makedirs("in_the_way")  # os.replace cannot put a file over a directory
    with pytest.raises(StorageError, match="in_the_way"):
        storage.write_text_atomic("in_the_way", "text")
    assert storage.list_entries() == ["in_the_way"]


def test_append_text(storage):
    storage.append_text("metrics.jsonl", '{"a": 1}\n')
    storage.append_text("metrics.jsonl", '{"a": 2}\n')
    assert storage.read_text("metrics.jsonl").splitlines() == ['{"a": 1}', '{"a": 2}']


def test_listing_and_removal(storage):
    storage.write_text_atomic("b_dir/f", "x")
    storage.write_text_atomic("a_dir/inner/f", "x")
    storage.write_text_atomic("file.txt", "x")
    assert storage.list_dirs() == ["a_dir", "b_dir"]
    assert storage.list_entries() == ["a_dir", "b_dir", "file.txt"]
    assert storage.list_dirs("missing") == [] and storage.list_entries("missing") == []
    storage.remove_tree("a_dir")
    storage.remove_tree("file.txt")
    storage.remove_tree("never_was")
    assert storage.list_entries() == ["b_dir"]
    assert not storage.exists("a_dir") and storage.isdir("b_dir") and not storage.isdir("file.txt")


@pytest.mark.parametrize("rel", ["/etc", "../other_run", "a/../../b"])
def test_paths_stay_inside_the_run_directory(storage, rel):
    with pytest.raises(ValueError, match="inside"):
        storage.path(rel)


def test_remove_tree_refuses_the_run_directory(storage):
    with pytest.raises(ValueError, match="whole run directory"):
        storage.remove_tree("")


def test_read_of_a_missing_file_names_it(storage):
    with pytest.raises(StorageError) as info:
        storage.read_text("nope.json")
    assert storage.url("nope.json") in str(info.value)


def test_validate_writable_writes_the_marker(storage):
    storage.validate_writable()
    assert storage.exists(VALIDATE_MARKER) and storage.read_text(VALIDATE_MARKER) == ""


def test_validate_writable_under_a_regular_file_names_the_path_and_the_fix(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")  # root ignores chmod, but nobody can mkdir inside a file
    storage = Storage.for_run(str(blocker / "results"), "run")
    with pytest.raises(StorageError) as info:
        storage.validate_writable()
    text = str(info.value)
    assert str(blocker / "results" / "run") in text and "choose a storage_path you can write to" in text.lower()


def test_for_run_accepts_paths_urls_and_filesystems(tmp_path, monkeypatch):
    local = Storage.for_run(str(tmp_path), "run")
    assert local.is_local and local.root == str(tmp_path / "run") and local.url("x/y") == str(tmp_path / "run/x/y")
    assert Storage.for_run(f"file://{tmp_path}/", "run").root == local.root
    monkeypatch.chdir(tmp_path)
    assert Storage.for_run("relative", "run").root == str(tmp_path / "relative" / "run")

    memory = Storage.for_run("memory://bucket/runs", "demo")
    assert not memory.is_local and memory.url("ckpt") == "memory:///bucket/runs/demo/ckpt"
    fs, path = fsspec.core.url_to_fs(memory.url("ckpt"))
    assert type(fs) is type(memory.fs) and path == memory.path("ckpt")

    given = Storage.for_run("/bucket/runs", "demo", filesystem=fsspec.filesystem("memory"))
    assert given.url() == memory.url() and given.fs is memory.fs


@pytest.mark.parametrize("name", ["", "a/b", "..", "."])
def test_for_run_refuses_a_name_that_is_not_one_component(tmp_path, name):
    with pytest.raises(ValueError, match="run name"):
        Storage.for_run(str(tmp_path), name)


def test_storage_pickles(storage):
    storage.write_text_atomic("hello.txt", "hi")
    copy = pickle.loads(pickle.dumps(storage))
    assert type(copy.fs) is type(storage.fs) and copy.root == storage.root and copy.is_local == storage.is_local
    assert copy.read_text("hello.txt") == "hi"
    assert repr(copy) == f"Storage({storage.url()!r})"


def test_local_upload_copies_bytes_exactly(tmp_path):
    payload = os.urandom(3 * 1024 * 1024 + 7)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "blob.bin").write_bytes(payload)
    storage = Storage.for_run(str(tmp_path / "results"), "run")
    assert storage.upload_dir(str(tmp_path / "src"), "ckpt") == len(payload)
    assert (tmp_path / "results" / "run" / "ckpt" / "blob.bin").read_bytes() == payload


def test_move_into_renames_files_into_the_run_dir_and_leaves_the_directories(tmp_path):
    from minitrain.storage.filesystem import Storage

    storage = Storage.for_run(str(tmp_path / "runs"), "moved")
    source = tmp_path / "scratch"
    (source / "sub").mkdir(parents=True)
    (source / "a.bin").write_bytes(b"a" * 10)
    (source / "sub" / "b.bin").write_bytes(b"b")
    inode = (source / "a.bin").stat().st_ino
    assert storage.move_into(str(source), "checkpoint_000001")
    target = tmp_path / "runs" / "moved" / "checkpoint_000001"
    assert (target / "a.bin").read_bytes() == b"a" * 10 and (target / "sub" / "b.bin").read_bytes() == b"b"
    assert (target / "a.bin").stat().st_ino == inode  # renamed, not copied
    assert source.is_dir() and not any(p.is_file() for p in source.rglob("*"))  # nothing shared is left


def test_move_into_declines_storage_that_is_not_plain_local(tmp_path):
    import uuid

    from minitrain.storage.filesystem import Storage

    storage = Storage.for_run(f"memory://move-{uuid.uuid4().hex}", "run")
    source = tmp_path / "scratch"
    source.mkdir()
    (source / "a.bin").write_bytes(b"a")
    assert not storage.move_into(str(source), "c")
    assert (source / "a.bin").exists()  # nothing moved: the caller copies instead


# ---------------------------------------------------------------------------------- symbolic links


def _tree_with_links(tmp_path):
    outside = tmp_path / "outside"
    (outside / "deeper").mkdir(parents=True)
    (outside / "a.bin").write_text("a")
    (outside / "deeper" / "b.bin").write_text("b")
    source = tmp_path / "ckpt"
    source.mkdir()
    (source / "model.txt").write_text("m")
    os.symlink(outside, source / "shards")
    os.symlink(outside / "a.bin", source / "alias.bin")
    return source, outside


def test_upload_and_move_follow_links_and_never_move_what_a_link_points_to(tmp_path):
    source, outside = _tree_with_links(tmp_path)
    storage = Storage.for_run(str(tmp_path / "results"), "run")
    storage.upload_dir(str(source), "up")
    expected = {"model.txt", "alias.bin", "shards/a.bin", "shards/deeper/b.bin"}
    found = {os.path.relpath(p, storage.path("up")) for p in storage.fs.find(storage.path("up"))}
    assert found == expected
    assert storage.move_into(str(source), "moved")
    found = {os.path.relpath(p, storage.path("moved")) for p in storage.fs.find(storage.path("moved"))}
    assert found == expected
    assert not any(os.path.islink(p) for p in storage.fs.find(storage.path("moved")))
    assert (outside / "a.bin").read_text() == "a" and (outside / "deeper" / "b.bin").exists()  # copied, not moved


def test_a_dangling_or_looping_link_in_a_checkpoint_is_an_error_naming_it(tmp_path):
    storage = Storage.for_run(str(tmp_path / "results"), "run")
    dangling = tmp_path / "dangling"
    dangling.mkdir()
    os.symlink(tmp_path / "nowhere", dangling / "gone")
    with pytest.raises(StorageError, match="'gone'.*does not exist"):
        storage.upload_dir(str(dangling), "x")
    looping = tmp_path / "looping"
    (looping / "sub").mkdir(parents=True)
    os.symlink(looping, looping / "sub" / "back")
    with pytest.raises(StorageError, match="loops back"):
        storage.upload_dir(str(looping), "y")


def test_remove_tree_deletes_a_link_not_its_target(tmp_path):
    storage = Storage.for_run(str(tmp_path / "results"), "run")
    storage.makedirs()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep")
    os.symlink(victim, storage.path("planted"))
    storage.remove_tree("planted")
    assert not os.path.lexists(storage.path("planted")) and (victim / "precious.txt").read_text() == "keep"
