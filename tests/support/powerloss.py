"""Power loss, simulated: the store states a power cut can leave, for recovery to face.

The tool runs a workload against a writer in this process while it records every sync
the store makes (``fsync``/``fdatasync`` of a file or a directory, ``msync`` of the
progress file): for each file, its bytes as of its last sync; for each directory, its
entries as of its last sync. At chosen moments (crash points) it also takes the store as
it is. A crash state at a crash point is then made the way a page cache may lose it:

* each page of a file that differs from the file's last synced bytes is the new page or
  the old one, independently; a size changed since the last sync is the old or the new;
* each directory entry created, removed or replaced since the directory's last sync is
  there or not (the old file, where one was replaced), independently; a directory that
  is not there takes everything under it.

A file never synced counts as empty before its first sync. The states are written out
as store directories for recovery, ``check`` and the lookups to run over.
"""

from __future__ import annotations

import os
import random
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rmqstore.common.files import mapped as mapped_module
from rmqstore.common.files.progress import ProgressPublisher

PAGE = 4096


@dataclass(frozen=True)
class Entry:
    inode: int
    is_dir: bool


@dataclass
class Snapshot:
    """The store at a crash point: what is in the page cache (``files``, ``listings``)
    and what is known durable (``synced``, ``synced_listings``)."""

    files: dict[int, bytes]  # inode -> current bytes
    listings: dict[str, dict[str, Entry]]  # directory (relative) -> its entries now
    synced: dict[int, bytes]  # inode -> bytes at its last sync
    synced_listings: dict[str, dict[str, Entry]]  # directory -> entries at its last sync
    facts: Any = None  # what the workload knew at that point (acks, flushed offset)


@dataclass
class Recorder:
    root: str
    synced: dict[int, bytes] = field(default_factory=dict)
    synced_listings: dict[str, dict[str, Entry]] = field(default_factory=dict)
    syncs: int = 0
    # Called before each sync under the root: a crash point inside an operation (an
    # append written and dispatched, its fsync not yet made).
    before_sync: Callable[[], None] | None = None

    def _relative(self, path: str) -> str | None:
        path = os.path.realpath(path)
        root = os.path.realpath(self.root)
        if path == root:
            return "."
        if path.startswith(root + os.sep):
            return os.path.relpath(path, root)
        return None

    def listing(self, relative: str) -> dict[str, Entry]:
        found = {}
        with os.scandir(os.path.join(self.root, relative)) as entries:
            for entry in entries:
                info = entry.stat(follow_symlinks=False)
                found[entry.name] = Entry(info.st_ino, stat.S_ISDIR(info.st_mode))
        return found

    def record_fd(self, fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        relative = self._relative(path)
        if relative is None:
            return
        self.syncs += 1
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            self.synced_listings[relative] = self.listing(relative)
        else:
            with open(f"/proc/self/fd/{fd}", "rb") as handle:
                self.synced[info.st_ino] = handle.read()

    def record_path(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            self.record_fd(fd)
        finally:
            os.close(fd)

    def snapshot(self, facts: Any = None) -> Snapshot:
        files: dict[int, bytes] = {}
        listings: dict[str, dict[str, Entry]] = {}
        for directory, _, names in os.walk(self.root):
            relative = os.path.relpath(directory, self.root)
            listings[relative] = self.listing(relative)
            for name in names:
                path = os.path.join(directory, name)
                with open(path, "rb") as handle:
                    files[os.fstat(handle.fileno()).st_ino] = handle.read()
        return Snapshot(files, listings, dict(self.synced), {k: dict(v) for k, v in self.synced_listings.items()}, facts)


@contextmanager
def recording(root: str) -> Iterator[Recorder]:
    """Record every sync of a file or directory under ``root`` while the block runs
    (the real sync still happens)."""
    recorder = Recorder(root)
    real_fsync, real_fdatasync = os.fsync, os.fdatasync
    real_datasync = mapped_module._datasync
    real_progress_sync = ProgressPublisher.sync

    def wrap(real: Callable[[int], None]) -> Callable[[int], None]:
        def synced(fd: int) -> None:
            if recorder.before_sync is not None:
                recorder.before_sync()
            real(fd)
            recorder.record_fd(fd)

        return synced

    def progress_sync(self: ProgressPublisher) -> None:
        if recorder.before_sync is not None:
            recorder.before_sync()
        real_progress_sync(self)
        recorder.record_path(self.path)

    os.fsync = wrap(real_fsync)  # type: ignore[assignment]
    os.fdatasync = wrap(real_fdatasync)  # type: ignore[assignment]
    mapped_module._datasync = wrap(real_datasync)
    ProgressPublisher.sync = progress_sync  # type: ignore[method-assign]
    try:
        yield recorder
    finally:
        os.fsync, os.fdatasync = real_fsync, real_fdatasync
        mapped_module._datasync = real_datasync
        ProgressPublisher.sync = real_progress_sync  # type: ignore[method-assign]


def _content(current: bytes, synced: bytes, rng: random.Random) -> bytes:
    """A file's bytes after a power cut: each differing page old or new, the size old or new."""
    size = rng.choice((len(synced), len(current)))
    old = synced.ljust(size, b"\x00")[:size]
    new = current.ljust(size, b"\x00")[:size]
    if old == new:
        return new
    pages = []
    for start in range(0, size, PAGE):
        a, b = old[start : start + PAGE], new[start : start + PAGE]
        pages.append(a if a == b else rng.choice((a, b)))
    return b"".join(pages)


def write_crash_state(snapshot: Snapshot, out: str, rng: random.Random) -> dict[str, int]:
    """Write one crash state of ``snapshot`` under ``out``; returns counts of what it
    dropped (pages kept old, entries missing), to show that states differ."""
    dropped = {"entries": 0, "old_pages": 0}

    def build(relative: str, target: str) -> None:
        os.makedirs(target, exist_ok=True)
        now = snapshot.listings.get(relative, {})
        durable = snapshot.synced_listings.get(relative, {})
        for name in sorted(set(now) | set(durable)):
            choices = []
            if name in now:
                choices.append(now[name])
            if name in durable and (name not in now or durable[name] != now[name]):
                choices.append(durable[name])
            if not (name in now and name in durable and now[name] == durable[name]):
                choices.append(None)  # the entry's change did not reach the disk
            entry = rng.choice(choices)
            if entry is None or (entry.inode not in snapshot.files and entry.inode not in snapshot.synced and not entry.is_dir):
                dropped["entries"] += entry is None
                continue
            path = os.path.join(target, name)
            if entry.is_dir:
                if entry == now.get(name):
                    build(os.path.normpath(os.path.join(relative, name)), path)
                continue
            current = snapshot.files.get(entry.inode, snapshot.synced.get(entry.inode, b""))
            synced = snapshot.synced.get(entry.inode, b"")
            data = _content(current, synced, rng)
            dropped["old_pages"] += sum(
                data[i : i + PAGE] != current.ljust(len(data), b"\x00")[i : i + PAGE] for i in range(0, len(data), PAGE)
            )
            with open(path, "wb") as handle:
                handle.write(data)

    build(".", out)
    return dropped
