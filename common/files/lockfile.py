"""The store's ``lock`` file as the commands other than the writer see it (docs/format.md
§9): whether a process holds it, and holding it while a command deletes or rewrites a
store, so that no store is deleted or reset under a running writer.

A writer (ours, writer/lock.py, and Apache's broker) holds a POSIX record lock on byte
range [0, 1) of ``lock``. A command asks about that range with F_GETLK, or locks it with an
open file description lock (F_OFD_SETLK), which conflicts with a writer's record lock; a
writer starting while the command holds it is refused as a second writer would be. The
commands run in processes of their own: a process's record locks on a file are dropped
when it closes any descriptor of that file, so these are not for a process that runs a
writer too."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
from collections.abc import Iterator

from rmqstore.common.errors import StoreLocked

LOCK_FILE = "lock"
# struct flock on Linux: l_type, l_whence, l_start, l_len, l_pid (native alignment).
FLOCK = struct.Struct("hhqqi4x")


def _first_byte(kind: int) -> bytes:
    return FLOCK.pack(kind, os.SEEK_SET, 0, 1, 0)


def _holder(fd: int, command: int) -> int | None:
    """The pid holding a lock that conflicts with a write lock of byte 0 (-1: an open file
    description's lock, which names no process), None when none does."""
    kind, _, _, _, pid = FLOCK.unpack(fcntl.fcntl(fd, command, _first_byte(fcntl.F_WRLCK)))
    return None if kind == fcntl.F_UNLCK else int(pid)


def lock_holder(lock_path: str) -> int | None:
    """The pid of the process holding the store lock ``lock_path`` (a running writer), None
    when none does: the file itself stays after every exit, clean or not, so only the lock
    says a writer is alive. Asked with F_GETLK on a read-only descriptor, which takes no
    lock and writes nothing."""
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return _holder(fd, fcntl.F_GETLK)
    finally:
        os.close(fd)


@contextlib.contextmanager
def holding_store_lock(root: str, option: str, *, create: bool, refused: str) -> Iterator[None]:
    """While this process holds the lock of the store ``root`` (``option``: how the command
    line named it), so that no writer runs on it meanwhile; refused (StoreLocked, saying
    ``refused``: what was not done) while a process holds it. Without a lock file, one is
    made (``create``), or nothing is held: no writer ever ran there."""
    path = os.path.join(root, LOCK_FILE)
    try:
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
    except FileNotFoundError:
        yield
        return
    try:
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _first_byte(fcntl.F_WRLCK))
        except OSError as error:
            if error.errno not in (errno.EACCES, errno.EAGAIN):
                raise
            pid = _holder(fd, fcntl.F_OFD_GETLK)
            holder = f"a running writer (pid {pid})" if pid is not None and pid > 0 else "another process"
            raise StoreLocked(f"{option} {root}: {holder} holds the store's lock ({path}); stop it first: {refused}") from None
        yield
    finally:
        os.close(fd)
