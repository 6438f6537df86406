"""Consume queues: one directory of 20-byte unit files per topic and queue (docs/format.md §6)."""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Iterator

import numpy as np

from rmqstore.common.codec import consumequeue as cq
from rmqstore.common.codec.topic import is_valid_topic
from rmqstore.common.errors import Corruption, InvalidArgument, invariant
from rmqstore.common.files.mapped import MappedFile, MappedFileQueue

UNIT_SIZE = cq.UNIT_SIZE
# cq.UNIT as a numpy record, for reading and writing many units at once.
UNIT_DTYPE = np.dtype(list(cq.UNIT_FIELDS))
assert UNIT_DTYPE.itemsize == UNIT_SIZE


# (units of one file, lo, hi, the first and last unit's commit log offsets, timestamp_ms,
# strict) -> the first unit in [lo, hi) stored at or after (strict: after) the timestamp, or
# None when it cannot tell: CommitLog.first_stored_after
FileBisect = Callable[[memoryview, int, int, int, int, int, bool], "int | None"]


class Boundary(enum.Enum):
    LOWER = "lower"  # the first message stored at or after t
    UPPER = "upper"  # the last message stored at or before t


class ConsumeQueue:
    """One queue's files. Offsets are in units (messages); positions in bytes."""

    def __init__(self, root: str, topic: str, queue_id: int, file_units: int = cq.DEFAULT_FILE_UNITS, *, writable: bool = False):
        if file_units <= 0:
            raise InvalidArgument(f"consume queue files need at least one unit, got {file_units}")
        self.topic = topic
        self.queue_id = queue_id
        self.file_units = file_units
        self.directory = os.path.join(root, topic, str(queue_id))
        # The writer appends units page by page (read-ahead over the holes only costs);
        # a reader scans the written pages, which read-ahead serves. The files are sparse:
        # a queue's disk use follows its units (a page for its first), not its file size.
        self.files = MappedFileQueue(
            self.directory, file_units * UNIT_SIZE, writable=writable, read_ahead=not writable, sparse=True
        )
        self.writable = writable
        self._end_position = 0
        self._min_position = 0
        self.max_commitlog_end = -1  # offset + size of the last unit: Apache's maxPhysicOffset
        self._load_bounds()

    # Bounds

    def _load_bounds(self) -> None:
        """Find the first invalid unit (the end) and the first non-filler unit (the min)."""
        self._end_position = self.files.min_offset
        self.max_commitlog_end = -1
        for mapped in self.files:
            end, last = self._valid_end(mapped)
            self._end_position = mapped.start_offset + end
            if last is not None:
                self.max_commitlog_end = last.commitlog_offset + last.size
            if end < mapped.file_size_bytes:
                break
        self._min_position = self._first_real_position()

    @staticmethod
    def _valid_end(mapped: MappedFile) -> tuple[int, cq.Unit | None]:
        end = mapped.last_nonzero_position(0)
        end += -end % UNIT_SIZE
        units = np.frombuffer(mapped.buf, dtype=UNIT_DTYPE, count=end // UNIT_SIZE)
        invalid = np.flatnonzero((units["commitlog_offset"] < 0) | (units["size"] <= 0))
        count = int(invalid[0]) if invalid.size else len(units)
        del units  # no numpy view may outlive a pass over the mapping
        mapped.release(0, max((count - 1) * UNIT_SIZE, 0))  # lookups fault in what they need
        if count == 0:
            return 0, None
        return count * UNIT_SIZE, cq.decode_unit(mapped.buf, (count - 1) * UNIT_SIZE)

    def _first_real_position(self) -> int:
        first = self.files.first
        if first is None:
            return 0
        position = first.start_offset
        while position < self._end_position:
            unit = self._unit_at(position)
            if not unit.is_filler:
                return position
            position += UNIT_SIZE
        return position

    def refresh(self) -> None:
        """Pick up units and files written since the last look (read-only followers):
        scan forward from the known end only."""
        self.files.refresh()
        if self.files.first is None:
            self._end_position = self._min_position = 0
            self.max_commitlog_end = -1
            return
        if self._end_position < self.files.min_offset or self._min_position < self.files.min_offset:
            self._load_bounds()
            return
        position = self._end_position
        while True:
            mapped = self.files.find(position)
            if mapped is None:
                break
            offset, size, _ = cq.UNIT.unpack_from(mapped.buf, position - mapped.start_offset)
            if offset < 0 or size <= 0:
                break
            self.max_commitlog_end = offset + size
            position += UNIT_SIZE
        self._end_position = position

    @property
    def min_offset(self) -> int:
        return self._min_position // UNIT_SIZE

    @property
    def max_offset(self) -> int:
        """One past the last unit (Apache's maxOffsetInQueue)."""
        return self._end_position // UNIT_SIZE

    # Reading

    def _unit_at(self, position: int) -> cq.Unit:
        mapped = self.files.find(position)
        invariant(mapped is not None, "positions below the end lie in a file")
        assert mapped is not None
        return cq.decode_unit(mapped.buf, position - mapped.start_offset)

    def read(self, queue_offset: int) -> cq.Unit | None:
        """The unit at ``queue_offset``, or None outside [min, max) or on a filler."""
        if not self.min_offset <= queue_offset < self.max_offset:
            return None
        unit = self._unit_at(queue_offset * UNIT_SIZE)
        return None if unit.is_filler else unit

    def units(self, start: int | None = None, stop: int | None = None) -> Iterator[tuple[int, cq.Unit]]:
        """(queue offset, unit) for every real unit in [start, stop)."""
        first = self.min_offset if start is None else max(start, self.min_offset)
        last = self.max_offset if stop is None else min(stop, self.max_offset)
        position = first * UNIT_SIZE
        end = last * UNIT_SIZE
        while position < end:
            mapped = self.files.find(position)
            assert mapped is not None
            chunk_end = min(end, mapped.end_offset)
            view = mapped.buf[position - mapped.start_offset : chunk_end - mapped.start_offset]
            for offset, size, tags in cq.UNIT.iter_unpack(view):
                unit = cq.Unit(offset, size, tags)
                if not unit.is_filler:
                    yield position // UNIT_SIZE, unit
                position += UNIT_SIZE

    def unit_columns(self, start: int, stop: int) -> Iterator[tuple[int, np.ndarray]]:
        """The units in [start, stop) (within the queue's bounds) as ``UNIT_DTYPE``
        arrays, a file's part at a time with the queue offset it starts at: copies, which
        outlive the mapping; fillers included (``is_filler``'s test, column-wise, is the
        caller's)."""
        position = max(start, self.min_offset) * UNIT_SIZE
        end = min(stop, self.max_offset) * UNIT_SIZE
        while position < end:
            mapped = self.files.find(position)
            assert mapped is not None
            chunk_end = min(end, mapped.end_offset)
            at = position - mapped.start_offset
            units = np.frombuffer(mapped.buf, dtype=UNIT_DTYPE, count=(chunk_end - position) // UNIT_SIZE, offset=at)
            yield position // UNIT_SIZE, units.copy()
            del units
            position = chunk_end

    def offset_by_time(
        self,
        timestamp_ms: int,
        store_time_of: Callable[[cq.Unit], int],
        boundary: Boundary = Boundary.LOWER,
        *,
        commitlog_min_offset: int = 0,
        stop: int | None = None,
        bisect_file: FileBisect | None = None,
    ) -> int:
        """Binary search over the records' store times, independent of file mtimes.

        LOWER: the first queue offset whose message was stored at or after ``timestamp_ms``
        (max_offset if none). UPPER: the last one stored at or before it (min_offset − 1 if
        none). Units pointing below ``commitlog_min_offset`` (expired) are skipped; units
        at or past ``stop`` (not yet visible) are not considered. ``bisect_file``, when
        given, finishes the search in one call once the range lies in one file
        (CommitLog.first_stored_after); it probes the same units as the loop here.
        """
        low = self.min_offset
        high = self.max_offset if stop is None else min(stop, self.max_offset)
        while low < high and (unit := self.read(low)) is not None and unit.commitlog_offset < commitlog_min_offset:
            low += 1
        strict = boundary is Boundary.UPPER
        first_after = self._first_stored_after(low, high, timestamp_ms, strict, store_time_of, bisect_file)
        # UPPER: the offset before the first one stored after t
        return first_after - 1 if strict else first_after

    def _first_stored_after(
        self,
        low: int,
        high: int,
        timestamp_ms: int,
        strict: bool,
        store_time_of: Callable[[cq.Unit], int],
        bisect_file: FileBisect | None,
    ) -> int:
        """The first offset in [low, high) whose message was stored at or after
        ``timestamp_ms`` (after it when ``strict``), ``high`` if none."""
        while low < high:
            if bisect_file is not None:
                found = self._bisect_in_file(low, high, timestamp_ms, strict, bisect_file)
                if found is not None:
                    return found
            mid = (low + high) // 2
            unit = self.read(mid)
            assert unit is not None
            stored = store_time_of(unit)
            if stored > timestamp_ms or (stored == timestamp_ms and not strict):
                high = mid
            else:
                low = mid + 1
        return low

    def _bisect_in_file(self, low: int, high: int, timestamp_ms: int, strict: bool, bisect_file: FileBisect) -> int | None:
        """:meth:`_first_stored_after` by ``bisect_file`` when [low, high) lies in one
        file; None when it does not, or when ``bisect_file`` cannot finish the search."""
        mapped = self.files.find(low * UNIT_SIZE)
        if mapped is None or high * UNIT_SIZE > mapped.end_offset:
            return None
        base = mapped.start_offset // UNIT_SIZE
        first = self._unit_at(low * UNIT_SIZE).commitlog_offset
        last = self._unit_at((high - 1) * UNIT_SIZE).commitlog_offset
        found = bisect_file(mapped.buf, low - base, high - base, first, last, timestamp_ms, strict)
        return None if found is None else found + base

    # Writing

    def append(self, queue_offset: int, unit: bytes) -> bool:
        """Write ``unit`` at ``queue_offset``. Returns False if that offset is already
        written (re-dispatch is idempotent). A queue whose first unit is not at offset 0
        starts with filler units, as Apache's fillPreBlank writes them."""
        invariant(self.writable, "append needs a writable consume queue")
        position = queue_offset * UNIT_SIZE
        if position < self._end_position:
            mapped = self.files.find(position)
            if mapped is None or position < self._min_position:
                return False
            at = position - mapped.start_offset
            if bytes(mapped.buf[at : at + UNIT_SIZE]) == unit:
                return False
            # A unit torn by a kill (offset and size written, tagsCode not): dispatch is
            # the authority, so the unit is rewritten.
            mapped.write(at, unit)
            return True
        if self.files.last is None:
            start = position - position % self.files.file_size_bytes
            mapped = self.files.create(start)
            self._end_position = self._min_position = start
            if position > start:
                mapped.write(0, cq.FILLER * ((position - start) // UNIT_SIZE))
                self._end_position = position
                self._min_position = position
        if position != self._end_position:
            raise Corruption(
                f"consume queue {self.topic}/{self.queue_id} ends at offset {self.max_offset}; "
                f"cannot write offset {queue_offset}",
                offset=queue_offset,
            )
        mapped = self.files.find(position)
        if mapped is None:
            mapped = self.files.create(position)
        mapped.write(position - mapped.start_offset, unit)
        self._end_position = position + UNIT_SIZE
        offset, size, _ = cq.UNIT.unpack(unit)
        self.max_commitlog_end = offset + size
        return True

    def prepare(self, first_queue_offset: int, last_queue_offset: int) -> None:
        """Create, ahead of the records, the files that units ``first_queue_offset`` to
        ``last_queue_offset`` appended at the queue's end will be written into, so that
        writing them cannot meet a full disk or a lack of descriptors. Anything but an
        append at the end (fillers before a queue's first unit, a gap) is left to
        :meth:`append`."""
        invariant(self.writable, "prepare needs a writable consume queue")
        file_size = self.files.file_size_bytes
        if first_queue_offset * UNIT_SIZE != self._end_position:
            return
        if self.files.last is None:
            if self._end_position % file_size:
                return
            self.files.create(self._end_position)
            self._min_position = self._end_position
        last = self.files.last
        assert last is not None
        end = (last_queue_offset + 1) * UNIT_SIZE
        while last.end_offset < end:
            last = self.files.create(last.end_offset)
        # The units' blocks too: the files are sparse.
        position = self._end_position
        while position < end:
            mapped = self.files.find(position)
            assert mapped is not None
            mapped.reserve(min(end, mapped.end_offset) - mapped.start_offset)
            position = mapped.end_offset

    def continues_at(self, queue_offset: int) -> bool:
        """Whether a unit at ``queue_offset`` goes right after the queue's last one, in a
        file the queue has: what :meth:`append_block` takes."""
        return self.files.last is not None and queue_offset * UNIT_SIZE == self._end_position

    def append_block(self, first_queue_offset: int, units: bytes, last_commitlog_end: int) -> None:
        """Write consecutive units starting at ``first_queue_offset`` (the queue's end) in
        as few writes as the files allow; :meth:`append` covers every other case."""
        invariant(self.writable, "append needs a writable consume queue")
        position = first_queue_offset * UNIT_SIZE
        invariant(position == self._end_position and self.files.last is not None, "a block starts at the end")
        end = position + len(units)
        while position < end:
            mapped = self.files.find(position) or self.files.create(position)
            at = position - mapped.start_offset
            take = min(end - position, mapped.file_size_bytes - at)
            done = len(units) - (end - position)
            mapped.write(at, units[done : done + take])
            position += take
        self._end_position = end
        self.max_commitlog_end = last_commitlog_end

    def append_units(self, queue_offsets: np.ndarray, units: np.ndarray) -> int:
        """Write ``units`` (``UNIT_DTYPE``, in commit log order) at ``queue_offsets``
        (increasing): consecutive ones from the queue's end as one block, anything else
        (fillers before a new queue's first unit, a gap, units already there) through
        :meth:`append`. Returns how many units were written."""
        if not len(units):
            return 0
        first = int(queue_offsets[0])
        consecutive = int(queue_offsets[-1]) - first == len(units) - 1
        if not consecutive or first < self.max_offset:
            return sum(self.append(offset, units[at : at + 1].tobytes()) for at, offset in enumerate(queue_offsets.tolist()))
        written = 0
        if not self.continues_at(first):
            # A new queue (its first file, fillers before its first unit) or a queue
            # resuming after a gap: the one-unit path sets it up.
            written += self.append(first, units[:1].tobytes())
            units = units[1:]
            first += 1
        if len(units):
            last = units[-1]
            self.append_block(first, units.tobytes(), int(last["commitlog_offset"]) + int(last["size"]))
            written += len(units)
        return written

    def truncate_to_commitlog(self, commitlog_offset: int) -> None:
        """Drop every unit pointing at or past ``commitlog_offset`` (truncateDirtyLogicFiles),
        zeroing the dropped bytes so no stale unit can come back."""
        invariant(self.writable, "truncate needs a writable consume queue")
        keep = self._min_position
        for queue_offset, unit in self.units():
            if unit.commitlog_offset >= commitlog_offset:
                break
            keep = (queue_offset + 1) * UNIT_SIZE
        if keep >= self._end_position:
            return
        self.files.delete_after(keep - 1)
        holder = self.files.find(keep)
        if holder is not None:
            holder.zero(keep - holder.start_offset)
        self._load_bounds()

    def delete_expired(self, commitlog_min_offset: int) -> int:
        """Delete leading files whose last unit points below ``commitlog_min_offset``
        (never the last file), then move the min offset to the first unit at or above it
        (deleteExpiredFileByOffset + correctMinOffset). Returns the files deleted."""
        invariant(self.writable, "retention needs a writable consume queue")
        doomed = 0
        for mapped in self.files.files[:-1]:
            offset, size, _ = cq.UNIT.unpack_from(mapped.buf, mapped.file_size_bytes - UNIT_SIZE)
            if size > 0 and offset < commitlog_min_offset:
                doomed += 1
            else:
                break
        self.files.delete_first(doomed)
        self._load_bounds()
        self.correct_min_offset(commitlog_min_offset)
        return doomed

    def correct_min_offset(self, commitlog_min_offset: int) -> None:
        """Skip units that point below the commit log's first kept offset."""
        position = self._min_position
        while position < self._end_position:
            unit = self._unit_at(position)
            if not unit.is_filler and unit.commitlog_offset >= commitlog_min_offset:
                break
            position += UNIT_SIZE
        self._min_position = position

    def flush(self) -> None:
        self.files.flush()

    def close(self) -> None:
        self.files.close()


class ConsumeQueueSet:
    """Every consume queue under ``<store>/consumequeue``, opened as needed."""

    def __init__(self, root: str, file_units: int = cq.DEFAULT_FILE_UNITS, *, writable: bool = False):
        self.root = root
        self.file_units = file_units
        self.writable = writable
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}

    def discover(self) -> list[tuple[str, int]]:
        """(topic, queue id) of every queue directory on disk, skipping names that are
        not valid topics or queue ids (they can never be ours)."""
        found: list[tuple[str, int]] = []
        try:
            topics = os.listdir(self.root)
        except FileNotFoundError:
            return found
        for topic in topics:
            topic_dir = os.path.join(self.root, topic)
            if not is_valid_topic(topic) or not os.path.isdir(topic_dir):
                continue
            for name in os.listdir(topic_dir):
                if name.isdigit() and name.isascii() and os.path.isdir(os.path.join(topic_dir, name)):
                    found.append((topic, int(name)))
        return found

    def open_all(self) -> list[ConsumeQueue]:
        for topic, queue_id in self.discover():
            self.get(topic, queue_id)
        return [self.queues[key] for key in sorted(self.queues)]

    def get(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        queue = self.queues.get(key)
        if queue is None:
            queue = ConsumeQueue(self.root, topic, queue_id, self.file_units, writable=self.writable)
            self.queues[key] = queue
        return queue

    def find(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """The queue if it exists on disk or was opened, else None (never creates)."""
        if (topic, queue_id) in self.queues:
            return self.queues[(topic, queue_id)]
        if is_valid_topic(topic) and os.path.isdir(os.path.join(self.root, topic, str(queue_id))):
            return self.get(topic, queue_id)
        return None

    def flush(self) -> None:
        for queue in self.queues.values():
            queue.flush()

    def close(self) -> None:
        for queue in self.queues.values():
            queue.close()
        self.queues.clear()


def infer_file_units(root: str) -> int | None:
    """The unit count of the consume queue files on disk, if any exist and agree."""
    sizes = set()
    for dirpath, _, names in os.walk(root):
        for name in names:
            if len(name) == 20 and name.isdigit():
                sizes.add(os.path.getsize(os.path.join(dirpath, name)))
    if not sizes:
        return None
    if len(sizes) > 1 or next(iter(sizes)) % UNIT_SIZE:
        raise Corruption(f"consume queue files under {root} have sizes {sorted(sizes)}", path=root)
    return next(iter(sizes)) // UNIT_SIZE


