"""Spans from the store's layers (writer, query view) at no cost when tracing is off, the
messaging attributes they carry, and the trace context a message carries in its
properties."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import trace

from rmqstore.common.conventions import TRACEPARENT
from rmqstore.common.sequences import all_equal

if TYPE_CHECKING:
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
    one-message append path notices (benchmarks/TRACING.md)."""
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return nullcontext(trace.INVALID_SPAN)
    return tracer.start_as_current_span(name, kind=kind, links=links)


class LeafSpan(Protocol):
    """What a leaf span's block may do with its span: add an attribute or an event."""

    def set_attribute(self, key: str, value: AttributeValue) -> None: ...

    def add_event(self, name: str, attributes: Mapping[str, AttributeValue] | None = None) -> None: ...


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


def leaf_span(
    tracer: trace.Tracer, name: str, attributes: dict[str, Any] | None = None, links: list[trace.Link] | None = None
) -> AbstractContextManager[LeafSpan]:
    """:func:`span` for a span with no child spans, its attributes given up front (the
    SDK checks each attribute value it is given: the fewer, the cheaper), never made
    current. Sampled by the installed provider's sampler like any other span."""
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return nullcontext(trace.INVALID_SPAN)
    return _LeafSpan(tracer.start_span(name, attributes=attributes, links=links))


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
# batches, under one context, and parsing a value and making its Link is most of what
# the append span's links cost at one message a request.
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
