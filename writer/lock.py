"""The store's ``lock`` file: one writer per directory (docs/format.md §9).

Like Apache's broker, the writer takes an exclusive POSIX lock on byte range [0, 1) of
``lock`` and writes the ASCII bytes ``lock``; the lock dies with the process, so a killed
writer never leaves the store locked.
"""

from __future__ import annotations

import fcntl
import os

from rmqstore.common.errors import StoreLocked


class StoreLock:
    def __init__(self, path: str):
        self.path = path
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        except OSError:
            os.close(self._fd)
            self._fd = None
            raise StoreLocked(
                f"another writer holds {path}: one writer per store directory "
                "(query nodes read without the lock)"
            ) from None
        os.pwrite(self._fd, b"lock", 0)

    def release(self) -> None:
        if self._fd is not None:
            fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, 0)
            os.close(self._fd)
            self._fd = None
