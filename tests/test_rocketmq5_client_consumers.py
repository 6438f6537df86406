"""The official RocketMQ 5 Python client's SimpleConsumer and PushConsumer, unmodified, in
processes of their own (tests/rocketmq5/python_consumer.py), against ``rmqstore writer
serve`` processes fed by the official producer (tests/rocketmq5/python_producer.py):
exactly-once when acknowledged, tag filters, redelivery, FIFO order, retries and dead
letters found through a query node, restarts by SIGTERM and SIGKILL, shared and separate
groups."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import duration_pb2
from support.nodes import Nodes
from support.rmq5 import (
    CLIENT_TIMEOUT_S,
    DRIVERS,
    PYTHON_CLIENT_MESSAGES,
    client_env,
    make_topics,
    rmq5_python,
    run_python_client,
)
from support.stores import SIZE_ARGS
from support.wait import wait_until

from rmqstore.common.files.consumer_offsets import read_offsets
from rmqstore.rocketmq_v2 import definition_pb2 as v2
from rmqstore.rocketmq_v2 import service_pb2 as v2s
from rmqstore.rocketmq_v2 import service_pb2_grpc
from rmqstore.v1 import messages_pb2, query_pb2, writer_pb2

RPC_TIMEOUT_S = 15.0
FLUSH_INTERVAL_MS = 1000
# How long before a SIGKILL an acknowledgement may have been made and still be lost: the
# flush interval, and the time one flush takes to write its two files (generous here).
KILL_BOUND_S = FLUSH_INTERVAL_MS / 1000 + 1.0


def consumer_command(*args: str) -> list[str]:
    return [rmq5_python(), str(DRIVERS / "python_consumer.py"), *args]


def consume(tmp_path: Path, *args: str) -> list[dict[str, Any]]:
    home = tmp_path / "client-home"
    home.mkdir(exist_ok=True)
    done = subprocess.run(
        consumer_command(*args), capture_output=True, timeout=CLIENT_TIMEOUT_S, env=client_env(home), cwd=tmp_path, check=False
    )
    assert done.returncode == 0, f"consumer failed: {done.stderr.decode(errors='replace')[-3000:]}"
    return [json.loads(line) for line in done.stdout.splitlines()]


class Background:
    """A consumer process running while the test does other things; its lines so far."""

    def __init__(self, tmp_path: Path, name: str, *args: str):
        home = tmp_path / "client-home"
        home.mkdir(exist_ok=True)
        self.out_path = tmp_path / f"{name}.out"
        self.err_path = tmp_path / f"{name}.err"
        self._out = open(self.out_path, "wb")
        self._err = open(self.err_path, "wb")
        self.proc = subprocess.Popen(
            consumer_command(*args), stdout=self._out, stderr=self._err, env=client_env(home), cwd=tmp_path
        )

    def lines(self) -> list[dict[str, Any]]:
        text = self.out_path.read_text()
        return [json.loads(line) for line in text.splitlines() if line.endswith("}")]

    def wait_lines(self, count: int, timeout_s: float = 120.0) -> list[dict[str, Any]]:
        def printed() -> list[dict[str, Any]] | None:
            lines = self.lines()
            if len(lines) >= count:
                return lines
            assert self.proc.poll() is None, f"the consumer exited early with {len(lines)} lines"
            return None

        return wait_until(printed, timeout_s, f"the consumer to print {count} lines", interval_s=0.05)

    def wait(self, timeout_s: float = CLIENT_TIMEOUT_S) -> list[dict[str, Any]]:
        try:
            self.proc.wait(timeout=timeout_s)
        finally:
            self.close()
        return self.lines()

    def stop(self) -> list[dict[str, Any]]:
        """Kill it (its writer is gone: the client would retry on) and take its lines,
        every one of which it printed in full after the writer's answer."""
        self.close()
        return self.lines()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._out.close()
        self._err.close()

    def exited_ok(self) -> bool:
        return self.proc.returncode == 0


# Receives of 3 or 5 s, under Apache's 10 s minimum (writer serve --consumer-min-invisible).
SHORT_INVISIBLE = ("--consumer-min-invisible", "1")


def produce(tmp_path: Path, endpoint: str, count: int) -> list[dict[str, Any]]:
    """``count`` messages from the official producer: three quarters to Orders (tags
    Tag0-2), a quarter to Carts as FIFO (eight message groups)."""
    make_topics(endpoint, {"Orders": "NORMAL", "Carts": "FIFO"})
    lines = run_python_client(tmp_path, "send", endpoint, "Orders", "Carts", str(count))
    assert len(lines) == count
    return lines


def consume_the_rest(tmp_path: Path, endpoint: str, wanted: set[str]) -> list[dict[str, Any]]:
    """Group g's messages until each of ``wanted`` came, then whatever else still comes
    within a few quiet seconds."""
    want = tmp_path / "want.txt"
    want.write_text("\n".join(sorted(wanted)) + "\n")
    lines = consume(tmp_path, "simple", endpoint, "g", "Orders", "--want", str(want))
    return lines + consume(tmp_path, "simple", endpoint, "g", "Orders", "--idle-s", "4")


def bodies(lines: list[dict[str, Any]]) -> list[str]:
    return [line["body"] for line in lines]


@pytest.mark.slow
def test_simple_consumer_gets_every_message_once_a_tag_filter_its_subset_fifo_in_order(nodes: Nodes, tmp_path: Path) -> None:
    store = tmp_path / "store"
    writer = nodes.start("writer", store, *SIZE_ARGS, "--fifo-group", "fifo")
    sent = produce(tmp_path, writer.endpoint, PYTHON_CLIENT_MESSAGES)
    counts = Counter(line["topic"] for line in sent)
    wanted = [line["body"] for line in sent if line.get("tag") in ("Tag0", "Tag2")]
    fifo_count = sum(1 for line in sent if "group" in line)
    # Three groups at once, each consumer in its own process: "all" with a consumer for each
    # topic (one consumer of both would alternate its receives between them, waiting out its
    # poll on the drained one), "tagged" filtering Orders by tag, "fifo" on the FIFO topic.
    consumers = [
        Background(tmp_path, "all-Orders", "simple", writer.endpoint, "all", "Orders", "--expect", str(counts["Orders"])),
        Background(tmp_path, "all-Carts", "simple", writer.endpoint, "all", "Carts", "--expect", str(counts["Carts"])),
        Background(tmp_path, "tagged", "simple", writer.endpoint, "tagged", "Orders", "--tag", "Tag0||Tag2", "--expect", str(len(wanted))),
        Background(tmp_path, "fifo", "simple", writer.endpoint, "fifo", "Carts", "--expect", str(fifo_count)),
    ]  # fmt: skip
    try:
        all_orders, all_carts, tagged, fifo = (consumer.wait() for consumer in consumers)
    finally:
        for consumer in consumers:
            consumer.close()
    for consumer in consumers:
        assert consumer.exited_ok(), f"consumer failed: {consumer.err_path.read_text(errors='replace')[-3000:]}"
    everything = all_orders + all_carts
    assert Counter(bodies(everything)) == Counter(bodies(sent))  # each exactly once
    assert {line["attempt"] for line in everything} == {1} and all(line["acked"] for line in everything)
    assert sorted(bodies(tagged)) == sorted(wanted)
    assert {line["tag"] for line in tagged} == {"Tag0", "Tag2"}
    # A FIFO group gets each message group's messages in their send order.
    assert len(fifo) == fifo_count
    received: dict[str, list[int]] = defaultdict(list)
    for line in fifo:
        received[line["group"]].append(int(line["body"].split(" ")[1]))
    expected: dict[str, list[int]] = defaultdict(list)
    for line in sent:
        if "group" in line:
            expected[line["group"]].append(line["n"])
    assert dict(received) == dict(expected)
    # After a clean stop the groups' offsets are Apache's consumerOffset.json, at each queue's end.
    writer.stop()
    ends: dict[tuple[str, int], int] = defaultdict(int)
    for line in sent:
        ends[(line["topic"], line["queue_id"])] = max(ends[(line["topic"], line["queue_id"])], line["offset"] + 1)
    table = read_offsets(str(store / "config"))
    for topic in ("Orders", "Carts"):
        assert table[(topic, "all")] == {q: end for (t, q), end in ends.items() if t == topic}
    assert table[("Orders", "tagged")] == {q: end for (t, q), end in ends.items() if t == "Orders"}


def test_unacknowledged_come_back_with_a_higher_attempt_and_a_renewed_one_stays_away(nodes: Nodes, tmp_path: Path) -> None:
    writer = nodes.start("writer", tmp_path / "store", *SIZE_ARGS, *SHORT_INVISIBLE)
    sent = produce(tmp_path, writer.endpoint, 40)
    orders = sorted(line["body"] for line in sent if line["topic"] == "Orders")
    # Nothing acknowledged, invisible 5 s; the first handled is renewed for 60 s.
    first = consume(tmp_path, "simple", writer.endpoint, "g", "Orders", "--ack", "none", "--invisible-s", "5",
                    "--renew", "1", "--expect", str(len(orders)), "--await-s", "1")  # fmt: skip
    assert sorted(bodies(first)) == orders and {line["attempt"] for line in first} == {1}
    renewed = [line["body"] for line in first if line.get("renewed")]
    assert len(renewed) == 1
    again = consume(tmp_path, "simple", writer.endpoint, "g", "Orders", "--expect", str(len(orders) - 1), "--await-s", "1")
    assert sorted(bodies(again)) == sorted(set(orders) - set(renewed))
    assert {line["attempt"] for line in again} == {2}
    assert consume(tmp_path, "simple", writer.endpoint, "g", "Orders", "--idle-s", "3") == []


def test_push_consumer_success_for_all_and_failures_retried_then_in_the_dead_letter_topic(nodes: Nodes, tmp_path: Path) -> None:
    store = tmp_path / "store"
    writer = nodes.start("writer", store, *SIZE_ARGS, "--consumer-max-attempts", "3", "--consumer-retry-delays", "1,2")
    sent = produce(tmp_path, writer.endpoint, 40)
    orders = [line for line in sent if line["topic"] == "Orders"]
    ok = consume(tmp_path, "push", writer.endpoint, "pushok", "Orders", "--seconds", "5")
    assert sorted(bodies(ok)) == sorted(bodies(orders)) and {line["result"] for line in ok} == {"SUCCESS"}
    failing = consume(tmp_path, "push", writer.endpoint, "pushfail", "Orders", "--fail-mod", "10", "--seconds", "9")
    failed = {line["body"]: line for line in orders if line["n"] % 10 == 0}
    assert failed
    by_body: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in failing:
        by_body[line["body"]].append(line)
    for body in failed:
        attempts = by_body[body]
        assert [a["attempt"] for a in attempts] == [1, 2, 3], body
        assert all(a["result"] == "FAILURE" for a in attempts)
        # The backoff: 1 s before the second delivery, 2 s before the third (timer slack allowed).
        assert attempts[1]["t"] - attempts[0]["t"] >= 0.9 and attempts[2]["t"] - attempts[1]["t"] >= 1.9, attempts
    for body in set(by_body) - set(failed):
        assert [a["result"] for a in by_body[body]] == ["SUCCESS"], body
    # The writer moved each failed message to %DLQ%pushfail once its third delivery failed.
    query = nodes.query(nodes.start("query", store, *SIZE_ARGS))
    for body, line in failed.items():
        found = query.QueryByUniqKey(
            query_pb2.QueryByUniqKeyRequest(topic="%DLQ%pushfail", uniq_key=line["message_id"]), timeout=RPC_TIMEOUT_S
        ).messages
        assert len(found) == 1, body
        stored = found[0]
        assert stored.body == body.encode() and stored.tags == line["tag"]
        properties = dict(stored.properties)
        assert properties["DLQ_ORIGIN_TOPIC"] == "Orders" and properties["DLQ_ORIGIN_MESSAGE_ID"] == line["message_id"]
        assert properties["RECONSUME_TIME"] == "3" or properties["RECONSUME_TIME"] == "2"
        assert properties["seq"] == str(line["n"])


def test_sigterm_mid_consumption_delivers_no_acknowledged_message_again(nodes: Nodes, tmp_path: Path) -> None:
    store = tmp_path / "store"
    writer = nodes.start("writer", store, *SIZE_ARGS, *SHORT_INVISIBLE)
    sent = produce(tmp_path, writer.endpoint, 400)
    orders = {line["body"] for line in sent if line["topic"] == "Orders"}
    # Paced, so that the stop comes while it is consuming.
    running = Background(tmp_path, "before", "simple", writer.endpoint, "g", "Orders", "--batch", "8", "--invisible-s", "3",
                         "--pace-s", "0.02")  # fmt: skip
    try:
        running.wait_lines(100)
        writer.stop()  # SIGTERM while the consumer is receiving and acknowledging
    finally:
        before = running.stop()
    acked = {line["body"] for line in before if line.get("acked")}
    assert 100 <= len(acked) < len(orders)
    again = nodes.start("writer", store, *SIZE_ARGS, *SHORT_INVISIBLE)
    after = consume_the_rest(tmp_path, again.endpoint, orders - set(acked))
    assert not acked & set(bodies(after))
    assert acked | set(bodies(after)) == orders


def test_sigkill_loses_no_message_and_redelivers_only_the_last_flush_intervals_acks(nodes: Nodes, tmp_path: Path) -> None:
    store = tmp_path / "store"
    flush = ["--consumer-flush-interval-ms", str(FLUSH_INTERVAL_MS), *SHORT_INVISIBLE]
    writer = nodes.start("writer", store, *SIZE_ARGS, *flush)
    sent = produce(tmp_path, writer.endpoint, 400)
    orders = {line["body"] for line in sent if line["topic"] == "Orders"}
    # Paced so that the acknowledgements before the kill span several flush intervals.
    running = Background(tmp_path, "before", "simple", writer.endpoint, "g", "Orders", "--batch", "8", "--invisible-s", "3",
                         "--pace-s", "0.03")  # fmt: skip
    try:
        running.wait_lines(150)
        killed_at = time.time()
        writer.proc.kill()
        writer.cleanup()
    finally:
        before = running.stop()
    acked = {line["body"]: line["t_done"] for line in before if line.get("acked")}
    assert 150 <= len(acked) < len(orders)
    again = nodes.start("writer", store, *SIZE_ARGS, *flush)
    after = consume_the_rest(tmp_path, again.endpoint, orders - set(acked))
    assert set(acked) | set(bodies(after)) == orders  # none lost
    redelivered = [body for body in bodies(after) if body in acked]
    # Only acknowledgements of the last flush interval before the kill may be lost.
    late = [acked[body] for body in redelivered if acked[body] < killed_at - KILL_BOUND_S]
    assert late == [], (len(redelivered), killed_at, sorted(late)[:5])
    # Some acknowledgements were older than the bound (each of them then kept).
    assert sum(1 for t in acked.values() if t < killed_at - KILL_BOUND_S) >= 50


def test_a_delivery_made_just_before_a_sigkill_keeps_its_attempt_handle_and_invisibility(nodes: Nodes, tmp_path: Path) -> None:
    """Deliveries of the last flush interval are journaled (docs/rocketmq5.md): after a
    SIGKILL the message comes back with delivery_attempt 2, as Apache's pop checkpoint
    makes it, not 1; its handle still acknowledges it and it stays away until its
    invisibility ends. The flush interval is longer than the test: only the journal holds them."""
    store = tmp_path / "store"
    flags = (*SIZE_ARGS, *SHORT_INVISIBLE, "--consumer-flush-interval-ms", "600000")
    writer = nodes.start("writer", store, *flags)
    make_topics(writer.endpoint, {"Orders": "NORMAL"})
    nodes.writer(writer).SendBatch(
        writer_pb2.SendBatchRequest(messages=[messages_pb2.Message(topic="Orders", body=f"m{i}".encode(), queue_id=0) for i in range(3)]),
        timeout=RPC_TIMEOUT_S,
    )
    gateway = service_pb2_grpc.MessagingServiceStub(nodes.channel(writer))
    (kept,) = own_receive(gateway, invisible_s=60)
    (dropped,) = own_receive(gateway, invisible_s=4)
    visible_again = time.monotonic() + 4
    assert (kept.body, dropped.body) == (b"m0", b"m1")
    assert kept.system_properties.delivery_attempt == dropped.system_properties.delivery_attempt == 1
    writer.proc.kill()
    writer.cleanup()
    again = nodes.start("writer", store, *flags)
    gateway = service_pb2_grpc.MessagingServiceStub(nodes.channel(again))
    got: list[tuple[float, v2.Message]] = []

    def both() -> bool:
        got.extend((time.monotonic(), m) for m in own_receive(gateway, invisible_s=60, batch=32))
        return {m.body for _, m in got} == {b"m1", b"m2"}

    wait_until(both, 30, "m1 and m2 after the restart", interval_s=0.2)
    # m0 stays invisible for its 60 s, m1 for the rest of its 4 s; then m1 is its second attempt.
    assert sorted((m.body, m.system_properties.delivery_attempt) for _, m in got) == [(b"m1", 2), (b"m2", 1)]
    assert all(at >= visible_again - 0.1 for at, m in got if m.body == b"m1")
    ack = gateway.AckMessage(
        v2s.AckMessageRequest(group=v2.Resource(name="g"), topic=v2.Resource(name="Orders"), entries=[
            v2s.AckMessageEntry(message_id=kept.system_properties.message_id, receipt_handle=kept.system_properties.receipt_handle)
        ]),
        timeout=RPC_TIMEOUT_S,
    )  # fmt: skip
    assert ack.status.code == v2.OK, ack  # m0's handle from before the kill
    assert not (store / "config" / "consumerState.journal.old").exists()


def own_receive(gateway: service_pb2_grpc.MessagingServiceStub, invisible_s: int, batch: int = 1) -> list[v2.Message]:
    """Group g's next messages of Orders queue 0 through our own v2 caller."""
    request = v2s.ReceiveMessageRequest(
        group=v2.Resource(name="g"), message_queue=v2.MessageQueue(topic=v2.Resource(name="Orders"), id=0),
        filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"), batch_size=batch,
        invisible_duration=duration_pb2.Duration(seconds=invisible_s), long_polling_timeout=duration_pb2.Duration(seconds=0),
    )  # fmt: skip
    answers = list(gateway.ReceiveMessage(request, timeout=RPC_TIMEOUT_S))
    return [a.message for a in answers if a.HasField("message")]


# Issue 37's acceptance 4: the matching subset of 1,000 messages with mixed properties.
SQL_FILTER = (
    "(amount BETWEEN 100 AND 400 OR region IN ('eu', 'apac')) AND NOT (vip = 'true') "
    "AND coupon IS NULL AND (score > 2.5 OR score IS NULL)"
)


def sql_filter_oracle(row: dict[str, str]) -> bool:
    """SQL_FILTER, written out by hand over the same strings (three-valued: an absent
    property is unknown, and unknown is not a match)."""
    amount_or_region = 100 <= int(row["amount"]) <= 400 or row.get("region") in ("eu", "apac")
    not_vip = "vip" in row and row["vip"] != "true"
    score = "score" not in row or float(row["score"]) > 2.5
    return amount_or_region and not_vip and "coupon" not in row and score


def test_a_sql92_simple_consumer_receives_exactly_the_matching_subset_of_1000(nodes: Nodes, tmp_path: Path) -> None:
    writer = nodes.start("writer", tmp_path / "store", *SIZE_ARGS)
    make_topics(writer.endpoint, {"Orders": "NORMAL"})
    rows: list[dict[str, str]] = []
    for n in range(1000):
        row = {"amount": str((n * 37) % 500)}
        if n % 3:
            row["region"] = ("eu", "us", "apac", "latam")[n % 4]
        if n % 5:
            row["vip"] = "true" if n % 7 == 0 else "false"
        if n % 11 == 0:
            row["coupon"] = "SAVE10"
        if n % 2:
            row["score"] = f"{(n % 50) / 10:.1f}"
        rows.append(row)
    stub = nodes.writer(writer)
    for start in range(0, 1000, 100):
        batch = [
            messages_pb2.Message(topic="Orders", body=f"sql {n}".encode(), properties=rows[n]) for n in range(start, start + 100)
        ]
        stub.SendBatch(writer_pb2.SendBatchRequest(messages=batch), timeout=RPC_TIMEOUT_S)
    wanted = {f"sql {n}" for n, row in enumerate(rows) if sql_filter_oracle(row)}
    assert 50 < len(wanted) < 500  # a subset, with something on both sides
    lines = consume(tmp_path, "simple", writer.endpoint, "sql", "Orders", "--sql", SQL_FILTER, "--idle-s", "4")
    got = bodies(lines)
    assert len(got) == len(set(got)) and set(got) == wanted
    assert all(line["properties"] == rows[int(line["body"].split()[1])] for line in lines)
    # Every message is consumed: the group's offsets reach each queue's end.
    assert sum(read_offsets(str(tmp_path / "store" / "config")).get(("Orders", "sql"), {}).values()) == 1000


def test_two_consumers_of_a_group_share_and_another_group_gets_all(nodes: Nodes, tmp_path: Path) -> None:
    writer = nodes.start("writer", tmp_path / "store", *SIZE_ARGS)
    sent = produce(tmp_path, writer.endpoint, 400)
    orders = sorted(line["body"] for line in sent if line["topic"] == "Orders")
    consumers = [
        # Paced, so that the one started first cannot take everything before the other starts.
        Background(tmp_path, f"shared{i}", "simple", writer.endpoint, "shared", "Orders", "--batch", "4", "--idle-s", "10",
                   "--await-s", "1", "--pace-s", "0.02")  # fmt: skip
        for i in range(2)
    ]
    other = Background(tmp_path, "other", "simple", writer.endpoint, "other", "Orders", "--expect", str(len(orders)))
    try:
        shared = [c.wait(timeout_s=120) for c in consumers]
        alone = other.wait(timeout_s=120)
    finally:
        for c in (*consumers, other):
            c.close()
    # The client picks queues at random, so a quiet spell may end one early: a third
    # consumer of the group takes what is left, if anything.
    left = consume(tmp_path, "simple", writer.endpoint, "shared", "Orders", "--want", str(want_file(tmp_path, orders, shared)))
    first, second, third = (set(bodies(lines)) for lines in (*shared, left))
    assert not first & second and not (first | second) & third  # no message went to two consumers
    assert sorted(bodies(shared[0]) + bodies(shared[1]) + bodies(left)) == orders
    assert len(first) >= 20 and len(second) >= 20  # both took part
    assert sorted(bodies(alone)) == orders


def want_file(tmp_path: Path, orders: list[str], shared: list[list[dict[str, Any]]]) -> Path:
    path = tmp_path / "left.txt"
    path.write_text("".join(f"{body}\n" for body in sorted(set(orders) - {line["body"] for lines in shared for line in lines})))
    return path


@pytest.mark.parametrize(
    ("option", "line"),
    [
        ("--fifo-group=a b", "rmqstore: error: --fifo-group: consumer group 'a b' must be 1-120 of letters, digits, %, |, _ and -"),
        ("--consumer-retry-delays=x", "rmqstore: error: writer serve: argument --consumer-retry-delays: 'x': expected whole seconds "
         "separated by commas, e.g. 1,5,10 (see rmqstore writer serve --help)"),
        ("--consumer-retry-delays=1,9000", "rmqstore: error: writer serve: argument --consumer-retry-delays: '1,9000': each delay "
         "must be 0-7200 seconds (see rmqstore writer serve --help)"),
        ("--consumer-max-attempts=0", "rmqstore: error: writer serve: argument --consumer-max-attempts: 0 is outside "
         "[1, 2147483647] (a count of at least 1) (see rmqstore writer serve --help)"),
        ("--consumer-flush-interval-ms=0", "rmqstore: error: writer serve: argument --consumer-flush-interval-ms: 0 is outside "
         "[1, 2147483647] (a count of at least 1) (see rmqstore writer serve --help)"),
    ],
)  # fmt: skip
def test_bad_consumer_options_stop_the_writer_before_it_touches_the_store(tmp_path: Path, option: str, line: str) -> None:
    store = tmp_path / "store"
    done = subprocess.run(
        [sys.executable, "-m", "rmqstore.cli.main", "writer", "serve", "--store", str(store), "--port", "0", option],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (done.returncode, done.stdout, done.stderr) == (2, "", line + "\n")
    assert not store.exists()


def test_fifo_push_consumer_gets_each_message_group_in_send_order(nodes: Nodes, tmp_path: Path) -> None:
    writer = nodes.start("writer", tmp_path / "store", *SIZE_ARGS, "--fifo-group", "ordered")
    sent = produce(tmp_path, writer.endpoint, 160)  # 40 FIFO messages to Carts, in 8 message groups
    expected: dict[str, list[int]] = defaultdict(list)
    for line in sent:
        if "group" in line:
            expected[line["group"]].append(line["n"])
    lines = consume(tmp_path, "push", writer.endpoint, "ordered", "Carts", "--seconds", "6")
    received: dict[str, list[int]] = defaultdict(list)
    for line in lines:
        received[line["group"]].append(int(line["body"].split(" ")[1]))
    assert dict(received) == dict(expected)
    assert {line["result"] for line in lines} == {"SUCCESS"} and {line["attempt"] for line in lines} == {1}


def test_fifo_push_consumer_forwards_a_failing_message_to_the_dead_letter_topic(nodes: Nodes, tmp_path: Path) -> None:
    """The FIFO push consumer retries a failing message itself (the group's attempts and
    delays), then forwards it with ForwardMessageToDeadLetterQueue and goes on."""
    store = tmp_path / "store"
    writer = nodes.start("writer", store, *SIZE_ARGS, "--fifo-group", "ordered", "--consumer-max-attempts", "2",
                         "--consumer-retry-delays", "1")  # fmt: skip
    sent = produce(tmp_path, writer.endpoint, 80)  # 20 FIFO messages to Carts (n 60-79)
    fifo = {line["n"]: line for line in sent if "group" in line}
    lines = consume(tmp_path, "push", writer.endpoint, "ordered", "Carts", "--fail-mod", "7", "--seconds", "8")
    consumed = Counter(int(line["body"].split(" ")[1]) for line in lines)
    failing = {n for n in fifo if n % 7 == 0}
    assert failing and consumed == Counter({n: 2 if n in failing else 1 for n in fifo})
    query = nodes.query(nodes.start("query", store, *SIZE_ARGS))
    for n in sorted(fifo):
        found = query.QueryByUniqKey(
            query_pb2.QueryByUniqKeyRequest(topic="%DLQ%ordered", uniq_key=fifo[n]["message_id"]), timeout=RPC_TIMEOUT_S
        ).messages
        assert len(found) == (1 if n in failing else 0), n
        if found:
            assert dict(found[0].properties)["DLQ_ORIGIN_TOPIC"] == "Carts"
            assert dict(found[0].properties)["__SHARDINGKEY"] == fifo[n]["group"]


def test_a_damaged_consumer_offset_file_stops_the_writer_with_its_reason(tmp_path: Path) -> None:
    """Neither consumerOffset.json nor its .bak decodes: the writer does not start (it
    would otherwise hand every group's messages out again from the start), and says why."""
    config = tmp_path / "store" / "config"
    config.mkdir(parents=True)
    (config / "consumerOffset.json").write_text("{garbage")
    done = subprocess.run(
        # --init: the directory holds only config/, which writer serve otherwise refuses as no store.
        [sys.executable, "-m", "rmqstore.cli.main", "writer", "serve", "--store", str(tmp_path / "store"), "--port", "0", "--init"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        f"rmqstore: error: {config}/consumerOffset.json is not readable JSON: Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)\n"
    )
    assert (config / "consumerOffset.json").read_text() == "{garbage"  # left as it was


def _send_v1(nodes: Nodes, writer: Any, prefix: str, count: int) -> None:
    """``count`` messages to Orders through rmqstore.v1, spread over its four queues."""
    messages = [
        messages_pb2.Message(topic="Orders", body=f"{prefix} {i}".encode(), queue_id=i % 4) for i in range(count)
    ]
    nodes.writer(writer).SendBatch(writer_pb2.SendBatchRequest(messages=messages), timeout=RPC_TIMEOUT_S)


def test_offsets_past_the_queues_end_after_a_power_cut_are_moved_back_and_nothing_sent_after_is_skipped(
    nodes: Nodes, tmp_path: Path
) -> None:
    """The state a power cut leaves under --flush async, made with real processes: the
    group acknowledged messages that the disk never got, so consumerOffset.json is past
    the queues' durable ends. It is the copy of the store as it was synced (``cut``: the
    first 225 messages) with the offset files of the store that went on (325 sent and
    acknowledged). check and consumerProgress flag it; the writer moves the offsets back,
    says so, and the official consumer then gets every message the official producer sends
    after the restart (before: those landing below the old offsets, about 100, never came)."""
    store, cut = tmp_path / "store", tmp_path / "cut"
    flush = ["--flush", "async"]
    writer = nodes.start("writer", store, *SIZE_ARGS, *flush)
    _send_v1(nodes, writer, "synced", 225)
    writer.stop()
    shutil.copytree(store, cut)  # what the disk holds at the cut
    writer = nodes.start("writer", store, *SIZE_ARGS, *flush)
    _send_v1(nodes, writer, "lost", 100)
    before = consume(tmp_path, "simple", writer.endpoint, "g", "Orders", "--expect", "325", "--idle-s", "10")
    assert len({line["body"] for line in before if line.get("acked")}) == 325
    writer.stop()
    for name in ("consumerOffset.json", "consumerOffset.json.bak", "consumerState.json"):
        if (store / "config" / name).exists():
            shutil.copy(store / "config" / name, cut / "config" / name)
    committed = read_offsets(str(cut / "config"))[("Orders", "g")]
    assert sum(committed.values()) == 325

    checked = subprocess.run(
        [sys.executable, "-m", "rmqstore.cli.main", "check", str(cut)], capture_output=True, text=True, timeout=120, check=False
    )
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "consumer group g: Orders/0: committed offset 82 is past the queue's end 57" in checked.stdout + checked.stderr
    progress = subprocess.run(
        [sys.executable, "-m", "rmqstore.cli.main", "consumerProgress", "--store", str(cut), "-g", "g", "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert progress.returncode == 0, progress.stderr
    rows = json.loads(progress.stdout)["queues"]
    assert [row["pastEnd"] for row in rows] == [True] * 4
    assert "consumer offset past the queue's end in Orders/0 (82 > 57)" in progress.stderr

    again = nodes.start("writer", cut, *SIZE_ARGS, *flush)
    make_topics(again.endpoint, {"Orders": "NORMAL", "Carts": "FIFO"})
    sent = run_python_client(tmp_path, "send", again.endpoint, "Orders", "Carts", "400")
    orders = {line["body"] for line in sent if line["topic"] == "Orders"}
    assert len(orders) == 300
    after = consume(tmp_path, "simple", again.endpoint, "g", "Orders", "--idle-s", "5")
    assert {line["body"] for line in after} == orders  # every one, none skipped
    assert not any(line["body"].startswith(("synced", "lost")) for line in after)  # nothing acknowledged came back
    again.stop()
    assert "committed offset 82 is past the queue's end 57" in again.stderr_text()
    assert subprocess.run([sys.executable, "-m", "rmqstore.cli.main", "check", str(cut)], capture_output=True, timeout=120).returncode == 0


def test_a_writer_process_guards_its_group_files_and_names(nodes: Nodes, tmp_path: Path) -> None:
    """Issue 40's smaller findings against `writer serve` processes: the state file is owner
    only; consumerOffset.json and its .bak lost while the state file names the group: the
    offsets come from it, with a warning (before: every message again from offset 0); a
    corrupt state file set aside; queue -1, a group too long for its %DLQ% topic and a
    route query for a system name refused, none creating a topic."""
    store = tmp_path / "store"
    config = store / "config"

    def gateway(node: Any) -> Any:
        return service_pb2_grpc.MessagingServiceStub(nodes.channel(node))

    def receive(stub: Any, group: str = "g", queue_id: int = 0) -> tuple[int, list[Any]]:
        request = v2s.ReceiveMessageRequest(
            group=v2.Resource(name=group), message_queue=v2.MessageQueue(topic=v2.Resource(name="Orders"), id=queue_id),
            filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"), batch_size=32,
            invisible_duration=duration_pb2.Duration(seconds=60), long_polling_timeout=duration_pb2.Duration(seconds=0),
        )  # fmt: skip
        answers = list(stub.ReceiveMessage(request, timeout=RPC_TIMEOUT_S))
        (status,) = [a.status for a in answers if a.HasField("status")]
        return status.code, [a.message for a in answers if a.HasField("message")]

    writer = nodes.start("writer", store, *SIZE_ARGS)
    _send_v1(nodes, writer, "first", 8)
    stub = gateway(writer)
    _, handed = receive(stub)
    entries = [v2s.AckMessageEntry(message_id=m.system_properties.message_id, receipt_handle=m.system_properties.receipt_handle) for m in handed]
    assert stub.AckMessage(v2s.AckMessageRequest(group=v2.Resource(name="g"), topic=v2.Resource(name="Orders"), entries=entries), timeout=RPC_TIMEOUT_S).status.code == v2.OK
    assert receive(stub, queue_id=-1)[0] == v2.BAD_REQUEST
    assert receive(stub, group="g" * 121)[0] == v2.ILLEGAL_CONSUMER_GROUP
    for name in ("TBW102", "RMQ_SYS_TRACE_TOPIC", "%DLQ%g"):
        answer = stub.QueryRoute(v2s.QueryRouteRequest(topic=v2.Resource(name=name)), timeout=RPC_TIMEOUT_S)
        assert answer.status.code == v2.TOPIC_NOT_FOUND, name
    writer.stop()
    assert (config / "consumerState.json").stat().st_mode & 0o777 == 0o600
    assert not any((store / "consumequeue" / name).exists() for name in ("TBW102", "RMQ_SYS_TRACE_TOPIC", "%DLQ%g"))
    committed = read_offsets(str(config))[("Orders", "g")][0]
    assert committed == 2  # queue 0 held messages 0 and 4

    (config / "consumerOffset.json").unlink()
    (config / "consumerOffset.json.bak").unlink(missing_ok=True)
    again = nodes.start("writer", store, *SIZE_ARGS)
    offset = gateway(again).GetOffset(
        v2s.GetOffsetRequest(group=v2.Resource(name="g"), message_queue=v2.MessageQueue(topic=v2.Resource(name="Orders"), id=0)),
        timeout=RPC_TIMEOUT_S,
    ).offset
    assert offset == committed  # not 0: the group did not start over
    again.stop()
    assert "consumerOffset.json (and its .bak) is missing or empty" in again.stderr_text()

    damaged = (config / "consumerState.json").read_text()[:-10]
    (config / "consumerState.json").write_text(damaged)
    third = nodes.start("writer", store, *SIZE_ARGS)
    third.stop()
    (aside,) = config.glob("consumerState.json.corrupt-*")
    assert aside.read_text() == damaged and "set aside as" in third.stderr_text()
