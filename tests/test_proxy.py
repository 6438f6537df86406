"""Cluster mode: ``rmqstore proxy serve`` processes in front of writer groups (plain
single writers, one per broker name), driven by our own v2 stubs and by the official
Python producer through two proxies (docs/cluster.md)."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.nodes import Nodes, ProcessNode
from support.rmq5 import DRIVERS, client_env, make_topics, rmq5_python, run_python_client
from support.stores import SIZE_ARGS
from support.wait import wait_until

from rmqstore.common.errors import InvalidArgument
from rmqstore.common.files.commitlog import CommitLog
from rmqstore.proxy.cluster import parse_cluster
from rmqstore.rocketmq_v2 import definition_pb2 as v2
from rmqstore.rocketmq_v2 import service_pb2 as v2s
from rmqstore.rocketmq_v2 import service_pb2_grpc
from rmqstore.service.listen import free_port

RPC_TIMEOUT_S = 15.0
COMMITLOG_FILE_BYTES = 65536  # SIZE_ARGS' commit log file size


def cluster_yaml(groups: dict[str, ProcessNode]) -> str:
    lines = ["groups:"]
    for name, writer in groups.items():
        lines += [f"  - name: {name}", f'    writers: ["{writer.endpoint}"]']
    return "\n".join(lines) + "\n"


def start_writers(nodes: Nodes, tmp_path: Path, names: list[str], topics: dict[str, str]) -> dict[str, ProcessNode]:
    """Plain single writers, one per broker name, each with ``topics`` (name: message type)."""
    spawned = {
        name: nodes.spawn("writer", ["writer", "serve", "--store", str(tmp_path / name), "--port", "0", *SIZE_ARGS, "--broker-name", name])
        for name in names
    }
    for writer in spawned.values():
        writer.wait_serving()
        make_topics(writer.endpoint, topics)
    return spawned


def start_proxies(nodes: Nodes, cluster: Path, count: int, *extra: str) -> list[ProcessNode]:
    ports = [free_port("127.0.0.1") for _ in range(count)]
    advertise = ",".join(f"127.0.0.1:{port}" for port in ports)
    proxies = [
        nodes.spawn("proxy", ["proxy", "serve", "--cluster", str(cluster), "--port", str(port), "--advertise", advertise, *extra])
        for port in ports
    ]
    for proxy in proxies:
        proxy.wait_serving()
    return proxies


def records(store: Path) -> list[Any]:
    log = CommitLog(str(store / "commitlog"), COMMITLOG_FILE_BYTES)
    try:
        return list(log.records())
    finally:
        log.close()


def raw_record(store: Path, record: Any) -> bytes:
    """A record's bytes as stored (the commit log's first file holds the test's few)."""
    data = (store / "commitlog" / f"{0:020d}").read_bytes()
    assert record.commitlog_offset + record.size <= len(data)
    return data[record.commitlog_offset : record.commitlog_offset + record.size]


def producer_fields(raw: bytes) -> bytes:
    """A v4-host record with what the store decides zeroed: queue id, queue offset,
    commit log offset, store time and host, and the born host's port (the connection's)."""
    masked = bytearray(raw)
    for start, end in ((12, 16), (20, 36), (52, 56), (56, 72)):
        masked[start:end] = bytes(end - start)
    return bytes(masked)


def v2_message(topic: str, message_id: str, **system: Any) -> v2.Message:
    return v2.Message(
        topic=v2.Resource(name=topic),
        body=b"the same message both ways",
        user_properties={"origin": "test", "seq": "7"},
        system_properties=v2.SystemProperties(
            message_id=message_id,
            keys=["order-7", "customer-1"],
            tag="TagA",
            born_host="10.1.2.3",
            born_timestamp={"seconds": 1_700_000_000, "nanos": 123_000_000},
            body_encoding=v2.IDENTITY,
            **system,
        ),
    )


def send_v2(endpoint: str, message: v2.Message) -> v2s.SendMessageResponse:
    with grpc.insecure_channel(endpoint) as channel:
        answer: v2s.SendMessageResponse = service_pb2_grpc.MessagingServiceStub(channel).SendMessage(
            v2s.SendMessageRequest(messages=[message]), timeout=RPC_TIMEOUT_S
        )
    return answer


def route_brokers(endpoint: str, topic: str) -> Counter[str]:
    with grpc.insecure_channel(endpoint) as channel:
        answer = service_pb2_grpc.MessagingServiceStub(channel).QueryRoute(
            v2s.QueryRouteRequest(topic=v2.Resource(name=topic)), timeout=RPC_TIMEOUT_S
        )
    assert answer.status.code == v2.OK, answer.status
    return Counter(queue.broker.name for queue in answer.message_queues)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("groups: []", "groups must be a non-empty list"),
        ("[1, 2]", "expected a mapping with one key, groups"),
        ("groups:\n  - name: a\n    writers: []", "writers must list at least one endpoint"),
        ("groups:\n  - name: a b\n    writers: ['h:1']", "name must be a broker name without spaces"),
        ("groups:\n  - name: a\n    writers: ['nohost']", "is not HOST:PORT"),
        ("groups:\n  - {name: a, writers: ['h:1']}\n  - {name: a, writers: ['h:2']}", "group a is named twice"),
        ("groups:\n  - {name: a, writers: ['h:1'], replicas: 2}", "unknown field replicas"),
        ("groups: [", "is not YAML"),
    ],
)
def test_a_bad_cluster_file_is_refused_with_its_rule(text: str, problem: str) -> None:
    with pytest.raises(InvalidArgument, match=problem):
        parse_cluster(text)


def test_a_cluster_file_lists_its_groups_in_order() -> None:
    groups = parse_cluster("groups:\n  - {name: broker-b, writers: ['h:2'], queries: ['h:3']}\n  - {name: broker-a, writers: ['h:1', 'h:4']}\n")
    assert [(g.name, g.writers, g.queries) for g in groups] == [("broker-b", ("h:2",), ("h:3",)), ("broker-a", ("h:1", "h:4"), ())]


def test_a_send_through_the_proxy_is_stored_as_the_writers_gateway_stores_it(nodes: Nodes, tmp_path: Path) -> None:
    """The same v2 messages (NORMAL and FIFO to a MIXED topic: keys, tag, message group,
    user properties, born host and time) sent to the writer's gateway and through a proxy to it are stored
    byte for byte alike, but for what the store decides; the receipt is the writer's. The
    cluster file is read again when it changes: a second group joins the routes."""
    writers = start_writers(nodes, tmp_path, ["broker-a", "broker-b"], {"Same": "MIXED"})
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(cluster_yaml({"broker-a": writers["broker-a"]}))
    (proxy,) = start_proxies(nodes, cluster, 1)
    writer = writers["broker-a"]
    pairs = [
        ("NORMAL", {"message_type": v2.NORMAL}),
        ("FIFO", {"message_type": v2.FIFO, "message_group": "group-1", "trace_context": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}),
    ]
    for name, system in pairs:
        direct = send_v2(writer.endpoint, v2_message("Same", f"D{name}", **system))
        proxied = send_v2(proxy.endpoint, v2_message("Same", f"P{name}", **system))
        assert direct.status.code == proxied.status.code == v2.OK, (direct.status, proxied.status)
        assert proxied.entries[0].message_id == f"P{name}"
    assert route_brokers(proxy.endpoint, "Same") == {"broker-a": 4}
    cluster.write_text(cluster_yaml(writers))
    wait_until(lambda: route_brokers(proxy.endpoint, "Same") == {"broker-a": 4, "broker-b": 4}, 30, "broker-b in the route")
    writer.stop()
    stored = {record.properties["UNIQ_KEY"]: record for record in records(tmp_path / "broker-a")}
    assert len(stored) == 4
    for name, _ in pairs:
        direct_record, proxied_record = stored[f"D{name}"], stored[f"P{name}"]
        assert direct_record.properties == {**proxied_record.properties, "UNIQ_KEY": f"D{name}"}
        assert direct_record.properties["__BORNHOST"] == "10.1.2.3"
        assert direct_record.born_host.ip == proxied_record.born_host.ip == bytes([127, 0, 0, 1])
        direct_raw = raw_record(tmp_path / "broker-a", direct_record).replace(f"D{name}".encode(), f"P{name}".encode())
        assert producer_fields(direct_raw) == producer_fields(raw_record(tmp_path / "broker-a", proxied_record))


def stored_everywhere(tmp_path: Path, names: list[str]) -> dict[str, list[Any]]:
    return {name: records(tmp_path / name) for name in names}


def test_the_python_producer_sends_through_two_proxies_to_three_groups(nodes: Nodes, tmp_path: Path) -> None:
    """The official Python producer, given both proxies, sends NORMAL and FIFO messages:
    the routes list every group's queues; every acknowledged message is stored once, in
    one group, at the queue offset its receipt names; each FIFO message group stays on
    one group's queue, in send order; every group takes a share."""
    names = ["broker-a", "broker-b", "broker-c"]
    writers = start_writers(nodes, tmp_path, names, {"Orders": "NORMAL", "Fifo": "FIFO"})
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(cluster_yaml(writers))
    proxies = start_proxies(nodes, cluster, 2)
    endpoints = ";".join(proxy.endpoint for proxy in proxies)
    lines = run_python_client(tmp_path, "send", endpoints, "Orders", "Fifo", "240")
    sent = [line for line in lines if "message_id" in line]
    assert len(sent) == 240
    for proxy in proxies:
        assert route_brokers(proxy.endpoint, "Orders") == {name: 4 for name in names}
    for writer in writers.values():
        writer.stop()
    stored = stored_everywhere(tmp_path, names)
    where: dict[str, tuple[str, Any]] = {}
    for name, found in stored.items():
        for record in found:
            uniq_key = record.properties["UNIQ_KEY"]
            assert uniq_key not in where, f"{uniq_key} stored twice"
            where[uniq_key] = (name, record)
    assert set(where) == {line["message_id"] for line in sent}
    for line in sent:
        name, record = where[line["message_id"]]
        assert record.queue_offset == line["offset"]
        assert record.body.decode() == line["body"] and record.topic == line["topic"]
        if "tag" in line:
            assert record.properties["TAGS"] == line["tag"] and record.properties["seq"] == line["properties"]["seq"]
    fifo: dict[str, list[tuple[str, int, int, int]]] = defaultdict(list)
    for line in sent:
        if "group" in line:
            name, record = where[line["message_id"]]
            fifo[line["group"]].append((name, record.queue_id, record.queue_offset, line["n"]))
    assert len(fifo) == 8
    for group, placed in fifo.items():
        assert len({(name, queue_id) for name, queue_id, _, _ in placed}) == 1, group
        assert [n for *_, n in sorted(placed)] == sorted(n for *_, n in placed), group
    shares = Counter(name for name, _ in where.values())
    assert set(shares) == set(names) and min(shares.values()) >= 30, shares


class Loop:
    """The Python producer's ``loop`` (synchronous sends until killed), its receipts read
    as they come."""

    def __init__(self, tmp_path: Path, endpoints: str, topic: str):
        home = tmp_path / "client-home"
        home.mkdir(exist_ok=True)
        self.stderr = open(tmp_path / "client.stderr", "wb")
        self.proc = subprocess.Popen(
            [rmq5_python(), str(DRIVERS / "python_producer.py"), "loop", endpoints, topic, "300"],
            stdout=subprocess.PIPE, stderr=self.stderr, env=client_env(home),
        )  # fmt: skip
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        self.acknowledged: list[dict[str, Any]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, count: int, timeout_s: float = 60.0) -> None:
        """Until ``count`` more sends are acknowledged."""
        target = len(self.acknowledged) + count
        deadline = time.monotonic() + timeout_s
        while len(self.acknowledged) < target:
            line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.1))
            assert line is not None, "the client stopped"
            event = json.loads(line)
            if "message_id" in event:
                self.acknowledged.append(event)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)
        self.reader.join(timeout=30)
        while not self.lines.empty():
            line = self.lines.get()
            if line is not None and "message_id" in (event := json.loads(line)):
                self.acknowledged.append(event)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.stderr.close()


@pytest.mark.crash
def test_killing_a_proxy_and_a_group_loses_no_acknowledged_send(nodes: Nodes, tmp_path: Path) -> None:
    """The Python producer's send loop through two proxies: SIGKILL the proxy it is
    connected to and it goes on through the other; SIGKILL one group's writer and its
    sends go on to the other groups. Every acknowledged message is stored (a send whose
    answer was lost is sent again by the client: at most its three attempts' copies)."""
    names = ["broker-a", "broker-b", "broker-c"]
    writers = start_writers(nodes, tmp_path, names, {"Orders": "NORMAL"})
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(cluster_yaml(writers))
    proxies = start_proxies(nodes, cluster, 2)
    loop = Loop(tmp_path, ";".join(proxy.endpoint for proxy in proxies), "Orders")
    try:
        loop.wait_for(60)
        # The client's channel picks the first address of its sorted list.
        first = min(proxies, key=lambda proxy: proxy.endpoint)
        first.kill()
        loop.wait_for(60)
        writers["broker-b"].kill()
        killed_at = len(loop.acknowledged)
        loop.wait_for(100)
    finally:
        loop.stop()
    after_kill = loop.acknowledged[killed_at + 20 :]
    for name in ("broker-a", "broker-c"):
        writers[name].stop()
    restarted = nodes.start("writer", tmp_path / "broker-b", *SIZE_ARGS, "--broker-name", "broker-b")
    restarted.stop()
    stored = stored_everywhere(tmp_path, names)
    copies = Counter(record.properties["UNIQ_KEY"] for found in stored.values() for record in found)
    missing = {event["message_id"] for event in loop.acknowledged} - set(copies)
    assert not missing, f"{len(missing)} acknowledged messages lost"
    assert max(copies.values()) <= 3
    in_b = {record.properties["UNIQ_KEY"] for record in stored["broker-b"]}
    assert not in_b & {event["message_id"] for event in after_kill}, "sends went to the killed group"
