"""RocketMQ 5's MessagingService on the writer's port, through real gRPC with our own v2
stubs: routes, settings, sends stored as RocketMQ records, every refusal's v2 status."""

from __future__ import annotations

import datetime
import gzip
import hashlib
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2, timestamp_pb2
from support.inprocess import WriterNode, gateway_node
from support.stores import GATEWAY_SIZES

from rmqstore.common.files.check import check_store
from rmqstore.rocketmq_v2 import definition_pb2 as v2
from rmqstore.rocketmq_v2 import service_pb2 as v2s
from rmqstore.v1 import messages_pb2, writer_pb2
from rmqstore.writer.config import FlushPolicy
from rmqstore.writer.rocketmq5 import SERVICE_NAME as MESSAGING
from rmqstore.writer.rocketmq5 import RouteConfig
from rmqstore.writer.service import SERVICE_NAME

MESSAGE_ID = "01AABBCCDDEEFF0001000000000000000A"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[WriterNode]:
    # Orders takes every type, so that each refusal below is the one its case is about.
    started = gateway_node(tmp_path / "store", topics={"Orders": (4, "MIXED")}, flush=FlushPolicy.SYNC)
    yield started
    started.close()


def v2_message(topic: str = "Orders", body: bytes = b"hello", message_id: str = MESSAGE_ID, **system: object) -> v2.Message:
    system.setdefault("message_type", v2.NORMAL)
    properties = v2.SystemProperties(message_id=message_id, **system)  # type: ignore[arg-type]
    return v2.Message(topic=v2.Resource(name=topic), body=body, system_properties=properties)


def send(node: WriterNode, *messages: v2.Message) -> v2s.SendMessageResponse:
    return node.v2.SendMessage(v2s.SendMessageRequest(messages=messages), timeout=10)


def not_found(topic: str) -> tuple[int, str]:
    """Apache's proxy's answer for a topic it has no route for."""
    return (
        v2.TOPIC_NOT_FOUND,
        f"CODE: 17  DESC: No topic route info in name server for the topic: {topic}\n"
        "For more information, please visit the url, https://rocketmq.apache.org/docs/bestPractice/06FAQ",
    )


def test_query_route_routes_to_the_advertised_writer_with_the_topics_types(node: WriterNode) -> None:
    response = node.v2.QueryRoute(v2s.QueryRouteRequest(topic=v2.Resource(name="Orders", resource_namespace="ns")))
    assert (response.status.code, response.status.message) == (v2.OK, "OK")
    assert [q.id for q in response.message_queues] == [0, 1, 2, 3]
    endpoints = v2.Endpoints(scheme=v2.DOMAIN_NAME, addresses=[v2.Address(host="writer.example", port=8081)])
    for queue in response.message_queues:
        assert queue.topic == v2.Resource(name="Orders", resource_namespace="ns")
        assert queue.permission == v2.READ_WRITE
        assert queue.broker == v2.Broker(name="broker-a", id=0, endpoints=endpoints)
        assert list(queue.accept_message_types) == [v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION]
    # RouteActivity.parseTopicMessageType: each type accepts itself; a topic made without
    # a type is NORMAL.
    node.stub.CreateTopic(writer_pb2.CreateTopicRequest(name="Wide", queue_count=6))
    wide = node.v2.QueryRoute(v2s.QueryRouteRequest(topic=v2.Resource(name="Wide")))
    assert [(q.id, list(q.accept_message_types)) for q in wide.message_queues] == [(q, [v2.NORMAL]) for q in range(6)]
    for kind in ("FIFO", "DELAY", "TRANSACTION", "NORMAL"):
        node.stub.CreateTopic(writer_pb2.CreateTopicRequest(name=f"T{kind}", queue_count=2, message_type=kind))
        route = node.v2.QueryRoute(v2s.QueryRouteRequest(topic=v2.Resource(name=f"T{kind}")))
        assert [list(q.accept_message_types) for q in route.message_queues] == [[v2.MessageType.Value(kind)]] * 2


def test_query_route_and_send_create_no_topic_and_answer_apaches_not_found(node: WriterNode) -> None:
    """The writer auto-creates topics by default, for v1 sends; the v2 gateway never does."""
    unknown = node.v2.QueryRoute(v2s.QueryRouteRequest(topic=v2.Resource(name="Unknown")))
    assert (unknown.status.code, unknown.status.message) == not_found("Unknown")
    assert not unknown.message_queues
    refused = send(node, v2_message(topic="Unknown"))
    assert (refused.status.code, refused.status.message) == not_found("Unknown")
    assert [e.status.code for e in refused.entries] == [v2.TOPIC_NOT_FOUND]
    assert node.writer.topics.queue_count("Unknown") is None
    assert not (node.store / "consumequeue" / "Unknown").exists()
    assert node.stub.ListTopics(writer_pb2.ListTopicsRequest()).topics == [
        messages_pb2.Topic(name="Orders", queue_count=4, message_type="MIXED")
    ]


TYPED_SENDS = {
    # topic type, message: the proxy's expected and actual types (DefaultTopicMessageTypeValidator)
    "FIFO message to a NORMAL topic": ("NORMAL", {"message_type": v2.FIFO, "message_group": "g"}, "NORMAL", "FIFO"),
    "NORMAL message to a FIFO topic": ("FIFO", {}, "FIFO", "NORMAL"),
    "DELAY message to a NORMAL topic": (
        "NORMAL", {"message_type": v2.DELAY, "delivery_timestamp": timestamp_pb2.Timestamp(seconds=9)}, "NORMAL", "DELAY",
    ),
    "FIFO message to a DELAY topic": ("DELAY", {"message_type": v2.FIFO, "message_group": "g"}, "DELAY", "FIFO"),
    "NORMAL message to a DELAY topic": ("DELAY", {}, "DELAY", "NORMAL"),
    "NORMAL message to a TRANSACTION topic": ("TRANSACTION", {}, "TRANSACTION", "NORMAL"),
}


@pytest.mark.parametrize("case", sorted(TYPED_SENDS))
def test_a_send_the_topics_type_does_not_accept_is_refused_as_apaches_proxy_refuses_it(node: WriterNode, case: str) -> None:
    topic_type, system, expected, actual = TYPED_SENDS[case]
    node.writer.topics.create("Typed", 2, topic_type)
    response = send(node, _with(v2_message(topic="Typed"), **system))
    assert (response.status.code, response.status.message) == (
        v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
        "org.apache.rocketmq.proxy.common.ProxyException: TopicMessageType validate failed, "
        f"the expected type is {expected}, but actual type is {actual}",
    )
    assert [e.status.code for e in response.entries] == [v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE]
    assert node.records() == []


def test_the_type_check_reads_a_message_as_apaches_proxy_does() -> None:
    """TopicMessageType.parseFromMessageProperty: transactional first, then timed, then
    with a message group; a MIXED topic takes each (sends of transactional messages are
    another part's: here the check alone)."""
    from rmqstore.writer.rocketmq5 import V2Refusal, check_message_type

    transactional = _with(v2_message(), message_type=v2.TRANSACTION, message_group="g")
    timed_fifo = _with(v2_message(), message_type=v2.DELAY, message_group="g", delivery_timestamp=timestamp_pb2.Timestamp(seconds=9))
    for message, kind in ((transactional, "TRANSACTION"), (timed_fifo, "DELAY")):
        check_message_type(kind, message)
        check_message_type("MIXED", message)
        with pytest.raises(V2Refusal) as refused:
            check_message_type("FIFO", message)
        assert (refused.value.code, str(refused.value)) == (
            v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            "org.apache.rocketmq.proxy.common.ProxyException: TopicMessageType validate failed, "
            f"the expected type is FIFO, but actual type is {kind}",
        )


def test_typed_topics_take_their_own_type(node: WriterNode) -> None:
    node.writer.topics.create("Plain", 2, "NORMAL")
    node.writer.topics.create("Ordered", 2, "FIFO")
    assert send(node, v2_message(topic="Plain")).status.code == v2.OK
    fifo = _with(v2_message(topic="Ordered", message_id="01AABBCCDDEEFF0001000000000000000B"), message_type=v2.FIFO, message_group="g")
    assert send(node, fifo).status.code == v2.OK
    assert [r.topic for r in node.records()] == ["Plain", "Ordered"]


def test_route_endpoints_scheme_follows_the_advertised_host() -> None:
    assert RouteConfig.parse("10.1.2.3:8081").endpoints().scheme == v2.IPv4
    six = RouteConfig.parse("[2001:db8::1]:8081").endpoints()
    assert (six.scheme, six.addresses[0].host, six.addresses[0].port) == (v2.IPv6, "2001:db8::1", 8081)
    assert RouteConfig.parse("rmqstore-writer:8081").endpoints().scheme == v2.DOMAIN_NAME


@pytest.mark.parametrize(
    ("advertise", "broker", "problem"),
    [
        ("writer", "b", "--advertise: 'writer' is not HOST:PORT: no port"),
        ("writer:0", "b", "--advertise: 'writer:0' is not HOST:PORT: the port 0 is outside [1, 65535]"),
        ("writer:x", "b", "--advertise: 'writer:x' is not HOST:PORT: the port 'x' is not a number"),
        ("writer:1", "", "--broker-name '': expected a non-empty name"),
        ("writer:1", "a b", "--broker-name 'a b': expected a non-empty name"),
    ],
)
def test_route_options_refused_with_their_reason(advertise: str, broker: str, problem: str) -> None:
    from rmqstore.common.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="^" + problem.replace("(", r"\(").replace("[", r"\[")):
        RouteConfig.parse(advertise, broker)


def test_query_route_refuses_illegal_and_unknown_topics(tmp_path: Path) -> None:
    closed = gateway_node(tmp_path / "store", auto_create_topics=False)
    try:
        bad = closed.v2.QueryRoute(v2s.QueryRouteRequest(topic=v2.Resource(name="no/such")))
        assert bad.status.code == v2.ILLEGAL_TOPIC
        assert bad.status.message == "the topic 'no/such' contains characters outside [%|a-zA-Z0-9_-]"
        assert not bad.message_queues
        system = closed.v2.QueryRoute(v2s.QueryRouteRequest(topic=v2.Resource(name="SCHEDULE_TOPIC_XXXX")))
        assert system.status.code == v2.ILLEGAL_TOPIC
        for reserved in ("TBW102", "RMQ_SYS_TRACE_TOPIC", "%DLQ%G", "%RETRY%G"):
            route = closed.v2.QueryRoute(v2s.QueryRouteRequest(topic=v2.Resource(name=reserved)))
            assert (route.status.code, route.status.message) == not_found(reserved)
        unknown = closed.v2.QueryRoute(v2s.QueryRouteRequest(topic=v2.Resource(name="Orders")))
        assert (unknown.status.code, unknown.status.message) == not_found("Orders")
        refused = send(closed, v2_message())
        assert (refused.status.code, refused.status.message) == not_found("Orders")
        assert [e.status.code for e in refused.entries] == [v2.TOPIC_NOT_FOUND]
        assert closed.writer.topics.snapshot() == {}
    finally:
        closed.close()


def test_telemetry_answers_each_settings_and_stays_open(node: WriterNode) -> None:
    settings = v2.Settings(
        client_type=v2.PRODUCER,
        access_point=v2.Endpoints(scheme=v2.IPv4, addresses=[v2.Address(host="127.0.0.1", port=1)]),
        publishing=v2.Publishing(topics=[v2.Resource(name="Orders")], max_body_size=128 << 20, validate_message_type=True),
        user_agent=v2.UA(language=v2.PYTHON, version="5.1.2"),
    )
    import queue

    outgoing: queue.Queue[v2s.TelemetryCommand | None] = queue.Queue()

    def commands() -> Iterator[v2s.TelemetryCommand]:
        while (command := outgoing.get(timeout=10)) is not None:
            yield command

    stream = node.v2.Telemetry(commands(), timeout=20)
    outgoing.put(v2s.TelemetryCommand(settings=settings))
    first = next(stream)
    assert (first.status.code, first.status.message) == (v2.OK, "OK")
    answer = first.settings
    assert answer.publishing.max_body_size == 4 * 1024 * 1024  # the writer's real limit
    assert [t.name for t in answer.publishing.topics] == ["Orders"] and answer.publishing.validate_message_type
    assert answer.user_agent == settings.user_agent and answer.access_point == settings.access_point
    backoff = answer.backoff_policy
    assert backoff.max_attempts == 3 and backoff.WhichOneof("strategy") == "exponential_backoff"
    exponential = backoff.exponential_backoff
    assert (exponential.initial.ToMilliseconds(), exponential.max.ToMilliseconds(), exponential.multiplier) == (10, 1000, 2.0)
    # Commands other than settings are read and dropped; the stream is still open after them.
    outgoing.put(v2s.TelemetryCommand(thread_stack_trace=v2s.ThreadStackTrace(nonce="n")))
    settings.backoff_policy.max_attempts = 5
    outgoing.put(v2s.TelemetryCommand(settings=settings))
    second = next(stream)
    assert second.status.code == v2.OK and second.settings.backoff_policy.max_attempts == 5
    # A consumer's settings get the group's retries (tests/test_rocketmq5_consumers.py);
    # the client types the writer does not serve, NOT_IMPLEMENTED.
    consumer = v2.Settings(client_type=v2.SIMPLE_CONSUMER, subscription=v2.Subscription(group=v2.Resource(name="g")))
    outgoing.put(v2s.TelemetryCommand(settings=consumer))
    third = next(stream)
    assert third.status.code == v2.OK and third.settings.backoff_policy.max_attempts == 17
    outgoing.put(v2s.TelemetryCommand(settings=v2.Settings(client_type=v2.PULL_CONSUMER)))
    pulling = next(stream)
    assert (pulling.status.code, pulling.status.message) == (v2.NOT_IMPLEMENTED, "PULL_CONSUMER clients are not served by rmqstore")
    unknown = v2.Settings(client_type=77)  # type: ignore[arg-type]
    outgoing.put(v2s.TelemetryCommand(settings=unknown))
    fourth = next(stream)
    assert (fourth.status.code, fourth.status.message) == (v2.UNRECOGNIZED_CLIENT_TYPE, "client_type 77 is not a client type")
    outgoing.put(None)
    assert list(stream) == []


def test_end_streams_closes_open_telemetry_streams(node: WriterNode) -> None:
    import queue

    outgoing: queue.Queue[v2s.TelemetryCommand | None] = queue.Queue()

    def commands() -> Iterator[v2s.TelemetryCommand]:
        while (command := outgoing.get(timeout=20)) is not None:
            yield command

    stream = node.v2.Telemetry(commands(), timeout=20)
    outgoing.put(v2s.TelemetryCommand(settings=v2.Settings(client_type=v2.PRODUCER)))
    assert next(stream).status.code == v2.OK
    node.serving.call(node.messaging.end_streams())
    assert list(stream) == []  # ended by the server, cleanly, while the client still had it open
    assert stream.code() == grpc.StatusCode.OK
    later = node.v2.Telemetry(iter([v2s.TelemetryCommand(settings=v2.Settings(client_type=v2.PRODUCER))]), timeout=20)
    assert list(later) == []  # a stream opened while stopping ends at once
    outgoing.put(None)


def test_heartbeat_and_termination_answer_ok(node: WriterNode) -> None:
    beat = node.v2.Heartbeat(v2s.HeartbeatRequest(client_type=v2.PRODUCER))
    assert (beat.status.code, beat.status.message) == (v2.OK, "OK")
    bye = node.v2.NotifyClientTermination(v2s.NotifyClientTerminationRequest())
    assert bye.status.code == v2.OK
    odd = node.v2.Heartbeat(v2s.HeartbeatRequest(client_type=9))  # type: ignore[arg-type]
    assert (odd.status.code, odd.status.message) == (v2.UNRECOGNIZED_CLIENT_TYPE, "client_type 9 is not a client type")


def test_send_message_stores_a_rocketmq_record(node: WriterNode) -> None:
    born = timestamp_pb2.Timestamp(seconds=1_700_000_000, nanos=123_000_000)
    plain = v2_message(
        body=b"order 1",
        tag="TagA",
        keys=["order-1", "customer-7"],
        born_timestamp=born,
        born_host="192.0.2.7",
        body_digest=v2.Digest(type=v2.CRC32, checksum=f"{zlib.crc32(b'order 1'):X}"),
        body_encoding=v2.IDENTITY,
    )
    plain.user_properties["region"] = "eu"
    fifo = v2_message(
        body=b"step 1", message_id=MESSAGE_ID[:-1] + "B", message_group="cart-9", message_type=v2.FIFO
    )
    response = send(node, plain, fifo)
    assert (response.status.code, response.status.message) == (v2.OK, "OK")
    # The transaction id is the message id, as Apache's broker and proxy answer it.
    assert [(e.status.code, e.message_id, e.transaction_id, e.offset) for e in response.entries] == [
        (v2.OK, MESSAGE_ID, MESSAGE_ID, 0),
        (v2.OK, MESSAGE_ID[:-1] + "B", MESSAGE_ID[:-1] + "B", 1),  # the round robin's first queue is 0 too
    ]
    first, second = node.records()
    assert first.topic == "Orders" and first.body == b"order 1"
    assert first.properties == {
        "UNIQ_KEY": MESSAGE_ID, "KEYS": "order-1 customer-7", "TAGS": "TagA", "region": "eu", "__BORNHOST": "192.0.2.7",
    }  # fmt: skip
    assert first.born_timestamp_ms == 1_700_000_000_123
    assert first.born_host.ip == bytes([127, 0, 0, 1]) and first.born_host.port > 0  # the connection
    # The queue id a client sends (0 here, from a caller that names no language) is kept.
    assert (second.queue_id, second.queue_offset, second.properties["__SHARDINGKEY"]) == (0, 1, "cart-9")
    assert check_store(str(node.store), GATEWAY_SIZES).ok


def test_born_host_is_kept_as_the_client_sent_it_and_the_record_holds_the_connection(node: WriterNode) -> None:
    """As Apache's proxy (SendMessageActivity): the client's born host, an IP or a host name
    (the Java and Node.js clients send their host name), is the __BORNHOST property, else
    the connection's address; the record's born host is the connection's address, which
    existed (not the client's IP with the connection's port). A receive hands back
    __BORNHOST as the born host."""
    given = ["192.0.2.7", "2001:db8::7", "laptop.example", ""]
    messages = [v2_message(message_id=f"{MESSAGE_ID[:-1]}{n}", born_host=host) for n, host in enumerate(given)]
    response = send(node, *messages)
    assert [e.status.code for e in response.entries] == [v2.OK] * 4
    records = node.records()
    hosts = [record.born_host for record in records]
    port = hosts[0].port
    assert port > 0 and all(host == hosts[0] for host in hosts)  # one connection
    assert hosts[0].ip == bytes([127, 0, 0, 1])
    assert [r.properties["__BORNHOST"] for r in records] == ["192.0.2.7", "2001:db8::7", "laptop.example", f"127.0.0.1:{port}"]
    request = v2s.ReceiveMessageRequest(
        group=v2.Resource(name="g"), message_queue=v2.MessageQueue(topic=v2.Resource(name="Orders"), id=0),
        filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"), batch_size=8,
        invisible_duration=duration_pb2.Duration(seconds=30), long_polling_timeout=duration_pb2.Duration(),
    )  # fmt: skip
    received = [a.message for a in node.v2.ReceiveMessage(request, timeout=10) if a.HasField("message")]
    assert [(m.system_properties.born_host, dict(m.user_properties)) for m in received] == [
        ("192.0.2.7", {}), ("2001:db8::7", {}), ("laptop.example", {}), (f"127.0.0.1:{port}", {}),
    ]  # fmt: skip
    refused = send(node, _with(v2_message(), user_properties={"__BORNHOST": "x"}))
    assert refused.status.code == v2.ILLEGAL_MESSAGE_PROPERTY_KEY
    assert refused.status.message == "user property name '__BORNHOST' is empty, reserved or holds 0x01/0x02"


def test_fifo_queue_chosen_by_the_client_is_kept(node: WriterNode) -> None:
    node.v2.QueryRoute(v2s.QueryRouteRequest(topic=v2.Resource(name="Orders")))
    offsets = []
    for n in range(3):
        message = v2_message(message_id=f"{MESSAGE_ID[:-2]}{n:02d}", queue_id=3, message_group="g", message_type=v2.FIFO)
        response = send(node, message)
        offsets.append(response.entries[0].offset)
    assert offsets == [0, 1, 2]
    assert [(r.queue_id, r.queue_offset) for r in node.records()] == [(3, 0), (3, 1), (3, 2)]


def test_clients_that_send_no_queue_id_get_the_python_clients_group_placement(node: WriterNode) -> None:
    node.v2.QueryRoute(v2s.QueryRouteRequest(topic=v2.Resource(name="Orders")))
    python = (("x-mq-language", "PYTHON"),)
    for n, group in enumerate(["cart-1", "cart-2", "cart-3", "cart-1"]):
        message = v2_message(message_id=f"{MESSAGE_ID[:-2]}{n:02d}", message_group=group, message_type=v2.FIFO)
        assert node.v2.SendMessage(v2s.SendMessageRequest(messages=[message]), metadata=python).status.code == v2.OK
    for n in range(4, 8):
        message = v2_message(message_id=f"{MESSAGE_ID[:-2]}{n:02d}")
        assert node.v2.SendMessage(v2s.SendMessageRequest(messages=[message]), metadata=python).status.code == v2.OK
    records = node.records()
    expected = [int.from_bytes(hashlib.sha256(g.encode()).digest(), "big") % 4 for g in ["cart-1", "cart-2", "cart-3", "cart-1"]]
    assert [r.queue_id for r in records[:4]] == expected
    assert sorted(r.queue_id for r in records[4:]) == [0, 1, 2, 3]  # the writer's round robin


@pytest.mark.parametrize(
    ("digest", "stored"),
    [
        (v2.Digest(type=v2.CRC32, checksum=f"{zlib.crc32(b'payload'):X}"), True),  # Java: upper-case hex
        (v2.Digest(type=v2.CRC32, checksum=str(zlib.crc32(b"payload"))), True),  # WriterNode.js: decimal
        (v2.Digest(type=v2.MD5, checksum=hashlib.md5(b"payload").hexdigest().upper()), True),
        (v2.Digest(type=v2.SHA1, checksum=hashlib.sha1(b"payload").hexdigest()), True),
        (v2.Digest(type=v2.CRC32, checksum="DEADBEEF"), False),
        (v2.Digest(type=v2.MD5, checksum="00" * 16), False),
        (v2.Digest(type=v2.SHA1, checksum="nonsense"), False),
    ],
)
def test_body_digest_checked(node: WriterNode, digest: v2.Digest, stored: bool) -> None:
    response = send(node, v2_message(body=b"payload", body_digest=digest))
    if stored:
        assert response.status.code == v2.OK
        assert [r.body for r in node.records()] == [b"payload"]
    else:
        assert response.status.code == v2.MESSAGE_CORRUPTED
        name = v2.DigestType.Name(digest.type)
        assert response.status.message == f"invalid body digest: the body's {name} is not {digest.checksum!r}"
        assert node.records() == []


def test_gzip_body_stored_decoded(node: WriterNode) -> None:
    packed = gzip.compress(b"squeezed " * 100)
    message = v2_message(body=packed, body_encoding=v2.GZIP, body_digest=v2.Digest(type=v2.MD5, checksum=hashlib.md5(packed).hexdigest()))
    assert send(node, message).status.code == v2.OK
    assert [r.body for r in node.records()] == [b"squeezed " * 100]


def _with(message: v2.Message, **changes: object) -> v2.Message:
    for name, value in changes.items():
        if name == "user_properties":
            message.user_properties.update(value)  # type: ignore[call-overload]
        elif name == "keys":
            message.system_properties.keys.extend(value)  # type: ignore[arg-type]
        elif name in ("body_digest", "delivery_timestamp"):
            getattr(message.system_properties, name).CopyFrom(value)
        else:
            setattr(message.system_properties, name, value)
    return message


def _huge_gzip() -> bytes:
    return gzip.compress(bytes(4 * 1024 * 1024 + 1))


BAD_V2 = {
    "topic with a slash": (v2_message(topic="a/b"), v2.ILLEGAL_TOPIC, "the topic 'a/b' contains characters outside"),
    "blank topic": (v2_message(topic=""), v2.ILLEGAL_TOPIC, "the topic is blank"),
    "topic too long": (v2_message(topic="t" * 128), v2.ILLEGAL_TOPIC, "the topic is 128 characters; at most 127"),
    "system topic": (v2_message(topic="RMQ_SYS_TRANS_HALF_TOPIC"), v2.ILLEGAL_TOPIC, "is a system topic"),
    "oversized body": (v2_message(body=bytes(4 * 1024 * 1024 + 1)), v2.MESSAGE_BODY_TOO_LARGE, "the body is 4194305 bytes; at most 4194304"),
    "oversized gzip body": (_with(v2_message(body=_huge_gzip()), body_encoding=v2.GZIP), v2.MESSAGE_BODY_TOO_LARGE, "decodes to more than 4194304"),
    "not gzip": (_with(v2_message(body=b"plain"), body_encoding=v2.GZIP), v2.MESSAGE_CORRUPTED, "is marked GZIP but does not decode"),
    "empty body": (v2_message(body=b""), v2.MESSAGE_BODY_EMPTY, "the message body is empty"),
    "missing message id": (v2_message(message_id=""), v2.ILLEGAL_MESSAGE_ID, "the message has no message_id"),
    "message id with a dash": (v2_message(message_id="01-AB"), v2.ILLEGAL_MESSAGE_ID, "message_id must be 1-128 ASCII letters"),
    "key with a space": (_with(v2_message(), keys=["a b"]), v2.ILLEGAL_MESSAGE_KEY, "key 'a b' must be 1-255 characters"),
    "empty key": (_with(v2_message(), keys=[""]), v2.ILLEGAL_MESSAGE_KEY, "key '' must be"),
    "33 keys": (_with(v2_message(), keys=[f"k{n}" for n in range(33)]), v2.ILLEGAL_MESSAGE_KEY, "33 keys; at most 32"),
    "tag with a bar": (_with(v2_message(), tag="a||b"), v2.ILLEGAL_MESSAGE_TAG, "tag 'a||b' is blank or holds"),
    "blank tag": (_with(v2_message(), tag=" "), v2.ILLEGAL_MESSAGE_TAG, "tag ' ' is blank"),
    "reserved property": (_with(v2_message(), user_properties={"UNIQ_KEY": "x"}), v2.ILLEGAL_MESSAGE_PROPERTY_KEY, "user property name 'UNIQ_KEY'"),
    "sharding key property": (_with(v2_message(), user_properties={"__SHARDINGKEY": "x"}), v2.ILLEGAL_MESSAGE_PROPERTY_KEY, "'__SHARDINGKEY' is empty, reserved"),
    "empty property value": (_with(v2_message(), user_properties={"a": ""}), v2.BAD_REQUEST, "user property a has an empty value"),
    "properties too large": (_with(v2_message(), user_properties={"big": "v" * 33000}), v2.MESSAGE_PROPERTIES_TOO_LARGE, "more than the 32767 bytes"),
    "FIFO without a group": (_with(v2_message(), message_type=v2.FIFO), v2.ILLEGAL_MESSAGE_GROUP, "a FIFO message needs a message_group"),
    "NORMAL with a group": (_with(v2_message(), message_group="g"), v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a NORMAL message has no message_group"),
    "LITE": (_with(v2_message(), message_type=v2.LITE), v2.UNSUPPORTED, "LITE messages are not supported"),
    "transaction property": (_with(v2_message(), user_properties={"TRAN_MSG": "true"}), v2.ILLEGAL_MESSAGE_PROPERTY_KEY, "user property name 'TRAN_MSG'"),
    "producer group property": (_with(v2_message(), user_properties={"PGROUP": "g"}), v2.ILLEGAL_MESSAGE_PROPERTY_KEY, "user property name 'PGROUP'"),
    "recovery time too long": (
        _with(v2_message(), message_type=v2.TRANSACTION, orphaned_transaction_recovery_duration=datetime.timedelta(seconds=3601)),
        v2.BAD_REQUEST, "the max transaction recovery time of message is too large, max is 3600",
    ),
    "delivery time beyond the timer": (
        _with(v2_message(), message_type=v2.DELAY, delivery_timestamp=timestamp_pb2.Timestamp(seconds=int(time.time()) + 4 * 86400)),
        v2.ILLEGAL_DELIVERY_TIME, "the max delay time of message is too large, max is 259200000",
    ),
    "unknown message type": (_with(v2_message(), message_type=99), v2.BAD_REQUEST, "message_type 99 is not a message type"),
    "unknown encoding": (_with(v2_message(), body_encoding=7), v2.BAD_REQUEST, "body_encoding 7 is not IDENTITY or GZIP"),
    "unknown digest type": (_with(v2_message(), body_digest=v2.Digest(type=9, checksum="x")), v2.BAD_REQUEST, "body_digest type 9 is not"),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("case", sorted(BAD_V2))
def test_bad_v2_input_gets_its_status_and_the_writer_keeps_serving(node: WriterNode, case: str) -> None:
    message, code, text = BAD_V2[case]
    response = send(node, message)
    assert v2.Code.Name(response.status.code) == v2.Code.Name(code)
    assert text in response.status.message
    assert [e.status.code for e in response.entries] == [code]
    assert node.records() == []
    assert send(node, v2_message()).status.code == v2.OK
    assert len(node.records()) == 1


def test_a_bad_message_in_a_request_is_named_and_refuses_the_request(node: WriterNode) -> None:
    response = send(node, v2_message(), v2_message(message_id=""))
    assert response.status.code == v2.ILLEGAL_MESSAGE_ID
    assert response.status.message == "message 2: the message has no message_id"
    assert [e.status.code for e in response.entries] == [v2.ILLEGAL_MESSAGE_ID] * 2
    assert node.records() == []


def test_empty_request_is_a_bad_request(node: WriterNode) -> None:
    response = send(node)
    assert (response.status.code, response.status.message) == (v2.BAD_REQUEST, "the request has no messages")


def test_disk_full_is_too_many_requests(tmp_path: Path) -> None:
    full = gateway_node(tmp_path / "store", topics={"Orders": (4, "NORMAL")}, disk_full_ratio=0.0)
    try:
        response = send(full, v2_message())
        assert response.status.code == v2.TOO_MANY_REQUESTS
        assert "writes are refused" in response.status.message
    finally:
        full.close()


@pytest.mark.parametrize(
    ("call", "request_type", "streams"),
    [
        ("SyncLiteSubscription", v2s.SyncLiteSubscriptionRequest, False),
    ],
)
def test_calls_not_served_answer_a_v2_status(node: WriterNode, call: str, request_type: type, streams: bool) -> None:
    method = getattr(node.v2, call)
    answers = list(method(request_type(), timeout=10)) if streams else [method(request_type(), timeout=10)]
    assert len(answers) == 1
    assert answers[0].status.code == v2.NOT_IMPLEMENTED
    assert answers[0].status.message == f"{call} is not served by the rmqstore writer"


def test_reflection_v1_and_v1alpha_list_both_services(node: WriterNode) -> None:
    from grpc_reflection.v1alpha import reflection_pb2

    for path in ("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"):
        info = node.channel.stream_stream(
            path,
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        answers = list(info(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10))
        names = {s.name for s in answers[0].list_services_response.service}
        assert {SERVICE_NAME, MESSAGING, "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} <= names
        described = list(info(iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol=MESSAGING)]), timeout=10))
        assert described[0].file_descriptor_response.file_descriptor_proto  # grpcurl can describe it


@pytest.mark.parametrize(
    "method", [m for m in v2s.DESCRIPTOR.services_by_name["MessagingService"].methods], ids=lambda m: m.name
)
def test_bytes_that_do_not_parse_are_invalid_argument(node: WriterNode, method: Any) -> None:
    """Malformed bytes on any v2 method: INVALID_ARGUMENT naming the request type (gRPC's
    own status, since no v2 message could be read), and the writer keeps serving."""
    path = f"/{MESSAGING}/{method.name}"
    payload = b"\x0a\x05ab"  # a length-delimited field that claims more bytes than follow
    with pytest.raises(grpc.RpcError) as caught:
        if method.client_streaming:
            list(node.channel.stream_stream(path)(iter([payload]), timeout=10))
        elif method.server_streaming:
            list(node.channel.unary_stream(path)(payload, timeout=10))
        else:
            node.channel.unary_unary(path)(payload, timeout=10)
    error: Any = caught.value
    assert (error.code(), error.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        f"malformed request: the bytes do not parse as {method.input_type.full_name}",
    )
    assert send(node, v2_message()).status.code == v2.Code.OK


def test_a_clients_trace_context_is_stored_as_the_traceparent_property(node: WriterNode) -> None:
    """The official clients send their producer span's context in the system properties:
    it is kept as an ordinary ``traceparent`` property (the writer's dispatch and a
    consumer link to it); a user property of that name wins; a value RocketMQ's format
    cannot hold is left out, and the message is still stored."""
    context = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    traced = v2_message(body=b"traced", trace_context=context)
    own = v2_message(body=b"own", message_id=MESSAGE_ID[:-1] + "B", trace_context=context)
    own.user_properties["traceparent"] = "00-11111111111111111111111111111111-2222222222222222-01"
    unholdable = v2_message(body=b"odd", message_id=MESSAGE_ID[:-1] + "C", trace_context="00-\x01")
    response = send(node, traced, own, unholdable)
    assert [e.status.code for e in response.entries] == [v2.OK] * 3
    first, second, third = node.records()
    assert first.properties["traceparent"] == context
    assert second.properties["traceparent"] == "00-11111111111111111111111111111111-2222222222222222-01"
    assert "traceparent" not in third.properties and third.body == b"odd"


# EndTransaction (EndTransactionActivity, TransactionProcessor): the data a half message's
# receipt left, taken once by (topic, transaction id).
TRANSACTION_DATA_NOT_FOUND = (v2.INTERNAL_SERVER_ERROR, "org.apache.rocketmq.proxy.common.ProxyException: cannot found transaction data")


def end_transaction(
    node: WriterNode, topic: str, transaction_id: str, message_id: str = MESSAGE_ID, resolution: int = v2.COMMIT
) -> tuple[int, str]:
    request = v2s.EndTransactionRequest(
        topic=v2.Resource(name=topic), message_id=message_id, transaction_id=transaction_id, resolution=resolution,  # type: ignore[arg-type]
        source=v2.SOURCE_CLIENT,
    )  # fmt: skip
    answer = node.v2.EndTransaction(request, timeout=10)
    return answer.status.code, answer.status.message


def committed_uniq_keys(node: WriterNode, topic: str) -> list[str]:
    from rmqstore.common.codec import sysflag

    keys = []
    for queue_id in range(4):
        queue = node.writer.queues.find(topic, queue_id)
        for _, unit in queue.units() if queue is not None else ():
            record = node.writer.log.read(unit.commitlog_offset)
            if sysflag.transaction_type(record.sys_flag) == sysflag.TRANSACTION_COMMIT or record.properties.get("TRAN_MSG") is None:
                keys.append(record.uniq_key)
    return keys


def test_end_transaction_answers_bad_input_as_apaches_proxy(node: WriterNode) -> None:
    sent = send(node, v2_message(message_type=v2.TRANSACTION, message_id="TX1"))
    assert sent.status.code == v2.OK
    # The broker's transaction id is the message id (SendMessageProcessor: getUniqID).
    assert (sent.entries[0].message_id, sent.entries[0].transaction_id) == ("TX1", "TX1")
    assert send(node, v2_message(message_id="PLAIN1")).status.code == v2.OK
    assert end_transaction(node, "Orders", "") == (v2.INVALID_TRANSACTION_ID, "transaction id cannot be empty")
    assert end_transaction(node, "Orders", "  ") == (v2.INVALID_TRANSACTION_ID, "transaction id cannot be empty")
    assert end_transaction(node, "Orders", "NOPE") == TRANSACTION_DATA_NOT_FOUND  # unknown
    assert end_transaction(node, "Orders", "\x01garbled id\x02") == TRANSACTION_DATA_NOT_FOUND
    assert end_transaction(node, "Orders", "PLAIN1") == TRANSACTION_DATA_NOT_FOUND  # not a transaction's message
    assert end_transaction(node, "Other", "TX1") == TRANSACTION_DATA_NOT_FOUND  # the data is its topic's
    assert end_transaction(node, "bad topic!", "TX1")[0] == v2.ILLEGAL_TOPIC
    # The message id is not looked at (only handed to the broker): the commit applies.
    assert end_transaction(node, "Orders", "TX1", message_id="garbled") == (v2.OK, "OK")
    assert end_transaction(node, "Orders", "TX1") == TRANSACTION_DATA_NOT_FOUND  # taken once: a repeat is not found
    assert end_transaction(node, "Orders", "TX1", resolution=v2.ROLLBACK) == TRANSACTION_DATA_NOT_FOUND
    assert sorted(committed_uniq_keys(node, "Orders")) == ["PLAIN1", "TX1"]


def test_end_transaction_after_the_data_expired_is_not_found(node: WriterNode) -> None:
    node.messaging.transaction_data.expire_ms = -1  # every entry expired once kept
    assert send(node, v2_message(message_type=v2.TRANSACTION, message_id="TX2")).status.code == v2.OK
    assert end_transaction(node, "Orders", "TX2") == TRANSACTION_DATA_NOT_FOUND


def test_a_rolled_back_half_message_never_reaches_its_topic(node: WriterNode) -> None:
    from rmqstore.common.codec.consumequeue import HALF_TOPIC, OP_TOPIC

    for message_id in ("TXC", "TXR"):
        assert send(node, v2_message(message_type=v2.TRANSACTION, message_id=message_id)).status.code == v2.OK
    assert end_transaction(node, "Orders", "TXR", resolution=v2.ROLLBACK) == (v2.OK, "OK")
    assert end_transaction(node, "Orders", "TXC") == (v2.OK, "OK")
    # An unspecified resolution takes the data (UNKNOWN: the broker does nothing) and answers OK.
    assert send(node, v2_message(message_type=v2.TRANSACTION, message_id="TXU")).status.code == v2.OK
    assert end_transaction(node, "Orders", "TXU", resolution=v2.TRANSACTION_RESOLUTION_UNSPECIFIED) == (v2.OK, "OK")
    assert committed_uniq_keys(node, "Orders") == ["TXC"]
    assert node.writer.queues.find(HALF_TOPIC, 0).max_offset == 3  # type: ignore[union-attr]
    assert node.writer.queues.find(OP_TOPIC, 0).max_offset == 2  # type: ignore[union-attr]
