"""The commit log: records appended across fixed-size files (docs/format.md §3, §3.4, §10).

Scanning follows the recovery contract:

* a record is valid if its magic, sizes and (optionally) body CRC check out and its
  PHYSICALOFFSET is where it lies; a BLANK moves to the next file;
* zeros where a record should start are the end of the log;
* an invalid record followed only by zeros is a torn tail: the clean end of the log;
* an invalid record followed by any non-zero byte is corruption, reported with its offset
  and the number of bytes a truncation there would drop.
"""

from __future__ import annotations

import bisect
import enum
import itertools
import os
import struct
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from rmqstore.common.codec import columnar
from rmqstore.common.codec import consumequeue as cq
from rmqstore.common.codec.properties import split_keys
from rmqstore.common.codec.record import (
    END_FILE_MIN_BLANK_LENGTH,
    OFFSET_BORN_HOST,
    OFFSET_SYSFLAG,
    Blank,
    Record,
    decode_record,
    encode_blank,
    patch_offsets,
    store_timestamp_at,
)
from rmqstore.common.codec.speedups import _speedups
from rmqstore.common.errors import Corruption, InvalidArgument, NotFound, invariant
from rmqstore.common.files.mapped import MappedFile, MappedFileQueue

DEFAULT_FILE_SIZE_BYTES = 1024 * 1024 * 1024
# A read through the file takes this much first (most records are smaller: one pread),
# and reads the rest of a larger record up to this size (a larger one is read through the
# mapping, which also says what is wrong with a size no record can have).
READ_AHEAD_BYTES = 1024
# a header up to STORETIMESTAMP: 48 bytes to BORNTIMESTAMP, BORNHOST (20 bytes if IPv6), 8
STORE_TIME_HEADER_BYTES_MAX = OFFSET_BORN_HOST + 20 + 8
READ_THROUGH_FILE_RECORD_BYTES_MAX = 16 * 1024 * 1024
_INT32 = struct.Struct(">i")


class StopReason(enum.Enum):
    END = "end"  # zeros, or the end of the last file: nothing more was written
    TORN = "torn"  # an invalid record followed only by zeros: an interrupted write
    CORRUPT = "corrupt"  # an invalid record with data after it


@dataclass(frozen=True, slots=True)
class ScanStop:
    """Where and why a scan of the commit log stopped."""

    end_offset: int  # one past the last valid record: where the log ends or resumes
    reason: StopReason
    error: Corruption | None = None
    dropped_bytes: int = 0  # non-zero bytes from end_offset on that a truncation drops

    @property
    def is_clean(self) -> bool:
        return self.reason is not StopReason.CORRUPT

    def describe(self) -> str:
        if self.reason is StopReason.END:
            return f"end of log at commit log offset {self.end_offset}"
        assert self.error is not None
        kind = "torn tail" if self.reason is StopReason.TORN else "corruption"
        return f"{kind} at commit log offset {self.end_offset}: {self.error} ({self.dropped_bytes} bytes after it)"


class RecordScan:
    """An iteration over commit log records that remembers why it ended."""

    def __init__(self, generator: Generator[Record, None, ScanStop | None]):
        self._generator = generator
        self.stop: ScanStop | None = None

    def __iter__(self) -> Iterator[Record]:
        self.stop = yield from self._generator


@dataclass(slots=True)
class KeyMatch:
    """The records a key lookup keeps: of ``topic``, with ``key`` among the parts of its
    KEYS, stored within [begin_ms, end_ms], and lying within [visible_begin, visible_end)."""

    topic: str
    key: str
    begin_ms: int
    end_ms: int
    visible_begin: int
    visible_end: int

    def __call__(self, record: Record) -> bool:
        return (
            record.topic == self.topic
            and self.begin_ms <= record.store_timestamp_ms <= self.end_ms
            and self.visible_begin <= record.commitlog_offset
            and record.next_offset <= self.visible_end
            and self.key in split_keys(record.keys)
        )

    def compiled(self) -> tuple[bytes, bytes, int, int, int, int] | None:
        """The compiled read_records' form, which compares bytes. None where bytes would
        not decide as texts do: a topic outside ASCII, or a key holding U+FFFD, which a
        KEYS part with invalid UTF-8 decodes to (docs/format.md §4, decoded with "replace")."""
        if not self.topic.isascii() or "\ufffd" in self.key:
            return None
        try:
            key = self.key.encode()
        except UnicodeEncodeError:  # a lone surrogate: no record's KEYS decodes to it
            return None
        return (self.topic.encode(), key, self.begin_ms, self.end_ms, self.visible_begin, self.visible_end)


def _read_records(
    mapped: MappedFile, positions: list[int], check_crc: bool, match: tuple[bytes, bytes, int, int, int, int] | None
) -> list[Record | Literal[False] | None]:
    """The compiled read_records over ``positions`` of one file: each well-formed record
    read with pread (READ_AHEAD_BYTES first) and decoded, None for anything else, False
    for a record ``match`` (KeyMatch.compiled) does not keep."""
    assert _speedups is not None
    with mapped.reading() as descriptor:
        records = _speedups.read_records(
            descriptor,
            positions,
            mapped.file_size_bytes,
            mapped.start_offset,
            READ_AHEAD_BYTES,
            check_crc,
            match,
        )
    return records  # type: ignore[no-any-return]


class CommitLog:
    """A commit log directory, read-only or writable.

    A writable log must be told where its data ends (:meth:`recover` or
    :meth:`set_write_position`) before it appends.
    """

    def __init__(self, directory: str, file_size_bytes: int = DEFAULT_FILE_SIZE_BYTES, *, writable: bool = False):
        self.directory = directory
        self.file_size_bytes = file_size_bytes
        self.writable = writable
        self.files = MappedFileQueue(directory, file_size_bytes, writable=writable)
        self.write_offset: int | None = None
        self.flushed_offset = 0
        self._dirty: set[MappedFile] = set()
        # The files being written hold a descriptor (MappedFile.hold_descriptor): the newest
        # and the one before it, whose last bytes a SYNC flush may still have to sync.
        self._held: list[MappedFile] = []
        # Read single records with pread rather than through the mappings (query nodes).
        self.read_through_file = False

    # Reading

    @property
    def min_offset(self) -> int:
        return self.files.min_offset

    def refresh(self) -> bool:
        return self.files.refresh()

    def _decode_at(self, mapped: MappedFile, position: int, check_crc: bool) -> Record | Blank | None:
        item = decode_record(
            mapped.buf, position, commitlog_offset=mapped.start_offset + position, check_crc=check_crc
        )
        if isinstance(item, Record) and item.commitlog_offset != mapped.start_offset + position:
            at = mapped.start_offset + position
            raise Corruption(
                f"record at commit log offset {at} says it is at {item.commitlog_offset}", offset=at
            )
        return item

    def read(self, offset: int, *, check_crc: bool = True) -> Record:
        """The record that starts at ``offset``. NotFound if no file holds it or no
        record starts there; Corruption if the bytes there do not decode."""
        mapped = self.files.find(offset)
        if mapped is None:
            raise NotFound(f"commit log offset {offset} is outside [{self.min_offset}, {self.max_file_offset})")
        if self.read_through_file:
            record = self._read_through_file(mapped, offset - mapped.start_offset, check_crc)
            if record is not None:
                return record
        item = self._decode_at(mapped, offset - mapped.start_offset, check_crc)
        if not isinstance(item, Record):
            raise NotFound(f"no record at commit log offset {offset}")
        return item

    def read_many(
        self, offsets: Sequence[int], *, check_crc: bool = True, match: KeyMatch | None = None
    ) -> list[Record | Literal[False] | None]:
        """:meth:`read` of each offset where it is quick: the well-formed records read
        with pread and decoded in one compiled pass (read_through_file), None for the
        rest, which the caller reads one by one (every offset is None without the
        compiled codecs or when reading through the mappings). With ``match``, a record
        read here that it does not keep is False: decided in the compiled pass where
        KeyMatch.compiled allows, so only the kept records are built."""
        if _speedups is None or not self.read_through_file or not offsets:
            return [None] * len(offsets)
        compiled = None if match is None else match.compiled()
        first = self.files.find(offsets[0])
        if first is not None and first.start_offset <= min(offsets) and max(offsets) < first.end_offset:
            # The usual case: every offset in one file.
            found = _read_records(first, [offset - first.start_offset for offset in offsets], check_crc, compiled)
        else:
            found = [None] * len(offsets)
            by_file: dict[int, list[int]] = {}
            for item, offset in enumerate(offsets):
                mapped = self.files.find(offset)
                if mapped is not None:
                    by_file.setdefault(self.files.index_of(mapped), []).append(item)
            for number, items in by_file.items():
                mapped = self.files.files[number]
                positions = [offsets[item] - mapped.start_offset for item in items]
                for item, record in zip(items, _read_records(mapped, positions, check_crc, compiled)):
                    found[item] = record
        if match is not None and compiled is None:
            return [record if record is None or record is False or match(record) else False for record in found]
        return found

    def _read_through_file(self, mapped: MappedFile, position: int, check_crc: bool) -> Record | None:
        """The well-formed record at ``position`` read with pread, or None for anything
        else, which :meth:`read` then decodes through the mapping to say what is there
        (the bytes read here may stop short of the file's end). Random lookups over a large
        log read this way: a page fault costs more than the read, and the pages would fill
        the node's resident set."""
        if _speedups is not None:
            (found,) = _read_records(mapped, [position], check_crc, None)
            return found  # type: ignore[return-value]
        data = mapped.pread(position, READ_AHEAD_BYTES)
        if len(data) < 8:
            return None
        (size,) = _INT32.unpack_from(data)
        if len(data) < size <= READ_THROUGH_FILE_RECORD_BYTES_MAX:
            data += mapped.pread(position + len(data), size - len(data))
        try:
            item = decode_record(data, 0, check_crc=check_crc)
        except Corruption:
            return None
        if not isinstance(item, Record) or item.commitlog_offset != mapped.start_offset + position:
            return None
        return item

    def store_timestamp(self, offset: int) -> int:
        """The store time of the record at ``offset``, from its header alone (time search
        probes many records and needs nothing else of them)."""
        mapped = self.files.find(offset)
        found = None
        if mapped is not None and self.read_through_file:
            found = store_timestamp_at(mapped.pread(offset - mapped.start_offset, STORE_TIME_HEADER_BYTES_MAX), 0)
        elif mapped is not None:
            found = store_timestamp_at(mapped.buf, offset - mapped.start_offset)
        if found is None:
            raise NotFound(f"no record at commit log offset {offset}")
        return found

    def first_stored_after(
        self, units: memoryview, lo: int, hi: int, first_offset: int, last_offset: int, timestamp_ms: int, strict: bool
    ) -> int | None:
        """ConsumeQueue.offset_by_time's bisection over units [lo, hi) of one consume
        queue file in one compiled pass, each record's header read with pread: the first
        unit stored at or after ``timestamp_ms`` (after it when ``strict``), ``hi`` if
        none. None without the compiled codecs, when the units' records (from
        ``first_offset`` to ``last_offset``, ascending in a queue) are not all in one log
        file, or when a probe finds no record header (the caller's Python steps then
        probe the same units and raise the exact error)."""
        if _speedups is None:
            return None
        mapped = self.files.find(first_offset)
        if mapped is None or not mapped.start_offset <= last_offset < mapped.end_offset:
            return None
        with mapped.reading() as descriptor:
            found = _speedups.first_stored_after(
                units, lo, hi, timestamp_ms, strict, descriptor, mapped.start_offset, mapped.file_size_bytes
            )
        return found  # type: ignore[no-any-return]

    def store_times_of_units(self, units: memoryview, lo: int, hi: int, out: memoryview) -> int:
        """The store time of the record of each unit in [lo, hi) of one consume queue
        file's bytes, read from its header as :meth:`store_timestamp` reads it, into
        ``out[unit - lo]`` (native int64s) in compiled passes, one per log file. Returns how
        many units from ``lo`` it read: fewer than all without the compiled codecs or at a
        unit that names no record (the caller reads that one with :meth:`store_timestamp`,
        which says what is wrong)."""
        if _speedups is None:
            return 0
        at = lo
        while at < hi:
            offset, _, _ = cq.UNIT.unpack_from(units, at * cq.UNIT_SIZE)
            mapped = self.files.find(offset)
            if mapped is None:
                break
            with mapped.reading() as descriptor, out[at - lo :] as rest:
                done = _speedups.store_times(
                    units, at, hi, descriptor, mapped.start_offset, mapped.file_size_bytes, rest
                )
            if done == 0:
                break
            at += done
        return at - lo

    @property
    def max_file_offset(self) -> int:
        last = self.files.last
        return last.end_offset if last else 0

    def records(self, start: int | None = None, *, check_crc: bool = True, stop: int | None = None) -> RecordScan:
        """Every valid record from ``start`` (a record boundary; default: the first file)
        up to the end of the log, or to ``stop``. After iteration, the scan's ``stop``
        says where and why it ended (None when ``stop`` was reached first)."""
        return RecordScan(self._records(start, check_crc, stop))

    def _records(self, start: int | None, check_crc: bool, stop: int | None) -> Generator[Record, None, ScanStop | None]:
        offset = self.min_offset if start is None else start
        while stop is None or offset < stop:
            mapped = self.files.find(offset)
            if mapped is None:
                return ScanStop(offset, StopReason.END)
            position = offset - mapped.start_offset
            try:
                item = self._decode_at(mapped, position, check_crc)
            except Corruption as error:
                return self._classify(mapped, position, error)
            if item is None:
                tail = self._classify(mapped, position, None)
                return tail
            if isinstance(item, Blank):
                offset = mapped.end_offset
                continue
            yield item
            offset = item.next_offset
        return None

    def sys_flags(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, int]:
        """The commit log offsets and sysFlags (int64 arrays) of the records that start in
        [start, stop), read from their fixed headers in bulk (the compiled walk): no
        decoding, no CRC. For records already validated (below a published progress
        offset). Also returns where the walk ended: past the last record, or at anything
        that is not one."""
        offsets: list[np.ndarray] = []
        flags: list[np.ndarray] = []
        offset = start
        while offset < stop:
            mapped = self.files.find(offset)
            if mapped is None:
                break
            walked = columnar.walk(
                mapped.buf, offset - mapped.start_offset, stop=stop - mapped.start_offset,
                rows_max=stop - offset, bytes_max=stop - offset,
            )  # fmt: skip
            if len(walked.starts):
                at = walked.starts[:, None] + np.arange(OFFSET_SYSFLAG, OFFSET_SYSFLAG + 4)
                data = np.frombuffer(mapped.buf, np.uint8)
                flags.append(np.ascontiguousarray(data[at]).view(">i4").ravel().astype(np.int64))
                offsets.append(walked.starts + mapped.start_offset)
            offset = mapped.start_offset + walked.position
            if walked.end is columnar.WalkEnd.BLANK:
                offset = mapped.end_offset
            elif walked.end is not columnar.WalkEnd.LIMIT:
                break
        empty = np.zeros(0, np.int64)
        return (np.concatenate(offsets) if offsets else empty), (np.concatenate(flags) if flags else empty), offset

    def release(self, start: int, stop: int) -> None:
        """Drop the pages holding [start, stop) from the resident set (MappedFile.release)."""
        for mapped, low, high in self._spans(start, stop):
            mapped.release(low, high)

    def _spans(self, start: int, end: int) -> list[tuple[MappedFile, int, int]]:
        """Each file holding part of [start, end), with that part's positions in it."""
        spans = []
        for mapped in list(self.files.files):
            low, high = max(start, mapped.start_offset), min(end, mapped.end_offset)
            if low < high:
                spans.append((mapped, low - mapped.start_offset, high - mapped.start_offset))
        return spans

    def scan(self, start: int | None = None, *, check_crc: bool = True) -> ScanStop:
        """Validate every record from ``start`` and say where and why the log ends."""
        records = self.records(start, check_crc=check_crc)
        for _ in records:
            pass
        invariant(records.stop is not None, "an unbounded scan ends with a ScanStop")
        assert records.stop is not None
        return records.stop

    def _classify(self, mapped: MappedFile, position: int, error: Corruption | None) -> ScanStop:
        """A bad record (or zeros) is a torn tail only if nothing but zeros follows it and
        it looks interrupted: its size is not trusted unless it fits the file, and a record
        whose last byte was written is complete, so a bad one is corruption, not a tear."""
        offset = mapped.start_offset + position
        after = position
        looks_interrupted = True
        if error is not None:
            remaining = mapped.file_size_bytes - position
            claimed = (
                int.from_bytes(mapped.buf[position : position + 4], "big", signed=True) if remaining >= 4 else 0
            )
            if END_FILE_MIN_BLANK_LENGTH <= claimed <= remaining:
                after = position + claimed
                looks_interrupted = mapped.buf[after - 1] == 0
            else:
                after = min(position + END_FILE_MIN_BLANK_LENGTH, mapped.file_size_bytes)
        data_end = self._last_data_offset(mapped, after)
        if data_end is None and looks_interrupted:
            if error is None:
                return ScanStop(offset, StopReason.END)
            own_end = mapped.last_nonzero_position(position)
            return ScanStop(offset, StopReason.TORN, error, own_end - position)
        if data_end is None:
            data_end = mapped.start_offset + mapped.last_nonzero_position(position)
        if error is None:
            error = Corruption(
                f"zeros at commit log offset {offset} where a record should start, "
                f"with data after them up to offset {data_end}",
                offset=offset,
            )
        return ScanStop(offset, StopReason.CORRUPT, error, data_end - offset)

    def _last_data_offset(self, mapped: MappedFile, position: int) -> int | None:
        """The end of the last non-zero byte at or after ``position`` in this file and the
        later ones, or None if they hold only zeros."""
        index = self.files.index_of(mapped)
        for later in reversed(self.files.files[index + 1 :]):
            end = later.last_nonzero_position(0)
            if end:
                return later.start_offset + end
        end = mapped.last_nonzero_position(position)
        return mapped.start_offset + end if end > position else None

    # Writing

    def recover_write_position(self, start: int | None = None) -> ScanStop:
        """Scan for the end, refuse corruption, cut a torn tail, and make the log writable
        from there. Mid-log corruption is raised, never silently dropped."""
        stop = self.scan(start)
        if stop.reason is StopReason.CORRUPT:
            assert stop.error is not None
            raise stop.error
        self.truncate(stop.end_offset)
        return stop

    def set_write_position(self, offset: int) -> None:
        invariant(self.writable, "only a writable commit log has a write position")
        self.write_offset = offset

    def truncate(self, offset: int) -> None:
        """Make ``offset`` the end of the log: zero what follows it in its file and delete
        the later files."""
        if not self.writable:
            raise InvalidArgument("cannot truncate a read-only commit log")
        self.files.delete_after(offset)
        mapped = self.files.find(offset)
        if mapped is not None:
            position = offset - mapped.start_offset
            if mapped.last_nonzero_position(position) > position:
                mapped.zero(position)
                mapped.flush()
        self.write_offset = offset
        self.flushed_offset = min(self.flushed_offset, offset)

    def append(self, encoded: Sequence[bytearray], queue_offsets: Sequence[int]) -> list[int]:
        """Append encoded records as one unit that never spans files (docs/format.md §3.4).

        Each record's PHYSICALOFFSET and QUEUEOFFSET are set where it lands. If the unit
        and an 8-byte BLANK do not fit in the current file, the BLANK is written and the
        unit goes to the start of a new file. Returns the records' commit log offsets.
        """
        invariant(self.write_offset is not None, "recover or set the write position before appending")
        invariant(len(encoded) == len(queue_offsets), "one queue offset per record")
        total = sum(len(data) for data in encoded)
        if total + END_FILE_MIN_BLANK_LENGTH > self.file_size_bytes:
            raise InvalidArgument(
                f"{total} bytes of records cannot fit in a commit log file of {self.file_size_bytes} bytes"
            )
        assert self.write_offset is not None
        mapped = self._file_for_write(self.write_offset)
        position = self.write_offset - mapped.start_offset
        room = self.file_size_bytes - position
        if total + END_FILE_MIN_BLANK_LENGTH > room:
            mapped.write(position, encode_blank(room))
            self._dirty.add(mapped)
            self.write_offset = mapped.end_offset
            mapped = self._file_for_write(self.write_offset)
            position = 0
        offsets = []
        for data, queue_offset in zip(encoded, queue_offsets):
            offset = mapped.start_offset + position
            patch_offsets(data, 0, queue_offset=queue_offset, commitlog_offset=offset)
            mapped.write(position, data)
            offsets.append(offset)
            position += len(data)
        self._dirty.add(mapped)
        self.write_offset = mapped.start_offset + position
        return offsets

    def layout(self, sizes: Sequence[int]) -> list[int]:
        """Where records of these sizes would land if appended one by one with
        :meth:`append` (each its own unit, a BLANK and a new file when one does not fit),
        without writing anything; :meth:`write_laid_out` then writes them."""
        invariant(self.write_offset is not None, "recover or set the write position before appending")
        assert self.write_offset is not None
        file_size = self.file_size_bytes
        offset = self.write_offset
        if sizes and offset % file_size + sum(sizes) + END_FILE_MIN_BLANK_LENGTH <= file_size:
            return list(itertools.accumulate(sizes[:-1], initial=offset))  # all fit in this file
        offsets = []
        for size in sizes:
            if size + END_FILE_MIN_BLANK_LENGTH > file_size:
                raise InvalidArgument(f"{size} bytes of records cannot fit in a commit log file of {file_size} bytes")
            room = file_size - offset % file_size
            if size + END_FILE_MIN_BLANK_LENGTH > room:
                offset += room
            offsets.append(offset)
            offset += size
        return offsets

    def write_laid_out(self, offsets: Sequence[int], sizes: Sequence[int], records: bytes | bytearray) -> None:
        """Write records at the offsets :meth:`layout` gave (their PHYSICALOFFSETs already
        set), given joined in order with their sizes: one write per file, with the BLANK
        that ends a file where the next starts."""
        invariant(len(offsets) == len(sizes) and sum(sizes) == len(records), "one offset and size per record")
        count = len(offsets)
        view = memoryview(records)
        first = 0
        position = 0
        while first < count:
            assert self.write_offset is not None
            offset = offsets[first]
            if offset != self.write_offset:
                full = self._file_for_write(self.write_offset)
                at = self.write_offset - full.start_offset
                invariant(offset == full.end_offset, "records skip only the end of a file")
                full.write(at, encode_blank(full.file_size_bytes - at))
                self._dirty.add(full)
                self.write_offset = offset
            mapped = self._file_for_write(offset)
            last = bisect.bisect_left(offsets, mapped.end_offset, first)
            end = offsets[last - 1] + sizes[last - 1]
            mapped.write(offset - mapped.start_offset, view[position : position + end - offset])
            self._dirty.add(mapped)
            self.write_offset = end
            position += end - offset
            first = last

    def write_replicated(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Write a primary's bytes at ``offset``, the end of this log: whole records (a
        file's closing BLANK among them) that lie in one file, as the primary's file holds
        them."""
        invariant(offset == self.write_offset, "replicated bytes continue the log at its end")
        if not data:
            return
        if offset % self.file_size_bytes + len(data) > self.file_size_bytes:
            raise InvalidArgument(f"replicated bytes at {offset} cross the end of a commit log file")
        mapped = self._file_for_write(offset)
        mapped.write(offset - mapped.start_offset, data)
        self._dirty.add(mapped)
        self.write_offset = offset + len(data)

    def abandon(self, start: int, end: int) -> None:
        """Undo a write that failed part-way (``write_laid_out`` raised): clear what it
        may have written of [start, end) and append from ``start`` again, so neither a
        reader nor recovery after a crash finds its records."""
        for mapped, low, high in self._spans(start, end):
            mapped.clear(low, high)
        self.write_offset = start

    def _file_for_write(self, offset: int) -> MappedFile:
        mapped = self.files.find(offset)
        if mapped is None:
            invariant(offset % self.file_size_bytes == 0, "a new file starts at a file boundary")
            mapped = self.files.create(offset)
        if mapped not in self._held:
            mapped.hold_descriptor()
            self._held.append(mapped)
            if len(self._held) > 2:
                self._held.pop(0).drop_descriptor()
        return mapped

    def flush_range(self, start: int, end: int) -> None:
        """Make commit log bytes [start, end) durable (their files are synced whole)."""
        if end <= start:
            return
        for mapped, low, high in self._spans(start, end):
            mapped.flush(low, high)
        self.flushed_offset = max(self.flushed_offset, end)

    def flush(self) -> int:
        """Sync every file written since the last flush; returns the flushed offset."""
        for mapped in sorted(self._dirty, key=lambda f: f.start_offset):
            mapped.flush()
        self._dirty.clear()
        if self.write_offset is not None:
            self.flushed_offset = self.write_offset
        return self.flushed_offset

    def close(self) -> None:
        self.files.close()

    def file_paths(self) -> list[str]:
        return [os.path.join(self.directory, f.name) for f in self.files]
