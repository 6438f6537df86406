"""The writer node through its real gRPC API, on real files."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Collection, Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from support.columns import as_columns_of
from support.inprocess import WriterNode
from support.stores import SMALL

from rmqstore.common.codec.hosts import SocketAddress
from rmqstore.common.codec.msgid import UniqKey, decode_uniq_key, encode_uniq_key
from rmqstore.common.errors import InvalidArgument
from rmqstore.common.files.check import check_store
from rmqstore.common.files.commitlog import CommitLog
from rmqstore.v1 import messages_pb2, writer_pb2
from rmqstore.writer.config import FlushPolicy, WriterConfig
from rmqstore.writer.group_commit import GroupAppender
from rmqstore.writer.ids import UniqKeyGenerator
from rmqstore.writer.intake import batch_response, columns_batch, request_batch, to_batch
from rmqstore.writer.metrics import WriterMetrics
from rmqstore.writer.service import SERVICE_NAME
from rmqstore.writer.store import Writer
from rmqstore.writer.validate import MessageInput


@pytest.fixture
def node(tmp_path: Path) -> Iterator[WriterNode]:
    started = WriterNode(tmp_path / "store", flush=FlushPolicy.SYNC)
    yield started
    started.close()


def message(topic: str = "TopicA", **fields: object) -> messages_pb2.Message:
    return messages_pb2.Message(topic=topic, **fields)  # type: ignore[arg-type]


def dump(store: Path) -> list:
    log = CommitLog(str(store / "commitlog"), SMALL.commitlog_file_size_bytes)
    try:
        return list(log.records())
    finally:
        log.close()


def test_thousands_of_messages_read_back_exactly(node: WriterNode, tmp_path: Path) -> None:
    """IPv4/IPv6 born hosts, non-ASCII keys, empty bodies, several keys, and enough data
    to roll over commit log, consume queue and index files."""
    sent = []
    for n in range(3000):
        keys = [f"k-{n}", "order-common"] if n % 3 else [f"订单-{n % 7}", "emoji-\U0001F680", f"k-{n}"]
        msg = message(
            ["TopicA", "Pay_Events-2", "OrderTopic"][n % 3],
            body=b"" if n % 10 == 0 else hashlib.sha256(str(n).encode()).digest() * (n % 5),
            keys=keys,
            tags="TagA" if n % 2 else "标签-Ü",
            properties={"seq": str(n)},
            born_host="[2001:db8::5]:4000" if n % 4 == 0 else "192.0.2.9:5000",
            born_timestamp_ms=1_700_000_000_000 + n,
            flag=n % 3,
        )
        if n % 5 == 0:
            msg.queue_id = 2
        sent.append(msg)
    results = []
    for start in range(0, len(sent), 500):
        response = node.stub.SendBatch(writer_pb2.SendBatchRequest(messages=sent[start : start + 500]))
        results.extend(response.results)
    node.writer.flush_thoroughly()
    store = tmp_path / "store"
    records = dump(store)
    assert len(records) == len(results) == 3000
    assert len(os.listdir(store / "commitlog")) > 5
    assert max(len(os.listdir(store / "consumequeue" / "TopicA" / q)) for q in os.listdir(store / "consumequeue" / "TopicA")) > 1
    assert len(os.listdir(store / "index")) > 5
    for msg, result, record in zip(sent, results, records):
        assert record.commitlog_offset == result.commitlog_offset
        assert (record.topic, record.queue_id, record.queue_offset) == (result.topic, result.queue_id, result.queue_offset)
        assert record.body == msg.body
        assert record.keys == " ".join(msg.keys)
        assert record.tags == msg.tags
        assert record.uniq_key == result.uniq_key
        assert record.properties["seq"] == msg.properties["seq"]
        assert record.born_host == SocketAddress.parse(msg.born_host)
        assert record.born_timestamp_ms == msg.born_timestamp_ms
        assert record.flag == msg.flag
        assert record.store_timestamp_ms == result.store_timestamp_ms
        if msg.HasField("queue_id"):
            assert record.queue_id == 2
    assert {r.sys_flag for r in records} == {0, 0x10}
    report = check_store(str(store), SMALL)
    assert report.ok, report.problems[:3]
    assert report.records == 3000 and report.index_keys == sum(len(m.keys) + 1 for m in sent)


@pytest.mark.parametrize("ip", [bytes([10, 0, 0, 7]), bytes(range(16))], ids=["ipv4", "ipv6"])
def test_a_batch_of_generated_uniq_keys_is_the_keys_made_one_at_a_time(ip: bytes) -> None:
    """The writer makes a batch's uniq keys at once: each is the MessageClientIDSetter
    layout of its own counter, which wraps at 16 bits, and the generator's counter moves
    on past the batch."""
    generator = UniqKeyGenerator()
    now_ms = 1_767_225_600_123
    first = generator.next(ip, now_ms)  # counter 0
    generator.next_many(ip, now_ms, 0xFFEF)  # counters 1 to 0xFFEF: the next batch wraps
    made = generator.next_many(ip, now_ms, 40)
    expected = [
        encode_uniq_key(UniqKey(ip, generator.pid, generator.loader_hash, decode_uniq_key(first).time_since_month_ms, counter & 0xFFFF))
        for counter in range(0xFFF0, 0xFFF0 + 40)
    ]
    assert made == expected
    assert decode_uniq_key(generator.next(ip, now_ms)).counter == (0xFFF0 + 40) & 0xFFFF


def test_acks_and_offsets(node: WriterNode) -> None:
    first = node.stub.Send(writer_pb2.SendRequest(message=message(keys=["a"], body=b"x"))).result
    second = node.stub.Send(writer_pb2.SendRequest(message=message(keys=["a"], body=b"y", uniq_key="ABC123"))).result
    assert first.commitlog_offset == 0 and second.commitlog_offset == first.size
    assert second.uniq_key == "ABC123"
    assert len(first.uniq_key) == 32 and first.uniq_key.startswith("7F000001")
    assert first.offset_msg_id == "7F00000100002A9F" + f"{0:016X}"
    assert (first.queue_id, second.queue_id) == (0, 1)  # round robin over the 4 auto-created queues
    assert first.store_timestamp_ms <= second.store_timestamp_ms


def test_stream_acks_each_batch_in_order(node: WriterNode) -> None:
    batches = [writer_pb2.SendBatchRequest(messages=[message(body=bytes([i, j])) for j in range(3)]) for i in range(20)]
    responses = list(node.stub.SendStream(iter(batches)))
    assert [len(r.results) for r in responses] == [3] * 20
    offsets = [result.commitlog_offset for r in responses for result in r.results]
    assert offsets == sorted(offsets) and len(set(offsets)) == 60


def test_send_batch_send_stream_and_send_store_each_message_as_sent(node: WriterNode) -> None:
    batch = writer_pb2.SendBatchRequest(messages=[message(keys=["k1", "k2"], body=b"one", tags="t"), message(body=b"two")])
    acked = list(node.stub.SendBatch(batch).results) + [r for response in node.stub.SendStream(iter([batch])) for r in response.results]
    acked.append(node.stub.Send(writer_pb2.SendRequest(message=message(body=b"three"))).result)
    stored = [node.writer.log.read(result.commitlog_offset) for result in acked]
    assert [record.body for record in stored] == [b"one", b"two", b"one", b"two", b"three"]
    assert [record.keys for record in stored] == ["k1 k2", None, "k1 k2", None, None]
    assert [record.tags for record in stored] == ["t", None, "t", None, None]


def test_compact_acks_carry_what_send_results_carry(node: WriterNode) -> None:
    """The same batch acked as SendResults and as columns: every fact agrees."""
    def batch(compact: bool) -> writer_pb2.SendBatchRequest:
        sent = [message(keys=[f"k{i}"], body=bytes([i]) * i, uniq_key=f"ABC{i}" if i % 2 else "") for i in range(7)]
        return writer_pb2.SendBatchRequest(messages=sent, compact_results=compact)

    full = node.stub.SendBatch(batch(False))
    [compact, again] = list(node.stub.SendStream(iter([batch(True), batch(False)])))
    assert not compact.results and len(again.results) == 7 and not full.HasField("compact")
    columns = compact.compact
    assert len(columns.uniq_keys) == 7
    size = sum(r.size for r in full.results)
    for i, (a, b) in enumerate(zip(full.results, again.results)):
        offset = columns.commitlog_offsets[i]
        assert offset == a.commitlog_offset + size == b.commitlog_offset - size
        assert columns.offset_msg_id_prefix + f"{offset:016X}" == "7F00000100002A9F" + f"{offset:016X}"
        stored = node.writer.log.read(offset)
        assert (columns.queue_ids[i], columns.queue_offsets[i]) == (stored.queue_id, stored.queue_offset)
        assert (columns.sizes[i], columns.uniq_keys[i]) == (stored.size, stored.uniq_key) == (a.size, columns.uniq_keys[i])
        assert (columns.uniq_keys[i] == a.uniq_key) == bool(i % 2)
        assert columns.store_timestamp_ms == stored.store_timestamp_ms


def test_topics_status_and_flush(node: WriterNode, tmp_path: Path) -> None:
    created = node.stub.CreateTopic(writer_pb2.CreateTopicRequest(name="Orders", queue_count=16))
    assert (created.created, created.topic.queue_count) == (True, 16)
    again = node.stub.CreateTopic(writer_pb2.CreateTopicRequest(name="Orders", queue_count=8))
    assert (again.created, again.topic.queue_count) == (False, 16)
    default = node.stub.CreateTopic(writer_pb2.CreateTopicRequest(name="Defaults"))
    assert default.topic.queue_count == 8
    node.stub.Send(writer_pb2.SendRequest(message=message("Orders", queue_id=15, body=b"z")))
    topics = {t.name: t.queue_count for t in node.stub.ListTopics(writer_pb2.ListTopicsRequest()).topics}
    assert topics == {"Orders": 16, "Defaults": 8}
    flushed = node.stub.Flush(writer_pb2.FlushRequest()).flushed_offset
    status = node.stub.Status(writer_pb2.StatusRequest())
    assert status.commitlog_max_offset == status.dispatched_offset == status.flushed_offset == flushed > 0
    assert [(q.topic, q.queue_id, q.min_offset, q.max_offset) for q in status.queues] == [("Orders", 15, 0, 1)]
    assert status.flush_policy == "sync" and 0 < status.disk_used_ratio < 1
    assert status.store == str((tmp_path / "store").resolve())


def test_health_and_reflection(node: WriterNode) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    health = health_pb2_grpc.HealthStub(node.channel)
    assert health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME)).status == health_pb2.HealthCheckResponse.SERVING
    reflect = reflection_pb2_grpc.ServerReflectionStub(node.channel)
    answers = list(reflect.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
    names = {s.name for s in answers[0].list_services_response.service}
    assert SERVICE_NAME in names and "grpc.health.v1.Health" in names


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


BAD_INPUTS = {
    "invalid topic characters": (message("../../etc", body=b"x"), grpc.StatusCode.INVALID_ARGUMENT, "outside [%|a-zA-Z0-9_-]"),
    "blank topic": (message("", body=b"x"), grpc.StatusCode.INVALID_ARGUMENT, "blank"),
    "topic too long": (message("t" * 128), grpc.StatusCode.INVALID_ARGUMENT, "at most 127"),
    "system topic": (message("SCHEDULE_TOPIC_XXXX"), grpc.StatusCode.INVALID_ARGUMENT, "system topic"),
    "body too large": (message(body=bytes(4 * 1024 * 1024 + 1)), grpc.StatusCode.INVALID_ARGUMENT, "body is 4194305 bytes"),
    "properties too large": (message(properties={"big": "v" * 33000}), grpc.StatusCode.INVALID_ARGUMENT, "at most 32767"),
    "too many keys": (message(keys=[f"k{i}" for i in range(33)]), grpc.StatusCode.INVALID_ARGUMENT, "33 keys"),
    "key too long": (message(keys=["k" * 256]), grpc.StatusCode.INVALID_ARGUMENT, "256 characters"),
    "key with a space": (message(keys=["a b"]), grpc.StatusCode.INVALID_ARGUMENT, "contains a space"),
    "empty key": (message(keys=[""]), grpc.StatusCode.INVALID_ARGUMENT, "a key is empty"),
    "separator in a key": (message(keys=["a\x01b"]), grpc.StatusCode.INVALID_ARGUMENT, "0x01 or 0x02"),
    "reserved property": (message(properties={"UNIQ_KEY": "x"}), grpc.StatusCode.INVALID_ARGUMENT, "reserved"),
    "empty property value": (message(properties={"p": ""}), grpc.StatusCode.INVALID_ARGUMENT, "empty value"),
    "queue id out of range": (message("Known", queue_id=3), grpc.StatusCode.INVALID_ARGUMENT, "Known has 3 queues"),
    "negative queue id": (message("Known", queue_id=-1), grpc.StatusCode.INVALID_ARGUMENT, "negative"),
    "bad born host": (message(born_host="nowhere"), grpc.StatusCode.INVALID_ARGUMENT, "born_host"),
    "bad uniq key": (message(uniq_key="no spaces allowed"), grpc.StatusCode.INVALID_ARGUMENT, "uniq key"),
    "unknown topic without auto-create": (message("Unknown"), grpc.StatusCode.NOT_FOUND, "does not exist"),
}


@pytest.fixture
def strict_node(tmp_path: Path) -> Iterator[tuple[WriterNode, Path]]:
    """A writer whose store changes only by the requests its tests send: the consumer
    groups' progress (a new store's receipt-handle secret) is written once here, and the
    periodic write of it, which would rewrite the state file beside a test's snapshots of
    the store, does not come within the test (an hour's interval)."""
    store = tmp_path / "strict"
    started = WriterNode(store, auto_create_topics=False, consumer_flush_interval_ms=3_600_000)
    started.node.groups.flush()
    started.writer.topics.create("Known", 3)
    started.stub.Send(writer_pb2.SendRequest(message=message("Known", body=b"seed")))
    started.writer.flush_thoroughly()
    yield started, store
    started.close()


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_refused_and_writes_nothing(strict_node: tuple[WriterNode, Path], case: str) -> None:
    node, store = strict_node
    bad, code, text = BAD_INPUTS[case]
    before = snapshot(store)
    with pytest.raises(grpc.RpcError) as caught:
        node.stub.Send(writer_pb2.SendRequest(message=bad))
    assert caught.value.code() == code
    assert text in caught.value.details()
    # In a batch, the good message before the bad one is not written either.
    with pytest.raises(grpc.RpcError) as caught_batch:
        node.stub.SendBatch(writer_pb2.SendBatchRequest(messages=[message("Known", body=b"ok"), bad]))
    assert caught_batch.value.code() == code
    assert caught_batch.value.details() == "message 2: " + caught.value.details()
    assert snapshot(store) == before


def test_empty_batch_and_missing_message(strict_node: tuple[WriterNode, Path]) -> None:
    node, store = strict_node
    before = snapshot(store)
    with pytest.raises(grpc.RpcError) as caught:
        node.stub.SendBatch(writer_pb2.SendBatchRequest())
    assert (caught.value.code(), caught.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "the batch is empty")
    with pytest.raises(grpc.RpcError) as caught:
        node.stub.Send(writer_pb2.SendRequest())
    assert (caught.value.code(), caught.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "the request has no message")
    assert dict(caught.value.trailing_metadata())["rmqstore-reason"] == "InvalidArgument"
    assert snapshot(store) == before


def test_disk_full_ratio_refuses_writes(tmp_path: Path) -> None:
    node = WriterNode(tmp_path / "store", disk_full_ratio=0.0)
    try:
        with pytest.raises(grpc.RpcError) as caught:
            node.stub.Send(writer_pb2.SendRequest(message=message(body=b"x")))
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "above the full ratio 0%" in caught.value.details()
        assert not os.path.exists(tmp_path / "store" / "commitlog" / "00000000000000000000")
    finally:
        node.close()


def test_open_streams_hold_no_thread(tmp_path: Path) -> None:
    """Three times as many producers as the server has threads each keep a SendStream
    open: every batch is acked, and other calls are answered meanwhile (a thread-pool
    server gives each open stream a thread until it ends, and stops answering)."""
    node = WriterNode(tmp_path / "store", flush=FlushPolicy.SYNC)
    producers = 96
    inputs: list[queue.Queue[writer_pb2.SendBatchRequest | None]] = [queue.Queue() for _ in range(producers)]
    streams = [node.stub.SendStream(iter(q.get, None), timeout=60) for q in inputs]
    try:
        for rounds in range(2):
            for p, q in enumerate(inputs):
                q.put(writer_pb2.SendBatchRequest(messages=[message("Streams", body=f"{p}-{rounds}".encode())]))
            acks = [next(stream).results[0] for stream in streams]
            status = node.stub.Status(writer_pb2.StatusRequest(), timeout=5)
            assert status.commitlog_max_offset == max(a.commitlog_offset + a.size for a in acks)
            assert status.flushed_offset == status.commitlog_max_offset  # SYNC: acked means fsynced
        for q in inputs:
            q.put(None)
        assert all(list(stream) == [] for stream in streams)
    finally:
        node.close()
    records = dump(tmp_path / "store")
    assert sorted(r.body for r in records) == sorted(f"{p}-{r}".encode() for p in range(producers) for r in range(2))
    assert [r.queue_offset for r in records if r.queue_id == 0] == list(range(sum(r.queue_id == 0 for r in records)))


def test_concurrent_producers_get_contiguous_offsets(tmp_path: Path) -> None:
    node = WriterNode(tmp_path / "store", flush=FlushPolicy.SYNC)
    acks: list[messages_pb2.SendResult] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def produce(worker: int) -> None:
        try:
            for n in range(60):
                msg = message("Shared", body=f"{worker}-{n}".encode(), keys=[f"w{worker}-{n}"])
                if n % 2:
                    msg.queue_id = worker % 4
                result = node.stub.Send(writer_pb2.SendRequest(message=msg), timeout=60).result
                with lock:
                    acks.append(result)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=produce, args=(w,)) for w in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    try:
        assert not errors and len(acks) == 16 * 60
        by_queue: dict[int, list[int]] = {}
        for ack in acks:
            by_queue.setdefault(ack.queue_id, []).append(ack.queue_offset)
        for offsets in by_queue.values():
            assert sorted(offsets) == list(range(len(offsets)))
        assert len({a.commitlog_offset for a in acks}) == len(acks)
        node.writer.flush_thoroughly()
        assert check_store(str(tmp_path / "store"), SMALL).ok
    finally:
        node.close()


def test_second_writer_fails_fast_and_first_keeps_working(node: WriterNode, tmp_path: Path) -> None:
    store = tmp_path / "store"
    done = subprocess.run(
        [sys.executable, "-m", "rmqstore.cli.main", "writer", "serve", "--store", str(store), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert f"another writer holds {store / 'lock'}" in done.stderr
    assert done.stdout == ""
    result = node.stub.Send(writer_pb2.SendRequest(message=message(body=b"still here"))).result
    assert result.queue_offset == 0
    assert (store / "lock").read_bytes() == b"lock"


def test_restart_continues_offsets_and_cleans_abort(tmp_path: Path) -> None:
    store = tmp_path / "store"
    node = WriterNode(store)
    assert (store / "abort").exists()
    first = node.stub.Send(writer_pb2.SendRequest(message=message(queue_id=1, keys=["x"]))).result
    node.close()
    assert not (store / "abort").exists()
    node = WriterNode(store)
    try:
        assert node.writer.recovery.unclean is False
        second = node.stub.Send(writer_pb2.SendRequest(message=message(queue_id=1, keys=["x"]))).result
        assert second.queue_offset == first.queue_offset + 1
        assert second.commitlog_offset == first.commitlog_offset + first.size
    finally:
        node.close()


def test_retention_deletes_old_files_and_what_points_into_them(tmp_path: Path) -> None:
    store = tmp_path / "store"
    node = WriterNode(store, disk_clean_ratio=0.0)  # any disk use counts as pressure
    try:
        for n in range(8):
            batch = [message(f"T{k % 2}", body=bytes(900), keys=[f"n{n}-{k}"]) for k in range(60)]
            node.stub.SendBatch(writer_pb2.SendBatchRequest(messages=batch))
        node.writer.flush_thoroughly()
        files_before = sorted(os.listdir(store / "commitlog"))
        index_before = len(os.listdir(store / "index"))
        report = node.writer.run_retention()
        files_after = sorted(os.listdir(store / "commitlog"))
        assert len(report.commitlog_files) == min(10, len(files_before) - 1)
        assert files_after == files_before[len(report.commitlog_files) :]
        assert report.queue_files > 0 and len(report.index_files) > 0
        assert len(os.listdir(store / "index")) == index_before - len(report.index_files)
        new_min = int(files_after[0])
        status = node.writer.status()
        assert status["commitlog_min_offset"] == new_min
        for queue in node.writer.queues.queues.values():
            first = queue.read(queue.min_offset)
            assert first is not None and first.commitlog_offset >= new_min
        node.stub.Send(writer_pb2.SendRequest(message=message("T0", body=b"after")))
        node.writer.flush_thoroughly()
        assert check_store(str(store), SMALL).ok
    finally:
        node.close()


def test_send_cli_from_jsonl(node: WriterNode, tmp_path: Path) -> None:
    lines = [
        {"topic": "TopicA", "body": "hello", "keys": "k1 k2", "tags": "TagA"},
        {"topic": "TopicA", "bodyBase64": "AAEC", "keys": ["k3"], "queueId": 3, "properties": {"p": "v"}, "uniqKey": "U1"},
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = subprocess.run(
        [sys.executable, "-m", "rmqstore.cli.main", "send", "--endpoint", f"127.0.0.1:{node.port}", "--file", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    acks = [json.loads(line) for line in done.stdout.splitlines()]
    assert [a["queueId"] for a in acks][1] == 3 and acks[1]["uniqKey"] == "U1"
    assert set(acks[0]) == {"offsetMsgId", "uniqKey", "topic", "queueId", "queueOffset", "commitLogOffset", "storeTimestamp"}
    node.writer.flush_thoroughly()
    records = dump(tmp_path / "store")
    assert [r.body for r in records] == [b"hello", b"\x00\x01\x02"]
    assert records[1].properties["p"] == "v" and records[0].keys == "k1 k2"
    # A bad line is reported with its number and nothing is sent.
    path.write_text(json.dumps(lines[0]) + "\n" + '{"topic": 5}\n')
    done = subprocess.run(
        [sys.executable, "-m", "rmqstore.cli.main", "send", "--endpoint", f"127.0.0.1:{node.port}", "--file", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "line 2: topic (a string) is required" in done.stderr
    assert len(dump(tmp_path / "store")) == 2


def test_failed_batch_creates_no_topic(tmp_path: Path) -> None:
    store = tmp_path / "store"
    node = WriterNode(store)
    try:
        with pytest.raises(grpc.RpcError) as caught:
            node.stub.SendBatch(writer_pb2.SendBatchRequest(messages=[message("Fresh"), message("Fresh", queue_id=4)]))
        assert caught.value.details() == "message 2: queue id 4 is out of range: topic Fresh has 4 queues"
        assert node.stub.ListTopics(writer_pb2.ListTopicsRequest()).topics == []
        assert not (store / "config" / "topics.json").exists()
    finally:
        node.close()


def _copy_apache(source: Path, target: Path) -> Path:
    import shutil

    shutil.copytree(source, target)
    for dirpath, _, names in os.walk(target):
        os.chmod(dirpath, 0o755)
        for name in names:
            os.chmod(os.path.join(dirpath, name), 0o644)
    return target


def test_writer_takes_over_apaches_crashed_store(tmp_path: Path) -> None:
    """Apache's store after SIGKILL (abort present, no progress file of ours): the writer
    recovers it, keeps all 795 records, and appends after them."""
    from conftest import CRASHED, FIXTURE_SIZES

    store = _copy_apache(CRASHED, tmp_path / "store")
    writer = Writer(WriterConfig(store=str(store), sizes=FIXTURE_SIZES))
    try:
        assert writer.recovery.unclean is True
        assert writer.recovery.stop.end_offset == 840_015
        assert writer.topics.queue_count("TopicTest") == 4
        [result] = writer.append([MessageInput("TopicTest", b"x", queue_id=0)])
        assert result.commitlog_offset == 840_015
    finally:
        writer.close()
    report = check_store(str(store), FIXTURE_SIZES)
    assert report.ok, report.problems[:3]
    assert report.records == 796


def test_missing_index_files_are_rebuilt(tmp_path: Path) -> None:
    from rmqstore.common.files.index import IndexFileList

    store = tmp_path / "store"
    node = WriterNode(store)
    for n in range(400):
        node.stub.Send(writer_pb2.SendRequest(message=message(keys=[f"key-{n}"], body=bytes(n % 50))))
    node.close()
    index_files = sorted((store / "index").iterdir())
    assert len(index_files) > 3
    for path in index_files[len(index_files) // 2 :]:  # what Apache deletes after a crash: the newest
        path.unlink()
    writer = Writer(WriterConfig(store=str(store), sizes=SMALL))
    try:
        assert writer.recovery.redispatched_records > 0
    finally:
        writer.close()
    assert check_store(str(store), SMALL).ok
    index = IndexFileList(str(store / "index"), SMALL.index_slots, SMALL.index_entries)
    try:
        assert all(len(list(index.candidates("TopicA", f"key-{n}"))) == 1 for n in range(400))
    finally:
        index.close()


def test_time_based_retention_at_the_delete_hour(tmp_path: Path) -> None:
    import time as clock

    store = tmp_path / "store"
    hour = clock.localtime().tm_hour
    node = WriterNode(store, retention_hours=1.0, retention_delete_hours=(hour,), disk_clean_ratio=1.0)
    try:
        for _ in range(4):
            node.stub.SendBatch(writer_pb2.SendBatchRequest(messages=[message(body=bytes(900)) for _ in range(100)]))
        node.writer.flush_thoroughly()
        files = sorted((store / "commitlog").iterdir())
        assert len(files) >= 4
        assert node.writer.run_retention().commitlog_files == []  # nothing is an hour old yet
        old = clock.time() - 2 * 3600
        os.utime(files[0], (old, old))
        os.utime(files[1], (old, old))
        report = node.writer.run_retention()
        assert [Path(p).name for p in report.commitlog_files] == [files[0].name, files[1].name]
        assert sorted(p.name for p in (store / "commitlog").iterdir()) == [f.name for f in files[2:]]
    finally:
        node.close()
    assert check_store(str(store), SMALL).ok


def _appended_as_one_group(
    writer: Writer, requests: list[tuple[list[messages_pb2.Message], SocketAddress]], as_columns: Collection[int] = ()
) -> list[object]:
    """Each request's response or error, the requests handed to one event loop's group
    commit as the service's handlers hand them (read into columns by request_batch),
    with no await between them: the appender's first drain takes them all as one group.
    The requests numbered in ``as_columns`` are sent as ``columns``, the others as
    ``messages``."""
    appender = GroupAppender(writer, WriterMetrics(writer))

    async def send(n: int, messages: list[messages_pb2.Message], peer: SocketAddress) -> object:
        if n in as_columns:
            request = writer_pb2.SendBatchRequest(columns=as_columns_of(messages))
        else:
            request = writer_pb2.SendBatchRequest(messages=messages)
        return await appender.append(request_batch(request), peer, batch_response)

    async def send_all() -> list[object]:
        # Tasks made at once each run up to their append before the drain they schedule.
        return await asyncio.gather(*(send(n, *each) for n, each in enumerate(requests)), return_exceptions=True)

    try:
        return asyncio.run(send_all())
    finally:
        appender.close()


GROUP_CASES = {
    "all good": (),  # one batch throughout
    "refused at admission": (4,),  # checked as one, admitted request by request, stored as one
    "refused at reading and admission": (2, 4, 8),  # 2 refused as it is read; checked and admitted request by request
    "refused at layout too": (2, 4, 6, 8),  # the good ones then stored one by one
}


@pytest.mark.parametrize("shape", ["messages", "columns", "mixed"])
@pytest.mark.parametrize("flush", [FlushPolicy.SYNC, FlushPolicy.ASYNC])
@pytest.mark.parametrize("case", GROUP_CASES)
def test_a_group_of_requests_is_stored_as_one_batch_and_each_keeps_its_own_outcome(
    tmp_path: Path, flush: FlushPolicy, case: str, shape: str
) -> None:
    """The writer's group commit (GroupAppender → Writer.append_group): the requests
    queued together are appended as one batch with one fsync under SYNC; each good
    request stays contiguous and in order with its caller's address as born host, and
    each bad one (a born host that is no address, a topic name the store refuses, a
    queue id out of range, a record larger than a commit log file) is refused alone, its
    messages numbered within its own request. The requests are sent as ``messages``, as
    ``columns``, or mixed (the odd callers' and the bad ones 4 and 8 as columns), with
    the same outcomes."""
    store = tmp_path / "store"
    writer = Writer(WriterConfig(store=str(store), sizes=SMALL, flush=flush, auto_create_topics=False))
    writer.topics.create("Orders", 4)
    flushes: list[int] = []
    real_flush = writer.flush
    writer.flush = lambda: flushes.append(real_flush()) or flushes[-1]  # type: ignore[method-assign]

    def good(caller: int) -> list[messages_pb2.Message]:
        return [message("Orders", body=f"{caller}-{n}".encode(), keys=[f"c{caller}"], queue_id=caller % 4) for n in range(caller + 1)]

    bad = {
        2: [message("Orders", body=b"ok"), message("Orders", body=b"bad", born_host="nowhere")],
        4: [message("Orders", body=b"bad", queue_id=7)],
        6: [message("Orders", body=b"x" * SMALL.commitlog_file_size_bytes, queue_id=2)],
        8: [message("Orders", body=b"ok"), message("Orders", body=b"ok"), message("bad topic!", body=b"bad")],
    }
    special = {caller: bad[caller] for caller in GROUP_CASES[case]}
    callers = range(10)
    peers = [SocketAddress.parse(f"10.0.0.{caller}:{5000 + caller}") for caller in callers]
    as_columns = {"messages": set(), "columns": set(callers), "mixed": {c for c in callers if c % 2 or c in (4, 8)}}[shape]
    outcomes = _appended_as_one_group(writer, [(special.get(c) or good(c), peers[c]) for c in callers], as_columns)
    reasons = {
        2: lambda text: text.startswith("message 2: born_host: "),
        4: lambda text: text == "queue id 7 is out of range: topic Orders has 4 queues",
        6: lambda text: text.endswith(f"bytes of records cannot fit in a commit log file of {SMALL.commitlog_file_size_bytes} bytes"),
        8: lambda text: text.startswith("message 3: ") and "bad topic!" in text,
    }
    try:
        for caller in special:
            assert isinstance(outcomes[caller], InvalidArgument) and reasons[caller](str(outcomes[caller])), outcomes[caller]
        good_callers = [c for c in callers if c not in special]
        records = {r.commitlog_offset: r for r in dump(store)}
        assert len(records) == sum(c + 1 for c in good_callers)
        previous_end = 0
        for caller in good_callers:
            results = outcomes[caller].results  # type: ignore[attr-defined]
            assert len(results) == caller + 1
            assert results[0].commitlog_offset == previous_end  # in order, each after the one before
            for n, result in enumerate(results):
                record = records[result.commitlog_offset]
                assert record.body == f"{caller}-{n}".encode()
                assert record.born_host == peers[caller]
                assert (record.queue_id, record.queue_offset) == (caller % 4, result.queue_offset)
                assert result.commitlog_offset == previous_end
                previous_end = result.commitlog_offset + result.size
        # SYNC: one fsync for the whole group (the layout failure stored the others one by
        # one, and still under that one fsync); ASYNC: none before the acks.
        assert flushes == ([previous_end] if flush is FlushPolicy.SYNC else [])
    finally:
        writer.close()
    assert check_store(str(store), SMALL).ok


def test_a_group_whose_fsync_fails_is_acknowledged_to_nobody(tmp_path: Path) -> None:
    """SYNC: the fsync covering a group fails (EIO, injected): every request of the group
    gets that error and none is acknowledged; a request refused on its own keeps its own
    error; the next group, whose fsync succeeds, is acknowledged."""
    writer = Writer(WriterConfig(store=str(tmp_path / "store"), sizes=SMALL, flush=FlushPolicy.SYNC))
    real_flush = writer.flush

    def failing_flush() -> int:
        raise OSError(errno.EIO, "Input/output error")

    writer.flush = failing_flush  # type: ignore[method-assign]
    peer = SocketAddress.parse("10.0.0.1:5000")
    try:
        outcomes = _appended_as_one_group(
            writer, [([message("Orders", body=b"a")], peer), ([message("Orders", queue_id=-1)], peer), ([message("Orders", body=b"b")], peer)]
        )
        assert [type(o) for o in outcomes] == [OSError, InvalidArgument, OSError]
        assert outcomes[0] is outcomes[2] and outcomes[0].errno == errno.EIO  # type: ignore[union-attr]
        assert "queue id -1" in str(outcomes[1])
        writer.flush = real_flush  # type: ignore[method-assign]
        (after,) = _appended_as_one_group(writer, [([message("Orders", body=b"c")], peer)])
        assert after.results[0].commitlog_offset > 0  # type: ignore[attr-defined]
        assert writer.flushed_offset == after.results[0].commitlog_offset + after.results[0].size  # type: ignore[attr-defined]
    finally:
        writer.close()


def test_a_record_too_large_for_a_file_is_refused_and_takes_no_queue_offset(tmp_path: Path) -> None:
    """Refused at layout (after the queue offsets were planned): nothing is written and
    the queue's next message still gets the offset the refused one would have had."""
    writer = Writer(WriterConfig(store=str(tmp_path / "store"), sizes=SMALL))
    try:
        writer.append([MessageInput("Orders", b"first", queue_id=0)])
        with pytest.raises(InvalidArgument) as caught:
            writer.append([MessageInput("Orders", b"x" * SMALL.commitlog_file_size_bytes, queue_id=0)])
        size, _, rest = str(caught.value).partition(" ")
        assert int(size) > SMALL.commitlog_file_size_bytes
        assert rest == f"bytes of records cannot fit in a commit log file of {SMALL.commitlog_file_size_bytes} bytes"
        after = writer.append([MessageInput("Orders", b"after", queue_id=0)])[0]
        assert after.queue_offset == 1
        assert after.commitlog_offset == writer.append([MessageInput("Orders", b"next", queue_id=1)])[0].commitlog_offset - after.size
    finally:
        writer.close()
    log = CommitLog(str(tmp_path / "store" / "commitlog"), SMALL.commitlog_file_size_bytes)
    assert [(r.body, r.queue_offset) for r in log.records()] == [(b"first", 0), (b"after", 1), (b"next", 0)]
    log.close()


def test_batches_of_given_queue_ids_take_each_queues_next_offsets(tmp_path: Path) -> None:
    """Queue ids given, left to the writer and interleaved in a batch; a negative one
    anywhere refuses the batch (named by its place) and takes no offset."""
    writer = Writer(WriterConfig(store=str(tmp_path / "store"), sizes=SMALL))
    try:
        writer.topics.create("Orders", 3)
        writer.topics.create("Audit", 2)
        first = writer.append(
            [MessageInput(t, b"m", queue_id=q) for t, q in [("Orders", 2), ("Audit", 1), ("Orders", 2), ("Orders", 0), ("Audit", 1)]]
        )
        assert [(r.topic, r.queue_id, r.queue_offset) for r in first] == [
            ("Orders", 2, 0), ("Audit", 1, 0), ("Orders", 2, 1), ("Orders", 0, 0), ("Audit", 1, 1),
        ]  # fmt: skip
        with pytest.raises(InvalidArgument, match=r"^message 3: queue id -1 is negative$"):
            writer.append([MessageInput("Orders", b"m", queue_id=2), MessageInput("Orders", b"m"), MessageInput("Orders", b"m", queue_id=-1)])
        again = writer.append([MessageInput("Orders", b"m", queue_id=2), MessageInput("Audit", b"m", queue_id=1)])
        assert [(r.topic, r.queue_id, r.queue_offset) for r in again] == [("Orders", 2, 2), ("Audit", 1, 2)]
    finally:
        writer.close()


def test_a_full_disk_mid_write_stores_nothing_of_the_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file system fills up part-way through a batch's write (injected: the disk
    here is not full): the caller gets StoreFull, the half-written bytes are cleared,
    and the next batch takes the same offsets and is read back whole after a restart."""
    import errno

    from rmqstore.common.errors import StoreFull
    from rmqstore.common.files import mapped as mapped_module

    store = tmp_path / "store"
    writer = Writer(WriterConfig(store=str(store), sizes=SMALL))
    batch = [MessageInput("Orders", bytes([n]) * 900, keys=[f"k{n}"], queue_id=0) for n in range(1, 41)]
    writer.append(batch[:1])
    real_pwrite = os.pwrite
    calls = []

    def filling_up(fd: int, data: bytes, position: int) -> int:
        """The first write stores half its bytes, the next finds the disk full; the
        page-sized writes that clear up afterwards go through."""
        if len(data) > 4096:
            calls.append(len(data))
            if len(calls) == 1:
                return real_pwrite(fd, memoryview(data)[: len(data) // 2], position)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, position)

    monkeypatch.setattr(mapped_module, "WRITE_THROUGH_FILE_BYTES", 8192)
    monkeypatch.setattr(os, "pwrite", filling_up)
    with pytest.raises(StoreFull) as caught:
        writer.append(batch[1:])
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    assert len(calls) == 2
    assert str(caught.value) == "the disk is full (No space left on device): the batch was not stored"
    first_end = writer.log.write_offset
    log = CommitLog(str(store / "commitlog"), SMALL.commitlog_file_size_bytes)
    assert bytes(log.files.files[0].buf[first_end : first_end + 900 * 39]) == bytes(900 * 39)
    log.close()
    again = writer.append(batch[1:])
    assert [r.queue_offset for r in again] == list(range(1, 40)) and again[0].commitlog_offset == first_end
    writer._lock_file.release()  # a kill: nothing flushed or closed
    reopened = Writer(WriterConfig(store=str(store), sizes=SMALL))
    try:
        assert reopened.log.write_offset == again[-1].commitlog_offset + again[-1].size
    finally:
        reopened.close()
    log = CommitLog(str(store / "commitlog"), SMALL.commitlog_file_size_bytes)
    assert [r.body for r in log.records()] == [m.body for m in batch]
    log.close()


def test_a_requests_shared_properties_are_each_messages_unless_it_sets_its_own(node: WriterNode, tmp_path: Path) -> None:
    """SendBatchRequest.shared_properties: stored in every record as if each message had
    sent them, a message's own value of a name kept; the same whether the request is read
    by the compiled pass or (a born host given) by the Python reading."""
    shared = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tenant": "blue"}
    own = [{}, {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, {"seq": "3"}, {"seq": "3"}]
    for born_host in ("", "192.0.2.9:5000"):
        request = writer_pb2.SendBatchRequest(
            messages=[message("Shared", body=b"m", properties=p, born_host=born_host) for p in own], shared_properties=shared
        )
        node.stub.SendBatch(request)
    node.writer.flush_thoroughly()
    records = dump(tmp_path / "store")
    user = [{k: v for k, v in r.properties.items() if k not in ("UNIQ_KEY", "KEYS", "TAGS")} for r in records]
    expected = [{**shared, **p} for p in own]
    assert user == expected + expected
    assert user[1]["traceparent"] == own[1]["traceparent"]


def records_without_store_time(store: Path) -> list[bytes]:
    """Each record's bytes, its STORETIMESTAMP (the writer's clock) zeroed."""
    log = CommitLog(str(store / "commitlog"), SMALL.commitlog_file_size_bytes)
    try:
        records = list(log.records())
    finally:
        log.close()
    data = b"".join(path.read_bytes() for path in sorted((store / "commitlog").iterdir()))
    stripped = []
    for record in records:
        raw = bytearray(data[record.commitlog_offset : record.commitlog_offset + record.size])
        at = 48 + (20 if record.sys_flag & 0x10 else 8)  # BORNHOST (v6 when sysflag says so), then STORETIMESTAMP
        raw[at : at + 8] = bytes(8)
        stripped.append(bytes(raw))
    return stripped


def varied_messages(count: int) -> list[messages_pb2.Message]:
    sent = []
    for n in range(count):
        msg = message(
            ["TopicA", "Pay_Events-2"][n % 2],
            body=b"" if n % 7 == 0 else bytes(range(256))[: n * 5 % 256],
            keys=[] if n % 4 == 0 else [f"k-{n}", "订单-Ü"][: 1 + n % 2],
            tags="" if n % 3 == 0 else f"tag{n % 3}",
            properties={} if n % 5 else {"seq": str(n), "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
            uniq_key=f"{n:032X}",
            flag=n % 3,
            born_timestamp_ms=1_700_000_000_000 + n,  # 0 would take each writer's clock
            born_host="[2001:db8::5]:4000" if n % 2 else f"192.0.2.9:{5000 + n}",  # "" would take each client's port
        )
        if n % 4 == 1:
            msg.queue_id = n % 3
        sent.append(msg)
    return sent


def test_a_columnar_request_stores_the_bytes_its_messages_store(tmp_path: Path) -> None:
    """The same messages sent as ``messages`` to one writer and as ``columns`` to another
    (SendBatch, then SendStream; with shared properties; SendResults and compact acks):
    every record is the same bytes but for the store time, and every ack the same."""
    sent = varied_messages(60)
    shared = {"tenant": "blue", "seq": "shared"}  # a message's own seq is kept
    by_messages, by_columns = WriterNode(tmp_path / "messages"), WriterNode(tmp_path / "columns")
    try:
        acks = {}
        for node, form in ((by_messages, "messages"), (by_columns, "columns")):
            def request(part: list[messages_pb2.Message], compact: bool = False, form: str = form) -> writer_pb2.SendBatchRequest:
                if form == "messages":
                    return writer_pb2.SendBatchRequest(messages=part, shared_properties=shared, compact_results=compact)
                return writer_pb2.SendBatchRequest(columns=as_columns_of(part), shared_properties=shared, compact_results=compact)

            single = node.stub.SendBatch(request(sent[:1]))
            whole = node.stub.SendBatch(request(sent[1:30]))
            streamed = list(node.stub.SendStream(iter([request(sent[30:45]), request(sent[45:], compact=True)])))
            acks[form] = [single, whole, *streamed]
            node.writer.flush_thoroughly()
        for stored in acks.values():
            for response in stored:
                for result in response.results:
                    result.store_timestamp_ms = 0
                response.compact.store_timestamp_ms = 0
        assert acks["messages"] == acks["columns"]
        assert sum(len(r.results) + len(r.compact.uniq_keys) for r in acks["columns"]) == 60
        records = records_without_store_time(tmp_path / "columns")
        assert len(records) == 60 and records == records_without_store_time(tmp_path / "messages")
    finally:
        by_messages.close()
        by_columns.close()


def test_a_columnar_request_takes_the_defaults_of_empty_columns_and_one_topic_for_all(node: WriterNode) -> None:
    """Columns left empty give each message the unset field's value (queue round-robin,
    a generated uniq key, the writer's clock, the peer's address); one topic serves
    every message."""
    columns = writer_pb2.MessageColumns(bodies=[b"a", b"b", b"c"], topics=["OneForAll"])
    results = node.stub.SendBatch(writer_pb2.SendBatchRequest(columns=columns)).results
    stored = [node.writer.log.read(result.commitlog_offset) for result in results]
    assert [r.topic for r in stored] == ["OneForAll"] * 3 and [r.body for r in stored] == [b"a", b"b", b"c"]
    assert [r.queue_id for r in stored] == [0, 1, 2]
    assert all(len(r.uniq_key) == 32 for r in stored) and len({r.uniq_key for r in stored}) == 3
    assert all(r.born_timestamp_ms == r.store_timestamp_ms and r.keys is None and r.tags is None for r in stored)
    assert {r.born_host.ip for r in stored} == {bytes([127, 0, 0, 1])} and all(r.born_host.port for r in stored)


COLUMN_PROBLEMS = {
    "both messages and columns": (
        writer_pb2.SendBatchRequest(messages=[message(body=b"x")], columns=writer_pb2.MessageColumns(bodies=[b"y"])),
        "the request sets both messages and columns",
    ),
    "a column of another length": (
        writer_pb2.SendBatchRequest(columns=writer_pb2.MessageColumns(bodies=[b"x", b"y"], topics=["T"], keys=["a", "b", "c"])),
        "columns.keys has 3 entries for 2 messages",
    ),
    "two topics for three messages": (
        writer_pb2.SendBatchRequest(columns=writer_pb2.MessageColumns(bodies=[b"x", b"y", b"z"], topics=["T", "U"])),
        "columns.topics has 2 entries for 3 messages",
    ),
    "a value short": (
        writer_pb2.SendBatchRequest(
            columns=writer_pb2.MessageColumns(
                bodies=[b"x"], topics=["T"], property_counts=[1], property_names=["a"], property_values=[]
            )
        ),
        "columns.property_values has 0 entries for 1 columns.property_names",
    ),
    "counts that do not add up": (
        writer_pb2.SendBatchRequest(
            columns=writer_pb2.MessageColumns(
                bodies=[b"x", b"y"], topics=["T"], property_counts=[1, 1], property_names=["a"], property_values=["1"]
            )
        ),
        "columns.property_counts add up to 2",
    ),
    "properties without counts": (
        writer_pb2.SendBatchRequest(
            columns=writer_pb2.MessageColumns(bodies=[b"x"], topics=["T"], property_names=["a"], property_values=["1"])
        ),
        "columns.property_counts add up to 0",
    ),
    "a negative property count": (
        writer_pb2.SendBatchRequest(
            columns=writer_pb2.MessageColumns(
                bodies=[b"x", b"y"], topics=["T"], property_counts=[-1, 2], property_names=["a"], property_values=["1"]
            )
        ),
        "columns.property_counts holds -1",
    ),
    "born hosts of another length, one no address": (
        writer_pb2.SendBatchRequest(columns=writer_pb2.MessageColumns(bodies=[b"x", b"y"], topics=["T"], born_hosts=["nowhere"])),
        "columns.born_hosts has 1 entries for 2 messages",
    ),
    "a name given twice": (
        writer_pb2.SendBatchRequest(
            columns=writer_pb2.MessageColumns(
                bodies=[b"x", b"y"], topics=["T"], property_counts=[0, 2], property_names=["a", "a"], property_values=["1", "2"]
            )
        ),
        "message 2: a property name is given more than once",
    ),
}


@pytest.mark.parametrize("case", sorted(COLUMN_PROBLEMS))
def test_a_columnar_request_that_does_not_line_up_is_refused_naming_why(strict_node: tuple[WriterNode, Path], case: str) -> None:
    node, store = strict_node
    request, text = COLUMN_PROBLEMS[case]
    before = snapshot(store)
    for call in (node.stub.SendBatch, lambda r: list(node.stub.SendStream(iter([r])))):
        with pytest.raises(grpc.RpcError) as caught:
            call(request)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert text in caught.value.details()
    assert snapshot(store) == before


# What a columnar request cannot say (a key holding a space is two keys there; [""] is
# no keys), or says otherwise (-1 asks for round-robin): the same rules, as it says them.
COLUMNAR_BAD_INPUTS = {
    **{case: bad for case, (bad, _, _) in BAD_INPUTS.items() if case not in ("key with a space", "empty key", "negative queue id")},
    "empty key": message(keys=["a", "", "b"]),
    "negative queue id": message("Known", queue_id=-2),
}


@pytest.mark.parametrize("case", sorted(COLUMNAR_BAD_INPUTS))
def test_a_columnar_request_is_refused_as_its_messages_are(strict_node: tuple[WriterNode, Path], case: str) -> None:
    """Every per-message rule, as columns: the same code and words as the same messages
    sent as ``messages`` (the bad one second, or alone), and nothing is written."""
    node, store = strict_node
    bad = COLUMNAR_BAD_INPUTS[case]
    before = snapshot(store)
    for batch in ([message("Known", body=b"ok"), bad, message("Known", body=b"after")], [bad]):
        refusals = []
        for request in (writer_pb2.SendBatchRequest(messages=batch), writer_pb2.SendBatchRequest(columns=as_columns_of(batch))):
            with pytest.raises(grpc.RpcError) as caught:
                node.stub.SendBatch(request)
            refusals.append((caught.value.code(), caught.value.details()))
        assert refusals[0] == refusals[1]
        assert refusals[0][1].startswith("message 2: ") == (len(batch) > 1), refusals[0]
    assert snapshot(store) == before


_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=6)
_KEY = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters=" "), min_size=1, max_size=4)
_MESSAGE = st.fixed_dictionaries(
    {},
    optional={
        "topic": st.one_of(st.sampled_from(["", "TopicA"]), _TEXT),
        "queue_id": st.integers(-(2**31), 2**31 - 1).filter(lambda q: q != -1),  # -1 asks for round-robin as a column
        "body": st.binary(max_size=8),
        "keys": st.lists(_KEY, max_size=3),
        "tags": _TEXT,
        "properties": st.dictionaries(_TEXT, _TEXT, max_size=3),
        "uniq_key": st.sampled_from(["", "AB12", "bad key"]),
        "flag": st.integers(-(2**31), 2**31 - 1),
        "born_timestamp_ms": st.integers(-(2**63), 2**63 - 1),
        "born_host": st.sampled_from(["", "192.0.2.1:5", "[2001:db8::1]:9", "nowhere", "1.2.3.4"]),
    },
)


def _read(read: object, *args: object) -> object:
    try:
        return tuple(read(*args))  # type: ignore[operator]
    except InvalidArgument as error:
        return str(error)


@settings(max_examples=300, deadline=None)
@given(st.lists(_MESSAGE, max_size=5), st.dictionaries(st.sampled_from(["traceparent", "a", ""]), _TEXT, max_size=2))
@example([{"topic": "T", "properties": {"a": "own"}}, {"topic": "T"}], {"a": "shared", "traceparent": "t"})
@example([{"topic": "T"}, {"topic": "T", "born_host": "nowhere"}], {})
def test_a_requests_columns_are_read_as_its_messages_are(messages: list[dict[str, object]], shared: dict[str, str]) -> None:
    """Any messages (negatives, defaults, odd text, shared properties): the writer's
    columns of a request sent as ``columns`` equal those of the same request sent as
    ``messages``, or both readings refuse it in the same words (a born host that is no
    address)."""
    protos = [messages_pb2.Message(**m) for m in messages]  # type: ignore[arg-type]
    by_messages = _read(to_batch, protos, shared)
    assert _read(columns_batch, as_columns_of(protos), shared) == by_messages
    if messages and not isinstance(by_messages, str):
        one_topic = as_columns_of(protos)
        if len({m.topic for m in protos}) == 1:
            del one_topic.topics[1:]  # a single topic for every message
            assert _read(columns_batch, one_topic, shared) == by_messages
