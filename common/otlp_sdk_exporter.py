"""The SDK's own OTLP/gRPC span exporter (``OTLPSpanExporter``) encoding with
:class:`rmqstore.common.otlp.SpanEncoder`: what :func:`rmqstore.common.otlp_exporter.span_exporter`
gives when a variable only the SDK's exporter reads is set (a credential provider, its
internal metrics). Slow to load (it loads the SDK's metrics and logs too), so loaded only then."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import grpc
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

from rmqstore.common.otlp import EncodedSpan, EncodingExporter, SpanEncoder
from rmqstore.common.otlp_exporter import EXPORT_METHOD

if TYPE_CHECKING:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.sdk.trace import ReadableSpan


class _TraceService:
    """The trace service's Export call taking the request as its serialized bytes."""

    def __init__(self, channel: grpc.Channel):
        self.Export = channel.unary_unary(EXPORT_METHOD)


class SDKEncodingExporter(OTLPSpanExporter, EncodingExporter):
    """The SDK's OTLP/gRPC span exporter, encoding with ``encoder`` (a new one if none is
    given). Its channel's Export call takes the request as the encoder writes it (bytes)."""

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
