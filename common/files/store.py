"""A store directory: its layout, its sizes, and dispatch into its queues and index."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from rmqstore.common.codec import consumequeue as cq
from rmqstore.common.codec import index as ix
from rmqstore.common.codec.columnar import RecordColumns
from rmqstore.common.codec.dispatch import (
    DEFAULT_DELAY_LEVELS_MS,
    SMALL_BATCH_RECORDS,
    DispatchBatch,
    DispatchPlan,
    plan_dispatch,
)
from rmqstore.common.codec.record import Record
from rmqstore.common.errors import Corruption, InvalidArgument
from rmqstore.common.files.commitlog import DEFAULT_FILE_SIZE_BYTES, CommitLog, ScanStop
from rmqstore.common.files.consumequeue import UNIT_DTYPE, ConsumeQueueSet, infer_file_units
from rmqstore.common.files.geometry import Geometry, infer_index_geometry, read_geometry
from rmqstore.common.files.index import IndexFileList
from rmqstore.common.files.scan import ColumnScan


@dataclass(frozen=True, slots=True)
class StorePaths:
    """docs/format.md §1."""

    root: str

    @property
    def commitlog(self) -> str:
        return os.path.join(self.root, "commitlog")

    @property
    def consumequeue(self) -> str:
        return os.path.join(self.root, "consumequeue")

    @property
    def index(self) -> str:
        return os.path.join(self.root, "index")

    @property
    def checkpoint(self) -> str:
        return os.path.join(self.root, "checkpoint")

    @property
    def abort(self) -> str:
        return os.path.join(self.root, "abort")

    @property
    def lock(self) -> str:
        return os.path.join(self.root, "lock")

    @property
    def config(self) -> str:
        return os.path.join(self.root, "config")


@dataclass(frozen=True, slots=True)
class StoreSizes:
    """File geometry; RocketMQ's defaults (docs/format.md §11) unless set."""

    commitlog_file_size_bytes: int = DEFAULT_FILE_SIZE_BYTES
    cq_file_units: int = cq.DEFAULT_FILE_UNITS
    index_slots: int = ix.DEFAULT_SLOTS
    index_entries: int = ix.DEFAULT_ENTRIES

    def __post_init__(self) -> None:
        if self.commitlog_file_size_bytes < 1024:
            raise InvalidArgument(f"commit log files must be at least 1024 bytes, got {self.commitlog_file_size_bytes}")
        if self.cq_file_units <= 0:
            raise InvalidArgument(f"consume queue files need at least one unit, got {self.cq_file_units}")
        ix.check_geometry(self.index_slots, self.index_entries)


def infer_commitlog_file_size(directory: str) -> int | None:
    """The size of the commit log files on disk, if any exist and agree."""
    try:
        names = [n for n in os.listdir(directory) if len(n) == 20 and n.isdigit()]
    except FileNotFoundError:
        return None
    sizes = {os.path.getsize(os.path.join(directory, n)) for n in names}
    if not sizes:
        return None
    if len(sizes) > 1:
        raise Corruption(f"commit log files in {directory} have different sizes {sorted(sizes)}", path=directory)
    return sizes.pop()


def infer_index_file_size(directory: str) -> int | None:
    """The size of the first index file on disk, if there is one."""
    try:
        names = sorted(n for n in os.listdir(directory) if ix.is_file_name(n))
    except (FileNotFoundError, NotADirectoryError):
        return None
    return os.path.getsize(os.path.join(directory, names[0])) if names else None


def resolve_sizes(
    root: str,
    *,
    commitlog_file_size_bytes: int | None = None,
    cq_file_units: int | None = None,
    index_slots: int | None = None,
    index_entries: int | None = None,
) -> StoreSizes:
    """Sizes given explicitly win; then the geometry the writer recorded in ``config/``;
    then what the files on disk say (an index file's size read at RocketMQ's four entries
    per slot, when neither index flag is given); then RocketMQ's defaults."""
    paths = StorePaths(root)
    defaults = StoreSizes()
    recorded = read_geometry(paths.config)
    if recorded is not None:
        return StoreSizes(
            commitlog_file_size_bytes=commitlog_file_size_bytes or recorded.commitlog_file_size_bytes,
            cq_file_units=cq_file_units or recorded.cq_file_units,
            index_slots=index_slots or recorded.index_slots,
            index_entries=index_entries or recorded.index_entries,
        )
    if index_slots is None and index_entries is None:
        index_bytes = infer_index_file_size(paths.index)
        inferred = None if index_bytes is None else infer_index_geometry(index_bytes)
        if inferred is not None:
            index_slots, index_entries = inferred
    return StoreSizes(
        commitlog_file_size_bytes=commitlog_file_size_bytes
        or infer_commitlog_file_size(paths.commitlog)
        or defaults.commitlog_file_size_bytes,
        cq_file_units=cq_file_units or infer_file_units(paths.consumequeue) or defaults.cq_file_units,
        index_slots=index_slots or defaults.index_slots,
        index_entries=index_entries or defaults.index_entries,
    )


@dataclass(frozen=True, slots=True)
class RequestedSizes:
    """Sizes a caller asks for (the ``--commitlog-file-size``, ``--cq-file-units``,
    ``--index-slots`` and ``--index-entries`` options), each None to take the store's own."""

    commitlog_file_size_bytes: int | None = None
    cq_file_units: int | None = None
    index_slots: int | None = None
    index_entries: int | None = None


def checked_sizes(root: str, requested: RequestedSizes, *, reads_index: bool = True) -> StoreSizes:
    """The store's sizes (:func:`resolve_sizes`), refused with InvalidArgument when the
    first file of a kind is of another size: wrong sizes are the caller's mistake, not the
    data disagreeing. ``reads_index``: whether the caller reads the index files (else
    theirs are not checked)."""
    sizes = resolve_sizes(
        root,
        commitlog_file_size_bytes=requested.commitlog_file_size_bytes,
        cq_file_units=requested.cq_file_units,
        index_slots=requested.index_slots,
        index_entries=requested.index_entries,
    )
    paths = StorePaths(root)
    log_file = _first_file(paths.commitlog, lambda name: len(name) == 20 and name.isdigit())
    if log_file is not None and os.path.getsize(log_file) != sizes.commitlog_file_size_bytes:
        raise InvalidArgument(
            f"commit log file {log_file} is {os.path.getsize(log_file)} bytes, not {sizes.commitlog_file_size_bytes}; "
            "pass the store's --commitlog-file-size"
        )
    queue_file = _first_queue_file(paths.consumequeue)
    queue_bytes = sizes.cq_file_units * cq.UNIT_SIZE
    if queue_file is not None and os.path.getsize(queue_file) != queue_bytes:
        raise InvalidArgument(
            f"consume queue file {queue_file} is {os.path.getsize(queue_file)} bytes, but {sizes.cq_file_units} units "
            f"make {queue_bytes}; pass the store's --cq-file-units"
        )
    index_file = _first_file(paths.index, ix.is_file_name) if reads_index else None
    index_bytes = ix.file_size(sizes.index_slots, sizes.index_entries)
    if index_file is not None and os.path.getsize(index_file) != index_bytes:
        raise InvalidArgument(
            f"index file {index_file} is {os.path.getsize(index_file)} bytes, but {sizes.index_slots} slots and "
            f"{sizes.index_entries} entries make {index_bytes}; pass the store's --index-slots and --index-entries"
        )
    return sizes


def _first_file(directory: str, named: Callable[[str], bool]) -> str | None:
    try:
        names = sorted(name for name in os.listdir(directory) if named(name))
    except (FileNotFoundError, NotADirectoryError):
        return None
    return os.path.join(directory, names[0]) if names else None


def _first_queue_file(root: str) -> str | None:
    for dirpath, dirnames, names in os.walk(root):
        dirnames.sort()
        files = sorted(name for name in names if len(name) == 20 and name.isdigit())
        if files:
            return os.path.join(dirpath, files[0])
    return None


def geometry_of(sizes: StoreSizes) -> Geometry:
    return Geometry(sizes.commitlog_file_size_bytes, sizes.cq_file_units, sizes.index_slots, sizes.index_entries)


# A queue's share of a dispatch batch up to this many units is written from the batch's
# bytes; more go through arrays (append_units), which cost less per unit but more to set up.
SMALL_QUEUE_RUN_UNITS = 16


class Dispatcher:
    """Applies dispatch plans to a writable set of consume queues and an index."""

    def __init__(
        self,
        queues: ConsumeQueueSet,
        index: IndexFileList | None,
        delay_levels_ms: dict[int, int] = DEFAULT_DELAY_LEVELS_MS,
    ):
        self.queues = queues
        self.index = index
        self.delay_levels_ms = delay_levels_ms
        self.last_dispatched_timestamp_ms = 0

    def dispatch(self, record: Record) -> DispatchPlan:
        plan = plan_dispatch(record, self.delay_levels_ms)
        self.apply(plan)
        return plan

    def apply(self, plan: DispatchPlan) -> None:
        if plan.has_unit:
            queue = self.queues.get(plan.topic, plan.queue_id)
            queue.append(plan.queue_offset, cq.encode_unit(plan.commitlog_offset, plan.size, plan.tags_code))
            self.last_dispatched_timestamp_ms = plan.store_timestamp_ms
        if self.index is not None:
            self.index.build_index(plan)

    def dispatch_columns(self, batches: Iterable[RecordColumns]) -> int:
        """Dispatch bulk-decoded records (a ``ColumnScan``); returns the count."""
        count = 0
        for columns in batches:
            self.dispatch_batch(DispatchBatch.of_columns(columns, self.delay_levels_ms))
            count += columns.rows
        return count

    def dispatch_batch(self, batch: DispatchBatch) -> None:
        """Dispatch consecutive records at once: each queue's new units in one write,
        the index keys through :meth:`IndexFileList.build_index_batch`. The bytes are
        those of :meth:`dispatch` called per record."""
        if not len(batch):
            return
        if len(batch) < SMALL_BATCH_RECORDS and batch.key_hashes is None:
            self._dispatch_one_by_one(batch)
            return
        if not self._append_queue_blocks(batch):
            self._append_queue_units(batch)
        for position in range(len(batch) - 1, -1, -1):
            if batch.has_unit[position]:
                self.last_dispatched_timestamp_ms = batch.store_timestamps_ms[position]
                break
        if self.index is not None:
            self.index.build_index_batch(batch)

    def _append_queue_blocks(self, batch: DispatchBatch) -> bool:
        """Each queue's units of the batch in one write of bytes grouped in one pass
        (cq.queue_unit_blocks), when every record has a unit and every queue's share
        continues it at its end: a writer's batch, whose queue offsets it numbered itself.
        False, with nothing written, for any other batch."""
        if not all(batch.has_unit):
            return False
        blocks = cq.queue_unit_blocks(
            batch.topics, batch.queue_ids, batch.queue_offsets, batch.commitlog_offsets, batch.sizes, batch.tags_codes
        )
        if blocks is None:
            return False
        queues = [self.queues.get(topic, queue_id) for topic, queue_id, _, _, _ in blocks]
        if not all(queue.continues_at(first) for queue, (_, _, first, _, _) in zip(queues, blocks)):
            return False  # a new queue, a gap, units already there: the general path decides
        offsets, sizes = batch.commitlog_offsets, batch.sizes
        for queue, (_, _, first, last, units) in zip(queues, blocks):
            queue.append_block(first, units, offsets[last] + sizes[last])
        return True

    def _append_queue_units(self, batch: DispatchBatch) -> None:
        """Each queue's units of the batch, found and written with array operations."""
        units = np.empty(len(batch), dtype=UNIT_DTYPE)
        units["commitlog_offset"] = batch.commitlog_offsets
        units["size"] = batch.sizes
        units["tags_code"] = batch.tags_codes
        queue_offsets = np.asarray(batch.queue_offsets, np.int64)
        raw = units.tobytes()
        for topic, queue_id, positions in batch.queue_groups():
            queue = self.queues.get(topic, queue_id)
            if len(positions) <= SMALL_QUEUE_RUN_UNITS:
                # A few units (a group commit's, spread over the queues): the queue's
                # next ones go in one write of their bytes, without arrays of their own.
                picked = positions.tolist()
                first, last = int(queue_offsets[picked[0]]), picked[-1]
                if int(queue_offsets[last]) - first == len(picked) - 1 and queue.continues_at(first):
                    block = b"".join([raw[at * cq.UNIT_SIZE : (at + 1) * cq.UNIT_SIZE] for at in picked])
                    queue.append_block(first, block, int(batch.commitlog_offsets[last]) + int(batch.sizes[last]))
                    continue
            queue.append_units(queue_offsets[positions], units[positions])

    def _dispatch_one_by_one(self, batch: DispatchBatch) -> None:
        """A few records: the array set-up would cost more than it saves."""
        first_key = 0
        for record in range(len(batch)):
            self.apply(
                DispatchPlan(
                    batch.topics[record], batch.queue_ids[record], batch.queue_offsets[record],
                    batch.commitlog_offsets[record], batch.sizes[record], batch.store_timestamps_ms[record],
                    batch.tags_codes[record], batch.has_unit[record], batch.index_keys_of(record, first_key),
                )
            )
            first_key += batch.key_counts[record]

    def flush(self) -> None:
        self.queues.flush()
        if self.index is not None:
            self.index.flush()


@dataclass(frozen=True, slots=True)
class ReindexResult:
    records: int
    stop: ScanStop


def reindex(
    source_root: str,
    out_root: str,
    sizes: StoreSizes,
    *,
    zone: dt.tzinfo | None = None,
) -> ReindexResult:
    """Rebuild ``consumequeue/`` and ``index/`` under ``out_root`` from the commit log of
    ``source_root`` through the one dispatch definition, up to the end of its valid
    records. The result says how many records went in and where the log ended."""
    source = StorePaths(source_root)
    out = StorePaths(out_root)
    for existing in (out.consumequeue, out.index):
        if os.path.exists(existing) and os.listdir(existing):
            raise InvalidArgument(f"{existing} already exists and is not empty")
    log = CommitLog(source.commitlog, sizes.commitlog_file_size_bytes)
    queues = ConsumeQueueSet(out.consumequeue, sizes.cq_file_units, writable=True)
    index = IndexFileList(out.index, sizes.index_slots, sizes.index_entries, writable=True, zone=zone)
    dispatcher = Dispatcher(queues, index)
    try:
        scan = ColumnScan(log, log.min_offset, log.max_file_offset)
        count = dispatcher.dispatch_columns(scan)
        dispatcher.flush()
    finally:
        log.close()
        queues.close()
        index.close()
    # A scan to the end of the last file always stops before it: at the end of the data.
    assert scan.stop is not None
    return ReindexResult(count, scan.stop)
