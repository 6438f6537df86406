"""Cluster mode end to end, as one run (docs/cluster.md): three writer groups, each with
its query node and its own store host, and two ``rmqstore proxy serve`` in front of them,
all on 127.0.0.1. The official Python producer, given both proxies, and the official
Node.js producer, given one (rocketmq-client-nodejs 1.x dials one address: its gRPC
target ``H:P,H:P`` is not one grpc-js resolves, docs/cluster.md), send across every
group's queues; two official SimpleConsumers of one consumer group, through
the proxies, receive and acknowledge each message exactly once; every message is then
looked up through a proxy by key, UNIQ_KEY, message id, queue offset and time, each
answer equal to the owning group's query node asked directly; ``consumerProgress``
through a proxy shows diff 0 on every group.

CLUSTER_MESSAGES: messages each producer sends (default 300 here; the acceptance size is
30,000 in all: ``CLUSTER_MESSAGES=15000``)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.cli import run_cli
from support.nodes import Nodes, ProcessNode
from support.rmq5 import run_node, run_python_client
from support.wait import wait_until
from test_proxy import records
from test_proxy_consumers import GROUP, acked_ids, cluster_file, consumers, wait_all_acked
from test_proxy_lookups import start_group, wire

from rmqstore.common.codec.msgid import offset_msg_id
from rmqstore.v1 import messages_pb2, query_pb2, query_pb2_grpc

MESSAGES = int(os.environ.get("CLUSTER_MESSAGES", "300"))
NAMES = ["broker-a", "broker-b", "broker-c"]
TIMEOUT_S = 30.0


@pytest.mark.slow
def test_two_producers_two_consumers_and_every_lookup_through_two_proxies_over_three_groups(nodes: Nodes, tmp_path: Path) -> None:
    started = {name: start_group(nodes, tmp_path, name) for name in NAMES}
    writers: dict[str, ProcessNode] = {name: writer for name, (writer, _) in started.items()}
    queries: dict[str, ProcessNode] = {name: query for name, (_, query) in started.items()}
    # Each proxy's routes name itself (the default --advertise): the Node.js client works
    # only through routes naming one address.
    config = cluster_file(tmp_path, writers, queries)
    proxies = [nodes.spawn("proxy", ["proxy", "serve", "--cluster", str(config), "--port", "0"]) for _ in range(2)]
    for proxy in proxies:
        proxy.wait_serving()
    for topic, message_type in (("Orders", "NORMAL"), ("Fifo", "FIFO")):
        made = run_cli(["updateTopic", "--endpoint", proxies[0].endpoint, "-t", topic, "-w", "4", "-a", f"+message.type={message_type}"])
        assert made.returncode == 0, made.stderr
    endpoints = ";".join(proxy.endpoint for proxy in proxies)

    # Both producers at once, and the consumers from the start: messages are taken while
    # others are still being sent.
    running = consumers(tmp_path, endpoints)
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            python = pool.submit(run_python_client, tmp_path, "send", endpoints, "Orders", "Fifo", str(MESSAGES))
            node = pool.submit(run_node, tmp_path, "official_producer.js", proxies[1].endpoint, "Orders", str(MESSAGES))
            python_lines = python.result()
            node_lines = [json.loads(line) for line in node.result().splitlines()]
        sent = [line for line in python_lines if "message_id" in line] + node_lines
        assert len(sent) == 2 * MESSAGES
        wanted = {line["message_id"] for line in sent if line["topic"] == "Orders"}
        assert len(wanted) == 2 * MESSAGES - MESSAGES // 4  # the Python producer's quarter went to Fifo
        wait_all_acked(running, wanted, timeout_s=max(180.0, MESSAGES / 5))  # 30,000 took 12 min at load 30
        time.sleep(1.0)  # an acknowledgement the wait raced with
        acked = acked_ids(running)
    finally:
        shares = [len([line for line in consumer.stop() if line.get("acked")]) for consumer in running]
    assert set(acked) == wanted
    assert max(acked.values()) == 1, [k for k, n in acked.items() if n > 1][:5]
    assert all(share > 0 for share in shares), shares

    def progress() -> dict[str, Any] | None:
        shown = run_cli(["consumerProgress", "--endpoint", proxies[1].endpoint, "-g", GROUP, "-t", "Orders", "--json"])
        assert shown.returncode == 0, shown.stderr
        document: dict[str, Any] = shown.json_lines()[0]
        return document if document["diffTotal"] == 0 and {q["brokerName"] for q in document["queues"]} == set(NAMES) else None

    # The writers flush consumer offsets every second; the query nodes then read them.
    shown = wait_until(progress, 30, "consumerProgress through the proxy to show diff 0 on every group")
    assert sorted((q["brokerName"], q["queueId"]) for q in shown["queues"]) == [(name, q) for name in NAMES for q in range(4)]
    assert all(q["diff"] == 0 and q["consumerOffset"] == q["brokerOffset"] > 0 for q in shown["queues"]), shown

    # Where each message is: its group's commit log, read from the files.
    for writer in writers.values():
        writer.stop()
    where: dict[str, tuple[str, Any]] = {}
    for name in NAMES:
        for record in records(tmp_path / name):
            if record.topic not in ("Orders", "Fifo"):
                continue  # retry topics: a redelivery's copy keeps its UNIQ_KEY
            uniq_key = record.properties["UNIQ_KEY"]
            assert uniq_key not in where, f"{uniq_key} stored twice"
            where[uniq_key] = (name, record)
    assert {line["message_id"] for line in sent} <= set(where)
    shares_stored = Counter(where[line["message_id"]][0] for line in sent)
    assert set(shares_stored) == set(NAMES) and min(shares_stored.values()) >= len(sent) // 10, shares_stored

    channels = [grpc.insecure_channel(endpoint) for endpoint in [p.endpoint for p in proxies] + [q.endpoint for q in queries.values()]]
    try:
        through = [query_pb2_grpc.QueryServiceStub(channel) for channel in channels[:2]]
        direct = {name: query_pb2_grpc.QueryServiceStub(channel) for name, channel in zip(NAMES, channels[2:], strict=True)}

        def look_up(index: int) -> None:
            line = sent[index]
            name, record = where[line["message_id"]]
            proxy, own = through[index % 2], direct[name]
            topic = line["topic"]
            # The proxy places each send itself, as Apache's does (docs/cluster.md): the
            # receipt's offset is the stored one; the queue it names is the client's choice.
            assert (record.topic, record.queue_offset) == (topic, line["offset"]), (line, name)
            by_key = query_pb2.QueryByKeyRequest(topic=topic, key=line["keys"][-1], page_size=10)  # order-N, node-order-N, fifo-N
            answer = proxy.QueryByKey(by_key, timeout=TIMEOUT_S)
            assert answer.complete and not answer.unanswered_groups
            assert [wire(m) for m in answer.messages] == [wire(m) for m in own.QueryByKey(by_key, timeout=TIMEOUT_S).messages]
            assert line["message_id"] in {m.uniq_key for m in answer.messages}
            by_uniq = query_pb2.QueryByUniqKeyRequest(topic=topic, uniq_key=line["message_id"])
            answer_uniq = proxy.QueryByUniqKey(by_uniq, timeout=TIMEOUT_S)
            assert answer_uniq.complete and [wire(m) for m in answer_uniq.messages] == [
                wire(m) for m in own.QueryByUniqKey(by_uniq, timeout=TIMEOUT_S).messages
            ]
            assert [m.commitlog_offset for m in answer_uniq.messages] == [record.commitlog_offset]
            by_id = query_pb2.QueryByMsgIdRequest(msg_id=offset_msg_id(record.store_host, record.commitlog_offset))
            found = proxy.QueryByMsgId(by_id, timeout=TIMEOUT_S).message
            assert wire(found) == wire(own.QueryByMsgId(by_id, timeout=TIMEOUT_S).message)
            assert (found.uniq_key, found.body) == (line["message_id"], line["body"].encode())
            at = query_pb2.QueryByQueueOffsetRequest(topic=topic, queue_id=record.queue_id, queue_offset=record.queue_offset)
            routed = query_pb2.QueryByQueueOffsetRequest(broker_name=name)
            routed.MergeFrom(at)
            assert wire(proxy.QueryByQueueOffset(routed, timeout=TIMEOUT_S).message) == wire(found)
            assert wire(own.QueryByQueueOffset(at, timeout=TIMEOUT_S).message) == wire(found)

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(look_up, range(len(sent))))

        # By time: every queue of every group streamed over its whole span through a proxy
        # equals the group's own answer, and holds each message sent to it once.
        streamed: Counter[str] = Counter()
        for name in NAMES:
            for topic in ("Orders", "Fifo"):
                for queue_id in range(4):
                    span = query_pb2.StreamByTimeRequest(topic=topic, queue_id=queue_id, begin_ms=0, end_ms=2**62)
                    routed_span = query_pb2.StreamByTimeRequest(broker_name=name)
                    routed_span.MergeFrom(span)
                    answer_span = [wire(m) for m in through[queue_id % 2].StreamByTime(routed_span, timeout=TIMEOUT_S)]
                    assert answer_span == [wire(m) for m in direct[name].StreamByTime(span, timeout=TIMEOUT_S)]
                    for raw in answer_span:
                        streamed[messages_pb2.StoredMessage.FromString(raw).uniq_key] += 1
        assert all(streamed[line["message_id"]] == 1 for line in sent)
    finally:
        for channel in channels:
            channel.close()
