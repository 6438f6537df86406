"""Timed messages against real writer processes (``rmqstore writer serve`` on 127.0.0.1
port 0), through RocketMQ 5's protocol with the project's own v2 stubs: received no
earlier than due and each once, across a SIGKILL with timers pending, and never once
recalled."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import uuid
from collections import Counter
from pathlib import Path

import grpc
import pytest
from google.protobuf import duration_pb2, timestamp_pb2
from support.http import get
from support.nodes import Nodes, ProcessNode
from support.rmq5 import DRIVERS, client_env, rmq5_python, run_python_client

from rmqstore.rocketmq_v2 import definition_pb2 as v2
from rmqstore.rocketmq_v2 import service_pb2 as v2s
from rmqstore.rocketmq_v2 import service_pb2_grpc
from rmqstore.v1 import messages_pb2, writer_pb2

pytestmark = pytest.mark.slow

TOPIC = "Delays"
GROUP = v2.Resource(name="delayed-readers")
RPC_TIMEOUT_S = 15.0
QUEUES = 4
# The checkpoint interval (writer.timers): a crash releases again at most what came due in
# the interval before it; the margin covers the tick and the kill's own latency.
REPEAT_WINDOW_MS = 1000 + 500


def stub(nodes: Nodes, node: ProcessNode) -> service_pb2_grpc.MessagingServiceStub:
    return service_pb2_grpc.MessagingServiceStub(nodes.channel(node))


def timed_message(number: int, due_ms: int) -> v2.Message:
    system = v2.SystemProperties(
        message_id=f"T{number:06d}{uuid.uuid4().hex}",
        message_type=v2.DELAY,
        delivery_timestamp=timestamp_pb2.Timestamp(seconds=due_ms // 1000, nanos=(due_ms % 1000) * 1_000_000),
    )
    return v2.Message(topic=v2.Resource(name=TOPIC), body=f"{number} {due_ms}".encode(), system_properties=system)


def send_timed(messaging: service_pb2_grpc.MessagingServiceStub, dues: list[int], batch: int = 100) -> None:
    for start in range(0, len(dues), batch):
        messages = [timed_message(n, dues[n]) for n in range(start, min(start + batch, len(dues)))]
        response = messaging.SendMessage(v2s.SendMessageRequest(messages=messages), timeout=RPC_TIMEOUT_S)
        assert response.status.code == v2.OK, response.status


def receive_until(
    messaging: service_pb2_grpc.MessagingServiceStub, wanted: int, timeout_s: float
) -> list[tuple[int, int, int]]:
    """(number, due ms, receive ms) of every message received (and acknowledged) until
    ``wanted`` distinct ones came or ``timeout_s`` passed, taking every queue in turn."""
    received: list[tuple[int, int, int]] = []
    seen: set[int] = set()
    deadline = time.monotonic() + timeout_s
    queue = 0
    while len(seen) < wanted and time.monotonic() < deadline:
        request = v2s.ReceiveMessageRequest(
            group=GROUP,
            message_queue=v2.MessageQueue(topic=v2.Resource(name=TOPIC), id=queue),
            filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"),
            batch_size=32,
            invisible_duration=duration_pb2.Duration(seconds=60),
            long_polling_timeout=duration_pb2.Duration(nanos=300_000_000),
        )
        queue = (queue + 1) % QUEUES
        entries = []
        for answer in messaging.ReceiveMessage(request, timeout=RPC_TIMEOUT_S):
            if not answer.HasField("message"):
                continue
            received_ms = int(time.time() * 1000)
            number, due = map(int, answer.message.body.decode().split())
            received.append((number, due, received_ms))
            seen.add(number)
            entries.append(
                v2s.AckMessageEntry(
                    message_id=answer.message.system_properties.message_id,
                    receipt_handle=answer.message.system_properties.receipt_handle,
                )
            )
        if entries:
            ack = messaging.AckMessage(
                v2s.AckMessageRequest(group=GROUP, topic=v2.Resource(name=TOPIC), entries=entries), timeout=RPC_TIMEOUT_S
            )
            assert ack.status.code == v2.OK, ack.status
    return received


def writer_node(nodes: Nodes, store: Path) -> ProcessNode:
    return nodes.start("writer", store, "--flush", "sync")


def create_topic(nodes: Nodes, node: ProcessNode) -> None:
    # Typed DELAY: the topic takes timed messages, as Apache's proxy checks them.
    request = writer_pb2.CreateTopicRequest(name=TOPIC, queue_count=QUEUES, message_type="DELAY")
    nodes.writer(node).CreateTopic(request, timeout=RPC_TIMEOUT_S)


def test_a_thousand_timed_messages_are_received_no_earlier_than_due_each_once(nodes: Nodes, tmp_path: Path) -> None:
    writer = writer_node(nodes, tmp_path / "store")
    create_topic(nodes, writer)
    messaging = stub(nodes, writer)
    start = int(time.time() * 1000)
    dues = [start + 2000 + (n * 3000) // 1000 for n in range(1000)]  # due 2-5 s ahead
    send_timed(messaging, dues)
    received = receive_until(messaging, 1000, timeout_s=30)
    counts = Counter(number for number, _, _ in received)
    assert sorted(counts) == list(range(1000))
    assert set(counts.values()) == {1}
    early = [(number, due, at) for number, due, at in received if at < due]
    assert early == []


def test_pending_timers_survive_a_sigkill_none_lost(nodes: Nodes, tmp_path: Path) -> None:
    store = tmp_path / "store"
    writer = writer_node(nodes, store)
    create_topic(nodes, writer)
    start = int(time.time() * 1000)
    # 100 due about a second after sending (released before the kill), 500 pending at it.
    dues = [start + 1000 + n * 5 for n in range(100)] + [start + 4000 + n * 4 for n in range(500)]
    send_timed(stub(nodes, writer), dues)
    time.sleep(max(start + 2600 - time.time() * 1000, 0) / 1000)
    killed_ms = int(time.time() * 1000)
    writer.kill()
    restarted = writer_node(nodes, store)
    received = receive_until(stub(nodes, restarted), len(dues), timeout_s=40)
    counts = Counter(number for number, _, _ in received)
    assert sorted(counts) == list(range(len(dues)))  # none lost
    repeated = {number for number, count in counts.items() if count > 1}
    # Only a message that came due within one checkpoint interval of the kill comes twice.
    assert all(killed_ms - REPEAT_WINDOW_MS <= dues[number] <= killed_ms for number in repeated), sorted(repeated)
    assert [(n, due, at) for n, due, at in received if at < due] == []


def test_a_recalled_message_is_never_delivered(nodes: Nodes, tmp_path: Path) -> None:
    writer = writer_node(nodes, tmp_path / "store")
    create_topic(nodes, writer)
    messaging = stub(nodes, writer)
    due = int(time.time() * 1000) + 2500
    handles = []
    for number in range(4):
        response = messaging.SendMessage(v2s.SendMessageRequest(messages=[timed_message(number, due)]), timeout=RPC_TIMEOUT_S)
        assert response.status.code == v2.OK
        handles.append(response.entries[0].recall_handle)
    assert all(handles)
    for handle in handles[1:3]:
        recalled = messaging.RecallMessage(
            v2s.RecallMessageRequest(topic=v2.Resource(name=TOPIC), recall_handle=handle), timeout=RPC_TIMEOUT_S
        )
        assert recalled.status.code == v2.OK, recalled.status
    wrong = messaging.RecallMessage(v2s.RecallMessageRequest(topic=v2.Resource(name="Other"), recall_handle=handles[0]), timeout=RPC_TIMEOUT_S)
    assert wrong.status.code == v2.TOPIC_NOT_FOUND
    nodes.writer(writer).CreateTopic(writer_pb2.CreateTopicRequest(name="Other", queue_count=1), timeout=RPC_TIMEOUT_S)
    wrong = messaging.RecallMessage(v2s.RecallMessageRequest(topic=v2.Resource(name="Other"), recall_handle=handles[0]), timeout=RPC_TIMEOUT_S)
    assert (wrong.status.code, wrong.status.message) == (
        v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
        "org.apache.rocketmq.proxy.common.ProxyException: TopicMessageType validate failed, the expected type is NORMAL, but actual type is DELAY",
    )
    nodes.writer(writer).CreateTopic(writer_pb2.CreateTopicRequest(name="Later", queue_count=1, message_type="DELAY"), timeout=RPC_TIMEOUT_S)
    wrong = messaging.RecallMessage(v2s.RecallMessageRequest(topic=v2.Resource(name="Later"), recall_handle=handles[0]), timeout=RPC_TIMEOUT_S)
    assert (wrong.status.code, wrong.status.message) == (v2.INTERNAL_SERVER_ERROR, "recall failed, topic not match")
    bad = messaging.RecallMessage(v2s.RecallMessageRequest(topic=v2.Resource(name=TOPIC), recall_handle="x"), timeout=RPC_TIMEOUT_S)
    assert (bad.status.code, bad.status.message) == (v2.INTERNAL_SERVER_ERROR, "recall handle is invalid")
    received = receive_until(messaging, 2, timeout_s=10)
    assert sorted(number for number, _, _ in received) == [0, 3]
    # Nothing more comes once every timer is due.
    time.sleep(max(due + 1000 - time.time() * 1000, 0) / 1000)
    assert receive_until(messaging, 1, timeout_s=2) == []
    late = messaging.RecallMessage(v2s.RecallMessageRequest(topic=v2.Resource(name=TOPIC), recall_handle=handles[0]), timeout=RPC_TIMEOUT_S)
    assert (late.status.code, late.status.message) == (v2.INTERNAL_SERVER_ERROR, "recall failed, timestamp invalid")


def test_a_delivery_time_beyond_the_maximum_is_refused_as_apaches_proxy_refuses_it(nodes: Nodes, tmp_path: Path) -> None:
    writer = nodes.start("writer", tmp_path / "store", "--timer-max-delay", "60")
    create_topic(nodes, writer)
    messaging = stub(nodes, writer)
    too_far = timed_message(0, int(time.time() * 1000) + 120_000)
    response = messaging.SendMessage(v2s.SendMessageRequest(messages=[too_far]), timeout=RPC_TIMEOUT_S)
    assert (response.status.code, response.status.message) == (
        v2.ILLEGAL_DELIVERY_TIME, "the max delay time of message is too large, max is 60000",
    )
    within = messaging.SendMessage(v2s.SendMessageRequest(messages=[timed_message(1, int(time.time() * 1000) + 30_000)]), timeout=RPC_TIMEOUT_S)
    assert within.status.code == v2.OK


def test_channel_errors_are_not_swallowed(nodes: Nodes, tmp_path: Path) -> None:
    """A stopped writer is an error to the client, not an empty receive (the helpers
    above would otherwise read a dead node as "nothing due")."""
    writer = writer_node(nodes, tmp_path / "store")
    messaging = stub(nodes, writer)
    writer.kill()
    with pytest.raises(grpc.RpcError):
        receive_until(messaging, 1, timeout_s=2)


def test_the_console_shows_a_pending_timed_message_with_its_due_time(nodes: Nodes, tmp_path: Path) -> None:
    store = tmp_path / "store"
    writer = writer_node(nodes, store)
    create_topic(nodes, writer)
    due = int(time.time() * 1000) + 3_600_000
    message = timed_message(7, due)
    response = stub(nodes, writer).SendMessage(v2s.SendMessageRequest(messages=[message]), timeout=RPC_TIMEOUT_S)
    assert response.status.code == v2.OK
    query_node = nodes.start("query", store)
    console = nodes.console("--query-endpoint", query_node.endpoint)
    params = urllib.parse.urlencode({"mode": "id", "id": message.system_properties.message_id, "topic": TOPIC})
    status, _, body = get(f"{console.url}/api/search?{params}")
    assert status == 200, body
    [found] = json.loads(body)["messages"]
    assert (found["topic"], found["pendingUntil"]) == ("rmq_sys_wheel_timer", due)
    status, _, page = get(f"{console.url}/search?{params}")
    assert status == 200 and b"pending until" in page


def test_delay_levels_one_to_three_come_after_their_delays(nodes: Nodes, tmp_path: Path) -> None:
    """Apache 4.9's levels through WriterService (the DELAY property): each message is
    received once, no earlier than its store time plus its level's delay (1 s, 5 s, 10 s)."""
    writer = writer_node(nodes, tmp_path / "store")
    create_topic(nodes, writer)
    messages = [
        messages_pb2.Message(topic=TOPIC, body=f"{level} 0".encode(), queue_id=level, properties={"DELAY": str(level)})
        for level in (1, 2, 3)
    ]
    acks = nodes.writer(writer).SendBatch(writer_pb2.SendBatchRequest(messages=messages), timeout=RPC_TIMEOUT_S).results
    assert [(a.topic, a.queue_id) for a in acks] == [("SCHEDULE_TOPIC_XXXX", 0), ("SCHEDULE_TOPIC_XXXX", 1), ("SCHEDULE_TOPIC_XXXX", 2)]
    received = receive_until(stub(nodes, writer), 3, timeout_s=20)
    assert sorted(number for number, _, _ in received) == [1, 2, 3]
    stored_ms = acks[0].store_timestamp_ms
    for level, _, at in received:
        assert at >= stored_ms + {1: 1000, 2: 5000, 3: 10_000}[level]


def test_the_official_python_client_sends_timed_messages_and_recalls_some(nodes: Nodes, tmp_path: Path) -> None:
    """rocketmq-python-client, unmodified: DELAY messages to a topic typed DELAY
    (``updateTopic -a +message.type=DELAY``), a third of them recalled through its
    recall_message with the receipt's handle; its SimpleConsumer receives every other one,
    each once and no earlier than due, and no recalled one."""
    writer = writer_node(nodes, tmp_path / "store")
    create_topic(nodes, writer)
    sent = run_python_client(tmp_path, "timed", writer.endpoint, TOPIC, "30", "3000", "3")
    assert len(sent) == 30 and sum(line["recalled"] for line in sent) == 10
    home = tmp_path / "client-home"
    consumer = [rmq5_python(), str(DRIVERS / "python_consumer.py"), "simple", writer.endpoint, "timed-readers", TOPIC,
                "--expect", "20", "--idle-s", "8"]  # fmt: skip
    done = subprocess.run(consumer, capture_output=True, timeout=120, env=client_env(home), cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    received = [json.loads(line) for line in done.stdout.splitlines()]
    due = {line["body"]: line["due"] for line in sent}
    wanted = sorted(line["body"] for line in sent if not line["recalled"])
    assert sorted(line["body"] for line in received) == wanted
    assert [line["body"] for line in received if line["t"] * 1000 < due[line["body"]]] == []
