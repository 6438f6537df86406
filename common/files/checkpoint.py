"""The ``checkpoint`` file: read it, and write it in place as RocketMQ does (docs/format.md §8)."""

from __future__ import annotations

import os

from rmqstore.common.codec.checkpoint import (
    FILE_SIZE,
    V4_SIZE,
    Checkpoint,
    decode_checkpoint,
    encode_checkpoint,
)
from rmqstore.common.errors import Corruption


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
    """Overwrite the 4096-byte file in place and fsync it (StoreCheckpoint.flush)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, encode_checkpoint(checkpoint), 0)
        os.fsync(fd)
    finally:
        os.close(fd)
