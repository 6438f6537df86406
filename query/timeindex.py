"""A query node's time index: each searched queue's store times, in memory.

A time search (LOWER / UPPER) bisects a queue's units by the store time of their records.
Reading a record's header at each probe costs a read of the commit log a probe; this index
reads each visible unit's record header once, keeps its STORETIMESTAMP in an int64 array
in queue order, and answers every later search by bisecting the array. It holds nothing on
disk (a node builds it on a queue's first search and extends it as the writer appends), so
there is nothing to rebuild or to keep in step with Apache's files.

Exactness: the bisection probes the same units, in the same order, as
``ConsumeQueue.offset_by_time`` over the same [low, high) (``bisect`` takes the middle as
``(lo + hi) // 2`` too), so every answer is the one a probe-by-probe search gives, even
where store times do not ascend. The array holds the units of the queue's visible range
only: units below the range (expired) are dropped, and when the range shrinks (a writer
that restarted with less of the log) the units past it are dropped and read again once
visible. Units inside the visible range point at records that never change; the last
one kept is checked against the queue whenever the range moves, and a queue whose unit
there changed is read anew.

Memory: 8 bytes a unit of each queue searched by time (8 MB a million messages).
"""

from __future__ import annotations

import bisect
from array import array

from rmqstore.common.errors import Corruption
from rmqstore.common.files.commitlog import CommitLog
from rmqstore.common.files.consumequeue import UNIT_SIZE, ConsumeQueue


class QueueTimes:
    """Store times of one queue's units [start, start + len(times)). Not thread-safe: the
    view's lock guards it."""

    def __init__(self) -> None:
        self.start = 0
        self.times: array[int] = array("q")
        self._last = (-1, -1)  # (queue offset, commit log offset) of the last unit read
        self._range = (-1, -1)  # the visible [low, high) it was last brought to

    def follow(self, queue: ConsumeQueue, log: CommitLog, low: int, high: int) -> None:
        """Hold the times of units [low, high) (the queue's visible range, low ≤ high)."""
        if (low, high) == self._range:
            return
        if not self.start <= low <= self.start + len(self.times) or not self._last_unit_holds(queue):
            self.start, self.times = low, array("q")
        else:
            del self.times[high - self.start :]  # past the visible range
            del self.times[: low - self.start]  # expired
            self.start = low
        self._extend(queue, log, high)
        self._range = (low, high)

    def _last_unit_holds(self, queue: ConsumeQueue) -> bool:
        """Whether the last unit read still points where it did (a queue rewritten under
        the array is read anew)."""
        queue_offset, commitlog_offset = self._last
        if not self.start <= queue_offset < self.start + len(self.times):
            return True
        unit = queue.read(queue_offset)
        return unit is not None and unit.commitlog_offset == commitlog_offset

    def _extend(self, queue: ConsumeQueue, log: CommitLog, high: int) -> None:
        """Read the times of the units from the array's end to ``high``, a consume queue
        file at a time."""
        position = self.start + len(self.times)
        while position < high:
            mapped = queue.files.find(position * UNIT_SIZE)
            if mapped is None:
                raise Corruption(f"consume queue {queue.topic}/{queue.queue_id} has no file for offset {position}")
            base = mapped.start_offset // UNIT_SIZE
            end = min(high, mapped.end_offset // UNIT_SIZE)
            chunk = array("q", bytes(8 * (end - position)))
            at = position
            with memoryview(chunk) as out:
                while at < end:
                    with out[at - position :] as rest:
                        at += log.store_times_of_units(mapped.buf, at - base, end - base, rest)
                    if at < end:  # a unit the compiled read did not take: read here, exactly
                        chunk[at - position] = self._read_one(queue, log, at)
                        at += 1
            self.times.extend(chunk)
            position = end
        last = queue.read(position - 1) if position > self.start else None
        if last is not None:
            self._last = (position - 1, last.commitlog_offset)

    @staticmethod
    def _read_one(queue: ConsumeQueue, log: CommitLog, queue_offset: int) -> int:
        unit = queue.read(queue_offset)
        if unit is None:
            raise Corruption(f"consume queue {queue.topic}/{queue.queue_id} has a filler at offset {queue_offset}")
        return log.store_timestamp(unit.commitlog_offset)

    def at(self, queue_offset: int) -> int:
        """The store time of the unit at ``queue_offset`` (within the range followed)."""
        return self.times[queue_offset - self.start]

    def first_stored_after(self, low: int, high: int, timestamp_ms: int, strict: bool) -> int:
        """The first offset in [low, high) (within the range followed) stored at or after
        ``timestamp_ms`` (after it when ``strict``); ``high`` if none."""
        search = bisect.bisect_right if strict else bisect.bisect_left
        return self.start + search(self.times, timestamp_ms, low - self.start, high - self.start)
