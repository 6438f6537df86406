"""Planning a read of commit logs: byte ranges of one file each, starting at record starts.

A split is a range ``[start, stop)`` of one commit log file; a scan of it
(``CommitLog.records(start, stop=stop)``) decodes its records with the store library and
its recovery contract. By default a file is one split. A file is cut into pieces when it is
larger than ``max_partition_bytes``, or when the read covers fewer files than
``min_partitions`` (then the data is cut into about that many pieces). Two ways to cut:

* **unfiltered reads** search forward from each cut target for a record start: a v1/v2
  magic code whose PHYSICALOFFSET field holds its own position and which decodes with a
  good CRC (``CommitLog.read``). A body could, in principle, hold bytes that pass this
  test, so every piece that ends at a cut checks that its last record ends exactly there
  (:func:`check_cut`): by induction from the file's start, every cut is then a real record
  start, or the read fails — it is never silently wrong;
* **reads with a time filter** walk the file's record headers (sizes, flags and store
  times, no decoding), which gives exact cuts and each piece's exact store-time range: a
  piece or a whole file whose records are all outside the filter is not read.

The bytes after the last record are not scanned when they, and every later file, hold only
zeros: that is the end of the log, where a scan would stop with nothing to report.
Otherwise the last piece runs to the file's end and its scan classifies them (torn tail or
corruption) exactly as a single-process scan does.
"""

from __future__ import annotations

import itertools
import math
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from rmqstore.common.codec import sysflag
from rmqstore.common.codec.record import (
    MAGIC_V1,
    MAGIC_V2,
    OFFSET_BORN_HOST,
    OFFSET_PHYSICAL_OFFSET,
    Record,
)
from rmqstore.common.errors import Corruption, InvalidArgument, NotFound
from rmqstore.common.files.commitlog import CommitLog
from rmqstore.common.files.directories import existing_store
from rmqstore.common.files.mapped import MappedFile
from rmqstore.common.files.store import StorePaths, infer_commitlog_file_size, resolve_sizes

DEFAULT_MAX_PARTITION_BYTES = 256 * 1024 * 1024
MIN_PARTITION_BYTES = 64 * 1024
TIME_MIN_MS = -(2**63)
TIME_MAX_MS = 2**63 - 1
# A record start lies within any stretch of records longer than the largest record.
CUT_SEARCH_BYTES = 64 * 1024 * 1024
_CUT_PROBE_BYTES = 64 * 1024
_SIZE_MAGIC = struct.Struct(">ii")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_MAGIC_BYTES = (struct.pack(">i", MAGIC_V1), struct.pack(">i", MAGIC_V2))
# STORETIMESTAMP follows BORNHOST, whose width (address + int32 port) the sysFlag gives
# (codec/record.py's layout: ``48+b STORETIMESTAMP``).
_STORE_TIMESTAMP_AT = {False: OFFSET_BORN_HOST + 4 + 4, True: OFFSET_BORN_HOST + 16 + 4}
_OFFSET_SYSFLAG = 36
_HEADER_BYTES = _STORE_TIMESTAMP_AT[True] + 8


@dataclass(frozen=True, slots=True)
class TimeRange:
    """Inclusive bounds on store time (epoch ms)."""

    begin_ms: int = TIME_MIN_MS
    end_ms: int = TIME_MAX_MS

    @property
    def is_all(self) -> bool:
        return self.begin_ms <= TIME_MIN_MS and self.end_ms >= TIME_MAX_MS

    @property
    def is_empty(self) -> bool:
        return self.begin_ms > self.end_ms

    def overlaps(self, low_ms: int, high_ms: int) -> bool:
        return low_ms <= self.end_ms and high_ms >= self.begin_ms


@dataclass(frozen=True, slots=True)
class Split:
    """``[start, stop)`` of one commit log file of one store.

    ``walked`` splits know how many records their headers hold and the exact range of
    their store times. ``cut_end``: ``stop`` is a cut found by searching, which the scan
    must confirm (:func:`check_cut`).
    """

    store: str
    file_size_bytes: int
    start: int
    stop: int
    walked: bool = False
    records: int = 0
    min_store_timestamp_ms: int = TIME_MAX_MS
    max_store_timestamp_ms: int = TIME_MIN_MS
    cut_end: bool = False

    def may_hold(self, times: TimeRange) -> bool:
        """False only when no record of the split can be in ``times``."""
        if not self.walked:
            return True
        return self.records > 0 and times.overlaps(self.min_store_timestamp_ms, self.max_store_timestamp_ms)


def check_end(split: Split, records: Iterable[Record]) -> Iterator[Record]:
    """Pass the scan's records through, then :func:`check_cut` where the last one ends."""
    last_end = split.start
    for record in records:
        last_end = record.next_offset
        yield record
    check_cut(split, last_end)


def check_cut(split: Split, last_end: int) -> None:
    """If the split ends at a searched cut and its scan got there (its last record ends at
    ``last_end``), that record must end exactly at the cut."""
    if split.cut_end and last_end > split.stop:
        raise Corruption(
            f"commit log offset {split.stop} looked like a record start but lies inside the record that "
            f"ends at {last_end}; read with minPartitions=1 and maxPartitionBytes above the file size to keep files whole",
            offset=split.stop,
        )


@dataclass(slots=True)
class _Walk:
    """Record starts of one file and their store times, in order."""

    offsets: list[int] = field(default_factory=list)
    times_ms: list[int] = field(default_factory=list)
    data_end: int = 0  # one past the last record walked


def store_root(path: str, option: str = "store directory") -> str:
    """The store directory ``path`` names (the shared check,
    common.files.directories.existing_store); a clear error if it is not one or has no
    commit log yet."""
    existing_store(path, option)
    if not os.path.isdir(StorePaths(path).commitlog):
        raise InvalidArgument(f"{option} {path}: the store has no commit log yet (no commitlog/)")
    return path


def commitlog_file_size(root: str, given: int | None = None) -> int:
    """The commit log file size: given, else the files' own size, else RocketMQ's default."""
    if given:
        return given
    return infer_commitlog_file_size(StorePaths(root).commitlog) or resolve_sizes(root).commitlog_file_size_bytes


def _walk(mapped: MappedFile) -> _Walk:
    """``CommitLog.headers`` over one file, with each record's store time: sizes, magic
    codes and flags only, no decoding; it stops at the first header that is not a record's
    (a BLANK, zeros, or anything else — the scan says which)."""
    walk = _Walk(data_end=mapped.start_offset)
    buf = mapped.buf
    base = mapped.start_offset
    end = mapped.file_size_bytes
    size_magic = _SIZE_MAGIC.unpack_from
    int32 = _INT32.unpack_from
    int64 = _INT64.unpack_from
    at_v4, at_v6 = _STORE_TIMESTAMP_AT[False], _STORE_TIMESTAMP_AT[True]
    offsets, times = walk.offsets, walk.times_ms
    position = 0
    while position + _HEADER_BYTES <= end:
        size, magic = size_magic(buf, position)
        if (magic != MAGIC_V1 and magic != MAGIC_V2) or size < _HEADER_BYTES or position + size > end:
            break
        (flags,) = int32(buf, position + _OFFSET_SYSFLAG)
        offsets.append(base + position)
        times.append(int64(buf, position + (at_v6 if flags & sysflag.BORNHOST_V6 else at_v4))[0])
        position += size
    walk.data_end = base + position
    return walk


def _data_end(log: CommitLog, mapped: MappedFile) -> int:
    """One past the last non-zero byte of ``mapped`` when only zeros follow it in the log
    (its last file with data), else the file's end. (``MappedFile.last_nonzero_position``
    skips a file's unallocated tail and compares zero chunks in C.)"""
    later = log.files.files[log.files.index_of(mapped) + 1 :]
    if any(item.last_nonzero_position(0) for item in later):
        return mapped.end_offset
    return mapped.start_offset + mapped.last_nonzero_position(0)


def _record_start(log: CommitLog, mapped: MappedFile, target: int, limit: int) -> int | None:
    """The first offset in [target, limit) where a record that decodes starts: its magic
    code, its PHYSICALOFFSET equal to its position, its CRC good."""
    base = mapped.start_offset
    low = target - base
    high = min(limit - base, low + CUT_SEARCH_BYTES, mapped.file_size_bytes)
    probe = _CUT_PROBE_BYTES
    scanned = low
    while scanned < high:
        window_end = min(high, scanned + probe)
        window = mapped.buf[scanned : min(window_end + 8, mapped.file_size_bytes)].tobytes()
        candidates = []
        for magic in _MAGIC_BYTES:
            at = window.find(magic)
            while at != -1:
                start = scanned + at - 4
                if low <= start < window_end:
                    candidates.append(start)
                at = window.find(magic, at + 1)
        for start in sorted(candidates):
            if start + OFFSET_PHYSICAL_OFFSET + 8 > mapped.file_size_bytes:
                continue
            (physical,) = _INT64.unpack_from(mapped.buf, start + OFFSET_PHYSICAL_OFFSET)
            if physical != base + start:
                continue
            try:
                log.read(base + start)
            except (Corruption, NotFound):
                continue
            return base + start
        scanned = window_end
        probe *= 4
    return None


def _searched_pieces(root: str, file_size: int, log: CommitLog, mapped: MappedFile, end: int, count: int) -> list[Split]:
    cuts = [mapped.start_offset]
    for number in range(1, count):
        target = mapped.start_offset + (end - mapped.start_offset) * number // count
        if target <= cuts[-1]:
            continue
        found = _record_start(log, mapped, target, end)
        if found is not None and found > cuts[-1]:
            cuts.append(found)
    cuts.append(end)
    last = len(cuts) - 2
    return [
        Split(root, file_size, start, stop, cut_end=number < last)
        for number, (start, stop) in enumerate(itertools.pairwise(cuts))
        if stop > start
    ]


def _walked_pieces(root: str, file_size: int, mapped: MappedFile, walk: _Walk, end: int, count: int) -> list[Split]:
    cuts = [mapped.start_offset]
    data = walk.data_end - mapped.start_offset
    position = 0
    for number in range(1, count):
        target = mapped.start_offset + data * number // count
        while position < len(walk.offsets) and walk.offsets[position] < target:
            position += 1
        if position < len(walk.offsets) and walk.offsets[position] > cuts[-1]:
            cuts.append(walk.offsets[position])
    cuts.append(end)
    splits = []
    index = 0
    for start, stop in itertools.pairwise(cuts):
        low, high, records = TIME_MAX_MS, TIME_MIN_MS, 0
        while index < len(walk.offsets) and walk.offsets[index] < stop:
            stamp = walk.times_ms[index]
            low, high = min(low, stamp), max(high, stamp)
            records += 1
            index += 1
        if stop > start:
            splits.append(Split(root, file_size, start, stop, True, records, low, high))
    return splits


def plan(
    roots: Iterable[str],
    *,
    file_size_bytes: int | None = None,
    max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES,
    min_partitions: int = 1,
    times: TimeRange = TimeRange(),
    offsets: tuple[int, int] | None = None,
) -> list[Split]:
    """The splits of the stores' commit logs, in order, that may hold records in ``times``
    and in the half-open commit log range ``offsets``."""
    if max_partition_bytes < MIN_PARTITION_BYTES:
        raise InvalidArgument(f"maxPartitionBytes must be at least {MIN_PARTITION_BYTES}, got {max_partition_bytes}")
    if times.is_empty or (offsets is not None and offsets[0] >= offsets[1]):
        return []
    logs: list[tuple[str, int, CommitLog]] = []
    try:
        for root in roots:
            store_root(root)
            file_size = commitlog_file_size(root, file_size_bytes)
            logs.append((root, file_size, CommitLog(StorePaths(root).commitlog, file_size)))
        files = []
        for root, file_size, log in logs:
            for mapped in log.files:
                if offsets is not None and (mapped.end_offset <= offsets[0] or mapped.start_offset >= offsets[1]):
                    continue
                end = _data_end(log, mapped)
                if end == mapped.start_offset:
                    continue  # only zeros from here on: the end of this log
                files.append((root, file_size, log, mapped, end))
        data_bytes = sum(end - mapped.start_offset for _, _, _, mapped, end in files)
        piece_bytes = max(MIN_PARTITION_BYTES, min(max_partition_bytes, math.ceil(data_bytes / max(min_partitions, 1))))
        splits: list[Split] = []
        for root, file_size, log, mapped, end in files:
            count = math.ceil((end - mapped.start_offset) / piece_bytes)
            if times.is_all:
                splits.extend(
                    piece
                    for piece in _searched_pieces(root, file_size, log, mapped, end, count)
                    if offsets is None or (piece.stop > offsets[0] and piece.start < offsets[1])
                )
                continue
            walk = _walk(mapped)
            for piece in _walked_pieces(root, file_size, mapped, walk, end, count):
                if offsets is not None and (piece.stop <= offsets[0] or piece.start >= offsets[1]):
                    continue
                if piece.may_hold(times):
                    splits.append(piece)
        return splits
    finally:
        for _, _, log in logs:
            log.close()
