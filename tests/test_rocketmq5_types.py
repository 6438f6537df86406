"""Issue 37's acceptance 1 with the official clients, unmodified, in processes of their
own: the Python and Node.js producers send NORMAL, FIFO, DELAY and TRANSACTION (committed)
messages to topics typed
as ``rmqstore updateTopic -a +message.type=…`` types them, and each client refuses, in its
own words, a send whose type the route says the topic does not accept (Apache's proxy
answers settings that make the clients check, so a mismatched send never leaves them).
The writer's own refusal of such a send from a client that does not check (40014,
MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, in Apache's proxy's words) is tested with our v2
caller in tests/test_rocketmq5.py; an unknown topic's NotFound 40402 with each client in
tests/test_rocketmq5_clients.py."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import duration_pb2
from support.nodes import Nodes, ProcessNode
from support.rmq5 import CLIENT_TIMEOUT_S, DRIVERS, client_env, make_topics, rmq5_python, run_node
from support.stores import SIZE_ARGS
from support.wait import wait_until

from rmqstore.rocketmq_v2 import definition_pb2 as v2
from rmqstore.rocketmq_v2 import service_pb2 as v2s
from rmqstore.rocketmq_v2 import service_pb2_grpc

RPC_TIMEOUT_S = 15.0
TOPICS = {"Plain": "NORMAL", "Ordered": "FIFO", "Later": "DELAY", "Bound": "TRANSACTION", "Any": "MIXED"}
ACCEPTED = [
    ("Plain", "NORMAL"), ("Ordered", "FIFO"), ("Later", "DELAY"), ("Bound", "TRANSACTION"),
    ("Any", "NORMAL"), ("Any", "FIFO"), ("Any", "DELAY"), ("Any", "TRANSACTION"),
]  # fmt: skip
REFUSED = [
    ("Plain", "FIFO"), ("Plain", "DELAY"), ("Plain", "TRANSACTION"), ("Ordered", "NORMAL"), ("Later", "NORMAL"),
    ("Ordered", "DELAY"), ("Bound", "NORMAL"), ("Later", "TRANSACTION"),
]  # fmt: skip
TYPE_NUMBERS = {"NORMAL": 1, "FIFO": 2, "DELAY": 3, "TRANSACTION": 4}
ROUTE_TYPES = {"NORMAL": ["NORMAL"], "FIFO": ["FIFO"], "DELAY": ["DELAY"], "TRANSACTION": ["TRANSACTION"], "MIXED": ["NORMAL", "FIFO", "DELAY", "TRANSACTION"]}


@pytest.fixture
def writer(nodes: Nodes, tmp_path: Path) -> Iterator[ProcessNode]:
    started = nodes.start("writer", tmp_path / "store", *SIZE_ARGS, "--no-auto-create")
    make_topics(started.endpoint, TOPICS)
    yield started


def python_sends(tmp_path: Path, endpoint: str, pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    home = tmp_path / "client-home"
    home.mkdir(exist_ok=True)
    done = subprocess.run(
        [rmq5_python(), str(DRIVERS / "typed_producer.py"), endpoint, *(f"{t}:{k}" for t, k in pairs)],
        capture_output=True, timeout=CLIENT_TIMEOUT_S, env=client_env(home), cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def node_sends(tmp_path: Path, endpoint: str, pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    output = run_node(tmp_path, "typed_producer.js", endpoint, *(f"{t}:{k}" for t, k in pairs))
    return [json.loads(line) for line in output.splitlines()]


def received(nodes: Nodes, writer: ProcessNode, topic: str, count: int) -> list[v2.Message]:
    """``count`` messages of ``topic`` for a group of its own (a DELAY message once due)."""
    gateway = service_pb2_grpc.MessagingServiceStub(nodes.channel(writer))
    got: list[v2.Message] = []

    def more() -> list[v2.Message] | None:
        for queue_id in range(4):
            request = v2s.ReceiveMessageRequest(
                group=v2.Resource(name=f"check-{topic}"), message_queue=v2.MessageQueue(topic=v2.Resource(name=topic), id=queue_id),
                filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"), batch_size=32,
                invisible_duration=duration_pb2.Duration(seconds=60), long_polling_timeout=duration_pb2.Duration(seconds=0),
            )  # fmt: skip
            got.extend(a.message for a in gateway.ReceiveMessage(request, timeout=RPC_TIMEOUT_S) if a.HasField("message"))
        return got if len(got) >= count else None

    return wait_until(more, 30, f"{count} messages of {topic}", interval_s=0.2)


def check_accepted(nodes: Nodes, writer: ProcessNode, lines: list[dict[str, Any]], client: str) -> None:
    assert [(line["topic"], line["type"]) for line in lines] == ACCEPTED
    assert all("message_id" in line for line in lines), lines
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        by_topic.setdefault(line["topic"], []).append(line)
    for topic, sent in by_topic.items():
        messages = received(nodes, writer, topic, len(sent))
        kinds = {m.body.decode(): m for m in messages}
        assert sorted(kinds) == sorted(f"{line['type']} to {topic}" for line in sent), (client, topic)
        for line in sent:
            message = kinds[f"{line['type']} to {topic}"]
            assert message.system_properties.message_id == line["message_id"]
            assert message.system_properties.message_group == ("group-1" if line["type"] == "FIFO" else "")
            assert message.system_properties.HasField("delivery_timestamp") == (line["type"] == "DELAY")
            assert message.system_properties.message_type == v2.MessageType.Value(line["type"])
            # The timer's properties are not the user's; the transaction id is, as Apache's
            # proxy hands it back (MessageConst.STRING_HASH_SET does not name it).
            assert set(message.user_properties) == ({"__transactionId__"} if line["type"] == "TRANSACTION" else set())


@pytest.mark.parametrize("client", ["python", "nodejs"])
def test_official_producers_send_each_type_to_a_topic_typed_for_it(nodes: Nodes, writer: ProcessNode, tmp_path: Path, client: str) -> None:
    sends = python_sends if client == "python" else node_sends
    check_accepted(nodes, writer, sends(tmp_path, writer.endpoint, ACCEPTED), client)


def test_each_official_producer_refuses_a_type_the_route_does_not_accept_in_its_own_words(writer: ProcessNode, tmp_path: Path) -> None:
    lines = python_sends(tmp_path, writer.endpoint, REFUSED)
    assert [(line["topic"], line["type"]) for line in lines] == REFUSED
    for line in lines:
        accepted = ",".join(ROUTE_TYPES[TOPICS[line["topic"]]])
        assert {k: line.get(k) for k in ("error", "message")} == {
            "error": "IllegalArgumentException",
            "message": f"current message type not match with queue accept message types, topic:{line['topic']}, "
            f"message_type:{line['type']}, queue access type:{accepted}",
        }, line
    lines = node_sends(tmp_path, writer.endpoint, REFUSED)
    assert [(line["topic"], line["type"]) for line in lines] == REFUSED
    for line in lines:
        numbers = [TYPE_NUMBERS[kind] for kind in ROUTE_TYPES[TOPICS[line["topic"]]]]
        assert {k: line.get(k) for k in ("error", "message")} == {
            "error": "TypeError",
            "message": f"Current message type not match with topic accept message types, topic={line['topic']}, "
            f"actualMessageType={TYPE_NUMBERS[line['type']]}, acceptMessageTypes={json.dumps(numbers, separators=(',', ':'))}",
        }, line
