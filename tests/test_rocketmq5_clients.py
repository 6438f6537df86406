"""The official RocketMQ 5 clients, unmodified, against ``rmqstore writer serve`` processes;
every message then found through a ``rmqstore query serve`` process.

The Python client (PyPI rocketmq-python-client 5.x) runs in a virtualenv of its own
(``.venv-rmq5``, made by test.sh; ``RMQSTORE_RMQ5_VENV`` names another), since it bundles
its own copy of the v2 protos, and in a process of its own (tests/rocketmq5/python_producer.py)."""

from __future__ import annotations

import concurrent.futures
import ipaddress
import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.nodes import Nodes, ProcessNode
from support.pki import Pki
from support.rmq5 import (
    DRIVERS,
    NODE_CLIENT_MESSAGES,
    NODE_DIR,
    PYTHON_CLIENT_MESSAGES,
    ROOT,
    client_env,
    make_topics,
    node_command,
    rmq5_python,
    run_node,
    run_python_client,
)
from support.stores import SIZE_ARGS

from rmqstore.v1 import messages_pb2, query_pb2, query_pb2_grpc

RPC_TIMEOUT_S = 15.0


def official_wire_shape(package: str, python: str) -> dict[str, Any]:
    done = subprocess.run(
        [python, str(DRIVERS / "wire_summary.py"), package], capture_output=True, timeout=120, check=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )  # fmt: skip
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_our_v2_protos_equal_the_official_clients_on_the_wire() -> None:
    """Every message, field (number, type, repetition, oneof), enum value and method the
    official client knows is ours too, identically; ours may be newer (more fields)."""
    theirs = official_wire_shape("rocketmq.grpc_protocol", rmq5_python())
    ours = official_wire_shape("rmqstore.rocketmq_v2", sys.executable)
    assert set(theirs) <= set(ours)
    for name, shape in theirs.items():
        missing = [entry for entry in shape if entry not in ours[name]]
        assert not missing, f"{name}: {missing}"
    assert "apache.rocketmq.v2.MessagingService" in theirs


def query_stub(nodes: Nodes, node: ProcessNode) -> query_pb2_grpc.QueryServiceStub:
    return nodes.query(node)


def key_matches(query: query_pb2_grpc.QueryServiceStub, topic: str, key: str) -> set[int]:
    """The commit log offsets of every record QueryByKey finds under the key, all pages."""
    offsets: set[int] = set()
    cursor = ""
    while True:
        page = query.QueryByKey(
            query_pb2.QueryByKeyRequest(topic=topic, key=key, page_size=1000, cursor=cursor), timeout=RPC_TIMEOUT_S
        )
        offsets.update(m.commitlog_offset for m in page.messages)
        if page.complete:
            return offsets
        assert page.cursor, (topic, key)
        cursor = page.cursor


def find_all(query: query_pb2_grpc.QueryServiceStub, lines: list[dict[str, Any]]) -> list[messages_pb2.StoredMessage]:
    """:func:`find_everywhere` for each line, four lookups at a time. A key many messages
    share (a hundred customers' keys over thousands of messages) is looked up once, every
    page of it, rather than once for each of its messages."""
    keys = {(line["topic"], key) for line in lines for key in line["keys"]}
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        found = dict(zip(keys, pool.map(lambda topic_key: key_matches(query, *topic_key), keys)))
        return list(pool.map(lambda line: find_everywhere(query, line, found), lines))


def find_everywhere(
    query: query_pb2_grpc.QueryServiceStub, line: dict[str, Any], by_key: dict[tuple[str, str], set[int]]
) -> messages_pb2.StoredMessage:
    """The message found by its client message id, by each key (``by_key``: what
    QueryByKey found under it), by the queue offset of its receipt (in the queue it was
    stored in) and by that record's offset msgId: one record."""
    topic = line["topic"]
    by_uniq = query.QueryByUniqKey(query_pb2.QueryByUniqKeyRequest(topic=topic, uniq_key=line["message_id"]), timeout=RPC_TIMEOUT_S)
    assert len(by_uniq.messages) == 1, line
    stored = by_uniq.messages[0]
    for key in line["keys"]:
        assert stored.commitlog_offset in by_key[(topic, key)], (key, line)
    at = query.QueryByQueueOffset(
        query_pb2.QueryByQueueOffsetRequest(topic=topic, queue_id=stored.queue_id, queue_offset=line["offset"]),
        timeout=RPC_TIMEOUT_S,
    ).message
    assert at.commitlog_offset == stored.commitlog_offset, line
    by_id = query.QueryByMsgId(query_pb2.QueryByMsgIdRequest(msg_id=at.offset_msg_id), timeout=RPC_TIMEOUT_S).message
    assert by_id.commitlog_offset == stored.commitlog_offset, line
    assert stored.body == line["body"].encode()
    assert stored.uniq_key == line["message_id"]
    assert sorted(stored.keys) == line["keys"]
    properties = dict(stored.properties)
    if "group" in line:
        assert properties.pop("__SHARDINGKEY") == line["group"]
    else:
        assert stored.tags == line["tag"] and properties.pop("TAGS") == line["tag"]
        for name, value in line["properties"].items():
            assert properties.pop(name) == value
    assert sorted(properties.pop("KEYS").split(" ")) == line["keys"]
    assert properties.pop("UNIQ_KEY") == line["message_id"]
    # The born host as the client sent it (the Python client its IP, the Node.js client its
    # host name), as Apache's proxy keeps it; the record's own is the connection's address.
    born = properties.pop("__BORNHOST")
    assert born == socket.gethostname() or ipaddress.ip_address(born), born
    assert stored.born_host.startswith("127.0.0.1:"), stored.born_host
    assert properties == {}, properties
    return stored


@pytest.mark.slow
def test_official_python_client_sends_and_every_message_is_found(nodes: Nodes, tmp_path: Path) -> None:
    store = tmp_path / "store"
    writer = nodes.start("writer", store, *SIZE_ARGS)
    assert writer.serving["advertise"] == writer.endpoint
    make_topics(writer.endpoint, {"Orders": "NORMAL", "Carts": "FIFO"})
    lines = run_python_client(tmp_path, "send", writer.endpoint, "Orders", "Carts", str(PYTHON_CLIENT_MESSAGES))
    assert len(lines) == PYTHON_CLIENT_MESSAGES  # every receipt OK (the driver stops at the first error)
    assert {line["mode"] for line in lines} == {"sync", "async"}
    assert len({line["message_id"] for line in lines}) == PYTHON_CLIENT_MESSAGES
    query_node = nodes.start("query", store, *SIZE_ARGS)
    query = query_stub(nodes, query_node)
    stored = find_all(query, lines)
    groups: dict[str, list[tuple[int, messages_pb2.StoredMessage]]] = defaultdict(list)
    for line, message in zip(lines, stored):
        if "group" in line:
            groups[line["group"]].append((line["n"], message))
            # The writer places a group where the Python client's own hash does: the
            # receipt's queue and offset name the record.
            assert (message.queue_id, message.queue_offset) == (line["queue_id"], line["offset"]), line
    assert len(groups) == 8
    for group, members in groups.items():
        assert len({m.queue_id for _, m in members}) == 1, group  # one queue a group
        by_send = [m.queue_offset for _, m in sorted(members, key=lambda pair: pair[0])]
        assert by_send == sorted(by_send), group  # in send order
    writer.stop()
    query_node.stop()
    check = subprocess.run(
        [sys.executable, "-m", "rmqstore.cli.main", "check", str(store), *SIZE_ARGS], capture_output=True, timeout=300, check=False
    )
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()


def test_python_client_sees_a_bad_topic_refused_and_the_writer_keeps_serving(nodes: Nodes, tmp_path: Path) -> None:
    writer = nodes.start("writer", tmp_path / "store", *SIZE_ARGS, "--no-auto-create")
    home = tmp_path / "client-home"
    home.mkdir()
    script = (
        "import sys\n"
        "from rocketmq import ClientConfiguration, Credentials, Message, Producer\n"
        "p = Producer(ClientConfiguration(sys.argv[1], Credentials(), request_timeout=5), ('Missing',))\n"
        "p.startup()\n"
        "m = Message()\n"
        "m.topic = 'Missing'\n"
        "m.body = b'x'\n"
        "try:\n"
        "    p.send(m)\n"
        "except Exception as e:\n"
        "    print('refused:', e)\n"
        "p.shutdown()\n"
    )
    done = subprocess.run(
        [rmq5_python(), "-c", script, writer.endpoint], capture_output=True, timeout=120, env=client_env(home), check=False
    )
    output = done.stdout.decode()
    # The client words the failure itself; the writer's v2 status is in its log.
    assert output == "refused: failed to fetch topic:Missing route.\n", (output, done.stderr.decode()[-2000:])
    log = (home / "logs" / "rocketmq_python" / "rocketmq_client.log").read_text(errors="replace")
    # Apache's proxy's NotFound, word for word.
    assert "40402, CODE: 17  DESC: No topic route info in name server for the topic: Missing" in log
    channel = grpc.insecure_channel(writer.endpoint)
    try:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=RPC_TIMEOUT_S)
        assert status.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        channel.close()


@pytest.mark.crash
def test_sigkill_under_sync_flush_loses_no_acknowledged_python_client_send(nodes: Nodes, tmp_path: Path) -> None:
    """SIGKILL the writer during the Python client's send loop: every message whose
    receipt was OK is in the store after a restart. A send whose answer the client never
    got in time (its request timeout) is retried, up to three attempts in all, and a retry
    the writer answers stores the message again: such duplicates are counted (records of
    one message id), never more than the attempts."""
    import queue
    import threading

    from rmqstore.common.files.commitlog import CommitLog

    store = tmp_path / "store"
    writer = nodes.start("writer", store, *SIZE_ARGS, "--flush", "sync")
    make_topics(writer.endpoint, {"Orders": "NORMAL"})
    home = tmp_path / "client-home"
    home.mkdir()
    client = subprocess.Popen(
        [rmq5_python(), str(DRIVERS / "python_producer.py"), "loop", writer.endpoint, "Orders", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=client_env(home),
    )  # fmt: skip
    lines: queue.Queue[bytes | None] = queue.Queue()

    def read() -> None:
        assert client.stdout is not None
        for line in client.stdout:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    acknowledged: list[dict[str, Any]] = []
    try:
        while len(acknowledged) < 300:
            line = lines.get(timeout=60)
            assert line is not None, "the client stopped before the kill"
            event = json.loads(line)
            if "message_id" in event:
                acknowledged.append(event)
        writer.proc.kill()
        writer.proc.wait(timeout=30)
        # Receipts already on their way out are acknowledged too: read until the client,
        # whose sends now fail, has printed nothing for a while.
        while (line := _next_or_none(lines, 5.0)) is not None:
            event = json.loads(line)
            if "message_id" in event:
                acknowledged.append(event)
    finally:
        client.kill()
        client.wait(timeout=30)
        reader.join(timeout=30)
        if client.stdout is not None:
            client.stdout.close()
    restarted = nodes.start("writer", store, *SIZE_ARGS, "--flush", "sync")
    assert restarted.serving["recovered"]["uncleanShutdown"] is True
    restarted.stop()
    log = CommitLog(str(store / "commitlog"), 65536)
    try:
        stored = [record.properties["UNIQ_KEY"] for record in log.records()]
    finally:
        log.close()
    missing = {event["message_id"] for event in acknowledged} - set(stored)
    assert not missing, f"{len(missing)} acknowledged messages lost"
    copies = Counter(stored)
    duplicates = sum(count - 1 for count in copies.values())
    print(f"acknowledged {len(acknowledged)}, stored {len(stored)}, duplicate records {duplicates}")
    assert max(copies.values()) <= 3  # the client's attempts
    assert len(stored) >= len(acknowledged)


def _next_or_none(lines: Any, timeout_s: float) -> bytes | None:
    import queue

    try:
        return lines.get(timeout=timeout_s)  # type: ignore[no-any-return]
    except queue.Empty:
        return None


@pytest.mark.slow
def test_official_nodejs_client_sends_and_every_message_is_found(nodes: Nodes, tmp_path: Path) -> None:
    store = tmp_path / "store"
    writer = nodes.start("writer", store, *SIZE_ARGS)
    make_topics(writer.endpoint, {"NodeOrders": "NORMAL"})
    output = run_node(tmp_path, "official_producer.js", writer.endpoint, "NodeOrders", str(NODE_CLIENT_MESSAGES))
    lines = [json.loads(line) for line in output.splitlines()]
    assert len(lines) == NODE_CLIENT_MESSAGES
    assert len({line["message_id"] for line in lines}) == NODE_CLIENT_MESSAGES
    query = query_stub(nodes, nodes.start("query", store, *SIZE_ARGS))
    stored = find_all(query, lines)
    for line, message in zip(lines, stored):
        # The Node.js client sends the queue it picked: its receipt names the record.
        assert (message.queue_id, message.queue_offset) == (line["queue_id"], line["offset"]), line
    # The Node.js client 1.0.x keeps only the route's queues whose queue id equals the
    # master broker id (0), so it writes to queue 0 of any server, Apache's proxy included.
    assert {m.queue_id for m in stored} == {0}


def test_nodejs_client_of_our_own_contracts_sends_and_looks_up(nodes: Nodes, tmp_path: Path) -> None:
    store = tmp_path / "store"
    writer = nodes.start("writer", store, *SIZE_ARGS)
    query_node = nodes.start("query", store, *SIZE_ARGS)
    started_ms = int(time.time() * 1000)
    out = json.loads(run_node(tmp_path, "own_contracts.js", str(ROOT / "protos"), writer.endpoint, query_node.endpoint, "Own"))
    finished_ms = int(time.time() * 1000)
    acks = out["acks"]
    assert [(a["queue_id"], a["queue_offset"]) for a in acks] == [(0, n) for n in range(5)]

    def expected(n: int) -> dict[str, Any]:
        return {
            "topic": "Own", "queue_id": 0, "queue_offset": n, "body": f"own contract {n}", "keys": [f"own-{n}", "own-all"],
            "tags": f"T{n}", "uniq_key": acks[n]["uniq_key"], "offset_msg_id": acks[n]["offset_msg_id"],
        }  # fmt: skip

    assert out["by_key"] == [expected(n) for n in (4, 3, 2, 1, 0)]  # newest first
    assert out["by_uniq_key"] == [expected(2)]
    assert out["by_msg_id"] == expected(3)
    assert out["by_queue_offset"] == expected(4)
    assert out["pull"] == {"messages": [expected(1), expected(2)], "next_offset": 3, "min_offset": 0, "max_offset": 5}
    assert out["queue_bounds"] == {"min_offset": 0, "max_offset": 5}
    assert out["search_offset"] == {"offset": 0, "found": True}
    assert out["stream_by_time"] == [expected(n) for n in range(5)]
    [topic] = out["list_topics"]
    queue = dict(topic["queues"][0])
    # The newest record's store time (QueueInfo.newest_store_timestamp_ms): stored during the run.
    assert started_ms <= int(queue.pop("newest_store_timestamp_ms")) <= finished_ms
    # broker_name is filled only by a proxy in front of several groups (a node's own queues
    # are its group's); the client's loader shows the empty default.
    assert topic["name"] == "Own" and queue == {"queue_id": 0, "min_offset": 0, "max_offset": 5, "broker_name": ""}
    assert out["stats"] == {"messages": 5, "follows_writer": True}
    assert out["ping"] == {}
    # Both nodes answer reflection v1, which current grpcurl asks first.
    for node, service in ((writer, "rmqstore.v1.WriterService"), (query_node, "rmqstore.v1.QueryService")):
        assert service in reflection_v1_services(node.endpoint)
    assert "apache.rocketmq.v2.MessagingService" in reflection_v1_services(writer.endpoint)


def reflection_v1_services(endpoint: str) -> set[str]:
    from grpc_reflection.v1alpha import reflection_pb2

    with grpc.insecure_channel(endpoint) as channel:
        info = channel.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        answers = list(info(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=RPC_TIMEOUT_S))
    return {s.name for s in answers[0].list_services_response.service}


def _code_blocks(document: Path, language: str) -> list[str]:
    import re

    return re.findall(rf"```{language}\n(.*?)```", document.read_text(encoding="utf-8"), re.DOTALL)


@pytest.mark.parametrize("document", ["README.md", "docs/rocketmq5.md"])
def test_the_documented_client_examples_work_against_writer_serve(nodes: Nodes, tmp_path: Path, document: str) -> None:
    """The Python and Node.js examples, as written, against ``rmqstore writer serve``
    (the documented port swapped for the test's), and the message found by its key."""
    store = tmp_path / "store"
    writer = nodes.start("writer", store, *SIZE_ARGS)
    # As the documents say to, before a client starts: updateTopic (--endpoint is all
    # that changes).
    [update] = [line for block in _code_blocks(ROOT / document, "bash") for line in block.splitlines() if "updateTopic" in line]
    argv = update.split()[1:]
    argv[argv.index("--endpoint") + 1] = writer.endpoint
    made = subprocess.run([sys.executable, "-m", "rmqstore.cli.main", *argv], capture_output=True, text=True, timeout=60, check=False)
    assert made.returncode == 0, made.stderr
    [python_example] = [b for b in _code_blocks(ROOT / document, "python") if "rocketmq" in b and "Producer(" in b]
    consumer_examples = [b for b in _code_blocks(ROOT / document, "python") if "rocketmq" in b and "SimpleConsumer(" in b]
    [node_example] = [b for b in _code_blocks(ROOT / document, "js") if "rocketmq-client-nodejs" in b]
    home = tmp_path / "home"
    home.mkdir()
    python_run = subprocess.run(
        [rmq5_python(), "-c", python_example.replace("127.0.0.1:8081", writer.endpoint)],
        capture_output=True, timeout=120, env=client_env(home), check=False,
    )  # fmt: skip
    assert python_run.returncode == 0, python_run.stderr.decode()[-2000:]
    python_id, python_offset = python_run.stdout.decode().split()
    script = NODE_DIR / f"example-{tmp_path.name}.js"  # beside node_modules, so require finds the client
    script.write_text(node_example.replace("127.0.0.1:8081", writer.endpoint))
    try:
        node_run = subprocess.run(
            [*node_command(), str(script)], capture_output=True, timeout=120, env=client_env(home), cwd=NODE_DIR, check=False
        )
    finally:
        script.unlink()
    assert node_run.returncode == 0, node_run.stderr.decode()[-2000:]
    node_id = node_run.stdout.decode().split()[0]
    query = query_stub(nodes, nodes.start("query", store, *SIZE_ARGS))
    found = query.QueryByKey(query_pb2.QueryByKeyRequest(topic="Orders", key="order-1", page_size=10), timeout=RPC_TIMEOUT_S)
    assert sorted(m.uniq_key for m in found.messages) == sorted([python_id, node_id])
    assert {m.body for m in found.messages} == {b"order 1 paid"} and {m.tags for m in found.messages} == {"paid"}
    assert int(python_offset) in [m.queue_offset for m in found.messages]
    # The consumer example (docs/rocketmq5.md has one) receives and acknowledges both.
    assert consumer_examples or document != "docs/rocketmq5.md"
    for consumer_example in consumer_examples:
        consumer_run = subprocess.run(
            [rmq5_python(), "-c", consumer_example.replace("127.0.0.1:8081", writer.endpoint)],
            capture_output=True, timeout=120, env=client_env(home), check=False,
        )  # fmt: skip
        assert consumer_run.returncode == 0, consumer_run.stderr.decode()[-2000:]
        assert consumer_run.stdout.decode().splitlines() == ["b'order 1 paid' 1"] * 2


def test_python_client_sends_over_tls_when_the_writer_serves_it(nodes: Nodes, tmp_path: Path, pki: Pki) -> None:
    """The same port, TLS only: the official client with TLS on (trusting the test CA
    through gRPC's roots file variable) routes, gets its settings and sends."""
    writer = nodes.start("writer", tmp_path / "store", *SIZE_ARGS, "--tls-cert", str(pki.server_cert),
                         "--tls-key", str(pki.server_key))  # fmt: skip
    assert writer.serving["tls"] is True
    make_topics(writer.endpoint, {"Secure": "NORMAL"}, ca=str(pki.ca))
    home = tmp_path / "client-home"
    home.mkdir()
    env = client_env(home)
    env["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = str(pki.ca)
    script = (
        "import sys\n"
        "from rocketmq import ClientConfiguration, Credentials, Message, Producer\n"
        "p = Producer(ClientConfiguration(sys.argv[1], Credentials(), request_timeout=5), ('Secure',), tls_enable=True)\n"
        "p.startup()\n"
        "m = Message()\n"
        "m.topic = 'Secure'\n"
        "m.body = b'over tls'\n"
        "print(p.send(m).message_id)\n"
        "p.shutdown()\n"
    )
    done = subprocess.run([rmq5_python(), "-c", script, writer.endpoint], capture_output=True, timeout=120, env=env, check=False)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    message_id = done.stdout.decode().strip()
    writer.stop()
    from rmqstore.common.files.commitlog import CommitLog

    log = CommitLog(str(tmp_path / "store" / "commitlog"), 65536)
    try:
        assert [(r.topic, r.body, r.properties["UNIQ_KEY"]) for r in log.records()] == [("Secure", b"over tls", message_id)]
    finally:
        log.close()


@pytest.mark.parametrize(
    ("options", "line"),
    [
        (["--advertise", "nope"], "rmqstore: error: writer serve: argument --advertise: 'nope' is not HOST:PORT: no port (see rmqstore writer serve --help)"),
        (["--advertise", "writer:70000"], "rmqstore: error: writer serve: argument --advertise: 'writer:70000' is not HOST:PORT: the port 70000 is outside [1, 65535] (see rmqstore writer serve --help)"),
        (["--broker-name", ""], "rmqstore: error: --broker-name '': expected a non-empty name without spaces"),
    ],
)
def test_bad_route_options_stop_the_writer_before_it_touches_the_store(tmp_path: Path, options: list[str], line: str) -> None:
    store = tmp_path / "store"
    done = subprocess.run(
        [sys.executable, "-m", "rmqstore.cli.main", "writer", "serve", "--store", str(store), "--port", "0", *options],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (done.returncode, done.stdout, done.stderr) == (2, "", line + "\n")
    assert not store.exists()


def test_a_writer_with_a_connected_client_stops_promptly(nodes: Nodes, tmp_path: Path) -> None:
    """The client holds its Telemetry stream open for its lifetime; SIGTERM ends it at once
    instead of waiting out the 10 s shutdown grace."""
    import time

    writer = nodes.start("writer", tmp_path / "store", *SIZE_ARGS)
    home = tmp_path / "client-home"
    home.mkdir()
    script = (
        "import sys, time\n"
        "from rocketmq import ClientConfiguration, Credentials, Producer\n"
        "p = Producer(ClientConfiguration(sys.argv[1], Credentials()), ('Held',))\n"
        "p.startup()\n"
        "print('started', flush=True)\n"
        "time.sleep(60)\n"
    )
    client = subprocess.Popen(
        [rmq5_python(), "-c", script, writer.endpoint], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=client_env(home)
    )
    try:
        assert client.stdout is not None and client.stdout.readline() == b"started\n"
        started = time.monotonic()
        writer.stop()
        assert time.monotonic() - started < 5.0
    finally:
        client.kill()
        client.wait(timeout=30)
        if client.stdout is not None:
            client.stdout.close()


def test_nodejs_producer_on_an_unknown_topic_fails_with_apaches_not_found(nodes: Nodes, tmp_path: Path) -> None:
    """The Node.js client raises the route's NotFound as its own NotFoundException, code
    40402, with Apache's proxy's words (tests/node/acl_producer.js; a writer without
    --acl takes any credentials)."""
    writer = nodes.start("writer", tmp_path / "store", *SIZE_ARGS)
    output = run_node(tmp_path, "acl_producer.js", writer.endpoint, "any", "any-secret", "Missing")
    assert json.loads(output.splitlines()[-1]) == {
        "topic": "Missing", "error": "NotFoundException", "code": 40402,
        "message": "[request-id=undefined, response-code=40402] CODE: 17  DESC: No topic route info in name server for "
        "the topic: Missing\nFor more information, please visit the url, https://rocketmq.apache.org/docs/bestPractice/06FAQ",
    }  # fmt: skip
