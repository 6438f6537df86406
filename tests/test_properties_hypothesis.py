"""Property tests: every codec round-trips, and the file layers roll over as docs/format.md says.

Each file-layer example gets its own temporary directory (``tmp_path`` is shared by all
examples of one test). References written here (the properties reader, String.hashCode,
the §3.4 rollover rule) are deliberately naive re-statements of docs/format.md, not calls into
the library.
"""

from __future__ import annotations

import datetime as dt
import os
import struct
import tempfile
import zlib
from collections import Counter

from hypothesis import example, given, settings
from hypothesis import strategies as st

from rmqstore.common.codec import index as ix
from rmqstore.common.codec.consumequeue import FILLER, Unit, decode_unit, encode_unit
from rmqstore.common.codec.dispatch import DispatchPlan
from rmqstore.common.codec.hosts import SocketAddress
from rmqstore.common.codec.javahash import index_key, index_key_hash, java_string_hash
from rmqstore.common.codec.msgid import (
    OffsetMsgId,
    UniqKey,
    decode_offset_msg_id,
    decode_uniq_key,
    encode_uniq_key,
    offset_msg_id,
)
from rmqstore.common.codec.properties import decode_properties, encode_properties
from rmqstore.common.codec.record import Record, decode_record, encode_record
from rmqstore.common.errors import Corruption
from rmqstore.common.files.commitlog import CommitLog, StopReason
from rmqstore.common.files.consumequeue import ConsumeQueue
from rmqstore.common.files.index import IndexFile, IndexFileList

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
UINT16 = st.integers(0, 0xFFFF)
PORT = st.integers(0, 65535)
INT32_MIN = -(2**31)
BLANK_MAGIC_BYTES = bytes.fromhex("CBD43194")
V1_MAGIC_BYTES = bytes.fromhex("DAA320A7")

TOPIC_ALPHABET = "%|-_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
topics = st.text(alphabet=TOPIC_ALPHABET, min_size=1, max_size=127)

# Any code point except the two separators and surrogates (UTF-8 cannot carry those);
# non-BMP characters are deliberately included.
property_text = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=12,
)
property_maps = st.dictionaries(property_text, property_text, max_size=6)

ipv4 = st.binary(min_size=4, max_size=4)
ipv6 = st.binary(min_size=16, max_size=16)
hosts = st.builds(SocketAddress, st.one_of(ipv4, ipv6), PORT)

# sysFlag as a producer/broker could set it: compressed, multi-tags, transaction type,
# compression type bits and, sometimes, stale IPv6 bits that encode must overwrite.
sys_flags = st.builds(
    lambda compressed, multi, tran, ctype, v6: compressed | multi | tran | (ctype << 8) | v6,
    st.sampled_from([0, 0x1]),
    st.sampled_from([0, 0x2]),
    st.sampled_from([0x0, 0x4, 0x8, 0xC]),
    st.integers(0, 3),
    st.sampled_from([0, 0x10, 0x20, 0x30]),
)


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def java_hash_reference(text: str) -> int:
    """String.hashCode from first principles: split each code point into UTF-16 units."""
    h = 0
    for char in text:
        code = ord(char)
        if code >= 0x10000:
            code -= 0x10000
            units = [0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF)]
        else:
            units = [code]
        for unit in units:
            h = (h * 31 + unit) % 2**32
    return h - 2**32 if h >= 2**31 else h


def apache_properties_reference(text: str) -> dict[str, str]:
    """MessageDecoder.string2messageProperties, transcribed from docs/format.md §3.6 (the Java
    index loop, with its indexOf for 0x01 that may run past the segment)."""
    result: dict[str, str] = {}
    index = 0
    while index < len(text):
        new_index = text.find("\x02", index)
        if new_index < 0:
            new_index = len(text)
        if new_index - index >= 3:
            kv = text.find("\x01", index)
            if index < kv < new_index - 1:
                result[text[index:kv]] = text[kv + 1 : new_index]
        index = new_index + 1
    return result


def expected_size(body: bytes, topic: str, properties_bytes: bytes, born: SocketAddress, store: SocketAddress) -> int:
    """§3.1: 75 + b + s + n + t + p for v1."""
    return 75 + (20 if born.is_v6 else 8) + (20 if store.is_v6 else 8) + len(body) + len(topic) + len(properties_bytes)


# Records


@settings(max_examples=300, deadline=None)
@given(
    topic=topics,
    body=st.binary(max_size=5000),
    properties=property_maps,
    born=hosts,
    store=hosts,
    sys_flag=sys_flags,
    queue_id=INT32,
    flag=INT32,
    queue_offset=INT64,
    commitlog_offset=st.integers(0, 2**63 - 1),
    born_ts=INT64,
    store_ts=INT64,
    reconsume=INT32,
    prepared=INT64,
    prefix=st.binary(max_size=16),
)
def test_record_round_trip(
    topic: str,
    body: bytes,
    properties: dict[str, str],
    born: SocketAddress,
    store: SocketAddress,
    sys_flag: int,
    queue_id: int,
    flag: int,
    queue_offset: int,
    commitlog_offset: int,
    born_ts: int,
    store_ts: int,
    reconsume: int,
    prepared: int,
    prefix: bytes,
) -> None:
    original = Record(
        topic=topic,
        body=body,
        properties=properties,
        queue_id=queue_id,
        flag=flag,
        queue_offset=queue_offset,
        commitlog_offset=commitlog_offset,
        sys_flag=sys_flag,
        born_timestamp_ms=born_ts,
        born_host=born,
        store_timestamp_ms=store_ts,
        store_host=store,
        reconsume_times=reconsume,
        prepared_transaction_offset=prepared,
    )
    data = encode_record(original)
    properties_bytes = "\x02".join(f"{k}\x01{v}" for k, v in properties.items()).encode("utf-8")
    size = expected_size(body, topic, properties_bytes, born, store)
    assert len(data) == size
    if not born.is_v6 and not store.is_v6:
        assert size == 91 + len(body) + len(topic) + len(properties_bytes)
    crc = zlib.crc32(body) & 0x7FFFFFFF if body else 0
    assert data[:12] == struct.pack(">i", size) + V1_MAGIC_BYTES + struct.pack(">i", crc)
    host_bits = (0x10 if born.is_v6 else 0) | (0x20 if store.is_v6 else 0)
    expected = Record(
        topic=topic,
        body=body,
        properties=properties,
        queue_id=queue_id,
        flag=flag,
        queue_offset=queue_offset,
        commitlog_offset=commitlog_offset,
        sys_flag=(sys_flag & ~0x30) | host_bits,
        born_timestamp_ms=born_ts,
        born_host=born,
        store_timestamp_ms=store_ts,
        store_host=store,
        reconsume_times=reconsume,
        prepared_transaction_offset=prepared,
        body_crc=crc,
        size=size,
        version=1,
    )
    decoded = decode_record(data)
    assert decoded == expected
    assert isinstance(decoded, Record)
    assert list(decoded.properties) == list(properties)  # order kept, so bytes are too
    assert encode_record(decoded) == data
    # Inside a larger buffer, at a non-zero position, with data after it.
    assert decode_record(prefix + data + b"\xff" * 9, len(prefix)) == expected


@settings(max_examples=300, deadline=None)
@given(
    body=st.binary(max_size=300),
    properties=property_maps,
    born=hosts,
    store=hosts,
    version_2=st.booleans(),
    mutations=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), min_size=1, max_size=4),
    cut=st.integers(0, 10_000),
)
def test_decode_of_damaged_record_only_raises_corruption(
    body: bytes,
    properties: dict[str, str],
    born: SocketAddress,
    store: SocketAddress,
    version_2: bool,
    mutations: list[tuple[int, int]],
    cut: int,
) -> None:
    """Flipped bytes and truncation give a record, a BLANK, None or Corruption; never a
    struct/index/unicode error from reading past the bytes."""
    data = bytearray(encode_record(Record(topic="TopicTest", body=body, properties=properties, born_host=born, store_host=store)))
    if version_2:  # a v2 record: 2-byte topic length (docs/format.md §14)
        topic_at = len(data) - 2 - len(encode_properties(properties)) - len("TopicTest") - 1
        data[4:8] = bytes.fromhex("DAA320AB")
        data[topic_at : topic_at + 1] = struct.pack(">h", len("TopicTest"))
        struct.pack_into(">i", data, 0, len(data))
        assert isinstance(decode_record(data), Record)
    for position, mask in mutations:
        data[position % len(data)] ^= mask
    damaged = bytes(data[: cut % (len(data) + 1)])
    for buf in (damaged, memoryview(damaged), damaged + bytes(64)):
        try:
            decode_record(buf, 0, commitlog_offset=4096)
        except Corruption as error:
            assert error.offset == 4096
            assert "commit log offset 4096" in str(error)


# Properties


@settings(max_examples=300)
@given(properties=property_maps)
def test_properties_round_trip(properties: dict[str, str]) -> None:
    encoded = encode_properties(properties)
    assert encoded == "\x02".join(f"{k}\x01{v}" for k, v in properties.items()).encode("utf-8")
    assert not encoded.endswith(b"\x02")
    decoded = decode_properties(encoded)
    assert decoded == properties
    assert list(decoded) == list(properties)


@settings(max_examples=200)
@given(
    name=property_text,
    value=st.text(alphabet=st.sampled_from("a\x01\U0001F680é"), min_size=1, max_size=8),
)
def test_property_values_may_hold_name_value_separators(name: str, value: str) -> None:
    """The reader cuts at the first 0x01 only, so a value keeps later ones (§3.6 rule 3)."""
    assert decode_properties(encode_properties({name: value, "Z": "z"})) == {name: value, "Z": "z"}


separator_heavy_text = st.text(
    alphabet=st.one_of(st.sampled_from("\x01\x02ab"), st.characters(blacklist_categories=("Cs",))),
    max_size=40,
)


@settings(max_examples=500)
@given(text=separator_heavy_text)
@example(text="KEYS\x01k1 k2\x02EMPTY\x01\x02X\x01a\x01b")
@example(text="A\x01b\x02")
@example(text="\x01v\x02B\x01c")
@example(text="AB\x02C\x01d")
@example(text="A\x01b\x02A\x01c")
def test_decode_properties_matches_apache_reader(text: str) -> None:
    assert decode_properties(text.encode("utf-8")) == apache_properties_reference(text)


@settings(max_examples=300)
@given(data=st.binary(max_size=64))
def test_decode_properties_of_any_bytes_never_raises(data: bytes) -> None:
    # Invalid UTF-8 becomes U+FFFD, as Java's new String(bytes, UTF_8) does.
    assert decode_properties(data) == apache_properties_reference(data.decode("utf-8", "replace"))
    assert decode_properties(memoryview(data)) == decode_properties(data)


# Hashes


@settings(max_examples=500)
@given(text=st.text(alphabet=st.characters(), max_size=40))  # lone surrogates included
@example(text="polygenelubricants")
@example(text="TopicTest#\U0001F680")
@example(text="\ud83d")
def test_java_string_hash_over_utf16_units(text: str) -> None:
    h = java_string_hash(text)
    assert h == java_hash_reference(text)
    assert INT32_MIN <= h < 2**31


@settings(max_examples=500)
@given(text=st.text(max_size=40))
@example(text="")  # hash 0
@example(text="polygenelubricants")  # Integer.MIN_VALUE
@example(text="TopicTest#KU8JAAYHLHI")  # Integer.MIN_VALUE
def test_index_key_hash_is_non_negative(text: str) -> None:
    key_hash = index_key_hash(text)
    h = java_hash_reference(text)
    assert 0 <= key_hash <= 2**31 - 1
    assert (key_hash == 0) == (h in (0, INT32_MIN))
    if h != INT32_MIN:
        assert key_hash == abs(h)


# Message ids


@settings(max_examples=300)
@given(ip=st.one_of(ipv4, ipv6), port=PORT, offset=st.integers(0, 2**63 - 1))
def test_offset_msg_id_round_trip(ip: bytes, port: int, offset: int) -> None:
    host = SocketAddress(ip, port)
    msg_id = offset_msg_id(host, offset)
    assert len(msg_id) == (32 if len(ip) == 4 else 56)
    assert msg_id == msg_id.upper()
    assert bytes.fromhex(msg_id) == ip + struct.pack(">iq", port, offset)
    assert decode_offset_msg_id(msg_id) == OffsetMsgId(host, offset)
    assert decode_offset_msg_id(msg_id.lower()) == OffsetMsgId(host, offset)


@settings(max_examples=300)
@given(
    ip=st.one_of(ipv4, ipv6),
    pid=UINT16,
    loader_hash=INT32,
    time_ms=st.integers(0, 2**32 - 1),
    counter=UINT16,
)
def test_uniq_key_round_trip(ip: bytes, pid: int, loader_hash: int, time_ms: int, counter: int) -> None:
    key = UniqKey(ip, pid, loader_hash, time_ms, counter)
    text = encode_uniq_key(key)
    assert len(text) == (32 if len(ip) == 4 else 56)
    assert text == text.upper()
    assert bytes.fromhex(text) == ip + struct.pack(">HiIH", pid, loader_hash, time_ms, counter)
    assert decode_uniq_key(text) == key
    assert decode_uniq_key(text.lower()) == key


# Consume queue units and index structures


@settings(max_examples=300)
@given(offset=INT64, size=INT32, tags=INT64, prefix=st.binary(max_size=20))
def test_consume_queue_unit_round_trip(offset: int, size: int, tags: int, prefix: bytes) -> None:
    data = encode_unit(offset, size, tags)
    assert data == struct.pack(">qiq", offset, size, tags)
    unit = decode_unit(prefix + data, len(prefix))
    assert unit == Unit(offset, size, tags)
    assert unit.is_valid == (offset >= 0 and size > 0)
    assert unit.is_filler == (data == FILLER)


@settings(max_examples=300)
@given(
    header=st.builds(ix.Header, INT64, INT64, INT64, INT64, INT32, INT32),
    entry=st.builds(ix.Entry, INT32, INT64, INT32, INT32),
    prefix=st.binary(max_size=20),
)
def test_index_header_and_entry_round_trip(header: ix.Header, entry: ix.Entry, prefix: bytes) -> None:
    header_bytes = ix.encode_header(header)
    assert header_bytes == struct.pack(
        ">qqqqii",
        header.begin_timestamp_ms,
        header.end_timestamp_ms,
        header.begin_phy_offset,
        header.end_phy_offset,
        header.hash_slot_count,
        header.index_count,
    )
    assert ix.decode_header(prefix + header_bytes, len(prefix)) == header
    entry_bytes = ix.encode_entry(entry)
    assert entry_bytes == struct.pack(">iqii", entry.key_hash, entry.phy_offset, entry.time_diff_s, entry.prev_index)
    assert ix.decode_entry(prefix + entry_bytes, len(prefix)) == entry


# Commit log rollover


def _small_record(topic: str, body_len: int, store: SocketAddress, key: str) -> Record:
    return Record(
        topic=topic,
        body=bytes((i * 7 + 1) % 251 + 1 for i in range(body_len)),
        properties={"KEYS": key},
        store_host=store,
        born_host=SocketAddress(b"\x0a\x00\x00\x02", 50000),
        store_timestamp_ms=1_700_000_000_000,
    )


@settings(max_examples=40, deadline=None)
@given(file_size=st.sampled_from([4096, 8192]), data=st.data())
def test_commitlog_rollover(file_size: int, data: st.DataObject) -> None:
    """Appends (single records and batches) against a model of docs/format.md §3.4."""
    written: list[tuple[int, bytes]] = []  # (commit log offset, final bytes)
    blanks: dict[int, int] = {}  # file start -> BLANK position in that file
    model_offset = 0
    with tempfile.TemporaryDirectory() as directory:
        log = CommitLog(directory, file_size, writable=True)
        log.set_write_position(0)
        queue_offset = 0
        for _ in range(data.draw(st.integers(1, 30), label="appends")):
            batch_len = data.draw(st.integers(1, 4), label="batch")
            room = file_size - model_offset % file_size
            records = []
            for position_in_batch in range(batch_len):
                topic = data.draw(st.sampled_from(["T", "TopicTest", "%RETRY%g-1"]))
                store = data.draw(st.sampled_from([SocketAddress(b"\x0a\x00\x00\x01", 10911), SocketAddress(bytes(15) + b"\x01", 10911)]))
                overhead = len(encode_record(_small_record(topic, 0, store, f"k{queue_offset}")))
                if batch_len == 1 and data.draw(st.booleans(), label="fill exactly"):
                    # Make the record exactly fit (8 bytes left) or miss by one byte.
                    body_len = room - 8 - overhead + data.draw(st.sampled_from([0, 1]), label="miss")
                    if not 0 <= body_len <= file_size - 8 - overhead:
                        body_len = 0
                else:
                    body_len = data.draw(st.integers(0, file_size // 4 - 200), label="body")
                records.append(_small_record(topic, body_len, store, f"k{queue_offset + position_in_batch}"))
            encoded = [bytearray(encode_record(r)) for r in records]
            total = sum(len(e) for e in encoded)
            if total + 8 > room:
                blanks[model_offset - model_offset % file_size] = model_offset % file_size
                model_offset += room
            expected_offsets = []
            for item in encoded:
                expected_offsets.append(model_offset)
                model_offset += len(item)
            offsets = log.append(encoded, list(range(queue_offset, queue_offset + batch_len)))
            assert offsets == expected_offsets
            assert len({offset // file_size for offset in offsets}) == 1  # a batch never spans files
            assert log.write_offset == model_offset
            for offset, item, record in zip(offsets, encoded, records):
                record.commitlog_offset = offset
                record.queue_offset = queue_offset
                assert bytes(item) == encode_record(record)
                written.append((offset, bytes(item)))
                queue_offset += 1
        log.flush()
        log.close()

        names = sorted(os.listdir(directory))
        file_count = model_offset // file_size + 1
        assert names == [f"{n * file_size:020d}" for n in range(file_count)]
        contents = {int(name): read_bytes(os.path.join(directory, name)) for name in names}
        assert all(len(content) == file_size for content in contents.values())
        assert sorted(blanks) == [n * file_size for n in range(file_count - 1)]  # every full file
        for start, position in blanks.items():
            content = contents[start]
            assert content[position : position + 8] == struct.pack(">i", file_size - position) + BLANK_MAGIC_BYTES
            assert not any(content[position + 8 :])
        active_start = (file_count - 1) * file_size
        assert not any(contents[active_start][model_offset - active_start :])
        for offset, item in written:
            start = offset - offset % file_size
            assert contents[start][offset - start : offset - start + len(item)] == item

        reader = CommitLog(directory, file_size)
        try:
            scan = reader.records()
            assert [(r.commitlog_offset, encode_record(r)) for r in scan] == written
            assert scan.stop is not None
            assert (scan.stop.reason, scan.stop.end_offset, scan.stop.error, scan.stop.dropped_bytes) == (
                StopReason.END,
                model_offset,
                None,
                0,
            )
            for offset, item in written:
                assert reader.read(offset).size == len(item)
        finally:
            reader.close()


@settings(max_examples=60, deadline=None)
@given(
    body_lens=st.lists(st.integers(0, 900), min_size=1, max_size=12),
    mutations=st.lists(st.tuples(st.integers(0, 2**20), st.integers(1, 255)), min_size=1, max_size=3),
)
def test_commitlog_scan_of_damaged_files_terminates_with_a_verdict(body_lens: list[int], mutations: list[tuple[int, int]]) -> None:
    """Whatever bytes are flipped, scan returns a ScanStop (no other exception, no hang),
    every record wholly before the first damaged byte still comes back, and a CORRUPT
    verdict always reports bytes it would drop."""
    file_size = 4096
    with tempfile.TemporaryDirectory() as directory:
        log = CommitLog(directory, file_size, writable=True)
        log.set_write_position(0)
        originals = []
        for n, body_len in enumerate(body_lens):
            encoded = bytearray(encode_record(_small_record("T", body_len, SocketAddress(b"\x0a\x00\x00\x01", 1), f"k{n}")))
            [offset] = log.append([encoded], [n])
            originals.append((offset, len(encoded)))
        end = log.write_offset
        assert end is not None
        log.flush()
        log.close()
        first_damage = None
        for position, mask in mutations:
            offset = position % end
            path = os.path.join(directory, f"{offset - offset % file_size:020d}")
            with open(path, "r+b") as handle:
                handle.seek(offset % file_size)
                byte = handle.read(1)[0]
                handle.seek(offset % file_size)
                handle.write(bytes([byte ^ mask]))
            first_damage = offset if first_damage is None else min(first_damage, offset)
        assert first_damage is not None
        reader = CommitLog(directory, file_size)
        try:
            scan = reader.records()
            offsets = [record.commitlog_offset for record in scan]
            stop = scan.stop
        finally:
            reader.close()
        intact = [offset for offset, size in originals if offset + size <= first_damage]
        assert offsets[: len(intact)] == intact
        assert offsets == sorted(set(offsets))
        assert stop is not None
        if stop.reason is StopReason.CORRUPT:
            assert stop.dropped_bytes > 0 and stop.error is not None
        else:
            assert stop.dropped_bytes >= 0


# Consume queue rollover


@settings(max_examples=60, deadline=None)
@given(
    file_units=st.integers(3, 7),
    start=st.integers(0, 30),
    count=st.integers(1, 40),
    sizes=st.lists(st.integers(1, 2**31 - 1), min_size=40, max_size=40),
    tags=st.lists(INT64, min_size=40, max_size=40),
)
def test_consume_queue_rollover(file_units: int, start: int, count: int, sizes: list[int], tags: list[int]) -> None:
    file_bytes = file_units * 20
    units = [encode_unit(1000 * n, sizes[n], tags[n]) for n in range(count)]
    with tempfile.TemporaryDirectory() as root:
        writer = ConsumeQueue(root, "Topic_A", 3, file_units, writable=True)
        for n, unit in enumerate(units):
            assert writer.append(start + n, unit)
        assert not writer.append(start + count - 1, units[-1])  # re-dispatch is a no-op
        writer.close()

        directory = os.path.join(root, "Topic_A", "3")
        first_file = start * 20 // file_bytes * file_bytes
        last_file = (start + count - 1) * 20 // file_bytes * file_bytes
        names = sorted(os.listdir(directory))
        assert names == [f"{p:020d}" for p in range(first_file, last_file + 1, file_bytes)]
        queue_bytes = b"".join(read_bytes(os.path.join(directory, name)) for name in names)
        assert all(os.path.getsize(os.path.join(directory, name)) == file_bytes for name in names)
        fillers = start - first_file // 20
        assert queue_bytes == FILLER * fillers + b"".join(units) + bytes(len(queue_bytes) - 20 * (fillers + count))

        reader = ConsumeQueue(root, "Topic_A", 3, file_units)
        try:
            assert (reader.min_offset, reader.max_offset) == (start, start + count)
            assert reader.max_commitlog_end == 1000 * (count - 1) + sizes[count - 1]
            for n in range(count):
                assert reader.read(start + n) == Unit(1000 * n, sizes[n], tags[n])
            assert reader.read(start - 1) is None
            assert reader.read(start + count) is None
            assert list(reader.units()) == [(start + n, Unit(1000 * n, sizes[n], tags[n])) for n in range(count)]
        finally:
            reader.close()


# Index rollover

INDEX_SLOTS = 7
INDEX_ENTRIES = 5
index_keys = st.lists(st.sampled_from(["a", "b", "c", "d", "order-1", "订单", "\U0001F680", "AaAa", "BBBB"]), max_size=7)


def _walk_index_file(index_file: IndexFile, report: Counter[tuple[int, int]]) -> None:
    """check_store's index rules: each entry in use is reached exactly once, from the slot
    its hash maps to; hashSlotCount counts the non-empty slots."""
    header = index_file.header
    count = header.index_count
    reached: Counter[int] = Counter()
    non_empty = 0
    for slot in range(INDEX_SLOTS):
        (number,) = ix.SLOT.unpack_from(index_file.mapped.buf, ix.slot_position(slot))
        non_empty += number != 0
        while number != 0:
            assert 0 < number < count
            entry = index_file.entry(number)
            assert entry.key_hash % INDEX_SLOTS == slot
            reached[number] += 1
            report[(entry.key_hash, entry.phy_offset)] += 1
            assert entry.prev_index < number
            number = entry.prev_index
    assert reached == Counter(range(1, max(count, 1)))
    assert header.hash_slot_count == non_empty


@settings(max_examples=60, deadline=None)
@given(plans=st.lists(st.tuples(st.sampled_from(["T1", "T2"]), index_keys), min_size=1, max_size=25))
def test_index_rollover(plans: list[tuple[str, list[str]]]) -> None:
    puts: list[tuple[str, str, int]] = []  # (topic, key, commit log offset) in put order
    with tempfile.TemporaryDirectory() as directory:
        writer = IndexFileList(directory, INDEX_SLOTS, INDEX_ENTRIES, writable=True, zone=dt.UTC)
        for n, (topic, keys) in enumerate(plans):
            offset = 200 * (n + 1)
            plan = DispatchPlan(
                topic=topic,
                queue_id=0,
                queue_offset=n,
                commitlog_offset=offset,
                size=200,
                store_timestamp_ms=1_700_000_000_000 + 700 * n,
                tags_code=0,
                has_unit=True,
                index_keys=tuple(index_key(topic, key) for key in keys),
            )
            assert writer.build_index(plan) == len(keys)
            puts.extend((topic, key, offset) for key in keys)
        writer.close()

        reader = IndexFileList(directory, INDEX_SLOTS, INDEX_ENTRIES)
        try:
            files = reader.files
            assert len(files) >= 1
            for index_file in files[:-1]:
                assert index_file.header.index_count == INDEX_ENTRIES  # every file but the last is full
            assert max(files[-1].header.index_count, 1) - 1 <= INDEX_ENTRIES - 1
            assert sum(max(f.header.index_count, 1) - 1 for f in files) == len(puts)
            # Keys go in order: file by file, entry by entry.
            in_files = [
                index_file.entry(number).phy_offset
                for index_file in files
                for number in range(1, max(index_file.header.index_count, 1))
            ]
            assert in_files == [offset for _, _, offset in puts]
            assert [f.name for f in files] == sorted(f.name for f in files)
            assert all(os.path.getsize(f.path) == ix.file_size(INDEX_SLOTS, INDEX_ENTRIES) for f in files)
            found: Counter[tuple[int, int]] = Counter()
            for index_file in files:
                _walk_index_file(index_file, found)
            assert found == Counter((index_key_hash(index_key(t, k)), o) for t, k, o in puts)
            for topic, key, _ in puts:
                key_hash = index_key_hash(index_key(topic, key))
                same_hash = [o for t, k, o in puts if index_key_hash(index_key(t, k)) == key_hash]
                assert list(reader.candidates(topic, key)) == same_hash[::-1]  # newest first
        finally:
            reader.close()
