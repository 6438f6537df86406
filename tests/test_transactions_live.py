"""Transactions against real writer processes (``rmqstore writer serve`` on 127.0.0.1 port
0) with the official Python client's transactional producer and SimpleConsumer
(rocketmq-python-client, unmodified): a commit is consumed once, a rollback never (nor
found as a normal message), a transaction left open is checked with its producer and its
answer applied, and one open when the writer is SIGKILLed is resolved after the restart;
the official Node.js client's transactional producer (rocketmq-client-nodejs) commits,
rolls back and answers checks alike.
The writer's check runs on short timings (``--transaction-*``), Apache's defaults being
6 s and 30 s."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.nodes import Nodes, ProcessNode
from support.rmq5 import DRIVERS, client_env, make_topics, rmq5_python, run_node

from rmqstore.client.shown import message_json
from rmqstore.common.codec import properties as props
from rmqstore.common.codec.consumequeue import HALF_TOPIC
from rmqstore.v1 import query_pb2

pytestmark = pytest.mark.slow

TOPIC = "Payments"
CLIENT_TIMEOUT_S = 120
# The check: a half message is first checked at 1.5 s old, the queue looked over every 0.5 s.


def writer_node(nodes: Nodes, store: Path, check_interval_ms: int = 500) -> ProcessNode:
    return nodes.start(
        "writer", store, "--flush", "sync", "--transaction-timeout-ms", "1500", "--transaction-check-interval-ms", str(check_interval_ms)
    )


def transactions(tmp_path: Path, *args: str) -> list[dict[str, Any]]:
    home = tmp_path / "client-home"
    home.mkdir(exist_ok=True)
    done = subprocess.run(
        [rmq5_python(), str(DRIVERS / "python_transactions.py"), *args],
        capture_output=True, timeout=CLIENT_TIMEOUT_S, env=client_env(home), cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def consume(tmp_path: Path, endpoint: str, expect: int, idle_s: int = 4) -> list[str]:
    """The bodies a SimpleConsumer receives (and acknowledges) until ``expect`` came and
    then nothing more for ``idle_s``."""
    consumer = [rmq5_python(), str(DRIVERS / "python_consumer.py"), "simple", endpoint, "payments-readers", TOPIC,
                "--expect", str(expect + 1), "--idle-s", str(idle_s)]  # fmt: skip
    done = subprocess.run(
        consumer, capture_output=True, timeout=CLIENT_TIMEOUT_S, env=client_env(tmp_path / "client-home"), cwd=tmp_path, check=False
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    return sorted(json.loads(line)["body"] for line in done.stdout.splitlines())


def find(nodes: Nodes, query: ProcessNode, message_id: str) -> list[Any]:
    answer = nodes.query(query).QueryByUniqKey(query_pb2.QueryByUniqKeyRequest(topic=TOPIC, uniq_key=message_id), timeout=15)
    return list(answer.messages)


def test_commit_is_consumed_once_and_rollback_never_nor_found(nodes: Nodes, tmp_path: Path) -> None:
    store = tmp_path / "store"
    writer = writer_node(nodes, store)
    make_topics(writer.endpoint, {TOPIC: "TRANSACTION"})
    sent = transactions(tmp_path, "end", writer.endpoint, TOPIC, "6")
    assert [line["resolution"] for line in sent] == ["COMMIT", "ROLLBACK"] * 3
    # Apache's proxy passes the broker's transaction id: the message id.
    assert all(line["transaction_id"] == line["message_id"] for line in sent)
    assert consume(tmp_path, writer.endpoint, 3) == ["commit 0", "commit 2", "commit 4"]
    query = nodes.start("query", store)
    for line in sent:
        found = find(nodes, query, line["message_id"])
        if line["resolution"] == "COMMIT":
            # The committed message in its topic, as a normal message is found.
            assert [(m.topic, m.body) for m in found] == [(TOPIC, line["sent"].encode())]
        else:
            # Never as a message of its topic: only its half message, marked so.
            assert [m.topic for m in found] == [HALF_TOPIC]
            assert found[0].properties[props.REAL_TOPIC] == TOPIC
            assert message_json(found[0], with_body=False)["pendingTransaction"] is True


def test_an_open_transaction_is_checked_with_its_producer_and_its_answer_applied(nodes: Nodes, tmp_path: Path) -> None:
    writer = writer_node(nodes, tmp_path / "store")
    make_topics(writer.endpoint, {TOPIC: "TRANSACTION"})
    lines = transactions(tmp_path, "orphan", writer.endpoint, TOPIC, "4", "--checks", "4", "--seconds", "60")
    checked = sorted((line["checked"], line["answer"]) for line in lines if "checked" in line)
    assert checked == [("commit 0", "COMMIT"), ("commit 2", "COMMIT"), ("rollback 1", "ROLLBACK"), ("rollback 3", "ROLLBACK")]
    assert consume(tmp_path, writer.endpoint, 2) == ["commit 0", "commit 2"]


def test_a_transaction_open_at_a_sigkill_is_resolved_after_the_restart(nodes: Nodes, tmp_path: Path) -> None:
    store = tmp_path / "store"
    writer = writer_node(nodes, store)
    make_topics(writer.endpoint, {TOPIC: "TRANSACTION"})
    sent = transactions(tmp_path, "orphan", writer.endpoint, TOPIC, "4")
    assert len(sent) == 4
    writer.kill()  # between the half messages and any commit
    # Each look before the producer connects counts as a check (as Apache counts it): 2 s
    # apart, the 15 checks leave the restarted client half a minute to start.
    restarted = writer_node(nodes, store, check_interval_ms=2000)
    lines = transactions(tmp_path, "checker", restarted.endpoint, TOPIC, "--checks", "4", "--seconds", "60")
    assert sorted(line["checked"] for line in lines) == ["commit 0", "commit 2", "rollback 1", "rollback 3"]
    assert consume(tmp_path, restarted.endpoint, 2) == ["commit 0", "commit 2"]


def node_transactions(tmp_path: Path, *args: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in run_node(tmp_path, "official_transactions.js", *args).splitlines()]


def test_the_nodejs_transactional_producer_commits_rolls_back_and_answers_checks(nodes: Nodes, tmp_path: Path) -> None:
    writer = writer_node(nodes, tmp_path / "store")
    make_topics(writer.endpoint, {TOPIC: "TRANSACTION"})
    sent = node_transactions(tmp_path, "end", writer.endpoint, TOPIC, "4")
    assert [line["resolution"] for line in sent] == ["COMMIT", "ROLLBACK"] * 2
    assert all(line["transaction_id"] == line["message_id"] for line in sent)
    lines = node_transactions(tmp_path, "orphan", writer.endpoint, TOPIC, "4", "4", "60")
    checked = sorted((line["checked"], line["answer"]) for line in lines if "checked" in line)
    assert checked == [("commit 0", "COMMIT"), ("commit 2", "COMMIT"), ("rollback 1", "ROLLBACK"), ("rollback 3", "ROLLBACK")]
    # The commits of both runs, each once; no rollback.
    assert consume(tmp_path, writer.endpoint, 4) == ["commit 0", "commit 0", "commit 2", "commit 2"]
