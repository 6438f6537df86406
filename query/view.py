"""A read-only view of a store directory that follows a live writer, and every lookup.

The view never writes and never takes the writer's lock. It trusts nothing past the
writer's published progress (``rmqstore-progress``): a record is visible only if it ends
at or below the published dispatched offset. On a store without a progress file (Apache's
broker wrote it) the visible end is the end of the records that validate.

Lookups answer from the records themselves: a key lookup reads every index candidate and
keeps only records whose topic is the topic and whose KEYS hold the key (hash collisions
and other topics dropped), and time ranges apply to exact store timestamps.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import mmap
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from rmqstore.common.codec import index as ix
from rmqstore.common.codec import sysflag
from rmqstore.common.codec.consumequeue import HALF_TOPIC, SCHEDULE_TOPIC, TIMER_TOPIC
from rmqstore.common.codec.javahash import topic_key_hash
from rmqstore.common.codec.msgid import decode_offset_msg_id, offset_msg_id
from rmqstore.common.codec.properties import REAL_TOPIC, TIMER_DEL_UNIQKEY, split_keys
from rmqstore.common.codec.record import Record
from rmqstore.common.codec.topic import cached_topic_problem as topic_problem
from rmqstore.common.errors import Corruption, InvalidArgument, NotFound, OutOfRange
from rmqstore.common.files.commitlog import CommitLog, KeyMatch, StopReason
from rmqstore.common.files.consumequeue import Boundary, ConsumeQueue, ConsumeQueueSet
from rmqstore.common.files.cursorkey import KEY_BYTES, read_cursor_key
from rmqstore.common.files.index import MATCHING_OFFSETS_FIRST_CHUNK, IndexFileList
from rmqstore.common.files.progress import read_progress
from rmqstore.common.files.store import StorePaths, StoreSizes, resolve_sizes
from rmqstore.query.cursor import decode_cursor, encode_cursor, query_digest
from rmqstore.query.timeindex import QueueTimes

TIME_MIN_MS = 0
TIME_MAX_MS = 2**63 - 1
PAGE_SIZE_MAX = 10_000
PULL_COUNT_MAX = 10_000
# A day at one-minute intervals is 1,441 boundaries; two weeks fit.
OFFSETS_BY_TIME_MAX = 20_000
# Taken once: an Enum member looked up on its class costs about a time search's bisection.
_UPPER = Boundary.UPPER

# Every answer that can grow (a key page, a UNIQ_KEY page, a pull) stops adding records
# past this many bytes of them, after its first: well under the 64 MiB a gRPC message may
# carry, so no answer fails for its size, and one 4 MiB record is always one page.
RESPONSE_BYTES_MAX = 16 * 1024 * 1024
REFRESH_INTERVAL_S = 0.01
# The node drops the mapped pages it has touched from its resident set every so often,
# and as soon as they pass a budget (checked every 32 lookups: a page fault maps
# up to 16 neighbouring cached pages, so random lookups fill the RSS fast): the pages stay
# in the page cache (a lookup maps one back in for about a microsecond), and the node's
# RSS stays flat however large the store and however many lookups it serves.
TRIM_INTERVAL_S = 5.0
# Below it the lookups' pages stay mapped (a trim makes the next lookups fault them back).
# Records are read with pread, so the budget holds index and queue pages: 96 MiB holds a
# 1M-message store's (its index is 66 MB) and keeps a node near 130 MB of RSS with its
# own ~35 MB, whatever the store's size.
MAPPED_RESIDENT_BUDGET_BYTES = 96 * 1024 * 1024
# The walk for ROLLBACK records' keys drops the log pages behind it every so often.
CATCH_UP_RELEASE_BYTES = 8 * 1024 * 1024
TRIM_CHECK_EVERY_LOOKUPS = 32
_STATM = "/proc/self/statm"


class _ResidentGauge:
    """Resident file-backed (and shared) memory of this process, from /proc/self/statm
    held open and read with pread (cheaper than opening it each time: benchmarks/FILES.md);
    None off Linux. /proc/self names the process that opened it, so a forked child opens
    its own."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._pid = 0

    def read(self) -> int | None:
        try:
            if self._fd is None or self._pid != os.getpid():
                self.close()
                self._fd, self._pid = os.open(_STATM, os.O_RDONLY | os.O_CLOEXEC), os.getpid()
            return int(os.pread(self._fd, 256, 0).split()[2]) * mmap.PAGESIZE
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # in a forked child, its own copy of the parent's
        self._fd = None


@dataclass(frozen=True, slots=True)
class KeyPage:
    records: list[Record]
    cursor: str  # continue with this; empty when complete
    complete: bool


@dataclass(slots=True)  # not frozen: a frozen class's construction costs a time search a fifth
class OffsetSearch:
    offset: int
    found: bool  # a message at ``offset`` satisfies the boundary


@dataclass(frozen=True, slots=True)
class ViewStatus:
    visible_offset: int
    published_offset: int
    min_offset: int
    has_progress: bool
    refreshed_ago_ms: float
    last_store_timestamp_ms: int

    @property
    def lag_bytes(self) -> int:
        return max(self.published_offset - self.visible_offset, 0)


def check_time_range(begin_ms: int, end_ms: int) -> None:
    if begin_ms < 0 or end_ms < 0:
        raise InvalidArgument(f"times must not be negative (begin {begin_ms}, end {end_ms})")
    if end_ms < begin_ms:
        raise InvalidArgument(f"end {end_ms} is before begin {begin_ms}")


class StoreView:
    """Thread-safe: lookups and refreshes take one lock."""

    def __init__(
        self,
        root: str,
        sizes: StoreSizes | None = None,
        *,
        mapped_budget_bytes: int | None = None,
        response_bytes_max: int | None = None,
    ):
        self.root = root
        self.response_bytes_max = RESPONSE_BYTES_MAX if response_bytes_max is None else response_bytes_max
        self.mapped_budget_bytes = MAPPED_RESIDENT_BUDGET_BYTES if mapped_budget_bytes is None else mapped_budget_bytes
        self.paths = StorePaths(root)
        self.sizes = sizes or resolve_sizes(root)
        self._lock: threading.RLock = threading.RLock()
        self.log = CommitLog(self.paths.commitlog, self.sizes.commitlog_file_size_bytes)
        # Lookups land anywhere in the log: each record is read with pread, which leaves
        # the log's pages out of the node's resident set (the mapped-page budget below
        # then holds the index and the queues).
        self.log.read_through_file = True
        self.queues = ConsumeQueueSet(self.paths.consumequeue, self.sizes.cq_file_units)
        self.index = IndexFileList(self.paths.index, self.sizes.index_slots, self.sizes.index_entries)
        self.visible_offset = 0
        self.published_offset = 0
        self.min_offset = 0
        self.has_progress = False
        self.last_store_timestamp_ms = 0
        self._refreshed_at = 0.0
        self._trimmed_at = time.monotonic()
        self._lookups_since_check = 0
        self._resident = _ResidentGauge()
        self._queues_seen_at_offset: dict[tuple[str, int], int] = {}
        self._queue_bounds: dict[tuple[str, int], tuple[tuple[int, int, int, int], tuple[int, int]]] = {}
        self._unindexed: dict[tuple[str, str], list[int]] = {}
        # (topic, queue id) -> ((visible offset, min offset), its time index, low, high)
        self._times: dict[tuple[str, int], tuple[tuple[int, int], QueueTimes, int, int]] = {}
        self._unindexed_scanned = 0
        self._cursor_key_value = secrets.token_bytes(KEY_BYTES)
        self._cursor_key_shared = False
        self.refresh(force=True)

    # Following the writer

    def refresh(self, force: bool = False) -> None:
        with self._lock:
            now = time.monotonic()
            self._maybe_trim(now)
            if not force and now - self._refreshed_at < REFRESH_INTERVAL_S:
                return
            self._refreshed_at = now
            progress = read_progress(self.root)
            if progress is None and self.has_progress:
                raise Corruption(f"the progress file under {self.root} disappeared")
            files_changed = self.log.refresh()
            if progress is not None:
                self.has_progress = True
                bound = progress.dispatched_offset
                self.published_offset = bound
                self.last_store_timestamp_ms = progress.last_store_timestamp_ms
                self.min_offset = max(progress.commitlog_min_offset, self.log.min_offset)
            else:
                bound = self._validated_end()
                self.published_offset = bound
                self.min_offset = self.log.min_offset
            if bound != self.visible_offset or files_changed:
                self.index.refresh()
                self.visible_offset = bound

    def _maybe_trim(self, now: float) -> None:
        self._lookups_since_check += 1
        if now - self._trimmed_at < TRIM_INTERVAL_S:
            if self._lookups_since_check < TRIM_CHECK_EVERY_LOOKUPS:
                return
            self._lookups_since_check = 0
            resident = self._resident.read()
            if resident is None or resident <= self.mapped_budget_bytes:
                return
        self._lookups_since_check = 0
        self._trimmed_at = now
        self._trim()

    def _trim(self) -> None:
        for mapped in self.log.files:
            mapped.release()
        for index_file in self.index.files:
            index_file.mapped.release()
        for queue in self.queues.queues.values():
            for mapped in queue.files:
                mapped.release()

    def _validated_end(self) -> int:
        """Apache's store: the end of the records that validate, scanning on from the last
        known end (or from the newest file with data)."""
        start = self.visible_offset
        if start < self.log.min_offset or (self.log.files.find(start) is None and start != self.log.max_file_offset):
            start = self.log.min_offset
            for mapped in reversed(self.log.files.files):
                if mapped.last_nonzero_position(0) > 0:
                    start = mapped.start_offset
                    break
        stop = self.log.scan(start, check_crc=True)
        return stop.end_offset if stop.reason is not StopReason.CORRUPT or stop.end_offset > start else start

    def status(self) -> ViewStatus:
        with self._lock:
            return ViewStatus(
                self.visible_offset,
                self.published_offset,
                self.min_offset,
                self.has_progress,
                (time.monotonic() - self._refreshed_at) * 1000,
                self.last_store_timestamp_ms,
            )

    # What a lookup would do first

    @property
    def lock(self) -> threading.RLock:
        """The lock every lookup and refresh holds (a server that must never wait on it
        takes it without blocking, or leaves the lookup to a thread)."""
        return self._lock

    def walks_little_first(self) -> bool:
        """Whether a key or UNIQ_KEY lookup finds at most ``CATCH_UP_RELEASE_BYTES`` of the
        log to walk for ROLLBACK records' keys before it answers (a node's first one walks
        the whole log)."""
        return self.visible_offset - max(self._unindexed_scanned, self.min_offset) <= CATCH_UP_RELEASE_BYTES

    def has_time_index(self, topic: str, queue_id: int) -> bool:
        """Whether the queue's time index is built (a queue's first time search reads the
        header of each of its records)."""
        return (topic, queue_id) in self._times

    # Records

    def _visible(self, offset: int, size: int) -> bool:
        return self.min_offset <= offset and offset + size <= self.visible_offset

    def read(self, offset: int) -> Record:
        """The visible record that starts at ``offset``."""
        if offset < self.min_offset or offset >= self.visible_offset:
            raise OutOfRange(
                f"commit log offset {offset} is outside the visible range [{self.min_offset}, {self.visible_offset})"
            )
        record = self.log.read(offset)
        if record.next_offset > self.visible_offset:
            raise OutOfRange(f"the record at commit log offset {offset} is not visible yet")
        return record

    # Topics and queues

    def _queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        problem = topic_problem(topic)
        if problem is not None:
            raise InvalidArgument(problem)
        if queue_id < 0:
            raise InvalidArgument(f"queue id {queue_id} is negative")
        queue = self.queues.find(topic, queue_id)
        if queue is None:
            if not self._topic_exists(topic):
                raise NotFound(f"topic {topic} does not exist in this store")
            raise NotFound(f"topic {topic} has no queue {queue_id} in this store")
        if self._queues_seen_at_offset.get((topic, queue_id)) != self.visible_offset:
            queue.refresh()
            self._queues_seen_at_offset[(topic, queue_id)] = self.visible_offset
        return queue

    def _topic_exists(self, topic: str) -> bool:
        return any(t == topic for t, _ in self.queues.discover())

    def topics(self) -> dict[str, list[int]]:
        with self._lock:
            found: dict[str, list[int]] = {}
            for topic, queue_id in self.queues.discover():
                found.setdefault(topic, []).append(queue_id)
            return {topic: sorted(ids) for topic, ids in sorted(found.items())}

    def _visible_max(self, queue: ConsumeQueue) -> int:
        high = queue.max_offset
        while high > queue.min_offset:
            unit = queue.read(high - 1)
            if unit is None or unit.commitlog_offset + unit.size <= self.visible_offset:
                break
            high -= 1
        return high

    def _visible_min(self, queue: ConsumeQueue) -> int:
        low = queue.min_offset
        high = queue.max_offset
        while low < high:
            unit = queue.read(low)
            if unit is not None and unit.commitlog_offset >= self.min_offset:
                break
            low += 1
        return low

    def _bounds(self, topic: str, queue_id: int, queue: ConsumeQueue) -> tuple[int, int]:
        """(low, high) of the queue's visible offsets, kept until the visible range or the
        queue's files change (a lookup by offset would otherwise read three units)."""
        state = (self.visible_offset, self.min_offset, queue.min_offset, queue.max_offset)
        known = self._queue_bounds.get((topic, queue_id))
        if known is not None and known[0] == state:
            return known[1]
        high = self._visible_max(queue)
        bounds = (min(self._visible_min(queue), high), high)
        self._queue_bounds[(topic, queue_id)] = (state, bounds)
        return bounds

    def queue_bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(min, max): offsets min … max − 1 are readable."""
        self.refresh()
        with self._lock:
            return self._bounds(topic, queue_id, self._queue(topic, queue_id))

    def by_queue_offset(self, topic: str, queue_id: int, queue_offset: int) -> Record:
        self.refresh()
        with self._lock:
            queue = self._queue(topic, queue_id)
            low, high = self._bounds(topic, queue_id, queue)
            if not low <= queue_offset < high:
                raise OutOfRange(f"queue offset {queue_offset} of {topic}/{queue_id} is outside [{low}, {high})")
            unit = queue.read(queue_offset)
            if unit is None:
                raise NotFound(f"no message at queue offset {queue_offset} of {topic}/{queue_id}")
            return self.read(unit.commitlog_offset)

    def pull(self, topic: str, queue_id: int, from_offset: int, max_count: int, max_bytes: int) -> tuple[list[Record], int]:
        """Messages from ``from_offset`` on, at most ``max_count`` and (after the first)
        ``max_bytes`` of records, or the response budget when ``max_bytes`` is 0 or more.
        Returns them and the next offset to pull from."""
        if not 1 <= max_count <= PULL_COUNT_MAX:
            raise InvalidArgument(f"max count must be in [1, {PULL_COUNT_MAX}], got {max_count}")
        if max_bytes < 0:
            raise InvalidArgument(f"max bytes must not be negative, got {max_bytes}")
        max_bytes = min(max_bytes or self.response_bytes_max, self.response_bytes_max)
        self.refresh()
        with self._lock:
            queue = self._queue(topic, queue_id)
            low, high = self._bounds(topic, queue_id, queue)
            if not low <= from_offset <= high:
                raise OutOfRange(f"queue offset {from_offset} of {topic}/{queue_id} is outside [{low}, {high}]")
            records: list[Record] = []
            used = 0
            next_offset = from_offset
            for queue_offset, unit in queue.units(from_offset, high):
                if len(records) >= max_count or (records and used + unit.size > max_bytes):
                    break
                records.append(self.read(unit.commitlog_offset))
                used += unit.size
                next_offset = queue_offset + 1
            return records, next_offset

    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int, boundary: Boundary) -> OffsetSearch:
        """LOWER: the first offset stored at or after t (max if none). UPPER: the last
        offset stored at or before t (min − 1 if none). From record store times."""
        if timestamp_ms < 0:
            raise InvalidArgument(f"timestamp {timestamp_ms} is negative")
        self.refresh()
        with self._lock:
            times, low, high = self._queue_times(topic, queue_id)
            strict = boundary is _UPPER
            first_after = times.first_stored_after(low, high, timestamp_ms, strict)
            # UPPER: the offset before the first one stored after t
            offset = first_after - 1 if strict else first_after
            return OffsetSearch(offset, low <= offset < high)

    def _queue_times(self, topic: str, queue_id: int) -> tuple[QueueTimes, int, int]:
        """The queue's time index brought to its visible range [low, high), and the range
        (kept while the view's visible range stays: the queue's bounds follow from it)."""
        key = (topic, queue_id)
        known = self._times.get(key)
        if known is not None and known[0] == (self.visible_offset, self.min_offset):
            return known[1], known[2], known[3]
        queue = self._queue(topic, queue_id)
        low, high = self._bounds(topic, queue_id, queue)
        times = QueueTimes() if known is None else known[1]
        times.follow(queue, self.log, low, high)
        self._times[key] = ((self.visible_offset, self.min_offset), times, low, high)
        return times, low, high

    def offsets_by_time(self, topic: str, queue_id: int, timestamps_ms: list[int]) -> list[int]:
        """For each ascending time, the first offset stored at or after it (max if none):
        one view of the queue for all of them, so the differences are consistent."""
        if not 1 <= len(timestamps_ms) <= OFFSETS_BY_TIME_MAX:
            raise InvalidArgument(f"give 1 to {OFFSETS_BY_TIME_MAX} timestamps, got {len(timestamps_ms)}")
        if timestamps_ms[0] < 0:
            raise InvalidArgument(f"timestamp {timestamps_ms[0]} is negative")
        if any(later < earlier for earlier, later in itertools.pairwise(timestamps_ms)):
            raise InvalidArgument("the timestamps must be in ascending order")
        self.refresh()
        with self._lock:
            times, low, high = self._queue_times(topic, queue_id)
            if high <= low:
                return [high] * len(timestamps_ms)
            # The search assumes store times ascend along the queue; so do these bounds. A
            # chart's edges mostly lie before the first or after the last message: no search.
            first_ms, last_ms = times.at(low), times.at(high - 1)
            before = sum(1 for t in timestamps_ms if t <= first_ms)
            after = sum(1 for t in timestamps_ms if t > last_ms)
            inside = timestamps_ms[before : len(timestamps_ms) - after]
            # The middle time is searched first; the times before it then search only
            # below its answer, the times after it only above.
            found = [high] * len(inside)
            pending = [(0, len(inside), low, high)]
            while pending:
                first, end, lo, hi = pending.pop()
                if first >= end:
                    continue
                middle = (first + end) // 2
                at = found[middle] = times.first_stored_after(lo, hi, inside[middle], False)
                pending.append((first, middle, lo, at))
                pending.append((middle + 1, end, at, hi))
            return [low] * before + found + [high] * after

    def newest_store_timestamp(self, topic: str, queue_id: int) -> int:
        """Store time of a queue's last visible message; 0 when it has none."""
        self.refresh()
        with self._lock:
            queue = self._queue(topic, queue_id)
            low, high = self._bounds(topic, queue_id, queue)
            unit = queue.read(high - 1) if high > low else None
            return 0 if unit is None else self.log.store_timestamp(unit.commitlog_offset)

    def messages_between(
        self, topic: str, queue_id: int, begin_ms: int, end_ms: int, *, chunk_records: int = 256
    ) -> Iterator[Record]:
        """A queue's messages stored in [begin, end], in queue order, read ``chunk_records``
        at a time (what a stream whose reader has stopped holds)."""
        check_time_range(begin_ms, end_ms)
        first = self.search_offset(topic, queue_id, begin_ms, Boundary.LOWER)
        last = self.search_offset(topic, queue_id, end_ms, Boundary.UPPER)
        offset = first.offset
        while offset <= last.offset:
            records, next_offset = self.pull(topic, queue_id, offset, min(chunk_records, last.offset - offset + 1), 0)
            yield from records
            if next_offset <= offset:
                return
            offset = next_offset

    # Index lookups

    def _candidates(self, topic: str, key: str, below_offset: int, begin_ms: int, first: int) -> Iterator[list[int]]:
        """Distinct commit log offsets of index entries with the key's hash, descending,
        below ``below_offset``, in lists as the index walk finds them (``first`` matches
        of a file's chain, then more); files wholly older than ``begin_ms`` are not read."""
        key_hash = topic_key_hash(topic, key)
        previous = None
        for index_file in reversed(self.index.files):
            _, end_ms, begin_offset, _, _, count = ix.HEADER.unpack_from(index_file.mapped.buf)
            if count <= 1 or begin_offset >= below_offset:
                continue
            if end_ms < begin_ms:
                return
            for chunk in index_file.matching_offset_chunks(key_hash, first):
                below = chunk if not chunk or chunk[0] < below_offset else [o for o in chunk if o < below_offset]
                if below:
                    # A record indexed under the key twice (KEYS "a a") is one candidate.
                    yield [offset for offset, before in zip(below, [previous, *below]) if offset != before]
                    previous = below[-1]

    def _catch_up_unindexed(self) -> None:
        """RocketMQ's index skips ROLLBACK records (docs/format.md §7.4); keep their keys here,
        from a header-only walk of the visible log, so every record is findable."""
        start = max(self._unindexed_scanned, self.min_offset)
        if start >= self.visible_offset:
            return
        # The walk touches every page of the new records, which are not this node's
        # working set: they leave the resident set as the walk goes.
        while start < self.visible_offset:
            stop = min(start + CATCH_UP_RELEASE_BYTES, self.visible_offset)
            offsets, flags, end = self.log.sys_flags(start, stop)
            rolled_back = offsets[(flags & sysflag.TRANSACTION_MASK) == sysflag.TRANSACTION_ROLLBACK]
            for offset in rolled_back.tolist():
                record = self.log.read(offset, check_crc=False)
                for key in {key for key in (record.uniq_key, *split_keys(record.keys)) if key is not None}:
                    held = self._unindexed.setdefault((record.topic, key), [])
                    if offset not in held:  # a walk a failed read cut short goes over it again
                        held.insert(0, offset)
            self.log.release(start, max(end, stop))
            if end <= start:
                break  # not a record where one should start: nothing further to find
            start = self._unindexed_scanned = end
        self._unindexed_scanned = max(self._unindexed_scanned, self.visible_offset)

    def _all_candidates(
        self, topic: str, key: str, below_offset: int, begin_ms: int, first: int = MATCHING_OFFSETS_FIRST_CHUNK
    ) -> Iterator[list[int]]:
        """:meth:`_candidates` and the unindexed records' offsets, merged."""
        self._catch_up_unindexed()
        extra = [offset for offset in self._unindexed.get((topic, key), ()) if offset < below_offset]
        if not extra:
            # The usual case (no ROLLBACK record has the key): the index alone.
            yield from self._candidates(topic, key, below_offset, begin_ms, first)
            return
        indexed = itertools.chain.from_iterable(self._candidates(topic, key, below_offset, begin_ms, first))
        previous = None
        for offset in heapq.merge(indexed, extra, reverse=True):
            if offset != previous:
                previous = offset
                yield [offset]

    def _matching_many(self, topic: str, offsets: list[int]) -> list[Record | None]:
        """:meth:`_matching` of each offset, the well-formed records read in one pass
        (one offset, the usual count for a UNIQ_KEY, takes the plain path, which costs
        less for one)."""
        if len(offsets) <= 1:
            return [self._matching(topic, offset) for offset in offsets]
        return [
            self._matching(topic, offset)
            if record is None or record is False
            else (record if record.topic == topic and self._visible(offset, record.size) else None)
            for offset, record in zip(offsets, self.log.read_many(offsets))
        ]

    def _kept(self, offsets: list[int], match: KeyMatch) -> list[Record | Literal[False] | None]:
        """The record at each offset where ``match`` keeps it, else False or None: the
        well-formed records read and matched in one compiled pass (which builds only the
        kept ones), the rest read one by one."""
        found = self.log.read_many(offsets, match=match)
        for item, record in enumerate(found):
            if record is None:  # not read there: read it here, which says what is there
                record = self._matching(match.topic, offsets[item])
                found[item] = record if record is not None and match(record) else None
        return found

    def _matching(self, topic: str, offset: int) -> Record | None:
        if not self._visible(offset, 1):
            return None
        try:
            record = self.read(offset)
        except (NotFound, OutOfRange, Corruption):
            return None
        return record if record.topic == topic else None

    def by_key(
        self,
        topic: str,
        key: str,
        *,
        begin_ms: int = TIME_MIN_MS,
        end_ms: int = TIME_MAX_MS,
        page_size: int = 32,
        cursor: str = "",
    ) -> KeyPage:
        problem = topic_problem(topic)
        if problem is not None:
            raise InvalidArgument(problem)
        if not key:
            raise InvalidArgument("the key is empty")
        if " " in key:
            raise InvalidArgument("a key cannot contain a space: KEYS are split on spaces")
        check_time_range(begin_ms, end_ms)
        if not 1 <= page_size <= PAGE_SIZE_MAX:
            raise InvalidArgument(f"page size must be in [1, {PAGE_SIZE_MAX}], got {page_size}")
        self.refresh()
        query = functools.partial(query_digest, "key", topic, key, begin_ms, end_ms)
        with self._lock:
            below = self._cursor_offset(cursor, query)
            records: list[Record] = []
            used_bytes = 0
            # Read as many candidates at once as could still fill the page and one more.
            wanted = page_size + 1
            candidates = self._all_candidates(topic, key, below, begin_ms, wanted)
            pending: list[int] = []
            while True:
                while len(pending) < wanted and (chunk := next(candidates, None)) is not None:
                    pending += chunk
                if not pending:
                    break
                offsets, pending = pending[:wanted], pending[wanted:]
                match = KeyMatch(topic, key, begin_ms, end_ms, self.min_offset, self.visible_offset)
                for record in self._kept(offsets, match):
                    if not record:
                        continue
                    assert isinstance(record, Record)
                    if len(records) == page_size or (records and used_bytes + record.size > self.response_bytes_max):
                        # One more match exists: the answer continues after the page's last one.
                        return KeyPage(records, self._cursor(records[-1].commitlog_offset, query), False)
                    records.append(record)
                    used_bytes += record.size
                if len(offsets) < wanted:
                    break  # the candidates ran out
                wanted = page_size + 1 - len(records)
            return KeyPage(records, "", True)

    def uniq_key_page(self, topic: str, uniq_key: str, cursor: str = "") -> KeyPage:
        """:meth:`by_uniq_key` a page at a time: records up to the response budget (at
        least one), and a cursor when more follow (many large records can share a
        UNIQ_KEY: a producer's retries, or a client that sets it)."""
        self._check_uniq_key(topic, uniq_key)
        self.refresh()
        query = functools.partial(query_digest, "uniq_key", topic, uniq_key)
        with self._lock:
            below = self._cursor_offset(cursor, query)
            records: list[Record] = []
            used_bytes = 0
            for chunk in self._all_candidates(topic, uniq_key, below, TIME_MIN_MS):
                for record in self._matching_many(topic, chunk):
                    if record is None or record.uniq_key != uniq_key:
                        continue
                    if records and used_bytes + record.size > self.response_bytes_max:
                        return KeyPage(records, self._cursor(records[-1].commitlog_offset, query), False)
                    records.append(record)
                    used_bytes += record.size
            if not records and not cursor:
                # Not released yet: its scheduled records, one page (a message has one or two).
                records = self._pending_with_uniq_key(topic, uniq_key)
            return KeyPage(records, "", True)

    def _cursor_key(self) -> bytes:
        """The store's cursor key once its writer has made one; until then this node's own
        (cursors that it alone accepts: a store Apache's broker wrote has no key)."""
        if not self._cursor_key_shared:
            stored = read_cursor_key(self.paths.config)
            if stored is not None:
                self._cursor_key_value, self._cursor_key_shared = stored, True
        return self._cursor_key_value

    def _cursor(self, offset: int, query: Callable[[], bytes]) -> str:
        """The cursor of the page after ``offset``. ``query``: the query's digest, made
        only for a cursor (most lookups read one page)."""
        return encode_cursor(self._cursor_key(), offset, query())

    def _cursor_offset(self, cursor: str, query: Callable[[], bytes]) -> int:
        """Where a page starts: below the cursor's offset, or (first page) below the
        visible end. A cursor from a node further ahead is kept within what this one shows."""
        if not cursor:
            return self.visible_offset
        return min(decode_cursor(self._cursor_key(), cursor, query()), self.visible_offset)

    def _check_uniq_key(self, topic: str, uniq_key: str) -> None:
        problem = topic_problem(topic)
        if problem is not None:
            raise InvalidArgument(problem)
        if not uniq_key:
            raise InvalidArgument("the unique key is empty")

    def by_uniq_key(self, topic: str, uniq_key: str) -> list[Record]:
        """Every record of the topic with that UNIQ_KEY (a producer retry can store two),
        newest first, at any age; for a delayed or timed message not released yet, its
        record in SCHEDULE_TOPIC_XXXX or rmq_sys_wheel_timer (docs/format.md §16), which
        the shown message marks pending with its due time; for a transaction's message
        not committed (pending, or rolled back), its half messages in
        RMQ_SYS_TRANS_HALF_TOPIC (§17), which the shown message marks a pending transaction's."""
        self._check_uniq_key(topic, uniq_key)
        self.refresh()
        with self._lock:
            return self._with_uniq_key(topic, uniq_key) or self._pending_with_uniq_key(topic, uniq_key)

    def _with_uniq_key(self, topic: str, uniq_key: str) -> list[Record]:
        offsets = [
            offset
            for chunk in self._all_candidates(topic, uniq_key, self.visible_offset, TIME_MIN_MS)
            for offset in chunk
        ]
        return [record for record in self._matching_many(topic, offsets) if record is not None and record.uniq_key == uniq_key]

    def _pending_with_uniq_key(self, topic: str, uniq_key: str) -> list[Record]:
        """The scheduled or half records of ``topic``'s message ``uniq_key`` (recall markers aside)."""
        return [
            record
            for scheduled in (TIMER_TOPIC, SCHEDULE_TOPIC, HALF_TOPIC)
            for record in self._with_uniq_key(scheduled, uniq_key)
            if record.properties.get(REAL_TOPIC) == topic and TIMER_DEL_UNIQKEY not in record.properties
        ]

    def by_msg_id(self, msg_id: str) -> Record:
        """The record an offsetMsgId names, if this store holds it."""
        decoded = decode_offset_msg_id(msg_id)
        self.refresh()
        with self._lock:
            try:
                record = self.read(decoded.commitlog_offset)
            except (OutOfRange, NotFound) as error:
                raise NotFound(f"no message with msgId {msg_id}: {error}") from None
            except Corruption:
                # An offset inside the log that is not where a record starts: no such id.
                raise NotFound(
                    f"no message with msgId {msg_id}: no record starts at commit log offset {decoded.commitlog_offset}"
                ) from None
            if offset_msg_id(record.store_host, record.commitlog_offset) != msg_id.upper():
                raise NotFound(
                    f"no message with msgId {msg_id}: the record at offset {record.commitlog_offset} was stored "
                    f"by {record.store_host.java_text()}, not {decoded.store_host.java_text()}"
                )
            return record

    # Statistics

    def stats(self) -> dict[str, object]:
        self.refresh()
        with self._lock:
            queues = []
            for topic, ids in self.topics().items():
                for queue_id in ids:
                    low, high = self.queue_bounds(topic, queue_id)
                    queues.append((topic, queue_id, low, high))
            return {
                "commitlog_min_offset": self.min_offset,
                "visible_offset": self.visible_offset,
                "published_offset": self.published_offset,
                "commitlog_files": len(self.log.files),
                "index_files": len(self.index.files),
                "queues": queues,
                "messages": sum(high - low for _, _, low, high in queues),
            }

    def close(self) -> None:
        with self._lock:
            self.log.close()
            self.queues.close()
            self.index.close()
            self._resident.close()
