"""Cluster mode's calls routed to one group (docs/cluster.md): pull and offset calls by the
queue's broker name, transactions (the official Python client through two proxies over
three groups: commit, rollback, and an open transaction checked through a proxy's
Telemetry stream), delay messages and their recall, through ``rmqstore proxy serve``
processes in front of real writer groups."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
from google.protobuf import duration_pb2
from support.nodes import Nodes
from test_proxy import send_v2, start_proxies, start_writers, v2_message
from test_proxy_consumers import cluster_file

from rmqstore.rocketmq_v2 import definition_pb2 as v2
from rmqstore.rocketmq_v2 import service_pb2 as v2s
from rmqstore.rocketmq_v2 import service_pb2_grpc

NAMES = ["broker-a", "broker-b", "broker-c"]
RPC_TIMEOUT_S = 15.0
GROUP = "Pullers"


def messaging(endpoint: str) -> tuple[grpc.Channel, service_pb2_grpc.MessagingServiceStub]:
    channel = grpc.insecure_channel(endpoint)
    return channel, service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]  # generated


def queue_of(topic: str, broker: str, queue_id: int) -> v2.MessageQueue:
    return v2.MessageQueue(topic=v2.Resource(name=topic), id=queue_id, broker=v2.Broker(name=broker))


def pulled(stub: service_pb2_grpc.MessagingServiceStub, queue: v2.MessageQueue, offset: int) -> list[Any]:
    """A pull's answers, each as (kind, value): the status code, each message's id, queue
    offset and body, the next offset."""
    request = v2s.PullMessageRequest(
        group=v2.Resource(name=GROUP), message_queue=queue, offset=offset, batch_size=32,
        filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"),
        long_polling_timeout=duration_pb2.Duration(seconds=0),
    )  # fmt: skip
    out: list[Any] = []
    for answer in stub.PullMessage(request, timeout=RPC_TIMEOUT_S):
        content = answer.WhichOneof("content")
        if content == "status":
            out.append(("status", answer.status.code))
        elif content == "message":
            system = answer.message.system_properties
            out.append(("message", system.message_id, system.queue_offset, system.queue_id, answer.message.body))
        else:
            out.append(("next", answer.next_offset))
    return out


def offsets(stub: service_pb2_grpc.MessagingServiceStub, queue: v2.MessageQueue) -> tuple[Any, ...]:
    begin = stub.QueryOffset(v2s.QueryOffsetRequest(message_queue=queue, query_offset_policy=v2.BEGINNING), timeout=RPC_TIMEOUT_S)
    end = stub.QueryOffset(v2s.QueryOffsetRequest(message_queue=queue, query_offset_policy=v2.END), timeout=RPC_TIMEOUT_S)
    at = stub.QueryOffset(
        v2s.QueryOffsetRequest(message_queue=queue, query_offset_policy=v2.TIMESTAMP, timestamp={"seconds": 1}), timeout=RPC_TIMEOUT_S
    )
    committed = stub.GetOffset(v2s.GetOffsetRequest(group=v2.Resource(name=GROUP), message_queue=queue), timeout=RPC_TIMEOUT_S)
    return tuple((a.status.code, a.offset) for a in (begin, end, at, committed))


def test_pull_and_offset_calls_through_a_proxy_answer_as_each_groups_writer(nodes: Nodes, tmp_path: Path) -> None:
    """On every group's queues, PullMessage, QueryOffset (beginning, end, time) and
    GetOffset through a proxy answer what the group's writer answers directly; an
    UpdateOffset through the proxy moves that group's offset only. A broker name the
    cluster file does not list is BAD_REQUEST; a group that is down HA_NOT_AVAILABLE."""
    writers = start_writers(nodes, tmp_path, NAMES, {"Orders": "NORMAL"})
    (proxy,) = start_proxies(nodes, cluster_file(tmp_path, writers), 1)
    for n in range(24):
        assert send_v2(proxy.endpoint, v2_message("Orders", f"M{n:04d}", message_type=v2.NORMAL)).status.code == v2.OK
    via_channel, via = messaging(proxy.endpoint)
    try:
        stored = 0
        for name, writer in writers.items():
            direct_channel, direct = messaging(writer.endpoint)
            try:
                for queue_id in range(4):
                    queue = queue_of("Orders", name, queue_id)
                    through = offsets(via, queue)
                    assert through == offsets(direct, queue)
                    stored += through[1][1]
                    assert pulled(via, queue, 0) == pulled(direct, queue, 0)
                    assert pulled(via, queue, through[1][1]) == pulled(direct, queue, through[1][1]) == [
                        ("status", v2.MESSAGE_NOT_FOUND), ("next", through[1][1])
                    ]
                update = v2s.UpdateOffsetRequest(group=v2.Resource(name=GROUP), message_queue=queue_of("Orders", name, 1), offset=1)
                if offsets(direct, queue_of("Orders", name, 1))[1][1] >= 1:
                    assert via.UpdateOffset(update, timeout=RPC_TIMEOUT_S).status.code == v2.OK
                    assert offsets(direct, queue_of("Orders", name, 1))[3] == (v2.OK, 1)
            finally:
                direct_channel.close()
        assert stored == 24  # the proxy spread the sends; every queue of every group was compared
        unknown = queue_of("Orders", "broker-x", 0)
        answer = via.GetOffset(v2s.GetOffsetRequest(group=v2.Resource(name=GROUP), message_queue=unknown), timeout=RPC_TIMEOUT_S)
        assert answer.status.code == v2.BAD_REQUEST
        assert "broker-x" in answer.status.message and "cluster file" in answer.status.message
        assert pulled(via, unknown, 0) == [("status", v2.BAD_REQUEST)]
        writers["broker-b"].kill()
        down = queue_of("Orders", "broker-b", 0)
        answer = via.QueryOffset(v2s.QueryOffsetRequest(message_queue=down, query_offset_policy=v2.END), timeout=RPC_TIMEOUT_S)
        assert answer.status.code == v2.HA_NOT_AVAILABLE, answer.status
        assert pulled(via, down, 0) == [("status", v2.HA_NOT_AVAILABLE)]
        assert offsets(via, queue_of("Orders", "broker-a", 0))[0][0] == v2.OK
    finally:
        via_channel.close()
