"""Spans from the store's layers (writer, query view) at no cost when tracing is off, the
messaging attributes they carry, and the trace context a message carries in its
properties."""

from __future__ import annotations

import functools
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import context as context_api
from opentelemetry import trace

from rmqstore.common.conventions import TRACEPARENT
from rmqstore.common.otlp import random_id
from rmqstore.common.sequences import all_equal

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.util.types import AttributeValue

# At most this many messages' contexts link one span: the SDK keeps 128 links a span by
# default, and a batch of 1,000 messages from one producer span carries one distinct context.
LINKS_MAX = 128


def tracing_on() -> bool:
    """Whether an SDK tracer provider is installed (the API's proxy means nobody did)."""
    return not isinstance(trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def span(
    tracer: trace.Tracer, name: str, kind: trace.SpanKind = trace.SpanKind.INTERNAL, links: list[trace.Link] | None = None
) -> AbstractContextManager[trace.Span]:
    """``tracer.start_as_current_span(name)``, or a do-nothing span while no SDK tracer
    provider is installed: the no-op API still attaches a context per span, a cost the
    one-message append path notices (about 5 µs a span)."""
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return nullcontext(trace.INVALID_SPAN)
    return tracer.start_as_current_span(name, kind=kind, links=links)


class LeafSpan(Protocol):
    """What a leaf span's block may do with its span: add an attribute."""

    def set_attribute(self, key: str, value: AttributeValue) -> None: ...


class _LeafSpan:
    """A span that has no children: started in the current context but never made current
    (attaching and detaching a context costs each span a few µs more), ended on exit, an
    escaping exception recorded on it as ``start_as_current_span`` would."""

    __slots__ = ("span",)

    def __init__(self, span: trace.Span):
        self.span = span

    def __enter__(self) -> trace.Span:
        return self.span

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, _: object) -> None:
        if error is not None and self.span.is_recording():
            self.span.record_exception(error)
            self.span.set_status(trace.Status(trace.StatusCode.ERROR, f"{kind.__name__ if kind else ''}: {error}"))
        self.span.end()


class LeafRecorder:
    """Records leaf spans once their work is done, as finished spans handed straight to
    the span processor of the tracer provider this process set up (sampled by its
    sampler, their ids from its id generator, exported by its exporter).

    A span made through the SDK's tracer costs 20-50 µs here, most of it in objects a
    span that is never current, never changed by another thread and ended where it
    started does not need (a lock for the span, one for its attributes, its events and
    its links, and a second, read-only copy made at its end). The writer makes two such
    spans per group of requests on its event loop, which is what bounds its throughput
    at one message a request; recorded this way a span costs a few µs. Only for a
    provider whose only span processor is known (the one :func:`record_leaf_spans`
    was given): another processor's ``on_start`` would never be called."""

    __slots__ = (
        "_default_sampler",
        "_emit",
        "_encoded",
        "_encoder",
        "_event",
        "_ids",
        "_new_span_id",
        "_plain",
        "_processor",
        "_provider",
        "_readable",
        "_resource",
        "_sampler",
        "_scope",
        "_scopes",
    )  # fmt: skip

    def __init__(self, provider: TracerProvider, processor: SpanProcessor):
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
        from opentelemetry.sdk.trace.sampling import DEFAULT_ON
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        self._readable = ReadableSpan
        self._event = Event
        self._scope = InstrumentationScope
        self._provider = provider
        self._processor = processor
        self._sampler = provider.sampler
        # The default sampler (the parent's decision, else sampled), decided here without
        # the objects its call makes.
        self._default_sampler = self._sampler is DEFAULT_ON
        self._ids = provider.id_generator
        self._resource = provider.resource
        self._scopes: dict[str, Any] = {}
        # Where the processor is the SDK's batch processor exporting with this package's
        # OTLP exporter, a span is written in OTLP's format as it is recorded and queued
        # as those bytes (no SDK span object is made); else it is handed on as an SDK span.
        self._emit: Callable[[Any], None] | None = None
        self._encoder: Any = None
        self._encoded: Any = None
        queue = getattr(processor, "_batch_processor", None)
        exporter = getattr(queue, "_exporter", None)
        if queue is not None and hasattr(queue, "emit"):
            from rmqstore.common.otlp import EncodedSpan, EncodingExporter

            if isinstance(exporter, EncodingExporter):
                self._emit, self._encoder, self._encoded = queue.emit, exporter.encoder, EncodedSpan
        # Spans written as bytes under the default sampler take the short path in record().
        self._plain = self._emit is not None and self._default_sampler
        # The SDK's random id generator draws a span id as random.getrandbits(64), drawn
        # again while zero: drawn here as it draws it (random_id), without its method call.
        self._new_span_id: Callable[[], int] = (
            functools.partial(random_id, 64) if type(self._ids) is RandomIdGenerator else self._ids.generate_span_id
        )

    def active(self) -> bool:
        return trace.get_tracer_provider() is self._provider

    def _instrumentation(self, scope: str) -> Any:
        """The instrumentation scope named ``scope``, made once."""
        found = self._scopes.get(scope)
        if found is None:
            found = self._scopes[scope] = self._scope(scope)
        return found

    def record(
        self,
        scope: str,
        name: str,
        start_ns: int,
        end_ns: int,
        attributes: dict[str, Any] | None = None,
        links: Sequence[trace.Link] = (),
        kind: trace.SpanKind = trace.SpanKind.INTERNAL,
        error: BaseException | None = None,
        parent: context_api.Context | None = None,
        status: trace.Status | None = None,
        ids: tuple[int, int] | None = None,
    ) -> None:
        """Record the span ``name`` of the instrumentation scope ``scope`` that ran from
        ``start_ns`` to ``end_ns`` (``time.time_ns()``), a child of the current span (or
        of ``parent``'s), failed with ``error`` if given (or ended with ``status``).
        ``ids`` are a root span's trace and span ids, drawn before this recorder existed
        (a send whose context went out before the SDK was loaded), else they are drawn
        here by the provider's id generator."""
        if self._plain and ids is None and error is None and status is None:
            # The usual span (written as bytes under the default sampler, its parent the
            # current span): what the general path below does, with none of its choices.
            context = trace.get_current_span(parent).get_span_context()
            if context.span_id and context.trace_id:
                if context.trace_flags & 1:  # sampled
                    span_id = self._new_span_id()
                    data = self._encoder.span_bytes(
                        context.trace_id, span_id, context.trace_state, context, name, kind.value, start_ns, end_ns,
                        attributes, links, _UNSET,
                    )  # fmt: skip
                    instrumentation = self._scopes.get(scope) or self._instrumentation(scope)
                    self._emit(self._encoded(data, self._resource, instrumentation))  # type: ignore[misc]
                return
        parent_context = trace.get_current_span(parent).get_span_context()
        parent_span = parent_context if parent_context.is_valid and ids is None else None
        if ids is not None:
            trace_id, span_id = ids
        else:
            trace_id = parent_context.trace_id if parent_span is not None else self._ids.generate_trace_id()
            span_id = 0  # drawn once the span is sampled, as the SDK draws it
        if self._default_sampler:
            if parent_span is not None and not parent_context.trace_flags.sampled:
                return
            trace_state = parent_context.trace_state if parent_span is not None else None
        else:
            sampled = self._sampler.should_sample(parent, trace_id, name, kind, attributes, links)
            if not sampled.decision.is_sampled():  # type: ignore[no-untyped-call]
                # Recorded but not sampled is exported by no processor: nothing to hand on.
                return
            if sampled.attributes:
                attributes = {**(attributes or {}), **sampled.attributes}
            trace_state = sampled.trace_state
        instrumentation = self._instrumentation(scope)
        if not span_id:
            span_id = self._ids.generate_span_id()
        if status is None:
            status = _UNSET if error is None else trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}")
        if self._emit is not None and error is None:
            data = self._encoder.span_bytes(
                trace_id, span_id, trace_state, parent_span, name, kind.value, start_ns, end_ns,
                attributes, links, status,
            )  # fmt: skip
            self._emit(self._encoded(data, self._resource, instrumentation))
            return
        # The sampled flag, and the parent's other flags (the random trace id flag).
        flags = trace.TraceFlags((int(parent_span.trace_flags) if parent_span is not None else 0) | trace.TraceFlags.SAMPLED)
        span_context = trace.SpanContext(trace_id, span_id, is_remote=False, trace_flags=flags, trace_state=trace_state)
        events: tuple[Any, ...] = ()
        if error is not None:
            events = (
                self._event(
                    "exception",
                    {
                        "exception.type": _exception_type(error),
                        "exception.message": str(error),
                        "exception.stacktrace": "".join(traceback.format_exception(error)),
                        "exception.escaped": "False",
                    },
                    end_ns,
                ),
            )
        self._processor.on_end(
            self._readable(
                name, span_context, parent_span, self._resource, attributes or {}, events, tuple(links), kind,
                status=status, start_time=start_ns, end_time=end_ns, instrumentation_scope=instrumentation,
            )  # fmt: skip
        )


    def record_batch(
        self,
        scope: str,
        name: str,
        times: Iterable[tuple[int, int]],
        attributes: dict[str, Any] | None = None,
        kind: trace.SpanKind = trace.SpanKind.INTERNAL,
        parent: context_api.Context | None = None,
    ) -> bool:
        """:meth:`record` of a span per ``(start_ns, end_ns)`` of ``times``: spans of one
        name, kind and attributes, their status unset, children of ``parent``'s span,
        differing only in ids and times (a send's batches). Where spans are written as
        bytes under the default sampler, the parent's decision is each one's, and what
        they share is written once; else (or with no parent span) nothing is recorded and
        False is returned: each is for :meth:`record`."""
        if self._emit is None or not self._default_sampler:
            return False
        parent_context = trace.get_current_span(parent).get_span_context()
        if not parent_context.is_valid:
            return False  # each a root span, of a trace of its own
        if not parent_context.trace_flags.sampled:
            return True
        instrumentation = self._instrumentation(scope)
        from rmqstore.common.otlp import span_head, span_times

        middle, tail = self._encoder.span_parts(parent_context.trace_state, parent_context, name, kind.value, attributes, (), _UNSET)
        trace_id, new_id = parent_context.trace_id, self._ids.generate_span_id
        emit, encoded, resource = self._emit, self._encoded, self._resource
        for start_ns, end_ns in times:
            emit(encoded(b"".join((span_head(trace_id, new_id()), middle, span_times(start_ns, end_ns), tail)), resource, instrumentation))
        return True

    def force_flush(self, slow_s: float) -> bool:
        """Export what the processor holds and wait for it; False when that took
        ``slow_s`` or longer (the collector is slow to answer, or away)."""
        began = time.monotonic()
        self._processor.force_flush()
        return time.monotonic() - began < slow_s


def _exception_type(error: BaseException) -> str:
    """An exception's type as the SDK's ``record_exception`` names it."""
    module, name = type(error).__module__, type(error).__qualname__
    return f"{module}.{name}" if module and module != "builtins" else name


_recorder: LeafRecorder | None = None
_UNSET = trace.Status(trace.StatusCode.UNSET)


def record_leaf_spans(provider: TracerProvider, processor: SpanProcessor) -> None:
    """Let leaf spans go straight to ``processor``, the only span processor of
    ``provider`` (what this process's tracing set-up installed)."""
    global _recorder
    _recorder = LeafRecorder(provider, processor)


def leaf_recorder() -> LeafRecorder | None:
    """The recorder of leaf spans, while the provider it was made for is the installed one."""
    recorder = _recorder
    return recorder if recorder is not None and recorder.active() else None


class _RecordedLeaf:
    """A leaf span recorded once its block ends (:class:`LeafRecorder`)."""

    __slots__ = ("attributes", "links", "name", "recorder", "scope", "start_ns")

    def __init__(
        self, recorder: LeafRecorder, scope: str, name: str, attributes: dict[str, Any] | None, links: list[trace.Link] | None
    ):
        self.recorder = recorder
        self.scope = scope
        self.name = name
        self.attributes = attributes
        self.links = links or ()
        self.start_ns = 0

    def __enter__(self) -> _RecordedLeaf:
        self.start_ns = time.time_ns()
        return self

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        if self.attributes is None:
            self.attributes = {}
        self.attributes[key] = value

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, _: object) -> None:
        self.recorder.record(self.scope, self.name, self.start_ns, time.time_ns(), self.attributes, self.links, error=error)


def leaf_span(
    tracer: trace.Tracer, name: str, attributes: dict[str, Any] | None = None, links: list[trace.Link] | None = None
) -> AbstractContextManager[LeafSpan]:
    """:func:`span` for a span with no child spans, its attributes given up front (the
    SDK checks each attribute value it is given: the fewer, the cheaper); recorded when
    its block ends where this process set up tracing (:class:`LeafRecorder`)."""
    provider = trace.get_tracer_provider()
    recorder = _recorder
    if recorder is not None and recorder._provider is provider:  # leaf_recorder(), the provider read once
        scope = _scope_names.get(tracer)
        return _RecordedLeaf(recorder, scope if scope is not None else _scope_name(tracer), name, attributes, links)
    if isinstance(provider, trace.ProxyTracerProvider):
        return nullcontext(trace.INVALID_SPAN)
    return _LeafSpan(tracer.start_span(name, attributes=attributes, links=links))


# Each tracer's scope name, read once (a node's layers each keep one tracer).
_scope_names: dict[trace.Tracer, str] = {}


def _scope_name(tracer: trace.Tracer) -> str:
    """The instrumentation scope a tracer names: ``trace.get_tracer(name)`` called before
    a provider is installed gives the API's proxy, which keeps the name it was given; the
    SDK's tracer keeps it in its instrumentation info."""
    name = getattr(tracer, "_instrumenting_module_name", None)
    if name is None:
        name = getattr(getattr(tracer, "instrumentation_info", None), "name", None)
    scope = str(name or "rmqstore")
    if len(_scope_names) < 64:
        _scope_names[tracer] = scope
    return scope


def context_from_traceparent(value: str) -> trace.SpanContext | None:
    """The span context a W3C ``traceparent`` value names (version 00), or None when it is
    malformed or names the invalid trace or span: a message's property is whatever its
    producer wrote, so a bad one links nothing rather than failing anything."""
    parts = value.strip().split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or parts[0] == "ff":
        return None
    version, trace_hex, span_hex, flags_hex = parts[:4]
    if len(trace_hex) != 32 or len(span_hex) != 16 or len(flags_hex) != 2 or (version == "00" and len(parts) != 4):
        return None
    try:
        trace_id, span_id, flags = int(trace_hex, 16), int(span_hex, 16), int(flags_hex, 16)
    except ValueError:
        return None
    if trace_id == 0 or span_id == 0 or trace_hex != trace_hex.lower() or span_hex != span_hex.lower():
        return None
    return trace.SpanContext(trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(flags & 0x01))


def link_from_properties(properties: Mapping[str, str]) -> trace.Link | None:
    """A span Link to the producer context a message's properties carry (its
    ``traceparent``), or None. A consumer's receive or process span passes it in
    ``links=`` so one trace runs from the producer to the consumer."""
    value = properties.get(TRACEPARENT)
    if not value:
        return None
    context = context_from_traceparent(value)
    return None if context is None else trace.Link(context)


# The links of the traceparent values seen last: a producer sends many messages, or
# batches, under one context, and parsing a value and making its Link is most of what a
# dispatch span costs at one message a request.
_LINKS_SEEN_MAX = 1024
_links_seen: dict[str, trace.Link | None] = {}


def _link_of(value: str) -> trace.Link | None:
    try:
        return _links_seen[value]
    except KeyError:
        pass
    context = context_from_traceparent(value)
    link = None if context is None else trace.Link(context)
    if len(_links_seen) >= _LINKS_SEEN_MAX:
        _links_seen.clear()
    _links_seen[value] = link
    return link


def links_from_messages(properties: Iterable[Mapping[str, str]]) -> list[trace.Link]:
    """One Link per distinct producer context among messages' properties, in the order
    first seen, at most :data:`LINKS_MAX`."""
    if isinstance(properties, list) and all_equal(properties):
        # One mapping for every message (a request's shared trace context), or equal
        # ones: counted in C (by identity first), read once.
        properties = properties[:1]
    seen: dict[str, trace.Link] = {}
    last: Mapping[str, str] | None = None
    for each in properties:
        if each is last:
            continue  # the messages of a request mostly share one mapping: read once
        last = each
        value = each.get(TRACEPARENT) if each else None
        if not value or value in seen:
            continue
        link = _link_of(value)
        if link is not None:
            seen[value] = link
            if len(seen) >= LINKS_MAX:
                break
    return list(seen.values())


def traceparent_of(context: trace.SpanContext) -> str:
    """The W3C ``traceparent`` value naming ``context``."""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
