"""The OTLP/gRPC span exporter the nodes and the client install: the SDK's own
(``OTLPSpanExporter``), encoding with :class:`rmqstore.common.otlp.SpanEncoder`. A module
of its own because the SDK's exporter module is slow to load (it loads the SDK's metrics
and logs too): the command line loads it on a thread (:class:`~rmqstore.common.otlp.DeferredExporter`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

from rmqstore.common.otlp import EncodedSpan, EncodingExporter, SpanEncoder

if TYPE_CHECKING:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.sdk.trace import ReadableSpan


class SpanExporter(OTLPSpanExporter, EncodingExporter):
    """The SDK's OTLP/gRPC span exporter, encoding with ``encoder`` (a new one if none is given)."""

    def __init__(self, encoder: SpanEncoder | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.encoder = encoder if encoder is not None else SpanEncoder()

    def _translate_data(self, data: Sequence[ReadableSpan | EncodedSpan]) -> ExportTraceServiceRequest:
        return self.encoder.encode(data)
