"""Lookups through a proxy (cluster mode, docs/cluster.md): three writer groups, each with
its query node, and proxies in front, all processes on 127.0.0.1. Every answer through a
proxy is compared with the owning group's query node asked directly."""

from __future__ import annotations

import base64
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from support.cli import run_cli
from support.nodes import Nodes, ProcessNode, send_all
from support.rmq5 import make_topics
from support.stores import SIZE_ARGS
from support.wait import wait_until

from rmqstore.proxy.lookup_cursor import (
    MALFORMED,
    GroupPosition,
    decode_merged_cursor,
    encode_merged_cursor,
)
from rmqstore.query.cursor import query_digest
from rmqstore.v1 import messages_pb2, query_pb2, query_pb2_grpc, writer_pb2

GROUPS = ["broker-a", "broker-b", "broker-c"]
TOPIC = "TopicLookups"
SHARED_KEY = "shared"  # every message's key: 5,000 matches over the three groups
MESSAGES = 5000
SAMPLED = 12  # per group, looked up one by one every way
TIMEOUT_S = 30.0


@dataclass
class Group:
    name: str
    store: Path
    writer: ProcessNode
    query: ProcessNode
    sent: list[messages_pb2.SendResult] = field(default_factory=list)


@dataclass
class Cluster:
    nodes: Nodes
    groups: dict[str, Group]
    proxies: list[ProcessNode]
    cursor_key: Path

    def proxy(self, index: int = 0) -> query_pb2_grpc.QueryServiceStub:
        return self.nodes.query(self.proxies[index])

    def direct(self, name: str) -> query_pb2_grpc.QueryServiceStub:
        return self.nodes.query(self.groups[name].query)


def cluster_yaml(groups: dict[str, Group]) -> str:
    lines = ["groups:"]
    for group in groups.values():
        lines += [
            f"  - name: {group.name}",
            f'    writers: ["{group.writer.endpoint}"]',
            f'    queries: ["{group.query.endpoint}"]',
        ]
    return "\n".join(lines) + "\n"


def store_host(name: str) -> str:
    return f"127.0.0.{GROUPS.index(name) + 1}:10911"


def id_prefix(name: str) -> str:
    """The start of the offsetMsgIds of a group's writer: its store host."""
    host, port = store_host(name).split(":")
    return bytes(int(part) for part in host.split(".")).hex().upper() + f"{int(port):08X}"


def start_group(
    nodes: Nodes, root: Path, name: str, writer_port: int = 0, query_port: int = 0
) -> tuple[ProcessNode, ProcessNode]:
    """A group's writer (its own store host, as on a machine of its own) and query node."""
    store = root / name
    writer = nodes.spawn(
        "writer",
        [
            "writer",
            "serve",
            "--store",
            str(store),
            "--port",
            str(writer_port),
            *SIZE_ARGS,
            "--broker-name",
            name,
            "--store-host",
            store_host(name),
        ],
    )
    writer.wait_serving()
    query = nodes.spawn(
        "query",
        [
            "query",
            "serve",
            "--store",
            str(store),
            "--port",
            str(query_port),
            *SIZE_ARGS,
            "--broker-name",
            name,
        ],
    )
    query.wait_serving()
    return writer, query


def start_proxy(nodes: Nodes, cluster_file: Path, cursor_key: Path) -> ProcessNode:
    proxy = nodes.spawn(
        "proxy",
        [
            "proxy",
            "serve",
            "--cluster",
            str(cluster_file),
            "--port",
            "0",
            "--cursor-key",
            str(cursor_key),
        ],
    )
    proxy.wait_serving()
    return proxy


def message(index: int) -> messages_pb2.Message:
    return messages_pb2.Message(
        topic=TOPIC,
        body=f"body {index}".encode(),
        keys=[SHARED_KEY, f"k-{index}"],
        tags="TagA",
        properties={"seq": str(index)},
    )


def build(nodes: Nodes, root: Path) -> Cluster:
    groups = {}
    for name in GROUPS:
        writer, query = start_group(nodes, root, name)
        make_topics(writer.endpoint, {TOPIC: "NORMAL"})
        groups[name] = Group(name, root / name, writer, query)
    # The messages in turn over the groups, so that store times interleave across them.
    for start in range(0, MESSAGES, 500):
        for turn, group in enumerate(groups.values()):
            chunk = [
                message(i)
                for i in range(start, min(start + 500, MESSAGES))
                if i % len(groups) == turn
            ]
            group.sent += send_all(nodes.writer(group.writer), chunk, batch=len(chunk))
    cluster_file = root / "cluster.yaml"
    cluster_file.write_text(cluster_yaml(groups))
    cursor_key = root / "proxy-cursor.key"
    proxies = [start_proxy(nodes, cluster_file, cursor_key) for _ in range(2)]
    cluster = Cluster(nodes, groups, proxies, cursor_key)
    for name in GROUPS:
        wait_caught_up(cluster.direct(name), len(groups[name].sent))
    return cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("cluster")
    (root / "logs").mkdir()
    nodes = Nodes(root / "logs")
    try:
        yield build(nodes, root)
    finally:
        nodes.close()


def key_pages(
    stub: query_pb2_grpc.QueryServiceStub, key: str, page_size: int
) -> Iterator[query_pb2.QueryByKeyResponse]:
    cursor = ""
    while True:
        page = stub.QueryByKey(
            query_pb2.QueryByKeyRequest(topic=TOPIC, key=key, page_size=page_size, cursor=cursor),
            timeout=TIMEOUT_S,
        )
        yield page
        if page.complete or not page.messages:
            return
        cursor = page.cursor


def wait_caught_up(direct: query_pb2_grpc.QueryServiceStub, count: int) -> None:
    """Until a query node shows the group's ``count`` messages."""
    wait_until(
        lambda: len(next(key_pages(direct, SHARED_KEY, MESSAGES)).messages) == count,
        30,
        "the query node to catch up",
    )


def wire(stored: messages_pb2.StoredMessage) -> bytes:
    """A message's bytes (map entries in key order: protobuf leaves their order free)."""
    return stored.SerializeToString(deterministic=True)


def owners(cluster: Cluster) -> dict[str, str]:
    """Each message id sent, with its group."""
    return {r.offset_msg_id: name for name, group in cluster.groups.items() for r in group.sent}


def sampled(cluster: Cluster) -> Iterator[tuple[str, int, messages_pb2.SendResult]]:
    for turn, (name, group) in enumerate(cluster.groups.items()):
        step = len(group.sent) // SAMPLED
        for position in range(0, len(group.sent), step)[:SAMPLED]:
            yield name, position * len(GROUPS) + turn, group.sent[position]


def test_every_way_of_looking_a_message_up_through_the_proxy_answers_as_its_groups_query_node(
    cluster: Cluster,
) -> None:
    proxy = cluster.proxy()
    for name, index, sent in sampled(cluster):
        direct = cluster.direct(name)
        request = query_pb2.QueryByKeyRequest(topic=TOPIC, key=f"k-{index}", page_size=10)
        through = proxy.QueryByKey(request, timeout=TIMEOUT_S)
        assert through.complete and not through.unanswered_groups and not through.cursor
        assert [wire(m) for m in through.messages] == [
            wire(m) for m in direct.QueryByKey(request, timeout=TIMEOUT_S).messages
        ]
        assert [m.offset_msg_id for m in through.messages] == [sent.offset_msg_id]

        by_uniq = query_pb2.QueryByUniqKeyRequest(topic=TOPIC, uniq_key=sent.uniq_key)
        through_uniq = proxy.QueryByUniqKey(by_uniq, timeout=TIMEOUT_S)
        assert through_uniq.complete and [wire(m) for m in through_uniq.messages] == [
            wire(m) for m in direct.QueryByUniqKey(by_uniq, timeout=TIMEOUT_S).messages
        ]

        by_id = query_pb2.QueryByMsgIdRequest(msg_id=sent.offset_msg_id)
        found = proxy.QueryByMsgId(by_id, timeout=TIMEOUT_S).message
        assert wire(found) == wire(direct.QueryByMsgId(by_id, timeout=TIMEOUT_S).message)

        at = query_pb2.QueryByQueueOffsetRequest(
            topic=TOPIC, queue_id=sent.queue_id, queue_offset=sent.queue_offset
        )
        routed = query_pb2.QueryByQueueOffsetRequest(broker_name=name)
        routed.MergeFrom(at)
        by_offset = proxy.QueryByQueueOffset(routed, timeout=TIMEOUT_S).message
        assert wire(by_offset) == wire(direct.QueryByQueueOffset(at, timeout=TIMEOUT_S).message)
        assert wire(by_offset) == wire(found)

        for boundary in (query_pb2.BOUNDARY_LOWER, query_pb2.BOUNDARY_UPPER):
            search = query_pb2.SearchOffsetRequest(
                topic=TOPIC,
                queue_id=sent.queue_id,
                timestamp_ms=found.store_timestamp_ms,
                boundary=boundary,
            )
            routed_search = query_pb2.SearchOffsetRequest(broker_name=name)
            routed_search.MergeFrom(search)
            assert proxy.SearchOffset(routed_search, timeout=TIMEOUT_S) == direct.SearchOffset(
                search, timeout=TIMEOUT_S
            )

        span = query_pb2.StreamByTimeRequest(
            topic=TOPIC,
            queue_id=sent.queue_id,
            begin_ms=found.store_timestamp_ms,
            end_ms=found.store_timestamp_ms,
        )
        routed_span = query_pb2.StreamByTimeRequest(broker_name=name)
        routed_span.MergeFrom(span)
        streamed = [wire(m) for m in proxy.StreamByTime(routed_span, timeout=TIMEOUT_S)]
        assert streamed == [wire(m) for m in direct.StreamByTime(span, timeout=TIMEOUT_S)]
        assert wire(found) in streamed


def test_a_queue_lookup_names_its_group_when_the_proxy_fronts_several(cluster: Cluster) -> None:
    proxy = cluster.proxy()
    request = query_pb2.QueryByQueueOffsetRequest(topic=TOPIC, queue_id=0, queue_offset=0)
    with pytest.raises(grpc.RpcError) as missing:
        proxy.QueryByQueueOffset(request, timeout=TIMEOUT_S)
    assert missing.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert missing.value.details() == (
        "this proxy fronts 3 writer groups (broker-a, broker-b, broker-c): give the broker name of the queue"
    )
    request.broker_name = "broker-x"
    with pytest.raises(grpc.RpcError) as unknown:
        proxy.QueryByQueueOffset(request, timeout=TIMEOUT_S)
    assert unknown.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        unknown.value.details()
        == "no writer group broker-x in the cluster (its groups: broker-a, broker-b, broker-c)"
    )
    # A group's own refusal comes through as the query node gave it.
    request.broker_name, request.queue_offset = "broker-b", 10**9
    with pytest.raises(grpc.RpcError) as past:
        proxy.QueryByQueueOffset(request, timeout=TIMEOUT_S)
    direct = query_pb2.QueryByQueueOffsetRequest(topic=TOPIC, queue_id=0, queue_offset=10**9)
    with pytest.raises(grpc.RpcError) as past_direct:
        cluster.direct("broker-b").QueryByQueueOffset(direct, timeout=TIMEOUT_S)
    assert (past.value.code(), past.value.details()) == (
        past_direct.value.code(),
        past_direct.value.details(),
    )


def test_topics_are_every_groups_queues_under_their_broker_names(cluster: Cluster) -> None:
    listed = cluster.proxy().ListTopics(query_pb2.ListQueryTopicsRequest(), timeout=TIMEOUT_S)
    assert not listed.unanswered_groups
    topic = next(t for t in listed.topics if t.name == TOPIC)
    for name in GROUPS:
        direct = next(
            t
            for t in cluster.direct(name)
            .ListTopics(query_pb2.ListQueryTopicsRequest(), timeout=TIMEOUT_S)
            .topics
            if t.name == TOPIC
        )
        shown = [q for q in topic.queues if q.broker_name == name]
        for queue in shown:
            queue.broker_name = ""
        assert shown == list(direct.queues)
    status = run_cli(
        ["topicStatus", "--endpoint", cluster.proxies[0].endpoint, "-t", TOPIC, "--json"]
    )
    assert status.returncode == 0, status.stderr
    rows = status.json_lines()[0]
    assert sorted((r["brokerName"], r["queueId"]) for r in rows) == [
        (name, q) for name in GROUPS for q in range(4)
    ]
    assert sum(r["maxOffset"] for r in rows) == MESSAGES


def test_a_key_with_5000_matches_over_three_groups_pages_to_its_end_each_message_once_in_order(
    cluster: Cluster,
) -> None:
    """Acceptance 3: pages of 700 through one proxy then the other (their cursor key is
    shared), every message once, newest first, each group's in its own node's order."""
    cursor, seen, pages = "", [], 0
    while True:
        stub = cluster.proxy(pages % 2)
        page = stub.QueryByKey(
            query_pb2.QueryByKeyRequest(topic=TOPIC, key=SHARED_KEY, page_size=700, cursor=cursor),
            timeout=TIMEOUT_S,
        )
        pages += 1
        assert not page.unanswered_groups
        seen += list(page.messages)
        if page.complete:
            assert not page.cursor
            break
        assert len(page.messages) == 700 and page.cursor
        cursor = page.cursor
    assert pages == 8
    ids = [m.offset_msg_id for m in seen]
    assert len(ids) == len(set(ids)) == MESSAGES
    assert set(ids) == {r.offset_msg_id for g in cluster.groups.values() for r in g.sent}
    times = [m.store_timestamp_ms for m in seen]
    assert times == sorted(times, reverse=True)
    owner = owners(cluster)
    for name in GROUPS:
        direct = [
            wire(m) for p in key_pages(cluster.direct(name), SHARED_KEY, 1000) for m in p.messages
        ]
        assert [wire(m) for m in seen if owner[m.offset_msg_id] == name] == direct
    # The CLI through the proxy: the same messages in the same order.
    shown = run_cli(
        [
            "queryMsgByKey",
            "--endpoint",
            cluster.proxies[1].endpoint,
            "-t",
            TOPIC,
            "-k",
            SHARED_KEY,
            "--json",
        ],
        timeout_s=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert [line["msgId"] for line in shown.json_lines()] == ids


def test_a_forged_or_tampered_cursor_is_refused(cluster: Cluster) -> None:
    proxy = cluster.proxy()
    first = proxy.QueryByKey(
        query_pb2.QueryByKeyRequest(topic=TOPIC, key=SHARED_KEY, page_size=5), timeout=TIMEOUT_S
    )
    raw = base64.urlsafe_b64decode(first.cursor + "=" * (-len(first.cursor) % 4))
    flipped = bytearray(raw)
    flipped[5] ^= 1  # inside the first group's position
    node_cursor = (
        cluster.direct("broker-a")
        .QueryByKey(
            query_pb2.QueryByKeyRequest(topic=TOPIC, key=SHARED_KEY, page_size=5), timeout=TIMEOUT_S
        )
        .cursor
    )
    # A cursor with every group done, signed with another key.
    query = query_digest("proxy-key", TOPIC, SHARED_KEY, "", "")
    other_key = encode_merged_cursor(
        b"\x01" * 32, [GroupPosition(name, done=True) for name in GROUPS], query
    )
    forged = [
        base64.urlsafe_b64encode(bytes(flipped)).decode().rstrip("="),
        first.cursor[:-1] + ("A" if first.cursor[-1] != "A" else "B"),
        first.cursor + "A",
        first.cursor[:-4],
        node_cursor,
        other_key,
        "!" * 40,
        "A" * 300_000,
    ]
    for cursor in forged:
        with pytest.raises(grpc.RpcError) as refused:
            proxy.QueryByKey(
                query_pb2.QueryByKeyRequest(
                    topic=TOPIC, key=SHARED_KEY, page_size=5, cursor=cursor
                ),
                timeout=TIMEOUT_S,
            )
        assert (refused.value.code(), refused.value.details()) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            MALFORMED,
        ), cursor[:50]
    # A cursor continues only its own lookup: another key's, or a UNIQ_KEY lookup, refuses it.
    with pytest.raises(grpc.RpcError) as other_query:
        proxy.QueryByKey(
            query_pb2.QueryByKeyRequest(topic=TOPIC, key="k-1", page_size=5, cursor=first.cursor),
            timeout=TIMEOUT_S,
        )
    assert (other_query.value.code(), other_query.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        MALFORMED,
    )
    with pytest.raises(grpc.RpcError) as uniq:
        proxy.QueryByUniqKey(
            query_pb2.QueryByUniqKeyRequest(topic=TOPIC, uniq_key="0" * 32, cursor=first.cursor),
            timeout=TIMEOUT_S,
        )
    assert (uniq.value.code(), uniq.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        MALFORMED,
    )
    # The genuine one decodes to a position in each group.
    key = (cluster.cursor_key.read_text().split("\n")[1]).encode()
    positions = decode_merged_cursor(bytes.fromhex(key.decode()), first.cursor, query)
    assert [p.group for p in positions] == GROUPS and not any(p.done for p in positions)


def test_a_message_id_goes_to_the_group_of_its_store_host(cluster: Cluster) -> None:
    """Through a fresh proxy (no store host learnt yet), then again once learnt; an id no
    group holds is NOT_FOUND; the CLI prints what the node prints."""
    proxy = cluster.proxy(1)
    for name, _, sent in sampled(cluster):
        request = query_pb2.QueryByMsgIdRequest(msg_id=sent.offset_msg_id)
        expected = wire(cluster.direct(name).QueryByMsgId(request, timeout=TIMEOUT_S).message)
        assert wire(proxy.QueryByMsgId(request, timeout=TIMEOUT_S).message) == expected
        assert wire(proxy.QueryByMsgId(request, timeout=TIMEOUT_S).message) == expected
    absent = cluster.groups["broker-a"].sent[0].offset_msg_id[:-16] + f"{10**12:016X}"
    with pytest.raises(grpc.RpcError) as missing:
        proxy.QueryByMsgId(query_pb2.QueryByMsgIdRequest(msg_id=absent), timeout=TIMEOUT_S)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    sent = cluster.groups["broker-c"].sent[3]
    through = run_cli(
        ["queryMsgById", "--endpoint", cluster.proxies[0].endpoint, "-i", sent.offset_msg_id]
    )
    direct = run_cli(
        [
            "queryMsgById",
            "--endpoint",
            cluster.groups["broker-c"].query.endpoint,
            "-i",
            sent.offset_msg_id,
        ]
    )
    assert through.returncode == direct.returncode == 0 and through.stdout == direct.stdout
    by_offset = [
        "queryMsgByOffset",
        "-t",
        TOPIC,
        "-i",
        str(sent.queue_id),
        "-o",
        str(sent.queue_offset),
    ]
    through = run_cli([*by_offset, "--endpoint", cluster.proxies[0].endpoint, "-b", "broker-c"])
    direct = run_cli([*by_offset, "--endpoint", cluster.groups["broker-c"].query.endpoint])
    assert through.returncode == direct.returncode == 0 and through.stdout == direct.stdout


def test_a_group_down_is_named_and_the_lookup_is_not_complete_until_it_is_back(
    tmp_path: Path, nodes: Nodes
) -> None:
    groups = {}
    for name in GROUPS:
        writer, query = start_group(nodes, tmp_path, name)
        make_topics(writer.endpoint, {TOPIC: "NORMAL"})
        groups[name] = Group(name, tmp_path / name, writer, query)
    for turn, group in enumerate(groups.values()):
        group.sent = send_all(
            nodes.writer(group.writer), [message(i) for i in range(turn, 300, 3)], batch=100
        )
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text(cluster_yaml(groups))
    proxy_node = start_proxy(nodes, cluster_file, tmp_path / "key")
    proxy = nodes.query(proxy_node)
    cluster = Cluster(nodes, groups, [proxy_node], tmp_path / "key")
    every_id = {r.offset_msg_id for g in groups.values() for r in g.sent}
    for name in GROUPS:
        wait_caught_up(cluster.direct(name), 100)

    down = groups["broker-c"]
    ports = (down.writer.port, down.query.port)
    down.writer.kill()
    down.query.kill()
    page = proxy.QueryByKey(
        query_pb2.QueryByKeyRequest(topic=TOPIC, key=SHARED_KEY, page_size=1000), timeout=TIMEOUT_S
    )
    assert list(page.unanswered_groups) == ["broker-c"] and not page.complete and page.cursor
    assert {m.offset_msg_id for m in page.messages} == {
        r.offset_msg_id for n in ("broker-a", "broker-b") for r in groups[n].sent
    }
    listed = proxy.ListTopics(query_pb2.ListQueryTopicsRequest(), timeout=TIMEOUT_S)
    assert list(listed.unanswered_groups) == ["broker-c"]
    with pytest.raises(grpc.RpcError) as unavailable:
        request = query_pb2.QueryByQueueOffsetRequest(
            topic=TOPIC, queue_id=0, queue_offset=0, broker_name="broker-c"
        )
        proxy.QueryByQueueOffset(request, timeout=TIMEOUT_S)
    assert unavailable.value.code() == grpc.StatusCode.UNAVAILABLE
    assert unavailable.value.details().startswith(
        f"group broker-c did not answer: 127.0.0.1:{ports[1]}: UNAVAILABLE"
    )
    shown = run_cli(
        [
            "queryMsgByKey",
            "--endpoint",
            proxy_node.endpoint,
            "-t",
            TOPIC,
            "-k",
            SHARED_KEY,
            "--json",
        ]
    )
    assert shown.returncode == 2 and len(shown.json_lines()) == 200
    assert "rmqstore: error: UNAVAILABLE: group broker-c did not answer" in shown.stderr
    # A topic no answering group has may be the silent group's: not "does not exist".
    unknown = run_cli(["queryMsgByKey", "--endpoint", proxy_node.endpoint, "-t", "TopicElsewhere", "-k", "x"])
    assert unknown.returncode == 2 and unknown.stdout == ""
    assert unknown.stderr == (
        "rmqstore: error: topic TopicElsewhere is in no group that answered; broker-c did not answer\n"
    )

    # Pages with the group down, then the rest once it is back: every message once.
    seen, cursor = [], ""
    for _ in range(2):
        page = proxy.QueryByKey(
            query_pb2.QueryByKeyRequest(topic=TOPIC, key=SHARED_KEY, page_size=70, cursor=cursor),
            timeout=TIMEOUT_S,
        )
        assert list(page.unanswered_groups) == ["broker-c"] and not page.complete
        seen += [m.offset_msg_id for m in page.messages]
        cursor = page.cursor
    down.writer, down.query = start_group(nodes, tmp_path, "broker-c", *ports)
    # The proxy asks a group that did not answer again within a second.
    wait_until(
        lambda: (
            not proxy.ListTopics(
                query_pb2.ListQueryTopicsRequest(), timeout=TIMEOUT_S
            ).unanswered_groups
        ),
        10,
        "broker-c back",
    )
    while True:
        page = proxy.QueryByKey(
            query_pb2.QueryByKeyRequest(topic=TOPIC, key=SHARED_KEY, page_size=70, cursor=cursor),
            timeout=TIMEOUT_S,
        )
        assert not page.unanswered_groups
        seen += [m.offset_msg_id for m in page.messages]
        if page.complete:
            break
        cursor = page.cursor
    assert len(seen) == len(set(seen)) and set(seen) == every_id
    whole = list(key_pages(proxy, SHARED_KEY, 1000))
    assert whole[-1].complete and {m.offset_msg_id for p in whole for m in p.messages} == every_id
    for sent in down.sent:
        found = proxy.QueryByMsgId(
            query_pb2.QueryByMsgIdRequest(msg_id=sent.offset_msg_id), timeout=TIMEOUT_S
        ).message
        assert found.offset_msg_id == sent.offset_msg_id


def test_one_group_needs_no_broker_name(tmp_path: Path, nodes: Nodes) -> None:
    writer, query = start_group(nodes, tmp_path, "broker-a")
    make_topics(writer.endpoint, {TOPIC: "NORMAL"})
    sent = send_all(nodes.writer(writer), [message(i) for i in range(5)], batch=5)
    (tmp_path / "cluster.yaml").write_text(
        f'groups:\n  - name: broker-a\n    writers: ["{writer.endpoint}"]\n    queries: ["{query.endpoint}"]\n'
    )
    proxy_node = start_proxy(nodes, tmp_path / "cluster.yaml", tmp_path / "key")
    wait_caught_up(nodes.query(query), 5)
    args = ["-t", TOPIC, "-i", str(sent[2].queue_id), "-o", str(sent[2].queue_offset), "--json"]
    direct = run_cli(["queryMsgByOffset", "--endpoint", query.endpoint, *args])
    through = run_cli(["queryMsgByOffset", "--endpoint", proxy_node.endpoint, *args])
    assert through.returncode == direct.returncode == 0 and through.stdout == direct.stdout


def test_the_cli_sends_and_makes_topics_through_the_proxy(tmp_path: Path, nodes: Nodes) -> None:
    """updateTopic through a proxy makes the topic in every group; send --file through it
    spreads the file's batches over the groups, each ack the group's own, and goes on with
    the others while a group's writer is down."""
    groups = {}
    for name in GROUPS[:2]:
        writer, query = start_group(nodes, tmp_path, name)
        groups[name] = Group(name, tmp_path / name, writer, query)
    (tmp_path / "cluster.yaml").write_text(cluster_yaml(groups))
    proxy = start_proxy(nodes, tmp_path / "cluster.yaml", tmp_path / "key").endpoint
    made = run_cli(
        ["updateTopic", "--endpoint", proxy, "-t", TOPIC, "-w", "2", "-a", "+message.type=NORMAL"]
    )
    assert made.returncode == 0, made.stderr
    assert made.json_lines() == [
        {"topic": TOPIC, "queueCount": 2, "messageType": "NORMAL", "changed": True}
    ]
    for group in groups.values():
        listed = nodes.writer(group.writer).ListTopics(
            writer_pb2.ListTopicsRequest(), timeout=TIMEOUT_S
        )
        assert [(t.name, t.queue_count) for t in listed.topics if t.name == TOPIC] == [(TOPIC, 2)]

    lines = "".join(
        json.dumps({"topic": TOPIC, "body": f"body {i}", "keys": [SHARED_KEY, f"k-{i}"]}) + "\n"
        for i in range(400)
    )
    (tmp_path / "messages.jsonl").write_text(lines)
    sent = run_cli(
        [
            "send",
            "--endpoint",
            proxy,
            "--file",
            str(tmp_path / "messages.jsonl"),
            "--batch-size",
            "50",
        ]
    )
    assert sent.returncode == 0, sent.stderr
    acks = sent.json_lines()
    assert len(acks) == 400 and len({a["offsetMsgId"] for a in acks}) == 400
    # 8 batches, in turn over the two groups.
    assert Counter(a["offsetMsgId"][:16] for a in acks) == {
        id_prefix("broker-a"): 200,
        id_prefix("broker-b"): 200,
    }
    for name in GROUPS[:2]:
        wait_caught_up(nodes.query(groups[name].query), 200)
    found = run_cli(["queryMsgByKey", "--endpoint", proxy, "-t", TOPIC, "-k", SHARED_KEY, "--json"])
    assert found.returncode == 0, found.stderr
    assert {m["msgId"] for m in found.json_lines()} == {a["offsetMsgId"] for a in acks}

    groups["broker-b"].writer.kill()
    again = run_cli(
        [
            "send",
            "--endpoint",
            proxy,
            "--file",
            str(tmp_path / "messages.jsonl"),
            "--batch-size",
            "50",
        ]
    )
    assert again.returncode == 0, again.stderr
    assert {a["offsetMsgId"][:16] for a in again.json_lines()} == {id_prefix("broker-a")}
    assert len(again.json_lines()) == 400


def test_what_a_proxy_refuses_it_says_why(tmp_path: Path, nodes: Nodes) -> None:
    """Two groups whose writers were given the same store host: an id both hold at one
    offset is ambiguous, named so; a bad page size, and the calls that describe one node
    (Stats, Flush, Status), are refused with their words."""
    groups = {}
    for name in GROUPS[:2]:
        store = tmp_path / name
        writer = nodes.start("writer", store, *SIZE_ARGS, "--broker-name", name, "--store-host", "127.0.0.1:10911")
        query = nodes.start("query", store, *SIZE_ARGS, "--broker-name", name)
        make_topics(writer.endpoint, {TOPIC: "NORMAL"})
        groups[name] = Group(name, store, writer, query)
    sent = {name: send_all(nodes.writer(g.writer), [message(1)], batch=1)[0] for name, g in groups.items()}
    assert sent["broker-a"].offset_msg_id == sent["broker-b"].offset_msg_id  # the same host, the same offset
    for group in groups.values():
        wait_caught_up(nodes.query(group.query), 1)
    (tmp_path / "cluster.yaml").write_text(cluster_yaml(groups))
    proxy_node = start_proxy(nodes, tmp_path / "cluster.yaml", tmp_path / "key")
    proxy = nodes.query(proxy_node)
    msg_id = sent["broker-a"].offset_msg_id
    with pytest.raises(grpc.RpcError) as ambiguous:
        proxy.QueryByMsgId(query_pb2.QueryByMsgIdRequest(msg_id=msg_id), timeout=TIMEOUT_S)
    assert ambiguous.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert ambiguous.value.details() == (
        f"msgId {msg_id} names a message in groups broker-a, broker-b: their writers share the store host "
        "127.0.0.1:10911 (give each writer its own --store-host)"
    )
    with pytest.raises(grpc.RpcError) as page:
        proxy.QueryByKey(query_pb2.QueryByKeyRequest(topic=TOPIC, key=SHARED_KEY, page_size=0), timeout=TIMEOUT_S)
    assert (page.value.code(), page.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "page size must be in [1, 10000], got 0",
    )
    with pytest.raises(grpc.RpcError) as stats:
        proxy.Stats(query_pb2.StatsRequest(), timeout=TIMEOUT_S)
    assert (stats.value.code(), stats.value.details()) == (
        grpc.StatusCode.UNIMPLEMENTED,
        "Stats describes one store: ask a group's query node (the cluster file names them)",
    )
    writer = nodes.writer(proxy_node)
    for method, request in (("Flush", writer_pb2.FlushRequest()), ("Status", writer_pb2.StatusRequest())):
        with pytest.raises(grpc.RpcError) as one_writer:
            getattr(writer, method)(request, timeout=TIMEOUT_S)
        assert (one_writer.value.code(), one_writer.value.details()) == (
            grpc.StatusCode.UNIMPLEMENTED,
            f"{method} is a writer's: ask a group's writer (the cluster file names them)",
        )
