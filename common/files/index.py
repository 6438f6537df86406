"""Index files: hash slots and chained entries, newest file last (docs/format.md §7).

:class:`IndexFile` writes exactly the bytes Apache's IndexFile writes, first-entry time
quirk included (docs/format.md §15 flaw 3a), so reindexed files are byte-identical.
:class:`IndexFileList` is IndexService: which file a key goes to, when a new file starts,
and Apache's lookup (``query_offsets``). Exact, complete lookups build on :meth:`chain`.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import struct
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from rmqstore.common.codec import index as ix
from rmqstore.common.codec.dispatch import DispatchBatch, DispatchPlan
from rmqstore.common.codec.javahash import index_key, index_key_hash
from rmqstore.common.codec.speedups import _speedups
from rmqstore.common.errors import Corruption, invariant
from rmqstore.common.files.mapped import MappedFile, fsync_directory, makedirs_durable

MAX_MSGS_NUM_BATCH = 64
# A lookup walks a slot chain in chunks of matches: first as many as it asks for (by
# default a page of 32, and the one more that says the page continues), then larger ones.
MATCHING_OFFSETS_FIRST_CHUNK = 33
MATCHING_OFFSETS_CHUNK = 256
_INT64 = struct.Struct(">q")
_HEADER_BEGIN_TIMESTAMP = 0
_HEADER_END_TIMESTAMP = 8
_HEADER_BEGIN_PHY_OFFSET = 16
_HEADER_END_PHY_OFFSET = 24


def _in_chunks(offsets: Iterator[int], first: int) -> Iterator[list[int]]:
    """``offsets`` in lists of the sizes the compiled walk returns."""
    size = first
    while chunk := list(itertools.islice(offsets, size)):
        yield chunk
        size = MATCHING_OFFSETS_CHUNK


class IndexFile:
    """One index file. The header lives in the mapped bytes; writes go straight there."""

    def __init__(self, mapped: MappedFile, slots: int, entries: int):
        ix.check_geometry(slots, entries)
        self.mapped = mapped
        self.slots = slots
        self.entries = entries
        self.path = mapped.path
        header = self.header
        self._index_count = max(header.index_count, 1)
        self._hash_slot_count = header.hash_slot_count
        self._begin_ts = header.begin_timestamp_ms

    @classmethod
    def open(cls, path: str, slots: int, entries: int, *, writable: bool) -> IndexFile:
        size = ix.file_size(slots, entries)
        actual = os.path.getsize(path)
        if actual != size:
            raise Corruption(
                f"index file {path} is {actual} bytes, but {slots} slots and {entries} entries "
                f"make {size}; pass the store's --index-slots and --index-entries",
                path=path,
            )
        return cls(MappedFile(path, size, 0, writable=writable), slots, entries)

    @classmethod
    def create(
        cls,
        path: str,
        slots: int,
        entries: int,
        *,
        prev_end_phy_offset: int,
        prev_end_timestamp_ms: int,
        spare: str | None = None,
    ) -> IndexFile:
        """A new file whose header starts at the previous file's end (docs/format.md §7.6),
        written before the file appears under its name."""
        initial: list[tuple[int, bytes]] = []
        if prev_end_phy_offset > 0:
            initial.append((_HEADER_BEGIN_PHY_OFFSET, _INT64.pack(prev_end_phy_offset)))
            initial.append((_HEADER_END_PHY_OFFSET, _INT64.pack(prev_end_phy_offset)))
        if prev_end_timestamp_ms > 0:
            initial.append((_HEADER_BEGIN_TIMESTAMP, _INT64.pack(prev_end_timestamp_ms)))
            initial.append((_HEADER_END_TIMESTAMP, _INT64.pack(prev_end_timestamp_ms)))
        mapped = MappedFile.create(path, ix.file_size(slots, entries), 0, tuple(initial), spare=spare)
        return cls(mapped, slots, entries)

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    @property
    def header(self) -> ix.Header:
        return ix.decode_header(self.mapped.buf)

    @property
    def index_count(self) -> int:
        """Next entry number (≥ 1); entries 1 … index_count − 1 are in use."""
        return self._index_count

    @property
    def is_full(self) -> bool:
        return self._index_count >= self.entries

    @property
    def end_phy_offset(self) -> int:
        return self.header.end_phy_offset

    @property
    def end_timestamp_ms(self) -> int:
        return self.header.end_timestamp_ms

    def put_key(self, key_hash: int, phy_offset: int, store_timestamp_ms: int) -> bool:
        """IndexFile.putKey; False when the file is full (the caller rolls over)."""
        if self._index_count >= self.entries:
            return False
        buf = self.mapped.buf
        slot_position = ix.slot_position(key_hash % self.slots)
        (slot_value,) = ix.SLOT.unpack_from(buf, slot_position)
        if slot_value == self._index_count:
            # A kill between writing the slot and the count: the slot already names the
            # entry about to be rewritten, whose prevIndex holds the slot's older chain.
            stale = self.entry(slot_value) if slot_value < self.entries else None
            slot_value = stale.prev_index if stale and stale.key_hash % self.slots == key_hash % self.slots else 0
        if slot_value <= 0 or slot_value > self._index_count:
            slot_value = 0
        time_diff = ix.time_diff_s(store_timestamp_ms, self._begin_ts)
        number = self._index_count
        entry = ix.ENTRY.pack(key_hash, phy_offset, time_diff, slot_value)
        self.mapped.write(ix.entry_position(self.slots, number), entry)
        self.mapped.write(slot_position, ix.SLOT.pack(number))
        if number <= 1:
            self._begin_ts = store_timestamp_ms
            self.mapped.write(_HEADER_BEGIN_PHY_OFFSET, _INT64.pack(phy_offset))
            self.mapped.write(_HEADER_BEGIN_TIMESTAMP, _INT64.pack(store_timestamp_ms))
        if slot_value == 0:
            self._hash_slot_count += 1
            self.mapped.write(ix.HEADER_OFFSET_HASH_SLOT_COUNT, ix.SLOT.pack(self._hash_slot_count))
        self._index_count += 1
        self.mapped.write(ix.HEADER_OFFSET_INDEX_COUNT, ix.SLOT.pack(self._index_count))
        self.mapped.write(_HEADER_END_PHY_OFFSET, _INT64.pack(phy_offset))
        self.mapped.write(_HEADER_END_TIMESTAMP, _INT64.pack(store_timestamp_ms))
        return True

    def put_keys(self, key_hashes: np.ndarray, phy_offsets: np.ndarray, timestamps_ms: np.ndarray) -> int:
        """:meth:`put_key` for many keys in order, with the same bytes as one call per key;
        returns how many fit (the caller rolls over for the rest).

        Each entry is written before its slot and the header last, as put_key orders a
        single key: a reader never follows a slot to an unwritten entry, and a kill leaves
        slots at or past the count only where :meth:`repair_slots` finds them. (The
        compiled path puts key by key; the numpy one writes every entry, then every slot.)"""
        count = min(len(key_hashes), self.entries - self._index_count)
        if count <= 0:
            return 0
        self.mapped.dirty = True  # the entries and slots below are written into the mapping
        start = self._index_count
        if _speedups is not None:
            chains = _speedups.index_put_keys(
                self.mapped.buf, self.slots, start, self._begin_ts,
                *(np.ascontiguousarray(column[:count], dtype=np.int64) for column in (key_hashes, phy_offsets, timestamps_ms)),
            )  # fmt: skip
            if chains is not None:
                self._finish_put(start, count, chains, phy_offsets, timestamps_ms)
                return count
        numbers = np.arange(start, start + count, dtype=np.int64)
        slots = key_hashes[:count] % self.slots
        buf = self.mapped.buf
        slot_table = np.frombuffer(buf, dtype=ix.SLOT_DTYPE, count=self.slots, offset=ix.HEADER_SIZE)
        previous = slot_table[slots].astype(np.int64)
        if (previous == numbers).any():
            # A slot already names the entry about to be written (a kill inside put_key):
            # the scalar path knows how to recover that chain.
            del slot_table
            for i in range(count):
                self.put_key(int(key_hashes[i]), int(phy_offsets[i]), int(timestamps_ms[i]))
            return count
        previous[(previous <= 0) | (previous > numbers)] = 0
        # Keys of one slot within the batch chain to each other, in put order.
        order = np.argsort(slots, kind="stable")
        sorted_slots = slots[order]
        same_as_before = sorted_slots[1:] == sorted_slots[:-1]
        previous[order[1:][same_as_before]] = numbers[order[:-1][same_as_before]]
        begin_ts = np.full(count, timestamps_ms[0] if start <= 1 else self._begin_ts, dtype=np.int64)
        begin_ts[0] = self._begin_ts  # the first entry of a file sees the old begin (docs/format.md §15 3a)
        delta = timestamps_ms[:count] - begin_ts
        time_diff = np.clip(np.sign(delta) * (np.abs(delta) // 1000), 0, ix.INT32_MAX)
        time_diff[begin_ts <= 0] = 0
        entries = np.frombuffer(
            buf, dtype=ix.ENTRY_DTYPE, count=count, offset=ix.entry_position(self.slots, start)
        )
        entries["key_hash"] = key_hashes[:count]
        entries["phy_offset"] = phy_offsets[:count]
        entries["time_diff"] = time_diff
        entries["prev_index"] = previous
        last_of_slot = np.append(~same_as_before, True)
        slot_table[sorted_slots[last_of_slot]] = numbers[order[last_of_slot]]
        del slot_table, entries
        self._finish_put(start, count, int(np.count_nonzero(previous == 0)), phy_offsets, timestamps_ms)
        return count

    def _finish_put(
        self, start: int, count: int, chains: int, phy_offsets: np.ndarray, timestamps_ms: np.ndarray
    ) -> None:
        """The header after ``count`` entries from ``start`` were written, ``chains`` of
        them the first of their slot."""
        if start <= 1:
            self._begin_ts = int(timestamps_ms[0])
            self.mapped.write(_HEADER_BEGIN_PHY_OFFSET, _INT64.pack(int(phy_offsets[0])))
            self.mapped.write(_HEADER_BEGIN_TIMESTAMP, _INT64.pack(self._begin_ts))
        self._hash_slot_count += chains
        self.mapped.write(ix.HEADER_OFFSET_HASH_SLOT_COUNT, ix.SLOT.pack(self._hash_slot_count))
        self._index_count = start + count
        self.mapped.write(ix.HEADER_OFFSET_INDEX_COUNT, ix.SLOT.pack(self._index_count))
        self.mapped.write(_HEADER_END_PHY_OFFSET, _INT64.pack(int(phy_offsets[count - 1])))
        self.mapped.write(_HEADER_END_TIMESTAMP, _INT64.pack(int(timestamps_ms[count - 1])))

    def repair_slots(self) -> int:
        """Point every slot that names an entry at or past the count (written by a batch a
        kill interrupted before its count) back to the newest committed entry of its
        chain, following the interrupted entries' prevIndex links, which were written
        before any slot. Returns how many slots changed."""
        count = self._index_count
        slot_table = np.frombuffer(self.mapped.buf, dtype=ix.SLOT_DTYPE, count=self.slots, offset=ix.HEADER_SIZE)
        ahead = np.flatnonzero(slot_table >= count)
        heads = [int(slot_table[slot]) for slot in ahead]
        del slot_table
        for slot, number in zip(ahead, heads):
            for _ in range(self.entries):
                if number < count or number >= self.entries:
                    break
                number = self.entry(number).prev_index
            value = number if 0 < number < count else 0
            self.mapped.write(ix.slot_position(int(slot)), ix.SLOT.pack(value))
        return len(heads)

    def last_entry_phy_offset(self) -> int:
        """Offset of the newest entry written (the header's end may lag it after a kill
        inside put_key); the header's end for a file without entries."""
        if self._index_count > 1:
            return self.entry(self._index_count - 1).phy_offset
        return self.end_phy_offset

    def repair_header_end(self, store_timestamp_ms: int) -> bool:
        """Make endPhyOffset/endTimestamp name the newest entry, if a kill left them
        behind. Returns whether anything changed."""
        if self._index_count <= 1:
            return False
        last = self.entry(self._index_count - 1).phy_offset
        header = self.header
        if header.end_phy_offset == last and header.end_timestamp_ms >= store_timestamp_ms:
            return False
        self.mapped.write(_HEADER_END_PHY_OFFSET, _INT64.pack(last))
        self.mapped.write(_HEADER_END_TIMESTAMP, _INT64.pack(store_timestamp_ms))
        return True

    def entry(self, number: int) -> ix.Entry:
        invariant(0 < number < self.entries, "entry numbers lie in the file")
        return ix.decode_entry(self.mapped.buf, ix.entry_position(self.slots, number))

    def chain(self, key_hash: int) -> Iterator[tuple[int, ix.Entry]]:
        """(entry number, entry) along the slot's chain, newest first, with Apache's stop
        rules against loops and stale links. Entries of other hashes in the slot are
        included: callers compare ``key_hash`` themselves."""
        count = max(self.header.index_count, 1)
        (number,) = ix.SLOT.unpack_from(self.mapped.buf, ix.slot_position(key_hash % self.slots))
        if number <= 0 or number > count or count <= 1:
            return
        for _ in range(count):
            if number >= self.entries:
                return
            entry = self.entry(number)
            yield number, entry
            if entry.prev_index <= 0 or entry.prev_index > count or entry.prev_index == number:
                return
            number = entry.prev_index

    def matching_offsets(self, key_hash: int) -> Iterator[int]:
        """The phyOffsets of the entries along the slot's chain whose hash is
        ``key_hash``, newest first: :meth:`chain` filtered, read without an object per
        entry (the lookup hot path)."""
        for chunk in self.matching_offset_chunks(key_hash):
            yield from chunk

    def matching_offset_chunks(self, key_hash: int, first: int = MATCHING_OFFSETS_FIRST_CHUNK) -> Iterator[list[int]]:
        """:meth:`matching_offsets` in lists, as the compiled walk finds them: ``first``
        matches, then MATCHING_OFFSETS_CHUNK at a time (each entry the walk reads is a
        page of the file, likely a cold one, so it reads no more than it is asked for)."""
        buf = self.mapped.buf
        if _speedups is None:
            yield from _in_chunks(self._matching_offsets(buf, key_hash), first)
            return
        # In chunks: a caller that needs a page of matches stops early, and a hot key's
        # long chain (an entry page each) is not walked to its end for nothing.
        number = steps = yielded = 0
        chunk = max(first, 1)
        while True:
            found = _speedups.matching_offsets(buf, self.slots, self.entries, key_hash, number, steps, chunk)
            if found is None:
                # The chain leads outside the file: the Python walk says so where it does.
                yield from _in_chunks(itertools.islice(self._matching_offsets(buf, key_hash), yielded, None), chunk)
                return
            offsets, number, steps = found
            yield offsets
            yielded += len(offsets)
            if number == 0:
                return
            chunk = MATCHING_OFFSETS_CHUNK

    def _matching_offsets(self, buf: memoryview, key_hash: int) -> Iterator[int]:
        """The definition the compiled walk follows; also where a chain leads outside
        the file, which it hands back."""
        count = max(ix.HEADER.unpack_from(buf)[5], 1)
        (number,) = ix.SLOT.unpack_from(buf, ix.slot_position(key_hash % self.slots))
        if number <= 0 or number > count or count <= 1:
            return
        unpack = ix.ENTRY.unpack_from
        entries_at = ix.entry_position(self.slots, 0)
        for _ in range(count):
            if number >= self.entries:
                return
            entry_hash, phy_offset, _, prev = unpack(buf, entries_at + number * ix.ENTRY_SIZE)
            if entry_hash == key_hash:
                yield phy_offset
            if prev <= 0 or prev > count or prev == number:
                return
            number = prev

    def select_phy_offsets(self, key_hash: int, max_num: int, begin_ms: int, end_ms: int, out: list[int]) -> None:
        """IndexFile.selectPhyOffset, exactly: hash-only matching on second-rounded times."""
        begin_ts = self.header.begin_timestamp_ms
        for _, entry in self.chain(key_hash):
            if len(out) >= max_num or entry.time_diff_s < 0:
                return
            time_read = begin_ts + entry.time_diff_s * 1000
            if entry.key_hash == key_hash and begin_ms <= time_read <= end_ms:
                out.append(entry.phy_offset)
            if time_read < begin_ms:
                return

    def time_matched(self, begin_ms: int, end_ms: int) -> bool:
        """IndexFile.isTimeMatched against the header's [begin, end]."""
        header = self.header
        b, e = header.begin_timestamp_ms, header.end_timestamp_ms
        return (begin_ms < b and end_ms > e) or (b <= begin_ms <= e) or (b <= end_ms <= e)

    def flush(self) -> None:
        self.mapped.flush_if_dirty()

    def close(self) -> None:
        self.mapped.close()


@dataclass(frozen=True, slots=True)
class QueryOffsetResult:
    phy_offsets: list[int]
    index_last_update_timestamp_ms: int
    index_last_update_phy_offset: int


def _take(counter: Counter[int], key: int) -> bool:
    if counter[key] > 0:
        counter[key] -= 1
        return True
    return False


class IndexFileList:
    """``<store>/index``: the files oldest first, and IndexService's rules over them."""

    def __init__(
        self,
        directory: str,
        slots: int = ix.DEFAULT_SLOTS,
        entries: int = ix.DEFAULT_ENTRIES,
        *,
        writable: bool = False,
        zone: dt.tzinfo | None = None,
    ):
        ix.check_geometry(slots, entries)
        self.directory = directory
        self.slots = slots
        self.entries = entries
        self.writable = writable
        self.zone = zone
        self.files: list[IndexFile] = []
        self.created: list[IndexFile] = []  # files this instance created, for the checkpoint
        # The next file's blocks, allocated ahead by prepare: beside the index directory
        # (in the store's), so that the index directory holds only index files.
        self._spare = os.path.join(os.path.dirname(os.path.abspath(directory)), ".next-index.allocated")
        self._spare_ready = False
        if writable and os.path.exists(self._spare):
            # A kill may have caught a roll-over writing its header into it: start afresh.
            os.unlink(self._spare)
        self.refresh()

    def refresh(self) -> bool:
        """Open files that appeared since the last look (read-only followers)."""
        try:
            names = sorted(n for n in os.listdir(self.directory) if ix.is_file_name(n))
        except FileNotFoundError:
            names = []
        known = {f.name: f for f in self.files}
        for gone in set(known) - set(names):
            known.pop(gone).close()
        if names and names[-1] not in known:
            # A writer may be creating its newest file (empty, then sized): a follower
            # skips an empty newest file, and the writer removes one a kill left behind.
            # Any other wrong size is reported on open.
            newest = os.path.join(self.directory, names[-1])
            if not os.path.exists(newest) or os.path.getsize(newest) == 0:
                names = names[:-1]
                if self.writable and os.path.exists(newest):
                    os.unlink(newest)
                    fsync_directory(self.directory)
        changed = False
        for name in names:
            if name not in known:
                known[name] = IndexFile.open(
                    os.path.join(self.directory, name), self.slots, self.entries, writable=self.writable
                )
                changed = True
        self.files = [known[name] for name in names]
        return changed

    def prepare(self, key_count: int) -> None:
        """Allocate the next file ahead if indexing ``key_count`` more keys (or the next
        record: a full file rolls over even for a record without keys) may need it, so
        that the roll-over finds its blocks there and cannot meet a full disk. One file
        ahead: a batch of more keys than a file holds may still need a second one."""
        invariant(self.writable, "prepare needs a writable index")
        last = self.files[-1] if self.files else None
        if self._spare_ready or (last is not None and key_count < last.entries - last.index_count):
            return
        makedirs_durable(self.directory)
        MappedFile.allocate_spare(self._spare, ix.file_size(self.slots, self.entries))
        self._spare_ready = True

    def _new_file(self, first_timestamp_ms: int) -> IndexFile:
        """Roll over: a new file named by the time of the record that needs it, strictly
        after the last name, starting at the previous file's end."""
        makedirs_durable(self.directory)
        previous = self.files[-1] if self.files else None
        name = ix.file_name(max(first_timestamp_ms, 0), self.zone)
        if previous is not None and name <= previous.name:
            name = ix.name_after(previous.name)
        created = IndexFile.create(
            os.path.join(self.directory, name),
            self.slots,
            self.entries,
            prev_end_phy_offset=previous.end_phy_offset if previous else 0,
            prev_end_timestamp_ms=previous.end_timestamp_ms if previous else 0,
            spare=self._spare if self._spare_ready else None,
        )
        self._spare_ready = False
        fsync_directory(self.directory)
        if previous is not None:
            previous.flush()
        self.files.append(created)
        self.created.append(created)
        return created

    def _writable_last(self, timestamp_ms: int) -> IndexFile:
        last = self.files[-1] if self.files else None
        if last is None or last.is_full:
            return self._new_file(timestamp_ms)
        return last

    def build_index(self, plan: DispatchPlan) -> int:
        """IndexService.buildIndex for one record; returns the number of keys put."""
        return self._build_record_index(
            plan.commitlog_offset, plan.store_timestamp_ms, [index_key_hash(key) for key in plan.index_keys]
        )

    def _build_record_index(self, commitlog_offset: int, store_timestamp_ms: int, hashes: list[int]) -> int:
        invariant(self.writable, "build_index needs a writable index")
        target = self._writable_last(store_timestamp_ms)
        indexed_up_to = target.last_entry_phy_offset()
        if commitlog_offset < indexed_up_to:
            return 0
        if commitlog_offset == indexed_up_to:
            # Apache re-indexes this record whole (docs/format.md §15 flaw 1c); rmqstore puts
            # only the keys a crash kept it from putting.
            present = self._hashes_at(commitlog_offset)
            hashes = [h for h in hashes if not _take(present, h)]
        put = 0
        for key_hash in hashes:
            while not target.put_key(key_hash, commitlog_offset, store_timestamp_ms):
                target = self._writable_last(store_timestamp_ms)
            put += 1
        return put

    def build_index_batch(self, batch: DispatchBatch) -> int:
        """:meth:`build_index` for every record of a batch, in order; returns the number
        of keys put."""
        invariant(self.writable, "build_index needs a writable index")
        if not len(batch):
            return 0
        offsets = batch.commitlog_offsets
        timestamps = batch.store_timestamps_ms
        # build_index opens a new file at every record that finds the last one full,
        # keys or not, named by that record's time: the batch does the same.
        target = self._writable_last(timestamps[0])
        indexed_up_to = target.last_entry_phy_offset()
        hashes = batch.index_hashes()
        put = 0
        record = first_key = 0
        # Records at or before what the index holds (re-dispatch after a crash) take the
        # careful one-record path.
        while record < len(batch) and offsets[record] <= indexed_up_to:
            self._writable_last(timestamps[record])
            count = batch.key_counts[record]
            record_hashes = hashes[first_key : first_key + count].tolist()
            put += self._build_record_index(offsets[record], timestamps[record], record_hashes)
            first_key += count
            record += 1
        if record < len(batch):
            self._writable_last(timestamps[record])
        if first_key == len(hashes):
            return put
        key_records = np.repeat(np.arange(record, len(batch), dtype=np.int64), batch.key_counts[record:])
        hashes = hashes[first_key:]
        phy_offsets = np.asarray(offsets, dtype=np.int64)[key_records]
        key_timestamps = np.asarray(timestamps, dtype=np.int64)[key_records]
        done = 0
        while done < len(hashes):
            target = self.files[-1]
            done += target.put_keys(hashes[done:], phy_offsets[done:], key_timestamps[done:])
            if target.is_full:
                # The next file opens at the record whose key did not fit, or at the
                # record after the last one put, if there is one in this batch.
                last = int(key_records[done - 1])
                following = last if done < len(hashes) and key_records[done] == last else last + 1
                if following < len(batch):
                    self._writable_last(timestamps[following])
        return put + done

    def _hashes_at(self, offset: int) -> Counter[int]:
        """Key hashes already indexed for the record at ``offset``: the newest entries,
        possibly running back into the previous file."""
        found: Counter[int] = Counter()
        for index_file in reversed(self.files):
            number = index_file.index_count - 1
            while number >= 1:
                entry = index_file.entry(number)
                if entry.phy_offset != offset:
                    return found
                found[entry.key_hash] += 1
                number -= 1
        return found

    @property
    def last_full_end_timestamp_ms(self) -> int:
        """endTimestamp of the newest full file: the checkpoint's indexMsgTimestamp."""
        for index_file in reversed(self.files):
            if index_file.is_full:
                return index_file.end_timestamp_ms
        return 0

    def query_offsets(self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int) -> QueryOffsetResult:
        """IndexService.queryOffset, exactly as Apache answers (hash-only, capped, in
        newest-file-first chain order). The caller applies maxMsgsNumBatch."""
        offsets: list[int] = []
        last_ts = last_phy = 0
        key_hash = index_key_hash(index_key(topic, key))
        for position, index_file in enumerate(reversed(self.files)):
            header = index_file.header
            if position == 0:
                last_ts, last_phy = header.end_timestamp_ms, header.end_phy_offset
            if index_file.time_matched(begin_ms, end_ms):
                index_file.select_phy_offsets(key_hash, max_num, begin_ms, end_ms, offsets)
            if header.begin_timestamp_ms < begin_ms or len(offsets) >= max_num:
                break
        return QueryOffsetResult(offsets, last_ts, last_phy)

    def candidates(self, topic: str, key: str) -> Iterator[int]:
        """Every commit log offset whose index entry has the key's hash, newest file
        first, with no cap and no time filter. Callers read each record and keep the real
        matches (hash collisions and other topics share chains)."""
        key_hash = index_key_hash(index_key(topic, key))
        for index_file in reversed(self.files):
            yield from index_file.matching_offsets(key_hash)

    def delete_expired(self, commitlog_min_offset: int) -> list[str]:
        """IndexService.deleteExpiredFile: oldest first, delete files whose entries all
        point below ``commitlog_min_offset``; never the newest file."""
        invariant(self.writable, "retention needs a writable index")
        doomed: list[IndexFile] = []
        for index_file in self.files[:-1]:
            if index_file.end_phy_offset < commitlog_min_offset:
                doomed.append(index_file)
            else:
                break
        for index_file in doomed:
            index_file.close()
            os.unlink(index_file.path)
        self.files = self.files[len(doomed) :]
        return [f.path for f in doomed]

    def flush(self) -> None:
        for index_file in self.files:
            index_file.flush()

    def close(self) -> None:
        for index_file in self.files:
            index_file.close()
        self.files = []
