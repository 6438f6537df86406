"""The writer's store: one process owns a store directory and appends to it.

Append path (DESIGN.md §4): validate → encode → append to the commit log → dispatch to
consume queue and index → publish progress → (SYNC) wait for the group fsync → ack.
Startup: take the lock, recover (cut a torn tail, drop queue units and index files past
the end, re-dispatch what the queues and index lack), then mark the run with ``abort``.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from opentelemetry import trace

from rmqstore.common.codec import properties as props
from rmqstore.common.codec.checkpoint import Checkpoint
from rmqstore.common.codec.hosts import SocketAddress
from rmqstore.common.codec.msgid import offset_msg_id
from rmqstore.common.codec.record import Record, encode_record
from rmqstore.common.errors import Corruption, InvalidArgument, NotFound, StoreFull
from rmqstore.common.files.checkpoint import read_checkpoint, write_checkpoint
from rmqstore.common.files.commitlog import CommitLog, ScanStop, StopReason
from rmqstore.common.files.consumequeue import ConsumeQueueSet
from rmqstore.common.files.index import IndexFileList
from rmqstore.common.files.progress import ProgressPublisher
from rmqstore.common.files.store import Dispatcher, StorePaths
from rmqstore.writer.background import PeriodicTask
from rmqstore.writer.config import FlushPolicy, WriterConfig
from rmqstore.writer.ids import UniqKeyGenerator
from rmqstore.writer.lock import StoreLock
from rmqstore.writer.topics import TopicTable
from rmqstore.writer.validate import Limits, MessageInput, validate_batch

DISK_CHECK_INTERVAL_S = 0.1
RETENTION_FILES_PER_RUN = 10
THOROUGH_FLUSH_INTERVAL_MS = 1000  # flushIntervalConsumeQueue
_TRACER = trace.get_tracer("rmqstore.writer")


@dataclass(frozen=True, slots=True)
class AppendResult:
    offset_msg_id: str
    uniq_key: str
    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    store_timestamp_ms: int
    size: int


@dataclass(frozen=True, slots=True)
class RetentionReport:
    commitlog_files: list[str]
    queue_files: int
    index_files: list[str]
    disk_used_ratio: float


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    unclean: bool
    stop: ScanStop
    redispatched_records: int
    redispatch_from: int
    truncated_queues: int
    dropped_index_files: int


class Writer:
    """Owns a store directory until :meth:`close`."""

    def __init__(self, config: WriterConfig):
        self.config = config
        self.paths = StorePaths(config.store)
        self.store_host = SocketAddress.parse(config.store_host)
        self.limits = Limits(config.max_body_bytes, config.max_keys, config.max_key_length, config.max_batch_messages)
        os.makedirs(config.store, exist_ok=True)
        self._lock_file = StoreLock(self.paths.lock)
        self._append_lock = threading.Lock()
        self._durable = threading.Condition()
        self._closed = False
        self._tasks: list[PeriodicTask] = []
        try:
            self._open()
        except BaseException:
            self._lock_file.release()
            raise

    def _open(self) -> None:
        sizes = self.config.sizes
        self.unclean_start = os.path.exists(self.paths.abort)
        self.log = CommitLog(self.paths.commitlog, sizes.commitlog_file_size_bytes, writable=True)
        self.queues = ConsumeQueueSet(self.paths.consumequeue, sizes.cq_file_units, writable=True)
        self.queues.open_all()
        self.index = IndexFileList(self.paths.index, sizes.index_slots, sizes.index_entries, writable=True)
        self.dispatcher = Dispatcher(self.queues, self.index)
        self.topics = TopicTable(self.paths.config, self.queues.discover())
        self.publisher = ProgressPublisher(self.config.store)
        self.uniq_keys = UniqKeyGenerator()
        self.recovery = self._recover()
        self._next_queue_offset = {key: queue.max_offset for key, queue in self.queues.queues.items()}
        self._round_robin: dict[str, int] = {}
        self._last_store_ts = self.publisher.last.last_store_timestamp_ms if self.publisher.last else 0
        self._disk_checked_at = 0.0
        self._disk_full_reason: str | None = None
        with open(self.paths.abort, "wb") as handle:
            os.fsync(handle.fileno())
        self.flushed_offset = self.durable_offset = self.log.write_offset or 0

    # Recovery

    def _recover(self) -> RecoveryReport:
        progress = self.publisher.last
        log = self.log
        scan_from = log.min_offset
        if progress is not None and log.min_offset <= progress.durable_offset <= log.max_file_offset:
            scan_from = progress.durable_offset
        stop = log.scan(scan_from)
        published = progress.dispatched_offset if progress is not None else None
        if stop.reason is StopReason.CORRUPT and published is not None and stop.end_offset >= published:
            # Nothing at or past the published offset was ever acknowledged or dispatched:
            # bad bytes there are a write the kill interrupted (a memcpy stores its bytes in
            # no fixed order), so they are a torn tail, not corruption.
            stop = ScanStop(stop.end_offset, StopReason.TORN, stop.error, stop.dropped_bytes)
        if stop.reason is StopReason.CORRUPT and not self.config.truncate_corrupt_tail:
            raise Corruption(
                f"the commit log is corrupt: {stop.describe()}. Nothing was changed. Copy the store "
                "aside, then start with --truncate-corrupt-tail to drop everything from that offset on",
                offset=stop.end_offset,
            )
        end = stop.end_offset
        log.truncate(end)
        truncated = 0
        for queue in self.queues.queues.values():
            if queue.max_commitlog_end > end:
                queue.truncate_to_commitlog(end)
                truncated += 1
        dropped = self._drop_index_files_past(end) + self._drop_unwritten_newest_index()
        self._repair_newest_index_header(end)
        redispatch_from = scan_from
        if not self.index.files:
            redispatch_from = log.min_offset
        else:
            redispatch_from = min(redispatch_from, max(self.index.files[-1].last_entry_phy_offset(), log.min_offset))
        count = 0
        if redispatch_from < end:
            redispatch_from = self._record_boundary_at_or_before(redispatch_from)
            for record in log.records(redispatch_from, stop=end, check_crc=False):
                self.dispatcher.dispatch(record)
                count += 1
        log.flush()
        self.dispatcher.flush()
        self.publisher.publish(
            dispatched_offset=end,
            durable_offset=end,
            commitlog_min_offset=log.min_offset,
            last_store_timestamp_ms=self.dispatcher.last_dispatched_timestamp_ms
            or (progress.last_store_timestamp_ms if progress else 0),
        )
        self.publisher.sync()
        return RecoveryReport(self.unclean_start, stop, count, redispatch_from, truncated, dropped)

    def _record_boundary_at_or_before(self, offset: int) -> int:
        """Index end offsets are record starts; progress offsets are record ends. Both are
        boundaries, but an index end that lies in a file before the scan start is only
        trusted if it decodes; otherwise start from its file."""
        try:
            self.log.read(offset, check_crc=False)
            return offset
        except (NotFound, Corruption):
            mapped = self.log.files.find(offset)
            return mapped.start_offset if mapped else self.log.min_offset

    def _drop_unwritten_newest_index(self) -> int:
        """An index file without entries and without the header a roll-over writes (all
        zero: made by an older writer or Apache's broker, killed while creating it) holds
        nothing and would make recovery re-index the whole log into it."""
        files = self.index.files
        if len(files) > 1 and files[-1].index_count <= 1 and files[-1].header.end_phy_offset == 0:
            doomed = files.pop()
            doomed.close()
            os.unlink(doomed.path)
            return 1
        return 0

    def _repair_newest_index_header(self, end: int) -> None:
        """A kill inside put_key can leave the header's end behind its newest entry."""
        if not self.index.files:
            return
        newest = self.index.files[-1]
        last = newest.last_entry_phy_offset()
        if last < end and last != newest.end_phy_offset:
            newest.repair_header_end(self.log.read(last, check_crc=False).store_timestamp_ms)

    def _drop_index_files_past(self, end: int) -> int:
        """Index files holding entries at or past the end of the log point at records that
        are gone: delete them (their earlier records are re-indexed from the commit log)."""
        doomed = [f for f in self.index.files if f.index_count > 1 and f.last_entry_phy_offset() >= end]
        for index_file in doomed:
            index_file.close()
            os.unlink(index_file.path)
        if doomed:
            self.index.files = [f for f in self.index.files if f not in doomed]
        return len(doomed)

    # Appending

    def _check_disk(self) -> None:
        now = time.monotonic()
        if now - self._disk_checked_at >= DISK_CHECK_INTERVAL_S:
            self._disk_checked_at = now
            usage = shutil.disk_usage(self.config.store)
            ratio = usage.used / usage.total if usage.total else 0.0
            self._disk_full_reason = (
                f"disk use {ratio:.1%} is above the full ratio {self.config.disk_full_ratio:.0%}; writes are refused"
                if ratio > self.config.disk_full_ratio
                else None
            )
        if self._disk_full_reason is not None:
            raise StoreFull(self._disk_full_reason)

    def _queue_count(self, topic: str, where: str, to_create: set[str]) -> int:
        count = self.topics.queue_count(topic)
        if count is None:
            if not self.config.auto_create_topics:
                raise NotFound(f"{where}topic {topic} does not exist and auto-create is off")
            to_create.add(topic)
            count = self.config.auto_create_queue_count
        return count

    def append(self, messages: Sequence[MessageInput], peer: SocketAddress | None = None) -> list[AppendResult]:
        """Append messages in order and dispatch them; returns once the flush policy says
        they are stored. Bad input raises before anything is written."""
        properties = validate_batch(messages, self.limits)
        with self._append_lock:
            if self._closed:
                raise InvalidArgument("the writer is closed")
            self._check_disk()
            queue_ids = []
            to_create: set[str] = set()
            for position, message in enumerate(messages, start=1):
                where = f"message {position}: " if len(messages) > 1 else ""
                count = self._queue_count(message.topic, where, to_create)
                if message.queue_id is not None and message.queue_id >= count:
                    raise InvalidArgument(
                        f"{where}queue id {message.queue_id} is out of range: topic {message.topic} has {count} queues"
                    )
                queue_ids.append(message.queue_id)
            # Topics are created only once the whole batch is known to be good.
            for topic in sorted(to_create):
                self.topics.create(topic, self.config.auto_create_queue_count)
            with _TRACER.start_as_current_span("rmqstore.append") as span:
                span.set_attribute("rmqstore.messages", len(messages))
                records = [
                    self._append_one(message, stored, queue_id, peer)
                    for message, stored, queue_id in zip(messages, properties, queue_ids)
                ]
            with _TRACER.start_as_current_span("rmqstore.dispatch"):
                for record in records:
                    self.dispatcher.dispatch(record)
            end = self.log.write_offset
            assert end is not None
            self.publisher.publish(
                dispatched_offset=end,
                durable_offset=self.durable_offset,
                commitlog_min_offset=self.log.min_offset,
                last_store_timestamp_ms=self._last_store_ts,
            )
            results = [
                AppendResult(
                    offset_msg_id(self.store_host, r.commitlog_offset),
                    r.properties[props.UNIQ_KEY],
                    r.topic,
                    r.queue_id,
                    r.queue_offset,
                    r.commitlog_offset,
                    r.store_timestamp_ms,
                    r.size,
                )
                for r in records
            ]
        if self.config.flush is FlushPolicy.SYNC:
            self.wait_flushed(end)
        return results

    def _append_one(
        self, message: MessageInput, stored: dict[str, str], queue_id: int | None, peer: SocketAddress | None
    ) -> Record:
        """Encode and append one record (not yet dispatched)."""
        topic = message.topic
        if queue_id is None:
            count = self.topics.queue_count(topic) or 1
            queue_id = self._round_robin.get(topic, 0) % count
            self._round_robin[topic] = queue_id + 1
        now = int(time.time() * 1000)
        # Store times never go backwards, so time search can bisect a queue.
        store_ts = max(now, self._last_store_ts)
        born_host = message.born_host or peer or self.store_host
        uniq_key = message.uniq_key or self.uniq_keys.next(born_host.ip, now)
        properties = props.broker_order({**stored, props.UNIQ_KEY: uniq_key})
        key = (topic, queue_id)
        queue_offset = self._next_queue_offset.get(key, 0)
        record = Record(
            topic=topic,
            body=message.body,
            properties=properties,
            queue_id=queue_id,
            flag=message.flag,
            queue_offset=queue_offset,
            born_timestamp_ms=message.born_timestamp_ms or now,
            born_host=born_host,
            store_timestamp_ms=store_ts,
            store_host=self.store_host,
        )
        encoded = bytearray(encode_record(record))
        [offset] = self.log.append([encoded], [queue_offset])
        record.commitlog_offset = offset
        record.size = len(encoded)
        self._next_queue_offset[key] = queue_offset + 1
        self._last_store_ts = store_ts
        return record

    # Flushing

    def flush(self) -> int:
        """fsync the commit log up to what is written, then the queues and index, and
        publish the durable offset. Returns the flushed commit log offset."""
        with self._append_lock:
            target = self.log.write_offset or 0
            start = self.flushed_offset
        with _TRACER.start_as_current_span("rmqstore.flush") as span:
            span.set_attribute("rmqstore.flush.bytes", max(target - start, 0))
            self.log.flush_range(start, target)
        with self._durable:
            self.flushed_offset = max(self.flushed_offset, target)
            self._durable.notify_all()
        return target

    def flush_thoroughly(self) -> int:
        """Flush the commit log, the consume queues and the index, then record that
        everything below the flushed offset needs no re-dispatch after a crash."""
        target = self.flush()
        with self._append_lock:
            self.dispatcher.flush()
            self.durable_offset = target
            self.publisher.publish(
                dispatched_offset=self.log.write_offset or 0,
                durable_offset=target,
                commitlog_min_offset=self.log.min_offset,
                last_store_timestamp_ms=self._last_store_ts,
            )
            self.publisher.sync()
            self._write_checkpoint()
        return target

    def wait_flushed(self, offset: int) -> None:
        """Block until the commit log is fsynced up to ``offset`` (group commit: the first
        waiter flushes for everyone who arrived meanwhile)."""
        while True:
            with self._durable:
                if self.flushed_offset >= offset:
                    return
            self.flush()

    def _write_checkpoint(self) -> None:
        previous = read_checkpoint(self.paths.checkpoint)
        write_checkpoint(
            self.paths.checkpoint,
            Checkpoint(
                physic_msg_timestamp_ms=self._last_store_ts,
                logics_msg_timestamp_ms=self.dispatcher.last_dispatched_timestamp_ms
                or (previous.logics_msg_timestamp_ms if previous else 0),
                index_msg_timestamp_ms=self.index.last_full_end_timestamp_ms,
            ),
        )

    # Retention

    def run_retention(self, now_s: float | None = None) -> RetentionReport:
        """Delete the oldest commit log files when they are past the reserved time at a
        delete hour, or, under disk pressure, regardless of age (RocketMQ's rules, at most
        10 files a run, never the newest), then the queue and index files that point only
        into them."""
        now = time.time() if now_s is None else now_s
        usage = shutil.disk_usage(self.config.store)
        ratio = usage.used / usage.total if usage.total else 0.0
        pressure = ratio > self.config.disk_clean_ratio
        due = time.localtime(now).tm_hour in self.config.retention_delete_hours
        if not (due or pressure):
            return RetentionReport([], 0, [], ratio)
        reserved_s = self.config.retention_hours * 3600
        with self._append_lock:
            doomed = []
            for mapped in self.log.files.files[:-1][:RETENTION_FILES_PER_RUN]:
                if pressure or os.stat(mapped.path).st_mtime + reserved_s <= now:
                    doomed.append(mapped)
                else:
                    break
            if not doomed:
                return RetentionReport([], 0, [], ratio)
            # Publish the new minimum first: a query node never follows an offset that
            # is about to disappear.
            new_min = doomed[-1].end_offset
            self.publisher.publish(
                dispatched_offset=self.log.write_offset or 0,
                durable_offset=self.durable_offset,
                commitlog_min_offset=new_min,
                last_store_timestamp_ms=self._last_store_ts,
            )
            deleted = self.log.files.delete_first(len(doomed))
            queue_files = sum(queue.delete_expired(new_min) for queue in self.queues.queues.values())
            index_files = self.index.delete_expired(new_min)
        return RetentionReport(deleted, queue_files, index_files, ratio)

    # Status

    def status(self) -> dict[str, object]:
        usage = shutil.disk_usage(self.config.store)
        with self._append_lock:
            queues = [
                (topic, queue_id, queue.min_offset, queue.max_offset)
                for (topic, queue_id), queue in sorted(self.queues.queues.items())
            ]
            return {
                "store": os.path.abspath(self.config.store),
                "commitlog_min_offset": self.log.min_offset,
                "commitlog_max_offset": self.log.write_offset or 0,
                "dispatched_offset": self.publisher.last.dispatched_offset if self.publisher.last else 0,
                "flushed_offset": self.flushed_offset,
                "queues": queues,
                "disk_total_bytes": usage.total,
                "disk_used_bytes": usage.used,
                "disk_used_ratio": usage.used / usage.total if usage.total else 0.0,
                "flush_policy": self.config.flush.value,
            }

    # Lifecycle

    def start_background(self) -> None:
        """Start the periodic flushes and retention (a serving writer; tests that drive
        the store by hand leave them off)."""
        config = self.config
        if config.flush is FlushPolicy.ASYNC:
            self._tasks.append(PeriodicTask("flush-commitlog", config.flush_interval_ms, self.flush).start())
        self._tasks.append(PeriodicTask("flush-thorough", THOROUGH_FLUSH_INTERVAL_MS, self.flush_thoroughly).start())
        self._tasks.append(PeriodicTask("retention", config.retention_interval_ms, self.run_retention).start())

    def close(self) -> None:
        """Flush everything, write the checkpoint, remove ``abort`` and release the lock."""
        if self._closed:
            return
        for task in self._tasks:
            task.stop()
        self._tasks.clear()
        self.flush_thoroughly()
        with self._append_lock:
            self._closed = True
            self.log.close()
            self.queues.close()
            self.index.close()
            self.publisher.close()
            os.unlink(self.paths.abort)
        self._lock_file.release()
