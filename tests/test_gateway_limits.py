"""One client of the RocketMQ 5 gateway cannot spend the writer for all (issue 40): real
writer processes, a hostile client process (tests/support/hostile_gateway.py) or hostile
calls from this process, and an unrelated producer timed meanwhile."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2
from support import gateway_load
from support.acl import ACL, SECRETS
from support.cli import quiet_env
from support.gateway_load import stop_hostile
from support.nodes import Nodes, ProcessNode

from rmqstore.client.signing import signing_channel
from rmqstore.rocketmq_v2 import definition_pb2 as v2
from rmqstore.rocketmq_v2 import service_pb2 as v2s
from rmqstore.rocketmq_v2 import service_pb2_grpc
from rmqstore.service.limits import UNAUTHENTICATED_STREAMS_MAX
from rmqstore.v1 import messages_pb2, writer_pb2, writer_pb2_grpc

OPEN_TIMEOUT_S = 180.0
RPC_TIMEOUT_S = 30.0
# Latency bounds are a node's, not a loaded machine's: .ci/run runs this module alone.
pytestmark = pytest.mark.serial


def rss_anon_bytes(pid: int) -> int:
    """The process's anonymous resident memory (its heap: not the store's mapped pages)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no RssAnon for {pid}")


def median_s(call: Callable[[], Any], samples: int) -> float:
    for _ in range(10):
        call()  # warm: the connection's set-up is not the node's answer time
    timings = []
    for _ in range(samples):
        started = time.perf_counter()
        call()
        timings.append(time.perf_counter() - started)
    timings.sort()
    return timings[len(timings) // 2]


def open_hostile(node: ProcessNode, *args: str) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """The hostile client against ``node``, once it says its calls are open."""
    return gateway_load.open_hostile(node.endpoint, args, OPEN_TIMEOUT_S, quiet_env())


def create_topic(node: ProcessNode, nodes: Nodes, name: str, queue_count: int) -> None:
    nodes.writer(node).CreateTopic(writer_pb2.CreateTopicRequest(name=name, queue_count=queue_count), timeout=RPC_TIMEOUT_S)


IDLE_POLLS = 300
# An idle poll elsewhere may cost a send something (the writer's loop holds them), not a
# multiple of its time: before wake-ups by topic, 300 polls made a send 10-30 times slower.
IDLE_POLL_SLOWDOWN_MAX = 2.5


@pytest.mark.slow
def test_idle_long_polls_on_another_topic_cost_an_append_nothing(nodes: Nodes, tmp_path: Path) -> None:
    """Finding 4: an append wakes only the polls on its topic."""
    writer = nodes.start("writer", tmp_path / "store")
    create_topic(writer, nodes, "Idle", 8)
    producer = nodes.writer(writer)
    request = writer_pb2.SendRequest(message=messages_pb2.Message(topic="Busy", body=b"b" * 100))

    def send() -> Any:
        return producer.Send(request, timeout=RPC_TIMEOUT_S)

    unloaded_s = median_s(send, 300)
    hostile, opened = open_hostile(writer, "polls", str(IDLE_POLLS), "Idle", "idlers")
    try:
        assert opened == {"event": "open", "count": IDLE_POLLS, "refused": {}}
        time.sleep(1.0)  # the last polls issued reach the writer and wait
        loaded_s = median_s(send, 300)
        assert hostile.poll() is None
    finally:
        stop_hostile(hostile)
    print(f"send p50 {unloaded_s * 1000:.2f} ms alone, {loaded_s * 1000:.2f} ms beside {IDLE_POLLS} idle polls")
    assert loaded_s <= IDLE_POLL_SLOWDOWN_MAX * unloaded_s + 0.001, (unloaded_s, loaded_s)


BIG_BODY_BYTES = 4 * 1024 * 1024 - 1024
BIG_MESSAGES = 40
# The v1 response budget (docs/security.md): 16 MiB of records after the first.
RESPONSE_BYTES_MAX = 16 * 1024 * 1024
# Four answers of 16 MiB, each held in about two copies (its records, its message) at its peak.
BIG_RSS_GROWTH_MAX_BYTES = 192 * 1024 * 1024
# A send beside two large receives waits for its turn on the writer's loop, not for them.
BESIDE_SEND_MAX_S = 2.0


@pytest.mark.slow
def test_receive_and_pull_answer_within_the_response_budget_and_hold_no_send_up(nodes: Nodes, tmp_path: Path) -> None:
    """Finding 3: two receives and two pulls asking 40 messages of 4 MiB each get 16 MiB
    of records (and one more) each, the writer's memory grows by less than all of them,
    and a send meanwhile is answered at once."""
    # The greedy client receives for 1 s at a time, so the same messages come back at once.
    writer = nodes.start("writer", tmp_path / "store", "--consumer-min-invisible", "1")
    create_topic(writer, nodes, "Big", 1)
    producer = nodes.writer(writer)
    for i in range(BIG_MESSAGES):
        body = bytes([i]) * BIG_BODY_BYTES
        producer.Send(writer_pb2.SendRequest(message=messages_pb2.Message(topic="Big", queue_id=0, body=body)), timeout=RPC_TIMEOUT_S)
    small = writer_pb2.SendRequest(message=messages_pb2.Message(topic="Small", body=b"s"))
    median_s(lambda: producer.Send(small, timeout=RPC_TIMEOUT_S), 20)
    anon_before = rss_anon_bytes(writer.proc.pid)
    hostile = subprocess.Popen(
        [sys.executable, str(gateway_load.HOSTILE), writer.endpoint, "big", "2", "Big", "greedy"], stdout=subprocess.PIPE, env=quiet_env()
    )
    sends_s = []
    peak = anon_before
    try:
        while hostile.poll() is None:
            started = time.perf_counter()
            producer.Send(small, timeout=RPC_TIMEOUT_S)
            sends_s.append(time.perf_counter() - started)
            peak = max(peak, rss_anon_bytes(writer.proc.pid))
            time.sleep(0.005)
        out, _ = hostile.communicate(timeout=OPEN_TIMEOUT_S)
    finally:
        stop_hostile(hostile)
    assert hostile.returncode == 0, out
    answered = json.loads(out)
    grown = peak - anon_before
    print(f"anonymous RSS +{grown >> 20} MiB; sends beside: {len(sends_s)}, max {max(sends_s) * 1000:.0f} ms")
    for sizes in [*answered["receive"], *(sizes for sizes, _ in answered["pull"])]:
        assert 1 <= len(sizes) < BIG_MESSAGES and sum(sizes[:-1]) <= RESPONSE_BYTES_MAX, sizes
    for sizes, next_offsets in answered["pull"]:
        assert next_offsets == [len(sizes)]  # where the next pull starts: the budget left the rest
    assert grown <= BIG_RSS_GROWTH_MAX_BYTES, f"anonymous RSS grew by {grown >> 20} MiB"
    assert max(sends_s) <= BESIDE_SEND_MAX_S, f"a send beside the receives took {max(sends_s) * 1000:.0f} ms"


WATCH_STREAMS = 2048


@pytest.mark.slow
def test_unauthenticated_health_streams_leave_signed_streams_their_own(nodes: Nodes, tmp_path: Path) -> None:
    """Finding 2: under --acl, 2,048 health Watch streams of a caller without credentials
    take their own pool, not the signed callers': a signed ReceiveMessage and SendStream
    still stream."""
    acl_path = tmp_path / "acl.yaml"
    acl_path.write_text(ACL)
    writer = nodes.start("writer", tmp_path / "store", "--acl", str(acl_path))
    channel = signing_channel(grpc.insecure_channel(writer.endpoint), "ops", SECRETS["ops"])
    nodes.channels.append(channel)
    writer_pb2_grpc.WriterServiceStub(channel).CreateTopic(
        writer_pb2.CreateTopicRequest(name="orders-a", queue_count=1), timeout=RPC_TIMEOUT_S
    )
    hostile, opened = open_hostile(writer, "watch", str(WATCH_STREAMS))
    try:
        # Past their own limit, each refused at once (a few seen as CANCELLED: grpc closes
        # a connection whose streams are reset that fast).
        refused = opened["refused"]
        assert sum(refused.values()) == WATCH_STREAMS - UNAUTHENTICATED_STREAMS_MAX, refused
        assert set(refused) <= {"StatusCode.RESOURCE_EXHAUSTED", "StatusCode.CANCELLED"}, refused
        request = v2s.ReceiveMessageRequest(
            group=v2.Resource(name="audit"), message_queue=v2.MessageQueue(topic=v2.Resource(name="orders-a"), id=0),
            filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"), batch_size=1,
            invisible_duration=duration_pb2.Duration(seconds=30), long_polling_timeout=duration_pb2.Duration(seconds=0),
        )  # fmt: skip
        answers = list(service_pb2_grpc.MessagingServiceStub(channel).ReceiveMessage(request, timeout=RPC_TIMEOUT_S))
        assert [a.status.code for a in answers] == [v2.MESSAGE_NOT_FOUND]
        batch = writer_pb2.SendBatchRequest(messages=[messages_pb2.Message(topic="orders-a", body=b"signed")])
        acks = list(writer_pb2_grpc.WriterServiceStub(channel).SendStream(iter([batch]), timeout=RPC_TIMEOUT_S))
        assert [len(ack.results) for ack in acks] == [1]
        assert hostile.poll() is None
    finally:
        stop_hostile(hostile)


def test_topics_queues_and_groups_are_capped_by_their_flags(nodes: Nodes, tmp_path: Path) -> None:
    """Finding 6: past --max-topics, --max-queues and --max-groups no call makes more
    (v1: RESOURCE_EXHAUSTED; v2: TOO_MANY_REQUESTS), across a restart too; what exists is
    served as before."""
    store = tmp_path / "store"
    caps = ("--max-topics", "3", "--max-queues", "10", "--max-groups", "2")
    writer = nodes.start("writer", store, *caps)
    producer = nodes.writer(writer)

    def create(name: str, queue_count: int) -> Any:
        return producer.CreateTopic(writer_pb2.CreateTopicRequest(name=name, queue_count=queue_count), timeout=RPC_TIMEOUT_S)

    def refused(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
        with pytest.raises(grpc.RpcError) as raised:
            call()
        error: Any = raised.value
        return error.code(), error.details()

    create("A", 4)
    create("B", 4)
    assert refused(lambda: create("C", 4)) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED, "topic C with 4 queues would make 12 queues in all, past the writer's limit (--max-queues 10)"
    )
    create("C", 2)
    too_many_topics = "the writer holds 3 topics, its limit (--max-topics 3): topic D is not created"
    assert refused(lambda: create("D", 1)) == (grpc.StatusCode.RESOURCE_EXHAUSTED, too_many_topics)
    send_d = writer_pb2.SendRequest(message=messages_pb2.Message(topic="D", body=b"d"))
    assert refused(lambda: producer.Send(send_d, timeout=RPC_TIMEOUT_S)) == (grpc.StatusCode.RESOURCE_EXHAUSTED, too_many_topics)
    gateway = service_pb2_grpc.MessagingServiceStub(nodes.channel(writer))
    # A route query creates no topic at all (NotFound), under the caps or past them.
    route = gateway.QueryRoute(v2s.QueryRouteRequest(topic=v2.Resource(name="D")), timeout=RPC_TIMEOUT_S)
    assert route.status.code == v2.TOPIC_NOT_FOUND
    producer.Send(writer_pb2.SendRequest(message=messages_pb2.Message(topic="A", body=b"a")), timeout=RPC_TIMEOUT_S)

    def receive(stub: service_pb2_grpc.MessagingServiceStub, group: str) -> v2.Status:
        request = v2s.ReceiveMessageRequest(
            group=v2.Resource(name=group), message_queue=v2.MessageQueue(topic=v2.Resource(name="A"), id=0),
            filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"), batch_size=1,
            invisible_duration=duration_pb2.Duration(seconds=30), long_polling_timeout=duration_pb2.Duration(seconds=0),
        )  # fmt: skip
        (status,) = [a.status for a in stub.ReceiveMessage(request, timeout=RPC_TIMEOUT_S) if a.HasField("status")]
        return status

    assert receive(gateway, "g1").code == v2.OK
    assert receive(gateway, "g2").code == v2.OK
    too_many_groups = "the writer holds 2 consumer groups, its limit (--max-groups 2): group g3 is not made"
    assert (receive(gateway, "g3").code, receive(gateway, "g3").message) == (v2.TOO_MANY_REQUESTS, too_many_groups)
    writer.stop()
    again = nodes.start("writer", store, *caps)
    gateway = service_pb2_grpc.MessagingServiceStub(nodes.channel(again))
    assert receive(gateway, "g3").message == too_many_groups
    assert receive(gateway, "g1").code == v2.MESSAGE_NOT_FOUND  # its message is in flight
    assert refused(lambda: nodes.writer(again).CreateTopic(writer_pb2.CreateTopicRequest(name="D", queue_count=1), timeout=RPC_TIMEOUT_S)) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED, too_many_topics
    )


IN_FLIGHT = 65_536
REPOLLERS = 2
# Before the index of what is next visible, each empty receive scanned the 65,536 in
# flight on the writer's loop: two clients re-polling made a send 10-50 times slower.
IN_FLIGHT_SLOWDOWN_MAX = 2.5


@pytest.mark.slow
def test_a_large_set_in_flight_makes_empty_receives_cost_others_nothing(nodes: Nodes, tmp_path: Path) -> None:
    """Finding 5: a group holds 65,536 messages in flight (12 h invisibility) and two of
    its clients re-poll without a pause: each empty receive looks at no message, so a
    send beside them is as fast as alone."""
    writer = nodes.start("writer", tmp_path / "store")
    create_topic(writer, nodes, "Flight", 1)
    producer = nodes.writer(writer)
    gateway_load.hold_in_flight(nodes.channel(writer), "Flight", "hoarders", IN_FLIGHT, RPC_TIMEOUT_S)
    send = writer_pb2.SendRequest(message=messages_pb2.Message(topic="Busy", body=b"b" * 100))

    def sent() -> Any:
        return producer.Send(send, timeout=RPC_TIMEOUT_S)

    unloaded_s = median_s(sent, 200)
    hostile, opened = open_hostile(writer, "repoll", str(REPOLLERS), "Flight", "hoarders")
    try:
        assert opened == {"event": "open", "count": REPOLLERS, "refused": {}}
        loaded_s = median_s(sent, 200)
        assert hostile.poll() is None
    finally:
        stop_hostile(hostile)
    print(f"send p50 {unloaded_s * 1000:.2f} ms alone, {loaded_s * 1000:.2f} ms beside {REPOLLERS} clients re-polling over {IN_FLIGHT} in flight")
    assert loaded_s <= IN_FLIGHT_SLOWDOWN_MAX * unloaded_s + 0.001, (unloaded_s, loaded_s)
