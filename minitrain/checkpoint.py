"""`Checkpoint`: a directory of files on some filesystem, as `ray.train.Checkpoint` (L1).

Ray's class is built on `pyarrow.fs`; this one works on fsspec, so any fsspec URL works (`s3://`, `gs://`,
`file://`, `memory://`, ...), and `filesystem` may be an fsspec filesystem or a `pyarrow.fs.FileSystem`
(see `minitrain.storage.user_filesystems`).
This module must not import torch: the driver and the agents load it.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import posixpath
import shutil
import tempfile
import uuid
import weakref
from typing import Any, Iterator, Optional, Union

import fsspec
from fsspec.implementations.local import LocalFileSystem

from minitrain.storage.user_filesystems import as_fsspec, for_users, given_pyarrow

_METADATA_FILE = ".metadata.json"
_DICT_FILE = "dict_checkpoint.pkl"

_DIRECTORY_HINT = ("Write your data into a directory and use Checkpoint.from_directory(dir); read it back "
                   "with `with checkpoint.as_directory() as dir: ...`.")
_PREPROCESSOR_HINT = ("Save the preprocessor into the checkpoint directory yourself (e.g. pickle it next to "
                      "the model) or record what you need with set_metadata().")
_REMOVED = {
    "from_bytes": _DIRECTORY_HINT,
    "to_bytes": _DIRECTORY_HINT,
    "get_internal_representation": _DIRECTORY_HINT,
    "from_uri": "The constructor takes URIs: Checkpoint('s3://bucket/path').",
    "to_uri": "Copy the directory yourself, e.g. fsspec's fs.put(checkpoint.to_directory(), uri, "
              "recursive=True), or report() it and let minitrain upload it to storage.",
    "uri": "Use checkpoint.path and checkpoint.filesystem (the path has no scheme, as in Ray 2.x).",
    "get_preprocessor": _PREPROCESSOR_HINT,
    "set_preprocessor": _PREPROCESSOR_HINT,
}


class _Removed:
    """A class attribute that raises `AttributeError` with a migration hint on every access.

    A descriptor rather than a metaclass `__getattr__`, so the hint appears for both
    `Checkpoint.from_bytes` and `ckpt.from_bytes`, and `hasattr()` still answers False.
    """

    def __init__(self, hint: str) -> None:
        self._hint = hint
        self._name = "?"

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, obj: Any, owner: Optional[type] = None) -> Any:
        raise AttributeError(f"Checkpoint.{self._name} was removed in Ray Train 2.x and does not exist in "
                             f"minitrain. {self._hint}")


def _is_local(filesystem: fsspec.AbstractFileSystem) -> bool:
    return isinstance(filesystem, LocalFileSystem)


def _protocol_name(filesystem: fsspec.AbstractFileSystem) -> str:
    """`local` for the local filesystem (as Ray prints it), else fsspec's first protocol name."""
    if _is_local(filesystem):
        return "local"
    protocol = filesystem.protocol
    return protocol[0] if isinstance(protocol, (tuple, list)) else str(protocol)


def _local_path(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


class Checkpoint:
    """A reference to a directory of checkpoint files on an fsspec filesystem, as `ray.train.Checkpoint`.

    `Checkpoint(path)` accepts a local path (`~` is expanded, the path made absolute) or a URL such as
    `"s3://bucket/run/ckpt"`; `.path` is then the path without the scheme. With `filesystem` given (an
    fsspec filesystem or a `pyarrow.fs.FileSystem`; anything else raises `ConfigError`), `path` is a path
    on that filesystem. `.filesystem` is a `pyarrow.fs.FileSystem` whenever pyarrow is installed (a
    pyarrow one given stays that object; see the property), so `pyarrow.fs.copy_files(ckpt.path, dest,
    source_filesystem=ckpt.filesystem)` and `ckpt.filesystem.get_file_info(...)` work as in Ray. A
    Checkpoint is only a reference: creating one copies nothing. Equality is identity, as in Ray.
    """

    # Removed in Ray 2.x: access raises AttributeError with a migration hint (from_dict/to_dict are kept).
    from_bytes = _Removed(_REMOVED["from_bytes"])
    to_bytes = _Removed(_REMOVED["to_bytes"])
    get_internal_representation = _Removed(_REMOVED["get_internal_representation"])
    from_uri = _Removed(_REMOVED["from_uri"])
    to_uri = _Removed(_REMOVED["to_uri"])
    uri = _Removed(_REMOVED["uri"])
    get_preprocessor = _Removed(_REMOVED["get_preprocessor"])
    set_preprocessor = _Removed(_REMOVED["set_preprocessor"])

    def __init__(self, path: Union[str, "os.PathLike[str]"],
                 filesystem: Any = None) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"Checkpoint path must be a str or os.PathLike, got {type(path).__name__}: "
                            f"{path!r}")
        path = os.fspath(path)
        if filesystem is None:
            fs, path = fsspec.core.url_to_fs(os.path.expanduser(path))
        else:
            fs = as_fsspec(filesystem, "Checkpoint(filesystem=...)")
            path = fs._strip_protocol(path)  # a URL of the same filesystem is accepted too
        self.path: str = _local_path(path) if _is_local(fs) else path
        # All I/O goes through `_fs`; `filesystem` shows users a pyarrow filesystem (see the property).
        self._fs: fsspec.AbstractFileSystem = fs
        self._given: Any = given_pyarrow(filesystem)
        self._shown: Any = None
        self._uuid = uuid.uuid4()

    @property
    def filesystem(self) -> Any:
        """The `pyarrow.fs.FileSystem` holding `path`, as Ray types it: the pyarrow filesystem given to the
        constructor (the same object), else `pyarrow.fs.LocalFileSystem()` for a local checkpoint and
        `pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(fs))` over the fsspec filesystem otherwise;
        the fsspec filesystem itself when pyarrow is not installed
        (`minitrain.storage.user_filesystems.for_users`). Built on first access, so pyarrow is imported
        only by code that asks."""
        if self._shown is None:
            self._shown = for_users(self._fs, self._given)
        return self._shown

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_shown"] = None  # rebuilt on demand where unpickled (pyarrow may not be installed there)
        return state

    def __repr__(self) -> str:
        return f"Checkpoint(filesystem={_protocol_name(self._fs)}, path={self.path})"

    @classmethod
    def from_directory(cls, path: Union[str, "os.PathLike[str]"]) -> "Checkpoint":
        """A Checkpoint for a local directory; nothing is copied, so keep the directory while you need it."""
        return cls(_local_path(os.fspath(path)), filesystem=LocalFileSystem())

    # ------------------------------------------------------------------ directories

    def to_directory(self, path: Optional[Union[str, "os.PathLike[str]"]] = None) -> str:
        """Copy the checkpoint's files into a local directory and return its path.

        `path` is created if needed (`~` expanded) and existing files in it are overwritten; without it
        the files go to `<tempfile.gettempdir()>/checkpoint_tmp_<uuid hex>`, which the caller owns and
        should delete. Unlike Ray, concurrent callers on one node do not share one download.
        """
        if path is None:
            dest = os.path.join(tempfile.gettempdir(), f"checkpoint_tmp_{self._uuid.hex}")
        else:
            dest = _local_path(os.fspath(path))
        self._copy_into(dest)
        return dest

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        """Context manager giving a local directory with the checkpoint's files.

        On the local filesystem this is `self.path` itself: nothing is copied or deleted, so treat the
        directory as read-only (your changes would alter the checkpoint). On a remote filesystem the files
        are downloaded to a fresh temporary directory that is removed when the block exits.
        """
        if _is_local(self._fs):
            yield self.path
            return
        tmp = tempfile.mkdtemp(prefix=f"checkpoint_tmp_{self._uuid.hex}_")
        try:
            self._copy_into(tmp)
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _copy_into(self, dest: str) -> None:
        if not self._fs.isdir(self.path):
            raise FileNotFoundError(f"Checkpoint directory {self!r} does not exist.")
        os.makedirs(dest, exist_ok=True)
        if _is_local(self._fs):
            if os.path.realpath(dest) != os.path.realpath(self.path):
                shutil.copytree(self.path, dest, dirs_exist_ok=True)
            return
        remote, local = [], []
        root = self.path.rstrip("/")
        for name, info in self._fs.find(root, withdirs=True, detail=True).items():
            rel = posixpath.relpath(name.rstrip("/"), root)
            if rel == ".":
                continue
            target = os.path.join(dest, *rel.split("/"))
            if info.get("type") == "directory":
                os.makedirs(target, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                remote.append(name)
                local.append(target)
        if remote:
            # Two lists: fsspec copies path to path without reinterpreting them (and batches async
            # filesystems such as s3).
            self._fs.get(remote, local)

    # ------------------------------------------------------------------ metadata

    def _file(self, name: str) -> str:
        return f"{self.path.rstrip('/')}/{name}"

    def get_metadata(self) -> dict:
        """The dict stored in `<path>/.metadata.json`, or `{}` when there is none."""
        location = self._file(_METADATA_FILE)
        if not self._fs.exists(location):
            return {}
        return json.loads(self._fs.cat_file(location).decode("utf-8"))

    def set_metadata(self, metadata: dict) -> None:
        """Replace the metadata with `metadata` (a JSON-safe dict), written into the checkpoint directory.

        On a checkpoint in storage this writes to storage. A value JSON cannot encode raises
        `ValueError` naming its key.
        """
        if not isinstance(metadata, dict):
            raise TypeError(f"Checkpoint metadata must be a dict, got {type(metadata).__name__}.")
        for key, value in metadata.items():
            if not isinstance(key, str):
                raise ValueError(f"Checkpoint metadata keys must be str, got {key!r} "
                                 f"({type(key).__name__}).")
            try:
                json.dumps(value)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"Checkpoint metadata value for key {key!r} is not JSON-serializable "
                                 f"({type(value).__name__}: {exc}). Store it in a file inside the "
                                 "checkpoint directory instead.") from exc
        self._fs.makedirs(self.path, exist_ok=True)
        self._fs.pipe_file(self._file(_METADATA_FILE), json.dumps(metadata).encode("utf-8"))

    def update_metadata(self, metadata: dict) -> None:
        """Merge `metadata` into the stored metadata (read, update, write; not atomic across writers)."""
        if not isinstance(metadata, dict):
            raise TypeError(f"Checkpoint metadata must be a dict, got {type(metadata).__name__}.")
        merged = self.get_metadata()
        merged.update(metadata)
        self.set_metadata(merged)

    # ------------------------------------------------------------------ legacy dict checkpoints

    @classmethod
    def from_dict(cls, data: dict) -> "Checkpoint":
        """Legacy (removed in Ray 2.x, kept here): pickle `data` into a new temporary directory.

        The directory (`<tempdir>/checkpoint_dict_*/dict_checkpoint.pkl`, pickle protocol 5) belongs to
        the checkpoint: `minitrain.report()` deletes it once uploaded, and it is deleted when this
        Checkpoint object is garbage-collected or the process exits, whichever comes first (never
        reported, it would otherwise stay in the temporary directory). Anything picklable works, torch
        tensors included. Prefer `from_directory` for new code.
        """
        if not isinstance(data, dict):
            raise TypeError(f"Checkpoint.from_dict takes a dict, got {type(data).__name__}.")
        directory = tempfile.mkdtemp(prefix="checkpoint_dict_")
        with open(os.path.join(directory, _DICT_FILE), "wb") as f:
            pickle.dump(data, f, protocol=5)
        checkpoint = cls.from_directory(directory)
        checkpoint._owns_directory = True  # a scratch directory nobody else knows about
        weakref.finalize(checkpoint, shutil.rmtree, directory, ignore_errors=True)
        return checkpoint

    def to_dict(self) -> dict:
        """Legacy: the dict a checkpoint made by `from_dict` holds.

        This unpickles `dict_checkpoint.pkl`, which can run arbitrary code: only load checkpoints you
        trust. A checkpoint not made by `from_dict` raises `ValueError`.
        """
        location = self._file(_DICT_FILE)
        if not self._fs.exists(location):
            raise ValueError(f"{self!r} was not created with Checkpoint.from_dict (it has no {_DICT_FILE}); "
                             "use `with checkpoint.as_directory() as dir: ...` to read its files.")
        with self._fs.open(location, "rb") as f:
            return pickle.load(f)
