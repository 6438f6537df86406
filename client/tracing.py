"""The client's spans and the W3C trace context it sends, when the standard ``OTEL_*``
variables ask for tracing (as the nodes read them, :mod:`rmqstore.common.telemetry`), or
when the program using the client installed an SDK tracer provider of its own.

* A send is a PRODUCER span ``send <topic>`` with the messaging and RPC attributes; its
  context travels in the call's metadata (the node's server span is its child) and in
  each message's ``traceparent`` property (the writer's append span, and a consumer,
  link to it), sent once a request in ``SendBatchRequest.shared_properties``. ``send
  --file`` is one such span for the file and a CLIENT span per batch.
* Every other call (the lookups, topic and flush calls) is a CLIENT span named by its
  method, with the lookup's topic and result count.

Every span is the SDK's, sampled by the provider's sampler (``OTEL_TRACES_SAMPLER``).
Nothing here imports OpenTelemetry until tracing is asked for: a command with tracing
off loads none of it."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterable, Iterator, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import grpc

from rmqstore.common import conventions
from rmqstore.common.errors import InvalidArgument
from rmqstore.common.sequences import all_equal

if TYPE_CHECKING:
    from opentelemetry import trace

SERVICE_NAME = "rmqstore-client"
TRACER_NAME = "rmqstore.client"

# The writer's calls that store messages: traced as PRODUCER spans by the calls themselves.
SEND_METHODS = frozenset(f"/rmqstore.v1.WriterService/{name}" for name in ("Send", "SendBatch", "SendStream"))

# A command exports its spans as it exits: an unreachable collector may delay its exit by
# this much at most (the SDK's default is 10 s of retries).
EXPORT_TIMEOUT_S = 2.0

# A send's batch spans are made once the send is over, and the batch span processor's
# queue exported each time this many are made (its default batch, well under its queue
# of 2,048): none is dropped from the queue however many batches the file has.
SPANS_PER_EXPORT = 512

_enabled: bool | None = None
_deciding = threading.Lock()


def enabled() -> bool:
    """Whether calls are traced: an SDK tracer provider is installed (by the program) or
    the environment asks for one (installed here, once)."""
    global _enabled
    if _enabled is None:
        with _deciding:  # calls on several threads may be deciding at once
            if _enabled is None:
                _enabled = _decide()
    return _enabled


def requested() -> bool:
    """Whether calls may be traced, decided without loading OpenTelemetry: the program
    installed an SDK tracer provider, or the environment asks for tracing."""
    if _enabled is not None:
        return _enabled
    if _program_provider():
        return True
    from rmqstore.common.telemetry import tracing_requested

    return tracing_requested() is not None


def _program_provider() -> bool:
    """Whether the program installed an SDK tracer provider (it has then loaded the API)."""
    if "opentelemetry.trace" not in sys.modules:
        return False
    from rmqstore.common.tracing import tracing_on

    return tracing_on()


def _decide() -> bool:
    if _program_provider():
        return True
    from rmqstore.common.telemetry import configure_tracing, tracing_requested

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
    return _send_attributes(_one_topic(topics), len(topics))


def _send_attributes(topic: str | None, count: int) -> dict[str, Any]:
    """The messaging attributes of a send of ``count`` messages, all to ``topic`` (None:
    to several topics)."""
    attributes: dict[str, Any] = {
        conventions.MESSAGING_SYSTEM: conventions.ROCKETMQ,
        conventions.MESSAGING_OPERATION_TYPE: "send",
        conventions.MESSAGING_OPERATION_NAME: "send",
    }
    if topic is not None:
        attributes[conventions.MESSAGING_DESTINATION_NAME] = topic
    if count != 1:
        attributes[conventions.MESSAGING_BATCH_MESSAGE_COUNT] = count
    return attributes


def _one_topic(topics: Sequence[str]) -> str | None:
    """The topic of every one of ``topics``, or None when they are several (a list's
    ``count`` is one pass in C, with no set made)."""
    return topics[0] if all_equal(topics) else None


def describe_file(span: trace.Span, topics: Sequence[str]) -> None:
    """The messaging attributes and name of ``send --file``'s span, once the file is read."""
    topic = _one_topic(topics)
    span.set_attributes(_send_attributes(topic, len(topics)))
    span.update_name(_name_of(topic))


def _span_name(topics: Sequence[str]) -> str:
    return _name_of(_one_topic(topics))


def _name_of(topic: str | None) -> str:
    return "send" if topic is None else f"send {topic}"


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

    attributes = _messaging_attributes(topics)
    if keys:
        attributes[conventions.MESSAGING_ROCKETMQ_KEYS] = list(keys)
    if tag:
        attributes[conventions.MESSAGING_ROCKETMQ_TAG] = tag
    attributes.update(_server_attributes(endpoint, f"/rmqstore.v1.WriterService/{method}"))
    with _tracer().start_as_current_span(_span_name(topics), kind=trace.SpanKind.PRODUCER, attributes=attributes) as made:
        try:
            yield made
        except grpc.RpcError as error:
            failed(made, error)
            raise


def succeeded(span: trace.Span) -> None:
    span.set_attribute("rpc.grpc.status_code", grpc.StatusCode.OK.value[0])


def failed(span: trace.Span, error: grpc.RpcError) -> None:
    attributes: dict[str, Any] = {}
    span.set_status(_failure(attributes, error))
    span.set_attributes(attributes)


def _failure_description(attributes: dict[str, Any], error: grpc.RpcError) -> str:
    """A failed call's ERROR status description, its code and name added to ``attributes``."""
    code = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
    attributes["rpc.grpc.status_code"] = code.value[0]
    attributes["error.type"] = code.name
    return f"{code.name}: {error.details() if isinstance(error, grpc.Call) else error}"


def _failure(attributes: dict[str, Any], error: grpc.RpcError) -> trace.Status:
    """A failed call's status, its code and name added to ``attributes``."""
    from opentelemetry.trace import Status, StatusCode

    return Status(StatusCode.ERROR, _failure_description(attributes, error))


def traceparent(span: trace.Span) -> str:
    from rmqstore.common.tracing import traceparent_of

    return traceparent_of(span.get_span_context())


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
    span.set_attribute(conventions.MESSAGING_MESSAGE_ID, uniq_key)


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
        self._parent = parent
        self._started_ns: list[int] = []
        self._ended_ns: list[int] = []
        self._topics: Sequence[str] = ()
        self._batch_sizes: Sequence[int] = ()
        self._closed = False

    def requests(self, requests: Iterable[bytes], topics: Sequence[str], batch_sizes: Sequence[int]) -> Iterator[bytes]:
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

        now = time.time_ns()
        tracer = _tracer()
        context = trace.set_span_in_context(self._parent)
        provider = trace.get_tracer_provider()
        # A file's batches mostly have one topic and the same size: their name and
        # attributes are worked out once.
        described: dict[tuple[str | None, int], tuple[str, dict[str, Any]]] = {}
        start = 0
        topics = self._topics
        for number, (started, size) in enumerate(zip(self._started_ns, self._batch_sizes)):
            key = (topics[start], 1) if size == 1 else (_one_topic(topics[start : start + size]), size)
            start += size
            if key in described:
                name, attributes = described[key]
            else:
                name, attributes = described[key] = (_name_of(key[0]), _send_attributes(*key))
            span = tracer.start_span(name, context, trace.SpanKind.CLIENT, attributes, start_time=started)
            if number < len(self._ended_ns):
                span.end(end_time=self._ended_ns[number])
            else:
                if isinstance(error, grpc.RpcError):
                    failed(span, error)
                span.end(end_time=now)
            if (number + 1) % SPANS_PER_EXPORT == 0 and not _flushed(provider, EXPORT_TIMEOUT_S / 2):
                break


def _flushed(provider: Any, slow_s: float) -> bool:
    """Export what ``provider``'s processors hold and wait for it; False when that took
    ``slow_s`` or longer (the collector is slow to answer, or away)."""
    flush = getattr(provider, "force_flush", None)
    if flush is None:
        return True
    began = time.monotonic()
    flush()
    return time.monotonic() - began < slow_s


class _Details(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: Any
    compression: Any


class ClientSpans(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """A CLIENT span around each unary call but the sends (their PRODUCER spans are the
    calls' own), its context injected into the call's metadata. Tracing is set up at the
    first such call (a channel that only sends never loads the SDK for it)."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint

    def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        method = client_call_details.method
        if method in SEND_METHODS or not enabled():
            return continuation(client_call_details, request)
        from opentelemetry import trace

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


