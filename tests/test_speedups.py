"""The compiled fast paths (common/codec/speedups_c/) against the Python definitions.

Each fast path either gives exactly what its Python function gives, or hands the bytes
back (None) so that the Python function decides; it never gives anything else. These
tests hold both to that on the Apache-written fixture and on mutated and random bytes.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import tempfile
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import CLEAN, CRASHED, FIXTURE_SIZES, read_jsonl
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rmqstore.common import message_rules as validate
from rmqstore.common.codec import columnar, javahash, record
from rmqstore.common.codec import index as ix
from rmqstore.common.codec import properties as props
from rmqstore.common.codec.hosts import SocketAddress
from rmqstore.common.codec.record import Blank, Record, decode_record, encode_record
from rmqstore.common.codec.speedups import _speedups
from rmqstore.common.errors import Corruption, CrcMismatch, InvalidArgument
from rmqstore.common.files.index import IndexFile

# Skipped only when the Python paths are asked for: an install that failed to build the
# extension fails here instead of passing as the (slower) Python paths.
pytestmark = pytest.mark.skipif(
    os.environ.get("RMQSTORE_PURE_PYTHON") == "1", reason="RMQSTORE_PURE_PYTHON=1: the Python paths alone"
)


def examples(count: int) -> int:
    """count, scaled by SPEEDUPS_EXAMPLES_SCALE (.ci/sanitize runs these tests at a
    fraction of their examples: under the sanitizers every call costs several times more)."""
    return max(10, round(count * float(os.environ.get("SPEEDUPS_EXAMPLES_SCALE", "1"))))


def test_every_install_builds_the_extension() -> None:
    assert _speedups is not None, "the install did not build rmqstore.common.codec._speedups"
    assert record.decode_record.__module__ == "rmqstore.common.codec.record"
    assert javahash.java_string_hash is _speedups.java_string_hash
    assert javahash.topic_key_hash is _speedups.index_key_hash


# String.hashCode


@given(st.text(max_size=200))
@example("")
@example("\U0001f600 emoji outside the BMP")
@example("\ud800 lone surrogate")
@example("é Latin-1 and ÿ")
@example("polygenelubricants")  # hashCode is Integer.MIN_VALUE
def test_java_string_hash_matches_the_python_definition(text: str) -> None:
    assert _speedups.java_string_hash(text) == javahash.python_java_string_hash(text)


@given(st.text(max_size=60), st.text(max_size=60))
@example("", "")
@example("TopicTest", "\U0001f600")
def test_topic_key_hash_is_the_index_hash_of_topic_hash_key(topic: str, key: str) -> None:
    h = javahash.python_java_string_hash(f"{topic}#{key}")
    expected = 0 if h == -(2**31) else abs(h)
    assert _speedups.index_key_hash(topic, key) == expected


def _topic_key_hashing_to_integer_min_value(topic: str) -> str:
    """A key whose topic#key has hashCode Integer.MIN_VALUE: "k", then seven characters
    that are the base-31 digits of what the polynomial still needs
    (h·31⁷ + Σ dᵢ·31^(6−i) ≡ 2³¹ mod 2³², and 31⁷ > 2³²)."""
    rest = (2**31 - javahash.python_java_string_hash(f"{topic}#k") * 31**7) % 2**32
    digits = []
    for _ in range(7):
        rest, digit = divmod(rest, 31)
        digits.append(chr(digit))
    return "k" + "".join(reversed(digits))


def test_topic_key_hash_of_integer_min_value_is_zero() -> None:
    key = _topic_key_hashing_to_integer_min_value("TopicTest")
    assert javahash.python_java_string_hash(f"TopicTest#{key}") == -(2**31)
    assert _speedups.index_key_hash("TopicTest", key) == 0
    assert _speedups.index_key_hash("TopicTest", key + "x") != 0


def test_hash_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match="takes a str"):
        _speedups.java_string_hash(b"bytes")
    with pytest.raises(TypeError, match=r"takes \(topic: str, key: str\)"):
        _speedups.index_key_hash("T", 1)


# Records


def _fixture_log() -> bytes:
    return b"".join(path.read_bytes() for path in sorted((CLEAN / "commitlog").iterdir()))


def _python(buf: bytes | memoryview, pos: int, *, check_crc: bool = True, end: int | None = None) -> object:
    """What the Python definition gives: an item, or the exception it raises."""
    try:
        return record._decode_record(buf, pos, pos, check_crc, len(buf) if end is None else end)
    except Exception as error:  # the outcome under comparison
        return error


def test_every_fixture_record_decodes_the_same_on_both_paths() -> None:
    data = _fixture_log()
    file_size = FIXTURE_SIZES.commitlog_file_size_bytes
    compared = 0
    for start in range(0, len(data), file_size):
        chunk = memoryview(data)[start : start + file_size]
        pos = 0
        while pos < len(chunk):
            expected = _python(chunk, pos)
            fast = _speedups.decode_record(chunk, pos, True, len(chunk))
            if isinstance(expected, Record):
                assert fast == expected
                assert dataclasses.astuple(fast) == dataclasses.astuple(expected)
                compared += 1
                pos += expected.size
            else:
                assert fast is None  # a Blank or the zeros after the data
                break
    dump = read_jsonl(CLEAN.parent / "store-clean-commitlog-dump.jsonl")
    assert compared == len(dump) == 2007  # every record Apache's dump lists


def test_bulk_reads_give_what_single_reads_give() -> None:
    """CommitLog.read_many (pread and decode in one compiled pass) against read() of each
    offset through the mapping: every record of Apache's logs, and None for the offsets
    where no record starts (inside records, BLANK fillers, the zeros after the data,
    past the files)."""
    from rmqstore.common.files.commitlog import CommitLog

    for root in (CLEAN, CRASHED):
        log = CommitLog(str(root / "commitlog"), FIXTURE_SIZES.commitlog_file_size_bytes)
        records = list(log.records(check_crc=True))
        starts = [record.commitlog_offset for record in records]
        others = [start + 1 for start in starts[::50]] + [records[-1].next_offset, log.max_file_offset, -5]
        others += [mapped.end_offset - 10 for mapped in log.files]  # BLANK fillers or zeros
        log.read_through_file = True
        assert log.read_many(starts) == records
        assert log.read_many(starts[::-1], check_crc=False) == records[::-1]
        assert log.read_many(others) == [None] * len(others)
        assert log.read_many(starts[:3] + others[:2]) == records[:3] + [None, None]
        log.read_through_file = False  # reads through the mappings: nothing in bulk
        assert log.read_many(starts[:5]) == [None] * 5
        log.close()


def test_bulk_reads_take_long_records_and_hand_back_bad_ones(tmp_path: Path) -> None:
    from rmqstore.common.files.commitlog import READ_AHEAD_BYTES

    long_body = bytes(range(256)) * 40  # longer than one read-ahead: a second pread
    assert len(long_body) > READ_AHEAD_BYTES
    first = _sample_record(commitlog_offset=0)
    second = _sample_record(commitlog_offset=len(first), body=long_body)
    third = _sample_record(commitlog_offset=len(first) + len(second))
    data = bytearray(first + second + third)
    path = tmp_path / "log"
    path.write_bytes(bytes(data) + bytes(100))
    fd = os.open(path, os.O_RDONLY)
    try:
        size = len(data) + 100
        offsets = [0, len(first), len(first) + len(second)]
        found = _speedups.read_records(fd, offsets, size, 0, READ_AHEAD_BYTES, True, None)
        assert [record.body for record in found] == [b"hello body", long_body, b"hello body"]
        assert found == [decode_record(bytes(data), offset) for offset in offsets]
        # A file starting elsewhere: each PHYSICALOFFSET names another offset.
        assert _speedups.read_records(fd, offsets, size, 4096, READ_AHEAD_BYTES, True, None) == [None] * 3
        # The long record cut short by the file's end, then a bad body CRC.
        assert _speedups.read_records(fd, offsets[1:2], len(first) + 2000, 0, READ_AHEAD_BYTES, True, None) == [None]
        data[len(first) + len(second) - 100] ^= 0xFF
        path.write_bytes(bytes(data) + bytes(100))
        assert _speedups.read_records(fd, offsets, size, 0, READ_AHEAD_BYTES, True, None)[1] is None
        assert _speedups.read_records(fd, offsets, size, 0, READ_AHEAD_BYTES, False, None)[1] is not None
        with pytest.raises(ValueError, match="at least 8"):
            _speedups.read_records(fd, offsets, size, 0, 4, True, None)
        with pytest.raises(TypeError):
            _speedups.read_records(fd, ["0"], size, 0, READ_AHEAD_BYTES, True, None)
    finally:
        os.close(fd)



# A KEYS value's bytes drawn from pieces that decide a key match: separators, the bytes
# that cut properties, invalid UTF-8, a two-byte letter and U+FFFD's own bytes.
KEYS_PIECES = [b"a", b"b", b" ", b"\x01", b"\x02", b"\xff", b"\xc3\xa9", b"\xef\xbf\xbd", b"KEYS\x01"]
MATCH_KEYS = ["a", "b", "ab", "\xe9", "a\xe9", "", "\ufffd", "a\ufffd", "\ud800"]


@settings(max_examples=examples(300), deadline=None)
@given(keys=st.lists(st.lists(st.sampled_from(KEYS_PIECES), max_size=8).map(b"".join), min_size=1, max_size=3))
def test_a_compiled_key_match_keeps_what_the_python_one_keeps(keys: list[bytes]) -> None:
    """read_records with a match against KeyMatch.__call__ on the record decoded in
    Python: KEYS values with empty parts, property separators, invalid UTF-8 (which
    decodes to U+FFFD) and repeated KEYS pairs (the last one counts); for keys with and
    without U+FFFD (which KeyMatch leaves to Python), other topics, and time windows and
    visible ranges that end at, just before and just after the record."""
    import itertools

    from rmqstore.common.files.commitlog import READ_AHEAD_BYTES, KeyMatch

    properties = b"\x02".join(b"KEYS\x01" + value for value in keys) + b"\x02UNIQ_KEY\x01a"
    data = encode_record(decode_record(_sample_record(commitlog_offset=0), 0), properties_bytes=properties)  # type: ignore[arg-type]
    expected = decode_record(data, 0)
    assert isinstance(expected, Record)
    stored = expected.store_timestamp_ms
    windows = [(0, 2**62), (stored, stored), (stored + 1, 2**62), (0, stored - 1)]
    visible = [(0, len(data)), (1, 10**9), (0, len(data) - 1)]
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "log"
        path.write_bytes(data)
        fd = os.open(path, os.O_RDONLY)
        try:
            for key, topic, window, bounds in itertools.product(MATCH_KEYS, ["TopicTest", "TopicTes", "Other"], windows, visible):
                match = KeyMatch(topic, key, *window, *bounds)
                compiled = match.compiled()
                assert (compiled is None) == ("\ufffd" in key or "\ud800" in key)
                (found,) = _speedups.read_records(fd, [0], len(data), 0, READ_AHEAD_BYTES, True, compiled)
                if compiled is None:
                    assert found == expected  # nothing decided here: read_many applies the match
                else:
                    assert found == (expected if match(expected) else False), match
        finally:
            os.close(fd)


def test_bulk_reads_with_a_key_match_keep_what_the_match_keeps() -> None:
    """CommitLog.read_many with a KeyMatch against the match applied to read() of each
    offset: every record of Apache's logs, for keys and topics they hold, a key they do
    not, time windows and visible ranges that cut them; None still where no record
    starts; and the same with a key the compiled pass leaves to Python."""
    from rmqstore.common.codec.properties import split_keys
    from rmqstore.common.files.commitlog import CommitLog, KeyMatch

    for root in (CLEAN, CRASHED):
        log = CommitLog(str(root / "commitlog"), FIXTURE_SIZES.commitlog_file_size_bytes)
        log.read_through_file = True
        records = list(log.records(check_crc=True))
        starts = [record.commitlog_offset for record in records]
        keyed = [record for record in records if split_keys(record.keys)]
        middle = records[len(records) // 2]
        matches = [
            KeyMatch(record.topic, split_keys(record.keys)[-1], 0, 2**62, 0, 2**62) for record in keyed[:: len(keyed) // 5]
        ]
        matches += [
            KeyMatch(keyed[0].topic, "no-such-key", 0, 2**62, 0, 2**62),
            KeyMatch(middle.topic, split_keys(middle.keys)[0], middle.store_timestamp_ms, 2**62, 0, 2**62),
            KeyMatch(middle.topic, split_keys(middle.keys)[0], 0, 2**62, middle.commitlog_offset, middle.next_offset),
            KeyMatch(middle.topic, split_keys(middle.keys)[0], 0, 2**62, 0, middle.next_offset - 1),
            KeyMatch(middle.topic, "\ufffd", 0, 2**62, 0, 2**62),
        ]
        kept = 0
        for match in matches:
            expected = [record if match(record) else False for record in records]
            assert log.read_many(starts, match=match) == expected
            assert log.read_many([*starts[:3], starts[0] + 1], match=match) == [*expected[:3], None]
            kept += sum(1 for record in expected if record is not False)
        assert kept > len(matches)  # the matches keep records, not only refuse them
        log.close()


def test_records_are_built_alike_with_slots_filled_or_through_init() -> None:
    """The compiled decoder fills a Record's slots in place; told nothing of the slots it
    calls Record(...) instead: the two give equal records, tracked by the collector, and
    configure refuses slot names Record does not have."""
    import gc

    data = _sample_record()
    filled = _speedups.decode_record(data, 0, True, len(data))
    assert gc.is_tracked(filled)
    try:
        _speedups.configure(Record, record._address, None)
        called = _speedups.decode_record(data, 0, True, len(data))
        with pytest.raises(TypeError, match="'bodies' is not an object slot"):
            names = tuple(f.name for f in dataclasses.fields(Record))
            _speedups.configure(Record, record._address, names[:1] + ("bodies",) + names[2:])
        with pytest.raises(TypeError, match="17 fields"):
            _speedups.configure(Record, record._address, names[:3])
    finally:
        _speedups.configure(Record, record._address, tuple(f.name for f in dataclasses.fields(Record)))
    assert called == filled == decode_record(data, 0)
    assert type(called) is type(filled) is Record
    assert [getattr(filled, name) for name in Record.__slots__] == [getattr(called, name) for name in Record.__slots__]


V6 = SocketAddress(bytes(range(16)), 443)


def test_time_bisection_in_a_file_gives_what_the_python_steps_give() -> None:
    """ConsumeQueue.offset_by_time with CommitLog.first_stored_after (one compiled pass
    once the range lies in one queue file and one log file) against the Python steps
    alone and against brute force, on every queue of Apache's stores (queue files of 200
    units and log files of 512 KiB, so ranges span both), at every store time, either
    side of it and beyond both ends."""
    from rmqstore.common.files.commitlog import CommitLog
    from rmqstore.common.files.consumequeue import Boundary, ConsumeQueue

    compiled_passes = 0
    for root in (CLEAN, CRASHED):
        log = CommitLog(str(root / "commitlog"), FIXTURE_SIZES.commitlog_file_size_bytes)
        log.read_through_file = True
        times: dict[tuple[str, int], list[int]] = {}
        for item in log.records(check_crc=False):
            times.setdefault((item.topic, item.queue_id), []).append(item.store_timestamp_ms)

        def bisect_file(*args, log=log):  # type: ignore[no-untyped-def]
            nonlocal compiled_passes
            found = log.first_stored_after(*args)
            compiled_passes += found is not None
            return found

        for (topic, queue_id), queue_times in times.items():
            queue = ConsumeQueue(str(root / "consumequeue"), topic, queue_id, FIXTURE_SIZES.cq_file_units)
            if queue.max_offset - queue.min_offset != len(queue_times):
                queue.close()  # the crashed store's last records were never dispatched
                continue
            probes = sorted({t + d for t in queue_times for d in (-1, 0, 1)} | {0, 2**62})
            for probe in probes:
                for boundary in Boundary:
                    stored_at = log.store_timestamp
                    fast = queue.offset_by_time(probe, lambda u, at=stored_at: at(u.commitlog_offset), boundary,
                                                bisect_file=bisect_file)  # fmt: skip
                    python = queue.offset_by_time(probe, lambda u, at=stored_at: at(u.commitlog_offset), boundary)
                    if boundary is Boundary.LOWER:
                        expected = next((i for i, t in enumerate(queue_times) if t >= probe), len(queue_times))
                    else:
                        expected = max((i for i, t in enumerate(queue_times) if t <= probe), default=-1)
                    assert fast == python == queue.min_offset + expected, (topic, queue_id, probe, boundary)
            queue.close()
        log.close()
    assert compiled_passes > 1000


def _timed_log(tmp_path: Path, times: list[int], **changes: object) -> tuple[int, int, bytes, list[int]]:
    """A log file of records stored at ``times`` and the units of a queue over them:
    (descriptor, file size, units, offsets)."""
    data = bytearray()
    offsets = []
    for n, stored in enumerate(times):
        offsets.append(len(data))
        data += _sample_record(commitlog_offset=len(data), store_timestamp_ms=stored, queue_offset=n, **changes)
    path = tmp_path / "log"
    path.write_bytes(bytes(data) + bytes(64))
    units = b"".join(struct.pack(">qiq", offset, 100, 0) for offset in offsets)
    return os.open(path, os.O_RDONLY), len(data) + 64, units, offsets


@pytest.mark.parametrize("born_host", [SocketAddress(b"\x7f\x00\x00\x01", 1), V6], ids=["ipv4", "born-v6"])
def test_time_bisection_finds_the_first_record_stored_at_or_after(tmp_path: Path, born_host: SocketAddress) -> None:
    import bisect

    times = [100, 100, 105, 107, 107, 107, 200, 201, 350]
    fd, size, units, _ = _timed_log(tmp_path, times, born_host=born_host)
    try:
        for probe in range(95, 360):
            assert _speedups.first_stored_after(units, 0, len(times), probe, False, fd, 0, size) == bisect.bisect_left(times, probe)
            assert _speedups.first_stored_after(units, 0, len(times), probe, True, fd, 0, size) == bisect.bisect_right(times, probe)
            assert _speedups.first_stored_after(units, 2, 6, probe, False, fd, 0, size) == 2 + bisect.bisect_left(times[2:6], probe)
        assert _speedups.first_stored_after(units, 4, 4, 0, False, fd, 0, size) == 4  # an empty range
    finally:
        os.close(fd)


def test_time_bisection_hands_back_what_it_cannot_read(tmp_path: Path) -> None:
    from rmqstore.common.codec import consumequeue as cq

    times = [10, 20, 30, 40, 50]
    fd, size, units, offsets = _timed_log(tmp_path, times)
    middle = 2 * cq.UNIT_SIZE  # the first unit probed of five

    def with_unit(offset: int, unit_size: int = 100) -> bytes:
        return units[:middle] + struct.pack(">qiq", offset, unit_size, 0) + units[middle + cq.UNIT_SIZE :]

    try:
        assert _speedups.first_stored_after(units, 0, 5, 30, False, fd, 0, size) == 2
        assert _speedups.first_stored_after(with_unit(offsets[2] + 1), 0, 5, 30, False, fd, 0, size) is None  # no record
        assert _speedups.first_stored_after(cq.FILLER.join([units[:middle], units[middle + cq.UNIT_SIZE :]]), 0, 5, 30, False, fd, 0, size) is None
        assert _speedups.first_stored_after(with_unit(size + 10), 0, 5, 30, False, fd, 0, size) is None  # past the file
        assert _speedups.first_stored_after(units, 0, 5, 30, False, fd, 4096, size) is None  # a file starting elsewhere
        assert _speedups.first_stored_after(units, 0, 5, 30, False, fd, 0, offsets[2] + 60) is None  # cut inside the header
        # Units the probes never reach are never read.
        assert _speedups.first_stored_after(with_unit(offsets[2] + 1), 3, 5, 45, False, fd, 0, size) == 4
        with pytest.raises(ValueError, match="outside the units"):
            _speedups.first_stored_after(units, 0, 6, 30, False, fd, 0, size)
        with pytest.raises(ValueError, match="outside the units"):
            _speedups.first_stored_after(units, 3, 2, 30, False, fd, 0, size)
        with pytest.raises(TypeError):
            _speedups.first_stored_after(units, 0, 5, 30, False, fd, 0)
    finally:
        os.close(fd)


def test_time_search_over_a_damaged_record_fails_alike_both_ways(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A queue unit pointing where no record starts: the compiled read of the queue's store
    times (query.timeindex) stops there and hands that unit back, and the Python read of it
    raises the error the Python reads alone raise."""
    import shutil

    from rmqstore.common.errors import NotFound
    from rmqstore.common.files import commitlog as commitlog_module
    from rmqstore.common.files.consumequeue import Boundary
    from rmqstore.query.view import StoreView

    shutil.copytree(CLEAN, tmp_path / "store")
    view = StoreView(str(tmp_path / "store"), FIXTURE_SIZES)
    low, high = view.queue_bounds("TopicTest", 3)
    queue = view._queue("TopicTest", 3)
    target = view.log.store_timestamp(queue.read(high - 1).commitlog_offset)
    damaged = (low + high) // 2
    offset = queue.read(damaged).commitlog_offset
    view.close()
    queue_file = tmp_path / "store" / "consumequeue" / "TopicTest" / "3" / "00000000000000000000"
    units = bytearray(queue_file.read_bytes())
    struct.pack_into(">q", units, damaged * 20, offset + 1)
    queue_file.write_bytes(bytes(units))

    passes: list[tuple[int, int]] = []  # (first unit asked for, units read)
    original = commitlog_module.CommitLog.store_times_of_units

    def store_times_of_units(self, units, lo, hi, out):  # type: ignore[no-untyped-def]
        passes.append((lo, original(self, units, lo, hi, out)))
        return passes[-1][1]

    monkeypatch.setattr(commitlog_module.CommitLog, "store_times_of_units", store_times_of_units)
    errors = []
    for compiled in (True, False):
        with monkeypatch.context() as patch:
            if not compiled:
                patch.setattr(commitlog_module, "_speedups", None)
            view = StoreView(str(tmp_path / "store"), FIXTURE_SIZES)
            with pytest.raises(NotFound) as raised:
                view.search_offset("TopicTest", 3, target, Boundary.LOWER)
            errors.append(str(raised.value))
            view.close()
        if compiled:  # the compiled reads took every unit before the damaged one
            assert passes and sum(read for _, read in passes) == damaged - low
    assert errors[0] == errors[1] == f"no record at commit log offset {offset + 1}"


def test_store_times_read_each_units_record_and_stop_where_they_cannot(tmp_path: Path) -> None:
    from array import array

    from rmqstore.common.codec import consumequeue as cq

    times = [10, 20, 20, 40, 50]
    fd, size, units, offsets = _timed_log(tmp_path, times, born_host=V6)
    out = array("q", bytes(8 * 5))
    try:
        assert _speedups.store_times(units, 0, 5, fd, 0, size, out) == 5 and list(out) == times
        out = array("q", bytes(8 * 5))
        assert _speedups.store_times(units, 1, 4, fd, 0, size, out) == 3 and list(out[:3]) == times[1:4]
        damaged = units[: 3 * cq.UNIT_SIZE] + struct.pack(">qiq", offsets[3] + 1, 100, 0) + units[4 * cq.UNIT_SIZE :]
        assert _speedups.store_times(damaged, 0, 5, fd, 0, size, out) == 3  # no record at the fourth
        assert _speedups.store_times(units, 0, 5, fd, 0, offsets[2], out) == 2  # the third lies past the file
        assert _speedups.store_times(cq.FILLER + units, 0, 5, fd, 0, size, out) == 0
        with pytest.raises(ValueError, match="fewer int64s"):
            _speedups.store_times(units, 0, 5, fd, 0, size, array("q", bytes(8 * 4)))
        with pytest.raises(ValueError, match="outside the units"):
            _speedups.store_times(units, 0, 6, fd, 0, size, array("q", bytes(8 * 6)))
    finally:
        os.close(fd)


def _sample_record(**changes: object) -> bytes:
    fields = dict(
        topic="TopicTest",
        body=b"hello body",
        properties={"KEYS": "order-1 cust-9", "TAGS": "TagA", "UNIQ_KEY": "7F00000100002A9F0000000000000001"},
        queue_id=3,
        flag=5,
        queue_offset=42,
        commitlog_offset=4096,
        sys_flag=0,
        born_timestamp_ms=1_795_000_000_000,
        born_host=SocketAddress(b"\x7f\x00\x00\x01", 50123),
        store_timestamp_ms=1_795_000_000_007,
        store_host=SocketAddress(b"\x0a\x00\x00\x02", 10911),
        reconsume_times=2,
        prepared_transaction_offset=77,
    )
    fields.update(changes)
    return encode_record(Record(**fields))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"born_host": V6},
        {"store_host": V6},
        {"born_host": V6, "store_host": V6},
        {"body": b""},
        {"properties": {}},
        {"topic": "é-not-ascii"},
        {"properties": {"KEYS": "k", "WEIRD\x01NAME": "v\x01w", "TAGS": "t"}},
        {"sys_flag": 0xC},
    ],
    ids=["ipv4", "born-v6", "store-v6", "both-v6", "empty-body", "no-properties", "utf8-topic", "0x01-in-value", "rollback"],
)
def test_well_formed_records_decode_the_same(changes: dict[str, object]) -> None:
    encoded = b"\x00" * 7 + _sample_record(**changes) + b"\x00" * 5
    expected = _python(encoded, 7)
    assert isinstance(expected, Record)
    assert _speedups.decode_record(encoded, 7, True, len(encoded)) == expected
    assert decode_record(encoded, 7) == expected


def test_version_2_records_decode_the_same() -> None:
    v1 = bytearray(_sample_record())
    topic_at = len(v1) - 2 - len(b"KEYS\x01order-1 cust-9\x02TAGS\x01TagA\x02UNIQ_KEY\x017F00000100002A9F0000000000000001")
    topic_at -= len(b"TopicTest") + 1
    # v2: magic DAA320AB, a 2-byte TOPICLENGTH, one byte longer.
    v2 = v1[:topic_at] + struct.pack(">h", v1[topic_at]) + v1[topic_at + 1 :]
    struct.pack_into(">ii", v2, 0, len(v2), record.MAGIC_V2)
    expected = _python(bytes(v2), 0)
    assert isinstance(expected, Record) and expected.version == 2 and expected.topic == "TopicTest"
    assert _speedups.decode_record(bytes(v2), 0, True, len(v2)) == expected


@pytest.mark.parametrize(
    "name, mutate, error",
    [
        ("zeros", lambda b: bytes(len(b)), None),
        ("blank", lambda b: struct.pack(">ii", len(b), record.BLANK_MAGIC) + b[8:], Blank),
        ("bad magic", lambda b: b[:4] + b"\x01\x02\x03\x04" + b[8:], Corruption),
        ("size past the end", lambda b: struct.pack(">i", len(b) + 1) + b[4:], Corruption),
        ("size below the minimum", lambda b: struct.pack(">i", 90) + b[4:], Corruption),
        ("body CRC", lambda b: b[:8] + struct.pack(">i", 12345) + b[12:], CrcMismatch),
        ("body length", lambda b: b[:84] + struct.pack(">i", 2**30) + b[88:], Corruption),
        ("negative body length", lambda b: b[:84] + struct.pack(">i", -1) + b[88:], Corruption),
        ("truncated", lambda b: b[:60], Corruption),
    ],
)
def test_anything_but_a_good_record_is_handed_back(name: str, mutate, error) -> None:  # type: ignore[no-untyped-def]
    bad = mutate(_sample_record())
    assert _speedups.decode_record(bad, 0, True, len(bad)) is None
    expected = _python(bad, 0)
    if error is None:
        assert expected is None
    else:
        assert isinstance(expected, error)
    outcome: object
    try:
        outcome = decode_record(bad, 0)
    except Corruption as raised:
        outcome = raised
    assert type(outcome) is type(expected)
    assert str(outcome) == str(expected)


def test_the_crc_is_checked_only_when_asked() -> None:
    bad = bytearray(_sample_record())
    bad[-40] ^= 0xFF  # inside the properties: the body CRC still holds
    bad_body = bytearray(_sample_record())
    bad_body[88] ^= 0xFF  # the body's first byte
    assert _speedups.decode_record(bytes(bad_body), 0, True, len(bad_body)) is None
    unchecked = _speedups.decode_record(bytes(bad_body), 0, False, len(bad_body))
    assert unchecked == _python(bytes(bad_body), 0, check_crc=False)
    assert unchecked.body[0] == ord("h") ^ 0xFF
    assert zlib.crc32(unchecked.body) & 0x7FFFFFFF != unchecked.body_crc


def test_a_large_body_decodes_the_same_and_its_crc_is_checked() -> None:
    """Bodies from 256 KiB are checked and copied without the GIL: the same record, and a
    flipped byte in the body still hands the record back."""
    for length in (256 * 1024 - 1, 256 * 1024, 4 * 1024 * 1024):
        body = bytes(range(256)) * (length // 256) + b"x" * (length % 256)
        encoded = b"\x00" * 3 + _sample_record(body=body, body_crc=zlib.crc32(body) & 0x7FFFFFFF)
        decoded = _speedups.decode_record(encoded, 3, True, len(encoded))
        assert decoded == _python(encoded, 3) and decoded.body == body
        flipped = bytearray(encoded)
        flipped[3 + 88 + length // 2] ^= 0x01
        assert _speedups.decode_record(bytes(flipped), 3, True, len(flipped)) is None
        assert _speedups.decode_record(bytes(flipped), 3, False, len(flipped)).body[length // 2] == body[length // 2] ^ 0x01


def test_the_end_limits_what_is_read() -> None:
    encoded = _sample_record()
    assert _speedups.decode_record(encoded, 0, True, len(encoded) - 1) is None
    assert isinstance(_python(encoded, 0, end=len(encoded) - 1), Corruption)
    assert _speedups.decode_record(encoded, 0, True, len(encoded) + 100) == _python(encoded, 0)
    assert _speedups.decode_record(encoded, -1, True, len(encoded)) is None
    assert _speedups.decode_record(encoded, len(encoded) - 4, True, len(encoded)) is None


@settings(max_examples=examples(400), deadline=None)
@given(st.data())
def test_mutated_records_never_decode_differently(data: st.DataObject) -> None:
    """Whatever a byte flip does, the fast path gives the Python result or hands back."""
    encoded = bytearray(_sample_record(born_host=data.draw(st.sampled_from([V6, SocketAddress(b"\x01\x02\x03\x04", 1)]))))
    for _ in range(data.draw(st.integers(1, 4))):
        encoded[data.draw(st.integers(0, len(encoded) - 1))] = data.draw(st.integers(0, 255))
    end = data.draw(st.integers(0, len(encoded)))
    check_crc = data.draw(st.booleans())
    fast = _speedups.decode_record(bytes(encoded), 0, check_crc, end)
    expected = _python(bytes(encoded), 0, check_crc=check_crc, end=end)
    if fast is not None:
        assert fast == expected


@given(st.binary(min_size=8, max_size=300))
def test_random_properties_decode_the_same(properties: bytes) -> None:
    encoded = _sample_record()
    head_and_body = encoded[: 88 + len(b"hello body")]
    tail = bytes([len(b"TopicTest")]) + b"TopicTest" + struct.pack(">h", len(properties)) + properties
    rebuilt = bytearray(head_and_body + tail)
    struct.pack_into(">i", rebuilt, 0, len(rebuilt))
    expected = _python(bytes(rebuilt), 0)
    assert isinstance(expected, Record)
    assert _speedups.decode_record(bytes(rebuilt), 0, True, len(rebuilt)) == expected


# Index chains


def _walk(buf: bytes | memoryview, slots: int, entries: int, key_hash: int, chunk: int) -> list[int] | None:
    """The whole walk, resumed every ``chunk`` matches; None where the walk hands back."""
    offsets: list[int] = []
    number = steps = 0
    while True:
        found = _speedups.matching_offsets(buf, slots, entries, key_hash, number, steps, chunk)
        if found is None:
            return None
        part, number, steps = found
        assert len(part) <= chunk
        offsets += part
        if number == 0:
            return offsets


def test_every_fixture_chain_walks_the_same() -> None:
    for path in sorted((CLEAN / "index").iterdir()):
        index_file = IndexFile.open(str(path), FIXTURE_SIZES.index_slots, FIXTURE_SIZES.index_entries, writable=False)
        try:
            buf = index_file.mapped.buf
            hashes = {
                ix.ENTRY.unpack_from(buf, ix.entry_position(index_file.slots, n))[0]
                for n in range(1, index_file.header.index_count)
            }
            assert len(hashes) > 10
            walked = 0
            for key_hash in sorted(hashes) + [1, 499, 12345]:
                expected = list(index_file._matching_offsets(buf, key_hash))
                assert _walk(buf, index_file.slots, index_file.entries, key_hash, 10**6) == expected
                for chunk in (1, 2, 3):
                    assert _walk(buf, index_file.slots, index_file.entries, key_hash, chunk) == expected
                assert list(index_file.matching_offsets(key_hash)) == expected
                walked += len(expected)
            assert walked >= index_file.header.index_count - 1
        finally:
            index_file.close()


def test_a_chain_leading_outside_the_file_is_handed_back() -> None:
    slots, entries = 4, 8
    buf = bytearray(ix.HEADER_SIZE + slots * ix.SLOT_SIZE + 3 * ix.ENTRY_SIZE)  # 8 entries declared, 3 there
    struct.pack_into(">i", buf, ix.HEADER_OFFSET_INDEX_COUNT, 6)
    struct.pack_into(">i", buf, ix.slot_position(7 % slots), 5)  # slot → entry 5, past the buffer
    assert _walk(bytes(buf), slots, entries, 7, 10) is None
    struct.pack_into(">i", buf, ix.slot_position(7 % slots), 2)
    ix.ENTRY.pack_into(buf, ix.entry_position(slots, 2), 7, 1000, 0, 1)
    ix.ENTRY.pack_into(buf, ix.entry_position(slots, 1), 7, 900, 0, 0)
    assert _walk(bytes(buf), slots, entries, 7, 10) == [1000, 900]
    assert _speedups.matching_offsets(bytes(buf), slots, entries, 7, 0, 0, 1) == ([1000], 1, 1)
    assert _speedups.matching_offsets(bytes(buf), slots, entries, 7, 1, 1, 1) == ([900], 0, 2)
    assert _walk(bytes(buf[:30]), slots, entries, 7, 10) is None
    # Entry 2 leads to entry 4, past the buffer, after one match: handed back mid-walk,
    # and the file's walk yields that match before the Python walk's own error.
    ix.ENTRY.pack_into(buf, ix.entry_position(slots, 2), 7, 1000, 0, 4)
    assert _speedups.matching_offsets(bytes(buf), slots, entries, 7, 0, 0, 1) == ([1000], 4, 1)
    assert _walk(bytes(buf), slots, entries, 7, 1) is None


def _put_both_ways(slots: int, start: int, begin_ts: int, prefill: dict[int, int], keys: list[tuple[int, int, int]]):  # type: ignore[no-untyped-def]
    """The bytes of an index file after put_keys on each path (and put_key one by one),
    each from the same header and slot table."""
    from rmqstore.common.files import index as index_module

    entries = start + len(keys) + 3
    results = []
    with tempfile.TemporaryDirectory() as directory:
        for way in ("compiled", "numpy", "one by one"):
            path = os.path.join(directory, way)
            made = IndexFile.create(path, slots, entries, prev_end_phy_offset=0, prev_end_timestamp_ms=0)
            struct.pack_into(">q", made.mapped.buf, 0, begin_ts)
            struct.pack_into(">i", made.mapped.buf, ix.HEADER_OFFSET_INDEX_COUNT, start)
            for slot, value in prefill.items():
                struct.pack_into(">i", made.mapped.buf, ix.slot_position(slot), value)
            made.close()
            index_file = IndexFile.open(path, slots, entries, writable=True)
            hashes, offsets, times = (np.array(column, dtype=np.int64).reshape(-1) for column in zip(*keys))
            with pytest.MonkeyPatch.context() as patch:
                if way != "compiled":
                    patch.setattr(index_module, "_speedups", None)
                if way == "one by one":
                    put = sum(index_file.put_key(*key) for key in keys)
                else:
                    put = index_file.put_keys(hashes, offsets, times)
            results.append((put, bytes(index_file.mapped.buf)))
            index_file.close()
    return results


@settings(max_examples=examples(200), deadline=None)
@given(
    st.integers(1, 9),
    st.integers(1, 6),
    st.sampled_from([0, -5, 1_700_000_000_000]),
    st.dictionaries(st.integers(0, 8), st.integers(-(2**31), 2**31 - 1), max_size=9),
    st.lists(
        st.tuples(
            st.integers(0, 2**31 - 1),
            st.integers(0, 2**63 - 1),
            st.one_of(st.integers(1_699_999_990_000, 1_700_000_090_000), st.integers(-(2**40), 2**62)),
        ),
        min_size=1,
        max_size=40,
    ),
)
def test_index_put_keys_writes_what_putting_one_key_at_a_time_writes(slots, start, begin_ts, prefill, keys) -> None:  # type: ignore[no-untyped-def]
    prefill = {slot % slots: value for slot, value in prefill.items()}
    compiled, vectorized, one_by_one = _put_both_ways(slots, start, begin_ts, prefill, keys)
    assert compiled[0] == vectorized[0] == len(keys)
    assert compiled[1] == vectorized[1]
    if not any(value == start + i for i, (key_hash, _, _) in enumerate(keys) for value in [prefill.get(key_hash % slots)]):
        assert one_by_one == compiled


def test_index_put_keys_hands_back_a_slot_naming_the_entry_about_to_be_written() -> None:
    slots, start = 5, 3
    buf = bytearray(ix.HEADER_SIZE + slots * ix.SLOT_SIZE + 10 * ix.ENTRY_SIZE)
    struct.pack_into(">i", buf, ix.slot_position(12 % slots), start + 1)  # the second key's entry
    before = bytes(buf)
    columns = [np.array(column, dtype=np.int64) for column in ([7, 12], [100, 200], [1_000, 2_000])]
    assert _speedups.index_put_keys(buf, slots, start, 1_000, *columns) is None
    assert bytes(buf) == before  # nothing written
    assert _speedups.index_put_keys(buf[: len(buf) - 6 * ix.ENTRY_SIZE], slots, start, 1_000, *columns) is None
    with pytest.raises(ValueError, match="differ in length"):
        _speedups.index_put_keys(buf, slots, start, 1_000, columns[0], columns[1][:1], columns[2])
    negative = [np.array([-1], dtype=np.int64), columns[1][:1], columns[2][:1]]
    assert _speedups.index_put_keys(buf, slots, start, 1_000, *negative) is None
    with pytest.raises(BufferError, match="not writable"):
        _speedups.index_put_keys(bytes(buf), slots, start, 1_000, *columns)


# The writer's batch screen

_SCREEN_LIMITS = [
    validate.Limits(max_body_bytes=10, max_keys=2, max_key_length=4, max_batch_messages=100),
    # KEYS at their longest leave TAGS 3 characters of the properties.
    validate.Limits(max_body_bytes=10, max_keys=1, max_key_length=32_571, max_batch_messages=100),
]
_SCREEN_TEXT = st.text(alphabet=["a", "Z", "0", " ", "\x01", "\x02", "-", "é", "\U0001f600"], max_size=6)


def _screens(batch: validate.MessageBatch, limits: validate.Limits) -> tuple[bool, bool]:
    compiled = validate.plainly_valid(batch, limits)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(validate, "_speedups", None)
        return compiled, validate.plainly_valid(batch, limits)


@settings(max_examples=examples(400), deadline=None)
@given(
    st.sampled_from(_SCREEN_LIMITS),
    st.lists(
        st.tuples(
            st.binary(max_size=12),
            st.lists(_SCREEN_TEXT, max_size=3).map(tuple),
            _SCREEN_TEXT,
            st.one_of(st.none(), st.integers(-2, 3), st.just(2**70)),
            st.one_of(_SCREEN_TEXT, st.sampled_from(["A" * 128, "A" * 129])),
        ),
        min_size=1,
        max_size=6,
    ),
)
def test_the_batch_screen_agrees_with_the_python_screen(limits: validate.Limits, messages) -> None:  # type: ignore[no-untyped-def]
    batch = validate.MessageBatch.of(
        [
            validate.MessageInput("TopicA", body, keys=keys, tags=tags, queue_id=queue_id, uniq_key=uniq_key)
            for body, keys, tags, queue_id, uniq_key in messages
        ]
    )
    compiled, python = _screens(batch, limits)
    assert compiled == python
    if compiled:  # the screen only passes what the message-by-message check passes
        for position in range(batch.message_count):
            validate.validate_message(batch.message(position), limits, position + 1)


def test_the_batch_screen_sends_values_of_other_types_to_the_message_checks() -> None:
    limits = _SCREEN_LIMITS[0]
    good = validate.MessageInput("TopicA", b"body", keys=("k1",), tags="t", uniq_key="AB12")
    assert _screens(validate.MessageBatch.of([good, good]), limits) == (True, True)
    for odd in (
        good._replace(body=bytearray(b"body")),
        good._replace(keys=iter(["k1"])),
        good._replace(keys=("k1", 5)),
        good._replace(tags=None),
        good._replace(uniq_key=None),
        good._replace(queue_id=1.5),
        good._replace(queue_id=-(2**70)),
    ):
        batch = validate.MessageBatch.of([good, odd])
        assert _speedups.screen_batch(
            batch.bodies, batch.keys, batch.tags, batch.uniq_keys, batch.queue_ids, 10, 2, 4, 100
        ) is False, odd  # fmt: skip
    batch = validate.MessageBatch.of([good])
    with pytest.raises(TypeError, match="bodies"):
        _speedups.screen_batch(5, batch.keys, batch.tags, batch.uniq_keys, batch.queue_ids, 10, 2, 4, 100)
    assert _speedups.screen_batch(batch.bodies * 2, batch.keys, batch.tags, batch.uniq_keys, batch.queue_ids, 10, 2, 4, 100) is False


# Encoding a batch

HOSTS = [SocketAddress(b"\x7f\x00\x00\x01", 50123), SocketAddress(b"\x0a\x00\x00\x07", 1), V6]


@settings(max_examples=examples(150), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["TopicA", "%RETRY%group", "T" * 127]),
            st.binary(max_size=300),
            st.binary(max_size=120),
            st.integers(0, 2**31 - 1),
            st.integers(-(2**31), 2**31 - 1),
            st.integers(0, 2**63 - 1),
            st.one_of(st.none(), st.just(0), st.integers(1, 2**62)),
            st.sampled_from(HOSTS),
        ),
        min_size=1,
        max_size=30,
    ),
    st.sampled_from(HOSTS),
    st.integers(0, 2**40),
)
def test_batch_encoding_equals_the_python_definition(messages, store_host: SocketAddress, first_offset: int) -> None:  # type: ignore[no-untyped-def]
    topics, bodies, properties, queue_ids, flags, queue_offsets, born_timestamps, born_hosts = (
        list(column) for column in zip(*messages)
    )
    arguments = (first_offset, queue_ids, flags, queue_offsets, born_timestamps, born_hosts, bodies, topics, properties,
                 1_795_000_000_123, store_host, 1_795_000_000_100)  # fmt: skip
    joined, sizes = _speedups.encode_records(*arguments)
    assert (joined, sizes) == record.python_encode_records(*arguments)
    # And each record reads back with its own fields.
    position = 0
    for n, size in enumerate(sizes):
        decoded = decode_record(joined, position)
        assert isinstance(decoded, Record) and decoded.size == size
        assert decoded.commitlog_offset == first_offset + position
        assert (decoded.topic, decoded.body, decoded.queue_offset) == (topics[n], bodies[n], queue_offsets[n])
        assert decoded.born_timestamp_ms == (born_timestamps[n] or 1_795_000_000_100)
        assert decoded.born_host == born_hosts[n] and decoded.store_host == store_host
        position += size
    assert position == len(joined)


def test_batch_encoding_refuses_what_it_cannot_encode() -> None:
    host = HOSTS[0]

    def encode(**changes: object) -> tuple[bytes, list[int]]:
        columns: dict[str, object] = dict(
            queue_ids=[0], flags=[0], queue_offsets=[0], born_timestamps=[None], born_hosts=[host], bodies=[b"x"],
            topics=["T"], properties=[b""],
        )
        columns.update(changes)
        return _speedups.encode_records(0, *columns.values(), 1, host, 1)

    assert encode()[1] == [93]
    with pytest.raises(ValueError, match="columns of different lengths"):
        encode(flags=[0, 0])
    with pytest.raises(TypeError, match="as lists"):
        encode(bodies=(b"x",))
    with pytest.raises(TypeError, match="bodies and properties are bytes"):
        encode(bodies=["x"])
    with pytest.raises(ValueError, match="a topic is at most 127 bytes"):
        encode(topics=["T" * 128])
    with pytest.raises(ValueError, match="4 or 16 bytes"):
        encode(born_hosts=[SimpleNamespace(ip=b"\x01\x02", port=3)])
    with pytest.raises(OverflowError, match="outside int32"):
        encode(queue_ids=[2**40])
    with pytest.raises(OverflowError):
        encode(queue_offsets=[2**64])


@given(
    st.lists(
        st.tuples(
            st.lists(st.text(min_size=1, max_size=8).filter(lambda t: not any(0xD800 <= ord(c) < 0xE000 for c in t)), min_size=1, max_size=3),
            st.text(min_size=1, max_size=8).filter(lambda t: not any(0xD800 <= ord(c) < 0xE000 for c in t)),
            st.text(alphabet="0123456789ABCDEF", min_size=1, max_size=32),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_common_properties_equal_the_template(messages: list[tuple[list[str], str, str]]) -> None:
    keys, tags, uniq_keys = (list(column) for column in zip(*messages))
    expected = [
        props._KEYS_TAGS_UNIQ_KEY.format(" ".join(k), t, u).encode("utf-8") for k, t, u in zip(keys, tags, uniq_keys)
    ]
    assert _speedups.encode_common_properties(props._COMMON_ORDER, keys, tags, uniq_keys) == expected
    assert props.encode_messages_properties([{}] * len(keys), keys, tags, uniq_keys) == expected


_property_text = st.text(min_size=1, max_size=12).filter(
    lambda t: not any(0xD800 <= ord(c) < 0xE000 for c in t) and "\x01" not in t and "\x02" not in t
)


@settings(max_examples=examples(300))
@given(
    st.dictionaries(_property_text.filter(lambda name: name not in (props.KEYS, props.TAGS, props.UNIQ_KEY)), _property_text, min_size=1, max_size=6),
    st.lists(
        st.tuples(st.lists(_property_text, min_size=1, max_size=3), _property_text, st.text(alphabet="0123456789ABCDEF", min_size=1, max_size=32)),
        min_size=1,
        max_size=8,
    ),
)
@example({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, [(["k1"], "T", "AB01")])
def test_properties_shared_by_every_message_fill_as_each_message_encodes_alone(
    shared: dict[str, str], messages: list[tuple[list[str], str, str]]
) -> None:
    """Messages sharing one mapping of properties (a traced producer's trace context) take
    the compiled fill: each message's bytes are what it encodes to alone (broker order)."""
    keys, tags, uniq_keys = (list(column) for column in zip(*messages))
    expected = [props.encode_message_properties(shared, k, t, u) for k, t, u in zip(keys, tags, uniq_keys)]
    assert expected == [props.encode_properties(props.broker_order({**shared, props.KEYS: " ".join(k), props.TAGS: t, props.UNIQ_KEY: u})) for k, t, u in zip(keys, tags, uniq_keys)]
    assert props.encode_messages_properties([shared] * len(keys), keys, tags, uniq_keys) == expected
    order, pieces = props._shared_pieces(tuple(shared.items()))
    assert _speedups.encode_common_properties(order, keys, tags, uniq_keys, pieces) == expected


def test_common_properties_refuse_what_utf8_cannot_hold() -> None:
    with pytest.raises(UnicodeEncodeError):
        _speedups.encode_common_properties(props._COMMON_ORDER, [["\ud800"]], ["t"], ["u"])
    with pytest.raises(ValueError, match="positions 0, 1 and 2"):
        _speedups.encode_common_properties((0, 1, 5), [["k"]], ["t"], ["u"])
    with pytest.raises(TypeError, match="pieces are bytes"):
        _speedups.encode_common_properties(props._COMMON_ORDER, [["k"]], ["t"], ["u"], ("a", b"", b"", b""))
    with pytest.raises(TypeError, match=r"uniq_keys\[, pieces\]"):
        _speedups.encode_common_properties(props._COMMON_ORDER, [["k"]], ["t"], ["u"], (b"", b""))


# Walking and checking records in bulk


@given(st.lists(st.binary(max_size=700), min_size=1, max_size=20))
@example([b""])
@example([b"123456789"])  # the CRC-32 check value: CBF43926
def test_body_crcs_are_utilcrc32_of_each_body(bodies: list[bytes]) -> None:
    data = b"\xee" + b"".join(bodies)
    lengths = np.array([len(b) for b in bodies], dtype=np.int64)
    at = 1 + np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    computed = np.frombuffer(_speedups.body_crcs(np.frombuffer(data, np.uint8), at, lengths), np.int64)
    assert computed.tolist() == [record.body_crc(b) for b in bodies]
    if bodies == [b"123456789"]:
        assert computed.tolist() == [0xCBF43926 & 0x7FFFFFFF]


def test_body_crcs_of_every_length_and_alignment_are_zlibs() -> None:
    """Bodies of 64 bytes and more are folded with carry-less multiplication where the
    CPU allows (16 bytes at a time, the rest by table): every length up to 600 and some
    large ones, at every alignment mod 16, random bytes."""
    generator = np.random.default_rng(20261123)
    lengths = list(range(601)) + [4096, 4097, 65_535, 1 << 20]
    for shift in range(16):
        bodies = [generator.integers(0, 256, n, dtype=np.uint8).tobytes() for n in lengths]
        data = bytes(shift) + b"".join(bodies)
        sizes = np.array(lengths, np.int64)
        at = shift + np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        computed = np.frombuffer(_speedups.body_crcs(np.frombuffer(data, np.uint8), at, sizes), np.int64)
        assert computed.tolist() == [zlib.crc32(b) & 0x7FFFFFFF if b else 0 for b in bodies]


def test_body_crcs_refuse_a_body_outside_the_data() -> None:
    data = np.zeros(10, np.uint8)
    with pytest.raises(ValueError, match="a body outside the data"):
        _speedups.body_crcs(data, np.array([5], np.int64), np.array([6], np.int64))
    with pytest.raises(ValueError, match="int64 columns of one length"):
        _speedups.body_crcs(data, np.array([5], np.int64), np.array([1, 2], np.int64))


def _walks(buf: bytes, position: int, stop: int, rows_max: int, bytes_max: int, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    fast = columnar.walk(buf, position, stop=stop, rows_max=rows_max, bytes_max=bytes_max)
    with monkeypatch.context() as patch:
        patch.setattr(columnar, "_speedups", None)
        python = columnar.walk(buf, position, stop=stop, rows_max=rows_max, bytes_max=bytes_max)
    assert fast.starts.dtype == python.starts.dtype == np.int64
    return (fast.starts.tolist(), fast.position, fast.end), (python.starts.tolist(), python.position, python.end)


def test_walks_of_the_fixture_log_are_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    chunk = (CLEAN / "commitlog" / "00000000000000000000").read_bytes()
    fast, python = _walks(chunk, 0, len(chunk), 10**6, 10**9, monkeypatch)
    assert fast == python and fast[2] is columnar.WalkEnd.BLANK and len(fast[0]) > 100
    for rows_max, bytes_max, stop in [(7, 10**9, len(chunk)), (10**6, 5000, len(chunk)), (10**6, 10**9, 3000), (0, 10, 10)]:
        assert _walks(chunk, 0, stop, rows_max, bytes_max, monkeypatch)[0] == _walks(chunk, 0, stop, rows_max, bytes_max, monkeypatch)[1]


@settings(max_examples=examples(200), deadline=None)
@given(st.data())
def test_walks_of_mutated_logs_are_the_same(data: st.DataObject) -> None:
    records = [_sample_record(body=bytes(data.draw(st.integers(0, 50)))) for _ in range(data.draw(st.integers(1, 5)))]
    buf = bytearray(b"".join(records) + bytes(data.draw(st.integers(0, 20))))
    for _ in range(data.draw(st.integers(0, 3))):
        buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
    stop = data.draw(st.integers(0, len(buf) + 5))
    rows_max = data.draw(st.integers(0, 6))
    with pytest.MonkeyPatch.context() as monkeypatch:
        fast, python = _walks(bytes(buf), 0, stop, rows_max, data.draw(st.integers(1, 2000)), monkeypatch)
    assert fast == python


# Dispatch plans over bulk-decoded records (the rest: test_batch_paths, both ways)


def test_span_texts_decode_and_share_repeated_texts() -> None:
    data = np.frombuffer(b"TopicA\xff\xfeTopicA\xc3\xa9", np.uint8)
    at = np.array([0, 8, -1, 6, 14, 8], np.int64)
    length = np.array([6, 6, 3, 2, 2, 0], np.int64)
    texts = _speedups.span_texts(data, at, length)
    assert texts == ["TopicA", "TopicA", None, "\ufffd\ufffd", "é", ""]
    assert texts[0] is texts[1]
    with pytest.raises(ValueError, match="a span outside the data"):
        _speedups.span_texts(data, np.array([10], np.int64), np.array([7], np.int64))


def _python_index_hash(text: str) -> int:
    h = javahash.python_java_string_hash(text)
    return 0 if h == -(2**31) else abs(h)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["TopicA", "%RETRY%g", ""]),
            st.one_of(st.none(), st.text(alphabet="AB09", max_size=12)),
            st.one_of(st.none(), st.text(alphabet="k1 ", max_size=12)),
        ),
        min_size=1,
        max_size=25,
    )
)
def test_span_key_hashes_are_the_index_hashes_of_each_key(rows: list[tuple[str, str | None, str | None]]) -> None:
    data = bytearray()
    columns: list[list[int]] = [[], [], [], []]
    for _, uniq, keys in rows:
        for value, (at_column, length_column) in ((uniq, (0, 1)), (keys, (2, 3))):
            columns[at_column].append(len(data) if value is not None else -1)
            columns[length_column].append(len(value or ""))
            data += (value or "").encode()
    prefixes = np.array([javahash.python_java_string_hash(f"{topic}#") & 0xFFFFFFFF for topic, _, _ in rows], np.int64)
    hashes, counts = _speedups.span_key_hashes(
        np.frombuffer(bytes(data) or b"\0", np.uint8), prefixes, *(np.array(c, np.int64) for c in columns)
    )
    expected = [
        [_python_index_hash(f"{topic}#{key}") for key in ([uniq] if uniq is not None else []) + props.split_keys(keys)]
        for topic, uniq, keys in rows
    ]
    assert np.frombuffer(counts, np.int64).tolist() == [len(e) for e in expected]
    assert np.frombuffer(hashes, np.int64).tolist() == [h for e in expected for h in e]


def test_span_key_hashes_hand_back_values_that_are_not_ascii() -> None:
    data = np.frombuffer("UNIQé".encode(), np.uint8)
    one = np.array([0], np.int64)
    assert _speedups.span_key_hashes(data, one * 0, one * 0, np.array([6], np.int64), one - 1, one * 0) is None
    with pytest.raises(ValueError, match="a span outside the data"):
        _speedups.span_key_hashes(data, one * 0, one * 0, np.array([7], np.int64), one - 1, one * 0)


# Dispatch plans of a writer's batch

TEXTS = st.text(max_size=10).filter(lambda t: not any(0xD800 <= ord(c) < 0xE000 for c in t)) | st.sampled_from(
    ["\U0001f600", "é", "", "order-42"]
)


@given(st.lists(st.one_of(st.none(), TEXTS), max_size=20))
def test_tags_codes_are_consume_queue_tags_codes(tags: list[str | None]) -> None:
    expected = [javahash.python_java_string_hash(t) if t else 0 for t in tags]
    assert _speedups.tags_codes(tags) == expected


@given(st.lists(st.tuples(st.sampled_from(["TopicA", "主题", "T%RETRY%"]), TEXTS, st.lists(TEXTS, max_size=3)), max_size=20))
def test_message_key_hashes_are_the_index_hashes_of_each_key(messages: list[tuple[str, str, list[str]]]) -> None:
    prefixes = np.array([javahash.python_java_string_hash(f"{t}#") & 0xFFFFFFFF for t, _, _ in messages], np.int64)
    hashes, counts = _speedups.message_key_hashes(prefixes, [u for _, u, _ in messages], [k for _, _, k in messages])
    expected = [[_python_index_hash(f"{t}#{key}") for key in [u, *k]] for t, u, k in messages]
    assert np.frombuffer(counts, np.int64).tolist() == [len(e) for e in expected]
    assert np.frombuffer(hashes, np.int64).tolist() == [h for e in expected for h in e]


def test_writer_plans_refuse_what_they_cannot_hash() -> None:
    with pytest.raises(TypeError, match="a TAGS value is a str or None"):
        _speedups.tags_codes([b"tag"])
    one = np.zeros(1, np.int64)
    with pytest.raises(TypeError, match="a UNIQ_KEY is a str"):
        _speedups.message_key_hashes(one, [None], [[]])
    with pytest.raises(TypeError, match="a key is a str"):
        _speedups.message_key_hashes(one, ["U"], [[1]])
    with pytest.raises(ValueError, match="columns of different lengths"):
        _speedups.message_key_hashes(one, ["U", "V"], [[], []])


# The properties' pairs in bulk


def _pairs_both_ways(spans: list[bytes]):  # type: ignore[no-untyped-def]
    """columnar._pairs over the spans (each after a byte of padding), compiled and numpy."""
    data = np.zeros(1 + sum(len(s) + 1 for s in spans) + columnar._PAD_BYTES, np.uint8)
    at, length, position = [], [], 1
    for span in spans:
        data[position : position + len(span)] = np.frombuffer(span, np.uint8)
        at.append(position)
        length.append(len(span))
        position += len(span) + 1
    properties = columnar.Spans(np.array(at, np.int64), np.array(length, np.int64))
    results = []
    for compiled in (True, False):
        with pytest.MonkeyPatch.context() as patch:
            if not compiled:
                patch.setattr(columnar, "_speedups", None)
            pair_ends, names, values, named = columnar._pairs(data, properties)
        results.append(
            (
                pair_ends.tolist(),
                [bytes(data[a : a + n]) for a, n in zip(names.at.tolist(), names.length.tolist())],
                [bytes(data[a : a + n]) for a, n in zip(values.at.tolist(), values.length.tolist())],
                {name: column.tolist() for name, column in named.items()},
            )
        )
    return results


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from([b"\x01", b"\x02", b"\xff", b"\xfe", b"A", b"B", b"KEYS", b"TAGS", b"UNIQ_KEY", b"v"]),
                 max_size=24).map(b"".join),  # fmt: skip
        min_size=1,
        max_size=12,
    )
)
@example([b"", b"KEYS\x01k1 k2\x02TAGS\x01t\x02UNIQ_KEY\x01u", b"K\x011\x02T\x012\x02K\x013"])
@example([b"\xff\x01a\x02\xfe\x01b", b"A\x01b\x02", b"\x01v\x02B\x01c", b"KEYS\x01a\x02KEYS\x01b"])
def test_property_pairs_equal_the_numpy_split(spans: list[bytes]) -> None:
    compiled, python = _pairs_both_ways(spans)
    assert compiled == python


def test_property_pairs_of_rows_with_many_pairs_equal_the_numpy_split() -> None:
    """Past 64 pairs the scan leaves the names' comparison to the dictionary's rules."""
    distinct = b"\x02".join(b"name-%d\x01v%d" % (n, n) for n in range(100))
    repeating = b"\x02".join(b"name-%d\x01v%d" % (n % 9, n) for n in range(100)) + b"\x02KEYS\x01last"
    compiled, python = _pairs_both_ways([distinct, repeating, b"TAGS\x01t"])
    assert compiled == python
    pair_ends, names, values, named = compiled
    assert pair_ends == [0, 100, 110, 111]
    assert names[100:110] == [b"name-%d" % n for n in range(9)] + [b"KEYS"]
    assert values[100:110] == [b"v%d" % max(n for n in range(100) if n % 9 == k) for k in range(9)] + [b"last"]
    assert named == {"KEYS": [-1, 109, -1], "TAGS": [-1, -1, 110], "UNIQ_KEY": [-1, -1, -1]}


def test_property_pairs_refuse_a_span_outside_the_data() -> None:
    data = np.zeros(10, np.uint8)
    with pytest.raises(ValueError, match="a span outside the data"):
        _speedups.property_pairs(data, np.array([5], np.int64), np.array([6], np.int64))
    with pytest.raises(ValueError, match="at and length differ in length"):
        _speedups.property_pairs(data, np.array([5], np.int64), np.array([1, 2], np.int64))


# References


def test_no_call_leaks_what_it_builds(tmp_path: Path) -> None:
    """Each fast path, on its success and hand-back and error paths, keeps nothing: a
    leaked reference per call would keep tens of thousands of objects alive here."""
    import tracemalloc

    good = _sample_record()
    bad = good[:8] + b"\x00\x00\x00\x01" + good[12:]
    data = np.frombuffer(good * 10, np.uint8)
    at = np.arange(0, len(good) * 10, len(good), dtype=np.int64)
    length = np.full(10, 50, np.int64)
    host = HOSTS[0]
    logged = _sample_record(commitlog_offset=0)
    (tmp_path / "log").write_bytes(logged * 3)  # one record read, two handed back
    descriptor = os.open(tmp_path / "log", os.O_RDONLY)
    def refused(call, *args):  # type: ignore[no-untyped-def]
        try:
            call(*args)
        except (TypeError, ValueError):
            pass

    calls = [
        lambda: _speedups.decode_record(good, 0, True, len(good)),
        lambda: _speedups.decode_record(bad, 0, True, len(bad)),
        lambda: _speedups.index_key_hash("Topic", "key-é\U0001f600"),
        lambda: _speedups.encode_records(0, [1, 2], [0, 0], [5, 6], [None, 3], [host, V6], [b"ab", b""], ["T", "T"],
                                         [b"p", b""], 9, host, 8),  # fmt: skip
        lambda: _speedups.encode_common_properties(props._COMMON_ORDER, [["a", "b"]], ["t"], ["u"]),
        lambda: _speedups.encode_common_properties((1, 0, 2), [["a", "b"]], ["t"], ["u"], (b"x\x01", b"\x02", b"", b"\x02y")),
        lambda: _speedups.walk_starts(good * 3, 0, 10**6, 10),
        lambda: _speedups.read_records(descriptor, [0, 1, len(logged)], len(logged) * 3, 0, 1024, True, None),
        lambda: _speedups.read_records(descriptor, [0, 1], len(logged) * 3, 0, 1024, True, (b"T", b"k", 0, 9, 0, 10**9)),
        lambda: _speedups.read_records(descriptor, [0], len(logged) * 3, 0, 1024, True, (b"TopicTest", b"cust-9", 0,
                                                                                          2**62, 0, 10**9)),  # fmt: skip
        lambda: refused(_speedups.read_records, descriptor, [0], len(logged), 0, 1024, True, ("T", b"k", 0, 9, 0, 1)),
        lambda: _speedups.body_crcs(data, at, length),
        lambda: _speedups.span_texts(data, at, length),
        lambda: _speedups.span_key_hashes(data, at * 0, at, length, at, length),
        lambda: _speedups.property_pairs(data, at, length),
        lambda: refused(_speedups.property_pairs, data, at + 10**6, length),
        lambda: _speedups.tags_codes(["TagA", None, "TagB"]),  # hashes beyond the cached small ints
        lambda: _speedups.message_key_hashes(at[:2] * 0, ["u", "v"], [["a"], []]),
        lambda: refused(_speedups.encode_records, 0, [1], [0], [5], [None], [host], ["x"], ["T"], [b"p"], 9, host, 8),
        lambda: refused(_speedups.message_key_hashes, at[:1], [None], [[]]),
        lambda: refused(_speedups.span_texts, data, at + 10**6, length),
        lambda: _speedups.queue_unit_blocks(["A", "B", "A"], [0, 1, 0], [4, 0, 5], [1, 2, 3], [1, 2, 3], [1, 2, 3]),
        lambda: _speedups.queue_unit_blocks(["A", "B", "A"], [0, 1, 0], [4, 0, 6], [1, 2, 3], [1, 2, 3], [1, 2, 3]),
        lambda: _speedups.queue_unit_blocks(["A", "B", "A"], [0, 1, 0], [4, 0, 5], [1, 2, 3], [1, 2**40, 3], [1, 2, 3]),
        lambda: refused(_speedups.queue_unit_blocks, ["A"], [0, 1], [0], [1], [1], [1]),
    ]
    for call in calls:
        for _ in range(200):
            call()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(5000):
                call()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert grown < 64 * 1024, (call, grown)
    os.close(descriptor)


_PROPERTY_NAMES = st.sampled_from(["traceparent", "origin", "", "KEYS", "UNIQ_KEY", "a\x01b", "é"])
_PROPERTY_VALUES = st.sampled_from(["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "x", "", "a\x02b", "é" * 3, "v" * 20_000])


@settings(max_examples=examples(300), deadline=None)
@given(
    st.sampled_from(_SCREEN_LIMITS),
    st.lists(st.dictionaries(_PROPERTY_NAMES, _PROPERTY_VALUES, max_size=3), min_size=1, max_size=5),
    st.booleans(),
)
def test_the_batch_screen_passes_properties_only_when_every_message_is_valid(  # type: ignore[no-untyped-def]
    limits: validate.Limits, properties, shared: bool
) -> None:
    """A batch with user properties is screened (no message-by-message check) only when
    each message would pass validate_message; a mapping shared by many messages (as a
    producer's trace context is) is screened once."""
    if shared:
        properties = [properties[0]] * len(properties)
    batch = validate.MessageBatch.of(
        [validate.MessageInput("TopicA", b"x", keys=("k",), tags="t", properties=p) for p in properties]
    )
    valid = True
    for i in range(batch.message_count):
        try:
            validate.validate_message(batch.message(i), limits)
        except InvalidArgument:
            valid = False
    compiled, python = _screens(batch, limits)
    assert compiled == python
    if compiled:
        assert valid
    plain = all(p and "KEYS" not in p and "UNIQ_KEY" not in p and "" not in p for p in properties)
    # (The second limits leave TAGS no room beside any user property: never screened.)
    if limits is _SCREEN_LIMITS[0] and valid and plain and all(v in ("x", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01") for p in properties for v in p.values()):
        assert compiled  # small, plain properties take the screen's path


# A dispatch batch's consume queue units grouped by queue (consumequeue.queue_unit_blocks)

_BLOCK_VALUES = st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, -1, 2**31 - 1, -(2**31), 2**31, 2**63, -(2**63) - 1]))


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["A", "B", "é"]), st.sampled_from([0, 1, -1, 2**31 - 1, 2**31])),
        min_size=0,
        max_size=30,
    ),
    st.integers(0, 2**62 + 1),
    st.lists(st.tuples(_BLOCK_VALUES, _BLOCK_VALUES, _BLOCK_VALUES), min_size=30, max_size=30),
    st.sampled_from(["consecutive", "gap", "repeat"]),
)
@example([("A", 0), ("B", 1), ("A", 0)], 5, [(10, 100, -1)] * 30, "consecutive")
@example([("A", 0), ("A", 0)], 2**62 - 2, [(10, 100, 0)] * 30, "consecutive")  # the last offset allowed
@example([("A", 0), ("A", 0)], 2**62 - 1, [(10, 100, 0)] * 30, "consecutive")  # one past it
def test_queue_unit_blocks_are_the_python_definitions(queues, start: int, values, shape: str) -> None:  # type: ignore[no-untyped-def]
    """Grouped and encoded as the Python definition does, byte for byte, values at and
    past every field's limits and queue ids past int32 included; None from both where a
    queue's offsets skip or repeat within the batch or a value does not fit."""
    from rmqstore.common.codec import consumequeue as cq

    topics = [topic for topic, _ in queues]
    queue_ids = [queue_id for _, queue_id in queues]
    taken: dict[tuple[str, int], int] = {}
    queue_offsets = []
    for key in queues:
        taken[key] = taken.get(key, start - 1) + (2 if shape == "gap" and key in taken else 0 if shape == "repeat" and key in taken else 1)
        queue_offsets.append(taken[key])
    offsets, sizes, tags_codes = (list(column[: len(queues)]) for column in zip(*values))
    args = (topics, queue_ids, queue_offsets, offsets, sizes, tags_codes)
    compiled = _speedups.queue_unit_blocks(*args)
    assert compiled == cq.python_queue_unit_blocks(*args)
    if compiled is not None:
        for topic, queue_id, first, last, units in compiled:
            positions = [p for p, key in enumerate(queues) if key == (topic, queue_id)]
            assert (first, last) == (queue_offsets[positions[0]], positions[-1])
            assert units == b"".join(cq.encode_unit(offsets[p], sizes[p], tags_codes[p]) for p in positions)


def test_queue_unit_blocks_hand_values_of_other_types_back() -> None:
    from rmqstore.common.codec import consumequeue as cq

    good = (["A", "A"], [0, 0], [0, 1], [10, 20], [5, 6], [7, 8])
    assert _speedups.queue_unit_blocks(*good) == cq.python_queue_unit_blocks(*good) == [
        ("A", 0, 0, 1, cq.encode_unit(10, 5, 7) + cq.encode_unit(20, 6, 8))
    ]
    class Text(str):
        pass

    for column, odd in ((0, b"A"), (0, Text("A")), (1, 0.0), (2, 1.0), (3, np.int64(20)), (4, "6"), (5, None)):
        args = [list(values) for values in good]
        args[column][1] = odd
        assert _speedups.queue_unit_blocks(*args) is None, (column, odd)
        assert cq.python_queue_unit_blocks(*args) is None, (column, odd)
    for call in (_speedups.queue_unit_blocks, cq.python_queue_unit_blocks):
        with pytest.raises(ValueError, match="the columns differ in length"):
            call(["A"], [0, 1], [0], [1], [1], [1])
    with pytest.raises(TypeError, match="queue_unit_blocks takes"):
        _speedups.queue_unit_blocks(["A"])
    assert _speedups.queue_unit_blocks([], [], [], [], [], []) == cq.python_queue_unit_blocks([], [], [], [], [], []) == []
