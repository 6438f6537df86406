"""RocketMQ 5's consumer calls on the writer, through real gRPC with our own v2 stubs:
receive, long polling, invisibility, acknowledgements, receipt handles, FIFO groups, dead
letters, the groups' progress files, and every refusal's exact v2 status."""

from __future__ import annotations

import hashlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2
from hypothesis import given
from hypothesis import strategies as st
from support.inprocess import WriterNode, gateway_node
from support.stores import copy_live_store
from support.telemetry import collected, metric_reader
from support.wait import clock_past, wait_until

from rmqstore.common.errors import Corruption
from rmqstore.common.files.consumer_offsets import read_offsets
from rmqstore.rocketmq_v2 import definition_pb2 as v2
from rmqstore.rocketmq_v2 import service_pb2 as v2s
from rmqstore.v1 import messages_pb2, writer_pb2
from rmqstore.writer.consumers import (
    JOURNAL_FILE_NAME,
    STATE_FILE_NAME,
    QueueProgress,
    TagFilter,
    parse_state,
    render_state,
)

RPC_TIMEOUT_S = 15.0
GROUP = v2.Resource(name="audit")
TOPIC = v2.Resource(name="Orders")


@pytest.fixture
def node(tmp_path: Path) -> Iterator[WriterNode]:
    started = gateway_node(tmp_path / "store")
    yield started
    started.close()


def send(node: WriterNode, count: int, topic: str = "Orders", queue_id: int = 0, **fields: object) -> None:
    """``count`` messages through rmqstore.v1 (bodies "m0", "m1", …), all to ``queue_id``."""
    messages = [messages_pb2.Message(topic=topic, body=f"m{i}".encode(), queue_id=queue_id, **fields) for i in range(count)]  # type: ignore[arg-type]
    node.stub.SendBatch(writer_pb2.SendBatchRequest(messages=messages), timeout=RPC_TIMEOUT_S)


def seconds(value: float) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=int(value), nanos=int((value % 1) * 1e9))


def receive(
    node: WriterNode,
    *,
    group: v2.Resource = GROUP,
    topic: v2.Resource = TOPIC,
    queue_id: int = 0,
    batch: int = 32,
    invisible_s: float = 30,
    poll_s: float = 0,
    expression: v2.FilterExpression | None = None,
) -> tuple[v2.Status, list[v2.Message]]:
    request = v2s.ReceiveMessageRequest(
        group=group,
        message_queue=v2.MessageQueue(topic=topic, id=queue_id),
        filter_expression=expression or v2.FilterExpression(type=v2.TAG, expression="*"),
        batch_size=batch,
        invisible_duration=seconds(invisible_s),
        long_polling_timeout=seconds(poll_s),
    )
    answers = list(node.v2.ReceiveMessage(request, timeout=RPC_TIMEOUT_S + poll_s))
    statuses = [a.status for a in answers if a.HasField("status")]
    assert len(statuses) == 1, answers
    return statuses[0], [a.message for a in answers if a.HasField("message")]


def polling(node: WriterNode) -> Callable[[], tuple[v2.Status, list[v2.Message], float]]:
    """A receive with a 10 s long poll started in a thread, and 1 s given it to wait;
    the function returned joins it and gives its answer and how long it waited."""
    outcome: dict[str, Any] = {}

    def poll() -> None:
        started = time.monotonic()
        outcome["answer"] = receive(node, poll_s=10)
        outcome["waited_s"] = time.monotonic() - started

    waiting = threading.Thread(target=poll)
    waiting.start()
    time.sleep(1.0)  # the behaviour under test: a poll that has waited a second is then woken

    def finished() -> tuple[v2.Status, list[v2.Message], float]:
        waiting.join(timeout=20)
        status, messages = outcome["answer"]
        return status, messages, outcome["waited_s"]

    return finished


def ack(node: WriterNode, *messages: v2.Message, group: v2.Resource = GROUP, topic: v2.Resource = TOPIC) -> v2s.AckMessageResponse:
    entries = [v2s.AckMessageEntry(message_id=m.system_properties.message_id, receipt_handle=m.system_properties.receipt_handle) for m in messages]
    return node.v2.AckMessage(v2s.AckMessageRequest(group=group, topic=topic, entries=entries), timeout=RPC_TIMEOUT_S)


def ack_handle(node: WriterNode, handle: str, group: v2.Resource = GROUP, topic: v2.Resource = TOPIC) -> tuple[int, str]:
    response = node.v2.AckMessage(
        v2s.AckMessageRequest(group=group, topic=topic, entries=[v2s.AckMessageEntry(message_id="x", receipt_handle=handle)]),
        timeout=RPC_TIMEOUT_S,
    )
    return response.status.code, response.status.message


def change(node: WriterNode, handle: str, invisible_s: float) -> v2s.ChangeInvisibleDurationResponse:
    request = v2s.ChangeInvisibleDurationRequest(
        group=GROUP, topic=TOPIC, receipt_handle=handle, invisible_duration=seconds(invisible_s), message_id="x"
    )
    return node.v2.ChangeInvisibleDuration(request, timeout=RPC_TIMEOUT_S)


def bodies(messages: list[v2.Message]) -> list[bytes]:
    return [m.body for m in messages]


def test_receive_hands_out_each_message_once_with_its_fields_then_message_not_found(node: WriterNode) -> None:
    send(node, 5, tags="paid", keys=["k1", "k2"], properties={"region": "eu"})
    status, messages = receive(node, batch=3)
    assert (status.code, status.message) == (v2.OK, "OK")
    assert bodies(messages) == [b"m0", b"m1", b"m2"]
    first = messages[0]
    system = first.system_properties
    assert (system.queue_id, system.queue_offset, system.delivery_attempt) == (0, 0, 1)
    assert system.tag == "paid" and sorted(system.keys) == ["k1", "k2"]
    assert dict(first.user_properties) == {"region": "eu"}
    assert system.body_encoding == v2.IDENTITY
    assert (system.body_digest.type, system.body_digest.checksum) == (v2.MD5, hashlib.md5(b"m0").hexdigest().upper())
    assert system.store_timestamp.seconds > 0 and system.message_type == v2.NORMAL
    assert 29 <= system.invisible_duration.seconds <= 30
    status, rest = receive(node, batch=32)
    assert bodies(rest) == [b"m3", b"m4"]
    status, none = receive(node)
    assert (status.code, status.message, none) == (v2.MESSAGE_NOT_FOUND, "no new message", [])
    assert ack(node, *messages, *rest).status.code == v2.OK
    assert node.messaging.consumers.committed("audit", "Orders", 0) == 5


def test_an_append_wakes_a_waiting_long_poll_at_once(node: WriterNode) -> None:
    """A poll of 10 s answers as soon as a message is sent through rmqstore.v1."""
    node.stub.CreateTopic(writer_pb2.CreateTopicRequest(name="Orders", queue_count=4), timeout=RPC_TIMEOUT_S)
    finished = polling(node)
    send(node, 1)
    status, messages, waited_s = finished()
    assert status.code == v2.OK and bodies(messages) == [b"m0"]
    assert 0.9 <= waited_s < 5.0


def test_an_empty_long_poll_waits_its_timeout_then_message_not_found(node: WriterNode) -> None:
    node.stub.CreateTopic(writer_pb2.CreateTopicRequest(name="Orders", queue_count=4), timeout=RPC_TIMEOUT_S)
    started = time.monotonic()
    status, messages = receive(node, poll_s=1.5)
    waited_s = time.monotonic() - started
    assert (status.code, messages) == (v2.MESSAGE_NOT_FOUND, [])
    assert 1.4 <= waited_s < 6.0


def test_unacknowledged_comes_back_after_its_invisibility_with_a_higher_attempt(node: WriterNode) -> None:
    send(node, 2)
    # Long enough for the acknowledgement below to come before it expires, on a loaded machine.
    _, first = receive(node, invisible_s=3)
    assert [m.system_properties.delivery_attempt for m in first] == [1, 1]
    assert receive(node)[1] == []  # invisible
    assert ack(node, first[1]).status.code == v2.OK
    # A poll wakes when the message in flight becomes visible again.
    _status, again = receive(node, poll_s=5)
    assert bodies(again) == [b"m0"] and again[0].system_properties.delivery_attempt == 2
    # The first delivery's handle is stale now; the second's works.
    assert ack_handle(node, first[0].system_properties.receipt_handle) == (
        v2.INVALID_RECEIPT_HANDLE, "the receipt handle is stale: the message has been handed out again since"
    )
    assert ack(node, again[0]).status.code == v2.OK
    assert ack(node, again[0]).status.code == v2.OK  # acknowledging twice is no error
    assert node.messaging.consumers.committed("audit", "Orders", 0) == 2


def test_change_invisible_duration_keeps_a_message_away_and_returns_a_new_handle(node: WriterNode) -> None:
    send(node, 1)
    _, (message,) = receive(node, invisible_s=1)
    old = message.system_properties.receipt_handle
    renewed = change(node, old, 60)
    assert renewed.status.code == v2.OK and renewed.receipt_handle not in ("", old)
    time.sleep(1.3)  # past the first invisible duration (1 s): the renewed one still holds the message
    assert receive(node)[1] == []
    assert ack_handle(node, old)[0] == v2.INVALID_RECEIPT_HANDLE
    # 0 makes it visible at once.
    zero = change(node, renewed.receipt_handle, 0)
    assert zero.status.code == v2.OK
    _, again = receive(node)
    assert bodies(again) == [b"m0"] and again[0].system_properties.delivery_attempt == 2


def test_an_expired_receipt_handle_is_refused_for_ack_and_change_as_apache_refuses_it(node: WriterNode) -> None:
    """ConsumerProcessor.validateReceiptHandle: once its invisible duration is over, a
    handle neither acknowledges nor hides its message; the message comes back."""
    send(node, 1)
    _, (message,) = receive(node, invisible_s=1)
    handle = message.system_properties.receipt_handle
    time.sleep(1.2)
    expired = (v2.INVALID_RECEIPT_HANDLE, "org.apache.rocketmq.proxy.common.ProxyException: receipt handle is expired")
    assert ack_handle(node, handle) == expired
    changed = change(node, handle, 30)
    assert (changed.status.code, changed.status.message, changed.receipt_handle) == (*expired, "")
    assert node.messaging.consumers.committed("audit", "Orders", 0) == 0
    _, again = receive(node)
    assert bodies(again) == [b"m0"] and again[0].system_properties.delivery_attempt == 2
    assert ack(node, again[0]).status.code == v2.OK


def test_receipt_handles_forged_or_of_another_group_are_refused(node: WriterNode) -> None:
    send(node, 1)
    _, (message,) = receive(node)
    handle = message.system_properties.receipt_handle
    forged = handle[:-3] + ("AAA" if not handle.endswith("AAA") else "BBB")
    for bad in (forged, "not-a-handle", "", "!!!"):
        assert ack_handle(node, bad) == (v2.INVALID_RECEIPT_HANDLE, "the receipt handle is not one this writer gave out")
    assert ack_handle(node, handle, group=v2.Resource(name="other")) == (
        v2.INVALID_RECEIPT_HANDLE, "the receipt handle is for group audit on topic Orders"
    )
    assert change(node, forged, 10).status.code == v2.INVALID_RECEIPT_HANDLE
    assert ack_handle(node, handle) == (v2.OK, "OK")


def test_tag_filters_hand_out_the_matching_subset(node: WriterNode) -> None:
    for tag in ("a", "b", "c", "a"):
        send(node, 1, tags=tag)
    tags = v2.FilterExpression(type=v2.TAG, expression="a || c")
    status, messages = receive(node, expression=tags)
    assert [m.system_properties.tag for m in messages] == ["a", "c", "a"]
    blank = v2.FilterExpression(type=v2.TAG, expression="a||")
    status, _ = receive(node, group=v2.Resource(name="g3"), expression=blank)
    assert (status.code, status.message) == (v2.ILLEGAL_FILTER_EXPRESSION, "tag expression 'a||' is not '*' or tags joined by '||'")


def test_a_sql92_filter_hands_out_the_matching_subset_in_one_receive_and_skips_the_rest(node: WriterNode) -> None:
    """Evaluated on the record's properties (a receive picks every unit and looks past
    those it skips at once); each skipped message is consumed by skipping."""
    rows = [{"a": str(n % 10), "color": ("red", "blue", "green")[n % 3]} for n in range(60)]
    for n, row in enumerate(rows):
        send(node, 1, properties=row, tags="odd" if n % 2 else "even")
    expression = "(a BETWEEN 2 AND 4 OR color IN ('blue')) AND TAGS = 'even' AND missing IS NULL"
    sql = v2.FilterExpression(type=v2.SQL, expression=expression)
    status, messages = receive(node, expression=sql, batch=64)
    wanted = [n for n, row in enumerate(rows) if (2 <= int(row["a"]) <= 4 or row["color"] == "blue") and n % 2 == 0]
    assert status.code == v2.OK and [dict(m.user_properties) for m in messages] == [rows[n] for n in wanted]
    assert ack(node, *messages).status.code == v2.OK
    assert node.messaging.consumers.committed("audit", "Orders", 0) == 60
    bad = v2.FilterExpression(type=v2.SQL, expression="a > 'x'")
    status, _ = receive(node, group=v2.Resource(name="g2"), expression=bad)
    assert (status.code, status.message) == (
        v2.ILLEGAL_FILTER_EXPRESSION, "parse the consumer's subscription failed: Value ''x'' cannot be compared."
    )


@pytest.mark.parametrize(
    ("changes", "code", "message"),
    [
        ({"group": v2.Resource(name="bad group")}, v2.ILLEGAL_CONSUMER_GROUP, "consumer group 'bad group' must be 1-120 of letters, digits, %, |, _ and -"),
        ({"group": v2.Resource(name="")}, v2.ILLEGAL_CONSUMER_GROUP, "consumer group '' must be 1-120 of letters, digits, %, |, _ and -"),
        ({"topic": v2.Resource(name="Nope")}, v2.TOPIC_NOT_FOUND, "topic Nope does not exist"),
        ({"topic": v2.Resource(name="a b")}, v2.ILLEGAL_TOPIC, "the topic 'a b' contains characters outside [%|a-zA-Z0-9_-]"),
        ({"batch": 0}, v2.BAD_REQUEST, "batch_size 0: expected 1-1024"),
        ({"queue_id": 9}, v2.BAD_REQUEST, "queue 9: topic Orders has queues 0-3"),
        ({"queue_id": -1}, v2.BAD_REQUEST, "queue -1: topic Orders has queues 0-3"),
        ({"queue_id": -(2**31)}, v2.BAD_REQUEST, f"queue {-(2**31)}: topic Orders has queues 0-3"),
        # GrpcValidator.validateInvisibleTime's words (this node's minimum is 1 s).
        ({"invisible_s": 0.5}, v2.ILLEGAL_INVISIBLE_TIME, "the invisibleTime is too small. min is 1000"),
        ({"invisible_s": 50_000}, v2.ILLEGAL_INVISIBLE_TIME, "the invisibleTime is too large. max is 43200000"),
        ({"poll_s": 61}, v2.ILLEGAL_POLLING_TIME, "long_polling_timeout 61000 ms: expected 0-60000 ms"),
    ],
)
def test_bad_receive_requests_get_their_status(node: WriterNode, changes: dict[str, object], code: int, message: str) -> None:
    send(node, 1)
    status, messages = receive(node, **changes)  # type: ignore[arg-type]
    assert (status.code, status.message, messages) == (code, message, [])
    assert receive(node)[1] != []  # nothing was handed out by the refused call


def test_a_receive_below_apaches_minimum_invisible_time_is_refused_by_default(tmp_path: Path) -> None:
    """The writer's default is Apache's proxy's: 10 s (minInvisibleTimeMillsForRecv);
    ChangeInvisibleDuration may ask 0 (its minimum is 0 there too)."""
    strict = gateway_node(tmp_path / "strict", consumer_min_invisible_ms=10_000)
    try:
        send(strict, 1)
        status, messages = receive(strict, invisible_s=9.999)
        assert (status.code, status.message, messages) == (v2.ILLEGAL_INVISIBLE_TIME, "the invisibleTime is too small. min is 10000", [])
        status, (message,) = receive(strict, invisible_s=10)
        assert status.code == v2.OK
        too_long = change(strict, message.system_properties.receipt_handle, 50_000)
        assert (too_long.status.code, too_long.status.message) == (v2.ILLEGAL_INVISIBLE_TIME, "the invisibleTime is too large. max is 43200000")
        assert change(strict, message.system_properties.receipt_handle, 0).status.code == v2.OK
    finally:
        strict.close()


def test_negative_durations_are_refused(node: WriterNode) -> None:
    send(node, 1)
    request = v2s.ReceiveMessageRequest(
        group=GROUP, message_queue=v2.MessageQueue(topic=TOPIC, id=0), batch_size=1,
        invisible_duration=duration_pb2.Duration(seconds=-5), long_polling_timeout=seconds(0),
    )  # fmt: skip
    (answer,) = list(node.v2.ReceiveMessage(request, timeout=RPC_TIMEOUT_S))
    assert (answer.status.code, answer.status.message) == (v2.ILLEGAL_INVISIBLE_TIME, "invisible_duration -5s 0ns is not a duration")
    _, (message,) = receive(node)
    response = change(node, message.system_properties.receipt_handle, 0)
    assert response.status.code == v2.OK
    bad = v2s.ChangeInvisibleDurationRequest(
        group=GROUP, topic=TOPIC, receipt_handle=response.receipt_handle, invisible_duration=duration_pb2.Duration(seconds=-1)
    )
    answer = node.v2.ChangeInvisibleDuration(bad, timeout=RPC_TIMEOUT_S)
    assert (answer.status.code, answer.status.message) == (v2.ILLEGAL_INVISIBLE_TIME, "invisible_duration -1s 0ns is not a duration")


def test_ack_without_entries_is_a_bad_request_and_several_entries_answer_each(node: WriterNode) -> None:
    send(node, 2)
    response = node.v2.AckMessage(v2s.AckMessageRequest(group=GROUP, topic=TOPIC), timeout=RPC_TIMEOUT_S)
    assert (response.status.code, response.status.message) == (v2.BAD_REQUEST, "the request has no entries")
    _, messages = receive(node)
    entries = [v2s.AckMessageEntry(message_id="a", receipt_handle=messages[0].system_properties.receipt_handle),
               v2s.AckMessageEntry(message_id="b", receipt_handle="forged")]  # fmt: skip
    response = node.v2.AckMessage(v2s.AckMessageRequest(group=GROUP, topic=TOPIC, entries=entries), timeout=RPC_TIMEOUT_S)
    assert response.status.code == v2.MULTIPLE_RESULTS
    assert [e.status.code for e in response.entries] == [v2.OK, v2.INVALID_RECEIPT_HANDLE]


def test_a_receive_takes_from_any_queue_each_starting_at_the_next(node: WriterNode) -> None:
    """Whatever queue the request names (the clients pick one per receive), every queue of
    the topic is served, each receive starting one queue further."""
    for queue_id in range(4):
        send(node, 2, queue_id=queue_id)
    picked = [(m.system_properties.queue_id, m.system_properties.queue_offset) for m in receive(node, queue_id=3, batch=3)[1]]
    assert picked == [(0, 0), (0, 1), (1, 0)]
    picked = [(m.system_properties.queue_id, m.system_properties.queue_offset) for m in receive(node, queue_id=3, batch=3)[1]]
    assert picked == [(1, 1), (2, 0), (2, 1)]
    picked = [(m.system_properties.queue_id, m.system_properties.queue_offset) for m in receive(node, queue_id=0, batch=8)[1]]
    assert picked == [(3, 0), (3, 1)]


def test_two_groups_each_get_every_message_and_one_groups_consumers_share(node: WriterNode) -> None:
    send(node, 10)
    _, first = receive(node, batch=6)
    _, second = receive(node, batch=32)  # another consumer of the group: the rest only
    assert bodies(first) + bodies(second) == [f"m{i}".encode() for i in range(10)]
    _, other = receive(node, group=v2.Resource(name="billing"))
    assert bodies(other) == [f"m{i}".encode() for i in range(10)]


def test_fifo_group_holds_a_message_group_while_one_is_in_flight(node: WriterNode) -> None:
    node.messaging.consumers.fifo_groups = frozenset({"audit"})
    for i in range(6):
        node.stub.Send(
            writer_pb2.SendRequest(
                message=messages_pb2.Message(topic="Orders", body=f"m{i}".encode(), queue_id=0, properties={"__SHARDINGKEY": f"g{i % 2}"})
            ),
            timeout=RPC_TIMEOUT_S,
        )
    _, first = receive(node, invisible_s=3)  # m1's acknowledgement comes before it expires
    assert bodies(first) == [b"m0", b"m1"]  # one of each message group
    assert [m.system_properties.message_group for m in first] == ["g0", "g1"]
    assert first[0].system_properties.message_type == v2.FIFO
    assert receive(node)[1] == []  # both groups have one in flight
    assert ack(node, first[1]).status.code == v2.OK
    assert bodies(receive(node)[1]) == [b"m3"]  # g1's next; g0 still waits for m0
    _, again = receive(node, poll_s=5)  # m0's invisibility ends: m0 again, before m2
    assert bodies(again) == [b"m0"] and again[0].system_properties.delivery_attempt == 2


def test_after_max_attempts_a_message_goes_to_the_groups_dead_letter_topic(node: WriterNode) -> None:
    node.messaging.consumers.max_attempts = 2
    send(node, 1, tags="t", keys=["order-1"], properties={"region": "eu"}, uniq_key="0A0B0C0D0E0F00000000000000000001")
    for attempt in (1, 2):
        _, messages = receive(node, invisible_s=1, poll_s=3)
        assert [m.system_properties.delivery_attempt for m in messages] == [attempt]
    _, none = receive(node, poll_s=3)  # the third delivery would pass the limit: dead-lettered
    assert none == []
    assert node.messaging.consumers.committed("audit", "Orders", 0) == 1
    assert node.writer.topics.queue_count("%DLQ%audit") == 1
    dead = [r for r in node.records() if r.topic == "%DLQ%audit"]
    assert len(dead) == 1
    record = dead[0]
    assert record.body == b"m0" and record.tags == "t" and record.keys == "order-1"
    assert record.uniq_key == "0A0B0C0D0E0F00000000000000000001"
    assert {k: v for k, v in record.properties.items() if k not in ("KEYS", "TAGS", "UNIQ_KEY")} == {
        "region": "eu",
        "DLQ_ORIGIN_TOPIC": "Orders",
        "DLQ_ORIGIN_MESSAGE_ID": "0A0B0C0D0E0F00000000000000000001",
        "RETRY_TOPIC": "Orders",
        "ORIGIN_MESSAGE_ID": "0A0B0C0D0E0F00000000000000000001",
        "RECONSUME_TIME": "1",
    }


def test_forward_to_dead_letter_queue_stores_it_and_acknowledges(node: WriterNode) -> None:
    send(node, 1)
    _, (message,) = receive(node)
    request = v2s.ForwardMessageToDeadLetterQueueRequest(
        group=GROUP, topic=TOPIC, receipt_handle=message.system_properties.receipt_handle, message_id=message.system_properties.message_id,
        delivery_attempt=1, max_delivery_attempts=1,
    )  # fmt: skip
    response = node.v2.ForwardMessageToDeadLetterQueue(request, timeout=RPC_TIMEOUT_S)
    assert (response.status.code, response.status.message) == (v2.OK, "OK")
    assert [r.body for r in node.records() if r.topic == "%DLQ%audit"] == [b"m0"]
    assert node.messaging.consumers.committed("audit", "Orders", 0) == 1
    again = node.v2.ForwardMessageToDeadLetterQueue(request, timeout=RPC_TIMEOUT_S)
    assert (again.status.code, again.status.message) == (v2.INVALID_RECEIPT_HANDLE, "the message is already acknowledged")
    forged = v2s.ForwardMessageToDeadLetterQueueRequest(group=GROUP, topic=TOPIC, receipt_handle="zz")
    assert node.v2.ForwardMessageToDeadLetterQueue(forged, timeout=RPC_TIMEOUT_S).status.code == v2.INVALID_RECEIPT_HANDLE


def test_query_assignment_names_every_queue_of_the_topic(node: WriterNode) -> None:
    send(node, 1)
    response = node.v2.QueryAssignment(v2s.QueryAssignmentRequest(group=GROUP, topic=TOPIC), timeout=RPC_TIMEOUT_S)
    assert response.status.code == v2.OK
    assert [a.message_queue.id for a in response.assignments] == [0, 1, 2, 3]
    queue = response.assignments[0].message_queue
    assert (queue.topic.name, queue.permission, queue.broker.name) == ("Orders", v2.READ_WRITE, "broker-a")
    bad = node.v2.QueryAssignment(v2s.QueryAssignmentRequest(group=v2.Resource(name="a@b"), topic=TOPIC), timeout=RPC_TIMEOUT_S)
    assert bad.status.code == v2.ILLEGAL_CONSUMER_GROUP


def test_consumer_settings_carry_the_groups_retry_policy(node: WriterNode) -> None:
    settings = v2.Settings(
        client_type=v2.PUSH_CONSUMER, subscription=v2.Subscription(group=GROUP, subscriptions=[v2.SubscriptionEntry(topic=TOPIC)])
    )
    (answer,) = list(node.v2.Telemetry(iter([v2s.TelemetryCommand(settings=settings)]), timeout=RPC_TIMEOUT_S))
    assert answer.status.code == v2.OK
    policy = answer.settings.backoff_policy
    assert policy.max_attempts == 17 and policy.WhichOneof("strategy") == "customized_backoff"
    assert [d.seconds for d in policy.customized_backoff.next][:4] == [1, 5, 10, 30]
    subscription = answer.settings.subscription
    assert (subscription.fifo, subscription.long_polling_timeout.seconds, subscription.receive_batch_size) == (False, 20, 32)
    bad = v2.Settings(client_type=v2.SIMPLE_CONSUMER, subscription=v2.Subscription(group=v2.Resource(name="no spaces")))
    (refused,) = list(node.v2.Telemetry(iter([v2s.TelemetryCommand(settings=bad)]), timeout=RPC_TIMEOUT_S))
    assert refused.status.code == v2.ILLEGAL_CONSUMER_GROUP


def test_progress_files_survive_a_restart_in_apaches_layout(tmp_path: Path) -> None:
    store = tmp_path / "store"
    node = gateway_node(store)
    try:
        send(node, 6)
        _, messages = receive(node, invisible_s=600)
        assert ack(node, messages[0], messages[1], messages[3]).status.code == v2.OK
        # Asking a group's offset makes no group of it.
        peek = v2s.GetOffsetRequest(group=v2.Resource(name="peek"), message_queue=v2.MessageQueue(topic=TOPIC, id=0))
        assert node.v2.GetOffset(peek, timeout=RPC_TIMEOUT_S).offset == 0
        node.messaging.consumers.flush()
    finally:
        node.close()
    config = str(store / "config")
    assert read_offsets(config) == {("Orders", "audit"): {0: 2}}
    assert (store / "config" / "consumerOffset.json").read_text().startswith('{\n\t"offsetTable":{\n\t\t"Orders@audit":{0:2')
    state = parse_state((store / "config" / STATE_FILE_NAME).read_text())
    (queue,) = state["queues"]
    assert (queue["committed"], queue["acked"], [i[0] for i in queue["inflight"]]) == (2, [3], [2, 4, 5])
    again = gateway_node(store)
    try:
        # In flight before the restart, still invisible after it; the old handles still work.
        assert receive(again)[1] == []
        assert ack(again, messages[2], messages[4], messages[5]).status.code == v2.OK
        assert again.messaging.consumers.committed("audit", "Orders", 0) == 6
    finally:
        again.close()


def test_a_damaged_state_file_falls_back_to_the_committed_offsets(tmp_path: Path) -> None:
    store = tmp_path / "store"
    node = gateway_node(store)
    try:
        send(node, 4)
        _, messages = receive(node)
        assert ack(node, messages[0], messages[2]).status.code == v2.OK
        node.messaging.consumers.flush()
    finally:
        node.close()
    path = store / "config" / STATE_FILE_NAME
    text = path.read_text()
    path.write_text(text.replace('"acked":[2]', '"acked":[3]'))  # the checksum no longer matches
    again = gateway_node(store)
    try:
        # Everything above the committed offset comes back, acknowledged or not: none lost.
        assert bodies(receive(again)[1]) == [b"m1", b"m2", b"m3"]
    finally:
        again.close()



def test_deliveries_since_the_last_flush_are_kept_by_the_journal_a_torn_line_ends_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The store as a SIGKILL leaves it (copied while the writer runs, no flush since the
    receive): the journal's deliveries are kept; a torn last line is dropped, with a warning."""
    store = tmp_path / "store"
    node = gateway_node(store)
    try:
        send(node, 4)
        _, first = receive(node, batch=2, invisible_s=600)
        crashed = tmp_path / "crashed"
        copy_live_store(store, crashed)
    finally:
        node.close()
    journal = crashed / "config" / JOURNAL_FILE_NAME
    assert len(journal.read_bytes().splitlines()) == 2
    with journal.open("ab") as handle:
        handle.write(b'["audit","Orders",0,2,1,')  # torn by the crash
    again = gateway_node(crashed)
    try:
        assert "an unreadable line (a torn write) ends it" in caplog.text
        assert not journal.exists()  # applied to consumerState.json, then removed
        # m0 and m1 stay in flight, their handles good; the torn line's m2 was not handed out.
        _, rest = receive(again, invisible_s=600)
        assert [(m.body, m.system_properties.delivery_attempt) for m in rest] == [(b"m2", 1), (b"m3", 1)]
        assert ack(again, *first).status.code == v2.OK
        assert again.messaging.consumers.committed("audit", "Orders", 0) == 2
    finally:
        again.close()


def queue(topic: str = "Orders", queue_id: int = 0) -> v2.MessageQueue:
    return v2.MessageQueue(topic=v2.Resource(name=topic), id=queue_id)


def test_get_and_update_offset_move_the_groups_position(node: WriterNode) -> None:
    send(node, 5)
    get = v2s.GetOffsetRequest(group=GROUP, message_queue=queue())
    assert (node.v2.GetOffset(get, timeout=RPC_TIMEOUT_S).status.code, node.v2.GetOffset(get, timeout=RPC_TIMEOUT_S).offset) == (v2.OK, 0)
    update = v2s.UpdateOffsetRequest(group=GROUP, message_queue=queue(), offset=3)
    assert node.v2.UpdateOffset(update, timeout=RPC_TIMEOUT_S).status.code == v2.OK
    assert node.v2.GetOffset(get, timeout=RPC_TIMEOUT_S).offset == 3
    assert bodies(receive(node)[1]) == [b"m3", b"m4"]
    for offset in (-1, 6):
        bad = node.v2.UpdateOffset(v2s.UpdateOffsetRequest(group=GROUP, message_queue=queue(), offset=offset), timeout=RPC_TIMEOUT_S)
        assert (bad.status.code, bad.status.message) == (v2.ILLEGAL_OFFSET, f"offset {offset}: queue 0 of Orders holds 0-5")
    unknown = node.v2.GetOffset(v2s.GetOffsetRequest(group=GROUP, message_queue=queue("Nope")), timeout=RPC_TIMEOUT_S)
    assert (unknown.status.code, unknown.status.message) == (v2.TOPIC_NOT_FOUND, "topic Nope does not exist")
    past = node.v2.GetOffset(v2s.GetOffsetRequest(group=GROUP, message_queue=queue(queue_id=4)), timeout=RPC_TIMEOUT_S)
    assert (past.status.code, past.status.message) == (v2.BAD_REQUEST, "queue 4: topic Orders has queues 0-3")


def test_query_offset_beginning_end_and_timestamp_lower(node: WriterNode) -> None:
    send(node, 3)
    middle_ms = clock_past(int(time.time() * 1000))  # after the first three's store times
    clock_past(middle_ms)  # and before the next two's
    send(node, 2)

    def query(policy: int, timestamp_ms: int | None = None) -> tuple[int, int]:
        request = v2s.QueryOffsetRequest(message_queue=queue(), query_offset_policy=policy)  # type: ignore[arg-type]
        if timestamp_ms is not None:
            request.timestamp.FromMilliseconds(timestamp_ms)
        response = node.v2.QueryOffset(request, timeout=RPC_TIMEOUT_S)
        return response.status.code, response.offset

    assert query(v2.BEGINNING) == (v2.OK, 0)
    assert query(v2.END) == (v2.OK, 5)
    assert query(v2.TIMESTAMP, middle_ms) == (v2.OK, 3)  # the first stored at or after
    assert query(v2.TIMESTAMP, 0) == (v2.OK, 0)
    assert query(v2.TIMESTAMP, middle_ms + 3_600_000) == (v2.OK, 5)  # none after: the end
    missing = node.v2.QueryOffset(v2s.QueryOffsetRequest(message_queue=queue(), query_offset_policy=v2.TIMESTAMP), timeout=RPC_TIMEOUT_S)
    assert (missing.status.code, missing.status.message) == (v2.BAD_REQUEST, "query_offset_policy TIMESTAMP needs a timestamp")
    odd = node.v2.QueryOffset(v2s.QueryOffsetRequest(message_queue=queue(), query_offset_policy=9), timeout=RPC_TIMEOUT_S)  # type: ignore[arg-type]
    assert (odd.status.code, odd.status.message) == (v2.BAD_REQUEST, "query_offset_policy 9 is not BEGINNING, END or TIMESTAMP")


def test_pull_message_reads_from_an_offset_and_names_the_next(node: WriterNode) -> None:
    for tag in ("a", "b", "a", "b", "a"):
        send(node, 1, tags=tag)

    def pull(offset: int, batch: int = 2, expression: str = "*", poll_s: float = 0) -> tuple[v2.Status, list[v2.Message], int]:
        request = v2s.PullMessageRequest(
            group=GROUP, message_queue=queue(), offset=offset, batch_size=batch,
            filter_expression=v2.FilterExpression(type=v2.TAG, expression=expression), long_polling_timeout=seconds(poll_s),
        )  # fmt: skip
        answers = list(node.v2.PullMessage(request, timeout=RPC_TIMEOUT_S + poll_s))
        (status,) = [a.status for a in answers if a.HasField("status")]
        next_offsets = [a.next_offset for a in answers if a.HasField("next_offset")]
        assert len(next_offsets) == (1 if status.code in (v2.OK, v2.MESSAGE_NOT_FOUND) else 0)
        return status, [a.message for a in answers if a.HasField("message")], next_offsets[0] if next_offsets else -1

    status, messages, next_offset = pull(0)
    assert (status.code, [m.system_properties.queue_offset for m in messages], next_offset) == (v2.OK, [0, 1], 2)
    assert messages[0].system_properties.receipt_handle == ""
    _, messages, next_offset = pull(1, batch=10, expression="a")
    assert ([m.system_properties.queue_offset for m in messages], next_offset) == ([2, 4], 5)
    status, messages, next_offset = pull(5)
    assert (status.code, messages, next_offset) == (v2.MESSAGE_NOT_FOUND, [], 5)
    status, _, _ = pull(6)
    assert (status.code, status.message) == (v2.ILLEGAL_OFFSET, "offset 6: queue 0 of Orders holds 0-5")
    # A pull at the end waits for the next append.
    outcome: dict[str, object] = {}
    waiting = threading.Thread(target=lambda: outcome.update(answer=pull(5, poll_s=10)))
    waiting.start()
    wait_until(lambda: node.messaging.wakeup.waiting == 1, 10.0, "the pull to wait for the next append")
    send(node, 1)
    waiting.join(timeout=20)
    status, messages, next_offset = outcome["answer"]  # type: ignore[misc]
    assert (status.code, bodies(messages), next_offset) == (v2.OK, [b"m0"], 6)


def test_answers_larger_than_a_piece_come_whole_and_in_order(node: WriterNode) -> None:
    """A receive and a pull of 6 MB (made and sent a piece of about 1 MiB at a time) hand
    out every message, in queue order, each body whole."""
    expected = [bytes([i]) * 200_000 for i in range(30)]
    for at in range(0, 30, 5):
        messages = [messages_pb2.Message(topic="Orders", body=body, queue_id=0) for body in expected[at : at + 5]]
        node.stub.SendBatch(writer_pb2.SendBatchRequest(messages=messages), timeout=RPC_TIMEOUT_S)
    status, received = receive(node, batch=32)
    assert status.code == v2.OK and bodies(received) == expected
    assert [m.system_properties.queue_offset for m in received] == list(range(30))
    request = v2s.PullMessageRequest(
        group=GROUP, message_queue=queue(), offset=0, batch_size=32, filter_expression=v2.FilterExpression(type=v2.TAG, expression="*")
    )
    answers = list(node.v2.PullMessage(request, timeout=RPC_TIMEOUT_S))
    assert answers[0].status.code == v2.OK and answers[-1].next_offset == 30
    assert bodies([a.message for a in answers if a.HasField("message")]) == expected


def test_an_ack_in_a_fifo_group_wakes_a_poll_waiting_for_the_next_of_its_message_group(node: WriterNode) -> None:
    node.messaging.consumers.fifo_groups = frozenset({"audit"})
    send(node, 2, properties={"__SHARDINGKEY": "g"})
    _, (first,) = receive(node)
    finished = polling(node)
    assert ack(node, first).status.code == v2.OK
    status, messages, waited_s = finished()
    assert status.code == v2.OK and bodies(messages) == [b"m1"]
    assert 0.9 <= waited_s < 5.0


def test_messages_removed_by_retention_are_skipped_not_an_error(node: WriterNode) -> None:
    body = b"x" * 600_000  # each near 0.6 of a 1 MiB commit log file: one a file
    node.stub.SendBatch(
        writer_pb2.SendBatchRequest(messages=[messages_pb2.Message(topic="Orders", body=body + bytes([i]), queue_id=0) for i in range(4)]),
        timeout=RPC_TIMEOUT_S,
    )
    later_s = time.time() + 200 * 3600
    while time.localtime(later_s).tm_hour not in node.writer.config.retention_delete_hours:
        later_s += 3600
    report = node.writer.run_retention(now_s=later_s)
    assert len(report.commitlog_files) >= 1
    status, messages = receive(node)
    assert status.code == v2.OK
    kept = [m.body[-1] for m in messages]
    assert kept == list(range(4 - len(kept), 4)) and 0 < len(kept) < 4
    assert node.messaging.consumers.committed("audit", "Orders", 0) == 4 - len(kept)


@given(st.lists(st.integers(0, 40), max_size=60), st.integers(0, 5))
def test_queue_progress_commits_up_to_the_first_offset_not_done(done: list[int], start: int) -> None:
    progress = QueueProgress(start)
    for offset in done:
        progress.done(offset)
    finished = {o for o in done if o >= start}
    expected = start
    while expected in finished:
        expected += 1
    assert progress.committed == expected
    assert progress.acked == {o for o in finished if o > expected}


@pytest.mark.parametrize(
    ("expression", "tags"),
    [("*", None), ("", None), ("  *  ", None), ("a", {"a"}), ("a || b", {"a", "b"}), ("a||b||a", {"a", "b"})],
)
def test_tag_expressions(expression: str, tags: set[str] | None) -> None:
    parsed = TagFilter.parse(expression)
    assert parsed.tags == (None if tags is None else frozenset(tags))
    assert parsed.admits_tag("a") == (tags is None or "a" in tags) and parsed.admits_tag(None) == (tags is None)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "consumerState.json does not start with the rmqstore-consumer-state header"),
        ("rmqstore-consumer-state 2 00000000\n{}\n", "consumerState.json is version 2; this writer reads version 1"),
        ("rmqstore-consumer-state 1 00000000\n{}\n", "consumerState.json fails its checksum (a torn or damaged write)"),
        (render_state({"queues": []}), "consumerState.json has a good checksum but not the expected fields: 'secret'"),
    ],
)
def test_state_file_damage_is_named(text: str, problem: str) -> None:
    with pytest.raises(Corruption) as raised:
        parse_state(text)
    assert str(raised.value) == problem
    good = render_state({"secret": "00", "queues": []})
    assert parse_state(good) == {"secret": "00", "queues": []}


# Committed offsets past a queue's end; the progress files' own failures (issue 40)


def _offset_file(store: Path, table: dict[tuple[str, str], dict[int, int]]) -> None:
    from rmqstore.common.files.consumer_offsets import write_offsets

    write_offsets(str(store / "config"), table)


def test_a_hand_edited_offset_far_past_the_end_is_moved_back_counted_and_delivers_again(tmp_path: Path) -> None:
    """consumerOffset.json says {0:99999999}: before, queue 0 never delivered again."""
    reader = metric_reader()
    before = _corrected_count(reader)
    store = tmp_path / "store"
    node = gateway_node(store)
    try:
        send(node, 5)
    finally:
        node.close()
    _offset_file(store, {("Orders", "audit"): {0: 99_999_999, 1: 0}})
    again = gateway_node(store)
    try:
        assert again.messaging.consumers.committed("audit", "Orders", 0) == 5
        peek = v2s.GetOffsetRequest(group=GROUP, message_queue=v2.MessageQueue(topic=TOPIC, id=0))
        assert again.v2.GetOffset(peek, timeout=RPC_TIMEOUT_S).offset == 5
        send(again, 3)
        assert bodies(receive(again)[1]) == [b"m0", b"m1", b"m2"]
        again.messaging.consumers.flush()
    finally:
        again.close()
    assert read_offsets(str(store / "config"))[("Orders", "audit")][0] == 5  # written back corrected
    assert _corrected_count(reader) == before + 1


def _corrected_count(reader: Any) -> int:
    points = collected(reader).get("rmqstore.consumer.offsets.corrected", [])
    return sum(point.value for point in points)


def test_an_offset_past_the_end_is_moved_back_when_a_receive_meets_it(node: WriterNode) -> None:
    """The check at use: a queue ending before the group's offset at run time (the same
    rule as at load, for any path that shortens a queue)."""
    send(node, 4)
    consumers = node.messaging.consumers
    consumers.update_offset("audit", "Orders", 0, 4)
    consumers.progress[("audit", "Orders", 0)].committed = 40  # as a queue cut under it would leave it
    assert consumers.committed("audit", "Orders", 0) == 4  # GetOffset answers within the queue
    assert receive(node)[1] == []
    assert consumers.progress[("audit", "Orders", 0)].committed == 4
    send(node, 2)
    assert bodies(receive(node)[1]) == [b"m0", b"m1"]


def test_offset_file_and_bak_lost_takes_the_offsets_from_the_state_file_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """consumerOffset.json and its .bak deleted (or emptied) while consumerState.json
    names the groups: before, every group went back to its queue's oldest message without
    a word; now their offsets come from the state file, and the writer says so."""
    store = tmp_path / "store"
    node = gateway_node(store)
    try:
        send(node, 6)
        _, messages = receive(node, batch=4)
        assert ack(node, *messages).status.code == v2.OK
        node.messaging.consumers.flush()
        node.messaging.consumers.dirty = True
        node.messaging.consumers.flush()  # a .bak too
    finally:
        node.close()
    config = store / "config"
    for emptied, expected, committed in (("delete", [b"m4", b"m5"], 6), ("empty table", [b"m0"], 7)):
        (config / "consumerOffset.json.bak").unlink(missing_ok=True)
        if emptied == "delete":
            (config / "consumerOffset.json").unlink()
        else:
            _offset_file(store, {})
            (config / "consumerOffset.json.bak").unlink()
        caplog.clear()
        again = gateway_node(store)
        try:
            if emptied == "empty table":
                send(again, 1)  # at offset 6
            _, handed = receive(again)
            assert bodies(handed) == expected, emptied  # not every message from offset 0 again
            assert ack(again, *handed).status.code == v2.OK
            again.messaging.consumers.flush()
        finally:
            again.close()
        assert "is missing or empty, but" in caplog.text and "names 1 queue(s) of 1 group(s)" in caplog.text, caplog.text
        assert read_offsets(str(config))[("Orders", "audit")] == {0: committed}


def test_a_corrupt_state_file_is_set_aside_not_overwritten_and_the_new_one_is_owner_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = tmp_path / "store"
    node = gateway_node(store)
    try:
        send(node, 2)
        node.messaging.consumers.flush()
    finally:
        node.close()
    path = store / "config" / STATE_FILE_NAME
    assert path.stat().st_mode & 0o777 == 0o600  # it holds the receipt handles' secret
    damaged = path.read_text().replace(STATE_FILE_NAME[:3], "xxx", 1) + "garbage"
    path.write_text(damaged)
    again = gateway_node(store)
    try:
        again.messaging.consumers.flush()
    finally:
        again.close()
    (aside,) = (store / "config").glob(STATE_FILE_NAME + ".corrupt-*")
    assert aside.read_text() == damaged
    assert "set aside as" in caplog.text
    assert path.stat().st_mode & 0o777 == 0o600
    parse_state(path.read_text())  # a good one written anew


def test_group_names_whose_retry_or_dead_letter_topic_would_be_too_long_are_refused(node: WriterNode) -> None:
    """Before, a 123-255 character group received, but its exhausted messages could be
    neither dead-lettered (%DLQ%<group> longer than 127) nor handed out again: it stalled."""
    send(node, 1)
    longest = "g" * 120
    status, messages = receive(node, group=v2.Resource(name="g" * 121))
    assert status.code == v2.ILLEGAL_CONSUMER_GROUP and messages == []
    assert "at most 120" in status.message and "%DLQ%<group>" in status.message
    node.messaging.consumers.max_attempts = 1
    _, first = receive(node, group=v2.Resource(name=longest), invisible_s=1, poll_s=0)
    assert len(first) == 1
    _, none = receive(node, group=v2.Resource(name=longest), poll_s=3)  # exhausted: dead-lettered
    assert none == []
    assert node.writer.topics.queue_count("%DLQ%" + longest) == 1


def test_query_route_creates_no_system_or_group_topic(node: WriterNode) -> None:
    """Before, QueryRoute made %DLQ%G, TBW102 and RMQ_SYS_TRACE_TOPIC ordinary topics."""
    for name in ("%DLQ%G", "%RETRY%G", "TBW102", "RMQ_SYS_TRACE_TOPIC", "rmq_sys_wheel", "BenchmarkTest"):
        answer = node.v2.QueryRoute(v2s.QueryRouteRequest(topic=v2.Resource(name=name)), timeout=RPC_TIMEOUT_S)
        assert answer.status.code == v2.TOPIC_NOT_FOUND, (name, answer.status)
        assert node.writer.topics.queue_count(name) is None, name
        sent = node.v2.SendMessage(
            v2s.SendMessageRequest(messages=[v2.Message(
                topic=v2.Resource(name=name), body=b"x",
                system_properties=v2.SystemProperties(message_id="0A0B0C0D0E0F00000000000000000009", message_type=v2.NORMAL),
            )]), timeout=RPC_TIMEOUT_S,
        )  # fmt: skip
        assert sent.status.code in (v2.TOPIC_NOT_FOUND, v2.ILLEGAL_TOPIC), (name, sent.status)
        assert node.writer.topics.queue_count(name) is None, name
    # A group's dead-letter topic the writer made is routed like any topic.
    node.messaging.consumers.max_attempts = 1
    send(node, 1)
    receive(node, invisible_s=1)
    receive(node, poll_s=3)
    answer = node.v2.QueryRoute(v2s.QueryRouteRequest(topic=v2.Resource(name="%DLQ%audit")), timeout=RPC_TIMEOUT_S)
    assert answer.status.code == v2.OK and len(answer.message_queues) == 1


def test_more_than_128_calls_on_one_connection_are_served_128_at_a_time_the_rest_refused_unprocessed(node: WriterNode) -> None:
    """docs/security.md: a connection holds at most 128 calls on the node (HTTP/2's
    MAX_CONCURRENT_STREAMS). 300 long polls at once on one channel: never more than 128
    wait on the node; each of the others waits in the client or is refused, unprocessed,
    with UNAVAILABLE (RST_STREAM REFUSED_STREAM, HTTP/2 error code 7), which is safe to retry."""
    send(node, 1)
    receive(node)  # the group's one message is in flight: every poll below waits
    request = v2s.ReceiveMessageRequest(
        group=GROUP, message_queue=v2.MessageQueue(topic=TOPIC, id=0), batch_size=1,
        invisible_duration=seconds(30), long_polling_timeout=seconds(2),
        filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"),
    )  # fmt: skip
    peak = [0]
    sampling = threading.Event()
    sampling.set()

    def sample() -> None:
        while sampling.is_set():
            peak[0] = max(peak[0], node.messaging.wakeup.waiting)
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        calls = [node.v2.ReceiveMessage(request, timeout=30) for _ in range(300)]
        outcomes: Counter[str] = Counter()
        for call in calls:
            try:
                answers = list(call)
                assert [a.status.code for a in answers] == [v2.MESSAGE_NOT_FOUND]
                outcomes["served"] += 1
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.UNAVAILABLE and "error code 7" in (error.details() or ""), error
                outcomes["refused"] += 1
    finally:
        sampling.clear()
        sampler.join()
    assert 0 < peak[0] <= 128, peak[0]
    assert outcomes["served"] >= 128 and sum(outcomes.values()) == 300, outcomes
    doc = (Path(__file__).parent.parent / "docs" / "security.md").read_text()
    assert "| concurrent calls per connection | 128 | further calls wait in the client or are refused" in doc
