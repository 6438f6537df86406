"""Consume queue units (docs/format.md §6) and the tagsCode rule (§6.2).

A unit is 20 bytes:

    0   commitLogOffset   int64   the record's PHYSICALOFFSET
    8   size              int32   the record's TOTALSIZE
    12  tagsCode          int64   String.hashCode(TAGS), or a delayed message's deliver time
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from rmqstore.common.codec.javahash import java_string_hash
from rmqstore.common.codec.speedups import _speedups

UNIT = struct.Struct(
    ">q"  # commitLogOffset
    "i"  # size
    "q"  # tagsCode
)
UNIT_SIZE = UNIT.size
assert UNIT_SIZE == 20
# The same layout as a numpy record's fields: the file layer's UNIT_DTYPE, which reads and
# writes many units at once. Built there, so that this module's rules (the topics, the
# delay levels, a lookup's output of them) load no numpy.
UNIT_FIELDS = (("commitlog_offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8"))
FILLER_SIZE = 0x7FFFFFFF
FILLER = UNIT.pack(0, FILLER_SIZE, 0)
DEFAULT_FILE_UNITS = 300_000

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
# RocketMQ 5's timer topic (TimerMessageStore.TIMER_TOPIC): rmqstore keeps timed messages
# there, each unit's tagsCode holding its due time (TIMER_OUT_MS), as SCHEDULE_TOPIC_XXXX's
# hold their deliver time.
TIMER_TOPIC = "rmq_sys_wheel_timer"
# Transactions (TopicValidator): half messages (queue 0), the op records that resolve them
# (queue 0, body "<half queue offset>,"), and half messages checked too often.
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


@dataclass(frozen=True, slots=True)
class Unit:
    commitlog_offset: int
    size: int
    tags_code: int

    @property
    def is_valid(self) -> bool:
        """ConsumeQueue's test: offset ≥ 0 and size > 0 (fillers count as valid)."""
        return self.commitlog_offset >= 0 and self.size > 0

    @property
    def is_filler(self) -> bool:
        return self.commitlog_offset == 0 and self.size == FILLER_SIZE and self.tags_code == 0


def encode_unit(commitlog_offset: int, size: int, tags_code: int) -> bytes:
    return UNIT.pack(commitlog_offset, size, tags_code)


# A queue's share of a batch: topic, queue id, its first queue offset, the position of its
# last record in the batch, and its units' bytes in record order.
QueueBlock = tuple[str, int, int, int, bytes]
_QUEUE_ID_RANGE = range(-(2**31), 2**31)
_QUEUE_OFFSET_END = 2**62  # far past any queue; keeps the compiled pass's arithmetic in int64


def queue_unit_blocks(
    topics: Sequence[str],
    queue_ids: Sequence[int],
    queue_offsets: Sequence[int],
    commitlog_offsets: Sequence[int],
    sizes: Sequence[int],
    tags_codes: Sequence[int],
) -> list[QueueBlock] | None:
    """A batch's units grouped by queue, each queue's as one block of bytes, in the order
    the batch first names the queues; None when some queue's offsets do not run
    consecutively within the batch or a value does not fit its field (the caller then
    takes the general path). One compiled pass where the extension is built."""
    if _speedups is not None:
        blocks: list[QueueBlock] | None = _speedups.queue_unit_blocks(
            topics, queue_ids, queue_offsets, commitlog_offsets, sizes, tags_codes
        )
        return blocks
    return python_queue_unit_blocks(topics, queue_ids, queue_offsets, commitlog_offsets, sizes, tags_codes)


def python_queue_unit_blocks(
    topics: Sequence[str],
    queue_ids: Sequence[int],
    queue_offsets: Sequence[int],
    commitlog_offsets: Sequence[int],
    sizes: Sequence[int],
    tags_codes: Sequence[int],
) -> list[QueueBlock] | None:
    """The definition of :func:`queue_unit_blocks`."""
    if not len(topics) == len(queue_ids) == len(queue_offsets) == len(commitlog_offsets) == len(sizes) == len(tags_codes):
        raise ValueError("the columns differ in length")
    groups: dict[tuple[str, int], list[int]] = {}
    for position, (topic, queue_id) in enumerate(zip(topics, queue_ids)):
        if type(topic) is not str or not isinstance(queue_id, int) or queue_id not in _QUEUE_ID_RANGE:
            return None
        groups.setdefault((topic, queue_id), []).append(position)
    blocks = []
    for (topic, queue_id), positions in groups.items():
        offsets = [queue_offsets[p] for p in positions]
        fields = [(commitlog_offsets[p], sizes[p], tags_codes[p]) for p in positions]
        if not all(isinstance(value, int) for value in itertools.chain(offsets, *fields)):
            return None
        first = offsets[0]
        if offsets != list(range(first, first + len(positions))) or first < 0 or first + len(positions) > _QUEUE_OFFSET_END:
            return None
        try:
            units = b"".join([UNIT.pack(*unit) for unit in fields])
        except struct.error:
            return None
        blocks.append((topic, queue_id, first, positions[-1], units))
    return blocks


def decode_unit(buf: bytes | bytearray | memoryview, pos: int = 0) -> Unit:
    return Unit(*UNIT.unpack_from(buf, pos))


def tags_code(tags: str | None) -> int:
    """tagsString2tagsCode: String.hashCode of the whole TAGS value; 0 when absent or empty."""
    if not tags:
        return 0
    return java_string_hash(tags)


def parse_delay_levels(levels: str = DEFAULT_DELAY_LEVELS) -> dict[int, int]:
    """messageDelayLevel → {level: delay ms}, levels numbered from 1."""
    table: dict[int, int] = {}
    for number, token in enumerate(levels.split(), start=1):
        table[number] = int(token[:-1]) * _UNIT_MS[token[-1]]
    return table


def deliver_timestamp(level: int, store_timestamp_ms: int, delay_levels_ms: dict[int, int]) -> int:
    """computeDeliverTimestamp: store time + the level's delay, or + 1000 ms if it has none."""
    delay = delay_levels_ms.get(level)
    return store_timestamp_ms + (delay if delay is not None else 1000)
