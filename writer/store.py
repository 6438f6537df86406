"""The writer's store: one process owns a store directory and appends to it.

Append path (docs/design.md §4): validate → encode → append to the commit log → dispatch to
consume queue and index → publish progress → (SYNC) wait for the group fsync → ack.
Startup: take the lock, recover (cut a torn tail, drop queue units and index files past
the end, re-dispatch what the queues and index lack), then mark the run with ``abort``.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypedDict, overload

from opentelemetry import trace

from rmqstore.common.codec import columnar
from rmqstore.common.codec import properties as props
from rmqstore.common.codec.checkpoint import Checkpoint
from rmqstore.common.codec.columnar import RecordColumns
from rmqstore.common.codec.dispatch import DEFAULT_DELAY_LEVELS_MS, SCHEDULED_TOPICS, DispatchBatch
from rmqstore.common.codec.hosts import SocketAddress
from rmqstore.common.codec.msgid import offset_msg_id, offset_msg_ids
from rmqstore.common.codec.record import (
    Record,
    encode_records,
    set_physical_offsets,
    set_transaction,
)
from rmqstore.common.errors import (
    Corruption,
    InvalidArgument,
    NotFound,
    OutOfResources,
    StoreError,
    StoreFull,
    Unavailable,
    invariant,
)
from rmqstore.common.files.checkpoint import read_checkpoint, write_checkpoint
from rmqstore.common.files.commitlog import CommitLog, RecordScan, ScanStop, StopReason
from rmqstore.common.files.consumequeue import ConsumeQueueSet
from rmqstore.common.files.cursorkey import ensure_cursor_key
from rmqstore.common.files.geometry import record_geometry
from rmqstore.common.files.index import IndexFile, IndexFileList
from rmqstore.common.files.mapped import fsync_directory, makedirs_durable
from rmqstore.common.files.progress import ProgressPublisher
from rmqstore.common.files.scan import ColumnScan
from rmqstore.common.files.store import Dispatcher, StorePaths, geometry_of
from rmqstore.common.tracing import span, tracing_on
from rmqstore.writer.background import PeriodicTask
from rmqstore.writer.config import FlushPolicy, WriterConfig
from rmqstore.writer.ids import UniqKeyGenerator
from rmqstore.writer.lock import StoreLock
from rmqstore.writer.schedule import Scheduling, reroute, scheduled_rows
from rmqstore.writer.spans import append_span, dispatching
from rmqstore.writer.subscription_groups import SubscriptionGroupTable
from rmqstore.writer.topics import TopicTable
from rmqstore.writer.transactions import TRANSACTION_TOPICS, half_rows, to_half
from rmqstore.writer.validate import (
    Limits,
    MessageBatch,
    MessageInput,
    validate_parts,
)

DISK_CHECK_INTERVAL_S = 0.1
RETENTION_FILES_PER_RUN = 10
THOROUGH_FLUSH_INTERVAL_MS = 1000  # flushIntervalConsumeQueue
# Concurrent appends combined into one are capped at this many messages (the first
# caller's batch always goes, whatever its size), bounding the wait of the last caller.
GROUP_MAX_MESSAGES = 4096
# A replicated chunk of at most this many records is decoded a record at a time (its
# records then dispatched as one batch: Writer._dispatch_decoded): the columnar decode's
# set-up costs about 650 µs a chunk whatever its size, and a chunk of six records took
# 918 µs in columns against 343 µs a record at a time (benchmarks/REPLICATION.md, 2026-11-30).
REPLICATED_SINGLY_MAX = 32
_TRACER = trace.get_tracer("rmqstore.writer")
_DISK_FULL_ERRNOS = frozenset((errno.ENOSPC, errno.EDQUOT))
_RESOURCE_ERRNOS = frozenset((errno.EMFILE, errno.ENFILE, errno.ENOMEM))


def typed_os_error(error: OSError, what: str) -> StoreError | None:
    """The store's error for an operating system refusal that goes away once the resource
    returns (a full disk, no descriptors left), or None for any other failure."""
    if error.errno in _DISK_FULL_ERRNOS:
        return StoreFull(f"the disk is full ({error.strerror}): {what}")
    if error.errno in _RESOURCE_ERRNOS:
        return OutOfResources(f"{error.strerror}: {what}")
    return None


class AppendResult(NamedTuple):
    offset_msg_id: str
    uniq_key: str
    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    store_timestamp_ms: int
    size: int


class AppendResults(Sequence[AppendResult]):
    """The results of one append, kept as columns (a batch shares its store time and
    store host); each :class:`AppendResult` is made when asked for."""

    def __init__(
        self,
        store_host: SocketAddress,
        store_timestamp_ms: int,
        uniq_keys: list[str],
        topics: list[str],
        queue_ids: list[int],
        queue_offsets: list[int],
        commitlog_offsets: list[int],
        sizes: list[int],
    ):
        self.store_host = store_host
        self.store_timestamp_ms = store_timestamp_ms
        self.uniq_keys = uniq_keys
        self.topics = topics
        self.queue_ids = queue_ids
        self.queue_offsets = queue_offsets
        self.commitlog_offsets = commitlog_offsets
        self.sizes = sizes

    def __len__(self) -> int:
        return len(self.uniq_keys)

    @overload
    def __getitem__(self, position: int) -> AppendResult: ...

    @overload
    def __getitem__(self, position: slice) -> list[AppendResult]: ...

    def __getitem__(self, position: int | slice) -> AppendResult | list[AppendResult]:
        if isinstance(position, slice):
            return [self[i] for i in range(*position.indices(len(self)))]
        offset = self.commitlog_offsets[position]
        return AppendResult(
            offset_msg_id(self.store_host, offset),
            self.uniq_keys[position],
            self.topics[position],
            self.queue_ids[position],
            self.queue_offsets[position],
            offset,
            self.store_timestamp_ms,
            self.sizes[position],
        )

    def __iter__(self) -> Iterator[AppendResult]:
        msg_ids = offset_msg_ids(self.store_host, self.commitlog_offsets)
        timestamps = itertools.repeat(self.store_timestamp_ms)
        columns = (self.uniq_keys, self.topics, self.queue_ids, self.queue_offsets, self.commitlog_offsets)
        return map(AppendResult._make, zip(msg_ids, *columns, timestamps, self.sizes))

    @property
    def size_bytes(self) -> int:
        return sum(self.sizes)

    def part(self, start: int, stop: int) -> AppendResults:
        """The results of messages ``start`` to ``stop`` (one caller's share of a group)."""
        return AppendResults(
            self.store_host,
            self.store_timestamp_ms,
            self.uniq_keys[start:stop],
            self.topics[start:stop],
            self.queue_ids[start:stop],
            self.queue_offsets[start:stop],
            self.commitlog_offsets[start:stop],
            self.sizes[start:stop],
        )


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


class WriterStatus(TypedDict):
    """What :meth:`Writer.status` reports (the Status RPC's fields)."""

    store: str
    commitlog_min_offset: int
    commitlog_max_offset: int
    dispatched_offset: int
    flushed_offset: int
    queues: list[tuple[str, int, int, int]]
    disk_total_bytes: int
    disk_used_bytes: int
    disk_used_ratio: float
    flush_policy: str


class _AppendRequest:
    """One caller's batch in a group (Writer.append_group)."""

    __slots__ = ("batch", "count", "error", "peer", "released", "results", "transactions")

    def __init__(
        self,
        batch: MessageBatch | None,
        peer: SocketAddress | None,
        count: int = 0,
        *,
        released: bool = False,
        transactions: Mapping[int, tuple[int, int]] | None = None,
    ):
        # No batch of its own: a part of a group given as one batch, sliced out only if
        # the parts must be taken one by one.
        self.batch = batch
        self.count = batch.message_count if batch is not None else count
        self.peer = peer
        # The store's own copies of released scheduled messages (always alone in a group):
        # stored where they say, never scheduled again by the DELAY they keep.
        self.released = released
        # Rows of a released batch stored with a transaction type and prepared offset
        # (a committed transaction's copy): row -> (sysflag transaction type, offset).
        self.transactions = transactions
        self.results: AppendResults | None = None
        self.error: BaseException | None = None


def _default_born_hosts(born_hosts: list[SocketAddress | None], requests: list[_AppendRequest], store_host: SocketAddress) -> None:
    """In several callers' batches taken as one, each message without a born host takes
    its own caller's address (one pass over a column of each message's caller)."""
    callers = [None if request.peer == store_host else request.peer for request in requests]
    if not any(callers):
        return
    per_message = itertools.chain.from_iterable(map(itertools.repeat, callers, (r.count for r in requests)))
    born_hosts[:] = [born or caller for born, caller in zip(born_hosts, per_message)]


def _split(requests: list[_AppendRequest], combined: MessageBatch) -> None:
    """Give each part of a group given as one batch its own batch."""
    start = 0
    for request in requests:
        request.batch = combined.slice(start, start + request.count)
        start += request.count


def _current_boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _abort_boot_id(path: str) -> str:
    """The boot id a writer wrote into ``abort`` (empty: an older writer's or Apache's
    marker, taken as this boot's: only a process crash is assumed)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(64).decode("ascii", "replace").strip()
    except OSError:
        return ""


def _first_offset(decoded: RecordColumns | Record) -> int:
    return decoded.commitlog_offset if isinstance(decoded, Record) else int(decoded.commitlog_offset[0])


def _describe(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return f"[Errno {error.errno}] {error.strerror}"
    return str(error) or type(error).__name__


class Writer:
    """Owns a store directory until :meth:`close`."""

    def __init__(self, config: WriterConfig):
        self.config = config
        self.paths = StorePaths(config.store)
        self.store_host = SocketAddress.parse(config.store_host)
        self.limits = Limits(config.max_body_bytes, config.max_keys, config.max_key_length, config.max_batch_messages)
        self.scheduling = Scheduling(DEFAULT_DELAY_LEVELS_MS, config.timer_max_delay_ms)
        makedirs_durable(config.store)
        self._lock_file = StoreLock(self.paths.lock)
        self._append_lock = threading.Lock()
        self._flushed_lock = threading.Lock()
        # One flush at a time (the periodic flush, the thorough flush's, a SYNC group's):
        # a second waits, then finds the bytes synced, instead of fsyncing them again and
        # reporting them in a span of its own.
        self._flush_lock = threading.Lock()
        self._closed = False
        # Told the bytes and seconds of every commit log fsync (the service's metrics).
        self.flush_observer: Callable[[int, float], None] | None = None
        self._tasks: list[PeriodicTask] = []
        try:
            self._open()
        except BaseException:
            self._lock_file.release()
            raise

    def _open(self) -> None:
        sizes = self.config.sizes
        record_geometry(self.paths.config, geometry_of(sizes))
        self.unclean_start = os.path.exists(self.paths.abort)
        self.boot_id = self.config.boot_id or _current_boot_id()
        # A crash of the process leaves the page cache whole: what it wrote is there. A
        # power cut (another boot since) may have kept any subset of the unsynced pages.
        self.power_lost = self.unclean_start and _abort_boot_id(self.paths.abort) not in ("", self.boot_id)
        self.log = CommitLog(self.paths.commitlog, sizes.commitlog_file_size_bytes, writable=True)
        self.queues = ConsumeQueueSet(self.paths.consumequeue, sizes.cq_file_units, writable=True)
        self.queues.open_all()
        self.index = IndexFileList(self.paths.index, sizes.index_slots, sizes.index_entries, writable=True)
        self.dispatcher = Dispatcher(self.queues, self.index)
        self.topics = TopicTable(
            self.paths.config,
            self.paths.consumequeue,
            self.queues.discover(),
            max_topics=self.config.max_topics,
            max_queues=self.config.max_queues,
        )
        self.subscription_groups = SubscriptionGroupTable(self.paths.config)
        ensure_cursor_key(self.paths.config)  # the store's query nodes sign page cursors with it
        self.publisher = ProgressPublisher(self.config.store)
        self.uniq_keys = UniqKeyGenerator()
        self.recovery = self._recover()
        self._next_queue_offset = {key: queue.max_offset for key, queue in self.queues.queues.items()}
        self._round_robin: dict[str, int] = {}
        self._last_store_ts = self.publisher.last.last_store_timestamp_ms if self.publisher.last else 0
        self._disk_checked_at = 0.0
        self._disk_full_reason: str | None = None
        # Why records appended to the commit log are not dispatched yet (None: they all
        # are). While set, writes are refused; each write and each periodic flush tries
        # to complete the dispatch.
        self.dispatch_pending: str | None = None
        # Why this writer takes no writes of its own (a writer group's follower: the
        # error names the primary); None while it takes them.
        self.refusal: StoreError | None = None
        # Told after a batch with delayed or timed messages is dispatched, and when a
        # follower takes writes again: the scheduled-delivery thread, which otherwise
        # sleeps while nothing is scheduled (writer.timers.ScheduledDelivery).
        self.scheduled_listeners: list[Callable[[], None]] = []
        # A follower's replicated records, decoded when written, until their dispatch.
        self._replicated: list[RecordColumns | Record] = []
        with open(self.paths.abort, "wb") as handle:
            handle.write(self.boot_id.encode("ascii", "replace"))
            handle.flush()
            os.fsync(handle.fileno())
        fsync_directory(self.config.store)
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
        if stop.reason is StopReason.CORRUPT and self.power_lost and progress is not None and stop.end_offset >= progress.durable_offset:
            # After a power cut any page past the last commit log sync may be old or new:
            # a record made of both is what the cut left of writes never known durable.
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
        if self.power_lost and progress is not None:
            dropped += self._drop_index_files_past(progress.durable_offset, trust_entries=False)
        self._repair_newest_index_header(end)
        redispatch_from = scan_from
        if not self.index.files:
            redispatch_from = log.min_offset
        else:
            redispatch_from = min(redispatch_from, max(self.index.files[-1].last_entry_phy_offset(), log.min_offset))
        count = 0
        if redispatch_from < end:
            redispatch_from = self._record_boundary_at_or_before(redispatch_from)
            scan = ColumnScan(log, redispatch_from, end, check_crc=False)
            count = self.dispatcher.dispatch_columns(scan)
            invariant(scan.stop is None, "records below the validated end decode")
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
        newest.repair_slots()
        last = newest.last_entry_phy_offset()
        if last < end and last != newest.end_phy_offset:
            newest.repair_header_end(self.log.read(last, check_crc=False).store_timestamp_ms)

    def _drop_index_files_past(self, end: int, *, trust_entries: bool = True) -> int:
        """Index files holding entries at or past the end of the log point at records that
        are gone: delete them (their earlier records are re-indexed from the commit log).

        After a power cut (``trust_entries=False``, ``end`` the durable offset) any page
        written after the last sync may be old or new: a slot may name an entry that is
        not there, an entry may be unreachable from its slot. Every file written past
        the durable offset (by its header's end, or its last entry) is rebuilt."""
        def written_past(f: IndexFile) -> bool:
            last = f.last_entry_phy_offset()
            return last >= end if trust_entries else max(last, f.end_phy_offset) >= end

        # After a power cut a file without entries counts too: its header (synced when the
        # file was made) can name a record past the durable end while the entries of the
        # file before it, never synced, are gone; re-indexing must start before them.
        doomed = [f for f in self.index.files if (f.index_count > 1 or not trust_entries) and written_past(f)]
        if doomed and not trust_entries:
            # Every newer file goes too (an empty newest one included): re-indexing then
            # starts from the last entry of a file that is kept whole.
            doomed = self.index.files[self.index.files.index(doomed[0]) :]
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
        count = 1 if topic in TRANSACTION_TOPICS else self.topics.queue_count(topic)
        if count is None:
            if not self.config.auto_create_topics:
                raise NotFound(f"{where}topic {topic} does not exist and auto-create is off")
            to_create.add(topic)
            count = self.config.auto_create_queue_count
        return count

    def append(
        self, messages: MessageBatch | Sequence[MessageInput], peer: SocketAddress | None = None
    ) -> AppendResults:
        """Append one caller's messages in order and dispatch them; returns once the flush
        policy says they are stored. Bad input raises before anything is written. Calls
        are taken one at a time: concurrent requests are combined by the service's group
        commit (writer.group_commit.GroupAppender, through :meth:`append_group`)."""
        batch = messages if isinstance(messages, MessageBatch) else MessageBatch.of(messages)
        [outcome] = self.append_group(batch, [(batch.message_count, peer)])
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def append_released(
        self, batch: MessageBatch, *, schedule: bool = False, transactions: Mapping[int, tuple[int, int]] | None = None
    ) -> AppendResults:
        """Append the store's own messages, which carry properties producers may not set:
        delayed and timed messages released to their real topics (stored where they say:
        the DELAY a released copy keeps, as Apache's does, schedules nothing), or with
        ``schedule`` recall markers (moved to the timer as a producer's timed message is).
        Not checked by the producers' rules, but admitted (their topics checked or
        created) and stored as any batch, under SYNC fsynced before this returns.
        ``transactions`` gives rows a sysFlag transaction type and PREPAREDTRANSACTIONOFFSET
        (row -> (type, offset)): a committed transaction's copy."""
        request = _AppendRequest(batch, None, released=not schedule, transactions=transactions)
        self._commit([request])
        if request.error is not None:
            raise request.error
        assert request.results is not None
        return request.results

    def append_group(
        self, batch: MessageBatch, parts: Sequence[tuple[int, SocketAddress | None]], *, flush: bool = True
    ) -> list[AppendResults | BaseException]:
        """Store several callers' batches as one group (the group commit): ``batch``
        holds their messages in order, and ``parts`` each caller's message count and
        address. Returns each caller's results, or the error that refused its batch. The
        group is checked, admitted and stored as one batch, and only when some part is
        refused is each part taken on its own.

        Under SYNC one fsync covers the group, unless ``flush`` is False: the caller then
        calls :meth:`flush` before it acknowledges any of them (the asyncio service does,
        on a thread of its own, while the next group is appended)."""
        requests = [_AppendRequest(None, peer, count=count) for count, peer in parts]
        problems = validate_parts(batch, [count for count, _ in parts], self.limits)
        combined: MessageBatch | None = batch
        if any(problems):
            _split(requests, batch)
            for request, problem in zip(requests, problems):
                request.error = problem
            combined = None
        group = [request for request in requests if request.error is None]
        if group:
            with contextlib.suppress(Exception):  # each request holds the error
                self._commit(group, combined, flush)
        return [request.error if request.error is not None else request.results for request in requests]  # type: ignore[misc]

    def _commit(self, group: list[_AppendRequest], combined: MessageBatch | None = None, flush: bool = True) -> None:
        """Append the group (its batches given as one in ``combined``, if they are), fsync
        it under SYNC (if ``flush``), and give each request its results or its error; a
        failure of the whole group is every request's error, and raised."""
        try:
            self._append_group(group, combined)
            if flush and self.config.flush is FlushPolicy.SYNC and any(request.results is not None for request in group):
                self.flush()
        except BaseException as error:
            # Nothing of the group is acknowledged: what was appended but not fsynced is
            # not known to be stored.
            for request in group:
                if request.error is None:
                    request.results, request.error = None, error
            raise

    def _append_group(self, group: list[_AppendRequest], combined: MessageBatch | None = None) -> None:
        """Store the group's good batches as one; each bad one gets its own error."""
        with self._append_lock:
            if self._closed:
                raise InvalidArgument("the writer is closed")
            if self.refusal is not None:
                raise self.refusal
            self._complete_dispatch()
            self._check_disk()
            if combined is not None:
                try:
                    self._admit(combined)  # every part at once
                except (InvalidArgument, NotFound):
                    _split(group, combined)  # some part is refused: each is admitted on its own
                    combined = None
            if combined is not None:
                accepted = group
            else:
                accepted = []
                for request in group:
                    try:
                        self._admit(request.batch)  # type: ignore[arg-type]
                    except (InvalidArgument, NotFound) as error:
                        request.error = error
                    else:
                        accepted.append(request)
            if not accepted:
                return
            try:
                self._store(accepted, combined)
            except InvalidArgument:
                if len(accepted) == 1:
                    raise
                # One batch cannot be laid out (a record larger than a file): nothing was
                # written, so each is stored alone and only that one is refused.
                if combined is not None:
                    _split(accepted, combined)
                for request in accepted:
                    try:
                        self._store([request])
                    except InvalidArgument as error:
                        request.error = error

    def _store(self, requests: list[_AppendRequest], combined: MessageBatch | None = None) -> None:
        """Append, dispatch and publish the batches of ``requests`` as one (``combined``,
        if the caller gave them so), and give each its part of the results."""
        if len(requests) == 1:
            batch, peer = combined if combined is not None else requests[0].batch, requests[0].peer
        else:
            if combined is None:
                combined = MessageBatch.concat([request.batch for request in requests])  # type: ignore[misc]
            _default_born_hosts(combined.born_hosts, requests, self.store_host)
            batch, peer = combined, None
        assert batch is not None
        with append_span(batch) as current:
            plans, results = self._append_batch(
                batch, peer, schedule=not requests[0].released, transactions=requests[0].transactions
            )
            dispatching(current, results.uniq_keys)
            try:
                self.dispatcher.dispatch_batch(plans)
            except Exception as error:
                # The commit log is the truth: the records stay, and their dispatch is
                # completed once the resource returns. Until then nothing past them is
                # published (query nodes see none of them) and writes are refused.
                first, last = results.commitlog_offsets[0], results.commitlog_offsets[-1] + results.sizes[-1]
                self.dispatch_pending = f"dispatch of commit log [{first}, {last}) failed: {_describe(error)}"
                raise Unavailable(
                    f"the batch is in the commit log at offsets [{first}, {last}) but its dispatch failed "
                    f"({_describe(error)}); its messages become visible once the dispatch completes, "
                    "and the writer refuses writes until then"
                ) from error
        self._publish_dispatched()
        if not SCHEDULED_TOPICS.isdisjoint(results.topics):
            self._tell_scheduled()
        start = 0
        for request in requests:
            stop = start + request.count
            request.results = results.part(start, stop) if len(requests) > 1 else results
            start = stop

    def _publish_dispatched(self) -> None:
        end = self.log.write_offset
        assert end is not None
        self.publisher.publish(
            dispatched_offset=end,
            durable_offset=self.durable_offset,
            commitlog_min_offset=self.log.min_offset,
            last_store_timestamp_ms=self._last_store_ts,
        )

    def _complete_dispatch(self) -> None:
        """Dispatch what a failed dispatch left undone, from the published offset to the
        end of the log (dispatch is idempotent: units and keys already written are
        skipped), then publish. Under the append lock. Raises :class:`Unavailable`, naming
        the cause, while it still fails."""
        if self.dispatch_pending is None:
            return
        published = self.publisher.last.dispatched_offset if self.publisher.last else self.log.min_offset
        end = self.log.write_offset or 0
        try:
            if published < end:
                self.dispatcher.dispatch_columns(ColumnScan(self.log, published, end, check_crc=False))
        except Exception as error:
            self.dispatch_pending = f"dispatch of commit log [{published}, {end}) failed: {_describe(error)}"
            raise Unavailable(f"writes are refused until the {self.dispatch_pending}") from error
        self.dispatch_pending = None
        self._publish_dispatched()

    # Replication (writer.replication: a writer group's follower)

    def check_writable(self) -> None:
        """Raise the refusal of a replica that takes no writes of its own."""
        refusal = self.refusal
        if refusal is not None:
            raise refusal

    def write_replicated(self, offset: int, data: bytes) -> int:
        """Append a primary's commit log bytes at ``offset`` (this log's end), once they
        decode as whole records with good CRCs; returns the new end. They are neither
        synced (:meth:`sync_replicated`) nor dispatched (:meth:`dispatch_replicated`)
        yet: the decoded records are kept for the dispatch."""
        with self._append_lock:
            if self._closed:
                raise InvalidArgument("the writer is closed")
            if offset != self.log.write_offset:
                raise InvalidArgument(f"replicated bytes start at {offset}, but this commit log ends at {self.log.write_offset}")
            end = offset + len(data)
            self.log.write_replicated(offset, data)
            scan = self._replicated_scan(offset, end)
            decoded = list(scan)
            if scan.stop is not None:
                self.log.abandon(offset, end)
                raise Corruption(f"replicated bytes at {offset} do not decode: {scan.stop.describe()}", offset=offset)
            self._replicated.extend(decoded)
        return end

    def _replicated_scan(self, offset: int, end: int) -> ColumnScan | RecordScan:
        """The records of a replicated chunk, checked as recovery checks them: a record at
        a time for a chunk of a few (a primary under one-message sends streams chunks of a
        handful), in columns for more, where the columnar decode's set-up pays."""
        mapped = self.log.files.find(offset)
        if mapped is not None:
            base = mapped.start_offset
            found = columnar.walk(
                mapped.buf, offset - base, stop=min(end, mapped.end_offset) - base,
                rows_max=REPLICATED_SINGLY_MAX + 1, bytes_max=end - offset,
            )  # fmt: skip
            if len(found.starts) <= REPLICATED_SINGLY_MAX:
                return self.log.records(offset, stop=end)
        return ColumnScan(self.log, offset, end)

    def sync_replicated(self) -> int:
        """The end of the replicated bytes this replica holds under its flush policy
        (fsynced first under ``--flush sync``): what a follower reports stored. Their
        dispatch may come after: recovery dispatches from the commit log whatever a crash
        left undispatched, so the consume queues and index are not needed for durability."""
        if self.config.flush is FlushPolicy.SYNC:
            return self.flush()
        return self.log.write_offset or 0

    def dispatch_replicated(self) -> None:
        """Dispatch what :meth:`write_replicated` appended (the consume queues and index
        come out as the primary's, with the code recovery uses), then publish it. Raises
        :class:`Unavailable` if the dispatch fails; the next call completes it."""
        with self._append_lock:
            decoded, self._replicated = self._replicated, []
            published = self.publisher.last.dispatched_offset if self.publisher.last else self.log.min_offset
            end = self.log.write_offset or 0
            if published >= end:
                return
            # The decoded records serve when they continue the dispatch exactly; after a
            # failed dispatch the log is scanned again (dispatch is idempotent).
            try:
                if self.dispatch_pending is not None or not decoded or _first_offset(decoded[0]) != published:
                    self.dispatcher.dispatch_columns(ColumnScan(self.log, published, end, check_crc=False))
                else:
                    self._dispatch_decoded(decoded)
            except Exception as error:
                self.dispatch_pending = f"dispatch of commit log [{published}, {end}) failed: {_describe(error)}"
                raise Unavailable(f"the replicated bytes are stored but their {self.dispatch_pending}") from error
            self.dispatch_pending = None
            self._last_store_ts = max(self._last_store_ts, self.dispatcher.last_dispatched_timestamp_ms)
            self._publish_dispatched()

    def _dispatch_decoded(self, decoded: list[Record | RecordColumns]) -> None:
        """Dispatch replicated records as they were decoded: the records of a small chunk,
        taken a record at a time, together as one batch (their index keys put by the
        compiled path, each queue's units in one write: the bytes of a dispatch a record
        at a time; a follower used 0-23 % less CPU a message, benchmarks/REPLICATION.md);
        columns as columns."""
        delay_levels_ms = self.dispatcher.delay_levels_ms
        batch = DispatchBatch(delay_levels_ms)
        for item in decoded:
            if isinstance(item, Record):
                batch.add_record(item)
                continue
            if len(batch):
                self.dispatcher.dispatch_batch(batch)
                batch = DispatchBatch(delay_levels_ms)
            self.dispatcher.dispatch_columns((item,))
        if len(batch):
            self.dispatcher.dispatch_batch(batch)

    def truncate_replica(self, end: int) -> None:
        """Cut the commit log at ``end`` (a record boundary) for a replica that rejoins its
        group, durably: the bytes past it are zeroed and synced and later files deleted
        (their directory synced), the consume queue units and index files past it go, the
        index is rebuilt from the log up to it, and the progress file names ``end`` -
        all before this returns, so no crash can bring the cut records back."""
        self.dispatch_replicated()
        with self._append_lock:
            invariant(self.dispatch_pending is None, "a replica truncates with its dispatch complete")
            if end >= (self.log.write_offset or 0):
                return
            # First the progress file: nothing past ``end`` is dispatched or durable. A
            # crash (or power cut) inside the cut then leaves a tail that recovery takes
            # for a torn one, not mid-log corruption, whatever of it reached the disk.
            self.flushed_offset = min(self.flushed_offset, end)
            self.durable_offset = min(self.durable_offset, end)
            self.publisher.publish(
                dispatched_offset=end,
                durable_offset=self.durable_offset,
                commitlog_min_offset=self.log.min_offset,
                last_store_timestamp_ms=self._last_store_ts,
            )
            self.publisher.sync()
            self.log.truncate(end)
            self.log.flush()
            for queue in self.queues.queues.values():
                if queue.max_commitlog_end > end:
                    queue.truncate_to_commitlog(end)
                    for mapped in queue.files.files[-1:]:
                        mapped.flush()  # the zeroed units are on disk
            self._drop_index_files_past(end)
            fsync_directory(self.paths.index)
            self._repair_newest_index_header(end)
            reindex_from = self.log.min_offset
            if self.index.files:
                reindex_from = max(self.index.files[-1].last_entry_phy_offset(), self.log.min_offset)
            if reindex_from < end:
                reindex_from = self._record_boundary_at_or_before(reindex_from)
                self.dispatcher.dispatch_columns(ColumnScan(self.log, reindex_from, end, check_crc=False))
            self.dispatcher.flush()
            self._next_queue_offset = {key: queue.max_offset for key, queue in self.queues.queues.items()}
            self._publish_dispatched()
            self.publisher.sync()

    def resume_writing(self) -> None:
        """Take writes of our own again (a follower promoted): the queues' next offsets
        and the topic table as replication left them, every replicated record dispatched."""
        self.dispatch_replicated()
        with self._append_lock:
            self._next_queue_offset = {key: queue.max_offset for key, queue in self.queues.queues.items()}
            self.reload_topics()
            self.refusal = None
        self._tell_scheduled()

    def _tell_scheduled(self) -> None:
        for listener in self.scheduled_listeners:
            listener()

    def reload_topics(self) -> None:
        """Read the topic table again (a follower's, replaced by its primary's copy)."""
        self.topics = TopicTable(
            self.paths.config,
            self.paths.consumequeue,
            self.queues.discover(),
            max_topics=self.config.max_topics,
            max_queues=self.config.max_queues,
        )

    def reload_subscription_groups(self) -> None:
        """Read the groups' configuration again (a follower's, replaced by its primary's copy)."""
        self.subscription_groups = SubscriptionGroupTable(self.paths.config)

    def retry_dispatch(self) -> bool:
        """Try to complete a pending dispatch now; whether none is pending afterwards."""
        with self._append_lock:
            with contextlib.suppress(Unavailable):
                self._complete_dispatch()
            return self.dispatch_pending is None

    def _admit(self, batch: MessageBatch) -> None:
        """Check a batch's topics and queue ids against the topic table, then create the
        topics it auto-creates (only once the whole batch is known to be good)."""
        def queue_count(topic: str) -> int | None:
            # The transactions' system topics hold the store's own records, queue 0 only.
            return 1 if topic in TRANSACTION_TOPICS else self.topics.queue_count(topic)

        known = {topic: queue_count(topic) for topic in set(batch.topics)}
        if None not in known.values() and all(
            q is None or q < known[t]  # type: ignore[operator]
            for t, q in set(zip(batch.topics, batch.queue_ids))  # each distinct queue once
        ):
            return
        numbered = batch.message_count > 1
        to_create: set[str] = set()
        first_seen: dict[str, int] = {}
        for position, topic in enumerate(batch.topics, start=1):
            first_seen.setdefault(topic, position)
        counts = {
            topic: self._queue_count(topic, f"message {position}: " if numbered else "", to_create)
            for topic, position in first_seen.items()
        }
        if any(q is not None and q >= counts[t] for t, q in zip(batch.topics, batch.queue_ids)):
            for position, (topic, queue_id) in enumerate(zip(batch.topics, batch.queue_ids), start=1):
                if queue_id is not None and queue_id >= counts[topic]:
                    where = f"message {position}: " if numbered else ""
                    raise InvalidArgument(
                        f"{where}queue id {queue_id} is out of range: topic {topic} has {counts[topic]} queues"
                    )
        for topic in sorted(to_create):
            try:
                self.topics.create(topic, self.config.auto_create_queue_count)
            except OSError as error:
                typed = typed_os_error(error, f"topic {topic} could not be created; the batch was not stored")
                if typed is None:
                    raise
                raise typed from error

    def _append_batch(
        self,
        batch: MessageBatch,
        peer: SocketAddress | None,
        *,
        schedule: bool = True,
        transactions: Mapping[int, tuple[int, int]] | None = None,
    ) -> tuple[DispatchBatch, AppendResults]:
        """Encode the messages, lay them out in the commit log, write them in one go and
        plan their dispatch, column by column. A batch shares one store time (never
        before the last one)."""
        now = int(time.time() * 1000)
        store_ts = max(now, self._last_store_ts)
        store_host = self.store_host
        default_born = peer or store_host
        count = batch.message_count
        topics, bodies, keys, tags = batch.topics, batch.bodies, batch.keys, batch.tags
        # The common batches (no born hosts given, every uniq key given) take a C-speed
        # pass over the column instead of a Python step per message.
        if any(batch.born_hosts):
            born_hosts = [born or default_born for born in batch.born_hosts]
        else:
            born_hosts = [default_born] * count
        if all(batch.uniq_keys):
            uniq_keys = batch.uniq_keys[:]
        elif not any(batch.uniq_keys) and not any(batch.born_hosts):
            uniq_keys = self.uniq_keys.next_many(default_born.ip, now, count)
        else:
            uniq_keys = [given or self.uniq_keys.next(born.ip, now) for given, born in zip(batch.uniq_keys, born_hosts)]
        queue_ids = self._assign_queues(topics, batch.queue_ids)
        user_properties = batch.properties
        scheduled: dict[int, int] | None = None
        rows = scheduled_rows(user_properties) if schedule else []
        if rows:
            # Delayed and timed messages go to their system topics (writer.schedule),
            # REAL_QID naming the queue just assigned.
            moved = reroute(topics, queue_ids, user_properties, rows, store_ts, self.scheduling)
            topics, queue_ids, user_properties, scheduled = moved.topics, moved.queue_ids, moved.properties, moved.tags_codes
        halves = half_rows(user_properties) if schedule else []
        if halves:
            # Transactions' half messages go to RMQ_SYS_TRANS_HALF_TOPIC (writer.transactions).
            topics, queue_ids, user_properties = to_half(topics, queue_ids, user_properties, halves, uniq_keys)
        queue_offsets, next_queue_offsets = self._plan_queue_offsets(topics, queue_ids)
        if schedule:
            properties = props.encode_messages_properties(user_properties, keys, tags, uniq_keys)
        else:
            # A released copy's properties are all of them (KEYS, TAGS and UNIQ_KEY too) in
            # the order its record held them: a Java HashMap filled in that order, as
            # Apache's copy is, iterates them in the same order.
            properties = [props.encode_properties(props.broker_order(mapping)) for mapping in user_properties]
        start = self.log.write_offset
        assert start is not None
        records: bytes | bytearray
        records, sizes = encode_records(
            start, queue_ids, batch.flags, queue_offsets, batch.born_timestamps_ms, born_hosts, bodies, topics,
            properties, store_ts, store_host, now,
        )  # fmt: skip
        offsets = self.log.layout(sizes)
        if offsets[-1] - start != len(records) - sizes[-1]:
            # The batch starts a new file part-way: the records after the BLANK move on.
            records = set_physical_offsets(records, sizes, offsets)
        if transactions:
            records = bytearray(records)
            positions = list(itertools.accumulate(sizes, initial=0))
            for row, (kind, prepared_offset) in transactions.items():
                set_transaction(records, positions[row], kind, prepared_offset)
        timestamps = [store_ts] * count
        plans = DispatchBatch.of_messages(
            topics, queue_ids, queue_offsets, offsets, sizes, timestamps, tags, uniq_keys, keys, scheduled
        )
        self._prepare_dispatch(next_queue_offsets, sum(plans.key_counts))
        try:
            self.log.write_laid_out(offsets, sizes, records)
        except BaseException as error:
            # A failed write (a full disk) stores nothing: its bytes are cleared and the
            # queue offsets it planned stay free.
            self.log.abandon(start, offsets[-1] + sizes[-1])
            typed = typed_os_error(error, "the batch was not stored") if isinstance(error, OSError) else None
            if typed is not None:
                raise typed from error
            raise
        self._next_queue_offset.update(next_queue_offsets)
        self._last_store_ts = store_ts
        return plans, AppendResults(store_host, store_ts, uniq_keys, topics, queue_ids, queue_offsets, offsets, sizes)

    def _prepare_dispatch(self, next_queue_offsets: dict[tuple[str, int], int], key_count: int) -> None:
        """Create, before the batch touches the commit log, every consume queue file its
        units will go into, and the next index file's blocks if its keys may fill the
        current one. Creating a file is what a full disk or a descriptor shortage
        refuses; refused here, the batch is refused whole and nothing of it is stored,
        where refused during dispatch its records would already be in the log.

        A queue's units run from its next offset before the batch (nothing of the batch
        is taken yet) to the one before ``next_queue_offsets``: a step per queue, not per
        message."""
        try:
            for key, following in next_queue_offsets.items():
                self.queues.get(*key).prepare(self._next_queue_offset.get(key, 0), following - 1)
            self.index.prepare(key_count)
        except OSError as error:
            typed = typed_os_error(error, "a consume queue or index file could not be created; the batch was not stored")
            if typed is None:
                raise
            raise typed from error

    def _assign_queues(self, topics: list[str], queue_ids: list[int | None]) -> list[int]:
        """Messages without a queue id take the topic's queues in turn."""
        if None not in queue_ids:
            return queue_ids  # type: ignore[return-value]
        counts = {topic: self.topics.queue_count(topic) or 1 for topic in set(topics)}
        turn = self._round_robin
        assigned = []
        for topic, queue_id in zip(topics, queue_ids):
            if queue_id is None:
                queue_id = turn.get(topic, 0) % counts[topic]
                turn[topic] = queue_id + 1
            assigned.append(queue_id)
        return assigned

    def _plan_queue_offsets(
        self, topics: list[str], queue_ids: list[int]
    ) -> tuple[list[int], dict[tuple[str, int], int]]:
        """Each message's queue offset, and each queue's next offset once they are
        written (taken only then: a refused batch leaves no gap in a queue)."""
        keys = list(zip(topics, queue_ids))
        # A counter per queue, each message taking the next number of its queue's (the
        # loop runs in C: map calls next on each message's counter).
        counters = {key: itertools.count(self._next_queue_offset.get(key, 0)) for key in dict.fromkeys(keys)}
        offsets = list(map(next, map(counters.__getitem__, keys)))
        return offsets, {key: next(counter) for key, counter in counters.items()}

    # Flushing

    def flush(self, links: list[trace.Link] | None = None) -> int:
        """fsync the commit log up to what is written, then the queues and index, and
        publish the durable offset. Returns the flushed commit log offset. A flush with
        bytes to sync has a span (in the caller's trace, ``links`` naming the other
        requests it acknowledges); one with none has no span."""
        with self._flush_lock:
            return self._flush(links)

    def _flush(self, links: list[trace.Link] | None) -> int:
        with self._append_lock:
            target = self.log.write_offset or 0
            start = self.flushed_offset
        if target <= start and not (links or (tracing_on() and trace.get_current_span().get_span_context().is_valid)):
            # Nothing new to fsync and nobody waiting in a trace: no span (an idle writer
            # under ASYNC flushes twice a second, and a root span for each would bury the
            # traces that matter). A request waiting for this flush still gets its span,
            # with 0 bytes: an earlier fsync, which ran as its bytes were written, synced
            # them, and its trace shows that the wait ended here.
            began = time.perf_counter()
            self.log.flush_range(start, target)
            if self.flush_observer is not None:
                self.flush_observer(max(target - start, 0), time.perf_counter() - began)
        else:
            with span(_TRACER, "rmqstore.flush", links=links) as current:
                began = time.perf_counter()
                self.log.flush_range(start, target)
                took = time.perf_counter() - began
                if self.flush_observer is not None:
                    self.flush_observer(max(target - start, 0), took)
                if current.is_recording():
                    current.set_attribute("rmqstore.flush.bytes", max(target - start, 0))
                    current.set_attribute("rmqstore.flush.fsync_ms", round(took * 1000, 3))
        with self._flushed_lock:
            self.flushed_offset = max(self.flushed_offset, target)
        return target

    def flush_thoroughly(self) -> int:
        """Flush the commit log, the consume queues and the index, then record that
        everything below the flushed offset needs no re-dispatch after a crash.

        Only files written since the last flush are synced, and none under the append
        lock: with thousands of queues, syncing each of them while holding it stalled
        every append for as long (one thread flushes at a time: the periodic task, or
        :meth:`close` once that task has stopped)."""
        self.retry_dispatch()
        with self._append_lock:
            # Every record below the target is dispatched by now: its queue units and
            # index entries are in the files listed here.
            target = self.publisher.last.dispatched_offset if self.publisher.last else 0
            queues = list(self.queues.queues.values())
            index_files = list(self.index.files)
        self.flush()
        for queue in queues:
            queue.flush()
        for index_file in index_files:
            index_file.flush()
        with self._append_lock:
            self.durable_offset = max(self.durable_offset, target)
            self.publisher.publish(
                dispatched_offset=self.publisher.last.dispatched_offset if self.publisher.last else 0,
                durable_offset=self.durable_offset,
                commitlog_min_offset=self.log.min_offset,
                last_store_timestamp_ms=self._last_store_ts,
            )
            checkpoint = self._checkpoint()
        self.publisher.sync()
        try:
            write_checkpoint(self.paths.checkpoint, checkpoint)
        except OSError as error:
            # A full disk keeps the previous checkpoint (it is replaced whole or not at
            # all), and recovery does not depend on it (progress holds the offsets): the
            # flush, and a stop, go on. Anything else is raised.
            if typed_os_error(error, "") is None:
                raise
        return target

    def _checkpoint(self) -> Checkpoint:
        previous = read_checkpoint(self.paths.checkpoint)
        return Checkpoint(
            physic_msg_timestamp_ms=self._last_store_ts,
            logics_msg_timestamp_ms=self.dispatcher.last_dispatched_timestamp_ms
            or (previous.logics_msg_timestamp_ms if previous else 0),
            index_msg_timestamp_ms=self.index.last_full_end_timestamp_ms,
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
                dispatched_offset=self.publisher.last.dispatched_offset if self.publisher.last else 0,
                durable_offset=self.durable_offset,
                commitlog_min_offset=new_min,
                last_store_timestamp_ms=self._last_store_ts,
            )
            deleted = self.log.files.delete_first(len(doomed))
            queue_files = sum(queue.delete_expired(new_min) for queue in self.queues.queues.values())
            index_files = self.index.delete_expired(new_min)
        return RetentionReport(deleted, queue_files, index_files, ratio)

    # Status

    @property
    def unflushed_bytes(self) -> int:
        """Bytes appended but not yet fsynced (what an ASYNC writer can lose to a power cut)."""
        return max((self.log.write_offset or 0) - self.flushed_offset, 0)

    @property
    def dispatch_lag_bytes(self) -> int:
        """Bytes appended but not yet dispatched and published to query nodes."""
        published = self.publisher.last.dispatched_offset if self.publisher.last else 0
        return max((self.log.write_offset or 0) - published, 0)

    def status(self) -> WriterStatus:
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
