"""The filesystem objects users hand to minitrain, as fsspec filesystems (L1: fsspec; pyarrow only when the
object is pyarrow's own).

Ray types its storage API on `pyarrow.fs.FileSystem`; minitrain's storage runs on fsspec. Wherever a
filesystem is taken (`RunConfig(storage_filesystem=...)`, `Checkpoint(path, filesystem=...)`,
`Result.from_path`, `TorchTrainer.restore`, the `minitrain.data.read_*` readers), `as_fsspec` turns it into
the fsspec filesystem minitrain works on:

- an fsspec filesystem is used as it is;
- `pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(fs))` (Ray's storage guide's way to pass an fsspec
  filesystem) is unwrapped to `fs`;
- `pyarrow.fs.LocalFileSystem()` becomes fsspec's local filesystem (plain files: atomic renames, fsync);
- any other `pyarrow.fs.FileSystem` (S3FileSystem, GcsFileSystem, SubTreeFileSystem, ...) is wrapped in
  fsspec's `ArrowFSWrapper`;
- anything else raises `ConfigError` naming where it was given, its type and the fix.

`for_users` goes the other way for what minitrain hands back (`Checkpoint.filesystem`,
`Result.filesystem`), which Ray types as `pyarrow.fs.FileSystem`, so that Ray's
`filesystem.get_file_info(...)` / `open_input_file(...)` snippets run unchanged:

- the pyarrow filesystem the user gave, when there was one (the same object);
- else, when pyarrow is installed, a pyarrow view of the fsspec filesystem minitrain works on:
  `pyarrow.fs.LocalFileSystem()` for local storage (what Ray itself hands back there: plain files, nothing
  to translate), and `pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(fs))` for anything else. Remote
  storage is wrapped rather than rebuilt as a native `S3FileSystem`/`GcsFileSystem` because the wrapper
  reaches the files with exactly the credentials, endpoint and options the run used; translating s3fs or
  gcsfs options into pyarrow's could silently point at another endpoint or account;
- else (no pyarrow) the fsspec filesystem itself.

Either way `as_fsspec` turns what was handed back into the same fsspec filesystem again, so a handed-back
filesystem can be passed on (`Checkpoint(path, filesystem=result.filesystem)`). pyarrow is imported only
when a view is first asked for (it costs ~0.2 s to import).
"""

from __future__ import annotations

from typing import Any, Optional

import fsspec
from fsspec.implementations.local import LocalFileSystem

from minitrain.config import bad_filesystem, filesystem_kind

__all__ = ["as_fsspec", "for_users", "given_pyarrow", "pyarrow_view"]


def as_fsspec(filesystem: Any, where: str) -> fsspec.AbstractFileSystem:
    """The fsspec filesystem for `filesystem` (see the module docstring); ConfigError naming `where`
    (e.g. "Checkpoint(filesystem=...)") for an object that is neither fsspec's nor pyarrow's."""
    kind = filesystem_kind(filesystem)
    if kind == "fsspec":
        return filesystem
    if kind != "pyarrow":
        raise bad_filesystem(where, filesystem)
    import pyarrow.fs  # already imported: the object is one of pyarrow's

    if isinstance(filesystem, pyarrow.fs.PyFileSystem) and isinstance(filesystem.handler,
                                                                      pyarrow.fs.FSSpecHandler):
        return filesystem.handler.fs
    if type(filesystem) is pyarrow.fs.LocalFileSystem:
        return LocalFileSystem()
    from fsspec.implementations.arrow import ArrowFSWrapper

    return ArrowFSWrapper(filesystem)


def given_pyarrow(filesystem: Any) -> Optional[Any]:
    """`filesystem` when it is a `pyarrow.fs.FileSystem` (to be handed back to the user), else None."""
    return filesystem if filesystem_kind(filesystem) == "pyarrow" else None


def pyarrow_view(fs: fsspec.AbstractFileSystem) -> Any:
    """A `pyarrow.fs.FileSystem` over the same files as `fs` (see the module docstring); `fs` itself
    when pyarrow is not installed."""
    try:
        import pyarrow.fs as pafs
    except ImportError:
        return fs
    if isinstance(fs, LocalFileSystem):
        return pafs.LocalFileSystem()
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs))


def for_users(fs: Any, given: Optional[Any] = None) -> Any:
    """What to show users as the filesystem: the pyarrow filesystem they gave (`given`, or `fs` when it is
    one already), else `pyarrow_view(fs)`."""
    if given is not None:
        return given
    if filesystem_kind(fs) == "pyarrow":
        return fs
    return pyarrow_view(fs)
