"""OpenTelemetry set-up from the standard ``OTEL_*`` variables; a no-op when none is set.

Tracing turns on when ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp`` or ``console``)
or an OTLP endpoint is configured (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``). ``OTEL_SDK_DISABLED=true`` turns it off. The OTLP
exporter itself reads the other ``OTEL_EXPORTER_OTLP_*`` settings.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource

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


def span_limits_set(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` sets a span, event, link or attribute limit (``OTEL_*_LIMIT``):
    the SDK's spans then keep less than rmqstore's own recording would."""
    return any(name.startswith("OTEL_") and name.endswith("_LIMIT") and value for name, value in environ.items())


def tracing_requested(environ: dict[str, str] | None = None) -> str | None:
    """The exporter to use, or None for no tracing."""
    return exporter_requested("TRACES", environ)


def configure_tracing(service_name: str, export_timeout_s: float | None = None, *, lenient_export: bool = False) -> bool:
    """Install an SDK tracer provider if the environment asks for one. Returns whether
    tracing is on. Safe to call more than once. ``export_timeout_s`` bounds each OTLP
    export (retries included) unless ``OTEL_EXPORTER_OTLP_(TRACES_)TIMEOUT`` says otherwise.
    An OTLP setting the exporter refuses (an unknown compression) raises ``ValueError``;
    with ``lenient_export`` (a command, whose spans are not its work) it is said in one
    line and tracing stays off."""
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

    from rmqstore.common.tracing import record_leaf_spans

    processor: SpanProcessor
    if exporter_name == "console":
        processor = SimpleSpanProcessor(ConsoleSpanExporter())
    elif exporter_name == "otlp":
        from rmqstore.common.otlp_exporter import span_exporter

        timeout_set = os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
        try:
            exporter = span_exporter(timeout=export_timeout_s if not timeout_set else None)
        except ValueError as error:
            if not lenient_export:
                raise
            logging.getLogger("rmqstore.common.otlp").error("spans are not exported: the OTLP exporter could not be set up: %s", error)
            return False
        processor = BatchSpanProcessor(exporter)
    else:
        raise ValueError(f"OTEL_TRACES_EXPORTER={exporter_name!r}: rmqstore supports otlp, console or none")
    created = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)})
    provider = TracerProvider(resource=_hash_kept(created))
    provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    # The provider's only processor is known: leaf spans can go to it straight, unless
    # limits ask the SDK to cut spans down (the recorder writes them whole).
    if not span_limits_set(os.environ):
        record_leaf_spans(provider, processor)
    _configured = True
    return True


def _hash_kept(resource: Resource) -> Resource:
    """``resource`` with its hash computed once. The OTLP encoder groups every span it
    exports by its resource, and the SDK's resource hashes itself by writing its
    attributes out as JSON each time: about a fifth of the encoding of a small span. A
    resource's attributes never change, so neither does its hash."""
    from opentelemetry.sdk.resources import Resource

    class HashKeptResource(Resource):
        def __init__(self, attributes: Any, schema_url: str | None = None):
            super().__init__(attributes, schema_url)
            self._hash = super().__hash__()

        def __hash__(self) -> int:
            return self._hash

        def __eq__(self, other: object) -> bool:
            return super().__eq__(other)

    return HashKeptResource(dict(resource.attributes), resource.schema_url)


def tracer(name: str) -> trace.Tracer:
    from opentelemetry import trace

    return trace.get_tracer(name)

