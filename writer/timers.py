"""Releasing delayed and timed messages to their real topics (docs/design.md §4, "Scheduled
messages"): :class:`ScheduledDelivery`, one thread ticking two deliverers and one writing
their progress behind it.

* :class:`DelayLevels` is Apache 4.9's ScheduleMessageService: each SCHEDULE_TOPIC_XXXX
  queue (level − 1) is read in order from its offset in ``config/delayOffset.json``;
  a unit whose tagsCode (deliver time) has come is released (writer.schedule.level_copy)
  and the offset moves past it.
* :class:`TimerWheel` holds the pending timed messages of rmq_sys_wheel_timer queue 0 —
  four integers each (due time, commit log offset, size, queue offset) in per-second
  buckets, never a body — and releases each once due (writer.schedule.timer_copy),
  skipping those a recall marker due with them cancels.

Durability: a release is an ordinary append (fsynced under SYNC). Progress is written
only after the released copies are flushed, at most every ``checkpoint_interval_ms``
and at the stop: for the levels, Apache's delayOffset.json; for the wheel,
``config/rmqstore-timers.json`` (ours: magic, version, CRC), which says "every timer
below queue offset ``registeredEnd`` due at or before ``releasedUpToMs`` is released",
and where the queue's pending timers start (``pendingFrom``). After a crash both resume
from their last progress: a message released after it is released again (at most the
messages that came due during one checkpoint interval, and the flush then under way,
before the crash), and none is lost, as the units and records they are read from are in
the store."""

from __future__ import annotations

import heapq
import json
import logging
import os
import threading
import time
import zlib
from array import array
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rmqstore.common.codec import properties as props
from rmqstore.common.codec.consumequeue import FILLER_SIZE, SCHEDULE_TOPIC, TIMER_TOPIC
from rmqstore.common.codec.record import Record
from rmqstore.common.errors import Corruption, InvalidArgument, NotFound, StoreError
from rmqstore.common.files.config_file import read_or_set_aside, replace_durably
from rmqstore.common.files.consumequeue import ConsumeQueue
from rmqstore.common.files.delay_offsets import read_delay_offsets, write_delay_offsets
from rmqstore.writer.schedule import TIMER_QUEUE_ID, delete_key, level_copy, timer_copy
from rmqstore.writer.store import AppendResults, Writer
from rmqstore.writer.validate import MessageBatch, MessageInput

log = logging.getLogger("rmqstore.writer")

TIMERS_FILE_NAME = "rmqstore-timers.json"
TIMERS_MAGIC = "rmqstore-timers"
TIMERS_VERSION = 1
DEFAULT_TICK_MS = 10
# The shortest wait between two ticks when the next timer is due within the tick: timers due
# every fraction of a millisecond (1,667 a second) then go out a few ms' worth an append,
# not one or two (each append, its dispatch and the consumers' wake-up cost the same for
# one message as for ten; benchmarks/TIMERS.md). A timer is released at most this much
# after it is due, plus the time the tick takes.
MIN_TICK_GAP_MS = 5
# How often a loop looks on disk for a queue the writer has not opened (QueueLookup).
DISK_LOOK_MS = 1_000
DEFAULT_CHECKPOINT_INTERVAL_MS = 1000
# Messages released in one append, at most (a backlog after a long stop is released in
# batches of this many).
RELEASE_BATCH_MAX = 1024
BUCKET_MS = 1000
# Units taken into the wheel a slice at a time (the numpy temporaries of one slice are
# what a restart's rebuild holds beside the wheel).
REGISTER_CHUNK_UNITS = 65_536
_FIELDS = 4  # due ms, commit log offset, size, queue offset


def now_ms() -> int:
    return int(time.time() * 1000)


Released = Callable[[AppendResults], None]


def _release(writer: Writer, messages: list[MessageInput]) -> AppendResults | None:
    """Append released copies; a copy its topic refuses (a topic deleted since, say) is
    logged and dropped, as Apache's delivery drops a message it cannot put."""
    if not messages:
        return None
    try:
        return writer.append_released(MessageBatch.of(messages))
    except (InvalidArgument, NotFound) as error:
        if len(messages) == 1:
            log.error("a scheduled message could not be released to %s and is dropped: %s", messages[0].topic, error)
            return None
    results = [_release(writer, [message]) for message in messages]
    kept = [result for result in results if result is not None]
    return kept[-1] if kept else None


class QueueLookup:
    """The writer's consume queue of (topic, queue id) for a loop that asks every tick:
    a queue the writer has open is found at once; one it has not is looked for on disk at
    most every DISK_LOOK_MS (an absent queue is a directory lookup a tick otherwise, the
    idle writer's largest cost). The writer opens a queue when it appends to it, so a
    queue made by this process is found the next tick; only files it has not opened wait
    for the next look on disk."""

    def __init__(self, writer: Writer):
        self.writer = writer
        self._disk_at: dict[tuple[str, int], float] = {}

    def find(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        key = (topic, queue_id)
        queue = self.writer.queues.queues.get(key)
        if queue is not None:
            return queue
        now = time.monotonic()
        if now < self._disk_at.get(key, 0.0):
            return None
        self._disk_at[key] = now + DISK_LOOK_MS / 1000
        return self.writer.queues.find(topic, queue_id)


class DelayLevels:
    """ScheduleMessageService over the writer's SCHEDULE_TOPIC_XXXX queues."""

    def __init__(self, writer: Writer):
        self.writer = writer
        self.config_dir = writer.paths.config
        self.offsets = read_delay_offsets(self.config_dir)
        self.levels = sorted(writer.scheduling.delay_levels_ms)
        self._written = dict(self.offsets)
        self._queues = QueueLookup(writer)

    def pending(self) -> int:
        """Delayed messages not released yet."""
        count = 0
        for level in self.levels:
            queue = self.writer.queues.find(SCHEDULE_TOPIC, level - 1)
            if queue is not None:
                count += max(queue.max_offset - max(self.offsets.get(level, 0), queue.min_offset), 0)
        return count

    def release_due(self, now: int, released: Released | None) -> int | None:
        """Release every level's messages due by ``now``; the soonest deliver time still
        ahead, or None."""
        soonest: int | None = None
        for level in self.levels:
            queue = self._queues.find(SCHEDULE_TOPIC, level - 1)
            if queue is None:
                continue
            start = max(self.offsets.get(level, 0), queue.min_offset)
            copies: list[MessageInput] = []
            next_offset = start
            for queue_offset, unit in queue.units(start, min(queue.max_offset, start + RELEASE_BATCH_MAX)):
                if unit.tags_code > now:
                    soonest = unit.tags_code if soonest is None else min(soonest, unit.tags_code)
                    break
                copy = self._copy(unit.commitlog_offset)
                if copy is not None:
                    copies.append(copy)
                next_offset = queue_offset + 1
            if next_offset == start:
                continue
            results = _release(self.writer, copies)
            self.offsets[level] = next_offset
            if results is not None and released is not None:
                released(results)
            if next_offset < queue.max_offset:
                soonest = now  # more of this level is due: come back at once
        return soonest

    def _copy(self, commitlog_offset: int) -> MessageInput | None:
        try:
            record = self.writer.log.read(commitlog_offset, check_crc=False)
        except (NotFound, Corruption) as error:
            log.error("delayed message at commit log offset %d is unreadable and skipped: %s", commitlog_offset, error)
            return None
        copy = level_copy(record)
        if copy is None:
            log.error("delayed message at commit log offset %d has no REAL_TOPIC/REAL_QID and is skipped", commitlog_offset)
        return copy

    @property
    def written(self) -> dict[int, int]:
        """The offsets last written (or read at the start)."""
        return self._written

    def checkpoint(self, offsets: dict[int, int]) -> None:
        """Write delayOffset.json with ``offsets`` (a copy of :attr:`offsets` taken before
        the caller flushed the releases) when it changed."""
        if offsets != self._written:
            write_delay_offsets(self.config_dir, offsets)
            self._written = offsets


@dataclass(frozen=True)
class TimerProgress:
    """``config/rmqstore-timers.json``: every timer of rmq_sys_wheel_timer queue 0 below
    ``registered_end`` whose due time is at most ``released_up_to_ms`` is released; no
    timer below ``pending_from`` is pending."""

    released_up_to_ms: int = 0
    registered_end: int = 0
    pending_from: int = 0

    def render(self) -> str:
        body = {
            "magic": TIMERS_MAGIC,
            "version": TIMERS_VERSION,
            "releasedUpToMs": self.released_up_to_ms,
            "registeredEnd": self.registered_end,
            "pendingFrom": self.pending_from,
        }
        text = json.dumps(body, sort_keys=True)
        return json.dumps({**body, "crc32": zlib.crc32(text.encode())}, sort_keys=True)

    @classmethod
    def parse(cls, text: str, path: str) -> TimerProgress:
        try:
            document = json.loads(text)
            crc = document.pop("crc32")
            fields = (document["releasedUpToMs"], document["registeredEnd"], document["pendingFrom"])
        except (ValueError, KeyError, AttributeError, TypeError):
            raise Corruption(f"{path} is not an rmqstore timers file", path=path) from None
        if document.get("magic") != TIMERS_MAGIC or document.get("version") != TIMERS_VERSION:
            raise Corruption(f"{path}: unknown magic or version", path=path)
        if crc != zlib.crc32(json.dumps(document, sort_keys=True).encode()):
            raise Corruption(f"{path}: checksum mismatch", path=path)
        if not all(isinstance(value, int) and value >= 0 for value in fields):
            raise Corruption(f"{path}: offsets and times must be whole numbers", path=path)
        return cls(*fields)


def read_timer_progress(config_dir: str) -> TimerProgress:
    """The wheel's progress; a missing file is a wheel that never released anything. A
    file that fails its check is set aside and treated as missing: every timer is then
    pending again (released ones are released once more), none is lost."""
    path = os.path.join(config_dir, TIMERS_FILE_NAME)
    return read_or_set_aside(path, TimerProgress.parse, TimerProgress(), "every timed message in the store is taken as pending")


def write_timer_progress(config_dir: str, progress: TimerProgress) -> None:
    replace_durably(config_dir, os.path.join(config_dir, TIMERS_FILE_NAME), progress.render())


class TimerWheel:
    """The pending timed messages of rmq_sys_wheel_timer queue 0, by due second."""

    def __init__(self, writer: Writer):
        self.writer = writer
        self.config_dir = writer.paths.config
        progress = read_timer_progress(self.config_dir)
        self.released_up_to_ms = progress.released_up_to_ms
        self._buckets: dict[int, array[int]] = {}
        self._bucket_heap: list[int] = []
        self.pending_count = 0
        self._written = progress
        self._queues = QueueLookup(writer)
        queue = writer.queues.find(TIMER_TOPIC, TIMER_QUEUE_ID)
        start = max(progress.pending_from, queue.min_offset) if queue is not None else 0
        self.registered_end = start
        # Recovery: every unit from the pending start is pending, but those the progress
        # says are released.
        self._register(progress.registered_end, progress.released_up_to_ms)

    def _queue_end(self) -> int:
        queue = self._queues.find(TIMER_TOPIC, TIMER_QUEUE_ID)
        return queue.max_offset if queue is not None else 0

    def _register(self, released_below: int = 0, released_up_to_ms: int = -1) -> None:
        """Take the units appended since the last look into the buckets (units below
        ``released_below`` due at or before ``released_up_to_ms`` are released already),
        column-wise: a restart takes a million pending timers in without a Python step
        each."""
        queue = self._queues.find(TIMER_TOPIC, TIMER_QUEUE_ID)
        if queue is None:
            return
        end = queue.max_offset
        if end <= self.registered_end:
            return
        for file_first, file_units in queue.unit_columns(self.registered_end, end):
            for at in range(0, len(file_units), REGISTER_CHUNK_UNITS):
                self._add_units(file_first + at, file_units[at : at + REGISTER_CHUNK_UNITS], released_below, released_up_to_ms)
        self.registered_end = end

    def _add_units(self, first: int, units: np.ndarray, released_below: int, released_up_to_ms: int) -> None:
        offsets = np.arange(first, first + len(units), dtype=np.int64)
        due = units["tags_code"].astype(np.int64)
        filler = (units["commitlog_offset"] == 0) & (units["size"] == FILLER_SIZE) & (due == 0)
        keep = ~filler & ~((offsets < released_below) & (due <= released_up_to_ms))
        rows = np.column_stack(
            (due[keep], units["commitlog_offset"][keep].astype(np.int64), units["size"][keep].astype(np.int64), offsets[keep])
        )
        self._add(rows)

    def _add(self, rows: np.ndarray) -> None:
        """Rows of (due, commit log offset, size, queue offset), in queue order, into their
        buckets (each bucket stays in queue order)."""
        if not len(rows):
            return
        seconds = rows[:, 0] // BUCKET_MS
        order = np.argsort(seconds, kind="stable")
        rows, seconds = rows[order], seconds[order]
        starts = np.flatnonzero(np.diff(seconds, prepend=seconds[0] - 1))
        for begin, stop in zip(starts.tolist(), [*starts[1:].tolist(), len(rows)]):
            second = int(seconds[begin])
            bucket = self._buckets.get(second)
            if bucket is None:
                bucket = self._buckets[second] = array("q")
                heapq.heappush(self._bucket_heap, second)
            bucket.frombytes(np.ascontiguousarray(rows[begin:stop], dtype=np.int64).tobytes())
        self.pending_count += len(rows)

    def pending_from(self) -> int:
        """The lowest queue offset of a pending timer (each bucket is in queue order)."""
        firsts = [bucket[3] for bucket in self._buckets.values() if bucket]
        return min(firsts, default=self.registered_end)

    def release_due(self, now: int, released: Released | None) -> int | None:
        """Release the timers due by ``now``; the soonest due time still ahead, or None."""
        self._register()
        due_entries: list[tuple[int, int, int]] = []
        heap = self._bucket_heap
        while heap and heap[0] <= now // BUCKET_MS and len(due_entries) < RELEASE_BATCH_MAX:
            second = heap[0]
            # The bucket's first RELEASE_BATCH_MAX − taken entries due by now, in queue
            # order, the rest kept in theirs, column-wise: a tick comes every 10 ms, and
            # the current second's bucket holds every timer due in that second (1,667 at
            # 100,000 due a minute). Scanned a Python step an entry each tick, it took a
            # quarter of the writer's CPU at that rate (benchmarks/TIMERS.md).
            rows = np.frombuffer(self._buckets[second], dtype=np.int64).reshape(-1, _FIELDS)
            taken = np.flatnonzero(rows[:, 0] <= now)[: RELEASE_BATCH_MAX - len(due_entries)]
            chosen = rows[taken]
            due_entries.extend(zip(chosen[:, 0].tolist(), chosen[:, 1].tolist(), chosen[:, 3].tolist()))
            whole = len(taken) == len(rows)
            kept = None
            if len(taken) and not whole:
                keep = np.ones(len(rows), dtype=bool)
                keep[taken] = False
                kept = array("q", rows[keep].tobytes())
            del rows  # the array's view, let go before the array is replaced or grows
            if whole:
                del self._buckets[second]
                heapq.heappop(heap)
                continue
            if kept is not None:
                self._buckets[second] = kept
            # Entries are left in this bucket: not yet due (the current second's), or past
            # the batch's limit; either way the next tick goes on from here.
            break
        if due_entries:
            self._release(sorted(due_entries), now, released)
            return now if len(due_entries) >= RELEASE_BATCH_MAX else self._soonest()
        return self._soonest()

    def _soonest(self) -> int | None:
        if not self._bucket_heap:
            return None
        bucket = self._buckets[self._bucket_heap[0]]
        return int(np.frombuffer(bucket, dtype=np.int64)[0::_FIELDS].min())

    def _release(self, entries: list[tuple[int, int, int]], now: int, released: Released | None) -> None:
        records: list[Record] = []
        for _due, commitlog_offset, _queue_offset in entries:
            try:
                records.append(self.writer.log.read(commitlog_offset, check_crc=False))
            except (NotFound, Corruption) as error:
                log.error("timed message at commit log offset %d is unreadable and skipped: %s", commitlog_offset, error)
        self.pending_count -= len(entries)
        # A recall marker cancels its message when both come due: markers first.
        cancelled = {record.properties[props.TIMER_DEL_UNIQKEY] for record in records if props.TIMER_DEL_UNIQKEY in record.properties}
        copies = []
        for record in records:
            if props.TIMER_DEL_UNIQKEY in record.properties:
                continue
            real_topic = record.properties.get(props.REAL_TOPIC, "")
            if delete_key(real_topic, record.properties.get(props.UNIQ_KEY, "")) in cancelled:
                continue
            copy = timer_copy(record, now)
            if copy is None:
                log.error("timed message at commit log offset %d has no REAL_TOPIC/REAL_QID and is skipped", record.commitlog_offset)
                continue
            copies.append(copy)
        results = _release(self.writer, copies)
        self.released_up_to_ms = max(self.released_up_to_ms, entries[-1][0])
        if results is not None and released is not None:
            released(results)

    def progress(self, now: int) -> TimerProgress:
        """What may be written once the releases so far are flushed: every registered
        timer due at or before the last one released and before any still pending is
        released (``now`` bounds it: nothing due later was looked at)."""
        soonest = self._soonest()
        up_to = min(self.released_up_to_ms, now)
        if soonest is not None:
            up_to = min(up_to, soonest - 1)
        return TimerProgress(max(up_to, 0), self.registered_end, self.pending_from())

    @property
    def written(self) -> TimerProgress:
        """The progress last written (or read at the start)."""
        return self._written

    def checkpoint(self, progress: TimerProgress) -> None:
        if progress != self._written:
            write_timer_progress(self.config_dir, progress)
            self._written = progress

    def memory_entries_bytes(self) -> int:
        """Bytes the pending entries take (the buckets' arrays)."""
        return sum(bucket.buffer_info()[1] * bucket.itemsize for bucket in self._buckets.values())


class ScheduledDelivery:
    """The thread that releases delayed and timed messages when due, and the thread that
    writes their progress behind it (a flush waiting on a busy disk holds no release
    back). ``released`` is told of every release (the node wakes the consumers waiting on
    the real topics)."""

    def __init__(
        self,
        writer: Writer,
        *,
        tick_ms: int = DEFAULT_TICK_MS,
        checkpoint_interval_ms: int = DEFAULT_CHECKPOINT_INTERVAL_MS,
        released: Released | None = None,
    ):
        self.writer = writer
        self.levels = DelayLevels(writer)
        self.wheel = TimerWheel(writer)
        self.tick_s = tick_ms / 1000
        self.checkpoint_interval_ms = checkpoint_interval_ms
        self.released = released
        self.failures = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scheduled-delivery", daemon=True)
        self._writer_thread = threading.Thread(target=self._write_behind, name="scheduled-progress", daemon=True)
        self._progress_due = threading.Condition()
        self._progress: tuple[TimerProgress, dict[int, int]] | None = None
        self._checkpointed_at = 0
        self._following = False
        writer.scheduled_listeners.append(self.wake)

    def start(self) -> ScheduledDelivery:
        self._writer_thread.start()
        self._thread.start()
        return self

    def wake(self) -> None:
        """Look now (a delayed or timed message was just stored, or the writer takes
        writes again)."""
        self._wake.set()

    def run_once(self, now: int | None = None, checkpoint: Callable[[int], None] | None = None) -> int | None:
        """One tick: release what is due, and every ``checkpoint_interval_ms`` write the
        progress (by ``checkpoint``, :meth:`checkpoint` by default); the soonest due time
        still ahead. A replica that takes no writes (a writer group's follower) releases
        nothing; once it does, it starts from the progress files its primary replicated
        to it."""
        now = now_ms() if now is None else now
        if self.writer.refusal is not None:
            self._following = True
            return None
        if self._following:
            self._following = False
            self.levels = DelayLevels(self.writer)
            self.wheel = TimerWheel(self.writer)
        soonest_levels = self.levels.release_due(now, self.released)
        soonest_timers = self.wheel.release_due(now, self.released)
        if now - self._checkpointed_at >= self.checkpoint_interval_ms:
            (checkpoint or self.checkpoint)(now)
        candidates = [t for t in (soonest_levels, soonest_timers) if t is not None]
        return min(candidates, default=None)

    def checkpoint(self, now: int | None = None) -> None:
        """Flush what was released, then write both progress files (not on a follower,
        whose files are its primary's)."""
        progress = self._progress_now(now)
        if progress is not None:
            self._write_progress(*progress)

    def _progress_now(self, now: int | None) -> tuple[TimerProgress, dict[int, int]] | None:
        """The progress of the releases made so far, to be written once they are flushed;
        None when nothing was released since the last (or on a follower)."""
        now = now_ms() if now is None else now
        if self._following or self.writer.refusal is not None:
            return None
        progress = self.wheel.progress(now)
        offsets = dict(self.levels.offsets)
        self._checkpointed_at = now
        if progress == self.wheel.written and offsets == self.levels.written:
            return None  # nothing released since: no flush, no file written
        return progress, offsets

    def _write_progress(self, progress: TimerProgress, offsets: dict[int, int]) -> None:
        self.writer.flush()
        self.levels.checkpoint(offsets)
        self.wheel.checkpoint(progress)

    def _checkpoint_behind(self, now: int) -> None:
        """Hand the progress to the progress thread (the newest replaces one not yet
        written: each covers every release before it)."""
        progress = self._progress_now(now)
        if progress is not None:
            with self._progress_due:
                self._progress = progress
                self._progress_due.notify()

    def _write_behind(self) -> None:
        while True:
            with self._progress_due:
                while self._progress is None and not self._stop.is_set():
                    self._progress_due.wait()
                progress, self._progress = self._progress, None
            if progress is None:
                return  # stopping, nothing left to write
            try:
                self._write_progress(*progress)
            except (StoreError, OSError):
                self.failures += 1
                log.exception("writing the scheduled messages' progress failed; the next checkpoint retries")

    def _run(self) -> None:
        while not self._stop.is_set():
            tick_at = now_ms()
            # Nothing scheduled: sleep until the writer stores a delayed or timed message
            # (Writer.scheduled_listeners) or takes writes again, or the next checkpoint
            # is due (the progress of the last releases), instead of a tick's wake-up.
            wait_s = self.checkpoint_interval_ms / 1000
            try:
                soonest = self.run_once(tick_at, checkpoint=self._checkpoint_behind)
            except (StoreError, OSError):
                self.failures += 1
                log.exception("releasing scheduled messages failed; retrying")
                soonest, wait_s = None, self.tick_s
            if soonest is not None:
                # A backlog (more was due at the tick than one append takes) goes on at
                # once; otherwise wait for the soonest, at least the gap, at most a tick.
                backlog = soonest <= tick_at
                wait_s = 0.0 if backlog else min(max(soonest - now_ms(), MIN_TICK_GAP_MS) / 1000, self.tick_s)
            if wait_s > 0:
                self._wake.wait(wait_s)
                self._wake.clear()

    def stop(self) -> None:
        """Stop the thread and write the progress (before the writer closes)."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._progress_due:
            self._progress_due.notify()
        if self._writer_thread.is_alive():
            self._writer_thread.join()
        try:
            self.checkpoint()
        except (StoreError, OSError) as error:
            log.error("the scheduled messages' progress could not be written at the stop: %s", error)
