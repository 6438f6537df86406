"""The batch paths (writer append, dispatch of many records, vectorized hashing and
validation) against the one-record-at-a-time definitions they stand in for: same bytes,
same answers, same errors."""

from __future__ import annotations

import itertools
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmqstore.common.codec import properties as props
from rmqstore.common.codec import record as record_module
from rmqstore.common.codec.dispatch import SMALL_BATCH_RECORDS, DispatchBatch
from rmqstore.common.codec.hosts import SocketAddress
from rmqstore.common.codec.javahash import (
    index_key,
    index_key_hash,
    index_key_hashes,
    java_string_hash,
    java_string_hashes,
    topic_key_hashes,
)
from rmqstore.common.codec.record import Record, encode_record
from rmqstore.common.errors import CrcMismatch, InvalidArgument, NotFound
from rmqstore.common.files import mapped as mapped_module
from rmqstore.common.files.commitlog import CommitLog
from rmqstore.common.files.consumequeue import ConsumeQueueSet
from rmqstore.common.files.index import IndexFile, IndexFileList
from rmqstore.common.files.store import Dispatcher, StoreSizes
from rmqstore.writer.config import WriterConfig
from rmqstore.writer.store import AppendResult, Writer
from rmqstore.writer.validate import (
    DEFAULT_LIMITS,
    EMPTY_PROPERTIES,
    Limits,
    MessageBatch,
    MessageInput,
    validate_batch,
    validate_message,
)

TEXT = st.text(alphabet=st.sampled_from("aZ09_#- é中\U0001f680"), max_size=40)


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# Hashing


@settings(max_examples=200)
@given(st.lists(TEXT, max_size=50))
def test_vectorized_hashes_equal_java_string_hash(texts: list[str]) -> None:
    assert java_string_hashes(texts).tolist() == [java_string_hash(t) for t in texts]
    assert index_key_hashes(texts).tolist() == [index_key_hash(t) for t in texts]


@settings(max_examples=200)
@given(st.lists(st.tuples(st.sampled_from(["TopicA", "Pay_Events-2", "%RETRY%g"]), TEXT), max_size=50))
def test_topic_key_hashes_equal_hashing_the_joined_string(pairs: list[tuple[str, str]]) -> None:
    topics = ["TopicA", "Pay_Events-2", "%RETRY%g"]
    key_topics = np.array([topics.index(t) for t, _ in pairs], dtype=np.int64)
    got = topic_key_hashes(topics, key_topics, [k for _, k in pairs])
    assert got.tolist() == [index_key_hash(index_key(t, k)) for t, k in pairs]


def test_integer_min_value_hashes_to_zero() -> None:
    # "polygenelubricants".hashCode() is Integer.MIN_VALUE; the index maps it to 0.
    assert java_string_hashes(["polygenelubricants"]).tolist() == [-(2**31)]
    assert index_key_hashes(["polygenelubricants", "a"]).tolist() == [0, 97]


@settings(max_examples=200)
@given(
    st.dictionaries(st.sampled_from(["a", "seq", "{x}", "Zz", "b}"]), st.text(min_size=1, max_size=5), max_size=3),
    st.lists(st.text(alphabet="k0é", min_size=1, max_size=4), max_size=3),
    st.sampled_from(["", "TagA", "标签{}"]),
)
def test_message_properties_equal_the_broker_order_encoding(user: dict[str, str], keys: list[str], tags: str) -> None:
    stored = dict(user)
    if keys:
        stored[props.KEYS] = " ".join(keys)
    if tags:
        stored[props.TAGS] = tags
    stored[props.UNIQ_KEY] = "0A0B0C"
    expected = props.encode_properties(props.broker_order(stored))
    assert props.encode_message_properties(user, keys, tags, "0A0B0C") == expected
    assert props.encode_messages_properties([user], [keys], [tags], ["0A0B0C"]) == [expected]



@given(
    st.dictionaries(st.sampled_from(["a", "seq", "{x}", "Zz", "b}", "traceparent"]), st.text(min_size=1, max_size=5), max_size=3),
    st.lists(st.lists(st.text(alphabet="k0é", min_size=1, max_size=4), min_size=1, max_size=3), min_size=1, max_size=4),
    st.sampled_from(["TagA", "标签{}"]),
)
def test_messages_sharing_one_mapping_encode_as_each_alone(user: dict[str, str], keys: list[list[str]], tags: str) -> None:
    """A batch whose messages share one properties mapping (a traced producer's trace
    context) takes the shared-template path: the same bytes as each message alone."""
    uniq_keys = [f"0A0B0C{i}" for i in range(len(keys))]
    expected = [props.encode_message_properties(user, k, tags, u) for k, u in zip(keys, uniq_keys)]
    assert props.encode_messages_properties([user] * len(keys), keys, [tags] * len(keys), uniq_keys) == expected
    # Equal but distinct mappings, and one message without KEYS: the per-message path, same bytes.
    copies = [dict(user) for _ in keys]
    assert props.encode_messages_properties(copies, keys, [tags] * len(keys), uniq_keys) == expected
    keyless = [[], *keys[1:]]
    assert props.encode_messages_properties([user] * len(keys), keyless, [tags] * len(keys), uniq_keys) == [
        props.encode_message_properties(user, k, tags, u) for k, u in zip(keyless, uniq_keys)
    ]


@given(
    st.lists(st.sampled_from(["a", "seq", "{x}", "Zz", "b}", "traceparent"]), min_size=1, max_size=4, unique=True),
    st.lists(st.lists(st.text(alphabet="v{}é", min_size=1, max_size=4), min_size=4, max_size=4), min_size=1, max_size=5),
    st.booleans(),
)
def test_messages_naming_the_same_properties_encode_as_each_alone(names: list[str], values: list[list[str]], reordered: bool) -> None:
    """Messages with the same property names, each with values of its own (an exporter's
    file), take the one-template path: the same bytes as each message alone; one message
    naming them in another order takes the per-message path, the same bytes again."""
    users = [dict(zip(names, own)) for own in values]
    if reordered:
        users[-1] = dict(reversed(users[-1].items()))
    keys = [[f"order-{i}", "customer"] for i in range(len(users))]
    tags = ["TagA"] * len(users)
    uniq_keys = [f"0A0B0C{i}" for i in range(len(users))]
    expected = [props.encode_properties(props.broker_order({**user, props.KEYS: " ".join(k), props.TAGS: t, props.UNIQ_KEY: u}))
                for user, k, t, u in zip(users, keys, tags, uniq_keys)]  # fmt: skip
    assert props.encode_messages_properties(users, keys, tags, uniq_keys) == expected


def test_a_requests_equal_properties_are_read_into_one_shared_mapping() -> None:
    """As ``messages`` and as ``columns``, a run of messages with equal properties shares
    one mapping (an empty one between them does not break the run)."""
    from rmqstore.v1 import messages_pb2, writer_pb2
    from rmqstore.writer.intake import columns_batch, to_batch

    context = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    other = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01", "origin": "x"}
    shapes: list[dict[str, str]] = [context, context, {}, context, other, other, context]
    messages = [messages_pb2.Message(topic="T", body=b"b", properties=shape) for shape in shapes]
    columns = writer_pb2.MessageColumns(
        bodies=[b"b"] * len(shapes),
        topics=["T"],
        property_counts=[len(shape) for shape in shapes],
        property_names=[name for shape in shapes for name in shape],
        property_values=[value for shape in shapes for value in shape.values()],
    )
    for properties in (to_batch(messages).properties, columns_batch(columns).properties):
        assert [dict(each) for each in properties] == shapes
        first, second, empty, after_gap, third, fourth, last = properties
        assert first is second and third is fourth and first is not third and last is not third
        assert after_gap is first  # an empty one between equal ones does not break the run
        assert empty is EMPTY_PROPERTIES and last == first


# Dispatch


def make_records(rng: random.Random, count: int, file_size: int, *, ascii_only: bool = False) -> list[Record]:
    """Records laid out as a commit log of ``file_size`` files would hold them, with
    colliding keys, empty keys, ROLLBACK and PREPARED records and a delayed topic."""
    records = []
    offset = 0
    next_offset: dict[tuple[str, int], int] = {}
    for n in range(count):
        topic = rng.choice(["TopicA", "TopicB", "SCHEDULE_TOPIC_XXXX"])
        queue_id = rng.randrange(3)
        properties = {props.UNIQ_KEY: f"{rng.getrandbits(64):016X}"}
        if rng.random() < 0.8:
            parts = ["Aa", "BB", f"k{n}", "", "zh" if ascii_only else "中"]
            properties[props.KEYS] = " ".join(rng.choice(parts) for _ in range(rng.randint(1, 3)))
        if rng.random() < 0.5:
            properties[props.TAGS] = rng.choice(["TagA", "TagB"])
        if topic == "SCHEDULE_TOPIC_XXXX":
            properties[props.DELAY] = str(rng.randint(0, 20))
        sys_flag = rng.choice([0, 0, 0, 0x4, 0x8, 0xC])
        key = (topic, queue_id)
        record = Record(
            topic=topic,
            body=bytes(rng.randrange(256) for _ in range(rng.randint(0, 60))),
            properties=properties,
            queue_id=queue_id,
            queue_offset=next_offset.get(key, 0),
            sys_flag=sys_flag,
            store_timestamp_ms=1_700_000_000_000 + n * 700,
            born_timestamp_ms=1_700_000_000_000,
            born_host=SocketAddress.parse("10.0.0.1:1"),
            store_host=SocketAddress.parse("10.0.0.2:2"),
        )
        size = len(encode_record(record))
        if offset % file_size + size + 8 > file_size:
            offset += file_size - offset % file_size
        record.commitlog_offset, record.size = offset, size
        offset += size
        if sys_flag in (0, 0x8):
            next_offset[key] = record.queue_offset + 1
        records.append(record)
    return records


def dispatch_into(root: Path, records: list[Record], batch_size: int | None) -> dict[object, int]:
    """Dispatch ``records`` one at a time or in batches; each queue's maxPhysicOffset
    (``max_commitlog_end``) as the dispatch left it in memory."""
    queues = ConsumeQueueSet(str(root / "consumequeue"), 7, writable=True)
    index = IndexFileList(str(root / "index"), 11, 40, writable=True)
    dispatcher = Dispatcher(queues, index)
    if batch_size is None:
        for record in records:
            dispatcher.dispatch(record)
    else:
        for start in range(0, len(records), batch_size):
            batch = DispatchBatch()
            for record in records[start : start + batch_size]:
                batch.add_record(record)
            dispatcher.dispatch_batch(batch)
    dispatcher.flush()
    ends = {key: queue.max_commitlog_end for key, queue in queues.queues.items()}
    queues.close()
    index.close()
    return ends


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32), count=st.integers(1, 160), batch_size=st.integers(1, 70))
def test_batch_dispatch_writes_the_bytes_of_one_record_at_a_time(
    tmp_path: Path, seed: int, count: int, batch_size: int
) -> None:
    """Tiny geometry (7 units a queue file, 11 slots, 40 entries an index file): batches
    cross queue files, roll index files over mid-batch and chain colliding slots."""
    records = make_records(random.Random(seed), count, 4096)
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    try:
        ends = dispatch_into(root / "one", records, None)
        assert dispatch_into(root / "many", records, batch_size) == ends
        assert tree_bytes(root / "many") == tree_bytes(root / "one")
    finally:
        shutil.rmtree(root)


def test_a_batch_of_records_without_units_dispatches_their_keys_only(tmp_path: Path) -> None:
    """PREPARED and ROLLBACK records only (no consume queue unit, index keys still): as
    one batch, dispatched as arrays, the bytes of one record at a time (the queue grouping
    once failed on a batch with no unit at all)."""
    records = [r for r in make_records(random.Random(7), 200, 1 << 20) if r.sys_flag in (0x4, 0xC)][:20]
    assert len(records) == 20
    ends = dispatch_into(tmp_path / "one", records, None)
    assert dispatch_into(tmp_path / "many", records, len(records)) == ends == {}
    assert tree_bytes(tmp_path / "many") == tree_bytes(tmp_path / "one")


@pytest.mark.parametrize("grouping", ["compiled", "python", "arrays"])
def test_each_queues_units_written_as_one_block_are_the_bytes_of_one_record_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, grouping: str
) -> None:
    """Batches whose every record has a unit (COMMIT and NOT only, as a writer's): each
    queue's share is grouped into one block of bytes (compiled, or the Python definition)
    and written at the queue's end, crossing its 7-unit files; the bytes, and each queue's
    maxPhysicOffset, are those of dispatching one record at a time, and of the array path
    the grouping stands in for."""
    from rmqstore.common.codec import consumequeue as cq_codec

    if grouping == "python":
        monkeypatch.setattr(cq_codec, "_speedups", None)
    if grouping == "arrays":
        monkeypatch.setattr(Dispatcher, "_append_queue_blocks", lambda self, batch: False)
    blocks: list[object] = []
    grouped = cq_codec.queue_unit_blocks
    monkeypatch.setattr(cq_codec, "queue_unit_blocks", lambda *columns: blocks.append(grouped(*columns)) or blocks[-1])
    records = [r for r in make_records(random.Random(11), 400, 4096) if r.sys_flag in (0, 0x8)]
    taken: dict[tuple[str, int], int] = {}
    for record in records:  # renumbered: the kept records of each queue run consecutively
        record.queue_offset = taken.get((record.topic, record.queue_id), 0)
        taken[(record.topic, record.queue_id)] = record.queue_offset + 1
    ends = dispatch_into(tmp_path / "one", records, None)
    assert dispatch_into(tmp_path / "many", records, 50) == ends
    assert tree_bytes(tmp_path / "many") == tree_bytes(tmp_path / "one")
    if grouping != "arrays":  # every batch dispatched as arrays was grouped: none handed back
        batches = [records[s : s + 50] for s in range(0, len(records), 50)]
        assert len(blocks) == sum(len(batch) >= SMALL_BATCH_RECORDS for batch in batches) >= 5
        assert None not in blocks


def test_redispatching_a_batch_changes_nothing(tmp_path: Path) -> None:
    records = make_records(random.Random(7), 300, 4096)
    dispatch_into(tmp_path / "once", records, 64)
    queues = ConsumeQueueSet(str(tmp_path / "once" / "consumequeue"), 7, writable=True)
    queues.open_all()
    index = IndexFileList(str(tmp_path / "once" / "index"), 11, 40, writable=True)
    before = tree_bytes(tmp_path / "once")
    again = DispatchBatch()
    for record in records[150:]:
        again.add_record(record)
    Dispatcher(queues, index).dispatch_batch(again)
    queues.close()
    index.close()
    assert tree_bytes(tmp_path / "once") == before


def test_slots_a_killed_batch_left_ahead_are_repaired(tmp_path: Path) -> None:
    """A kill after put_keys wrote a batch's entries and slots but before the count: on
    start, repair_slots points those slots back into the committed chain, and putting
    the same keys again gives the file an uninterrupted run writes."""
    rng = random.Random(3)
    hashes = np.array([rng.randrange(2**31) for _ in range(60)], dtype=np.int64)
    offsets = np.arange(60, dtype=np.int64) * 100
    times = 1_700_000_000_000 + np.arange(60, dtype=np.int64) * 10

    def fresh(name: str) -> IndexFile:
        return IndexFile.create(str(tmp_path / name), 13, 100, prev_end_phy_offset=0, prev_end_timestamp_ms=0)

    straight = fresh("straight")
    straight.put_keys(hashes, offsets, times)
    straight.flush()
    expected = Path(straight.path).read_bytes()
    straight.close()

    killed = fresh("killed")
    killed.put_keys(hashes[:25], offsets[:25], times[:25])
    header = Path(killed.path).read_bytes()[:40]
    killed.put_keys(hashes[25:], offsets[25:], times[25:])
    killed.mapped.write(0, header)  # the batch's header writes never happened
    killed.close()

    reopened = IndexFile.open(str(tmp_path / "killed"), 13, 100, writable=True)
    assert reopened.index_count == 26
    assert reopened.repair_slots() > 0
    assert reopened.repair_slots() == 0
    reopened.put_keys(hashes[25:], offsets[25:], times[25:])
    reopened.flush()
    assert Path(reopened.path).read_bytes() == expected
    reopened.close()


# The commit log


def test_layout_and_write_equal_appending_one_record_at_a_time(tmp_path: Path) -> None:
    rng = random.Random(11)
    records = [bytearray(rng.randbytes(rng.randint(100, 900))) for _ in range(400)]
    for data in records:
        data[0:4] = len(data).to_bytes(4, "big")
    one = CommitLog(str(tmp_path / "one"), 8192, writable=True)
    one.set_write_position(0)
    appended = [one.append([bytearray(data)], [0])[0] for data in records]
    many = CommitLog(str(tmp_path / "many"), 8192, writable=True)
    many.set_write_position(0)
    laid_out: list[int] = []
    for start in range(0, len(records), 37):
        chunk = records[start : start + 37]
        offsets = many.layout([len(d) for d in chunk])
        patched = []
        for data, offset in zip(chunk, offsets):
            copy = bytearray(data)
            copy[20:28] = (0).to_bytes(8, "big")  # QUEUEOFFSET, as append([...], [0]) sets it
            copy[28:36] = offset.to_bytes(8, "big")  # PHYSICALOFFSET
            patched.append(bytes(copy))
        many.write_laid_out(offsets, [len(record) for record in patched], b"".join(patched))
        laid_out.extend(offsets)
    assert laid_out == appended
    one.flush()
    many.flush()
    assert tree_bytes(tmp_path / "many") == tree_bytes(tmp_path / "one")
    one.close()
    many.close()


def test_layout_refuses_a_record_larger_than_a_file(tmp_path: Path) -> None:
    log = CommitLog(str(tmp_path / "log"), 4096, writable=True)
    log.set_write_position(0)
    with pytest.raises(InvalidArgument, match="cannot fit in a commit log file of 4096 bytes"):
        log.layout([100, 4089])
    log.close()


# Validation

LIMITS = Limits(max_body_bytes=64, max_keys=3, max_key_length=8, max_batch_messages=100)
MESSAGES = st.builds(
    MessageInput,
    topic=st.sampled_from(["TopicA", "bad topic", "SCHEDULE_TOPIC_XXXX", "", "T" * 200]),
    body=st.binary(max_size=80),
    keys=st.lists(st.sampled_from(["k", "", "a b", "x\x01", "long-key-9", "中"]), max_size=4),
    tags=st.sampled_from(["", "TagA", "t\x02", "标签"]),
    properties=st.dictionaries(st.sampled_from(["a", "KEYS", ""]), st.sampled_from(["v", ""]), max_size=2),
    queue_id=st.one_of(st.none(), st.integers(-2, 3)),
    uniq_key=st.sampled_from(["", "0A1B", "bad-key", "é", "F" * 129]),
    flag=st.just(0),
    born_timestamp_ms=st.just(0),
    born_host=st.none(),
)


def test_a_message_batch_holds_its_messages_column_by_column() -> None:
    host = SocketAddress.parse("10.1.2.3:4")
    messages = [
        MessageInput("TopicA", b"a", ["k"], "TagA", {"p": "v"}, 2, "U1", 1, 5, host),
        MessageInput("TopicB"),
    ]
    batch = MessageBatch.of(messages)
    assert batch.message_count == 2
    assert [batch.message(0), batch.message(1)] == messages
    assert (batch.topics, batch.queue_ids, batch.born_hosts, batch.born_timestamps_ms) == (
        ["TopicA", "TopicB"], [2, None], [host, None], [5, 0]
    )
    assert MessageBatch.of([]).message_count == 0


@settings(max_examples=400)
@given(st.lists(MESSAGES, min_size=1, max_size=6))
def test_batch_validation_raises_what_checking_each_message_raises(messages: list[MessageInput]) -> None:
    expected = None
    for position, message in enumerate(messages, start=1):
        try:
            validate_message(message, LIMITS, position if len(messages) > 1 else 0)
        except InvalidArgument as error:
            expected = str(error)
            break
    if expected is None:
        validate_batch(messages, LIMITS)
    else:
        with pytest.raises(InvalidArgument) as raised:
            validate_batch(messages, LIMITS)
        assert str(raised.value) == expected


# The writer


@pytest.mark.parametrize("encoder", ["compiled", "python"])
@pytest.mark.parametrize("write_through_bytes", [1, mapped_module.WRITE_THROUGH_FILE_BYTES], ids=["pwrite", "mapping"])
def test_writer_batches_write_what_records_one_by_one_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write_through_bytes: int, encoder: str
) -> None:
    """Every record the batch path wrote re-encodes (one record at a time) to its own
    bytes, and reindexing its commit log gives its consume queues and index; written
    through the file (large writes) or through the mapping, with IPv4 born hosts only
    (one head struct) or mixed with IPv6, by the compiled batch encoder or the Python
    definitions."""
    from rmqstore.common.codec import dispatch as dispatch_module
    from rmqstore.common.files.store import reindex
    from rmqstore.writer import store as writer_store

    if encoder == "python":
        monkeypatch.setattr(writer_store, "encode_records", record_module.python_encode_records)
        monkeypatch.setattr(props, "_speedups", None)
        monkeypatch.setattr(dispatch_module, "_speedups", None)
    monkeypatch.setattr(mapped_module, "WRITE_THROUGH_FILE_BYTES", write_through_bytes)
    sizes = StoreSizes(commitlog_file_size_bytes=16384, cq_file_units=50, index_slots=17, index_entries=200)
    writer = Writer(WriterConfig(store=str(tmp_path / "store"), sizes=sizes))
    rng = random.Random(5)
    for round_number in range(12):
        v6_share = 0.3 if round_number % 2 else 0.0
        plain = round_number % 3 == 0  # KEYS, TAGS and UNIQ_KEY only: the common properties
        batch = [
            MessageInput(
                topic=rng.choice(["TopicA", "TopicB"]),
                body=rng.randbytes(rng.randint(0, 300)),
                keys=[f"k{rng.randrange(9)}" for _ in range(rng.randint(1 if plain else 0, 2))],
                tags="TagB" if plain else rng.choice(["", "TagA"]),
                properties={"seq": str(round_number)} if rng.random() < 0.3 and not plain else {},
                born_host=SocketAddress.parse("[2001:db8::1]:9") if rng.random() < v6_share else None,
                queue_id=rng.choice([None, 0, 1]),
            )
            for _ in range(rng.randint(1, 60))
        ]
        writer.append(batch)
    writer.close()
    log = CommitLog(str(tmp_path / "store" / "commitlog"), sizes.commitlog_file_size_bytes)
    records = list(log.records())
    assert len(records) > 250 and len(log.files.files) > 3
    for record in records:
        mapped = log.files.find(record.commitlog_offset)
        position = record.commitlog_offset - mapped.start_offset
        assert encode_record(record) == bytes(mapped.buf[position : position + record.size])
    log.close()
    reindex(str(tmp_path / "store"), str(tmp_path / "again"), sizes)
    store = tree_bytes(tmp_path / "store")
    again = tree_bytes(tmp_path / "again")
    for part in ("consumequeue", "index"):
        assert {k: v for k, v in again.items() if k.startswith(part)} == {
            k: v for k, v in store.items() if k.startswith(part)
        }


def test_a_write_through_the_file_is_what_the_mappings_read_before_any_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large write goes through pwrite: the writer's own mapping and a reader's
    separate read-only mapping of the file see its bytes at once, unflushed."""
    import os

    from rmqstore.common.files.mapped import MappedFile

    pwrites = []
    real_pwrite = os.pwrite

    def counted(fd: int, data: bytes, position: int) -> int:
        pwrites.append((position, len(data)))
        return real_pwrite(fd, data, position)

    path = str(tmp_path / "00000000000000000000")
    written = MappedFile.create(path, 1 << 20, 0)
    reader = MappedFile(path, 1 << 20, 0, writable=False)
    data = random.Random(3).randbytes(mapped_module.WRITE_THROUGH_FILE_BYTES + 4097)
    monkeypatch.setattr(os, "pwrite", counted)
    written.write(5000, data)
    small = b"through the mapping"
    written.write(3000, small)
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    try:
        assert pwrites == [(5000, len(data))]  # the large write went through the file, the small one not
        for mapping in (written, reader):
            assert bytes(mapping.buf[5000 : 5000 + len(data)]) == data
            assert bytes(mapping.buf[3000 : 3000 + len(small)]) == small
            assert mapping.last_nonzero_position() == 5000 + len(data.rstrip(b"\x00"))
    finally:
        reader.close()
        written.close()
    with open(path, "rb") as handle:
        handle.seek(5000)
        assert handle.read(len(data)) == data


# Finding the end of written data


def test_end_of_data_skips_holes_and_sees_unflushed_writes(tmp_path: Path) -> None:
    """last_nonzero_position bounds its search by the file's trailing hole; bytes written
    through the mapping and never flushed, and data after a hole, still count."""
    from rmqstore.common.files.mapped import MappedFile

    size = 8 << 20
    mapped = MappedFile.create(str(tmp_path / "f"), size, 0)
    assert mapped.last_nonzero_position() == 0
    mapped.write(100, b"\x01\x02")
    assert mapped.last_nonzero_position() == 102  # not flushed: still found
    mapped.write(5 << 20, b"\x07")  # beyond a hole of several MiB
    assert mapped.last_nonzero_position() == (5 << 20) + 1
    assert mapped.last_nonzero_position((5 << 20) + 1) == (5 << 20) + 1
    mapped.write(size - 1, b"\x09")
    assert mapped.last_nonzero_position() == size
    mapped.write(size - 1, b"\x00")  # a written zero is not data
    assert mapped.last_nonzero_position() == (5 << 20) + 1
    mapped.close()


@pytest.mark.parametrize("decoder", ["compiled", "python"])
def test_plans_from_bulk_decoded_records_equal_plans_from_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decoder: str
) -> None:
    """DispatchBatch.of_columns over codec.columnar's decoding gives the plans add_record
    gives, on generated records (ROLLBACK, PREPARED, delayed, repeated and empty keys) and
    on Apache's store; with the compiled walk, CRCs, texts and key hashes, and with the
    Python definitions."""
    from conftest import CLEAN, FIXTURE_SIZES

    from rmqstore.common.codec import columnar
    from rmqstore.common.codec import dispatch as dispatch_module

    if decoder == "python":
        monkeypatch.setattr(columnar, "_speedups", None)
        monkeypatch.setattr(dispatch_module, "_speedups", None)

    def plans_both_ways(log: CommitLog) -> tuple[DispatchBatch, DispatchBatch]:
        by_record = DispatchBatch()
        for record in log.records():
            by_record.add_record(record)
        by_columns = DispatchBatch(key_hashes=np.zeros(0, np.int64))
        for mapped in log.files:
            found = columnar.walk(mapped.buf, 0, stop=mapped.file_size_bytes, rows_max=10**6, bytes_max=2**40)
            if len(found.starts):
                part = DispatchBatch.of_columns(columnar.decode(mapped.buf, found.starts, base_offset=mapped.start_offset))
                for field in DispatchBatch.__slots__[1:-1]:
                    getattr(by_columns, field).extend(getattr(part, field))
                hashes = part.key_hashes
                if hashes is None:  # non-ASCII keys: the strings, hashed here
                    hashes = np.array([index_key_hash(k) for r in range(len(part)) for k in part.index_keys_of(r, sum(part.key_counts[:r]))], np.int64)
                    by_columns.keys.clear()
                by_columns.key_hashes = np.concatenate((by_columns.key_hashes, hashes))
        # The plans from records, with their keys as the index hashes them.
        by_record.key_hashes = np.array(
            [index_key_hash(k) for r in range(len(by_record)) for k in by_record.index_keys_of(r, sum(by_record.key_counts[:r]))],
            np.int64,
        )
        by_record.keys = []
        return by_record, by_columns

    def written(name: str, records: list[Record]) -> CommitLog:
        log = CommitLog(str(tmp_path / name), 8192, writable=True)
        log.set_write_position(0)
        for record in records:
            [offset] = log.append([bytearray(encode_record(record))], [record.queue_offset])
            assert offset == record.commitlog_offset
        return log

    log = written("mixed", make_records(random.Random(21), 400, 8192))
    plain = written("ascii", make_records(random.Random(22), 400, 8192, ascii_only=True))
    spans_used = [
        DispatchBatch.of_columns(columnar.decode(m.buf, found.starts, base_offset=m.start_offset)).key_hashes is not None
        for m in plain.files
        if (found := columnar.walk(m.buf, 0, stop=m.file_size_bytes, rows_max=10**6, bytes_max=2**40)).starts.size
    ]
    assert all(spans_used) and len(spans_used) > 5  # ASCII keys: hashed on their bytes
    apache = CommitLog(str(CLEAN / "commitlog"), FIXTURE_SIZES.commitlog_file_size_bytes)
    for plans, count in ((plans_both_ways(log), 400), (plans_both_ways(plain), 400), (plans_both_ways(apache), 2007)):
        one, other = plans
        assert len(one) == count and len(one.key_hashes) > count
        assert one.key_hashes.tolist() == other.key_hashes.tolist()
        one.key_hashes = other.key_hashes = None
        assert one == other
    for opened in (log, plain, apache):
        opened.close()


# A store of 8 MiB commit log files, for the query views' memory tests.
SMALL_FILE_SIZES = StoreSizes(commitlog_file_size_bytes=8 << 20, cq_file_units=100_000, index_slots=1000, index_entries=50_000)


def _thousand_records(root: Path, body: bytes) -> list[AppendResult]:
    """1,000 messages of ``body`` with the key "k" in TopicA's queue 0, written in batches
    of 100 to a new store at ``root``; their acks."""
    writer = Writer(WriterConfig(store=str(root), sizes=SMALL_FILE_SIZES))
    try:
        return [ack for _ in range(10) for ack in writer.append([MessageInput("TopicA", body, ["k"], queue_id=0)] * 100)]
    finally:
        writer.close()



def test_key_pages_across_the_index_walks_chunks_give_each_match_once(tmp_path: Path) -> None:
    """A key on 700 records, more than the index walk's first chunk (40) and its next
    (256), some of them holding it twice ("k k": two index entries, one match), among
    records of other keys and another topic: pages of 7, 32 and 1,000, followed by their
    cursors, give every match once, newest first, against the acks; and a time window
    gives the acks stored within it."""
    from rmqstore.query.view import StoreView

    writer = Writer(WriterConfig(store=str(tmp_path / "store"), sizes=SMALL_FILE_SIZES))
    acks: list[tuple[AppendResult, bool]] = []
    try:
        for _batch in range(14):
            messages = [
                MessageInput("TopicA", b"body", ["k", "k"] if i % 5 == 0 else ["k"] if i % 3 else ["other"], queue_id=0)
                for i in range(75)
            ]
            messages.append(MessageInput("TopicB", b"body", ["k"], queue_id=0))
            results = writer.append(messages)
            acks += [(ack, message.topic == "TopicA" and "k" in message.keys) for ack, message in zip(results, messages)]
    finally:
        writer.close()
    expected = [ack.commitlog_offset for ack, keyed in reversed(acks) if keyed]
    assert len(expected) > 40 + 256 + 256
    view = StoreView(str(tmp_path / "store"), SMALL_FILE_SIZES)
    for page_size in (7, 32, 1000):
        found: list[int] = []
        cursor = ""
        while True:
            page = view.by_key("TopicA", "k", page_size=page_size, cursor=cursor)
            found += [record.commitlog_offset for record in page.records]
            assert len(page.records) == page_size or page.complete
            if page.complete:
                break
            cursor = page.cursor
        assert found == expected, page_size
    times = sorted({ack.store_timestamp_ms for ack, keyed in acks if keyed})
    begin, end = times[len(times) // 3], times[2 * len(times) // 3]
    within = view.by_key("TopicA", "k", begin_ms=begin, end_ms=end, page_size=1000)
    assert [record.commitlog_offset for record in within.records] == [
        ack.commitlog_offset for ack, keyed in reversed(acks) if keyed and begin <= ack.store_timestamp_ms <= end
    ]
    view.close()



def test_the_resident_gauge_reads_the_current_figure_each_time(tmp_path: Path) -> None:
    """The budget check's gauge keeps /proc/self/statm open and reads it with pread:
    each read is the process's shared resident memory at that moment (pages a mapping
    touches count, and stop counting when it is closed), and a process that is not the
    one that opened it opens its own."""
    import mmap
    import os

    from rmqstore.query.view import _ResidentGauge

    path = tmp_path / "data"
    path.write_bytes(b"\x01" * 16 * 2**20)  # 16 MiB in the page cache
    gauge = _ResidentGauge()
    before = gauge.read()
    assert before is not None and before > 0
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        assert sum(mapped[at] for at in range(0, len(mapped), mmap.PAGESIZE)) == len(mapped) // mmap.PAGESIZE
        touched = gauge.read()
        assert touched is not None and touched >= before + 15 * 2**20
    after = gauge.read()
    assert after is not None and after <= touched - 15 * 2**20
    opened = gauge._fd
    gauge._pid = -1  # as a forked child sees it
    assert gauge.read() is not None and gauge._pid == os.getpid()
    gauge.close()
    with pytest.raises(OSError):
        os.fstat(opened)  # type: ignore[arg-type]


def _rss_file_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("RssFile:"))


def test_a_query_view_leaves_no_mapped_pages_resident_after_a_trim(tmp_path: Path) -> None:
    """Pages a view touched (reading 4 MiB of records) leave the resident set at the
    periodic trim; the records still read back the same afterwards."""
    from rmqstore.query.view import StoreView

    sizes = SMALL_FILE_SIZES
    body = bytes(range(256)) * 16
    acks = _thousand_records(tmp_path / "store", body)
    view = StoreView(str(tmp_path / "store"), sizes)
    view.log.read_through_file = False  # read through the mappings, as without the extension
    before = _rss_file_kib()
    first = [view.read(ack.commitlog_offset).body for ack in acks]
    touched = _rss_file_kib()
    assert touched - before > 3000  # 1,000 records of 4 KiB were faulted in
    view._trim()
    assert touched - _rss_file_kib() > 3000
    assert [view.read(ack.commitlog_offset).body for ack in acks] == first == [body] * 1000
    view.close()


def test_matching_offsets_are_the_chain_filtered_by_hash() -> None:
    """On Apache's index files (500 slots: long, mixed chains) for every hash they hold."""
    from conftest import CLEAN, FIXTURE_SIZES

    index = IndexFileList(str(CLEAN / "index"), FIXTURE_SIZES.index_slots, FIXTURE_SIZES.index_entries)
    checked = 0
    for index_file in index.files:
        hashes = {index_file.entry(n).key_hash for n in range(1, index_file.index_count)}
        for key_hash in hashes | {0, 1, 499}:
            expected = [e.phy_offset for _, e in index_file.chain(key_hash) if e.key_hash == key_hash]
            assert list(index_file.matching_offsets(key_hash)) == expected
            checked += len(expected)
    assert checked > 4000
    index.close()


def test_append_results_are_columns_that_read_as_results(tmp_path: Path) -> None:
    from rmqstore.common.codec.msgid import offset_msg_id

    writer = Writer(WriterConfig(store=str(tmp_path / "store")))
    results = writer.append([MessageInput("TopicA", bytes([i]) * i, uniq_key=f"U{i}") for i in range(5)])
    writer.close()
    assert len(results) == 5 and results.size_bytes == sum(results.sizes)
    listed = list(results)
    assert listed == [results[i] for i in range(5)] == results[:] and results[-1] == listed[4]
    assert results[1:4] == listed[1:4]
    for i, result in enumerate(listed):
        assert result.uniq_key == f"U{i}" and result.topic == "TopicA"
        assert result.offset_msg_id == offset_msg_id(writer.store_host, result.commitlog_offset)
        assert result.commitlog_offset == sum(results.sizes[:i])
        assert result.store_timestamp_ms == results.store_timestamp_ms
    with pytest.raises(IndexError):
        results[5]


def test_a_query_view_reads_records_through_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records a view reads (4 MiB of them, each larger than the first pread) leave no
    page of the log resident, and read back what the mappings hold; a record larger than
    a read through the file takes, and bytes that are not a good record, are read
    through the mapping, which says what is wrong with them."""
    from rmqstore.common.files import commitlog as commitlog_module
    from rmqstore.query.view import StoreView

    sizes = SMALL_FILE_SIZES
    body = bytes(range(256)) * 16
    acks = _thousand_records(tmp_path / "store", body)
    view = StoreView(str(tmp_path / "store"), sizes)
    assert view.log.read_through_file
    view._trim()
    before = _rss_file_kib()
    records = [view.read(ack.commitlog_offset) for ack in acks]
    assert _rss_file_kib() - before < 400  # 4,000 KiB of records read
    view.log.read_through_file = False
    assert [view.read(ack.commitlog_offset) for ack in acks] == records
    assert [r.body for r in records] == [body] * 1000
    view.log.read_through_file = True
    monkeypatch.setattr(commitlog_module, "READ_THROUGH_FILE_RECORD_BYTES_MAX", 2000)
    assert view.read(acks[3].commitlog_offset) == records[3]
    view.close()
    # A body byte flipped on disk: the same CrcMismatch either way.
    with open(tmp_path / "store" / "commitlog" / f"{0:020d}", "r+b") as log_file:
        log_file.seek(acks[2].commitlog_offset + 200)
        log_file.write(b"\xff")
    errors = []
    for through_file in (True, False):
        view = StoreView(str(tmp_path / "store"), sizes)
        view.log.read_through_file = through_file
        with pytest.raises(CrcMismatch) as raised:
            view.read(acks[2].commitlog_offset)
        errors.append(str(raised.value))
        assert view.read(acks[1].commitlog_offset) == records[1]
        view.close()
    assert errors[0] == errors[1] and f"commit log offset {acks[2].commitlog_offset}" in errors[0]


def test_a_query_view_keeps_mapped_pages_within_its_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lookups that touch 4 MiB of records leave at most about the budget resident."""
    import rmqstore.query.view as view_module

    sizes = SMALL_FILE_SIZES
    body = bytes(range(256)) * 16
    _thousand_records(tmp_path / "store", body)
    monkeypatch.setattr(view_module, "MAPPED_RESIDENT_BUDGET_BYTES", 1 << 20)
    monkeypatch.setattr(view_module, "TRIM_CHECK_EVERY_LOOKUPS", 8)
    view = view_module.StoreView(str(tmp_path / "store"), sizes)
    view._trim()
    before = _rss_file_kib()
    bodies = [view.by_queue_offset("TopicA", 0, offset).body for offset in range(1000)]
    assert bodies == [body] * 1000
    assert _rss_file_kib() - before < 2500  # 4,000 KiB read; at most the budget and 8 lookups' pages stay
    view.close()


def test_store_time_from_the_header_equals_the_decoded_one() -> None:
    """On Apache's stores (IPv4 and IPv6 born hosts), and nothing where no record starts."""
    from conftest import CLEAN, CRASHED, FIXTURE_SIZES

    checked = 0
    for root in (CLEAN, CRASHED):
        log = CommitLog(str(root / "commitlog"), FIXTURE_SIZES.commitlog_file_size_bytes)
        for record in log.records(check_crc=False):
            assert log.store_timestamp(record.commitlog_offset) == record.store_timestamp_ms
            with pytest.raises(NotFound):
                log.store_timestamp(record.commitlog_offset + 1)
            checked += 1
        log.close()
    assert checked == 2007 + 795


def test_query_serve_refuses_a_budget_below_one_mb(tmp_path: Path) -> None:
    import subprocess
    import sys

    Writer(WriterConfig(store=str(tmp_path / "store"))).close()
    done = subprocess.run(
        [sys.executable, "-m", "rmqstore.cli.main", "query", "serve", "--store", str(tmp_path / "store"), "--mapped-budget-mb", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr == (
        "rmqstore: error: query serve: argument --mapped-budget-mb: 0 is outside [1, 2147483647] (a count of at least 1)"
        " (see rmqstore query serve --help)\n"
    )


def test_the_walk_for_rollback_keys_releases_the_log_as_it_goes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The header walk over new records drops the pages behind it in steps of the release
    size, not all at the end (its peak would be the whole new log): the released ranges
    are contiguous, cover what it walked, and each is about the step."""
    import rmqstore.query.view as view_module

    sizes = SMALL_FILE_SIZES
    _thousand_records(tmp_path / "store", bytes(4000))
    monkeypatch.setattr(view_module, "CATCH_UP_RELEASE_BYTES", 256 * 1024)
    view = view_module.StoreView(str(tmp_path / "store"), sizes)
    released: list[tuple[int, int]] = []
    release = view.log.release
    monkeypatch.setattr(view.log, "release", lambda start, stop: (released.append((start, stop)), release(start, stop)))
    assert len(view.by_key("TopicA", "k", page_size=5).records) == 5
    assert released[0][0] == 0 and released[-1][1] == view.visible_offset
    assert all(a[1] == b[0] for a, b in itertools.pairwise(released))
    assert len(released) >= 15 and max(stop - start for start, stop in released) < 256 * 1024 + 4200
    view.close()


def test_the_bulk_header_walk_gives_every_records_offset_and_sys_flag() -> None:
    from conftest import CLEAN, CRASHED, FIXTURE_SIZES, FIXTURES, read_jsonl

    from rmqstore.common.codec import sysflag
    from rmqstore.query.view import StoreView

    for root, dump in ((CLEAN, "store-clean-commitlog-dump.jsonl"), (CRASHED, "store-crashed-recovered-commitlog-dump.jsonl")):
        lines = read_jsonl(FIXTURES / dump)
        expected = [(line["commitLogOffset"], line["sysFlag"]) for line in lines]
        log = CommitLog(str(root / "commitlog"), FIXTURE_SIZES.commitlog_file_size_bytes)
        end = expected[-1][0] + 1
        offsets, flags, stopped = log.sys_flags(0, end)
        assert list(zip(offsets.tolist(), flags.tolist())) == expected
        assert stopped == lines[-1]["commitLogOffset"] + lines[-1]["size"]  # past the last record
        # From any record, the records that start before the stop; from inside a record, none.
        offsets, _, stopped = log.sys_flags(expected[100][0], expected[700][0] - 1)
        assert offsets.tolist() == [offset for offset, _ in expected[100:700]]
        assert stopped == expected[700][0]
        offsets, _, stopped = log.sys_flags(expected[100][0] + 1, expected[700][0])
        assert (offsets.tolist(), stopped) == ([], expected[100][0] + 1)
        log.close()
    rolled_back = [line for line in read_jsonl(FIXTURES / "manifest.jsonl") if line["tranType"] == "ROLLBACK"]
    assert len(rolled_back) == 6 and all(line["sysFlag"] & sysflag.TRANSACTION_MASK == sysflag.TRANSACTION_ROLLBACK for line in rolled_back)
    view = StoreView(str(CLEAN), FIXTURE_SIZES)
    for line in rolled_back:  # not in the index (docs/format.md §7.4): found through the walk
        found = view.by_uniq_key(line["storedTopic"], line["uniqKey"])
        assert [record.commitlog_offset for record in found] == [line["commitLogOffset"]]
        for key in line["keys"].split(" ") if line["keys"] else ():
            assert line["commitLogOffset"] in [r.commitlog_offset for r in view.by_key(line["storedTopic"], key, page_size=100).records]
    view.close()


def test_the_properties_screen_reads_one_shared_mapping_as_its_copies() -> None:
    """The batch screen's properties pass: a request's one shared mapping (counted in one
    C pass), equal copies, and a mix with messages without properties give the same
    size; a shared mapping that breaks a rule fails the screen however it is shared."""
    from rmqstore.common.message_rules import plain_properties_bytes

    context = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    size = len(props.encode_properties(context))
    assert plain_properties_bytes([context] * 1000) == size
    assert plain_properties_bytes([dict(context) for _ in range(1000)]) == size
    assert plain_properties_bytes([context, {}] * 500) == size
    assert plain_properties_bytes([{"a": "1"}, {"bb": "22"}]) == len(props.encode_properties({"bb": "22"}))
    assert plain_properties_bytes([{}] * 3) == 0
    bad = {"traceparent": "00-\x01"}
    assert plain_properties_bytes([bad] * 1000) is None
    assert plain_properties_bytes([context] * 999 + [bad]) is None


_PROPERTY_TEXT = st.text(alphabet=["a", "Z", "0", "é", "\x01", "\x02", " "], max_size=5)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.dictionaries(st.one_of(_PROPERTY_TEXT, st.sampled_from(["KEYS", "TAGS", "p"])), _PROPERTY_TEXT, max_size=4), min_size=1, max_size=6))
def test_the_property_columns_screen_passes_only_what_the_rules_pass(messages: list[dict[str, str]]) -> None:
    """Messages' properties as columns (send --file's): the screen passes them only when
    every message's pass validate_message, and its size is at least each one's encoded
    size."""
    from rmqstore.common.message_rules import plain_property_columns

    counts = [len(m) for m in messages]
    names = [name for m in messages for name in m]
    values = [value for m in messages for value in m.values()]
    size = plain_property_columns(counts, names, values)
    if size is None:
        return
    for properties in messages:
        validate_message(MessageInput("T", properties=properties), DEFAULT_LIMITS)
        assert len(props.encode_properties(properties)) <= size


@settings(max_examples=200, deadline=None)
@given(st.lists(st.dictionaries(st.one_of(_PROPERTY_TEXT, st.sampled_from(["KEYS", "p"])), _PROPERTY_TEXT, min_size=1, max_size=3), min_size=17, max_size=40))
def test_many_distinct_mappings_are_screened_as_the_rules_judge_each(messages: list[dict[str, str]]) -> None:
    """Past a few distinct mappings the screen reads them as columns: it passes them only
    when each passes the rules alone, at a size no smaller than each one's."""
    from rmqstore.common.message_rules import DISTINCT_SCREENED_ALONE_MAX, plain_properties_bytes

    assert len(messages) > DISTINCT_SCREENED_ALONE_MAX
    size = plain_properties_bytes(messages)
    alone = [plain_properties_bytes([m]) for m in messages]
    if None in alone:
        assert size is None
    else:
        assert size is not None and size >= max(a for a in alone if a is not None)
