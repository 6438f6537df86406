"""The OTLP span exporter's own encoding (rmqstore.common.otlp): the request it sends is
the request the SDK's encoder makes, field for field, for spans of every shape; and the
spans the leaf recorder writes as bytes arrive at a real OTLP receiver as the SDK would
have sent the same spans."""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)
from opentelemetry.util.types import Attributes

from rmqstore.common import otlp
from rmqstore.common.otlp import EncodedSpan, SpanEncoder
from rmqstore.common.otlp_span_exporter import SpanExporter
from rmqstore.common.tracing import LeafRecorder

EXPORT_TIMEOUT_S = 10.0

RESOURCES = [
    Resource.create({"service.name": "rmqstore-writer"}),
    Resource({"service.name": "rmqstore-query", "host.name": "node-1"}, schema_url="https://opentelemetry.io/schemas/1.21.0"),
]
SCOPES: list[InstrumentationScope | None] = [
    InstrumentationScope("rmqstore.writer"),
    InstrumentationScope("rmqstore.client", "1.2.3", "https://opentelemetry.io/schemas/1.21.0", {"scope.kind": "cli"}),
    None,
]

int64 = st.integers(-(2**63), 2**63 - 1)
text = st.text(max_size=12)
scalars = st.one_of(text, st.booleans(), int64, st.floats(allow_nan=False), st.binary(max_size=8))
values = st.one_of(
    scalars,
    st.lists(text, max_size=3),
    st.lists(int64, max_size=3).map(tuple),
    st.lists(st.booleans(), max_size=2),
    st.dictionaries(st.sampled_from(["a", "b"]), scalars, max_size=2),
)
attributes = st.dictionaries(st.sampled_from(["messaging.system", "k", "rpc.method", "é", ""]), values, max_size=4)
span_ids = st.integers(1, 2**64 - 1)
trace_ids = st.integers(1, 2**128 - 1)
trace_states = st.one_of(
    st.none(),
    st.lists(st.tuples(st.sampled_from(["rojo", "congo", "vendor@tenant"]), st.sampled_from(["00f067aa0ba902b7", "t61rcWkgMzE"])), max_size=2)
    .map(lambda pairs: TraceState(list(dict(pairs).items()))),
)


@st.composite
def contexts(draw: Any, remote: bool | None = None) -> SpanContext:
    return SpanContext(
        draw(trace_ids), draw(span_ids), is_remote=draw(st.booleans()) if remote is None else remote,
        trace_flags=TraceFlags(draw(st.sampled_from([0, 1]))), trace_state=draw(trace_states),
    )  # fmt: skip


def _bounded(items: list[Any], dropped: int) -> BoundedList:
    bounded = BoundedList(len(items) or 1)
    for each in items + items[:1] * dropped:
        bounded.append(each)
    return bounded


@st.composite
def spans(draw: Any) -> ReadableSpan:
    events = draw(st.lists(st.builds(Event, text, attributes, st.integers(0, 2**64 - 1)), max_size=2))
    links = draw(st.lists(st.builds(Link, contexts(), st.one_of(st.none(), attributes)), max_size=3))
    dropped = draw(st.integers(0, 2))
    status = draw(
        st.sampled_from(
            [Status(StatusCode.UNSET), Status(StatusCode.OK), Status(StatusCode.ERROR), Status(StatusCode.ERROR, "UNAVAILABLE: gone"), None]
        )
    )
    return ReadableSpan(
        name=draw(text),
        context=draw(contexts(remote=False)),
        parent=draw(st.one_of(st.none(), contexts())),
        resource=draw(st.sampled_from(RESOURCES)),
        attributes=draw(attributes),
        events=_bounded(events, dropped) if events and dropped else events,
        links=_bounded(links, dropped) if links and dropped else links,
        kind=draw(st.sampled_from(list(SpanKind))),
        status=status,  # type: ignore[arg-type]
        start_time=draw(st.one_of(st.none(), st.integers(0, 2**64 - 1))),
        end_time=draw(st.one_of(st.none(), st.integers(0, 2**64 - 1))),
        instrumentation_scope=draw(st.sampled_from(SCOPES)),
    )


def _same_request(encoder: SpanEncoder, batch: list[Any], readable: list[ReadableSpan] | None = None) -> None:
    """The encoder's request is the SDK encoder's, as a message and as the bytes sent."""
    ours = encoder.encode(batch)
    sdks = encode_spans(readable if readable is not None else batch)
    assert ours.SerializeToString(deterministic=True) == sdks.SerializeToString(deterministic=True)
    assert ours == sdks


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(spans(), min_size=1, max_size=6))
def test_the_encoder_writes_the_request_the_sdks_encoder_writes(batch: list[ReadableSpan]) -> None:
    # Twice through one encoder: the second time from its caches.
    encoder = SpanEncoder()
    _same_request(encoder, batch)
    _same_request(encoder, batch)


_ENCODER_OF_EVERY_EXAMPLE = SpanEncoder()
# Contexts that differ in one thing only: remote or not, trace state or not, the id.
_POOLED_CONTEXTS = [
    SpanContext(2**100 + 3, span_id, is_remote=remote, trace_flags=TraceFlags(1), trace_state=state)
    for span_id in (7, 8)
    for remote in (False, True)
    for state in (None, TraceState([("rojo", "00f067aa0ba902b7")]))
]


@st.composite
def pooled_spans(draw: Any) -> ReadableSpan:
    """Spans drawn from a few names, parents and links, so that one encoder sees the same
    name and parent, or the same links, with everything else different."""
    links = draw(st.lists(st.builds(Link, st.sampled_from(_POOLED_CONTEXTS), st.one_of(st.none(), st.just({"k": 1}))), max_size=2))
    status = draw(st.sampled_from([Status(StatusCode.UNSET), Status(StatusCode.ERROR, "UNAVAILABLE: gone"), Status(StatusCode.OK), None]))
    own = draw(st.sampled_from(_POOLED_CONTEXTS))
    return ReadableSpan(
        name=draw(st.sampled_from(["", "rmqstore.dispatch", "é"])),
        context=SpanContext(own.trace_id, draw(st.sampled_from([5, 6])), is_remote=False, trace_state=own.trace_state),
        parent=draw(st.one_of(st.none(), st.sampled_from(_POOLED_CONTEXTS))),
        resource=RESOURCES[0],
        attributes=draw(st.one_of(st.just({}), attributes)),
        events=draw(st.lists(st.builds(Event, st.just("exception"), st.just({"k": 1}), st.just(5)), max_size=1)),
        links=links,
        kind=draw(st.sampled_from(list(SpanKind))),
        status=status,  # type: ignore[arg-type]
        start_time=draw(st.sampled_from([None, 1, 2**40])),
        end_time=draw(st.sampled_from([None, 2, 2**41])),
        instrumentation_scope=SCOPES[0],
    )


@settings(max_examples=300)
@given(st.lists(st.one_of(pooled_spans(), spans()), min_size=1, max_size=6))
def test_one_encoder_keeps_nothing_that_one_span_gives_another(batch: list[ReadableSpan]) -> None:
    """One encoder through every example: the parts it keeps (a span's name, kind and
    parent; the links and status of a span with no attributes) are keyed by all they
    hold, so a span with the same name or links as one before is still written as
    itself."""
    _same_request(_ENCODER_OF_EVERY_EXAMPLE, batch)


def test_equal_resources_and_scopes_group_as_the_sdk_groups_them() -> None:
    """Resources and scopes are grouped by equality in the order first seen, not by
    identity: equal copies interleaved with others land in one group."""
    copy = Resource(dict(RESOURCES[0].attributes), RESOURCES[0].schema_url)
    scope_copy = InstrumentationScope("rmqstore.writer")
    context = SpanContext(1, 2, is_remote=False)
    made = [
        ReadableSpan(f"s{i}", context, resource=resource, instrumentation_scope=scope, status=Status(StatusCode.UNSET))
        for i, (resource, scope) in enumerate(
            [(RESOURCES[0], SCOPES[0]), (RESOURCES[1], SCOPES[0]), (copy, scope_copy), (copy, SCOPES[1]), (RESOURCES[0], None)]
        )
    ]
    _same_request(SpanEncoder(), made)
    request = SpanEncoder().encode(made)
    assert [[[s.name for s in scope.spans] for scope in group.scope_spans] for group in request.resource_spans] == [
        [["s0", "s2"], ["s3"], ["s4"]],
        [["s1"]],
    ]


def test_attribute_values_the_sdk_cannot_encode_are_left_out_as_it_leaves_them() -> None:
    """An integer past 64 bits, or a value of no attribute type: the SDK's encoder logs it
    and leaves the attribute out; so does this one (and caches nothing for it)."""
    context = SpanContext(1, 2, is_remote=False)
    made = [
        ReadableSpan("odd", context, attributes={"big": 2**70, "ok": 1, "object": object(), "nan": math.nan}, status=Status(StatusCode.UNSET))
    ]
    encoder = SpanEncoder()
    _same_request(encoder, made)
    assert [a.key for a in encoder.encode(made).resource_spans[0].scope_spans[0].spans[0].attributes] == ["ok", "nan"]
    _same_request(encoder, made)


def test_a_span_this_encoding_fails_on_is_encoded_by_the_sdks_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    made = [ReadableSpan("s", SpanContext(1, 2, is_remote=False), attributes={"k": "v"}, status=Status(StatusCode.OK))]

    def fails(*args: Any, **kwargs: Any) -> bytes:
        raise ValueError("a shape not foreseen")

    monkeypatch.setattr(SpanEncoder, "span_bytes", fails)
    _same_request(SpanEncoder(), made)


class _Counting(IdGenerator):
    """Ids in sequence, so that two providers give the same spans the same ids."""

    def __init__(self) -> None:
        self._next = itertools.count(0x1000)

    def generate_span_id(self) -> int:
        return next(self._next)

    def generate_trace_id(self) -> int:
        return next(self._next) << 64 | 0xABC


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


def _record_all(recorder: LeafRecorder) -> None:
    """Leaf spans of every shape the nodes and the client record."""
    server = SpanContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, is_remote=True, trace_flags=TraceFlags(1),
                         trace_state=TraceState([("rojo", "00f067aa0ba902b7")]))  # fmt: skip
    local = SpanContext(0x5BF92F3577B34DA6A3CE929D0E0E4736, 0x10F067AA0BA902B7, is_remote=False, trace_flags=TraceFlags(1))
    producer = Link(SpanContext(0x6BF92F3577B34DA6A3CE929D0E0E4736, 0x20F067AA0BA902B7, is_remote=True, trace_flags=TraceFlags(1)))
    in_server = trace.set_span_in_context(trace.NonRecordingSpan(server))
    in_local = trace.set_span_in_context(trace.NonRecordingSpan(local))
    unsampled = trace.set_span_in_context(trace.NonRecordingSpan(SpanContext(7, 8, is_remote=True, trace_flags=TraceFlags(0))))
    recorder.record("rmqstore.writer", "rmqstore.append", 1_000, 2_000, {"messaging.system": "rocketmq", "messaging.destination.name": "T"}, parent=in_server)
    recorder.record("rmqstore.writer", "rmqstore.dispatch", 2_000, 2_500, None, [producer, producer], parent=in_server)
    # The same link objects again, under a local parent: the encoder's tail kept by them
    # is kept by the parent's remoteness too.
    recorder.record("rmqstore.writer", "rmqstore.dispatch", 2_600, 2_700, None, [producer, producer], parent=in_local)
    recorder.record("rmqstore.writer", "rmqstore.append", 3_000, 4_000, {"messaging.batch.message_count": 1000, "ok": True}, parent=in_local)
    recorder.record("rmqstore.client", "send T", 5, 9, {"messaging.rocketmq.message.keys": ["a", "b"]}, kind=SpanKind.CLIENT,
                    parent=in_local, status=Status(StatusCode.ERROR, "UNAVAILABLE: the writer went away"))  # fmt: skip
    recorder.record("rmqstore.writer", "rmqstore.flush", 10, 20, {"rmqstore.flush.bytes": 4096}, parent=Context())
    recorder.record("rmqstore.writer", "rmqstore.append", 30, 40, {"messaging.system": "rocketmq"}, parent=unsampled)
    recorder.record("rmqstore.writer", "rmqstore.append", 50, 60, None, error=ValueError("bad batch"), parent=in_server)
    # A send's batches: spans of one shape, written once where the recorder can, else one by one.
    batch = {"messaging.system": "rocketmq", "messaging.destination.name": "T", "messaging.batch.message_count": 2}
    for parent in (in_local, in_server, unsampled, Context()):
        times = [(100, 200), (150, 300), (400, 401)]
        if not recorder.record_batch("rmqstore.client", "send T", times, batch, SpanKind.CLIENT, parent):
            for start, end in times:
                recorder.record("rmqstore.client", "send T", start, end, batch, kind=SpanKind.CLIENT, parent=parent)


@pytest.mark.parametrize("sampler", [None, ParentBased(TraceIdRatioBased(1.0)), ParentBased(ALWAYS_ON)], ids=["default", "ratio", "parentbased"])
def test_recorded_spans_reach_a_receiver_as_the_sdk_would_send_them(receiver: _Receiver, sampler: Any) -> None:
    """The recorder writes each span as bytes and queues them on the batch processor;
    exported to a real receiver, the request holds exactly what the SDK's encoder makes
    of the same spans recorded as SDK spans (same ids, same sampler)."""
    provider = TracerProvider(id_generator=_Counting(), sampler=sampler)
    exporter = SpanExporter(endpoint=f"127.0.0.1:{receiver.port}", insecure=True, timeout=EXPORT_TIMEOUT_S)
    processor = BatchSpanProcessor(exporter)
    recorder = LeafRecorder(provider, processor)
    # The compared recorder: SDK spans to memory (the processor is not this exporter's),
    # decided by the sampler's own call (the default one is decided without it).
    memory = InMemorySpanExporter()
    called = sampler if sampler is not None else ParentBased(ALWAYS_ON)
    compared = LeafRecorder(TracerProvider(id_generator=_Counting(), sampler=called, resource=provider.resource), SimpleSpanProcessor(memory))
    _record_all(recorder)
    _record_all(compared)
    queued = list(processor._batch_processor._queue)
    # Every span written as bytes but the failed one (its event: an SDK span).
    assert [type(each) for each in queued].count(EncodedSpan) == 6 + 9
    assert processor.force_flush(int(EXPORT_TIMEOUT_S * 1000))
    readable = list(memory.get_finished_spans())
    assert [span.name for span in readable] == ["rmqstore.append", "rmqstore.dispatch", "rmqstore.dispatch", "rmqstore.append", "send T", "rmqstore.flush", "rmqstore.append"] + ["send T"] * 9
    assert [span.parent is None for span in readable[-3:]] == [True] * 3
    with receiver.lock:
        [request] = receiver.requests
    assert request.SerializeToString(deterministic=True) == encode_spans(readable).SerializeToString(deterministic=True)
    processor.shutdown()


def test_a_files_batch_spans_reach_a_receiver_when_its_topics_take_turns(receiver: _Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    """``send --file``'s batch spans written as bytes: batches of topics A and B taking
    turns, one message each, are written as a run per topic, and every span reaches the
    receiver with its own name, its batch's attributes, and its times in the order the
    batches went, each a child of the file's span."""
    from rmqstore.client import tracing as client_tracing
    from rmqstore.common import tracing

    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(TracerProvider())
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    processor = BatchSpanProcessor(SpanExporter(endpoint=f"127.0.0.1:{receiver.port}", insecure=True, timeout=EXPORT_TIMEOUT_S))
    recorder = LeafRecorder(provider, processor)
    monkeypatch.setattr(tracing, "_recorder", recorder)
    written: list[int] = []
    record_batch = recorder.record_batch
    monkeypatch.setattr(LeafRecorder, "record_batch", lambda self, *args: written.append(len(args[2])) or record_batch(*args))
    file_span = trace.NonRecordingSpan(SpanContext(0x7BF92F3577B34DA6A3CE929D0E0E4736, 0x30F067AA0BA902B7, is_remote=False,
                                                   trace_flags=TraceFlags(1)))  # fmt: skip
    batches = client_tracing.BatchSpans(file_span)
    topics = ["A", "B", "A", "B", "A"]
    for _ in batches.requests([b"1", b"2", b"3", b"4", b"5"], topics, [1] * 5):
        batches.acked()
    batches.close()
    assert written == [3, 2]  # a run per topic, not one per batch
    assert processor.force_flush(int(EXPORT_TIMEOUT_S * 1000))
    with receiver.lock:
        spans = [span for request in receiver.requests for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]
    spans.sort(key=lambda span: span.start_time_unix_nano)
    assert [span.name for span in spans] == [f"send {topic}" for topic in topics]
    for span, topic in zip(spans, topics):
        attributes = {kv.key: kv.value for kv in span.attributes}
        assert attributes["messaging.destination.name"].string_value == topic
        assert span.parent_span_id == (0x30F067AA0BA902B7).to_bytes(8, "big")
        assert span.trace_id == (0x7BF92F3577B34DA6A3CE929D0E0E4736).to_bytes(16, "big")
        assert span.kind == trace_pb2.Span.SpanKind.SPAN_KIND_CLIENT
        assert span.start_time_unix_nano <= span.end_time_unix_nano
    assert len({span.span_id for span in spans}) == 5
    # Acknowledged in order: each batch ends before the next one's span ends.
    assert [span.end_time_unix_nano for span in spans] == sorted(span.end_time_unix_nano for span in spans)
    processor.shutdown()


def test_the_recorder_queues_sdk_spans_for_any_other_exporter() -> None:
    """Only this package's exporter reads the recorded bytes: with another exporter on the
    batch processor, the recorder hands it SDK spans."""
    memory = InMemorySpanExporter()
    processor = BatchSpanProcessor(memory)
    recorder = LeafRecorder(TracerProvider(), processor)
    recorder.record("rmqstore.writer", "rmqstore.append", 1, 2, {"messaging.system": "rocketmq"}, parent=Context())
    assert processor.force_flush(int(EXPORT_TIMEOUT_S * 1000))
    [span] = memory.get_finished_spans()
    assert isinstance(span, ReadableSpan) and span.name == "rmqstore.append"
    processor.shutdown()


def test_attribute_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(otlp, "_ATTRIBUTES_KEPT", 8)
    encoder = SpanEncoder()
    made: Attributes = {f"k{i}": i for i in range(20)}
    span = ReadableSpan("s", SpanContext(1, 2, is_remote=False), attributes=made, status=Status(StatusCode.UNSET))
    _same_request(encoder, [span])
    assert len(encoder._attributes) <= 8
    _same_request(encoder, [span])
