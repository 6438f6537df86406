"""The checkpoint file (docs/format.md §8): three int64 times in a 4096-byte file.

    0   physicMsgTimestamp   int64   store time of flushed commit log data
    8   logicsMsgTimestamp   int64   store time of the last record dispatched to a queue
    16  indexMsgTimestamp    int64   endTimestamp of the last index file that filled up
    24  masterFlushedOffset  int64   5.x only
    32  confirmPhyOffset     int64   5.x only
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

FILE_SIZE = 4096
FIELDS = struct.Struct(
    ">q"  # physicMsgTimestamp
    "q"  # logicsMsgTimestamp
    "q"  # indexMsgTimestamp
    "q"  # masterFlushedOffset (5.x)
    "q"  # confirmPhyOffset (5.x)
)
V4_SIZE = 24
MIN_TIMESTAMP_SLACK_MS = 3000


@dataclass(frozen=True, slots=True)
class Checkpoint:
    physic_msg_timestamp_ms: int = 0
    logics_msg_timestamp_ms: int = 0
    index_msg_timestamp_ms: int = 0
    master_flushed_offset: int = 0
    confirm_phy_offset: int = 0

    @property
    def min_timestamp_ms(self) -> int:
        """max(0, min(physic, logics) − 3 s): where abnormal recovery starts by default."""
        return max(0, min(self.physic_msg_timestamp_ms, self.logics_msg_timestamp_ms) - MIN_TIMESTAMP_SLACK_MS)

    @property
    def min_timestamp_index_ms(self) -> int:
        return min(self.min_timestamp_ms, self.index_msg_timestamp_ms)


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    fields = FIELDS.pack(
        checkpoint.physic_msg_timestamp_ms,
        checkpoint.logics_msg_timestamp_ms,
        checkpoint.index_msg_timestamp_ms,
        checkpoint.master_flushed_offset,
        checkpoint.confirm_phy_offset,
    )
    return fields + bytes(FILE_SIZE - len(fields))


def decode_checkpoint(buf: bytes | bytearray | memoryview) -> Checkpoint:
    return Checkpoint(*FIELDS.unpack_from(buf, 0))
