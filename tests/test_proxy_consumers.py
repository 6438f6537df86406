"""Cluster mode's consumers: the official Python SimpleConsumer through two ``rmqstore proxy
serve`` processes in front of three writer groups (receives from every group, each
acknowledgement routed back to the group that handed the message out), receipt handles
checked, a group's loss and a proxy's loss (docs/cluster.md).

tests/test_proxy_acceptance.py runs producers, these consumers and every lookup together.
PROXY_CONSUMER_MESSAGES: the messages of the test that kills a proxy mid-consume."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2
from support.cli import run_cli
from support.nodes import Nodes, ProcessNode
from support.rmq5 import run_python_client
from support.stores import SIZE_ARGS
from support.wait import wait_until
from test_proxy import records, start_proxies, start_writers
from test_rocketmq5_client_consumers import Background

from rmqstore.common.files.consumer_offsets import read_offsets
from rmqstore.proxy.consumers import wrap_handle
from rmqstore.rocketmq_v2 import definition_pb2 as v2
from rmqstore.rocketmq_v2 import service_pb2 as v2s
from rmqstore.rocketmq_v2 import service_pb2_grpc
from rmqstore.v1 import writer_pb2

MESSAGES = int(os.environ.get("PROXY_CONSUMER_MESSAGES", "240"))
NAMES = ["broker-a", "broker-b", "broker-c"]
GROUP = "ClusterGroup"
RPC_TIMEOUT_S = 15.0


def cluster_file(tmp_path: Path, writers: dict[str, ProcessNode], queries: dict[str, ProcessNode] | None = None) -> Path:
    lines = ["groups:"]
    for name, writer in writers.items():
        lines += [f"  - name: {name}", f'    writers: ["{writer.endpoint}"]']
        if queries is not None:
            lines.append(f'    queries: ["{queries[name].endpoint}"]')
    path = tmp_path / "cluster.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def produce(tmp_path: Path, endpoints: str, count: int) -> list[dict[str, Any]]:
    """``count`` messages through the proxies with the official producer (three quarters to
    Orders, the rest to the FIFO topic Fifo); their receipts."""
    lines = run_python_client(tmp_path, "send", endpoints, "Orders", "Fifo", str(count))
    return [line for line in lines if "message_id" in line and line["topic"] == "Orders"]


def consumers(tmp_path: Path, endpoints: str, *extra: str) -> list[Background]:
    return [
        Background(tmp_path, f"consumer-{n}", "simple", endpoints, GROUP, "Orders", "--idle-s", "600", "--invisible-s", "10", *extra)
        for n in range(2)
    ]


def acked_ids(running: list[Background]) -> Counter[str]:
    return Counter(line["message_id"] for consumer in running for line in consumer.lines() if line.get("acked"))


def wait_all_acked(running: list[Background], wanted: set[str], timeout_s: float = 180.0) -> Counter[str]:
    def done() -> Counter[str] | None:
        for consumer in running:
            assert consumer.proc.poll() is None, f"a consumer exited: {consumer.err_path.read_text()[-2000:]}"
        acked = acked_ids(running)
        return acked if wanted <= set(acked) else None

    return wait_until(done, timeout_s, "every message acknowledged", interval_s=0.2)


def stub(endpoint: str) -> tuple[grpc.Channel, service_pb2_grpc.MessagingServiceStub]:
    channel = grpc.insecure_channel(endpoint)
    return channel, service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]  # generated


def receive(messaging: service_pb2_grpc.MessagingServiceStub, topic: str, batch: int, poll_s: int = 2) -> list[v2.Message]:
    request = v2s.ReceiveMessageRequest(
        group=v2.Resource(name=GROUP), message_queue=v2.MessageQueue(topic=v2.Resource(name=topic), id=0),
        batch_size=batch, invisible_duration=duration_pb2.Duration(seconds=10),
        long_polling_timeout=duration_pb2.Duration(seconds=poll_s),
    )  # fmt: skip
    answers = list(messaging.ReceiveMessage(request, timeout=RPC_TIMEOUT_S))
    statuses = [a.status.code for a in answers if a.WhichOneof("content") == "status"]
    assert statuses and statuses[0] in (v2.OK, v2.MESSAGE_NOT_FOUND), answers
    return [a.message for a in answers if a.WhichOneof("content") == "message"]


def ack(messaging: service_pb2_grpc.MessagingServiceStub, topic: str, *handles: str) -> v2s.AckMessageResponse:
    request = v2s.AckMessageRequest(
        group=v2.Resource(name=GROUP), topic=v2.Resource(name=topic),
        entries=[v2s.AckMessageEntry(message_id=f"m{n}", receipt_handle=handle) for n, handle in enumerate(handles)],
    )  # fmt: skip
    answer: v2s.AckMessageResponse = messaging.AckMessage(request, timeout=RPC_TIMEOUT_S)
    return answer


def test_receipt_handles_route_to_their_group_and_garbled_ones_are_refused(nodes: Nodes, tmp_path: Path) -> None:
    """A handle names its group: acknowledged through the proxy it reaches that group's
    writer (a second ack of it is OK there too, as the writer's own gateway answers it). Handles that are not a
    proxy's, that name a group the cluster file lacks, or that carry another group's
    writer handle are answered INVALID_RECEIPT_HANDLE, entry by entry beside good ones;
    invisibility changes are routed alike, and answer a handle that routes again."""
    writers = start_writers(nodes, tmp_path, NAMES[:2], {"Orders": "NORMAL", "Fifo": "FIFO"})
    (proxy,) = start_proxies(nodes, cluster_file(tmp_path, writers), 1)
    sent = produce(tmp_path, proxy.endpoint, 40)
    channel, messaging = stub(proxy.endpoint)
    with channel:
        received: list[v2.Message] = []
        wait_until(lambda: received.extend(receive(messaging, "Orders", 32)) or len(received) >= len(sent), 60, "every message received")
        assert len({m.system_properties.message_id for m in received}) == len(sent)
        by_group: dict[str, list[str]] = {}
        for message in received:
            prefix, group, _ = message.system_properties.receipt_handle.split(".", 2)
            assert prefix == "rmqp1"
            by_group.setdefault(group, []).append(message.system_properties.receipt_handle)
        assert len(by_group) == 2
        ((a_name, a_handles), (_, b_handles)) = by_group.items()
        foreign = f"rmqp1.{a_name}.{b_handles[0].split('.', 2)[2]}"  # another group's writer handle
        garbled = ["", "not-a-handle", "rmqp1.", "rmqp1.!!!.x", wrap_handle("broker-z", "abc"), foreign, a_handles[0][:-3] + "AAA"]
        answer = ack(messaging, "Orders", a_handles[0], *garbled)
        codes = [entry.status.code for entry in answer.entries]
        assert answer.status.code == v2.MULTIPLE_RESULTS
        assert codes == [v2.OK] + [v2.INVALID_RECEIPT_HANDLE] * len(garbled), [(e.status.code, e.status.message) for e in answer.entries]
        again = ack(messaging, "Orders", a_handles[0])
        assert again.status.code == v2.OK, again.status
        change = v2s.ChangeInvisibleDurationRequest(
            group=v2.Resource(name=GROUP), topic=v2.Resource(name="Orders"), receipt_handle="garbage",
            invisible_duration=duration_pb2.Duration(seconds=20), message_id="m",
        )  # fmt: skip
        assert messaging.ChangeInvisibleDuration(change, timeout=RPC_TIMEOUT_S).status.code == v2.INVALID_RECEIPT_HANDLE
        change.receipt_handle = b_handles[0]
        changed = messaging.ChangeInvisibleDuration(change, timeout=RPC_TIMEOUT_S)
        assert changed.status.code == v2.OK, changed.status
        assert changed.receipt_handle.split(".", 2)[:2] == b_handles[0].split(".", 2)[:2]
        rest = a_handles[1:] + [changed.receipt_handle] + b_handles[1:]
        done = ack(messaging, "Orders", *rest)
        assert done.status.code == v2.OK, [e.status for e in done.entries if e.status.code != v2.OK][:3]
        assert receive(messaging, "Orders", 32, poll_s=1) == []


@pytest.mark.crash
def test_a_dead_groups_acks_fail_retryably_and_its_messages_come_back_after_restart(nodes: Nodes, tmp_path: Path) -> None:
    """Kill one group's writer while its messages are in flight: receives go on from the
    other groups, acknowledgements of the dead group's handles are answered HA_NOT_AVAILABLE
    (retryable), and once the group is back its unacknowledged messages are handed out
    again and acknowledged."""
    writers = start_writers(nodes, tmp_path, NAMES, {"Orders": "NORMAL", "Fifo": "FIFO"})
    (proxy,) = start_proxies(nodes, cluster_file(tmp_path, writers), 1)
    sent = produce(tmp_path, proxy.endpoint, 60)
    wanted = {line["message_id"] for line in sent}
    channel, messaging = stub(proxy.endpoint)
    with channel:
        received: list[v2.Message] = []
        wait_until(lambda: received.extend(receive(messaging, "Orders", 32)) or len(received) >= len(wanted), 60, "every message received")
        in_b = [m for m in received if m.system_properties.receipt_handle.startswith(wrap_handle("broker-b", ""))]
        others = [m for m in received if m not in in_b]
        assert in_b and others
        writers["broker-b"].kill()
        answer = ack(messaging, "Orders", *(m.system_properties.receipt_handle for m in received))
        codes = Counter(entry.status.code for entry in answer.entries)
        assert codes == {v2.OK: len(others), v2.HA_NOT_AVAILABLE: len(in_b)}, [(e.status.code, e.status.message) for e in answer.entries]
        assert receive(messaging, "Orders", 32, poll_s=1) == []
        restarted = nodes.start("writer", tmp_path / "broker-b", *SIZE_ARGS, "--broker-name", "broker-b", "--port", "0")
        (tmp_path / "cluster.yaml").write_text((tmp_path / "cluster.yaml").read_text().replace(writers["broker-b"].endpoint, restarted.endpoint))
        again: list[v2.Message] = []
        wait_until(lambda: again.extend(receive(messaging, "Orders", 32)) or len(again) >= len(in_b), 90, "broker-b's messages again")
        assert {m.system_properties.message_id for m in again} == {m.system_properties.message_id for m in in_b}
        final = ack(messaging, "Orders", *(m.system_properties.receipt_handle for m in again))
        assert final.status.code == v2.OK, final.status


def committed(tmp_path: Path, names: list[str]) -> bool:
    """Each group's committed offsets (its writer's consumerOffset.json, flushed every
    second) at its queues' ends: every message acknowledged at the writers."""
    return all(
        sum(read_offsets(str(tmp_path / name / "config")).get(("Orders", GROUP), {}).values())
        == sum(1 for record in records(tmp_path / name) if record.topic == "Orders")
        for name in names
    )


@pytest.mark.crash
def test_killing_a_proxy_mid_consume_loses_nothing(nodes: Nodes, tmp_path: Path) -> None:
    """Two SimpleConsumers through two proxies; the proxy they use is SIGKILLed mid-run.
    They go on through the other; every message is received, and every group's committed
    offsets reach its queues' ends. A message whose acknowledgement was lost with the proxy
    either comes back after its invisible duration and is acknowledged then (at least once,
    as RocketMQ promises), or its acknowledgement had reached the writer before the proxy
    died: the client saw an error, the writer holds it acknowledged, and it is not handed
    out again."""
    writers = start_writers(nodes, tmp_path, NAMES, {"Orders": "NORMAL", "Fifo": "FIFO"})
    proxies = start_proxies(nodes, cluster_file(tmp_path, writers), 2)
    endpoints = ";".join(proxy.endpoint for proxy in proxies)
    sent = produce(tmp_path, endpoints, MESSAGES)
    wanted = {line["message_id"] for line in sent}
    running = consumers(tmp_path, endpoints, "--tolerate", "--pace-s", "0.01")
    try:
        wait_until(lambda: len(acked_ids(running)) >= len(wanted) // 3, 120, "a third acknowledged")
        min(proxies, key=lambda proxy: proxy.endpoint).kill()

        def settled() -> bool:
            for consumer in running:
                assert consumer.proc.poll() is None, f"a consumer exited: {consumer.err_path.read_text()[-2000:]}"
            received = {line["message_id"] for consumer in running for line in consumer.lines() if "message_id" in line}
            return received >= wanted and committed(tmp_path, NAMES)

        wait_until(settled, 240, "every message received and every group's offsets at its queues' ends", interval_s=0.5)
    finally:
        lines = [line for consumer in running for line in consumer.stop()]
    acked = {line["message_id"] for line in lines if line.get("acked")}
    unanswered = {line["message_id"] for line in lines if "message_id" in line and line.get("error", "").startswith("ack:")}
    assert wanted <= acked | unanswered, sorted(wanted - acked - unanswered)[:5]
    assert acked <= wanted


def writer_topics(nodes: Nodes, writer: ProcessNode) -> dict[str, tuple[int, str]]:
    listed = nodes.writer(writer).ListTopics(writer_pb2.ListTopicsRequest(), timeout=RPC_TIMEOUT_S).topics
    return {topic.name: (topic.queue_count, topic.message_type) for topic in listed}


def test_update_topic_and_sub_group_through_the_proxy_reach_every_group(nodes: Nodes, tmp_path: Path) -> None:
    """``updateTopic`` and ``updateSubGroup`` against a proxy make the change on every
    group's writer; with one group down they fail naming it and the groups that made the
    change, and succeed when run again once it is back."""
    writers = start_writers(nodes, tmp_path, NAMES, {})
    (proxy,) = start_proxies(nodes, cluster_file(tmp_path, writers), 1)
    made = run_cli(["updateTopic", "--endpoint", proxy.endpoint, "-t", "Made", "-w", "6", "-a", "+message.type=FIFO"])
    assert made.returncode == 0, made.stderr
    assert made.json_lines() == [{"topic": "Made", "queueCount": 6, "messageType": "FIFO", "changed": True}]
    for writer in writers.values():
        assert writer_topics(nodes, writer)["Made"] == (6, "FIFO")
    again = run_cli(["updateTopic", "--endpoint", proxy.endpoint, "-t", "Made", "-w", "6"])
    assert again.returncode == 0 and again.json_lines()[0]["changed"] is False, again.stderr
    orderly = run_cli(["updateSubGroup", "--endpoint", proxy.endpoint, "-g", GROUP, "-o", "true"])
    assert orderly.returncode == 0, orderly.stderr
    assert orderly.json_lines() == [{"groupName": GROUP, "consumeMessageOrderly": True, "changed": True}]
    bad = run_cli(["updateTopic", "--endpoint", proxy.endpoint, "-t", "bad topic!"])
    assert bad.returncode != 0 and "INVALID_ARGUMENT" in bad.stderr, bad.stderr
    writers["broker-b"].kill()
    partial = run_cli(["updateTopic", "--endpoint", proxy.endpoint, "-t", "Later", "-w", "2"])
    assert partial.returncode != 0, partial.stdout
    assert "UNAVAILABLE" in partial.stderr and "group broker-b did not answer" in partial.stderr, partial.stderr
    assert writer_topics(nodes, writers["broker-a"])["Later"] == (2, "NORMAL")
    restarted = nodes.start("writer", tmp_path / "broker-b", *SIZE_ARGS, "--broker-name", "broker-b")
    (tmp_path / "cluster.yaml").write_text((tmp_path / "cluster.yaml").read_text().replace(writers["broker-b"].endpoint, restarted.endpoint))

    def repeated() -> bool:
        return run_cli(["updateTopic", "--endpoint", proxy.endpoint, "-t", "Later", "-w", "2"]).returncode == 0

    wait_until(repeated, 60, "updateTopic to succeed once broker-b is back")
    assert writer_topics(nodes, restarted)["Later"] == (2, "NORMAL")


def test_a_push_consumer_through_the_proxy_consumes_every_groups_messages(nodes: Nodes, tmp_path: Path) -> None:
    """The official Python PushConsumer through a proxy: its settings and assignment (every
    group's queues) come through the proxy, and its listener is handed every message of
    all three groups, each acknowledged: every group's committed offsets reach its queues'
    ends."""
    writers = start_writers(nodes, tmp_path, NAMES, {"Orders": "NORMAL", "Fifo": "FIFO"})
    (proxy,) = start_proxies(nodes, cluster_file(tmp_path, writers), 1)
    sent = produce(tmp_path, proxy.endpoint, 120)
    wanted = {line["message_id"] for line in sent}
    consumer = Background(tmp_path, "push", "push", proxy.endpoint, GROUP, "Orders", "--seconds", "120")
    try:

        def handled() -> set[str] | None:
            assert consumer.proc.poll() is None, consumer.err_path.read_text()[-2000:]
            seen = {line["message_id"] for line in consumer.lines() if line.get("result") == "SUCCESS"}
            return seen if seen >= wanted else None

        wait_until(handled, 90, "the push consumer to handle every message")

        wait_until(lambda: committed(tmp_path, NAMES), 30, "every group's offsets at its queues' ends")
    finally:
        consumer.stop()
