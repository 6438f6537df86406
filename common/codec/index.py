"""Index files (docs/format.md §7): a 40-byte header, hashSlotNum int32 slots, indexNum entries.

Header:

    0   beginTimestamp   int64   store time of the first entry
    8   endTimestamp     int64   store time of the last entry
    16  beginPhyOffset   int64   commit log offset of the first entry
    24  endPhyOffset     int64   commit log offset of the last entry
    32  hashSlotCount    int32   inserts that found their slot empty
    36  indexCount       int32   next entry number (entry 0 is never used)

Entry:

    0   keyHash          int32   index_key_hash(topic#key), ≥ 0
    4   phyOffset        int64
    12  timeDiff         int32   whole seconds since beginTimestamp
    16  prevIndex        int32   previous entry of the same slot (0 = end of chain)
"""

from __future__ import annotations

import datetime as dt
import struct
from dataclasses import dataclass

import numpy as np

from rmqstore.common.errors import InvalidArgument

HEADER = struct.Struct(
    ">q"  # beginTimestamp
    "q"  # endTimestamp
    "q"  # beginPhyOffset
    "q"  # endPhyOffset
    "i"  # hashSlotCount
    "i"  # indexCount
)
HEADER_SIZE = HEADER.size
assert HEADER_SIZE == 40
HEADER_OFFSET_HASH_SLOT_COUNT = 32
HEADER_OFFSET_INDEX_COUNT = 36
SLOT = struct.Struct(">i")
SLOT_SIZE = SLOT.size
# A slot (its chain's newest entry number) as a numpy item, for the slot table at once.
SLOT_DTYPE = np.dtype(">i4")
assert SLOT_DTYPE.itemsize == SLOT_SIZE
ENTRY = struct.Struct(
    ">i"  # keyHash
    "q"  # phyOffset
    "i"  # timeDiff
    "i"  # prevIndex
)
ENTRY_SIZE = ENTRY.size
assert ENTRY_SIZE == 20
# The same layout as a numpy record, for writing many entries at once.
ENTRY_DTYPE = np.dtype([("key_hash", ">i4"), ("phy_offset", ">i8"), ("time_diff", ">i4"), ("prev_index", ">i4")])
assert ENTRY_DTYPE.itemsize == ENTRY_SIZE

DEFAULT_SLOTS = 5_000_000
DEFAULT_ENTRIES = 20_000_000
INT32_MAX = 2**31 - 1
NAME_LENGTH = 17


@dataclass(frozen=True, slots=True)
class Header:
    begin_timestamp_ms: int
    end_timestamp_ms: int
    begin_phy_offset: int
    end_phy_offset: int
    hash_slot_count: int
    index_count: int


@dataclass(frozen=True, slots=True)
class Entry:
    key_hash: int
    phy_offset: int
    time_diff_s: int
    prev_index: int


def encode_header(header: Header) -> bytes:
    return HEADER.pack(
        header.begin_timestamp_ms,
        header.end_timestamp_ms,
        header.begin_phy_offset,
        header.end_phy_offset,
        header.hash_slot_count,
        header.index_count,
    )


def decode_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> Header:
    return Header(*HEADER.unpack_from(buf, pos))


def encode_entry(entry: Entry) -> bytes:
    return ENTRY.pack(entry.key_hash, entry.phy_offset, entry.time_diff_s, entry.prev_index)


def decode_entry(buf: bytes | bytearray | memoryview, pos: int) -> Entry:
    return Entry(*ENTRY.unpack_from(buf, pos))


def file_size(slots: int, entries: int) -> int:
    return HEADER_SIZE + SLOT_SIZE * slots + ENTRY_SIZE * entries


def slot_position(slot: int) -> int:
    return HEADER_SIZE + SLOT_SIZE * slot


def entry_position(slots: int, number: int) -> int:
    return HEADER_SIZE + SLOT_SIZE * slots + ENTRY_SIZE * number


def time_diff_s(store_timestamp_ms: int, begin_timestamp_ms: int) -> int:
    """Seconds since the file's begin, truncated toward zero, 0 if begin ≤ 0, clamped to int32."""
    if begin_timestamp_ms <= 0:
        return 0
    delta = store_timestamp_ms - begin_timestamp_ms
    seconds = abs(delta) // 1000 * (1 if delta >= 0 else -1)
    return min(max(seconds, 0), INT32_MAX)


def file_name(epoch_ms: int, zone: dt.tzinfo | None = None) -> str:
    """UtilAll.timeMillisToHumanString: yyyyMMddHHmmssSSS in the given (default local) zone."""
    moment = dt.datetime.fromtimestamp(epoch_ms // 1000, zone)
    return moment.strftime("%Y%m%d%H%M%S") + f"{epoch_ms % 1000:03d}"


def name_after(name: str) -> str:
    """The smallest file name one millisecond after ``name`` (keeps names strictly
    increasing when a file is opened for a record older than the newest file)."""
    moment = dt.datetime.strptime(name[:14], "%Y%m%d%H%M%S") + dt.timedelta(milliseconds=int(name[14:17]) + 1)
    return moment.strftime("%Y%m%d%H%M%S") + f"{moment.microsecond // 1000:03d}"


def is_file_name(name: str) -> bool:
    """IndexService.load keeps names that parse as numbers; ours are 17 digits."""
    return name.isdigit() and name.isascii()


def check_geometry(slots: int, entries: int) -> None:
    if slots <= 0 or entries <= 1:
        raise InvalidArgument(f"index geometry needs slots > 0 and entries > 1, got {slots}/{entries}")
