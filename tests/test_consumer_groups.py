"""Consumer groups as the query node reports them: ListGroups and GroupLag over the store's
config/consumerOffset.json, and ``rmqstore consumerProgress`` through a node and on the
directory.

Real parts: the Apache-written fixture store with Apache's own bare-key text, a store a
writer process wrote with the file written by common.files.consumer_offsets, query node
processes on 127.0.0.1 port 0 (stopped in teardown), the command line as a subprocess.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import FIXTURE_SIZE_ARGS, FIXTURE_SIZES
from support.acl import Guarded, denied, status_of
from support.cli import run_cli
from support.nodes import Nodes
from support.stores import SIZE_ARGS
from support.wait import wait_until

from rmqstore.common.files.consumer_offsets import write_offsets
from rmqstore.query.groups import BROKER_NAME_DEFAULT, GroupOffsets, group_lag
from rmqstore.query.view import StoreView
from rmqstore.v1 import messages_pb2, query_pb2, writer_pb2
from rmqstore.writer.rocketmq5 import DEFAULT_BROKER_NAME

RPC_TIMEOUT_S = 15.0
GROUP = "please_rename_unique_group_name_4"
RETRY = f"%RETRY%{GROUP}"
# What Apache 4.9's broker writes (fastjson, pretty): tabs, bare integer queue ids.
APACHE_TEXT = (
    "{\n"
    '\t"offsetTable":{\n'
    f'\t\t"TopicTest@{GROUP}":{{0:146,1:160,2:0,3:190\n\t\t}},\n'
    f'\t\t"{RETRY}@{GROUP}":{{0:0\n\t\t}},\n'
    '\t\t"OrderTopic@orders":{0:100,1:150,2:157,3:200\n\t\t}\n'
    "\t}\n"
    "}"
)
# The fixture's queue ends (max offsets): TopicTest 146, 167, 178, 190; OrderTopic 173,
# 150, 157, 165.


def line(topic: object, broker: object, queue: object, broker_offset: object, consumer_offset: object, diff: object) -> str:
    return f"{topic!s:<64}  {broker!s:<32}  {queue!s:<4}  {broker_offset!s:<20}  {consumer_offset!s:<20}  {diff}\n"


HEADER = line("#Topic", "#Broker Name", "#QID", "#Broker Offset", "#Consumer Offset", "#Diff")


def apache_store(clean_copy: Path) -> Path:
    (clean_copy / "config" / "consumerOffset.json").write_text(APACHE_TEXT)
    return clean_copy


def test_the_query_nodes_default_broker_name_is_the_writers() -> None:
    assert BROKER_NAME_DEFAULT == DEFAULT_BROKER_NAME


@pytest.mark.slow
def test_consumer_progress_on_apaches_text_through_a_node_and_on_the_directory(
    nodes: Nodes, clean_copy: Path
) -> None:
    store = apache_store(clean_copy)
    node = nodes.start("query", store, *FIXTURE_SIZE_ARGS)
    where = {"endpoint": ["--endpoint", node.endpoint], "store": ["--store", str(store), *FIXTURE_SIZE_ARGS]}
    b = BROKER_NAME_DEFAULT
    group_text = (
        HEADER
        + line(RETRY, b, 0, 0, 0, 0)  # a retry topic with no queue files yet
        + line("TopicTest", b, 0, 146, 146, 0)
        + line("TopicTest", b, 1, 167, 160, 7)
        + line("TopicTest", b, 2, 178, 0, 178)
        + line("TopicTest", b, 3, 190, 190, 0)
        + "\nDiff Total: 185\n"
    )
    orders_text = (
        HEADER
        + line("OrderTopic", b, 0, 173, 100, 73)
        + line("OrderTopic", b, 1, 150, 150, 0)
        + line("OrderTopic", b, 2, 157, 157, 0)
        + line("OrderTopic", b, 3, 165, 200, "0  PAST_END")  # the group's offset past the end: no lag, flagged
        + "\nDiff Total: 73\n"
    )
    past_end = (
        "rmqstore: warning: group orders: consumer offset past the queue's end in OrderTopic/3 (200 > 165); "
        "the writer moves such an offset back to the end when it starts\n"
    )

    def row(topic: str, queue: int, broker_offset: int, consumer_offset: int, diff: int) -> dict[str, Any]:
        return {"topic": topic, "brokerName": b, "queueId": queue, "brokerOffset": broker_offset, "consumerOffset": consumer_offset, "diff": diff,
                "pastEnd": consumer_offset > broker_offset}  # fmt: skip

    # (arguments, exit code, stdout, stderr)
    cases: list[tuple[list[str], int, str, str]] = [
        (["-g", GROUP], 0, group_text, ""),
        (["-g", "orders"], 0, orders_text, past_end),
        (["-g", GROUP, "-t", "TopicTest", "--json"], 0, json.dumps({
            "group": GROUP,
            "queues": [row("TopicTest", 0, 146, 146, 0), row("TopicTest", 1, 167, 160, 7), row("TopicTest", 2, 178, 0, 178), row("TopicTest", 3, 190, 190, 0)],
            "diffTotal": 185,
        }) + "\n", ""),  # fmt: skip
        ([], 0, f"{'#Group':<64}  {'#Topics':<7}  #Diff Total\n{'orders':<64}  {1:<7}  73\n{GROUP:<64}  {2:<7}  185\n", ""),
        (["--json"], 0, json.dumps([
            {"group": "orders", "topics": ["OrderTopic"], "diffTotal": 73},
            {"group": GROUP, "topics": [RETRY, "TopicTest"], "diffTotal": 185},
        ]) + "\n", ""),  # fmt: skip
        (["-g", "nobody"], 3, "", "rmqstore: error: NOT_FOUND: consumer group nobody has no offsets in this store\n"),
        (["-g", "orders", "-t", "TopicTest"], 3, "", "rmqstore: error: NOT_FOUND: consumer group orders has no offsets for topic TopicTest\n"),
        (["-g", "bad group"], 2, "", "rmqstore: error: INVALID_ARGUMENT: the consumer group 'bad group' contains characters outside [%|a-zA-Z0-9_-]\n"),
        (["-g", "orders", "-t", "a/b"], 2, "", "rmqstore: error: INVALID_ARGUMENT: the topic 'a/b' contains characters outside [%|a-zA-Z0-9_-]\n"),
        (["-t", "TopicTest"], 2, "", "rmqstore: error: -t/--topic needs -g/--group\n"),
    ]
    for args, code, stdout, stderr in cases:
        got = {place: run_cli(["consumerProgress", *args, *extra]) for place, extra in where.items()}
        assert got["endpoint"] == got["store"], args
        assert (got["endpoint"].returncode, got["endpoint"].stdout, got["endpoint"].stderr) == (code, stdout, stderr), args
    node.stop()


def test_consumer_progress_on_a_missing_store_is_a_usage_error(tmp_path: Path) -> None:
    missing = tmp_path / "none"
    got = run_cli(["consumerProgress", "-g", GROUP, "--store", str(missing)])
    assert (got.returncode, got.stdout, got.stderr) == (2, "", f"rmqstore: error: --store {missing}: no such directory\n")
    got = run_cli(["consumerProgress", "-g", GROUP])
    assert (got.returncode, got.stderr) == (2, "rmqstore: error: give exactly one of --endpoint HOST:PORT or --store DIR\n")


@pytest.mark.slow
def test_a_node_follows_the_writers_file_and_its_broker_name(nodes: Nodes, tmp_path: Path) -> None:
    """A store a writer wrote, offsets written by the module while the node runs: each
    replacement of the file is what the next lookup reports; a damaged file falls back to
    its .bak; with neither readable the lookup is DATA_LOSS and the node goes on."""
    store = tmp_path / "store"
    writer_node = nodes.start("writer", store, *SIZE_ARGS)
    writer = nodes.writer(writer_node)
    sent = [
        writer.Send(writer_pb2.SendRequest(message=messages_pb2.Message(topic="Orders", body=b"m%d" % i)), timeout=RPC_TIMEOUT_S).result
        for i in range(20)
    ]
    ends: dict[int, int] = {}
    for result in sent:
        ends[result.queue_id] = max(ends.get(result.queue_id, 0), result.queue_offset + 1)
    node = nodes.start("query", store, *SIZE_ARGS, "--broker-name", "east-1")
    query = nodes.query(node)
    config = str(store / "config")

    def lag(group: str = "app") -> query_pb2.GroupLagResponse:
        def caught_up() -> query_pb2.GroupLagResponse | None:
            response: query_pb2.GroupLagResponse = query.GroupLag(query_pb2.GroupLagRequest(group=group), timeout=RPC_TIMEOUT_S)
            return response if sum(q.broker_offset for q in response.queues) == len(sent) else None

        # The node sees the writer's last records within its refresh interval.
        return wait_until(caught_up, RPC_TIMEOUT_S, f"group {group}'s lag to count every record sent", interval_s=0.05)

    assert query.ListGroups(query_pb2.ListGroupsRequest(), timeout=RPC_TIMEOUT_S).groups == []
    write_offsets(config, {("Orders", "app"): {q: 0 for q in ends}})
    first = lag()
    assert first.broker_name == "east-1" and first.group == "app"
    assert [(q.topic, q.queue_id, q.broker_offset, q.consumer_offset, q.lag) for q in first.queues] == [
        ("Orders", q, ends[q], 0, ends[q]) for q in sorted(ends)
    ]
    assert first.lag_total == len(sent)
    # The writer moves the group on: replaced atomically, seen at the next lookup.
    write_offsets(config, {("Orders", "app"): dict(ends), ("Orders", "audit"): {0: 1}})
    second = lag()
    assert [(q.consumer_offset, q.lag) for q in second.queues] == [(ends[q], 0) for q in sorted(ends)]
    assert second.lag_total == 0
    groups = query.ListGroups(query_pb2.ListGroupsRequest(), timeout=RPC_TIMEOUT_S).groups
    audit_total = sum(ends.values()) - min(ends.get(0, 0), 1)
    assert [(g.group, list(g.topics), g.lag_total) for g in groups] == [("app", ["Orders"], 0), ("audit", ["Orders"], audit_total)]
    # A damaged main file: the .bak (the previous table) answers.
    (store / "config" / "consumerOffset.json").write_text('{"offsetTable":{"Orders@app":{0:')
    assert [q.consumer_offset for q in lag().queues] == [0] * len(ends)
    # Neither decodes: DATA_LOSS naming the file, and the node still answers other lookups.
    (store / "config" / "consumerOffset.json.bak").write_text("not json")
    with pytest.raises(grpc.RpcError) as raised:
        query.GroupLag(query_pb2.GroupLagRequest(group="app"), timeout=RPC_TIMEOUT_S)
    assert raised.value.code() == grpc.StatusCode.DATA_LOSS
    assert raised.value.details().startswith(f"{store}/config/consumerOffset.json is not readable JSON: ")
    assert query.Ping(query_pb2.PingRequest(), timeout=RPC_TIMEOUT_S) == query_pb2.PingResponse()
    # Repaired by the next replacement.
    write_offsets(config, {("Orders", "app"): {0: 1}})
    assert lag().queues[0].consumer_offset == 1
    node.stop()
    writer_node.stop()


def test_an_unchanged_file_is_not_parsed_again_and_a_replaced_one_is(clean_copy: Path) -> None:
    store = apache_store(clean_copy)
    offsets = GroupOffsets(str(store / "config"))
    view = StoreView(str(store), FIXTURE_SIZES)
    try:
        for _ in range(100):
            table = offsets.table()
        assert offsets.reads == 1
        assert table[("TopicTest", GROUP)] == {0: 146, 1: 160, 2: 0, 3: 190}
        # The same size and a new inode, as the writer's rename makes it: seen.
        write_offsets(str(store / "config"), {("TopicTest", GROUP): {0: 1, 1: 160, 2: 0, 3: 190}})
        assert offsets.table()[("TopicTest", GROUP)][0] == 1 and offsets.reads == 2
        os.unlink(store / "config" / "consumerOffset.json")
        os.unlink(store / "config" / "consumerOffset.json.bak")
        assert offsets.table() == {} and offsets.reads == 3
        table = {("TopicTest", GROUP): {0: -1}}
        rows = group_lag(view, table, GROUP)
        # Apache's -1 (no offset yet) reads as 0; queues the file does not name too.
        assert [(r.queue_id, r.consumer_offset, r.lag) for r in rows] == [(0, 0, 146), (1, 0, 167), (2, 0, 178), (3, 0, 190)]
    finally:
        view.close()


def test_group_lookups_under_the_acl(guarded: Guarded) -> None:
    """ListGroups is the node's (List on Cluster), GroupLag the group's (Get on Group)."""
    write_offsets(os.path.join(guarded.view.root, "config"), {("orders-eu", "orders"): {0: 0}})
    q_orders, q_reader, q_ops = guarded.query_as("orders"), guarded.query_as("reader"), guarded.query_as("ops")
    list_groups = query_pb2.ListGroupsRequest()
    assert status_of(lambda: q_orders.ListGroups(list_groups, timeout=RPC_TIMEOUT_S)) == denied("User:orders", "List", "Cluster")
    assert [g.group for g in q_reader.ListGroups(list_groups, timeout=RPC_TIMEOUT_S).groups] == ["orders"]
    lag = query_pb2.GroupLagRequest(group="orders")
    assert status_of(lambda: q_reader.GroupLag(lag, timeout=RPC_TIMEOUT_S)) == denied("User:reader", "Get", "Group:orders")
    assert status_of(lambda: q_orders.GroupLag(lag, timeout=RPC_TIMEOUT_S)) == denied("User:orders", "Get", "Group:orders")
    response = q_ops.GroupLag(lag, timeout=RPC_TIMEOUT_S)
    assert [(q.topic, q.queue_id, q.broker_offset, q.consumer_offset, q.lag) for q in response.queues] == [("orders-eu", 0, 0, 0, 0)]
