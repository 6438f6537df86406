"""Spans exported over OTLP/gRPC by the SDK's own exporter, as the nodes and the command
set it up: ``send --file``'s batch spans arrive at a real receiver, each with its name,
its batch's attributes and its times, under the file's span."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanContext, TraceFlags

EXPORT_TIMEOUT_S = 10.0


class _Receiver(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    """An OTLP/gRPC trace receiver on 127.0.0.1 keeping every request it is sent."""

    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def Export(self, request: Any, context: Any) -> Any:
        with self.lock:
            self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    started = _Receiver()
    yield started
    started.server.stop(None)


def test_a_files_batch_spans_reach_a_receiver_when_its_topics_take_turns(receiver: _Receiver) -> None:
    """``send --file``'s batch spans: batches of topics A and B taking turns, one message
    each, reach the receiver with their own names, their batch's attributes, and their
    times in the order the batches went, each a child of the file's span."""
    from rmqstore.client import tracing as client_tracing

    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(TracerProvider())
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{receiver.port}", insecure=True, timeout=EXPORT_TIMEOUT_S)
    processor = BatchSpanProcessor(exporter)
    provider.add_span_processor(processor)
    file_span = trace.NonRecordingSpan(SpanContext(0x7BF92F3577B34DA6A3CE929D0E0E4736, 0x30F067AA0BA902B7, is_remote=False,
                                                   trace_flags=TraceFlags(1)))  # fmt: skip
    batches = client_tracing.BatchSpans(file_span)
    topics = ["A", "B", "A", "B", "A"]
    for _ in batches.requests([b"1", b"2", b"3", b"4", b"5"], topics, [1] * 5):
        batches.acked()
    batches.close()
    assert processor.force_flush(int(EXPORT_TIMEOUT_S * 1000))
    processor.shutdown()
    with receiver.lock:
        spans = [span for request in receiver.requests for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]
    spans = [span for span in spans if span.trace_id == (0x7BF92F3577B34DA6A3CE929D0E0E4736).to_bytes(16, "big")]
    spans.sort(key=lambda span: span.start_time_unix_nano)
    assert [span.name for span in spans] == [f"send {topic}" for topic in topics]
    for span, topic in zip(spans, topics):
        attributes = {kv.key: kv.value for kv in span.attributes}
        assert attributes["messaging.destination.name"].string_value == topic
        assert span.parent_span_id == (0x30F067AA0BA902B7).to_bytes(8, "big")
        assert span.kind == trace_pb2.Span.SpanKind.SPAN_KIND_CLIENT
        assert span.start_time_unix_nano <= span.end_time_unix_nano
    assert len({span.span_id for span in spans}) == 5
    # Acknowledged in order: each batch ends before the next one's span ends.
    assert [span.end_time_unix_nano for span in spans] == sorted(span.end_time_unix_nano for span in spans)
