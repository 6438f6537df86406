"""rmqstore's progress file (our own; not a RocketMQ file).

The writer publishes here how far the commit log is written *and* dispatched; query nodes
never return data past it. Two 64-byte slots are written alternately, each with a
sequence number and a CRC, so a reader always finds one whole slot even if a write is torn.

Slot layout:

    0   magic                      4 bytes  "RMQP"
    4   version                    uint16   1
    6   reserved                   uint16   0
    8   sequence                   uint64   higher is newer
    16  dispatched_offset          int64    records below are written and dispatched
    24  durable_offset             int64    records below are on disk with their queues and index
    32  commitlog_min_offset       int64    the oldest commit log offset still kept
    40  last_store_timestamp_ms    int64    store time of the last dispatched record
    48  reserved                   8 bytes  zero
    56  crc32                      uint32   zlib CRC-32 of bytes 0-55
    60  reserved                   4 bytes  zero
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from mmap import mmap

from rmqstore.common.errors import Corruption

MAGIC = b"RMQP"
VERSION = 1
SLOT = struct.Struct(
    ">4s"  # magic
    "H"  # version
    "H"  # reserved
    "Q"  # sequence
    "q"  # dispatched_offset
    "q"  # durable_offset
    "q"  # commitlog_min_offset
    "q"  # last_store_timestamp_ms
    "8x"  # reserved
)
SLOT_BODY_SIZE = SLOT.size
assert SLOT_BODY_SIZE == 56
_CRC = struct.Struct(">I4x")
SLOT_SIZE = SLOT_BODY_SIZE + _CRC.size
assert SLOT_SIZE == 64
FILE_SIZE = 2 * SLOT_SIZE
FILE_NAME = "rmqstore-progress"


@dataclass(frozen=True, slots=True)
class Progress:
    sequence: int
    dispatched_offset: int
    durable_offset: int
    commitlog_min_offset: int
    last_store_timestamp_ms: int


def encode_slot(progress: Progress) -> bytes:
    body = SLOT.pack(
        MAGIC,
        VERSION,
        0,
        progress.sequence,
        progress.dispatched_offset,
        progress.durable_offset,
        progress.commitlog_min_offset,
        progress.last_store_timestamp_ms,
    )
    return body + _CRC.pack(zlib.crc32(body))


def decode_slot(buf: bytes | bytearray | memoryview | mmap, pos: int = 0) -> Progress | None:
    """The slot's progress, or None if it is empty, torn or from another version."""
    body = bytes(buf[pos : pos + SLOT_BODY_SIZE])
    if len(body) < SLOT_BODY_SIZE or body[:4] != MAGIC:
        return None
    (crc,) = _CRC.unpack_from(buf, pos + SLOT_BODY_SIZE)
    if zlib.crc32(body) != crc:
        return None
    _magic, version, _, sequence, dispatched, durable, min_offset, last_ts = SLOT.unpack(body)
    if version != VERSION:
        return None
    return Progress(sequence, dispatched, durable, min_offset, last_ts)


def slot_position(sequence: int) -> int:
    """Sequence n goes to slot n % 2."""
    return (sequence % 2) * SLOT_SIZE


def decode_file(buf: bytes | bytearray | memoryview | mmap) -> Progress | None:
    """The newest valid slot; None for a file with no valid slot (never written)."""
    if len(buf) < FILE_SIZE:
        raise Corruption(f"progress file is {len(buf)} bytes; {FILE_SIZE} expected")
    slots = [p for p in (decode_slot(buf, 0), decode_slot(buf, SLOT_SIZE)) if p is not None]
    return max(slots, key=lambda p: p.sequence) if slots else None
