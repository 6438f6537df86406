"""OpenTelemetry: the server continues the caller's trace; append, dispatch and flush spans."""

from __future__ import annotations

from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rmqstore.service.telemetry import tracing_requested
from rmqstore.v1 import messages_pb2, writer_pb2
from rmqstore.writer.config import FlushPolicy
from test_writer import start_node

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
PARENT_SPAN_ID = 0x00F067AA0BA902B7


def sdk_exporter() -> InMemorySpanExporter:
    """An in-memory exporter on the process's SDK tracer provider (installed once: the
    global provider can be set only once per process)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        trace.set_tracer_provider(TracerProvider())
        provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


def test_spans_continue_the_callers_trace(tmp_path: Path) -> None:
    exporter = sdk_exporter()
    node = start_node(tmp_path / "store", flush=FlushPolicy.SYNC)
    try:
        traceparent = f"00-{TRACE_ID:032x}-{PARENT_SPAN_ID:016x}-01"
        node.stub.Send(
            writer_pb2.SendRequest(message=messages_pb2.Message(topic="Traced", body=b"x")),
            metadata=(("traceparent", traceparent),),
        )
    finally:
        node.close()
    # Spans of this trace only: closing the node flushes again outside any request.
    spans = {span.name: span for span in exporter.get_finished_spans() if span.context.trace_id == TRACE_ID}
    server = spans["/rmqstore.v1.WriterService/Send"]
    assert server.kind == trace.SpanKind.SERVER
    assert server.context.trace_id == TRACE_ID
    assert server.parent is not None and server.parent.span_id == PARENT_SPAN_ID
    for name in ("rmqstore.append", "rmqstore.dispatch", "rmqstore.flush"):
        span = spans[name]
        assert span.context.trace_id == TRACE_ID, name
        assert span.parent is not None and span.parent.span_id == server.context.span_id, name
    assert spans["rmqstore.append"].attributes["rmqstore.messages"] == 1
    assert server.status.status_code != trace.StatusCode.ERROR


def test_query_lookups_get_their_own_spans(tmp_path: Path) -> None:
    from conftest import CLEAN, FIXTURE_SIZES
    from test_query import QueryNode

    from rmqstore.v1 import query_pb2

    exporter = sdk_exporter()
    node = QueryNode(CLEAN, FIXTURE_SIZES)
    trace_id = TRACE_ID + 1
    try:
        node.stub.QueryByKey(
            query_pb2.QueryByKeyRequest(topic="TopicTest", key="order-common", page_size=3),
            metadata=(("traceparent", f"00-{trace_id:032x}-{PARENT_SPAN_ID:016x}-01"),),
        )
    finally:
        node.close()
    spans = {span.name: span for span in exporter.get_finished_spans() if span.context.trace_id == trace_id}
    server = spans["/rmqstore.v1.QueryService/QueryByKey"]
    lookup = spans["rmqstore.lookup.key"]
    assert lookup.parent is not None and lookup.parent.span_id == server.context.span_id
    assert lookup.attributes["rmqstore.topic"] == "TopicTest" and lookup.attributes["rmqstore.results"] == 3


def test_tracing_is_off_unless_asked() -> None:
    assert tracing_requested({}) is None
    assert tracing_requested({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}) is None
    assert tracing_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}) == "otlp"
    assert tracing_requested({"OTEL_TRACES_EXPORTER": "console"}) == "console"
    assert tracing_requested({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}) is None
