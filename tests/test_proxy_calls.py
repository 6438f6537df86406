"""Cluster mode's calls routed to one group (docs/cluster.md): pull and offset calls by the
queue's broker name, transactions (the official Python client through two proxies over
three groups: commit, rollback, and an open transaction checked through a proxy's
Telemetry stream), delay messages and their recall, through ``rmqstore proxy serve``
processes in front of real writer groups; the official Node.js transactional producer
through a proxy alike."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2
from support.nodes import Nodes, ProcessNode
from support.rmq5 import DRIVERS, client_env, make_topics, rmq5_python
from support.stores import SIZE_ARGS
from test_proxy import send_v2, start_proxies, start_writers, v2_message
from test_proxy_consumers import ack, cluster_file, receive
from test_transactions_live import consume, node_transactions, transactions

from rmqstore.proxy.transactions import unwrap_transaction, wrap_transaction
from rmqstore.rocketmq_v2 import definition_pb2 as v2
from rmqstore.rocketmq_v2 import service_pb2 as v2s
from rmqstore.rocketmq_v2 import service_pb2_grpc
from rmqstore.service.listen import free_port
from rmqstore.writer.rocketmq5 import V2Refusal
from rmqstore.writer.schedule import recall_handle

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


@pytest.mark.parametrize(("group", "inner"), [("broker-a", "7F0000010B3C18B4AAC2"), ("broker.b", "id.with.dots"), ("группа", "x")])
def test_a_tagged_transaction_id_gives_back_its_group_and_the_writers_id(group: str, inner: str) -> None:
    assert unwrap_transaction(wrap_transaction(group, inner)) == (group, inner)


@pytest.mark.parametrize("garbled", ["", "  ", "7F0000010B3C18B4AAC2", "rmqt1", "rmqt1.", "rmqt1.YQ", "rmqt1.YQ.", "rmqt2.YQ.x", "rmqt1.!!!.x", "rmqt1.gA.x"])
def test_a_transaction_id_no_proxy_gave_out_is_refused(garbled: str) -> None:
    with pytest.raises(V2Refusal) as refused:
        unwrap_transaction(garbled)
    assert refused.value.code == v2.INVALID_TRANSACTION_ID


def transaction_writer(nodes: Nodes, tmp_path: Path, name: str, port: int = 0) -> ProcessNode:
    """A group checking its transactions on short timings (a half message first checked
    at 1.5 s old, every 2 s: the 15 checks leave a producer half a minute)."""
    return nodes.spawn("writer", [
        "writer", "serve", "--store", str(tmp_path / name), "--host", "127.0.0.1", "--port", str(port), *SIZE_ARGS,
        "--broker-name", name, "--flush", "sync", "--transaction-timeout-ms", "1500", "--transaction-check-interval-ms", "2000",
    ])  # fmt: skip


def transaction_writers(nodes: Nodes, tmp_path: Path, names: list[str] = NAMES) -> dict[str, ProcessNode]:
    spawned = {name: transaction_writer(nodes, tmp_path, name, free_port("127.0.0.1")) for name in names}
    for writer in spawned.values():
        writer.wait_serving()
        make_topics(writer.endpoint, {"Payments": "TRANSACTION"})
    return spawned


@pytest.mark.slow
def test_transactions_through_two_proxies_commit_roll_back_and_are_checked_across_groups(nodes: Nodes, tmp_path: Path) -> None:
    """The official Python transactional producer through two proxies over three groups:
    its half messages land in every group, each commit and rollback reaches the group
    that holds the half message (by the transaction id the proxy tagged); transactions
    left open through one proxy, which is then killed, are checked by their writers
    through the other proxy's Telemetry stream with a producer that only answers checks,
    and its answers end them in the right group. Every commit is consumed once through
    a proxy, no rollback ever."""
    writers = transaction_writers(nodes, tmp_path)
    first, second = start_proxies(nodes, cluster_file(tmp_path, writers), 2)
    both = f"{first.endpoint};{second.endpoint}"
    ended = transactions(tmp_path, "end", both, "Payments", "12")
    assert [line["resolution"] for line in ended] == ["COMMIT", "ROLLBACK"] * 6
    assert {unwrap_transaction(line["transaction_id"]) for line in ended} == {
        (group, line["message_id"]) for line in ended for group in NAMES if line["transaction_id"].startswith(wrap_transaction(group, ""))
    }
    assert {unwrap_transaction(line["transaction_id"])[0] for line in ended} == set(NAMES)
    opened = transactions(tmp_path, "orphan", first.endpoint, "Payments", "12")
    # A check may reach this producer before it stops (on a loaded machine): it answers it.
    assert {unwrap_transaction(line["transaction_id"])[0] for line in opened if "sent" in line} == set(NAMES)
    checked_before = {line["checked"] for line in opened if "checked" in line}
    first.kill()
    left = 12 - len(checked_before)
    lines = transactions(tmp_path, "checker", second.endpoint, "Payments", "--checks", str(left), "--seconds", "240") if left else []
    checked = {line["checked"]: line["answer"] for line in lines if "checked" in line}
    assert sorted(set(checked) | checked_before) == sorted(f"{'commit' if n % 2 == 0 else 'rollback'} {n}" for n in range(12))
    assert all(answer == ("COMMIT" if body.startswith("commit") else "ROLLBACK") for body, answer in checked.items())
    assert consume(tmp_path, second.endpoint, 12) == sorted([f"commit {n}" for n in range(0, 12, 2)] * 2)


@pytest.mark.slow
def test_the_nodejs_transactional_producer_through_a_proxy_commits_rolls_back_and_answers_checks(nodes: Nodes, tmp_path: Path) -> None:
    """The official Node.js transactional producer through a proxy over three groups:
    its commits and rollbacks reach every group, and a producer that stays up answers
    the checks of its open transactions, which the proxy brings it from each group."""
    writers = transaction_writers(nodes, tmp_path)
    (proxy,) = start_proxies(nodes, cluster_file(tmp_path, writers), 1)
    ended = node_transactions(tmp_path, "end", proxy.endpoint, "Payments", "12")
    assert [line["resolution"] for line in ended] == ["COMMIT", "ROLLBACK"] * 6
    assert {unwrap_transaction(line["transaction_id"])[0] for line in ended} == set(NAMES)
    lines = node_transactions(tmp_path, "orphan", proxy.endpoint, "Payments", "12", "12", "240")
    assert {unwrap_transaction(line["transaction_id"])[0] for line in lines if "sent" in line} == set(NAMES)
    checked = sorted((line["checked"], line["answer"]) for line in lines if "checked" in line)
    assert checked == sorted((f"commit {n}", "COMMIT") if n % 2 == 0 else (f"rollback {n}", "ROLLBACK") for n in range(12))
    assert consume(tmp_path, proxy.endpoint, 12) == sorted([f"commit {n}" for n in range(0, 12, 2)] * 2)


def end(stub: service_pb2_grpc.MessagingServiceStub, transaction_id: str) -> v2.Status:
    request = v2s.EndTransactionRequest(
        topic=v2.Resource(name="Payments"), message_id="M1", transaction_id=transaction_id, resolution=v2.COMMIT,
        source=v2.SOURCE_CLIENT,
    )  # fmt: skip
    status: v2.Status = stub.EndTransaction(request, timeout=RPC_TIMEOUT_S).status
    return status


def recalled(stub: service_pb2_grpc.MessagingServiceStub, handle: str) -> v2.Status:
    status: v2.Status = stub.RecallMessage(
        v2s.RecallMessageRequest(topic=v2.Resource(name="Delays"), recall_handle=handle), timeout=RPC_TIMEOUT_S
    ).status
    return status


def test_delay_messages_through_a_proxy_are_delivered_at_their_time_and_recalled_in_their_group(nodes: Nodes, tmp_path: Path) -> None:
    """Delay messages sent through a proxy land in every group, each receipt with its
    group's recall handle; none is received before its time, each after it but the one
    recalled through the proxy. Garbled transaction ids and recall handles are refused
    with exact statuses; one naming a group that is down, HA_NOT_AVAILABLE."""
    writers = start_writers(nodes, tmp_path, NAMES, {"Delays": "DELAY", "Payments": "TRANSACTION"})
    (proxy,) = start_proxies(nodes, cluster_file(tmp_path, writers), 1)
    channel, via = messaging(proxy.endpoint)
    with channel:
        due_ms = (time.time_ns() // 1_000_000) + 4000
        receipts = []
        for n in range(12):
            message = v2_message("Delays", f"D{n:04d}", message_type=v2.DELAY, delivery_timestamp={"seconds": due_ms // 1000, "nanos": due_ms % 1000 * 1_000_000})
            answer = via.SendMessage(v2s.SendMessageRequest(messages=[message]), timeout=RPC_TIMEOUT_S)
            assert answer.status.code == v2.OK, answer.status
            receipts.append(answer.entries[0])
        handles = [entry.recall_handle for entry in receipts]
        groups = {name for name in NAMES for entry in receipts if entry.recall_handle == recall_handle("Delays", name, due_ms, entry.message_id)}
        assert groups == set(NAMES)
        assert recalled(via, handles[5]).code == v2.OK
        early = receive(via, "Delays", 32, poll_s=1)
        assert early == [] and time.time_ns() // 1_000_000 < due_ms, "received before its time"
        got: list[v2.Message] = []
        deadline = time.monotonic() + 30
        while len(got) < 11 and time.monotonic() < deadline:
            more = receive(via, "Delays", 32, poll_s=2)
            if more:
                assert time.time_ns() // 1_000_000 >= due_ms, "received before its time"
                assert ack(via, "Delays", *(m.system_properties.receipt_handle for m in more)).status.code == v2.OK
            got += more
        assert sorted(m.system_properties.message_id for m in got) == sorted(f"D{n:04d}" for n in range(12) if n != 5)
        assert receive(via, "Delays", 32, poll_s=2) == []  # the recalled one never comes
        # Refusals, each exact.
        assert (end(via, "garbage").code, end(via, "").code) == (v2.INVALID_TRANSACTION_ID, v2.INVALID_TRANSACTION_ID)
        assert end(via, "rmqt1.!!!.x").code == v2.INVALID_TRANSACTION_ID
        unknown = end(via, wrap_transaction("broker-x", "M1"))
        assert (unknown.code, "broker-x" in unknown.message) == (v2.INVALID_TRANSACTION_ID, True)
        forged = end(via, wrap_transaction("broker-a", "NOSUCH"))  # the writer has no data for it, as Apache answers
        assert (forged.code, forged.message) == (
            v2.INTERNAL_SERVER_ERROR, "org.apache.rocketmq.proxy.common.ProxyException: cannot found transaction data"
        )
        assert (recalled(via, "!!!").code, recalled(via, "!!!").message) == (v2.INTERNAL_SERVER_ERROR, "recall handle is invalid")
        foreign = recalled(via, recall_handle("Delays", "broker-x", due_ms + 60_000, "D0099"))
        assert (foreign.code, foreign.message) == (v2.INTERNAL_SERVER_ERROR, "recall failed, broker service not available")
        writers["broker-c"].kill()
        assert end(via, wrap_transaction("broker-c", "M1")).code == v2.HA_NOT_AVAILABLE
        assert recalled(via, recall_handle("Delays", "broker-c", due_ms + 60_000, "D0099")).code == v2.HA_NOT_AVAILABLE


@pytest.mark.slow
@pytest.mark.crash
def test_a_groups_checks_reach_the_producer_again_once_the_group_is_back(nodes: Nodes, tmp_path: Path) -> None:
    """Transactions left open in two groups; one group's writer is SIGKILLed before any
    check. A producer that answers checks connects through the proxy: the live group's
    checks reach it at once; the other's once its writer restarts (on its store and
    port), the proxy's mirror of the producer's stream having opened again. Every commit
    is consumed once, no rollback."""
    writers = transaction_writers(nodes, tmp_path, NAMES[:2])
    (proxy,) = start_proxies(nodes, cluster_file(tmp_path, writers), 1)
    opened = transactions(tmp_path, "orphan", proxy.endpoint, "Payments", "8")
    groups = {unwrap_transaction(line["transaction_id"])[0] for line in opened if "sent" in line}
    assert groups == set(NAMES[:2])
    checked_before = {line["checked"] for line in opened if "checked" in line}
    port = int(writers["broker-b"].endpoint.rpartition(":")[2])
    writers["broker-b"].kill()
    home = tmp_path / "client-home"
    home.mkdir(exist_ok=True)
    checker = subprocess.Popen(
        [rmq5_python(), str(DRIVERS / "python_transactions.py"), "checker", proxy.endpoint, "Payments",
         "--checks", str(8 - len(checked_before)), "--seconds", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=client_env(home), cwd=tmp_path,
    )  # fmt: skip
    try:
        time.sleep(6)  # broker-a's checks reach the checker meanwhile; broker-b's mirror keeps failing
        transaction_writer(nodes, tmp_path, "broker-b", port).wait_serving()
        out, err = checker.communicate(timeout=180)
    finally:
        if checker.poll() is None:
            checker.kill()
            checker.wait()
    assert checker.returncode == 0, err.decode(errors="replace")[-3000:]
    checked = {json.loads(line)["checked"] for line in out.splitlines() if b"checked" in line}
    assert sorted(checked | checked_before) == sorted(f"{'commit' if n % 2 == 0 else 'rollback'} {n}" for n in range(8))
    assert consume(tmp_path, proxy.endpoint, 4) == [f"commit {n}" for n in range(0, 8, 2)]
