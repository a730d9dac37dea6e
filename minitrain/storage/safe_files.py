"""Writing inside a directory that other users may also write, without following their links (L1: storage, stdlib).

A shared `storage_path` lets another user create a run directory, or entries in it, before the run
does: a symbolic link named like one of minitrain's own files (the run lock, the marker, the logs)
would turn the run's truncations and appends against the link's target, which the run's user owns.
Every local write into a run directory goes through this module:

- a directory is opened once (`O_DIRECTORY | O_NOFOLLOW`) and every name below it is opened relative
  to it (`openat`), one component at a time, again with `O_NOFOLLOW`: no link is followed anywhere
  below the run directory;
- a file minitrain creates is created exclusively (`O_CREAT | O_EXCL`); a file it opens again
  (an append on resume) must be a regular file with one link;
- every entry opened or replaced must belong to the effective user running minitrain.

A planted link, a foreign-owned entry or an extra hard link raises `PlantedEntryError` (an OSError,
so `Storage` reports it as a StorageError naming the path) with the fix. Object stores have no links
and no owners, so this module is for local (and NFS) directories only.

Limit: on NFS with root squashing, files a root driver creates belong to `nobody` and are refused;
run as an ordinary user there.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from typing import Iterable, Optional

from minitrain.storage.layout import TEMP_SUFFIX

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FIX = ("minitrain does not follow links or write into other users' entries in a run directory; "
        "remove it, or choose a storage_path only you can write (RunConfig(storage_path=...)).")


class PlantedEntryError(PermissionError):
    """An entry of a run directory is a symbolic link, belongs to another user or has extra hard links;
    the message names it and the fix."""

    def __init__(self, path: str, why: str):
        super().__init__(errno.EPERM, f"{path} {why}; {_FIX}")
        self.path = path

    def __str__(self) -> str:
        return str(self.strerror)


def _refuse_foreign(st: os.stat_result, path: str) -> None:
    if st.st_uid != os.geteuid():
        raise PlantedEntryError(path, f"belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})")


def _refuse_link(dir_fd: Optional[int], name: str, path: str, exc: OSError) -> None:
    """Turn the error of an O_NOFOLLOW open into PlantedEntryError when `name` is a link; else re-raise."""
    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except OSError:
        raise exc from None
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(name, dir_fd=dir_fd)
        except OSError:
            target = "?"
        raise PlantedEntryError(path, f"is a symbolic link (to {target!r})") from None
    raise exc


def open_dir(dir_fd: Optional[int], name: str, path: str, create: bool) -> int:
    """The descriptor of the directory `name` under `dir_fd` (None: `name` is a path; its last
    component is not followed), created when missing and `create`; FileNotFoundError when missing
    otherwise. Refuses a link or a directory of another user."""
    if create:
        try:
            os.mkdir(name, 0o777, dir_fd=dir_fd)
        except FileExistsError:
            pass
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except (NotADirectoryError, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        _refuse_link(dir_fd, name, path, exc)
        raise
    try:
        _refuse_foreign(os.fstat(fd), path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_tree(root_fd: int, parts: Iterable[str], root_path: str, create: bool) -> int:
    """The descriptor of the directory `root/parts...`, each component opened by `open_dir`."""
    fd, path = os.dup(root_fd), root_path
    try:
        for part in parts:
            path = f"{path}/{part}"
            child = open_dir(fd, part, path, create)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_entry(dir_fd: int, name: str, path: str) -> bool:
    """True when `name` exists under `dir_fd`; PlantedEntryError when it is a link or another user's."""
    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode):
        _refuse_link(dir_fd, name, path, OSError(errno.ELOOP, "link"))
    _refuse_foreign(st, path)
    return True


def open_file(dir_fd: int, name: str, path: str, flags: int, mode: int = 0o666) -> int:
    """The descriptor of the regular file `name` under `dir_fd`, opened with `flags` and without following
    a link. With `O_CREAT` the file is created exclusively when missing; an existing one must be a
    regular file of this user with one link (no planted hard link to a file of ours)."""
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC
    fd = -1
    if flags & os.O_CREAT:
        try:
            fd = os.open(name, flags | os.O_EXCL, mode, dir_fd=dir_fd)
        except FileExistsError:
            flags &= ~os.O_CREAT
    if fd < 0:
        try:
            fd = os.open(name, flags, mode, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK, errno.ENOTDIR):
                _refuse_link(dir_fd, name, path, exc)
            raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PlantedEntryError(path, "is not a regular file")
        _refuse_foreign(st, path)
        if st.st_nlink > 1:
            raise PlantedEntryError(path, f"has {st.st_nlink} hard links (minitrain's own files have one)")
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of `data` to `fd`."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def copy_into(source: str, dir_fd: int, name: str, path: str) -> int:
    """Copy the local file `source` (links followed: it is the caller's) to `name` under `dir_fd`,
    replacing its content; returns the bytes copied."""
    out = open_file(dir_fd, name, path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        with open(source, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            copied = 0
            try:
                while copied < size:
                    sent = os.sendfile(out, handle.fileno(), copied, size - copied)
                    if sent == 0:
                        break
                    copied += sent
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                handle.seek(copied)
                while chunk := handle.read(1 << 20):
                    write_all(out, chunk)
                    copied += len(chunk)
            return copied
    finally:
        os.close(out)


def replace_file(dir_fd: int, name: str, path: str, data: bytes) -> None:
    """Replace `name` under `dir_fd` by `data` atomically (an exclusive temporary, fsync, rename, fsync of
    the directory). A link or another user's file in its place is refused, never replaced silently."""
    check_entry(dir_fd, name, path)
    temporary = f".{name}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
    fd = open_file(dir_fd, temporary, path, os.O_WRONLY | os.O_CREAT, 0o666)
    try:
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(temporary, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    os.fsync(dir_fd)
