"""A run directory on any fsspec filesystem (L1: fsspec).

`Storage` is the run directory `<storage_path>/<name>/` (layout in docs/architecture.md section 5).
Paths given to its methods are "/"-separated and relative to the run directory ("" is the run
directory itself); absolute paths and ".." are refused, so no method reaches outside the run directory.

Local and remote filesystems differ in two places, both deliberate:

- `write_text_atomic`: locally a temporary file in the same directory is written, flushed, fsynced and
  renamed over the target (then the directory is fsynced). Temporary files are named
  `.<name>.<random>.minitrain-tmp`; a crash can leave one behind and `is_temp_name` recognises it.
  Elsewhere one `pipe_file` call: object stores replace a key atomically.
- `append_text`: locally an append; elsewhere a read and a rewrite of the whole file, O(size).

Object stores have no empty directories, so an empty directory uploaded there does not exist.
Locally, every write below the run directory goes through `minitrain.storage.safe_files`: no symbolic
link is followed, files are created exclusively, and an entry of another user is refused (a shared
`storage_path` where another user planted links under minitrain's own names). The run directory of
`for_run` itself is opened the same way (its last component; `storage_path` above it is the user's).
Every I/O failure raises `StorageError` naming the path; a `Storage` pickles (it is sent to workers).
"""

from __future__ import annotations

import os
import posixpath
import shutil
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Callable, Optional

import fsspec
import fsspec.core
from fsspec.implementations.local import LocalFileSystem

from minitrain.errors import MinitrainError
from minitrain.storage import safe_files
from minitrain.storage.layout import TEMP_SUFFIX, VALIDATE_MARKER, is_temp_name
from minitrain.storage.user_filesystems import as_fsspec, for_users, given_pyarrow

__all__ = ["Storage", "StorageError", "TEMP_SUFFIX", "VALIDATE_MARKER", "is_temp_name", "local_files"]


class StorageError(MinitrainError):
    """Reading or writing the run directory failed; the message names the path and the cause."""


def local_files(local_dir: str) -> Iterator[tuple[str, str]]:
    """(source path, "/"-separated path relative to `local_dir`) of every file under the local directory
    `local_dir`, following symbolic links to files and to directories (a checkpoint's linked directory
    is part of it: it is copied, never dropped). StorageError naming the link for a dangling link or a
    link that loops back into a directory already being walked."""
    def walk(directory: str, prefix: str, seen: frozenset) -> Iterator[tuple[str, str]]:
        with os.scandir(directory) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                rel = f"{prefix}{entry.name}"
                if entry.is_dir(follow_symlinks=True):
                    real = os.path.realpath(entry.path)
                    if real in seen:
                        raise StorageError(f"the checkpoint directory {local_dir!r} holds the symbolic link "
                                           f"{rel!r}, which loops back to {real!r}; remove the loop")
                    yield from walk(entry.path, f"{rel}/", seen | {real})
                elif entry.is_file(follow_symlinks=True):
                    yield entry.path, rel
                elif entry.is_symlink():
                    raise StorageError(f"the checkpoint directory {local_dir!r} holds the symbolic link {rel!r}, "
                                       f"whose target {os.readlink(entry.path)!r} does not exist; a checkpoint "
                                       "must hold its files (copy them in, or remove the link)")
    return walk(local_dir, "", frozenset({os.path.realpath(local_dir)}))


def _files_below(dir_fd: int) -> list[str]:
    """"/"-separated paths of the files below the directory `dir_fd`, links not followed (a link is
    listed as a file: it is moved as a link, never through)."""
    found: list[str] = []
    for top, dirs, files, top_fd in os.fwalk(".", dir_fd=dir_fd, follow_symlinks=False):
        prefix = "" if top == "." else top[2:] + "/"
        links = [name for name in dirs if stat.S_ISLNK(os.lstat(name, dir_fd=top_fd).st_mode)]
        found.extend(prefix + name for name in sorted(files + links))
    return found


def _check_rel(rel: str) -> str:
    parts = [part for part in rel.split("/") if part not in ("", ".")]
    if rel.startswith("/") or ".." in parts:
        raise ValueError(f"storage paths are relative to the run directory and stay inside it, got {rel!r}")
    return "/".join(parts)


def _join(rel: str, relative: str) -> str:
    return f"{rel}/{relative}" if rel else relative


class Storage:
    """The run directory `root` (a path without protocol) on the fsspec filesystem `fs`.

    `given` is the `pyarrow.fs.FileSystem` the user passed as `storage_filesystem`, if any: `public_fs`
    hands it back in Checkpoints and the Result (all I/O goes through `fs`).

    `guard_root`: the root itself (its last component) must not be a link and must be this user's,
    as for a run directory in a shared `storage_path`; without it (a logger's directory the user
    named) only the entries below the root are checked."""

    __slots__ = ("fs", "root", "given", "guard_root")

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str, given: Optional[object] = None,
                 guard_root: bool = False):
        self.fs = fs
        self.root = root.rstrip("/") or "/"
        self.given = given
        self.guard_root = guard_root

    @classmethod
    def for_run(cls, storage_path: str, name: str,
                filesystem: Optional[fsspec.AbstractFileSystem] = None) -> "Storage":
        """The run directory `name` under `storage_path`.

        `storage_path` is a local path (relative paths and "~" are made absolute) or any fsspec URL
        ("file://", "memory://", "s3://", ...). With `filesystem` (an fsspec filesystem or a
        `pyarrow.fs.FileSystem`, see `user_filesystems.as_fsspec`), `storage_path` is a path inside it.
        """
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"the run name must be a single path component, got {name!r}")
        if filesystem is None:
            fs, base = fsspec.core.url_to_fs(storage_path)
        else:
            fs = as_fsspec(filesystem, "RunConfig.storage_filesystem")
            base = fs._strip_protocol(storage_path)
        return cls(fs, posixpath.join(base.rstrip("/") or "/", name), given_pyarrow(filesystem), guard_root=True)

    def __reduce__(self):
        return (Storage, (self.fs, self.root, self.given, self.guard_root))

    @property
    def public_fs(self) -> object:
        """The filesystem to build users' Checkpoints and Results on: the pyarrow filesystem given as
        `storage_filesystem` (handed back as that object), else `fs` (shown to users as a pyarrow view:
        `user_filesystems.for_users`)."""
        return for_users(self.fs, self.given)

    @property
    def checkpoint_fs(self) -> object:
        """The filesystem to build a `Checkpoint` of this storage on: the pyarrow filesystem given as
        `storage_filesystem`, else `fs`. The Checkpoint shows users `public_fs` from it, built when its
        `.filesystem` is first read: `public_fs` imports pyarrow, which cost every restarted worker
        ~40 ms of its start (its `get_checkpoint()`), though the fork server had imported torch."""
        return self.given if self.given is not None else self.fs

    def __repr__(self) -> str:
        return f"Storage({self.url()!r})"

    # ------------------------------------------------------------------------------ paths

    @property
    def is_local(self) -> bool:
        """True when the run directory is on the local filesystem (plain files, os.replace, fsync)."""
        return isinstance(self.fs, LocalFileSystem)

    @property
    def _plain_local(self) -> bool:
        # A LocalFileSystem subclass that overrides put_file (throttling, auditing) must be used as is.
        return self.is_local and type(self.fs).put_file is LocalFileSystem.put_file

    def path(self, rel: str = "") -> str:
        """The filesystem path (no protocol) of `rel`."""
        rel = _check_rel(rel)
        return posixpath.join(self.root, rel) if rel else self.root

    def url(self, rel: str = "") -> str:
        """`rel` as a string `fsspec.core.url_to_fs` accepts: a plain absolute path when local, else
        protocol-qualified ("s3://bucket/runs/demo/ckpt")."""
        path = self.path(rel)
        return path if self.is_local else self.fs.unstrip_protocol(path)

    @contextmanager
    def _io(self, action: str, rel: str) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            raise StorageError(f"could not {action} {self.url(rel)}: {exc}") from exc

    # ------------------------------------------------------------------------------ local, links refused

    def _open_root(self, create: bool = True) -> int:
        """The descriptor of the local run directory (created with its parents when `create`)."""
        if not self.guard_root:
            if create:
                os.makedirs(self.root, exist_ok=True)
            return os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        parent, name = os.path.split(self.root)
        if create:
            os.makedirs(parent or "/", exist_ok=True)
        parent_fd = os.open(parent or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            return safe_files.open_dir(parent_fd, name, self.root, create)
        finally:
            os.close(parent_fd)

    @contextmanager
    def _local_dir(self, rel: str, create: bool = True) -> Iterator[int]:
        """The descriptor of the local directory `rel`, every component below the root opened without
        following links (created when `create`)."""
        root_fd = self._open_root(create)
        try:
            parts = [part for part in _check_rel(rel).split("/") if part]
            fd = safe_files.open_tree(root_fd, parts, self.root, create)
        finally:
            os.close(root_fd)
        try:
            yield fd
        finally:
            os.close(fd)

    def open_local(self, rel: str, flags: int) -> int:
        """The descriptor of the local file `rel` opened with `flags` (`O_CREAT`: created exclusively
        when missing), no link followed anywhere below the root and another user's file refused (a
        `StorageError` naming it). The caller closes it. Local storage only."""
        parent, _, name = _check_rel(rel).rpartition("/")
        with self._io("open", rel), self._local_dir(parent, create=bool(flags & os.O_CREAT)) as dir_fd:
            return safe_files.open_file(dir_fd, name, self.path(rel), flags, 0o644)

    def refuse_planted(self, names: Iterable[str]) -> None:
        """StorageError naming the first of the top-level `names` that is a link or another user's entry
        (local storage; elsewhere nothing to check: object stores have neither)."""
        if not self.is_local:
            return
        with self._io("check", ""), self._local_dir("") as root_fd:
            for name in sorted(names):
                safe_files.check_entry(root_fd, name, self.path(name))

    # ------------------------------------------------------------------------------ queries

    def exists(self, rel: str) -> bool:
        """True when `rel` is a file or a directory."""
        with self._io("check", rel):
            return self.fs.exists(self.path(rel))

    def isdir(self, rel: str) -> bool:
        """True when `rel` is a directory."""
        with self._io("check", rel):
            return self.fs.isdir(self.path(rel))

    def _ls(self, rel: str) -> list[dict]:
        path = self.path(rel)
        with self._io("list", rel):
            try:
                return self.fs.ls(path, detail=True)
            except FileNotFoundError:
                return []

    def list_dirs(self, rel: str = "") -> list[str]:
        """Sorted names of the immediate subdirectories of `rel` ([] when `rel` does not exist)."""
        return sorted(posixpath.basename(entry["name"].rstrip("/")) for entry in self._ls(rel)
                      if entry.get("type") == "directory")

    def list_entries(self, rel: str = "") -> list[str]:
        """Sorted names of the files and directories directly under `rel` ([] when it does not exist)."""
        return sorted(posixpath.basename(entry["name"].rstrip("/")) for entry in self._ls(rel))

    # ------------------------------------------------------------------------------ files

    def makedirs(self, rel: str = "") -> None:
        """Create the directory `rel` and its parents (no-op when it exists)."""
        with self._io("create the directory", rel):
            if self.is_local:
                with self._local_dir(rel):
                    return
            self.fs.makedirs(self.path(rel), exist_ok=True)

    def read_text(self, rel: str) -> str:
        """The UTF-8 text of the file `rel` (StorageError when missing; UnicodeDecodeError when not text)."""
        with self._io("read", rel):
            data = self.fs.cat_file(self.path(rel))
        return data.decode("utf-8")

    def write_text_atomic(self, rel: str, text: str) -> None:
        """Replace the file `rel` by `text` so that readers (and a crash) see the old or the new file,
        never a mix. Parents are created."""
        path = self.path(rel)
        with self._io("write", rel):
            if not self.is_local:
                self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
                self.fs.pipe_file(path, text.encode("utf-8"))
                return
            parent, _, name = _check_rel(rel).rpartition("/")
            with self._local_dir(parent) as dir_fd:
                safe_files.replace_file(dir_fd, name, path, text.encode("utf-8"))

    def append_text(self, rel: str, text: str) -> None:
        """Append `text` to the file `rel` (created with its parents when missing). On a non-local
        filesystem this reads and rewrites the whole file: O(size) per call."""
        path = self.path(rel)
        with self._io("append to", rel):
            if self.is_local:
                fd = self.open_local(rel, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
                try:
                    safe_files.write_all(fd, text.encode("utf-8"))
                finally:
                    os.close(fd)
                return
            old = self.fs.cat_file(path) if self.fs.exists(path) else b""
            self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
            self.fs.pipe_file(path, old + text.encode("utf-8"))

    def remove_tree(self, rel: str) -> None:
        """Delete the file or directory tree `rel`; a missing one is fine. The run directory itself
        ("") is refused."""
        if not _check_rel(rel):
            raise ValueError("remove_tree('') would delete the whole run directory; name a path inside it")
        path = self.path(rel)
        with self._io("delete", rel):
            if self.is_local:
                self._remove_local(rel)
                return
            try:
                self.fs.rm(path, recursive=True)
            except FileNotFoundError:
                pass

    def _remove_local(self, rel: str) -> None:
        # The parents are opened without following links, a link is deleted (never what it points
        # to) and a tree is deleted by descriptors (shutil.rmtree with dir_fd follows no link).
        parent, _, name = _check_rel(rel).rpartition("/")
        try:
            with self._local_dir(parent, create=False) as dir_fd:
                if stat.S_ISDIR(os.lstat(name, dir_fd=dir_fd).st_mode):
                    shutil.rmtree(name, dir_fd=dir_fd)
                else:
                    os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:  # a missing parent or entry is fine
            return

    # ------------------------------------------------------------------------------ directories

    def upload_dir(self, local_dir: str, rel: str) -> int:
        """Copy every file under the local directory `local_dir` into the directory `rel`, merging with
        files already there (same relative name: overwritten). Parents are created; symbolic links are
        followed (see `local_files`). Returns the bytes copied. Locally `shutil.copyfile` per file
        (copy_file_range/sendfile: as fast as `cp`)."""
        if not os.path.isdir(local_dir):
            raise StorageError(f"could not upload {local_dir!r} to {self.url(rel)}: not a local directory")
        if self._plain_local:
            return self._upload_local(local_dir, rel)
        copied = 0
        with self._io(f"upload {local_dir!r} to", rel):
            self.fs.makedirs(self.path(rel), exist_ok=True)
            made = {self.path(rel)}
            for source, relative in local_files(local_dir):
                target = self.path(f"{rel}/{relative}" if rel else relative)
                parent = posixpath.dirname(target)
                if parent not in made:
                    self.fs.makedirs(parent, exist_ok=True)
                    made.add(parent)
                self.fs.put_file(source, target)
                copied += os.path.getsize(source)
        return copied

    def _upload_local(self, local_dir: str, rel: str) -> int:
        copied = 0
        with self._io(f"upload {local_dir!r} to", rel), self._subdirs(rel) as subdir:
            for source, relative in local_files(local_dir):
                parent, _, name = relative.rpartition("/")
                copied += safe_files.copy_into(source, subdir(parent), name, self.path(_join(rel, relative)))
        return copied

    @contextmanager
    def _subdirs(self, rel: str) -> Iterator[Callable[[str], int]]:
        """A function of a "/"-separated path below the local directory `rel` to the descriptor of that
        directory (created, no link followed), each opened once and all closed at the end."""
        opened: dict[str, int] = {}

        def subdir(parent: str) -> int:
            if parent not in opened:
                head, _, name = parent.rpartition("/")
                opened[parent] = safe_files.open_dir(subdir(head), name, self.path(_join(rel, parent)), create=True)
            return opened[parent]

        with self._local_dir(rel) as target_fd:
            opened[""] = target_fd
            try:
                yield subdir
            finally:
                for key, fd in opened.items():
                    if key:
                        os.close(fd)

    def move_into(self, local_dir: str, rel: str) -> bool:
        """Move every file of `local_dir` into the directory `rel` (renames: O(files), no bytes copied;
        the files leave `local_dir`, the directories stay). A symbolic link is copied as the file it
        points to, never moved as a link. Only for plain local storage on the same filesystem; returns
        False, having moved nothing, when that does not hold (copy instead)."""
        if not self._plain_local or not os.path.isdir(local_dir):
            return False
        with self._io(f"move {local_dir!r} into", rel), self._subdirs(rel) as subdir:
            if os.stat(local_dir).st_dev != os.fstat(subdir("")).st_dev:
                return False
            files = list(local_files(os.path.realpath(local_dir)))
            # A file reached through a link is copied, and first: a link may point at a file this call
            # moves. The others are renamed (a rename replaces a link in the target, never follows it).
            linked = [(s, r) for s, r in files if os.path.realpath(s) != s]
            owned = [(s, r) for s, r in files if os.path.realpath(s) == s]
            for files_of_kind, copy in ((linked, True), (owned, False)):
                for source, relative in files_of_kind:
                    parent, _, name = relative.rpartition("/")
                    target = self.path(_join(rel, relative))
                    if copy:
                        safe_files.copy_into(source, subdir(parent), name, target)
                    else:
                        safe_files.check_entry(subdir(parent), name, target)
                        os.replace(source, name, dst_dir_fd=subdir(parent))
        return True

    def promote(self, sources: list[str], rel: str) -> None:
        """Move the directories `sources` (staged uploads) into the directory `rel`, merging them in
        order (a later source's file of the same name wins). Locally a lone source is one atomic rename
        when `rel` does not exist yet; otherwise each file is renamed (moved: copy then delete, on an
        object store). The sources are gone afterwards."""
        target_root = self.path(rel)
        with self._io("commit into", rel):
            if self.is_local:
                self._promote_local(sources, rel)
                return
            self.fs.makedirs(target_root, exist_ok=True)
            made = {target_root}
            for source in sources:
                source_root = self.path(source)
                for path in self.fs.find(source_root, withdirs=False):
                    relative = path[len(source_root):].lstrip("/")
                    target = posixpath.join(target_root, relative)
                    parent = posixpath.dirname(target)
                    if parent not in made:  # filesystems with real directories (pyarrow's) need the parent
                        self.fs.makedirs(parent, exist_ok=True)
                        made.add(parent)
                    self.fs.mv(path, target)
                self.remove_tree(source)

    def _promote_local(self, sources: list[str], rel: str) -> None:
        # Every directory on both sides is opened without following links; a planted link or another
        # user's entry in place of the checkpoint directory is refused, never written through.
        parent, _, name = _check_rel(rel).rpartition("/")
        with self._local_dir(parent) as parent_fd:
            if len(sources) == 1 and not safe_files.check_entry(parent_fd, name, self.path(rel)):
                source_parent, _, source_name = _check_rel(sources[0]).rpartition("/")
                with self._local_dir(source_parent, create=False) as source_fd:
                    os.rename(source_name, name, src_dir_fd=source_fd, dst_dir_fd=parent_fd)
                return
        with self._subdirs(rel) as subdir:
            for source in sources:
                with self._local_dir(source, create=False) as source_fd:
                    for relative in _files_below(source_fd):
                        head, _, base = relative.rpartition("/")
                        safe_files.check_entry(subdir(head), base, self.path(_join(rel, relative)))
                        os.replace(relative, base, src_dir_fd=source_fd, dst_dir_fd=subdir(head))
                self.remove_tree(source)

    def download_dir(self, rel: str, local_dir: str) -> int:
        """Copy every file under the directory `rel` into the local directory `local_dir` (created,
        merged with what is there). Returns the bytes copied."""
        source_root = self.path(rel)
        if not self.isdir(rel):
            raise StorageError(f"could not download {self.url(rel)}: it is not a directory")
        copied = 0
        with self._io(f"download to {local_dir!r}", rel):
            os.makedirs(local_dir, exist_ok=True)
            for source in self.fs.find(source_root, withdirs=False):
                relative = source[len(source_root):].lstrip("/")
                target = os.path.join(local_dir, *relative.split("/"))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                if self.is_local:
                    shutil.copyfile(source, target)
                else:
                    self.fs.get_file(source, target)
                copied += os.path.getsize(target)
        return copied

    def validate_writable(self) -> None:
        """Create the run directory and write the empty `.validate_storage_marker` in it; StorageError
        naming the run directory, the cause and the fix when that fails."""
        try:
            if self.is_local:
                os.close(self.open_local(VALIDATE_MARKER, os.O_WRONLY | os.O_CREAT | os.O_TRUNC))
            else:
                self.fs.makedirs(self.root, exist_ok=True)
                self.fs.pipe_file(self.path(VALIDATE_MARKER), b"")
        except (OSError, StorageError) as exc:
            if isinstance(exc.__cause__, safe_files.PlantedEntryError):
                raise
            raise StorageError(
                f"The run directory {self.url()} is not writable: {type(exc).__name__}: {exc}. "
                "Choose a storage_path you can write to (RunConfig(storage_path=...)).") from exc
