"""rmqstore's OTLP/gRPC span exporter as the SDK's batch span processor takes one: spans
(the SDK's, and :class:`~rmqstore.common.otlp.EncodedSpan` bytes) written by
:class:`~rmqstore.common.otlp.SpanEncoder` and sent by
:class:`~rmqstore.common.otlp_exporter.TraceChannel`, which reads the OTLP exporter
settings as the SDK's ``OTLPSpanExporter`` reads them."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from opentelemetry.sdk.trace.export import SpanExporter as SDKSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult

from rmqstore.common.otlp import EncodedSpan, EncodingExporter, SpanEncoder
from rmqstore.common.otlp_exporter import ExportSettings, TraceChannel, export_settings

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan

# The exporter's lines are the channel's: one logger for both.
_logger = logging.getLogger("rmqstore.common.otlp_exporter")


class SpanExporter(SDKSpanExporter, EncodingExporter):
    """Exports spans to an OTLP/gRPC receiver, encoding with ``encoder`` (a new one if
    none is given). The settings are the variables', or ``endpoint``, ``insecure`` and
    ``timeout`` (seconds) where given."""

    def __init__(
        self,
        encoder: SpanEncoder | None = None,
        *,
        endpoint: str | None = None,
        insecure: bool | None = None,
        timeout: float | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.encoder = encoder if encoder is not None else SpanEncoder()
        self.channel = TraceChannel(export_settings(environ, endpoint=endpoint, insecure=insecure, timeout_s=timeout))

    @property
    def settings(self) -> ExportSettings:
        return self.channel.settings

    def export(self, spans: Sequence[ReadableSpan | EncodedSpan]) -> SpanExportResult:
        if self.channel.stopped:
            _logger.warning("the OTLP exporter is shut down: %d spans are dropped", len(spans))
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS if self.channel.export(self.encoder.encode_bytes(spans)) else SpanExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True  # nothing is held here

    def shutdown(self) -> None:
        self.channel.shutdown()
