"""OpenTelemetry's SDK in the test process: an in-memory span exporter and metric reader
on the process's providers (each can be set once per process, so every test module
shares these), and a caller's trace context."""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
PARENT_SPAN_ID = 0x00F067AA0BA902B7


def sdk_exporter() -> InMemorySpanExporter:
    """An in-memory exporter on the process's SDK tracer provider (installed once: the
    global provider can be set only once per process)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        trace.set_tracer_provider(TracerProvider())
        provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


_METRIC_READER = None


def metric_reader() -> Any:
    """An in-memory reader on the process's SDK meter provider (set once per process)."""
    global _METRIC_READER
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    if _METRIC_READER is None:
        _METRIC_READER = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[_METRIC_READER]))
    return _METRIC_READER


def collected(reader: Any) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    found: dict[str, list[Any]] = {}
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found
