"""The columnar decoder (codec/columnar.py) against the per-record one (record.decode_record,
CommitLog.records): every field of every record, on Apache's stores and on generated
records (IPv6 hosts, v2 magic, odd properties), and the same end of the scan (end of log,
torn tail, corruption) on damaged logs."""

from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import CLEAN, CRASHED, FIXTURE_SIZES
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rmqstore.common.codec import columnar
from rmqstore.common.codec.columnar import RecordColumns, WalkEnd
from rmqstore.common.codec.hosts import SocketAddress
from rmqstore.common.codec.msgid import offset_msg_id
from rmqstore.common.codec.record import (
    MAGIC_V2,
    Record,
    body_crc,
    decode_record,
    encode_blank,
    encode_record,
    head_struct,
    record_size,
)
from rmqstore.common.files.commitlog import CommitLog, ScanStop, StopReason
from rmqstore.common.files.scan import ColumnScan

FILE_SIZE = 64 * 1024


def span(decoded: RecordColumns, spans: columnar.Spans, index: int) -> bytes:
    at, length = int(spans.at[index]), int(spans.length[index])
    return decoded.data[at : at + length].tobytes()


def text(data: bytes) -> str:
    """A text as the per-record decoder reads it (UTF-8, bad bytes replaced)."""
    return data.decode("utf-8", "replace")


def rows_of(decoded: RecordColumns) -> list[dict[str, Any]]:
    """Each decoded row with the per-record decoder's names and value types."""
    rows = []
    for i in range(decoded.rows):
        pairs = range(int(decoded.pair_ends[i]), int(decoded.pair_ends[i + 1]))
        properties = {text(span(decoded, decoded.names, j)): text(span(decoded, decoded.values, j)) for j in pairs}
        assert len(properties) == len(pairs), "no name twice in a row"

        def named(column: np.ndarray, i: int = i) -> str | None:
            return None if column[i] < 0 else text(span(decoded, decoded.values, int(column[i])))

        rows.append(
            {
                "commitlog_offset": int(decoded.commitlog_offset[i]),
                "size": int(decoded.size[i]),
                "queue_id": int(decoded.queue_id[i]),
                "flag": int(decoded.flag[i]),
                "queue_offset": int(decoded.queue_offset[i]),
                "sys_flag": int(decoded.sys_flag[i]),
                "born_timestamp_ms": int(decoded.born_timestamp_ms[i]),
                "store_timestamp_ms": int(decoded.store_timestamp_ms[i]),
                "reconsume_times": int(decoded.reconsume_times[i]),
                "prepared_transaction_offset": int(decoded.prepared_transaction_offset[i]),
                "body_crc": int(decoded.body_crc[i]),
                "version": int(decoded.version[i]),
                "born_host": decoded.born_host.texts[decoded.born_host.index[i]],
                "store_host": decoded.store_host.texts[decoded.store_host.index[i]],
                "msg_id": decoded.msg_id_chars[decoded.msg_id_ends[i] : decoded.msg_id_ends[i + 1]].tobytes().decode(),
                "body": span(decoded, decoded.body, i),
                "topic": columnar.decode_text(decoded.data, int(decoded.topic.at[i]), int(decoded.topic.length[i])),
                "properties": list(properties.items()),
                "keys": named(decoded.keys),
                "tags": named(decoded.tags),
                "uniq_key": named(decoded.uniq_key),
            }
        )
    return rows


def expected_row(record: Record) -> dict[str, Any]:
    return {
        "commitlog_offset": record.commitlog_offset,
        "size": record.size,
        "queue_id": record.queue_id,
        "flag": record.flag,
        "queue_offset": record.queue_offset,
        "sys_flag": record.sys_flag,
        "born_timestamp_ms": record.born_timestamp_ms,
        "store_timestamp_ms": record.store_timestamp_ms,
        "reconsume_times": record.reconsume_times,
        "prepared_transaction_offset": record.prepared_transaction_offset,
        "body_crc": record.body_crc,
        "version": record.version,
        "born_host": record.born_host.java_text(),
        "store_host": record.store_host.java_text(),
        "msg_id": offset_msg_id(record.store_host, record.commitlog_offset),
        "body": record.body,
        "topic": record.topic,
        "properties": list(record.properties.items()),
        "keys": record.keys,
        "tags": record.tags,
        "uniq_key": record.uniq_key,
    }


def described(stop: ScanStop | None) -> tuple[Any, ...] | None:
    """A scan's end, comparable: where, why, the error's kind and words, bytes after."""
    if stop is None:
        return None
    return stop.end_offset, stop.reason, type(stop.error), str(stop.error), stop.dropped_bytes


def scan_rows(log: CommitLog, **options: Any) -> tuple[list[dict[str, Any]], Any]:
    scan = ColumnScan(log, log.min_offset, log.max_file_offset, **options)
    rows = [row for decoded in scan for row in rows_of(decoded)]
    return rows, described(scan.stop)


def per_record(log: CommitLog, check_crc: bool = True) -> tuple[list[dict[str, Any]], Any]:
    scan = log.records(log.min_offset, check_crc=check_crc, stop=log.max_file_offset)
    rows = [expected_row(record) for record in scan]
    return rows, described(scan.stop)


# Apache's stores


@pytest.mark.parametrize("store", [CLEAN, CRASHED], ids=["clean", "crashed"])
@pytest.mark.parametrize("batch_rows", [1, 97, 32_768])
def test_apaches_stores_decode_as_record_by_record(store: Path, batch_rows: int) -> None:
    log = CommitLog(str(store / "commitlog"), FIXTURE_SIZES.commitlog_file_size_bytes)
    try:
        bulk, bulk_stop = scan_rows(log, batch_rows=batch_rows)
        single, single_stop = per_record(log)
    finally:
        log.close()
    assert len(bulk) == len(single) == {CLEAN: 2007, CRASHED: 795}[store]
    for got, want in zip(bulk, single):
        assert got == want
    assert bulk_stop == single_stop


def test_walk_stops_at_the_blank_that_ends_a_file_and_at_zeros() -> None:
    log = CommitLog(str(CLEAN / "commitlog"), FIXTURE_SIZES.commitlog_file_size_bytes)
    try:
        first, last = log.files.files[0], log.files.files[-1]
        full = columnar.walk(first.buf, 0, stop=first.file_size_bytes, rows_max=10**6, bytes_max=1 << 30)
        tail = columnar.walk(last.buf, 0, stop=last.file_size_bytes, rows_max=10**6, bytes_max=1 << 30)
        some = columnar.walk(first.buf, 0, stop=first.file_size_bytes, rows_max=5, bytes_max=1 << 30)
        cut = columnar.walk(first.buf, 0, stop=full.starts[3], rows_max=10**6, bytes_max=1 << 30)
        starts = [r.commitlog_offset for r in log.records(0, stop=first.end_offset)]
    finally:
        log.close()
    assert full.end is WalkEnd.BLANK and full.starts.tolist() == starts
    assert tail.end is WalkEnd.OTHER and tail.position == 2_089_474 - 3 * 524288
    assert (some.end, some.position, some.starts.tolist()) == (WalkEnd.LIMIT, starts[5], starts[:5])
    assert (cut.end, cut.starts.tolist()) == (WalkEnd.STOP, starts[:3])


# Generated records

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
# Addresses Java prints in their own ways: IPv4-mapped IPv6 (dotted), groups of zeros.
SPECIAL_ADDRESSES = [bytes(10) + b"\xff\xff\x7f\x00\x00\x01", bytes(15) + b"\x01", bytes(16), bytes(4), b"\xff" * 16]
hosts = st.builds(
    SocketAddress,
    st.one_of(st.binary(min_size=4, max_size=4), st.binary(min_size=16, max_size=16), st.sampled_from(SPECIAL_ADDRESSES)),
    st.one_of(st.integers(0, 65535), INT32),
)
# Property text: the separators drawn often, names that repeat, non-ASCII characters.
property_pieces = st.lists(
    st.one_of(
        st.sampled_from(["KEYS", "TAGS", "UNIQ_KEY", "K", "A", "\x01", "\x02", "\x01\x01", "", " ", "x\x01", "é", "鍵"]),
        st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=10),
    ),
    max_size=24,
)
property_pairs = st.lists(
    st.tuples(
        st.sampled_from(["KEYS", "TAGS", "UNIQ_KEY", "k", "名前", "MIN_OFFSET", "MAX_OFFSET", "a-long-property-name-1", "a-long-property-name-2"]),
        st.text(alphabet=st.sampled_from("ab \x01é"), max_size=6),
    ),
    max_size=8,
)


@st.composite
def properties_bytes(draw: st.DrawFn) -> bytes:
    """Properties as a writer might have written them, duplicates and empty values
    included, or any text at all."""
    if draw(st.booleans()):
        text = "\x02".join(f"{name}\x01{value}" for name, value in draw(property_pairs))
    else:
        text = "".join(draw(property_pieces))
    return text.encode("utf-8")[:32767]


@st.composite
def records(draw: st.DrawFn) -> tuple[Record, bytes, int]:
    """A record (its fields as decode_record gives them back), its properties' bytes and
    its version (2: the 5.x magic with a 2-byte topic length)."""
    born, store = draw(hosts), draw(hosts)
    sys_flag = draw(st.sampled_from([0, 0x1, 0x2, 0x4, 0x8, 0xC, 0x301])) | (0x10 if born.is_v6 else 0) | (0x20 if store.is_v6 else 0)
    record = Record(
        topic=draw(st.text(alphabet="%|-_abcXYZ019é", min_size=0, max_size=40)),
        body=draw(st.binary(max_size=300)),
        queue_id=draw(INT32),
        flag=draw(INT32),
        queue_offset=draw(INT64),
        sys_flag=sys_flag,
        born_timestamp_ms=draw(INT64),
        born_host=born,
        store_timestamp_ms=draw(INT64),
        store_host=store,
        reconsume_times=draw(INT32),
        prepared_transaction_offset=draw(INT64),
    )
    return record, draw(properties_bytes()), draw(st.sampled_from([1, 1, 2]))


def encode(record: Record, properties: bytes, version: int, offset: int) -> bytes:
    """v1 through the codec; v2 by hand (the codec writes v1 only): the v2 magic and a
    2-byte topic length."""
    if version == 1:
        return encode_record(Record(**{**_fields(record), "commitlog_offset": offset}), properties_bytes=properties)
    topic = record.topic.encode()
    born, store = record.born_host, record.store_host
    size = record_size(len(record.body), len(topic), len(properties), born_v6=born.is_v6, store_v6=store.is_v6, version=2)
    head = head_struct(born.is_v6, store.is_v6).pack(
        size, MAGIC_V2, body_crc(record.body), record.queue_id, record.flag, record.queue_offset, offset,
        record.sys_flag, record.born_timestamp_ms, born.ip, born.port, record.store_timestamp_ms, store.ip,
        store.port, record.reconsume_times, record.prepared_transaction_offset, len(record.body),
    )
    tail = struct.pack(">h", len(topic)) + topic + struct.pack(">h", len(properties)) + properties
    return head + record.body + tail


def _fields(record: Record) -> dict[str, Any]:
    return {name: getattr(record, name) for name in Record.__slots__}  # type: ignore[attr-defined]


def write_log(directory: str, encoded: list[bytes]) -> CommitLog:
    """The records laid out in 64 KiB files, a BLANK where one does not fit (§3.4)."""
    os.makedirs(directory, exist_ok=True)
    files: list[bytearray] = [bytearray(FILE_SIZE)]
    position = 0
    for data in encoded:
        if position + len(data) + 8 > FILE_SIZE:
            files[-1][position : position + 8] = encode_blank(FILE_SIZE - position)
            files.append(bytearray(FILE_SIZE))
            position = 0
        files[-1][position : position + len(data)] = data
        position += len(data)
    for number, content in enumerate(files):
        with open(os.path.join(directory, f"{number * FILE_SIZE:020d}"), "wb") as handle:
            handle.write(content)
    return CommitLog(directory, FILE_SIZE)


def laid_out(items: list[tuple[Record, bytes, int]]) -> list[bytes]:
    """Encode the records with the PHYSICALOFFSET each gets in :func:`write_log`."""
    encoded, offset = [], 0
    for record, properties, version in items:
        size = len(encode(record, properties, version, 0))
        if offset % FILE_SIZE + size + 8 > FILE_SIZE:
            offset += FILE_SIZE - offset % FILE_SIZE
        encoded.append(encode(record, properties, version, offset))
        offset += size
    return encoded


@settings(max_examples=150, deadline=None)
@given(items=st.lists(records(), min_size=1, max_size=40), batch_rows=st.sampled_from([1, 3, 1000]))
def test_generated_records_decode_as_record_by_record(items: list[tuple[Record, bytes, int]], batch_rows: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        log = write_log(directory, laid_out(items))
        try:
            bulk, bulk_stop = scan_rows(log, batch_rows=batch_rows)
            single, single_stop = per_record(log)
        finally:
            log.close()
    assert len(single) == len(items)
    assert bulk == single
    assert bulk_stop == single_stop


@settings(max_examples=300, deadline=None)
@given(data=properties_bytes())
@example(data=b"KEYS\x01k1 k2\x02EMPTY\x01\x02X\x01a\x01b")
@example(data=b"A\x01b\x02")
@example(data=b"\x01v\x02B\x01c")
@example(data=b"AB\x02C\x01d")
@example(data=b"K\x011\x02T\x012\x02K\x013")  # a later duplicate wins, in the first one's place
# Names that are not UTF-8: different bytes, one text (U+FFFD), so one pair.
@example(data=b"\xff\x01a\x02\xfe\x01b")
@example(data=b"A_LONG_NAME_\xff\x01a\x02KEYS\x01k\x02A_LONG_NAME_\xfe\x01b")
def test_properties_split_as_the_per_record_decoder_does(data: bytes) -> None:
    record = encode_record(Record(topic="T", commitlog_offset=0), properties_bytes=data)
    decoded = columnar.decode(record, [0], base_offset=0)
    want = decode_record(record)
    assert isinstance(want, Record)
    assert rows_of(decoded) == [expected_row(want)]


@given(st.lists(st.sampled_from([b"\x01", b"\x02", b"\xff", b"\xfe", b"\xc3", b"A", b"KEYS", b"A_LONG_NAME_"]), max_size=16))
def test_properties_that_are_not_utf8_split_as_the_per_record_decoder_does(pieces: list[bytes]) -> None:
    data = b"".join(pieces)
    record = encode_record(Record(topic="T", commitlog_offset=0), properties_bytes=data)
    want = decode_record(record)
    assert isinstance(want, Record)
    assert rows_of(columnar.decode(record, [0], base_offset=0)) == [expected_row(want)]


def test_long_properties_and_many_pairs_share_a_batch_with_short_ones(tmp_path: Path) -> None:
    """Properties are searched in rows of a power-of-two width: rows of several widths in
    one batch, rows with more pairs than are compared for repeats, repeats among them."""
    many = "\x02".join(f"name-{n}\x01v{n}" for n in range(40))
    repeating = "\x02".join(f"name-{n % 7}\x01v{n}" for n in range(40))
    items = [
        (Record(topic="T"), b"KEYS\x01k1 k2\x02V\x01" + b"x\x01" * 2500, 1),
        (Record(topic="T"), b"A\x01b", 1),
        (Record(topic="T"), many.encode(), 1),
        (Record(topic="T"), repeating.encode(), 2),
        (Record(topic="T"), b"", 1),
        (Record(topic="T"), ("TAGS\x01" + "é" * 300).encode(), 1),
    ]
    log = write_log(str(tmp_path / "commitlog"), laid_out(items))
    try:
        bulk, bulk_stop = scan_rows(log)
        single, single_stop = per_record(log)
    finally:
        log.close()
    assert bulk == single and len(bulk) == len(items)
    assert bulk_stop == single_stop
    assert [len(row["properties"]) for row in bulk] == [2, 1, 40, 7, 0, 1]


def test_walk_stops_after_the_record_that_crosses_its_byte_limit() -> None:
    log = CommitLog(str(CLEAN / "commitlog"), FIXTURE_SIZES.commitlog_file_size_bytes)
    try:
        buf = log.files.files[0].buf
        one = columnar.walk(buf, 0, stop=len(buf), rows_max=10**6, bytes_max=1)
        starts = [r.commitlog_offset for r in log.records(0, stop=4000)]
    finally:
        log.close()
    assert (one.starts.tolist(), one.position, one.end) == ([0], starts[1], WalkEnd.LIMIT)


# Damaged logs end where, and as, the per-record reader says


DAMAGE = {
    "size": (0, b"\x00\x00\x00\x10"),
    "huge size": (0, b"\x7f\x00\x00\x00"),
    "magic": (4, b"\x00\x00\x00\x01"),
    "zero header": (0, bytes(8)),
    "blank": (4, bytes.fromhex("CBD43194")),
    "body crc": (8, b"\x00\x00\x00\x07"),
    "physical offset": (28, b"\x00\x00\x00\x00\x00\x00\x00\x01"),
    "body length": (84, b"\x00\x00\x00\x05"),
    "negative body length": (84, b"\xff\xff\xff\xf0"),
}


def damaged_log(tmp_path: Path, damage: str, victim: int) -> CommitLog:
    """20 records, the one numbered ``victim`` damaged as ``DAMAGE`` says."""
    items = [
        (Record(topic=f"T{n % 3}", body=bytes([n]) * (50 + n), properties={"KEYS": f"k{n}"}), b"KEYS\x01k%d" % n, 1)
        for n in range(20)
    ]
    encoded = laid_out(items)
    at, patch = DAMAGE[damage]
    damaged = bytearray(encoded[victim])
    damaged[at : at + len(patch)] = patch
    encoded[victim] = bytes(damaged)
    return write_log(str(tmp_path / "commitlog"), encoded)


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("victim", [0, 7, 19], ids=["first", "middle", "last"])
@pytest.mark.parametrize("check_crc", [True, False])
def test_damaged_logs_end_as_record_by_record(tmp_path: Path, damage: str, victim: int, check_crc: bool) -> None:
    log = damaged_log(tmp_path, damage, victim)
    try:
        bulk, bulk_stop = scan_rows(log, check_crc=check_crc, batch_rows=4)
        single, single_stop = per_record(log, check_crc)
    finally:
        log.close()
    assert bulk == single
    assert bulk_stop == single_stop


@pytest.mark.parametrize("cut", [4, 8, 50, 90])
def test_a_torn_last_record_ends_the_log_as_record_by_record(tmp_path: Path, cut: int) -> None:
    encoded = laid_out([(Record(topic="T", body=b"x" * 40), b"A\x01b", 1)] * 5)
    encoded[-1] = encoded[-1][:cut]
    log = write_log(str(tmp_path / "commitlog"), encoded)
    try:
        bulk, bulk_stop = scan_rows(log)
        single, single_stop = per_record(log)
    finally:
        log.close()
    assert bulk == single and len(bulk) == 4
    assert bulk_stop == single_stop and bulk_stop is not None
    assert bulk_stop[1] is StopReason.TORN


# Arrow batches (the pipeline's assembly), including text that is not UTF-8


def test_arrow_batches_replace_bad_utf8_as_the_per_record_decoder(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    pytest.importorskip("pyspark")
    from rmqstore.pipeline import columns

    items = [
        (Record(topic="ok"), b"KEYS\x01good\x02TAGS\x01t", 1),
        (Record(topic="bad"), b"KEYS\x01\xff\xfe\x02N\xc3\x01v\x02N\xc3\x01w", 1),
    ]
    encoded = laid_out(items)
    encoded[1] = encoded[1].replace(b"\x03bad", b"\x03b\xe9d")
    log = write_log(str(tmp_path / "commitlog"), encoded)
    try:
        (decoded,) = list(ColumnScan(log, 0, FILE_SIZE))
        batch = columns.arrow_batch(decoded, "s", columns.arrow_schema())
        want = list(log.records())
    finally:
        log.close()
    assert batch.column("topic").to_pylist() == [r.topic for r in want] == ["ok", "b\ufffdd"]
    assert [dict(p) for p in batch.column("properties").to_pylist()] == [r.properties for r in want]
    assert batch.column("keys").to_pylist() == [r.keys for r in want] == ["good", "\ufffd\ufffd"]
    assert batch.column("tags").to_pylist() == ["t", None]


@settings(max_examples=150, deadline=None)
@given(items=st.lists(records(), min_size=1, max_size=40), batch_rows=st.sampled_from([1, 3, 1000]))
def test_arrow_batches_hold_what_the_per_record_decoder_reads(items: list[tuple[Record, bytes, int]], batch_rows: int) -> None:
    """IPv6 hosts, v2 records, empty and odd properties, duplicate names (the last value
    wins), in batches of every size."""
    pa = pytest.importorskip("pyarrow")
    pytest.importorskip("pyspark")
    from rmqstore.pipeline import columns

    schema = columns.arrow_schema()
    with tempfile.TemporaryDirectory() as directory:
        log = write_log(directory, laid_out(items))
        try:
            scan = ColumnScan(log, log.min_offset, log.max_file_offset, batch_rows=batch_rows)
            table = pa.Table.from_batches([columns.arrow_batch(d, "s", schema) for d in scan if d.rows], schema=schema)
            want = list(log.records())
        finally:
            log.close()
    assert table.num_rows == len(items) == len(want)
    assert table.column("commitLogOffset").to_pylist() == [r.commitlog_offset for r in want]
    assert table.column("queueOffset").to_pylist() == [r.queue_offset for r in want]
    assert table.column("topic").to_pylist() == [r.topic for r in want]
    assert table.column("body").to_pylist() == [r.body for r in want]
    assert [dict(p) for p in table.column("properties").to_pylist()] == [r.properties for r in want]
    assert table.column("keys").to_pylist() == [r.properties.get("KEYS") for r in want]
    assert table.column("uniqKey").to_pylist() == [r.properties.get("UNIQ_KEY") for r in want]
    assert table.column("bornHost").to_pylist() == [r.born_host.java_text() for r in want]
    assert table.column("storeHost").to_pylist() == [r.store_host.java_text() for r in want]


def test_arrow_batches_print_every_host_as_java_does() -> None:
    """One batch of many hosts (a producer's port changes with each connection)."""
    pytest.importorskip("pyarrow")
    pytest.importorskip("pyspark")
    from rmqstore.pipeline import columns

    addresses = [SocketAddress(bytes([10, 0, n // 256, n % 256]), 40000 + n) for n in range(300)]
    addresses += [SocketAddress(address, port) for address in SPECIAL_ADDRESSES for port in (0, 9876, -1, 2**31 - 1, -(2**31))]
    items = [(Record(topic="T", born_host=a, store_host=addresses[-1 - n]), b"", 1) for n, a in enumerate(addresses)]
    data = b"".join(laid_out(items))
    starts = np.cumsum([0] + [len(e) for e in laid_out(items)[:-1]]).astype(np.int64)
    decoded = columnar.decode(data, starts, base_offset=0)
    assert decoded.rows == len(items)
    batch = columns.arrow_batch(decoded, "s", columns.arrow_schema())
    assert batch.column("bornHost").to_pylist() == [a.java_text() for a in addresses]
    assert batch.column("storeHost").to_pylist() == [a.java_text() for a in reversed(addresses)]
    assert "127.0.0.1:9876" in batch.column("bornHost").to_pylist()
    assert "0:0:0:0:0:0:0:1:-1" in batch.column("bornHost").to_pylist()
