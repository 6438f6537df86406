"""The encoding of the OTLP/gRPC span exporter the nodes and the client install
(:mod:`rmqstore.common.otlp_exporter`), done from bytes rather than through a protobuf
object per field.

The SDK's encoder builds a ``Span`` message per span, a ``KeyValue`` and an ``AnyValue``
per attribute and a ``Status`` and ``Link`` per status and link, each through protobuf's
keyword constructor: about 20 µs a span, on a thread of the exporting process and so on
its GIL. At one message a request the writer exports two spans a message and the command
one, and this encoding was the larger part of what tracing cost them. Here each span's
fields are written in protobuf's wire format directly, its attributes from a cache of
each (key, value) pair's encoded bytes (a process's spans repeat the same few names and
values), and the request goes to the channel as those bytes: the same request the SDK's
encoder makes, field for field (tests hold the two equal on spans of every shape). A
span's events (an exception recorded) are encoded by the SDK's encoder, and so is a span
this encoding fails on.

Spans recorded by :class:`~rmqstore.common.tracing.LeafRecorder` skip the SDK's span
objects altogether: they are written in this format as they are recorded
(:class:`EncodedSpan`) and queued as bytes. Importing this module loads no OpenTelemetry
module: the SDK's encoder is loaded by the first span that needs it (an SDK span, an
attribute value of a type not written here), so a command that writes its spans here
(:mod:`rmqstore.client.late_export`) never loads it."""

from __future__ import annotations

import logging
import random
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from rmqstore.common.conventions import MESSAGING_MESSAGE_ID

if TYPE_CHECKING:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import Link, TraceState

_logger = logging.getLogger(__name__)

# Field tags (field number << 3 | wire type) of the messages written here, from
# opentelemetry-proto's trace.proto and trace_service.proto.
_REQUEST_RESOURCE_SPANS = b"\x0a"  # ExportTraceServiceRequest.resource_spans = 1
_RESOURCE = b"\x0a"  # ResourceSpans.resource = 1
_SCOPE_SPANS = b"\x12"  # ResourceSpans.scope_spans = 2
_SCHEMA_URL = b"\x1a"  # ResourceSpans.schema_url = 3, ScopeSpans.schema_url = 3
_SCOPE = b"\x0a"  # ScopeSpans.scope = 1
_SPANS = b"\x12"  # ScopeSpans.spans = 2
# Span and Link: trace_id = 1 (16 bytes), span_id = 2 (8 bytes), the head of each.
_IDS = struct.Struct(">2s QQ 2s Q")
_TRACE_STATE = b"\x1a"  # Span.trace_state = 3
_PARENT = struct.Struct(">2s Q")  # Span.parent_span_id = 4 (8 bytes)
_NAME = b"\x2a"  # Span.name = 5
_KIND = 0x30  # Span.kind = 6, varint
_TIMES = struct.Struct("<BQBQ")  # Span.start_time_unix_nano = 7, end_time_unix_nano = 8, fixed64
_ATTRIBUTE = b"\x4a"  # Span.attributes = 9
_DROPPED_ATTRIBUTES = 0x50  # Span.dropped_attributes_count = 10, varint
_EVENT = b"\x5a"  # Span.events = 11
_DROPPED_EVENTS = 0x60  # Span.dropped_events_count = 12
_LINK = b"\x6a"  # Span.links = 13
_DROPPED_LINKS = 0x70  # Span.dropped_links_count = 14
_STATUS = b"\x7a"  # Span.status = 15
# Link: trace_id = 1, span_id = 2 (as a span's), attributes = 4, dropped_attributes_count = 5,
# flags = 6 (fixed32).
_LINK_ATTRIBUTE = b"\x22"
_LINK_DROPPED_ATTRIBUTES = 0x28
_LINK_FLAGS = struct.Struct("<BI")
# Status: message = 2, code = 3 (varint).
_STATUS_MESSAGE = b"\x12"
_STATUS_CODE = 0x18

# SpanFlags: the context's is-remote bit is known (always, from this SDK), and is set.
_HAS_IS_REMOTE = 0x100
_IS_REMOTE = 0x200

# Span.flags = 16, fixed32 (tag 133 as a varint): the parent's is-remote bit is known
# (always, from this SDK), and set when the parent is remote.
_LOCAL_FLAGS = struct.pack("<2sI", b"\x85\x01", _HAS_IS_REMOTE)
_REMOTE_PARENT_FLAGS = struct.pack("<2sI", b"\x85\x01", _HAS_IS_REMOTE | _IS_REMOTE)
_EMPTY_STATUS = _STATUS + b"\x00"
# Resource: attributes = 1. InstrumentationScope: name = 1.
_RESOURCE_ATTRIBUTE = b"\x0a"
_SCOPE_NAME = b"\x0a"
# AnyValue.array_value = 5; ArrayValue.values = 1.
_ARRAY_VALUE = b"\x2a"
_ARRAY_ITEM = b"\x0a"


class StatusLike(Protocol):
    """What the encoder reads of a span's status: the API's ``Status``, or :data:`UNSET`."""

    @property
    def is_unset(self) -> bool: ...

    @property
    def description(self) -> str | None: ...

    @property
    def status_code(self) -> Any: ...


class ParentLike(Protocol):
    """What the encoder reads of a span's parent: the API's ``SpanContext``, or a :class:`Parent`."""

    @property
    def span_id(self) -> int: ...

    @property
    def is_remote(self) -> bool: ...


class _Code(NamedTuple):
    value: int


class _Status(NamedTuple):
    is_unset: bool
    description: str | None
    status_code: _Code


# An unset status (every span's until set) for spans written with no OpenTelemetry module
# loaded: encoded as the SDK encodes its ``Status(StatusCode.UNSET)``.
UNSET: StatusLike = _Status(True, None, _Code(0))


def error_status(description: str) -> StatusLike:
    """``Status(StatusCode.ERROR, description)``, for spans written with no OpenTelemetry
    module loaded."""
    return _Status(False, description, _Code(2))


class Parent(NamedTuple):
    """A span's parent, by its span id, for spans written with no OpenTelemetry module loaded."""

    span_id: int
    is_remote: bool = False

# Each attribute's encoded field, by (key, type of value, value, field tag): at most this
# many kept.
_ATTRIBUTES_KEPT = 4096
# Attributes whose value is new on each span (a message's id): written each time, never
# kept (they would only push the values that repeat out of the cache).
_NEW_EACH_SPAN = frozenset({MESSAGING_MESSAGE_ID})
# Each span's middle and tail kept (SpanEncoder.span_parts): at most this many of each.
_PARTS_KEPT = 1024


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _kept(cache: dict[Any, bytes], key: Any, most: int, make: Callable[[], bytes]) -> bytes:
    """``cache[key]``, made and kept if missing (the cache emptied once it holds ``most``)."""
    found = cache.get(key)
    if found is None:
        if len(cache) >= most:
            cache.clear()
        found = cache[key] = make()
    return found


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag, its length, its bytes."""
    size = len(payload)
    return tag + (bytes((size,)) if size < 0x80 else _varint(size)) + payload


class EncodedSpan:
    """A finished span already written as an OTLP ``Span`` message (``data``), with the
    resource and instrumentation scope it is exported under: what
    :class:`~rmqstore.common.tracing.LeafRecorder` hands the batch span processor when
    the processor's exporter is an :class:`EncodingExporter` (no SDK span object is made)."""

    __slots__ = ("data", "instrumentation_scope", "resource")

    def __init__(self, data: bytes, resource: Any, instrumentation_scope: Any):
        self.data = data
        self.resource = resource
        self.instrumentation_scope = instrumentation_scope


class SpanEncoder:
    """Spans to an ``ExportTraceServiceRequest``, written as bytes (see the module's
    doc). Its caches are only read and filled (a dict's single steps), so the recorder
    on a node's event loop and the exporter's thread can share one."""

    def __init__(self) -> None:
        self._attributes: dict[tuple[str, type, Any, bytes], bytes] = {}
        self._names: dict[str, bytes] = {}
        self._middles: dict[tuple[str, int, int | None], bytes] = {}
        self._tails: dict[tuple[bool, bool, tuple[tuple[int, int, bool], ...]], bytes] = {}
        self._tails_seen: dict[tuple[Any, ...], bytes] = {}
        self._resources: dict[Any, bytes] = {}
        self._scopes: dict[Any, bytes] = {}

    def encode(self, spans: Sequence[ReadableSpan | EncodedSpan]) -> ExportTraceServiceRequest:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        return ExportTraceServiceRequest.FromString(self.encode_bytes(spans))

    def encode_bytes(self, spans: Sequence[ReadableSpan | EncodedSpan]) -> bytes:
        # Grouped by resource, then by instrumentation scope, each in the order first
        # seen, as the SDK's encoder groups them (by equality; consecutive spans
        # mostly share both objects, so identity is tried first).
        groups: dict[Any, dict[Any, list[bytes]]] = {}
        last_resource: Any = None
        last_scope: Any = None
        encoded: list[bytes] | None = None
        for span in spans:
            resource, scope = span.resource, span.instrumentation_scope or None
            if encoded is None or resource is not last_resource or scope is not last_scope:
                encoded = groups.setdefault(resource, {}).setdefault(scope, [])
                last_resource, last_scope = resource, scope
            encoded.append(_field(_SPANS, span.data if isinstance(span, EncodedSpan) else self.readable_bytes(span)))
        out = []
        for resource, scopes in groups.items():
            parts = [self._resource(resource)]
            for scope, encoded_spans in scopes.items():
                scope_parts = [self._scope(scope), *encoded_spans]
                schema_url = scope.schema_url if scope else None
                if schema_url:
                    scope_parts.append(_field(_SCHEMA_URL, schema_url.encode()))
                parts.append(_field(_SCOPE_SPANS, b"".join(scope_parts)))
            if resource.schema_url:
                parts.append(_field(_SCHEMA_URL, resource.schema_url.encode()))
            out.append(_field(_REQUEST_RESOURCE_SPANS, b"".join(parts)))
        return b"".join(out)

    def _resource(self, resource: Any) -> bytes:
        def encode() -> bytes:
            from opentelemetry.exporter.otlp.proto.common._internal import _encode_resource

            return _field(_RESOURCE, _encode_resource(resource).SerializeToString())

        return _kept(self._resources, resource, 64, encode)

    def _scope(self, scope: Any) -> bytes:
        def encode() -> bytes:
            from opentelemetry.exporter.otlp.proto.common._internal import (
                _encode_instrumentation_scope,
            )

            return _field(_SCOPE, _encode_instrumentation_scope(scope).SerializeToString())

        return _kept(self._scopes, scope, 256, encode)

    def resource_field(self, attributes: Mapping[str, str | int | bool | float]) -> bytes:
        """A ``ResourceSpans.resource`` field: a resource of these attributes (scalars)
        and no schema, as the SDK's encoder writes it."""
        return _field(_RESOURCE, self._attributes_bytes(attributes, _RESOURCE_ATTRIBUTE))

    @staticmethod
    def scope_field(name: str) -> bytes:
        """A ``ScopeSpans.scope`` field: the instrumentation scope ``name`` (no version,
        attributes or schema), as the SDK's encoder writes a tracer's scope."""
        return _field(_SCOPE, _field(_SCOPE_NAME, name.encode()) if name else b"")

    @staticmethod
    def request_bytes(resource_field: bytes, scope_field: bytes, span_fields: Sequence[bytes]) -> bytes:
        """An ``ExportTraceServiceRequest`` of spans (each a ``ScopeSpans.spans`` field, from
        :func:`span_field_head`) under one resource and one scope (from
        :meth:`resource_field` and :meth:`scope_field`)."""
        scope_spans = _field(_SCOPE_SPANS, b"".join((scope_field, *span_fields)))
        return _field(_REQUEST_RESOURCE_SPANS, resource_field + scope_spans)

    def readable_bytes(self, span: ReadableSpan) -> bytes:
        """An SDK span's ``Span`` message (by the SDK's own encoder if this one fails on it)."""
        from opentelemetry.exporter.otlp.proto.common._internal.trace_encoder import (
            _encode_events,
            _encode_span,
        )

        try:
            context = span.context
            assert context is not None
            events = b"".join(_field(_EVENT, each.SerializeToString()) for each in _encode_events(span.events) or ())
            return self.span_bytes(
                context.trace_id, context.span_id, context.trace_state, span.parent, span.name, span.kind.value,
                span.start_time or 0, span.end_time or 0, span.attributes, span.links, span.status,
                events, span.dropped_attributes, span.dropped_events, span.dropped_links,
            )  # fmt: skip
        except Exception:  # a span of a shape not foreseen here
            _logger.debug("encoding a span by the SDK's encoder", exc_info=True)
            return bytes(_encode_span(span).SerializeToString())

    def span_bytes(
        self,
        trace_id: int,
        span_id: int,
        trace_state: TraceState | None,
        parent: ParentLike | None,
        name: str,
        kind: int,
        start_ns: int,
        end_ns: int,
        attributes: Mapping[str, Any] | None,
        links: Sequence[Link],
        status: StatusLike | None,
        events: bytes = b"",
        dropped_attributes: int = 0,
        dropped_events: int = 0,
        dropped_links: int = 0,
    ) -> bytes:
        """A ``Span`` message with these fields (``kind`` is the API's SpanKind value,
        ``events`` the span's events already encoded as its fields), field for field as
        the SDK's encoder writes a span that has them."""
        middle, tail = self.span_parts(
            trace_state, parent, name, kind, attributes, links, status, events, dropped_attributes, dropped_events, dropped_links
        )
        return b"".join((span_head(trace_id, span_id), middle, span_times(start_ns, end_ns), tail))

    def span_parts(
        self,
        trace_state: TraceState | None,
        parent: ParentLike | None,
        name: str,
        kind: int,
        attributes: Mapping[str, Any] | None,
        links: Sequence[Link],
        status: StatusLike | None,
        events: bytes = b"",
        dropped_attributes: int = 0,
        dropped_events: int = 0,
        dropped_links: int = 0,
    ) -> tuple[bytes, bytes]:
        """What :meth:`span_bytes` writes between a span's ids and its times, and after
        its times: spans that differ only in ids and times (a send's batches) share them,
        each span then ``span_head + middle + span_times + tail``.

        Both parts are kept where they repeat: the middle (name, kind, parent) of spans
        with no trace state, and the tail of spans with no attributes, events or dropped
        counts and an unset status (a writer's dispatch span, linked to the producer
        contexts it saw last)."""
        if trace_state:
            middle = self._middle(trace_state, parent, name, kind)
        else:
            key = (name, kind, parent.span_id if parent else None)
            middle = self._middles.get(key) or _kept(self._middles, key, _PARTS_KEPT, lambda: self._middle(None, parent, name, kind))
        remote = bool(parent and parent.is_remote)
        if attributes or events or dropped_attributes or dropped_events or dropped_links or not (status is None or status.is_unset):
            return middle, self._tail(remote, attributes, links, status, events, dropped_attributes, dropped_events, dropped_links)
        # The same link objects (a writer keeps the links of the contexts it saw last)
        # give the same tail: looked up by the objects first, read only on a miss.
        seen_key = (remote, status is None, *links)
        tail = self._tails_seen.get(seen_key)
        if tail is not None:
            return middle, tail
        link_keys = []
        for link in links:
            if link.attributes or link.dropped_attributes:
                return middle, self._tail(remote, attributes, links, status, events)
            context = link.context
            link_keys.append((context.trace_id, context.span_id, context.is_remote))
        tail_key = (remote, status is None, tuple(link_keys))
        tail = self._tails.get(tail_key) or _kept(self._tails, tail_key, _PARTS_KEPT, lambda: self._tail(remote, None, links, status, b""))
        if all(type(link).__hash__ is object.__hash__ for link in links):  # kept by identity only
            _kept(self._tails_seen, seen_key, _PARTS_KEPT, lambda: tail)
        return middle, tail

    def _middle(self, trace_state: TraceState | None, parent: ParentLike | None, name: str, kind: int) -> bytes:
        middle = []
        if trace_state:
            middle.append(_field(_TRACE_STATE, ",".join(f"{key}={value}" for key, value in trace_state.items()).encode()))
        if parent:
            middle.append(_PARENT.pack(b"\x22\x08", parent.span_id))
        middle.append(_kept(self._names, name, 1024, lambda: _field(_NAME, name.encode()) if name else b""))
        middle.append(bytes((_KIND, kind + 1)))
        return b"".join(middle)

    def _tail(
        self,
        remote: bool,
        attributes: Mapping[str, Any] | None,
        links: Sequence[Link],
        status: StatusLike | None,
        events: bytes,
        dropped_attributes: int = 0,
        dropped_events: int = 0,
        dropped_links: int = 0,
    ) -> bytes:
        parts = []
        if attributes:
            parts.append(self._attributes_bytes(attributes, _ATTRIBUTE))
        if dropped_attributes:
            parts.append(bytes((_DROPPED_ATTRIBUTES,)) + _varint(dropped_attributes))
        if events:
            parts.append(events)
        if dropped_events:
            parts.append(bytes((_DROPPED_EVENTS,)) + _varint(dropped_events))
        for link in links:
            parts.append(_field(_LINK, self._link(link)))
        if dropped_links:
            parts.append(bytes((_DROPPED_LINKS,)) + _varint(dropped_links))
        if status is not None:
            if status.description or status.status_code.value:
                status_parts = []
                if status.description:
                    status_parts.append(_field(_STATUS_MESSAGE, status.description.encode()))
                if status.status_code.value:
                    status_parts.append(bytes((_STATUS_CODE,)) + _varint(status.status_code.value))
                parts.append(_field(_STATUS, b"".join(status_parts)))
            else:
                parts.append(_EMPTY_STATUS)
        parts.append(_REMOTE_PARENT_FLAGS if remote else _LOCAL_FLAGS)
        return b"".join(parts)

    def _link(self, link: Link) -> bytes:
        context = link.context
        parts = [span_head(context.trace_id, context.span_id)]
        if link.attributes:
            parts.append(self._attributes_bytes(link.attributes, _LINK_ATTRIBUTE))
        if link.dropped_attributes:
            parts.append(bytes((_LINK_DROPPED_ATTRIBUTES,)) + _varint(link.dropped_attributes))
        parts.append(_LINK_FLAGS.pack(0x35, _HAS_IS_REMOTE | (_IS_REMOTE if context.is_remote else 0)))
        return b"".join(parts)

    def _attributes_bytes(self, attributes: Mapping[str, Any], tag: bytes) -> bytes:
        """The fields of ``attributes``, each a ``KeyValue`` as the SDK encodes it (an
        attribute it cannot encode is logged and left out, as it does)."""
        cache = self._attributes
        out = []
        for key, value in attributes.items():
            kind = type(value)
            if kind is str or kind is int or kind is bool or kind is float:
                cached = cache.get((key, kind, value, tag))
                if cached is None:
                    scalar = _scalar(value)
                    if scalar is not None:
                        try:
                            name = _field(b"\x0a", key.encode()) if key else b""
                        except UnicodeEncodeError:
                            scalar = None
                    if scalar is None:
                        cached = _sdk_attribute(key, value, tag)
                    else:
                        cached = _field(tag, name + _field(b"\x12", scalar))
                    if cached and key not in _NEW_EACH_SPAN:
                        if len(cache) >= _ATTRIBUTES_KEPT:
                            cache.clear()
                        cache[(key, kind, value, tag)] = cached
                out.append(cached)
            else:
                array = _strings(value) if kind is tuple or kind is list else None
                if array is not None and key:
                    try:
                        out.append(_field(tag, _field(b"\x0a", key.encode()) + _field(b"\x12", array)))
                        continue
                    except UnicodeEncodeError:
                        pass
                out.append(_sdk_attribute(key, value, tag))
        return b"".join(out)


def _sdk_attribute(key: str, value: Any, tag: bytes) -> bytes:
    """An attribute's field as the SDK's encoder writes it (nothing, said in its log, where
    it cannot)."""
    from opentelemetry.exporter.otlp.proto.common._internal import _encode_attributes

    return b"".join(_field(tag, each.SerializeToString()) for each in _encode_attributes({key: value}))


def _strings(values: Sequence[Any]) -> bytes | None:
    """An ``AnyValue`` holding an array of strings (a message's keys), as protobuf writes
    it; None for any other sequence."""
    items = []
    for value in values:
        if type(value) is not str:
            return None
        scalar = _scalar(value)
        if scalar is None:
            return None
        items.append(_field(_ARRAY_ITEM, scalar))
    return _field(_ARRAY_VALUE, b"".join(items))


_DOUBLE = struct.Struct("<Bd")


def random_id(bits: int) -> int:
    """A random trace (128 bits) or span (64) id, as the SDK's random id generator draws it."""
    drawn = random.getrandbits(bits)
    while drawn == 0:
        drawn = random.getrandbits(bits)
    return drawn


def span_head(trace_id: int, span_id: int) -> bytes:
    """A ``Span`` (or ``Link``) message's first fields: its trace id and span id."""
    return _IDS.pack(b"\x0a\x10", trace_id >> 64, trace_id & 0xFFFFFFFFFFFFFFFF, b"\x12\x08", span_id)


# A Span's ids and times, head and times fields included (span_head, span_times).
SPAN_IDS_BYTES = _IDS.size
SPAN_TIMES_BYTES = _TIMES.size


def span_field_head(size: int) -> bytes:
    """What a ``ScopeSpans.spans`` field holding a ``Span`` message of ``size`` bytes
    starts with (its tag and length)."""
    return _SPANS + _varint(size)


def span_times(start_ns: int, end_ns: int) -> bytes:
    """A ``Span`` message's start and end times."""
    return _TIMES.pack(0x39, start_ns, 0x41, end_ns)


def _scalar(value: str | int | bool | float) -> bytes | None:
    """An ``AnyValue`` holding a string, bool, 64-bit integer or double, as protobuf
    writes it (a oneof member is written even when zero or empty); None where the SDK's
    encoder must decide (text that is not UTF-8, an integer past 64 bits)."""
    if type(value) is str:
        try:
            return _field(b"\x0a", value.encode())
        except UnicodeEncodeError:
            return None
    if type(value) is bool:
        return b"\x10\x01" if value else b"\x10\x00"
    if type(value) is int:
        if not -(2**63) <= value < 2**63:
            return None
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)
    return _DOUBLE.pack(0x21, value)


class EncodingExporter:
    """An exporter that takes :class:`EncodedSpan` items besides SDK spans, encoding with
    ``encoder`` (what the leaf recorder looks for on the batch span processor)."""

    encoder: SpanEncoder
