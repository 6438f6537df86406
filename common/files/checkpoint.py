"""The ``checkpoint`` file: read it, and replace it whole (docs/format.md §8).

RocketMQ overwrites the file in place; a full disk or a crash in that write can leave it
empty or torn. Here a new file is written and fsynced under a temporary name, then renamed
over the old one: a reader finds the old checkpoint or the new one, never neither."""

from __future__ import annotations

import errno
import os

from rmqstore.common.codec.checkpoint import (
    FILE_SIZE,
    V4_SIZE,
    Checkpoint,
    decode_checkpoint,
    encode_checkpoint,
)
from rmqstore.common.errors import Corruption
from rmqstore.common.files.mapped import fsync_directory


def read_checkpoint(path: str) -> Checkpoint | None:
    """The checkpoint at ``path``, or None if there is none. A file too short to hold the
    three 4.x fields is corruption; missing 5.x fields read as zero."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(FILE_SIZE)
    except FileNotFoundError:
        return None
    if len(data) < V4_SIZE:
        raise Corruption(f"checkpoint {path} is {len(data)} bytes; at least {V4_SIZE} expected", path=path)
    return decode_checkpoint(data.ljust(FILE_SIZE, b"\x00"))


def write_checkpoint(path: str, checkpoint: Checkpoint) -> None:
    """Replace the 4096-byte file (StoreCheckpoint.flush's bytes): write a temporary file,
    fsync it, rename it over ``path``, fsync the directory. A failure (ENOSPC) leaves the
    previous checkpoint as it was and raises."""
    directory = os.path.dirname(path) or "."
    temp = os.path.join(directory, f".{os.path.basename(path)}.writing")
    data = encode_checkpoint(checkpoint).ljust(FILE_SIZE, b"\x00")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        written = os.write(fd, data)
        if written != len(data):  # a short write to a regular file: the disk filled up
            raise OSError(errno.ENOSPC, f"{temp}: only {written} of {len(data)} bytes written")
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(temp)
        raise
    os.close(fd)
    os.rename(temp, path)
    fsync_directory(directory)
