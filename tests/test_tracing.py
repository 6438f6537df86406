"""OpenTelemetry: the server continues the caller's trace; append, dispatch and flush spans."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from support.inprocess import QueryNode, WriterNode
from support.stores import SMALL
from support.telemetry import PARENT_SPAN_ID, TRACE_ID, collected, metric_reader, sdk_exporter

from rmqstore.common.telemetry import tracing_requested
from rmqstore.v1 import messages_pb2, writer_pb2
from rmqstore.writer.config import FlushPolicy


def test_spans_continue_the_callers_trace(tmp_path: Path) -> None:
    exporter = sdk_exporter()
    node = WriterNode(tmp_path / "store", flush=FlushPolicy.SYNC)
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
    for name in ("rmqstore.append", "rmqstore.flush"):
        span = spans[name]
        assert span.context.trace_id == TRACE_ID, name
        assert span.parent is not None and span.parent.span_id == server.context.span_id, name
    append = spans["rmqstore.append"].attributes
    assert append["messaging.system"] == "rocketmq" and append["messaging.destination.name"] == "Traced"
    assert len(append["messaging.message.id"]) == 32
    # The dispatch is a moment of the append span, not a span of its own.
    assert "rmqstore.dispatch" not in spans
    assert [event.name for event in spans["rmqstore.append"].events] == ["rmqstore.dispatch"]
    assert spans["rmqstore.flush"].attributes["rmqstore.flush.bytes"] == node.writer.log.write_offset
    assert server.status.status_code != trace.StatusCode.ERROR


def test_query_lookups_get_their_own_spans(tmp_path: Path) -> None:
    from conftest import CLEAN, FIXTURE_SIZES

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
    assert lookup.attributes["messaging.destination.name"] == "TopicTest" and lookup.attributes["rmqstore.results"] == 3


def test_tracing_is_off_unless_asked() -> None:
    assert tracing_requested({}) is None
    assert tracing_requested({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}) is None
    assert tracing_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}) == "otlp"
    assert tracing_requested({"OTEL_TRACES_EXPORTER": "console"}) == "console"
    assert tracing_requested({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}) is None


def test_the_server_interceptor_steps_aside_without_a_tracer_provider(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    import grpc

    from rmqstore.service import server

    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    details = SimpleNamespace(method="/rmqstore.v1.QueryService/Ping", invocation_metadata=())
    interceptor = server.AsyncTracingInterceptor()

    async def continuation(_: object) -> grpc.RpcMethodHandler:
        return handler

    for unset in (trace.ProxyTracerProvider(), trace.NoOpTracerProvider()):
        monkeypatch.setattr(server.trace, "get_tracer_provider", lambda unset=unset: unset)
        assert asyncio.run(interceptor.intercept_service(continuation, details)) is handler
    monkeypatch.setattr(server.trace, "get_tracer_provider", TracerProvider)
    traced = asyncio.run(interceptor.intercept_service(continuation, details))
    assert traced is not handler and traced.unary_unary is not handler.unary_unary  # wrapped in a span


def test_metrics_are_off_unless_asked() -> None:
    from rmqstore.service.metrics import metrics_requested

    assert metrics_requested({}) is None
    assert metrics_requested({"OTEL_TRACES_EXPORTER": "console"}) is None
    assert metrics_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}) == "otlp"
    assert metrics_requested({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://127.0.0.1:4317"}) == "otlp"
    assert metrics_requested({"OTEL_METRICS_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317"}) is None
    assert metrics_requested({"OTEL_METRICS_EXPORTER": "console"}) == "console"
    assert metrics_requested({"OTEL_METRICS_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}) is None


def gained(before: dict[str, list], after: dict[str, list], name: str, attributes: dict[str, str], field: str) -> float:
    """What one series (``name`` with exactly ``attributes``) gained between two collections."""

    def read(found: dict[str, list]) -> float:
        return sum(getattr(p, field) for p in found.get(name, []) if dict(p.attributes) == attributes)

    return read(after) - read(before)


def test_writer_and_query_metrics(tmp_path: Path) -> None:
    from rmqstore.v1 import query_pb2

    reader = metric_reader()
    before = collected(reader)  # cumulative and shared by this process's tests: compared with what follows
    node = WriterNode(tmp_path / "store")
    try:
        batch = [messages_pb2.Message(topic="Metered", body=bytes(100), keys=[f"k{i}"]) for i in range(5)]
        acks = node.stub.SendBatch(writer_pb2.SendBatchRequest(messages=batch)).results
        node.stub.Send(writer_pb2.SendRequest(message=messages_pb2.Message(topic="Metered", body=b"x")))
        written = collected(reader)
        node.writer.flush_thoroughly()
        query = QueryNode(tmp_path / "store", SMALL)
        try:
            query.stub.QueryByKey(query_pb2.QueryByKeyRequest(topic="Metered", key="k3", page_size=3))
            query.stub.QueryByUniqKey(query_pb2.QueryByUniqKeyRequest(topic="Metered", uniq_key=acks[0].uniq_key))
            looked_up = collected(reader)
        finally:
            query.close()
    finally:
        node.close()
    topic = {"messaging.destination.name": "Metered"}
    messages = gained(before, written, "rmqstore.writer.messages", topic, "value")
    size = gained(before, written, "rmqstore.writer.bytes", topic, "value")
    duration_count = gained(before, written, "rmqstore.writer.append.duration", {}, "count")
    assert messages == 6 and duration_count == 2
    assert size == node.writer.log.write_offset  # every byte of both requests
    store = {"rmqstore.store": str(tmp_path / "store")}

    def of_this_store(points: list) -> list:
        return [p.value for p in points if dict(p.attributes) == store]

    assert of_this_store(written["rmqstore.writer.dispatch.lag"]) == [0]
    assert of_this_store(written["rmqstore.writer.unflushed"]) == [size]  # ASYNC, nothing fsynced yet
    by_kind = {kind: gained(before, looked_up, "rmqstore.query.duration", {"rmqstore.lookup": kind}, "count") for kind in ("key", "uniq_key")}
    assert by_kind == {"key": 1, "uniq_key": 1}
    assert of_this_store(looked_up["rmqstore.query.lag"]) == [0]
    assert 0 <= of_this_store(looked_up["rmqstore.query.staleness"])[0] < 60_000


def test_streaming_calls_work_and_are_traced_with_a_tracer_provider(tmp_path: Path) -> None:
    """OpenTelemetry's asyncio interceptor iterates a streaming handler: SendStream,
    StreamByTime and health Watch, which write with context.write, still answer in full
    (they once failed with UNKNOWN here), and each has its server span."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from rmqstore.v1 import query_pb2, query_pb2_grpc

    exporter = sdk_exporter()
    node = WriterNode(tmp_path / "store")
    query = QueryNode(tmp_path / "store")
    channel = query.channel
    try:
        requests = [writer_pb2.SendBatchRequest(messages=[messages_pb2.Message(topic="Traced", queue_id=0, body=b"s")])] * 3
        acks = [ack for response in node.stub.SendStream(iter(requests), timeout=10) for ack in response.results]
        assert [ack.queue_offset for ack in acks] == [0, 1, 2]
        node.writer.flush_thoroughly()
        query.view.refresh(force=True)
        stream = query_pb2.StreamByTimeRequest(topic="Traced", queue_id=0, begin_ms=0, end_ms=2**62)
        assert [m.queue_offset for m in query_pb2_grpc.QueryServiceStub(channel).StreamByTime(stream, timeout=10)] == [0, 1, 2]
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
    finally:
        query.close()
        node.close()
    names = {span.name for span in exporter.get_finished_spans()}
    assert {"/rmqstore.v1.WriterService/SendStream", "/rmqstore.v1.QueryService/StreamByTime"} <= names


def test_every_sync_request_reaches_the_flush_that_acknowledged_it(tmp_path: Path) -> None:
    """Under SYNC one fsync acknowledges every request appended before it: its span is the
    first one's child and links to the others, so each request's trace has its fsync."""
    import threading

    exporter = sdk_exporter()
    node = WriterNode(tmp_path / "store", flush=FlushPolicy.SYNC)
    threads_count, sends_each = 6, 5
    first_trace = TRACE_ID + 100

    def sender(thread: int) -> None:
        for n in range(sends_each):
            trace_id = first_trace + thread * sends_each + n
            node.stub.Send(
                writer_pb2.SendRequest(message=messages_pb2.Message(topic="Grouped", body=b"x")),
                metadata=(("traceparent", f"00-{trace_id:032x}-{PARENT_SPAN_ID:016x}-01"),),
                timeout=30,
            )

    try:
        threads = [threading.Thread(target=sender, args=(t,)) for t in range(threads_count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        node.close()
    sent = set(range(first_trace, first_trace + threads_count * sends_each))
    flushes = [s for s in exporter.get_finished_spans() if s.name == "rmqstore.flush" and s.context.trace_id in sent]
    reached = {s.context.trace_id for s in flushes} | {link.context.trace_id for s in flushes for link in s.links}
    assert reached == sent
    # A request whose bytes an earlier fsync synced (it ran while they were written) has a
    # span with 0 bytes; every other flush synced some.
    assert all(s.attributes["rmqstore.flush.bytes"] >= 0 for s in flushes) and any(s.attributes["rmqstore.flush.bytes"] > 0 for s in flushes)


def test_a_messages_traceparent_becomes_a_link_and_a_bad_one_links_nothing() -> None:
    from rmqstore.common.tracing import LINKS_MAX, link_from_properties, links_from_messages

    good = f"00-{TRACE_ID:032x}-{PARENT_SPAN_ID:016x}-01"
    link = link_from_properties({"traceparent": good, "KEYS": "k"})
    assert link is not None
    assert (link.context.trace_id, link.context.span_id, link.context.is_remote, int(link.context.trace_flags)) == (
        TRACE_ID, PARENT_SPAN_ID, True, 1,
    )  # fmt: skip
    # Random-trace-id flag (0x02) and a future version's extra fields are read too.
    assert link_from_properties({"traceparent": good[:-2] + "03"}) is not None
    assert link_from_properties({"traceparent": "01" + good[2:] + "-future"}) is not None
    for bad in (
        "", "garbage", good + "-extra", "ff" + good[2:], good.upper(), good.replace("-01", "-zz"),
        f"00-{0:032x}-{PARENT_SPAN_ID:016x}-01", f"00-{TRACE_ID:032x}-{0:016x}-01", good[:-1],
    ):  # fmt: skip
        assert link_from_properties({"traceparent": bad}) is None, bad
    assert link_from_properties({}) is None
    other = f"00-{TRACE_ID + 1:032x}-{PARENT_SPAN_ID:016x}-01"
    links = links_from_messages([{"traceparent": good}, {}, {"traceparent": "bad"}, {"traceparent": other}, {"traceparent": good}])
    assert [lk.context.trace_id for lk in links] == [TRACE_ID, TRACE_ID + 1]
    many = [{"traceparent": f"00-{TRACE_ID + n:032x}-{PARENT_SPAN_ID:016x}-01"} for n in range(LINKS_MAX + 10)]
    assert len(links_from_messages(many)) == LINKS_MAX


def test_a_flush_call_fsyncs_in_its_own_trace(tmp_path: Path) -> None:
    exporter = sdk_exporter()
    node = WriterNode(tmp_path / "store", flush=FlushPolicy.ASYNC)  # no periodic flush here
    trace_id = TRACE_ID + 7
    try:
        node.stub.Send(writer_pb2.SendRequest(message=messages_pb2.Message(topic="Flushed", body=b"x")))
        node.stub.Flush(
            writer_pb2.FlushRequest(), metadata=(("traceparent", f"00-{trace_id:032x}-{PARENT_SPAN_ID:016x}-01"),), timeout=30
        )
        written = node.writer.log.write_offset
    finally:
        node.close()
    spans = {span.name: span for span in exporter.get_finished_spans() if span.context.trace_id == trace_id}
    server, flush = spans["/rmqstore.v1.WriterService/Flush"], spans["rmqstore.flush"]
    assert flush.parent is not None and flush.parent.span_id == server.context.span_id
    assert flush.attributes["rmqstore.flush.bytes"] == written


def test_leaf_spans_are_children_of_the_current_span_never_current() -> None:
    """leaf_span: a child of the current span, its attributes set in the block, an
    escaping error recorded on it; never made current (a span started in its block is
    the outer span's child, not its)."""
    from rmqstore.common import tracing

    exporter = sdk_exporter()
    tracer = trace.get_tracer("rmqstore.writer")
    with tracer.start_as_current_span("server") as server:
        with tracing.leaf_span(tracer, "rmqstore.append", {"messaging.system": "rocketmq"}) as current:
            current.set_attribute("messaging.message.id", "ABC")
            current.add_event("rmqstore.dispatch")
            assert trace.get_current_span() is server
        with pytest.raises(KeyError), tracing.leaf_span(tracer, "rmqstore.append"):
            raise KeyError("queue")
    append, failed = [s for s in exporter.get_finished_spans() if s.name == "rmqstore.append"]
    assert dict(append.attributes or {}) == {"messaging.system": "rocketmq", "messaging.message.id": "ABC"}
    assert [event.name for event in append.events] == ["rmqstore.dispatch"]
    for span in (append, failed):
        assert span.parent is not None and span.parent.span_id == server.get_span_context().span_id
        assert span.instrumentation_scope is not None and span.instrumentation_scope.name == "rmqstore.writer"
        assert span.start_time is not None and span.end_time is not None and span.start_time <= span.end_time
    assert failed.status.description == "KeyError: 'queue'"
    assert [event.name for event in failed.events] == ["exception"]


class _Refused(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    """A stream's failure as gRPC raises it: a code and details."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "the writer went away"

    def initial_metadata(self) -> None: ...
    def trailing_metadata(self) -> None: ...
    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> None: ...
    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: object) -> bool:
        return False


def test_send_files_batch_spans_end_acknowledged_or_failed_once_the_stream_is_over() -> None:
    """Three batches handed to gRPC, two acknowledged, then the stream fails: the first
    two spans end at their acks, the third fails with the stream's code; a batch never
    handed over has no span. Made by close(), not before."""
    from rmqstore.client import tracing as client_tracing

    exporter = sdk_exporter()
    with trace.get_tracer("test").start_as_current_span("send") as file_span:
        batches = client_tracing.BatchSpans(file_span)
        sending = batches.requests([b"1", b"2", b"3", b"4"], ["A", "A", "A", "B", "B", "C"], [2, 2, 1, 1])
        assert [next(sending), next(sending)] == [b"1", b"2"]
        batches.acked()
        assert next(sending) == b"3"
        batches.acked()
        assert exporter.get_finished_spans() == ()
        batches.close(_Refused())
        batches.close()  # once only
    spans = [s for s in exporter.get_finished_spans() if s.parent is not None and s.parent.span_id == file_span.get_span_context().span_id]
    assert [(s.name, s.kind) for s in spans] == [("send A", trace.SpanKind.CLIENT), ("send", trace.SpanKind.CLIENT), ("send B", trace.SpanKind.CLIENT)]
    first, second, third = spans
    assert dict(first.attributes or {}) == {
        "messaging.system": "rocketmq", "messaging.operation.type": "send", "messaging.operation.name": "send",
        "messaging.destination.name": "A", "messaging.batch.message_count": 2,
    }  # fmt: skip
    assert "messaging.destination.name" not in (second.attributes or {})
    assert first.status.status_code == second.status.status_code == trace.StatusCode.UNSET
    assert (third.status.status_code, third.status.description) == (trace.StatusCode.ERROR, "UNAVAILABLE: the writer went away")
    assert dict(third.attributes or {}) == {
        "messaging.system": "rocketmq", "messaging.operation.type": "send", "messaging.operation.name": "send",
        "messaging.destination.name": "B", "rpc.grpc.status_code": 14, "error.type": "UNAVAILABLE",
    }  # fmt: skip
    for span in spans:
        assert span.start_time is not None and span.end_time is not None and span.start_time <= span.end_time
    assert first.end_time is not None and second.start_time is not None and first.start_time <= second.start_time


def test_log_levels_map_to_the_log_data_models_severities() -> None:
    """Each of logging's levels to the first severity of its range; a level between two
    to the one below it; below DEBUG unspecified."""
    from opentelemetry._logs import SeverityNumber

    from rmqstore.service.logs import severity_of

    levels = (5, 10, 15, 20, 25, 30, 40, 50, 60)
    assert [severity_of(level) for level in levels] == [
        SeverityNumber.UNSPECIFIED, SeverityNumber.DEBUG, SeverityNumber.DEBUG, SeverityNumber.INFO, SeverityNumber.INFO,
        SeverityNumber.WARN, SeverityNumber.ERROR, SeverityNumber.FATAL, SeverityNumber.FATAL,
    ]  # fmt: skip
