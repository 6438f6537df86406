"""Traces end to end, as an operator gets them: a real OTLP gRPC receiver in this process
(OpenTelemetry's collector services on 127.0.0.1, port 0), real writer and query processes
and ``rmqstore`` commands run as processes with only ``OTEL_*`` variables set.

* ``rmqstore send`` → the writer: one trace, CLI PRODUCER span → server span → append
  (with its dispatch as an event) and (SYNC) flush, with the messaging attributes; the
  append span links to the context the message carries in its ``traceparent`` property;
* ``rmqstore queryMsgByKey`` → a query node: CLI span → server span → lookup span with
  topic and result count;
* a message whose own ``traceparent`` property names another trace: kept as it is, and
  the append span links to that trace;
* the sampler the variables name (``OTEL_TRACES_SAMPLER``, ``_ARG``) decides in the
  command and in the writer;
* an idle writer under ASYNC exports no span in 10 s; its first periodic flush with bytes
  is a root span of its own with byte count and fsync time.

Every process listens on 127.0.0.1 and exports to the receiver there; every wait is
bounded; every process is killed in teardown.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2
from support.inprocess import WriterNode
from support.nodes import Nodes
from support.telemetry import PARENT_SPAN_ID, TRACE_ID, sdk_exporter
from support.wait import wait_until

SERVING_TIMEOUT_S = 30.0
CLI_TIMEOUT_S = 60.0
SPANS_WITHIN_S = 20.0
STOP_TIMEOUT_S = 30.0
IDLE_S = 10.0

SERVER = trace_pb2.Span.SPAN_KIND_SERVER
CLIENT = trace_pb2.Span.SPAN_KIND_CLIENT
PRODUCER = trace_pb2.Span.SPAN_KIND_PRODUCER
INTERNAL = trace_pb2.Span.SPAN_KIND_INTERNAL


@dataclass
class Span:
    service: str
    span: trace_pb2.Span

    @property
    def name(self) -> str:
        return self.span.name

    @property
    def trace_id(self) -> bytes:
        return self.span.trace_id

    @property
    def span_id(self) -> bytes:
        return self.span.span_id

    @property
    def parent_id(self) -> bytes:
        return self.span.parent_span_id

    @property
    def attributes(self) -> dict[str, Any]:
        return {a.key: _value(a.value) for a in self.span.attributes}


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


class Receiver(
    trace_service_pb2_grpc.TraceServiceServicer,
    metrics_service_pb2_grpc.MetricsServiceServicer,
    logs_service_pb2_grpc.LogsServiceServicer,
):
    """An OTLP/gRPC receiver keeping every span and log record it is sent."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[Span] = []
        self.logs: list[tuple[str, Any]] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(self, self.server)
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def Export(self, request: Any, context: Any) -> Any:
        if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
            with self.lock:
                for resource in request.resource_spans:
                    service = _service_name(resource.resource)
                    self.spans += [Span(service, s) for scope in resource.scope_spans for s in scope.spans]
            return trace_service_pb2.ExportTraceServiceResponse()
        if isinstance(request, logs_service_pb2.ExportLogsServiceRequest):
            with self.lock:
                for resource in request.resource_logs:
                    service = _service_name(resource.resource)
                    self.logs += [(service, r) for scope in resource.scope_logs for r in scope.log_records]
            return logs_service_pb2.ExportLogsServiceResponse()
        return metrics_service_pb2.ExportMetricsServiceResponse()

    def snapshot(self) -> list[Span]:
        with self.lock:
            return list(self.spans)

    def wait_for(self, names: set[str], within_s: float = SPANS_WITHIN_S) -> list[Span]:
        def exported() -> list[Span] | None:
            spans = self.snapshot()
            return spans if names <= {s.name for s in spans} else None

        return wait_until(exported, within_s, f"spans {sorted(names)} to be exported", interval_s=0.1)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env.update(
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{self.port}",
            OTEL_EXPORTER_OTLP_INSECURE="true",
            # Export within a fifth of a second: the test waits for the spans.
            OTEL_BSP_SCHEDULE_DELAY="200",
            OTEL_METRIC_EXPORT_INTERVAL="60000",
        )
        return env


def _service_name(resource: Any) -> str:
    return next((a.value.string_value for a in resource.attributes if a.key == "service.name"), "")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    started = Receiver()
    yield started
    started.server.stop(None)


def rmqstore(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "rmqstore.cli.main", *args], env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr
    return done


def one(spans: list[Span], name: str, **where: Any) -> Span:
    found = [s for s in spans if s.name == name and all(getattr(s, k) == v for k, v in where.items())]
    assert len(found) == 1, (name, where, [(s.name, s.service) for s in spans])
    return found[0]


def names(span: Span, traceparent: str) -> bool:
    """Whether a sampled W3C ``traceparent`` value names ``span`` (the flags may carry the
    random-trace-id bit besides the sampled one)."""
    version, trace_hex, span_hex, flags = traceparent.split("-")
    return (version, trace_hex, span_hex) == ("00", span.trace_id.hex(), span.span_id.hex()) and flags in ("01", "03")


def test_send_and_lookup_are_one_trace_each(tmp_path: Path, receiver: Receiver, nodes: Nodes) -> None:
    env = receiver.env()
    store = tmp_path / "store"
    writer = nodes.start("writer", store, "--flush", "sync", env=env)
    query = nodes.start("query", store, env=env)

    sent = rmqstore(env, "send", "--endpoint", writer.endpoint, "-t", "Traced", "-k", "order-1 order-2", "--tags", "TagA", "--body", "hello")
    [ack] = [json.loads(line) for line in sent.stdout.splitlines()]
    spans = receiver.wait_for({"send Traced", "/rmqstore.v1.WriterService/SendStream", "rmqstore.append", "rmqstore.flush"})
    client = one(spans, "send Traced")
    assert client.service == "rmqstore-client" and client.span.kind == PRODUCER
    assert client.parent_id == b""  # the trace starts at the command
    assert client.attributes == {
        "messaging.system": "rocketmq",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": "Traced",
        "messaging.message.id": ack["uniqKey"],
        "messaging.rocketmq.message.keys": ["order-1", "order-2"],
        "messaging.rocketmq.message.tag": "TagA",
        "rpc.system": "grpc",
        "rpc.service": "rmqstore.v1.WriterService",
        "rpc.method": "SendStream",
        "rpc.grpc.status_code": 0,
        "server.address": "127.0.0.1",
        "server.port": writer.serving["port"],
    }
    server = one(spans, "/rmqstore.v1.WriterService/SendStream")
    assert server.service == "rmqstore-writer" and server.span.kind == SERVER
    assert (server.trace_id, server.parent_id) == (client.trace_id, client.span_id)
    for name in ("rmqstore.append", "rmqstore.flush"):
        child = one(spans, name, trace_id=client.trace_id)
        assert child.parent_id == server.span_id, name
    # The append span covers the dispatch too: an event marks where it begins, and the
    # span links to the producer of each message.
    assert not any(s.name == "rmqstore.dispatch" for s in spans)
    append = one(spans, "rmqstore.append")
    assert append.attributes == {"messaging.system": "rocketmq", "messaging.destination.name": "Traced", "messaging.message.id": ack["uniqKey"]}
    assert [(link.trace_id, link.span_id) for link in append.span.links] == [(client.trace_id, client.span_id)]
    [dispatched] = append.span.events
    assert dispatched.name == "rmqstore.dispatch"
    assert append.span.start_time_unix_nano <= dispatched.time_unix_nano <= append.span.end_time_unix_nano
    # The flush of this send's trace. The writer's periodic thorough flush may sync the
    # bytes first (a root span of its own, with the bytes): the send's flush then has 0.
    flush = one(spans, "rmqstore.flush", trace_id=client.trace_id).attributes
    assert ack["commitLogOffset"] == 0 and flush["rmqstore.flush.fsync_ms"] >= 0
    send_flush_bytes = flush["rmqstore.flush.bytes"]

    # The message keeps the sender's context as an ordinary property.
    looked = rmqstore(env, "queryMsgByKey", "--endpoint", query.endpoint, "-t", "Traced", "-k", "order-1", "--json")
    [found] = [json.loads(line) for line in looked.stdout.splitlines()]
    assert names(client, found["properties"]["traceparent"])
    spans = receiver.wait_for({"rmqstore.v1.QueryService/QueryByKey", "/rmqstore.v1.QueryService/QueryByKey", "rmqstore.lookup.key"})
    lookup_client = one(spans, "rmqstore.v1.QueryService/QueryByKey")
    assert lookup_client.service == "rmqstore-client" and lookup_client.span.kind == CLIENT and lookup_client.parent_id == b""
    assert lookup_client.attributes == {
        "rpc.system": "grpc",
        "rpc.service": "rmqstore.v1.QueryService",
        "rpc.method": "QueryByKey",
        "rpc.grpc.status_code": 0,
        "server.address": "127.0.0.1",
        "server.port": query.serving["port"],
        "messaging.system": "rocketmq",
        "messaging.destination.name": "Traced",
        "rmqstore.results": 1,
    }
    lookup_server = one(spans, "/rmqstore.v1.QueryService/QueryByKey")
    assert lookup_server.service == "rmqstore-query"
    assert (lookup_server.trace_id, lookup_server.parent_id) == (lookup_client.trace_id, lookup_client.span_id)
    lookup = one(spans, "rmqstore.lookup.key")
    assert (lookup.trace_id, lookup.parent_id) == (lookup_client.trace_id, lookup_server.span_id)
    assert lookup.attributes["messaging.destination.name"] == "Traced" and lookup.attributes["rmqstore.results"] == 1

    # The flushes synced exactly the one record: the send's, or a periodic one before it.
    writer.stop()
    [record] = [json.loads(line) for line in rmqstore(env, "dump", "commitlog", str(store)).stdout.splitlines()]
    assert names(client, record["properties"]["traceparent"])
    assert send_flush_bytes in (0, record["size"])

    def flushed_bytes() -> int | None:
        flushed = sum(s.attributes["rmqstore.flush.bytes"] for s in receiver.snapshot() if s.name == "rmqstore.flush")
        return flushed if flushed == record["size"] else None

    wait_until(flushed_bytes, SPANS_WITHIN_S, f"flush spans of {record['size']} bytes in all", interval_s=0.1)


USER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
USER_SPAN = "00f067aa0ba902b7"


def test_send_file_has_a_span_per_batch_and_keeps_a_messages_own_traceparent(
    tmp_path: Path, receiver: Receiver, nodes: Nodes
) -> None:
    env = receiver.env()
    store = tmp_path / "store"
    writer = nodes.start("writer", store, env=env)
    lines = [
        {"topic": "Filed", "body": "one", "properties": {"traceparent": f"00-{USER_TRACE}-{USER_SPAN}-01", "origin": "upstream"}},
        {"topic": "Filed", "body": "two"},
        {"topic": "Filed", "body": "three", "properties": {"origin": "here"}},
    ]
    messages = tmp_path / "messages.jsonl"
    messages.write_text("".join(json.dumps(line) + "\n" for line in lines))
    sent = rmqstore(env, "send", "--endpoint", writer.endpoint, "--file", str(messages), "--batch-size", "2")
    assert len(sent.stdout.splitlines()) == 3
    spans = receiver.wait_for({"send Filed", "/rmqstore.v1.WriterService/SendStream", "rmqstore.append"})
    file_span = one(spans, "send Filed", parent_id=b"")
    assert file_span.span.kind == PRODUCER and file_span.attributes["messaging.batch.message_count"] == 3
    batches = sorted((s for s in spans if s.name == "send Filed" and s.parent_id == file_span.span_id), key=lambda s: s.span.start_time_unix_nano)
    assert [(b.span.kind, b.attributes.get("messaging.batch.message_count")) for b in batches] == [(CLIENT, 2), (CLIENT, None)]
    server = one(spans, "/rmqstore.v1.WriterService/SendStream")
    assert (server.trace_id, server.parent_id) == (file_span.trace_id, file_span.span_id)
    # Each append links to the contexts its messages carry: the producer's own for the
    # first message, the file's span for the others.
    receiver.wait_for({"rmqstore.append"})
    linked = {(link.trace_id.hex(), link.span_id.hex()) for s in receiver.snapshot() if s.name == "rmqstore.append" for link in s.span.links}
    assert linked == {(USER_TRACE, USER_SPAN), (file_span.trace_id.hex(), file_span.span_id.hex())}
    writer.stop()
    records = [json.loads(line) for line in rmqstore(env, "dump", "commitlog", str(store)).stdout.splitlines()]
    assert records[0]["properties"]["traceparent"] == f"00-{USER_TRACE}-{USER_SPAN}-01"
    assert records[0]["properties"]["origin"] == "upstream" and records[2]["properties"]["origin"] == "here"
    assert names(file_span, records[1]["properties"]["traceparent"]) and names(file_span, records[2]["properties"]["traceparent"])


def test_send_file_exports_every_batch_span_once_the_stream_is_over(tmp_path: Path, receiver: Receiver, nodes: Nodes) -> None:
    """2,500 batches of one message: more batch spans than the span processor's queue
    holds (2,048). They are made when the stream is over and handed on 512 at a time,
    each handful exported before the next: every one arrives, each with its own times,
    in the order its request was sent, under the file's span."""
    env = receiver.env()
    writer = nodes.start("writer", tmp_path / "store", env=env)
    count = 2_500
    messages = tmp_path / "messages.jsonl"
    messages.write_text("".join(json.dumps({"topic": "Many", "body": f"m{i}"}) + "\n" for i in range(count)))
    began_ns = time.time_ns()
    sent = rmqstore(env, "send", "--endpoint", writer.endpoint, "--file", str(messages), "--batch-size", "1", "--acks", "summary")
    ended_ns = time.time_ns()
    assert json.loads(sent.stdout)["acked"] == count
    file_span = one(receiver.wait_for({"send Many"}), "send Many", parent_id=b"")
    def batch_spans() -> list[Span] | None:
        found = [s for s in receiver.snapshot() if s.name == "send Many" and s.parent_id == file_span.span_id]
        return found if len(found) >= count else None

    batches = wait_until(batch_spans, SPANS_WITHIN_S, f"{count} batch spans", interval_s=0.1)
    assert len(batches) == count
    assert {s.service for s in batches} == {"rmqstore-client"} and {s.trace_id for s in batches} == {file_span.trace_id}
    assert {b.span.kind for b in batches} == {CLIENT}
    assert all(
        b.attributes == {"messaging.system": "rocketmq", "messaging.operation.type": "send", "messaging.operation.name": "send", "messaging.destination.name": "Many"}
        for b in batches
    )
    assert all(began_ns <= b.span.start_time_unix_nano <= b.span.end_time_unix_nano <= ended_ns for b in batches)
    assert all(b.span.start_time_unix_nano >= file_span.span.start_time_unix_nano for b in batches)
    assert len({b.span_id for b in batches}) == count
    # The stream answers in order: the i-th request's ack ends the i-th span.
    by_start = sorted(batches, key=lambda b: b.span.start_time_unix_nano)
    assert [b.span.end_time_unix_nano for b in by_start] == sorted(b.span.end_time_unix_nano for b in by_start)


def test_send_file_drops_the_batch_spans_a_collector_is_not_taking(tmp_path: Path, receiver: Receiver, nodes: Nodes) -> None:
    """An unreachable collector: the first handful of batch spans waits out one export
    (the 2 s bound), the rest are dropped, and the command still exits within a few
    seconds, every message acknowledged."""
    writer = nodes.start("writer", tmp_path / "store", env=quiet(receiver.env()))
    count = 1_600
    messages = tmp_path / "messages.jsonl"
    messages.write_text("".join(json.dumps({"topic": "Lonely", "body": f"m{i}"}) + "\n" for i in range(count)))
    args = ("send", "--endpoint", writer.endpoint, "--file", str(messages), "--batch-size", "1", "--acks", "summary")
    _, reachable_s = timed(traced_to(receiver, f"127.0.0.1:{receiver.port}"), *args)
    sent, elapsed_s = timed(traced_to(receiver, "127.0.0.1:9"), *args)
    assert json.loads(sent.stdout)["acked"] == count
    assert "Failed to export traces to 127.0.0.1:9" in sent.stderr
    # Beyond the same command exporting to a collector that is there: one export waited
    # out and the exit's export, about 4 s. Waiting out each of the four handfuls would
    # add more than 8.
    assert elapsed_s - reachable_s < 7.0, (elapsed_s, reachable_s)


def quiet(env: dict[str, str]) -> dict[str, str]:
    """The environment without tracing: a command whose own spans are not wanted."""
    return {k: v for k, v in env.items() if not k.startswith("OTEL_")} | {"OTEL_SDK_DISABLED": "true"}


def traced_to(receiver: Receiver, collector: str) -> dict[str, str]:
    """A command's environment tracing to ``collector`` with the SDK's default export
    settings (``quiet``'s, tracing on)."""
    env = {**quiet(receiver.env()), "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{collector}", "OTEL_EXPORTER_OTLP_INSECURE": "true"}
    del env["OTEL_SDK_DISABLED"]
    return env


def timed(env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """The command's result and its wall time, start-up included: a bound on what an
    unreachable collector adds is taken against the same command's time in the same
    conditions, so that a loaded machine's slower start-up is in both."""
    began = time.monotonic()
    done = rmqstore(env, *args)
    return done, time.monotonic() - began


def test_a_message_with_a_traceparent_links_the_append_without_a_traced_client(
    tmp_path: Path, receiver: Receiver, nodes: Nodes
) -> None:
    env = receiver.env()
    writer = nodes.start("writer", tmp_path / "store", env=env)
    messages = tmp_path / "messages.jsonl"
    messages.write_text(json.dumps({"topic": "Linked", "body": "x", "properties": {"traceparent": f"00-{USER_TRACE}-{USER_SPAN}-01"}}) + "\n")
    rmqstore(quiet(env), "send", "--endpoint", writer.endpoint, "--file", str(messages))
    spans = receiver.wait_for({"rmqstore.append"})
    append = one(spans, "rmqstore.append")
    assert [(link.trace_id.hex(), link.span_id.hex()) for link in append.span.links] == [(USER_TRACE, USER_SPAN)]
    assert append.trace_id.hex() != USER_TRACE  # linked, not continued: the call had no context
    assert not any(s.service == "rmqstore-client" for s in spans)


def test_a_consumers_receive_links_to_the_producers_context(tmp_path: Path, receiver: Receiver, nodes: Nodes) -> None:
    """A RocketMQ 5 receive hands the stored ``traceparent`` back as the message's
    ``trace_context`` (where the clients read it; not as a user property), and the writer's
    receive span links to it, so the trace runs producer → writer → consumer."""
    from rmqstore.rocketmq_v2 import definition_pb2 as v2
    from rmqstore.rocketmq_v2 import service_pb2 as v2s
    from rmqstore.rocketmq_v2 import service_pb2_grpc

    env = receiver.env()
    writer = nodes.start("writer", tmp_path / "store", env=env)
    producer = f"00-{USER_TRACE}-{USER_SPAN}-01"
    messages = tmp_path / "messages.jsonl"
    lines = [
        {"topic": "Traced", "body": "linked", "queueId": 0, "properties": {"traceparent": producer, "origin": "up"}},
        {"topic": "Traced", "body": "plain", "queueId": 0},
    ]
    messages.write_text("".join(json.dumps(line) + "\n" for line in lines))
    rmqstore(quiet(env), "send", "--endpoint", writer.endpoint, "--file", str(messages))
    request = v2s.ReceiveMessageRequest(
        group=v2.Resource(name="tracers"),
        message_queue=v2.MessageQueue(topic=v2.Resource(name="Traced"), id=0),
        filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"),
        batch_size=32,
        invisible_duration=duration_pb2.Duration(seconds=30),
    )
    with grpc.insecure_channel(writer.endpoint) as channel:
        answers = list(service_pb2_grpc.MessagingServiceStub(channel).ReceiveMessage(request, timeout=CLI_TIMEOUT_S))
    got = {a.message.body: a.message for a in answers if a.HasField("message")}
    assert sorted(got) == [b"linked", b"plain"]
    assert got[b"linked"].system_properties.trace_context == producer
    assert dict(got[b"linked"].user_properties) == {"origin": "up"}
    assert got[b"plain"].system_properties.trace_context == "" and dict(got[b"plain"].user_properties) == {}
    spans = receiver.wait_for({"rmqstore.receive", "/apache.rocketmq.v2.MessagingService/ReceiveMessage"})
    received = one(spans, "rmqstore.receive")
    assert [(link.trace_id.hex(), link.span_id.hex()) for link in received.span.links] == [(USER_TRACE, USER_SPAN)]
    assert received.span.kind == INTERNAL and received.service == "rmqstore-writer"
    assert received.attributes == {
        "messaging.system": "rocketmq",
        "messaging.operation.type": "receive",
        "messaging.destination.name": "Traced",
        "messaging.consumer.group.name": "tracers",
        "messaging.batch.message_count": 2,
    }
    server = one(spans, "/apache.rocketmq.v2.MessagingService/ReceiveMessage")
    assert (received.trace_id, received.parent_id) == (server.trace_id, server.span_id)


@pytest.mark.slow
def test_an_idle_async_writer_exports_no_span(tmp_path: Path, receiver: Receiver, nodes: Nodes) -> None:
    env = receiver.env()
    store = tmp_path / "store"
    writer = nodes.start("writer", store, "--flush", "async", env=env)
    time.sleep(IDLE_S)  # the behaviour under test: some 20 periodic flushes, none with a byte to sync
    assert receiver.snapshot() == []
    # The receiver does get the spans of a write: the first periodic flush with bytes is a
    # short root span of its own.
    rmqstore(quiet(env), "send", "--endpoint", writer.endpoint, "-t", "Idle", "--body", "wake")
    spans = receiver.wait_for({"/rmqstore.v1.WriterService/SendStream", "rmqstore.append", "rmqstore.flush"})
    flush = one(spans, "rmqstore.flush")
    assert flush.parent_id == b"" and flush.trace_id != one(spans, "rmqstore.append").trace_id
    writer.stop()
    [record] = [json.loads(line) for line in rmqstore(quiet(env), "dump", "commitlog", str(store)).stdout.splitlines()]
    assert flush.attributes["rmqstore.flush.bytes"] == record["size"] and flush.attributes["rmqstore.flush.fsync_ms"] >= 0
    assert sorted(s.name for s in receiver.snapshot()) == sorted(
        ["/rmqstore.v1.WriterService/SendStream", "rmqstore.append", "rmqstore.flush"]
    )


def test_log_lines_carry_the_span_and_are_exported(receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    """The nodes' logging set-up, in this process: a JSON line per record, with the trace
    and span ids inside a span, and the same record at the OTLP receiver."""
    import io
    import logging

    from opentelemetry import trace

    from rmqstore.service.logs import configure_logging, unconfigure_logging

    for name, value in receiver.env().items():
        if name.startswith("OTEL_"):
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("OTEL_LOGS_EXPORTER", "otlp")
    sdk_exporter()
    stream = io.StringIO()
    handlers = configure_logging("rmqstore-writer", stream)
    assert len(handlers) == 2
    try:
        log = logging.getLogger("rmqstore.writer")
        with trace.get_tracer("test").start_as_current_span("request") as span:
            log.warning("flush of %d bytes failed", 42)
        log.info("outside any span")
        logging.getLogger("elsewhere").warning("not a node's logger")
        for handler in handlers:
            handler.flush()
    finally:
        unconfigure_logging()
    context = span.get_span_context()
    inside, outside = (json.loads(line) for line in stream.getvalue().splitlines())
    assert {k: v for k, v in inside.items() if k != "time"} == {
        "level": "WARNING",
        "logger": "rmqstore.writer",
        "message": "flush of 42 bytes failed",
        "service": "rmqstore-writer",
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
    }
    assert inside["time"].endswith("Z") and len(inside["time"]) == len("2026-01-01T00:00:00.000Z")
    assert "trace_id" not in outside and outside["message"] == "outside any span"
    [(service, record), (_, plain)] = receiver.logs
    assert service == "rmqstore-writer"
    assert (record.trace_id, record.span_id) == (context.trace_id.to_bytes(16, "big"), context.span_id.to_bytes(8, "big"))
    assert (record.severity_text, record.body.string_value) == ("WARNING", "flush of 42 bytes failed")
    assert plain.trace_id == b"" and plain.body.string_value == "outside any span"


def test_an_unknown_logs_exporter_is_refused() -> None:
    from rmqstore.common.errors import InvalidArgument
    from rmqstore.service.logs import logs_exporter_requested

    assert logs_exporter_requested({}) is None
    assert logs_exporter_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}) is None
    assert logs_exporter_requested({"OTEL_LOGS_EXPORTER": "otlp"}) == "otlp"
    assert logs_exporter_requested({"OTEL_LOGS_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}) is None
    with pytest.raises(InvalidArgument) as refused:
        logs_exporter_requested({"OTEL_LOGS_EXPORTER": "console"})
    assert str(refused.value) == "OTEL_LOGS_EXPORTER='console': rmqstore supports otlp or none"


def test_a_command_exits_soon_when_the_collector_is_unreachable(tmp_path: Path, receiver: Receiver, nodes: Nodes) -> None:
    """The command's spans are exported as it exits; a collector that is not there costs
    it at most the client's export bound (2 s), not the SDK's 10 s of retries."""
    writer = nodes.start("writer", tmp_path / "store", env=quiet(receiver.env()))
    args = ("send", "--endpoint", writer.endpoint, "-t", "Lonely", "--body", "x")
    _, reachable_s = timed(traced_to(receiver, f"127.0.0.1:{receiver.port}"), *args)
    sent, elapsed_s = timed(traced_to(receiver, "127.0.0.1:9"), *args)
    assert json.loads(sent.stdout)["topic"] == "Lonely"
    assert "Failed to export traces to 127.0.0.1:9" in sent.stderr
    # Beyond the same command exporting to a collector that is there: the 2 s bound; the
    # SDK's default retries added about 6.
    assert elapsed_s - reachable_s < 4.0, (elapsed_s, reachable_s)


def test_a_command_with_an_otlp_setting_the_exporter_refuses_sends_and_says_so_in_one_line(
    tmp_path: Path, receiver: Receiver, nodes: Nodes
) -> None:
    """A setting the command's OTLP exporter refuses (a compression it does not know)
    costs the spans, said in one line, not the send, and no traceback."""
    writer = nodes.start("writer", tmp_path / "store", env=quiet(receiver.env()))
    odd = {**receiver.env(), "OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}
    sent = rmqstore(odd, "send", "--endpoint", writer.endpoint, "-t", "Odd", "--body", "x")
    assert json.loads(sent.stdout)["topic"] == "Odd"
    lines = [line for line in sent.stderr.splitlines() if line.strip()]
    assert lines == [
        "spans are not exported: the OTLP exporter could not be set up: "
        'Invalid value "zstd" for compression envvar OTEL_EXPORTER_OTLP_COMPRESSION'
    ], sent.stderr
    assert not [s for s in receiver.snapshot() if s.service == "rmqstore-client"]


def test_a_refusal_the_operator_acts_on_is_logged_in_the_requests_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real writer refusing writes (its disk use is above a full ratio of 0.1 %): the
    RESOURCE_EXHAUSTED answer is logged as a JSON line carrying the caller's trace."""
    import io

    from rmqstore.service.logs import configure_logging, unconfigure_logging
    from rmqstore.v1 import messages_pb2, writer_pb2

    monkeypatch.delenv("OTEL_LOGS_EXPORTER", raising=False)
    sdk_exporter()
    stream = io.StringIO()
    configure_logging("rmqstore-writer", stream)
    node = WriterNode(tmp_path / "store", disk_full_ratio=0.001)
    try:
        with pytest.raises(grpc.RpcError) as refused:
            node.stub.Send(
                writer_pb2.SendRequest(message=messages_pb2.Message(topic="Full", body=b"x")),
                metadata=(("traceparent", f"00-{TRACE_ID + 9:032x}-{PARENT_SPAN_ID:016x}-01"),),
                timeout=30,
            )
    finally:
        node.close()
        unconfigure_logging()
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    [line] = [json.loads(text) for text in stream.getvalue().splitlines()]
    assert (line["level"], line["logger"], line["trace_id"]) == ("WARNING", "rmqstore.service", f"{TRACE_ID + 9:032x}")
    assert line["message"] == f"answered RESOURCE_EXHAUSTED (StoreFull): {refused.value.details()}"
    assert len(line["span_id"]) == 16 and line["span_id"] != f"{PARENT_SPAN_ID:016x}"  # the server span's


def test_a_send_that_fails_is_an_error_span(receiver: Receiver) -> None:
    """A send to a port nothing listens on: the command exits with the call's failure,
    and its span says so."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = receiver.env()
    done = subprocess.run(
        [sys.executable, "-m", "rmqstore.cli.main", "send", "--endpoint", f"127.0.0.1:{port}", "-t", "Nowhere", "--body", "x"],
        env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode != 0 and "UNAVAILABLE" in done.stderr, done.stderr
    [client] = receiver.wait_for({"send Nowhere"})
    assert client.service == "rmqstore-client" and client.span.kind == PRODUCER and client.parent_id == b""
    assert client.span.status.code == trace_pb2.Status.STATUS_CODE_ERROR
    assert client.span.status.message.startswith("UNAVAILABLE: ")
    assert client.attributes["rpc.grpc.status_code"] == grpc.StatusCode.UNAVAILABLE.value[0]
    assert client.attributes["error.type"] == "UNAVAILABLE"
    assert client.span.start_time_unix_nano < client.span.end_time_unix_nano


def test_the_client_library_sends_its_spans_context_in_the_call(receiver: Receiver) -> None:
    """The client's send span in a process that sets tracing up from the variables: the
    call's metadata carries its context, and the exported span has that context's ids
    and the send's attributes."""
    program = """
import json, sys
from rmqstore.client import tracing
with tracing.producer_span("127.0.0.1:1", "SendBatch", ["Early"], ["k1"], "TagE") as span:
    metadata = tracing.metadata(span)
    tracing.acknowledged(span, "UNIQ1")
    tracing.succeeded(span)
print(json.dumps({"metadata": metadata, "traceparent": tracing.traceparent(span)}))
"""
    done = subprocess.run([sys.executable, "-c", program], env=receiver.env(), capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    told = json.loads(done.stdout)
    assert ["traceparent", told["traceparent"]] in told["metadata"]
    [span] = receiver.wait_for({"send Early"})
    assert names(span, told["traceparent"]) and span.parent_id == b"" and span.span.kind == PRODUCER
    assert span.attributes == {
        "messaging.system": "rocketmq",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": "Early",
        "messaging.rocketmq.message.keys": ["k1"],
        "messaging.rocketmq.message.tag": "TagE",
        "messaging.message.id": "UNIQ1",
        "rpc.system": "grpc",
        "rpc.service": "rmqstore.v1.WriterService",
        "rpc.method": "SendBatch",
        "rpc.grpc.status_code": 0,
        "server.address": "127.0.0.1",
        "server.port": 1,
    }
    assert span.span.status.code == trace_pb2.Status.STATUS_CODE_UNSET


def test_the_commands_sampler_decides_its_spans(receiver: Receiver, tmp_path: Path, nodes: Nodes) -> None:
    """With ``always_off`` nothing of the command is exported, and the send still happens."""
    writer = nodes.start("writer", tmp_path / "store", env=quiet(receiver.env()))
    off = {**receiver.env(), "OTEL_TRACES_SAMPLER": "always_off"}
    sent = rmqstore(off, "send", "--endpoint", writer.endpoint, "-t", "Unsampled", "--body", "x")
    assert json.loads(sent.stdout)["topic"] == "Unsampled"
    time.sleep(1.0)  # several export intervals, in which nothing may arrive (an absence has no event to wait for)
    assert not [s for s in receiver.snapshot() if s.service == "rmqstore-client"]


def test_the_configured_sampler_decides_in_the_writer_and_the_command(receiver: Receiver, tmp_path: Path, nodes: Nodes) -> None:
    """``OTEL_TRACES_SAMPLER`` and ``OTEL_TRACES_SAMPLER_ARG`` as the SDK reads them: a
    writer under ``always_off`` exports no span of a traced send (the command's span
    arrives); a command under ``parentbased_traceidratio`` at ratio 0 samples its root
    span out, and the writer under the default (parent-based) sampler follows it; a
    query node under ``always_off`` exports no span of a traced lookup."""
    off = nodes.start("writer", tmp_path / "off", env={**receiver.env(), "OTEL_TRACES_SAMPLER": "always_off"})
    rmqstore(receiver.env(), "send", "--endpoint", off.endpoint, "-t", "SampledOut", "--body", "x")
    receiver.wait_for({"send SampledOut"})
    off.stop()  # a clean exit exports what the writer holds
    assert not [s for s in receiver.snapshot() if s.service == "rmqstore-writer"]
    writer = nodes.start("writer", tmp_path / "ratio", env=receiver.env())
    ratio = {**receiver.env(), "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"}
    sent = rmqstore(ratio, "send", "--endpoint", writer.endpoint, "-t", "RatioZero", "-k", "k1", "--body", "x")
    assert json.loads(sent.stdout)["topic"] == "RatioZero"
    writer.stop()
    assert not [s for s in receiver.snapshot() if s.name in ("send RatioZero", "/rmqstore.v1.WriterService/SendStream")]
    # A query node under always_off: a traced lookup's client span arrives, none of the node's.
    query = nodes.start("query", tmp_path / "ratio", env={**receiver.env(), "OTEL_TRACES_SAMPLER": "always_off"})
    looked = rmqstore(receiver.env(), "queryMsgByKey", "--endpoint", query.endpoint, "-t", "RatioZero", "-k", "k1", "--json")
    assert [json.loads(line)["topic"] for line in looked.stdout.splitlines()] == ["RatioZero"]
    receiver.wait_for({"rmqstore.v1.QueryService/QueryByKey"})
    query.stop()
    assert not [s for s in receiver.snapshot() if s.service == "rmqstore-query"]
