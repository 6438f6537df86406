"""A command's send spans written and exported without OpenTelemetry's SDK.

``rmqstore send`` sends once and exits. With tracing on, loading the SDK and setting a
tracer provider up cost it about 35 ms of a core (imports, the resource's detectors, the
batch span processor's thread), on one of the two cores the writer also needs while the
stream runs: at 1,000 messages a request that was most of what tracing cost a send. The
send's spans need none of it: their ids are drawn as the SDK's id generator draws them
(:class:`~rmqstore.client.tracing.LateSpan`), the SDK's default sampler samples a root
span and its children, and the spans are written in OTLP's format
(:class:`~rmqstore.common.otlp.SpanEncoder`) under the resource the SDK would describe
the process with, and sent by :class:`~rmqstore.common.otlp_exporter.TraceChannel` when
the send is over.

Only where that is what the SDK would export (:func:`possible`): the variables ask for
OTLP with the SDK's default sampler, ids and propagators, set no span limit, batch
processor or resource detector, and name no exporter setting only the SDK's exporter
reads. A span this module does not write (an exception escaping the send) is recorded
through the SDK, loaded then. ``tests/test_late_export.py`` holds the requests equal to
the SDK path's."""

from __future__ import annotations

import logging
import os
import random
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote

from rmqstore.common.otlp import (
    SPAN_IDS_BYTES,
    SPAN_TIMES_BYTES,
    UNSET,
    Parent,
    SpanEncoder,
    StatusLike,
    error_status,
    random_id,
    span_field_head,
    span_head,
    span_times,
)
from rmqstore.common.otlp_exporter import (
    INTERNAL_METRICS_VARIABLE,
    SDK_ONLY_VARIABLES,
    TraceChannel,
    export_settings,
)
from rmqstore.service.telemetry import span_limits_set

_logger = logging.getLogger("rmqstore.common.otlp_exporter")

# The API's SpanKind values (opentelemetry.trace.SpanKind).
CLIENT = 2
PRODUCER = 3

_ZERO_ID = bytes(8)

# A request holds at most this many bytes of spans (a receiver takes 4 MiB by default).
REQUEST_BYTES = 1 << 20

# The SDK versions whose default resource :func:`resource_attributes` writes: checked from
# 1.45 (the release current when this was written, whose ``Resource.create`` adds a
# ``service.instance.id`` by its default ``service_instance`` detector); the tests hold the
# two equal on the installed version, and an earlier SDK takes the SDK's path.
SDK_CHECKED_FROM = (1, 45)

# Variables under which the SDK would make spans or requests this module does not: span
# and attribute limits, the batch processor's settings, resource detectors.
_SDK_PREFIXES = ("OTEL_BSP_", "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS")


def possible(environ: Mapping[str, str]) -> bool:
    """Whether a send's spans under ``environ`` are written here as the SDK would export
    them (the caller has checked that OTLP is asked for with the SDK's defaults)."""
    for name, value in environ.items():
        if not value or not name.startswith("OTEL_"):
            continue
        if name.startswith(_SDK_PREFIXES) or name in SDK_ONLY_VARIABLES:
            return False
    if span_limits_set(environ):
        return False
    if environ.get(INTERNAL_METRICS_VARIABLE, "").strip().lower() == "true":
        return False
    return _sdk_version() >= SDK_CHECKED_FROM and resource_attributes("", environ) is not None


def _sdk_version() -> tuple[int, ...]:
    from opentelemetry.sdk.version import __version__

    parts = []
    for part in __version__.split(".")[:2]:
        if not part.isdigit():
            return ()
        parts.append(int(part))
    return tuple(parts)


def resource_attributes(service_name: str, environ: Mapping[str, str]) -> dict[str, str] | None:
    """The resource the SDK's ``Resource.create({"service.name": ...})`` describes this
    process with, as rmqstore's tracing set-up makes it: the SDK's own attributes, a new
    ``service.instance.id``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME`` (else
    ``service_name``). None where the SDK would warn about the variables (an item that
    is no ``key=value``): that resource is the SDK's to make."""
    from opentelemetry.sdk.version import __version__

    attributes = {
        "telemetry.sdk.language": "python",
        "telemetry.sdk.name": "opentelemetry",
        "telemetry.sdk.version": __version__,
        "service.instance.id": _uuid4(),
    }
    items = environ.get("OTEL_RESOURCE_ATTRIBUTES")
    if items:
        for item in items.split(","):
            key, equals, value = item.partition("=")
            if not equals or not key.strip():
                return None
            attributes[key.strip()] = unquote(value.strip())
    attributes["service.name"] = environ.get("OTEL_SERVICE_NAME", service_name)
    if not attributes["service.name"]:
        attributes["service.name"] = "unknown_service" + (
            f":{os.path.basename(sys.executable)}" if sys.executable else ""
        )
    return attributes


def _uuid4() -> str:
    """A random (version 4) UUID's text, as ``str(uuid.uuid4())`` (without loading ``uuid``)."""
    drawn = bytearray(os.urandom(16))
    drawn[6] = (drawn[6] & 0x0F) | 0x40
    drawn[8] = (drawn[8] & 0x3F) | 0x80
    text = drawn.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


class LateExport:
    """A send's spans, written as they are handed over and exported together by
    :meth:`export`, under the resource of :func:`resource_attributes` and the
    instrumentation scope ``scope``. Raises ``ValueError`` for an exporter setting the
    exporter refuses."""

    def __init__(self, service_name: str, scope: str, timeout_s: float):
        timeout_set = os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT") or os.environ.get(
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"
        )
        self.channel = TraceChannel(export_settings(timeout_s=None if timeout_set else timeout_s))
        self.encoder = SpanEncoder()
        attributes = resource_attributes(service_name, os.environ)
        assert attributes is not None  # possible() said so
        self._resource = self.encoder.resource_field(attributes)
        self._scope = self.encoder.scope_field(scope)
        self._spans: list[bytes] = []

    def add(
        self,
        trace_id: int,
        span_id: int,
        parent_id: int | None,
        name: str,
        kind: int,
        start_ns: int,
        end_ns: int,
        attributes: Mapping[str, Any],
        failure: str | None = None,
    ) -> None:
        """A span, ended with an ERROR status of ``failure`` if given (else unset)."""
        parent = Parent(parent_id) if parent_id is not None else None
        status = UNSET if failure is None else error_status(failure)
        span = self.encoder.span_bytes(trace_id, span_id, None, parent, name, kind, start_ns, end_ns, attributes, (), status)
        self._spans.append(span_field_head(len(span)) + span)

    def add_batches(
        self,
        trace_id: int,
        parent_id: int,
        kind: int,
        spans: Sequence[tuple[str, Mapping[str, Any], int, int, str | None]],
    ) -> None:
        """Children of ``parent_id`` in trace ``trace_id``, each ``(name, attributes,
        start_ns, end_ns, failure)``: the spans of one name and attributes (the same
        mapping) written from one middle and tail, each with its own id and times.

        A span id is 8 random bytes, not zero (as the SDK's id generator draws it): drawn
        for all the spans at once, and written as drawn."""
        parent = Parent(parent_id)
        # The span's trace id, up to its span id's bytes.
        head = span_head(trace_id, 0)[:-8]
        drawn = random.randbytes(8 * len(spans))
        parts: dict[tuple[str, int, str | None], tuple[bytes, bytes, bytes]] = {}
        out = self._spans
        for number, (name, attributes, start_ns, end_ns, failure) in enumerate(spans):
            key = (name, id(attributes), failure)
            shared = parts.get(key)
            if shared is None:
                status: StatusLike = UNSET if failure is None else error_status(failure)
                middle, tail = self.encoder.span_parts(None, parent, name, kind, attributes, (), status)
                size = SPAN_IDS_BYTES + len(middle) + SPAN_TIMES_BYTES + len(tail)
                shared = parts[key] = (span_field_head(size) + head, middle, tail)
            field_head, middle, tail = shared
            span_id = drawn[8 * number : 8 * number + 8]
            if span_id == _ZERO_ID:
                span_id = random_id(64).to_bytes(8, "big")
            out.append(b"".join((field_head, span_id, middle, span_times(start_ns, end_ns), tail)))

    def export(self) -> None:
        """Send the spans added, a request per :data:`REQUEST_BYTES`, within the exporter's
        timeout; what one failed request leaves is dropped, said in a line. The channel
        is closed."""
        spans, self._spans = self._spans, []
        timeout_s = self.channel.settings.timeout_s
        deadline = time.monotonic() + timeout_s
        sent = 0
        try:
            while sent < len(spans):
                first, size = sent, 0
                while sent < len(spans) and (sent == first or size + len(spans[sent]) <= REQUEST_BYTES):
                    size += len(spans[sent])
                    sent += 1
                request = self.encoder.request_bytes(self._resource, self._scope, spans[first:sent])
                if not self.channel.export(request, max(deadline - time.monotonic(), 0.0)):
                    if sent < len(spans):
                        _logger.warning("%d more spans are not exported", len(spans) - sent)
                    return
        finally:
            self.channel.shutdown()
