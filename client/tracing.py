"""The client's spans and the W3C trace context it sends, when the standard ``OTEL_*``
variables ask for tracing (as the nodes read them, :mod:`rmqstore.service.telemetry`), or
when the program using the client installed an SDK tracer provider of its own.

* A send is a PRODUCER span ``send <topic>`` with the messaging and RPC attributes; its
  context travels in the call's metadata (the node's server span is its child) and in
  each message's ``traceparent`` property (the writer's dispatch span, and a consumer,
  link to it), sent once a request in ``SendBatchRequest.shared_properties``. ``send
  --file`` is one such span for the file and a CLIENT span per batch. Where this process
  sets tracing up itself, the send's span is a :class:`LateSpan`: its context goes out
  before the SDK is loaded, and a command's (``one_shot``) is written and exported
  without the SDK where it can be (:mod:`rmqstore.client.late_export`).
* Every other call (the lookups, topic and flush calls) is a CLIENT span named by its
  method, with the lookup's topic and result count.

Nothing here imports OpenTelemetry until a span is made (a late span's, only once its
call is under way)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import grpc

from rmqstore.common import conventions
from rmqstore.common.conventions import TRACEPARENT
from rmqstore.common.errors import InvalidArgument
from rmqstore.common.sequences import all_equal

if TYPE_CHECKING:
    from opentelemetry import trace

    from rmqstore.client.late_export import LateExport

SERVICE_NAME = "rmqstore-client"
TRACER_NAME = "rmqstore.client"

# The writer's calls that store messages: traced as PRODUCER spans by the calls themselves.
SEND_METHODS = frozenset(f"/rmqstore.v1.WriterService/{name}" for name in ("Send", "SendBatch", "SendStream"))

# A command exports its spans as it exits: an unreachable collector may delay its exit by
# this much at most (the SDK's default is 10 s of retries).
EXPORT_TIMEOUT_S = 2.0

# A send's batch spans go to the exporter this many at a time, once the send is over: the
# batch span processor's default batch, well under its queue (2,048).
SPANS_PER_EXPORT = 512

_enabled: bool | None = None
_deciding = threading.Lock()


def enabled() -> bool:
    """Whether calls are traced: an SDK tracer provider is installed (by the program) or
    the environment asks for one (installed here, once)."""
    global _enabled
    if _enabled is None:
        with _deciding:  # a late span's thread may be deciding meanwhile
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
    from rmqstore.service.telemetry import tracing_requested

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


def describe_file(span: trace.Span | LateSpan, topics: Sequence[str]) -> None:
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
    endpoint: str, method: str, topics: Sequence[str], keys: Sequence[str] = (), tag: str = "", *, one_shot: bool = False
) -> Iterator[trace.Span | LateSpan | None]:
    """A PRODUCER span ``send <topic>`` around a send of ``topics``' messages (with a
    single message's ``keys`` and ``tag``); None (and no cost) when tracing is off. Where
    this process sets tracing up from the variables with the SDK's default sampler, ids
    and propagators, a :class:`LateSpan` (its context goes out before the SDK is loaded);
    else an SDK span, current while the block runs. ``one_shot``: the process exits after
    this send (a command), and its spans may be exported without the SDK."""
    late = _late_possible()
    if not late and not enabled():
        yield None
        return
    attributes = _messaging_attributes(topics)
    if keys:
        attributes[conventions.MESSAGING_ROCKETMQ_KEYS] = list(keys)
    if tag:
        attributes[conventions.MESSAGING_ROCKETMQ_TAG] = tag
    attributes.update(_server_attributes(endpoint, f"/rmqstore.v1.WriterService/{method}"))
    if late:
        span = LateSpan(_span_name(topics), attributes, one_shot)
        try:
            yield span
        except grpc.RpcError as error:
            failed(span, error)
            span.end(error)
            raise
        except BaseException as error:
            span.end(error)
            raise
        span.end()
        return
    from opentelemetry import trace

    with _tracer().start_as_current_span(_span_name(topics), kind=trace.SpanKind.PRODUCER, attributes=attributes) as made:
        try:
            yield made
        except grpc.RpcError as error:
            failed(made, error)
            raise


# The variables' values under which the SDK would sample, draw ids and propagate a root
# span as a LateSpan does (unset is the default).
_DEFAULT_SAMPLERS = ("", "parentbased_always_on")
_DEFAULT_ID_GENERATORS = ("", "random")
_DEFAULT_PROPAGATORS = ("", "tracecontext,baggage")


def _late_possible() -> bool:
    """Whether a send's span can be a :class:`LateSpan`: tracing is not decided yet, the
    program has not loaded OpenTelemetry (its own provider would be used), and the
    variables ask for OTLP with the SDK's defaults (:func:`sdk_defaults`) and no span
    limits (the span is recorded whole, by ids drawn here)."""
    if _enabled is not None or "opentelemetry.trace" in sys.modules:
        return False
    from rmqstore.service.telemetry import span_limits_set, tracing_requested

    return tracing_requested() == "otlp" and sdk_defaults(os.environ) and not span_limits_set(os.environ)


def sdk_defaults(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` leaves the SDK's sampler, id generator and propagators at their
    defaults, under which a root span is sampled, has random ids and travels as its
    ``traceparent`` alone."""
    propagators = ",".join(p.strip().lower() for p in environ.get("OTEL_PROPAGATORS", "").split(",") if p.strip())
    return (
        environ.get("OTEL_TRACES_SAMPLER", "").strip().lower() in _DEFAULT_SAMPLERS
        and environ.get("OTEL_PYTHON_ID_GENERATOR", "").strip().lower() in _DEFAULT_ID_GENERATORS
        and propagators in _DEFAULT_PROPAGATORS
    )


class LateSpan:
    """A send's PRODUCER span whose context goes out before OpenTelemetry's SDK is loaded.

    Loading the SDK and setting tracing up takes a command about 25 ms, and a send needs
    its span's context before its first message is stamped with it. This span draws its
    ids as the SDK's id generator would (the SDK's default sampler samples a root span,
    so its context is known: ``00-<trace id>-<span id>-01``); :func:`metadata` hands the
    context to the call and starts setting tracing up on a thread, while the messages
    are on their way; and the span is recorded (:class:`~rmqstore.common.tracing.LeafRecorder`,
    with these ids) when the send is over. It is never current: nothing in a send makes
    a span under it but its batch spans, which name it as their parent.

    A ``one_shot`` span (a command's send, after which the process exits) is written and
    exported with its batch spans by a :class:`~rmqstore.client.late_export.LateExport`,
    the SDK never loaded, where the variables allow
    (:func:`rmqstore.client.late_export.possible`)."""

    def __init__(self, name: str, attributes: dict[str, Any], one_shot: bool = False):
        self.name = name
        self.attributes = attributes
        from rmqstore.common.otlp import random_id

        self.trace_id = random_id(128)
        self.span_id = random_id(64)
        self.start_ns = time.time_ns()
        self.failure: str | None = None  # an ERROR status's description
        self.late: LateExport | None = None  # set up instead of the SDK
        self._one_shot = one_shot
        self._loader: threading.Thread | None = None
        self._refused: InvalidArgument | None = None
        self._on = False
        self._ended = False

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-01"

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def set_attributes(self, attributes: dict[str, Any]) -> None:
        self.attributes.update(attributes)

    def update_name(self, name: str) -> None:
        self.name = name

    def load(self) -> None:
        """Set tracing up on a thread of its own (once)."""
        if self._loader is None:
            self._loader = threading.Thread(target=self._load, name="tracing-set-up", daemon=True)
            self._loader.start()

    def _load(self) -> None:
        try:
            self._on = self._load_late() or enabled()
        except InvalidArgument as error:
            self._refused = error

    def _load_late(self) -> bool:
        """Set a :class:`~rmqstore.client.late_export.LateExport` up, where this span may
        have one; whether it did. An exporter setting it refuses is said in one line, as
        the SDK path says it, and leaves tracing off."""
        if not self._one_shot:
            return False
        from rmqstore.client import late_export

        if not late_export.possible(os.environ):
            return False
        try:
            self.late = late_export.LateExport(SERVICE_NAME, TRACER_NAME, EXPORT_TIMEOUT_S)
        except ValueError as error:
            global _enabled
            logging.getLogger("rmqstore.common.otlp").error("spans are not exported: the OTLP exporter could not be set up: %s", error)
            _enabled = False
            return False
        return True

    def loaded(self) -> bool:
        """Wait for tracing to be set up; whether this span and its children are recorded."""
        self.load()
        assert self._loader is not None
        self._loader.join()
        if self._refused is not None:
            raise self._refused
        return self._on

    def parent(self) -> Any:
        """A context whose span is this one (for its children), once loaded."""
        from opentelemetry import trace

        context = trace.SpanContext(self.trace_id, self.span_id, is_remote=False, trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))
        return trace.set_span_in_context(trace.NonRecordingSpan(context))

    def end(self, error: BaseException | None = None) -> None:
        """Record the span, ended now; ``error`` escaped its block."""
        if self._ended:
            return
        self._ended = True
        end_ns = time.time_ns()
        if not self.loaded():
            return
        late = self.late
        if late is not None:
            if error is None:
                from rmqstore.client.late_export import PRODUCER

                late.add(self.trace_id, self.span_id, None, self.name, PRODUCER, self.start_ns, end_ns, self.attributes, self.failure)
                late.export()
                return
            # An exception escaped the send: it is recorded on the span by the SDK.
            late.export()
            if not enabled():
                return
        from opentelemetry import trace

        from rmqstore.common.tracing import leaf_recorder

        recorder = leaf_recorder()
        if recorder is None:
            return  # the provider set up here was replaced meanwhile
        status = None if self.failure is None else trace.Status(trace.StatusCode.ERROR, self.failure)
        recorder.record(
            TRACER_NAME, self.name, self.start_ns, end_ns, self.attributes, kind=trace.SpanKind.PRODUCER,
            error=error, status=status, ids=(self.trace_id, self.span_id),
        )  # fmt: skip


def succeeded(span: trace.Span | LateSpan) -> None:
    span.set_attribute("rpc.grpc.status_code", grpc.StatusCode.OK.value[0])


def failed(span: trace.Span | LateSpan, error: grpc.RpcError) -> None:
    attributes: dict[str, Any] = {}
    if isinstance(span, LateSpan):
        span.failure = _failure_description(attributes, error)
    else:
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


def traceparent(span: trace.Span | LateSpan) -> str:
    if isinstance(span, LateSpan):
        return span.traceparent
    from rmqstore.common.tracing import traceparent_of

    return traceparent_of(span.get_span_context())


def metadata(span: trace.Span | LateSpan | None) -> tuple[tuple[str, str], ...] | None:
    """The call metadata carrying the current context (``traceparent``, and whatever else
    the configured propagators add), or None without a span. A late span's context is
    its ``traceparent`` (the default propagators add nothing else to a context with no
    baggage), and its call is under way: tracing is set up meanwhile."""
    if span is None:
        return None
    if isinstance(span, LateSpan):
        span.load()
        return ((TRACEPARENT, span.traceparent),)
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return tuple(carrier.items())


def acknowledged(span: trace.Span | LateSpan, uniq_key: str) -> None:
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

    def __init__(self, parent: trace.Span | LateSpan):
        self._parent = parent
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
        now = time.time_ns()
        parent = self._parent
        if isinstance(parent, LateSpan) and not parent.loaded():
            return
        # A file's batches mostly have one topic and the same size: their name and
        # attributes are worked out once (a finished span's attributes are only read).
        described: dict[tuple[str | None, int], tuple[str, dict[str, Any]]] = {}
        spans: list[tuple[str, dict[str, Any], int, int, str | None]] = []  # the last: an ERROR status's description
        start = 0
        topics = self._topics
        for number, (started, size) in enumerate(zip(self._started_ns, self._batch_sizes)):
            key = (topics[start], 1) if size == 1 else (_one_topic(topics[start : start + size]), size)
            start += size
            if key in described:
                name, attributes = described[key]
            else:
                name, attributes = described[key] = (_name_of(key[0]), _send_attributes(*key))
            acked = number < len(self._ended_ns)
            failure = None
            if not acked and isinstance(error, grpc.RpcError):
                attributes = dict(attributes)
                failure = _failure_description(attributes, error)
            spans.append((name, attributes, started, self._ended_ns[number] if acked else now, failure))
        if isinstance(parent, LateSpan) and parent.late is not None:
            from rmqstore.client.late_export import CLIENT

            parent.late.add_batches(parent.trace_id, parent.span_id, CLIENT, spans)
            return
        self._record(spans)

    def _record(self, spans: Sequence[tuple[str, dict[str, Any], int, int, str | None]]) -> None:
        """The batches' spans, through the SDK's tracer provider."""
        from opentelemetry import trace

        from rmqstore.common.tracing import leaf_recorder

        parent = self._parent
        context = parent.parent() if isinstance(parent, LateSpan) else trace.set_span_in_context(parent)
        recorder = leaf_recorder()
        if recorder is None:
            tracer = _tracer()
            for name, attributes, started, ended, failure in spans:
                span = tracer.start_span(name, context, trace.SpanKind.CLIENT, attributes, start_time=started)
                if failure is not None:
                    span.set_status(trace.Status(trace.StatusCode.ERROR, failure))
                span.end(end_time=ended)
            return
        for first in range(0, len(spans), SPANS_PER_EXPORT):
            chunk = spans[first : first + SPANS_PER_EXPORT]
            # The chunk's acknowledged batches of one name and attributes, each such set
            # written as one run however they interleave (a file's topics may take turns
            # batch by batch); then the failed ones, each on its own.
            runs: dict[tuple[str, int], tuple[str, dict[str, Any], list[tuple[int, int]]]] = {}
            failed = []
            for each in chunk:
                name, attributes, started, ended, failure = each
                if failure is not None:
                    failed.append(each)
                    continue
                run = runs.get((name, id(attributes)))
                if run is None:
                    run = runs[(name, id(attributes))] = (name, attributes, [])
                run[2].append((started, ended))
            singles: list[tuple[str, dict[str, Any], int, int, str | None]] = []
            for name, attributes, times in runs.values():
                if not recorder.record_batch(TRACER_NAME, name, times, attributes, trace.SpanKind.CLIENT, context):
                    singles.extend((name, attributes, started, ended, None) for started, ended in times)
            for name, attributes, started, ended, failure in singles + failed:
                status = None if failure is None else trace.Status(trace.StatusCode.ERROR, failure)
                recorder.record(
                    TRACER_NAME, name, started, ended, attributes, kind=trace.SpanKind.CLIENT, parent=context, status=status,
                )  # fmt: skip
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


