"""The OTLP/gRPC span exporter the nodes and the client install: the SDK's own
(``OTLPSpanExporter``), encoding with :class:`rmqstore.common.otlp.SpanEncoder`. A module
of its own because the SDK's exporter module is slow to load (it loads the SDK's metrics
and logs too): the command line loads it on a thread (:class:`~rmqstore.common.otlp.DeferredExporter`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import grpc
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from rmqstore.common.otlp import EncodedSpan, EncodingExporter, SpanEncoder

if TYPE_CHECKING:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.sdk.trace import ReadableSpan


EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


class _TraceService:
    """The trace service's Export call taking the request as its serialized bytes."""

    def __init__(self, channel: grpc.Channel):
        self.Export = channel.unary_unary(EXPORT_METHOD, response_deserializer=ExportTraceServiceResponse.FromString)


class SpanExporter(OTLPSpanExporter, EncodingExporter):
    """The SDK's OTLP/gRPC span exporter, encoding with ``encoder`` (a new one if none is
    given). Its channel's Export call takes the request as the encoder writes it (bytes),
    not parsed into a message only to be serialized again."""

    def __init__(self, encoder: SpanEncoder | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.encoder = encoder if encoder is not None else SpanEncoder()

    def _initialize_channel_and_stub(self) -> None:
        super()._initialize_channel_and_stub()  # type: ignore[no-untyped-call]
        self._client = _TraceService(self._channel)  # type: ignore[assignment]

    def _translate_data(self, data: Sequence[ReadableSpan | EncodedSpan]) -> ExportTraceServiceRequest | bytes:  # type: ignore[override]
        if isinstance(self._client, _TraceService):
            return self.encoder.encode_bytes(data)
        return self.encoder.encode(data)  # an SDK that made its stub another way
