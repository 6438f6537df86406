"""rmqstore.client: which calls gRPC retries when a node answers UNAVAILABLE, that the
client loads none of OpenTelemetry's SDK or exporters while tracing is off, and that a
batch sent as columns (the client's, the pipeline loader's) is stored byte for byte as
the same messages sent as ``messages``."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.inprocess import WriterNode

from rmqstore.client import RETRY_ATTEMPTS_MAX, QueryClient, WriterClient, connect
from rmqstore.client import tracing as client_tracing
from rmqstore.client.columns import batch_request
from rmqstore.common.codec import sysflag
from rmqstore.common.codec.record import OFFSET_BORN_HOST
from rmqstore.pipeline import load
from rmqstore.v1 import messages_pb2, query_pb2, writer_pb2


class Flaky:
    """A node answering UNAVAILABLE to the first ``failures`` calls of each method."""

    def __init__(self, failures: int):
        self.failures = failures
        self.calls: dict[str, int] = {}
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers((self,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def service(self, details: Any) -> Any:
        method = details.method
        responses = {
            "/rmqstore.v1.QueryService/Ping": query_pb2.PingResponse,
            "/rmqstore.v1.WriterService/SendBatch": writer_pb2.SendBatchResponse,
        }
        if method not in responses:
            return None

        def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
            with self.lock:
                self.calls[method] = self.calls.get(method, 0) + 1
                failing = self.calls[method] <= self.failures
            if failing:
                context.abort(grpc.StatusCode.UNAVAILABLE, "starting")
            return responses[method]().SerializeToString()

        return grpc.unary_unary_rpc_method_handler(handle)


@pytest.fixture
def flaky() -> Iterator[Flaky]:
    node = Flaky(failures=RETRY_ATTEMPTS_MAX - 1)
    yield node
    node.server.stop(None)


def test_queries_are_retried_while_unavailable(flaky: Flaky) -> None:
    client = QueryClient(connect(f"127.0.0.1:{flaky.port}"), timeout_s=30)
    try:
        assert client.call("Ping", query_pb2.PingRequest()) == query_pb2.PingResponse()
    finally:
        client.close()
    assert flaky.calls == {"/rmqstore.v1.QueryService/Ping": RETRY_ATTEMPTS_MAX}


def test_sends_are_not_retried(flaky: Flaky) -> None:
    client = WriterClient(connect(f"127.0.0.1:{flaky.port}"), timeout_s=30)
    try:
        with pytest.raises(grpc.RpcError) as refused:
            client.send_batch([messages_pb2.Message(topic="T", body=b"x")])
    finally:
        client.close()
    assert (refused.value.code(), refused.value.details()) == (grpc.StatusCode.UNAVAILABLE, "starting")
    assert flaky.calls == {"/rmqstore.v1.WriterService/SendBatch": 1}


def test_the_client_loads_no_sdk_while_tracing_is_off() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    code = (
        "import sys\n"
        "from rmqstore.cli.main import build_parser\n"
        "from rmqstore.client import connect, tracing\n"
        "connect('127.0.0.1:1').close()\n"
        "print(tracing.enabled(), sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk', 'opentelemetry.exporter'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout == "False []\n"


def test_a_send_loads_the_sdk_only_when_tracing_is_on() -> None:
    """``rmqstore send`` (to a port nothing listens on: the call fails, the command ends)
    loads none of OpenTelemetry's SDK without a tracing variable, and loads it when an
    OTLP endpoint asks for traces."""
    code = (
        "import sys\n"
        "from rmqstore.cli.main import main\n"
        "code = main(['send', '--endpoint', '127.0.0.1:1', '-t', 'T', '--body', 'x', '--timeout', '5'])\n"
        "print(code != 0, 'opentelemetry.sdk.trace' in sys.modules)\n"
    )
    quiet = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    off = subprocess.run([sys.executable, "-c", code], env=quiet, capture_output=True, text=True, timeout=60, check=True)
    assert off.stdout == "True False\n", off.stderr
    traced = {**quiet, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_EXPORTER_OTLP_TIMEOUT": "1"}
    on = subprocess.run([sys.executable, "-c", code], env=traced, capture_output=True, text=True, timeout=60, check=True)
    assert on.stdout == "True True\n", on.stderr


def varied_messages() -> list[messages_pb2.Message]:
    """Messages that set every field in several ways (no field left to the writer's
    clock, peer address or id generator, so two stores can hold the same bytes)."""
    messages = []
    for i in range(40):
        message = messages_pb2.Message(
            topic=("Orders", "Audit_log", "%RETRY%g1")[i % 3],
            body=bytes(range(i % 7 * 37 % 256)) * (i % 4) + f"body {i}".encode(),
            keys=[f"k{i}-{n}" for n in range(i % 4)],
            tags=("", "TagA", "tag|b")[i % 3],
            properties={f"p{n}": f"v{i}.{n}" for n in range(i % 5)},
            uniq_key=f"{0xA0000000 + i:032X}",
            flag=i % 3 * 7,
            born_timestamp_ms=1_700_000_000_000 + i * 1_001,
            born_host=("10.1.2.3:4567", "[2001:db8::7]:9876", "127.0.0.1:1")[i % 3],
        )
        if i % 4:
            message.queue_id = i % 4
        messages.append(message)
    return messages


def stored_bytes(node: WriterNode) -> list[bytes]:
    """Each record's bytes in the commit log, its store timestamp (the writer's clock)
    zeroed."""
    records = node.records()
    [first] = sorted((node.store / "commitlog").iterdir())
    data = first.read_bytes()
    stored = []
    for record in records:
        raw = bytearray(data[record.commitlog_offset : record.commitlog_offset + record.size])
        at = OFFSET_BORN_HOST + (20 if record.sys_flag & sysflag.BORNHOST_V6 else 8)
        raw[at : at + 8] = bytes(8)
        stored.append(bytes(raw))
    return stored


@pytest.fixture
def two_writers(tmp_path: Path) -> Iterator[tuple[WriterNode, WriterNode]]:
    """A writer that takes ``messages`` as before and one the tested sender writes to."""
    before, after = WriterNode(tmp_path / "before"), WriterNode(tmp_path / "after")
    try:
        yield before, after
    finally:
        before.close()
        after.close()


def acks(response: writer_pb2.SendBatchResponse) -> list[writer_pb2.SendResult]:
    results = list(response.results)
    for result in results:
        result.store_timestamp_ms = 0
    return results


def test_a_client_batch_is_stored_as_the_same_messages_sent_as_messages(
    two_writers: tuple[WriterNode, WriterNode], monkeypatch: pytest.MonkeyPatch
) -> None:
    before, after = two_writers
    # Untraced, whatever another module of this process installed: a traced client adds
    # its span's traceparent to every message, which the stub's requests do not carry.
    monkeypatch.setattr(client_tracing, "_enabled", False)
    messages = varied_messages()
    assert batch_request(messages).HasField("columns") and not batch_request(messages).messages
    assert before.stub is not None
    expected = before.stub.SendBatch(writer_pb2.SendBatchRequest(messages=messages))
    with WriterClient(connect(after.endpoint), after.endpoint, timeout_s=30) as client:
        response = client.send_batch(messages)
        single = client.send(messages[5])
    assert acks(response) == acks(expected)
    again = before.stub.Send(writer_pb2.SendRequest(message=messages[5]))
    assert acks(writer_pb2.SendBatchResponse(results=[single])) == acks(writer_pb2.SendBatchResponse(results=[again.result]))
    stored = stored_bytes(after)
    assert len(stored) == len(messages) + 1
    assert stored == stored_bytes(before)


def test_the_loader_stores_its_rows_as_the_same_messages_sent_as_messages(two_writers: tuple[WriterNode, WriterNode]) -> None:
    before, after = two_writers
    rows = [
        {
            "topic": message.topic, "body": message.body, "keys": " ".join(message.keys) or None,
            "tags": message.tags or None, "properties": sorted(message.properties.items()),
            "uniqKey": message.uniq_key, "flag": message.flag, "bornTimestamp": message.born_timestamp_ms,
            "bornHost": message.born_host, "queueId": message.queue_id if message.HasField("queue_id") else None,
        }
        for message in varied_messages()
    ]  # fmt: skip
    assert before.stub is not None
    before.stub.SendBatch(writer_pb2.SendBatchRequest(messages=[load.to_message(row, True) for row in rows]))
    assert load.send_rows(iter(rows), after.endpoint, keep_queue_ids=True, checker=None, batch_messages=16) == (len(rows), 0)
    assert stored_bytes(after) == stored_bytes(before)


@pytest.mark.parametrize(
    "message",
    [
        messages_pb2.Message(topic="T", body=b"x", keys=["a b"]),
        messages_pb2.Message(topic="T", body=b"x", keys=[""]),
        messages_pb2.Message(topic="T", body=b"x", queue_id=-1),
        messages_pb2.Message(topic="T", body=b"x", queue_id=-2),
        messages_pb2.Message(topic="T", body=b"x", born_host="nowhere"),
    ],
    ids=["key-with-a-space", "empty-key", "queue-id-minus-1", "queue-id-minus-2", "bad-born-host"],
)
def test_a_client_batch_the_writer_refuses_is_refused_in_the_same_words(
    two_writers: tuple[WriterNode, WriterNode], message: messages_pb2.Message
) -> None:
    before, after = two_writers
    batch = [messages_pb2.Message(topic="T", body=b"fine", keys=["k"]), message]
    assert before.stub is not None
    with pytest.raises(grpc.RpcError) as expected:
        before.stub.SendBatch(writer_pb2.SendBatchRequest(messages=batch))
    with WriterClient(connect(after.endpoint), after.endpoint, timeout_s=30) as client, pytest.raises(grpc.RpcError) as refused:
        client.send_batch(batch)
    assert expected.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (refused.value.code(), refused.value.details()) == (expected.value.code(), expected.value.details())
    assert after.records() == []
