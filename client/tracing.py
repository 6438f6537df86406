"""The client's spans and the W3C trace context it sends, when the standard ``OTEL_*``
variables ask for tracing (as the nodes read them, :mod:`rmqstore.service.telemetry`), or
when the program using the client installed an SDK tracer provider of its own.

* A send is a PRODUCER span ``send <topic>`` with the messaging and RPC attributes; its
  context travels in the call's metadata (the node's server span is its child) and in each
  message's ``traceparent`` property (the writer's dispatch span, and a consumer, link to
  it). ``send --file`` is one such span for the file and a CLIENT span per batch.
* Every other call (the lookups, topic and flush calls) is a CLIENT span named by its
  method, with the lookup's topic and result count.

Nothing here imports OpenTelemetry until :func:`enabled` finds tracing asked for."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import grpc

from rmqstore.common.errors import InvalidArgument

if TYPE_CHECKING:
    from opentelemetry import trace

SERVICE_NAME = "rmqstore-client"
TRACER_NAME = "rmqstore.client"
TRACEPARENT = "traceparent"  # rmqstore.common.tracing.TRACEPARENT, without importing the API

# The writer's calls that store messages: traced as PRODUCER spans by the calls themselves.
SEND_METHODS = frozenset(f"/rmqstore.v1.WriterService/{name}" for name in ("Send", "SendBatch", "SendStream"))

# A command exports its spans as it exits: an unreachable collector may delay its exit by
# this much at most (the SDK's default is 10 s of retries).
EXPORT_TIMEOUT_S = 2.0

# A send's batch spans go to the exporter this many at a time, once the send is over: the
# batch span processor's default batch, well under its queue (2,048).
SPANS_PER_EXPORT = 512

_enabled: bool | None = None


def enabled() -> bool:
    """Whether calls are traced: an SDK tracer provider is installed (by the program) or
    the environment asks for one (installed here, once)."""
    global _enabled
    if _enabled is None:
        _enabled = _decide()
    return _enabled


def _decide() -> bool:
    if "opentelemetry.trace" in sys.modules:
        from rmqstore.common.tracing import tracing_on

        if tracing_on():
            return True
    from rmqstore.service.telemetry import configure_tracing, tracing_requested

    if tracing_requested() is None:
        return False
    try:
        # A command's spans are not its work: an OTLP setting the exporter refuses costs them, not the command.
        return configure_tracing(SERVICE_NAME, EXPORT_TIMEOUT_S, lenient_export=True)
    except ValueError as error:
        raise InvalidArgument(str(error)) from None


def _tracer() -> trace.Tracer:
    from opentelemetry import trace

    return trace.get_tracer(TRACER_NAME)


def _server_attributes(endpoint: str, method_path: str) -> dict[str, Any]:
    """The RPC conventions' attributes of a call, as OpenTelemetry's gRPC instrumentation
    names them, and the server's address."""
    service, _, method = method_path.lstrip("/").partition("/")
    attributes: dict[str, Any] = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}
    host, _, port = endpoint.rpartition(":")
    if host and port.isdigit():
        attributes["server.address"] = host.strip("[]")
        attributes["server.port"] = int(port)
    return attributes


def _messaging_attributes(topics: Sequence[str]) -> dict[str, Any]:
    from rmqstore.common import tracing as conventions

    attributes: dict[str, Any] = {
        conventions.MESSAGING_SYSTEM: conventions.ROCKETMQ,
        conventions.MESSAGING_OPERATION_TYPE: "send",
        conventions.MESSAGING_OPERATION_NAME: "send",
    }
    distinct = set(topics)
    if len(distinct) == 1:
        attributes[conventions.MESSAGING_DESTINATION_NAME] = topics[0]
    if len(topics) != 1:
        attributes[conventions.MESSAGING_BATCH_MESSAGE_COUNT] = len(topics)
    return attributes


def describe_file(span: trace.Span, topics: Sequence[str]) -> None:
    """The messaging attributes and name of ``send --file``'s span, once the file is read."""
    span.set_attributes(_messaging_attributes(topics))
    span.update_name(_span_name(topics))


def _span_name(topics: Sequence[str]) -> str:
    return f"send {topics[0]}" if len(set(topics)) == 1 else "send"


@contextlib.contextmanager
def producer_span(
    endpoint: str, method: str, topics: Sequence[str], keys: Sequence[str] = (), tag: str = ""
) -> Iterator[trace.Span | None]:
    """A PRODUCER span ``send <topic>`` around a send of ``topics``' messages (with a
    single message's ``keys`` and ``tag``), current while the block runs; None (and no
    cost) when tracing is off."""
    if not enabled():
        yield None
        return
    from opentelemetry import trace

    from rmqstore.common import tracing as conventions

    attributes = _messaging_attributes(topics)
    if keys:
        attributes[conventions.MESSAGING_ROCKETMQ_KEYS] = list(keys)
    if tag:
        attributes[conventions.MESSAGING_ROCKETMQ_TAG] = tag
    attributes.update(_server_attributes(endpoint, f"/rmqstore.v1.WriterService/{method}"))
    with _tracer().start_as_current_span(_span_name(topics), kind=trace.SpanKind.PRODUCER, attributes=attributes) as span:
        try:
            yield span
        except grpc.RpcError as error:
            failed(span, error)
            raise


def succeeded(span: trace.Span) -> None:
    span.set_attribute("rpc.grpc.status_code", grpc.StatusCode.OK.value[0])


def failed(span: trace.Span, error: grpc.RpcError) -> None:
    attributes: dict[str, Any] = {}
    status = _failure(attributes, error)
    span.set_attributes(attributes)
    span.set_status(status)


def _failure(attributes: dict[str, Any], error: grpc.RpcError) -> trace.Status:
    """A failed call's status, its code and name added to ``attributes``."""
    from opentelemetry.trace import Status, StatusCode

    code = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
    attributes["rpc.grpc.status_code"] = code.value[0]
    attributes["error.type"] = code.name
    return Status(StatusCode.ERROR, f"{code.name}: {error.details() if isinstance(error, grpc.Call) else error}")


def traceparent(span: trace.Span) -> str:
    from rmqstore.common.tracing import traceparent_of

    return traceparent_of(span.get_span_context())


def stamp(messages: Any, span: trace.Span) -> None:
    """Give each message that has none a ``traceparent`` property naming ``span``."""
    value = traceparent(span)
    for message in messages:
        if TRACEPARENT not in message.properties:
            message.properties[TRACEPARENT] = value


def stamped(properties: list[dict[str, str] | None], value: str) -> list[dict[str, str] | None]:
    """``send --file``'s properties column with a ``traceparent`` in each message that has
    none (a message's own is kept): the messages without properties share one dict."""
    shared = {TRACEPARENT: value}
    return [shared if not each else (each if TRACEPARENT in each else {**each, TRACEPARENT: value}) for each in properties]


def metadata(span: trace.Span | None) -> tuple[tuple[str, str], ...] | None:
    """The call metadata carrying the current context (``traceparent``, and whatever else
    the configured propagators add), or None without a span."""
    if span is None:
        return None
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return tuple(carrier.items())


def acknowledged(span: trace.Span, uniq_key: str) -> None:
    from rmqstore.common.tracing import MESSAGING_MESSAGE_ID

    span.set_attribute(MESSAGING_MESSAGE_ID, uniq_key)


class BatchSpans:
    """``send --file``'s CLIENT span per batch on its stream: each batch's span starts as
    its request is handed to gRPC and ends with its ack (the stream answers in order).

    The spans are made once the stream is over, from the times noted while it ran (two
    clock reads a batch): exporting a span while the stream runs takes the GIL from the
    threads that feed gRPC, stalling the stream for every batch of spans the exporter
    encodes (at one message a request this cost more than making the spans). They are
    handed to the exporter :data:`SPANS_PER_EXPORT` at a time, each batch's export
    awaited, so that none is dropped from the exporter's queue; when an export is slow
    (the collector does not answer) the rest are dropped rather than delay the command's
    exit further."""

    def __init__(self, parent: trace.Span):
        from opentelemetry import trace

        self._context = trace.set_span_in_context(parent)
        self._started_ns: list[int] = []
        self._ended_ns: list[int] = []
        self._topics: Sequence[str] = ()
        self._batch_sizes: Sequence[int] = ()
        self._closed = False

    def requests(self, requests: Sequence[bytes], topics: Sequence[str], batch_sizes: Sequence[int]) -> Iterator[bytes]:
        """``requests`` as gRPC takes them, each starting its batch's span; ``topics`` has
        each message's topic, ``batch_sizes`` each request's message count."""
        self._topics, self._batch_sizes = topics, batch_sizes
        started = self._started_ns
        for request in requests:
            started.append(time.time_ns())
            yield request

    def acked(self) -> None:
        self._ended_ns.append(time.time_ns())

    def close(self, error: BaseException | None = None) -> None:
        """Make the spans: the batches acknowledged, then those still unacknowledged
        (the stream failed with ``error``, or was interrupted), ended now."""
        if self._closed:
            return
        self._closed = True
        from opentelemetry import trace

        from rmqstore.common.tracing import leaf_recorder

        now = time.time_ns()
        recorder = leaf_recorder()
        tracer = _tracer()
        # A file's batches mostly have one topic and the same size: their name and
        # attributes are worked out once (a finished span's attributes are only read).
        described: dict[tuple[str, int], tuple[str, dict[str, Any]]] = {}
        spans: list[tuple[str, dict[str, Any], int, int, trace.Status | None]] = []
        start = 0
        for number, (started, size) in enumerate(zip(self._started_ns, self._batch_sizes)):
            batch = self._topics[start : start + size]
            start += size
            key = (batch[0], size) if batch and batch.count(batch[0]) == size else None
            if key is not None and key in described:
                name, attributes = described[key]
            else:
                name, attributes = _span_name(batch), _messaging_attributes(batch)
                if key is not None:
                    described[key] = (name, attributes)
            acked = number < len(self._ended_ns)
            status = None
            if not acked and isinstance(error, grpc.RpcError):
                attributes = dict(attributes)
                status = _failure(attributes, error)
            spans.append((name, attributes, started, self._ended_ns[number] if acked else now, status))
        if recorder is None:
            for name, attributes, started, ended, status in spans:
                span = tracer.start_span(name, self._context, trace.SpanKind.CLIENT, attributes, start_time=started)
                if status is not None:
                    span.set_status(status)
                span.end(end_time=ended)
            return
        for first in range(0, len(spans), SPANS_PER_EXPORT):
            chunk = spans[first : first + SPANS_PER_EXPORT]
            index = 0
            while index < len(chunk):
                name, attributes, _, _, status = chunk[index]
                # A run of batches with one name and attributes, acknowledged: written once.
                end = index + 1
                if status is None:
                    while end < len(chunk) and chunk[end][0] == name and chunk[end][1] is attributes and chunk[end][4] is None:
                        end += 1
                run = chunk[index:end]
                if status is not None or not recorder.record_batch(
                    TRACER_NAME, name, [(each[2], each[3]) for each in run], attributes, trace.SpanKind.CLIENT, self._context
                ):
                    for name, attributes, started, ended, status in run:
                        recorder.record(
                            TRACER_NAME, name, started, ended, attributes, kind=trace.SpanKind.CLIENT,
                            parent=self._context, status=status,
                        )  # fmt: skip
                index = end
            if len(chunk) == SPANS_PER_EXPORT and not recorder.force_flush(EXPORT_TIMEOUT_S / 2):
                break


class _Details(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: Any
    compression: Any


class ClientSpans(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """A CLIENT span around each unary call but the sends (their PRODUCER spans are the
    calls' own), its context injected into the call's metadata."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint

    def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        method = client_call_details.method
        if method in SEND_METHODS:
            return continuation(client_call_details, request)
        from opentelemetry import trace

        from rmqstore.common import tracing as conventions

        attributes = _server_attributes(self.endpoint, method)
        topic = getattr(request, "topic", "")
        if topic:
            attributes[conventions.MESSAGING_SYSTEM] = conventions.ROCKETMQ
            attributes[conventions.MESSAGING_DESTINATION_NAME] = topic
        with _tracer().start_as_current_span(method.lstrip("/"), kind=trace.SpanKind.CLIENT, attributes=attributes) as span:
            details = _Details(
                method, client_call_details.timeout, _with_context(client_call_details.metadata),
                client_call_details.credentials, client_call_details.wait_for_ready, client_call_details.compression,
            )  # fmt: skip
            outcome = continuation(details, request)
            try:
                response = outcome.result()
            except grpc.RpcError as error:
                failed(span, error)
                return outcome
            span.set_attribute("rpc.grpc.status_code", grpc.StatusCode.OK.value[0])
            found = _result_count(response)
            if found is not None:
                span.set_attribute("rmqstore.results", found)
            return outcome


def _with_context(given: Any) -> list[tuple[str, str]]:
    from opentelemetry import propagate

    carrier: MutableMapping[str, str] = {}
    propagate.inject(carrier)
    return list(given or ()) + list(carrier.items())


def _result_count(response: Any) -> int | None:
    """How many messages a lookup's response holds, when it holds messages."""
    descriptor = getattr(response, "DESCRIPTOR", None)
    if descriptor is None:
        return None
    for name in ("messages", "records"):
        if name in descriptor.fields_by_name:
            return len(getattr(response, name))
    if "message" in descriptor.fields_by_name:
        return 1 if response.HasField("message") else 0
    return None


