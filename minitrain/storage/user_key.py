"""A secret of the user's own that authenticates what minitrain stores for that user to load back (L1: stdlib).

minitrain unpickles nothing unauthenticated. Some things a sweep must store to be restored as Ray restores
it cannot be JSON (a `param_space` holding functions or classes, a searcher object, a `stop` function), so
they are stored as pickles sealed with an HMAC-SHA256 keyed by this secret, and unpickled only when the seal
verifies. The secret is 32 random bytes in `~/.minitrain/restore.key` (KEY_FILE; the directory is the knob
MINITRAIN_KEY_DIR when set): the directory is 0700 and
the file 0600, both the user's own; a key file that is a link, another user's, or readable by others is
refused (nothing is sealed or unsealed with it). Another user who can write a shared `storage_path` can
replace a sealed file, but cannot seal one this user's restore accepts.

Limits: whoever runs as the same user (or root) can read the key, as they can run code as that user anyway;
a sweep is restored only where the same key is (the same home directory; copy the key file to restore on
another machine, or pass the objects again).
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import secrets
import stat
from minitrain import knobs

KEY_DIR = ".minitrain"  # under the home directory
KEY_FILE = "restore.key"
KEY_BYTES = 32
MAC_BYTES = hashlib.sha256().digest_size
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class KeyUnavailable(Exception):
    """The user's key cannot be used: the message says why and how to fix it."""


def key_path() -> str:
    """Where the key is: `restore.key` in MINITRAIN_KEY_DIR, else in `~/.minitrain` of the user running minitrain."""
    return os.path.join(os.path.expanduser(knobs.KEY_DIR.get() or os.path.join("~", KEY_DIR)), KEY_FILE)


def _check_private(st: os.stat_result, path: str, mode_mask: int, kind: str) -> None:
    if st.st_uid != os.geteuid():
        raise KeyUnavailable(f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}); remove it")
    if st.st_mode & mode_mask:
        raise KeyUnavailable(f"{path} is readable or writable by others (mode {stat.S_IMODE(st.st_mode):o}); "
                             f"make it private: chmod {'700' if kind == 'dir' else '600'} {path}")


def _open_dir(create: bool) -> int:
    path = os.path.dirname(key_path())
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise KeyUnavailable(f"cannot create {path}: {exc.strerror}") from None
    try:
        fd = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        raise KeyUnavailable(f"{path} does not exist (no sweep of this user stored a sealed file here)") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise KeyUnavailable(f"{path} is a link or not a directory; remove it") from None
        raise KeyUnavailable(f"cannot open {path}: {exc.strerror}") from None
    try:
        _check_private(os.fstat(fd), path, 0o077, "dir")
    except KeyUnavailable:
        os.close(fd)
        raise
    return fd


def user_key(create: bool = False) -> bytes:
    """The user's key; with `create`, made (exclusively, 0600) when there is none. KeyUnavailable says
    why it cannot be used."""
    path = key_path()
    dir_fd = _open_dir(create)
    try:
        try:
            fd = os.open(KEY_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            if not create:
                raise KeyUnavailable(f"{path} does not exist (the sealed file was made by another user, or "
                                     "on a machine with another home directory)") from None
            return _create(dir_fd, path)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise KeyUnavailable(f"{path} is a symbolic link; remove it") from None
            raise KeyUnavailable(f"cannot open {path}: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                raise KeyUnavailable(f"{path} is not a plain file with one link; remove it")
            _check_private(st, path, 0o077, "file")
            key = f.read(KEY_BYTES + 1)
        if len(key) != KEY_BYTES:
            raise KeyUnavailable(f"{path} does not hold a {KEY_BYTES}-byte key; remove it (a new one is made)")
        return key
    finally:
        os.close(dir_fd)


def _create(dir_fd: int, path: str) -> bytes:
    key = secrets.token_bytes(KEY_BYTES)
    try:
        fd = os.open(KEY_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=dir_fd)
    except FileExistsError:  # another process made it first: use theirs
        return user_key(create=False)
    except OSError as exc:
        raise KeyUnavailable(f"cannot create {path}: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as f:
        f.write(key)
        f.flush()
        os.fsync(f.fileno())
    return key


def seal(data: bytes) -> bytes:
    """`data` with its HMAC-SHA256 under the user's key in front (the key is made when there is none);
    KeyUnavailable when there is no usable key."""
    return hmac.new(user_key(create=True), data, hashlib.sha256).digest() + data


def unseal(blob: bytes) -> bytes:
    """The data `seal` sealed, once its MAC verifies under the user's key (compared in constant time);
    KeyUnavailable when there is no key, ValueError when the MAC does not match (another key, or changed)."""
    key = user_key(create=False)
    mac, data = blob[:MAC_BYTES], blob[MAC_BYTES:]
    if len(mac) != MAC_BYTES or not hmac.compare_digest(mac, hmac.new(key, data, hashlib.sha256).digest()):
        raise ValueError(f"its seal does not verify under {key_path()}: it was sealed with another key, or changed")
    return data
