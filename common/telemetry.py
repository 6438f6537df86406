"""OpenTelemetry set-up from the standard ``OTEL_*`` variables; a no-op when none is set.

Tracing turns on when ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp`` or ``console``)
or an OTLP endpoint is configured (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``). ``OTEL_SDK_DISABLED=true`` turns it off. The OTLP
exporter itself reads the other ``OTEL_EXPORTER_OTLP_*`` settings.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export import SpanExporter

# The API is imported only once tracing is asked for: the command-line client reads the
# variables here on every run.
_configured = False


def exporter_requested(signal: str, environ: dict[str, str] | None = None) -> str | None:
    """The exporter the standard variables ask for one signal (``TRACES`` or ``METRICS``):
    ``OTEL_<signal>_EXPORTER`` if set (``none`` is no export), else ``otlp`` when an OTLP
    endpoint is configured (the shared one or the signal's own), else None."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    exporter = env.get(f"OTEL_{signal}_EXPORTER", "").strip().lower()
    if exporter == "none":
        return None
    if exporter:
        return exporter
    if env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT"):
        return "otlp"
    return None


def tracing_requested(environ: dict[str, str] | None = None) -> str | None:
    """The exporter to use, or None for no tracing."""
    return exporter_requested("TRACES", environ)


def configure_tracing(service_name: str, export_timeout_s: float | None = None, *, lenient_export: bool = False) -> bool:
    """Install an SDK tracer provider if the environment asks for one: the SDK's
    ``BatchSpanProcessor`` over its ``OTLPSpanExporter`` (or a console exporter), the
    sampler, id generator and span limits the ``OTEL_*`` variables name (the SDK reads
    them). Returns whether tracing is on. Safe to call more than once.
    ``export_timeout_s`` bounds each OTLP export (retries included) unless
    ``OTEL_EXPORTER_OTLP_(TRACES_)TIMEOUT`` says otherwise. An OTLP setting the exporter
    refuses (an unknown compression) raises ``ValueError``; with ``lenient_export`` (a
    command, whose spans are not its work) it is said in one line and tracing stays off."""
    global _configured
    exporter_name = tracing_requested()
    if exporter_name is None or _configured:
        return _configured
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )

    processor: SpanProcessor
    if exporter_name == "console":
        processor = SimpleSpanProcessor(ConsoleSpanExporter())
    elif exporter_name == "otlp":
        try:
            processor = BatchSpanProcessor(_otlp_span_exporter(export_timeout_s))
        except ValueError as error:
            if not lenient_export:
                raise
            logging.getLogger("rmqstore.tracing").error("spans are not exported: the OTLP exporter could not be set up: %s", error)
            return False
    else:
        raise ValueError(f"OTEL_TRACES_EXPORTER={exporter_name!r}: rmqstore supports otlp, console or none")
    provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)}))
    provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    _configured = True
    return True


def _otlp_span_exporter(export_timeout_s: float | None) -> SpanExporter:
    """The SDK's OTLP/gRPC span exporter, configured by the ``OTEL_EXPORTER_OTLP_*``
    variables; a setting it refuses raises ``ValueError``."""
    from opentelemetry.exporter.otlp.proto.grpc.exporter import InvalidCompressionValueException
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    timeout_set = os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
    try:
        return OTLPSpanExporter(timeout=export_timeout_s if not timeout_set else None)
    except InvalidCompressionValueException as error:
        raise ValueError(str(error)) from None


def tracer(name: str) -> trace.Tracer:
    from opentelemetry import trace

    return trace.get_tracer(name)

