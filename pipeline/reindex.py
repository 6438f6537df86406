"""``rmqstore pipeline reindex``: consume queues and index files rebuilt by Spark.

The output is byte-identical to the single-process ``reindex`` (``files/store.py``), and
so to Apache's files, index file names aside (they come from record times, as there). The
work is cut where the one dispatch definition allows:

1. **dispatch** (one task per commit log split, in parallel): decode the records in bulk
   (``ColumnScan``) and plan them with ``DispatchBatch.of_columns`` (``plan_dispatch``'s
   rules over columns, index key hashes included); the plans go to an
   Arrow file per split. Each split also reports
   where and why its scan stopped, so the end of the log (and a corruption in the middle)
   is the one a single scan from the start finds: nothing after the first stop counts.
2. **index files** — the chains are order-dependent, so entry numbers are global: a
   record's keys are numbered after every key before it in commit log order (a prefix sum
   over the splits' key counts), and file *k* holds entries ``k·(M−1)`` to
   ``(k+1)·(M−1) − 1`` for M entries per file. Which record opens each file, and so its
   name and the end of the file before it, is read off the split that holds the boundary;
   the driver then creates the files in order (``IndexFile.create``, names strictly
   increasing, as ``IndexFileList`` does).
3. **writing** (one Spark job): a task per index file puts its entries in number order
   with ``IndexFile.put_keys``; meanwhile tasks over groups of queues append each queue's
   units in commit log order with ``ConsumeQueue.append`` — the single-process order for
   that queue.

Like the single-process reindex this refuses a non-empty ``consumequeue/`` or ``index/``
under OUT. OUT must be a directory the driver and every executor see at the same path: the
per-split files live in a hidden directory under it until the job ends.
"""

from __future__ import annotations

import bisect
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from rmqstore.common.codec import index as ix
from rmqstore.common.codec.dispatch import DispatchBatch
from rmqstore.common.errors import Corruption, InvalidArgument, invariant
from rmqstore.common.files.commitlog import CommitLog, ScanStop, StopReason
from rmqstore.common.files.consumequeue import UNIT_DTYPE, ConsumeQueue
from rmqstore.common.files.index import IndexFile
from rmqstore.common.files.scan import ColumnScan
from rmqstore.common.files.store import StorePaths, StoreSizes
from rmqstore.common.sequences import numbered
from rmqstore.pipeline import splits as planning
from rmqstore.pipeline.export import pieces_for
from rmqstore.pipeline.progress import Progress
from rmqstore.pipeline.splits import Split

REACHED = "reached"  # the split's scan got to its stop: the log goes on


@dataclass(frozen=True, slots=True)
class ReindexSummary:
    records: int
    stop: ScanStop
    queues: int
    units: int
    index_files: list[str]
    index_keys: int


@dataclass(frozen=True, slots=True)
class SplitResult:
    """What dispatching one split found."""

    split: int
    path: str  # its plans, an Arrow file
    stop_reason: str
    stop_offset: int
    stop_error: str | None  # the Corruption that stopped the scan, as text
    dropped_bytes: int
    records: int
    keys: int
    first_ts: int | None
    queues: dict[tuple[str, int], int]  # units per queue


def check_output(out_root: str) -> None:
    out = StorePaths(out_root)
    for existing in (out.consumequeue, out.index):
        if os.path.exists(existing) and os.listdir(existing):
            raise InvalidArgument(f"{existing} already exists and is not empty")


def _plans_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("commitlog_offset", pa.int64()),
            ("size", pa.int32()),
            ("store_ts", pa.int64()),
            ("topic", pa.string()),
            ("queue_id", pa.int32()),
            ("queue_offset", pa.int64()),
            ("tags_code", pa.int64()),
            ("has_unit", pa.bool_()),
            ("key_hashes", pa.list_(pa.int32())),
        ]
    )


def dispatch_split(number: int, split: Split, work: str) -> SplitResult:
    """Plan every record of ``split`` into ``work/split-N.arrow``; say how the scan ended."""
    import pyarrow as pa

    schema = _plans_schema()
    path = os.path.join(work, f"split-{number:06d}.arrow")
    log = CommitLog(StorePaths(split.store).commitlog, split.file_size_bytes)
    records_total = keys_total = 0
    first_ts: int | None = None
    queues: dict[tuple[str, int], int] = {}
    try:
        scan = ColumnScan(log, split.start, split.stop)
        last_end = split.start
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            for decoded in scan:
                last_end = int(decoded.commitlog_offset[-1]) + int(decoded.size[-1])
                batch = DispatchBatch.of_columns(decoded)
                if first_ts is None:
                    first_ts = batch.store_timestamps_ms[0]
                for topic, queue_id, positions in batch.queue_groups():
                    queues[(topic, queue_id)] = queues.get((topic, queue_id), 0) + len(positions)
                hash_ends = np.zeros(len(batch) + 1, np.int32)
                np.cumsum(batch.key_counts, out=hash_ends[1:])
                records_total += len(batch)
                keys_total += int(hash_ends[-1])
                # The record fields as decoded (one plan per record, in order); topics
                # through their few distinct values.
                distinct, numbers = numbered(batch.topics)
                columns = (
                    decoded.commitlog_offset,
                    decoded.size,
                    decoded.store_timestamp_ms,
                    pa.DictionaryArray.from_arrays(pa.array(numbers, pa.int32()), pa.array(distinct, pa.string())),
                    decoded.queue_id,
                    decoded.queue_offset,
                    np.asarray(batch.tags_codes, np.int64),
                    np.asarray(batch.has_unit, bool),
                )
                arrays = [pa.array(values).cast(field.type) for values, field in zip(columns, schema)]
                arrays.append(pa.ListArray.from_arrays(pa.array(hash_ends), pa.array(batch.index_hashes(), pa.int32())))
                writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=schema))
        planning.check_cut(split, last_end)
    finally:
        log.close()
    stop = scan.stop
    return SplitResult(
        split=number,
        path=path,
        stop_reason=REACHED if stop is None else stop.reason.value,
        stop_offset=split.stop if stop is None else stop.end_offset,
        stop_error=None if stop is None or stop.error is None else str(stop.error),
        dropped_bytes=0 if stop is None else stop.dropped_bytes,
        records=records_total,
        keys=keys_total,
        first_ts=first_ts,
        queues=queues,
    )


def _read_plans(path: str, columns: list[str]) -> Any:
    import pyarrow as pa

    with pa.memory_map(path) as source:
        return pa.ipc.open_file(source).read_all().select(columns).combine_chunks()


def _log_end(results: list[SplitResult], splits: list[Split], log_start: int) -> tuple[ScanStop, int]:
    """Where a scan of the whole log from its start stops, and how many splits lie at or
    before that point (only their records are dispatched)."""
    for result in results:
        if result.stop_reason != REACHED:
            reason = StopReason(result.stop_reason)
            error = None if result.stop_error is None else Corruption(result.stop_error, offset=result.stop_offset)
            return ScanStop(result.stop_offset, reason, error, result.dropped_bytes), result.split + 1
    return ScanStop(splits[-1].stop if splits else log_start, StopReason.END), len(splits)


def run(spark: Any, store: str, out: str, sizes: StoreSizes, *, progress: Progress | None = None) -> ReindexSummary:
    """Rebuild ``consumequeue/`` and ``index/`` under ``out`` from ``store``'s commit log."""
    progress = progress or Progress(spark, enabled=False)
    planning.store_root(store)
    check_output(out)
    context = spark.sparkContext
    with progress.phase("planning splits"):
        wave = pieces_for(spark)  # tasks that run at once
        plan = planning.plan([store], file_size_bytes=sizes.commitlog_file_size_bytes, min_partitions=wave)
        log = CommitLog(StorePaths(store).commitlog, sizes.commitlog_file_size_bytes)
        log_start = log.min_offset
        log.close()
    os.makedirs(out, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".rmqstore-reindex-", dir=out)
    try:
        with progress.phase(f"dispatching {len(plan)} commit log split(s)"):
            results = sorted(
                context.parallelize(list(range(len(plan))), max(len(plan), 1))
                .map(lambda number: dispatch_split(number, plan[number], work))
                .collect(),
                key=lambda result: result.split,
            )
        stop, live = _log_end(results, plan, log_start)
        counted = results[:live]
        names = _create_index_files(counted, out, sizes)
        queues: dict[tuple[str, int], int] = {}
        for result in counted:
            for key, units in result.queues.items():
                queues[key] = queues.get(key, 0) + units
        # The index files' tasks, and the queues dealt into the rest of one wave (each task
        # costs its own start: PIECES_PER_CORE).
        index_tasks = [("index", numbers) for numbers in _index_ranges(len(names), wave)]
        queue_groups = _queue_groups(queues, max(1, wave - len(index_tasks)))
        tasks = index_tasks + [("queues", group) for group in queue_groups]
        paths = [result.path for result in counted]
        bases = _key_bases(counted)
        key_counts = [result.keys for result in counted]
        with progress.phase(f"writing {len(queues)} consume queue(s) and {len(names)} index file(s)"):
            if tasks:
                written = (
                    context.parallelize(tasks, len(tasks))
                    .map(lambda task: _write(task, paths, bases, key_counts, names, out, sizes))
                    .collect()
                )
            else:
                written = []
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return ReindexSummary(
        records=sum(result.records for result in counted),
        stop=stop,
        queues=len(queues),
        units=sum(count for kind, count in written if kind == "queues"),
        index_files=names,
        index_keys=sum(count for kind, count in written if kind == "index"),
    )


def _key_bases(counted: list[SplitResult]) -> list[int]:
    """The global number (from 0) of each split's first index key."""
    bases, total = [], 0
    for result in counted:
        bases.append(total)
        total += result.keys
    return bases


def _queue_groups(queues: dict[tuple[str, int], int], groups: int) -> list[list[tuple[str, int]]]:
    """Queues dealt into about ``groups`` groups of similar unit counts, largest first."""
    buckets: list[tuple[int, list[tuple[str, int]]]] = [(0, []) for _ in range(max(1, min(groups, len(queues))))]
    for key, units in sorted(queues.items(), key=lambda item: (-item[1], item[0])):
        total, members = min(buckets, key=lambda bucket: bucket[0])
        buckets.remove((total, members))
        members.append(key)
        buckets.append((total + units, members))
    return [sorted(members) for _, members in buckets if members]


def _create_index_files(counted: list[SplitResult], out: str, sizes: StoreSizes) -> list[str]:
    """Create, empty and in order, every index file the dispatch creates: the first at the
    first record, file k+1 when a record is dispatched after file k is full (the record
    that puts file k's last key, if it has more, else the record after it) — named by that
    record's store time and starting at file k's end."""
    import pyarrow.compute as pc

    live = [result for result in counted if result.records]
    if not live:
        return []
    per_file = sizes.index_entries - 1
    bases = _key_bases(counted)
    keys_total = sum(result.keys for result in counted)
    starts = [bases[result.split] for result in live]
    opened: list[tuple[int, int, int]] = [(live[0].first_ts or 0, 0, 0)]  # (stamp, prev end offset, prev end ts)
    for number in range(1, keys_total // per_file + 1):
        last_entry = number * per_file - 1  # of file number − 1
        holder = live[bisect.bisect_right(starts, last_entry) - 1]
        table = _read_plans(holder.path, ["commitlog_offset", "store_ts", "key_hashes"])
        parents = pc.list_parent_indices(table.column("key_hashes")).to_pylist()
        local = last_entry - bases[holder.split]
        row = parents[local]
        end_offset = table.column("commitlog_offset")[row].as_py()
        end_ts = table.column("store_ts")[row].as_py()
        if local + 1 < len(parents) and parents[local + 1] == row:
            stamp = end_ts  # the same record goes on into the next file
        elif row + 1 < table.num_rows:
            stamp = table.column("store_ts")[row + 1].as_py()
        else:
            later = [result for result in live if result.split > holder.split]
            if not later:
                break  # the log ends right after the key that filled the last file
            stamp = later[0].first_ts or 0
        opened.append((stamp, end_offset, end_ts))
    directory = StorePaths(out).index
    os.makedirs(directory, exist_ok=True)
    names: list[str] = []
    for stamp, prev_end_offset, prev_end_ts in opened:
        stamp = max(stamp, 0)
        name = ix.file_name(stamp)
        while names and name <= names[-1]:
            stamp += 1
            name = ix.file_name(stamp)
        IndexFile.create(
            os.path.join(directory, name),
            sizes.index_slots,
            sizes.index_entries,
            prev_end_phy_offset=prev_end_offset,
            prev_end_timestamp_ms=prev_end_ts,
        ).close()
        names.append(name)
    return names


def _write(
    task: tuple[str, Any], paths: list[str], bases: list[int], key_counts: list[int], names: list[str], out: str, sizes: StoreSizes
) -> tuple[str, int]:
    kind, what = task
    if kind == "index":
        return kind, _write_index_files(what, paths, bases, key_counts, names, out, sizes)
    return kind, _write_queues(what, paths, out, sizes)


def _index_ranges(files: int, tasks: int) -> list[range]:
    """Consecutive index file numbers in about ``tasks`` ranges (every file but the last
    holds the same number of entries)."""
    step = max(1, -(-files // max(tasks, 1)))
    return [range(first, min(first + step, files)) for first in range(0, files, step)]


def _write_index_files(
    numbers: range, paths: list[str], bases: list[int], key_counts: list[int], names: list[str], out: str, sizes: StoreSizes
) -> int:
    """Put entries ``first·(M−1)`` to ``(last+1)·(M−1) − 1`` of the global sequence, in
    number order, into index files ``first`` … ``last`` (created empty by the driver)."""
    import pyarrow.compute as pc

    per_file = sizes.index_entries - 1
    first, last = numbers.start * per_file, numbers.stop * per_file
    directory = StorePaths(out).index
    current: IndexFile | None = None
    current_number = -1
    put = 0
    try:
        for path, base, count in zip(paths, bases, key_counts):
            if base + count <= first or base >= last:
                continue
            table = _read_plans(path, ["commitlog_offset", "store_ts", "key_hashes"])
            column = table.column("key_hashes")
            low, high = max(first - base, 0), min(last - base, count)
            rows = pc.list_parent_indices(column).slice(low, high - low)
            hashes = pc.list_flatten(column).slice(low, high - low).to_numpy().astype(np.int64)
            offsets = pc.take(table.column("commitlog_offset"), rows).to_numpy()
            times = pc.take(table.column("store_ts"), rows).to_numpy()
            entry = base + low
            done = 0
            while done < len(hashes):
                number = entry // per_file
                if number != current_number:
                    if current is not None:
                        current.flush()
                        current.close()
                    current = None  # closed: a failing open below must not close it again
                    current = IndexFile.open(
                        os.path.join(directory, names[number]), sizes.index_slots, sizes.index_entries, writable=True
                    )
                    current_number = number
                assert current is not None
                invariant(current.index_count == entry % per_file + 1, "index entries are put in number order")
                count = min(per_file - entry % per_file, len(hashes) - done)  # the rest of this file
                part = slice(done, done + count)
                invariant(current.put_keys(hashes[part], offsets[part], times[part]) == count, "an index file holds its number range")
                done += count
                entry += count
                put += count
        if current is not None:
            current.flush()
    finally:
        if current is not None:
            current.close()
    return put


def _write_queues(queues: list[tuple[str, int]], paths: list[str], out: str, sizes: StoreSizes) -> int:
    """Append the units of ``queues``, in commit log order, to new consume queues."""
    import pyarrow as pa
    import pyarrow.compute as pc

    wanted = pa.array([f"{topic}\x00{queue_id}" for topic, queue_id in queues], pa.string())
    opened: dict[tuple[str, int], ConsumeQueue] = {}
    written = 0
    try:
        for path in paths:
            table = _read_plans(path, ["topic", "queue_id", "queue_offset", "commitlog_offset", "size", "tags_code", "has_unit"])
            names = pc.binary_join_element_wise(table.column("topic"), pc.cast(table.column("queue_id"), pa.string()), "\x00")
            number = pc.index_in(names, value_set=wanted)  # the queue's place in ``queues``, null for others
            keep = pc.and_(table.column("has_unit"), pc.is_valid(number))
            table = table.filter(keep)
            if not table.num_rows:
                continue
            # Each queue's units in commit log order (a stable sort by queue).
            queue_number = number.filter(keep).to_numpy()
            order = np.argsort(queue_number, kind="stable")
            queue_number = queue_number[order]
            queue_offsets = table.column("queue_offset").to_numpy()[order]
            units = np.empty(len(order), dtype=UNIT_DTYPE)
            for field in ("commitlog_offset", "size", "tags_code"):
                units[field] = table.column(field).to_numpy()[order]
            bounds = np.flatnonzero(np.diff(queue_number)) + 1
            for low, high in zip([0, *bounds.tolist()], [*bounds.tolist(), len(order)]):
                topic, queue_id = queues[int(queue_number[low])]
                queue = opened.get((topic, queue_id))
                if queue is None:
                    queue = opened[(topic, queue_id)] = ConsumeQueue(
                        StorePaths(out).consumequeue, topic, queue_id, sizes.cq_file_units, writable=True
                    )
                written += queue.append_units(queue_offsets[low:high], units[low:high])
        for queue in opened.values():
            queue.flush()
    finally:
        for queue in opened.values():
            queue.close()
    return written
