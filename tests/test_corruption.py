"""Bad bytes on disk, one clause of the recovery contract per test (commitlog.py docstring).

* zeros where a record should start, with nothing after: the end of the log;
* an invalid record that looks interrupted (its size fits the file and its last byte is
  still zero) followed only by zeros: a torn tail, the clean end of the log, cut by
  recovery;
* an invalid record that is complete (its last byte was written), or whose size cannot be
  trusted, is corruption even at the end of the log;
* an invalid record (bad CRC, magic, size, or zeros) with data after it: corruption,
  reported with its offset and never dropped silently;
* files of the wrong size, with foreign names or with gaps: Corruption naming the path.

Small logs are written here with :class:`CommitLog` (4096-byte files); the CLI tests use a
copy of the Apache-written fixture.
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from pathlib import Path

import pytest
from conftest import CLEAN, FIXTURE_SIZE_ARGS, FIXTURE_SIZES

from rmqstore.cli.main import main
from rmqstore.common.codec.hosts import SocketAddress
from rmqstore.common.codec.record import Record, decode_record, encode_record
from rmqstore.common.errors import Corruption, CrcMismatch, NotFound
from rmqstore.common.files.commitlog import CommitLog, ScanStop, StopReason
from rmqstore.common.files.index import IndexFileList

FILE_SIZE = 4096
BODY_START = 88  # 72 + 8 + 8: BODY of an all-IPv4 v1 record
SMALL_RECORD_SIZE = 169  # 91 + body 50 + topic 9 + properties 19
SCAN_TIMEOUT_S = 10.0


def make_record(n: int, body_len: int = 50) -> Record:
    return Record(
        topic="TopicTest",
        body=bytes([n % 250 + 1]) * body_len,  # never zero, so zeroed bytes always show
        properties={"KEYS": f"key{n}", "TAGS": "TagA"},
        queue_id=0,
        born_timestamp_ms=1_700_000_000_000 + n,
        born_host=SocketAddress(b"\x0a\x00\x00\x02", 50000),
        store_timestamp_ms=1_700_000_000_100 + n,
        store_host=SocketAddress(b"\x0a\x00\x00\x01", 10911),
    )


def build_log(directory: Path, count: int, body_len: int = 50) -> tuple[list[int], int]:
    """Append ``count`` records one by one; returns their offsets and the log's end."""
    log = CommitLog(str(directory), FILE_SIZE, writable=True)
    log.set_write_position(0)
    offsets = []
    for n in range(count):
        offsets += log.append([bytearray(encode_record(make_record(n, body_len)))], [n])
    log.flush()
    end = log.write_offset
    log.close()
    assert end is not None
    return offsets, end


def file_of(directory: Path, offset: int) -> tuple[Path, int]:
    """The file holding a commit log offset and the position in it."""
    start = offset - offset % FILE_SIZE
    return directory / f"{start:020d}", offset - start


def overwrite(directory: Path, offset: int, data: bytes) -> None:
    path, position = file_of(directory, offset)
    with open(path, "r+b") as handle:
        handle.seek(position)
        handle.write(data)


def read_at(directory: Path, offset: int, length: int) -> bytes:
    path, position = file_of(directory, offset)
    with open(path, "rb") as handle:
        handle.seek(position)
        return handle.read(length)


def snapshot(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def scan_bounded(log: CommitLog) -> ScanStop:
    """log.scan(), failing the test instead of hanging if it does not return."""
    outcome: list[ScanStop | BaseException] = []

    def run() -> None:
        try:
            outcome.append(log.scan())
        except BaseException as error:  # handed to the test thread below
            outcome.append(error)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(SCAN_TIMEOUT_S)
    assert not worker.is_alive(), f"scan did not return within {SCAN_TIMEOUT_S} s"
    [result] = outcome
    if isinstance(result, BaseException):
        raise result
    return result


def offsets_of(log: CommitLog) -> list[int]:
    return [record.commitlog_offset for record in log.records()]


# The small log used below: four 169-byte records in one file.


def test_small_log_layout(tmp_path: Path) -> None:
    assert build_log(tmp_path, 4) == ([0, 169, 338, 507], 676)
    assert len(encode_record(make_record(0))) == SMALL_RECORD_SIZE


# Torn tail


@pytest.mark.parametrize(
    ("count", "body_len", "torn_offset", "clean_offsets"),
    [
        (4, 50, 507, [0, 169, 338]),  # the last record of the only file
        (4, 1000, 4096, [0, 1119, 2238]),  # the first record of a new file, after a BLANK
    ],
    ids=["same-file", "first-of-next-file"],
)
def test_torn_tail_ends_the_log(
    tmp_path: Path, count: int, body_len: int, torn_offset: int, clean_offsets: list[int]
) -> None:
    offsets, end = build_log(tmp_path, count, body_len)
    assert offsets[-1] == torn_offset and offsets[:-1] == clean_offsets
    cut = torn_offset + BODY_START + 20  # header and 20 body bytes reached the disk
    overwrite(tmp_path, cut, bytes(end - cut))
    expected_size = 91 + body_len  # the zeroed topic and properties lengths read as 0
    log = CommitLog(str(tmp_path), FILE_SIZE)
    try:
        stop = scan_bounded(log)
        assert (stop.reason, stop.end_offset, stop.dropped_bytes) == (StopReason.TORN, torn_offset, cut - torn_offset)
        assert type(stop.error) is Corruption
        assert stop.error.offset == torn_offset
        assert str(stop.error) == (
            f"record size {end - torn_offset} at commit log offset {torn_offset} disagrees with its fields ({expected_size})"
        )
        assert stop.is_clean
        scan = log.records()
        assert [r.commitlog_offset for r in scan] == clean_offsets
        assert scan.stop is not None
        assert (scan.stop.reason, scan.stop.end_offset, scan.stop.dropped_bytes) == (StopReason.TORN, torn_offset, cut - torn_offset)
        assert str(scan.stop.error) == str(stop.error)
    finally:
        log.close()


def test_record_cut_short_is_a_torn_tail(tmp_path: Path) -> None:
    """An interrupted append: only the first bytes of a fifth record reached the file."""
    _, end = build_log(tmp_path, 4)
    partial = encode_record(make_record(4))[: BODY_START + 5]
    overwrite(tmp_path, end, partial)
    log = CommitLog(str(tmp_path), FILE_SIZE)
    try:
        stop = scan_bounded(log)
        assert (stop.reason, stop.end_offset, stop.dropped_bytes) == (StopReason.TORN, 676, BODY_START + 5)
        assert type(stop.error) is Corruption and stop.error.offset == 676
        assert offsets_of(log) == [0, 169, 338, 507]
        with pytest.raises(Corruption, match="at commit log offset 676"):
            log.read(676)
    finally:
        log.close()


def test_recovery_cuts_a_torn_tail_and_appends_there(tmp_path: Path) -> None:
    offsets, end = build_log(tmp_path, 4)
    cut = offsets[3] + BODY_START + 20
    overwrite(tmp_path, cut, bytes(end - cut))
    assert any(read_at(tmp_path, offsets[3], end - offsets[3]))
    log = CommitLog(str(tmp_path), FILE_SIZE, writable=True)
    try:
        stop = log.recover_write_position()
        assert (stop.reason, stop.end_offset) == (StopReason.TORN, 507)
        assert log.write_offset == 507
        assert read_at(tmp_path, 507, FILE_SIZE - 507) == bytes(FILE_SIZE - 507)  # the torn bytes are gone
        assert log.append([bytearray(encode_record(make_record(9)))], [3]) == [507]
        log.flush()
    finally:
        log.close()
    reader = CommitLog(str(tmp_path), FILE_SIZE)
    try:
        records = list(reader.records())
        assert [r.commitlog_offset for r in records] == offsets
        assert records[3].properties["KEYS"] == "key9"
        assert scan_bounded(reader) == ScanStop(676, StopReason.END)
    finally:
        reader.close()


def test_recovery_of_a_torn_first_record_keeps_its_file(tmp_path: Path) -> None:
    """The torn record was the first of the second file: that file stays, zeroed."""
    offsets, end = build_log(tmp_path, 4, body_len=1000)
    assert (offsets[3], end) == (4096, 4096 + 1119)
    overwrite(tmp_path, 4096 + BODY_START, bytes(end - 4096 - BODY_START))
    log = CommitLog(str(tmp_path), FILE_SIZE, writable=True)
    try:
        stop = log.recover_write_position()
        assert (stop.reason, stop.end_offset, stop.dropped_bytes) == (StopReason.TORN, 4096, BODY_START)
        assert sorted(os.listdir(tmp_path)) == ["00000000000000000000", "00000000000000004096"]
        assert (tmp_path / "00000000000000004096").read_bytes() == bytes(FILE_SIZE)
        assert log.append([bytearray(encode_record(make_record(7, 1000)))], [3]) == [4096]
    finally:
        log.close()


# A flipped body byte


def test_flipped_body_byte_in_a_middle_record(tmp_path: Path) -> None:
    _, end = build_log(tmp_path, 4)
    body = make_record(1).body
    flipped = bytearray(body)
    flipped[10] ^= 0xFF
    overwrite(tmp_path, 169 + BODY_START + 10, bytes([flipped[10]]))
    stored = zlib.crc32(body) & 0x7FFFFFFF
    computed = zlib.crc32(bytes(flipped)) & 0x7FFFFFFF
    assert stored != computed
    before = snapshot(tmp_path)

    log = CommitLog(str(tmp_path), FILE_SIZE)
    try:
        with pytest.raises(CrcMismatch) as caught:
            log.read(169)
        error = caught.value
        assert (error.offset, error.stored, error.computed) == (169, stored, computed)
        assert str(error) == f"body CRC mismatch at commit log offset 169: stored {stored:08X}, computed {computed:08X}"
        assert log.read(169, check_crc=False).body == bytes(flipped)
        assert log.read(338).body == make_record(2).body  # the records around it still read
        stop = scan_bounded(log)
        assert (stop.reason, stop.end_offset, stop.dropped_bytes) == (StopReason.CORRUPT, 169, end - 169)
        assert isinstance(stop.error, CrcMismatch) and stop.error.offset == 169
        assert not stop.is_clean
        assert offsets_of(log) == [0]
        assert [r.commitlog_offset for r in log.records(check_crc=False)] == [0, 169, 338, 507]
    finally:
        log.close()

    writer = CommitLog(str(tmp_path), FILE_SIZE, writable=True)
    try:
        with pytest.raises(CrcMismatch) as caught:
            writer.recover_write_position()
        assert caught.value.offset == 169
        assert writer.write_offset is None  # not made writable past the damage
    finally:
        writer.close()
    assert snapshot(tmp_path) == before


def test_flipped_body_byte_in_the_last_record_is_corruption(tmp_path: Path) -> None:
    """The record's last byte was written, so it is complete: a bad CRC there is damage,
    not an interrupted write, and recovery refuses to cut it."""
    build_log(tmp_path, 4)
    original = read_at(tmp_path, 507 + BODY_START, 1)
    overwrite(tmp_path, 507 + BODY_START, bytes([original[0] ^ 0x01]))
    before = snapshot(tmp_path)
    log = CommitLog(str(tmp_path), FILE_SIZE, writable=True)
    try:
        stop = scan_bounded(log)
        assert (stop.reason, stop.end_offset, stop.dropped_bytes) == (StopReason.CORRUPT, 507, 169)
        assert isinstance(stop.error, CrcMismatch) and stop.error.offset == 507
        with pytest.raises(CrcMismatch, match="at commit log offset 507"):
            log.recover_write_position()
    finally:
        log.close()
    assert snapshot(tmp_path) == before


def test_flipped_body_byte_in_an_earlier_file(tmp_path: Path) -> None:
    offsets, end = build_log(tmp_path, 5, body_len=1000)
    assert offsets == [0, 1119, 2238, 4096, 5215] and end == 6334
    overwrite(tmp_path, 1119 + BODY_START, b"\x00")
    before = snapshot(tmp_path)
    log = CommitLog(str(tmp_path), FILE_SIZE, writable=True)
    try:
        stop = scan_bounded(log)
        assert (stop.reason, stop.end_offset, stop.dropped_bytes) == (StopReason.CORRUPT, 1119, end - 1119)
        with pytest.raises(CrcMismatch, match="at commit log offset 1119"):
            log.recover_write_position()
    finally:
        log.close()
    assert snapshot(tmp_path) == before


# Garbage TOTALSIZE

GARBAGE_SIZES = {
    "huge": 0x7FFFFFFF,
    "int32-min": -(2**31),
    "negative": -1,
    "zero": 0,
    "below-minimum": 90,
}


@pytest.mark.parametrize("name", [*GARBAGE_SIZES, "one-past-file-end", "one-too-long"])
def test_decode_of_a_garbage_size_raises_corruption(tmp_path: Path, name: str) -> None:
    build_log(tmp_path, 4)
    data = bytearray((tmp_path / f"{0:020d}").read_bytes())
    size = {"one-past-file-end": FILE_SIZE - 169 + 1, "one-too-long": 170}.get(name, GARBAGE_SIZES.get(name))
    assert size is not None
    struct.pack_into(">i", data, 169, size)
    with pytest.raises(Corruption) as caught:
        decode_record(data, 169, commitlog_offset=8192 + 169)
    assert type(caught.value) is Corruption
    assert caught.value.offset == 8192 + 169
    if name == "one-too-long":
        assert str(caught.value) == "record size 170 at commit log offset 8361 disagrees with its fields (169)"
    else:
        assert str(caught.value) == (
            f"bad record size {size} at commit log offset 8361 (3927 bytes left in the file, a record is at least 91)"
        )


def test_decode_never_reads_past_its_buffer(tmp_path: Path) -> None:
    """A valid size that runs past the buffer or the limit is reported, not followed."""
    build_log(tmp_path, 4)
    data = (tmp_path / f"{0:020d}").read_bytes()
    for view, limit in ((data[: 169 + 100], None), (data, 169 + 100), (memoryview(data)[: 169 + 100], None)):
        with pytest.raises(Corruption) as caught:
            decode_record(view, 169, limit=limit)
        assert str(caught.value) == "bad record size 169 at commit log offset 169 (100 bytes left in the file, a record is at least 91)"
    with pytest.raises(Corruption) as caught:
        decode_record(data[: 169 + 5], 169)
    assert str(caught.value) == "truncated record header at commit log offset 169"
    assert decode_record(data[:169] + bytes(5), 169) is None  # zeros: the end, not corruption


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        # A size that does not fit the file is not trusted: the record's own later bytes
        # count as data after the bad record.
        ("huge", StopReason.CORRUPT),
        ("one-past-file-end", StopReason.CORRUPT),
        ("negative", StopReason.CORRUPT),
        ("int32-min", StopReason.CORRUPT),
        ("zero", StopReason.CORRUPT),
        # It fits, but ends inside the record: the record's later bytes are data after it.
        ("below-minimum", StopReason.CORRUPT),
        # It fits and ends in zeros: indistinguishable from an interrupted write.
        ("into-the-zeros", StopReason.TORN),
    ],
)
def test_garbage_size_in_the_last_record(tmp_path: Path, name: str, reason: StopReason) -> None:
    build_log(tmp_path, 4)
    size = {"one-past-file-end": FILE_SIZE - 507 + 1, "into-the-zeros": 200}.get(name) or GARBAGE_SIZES[name]
    overwrite(tmp_path, 507, struct.pack(">i", size))
    log = CommitLog(str(tmp_path), FILE_SIZE)
    try:
        stop = scan_bounded(log)
        assert (stop.reason, stop.end_offset, stop.dropped_bytes) == (reason, 507, 169)
        assert type(stop.error) is Corruption and stop.error.offset == 507
        assert str(stop.error).startswith(
            f"record size {size} at commit log offset 507 disagrees"
            if name == "into-the-zeros"
            else f"bad record size {size} at commit log offset 507 ("
        )
        assert offsets_of(log) == [0, 169, 338]
    finally:
        log.close()


@pytest.mark.parametrize("name", ["negative", "int32-min", "zero", "below-minimum"])
def test_short_garbage_size_in_a_middle_record_is_corruption(tmp_path: Path, name: str) -> None:
    build_log(tmp_path, 4)
    overwrite(tmp_path, 169, struct.pack(">i", GARBAGE_SIZES[name]))
    before = snapshot(tmp_path)
    log = CommitLog(str(tmp_path), FILE_SIZE, writable=True)
    try:
        stop = scan_bounded(log)
        assert (stop.reason, stop.end_offset, stop.dropped_bytes) == (StopReason.CORRUPT, 169, 676 - 169)
        assert type(stop.error) is Corruption and stop.error.offset == 169
        with pytest.raises(Corruption, match=r"bad record size .* at commit log offset 169"):
            log.recover_write_position()
    finally:
        log.close()
    assert snapshot(tmp_path) == before


def test_huge_size_in_a_middle_record_before_later_files_is_corruption(tmp_path: Path) -> None:
    """The later file holds data, so the claimed size cannot hide it."""
    offsets, end = build_log(tmp_path, 5, body_len=1000)
    overwrite(tmp_path, offsets[1], struct.pack(">i", 0x7FFFFFFF))
    log = CommitLog(str(tmp_path), FILE_SIZE)
    try:
        stop = scan_bounded(log)
        assert (stop.reason, stop.end_offset, stop.dropped_bytes) == (StopReason.CORRUPT, 1119, end - 1119)
    finally:
        log.close()


@pytest.mark.parametrize("name", ["huge", "one-past-file-end"])
def test_oversized_garbage_size_in_a_middle_record_is_corruption(tmp_path: Path, name: str) -> None:
    build_log(tmp_path, 4)
    size = FILE_SIZE - 169 + 1 if name == "one-past-file-end" else GARBAGE_SIZES[name]
    overwrite(tmp_path, 169, struct.pack(">i", size))
    log = CommitLog(str(tmp_path), FILE_SIZE)
    try:
        stop = scan_bounded(log)
        # Records 338 and 507 are intact after the bad size: that is not a torn tail.
        assert (stop.reason, stop.end_offset, stop.dropped_bytes) == (StopReason.CORRUPT, 169, 676 - 169)
    finally:
        log.close()


def test_recovery_never_drops_records_after_a_huge_size(tmp_path: Path) -> None:
    build_log(tmp_path, 4)
    overwrite(tmp_path, 169, struct.pack(">i", 0x7FFFFFFF))
    before = snapshot(tmp_path)
    log = CommitLog(str(tmp_path), FILE_SIZE, writable=True)
    try:
        with pytest.raises(Corruption):
            log.recover_write_position()
    finally:
        log.close()
    assert snapshot(tmp_path) == before


# Bad magic and zeros


def test_bad_magic_with_data_after_is_corruption(tmp_path: Path) -> None:
    build_log(tmp_path, 4)
    overwrite(tmp_path, 169 + 4, bytes.fromhex("12345678"))
    log = CommitLog(str(tmp_path), FILE_SIZE)
    try:
        with pytest.raises(Corruption) as caught:
            log.read(169)
        assert type(caught.value) is Corruption and caught.value.offset == 169
        assert str(caught.value) == "bad magic code 12345678 at commit log offset 169"
        stop = scan_bounded(log)
        assert (stop.reason, stop.end_offset, stop.dropped_bytes) == (StopReason.CORRUPT, 169, 507)
        assert str(stop.error) == "bad magic code 12345678 at commit log offset 169"
        assert offsets_of(log) == [0]
    finally:
        log.close()


@pytest.mark.parametrize(
    ("tail_zeroed", "reason", "dropped"),
    [(False, StopReason.CORRUPT, 169), (True, StopReason.TORN, 160)],
    ids=["complete", "interrupted"],
)
def test_bad_magic_on_the_last_record(tmp_path: Path, tail_zeroed: bool, reason: StopReason, dropped: int) -> None:
    """Complete (last byte written), a bad last record is corruption; with its last
    bytes still zero it is a torn tail."""
    build_log(tmp_path, 4)
    overwrite(tmp_path, 507 + 4, bytes(4))
    if tail_zeroed:
        overwrite(tmp_path, 507 + 160, bytes(9))
    log = CommitLog(str(tmp_path), FILE_SIZE)
    try:
        stop = scan_bounded(log)
        assert (stop.reason, stop.end_offset, stop.dropped_bytes) == (reason, 507, dropped)
        assert str(stop.error) == "bad magic code 00000000 at commit log offset 507"
        assert offsets_of(log) == [0, 169, 338]
    finally:
        log.close()


def test_zeros_in_the_middle_with_data_after_are_corruption(tmp_path: Path) -> None:
    build_log(tmp_path, 4)
    overwrite(tmp_path, 169, bytes(169))  # the whole second record
    before = snapshot(tmp_path)
    log = CommitLog(str(tmp_path), FILE_SIZE, writable=True)
    try:
        with pytest.raises(NotFound, match="no record at commit log offset 169"):
            log.read(169)
        stop = scan_bounded(log)
        assert (stop.reason, stop.end_offset, stop.dropped_bytes) == (StopReason.CORRUPT, 169, 676 - 169)
        assert type(stop.error) is Corruption and stop.error.offset == 169
        assert str(stop.error) == (
            "zeros at commit log offset 169 where a record should start, with data after them up to offset 676"
        )
        assert offsets_of(log) == [0]
        with pytest.raises(Corruption, match="zeros at commit log offset 169"):
            log.recover_write_position()
    finally:
        log.close()
    assert snapshot(tmp_path) == before


def test_zeroed_blank_before_a_file_with_data_is_corruption(tmp_path: Path) -> None:
    offsets, end = build_log(tmp_path, 5, body_len=1000)
    assert read_at(tmp_path, 3357, 8) == struct.pack(">i", FILE_SIZE - 3357) + bytes.fromhex("CBD43194")
    overwrite(tmp_path, 3357, bytes(8))
    log = CommitLog(str(tmp_path), FILE_SIZE)
    try:
        stop = scan_bounded(log)
        assert (stop.reason, stop.end_offset, stop.dropped_bytes) == (StopReason.CORRUPT, 3357, end - 3357)
        assert str(stop.error) == (
            f"zeros at commit log offset 3357 where a record should start, with data after them up to offset {end}"
        )
        assert offsets_of(log) == offsets[:3]
    finally:
        log.close()


def test_zeros_at_the_end_are_the_end(tmp_path: Path) -> None:
    _, end = build_log(tmp_path, 4)
    log = CommitLog(str(tmp_path), FILE_SIZE)
    try:
        assert scan_bounded(log) == ScanStop(end, StopReason.END)
    finally:
        log.close()


# Files that cannot belong to the log


@pytest.mark.parametrize("size", [0, 4000, 4097])
def test_commitlog_file_of_the_wrong_size(tmp_path: Path, size: int) -> None:
    build_log(tmp_path, 4, body_len=1000)
    path = tmp_path / "00000000000000004096"
    os.truncate(path, size)
    if size == 0:
        # An empty newest file is one a writer is still creating: a reader skips it ...
        log = CommitLog(str(tmp_path), FILE_SIZE)
        try:
            assert [f.name for f in log.files] == ["00000000000000000000"]
        finally:
            log.close()
    else:
        with pytest.raises(Corruption) as caught:
            CommitLog(str(tmp_path), FILE_SIZE)
        assert caught.value.path == str(path)
        assert str(caught.value) == f"{path} is {size} bytes; files here must be exactly 4096"
    if size == 0:
        # ... and the writer removes it: it holds nothing (a kill while creating it).
        log = CommitLog(str(tmp_path), FILE_SIZE, writable=True)
        log.close()
        assert not path.exists()
    else:
        with pytest.raises(Corruption) as caught:
            CommitLog(str(tmp_path), FILE_SIZE, writable=True)
        assert caught.value.path == str(path)
        assert str(caught.value) == f"{path} is {size} bytes; files here must be exactly 4096"


def test_an_empty_file_before_the_newest_is_corruption(tmp_path: Path) -> None:
    build_log(tmp_path, 4, body_len=1000)
    (tmp_path / "00000000000000008192").write_bytes(bytes(FILE_SIZE))
    os.truncate(tmp_path / "00000000000000004096", 0)
    with pytest.raises(Corruption, match="00000000000000004096 is 0 bytes"):
        CommitLog(str(tmp_path), FILE_SIZE)


@pytest.mark.parametrize("name", ["4096", "notes.txt", "0000000000000000409x", "000000000000000004096", "00000000000000004096.bak"])
def test_file_with_a_foreign_name(tmp_path: Path, name: str) -> None:
    build_log(tmp_path, 4)
    (tmp_path / name).write_bytes(bytes(FILE_SIZE))
    with pytest.raises(Corruption) as caught:
        CommitLog(str(tmp_path), FILE_SIZE)
    assert caught.value.path == str(tmp_path / name)
    assert str(caught.value) == f"unexpected file {name!r} in {tmp_path}: names must be 20-digit offsets"


def test_gap_between_files(tmp_path: Path) -> None:
    build_log(tmp_path, 4)
    (tmp_path / "00000000000000008192").write_bytes(bytes(FILE_SIZE))
    with pytest.raises(Corruption) as caught:
        CommitLog(str(tmp_path), FILE_SIZE)
    assert caught.value.path == str(tmp_path / "00000000000000008192")
    assert str(caught.value) == f"gap in {tmp_path}: 00000000000000000000 is followed by 00000000000000008192"


def test_file_name_not_on_a_file_boundary(tmp_path: Path) -> None:
    build_log(tmp_path, 4)
    (tmp_path / "00000000000000004000").write_bytes(bytes(FILE_SIZE))
    with pytest.raises(Corruption) as caught:
        CommitLog(str(tmp_path), FILE_SIZE)
    assert caught.value.path == str(tmp_path / "00000000000000004000")
    assert str(caught.value) == f"00000000000000004000 in {tmp_path} is not a multiple of the file size 4096"


def test_index_file_of_another_geometry(clean_copy: Path) -> None:
    first = clean_copy / "index" / "20261122030251622"
    with pytest.raises(Corruption) as caught:
        IndexFileList(str(clean_copy / "index"))
    assert caught.value.path == str(first)
    assert str(caught.value) == (
        f"index file {first} is 32040 bytes, but 5000000 slots and 20000000 entries make 420000040; "
        "pass the store's --index-slots and --index-entries"
    )
    with pytest.raises(Corruption, match="is 32040 bytes, but 500 slots and 1499 entries make 32020"):
        IndexFileList(str(clean_copy / "index"), 500, 1499)
    last = clean_copy / "index" / "20261122030256450"
    os.truncate(last, 32000)
    with pytest.raises(Corruption) as caught:
        IndexFileList(str(clean_copy / "index"), FIXTURE_SIZES.index_slots, FIXTURE_SIZES.index_entries)
    assert caught.value.path == str(last)


# The CLI on a damaged copy of Apache's store

MIDDLE_OFFSET = 1_044_883  # record 1000 of 2007: OrderTopic, IPv4 hosts, 170-byte body
LAST_OFFSET = 2_088_155  # record 2006: 1319 bytes, 1053-byte body, IPv4 hosts
LOG_END = 2_089_474


def fixture_bytes(store: Path, offset: int, length: int) -> bytes:
    size = FIXTURE_SIZES.commitlog_file_size_bytes
    path = store / "commitlog" / f"{offset - offset % size:020d}"
    with open(path, "rb") as handle:
        handle.seek(offset % size)
        return handle.read(length)


def fixture_overwrite(store: Path, offset: int, data: bytes) -> None:
    size = FIXTURE_SIZES.commitlog_file_size_bytes
    path = store / "commitlog" / f"{offset - offset % size:020d}"
    with open(path, "r+b") as handle:
        handle.seek(offset % size)
        handle.write(data)


def test_fixture_records_used_below() -> None:
    log = CommitLog(str(CLEAN / "commitlog"), FIXTURE_SIZES.commitlog_file_size_bytes)
    try:
        middle = log.read(MIDDLE_OFFSET)
        last = log.read(LAST_OFFSET)
    finally:
        log.close()
    assert (middle.size, len(middle.body), middle.born_host.is_v6, middle.store_host.is_v6) == (377, 170, False, False)
    assert (last.size, len(last.body), last.next_offset) == (1319, 1053, LOG_END)
    assert not last.born_host.is_v6 and not last.store_host.is_v6


def test_cli_dump_reports_a_flipped_byte(clean_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    position = MIDDLE_OFFSET + BODY_START + 7
    fixture_overwrite(clean_copy, position, bytes([fixture_bytes(clean_copy, position, 1)[0] ^ 0x20]))
    assert main(["dump", "commitlog", str(clean_copy)]) == 1
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 1000  # the records before it
    [line] = captured.err.splitlines()
    assert line.startswith(
        f"rmqstore: corruption at commit log offset {MIDDLE_OFFSET}: body CRC mismatch at commit log offset {MIDDLE_OFFSET}: stored "
    )
    assert line.endswith(f"({LOG_END - MIDDLE_OFFSET} bytes after it)")
    assert main(["dump", "commitlog", str(clean_copy), "--no-crc"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 2007 and captured.err == ""


def test_cli_dump_accepts_a_torn_tail(clean_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cut = LAST_OFFSET + BODY_START + 500
    fixture_overwrite(clean_copy, cut, bytes(LOG_END - cut))
    assert main(["dump", "commitlog", str(clean_copy)]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 2006
    [line] = captured.err.splitlines()
    assert line.startswith(f"rmqstore: torn tail at commit log offset {LAST_OFFSET}: ")
    assert line.endswith(f"({BODY_START + 500} bytes after it)")


def test_cli_dump_of_a_log_with_a_gap(clean_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gone = clean_copy / "commitlog" / "00000000000000524288"
    gone.unlink()
    # A gap is the data disagreeing with itself: exit 1, like check.
    assert main(["dump", "commitlog", str(clean_copy)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"rmqstore: error: gap in {clean_copy / 'commitlog'}: 00000000000000000000 is followed by 00000000000001048576\n"
    )


def test_cli_check_names_an_altered_consume_queue_unit(clean_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(clean_copy), *FIXTURE_SIZE_ARGS]) == 0
    assert capsys.readouterr().out == "ok: 2007 records, 1995 consume queue units and 5846 index keys agree\n"
    # TopicTest/0 unit 1 is (17281, 578, 0); make its size 579.
    unit_file = clean_copy / "consumequeue" / "TopicTest" / "0" / "00000000000000000000"
    with open(unit_file, "r+b") as handle:
        handle.seek(20)
        assert handle.read(20) == struct.pack(">qiq", 17281, 578, 0)
        handle.seek(20 + 8)
        handle.write(struct.pack(">i", 579))
    assert main(["check", str(clean_copy), *FIXTURE_SIZE_ARGS]) == 1
    assert capsys.readouterr().out == (
        "FAIL: record at commit log offset 17281 (TopicTest/0 offset 1): consume queue holds offset 17281 "
        "size 579 tagsCode 0, expected 17281/578/0\n"
    )


def test_cli_check_names_commitlog_corruption(clean_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fixture_overwrite(clean_copy, MIDDLE_OFFSET + 4, bytes.fromhex("0BADBEEF"))
    assert main(["check", str(clean_copy), *FIXTURE_SIZE_ARGS]) == 1
    lines = capsys.readouterr().out.splitlines()
    fail_at = next(n for n, line in enumerate(lines) if line.startswith("FAIL:"))
    assert all(line.startswith("note: ") for line in lines[:fail_at])
    assert (
        "  also: consume queue TopicTest/0 has 70 unit(s) past offset 75, the last record of that queue in the commit log"
        in lines
    )
    assert lines[fail_at] == (
        f"FAIL: commit log: corruption at commit log offset {MIDDLE_OFFSET}: bad magic code 0BADBEEF at commit log "
        f"offset {MIDDLE_OFFSET} ({LOG_END - MIDDLE_OFFSET} bytes after it)"
    )


def test_cli_check_without_the_index_geometry(clean_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(clean_copy)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("rmqstore: error: index file ")
    assert captured.err.endswith("pass the store's --index-slots and --index-entries\n")
