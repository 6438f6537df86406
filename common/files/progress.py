"""The progress file on disk: the writer publishes, query nodes read (see codec.progress)."""

from __future__ import annotations

import mmap
import os

from rmqstore.common.codec import progress as codec
from rmqstore.common.errors import Corruption
from rmqstore.common.files.mapped import fsync_directory


def progress_path(root: str) -> str:
    return os.path.join(root, codec.FILE_NAME)


def read_progress(root: str) -> codec.Progress | None:
    """The newest valid slot, or None when there is no progress file (e.g. a store
    written by Apache's broker) or it was never written."""
    try:
        with open(progress_path(root), "rb") as handle:
            data = handle.read(codec.FILE_SIZE)
    except FileNotFoundError:
        return None
    return codec.decode_file(data)


class ProgressPublisher:
    """The writer's side: publish a new slot in place. Publishing is a memory write that
    readers see at once; :meth:`sync` makes it durable."""

    def __init__(self, root: str):
        path = progress_path(root)
        created = not os.path.exists(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size not in (0, codec.FILE_SIZE):
                raise Corruption(f"{path} is {size} bytes; {codec.FILE_SIZE} expected", path=path)
            if size == 0:
                os.ftruncate(fd, codec.FILE_SIZE)
            self._mmap = mmap.mmap(fd, codec.FILE_SIZE, access=mmap.ACCESS_WRITE)
        finally:
            os.close(fd)
        if created:
            fsync_directory(root)
        self.path = path
        self.last = codec.decode_file(self._mmap)

    def publish(
        self,
        *,
        dispatched_offset: int,
        durable_offset: int,
        commitlog_min_offset: int,
        last_store_timestamp_ms: int,
    ) -> codec.Progress:
        sequence = (self.last.sequence + 1) if self.last else 1
        progress = codec.Progress(
            sequence, dispatched_offset, durable_offset, commitlog_min_offset, last_store_timestamp_ms
        )
        position = codec.slot_position(sequence)
        self._mmap[position : position + codec.SLOT_SIZE] = codec.encode_slot(progress)
        self.last = progress
        return progress

    def sync(self) -> None:
        self._mmap.flush()

    def close(self) -> None:
        self._mmap.close()
