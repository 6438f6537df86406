"""The official RocketMQ 5 Python client (rocketmq-python-client, in its own virtualenv,
unmodified) against a writer with --acl: signed with the right access key and secret
its sends are accepted and found; with a wrong secret, an unknown key or no credentials
it is refused; a user allowed Pub on ``orders-*`` only is refused elsewhere, and refused
the creation of a new topic; each refusal is the exact outcome the client reports, and
counted. Also the rules of every v2 method, called directly over gRPC."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.inprocess import WriterNode
from support.nodes import Nodes
from support.rmq5 import DRIVERS, client_env, rmq5_python, run_node
from support.stores import SIZE_ARGS

from rmqstore.client.signing import signing_channel
from rmqstore.rocketmq_v2 import definition_pb2 as v2
from rmqstore.rocketmq_v2 import service_pb2 as v2s
from rmqstore.rocketmq_v2 import service_pb2_grpc
from rmqstore.service.listen import ListenOptions
from rmqstore.v1 import query_pb2, query_pb2_grpc, writer_pb2, writer_pb2_grpc
from rmqstore.writer.rocketmq5 import SERVICE_NAME as MESSAGING_SERVICE

RPC_TIMEOUT_S = 15.0
CLIENT_TIMEOUT_S = 120.0
ACL = """
users:
  - accessKey: ops
    secretKey: ops-secret-1
    userType: Super
  - accessKey: orders
    secretKey: orders-secret-1
  - accessKey: pubonly
    secretKey: pubonly-secret-1
  - accessKey: watcher
    secretKey: watcher-secret-1
acls:
  - subject: User:orders
    policies:
      - resource: ["Topic:orders-*"]
        actions: [Pub, Create]
  - subject: User:pubonly
    policies:
      - resource: ["Topic:orders-*"]
        actions: [Pub]
  - subject: User:watcher
    policies:
      - resource: ["Topic:orders-*", "Group:audit"]
        actions: [Sub]
"""
SECRETS = {"ops": "ops-secret-1", "orders": "orders-secret-1", "pubonly": "pubonly-secret-1", "watcher": "watcher-secret-1"}


def no_route(topic: str) -> dict[str, str]:
    """What the client hands the application when its route query is refused: its own
    words, whatever the status (which it logs)."""
    return {"topic": topic, "error": "Exception", "message": f"failed to fetch topic:{topic} route."}


class Client:
    """Runs tests/rocketmq5/acl_producer.py: one producer, one send per topic."""

    def __init__(self, tmp_path: Path, endpoint: str):
        self.tmp_path = tmp_path
        self.endpoint = endpoint
        self.runs = 0

    def send(self, access_key: str, secret_key: str, *topics: str, tz: str = "UTC") -> tuple[list[dict[str, Any]], str]:
        """The outcome of each send and the client's log of the run (``tz``: the client's
        time zone)."""
        self.runs += 1
        home = self.tmp_path / f"client-home-{self.runs}"
        home.mkdir()
        done = subprocess.run(
            [rmq5_python(), str(DRIVERS / "acl_producer.py"), self.endpoint, access_key, secret_key, *topics],
            capture_output=True, timeout=CLIENT_TIMEOUT_S, env={**client_env(home), "TZ": tz}, cwd=self.tmp_path, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
        log = home / "logs" / "rocketmq_python" / "rocketmq_client.log"
        return [json.loads(line) for line in done.stdout.splitlines()], log.read_text(errors="replace")


def receipt(line: dict[str, Any], topic: str) -> str:
    assert line["topic"] == topic and "error" not in line, line
    assert isinstance(line["message_id"], str) and line["message_id"]
    return str(line["message_id"])


def test_the_official_python_client_is_accepted_with_its_key_and_refused_without(nodes: Nodes, tmp_path: Path) -> None:
    acl_path = tmp_path / "acl.yaml"
    acl_path.write_text(ACL)
    store = tmp_path / "store"
    writer = nodes.start("writer", store, *SIZE_ARGS, "--acl", str(acl_path))
    assert writer.serving["acl"] is True
    client = Client(tmp_path, writer.endpoint)
    with signing_channel(grpc.insecure_channel(writer.endpoint), "ops", SECRETS["ops"]) as ops:
        for topic in ("orders-1", "orders-2"):
            writer_pb2_grpc.WriterServiceStub(ops).CreateTopic(writer_pb2.CreateTopicRequest(name=topic, queue_count=4), timeout=RPC_TIMEOUT_S)

    # The right key and secret: sent and acknowledged.
    sent, _ = client.send("orders", SECRETS["orders"], "orders-1", "orders-2")
    accepted = {receipt(sent[0], "orders-1"): "orders-1", receipt(sent[1], "orders-2"): "orders-2"}

    # A wrong secret, an unknown key: the route query is refused UNAUTHORIZED.
    for access_key, secret_key in (("orders", "not-the-secret"), ("stranger", "stranger-secret")):
        sent, log = client.send(access_key, secret_key, "orders-1")
        assert sent == [no_route("orders-1")]
        assert "query topic raise exception, 40100, unknown access key or wrong signature" in log

    # No credentials (the client then signs with an empty access key): unsigned.
    sent, log = client.send("", "", "orders-1")
    assert sent == [no_route("orders-1")]
    assert "query topic raise exception, 40100, this node needs signed calls: give an access key and secret key" in log

    # The client stamps x-mq-date-time from its local clock, labelled UTC: off UTC by more
    # than the skew window, it is refused as stale.
    sent, log = client.send("orders", SECRETS["orders"], "orders-1", tz="UTC-9")
    assert sent == [no_route("orders-1")]
    assert re.search(r"query topic raise exception, 40100, the call was signed at \d{8}T\d{6}Z, more than 300 s from this node's clock", log), log[-2000:]

    # Pub on orders-* only: an existing orders topic takes the send; an unknown one is
    # NotFound (no route query creates a topic); another topic is out of its patterns.
    sent, log = client.send("pubonly", SECRETS["pubonly"], "orders-1", "orders-new", "payments")
    accepted[receipt(sent[0], "orders-1")] = "orders-1"
    assert sent[1:] == [no_route("orders-new"), no_route("payments")]
    assert "query topic raise exception, 40402, CODE: 17  DESC: No topic route info in name server for the topic: orders-new" in log
    assert "query topic raise exception, 40300, User:pubonly may not Pub or Sub Topic:payments" in log

    # Sub on orders-*: the route may be read (a consumer's right), the send is FORBIDDEN,
    # which the client raises as its ForbiddenException with the writer's words.
    sent, _ = client.send("watcher", SECRETS["watcher"], "orders-1")
    assert sent == [
        {"topic": "orders-1", "error": "ForbiddenException", "message": "40300, User:watcher may not Pub Topic:orders-1"}
    ]

    # Every acknowledged message is found, by an admin, on a query node under the same ACL;
    # nothing refused was stored or created.
    query_node = nodes.start("query", store, *SIZE_ARGS, "--acl", str(acl_path))
    channel = signing_channel(grpc.insecure_channel(query_node.endpoint), "ops", SECRETS["ops"])
    nodes.channels.append(channel)
    query = query_pb2_grpc.QueryServiceStub(channel)
    for message_id, topic in accepted.items():
        found = query.QueryByUniqKey(query_pb2.QueryByUniqKeyRequest(topic=topic, uniq_key=message_id), timeout=RPC_TIMEOUT_S)
        assert [(m.topic, m.uniq_key, m.body) for m in found.messages] == [(topic, message_id, f"signed message to {topic}".encode())]
    by_key = query.QueryByKey(query_pb2.QueryByKeyRequest(topic="orders-1", key="acl-orders-1", page_size=100), timeout=RPC_TIMEOUT_S)
    assert sorted(m.uniq_key for m in by_key.messages) == sorted(k for k, t in accepted.items() if t == "orders-1")
    topics = query.ListTopics(query_pb2.ListQueryTopicsRequest(), timeout=RPC_TIMEOUT_S)
    assert [t.name for t in topics.topics] == ["orders-1", "orders-2"]
    # The clients' Telemetry streams ended as they left: the writer stops without a
    # complaint (no read of a closed stream left for asyncio to report).
    writer.stop()
    assert writer.stderr_path.read_text(encoding="utf-8", errors="replace") == ""


class Gateway:
    """A writer's WriterService and MessagingService in this process under the ACL, as
    `writer serve --acl` runs them: its denials can be read."""

    def __init__(self, root: Path, acl_path: Path):
        self.node = WriterNode(root, listen=ListenOptions(acl=str(acl_path)))
        self.writer = self.node.writer
        self.serving = self.node.serving
        self.endpoint = self.node.endpoint
        self.channels: list[grpc.Channel] = []

    def stub(self, user: str | None, secret: str | None = None) -> service_pb2_grpc.MessagingServiceStub:
        channel = grpc.insecure_channel(self.endpoint)
        self.channels.append(channel)
        if user is not None:
            channel = signing_channel(channel, user, secret or SECRETS[user])
        return service_pb2_grpc.MessagingServiceStub(channel)

    @property
    def denials(self) -> dict[tuple[str, str], int]:
        return dict(self.serving.acl_interceptor.denials.counts)

    def close(self) -> None:
        for channel in self.channels:
            channel.close()
        self.node.close()


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    acl_path = tmp_path / "acl.yaml"
    acl_path.write_text(ACL)
    started = Gateway(tmp_path / "store", acl_path)
    yield started
    started.close()


def test_the_official_clients_refusals_are_counted(gateway: Gateway, tmp_path: Path) -> None:
    gateway.writer.topics.create("orders-1", 4)
    client = Client(tmp_path, gateway.endpoint)
    sent, _ = client.send("orders", SECRETS["orders"], "orders-1")
    receipt(sent[0], "orders-1")
    assert gateway.denials == {}
    assert client.send("orders", "not-the-secret", "orders-1")[0] == [no_route("orders-1")]
    assert gateway.denials == {("UNAUTHENTICATED", "BadSignature"): 1}
    assert client.send("stranger", "stranger-secret", "orders-1")[0] == [no_route("orders-1")]
    assert gateway.denials == {("UNAUTHENTICATED", "BadSignature"): 2}
    assert client.send("pubonly", SECRETS["pubonly"], "payments")[0] == [no_route("payments")]
    assert gateway.denials == {("UNAUTHENTICATED", "BadSignature"): 2, ("PERMISSION_DENIED", "Denied"): 1}
    # A refused send is retried by the client like any failed one: one denial an attempt
    # (3). The client also sends its settings, naming the topics it has routes for, 1 s
    # after it starts: a run that takes longer has that Telemetry stream refused too (the
    # user may not Pub), one more denial.
    sent, _ = client.send("watcher", SECRETS["watcher"], "orders-1")
    assert sent == [{"topic": "orders-1", "error": "ForbiddenException", "message": "40300, User:watcher may not Pub Topic:orders-1"}]
    denials = gateway.denials
    assert set(denials) == {("UNAUTHENTICATED", "BadSignature"), ("PERMISSION_DENIED", "Denied")}
    assert denials[("UNAUTHENTICATED", "BadSignature")] == 2
    assert denials[("PERMISSION_DENIED", "Denied")] in (1 + 3, 1 + 3 + 1)


def test_the_official_nodejs_client_reports_each_refusal_by_its_code(gateway: Gateway, tmp_path: Path) -> None:
    """tests/node/acl_producer.js (rocketmq-client-nodejs with sessionCredentials): its
    signature (upper-case hex, a UTC date) is accepted, and it raises the v2 status of a
    refused route or send as its own typed exception, code included."""

    def send(access_key: str, secret_key: str, topic: str) -> dict[str, Any]:
        output = run_node(tmp_path, "acl_producer.js", gateway.endpoint, access_key, secret_key, topic)
        return json.loads(output.splitlines()[-1])  # type: ignore[no-any-return]

    gateway.writer.topics.create("orders-1", 4)
    sent = send("orders", SECRETS["orders"], "orders-1")
    assert (sent["topic"], sent["offset"]) == ("orders-1", 0) and sent["message_id"]

    def refused(name: str, code: int, message: str) -> dict[str, Any]:
        return {"topic": topic, "error": name, "code": code, "message": f"[request-id=undefined, response-code={code}] {message}"}

    topic = "orders-1"
    assert send("orders", "not-the-secret", topic) == refused("UnauthorizedException", 40100, "unknown access key or wrong signature")
    assert send("watcher", SECRETS["watcher"], topic) == refused("ForbiddenException", 40300, "User:watcher may not Pub Topic:orders-1")
    topic = "payments"
    assert send("pubonly", SECRETS["pubonly"], topic) == refused("ForbiddenException", 40300, "User:pubonly may not Pub or Sub Topic:payments")
    assert sorted(gateway.writer.topics.snapshot()) == ["orders-1"]


def message_id(topic: str) -> str:
    return topic.encode().hex().upper()


def message(topic: str, body: bytes = b"b") -> v2.Message:
    return v2.Message(topic=v2.Resource(name=topic), body=body, system_properties=v2.SystemProperties(message_id=message_id(topic)))


FORBIDDEN = v2.FORBIDDEN
UNAUTHORIZED = v2.UNAUTHORIZED


def status(response: Any) -> tuple[int, str]:
    return response.status.code, response.status.message


def test_an_unsigned_or_badly_signed_v2_call_is_answered_unauthorized(gateway: Gateway) -> None:
    route = v2s.QueryRouteRequest(topic=v2.Resource(name="orders-1"))
    assert status(gateway.stub(None).QueryRoute(route, timeout=RPC_TIMEOUT_S)) == (
        UNAUTHORIZED, "this node needs signed calls: give an access key and secret key"
    )  # fmt: skip
    assert status(gateway.stub("orders", "not-the-secret").QueryRoute(route, timeout=RPC_TIMEOUT_S)) == (
        UNAUTHORIZED, "unknown access key or wrong signature"
    )  # fmt: skip
    send = gateway.stub(None).SendMessage(v2s.SendMessageRequest(messages=[message("orders-1"), message("orders-2")]), timeout=RPC_TIMEOUT_S)
    refused = v2.Status(code=UNAUTHORIZED, message="this node needs signed calls: give an access key and secret key")
    assert send == v2s.SendMessageResponse(status=refused, entries=[v2s.SendResultEntry(status=refused)] * 2)
    # Telemetry, a stream both ways: each command gets a status-only reply on the open
    # stream, as Apache's proxy answers it.
    settings = v2s.TelemetryCommand(settings=v2.Settings(client_type=v2.PRODUCER))
    answers = list(gateway.stub(None).Telemetry(iter([settings, settings]), timeout=RPC_TIMEOUT_S))
    unsigned = v2s.TelemetryCommand(status=v2.Status(code=UNAUTHORIZED, message="this node needs signed calls: give an access key and secret key"))
    assert answers == [unsigned, unsigned]
    assert gateway.denials == {("UNAUTHENTICATED", "Unsigned"): 4, ("UNAUTHENTICATED", "BadSignature"): 1}
    assert gateway.writer.topics.snapshot() == {}


def test_malformed_v2_requests_are_refused_before_and_after_authentication(gateway: Gateway) -> None:
    """Bytes that are not a SendMessageRequest: unsigned, the gRPC UNAUTHENTICATED (there is
    no request to shape a v2 answer from); signed, the guard's INVALID_ARGUMENT."""
    errors = []
    for user in (None, "orders"):
        channel = grpc.insecure_channel(gateway.endpoint)
        gateway.channels.append(channel)
        if user is not None:
            channel = signing_channel(channel, user, SECRETS[user])
        call = channel.unary_unary(f"/{MESSAGING_SERVICE}/SendMessage")
        with pytest.raises(grpc.RpcError) as raised:
            call(b"\xff\xff\xff", timeout=RPC_TIMEOUT_S)
        error: Any = raised.value
        errors.append((error.code(), error.details()))
    assert errors == [
        (grpc.StatusCode.UNAUTHENTICATED, "this node needs signed calls: give an access key and secret key"),
        (grpc.StatusCode.INVALID_ARGUMENT, "malformed request: the bytes do not parse as apache.rocketmq.v2.SendMessageRequest"),
    ]
    assert gateway.denials == {("UNAUTHENTICATED", "Unsigned"): 1}
    assert gateway.writer.topics.snapshot() == {}


def test_every_message_of_a_send_is_checked(gateway: Gateway) -> None:
    orders = gateway.stub("orders")
    mixed = v2s.SendMessageRequest(messages=[message("orders-1"), message("payments"), message("orders-2")])
    refused = v2.Status(code=FORBIDDEN, message="User:orders may not Pub Topic:payments")
    assert orders.SendMessage(mixed, timeout=RPC_TIMEOUT_S) == v2s.SendMessageResponse(
        status=refused, entries=[v2s.SendResultEntry(status=refused)] * 3
    )
    assert gateway.writer.topics.snapshot() == {}  # nothing stored, nothing created
    for topic in ("orders-1", "orders-2"):
        gateway.writer.topics.create(topic, 4)
    both = orders.SendMessage(v2s.SendMessageRequest(messages=[message("orders-1"), message("orders-2")]), timeout=RPC_TIMEOUT_S)
    assert status(both) == (v2.OK, "OK")
    assert [entry.message_id for entry in both.entries] == [message_id("orders-1"), message_id("orders-2")]
    # Pub: an existing topic takes it; an unknown one is NotFound, after the ACL passed it.
    pubonly = gateway.stub("pubonly")
    assert status(pubonly.SendMessage(v2s.SendMessageRequest(messages=[message("orders-1")]), timeout=RPC_TIMEOUT_S)) == (v2.OK, "OK")
    missing = status(pubonly.SendMessage(v2s.SendMessageRequest(messages=[message("orders-3")]), timeout=RPC_TIMEOUT_S))
    assert missing[0] == v2.TOPIC_NOT_FOUND and "No topic route info in name server for the topic: orders-3" in missing[1]
    assert sorted(gateway.writer.topics.snapshot()) == ["orders-1", "orders-2"]
    assert gateway.denials == {("PERMISSION_DENIED", "Denied"): 1}


def test_route_heartbeat_and_termination_need_what_rocketmq_5_asks(gateway: Gateway) -> None:
    orders, watcher, pubonly = gateway.stub("orders"), gateway.stub("watcher"), gateway.stub("pubonly")
    route = v2s.QueryRouteRequest(topic=v2.Resource(name="orders-1"))
    # Allowed, and NotFound: no route query creates a topic, whoever asks.
    assert status(orders.QueryRoute(route, timeout=RPC_TIMEOUT_S))[0] == v2.TOPIC_NOT_FOUND
    gateway.writer.topics.create("orders-1", 4)
    assert status(orders.QueryRoute(route, timeout=RPC_TIMEOUT_S)) == (v2.OK, "OK")
    assert status(pubonly.QueryRoute(route, timeout=RPC_TIMEOUT_S)) == (v2.OK, "OK")  # Pub will do
    assert status(watcher.QueryRoute(route, timeout=RPC_TIMEOUT_S)) == (v2.OK, "OK")  # so will Sub
    other = v2s.QueryRouteRequest(topic=v2.Resource(name="payments"))
    assert status(watcher.QueryRoute(other, timeout=RPC_TIMEOUT_S)) == (FORBIDDEN, "User:watcher may not Pub or Sub Topic:payments")
    # A producer's heartbeat and goodbye name no group and need nothing; a consumer's need Sub on its group.
    assert status(pubonly.Heartbeat(v2s.HeartbeatRequest(client_type=v2.PRODUCER), timeout=RPC_TIMEOUT_S)) == (v2.OK, "OK")
    assert status(pubonly.NotifyClientTermination(v2s.NotifyClientTerminationRequest(), timeout=RPC_TIMEOUT_S)) == (v2.OK, "OK")
    consumer = v2s.HeartbeatRequest(client_type=v2.SIMPLE_CONSUMER, group=v2.Resource(name="audit"))
    assert status(watcher.Heartbeat(consumer, timeout=RPC_TIMEOUT_S)) == (v2.OK, "OK")
    assert status(pubonly.Heartbeat(consumer, timeout=RPC_TIMEOUT_S)) == (FORBIDDEN, "User:pubonly may not Sub Group:audit")
    goodbye = v2s.NotifyClientTerminationRequest(group=v2.Resource(name="billing"))
    assert status(watcher.NotifyClientTermination(goodbye, timeout=RPC_TIMEOUT_S)) == (FORBIDDEN, "User:watcher may not Sub Group:billing")
    assert gateway.denials == {("PERMISSION_DENIED", "Denied"): 3}


def test_consumer_calls_are_authorized_before_they_are_answered(gateway: Gateway) -> None:
    """Sub on the group and on the topic; the allowed call gets the gateway's own answer."""
    watcher, orders = gateway.stub("watcher"), gateway.stub("orders")
    group, topic, other = v2.Resource(name="audit"), v2.Resource(name="orders-1"), v2.Resource(name="payments")
    queue = v2.MessageQueue(topic=topic)
    calls: list[tuple[str, Any, Any]] = [
        ("QueryAssignment", v2s.QueryAssignmentRequest(group=group, topic=topic), v2s.QueryAssignmentRequest(group=group, topic=other)),
        ("AckMessage", v2s.AckMessageRequest(group=group, topic=topic), v2s.AckMessageRequest(group=group, topic=other)),
        ("ForwardMessageToDeadLetterQueue", v2s.ForwardMessageToDeadLetterQueueRequest(group=group, topic=topic),
         v2s.ForwardMessageToDeadLetterQueueRequest(group=group, topic=other)),
        ("ChangeInvisibleDuration", v2s.ChangeInvisibleDurationRequest(group=group, topic=topic),
         v2s.ChangeInvisibleDurationRequest(group=group, topic=other)),
        ("UpdateOffset", v2s.UpdateOffsetRequest(group=group, message_queue=queue),
         v2s.UpdateOffsetRequest(group=group, message_queue=v2.MessageQueue(topic=other))),
        ("GetOffset", v2s.GetOffsetRequest(group=group, message_queue=queue),
         v2s.GetOffsetRequest(group=group, message_queue=v2.MessageQueue(topic=other))),
        ("SyncLiteSubscription", v2s.SyncLiteSubscriptionRequest(group=group, topic=topic),
         v2s.SyncLiteSubscriptionRequest(group=group, topic=other)),
    ]  # fmt: skip
    # What the gateway answers an allowed (and otherwise empty) request itself.
    answered = {
        "QueryAssignment": v2.TOPIC_NOT_FOUND,  # a consumer's call creates no topic
        "AckMessage": v2.BAD_REQUEST,  # no entries
        "ForwardMessageToDeadLetterQueue": v2.INVALID_RECEIPT_HANDLE,
        "ChangeInvisibleDuration": v2.INVALID_RECEIPT_HANDLE,
        "UpdateOffset": v2.TOPIC_NOT_FOUND,
        "GetOffset": v2.TOPIC_NOT_FOUND,
        "SyncLiteSubscription": v2.NOT_IMPLEMENTED,
        "ReceiveMessage": v2.BAD_REQUEST,  # batch_size 0
        "PullMessage": v2.TOPIC_NOT_FOUND,
        "QueryOffset": v2.TOPIC_NOT_FOUND,
    }
    for name, allowed, refused in calls:
        call = getattr(watcher, name)
        assert status(call(allowed, timeout=RPC_TIMEOUT_S))[0] == answered[name], name
        assert status(call(refused, timeout=RPC_TIMEOUT_S)) == (FORBIDDEN, "User:watcher may not Sub Topic:payments"), name
        assert status(getattr(orders, name)(allowed, timeout=RPC_TIMEOUT_S)) == (FORBIDDEN, "User:orders may not Sub Group:audit"), name
    offset = v2s.QueryOffsetRequest(message_queue=queue)
    assert status(watcher.QueryOffset(offset, timeout=RPC_TIMEOUT_S))[0] == answered["QueryOffset"]
    assert status(orders.QueryOffset(offset, timeout=RPC_TIMEOUT_S)) == (FORBIDDEN, "User:orders may not Sub Topic:orders-1")
    # The server-streaming calls answer a refusal with one response carrying the status.
    for name, request_type in (("ReceiveMessage", v2s.ReceiveMessageRequest), ("PullMessage", v2s.PullMessageRequest)):
        answers = list(getattr(orders, name)(request_type(group=group, message_queue=queue), timeout=RPC_TIMEOUT_S))
        assert [status(a) for a in answers] == [(FORBIDDEN, "User:orders may not Sub Group:audit")], name
        answers = list(getattr(watcher, name)(request_type(group=group, message_queue=queue), timeout=RPC_TIMEOUT_S))
        assert [status(a)[0] for a in answers] == [answered[name]], name
    # Transactions are a producer's: Pub on the topic.
    end = v2s.EndTransactionRequest(topic=topic)
    assert status(orders.EndTransaction(end, timeout=RPC_TIMEOUT_S)) == (v2.INVALID_TRANSACTION_ID, "transaction id cannot be empty")
    assert status(watcher.EndTransaction(end, timeout=RPC_TIMEOUT_S)) == (FORBIDDEN, "User:watcher may not Pub Topic:orders-1")
    recall = v2s.RecallMessageRequest(topic=topic)
    assert status(watcher.RecallMessage(recall, timeout=RPC_TIMEOUT_S)) == (FORBIDDEN, "User:watcher may not Pub Topic:orders-1")
    assert gateway.denials == {("PERMISSION_DENIED", "Denied"): 2 * len(calls) + 1 + 2 + 2}


def test_telemetry_settings_need_pub_on_the_producers_topics(gateway: Gateway) -> None:
    def settings(*topics: str) -> v2s.TelemetryCommand:
        publishing = v2.Publishing(topics=[v2.Resource(name=t) for t in topics])
        return v2s.TelemetryCommand(settings=v2.Settings(client_type=v2.PRODUCER, publishing=publishing))

    answers = list(gateway.stub("orders").Telemetry(iter([settings("orders-1", "orders-2")]), timeout=RPC_TIMEOUT_S))
    assert [status(a) for a in answers] == [(v2.OK, "OK")]
    # A refused command gets a status-only reply, and the stream stays open for the next.
    commands = [settings("orders-1"), settings("orders-1", "payments"), settings("orders-2")]
    answers = list(gateway.stub("orders").Telemetry(iter(commands), timeout=RPC_TIMEOUT_S))
    assert [(status(a), a.HasField("settings")) for a in answers] == [
        ((v2.OK, "OK"), True), ((FORBIDDEN, "User:orders may not Pub Topic:payments"), False), ((v2.OK, "OK"), True),
    ]  # fmt: skip
    subscribing = v2s.TelemetryCommand(
        settings=v2.Settings(
            client_type=v2.SIMPLE_CONSUMER,
            subscription=v2.Subscription(group=v2.Resource(name="audit"), subscriptions=[v2.SubscriptionEntry(topic=v2.Resource(name="orders-9"))]),
        )
    )
    answers = list(gateway.stub("watcher").Telemetry(iter([subscribing]), timeout=RPC_TIMEOUT_S))
    assert [status(a)[0] for a in answers] == [v2.OK]  # allowed
    answers = list(gateway.stub("orders").Telemetry(iter([subscribing]), timeout=RPC_TIMEOUT_S))
    assert answers == [v2s.TelemetryCommand(status=v2.Status(code=FORBIDDEN, message="User:orders may not Sub Group:audit"))]
    assert gateway.denials == {("PERMISSION_DENIED", "Denied"): 2}


def test_a_nodejs_simple_consumer_whose_group_is_forbidden_fails_its_startup(gateway: Gateway, tmp_path: Path) -> None:
    """The status-only Telemetry reply is what the Node.js client acts on: its startup()
    is rejected with the status (a stream ended by a gRPC error left it reconnecting every
    second, startup() pending for ever)."""
    gateway.writer.topics.create("orders-1", 4)

    def start(access_key: str, group: str) -> dict[str, Any]:
        output = run_node(tmp_path, "acl_consumer.js", gateway.endpoint, access_key, SECRETS[access_key], "orders-1", group)
        return json.loads(output.splitlines()[-1])  # type: ignore[no-any-return]

    assert start("watcher", "audit") == {"topic": "orders-1", "group": "audit", "started": True}
    failed = start("orders", "audit")
    assert (failed["error"], failed["code"]) == ("Error", None), failed
    assert re.fullmatch(
        r"Startup the rocketmq client failed, clientId=\S+, error=ForbiddenException: "
        r"\[request-id=undefined, response-code=40300\] User:orders may not Sub Group:audit",
        failed["message"],
    ), failed
