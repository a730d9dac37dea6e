"""minitrain.Checkpoint: Ray's Checkpoint API on fsspec, local and remote (memory://) filesystems."""

from __future__ import annotations

import gc
import os
import pickle
import shutil
import tempfile
import uuid
from pathlib import Path

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from minitrain.checkpoint import Checkpoint
from minitrain.errors import ConfigError


def _tree(root: Path) -> dict:
    """Relative path -> bytes of every file under root."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def local_dir(tmp_path) -> Path:
    src = tmp_path / "ckpt"
    (src / "sub").mkdir(parents=True)
    (src / "model.bin").write_bytes(b"\x00weights")
    (src / "sub" / "opt.txt").write_text("adam")
    return src


@pytest.fixture(autouse=True)
def private_tempdir(tmp_path, monkeypatch) -> Path:
    """Default temp locations (to_directory(), as_directory(), from_dict()) go under tmp_path."""
    tmp = tmp_path / "tempdir"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


@pytest.fixture
def memory_root():
    """A unique memory:// root (the memory filesystem is process-global), removed afterwards."""
    root = f"/minitrain-test-{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    yield fs, root
    if fs.exists(root):
        fs.rm(root, recursive=True)


@pytest.fixture
def remote_checkpoint(memory_root) -> Checkpoint:
    fs, root = memory_root
    fs.pipe_file(f"{root}/ckpt/model.bin", b"\x00weights")
    fs.pipe_file(f"{root}/ckpt/sub/opt.txt", b"adam")
    return Checkpoint(f"memory://{root}/ckpt")


# ------------------------------------------------------------------ construction


def test_from_directory_is_local_and_copies_nothing(local_dir):
    ckpt = Checkpoint.from_directory(local_dir)
    assert ckpt.path == str(local_dir)
    assert isinstance(ckpt._fs, LocalFileSystem)  # .filesystem is pyarrow's view: test_pyarrow_filesystems
    assert repr(ckpt) == f"Checkpoint(filesystem=local, path={local_dir})"


def test_local_paths_are_expanded_and_made_absolute(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert Checkpoint("~/a/b").path == str(tmp_path / "a" / "b")
    assert Checkpoint("rel/c").path == str(tmp_path / "rel" / "c")
    assert Checkpoint(f"file://{tmp_path}/d").path == str(tmp_path / "d")
    assert Checkpoint(tmp_path / "e").path == str(tmp_path / "e")  # os.PathLike


def test_url_strips_the_scheme(memory_root):
    _, root = memory_root
    ckpt = Checkpoint(f"memory://{root}/x")
    assert isinstance(ckpt._fs, MemoryFileSystem)
    assert ckpt.path == f"{root}/x"
    assert repr(ckpt) == f"Checkpoint(filesystem=memory, path={root}/x)"


def test_explicit_filesystem_takes_a_path_on_it(memory_root):
    fs, root = memory_root
    assert Checkpoint(f"{root}/x", filesystem=fs).path == f"{root}/x"
    with pytest.raises(ConfigError, match="fsspec"):  # a ValueError, as Ray's check
        Checkpoint("/x", filesystem="s3")
    with pytest.raises(TypeError, match="str or os.PathLike"):
        Checkpoint(42)


def test_equality_is_identity_and_uuids_differ(tmp_path):
    a, b = Checkpoint(str(tmp_path)), Checkpoint(str(tmp_path))
    assert a == a and a != b
    assert a._uuid != b._uuid
    assert len({a, b}) == 2


def test_not_path_like(tmp_path):
    with pytest.raises(TypeError):
        os.fspath(Checkpoint(str(tmp_path)))


def test_pickles(remote_checkpoint, local_dir):
    for ckpt in (remote_checkpoint, Checkpoint.from_directory(local_dir)):
        back = pickle.loads(pickle.dumps(ckpt))
        assert (back.path, back._uuid, type(back._fs)) == (ckpt.path, ckpt._uuid, type(ckpt._fs))
        assert type(back.filesystem) is type(ckpt.filesystem)


# ------------------------------------------------------------------ directories


def test_to_directory_copies_to_the_given_path(local_dir, tmp_path):
    dest = tmp_path / "out" / "deep"
    got = Checkpoint.from_directory(local_dir).to_directory(str(dest))
    assert got == str(dest)
    assert _tree(dest) == _tree(local_dir)
    (local_dir / "model.bin").write_bytes(b"changed")
    assert (dest / "model.bin").read_bytes() == b"\x00weights"  # a copy, not a link


def test_to_directory_default_location(local_dir, private_tempdir):
    ckpt = Checkpoint.from_directory(local_dir)
    got = Path(ckpt.to_directory())
    try:
        assert got == private_tempdir / f"checkpoint_tmp_{ckpt._uuid.hex}"
        assert _tree(got) == _tree(local_dir)
    finally:
        shutil.rmtree(got, ignore_errors=True)


def test_to_directory_into_itself_is_harmless(local_dir):
    before = _tree(local_dir)
    assert Checkpoint.from_directory(local_dir).to_directory(str(local_dir)) == str(local_dir)
    assert _tree(local_dir) == before


def test_to_directory_expands_home(local_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    got = Checkpoint.from_directory(local_dir).to_directory("~/restored")
    assert got == str(tmp_path / "home" / "restored")
    assert _tree(Path(got)) == _tree(local_dir)


def test_to_directory_from_remote(remote_checkpoint, tmp_path):
    got = remote_checkpoint.to_directory(str(tmp_path / "down"))
    assert _tree(Path(got)) == {"model.bin": b"\x00weights", "sub/opt.txt": b"adam"}


def test_missing_directory_raises(tmp_path, memory_root):
    _, root = memory_root
    for ckpt in (Checkpoint(str(tmp_path / "nope")), Checkpoint(f"memory://{root}/nope")):
        with pytest.raises(FileNotFoundError, match="does not exist"):
            ckpt.to_directory(str(tmp_path / "dest"))


def test_as_directory_local_yields_the_path_itself(local_dir):
    ckpt = Checkpoint.from_directory(local_dir)
    with ckpt.as_directory() as d:
        assert d == str(local_dir)
    assert _tree(local_dir)  # nothing deleted


def test_as_directory_remote_downloads_and_cleans_up(remote_checkpoint, private_tempdir):
    with remote_checkpoint.as_directory() as d:
        assert Path(d).parent == private_tempdir
        assert _tree(Path(d)) == {"model.bin": b"\x00weights", "sub/opt.txt": b"adam"}
    assert not os.path.exists(d)


def test_as_directory_remote_cleans_up_after_an_error(remote_checkpoint):
    with pytest.raises(KeyError):
        with remote_checkpoint.as_directory() as d:
            raise KeyError("boom")
    assert not os.path.exists(d)


# ------------------------------------------------------------------ metadata


@pytest.mark.parametrize("where", ["local", "memory"])
def test_metadata_get_set_update(where, local_dir, remote_checkpoint):
    ckpt = Checkpoint.from_directory(local_dir) if where == "local" else remote_checkpoint
    assert ckpt.get_metadata() == {}
    ckpt.set_metadata({"epoch": 3, "nested": {"lr": [0.1, 0.01]}})
    assert ckpt.get_metadata() == {"epoch": 3, "nested": {"lr": [0.1, 0.01]}}
    ckpt.update_metadata({"epoch": 4, "note": "x"})
    assert ckpt.get_metadata() == {"epoch": 4, "nested": {"lr": [0.1, 0.01]}, "note": "x"}
    ckpt.set_metadata({"only": True})  # overwrites
    assert ckpt.get_metadata() == {"only": True}
    # The metadata lives in the checkpoint directory, so it travels with copies.
    with ckpt.as_directory() as d:
        assert os.path.exists(os.path.join(d, ".metadata.json"))


def test_metadata_rejects_non_json_values_naming_the_key(local_dir):
    ckpt = Checkpoint.from_directory(local_dir)
    ckpt.set_metadata({"keep": 1})
    with pytest.raises(ValueError, match="'bad_key'"):
        ckpt.set_metadata({"ok": 1, "bad_key": object()})
    with pytest.raises(ValueError, match="'when'"):
        ckpt.update_metadata({"when": {1, 2}})
    with pytest.raises(ValueError, match="keys must be str"):
        ckpt.set_metadata({1: "x"})
    with pytest.raises(TypeError, match="dict"):
        ckpt.set_metadata([("a", 1)])
    assert ckpt.get_metadata() == {"keep": 1}  # failed writes changed nothing


# ------------------------------------------------------------------ legacy dict checkpoints


def test_from_dict_round_trips_tensors_and_nested_values(private_tempdir):
    torch = pytest.importorskip("torch")
    data = {"model": {"w": torch.arange(6.0).reshape(2, 3), "b": torch.zeros(3, dtype=torch.int64)},
            "epoch": 7, "history": [0.5, {"deep": (1, "two")}], "none": None}
    ckpt = Checkpoint.from_dict(data)
    assert isinstance(ckpt._fs, LocalFileSystem)
    assert Path(ckpt.path).parent == private_tempdir
    assert os.listdir(ckpt.path) == ["dict_checkpoint.pkl"]
    back = ckpt.to_dict()
    assert torch.equal(back["model"]["w"], data["model"]["w"])
    assert back["model"]["b"].dtype == torch.int64
    assert back["epoch"] == 7 and back["history"] == [0.5, {"deep": (1, "two")}] and back["none"] is None
    # A copy (e.g. what storage holds) reads back the same.
    copy = Checkpoint.from_directory(ckpt.to_directory(str(private_tempdir / "copy")))
    assert copy.to_dict()["epoch"] == 7


def test_a_dict_checkpoint_never_reported_leaves_nothing_in_the_temporary_directory(private_tempdir):
    ckpt = Checkpoint.from_dict({"epoch": 1})
    path = ckpt.path
    assert os.path.isdir(path)
    del ckpt
    gc.collect()
    assert not os.path.exists(path) and os.listdir(private_tempdir) == []


def test_to_dict_works_on_a_remote_copy(memory_root):
    fs, root = memory_root
    fs.pipe_file(f"{root}/d/dict_checkpoint.pkl", pickle.dumps({"a": [1, 2]}, protocol=5))
    assert Checkpoint(f"memory://{root}/d").to_dict() == {"a": [1, 2]}


def test_from_dict_needs_a_dict():
    with pytest.raises(TypeError, match="dict"):
        Checkpoint.from_dict([1, 2])


def test_to_dict_on_a_directory_checkpoint(local_dir):
    with pytest.raises(ValueError, match="from_dict.*as_directory"):
        Checkpoint.from_directory(local_dir).to_dict()


# ------------------------------------------------------------------ removed API


@pytest.mark.parametrize(("name", "hint"), [
    ("from_bytes", "from_directory"), ("to_bytes", "as_directory"), ("from_uri", "constructor"),
    ("to_uri", "to_directory"), ("uri", "checkpoint.path"), ("get_preprocessor", "set_metadata"),
    ("set_preprocessor", "set_metadata"), ("get_internal_representation", "from_directory"),
])
def test_removed_methods_explain_the_migration(name, hint, tmp_path):
    with pytest.raises(AttributeError, match=f"Checkpoint.{name} was removed.*{hint}"):
        getattr(Checkpoint, name)
    with pytest.raises(AttributeError, match=hint):
        getattr(Checkpoint(str(tmp_path)), name)
    assert not hasattr(Checkpoint, name)


def test_unknown_attributes_are_plain_attribute_errors(tmp_path):
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        Checkpoint(str(tmp_path)).nonsense
